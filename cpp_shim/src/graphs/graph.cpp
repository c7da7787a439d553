#include "graphs/graph.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>
#include <utility>

#include "memory/device_allocator.h"
#include "observe/layer_profile.h"
#include "observe/trace.h"
#include "runtime/fork.h"
#include "runtime/runtime.h"
#include "runtime/status.h"
#include "runtime/streams.h"

namespace torchfl::graphs {

namespace {

bool is_default(caching::PoolId id) {
  return id.first == 0 && id.second == 0;
}

// Raises for a kernel that failed at replay, naming it and the node.
[[noreturn]] void raise_replay_error(const capture::Node& node, size_t index, TFL_Error* error) {
  const PluginRef owner{node.kernel.api, node.kernel.plugin};
  const PluginStatus status = take_status(node.kernel.api, error);
  const char* hint =
      status.code == TFL_ERROR_UNIMPLEMENTED
          ? ". The kernel declined the call's arguments at its first run; eagerly the call would have fallen back to "
            "the CPU, which a graph cannot hold: keep the operator out of the capture"
          : ". Kernels validate their arguments when they first run, which for a captured call is its first replay";
  throw_status(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, owner, status,
               c10::str(node.kernel.op, " (device graph replay, node ", index, ")"), hint);
}

enum class Replay : uint8_t { Auto, Shim, Native };

// TORCH_FL_GRAPHS, read at each instantiation.
Replay replay_setting() {
  const char* env = std::getenv("TORCH_FL_GRAPHS");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return Replay::Auto;
  if (std::strcmp(env, "shim") == 0) return Replay::Shim;
  if (std::strcmp(env, "native") == 0) return Replay::Native;
  TORCH_CHECK_VALUE(false, "TORCH_FL_GRAPHS=", env, " is invalid: set auto (the default), shim or native");
}

// Destroys a stream the shim created for a native capture; errors are
// dropped (what the capture itself reported matters more).
void destroy_stream(const AttachedDevice& d, TFL_Stream* stream) noexcept {
  if (TFL_Error* e = d.api->stream_destroy(stream)) d.api->error_destroy(e);
}

// Ends a failed native capture of `stream`, dropping what it recorded.
void discard_capture(const AttachedDevice& d, TFL_Stream* stream) noexcept {
  TFL_Graph* graph = nullptr;
  if (TFL_Error* e = d.graphs.stream_end_capture(stream, &graph)) {
    d.api->error_destroy(e);
  } else if (graph != nullptr) {
    if (TFL_Error* e2 = d.graphs.graph_destroy(graph)) d.api->error_destroy(e2);
  }
}

}  // namespace

Graph::~Graph() {
  try {
    reset();
  } catch (const std::exception& e) {
    TORCH_WARN("torch-fl: destroying a device graph failed: ", e.what());
  }
}

void Graph::capture_begin(caching::PoolId pool, capture::Mode mode) {
  TORCH_CHECK(capture_id_ == 0, "torch-fl: this graph is already capturing: capture_end() first");
  TORCH_CHECK(!has_graph_, "torch-fl: this graph already holds a capture: reset() it before capturing again");
  check_not_forked("device graph capture");
  runtime("device graph capture");
  TORCH_CHECK(caching_enabled(),
              "torch-fl: device graphs keep their tensors in a private pool of torch-fl's caching allocator, which "
              "is off (TORCH_FL_ALLOC_CONF=backend:plugin, or a plugin that caches memory itself): unset "
              "TORCH_FL_ALLOC_CONF to capture graphs");
  const c10::DeviceIndex device = current_device();
  check_device_index(device);
  TFL_Stream* stream = plugin_stream(current_stream(device));
  if (is_default(pool)) {
    pool = caching::create_pool(device, /*graph=*/true);
  } else {
    caching::retain_pool(device, pool);
  }
  try {
    capture_id_ = capture::begin(device, stream, mode);
  } catch (...) {
    caching::release_pool(device, pool);
    throw;
  }
  device_ = device;
  pool_ = pool;
  capture_stream_ = stream;
  // Every allocation for the capture's streams, on any thread (the autograd
  // engine's included), comes from the graph's pool.
  const uint64_t id = capture_id_;
  caching::begin_allocate_streams_to_pool(device, pool, [id, device](c10::StreamId sid) {
    try {
      const c10::Stream s(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), sid);
      return capture::stream_in_capture(id, plugin_stream(s));
    } catch (...) {
      return false;
    }
  });
  routing_ = true;
}

void Graph::end_routing() noexcept {
  if (!routing_) return;
  routing_ = false;
  try {
    caching::end_allocate_streams_to_pool(device_, pool_);
  } catch (...) {
    // Only an unknown device could fail here, and it was checked at begin.
  }
}

void Graph::capture_end() {
  TORCH_CHECK(capture_id_ != 0, "torch-fl: capture_end() without capture_begin()");
  TFL_Stream* stream = plugin_stream(current_stream(device_));
  capture::Recording recording;
  try {
    recording = capture::end(capture_id_, stream);
  } catch (...) {
    if (!capture::active(capture_id_)) {
      // The capture is over and holds nothing: give its memory back.
      capture_id_ = 0;
      end_routing();
      caching::release_pool(device_, pool_);
      pool_ = {0, 0};
    }
    throw;
  }
  capture_id_ = 0;
  end_routing();
  recording_ = std::move(recording);
  has_graph_ = true;
  if (recording_.nodes.empty()) {
    TORCH_WARN("torch-fl: the device graph captured no work: was the work queued on another stream or device than ",
               device_type_name(), ":", static_cast<int>(device_), "'s current stream at capture_begin?");
  }
  if (!keep_graph_) instantiate();
}

void Graph::instantiate() {
  TORCH_CHECK(has_graph_, "torch-fl: instantiate() needs a finished capture");
  if (instantiated_) return;
  const AttachedDevice& d = runtime("device graph instantiation");
  const Replay setting = replay_setting();
  if (setting == Replay::Native) {
    TORCH_CHECK(d.has_graphs, "torch-fl: TORCH_FL_GRAPHS=native, but plugin ", d.plugin_label,
                " offers no native graphs (the optional ABI 1.7 get_graphs): unset TORCH_FL_GRAPHS to replay "
                "through torch-fl");
    TORCH_CHECK(recording_.generators.size() <= 1, "torch-fl: TORCH_FL_GRAPHS=native, but the graph draws from ",
                recording_.generators.size(),
                " random generators and a native graph launch takes one seed: unset TORCH_FL_GRAPHS");
  }
  // Otherwise the shim's replay submits the recorded nodes as they are:
  // nothing to build.
  if (setting != Replay::Shim && d.has_graphs && recording_.generators.size() <= 1 && !recording_.nodes.empty()) {
    const bool built = build_native();
    TORCH_CHECK(built || setting != Replay::Native, "torch-fl: TORCH_FL_GRAPHS=native, but a kernel of plugin ",
                d.plugin_label, " declined to be captured natively: unset TORCH_FL_GRAPHS");
  }
  instantiated_ = true;
}

bool Graph::build_native() {
  const AttachedDevice& d = runtime("device graph instantiation");
  TFL_Stream* stream = nullptr;
  TFL_CHECK_STATUS(d.ref(), "stream_create", d.api->stream_create(device_, 0, &stream));
  if (TFL_Error* error = d.graphs.stream_begin_capture(stream)) {
    destroy_stream(d, stream);
    TFL_CHECK_STATUS(d.ref(), "stream_begin_capture", error);
  }
  for (capture::Node& node : recording_.nodes) {
    TFL_Error* error = nullptr;
    const TFL_PluginApi* owner = d.api;
    const char* what = "copy (device to device)";
    if (node.kind == capture::Node::Kind::Copy) {
      TFL_CopyArgs args;
      std::memset(&args, 0, sizeof(args));
      args.struct_size = TFL_STRUCT_SIZE(TFL_CopyArgs, stream);
      args.kind = TFL_COPY_DEVICE_TO_DEVICE;
      args.dst_device = node.device;
      args.src_device = node.device;
      args.dst = node.dst;
      args.src = node.src;
      args.nbytes = node.nbytes;
      args.stream = stream;
      error = d.api->copy(&args);
    } else {
      // The plugin may keep this frame until the graph is destroyed: it is
      // never written again (a native graph is never replayed by the shim).
      TFL_CallFrame* frame = node.frame->get();
      frame->stream = stream;
      frame->rng_seed = 0;
      frame->rng_offset = node.rng_intra;
      owner = node.kernel.api;
      what = node.kernel.op;
      error = node.kernel.fn(frame);
    }
    if (error == nullptr) continue;
    discard_capture(d, stream);
    destroy_stream(d, stream);
    const PluginStatus status = take_status(owner, error);
    if (status.code == TFL_ERROR_UNIMPLEMENTED) {
      TORCH_WARN_ONCE("torch-fl: ", what, " of plugin ", d.plugin_label,
                      " declined native graph capture; such graphs replay through torch-fl instead: ", status.message);
      return false;
    }
    throw_status(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, d.ref(), status,
                 c10::str(what, " (native graph capture)"), "");
  }
  TFL_Graph* graph = nullptr;
  if (TFL_Error* error = d.graphs.stream_end_capture(stream, &graph)) {
    destroy_stream(d, stream);
    TFL_CHECK_STATUS(d.ref(), "stream_end_capture", error);
  }
  TFL_GraphExec* exec = nullptr;
  TFL_Error* error = d.graphs.graph_instantiate(graph, &exec);
  destroy_stream(d, stream);  // capture has ended: the stream is no longer needed
  if (error != nullptr) {
    if (TFL_Error* e = d.graphs.graph_destroy(graph)) d.api->error_destroy(e);
    TFL_CHECK_STATUS(d.ref(), "graph_instantiate", error);
  }
  native_graph_ = graph;
  native_exec_ = exec;
  return true;
}

void Graph::release_native() {
  if (native_exec_ == nullptr && native_graph_ == nullptr) return;
  const AttachedDevice& d = runtime("device graph reset");
  // The plugin may read the recorded frames until every launch has run.
  for (TFL_Stream* stream : launch_streams_) stream_synchronize(stream);
  launch_streams_.clear();
  TFL_GraphExec* exec = std::exchange(native_exec_, nullptr);
  TFL_Graph* graph = std::exchange(native_graph_, nullptr);
  if (exec != nullptr) TFL_CHECK_STATUS(d.ref(), "graph_exec_destroy", d.graphs.graph_exec_destroy(exec));
  if (graph != nullptr) TFL_CHECK_STATUS(d.ref(), "graph_destroy", d.graphs.graph_destroy(graph));
}

void Graph::replay() {
  TORCH_CHECK(has_graph_, "torch-fl: replay() needs a finished capture: capture the graph first");
  if (!instantiated_) instantiate();
  check_not_forked("device graph replay");
  runtime("device graph replay");
  CurrentDeviceScope scope(device_);
  TFL_Stream* stream = current_plugin_stream(device_);
  TORCH_CHECK(capture::capture_of(stream) == 0,
              "torch-fl: a device graph cannot be replayed on a stream that is being captured: replay it after the "
              "capture ends");
  if (native_exec_ != nullptr) {
    const AttachedDevice& d = runtime();
    TFL_GraphLaunchArgs args{TFL_STRUCT_SIZE(TFL_GraphLaunchArgs, rng_offset_base), 0, 0};
    if (!recording_.generators.empty()) {
      const capture::GraphRng& r = recording_.generators.front();
      std::tie(args.rng_seed, args.rng_offset_base) = r.generator->claim(r.increment);
    }
    {
      // One traced call for the whole launch: the plugin's records of the
      // graph's kernels carry its id (the shim's replay below is traced
      // kernel by kernel, as eager calls are).
      const TraceScope trace(TraceKind::Kernel, "device graph replay", d.plugin_label.c_str(), device_, stream,
                             tracing() ? c10::str(recording_.nodes.size(), " nodes") : std::string());
      TFL_CHECK_STATUS(d.ref(), "graph_launch", d.graphs.graph_launch(native_exec_, stream, &args));
    }
    if (std::find(launch_streams_.begin(), launch_streams_.end(), stream) == launch_streams_.end()) {
      launch_streams_.push_back(stream);
    }
    return;
  }
  // Each generator advances by the whole graph's draw; kernels draw from
  // that base plus their offset inside the graph.
  c10::SmallVector<std::pair<uint64_t, uint64_t>, 2> bases;
  for (const capture::GraphRng& r : recording_.generators) bases.push_back(r.generator->claim(r.increment));
  const auto base_of = [&](const Generator* g) {
    for (size_t i = 0; i < recording_.generators.size(); ++i) {
      if (recording_.generators[i].generator.get() == g) return bases[i];
    }
    TORCH_INTERNAL_ASSERT(false, "a recorded random kernel's generator is not the graph's");
  };
  for (size_t i = 0; i < recording_.nodes.size(); ++i) {
    const capture::Node& node = recording_.nodes[i];
    if (node.kind == capture::Node::Kind::Copy) {
      copy_d2d(node.device, node.dst, node.device, node.src, node.nbytes, stream);
      continue;
    }
    TFL_CallFrame* frame = node.frame->get();
    frame->stream = stream;
    if (node.rng != nullptr) {
      const auto [seed, base] = base_of(node.rng);
      frame->rng_seed = seed;
      frame->rng_offset = base + node.rng_intra;
    }
    if (TFL_Error* error = call_kernel(node.kernel.fn, frame, node.kernel.plugin, node.kernel.op); error != nullptr) {
      raise_replay_error(node, i, error);
    }
  }
}

void Graph::reset() {
  if (capture_id_ != 0) {
    capture::abort(capture_id_);
    capture_id_ = 0;
  }
  end_routing();
  release_native();
  if (!is_default(pool_)) {
    // The pool's memory stays reserved until its tensors are gone; the
    // plugin's deallocate is stream-ordered, so work a replay queued is not
    // cut short when empty_cache() gives the segments back.
    caching::release_pool(device_, pool_);
    pool_ = {0, 0};
  }
  recording_ = capture::Recording{};
  has_graph_ = false;
  instantiated_ = false;
}

caching::PoolId Graph::pool() const {
  TORCH_CHECK(!is_default(pool_), "torch-fl: pool() needs a graph that captured (or is capturing) into a pool");
  return pool_;
}

std::string Graph::describe() const {
  std::ostringstream out;
  out << "# torch-fl device graph: " << recording_.nodes.size() << " nodes on " << device_type_name() << ':'
      << static_cast<int>(device_) << ", pool (" << pool_.first << ", " << pool_.second << "), replayed "
      << (native() ? "natively (one plugin graph launch)" : "by torch-fl (one kernel call per node)") << "\n";
  for (size_t i = 0; i < recording_.nodes.size(); ++i) {
    const capture::Node& node = recording_.nodes[i];
    out << i << ' ';
    if (node.kind == capture::Node::Kind::Copy) {
      out << "copy " << node.nbytes << " bytes " << node.src << " -> " << node.dst << '\n';
      continue;
    }
    const TFL_CallFrame& f = node.frame->frame();
    out << "kernel " << node.kernel.op << " args=" << f.num_args << " outputs=[";
    for (size_t j = 0; j < f.num_outputs; ++j) {
      const TFL_Tensor& t = *f.outputs[j];
      out << (j == 0 ? "" : ", ") << t.data << '+' << t.byte_offset << " (";
      for (int32_t d = 0; d < t.ndim; ++d) out << (d == 0 ? "" : "x") << t.shape[d];
      out << ')';
    }
    out << ']';
    if (node.rng != nullptr) out << " rng+" << node.rng_intra;
    out << '\n';
  }
  return out.str();
}

void Graph::debug_dump(const std::string& path) const {
  std::ofstream file(path);
  TORCH_CHECK(file.good(), "torch-fl: debug_dump cannot write '", path, "'");
  file << describe();
  TORCH_CHECK(file.good(), "torch-fl: debug_dump failed writing '", path, "'");
}

caching::PoolId graph_pool_handle() {
  return caching::new_graph_pool_id();
}

}  // namespace torchfl::graphs

#include "graphs/graph.h"

#include <c10/util/Exception.h>

#include <fstream>
#include <sstream>

#include "memory/device_allocator.h"
#include "observe/layer_profile.h"
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
  // The shim's replay submits the recorded nodes as they are: nothing to
  // build.
  instantiated_ = true;
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
      << static_cast<int>(device_) << ", pool (" << pool_.first << ", " << pool_.second << ")\n";
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

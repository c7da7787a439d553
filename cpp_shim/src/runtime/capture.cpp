#include "runtime/capture.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "runtime/runtime.h"
#include "runtime/streams.h"

namespace torchfl::capture {

namespace detail {
std::atomic<int> g_captures{0};
}  // namespace detail

namespace {

// What each stream of a capture has done: how many nodes it recorded, and
// how far into every stream of the capture it has waited (a vector clock:
// the capture's own stream must have waited for every joined stream's last
// node before the capture ends).
struct StreamState {
  uint64_t seq = 0;
  std::map<TFL_Stream*, uint64_t> knows;
};

struct Capture {
  uint64_t id = 0;
  c10::DeviceIndex device = 0;
  TFL_Stream* origin = nullptr;
  Mode mode = Mode::Global;
  std::thread::id thread;
  std::map<TFL_Stream*, StreamState> streams;
  std::vector<Node> nodes;
  std::map<Generator*, GraphRng> rng;
  std::string invalidated;  // the first error raised inside the capture
};

// An event recorded on a captured stream: a point of that capture.
struct EventMark {
  uint64_t capture = 0;
  std::map<TFL_Stream*, uint64_t> knows;  // the recording stream's clock, its own seq included
};

std::mutex g_mutex;
std::map<uint64_t, std::unique_ptr<Capture>> g_by_id;
std::unordered_map<TFL_Stream*, Capture*> g_by_stream;
std::unordered_map<void*, EventMark> g_events;
uint64_t g_next_id = 1;

Capture* find(TFL_Stream* stream) {
  auto it = g_by_stream.find(stream);
  return it == g_by_stream.end() ? nullptr : it->second;
}

// The message for work `what` that capture `c` cannot hold; the capture is
// invalidated by it (the graph would silently miss the work otherwise).
std::string refusal(Capture* c, const std::string& what, const std::string& why) {
  std::string text = c10::str("torch-fl: ", what, " cannot run during the capture of a device graph on ",
                              device_type_name(), ":", static_cast<int>(c->device), ": ", why);
  if (c->invalidated.empty()) c->invalidated = text;
  return text;
}

void remove_locked(Capture* c) {
  for (const auto& entry : c->streams) g_by_stream.erase(entry.first);
  for (auto it = g_events.begin(); it != g_events.end();) {
    it = it->second.capture == c->id ? g_events.erase(it) : std::next(it);
  }
  g_by_id.erase(c->id);
  detail::g_captures.fetch_sub(1, std::memory_order_relaxed);
}

// Whether a capture's mode refuses host synchronization on this thread.
bool refuses_sync(const Capture& c) {
  return c.mode == Mode::Global || (c.mode == Mode::ThreadLocal && c.thread == std::this_thread::get_id());
}

int32_t refuse_resize(const TFL_CallFrame*, size_t, int32_t, const int64_t*) noexcept {
  return TFL_ERROR_INVALID_ARGUMENT;
}

// Appends `n` items at `from` to `to`, whose capacity was reserved for
// them (so earlier pointers into it stay valid); returns where they start.
template <typename T>
const T* append(std::vector<T>& to, const T* from, size_t n) {
  const T* at = to.data() + to.size();
  to.insert(to.end(), from, from + n);
  return at;
}

}  // namespace

Mode parse_mode(const std::string& name) {
  if (name == "global" || name == "default") return Mode::Global;
  if (name == "thread_local") return Mode::ThreadLocal;
  if (name == "relaxed") return Mode::Relaxed;
  TORCH_CHECK_VALUE(
      false, "capture_error_mode must be \"default\", \"global\", \"thread_local\" or \"relaxed\", not \"", name, "\"");
}

const char* mode_name(Mode mode) noexcept {
  switch (mode) {
    case Mode::Global:
      return "global";
    case Mode::ThreadLocal:
      return "thread_local";
    case Mode::Relaxed:
      return "relaxed";
  }
  return "global";
}

// --- OwnedFrame -----------------------------------------------------------

OwnedFrame::OwnedFrame(const TFL_CallFrame& f) {
  // Sizes first: every buffer is reserved once, so pointers into them stay
  // valid while they fill.
  size_t tensors = 0, items = 0, ints = 0, floats = 0, bools = 0, strings = 0, host = 0;
  const auto count = [&](const TFL_Tensor& t) {
    ++tensors;
    ints += 2 * static_cast<size_t>(std::max(t.ndim, 0));
    if (t.device_type == TFL_DEVICE_HOST) ++host;
  };
  for (size_t i = 0; i < f.num_args; ++i) {
    const TFL_Value& v = *f.args[i];
    switch (v.tag) {
      case TFL_VALUE_TENSOR:
        count(*v.u.tensor);
        break;
      case TFL_VALUE_TENSOR_LIST:
        items += v.u.tensor_list.len;
        for (size_t j = 0; j < v.u.tensor_list.len; ++j) {
          if (v.u.tensor_list.items[j] != nullptr) count(*v.u.tensor_list.items[j]);
        }
        break;
      case TFL_VALUE_INT_LIST:
        ints += v.u.int_list.len;
        break;
      case TFL_VALUE_FLOAT_LIST:
        floats += v.u.float_list.len;
        break;
      case TFL_VALUE_BOOL_LIST:
        bools += v.u.bool_list.len;
        break;
      case TFL_VALUE_STRING:
        ++strings;
        break;
      default:
        break;
    }
  }
  for (size_t i = 0; i < f.num_outputs; ++i) ints += 2 * static_cast<size_t>(std::max(f.outputs[i]->ndim, 0));
  values_.reserve(f.num_args);
  tensors_.reserve(tensors);
  items_.reserve(items);
  ints_.reserve(ints);
  floats_.reserve(floats);
  bools_.reserve(bools);
  strings_.reserve(strings);
  host_bytes_.reserve(host);
  outputs_.reserve(f.num_outputs);

  for (size_t i = 0; i < f.num_args; ++i) {
    TFL_Value& v = values_.emplace_back(*f.args[i]);
    switch (v.tag) {
      case TFL_VALUE_TENSOR:
        v.u.tensor = own_tensor(*v.u.tensor);
        break;
      case TFL_VALUE_TENSOR_LIST: {
        const TFL_Tensor* const* source = v.u.tensor_list.items;
        v.u.tensor_list.items = items_.data() + items_.size();
        for (size_t j = 0; j < v.u.tensor_list.len; ++j) {
          items_.push_back(source[j] == nullptr ? nullptr : own_tensor(*source[j]));
        }
        break;
      }
      case TFL_VALUE_INT_LIST:
        v.u.int_list.items = append(ints_, v.u.int_list.items, v.u.int_list.len);
        break;
      case TFL_VALUE_FLOAT_LIST:
        v.u.float_list.items = append(floats_, v.u.float_list.items, v.u.float_list.len);
        break;
      case TFL_VALUE_BOOL_LIST:
        v.u.bool_list.items = append(bools_, v.u.bool_list.items, v.u.bool_list.len);
        break;
      case TFL_VALUE_STRING: {
        const std::string& s = strings_.emplace_back(v.u.string.data, v.u.string.len);
        v.u.string.data = s.c_str();
        break;
      }
      default:
        break;
    }
  }
  value_ptrs_.reserve(values_.size());
  for (const TFL_Value& v : values_) value_ptrs_.push_back(&v);

  for (size_t i = 0; i < f.num_outputs; ++i) {
    TFL_Tensor& out = outputs_.emplace_back(*f.outputs[i]);
    const size_t dims = static_cast<size_t>(std::max(out.ndim, 0));
    if (dims > 0) {
      out.shape = append(ints_, out.shape, dims);
      out.strides = append(ints_, out.strides, dims);
    }
  }
  output_ptrs_.reserve(outputs_.size());
  for (TFL_Tensor& t : outputs_) output_ptrs_.push_back(&t);

  frame_ = f;
  frame_.args = value_ptrs_.data();
  frame_.num_args = value_ptrs_.size();
  frame_.outputs = output_ptrs_.data();
  frame_.num_outputs = output_ptrs_.size();
  frame_.resize_output = &refuse_resize;
  frame_.host_context = nullptr;
}

const TFL_Tensor* OwnedFrame::own_tensor(const TFL_Tensor& source) {
  TFL_Tensor& t = tensors_.emplace_back(source);
  const size_t dims = static_cast<size_t>(std::max(t.ndim, 0));
  if (dims > 0) {
    t.shape = append(ints_, source.shape, dims);
    t.strides = append(ints_, source.strides, dims);
  }
  if (t.device_type == TFL_DEVICE_HOST) {
    // A 0-dim CPU tensor (a Python number's tensor): its value now, as CUDA
    // graphs bake kernel arguments.
    const size_t bytes = static_cast<size_t>(t.dtype.bits) / 8 * std::max<size_t>(t.dtype.lanes, 1);
    TORCH_CHECK(bytes <= sizeof(std::array<uint64_t, 2>), "torch-fl: a ", bytes,
                "-byte host scalar cannot be captured into a device graph");
    std::array<uint64_t, 2>& slot = host_bytes_.emplace_back();
    slot.fill(0);
    std::memcpy(slot.data(), static_cast<const char*>(source.data) + source.byte_offset, bytes);
    t.data = slot.data();
    t.byte_offset = 0;
  }
  return &t;
}

// --- the graph's side -------------------------------------------------------

uint64_t begin(c10::DeviceIndex device, TFL_Stream* stream, Mode mode) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(find(stream) == nullptr, "torch-fl: ", device_type_name(), ":", static_cast<int>(device),
              "'s current stream is already being captured into a device graph: end that capture first, or capture "
              "on another stream");
  auto c = std::make_unique<Capture>();
  c->id = g_next_id++;
  c->device = device;
  c->origin = stream;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->streams[stream];
  g_by_stream[stream] = c.get();
  const uint64_t id = c->id;
  g_by_id[id] = std::move(c);
  detail::g_captures.fetch_add(1, std::memory_order_relaxed);
  return id;
}

Recording end(uint64_t id, TFL_Stream* stream) {
  std::string error;
  Recording out;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_by_id.find(id);
    TORCH_CHECK(it != g_by_id.end(), "torch-fl: capture_end: the capture is not underway");
    Capture* c = it->second.get();
    TORCH_CHECK(stream == c->origin, "torch-fl: capture_end must run on the stream the capture began on (",
                device_type_name(), ":", static_cast<int>(c->device),
                "'s stream current at capture_begin): make it current again before ending the capture");
    size_t unjoined = 0;
    const StreamState& origin = c->streams.at(c->origin);
    for (const auto& [s, state] : c->streams) {
      if (s == c->origin || state.seq == 0) continue;
      auto known = origin.knows.find(s);
      if (known == origin.knows.end() || known->second < state.seq) ++unjoined;
    }
    if (!c->invalidated.empty()) {
      error =
          "torch-fl: the capture was invalidated by an error raised inside it, and holds no graph: " + c->invalidated;
    } else if (unjoined != 0) {
      error = c10::str("torch-fl: ", unjoined,
                       " stream(s) joined the capture (by waiting on an event recorded during it) and queued work "
                       "that the capture's own stream never waited for: make the capture stream wait for them "
                       "(capture_stream.wait_stream(side_stream)) before the capture ends");
    } else {
      out.nodes = std::move(c->nodes);
      for (auto& entry : c->rng) out.generators.push_back(std::move(entry.second));
    }
    remove_locked(c);
  }
  TORCH_CHECK(error.empty(), error);
  return out;
}

void abort(uint64_t id) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_by_id.find(id);
  if (it != g_by_id.end()) remove_locked(it->second.get());
}

bool active(uint64_t id) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_by_id.count(id) != 0;
}

bool stream_in_capture(uint64_t id, TFL_Stream* stream) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Capture* c = find(stream);
  return c != nullptr && c->id == id;
}

uint64_t capture_of(TFL_Stream* stream) noexcept {
  if (!any()) return 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  const Capture* c = find(stream);
  return c == nullptr ? 0 : c->id;
}

// --- hooks --------------------------------------------------------------------

bool record_kernel(const KernelRef& kernel, const TFL_CallFrame& frame, Generator* rng, bool foreign) {
  if (!any()) return false;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    Capture* c = find(frame.stream);
    if (c == nullptr) return false;
    if (foreign) {
      error = refusal(c, c10::str(kernel.op, " (served by plugin ", kernel.plugin, ")"),
                      "a kernel of another plugin than the device's cannot be ordered on the device's streams. "
                      "Capture only operators of the device's own plugin");
    } else {
      Node& node = c->nodes.emplace_back();
      node.kind = Node::Kind::Kernel;
      node.kernel = kernel;
      node.frame = std::make_unique<OwnedFrame>(frame);
      node.rng = rng;
      node.rng_intra = rng != nullptr ? frame.rng_offset : 0;
      c->streams[frame.stream].seq += 1;
      return true;
    }
  }
  TORCH_CHECK(false, error);
}

std::pair<uint64_t, uint64_t> claim_rng(Generator* g, TFL_Stream* stream, uint64_t increment) {
  if (any()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (Capture* c = find(stream)) {
      GraphRng& r = c->rng[g];
      if (!r.generator) r.generator = c10::intrusive_ptr<Generator>::unsafe_reclaim_from_nonowning(g);
      const uint64_t intra = r.increment;
      r.increment += increment;
      // The seed is the generator's at each replay (Graph::replay).
      return {0, intra};
    }
  }
  return g->claim(increment);
}

bool record_copy(int32_t kind, c10::DeviceIndex dst_device, void* dst, c10::DeviceIndex src_device, const void* src,
                 size_t nbytes, TFL_Stream* stream) {
  if (!any()) return false;
  const c10::DeviceIndex device = kind == TFL_COPY_HOST_TO_DEVICE ? dst_device : src_device;
  // A synchronous copy (no stream) runs now, before the captured work: it is
  // refused when the thread's current stream is captured.
  TFL_Stream* on = stream != nullptr ? stream : plugin_stream(current_stream(device));
  std::string error;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    Capture* c = find(on);
    if (c == nullptr) return false;
    if (kind == TFL_COPY_DEVICE_TO_DEVICE && stream != nullptr && dst_device == src_device && dst_device == c->device) {
      Node& node = c->nodes.emplace_back();
      node.kind = Node::Kind::Copy;
      node.device = dst_device;
      node.dst = dst;
      node.src = src;
      node.nbytes = nbytes;
      c->streams[stream].seq += 1;
      return true;
    }
    if (kind == TFL_COPY_DEVICE_TO_HOST) {
      error = refusal(c, "a device-to-host copy (.item(), .cpu(), .tolist(), printing, a data-dependent shape)",
                      "the host would need results the capture has not computed; read results after replay(), "
                      "outside the capture");
    } else if (kind == TFL_COPY_HOST_TO_DEVICE) {
      error = refusal(c, "a host-to-device copy (torch.tensor(..., device=), .to(device) of a CPU tensor)",
                      "host data cannot be recorded. Copy inputs into static device tensors before capture_begin, "
                      "and refresh them with copy_ between replays");
    } else {
      error = refusal(c, "a synchronous or cross-device copy",
                      "only asynchronous copies within the capture's device can be recorded");
    }
  }
  TORCH_CHECK(false, error);
}

void check_sync(const char* what, TFL_Stream* stream) {
  if (!any()) return;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (stream != nullptr) {
      if (Capture* c = find(stream)) {
        error = refusal(c, c10::str("host ", what, " of a captured stream"),
                        "its work has not run and will only run at replay(); synchronize after the capture ends");
      }
    } else {
      for (auto& entry : g_by_id) {
        Capture* c = entry.second.get();
        if (!refuses_sync(*c)) continue;
        error = refusal(c, c10::str("host ", what),
                        c10::str("capture_error_mode=\"", mode_name(c->mode),
                                 "\" refuses synchronization while a capture is underway; synchronize before "
                                 "capture_begin, or capture with capture_error_mode=\"relaxed\""));
        break;
      }
    }
  }
  TORCH_CHECK(error.empty(), error);
}

void check_capturable(const char* op, const char* why) {
  if (!any()) return;
  TFL_Stream* stream = plugin_stream(current_stream(current_device()));
  std::string error;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    Capture* c = find(stream);
    if (c == nullptr) return;
    error = refusal(c, op, why);
  }
  TORCH_CHECK(false, error);
}

bool record_event(void* event, TFL_Stream* stream) {
  if (!any()) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  Capture* c = find(stream);
  if (c == nullptr) {
    g_events.erase(event);  // recorded again outside the capture
    return false;
  }
  const StreamState& state = c->streams[stream];
  EventMark mark{c->id, state.knows};
  mark.knows[stream] = state.seq;
  g_events[event] = std::move(mark);
  return true;
}

bool wait_event(void* event, c10::DeviceIndex device, TFL_Stream* stream) {
  if (!any()) return false;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_events.find(event);
    Capture* waiter = find(stream);
    if (it == g_events.end()) {
      if (waiter == nullptr) return false;
      error = refusal(waiter, "waiting on an event recorded outside the capture",
                      "the wait cannot be recorded. Wait before capture_begin (capture_stream.wait_stream(other) "
                      "before the capture), so that the capture starts after that work");
    } else {
      Capture* c = g_by_id.at(it->second.capture).get();
      if (waiter != nullptr && waiter != c) {
        error = refusal(waiter, "waiting on an event of another capture", "captures cannot depend on each other");
      } else if (device != c->device) {
        error = refusal(c, c10::str("a stream of ", device_type_name(), ":", static_cast<int>(device)),
                        "a graph holds the work of one device; capture each device's work in a graph of its own");
      } else {
        if (waiter == nullptr) g_by_stream[stream] = c;  // joins the capture
        StreamState& state = c->streams[stream];
        for (const auto& [s, seq] : it->second.knows) {
          uint64_t& known = state.knows[s];
          known = std::max(known, seq);
        }
        return true;
      }
    }
  }
  TORCH_CHECK(false, error);
}

void check_event(void* event, const char* what) {
  if (!any()) return;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_events.find(event);
    if (it == g_events.end()) return;
    error = refusal(g_by_id.at(it->second.capture).get(), c10::str("event ", what, " of an event recorded during it"),
                    "the event marks work that has not run and will only run at replay()");
  }
  TORCH_CHECK(false, error);
}

void forget_event(void* event) noexcept {
  if (!any()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.erase(event);
}

}  // namespace torchfl::capture

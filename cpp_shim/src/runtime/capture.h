// Stream capture: what the rest of the shim asks while a device graph is
// being captured (graphs/graph.h owns the graphs themselves).
//
// While a stream is captured, work queued on it is recorded instead of run:
// plugin kernel launches (with a frame the capture owns, since the ABI's
// frame lives only for the call) and device-to-device copies. Whatever would
// need the work to have run raises, naming the operation: host
// synchronization, device-to-host and host-to-device copies, CPU fallbacks,
// data-dependent shapes. As in CUDA, a stream that waits on an event recorded
// on a captured stream joins the capture, and every joined stream must be
// joined back into the capture's own stream before it ends.
//
// Captures are keyed by plugin stream, not by thread: the autograd engine
// runs backward kernels on its own threads, on the stream of the forward
// operation. The capture mode only decides which *other* calls are refused
// (c10's GraphCaptureMode): Global refuses synchronization on any thread
// while a Global capture is underway, ThreadLocal on the capturing thread,
// Relaxed only when it touches a captured stream.
//
// Every hook starts with one relaxed atomic load, so nothing is paid while
// no capture is underway.
#pragma once

#include <c10/core/Device.h>
#include <c10/macros/Macros.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/generator.h"
#include "torch_fl/plugin.h"

namespace torchfl::capture {

enum class Mode : uint8_t { Global, ThreadLocal, Relaxed };

// "global", "thread_local", "relaxed" (and "default", which is Global, as on
// CUDA); raises for anything else.
Mode parse_mode(const std::string& name);
const char* mode_name(Mode mode) noexcept;

// A plugin kernel as a recorded launch names it. The strings belong to the
// shim's kernel bindings, which are never freed.
struct KernelRef {
  TFL_KernelFn fn = nullptr;
  const char* op = "";
  const char* plugin = "";
  const TFL_PluginApi* api = nullptr;
};

// A TFL_CallFrame that owns everything it points to: values, tensor
// descriptors with their shapes and strides, lists, strings, and the bytes of
// 0-dim host tensors (baked in, as CUDA graphs bake kernel arguments). Its
// resize_output refuses every call: shapes are fixed at capture.
class OwnedFrame {
 public:
  explicit OwnedFrame(const TFL_CallFrame& frame);
  OwnedFrame(const OwnedFrame&) = delete;
  OwnedFrame& operator=(const OwnedFrame&) = delete;
  TFL_CallFrame* get() { return &frame_; }
  const TFL_CallFrame& frame() const { return frame_; }

 private:
  const TFL_Tensor* own_tensor(const TFL_Tensor& t);

  std::vector<TFL_Value> values_;
  std::vector<const TFL_Value*> value_ptrs_;
  std::vector<TFL_Tensor> tensors_;  // argument tensors and list items
  std::vector<const TFL_Tensor*> items_;
  std::vector<int64_t> ints_;  // shapes, strides, int lists
  std::vector<double> floats_;
  std::vector<uint8_t> bools_;
  std::vector<std::string> strings_;
  std::vector<std::array<uint64_t, 2>> host_bytes_;  // 0-dim host tensors
  std::vector<TFL_Tensor> outputs_;
  std::vector<TFL_Tensor*> output_ptrs_;
  TFL_CallFrame frame_{};
};

// One recorded piece of work, in the order the host queued it.
struct Node {
  enum class Kind : uint8_t { Kernel, Copy };
  Kind kind = Kind::Kernel;
  // Kernel
  KernelRef kernel;
  std::unique_ptr<OwnedFrame> frame;
  Generator* rng = nullptr;  // set when the kernel draws random numbers
  uint64_t rng_intra = 0;    // its offset inside the graph's draw
  // Copy (device to device, one device)
  c10::DeviceIndex device = 0;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t nbytes = 0;
};

// A generator the graph draws from, and how far one replay advances it.
struct GraphRng {
  c10::intrusive_ptr<Generator> generator;
  uint64_t increment = 0;
};

// What a finished capture hands its graph.
struct Recording {
  std::vector<Node> nodes;
  std::vector<GraphRng> generators;
};

namespace detail {
extern std::atomic<int> g_captures;  // captures underway, all modes
}  // namespace detail

inline bool any() noexcept {
  return C10_UNLIKELY(detail::g_captures.load(std::memory_order_relaxed) != 0);
}

// --- the graph's side ------------------------------------------------------

// Starts capturing `stream` of `device`; returns its capture id (never 0).
// Raises when the stream is already captured.
uint64_t begin(c10::DeviceIndex device, TFL_Stream* stream, Mode mode);

// Ends capture `id` begun on `stream`: raises when the capture was
// invalidated (by an error raised inside it) or left a joined stream
// unjoined, or when `stream` is not the one it began on. The capture is
// over either way, unless the stream was wrong.
Recording end(uint64_t id, TFL_Stream* stream);

// Ends capture `id` without checks (a failed capture, a graph reset during
// capture).
void abort(uint64_t id) noexcept;

// Whether capture `id` is underway.
bool active(uint64_t id) noexcept;

// Whether `stream` belongs to capture `id`: the caching allocator's routing
// filter.
bool stream_in_capture(uint64_t id, TFL_Stream* stream) noexcept;

// The capture `stream` belongs to (0: none).
uint64_t capture_of(TFL_Stream* stream) noexcept;

// --- hooks for the rest of the shim ---------------------------------------

// A kernel launch on `frame.stream`: recorded (true) when the stream is
// captured; `rng` is the generator claim_rng drew its offset from, if any.
// Raises for kernels that cannot be recorded (a foreign plugin's).
bool record_kernel(const KernelRef& kernel, const TFL_CallFrame& frame, Generator* rng, bool foreign);

// The (seed, offset) of a random kernel launched on `stream`: inside a
// capture, the offset within the graph's draw (replays add their own base);
// otherwise the generator's next `increment` numbers.
std::pair<uint64_t, uint64_t> claim_rng(Generator* g, TFL_Stream* stream, uint64_t increment);

// A byte copy about to be queued on `stream` (NULL: synchronous). Returns
// true when it was recorded (device to device on a captured stream); raises
// for copies a capture cannot hold.
bool record_copy(int32_t kind, c10::DeviceIndex dst_device, void* dst, c10::DeviceIndex src_device, const void* src,
                 size_t nbytes, TFL_Stream* stream);

// Raises when the host may not wait for `stream` now (NULL: the whole
// device): it is captured, or a capture's mode refuses synchronization.
void check_sync(const char* what, TFL_Stream* stream);

// Raises when the current stream of the current device is captured: `op`
// cannot run inside a capture because `why`.
void check_capturable(const char* op, const char* why);

// Events. record_event: true when `stream` is captured (the event then marks
// a point of the capture, nothing is queued). wait_event: true when the
// event marks a point of a capture (`stream` joins it, nothing is queued).
// check_event: raises when the host would wait on or query such an event.
bool record_event(void* event, TFL_Stream* stream);
bool wait_event(void* event, c10::DeviceIndex device, TFL_Stream* stream);
void check_event(void* event, const char* what);

// Forgets an event that is being destroyed.
void forget_event(void* event) noexcept;

}  // namespace torchfl::capture

// The device trace: one record per call torch-fl makes into the plugin for
// an operator - kernel launches, copies - and per CPU fallback, for
// torch_fl.trace(), TORCH_FL_TRACE and torch.profiler's PrivateUse1
// activity (kineto_profiler.cpp).
//
// Off by default: one relaxed load per call. While on, each record takes
// the host clock (c10::getTime(), the clock PyTorch's profiler uses) at
// both ends of the call. When the plugin reports activity records (ABI 1.8,
// activity.h), each call gets a call id the plugin tags its records with,
// and the call's device time is the span of its device-work records.
// Otherwise, when the plugin can time events
// (TFL_CAP_EVENT_TIMING with event_elapsed_time), a timing event recorded
// on the call's stream before and after it: their timestamps, read when the
// trace is collected, are the call's device time. Device timestamps are put
// on the host clock through an anchor event per device: the first traced
// call on a device synchronizes its stream, records the anchor, waits for
// it and reads the host clock, so a device time is anchor host time plus
// the elapsed time since the anchor.
//
// Several consumers may trace at once (a torch_fl.trace() block inside a
// torch.profiler one): each remembers where the records (and the plugin's
// activity records) were when it began and takes the records from there;
// the records are dropped when the last consumer ends.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "observe/activity.h"
#include "torch_fl/plugin.h"

namespace torchfl {

enum class TraceKind : uint8_t { Kernel = 0, Copy = 1, Fallback = 2 };

// One traced call, as consumers receive it (times resolved).
struct TraceRecord {
  TraceKind kind = TraceKind::Kernel;
  std::string name;          // "add.Tensor", "aten::cosh", "copy (host to device)"
  std::string plugin;        // the plugin's label; empty for a fallback
  std::string inputs;        // "f32[4, 4], f32[4], 1"
  int32_t device = -1;       // -1: none
  int32_t stream = -1;       // 0: the device's default stream, then 1, 2... in order of first use; -1: none
  uint64_t thread = 0;       // 1, 2... in order of each thread's first traced call
  uint64_t correlation = 0;  // the profiler's correlation id of the operator, 0 if none
  uint64_t call = 0;         // the id the plugin's activity records carry (activity.h), 0 if none
  uint64_t bytes = 0;        // copies
  int64_t host_begin_ns = 0;
  int64_t host_end_ns = 0;
  int64_t device_begin_ns = -1;  // -1: not measured
  int64_t device_end_ns = -1;
};

namespace detail {
extern std::atomic<bool> g_tracing;
}  // namespace detail

inline bool tracing() noexcept {
  return C10_UNLIKELY(detail::g_tracing.load(std::memory_order_relaxed));
}

// Traces one call while it is in scope; does nothing when tracing is off.
// Never throws from the plugin's event calls: a call whose device time
// cannot be measured is recorded without it.
class TraceScope {
 public:
  // `inputs` describes the arguments (describe_frame); built by the caller
  // only while tracing().
  TraceScope(TraceKind kind, const char* name, const char* plugin, c10::DeviceIndex device, TFL_Stream* stream,
             std::string inputs = {});
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  bool active() const noexcept { return index_ != kInactive; }
  void set_bytes(uint64_t bytes);

 private:
  static constexpr size_t kInactive = SIZE_MAX;
  size_t index_ = kInactive;
  uint64_t epoch_ = 0;
  TFL_Stream* stream_ = nullptr;
  bool correlated_ = false;     // the plugin was told a call id
  uint64_t previous_call_ = 0;  // the enclosing scope's, restored after
};

// "f32[4, 4], i64[], 2.5": the frame's arguments, for a kernel's record.
std::string describe_frame(const TFL_CallFrame& frame);
// The same for an operator's boxed arguments (a CPU fallback).
std::string describe_arguments(c10::ArrayRef<c10::IValue> args);

// What a consumer collected: the calls, and the plugin's activity records
// (their stream_index filled in as TraceRecord::stream is).
struct TraceCollection {
  std::vector<TraceRecord> records;
  std::vector<NativeRecord> native;
};

// Starts a consumer: turns recording on; returns its token.
uint64_t trace_begin();
// The consumer's records, with device times resolved (waits for the
// devices' queued work), without ending the consumer. An unknown token
// collects nothing.
TraceCollection trace_collect(uint64_t token);
// Ends a consumer; the last one turns recording off and drops the records.
void trace_end(uint64_t token);
// trace_collect(token) as JSON for the Python side: {"dropped": N,
// "native_dropped": N, "records": [[kind, name, plugin, inputs, device,
// stream, thread, correlation, bytes, host_begin_ns, host_end_ns,
// device_begin_ns, device_end_ns, call], ...], "native": [[kind, name,
// detail, device, stream, call, begin_ns, end_ns, host_clock], ...]}
// (python/torch_fl/device_trace.py reads it).
std::string trace_json(uint64_t token);
// Records dropped because the trace was full (since recording began).
uint64_t trace_dropped();

// The profiler's correlation id of the operator running on this thread
// (kineto_profiler.cpp sets it).
void push_trace_correlation(uint64_t id) noexcept;
void pop_trace_correlation() noexcept;

}  // namespace torchfl

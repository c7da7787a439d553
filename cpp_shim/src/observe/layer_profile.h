// Where operator time goes: torch-fl's own layers versus plugin kernels.
//
// Off by default (one relaxed load per operator). When on, each operator
// entry the shim registers - plugin kernels, and the allocation and view
// operators it implements itself - times itself, and plugin kernel calls
// time themselves inside it; "layer" time is the entries' time minus the
// kernel calls'. It includes what the shim does around a kernel (device
// checks, call-frame building, output metadata and allocation, including
// the plugin's allocate) and excludes the kernels, PyTorch's own dispatcher
// and autograd, and the CPU fallback of operators no plugin serves (measure
// with no fallbacks: a plugin kernel that declines a call at run time has
// its fallback counted in its entry).
// Only the outermost entry on a thread counts, so a shim entry that reaches
// another through the dispatcher is not counted twice.
//
// Each entry is also counted under its operator's name, so a profile says
// which operators the layer time goes to (the layer cost of an entry
// depends on its arguments and outputs: a batch norm's is several times an
// add's).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include <c10/macros/Macros.h>

#include "observe/trace.h"
#include "runtime/inflight.h"
#include "torch_fl/plugin.h"

namespace torchfl {

struct LayerProfile {
  uint64_t entries;    // operator entries timed
  uint64_t entry_ns;   // their total time
  uint64_t kernel_ns;  // of which inside plugin kernel calls
  uint64_t kernel_calls;
  uint64_t alloc_ns;  // inside the plugin's allocate/deallocate calls
  uint64_t alloc_calls;
};

void set_layer_profiling(bool on);
bool layer_profiling_enabled();
LayerProfile layer_profile();
void reset_layer_profile();
// The profile per operator, as a JSON array of {"operator", "entries",
// "entry_ns", "kernel_ns"} objects sorted by name.
std::string layer_profile_operators_json();

namespace detail {
extern std::atomic<bool> g_profiling;
// `op` names the entry's operator ("aten::add.Tensor") and outlives the
// process' profiles; `kernel_ns` is the part of `ns` inside kernel calls.
void add_entry(const char* op, uint64_t ns, uint64_t kernel_ns);
void add_kernel(uint64_t ns);
void add_alloc(uint64_t ns);
extern thread_local int t_depth;
// Kernel time inside the calling thread's outermost entry so far.
extern thread_local uint64_t t_entry_kernel_ns;
}  // namespace detail

// Times an operator entry for the layer profile (RAII). `op` names the
// operator and must outlive the process' profiles (a literal, or a string
// owned by the registered kernel).
class EntryTimer {
 public:
  explicit EntryTimer(const char* op) {
    if (C10_UNLIKELY(detail::g_profiling.load(std::memory_order_relaxed))) {
      if (detail::t_depth++ == 0) {
        op_ = op;
        detail::t_entry_kernel_ns = 0;
        start_ = std::chrono::steady_clock::now();
      }
      active_ = true;
    }
  }
  ~EntryTimer() {
    if (C10_UNLIKELY(active_)) {
      if (--detail::t_depth == 0) {
        const auto ns = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count());
        detail::add_entry(op_, ns, detail::t_entry_kernel_ns);
      }
    }
  }
  EntryTimer(const EntryTimer&) = delete;
  EntryTimer& operator=(const EntryTimer&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
  const char* op_ = nullptr;
  bool active_ = false;
};

// Times a plugin allocate or deallocate call for the layer profile (RAII):
// what a caching allocator saves shows up here.
class AllocTimer {
 public:
  AllocTimer() {
    if (C10_UNLIKELY(detail::g_profiling.load(std::memory_order_relaxed))) {
      start_ = std::chrono::steady_clock::now();
      active_ = true;
    }
  }
  ~AllocTimer() {
    if (C10_UNLIKELY(active_)) {
      detail::add_alloc(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count()));
    }
  }
  AllocTimer(const AllocTimer&) = delete;
  AllocTimer& operator=(const AllocTimer&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
  bool active_ = false;
};

// call_kernel's path while profiling or tracing.
TFL_Error* call_kernel_observed(TFL_KernelFn fn, const TFL_CallFrame* frame, const char* plugin, const char* op);

// Calls a plugin kernel, recorded as the call in flight (inflight.h), timed
// when profiling and recorded when tracing (trace.h). `plugin` and `op`
// outlive the call.
inline TFL_Error* call_kernel(TFL_KernelFn fn, const TFL_CallFrame* frame, const char* plugin, const char* op) {
  const InFlightScope in_flight(plugin, op);
  if (C10_LIKELY(!detail::g_profiling.load(std::memory_order_relaxed) && !tracing())) {
    return fn(frame);
  }
  return call_kernel_observed(fn, frame, plugin, op);
}

}  // namespace torchfl

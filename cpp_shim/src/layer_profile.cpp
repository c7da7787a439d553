#include "layer_profile.h"

#include <atomic>

namespace torchfl {
namespace detail {

std::atomic<bool> g_profiling{false};
thread_local int t_depth = 0;

namespace {
std::atomic<uint64_t> g_entries{0};
std::atomic<uint64_t> g_entry_ns{0};
std::atomic<uint64_t> g_kernel_ns{0};
std::atomic<uint64_t> g_kernel_calls{0};
std::atomic<uint64_t> g_alloc_ns{0};
std::atomic<uint64_t> g_alloc_calls{0};
}  // namespace

void add_entry(uint64_t ns) {
  g_entries.fetch_add(1, std::memory_order_relaxed);
  g_entry_ns.fetch_add(ns, std::memory_order_relaxed);
}

void add_kernel(uint64_t ns) {
  g_kernel_calls.fetch_add(1, std::memory_order_relaxed);
  g_kernel_ns.fetch_add(ns, std::memory_order_relaxed);
}

void add_alloc(uint64_t ns) {
  g_alloc_calls.fetch_add(1, std::memory_order_relaxed);
  g_alloc_ns.fetch_add(ns, std::memory_order_relaxed);
}

}  // namespace detail

TFL_Error* call_kernel_observed(TFL_KernelFn fn, const TFL_CallFrame* frame, const char* plugin, const char* op) {
  const TraceScope trace(TraceKind::Kernel, op, plugin, frame->device_index, frame->stream,
                         tracing() ? describe_frame(*frame) : std::string());
  if (!detail::g_profiling.load(std::memory_order_relaxed)) return fn(frame);
  const auto start = std::chrono::steady_clock::now();
  TFL_Error* error = fn(frame);
  detail::add_kernel(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count()));
  return error;
}

void set_layer_profiling(bool on) {
  detail::g_profiling.store(on, std::memory_order_relaxed);
}

bool layer_profiling_enabled() {
  return detail::g_profiling.load(std::memory_order_relaxed);
}

LayerProfile layer_profile() {
  return {detail::g_entries.load(std::memory_order_relaxed),   detail::g_entry_ns.load(std::memory_order_relaxed),
          detail::g_kernel_ns.load(std::memory_order_relaxed), detail::g_kernel_calls.load(std::memory_order_relaxed),
          detail::g_alloc_ns.load(std::memory_order_relaxed),  detail::g_alloc_calls.load(std::memory_order_relaxed)};
}

void reset_layer_profile() {
  detail::g_entries.store(0, std::memory_order_relaxed);
  detail::g_entry_ns.store(0, std::memory_order_relaxed);
  detail::g_kernel_ns.store(0, std::memory_order_relaxed);
  detail::g_kernel_calls.store(0, std::memory_order_relaxed);
  detail::g_alloc_ns.store(0, std::memory_order_relaxed);
  detail::g_alloc_calls.store(0, std::memory_order_relaxed);
}

}  // namespace torchfl

#include "observe/layer_profile.h"

#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>

#include <c10/util/Exception.h>

namespace torchfl {
namespace detail {

std::atomic<bool> g_profiling{false};
thread_local int t_depth = 0;
thread_local uint64_t t_entry_kernel_ns = 0;

namespace {
// Kernel calls outside any entry count here too, so these are not the sum
// of the operators' kernel time.
std::atomic<uint64_t> g_kernel_ns{0};
std::atomic<uint64_t> g_kernel_calls{0};
std::atomic<uint64_t> g_alloc_ns{0};
std::atomic<uint64_t> g_alloc_calls{0};

struct OperatorTimes {
  uint64_t entries = 0;
  uint64_t entry_ns = 0;
  uint64_t kernel_ns = 0;
};
// The entries, keyed by the name's address: one per registered kernel or
// built-in entry, so a lookup hashes a pointer, not a string. The profile's
// entry totals are their sums. Only touched while profiling, after the
// entry's clock has stopped.
std::mutex g_operators_mutex;
std::unordered_map<const char*, OperatorTimes>& operators() {
  static auto* map = new std::unordered_map<const char*, OperatorTimes>();  // leaked: used until exit
  return *map;
}
}  // namespace

void add_entry(const char* op, uint64_t ns, uint64_t kernel_ns) {
  std::lock_guard<std::mutex> lock(g_operators_mutex);
  OperatorTimes& t = operators()[op != nullptr ? op : "?"];
  ++t.entries;
  t.entry_ns += ns;
  t.kernel_ns += kernel_ns;
}

void add_kernel(uint64_t ns) {
  g_kernel_calls.fetch_add(1, std::memory_order_relaxed);
  g_kernel_ns.fetch_add(ns, std::memory_order_relaxed);
  if (t_depth > 0) t_entry_kernel_ns += ns;
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
  LayerProfile p{0,
                 0,
                 detail::g_kernel_ns.load(std::memory_order_relaxed),
                 detail::g_kernel_calls.load(std::memory_order_relaxed),
                 detail::g_alloc_ns.load(std::memory_order_relaxed),
                 detail::g_alloc_calls.load(std::memory_order_relaxed)};
  std::lock_guard<std::mutex> lock(detail::g_operators_mutex);
  for (const auto& [op, t] : detail::operators()) {
    p.entries += t.entries;
    p.entry_ns += t.entry_ns;
  }
  return p;
}

std::string layer_profile_operators_json() {
  // Keyed by address, reported by name: equal names at two addresses (no
  // such pair today) would add up rather than appear twice.
  std::map<std::string, detail::OperatorTimes> merged;
  {
    std::lock_guard<std::mutex> lock(detail::g_operators_mutex);
    for (const auto& [op, t] : detail::operators()) {
      detail::OperatorTimes& m = merged[op];
      m.entries += t.entries;
      m.entry_ns += t.entry_ns;
      m.kernel_ns += t.kernel_ns;
    }
  }
  std::string json = "[";
  for (const auto& [op, t] : merged) {
    if (json.size() > 1) json += ",";
    // Operator names are identifiers, dots and colons: nothing to escape.
    json += c10::str("{\"operator\":\"", op, "\",\"entries\":", t.entries, ",\"entry_ns\":", t.entry_ns,
                     ",\"kernel_ns\":", t.kernel_ns, "}");
  }
  return json + "]";
}

void reset_layer_profile() {
  {
    std::lock_guard<std::mutex> lock(detail::g_operators_mutex);
    detail::operators().clear();
  }
  detail::g_kernel_ns.store(0, std::memory_order_relaxed);
  detail::g_kernel_calls.store(0, std::memory_order_relaxed);
  detail::g_alloc_ns.store(0, std::memory_order_relaxed);
  detail::g_alloc_calls.store(0, std::memory_order_relaxed);
}

}  // namespace torchfl

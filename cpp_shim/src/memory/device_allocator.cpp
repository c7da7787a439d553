#include "memory/device_allocator.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <utility>

#include "memory/caching_allocator.h"
#include "observe/layer_profile.h"
#include "runtime/fork.h"
#include "runtime/runtime.h"
#include "runtime/status.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kMemoryStatsSize = TFL_STRUCT_SIZE(TFL_MemoryStats, num_ooms);
constexpr size_t kAggregate = static_cast<size_t>(StatType::AGGREGATE);

// What the deleter needs when the shim keeps its own statistics (plugins
// without memory_stats): c10's deleter receives one context pointer, and
// deallocate needs the device besides the pointer, the statistics the
// size. Otherwise the context is the pointer itself and the deleter is one
// per device (`kDeleters`), so an allocation costs no heap object.
struct Allocation {
  void* ptr;
  size_t nbytes;
  c10::DeviceIndex device;
};

// Statistics the shim keeps itself, for plugins without memory_stats, plus
// the baselines that make "reset accumulated" work over the plugin's
// since-start counters.
struct OwnStats {
  std::mutex mutex;
  Stat allocation;
  Stat allocated_bytes;
  int64_t num_ooms = 0;
  // Plugin counters at the last resetAccumulatedStats.
  uint64_t base_allocations = 0;
  uint64_t base_frees = 0;
  uint64_t base_ooms = 0;
};
// Immortal for the same reason as the allocator (see device_allocator()).
OwnStats& own_stats(c10::DeviceIndex device) {
  static auto* table = new std::array<OwnStats, kMaxDevices>();
  return (*table)[static_cast<size_t>(device)];
}

// Gives `ptr` back to the plugin. A deleter runs inside destructors and
// must not throw: a failure is a warning.
void plugin_deallocate(const AttachedDevice& d, c10::DeviceIndex device, void* ptr) {
  TFL_Error* e = nullptr;
  {
    const AllocTimer timer;
    const InFlightScope in_flight(d.plugin_label.c_str(), "deallocate");
    e = d.api->deallocate(device, ptr);
  }
  if (e != nullptr) {
    const PluginStatus status = take_status(d.api, e);
    TORCH_WARN("torch-fl: plugin ", d.plugin_label, ": deallocate on ", d.device_name, ":", static_cast<int>(device),
               " failed (", status_code_name(status.code), "): ", status.message);
  }
}

// The deleter of device `D`'s allocations when the plugin keeps the
// statistics: the context is the pointer.
template <size_t D>
void free_on_device(void* ptr) {
  // In a bad fork the memory is leaked: the child must not call the plugin.
  if (in_bad_fork()) return;
  if (const AttachedDevice* d = attached_device()) {
    plugin_deallocate(*d, static_cast<c10::DeviceIndex>(D), ptr);
  }
}

template <size_t... D>
constexpr std::array<c10::DeleterFnPtr, sizeof...(D)> make_deleters(std::index_sequence<D...>) {
  return {&free_on_device<D>...};
}
constexpr auto kDeleters = make_deleters(std::make_index_sequence<static_cast<size_t>(kMaxDevices)>());

// The deleter of allocations with an `Allocation` context.
void free_allocation(void* ctx) {
  // In a bad fork the memory is leaked, and the statistics' lock, which a
  // parent thread may have held at fork time, is not taken.
  if (in_bad_fork()) return;
  auto* a = static_cast<Allocation*>(ctx);
  if (const AttachedDevice* d = attached_device()) {
    plugin_deallocate(*d, a->device, a->ptr);
    if (d->memory_stats == nullptr) {
      OwnStats& s = own_stats(a->device);
      std::lock_guard<std::mutex> lock(s.mutex);
      s.allocation.decrease(1);
      s.allocated_bytes.decrease(static_cast<int64_t>(a->nbytes));
    }
  }
  delete a;
}

TFL_MemoryStats plugin_stats(const AttachedDevice& d, c10::DeviceIndex device) {
  TFL_MemoryStats out;
  std::memset(&out, 0, sizeof(out));
  out.struct_size = kMemoryStatsSize;
  TFL_CHECK_STATUS(d.ref(), "memory_stats", d.memory_stats(device, &out));
  return out;
}

size_t bytes_in_use(const AttachedDevice& d, c10::DeviceIndex device) {
  if (d.memory_stats != nullptr) {
    return plugin_stats(d, device).allocated_bytes;
  }
  OwnStats& s = own_stats(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  return static_cast<size_t>(s.allocated_bytes.current);
}

c10::DataPtr native_allocate(c10::DeviceIndex device, size_t nbytes);

// TORCH_FL_ALLOC_CONF: comma-separated key:value pairs, in the style of
// PYTORCH_CUDA_ALLOC_CONF. Only torch-fl's own keys live here; the
// device-generic ones (max_split_size_mb, ...) are PYTORCH_ALLOC_CONF's,
// which c10 parses for every accelerator.
bool caching_requested() {
  const char* conf = std::getenv("TORCH_FL_ALLOC_CONF");
  bool caching = true;
  std::string_view rest = conf == nullptr ? "" : conf;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
    const auto trim = [](std::string_view v) {
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
      return v;
    };
    item = trim(item);
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    const std::string_view key = trim(item.substr(0, colon));
    const std::string_view value = colon == std::string_view::npos ? "" : trim(item.substr(colon + 1));
    TORCH_CHECK_VALUE(key == "backend", "unknown key '", key,
                      "' (the device-generic keys (max_split_size_mb, "
                      "roundup_power2_divisions, ...) go in PYTORCH_ALLOC_CONF)");
    TORCH_CHECK_VALUE(value == "caching" || value == "plugin", "backend must be 'caching' or ", "'plugin', not '",
                      value, "'");
    caching = value == "caching";
  }
  return caching;
}

class DeviceAllocatorImpl final : public c10::DeviceAllocator {
 public:
  // allocate() has no device argument: it serves the current device, which
  // the empty_* kernels set with a device guard (pitfall P11).
  c10::DataPtr allocate(size_t nbytes) override { return allocate_on(current_device(), nbytes); }

  void copy_data(void* dest, const void* src, size_t count) const override {
    const c10::DeviceIndex device = current_device();
    copy_d2d(device, dest, device, src, count, nullptr);
  }

  bool initialized() override { return attached_device() != nullptr; }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    check_not_forked("empty_cache");
    const AttachedDevice* d = attached_device();
    if (d == nullptr) return;
    if (caching_enabled()) caching::empty_cache();
    if (d->empty_cache == nullptr) return;  // optional: no-op
    for (int32_t i = 0; i < d->device_count; ++i) {
      TFL_CHECK_STATUS(d->ref(), "empty_cache", d->empty_cache(i));
    }
  }

  // Under the plugin backend a no-op on purpose: the plugin's deallocate is
  // stream-ordered (memory is reused only after all work submitted before
  // the free, on any stream of the device, has completed), which is exactly
  // the guarantee recordStream exists to provide.
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (caching::owns(ptr)) caching::record_stream(ptr, stream);
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device_index(device);
    const AttachedDevice& d = runtime("memory statistics");
    if (caching_enabled()) return caching::device_stats(device);
    DeviceStats stats;
    OwnStats& own = own_stats(device);
    if (d.memory_stats != nullptr) {
      const TFL_MemoryStats m = plugin_stats(d, device);
      std::lock_guard<std::mutex> lock(own.mutex);
      const auto as_i64 = [](uint64_t v) {
        return static_cast<int64_t>(v);
      };
      Stat& bytes = stats.allocated_bytes[kAggregate];
      bytes.current = as_i64(m.allocated_bytes);
      bytes.peak = as_i64(m.peak_allocated_bytes);
      stats.active_bytes[kAggregate] = bytes;
      stats.requested_bytes[kAggregate] = bytes;
      Stat& reserved = stats.reserved_bytes[kAggregate];
      reserved.current = as_i64(m.reserved_bytes);
      reserved.peak = std::max(reserved.current, bytes.peak);
      Stat& count = stats.allocation[kAggregate];
      count.current = as_i64(m.num_allocations - m.num_frees);
      count.peak = count.current;
      count.allocated = as_i64(m.num_allocations - own.base_allocations);
      count.freed = as_i64(m.num_frees - own.base_frees);
      stats.active[kAggregate] = count;
      stats.num_ooms = as_i64(m.num_ooms - own.base_ooms);
      stats.num_device_alloc = count.allocated;
      stats.num_device_free = count.freed;
    } else {
      std::lock_guard<std::mutex> lock(own.mutex);
      stats.allocation[kAggregate] = own.allocation;
      stats.active[kAggregate] = own.allocation;
      stats.allocated_bytes[kAggregate] = own.allocated_bytes;
      stats.active_bytes[kAggregate] = own.allocated_bytes;
      stats.requested_bytes[kAggregate] = own.allocated_bytes;
      stats.reserved_bytes[kAggregate] = own.allocated_bytes;
      stats.num_ooms = own.num_ooms;
      stats.num_device_alloc = own.allocation.allocated;
      stats.num_device_free = own.allocation.freed;
    }
    return stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device_index(device);
    const AttachedDevice& d = runtime("memory statistics");
    if (caching_enabled()) caching::reset_accumulated_stats(device);
    OwnStats& own = own_stats(device);
    if (d.memory_stats != nullptr) {
      const TFL_MemoryStats m = plugin_stats(d, device);
      std::lock_guard<std::mutex> lock(own.mutex);
      own.base_allocations = m.num_allocations;
      own.base_frees = m.num_frees;
      own.base_ooms = m.num_ooms;
    } else {
      std::lock_guard<std::mutex> lock(own.mutex);
      own.allocation.reset_accumulated();
      own.allocated_bytes.reset_accumulated();
      own.num_ooms = 0;
    }
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device_index(device);
    const AttachedDevice& d = runtime("memory statistics");
    if (caching_enabled()) caching::reset_peak_stats(device);
    if (d.reset_peak_memory_stats != nullptr) {
      TFL_CHECK_STATUS(d.ref(), "reset_peak_memory_stats", d.reset_peak_memory_stats(device));
    }
    OwnStats& own = own_stats(device);
    std::lock_guard<std::mutex> lock(own.mutex);
    own.allocation.reset_peak();
    own.allocated_bytes.reset_peak();
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device_index(device);
    const AttachedDevice& d = runtime("memory statistics");
    size_t total = 0;
    size_t used = 0;
    if (d.memory_stats != nullptr) {
      const TFL_MemoryStats m = plugin_stats(d, device);
      total = m.total_bytes;
      used = m.reserved_bytes;
    } else {
      used = bytes_in_use(d, device);
    }
    if (total == 0) total = device_properties(device).total_memory;
    return {total > used ? total - used : 0, total};
  }
};

}  // namespace

// Immortal, like the allocations it hands out: storages freed during static
// destruction must still find it.
c10::DeviceAllocator* device_allocator() {
  static auto* impl = new DeviceAllocatorImpl();
  return impl;
}

std::string format_bytes(size_t nbytes) {
  static constexpr const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(nbytes);
  size_t unit = 0;
  while (v >= 1024.0 && unit + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++unit;
  }
  char buf[64];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%zu bytes", nbytes);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[unit]);
  }
  return buf;
}

bool caching_enabled() {
  // 0: undecided, 1: plugin, 2: caching. Decided after attach only: the
  // plugin's capabilities are part of the decision.
  static std::atomic<int> state{0};
  const int known = state.load(std::memory_order_acquire);
  if (C10_LIKELY(known != 0)) return known == 2;
  const bool requested = caching_requested();
  const AttachedDevice* d = attached_device();
  if (d == nullptr) return requested;
  const bool caching = requested && !d->caching_allocator();
  state.store(caching ? 2 : 1, std::memory_order_release);
  return caching;
}

std::string memory_snapshot_json() {
  if (caching_enabled()) return caching::snapshot_json();
  return R"({"segments":[],"device_traces":[]})";
}

c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes) {
  if (caching_enabled()) return caching::allocate(device, nbytes);
  return native_allocate(device, nbytes);
}

namespace {

c10::DataPtr native_allocate(c10::DeviceIndex device, size_t nbytes) {
  const AttachedDevice& d = runtime("allocate");
  void* ptr = nullptr;
  TFL_Error* error = nullptr;
  {
    const AllocTimer timer;
    const InFlightScope in_flight(d.plugin_label.c_str(), "allocate");
    error = d.api->allocate(device, nbytes, &ptr);
  }
  if (error != nullptr && d.empty_cache != nullptr && d.api->error_code(error) == TFL_ERROR_OUT_OF_MEMORY) {
    // As CUDA's caching allocator does: give cached memory back and retry
    // once before reporting out-of-memory.
    d.api->error_destroy(error);
    TFL_CHECK_STATUS(d.ref(), "empty_cache", d.empty_cache(device));
    const AllocTimer timer;
    const InFlightScope in_flight(d.plugin_label.c_str(), "allocate");
    error = d.api->allocate(device, nbytes, &ptr);
  }
  if (error != nullptr && d.memory_stats == nullptr && d.api->error_code(error) == TFL_ERROR_OUT_OF_MEMORY) {
    OwnStats& s = own_stats(device);
    std::lock_guard<std::mutex> lock(s.mutex);
    ++s.num_ooms;
  }
  TFL_CHECK_STATUS(d.ref(), "allocate", error, ". ", d.device_name, ":", static_cast<int>(device),
                   " could not allocate ", format_bytes(nbytes), " (", format_bytes(bytes_in_use(d, device)),
                   " in use by tensors on this device). Free tensors you no longer need "
                   "(`del t`), call torch.accelerator.empty_cache(), reduce the batch "
                   "size, or give the device more memory if the plugin allows it.");
  TORCH_CHECK(ptr != nullptr, "plugin ", d.plugin_label, ": allocate returned NULL without an error");
  const c10::Device where(c10::DeviceType::PrivateUse1, device);
  if (d.memory_stats != nullptr && device >= 0 && device < kMaxDevices) {
    return c10::DataPtr(ptr, ptr, kDeleters[static_cast<size_t>(device)], where);
  }
  auto* ctx = new Allocation{ptr, nbytes, device};
  if (d.memory_stats == nullptr) {
    OwnStats& s = own_stats(device);
    std::lock_guard<std::mutex> lock(s.mutex);
    s.allocation.increase(1);
    s.allocated_bytes.increase(static_cast<int64_t>(nbytes));
  }
  return c10::DataPtr(ptr, ctx, &free_allocation, where);
}

}  // namespace

}  // namespace torchfl

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, torchfl::device_allocator())

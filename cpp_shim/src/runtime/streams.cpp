#include "runtime/streams.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>

#include "runtime/fork.h"
#include "runtime/runtime.h"

namespace torchfl {
namespace {

constexpr int kIdsPerDevice = 1 + 2 * kStreamPoolSize;

struct DeviceStreams {
  std::array<std::atomic<TFL_Stream*>, kIdsPerDevice> streams{};
  // Work queued since the host last waited for the stream (streams.h).
  std::array<std::atomic<bool>, kIdsPerDevice> pending{};
  std::atomic<uint32_t> next_normal{0};
  std::atomic<uint32_t> next_high{0};
};

// Zero-initialized static storage: no allocation, valid before attach.
DeviceStreams g_streams[kMaxDevices];
std::mutex g_create_mutex;
std::atomic<uint64_t> g_host_kernel_waits{0};
std::atomic<uint64_t> g_copy_waits{0};

void set_pending(c10::DeviceIndex device, size_t id) noexcept {
  std::atomic<bool>& flag = g_streams[device].pending[id];
  // Read first: in eager code the flag is nearly always set already, and a
  // load keeps the cache line shared between threads.
  if (!flag.load(std::memory_order_relaxed)) flag.store(true, std::memory_order_relaxed);
}

struct ThreadState {
  c10::DeviceIndex device = 0;
  // Current stream id per device; 0 = default stream.
  std::array<uint8_t, kMaxDevices> stream_ids{};
};
thread_local ThreadState t_state;

void check_stream_device(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid ", device_type_name(), " device index ",
              static_cast<int>(device));
}

// The plugin stream of id `id` on `device`, or nullptr if never created.
TFL_Stream* lookup(c10::DeviceIndex device, c10::StreamId id) {
  if (id == 0) {
    return runtime().default_streams.at(static_cast<size_t>(device));
  }
  if (id < 0 || id >= kIdsPerDevice) return nullptr;
  return g_streams[device].streams[id].load(std::memory_order_acquire);
}

}  // namespace

c10::DeviceIndex current_device() noexcept {
  return t_state.device;
}

void set_current_device(c10::DeviceIndex device) noexcept {
  t_state.device = device;
}

c10::Stream current_stream(c10::DeviceIndex device) {
  check_stream_device(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device),
                     t_state.stream_ids[device]);
}

TFL_Stream* current_plugin_stream(c10::DeviceIndex device) {
  const uint8_t id = t_state.stream_ids[device];
  set_pending(device, id);
  if (C10_LIKELY(id == 0)) {
    return runtime().default_streams[static_cast<size_t>(device)];
  }
  return g_streams[device].streams[id].load(std::memory_order_acquire);
}

c10::Stream exchange_stream(c10::Stream stream) {
  const c10::DeviceIndex device = stream.device_index();
  check_stream_device(device);
  // Validate before making it current, so a bogus id never becomes current.
  (void)plugin_stream(stream);
  const c10::Stream previous = current_stream(device);
  t_state.stream_ids[device] = static_cast<uint8_t>(stream.id());
  return previous;
}

c10::Stream default_stream(c10::DeviceIndex device) {
  check_stream_device(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), 0);
}

c10::Stream pool_stream(c10::DeviceIndex device, bool high_priority) {
  // Even when the pool's stream exists already: a new stream is device use.
  check_not_forked("create a stream");
  check_device_index(device);
  DeviceStreams& table = g_streams[device];
  const uint32_t n = (high_priority ? table.next_high : table.next_normal).fetch_add(1, std::memory_order_relaxed);
  const c10::StreamId id = 1 + static_cast<c10::StreamId>(n % kStreamPoolSize) + (high_priority ? kStreamPoolSize : 0);
  if (table.streams[id].load(std::memory_order_acquire) == nullptr) {
    std::lock_guard<std::mutex> lock(g_create_mutex);
    if (table.streams[id].load(std::memory_order_relaxed) == nullptr) {
      const AttachedDevice& d = runtime();
      TFL_Stream* created = nullptr;
      // Negative priority is "higher" in the ABI, as in CUDA.
      TFL_CHECK_STATUS(d.ref(), "stream_create", d.api->stream_create(device, high_priority ? -1 : 0, &created));
      TORCH_CHECK(created != nullptr, "plugin ", d.plugin_label, ": stream_create returned NULL");
      table.streams[id].store(created, std::memory_order_release);
    }
  }
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

TFL_Stream* plugin_stream(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1, "expected a ", device_type_name(),
              " stream, got one of ", stream.device());
  const c10::DeviceIndex device = stream.device_index();
  check_device_index(device);
  TFL_Stream* s = lookup(device, stream.id());
  TORCH_CHECK(s != nullptr, "unknown ", device_type_name(), " stream id ", stream.id(), " on device ",
              static_cast<int>(device), ": streams must come from torch.Stream or the device's pools");
  return s;
}

void mark_pending(const c10::Stream& stream) noexcept {
  const c10::DeviceIndex device = stream.device_index();
  const c10::StreamId id = stream.id();
  if (device < 0 || device >= kMaxDevices || id < 0 || id >= kIdsPerDevice) return;
  set_pending(device, static_cast<size_t>(id));
}

bool wait_current_stream_if_pending(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_stream_device(device);
  const uint8_t id = t_state.stream_ids[device];
  // Cleared before the synchronize: work queued meanwhile (by another
  // thread) sets it again, so it is never lost, at worst waited for twice.
  if (!g_streams[device].pending[id].exchange(false, std::memory_order_acq_rel)) return false;
  g_host_kernel_waits.fetch_add(1, std::memory_order_relaxed);
  TFL_Stream* stream = id == 0
                           ? runtime("synchronize before a host kernel").default_streams.at(static_cast<size_t>(device))
                           : g_streams[device].streams[id].load(std::memory_order_acquire);
  try {
    stream_synchronize(stream);
  } catch (...) {
    // The work did not finish: the next host kernel must not skip the wait.
    set_pending(device, id);
    throw;
  }
  return true;
}

SyncCounts sync_counts() noexcept {
  return {g_host_kernel_waits.load(std::memory_order_relaxed), g_copy_waits.load(std::memory_order_relaxed)};
}

void reset_sync_counts() noexcept {
  g_host_kernel_waits.store(0, std::memory_order_relaxed);
  g_copy_waits.store(0, std::memory_order_relaxed);
}

void note_copy_wait() noexcept {
  g_copy_waits.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace torchfl

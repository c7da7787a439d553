// The current device and stream of each thread, and the table that maps
// c10 stream ids to plugin streams.
//
// c10::Stream is a value (device, 64-bit id) that PyTorch copies around, so
// the shim cannot hand it a TFL_Stream* directly; it hands out small ids
// instead and keeps, per device, a fixed table of plugin streams:
//   id 0                      the device's default stream (the plugin's);
//   id 1 .. kPoolSize         a pool of normal-priority streams;
//   id kPoolSize+1 .. 2*kPoolSize   a pool of high-priority streams.
// Pool streams are created on first use and handed out round-robin, as CUDA
// does: c10 has no "destroy stream" hook, so a pool bounds how many plugin
// streams a program that keeps creating torch.Stream objects can consume.
// Lookups are lock-free (one atomic load); creation takes a mutex.
//
// The current device and the current stream per device are thread-local and
// start as device 0 and the default stream on every thread, including the
// autograd engine's worker threads.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "torch_fl/plugin.h"

namespace torchfl {

inline constexpr int kStreamPoolSize = 32;

c10::DeviceIndex current_device() noexcept;
// Stores the thread's current device without validating it (callers that
// face users validate first).
void set_current_device(c10::DeviceIndex device) noexcept;

// The thread's current stream of `device`.
c10::Stream current_stream(c10::DeviceIndex device);
// Its plugin handle (never NULL once a device is attached).
TFL_Stream* current_plugin_stream(c10::DeviceIndex device);
// Makes `stream` current on its device for this thread; returns the
// previous current stream of that device.
c10::Stream exchange_stream(c10::Stream stream);

c10::Stream default_stream(c10::DeviceIndex device);
// A pool stream (created on first use).
c10::Stream pool_stream(c10::DeviceIndex device, bool high_priority);

// The plugin stream behind `stream`; raises for ids the shim never handed
// out.
TFL_Stream* plugin_stream(const c10::Stream& stream);

// --- pending work, for host code that runs in stream order --------------
//
// Inductor's generated host kernels run over device memory on the host
// (compiler.py), in the order of the current stream, as a CUDA kernel would
// run on it. They must wait for the work queued on that stream, but only
// when there is some: each (device, stream) has a "pending" flag, set
// whenever the shim hands out the stream to enqueue on (current_plugin_stream,
// which every kernel launch and copy goes through, and mark_pending for
// work queued another way: a stream waiting on an event), and cleared by
// wait_current_stream_if_pending before it synchronizes. Setting is a
// relaxed load (plus a store only when the flag was clear), so the hot path
// pays no atomic read-modify-write. Over-approximating is safe: a flag set
// without work costs one extra synchronize.

// Marks `stream` as having work the host has not waited for.
void mark_pending(const c10::Stream& stream) noexcept;

// Synchronizes the thread's current stream of `device` (-1: the current
// device) if work was queued on it since the last such wait; returns
// whether it waited. Raises what the plugin's stream_synchronize raises.
bool wait_current_stream_if_pending(c10::DeviceIndex device);

// Host synchronizations made for host kernels (the waits above) and by
// copies (copy.cpp), for tests that check who blocks the host.
struct SyncCounts {
  uint64_t host_kernel_waits;
  uint64_t copy_waits;
};
SyncCounts sync_counts() noexcept;
void reset_sync_counts() noexcept;
// Counts one host wait made by a copy.
void note_copy_wait() noexcept;

// RAII: makes `device` the thread's current device for a scope. Cheaper
// than c10::DeviceGuard on the hot path (no registry lookup, no virtual
// calls) and does not validate: the device comes from a tensor.
class CurrentDeviceScope {
 public:
  explicit CurrentDeviceScope(c10::DeviceIndex device) noexcept : previous_(current_device()) {
    if (device != previous_) set_current_device(device);
  }
  ~CurrentDeviceScope() { set_current_device(previous_); }
  CurrentDeviceScope(const CurrentDeviceScope&) = delete;
  CurrentDeviceScope& operator=(const CurrentDeviceScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};

}  // namespace torchfl

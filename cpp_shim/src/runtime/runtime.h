// The attached device: the plugin that provides the PrivateUse1 runtime.
//
// Attached once per process (TFL_ShimInterface.attach_device) and immutable from then
// on, so readers need no lock: the state is published through one atomic
// pointer. Everything here calls the plugin the way the ABI requires: input
// structs carry the struct_size of the negotiated version, output structs
// are zeroed so fields an older plugin does not write read as defaults, and
// OPTIONAL entries the plugin lacks (or that lie beyond its table's
// struct_size) are resolved to nullptr once, at attach, meaning
// "unimplemented".
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/status.h"
#include "torch_fl/plugin.h"
#include "torchfl_shim.h"

namespace torchfl {

// Most devices the shim serves (sizes thread-local stream tables).
inline constexpr int kMaxDevices = 64;

// What the device guard reports as its device count before a plugin is
// attached. The autograd engine sizes its per-device queues once, at the
// first backward pass in the process, from every guard's deviceCount()
// (pitfall P1); reporting this upper bound until attach keeps a backward
// run before attach from leaving the device without a queue. Plugins with
// more devices still work when attached before the first backward.
inline constexpr c10::DeviceIndex kProvisionalDeviceCount = 16;

struct AttachedDevice {
  std::string device_name;   // "sim"
  std::string plugin_label;  // "'sim' (/path/libtorchfl_sim.so)"
  const TFL_PluginApi* api = nullptr;
  uint32_t abi_minor = 0;
  int32_t device_count = 0;
  uint64_t capabilities = 0;
  std::vector<TFL_Stream*> default_streams;  // one per device
  // The Rust core's rules (TFL_ShimDevice): the kernel-symbol mangling and
  // the ABI kind of a schema type. Never nullptr.
  decltype(TFL_ShimDevice::kernel_symbol) kernel_symbol = nullptr;
  decltype(TFL_ShimDevice::argument_kind) argument_kind = nullptr;

  // OPTIONAL entries; nullptr when the plugin does not implement them.
  decltype(TFL_PluginApi::event_elapsed_time) event_elapsed_time = nullptr;
  decltype(TFL_PluginApi::memory_stats) memory_stats = nullptr;
  decltype(TFL_PluginApi::reset_peak_memory_stats) reset_peak_memory_stats = nullptr;
  decltype(TFL_PluginApi::empty_cache) empty_cache = nullptr;
  // ABI 1.4: page-locked host memory; both or neither.
  decltype(TFL_PluginApi::host_allocate) host_allocate = nullptr;
  decltype(TFL_PluginApi::host_deallocate) host_deallocate = nullptr;
  // ABI 1.7: the plugin's graphs table (all entries set) when has_graphs.
  TFL_Graphs graphs{};
  bool has_graphs = false;
  // ABI 1.8: the plugin's activity table when has_activity (the four
  // activity entries set; the range entries all set or all NULL).
  TFL_Activity activity{};
  bool has_activity = false;

  PluginRef ref() const { return {api, plugin_label.c_str()}; }
  bool host_addressable() const { return (capabilities & TFL_CAP_HOST_ADDRESSABLE_MEMORY) != 0; }
  bool async_streams() const { return (capabilities & TFL_CAP_ASYNC_STREAMS) != 0; }
  bool event_timing() const { return (capabilities & TFL_CAP_EVENT_TIMING) != 0; }
  // ABI 1.4; an older plugin does not know the bit.
  bool caching_allocator() const { return abi_minor >= 4 && (capabilities & TFL_CAP_CACHING_ALLOCATOR) != 0; }
};

// The attached device, or nullptr before attach. Never blocks.
const AttachedDevice* attached_device() noexcept;

// The attached device, to call the plugin through; raises a RuntimeError
// saying what to do before attach, and in a bad fork (fork.h; `what` names
// the refused operation there, or is nullptr).
const AttachedDevice& runtime(const char* what = nullptr);

// Validates `desc` and makes it the process's device runtime. Attaching the
// same plugin table again is a no-op; another one raises. Throws c10::Error.
void attach_device(const TFL_ShimDevice& desc);

// The name PrivateUse1 was renamed to, for messages ("sim"; "privateuseone"
// before attach).
const char* device_type_name() noexcept;

// Raises unless 0 <= index < device_count. Validation only: it works in a
// bad fork, where selecting a device never reaches the plugin.
void check_device_index(c10::DeviceIndex index);

// --- plugin calls that raise on error -----------------------------------

void device_synchronize(c10::DeviceIndex device);
void stream_synchronize(TFL_Stream* stream);

// Host-to-device / device-to-host / device-to-device copies through the
// plugin's `copy`. `stream` NULL means synchronous (see TFL_CopyArgs).
void copy_h2d(c10::DeviceIndex dst_device, void* dst, const void* src, size_t nbytes, TFL_Stream* stream);
void copy_d2h(c10::DeviceIndex src_device, void* dst, const void* src, size_t nbytes, TFL_Stream* stream);
void copy_d2d(c10::DeviceIndex dst_device, void* dst, c10::DeviceIndex src_device, const void* src, size_t nbytes,
              TFL_Stream* stream);

// device_properties with a zeroed struct of the negotiated size.
TFL_DeviceProperties device_properties(c10::DeviceIndex device);

}  // namespace torchfl

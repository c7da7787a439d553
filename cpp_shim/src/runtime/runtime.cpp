#include "runtime/runtime.h"

#include "observe/trace.h"
#include "runtime/capture.h"
#include "runtime/fork.h"
#include "runtime/shim_error.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>

namespace torchfl {
namespace {

// Published once by attach_device and never freed: kernels, allocations and
// streams may refer to it until the process exits (plugins are never
// unloaded).
std::atomic<const AttachedDevice*> g_device{nullptr};
std::mutex g_attach_mutex;

// Struct sizes the shim writes. Every struct here is at its ABI 1.0 layout,
// which is what any 1.x plugin understands; when a later minor appends
// fields, this is where the size must follow the negotiated minor.
constexpr size_t kCopyArgsSize = TFL_STRUCT_SIZE(TFL_CopyArgs, stream);
constexpr size_t kDevicePropertiesSize = TFL_STRUCT_SIZE(TFL_DeviceProperties, memory_alignment);

}  // namespace

const AttachedDevice* attached_device() noexcept {
  return g_device.load(std::memory_order_acquire);
}

namespace {
const AttachedDevice& attached_or_raise() {
  const AttachedDevice* d = attached_device();
  TORCH_CHECK(d != nullptr,
              "torch-fl: no accelerator plugin is attached to the "
              "PrivateUse1 device yet. `import torch_fl` (or load a plugin) "
              "before using the device.");
  return *d;
}
}  // namespace

const AttachedDevice& runtime(const char* what) {
  check_not_forked(what);
  return attached_or_raise();
}

const char* device_type_name() noexcept {
  const AttachedDevice* d = attached_device();
  return d != nullptr ? d->device_name.c_str() : "privateuseone";
}

void check_device_index(c10::DeviceIndex index) {
  const AttachedDevice& d = attached_or_raise();
  TORCH_CHECK(index >= 0 && index < d.device_count, "Invalid device index ", static_cast<int>(index),
              " for device type '", d.device_name, "': the plugin ", d.plugin_label, " has ", d.device_count,
              " device(s)");
}

namespace {
// Validation of TFL_ShimInterface.attach_device's arguments: TFL_SHIM_ERROR_INVALID.
template <typename... Args>
void require(bool ok, const Args&... message) {
  if (!ok) throw ShimError(TFL_SHIM_ERROR_INVALID, c10::str(message...));
}
}  // namespace

void attach_device(const TFL_ShimDevice& desc) {
  require(desc.struct_size >= TFL_STRUCT_SIZE(TFL_ShimDevice, capabilities),
          "TFL_ShimInterface.attach_device: TFL_ShimDevice.struct_size ", desc.struct_size, " is too small");
  require(desc.api != nullptr && desc.device_name != nullptr && desc.plugin_label != nullptr,
          "TFL_ShimInterface.attach_device: api, device_name and plugin_label are "
          "required");
  require(desc.struct_size >= TFL_STRUCT_SIZE(TFL_ShimDevice, argument_kind) && desc.kernel_symbol != nullptr &&
              desc.argument_kind != nullptr,
          "TFL_ShimInterface.attach_device: kernel_symbol and argument_kind are required");
  if (desc.struct_size >= TFL_STRUCT_SIZE(TFL_ShimDevice, inflight_slot) && desc.inflight_slot != nullptr) {
    detail::g_inflight_slot = reinterpret_cast<InFlightSlotFn>(desc.inflight_slot);
  }
  const TFL_PluginApi* api = desc.api;
  require(api->abi_major == TFL_ABI_VERSION_MAJOR, "TFL_ShimInterface.attach_device: plugin ", desc.plugin_label,
          " speaks ABI major ", api->abi_major, ", the shim speaks ", TFL_ABI_VERSION_MAJOR);
  require(desc.abi_minor <= TFL_ABI_VERSION_MINOR && desc.abi_minor <= api->abi_minor,
          "TFL_ShimInterface.attach_device: negotiated minor ", desc.abi_minor, " is newer than the plugin's (",
          api->abi_minor, ") or the shim's (", TFL_ABI_VERSION_MINOR, ")");
  // The Rust core validated the table; check again what the shim would
  // otherwise crash on, so a bad caller gets an error instead.
  require(TFL_HAS_FIELD(TFL_PluginApi, event_synchronize, api->struct_size),
          "TFL_ShimInterface.attach_device: plugin table of ", api->struct_size,
          " bytes lacks required ABI 1.0 entries");
  require(api->error_code && api->error_message && api->error_destroy && api->device_synchronize && api->allocate &&
              api->deallocate && api->copy && api->default_stream && api->stream_create && api->stream_synchronize &&
              api->stream_query && api->stream_wait_event && api->event_create && api->event_destroy &&
              api->event_record && api->event_query && api->event_synchronize && api->device_properties,
          "TFL_ShimInterface.attach_device: plugin ", desc.plugin_label, " has a NULL required entry");
  require(desc.device_count >= 0 && desc.device_count <= kMaxDevices,
          "TFL_ShimInterface.attach_device: ", desc.device_count, " devices; the shim supports 0 to ", kMaxDevices);

  check_not_forked("attach a plugin");
  std::lock_guard<std::mutex> lock(g_attach_mutex);
  if (const AttachedDevice* current = attached_device()) {
    if (current->api != api) {
      throw ShimError(TFL_SHIM_ERROR_STATE, c10::str("TFL_ShimInterface.attach_device: the PrivateUse1 "
                                                     "device is already provided by plugin ",
                                                     current->plugin_label, "; a process has one device plugin"));
    }
    return;  // the same plugin again: nothing to do
  }

  auto d = std::make_unique<AttachedDevice>();
  d->device_name = desc.device_name;
  d->plugin_label = desc.plugin_label;
  d->api = api;
  d->abi_minor = desc.abi_minor;
  d->device_count = desc.device_count;
  d->capabilities = desc.capabilities;
  d->kernel_symbol = desc.kernel_symbol;
  d->argument_kind = desc.argument_kind;
  // ABI 1.7 native graphs: the core validated every entry of the table.
  if (desc.abi_minor >= 7 && desc.struct_size >= TFL_STRUCT_SIZE(TFL_ShimDevice, graphs) && desc.graphs != nullptr) {
    d->graphs = *desc.graphs;
    d->has_graphs = true;
  }
  // ABI 1.8 activity records: likewise validated by the core.
  if (desc.abi_minor >= 8 && desc.struct_size >= TFL_STRUCT_SIZE(TFL_ShimDevice, activity) &&
      desc.activity != nullptr) {
    d->activity = *desc.activity;
    d->has_activity = true;
  }
  // OPTIONAL entries: present only when the table's struct_size covers them
  // and they are non-NULL. All four are ABI 1.0, so the negotiated minor
  // never hides them.
  if (TFL_HAS_FIELD(TFL_PluginApi, event_elapsed_time, api->struct_size))
    d->event_elapsed_time = api->event_elapsed_time;
  if (TFL_HAS_FIELD(TFL_PluginApi, memory_stats, api->struct_size)) d->memory_stats = api->memory_stats;
  if (TFL_HAS_FIELD(TFL_PluginApi, reset_peak_memory_stats, api->struct_size))
    d->reset_peak_memory_stats = api->reset_peak_memory_stats;
  if (TFL_HAS_FIELD(TFL_PluginApi, empty_cache, api->struct_size)) d->empty_cache = api->empty_cache;
  // ABI 1.4 entries are read only when both sides speak 1.4: a newer plugin
  // meeting a 1.3 negotiation keeps today's ordinary host memory. The pair
  // is used together, so one without the other counts as neither.
  if (desc.abi_minor >= 4 && TFL_HAS_FIELD(TFL_PluginApi, host_deallocate, api->struct_size) &&
      api->host_allocate != nullptr && api->host_deallocate != nullptr) {
    d->host_allocate = api->host_allocate;
    d->host_deallocate = api->host_deallocate;
  }

  // The plugin is called from here on: a child forked now must not use it.
  note_device_attaching();
  const PluginRef ref{api, d->plugin_label.c_str()};
  d->default_streams.resize(static_cast<size_t>(desc.device_count));
  for (int32_t i = 0; i < desc.device_count; ++i) {
    TFL_CHECK_STATUS(ref, "default_stream", api->default_stream(i, &d->default_streams[i]));
    TORCH_CHECK(d->default_streams[i] != nullptr, "plugin ", d->plugin_label, ": default_stream(", i,
                ") returned NULL");
  }
  g_device.store(d.release(), std::memory_order_release);
}

void device_synchronize(c10::DeviceIndex device) {
  const AttachedDevice& d = runtime("synchronize");
  capture::check_sync("synchronization", nullptr);
  TFL_CHECK_STATUS(d.ref(), "device_synchronize", d.api->device_synchronize(device));
  // A synchronization is where the device trace collects the plugin's
  // activity records (activity.h), which keeps the plugin's staging small.
  if (tracing()) activity::drain();
}

void stream_synchronize(TFL_Stream* stream) {
  const AttachedDevice& d = runtime("stream synchronize");
  capture::check_sync("synchronization", stream);
  TFL_CHECK_STATUS(d.ref(), "stream_synchronize", d.api->stream_synchronize(stream));
  if (tracing()) activity::drain();
}

namespace {
void do_copy(int32_t kind, int32_t dst_device, void* dst, int32_t src_device, const void* src, size_t nbytes,
             TFL_Stream* stream, const char* what) {
  check_not_forked(what);  // even for 0 bytes: the copy is device use
  if (nbytes == 0) return;
  const AttachedDevice& d = runtime();
  if (capture::any() && capture::record_copy(kind, static_cast<c10::DeviceIndex>(dst_device), dst,
                                             static_cast<c10::DeviceIndex>(src_device), src, nbytes, stream)) {
    return;
  }
  // A device-to-device copy runs on the source device's stream.
  const int32_t stream_device = kind == TFL_COPY_HOST_TO_DEVICE ? dst_device : src_device;
  TraceScope trace(TraceKind::Copy, what, d.plugin_label.c_str(), static_cast<c10::DeviceIndex>(stream_device), stream);
  trace.set_bytes(nbytes);
  TFL_CopyArgs args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = kCopyArgsSize;
  args.kind = kind;
  args.dst_device = dst_device;
  args.src_device = src_device;
  args.dst = dst;
  args.src = src;
  args.nbytes = nbytes;
  args.stream = stream;
  TFL_CHECK_STATUS(d.ref(), what, d.api->copy(&args), " (", nbytes, " bytes)");
}
}  // namespace

void copy_h2d(c10::DeviceIndex dst_device, void* dst, const void* src, size_t nbytes, TFL_Stream* stream) {
  do_copy(TFL_COPY_HOST_TO_DEVICE, dst_device, dst, -1, src, nbytes, stream, "copy (host to device)");
}

void copy_d2h(c10::DeviceIndex src_device, void* dst, const void* src, size_t nbytes, TFL_Stream* stream) {
  do_copy(TFL_COPY_DEVICE_TO_HOST, -1, dst, src_device, src, nbytes, stream, "copy (device to host)");
}

void copy_d2d(c10::DeviceIndex dst_device, void* dst, c10::DeviceIndex src_device, const void* src, size_t nbytes,
              TFL_Stream* stream) {
  do_copy(TFL_COPY_DEVICE_TO_DEVICE, dst_device, dst, src_device, src, nbytes, stream, "copy (device to device)");
}

TFL_DeviceProperties device_properties(c10::DeviceIndex device) {
  const AttachedDevice& d = runtime("device properties");
  TFL_DeviceProperties props;
  std::memset(&props, 0, sizeof(props));
  props.struct_size = kDevicePropertiesSize;
  TFL_CHECK_STATUS(d.ref(), "device_properties", d.api->device_properties(device, &props));
  return props;
}

}  // namespace torchfl

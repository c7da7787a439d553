// c10::impl::DeviceGuardImplInterface for PrivateUse1: devices, streams and
// events as PyTorch's generic code (DeviceGuard, torch.Stream, torch.Event,
// torch.accelerator, the autograd engine) sees them, mapped onto the plugin.
#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "runtime/capture.h"
#include "runtime/fork.h"
#include "runtime/runtime.h"
#include "runtime/status.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

TFL_Event* as_event(void* event) {
  return static_cast<TFL_Event*>(event);
}

// A device without an index ("sim") means the current device.
c10::DeviceIndex index_of(c10::Device d) {
  return d.has_index() ? d.index() : current_device();
}

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = c10::DeviceType::PrivateUse1;

  GuardImpl() = default;
  explicit GuardImpl(c10::DeviceType t) { TORCH_INTERNAL_ASSERT(t == static_type); }

  c10::DeviceType type() const override { return static_type; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device previous = getDevice();
    if (d.index() != previous.index()) setDevice(d);
    return previous;
  }

  c10::Device getDevice() const override { return c10::Device(static_type, current_device()); }

  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == static_type);
    // Before attach there is nothing to validate against: the autograd
    // engine sets each worker thread's device from the provisional count
    // (see kProvisionalDeviceCount). After attach, reject bad indices here
    // rather than at the next allocation.
    if (attached_device() != nullptr) check_device_index(d.index());
    set_current_device(d.index());
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override { set_current_device(d.index()); }

  c10::Stream getStream(c10::Device d) const override { return current_stream(index_of(d)); }

  c10::Stream getDefaultStream(c10::Device d) const override { return default_stream(index_of(d)); }

  c10::Stream getStreamFromGlobalPool(c10::Device d, bool isHighPriority = false) const override {
    return pool_stream(index_of(d), isHighPriority);
  }

  // torch.Stream(device=...) lands here. Streams come from the pool for the
  // reason given in streams.h.
  c10::Stream getNewStream(c10::Device d, int priority = 0) const override {
    return pool_stream(index_of(d), priority < 0);
  }

  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_stream(s); }

  void* getStreamNativeHandle(const c10::Stream s) const override {
    void* handle = plugin_stream(s);
    // Whoever asks for the handle may queue work on it behind the shim's
    // back: host kernels must wait for the stream (streams.h).
    mark_pending(s);
    return handle;
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    const AttachedDevice* d = attached_device();
    return d != nullptr ? static_cast<c10::DeviceIndex>(d->device_count) : kProvisionalDeviceCount;
  }

  // --- events: the void* is the plugin's TFL_Event*, created lazily ------

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    const AttachedDevice& d = runtime("event record");
    TFL_Stream* s = plugin_stream(stream);
    if (*event == nullptr) {
      // torch.Event(enable_timing=True) asks for BACKEND_DEFAULT.
      const uint32_t flags =
          (flag == c10::EventFlag::BACKEND_DEFAULT && d.event_timing()) ? TFL_EVENT_TIMING : TFL_EVENT_DEFAULT;
      TFL_Event* created = nullptr;
      TFL_CHECK_STATUS(d.ref(), "event_create", d.api->event_create(stream.device_index(), flags, &created));
      *event = created;
    }
    // On a captured stream the event marks a point of the capture instead.
    if (capture::record_event(*event, s)) return;
    TFL_CHECK_STATUS(d.ref(), "event_record", d.api->event_record(as_event(*event), s));
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;  // never recorded: nothing to wait for
    const AttachedDevice& d = runtime("stream wait event");
    // An event of a capture: the stream joins that capture.
    if (capture::wait_event(event, stream.device_index(), plugin_stream(stream))) return;
    TFL_CHECK_STATUS(d.ref(), "stream_wait_event", d.api->stream_wait_event(plugin_stream(stream), as_event(event)));
    // The stream now has work to wait for (the event's): host kernels that
    // run in its order must wait too (streams.h).
    mark_pending(stream);
  }

  bool queryEvent(void* event) const override {
    check_not_forked("event query");  // even for an event never recorded
    if (event == nullptr) return true;
    capture::check_event(event, "query");
    const AttachedDevice& d = runtime();
    uint8_t complete = 0;
    TFL_CHECK_STATUS(d.ref(), "event_query", d.api->event_query(as_event(event), &complete));
    return complete != 0;
  }

  void synchronizeEvent(void* event) const override {
    check_not_forked("event synchronize");
    if (event == nullptr) return;
    capture::check_event(event, "synchronization");
    const AttachedDevice& d = runtime();
    TFL_CHECK_STATUS(d.ref(), "event_synchronize", d.api->event_synchronize(as_event(event)));
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    // In a bad fork the event is leaked: the child must not call the plugin.
    if (event == nullptr || in_bad_fork()) return;
    capture::forget_event(event);
    const AttachedDevice* d = attached_device();
    if (d == nullptr) return;
    // noexcept: a failure to destroy can only be dropped.
    if (TFL_Error* e = d->api->event_destroy(as_event(event))) {
      d->api->error_destroy(e);
    }
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    const AttachedDevice& d = runtime("event elapsed time");
    TORCH_CHECK_NOT_IMPLEMENTED(d.event_elapsed_time != nullptr, "plugin ", d.plugin_label,
                                " does not implement event_elapsed_time (optional entry)");
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before calculating elapsed "
                "time.");
    float ms = 0.0f;
    TFL_CHECK_STATUS(d.ref(), "event_elapsed_time", d.event_elapsed_time(as_event(start), as_event(end), &ms));
    return static_cast<double>(ms);
  }

  // --- streams and devices -----------------------------------------------

  // torch.accelerator.get_device_capability: the dtypes tensors can be
  // allocated in and converted between. Device memory is untyped bytes and
  // conversions run on the host (copy.cpp), so these are the dtypes the CPU
  // converts: not the quantized ones (they need a quantizer), the bit and
  // sub-byte containers (no conversions) or the experimental complex32.
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check_device_index(index_of(d));
    c10::DeviceCapability capability;
    uint64_t bits = 0;
    for (const int index :
         {c10::kIndex_Byte, c10::kIndex_Char, c10::kIndex_Short, c10::kIndex_Int, c10::kIndex_Long, c10::kIndex_Half,
          c10::kIndex_Float, c10::kIndex_Double, c10::kIndex_ComplexFloat, c10::kIndex_ComplexDouble, c10::kIndex_Bool,
          c10::kIndex_BFloat16, c10::kIndex_Float8_e5m2, c10::kIndex_Float8_e4m3fn, c10::kIndex_Float8_e5m2fnuz,
          c10::kIndex_Float8_e4m3fnuz, c10::kIndex_UInt16, c10::kIndex_UInt32, c10::kIndex_UInt64}) {
      bits |= uint64_t{1} << index;
    }
    capability.capability_data.capability_bits = bits;
    return capability;
  }

  bool queryStream(const c10::Stream& stream) const override {
    const AttachedDevice& d = runtime("stream query");
    capture::check_sync("query", plugin_stream(stream));
    uint8_t complete = 0;
    TFL_CHECK_STATUS(d.ref(), "stream_query", d.api->stream_query(plugin_stream(stream), &complete));
    return complete != 0;
  }

  void synchronizeStream(const c10::Stream& stream) const override { stream_synchronize(plugin_stream(stream)); }

#if __has_include(<ATen/core/GraphImplInterface.h>)
  // torch.Stream.is_capturing() (device graphs: graphs/graph.h). Guarded with
  // the graph registry, which came with the same PyTorch change.
  bool isStreamCapturing(const c10::Stream& stream) const override {
    return capture::any() && capture::capture_of(plugin_stream(stream)) != 0;
  }
#endif

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    const c10::DeviceIndex device = device_index == -1 ? current_device() : device_index;
    check_device_index(device);
    device_synchronize(device);
  }

  // The plugin's deallocate is stream-ordered (it waits for all work
  // submitted to any stream of the device), so there is nothing to record.
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}
};

}  // namespace
}  // namespace torchfl

C10_REGISTER_GUARD_IMPL(PrivateUse1, torchfl::GuardImpl);

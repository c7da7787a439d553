// Device times for PyTorch's profiler: torch::profiler::impl::ProfilerStubs
// for PrivateUse1, over the plugin's timing events.
//
// torch.autograd.profiler.profile(use_device=<name>) runs in
// KINETO_PRIVATEUSE1_FALLBACK mode, CUDA's "legacy" scheme: at the entry and
// at the exit of every operator it calls record() for an event on the current
// stream of the current device, and when the results are read it asks
// elapsed() for the microseconds between the two, which becomes the
// operator's device time (key_averages()' device columns, the chrome trace).
// PyTorch's default stubs throw from record(), so without these every
// operator lost its events and no device time was measured.
//
// A plugin without TFL_CAP_EVENT_TIMING, or without event_elapsed_time,
// cannot measure: record() then creates no event and PyTorch reports no
// device time for the operator (zero in the tables), never a made-up one.
//
// The ABI has no annotation entries (NVTX's role), so mark/rangePush/rangePop
// do nothing.
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <cmath>
#include <functional>
#include <memory>

#include "runtime/runtime.h"
#include "runtime/status.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

bool can_time_events(const AttachedDevice& d) {
  return d.event_timing() && d.event_elapsed_time != nullptr;
}

// The profiler keeps events in shared_ptrs and drops them whenever its
// results go away; the attached device is immortal, so the deleter can
// always reach the plugin. Destruction cannot report a failure.
void destroy_event(void* event) noexcept {
  const AttachedDevice* d = attached_device();
  if (d == nullptr || event == nullptr) return;
  if (TFL_Error* e = d->api->event_destroy(static_cast<TFL_Event*>(event))) {
    d->api->error_destroy(e);
  }
}

// Records a timing event on the current stream of `device`; the CPU time is
// read between creation and record, as CUDA's stub does, so that it brackets
// the device timestamp as tightly as the host can.
ProfilerVoidEventStub record_timing_event(const AttachedDevice& d, c10::DeviceIndex device, int64_t* cpu_ns) {
  TFL_Event* raw = nullptr;
  TFL_CHECK_STATUS(d.ref(), "event_create", d.api->event_create(device, TFL_EVENT_TIMING, &raw));
  TORCH_CHECK(raw != nullptr, "plugin ", d.plugin_label, ": event_create returned NULL");
  ProfilerVoidEventStub event(raw, &destroy_event);
  if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
  TFL_CHECK_STATUS(d.ref(), "event_record", d.api->event_record(raw, current_plugin_stream(device)));
  return event;
}

struct PluginProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = current_device();
    if (device != nullptr) *device = index;
    event->reset();
    const AttachedDevice* d = attached_device();
    if (d != nullptr && can_time_events(*d) && index < d->device_count) {
      // PyTorch calls this from operator callbacks that do not expect it
      // to throw; a failure costs the operator its device time, not the
      // program.
      try {
        *event = record_timing_event(*d, index, cpu_ns);
        return;
      } catch (const c10::Error& e) {
        TORCH_WARN_ONCE("torch-fl: the profiler cannot record ", d->device_name,
                        " events, so device times are missing: ", e.what_without_backtrace());
      }
    }
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
  }

  // Microseconds from `start` to `end`. PyTorch drops values <= 0, so an
  // unmeasurable pair reports 0: no events (a plugin without timing), a
  // failing plugin call (warned once), or a negative or non-finite result
  // (possible only when the current stream changed between the two records,
  // so the events lie on different streams).
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    if (start == nullptr || end == nullptr || !*start || !*end) return 0.0f;
    const AttachedDevice& d = runtime();
    auto* a = static_cast<TFL_Event*>(start->get());
    auto* b = static_cast<TFL_Event*>(end->get());
    float ms = 0.0f;
    try {
      TFL_CHECK_STATUS(d.ref(), "event_synchronize", d.api->event_synchronize(a));
      TFL_CHECK_STATUS(d.ref(), "event_synchronize", d.api->event_synchronize(b));
      TFL_CHECK_STATUS(d.ref(), "event_elapsed_time", d.event_elapsed_time(a, b, &ms));
    } catch (const c10::Error& e) {
      TORCH_WARN_ONCE("torch-fl: the profiler cannot measure ", d.device_name,
                      " device times: ", e.what_without_backtrace());
      return 0.0f;
    }
    return std::isfinite(ms) && ms > 0.0f ? ms * 1000.0f : 0.0f;
  }

  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override { return attached_device() != nullptr; }

  void onEachDevice(std::function<void(int)> op) const override {
    const AttachedDevice* d = attached_device();
    if (d == nullptr) return;
    CurrentDeviceScope restore(current_device());
    for (int32_t i = 0; i < d->device_count; ++i) {
      set_current_device(static_cast<c10::DeviceIndex>(i));
      op(i);
    }
  }

  void synchronize() const override {
    const AttachedDevice* d = attached_device();
    if (d == nullptr) return;
    for (int32_t i = 0; i < d->device_count; ++i) device_synchronize(static_cast<c10::DeviceIndex>(i));
  }
};

// Registered when the shim is loaded, like the device guard: PyTorch keeps
// the pointer, so the stubs live as long as the process.
const bool g_profiler_stubs_registered [[maybe_unused]] = [] {
  static PluginProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  return true;
}();

}  // namespace
}  // namespace torchfl

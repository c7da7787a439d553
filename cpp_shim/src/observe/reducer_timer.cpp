// DDP's per-iteration timings (forward, backward compute, backward
// communication: DistributedDataParallel's logging data and
// `_get_ddp_logging_data()`) come from a c10d::Timer that the reducer looks
// up by device type; PyTorch registers one for CPU and CUDA only and warns
// "Time stats are currently only collected for CPU and CUDA devices"
// otherwise. This is the plugin device's, shaped like CUDA's: events on the
// current stream, differences read after they completed.
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <array>
#include <memory>
#include <optional>

namespace torchfl {
namespace {

class PluginTimer final : public c10d::Timer {
 public:
  explicit PluginTimer(c10::Device device)
      : device_(device),
        // BACKEND_DEFAULT asks the plugin for timing events (device_guard.cpp).
        events_{make(), make(), make(), make(), make()} {}

  void record(Event event) override {
    // The host time too: the reducer compares it with the forward start.
    Timer::record(event);
    const c10::impl::VirtualGuardImpl impl(c10::DeviceType::PrivateUse1);
    slot(event).record(impl.getStream(device_));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::Event& first = slot(start);
    c10::Event& last = slot(end);
    if (!first.was_marked_for_recording() || !last.was_marked_for_recording()) return std::nullopt;
    first.synchronize();
    last.synchronize();
    double ms = 0;
    try {
      ms = first.elapsedTime(last);
    } catch (const c10::Error&) {
      // A plugin without timing events: the host timestamps, as CPU's timer.
      const auto a = getTimestamp(start);
      const auto b = getTimestamp(end);
      if (!a || !b || *b < *a) return std::nullopt;
      return *b - *a;
    }
    // Events recorded in the other order (no communication this
    // iteration) give a negative time: not a measurement.
    if (ms < 0) return std::nullopt;
    return static_cast<int64_t>(ms * 1000.0 * 1000.0);
  }

 private:
  static c10::Event make() { return c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT); }
  c10::Event& slot(Event event) { return events_.at(static_cast<size_t>(event)); }

  c10::Device device_;
  std::array<c10::Event, 5> events_;
};

}  // namespace
}  // namespace torchfl

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, torchfl::PluginTimer)
}  // namespace c10d

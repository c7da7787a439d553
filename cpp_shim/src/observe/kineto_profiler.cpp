// torch.profiler's PrivateUse1 activity: a kineto child activity profiler
// fed by the device trace (trace.h).
//
// `torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1])`
// runs PyTorch's KINETO_PRIVATEUSE1 state, which asks kineto for the
// device activity types (kernels, memcpy, memset). Kineto hands those to
// every child profiler registered with it (libkineto::api()
// .registerProfilerFactory, the mechanism PyTorch's XPU profiler and its
// PrivateUse1ProfilerRegistry use). Ours starts a device-trace consumer for
// the session, is told the correlation id of each operator as it starts
// (pushCorrelationId, on the operator's thread), and at the end turns each
// traced kernel and copy into a kineto activity on the device's timeline:
// device times from the plugin's timing events, the stream as the row, and
// a link to the CPU operator that launched it. PyTorch then reports them as
// the operators' device time (key_averages' "Self <device>" columns) and
// puts them in export_chrome_trace's device rows.
//
// A plugin without event timing yields no device activities: the calls are
// traced but have no device time to show.
#include <c10/util/Exception.h>

#if __has_include(<kineto/libkineto.h>)
#define TORCHFL_HAS_KINETO 1
#include <kineto/libkineto.h>
#endif

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "observe/kineto_profiler.h"
#include "observe/trace.h"

namespace torchfl {

#ifdef TORCHFL_HAS_KINETO
namespace {

using libkineto::ActivityType;

const std::set<ActivityType>& device_activity_types() {
  static const std::set<ActivityType> types{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY};
  return types;
}

bool wants_device_activities(const std::set<ActivityType>& requested) {
  for (const ActivityType t : device_activity_types()) {
    if (requested.count(t) != 0) return true;
  }
  return false;
}

// The record's details as the activity's metadata (the chrome trace's
// "args"). Never through addMetadata: it formats with fmt, whose symbols
// libtorch does not export. Kineto releases before typed metadata (torch
// 2.13) get the numbers as strings.
void add_metadata(libkineto::GenericTraceActivity& activity, const TraceRecord& r) {
  activity.addMetadataQuoted("plugin", r.plugin);
#if __has_include(<kineto/TypedMetadata.h>)
  const auto number = [&](const char* key, int64_t value) {
    activity.addTypedMetadata(key, libkineto::TypedValue{value});
  };
#else
  const auto number = [&](const char* key, int64_t value) {
    activity.addMetadataQuoted(key, std::to_string(value));
  };
#endif
  number("stream", r.stream);
  number("correlation", static_cast<int64_t>(r.correlation));
  if (r.kind == TraceKind::Copy) {
    number("bytes", static_cast<int64_t>(r.bytes));
  } else {
    activity.addMetadataQuoted("inputs", r.inputs);
  }
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  explicit Session(std::set<ActivityType> types) : types_(std::move(types)) {}
  ~Session() override { end_consumer(); }

  void start() override {
    if (!started_) {
      start_ = trace_begin();
      started_ = true;
    }
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (started_ && !stopped_) {
      try {
        records_ = trace_collect(start_);
      } catch (const std::exception& e) {
        errors_.push_back(c10::str("torch-fl: collecting the device trace failed: ", e.what()));
      }
      end_consumer();
    }
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override { process(logger, nullptr); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t /*start*/,
                    int64_t /*end*/) override {
    process(logger, linked);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override { return nullptr; }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { push_trace_correlation(id); }
  void popCorrelationId() override { pop_trace_correlation(); }

 private:
  void end_consumer() noexcept {
    if (started_ && !stopped_) {
      stopped_ = true;
      trace_end();
    }
  }

  // Turns the records into activities owned by buffer_ (kineto takes the
  // buffer afterwards through getTraceBuffer, so the pointers the logger
  // keeps stay valid for as long as the trace).
  void process(libkineto::ActivityLogger& logger, const libkineto::getLinkedActivityCallback& linked) {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    int64_t first = 0;
    int64_t last = 0;
    for (const TraceRecord& r : records_) {
      if (r.device_begin_ns < 0 || r.kind == TraceKind::Fallback) continue;
      first = first == 0 ? r.device_begin_ns : std::min(first, r.device_begin_ns);
      last = std::max(last, r.device_end_ns);
    }
    buffer_->span = libkineto::TraceSpan(first, last, "torch-fl");
    for (const TraceRecord& r : records_) {
      if (r.device_begin_ns < 0 || r.kind == TraceKind::Fallback) continue;
      const ActivityType type = r.kind == TraceKind::Copy ? ActivityType::GPU_MEMCPY : ActivityType::CONCURRENT_KERNEL;
      if (types_.count(type) == 0) continue;
      auto activity = std::make_unique<libkineto::GenericTraceActivity>(buffer_->span, type, r.name);
      activity->startTime = r.device_begin_ns;
      activity->endTime = std::max(r.device_end_ns, r.device_begin_ns);
      activity->id = static_cast<int32_t>(r.correlation);
      activity->device = r.device;
      activity->resource = r.stream;
      activity->threadId = static_cast<int32_t>(r.thread);
      if (r.correlation != 0 && linked) activity->linked = linked(static_cast<int32_t>(r.correlation));
      activity->flow.id = static_cast<uint32_t>(r.correlation);
      activity->flow.type = libkineto::kLinkAsyncCpuGpu;
      activity->flow.start = false;
      add_metadata(*activity, r);
      activity->log(logger);
      buffer_->activities.push_back(std::move(activity));
    }
    records_.clear();
  }

  std::set<ActivityType> types_;
  uint64_t start_ = 0;
  bool started_ = false;
  bool stopped_ = false;
  std::vector<TraceRecord> records_;
  std::vector<std::string> errors_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class Profiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<ActivityType>& availableActivities() const override { return device_activity_types(); }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& activity_types,
                                                                 const libkineto::Config& /*config*/) override {
    // Kineto offers every session the selected types; a CPU-only profile
    // selects none of ours and must cost nothing.
    if (!wants_device_activities(activity_types)) return nullptr;
    return std::make_unique<Session>(activity_types);
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<ActivityType>& activity_types,
                                                                 const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_ = "torch_fl";
};

}  // namespace

void register_kineto_profiler() {
  static const bool registered = [] {
    libkineto::api().registerProfilerFactory(
        []() -> std::unique_ptr<libkineto::IActivityProfiler> { return std::make_unique<Profiler>(); });
    return true;
  }();
  (void)registered;
}

bool kineto_profiler_available() noexcept {
  return true;
}

#else  // PyTorch built without kineto: torch.profiler has no device activities to show.

void register_kineto_profiler() {}

bool kineto_profiler_available() noexcept {
  return false;
}

#endif

}  // namespace torchfl

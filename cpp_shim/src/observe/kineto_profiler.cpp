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
// the stream as the row, and a link to the CPU operator that launched it.
// Device times come from the plugin's own activity records when it has
// them (ABI 1.8: one activity per kernel, copy or fill it reports, named as
// the plugin names it), else from timing events around each call. PyTorch then reports them as
// the operators' device time (key_averages' "Self <device>" columns) and
// puts them in export_chrome_trace's device rows.
//
// A plugin with neither records nor event timing yields no device
// activities: the calls are traced but have no device time to show.
#include <c10/util/Exception.h>

#if __has_include(<kineto/libkineto.h>)
#define TORCHFL_HAS_KINETO 1
#include <kineto/libkineto.h>
#endif

#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "observe/kineto_profiler.h"
#include "observe/trace.h"

namespace torchfl {

#ifdef TORCHFL_HAS_KINETO
namespace {

using libkineto::ActivityType;

const std::set<ActivityType>& device_activity_types() {
  static const std::set<ActivityType> types{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                            ActivityType::GPU_MEMSET};
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
        collected_ = trace_collect(start_);
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
      trace_end(start_);
    }
  }

  // Turns the records into activities owned by buffer_ (kineto takes the
  // buffer afterwards through getTraceBuffer, so the pointers the logger
  // keeps stay valid for as long as the trace).
  void process(libkineto::ActivityLogger& logger, const libkineto::getLinkedActivityCallback& linked) {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    // The calls the plugin's device-work records belong to; those calls
    // are shown by their records, the others by their timing-event span.
    std::unordered_map<uint64_t, const TraceRecord*> by_call;
    for (const TraceRecord& r : collected_.records) {
      if (r.call != 0) by_call.emplace(r.call, &r);
    }
    std::vector<std::pair<const TraceRecord*, const NativeRecord*>> native;
    std::unordered_set<uint64_t> shown;
    for (const NativeRecord& n : collected_.native) {
      const auto call = by_call.find(n.call);
      if (!activity::is_device_work(n.kind) || call == by_call.end()) continue;
      native.emplace_back(call->second, &n);
      shown.insert(n.call);
    }
    int64_t first = 0;
    int64_t last = 0;
    for (const TraceRecord& r : collected_.records) {
      if (r.device_begin_ns < 0 || r.kind == TraceKind::Fallback) continue;
      first = first == 0 ? r.device_begin_ns : std::min(first, r.device_begin_ns);
      last = std::max(last, r.device_end_ns);
    }
    buffer_->span = libkineto::TraceSpan(first, last, "torch-fl");
    for (const auto& [r, n] : native) {
      const ActivityType type = n->kind == TFL_ACTIVITY_COPY     ? ActivityType::GPU_MEMCPY
                                : n->kind == TFL_ACTIVITY_MEMSET ? ActivityType::GPU_MEMSET
                                                                 : ActivityType::CONCURRENT_KERNEL;
      auto activity = device_activity(*r, type, n->name, n->begin_ns, n->end_ns, n->stream_index, linked);
      if (activity == nullptr) continue;
      activity->addMetadataQuoted("operator", r->name);
      activity->addMetadataQuoted("detail", n->detail);
      log_activity(logger, std::move(activity));
    }
    for (const TraceRecord& r : collected_.records) {
      if (r.device_begin_ns < 0 || r.kind == TraceKind::Fallback || shown.count(r.call) != 0) continue;
      const ActivityType type = r.kind == TraceKind::Copy ? ActivityType::GPU_MEMCPY : ActivityType::CONCURRENT_KERNEL;
      auto activity = device_activity(r, type, r.name, r.device_begin_ns, r.device_end_ns, r.stream, linked);
      if (activity != nullptr) log_activity(logger, std::move(activity));
    }
    collected_ = {};
  }

  // One device activity of call `r`, linked to its operator; nullptr when
  // the session did not ask for the type.
  std::unique_ptr<libkineto::GenericTraceActivity> device_activity(const TraceRecord& r, ActivityType type,
                                                                   const std::string& name, int64_t begin, int64_t end,
                                                                   int32_t stream,
                                                                   const libkineto::getLinkedActivityCallback& linked) {
    if (types_.count(type) == 0) return nullptr;
    auto activity = std::make_unique<libkineto::GenericTraceActivity>(buffer_->span, type, name);
    activity->startTime = begin;
    activity->endTime = std::max(end, begin);
    activity->id = static_cast<int32_t>(r.correlation);
    activity->device = r.device;
    activity->resource = stream;
    activity->threadId = static_cast<int32_t>(r.thread);
    if (r.correlation != 0 && linked) activity->linked = linked(static_cast<int32_t>(r.correlation));
    activity->flow.id = static_cast<uint32_t>(r.correlation);
    activity->flow.type = libkineto::kLinkAsyncCpuGpu;
    activity->flow.start = false;
    add_metadata(*activity, r);
    return activity;
  }

  void log_activity(libkineto::ActivityLogger& logger, std::unique_ptr<libkineto::GenericTraceActivity> activity) {
    activity->log(logger);
    buffer_->activities.push_back(std::move(activity));
  }

  std::set<ActivityType> types_;
  uint64_t start_ = 0;
  bool started_ = false;
  bool stopped_ = false;
  TraceCollection collected_;
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

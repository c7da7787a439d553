#include "observe/trace.h"

#include <c10/util/ApproximateClock.h>

#include <c10/util/StringUtil.h>

#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "runtime/fork.h"
#include "runtime/runtime.h"

namespace torchfl {
namespace detail {
std::atomic<bool> g_tracing{false};
}  // namespace detail

namespace {

// A trace of a long run is bounded: past this many records new ones are
// counted as dropped instead of growing memory without limit (a record is a
// few hundred bytes).
constexpr size_t kMaxRecords = 1'000'000;

struct Slot {
  TraceRecord record;
  TFL_Event* begin_event = nullptr;
  TFL_Event* end_event = nullptr;
  bool open = true;  // the call has not returned yet
};

struct Anchor {
  TFL_Event* event = nullptr;
  int64_t host_ns = 0;
  bool tried = false;
};

// Everything below is guarded by g_mutex. Plugin calls that may block
// (synchronizing, waiting for events) are made with the lock held only
// while collecting, which consumers do rarely.
std::mutex g_mutex;
std::deque<Slot> g_slots;
uint64_t g_base = 0;   // position of g_slots.front()
uint64_t g_epoch = 1;  // bumped when the records are dropped
// Each consumer's starting positions, by token.
struct Consumer {
  uint64_t slot_start = 0;
  uint64_t native_start = 0;
};
std::unordered_map<uint64_t, Consumer> g_consumers;
uint64_t g_next_token = 1;
// Whether the plugin records activity for this trace (activity.h): then
// calls get call ids instead of timing events.
bool g_activity = false;
uint64_t g_dropped = 0;
Anchor g_anchors[kMaxDevices];
std::unordered_map<TFL_Stream*, int32_t> g_stream_ordinals[kMaxDevices];
std::atomic<uint64_t> g_next_thread{1};

thread_local uint64_t t_thread = 0;
thread_local uint64_t t_call = 0;  // the innermost traced call's id on this thread
constexpr int kMaxCorrelationDepth = 64;
thread_local uint64_t t_correlation[kMaxCorrelationDepth];
thread_local int t_correlation_depth = 0;

uint64_t thread_ordinal() {
  if (t_thread == 0) t_thread = g_next_thread.fetch_add(1, std::memory_order_relaxed);
  return t_thread;
}

uint64_t current_correlation() {
  const int depth = t_correlation_depth;
  return depth > 0 && depth <= kMaxCorrelationDepth ? t_correlation[depth - 1] : 0;
}

bool can_time(const AttachedDevice* d, c10::DeviceIndex device, TFL_Stream* stream) {
  return d != nullptr && d->event_timing() && d->event_elapsed_time != nullptr && stream != nullptr && device >= 0 &&
         device < kMaxDevices;
}

void drop_error(const AttachedDevice& d, TFL_Error* error) noexcept {
  if (error != nullptr) d.api->error_destroy(error);
}

void destroy_event(const AttachedDevice& d, TFL_Event*& event) noexcept {
  if (event != nullptr) drop_error(d, d.api->event_destroy(event));
  event = nullptr;
}

// A timing event recorded on `stream` now, or nullptr when the plugin
// refuses: the record then has no device time.
TFL_Event* timing_event(const AttachedDevice& d, c10::DeviceIndex device, TFL_Stream* stream) noexcept {
  TFL_Event* event = nullptr;
  if (TFL_Error* e = d.api->event_create(device, TFL_EVENT_TIMING, &event); e != nullptr || event == nullptr) {
    drop_error(d, e);
    return nullptr;
  }
  if (TFL_Error* e = d.api->event_record(event, stream); e != nullptr) {
    drop_error(d, e);
    destroy_event(d, event);
  }
  return event;
}

// The device's anchor (see trace.h); made by the first traced call on it.
// Caller holds g_mutex.
const Anchor& anchor_for(const AttachedDevice& d, c10::DeviceIndex device, TFL_Stream* stream) noexcept {
  Anchor& a = g_anchors[device];
  if (a.tried) return a;
  a.tried = true;
  if (TFL_Error* e = d.api->stream_synchronize(stream); e != nullptr) {
    drop_error(d, e);
    return a;
  }
  TFL_Event* event = timing_event(d, device, stream);
  if (event == nullptr) return a;
  if (TFL_Error* e = d.api->event_synchronize(event); e != nullptr) {
    drop_error(d, e);
    destroy_event(d, event);
    return a;
  }
  a.event = event;
  a.host_ns = c10::getTime();
  return a;
}

int32_t stream_ordinal(const AttachedDevice* d, c10::DeviceIndex device, TFL_Stream* stream) {
  if (stream == nullptr || device < 0 || device >= kMaxDevices) return -1;
  if (d != nullptr && static_cast<size_t>(device) < d->default_streams.size() &&
      d->default_streams[static_cast<size_t>(device)] == stream) {
    return 0;
  }
  auto& ordinals = g_stream_ordinals[device];
  const auto it = ordinals.find(stream);
  if (it != ordinals.end()) return it->second;
  const auto next = static_cast<int32_t>(ordinals.size() + 1);
  ordinals.emplace(stream, next);
  return next;
}

// Milliseconds from `from` to `to`, or nullopt.
std::optional<double> elapsed_ms(const AttachedDevice& d, TFL_Event* from, TFL_Event* to) noexcept {
  float ms = 0;
  if (TFL_Error* e = d.event_elapsed_time(from, to, &ms); e != nullptr) {
    drop_error(d, e);
    return std::nullopt;
  }
  return static_cast<double>(ms);
}

// Fills in the slot's device times and frees its events. Caller holds
// g_mutex. The duration is measured between the call's own two events, so
// it keeps full precision however long ago the anchor was.
void resolve(const AttachedDevice& d, Slot& s) noexcept {
  if (s.begin_event == nullptr) return;
  const Anchor& a = g_anchors[s.record.device];
  if (s.end_event != nullptr && a.event != nullptr) {
    if (TFL_Error* e = d.api->event_synchronize(s.end_event); e != nullptr) {
      drop_error(d, e);
    } else {
      const auto offset = elapsed_ms(d, a.event, s.begin_event);
      const auto duration = elapsed_ms(d, s.begin_event, s.end_event);
      if (offset.has_value() && duration.has_value()) {
        s.record.device_begin_ns = a.host_ns + static_cast<int64_t>(*offset * 1e6);
        s.record.device_end_ns = s.record.device_begin_ns + static_cast<int64_t>(*duration * 1e6);
      }
    }
  }
  destroy_event(d, s.begin_event);
  destroy_event(d, s.end_event);
}

// The plugin of the attached device, unless this is a bad fork, where it
// must never be called (events are then leaked, and nothing is resolved).
const AttachedDevice* callable_device() noexcept {
  return in_bad_fork() ? nullptr : attached_device();
}

void drop_records() noexcept {
  const AttachedDevice* d = callable_device();
  for (Slot& s : g_slots) {
    if (d != nullptr) {
      destroy_event(*d, s.begin_event);
      destroy_event(*d, s.end_event);
    }
  }
  g_slots.clear();
  for (Anchor& a : g_anchors) {
    if (d != nullptr) destroy_event(*d, a.event);
    a = Anchor{};
  }
  for (auto& ordinals : g_stream_ordinals) ordinals.clear();
  g_base = 0;
  g_dropped = 0;
  ++g_epoch;
}

}  // namespace

TraceScope::TraceScope(TraceKind kind, const char* name, const char* plugin, c10::DeviceIndex device,
                       TFL_Stream* stream, std::string inputs) {
  if (!tracing()) return;
  const AttachedDevice* d = callable_device();
  TFL_Event* begin = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_consumers.empty()) return;
  const bool timed = !g_activity && can_time(d, device, stream);
  if (g_slots.size() >= kMaxRecords) {
    ++g_dropped;
    return;
  }
  const bool anchored = timed && anchor_for(*d, device, stream).event != nullptr;
  // The host clock is read before the begin event is recorded, so the work
  // never appears to start before its call.
  const int64_t host_begin = c10::getTime();
  if (anchored) begin = timing_event(*d, device, stream);
  Slot& s = g_slots.emplace_back();
  s.record.kind = kind;
  s.record.name = name != nullptr ? name : "";
  s.record.plugin = plugin != nullptr ? plugin : "";
  s.record.inputs = std::move(inputs);
  s.record.device = device;
  s.record.stream = stream_ordinal(d, device, stream);
  s.record.thread = thread_ordinal();
  s.record.correlation = current_correlation();
  s.begin_event = begin;
  s.record.host_begin_ns = host_begin;
  index_ = g_base + g_slots.size() - 1;
  epoch_ = g_epoch;
  stream_ = begin != nullptr ? stream : nullptr;
  if (g_activity) {
    // The plugin tags what this call makes it do with the call's id.
    s.record.call = activity::next_call_id();
    previous_call_ = t_call;
    t_call = s.record.call;
    correlated_ = true;
    activity::set_correlation(t_call);
  }
}

TraceScope::~TraceScope() {
  if (!active()) return;
  const int64_t host_end = c10::getTime();
  if (correlated_) {
    t_call = previous_call_;
    activity::set_correlation(t_call);
  }
  const AttachedDevice* d = callable_device();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (epoch_ != g_epoch || index_ < g_base) return;  // the records were dropped meanwhile
  Slot& s = g_slots[index_ - g_base];
  if (stream_ != nullptr && d != nullptr) {
    s.end_event = timing_event(*d, static_cast<c10::DeviceIndex>(s.record.device), stream_);
  }
  s.record.host_end_ns = host_end;
  s.open = false;
}

void TraceScope::set_bytes(uint64_t bytes) {
  if (!active()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (epoch_ == g_epoch && index_ >= g_base) g_slots[index_ - g_base].record.bytes = bytes;
}

uint64_t trace_begin() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_consumers.empty()) {
    g_activity = activity::start();
    // Anchor every device now, so the first traced calls do not pay for
    // the synchronization in their host time.
    if (const AttachedDevice* d = g_activity ? nullptr : callable_device()) {
      for (int32_t i = 0; i < d->device_count && i < kMaxDevices; ++i) {
        TFL_Stream* stream = d->default_streams[static_cast<size_t>(i)];
        if (can_time(d, static_cast<c10::DeviceIndex>(i), stream)) {
          anchor_for(*d, static_cast<c10::DeviceIndex>(i), stream);
        }
      }
    }
    detail::g_tracing.store(true, std::memory_order_relaxed);
  }
  const uint64_t token = g_next_token++;
  g_consumers[token] = Consumer{g_base + g_slots.size(), g_activity ? activity::position() : 0};
  return token;
}

namespace {

// Waits for every device's queued work and moves the plugin's records into
// the activity store, so that the records of traced work are complete.
// Caller holds g_mutex.
void drain_activity(const AttachedDevice& d) noexcept {
  for (int32_t i = 0; i < d.device_count && i < kMaxDevices; ++i) {
    drop_error(d, d.api->device_synchronize(i));
  }
  activity::drain();
}

// The device span of each call from its device-work records.
std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> device_spans(const std::vector<NativeRecord>& native) {
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> spans;
  for (const NativeRecord& r : native) {
    if (r.call == 0 || !activity::is_device_work(r.kind)) continue;
    auto [it, fresh] = spans.try_emplace(r.call, r.begin_ns, r.end_ns);
    if (!fresh) {
      it->second.first = std::min(it->second.first, r.begin_ns);
      it->second.second = std::max(it->second.second, r.end_ns);
    }
  }
  return spans;
}

}  // namespace

TraceCollection trace_collect(uint64_t token) {
  const AttachedDevice* d = callable_device();
  std::lock_guard<std::mutex> lock(g_mutex);
  TraceCollection out;
  const auto consumer = g_consumers.find(token);
  if (consumer == g_consumers.end()) return out;
  if (g_activity && d != nullptr) {
    drain_activity(*d);
    out.native = activity::since(consumer->second.native_start);
    for (NativeRecord& r : out.native) {
      if (r.device >= 0 && r.device < kMaxDevices) {
        r.stream_index = stream_ordinal(d, static_cast<c10::DeviceIndex>(r.device), r.stream);
      }
    }
  }
  const auto spans = device_spans(out.native);
  for (uint64_t i = std::max(consumer->second.slot_start, g_base); i < g_base + g_slots.size(); ++i) {
    Slot& s = g_slots[i - g_base];
    if (s.open) continue;  // still running on another thread
    if (d != nullptr) resolve(*d, s);
    if (const auto span = spans.find(s.record.call); s.record.call != 0 && span != spans.end()) {
      s.record.device_begin_ns = span->second.first;
      s.record.device_end_ns = span->second.second;
    }
    out.records.push_back(s.record);
  }
  return out;
}

void trace_end(uint64_t token) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_consumers.erase(token) == 0 || !g_consumers.empty()) return;
  detail::g_tracing.store(false, std::memory_order_relaxed);
  if (g_activity) activity::stop();
  g_activity = false;
  drop_records();
}

uint64_t trace_dropped() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_dropped;
}

namespace {
void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}
}  // namespace

std::string trace_json(uint64_t token) {
  const TraceCollection collected = trace_collect(token);
  std::string out = "{\"dropped\": " + std::to_string(trace_dropped()) +
                    ", \"native_dropped\": " + std::to_string(activity::dropped()) + ", \"records\": [";
  bool first = true;
  for (const TraceRecord& r : collected.records) {
    out += first ? "\n[" : ",\n[";
    first = false;
    out += std::to_string(static_cast<int>(r.kind));
    out += ", ";
    append_json_string(out, r.name);
    out += ", ";
    append_json_string(out, r.plugin);
    out += ", ";
    append_json_string(out, r.inputs);
    for (const int64_t v :
         {static_cast<int64_t>(r.device), static_cast<int64_t>(r.stream), static_cast<int64_t>(r.thread),
          static_cast<int64_t>(r.correlation), static_cast<int64_t>(r.bytes), r.host_begin_ns, r.host_end_ns,
          r.device_begin_ns, r.device_end_ns, static_cast<int64_t>(r.call)}) {
      out += ", ";
      out += std::to_string(v);
    }
    out += ']';
  }
  out += "], \"native\": [";
  first = true;
  for (const NativeRecord& r : collected.native) {
    out += first ? "\n[" : ",\n[";
    first = false;
    append_json_string(out, activity::kind_name(r.kind));
    out += ", ";
    append_json_string(out, r.name);
    out += ", ";
    append_json_string(out, r.detail);
    for (const int64_t v : {static_cast<int64_t>(r.device), static_cast<int64_t>(r.stream_index),
                            static_cast<int64_t>(r.call), r.begin_ns, r.end_ns}) {
      out += ", ";
      out += std::to_string(v);
    }
    out += r.host_clock ? ", true]" : ", false]";
  }
  out += "]}";
  return out;
}

void push_trace_correlation(uint64_t id) noexcept {
  if (t_correlation_depth < kMaxCorrelationDepth) t_correlation[t_correlation_depth] = id;
  ++t_correlation_depth;
}

void pop_trace_correlation() noexcept {
  if (t_correlation_depth > 0) --t_correlation_depth;
}

}  // namespace torchfl

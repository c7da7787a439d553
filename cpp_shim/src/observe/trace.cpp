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
int g_consumers = 0;
uint64_t g_dropped = 0;
Anchor g_anchors[kMaxDevices];
std::unordered_map<TFL_Stream*, int32_t> g_stream_ordinals[kMaxDevices];
std::atomic<uint64_t> g_next_thread{1};

thread_local uint64_t t_thread = 0;
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

const char* dtype_name(const TFL_DType& t) {
  switch (t.code) {
    case TFL_DTYPE_FLOAT:
      return t.bits == 16 ? "f16" : t.bits == 32 ? "f32" : t.bits == 64 ? "f64" : "f?";
    case TFL_DTYPE_BFLOAT:
      return "bf16";
    case TFL_DTYPE_INT:
      return t.bits == 8 ? "i8" : t.bits == 16 ? "i16" : t.bits == 32 ? "i32" : t.bits == 64 ? "i64" : "i?";
    case TFL_DTYPE_UINT:
      return t.bits == 8 ? "u8" : t.bits == 16 ? "u16" : t.bits == 32 ? "u32" : t.bits == 64 ? "u64" : "u?";
    case TFL_DTYPE_COMPLEX:
      return t.bits == 64 ? "c64" : t.bits == 128 ? "c128" : "c?";
    case TFL_DTYPE_BOOL:
      return "b8";
    default:
      return "?";
  }
}

template <typename T>
void append_list(std::string& out, const T* items, size_t len) {
  out += '[';
  for (size_t i = 0; i < len; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(items[i]);
  }
  out += ']';
}

void append_tensor(std::string& out, const TFL_Tensor* t) {
  if (t == nullptr) {
    out += "None";
    return;
  }
  out += dtype_name(t->dtype);
  append_list(out, t->shape, t->ndim > 0 && t->shape != nullptr ? static_cast<size_t>(t->ndim) : 0);
}

void append_scalar(std::string& out, const TFL_Scalar& s) {
  switch (s.kind) {
    case TFL_SCALAR_INT:
      out += std::to_string(s.v.i);
      return;
    case TFL_SCALAR_FLOAT:
      out += c10::str(s.v.f);
      return;
    case TFL_SCALAR_BOOL:
      out += s.v.b != 0 ? "True" : "False";
      return;
    case TFL_SCALAR_COMPLEX:
      out += c10::str("(", s.v.c[0], "+", s.v.c[1], "j)");
      return;
    default:
      out += "?";
  }
}

void append_value(std::string& out, const TFL_Value* v) {
  if (v == nullptr) {
    out += "None";
    return;
  }
  switch (v->tag) {
    case TFL_VALUE_TENSOR:
      append_tensor(out, v->u.tensor);
      return;
    case TFL_VALUE_TENSOR_LIST:
      out += '(';
      for (size_t i = 0; i < v->u.tensor_list.len; ++i) {
        if (i > 0) out += ", ";
        append_tensor(out, v->u.tensor_list.items[i]);
      }
      out += ')';
      return;
    case TFL_VALUE_INT:
      out += std::to_string(v->u.i);
      return;
    case TFL_VALUE_FLOAT:
      out += c10::str(v->u.f);
      return;
    case TFL_VALUE_BOOL:
      out += v->u.b != 0 ? "True" : "False";
      return;
    case TFL_VALUE_SCALAR:
      append_scalar(out, v->u.scalar);
      return;
    case TFL_VALUE_INT_LIST:
      append_list(out, v->u.int_list.items, v->u.int_list.len);
      return;
    case TFL_VALUE_FLOAT_LIST:
      append_list(out, v->u.float_list.items, v->u.float_list.len);
      return;
    case TFL_VALUE_BOOL_LIST:
      append_list(out, v->u.bool_list.items, v->u.bool_list.len);
      return;
    case TFL_VALUE_STRING:
      out += '\'';
      out.append(v->u.string.data, v->u.string.len);
      out += '\'';
      return;
    default:
      out += "None";
  }
}

const char* scalar_type_short(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
      return "f32";
    case c10::ScalarType::Double:
      return "f64";
    case c10::ScalarType::Half:
      return "f16";
    case c10::ScalarType::BFloat16:
      return "bf16";
    case c10::ScalarType::Long:
      return "i64";
    case c10::ScalarType::Int:
      return "i32";
    case c10::ScalarType::Bool:
      return "b8";
    default:
      return c10::toString(t);
  }
}

}  // namespace

std::string describe_frame(const TFL_CallFrame& frame) {
  std::string out;
  for (size_t i = 0; i < frame.num_args; ++i) {
    if (i > 0) out += ", ";
    append_value(out, frame.args[i]);
  }
  return out;
}

std::string describe_arguments(c10::ArrayRef<c10::IValue> args) {
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out += ", ";
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        out += "None";
        continue;
      }
      out += scalar_type_short(t.scalar_type());
      const auto sizes = t.sizes();
      append_list(out, sizes.data(), sizes.size());
    } else if (v.isNone()) {
      out += "None";
    } else if (v.isInt() || v.isDouble() || v.isBool() || v.isIntList() || v.isString()) {
      std::ostringstream s;
      s << v;
      out += s.str();
    } else {
      out += v.tagKind();
    }
  }
  return out;
}

TraceScope::TraceScope(TraceKind kind, const char* name, const char* plugin, c10::DeviceIndex device,
                       TFL_Stream* stream, std::string inputs) {
  if (!tracing()) return;
  const AttachedDevice* d = callable_device();
  const bool timed = can_time(d, device, stream);
  TFL_Event* begin = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_consumers == 0) return;
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
}

TraceScope::~TraceScope() {
  if (!active()) return;
  const int64_t host_end = c10::getTime();
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
  if (g_consumers++ == 0) {
    // Anchor every device now, so the first traced calls do not pay for
    // the synchronization in their host time.
    if (const AttachedDevice* d = callable_device()) {
      for (int32_t i = 0; i < d->device_count && i < kMaxDevices; ++i) {
        TFL_Stream* stream = d->default_streams[static_cast<size_t>(i)];
        if (can_time(d, static_cast<c10::DeviceIndex>(i), stream)) {
          anchor_for(*d, static_cast<c10::DeviceIndex>(i), stream);
        }
      }
    }
    detail::g_tracing.store(true, std::memory_order_relaxed);
  }
  return g_base + g_slots.size();
}

std::vector<TraceRecord> trace_collect(uint64_t start) {
  const AttachedDevice* d = callable_device();
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<TraceRecord> out;
  if (g_consumers == 0) return out;
  for (uint64_t i = std::max(start, g_base); i < g_base + g_slots.size(); ++i) {
    Slot& s = g_slots[i - g_base];
    if (s.open) continue;  // still running on another thread
    if (d != nullptr) resolve(*d, s);
    out.push_back(s.record);
  }
  return out;
}

void trace_end() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_consumers == 0) return;
  if (--g_consumers == 0) {
    detail::g_tracing.store(false, std::memory_order_relaxed);
    drop_records();
  }
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

std::string trace_json(uint64_t start) {
  const std::vector<TraceRecord> records = trace_collect(start);
  std::string out = "{\"dropped\": " + std::to_string(trace_dropped()) + ", \"records\": [";
  bool first = true;
  for (const TraceRecord& r : records) {
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
          r.device_begin_ns, r.device_end_ns}) {
      out += ", ";
      out += std::to_string(v);
    }
    out += ']';
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

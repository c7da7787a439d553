#include "observe/activity.h"

#include <ATen/record_function.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "runtime/fork.h"
#include "runtime/runtime.h"
#include "runtime/status.h"

namespace torchfl::activity {
namespace {

// The store is bounded like the trace's records: past this many, drained
// records are counted as dropped.
constexpr size_t kMaxStored = 1'000'000;
// Records asked for per drain call; the drain repeats until fewer come.
constexpr size_t kDrainBatch = 256;

std::atomic<bool> g_recording{false};
std::atomic<uint64_t> g_next_call{1};

// Guarded by g_mutex: the store, the clock pairs and the callback handle.
std::mutex g_mutex;
std::deque<NativeRecord> g_store;
uint64_t g_store_base = 0;
uint64_t g_dropped = 0;
std::optional<at::CallbackHandle> g_ranges_callback;

const AttachedDevice* callable() noexcept {
  if (in_bad_fork()) return nullptr;
  const AttachedDevice* d = attached_device();
  return d != nullptr && d->has_activity ? d : nullptr;
}

int64_t monotonic_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void drop_error(const AttachedDevice& d, TFL_Error* error) noexcept {
  if (error != nullptr) d.api->error_destroy(error);
}

// Says once per process why records were lost (a plugin error or a
// malformed record), as the trace must not fail the traced code.
void warn_lost(const AttachedDevice& d, const std::string& why) noexcept {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  try {
    TORCH_WARN("torch-fl: plugin ", d.plugin_label, " returned activity records the trace cannot use (", why,
               "); they are counted as dropped. Run `torchfl-abi verify` on the plugin (check `activity`).");
  } catch (...) {  // NOLINT(bugprone-empty-catch): a warning handler that throws loses the warning only
  }
}

// How the drain maps times onto the trace's clock: host-clock records by an
// offset from CLOCK_MONOTONIC, device-clock records through each device's
// clock pair, read at the drain's first device-clock record of that device
// (a pair can cost the plugin a device round trip, as OpenCL's does without
// clGetDeviceAndHostTimer); nullopt where activity_clock failed: those
// records are dropped.
class ClockMap {
 public:
  explicit ClockMap(const AttachedDevice& d) : d_(d) {
    const int64_t before = monotonic_ns();
    const int64_t trace_now = c10::getTime();
    monotonic_to_trace_ = trace_now - (before + monotonic_ns()) / 2;
  }

  std::optional<int64_t> map(const TFL_ActivityRecord& r, uint64_t t) {
    const auto ns = static_cast<int64_t>(t);
    if ((r.flags & TFL_ACTIVITY_HOST_CLOCK) != 0) return ns + monotonic_to_trace_;
    const auto pair = device_pair(r.device);
    if (!pair) return std::nullopt;
    const auto& [device_ns, host_ns] = *pair;
    return host_ns + (ns - device_ns) + monotonic_to_trace_;
  }

 private:
  using Pair = std::optional<std::pair<int64_t, int64_t>>;  // (device_ns, monotonic_ns)

  const Pair& device_pair(int32_t device) {
    static const Pair kNone;
    if (device < 0 || device >= d_.device_count || device >= kMaxDevices) return kNone;
    auto [it, fresh] = pairs_.try_emplace(device);
    if (fresh) {
      uint64_t device_ns = 0;
      uint64_t host_ns = 0;
      if (TFL_Error* e = d_.activity.activity_clock(device, &device_ns, &host_ns); e != nullptr) {
        drop_error(d_, e);
      } else {
        it->second = std::make_pair(static_cast<int64_t>(device_ns), static_cast<int64_t>(host_ns));
      }
    }
    return it->second;
  }

  const AttachedDevice& d_;
  int64_t monotonic_to_trace_ = 0;
  std::unordered_map<int32_t, Pair> pairs_;
};

// A NUL-terminated field's text; nullopt if the plugin left it unterminated.
template <size_t N>
std::optional<std::string> field_text(const char (&field)[N]) {
  const void* end = std::memchr(field, '\0', N);
  if (end == nullptr) return std::nullopt;
  return valid_utf8(std::string_view(field, static_cast<const char*>(end) - field));
}

// Checks one record as the header's rules say and maps it; an error says why.
std::optional<NativeRecord> convert(const TFL_ActivityRecord& r, ClockMap& clocks, std::string& why) {
  if (r.struct_size < TFL_STRUCT_SIZE(TFL_ActivityRecord, detail) || r.struct_size > sizeof(TFL_ActivityRecord)) {
    why = c10::str("a record's struct_size is ", r.struct_size);
    return std::nullopt;
  }
  if (r.kind < TFL_ACTIVITY_API || r.kind > TFL_ACTIVITY_MARK || r.end_ns < r.start_ns ||
      (r.flags & ~TFL_ACTIVITY_HOST_CLOCK) != 0) {
    why = c10::str("a record has kind ", r.kind, ", flags ", r.flags, " and times ", r.start_ns, "..", r.end_ns);
    return std::nullopt;
  }
  auto name = field_text(r.name);
  auto detail = field_text(r.detail);
  if (!name || !detail) {
    why = "a record's name or detail is not NUL-terminated";
    return std::nullopt;
  }
  const auto begin = clocks.map(r, r.start_ns);
  const auto end = clocks.map(r, r.end_ns);
  if (!begin || !end) {
    why = c10::str("activity_clock failed for device ", r.device);
    return std::nullopt;
  }
  NativeRecord out;
  out.kind = r.kind;
  out.host_clock = (r.flags & TFL_ACTIVITY_HOST_CLOCK) != 0;
  out.name = std::move(*name);
  out.detail = std::move(*detail);
  out.device = r.device;
  out.stream = r.stream;
  out.call = r.correlation_id;
  out.begin_ns = *begin;
  out.end_ns = *end;
  return out;
}

// record_function's ranges, forwarded while recording (see activity.h).
std::unique_ptr<at::ObserverContext> enter_range(const at::RecordFunction& fn) {
  range_push(fn.name());
  return nullptr;
}

void exit_range(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  range_pop();
}

}  // namespace

bool available() noexcept {
  return callable() != nullptr;
}

bool has_ranges() noexcept {
  const AttachedDevice* d = callable();
  return d != nullptr && d->activity.range_push != nullptr;
}

bool start() noexcept {
  const AttachedDevice* d = callable();
  if (d == nullptr) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (TFL_Error* e = d->activity.activity_enable(TFL_ACTIVITY_ALL_KINDS); e != nullptr) {
    warn_lost(*d, c10::str("activity_enable failed: ", take_status(d->api, e).message));
    return false;
  }
  // Records made before (a plugin recording for another reason) are not
  // this trace's.
  size_t written = 0;
  uint64_t lost = 0;
  std::vector<TFL_ActivityRecord> scratch(kDrainBatch);
  do {
    written = 0;
    if (TFL_Error* e =
            d->activity.activity_drain(scratch.data(), sizeof(TFL_ActivityRecord), scratch.size(), &written, &lost);
        e != nullptr) {
      drop_error(*d, e);
      break;
    }
  } while (written == scratch.size());
  if (d->activity.range_push != nullptr && !g_ranges_callback) {
    try {
      g_ranges_callback = at::addGlobalCallback(
          at::RecordFunctionCallback(&enter_range, &exit_range).scopes({at::RecordScope::USER_SCOPE}));
    } catch (const std::exception& e) {
      warn_lost(*d, c10::str("forwarding record_function ranges failed: ", e.what()));
    }
  }
  g_recording.store(true, std::memory_order_release);
  return true;
}

void stop() noexcept {
  const AttachedDevice* d = callable();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_recording.exchange(false)) return;
  if (g_ranges_callback) {
    at::removeCallback(*g_ranges_callback);
    g_ranges_callback.reset();
  }
  if (d != nullptr) drop_error(*d, d->activity.activity_enable(0));
  g_store.clear();
  g_store_base = 0;
  g_dropped = 0;
}

bool recording() noexcept {
  return g_recording.load(std::memory_order_acquire);
}

uint64_t next_call_id() noexcept {
  return g_next_call.fetch_add(1, std::memory_order_relaxed);
}

void set_correlation(uint64_t id) noexcept {
  if (const AttachedDevice* d = callable()) d->activity.activity_set_correlation(id);
}

void drain() noexcept {
  if (!recording()) return;
  const AttachedDevice* d = callable();
  if (d == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  try {
    ClockMap clocks(*d);
    std::vector<TFL_ActivityRecord> batch(kDrainBatch);
    size_t written = 0;
    do {
      written = 0;
      uint64_t lost = 0;
      if (TFL_Error* e =
              d->activity.activity_drain(batch.data(), sizeof(TFL_ActivityRecord), batch.size(), &written, &lost);
          e != nullptr) {
        warn_lost(*d, c10::str("activity_drain failed: ", take_status(d->api, e).message));
        return;
      }
      g_dropped += lost;
      if (written > batch.size()) {
        warn_lost(*d,
                  c10::str("activity_drain reported ", written, " records written into a buffer of ", batch.size()));
        return;
      }
      std::string why;
      for (size_t i = 0; i < written; ++i) {
        std::optional<NativeRecord> record = convert(batch[i], clocks, why);
        if (!record || g_store.size() >= kMaxStored) {
          ++g_dropped;
          if (!record) warn_lost(*d, why);
          continue;
        }
        g_store.push_back(std::move(*record));
      }
    } while (written == batch.size());
  } catch (const std::exception& e) {
    warn_lost(*d, e.what());
  }
}

uint64_t position() noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_store_base + g_store.size();
}

std::vector<NativeRecord> since(uint64_t position) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<NativeRecord> out;
  for (uint64_t i = std::max(position, g_store_base); i < g_store_base + g_store.size(); ++i) {
    out.push_back(g_store[i - g_store_base]);
  }
  return out;
}

uint64_t dropped() noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_dropped;
}

void range_push(const char* name) noexcept {
  const AttachedDevice* d = callable();
  if (d != nullptr && d->activity.range_push != nullptr) d->activity.range_push(name != nullptr ? name : "");
}

void range_pop() noexcept {
  const AttachedDevice* d = callable();
  if (d != nullptr && d->activity.range_pop != nullptr) d->activity.range_pop();
}

void range_mark(const char* name) noexcept {
  const AttachedDevice* d = callable();
  if (d != nullptr && d->activity.range_mark != nullptr) d->activity.range_mark(name != nullptr ? name : "");
}

const char* kind_name(uint32_t kind) noexcept {
  static constexpr const char* kNames[] = {"?", "api", "kernel", "copy", "memset", "sync", "build", "range", "mark"};
  return kind < std::size(kNames) ? kNames[kind] : "?";
}

bool is_device_work(uint32_t kind) noexcept {
  return kind == TFL_ACTIVITY_KERNEL || kind == TFL_ACTIVITY_COPY || kind == TFL_ACTIVITY_MEMSET;
}

}  // namespace torchfl::activity

// Records which plugin call this thread is in, for torch-fl's crash report.
//
// The Rust core owns one record per thread (torchfl_core::inflight) and
// reads it in its fatal-signal and exit handlers, so that a plugin that
// kills the process is named. The shim writes the same record around its
// calls into the plugin: the core hands over a function returning the
// calling thread's record at attach (TFL_ShimDevice.inflight_slot), and the
// shim caches the pointer per thread. Cost per call: two pointer pairs
// stored.
#pragma once

#include <string>

namespace torchfl {

// Mirrors torchfl_core::inflight::InFlight (#[repr(C)]).
struct InFlightRecord {
  const char* plugin;  // the plugin's label; lives for the whole process
  const char* call;    // the entry or operator name; outlives the call
};

using InFlightSlotFn = InFlightRecord* (*)();

namespace detail {
// Set once at attach, before any kernel is registered; read afterwards.
inline InFlightSlotFn g_inflight_slot = nullptr;

inline InFlightRecord* inflight_slot() {
  thread_local InFlightRecord* slot = nullptr;
  if (slot == nullptr && g_inflight_slot != nullptr) slot = g_inflight_slot();
  return slot;
}
}  // namespace detail

// Records (plugin, call) for this scope; restores the previous record.
class InFlightScope {
 public:
  InFlightScope(const char* plugin, const char* call) : slot_(detail::inflight_slot()) {
    if (slot_ != nullptr) {
      previous_ = *slot_;
      *slot_ = InFlightRecord{plugin, call};
    }
  }
  ~InFlightScope() {
    if (slot_ != nullptr) *slot_ = previous_;
  }
  InFlightScope(const InFlightScope&) = delete;
  InFlightScope& operator=(const InFlightScope&) = delete;

 private:
  InFlightRecord* slot_;
  InFlightRecord previous_{nullptr, nullptr};
};

// The name a scope records must outlive the call: a literal or a named
// string, never a temporary.
inline const char* inflight_name(const char* name) {
  return name;
}
inline const char* inflight_name(const std::string& name) {
  return name.c_str();
}
const char* inflight_name(std::string&& name) = delete;

}  // namespace torchfl

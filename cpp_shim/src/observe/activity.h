// The plugin's own activity records (ABI 1.8) for the device trace: what
// each operator call made the plugin do, in its vendor runtime's terms
// (native calls, builds, syncs) and on its device's clock (kernels, copies,
// fills), tagged with the call that caused it.
//
// While a trace consumer is open (trace.h) and the plugin has an activity
// table, recording is on in the plugin, each traced call gets a fresh call
// id that the plugin is told before the call (activity_set_correlation) and
// that its records carry, and the records are drained from the plugin into
// a store here after the host's synchronizing calls and when a consumer
// collects. Times are mapped onto the trace's host clock (c10::getTime):
// host-clock records through a CLOCK_MONOTONIC to c10::getTime offset,
// device-clock records through the plugin's clock pair (activity_clock),
// both read afresh at each drain (a device's pair only when the drain has
// records of its clock) so a long trace follows clock drift.
//
// While recording, user ranges - torch.<device>.nvtx and every
// record_function (the profiler's ranges included) - are forwarded to the
// plugin's range entries too, when it has them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "torch_fl/plugin.h"

namespace torchfl {

// One drained record, times on the host clock of the trace.
struct NativeRecord {
  uint32_t kind = 0;  // TFL_ActivityKind
  bool host_clock = false;
  std::string name;
  std::string detail;
  int32_t device = -1;
  TFL_Stream* stream = nullptr;
  uint64_t call = 0;          // the trace's call id (TraceRecord::call), 0: none
  int32_t stream_index = -1;  // the trace's stream ordinal, filled in when collected
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};

namespace activity {

// Whether the attached plugin reports records (callable: not a bad fork).
bool available() noexcept;
// Whether it forwards user ranges.
bool has_ranges() noexcept;

// Turns the plugin's recording on (every kind) and starts forwarding
// record_function ranges; the first consumer calls it. False when the
// plugin refused (the trace then times calls with events).
bool start() noexcept;
// Turns recording off and drops the store; the last consumer calls it.
void stop() noexcept;
// Whether recording is on.
bool recording() noexcept;

// A fresh call id (never 0).
uint64_t next_call_id() noexcept;
// The calling thread's correlation id in the plugin.
void set_correlation(uint64_t id) noexcept;

// Moves the plugin's complete records into the store. Never throws: a
// plugin error or a malformed record is counted in dropped() and logged once.
void drain() noexcept;
// The store's position for the next record.
uint64_t position() noexcept;
// The records from `position` on.
std::vector<NativeRecord> since(uint64_t position);
// Records the plugin or the store dropped since recording began.
uint64_t dropped() noexcept;

// Forwards a user range to the plugin (no-op without range entries).
void range_push(const char* name) noexcept;
void range_pop() noexcept;
void range_mark(const char* name) noexcept;

// The lower-case name of a kind: "api", "kernel"... ("?" if unknown).
const char* kind_name(uint32_t kind) noexcept;
// Whether a kind's times are device work (kernel, copy, memset).
bool is_device_work(uint32_t kind) noexcept;

}  // namespace activity
}  // namespace torchfl

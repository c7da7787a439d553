//! The activity table (ABI 1.8): read once after `initialize`, validated,
//! and handed to the C++ shim, which enables recording while a trace runs,
//! tags each call with a correlation id and drains the plugin's records.
//!
//! As with the other extension tables, the host allocates the
//! `TFL_Activity` the plugin fills and every entry must point into
//! executable memory. Records are drained into host memory too, so what the
//! host reads of them is only what the plugin wrote into the host's array.

use torchfl_ffi::*;

use super::collectives::Extension;
use super::probe::MemoryMap;
use super::table::ApiTable;
use crate::error::{PluginStatus, StatusCode};

/// The four required entries of `t`, by name.
fn required(t: &TFL_Activity) -> [(&'static str, Option<usize>); 4] {
    [
        ("activity_enable", t.activity_enable.map(|f| f as usize)),
        ("activity_set_correlation", t.activity_set_correlation.map(|f| f as usize)),
        ("activity_drain", t.activity_drain.map(|f| f as usize)),
        ("activity_clock", t.activity_clock.map(|f| f as usize)),
    ]
}

/// The three range entries of `t`, by name (all present or all NULL).
fn ranges(t: &TFL_Activity) -> [(&'static str, Option<usize>); 3] {
    [
        ("range_push", t.range_push.map(|f| f as usize)),
        ("range_pop", t.range_pop.map(|f| f as usize)),
        ("range_mark", t.range_mark.map(|f| f as usize)),
    ]
}

impl ApiTable {
    /// Asks for the activity table, after initialize (`minor`: the
    /// negotiated ABI minor; below 1.8 the host does not ask). An error is a
    /// malformed table, which refuses the plugin.
    pub(crate) fn activity(&self, map: &MemoryMap, minor: u32) -> Result<Extension<TFL_Activity>, String> {
        if minor < 8 {
            return Ok(Extension::Absent(format!(
                "the plugin speaks ABI 1.{minor}, activity records came in 1.8"
            )));
        }
        let Some(get) = self.get_activity else {
            return Ok(Extension::Absent("its get_activity entry is NULL".to_owned()));
        };
        let mut out = TFL_Activity::empty(struct_size!(TFL_Activity, range_mark));
        // SAFETY: get_activity was found in executable memory when the table
        // was read; `out` is a host struct whose struct_size says how much
        // the plugin may write.
        if let Err(status) = self.check(unsafe { get(&mut out) }) {
            return Ok(Extension::Absent(format!("get_activity reported {status}")));
        }
        for (name, entry) in required(&out) {
            let address = entry.ok_or_else(|| {
                format!(
                    "get_activity succeeded but left TFL_Activity.{name} NULL: the four activity entries are \
                     required (return an error from get_activity to offer no records)"
                )
            })?;
            map.executable(address)
                .map_err(|at| format!("TFL_Activity.{name} does not point to code: {at}"))?;
        }
        let present = ranges(&out).iter().filter(|(_, e)| e.is_some()).count();
        if present != 0 && present != 3 {
            return Err(
                "TFL_Activity's range_push, range_pop and range_mark must be present together or all NULL (a \
                 plugin without annotations leaves all three NULL)"
                    .to_owned(),
            );
        }
        for (name, entry) in ranges(&out) {
            if let Some(address) = entry {
                map.executable(address)
                    .map_err(|at| format!("TFL_Activity.{name} does not point to code: {at}"))?;
            }
        }
        Ok(Extension::Present(out))
    }
}

/// The activity entries a [`crate::activity`] call needs, in one enum so
/// that one function makes every call (and states its safety once).
#[derive(Debug)]
pub(crate) enum ActivityCall<'a> {
    /// `activity_enable(kinds)`.
    Enable(u32),
    /// `activity_set_correlation(id)`.
    SetCorrelation(u64),
    /// `activity_drain(records, size, capacity, &written, &dropped)`.
    Drain(&'a mut [TFL_ActivityRecord], &'a mut usize, &'a mut u64),
    /// `activity_clock(device, &device_ns, &host_ns)`.
    Clock(i32, &'a mut u64, &'a mut u64),
    /// `range_push(name)` (NUL-terminated).
    Push(&'a std::ffi::CStr),
    /// `range_pop()`.
    Pop,
    /// `range_mark(name)`.
    Mark(&'a std::ffi::CStr),
}

impl ApiTable {
    /// Makes `call` through the validated activity table `t`.
    pub(crate) fn activity_call(&self, t: &TFL_Activity, call: ActivityCall<'_>) -> Result<(), PluginStatus> {
        // Every required entry was checked non-NULL and in code when `t` was
        // read; the range entries may be NULL (the caller checks).
        let missing = |what: &str| PluginStatus {
            code: StatusCode::Unimplemented,
            message: format!("the plugin's activity table has no {what} entry"),
        };
        // SAFETY: the entries point to code (checked when read); every
        // pointer passed is to host memory live for the call: the drain's
        // array has `records.len()` elements of the host's record size, and
        // names are NUL-terminated by `CStr`.
        let status = unsafe {
            match call {
                ActivityCall::Enable(kinds) => {
                    t.activity_enable.ok_or_else(|| missing("activity_enable"))?(kinds)
                }
                ActivityCall::SetCorrelation(id) => {
                    t.activity_set_correlation.ok_or_else(|| missing("activity_set_correlation"))?(id);
                    std::ptr::null_mut()
                }
                ActivityCall::Drain(records, written, dropped) => {
                    t.activity_drain.ok_or_else(|| missing("activity_drain"))?(
                        records.as_mut_ptr(),
                        std::mem::size_of::<TFL_ActivityRecord>(),
                        records.len(),
                        written,
                        dropped,
                    )
                }
                ActivityCall::Clock(device, device_ns, host_ns) => {
                    t.activity_clock.ok_or_else(|| missing("activity_clock"))?(device, device_ns, host_ns)
                }
                ActivityCall::Push(name) => {
                    t.range_push.ok_or_else(|| missing("range_push"))?(name.as_ptr());
                    std::ptr::null_mut()
                }
                ActivityCall::Pop => {
                    t.range_pop.ok_or_else(|| missing("range_pop"))?();
                    std::ptr::null_mut()
                }
                ActivityCall::Mark(name) => {
                    t.range_mark.ok_or_else(|| missing("range_mark"))?(name.as_ptr());
                    std::ptr::null_mut()
                }
            }
        };
        self.check(status)
    }
}

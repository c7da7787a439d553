//! The activity extension (ABI 1.8): the `TFL_Activity` entries, each a
//! conversion around the runtime's recorder (`crate::runtime::activity`,
//! which says what the simulator records and how its device clock is
//! defined).
//!
//! The entries that return nothing (`activity_set_correlation` and the
//! three range entries) cannot report an error: they catch any panic and
//! ignore it, and do nothing before `initialize`.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::addr_of;

use torchfl_ffi::struct_size;
use torchfl_ffi::{TFL_Activity, TFL_ActivityRecord, TFL_Error};

use super::{check_size, guard, null_arg, runtime, RUNTIME};
use crate::error::{Error, Result};
use crate::runtime::activity;

unsafe extern "C" fn activity_enable(kinds: u32) -> *mut TFL_Error {
    guard("activity_enable", || runtime()?.activity_enable(kinds))
}

unsafe extern "C" fn activity_set_correlation(id: u64) {
    // Thread-local only: no allocation, no lock, no failure.
    activity::set_correlation(id);
}

/// Checks `activity_drain`'s arguments; returns the bytes to write per
/// record.
fn drain_layout(
    records: *mut TFL_ActivityRecord,
    record_size: usize,
    capacity: usize,
    out_written: *mut usize,
    out_dropped: *mut u64,
) -> Result<usize> {
    const WHAT: &str = "activity_drain";
    if out_written.is_null() {
        return Err(null_arg(WHAT, "out_written"));
    }
    if out_dropped.is_null() {
        return Err(null_arg(WHAT, "out_dropped"));
    }
    let minimum = struct_size!(TFL_ActivityRecord, detail);
    if record_size < minimum {
        return Err(Error::invalid(format!(
            "sim: {WHAT}: record_size {record_size} is smaller than the ABI 1.8 size of TFL_ActivityRecord \
             ({minimum})"
        )));
    }
    if records.is_null() && capacity > 0 {
        return Err(null_arg(WHAT, "records"));
    }
    if capacity.checked_mul(record_size).is_none_or(|total| isize::try_from(total).is_err()) {
        return Err(Error::invalid(format!(
            "sim: {WHAT}: {capacity} records of {record_size} bytes do not fit in memory"
        )));
    }
    Ok(record_size.min(std::mem::size_of::<TFL_ActivityRecord>()))
}

/// # Safety
/// `records` must be NULL or valid for writes of `capacity * record_size`
/// bytes; `out_written` and `out_dropped` NULL or writable.
unsafe extern "C" fn activity_drain(
    records: *mut TFL_ActivityRecord,
    record_size: usize,
    capacity: usize,
    out_written: *mut usize,
    out_dropped: *mut u64,
) -> *mut TFL_Error {
    guard("activity_drain", || {
        let bytes = drain_layout(records, record_size, capacity, out_written, out_dropped)?;
        let base = records.cast::<u8>();
        let (written, dropped) = runtime()?.activity_drain_each(capacity, |i, r| {
            let mut record = r.to_ffi();
            record.struct_size = bytes;
            // SAFETY: `i < capacity`, so the record's slot lies within the
            // host's array (`capacity * record_size` bytes, checked to fit
            // an isize); `bytes <= size_of::<TFL_ActivityRecord>()` are read
            // from a local record (no padding: every byte is initialized)
            // and written unaligned, as `record_size` need not be a multiple
            // of the alignment.
            unsafe {
                let dst = base.add(i * record_size);
                std::ptr::copy_nonoverlapping(addr_of!(record).cast::<u8>(), dst, bytes);
            }
        });
        // SAFETY: both checked non-NULL and writable per the contract.
        unsafe {
            out_written.write(written);
            out_dropped.write(dropped);
        }
        Ok(())
    })
}

/// # Safety
/// `out_device_ns` and `out_host_ns` must be NULL or writable.
unsafe extern "C" fn activity_clock(
    device: i32,
    out_device_ns: *mut u64,
    out_host_ns: *mut u64,
) -> *mut TFL_Error {
    guard("activity_clock", || {
        let rt = runtime()?;
        let device = rt.check_device(i64::from(device))?;
        if out_device_ns.is_null() {
            return Err(null_arg("activity_clock", "out_device_ns"));
        }
        if out_host_ns.is_null() {
            return Err(null_arg("activity_clock", "out_host_ns"));
        }
        let (device_ns, host_ns) = rt.activity_clock(device)?;
        // SAFETY: both checked non-NULL and writable per the contract.
        unsafe {
            out_device_ns.write(device_ns);
            out_host_ns.write(host_ns);
        }
        Ok(())
    })
}

/// Runs `f` with the runtime, if initialized, ignoring a panic: for the
/// entries that cannot report one.
fn quietly(f: impl FnOnce(&crate::Runtime)) {
    if let Some(rt) = RUNTIME.get() {
        let _ = catch_unwind(AssertUnwindSafe(|| f(rt)));
    }
}

/// A range name from the host: borrowed unless it is not UTF-8; NULL is
/// the empty name.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string valid for the call.
unsafe fn range_name<'a>(name: *const c_char) -> std::borrow::Cow<'a, str> {
    if name.is_null() {
        return std::borrow::Cow::Borrowed("");
    }
    // SAFETY: forwarded contract.
    unsafe { CStr::from_ptr(name) }.to_string_lossy()
}

/// # Safety
/// `name` must be NULL or a NUL-terminated string valid for the call.
unsafe extern "C" fn range_push(name: *const c_char) {
    // SAFETY: forwarded contract.
    quietly(|rt| rt.range_push(&unsafe { range_name(name) }));
}

unsafe extern "C" fn range_pop() {
    quietly(crate::Runtime::range_pop);
}

/// # Safety
/// `name` must be NULL or a NUL-terminated string valid for the call.
unsafe extern "C" fn range_mark(name: *const c_char) {
    // SAFETY: forwarded contract.
    quietly(|rt| rt.range_mark(&unsafe { range_name(name) }));
}

/// `TFL_PluginApi.get_activity`.
///
/// # Safety
/// `out` must be NULL or point to a `TFL_Activity` whose `struct_size` the
/// host has set.
pub(super) unsafe extern "C" fn get_activity(out: *mut TFL_Activity) -> *mut TFL_Error {
    guard("get_activity", || {
        if out.is_null() {
            return Err(null_arg("get_activity", "out"));
        }
        runtime()?;
        // SAFETY: `out` is valid for the call; fields are written only when
        // the host's struct_size covers them.
        unsafe {
            let size = check_size(
                addr_of!((*out).struct_size),
                struct_size!(TFL_Activity, activity_clock),
                "get_activity",
            )?;
            wr!(out, TFL_Activity, size, activity_enable, Some(activity_enable));
            wr!(out, TFL_Activity, size, activity_set_correlation, Some(activity_set_correlation));
            wr!(out, TFL_Activity, size, activity_drain, Some(activity_drain));
            wr!(out, TFL_Activity, size, activity_clock, Some(activity_clock));
            wr!(out, TFL_Activity, size, range_push, Some(range_push));
            wr!(out, TFL_Activity, size, range_pop, Some(range_pop));
            wr!(out, TFL_Activity, size, range_mark, Some(range_mark));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::ptr::{null_mut, NonNull};

    use super::*;

    #[test]
    fn drain_arguments_are_checked() {
        let mut records = [TFL_ActivityRecord::zeroed(); 2];
        let r = records.as_mut_ptr();
        let (mut written, mut dropped) = (0usize, 0u64);
        let (w, d) = (&mut written as *mut usize, &mut dropped as *mut u64);
        let full = std::mem::size_of::<TFL_ActivityRecord>();
        assert_eq!(full, 248);
        assert_eq!(drain_layout(r, full, 2, w, d).unwrap(), full);
        assert_eq!(drain_layout(r, full + 40, 2, w, d).unwrap(), full, "a later host's larger records");
        assert_eq!(drain_layout(null_mut(), full, 0, w, d).unwrap(), full, "nothing to write");
        let message = |e: Result<usize>| e.unwrap_err().message().to_owned();
        assert!(message(drain_layout(r, full - 1, 2, w, d)).contains("smaller than the ABI 1.8 size"));
        assert!(message(drain_layout(r, 0, 2, w, d)).contains("record_size 0"));
        assert!(message(drain_layout(null_mut(), full, 2, w, d)).contains("records is NULL"));
        assert!(message(drain_layout(r, full, 2, null_mut(), d)).contains("out_written is NULL"));
        assert!(message(drain_layout(r, full, 2, w, null_mut())).contains("out_dropped is NULL"));
        let dangling = NonNull::<TFL_ActivityRecord>::dangling().as_ptr();
        assert!(message(drain_layout(dangling, full, usize::MAX / 8, w, d)).contains("do not fit"));
    }
}

//! 1.8: the activity table (`TFL_PluginApi.get_activity`): recording
//! switches, the drain, the device clock and user ranges, over the
//! [`Recorder`] every recording site writes to.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use torchfl_ffi::{self as ffi, struct_size};
use torchfl_ffi::{TFL_Activity, TFL_ActivityRecord, TFL_Error};

use super::{device, guard, null_arg, runtime};
use crate::activity::{self, Events, Recorder, RECORDER};
use crate::cl::Cl;
use crate::error::{Error, Result};

/// # Safety
/// `out` must be NULL or a `TFL_Activity` whose `struct_size` is set.
pub(super) unsafe extern "C" fn get_activity(out: *mut TFL_Activity) -> *mut TFL_Error {
    guard("get_activity", || {
        if out.is_null() {
            return Err(null_arg("get_activity", "out"));
        }
        // SAFETY: valid for the call; fields are written only as far as the
        // host's struct_size covers them.
        unsafe {
            let size = rd!(out, struct_size);
            let required = struct_size!(TFL_Activity, activity_clock);
            if size < required {
                return Err(Error::invalid(format!(
                    "opencl: get_activity: struct_size {size} does not cover the four required entries \
                     ({required} bytes)"
                )));
            }
            wr!(out, TFL_Activity, size, activity_enable, Some(activity_enable));
            wr!(out, TFL_Activity, size, activity_set_correlation, Some(activity_set_correlation));
            wr!(out, TFL_Activity, size, activity_drain, Some(activity_drain));
            wr!(out, TFL_Activity, size, activity_clock, Some(activity_clock));
            // The three range entries together, or none.
            if ffi::has_field!(TFL_Activity, range_mark, size) {
                wr!(out, TFL_Activity, size, range_push, Some(range_push));
                wr!(out, TFL_Activity, size, range_pop, Some(range_pop));
                wr!(out, TFL_Activity, size, range_mark, Some(range_mark));
            }
        }
        Ok(())
    })
}

unsafe extern "C" fn activity_enable(kinds: u32) -> *mut TFL_Error {
    guard("activity_enable", || RECORDER.enable(kinds))
}

unsafe extern "C" fn activity_set_correlation(id: u64) {
    activity::set_correlation(id);
}

/// # Safety
/// `records` must hold `capacity` records of `record_size` bytes;
/// `out_written` and `out_dropped` must be NULL or writable.
unsafe extern "C" fn activity_drain(
    records: *mut TFL_ActivityRecord,
    record_size: usize,
    capacity: usize,
    out_written: *mut usize,
    out_dropped: *mut u64,
) -> *mut TFL_Error {
    guard("activity_drain", || {
        // Pending device records exist only once OpenCL was opened.
        let cl = Cl::get().ok();
        // SAFETY: forwarded contract.
        unsafe {
            drain_into(
                &RECORDER,
                cl.map(|c| c as &dyn Events),
                records,
                record_size,
                capacity,
                out_written,
                out_dropped,
            )
        }
    })
}

/// `activity_drain` on `recorder` (the tests' own, or the process').
///
/// # Safety
/// As for `activity_drain`.
unsafe fn drain_into(
    recorder: &Recorder,
    events: Option<&dyn Events>,
    records: *mut TFL_ActivityRecord,
    record_size: usize,
    capacity: usize,
    out_written: *mut usize,
    out_dropped: *mut u64,
) -> Result<()> {
    let minimum = struct_size!(TFL_ActivityRecord, detail);
    if record_size < minimum {
        return Err(Error::invalid(format!(
            "opencl: activity_drain: record_size {record_size} is below the ABI 1.8 size of \
             TFL_ActivityRecord ({minimum})"
        )));
    }
    if out_written.is_null() {
        return Err(null_arg("activity_drain", "out_written"));
    }
    if out_dropped.is_null() {
        return Err(null_arg("activity_drain", "out_dropped"));
    }
    if records.is_null() && capacity > 0 {
        return Err(null_arg("activity_drain", "records"));
    }
    if capacity.checked_mul(record_size).is_none_or(|bytes| bytes > isize::MAX as usize) {
        return Err(Error::invalid(format!(
            "opencl: activity_drain: {capacity} records of {record_size} bytes do not fit in memory"
        )));
    }
    let bytes = record_size.min(std::mem::size_of::<TFL_ActivityRecord>());
    let (written, dropped) = recorder.drain(events, capacity, |i, staged| {
        let mut record = staged.record();
        record.struct_size = bytes;
        // SAFETY: i < capacity, so the record's `record_size` bytes lie in
        // the host's array (contract), and the offset fits (checked above);
        // `bytes` <= size_of::<TFL_ActivityRecord>(), and the record has no
        // padding. The array need not be aligned for this record size.
        unsafe {
            let dst = records.cast::<u8>().add(i * record_size);
            std::ptr::copy_nonoverlapping((&record as *const TFL_ActivityRecord).cast::<u8>(), dst, bytes);
        }
    });
    // SAFETY: both checked non-NULL; writable per the contract.
    unsafe {
        out_written.write(written);
        out_dropped.write(dropped);
    }
    Ok(())
}

/// # Safety
/// `out_device_ns` and `out_host_ns` must be NULL or writable.
unsafe extern "C" fn activity_clock(
    d: i32,
    out_device_ns: *mut u64,
    out_host_ns: *mut u64,
) -> *mut TFL_Error {
    guard("activity_clock", || {
        let rt = runtime()?;
        let d = device(rt, d)?;
        if out_device_ns.is_null() {
            return Err(null_arg("activity_clock", "out_device_ns"));
        }
        if out_host_ns.is_null() {
            return Err(null_arg("activity_clock", "out_host_ns"));
        }
        let (device_ns, host_ns) = rt.activity_clock(d)?;
        // SAFETY: non-NULL and writable per the contract; written on success only.
        unsafe {
            out_device_ns.write(device_ns);
            out_host_ns.write(host_ns);
        }
        Ok(())
    })
}

/// The bytes of a range name borrowed for the call (NULL: empty).
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string valid for `'a`.
unsafe fn name_bytes<'a>(name: *const c_char) -> &'a [u8] {
    if name.is_null() {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { CStr::from_ptr(name) }.to_bytes()
}

/// # Safety
/// `name` must be NULL or a NUL-terminated string valid for the call.
unsafe extern "C" fn range_push(name: *const c_char) {
    // SAFETY: per the contract.
    let name = unsafe { name_bytes(name) };
    // A void entry: a panic (there is none to expect) is dropped, never unwound into C.
    let _ = catch_unwind(AssertUnwindSafe(|| RECORDER.range_push(name)));
}

unsafe extern "C" fn range_pop() {
    let _ = catch_unwind(AssertUnwindSafe(|| RECORDER.range_pop()));
}

/// # Safety
/// `name` must be NULL or a NUL-terminated string valid for the call.
unsafe extern "C" fn range_mark(name: *const c_char) {
    // SAFETY: per the contract.
    let name = unsafe { name_bytes(name) };
    let _ = catch_unwind(AssertUnwindSafe(|| RECORDER.range_mark(name)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::Site;

    fn error_code(e: Result<()>) -> i32 {
        e.map_or_else(|e| e.code(), |()| 0)
    }

    fn recorder_with(n: usize) -> Recorder {
        let r = Recorder::new(64);
        r.enable(1 << ffi::TFL_ACTIVITY_API).unwrap();
        for i in 0..n {
            r.call(
                Site {
                    call: "clEnqueueWriteBuffer",
                    device: 0,
                    stream: 0,
                    detail: format_args!("{i} bytes"),
                },
                || (),
            );
        }
        r
    }

    #[test]
    fn the_table_is_filled_as_far_as_the_host_struct_goes() {
        let mut t = TFL_Activity::empty(struct_size!(TFL_Activity, activity_clock));
        // SAFETY: a live struct with its size set.
        assert!(unsafe { get_activity(&mut t) }.is_null());
        assert!(t.activity_drain.is_some() && t.activity_clock.is_some() && t.range_push.is_none());
        t.struct_size = struct_size!(TFL_Activity, range_mark);
        // SAFETY: as above.
        assert!(unsafe { get_activity(&mut t) }.is_null());
        assert!(t.range_push.is_some() && t.range_pop.is_some() && t.range_mark.is_some());
        t.struct_size = 16;
        // SAFETY: as above; an error object is released.
        let e = unsafe { get_activity(&mut t) };
        assert!(!e.is_null());
        // SAFETY: an error of this plugin, destroyed once.
        unsafe { super::super::error_destroy(e) };
        // SAFETY: NULL is refused.
        let e = unsafe { get_activity(std::ptr::null_mut()) };
        assert!(!e.is_null());
        // SAFETY: as above.
        unsafe { super::super::error_destroy(e) };
    }

    #[test]
    fn drain_arguments_are_checked_before_anything_moves() {
        let r = recorder_with(2);
        let mut buf = [TFL_ActivityRecord::zeroed(); 4];
        let (mut written, mut dropped) = (7usize, 7u64);
        let size = std::mem::size_of::<TFL_ActivityRecord>();
        let p = buf.as_mut_ptr();
        let invalid = ffi::TFL_ERROR_INVALID_ARGUMENT;
        // SAFETY: every call gets a live array of 4 records or NULL.
        unsafe {
            assert_eq!(error_code(drain_into(&r, None, p, 247, 4, &mut written, &mut dropped)), invalid);
            assert_eq!(
                error_code(drain_into(&r, None, p, size, 4, std::ptr::null_mut(), &mut dropped)),
                invalid
            );
            assert_eq!(
                error_code(drain_into(&r, None, p, size, 4, &mut written, std::ptr::null_mut())),
                invalid
            );
            assert_eq!(
                error_code(drain_into(&r, None, std::ptr::null_mut(), size, 4, &mut written, &mut dropped)),
                invalid
            );
            assert_eq!(
                error_code(drain_into(&r, None, p, usize::MAX / 2, 4, &mut written, &mut dropped)),
                invalid
            );
            assert_eq!((written, dropped), (7, 7), "outputs untouched on failure");
            // Capacity 0 with NULL is a valid (empty) drain.
            drain_into(&r, None, std::ptr::null_mut(), size, 0, &mut written, &mut dropped).unwrap();
            assert_eq!(written, 0);
            drain_into(&r, None, p, size, 4, &mut written, &mut dropped).unwrap();
        }
        assert_eq!((written, dropped), (2, 0));
        assert_eq!(buf[0].struct_size, size);
        assert_eq!(buf[1].kind, ffi::TFL_ACTIVITY_API);
        assert_eq!(buf[2].struct_size, 0, "nothing written past the count");
    }

    #[test]
    fn a_larger_host_record_is_strided_and_names_are_terminated() {
        let r = Recorder::new(64);
        r.enable(1 << ffi::TFL_ACTIVITY_MARK).unwrap();
        r.range_mark(&[b'n'; 100]);
        r.range_mark(b"second");
        // A host whose records are 256 bytes (a later minor), at an odd
        // stride: each is written at i * 256, 248 bytes of it.
        let stride = 256;
        let mut raw = vec![0xEEu8; stride * 2 + 1];
        let (mut written, mut dropped) = (0, 0);
        // SAFETY: `raw + 1` holds 2 records of `stride` bytes.
        unsafe {
            drain_into(&r, None, raw.as_mut_ptr().add(1).cast(), stride, 2, &mut written, &mut dropped)
                .unwrap();
        }
        assert_eq!(written, 2);
        let size = std::mem::size_of::<TFL_ActivityRecord>();
        // SAFETY: each record lies within `raw` (read unaligned).
        let (a, b) = unsafe {
            (
                raw.as_ptr().add(1).cast::<TFL_ActivityRecord>().read_unaligned(),
                raw.as_ptr().add(1 + stride).cast::<TFL_ActivityRecord>().read_unaligned(),
            )
        };
        assert_eq!((a.struct_size, b.struct_size), (size, size));
        assert_eq!(raw[1 + size], 0xEE, "bytes past the 1.8 record are left alone");
        let name = |r: &TFL_ActivityRecord| {
            let bytes: Vec<u8> = r.name.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            String::from_utf8(bytes).unwrap()
        };
        assert_eq!(name(&a), "n".repeat(63));
        assert_eq!(a.name[63], 0);
        assert_eq!(name(&b), "second");
        assert_eq!((b.kind, b.start_ns), (ffi::TFL_ACTIVITY_MARK, b.end_ns));
    }

    #[test]
    fn enable_refuses_bits_outside_the_kinds() {
        // SAFETY: plain values; the error is released.
        unsafe {
            let e = activity_enable(1);
            assert!(!e.is_null());
            assert_eq!(super::super::error_code(e), ffi::TFL_ERROR_INVALID_ARGUMENT);
            super::super::error_destroy(e);
        }
    }
}

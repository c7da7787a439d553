//! The `TFL_PluginApi` entries of the device runtime: devices, memory,
//! copies, streams and events, each a thin conversion around a
//! [`Runtime`](crate::runtime::Runtime) method.

use std::ffi::c_void;
use std::ptr::addr_of;

use torchfl_ffi::{self as ffi, struct_size};
use torchfl_ffi::{TFL_CopyArgs, TFL_DeviceProperties, TFL_Error, TFL_Event, TFL_MemoryStats, TFL_Stream};

use super::{check_size, device, event, guard, null_arg, runtime, stream};
use crate::error::Error;
use crate::runtime::{Event, Stream};

// ---------------------------------------------------------------------------
// Devices and memory
// ---------------------------------------------------------------------------

/// # Safety
/// `out` must be NULL or writable.
pub(super) unsafe extern "C" fn device_count(out: *mut i32) -> *mut TFL_Error {
    guard("device_count", || {
        let rt = runtime()?;
        if out.is_null() {
            return Err(null_arg("device_count", "out_count"));
        }
        // SAFETY: non-NULL and writable per the ABI.
        unsafe { out.write(rt.device_count() as i32) };
        Ok(())
    })
}

/// # Safety
/// `out` must be NULL or a `TFL_DeviceProperties` with `struct_size` set.
pub(super) unsafe extern "C" fn device_properties(d: i32, out: *mut TFL_DeviceProperties) -> *mut TFL_Error {
    guard("device_properties", || {
        let rt = runtime()?;
        let dev = rt.device(device(rt, d)?);
        if out.is_null() {
            return Err(null_arg("device_properties", "out"));
        }
        // SAFETY: `out` is valid for the call; fields are written only when
        // the host's struct_size covers them. The name lives as long as
        // the runtime, i.e. the process.
        unsafe {
            let size = rd!(out, struct_size);
            wr!(out, TFL_DeviceProperties, size, name, dev.name.as_ptr());
            wr!(out, TFL_DeviceProperties, size, total_memory, dev.total_memory);
            wr!(out, TFL_DeviceProperties, size, compute_units, dev.compute_units);
            // Pointers are the starts of page-aligned address ranges.
            wr!(out, TFL_DeviceProperties, size, memory_alignment, 4096);
            wr!(out, TFL_DeviceProperties, size, capability_major, dev.version.0);
            wr!(out, TFL_DeviceProperties, size, capability_minor, dev.version.1);
        }
        Ok(())
    })
}

pub(super) unsafe extern "C" fn device_synchronize(d: i32) -> *mut TFL_Error {
    guard("device_synchronize", || {
        let rt = runtime()?;
        rt.synchronize_device(device(rt, d)?)
    })
}

/// # Safety
/// `out` must be NULL or writable.
pub(super) unsafe extern "C" fn allocate(d: i32, nbytes: usize, out: *mut *mut c_void) -> *mut TFL_Error {
    guard("allocate", || {
        let rt = runtime()?;
        if out.is_null() {
            return Err(null_arg("allocate", "out_ptr"));
        }
        let addr = rt.allocate(device(rt, d)?, nbytes)?;
        // SAFETY: non-NULL and writable per the ABI.
        unsafe { out.write(addr as *mut c_void) };
        Ok(())
    })
}

pub(super) unsafe extern "C" fn deallocate(d: i32, p: *mut c_void) -> *mut TFL_Error {
    guard("deallocate", || {
        let rt = runtime()?;
        let d = device(rt, d)?;
        if p.is_null() {
            return Ok(());
        }
        rt.deallocate(d, p as usize)
    })
}

/// # Safety
/// `args` must be NULL or a valid `TFL_CopyArgs` whose host buffers follow
/// the header's lifetime rules.
pub(super) unsafe extern "C" fn copy(args: *const TFL_CopyArgs) -> *mut TFL_Error {
    guard("copy", || {
        let rt = runtime()?;
        if args.is_null() {
            return Err(null_arg("copy", "args"));
        }
        // SAFETY: valid for the call; the size is checked before reading.
        let a = unsafe {
            check_size(addr_of!((*args).struct_size), struct_size!(TFL_CopyArgs, stream), "copy")?;
            args.read()
        };
        // SAFETY: the host passes a stream of this plugin or NULL.
        let s = unsafe { stream(a.stream) };
        match a.kind {
            // SAFETY: host buffers per this function's contract.
            ffi::TFL_COPY_HOST_TO_DEVICE => unsafe {
                rt.copy_to_device(device(rt, a.dst_device)?, a.dst as usize, a.src, a.nbytes, s)
            },
            // SAFETY: as above.
            ffi::TFL_COPY_DEVICE_TO_HOST => unsafe {
                rt.copy_to_host(device(rt, a.src_device)?, a.dst, a.src as usize, a.nbytes, s)
            },
            ffi::TFL_COPY_DEVICE_TO_DEVICE => rt.copy_device(
                device(rt, a.dst_device)?,
                a.dst as usize,
                device(rt, a.src_device)?,
                a.src as usize,
                a.nbytes,
                s,
            ),
            k => Err(Error::invalid(format!("opencl: copy: unknown copy kind {k}"))),
        }
    })
}

/// # Safety
/// `s` must be NULL or a live stream of this plugin.
pub(super) unsafe extern "C" fn set_memory(
    d: i32,
    p: *mut c_void,
    value: u8,
    nbytes: usize,
    s: *mut TFL_Stream,
) -> *mut TFL_Error {
    guard("set_memory", || {
        let rt = runtime()?;
        // SAFETY: per this function's contract.
        rt.set_memory(device(rt, d)?, p as usize, value, nbytes, unsafe { stream(s) })
    })
}

/// # Safety
/// `out` must be NULL or a `TFL_MemoryStats` with `struct_size` set.
pub(super) unsafe extern "C" fn memory_stats(d: i32, out: *mut TFL_MemoryStats) -> *mut TFL_Error {
    guard("memory_stats", || {
        let rt = runtime()?;
        let d = device(rt, d)?;
        if out.is_null() {
            return Err(null_arg("memory_stats", "out"));
        }
        let s = rt.memory_stats(d);
        // SAFETY: valid for the call; fields written as the size allows.
        unsafe {
            let size = rd!(out, struct_size);
            wr!(out, TFL_MemoryStats, size, allocated_bytes, s.allocated);
            wr!(out, TFL_MemoryStats, size, peak_allocated_bytes, s.peak);
            wr!(out, TFL_MemoryStats, size, reserved_bytes, s.allocated);
            wr!(out, TFL_MemoryStats, size, total_bytes, rt.device(d).total_memory);
            wr!(out, TFL_MemoryStats, size, num_allocations, s.allocations);
            wr!(out, TFL_MemoryStats, size, num_frees, s.frees);
            wr!(out, TFL_MemoryStats, size, num_ooms, s.ooms);
        }
        Ok(())
    })
}

pub(super) unsafe extern "C" fn reset_peak_memory_stats(d: i32) -> *mut TFL_Error {
    guard("reset_peak_memory_stats", || {
        let rt = runtime()?;
        rt.reset_peak(device(rt, d)?);
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Streams and events
// ---------------------------------------------------------------------------

/// # Safety
/// `out` must be NULL or writable.
pub(super) unsafe extern "C" fn default_stream(d: i32, out: *mut *mut TFL_Stream) -> *mut TFL_Error {
    guard("default_stream", || {
        let rt = runtime()?;
        let s = rt.default_stream(device(rt, d)?);
        if out.is_null() {
            return Err(null_arg("default_stream", "out"));
        }
        // SAFETY: non-NULL and writable. The default stream lives in the
        // runtime, i.e. for the process.
        unsafe { out.write((s as *const Stream).cast_mut().cast()) };
        Ok(())
    })
}

/// # Safety
/// `out` must be NULL or writable.
pub(super) unsafe extern "C" fn stream_create(
    d: i32,
    _priority: i32,
    out: *mut *mut TFL_Stream,
) -> *mut TFL_Error {
    guard("stream_create", || {
        let rt = runtime()?;
        if out.is_null() {
            return Err(null_arg("stream_create", "out"));
        }
        let s = rt.create_stream(device(rt, d)?)?;
        // SAFETY: non-NULL and writable; the box is released by stream_destroy.
        unsafe { out.write(Box::into_raw(s).cast()) };
        Ok(())
    })
}

/// # Safety
/// `s` must be a stream from `stream_create` (or a default stream, which is refused).
pub(super) unsafe extern "C" fn stream_destroy(s: *mut TFL_Stream) -> *mut TFL_Error {
    guard("stream_destroy", || {
        let rt = runtime()?;
        if s.is_null() {
            return Err(null_arg("stream_destroy", "stream"));
        }
        // SAFETY: a live stream of this plugin; a default stream is handed
        // back un-freed by destroy_stream.
        rt.destroy_stream(unsafe { Box::from_raw(s.cast::<Stream>()) })
    })
}

/// # Safety
/// `s` must be a live stream of this plugin.
pub(super) unsafe extern "C" fn stream_synchronize(s: *mut TFL_Stream) -> *mut TFL_Error {
    guard("stream_synchronize", || {
        // SAFETY: per this function's contract.
        let s = unsafe { stream(s) }.ok_or_else(|| null_arg("stream_synchronize", "stream"))?;
        runtime()?.synchronize_stream(s)
    })
}

/// # Safety
/// `s` must be a live stream of this plugin; `out` NULL or writable.
pub(super) unsafe extern "C" fn stream_query(s: *mut TFL_Stream, out: *mut u8) -> *mut TFL_Error {
    guard("stream_query", || {
        // SAFETY: per this function's contract.
        let s = unsafe { stream(s) }.ok_or_else(|| null_arg("stream_query", "stream"))?;
        if out.is_null() {
            return Err(null_arg("stream_query", "out_complete"));
        }
        let done = runtime()?.query_stream(s)?;
        // SAFETY: non-NULL and writable.
        unsafe { out.write(u8::from(done)) };
        Ok(())
    })
}

/// # Safety
/// `s` and `e` must be live objects of this plugin.
pub(super) unsafe extern "C" fn stream_wait_event(s: *mut TFL_Stream, e: *mut TFL_Event) -> *mut TFL_Error {
    guard("stream_wait_event", || {
        // SAFETY: per this function's contract.
        let s = unsafe { stream(s) }.ok_or_else(|| null_arg("stream_wait_event", "stream"))?;
        // SAFETY: as above.
        let e = unsafe { event(e, "stream_wait_event") }?;
        runtime()?.stream_wait_event(s, e)
    })
}

/// # Safety
/// `out` must be NULL or writable.
pub(super) unsafe extern "C" fn event_create(d: i32, flags: u32, out: *mut *mut TFL_Event) -> *mut TFL_Error {
    guard("event_create", || {
        let rt = runtime()?;
        if out.is_null() {
            return Err(null_arg("event_create", "out"));
        }
        let e = rt.create_event(device(rt, d)?, flags & ffi::TFL_EVENT_TIMING != 0);
        // SAFETY: non-NULL and writable; released by event_destroy.
        unsafe { out.write(Box::into_raw(e).cast()) };
        Ok(())
    })
}

/// # Safety
/// `e` must be an event from `event_create`, destroyed once.
pub(super) unsafe extern "C" fn event_destroy(e: *mut TFL_Event) -> *mut TFL_Error {
    guard("event_destroy", || {
        let rt = runtime()?;
        if e.is_null() {
            return Err(null_arg("event_destroy", "event"));
        }
        // SAFETY: per this function's contract.
        let event = unsafe { Box::from_raw(e.cast::<Event>()) };
        rt.destroy_event(&event);
        Ok(())
    })
}

/// # Safety
/// `e` and `s` must be live objects of this plugin.
pub(super) unsafe extern "C" fn event_record(e: *mut TFL_Event, s: *mut TFL_Stream) -> *mut TFL_Error {
    guard("event_record", || {
        // SAFETY: per this function's contract.
        let (e, s) = unsafe { (event(e, "event_record")?, stream(s)) };
        let s = s.ok_or_else(|| null_arg("event_record", "stream"))?;
        runtime()?.record_event(e, s)
    })
}

/// # Safety
/// `e` must be a live event; `out` NULL or writable.
pub(super) unsafe extern "C" fn event_query(e: *mut TFL_Event, out: *mut u8) -> *mut TFL_Error {
    guard("event_query", || {
        // SAFETY: per this function's contract.
        let e = unsafe { event(e, "event_query") }?;
        if out.is_null() {
            return Err(null_arg("event_query", "out_complete"));
        }
        let done = runtime()?.query_event(e)?;
        // SAFETY: non-NULL and writable.
        unsafe { out.write(u8::from(done)) };
        Ok(())
    })
}

/// # Safety
/// `e` must be a live event.
pub(super) unsafe extern "C" fn event_synchronize(e: *mut TFL_Event) -> *mut TFL_Error {
    guard("event_synchronize", || {
        // SAFETY: per this function's contract.
        runtime()?.synchronize_event(unsafe { event(e, "event_synchronize") }?)
    })
}

/// # Safety
/// `start` and `end` must be live events; `out` NULL or writable.
pub(super) unsafe extern "C" fn event_elapsed_time(
    start: *mut TFL_Event,
    end: *mut TFL_Event,
    out: *mut f32,
) -> *mut TFL_Error {
    guard("event_elapsed_time", || {
        // SAFETY: per this function's contract.
        let (a, b) = unsafe { (event(start, "event_elapsed_time")?, event(end, "event_elapsed_time")?) };
        if out.is_null() {
            return Err(null_arg("event_elapsed_time", "out_ms"));
        }
        let ms = runtime()?.elapsed_ms(a, b)?;
        // SAFETY: non-NULL and writable.
        unsafe { out.write(ms) };
        Ok(())
    })
}

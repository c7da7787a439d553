//! The `TFL_PluginApi` entries other than the op table: errors, identity
//! and lifecycle, devices, memory, streams and events.
//!
//! Each entry only converts: it reads the host's arguments (checking
//! `struct_size` before any field it reads), calls the safe [`Runtime`]
//! under [`guard`], and writes outputs on success. Keeping that shape the
//! same for every entry is what makes the unsafe code here reviewable.

use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::catch_unwind;
use std::ptr::addr_of;
use std::sync::{Mutex, OnceLock, PoisonError};

use torchfl_ffi::{self as ffi, struct_size};
use torchfl_ffi::{
    TFL_CopyArgs, TFL_DeviceProperties, TFL_Error, TFL_Event, TFL_InitArgs, TFL_MemoryStats, TFL_PluginInfo,
    TFL_Stream,
};

use super::{check_size, guard, host_logger, null_arg, opt_stream, runtime, ErrorObject, RUNTIME};
use crate::error::{Error, Result};
use crate::log::LogLevel;
use crate::runtime::config::Config;
use crate::runtime::{capabilities, CopyKind, EventHandle, RawCopy, Runtime, StreamHandle, DEVICE_NAME};

/// Serializes `initialize`, so that one runtime is created however many
/// threads call it.
static INIT_LOCK: Mutex<()> = Mutex::new(());

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// # Safety
/// `error` must be NULL or an error from this plugin not yet destroyed.
pub(super) unsafe extern "C" fn error_code(error: *const TFL_Error) -> i32 {
    if error.is_null() {
        return ffi::TFL_ERROR_UNKNOWN;
    }
    // SAFETY: every TFL_Error this plugin creates is a boxed ErrorObject.
    unsafe { (*error.cast::<ErrorObject>()).code }
}

/// # Safety
/// As for [`error_code`]; the message lives until `error_destroy`.
pub(super) unsafe extern "C" fn error_message(error: *const TFL_Error) -> *const c_char {
    if error.is_null() {
        return c"sim: NULL error".as_ptr();
    }
    // SAFETY: as in `error_code`.
    unsafe { (*error.cast::<ErrorObject>()).message.as_ptr() }
}

/// # Safety
/// `error` must be NULL or an error from this plugin, destroyed only once.
pub(super) unsafe extern "C" fn error_destroy(error: *mut TFL_Error) {
    if !error.is_null() {
        // SAFETY: created by `into_raw` from a Box<ErrorObject>.
        drop(unsafe { Box::from_raw(error.cast::<ErrorObject>()) });
    }
}

// ---------------------------------------------------------------------------
// Identity and lifecycle
// ---------------------------------------------------------------------------

/// `TFL_PluginInfo` pointing at static strings only.
struct Published(TFL_PluginInfo);
// SAFETY: the pointers in the info are to immutable 'static C strings.
unsafe impl Sync for Published {}
// SAFETY: as above.
unsafe impl Send for Published {}

/// The identity with `capabilities` for `config`. The strings are static;
/// only the capabilities differ between configurations.
fn info_for(capabilities: u64) -> Published {
    Published(TFL_PluginInfo {
        struct_size: struct_size!(TFL_PluginInfo, capabilities),
        name: c"sim".as_ptr(),
        vendor: c"torch-fl project".as_ptr(),
        chip_family: c"simulated".as_ptr(),
        plugin_version: concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast(),
        min_torch_version: c"2.4".as_ptr(),
        capabilities,
    })
}

/// Before `initialize`: the capabilities under default options (the
/// environment), as the header asks.
static INFO_DEFAULT: OnceLock<Published> = OnceLock::new();
/// After `initialize`: the capabilities of the runtime actually created
/// (options such as `strict=1` or `mode=sync` change them). The host reads
/// capabilities again once initialize has returned.
static INFO_INITIALIZED: OnceLock<Published> = OnceLock::new();

pub(super) unsafe extern "C" fn get_info() -> *const TFL_PluginInfo {
    if let Some(info) = INFO_INITIALIZED.get() {
        return &info.0;
    }
    let info = INFO_DEFAULT.get_or_init(|| {
        // A malformed environment is reported by initialize; the identity
        // is still needed to say which plugin failed.
        let caps = catch_unwind(|| capabilities(&Config::from_env().unwrap_or_default())).unwrap_or(0);
        info_for(caps)
    });
    &info.0
}

/// The plugin options string `initialize` and `probe_devices` get:
/// `None` for NULL.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string valid for `'a`.
unsafe fn options_str<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: per the contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(Some).map_err(|_| Error::invalid(format!("sim: {what}: options are not valid UTF-8")))
}

/// 1.6: the device count `initialize(options)` would configure (options
/// and `TORCH_FL_SIM_DEVICES` resolved as it resolves them), without
/// creating a runtime.
///
/// # Safety
/// `options` must be NULL or a NUL-terminated string; `out_count` NULL or
/// writable.
pub(super) unsafe extern "C" fn probe_devices(options: *const c_char, out_count: *mut i32) -> *mut TFL_Error {
    guard("probe_devices", || {
        if out_count.is_null() {
            return Err(null_arg("probe_devices", "out_count"));
        }
        // SAFETY: NULL or a NUL-terminated string for the call (contract).
        let options = unsafe { options_str(options, "probe_devices")? };
        let config = Config::resolve(options)?;
        // SAFETY: non-NULL and writable per the contract; written on success only.
        unsafe { out_count.write(i32::try_from(config.devices).unwrap_or(i32::MAX)) };
        Ok(())
    })
}

/// # Safety
/// `args` must be NULL or point to a `TFL_InitArgs` valid for the call.
pub(super) unsafe extern "C" fn initialize(args: *const TFL_InitArgs) -> *mut TFL_Error {
    guard("initialize", || {
        let _init = INIT_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        if RUNTIME.get().is_some() {
            return Err(Error::precondition("sim: initialize was already called"));
        }
        let options = if args.is_null() {
            None
        } else {
            // SAFETY: `args` is valid for the call; its size is checked
            // before `options` is read, and a non-NULL `options` is a
            // NUL-terminated string borrowed for the call.
            unsafe {
                check_size(addr_of!((*args).struct_size), struct_size!(TFL_InitArgs, options), "initialize")?;
                options_str(rd!(args, options), "initialize")?
            }
        };
        let config = Config::resolve(options)?;
        let log = host_logger();
        let rt = Runtime::with_logger(config.clone(), log.clone())?;
        if let Some(log) = log {
            log.log(
                LogLevel::Info,
                &format!(
                    "sim: {} simulated device(s), {} bytes each, mode={:?}, strict={}",
                    config.devices, config.memory, config.mode, config.strict
                ),
            );
        }
        let caps = capabilities(&config);
        RUNTIME.set(rt).map_err(|_| Error::precondition("sim: initialize was already called"))?;
        // Set once, under INIT_LOCK, right after the runtime it describes.
        let _ = INFO_INITIALIZED.set(info_for(caps));
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------

fn device(rt: &Runtime, device: i32) -> Result<usize> {
    rt.check_device(i64::from(device))
}

/// # Safety
/// `out_count` must be NULL or valid for a write.
pub(super) unsafe extern "C" fn device_count(out_count: *mut i32) -> *mut TFL_Error {
    guard("device_count", || {
        let rt = runtime()?;
        if out_count.is_null() {
            return Err(null_arg("device_count", "out_count"));
        }
        // SAFETY: non-NULL and valid for a write per the ABI.
        unsafe { out_count.write(rt.device_count() as i32) };
        Ok(())
    })
}

/// # Safety
/// `out` must be NULL or point to a `TFL_DeviceProperties` whose
/// `struct_size` is set.
pub(super) unsafe extern "C" fn device_properties(
    dev: i32,
    out: *mut TFL_DeviceProperties,
) -> *mut TFL_Error {
    guard("device_properties", || {
        let rt = runtime()?;
        let p = rt.device_properties(device(rt, dev)?)?;
        if out.is_null() {
            return Err(null_arg("device_properties", "out"));
        }
        static NAME: OnceLock<CString> = OnceLock::new();
        let name = NAME.get_or_init(|| CString::new(DEVICE_NAME).unwrap_or_default());
        // SAFETY: `out` is valid for the call; fields are written only when
        // the host's struct_size covers them.
        unsafe {
            let size = rd!(out, struct_size);
            wr!(out, TFL_DeviceProperties, size, name, name.as_ptr());
            wr!(out, TFL_DeviceProperties, size, total_memory, p.total_memory);
            wr!(out, TFL_DeviceProperties, size, compute_units, p.compute_units);
            wr!(out, TFL_DeviceProperties, size, memory_alignment, p.memory_alignment);
            wr!(out, TFL_DeviceProperties, size, capability_major, p.capability.0);
            wr!(out, TFL_DeviceProperties, size, capability_minor, p.capability.1);
        }
        Ok(())
    })
}

pub(super) unsafe extern "C" fn device_synchronize(dev: i32) -> *mut TFL_Error {
    guard("device_synchronize", || {
        let rt = runtime()?;
        rt.synchronize_device(device(rt, dev)?)
    })
}

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

/// # Safety
/// `out_ptr` must be NULL or valid for a write.
pub(super) unsafe extern "C" fn allocate(
    dev: i32,
    nbytes: usize,
    out_ptr: *mut *mut c_void,
) -> *mut TFL_Error {
    guard("allocate", || {
        let rt = runtime()?;
        let d = device(rt, dev)?;
        if out_ptr.is_null() {
            return Err(null_arg("allocate", "out_ptr"));
        }
        let p = rt.allocate(d, nbytes)?;
        // SAFETY: non-NULL and valid for a write per the ABI.
        unsafe { out_ptr.write(p as usize as *mut c_void) };
        Ok(())
    })
}

pub(super) unsafe extern "C" fn deallocate(dev: i32, p: *mut c_void) -> *mut TFL_Error {
    guard("deallocate", || {
        let rt = runtime()?;
        rt.deallocate(device(rt, dev)?, p as usize as u64)
    })
}

/// # Safety
/// `out_ptr` must be NULL or valid for a write.
pub(super) unsafe extern "C" fn host_allocate(nbytes: usize, out_ptr: *mut *mut c_void) -> *mut TFL_Error {
    guard("host_allocate", || {
        let rt = runtime()?;
        if out_ptr.is_null() {
            return Err(null_arg("host_allocate", "out_ptr"));
        }
        let p = rt.host_allocate(nbytes)?;
        // SAFETY: non-NULL and valid for a write per the ABI.
        unsafe { out_ptr.write(p as usize as *mut c_void) };
        Ok(())
    })
}

pub(super) unsafe extern "C" fn host_deallocate(p: *mut c_void) -> *mut TFL_Error {
    guard("host_deallocate", || runtime()?.host_deallocate(p as usize as u64))
}

fn stream_handle(s: *mut TFL_Stream, what: &str) -> Result<StreamHandle> {
    opt_stream(s).ok_or_else(|| null_arg(what, "stream"))
}

fn event_handle(e: *mut TFL_Event, what: &str, name: &str) -> Result<EventHandle> {
    EventHandle::from_raw(e as usize as u64).ok_or_else(|| null_arg(what, name))
}

/// # Safety
/// `args` must be NULL or a valid `TFL_CopyArgs`; its host buffers must
/// satisfy the header's rules (valid for `nbytes`, and until the stream has
/// run the copy when a stream is given).
pub(super) unsafe extern "C" fn copy(args: *const TFL_CopyArgs) -> *mut TFL_Error {
    guard("copy", || {
        let rt = runtime()?;
        if args.is_null() {
            return Err(null_arg("copy", "args"));
        }
        // SAFETY: `args` is valid for the call and its size is checked
        // before the fields are read.
        let a = unsafe {
            check_size(addr_of!((*args).struct_size), struct_size!(TFL_CopyArgs, stream), "copy")?;
            args.read()
        };
        let kind = match a.kind {
            ffi::TFL_COPY_HOST_TO_DEVICE => CopyKind::HostToDevice,
            ffi::TFL_COPY_DEVICE_TO_HOST => CopyKind::DeviceToHost,
            ffi::TFL_COPY_DEVICE_TO_DEVICE => CopyKind::DeviceToDevice,
            k => return Err(Error::invalid(format!("sim: copy: unknown copy kind {k}"))),
        };
        let dst_device = match kind {
            CopyKind::DeviceToHost => 0,
            _ => device(rt, a.dst_device)?,
        };
        let src_device = match kind {
            CopyKind::HostToDevice => 0,
            _ => device(rt, a.src_device)?,
        };
        let c = RawCopy {
            kind,
            dst_device,
            src_device,
            dst: a.dst as usize as u64,
            src: a.src as usize as u64,
            nbytes: a.nbytes,
            stream: opt_stream(a.stream),
        };
        if super::graphs::record_copy(rt, c) {
            return Ok(()); // a capturing stream (ABI 1.7 graphs)
        }
        // SAFETY: the host's buffers follow the header's lifetime rules
        // (this function's contract); device pointers are validated inside.
        unsafe { rt.copy_raw(&c) }
    })
}

pub(super) unsafe extern "C" fn set_memory(
    dev: i32,
    p: *mut c_void,
    value: u8,
    nbytes: usize,
    stream: *mut TFL_Stream,
) -> *mut TFL_Error {
    guard("set_memory", || {
        let rt = runtime()?;
        rt.set_memory(device(rt, dev)?, p as usize as u64, value, nbytes, opt_stream(stream))
    })
}

// ---------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------

/// # Safety
/// `out` must be NULL or valid for a write.
pub(super) unsafe extern "C" fn default_stream(dev: i32, out: *mut *mut TFL_Stream) -> *mut TFL_Error {
    guard("default_stream", || {
        let rt = runtime()?;
        let h = rt.default_stream(device(rt, dev)?)?;
        if out.is_null() {
            return Err(null_arg("default_stream", "out"));
        }
        // SAFETY: non-NULL and valid for a write per the ABI.
        unsafe { out.write(h.to_raw() as usize as *mut TFL_Stream) };
        Ok(())
    })
}

/// # Safety
/// `out` must be NULL or valid for a write.
pub(super) unsafe extern "C" fn stream_create(
    dev: i32,
    priority: i32,
    out: *mut *mut TFL_Stream,
) -> *mut TFL_Error {
    guard("stream_create", || {
        let rt = runtime()?;
        let d = device(rt, dev)?;
        if out.is_null() {
            return Err(null_arg("stream_create", "out"));
        }
        let h = rt.create_stream(d, priority)?;
        // SAFETY: non-NULL and valid for a write per the ABI.
        unsafe { out.write(h.to_raw() as usize as *mut TFL_Stream) };
        Ok(())
    })
}

pub(super) unsafe extern "C" fn stream_destroy(stream: *mut TFL_Stream) -> *mut TFL_Error {
    guard("stream_destroy", || runtime()?.destroy_stream(stream_handle(stream, "stream_destroy")?))
}

pub(super) unsafe extern "C" fn stream_synchronize(stream: *mut TFL_Stream) -> *mut TFL_Error {
    guard("stream_synchronize", || {
        runtime()?.synchronize_stream(stream_handle(stream, "stream_synchronize")?)
    })
}

/// # Safety
/// `out_complete` must be NULL or valid for a write.
pub(super) unsafe extern "C" fn stream_query(
    stream: *mut TFL_Stream,
    out_complete: *mut u8,
) -> *mut TFL_Error {
    guard("stream_query", || {
        let done = runtime()?.query_stream(stream_handle(stream, "stream_query")?)?;
        if out_complete.is_null() {
            return Err(null_arg("stream_query", "out_complete"));
        }
        // SAFETY: non-NULL and valid for a write per the ABI.
        unsafe { out_complete.write(u8::from(done)) };
        Ok(())
    })
}

pub(super) unsafe extern "C" fn stream_wait_event(
    stream: *mut TFL_Stream,
    event: *mut TFL_Event,
) -> *mut TFL_Error {
    guard("stream_wait_event", || {
        runtime()?.stream_wait_event(
            stream_handle(stream, "stream_wait_event")?,
            event_handle(event, "stream_wait_event", "event")?,
        )
    })
}

// ---------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------

/// # Safety
/// `out` must be NULL or valid for a write.
pub(super) unsafe extern "C" fn event_create(
    dev: i32,
    flags: u32,
    out: *mut *mut TFL_Event,
) -> *mut TFL_Error {
    guard("event_create", || {
        let rt = runtime()?;
        let d = device(rt, dev)?;
        if out.is_null() {
            return Err(null_arg("event_create", "out"));
        }
        let h = rt.create_event(d, flags & ffi::TFL_EVENT_TIMING != 0)?;
        // SAFETY: non-NULL and valid for a write per the ABI.
        unsafe { out.write(h.to_raw() as usize as *mut TFL_Event) };
        Ok(())
    })
}

pub(super) unsafe extern "C" fn event_destroy(event: *mut TFL_Event) -> *mut TFL_Error {
    guard("event_destroy", || runtime()?.destroy_event(event_handle(event, "event_destroy", "event")?))
}

pub(super) unsafe extern "C" fn event_record(
    event: *mut TFL_Event,
    stream: *mut TFL_Stream,
) -> *mut TFL_Error {
    guard("event_record", || {
        runtime()?.record_event(
            event_handle(event, "event_record", "event")?,
            stream_handle(stream, "event_record")?,
        )
    })
}

/// # Safety
/// `out_complete` must be NULL or valid for a write.
pub(super) unsafe extern "C" fn event_query(event: *mut TFL_Event, out_complete: *mut u8) -> *mut TFL_Error {
    guard("event_query", || {
        let done = runtime()?.query_event(event_handle(event, "event_query", "event")?)?;
        if out_complete.is_null() {
            return Err(null_arg("event_query", "out_complete"));
        }
        // SAFETY: non-NULL and valid for a write per the ABI.
        unsafe { out_complete.write(u8::from(done)) };
        Ok(())
    })
}

pub(super) unsafe extern "C" fn event_synchronize(event: *mut TFL_Event) -> *mut TFL_Error {
    guard("event_synchronize", || {
        runtime()?.synchronize_event(event_handle(event, "event_synchronize", "event")?)
    })
}

/// # Safety
/// `out_ms` must be NULL or valid for a write.
pub(super) unsafe extern "C" fn event_elapsed_time(
    start: *mut TFL_Event,
    end: *mut TFL_Event,
    out_ms: *mut f32,
) -> *mut TFL_Error {
    guard("event_elapsed_time", || {
        let ms = runtime()?.elapsed_time(
            event_handle(start, "event_elapsed_time", "start")?,
            event_handle(end, "event_elapsed_time", "end")?,
        )?;
        if out_ms.is_null() {
            return Err(null_arg("event_elapsed_time", "out_ms"));
        }
        // SAFETY: non-NULL and valid for a write per the ABI.
        unsafe { out_ms.write(ms) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Optional memory entries
// ---------------------------------------------------------------------------

/// # Safety
/// `out` must be NULL or point to a `TFL_MemoryStats` whose `struct_size`
/// is set.
pub(super) unsafe extern "C" fn memory_stats(dev: i32, out: *mut TFL_MemoryStats) -> *mut TFL_Error {
    guard("memory_stats", || {
        let rt = runtime()?;
        let s = rt.memory_stats(device(rt, dev)?)?;
        if out.is_null() {
            return Err(null_arg("memory_stats", "out"));
        }
        // SAFETY: `out` is valid for the call; fields are written only when
        // the host's struct_size covers them.
        unsafe {
            let size = rd!(out, struct_size);
            wr!(out, TFL_MemoryStats, size, allocated_bytes, s.allocated_bytes);
            wr!(out, TFL_MemoryStats, size, peak_allocated_bytes, s.peak_allocated_bytes);
            wr!(out, TFL_MemoryStats, size, reserved_bytes, s.reserved_bytes);
            wr!(out, TFL_MemoryStats, size, total_bytes, s.total_bytes);
            wr!(out, TFL_MemoryStats, size, num_allocations, s.num_allocations);
            wr!(out, TFL_MemoryStats, size, num_frees, s.num_frees);
            wr!(out, TFL_MemoryStats, size, num_ooms, s.num_ooms);
        }
        Ok(())
    })
}

pub(super) unsafe extern "C" fn reset_peak_memory_stats(dev: i32) -> *mut TFL_Error {
    guard("reset_peak_memory_stats", || {
        let rt = runtime()?;
        rt.reset_peak_memory_stats(device(rt, dev)?)
    })
}

pub(super) unsafe extern "C" fn empty_cache(dev: i32) -> *mut TFL_Error {
    guard("empty_cache", || {
        let rt = runtime()?;
        rt.empty_cache(device(rt, dev)?)
    })
}

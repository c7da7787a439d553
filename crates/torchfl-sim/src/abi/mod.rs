//! The C ABI: the bootstrap symbol, the `TFL_PluginApi` table, the op table
//! and the exported kernels.
//!
//! This module tree is the only place with `extern "C"` functions, raw
//! pointers from the host and `catch_unwind`. Every entry follows the same
//! shape: run the body under [`guard`] (a panic becomes `TFL_ERROR_INTERNAL`, never an
//! unwind into C), read the host's structs field by field after checking
//! their `struct_size` (a struct from an older host may be shorter than
//! ours, so no reference to a whole struct is ever formed), convert
//! everything into Rust values, call the safe [`Runtime`], and write
//! outputs only on success.
//!
//! Kernels are the hot path, so their frames are decoded without copies or
//! allocations: tensors' shape and stride arrays (and int/float lists) are
//! borrowed from the host for the duration of the call, which the header
//! guarantees, and error context such as `argument 2` is only formatted
//! when an error is reported.
//!
//! One process-wide runtime backs the ABI; it is created by `initialize`.
//!
//! It has two halves, which share only what this file defines (the error
//! objects and the panic guard, field access to the host's structs, the
//! process-wide state and the bootstrap):
//! - [`runtime_entries`]: the `TFL_PluginApi` functions (errors, identity
//!   and lifecycle, devices, memory, streams, events), each a thin
//!   conversion around a [`Runtime`] method, and the extension tables'
//!   entries beside it (`collectives`, `graphs`, `activity`);
//! - the kernels: [`frame`] decodes a host `TFL_CallFrame` into a borrowed
//!   [`Frame`](crate::kernels::Frame), and [`op_table`] expands the op table
//!   into the exported kernels, the `TFL_OpEntry` table and the custom
//!   operators' infer functions.

use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use torchfl_ffi::{self as ffi, has_field, struct_size};
use torchfl_ffi::{TFL_Error, TFL_HostApi, TFL_PluginApi, TFL_Stream};

use crate::error::{Error, Result};
use crate::log::{LogLevel, Logger};
use crate::runtime::{Runtime, StreamHandle};

// ---------------------------------------------------------------------------
// Errors and the panic guard
// ---------------------------------------------------------------------------

/// What a `*mut TFL_Error` points to.
struct ErrorObject {
    code: i32,
    message: CString,
}

fn into_raw(e: Error) -> *mut TFL_Error {
    let message = CString::new(e.message().replace('\0', "\\0")).unwrap_or_default();
    Box::into_raw(Box::new(ErrorObject { code: e.code().to_ffi(), message })).cast()
}

/// Runs `f`, converting an error or a panic into an error object.
fn guard(what: &str, f: impl FnOnce() -> Result<()>) -> *mut TFL_Error {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ptr::null_mut(),
        Ok(Err(e)) => into_raw(e),
        Err(payload) => into_raw(Error::from_panic(what, payload.as_ref())),
    }
}

fn null_arg(what: &str, name: &str) -> Error {
    Error::invalid(format!("sim: {what}: {name} is NULL"))
}

// ---------------------------------------------------------------------------
// Field access to the host's structs
// ---------------------------------------------------------------------------

/// Reads field `$f` of the struct at raw pointer `$p` without forming a
/// reference to the whole struct. The caller's `unsafe` block must
/// establish that the field is within the host's allocation.
macro_rules! rd {
    ($p:expr, $f:ident) => {
        ::std::ptr::addr_of!((*$p).$f).read()
    };
}

/// Writes field `$f` of the struct at `$p` if the host's `$size` covers it.
macro_rules! wr {
    ($p:expr, $ty:ty, $size:expr, $f:ident, $v:expr) => {
        if ::torchfl_ffi::has_field!($ty, $f, $size) {
            ::std::ptr::addr_of_mut!((*$p).$f).write($v);
        }
    };
}

// Declared after the macros above, which they use.
mod activity;
mod collectives;
mod frame;
mod graphs;
mod op_table;
mod runtime_entries;
#[cfg(test)]
mod tests;

/// Reads and checks a struct's `struct_size` against the 1.0 layout.
///
/// # Safety
/// `size_ptr` must point to a readable `size_t` (the first field).
unsafe fn check_size(size_ptr: *const usize, min: usize, what: &str) -> Result<usize> {
    // SAFETY: forwarded contract.
    let size = unsafe { size_ptr.read() };
    if size < min {
        return Err(Error::invalid(format!(
            "sim: {what}: struct_size {size} is smaller than the ABI 1.0 size {min}"
        )));
    }
    Ok(size)
}

// ---------------------------------------------------------------------------
// Global state
// ---------------------------------------------------------------------------

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static HOST: AtomicPtr<TFL_HostApi> = AtomicPtr::new(ptr::null_mut());
static API: OnceLock<TFL_PluginApi> = OnceLock::new();

fn runtime() -> Result<&'static Runtime> {
    RUNTIME.get().ok_or_else(|| Error::precondition("sim: call initialize first"))
}

fn host_logger() -> Option<Logger> {
    let host = HOST.load(Ordering::Acquire);
    if host.is_null() {
        return None;
    }
    // SAFETY: the host guarantees its TFL_HostApi is valid and unchanged for
    // the life of the process; its size is checked before reading `log`.
    let (log, context) = unsafe {
        let size = rd!(host, struct_size);
        if !has_field!(TFL_HostApi, log, size) {
            return None;
        }
        (rd!(host, log)?, rd!(host, context) as usize)
    };
    Some(Logger::new(move |level, message| {
        let level = match level {
            LogLevel::Debug => ffi::TFL_LOG_DEBUG,
            LogLevel::Info => ffi::TFL_LOG_INFO,
            LogLevel::Warning => ffi::TFL_LOG_WARNING,
            LogLevel::Error => ffi::TFL_LOG_ERROR,
        };
        let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the host's log is thread-safe and borrows the message.
        unsafe { log(context as *mut c_void, level, text.as_ptr()) };
    }))
}

/// The ABI minor of the host that bootstrapped the plugin; `None` before
/// the bootstrap or when it passed no host table.
fn host_abi_minor() -> Option<u32> {
    let host = HOST.load(Ordering::Acquire);
    if host.is_null() {
        return None;
    }
    // SAFETY: the host guarantees its TFL_HostApi is valid and unchanged for
    // the life of the process; `abi_minor` is at a fixed offset in every
    // version.
    Some(unsafe { rd!(host, abi_minor) })
}

/// The stream a host handle names; `None` for NULL.
fn opt_stream(s: *mut TFL_Stream) -> Option<StreamHandle> {
    StreamHandle::from_raw(s as usize as u64)
}

// ---------------------------------------------------------------------------
// Bootstrap
// ---------------------------------------------------------------------------

/// The bootstrap function (`TFL_BOOTSTRAP_SYMBOL`): remembers the host's
/// service table and returns the plugin's function table. Safe to call
/// more than once and from any thread.
///
/// # Safety
/// `host` must be NULL or point to a `TFL_HostApi` that stays valid and
/// unchanged for the life of the process.
#[no_mangle]
pub unsafe extern "C" fn torch_fl_plugin_get_api(host: *const TFL_HostApi) -> *const TFL_PluginApi {
    if !host.is_null() {
        HOST.store(host.cast_mut(), Ordering::Release);
    }
    API.get_or_init(api_table) as *const TFL_PluginApi
}

/// A debug query outside the ABI: writes up to `len` counters of the
/// simulator's pinned host memory and host copies to `out`, in this order:
/// `host_allocate` calls, `host_deallocate` calls, live pinned bytes, copies
/// charged at pinned bandwidth, copies charged at pageable bandwidth (the
/// last two count only while a cost model is on; see
/// [`crate::HostMemoryStats`]). Returns how many it wrote: 0 before
/// `initialize` or for a NULL `out`. Tests reach it through `ctypes`.
///
/// # Safety
/// `out` must be NULL or valid for writes of `len` `u64`s.
#[no_mangle]
pub unsafe extern "C" fn torch_fl_sim_debug_host_memory(out: *mut u64, len: usize) -> usize {
    let Some(rt) = RUNTIME.get() else { return 0 };
    if out.is_null() {
        return 0;
    }
    let s = rt.host_memory_stats();
    let values = [s.allocations, s.frees, s.live_bytes, s.pinned_copies, s.pageable_copies];
    let n = len.min(values.len());
    // SAFETY: `out` is valid for `len >= n` writes per the contract.
    unsafe { ptr::copy_nonoverlapping(values.as_ptr(), out, n) };
    n
}

fn api_table() -> TFL_PluginApi {
    use op_table::get_op_table;
    use runtime_entries::*;
    TFL_PluginApi {
        struct_size: struct_size!(TFL_PluginApi, get_activity),
        abi_major: ffi::TFL_ABI_VERSION_MAJOR,
        abi_minor: ffi::TFL_ABI_VERSION_MINOR,
        error_code: Some(error_code),
        error_message: Some(error_message),
        error_destroy: Some(error_destroy),
        get_info: Some(get_info),
        initialize: Some(initialize),
        get_op_table: Some(get_op_table),
        device_count: Some(device_count),
        device_properties: Some(device_properties),
        device_synchronize: Some(device_synchronize),
        allocate: Some(allocate),
        deallocate: Some(deallocate),
        copy: Some(copy),
        set_memory: Some(set_memory),
        default_stream: Some(default_stream),
        stream_create: Some(stream_create),
        stream_destroy: Some(stream_destroy),
        stream_synchronize: Some(stream_synchronize),
        stream_query: Some(stream_query),
        stream_wait_event: Some(stream_wait_event),
        event_create: Some(event_create),
        event_destroy: Some(event_destroy),
        event_record: Some(event_record),
        event_query: Some(event_query),
        event_synchronize: Some(event_synchronize),
        event_elapsed_time: Some(event_elapsed_time),
        memory_stats: Some(memory_stats),
        reset_peak_memory_stats: Some(reset_peak_memory_stats),
        empty_cache: Some(empty_cache),
        get_collectives: Some(collectives::get_collectives),
        host_allocate: Some(host_allocate),
        host_deallocate: Some(host_deallocate),
        probe_devices: Some(probe_devices),
        get_graphs: Some(graphs::get_graphs),
        get_activity: Some(activity::get_activity),
    }
}

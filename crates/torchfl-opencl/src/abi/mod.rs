//! The C ABI: the bootstrap symbol, the `TFL_PluginApi` table, the op table
//! and the exported kernels. The only module tree with `extern "C"`
//! functions and raw pointers from the host: this file holds what both
//! halves share (error objects, the panic guard, field access, the
//! process-wide state, identity and initialization), [`runtime_entries`]
//! the device runtime's entries, [`op_table`] the kernels.
//!
//! Every entry has one shape, the simulator's: the body runs under
//! [`guard`] (a panic becomes `TFL_ERROR_INTERNAL`, never an unwind into
//! C), host structs are read field by field after their `struct_size` is
//! checked, and outputs are written only on success.

use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, addr_of};
use std::sync::{Mutex, OnceLock, PoisonError};

use torchfl_ffi::{self as ffi, struct_size};
use torchfl_ffi::{
    TFL_Error, TFL_Event, TFL_HostApi, TFL_InitArgs, TFL_PluginApi, TFL_PluginInfo, TFL_Stream,
};

use crate::error::{Error, Result};
use crate::kernels::ProgramCache;
use crate::runtime::{Event, Runtime, Stream};

// ---------------------------------------------------------------------------
// Errors, the panic guard, field access
// ---------------------------------------------------------------------------

/// What a `*mut TFL_Error` points to.
struct ErrorObject {
    code: i32,
    message: CString,
}

fn into_raw(e: Error) -> *mut TFL_Error {
    let message = CString::new(e.message().replace('\0', "\\0")).unwrap_or_default();
    Box::into_raw(Box::new(ErrorObject { code: e.code(), message })).cast()
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
    Error::invalid(format!("opencl: {what}: {name} is NULL"))
}

/// Reads field `$f` of the struct at `$p` without a reference to the whole
/// struct; the caller's `unsafe` block establishes the field is readable.
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

/// Reads a struct's `struct_size` and checks it covers `min` bytes.
///
/// # Safety
/// `size_ptr` must point to a readable `size_t`.
unsafe fn check_size(size_ptr: *const usize, min: usize, what: &str) -> Result<usize> {
    // SAFETY: forwarded contract.
    let size = unsafe { size_ptr.read() };
    if size < min {
        return Err(Error::invalid(format!(
            "opencl: {what}: struct_size {size} is smaller than the ABI 1.0 size {min}"
        )));
    }
    Ok(size)
}

// Declared after the macros above, which they use.
mod activity_entries;
mod frame;
mod op_table;
mod ops;
mod runtime_entries;

// ---------------------------------------------------------------------------
// Process-wide state
// ---------------------------------------------------------------------------

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static PROGRAMS: OnceLock<ProgramCache> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());
static API: OnceLock<TFL_PluginApi> = OnceLock::new();

fn runtime() -> Result<&'static Runtime> {
    RUNTIME.get().ok_or_else(|| Error::precondition("opencl: call initialize first"))
}

fn device(rt: &Runtime, d: i32) -> Result<usize> {
    rt.check_device(d)
}

/// A stream handle from the host: one this plugin returned.
///
/// # Safety
/// `s` must be NULL or a stream from `default_stream`/`stream_create` not
/// yet destroyed (the ABI's contract on the host).
unsafe fn stream<'a>(s: *mut TFL_Stream) -> Option<&'a Stream> {
    // SAFETY: per the contract, a live boxed Stream.
    unsafe { s.cast::<Stream>().as_ref() }
}

/// # Safety
/// As for [`stream`], for events.
unsafe fn event<'a>(e: *mut TFL_Event, what: &str) -> Result<&'a Event> {
    // SAFETY: per the contract, a live boxed Event.
    unsafe { e.cast::<Event>().as_ref() }.ok_or_else(|| null_arg(what, "event"))
}

// ---------------------------------------------------------------------------
// Bootstrap and identity
// ---------------------------------------------------------------------------

/// The bootstrap function (`TFL_BOOTSTRAP_SYMBOL`).
///
/// # Safety
/// `host` must be NULL or a `TFL_HostApi` valid for the life of the process.
#[no_mangle]
pub unsafe extern "C" fn torch_fl_plugin_get_api(_host: *const TFL_HostApi) -> *const TFL_PluginApi {
    API.get_or_init(api_table) as *const TFL_PluginApi
}

struct Published(TFL_PluginInfo);
// SAFETY: the info points at immutable 'static C strings only.
unsafe impl Sync for Published {}
// SAFETY: as above.
unsafe impl Send for Published {}

/// Streams run asynchronously and events carry the device's profiling
/// timestamps. Device memory is not host-addressable: the host copies for
/// CPU fallbacks. No caching: clCreateBuffer is expensive, so the host's
/// caching allocator sits on top.
const BASE_CAPABILITIES: u64 = ffi::TFL_CAP_ASYNC_STREAMS | ffi::TFL_CAP_EVENT_TIMING;

fn info(capabilities: u64) -> Published {
    Published(TFL_PluginInfo {
        struct_size: struct_size!(TFL_PluginInfo, capabilities),
        // The device name, so that a plugin package's entry point (named
        // after the device) and the plugin agree: `opencl` itself is one
        // of PyTorch's device types and cannot name a custom device.
        name: c"ocl".as_ptr(),
        vendor: c"torch-fl project".as_ptr(),
        chip_family: c"OpenCL".as_ptr(),
        plugin_version: concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast(),
        min_torch_version: c"2.4".as_ptr(),
        capabilities,
    })
}

static INFO_DEFAULT: OnceLock<Published> = OnceLock::new();
static INFO_INITIALIZED: OnceLock<Published> = OnceLock::new();

unsafe extern "C" fn get_info() -> *const TFL_PluginInfo {
    if let Some(i) = INFO_INITIALIZED.get() {
        return &i.0;
    }
    // Before initialize: float16 is not known until the devices are.
    &INFO_DEFAULT.get_or_init(|| info(BASE_CAPABILITIES)).0
}

/// # Safety
/// `args` must be NULL or a `TFL_InitArgs` valid for the call.
unsafe extern "C" fn initialize(args: *const TFL_InitArgs) -> *mut TFL_Error {
    guard("initialize", || {
        let _init = INIT_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        if RUNTIME.get().is_some() {
            return Err(Error::precondition("opencl: initialize was already called"));
        }
        let options = if args.is_null() {
            None
        } else {
            // SAFETY: valid for the call; the size is checked before
            // `options`, a NUL-terminated string when non-NULL.
            unsafe {
                check_size(addr_of!((*args).struct_size), struct_size!(TFL_InitArgs, options), "initialize")?;
                options_str(rd!(args, options), "initialize")?
            }
        };
        let rt = Runtime::new(options)?;
        let fp16 = if rt.all_fp16() { ffi::TFL_CAP_FLOAT16 } else { 0 };
        RUNTIME.set(rt).map_err(|_| Error::precondition("opencl: initialize was already called"))?;
        let _ = INFO_INITIALIZED.set(info(BASE_CAPABILITIES | fp16));
        Ok(())
    })
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
    s.to_str().map(Some).map_err(|_| Error::invalid(format!("opencl: {what}: options are not UTF-8")))
}

/// 1.6: the devices `initialize(options)` would open, from the platform and
/// device enumeration alone (no context, queue or build), so that the host
/// can choose among installed plugins by the hardware present.
///
/// # Safety
/// `options` must be NULL or a NUL-terminated string; `out_count` NULL or
/// writable.
unsafe extern "C" fn probe_devices(options: *const c_char, out_count: *mut i32) -> *mut TFL_Error {
    guard("probe_devices", || {
        if out_count.is_null() {
            return Err(null_arg("probe_devices", "out_count"));
        }
        // SAFETY: NULL or a NUL-terminated string for the call (contract).
        let options = unsafe { options_str(options, "probe_devices")? };
        let count = Runtime::probe(options)?;
        // SAFETY: non-NULL and writable per the contract; written on success only.
        unsafe { out_count.write(i32::try_from(count).unwrap_or(i32::MAX)) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// # Safety
/// `error` must be NULL or a live error of this plugin.
unsafe extern "C" fn error_code(error: *const TFL_Error) -> i32 {
    if error.is_null() {
        return ffi::TFL_ERROR_UNKNOWN;
    }
    // SAFETY: every TFL_Error of this plugin is a boxed ErrorObject.
    unsafe { (*error.cast::<ErrorObject>()).code }
}

/// # Safety
/// As for [`error_code`].
unsafe extern "C" fn error_message(error: *const TFL_Error) -> *const c_char {
    if error.is_null() {
        return c"opencl: NULL error".as_ptr();
    }
    // SAFETY: as in error_code.
    unsafe { (*error.cast::<ErrorObject>()).message.as_ptr() }
}

/// # Safety
/// `error` must be NULL or a live error of this plugin, destroyed once.
unsafe extern "C" fn error_destroy(error: *mut TFL_Error) {
    if !error.is_null() {
        // SAFETY: made by into_raw from a Box<ErrorObject>.
        drop(unsafe { Box::from_raw(error.cast::<ErrorObject>()) });
    }
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
        empty_cache: None,
        get_collectives: None,
        host_allocate: None,
        host_deallocate: None,
        probe_devices: Some(probe_devices),
        get_graphs: None,
        get_activity: Some(activity_entries::get_activity),
    }
}

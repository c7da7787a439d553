//! The C ABI: the bootstrap symbol, the `TFL_PluginApi` table, the op table
//! and the exported kernels.
//!
//! This is the only module with `extern "C"` functions, raw pointers from
//! the host and `catch_unwind`. Every entry follows the same shape: run the
//! body under [`guard`] (a panic becomes `TFL_ERROR_INTERNAL`, never an
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

use std::borrow::Cow;
use std::ffi::{c_char, c_void, CStr, CString};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, addr_of, addr_of_mut};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use torchfl_ffi::{self as ffi, has_field, struct_size};
use torchfl_ffi::{
    TFL_CallFrame, TFL_CopyArgs, TFL_DeviceProperties, TFL_Error, TFL_Event, TFL_HostApi, TFL_InitArgs,
    TFL_MemoryStats, TFL_OpEntry, TFL_OpTable, TFL_OutputMeta, TFL_PluginApi, TFL_PluginInfo, TFL_Scalar,
    TFL_Stream, TFL_Tensor, TFL_Value,
};

use crate::config::Config;
use crate::error::{Error, Result};
#[allow(unused_imports)] // until every kernel module has an operator in the table
use crate::kernels::{
    activation, amp, conv, fused, indexing, linalg, loss, norm, optim, pointwise, pool, random, reduction,
    softmax, threshold,
};
use crate::kernels::{
    for_each_op, ArgList, ArgRef, DType, Frame, InferFn, KernelFn, OutputList, Rng, Scalar, TensorData,
    TensorRef,
};
use crate::runtime::{
    capabilities, CopyKind, EventHandle, LogLevel, Logger, RawCopy, Runtime, StreamHandle, DEVICE_NAME,
};

/// The largest `ndim` accepted from the host.
const MAX_NDIM: i32 = 64;
/// The largest list length accepted from the host (guards against garbage).
const MAX_LIST: usize = 1 << 24;

// The op table's stride is `size_of::<TFL_OpEntry>()`; it must be the 1.1
// size the entries declare in their struct_size.
const _: () = assert!(
    std::mem::size_of::<TFL_OpEntry>()
        == std::mem::offset_of!(TFL_OpEntry, infer_outputs)
            + std::mem::size_of::<Option<ffi::TFL_InferOutputsFn>>()
);

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

/// Reads field `$f` of the struct at raw pointer `$p` without forming a
/// reference to the whole struct. The caller's `unsafe` block must
/// establish that the field is within the host's allocation.
macro_rules! rd {
    ($p:expr, $f:ident) => {
        addr_of!((*$p).$f).read()
    };
}

/// Writes field `$f` of the struct at `$p` if the host's `$size` covers it.
macro_rules! wr {
    ($p:expr, $ty:ty, $size:expr, $f:ident, $v:expr) => {
        if has_field!($ty, $f, $size) {
            addr_of_mut!((*$p).$f).write($v);
        }
    };
}

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
static INIT_LOCK: Mutex<()> = Mutex::new(());
static API: OnceLock<TFL_PluginApi> = OnceLock::new();
static OP_TABLE: OnceLock<OpEntries> = OnceLock::new();

/// `TFL_PluginInfo` pointing at static strings only.
struct Published(TFL_PluginInfo);
// SAFETY: the pointers in the info are to immutable 'static C strings.
unsafe impl Sync for Published {}
// SAFETY: as above.
unsafe impl Send for Published {}

struct OpEntries(Vec<TFL_OpEntry>);
// SAFETY: entries hold pointers to 'static C strings and functions only.
unsafe impl Sync for OpEntries {}
// SAFETY: as above.
unsafe impl Send for OpEntries {}

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

fn api_table() -> TFL_PluginApi {
    TFL_PluginApi {
        struct_size: struct_size!(TFL_PluginApi, empty_cache),
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
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// # Safety
/// `error` must be NULL or an error from this plugin not yet destroyed.
unsafe extern "C" fn error_code(error: *const TFL_Error) -> i32 {
    if error.is_null() {
        return ffi::TFL_ERROR_UNKNOWN;
    }
    // SAFETY: every TFL_Error this plugin creates is a boxed ErrorObject.
    unsafe { (*error.cast::<ErrorObject>()).code }
}

/// # Safety
/// As for [`error_code`]; the message lives until `error_destroy`.
unsafe extern "C" fn error_message(error: *const TFL_Error) -> *const c_char {
    if error.is_null() {
        return c"sim: NULL error".as_ptr();
    }
    // SAFETY: as in `error_code`.
    unsafe { (*error.cast::<ErrorObject>()).message.as_ptr() }
}

/// # Safety
/// `error` must be NULL or an error from this plugin, destroyed only once.
unsafe extern "C" fn error_destroy(error: *mut TFL_Error) {
    if !error.is_null() {
        // SAFETY: created by `into_raw` from a Box<ErrorObject>.
        drop(unsafe { Box::from_raw(error.cast::<ErrorObject>()) });
    }
}

// ---------------------------------------------------------------------------
// Identity and lifecycle
// ---------------------------------------------------------------------------

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

unsafe extern "C" fn get_info() -> *const TFL_PluginInfo {
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

/// # Safety
/// `args` must be NULL or point to a `TFL_InitArgs` valid for the call.
unsafe extern "C" fn initialize(args: *const TFL_InitArgs) -> *mut TFL_Error {
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
                let p = rd!(args, options);
                if p.is_null() {
                    None
                } else {
                    Some(
                        CStr::from_ptr(p)
                            .to_str()
                            .map_err(|_| Error::invalid("sim: initialize: options are not valid UTF-8"))?,
                    )
                }
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

/// # Safety
/// `out` must be NULL or point to a `TFL_OpTable` whose `struct_size` the
/// host has set.
unsafe extern "C" fn get_op_table(out: *mut TFL_OpTable) -> *mut TFL_Error {
    guard("get_op_table", || {
        if out.is_null() {
            return Err(null_arg("get_op_table", "out"));
        }
        let entries = OP_TABLE.get_or_init(|| OpEntries(op_entries()));
        // SAFETY: `out` is valid for the call; fields are written only when
        // the host's struct_size covers them.
        unsafe {
            let size = check_size(
                addr_of!((*out).struct_size),
                struct_size!(TFL_OpTable, entry_size),
                "get_op_table",
            )?;
            wr!(out, TFL_OpTable, size, entries, entries.0.as_ptr());
            wr!(out, TFL_OpTable, size, num_entries, entries.0.len());
            // Our entries are `TFL_OpEntry` values of a Vec, laid out
            // size_of apart; with every field 8 bytes wide that is also the
            // 1.1 struct size (asserted at the top of this module).
            wr!(out, TFL_OpTable, size, entry_size, std::mem::size_of::<TFL_OpEntry>());
        }
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
unsafe extern "C" fn device_count(out_count: *mut i32) -> *mut TFL_Error {
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
unsafe extern "C" fn device_properties(dev: i32, out: *mut TFL_DeviceProperties) -> *mut TFL_Error {
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
        }
        Ok(())
    })
}

unsafe extern "C" fn device_synchronize(dev: i32) -> *mut TFL_Error {
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
unsafe extern "C" fn allocate(dev: i32, nbytes: usize, out_ptr: *mut *mut c_void) -> *mut TFL_Error {
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

unsafe extern "C" fn deallocate(dev: i32, p: *mut c_void) -> *mut TFL_Error {
    guard("deallocate", || {
        let rt = runtime()?;
        rt.deallocate(device(rt, dev)?, p as usize as u64)
    })
}

fn opt_stream(s: *mut TFL_Stream) -> Option<StreamHandle> {
    StreamHandle::from_raw(s as usize as u64)
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
unsafe extern "C" fn copy(args: *const TFL_CopyArgs) -> *mut TFL_Error {
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
        // SAFETY: the host's buffers follow the header's lifetime rules
        // (this function's contract); device pointers are validated inside.
        unsafe { rt.copy_raw(&c) }
    })
}

unsafe extern "C" fn set_memory(
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
unsafe extern "C" fn default_stream(dev: i32, out: *mut *mut TFL_Stream) -> *mut TFL_Error {
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
unsafe extern "C" fn stream_create(dev: i32, priority: i32, out: *mut *mut TFL_Stream) -> *mut TFL_Error {
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

unsafe extern "C" fn stream_destroy(stream: *mut TFL_Stream) -> *mut TFL_Error {
    guard("stream_destroy", || runtime()?.destroy_stream(stream_handle(stream, "stream_destroy")?))
}

unsafe extern "C" fn stream_synchronize(stream: *mut TFL_Stream) -> *mut TFL_Error {
    guard("stream_synchronize", || {
        runtime()?.synchronize_stream(stream_handle(stream, "stream_synchronize")?)
    })
}

/// # Safety
/// `out_complete` must be NULL or valid for a write.
unsafe extern "C" fn stream_query(stream: *mut TFL_Stream, out_complete: *mut u8) -> *mut TFL_Error {
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

unsafe extern "C" fn stream_wait_event(stream: *mut TFL_Stream, event: *mut TFL_Event) -> *mut TFL_Error {
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
unsafe extern "C" fn event_create(dev: i32, flags: u32, out: *mut *mut TFL_Event) -> *mut TFL_Error {
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

unsafe extern "C" fn event_destroy(event: *mut TFL_Event) -> *mut TFL_Error {
    guard("event_destroy", || runtime()?.destroy_event(event_handle(event, "event_destroy", "event")?))
}

unsafe extern "C" fn event_record(event: *mut TFL_Event, stream: *mut TFL_Stream) -> *mut TFL_Error {
    guard("event_record", || {
        runtime()?.record_event(
            event_handle(event, "event_record", "event")?,
            stream_handle(stream, "event_record")?,
        )
    })
}

/// # Safety
/// `out_complete` must be NULL or valid for a write.
unsafe extern "C" fn event_query(event: *mut TFL_Event, out_complete: *mut u8) -> *mut TFL_Error {
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

unsafe extern "C" fn event_synchronize(event: *mut TFL_Event) -> *mut TFL_Error {
    guard("event_synchronize", || {
        runtime()?.synchronize_event(event_handle(event, "event_synchronize", "event")?)
    })
}

/// # Safety
/// `out_ms` must be NULL or valid for a write.
unsafe extern "C" fn event_elapsed_time(
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
unsafe extern "C" fn memory_stats(dev: i32, out: *mut TFL_MemoryStats) -> *mut TFL_Error {
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

unsafe extern "C" fn reset_peak_memory_stats(dev: i32) -> *mut TFL_Error {
    guard("reset_peak_memory_stats", || {
        let rt = runtime()?;
        rt.reset_peak_memory_stats(device(rt, dev)?)
    })
}

unsafe extern "C" fn empty_cache(dev: i32) -> *mut TFL_Error {
    guard("empty_cache", || {
        let rt = runtime()?;
        rt.empty_cache(device(rt, dev)?)
    })
}

// ---------------------------------------------------------------------------
// Kernels: decoding the call frame
// ---------------------------------------------------------------------------

/// Borrows a host array for the duration of the call.
///
/// `what` names the list in error messages; it is only formatted when the
/// list is rejected.
///
/// # Safety
/// When `len > 0`, `items` must be NULL or valid (and aligned) for `len`
/// reads for the lifetime `'a`, and not written during it.
unsafe fn borrow_list<'a, T>(items: *const T, len: usize, what: &dyn fmt::Display) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if items.is_null() {
        return Err(Error::invalid(format!("sim: {what}: NULL list with {len} items")));
    }
    if len > MAX_LIST {
        return Err(Error::invalid(format!("sim: {what}: list length {len} is implausible")));
    }
    // SAFETY: non-NULL and valid for `len` reads during 'a (caller contract).
    Ok(unsafe { std::slice::from_raw_parts(items, len) })
}

/// Which tensor of a frame is being decoded, for error messages; formatted
/// only when a message is built.
#[derive(Debug, Clone, Copy)]
enum Role {
    /// `argument {i}`
    Argument(usize),
    /// `argument {i}[{j}]`: item `j` of a tensor list.
    Item(usize, usize),
    /// `output {i}`
    Output(usize),
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Role::Argument(i) => write!(f, "argument {i}"),
            Role::Item(i, j) => write!(f, "argument {i}[{j}]"),
            Role::Output(i) => write!(f, "output {i}"),
        }
    }
}

/// # Safety
/// `s` must be a valid scalar.
unsafe fn decode_scalar(s: TFL_Scalar, op: &str) -> Result<Scalar> {
    // SAFETY: `kind` says which union member the host wrote.
    unsafe {
        match s.kind {
            ffi::TFL_SCALAR_INT => Ok(Scalar::Int(s.v.i)),
            ffi::TFL_SCALAR_FLOAT => Ok(Scalar::Float(s.v.f)),
            ffi::TFL_SCALAR_BOOL => Ok(Scalar::Bool(s.v.b != 0)),
            ffi::TFL_SCALAR_COMPLEX => {
                Err(Error::unimplemented(format!("sim: {op}: complex scalars are not supported")))
            }
            k => Err(Error::invalid(format!("sim: {op}: unknown scalar kind {k}"))),
        }
    }
}

/// Decodes a tensor descriptor; its shape and strides stay borrowed from
/// the host's arrays.
///
/// `rt` is the runtime for a kernel's frame, whose device tensors are
/// checked against its devices and whose host scalars are read; `None`
/// decodes an `infer_outputs` frame, whose tensors have no data (they
/// become [`TensorData::Meta`]) and need no runtime.
///
/// # Safety
/// `t` must be NULL or a valid `TFL_Tensor` (with its arrays and, for host
/// tensors of a kernel's frame, its data) for the lifetime `'a`.
#[inline(always)]
unsafe fn decode_tensor<'a>(
    rt: Option<&Runtime>,
    t: *const TFL_Tensor,
    op: &str,
    role: Role,
) -> Result<TensorRef<'a>> {
    if t.is_null() {
        return Err(Error::invalid(format!("sim: {op}: {role} is a NULL tensor")));
    }
    // SAFETY: valid for the call (contract); size checked before the read.
    let t = unsafe {
        check_size(addr_of!((*t).struct_size), struct_size!(TFL_Tensor, flags), op)?;
        t.read()
    };
    let dtype = DType::from_ffi(t.dtype).ok_or_else(|| {
        Error::unimplemented(format!(
            "sim: {op}: {role} has unsupported dtype {{code {}, bits {}, lanes {}}}",
            t.dtype.code, t.dtype.bits, t.dtype.lanes
        ))
    })?;
    if !(0..=MAX_NDIM).contains(&t.ndim) {
        return Err(Error::invalid(format!("sim: {op}: {role} has ndim {}", t.ndim)));
    }
    let n = t.ndim as usize;
    // SAFETY: the header guarantees `ndim` entries in shape and strides,
    // valid and unchanged for the call ('a).
    let (shape, strides) = unsafe {
        (
            borrow_list(t.shape, n, &format_args!("{op}: {role}.shape"))?,
            borrow_list(t.strides, n, &format_args!("{op}: {role}.strides"))?,
        )
    };
    let data = match (t.device_type, rt) {
        (ffi::TFL_DEVICE_PLUGIN | ffi::TFL_DEVICE_HOST, None) => {
            if t.device_type == ffi::TFL_DEVICE_HOST && n != 0 {
                return Err(Error::invalid(format!(
                    "sim: {op}: {role}: host tensors must be 0-dim scalars, got {n} dimensions"
                )));
            }
            TensorData::Meta
        }
        (ffi::TFL_DEVICE_PLUGIN, Some(rt)) => TensorData::Device {
            device: rt.check_device(i64::from(t.device_index)).map_err(|e| {
                Error::invalid(format!("sim: {op}: {role}: {}", e.message().trim_start_matches("sim: ")))
            })?,
            ptr: t.data as usize as u64,
            byte_offset: t.byte_offset,
        },
        (ffi::TFL_DEVICE_HOST, Some(_)) => {
            if n != 0 {
                return Err(Error::invalid(format!(
                    "sim: {op}: {role}: host tensors must be 0-dim scalars, got {n} dimensions"
                )));
            }
            if t.data.is_null() {
                return Err(Error::invalid(format!("sim: {op}: {role}: host tensor data is NULL")));
            }
            let p = (t.data as usize).wrapping_add(t.byte_offset as usize);
            // SAFETY: a host 0-dim tensor holds one readable element at
            // data + byte_offset for the duration of the call.
            let value = unsafe { read_host_scalar(dtype, p) };
            if t.flags & ffi::TFL_TENSOR_WRAPPED_NUMBER != 0 {
                TensorData::WrappedNumber(value)
            } else {
                TensorData::Host(value)
            }
        }
        (d, _) => return Err(Error::invalid(format!("sim: {op}: {role}: unknown device_type {d}"))),
    };
    Ok(TensorRef { dtype, shape, strides, data })
}

/// # Safety
/// `p` must be readable for one element of `dtype` (any alignment).
unsafe fn read_host_scalar(dtype: DType, p: usize) -> Scalar {
    // SAFETY: forwarded contract; unaligned reads.
    unsafe {
        match dtype {
            DType::Bool => Scalar::Bool((p as *const u8).read() != 0),
            DType::UInt8 => Scalar::Int(i64::from((p as *const u8).read())),
            DType::Int8 => Scalar::Int(i64::from((p as *const i8).read())),
            DType::Int16 => Scalar::Int(i64::from((p as *const i16).read_unaligned())),
            DType::Int32 => Scalar::Int(i64::from((p as *const i32).read_unaligned())),
            DType::Int64 => Scalar::Int((p as *const i64).read_unaligned()),
            DType::Float16 => Scalar::Float((p as *const half::f16).read_unaligned().to_f64()),
            DType::BFloat16 => Scalar::Float((p as *const half::bf16).read_unaligned().to_f64()),
            DType::Float32 => Scalar::Float(f64::from((p as *const f32).read_unaligned())),
            DType::Float64 => Scalar::Float((p as *const f64).read_unaligned()),
        }
    }
}

/// Decodes one argument; `rt` as for [`decode_tensor`].
///
/// # Safety
/// `v` must be NULL or a valid `TFL_Value` for the lifetime `'a`.
unsafe fn decode_value<'a>(
    rt: Option<&Runtime>,
    v: *const TFL_Value,
    op: &str,
    i: usize,
) -> Result<ArgRef<'a>> {
    if v.is_null() {
        return Err(Error::invalid(format!("sim: {op}: argument {i} is NULL")));
    }
    let role = Role::Argument(i);
    // SAFETY: valid for the call (contract); size checked before the read;
    // union members are read according to `tag`, and the pointers they
    // carry are valid for the call.
    unsafe {
        check_size(addr_of!((*v).struct_size), struct_size!(TFL_Value, u), op)?;
        let v = v.read();
        Ok(match v.tag {
            ffi::TFL_VALUE_NONE => ArgRef::None,
            ffi::TFL_VALUE_TENSOR => ArgRef::Tensor(decode_tensor(rt, v.u.tensor, op, role)?),
            ffi::TFL_VALUE_TENSOR_LIST => {
                let items = borrow_list(v.u.tensor_list.items, v.u.tensor_list.len, &op)?;
                let mut list = Vec::with_capacity(items.len());
                for (j, &t) in items.iter().enumerate() {
                    list.push(if t.is_null() {
                        None
                    } else {
                        Some(decode_tensor(rt, t, op, Role::Item(i, j))?)
                    });
                }
                ArgRef::TensorList(list)
            }
            ffi::TFL_VALUE_INT => ArgRef::Int(v.u.i),
            ffi::TFL_VALUE_FLOAT => ArgRef::Float(v.u.f),
            ffi::TFL_VALUE_BOOL => ArgRef::Bool(v.u.b != 0),
            ffi::TFL_VALUE_SCALAR => ArgRef::Scalar(decode_scalar(v.u.scalar, op)?),
            ffi::TFL_VALUE_INT_LIST => {
                ArgRef::IntList(borrow_list(v.u.int_list.items, v.u.int_list.len, &op)?)
            }
            ffi::TFL_VALUE_FLOAT_LIST => {
                ArgRef::FloatList(borrow_list(v.u.float_list.items, v.u.float_list.len, &op)?)
            }
            ffi::TFL_VALUE_BOOL_LIST => ArgRef::BoolList(Cow::Owned(
                borrow_list(v.u.bool_list.items, v.u.bool_list.len, &op)?.iter().map(|&b| b != 0).collect(),
            )),
            ffi::TFL_VALUE_STRING => {
                let bytes = borrow_list::<u8>(v.u.string.data.cast::<u8>(), v.u.string.len, &op)?;
                ArgRef::Str(String::from_utf8_lossy(bytes))
            }
            tag => {
                return Err(Error::invalid(format!(
                    "sim: {op}: argument {i} has unknown TFL_Value tag {tag}"
                )))
            }
        })
    }
}

/// Checks a frame's size and reads it.
///
/// # Safety
/// `frame` must be NULL or a valid `TFL_CallFrame` for the duration of the
/// call.
unsafe fn read_frame(frame: *const TFL_CallFrame, name: &str) -> Result<TFL_CallFrame> {
    if frame.is_null() {
        return Err(Error::invalid(format!("sim: {name}: NULL call frame")));
    }
    // SAFETY: valid for the call (contract); size checked before the read.
    unsafe {
        check_size(addr_of!((*frame).struct_size), struct_size!(TFL_CallFrame, rng_offset), name)?;
        Ok(frame.read())
    }
}

/// The operator name for messages: the frame's `op_name` as given, or the
/// table's `name` when it is NULL (or the same).
///
/// # Safety
/// `f.op_name` must be NULL or a NUL-terminated string valid for `'f`.
unsafe fn frame_op_name<'f>(f: &TFL_CallFrame, name: &'static str) -> Cow<'f, str> {
    if f.op_name.is_null() {
        return Cow::Borrowed(name);
    }
    // SAFETY: forwarded contract.
    let given = unsafe { CStr::from_ptr::<'f>(f.op_name) };
    if given.to_bytes() == name.as_bytes() {
        // The usual case: the table's own name, already valid UTF-8.
        Cow::Borrowed(name)
    } else {
        given.to_string_lossy()
    }
}

/// Decodes the host's frame and launches `kernel` on it. Everything the
/// kernel reads stays borrowed from the frame (valid for the call); only
/// what its work needs later is copied, by the kernel.
///
/// # Safety
/// `frame` must be NULL or a valid `TFL_CallFrame` for the duration of the
/// call, as the header specifies.
unsafe fn launch_frame(
    rt: &Runtime,
    frame: *const TFL_CallFrame,
    name: &'static str,
    kernel: KernelFn,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let f = unsafe { read_frame(frame, name)? };
    // SAFETY: as above.
    let op_name = unsafe { frame_op_name(&f, name) };
    let op: &str = &op_name;
    let device = rt
        .check_device(i64::from(f.device_index))
        .map_err(|e| Error::invalid(format!("sim: {op}: {}", e.message().trim_start_matches("sim: "))))?;
    let stream = opt_stream(f.stream)
        .ok_or_else(|| Error::invalid(format!("sim: {op}: the frame's stream is NULL")))?;
    // SAFETY: the header guarantees `num_args` argument pointers and
    // `num_outputs` output pointers, each valid for the call.
    let (arg_ptrs, out_ptrs) =
        unsafe { (borrow_list(f.args, f.num_args, &op)?, borrow_list(f.outputs, f.num_outputs, &op)?) };
    let mut args = ArgList::new();
    for (i, &a) in arg_ptrs.iter().enumerate() {
        // SAFETY: as above.
        args.push(unsafe { decode_value(Some(rt), a, op, i)? });
    }
    let mut outputs = OutputList::new();
    for (i, &o) in out_ptrs.iter().enumerate() {
        // SAFETY: as above.
        outputs.push(unsafe { decode_tensor(Some(rt), o, op, Role::Output(i))? });
    }
    let op_name = if op.is_empty() { name } else { op };
    let rng = Rng { seed: f.rng_seed, offset: f.rng_offset };
    rt.launch_kernel(kernel, &Frame { op_name, device, stream, args: &args, outputs: &outputs, rng })
}

/// The body of every exported kernel.
///
/// # Safety
/// As for [`launch_frame`].
unsafe fn kernel_entry(name: &'static str, kernel: KernelFn, frame: *const TFL_CallFrame) -> *mut TFL_Error {
    guard(name, || {
        let rt = runtime()?;
        // SAFETY: forwarded contract.
        unsafe { launch_frame(rt, frame, name, kernel) }
    })
}

/// Decodes an `infer_outputs` frame (no data, no stream, no outputs), runs
/// `infer` on it and writes `out[..num_outputs]`, all of it or nothing.
///
/// # Safety
/// `frame` must be NULL or a valid `TFL_CallFrame` for the duration of the
/// call, with NULL tensor data allowed, as the header specifies for
/// `TFL_InferOutputsFn`; `out` must be NULL or point to `num_outputs`
/// `TFL_OutputMeta`s whose `struct_size` the host has set.
unsafe fn infer_frame(
    frame: *const TFL_CallFrame,
    name: &'static str,
    infer: InferFn,
    out: *mut TFL_OutputMeta,
    num_outputs: usize,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let f = unsafe { read_frame(frame, name)? };
    // SAFETY: as above.
    let op_name = unsafe { frame_op_name(&f, name) };
    let op: &str = if op_name.is_empty() { name } else { &op_name };
    // SAFETY: the header guarantees `num_args` argument pointers, each
    // valid for the call.
    let arg_ptrs = unsafe { borrow_list(f.args, f.num_args, &op)? };
    let mut args = ArgList::new();
    for (i, &a) in arg_ptrs.iter().enumerate() {
        // SAFETY: as above; without a runtime no tensor data is read.
        args.push(unsafe { decode_value(None, a, op, i)? });
    }
    let metas = infer(op, &args)?;
    if num_outputs != metas.len() {
        return Err(Error::invalid(format!(
            "sim: {op}: infer_outputs was given {num_outputs} output(s), the operator returns {}",
            metas.len()
        )));
    }
    if out.is_null() && num_outputs > 0 {
        return Err(null_arg(op, "out"));
    }
    // Validate everything before writing anything.
    for (i, m) in metas.iter().enumerate() {
        if m.shape.len() > ffi::TFL_MAX_OUTPUT_DIMS {
            return Err(Error::invalid(format!(
                "sim: {op}: output {i} has {} dimensions, more than TFL_MAX_OUTPUT_DIMS ({})",
                m.shape.len(),
                ffi::TFL_MAX_OUTPUT_DIMS
            )));
        }
    }
    for (i, m) in metas.iter().enumerate() {
        let mut shape = [0i64; ffi::TFL_MAX_OUTPUT_DIMS];
        shape[..m.shape.len()].copy_from_slice(&m.shape);
        let ndim = m.shape.len() as i32;
        // SAFETY: `out` holds `num_outputs` host structs (contract) and
        // `i < num_outputs`; each field is written only when the host's
        // struct_size covers it.
        unsafe {
            let p = out.add(i);
            let size = rd!(p, struct_size);
            wr!(p, TFL_OutputMeta, size, dtype, m.dtype.to_ffi());
            wr!(p, TFL_OutputMeta, size, ndim, ndim);
            wr!(p, TFL_OutputMeta, size, shape, shape);
        }
    }
    Ok(())
}

/// The body of every custom operator's `infer_outputs`: like
/// [`kernel_entry`], a panic or an error becomes an error object.
///
/// # Safety
/// As for [`infer_frame`].
unsafe fn infer_entry(
    name: &'static str,
    infer: InferFn,
    frame: *const TFL_CallFrame,
    out: *mut TFL_OutputMeta,
    num_outputs: usize,
) -> *mut TFL_Error {
    // SAFETY: forwarded contract.
    guard(name, || unsafe { infer_frame(frame, name, infer, out, num_outputs) })
}

/// Whether `schema` declares operator `name` without its namespace:
/// `"sim::fused_gelu"` and `"fused_gelu(Tensor x) -> Tensor"`. A `const
/// fn` so that a mismatch fails the build.
const fn schema_declares(name: &str, schema: &str) -> bool {
    let (n, s) = (name.as_bytes(), schema.as_bytes());
    // The operator after the last "::".
    let mut start = 0;
    let mut i = 0;
    while i + 1 < n.len() {
        if n[i] == b':' && n[i + 1] == b':' {
            start = i + 2;
        }
        i += 1;
    }
    let mut j = 0;
    while start + j < n.len() {
        if j >= s.len() || s[j] != n[start + j] {
            return false;
        }
        j += 1;
    }
    j < s.len() && s[j] == b'('
}

/// Whether `symbol` is the ABI mangling of operator `name`
/// (`torch_fl_op_` + name with `::` as `__` and `.` as `_`, `aten::`
/// dropped). A `const fn` so that a mismatch fails the build.
const fn mangles_to(name: &str, symbol: &str) -> bool {
    let (n, s) = (name.as_bytes(), symbol.as_bytes());
    let prefix = b"torch_fl_op_";
    let mut j = 0;
    while j < prefix.len() {
        if j >= s.len() || s[j] != prefix[j] {
            return false;
        }
        j += 1;
    }
    let mut i = 0;
    let aten = b"aten::";
    if n.len() >= aten.len() {
        let mut k = 0;
        while k < aten.len() && n[k] == aten[k] {
            k += 1;
        }
        if k == aten.len() {
            i = k;
        }
    }
    while i < n.len() {
        if n[i] == b':' {
            if i + 1 >= n.len() || n[i + 1] != b':' || j + 1 >= s.len() {
                return false;
            }
            if s[j] != b'_' || s[j + 1] != b'_' {
                return false;
            }
            i += 2;
            j += 2;
            continue;
        }
        let expected = if n[i] == b'.' { b'_' } else { n[i] };
        if j >= s.len() || s[j] != expected {
            return false;
        }
        i += 1;
        j += 1;
    }
    j == s.len()
}

/// One exported kernel: the `#[no_mangle]` function the table points to.
macro_rules! export_kernel {
    ($name:literal, $sym:ident, $kernel:path) => {
        const _: () = assert!(
            mangles_to($name, stringify!($sym)),
            concat!("kernel symbol ", stringify!($sym), " is not the mangling of ", $name)
        );

        #[doc = concat!("Exported kernel for `", $name, "`.")]
        ///
        /// # Safety
        /// `frame` must be a valid `TFL_CallFrame` for the duration of
        /// the call, as the ABI header specifies.
        #[no_mangle]
        unsafe extern "C" fn $sym(frame: *const TFL_CallFrame) -> *mut TFL_Error {
            // SAFETY: forwarded contract.
            unsafe { kernel_entry($name, $kernel, frame) }
        }
    };
}

macro_rules! define_exports {
    (
        aten: [$($name:literal => $sym:ident : $kernel:path $([$flags:expr])?),* $(,)?],
        custom: [$(
            $cname:literal => $csym:ident : $ckernel:path {
                schema: $schema:literal,
                infer: $infer:path $(,)?
            } $([$cflags:expr])?
        ),* $(,)?] $(,)?
    ) => {
        $(export_kernel!($name, $sym, $kernel);)*
        $(
            export_kernel!($cname, $csym, $ckernel);
            const _: () = assert!(
                schema_declares($cname, $schema),
                concat!("the schema of ", $cname, " declares another operator: ", $schema)
            );
        )*

        /// The op table's entries, in `for_each_op!` order: aten operators
        /// (no schema, no infer function), then custom ones.
        fn op_entries() -> Vec<TFL_OpEntry> {
            vec![
                $(TFL_OpEntry {
                    struct_size: struct_size!(TFL_OpEntry, infer_outputs),
                    name: concat!($name, "\0").as_ptr().cast(),
                    symbol: concat!(stringify!($sym), "\0").as_ptr().cast(),
                    kernel: Some($sym),
                    flags: 0 $(| $flags)?,
                    schema: ptr::null(),
                    infer_outputs: None,
                },)*
                $(TFL_OpEntry {
                    struct_size: struct_size!(TFL_OpEntry, infer_outputs),
                    name: concat!($cname, "\0").as_ptr().cast(),
                    symbol: concat!(stringify!($csym), "\0").as_ptr().cast(),
                    kernel: Some($csym),
                    flags: 0 $(| $cflags)?,
                    schema: concat!($schema, "\0").as_ptr().cast(),
                    infer_outputs: {
                        /// The entry's `TFL_InferOutputsFn`.
                        ///
                        /// # Safety
                        /// As the ABI header specifies for
                        /// `TFL_InferOutputsFn`: `frame` valid for the
                        /// call, `out` holding `num_outputs` entries.
                        unsafe extern "C" fn infer(
                            frame: *const TFL_CallFrame,
                            out: *mut TFL_OutputMeta,
                            num_outputs: usize,
                        ) -> *mut TFL_Error {
                            // SAFETY: forwarded contract.
                            unsafe { infer_entry($cname, $infer, frame, out, num_outputs) }
                        }
                        Some(infer)
                    },
                },)*
            ]
        }
    };
}
for_each_op!(define_exports);

#[cfg(test)]
mod tests {
    use super::*;

    fn cstr(p: *const c_char) -> String {
        // SAFETY: the table's strings are static and NUL-terminated.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned()
    }

    #[test]
    fn every_symbol_is_the_mangled_name() {
        let entries = op_entries();
        assert_eq!(entries.len(), crate::kernels::OPS.len());
        let mut custom = 0;
        for (e, def) in entries.iter().zip(crate::kernels::OPS) {
            let name = cstr(e.name);
            assert_eq!(name, def.name);
            assert_eq!(cstr(e.symbol), ffi::kernel_symbol(&name).unwrap(), "{name}");
            assert!(e.kernel.is_some());
            assert_eq!(e.struct_size, 56);
            let parsed = ffi::parse_op_name(&name).unwrap();
            if parsed.namespace == "aten" {
                // PyTorch knows aten operators: no schema, no infer function.
                assert!(e.schema.is_null() && e.infer_outputs.is_none(), "{name}");
                assert!(def.schema.is_none() && def.infer.is_none(), "{name}");
            } else {
                custom += 1;
                assert_eq!(parsed.namespace, "sim", "{name}");
                assert!(!e.schema.is_null() && e.infer_outputs.is_some(), "{name}");
                let schema = cstr(e.schema);
                assert_eq!(Some(schema.as_str()), def.schema, "{name}");
                assert!(schema.starts_with(&format!("{}(", name.trim_start_matches("sim::"))), "{schema}");
                assert!(def.infer.is_some(), "{name}");
            }
        }
        assert_eq!(custom, 4, "the fused operators");
        let mut names: Vec<String> = entries.iter().map(|e| cstr(e.name)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), entries.len(), "names are unique");
    }

    #[test]
    fn schema_declares_its_operator() {
        assert!(schema_declares("sim::fused_gelu", "fused_gelu(Tensor x) -> Tensor"));
        assert!(schema_declares("sim::op.out", "op.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)"));
        assert!(!schema_declares("sim::fused_gelu", "fused_gelu2(Tensor x) -> Tensor"));
        assert!(!schema_declares("sim::fused_gelu", "gelu(Tensor x) -> Tensor"));
        assert!(!schema_declares("sim::fused_gelu", "fused_gelu"));
        assert!(!schema_declares("sim::fused_gelu", "sim::fused_gelu(Tensor x) -> Tensor"));
    }

    #[test]
    fn const_mangling_agrees_with_ffi() {
        for name in ["add.Tensor", "add_.Tensor", "relu", "sim::fused_gelu", "aten::mm", "sum.dim_IntList"] {
            assert!(mangles_to(name, &ffi::kernel_symbol(name).unwrap()), "{name}");
        }
        assert!(!mangles_to("add.Tensor", "torch_fl_op_add_Tensor_"));
        assert!(!mangles_to("add.Tensor", "torch_fl_op_addTensor"));
        assert!(!mangles_to("add_.Tensor", "torch_fl_op_add_Tensor"));
    }

    #[test]
    fn table_layout() {
        let api = api_table();
        assert_eq!(api.struct_size, 240);
        assert_eq!((api.abi_major, api.abi_minor), (1, 1));
    }

    fn sim() -> Runtime {
        let config = Config { devices: 1, memory: 1 << 20, mode: crate::Mode::Sync, strict: false };
        Runtime::new(config).unwrap()
    }

    fn tensor(data: *mut c_void, ndim: i32, shape: *const i64, strides: *const i64) -> TFL_Tensor {
        TFL_Tensor {
            struct_size: struct_size!(TFL_Tensor, flags),
            data,
            byte_offset: 0,
            device_type: ffi::TFL_DEVICE_PLUGIN,
            device_index: 0,
            dtype: ffi::TFL_DType::F32,
            ndim,
            shape,
            strides,
            flags: 0,
        }
    }

    fn message<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.unwrap_err().message().to_owned()
    }

    /// Decodes `t` (valid or NULL, with live arrays) and copies out its
    /// shape and strides.
    fn decode_t(rt: &Runtime, t: *const TFL_Tensor, role: Role) -> Result<(Vec<i64>, Vec<i64>)> {
        // SAFETY: callers pass NULL or a live descriptor whose arrays are
        // live or NULL (what is being tested) for this call.
        let t = unsafe { decode_tensor(Some(rt), t, "op", role) }?;
        Ok((t.shape.to_vec(), t.strides.to_vec()))
    }

    /// Decodes `v` (valid or NULL, with live contents), dropping the result.
    fn decode_v(rt: &Runtime, v: *const TFL_Value, i: usize) -> Result<()> {
        // SAFETY: as in `decode_t`, for a value.
        unsafe { decode_value(Some(rt), v, "op", i) }.map(drop)
    }

    /// Error context is formatted lazily now; the messages must read as
    /// they did when it was formatted eagerly.
    #[test]
    fn decode_errors_name_the_operand() {
        let rt = sim();
        let (shape, strides) = ([2i64, 2], [2i64, 1]);
        let ok = tensor(ptr::null_mut(), 2, shape.as_ptr(), strides.as_ptr());
        let (sh, st) = decode_t(&rt, &ok, Role::Output(0)).unwrap();
        assert_eq!((&sh[..], &st[..]), (&shape[..], &strides[..]));

        let no_shape = tensor(ptr::null_mut(), 2, ptr::null(), strides.as_ptr());
        let e = message(decode_t(&rt, &no_shape, Role::Argument(1)));
        assert_eq!(e, "sim: op: argument 1.shape: NULL list with 2 items");
        let no_strides = tensor(ptr::null_mut(), 2, shape.as_ptr(), ptr::null());
        let e = message(decode_t(&rt, &no_strides, Role::Output(0)));
        assert_eq!(e, "sim: op: output 0.strides: NULL list with 2 items");
        let deep = tensor(ptr::null_mut(), 65, shape.as_ptr(), strides.as_ptr());
        let e = message(decode_t(&rt, &deep, Role::Item(2, 3)));
        assert_eq!(e, "sim: op: argument 2[3] has ndim 65");
        let e = message(decode_t(&rt, ptr::null(), Role::Output(1)));
        assert_eq!(e, "sim: op: output 1 is a NULL tensor");
        let elsewhere = TFL_Tensor { device_index: 3, ..ok };
        let e = message(decode_t(&rt, &elsewhere, Role::Argument(0)));
        assert_eq!(e, "sim: op: argument 0: device 3 out of range (device_count = 1)");

        let items = [&ok as *const TFL_Tensor, &deep];
        let list = TFL_Value {
            struct_size: struct_size!(TFL_Value, u),
            tag: ffi::TFL_VALUE_TENSOR_LIST,
            u: ffi::TFL_ValueUnion { tensor_list: ffi::TFL_TensorList { items: items.as_ptr(), len: 2 } },
        };
        let e = message(decode_v(&rt, &list, 4));
        assert_eq!(e, "sim: op: argument 4[1] has ndim 65");
        let e = message(decode_v(&rt, ptr::null(), 5));
        assert_eq!(e, "sim: op: argument 5 is NULL");
        let no_items = TFL_Value {
            u: ffi::TFL_ValueUnion { int_list: ffi::TFL_IntList { items: ptr::null(), len: 3 } },
            tag: ffi::TFL_VALUE_INT_LIST,
            ..list
        };
        let e = message(decode_v(&rt, &no_items, 0));
        assert_eq!(e, "sim: op: NULL list with 3 items");
    }

    /// The frame's op name is used in messages as given, even when it is
    /// not the table's.
    #[test]
    fn frame_op_names_reach_messages() {
        let rt = sim();
        let stream = rt.default_stream(0).unwrap();
        let frame = |op_name: *const c_char| TFL_CallFrame {
            struct_size: struct_size!(TFL_CallFrame, rng_offset),
            op_name,
            device_index: 0,
            stream: stream.to_raw() as usize as *mut TFL_Stream,
            args: ptr::null(),
            num_args: 0,
            outputs: ptr::null(),
            num_outputs: 0,
            resize_output: None,
            host_context: ptr::null_mut(),
            rng_seed: 0,
            rng_offset: 0,
        };
        let launch = |op_name| {
            let f = frame(op_name);
            // SAFETY: a complete frame with no arguments or outputs.
            message(unsafe { launch_frame(&rt, &f, "add.Tensor", pointwise::add_tensor) })
        };
        let expected = "expected 2 to 3 arguments, got 0";
        assert_eq!(launch(c"add.Tensor".as_ptr()), format!("sim: add.Tensor: {expected}"));
        assert_eq!(launch(c"aten::add.Tensor".as_ptr()), format!("sim: aten::add.Tensor: {expected}"));
        assert_eq!(launch(ptr::null()), format!("sim: add.Tensor: {expected}"));
        assert_eq!(launch(c"".as_ptr()), format!("sim: add.Tensor: {expected}"));
        let bad = frame(c"add.Tensor".as_ptr());
        let bad = TFL_CallFrame { num_args: 2, ..bad };
        // SAFETY: `args` is NULL with a count, which is what is tested.
        let e = message(unsafe { launch_frame(&rt, &bad, "add.Tensor", pointwise::add_tensor) });
        assert_eq!(e, "sim: add.Tensor: NULL list with 2 items");
    }
}

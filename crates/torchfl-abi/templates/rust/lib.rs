//! The {{device}} accelerator plugin for torch-fl, in Rust.
//!
//! Written by `torchfl-abi new {{device}} --lang rust` as a starting point:
//! one synchronous device backed by host memory and two float32 kernels
//! (add.Tensor, mul.Tensor), enough to pass `torchfl-abi verify`. Port it by
//! replacing the memory entries with the device's allocator and copies, the
//! kernels with launches on the device, and the streams and events with the
//! device's queues (then set TFL_CAP_ASYNC_STREAMS).
//!
//! The contract is `vendor/torchfl-ffi/include/torch_fl/plugin.h`; the
//! `torchfl_ffi` crate mirrors it field for field. Every entry is
//! `extern "C"`: a panic in one aborts the process instead of unwinding into
//! the host, so entries report failures as errors and never panic.
#![allow(non_snake_case)] // kernel symbols follow torch-fl's naming rule

use std::alloc::{alloc, dealloc, Layout};
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use torchfl_ffi::*;

const NAME: &str = "{{device}}";
const DEVICES: i32 = 1;
const CAPACITY: u64 = 256 << 20; // bytes per device
const ALIGNMENT: usize = 64;

type Status = *mut TFL_Error;

// --- Errors ---------------------------------------------------------------

struct Error {
    code: i32,
    message: CString,
}

/// A new error for the host, which owns it until `error_destroy`.
fn error(code: i32, message: String) -> Status {
    let message = CString::new(format!("{NAME}: {message}").replace('\0', " ")).unwrap_or_default();
    Box::into_raw(Box::new(Error { code, message })).cast()
}

fn status(result: Result<(), Status>) -> Status {
    result.err().unwrap_or(std::ptr::null_mut())
}

unsafe extern "C" fn error_code(e: *const TFL_Error) -> i32 {
    // SAFETY: the host passes an error this plugin created in `error`.
    unsafe { (*e.cast::<Error>()).code }
}

unsafe extern "C" fn error_message(e: *const TFL_Error) -> *const c_char {
    // SAFETY: as in error_code; the message lives until error_destroy.
    unsafe { (*e.cast::<Error>()).message.as_ptr() }
}

unsafe extern "C" fn error_destroy(e: *mut TFL_Error) {
    if !e.is_null() {
        // SAFETY: `e` came from Box::into_raw in `error` and is released once.
        drop(unsafe { Box::from_raw(e.cast::<Error>()) });
    }
}

fn check_device(device: i32) -> Result<(), Status> {
    if (0..DEVICES).contains(&device) {
        Ok(())
    } else {
        Err(error(
            TFL_ERROR_INVALID_ARGUMENT,
            format!("device {device} out of range (device_count = {DEVICES})"),
        ))
    }
}

// --- Identity and lifecycle -----------------------------------------------

struct Info(TFL_PluginInfo);
// SAFETY: the info holds pointers to static, immutable strings only.
unsafe impl Sync for Info {}
unsafe impl Send for Info {}

static INFO: OnceLock<Info> = OnceLock::new();
static INITIALIZED: AtomicBool = AtomicBool::new(false);

unsafe extern "C" fn get_info() -> *const TFL_PluginInfo {
    &INFO
        .get_or_init(|| {
            Info(TFL_PluginInfo {
                struct_size: struct_size!(TFL_PluginInfo, capabilities),
                name: c"{{device}}".as_ptr(),
                vendor: c"{{device}} vendor".as_ptr(),
                chip_family: c"host-memory".as_ptr(),
                plugin_version: c"0.1.0".as_ptr(),
                min_torch_version: std::ptr::null(),
                capabilities: TFL_CAP_HOST_ADDRESSABLE_MEMORY | TFL_CAP_EVENT_TIMING,
            })
        })
        .0
}

unsafe extern "C" fn initialize(args: *const TFL_InitArgs) -> Status {
    // SAFETY: `args` is NULL or valid for the call; options is NULL or a C string.
    let options = unsafe {
        args.as_ref()
            .filter(|a| !a.options.is_null())
            .map(|a| std::ffi::CStr::from_ptr(a.options))
    };
    if let Some(options) = options.filter(|o| !o.is_empty()) {
        return error(
            TFL_ERROR_INVALID_ARGUMENT,
            format!("takes no options, got {options:?}"),
        );
    }
    if INITIALIZED.swap(true, Ordering::AcqRel) {
        return error(
            TFL_ERROR_FAILED_PRECONDITION,
            "initialize called twice".into(),
        );
    }
    std::ptr::null_mut()
}

unsafe extern "C" fn device_count(out: *mut i32) -> Status {
    // SAFETY: `out` is valid for writes for the call.
    unsafe { *out = DEVICES };
    std::ptr::null_mut()
}

/// 1.6: what `initialize` would find, without initializing. A plugin over a
/// vendor runtime asks the runtime's cheapest enumeration here (an error
/// saying what to install when the driver is missing), so that autoload can
/// choose among installed plugins by the hardware present.
unsafe extern "C" fn probe_devices(_options: *const c_char, out_count: *mut i32) -> Status {
    if out_count.is_null() {
        return error(
            TFL_ERROR_INVALID_ARGUMENT,
            "probe_devices: out_count is NULL".to_owned(),
        );
    }
    // SAFETY: non-NULL, and valid for writes for the call.
    unsafe { *out_count = DEVICES };
    std::ptr::null_mut()
}

unsafe extern "C" fn device_properties(device: i32, out: *mut TFL_DeviceProperties) -> Status {
    status(check_device(device).map(|()| {
        // SAFETY: `out` is valid; only the fields its struct_size covers are written.
        let out = unsafe { &mut *out };
        let size = out.struct_size;
        if has_field!(TFL_DeviceProperties, memory_alignment, size) {
            out.name = c"{{device}} device".as_ptr();
            out.total_memory = CAPACITY;
            out.compute_units = 1;
            out.memory_alignment = ALIGNMENT as u32;
        }
        if has_field!(TFL_DeviceProperties, capability_minor, size) {
            out.capability_major = 1;
            out.capability_minor = 0;
        }
    }))
}

unsafe extern "C" fn device_synchronize(device: i32) -> Status {
    status(check_device(device)) // every call completes before it returns
}

// --- Memory: host allocations, a header in front holds the size -----------

static STATS: Mutex<TFL_MemoryStats> = Mutex::new(TFL_MemoryStats {
    struct_size: 0,
    allocated_bytes: 0,
    peak_allocated_bytes: 0,
    reserved_bytes: 0,
    total_bytes: CAPACITY,
    num_allocations: 0,
    num_frees: 0,
    num_ooms: 0,
});

fn stats() -> std::sync::MutexGuard<'static, TFL_MemoryStats> {
    STATS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn layout(nbytes: usize) -> Option<Layout> {
    Layout::from_size_align(nbytes.checked_add(ALIGNMENT)?, ALIGNMENT).ok()
}

unsafe extern "C" fn allocate(device: i32, nbytes: usize, out: *mut *mut c_void) -> Status {
    if let Err(e) = check_device(device) {
        return e;
    }
    let mut s = stats();
    if nbytes as u64 > CAPACITY - s.allocated_bytes {
        s.num_ooms += 1;
        let in_use = s.allocated_bytes;
        return error(
            TFL_ERROR_OUT_OF_MEMORY,
            format!("cannot allocate {nbytes} bytes ({in_use} of {CAPACITY} in use)"),
        );
    }
    // SAFETY: the layout has a non-zero size (nbytes + ALIGNMENT).
    let base = layout(nbytes).map_or(std::ptr::null_mut(), |l| unsafe { alloc(l) });
    if base.is_null() {
        return error(
            TFL_ERROR_OUT_OF_MEMORY,
            format!("host allocation of {nbytes} bytes failed"),
        );
    }
    s.allocated_bytes += nbytes as u64;
    s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
    s.num_allocations += 1;
    // SAFETY: the block is ALIGNMENT-aligned and larger than the header; `out` is valid.
    unsafe {
        base.cast::<usize>().write(nbytes);
        *out = base.add(ALIGNMENT).cast();
    }
    std::ptr::null_mut()
}

unsafe extern "C" fn deallocate(device: i32, ptr: *mut c_void) -> Status {
    if let Err(e) = check_device(device) {
        return e;
    }
    if ptr.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `ptr` came from `allocate`, ALIGNMENT bytes after its block's header.
    let (base, nbytes) = unsafe {
        let base = ptr.cast::<u8>().sub(ALIGNMENT);
        (base, base.cast::<usize>().read())
    };
    if let Some(l) = layout(nbytes) {
        // SAFETY: the block was allocated with this very layout.
        unsafe { dealloc(base, l) };
    }
    let mut s = stats();
    s.allocated_bytes -= nbytes as u64;
    s.num_frees += 1;
    std::ptr::null_mut()
}

unsafe extern "C" fn copy(args: *const TFL_CopyArgs) -> Status {
    // SAFETY: the host validated both buffers for nbytes; all memory is host
    // memory, so every kind of copy is a memmove.
    unsafe {
        let a = &*args;
        if a.nbytes > 0 {
            std::ptr::copy(a.src.cast::<u8>(), a.dst.cast::<u8>(), a.nbytes);
        }
    }
    std::ptr::null_mut()
}

unsafe extern "C" fn set_memory(
    device: i32,
    ptr: *mut c_void,
    value: u8,
    nbytes: usize,
    _: *mut TFL_Stream,
) -> Status {
    // SAFETY: the host passes nbytes of this device's memory at `ptr`.
    status(
        check_device(device)
            .map(|()| unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), value, nbytes) }),
    )
}

unsafe extern "C" fn memory_stats(device: i32, out: *mut TFL_MemoryStats) -> Status {
    if let Err(e) = check_device(device) {
        return e;
    }
    let mut snapshot = *stats();
    snapshot.reserved_bytes = snapshot.allocated_bytes;
    // SAFETY: `out` is valid; write only as far as the caller's struct_size covers.
    unsafe {
        snapshot.struct_size = (*out).struct_size;
        let n = snapshot
            .struct_size
            .min(std::mem::size_of::<TFL_MemoryStats>());
        std::ptr::copy_nonoverlapping((&raw const snapshot).cast::<u8>(), out.cast::<u8>(), n);
    }
    std::ptr::null_mut()
}

// --- Streams and events: bookkeeping, all work is synchronous -------------

struct Stream {
    created: bool,
}

struct Event {
    timing: bool,
    recorded: Mutex<Option<Instant>>,
}

static DEFAULT_STREAMS: [Stream; DEVICES as usize] =
    [const { Stream { created: false } }; DEVICES as usize];

unsafe extern "C" fn default_stream(device: i32, out: *mut *mut TFL_Stream) -> Status {
    // SAFETY: `out` is valid; the host never writes through a stream handle.
    status(check_device(device).map(|()| unsafe {
        *out = std::ptr::from_ref(&DEFAULT_STREAMS[device as usize])
            .cast_mut()
            .cast();
    }))
}

unsafe extern "C" fn stream_create(
    device: i32,
    _priority: i32,
    out: *mut *mut TFL_Stream,
) -> Status {
    // SAFETY: `out` is valid; the host owns the stream until stream_destroy.
    status(
        check_device(device)
            .map(|()| unsafe { *out = Box::into_raw(Box::new(Stream { created: true })).cast() }),
    )
}

unsafe extern "C" fn stream_destroy(stream: *mut TFL_Stream) -> Status {
    // SAFETY: `stream` came from default_stream or stream_create.
    if !unsafe { (*stream.cast::<Stream>()).created } {
        return error(
            TFL_ERROR_INVALID_ARGUMENT,
            "the default stream cannot be destroyed".into(),
        );
    }
    // SAFETY: created by Box::into_raw in stream_create, destroyed once.
    drop(unsafe { Box::from_raw(stream.cast::<Stream>()) });
    std::ptr::null_mut()
}

unsafe extern "C" fn stream_synchronize(_: *mut TFL_Stream) -> Status {
    std::ptr::null_mut()
}

unsafe extern "C" fn stream_query(_: *mut TFL_Stream, done: *mut u8) -> Status {
    // SAFETY: `done` is valid for writes.
    unsafe { *done = 1 };
    std::ptr::null_mut()
}

unsafe extern "C" fn stream_wait_event(_: *mut TFL_Stream, _: *mut TFL_Event) -> Status {
    std::ptr::null_mut()
}

unsafe extern "C" fn event_create(device: i32, flags: u32, out: *mut *mut TFL_Event) -> Status {
    let event = Event {
        timing: flags & TFL_EVENT_TIMING != 0,
        recorded: Mutex::new(None),
    };
    // SAFETY: `out` is valid; the host owns the event until event_destroy.
    status(check_device(device).map(|()| unsafe { *out = Box::into_raw(Box::new(event)).cast() }))
}

unsafe extern "C" fn event_destroy(event: *mut TFL_Event) -> Status {
    // SAFETY: created by Box::into_raw in event_create, destroyed once.
    drop(unsafe { Box::from_raw(event.cast::<Event>()) });
    std::ptr::null_mut()
}

fn recorded(event: *mut TFL_Event) -> Option<Instant> {
    // SAFETY: `event` came from event_create and is alive for the call.
    *unsafe { &*event.cast::<Event>() }
        .recorded
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

unsafe extern "C" fn event_record(event: *mut TFL_Event, _: *mut TFL_Stream) -> Status {
    // SAFETY: as in `recorded`.
    let event = unsafe { &*event.cast::<Event>() };
    *event
        .recorded
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    std::ptr::null_mut()
}

unsafe extern "C" fn event_query(_: *mut TFL_Event, done: *mut u8) -> Status {
    // SAFETY: `done` is valid for writes.
    unsafe { *done = 1 };
    std::ptr::null_mut()
}

unsafe extern "C" fn event_synchronize(_: *mut TFL_Event) -> Status {
    std::ptr::null_mut()
}

unsafe extern "C" fn event_elapsed_time(
    start: *mut TFL_Event,
    end: *mut TFL_Event,
    out_ms: *mut f32,
) -> Status {
    // SAFETY: both events came from event_create and are alive for the call.
    if !unsafe { (*start.cast::<Event>()).timing && (*end.cast::<Event>()).timing } {
        return error(
            TFL_ERROR_FAILED_PRECONDITION,
            "both events need TFL_EVENT_TIMING".into(),
        );
    }
    let (Some(t0), Some(t1)) = (recorded(start), recorded(end)) else {
        return error(
            TFL_ERROR_FAILED_PRECONDITION,
            "both events must be recorded first".into(),
        );
    };
    let ms = match t1.checked_duration_since(t0) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(t0.duration_since(t1).as_secs_f64() * 1e3),
    };
    // SAFETY: `out_ms` is valid for writes.
    unsafe { *out_ms = ms as f32 };
    std::ptr::null_mut()
}

// --- Kernels: float32, any strides, inputs broadcast to the output ---------

/// A float32 tensor argument: (data, shape, strides in elements).
struct View {
    data: *mut f32,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// # Safety
/// `t` is NULL or a tensor valid for the kernel call.
unsafe fn view(t: *const TFL_Tensor, what: &str) -> Result<View, Status> {
    // SAFETY: per the contract above.
    let t = unsafe { t.as_ref() }
        .ok_or_else(|| error(TFL_ERROR_INVALID_ARGUMENT, format!("{what} is missing")))?;
    if (t.dtype.code, t.dtype.bits, t.dtype.lanes) != (TFL_DTYPE_FLOAT, 32, 1) {
        return Err(error(
            TFL_ERROR_UNIMPLEMENTED,
            format!("{what}: only float32 is implemented"),
        ));
    }
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    // SAFETY: a valid tensor has ndim entries in shape and strides, and data + byte_offset in bounds.
    unsafe {
        Ok(View {
            data: t.data.cast::<u8>().add(t.byte_offset as usize).cast(),
            shape: (0..ndim).map(|d| *t.shape.add(d)).collect(),
            strides: (0..ndim).map(|d| *t.strides.add(d)).collect(),
        })
    }
}

/// Element strides of `v` seen through `shape` (0 where broadcast).
fn broadcast(v: &View, shape: &[i64]) -> Option<Vec<i64>> {
    let lead = shape.len().checked_sub(v.shape.len())?;
    let mut strides = vec![0; shape.len()];
    for (d, (&n, &s)) in v.shape.iter().zip(&v.strides).enumerate() {
        match n {
            _ if n == shape[lead + d] => strides[lead + d] = s,
            1 => {}
            _ => return None,
        }
    }
    Some(strides)
}

/// out = f(a, b) elementwise for a kernel taking (self, other[, alpha]).
///
/// # Safety
/// `frame` is the call frame the host passed to the kernel.
unsafe fn binary(frame: *const TFL_CallFrame, f: impl Fn(f32, f32, f32) -> f32) -> Status {
    // SAFETY: the frame and everything it points to are valid for the call.
    let result = unsafe {
        let frame = &*frame;
        let op = std::ffi::CStr::from_ptr(frame.op_name).to_string_lossy();
        let args = std::slice::from_raw_parts(frame.args, frame.num_args);
        let outputs = std::slice::from_raw_parts(frame.outputs, frame.num_outputs);
        let tensor = |i: usize| match args.get(i) {
            Some(&v) if (*v).tag == TFL_VALUE_TENSOR => {
                view((*v).u.tensor, &format!("{op}: argument {i}"))
            }
            _ => Err(error(
                TFL_ERROR_INVALID_ARGUMENT,
                format!("{op}: argument {i} must be a tensor"),
            )),
        };
        let alpha = match args.get(2) {
            Some(&v) if (*v).tag == TFL_VALUE_SCALAR => match (*v).u.scalar.kind {
                TFL_SCALAR_INT => (*v).u.scalar.v.i as f32,
                TFL_SCALAR_BOOL => f32::from((*v).u.scalar.v.b),
                _ => (*v).u.scalar.v.f as f32,
            },
            _ => 1.0,
        };
        match (
            tensor(0),
            tensor(1),
            outputs
                .first()
                .map(|&o| view(o, &format!("{op}: the output"))),
        ) {
            (Ok(a), Ok(b), Some(Ok(out))) => elementwise(&a, &b, &out, |x, y| f(x, y, alpha)),
            (Err(e), ..) | (_, Err(e), _) | (.., Some(Err(e))) => Err(e),
            (.., None) => Err(error(
                TFL_ERROR_INVALID_ARGUMENT,
                format!("{op}: no output tensor"),
            )),
        }
    };
    status(result)
}

/// # Safety
/// The views describe valid float32 tensors; `out` does not overlap the inputs partially.
unsafe fn elementwise(
    a: &View,
    b: &View,
    out: &View,
    f: impl Fn(f32, f32) -> f32,
) -> Result<(), Status> {
    let (Some(sa), Some(sb)) = (broadcast(a, &out.shape), broadcast(b, &out.shape)) else {
        return Err(error(
            TFL_ERROR_INVALID_ARGUMENT,
            "the input shapes do not broadcast to the output".into(),
        ));
    };
    let numel: i64 = out.shape.iter().product();
    let mut index = vec![0i64; out.shape.len()];
    for _ in 0..numel {
        let offset =
            |strides: &[i64]| index.iter().zip(strides).map(|(i, s)| i * s).sum::<i64>() as isize;
        // SAFETY: every index is within the shapes, so every offset is in bounds.
        unsafe {
            *out.data.offset(offset(&out.strides)) =
                f(*a.data.offset(offset(&sa)), *b.data.offset(offset(&sb)))
        };
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < out.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Ok(())
}

/// add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
///
/// # Safety
/// Called by the host with a valid call frame.
#[no_mangle]
pub unsafe extern "C" fn torch_fl_op_add_Tensor(frame: *const TFL_CallFrame) -> Status {
    // SAFETY: the host's frame, passed on.
    unsafe { binary(frame, |a, b, alpha| a + alpha * b) }
}

/// mul.Tensor(Tensor self, Tensor other) -> Tensor
///
/// # Safety
/// Called by the host with a valid call frame.
#[no_mangle]
pub unsafe extern "C" fn torch_fl_op_mul_Tensor(frame: *const TFL_CallFrame) -> Status {
    // SAFETY: the host's frame, passed on.
    unsafe { binary(frame, |a, b, _| a * b) }
}

// --- The op table, the function table and the bootstrap symbol ------------

struct Ops([TFL_OpEntry; 2]);
// SAFETY: the entries hold pointers to static strings and functions only.
unsafe impl Sync for Ops {}
unsafe impl Send for Ops {}

static OPS: OnceLock<Ops> = OnceLock::new();

fn op(
    name: &'static std::ffi::CStr,
    symbol: &'static std::ffi::CStr,
    kernel: TFL_KernelFn,
) -> TFL_OpEntry {
    TFL_OpEntry {
        struct_size: struct_size!(TFL_OpEntry, infer_outputs),
        name: name.as_ptr(),
        symbol: symbol.as_ptr(),
        kernel: Some(kernel),
        flags: 0,
        schema: std::ptr::null(),
        infer_outputs: None,
    }
}

unsafe extern "C" fn get_op_table(out: *mut TFL_OpTable) -> Status {
    let ops = &OPS
        .get_or_init(|| {
            Ops([
                op(
                    c"add.Tensor",
                    c"torch_fl_op_add_Tensor",
                    torch_fl_op_add_Tensor,
                ),
                op(
                    c"mul.Tensor",
                    c"torch_fl_op_mul_Tensor",
                    torch_fl_op_mul_Tensor,
                ),
            ])
        })
        .0;
    // SAFETY: `out` is valid and its struct_size covers the 1.0 fields.
    unsafe {
        (*out).entries = ops.as_ptr();
        (*out).num_entries = ops.len();
        (*out).entry_size = std::mem::size_of::<TFL_OpEntry>();
    }
    std::ptr::null_mut()
}

static API: OnceLock<TFL_PluginApi> = OnceLock::new();

/// The bootstrap symbol torch-fl looks up.
///
/// # Safety
/// Called by the host with its service table (unused here).
#[no_mangle]
pub unsafe extern "C" fn torch_fl_plugin_get_api(
    _host: *const TFL_HostApi,
) -> *const TFL_PluginApi {
    API.get_or_init(|| TFL_PluginApi {
        struct_size: struct_size!(TFL_PluginApi, get_activity),
        abi_major: TFL_ABI_VERSION_MAJOR,
        abi_minor: TFL_ABI_VERSION_MINOR,
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
        reset_peak_memory_stats: None,
        empty_cache: None,
        get_collectives: None,
        host_allocate: None,
        host_deallocate: None,
        probe_devices: Some(probe_devices),
        get_graphs: None,
        get_activity: None,
    })
}

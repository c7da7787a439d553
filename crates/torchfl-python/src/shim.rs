//! The C++ shim, seen from Rust: loading it and calling its C interface
//! (`cpp_shim/include/torchfl_shim.h`). The only FFI in this crate.
//!
//! The shim links libtorch, so it is loaded at run time, after `import
//! torch`, rather than linked into this extension: `torch_fl._native`
//! imports under any torch version and can say clearly when the shim was
//! built for another one.

use std::ffi::{c_char, CStr, CString};
use std::path::Path;
use std::sync::OnceLock;

use torchfl_ffi::{struct_size, TFL_KernelFn, TFL_PluginApi};

/// The interface version this crate speaks (`TFL_SHIM_INTERFACE_VERSION`).
const INTERFACE_VERSION: u32 = 7;

/// `TFL_ShimDevice`.
#[repr(C)]
struct ShimDevice {
    struct_size: usize,
    device_name: *const c_char,
    plugin_label: *const c_char,
    api: *const TFL_PluginApi,
    abi_minor: u32,
    device_count: i32,
    capabilities: u64,
    /// The calling thread's in-flight record (`torchfl_core::inflight`).
    inflight_slot: Option<extern "C" fn() -> *mut torchfl_core::inflight::InFlight>,
    /// The kernel-symbol mangling ([`kernel_symbol`]).
    kernel_symbol: Option<unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> usize>,
    /// The ABI kind of a schema type ([`argument_kind`]).
    argument_kind: Option<unsafe extern "C" fn(*const c_char) -> i32>,
}

/// `TFL_ShimDevice.kernel_symbol`: the shim names the symbol a plugin would
/// export for an operator with `torchfl_ffi::kernel_symbol`, the one
/// definition of the mangling rule. Writes it NUL-terminated into `out`
/// when `capacity` covers it and returns its length; 0 for a malformed
/// name.
///
/// # Safety
///
/// `op_name` is NULL or a NUL-terminated string; `out` is NULL or writable
/// for `capacity` bytes.
unsafe extern "C" fn kernel_symbol(op_name: *const c_char, out: *mut c_char, capacity: usize) -> usize {
    if op_name.is_null() {
        return 0;
    }
    // SAFETY: the caller passes a NUL-terminated string (contract above).
    let name = unsafe { CStr::from_ptr(op_name) };
    let Some(symbol) = name.to_str().ok().and_then(|n| torchfl_ffi::kernel_symbol(n).ok()) else {
        return 0;
    };
    if !out.is_null() && symbol.len() < capacity {
        // SAFETY: `out` is writable for `capacity` bytes, which cover the
        // symbol and its NUL; the symbol is a fresh String, so they do not
        // overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(symbol.as_ptr(), out.cast::<u8>(), symbol.len());
            *out.add(symbol.len()) = 0;
        }
    }
    symbol.len()
}

/// `TFL_ShimArgKind` of a schema type: the kinds of
/// [`torchfl_core::schema::parse_type`], the one map from schema types to
/// ABI kinds, in the shim's numbering.
fn shim_arg_kind(kind: torchfl_core::schema::Kind) -> i32 {
    use torchfl_core::schema::Kind;
    match kind {
        Kind::Tensor => 0,
        Kind::TensorList => 1,
        Kind::OptionalTensorList => 2,
        Kind::Int | Kind::ScalarType | Kind::Layout | Kind::MemoryFormat => 3,
        Kind::Float => 4,
        Kind::Bool => 5,
        Kind::Scalar => 6,
        Kind::IntList(_) => 7,
        Kind::FloatList(_) => 8,
        Kind::BoolList(_) => 9,
        Kind::Str => 10,
        Kind::Device => 11,
        Kind::Generator => 12,
    }
}

/// `TFL_ShimDevice.argument_kind`: the `TFL_ShimArgKind` of the schema
/// type `ty` as PyTorch prints it, or -1 when the plugin ABI cannot pass it.
///
/// # Safety
///
/// `ty` is NULL or a NUL-terminated string.
unsafe extern "C" fn argument_kind(ty: *const c_char) -> i32 {
    if ty.is_null() {
        return -1;
    }
    // SAFETY: the caller passes a NUL-terminated string (contract above).
    let ty = unsafe { CStr::from_ptr(ty) };
    match ty.to_str().ok().map(torchfl_core::schema::parse_type) {
        Some(Ok((kind, _optional))) => shim_arg_kind(kind),
        _ => -1,
    }
}

/// `TFL_ShimKernel`.
#[repr(C)]
struct ShimKernel {
    struct_size: usize,
    op_name: *const c_char,
    kernel: TFL_KernelFn,
    flags: u64,
    owner_api: *const TFL_PluginApi,
    plugin_label: *const c_char,
    foreign: i32,
    /// For operators outside `aten`: the schema to define them with.
    schema: *const c_char,
    /// `TFL_OpEntry.infer_outputs`, for operators outside `aten`.
    infer_outputs: Option<torchfl_ffi::TFL_InferOutputsFn>,
}

/// `TFL_ShimFallbackCount`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ShimFallbackCount {
    op_name: *const c_char,
    count: u64,
}

/// How a kernel was registered (`TFL_ShimRegistration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Registered,
    RegisteredAsOut,
    SkippedCompositeImplicit,
    SkippedView,
    SkippedBuiltin,
    /// Another library's operator, bound once that library defines it.
    Deferred,
}

impl Outcome {
    fn from_raw(v: i32) -> Option<Self> {
        Some(match v {
            0 => Self::Registered,
            1 => Self::RegisteredAsOut,
            2 => Self::SkippedCompositeImplicit,
            3 => Self::SkippedView,
            4 => Self::SkippedBuiltin,
            5 => Self::Deferred,
            _ => return None,
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Registered => "registered",
            Self::RegisteredAsOut => "registered_as_out",
            Self::SkippedCompositeImplicit => "skipped_composite_implicit",
            Self::SkippedView => "skipped_view",
            Self::SkippedBuiltin => "skipped_builtin",
            Self::Deferred => "deferred",
        }
    }
}

type AttachFn = unsafe extern "C" fn(*const ShimDevice, *mut c_char, usize) -> i32;
type RegisterFn = unsafe extern "C" fn(*const ShimKernel, *mut i32, *mut c_char, usize) -> i32;
type CountsFn = unsafe extern "C" fn(*mut ShimFallbackCount, usize) -> usize;

/// `TFL_ShimLayerProfile`: where operator time went (see
/// `cpp_shim/src/observe/layer_profile.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LayerProfile {
    pub(crate) entries: u64,
    pub(crate) entry_ns: u64,
    pub(crate) kernel_ns: u64,
    pub(crate) kernel_calls: u64,
    pub(crate) alloc_ns: u64,
    pub(crate) alloc_calls: u64,
}

/// `TFL_ShimSyncCounts`: host synchronizations the shim made.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SyncCounts {
    pub(crate) host_kernel_waits: u64,
    pub(crate) copy_waits: u64,
}

/// The shim's entry points, resolved once.
struct Shim {
    _library: libloading::Library,
    torch_version: String,
    attach: AttachFn,
    register: RegisterFn,
    set_fallback_mode: unsafe extern "C" fn(i32),
    fallback_mode: unsafe extern "C" fn() -> i32,
    fallback_counts: CountsFn,
    reset_fallback_counts: unsafe extern "C" fn(),
    set_layer_profiling: unsafe extern "C" fn(i32),
    layer_profile: unsafe extern "C" fn(*mut LayerProfile),
    reset_layer_profile: unsafe extern "C" fn(),
    layer_profile_operators: unsafe extern "C" fn(*mut c_char, usize, *mut usize, *mut c_char, usize) -> i32,
    current_stream: unsafe extern "C" fn(i32, *mut *mut std::ffi::c_void, *mut c_char, usize) -> i32,
    memory_snapshot: unsafe extern "C" fn(*mut c_char, usize, *mut usize, *mut c_char, usize) -> i32,
    allocator_backend: unsafe extern "C" fn(*mut i32, *mut c_char, usize) -> i32,
    default_generator: unsafe extern "C" fn(i32, *mut *mut std::ffi::c_void, *mut c_char, usize) -> i32,
    wait_current_stream_if_pending: unsafe extern "C" fn(i32, *mut i32, *mut c_char, usize) -> i32,
    sync_counts: unsafe extern "C" fn(*mut SyncCounts),
    reset_sync_counts: unsafe extern "C" fn(),
    trace_begin: unsafe extern "C" fn(*mut u64, *mut c_char, usize) -> i32,
    trace_collect: unsafe extern "C" fn(u64, *mut c_char, usize, *mut usize, *mut c_char, usize) -> i32,
    trace_end: unsafe extern "C" fn(),
}

static SHIM: OnceLock<Shim> = OnceLock::new();

fn shim() -> Result<&'static Shim, String> {
    SHIM.get().ok_or_else(|| "the torch-fl C++ shim is not loaded (import torch_fl first)".to_owned())
}

/// Copies a symbol's value out of the library.
///
/// # Safety
/// `T` must be the symbol's true type.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
    // SAFETY: forwarded to the caller.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("the torch-fl shim does not export {name}: {e}"))
}

/// Loads the shim at `path` (once per process) and returns the PyTorch
/// version it was compiled against.
pub(crate) fn load(path: &Path) -> Result<String, String> {
    if let Some(shim) = SHIM.get() {
        return Ok(shim.torch_version.clone());
    }
    #[cfg(unix)]
    // SAFETY: loading runs the shim's static registrations with PyTorch,
    // which is what loading it is for; torch is imported by the caller.
    let library: libloading::Library = unsafe {
        libloading::os::unix::Library::open(
            Some(path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .map(Into::into)
    .map_err(|e| format!("cannot load the torch-fl shim {}: {e}", path.display()))?;
    #[cfg(not(unix))]
    // SAFETY: as above.
    let library = unsafe { libloading::Library::new(path) }
        .map_err(|e| format!("cannot load the torch-fl shim {}: {e}", path.display()))?;

    // SAFETY: each type below is the header's declaration of that symbol.
    let shim = unsafe {
        let version: unsafe extern "C" fn() -> u32 = symbol(&library, "tfl_shim_interface_version")?;
        let found = version();
        if found != INTERFACE_VERSION {
            return Err(format!(
                "the torch-fl shim {} speaks interface {found}, this package {INTERFACE_VERSION}: reinstall torch-fl",
                path.display()
            ));
        }
        let torch_version: unsafe extern "C" fn() -> *const c_char =
            symbol(&library, "tfl_shim_torch_version")?;
        let torch_version = CStr::from_ptr(torch_version()).to_string_lossy().into_owned();
        Shim {
            torch_version,
            attach: symbol(&library, "tfl_shim_attach_device")?,
            register: symbol(&library, "tfl_shim_register_kernel")?,
            set_fallback_mode: symbol(&library, "tfl_shim_set_fallback_mode")?,
            fallback_mode: symbol(&library, "tfl_shim_fallback_mode")?,
            fallback_counts: symbol(&library, "tfl_shim_fallback_counts")?,
            reset_fallback_counts: symbol(&library, "tfl_shim_reset_fallback_counts")?,
            set_layer_profiling: symbol(&library, "tfl_shim_set_layer_profiling")?,
            layer_profile: symbol(&library, "tfl_shim_layer_profile")?,
            reset_layer_profile: symbol(&library, "tfl_shim_reset_layer_profile")?,
            layer_profile_operators: symbol(&library, "tfl_shim_layer_profile_operators")?,
            current_stream: symbol(&library, "tfl_shim_current_stream")?,
            memory_snapshot: symbol(&library, "tfl_shim_memory_snapshot")?,
            allocator_backend: symbol(&library, "tfl_shim_allocator_backend")?,
            default_generator: symbol(&library, "tfl_shim_default_generator")?,
            wait_current_stream_if_pending: symbol(&library, "tfl_shim_wait_current_stream_if_pending")?,
            sync_counts: symbol(&library, "tfl_shim_sync_counts")?,
            reset_sync_counts: symbol(&library, "tfl_shim_reset_sync_counts")?,
            trace_begin: symbol(&library, "tfl_shim_trace_begin")?,
            trace_collect: symbol(&library, "tfl_shim_trace_collect")?,
            trace_end: symbol(&library, "tfl_shim_trace_end")?,
            _library: library,
        }
    };
    let version = shim.torch_version.clone();
    // A concurrent loader may have won; either shim is the same library.
    let _ = SHIM.set(shim);
    Ok(version)
}

fn c_string(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

fn message(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Makes `plugin` the runtime of the PrivateUse1 device `name`.
pub(crate) fn attach_device(name: &str, plugin: &torchfl_core::Plugin) -> Result<(), String> {
    let shim = shim()?;
    let (name, label) = (c_string(name)?, c_string(plugin.label())?);
    let device = ShimDevice {
        struct_size: struct_size!(ShimDevice, argument_kind),
        device_name: name.as_ptr(),
        plugin_label: label.as_ptr(),
        api: plugin.api_address() as *const TFL_PluginApi,
        abi_minor: plugin.abi().effective.minor,
        device_count: plugin.device_count(),
        capabilities: plugin.capabilities().bits(),
        inflight_slot: Some(torchfl_core::inflight::torchfl_inflight_slot),
        kernel_symbol: Some(kernel_symbol),
        argument_kind: Some(argument_kind),
    };
    let mut error = [0u8; 1024];
    // SAFETY: `device` and its strings outlive the call; the plugin table
    // lives as long as the process (plugins are never unloaded); `error` is
    // writable for its length.
    let code = unsafe { (shim.attach)(&device, error.as_mut_ptr().cast(), error.len()) };
    if code == 0 {
        Ok(())
    } else {
        Err(message(&error))
    }
}

/// `TFL_SHIM_ERROR_UNKNOWN_OP`: PyTorch has no such operator.
pub(crate) const ERROR_UNKNOWN_OP: i32 = 3;

/// Registers one operator's winning kernel; `Ok(outcome)`, or the shim's
/// error code (`TFL_SHIM_ERROR_*`, 0 when the shim was not reached) and
/// message.
pub(crate) fn register_kernel(
    registration: &torchfl_core::Registration,
    runtime: &torchfl_core::Plugin,
) -> Result<Outcome, (i32, String)> {
    let shim = shim().map_err(|m| (0, m))?;
    let op = &registration.kernel;
    let strings = || -> Result<_, String> {
        Ok((
            c_string(&op.name)?,
            c_string(registration.plugin.label())?,
            op.schema.as_deref().map(c_string).transpose()?,
        ))
    };
    let (name, label, schema) = strings().map_err(|m| (0, m))?;
    let kernel = ShimKernel {
        struct_size: struct_size!(ShimKernel, infer_outputs),
        op_name: name.as_ptr(),
        kernel: op.kernel,
        flags: op.flags,
        owner_api: registration.plugin.api_address() as *const TFL_PluginApi,
        plugin_label: label.as_ptr(),
        foreign: i32::from(!std::ptr::eq(registration.plugin.as_ref(), runtime)),
        schema: schema.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
        infer_outputs: op.infer_outputs,
    };
    let mut outcome = -1;
    let mut error = [0u8; 1024];
    // SAFETY: as in attach_device; `outcome` is a valid out-pointer.
    let code = unsafe { (shim.register)(&kernel, &mut outcome, error.as_mut_ptr().cast(), error.len()) };
    if code != 0 {
        return Err((code, message(&error)));
    }
    Outcome::from_raw(outcome).ok_or_else(|| (0, format!("the shim returned an unknown outcome {outcome}")))
}

pub(crate) fn set_fallback_mode(mode: i32) -> Result<(), String> {
    let shim = shim()?;
    // SAFETY: plain value argument.
    unsafe { (shim.set_fallback_mode)(mode) };
    Ok(())
}

pub(crate) fn fallback_mode() -> Result<i32, String> {
    let shim = shim()?;
    // SAFETY: no arguments.
    Ok(unsafe { (shim.fallback_mode)() })
}

/// Per-operator fallback counts.
pub(crate) fn fallback_counts() -> Result<Vec<(String, u64)>, String> {
    let shim = shim()?;
    // Ask for the size first, then fetch; retry if operators were added in
    // between.
    let mut capacity = 64;
    loop {
        let mut buf = vec![ShimFallbackCount { op_name: std::ptr::null(), count: 0 }; capacity];
        // SAFETY: `buf` is writable for `capacity` entries.
        let total = unsafe { (shim.fallback_counts)(buf.as_mut_ptr(), capacity) };
        if total <= capacity {
            return Ok(buf[..total]
                .iter()
                .map(|c| {
                    // SAFETY: the shim wrote `total` entries whose names stay
                    // valid until its next call, and we copy them now.
                    let name = unsafe { CStr::from_ptr(c.op_name) }.to_string_lossy().into_owned();
                    (name, c.count)
                })
                .collect());
        }
        capacity = total;
    }
}

pub(crate) fn reset_fallback_counts() -> Result<(), String> {
    let shim = shim()?;
    // SAFETY: no arguments.
    unsafe { (shim.reset_fallback_counts)() };
    Ok(())
}

pub(crate) fn set_layer_profiling(on: bool) -> Result<(), String> {
    let shim = shim()?;
    // SAFETY: plain value argument.
    unsafe { (shim.set_layer_profiling)(i32::from(on)) };
    Ok(())
}

pub(crate) fn layer_profile() -> Result<LayerProfile, String> {
    let shim = shim()?;
    let mut out = LayerProfile::default();
    // SAFETY: `out` is a valid, writable `TFL_ShimLayerProfile`.
    unsafe { (shim.layer_profile)(&mut out) };
    Ok(out)
}

pub(crate) fn reset_layer_profile() -> Result<(), String> {
    let shim = shim()?;
    // SAFETY: no arguments.
    unsafe { (shim.reset_layer_profile)() };
    Ok(())
}

/// Synchronizes this thread's current stream of `device` (-1: the current
/// device) if work was queued on it since the last such wait; whether it
/// waited.
pub(crate) fn wait_current_stream_if_pending(device: i32) -> Result<bool, String> {
    let shim = shim()?;
    let mut waited: i32 = 0;
    let mut error = [0u8; 1024];
    // SAFETY: `waited` and `error` are writable for the call.
    let code = unsafe {
        (shim.wait_current_stream_if_pending)(device, &mut waited, error.as_mut_ptr().cast(), error.len())
    };
    if code == 0 {
        Ok(waited != 0)
    } else {
        Err(message(&error))
    }
}

/// The host synchronization counters.
pub(crate) fn sync_counts() -> Result<SyncCounts, String> {
    let shim = shim()?;
    let mut out = SyncCounts::default();
    // SAFETY: `out` is a writable TFL_ShimSyncCounts.
    unsafe { (shim.sync_counts)(&mut out) };
    Ok(out)
}

/// Zeroes the host synchronization counters.
pub(crate) fn reset_sync_counts() -> Result<(), String> {
    let shim = shim()?;
    // SAFETY: the symbol takes no arguments.
    unsafe { (shim.reset_sync_counts)() };
    Ok(())
}

/// The raw `TFL_Stream*` of PyTorch's current stream of `device` on this
/// thread.
pub(crate) fn current_stream(device: i32) -> Result<usize, String> {
    let shim = shim()?;
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut error = [0u8; 1024];
    // SAFETY: `out` and `error` are writable for the call.
    let code = unsafe { (shim.current_stream)(device, &mut out, error.as_mut_ptr().cast(), error.len()) };
    if code == 0 {
        Ok(out as usize)
    } else {
        Err(message(&error))
    }
}

/// The layer profile per operator, a JSON array (see
/// `tfl_shim_layer_profile_operators`).
pub(crate) fn layer_profile_operators() -> Result<String, String> {
    let shim = shim()?;
    read_document("the per-operator layer profile", |out, capacity, len, error, error_len| {
        // SAFETY: forwarded from read_document, which passes writable buffers.
        unsafe { (shim.layer_profile_operators)(out, capacity, len, error, error_len) }
    })
}

/// The device allocator's snapshot, a JSON document (see
/// `tfl_shim_memory_snapshot`).
pub(crate) fn memory_snapshot() -> Result<String, String> {
    let shim = shim()?;
    read_document("the memory snapshot", |out, capacity, len, error, error_len| {
        // SAFETY: forwarded from read_document, which passes writable buffers.
        unsafe { (shim.memory_snapshot)(out, capacity, len, error, error_len) }
    })
}

/// Reads a document the shim writes the way `tfl_shim_memory_snapshot`
/// does: its length first, then the bytes once the buffer is large enough.
fn read_document(
    what: &str,
    call: impl Fn(*mut c_char, usize, *mut usize, *mut c_char, usize) -> i32,
) -> Result<String, String> {
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let mut len = 0usize;
        let mut error = [0u8; 1024];
        // `buffer` is writable for `buffer.len()` bytes, `len` and `error`
        // for the call.
        let code =
            call(buffer.as_mut_ptr().cast(), buffer.len(), &mut len, error.as_mut_ptr().cast(), error.len());
        if code != 0 {
            return Err(message(&error));
        }
        if len <= buffer.len() {
            buffer.truncate(len);
            return String::from_utf8(buffer).map_err(|e| format!("{what} is not UTF-8: {e}"));
        }
        // The document may grow between the two calls: leave room.
        buffer.resize(len + len / 4 + 1024, 0);
    }
}

/// Starts a device-trace consumer; returns where its records begin.
pub(crate) fn trace_begin() -> Result<u64, String> {
    let shim = shim()?;
    let mut start = 0u64;
    let mut error = [0u8; 1024];
    // SAFETY: `start` and `error` are writable for the call.
    let code = unsafe { (shim.trace_begin)(&mut start, error.as_mut_ptr().cast(), error.len()) };
    if code == 0 {
        Ok(start)
    } else {
        Err(message(&error))
    }
}

/// The device-trace records since `start`, as the shim's JSON document.
pub(crate) fn trace_collect(start: u64) -> Result<String, String> {
    let shim = shim()?;
    read_document("the device trace", |out, capacity, len, error, error_len| {
        // SAFETY: forwarded from read_document, which passes writable buffers.
        unsafe { (shim.trace_collect)(start, out, capacity, len, error, error_len) }
    })
}

/// Ends a device-trace consumer.
pub(crate) fn trace_end() -> Result<(), String> {
    let shim = shim()?;
    // SAFETY: no arguments; callable at any time.
    unsafe { (shim.trace_end)() };
    Ok(())
}

/// "caching" when device allocations go through torch-fl's caching
/// allocator, "plugin" when they go straight to the plugin.
pub(crate) fn allocator_backend() -> Result<&'static str, String> {
    let shim = shim()?;
    let mut caching = 0i32;
    let mut error = [0u8; 1024];
    // SAFETY: `caching` and `error` are writable for the call; callable
    // before and after attach.
    let code = unsafe { (shim.allocator_backend)(&mut caching, error.as_mut_ptr().cast(), error.len()) };
    if code != 0 {
        return Err(format!(
            "TORCH_FL_ALLOC_CONF={:?} is invalid: {}. Set backend:caching (the default) or backend:plugin, or unset it",
            std::env::var("TORCH_FL_ALLOC_CONF").unwrap_or_default(),
            message(&error)
        ));
    }
    Ok(if caching == 1 { "caching" } else { "plugin" })
}

/// A new reference to the Python `torch.Generator` of `device`'s default
/// generator, or NULL with a Python exception set (the caller holds the GIL).
pub(crate) fn default_generator(device: i32) -> Result<*mut pyo3::ffi::PyObject, String> {
    let shim = shim()?;
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut error = [0u8; 1024];
    // SAFETY: `out` and `error` are writable for the call; the caller holds
    // the GIL, which the shim's Python calls need.
    let code = unsafe { (shim.default_generator)(device, &mut out, error.as_mut_ptr().cast(), error.len()) };
    if code == 0 {
        Ok(out.cast())
    } else {
        Err(message(&error))
    }
}

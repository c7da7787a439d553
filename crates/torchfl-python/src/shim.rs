//! The C++ shim, seen from Rust: the table of `cpp_shim/include/torchfl_shim.h`
//! (`TFL_ShimInterface`) and the structs it takes. The only FFI in this crate.
//!
//! The shim is a Python extension module of its own, `torch_fl._C`, which
//! links libtorch; the package imports it after `import torch`, and it
//! hands this crate its table as a capsule ([`attach`]). So `torch_fl._native`
//! imports under any torch version, never looks up a shim symbol by name, and
//! knows of the shim only what the core needs: attach the device, register
//! kernels, find the stream a collective enqueues on. Everything else the
//! shim offers (trace, layer profile, memory snapshot, generators) is its
//! module's business. `tests/test_shim_interface.py` compares every offset
//! of the mirrors below with the C compiler's view of the header.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::OnceLock;

use torchfl_ffi::{struct_size, TFL_Activity, TFL_Graphs, TFL_KernelFn, TFL_PluginApi};

/// The interface version this crate speaks (`TFL_SHIM_INTERFACE_VERSION`).
pub(crate) const INTERFACE_VERSION: u32 = 10;

/// `TFL_SHIM_CAPSULE_NAME`: the name of the capsule that carries the table.
pub(crate) const CAPSULE_NAME: &CStr = c"torch_fl._C._shim_interface";

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
    /// Interface 9: the plugin's validated graphs table (ABI 1.7), or NULL.
    graphs: *const TFL_Graphs,
    /// Interface 10: the plugin's validated activity table (ABI 1.8), or NULL.
    activity: *const TFL_Activity,
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

/// `TFL_ShimInterface`: the shim's table for the core.
#[repr(C)]
pub(crate) struct ShimInterface {
    struct_size: usize,
    interface_version: u32,
    torch_version: *const c_char,
    attach_device: Option<unsafe extern "C" fn(*const ShimDevice, *mut c_char, usize) -> i32>,
    register_kernel: Option<unsafe extern "C" fn(*const ShimKernel, *mut i32, *mut c_char, usize) -> i32>,
    current_stream: Option<unsafe extern "C" fn(i32, *mut *mut c_void, *mut c_char, usize) -> i32>,
}

/// The attached table: its entries, checked once.
struct Shim {
    torch_version: String,
    attach_device: unsafe extern "C" fn(*const ShimDevice, *mut c_char, usize) -> i32,
    register_kernel: unsafe extern "C" fn(*const ShimKernel, *mut i32, *mut c_char, usize) -> i32,
    current_stream: unsafe extern "C" fn(i32, *mut *mut c_void, *mut c_char, usize) -> i32,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

fn shim() -> Result<&'static Shim, String> {
    SHIM.get().ok_or_else(|| "the torch-fl C++ shim is not attached (import torch_fl first)".to_owned())
}

/// Takes the shim's table from the address its capsule holds (once per
/// process) and returns the PyTorch version the shim was compiled against.
///
/// # Safety
///
/// `table` is the pointer of a capsule named [`CAPSULE_NAME`]: the shim's
/// static `TFL_ShimInterface`, which lives as long as the process.
pub(crate) unsafe fn attach(table: *const ShimInterface) -> Result<String, String> {
    if let Some(shim) = SHIM.get() {
        return Ok(shim.torch_version.clone());
    }
    if table.is_null() {
        return Err("the torch-fl shim's capsule holds no table: reinstall torch-fl".to_owned());
    }
    // SAFETY: the caller guarantees a live TFL_ShimInterface; struct_size
    // and interface_version are its first fields in every version.
    let (size, version) = unsafe { ((*table).struct_size, (*table).interface_version) };
    if version != INTERFACE_VERSION || size < std::mem::size_of::<ShimInterface>() {
        return Err(format!(
            "the torch-fl shim speaks interface {version} (table of {size} bytes), this package {INTERFACE_VERSION} \
             ({} bytes): the shim and torch_fl._native come from different builds; reinstall torch-fl",
            std::mem::size_of::<ShimInterface>()
        ));
    }
    // SAFETY: the size check above covers every field read here.
    let table = unsafe { &*table };
    let missing = |name: &str| format!("the torch-fl shim's table has no {name}: reinstall torch-fl");
    let torch_version = if table.torch_version.is_null() {
        return Err(missing("torch_version"));
    } else {
        // SAFETY: a non-NULL torch_version is the shim's static,
        // NUL-terminated TORCH_VERSION.
        unsafe { CStr::from_ptr(table.torch_version) }.to_string_lossy().into_owned()
    };
    let shim = Shim {
        torch_version,
        attach_device: table.attach_device.ok_or_else(|| missing("attach_device"))?,
        register_kernel: table.register_kernel.ok_or_else(|| missing("register_kernel"))?,
        current_stream: table.current_stream.ok_or_else(|| missing("current_stream"))?,
    };
    let version = shim.torch_version.clone();
    // A concurrent caller may have won; both hold the same static table.
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
        struct_size: struct_size!(ShimDevice, activity),
        device_name: name.as_ptr(),
        plugin_label: label.as_ptr(),
        api: plugin.api_address() as *const TFL_PluginApi,
        abi_minor: plugin.abi().effective.minor,
        device_count: plugin.device_count(),
        capabilities: plugin.capabilities().bits(),
        inflight_slot: Some(torchfl_core::inflight::torchfl_inflight_slot),
        kernel_symbol: Some(kernel_symbol),
        argument_kind: Some(argument_kind),
        graphs: plugin.graphs_table().map_or(std::ptr::null(), |t| t as *const TFL_Graphs),
        activity: plugin.activity_table().map_or(std::ptr::null(), |t| t as *const TFL_Activity),
    };
    let mut error = [0u8; 1024];
    // SAFETY: `device`, its strings and the graphs and activity tables (owned by `plugin`)
    // outlive the call, and the shim copies the table; the plugin table
    // lives as long as the process (plugins are never unloaded); `error` is
    // writable for its length.
    let code = unsafe { (shim.attach_device)(&device, error.as_mut_ptr().cast(), error.len()) };
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
    let code =
        unsafe { (shim.register_kernel)(&kernel, &mut outcome, error.as_mut_ptr().cast(), error.len()) };
    if code != 0 {
        return Err((code, message(&error)));
    }
    Outcome::from_raw(outcome).ok_or_else(|| (0, format!("the shim returned an unknown outcome {outcome}")))
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

/// Every field of the structs that cross the shim interface, as
/// (struct, field, offset, size) in Rust's view: what
/// `tests/test_shim_interface.py` compares with the C compiler's view of
/// `torchfl_shim.h`.
pub(crate) fn layout() -> Vec<(&'static str, &'static str, usize, usize)> {
    macro_rules! fields {
        ($($ty:ident as $c:literal { $($field:ident),* $(,)? })*) => {
            vec![$($(
                (
                    $c,
                    stringify!($field),
                    std::mem::offset_of!($ty, $field),
                    struct_size!($ty, $field) - std::mem::offset_of!($ty, $field),
                ),
            )*)*]
        };
    }
    fields! {
        ShimInterface as "TFL_ShimInterface" {
            struct_size, interface_version, torch_version, attach_device, register_kernel, current_stream,
        }
        ShimDevice as "TFL_ShimDevice" {
            struct_size, device_name, plugin_label, api, abi_minor, device_count, capabilities, inflight_slot,
            kernel_symbol, argument_kind, graphs, activity,
        }
        ShimKernel as "TFL_ShimKernel" {
            struct_size, op_name, kernel, flags, owner_api, plugin_label, foreign, schema, infer_outputs,
        }
    }
}

//! Rust mirror of the torch-fl plugin ABI (`include/torch_fl/plugin.h`).
//!
//! The C header is normative; this crate restates it for Rust hosts and Rust
//! plugins, field for field and with the same names, so that a reader can go
//! from one to the other without a lookup table. `tests/layout.rs` locks every
//! released layout with `offset_of!`, so an accidental ABI break fails the
//! build instead of a customer's plugin.
//!
//! Nothing here is `unsafe` to *use*: the types are plain data and function
//! pointers. Calling those function pointers is where the safety obligations
//! live, and they are documented on each field in the header.
#![warn(missing_docs)]
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

mod mangle;
pub use mangle::{kernel_symbol, parse_op_name, OpName};

/// The header, for tools that write it out or compile against it.
pub const HEADER: &str = include_str!("../include/torch_fl/plugin.h");

/// The optional header-only helpers (`include/torch_fl/plugin_helpers.h`):
/// error objects, streams and events of a synchronous device, memory
/// statistics. It includes `plugin.h` from its own directory, so the two
/// are installed side by side.
pub const HELPERS_HEADER: &str = include_str!("../include/torch_fl/plugin_helpers.h");

/// This crate's sources, (path relative to the crate root, text), for tools
/// that vendor the crate into a plugin project (`torchfl-abi new --lang
/// rust`). Its Cargo.toml is not among them: it inherits torch-fl's
/// workspace settings, so the vendoring tool writes a standalone one.
pub const CRATE_SOURCES: &[(&str, &str)] = &[
    ("src/lib.rs", include_str!("lib.rs")),
    ("src/mangle.rs", include_str!("mangle.rs")),
    ("include/torch_fl/plugin.h", HEADER),
    ("include/torch_fl/plugin_helpers.h", HELPERS_HEADER),
];

/// Directory holding `torch_fl/plugin.h` (and `plugin_helpers.h`), for build scripts and tests that
/// compile C plugins.
pub fn include_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// The ABI major version this mirror describes. Host and plugin with
/// different majors refuse each other during the handshake.
pub const TFL_ABI_VERSION_MAJOR: u32 = 1;
/// The ABI minor version this mirror describes. Minors only append, so both
/// sides work at the lower of the two minors.
pub const TFL_ABI_VERSION_MINOR: u32 = 8;

/// Name of the bootstrap symbol (without the trailing NUL).
pub const TFL_BOOTSTRAP_SYMBOL: &str = "torch_fl_plugin_get_api";
/// Prefix of every exported kernel symbol.
pub const TFL_KERNEL_SYMBOL_PREFIX: &str = "torch_fl_op_";

/// ABI majors and minors above this are not versions: a table announcing
/// one is malformed.
pub const TFL_MAX_ABI_VERSION: u32 = 1000;
/// The largest `struct_size` accepted for `TFL_PluginApi` and
/// `TFL_PluginInfo`.
pub const TFL_MAX_STRUCT_SIZE: usize = 65536;
/// The largest `TFL_OpTable.num_entries` accepted.
pub const TFL_MAX_OP_ENTRIES: usize = 65536;
/// The largest `TFL_OpTable.entry_size` accepted.
pub const TFL_MAX_OP_ENTRY_SIZE: usize = 4096;
/// The most bytes before the NUL of a string a plugin returns.
pub const TFL_MAX_STRING_LENGTH: usize = 4096;
/// The largest `device_count` accepted.
pub const TFL_MAX_DEVICES: i32 = 64;

/// `TFL_STRUCT_SIZE(type, last_field)`: the size a writer stores in
/// `struct_size`, i.e. up to and including `last_field`, without the trailing
/// padding `size_of` would add.
#[macro_export]
macro_rules! struct_size {
    ($ty:ty, $field:ident) => {{
        // A never-called closure gives the field's type without a value.
        fn field_size<T>(_: impl Fn(&$ty) -> &T) -> usize {
            ::std::mem::size_of::<T>()
        }
        ::std::mem::offset_of!($ty, $field) + field_size(|s: &$ty| &s.$field)
    }};
}

/// `TFL_HAS_FIELD(type, field, size)`: whether a struct whose `struct_size`
/// is `size` contains `field`.
#[macro_export]
macro_rules! has_field {
    ($ty:ty, $field:ident, $size:expr) => {
        ($size) >= $crate::struct_size!($ty, $field)
    };
}

type Status = *mut TFL_Error;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Opaque error object created by a plugin; released with `error_destroy`.
#[repr(C)]
#[derive(Debug)]
pub struct TFL_Error {
    _opaque: [u8; 0],
}

/// `TFL_ErrorCode`: what `error_code` returns. Codes are stable across all
/// versions; a reader maps codes it does not know to [`TFL_ERROR_UNKNOWN`].
pub type TFL_ErrorCode = i32;
/// A failure that fits no other code, and the reading of any unknown code.
pub const TFL_ERROR_UNKNOWN: TFL_ErrorCode = 1;
/// The caller passed a bad argument (an out-of-range device, a bad shape).
pub const TFL_ERROR_INVALID_ARGUMENT: TFL_ErrorCode = 2;
/// The device cannot satisfy an allocation; never reported as a NULL pointer.
pub const TFL_ERROR_OUT_OF_MEMORY: TFL_ErrorCode = 3;
/// The function or this combination of arguments (a dtype, a layout) is not
/// implemented. A kernel returning it must not have touched its outputs; the
/// host then applies its fallback policy as if the op were absent.
pub const TFL_ERROR_UNIMPLEMENTED: TFL_ErrorCode = 4;
/// A bug or broken invariant inside the plugin.
pub const TFL_ERROR_INTERNAL: TFL_ErrorCode = 5;
/// The device is unusable (reset, removed, hung).
pub const TFL_ERROR_DEVICE_LOST: TFL_ErrorCode = 6;
/// The call is valid but not in this state (e.g. initialize twice, elapsed
/// time between events that were not recorded with timing).
pub const TFL_ERROR_FAILED_PRECONDITION: TFL_ErrorCode = 7;

// ---------------------------------------------------------------------------
// Host services
// ---------------------------------------------------------------------------

/// `TFL_LogLevel`: the severity a plugin passes to [`TFL_HostApi::log`].
pub type TFL_LogLevel = i32;
/// Detail useful only when debugging the plugin.
pub const TFL_LOG_DEBUG: TFL_LogLevel = 0;
/// Normal progress worth recording.
pub const TFL_LOG_INFO: TFL_LogLevel = 1;
/// Something the user may want to act on; the call still succeeds.
pub const TFL_LOG_WARNING: TFL_LogLevel = 2;
/// A failure, usually also reported through a `TFL_Error`.
pub const TFL_LOG_ERROR: TFL_LogLevel = 3;

/// The host's service table, passed to the bootstrap function. Owned by the
/// host; valid, unchanged, for the life of the process, so the plugin may
/// keep the pointer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_HostApi {
    /// Bytes of this struct the host filled (`TFL_STRUCT_SIZE`).
    pub struct_size: usize,
    /// The host's `TFL_ABI_VERSION_MAJOR`; offset fixed forever.
    pub abi_major: u32,
    /// The host's `TFL_ABI_VERSION_MINOR`; offset fixed forever.
    pub abi_minor: u32,
    // --- 1.0 ---
    /// Opaque host state, passed back to every host function.
    pub context: *mut c_void,
    /// Emits a diagnostic through the host's logging; `level` is a
    /// [`TFL_LogLevel`] and `message` is borrowed. Thread-safe. Never `None`.
    pub log: Option<unsafe extern "C" fn(context: *mut c_void, level: i32, message: *const c_char)>,
}

// ---------------------------------------------------------------------------
// Identity
// ---------------------------------------------------------------------------

/// Device pointers returned by `allocate` may be dereferenced by host code
/// (unified or host memory), which lets the host run CPU fallbacks without
/// copies. A plugin that cannot promise this must leave the bit clear.
pub const TFL_CAP_HOST_ADDRESSABLE_MEMORY: u64 = 1 << 0;
/// Stream work runs asynchronously to the host: the host must synchronize
/// (stream, event or device) before reading results with host code.
pub const TFL_CAP_ASYNC_STREAMS: u64 = 1 << 1;
/// Events created with [`TFL_EVENT_TIMING`] support `event_elapsed_time`.
pub const TFL_CAP_EVENT_TIMING: u64 = 1 << 2;
/// 1.1: kernels accept float16 tensors (offered to `torch.autocast`).
pub const TFL_CAP_FLOAT16: u64 = 1 << 3;
/// 1.1: kernels accept bfloat16 tensors (offered to `torch.autocast`).
pub const TFL_CAP_BFLOAT16: u64 = 1 << 4;
/// 1.4: the plugin's `allocate`/`deallocate` are already cheap and cache
/// memory themselves (as a stream-ordered pool does), so the host passes
/// every tensor allocation straight to the plugin instead of caching on top.
/// Clear (and in every plugin older than 1.4): the host caches.
pub const TFL_CAP_CACHING_ALLOCATOR: u64 = 1 << 5;

/// The plugin's identity, returned by `get_info`. Owned by the plugin and
/// valid for the life of the process; the identity strings never change, and
/// `capabilities` is final once `initialize` has returned.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_PluginInfo {
    /// Bytes of this struct the plugin filled (`TFL_STRUCT_SIZE`).
    pub struct_size: usize,
    // --- 1.0 ---
    /// Short identifier, e.g. `"sim"`; required.
    pub name: *const c_char,
    /// Who ships the plugin, e.g. `"torch-fl project"`; required.
    pub vendor: *const c_char,
    /// The hardware family, e.g. `"simulated"`; required.
    pub chip_family: *const c_char,
    /// The plugin's own version, e.g. `"1.2.0"`; required.
    pub plugin_version: *const c_char,
    /// Lowest PyTorch version the plugin was validated with, e.g. `"2.4"`,
    /// or NULL for no constraint. The host checks it when registering.
    pub min_torch_version: *const c_char,
    /// `TFL_CAP_*` bits; unknown bits are ignored.
    pub capabilities: u64,
}

// ---------------------------------------------------------------------------
// Device runtime
// ---------------------------------------------------------------------------

/// Opaque stream handle owned by the plugin.
#[repr(C)]
#[derive(Debug)]
pub struct TFL_Stream {
    _opaque: [u8; 0],
}

/// Opaque event handle owned by the plugin.
#[repr(C)]
#[derive(Debug)]
pub struct TFL_Event {
    _opaque: [u8; 0],
}

/// Filled by `device_properties`. The caller sets `struct_size` to the size
/// it knows; the plugin writes only the fields that size covers.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_DeviceProperties {
    /// Set by the caller to the size it knows; left unchanged by the plugin.
    pub struct_size: usize,
    // --- 1.0 ---
    /// The device's name; owned by the plugin, static lifetime.
    pub name: *const c_char,
    /// Bytes the device can allocate in all.
    pub total_memory: u64,
    /// Number of compute units; 0 when unknown.
    pub compute_units: i32,
    /// Alignment of `allocate`'s pointers, in bytes.
    pub memory_alignment: u32,
    // --- 1.2 ---
    /// Major architecture revision of the device (vendor-defined, like
    /// CUDA's compute capability); a host at 1.0 or 1.1 reports 0.
    pub capability_major: i32,
    /// Minor architecture revision of the device; a host at 1.0 or 1.1
    /// reports 0.
    pub capability_minor: i32,
}

/// Filled by `memory_stats`. The caller sets `struct_size`; all counts are
/// in bytes or events since device start (peaks since the last
/// `reset_peak_memory_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TFL_MemoryStats {
    /// Set by the caller to the size it knows; left unchanged by the plugin.
    pub struct_size: usize,
    // --- 1.0 ---
    /// Bytes in live allocations.
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` since the last peak reset.
    pub peak_allocated_bytes: u64,
    /// Bytes held by the plugin's allocator, at least `allocated_bytes`.
    pub reserved_bytes: u64,
    /// The device's capacity in bytes.
    pub total_bytes: u64,
    /// Successful `allocate` calls.
    pub num_allocations: u64,
    /// Allocations released by `deallocate`.
    pub num_frees: u64,
    /// `allocate` calls refused for lack of memory.
    pub num_ooms: u64,
}

impl TFL_MemoryStats {
    /// The counters by field name, in declaration order (`struct_size`
    /// excluded): the one list hosts build their dictionaries and reports
    /// from, so adding a field here is the only change they need.
    pub fn counters(&self) -> [(&'static str, u64); 7] {
        [
            ("allocated_bytes", self.allocated_bytes),
            ("peak_allocated_bytes", self.peak_allocated_bytes),
            ("reserved_bytes", self.reserved_bytes),
            ("total_bytes", self.total_bytes),
            ("num_allocations", self.num_allocations),
            ("num_frees", self.num_frees),
            ("num_ooms", self.num_ooms),
        ]
    }
}

/// `TFL_CopyKind`: the direction of a [`TFL_CopyArgs`] copy.
pub type TFL_CopyKind = i32;
/// From host memory to a device of this plugin.
pub const TFL_COPY_HOST_TO_DEVICE: TFL_CopyKind = 1;
/// From a device of this plugin to host memory.
pub const TFL_COPY_DEVICE_TO_HOST: TFL_CopyKind = 2;
/// Between device memory; source and destination may be on different
/// devices of this plugin.
pub const TFL_COPY_DEVICE_TO_DEVICE: TFL_CopyKind = 3;

/// The arguments of `copy`: one contiguous copy of `nbytes` bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_CopyArgs {
    /// Bytes of this struct the host filled (`TFL_STRUCT_SIZE`).
    pub struct_size: usize,
    // --- 1.0 ---
    /// The direction, a [`TFL_CopyKind`].
    pub kind: TFL_CopyKind,
    /// The destination device; ignored for `DEVICE_TO_HOST`.
    pub dst_device: i32,
    /// The source device; ignored for `HOST_TO_DEVICE`.
    pub src_device: i32,
    /// Where the bytes go.
    pub dst: *mut c_void,
    /// Where the bytes come from.
    pub src: *const c_void,
    /// How many bytes to copy.
    pub nbytes: usize,
    /// NULL: synchronous, ordered after all work previously submitted to the
    /// devices involved. Otherwise a stream of the device that runs the copy
    /// (for `DEVICE_TO_DEVICE` across devices: of `src_device`); the call
    /// returns once the copy is queued, and host buffers must stay valid and
    /// unchanged until the stream has executed it.
    pub stream: *mut TFL_Stream,
}

/// `event_create` flags: a plain event, for ordering only.
pub const TFL_EVENT_DEFAULT: u32 = 0;
/// `event_create` flags: record a timestamp so `event_elapsed_time` can be
/// used.
pub const TFL_EVENT_TIMING: u32 = 1;

// ---------------------------------------------------------------------------
// Call frame
// ---------------------------------------------------------------------------

/// `TFL_DTypeCode`: signed integers (DLPack's `kDLInt`). The codes are
/// DLPack's so descriptors convert to `DLTensor` without tables.
pub const TFL_DTYPE_INT: u8 = 0;
/// Unsigned integers (DLPack's `kDLUInt`).
pub const TFL_DTYPE_UINT: u8 = 1;
/// IEEE floating point (DLPack's `kDLFloat`).
pub const TFL_DTYPE_FLOAT: u8 = 2;
/// Brain floating point, bfloat16 (DLPack's `kDLBfloat`).
pub const TFL_DTYPE_BFLOAT: u8 = 4;
/// Complex numbers; `bits` counts both parts (DLPack's `kDLComplex`).
pub const TFL_DTYPE_COMPLEX: u8 = 5;
/// Booleans stored in 8 bits (DLPack's `kDLBool`).
pub const TFL_DTYPE_BOOL: u8 = 6;

/// Element type, as DLPack's `DLDataType`. Frozen: no `struct_size`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TFL_DType {
    /// The category, a `TFL_DTYPE_*` code.
    pub code: u8,
    /// Bits per lane, e.g. 32 for float32 and 8 for bool.
    pub bits: u8,
    /// Vector lanes per element; 1 for every PyTorch dtype.
    pub lanes: u16,
}

impl TFL_DType {
    /// A scalar (one-lane) dtype of the given code and width.
    pub const fn new(code: u8, bits: u8) -> Self {
        Self { code, bits, lanes: 1 }
    }
    /// `torch.bool`, stored in one byte.
    pub const BOOL: Self = Self::new(TFL_DTYPE_BOOL, 8);
    /// `torch.uint8`.
    pub const U8: Self = Self::new(TFL_DTYPE_UINT, 8);
    /// `torch.int8`.
    pub const I8: Self = Self::new(TFL_DTYPE_INT, 8);
    /// `torch.int16`.
    pub const I16: Self = Self::new(TFL_DTYPE_INT, 16);
    /// `torch.int32`.
    pub const I32: Self = Self::new(TFL_DTYPE_INT, 32);
    /// `torch.int64`, PyTorch's default integer type.
    pub const I64: Self = Self::new(TFL_DTYPE_INT, 64);
    /// `torch.float16` (IEEE half precision).
    pub const F16: Self = Self::new(TFL_DTYPE_FLOAT, 16);
    /// `torch.bfloat16`.
    pub const BF16: Self = Self::new(TFL_DTYPE_BFLOAT, 16);
    /// `torch.float32`, PyTorch's default floating type.
    pub const F32: Self = Self::new(TFL_DTYPE_FLOAT, 32);
    /// `torch.float64`.
    pub const F64: Self = Self::new(TFL_DTYPE_FLOAT, 64);

    /// Bytes per element (all lanes).
    pub const fn itemsize(self) -> usize {
        (self.bits as usize).div_ceil(8) * self.lanes as usize
    }

    /// The descriptor as one integer, its fields in their in-memory order
    /// (`code | bits << 8 | lanes << 16`): how a dtype crosses the host's
    /// Python/Rust boundary (the values of [`TFL_DTYPE_TORCH_NAMES`]).
    pub const fn to_code(self) -> u32 {
        self.code as u32 | (self.bits as u32) << 8 | (self.lanes as u32) << 16
    }

    /// The inverse of [`TFL_DType::to_code`]; `None` when the top byte is
    /// not zero.
    pub const fn from_code(code: u32) -> Option<Self> {
        if code >> 24 != 0 {
            return None;
        }
        Some(Self { code: code as u8, bits: (code >> 8) as u8, lanes: (code >> 16) as u16 })
    }

    /// PyTorch's name of the dtype (`"float32"`: `torch.float32`), from
    /// [`TFL_DTYPE_TORCH_NAMES`]; `None` for one PyTorch lacks.
    pub fn torch_name(self) -> Option<&'static str> {
        TFL_DTYPE_TORCH_NAMES.iter().find(|(d, _)| *d == self).map(|(_, n)| *n)
    }
}

/// Every PyTorch dtype the ABI describes, with its name in `torch` (the
/// attribute: `torch.float32`): the one table of dtypes. The shim's
/// `to_tfl_dtype` (`cpp_shim/src/dispatch/dtype.h`) maps the same ones; the
/// host's Python derives its `torch.dtype` map from this table, exported as
/// `torch_fl._native.DTYPES` (name -> [`TFL_DType::to_code`]).
pub const TFL_DTYPE_TORCH_NAMES: [(TFL_DType, &str); 16] = [
    (TFL_DType::BOOL, "bool"),
    (TFL_DType::U8, "uint8"),
    (TFL_DType::new(TFL_DTYPE_UINT, 16), "uint16"),
    (TFL_DType::new(TFL_DTYPE_UINT, 32), "uint32"),
    (TFL_DType::new(TFL_DTYPE_UINT, 64), "uint64"),
    (TFL_DType::I8, "int8"),
    (TFL_DType::I16, "int16"),
    (TFL_DType::I32, "int32"),
    (TFL_DType::I64, "int64"),
    (TFL_DType::F16, "float16"),
    (TFL_DType::F32, "float32"),
    (TFL_DType::F64, "float64"),
    (TFL_DType::BF16, "bfloat16"),
    (TFL_DType::new(TFL_DTYPE_COMPLEX, 32), "complex32"),
    (TFL_DType::new(TFL_DTYPE_COMPLEX, 64), "complex64"),
    (TFL_DType::new(TFL_DTYPE_COMPLEX, 128), "complex128"),
];

/// `TFL_Tensor.flags`: a Python number wrapped into a 0-dim host tensor.
pub const TFL_TENSOR_WRAPPED_NUMBER: u64 = 1 << 0;
/// `TFL_Tensor.flags`: an output the operator leaves undefined (0 elements,
/// NULL data); the kernel must not write it.
pub const TFL_TENSOR_UNDEFINED: u64 = 1 << 1;

/// `TFL_DeviceType`: where a [`TFL_Tensor`]'s memory lives.
pub type TFL_DeviceType = i32;
/// Host memory; v1 hosts pass host tensors only for 0-dim wrapped scalars.
pub const TFL_DEVICE_HOST: TFL_DeviceType = 1;
/// Memory of this plugin's device `device_index`.
pub const TFL_DEVICE_PLUGIN: TFL_DeviceType = 2;

/// A strided view of memory, shaped like DLPack's `DLTensor`. Built by the
/// host, borrowed by the kernel for the duration of the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_Tensor {
    /// Bytes of this struct the host filled (`TFL_STRUCT_SIZE`).
    pub struct_size: usize,
    // --- 1.0 ---
    /// A device address inside one allocation (what `allocate` returned,
    /// or that plus an offset inside the allocation: the host's caching
    /// allocator hands out parts of one allocation) or, for host tensors,
    /// host memory. The first element is at `data + byte_offset`. Plugins
    /// whose memory has no addresses map addresses to handles
    /// (docs/plugin-abi.md, "Handle-based memory").
    pub data: *mut c_void,
    /// Offset in bytes from `data` to the first element.
    pub byte_offset: u64,
    /// A [`TFL_DeviceType`]: whether `data` is host or plugin memory.
    pub device_type: TFL_DeviceType,
    /// The plugin device holding the memory, for plugin tensors.
    pub device_index: i32,
    /// The element type.
    pub dtype: TFL_DType,
    /// Number of dimensions; 0 for a scalar tensor.
    pub ndim: i32,
    /// `ndim` sizes; may be NULL only when `ndim == 0`.
    pub shape: *const i64,
    /// `ndim` strides in elements (not bytes), never NULL when `ndim > 0`.
    /// A stride may be 0 (a broadcast dimension) or any other value: kernels
    /// must not assume contiguity without checking it.
    pub strides: *const i64,
    /// `TFL_TENSOR_*` bits; unknown bits are ignored.
    pub flags: u64,
}

/// `TFL_ScalarKind`: which member of a [`TFL_Scalar`]'s value is live.
pub type TFL_ScalarKind = i32;
/// The scalar holds `v.i`.
pub const TFL_SCALAR_INT: TFL_ScalarKind = 1;
/// The scalar holds `v.f`.
pub const TFL_SCALAR_FLOAT: TFL_ScalarKind = 2;
/// The scalar holds `v.b`.
pub const TFL_SCALAR_BOOL: TFL_ScalarKind = 3;
/// The scalar holds `v.c`.
pub const TFL_SCALAR_COMPLEX: TFL_ScalarKind = 4;

/// The value of a [`TFL_Scalar`] (an anonymous union in the header); which
/// member is live is given by [`TFL_Scalar::kind`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union TFL_ScalarValue {
    /// An integer, for [`TFL_SCALAR_INT`].
    pub i: i64,
    /// A double, for [`TFL_SCALAR_FLOAT`].
    pub f: f64,
    /// 0 or 1, for [`TFL_SCALAR_BOOL`].
    pub b: u8,
    /// Real and imaginary parts, for [`TFL_SCALAR_COMPLEX`].
    pub c: [f64; 2],
}

/// A PyTorch `Scalar` (an untyped number, as in `add(Tensor, Scalar other)`).
/// Frozen: no `struct_size`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TFL_Scalar {
    /// A [`TFL_ScalarKind`] naming the live member of `v`.
    pub kind: TFL_ScalarKind,
    /// The number.
    pub v: TFL_ScalarValue,
}

impl std::fmt::Debug for TFL_ScalarValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Untagged: which member is live is only known to the enclosing
        // TFL_Scalar.
        f.write_str("TFL_ScalarValue { .. }")
    }
}

impl std::fmt::Debug for TFL_Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: `kind` says which union member was written; every member is
        // plain old data, so reading the tagged one is sound.
        unsafe {
            match self.kind {
                TFL_SCALAR_INT => write!(f, "Scalar::Int({})", self.v.i),
                TFL_SCALAR_FLOAT => write!(f, "Scalar::Float({})", self.v.f),
                TFL_SCALAR_BOOL => write!(f, "Scalar::Bool({})", self.v.b != 0),
                TFL_SCALAR_COMPLEX => {
                    write!(f, "Scalar::Complex({}, {})", self.v.c[0], self.v.c[1])
                }
                k => write!(f, "Scalar::Unknown(kind={k})"),
            }
        }
    }
}

/// `TFL_ValueTag`: which member of a [`TFL_Value`] is live. The header maps
/// every ATen schema type to a tag; a kernel that meets a tag it does not
/// know returns `INVALID_ARGUMENT`.
pub type TFL_ValueTag = i32;
/// An absent optional argument (`T?` passed as `None`); no member is live.
pub const TFL_VALUE_NONE: TFL_ValueTag = 0;
/// `Tensor` or a present `Tensor?`: `u.tensor`.
pub const TFL_VALUE_TENSOR: TFL_ValueTag = 1;
/// `Tensor[]` (no NULL items) or `Tensor?[]` (NULL for absent entries):
/// `u.tensor_list`.
pub const TFL_VALUE_TENSOR_LIST: TFL_ValueTag = 2;
/// `int`, `SymInt`, `ScalarType`, `Layout`, `MemoryFormat`, a device index:
/// `u.i`. ScalarType values use PyTorch's `c10::ScalarType` numbering.
pub const TFL_VALUE_INT: TFL_ValueTag = 3;
/// `float`: `u.f`.
pub const TFL_VALUE_FLOAT: TFL_ValueTag = 4;
/// `bool`: `u.b`.
pub const TFL_VALUE_BOOL: TFL_ValueTag = 5;
/// `Scalar`: `u.scalar`.
pub const TFL_VALUE_SCALAR: TFL_ValueTag = 6;
/// `int[]`, `SymInt[]`: `u.int_list`.
pub const TFL_VALUE_INT_LIST: TFL_ValueTag = 7;
/// `float[]`: `u.float_list`.
pub const TFL_VALUE_FLOAT_LIST: TFL_ValueTag = 8;
/// `bool[N]`: `u.bool_list`.
pub const TFL_VALUE_BOOL_LIST: TFL_ValueTag = 9;
/// `str`: `u.string`.
pub const TFL_VALUE_STRING: TFL_ValueTag = 10;

/// `TFL_Value.u.tensor_list` (an anonymous struct in the header).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_TensorList {
    /// `len` tensor pointers; an item is NULL for an absent entry of a
    /// `Tensor?[]`.
    pub items: *const *const TFL_Tensor,
    /// Number of items.
    pub len: usize,
}

/// `TFL_Value.u.int_list` (an anonymous struct in the header).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_IntList {
    /// `len` integers.
    pub items: *const i64,
    /// Number of items.
    pub len: usize,
}

/// `TFL_Value.u.float_list` (an anonymous struct in the header).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_FloatList {
    /// `len` doubles.
    pub items: *const f64,
    /// Number of items.
    pub len: usize,
}

/// `TFL_Value.u.bool_list` (an anonymous struct in the header).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_BoolList {
    /// `len` bytes, each 0 or 1.
    pub items: *const u8,
    /// Number of items.
    pub len: usize,
}

/// `TFL_Value.u.string` (an anonymous struct in the header).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_String {
    /// UTF-8 bytes, NUL-terminated.
    pub data: *const c_char,
    /// Length in bytes, excluding the NUL.
    pub len: usize,
}

/// The payload of a [`TFL_Value`] (an anonymous union in the header); which
/// member is live is given by [`TFL_Value::tag`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union TFL_ValueUnion {
    /// For [`TFL_VALUE_TENSOR`].
    pub tensor: *const TFL_Tensor,
    /// For [`TFL_VALUE_TENSOR_LIST`].
    pub tensor_list: TFL_TensorList,
    /// For [`TFL_VALUE_INT`].
    pub i: i64,
    /// For [`TFL_VALUE_FLOAT`].
    pub f: f64,
    /// For [`TFL_VALUE_BOOL`]: 0 or 1.
    pub b: u8,
    /// For [`TFL_VALUE_SCALAR`].
    pub scalar: TFL_Scalar,
    /// For [`TFL_VALUE_INT_LIST`].
    pub int_list: TFL_IntList,
    /// For [`TFL_VALUE_FLOAT_LIST`].
    pub float_list: TFL_FloatList,
    /// For [`TFL_VALUE_BOOL_LIST`].
    pub bool_list: TFL_BoolList,
    /// For [`TFL_VALUE_STRING`].
    pub string: TFL_String,
}

/// One argument of an operator call. Built by the host, borrowed by the
/// kernel for the duration of the call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TFL_Value {
    /// Bytes of this struct the host filled (`TFL_STRUCT_SIZE`).
    pub struct_size: usize,
    // --- 1.0 ---
    /// A [`TFL_ValueTag`] naming the live member of `u`.
    pub tag: TFL_ValueTag,
    /// The argument itself.
    pub u: TFL_ValueUnion,
}

impl std::fmt::Debug for TFL_ValueUnion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Untagged: see TFL_Value's Debug.
        f.write_str("TFL_ValueUnion { .. }")
    }
}

impl std::fmt::Debug for TFL_Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The union's active member depends on `tag` and may hold pointers
        // whose validity we cannot know here, so only the tag is shown.
        f.debug_struct("TFL_Value").field("tag", &self.tag).finish_non_exhaustive()
    }
}

/// Host callback for operators whose output shape depends on data
/// (`nonzero`, `unique`, `masked_select`): resizes output `output_index` to
/// `shape` (contiguous), reallocating its memory if needed, and updates
/// `frame.outputs[output_index]` in place, so the kernel must re-read that
/// descriptor. Called from the kernel call itself, never from stream work.
/// Returns 0 on success, otherwise a [`TFL_ErrorCode`] the kernel reports in
/// an error of its own (the host cannot create plugin error objects).
pub type TFL_ResizeOutputFn = unsafe extern "C" fn(
    frame: *const TFL_CallFrame,
    output_index: usize,
    ndim: i32,
    shape: *const i64,
) -> i32;

/// Everything a kernel receives. Owned by the host; the frame and everything
/// it points to are valid only until the kernel returns. Device memory the
/// tensors refer to stays valid until the work the kernel enqueued has run,
/// because the plugin's `deallocate` is stream-ordered.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_CallFrame {
    /// Bytes of this struct the host filled (`TFL_STRUCT_SIZE`).
    pub struct_size: usize,
    // --- 1.0 ---
    /// The ATen operator being run, e.g. `"add.Tensor"`: for error messages.
    pub op_name: *const c_char,
    /// The plugin device the call runs on.
    pub device_index: i32,
    /// The stream to run on; never NULL (the device's current stream, which
    /// may be its default stream).
    pub stream: *mut TFL_Stream,
    /// `num_args` arguments in ATen schema order, out= arguments excluded.
    pub args: *const *const TFL_Value,
    /// Number of entries in `args`.
    pub num_args: usize,
    /// One output per schema return, allocated by the host with the shape,
    /// dtype and strides PyTorch would give them (out-variant semantics).
    /// For an in-place op `outputs[0]` is `self`, which is also `args[0]`.
    /// Descriptors change only through `resize_output`.
    pub outputs: *const *mut TFL_Tensor,
    /// Number of entries in `outputs`.
    pub num_outputs: usize,
    /// Resizes a data-dependent output; never `None`.
    pub resize_output: Option<TFL_ResizeOutputFn>,
    /// For the host's use in `resize_output`.
    pub host_context: *mut c_void,
    /// For ops flagged [`TFL_OP_RANDOM`]: the key of the counter-based
    /// (Philox-style) RNG. 0 for other ops.
    pub rng_seed: u64,
    /// For ops flagged [`TFL_OP_RANDOM`]: the first counter value the kernel
    /// draws from. 0 for other ops.
    pub rng_offset: u64,
}

/// A kernel: returns NULL on success. It may enqueue work on `frame.stream`
/// and return before it runs, but must validate arguments first and report
/// invalid ones synchronously. Thread-safe.
pub type TFL_KernelFn = unsafe extern "C" fn(frame: *const TFL_CallFrame) -> *mut TFL_Error;

/// 1.1: the most dimensions an output described by `TFL_OutputMeta` has.
pub const TFL_MAX_OUTPUT_DIMS: usize = 16;

/// 1.1: the metadata of one output, filled by [`TFL_OpEntry::infer_outputs`].
/// The host allocates the output contiguous with this dtype and shape.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_OutputMeta {
    /// Set by the host; left unchanged by the plugin.
    pub struct_size: usize,
    // --- 1.1 ---
    /// The output's element type.
    pub dtype: TFL_DType,
    /// Number of dimensions, `0..=TFL_MAX_OUTPUT_DIMS`.
    pub ndim: i32,
    /// The first `ndim` entries are the output's sizes.
    pub shape: [i64; TFL_MAX_OUTPUT_DIMS],
}

/// 1.1: output metadata of a call without running it (`TFL_InferOutputsFn`).
pub type TFL_InferOutputsFn = unsafe extern "C" fn(
    frame: *const TFL_CallFrame,
    out: *mut TFL_OutputMeta,
    num_outputs: usize,
) -> *mut TFL_Error;

// ---------------------------------------------------------------------------
// Operator table
// ---------------------------------------------------------------------------

/// `TFL_OpEntry.flags`: the op consumes random numbers, so the host fills
/// `rng_seed` and `rng_offset`.
pub const TFL_OP_RANDOM: u64 = 1 << 0;
/// `TFL_OpEntry.flags`: the output shape depends on input data; the host
/// passes outputs of shape `[0]` and the kernel calls `resize_output`.
pub const TFL_OP_DYNAMIC_SHAPE: u64 = 1 << 1;
/// `TFL_OpEntry.flags`: results may differ between runs on identical inputs.
pub const TFL_OP_NONDETERMINISTIC: u64 = 1 << 2;
/// 1.3: `TFL_OpEntry.flags`: the operator belongs to another library
/// (`torchvision::nms`), which defines it when it is loaded. The entry's
/// `schema` states the schema the kernel was written for; the host never
/// defines the operator from it, it binds the kernel once the library has
/// defined the operator with that schema (also when the library is loaded
/// after the plugin was registered) and refuses a library whose schema
/// differs. A host older than 1.3 does not know this bit and would define
/// the operator itself, so a plugin lists such entries only to hosts of
/// minor 3 or newer (`TFL_HostApi.abi_minor`).
pub const TFL_OP_EXTERNAL: u64 = 1 << 3;

/// One operator the plugin implements. Laid out every
/// [`TFL_OpTable::entry_size`] bytes so the entry can grow in minor releases.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_OpEntry {
    /// Bytes of this struct the plugin filled (`TFL_STRUCT_SIZE`).
    pub struct_size: usize,
    // --- 1.0 ---
    /// `"[ns::]op[.overload]"`, e.g. `"add.Tensor"` or `"sim::fused_gelu"`;
    /// unique within a table.
    pub name: *const c_char,
    /// The exported symbol for this kernel (see
    /// [`TFL_KERNEL_SYMBOL_PREFIX`]).
    pub symbol: *const c_char,
    /// The kernel; never `None`.
    pub kernel: Option<TFL_KernelFn>,
    /// `TFL_OP_*` bits.
    pub flags: u64,
    /// For operators outside the aten namespace: the full schema, e.g.
    /// `"fused_gelu(Tensor x, Tensor bias) -> Tensor"`. NULL for aten ops.
    pub schema: *const c_char,
    // --- 1.1 ---
    /// Output metadata for operators outside the aten namespace; `None`
    /// otherwise. Without it the host can run such an operator only once
    /// Python code registers a fake implementation.
    pub infer_outputs: Option<TFL_InferOutputsFn>,
}

/// Filled by `get_op_table`: the operators the plugin implements.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_OpTable {
    /// Set by the host; left unchanged by the plugin.
    pub struct_size: usize,
    // --- 1.0 ---
    /// The first entry; owned by the plugin, static lifetime.
    pub entries: *const TFL_OpEntry,
    /// Number of entries.
    pub num_entries: usize,
    /// Distance in bytes between entries: the plugin's `TFL_STRUCT_SIZE` of
    /// `TFL_OpEntry`, which may differ from the host's.
    pub entry_size: usize,
}

/// The arguments of `initialize`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_InitArgs {
    /// Bytes of this struct the host filled (`TFL_STRUCT_SIZE`).
    pub struct_size: usize,
    // --- 1.0 ---
    /// Plugin-specific configuration as `key=value` pairs separated by `;`,
    /// e.g. `"devices=2;memory=1GiB"`; NULL or `""` for defaults. Unknown
    /// keys are an `INVALID_ARGUMENT` error naming the key. Borrowed.
    pub options: *const c_char,
}

// ---------------------------------------------------------------------------
// Collective communication (1.3, optional)
// ---------------------------------------------------------------------------

/// `TFL_UNIQUE_ID_BYTES`: the size of a [`TFL_UniqueId`] (NCCL's
/// `NCCL_UNIQUE_ID_BYTES`).
pub const TFL_UNIQUE_ID_BYTES: usize = 128;

/// What ranks need to find each other: created by `get_unique_id` in one
/// process, shared by the host as opaque bytes, passed to `comm_init_rank`.
/// A frozen value type without `struct_size`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TFL_UniqueId {
    /// Opaque to the host.
    pub bytes: [u8; TFL_UNIQUE_ID_BYTES],
}

/// A recorded capture (ABI 1.7; opaque, owned by the plugin).
#[repr(C)]
#[derive(Debug)]
pub struct TFL_Graph {
    _private: [u8; 0],
}

/// An instantiated, launchable graph (ABI 1.7; opaque, owned by the plugin).
#[repr(C)]
#[derive(Debug)]
pub struct TFL_GraphExec {
    _private: [u8; 0],
}

/// What one graph launch draws random numbers from (ABI 1.7): each recorded
/// random kernel runs with `rng_seed` and `rng_offset_base` plus its
/// recorded (graph-relative) `rng_offset`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_GraphLaunchArgs {
    /// Size of this struct as the writer (the host) knows it.
    pub struct_size: usize,
    /// The seed of every recorded random kernel.
    pub rng_seed: u64,
    /// Added to each recorded kernel's `rng_offset`.
    pub rng_offset_base: u64,
}

/// The graphs table (ABI 1.7), filled by `get_graphs` into a struct the
/// host allocates. Every entry is required when `get_graphs` succeeds. See
/// the header ("Device graphs") for the capture, frame-lifetime, random
/// number, launch and memory rules.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_Graphs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Puts a (non-default) stream in capture mode: kernels called and
    /// device-to-device copies queued on it are recorded, not run.
    pub stream_begin_capture: Option<unsafe extern "C" fn(stream: *mut TFL_Stream) -> Status>,
    /// Ends capture mode and returns the recording as a new graph.
    pub stream_end_capture:
        Option<unsafe extern "C" fn(stream: *mut TFL_Stream, out: *mut *mut TFL_Graph) -> Status>,
    /// Makes a launchable exec of a graph.
    pub graph_instantiate:
        Option<unsafe extern "C" fn(graph: *mut TFL_Graph, out: *mut *mut TFL_GraphExec) -> Status>,
    /// Enqueues one run of the exec on a stream of its device.
    pub graph_launch: Option<
        unsafe extern "C" fn(
            exec: *mut TFL_GraphExec,
            stream: *mut TFL_Stream,
            args: *const TFL_GraphLaunchArgs,
        ) -> Status,
    >,
    /// Releases an exec (after every launch of it completed).
    pub graph_exec_destroy: Option<unsafe extern "C" fn(exec: *mut TFL_GraphExec) -> Status>,
    /// Releases a graph (after its execs).
    pub graph_destroy: Option<unsafe extern "C" fn(graph: *mut TFL_Graph) -> Status>,
}

// ---------------------------------------------------------------------------
// Activity records and ranges (1.8, optional)
// ---------------------------------------------------------------------------

/// A native runtime call the plugin made (host clock).
pub const TFL_ACTIVITY_API: u32 = 1;
/// A kernel's execution on the device.
pub const TFL_ACTIVITY_KERNEL: u32 = 2;
/// A copy's execution on the device.
pub const TFL_ACTIVITY_COPY: u32 = 3;
/// A fill's execution on the device.
pub const TFL_ACTIVITY_MEMSET: u32 = 4;
/// A wait: the host blocked on the device.
pub const TFL_ACTIVITY_SYNC: u32 = 5;
/// A program or kernel build (host clock).
pub const TFL_ACTIVITY_BUILD: u32 = 6;
/// A user range, push to pop (host clock).
pub const TFL_ACTIVITY_RANGE: u32 = 7;
/// A user mark (host clock; start equals end).
pub const TFL_ACTIVITY_MARK: u32 = 8;
/// Every kind's bit (`1 << kind`), for `activity_enable`.
pub const TFL_ACTIVITY_ALL_KINDS: u32 = 0x1FE;
/// `TFL_ActivityRecord.flags`: the times are on the host's
/// `CLOCK_MONOTONIC`, not the device clock.
pub const TFL_ACTIVITY_HOST_CLOCK: u32 = 1;
/// Bytes of `TFL_ActivityRecord.name`, NUL included.
pub const TFL_ACTIVITY_NAME_BYTES: usize = 64;
/// Bytes of `TFL_ActivityRecord.detail`, NUL included.
pub const TFL_ACTIVITY_DETAIL_BYTES: usize = 128;

/// One activity record (ABI 1.8), written by the plugin into the host's
/// array at `activity_drain`. See the header ("Activity records and ranges")
/// for the buffer, clock and correlation rules.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_ActivityRecord {
    /// Bytes the plugin wrote.
    pub struct_size: usize,
    /// A `TFL_ACTIVITY_*` kind.
    pub kind: u32,
    /// `TFL_ACTIVITY_HOST_CLOCK`, or 0.
    pub flags: u32,
    /// The device, -1 for none.
    pub device: i32,
    /// 0.
    pub reserved: u32,
    /// The stream the work ran on; null for none.
    pub stream: *mut TFL_Stream,
    /// The host's correlation id, 0 for none.
    pub correlation_id: u64,
    /// Start, nanoseconds.
    pub start_ns: u64,
    /// End, nanoseconds (`>= start_ns`).
    pub end_ns: u64,
    /// The native call, kernel or range; NUL-terminated.
    pub name: [c_char; TFL_ACTIVITY_NAME_BYTES],
    /// Details, possibly empty; NUL-terminated.
    pub detail: [c_char; TFL_ACTIVITY_DETAIL_BYTES],
}

impl TFL_ActivityRecord {
    /// A zeroed record (`struct_size` 0, empty names), to drain into.
    pub const fn zeroed() -> Self {
        Self {
            struct_size: 0,
            kind: 0,
            flags: 0,
            device: -1,
            reserved: 0,
            stream: std::ptr::null_mut(),
            correlation_id: 0,
            start_ns: 0,
            end_ns: 0,
            name: [0; TFL_ACTIVITY_NAME_BYTES],
            detail: [0; TFL_ACTIVITY_DETAIL_BYTES],
        }
    }
}

/// The activity table (ABI 1.8), filled by `get_activity` into a struct the
/// host allocates. The four activity entries are required when
/// `get_activity` succeeds; the three range entries are present together or
/// all null.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_Activity {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Records the kinds whose bit is set from now on; 0 stops.
    pub activity_enable: Option<unsafe extern "C" fn(kinds: u32) -> Status>,
    /// The calling thread's correlation id for what it does next (0: none).
    pub activity_set_correlation: Option<unsafe extern "C" fn(id: u64)>,
    /// Moves up to `capacity` complete records into the host's array.
    pub activity_drain: Option<
        unsafe extern "C" fn(
            records: *mut TFL_ActivityRecord,
            record_size: usize,
            capacity: usize,
            out_written: *mut usize,
            out_dropped: *mut u64,
        ) -> Status,
    >,
    /// A device time and the host's `CLOCK_MONOTONIC` time at one moment.
    pub activity_clock:
        Option<unsafe extern "C" fn(device: i32, out_device_ns: *mut u64, out_host_ns: *mut u64) -> Status>,
    /// Opens a range on the calling thread.
    pub range_push: Option<unsafe extern "C" fn(name: *const c_char)>,
    /// Closes the calling thread's innermost range.
    pub range_pop: Option<unsafe extern "C" fn()>,
    /// An instant.
    pub range_mark: Option<unsafe extern "C" fn(name: *const c_char)>,
}

impl TFL_Activity {
    /// An empty table for a plugin to fill: `struct_size` is `struct_size`
    /// (the host's view), every entry `None`.
    pub const fn empty(struct_size: usize) -> Self {
        Self {
            struct_size,
            activity_enable: None,
            activity_set_correlation: None,
            activity_drain: None,
            activity_clock: None,
            range_push: None,
            range_pop: None,
            range_mark: None,
        }
    }
}

/// A communicator (opaque, owned by the plugin).
#[repr(C)]
#[derive(Debug)]
pub struct TFL_Comm {
    _private: [u8; 0],
}

/// A `TFL_ReduceOp` value.
pub type TFL_ReduceOp = i32;
/// Sum.
pub const TFL_REDUCE_SUM: TFL_ReduceOp = 0;
/// Product.
pub const TFL_REDUCE_PROD: TFL_ReduceOp = 1;
/// Minimum.
pub const TFL_REDUCE_MIN: TFL_ReduceOp = 2;
/// Maximum.
pub const TFL_REDUCE_MAX: TFL_ReduceOp = 3;
/// Sum divided by the world size (integer division for integer dtypes).
pub const TFL_REDUCE_AVG: TFL_ReduceOp = 4;

/// Every `TFL_ReduceOp` with its name in `torch.distributed.ReduceOp` (the
/// attribute: `ReduceOp.SUM`): the one table of reduction operators,
/// exported to the host's Python as `torch_fl._native.REDUCE_OPS`
/// (name -> value).
pub const TFL_REDUCE_OP_TORCH_NAMES: [(TFL_ReduceOp, &str); 5] = [
    (TFL_REDUCE_SUM, "SUM"),
    (TFL_REDUCE_PROD, "PRODUCT"),
    (TFL_REDUCE_MIN, "MIN"),
    (TFL_REDUCE_MAX, "MAX"),
    (TFL_REDUCE_AVG, "AVG"),
];

/// Settings of a new communicator (ABI 1.5), like NCCL's `ncclConfig_t`,
/// passed to `comm_init_rank_config`. The host fills it; a plugin reads only
/// the fields `struct_size` covers and uses its defaults for the rest.
/// Borrowed for the call.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TFL_CommConfig {
    /// Set by the host to the size it knows.
    pub struct_size: usize,
    // --- 1.5 ---
    /// How long the communicator waits for its peers (the rendezvous and
    /// every later wait), in milliseconds; 0: the plugin's default.
    pub timeout_ms: u64,
    /// 1: creation returns once every rank joined. 0: it returns at once;
    /// joining completes in the background, operations enqueued meanwhile
    /// wait for it, and a failure to join becomes the communicator's
    /// asynchronous error.
    pub blocking: i32,
}

/// The collectives table (ABI 1.3), filled by `get_collectives` into a
/// struct the host allocates. Every 1.3 entry is required when
/// `get_collectives` succeeds; entries of later minors are marked with
/// whether they may be `None`. See the header for each entry's contract.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_Collectives {
    /// Set by the host (the caller) to the size it knows.
    pub struct_size: usize,
    // --- 1.3 ---
    /// Creates a unique id for a new group, in one process.
    pub get_unique_id: Option<unsafe extern "C" fn(out: *mut TFL_UniqueId) -> Status>,
    /// Creates this process' member `rank` of the group; blocks until all
    /// ranks joined or the plugin's timeout.
    pub comm_init_rank: Option<
        unsafe extern "C" fn(
            id: *const TFL_UniqueId,
            world_size: i32,
            rank: i32,
            device: i32,
            out_comm: *mut *mut TFL_Comm,
        ) -> Status,
    >,
    /// Waits for queued operations, then releases the communicator.
    pub comm_destroy: Option<unsafe extern "C" fn(comm: *mut TFL_Comm) -> Status>,
    /// Fails waiting operations promptly and refuses later ones; any thread.
    pub comm_abort: Option<unsafe extern "C" fn(comm: *mut TFL_Comm) -> Status>,
    /// The first asynchronous failure (caller-owned) or NULL; any thread.
    pub comm_get_async_error:
        Option<unsafe extern "C" fn(comm: *mut TFL_Comm, out_error: *mut *mut TFL_Error) -> Status>,
    /// All-reduce with a [`TFL_ReduceOp`].
    pub all_reduce: Option<
        unsafe extern "C" fn(
            send: *const c_void,
            recv: *mut c_void,
            count: usize,
            dtype: TFL_DType,
            op: i32,
            comm: *mut TFL_Comm,
            stream: *mut TFL_Stream,
        ) -> Status,
    >,
    /// Broadcast from `root`.
    pub broadcast: Option<
        unsafe extern "C" fn(
            send: *const c_void,
            recv: *mut c_void,
            count: usize,
            dtype: TFL_DType,
            root: i32,
            comm: *mut TFL_Comm,
            stream: *mut TFL_Stream,
        ) -> Status,
    >,
    /// Reduce to `root`.
    pub reduce: Option<
        unsafe extern "C" fn(
            send: *const c_void,
            recv: *mut c_void,
            count: usize,
            dtype: TFL_DType,
            op: i32,
            root: i32,
            comm: *mut TFL_Comm,
            stream: *mut TFL_Stream,
        ) -> Status,
    >,
    /// All-gather of `send_count` elements per rank.
    pub all_gather: Option<
        unsafe extern "C" fn(
            send: *const c_void,
            recv: *mut c_void,
            send_count: usize,
            dtype: TFL_DType,
            comm: *mut TFL_Comm,
            stream: *mut TFL_Stream,
        ) -> Status,
    >,
    /// Reduce-scatter into `recv_count` elements per rank.
    pub reduce_scatter: Option<
        unsafe extern "C" fn(
            send: *const c_void,
            recv: *mut c_void,
            recv_count: usize,
            dtype: TFL_DType,
            op: i32,
            comm: *mut TFL_Comm,
            stream: *mut TFL_Stream,
        ) -> Status,
    >,
    /// All-to-all of `count_per_rank` elements per pair of ranks.
    pub all_to_all: Option<
        unsafe extern "C" fn(
            send: *const c_void,
            recv: *mut c_void,
            count_per_rank: usize,
            dtype: TFL_DType,
            comm: *mut TFL_Comm,
            stream: *mut TFL_Stream,
        ) -> Status,
    >,
    /// Sends to `peer`.
    pub send: Option<
        unsafe extern "C" fn(
            buf: *const c_void,
            count: usize,
            dtype: TFL_DType,
            peer: i32,
            comm: *mut TFL_Comm,
            stream: *mut TFL_Stream,
        ) -> Status,
    >,
    /// Receives from `peer`.
    pub recv: Option<
        unsafe extern "C" fn(
            buf: *mut c_void,
            count: usize,
            dtype: TFL_DType,
            peer: i32,
            comm: *mut TFL_Comm,
            stream: *mut TFL_Stream,
        ) -> Status,
    >,
    /// Opens a group of operations on `comm` (nestable).
    pub group_start: Option<unsafe extern "C" fn(comm: *mut TFL_Comm) -> Status>,
    /// Closes a group; the outermost launches it.
    pub group_end: Option<unsafe extern "C" fn(comm: *mut TFL_Comm) -> Status>,
    // --- 1.5: optional ---
    /// `comm_init_rank` with a [`TFL_CommConfig`] (timeout, blocking); may
    /// be `None`, and the host then calls `comm_init_rank`.
    pub comm_init_rank_config: Option<
        unsafe extern "C" fn(
            id: *const TFL_UniqueId,
            world_size: i32,
            rank: i32,
            device: i32,
            config: *const TFL_CommConfig,
            out_comm: *mut *mut TFL_Comm,
        ) -> Status,
    >,
}

// ---------------------------------------------------------------------------
// The plugin's function table
// ---------------------------------------------------------------------------

/// The plugin's function table, returned by the bootstrap function. Owned by
/// the plugin, valid and unchanged for the life of the process. Required
/// entries are `Some` in every plugin (the host refuses a plugin otherwise);
/// optional ones may be `None`, and the host then reports what needs them as
/// unimplemented. Every entry returning a status returns NULL on success or
/// an error the caller releases with `error_destroy`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_PluginApi {
    /// Bytes of this struct the plugin filled (`TFL_STRUCT_SIZE`).
    pub struct_size: usize,
    /// The plugin's `TFL_ABI_VERSION_MAJOR`; offset fixed forever.
    pub abi_major: u32,
    /// The plugin's `TFL_ABI_VERSION_MINOR`; offset fixed forever.
    pub abi_minor: u32,
    // --- 1.0: errors (required) ---
    /// The error's [`TFL_ErrorCode`]. Thread-safe on distinct errors.
    pub error_code: Option<unsafe extern "C" fn(error: *const TFL_Error) -> i32>,
    /// The error's message, valid until `error_destroy`.
    pub error_message: Option<unsafe extern "C" fn(error: *const TFL_Error) -> *const c_char>,
    /// Releases an error received from any entry or kernel; NULL is a no-op.
    pub error_destroy: Option<unsafe extern "C" fn(error: *mut TFL_Error)>,
    // --- 1.0: identity and lifecycle (required) ---
    /// The plugin's identity; callable before `initialize`, never NULL.
    pub get_info: Option<unsafe extern "C" fn() -> *const TFL_PluginInfo>,
    /// Called once before any other entry except `error_*`, `get_info` and
    /// `get_op_table`; a second call returns `FAILED_PRECONDITION`.
    pub initialize: Option<unsafe extern "C" fn(args: *const TFL_InitArgs) -> Status>,
    /// Fills the operator table; callable before `initialize`.
    pub get_op_table: Option<unsafe extern "C" fn(out: *mut TFL_OpTable) -> Status>,
    // --- 1.0: devices (required) ---
    /// The number of devices; indices run from 0 to count - 1.
    pub device_count: Option<unsafe extern "C" fn(out_count: *mut i32) -> Status>,
    /// Fills the properties of one device.
    pub device_properties:
        Option<unsafe extern "C" fn(device: i32, out: *mut TFL_DeviceProperties) -> Status>,
    /// Waits for all work on every stream of the device and reports the first
    /// asynchronous failure since the last synchronization.
    pub device_synchronize: Option<unsafe extern "C" fn(device: i32) -> Status>,
    // --- 1.0: memory (required) ---
    /// Allocates `nbytes` (0 allowed: a unique non-NULL pointer) aligned to at
    /// least 64 bytes; lack of memory is `OUT_OF_MEMORY`, never NULL.
    pub allocate:
        Option<unsafe extern "C" fn(device: i32, nbytes: usize, out_ptr: *mut *mut c_void) -> Status>,
    /// Releases memory from `allocate`, stream-ordered: it is reused only
    /// after all work submitted before the call has completed. NULL is a
    /// no-op.
    pub deallocate: Option<unsafe extern "C" fn(device: i32, ptr: *mut c_void) -> Status>,
    /// Copies between host and device or between devices (see
    /// [`TFL_CopyArgs`]).
    pub copy: Option<unsafe extern "C" fn(args: *const TFL_CopyArgs) -> Status>,
    /// Sets `nbytes` at `ptr` to `value`; a NULL stream makes it synchronous.
    pub set_memory: Option<
        unsafe extern "C" fn(
            device: i32,
            ptr: *mut c_void,
            value: u8,
            nbytes: usize,
            stream: *mut TFL_Stream,
        ) -> Status,
    >,
    // --- 1.0: streams (required) ---
    /// The device's default stream: owned by the plugin, never destroyed.
    pub default_stream: Option<unsafe extern "C" fn(device: i32, out: *mut *mut TFL_Stream) -> Status>,
    /// Creates a stream; `priority` is 0 for normal, negative for higher, and
    /// may be ignored.
    pub stream_create:
        Option<unsafe extern "C" fn(device: i32, priority: i32, out: *mut *mut TFL_Stream) -> Status>,
    /// Destroys a created stream; queued work still runs. Destroying a
    /// default stream is `INVALID_ARGUMENT`.
    pub stream_destroy: Option<unsafe extern "C" fn(stream: *mut TFL_Stream) -> Status>,
    /// Waits until all work submitted to the stream has run.
    pub stream_synchronize: Option<unsafe extern "C" fn(stream: *mut TFL_Stream) -> Status>,
    /// Sets `*out_complete` to 1 when all submitted work has run, else 0.
    pub stream_query: Option<unsafe extern "C" fn(stream: *mut TFL_Stream, out_complete: *mut u8) -> Status>,
    /// Makes work submitted to `stream` after this call wait for `event` (as
    /// last recorded), without blocking the host.
    pub stream_wait_event:
        Option<unsafe extern "C" fn(stream: *mut TFL_Stream, event: *mut TFL_Event) -> Status>,
    // --- 1.0: events (required) ---
    /// Creates an event; `flags` are `TFL_EVENT_*` bits.
    pub event_create:
        Option<unsafe extern "C" fn(device: i32, flags: u32, out: *mut *mut TFL_Event) -> Status>,
    /// Destroys an event from `event_create`.
    pub event_destroy: Option<unsafe extern "C" fn(event: *mut TFL_Event) -> Status>,
    /// Captures the work submitted to `stream` so far, replacing any previous
    /// capture.
    pub event_record: Option<unsafe extern "C" fn(event: *mut TFL_Event, stream: *mut TFL_Stream) -> Status>,
    /// Sets `*out_complete` to 1 when the recorded work has run (or the event
    /// was never recorded), else 0.
    pub event_query: Option<unsafe extern "C" fn(event: *mut TFL_Event, out_complete: *mut u8) -> Status>,
    /// Waits until the recorded work has run.
    pub event_synchronize: Option<unsafe extern "C" fn(event: *mut TFL_Event) -> Status>,
    // --- 1.0: optional ---
    /// Milliseconds between two completed events created with
    /// [`TFL_EVENT_TIMING`]. Optional: without it elapsed time is
    /// unimplemented.
    pub event_elapsed_time:
        Option<unsafe extern "C" fn(start: *mut TFL_Event, end: *mut TFL_Event, out_ms: *mut f32) -> Status>,
    /// Fills the device's memory statistics. Optional: without it the host
    /// reports zeros and the allocation counts it tracks itself.
    pub memory_stats: Option<unsafe extern "C" fn(device: i32, out: *mut TFL_MemoryStats) -> Status>,
    /// Restarts `peak_allocated_bytes` from the current allocation. Optional.
    pub reset_peak_memory_stats: Option<unsafe extern "C" fn(device: i32) -> Status>,
    /// Returns cached, unused device memory to the system. Optional: without
    /// it, a no-op.
    pub empty_cache: Option<unsafe extern "C" fn(device: i32) -> Status>,
    // --- 1.3: optional ---
    /// Fills the collectives table (the host sets `out.struct_size`); called
    /// once after `initialize`. Optional: absent, or an error, means no
    /// collectives.
    pub get_collectives: Option<unsafe extern "C" fn(out: *mut TFL_Collectives) -> Status>,
    // --- 1.4: optional, page-locked host memory ---
    /// Allocates `nbytes` of page-locked host memory the device can DMA
    /// from and to (like `cudaHostAlloc`), aligned to at least 64 bytes; 0
    /// bytes gives a unique non-NULL pointer, lack of memory is
    /// `OUT_OF_MEMORY`. Thread-safe. Optional: without it the host backs its
    /// pinned pool with ordinary host memory.
    pub host_allocate: Option<unsafe extern "C" fn(nbytes: usize, out_ptr: *mut *mut c_void) -> Status>,
    /// Releases a block from `host_allocate` at once (NOT stream-ordered:
    /// the host frees only after the copies using the block completed).
    /// NULL is a no-op. Required when `host_allocate` is present.
    pub host_deallocate: Option<unsafe extern "C" fn(ptr: *mut c_void) -> Status>,
    // --- 1.6: OPTIONAL ---
    /// How many devices `initialize(options)` would find, without
    /// initializing (no contexts, memory or kernel builds): 0 is a success;
    /// a missing driver is an error saying what to install. Callable before
    /// or after `initialize`, from any thread. Absent: the host assumes the
    /// plugin's devices are present.
    pub probe_devices: Option<unsafe extern "C" fn(options: *const c_char, out_count: *mut i32) -> Status>,
    // --- 1.7: OPTIONAL ---
    /// Fills the graphs table (the host sets `out.struct_size`); called once
    /// after `initialize`. Optional: absent, or an error, means no native
    /// graphs (the host replays its own recording).
    pub get_graphs: Option<unsafe extern "C" fn(out: *mut TFL_Graphs) -> Status>,
    // --- 1.8: OPTIONAL ---
    /// Fills the activity table (the host sets `out.struct_size`); called
    /// once after `initialize`. Optional: absent, or an error, means no
    /// records (the host times calls with events).
    pub get_activity: Option<unsafe extern "C" fn(out: *mut TFL_Activity) -> Status>,
}

/// The bootstrap function's type. Its signature never changes.
pub type TFL_GetPluginApiFn = unsafe extern "C" fn(host: *const TFL_HostApi) -> *const TFL_PluginApi;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_codes_round_trip_and_names_are_unique() {
        for (i, (d, name)) in TFL_DTYPE_TORCH_NAMES.iter().enumerate() {
            assert_eq!(TFL_DType::from_code(d.to_code()), Some(*d), "{name}");
            assert_eq!(d.torch_name(), Some(*name));
            for (e, other) in &TFL_DTYPE_TORCH_NAMES[i + 1..] {
                assert!(d != e && name != other, "{name} and {other}");
            }
        }
        assert_eq!(TFL_DType::F32.to_code(), 2 | 32 << 8 | 1 << 16);
        assert_eq!(TFL_DType::from_code(1 << 24), None);
    }

    #[test]
    fn reduce_ops_are_listed_once_each() {
        let mut values: Vec<_> = TFL_REDUCE_OP_TORCH_NAMES.iter().map(|(v, _)| *v).collect();
        values.sort_unstable();
        assert_eq!(values, [TFL_REDUCE_SUM, TFL_REDUCE_PROD, TFL_REDUCE_MIN, TFL_REDUCE_MAX, TFL_REDUCE_AVG]);
    }
}

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
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

mod mangle;
pub use mangle::{kernel_symbol, parse_op_name, OpName};

/// The header, for tools that write it out or compile against it.
pub const HEADER: &str = include_str!("../include/torch_fl/plugin.h");

/// Directory holding `torch_fl/plugin.h`, for build scripts and tests that
/// compile C plugins.
pub fn include_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

pub const TFL_ABI_VERSION_MAJOR: u32 = 1;
pub const TFL_ABI_VERSION_MINOR: u32 = 1;

/// Name of the bootstrap symbol (without the trailing NUL).
pub const TFL_BOOTSTRAP_SYMBOL: &str = "torch_fl_plugin_get_api";
/// Prefix of every exported kernel symbol.
pub const TFL_KERNEL_SYMBOL_PREFIX: &str = "torch_fl_op_";

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

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Opaque error object created by a plugin; released with `error_destroy`.
#[repr(C)]
#[derive(Debug)]
pub struct TFL_Error {
    _opaque: [u8; 0],
}

pub type TFL_ErrorCode = i32;
pub const TFL_ERROR_UNKNOWN: TFL_ErrorCode = 1;
pub const TFL_ERROR_INVALID_ARGUMENT: TFL_ErrorCode = 2;
pub const TFL_ERROR_OUT_OF_MEMORY: TFL_ErrorCode = 3;
pub const TFL_ERROR_UNIMPLEMENTED: TFL_ErrorCode = 4;
pub const TFL_ERROR_INTERNAL: TFL_ErrorCode = 5;
pub const TFL_ERROR_DEVICE_LOST: TFL_ErrorCode = 6;
pub const TFL_ERROR_FAILED_PRECONDITION: TFL_ErrorCode = 7;

// ---------------------------------------------------------------------------
// Host services
// ---------------------------------------------------------------------------

pub type TFL_LogLevel = i32;
pub const TFL_LOG_DEBUG: TFL_LogLevel = 0;
pub const TFL_LOG_INFO: TFL_LogLevel = 1;
pub const TFL_LOG_WARNING: TFL_LogLevel = 2;
pub const TFL_LOG_ERROR: TFL_LogLevel = 3;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_HostApi {
    pub struct_size: usize,
    pub abi_major: u32,
    pub abi_minor: u32,
    // --- 1.0 ---
    pub context: *mut c_void,
    pub log: Option<unsafe extern "C" fn(context: *mut c_void, level: i32, message: *const c_char)>,
}

// ---------------------------------------------------------------------------
// Identity
// ---------------------------------------------------------------------------

pub const TFL_CAP_HOST_ADDRESSABLE_MEMORY: u64 = 1 << 0;
pub const TFL_CAP_ASYNC_STREAMS: u64 = 1 << 1;
pub const TFL_CAP_EVENT_TIMING: u64 = 1 << 2;
/// 1.1: kernels accept float16 tensors (offered to `torch.autocast`).
pub const TFL_CAP_FLOAT16: u64 = 1 << 3;
/// 1.1: kernels accept bfloat16 tensors (offered to `torch.autocast`).
pub const TFL_CAP_BFLOAT16: u64 = 1 << 4;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_PluginInfo {
    pub struct_size: usize,
    // --- 1.0 ---
    pub name: *const c_char,
    pub vendor: *const c_char,
    pub chip_family: *const c_char,
    pub plugin_version: *const c_char,
    pub min_torch_version: *const c_char,
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

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_DeviceProperties {
    pub struct_size: usize,
    // --- 1.0 ---
    pub name: *const c_char,
    pub total_memory: u64,
    pub compute_units: i32,
    pub memory_alignment: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TFL_MemoryStats {
    pub struct_size: usize,
    // --- 1.0 ---
    pub allocated_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub total_bytes: u64,
    pub num_allocations: u64,
    pub num_frees: u64,
    pub num_ooms: u64,
}

pub type TFL_CopyKind = i32;
pub const TFL_COPY_HOST_TO_DEVICE: TFL_CopyKind = 1;
pub const TFL_COPY_DEVICE_TO_HOST: TFL_CopyKind = 2;
pub const TFL_COPY_DEVICE_TO_DEVICE: TFL_CopyKind = 3;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_CopyArgs {
    pub struct_size: usize,
    // --- 1.0 ---
    pub kind: TFL_CopyKind,
    pub dst_device: i32,
    pub src_device: i32,
    pub dst: *mut c_void,
    pub src: *const c_void,
    pub nbytes: usize,
    pub stream: *mut TFL_Stream,
}

pub const TFL_EVENT_DEFAULT: u32 = 0;
pub const TFL_EVENT_TIMING: u32 = 1;

// ---------------------------------------------------------------------------
// Call frame
// ---------------------------------------------------------------------------

pub const TFL_DTYPE_INT: u8 = 0;
pub const TFL_DTYPE_UINT: u8 = 1;
pub const TFL_DTYPE_FLOAT: u8 = 2;
pub const TFL_DTYPE_BFLOAT: u8 = 4;
pub const TFL_DTYPE_COMPLEX: u8 = 5;
pub const TFL_DTYPE_BOOL: u8 = 6;

/// Element type, as DLPack's `DLDataType`. Frozen: no `struct_size`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TFL_DType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

impl TFL_DType {
    pub const fn new(code: u8, bits: u8) -> Self {
        Self { code, bits, lanes: 1 }
    }
    pub const BOOL: Self = Self::new(TFL_DTYPE_BOOL, 8);
    pub const U8: Self = Self::new(TFL_DTYPE_UINT, 8);
    pub const I8: Self = Self::new(TFL_DTYPE_INT, 8);
    pub const I16: Self = Self::new(TFL_DTYPE_INT, 16);
    pub const I32: Self = Self::new(TFL_DTYPE_INT, 32);
    pub const I64: Self = Self::new(TFL_DTYPE_INT, 64);
    pub const F16: Self = Self::new(TFL_DTYPE_FLOAT, 16);
    pub const BF16: Self = Self::new(TFL_DTYPE_BFLOAT, 16);
    pub const F32: Self = Self::new(TFL_DTYPE_FLOAT, 32);
    pub const F64: Self = Self::new(TFL_DTYPE_FLOAT, 64);

    /// Bytes per element (all lanes).
    pub const fn itemsize(self) -> usize {
        (self.bits as usize).div_ceil(8) * self.lanes as usize
    }
}

/// `TFL_Tensor.flags`: a Python number wrapped into a 0-dim host tensor.
pub const TFL_TENSOR_WRAPPED_NUMBER: u64 = 1 << 0;
/// `TFL_Tensor.flags`: an output the operator leaves undefined (0 elements,
/// NULL data); the kernel must not write it.
pub const TFL_TENSOR_UNDEFINED: u64 = 1 << 1;

pub type TFL_DeviceType = i32;
pub const TFL_DEVICE_HOST: TFL_DeviceType = 1;
pub const TFL_DEVICE_PLUGIN: TFL_DeviceType = 2;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_Tensor {
    pub struct_size: usize,
    // --- 1.0 ---
    pub data: *mut c_void,
    pub byte_offset: u64,
    pub device_type: TFL_DeviceType,
    pub device_index: i32,
    pub dtype: TFL_DType,
    pub ndim: i32,
    pub shape: *const i64,
    pub strides: *const i64,
    pub flags: u64,
}

pub type TFL_ScalarKind = i32;
pub const TFL_SCALAR_INT: TFL_ScalarKind = 1;
pub const TFL_SCALAR_FLOAT: TFL_ScalarKind = 2;
pub const TFL_SCALAR_BOOL: TFL_ScalarKind = 3;
pub const TFL_SCALAR_COMPLEX: TFL_ScalarKind = 4;

#[repr(C)]
#[derive(Clone, Copy)]
pub union TFL_ScalarValue {
    pub i: i64,
    pub f: f64,
    pub b: u8,
    pub c: [f64; 2],
}

/// A PyTorch `Scalar`. Frozen: no `struct_size`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TFL_Scalar {
    pub kind: TFL_ScalarKind,
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

pub type TFL_ValueTag = i32;
pub const TFL_VALUE_NONE: TFL_ValueTag = 0;
pub const TFL_VALUE_TENSOR: TFL_ValueTag = 1;
pub const TFL_VALUE_TENSOR_LIST: TFL_ValueTag = 2;
pub const TFL_VALUE_INT: TFL_ValueTag = 3;
pub const TFL_VALUE_FLOAT: TFL_ValueTag = 4;
pub const TFL_VALUE_BOOL: TFL_ValueTag = 5;
pub const TFL_VALUE_SCALAR: TFL_ValueTag = 6;
pub const TFL_VALUE_INT_LIST: TFL_ValueTag = 7;
pub const TFL_VALUE_FLOAT_LIST: TFL_ValueTag = 8;
pub const TFL_VALUE_BOOL_LIST: TFL_ValueTag = 9;
pub const TFL_VALUE_STRING: TFL_ValueTag = 10;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_TensorList {
    pub items: *const *const TFL_Tensor,
    pub len: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_IntList {
    pub items: *const i64,
    pub len: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_FloatList {
    pub items: *const f64,
    pub len: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_BoolList {
    pub items: *const u8,
    pub len: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_String {
    pub data: *const c_char,
    pub len: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union TFL_ValueUnion {
    pub tensor: *const TFL_Tensor,
    pub tensor_list: TFL_TensorList,
    pub i: i64,
    pub f: f64,
    pub b: u8,
    pub scalar: TFL_Scalar,
    pub int_list: TFL_IntList,
    pub float_list: TFL_FloatList,
    pub bool_list: TFL_BoolList,
    pub string: TFL_String,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct TFL_Value {
    pub struct_size: usize,
    // --- 1.0 ---
    pub tag: TFL_ValueTag,
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

pub type TFL_ResizeOutputFn = unsafe extern "C" fn(
    frame: *const TFL_CallFrame,
    output_index: usize,
    ndim: i32,
    shape: *const i64,
) -> i32;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_CallFrame {
    pub struct_size: usize,
    // --- 1.0 ---
    pub op_name: *const c_char,
    pub device_index: i32,
    pub stream: *mut TFL_Stream,
    pub args: *const *const TFL_Value,
    pub num_args: usize,
    pub outputs: *const *mut TFL_Tensor,
    pub num_outputs: usize,
    pub resize_output: Option<TFL_ResizeOutputFn>,
    pub host_context: *mut c_void,
    pub rng_seed: u64,
    pub rng_offset: u64,
}

pub type TFL_KernelFn = unsafe extern "C" fn(frame: *const TFL_CallFrame) -> *mut TFL_Error;

/// 1.1: the most dimensions an output described by `TFL_OutputMeta` has.
pub const TFL_MAX_OUTPUT_DIMS: usize = 16;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_OutputMeta {
    pub struct_size: usize,
    // --- 1.1 ---
    pub dtype: TFL_DType,
    pub ndim: i32,
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

pub const TFL_OP_RANDOM: u64 = 1 << 0;
pub const TFL_OP_DYNAMIC_SHAPE: u64 = 1 << 1;
pub const TFL_OP_NONDETERMINISTIC: u64 = 1 << 2;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_OpEntry {
    pub struct_size: usize,
    // --- 1.0 ---
    pub name: *const c_char,
    pub symbol: *const c_char,
    pub kernel: Option<TFL_KernelFn>,
    pub flags: u64,
    pub schema: *const c_char,
    // --- 1.1 ---
    pub infer_outputs: Option<TFL_InferOutputsFn>,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_OpTable {
    pub struct_size: usize,
    // --- 1.0 ---
    pub entries: *const TFL_OpEntry,
    pub num_entries: usize,
    pub entry_size: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_InitArgs {
    pub struct_size: usize,
    // --- 1.0 ---
    pub options: *const c_char,
}

// ---------------------------------------------------------------------------
// The plugin's function table
// ---------------------------------------------------------------------------

type Status = *mut TFL_Error;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TFL_PluginApi {
    pub struct_size: usize,
    pub abi_major: u32,
    pub abi_minor: u32,
    // --- 1.0: errors (required) ---
    pub error_code: Option<unsafe extern "C" fn(error: *const TFL_Error) -> i32>,
    pub error_message: Option<unsafe extern "C" fn(error: *const TFL_Error) -> *const c_char>,
    pub error_destroy: Option<unsafe extern "C" fn(error: *mut TFL_Error)>,
    // --- 1.0: identity and lifecycle (required) ---
    pub get_info: Option<unsafe extern "C" fn() -> *const TFL_PluginInfo>,
    pub initialize: Option<unsafe extern "C" fn(args: *const TFL_InitArgs) -> Status>,
    pub get_op_table: Option<unsafe extern "C" fn(out: *mut TFL_OpTable) -> Status>,
    // --- 1.0: devices (required) ---
    pub device_count: Option<unsafe extern "C" fn(out_count: *mut i32) -> Status>,
    pub device_properties:
        Option<unsafe extern "C" fn(device: i32, out: *mut TFL_DeviceProperties) -> Status>,
    pub device_synchronize: Option<unsafe extern "C" fn(device: i32) -> Status>,
    // --- 1.0: memory (required) ---
    pub allocate:
        Option<unsafe extern "C" fn(device: i32, nbytes: usize, out_ptr: *mut *mut c_void) -> Status>,
    pub deallocate: Option<unsafe extern "C" fn(device: i32, ptr: *mut c_void) -> Status>,
    pub copy: Option<unsafe extern "C" fn(args: *const TFL_CopyArgs) -> Status>,
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
    pub default_stream: Option<unsafe extern "C" fn(device: i32, out: *mut *mut TFL_Stream) -> Status>,
    pub stream_create:
        Option<unsafe extern "C" fn(device: i32, priority: i32, out: *mut *mut TFL_Stream) -> Status>,
    pub stream_destroy: Option<unsafe extern "C" fn(stream: *mut TFL_Stream) -> Status>,
    pub stream_synchronize: Option<unsafe extern "C" fn(stream: *mut TFL_Stream) -> Status>,
    pub stream_query: Option<unsafe extern "C" fn(stream: *mut TFL_Stream, out_complete: *mut u8) -> Status>,
    pub stream_wait_event:
        Option<unsafe extern "C" fn(stream: *mut TFL_Stream, event: *mut TFL_Event) -> Status>,
    // --- 1.0: events (required) ---
    pub event_create:
        Option<unsafe extern "C" fn(device: i32, flags: u32, out: *mut *mut TFL_Event) -> Status>,
    pub event_destroy: Option<unsafe extern "C" fn(event: *mut TFL_Event) -> Status>,
    pub event_record: Option<unsafe extern "C" fn(event: *mut TFL_Event, stream: *mut TFL_Stream) -> Status>,
    pub event_query: Option<unsafe extern "C" fn(event: *mut TFL_Event, out_complete: *mut u8) -> Status>,
    pub event_synchronize: Option<unsafe extern "C" fn(event: *mut TFL_Event) -> Status>,
    // --- 1.0: optional ---
    pub event_elapsed_time:
        Option<unsafe extern "C" fn(start: *mut TFL_Event, end: *mut TFL_Event, out_ms: *mut f32) -> Status>,
    pub memory_stats: Option<unsafe extern "C" fn(device: i32, out: *mut TFL_MemoryStats) -> Status>,
    pub reset_peak_memory_stats: Option<unsafe extern "C" fn(device: i32) -> Status>,
    pub empty_cache: Option<unsafe extern "C" fn(device: i32) -> Status>,
}

/// The bootstrap function's type. Its signature never changes.
pub type TFL_GetPluginApiFn = unsafe extern "C" fn(host: *const TFL_HostApi) -> *const TFL_PluginApi;

//! The plain types of a plugin and of its loading: what a plugin declares
//! (identity, capabilities, kernels, devices) and what loading found
//! (stages, warnings).
//!
//! Values only, no calls into a plugin: the error type, the validation
//! rules, the loader and the loaded plugin all speak of these, so they sit
//! below every one of them. Each is re-exported where users name it
//! ([`crate::plugin`], [`crate::validate`] and the crate root).

use std::fmt;

use torchfl_ffi::{
    TFL_InferOutputsFn, TFL_KernelFn, TFL_CAP_ASYNC_STREAMS, TFL_CAP_BFLOAT16, TFL_CAP_CACHING_ALLOCATOR,
    TFL_CAP_EVENT_TIMING, TFL_CAP_FLOAT16, TFL_CAP_HOST_ADDRESSABLE_MEMORY,
};

/// Capability flags a plugin declares (`TFL_CAP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities(u64);

impl Capabilities {
    /// Wraps `TFL_PluginInfo.capabilities` as the plugin reports it; unknown
    /// bits are kept, so [`Capabilities::bits`] round-trips.
    pub fn from_bits(bits: u64) -> Self {
        Self(bits)
    }
    /// The raw `TFL_CAP_*` bits, unknown ones included.
    pub fn bits(self) -> u64 {
        self.0
    }
    /// Host code may dereference device pointers (zero-copy CPU fallback).
    pub fn host_addressable_memory(self) -> bool {
        self.0 & TFL_CAP_HOST_ADDRESSABLE_MEMORY != 0
    }
    /// Stream work runs asynchronously to the host.
    pub fn async_streams(self) -> bool {
        self.0 & TFL_CAP_ASYNC_STREAMS != 0
    }
    /// Timed events are supported.
    pub fn event_timing(self) -> bool {
        self.0 & TFL_CAP_EVENT_TIMING != 0
    }
    /// Kernels accept float16 (ABI 1.1).
    pub fn float16(self) -> bool {
        self.0 & TFL_CAP_FLOAT16 != 0
    }
    /// Kernels accept bfloat16 (ABI 1.1).
    pub fn bfloat16(self) -> bool {
        self.0 & TFL_CAP_BFLOAT16 != 0
    }
    /// The plugin's allocator caches by itself (ABI 1.4): the host passes
    /// allocations straight through instead of caching on top.
    pub fn caching_allocator(self) -> bool {
        self.0 & TFL_CAP_CACHING_ALLOCATOR != 0
    }
    /// The names of the set flags, for display.
    pub fn names(self) -> Vec<&'static str> {
        [
            (self.host_addressable_memory(), "host_addressable_memory"),
            (self.async_streams(), "async_streams"),
            (self.event_timing(), "event_timing"),
            (self.float16(), "float16"),
            (self.bfloat16(), "bfloat16"),
            (self.caching_allocator(), "caching_allocator"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect()
    }
}

/// A plugin's identity (`TFL_PluginInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// Short identifier, e.g. `"sim"`: what discovery and `find` match.
    pub name: String,
    /// Who ships the plugin.
    pub vendor: String,
    /// The hardware family, e.g. `"simulated"`.
    pub chip_family: String,
    /// The plugin's own version, e.g. `"1.2.0"`.
    pub plugin_version: String,
    /// Lowest PyTorch version the plugin was validated with; `None` for no
    /// constraint.
    pub min_torch_version: Option<String>,
    /// What the plugin declares it can do, read after `initialize`.
    pub capabilities: Capabilities,
}

/// One operator the plugin implements, with its resolved kernel.
#[derive(Clone)]
pub struct OpKernel {
    /// `[ns::]op[.overload]`, e.g. `add.Tensor`.
    pub name: String,
    /// The exported symbol, e.g. `torch_fl_op_add_Tensor`.
    pub symbol: String,
    /// The function the op table points to (or, for a kernel found by
    /// symbol, the exported function).
    pub kernel: TFL_KernelFn,
    /// `TFL_OP_*` bits.
    pub flags: u64,
    /// The schema, for operators outside `aten`.
    pub schema: Option<String>,
    /// Output metadata without running (ABI 1.1, custom operators only).
    pub infer_outputs: Option<TFL_InferOutputsFn>,
}

impl fmt::Debug for OpKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpKernel")
            .field("name", &self.name)
            .field("symbol", &self.symbol)
            .field("flags", &self.flags)
            .finish_non_exhaustive()
    }
}

/// Properties of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProperties {
    /// The device's name, or `plugin:index` when the plugin gives none.
    pub name: String,
    /// Bytes the device can allocate in all.
    pub total_memory: u64,
    /// Number of compute units; 0 when unknown.
    pub compute_units: i32,
    /// Alignment of allocated pointers, in bytes.
    pub memory_alignment: u32,
    /// The device's architecture revision `(major, minor)`, vendor-defined
    /// like CUDA's compute capability (ABI 1.2); `(0, 0)` when the plugin
    /// implements an older minor and could not declare it.
    pub capability: (i32, i32),
}

/// Memory statistics of one device: the ABI's `TFL_MemoryStats` itself, so
/// its fields are defined once (in `torchfl-ffi`); `struct_size` is the size
/// the plugin was asked to fill.
pub type MemoryStats = torchfl_ffi::TFL_MemoryStats;

/// The stages of loading a plugin, in the order the host runs them. Each is
/// one check of `torchfl-abi verify`, named by [`Stage::check_id`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// The file: a regular file (symlinks resolved), an ELF shared object
    /// for this CPU, permissions, `dlopen`.
    File,
    /// The bootstrap symbol and the version header of the table it returns.
    Handshake,
    /// `TFL_PluginApi`: its size and every entry.
    FunctionTable,
    /// `TFL_PluginInfo`.
    Identity,
    /// The op table: every entry, kernel symbols, custom-operator schemas.
    OpTable,
    /// `initialize` and `device_count`.
    Initialize,
    /// `device_properties` of every device.
    Devices,
    /// The default stream of every device.
    Streams,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 8] = [
        Stage::File,
        Stage::Handshake,
        Stage::FunctionTable,
        Stage::Identity,
        Stage::OpTable,
        Stage::Initialize,
        Stage::Devices,
        Stage::Streams,
    ];

    /// The `torchfl-abi verify` check that reports this stage.
    pub fn check_id(self) -> &'static str {
        match self {
            Stage::File => "file",
            Stage::Handshake => "handshake",
            Stage::FunctionTable => "function_table",
            Stage::Identity => "identity",
            Stage::OpTable => "op_table",
            Stage::Initialize => "initialize",
            Stage::Devices => "device_properties",
            Stage::Streams => "streams",
        }
    }
}

impl Stage {
    /// What of the plugin's code runs in this stage, as the crash report
    /// and the load timeout name it (see [`crate::inflight`]).
    pub fn call(self) -> &'static std::ffi::CStr {
        match self {
            Stage::File => c"dlopen (the library's initializers)",
            Stage::Handshake => c"torch_fl_plugin_get_api",
            Stage::FunctionTable => c"the function table's validation",
            Stage::Identity => c"info",
            Stage::OpTable => c"the op table's validation",
            Stage::Initialize => c"initialize",
            Stage::Devices => c"device_properties",
            Stage::Streams => c"default_stream",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.check_id())
    }
}

/// What a warning is about, for programs that treat kinds differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WarningKind {
    /// An `aten` operator the PyTorch release this torch-fl was built
    /// against does not have; registration checks the installed PyTorch
    /// instead (it may be another release).
    UnknownAtenOperator,
    /// A custom operator left out: its schema is invalid, declares another
    /// operator, uses types the ABI cannot pass, or does not fit the kernel.
    CustomOperatorSchema,
    /// A custom backward left out: its arity does not follow the backward
    /// convention, so the forward has no gradient.
    BackwardArity,
    /// A device reports `total_memory` = 0.
    ZeroTotalMemory,
}

impl WarningKind {
    /// A stable identifier (`"unknown_aten_operator"`), for `--json` and the
    /// Python package.
    pub fn as_str(self) -> &'static str {
        match self {
            WarningKind::UnknownAtenOperator => "unknown_aten_operator",
            WarningKind::CustomOperatorSchema => "custom_operator_schema",
            WarningKind::BackwardArity => "backward_arity",
            WarningKind::ZeroTotalMemory => "zero_total_memory",
        }
    }
}

/// A warning about a loaded plugin: the stage that found it and the message
/// both `verify` and registration show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Where it was found.
    pub stage: Stage,
    /// What it is about.
    pub kind: WarningKind,
    /// The operator or device concerned (`"sim::fused_gelu"`, `"device 0"`).
    pub subject: String,
    /// The full message.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

//! `torchfl-sim`: the simulated accelerator, torch-fl's reference plugin.
//!
//! The simulator is the device every user and CI machine has, and the
//! plugin vendors read to learn the ABI, so it behaves like real hardware
//! where that matters to a host:
//!
//! - **Asynchronous streams** ([`runtime`]): each stream is an in-order
//!   queue run by its own thread; kernels return before they run, errors
//!   inside queued work surface at the next synchronize, events carry
//!   timestamps.
//! - **Device memory** ([`runtime::memory`]): a per-device capacity with
//!   real out-of-memory errors and statistics, stream-ordered deallocation,
//!   and a strict mode whose tagged pointers crash any host code that
//!   touches device memory directly.
//! - **Activity records** ([`runtime::activity`], ABI 1.8): what each call
//!   submitted and when its kernels and copies ran, on a device clock of
//!   its own, for `torch_fl.trace` and `torch.profiler`.
//! - **Kernels** ([`kernels`]): PyTorch semantics (type promotion,
//!   broadcasting, strides, in-place aliasing, error messages) over shared
//!   elementwise and reduction engines.
//!
//! The crate is two halves over a few shared modules, and its arrows run one
//! way, from the ABI down:
//!
//! - [`abi`], on top: the C ABI, the only module tree with `extern "C"`
//!   code, driving both halves;
//! - [`kernels`]: the operators. A kernel validates a call against the
//!   runtime's memory and returns the work the runtime enqueues;
//! - [`runtime`]: devices, streams, memory, copies, collectives, the
//!   configuration and the cost model, blind to operators;
//! - shared below both: [`dtype`] (the element types and the one `Float`
//!   trait), [`error`] and [`log`].
//!
//! Everything but [`abi`] is a safe Rust API around [`Runtime`], which tests
//! and Rust hosts can instantiate directly, as many times as they like.
//! Warnings go to a [`Logger`] ([`log`]), the host's `log` service when the
//! ABI is used.
//!
//! Configuration: see [`runtime::config`] (`TORCH_FL_SIM_DEVICES`,
//! `_MEMORY`, `_MODE`, `_STRICT`, the cost model's `_COST_MODEL` and
//! friends, or the same keys in `TFL_InitArgs.options`); the cost model is
//! in [`runtime::cost`].

pub mod abi;
pub mod dtype;
pub mod error;
pub mod kernels;
pub mod log;
pub mod runtime;

pub use abi::torch_fl_plugin_get_api;
pub use dtype::DType;
pub use error::{Error, ErrorCode, Result};
pub use kernels::{Arg, Call, OutputMeta, Rng, Scalar, TensorArg, TensorData};
pub use log::{LogLevel, Logger};
pub use runtime::config::{Config, Mode};
pub use runtime::cost::CostModel;
pub use runtime::memory::MemoryStats;
pub use runtime::{
    ActivityKind, ActivityRecord, CopyKind, DeviceProperties, EventHandle, HostMemoryStats, RawCopy, Runtime,
    StreamHandle,
};

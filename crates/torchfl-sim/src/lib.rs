//! `torchfl-sim`: the simulated accelerator, torch-fl's reference plugin.
//!
//! The simulator is the device every user and CI machine has, and the
//! plugin vendors read to learn the ABI, so it behaves like real hardware
//! where that matters to a host:
//!
//! - **Asynchronous streams** ([`stream`]): each stream is an in-order queue
//!   run by its own thread; kernels return before they run, errors inside
//!   queued work surface at the next synchronize, events carry timestamps.
//! - **Device memory** ([`memory`]): a per-device capacity with real
//!   out-of-memory errors and statistics, stream-ordered deallocation, and a
//!   strict mode whose tagged pointers crash any host code that touches
//!   device memory directly.
//! - **Kernels** ([`kernels`]): PyTorch semantics (type promotion,
//!   broadcasting, strides, in-place aliasing, error messages) over shared
//!   elementwise and reduction engines.
//!
//! The C ABI lives entirely in [`abi`] (the only module tree with
//! `extern "C"` code); everything else is a safe Rust API around
//! [`Runtime`], which tests and Rust hosts can instantiate directly, as many
//! times as they like. Warnings go to a [`Logger`] ([`log`]), the host's
//! `log` service when the ABI is used.
//!
//! Configuration: see [`config`] (`TORCH_FL_SIM_DEVICES`, `_MEMORY`,
//! `_MODE`, `_STRICT`, the cost model's `_COST_MODEL` and friends, or the
//! same keys in `TFL_InitArgs.options`); the cost model is in [`cost`].

pub mod abi;
pub mod collectives;
pub mod config;
pub mod cost;
pub mod error;
pub mod kernels;
pub mod log;
pub mod memory;
pub(crate) mod queue;
pub mod runtime;
pub(crate) mod small;
pub(crate) mod stream;
pub(crate) mod work;

pub use abi::torch_fl_plugin_get_api;
pub use config::{Config, Mode};
pub use cost::CostModel;
pub use error::{Error, ErrorCode, Result};
pub use kernels::{Arg, Call, DType, OutputMeta, Rng, Scalar, TensorArg, TensorData};
pub use log::{LogLevel, Logger};
pub use memory::MemoryStats;
pub use runtime::{CopyKind, DeviceProperties, EventHandle, HostMemoryStats, RawCopy, Runtime, StreamHandle};

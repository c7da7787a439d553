//! torch-fl core: finds, loads, checks and routes to accelerator plugins.
//!
//! No PyTorch here: a vendor can load and verify a plugin with this crate
//! (and the `torchfl-abi` tool built on it) alone.
//!
//! - [`discovery`]: which file serves a device name;
//! - [`loader`]: loading, stage by stage: the file, `dlopen`, handshake,
//!   tables (`open`, private); [`init`]: initialization, devices, default
//!   streams;
//! - [`validate`]: every check of a plugin's declared data, refusal or
//!   warning; [`schema`]: custom-operator schemas, parsed without PyTorch;
//! - [`version`]: the ABI version rule;
//! - [`plugin`]: a loaded plugin and safe handles to its memory, streams
//!   and events;
//! - [`call`]: calling a kernel safely from Rust;
//! - [`collectives`]: communicators and collectives (ABI 1.3);
//! - [`graphs`]: native device graphs (ABI 1.7);
//! - [`activity`]: activity records and ranges (ABI 1.8);
//! - [`registry`]: which plugin serves each operator;
//! - [`device`]: the process' custom device name and the plugins bound to it;
//! - [`error`]: the one error type;
//! - [`fork`]: refusing plugin calls in a child forked after initialization;
//! - [`inflight`]: which plugin call each thread is in, named when a plugin
//!   crashes the process; [`watch`]: loading on a thread a caller can stop
//!   waiting for (`TORCH_FL_INIT_TIMEOUT`);
//! - `ffi` (private): every raw call across the plugin boundary;
//! - `types` (private): the plain values the others speak of (identity,
//!   capabilities, kernels, devices, stages, warnings), re-exported from
//!   [`plugin`], [`validate`] and here.
//!
//! The modules form one-way layers, each using only those below it (no
//! import cycles; `make lint` checks it), from the bottom: the plain
//! values (`types`, [`version`], [`schema`], [`log`], [`inflight`]),
//! [`error`], `ffi`, [`fork`] and `file`, [`validate`], `open`, [`plugin`],
//! [`init`], [`loader`], then everything that uses a loaded plugin.
//!
//! ```no_run
//! use torchfl_core::{load, LoadOptions};
//! let plugin = load("libtorchfl_sim.so".as_ref(), &LoadOptions::default())?;
//! println!("{} implements {} ops on {} devices", plugin.name(), plugin.ops().len(), plugin.device_count());
//! # Ok::<(), torchfl_core::Error>(())
//! ```
#![warn(missing_docs)]

pub mod activity;
pub mod call;
pub mod collectives;
pub mod device;
pub mod discovery;
pub mod error;
mod ffi;
mod file;
pub mod fork;
pub mod graphs;
pub mod inflight;
pub mod init;
pub mod loader;
pub mod log;
mod open;
pub mod plugin;
pub mod registry;
pub mod schema;
mod types;
pub mod validate;
pub mod version;
pub mod watch;

pub use activity::{ActivityKind, ActivityRecord, Drained};
pub use call::{Arg, ScalarArg, TensorArg};
pub use collectives::{collective_dtype, Collectives, CommConfig, Communicator, ReduceOp, UniqueId};
pub use device::{bind, bound_device, BindReport, DeviceBinding};
pub use discovery::{Discovery, Origin, PLUGIN_PATH_ENV};
pub use error::{Error, PluginPart, PluginStatus, Result, StatusCode};
pub use graphs::{Capture, Graph, GraphExec};
pub use loader::{load, load_preloaded, loaded_plugins, LoadOptions, Opening, PluginLibrary};
pub use plugin::{
    Capabilities, DeviceBuffer, DeviceProperties, Event, MemoryStats, OpKernel, Plugin, PluginInfo, Stream,
};
pub use registry::{OpRegistry, Registration};
pub use validate::{Finding, Stage, WarningKind};
pub use version::{AbiVersion, Negotiated};

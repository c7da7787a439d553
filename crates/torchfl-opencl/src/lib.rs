//! `torchfl-opencl`: a torch-fl plugin over OpenCL, written as a vendor
//! would write one over a runtime it did not design.
//!
//! One plugin serves any OpenCL 1.2+ device: PoCL on the CPU here and in
//! CI, Intel, AMD or Arm GPUs elsewhere. It opens `libOpenCL` at run time
//! ([`cl`]), so it loads everywhere and says what to install where no
//! driver is.
//!
//! - [`runtime`]: the device runtime. Device memory is `cl_mem` buffers,
//!   which the host cannot address and which have no addresses at all; the
//!   [`address_map`] gives each one a reserved, inaccessible range of
//!   addresses, so the ABI's device pointers (and the host's arithmetic on
//!   them) work unchanged. Streams are in-order queues, events are markers
//!   with profiling timestamps.
//! - [`kernels`]: operators in OpenCL C, built at first use and cached per
//!   device and build options; strided and broadcast operands are indexed
//!   through their strides.
//! - `activity` (private): activity records (ABI 1.8): the CL calls each
//!   operation made, its kernels, copies and fills on the device's
//!   profiling clock, waits, program builds and user ranges.
//! - `abi` (private): the C ABI, the only module with `extern "C"` entries.
//!
//! Options (`TFL_InitArgs.options` or the environment): `platform=<index>`
//! (`TORCH_FL_OPENCL_PLATFORM`) picks the OpenCL platform, by default the
//! first with a device; `TORCH_FL_OPENCL_LIBRARY` names the OpenCL library
//! to open.
#![warn(missing_docs)]

mod abi;
mod activity;
pub mod address_map;
pub mod cl;
pub mod error;
pub mod kernels;
pub mod runtime;

pub use abi::torch_fl_plugin_get_api;
pub use error::{Error, Result};
pub use runtime::Runtime;

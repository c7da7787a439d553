//! `torch_fl._native.Communicator` and `current_stream_handle`: the
//! plugin's collectives (ABI 1.3) for the process-group backend.
//!
//! Buffers are raw device pointers (`tensor.data_ptr()`) and streams raw
//! `TFL_Stream*` values, as the backend has them; 0 names the device's
//! default stream. Every call releases the GIL while the plugin runs, so a
//! rank blocked in a collective never stops the other Python threads (a
//! watchdog calling `abort`, say).

use std::ffi::c_void;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use torchfl_core::{collective_dtype, CommConfig, Communicator, Error, ReduceOp, UniqueId};
use torchfl_ffi::{
    TFL_DType, TFL_Stream, TFL_DTYPE_TORCH_NAMES, TFL_REDUCE_OP_TORCH_NAMES, TFL_UNIQUE_ID_BYTES,
};

use crate::error::{to_py, IntoPyResult};
use crate::plugin::PyPlugin;

/// The element type of a dtype code (`torch_fl._native.DTYPES`), if the
/// collectives take it.
fn dtype(code: u32) -> PyResult<TFL_DType> {
    let d = TFL_DType::from_code(code);
    match d {
        Some(d) if collective_dtype(d) => Ok(d),
        _ => {
            let name =
                d.and_then(TFL_DType::torch_name).map_or_else(|| format!("code {code:#x}"), str::to_owned);
            let supported: Vec<&str> =
                TFL_DTYPE_TORCH_NAMES.iter().filter(|(d, _)| collective_dtype(*d)).map(|(_, n)| *n).collect();
            Err(PyValueError::new_err(format!(
                "collectives do not support dtype {name}: use {} or {} (torch_fl._native.DTYPES codes)",
                supported[..supported.len() - 1].join(", "),
                supported[supported.len() - 1]
            )))
        }
    }
}

/// The operator of a `TFL_ReduceOp` value (`torch_fl._native.REDUCE_OPS`).
fn reduce_op(code: i32) -> PyResult<ReduceOp> {
    ReduceOp::from_raw(code).ok_or_else(|| {
        let names: Vec<String> =
            TFL_REDUCE_OP_TORCH_NAMES.iter().map(|(v, n)| format!("{n} ({v})")).collect();
        PyValueError::new_err(format!(
            "unknown reduction {code}: use one of torch_fl._native.REDUCE_OPS: {}",
            names.join(", ")
        ))
    })
}

/// Adds the communicator, `current_stream_handle` and the code tables
/// `DTYPES` (torch's dtype name -> [`TFL_DType::to_code`]) and `REDUCE_OPS`
/// (`torch.distributed.ReduceOp` name -> `TFL_ReduceOp`) to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Dicts in table order, which messages listing them keep.
    let dtypes = PyDict::new(m.py());
    for (d, name) in TFL_DTYPE_TORCH_NAMES {
        dtypes.set_item(name, d.to_code())?;
    }
    let ops = PyDict::new(m.py());
    for (value, name) in TFL_REDUCE_OP_TORCH_NAMES {
        ops.set_item(name, value)?;
    }
    m.add("DTYPES", dtypes)?;
    m.add("REDUCE_OPS", ops)?;
    m.add_class::<PyCommunicator>()?;
    m.add_function(wrap_pyfunction!(current_stream_handle, m)?)?;
    Ok(())
}

/// A communicator's settings from the constructor's keywords.
fn comm_config(timeout_s: Option<f64>, blocking: bool) -> PyResult<CommConfig> {
    let timeout = match timeout_s {
        None => None,
        Some(t) => Some(std::time::Duration::try_from_secs_f64(t).map_err(|_| {
            PyValueError::new_err(format!("timeout_s must be a finite number of seconds >= 0, got {t}"))
        })?),
    };
    Ok(CommConfig { timeout, blocking })
}

/// This process' member of a group of ranks on one device of a plugin.
#[pyclass(frozen, name = "Communicator", module = "torch_fl._native")]
pub(crate) struct PyCommunicator {
    inner: Communicator,
}

impl PyCommunicator {
    /// The stream to enqueue on: `stream`, or the device's default for 0.
    fn stream(&self, py: Python<'_>, stream: usize) -> PyResult<usize> {
        if stream != 0 {
            return Ok(stream);
        }
        let device = self.inner.device();
        Ok(self.inner.plugin().default_stream(device).py_err(py)?.raw() as usize)
    }

    /// Runs `f` (one plugin call) without the GIL.
    fn call(
        &self,
        py: Python<'_>,
        stream: usize,
        f: impl FnOnce(&Communicator, *mut TFL_Stream) -> torchfl_core::Result<()> + Send,
    ) -> PyResult<()> {
        let stream = self.stream(py, stream)?;
        let comm = &self.inner;
        py.detach(move || f(comm, stream as *mut TFL_Stream)).py_err(py)
    }
}

/// An argument of a collective as Python passes it (`Py`, an `int`),
/// checked into a value that may cross threads (`Checked`), then turned
/// into the core's type on the thread that calls the plugin.
trait PyArg: Sized {
    type Py;
    type Checked: Send;
    fn check(value: Self::Py) -> PyResult<Self::Checked>;
    fn into_core(checked: Self::Checked) -> Self;
}

macro_rules! py_arg_as_is {
    ($($t:ty),*) => {$(
        impl PyArg for $t {
            type Py = $t;
            type Checked = $t;
            fn check(value: $t) -> PyResult<$t> {
                Ok(value)
            }
            fn into_core(checked: $t) -> $t {
                checked
            }
        }
    )*};
}
py_arg_as_is!(usize, i32);

/// Device pointers arrive from Python as integers (`Tensor.data_ptr()`),
/// as the core's contract takes them: the plugin checks them against its
/// allocations (see the core's `collectives` module).
macro_rules! py_arg_address {
    ($($t:ty),*) => {$(
        impl PyArg for $t {
            type Py = usize;
            type Checked = usize;
            fn check(value: usize) -> PyResult<usize> {
                Ok(value)
            }
            fn into_core(checked: usize) -> Self {
                checked as Self
            }
        }
    )*};
}
py_arg_address!(*const c_void, *mut c_void);

impl PyArg for TFL_DType {
    type Py = u32;
    type Checked = TFL_DType;
    fn check(code: u32) -> PyResult<TFL_DType> {
        dtype(code)
    }
    fn into_core(checked: TFL_DType) -> Self {
        checked
    }
}

impl PyArg for ReduceOp {
    type Py = i32;
    type Checked = ReduceOp;
    fn check(code: i32) -> PyResult<ReduceOp> {
        reduce_op(code)
    }
    fn into_core(checked: ReduceOp) -> Self {
        checked
    }
}

/// Expands `torchfl_core::for_each_collective!` into the class's methods:
/// the collectives, then the hand-written ones passed in brackets.
macro_rules! py_communicator_methods {
    ([$($methods:tt)*] $({
        name: $name:ident,
        doc: $doc:literal,
        safety: $safety:literal,
        args: ($($arg:ident : $ty:ty),* $(,)?),
        checks: $checks:tt,
    })*) => {
        // The methods mirror NCCL's signatures (plus `py`).
        #[allow(clippy::too_many_arguments)]
        #[pymethods]
        impl PyCommunicator {
            $(
                #[doc = $doc]
                fn $name(&self, py: Python<'_>, $($arg: <$ty as PyArg>::Py,)* stream: usize) -> PyResult<()> {
                    $(let $arg = <$ty as PyArg>::check($arg)?;)*
                    // SAFETY: the backend passes live device tensors' data
                    // pointers of this device, kept alive until the stream
                    // ran the operation (the contract documented on the
                    // Python method); the core checks the rest.
                    self.call(py, stream, move |c, s| unsafe {
                        c.$name($(<$ty as PyArg>::into_core($arg),)* s)
                    })
                }
            )*
            $($methods)*
        }
    };
}

torchfl_core::for_each_collective! {
    py_communicator_methods,
    /// Joins the group `unique_id` as `rank` of `world_size` on `device`;
    /// blocks (without the GIL) until every rank joined or the timeout.
    ///
    /// `timeout_s` (seconds; None or 0: the plugin's default) bounds the
    /// rendezvous and every later wait for a peer. `blocking=False` returns
    /// at once while joining completes in the background: operations wait
    /// for it, and a failure to join becomes the `async_error`. Both reach
    /// the plugin only when `Plugin.has_comm_config()` (ABI 1.5); otherwise
    /// creation blocks and the plugin uses its own timeout, so the caller
    /// enforces `timeout_s` itself (a watchdog calling `abort`).
    #[new]
    #[pyo3(signature = (plugin, unique_id, world_size, rank, device, timeout_s = None, blocking = true))]
    fn new(
        py: Python<'_>,
        plugin: &PyPlugin,
        unique_id: &[u8],
        world_size: i32,
        rank: i32,
        device: i32,
        timeout_s: Option<f64>,
        blocking: bool,
    ) -> PyResult<Self> {
        let config = comm_config(timeout_s, blocking)?;
        let id = UniqueId::from_bytes(unique_id).ok_or_else(|| {
            PyValueError::new_err(format!(
                "a unique id is {TFL_UNIQUE_ID_BYTES} bytes (from Plugin.collectives_unique_id), got {}",
                unique_id.len()
            ))
        })?;
        let coll = plugin.collectives(py)?;
        let comm = py.detach(|| coll.init_rank_with(&id, world_size, rank, device, &config)).py_err(py)?;
        Ok(Self { inner: comm })
    }

    #[getter]
    fn rank(&self) -> i32 {
        self.inner.rank()
    }
    #[getter]
    fn world_size(&self) -> i32 {
        self.inner.world_size()
    }
    #[getter]
    fn device(&self) -> i32 {
        self.inner.device()
    }

    /// Opens a group of operations (nestable).
    fn group_start(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.group_start().py_err(py)
    }

    /// Closes a group; the outermost one launches it.
    fn group_end(&self, py: Python<'_>) -> PyResult<()> {
        let comm = &self.inner;
        py.detach(|| comm.group_end()).py_err(py)
    }

    /// The communicator's first asynchronous failure, or None.
    fn async_error(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let comm = &self.inner;
        Ok(py.detach(|| comm.async_error()).py_err(py)?.map(|s| s.to_string()))
    }

    /// Fails waiting operations promptly; later ones raise. Any thread.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let comm = &self.inner;
        py.detach(|| comm.abort()).py_err(py)
    }

    /// Waits for queued operations and releases the communicator.
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        let comm = &self.inner;
        py.detach(|| comm.destroy()).py_err(py)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// The raw `TFL_Stream*` of PyTorch's current stream on `device` (what the
/// collectives enqueue on).
#[pyfunction]
fn current_stream_handle(py: Python<'_>, device: i32) -> PyResult<usize> {
    crate::shim::current_stream(device).map_err(|message| to_py(py, Error::TorchIntegration { message }))
}

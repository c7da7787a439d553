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
use torchfl_core::{CommConfig, Communicator, Error, ReduceOp, UniqueId};
use torchfl_ffi::{TFL_DType, TFL_Stream, TFL_UNIQUE_ID_BYTES};

use crate::error::{to_py, IntoPyResult};
use crate::plugin::PyPlugin;

/// The element type of a dtype named as torch names it (`"float32"`).
fn dtype(name: &str) -> PyResult<TFL_DType> {
    Ok(match name.strip_prefix("torch.").unwrap_or(name) {
        "float32" | "float" => TFL_DType::F32,
        "float64" | "double" => TFL_DType::F64,
        "float16" | "half" => TFL_DType::F16,
        "bfloat16" => TFL_DType::BF16,
        "int64" | "long" => TFL_DType::I64,
        "int32" | "int" => TFL_DType::I32,
        "int16" | "short" => TFL_DType::I16,
        "int8" => TFL_DType::I8,
        "uint8" => TFL_DType::U8,
        "bool" => TFL_DType::BOOL,
        other => {
            return Err(PyValueError::new_err(format!(
                "collectives do not support dtype {other:?}: use float32, float64, float16, bfloat16, int64, int32, \
                 int16, int8, uint8 or bool"
            )))
        }
    })
}

fn reduce_op(name: &str) -> PyResult<ReduceOp> {
    ReduceOp::parse(&name.to_ascii_lowercase()).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown reduction {name:?}: use \"sum\", \"prod\", \"min\", \"max\" or \"avg\""
        ))
    })
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

// The methods mirror NCCL's signatures (plus `py`).
#[allow(clippy::too_many_arguments)]
#[pymethods]
impl PyCommunicator {
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

    /// recv = op over ranks of send (`count` elements; in place when equal).
    fn all_reduce(
        &self,
        py: Python<'_>,
        send: usize,
        recv: usize,
        count: usize,
        dtype: &str,
        op: &str,
        stream: usize,
    ) -> PyResult<()> {
        let (d, o) = (self::dtype(dtype)?, reduce_op(op)?);
        // SAFETY: the backend passes live device tensors' data pointers of
        // this device, kept alive until the stream ran the operation (the
        // contract documented on the Python method).
        self.call(py, stream, |c, s| unsafe {
            c.all_reduce(send as *const c_void, recv as *mut c_void, count, d, o, s)
        })
    }

    /// recv = root's send on every rank.
    fn broadcast(
        &self,
        py: Python<'_>,
        send: usize,
        recv: usize,
        count: usize,
        dtype: &str,
        root: i32,
        stream: usize,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        // SAFETY: as in all_reduce.
        self.call(py, stream, |c, s| unsafe {
            c.broadcast(send as *const c_void, recv as *mut c_void, count, d, root, s)
        })
    }

    /// recv on root = op over ranks of send.
    fn reduce(
        &self,
        py: Python<'_>,
        send: usize,
        recv: usize,
        count: usize,
        dtype: &str,
        op: &str,
        root: i32,
        stream: usize,
    ) -> PyResult<()> {
        let (d, o) = (self::dtype(dtype)?, reduce_op(op)?);
        // SAFETY: as in all_reduce.
        self.call(py, stream, |c, s| unsafe {
            c.reduce(send as *const c_void, recv as *mut c_void, count, d, o, root, s)
        })
    }

    /// recv (world_size * send_count) = every rank's send, in rank order.
    fn all_gather(
        &self,
        py: Python<'_>,
        send: usize,
        recv: usize,
        send_count: usize,
        dtype: &str,
        stream: usize,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        // SAFETY: as in all_reduce.
        self.call(py, stream, |c, s| unsafe {
            c.all_gather(send as *const c_void, recv as *mut c_void, send_count, d, s)
        })
    }

    /// recv (recv_count) = this rank's block of op over ranks of send.
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        send: usize,
        recv: usize,
        recv_count: usize,
        dtype: &str,
        op: &str,
        stream: usize,
    ) -> PyResult<()> {
        let (d, o) = (self::dtype(dtype)?, reduce_op(op)?);
        // SAFETY: as in all_reduce.
        self.call(py, stream, |c, s| unsafe {
            c.reduce_scatter(send as *const c_void, recv as *mut c_void, recv_count, d, o, s)
        })
    }

    /// Block j of send to rank j, stored as block rank of its recv.
    fn all_to_all(
        &self,
        py: Python<'_>,
        send: usize,
        recv: usize,
        count_per_rank: usize,
        dtype: &str,
        stream: usize,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        // SAFETY: as in all_reduce.
        self.call(py, stream, |c, s| unsafe {
            c.all_to_all(send as *const c_void, recv as *mut c_void, count_per_rank, d, s)
        })
    }

    /// Sends `count` elements at `ptr` to `peer`.
    fn send(
        &self,
        py: Python<'_>,
        ptr: usize,
        count: usize,
        dtype: &str,
        peer: i32,
        stream: usize,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        // SAFETY: as in all_reduce.
        self.call(py, stream, |c, s| unsafe { c.send(ptr as *const c_void, count, d, peer, s) })
    }

    /// Receives `count` elements from `peer` into `ptr`.
    fn recv(
        &self,
        py: Python<'_>,
        ptr: usize,
        count: usize,
        dtype: &str,
        peer: i32,
        stream: usize,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        // SAFETY: as in all_reduce.
        self.call(py, stream, |c, s| unsafe { c.recv(ptr as *mut c_void, count, d, peer, s) })
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
pub(crate) fn current_stream_handle(py: Python<'_>, device: i32) -> PyResult<usize> {
    crate::shim::current_stream(device).map_err(|message| to_py(py, Error::TorchIntegration { message }))
}

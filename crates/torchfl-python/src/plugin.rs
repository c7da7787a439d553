//! `torch_fl._native.Plugin`: a loaded plugin as Python sees it.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use torchfl_core::{Collectives, Error, Plugin};

use crate::error::{to_py, IntoPyResult};

/// A loaded, initialized plugin: identity, ABI version, capabilities,
/// devices and operators. Returned inside `torch_fl.PluginHandle`.
#[pyclass(frozen, name = "Plugin", module = "torch_fl._native")]
pub(crate) struct PyPlugin {
    pub(crate) inner: Arc<Plugin>,
}

impl PyPlugin {
    /// The plugin's collectives; `UnimplementedError` when it has none.
    pub(crate) fn collectives(&self, py: Python<'_>) -> PyResult<Collectives<'_>> {
        self.inner.collectives().ok_or_else(|| {
            to_py(
                py,
                Error::Unimplemented {
                    plugin: self.inner.label().to_owned(),
                    what: "collectives (the plugin has no collectives table)".to_owned(),
                },
            )
        })
    }
}

#[pymethods]
impl PyPlugin {
    /// The plugin's short name (`TFL_PluginInfo.name`).
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }
    #[getter]
    fn vendor(&self) -> &str {
        &self.inner.info().vendor
    }
    #[getter]
    fn chip_family(&self) -> &str {
        &self.inner.info().chip_family
    }
    #[getter]
    fn plugin_version(&self) -> &str {
        &self.inner.info().plugin_version
    }
    #[getter]
    fn min_torch_version(&self) -> Option<&str> {
        self.inner.info().min_torch_version.as_deref()
    }
    /// How messages name the plugin: `'sim' (/path/libtorchfl_sim.so)`.
    #[getter]
    fn label(&self) -> &str {
        self.inner.label()
    }
    /// The file it was loaded from (None for the main program).
    #[getter]
    fn path(&self) -> Option<String> {
        self.inner.path().map(|p| p.display().to_string())
    }
    /// The ABI version the plugin implements, "1.0".
    #[getter]
    fn abi_version(&self) -> String {
        self.inner.abi().plugin.to_string()
    }
    /// The ABI version in use after negotiation.
    #[getter]
    fn abi_effective_version(&self) -> String {
        self.inner.abi().effective.to_string()
    }
    /// Capability names, e.g. ["host_addressable_memory", "async_streams"].
    #[getter]
    fn capabilities(&self) -> Vec<&'static str> {
        self.inner.capabilities().names()
    }
    #[getter]
    fn init_options(&self) -> &str {
        self.inner.init_options()
    }
    #[getter]
    fn device_count(&self) -> i32 {
        self.inner.device_count()
    }
    /// Operator names in op-table order.
    #[getter]
    fn ops(&self) -> Vec<String> {
        self.inner.ops().iter().map(|o| o.name.clone()).collect()
    }
    /// What loading warned about, as (stage, kind, message): operators left
    /// out, ATen operators the catalog lacks, devices reporting odd
    /// properties. `torchfl-abi verify` fails the stage's check on each.
    #[getter]
    fn warnings(&self) -> Vec<(&'static str, &'static str, String)> {
        self.inner
            .warnings()
            .iter()
            .map(|w| (w.stage.check_id(), w.kind.as_str(), w.message.clone()))
            .collect()
    }
    /// {operator: exported kernel symbol}.
    #[getter]
    fn op_symbols(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        let d = PyDict::new(py);
        for op in self.inner.ops() {
            d.set_item(&op.name, &op.symbol)?;
        }
        Ok(d.unbind())
    }

    /// Properties of device `index` as a dict (name, total_memory,
    /// compute_units, memory_alignment, capability_major, capability_minor).
    fn device_properties(&self, py: Python<'_>, index: i32) -> PyResult<Py<PyDict>> {
        let p = self.inner.device_properties(index).py_err(py)?;
        let d = PyDict::new(py);
        d.set_item("name", p.name)?;
        d.set_item("total_memory", p.total_memory)?;
        d.set_item("compute_units", p.compute_units)?;
        d.set_item("memory_alignment", p.memory_alignment)?;
        d.set_item("capability_major", p.capability.0)?;
        d.set_item("capability_minor", p.capability.1)?;
        Ok(d.unbind())
    }

    /// The plugin's memory statistics for device `index` as a dict.
    fn memory_stats(&self, py: Python<'_>, index: i32) -> PyResult<Py<PyDict>> {
        let s = self.inner.memory_stats(index).py_err(py)?;
        let d = PyDict::new(py);
        for (key, value) in s.counters() {
            d.set_item(key, value)?;
        }
        Ok(d.unbind())
    }

    /// Whether the plugin offers collectives (ABI 1.3): the process-group
    /// backend then uses them instead of staging through host memory.
    fn has_collectives(&self) -> bool {
        self.inner.has_collectives()
    }

    /// Whether the plugin's collectives take communicator settings (ABI
    /// 1.5): `Communicator(timeout_s=..., blocking=...)` then reaches the
    /// plugin; otherwise creation blocks and the plugin keeps its own
    /// timeout.
    fn has_comm_config(&self) -> bool {
        self.inner.has_comm_config()
    }

    /// A unique id for a new group of ranks (opaque bytes that rank 0
    /// shares through the rendezvous store); UnimplementedError without
    /// collectives.
    fn collectives_unique_id(&self, py: Python<'_>) -> PyResult<Py<PyBytes>> {
        let coll = self.collectives(py)?;
        let id = py.detach(|| coll.unique_id()).py_err(py)?;
        Ok(PyBytes::new(py, &id.0).unbind())
    }

    /// Waits for all work on device `index`.
    fn synchronize(&self, py: Python<'_>, index: i32) -> PyResult<()> {
        let plugin = Arc::clone(&self.inner);
        py.detach(move || plugin.synchronize(index)).py_err(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "<torch_fl plugin '{}' {} by {}, ABI {}, {} device(s), {} ops>",
            self.inner.name(),
            self.inner.info().plugin_version,
            self.inner.info().vendor,
            self.inner.abi().plugin,
            self.inner.device_count(),
            self.inner.ops().len()
        )
    }
}

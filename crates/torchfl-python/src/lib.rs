//! `torch_fl._native`: torch-fl's Rust core as a Python extension module.
//!
//! It does not link PyTorch. The Python package (`python/torch_fl`) imports
//! torch, loads the C++ shim through [`load_shim`], and uses this module to
//! find, load and check plugins, bind them to the device name, and hand the
//! winning kernels to the shim.
//!
//! - `error`: core errors to `torch_fl.errors` classes (one exhaustive map);
//! - `plugin`: the `Plugin` class;
//! - `shim`: the C++ shim's C interface (the only FFI here).

mod collectives;
mod error;
mod plugin;
mod shim;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use torchfl_core::device::{self, check_metadata, check_torch_version, validate_device_name};
use torchfl_core::{AbiVersion, Discovery, Error, LoadOptions};

use crate::error::{to_py, IntoPyResult};
use crate::plugin::PyPlugin;

fn options(init_options: &str) -> LoadOptions {
    LoadOptions { init_options: init_options.to_owned(), ..Default::default() }
}

/// Runs `work` (loading plugins) on a `torchfl-load` thread and waits for
/// it without holding the GIL, checking for signals (Ctrl-C raises
/// `KeyboardInterrupt`) every 50 ms and giving up after
/// `TORCH_FL_INIT_TIMEOUT` (see `torchfl_core::watch`).
fn load_watched<T, F>(py: Python<'_>, what: &str, work: F) -> PyResult<T>
where
    T: Send + 'static,
    F: FnOnce() -> torchfl_core::Result<T> + Send + 'static,
{
    let limit = torchfl_core::watch::init_timeout().py_err(py)?;
    let job = torchfl_core::watch::spawn(what, work).py_err(py)?;
    let slice = std::time::Duration::from_millis(50);
    job.wait_with(limit, slice, |job, slice| py.detach(|| job.wait(slice)), || py.check_signals())?.py_err(py)
}

/// Loads, validates and initializes the plugin at `path`.
#[pyfunction]
#[pyo3(signature = (path, init_options = ""))]
fn load_plugin(py: Python<'_>, path: PathBuf, init_options: &str) -> PyResult<PyPlugin> {
    let opts = options(init_options);
    let what = path.display().to_string();
    let plugin = load_watched(py, &what, move || torchfl_core::load(&path, &opts))?;
    Ok(PyPlugin { inner: plugin })
}

/// Finds the plugin named `name`: TORCH_FL_PLUGIN_PATH, then libraries
/// already loaded in the process, then `candidates` ((name, path,
/// description, options): plugin packages, the bundled simulated plugin;
/// non-empty options replace `init_options` for that candidate). Returns the
/// plugin and a description of where it was found.
#[pyfunction]
#[pyo3(signature = (name, init_options = "", candidates = Vec::new()))]
fn find_plugin(
    py: Python<'_>,
    name: String,
    init_options: &str,
    candidates: Vec<(String, PathBuf, String, String)>,
) -> PyResult<(PyPlugin, String)> {
    let opts = options(init_options);
    let what = format!("the plugin for device '{name}'");
    let (plugin, origin) = load_watched(py, &what, move || {
        let mut discovery = Discovery::from_env();
        for (candidate, path, description, options) in candidates {
            if options.is_empty() {
                discovery.add_candidate(&candidate, path, &description);
            } else {
                discovery.add_candidate_with_options(&candidate, path, &description, &options);
            }
        }
        discovery.find(&name, &opts).map(|(plugin, origin)| (plugin, origin.to_string()))
    })?;
    Ok((PyPlugin { inner: plugin }, origin))
}

/// Opens and validates the plugin at `path` without initializing it (its
/// library is loaded, its identity and op table are read): a dict with
/// `name`, `vendor`, `chip_family`, `plugin_version`, `min_torch_version`,
/// `abi_version` (the plugin's), `ops` (operator count), `initialized`
/// ("yes" when this process already initialized it). Raises the load error
/// otherwise. `torch_fl.list_plugins()` is built on it.
#[pyfunction]
fn probe_plugin(py: Python<'_>, path: PathBuf) -> PyResult<HashMap<String, String>> {
    let what = path.display().to_string();
    let library =
        load_watched(py, &what, move || torchfl_core::PluginLibrary::open(&path, &LoadOptions::default()))?;
    let info = library.info();
    let initialized = torchfl_core::loaded_plugins().iter().any(|p| p.label() == library.label());
    Ok(HashMap::from([
        ("name".to_owned(), info.name.clone()),
        ("vendor".to_owned(), info.vendor.clone()),
        ("chip_family".to_owned(), info.chip_family.clone()),
        ("plugin_version".to_owned(), info.plugin_version.clone()),
        ("min_torch_version".to_owned(), info.min_torch_version.clone().unwrap_or_default()),
        ("abi_version".to_owned(), library.abi().plugin.to_string()),
        ("ops".to_owned(), library.ops().len().to_string()),
        ("initialized".to_owned(), if initialized { "yes" } else { "no" }.to_owned()),
    ]))
}

/// How many devices the plugin at `path` would find with `options`, asked
/// without initializing it (ABI 1.6 `probe_devices`: the vendor runtime's
/// enumeration only): `None` when the plugin does not offer the entry, so
/// only initializing could tell. Raises the plugin's error (a missing
/// driver, say) or the load error. Autoload chooses among installed plugin
/// packages with it.
#[pyfunction]
#[pyo3(signature = (path, options = ""))]
fn probe_devices(py: Python<'_>, path: PathBuf, options: &str) -> PyResult<Option<usize>> {
    let what = path.display().to_string();
    let options = options.to_owned();
    load_watched(py, &what, move || {
        torchfl_core::PluginLibrary::open(&path, &LoadOptions::default())?.probe_devices(&options)
    })
}

/// The files `TORCH_FL_PLUGIN_PATH` contributes, in search order.
#[pyfunction]
fn plugin_path_files() -> Vec<String> {
    Discovery::from_env().plugin_path_files().iter().map(|p| p.display().to_string()).collect()
}

/// Takes the C++ shim's table from `capsule` (`torch_fl._C._shim_interface`,
/// once per process) and returns the PyTorch version the shim was built
/// against.
#[pyfunction]
fn attach_shim(capsule: &Bound<'_, PyAny>) -> PyResult<String> {
    let table = capsule
        .cast::<PyCapsule>()
        .ok()
        .and_then(|c| c.pointer_checked(Some(shim::CAPSULE_NAME)).ok())
        .ok_or_else(|| {
            PyRuntimeError::new_err(
                "not the torch-fl shim's capsule (torch_fl._C._shim_interface): reinstall torch-fl",
            )
        })?;
    // SAFETY: a capsule of this name is made only by the shim's module
    // (cpp_shim/src/module.cpp), around its static table.
    unsafe { shim::attach(table.as_ptr().cast()) }.map_err(PyRuntimeError::new_err)
}

/// Every field of the structs of the shim interface, as (struct, field,
/// offset, size): Rust's view, for the layout test.
#[pyfunction]
fn shim_layout() -> Vec<(&'static str, &'static str, usize, usize)> {
    shim::layout()
}

/// Binds `plugin` to the device `name` at `priority` and registers the
/// kernels that now serve it with PyTorch. Checks the plugin's
/// `min_torch_version` against `torch_version` and `metadata` against what
/// the plugin reports, first. Returns `(created, [(op, outcome), ...])`
/// where outcome is "registered", "registered_as_out", "skipped_*",
/// "deferred" (another library's operator, bound once that library defines
/// it), "unknown_op: <message>" (an ATen operator this PyTorch lacks) or
/// "refused: <message>" (PyTorch refused the registration).
#[pyfunction]
#[pyo3(signature = (name, plugin, priority, torch_version, metadata = None))]
fn bind_device(
    py: Python<'_>,
    name: &str,
    plugin: &PyPlugin,
    priority: i32,
    torch_version: &str,
    metadata: Option<HashMap<String, String>>,
) -> PyResult<(bool, Vec<(String, String)>)> {
    let p = &plugin.inner;
    torchfl_core::fork::check_not_forked(&format!("register the device '{name}'")).py_err(py)?;
    check_device_name(py, name)?;
    check_torch_version(p, torch_version).py_err(py)?;
    if let Some(metadata) = &metadata {
        check_metadata(p, metadata.iter().map(|(k, v)| (k.as_str(), v.as_str()))).py_err(py)?;
    }
    if device::bound_device().is_none() {
        // The shim gets the runtime before any kernel, so the first
        // registered kernel can already allocate.
        shim::attach_device(name, p).map_err(|message| to_py(py, Error::TorchIntegration { message }))?;
    }
    let report = device::bind(name, p, priority).py_err(py)?;
    let runtime = Arc::clone(report.device.runtime());
    let mut outcomes = Vec::with_capacity(report.changed.len());
    // "2.14.1+cu130" -> "2.14.1", as the core's operator catalog names it.
    let release = torch_version.split('+').next().unwrap_or(torch_version);
    for registration in &report.changed {
        let name = &registration.kernel.name;
        let outcome = match shim::register_kernel(registration, &runtime) {
            Ok(outcome) => outcome.as_str().to_owned(),
            // An operator this PyTorch does not have (a newer op, a typo in
            // a vendor table) is reported, not fatal: the rest still works.
            // The words are the core's, as `torchfl-abi verify` says them.
            Err((shim::ERROR_UNKNOWN_OP, _)) if !name.contains("::") => {
                format!("unknown_op: {}", torchfl_core::validate::unknown_aten_operator(name, release))
            }
            Err((_, message)) if registration.kernel.schema.is_some() => format!(
                "refused: custom operator '{name}' is not registered: PyTorch {release} refused it: {message}"
            ),
            Err((_, message)) => {
                format!(
                    "refused: operator '{name}' is not registered: PyTorch {release} refused it: {message}"
                )
            }
        };
        outcomes.push((name.clone(), outcome));
    }
    outcomes.sort();
    Ok((report.created, outcomes))
}

/// Registers `plugin`'s kernel `reference` for the operator `op_name`
/// (`torch_fl.register_operator`): `reference` is an op-table entry
/// (`"sim::fused_bias_gelu"`), its exported symbol, or another symbol the
/// plugin's library exports with the kernel signature. An operator outside
/// `aten` is defined from `schema` first when PyTorch does not know it.
/// Returns the registration outcome ("registered", ...).
#[pyfunction]
#[pyo3(signature = (plugin, op_name, reference, schema=None))]
fn register_op_kernel(
    py: Python<'_>,
    plugin: &PyPlugin,
    op_name: &str,
    reference: &str,
    schema: Option<String>,
) -> PyResult<String> {
    torchfl_core::fork::check_not_forked(&format!("register the operator '{op_name}'")).py_err(py)?;
    let device = device::bound_device().ok_or_else(|| {
        to_py(
            py,
            Error::TorchIntegration {
                message: format!(
                    "cannot register operator '{op_name}': no device is registered yet; call \
                     torch_fl.register_device_plugin first"
                ),
            },
        )
    })?;
    let mut kernel = plugin.inner.find_kernel(op_name, reference).py_err(py)?;
    if schema.is_some() {
        kernel.schema = schema;
    }
    let registration =
        torchfl_core::Registration { plugin: Arc::clone(&plugin.inner), priority: 0, order: 0, kernel };
    let outcome = shim::register_kernel(&registration, device.runtime())
        .map_err(|(_, message)| to_py(py, Error::TorchIntegration { message }))?;
    Ok(outcome.as_str().to_owned())
}

/// Raises unless `name` can be registered in this process: a valid name,
/// and the same name as any device registered before.
#[pyfunction]
fn check_device_name(py: Python<'_>, name: &str) -> PyResult<()> {
    validate_device_name(name).py_err(py)?;
    match device::bound_device() {
        Some(existing) if existing.name() != name => Err(to_py(
            py,
            Error::DeviceNameConflict { existing: existing.name().to_owned(), requested: name.to_owned() },
        )),
        _ => Ok(()),
    }
}

/// Whether this process was forked from one that had initialized a plugin
/// (`torch.<name>._is_in_bad_fork()`): it must not use any plugin.
#[pyfunction]
fn in_bad_fork() -> bool {
    torchfl_core::fork::in_bad_fork()
}

/// Whether a plugin is initialized and usable in this process
/// (`torch.<name>.is_initialized()`): false in a bad fork.
#[pyfunction]
fn plugin_initialized() -> bool {
    torchfl_core::fork::initialized()
}

/// Raises `torch_fl.BadForkError` saying that `operation` is refused when
/// this process is in a bad fork; otherwise does nothing.
#[pyfunction]
fn check_not_forked(py: Python<'_>, operation: &str) -> PyResult<()> {
    torchfl_core::fork::check_not_forked(operation).py_err(py)
}

/// The bound device's name, or None.
#[pyfunction]
fn bound_device_name() -> Option<String> {
    device::bound_device().map(|d| d.name().to_owned())
}

/// The plugin providing the bound device's runtime, or None.
#[pyfunction]
fn bound_runtime() -> Option<PyPlugin> {
    device::bound_device().map(|d| PyPlugin { inner: Arc::clone(d.runtime()) })
}

/// The plugins bound to the device in registration order, the runtime
/// plugin first; empty before the first registration. The core's registry
/// is the one record of them: Python keeps no list of its own.
#[pyfunction]
fn bound_plugins() -> Vec<PyPlugin> {
    let Some(d) = device::bound_device() else { return Vec::new() };
    d.registry().plugins().into_iter().map(|inner| PyPlugin { inner }).collect()
}

/// {operator: name of the plugin serving it} for the bound device.
#[pyfunction]
fn served_ops() -> HashMap<String, String> {
    let Some(d) = device::bound_device() else { return HashMap::new() };
    d.registry().ops().into_iter().filter_map(|op| d.registry().served_by(&op).map(|p| (op, p))).collect()
}

/// The kernel symbol a plugin exports for `op` ("add_.Tensor" ->
/// "torch_fl_op_add__Tensor").
#[pyfunction]
fn kernel_symbol(op: &str) -> PyResult<String> {
    torchfl_ffi::kernel_symbol(op).map_err(PyValueError::new_err)
}

/// Checks `schema` as the schema of custom operator `op_name` the way
/// loading a plugin's op table does (no PyTorch involved): None when it
/// passes, else why registration would leave the operator out.
#[pyfunction]
#[pyo3(signature = (op_name, schema, has_infer_outputs = false))]
fn check_custom_schema(op_name: &str, schema: &str, has_infer_outputs: bool) -> Option<String> {
    torchfl_core::validate::check_custom_schema(op_name, schema, has_infer_outputs).err()
}

/// Runs the `torchfl-abi` command with `argv` (program name first) and
/// returns its exit code.
#[pyfunction]
fn abi_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(move || torchfl_abi::run(argv))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ABI_VERSION", AbiVersion::HOST.to_string())?;
    m.add("METADATA_KEYS", pyo3::types::PyTuple::new(m.py(), device::METADATA_KEYS)?)?;
    // Set by build.rs when the shim was built into the package.
    m.add("BUILT_TORCH_VERSION", option_env!("TORCHFL_BUILT_TORCH_VERSION"))?;
    m.add("SHIM_INTERFACE_VERSION", shim::INTERFACE_VERSION)?;
    m.add_class::<PyPlugin>()?;
    collectives::register(m)?;
    m.add_function(wrap_pyfunction!(load_plugin, m)?)?;
    m.add_function(wrap_pyfunction!(find_plugin, m)?)?;
    m.add_function(wrap_pyfunction!(probe_plugin, m)?)?;
    m.add_function(wrap_pyfunction!(probe_devices, m)?)?;
    m.add_function(wrap_pyfunction!(plugin_path_files, m)?)?;
    m.add_function(wrap_pyfunction!(attach_shim, m)?)?;
    m.add_function(wrap_pyfunction!(shim_layout, m)?)?;
    m.add_function(wrap_pyfunction!(bind_device, m)?)?;
    m.add_function(wrap_pyfunction!(check_device_name, m)?)?;
    m.add_function(wrap_pyfunction!(register_op_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(in_bad_fork, m)?)?;
    m.add_function(wrap_pyfunction!(plugin_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(check_not_forked, m)?)?;
    m.add_function(wrap_pyfunction!(bound_device_name, m)?)?;
    m.add_function(wrap_pyfunction!(bound_runtime, m)?)?;
    m.add_function(wrap_pyfunction!(bound_plugins, m)?)?;
    m.add_function(wrap_pyfunction!(served_ops, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_symbol, m)?)?;
    m.add_function(wrap_pyfunction!(abi_main, m)?)?;
    m.add_function(wrap_pyfunction!(check_custom_schema, m)?)?;
    Ok(())
}

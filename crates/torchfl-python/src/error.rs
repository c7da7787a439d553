//! The one mapping from the core's errors to Python exception classes.
//!
//! The classes live in `torch_fl/errors.py` (so they can also derive from
//! builtin and torch exception types); this match names the class for each
//! variant. It is exhaustive on purpose: a new core variant does not
//! compile until it has a Python class.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use torchfl_core::Error;

/// The Python class name for each error variant.
pub(crate) fn class_name(e: &Error) -> &'static str {
    match e {
        Error::PluginNotFound { .. } => "PluginNotFoundError",
        Error::FileNotFound { .. } => "PluginFileNotFoundError",
        Error::InsecurePermissions { .. } => "InsecurePluginError",
        Error::NotASharedLibrary { .. } => "NotASharedLibraryError",
        Error::WrongArchitecture { .. } => "WrongArchitectureError",
        Error::MissingBootstrapSymbol { .. } => "MissingBootstrapSymbolError",
        Error::AbiMismatch { .. } => "AbiVersionError",
        Error::InvalidPlugin { .. } => "InvalidPluginError",
        Error::MissingRequiredEntry { .. } => "MissingRequiredEntryError",
        Error::KernelSymbol { .. } => "KernelSymbolError",
        Error::InitFailed { .. } => "PluginInitError",
        Error::AlreadyInitialized { .. } => "AlreadyInitializedError",
        Error::InvalidDevice { .. } => "InvalidDeviceError",
        Error::OutOfMemory { .. } => "OutOfMemoryError",
        Error::Unimplemented { .. } => "UnimplementedError",
        Error::RuntimeCall { .. } => "PluginRuntimeError",
        Error::Kernel { .. } => "KernelError",
        Error::OperatorNotFound { .. } => "OperatorNotFoundError",
        Error::InvalidCall { .. } => "InvalidCallError",
        Error::InvalidDeviceName { .. } => "InvalidDeviceNameError",
        Error::DeviceNameConflict { .. } => "DeviceNameConflictError",
        Error::IncompatiblePlugin { .. } => "IncompatiblePluginError",
        Error::MetadataMismatch { .. } => "MetadataMismatchError",
        Error::TorchTooOld { .. } => "TorchVersionError",
        Error::TorchIntegration { .. } => "TorchIntegrationError",
        Error::BadFork { .. } => "BadForkError",
        Error::InitTimeout { .. } => "PluginInitTimeoutError",
        Error::InvalidSetting { .. } => "InvalidSettingError",
    }
}

/// Converts a core error into an instance of its `torch_fl.errors` class.
pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let message = e.to_string();
    let class = py
        .import("torch_fl.errors")
        .and_then(|m| m.getattr(class_name(&e)))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match class {
        Ok(class) => PyErr::from_type(class, message),
        // The errors module is part of the package; if it cannot be
        // imported, still raise something that carries the message.
        Err(import_error) => {
            let err = PyRuntimeError::new_err(message);
            err.set_cause(py, Some(import_error));
            err
        }
    }
}

/// `Result<T, Error>` to `PyResult<T>`.
pub(crate) trait IntoPyResult<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}

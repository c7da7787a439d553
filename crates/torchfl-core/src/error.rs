//! The one error type of torch-fl.
//!
//! Every failure a user or a vendor can meet is a variant here, and every
//! message names what failed (plugin, file, operator or device) and says what
//! to do next. The Python binding maps each variant to its own exception
//! class under `torch_fl.TorchFLError`; the variant names are that mapping's
//! keys, so renaming one is a user-visible change.

use std::fmt;
use std::path::PathBuf;

use crate::types::Stage;
use crate::version::AbiVersion;

/// `Result` with torch-fl's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The status codes a plugin can return (`TFL_ErrorCode`), with unknown
/// codes from newer plugins preserved as `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusCode {
    /// `TFL_ERROR_UNKNOWN`, or a code this host does not know.
    Unknown,
    /// `TFL_ERROR_INVALID_ARGUMENT`: the caller passed a bad argument.
    InvalidArgument,
    /// `TFL_ERROR_OUT_OF_MEMORY`: the device could not satisfy an allocation.
    OutOfMemory,
    /// `TFL_ERROR_UNIMPLEMENTED`: the function or this argument combination
    /// is not implemented; for a kernel, the host falls back as if the op
    /// were absent.
    Unimplemented,
    /// `TFL_ERROR_INTERNAL`: a bug inside the plugin.
    Internal,
    /// `TFL_ERROR_DEVICE_LOST`: the device is unusable (reset, removed, hung).
    DeviceLost,
    /// `TFL_ERROR_FAILED_PRECONDITION`: a valid call made in the wrong state.
    FailedPrecondition,
}

impl StatusCode {
    /// Reads a `TFL_ErrorCode` as returned by the plugin's `error_code`;
    /// codes from a newer ABI minor become [`StatusCode::Unknown`], as the
    /// header requires.
    pub fn from_raw(code: i32) -> Self {
        use torchfl_ffi as f;
        match code {
            f::TFL_ERROR_INVALID_ARGUMENT => Self::InvalidArgument,
            f::TFL_ERROR_OUT_OF_MEMORY => Self::OutOfMemory,
            f::TFL_ERROR_UNIMPLEMENTED => Self::Unimplemented,
            f::TFL_ERROR_INTERNAL => Self::Internal,
            f::TFL_ERROR_DEVICE_LOST => Self::DeviceLost,
            f::TFL_ERROR_FAILED_PRECONDITION => Self::FailedPrecondition,
            _ => Self::Unknown,
        }
    }

    /// The code's name without the `TFL_ERROR_` prefix, as shown in
    /// messages and `--json` output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "UNKNOWN",
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::OutOfMemory => "OUT_OF_MEMORY",
            Self::Unimplemented => "UNIMPLEMENTED",
            Self::Internal => "INTERNAL",
            Self::DeviceLost => "DEVICE_LOST",
            Self::FailedPrecondition => "FAILED_PRECONDITION",
        }
    }
}

impl fmt::Display for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed status received from a plugin: its code and its message, copied
/// out of the plugin's error object (which has been released).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginStatus {
    /// What kind of failure the plugin reported.
    pub code: StatusCode,
    /// The plugin's own message, as `error_message` returned it.
    pub message: String,
}

impl fmt::Display for PluginStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

/// The parts of a plugin the loader validates, in the order it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PluginPart {
    /// What the bootstrap function returned: the table pointer and its
    /// version header.
    Bootstrap,
    /// `TFL_PluginApi`: its size and required entries.
    FunctionTable,
    /// `TFL_PluginInfo`.
    Identity,
    /// The operator table and its kernel symbols.
    OpTable,
    /// `device_count` and `device_properties`, read after `initialize`.
    Devices,
    /// The default stream of every device.
    Streams,
}

impl fmt::Display for PluginPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Bootstrap => "bootstrap result",
            Self::FunctionTable => "function table",
            Self::Identity => "identity (TFL_PluginInfo)",
            Self::OpTable => "op table",
            Self::Devices => "device description",
            Self::Streams => "default stream",
        })
    }
}

/// Set to `1` to load plugins that other users can write (see
/// [`Error::InsecurePermissions`]), as for a plugin on a shared scratch disk
/// the user trusts.
pub const ALLOW_WRITABLE_PLUGINS_ENV: &str = "TORCH_FL_ALLOW_WRITABLE_PLUGINS";

/// Every error torch-fl reports.
///
/// `plugin` fields hold a label such as `'sim' (/path/libtorchfl_sim.so)`,
/// or just the path while the plugin's identity is not known yet.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Discovery found no plugin for a device name.
    #[error(
        "no torch-fl plugin named '{name}' was found (searched: {}). Pass plugin_path=..., add \
         the plugin's file or directory to TORCH_FL_PLUGIN_PATH, or load it first with \
         ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)",
        if searched.is_empty() { "nothing".to_owned() } else { searched.join(", ") }
    )]
    PluginNotFound {
        /// The device name asked for.
        name: String,
        /// The places discovery looked, in order, for the message.
        searched: Vec<String>,
    },

    /// The plugin file does not exist.
    #[error("plugin file {} does not exist{detail}: check the path, or set TORCH_FL_PLUGIN_PATH", path.display())]
    FileNotFound {
        /// The path as given.
        path: PathBuf,
        /// Empty, or what the path is instead, e.g. ` (it is a symbolic
        /// link to /opt/x.so, which does not exist)`.
        detail: String,
    },

    /// The plugin file, or the directory holding it, can be changed by other
    /// users: loading it would run their code in this process.
    #[error(
        "refusing to load plugin {}: {why}, so other users could make this process run their code. \
         Fix the permissions (chmod o-w), or set {ALLOW_WRITABLE_PLUGINS_ENV}=1 to load it anyway",
        path.display()
    )]
    InsecurePermissions {
        /// The plugin file as given.
        path: PathBuf,
        /// Which file or directory is writable, with its mode.
        why: String,
    },

    /// The file exists but is not a shared library the dynamic loader accepts.
    #[error(
        "{} is not a loadable shared library ({reason}): a torch-fl plugin is a shared library \
         (.so) exporting torch_fl_plugin_get_api",
        path.display()
    )]
    NotASharedLibrary {
        /// The file as given.
        path: PathBuf,
        /// What the file is instead, or the dynamic loader's message.
        reason: String,
    },

    /// The file is a shared library built for another CPU architecture.
    #[error(
        "{} is a shared library for {found}, but this process runs on {expected}: install the \
         plugin build for {expected}",
        path.display()
    )]
    WrongArchitecture {
        /// The file as given.
        path: PathBuf,
        /// The file's machine and ELF class, e.g. `aarch64 (64-bit ELF)`.
        found: String,
        /// This process's architecture (`std::env::consts::ARCH`).
        expected: String,
    },

    /// The library does not export the bootstrap symbol.
    #[error(
        "{} does not export the bootstrap symbol torch_fl_plugin_get_api: it is not a torch-fl \
         plugin, or the symbol is hidden (export it with TFL_EXPORT / extern \"C\")",
        path.display()
    )]
    MissingBootstrapSymbol {
        /// The library as given.
        path: PathBuf,
    },

    /// The plugin's ABI major version differs from the host's.
    #[error(
        "plugin {plugin} implements torch-fl plugin ABI {plugin_version}, but this torch-fl speaks \
         ABI {host_version}; majors must match. {}",
        rebuild_advice(*plugin_version, *host_version)
    )]
    AbiMismatch {
        /// The plugin's label.
        plugin: String,
        /// The ABI version the plugin's table declares.
        plugin_version: AbiVersion,
        /// The ABI version this host was built against.
        host_version: AbiVersion,
    },

    /// A part of the plugin's tables is malformed: `part` is one of
    /// [`PluginPart`]'s names (the bootstrap's result, the function table,
    /// the identity, the op table).
    #[error(
        "plugin {plugin} has a malformed {part}: {reason}. Rebuild it against torch_fl/plugin.h and run \
         `torchfl-abi verify` on it"
    )]
    InvalidPlugin {
        /// The plugin's label.
        plugin: String,
        /// Which part failed validation.
        part: PluginPart,
        /// What is wrong with it.
        reason: String,
    },

    /// A required function-table entry is NULL.
    #[error(
        "plugin {plugin} leaves the required entry TFL_PluginApi.{entry} NULL: implement it (the \
         header lists every required entry), then run `torchfl-abi verify`"
    )]
    MissingRequiredEntry {
        /// The plugin's label.
        plugin: String,
        /// The `TFL_PluginApi` field name, e.g. `"allocate"`.
        entry: &'static str,
    },

    /// An op-table entry names a kernel symbol the library does not export,
    /// or one that is not the table's kernel.
    #[error("plugin {plugin}: operator '{op}' {reason}: export the kernel as `{symbol}` (see \"Kernel symbols\" in docs/plugin-abi.md)")]
    KernelSymbol {
        /// The plugin's label.
        plugin: String,
        /// The op-table name, e.g. `"add.Tensor"`.
        op: String,
        /// The symbol the ABI's mangling rule expects for `op`.
        symbol: String,
        /// Whether the symbol is missing or resolves to another function.
        reason: String,
    },

    /// The plugin's `initialize` failed.
    #[error(
        "plugin {plugin} failed to initialize: {status}. Check the plugin's options and its device's state"
    )]
    InitFailed {
        /// The plugin's label.
        plugin: String,
        /// What `initialize` returned.
        status: PluginStatus,
    },

    /// The plugin was already initialized in this process with other options.
    #[error(
        "plugin {plugin} is already loaded in this process with options {existing:?}; it cannot \
         be initialized again with {requested:?}. Restart the process to change them"
    )]
    AlreadyInitialized {
        /// The plugin's label.
        plugin: String,
        /// The options the plugin was initialized with.
        existing: String,
        /// The differing options of this request.
        requested: String,
    },

    /// A device index outside the plugin's range.
    #[error("plugin {plugin} has {count} device(s); device index {device} is out of range")]
    InvalidDevice {
        /// The plugin's label.
        plugin: String,
        /// The index asked for.
        device: i32,
        /// The plugin's `device_count`.
        count: i32,
    },

    /// A device ran out of memory.
    #[error(
        "{plugin} device {device} is out of memory ({status}). Free tensors you no longer need, \
         reduce the batch size, or call empty_cache()"
    )]
    OutOfMemory {
        /// The plugin's label.
        plugin: String,
        /// The device index whose memory is exhausted.
        device: i32,
        /// The plugin's `OUT_OF_MEMORY` status, with its message.
        status: PluginStatus,
    },

    /// An optional entry the plugin does not implement, or a status
    /// UNIMPLEMENTED from a runtime call.
    #[error("plugin {plugin} does not implement {what}")]
    Unimplemented {
        /// The plugin's label.
        plugin: String,
        /// The missing entry or the failing call, for the message.
        what: String,
    },

    /// A runtime entry (copy, stream, event, ...) failed.
    #[error("plugin {plugin}: {function} failed: {status}")]
    RuntimeCall {
        /// The plugin's label.
        plugin: String,
        /// The `TFL_PluginApi` entry that failed.
        function: &'static str,
        /// What it returned.
        status: PluginStatus,
    },

    /// A kernel returned a failed status.
    #[error("plugin {plugin}: kernel for '{op}' failed: {status}")]
    Kernel {
        /// The plugin's label.
        plugin: String,
        /// The operator whose kernel failed, e.g. `"add.Tensor"`.
        op: String,
        /// What the kernel returned.
        status: PluginStatus,
    },

    /// The operator is served by no registered plugin.
    #[error(
        "no registered plugin implements '{op}': export `{symbol}` from a plugin, or use the CPU \
         fallback"
    )]
    OperatorNotFound {
        /// The operator asked for.
        op: String,
        /// The kernel symbol a plugin would export to serve it.
        symbol: String,
    },

    /// A call from the host was malformed (wrong tensor extents, a buffer of
    /// another device): a bug in the caller, reported before the plugin runs.
    #[error("invalid call to plugin {plugin}: {reason}")]
    InvalidCall {
        /// The plugin's label.
        plugin: String,
        /// What is wrong with the call.
        reason: String,
    },

    /// A device name that cannot be used: not an identifier, or one of
    /// PyTorch's own device types.
    #[error(
        "'{name}' cannot be a torch-fl device name: {reason}. Choose a short lowercase identifier that is \
         not a PyTorch device type (for example the accelerator's name, like 'npu' or 'sim')"
    )]
    InvalidDeviceName {
        /// The rejected name.
        name: String,
        /// Why it cannot be used.
        reason: String,
    },

    /// A second, different device name in one process. PyTorch has one
    /// PrivateUse1 key, renamed once per process.
    #[error(
        "this process already registered the torch-fl device '{existing}'; it cannot also register \
         '{requested}' (PyTorch allows one custom device name per process). Register further plugins \
         under name='{existing}', or use a separate process"
    )]
    DeviceNameConflict {
        /// The name this process registered first.
        existing: String,
        /// The other name now asked for.
        requested: String,
    },

    /// A plugin added to a device whose memory it cannot use.
    #[error(
        "plugin {plugin} cannot serve device '{device}', whose memory belongs to plugin {runtime}: {reason}. \
         Register it under its own device name in another process"
    )]
    IncompatiblePlugin {
        /// The label of the plugin being added.
        plugin: String,
        /// The device name it was to serve.
        device: String,
        /// The label of the plugin that owns the device's memory.
        runtime: String,
        /// Why the two cannot share memory.
        reason: String,
    },

    /// A value the user expected (`metadata=`) differs from what the plugin
    /// reports.
    #[error(
        "plugin {plugin} reports {key} = {found:?}, but metadata expects {expected:?}: check that \
         plugin_path points at the intended build"
    )]
    MetadataMismatch {
        /// The plugin's label.
        plugin: String,
        /// The metadata key, e.g. `"plugin_version"`.
        key: String,
        /// What the user's `metadata=` asked for.
        expected: String,
        /// What the plugin reports (or which keys exist, when it has none).
        found: String,
    },

    /// Registering the device or a kernel with PyTorch failed (the C++
    /// shim's message).
    #[error("PyTorch integration failed: {message}")]
    TorchIntegration {
        /// The shim's error message.
        message: String,
    },

    /// A plugin call in a child forked (`os.fork()`, multiprocessing's
    /// "fork" start method) from a process that had initialized a plugin:
    /// the plugin's threads and state do not survive fork(), so the call is
    /// refused instead of hanging (see [`crate::fork`]).
    #[error(
        "Cannot {operation} in a forked subprocess: the process it was forked from had already \
         initialized the torch-fl plugin {plugin}, whose threads and device state do not survive \
         fork(). {FORK_REMEDY}"
    )]
    BadFork {
        /// What was refused, e.g. `"call device_synchronize"`.
        operation: String,
        /// The label of the plugin the parent initialized.
        plugin: String,
    },

    /// A plugin did not finish loading or initializing within
    /// `TORCH_FL_INIT_TIMEOUT` seconds (see [`crate::watch`]). Its thread is
    /// left running: a thread cannot be stopped safely.
    #[error(
        "plugin {plugin} did not return from {call} within {seconds} s (TORCH_FL_INIT_TIMEOUT); its \
         loading thread is left running in this process. Run `torchfl-abi verify` on the plugin to see \
         which stage hangs and report it to the vendor, or raise TORCH_FL_INIT_TIMEOUT (0 waits without \
         limit) if the device is slow to start"
    )]
    InitTimeout {
        /// The plugin's label (its path while its identity is unknown).
        plugin: String,
        /// The call or stage it is stuck in, e.g. `"initialize"`.
        call: String,
        /// The limit that passed.
        seconds: f64,
    },

    /// A torch-fl setting (an environment variable) has a value torch-fl
    /// cannot use.
    #[error("{name}={value:?} is not valid: expected {expected}. Fix or unset {name}")]
    InvalidSetting {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What is accepted.
        expected: String,
    },

    /// The plugin needs a newer PyTorch than the one installed.
    #[error(
        "plugin {plugin} requires PyTorch >= {required}, but {found} is installed: upgrade torch, or \
         install a plugin build validated with torch {found}"
    )]
    TorchTooOld {
        /// The plugin's label.
        plugin: String,
        /// The plugin's `min_torch_version`.
        required: String,
        /// The installed PyTorch version.
        found: String,
    },
}

/// What to do instead of using a device in a forked child; the C++ shim's
/// message (`cpp_shim/src/runtime/fork.cpp`) says the same.
pub const FORK_REMEDY: &str = "To use a torch-fl device with multiprocessing, use the 'spawn' or \
     'forkserver' start method (multiprocessing.set_start_method('spawn'), torch.multiprocessing.spawn, \
     or DataLoader(..., multiprocessing_context='spawn')) and create device tensors in the child only. \
     DataLoader workers that load CPU data only can keep the 'fork' start method";

fn rebuild_advice(plugin: AbiVersion, host: AbiVersion) -> String {
    if plugin.major > host.major {
        format!(
            "Upgrade torch-fl to a release that speaks ABI {}.x, or ask the vendor for a plugin built \
             against ABI {}.x",
            plugin.major, host.major
        )
    } else {
        format!(
            "Rebuild the plugin against the torch_fl/plugin.h shipped with this torch-fl (ABI {}), \
             or use a torch-fl release that speaks ABI {}.x",
            host, plugin.major
        )
    }
}

impl Error {
    /// A stable identifier per variant (`"AbiMismatch"`), used for the
    /// Python exception mapping and `--json` output.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::PluginNotFound { .. } => "PluginNotFound",
            Self::FileNotFound { .. } => "FileNotFound",
            Self::InsecurePermissions { .. } => "InsecurePermissions",
            Self::NotASharedLibrary { .. } => "NotASharedLibrary",
            Self::WrongArchitecture { .. } => "WrongArchitecture",
            Self::MissingBootstrapSymbol { .. } => "MissingBootstrapSymbol",
            Self::AbiMismatch { .. } => "AbiMismatch",
            Self::InvalidPlugin { .. } => "InvalidPlugin",
            Self::MissingRequiredEntry { .. } => "MissingRequiredEntry",
            Self::KernelSymbol { .. } => "KernelSymbol",
            Self::InitFailed { .. } => "InitFailed",
            Self::AlreadyInitialized { .. } => "AlreadyInitialized",
            Self::InvalidDevice { .. } => "InvalidDevice",
            Self::OutOfMemory { .. } => "OutOfMemory",
            Self::Unimplemented { .. } => "Unimplemented",
            Self::RuntimeCall { .. } => "RuntimeCall",
            Self::Kernel { .. } => "Kernel",
            Self::OperatorNotFound { .. } => "OperatorNotFound",
            Self::InvalidCall { .. } => "InvalidCall",
            Self::InvalidDeviceName { .. } => "InvalidDeviceName",
            Self::DeviceNameConflict { .. } => "DeviceNameConflict",
            Self::IncompatiblePlugin { .. } => "IncompatiblePlugin",
            Self::MetadataMismatch { .. } => "MetadataMismatch",
            Self::TorchTooOld { .. } => "TorchTooOld",
            Self::TorchIntegration { .. } => "TorchIntegration",
            Self::BadFork { .. } => "BadFork",
            Self::InitTimeout { .. } => "InitTimeout",
            Self::InvalidSetting { .. } => "InvalidSetting",
        }
    }

    /// The loading stage (and `torchfl-abi verify` check) a load error
    /// belongs to; `None` for errors of a loaded plugin.
    pub fn load_stage(&self) -> Option<Stage> {
        Some(match self {
            Self::FileNotFound { .. }
            | Self::InsecurePermissions { .. }
            | Self::NotASharedLibrary { .. }
            | Self::WrongArchitecture { .. } => Stage::File,
            Self::MissingBootstrapSymbol { .. }
            | Self::AbiMismatch { .. }
            | Self::InvalidPlugin { part: PluginPart::Bootstrap, .. } => Stage::Handshake,
            Self::MissingRequiredEntry { .. }
            | Self::InvalidPlugin { part: PluginPart::FunctionTable, .. } => Stage::FunctionTable,
            Self::InvalidPlugin { part: PluginPart::Identity, .. } => Stage::Identity,
            Self::InvalidPlugin { part: PluginPart::OpTable, .. } | Self::KernelSymbol { .. } => {
                Stage::OpTable
            }
            Self::InitFailed { .. } | Self::AlreadyInitialized { .. } => Stage::Initialize,
            Self::InvalidPlugin { part: PluginPart::Devices, .. } => Stage::Devices,
            Self::InvalidPlugin { part: PluginPart::Streams, .. } => Stage::Streams,
            _ => return None,
        })
    }

    /// Whether the error happened while finding or loading a plugin (as
    /// opposed to while using a loaded one). `torchfl-abi` exits with a
    /// distinct code for these.
    pub fn is_load_error(&self) -> bool {
        matches!(
            self,
            Self::PluginNotFound { .. }
                | Self::FileNotFound { .. }
                | Self::InsecurePermissions { .. }
                | Self::NotASharedLibrary { .. }
                | Self::WrongArchitecture { .. }
                | Self::MissingBootstrapSymbol { .. }
                | Self::AbiMismatch { .. }
                | Self::InvalidPlugin { .. }
                | Self::MissingRequiredEntry { .. }
                | Self::KernelSymbol { .. }
                | Self::InitFailed { .. }
                | Self::AlreadyInitialized { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_mismatch_says_what_to_rebuild_in_both_directions() {
        let newer = Error::AbiMismatch {
            plugin: "'npu' (/x/libnpu.so)".into(),
            plugin_version: AbiVersion::new(2, 0),
            host_version: AbiVersion::new(1, 0),
        }
        .to_string();
        assert!(newer.contains("ABI 2.0"), "{newer}");
        assert!(newer.contains("ABI 1.0"), "{newer}");
        assert!(newer.contains("Upgrade torch-fl"), "{newer}");

        let older = Error::AbiMismatch {
            plugin: "'npu'".into(),
            plugin_version: AbiVersion::new(0, 9),
            host_version: AbiVersion::new(1, 0),
        }
        .to_string();
        assert!(older.contains("Rebuild the plugin"), "{older}");
    }

    #[test]
    fn unknown_status_codes_are_preserved_as_unknown() {
        assert_eq!(StatusCode::from_raw(3), StatusCode::OutOfMemory);
        assert_eq!(StatusCode::from_raw(999), StatusCode::Unknown);
    }

    #[test]
    fn not_found_lists_what_was_searched() {
        let e = Error::PluginNotFound { name: "npu".into(), searched: vec!["/opt/a".into()] };
        let s = e.to_string();
        assert!(s.contains("'npu'") && s.contains("/opt/a") && s.contains("TORCH_FL_PLUGIN_PATH"));
        assert_eq!(e.kind(), "PluginNotFound");
        assert!(e.is_load_error());
    }
}

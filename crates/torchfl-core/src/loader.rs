//! Loading a plugin: file checks, `dlopen`, the handshake, validation of
//! every required entry, symbol resolution of the op table, then
//! initialization.
//!
//! Each step either succeeds or returns the one error variant that says
//! what is wrong and what to do. Nothing in the plugin is called before
//! the version check passes, and nothing is initialized before the whole
//! table has been validated.
//!
//! Plugins are never unloaded: memory, streams and kernel pointers a
//! plugin handed out may be reachable until the process exits.

use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use torchfl_ffi::{kernel_symbol, parse_op_name, TFL_GetPluginApiFn, TFL_KernelFn};

use crate::error::{Error, PluginPart, Result};
use crate::ffi::{self, ApiTable, TableError};
use crate::plugin::{Capabilities, OpKernel, Plugin, PluginInfo};
use crate::version::{negotiate, AbiVersion, Negotiated};

/// How to load a plugin.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Passed to the plugin's `initialize` (`TFL_InitArgs.options`):
    /// `"key=value;key=value"`, empty for the plugin's defaults.
    pub init_options: String,
    /// The ABI version the host announces. `None`: this build's
    /// [`AbiVersion::HOST`]. Tests set it to act as an older or newer host.
    pub host_version: Option<AbiVersion>,
    /// Load a plugin file that other users can write (or that sits in a
    /// directory they can write), which is refused by default, as SSH
    /// refuses such keys. Also set by `TORCH_FL_ALLOW_WRITABLE_PLUGINS=1`.
    pub allow_writable_by_others: bool,
}

impl LoadOptions {
    fn host(&self) -> AbiVersion {
        self.host_version.unwrap_or(AbiVersion::HOST)
    }
}

/// A plugin library that passed the handshake and validation but has not
/// been initialized: its identity and op table can be read, its devices
/// cannot be used yet.
#[derive(Debug)]
pub struct PluginLibrary {
    pub(crate) label: String,
    pub(crate) path: Option<PathBuf>,
    // Never closed: see the module docs.
    pub(crate) _library: ManuallyDrop<libloading::Library>,
    /// Address of the plugin's table; identifies the library however it
    /// was reached (two paths, a symlink, a preloaded copy).
    pub(crate) api_address: usize,
    pub(crate) table_size: usize,
    pub(crate) table: ApiTable,
    pub(crate) negotiated: Negotiated,
    pub(crate) info: PluginInfo,
    pub(crate) ops: Vec<OpKernel>,
}

impl PluginLibrary {
    /// Opens the plugin at `path` and validates it, without initializing.
    pub fn open(path: &Path, options: &LoadOptions) -> Result<Self> {
        crate::fork::check_not_forked("load a plugin")?;
        check_file(path)?;
        if !options.allow_writable_by_others && !allowed_by_env() {
            check_permissions(path)?;
        }
        let library = ffi::open_library(path)
            .map_err(|reason| Error::NotASharedLibrary { path: path.to_owned(), reason })?;
        let get_api = ffi::bootstrap_symbol(&library)
            .ok_or_else(|| Error::MissingBootstrapSymbol { path: path.to_owned() })?;
        Self::from_library(library, get_api, Some(path.to_owned()), options)
    }

    /// The plugin's identity.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The handshake's outcome.
    pub fn abi(&self) -> Negotiated {
        self.negotiated
    }

    /// `'name' (path)`, as errors and logs name the plugin.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The validated op table.
    pub fn ops(&self) -> &[OpKernel] {
        &self.ops
    }

    /// `TFL_PluginApi.struct_size` as the plugin declares it.
    pub fn table_size(&self) -> usize {
        self.table_size
    }

    /// A function the library exports as `symbol`, taken to be a kernel.
    pub(crate) fn kernel_by_symbol(&self, symbol: &str) -> Option<TFL_KernelFn> {
        ffi::kernel_by_symbol(&self._library, symbol)
    }

    /// Optional entries and whether the plugin provides each.
    pub fn optional_entries(&self) -> Vec<(&'static str, bool)> {
        self.table.optional_presence()
    }

    pub(crate) fn from_library(
        library: libloading::Library,
        get_api: TFL_GetPluginApiFn,
        path: Option<PathBuf>,
        options: &LoadOptions,
    ) -> Result<Self> {
        // The handshake below is the first call into the library.
        crate::fork::check_not_forked("load a plugin")?;
        let path_label =
            path.as_ref().map_or_else(|| "<main program>".to_owned(), |p| p.display().to_string());
        let host = options.host();
        let host_api = ffi::host_api(&path_label, (host.major, host.minor));
        let header = ffi::handshake(get_api, host_api).map_err(|reason| Error::InvalidPlugin {
            plugin: path_label.clone(),
            part: PluginPart::Bootstrap,
            reason,
        })?;
        let plugin_version = AbiVersion::new(header.major, header.minor);
        let negotiated = negotiate(host, plugin_version).ok_or_else(|| Error::AbiMismatch {
            plugin: path_label.clone(),
            plugin_version,
            host_version: host,
        })?;
        let table = ApiTable::read(&header).map_err(|e| match e {
            TableError::MissingEntry(entry) => Error::MissingRequiredEntry { plugin: path_label.clone(), entry },
            TableError::TooSmall { size, needed } => Error::InvalidPlugin {
                plugin: path_label.clone(),
                part: PluginPart::FunctionTable,
                reason: format!(
                    "TFL_PluginApi.struct_size is {size} bytes but ABI {plugin_version} requires at least {needed} \
                     (every required entry of 1.0)"
                ),
            },
        })?;
        let info = read_info(&table, &path_label)?;
        let label = format!("'{}' ({path_label})", info.name);
        let ops = read_ops(&table, &library, &label)?;
        Ok(Self {
            label,
            path,
            _library: ManuallyDrop::new(library),
            api_address: header.api as usize,
            table_size: header.struct_size,
            table,
            negotiated,
            info,
            ops,
        })
    }
}

/// Loads, validates and initializes the plugin at `path`. Loading the same
/// library again (by any path) returns the same [`Plugin`].
pub fn load(path: &Path, options: &LoadOptions) -> Result<Arc<Plugin>> {
    initialize(PluginLibrary::open(path, options)?, options)
}

/// Every plugin initialized in this process. Plugins are never unloaded, so
/// this only grows.
static LOADED: Mutex<Vec<Arc<Plugin>>> = Mutex::new(Vec::new());

/// Initializes an opened library, or returns the existing [`Plugin`] when
/// this library was initialized before (plugins initialize once per process).
pub fn initialize(mut library: PluginLibrary, options: &LoadOptions) -> Result<Arc<Plugin>> {
    // Before the lock: a thread of the parent may have held it at fork time.
    crate::fork::check_not_forked("initialize a plugin")?;
    let mut loaded = LOADED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(existing) = loaded.iter().find(|p| p.library().api_address == library.api_address) {
        if existing.init_options() != options.init_options {
            return Err(Error::AlreadyInitialized {
                plugin: existing.label().to_owned(),
                existing: existing.init_options().to_owned(),
                requested: options.init_options.clone(),
            });
        }
        return Ok(Arc::clone(existing));
    }
    crate::fork::note_initializing(&library.label);
    library
        .table
        .initialize(&options.init_options)
        .map_err(|status| Error::InitFailed { plugin: library.label.clone(), status })?;
    // Capabilities may depend on the options: the ABI makes them final only
    // once initialize has returned, so read them again.
    if let Some(info) = library.table.info() {
        library.info.capabilities = Capabilities::from_bits(info.capabilities);
    }
    let device_count = library.table.device_count().map_err(|status| Error::RuntimeCall {
        plugin: library.label.clone(),
        function: "device_count",
        status,
    })?;
    let plugin = Arc::new(Plugin::new(library, device_count, options.init_options.clone()));
    loaded.push(Arc::clone(&plugin));
    Ok(plugin)
}

/// Plugins initialized so far in this process, in load order.
pub fn loaded_plugins() -> Vec<Arc<Plugin>> {
    LOADED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
}

/// Finds a plugin named `name` among the libraries already loaded into the
/// process (for instance with `ctypes.CDLL(path, mode=RTLD_GLOBAL)`) and
/// initializes it. `Ok(None)` when none is loaded.
pub fn load_preloaded(name: &str, options: &LoadOptions) -> Result<Option<Arc<Plugin>>> {
    crate::fork::check_not_forked("load a plugin")?;
    for library in preloaded_libraries(options) {
        if library.info.name == name {
            return initialize(library, options).map(Some);
        }
    }
    Ok(None)
}

/// Every already-loaded library that exports the bootstrap symbol and
/// passes validation. Libraries that fail validation are skipped here:
/// they were loaded by someone else and are not ours to judge.
pub fn preloaded_libraries(options: &LoadOptions) -> Vec<PluginLibrary> {
    if crate::fork::in_bad_fork() {
        // Reading a library's tables calls into it; load_preloaded and
        // discovery report the fork themselves.
        return Vec::new();
    }
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    let mut objects = ffi::loaded_objects();
    // The main program last: its handle also resolves symbols of every
    // RTLD_GLOBAL library, which we prefer to see under their own path.
    objects.sort_by_key(Option::is_none);
    for object in objects {
        #[cfg(unix)]
        let Some(library) = ffi::reopen_loaded(object.as_deref()) else {
            continue;
        };
        #[cfg(not(unix))]
        let Some(library) = None::<libloading::Library>
        else {
            continue;
        };
        let Some(get_api) = ffi::bootstrap_symbol(&library) else { continue };
        if let Ok(lib) = PluginLibrary::from_library(library, get_api, object, options) {
            if seen.insert(lib.api_address) {
                found.push(lib);
            }
        }
    }
    found
}

fn read_info(table: &ApiTable, plugin: &str) -> Result<PluginInfo> {
    let invalid = |reason: String| Error::InvalidPlugin {
        plugin: plugin.to_owned(),
        part: PluginPart::Identity,
        reason,
    };
    let raw = table.info().ok_or_else(|| invalid("get_info returned NULL".to_owned()))?;
    let required = |value: Option<String>, field: &str| {
        value
            .filter(|s| !s.is_empty())
            .ok_or_else(|| invalid(format!("TFL_PluginInfo.{field} is NULL or empty")))
    };
    let name = required(raw.name, "name")?;
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(invalid(format!("TFL_PluginInfo.name {name:?} must be made of [A-Za-z0-9_]")));
    }
    Ok(PluginInfo {
        name,
        vendor: required(raw.vendor, "vendor")?,
        chip_family: required(raw.chip_family, "chip_family")?,
        plugin_version: required(raw.plugin_version, "plugin_version")?,
        min_torch_version: raw.min_torch_version.filter(|s| !s.is_empty()),
        capabilities: Capabilities::from_bits(raw.capabilities),
    })
}

/// Validates the op table and resolves each kernel's exported symbol.
fn read_ops(table: &ApiTable, library: &libloading::Library, plugin: &str) -> Result<Vec<OpKernel>> {
    let invalid = |reason: String| Error::InvalidPlugin {
        plugin: plugin.to_owned(),
        part: PluginPart::OpTable,
        reason,
    };
    let entries = table.op_table().map_err(invalid)?;
    let mut names = HashSet::new();
    let mut ops = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let name = entry.name.ok_or_else(|| invalid(format!("op table entry {i} has a NULL name")))?;
        let parsed = parse_op_name(&name)
            .map_err(|e| invalid(format!("op table entry {i} has a malformed name {name:?}: {e}")))?;
        if parsed.namespace != "aten" && entry.schema.is_none() {
            return Err(invalid(format!("custom operator '{name}' needs a schema in its op table entry")));
        }
        if !names.insert(name.clone()) {
            return Err(invalid(format!("operator '{name}' appears twice in the op table")));
        }
        let kernel = entry.kernel.ok_or_else(|| invalid(format!("operator '{name}' has a NULL kernel")))?;
        let symbol = kernel_symbol(&name).map_err(invalid)?;
        let symbol_error = |reason: String| Error::KernelSymbol {
            plugin: plugin.to_owned(),
            op: name.clone(),
            symbol: symbol.clone(),
            reason,
        };
        if entry.symbol.as_deref() != Some(symbol.as_str()) {
            return Err(symbol_error(format!(
                "declares its symbol as {:?}, not the conventional name",
                entry.symbol.as_deref().unwrap_or("NULL")
            )));
        }
        match ffi::symbol_address(library, &symbol) {
            None => return Err(symbol_error("has no exported kernel symbol".to_owned())),
            Some(address) if address != kernel as usize => return Err(symbol_error(
                "exports a symbol that is not the kernel its table entry points to (when another library \
                     loaded with RTLD_GLOBAL exports the same name, it interposes its kernel: export kernels \
                     with TFL_EXPORT or link with -Wl,-Bsymbolic-functions)"
                    .to_owned(),
            )),
            Some(_) => {}
        }
        if parsed.namespace == "aten" && entry.infer_outputs.is_some() {
            return Err(invalid(format!(
                "aten operator '{name}' has infer_outputs: PyTorch already knows its output shapes; set it only for \
                 custom operators"
            )));
        }
        ops.push(OpKernel {
            name,
            symbol,
            kernel,
            flags: entry.flags,
            schema: entry.schema,
            infer_outputs: entry.infer_outputs,
        });
    }
    Ok(ops)
}

/// ELF machine numbers of the architectures torch-fl builds for.
fn elf_machine_name(machine: u16) -> String {
    match machine {
        3 => "x86 (32-bit)".into(),
        8 => "MIPS".into(),
        20 => "PowerPC".into(),
        21 => "PowerPC64".into(),
        22 => "s390x".into(),
        40 => "ARM (32-bit)".into(),
        62 => "x86_64".into(),
        183 => "aarch64".into(),
        243 => "RISC-V".into(),
        258 => "LoongArch".into(),
        other => format!("ELF machine {other}"),
    }
}

fn host_elf_machine() -> Option<u16> {
    match std::env::consts::ARCH {
        "x86" => Some(3),
        "x86_64" => Some(62),
        "arm" => Some(40),
        "aarch64" => Some(183),
        "powerpc64" => Some(21),
        "s390x" => Some(22),
        "riscv64" => Some(243),
        "loongarch64" => Some(258),
        _ => None,
    }
}

fn allowed_by_env() -> bool {
    std::env::var_os(crate::error::ALLOW_WRITABLE_PLUGINS_ENV).is_some_and(|v| v == "1")
}

/// Refuses a plugin that other users could replace or modify: a
/// world-writable file, or one in a world-writable directory without the
/// sticky bit (where anyone may rename it away and put their own in its
/// place). Group-writable files are accepted: umask 002 makes them the
/// norm on systems with per-user groups.
#[cfg(unix)]
fn check_permissions(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    const OTHERS_WRITE: u32 = 0o002;
    const STICKY: u32 = 0o1000;
    let insecure = |why: String| Error::InsecurePermissions { path: path.to_owned(), why };
    let real = fs::canonicalize(path).map_err(|_| Error::FileNotFound { path: path.to_owned() })?;
    let mode =
        fs::metadata(&real).map_err(|_| Error::FileNotFound { path: path.to_owned() })?.permissions().mode();
    if mode & OTHERS_WRITE != 0 {
        return Err(insecure(format!("the file is writable by every user (mode {:o})", mode & 0o7777)));
    }
    if let Some(dir) = real.parent() {
        if let Ok(meta) = fs::metadata(dir) {
            let dmode = meta.permissions().mode();
            if dmode & OTHERS_WRITE != 0 && dmode & STICKY == 0 {
                return Err(insecure(format!(
                    "its directory {} is writable by every user without the sticky bit (mode {:o})",
                    dir.display(),
                    dmode & 0o7777
                )));
            }
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_permissions(_path: &Path) -> Result<()> {
    Ok(())
}

/// Refuses files that cannot be a plugin for this process before handing
/// them to the dynamic loader, whose messages for these cases are cryptic
/// ("invalid ELF header", "wrong ELF class").
fn check_file(path: &Path) -> Result<()> {
    let not_lib =
        |reason: &str| Error::NotASharedLibrary { path: path.to_owned(), reason: reason.to_owned() };
    let metadata = fs::metadata(path).map_err(|_| Error::FileNotFound { path: path.to_owned() })?;
    if metadata.is_dir() {
        return Err(not_lib(
            "it is a directory; name the plugin file, or put the directory in TORCH_FL_PLUGIN_PATH",
        ));
    }
    if !cfg!(target_os = "linux") {
        return Ok(());
    }
    let mut header = [0u8; 20];
    let mut file = fs::File::open(path).map_err(|e| not_lib(&format!("cannot read it: {e}")))?;
    let n = file.read(&mut header).map_err(|e| not_lib(&format!("cannot read it: {e}")))?;
    if n < header.len() || header[..4] != *b"\x7fELF" {
        return Err(not_lib("it has no ELF header"));
    }
    let little_endian = header[5] == 1;
    let half = |i: usize| {
        let b = [header[i], header[i + 1]];
        if little_endian {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        }
    };
    let (e_type, e_machine) = (half(16), half(18));
    let class_bits = if header[4] == 2 { 64 } else { 32 };
    if let Some(host) = host_elf_machine() {
        if e_machine != host || class_bits != usize::BITS {
            let found = format!("{} ({class_bits}-bit ELF)", elf_machine_name(e_machine));
            return Err(Error::WrongArchitecture {
                path: path.to_owned(),
                found,
                expected: std::env::consts::ARCH.to_owned(),
            });
        }
    }
    match e_type {
        3 => Ok(()),
        1 => Err(not_lib("it is a relocatable object file (.o); link it with -shared")),
        2 => Err(not_lib("it is an executable, not a shared library; link it with -shared")),
        4 => Err(not_lib("it is a core dump")),
        t => Err(not_lib(&format!("its ELF type is {t}, not a shared object"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_is_file_not_found() {
        let err = check_file(Path::new("/definitely/not/here.so")).unwrap_err();
        assert_eq!(err.kind(), "FileNotFound");
    }

    #[test]
    fn a_text_file_is_not_a_shared_library() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("plugin.so");
        fs::write(&p, "this is not a plugin, just some text that is long enough").unwrap();
        let err = check_file(&p).unwrap_err();
        assert_eq!(err.kind(), "NotASharedLibrary");
        assert!(err.to_string().contains("ELF"), "{err}");
    }

    #[test]
    fn a_directory_is_refused_with_advice() {
        let dir = tempfile::tempdir().unwrap();
        let err = check_file(dir.path()).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_foreign_architecture_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("foreign.so");
        let mut h = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
        h.resize(16, 0);
        h.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
        let foreign: u16 = if std::env::consts::ARCH == "aarch64" { 62 } else { 183 };
        h.extend_from_slice(&foreign.to_le_bytes());
        h.resize(64, 0);
        fs::write(&p, h).unwrap();
        let err = check_file(&p).unwrap_err();
        assert_eq!(err.kind(), "WrongArchitecture", "{err}");
        assert!(err.to_string().contains(std::env::consts::ARCH), "{err}");
    }
}

//! The first loading stages, one at a time: the file, `dlopen`, the
//! handshake, the function table, the identity and the op table
//! ([`Opening`]), up to a validated library that is not initialized yet
//! ([`PluginLibrary`]). [`crate::init`] runs the stages after these, and
//! [`crate::loader`] runs them all.
//!
//! These stages sit below both: initializing needs the opened library, and
//! loading needs initializing, so neither can hold them without the other
//! depending on it back.
//!
//! [`PluginLibrary::open`] and [`crate::load`] run every stage in a row;
//! `torchfl-abi verify` runs each stage as one of its checks, so a crash or
//! a refusal is reported against the stage that caused it. Both run the
//! same code, so they cannot disagree (see [`crate::validate`]).
//!
//! Each stage either succeeds or returns the one error variant that says
//! what is wrong and what to do. Nothing in the plugin is called before
//! the version check passes, and nothing is initialized before the whole
//! table has been validated.
//!
//! Plugins are never unloaded: memory, streams and kernel pointers a
//! plugin handed out may be reachable until the process exits.

use std::collections::HashSet;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};

use torchfl_ffi::{kernel_symbol, parse_op_name, TFL_KernelFn};

use crate::error::{Error, PluginPart, Result};
use crate::ffi::probe::MemoryMap;
use crate::ffi::{self, ApiTable, RawOpEntry, TableError, TableHeader};
use crate::types::{Finding, OpKernel, PluginInfo, Stage};
use crate::validate::{self, Verdict};
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
    pub(crate) warnings: Vec<Finding>,
}

impl PluginLibrary {
    /// Opens the plugin at `path` and validates it, without initializing.
    pub fn open(path: &Path, options: &LoadOptions) -> Result<Self> {
        Opening::new(path, options).finish()
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

    /// The validated op table, without the operators warnings left out.
    pub fn ops(&self) -> &[OpKernel] {
        &self.ops
    }

    /// What validation warned about (see [`crate::validate`]).
    pub fn warnings(&self) -> &[Finding] {
        &self.warnings
    }

    /// `TFL_PluginApi.struct_size` as the plugin declares it.
    pub fn table_size(&self) -> usize {
        self.table_size
    }

    /// A function the library exports as `symbol`, taken to be a kernel:
    /// `Ok(None)` when not exported, `Err` when it is not code.
    pub(crate) fn kernel_by_symbol(&self, symbol: &str) -> std::result::Result<Option<TFL_KernelFn>, String> {
        ffi::kernel_by_symbol(&self._library, symbol)
    }

    /// Optional entries and whether the plugin provides each.
    pub fn optional_entries(&self) -> Vec<(&'static str, bool)> {
        self.table.optional_presence()
    }

    /// How many devices `initialize(options)` would find, asked without
    /// initializing (ABI 1.6 `probe_devices`): `Ok(None)` when the plugin
    /// does not offer the entry, so only initializing could tell. A missing
    /// driver is the plugin's error ([`Error::RuntimeCall`]); a count
    /// outside 0..=TFL_MAX_DEVICES refuses the plugin.
    pub fn probe_devices(&self, options: &str) -> Result<Option<usize>> {
        match self.table.probe_devices(options) {
            None => Ok(None),
            Some(Err(status)) => {
                Err(Error::RuntimeCall { plugin: self.label.clone(), function: "probe_devices", status })
            }
            Some(Ok(n)) => {
                validate::device_count(n).map(|n| Some(n as usize)).map_err(|reason| Error::InvalidPlugin {
                    plugin: self.label.clone(),
                    part: PluginPart::Devices,
                    reason: reason.replace("device_count", "probe_devices"),
                })
            }
        }
    }
}

/// Opening a plugin library, stage by stage: [`Stage::File`] through
/// [`Stage::OpTable`]. [`PluginLibrary::open`] runs all of them;
/// `torchfl-abi verify` runs one per check and reads what each found.
#[derive(Debug)]
pub struct Opening {
    options: LoadOptions,
    /// The path given; `None` for the main program.
    path: Option<PathBuf>,
    /// The bootstrap function's address when the caller found it
    /// ([`Opening::in_process`]) rather than the library's symbol.
    bootstrap: Option<usize>,
    path_label: String,
    /// The next stage to run; `None` once the op table was read.
    next: Option<Stage>,
    failed: bool,
    map: MemoryMap,
    library: Option<libloading::Library>,
    header: Option<TableHeader>,
    negotiated: Option<Negotiated>,
    table: Option<ApiTable>,
    info: Option<PluginInfo>,
    label: String,
    ops: Vec<OpKernel>,
    warnings: Vec<Finding>,
}

impl Opening {
    /// Starts opening the plugin file at `path`; nothing runs yet.
    pub fn new(path: &Path, options: &LoadOptions) -> Self {
        Self::start(Some(path.to_owned()), None, options)
    }

    /// Starts validating a plugin already in this process' memory, whose
    /// bootstrap function the caller found (an embedder that links a plugin
    /// statically; the fuzz tests). The function is called only if it lies
    /// in executable memory, like any bootstrap symbol; kernel symbols are
    /// looked up among the process' global symbols.
    #[cfg(unix)]
    pub fn in_process(bootstrap: torchfl_ffi::TFL_GetPluginApiFn, options: &LoadOptions) -> Self {
        let library = libloading::os::unix::Library::this().into();
        let mut opening = Self::start(None, Some(library), options);
        opening.bootstrap = Some(bootstrap as usize);
        opening
    }

    fn start(path: Option<PathBuf>, library: Option<libloading::Library>, options: &LoadOptions) -> Self {
        let path_label =
            path.as_ref().map_or_else(|| "<main program>".to_owned(), |p| p.display().to_string());
        Self {
            options: options.clone(),
            bootstrap: None,
            next: Some(if library.is_some() { Stage::Handshake } else { Stage::File }),
            failed: false,
            // A file's segments are known once it is opened (stage File).
            map: if library.is_some() { MemoryMap::snapshot() } else { MemoryMap::empty() },
            library,
            header: None,
            negotiated: None,
            table: None,
            info: None,
            label: path_label.clone(),
            path,
            path_label,
            ops: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// Runs every stage up to and including `last` that has not run yet.
    /// After a failure, every later call fails too.
    pub fn run_to(&mut self, last: Stage) -> Result<()> {
        // The handshake is the first call into the library.
        crate::fork::check_not_forked("load a plugin")?;
        crate::ffi::crash::install();
        while let Some(stage) = self.next.filter(|&s| s <= last && s <= Stage::OpTable) {
            if self.failed {
                return Err(Error::InvalidCall {
                    plugin: self.label.clone(),
                    reason: "loading stopped at an earlier stage".to_owned(),
                });
            }
            let _in_flight = crate::inflight::enter_stage(crate::inflight::intern(&self.label), stage.call());
            let result = match stage {
                Stage::File => self.file(),
                Stage::Handshake => self.handshake(),
                Stage::FunctionTable => self.function_table(),
                Stage::Identity => self.identity(),
                _ => self.op_table(),
            };
            if let Err(e) = result {
                self.failed = true;
                return Err(e);
            }
            self.next = Stage::ALL.iter().copied().find(|&s| s > stage && s <= Stage::OpTable);
        }
        Ok(())
    }

    /// The handshake's outcome, once [`Stage::Handshake`] ran.
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.negotiated
    }

    /// `TFL_PluginApi.struct_size`, once the handshake ran.
    pub fn table_size(&self) -> Option<usize> {
        self.header.map(|h| h.struct_size)
    }

    /// Optional entries and whether the plugin provides each, once the
    /// function table was read.
    pub fn optional_entries(&self) -> Vec<(&'static str, bool)> {
        self.table.map(|t| t.optional_presence()).unwrap_or_default()
    }

    /// The identity, once [`Stage::Identity`] ran.
    pub fn info(&self) -> Option<&PluginInfo> {
        self.info.as_ref()
    }

    /// The operators kept so far.
    pub fn ops(&self) -> &[OpKernel] {
        &self.ops
    }

    /// What the stages run so far warned about.
    pub fn warnings(&self) -> &[Finding] {
        &self.warnings
    }

    /// Runs the remaining stages and returns the validated library.
    pub fn finish(mut self) -> Result<PluginLibrary> {
        self.run_to(Stage::OpTable)?;
        let (Some(library), Some(header), Some(negotiated), Some(table), Some(info)) =
            (self.library, self.header, self.negotiated, self.table, self.info)
        else {
            return Err(Error::InvalidCall {
                plugin: self.label,
                reason: "loading did not complete".to_owned(),
            });
        };
        Ok(PluginLibrary {
            label: self.label,
            path: self.path,
            _library: ManuallyDrop::new(library),
            api_address: header.api as usize,
            table_size: header.struct_size,
            table,
            negotiated,
            info,
            ops: self.ops,
            warnings: self.warnings,
        })
    }

    fn invalid(&self, part: PluginPart) -> impl Fn(String) -> Error {
        let plugin = self.label.clone();
        move |reason| Error::InvalidPlugin { plugin: plugin.clone(), part, reason }
    }

    fn file(&mut self) -> Result<()> {
        let path = self.path.clone().unwrap_or_default();
        let real = crate::file::check(&path, self.options.allow_writable_by_others)?;
        let library = ffi::open_library(&real).map_err(|reason| Error::NotASharedLibrary { path, reason })?;
        self.library = Some(library);
        // The plugin's own segments are mapped now.
        self.map = MemoryMap::snapshot();
        Ok(())
    }

    fn handshake(&mut self) -> Result<()> {
        let path = self.path.clone().unwrap_or_else(|| PathBuf::from(&self.path_label));
        let library = self.library.as_ref().ok_or_else(|| Error::NotASharedLibrary {
            path: path.clone(),
            reason: "it was not opened".to_owned(),
        })?;
        let address = self
            .bootstrap
            .or_else(|| ffi::bootstrap_address(library))
            .ok_or(Error::MissingBootstrapSymbol { path })?;
        let invalid = self.invalid(PluginPart::Bootstrap);
        let get_api = ffi::bootstrap_function(&self.map, address).map_err(&invalid)?;
        let host = self.options.host();
        let host_api = ffi::host_api(&self.path_label, (host.major, host.minor));
        let header = ffi::handshake(&self.map, get_api, host_api).map_err(&invalid)?;
        let plugin_version = AbiVersion::new(header.major, header.minor);
        let negotiated = negotiate(host, plugin_version).ok_or_else(|| Error::AbiMismatch {
            plugin: self.path_label.clone(),
            plugin_version,
            host_version: host,
        })?;
        self.header = Some(header);
        self.negotiated = Some(negotiated);
        Ok(())
    }

    fn function_table(&mut self) -> Result<()> {
        let header =
            self.header.ok_or_else(|| self.invalid(PluginPart::FunctionTable)("no handshake".into()))?;
        let version = AbiVersion::new(header.major, header.minor);
        let table = ApiTable::read(&self.map, &header).map_err(|e| match e {
            TableError::MissingEntry(entry) => Error::MissingRequiredEntry { plugin: self.path_label.clone(), entry },
            TableError::TooSmall { size, needed } => self.invalid(PluginPart::FunctionTable)(format!(
                "TFL_PluginApi.struct_size is {size} bytes but ABI {version} requires at least {needed} (every \
                 required entry of 1.0)"
            )),
            TableError::Unreadable => self.invalid(PluginPart::FunctionTable)(format!(
                "its TFL_PluginApi at {:p} is not readable for its struct_size of {} bytes",
                header.api, header.struct_size
            )),
            TableError::NotCode { entry, at } => self.invalid(PluginPart::FunctionTable)(format!(
                "TFL_PluginApi.{entry} is not a function: it points to {at}"
            )),
        })?;
        self.table = Some(table);
        Ok(())
    }

    fn identity(&mut self) -> Result<()> {
        let invalid = self.invalid(PluginPart::Identity);
        let table = self.table.ok_or_else(|| invalid("no function table".into()))?;
        let raw = table.info(&self.map).map_err(&invalid)?;
        let info = validate::identity(raw).map_err(&invalid)?;
        self.label = format!("'{}' ({})", info.name, self.path_label);
        self.info = Some(info);
        Ok(())
    }

    /// Validates the op table one entry at a time and resolves each
    /// kernel's exported symbol.
    fn op_table(&mut self) -> Result<()> {
        let table =
            self.table.ok_or_else(|| self.invalid(PluginPart::OpTable)("no function table".into()))?;
        let raw = table.op_table().map_err(self.invalid(PluginPart::OpTable))?;
        // One check for the whole array when it is readable (a table on the
        // heap then costs one probe); entry by entry otherwise, to name the
        // first entry that is not.
        let _ = self.map.readable(raw.entries, raw.num_entries.saturating_mul(raw.entry_size));
        let mut names = HashSet::new();
        let mut ops = Vec::with_capacity(raw.num_entries);
        for i in 0..raw.num_entries {
            let hint = || ffi::bytes_hint(raw.num_entries, raw.entry_size, Some(i));
            let checked = ffi::op_entry(&self.map, &raw, i)
                .map_err(|reason| self.invalid(PluginPart::OpTable)(reason))
                .and_then(|entry| self.entry(i, entry, &mut names));
            match checked {
                Ok(Some(op)) => ops.push(op),
                Ok(None) => {}
                Err(Error::InvalidPlugin { plugin, part, reason }) => {
                    return Err(Error::InvalidPlugin { plugin, part, reason: reason + &hint() });
                }
                Err(e) => return Err(e),
            }
        }
        let arity = validate::backward_arity(&ops);
        ops.retain(|op| !arity.iter().any(|f| f.subject == op.name));
        self.warnings.extend(arity);
        self.ops = ops;
        Ok(())
    }

    /// One entry: `Ok(None)` when a warning leaves it out.
    fn entry(
        &mut self,
        i: usize,
        entry: RawOpEntry,
        names: &mut HashSet<String>,
    ) -> Result<Option<OpKernel>> {
        let invalid = self.invalid(PluginPart::OpTable);
        let name = entry
            .name
            .map_err(|fault| invalid(format!("op table entry {i}'s name {fault}")))?
            .ok_or_else(|| invalid(format!("op table entry {i} has a NULL name")))?;
        let parsed = parse_op_name(&name)
            .map_err(|e| invalid(format!("op table entry {i} has a malformed name {name:?}: {e}")))?;
        let schema =
            entry.schema.map_err(|fault| invalid(format!("operator '{name}': its schema {fault}")))?;
        if parsed.namespace != "aten" && schema.is_none() {
            return Err(invalid(format!("custom operator '{name}' needs a schema in its op table entry")));
        }
        validate::unique(names, &name).map_err(&invalid)?;
        let kernel = entry.kernel.ok_or_else(|| invalid(format!("operator '{name}' has a NULL kernel")))?;
        self.map.executable(kernel as usize).map_err(|at| {
            invalid(format!("operator '{name}': its kernel is not a function: it points to {at}"))
        })?;
        if let Some(infer) = entry.infer_outputs {
            if parsed.namespace == "aten" {
                return Err(invalid(format!(
                    "aten operator '{name}' has infer_outputs: PyTorch already knows its output shapes; set it only \
                     for custom operators"
                )));
            }
            self.map.executable(infer as usize).map_err(|at| {
                invalid(format!("operator '{name}': its infer_outputs is not a function: it points to {at}"))
            })?;
        }
        let symbol = kernel_symbol(&name).map_err(&invalid)?;
        let declared =
            entry.symbol.map_err(|fault| invalid(format!("operator '{name}': its symbol {fault}")))?;
        self.check_symbol(&name, &symbol, declared.as_deref(), kernel)?;
        let op = OpKernel {
            name: name.clone(),
            symbol,
            kernel,
            flags: entry.flags,
            schema,
            infer_outputs: entry.infer_outputs,
        };
        Ok(match validate::operator(&name, &parsed, op.schema.as_deref(), op.infer_outputs.is_some()) {
            Verdict::Keep => Some(op),
            Verdict::KeepWithWarning(finding) => {
                self.warnings.push(finding);
                Some(op)
            }
            Verdict::Drop(finding) => {
                self.warnings.push(finding);
                None
            }
        })
    }

    /// The entry's declared symbol is the conventional one, and the library
    /// exports it as the very function the entry points to.
    fn check_symbol(
        &self,
        name: &str,
        symbol: &str,
        declared: Option<&str>,
        kernel: TFL_KernelFn,
    ) -> Result<()> {
        let symbol_error = |reason: String| Error::KernelSymbol {
            plugin: self.label.clone(),
            op: name.to_owned(),
            symbol: symbol.to_owned(),
            reason,
        };
        if declared != Some(symbol) {
            return Err(symbol_error(format!(
                "declares its symbol as {:?}, not the conventional name",
                declared.unwrap_or("NULL")
            )));
        }
        let library = self.library.as_ref().ok_or_else(|| symbol_error("the library is not open".into()))?;
        match ffi::symbol_address(library, symbol) {
            None => Err(symbol_error("has no exported kernel symbol".to_owned())),
            Some(address) if address != kernel as usize => Err(symbol_error(
                "exports a symbol that is not the kernel its table entry points to (when another library loaded \
                 with RTLD_GLOBAL exports the same name, it interposes its kernel: export kernels with TFL_EXPORT or \
                 link with -Wl,-Bsymbolic-functions)"
                    .to_owned(),
            )),
            Some(_) => Ok(()),
        }
    }
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
        if ffi::bootstrap_address(&library).is_none() {
            continue;
        }
        if let Ok(lib) = Opening::start(object, Some(library), options).finish() {
            if seen.insert(lib.api_address) {
                found.push(lib);
            }
        }
    }
    found
}

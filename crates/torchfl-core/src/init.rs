//! The last loading stages: `initialize` and `device_count`
//! ([`Stage::Initialize`]), every device's properties ([`Stage::Devices`])
//! and every device's default stream ([`Stage::Streams`]), then the plugin
//! joins the process' list of initialized plugins.
//!
//! [`initialize`] runs them in a row; `torchfl-abi verify` runs them through
//! an [`Initialization`], one per check.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::{Error, PluginPart, Result};
use crate::ffi::probe::MemoryMap;
use crate::inflight;
use crate::open::{LoadOptions, PluginLibrary};
use crate::plugin::Plugin;
use crate::types::{Capabilities, DeviceProperties, Finding, Stage};
use crate::validate;

/// Every plugin initialized in this process (plugins are never unloaded,
/// so this only grows), and the libraries being initialized right now.
///
/// The lock is never held while plugin code runs: a plugin that is slow to
/// initialize, or never returns, must not block other plugins. A library
/// being initialized is *claimed*; a second thread initializing the same
/// library waits on [`CLAIM_RELEASED`] instead of calling `initialize`
/// twice.
static STATE: Mutex<State> = Mutex::new(State { loaded: Vec::new(), claimed: Vec::new() });
static CLAIM_RELEASED: Condvar = Condvar::new();

struct State {
    loaded: Vec<Arc<Plugin>>,
    /// `api_address` of each library being initialized.
    claimed: Vec<usize>,
}

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Plugins initialized so far in this process, in load order.
pub fn loaded_plugins() -> Vec<Arc<Plugin>> {
    state().loaded.clone()
}

/// Initializes an opened library, or returns the existing [`Plugin`] when
/// this library was initialized before (plugins initialize once per process).
pub fn initialize(library: PluginLibrary, options: &LoadOptions) -> Result<Arc<Plugin>> {
    // Before the lock: a thread of the parent may have held it at fork time.
    crate::fork::check_not_forked("initialize a plugin")?;
    Initialization::new(library, options)?.finish()
}

/// This thread's claim on initializing one library; released when dropped,
/// whether initialization succeeded, failed or panicked.
#[derive(Debug)]
struct Claim {
    address: usize,
}

impl Drop for Claim {
    fn drop(&mut self) {
        state().claimed.retain(|&a| a != self.address);
        CLAIM_RELEASED.notify_all();
    }
}

/// Initializing an opened library, stage by stage: [`Stage::Initialize`]
/// through [`Stage::Streams`].
#[derive(Debug)]
pub struct Initialization {
    library: PluginLibrary,
    options: String,
    /// The plugin, when this library was initialized before in this process:
    /// the stages then have nothing to do.
    existing: Option<Arc<Plugin>>,
    /// Held from [`Initialization::new`] until the plugin is recorded or
    /// this is dropped.
    claim: Option<Claim>,
    next: Option<Stage>,
    failed: bool,
    device_count: i32,
    devices: Vec<DeviceProperties>,
    warnings: Vec<Finding>,
    /// The collectives table (ABI 1.3), once [`Stage::Initialize`] ran and
    /// found one.
    collectives: Option<crate::ffi::CollTable>,
    /// The graphs table (ABI 1.7), likewise.
    graphs: Option<torchfl_ffi::TFL_Graphs>,
    /// The activity table (ABI 1.8), likewise.
    activity: Option<torchfl_ffi::TFL_Activity>,
    /// Where the plugin's memory is, once initialize has run (it may map
    /// more while initializing).
    map: MemoryMap,
}

impl Initialization {
    /// Prepares to initialize `library`; nothing runs yet.
    ///
    /// # Errors
    /// [`Error::AlreadyInitialized`] when the library was initialized in
    /// this process with other options.
    pub fn new(library: PluginLibrary, options: &LoadOptions) -> Result<Self> {
        let address = library.api_address;
        let mut state = state();
        let existing = loop {
            if let Some(existing) = state.loaded.iter().find(|p| p.library().api_address == address) {
                break Some(Arc::clone(existing));
            }
            if !state.claimed.contains(&address) {
                state.claimed.push(address);
                break None;
            }
            // Another thread is initializing this library: its outcome
            // decides (a plugin, or a failure that lets us try).
            let _waiting = inflight::enter_stage(
                inflight::intern(&library.label),
                c"initialize (waiting for another thread initializing the same library)",
            );
            state = CLAIM_RELEASED.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        };
        drop(state);
        if let Some(existing) = &existing {
            if existing.init_options() != options.init_options {
                return Err(Error::AlreadyInitialized {
                    plugin: existing.label().to_owned(),
                    existing: existing.init_options().to_owned(),
                    requested: options.init_options.clone(),
                });
            }
        }
        Ok(Self {
            device_count: existing.as_ref().map_or(0, |p| p.device_count()),
            next: if existing.is_some() { None } else { Some(Stage::Initialize) },
            claim: existing.is_none().then_some(Claim { address }),
            existing,
            library,
            options: options.init_options.clone(),
            failed: false,
            devices: Vec::new(),
            warnings: Vec::new(),
            collectives: None,
            graphs: None,
            activity: None,
            map: MemoryMap::empty(),
        })
    }

    /// Runs every stage up to and including `last` that has not run yet.
    /// After a failure, every later call fails too.
    pub fn run_to(&mut self, last: Stage) -> Result<()> {
        crate::fork::check_not_forked("initialize a plugin")?;
        while let Some(stage) = self.next.filter(|&s| s <= last) {
            if self.failed {
                return Err(Error::InvalidCall {
                    plugin: self.library.label.clone(),
                    reason: "initialization stopped at an earlier stage".to_owned(),
                });
            }
            let _in_flight =
                crate::inflight::enter_stage(crate::inflight::intern(&self.library.label), stage.call());
            let result = match stage {
                Stage::Initialize => self.run_initialize(),
                Stage::Devices => self.check_devices(),
                _ => self.check_streams(),
            };
            if let Err(e) = result {
                self.failed = true;
                return Err(e);
            }
            self.next = Stage::ALL.iter().copied().find(|&s| s > stage);
        }
        Ok(())
    }

    /// The number of devices, once [`Stage::Initialize`] ran.
    pub fn device_count(&self) -> i32 {
        self.device_count
    }

    /// The devices' properties, once [`Stage::Devices`] ran.
    pub fn devices(&self) -> &[DeviceProperties] {
        &self.devices
    }

    /// What the stages run so far warned about.
    pub fn warnings(&self) -> &[Finding] {
        &self.warnings
    }

    /// The plugin's label.
    pub fn label(&self) -> &str {
        &self.library.label
    }

    /// The library being initialized (its identity, op table and optional
    /// entries, such as [`PluginLibrary::probe_devices`]).
    pub fn library(&self) -> &PluginLibrary {
        &self.library
    }

    /// Runs the remaining stages and returns the initialized plugin, now
    /// one of [`loaded_plugins`].
    pub fn finish(mut self) -> Result<Arc<Plugin>> {
        self.run_to(Stage::Streams)?;
        if let Some(existing) = self.existing {
            return Ok(existing);
        }
        if self.next.is_some() {
            return Err(Error::InvalidCall {
                plugin: self.library.label,
                reason: "initialization did not complete".to_owned(),
            });
        }
        let mut warnings = self.library.warnings.clone();
        warnings.extend(self.warnings);
        let plugin = Arc::new(Plugin::new(
            self.library,
            self.device_count,
            self.options,
            warnings,
            self.collectives,
            self.graphs,
            self.activity,
        ));
        state().loaded.push(Arc::clone(&plugin));
        // Only now may a waiting thread look again: it finds the plugin.
        drop(self.claim);
        Ok(plugin)
    }

    fn invalid(&self, part: PluginPart, reason: String) -> Error {
        Error::InvalidPlugin { plugin: self.library.label.clone(), part, reason }
    }

    fn run_initialize(&mut self) -> Result<()> {
        let library = &mut self.library;
        crate::fork::note_initializing(&library.label);
        library
            .table
            .initialize(&self.options)
            .map_err(|status| Error::InitFailed { plugin: library.label.clone(), status })?;
        self.map = MemoryMap::snapshot();
        // Capabilities may depend on the options: the ABI makes them final
        // only once initialize has returned, so read them again. The
        // identity itself was validated before and cannot change.
        if let Ok(info) = library.table.info(&self.map) {
            library.info.capabilities = Capabilities::from_bits(info.capabilities);
        }
        self.device_count = library.table.device_count().map_err(|status| Error::RuntimeCall {
            plugin: library.label.clone(),
            function: "device_count",
            status,
        })?;
        // Extension tables (collectives, ABI 1.3; graphs, 1.7; activity, 1.8) are asked
        // for once, after initialize, as the header says; a malformed one
        // refuses the plugin like a malformed function table.
        let minor = library.negotiated.effective.minor;
        self.collectives =
            extension(&library.label, "collectives", library.table.collectives(&self.map, minor))?;
        self.graphs = extension(&library.label, "native graphs", library.table.graphs(&self.map, minor))?;
        self.activity =
            extension(&library.label, "activity records", library.table.activity(&self.map, minor))?;
        Ok(())
    }

    fn check_devices(&mut self) -> Result<()> {
        let count = validate::device_count(self.device_count)
            .map_err(|reason| self.invalid(PluginPart::Devices, reason))?;
        for device in 0..count {
            let minor = self.library.negotiated.effective.minor;
            let (name, p) =
                self.library.table.device_properties(&self.map, device, minor).map_err(|status| {
                    self.invalid(PluginPart::Devices, format!("device_properties({device}) failed: {status}"))
                })?;
            let name_text = name.clone().ok().flatten();
            let warnings = validate::device_properties(device, name, p.total_memory)
                .map_err(|reason| self.invalid(PluginPart::Devices, reason))?;
            self.warnings.extend(warnings);
            self.devices.push(DeviceProperties {
                name: name_text.unwrap_or_else(|| format!("{}:{device}", self.library.info.name)),
                total_memory: p.total_memory,
                compute_units: p.compute_units,
                memory_alignment: p.memory_alignment,
                capability: (p.capability_major, p.capability_minor),
            });
        }
        Ok(())
    }

    fn check_streams(&mut self) -> Result<()> {
        for device in 0..self.device_count {
            let stream = self.library.table.default_stream(device).map_err(|status| {
                self.invalid(PluginPart::Streams, format!("default_stream({device}) failed: {status}"))
            })?;
            if stream.is_null() {
                return Err(self.invalid(
                    PluginPart::Streams,
                    format!(
                        "default_stream({device}) returned NULL: every device needs a default stream, a non-NULL \
                         handle the plugin owns for the life of the process"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What an extension lookup means for loading: the table, `None` (logged
/// with the reason) when the plugin has none, an error when it is malformed.
fn extension<T>(
    label: &str,
    what: &str,
    lookup: std::result::Result<crate::ffi::Extension<T>, String>,
) -> Result<Option<T>> {
    match lookup {
        Ok(crate::ffi::Extension::Present(t)) => Ok(Some(t)),
        Ok(crate::ffi::Extension::Absent(why)) => {
            crate::log::plugin_message(label, torchfl_ffi::TFL_LOG_DEBUG, &format!("no {what}: {why}"));
            Ok(None)
        }
        Err(reason) => {
            Err(Error::InvalidPlugin { plugin: label.to_owned(), part: PluginPart::FunctionTable, reason })
        }
    }
}

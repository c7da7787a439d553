//! Finding the plugin for a device name.
//!
//! Sources, in order:
//! 1. `TORCH_FL_PLUGIN_PATH`: `:`-separated files and directories. A
//!    directory contributes its shared libraries in name order. Each
//!    candidate is opened and validated (not initialized) and the first
//!    whose `TFL_PluginInfo.name` equals the requested name wins.
//! 2. Libraries already loaded into the process that export the bootstrap
//!    symbol, e.g. with `ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)`.
//! 3. Extra candidates registered by the embedder: the Python package adds
//!    installed plugin packages (entry points `torch_fl.plugins`) here, then
//!    its bundled simulated plugin for `sim`.
//!
//! Candidates that were opened but not chosen stay loaded (plugins are
//! never unloaded) but are never initialized.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::loader::{self, LoadOptions, PluginLibrary};
use crate::plugin::Plugin;

/// The environment variable listing plugin files and directories.
pub const PLUGIN_PATH_ENV: &str = "TORCH_FL_PLUGIN_PATH";

/// Where a plugin was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `TORCH_FL_PLUGIN_PATH` (the file).
    PluginPath(PathBuf),
    /// Already loaded into the process.
    Preloaded,
    /// An embedder-provided candidate, with its description.
    Extra(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PluginPath(p) => write!(f, "{PLUGIN_PATH_ENV} ({})", p.display()),
            Self::Preloaded => f.write_str("a library already loaded in the process"),
            Self::Extra(what) => f.write_str(what),
        }
    }
}

/// A configured search.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    plugin_path: Vec<PathBuf>,
    /// (name, path, description, init options replacing the caller's).
    extra: Vec<(String, PathBuf, String, Option<String>)>,
}

fn is_shared_library(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.ends_with(".so") || name.contains(".so.") || name.ends_with(".dylib") || name.ends_with(".dll")
}

impl Discovery {
    /// A search over `TORCH_FL_PLUGIN_PATH` as currently set.
    pub fn from_env() -> Self {
        Self::with_plugin_path(&std::env::var(PLUGIN_PATH_ENV).unwrap_or_default())
    }

    /// A search over a `TORCH_FL_PLUGIN_PATH`-style value.
    pub fn with_plugin_path(value: &str) -> Self {
        let plugin_path = value.split(':').filter(|s| !s.trim().is_empty()).map(PathBuf::from).collect();
        Self { plugin_path, extra: Vec::new() }
    }

    /// Adds a candidate file for `name`, tried after the other sources
    /// (the seam for bundled plugins and package entry points).
    pub fn add_candidate(&mut self, name: &str, path: PathBuf, description: &str) {
        self.extra.push((name.to_owned(), path, description.to_owned(), None));
    }

    /// [`Discovery::add_candidate`] with the plugin options this candidate
    /// is initialized with (a plugin package declares them), instead of the
    /// options passed to [`Discovery::find`].
    pub fn add_candidate_with_options(
        &mut self,
        name: &str,
        path: PathBuf,
        description: &str,
        init_options: &str,
    ) {
        self.extra.push((name.to_owned(), path, description.to_owned(), Some(init_options.to_owned())));
    }

    /// The files `TORCH_FL_PLUGIN_PATH` contributes, in search order.
    /// Entries that do not exist are kept, so that opening them reports it.
    pub fn plugin_path_files(&self) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for entry in &self.plugin_path {
            if entry.is_dir() {
                let mut in_dir: Vec<PathBuf> = std::fs::read_dir(entry)
                    .map(|rd| {
                        rd.filter_map(|e| e.ok().map(|e| e.path()))
                            .filter(|p| p.is_file() && is_shared_library(p))
                            .collect()
                    })
                    .unwrap_or_default();
                in_dir.sort();
                files.extend(in_dir);
            } else {
                files.push(entry.clone());
            }
        }
        files
    }

    /// Finds, validates and initializes the plugin named `name`.
    pub fn find(&self, name: &str, options: &LoadOptions) -> Result<(Arc<Plugin>, Origin)> {
        // Here rather than per file: a refused file must not read as "not loadable".
        crate::fork::check_not_forked(&format!("load the plugin '{name}'"))?;
        let mut searched = Vec::new();
        for file in self.plugin_path_files() {
            match PluginLibrary::open(&file, options) {
                Ok(lib) if lib.info().name == name => {
                    return Ok((loader::initialize(lib, options)?, Origin::PluginPath(file)));
                }
                Ok(lib) => searched.push(format!("{} (plugin '{}')", file.display(), lib.info().name)),
                Err(e) => searched.push(format!("{} (not loadable: {})", file.display(), e.kind())),
            }
        }
        if let Some(plugin) = loader::load_preloaded(name, options)? {
            return Ok((plugin, Origin::Preloaded));
        }
        searched.push("libraries loaded in this process".to_owned());
        for (candidate, path, description, init_options) in &self.extra {
            if candidate == name {
                let own;
                let options = match init_options {
                    Some(o) => {
                        own = LoadOptions { init_options: o.clone(), ..options.clone() };
                        &own
                    }
                    None => options,
                };
                return Ok((loader::load(path, options)?, Origin::Extra(description.clone())));
            }
        }
        Err(Error::PluginNotFound { name: name.to_owned(), searched })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_path_splits_and_expands_directories_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["libb.so", "liba.so", "notes.txt", "libc.so.1"] {
            std::fs::write(dir.path().join(f), b"").unwrap();
        }
        let value = format!("/explicit/libx.so::{}:", dir.path().display());
        let files = Discovery::with_plugin_path(&value).plugin_path_files();
        let names: Vec<String> =
            files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["libx.so", "liba.so", "libb.so", "libc.so.1"]);
    }

    #[test]
    fn not_found_names_every_source() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("libjunk.so");
        std::fs::write(&junk, b"not a library").unwrap();
        let d = Discovery::with_plugin_path(&junk.display().to_string());
        let err = d.find("nonexistent_device", &LoadOptions::default()).unwrap_err();
        assert_eq!(err.kind(), "PluginNotFound");
        let msg = err.to_string();
        assert!(msg.contains("libjunk.so (not loadable: NotASharedLibrary)"), "{msg}");
        assert!(msg.contains("libraries loaded in this process"), "{msg}");
    }
}

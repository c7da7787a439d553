//! Loading a plugin: [`load`] runs every stage, from the file to the
//! default streams, and [`load_preloaded`] does the same for a library
//! already in the process.
//!
//! The stages are an [`Opening`]'s (the file, `dlopen`, the handshake, the
//! function table, the identity and the op table), then an
//! [`Initialization`]'s (`initialize`, devices, default streams);
//! `torchfl-abi verify` runs each stage as one of its checks, so a crash or
//! a refusal is reported against the stage that caused it. Both run the
//! same code, so they cannot disagree (see [`crate::validate`]).
//!
//! Everything about loading is re-exported here, so a caller needs one
//! path; the stages themselves live below this module, which only adds the
//! entry points that run them all.

use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
pub use crate::init::{initialize, loaded_plugins, Initialization};
pub use crate::open::{preloaded_libraries, LoadOptions, Opening, PluginLibrary};
use crate::plugin::Plugin;

/// Loads, validates and initializes the plugin at `path`. Loading the same
/// library again (by any path) returns the same [`Plugin`].
pub fn load(path: &Path, options: &LoadOptions) -> Result<Arc<Plugin>> {
    initialize(PluginLibrary::open(path, options)?, options)
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

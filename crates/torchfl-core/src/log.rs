//! Where plugin log messages (`TFL_HostApi.log`) go.
//!
//! By default warnings and errors go to stderr and debug/info messages are
//! dropped unless `TORCH_FL_LOG` contains `plugin` (or `all`). Embedders
//! such as the Python binding install their own sink to route messages into
//! their logging system.

use std::sync::RwLock;

/// Severity of a plugin message, as `TFL_LogLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `TFL_LOG_DEBUG`: shown only when `TORCH_FL_LOG` asks for it.
    Debug,
    /// `TFL_LOG_INFO`: shown only when `TORCH_FL_LOG` asks for it.
    Info,
    /// `TFL_LOG_WARNING`: always shown.
    Warning,
    /// `TFL_LOG_ERROR`: always shown.
    Error,
}

impl Level {
    /// Reads a `TFL_LogLevel`. Out-of-range values are clamped (below debug
    /// reads as debug, above error as error) rather than rejected: a log
    /// call has no way to report a bad argument back to the plugin.
    pub fn from_raw(level: i32) -> Self {
        match level {
            i32::MIN..=torchfl_ffi::TFL_LOG_DEBUG => Self::Debug,
            torchfl_ffi::TFL_LOG_INFO => Self::Info,
            torchfl_ffi::TFL_LOG_WARNING => Self::Warning,
            _ => Self::Error,
        }
    }
}

type Sink = Box<dyn Fn(&str, Level, &str) + Send + Sync>;

static SINK: RwLock<Option<Sink>> = RwLock::new(None);

/// Replaces the sink; `None` restores the default.
pub fn set_sink(sink: Option<Sink>) {
    let mut guard = SINK.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    *guard = sink;
}

fn verbose() -> bool {
    std::env::var("TORCH_FL_LOG")
        .is_ok_and(|v| v.split(',').any(|t| t.trim() == "plugin" || t.trim() == "all"))
}

pub(crate) fn plugin_message(plugin: &str, level: i32, message: &str) {
    let level = Level::from_raw(level);
    let guard = SINK.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    match guard.as_ref() {
        Some(sink) => sink(plugin, level, message),
        None if level >= Level::Warning || verbose() => {
            eprintln!("[torch-fl] plugin {plugin}: {level:?}: {message}");
        }
        None => {}
    }
}

//! The log sink: where the simulator's warnings go.
//!
//! It is its own module because both the [`Runtime`](crate::Runtime) that
//! is given a logger and the stream workers that report asynchronous
//! failures through it need it; a stream must not depend on the runtime
//! that owns it.

use std::sync::Arc;

/// Severity of a log message, as `TFL_LogLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// `TFL_LOG_DEBUG`
    Debug,
    /// `TFL_LOG_INFO`
    Info,
    /// `TFL_LOG_WARNING`
    Warning,
    /// `TFL_LOG_ERROR`
    Error,
}

/// A log sink (the host's `log` service, or a test's).
#[derive(Clone)]
pub struct Logger(Arc<LogFn>);

type LogFn = dyn Fn(LogLevel, &str) + Send + Sync;

impl Logger {
    /// Wraps a function that receives every message.
    pub fn new(f: impl Fn(LogLevel, &str) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
    pub(crate) fn log(&self, level: LogLevel, message: &str) {
        (self.0)(level, message);
    }
    pub(crate) fn warning(&self, message: &str) {
        self.log(LogLevel::Warning, message);
    }
}

impl std::fmt::Debug for Logger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Logger")
    }
}

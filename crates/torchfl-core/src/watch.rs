//! Loading plugins on a thread of their own, so that a caller can stop
//! waiting: a plugin whose constructors, handshake or `initialize` never
//! return must not freeze the host (`TORCH_FL_INIT_TIMEOUT`), and an
//! interactive user must be able to interrupt the wait (Ctrl-C).
//!
//! A thread cannot be killed safely, so a plugin that is stuck stays stuck:
//! its thread is left behind (named `torchfl-load`) and the library stays
//! marked as initializing, so a later attempt to initialize the same
//! library waits for it instead of calling `initialize` twice.

use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::inflight::{self, Progress};

/// The environment variable bounding how long registration waits for a
/// plugin to load and initialize, in seconds; `0` waits forever.
pub const INIT_TIMEOUT_ENV: &str = "TORCH_FL_INIT_TIMEOUT";

/// [`INIT_TIMEOUT_ENV`]'s default, in seconds.
pub const DEFAULT_INIT_TIMEOUT_SECS: f64 = 60.0;

/// The configured time limit: `None` waits forever.
///
/// # Errors
/// [`Error::InvalidSetting`] when the variable is not a non-negative number
/// of seconds.
pub fn init_timeout() -> Result<Option<Duration>> {
    let Some(raw) = std::env::var_os(INIT_TIMEOUT_ENV) else {
        return Ok(Some(Duration::from_secs_f64(DEFAULT_INIT_TIMEOUT_SECS)));
    };
    let text = raw.to_string_lossy();
    match text.trim().parse::<f64>() {
        Ok(0.0) => Ok(None),
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        _ => Err(Error::InvalidSetting {
            name: INIT_TIMEOUT_ENV.to_owned(),
            value: text.into_owned(),
            expected: format!(
                "a number of seconds > 0 (default {DEFAULT_INIT_TIMEOUT_SECS}), or 0 to wait without limit"
            ),
        }),
    }
}

/// Work running on a `torchfl-load` thread.
#[derive(Debug)]
pub struct Loading<T> {
    /// In a mutex so that a `&Loading` can be sent to a waiting thread.
    result: Mutex<mpsc::Receiver<Result<T>>>,
    progress: Progress,
    started: Instant,
    /// Describes the work while the thread has not reached a plugin.
    what: String,
}

/// Starts `work` on a new `torchfl-load` thread. `what` names the work in
/// a timeout error until the thread reports a plugin stage.
///
/// # Errors
/// [`Error::InvalidCall`] when the thread cannot be started.
pub fn spawn<T, F>(what: &str, work: F) -> Result<Loading<T>>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let (sender, result) = mpsc::channel();
    let progress = Progress::default();
    let observed = Progress::clone(&progress);
    std::thread::Builder::new()
        .name("torchfl-load".to_owned())
        .spawn(move || {
            inflight::observe(observed);
            // The receiver is gone when the caller stopped waiting: the
            // result (a plugin already recorded as loaded) is kept there.
            let _ = sender.send(work());
        })
        .map_err(|e| Error::InvalidCall {
            plugin: what.to_owned(),
            reason: format!("could not start a thread to load it: {e}"),
        })?;
    Ok(Loading { result: Mutex::new(result), progress, started: Instant::now(), what: what.to_owned() })
}

impl<T> Loading<T> {
    /// Waits up to `slice` for the result; `None` while still running.
    pub fn wait(&self, slice: Duration) -> Option<Result<T>> {
        let receiver = self.result.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match receiver.recv_timeout(slice) {
            Ok(result) => Some(result),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Err(Error::InvalidCall {
                plugin: self.what.clone(),
                reason: "the loading thread ended without a result (it panicked)".to_owned(),
            })),
        }
    }

    /// How long the work has been running.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The error for giving up after `limit`: names the plugin and the call
    /// it is stuck in.
    pub fn timed_out(&self, limit: Duration) -> Error {
        let stage = self.progress.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let (plugin, call) = stage.unwrap_or_else(|| (self.what.clone(), "loading".to_owned()));
        Error::InitTimeout { plugin, call, seconds: limit.as_secs_f64() }
    }

    /// Waits until done, or until `limit` (`None`: no limit) has passed.
    /// `interrupted` is asked between slices of `slice` and stops the wait
    /// with its error (e.g. a pending `KeyboardInterrupt`).
    pub fn wait_with<E>(
        self,
        limit: Option<Duration>,
        slice: Duration,
        mut wait: impl FnMut(&Self, Duration) -> Option<Result<T>>,
        mut interrupted: impl FnMut() -> std::result::Result<(), E>,
    ) -> std::result::Result<Result<T>, E> {
        loop {
            if let Some(result) = wait(&self, slice) {
                return Ok(result);
            }
            interrupted()?;
            if let Some(limit) = limit {
                if self.elapsed() >= limit {
                    return Ok(Err(self.timed_out(limit)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back() {
        let job = spawn("quick", || Ok(7)).unwrap();
        let out = job.wait_with(None, Duration::from_millis(10), |j, s| j.wait(s), || Ok::<(), ()>(()));
        assert_eq!(out.unwrap().unwrap(), 7);
    }

    #[test]
    fn a_stuck_stage_is_named_after_the_limit() {
        let (release, stuck) = mpsc::channel::<()>();
        let job = spawn("stuck", move || {
            let _s = inflight::enter_stage(inflight::intern("'hang' (/h.so)"), c"initialize");
            let _ = stuck.recv();
            Ok(())
        })
        .unwrap();
        let out = job.wait_with(
            Some(Duration::from_millis(50)),
            Duration::from_millis(10),
            |j, s| j.wait(s),
            || Ok::<(), ()>(()),
        );
        let err = out.unwrap().unwrap_err();
        assert!(
            matches!(&err, Error::InitTimeout { plugin, call, .. }
            if plugin == "'hang' (/h.so)" && call == "initialize"),
            "{err}"
        );
        drop(release);
    }

    #[test]
    fn an_interruption_stops_the_wait() {
        let (_keep, stuck) = mpsc::channel::<()>();
        let job = spawn("stuck", move || {
            let _ = stuck.recv();
            Ok(())
        })
        .unwrap();
        let mut asked = 0;
        let out = job.wait_with(
            None,
            Duration::from_millis(5),
            |j, s| j.wait(s),
            || {
                asked += 1;
                if asked == 3 {
                    Err("interrupted")
                } else {
                    Ok(())
                }
            },
        );
        assert_eq!(out.unwrap_err(), "interrupted");
    }
}

//! Fork safety: a child forked from a process that initialized a plugin
//! never calls that plugin.
//!
//! A plugin's worker threads exist only in the process that started them,
//! and a lock one of them held at `fork()` stays held forever in the child:
//! a forked child that enqueues work waits for threads that do not exist,
//! and hangs. CUDA refuses such a child ("Cannot re-initialize CUDA in
//! forked subprocess"); torch-fl does the same. A `pthread_atfork` child
//! handler, registered before the first plugin is initialized, marks the
//! child as being *in a bad fork*, and every path into a plugin checks the
//! mark first ([`check_not_forked`]: one relaxed atomic load) and returns
//! [`Error::BadFork`] instead of calling it. Destructors leak rather than
//! call the plugin (see [`in_bad_fork`]). The mark is kept here, below
//! every module that calls a plugin; a loaded plugin's calls pass it at one
//! gate, the plugin's function table (see [`crate::plugin`]).
//!
//! A process forked before any plugin was initialized is unaffected: it can
//! load plugins of its own. The C++ shim keeps the same mark for the device
//! (`cpp_shim/src/runtime/fork.h`), since operators on inherited device tensors
//! reach it without passing through this crate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Once, OnceLock};

use crate::error::{Error, Result};

/// A plugin's `initialize` has been called in this process (or in the
/// process it was forked from).
static INITIALIZED: AtomicBool = AtomicBool::new(false);
/// This process was forked after a plugin had been initialized.
static IN_BAD_FORK: AtomicBool = AtomicBool::new(false);
/// How messages name the first plugin initialized. Written once, before
/// [`INITIALIZED`] is set, and read without a lock (a lock held by another
/// thread at fork time would deadlock the child).
static FIRST_PLUGIN: OnceLock<String> = OnceLock::new();
static HANDLER: Once = Once::new();

/// Runs in the child of every `fork()`, before `fork()` returns there.
/// Only atomic loads and stores: nothing else is safe at that point.
extern "C" fn on_fork_child() {
    if INITIALIZED.load(Ordering::Relaxed) {
        IN_BAD_FORK.store(true, Ordering::Relaxed);
    }
}

/// Records that the plugin labelled `label` is about to be initialized.
/// Called before its `initialize`, so that a fork while it starts its
/// threads also counts.
pub(crate) fn note_initializing(label: &str) {
    HANDLER.call_once(|| {
        #[cfg(unix)]
        {
            // SAFETY: the handler is an `extern "C"` function with no
            // arguments that lives for the whole process and only touches
            // atomics. pthread_atfork fails only without memory for the
            // registration; the check then cannot mark children, which is
            // what a platform without fork gets too.
            let _ = unsafe { libc::pthread_atfork(None, None, Some(on_fork_child)) };
        }
    });
    let _ = FIRST_PLUGIN.set(label.to_owned());
    INITIALIZED.store(true, Ordering::SeqCst);
}

/// Whether this process is a child forked after a plugin was initialized
/// (in it or in an ancestor). Such a process must not call any plugin;
/// destructors of plugin objects leak instead.
#[inline]
pub fn in_bad_fork() -> bool {
    IN_BAD_FORK.load(Ordering::Relaxed)
}

/// Whether a plugin is initialized and usable in this process: false
/// before the first plugin is initialized, and in a bad fork.
pub fn initialized() -> bool {
    INITIALIZED.load(Ordering::Relaxed) && !in_bad_fork()
}

/// `Ok` unless this process is in a bad fork; then [`Error::BadFork`]
/// saying that `operation` (e.g. `"call device_synchronize"`) is refused
/// and what to do instead.
#[inline]
pub fn check_not_forked(operation: &str) -> Result<()> {
    if in_bad_fork() {
        return Err(bad_fork(operation));
    }
    Ok(())
}

/// The error refusing `operation` in a bad fork.
#[cold]
pub(crate) fn bad_fork(operation: &str) -> Error {
    Error::BadFork {
        operation: operation.to_owned(),
        plugin: FIRST_PLUGIN.get().cloned().unwrap_or_else(|| "(being initialized at fork time)".to_owned()),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// Forks; the child reports `probe()` through its exit status.
    fn in_child(probe: fn() -> bool) -> bool {
        // SAFETY: the child only calls `probe` (atomic loads) and `_exit`.
        match unsafe { libc::fork() } {
            -1 => panic!("fork failed"),
            0 => {
                let code = i32::from(probe());
                // SAFETY: ends the child without running the harness's
                // cleanup, which belongs to the parent.
                unsafe { libc::_exit(code) }
            }
            pid => {
                let mut status = 0;
                // SAFETY: `pid` is our child; `status` is writable.
                assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
                assert!(libc::WIFEXITED(status));
                libc::WEXITSTATUS(status) == 1
            }
        }
    }

    #[test]
    fn a_child_forked_after_initialization_is_in_a_bad_fork() {
        // Tests share the process: this is the only one that initializes.
        assert!(!in_child(in_bad_fork), "no plugin initialized yet: the child may use plugins");
        note_initializing("'fake' (/x/libfake.so)");
        assert!(initialized() && !in_bad_fork());
        assert!(check_not_forked("anything").is_ok());
        assert!(in_child(in_bad_fork));
        assert!(in_child(|| !initialized()));
        assert!(in_child(|| {
            let e = check_not_forked("call device_synchronize").unwrap_err();
            let m = e.to_string();
            e.kind() == "BadFork"
                && m.contains("call device_synchronize")
                && m.contains("'fake' (/x/libfake.so)")
                && m.contains("'spawn'")
        }));
    }
}

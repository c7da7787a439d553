//! Which plugin call each thread is running, so that a plugin that kills
//! the process, or never returns, is named.
//!
//! A plugin is native code in the user's process: a segfault, an `abort()`
//! or an `exit()` in it ends the process with nothing that says which
//! plugin did it, and a hung `initialize` looks like a hung script. Every
//! call into a plugin therefore records `(plugin, call)` in a per-thread
//! slot for its duration ([`enter`]; the C++ shim writes the same slot
//! through [`torchfl_inflight_slot`] around kernels and runtime calls).
//!
//! Two readers use the record:
//!
//! - the crash report (`ffi::crash`, installed by the loader before a
//!   plugin's code first runs): a handler for the fatal signals, chained
//!   with whatever was installed before (Python's `faulthandler`
//!   included), and an `atexit` hook print one line naming the plugin and
//!   the call when the dying thread was inside a plugin. The record does
//!   not install its readers, so every layer that calls a plugin can write
//!   it without depending on them;
//! - the load watchdog ([`crate::watch`]): a thread loading plugins also
//!   publishes its current stage, so a caller that gave up waiting can say
//!   where the plugin is stuck.
//!
//! Recording costs two stores per call: the slot is a `const`-initialized
//! thread-local without destructor, which is also what makes reading it
//! from a signal handler sound.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::sync::{Arc, Mutex};

/// One thread's call in progress: NUL-terminated strings that live for the
/// whole process, or NULL when the thread is not inside a plugin. The C++
/// shim declares the same struct (`cpp_shim/src/runtime/inflight.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct InFlight {
    /// How messages name the plugin: `'sim' (/path/libtorchfl_sim.so)`.
    pub plugin: *const c_char,
    /// The ABI function or operator being called, e.g. `initialize`.
    pub call: *const c_char,
}

impl InFlight {
    const NONE: Self = Self { plugin: std::ptr::null(), call: std::ptr::null() };

    /// Whether a plugin call is recorded.
    pub fn is_some(&self) -> bool {
        !self.plugin.is_null()
    }
}

thread_local! {
    static CURRENT: Cell<InFlight> = const { Cell::new(InFlight::NONE) };
    /// Where a watched loading thread publishes its stage (see
    /// [`crate::watch`]); `None` on every other thread.
    static OBSERVER: RefCell<Option<Progress>> = const { RefCell::new(None) };
}

/// A loading thread's latest `(plugin, call)`, shared with its watcher.
pub(crate) type Progress = Arc<Mutex<Option<(String, String)>>>;

/// The calling thread's in-flight slot. The C++ shim caches the pointer per
/// thread and writes the slot around each plugin call; it stays valid for
/// the thread's lifetime.
pub extern "C" fn torchfl_inflight_slot() -> *mut InFlight {
    CURRENT.with(Cell::as_ptr)
}

/// The calling thread's call in progress. Async-signal-safe: a plain read
/// of a `const` thread-local.
pub(crate) fn current() -> InFlight {
    CURRENT.with(Cell::get)
}

/// Restores the previous record when dropped (calls nest: a plugin's
/// `initialize` may be running while a host service records nothing new).
#[must_use = "the record is cleared when the scope is dropped"]
pub(crate) struct Scope {
    previous: InFlight,
}

impl Drop for Scope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

/// Records that this thread is calling `call` of `plugin` until the
/// returned scope is dropped.
pub(crate) fn enter(plugin: &'static CStr, call: &'static CStr) -> Scope {
    let previous = CURRENT.with(|c| c.replace(InFlight { plugin: plugin.as_ptr(), call: call.as_ptr() }));
    Scope { previous }
}

/// [`enter`] for a loading stage, which also tells a watcher (if this
/// thread has one) where loading is.
pub(crate) fn enter_stage(plugin: &'static CStr, call: &'static CStr) -> Scope {
    OBSERVER.with(|o| {
        if let Some(progress) = o.borrow().as_ref() {
            let mut p = progress.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            *p = Some((plugin.to_string_lossy().into_owned(), call.to_string_lossy().into_owned()));
        }
    });
    enter(plugin, call)
}

/// Makes this thread publish its loading stages to `progress`.
pub(crate) fn observe(progress: Progress) {
    OBSERVER.with(|o| *o.borrow_mut() = Some(progress));
}

/// `label` as a string that lives for the rest of the process. Plugins are
/// never unloaded, so each label is kept once; repeated labels (the same
/// plugin loaded again) reuse the first copy.
pub(crate) fn intern(label: &str) -> &'static CStr {
    static LABELS: Mutex<Option<HashMap<String, &'static CStr>>> = Mutex::new(None);
    let mut labels = LABELS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let labels = labels.get_or_insert_with(HashMap::new);
    if let Some(found) = labels.get(label) {
        return found;
    }
    // Interior NULs cannot occur in a label built from validated strings
    // and a path; replace them rather than fail a diagnostic.
    let owned = CString::new(label.replace('\0', "?")).unwrap_or_default();
    let leaked: &'static CStr = Box::leak(owned.into_boxed_c_str());
    labels.insert(label.to_owned(), leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        assert!(!current().is_some());
        let plugin = intern("'x' (/p.so)");
        {
            let _outer = enter(plugin, c"initialize");
            {
                let _inner = enter(plugin, c"device_count");
                // SAFETY: the slot holds the interned, NUL-terminated call name.
                assert_eq!(unsafe { CStr::from_ptr(current().call) }, c"device_count");
            }
            // SAFETY: as above.
            assert_eq!(unsafe { CStr::from_ptr(current().call) }, c"initialize");
        }
        assert!(!current().is_some());
    }

    #[test]
    fn labels_are_interned_once() {
        let a = intern("'dup' (/a.so)");
        let b = intern("'dup' (/a.so)");
        assert_eq!(a.as_ptr(), b.as_ptr());
    }

    #[test]
    fn the_slot_is_the_threads_record() {
        let slot = torchfl_inflight_slot();
        let plugin = intern("'slot' (/s.so)");
        // SAFETY: the slot is this thread's, valid while the thread lives.
        unsafe { *slot = InFlight { plugin: plugin.as_ptr(), call: c"add.Tensor".as_ptr() } };
        assert!(current().is_some());
        // SAFETY: as above.
        unsafe { *slot = InFlight::NONE };
        assert!(!current().is_some());
    }

    #[test]
    fn stages_reach_the_observer() {
        let progress: Progress = Arc::default();
        std::thread::spawn({
            let progress = Arc::clone(&progress);
            move || {
                observe(progress);
                let _s = enter_stage(intern("'obs' (/o.so)"), c"initialize");
            }
        })
        .join()
        .unwrap();
        let seen = progress.lock().unwrap().clone();
        assert_eq!(seen, Some(("'obs' (/o.so)".to_owned(), "initialize".to_owned())));
    }
}

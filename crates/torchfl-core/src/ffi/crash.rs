//! The crash report's handlers: fatal signals and `exit()` while a plugin
//! call is in flight (see [`crate::inflight`]).
//!
//! Only async-signal-safe work happens in the handler: a read of the
//! thread's in-flight record, `write(2)` of a line assembled in a stack
//! buffer, `sigaction` and `raise`.
//!
//! Chaining: the handler first calls whatever handler was installed before
//! it (Python's `faulthandler`, which dumps the Python traceback, or a Rust
//! runtime's), then writes its line, so the line naming the plugin is the
//! last thing printed; then it restores the default action and re-raises,
//! and the process dies of the original signal. `faulthandler`'s handler
//! returns here because it re-raises with the signal blocked (ours is
//! installed without `SA_NODEFER`). A previous handler that never returns
//! ends the process without the line.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void, CStr};
use std::mem::MaybeUninit;
use std::sync::Once;

use crate::inflight;

#[cfg(unix)]
const SIGNALS: [(c_int, &str); 5] = [
    (libc::SIGSEGV, "SIGSEGV"),
    (libc::SIGBUS, "SIGBUS"),
    (libc::SIGILL, "SIGILL"),
    (libc::SIGFPE, "SIGFPE"),
    (libc::SIGABRT, "SIGABRT"),
];

/// The handlers installed before ours, one per entry of `SIGNALS`.
/// Written once in [`install_handlers`] before our handler is installed,
/// then only read (by the handler).
#[cfg(unix)]
struct Previous(UnsafeCell<[MaybeUninit<libc::sigaction>; SIGNALS.len()]>);

// SAFETY: written only inside `install_handlers` (run once, under
// `install`'s `Once`) before any handler that reads it exists; read-only
// afterwards.
#[cfg(unix)]
unsafe impl Sync for Previous {}

#[cfg(unix)]
static PREVIOUS: Previous = Previous(UnsafeCell::new([const { MaybeUninit::uninit() }; SIGNALS.len()]));

/// Installs the crash report once per process: the fatal-signal handler
/// and the exit hook. Set `TORCH_FL_CRASH_REPORT=0` to leave the process'
/// signal handlers alone.
pub(crate) fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        if std::env::var_os("TORCH_FL_CRASH_REPORT").is_some_and(|v| v == "0") {
            return;
        }
        install_handlers();
    });
}

/// Installs the fatal-signal handler and the exit hook. Called once, by
/// [`install`].
fn install_handlers() {
    #[cfg(unix)]
    {
        for (i, &(signal, _)) in SIGNALS.iter().enumerate() {
            // SAFETY: a zeroed sigaction is a valid value to fill in.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_fatal_signal as *const () as usize;
            // SA_ONSTACK: runs on faulthandler's alternate stack when it set
            // one, so a stack overflow is reported too. No SA_NODEFER: a
            // re-raise inside the handler stays pending until it returns.
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            // SAFETY: `PREVIOUS` is written here only, before our handler
            // (its only reader) is installed for this signal; the pointer is
            // to element `i`, a valid `sigaction` slot. sigemptyset and
            // sigaction get valid pointers.
            unsafe {
                libc::sigemptyset(&mut action.sa_mask);
                let previous = (*PREVIOUS.0.get())[i].as_mut_ptr();
                if libc::sigaction(signal, std::ptr::null(), previous) != 0 {
                    continue;
                }
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
        // SAFETY: `on_exit` is an `extern "C" fn()` that lives for the whole
        // process. atexit fails only without memory; the report is then
        // missing at exit, nothing else.
        let _ = unsafe { libc::atexit(on_exit) };
    }
}

#[cfg(unix)]
extern "C" fn on_fatal_signal(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let Some(i) = SIGNALS.iter().position(|&(s, _)| s == signal) else { return };
    // SAFETY: element `i` was initialized by `install_handlers` before this
    // handler was installed for `signal`, and is never written again.
    let previous = unsafe { (*PREVIOUS.0.get())[i].assume_init_ref() };
    let handler = previous.sa_sigaction;
    if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
        if previous.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the kernel gave us `info` and `context` for this
            // signal; the previous handler was installed with SA_SIGINFO,
            // so it has the three-argument signature.
            let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(handler) };
            f(signal, info, context);
        } else {
            // SAFETY: installed without SA_SIGINFO: the one-argument form.
            let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(handler) };
            f(signal);
        }
    }
    report(SIGNALS[i].1, "fatal signal", "crashed");
    // SAFETY: a zeroed sigaction with SIG_DFL restores the default action;
    // raise() only queues the signal (blocked while this handler runs), so
    // the process dies of it as soon as the handler returns.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(signal, &default, std::ptr::null_mut());
        libc::raise(signal);
    }
}

#[cfg(unix)]
extern "C" fn on_exit() {
    report("exit()", "the process is exiting", "called exit()");
}

/// Writes `torch-fl: <event> (<what>) in plugin <label> during <call>: the
/// plugin <verb> ...` when this thread is inside a plugin call.
#[cfg(unix)]
fn report(what: &str, event: &str, verb: &str) {
    let record = inflight::current();
    if !record.is_some() {
        return;
    }
    let mut line = Line::new();
    line.push(b"\ntorch-fl: ");
    line.push(event.as_bytes());
    line.push(b" (");
    line.push(what.as_bytes());
    line.push(b") while plugin ");
    // SAFETY: the record holds interned NUL-terminated strings (see
    // `inflight::intern`) or NULL, checked by `is_some` / `push_c`.
    unsafe { line.push_c(record.plugin) };
    line.push(b" was running ");
    // SAFETY: as above.
    unsafe { line.push_c(record.call) };
    line.push(b": the plugin ");
    line.push(verb.as_bytes());
    line.push(b". Report it to the plugin's vendor; `torchfl-abi verify <plugin>` checks a plugin in a child process\n");
    line.write_stderr();
}

/// A fixed buffer: no allocation in a signal handler.
#[cfg(unix)]
struct Line {
    buf: [u8; 1024],
    len: usize,
}

#[cfg(unix)]
impl Line {
    fn new() -> Self {
        Self { buf: [0; 1024], len: 0 }
    }

    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    /// # Safety
    /// `s` is NULL or a NUL-terminated string.
    unsafe fn push_c(&mut self, s: *const std::ffi::c_char) {
        if s.is_null() {
            self.push(b"?");
        } else {
            // SAFETY: per the contract, `s` is NUL-terminated.
            self.push(unsafe { CStr::from_ptr(s) }.to_bytes());
        }
    }

    fn write_stderr(&self) {
        let mut written = 0;
        while written < self.len {
            // SAFETY: the range is inside `buf`; write(2) is async-signal-safe.
            let n = unsafe { libc::write(2, self.buf[written..].as_ptr().cast(), self.len - written) };
            if n <= 0 {
                return;
            }
            written += n as usize;
        }
    }
}

//! The child's side of the line protocol between `verify` and its
//! `__verify-child` process ([`crate::isolate`] has the whole design): the
//! prefix that marks protocol lines, writing one, and [`note`], which the
//! checks call to locate a crash or hang inside themselves. Apart from
//! [`crate::isolate`] so that the checks, which isolate runs, do not import
//! it back.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;

/// Marks the child's protocol lines on its stdout.
pub(crate) const PREFIX: &str = "@@torchfl-abi-verify@@ ";

/// Set in the child: [`note`] emits protocol lines.
static IN_CHILD: AtomicBool = AtomicBool::new(false);

/// Writes one protocol line on stdout.
pub(crate) fn emit(value: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    // A write error means the parent is gone: nothing left to report to.
    let _ = writeln!(out, "{PREFIX}{value}");
    let _ = out.flush();
}

/// Marks this process as the checking child: [`note`] emits from now on.
pub(crate) fn enter_child() {
    IN_CHILD.store(true, Ordering::Relaxed);
}

/// Records a step inside the running check, so that a crash or hang in it
/// can be located more precisely than by check. A no-op in-process.
pub(crate) fn note(step: &str) {
    if IN_CHILD.load(Ordering::Relaxed) {
        emit(&json!({ "note": step }));
    }
}

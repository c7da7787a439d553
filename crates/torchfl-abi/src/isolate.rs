//! Crash isolation for `torchfl-abi verify`.
//!
//! # Design
//!
//! The checks call into the plugin, and a plugin under test may crash (a
//! kernel dereferencing NULL, an `abort()`) or hang (a synchronize that never
//! returns). So `verify` does not run them itself: it re-executes the
//! `torchfl-abi` binary with the hidden subcommand `__verify-child`, which
//! runs the checks ([`crate::verify::run_checks`]) and streams one line per
//! event on its stdout, each prefixed with [`PREFIX`] ([`crate::protocol`]):
//!
//! - `{"start": "<id>"}` before a check runs,
//! - `{"result": {"id", "status", "detail", "duration_ms"}}` after it,
//! - `{"identity": {...}}` once the plugin initialized,
//! - `{"note": "..."}` for a step inside a check (e.g. the kernel about to be
//!   called), quoted in the report when the plugin crashes or hangs in it,
//! - `{"done": true}` after the last check.
//!
//! Lines without the prefix are output of the plugin itself and are passed
//! on to stderr, so that a plugin printing to stdout can neither corrupt the
//! protocol nor the `--json` document. The parent reads the lines as they
//! come (a reader thread feeds a channel), drives the progress indicator,
//! and bounds every check by `--timeout` seconds. When the child dies before
//! `done`, the running check fails with the signal's name ("crashed with
//! SIGSEGV (signal 11) during check kernels"), and the checks after it are
//! reported `not_run`; when a check exceeds the timeout the child is killed
//! and the check fails as a timeout.
//!
//! # Finding the executable
//!
//! `torchfl_abi::run` is also called in-process from Python (the wheel's
//! `torchfl-abi` entry point), where `current_exe` is the Python interpreter
//! and cannot run `__verify-child`. [`child_executable`] therefore uses, in
//! order: the `TORCHFL_ABI_EXE` environment variable (a path to a
//! `torchfl-abi` binary), then `current_exe` when its file name starts with
//! `torchfl-abi` (the standalone binary, including `torchfl-abi-<hash>`
//! copies). Otherwise, and with `--in-process`, the checks run in this
//! process: no crash isolation and no timeout, but the same report.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::protocol::{self, emit, PREFIX};
use crate::report::{self, Abort, CheckResult, Verdict, VerifyReport};
use crate::verify::{self, Sink};

/// Environment variable naming the `torchfl-abi` executable to run checks
/// in, for hosts (Python) whose own executable is not `torchfl-abi`.
pub(crate) const EXE_ENV: &str = "TORCHFL_ABI_EXE";

/// The executable to re-run as `__verify-child`, or `None` to run the checks
/// in this process.
pub(crate) fn child_executable() -> Option<PathBuf> {
    if let Some(exe) = std::env::var_os(EXE_ENV).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(exe));
    }
    let exe = std::env::current_exe().ok()?;
    let is_tool = exe.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("torchfl-abi"));
    is_tool.then_some(exe)
}

/// The child's side: runs the checks and streams the protocol on stdout.
pub(crate) fn run_child(path: &Path, options: &str) -> u8 {
    struct Stream;
    impl Sink for Stream {
        fn start(&mut self, _index: usize, id: &'static str, _title: &'static str) {
            emit(&json!({ "start": id }));
        }
        fn finish(&mut self, r: CheckResult) {
            emit(&json!({ "result": {
                "id": r.id,
                "status": r.verdict.as_str(),
                "detail": r.detail,
                "duration_ms": r.duration_ms,
            }}));
        }
        fn identity(&mut self, identity: serde_json::Value) {
            emit(&json!({ "identity": identity }));
        }
    }
    no_core_dumps();
    protocol::enter_child();
    verify::run_checks(path, options, &mut Stream);
    emit(&json!({ "done": true }));
    0
}

/// A crash of the plugin is an expected outcome here and is reported by the
/// parent: do not leave a core file in the vendor's CI workspace for it.
fn no_core_dumps() {
    #[cfg(unix)]
    {
        let zero = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: setrlimit reads the struct passed by reference; lowering
        // this process's core size limit affects nothing else.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &zero);
        }
    }
}

/// The name of a fatal signal.
pub(crate) fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => "unknown signal",
    }
}

#[cfg(unix)]
fn exit_signal(status: &ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

#[cfg(not(unix))]
fn exit_signal(_status: &ExitStatus) -> Option<i32> {
    None
}

/// One line from the child, parsed.
enum Message {
    Start(String),
    Result(CheckResult),
    Identity(serde_json::Value),
    Note(String),
    Done,
}

fn lookup(id: &str) -> Option<(usize, &'static str, &'static str)> {
    verify::check_list().enumerate().find(|(_, (cid, _))| *cid == id).map(|(i, (cid, title))| (i, cid, title))
}

fn parse(line: &str) -> Option<Message> {
    let doc: serde_json::Value = serde_json::from_str(line).ok()?;
    if let Some(id) = doc.get("start").and_then(|v| v.as_str()) {
        return Some(Message::Start(id.to_owned()));
    }
    if let Some(r) = doc.get("result") {
        let (_, id, title) = lookup(r.get("id")?.as_str()?)?;
        return Some(Message::Result(CheckResult {
            id,
            title,
            verdict: Verdict::parse(r.get("status")?.as_str()?)?,
            detail: r.get("detail").and_then(|d| d.as_str()).unwrap_or_default().to_owned(),
            duration_ms: r.get("duration_ms").and_then(serde_json::Value::as_f64).unwrap_or(0.0),
        }));
    }
    if let Some(step) = doc.get("note").and_then(|v| v.as_str()) {
        return Some(Message::Note(step.to_owned()));
    }
    if let Some(identity) = doc.get("identity") {
        return Some(Message::Identity(identity.clone()));
    }
    doc.get("done").map(|_| Message::Done)
}

/// Kills and reaps the child; it may already be gone.
fn kill(child: &mut Child) -> Option<ExitStatus> {
    let _ = child.kill();
    child.wait().ok()
}

/// Waits up to `timeout` for the child to exit; kills it after that and
/// returns `None`.
fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) | Err(_) => {
                let _ = kill(child);
                return None;
            }
        }
    }
}

/// "check <id>", or the stage between checks.
fn stage(check: &str) -> String {
    match check {
        "startup" => "startup, before the first check".to_owned(),
        "shutdown" => "shutdown, after the last check".to_owned(),
        id => format!("check {id}"),
    }
}

/// The parent's side: runs `exe __verify-child`, supervises it and prints
/// the report. Returns the exit code.
pub(crate) fn run_supervised(exe: &Path, path: &Path, options: &str, json: bool, timeout_s: u64) -> u8 {
    let timeout = Duration::from_secs(timeout_s.max(1));
    let mut child = match spawn_child(exe, path, options) {
        Ok(child) => child,
        Err(e) => {
            eprintln!(
                "torchfl-abi: cannot run {} to isolate the checks ({e}); running them in this process",
                exe.display()
            );
            return verify::run_in_process(path, options, json, timeout_s);
        }
    };
    let (rx, reader) = forward_lines(&mut child);

    let total = verify::check_list().count();
    let progress = report::Progress::new(total, json);
    let mut seen = Observed { path: path.display().to_string(), ..Observed::default() };
    let mut abort = seen.follow(&rx, &mut child, &progress, timeout, timeout_s);
    // Without `done`, the child closed its stdout: it is exiting or dead.
    // With it, only the process exit is left. Either way the wait is
    // bounded, and the reader thread is not joined: a process the plugin
    // started may hold the pipe open after the child is gone.
    let status = if abort.is_some() { None } else { wait_bounded(&mut child, timeout) };
    drop(rx);
    drop(reader);
    progress.finish();

    if abort.is_none() {
        abort = seen.exit_abort(status, timeout_s);
    }
    if let Some(abort) = &abort {
        seen.fail_aborted_check(abort);
    }
    let report = VerifyReport {
        path,
        identity: seen.identity,
        results: in_check_order(seen.results, abort.as_ref()),
        abort,
        isolation: "child process",
        timeout_s,
    };
    report::print_verify(&report, json);
    verify::exit_code(&report)
}

/// Starts `exe __verify-child` with the protocol on a pipe and the plugin's
/// stderr passed through.
fn spawn_child(exe: &Path, path: &Path, options: &str) -> std::io::Result<Child> {
    Command::new(exe)
        .arg("__verify-child")
        .arg("--options")
        .arg(options)
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
}

/// Reads the child's stdout on a thread and sends each line on a channel,
/// so that the parent can wait for the next line with a timeout.
fn forward_lines(child: &mut Child) -> (Receiver<String>, Option<JoinHandle<()>>) {
    let (tx, rx) = mpsc::channel::<String>();
    let reader = child.stdout.take().map(|stdout| {
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match lines.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(String::from_utf8_lossy(&buf).trim_end().to_owned()).is_err() {
                            break;
                        }
                    }
                }
            }
        })
    });
    (rx, reader)
}

/// What the parent learned from the child's protocol lines.
#[derive(Default)]
struct Observed {
    /// The plugin file, for messages until the identity is known.
    path: String,
    /// Results in the order the child reported them.
    results: Vec<CheckResult>,
    identity: Option<serde_json::Value>,
    /// The check started and not yet finished: id, title, start time.
    running: Option<(&'static str, &'static str, Instant)>,
    /// The child sent `done`.
    done: bool,
    /// The last step noted inside the running check.
    last_note: Option<String>,
}

impl Observed {
    /// Reads protocol lines until `done`, the end of the child's stdout, or
    /// `timeout` without a check starting or finishing (then the child is
    /// killed and the timeout is returned as the abort).
    fn follow(
        &mut self,
        rx: &Receiver<String>,
        child: &mut Child,
        progress: &report::Progress,
        timeout: Duration,
        timeout_s: u64,
    ) -> Option<Abort> {
        let mut deadline = Instant::now() + timeout;
        while !self.done {
            let wait = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(line) => {
                    if self.take_line(&line, progress) {
                        deadline = Instant::now() + timeout;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = kill(child);
                    let check = self.check();
                    return Some(Abort {
                        kind: "timeout",
                        check,
                        signal: None,
                        signal_name: None,
                        exit_code: None,
                        message: format!(
                            "plugin {} timed out after {timeout_s} s during {}{} (--timeout)",
                            self.plugin_label(),
                            stage(check),
                            step_suffix(self.last_note.as_deref())
                        ),
                    });
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        None
    }

    /// Handles one line of the child's stdout. Returns whether a check
    /// started or finished, which restarts the timeout.
    fn take_line(&mut self, line: &str, progress: &report::Progress) -> bool {
        let Some(at) = line.find(PREFIX) else {
            // The plugin's own output on stdout.
            eprintln!("{line}");
            return false;
        };
        if at > 0 {
            eprintln!("{}", &line[..at]);
        }
        match parse(&line[at + PREFIX.len()..]) {
            Some(Message::Start(id)) => {
                if let Some((index, id, title)) = lookup(&id) {
                    progress.step(index, title);
                    self.running = Some((id, title, Instant::now()));
                }
                self.last_note = None;
                true
            }
            Some(Message::Result(result)) => {
                self.running = None;
                self.results.push(result);
                true
            }
            Some(Message::Identity(doc)) => {
                self.identity = Some(doc);
                false
            }
            Some(Message::Note(step)) => {
                self.last_note = Some(step);
                false
            }
            Some(Message::Done) => {
                self.done = true;
                false
            }
            None => {
                eprintln!("torchfl-abi: unreadable line from the checking process: {line}");
                false
            }
        }
    }

    /// How abort messages name the plugin: `'name' (path)` once its
    /// identity is known, else the file.
    fn plugin_label(&self) -> String {
        match self.identity.as_ref().and_then(|i| i.get("name")).and_then(|n| n.as_str()) {
            Some(name) => format!("'{name}' ({})", self.path),
            None => self.path.clone(),
        }
    }

    /// The running check or, between checks, the stage: before the first
    /// one (the child starting), or after the last one (the plugin's
    /// shutdown and the process exit).
    fn check(&self) -> &'static str {
        let between = if self.results.is_empty() { "startup" } else { "shutdown" };
        self.running.map_or(between, |r| r.0)
    }

    /// The abort implied by how the child ended (`status` is `None` when it
    /// did not exit in time): a signal, or an exit or hang before `done`.
    fn exit_abort(&self, status: Option<ExitStatus>, timeout_s: u64) -> Option<Abort> {
        let check = self.check();
        let signal = status.as_ref().and_then(exit_signal);
        if self.done && signal.is_none() {
            return None;
        }
        let last_step = step_suffix(self.last_note.as_deref());
        Some(match signal {
            Some(sig) => Abort {
                kind: "crash",
                check,
                signal: Some(sig),
                signal_name: Some(signal_name(sig)),
                exit_code: None,
                message: format!(
                    "plugin {} crashed with {} (signal {sig}) during {}{last_step}",
                    self.plugin_label(),
                    signal_name(sig),
                    stage(check)
                ),
            },
            None => {
                let code = status.as_ref().and_then(ExitStatus::code);
                Abort {
                    kind: if status.is_some() { "exit" } else { "timeout" },
                    check,
                    signal: None,
                    signal_name: None,
                    exit_code: code,
                    message: match status {
                        Some(_) => format!(
                            "plugin {} exited the checking process{} during {}{last_step}",
                            self.plugin_label(),
                            code.map(|c| format!(" with code {c}")).unwrap_or_default(),
                            stage(check),
                        ),
                        None => format!(
                            "plugin {}: the checking process did not exit within {timeout_s} s after {}",
                            self.plugin_label(),
                            stage(check)
                        ),
                    },
                }
            }
        })
    }

    /// The check that was running when the child aborted fails with the
    /// abort's message, replacing any result it reported.
    fn fail_aborted_check(&mut self, abort: &Abort) {
        if let Some((_, id, title)) = lookup(abort.check) {
            let duration_ms = self.running.map_or(0.0, |r| r.2.elapsed().as_secs_f64() * 1e3);
            self.results.retain(|r| r.id != id);
            self.results.push(CheckResult {
                id,
                title,
                verdict: Verdict::Fail,
                detail: abort.message.clone(),
                duration_ms,
            });
        }
    }
}

/// `results` in the order of [`verify::check_list`], with checks that
/// reported nothing (those after an abort) as not run.
fn in_check_order(mut results: Vec<CheckResult>, abort: Option<&Abort>) -> Vec<CheckResult> {
    let mut ordered = Vec::with_capacity(verify::check_list().count());
    for (id, title) in verify::check_list() {
        match results.iter().position(|r| r.id == id) {
            Some(i) => ordered.push(results.swap_remove(i)),
            None => ordered.push(CheckResult {
                id,
                title,
                verdict: Verdict::NotRun,
                detail: match abort {
                    Some(a) => format!("not run: the plugin {} in {}", abort_verb(a), stage(a.check)),
                    None => "not run".to_owned(),
                },
                duration_ms: 0.0,
            }),
        }
    }
    ordered
}

fn step_suffix(note: Option<&str>) -> String {
    note.map(|n| format!(" (last step: {n})")).unwrap_or_default()
}

fn abort_verb(a: &Abort) -> &'static str {
    match a.kind {
        "timeout" => "timed out",
        "crash" => "crashed",
        _ => "exited",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn signals_have_their_names() {
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        assert_eq!(signal_name(libc::SIGABRT), "SIGABRT");
        assert_eq!(signal_name(12345), "unknown signal");
    }

    #[test]
    fn protocol_lines_parse_and_unknown_ones_are_rejected() {
        assert!(matches!(parse(r#"{"start":"kernels"}"#), Some(Message::Start(id)) if id == "kernels"));
        let line = r#"{"result":{"id":"kernels","status":"not_run","detail":"x","duration_ms":1.5}}"#;
        match parse(line) {
            Some(Message::Result(r)) => {
                assert_eq!((r.id, r.verdict, r.detail.as_str()), ("kernels", Verdict::NotRun, "x"));
                assert!((r.duration_ms - 1.5).abs() < 1e-9);
            }
            _ => panic!("not a result"),
        }
        assert!(matches!(parse(r#"{"note":"calling x"}"#), Some(Message::Note(n)) if n == "calling x"));
        assert!(matches!(parse(r#"{"done":true}"#), Some(Message::Done)));
        // A result for a check this tool does not know, or garbage.
        assert!(parse(r#"{"result":{"id":"nope","status":"pass"}}"#).is_none());
        assert!(parse("printf from the plugin").is_none());
    }
}

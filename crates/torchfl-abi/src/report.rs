//! Human and JSON output of `torchfl-abi`.

use std::io::{IsTerminal, Write};
use std::path::Path;

use serde_json::json;
use torchfl_core::{Error, Plugin};

/// What the device checks say when the plugin has no device: its own
/// outcome, not a failure (registration succeeds with is_available()
/// False, as CUDA without a GPU).
pub(crate) const NO_DEVICES: &str = "no devices, device checks skipped";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Pass,
    Fail,
    Skip,
    /// The check never ran: the plugin crashed or hung in an earlier one.
    NotRun,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::Skip => "skip",
            Self::NotRun => "not_run",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        [Self::Pass, Self::Fail, Self::Skip, Self::NotRun].into_iter().find(|v| v.as_str() == s)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct CheckResult {
    pub(crate) id: &'static str,
    pub(crate) title: &'static str,
    pub(crate) verdict: Verdict,
    pub(crate) detail: String,
    /// Wall time of the check, in milliseconds.
    pub(crate) duration_ms: f64,
}

/// How the checks ended early, when they did: the plugin crashed, hung, or
/// exited in the middle of a check.
#[derive(Debug, Clone)]
pub(crate) struct Abort {
    /// `crash`, `timeout` or `exit`.
    pub(crate) kind: &'static str,
    /// The check that was running.
    pub(crate) check: &'static str,
    /// The signal that ended the checking process, for a crash.
    pub(crate) signal: Option<i32>,
    pub(crate) signal_name: Option<&'static str>,
    /// The exit status, for `exit`.
    pub(crate) exit_code: Option<i32>,
    pub(crate) message: String,
}

/// Everything `verify` found, ready to print.
pub(crate) struct VerifyReport<'a> {
    pub(crate) path: &'a Path,
    pub(crate) identity: Option<serde_json::Value>,
    pub(crate) results: Vec<CheckResult>,
    pub(crate) abort: Option<Abort>,
    /// `child process` or `in-process`.
    pub(crate) isolation: &'static str,
    pub(crate) timeout_s: u64,
}

/// A one-line progress indicator on stderr, shown only on a terminal and
/// never with `--json`.
pub(crate) struct Progress {
    total: usize,
    enabled: bool,
}

impl Progress {
    pub(crate) fn new(total: usize, json: bool) -> Self {
        Self { total, enabled: !json && std::io::stderr().is_terminal() }
    }

    pub(crate) fn step(&self, index: usize, title: &str) {
        if self.enabled && index < self.total {
            let mut err = std::io::stderr();
            // \x1b[2K clears the line left by the previous step.
            let _ = write!(err, "\r\x1b[2K[{}/{}] {title}...", index + 1, self.total);
            let _ = err.flush();
        }
    }

    pub(crate) fn finish(&self) {
        if self.enabled {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

pub(crate) fn identity_json(p: &Plugin) -> serde_json::Value {
    let info = p.info();
    let abi = p.abi();
    json!({
        "name": info.name,
        "vendor": info.vendor,
        "chip_family": info.chip_family,
        "plugin_version": info.plugin_version,
        "min_torch_version": info.min_torch_version,
        "path": p.path().map(|x| x.display().to_string()),
        "abi": {
            "plugin": abi.plugin.to_string(),
            "host": abi.host.to_string(),
            "effective": abi.effective.to_string(),
        },
        "capabilities": info.capabilities.names(),
        "devices": p.device_count(),
    })
}

impl VerifyReport<'_> {
    /// The verdict in one word: `passed`, `failed`, `aborted` (crash,
    /// exit or hang), `not_loaded`, or `no_devices` (everything that could
    /// run passed; the plugin reports no device, so device checks were
    /// skipped).
    pub(crate) fn outcome(&self) -> &'static str {
        if self.abort.is_some() {
            "aborted"
        } else if self.identity.is_none() {
            "not_loaded"
        } else if self.results.iter().any(|r| r.verdict == Verdict::Fail) {
            "failed"
        } else if self.identity.as_ref().and_then(|i| i.get("devices")).and_then(serde_json::Value::as_i64)
            == Some(0)
        {
            "no_devices"
        } else {
            "passed"
        }
    }
}

pub(crate) fn print_verify(report: &VerifyReport<'_>, json: bool) {
    let results = &report.results;
    let count = |v: Verdict| results.iter().filter(|r| r.verdict == v).count();
    let (passed, failed, skipped, not_run) =
        (count(Verdict::Pass), count(Verdict::Fail), count(Verdict::Skip), count(Verdict::NotRun));
    if json {
        let doc = json!({
            "plugin": report.path.display().to_string(),
            "identity": report.identity,
            "loaded": report.identity.is_some(),
            "outcome": report.outcome(),
            "isolation": report.isolation,
            "timeout_s": report.timeout_s,
            "checks": results.iter().map(|r| json!({
                "id": r.id,
                "title": r.title,
                "status": r.verdict.as_str(),
                "detail": r.detail,
                "duration_ms": r.duration_ms,
            })).collect::<Vec<_>>(),
            "abort": report.abort.as_ref().map(|a| json!({
                "kind": a.kind,
                "check": a.check,
                "signal": a.signal,
                "signal_name": a.signal_name,
                "exit_code": a.exit_code,
                "message": a.message,
            })),
            "summary": {"passed": passed, "failed": failed, "skipped": skipped, "not_run": not_run},
        });
        println!("{doc:#}");
        return;
    }
    println!("torchfl-abi verify {}", report.path.display());
    let width = results.iter().map(|r| r.id.len()).max().unwrap_or(0);
    for r in results {
        let tag = match r.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
            Verdict::NotRun => "----",
        };
        println!("  {tag}  {:width$}  {}", r.id, r.detail);
    }
    if let Some(abort) = &report.abort {
        println!("{}", abort.message);
    }
    if report.outcome() == "no_devices" {
        println!("{}", NO_DEVICES);
    }
    if not_run > 0 {
        println!("{passed} passed, {failed} failed, {skipped} skipped, {not_run} not run");
    } else {
        println!("{passed} passed, {failed} failed, {skipped} skipped");
    }
}

pub(crate) fn load_failure(error: &Error, json: bool) {
    if json {
        println!(
            "{:#}",
            json!({"loaded": false, "error": {"kind": error.kind(), "message": error.to_string()}})
        );
    } else {
        eprintln!("torchfl-abi: {error}");
    }
}

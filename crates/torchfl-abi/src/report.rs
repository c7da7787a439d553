//! Human and JSON output of `torchfl-abi`.

use std::io::{IsTerminal, Write};
use std::path::Path;

use serde_json::json;
use torchfl_core::{Error, Plugin};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Pass,
    Fail,
    Skip,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::Skip => "skip",
        }
    }
}

#[derive(Debug)]
pub(crate) struct CheckResult {
    pub(crate) id: &'static str,
    pub(crate) title: &'static str,
    pub(crate) verdict: Verdict,
    pub(crate) detail: String,
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
        if self.enabled {
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
    })
}

pub(crate) fn print_verify(path: &Path, plugin: Option<&Plugin>, results: &[CheckResult], json: bool) {
    let count = |v: Verdict| results.iter().filter(|r| r.verdict == v).count();
    let (passed, failed, skipped) = (count(Verdict::Pass), count(Verdict::Fail), count(Verdict::Skip));
    if json {
        let doc = json!({
            "plugin": path.display().to_string(),
            "identity": plugin.map(identity_json),
            "loaded": plugin.is_some(),
            "checks": results.iter().map(|r| json!({
                "id": r.id,
                "title": r.title,
                "status": r.verdict.as_str(),
                "detail": r.detail,
            })).collect::<Vec<_>>(),
            "summary": {"passed": passed, "failed": failed, "skipped": skipped},
        });
        println!("{doc:#}");
        return;
    }
    println!("torchfl-abi verify {}", path.display());
    let width = results.iter().map(|r| r.id.len()).max().unwrap_or(0);
    for r in results {
        let tag = match r.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        };
        println!("  {tag}  {:width$}  {}", r.id, r.detail);
    }
    println!("{passed} passed, {failed} failed, {skipped} skipped");
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

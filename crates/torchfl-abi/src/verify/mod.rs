//! `torchfl-abi verify`: ABI conformance checks.
//!
//! The checks are a list ([`CHECKS`]) run in order against one context; a
//! check that needs something an earlier check failed to produce is
//! skipped with the reason. The first eight are the core's loading stages
//! ([`torchfl_core::Stage`]), run one per check through the same code
//! `register_device_plugin` uses (`stages`): a refusal, a warning or a crash
//! is reported against the stage that caused it, with registration's words.
//! The others exercise the loaded plugin: memory (`memory`), streams,
//! events, errors and kernels (`runtime`), and the optional extensions when
//! the plugin offers them: native graphs (`graphs`), activity records and
//! ranges (`activity`) and collectives (`collectives`). `graphs` and
//! `activity` set up their kernel calls with `operands`.

mod activity;
mod collectives;
mod graphs;
mod memory;
mod operands;
mod runtime;
mod stages;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use torchfl_core::init::Initialization;
use torchfl_core::{Error, Opening, Plugin};

use crate::report::{self, CheckResult, Verdict, NO_DEVICES};

/// What the checks share.
struct Ctx<'a> {
    path: &'a Path,
    options: &'a str,
    /// Loading up to the op table, while it runs.
    opening: Option<Opening>,
    /// Initialization, devices and streams, while they run.
    init: Option<Initialization>,
    /// The load failure, kept to skip the stages after it.
    load_error: Option<Error>,
    plugin: Option<Arc<Plugin>>,
    /// What `probe_devices` (ABI 1.6) found before initialize, if offered.
    probed: Option<usize>,
}

/// Why a check stopped early: a failure or a skip.
enum NotPassed {
    Fail(String),
    Skip(String),
}

/// A passing check's detail, or why it did not pass.
type Outcome = Result<String, NotPassed>;

/// A conformance check: an id (stable, for `--json` consumers), a title, and
/// the function that runs it.
struct Check {
    id: &'static str,
    title: &'static str,
    run: fn(&mut Ctx<'_>) -> Outcome,
}

const CHECKS: &[Check] = &[
    Check {
        id: "file",
        title: "a regular file, a shared library for this architecture",
        run: stages::check_file,
    },
    Check { id: "handshake", title: "bootstrap symbol and ABI version", run: stages::check_handshake },
    Check {
        id: "function_table",
        title: "table size and every required entry",
        run: stages::check_function_table,
    },
    Check { id: "identity", title: "name, vendor, versions and capabilities", run: stages::check_identity },
    Check {
        id: "op_table",
        title: "op names, schemas, and kernels exported under their conventional symbols",
        run: stages::check_op_table,
    },
    Check {
        id: "probe_devices",
        title: "devices counted without initializing (optional, ABI 1.6)",
        run: stages::check_probe,
    },
    Check { id: "initialize", title: "initialize and device count", run: stages::check_init },
    Check { id: "device_properties", title: "properties of every device", run: stages::check_properties },
    Check { id: "streams", title: "default and created streams", run: stages::check_streams },
    Check {
        id: "memory_round_trip",
        title: "allocate, copy and set memory on every device",
        run: memory::check_round_trip,
    },
    Check {
        id: "memory_offsets",
        title: "copies and sets at unaligned offsets inside a buffer",
        run: memory::check_offsets,
    },
    Check { id: "out_of_memory", title: "out-of-memory reported as a status", run: memory::check_oom },
    Check {
        id: "memory_stats",
        title: "memory statistics follow allocations",
        run: memory::check_memory_stats,
    },
    Check { id: "events", title: "events record, synchronize and time", run: runtime::check_events },
    Check {
        id: "stream_ordering",
        title: "work ordered across streams by an event",
        run: runtime::check_stream_ordering,
    },
    Check { id: "error_objects", title: "errors carry a code and a message", run: runtime::check_errors },
    Check {
        id: "kernels",
        title: "elementwise kernels match a host computation",
        run: runtime::check_kernels,
    },
    Check {
        id: "graphs",
        title: "captured kernels run only when the graph is launched (optional, ABI 1.7)",
        run: graphs::check_graphs,
    },
    Check {
        id: "activity",
        title: "a kernel call's records carry its correlation id; ranges; nothing recorded when off \
                (optional, ABI 1.8)",
        run: activity::check_activity,
    },
    Check {
        id: "concurrency",
        title: "allocation, copies and kernels from several threads",
        run: runtime::check_concurrency,
    },
    Check {
        id: "collectives",
        title: "communicators of one rank (with settings when offered) all-reduce on a stream",
        run: collectives::check_collectives,
    },
];

/// The initialized plugin, for checks that need nothing else.
fn plugin(ctx: &Ctx<'_>) -> Result<Arc<Plugin>, NotPassed> {
    ctx.plugin.clone().ok_or_else(|| NotPassed::Skip("the plugin did not initialize".into()))
}

/// The initialized plugin, for checks that need a device.
fn device_plugin(ctx: &Ctx<'_>) -> Result<Arc<Plugin>, NotPassed> {
    let p = plugin(ctx)?;
    if p.device_count() == 0 {
        return Err(NotPassed::Skip(NO_DEVICES.to_owned()));
    }
    Ok(p)
}

fn devices(p: &Plugin) -> std::ops::Range<i32> {
    0..p.device_count()
}

/// Receives the progress of [`run_checks`] as it happens.
pub(crate) trait Sink {
    /// Check `index` of [`CHECKS`] is about to run.
    fn start(&mut self, index: usize, id: &'static str, title: &'static str);
    /// A check finished.
    fn finish(&mut self, result: CheckResult);
    /// The plugin initialized: its identity, for the report.
    fn identity(&mut self, identity: serde_json::Value);
}

/// The id and title of every check, in the order they run.
pub(crate) fn check_list() -> impl Iterator<Item = (&'static str, &'static str)> {
    CHECKS.iter().map(|c| (c.id, c.title))
}

/// Runs every check in this process, reporting to `sink` as it goes.
pub(crate) fn run_checks(path: &Path, options: &str, sink: &mut dyn Sink) {
    let mut ctx =
        Ctx { path, options, opening: None, init: None, load_error: None, plugin: None, probed: None };
    for (i, check) in CHECKS.iter().enumerate() {
        sink.start(i, check.id, check.title);
        let started = Instant::now();
        let (verdict, detail) = match (check.run)(&mut ctx) {
            Ok(detail) => (Verdict::Pass, detail),
            Err(NotPassed::Fail(msg)) => (Verdict::Fail, msg),
            Err(NotPassed::Skip(msg)) => (Verdict::Skip, msg),
        };
        let duration_ms = started.elapsed().as_secs_f64() * 1e3;
        sink.finish(CheckResult { id: check.id, title: check.title, verdict, detail, duration_ms });
        if check.id == "streams" {
            if let Some(p) = &ctx.plugin {
                sink.identity(report::identity_json(p));
            }
        }
    }
}

/// The exit code for a finished report: 1 when the checks were cut short
/// (crash, hang) or one failed, 3 when the plugin did not load, else 0.
pub(crate) fn exit_code(report: &report::VerifyReport<'_>) -> u8 {
    if report.abort.is_some() {
        crate::EXIT_CHECK_FAILURE
    } else if report.identity.is_none() {
        crate::EXIT_LOAD_FAILURE
    } else if report.results.iter().any(|r| r.verdict == Verdict::Fail) {
        crate::EXIT_CHECK_FAILURE
    } else {
        0
    }
}

/// Runs every check in this process (no crash isolation, no timeout) and
/// prints the report.
pub(crate) fn run_in_process(path: &Path, options: &str, json: bool, timeout_s: u64) -> u8 {
    struct Collect {
        progress: report::Progress,
        results: Vec<CheckResult>,
        identity: Option<serde_json::Value>,
    }
    impl Sink for Collect {
        fn start(&mut self, index: usize, _id: &'static str, title: &'static str) {
            self.progress.step(index, title);
        }
        fn finish(&mut self, result: CheckResult) {
            self.results.push(result);
        }
        fn identity(&mut self, identity: serde_json::Value) {
            self.identity = Some(identity);
        }
    }
    let mut sink =
        Collect { progress: report::Progress::new(CHECKS.len(), json), results: Vec::new(), identity: None };
    run_checks(path, options, &mut sink);
    sink.progress.finish();
    let report = report::VerifyReport {
        path,
        identity: sink.identity,
        results: sink.results,
        abort: None,
        isolation: "in-process",
        timeout_s,
    };
    report::print_verify(&report, json);
    exit_code(&report)
}

//! `torchfl-abi verify`: ABI conformance checks.
//!
//! The checks are a list ([`CHECKS`]) run in order against one context; a
//! check that needs something an earlier check failed to produce is
//! skipped with the reason. Loading is split into the checks it implies
//! (file, handshake, tables, required entries, op symbols, init) so that a
//! load failure is reported against the check it belongs to.

use std::path::Path;

use std::sync::Arc;

use torchfl_core::{Error, LoadOptions, Plugin, PluginLibrary, PluginPart};

use crate::report::{self, CheckResult, Verdict};

/// What the checks share.
struct Ctx<'a> {
    path: &'a Path,
    options: &'a str,
    /// Set by `open`: the load failure, kept to report it in its check.
    load_error: Option<Error>,
    library: Option<PluginLibrary>,
    plugin: Option<Arc<Plugin>>,
}

/// Why a check stopped early: a failure, a skip, or a pass with nothing
/// more to check.
enum NotPassed {
    Fail(String),
    Skip(String),
    Pass(String),
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
    Check { id: "file", title: "shared library for this architecture", run: check_file },
    Check { id: "handshake", title: "bootstrap symbol and ABI version", run: check_handshake },
    Check { id: "function_table", title: "table size and every required entry", run: check_function_table },
    Check { id: "identity", title: "name, vendor, versions and capabilities", run: check_identity },
    Check {
        id: "op_table",
        title: "op names, and kernels exported under their conventional symbols",
        run: check_op_table,
    },
    Check { id: "initialize", title: "initialize and device count", run: check_init },
    Check { id: "device_properties", title: "properties of every device", run: check_properties },
    Check {
        id: "memory_round_trip",
        title: "allocate, copy and set memory on every device",
        run: check_round_trip,
    },
    Check { id: "out_of_memory", title: "out-of-memory reported as a status", run: check_oom },
    Check { id: "memory_stats", title: "memory statistics follow allocations", run: check_memory_stats },
    Check { id: "streams", title: "default and created streams", run: check_streams },
    Check { id: "events", title: "events record, synchronize and time", run: check_events },
    Check { id: "error_objects", title: "errors carry a code and a message", run: check_errors },
];

/// The check a load error belongs to: the loader validates in check order.
fn load_stage(e: &Error) -> &'static str {
    match e {
        Error::FileNotFound { .. } | Error::NotASharedLibrary { .. } | Error::WrongArchitecture { .. } => {
            "file"
        }
        Error::MissingBootstrapSymbol { .. }
        | Error::AbiMismatch { .. }
        | Error::InvalidPlugin { part: PluginPart::Bootstrap, .. } => "handshake",
        Error::MissingRequiredEntry { .. } | Error::InvalidPlugin { part: PluginPart::FunctionTable, .. } => {
            "function_table"
        }
        Error::InvalidPlugin { part: PluginPart::Identity, .. } => "identity",
        Error::InvalidPlugin { part: PluginPart::OpTable, .. } | Error::KernelSymbol { .. } => "op_table",
        _ => "initialize",
    }
}

fn open_stage(ctx: &mut Ctx<'_>, id: &str) -> Outcome {
    if ctx.library.is_none() && ctx.load_error.is_none() && ctx.plugin.is_none() {
        match PluginLibrary::open(ctx.path, &LoadOptions::default()) {
            Ok(lib) => ctx.library = Some(lib),
            Err(e) => ctx.load_error = Some(e),
        }
    }
    match &ctx.load_error {
        Some(e) if load_stage(e) == id => Err(NotPassed::Fail(e.to_string())),
        Some(e) if stage_index(load_stage(e)) < stage_index(id) => {
            Err(NotPassed::Skip(format!("not reached: '{}' failed", load_stage(e))))
        }
        _ => Ok(String::new()),
    }
}

fn stage_index(id: &str) -> usize {
    CHECKS.iter().position(|c| c.id == id).unwrap_or(usize::MAX)
}

/// The opened library; when loading failed at a later check, this check
/// passed but has nothing more to describe.
fn library<'c>(ctx: &'c Ctx<'_>) -> Result<&'c PluginLibrary, NotPassed> {
    ctx.library.as_ref().ok_or_else(|| match &ctx.load_error {
        Some(e) => NotPassed::Pass(format!("passed; loading failed later, at '{}'", load_stage(e))),
        None => NotPassed::Skip("the plugin did not load".into()),
    })
}

fn plugin(ctx: &Ctx<'_>) -> Result<Arc<Plugin>, NotPassed> {
    ctx.plugin.clone().ok_or_else(|| NotPassed::Skip("the plugin did not initialize".into()))
}

fn check_file(ctx: &mut Ctx<'_>) -> Outcome {
    open_stage(ctx, "file")?;
    Ok(format!("ELF shared object for {}", std::env::consts::ARCH))
}

fn check_handshake(ctx: &mut Ctx<'_>) -> Outcome {
    open_stage(ctx, "handshake")?;
    let abi = library(ctx)?.abi();
    Ok(format!(
        "plugin ABI {}, host ABI {}: using {} ({})",
        abi.plugin,
        abi.host,
        abi.effective,
        abi.relation()
    ))
}

fn check_function_table(ctx: &mut Ctx<'_>) -> Outcome {
    open_stage(ctx, "function_table")?;
    let lib = library(ctx)?;
    let optional: Vec<&str> =
        lib.optional_entries().into_iter().filter_map(|(name, present)| present.then_some(name)).collect();
    Ok(format!(
        "{} bytes, {} required entries, optional: {}",
        lib.table_size(),
        Plugin::required_entries().len(),
        if optional.is_empty() { "none".to_owned() } else { optional.join(", ") }
    ))
}

fn check_identity(ctx: &mut Ctx<'_>) -> Outcome {
    open_stage(ctx, "identity")?;
    let info = library(ctx)?.info();
    if let Some(v) = &info.min_torch_version {
        let well_formed = v.split('.').count() >= 2
            && v.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !well_formed {
            return Err(NotPassed::Fail(format!(
                "min_torch_version {v:?} is not of the form MAJOR.MINOR[.PATCH]"
            )));
        }
    }
    Ok(format!(
        "'{}' {} by {} ({}), capabilities: {}",
        info.name,
        info.plugin_version,
        info.vendor,
        info.chip_family,
        info.capabilities.names().join(", ")
    ))
}

fn check_op_table(ctx: &mut Ctx<'_>) -> Outcome {
    open_stage(ctx, "op_table")?;
    let lib = library(ctx)?;
    Ok(format!("{} operators, each kernel exported under its conventional symbol", lib.ops().len()))
}

fn check_init(ctx: &mut Ctx<'_>) -> Outcome {
    open_stage(ctx, "initialize")?;
    let lib = ctx.library.take().ok_or_else(|| NotPassed::Skip("the plugin did not load".into()))?;
    let options = LoadOptions { init_options: ctx.options.to_owned(), ..Default::default() };
    let plugin =
        torchfl_core::loader::initialize(lib, &options).map_err(|e| NotPassed::Fail(e.to_string()))?;
    let count = plugin.device_count();
    ctx.plugin = Some(Arc::clone(&plugin));
    if count < 1 {
        return Err(NotPassed::Fail(format!("device_count is {count}; a plugin needs at least one device")));
    }
    Ok(format!("{count} device(s)"))
}

fn devices(p: &Plugin) -> std::ops::Range<i32> {
    0..p.device_count()
}

fn check_properties(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    let mut names = Vec::new();
    for d in devices(&p) {
        let props = p.device_properties(d).map_err(|e| NotPassed::Fail(e.to_string()))?;
        if props.total_memory == 0 {
            return Err(NotPassed::Fail(format!("device {d} reports total_memory = 0")));
        }
        names.push(format!("{} ({} MiB)", props.name, props.total_memory >> 20));
    }
    Ok(names.join(", "))
}

/// Sizes chosen to catch alignment and rounding bugs: odd, prime-ish, page
/// straddling, and one larger than a typical cache block.
const ROUND_TRIP_SIZES: &[usize] = &[1, 3, 64, 127, 4097, (1 << 20) + 7];

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn check_round_trip(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    for d in devices(&p) {
        let empty_a = p.allocate(d, 0).map_err(fail)?;
        let empty_b = p.allocate(d, 0).map_err(fail)?;
        if empty_a.as_ptr() == empty_b.as_ptr() {
            return Err(NotPassed::Fail(format!(
                "device {d}: two 0-byte allocations returned the same pointer"
            )));
        }
        for &n in ROUND_TRIP_SIZES {
            let a = p.allocate(d, n).map_err(fail)?;
            if a.as_ptr() as usize % 64 != 0 {
                return Err(NotPassed::Fail(format!(
                    "device {d}: allocation of {n} bytes is not 64-byte aligned"
                )));
            }
            let b = p.allocate(d, n).map_err(fail)?;
            let data = pattern(n, d as u8);
            p.copy_to_device(&a, 0, &data).map_err(fail)?;
            p.copy_device_to_device(&b, 0, &a, 0, n, None).map_err(fail)?;
            let mut back = vec![0u8; n];
            p.copy_to_host(&b, 0, &mut back).map_err(fail)?;
            if back != data {
                let at = back.iter().zip(&data).position(|(x, y)| x != y).unwrap_or(0);
                return Err(NotPassed::Fail(format!(
                    "device {d}: {n}-byte host->device->device->host round trip differs at byte {at}"
                )));
            }
            p.set_memory(&b, n / 2, 0xA5, n - n / 2, None).map_err(fail)?;
            p.copy_to_host(&b, 0, &mut back).map_err(fail)?;
            let expected: Vec<u8> =
                data[..n / 2].iter().copied().chain(std::iter::repeat_n(0xA5, n - n / 2)).collect();
            if back != expected {
                return Err(NotPassed::Fail(format!(
                    "device {d}: set_memory on the upper half of {n} bytes is wrong"
                )));
            }
        }
        if d > 0 {
            // Copies between devices of the same plugin.
            let src = p.allocate(0, 4097).map_err(fail)?;
            let dst = p.allocate(d, 4097).map_err(fail)?;
            let data = pattern(4097, 9);
            p.copy_to_device(&src, 0, &data).map_err(fail)?;
            p.copy_device_to_device(&dst, 0, &src, 0, 4097, None).map_err(fail)?;
            let mut back = vec![0u8; 4097];
            p.copy_to_host(&dst, 0, &mut back).map_err(fail)?;
            if back != data {
                return Err(NotPassed::Fail(format!("copy from device 0 to device {d} is wrong")));
            }
        }
    }
    Ok(format!("sizes {ROUND_TRIP_SIZES:?} on {} device(s)", p.device_count()))
}

fn check_oom(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    for d in devices(&p) {
        let total = p.device_properties(d).map_err(|e| NotPassed::Fail(e.to_string()))?.total_memory;
        let request = usize::try_from(total.saturating_mul(2).max(1 << 40)).unwrap_or(usize::MAX / 2);
        match p.allocate(d, request) {
            Err(Error::OutOfMemory { .. }) => {}
            Err(e) => {
                return Err(NotPassed::Fail(format!(
                    "device {d}: an impossible allocation failed with {} instead of OUT_OF_MEMORY: {e}",
                    e.kind()
                )))
            }
            Ok(_) => {
                return Err(NotPassed::Fail(format!(
                    "device {d}: allocating {request} bytes (more than total_memory {total}) succeeded"
                )))
            }
        }
        // The device must still work afterwards.
        p.allocate(d, 4096).map_err(|e| NotPassed::Fail(format!("device {d} unusable after an OOM: {e}")))?;
    }
    Ok("OUT_OF_MEMORY status on every device, device usable afterwards".into())
}

fn check_memory_stats(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    let stats = |d| p.memory_stats(d);
    match stats(0) {
        Err(Error::Unimplemented { .. }) => {
            return Err(NotPassed::Skip("memory_stats is not implemented".into()))
        }
        Err(e) => return Err(NotPassed::Fail(e.to_string())),
        Ok(_) => {}
    }
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    // Other threads do not allocate during verify, so deltas are exact.
    let before = stats(0).map_err(fail)?;
    let buf = p.allocate(0, 1 << 16).map_err(fail)?;
    let during = stats(0).map_err(fail)?;
    drop(buf);
    p.synchronize(0).map_err(fail)?;
    let after = stats(0).map_err(fail)?;
    if during.allocated_bytes < before.allocated_bytes + (1 << 16) {
        return Err(NotPassed::Fail(format!(
            "allocated_bytes went from {} to {} after allocating 65536 bytes",
            before.allocated_bytes, during.allocated_bytes
        )));
    }
    if during.peak_allocated_bytes < during.allocated_bytes || during.reserved_bytes < during.allocated_bytes
    {
        return Err(NotPassed::Fail("peak or reserved bytes below allocated bytes".into()));
    }
    if after.allocated_bytes != before.allocated_bytes || after.num_frees <= before.num_frees {
        return Err(NotPassed::Fail(format!(
            "after freeing, allocated_bytes is {} (was {}) and num_frees {} (was {})",
            after.allocated_bytes, before.allocated_bytes, after.num_frees, before.num_frees
        )));
    }
    Ok(format!("{} bytes allocated now, peak {}", after.allocated_bytes, after.peak_allocated_bytes))
}

fn check_streams(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    for d in devices(&p) {
        let default = p.default_stream(d).map_err(fail)?;
        let again = p.default_stream(d).map_err(fail)?;
        if default.raw() != again.raw() {
            return Err(NotPassed::Fail(format!(
                "device {d}: default_stream returned two different streams"
            )));
        }
        let s = p.create_stream(d, 0).map_err(fail)?;
        let buf = p.allocate(d, 1 << 16).map_err(fail)?;
        p.set_memory(&buf, 0, 7, 1 << 16, Some(&s)).map_err(fail)?;
        s.synchronize().map_err(fail)?;
        if !s.query().map_err(fail)? {
            return Err(NotPassed::Fail(format!(
                "device {d}: stream_query is false after stream_synchronize"
            )));
        }
        let mut back = vec![0u8; 1 << 16];
        p.copy_to_host(&buf, 0, &mut back).map_err(fail)?;
        if back.iter().any(|&b| b != 7) {
            return Err(NotPassed::Fail(format!("device {d}: set_memory on a stream was not applied")));
        }
    }
    Ok("created, used, queried and destroyed a stream on every device".into())
}

fn check_events(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    let s = p.create_stream(0, 0).map_err(fail)?;
    let other = p.create_stream(0, 0).map_err(fail)?;
    let start = p.create_event(0, true).map_err(fail)?;
    let end = p.create_event(0, true).map_err(fail)?;
    if !start.query().map_err(fail)? {
        return Err(NotPassed::Fail("an event never recorded must query as complete".into()));
    }
    let buf = p.allocate(0, 1 << 20).map_err(fail)?;
    start.record(&s).map_err(fail)?;
    p.set_memory(&buf, 0, 1, 1 << 20, Some(&s)).map_err(fail)?;
    end.record(&s).map_err(fail)?;
    other.wait_event(&end).map_err(fail)?;
    other.synchronize().map_err(fail)?;
    end.synchronize().map_err(fail)?;
    if !end.query().map_err(fail)? {
        return Err(NotPassed::Fail("event_query is false after event_synchronize".into()));
    }
    match start.elapsed_ms(&end) {
        Ok(ms) if ms >= 0.0 && ms.is_finite() => Ok(format!("elapsed time {ms:.3} ms")),
        Ok(ms) => Err(NotPassed::Fail(format!("elapsed time {ms} ms is negative or not finite"))),
        Err(Error::Unimplemented { .. }) => Ok("elapsed time not implemented (optional)".into()),
        Err(e) => Err(NotPassed::Fail(e.to_string())),
    }
}

fn check_errors(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    // Asking for a device past the end must be an INVALID_ARGUMENT status
    // from the plugin itself, so call below the core's own range check.
    let past_end = p.device_count();
    match p.conformance_allocate(past_end, 16) {
        Ok(()) => Err(NotPassed::Fail(format!("allocate on device {past_end} (past the end) succeeded"))),
        Err(status) if status.message.is_empty() => Err(NotPassed::Fail(format!(
            "error for an invalid device has code {} but an empty message",
            status.code
        ))),
        Err(status) if status.code != torchfl_core::StatusCode::InvalidArgument => {
            Err(NotPassed::Fail(format!(
                "an invalid device index gave {} instead of INVALID_ARGUMENT: {}",
                status.code, status.message
            )))
        }
        Err(status) => Ok(format!("INVALID_ARGUMENT: \"{}\"", status.message)),
    }
}

/// Runs every check and prints the report.
pub(crate) fn run(path: &Path, options: &str, json: bool) -> u8 {
    let mut ctx = Ctx { path, options, load_error: None, library: None, plugin: None };
    let mut results = Vec::new();
    let progress = report::Progress::new(CHECKS.len(), json);
    for (i, check) in CHECKS.iter().enumerate() {
        progress.step(i, check.title);
        let (verdict, detail) = match (check.run)(&mut ctx) {
            Ok(detail) => (Verdict::Pass, detail),
            Err(NotPassed::Fail(msg)) => (Verdict::Fail, msg),
            Err(NotPassed::Skip(msg)) => (Verdict::Skip, msg),
            Err(NotPassed::Pass(msg)) => (Verdict::Pass, msg),
        };
        results.push(CheckResult { id: check.id, title: check.title, verdict, detail });
    }
    progress.finish();
    let loaded = ctx.plugin.is_some();
    report::print_verify(path, ctx.plugin.as_deref(), &results, json);
    if !loaded {
        crate::EXIT_LOAD_FAILURE
    } else if results.iter().any(|r| r.verdict == Verdict::Fail) {
        crate::EXIT_CHECK_FAILURE
    } else {
        0
    }
}

//! `torchfl-abi verify`: ABI conformance checks.
//!
//! The checks are a list ([`CHECKS`]) run in order against one context; a
//! check that needs something an earlier check failed to produce is
//! skipped with the reason. Loading is split into the checks it implies
//! (file, handshake, tables, required entries, op symbols, init) so that a
//! load failure is reported against the check it belongs to.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use torchfl_core::plugin::{OpKernel, Stream};
use torchfl_core::{Arg, Error, LoadOptions, Plugin, PluginLibrary, PluginPart, ScalarArg, TensorArg};
use torchfl_ffi::TFL_DType;

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
    Check {
        id: "memory_offsets",
        title: "copies and sets at unaligned offsets inside a buffer",
        run: check_offsets,
    },
    Check { id: "out_of_memory", title: "out-of-memory reported as a status", run: check_oom },
    Check { id: "memory_stats", title: "memory statistics follow allocations", run: check_memory_stats },
    Check { id: "streams", title: "default and created streams", run: check_streams },
    Check { id: "events", title: "events record, synchronize and time", run: check_events },
    Check {
        id: "stream_ordering",
        title: "work ordered across streams by an event",
        run: check_stream_ordering,
    },
    Check { id: "error_objects", title: "errors carry a code and a message", run: check_errors },
    Check { id: "kernels", title: "elementwise kernels match a host computation", run: check_kernels },
    Check {
        id: "concurrency",
        title: "allocation, copies and kernels from several threads",
        run: check_concurrency,
    },
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

/// (offset, length) pairs inside a buffer of [`OFFSET_BUFFER`] bytes:
/// odd offsets and lengths, page straddling, up to the last byte.
const OFFSETS: &[(usize, usize)] =
    &[(1, 1), (3, 3), (7, 4097), (4095, 2), (63, 1000), (OFFSET_BUFFER - 5, 5)];
const OFFSET_BUFFER: usize = 8192 + 64;

fn check_offsets(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    for d in devices(&p) {
        let buf = p.allocate(d, OFFSET_BUFFER).map_err(fail)?;
        let other = p.allocate(d, OFFSET_BUFFER).map_err(fail)?;
        for &(offset, n) in OFFSETS {
            let data = pattern(n, 0x40 ^ offset as u8);
            p.set_memory(&buf, 0, 0, OFFSET_BUFFER, None).map_err(fail)?;
            p.copy_to_device(&buf, offset, &data).map_err(fail)?;
            let mut whole = vec![0xFFu8; OFFSET_BUFFER];
            p.copy_to_host(&buf, 0, &mut whole).map_err(fail)?;
            let mut expected = vec![0u8; OFFSET_BUFFER];
            expected[offset..offset + n].copy_from_slice(&data);
            if let Some(at) = whole.iter().zip(&expected).position(|(x, y)| x != y) {
                return Err(NotPassed::Fail(format!(
                    "device {d}: copying {n} bytes to offset {offset} left byte {at} wrong \
                     (0x{:02x}, expected 0x{:02x})",
                    whole[at], expected[at]
                )));
            }
            let mut part = vec![0u8; n];
            p.copy_to_host(&buf, offset, &mut part).map_err(fail)?;
            if part != data {
                return Err(NotPassed::Fail(format!(
                    "device {d}: reading {n} bytes back from offset {offset} differs"
                )));
            }
            // Device to device, from one odd offset to another.
            let dst_offset = (offset * 3 + 1) % (OFFSET_BUFFER - n + 1);
            p.set_memory(&other, 0, 0x5A, OFFSET_BUFFER, None).map_err(fail)?;
            p.copy_device_to_device(&other, dst_offset, &buf, offset, n, None).map_err(fail)?;
            p.set_memory(&other, dst_offset + n, 0x3C, OFFSET_BUFFER - dst_offset - n, None).map_err(fail)?;
            p.synchronize(d).map_err(fail)?;
            p.copy_to_host(&other, 0, &mut whole).map_err(fail)?;
            expected.fill(0x5A);
            expected[dst_offset..dst_offset + n].copy_from_slice(&data);
            expected[dst_offset + n..].fill(0x3C);
            if let Some(at) = whole.iter().zip(&expected).position(|(x, y)| x != y) {
                return Err(NotPassed::Fail(format!(
                    "device {d}: device-to-device copy of {n} bytes from offset {offset} to offset \
                     {dst_offset} (then set_memory after it) left byte {at} wrong"
                )));
            }
        }
    }
    Ok(format!("{} offset/length pairs on {} device(s)", OFFSETS.len(), p.device_count()))
}

fn check_stream_ordering(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    const N: usize = 1 << 20;
    for d in devices(&p) {
        let producer = p.create_stream(d, 0).map_err(fail)?;
        let consumer = p.create_stream(d, 0).map_err(fail)?;
        let event = p.create_event(d, false).map_err(fail)?;
        let a = p.allocate(d, N).map_err(fail)?;
        let b = p.allocate(d, N).map_err(fail)?;
        let c = p.allocate(d, N).map_err(fail)?;
        p.set_memory(&c, 0, 0, N, None).map_err(fail)?;
        for round in 1..=3u8 {
            // Producer: a = round, b = a; consumer waits for it, then c = b.
            p.set_memory(&a, 0, round, N, Some(&producer)).map_err(fail)?;
            p.copy_device_to_device(&b, 0, &a, 0, N, Some(&producer)).map_err(fail)?;
            event.record(&producer).map_err(fail)?;
            consumer.wait_event(&event).map_err(fail)?;
            p.copy_device_to_device(&c, 0, &b, 0, N, Some(&consumer)).map_err(fail)?;
            consumer.synchronize().map_err(fail)?;
            if !event.query().map_err(fail)? {
                return Err(NotPassed::Fail(format!(
                    "device {d}: an event waited for by a synchronized stream queries as not complete"
                )));
            }
            let mut back = vec![0u8; N];
            p.copy_to_host(&c, 0, &mut back).map_err(fail)?;
            if let Some(at) = back.iter().position(|&x| x != round) {
                return Err(NotPassed::Fail(format!(
                    "device {d}: round {round}: byte {at} is {} after stream_wait_event ordered the copy \
                     after the producer's work (expected {round})",
                    back[at]
                )));
            }
        }
        producer.synchronize().map_err(fail)?;
        if !producer.query().map_err(fail)? || !consumer.query().map_err(fail)? {
            return Err(NotPassed::Fail(format!("device {d}: a synchronized stream queries as busy")));
        }
    }
    Ok(format!("producer/consumer streams ordered by events on {} device(s)", p.device_count()))
}

/// The elementwise kernels the `kernels` check knows: name, whether the
/// schema has an `alpha` Scalar, and the host reference.
type HostFn = fn(f32, f32, f32) -> f32;
const KERNELS: &[(&str, bool, HostFn)] = &[
    ("add.Tensor", true, |a, b, alpha| a + alpha * b),
    ("sub.Tensor", true, |a, b, alpha| a - alpha * b),
    ("mul.Tensor", false, |a, b, _| a * b),
    ("div.Tensor", false, |a, b, _| a / b),
];
const KERNEL_A: &[f32] = &[1.5, -2.0, 3.25, 0.5, 7.0, -0.125, 10.0];
const KERNEL_B: &[f32] = &[2.0, 4.0, -0.5, 8.0, 1.25, 16.0, -2.0];
const KERNEL_ALPHA: f32 = 2.0;

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Runs binary elementwise kernel `op` on `a`, `b` (float32, 1-D) on
/// `stream` and returns the output.
fn run_binary(
    p: &Arc<Plugin>,
    stream: &Stream,
    op: &OpKernel,
    alpha: bool,
    a: &[f32],
    b: &[f32],
) -> Result<Vec<f32>, Error> {
    let d = stream.device();
    let n = a.len();
    let bytes = n * 4;
    let (da, db, dout) = (p.allocate(d, bytes)?, p.allocate(d, bytes)?, p.allocate(d, bytes)?);
    p.copy_to_device(&da, 0, &to_bytes(a))?;
    p.copy_to_device(&db, 0, &to_bytes(b))?;
    p.set_memory(&dout, 0, 0, bytes, None)?;
    let shape = [n as i64];
    let mut args = vec![
        Arg::Tensor(TensorArg::contiguous(&da, TFL_DType::F32, &shape)?),
        Arg::Tensor(TensorArg::contiguous(&db, TFL_DType::F32, &shape)?),
    ];
    if alpha {
        args.push(Arg::Scalar(ScalarArg::Float(f64::from(KERNEL_ALPHA))));
    }
    let out = TensorArg::contiguous(&dout, TFL_DType::F32, &shape)?;
    p.launch(op, stream, &args, std::slice::from_ref(&out))?;
    stream.synchronize()?;
    let mut back = vec![0u8; bytes];
    p.copy_to_host(&dout, 0, &mut back)?;
    Ok(from_bytes(&back))
}

fn close(x: f32, y: f32) -> bool {
    (x - y).abs() <= 1e-5 * y.abs().max(1.0)
}

fn check_kernels(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    let present: Vec<_> = KERNELS
        .iter()
        .filter_map(|&(name, alpha, host)| p.op(name).map(|op| (op.clone(), alpha, host)))
        .collect();
    if present.is_empty() {
        return Err(NotPassed::Skip(format!(
            "none of {} is implemented",
            KERNELS.iter().map(|k| k.0).collect::<Vec<_>>().join(", ")
        )));
    }
    let mut failures = Vec::new();
    let mut passed = Vec::new();
    for d in devices(&p) {
        let stream = p.create_stream(d, 0).map_err(fail)?;
        for (op, alpha, host) in &present {
            crate::isolate::note(&format!("calling {} on device {d}", op.name));
            match run_binary(&p, &stream, op, *alpha, KERNEL_A, KERNEL_B) {
                Err(e) => failures.push(format!("device {d}: {}: {e}", op.name)),
                Ok(out) => {
                    let expected: Vec<f32> =
                        KERNEL_A.iter().zip(KERNEL_B).map(|(&a, &b)| host(a, b, KERNEL_ALPHA)).collect();
                    if let Some(i) = out.iter().zip(&expected).position(|(&x, &y)| !close(x, y)) {
                        failures.push(format!(
                            "device {d}: {}: element {i} is {} instead of {} (a = {:?}, b = {:?}{})",
                            op.name,
                            out[i],
                            expected[i],
                            KERNEL_A,
                            KERNEL_B,
                            if *alpha { format!(", alpha = {KERNEL_ALPHA}") } else { String::new() }
                        ));
                    } else if d == 0 {
                        passed.push(op.name.clone());
                    }
                }
            }
        }
    }
    if failures.is_empty() {
        Ok(format!("{} correct on float32 inputs", passed.join(", ")))
    } else {
        Err(NotPassed::Fail(failures.join("; ")))
    }
}

const THREADS: usize = 4;
const ITERATIONS: usize = 16;

/// One thread's work for `check_concurrency`.
fn concurrent_worker(p: &Arc<Plugin>, t: usize, add: Option<&OpKernel>) -> Result<(), String> {
    let d = (t as i32) % p.device_count().max(1);
    let err = |e: Error| format!("thread {t}, device {d}: {e}");
    let stream = p.create_stream(d, 0).map_err(err)?;
    for i in 0..ITERATIONS {
        let n = 1 + i * 97 + t * 13;
        let data = pattern(n, (t * 16 + i) as u8);
        let a = p.allocate(d, n).map_err(err)?;
        let b = p.allocate(d, n).map_err(err)?;
        p.copy_to_device(&a, 0, &data).map_err(err)?;
        p.copy_device_to_device(&b, 0, &a, 0, n, Some(&stream)).map_err(err)?;
        stream.synchronize().map_err(err)?;
        let mut back = vec![0u8; n];
        p.copy_to_host(&b, 0, &mut back).map_err(err)?;
        if back != data {
            return Err(format!("thread {t}, device {d}: iteration {i}: a {n}-byte round trip differs"));
        }
        drop((a, b));
        if let Some(op) = add {
            let x: Vec<f32> = (0..33).map(|k| (k + t * 100 + i) as f32).collect();
            let y: Vec<f32> = (0..33).map(|k| k as f32 * 0.5).collect();
            let out = run_binary(p, &stream, op, true, &x, &y).map_err(err)?;
            let bad = x.iter().zip(&y).zip(&out).position(|((&a, &b), &o)| !close(o, a + KERNEL_ALPHA * b));
            if let Some(k) = bad {
                return Err(format!(
                    "thread {t}, device {d}: iteration {i}: add.Tensor element {k} is wrong"
                ));
            }
        }
    }
    Ok(())
}

fn check_concurrency(ctx: &mut Ctx<'_>) -> Outcome {
    let p = plugin(ctx)?;
    let add = p.op("add.Tensor").cloned();
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let p = &p;
                let add = add.as_ref();
                scope.spawn(move || concurrent_worker(p, t, add))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(t, h)| h.join().unwrap_or_else(|_| Err(format!("thread {t} panicked"))))
            .collect()
    });
    let failures: Vec<String> = outcomes.into_iter().filter_map(Result::err).collect();
    if !failures.is_empty() {
        return Err(NotPassed::Fail(failures.join("; ")));
    }
    Ok(format!(
        "{THREADS} threads x {ITERATIONS} allocate/copy/free{}",
        if add.is_some() { " and add.Tensor calls" } else { " (no add.Tensor to call)" }
    ))
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
    let mut ctx = Ctx { path, options, load_error: None, library: None, plugin: None };
    for (i, check) in CHECKS.iter().enumerate() {
        sink.start(i, check.id, check.title);
        let started = Instant::now();
        let (verdict, detail) = match (check.run)(&mut ctx) {
            Ok(detail) => (Verdict::Pass, detail),
            Err(NotPassed::Fail(msg)) => (Verdict::Fail, msg),
            Err(NotPassed::Skip(msg)) => (Verdict::Skip, msg),
            Err(NotPassed::Pass(msg)) => (Verdict::Pass, msg),
        };
        let duration_ms = started.elapsed().as_secs_f64() * 1e3;
        sink.finish(CheckResult { id: check.id, title: check.title, verdict, detail, duration_ms });
        if check.id == "initialize" {
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

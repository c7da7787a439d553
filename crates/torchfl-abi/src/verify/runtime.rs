//! Checks of the loaded plugin's runtime: events, ordering across streams,
//! error objects, kernels against a host computation, and concurrency.

use std::sync::Arc;

use torchfl_core::plugin::{OpKernel, Stream};
use torchfl_core::{Arg, Error, Plugin, ScalarArg, TensorArg};
use torchfl_ffi::TFL_DType;

use super::memory::pattern;
use super::{device_plugin, devices, plugin, Ctx, NotPassed, Outcome};

/// One device's default stream is stable, and a created stream runs,
/// reports completion and is destroyed.
pub(super) fn exercise_streams(p: &Arc<Plugin>, d: i32) -> Result<(), NotPassed> {
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    let default = p.default_stream(d).map_err(fail)?;
    let again = p.default_stream(d).map_err(fail)?;
    if default.raw() != again.raw() {
        return Err(NotPassed::Fail(format!("device {d}: default_stream returned two different streams")));
    }
    let s = p.create_stream(d, 0).map_err(fail)?;
    let buf = p.allocate(d, 1 << 16).map_err(fail)?;
    p.set_memory(&buf, 0, 7, 1 << 16, Some(&s)).map_err(fail)?;
    s.synchronize().map_err(fail)?;
    if !s.query().map_err(fail)? {
        return Err(NotPassed::Fail(format!("device {d}: stream_query is false after stream_synchronize")));
    }
    let mut back = vec![0u8; 1 << 16];
    p.copy_to_host(&buf, 0, &mut back).map_err(fail)?;
    if back.iter().any(|&b| b != 7) {
        return Err(NotPassed::Fail(format!("device {d}: set_memory on a stream was not applied")));
    }
    Ok(())
}

pub(super) fn check_events(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
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

pub(super) fn check_errors(ctx: &mut Ctx<'_>) -> Outcome {
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

pub(super) fn check_stream_ordering(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
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
pub(super) const KERNEL_A: &[f32] = &[1.5, -2.0, 3.25, 0.5, 7.0, -0.125, 10.0];
pub(super) const KERNEL_B: &[f32] = &[2.0, 4.0, -0.5, 8.0, 1.25, 16.0, -2.0];
const KERNEL_ALPHA: f32 = 2.0;

pub(super) fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

pub(super) fn from_bytes(b: &[u8]) -> Vec<f32> {
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

pub(super) fn close(x: f32, y: f32) -> bool {
    (x - y).abs() <= 1e-5 * y.abs().max(1.0)
}

pub(super) fn check_kernels(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
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
            crate::protocol::note(&format!("calling {} on device {d}", op.name));
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

pub(super) fn check_concurrency(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
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

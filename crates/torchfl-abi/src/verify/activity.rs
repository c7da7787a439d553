//! The optional activity-records check (ABI 1.8): the clock pair is sane,
//! recording follows `activity_enable`, the records of a kernel call carry
//! the correlation id the host set around it and fall near the call in
//! time, user ranges are recorded, and nothing is recorded once recording
//! is off.

use std::collections::BTreeMap;

use torchfl_core::{ActivityKind, ActivityRecord, Drained, Error, Plugin, StatusCode};
use torchfl_ffi::TFL_ACTIVITY_ALL_KINDS;

use super::operands::Operands;
use super::{device_plugin, Ctx, NotPassed, Outcome};

/// The correlation id set around the add while recording.
const ADD_ID: u64 = 0x7f1_0001;
/// The correlation id set around the add while recording is off.
const OFF_ID: u64 = 0x7f1_0002;
/// A mask with a bit outside `TFL_ACTIVITY_ALL_KINDS`.
const BAD_MASK: u32 = 1 << 20;
const RANGE_NAME: &str = "verify-range";
const MARK_NAME: &str = "verify-mark";
/// How far `activity_clock`'s host time may be from `CLOCK_MONOTONIC` now:
/// a sanity bound (another clock, another unit), not a timing assertion.
const CLOCK_BOUND_NS: u64 = 10_000_000_000;
/// How far outside the launch-to-synchronize interval the add's records may
/// fall: as loose, for the same reason.
const WINDOW_SLACK_NS: u64 = 5_000_000_000;

/// The host's `CLOCK_MONOTONIC` now, in nanoseconds.
fn monotonic_ns() -> Result<u64, NotPassed> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return Err(NotPassed::Fail(format!(
            "reading the host's CLOCK_MONOTONIC failed: {}",
            std::io::Error::last_os_error()
        )));
    }
    let (Ok(sec), Ok(nsec)) = (u64::try_from(ts.tv_sec), u64::try_from(ts.tv_nsec)) else {
        return Err(NotPassed::Fail("the host's CLOCK_MONOTONIC is negative".into()));
    };
    Ok(sec.saturating_mul(1_000_000_000).saturating_add(nsec))
}

/// Turns recording off and clears the correlation id when the check ends,
/// however it ends, so that the checks after it run unrecorded.
struct RecordingOff<'p>(&'p Plugin);

impl Drop for RecordingOff<'_> {
    fn drop(&mut self) {
        let _ = self.0.activity_set_correlation(0);
        let _ = self.0.activity_enable(0);
    }
}

fn describe(r: &ActivityRecord) -> String {
    format!(
        "the {} record {:?} (correlation id {:#x}, {}..{} ns on the {} clock)",
        r.kind.name().to_uppercase(),
        r.name,
        r.correlation_id,
        r.start_ns,
        r.end_ns,
        if r.host_clock { "host" } else { "device" }
    )
}

/// Drains, failing with the drain's error; `when` says which drain.
fn drain(p: &Plugin, when: &str) -> Result<Drained, NotPassed> {
    p.activity_drain().map_err(|e| NotPassed::Fail(format!("activity_drain {when}: {e}")))
}

/// Every record's correlation id is 0 or one of `set`, the ids the host
/// has set so far.
fn ids_set_by_the_host(records: &[ActivityRecord], set: &[u64], when: &str) -> Result<(), NotPassed> {
    match records.iter().find(|r| r.correlation_id != 0 && !set.contains(&r.correlation_id)) {
        None => Ok(()),
        Some(r) => Err(NotPassed::Fail(format!(
            "{when}: {} carries a correlation id the host never set (it set only 0{})",
            describe(r),
            set.iter().map(|id| format!(", {id:#x}")).collect::<String>()
        ))),
    }
}

/// "api 2, kernel 1": how many records of each kind.
fn kind_counts<'r>(records: impl Iterator<Item = &'r ActivityRecord>) -> String {
    let mut counts: BTreeMap<u32, (ActivityKind, usize)> = BTreeMap::new();
    for r in records {
        counts.entry(r.kind.raw()).or_insert((r.kind, 0)).1 += 1;
    }
    counts.values().map(|(k, n)| format!("{} {n}", k.name())).collect::<Vec<_>>().join(", ")
}

/// Step 1: two clock pairs, monotonic, the host half on `CLOCK_MONOTONIC`.
fn check_clock(p: &Plugin) -> Result<(), NotPassed> {
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    let (device1, host1) = p.activity_clock(0).map_err(fail)?;
    let now = monotonic_ns()?;
    let (device2, host2) = p.activity_clock(0).map_err(fail)?;
    if device2 < device1 || host2 < host1 {
        return Err(NotPassed::Fail(format!(
            "activity_clock(0) went backwards: (device {device1} ns, host {host1} ns), then (device \
             {device2} ns, host {host2} ns)"
        )));
    }
    if host1.abs_diff(now) > CLOCK_BOUND_NS {
        return Err(NotPassed::Fail(format!(
            "activity_clock(0)'s host time {host1} ns is {:.1} s from the host's CLOCK_MONOTONIC ({now} ns): \
             it must be read from CLOCK_MONOTONIC, in nanoseconds",
            host1.abs_diff(now) as f64 * 1e-9
        )));
    }
    Ok(())
}

/// Step 2: a mask with a bit outside `TFL_ACTIVITY_ALL_KINDS` is refused,
/// then every kind is enabled.
fn enable_all(p: &Plugin) -> Result<(), NotPassed> {
    match p.activity_enable(BAD_MASK) {
        Err(Error::RuntimeCall { status, .. }) if status.code == StatusCode::InvalidArgument => {}
        Ok(()) => {
            return Err(NotPassed::Fail(format!(
                "activity_enable({BAD_MASK:#x}), a bit outside TFL_ACTIVITY_ALL_KINDS \
                 ({TFL_ACTIVITY_ALL_KINDS:#x}), succeeded: it must be INVALID_ARGUMENT"
            )))
        }
        Err(e) => {
            return Err(NotPassed::Fail(format!(
                "activity_enable({BAD_MASK:#x}), a bit outside TFL_ACTIVITY_ALL_KINDS, must be \
                 INVALID_ARGUMENT: {e}"
            )))
        }
    }
    p.activity_enable(TFL_ACTIVITY_ALL_KINDS).map_err(|e| NotPassed::Fail(e.to_string()))
}

/// The add's records fall within `[lo, hi]` on the host's
/// timeline: host-clock records directly, device-clock ones mapped through
/// the clock pair `(pair_device, pair_host)`.
fn within_window(
    records: &[&ActivityRecord],
    (pair_device, pair_host): (u64, u64),
    (lo, hi): (u64, u64),
) -> Result<(), NotPassed> {
    let to_host = |r: &ActivityRecord, t: u64| -> i128 {
        if r.host_clock {
            i128::from(t)
        } else {
            i128::from(pair_host) + i128::from(t) - i128::from(pair_device)
        }
    };
    for r in records {
        let (start, end) = (to_host(r, r.start_ns), to_host(r, r.end_ns));
        if start < i128::from(lo) || end > i128::from(hi) {
            let mapping = if r.host_clock {
                String::new()
            } else {
                format!(
                    ", mapped through the clock pair (device {pair_device} ns = host {pair_host} ns) to host \
                     {start}..{end} ns"
                )
            };
            return Err(NotPassed::Fail(format!(
                "{}{mapping} is outside the window {lo}..{hi} ns (host CLOCK_MONOTONIC) from {} s before the \
                 add's launch to {} s after its stream synchronized",
                describe(r),
                WINDOW_SLACK_NS / 1_000_000_000,
                WINDOW_SLACK_NS / 1_000_000_000,
            )));
        }
    }
    Ok(())
}

/// Step 5: a range and a mark are recorded, under their names.
fn check_ranges(p: &Plugin) -> Result<String, NotPassed> {
    if !p.has_ranges() {
        return Ok("no ranges (the optional range entries are NULL)".into());
    }
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    crate::protocol::note("pushing a range and marking an instant");
    p.range_push(RANGE_NAME).map_err(fail)?;
    p.range_mark(MARK_NAME).map_err(fail)?;
    p.range_pop().map_err(fail)?;
    let drained = drain(p, "after a range and a mark")?;
    ids_set_by_the_host(&drained.records, &[ADD_ID], "after a range and a mark")?;
    let find = |kind: ActivityKind, name: &str, calls: &str| {
        drained.records.iter().find(|r| r.kind == kind && r.name == name).ok_or_else(|| {
            NotPassed::Fail(format!(
                "{calls} left no {kind_upper} record named {name:?}, though {kind_upper} was enabled (the \
                 drain held: {})",
                if drained.records.is_empty() {
                    "nothing".into()
                } else {
                    kind_counts(drained.records.iter())
                },
                kind_upper = kind.name().to_uppercase(),
            ))
        })
    };
    find(ActivityKind::Range, RANGE_NAME, &format!("range_push({RANGE_NAME:?}) and range_pop()"))?;
    let mark = find(ActivityKind::Mark, MARK_NAME, &format!("range_mark({MARK_NAME:?})"))?;
    if mark.start_ns != mark.end_ns {
        return Err(NotPassed::Fail(format!("{}: a mark is an instant, start == end", describe(mark))));
    }
    Ok("range and mark recorded".into())
}

pub(super) fn check_activity(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
    if !p.has_activity() {
        return Err(NotPassed::Skip("no activity records (the optional ABI 1.8 get_activity)".into()));
    }
    let Some(add) = p.op("add.Tensor") else {
        return Err(NotPassed::Skip("the check calls add.Tensor, which the plugin lacks".into()));
    };
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    let _off = RecordingOff(&p);
    let mut detail = Vec::new();

    crate::protocol::note("reading activity_clock(0)");
    check_clock(&p)?;
    detail.push("clock pairs monotonic, host time on CLOCK_MONOTONIC".to_owned());

    enable_all(&p)?;

    // The add, on a created stream, with its correlation id set around it.
    let stream = p.create_stream(0, 0).map_err(fail)?;
    let operands = Operands::new(&p).map_err(fail)?;
    let (sum, sum_off) = (operands.output().map_err(fail)?, operands.output().map_err(fail)?);
    let args = operands.add_args(&operands.a, &operands.b).map_err(fail)?;
    p.synchronize(0).map_err(fail)?;
    drain(&p, "before the add (to discard what was pending)")?;
    let pair = p.activity_clock(0).map_err(fail)?;
    let before = monotonic_ns()?;
    crate::protocol::note("calling add.Tensor with a correlation id, recording every kind");
    p.activity_set_correlation(ADD_ID).map_err(fail)?;
    let launched = p.launch(add, &stream, &args, &[operands.tensor(&sum).map_err(fail)?]);
    p.activity_set_correlation(0).map_err(fail)?;
    launched.map_err(fail)?;
    stream.synchronize().map_err(fail)?;
    let after = monotonic_ns()?;
    let drained = drain(&p, "after the add")?;
    let mut dropped = drained.dropped;
    ids_set_by_the_host(&drained.records, &[ADD_ID], "after the add")?;
    let tagged: Vec<&ActivityRecord> =
        drained.records.iter().filter(|r| r.correlation_id == ADD_ID).collect();
    let dropped_note =
        if dropped == 0 { String::new() } else { format!(" ({dropped} records were dropped)") };
    if tagged.is_empty() {
        return Err(NotPassed::Fail(format!(
            "no record carries the correlation id {ADD_ID:#x} set around add.Tensor (the drain held: \
             {}){dropped_note}",
            if drained.records.is_empty() { "nothing".into() } else { kind_counts(drained.records.iter()) }
        )));
    }
    let Some(kernel) = tagged.iter().find(|r| r.kind == ActivityKind::Kernel) else {
        return Err(NotPassed::Fail(format!(
            "the add's kernel execution has no KERNEL record with its correlation id {ADD_ID:#x} (records \
             with it: {}){dropped_note}",
            kind_counts(tagged.iter().copied())
        )));
    };
    within_window(
        &tagged,
        pair,
        (before.saturating_sub(WINDOW_SLACK_NS), after.saturating_add(WINDOW_SLACK_NS)),
    )?;
    detail.push(format!(
        "add.Tensor: {} records with its correlation id ({}), kernel {:?} {} ns",
        tagged.len(),
        kind_counts(tagged.iter().copied()),
        kernel.name,
        kernel.end_ns.saturating_sub(kernel.start_ns)
    ));

    detail.push(check_ranges(&p)?);

    // Recording off: the same call records nothing.
    p.activity_enable(0).map_err(fail)?;
    crate::protocol::note("calling add.Tensor with recording off");
    p.activity_set_correlation(OFF_ID).map_err(fail)?;
    let launched = p.launch(add, &stream, &args, &[operands.tensor(&sum_off).map_err(fail)?]);
    p.activity_set_correlation(0).map_err(fail)?;
    launched.map_err(fail)?;
    stream.synchronize().map_err(fail)?;
    let drained = drain(&p, "after recording was turned off")?;
    dropped = dropped.saturating_add(drained.dropped);
    ids_set_by_the_host(&drained.records, &[ADD_ID, OFF_ID], "after recording was turned off")?;
    if let Some(r) =
        drained.records.iter().find(|r| r.correlation_id == OFF_ID || r.kind == ActivityKind::Kernel)
    {
        return Err(NotPassed::Fail(format!(
            "recording was off (activity_enable(0)) during an add.Tensor with correlation id {OFF_ID:#x}, \
             yet {} was recorded",
            describe(r)
        )));
    }
    detail.push("nothing recorded while off".into());
    if dropped > 0 {
        detail.push(format!("{dropped} records dropped"));
    }
    Ok(detail.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: ActivityKind, host_clock: bool, start_ns: u64, end_ns: u64, id: u64) -> ActivityRecord {
        ActivityRecord {
            kind,
            host_clock,
            device: Some(0),
            stream: 0,
            correlation_id: id,
            start_ns,
            end_ns,
            name: "add.Tensor".into(),
            detail: String::new(),
        }
    }

    fn failure(r: Result<(), NotPassed>) -> String {
        match r {
            Err(NotPassed::Fail(msg)) => msg,
            Err(NotPassed::Skip(msg)) => panic!("skipped: {msg}"),
            Ok(()) => panic!("passed"),
        }
    }

    #[test]
    fn device_times_are_mapped_through_the_clock_pair() {
        // Device clock 1000 ns = host 50_000 ns; the window is host 40_000..60_000.
        let pair = (1_000, 50_000);
        let inside = record(ActivityKind::Kernel, false, 1_500, 2_000, ADD_ID);
        assert!(within_window(&[&inside], pair, (40_000, 60_000)).is_ok());
        let host = record(ActivityKind::Api, true, 45_000, 46_000, ADD_ID);
        assert!(within_window(&[&host], pair, (40_000, 60_000)).is_ok());
        // A device time read as a host time would land far outside.
        let late = record(ActivityKind::Kernel, false, 20_000, 20_500, ADD_ID);
        let msg = failure(within_window(&[&inside, &late], pair, (40_000, 60_000)));
        assert!(msg.contains("KERNEL record \"add.Tensor\"") && msg.contains("69000..69500"), "{msg}");
        let early = record(ActivityKind::Api, true, 1_000, 1_000, ADD_ID);
        let msg = failure(within_window(&[&early], pair, (40_000, 60_000)));
        assert!(!msg.contains("mapped") && msg.contains("window 40000..60000"), "{msg}");
    }

    #[test]
    fn only_ids_the_host_set_are_accepted() {
        let ok =
            [record(ActivityKind::Api, true, 1, 2, 0), record(ActivityKind::Kernel, false, 1, 2, ADD_ID)];
        assert!(ids_set_by_the_host(&ok, &[ADD_ID], "after the add").is_ok());
        let stray = [record(ActivityKind::Sync, true, 1, 2, 0x1234)];
        let msg = failure(ids_set_by_the_host(&stray, &[ADD_ID], "after the add"));
        assert!(msg.contains("after the add: the SYNC record") && msg.contains("0x1234"), "{msg}");
        assert!(msg.ends_with("(it set only 0, 0x7f10001)"), "{msg}");
    }

    #[test]
    fn kinds_are_counted_in_abi_order() {
        let records = [
            record(ActivityKind::Kernel, false, 1, 2, 0),
            record(ActivityKind::Api, true, 1, 2, 0),
            record(ActivityKind::Api, true, 1, 2, 0),
        ];
        assert_eq!(kind_counts(records.iter()), "api 2, kernel 1");
    }
}

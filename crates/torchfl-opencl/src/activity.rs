//! Activity records (ABI 1.8): what the plugin did for each call, in
//! OpenCL's terms, and when its device work ran on the device's own
//! profiling clock.
//!
//! What is recorded, when its kind is enabled:
//! - `TFL_ACTIVITY_API` (host clock): each `clEnqueue*` call, and `clFinish`
//!   and `clWaitForEvents`, named by the exact CL function. Its detail is
//!   the kernel and its ranges (`binary global=[6] local=auto`) or the bytes
//!   (`4096 bytes`).
//! - `TFL_ACTIVITY_SYNC` (host clock): the same `clFinish` and
//!   `clWaitForEvents` calls, as waits; the detail says what waited.
//! - `TFL_ACTIVITY_BUILD` (host clock): each `clBuildProgram` (a program's
//!   build on first use), its detail the kernel and the build options.
//! - `TFL_ACTIVITY_KERNEL`, `COPY`, `MEMSET` (device clock): from the
//!   `CL_PROFILING_COMMAND_START`/`END` timestamps of the enqueue's event.
//!   Every queue is created with `CL_QUEUE_PROFILING_ENABLE` (event timing
//!   needs it already). With one of these kinds on, an enqueue asks for its
//!   event and keeps it with a pending record; a drain turns the events that
//!   are `CL_COMPLETE` into records and releases them, and leaves the others
//!   for a later drain: a drain never waits for the device.
//! - `TFL_ACTIVITY_RANGE` and `MARK` (host clock): the host's user ranges
//!   (`range_push`, `range_pop`, `range_mark`), on a per-thread stack.
//!
//! Recording is off until the host enables it; off, each recording site
//! costs one relaxed load of the kinds mask. Records carry the calling
//! thread's correlation id (set by the host around each call), taken when
//! the work is enqueued, so a device record carries the id of the call that
//! queued it however late it is drained. Staging is bounded
//! ([`STAGING_BOUND`] records, pending ones included): a record past it is
//! counted as dropped (its event released at once), never waited for.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ffi::c_char;
use std::fmt;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use torchfl_ffi::{self as ffi, TFL_ActivityRecord, TFL_Stream};

use crate::cl::{self, Cl, ClInt};
use crate::error::{Error, Result};

/// An OpenCL event handle stored as an integer (as `runtime::Handle` is),
/// so that staged records are `Send`.
pub(crate) type Handle = usize;

/// Records staged at most (complete and pending together) between drains.
pub(crate) const STAGING_BOUND: usize = 1 << 15;

/// Ranges open at most per thread; deeper pushes are counted (so that pops
/// still pair) but not recorded.
pub(crate) const MAX_RANGE_DEPTH: usize = 256;

const NAME: usize = ffi::TFL_ACTIVITY_NAME_BYTES;
const DETAIL: usize = ffi::TFL_ACTIVITY_DETAIL_BYTES;

/// The host's `CLOCK_MONOTONIC`, in nanoseconds (0 if it cannot be read).
pub(crate) fn host_now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a writable timespec; CLOCK_MONOTONIC always exists on
    // the platforms OpenCL's ICD loader runs on.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// A kind's bit in the enable mask.
pub(crate) const fn bit(kind: u32) -> u32 {
    1 << kind
}

/// Whether records of `kind` are on the host's clock.
fn host_clock(kind: u32) -> bool {
    !matches!(kind, ffi::TFL_ACTIVITY_KERNEL | ffi::TFL_ACTIVITY_COPY | ffi::TFL_ACTIVITY_MEMSET)
}

// ---------------------------------------------------------------------------
// Fixed-size text
// ---------------------------------------------------------------------------

/// Text for a record's name or detail: at most `N - 1` bytes, so that it
/// always ends with a NUL in its `N`-byte array. Longer text is cut at a
/// character boundary; nothing is allocated.
#[derive(Clone, Copy)]
pub(crate) struct Text<const N: usize> {
    bytes: [u8; N],
    len: usize,
    full: bool,
}

impl<const N: usize> Text<N> {
    /// Empty text.
    pub(crate) const fn new() -> Self {
        Self { bytes: [0; N], len: 0, full: false }
    }

    /// The text `args` formats to, truncated.
    pub(crate) fn of(args: fmt::Arguments<'_>) -> Self {
        let mut text = Self::new();
        // Text's write_str never fails; a Display impl's error only ends
        // the text early.
        let _ = fmt::write(&mut text, args);
        text
    }

    /// `bytes` (a C string's, without its NUL), invalid UTF-8 replaced.
    pub(crate) fn lossy(bytes: &[u8]) -> Self {
        let mut text = Self::new();
        let s: Cow<'_, str> = String::from_utf8_lossy(bytes);
        let _ = fmt::Write::write_str(&mut text, &s);
        text
    }

    /// The text so far.
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }

    /// As a NUL-terminated C array.
    fn c_array(&self) -> [c_char; N] {
        let mut out = [0 as c_char; N];
        for (o, &b) in out.iter_mut().zip(&self.bytes[..self.len]) {
            *o = b as c_char;
        }
        out
    }
}

impl<const N: usize> fmt::Write for Text<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.full {
            return Ok(());
        }
        let room = N.saturating_sub(1).saturating_sub(self.len);
        let mut take = s.len().min(room);
        if take < s.len() {
            while !s.is_char_boundary(take) {
                take -= 1;
            }
            self.full = true;
        }
        // A NUL would end the C string early: shown as a space instead.
        for (dst, &b) in self.bytes[self.len..self.len + take].iter_mut().zip(s.as_bytes()) {
            *dst = if b == 0 { b' ' } else { b };
        }
        self.len += take;
        Ok(())
    }
}

impl<const N: usize> fmt::Debug for Text<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

/// A record as staged: complete, or waiting for its event's timestamps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Staged {
    pub(crate) kind: u32,
    pub(crate) device: i32,
    /// The `TFL_Stream*` as an address; 0 for none.
    pub(crate) stream: usize,
    pub(crate) correlation: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) name: Text<NAME>,
    pub(crate) detail: Text<DETAIL>,
}

impl Staged {
    /// The ABI record, its `struct_size` the whole struct's.
    pub(crate) fn record(&self) -> TFL_ActivityRecord {
        TFL_ActivityRecord {
            struct_size: std::mem::size_of::<TFL_ActivityRecord>(),
            kind: self.kind,
            flags: if host_clock(self.kind) { ffi::TFL_ACTIVITY_HOST_CLOCK } else { 0 },
            device: self.device,
            reserved: 0,
            stream: self.stream as *mut TFL_Stream,
            correlation_id: self.correlation,
            start_ns: self.start,
            end_ns: self.end.max(self.start),
            name: self.name.c_array(),
            detail: self.detail.c_array(),
        }
    }
}

/// What a drain learns of a pending record's event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventState {
    /// Not run yet: the record waits for a later drain.
    Pending,
    /// Ran, between these device times.
    Done { start: u64, end: u64 },
    /// Failed, or its timestamps cannot be read: the record is discarded.
    Failed,
}

/// The event queries a drain makes (OpenCL's, or a test's).
pub(crate) trait Events {
    /// Where `event` is, without waiting.
    fn state(&self, event: Handle) -> EventState;
    /// Releases the reference the recorder held.
    fn release(&self, event: Handle);
}

impl Events for Cl {
    fn state(&self, event: Handle) -> EventState {
        let e = event as cl::Event;
        // SAFETY: a live event the recorder holds a reference to; the
        // execution status is a cl_int.
        let status: Result<ClInt> = unsafe {
            Cl::info_value(self.get_event_info, e, cl::EVENT_COMMAND_EXECUTION_STATUS, "clGetEventInfo")
        };
        match status {
            Ok(cl::COMPLETE) => {}
            Ok(s) if s > cl::COMPLETE => return EventState::Pending,
            _ => return EventState::Failed,
        }
        // SAFETY: a completed event of a profiling queue; both are cl_ulong.
        let stamps: Result<(u64, u64)> = unsafe {
            let info = self.get_event_profiling_info;
            Cl::info_value(info, e, cl::PROFILING_COMMAND_START, "clGetEventProfilingInfo").and_then(
                |start| {
                    Cl::info_value(info, e, cl::PROFILING_COMMAND_END, "clGetEventProfilingInfo")
                        .map(|end| (start, end))
                },
            )
        };
        match stamps {
            Ok((start, end)) => EventState::Done { start, end: end.max(start) },
            Err(_) => EventState::Failed,
        }
    }

    fn release(&self, event: Handle) {
        // SAFETY: the recorder's own reference (the enqueue returned the
        // event to it), released once.
        unsafe { (self.release_event)(event as cl::Event) };
    }
}

/// Where an OpenCL call was made, for its records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Site<'a> {
    /// The CL function, the records' name.
    pub(crate) call: &'static str,
    /// The device index.
    pub(crate) device: usize,
    /// The `TFL_Stream*` it was for, as an address; 0 for none.
    pub(crate) stream: usize,
    /// The detail, formatted only when recorded.
    pub(crate) detail: fmt::Arguments<'a>,
}

/// The device work an enqueue queues, for its device record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Work<'a> {
    /// `TFL_ACTIVITY_KERNEL`, `COPY` or `MEMSET`.
    pub(crate) kind: u32,
    /// The kernel, or the transfer.
    pub(crate) name: &'a str,
    /// The detail, formatted only when recorded.
    pub(crate) detail: fmt::Arguments<'a>,
}

thread_local! {
    /// The host's correlation id for what this thread does now.
    static CORRELATION: Cell<u64> = const { Cell::new(0) };
    /// This thread's open ranges.
    static RANGES: RefCell<RangeStack> = const { RefCell::new(RangeStack { open: Vec::new(), overflow: 0 }) };
}

/// Sets the calling thread's correlation id (0: none).
pub(crate) fn set_correlation(id: u64) {
    // A thread being torn down has no id to set.
    let _ = CORRELATION.try_with(|c| c.set(id));
}

/// The calling thread's correlation id.
pub(crate) fn correlation() -> u64 {
    CORRELATION.try_with(Cell::get).unwrap_or(0)
}

/// An open range: its start when it is being recorded.
#[derive(Debug)]
struct OpenRange {
    start: Option<u64>,
    name: Text<NAME>,
}

#[derive(Debug)]
struct RangeStack {
    open: Vec<OpenRange>,
    /// Pushes past [`MAX_RANGE_DEPTH`] not yet popped.
    overflow: usize,
}

/// What is staged between drains, and what was lost since the last one.
#[derive(Debug)]
struct Staging {
    complete: VecDeque<Staged>,
    /// Records waiting for their events, oldest first.
    pending: VecDeque<(Handle, Staged)>,
    dropped: u64,
}

impl Staging {
    fn len(&self) -> usize {
        self.complete.len() + self.pending.len()
    }
}

/// The plugin's recorder: the enabled kinds and the bounded staging.
#[derive(Debug)]
pub(crate) struct Recorder {
    kinds: AtomicU32,
    bound: usize,
    staging: Mutex<Staging>,
}

/// The process' recorder, which the ABI entries and every recording site use.
pub(crate) static RECORDER: Recorder = Recorder::new(STAGING_BOUND);

impl Recorder {
    /// A recorder staging at most `bound` records, recording nothing yet.
    pub(crate) const fn new(bound: usize) -> Self {
        Self {
            kinds: AtomicU32::new(0),
            bound,
            staging: Mutex::new(Staging { complete: VecDeque::new(), pending: VecDeque::new(), dropped: 0 }),
        }
    }

    /// `activity_enable`: records the kinds in `kinds` from now on.
    pub(crate) fn enable(&self, kinds: u32) -> Result<()> {
        if kinds & !ffi::TFL_ACTIVITY_ALL_KINDS != 0 {
            return Err(Error::invalid(format!(
                "opencl: activity_enable: kinds {kinds:#x} has bits outside TFL_ACTIVITY_ALL_KINDS ({:#x})",
                ffi::TFL_ACTIVITY_ALL_KINDS
            )));
        }
        self.kinds.store(kinds, Ordering::Relaxed);
        Ok(())
    }

    /// The enabled kinds: the one load a site makes with recording off.
    #[inline]
    pub(crate) fn kinds(&self) -> u32 {
        self.kinds.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Staging> {
        self.staging.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stages a complete record, or counts it dropped past the bound.
    pub(crate) fn stage(&self, record: Staged) {
        let mut s = self.lock();
        if s.len() >= self.bound {
            s.dropped = s.dropped.saturating_add(1);
        } else {
            s.complete.push_back(record);
        }
    }

    /// Stages a record waiting for `event` (whose reference it takes), or
    /// counts it dropped and releases the event past the bound.
    pub(crate) fn stage_pending(&self, events: &dyn Events, event: Handle, record: Staged) {
        let full = {
            let mut s = self.lock();
            if s.len() >= self.bound {
                s.dropped = s.dropped.saturating_add(1);
                true
            } else {
                s.pending.push_back((event, record));
                false
            }
        };
        if full {
            events.release(event);
        }
    }

    /// Moves up to `capacity` complete records, oldest first, to `sink`
    /// (with their index), after turning the pending records whose events
    /// completed into complete ones (`events`: `None` leaves them). Returns
    /// how many went to `sink` and how many were dropped since the last
    /// drain. Never waits for the device.
    pub(crate) fn drain(
        &self,
        events: Option<&dyn Events>,
        capacity: usize,
        mut sink: impl FnMut(usize, &Staged),
    ) -> (usize, u64) {
        let mut s = self.lock();
        let Staging { complete, pending, .. } = &mut *s;
        if let Some(events) = events {
            pending.retain_mut(|(event, record)| match events.state(*event) {
                EventState::Pending => true,
                EventState::Done { start, end } => {
                    record.start = start;
                    record.end = end.max(start);
                    complete.push_back(*record);
                    events.release(*event);
                    false
                }
                EventState::Failed => {
                    events.release(*event);
                    false
                }
            });
        }
        let mut written = 0;
        while written < capacity {
            let Some(record) = complete.pop_front() else { break };
            sink(written, &record);
            written += 1;
        }
        (written, std::mem::take(&mut s.dropped))
    }

    /// A host-clock record of `kind` for `site`.
    fn host_record(kind: u32, site: &Site<'_>, start: u64, end: u64) -> Staged {
        Staged {
            kind,
            device: i32::try_from(site.device).unwrap_or(-1),
            stream: site.stream,
            correlation: correlation(),
            start,
            end: end.max(start),
            name: Text::of(format_args!("{}", site.call)),
            detail: Text::of(site.detail),
        }
    }

    /// Runs the CL call `f`, timed on the host as one record of each kind
    /// of `mask` that is enabled.
    fn timed<R>(&self, mask: u32, site: Site<'_>, f: impl FnOnce() -> R) -> R {
        let on = self.kinds() & mask;
        if on == 0 {
            return f();
        }
        let start = host_now_ns();
        let result = f();
        let end = host_now_ns();
        for kind in [ffi::TFL_ACTIVITY_API, ffi::TFL_ACTIVITY_SYNC, ffi::TFL_ACTIVITY_BUILD] {
            if on & bit(kind) != 0 {
                self.stage(Self::host_record(kind, &site, start, end));
            }
        }
        result
    }

    /// A CL call that is not a wait or a build: an API record.
    pub(crate) fn call<R>(&self, site: Site<'_>, f: impl FnOnce() -> R) -> R {
        self.timed(bit(ffi::TFL_ACTIVITY_API), site, f)
    }

    /// A CL call that blocks the host on the device (`clFinish`,
    /// `clWaitForEvents`): an API and a SYNC record.
    pub(crate) fn wait<R>(&self, site: Site<'_>, f: impl FnOnce() -> R) -> R {
        self.timed(bit(ffi::TFL_ACTIVITY_API) | bit(ffi::TFL_ACTIVITY_SYNC), site, f)
    }

    /// `clBuildProgram`: a BUILD record.
    pub(crate) fn build<R>(&self, site: Site<'_>, f: impl FnOnce() -> R) -> R {
        self.timed(bit(ffi::TFL_ACTIVITY_BUILD), site, f)
    }

    /// Runs the enqueue `f` (given where to put its event, or NULL for
    /// none): an API record for the call, and, with `work.kind` enabled, a
    /// pending device record holding the event `f` returned.
    pub(crate) fn enqueue(
        &self,
        events: &dyn Events,
        site: Site<'_>,
        work: Work<'_>,
        f: impl FnOnce(*mut cl::Event) -> ClInt,
    ) -> ClInt {
        let kinds = self.kinds();
        let api = kinds & bit(ffi::TFL_ACTIVITY_API) != 0;
        let device = kinds & bit(work.kind) != 0;
        if !api && !device {
            return f(ptr::null_mut());
        }
        let mut event: cl::Event = ptr::null_mut();
        let start = if api { host_now_ns() } else { 0 };
        let status = f(if device { &mut event } else { ptr::null_mut() });
        if api {
            self.stage(Self::host_record(ffi::TFL_ACTIVITY_API, &site, start, host_now_ns()));
        }
        if device && status == cl::SUCCESS && !event.is_null() {
            let record = Staged {
                kind: work.kind,
                device: i32::try_from(site.device).unwrap_or(-1),
                stream: site.stream,
                correlation: correlation(),
                start: 0,
                end: 0,
                name: Text::of(format_args!("{}", work.name)),
                detail: Text::of(work.detail),
            };
            self.stage_pending(events, event as Handle, record);
        }
        status
    }

    /// A RANGE or MARK record named `name` on the host clock.
    fn user_record(kind: u32, name: Text<NAME>, start: u64, end: u64) -> Staged {
        Staged {
            kind,
            device: -1,
            stream: 0,
            correlation: correlation(),
            start,
            end: end.max(start),
            name,
            detail: Text::new(),
        }
    }

    /// `range_push`: opens a range on the calling thread. Nothing is
    /// allocated once the thread's stack has grown.
    pub(crate) fn range_push(&self, name: &[u8]) {
        let recording = self.kinds() & bit(ffi::TFL_ACTIVITY_RANGE) != 0;
        let _ = RANGES.try_with(|r| {
            let Ok(mut r) = r.try_borrow_mut() else { return };
            if r.open.len() >= MAX_RANGE_DEPTH {
                r.overflow += 1;
                return;
            }
            let open = if recording {
                OpenRange { start: Some(host_now_ns()), name: Text::lossy(name) }
            } else {
                OpenRange { start: None, name: Text::new() }
            };
            r.open.push(open);
        });
    }

    /// `range_pop`: closes the calling thread's innermost range (none open:
    /// nothing), recording it when it was opened with RANGE on and RANGE is
    /// still on.
    pub(crate) fn range_pop(&self) {
        let closed = RANGES
            .try_with(|r| {
                let Ok(mut r) = r.try_borrow_mut() else { return None };
                if r.overflow > 0 {
                    r.overflow -= 1;
                    return None;
                }
                r.open.pop()
            })
            .ok()
            .flatten();
        if let Some(OpenRange { start: Some(start), name }) = closed {
            if self.kinds() & bit(ffi::TFL_ACTIVITY_RANGE) != 0 {
                self.stage(Self::user_record(ffi::TFL_ACTIVITY_RANGE, name, start, host_now_ns()));
            }
        }
    }

    /// `range_mark`: an instant, recorded when MARK is on.
    pub(crate) fn range_mark(&self, name: &[u8]) {
        if self.kinds() & bit(ffi::TFL_ACTIVITY_MARK) != 0 {
            let now = host_now_ns();
            self.stage(Self::user_record(ffi::TFL_ACTIVITY_MARK, Text::lossy(name), now, now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Events whose states a test sets; releases are counted.
    #[derive(Default)]
    struct FakeEvents {
        states: Mutex<HashMap<Handle, EventState>>,
        released: Mutex<Vec<Handle>>,
    }

    impl FakeEvents {
        fn set(&self, event: Handle, state: EventState) {
            self.states.lock().unwrap().insert(event, state);
        }
        fn released(&self) -> Vec<Handle> {
            self.released.lock().unwrap().clone()
        }
    }

    impl Events for FakeEvents {
        fn state(&self, event: Handle) -> EventState {
            *self.states.lock().unwrap().get(&event).unwrap_or(&EventState::Pending)
        }
        fn release(&self, event: Handle) {
            self.released.lock().unwrap().push(event);
        }
    }

    fn site(call: &'static str) -> Site<'static> {
        Site { call, device: 0, stream: 0x1000, detail: format_args!("4096 bytes") }
    }

    fn drained(r: &Recorder, events: Option<&dyn Events>, capacity: usize) -> (Vec<Staged>, u64) {
        let mut out = Vec::new();
        let (written, dropped) = r.drain(events, capacity, |i, s| {
            assert_eq!(i, out.len());
            out.push(*s);
        });
        assert_eq!(written, out.len());
        (out, dropped)
    }

    #[test]
    fn text_truncates_at_a_character_boundary_and_keeps_its_nul() {
        let t: Text<8> = Text::of(format_args!("{}", "abcdefghij"));
        assert_eq!(t.as_str(), "abcdefg");
        assert_eq!(t.c_array()[7], 0);
        // "é" is two bytes: cut before it rather than through it.
        let t: Text<8> = Text::of(format_args!("abcdef{}", "é"));
        assert_eq!(t.as_str(), "abcdef");
        let t: Text<8> = Text::lossy(b"a\xffb");
        assert_eq!(t.as_str(), "a\u{fffd}b");
        let t: Text<8> = Text::of(format_args!("a{}b", '\0'));
        assert_eq!(t.as_str(), "a b");
        assert_eq!(Text::<1>::of(format_args!("x")).as_str(), "");
    }

    #[test]
    fn enable_refuses_unknown_bits_and_off_records_nothing() {
        let r = Recorder::new(16);
        assert_eq!(r.enable(1).unwrap_err().code(), ffi::TFL_ERROR_INVALID_ARGUMENT);
        assert_eq!(r.enable(1 << 9).unwrap_err().code(), ffi::TFL_ERROR_INVALID_ARGUMENT);
        assert_eq!(r.kinds(), 0);
        let events = FakeEvents::default();
        let mut asked = None;
        r.call(site("clEnqueueWriteBuffer"), || ());
        r.wait(site("clFinish"), || ());
        let status = r.enqueue(
            &events,
            site("clEnqueueNDRangeKernel"),
            Work { kind: ffi::TFL_ACTIVITY_KERNEL, name: "binary", detail: format_args!("") },
            |e| {
                asked = Some(e.is_null());
                cl::SUCCESS
            },
        );
        assert_eq!((status, asked), (cl::SUCCESS, Some(true)), "off: no event asked for");
        r.range_push(b"r");
        r.range_pop();
        r.range_mark(b"m");
        assert!(drained(&r, Some(&events), 10).0.is_empty());
        r.enable(ffi::TFL_ACTIVITY_ALL_KINDS).unwrap();
        assert_eq!(r.kinds(), ffi::TFL_ACTIVITY_ALL_KINDS);
    }

    #[test]
    fn host_records_name_the_call_and_carry_the_thread_correlation() {
        let r = Recorder::new(16);
        r.enable(bit(ffi::TFL_ACTIVITY_API) | bit(ffi::TFL_ACTIVITY_SYNC)).unwrap();
        set_correlation(42);
        r.call(site("clEnqueueWriteBuffer"), || ());
        r.wait(site("clFinish"), || ());
        r.build(site("clBuildProgram"), || ()); // BUILD is off
        set_correlation(0);
        let (records, dropped) = drained(&r, None, 10);
        assert_eq!(dropped, 0);
        let seen: Vec<(u32, &str, u64)> =
            records.iter().map(|s| (s.kind, s.name.as_str(), s.correlation)).collect();
        assert_eq!(
            seen,
            [
                (ffi::TFL_ACTIVITY_API, "clEnqueueWriteBuffer", 42),
                (ffi::TFL_ACTIVITY_API, "clFinish", 42),
                (ffi::TFL_ACTIVITY_SYNC, "clFinish", 42),
            ]
        );
        let raw = records[0].record();
        assert_eq!(raw.flags, ffi::TFL_ACTIVITY_HOST_CLOCK);
        assert_eq!(raw.stream as usize, 0x1000);
        assert!(raw.end_ns >= raw.start_ns && raw.start_ns > 0);
        assert_eq!(records[0].detail.as_str(), "4096 bytes");
    }

    #[test]
    fn device_records_wait_for_their_events_and_keep_the_enqueuing_correlation() {
        let r = Recorder::new(16);
        r.enable(bit(ffi::TFL_ACTIVITY_KERNEL) | bit(ffi::TFL_ACTIVITY_COPY)).unwrap();
        let events = FakeEvents::default();
        let mut next = 0x10;
        let mut enqueue = |kind, name, correlation| {
            set_correlation(correlation);
            next += 1;
            let handle = next;
            let status = r.enqueue(
                &events,
                site("clEnqueueNDRangeKernel"),
                Work { kind, name, detail: format_args!("global=[8] local=auto") },
                |e| {
                    assert!(!e.is_null());
                    // SAFETY: the recorder's out-parameter, writable.
                    unsafe { e.write(handle as cl::Event) };
                    cl::SUCCESS
                },
            );
            assert_eq!(status, cl::SUCCESS);
            handle
        };
        let a = enqueue(ffi::TFL_ACTIVITY_KERNEL, "binary", 1);
        let b = enqueue(ffi::TFL_ACTIVITY_COPY, "memcpy DtoD", 2);
        let c = enqueue(ffi::TFL_ACTIVITY_KERNEL, "unary", 3);
        set_correlation(0);
        // Nothing complete: nothing drained, nothing released.
        assert!(drained(&r, Some(&events), 10).0.is_empty());
        assert!(events.released().is_empty());
        events.set(a, EventState::Done { start: 100, end: 200 });
        events.set(b, EventState::Failed);
        let (records, _) = drained(&r, Some(&events), 10);
        assert_eq!(records.len(), 1);
        let raw = records[0].record();
        assert_eq!((raw.kind, raw.flags, raw.correlation_id), (ffi::TFL_ACTIVITY_KERNEL, 0, 1));
        assert_eq!((raw.start_ns, raw.end_ns), (100, 200));
        assert_eq!(records[0].name.as_str(), "binary");
        assert_eq!(events.released(), [a, b]);
        events.set(c, EventState::Done { start: 300, end: 250 });
        let (records, _) = drained(&r, Some(&events), 10);
        assert_eq!((records[0].correlation, records[0].start, records[0].end), (3, 300, 300));
        // A failed enqueue stages nothing.
        let status = r.enqueue(
            &events,
            site("clEnqueueCopyBuffer"),
            Work { kind: ffi::TFL_ACTIVITY_COPY, name: "x", detail: format_args!("") },
            |_| -5,
        );
        assert_eq!(status, -5);
        assert!(drained(&r, Some(&events), 10).0.is_empty());
    }

    #[test]
    fn staging_is_bounded_and_drops_are_counted_once() {
        let r = Recorder::new(3);
        r.enable(ffi::TFL_ACTIVITY_ALL_KINDS).unwrap();
        let events = FakeEvents::default();
        for _ in 0..2 {
            r.call(site("clEnqueueFillBuffer"), || ());
        }
        // One slot left: the API record takes it, the device record's event
        // is released at once.
        r.enqueue(
            &events,
            site("clEnqueueFillBuffer"),
            Work { kind: ffi::TFL_ACTIVITY_MEMSET, name: "memset", detail: format_args!("") },
            |e| {
                // SAFETY: writable when MEMSET is on.
                unsafe { e.write(0x77 as cl::Event) };
                cl::SUCCESS
            },
        );
        r.range_mark(b"lost");
        assert_eq!(events.released(), [0x77]);
        let (records, dropped) = drained(&r, Some(&events), 2);
        assert_eq!((records.len(), dropped), (2, 2));
        // Oldest first; the rest waits for the next drain, drops were reset.
        let (records, dropped) = drained(&r, Some(&events), 2);
        assert_eq!((records.len(), dropped), (1, 0));
        assert_eq!(records[0].kind, ffi::TFL_ACTIVITY_API);
    }

    #[test]
    fn ranges_nest_per_thread_and_pops_pair_past_the_depth() {
        let r = Recorder::new(1024);
        r.enable(bit(ffi::TFL_ACTIVITY_RANGE) | bit(ffi::TFL_ACTIVITY_MARK)).unwrap();
        r.range_pop(); // none open: nothing
        r.range_push(b"outer");
        r.range_push(b"inner");
        r.range_mark(b"now");
        r.range_pop();
        std::thread::scope(|s| {
            s.spawn(|| r.range_pop()); // another thread's stack is empty
        });
        r.range_pop();
        let (records, _) = drained(&r, None, 10);
        let seen: Vec<(u32, &str)> = records.iter().map(|s| (s.kind, s.name.as_str())).collect();
        assert_eq!(
            seen,
            [
                (ffi::TFL_ACTIVITY_MARK, "now"),
                (ffi::TFL_ACTIVITY_RANGE, "inner"),
                (ffi::TFL_ACTIVITY_RANGE, "outer")
            ]
        );
        assert_eq!(records[0].start, records[0].end);
        assert!(records[2].start <= records[1].start && records[1].end <= records[2].end);
        assert!(records.iter().all(|s| s.device == -1 && s.record().flags == ffi::TFL_ACTIVITY_HOST_CLOCK));
        // Past the depth: counted, not recorded, and pops still pair.
        for _ in 0..MAX_RANGE_DEPTH + 5 {
            r.range_push(b"deep");
        }
        for _ in 0..5 {
            r.range_pop();
        }
        assert!(drained(&r, None, 10).0.is_empty());
        for _ in 0..MAX_RANGE_DEPTH {
            r.range_pop();
        }
        assert_eq!(drained(&r, None, 1000).0.len(), MAX_RANGE_DEPTH);
        // A range opened with RANGE off is not recorded when it closes.
        r.enable(0).unwrap();
        r.range_push(b"unseen");
        r.enable(ffi::TFL_ACTIVITY_ALL_KINDS).unwrap();
        r.range_pop();
        assert!(drained(&r, None, 10).0.is_empty());
    }

    #[test]
    fn the_host_clock_is_monotonic() {
        let a = host_now_ns();
        let b = host_now_ns();
        assert!(a > 0 && b >= a);
    }
}

//! Activity records (ABI 1.8): what the simulator did for each call, in its
//! own terms and on its device's own clock, as CUPTI reports it for CUDA.
//!
//! The simulator's "native calls" are its queue submissions, and its device
//! work is what the streams' workers run. With recording on it stages:
//!
//! - **API** records (host clock), one per submission a call makes:
//!   `simLaunchKernel`, `simMemcpyAsync` / `simMemcpy` (no stream),
//!   `simMemsetAsync` / `simMemset`, `simGraphLaunch`, `simEventRecord`,
//!   `simStreamWaitEvent`;
//! - **KERNEL**, **COPY** and **MEMSET** records (device clock), timed
//!   around the work where it runs (a stream's worker, the calling thread
//!   for synchronous calls, a launched graph's work for its kernels),
//!   modeled device time included (the cost model's copy time and
//!   compute factor);
//! - **SYNC** records (host clock) while the host blocks in
//!   `synchronize_device`, `synchronize_stream` or `synchronize_event`;
//! - **RANGE** and **MARK** records (host clock) of the user annotations
//!   ([`Runtime::range_push`] and friends).
//!
//! **Correlation.** The host sets a per-thread id
//! ([`set_correlation`]) around each call. Records made on the calling
//! thread take it from there; device work captures it when it is submitted
//! and records it when it runs, on whatever thread; a launched graph's work
//! sets it on its worker for the graph's kernels.
//!
//! **Clocks.** Host-clock records are on `CLOCK_MONOTONIC`
//! ([`host_now_ns`]). The device clock of device `d` is the time since its
//! runtime was created, plus `(d + 1)` seconds: read from the same
//! monotonic clock as the timing events' timestamps (`Instant`), so kernel
//! records and `event_elapsed_time` agree, but deliberately never equal to
//! `CLOCK_MONOTONIC`, so that a host that forgot to map device times through
//! [`Runtime::activity_clock`] shows it at once.
//!
//! **Cost.** With recording off, the launch, copy, memset and synchronize
//! paths pay one relaxed load of the enabled-kinds mask (`Recorder::kinds`)
//! and nothing else. Records are staged in a bounded queue
//! ([`STAGING_CAPACITY`]); past it they are counted as dropped, never
//! blocking and never growing memory further. The queue's lock is taken
//! only while recording, once per record.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use torchfl_ffi as ffi;

use super::stream::lock;
use super::{EventHandle, Runtime, StreamHandle, Work};
use crate::error::{Error, Result};

/// Records staged at most between two drains (about 60 MiB of them); more
/// are counted as dropped.
pub const STAGING_CAPACITY: usize = 1 << 18;

/// Ranges open at most per thread; deeper pushes are counted (and popped)
/// but not recorded.
const MAX_RANGE_DEPTH: usize = 1024;

/// What a record describes (`TFL_ActivityKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivityKind {
    /// A native call the simulator made (host clock).
    Api,
    /// A kernel's execution.
    Kernel,
    /// A copy's execution.
    Copy,
    /// A fill's execution (`set_memory`).
    Memset,
    /// The host blocked on the device (host clock).
    Sync,
    /// A program build (host clock; the simulator builds nothing).
    Build,
    /// A user range, push to pop (host clock).
    Range,
    /// A user mark (host clock).
    Mark,
}

impl ActivityKind {
    /// The `TFL_ActivityKind` value.
    pub const fn raw(self) -> u32 {
        match self {
            Self::Api => ffi::TFL_ACTIVITY_API,
            Self::Kernel => ffi::TFL_ACTIVITY_KERNEL,
            Self::Copy => ffi::TFL_ACTIVITY_COPY,
            Self::Memset => ffi::TFL_ACTIVITY_MEMSET,
            Self::Sync => ffi::TFL_ACTIVITY_SYNC,
            Self::Build => ffi::TFL_ACTIVITY_BUILD,
            Self::Range => ffi::TFL_ACTIVITY_RANGE,
            Self::Mark => ffi::TFL_ACTIVITY_MARK,
        }
    }

    /// Its bit in the enabled-kinds mask (`1 << raw`).
    pub const fn bit(self) -> u32 {
        1 << self.raw()
    }

    /// Whether its times are on the host's clock.
    pub const fn host_clock(self) -> bool {
        !matches!(self, Self::Kernel | Self::Copy | Self::Memset)
    }
}

const API: u32 = 1 << ffi::TFL_ACTIVITY_API;
const SYNC: u32 = 1 << ffi::TFL_ACTIVITY_SYNC;
const RANGE: u32 = 1 << ffi::TFL_ACTIVITY_RANGE;
const MARK: u32 = 1 << ffi::TFL_ACTIVITY_MARK;

/// A string of at most `N - 1` bytes kept inline (so that it fits a
/// record's array with its NUL), truncated at a character boundary.
#[derive(Clone, Copy)]
pub(crate) struct Text<const N: usize> {
    len: usize,
    bytes: [u8; N],
}

impl<const N: usize> Text<N> {
    /// An empty text.
    pub(crate) const fn new() -> Self {
        Self { len: 0, bytes: [0; N] }
    }

    /// `s`, truncated to fit.
    pub(crate) fn of(s: &str) -> Self {
        let mut t = Self::new();
        t.push(s);
        t
    }

    /// Appends as much of `s` as fits, whole characters only.
    pub(crate) fn push(&mut self, s: &str) {
        let room = N.saturating_sub(1).saturating_sub(self.len);
        let mut take = s.len().min(room);
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        self.bytes[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
    }

    /// The text.
    pub(crate) fn as_str(&self) -> &str {
        // Only whole characters of `&str`s were ever copied in.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }

    /// The text with a NUL after it, as a record's array holds it.
    pub(crate) fn to_c_array(self) -> [std::ffi::c_char; N] {
        let mut out = [0; N];
        for (o, &b) in out.iter_mut().zip(&self.bytes[..self.len]) {
            *o = b as std::ffi::c_char;
        }
        out
    }
}

impl<const N: usize> fmt::Write for Text<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s);
        Ok(())
    }
}

impl<const N: usize> fmt::Debug for Text<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// A record's name.
pub(crate) type Name = Text<{ ffi::TFL_ACTIVITY_NAME_BYTES }>;
/// A record's detail.
pub(crate) type Detail = Text<{ ffi::TFL_ACTIVITY_DETAIL_BYTES }>;

/// One complete record, as staged and drained.
#[derive(Debug, Clone)]
pub struct ActivityRecord {
    /// What it describes.
    pub kind: ActivityKind,
    /// The device; -1 for none.
    pub device: i32,
    /// The stream handle the work ran on (its `TFL_Stream*`); 0 for none.
    pub stream: u64,
    /// The host's correlation id; 0 for none.
    pub correlation_id: u64,
    /// Start, nanoseconds (host clock when [`ActivityKind::host_clock`],
    /// else the device's).
    pub start_ns: u64,
    /// End, nanoseconds (`>= start_ns`).
    pub end_ns: u64,
    name: Name,
    detail: Detail,
}

impl ActivityRecord {
    /// The native call, kernel or range.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// Details, possibly empty.
    pub fn detail(&self) -> &str {
        self.detail.as_str()
    }

    /// The record as the ABI lays it out (`struct_size` the whole struct).
    pub fn to_ffi(&self) -> ffi::TFL_ActivityRecord {
        ffi::TFL_ActivityRecord {
            struct_size: std::mem::size_of::<ffi::TFL_ActivityRecord>(),
            kind: self.kind.raw(),
            flags: if self.kind.host_clock() { ffi::TFL_ACTIVITY_HOST_CLOCK } else { 0 },
            device: self.device,
            reserved: 0,
            stream: self.stream as usize as *mut ffi::TFL_Stream,
            correlation_id: self.correlation_id,
            start_ns: self.start_ns,
            end_ns: self.end_ns.max(self.start_ns),
            name: self.name.to_c_array(),
            detail: self.detail.to_c_array(),
        }
    }
}

/// Staged records and the count lost since the last drain.
#[derive(Default)]
struct Staging {
    records: VecDeque<ActivityRecord>,
    dropped: u64,
}

/// A runtime's activity recorder: the enabled kinds, the staged records
/// and the device clocks' epoch.
pub(crate) struct Recorder {
    kinds: AtomicU32,
    staging: Mutex<Staging>,
    capacity: usize,
    epoch: Instant,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("kinds", &self.kinds()).finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder staging at most `capacity` records, recording nothing.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            kinds: AtomicU32::new(0),
            staging: Mutex::new(Staging::default()),
            capacity,
            epoch: Instant::now(),
        }
    }

    /// The enabled kinds' bits: the one load the paths pay when off.
    #[inline(always)]
    pub(crate) fn kinds(&self) -> u32 {
        self.kinds.load(Ordering::Relaxed)
    }

    fn enable(&self, kinds: u32) -> Result<()> {
        if kinds & !ffi::TFL_ACTIVITY_ALL_KINDS != 0 {
            return Err(Error::invalid(format!(
                "sim: activity_enable: kinds {kinds:#x} has bits outside TFL_ACTIVITY_ALL_KINDS ({:#x})",
                ffi::TFL_ACTIVITY_ALL_KINDS
            )));
        }
        self.kinds.store(kinds, Ordering::Relaxed);
        Ok(())
    }

    /// Stages `r` if its kind is (still) enabled; counts it as dropped when
    /// the staging queue is full.
    fn push(&self, r: ActivityRecord) {
        if self.kinds() & r.kind.bit() == 0 {
            return;
        }
        let mut s = lock(&self.staging);
        if s.records.len() >= self.capacity {
            s.dropped = s.dropped.saturating_add(1);
        } else {
            s.records.push_back(r);
        }
    }

    /// Moves up to `capacity` records, oldest first, through `each`;
    /// returns how many, and the count dropped since the last drain (reset).
    fn drain(&self, capacity: usize, mut each: impl FnMut(usize, &ActivityRecord)) -> (usize, u64) {
        let mut s = lock(&self.staging);
        let n = capacity.min(s.records.len());
        for (i, r) in s.records.drain(..n).enumerate() {
            each(i, &r);
        }
        if s.records.is_empty() && s.records.capacity() > 4096 {
            // Give back what a burst grew, keeping a working buffer.
            s.records.shrink_to(4096);
        }
        (n, std::mem::take(&mut s.dropped))
    }

    /// Device `device`'s clock at `at`.
    pub(crate) fn device_ns(&self, device: usize, at: Instant) -> u64 {
        let since = u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        let offset = 1_000_000_000u64.saturating_mul(device as u64 + 1);
        since.saturating_add(offset)
    }

    /// Stages a host-clock record.
    #[allow(clippy::too_many_arguments)]
    fn host_record(
        &self,
        kind: ActivityKind,
        device: Option<usize>,
        stream: u64,
        correlation_id: u64,
        start_ns: u64,
        end_ns: u64,
        name: &str,
        detail: Detail,
    ) {
        self.push(ActivityRecord {
            kind,
            device: device_id(device),
            stream,
            correlation_id,
            start_ns,
            end_ns: end_ns.max(start_ns),
            name: Name::of(name),
            detail,
        });
    }
}

fn device_id(device: Option<usize>) -> i32 {
    device.and_then(|d| i32::try_from(d).ok()).unwrap_or(-1)
}

/// The host's `CLOCK_MONOTONIC`, in nanoseconds.
#[cfg(unix)]
pub fn host_now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always
    // exists on the platforms this builds for.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// The host's monotonic clock, in nanoseconds since the first call (no
/// `CLOCK_MONOTONIC` here).
#[cfg(not(unix))]
pub fn host_now_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------
// Per-thread state: correlation, the running graph's stream, ranges
// ---------------------------------------------------------------------------

thread_local! {
    static CORRELATION: Cell<u64> = const { Cell::new(0) };
    /// The stream whose work this thread runs inline (a launched graph's),
    /// 0 when none.
    static RUNNING_STREAM: Cell<u64> = const { Cell::new(0) };
    static RANGES: RefCell<RangeStack> = const { RefCell::new(RangeStack::new()) };
}

/// Sets the calling thread's correlation id (0: none): records of what it
/// does next, and of the device work it submits, carry it.
pub fn set_correlation(id: u64) {
    let _ = CORRELATION.try_with(|c| c.set(id));
}

/// The calling thread's correlation id.
pub fn correlation() -> u64 {
    CORRELATION.try_with(Cell::get).unwrap_or(0)
}

fn running_stream() -> u64 {
    RUNNING_STREAM.try_with(Cell::get).unwrap_or(0)
}

/// Sets the thread's correlation id and running stream for a scope (a
/// launched graph's work on its worker), restoring both after.
pub(crate) struct WorkScope {
    correlation: u64,
    stream: u64,
}

impl WorkScope {
    pub(crate) fn enter(correlation: u64, stream: u64) -> Self {
        let saved = Self { correlation: self::correlation(), stream: running_stream() };
        set_correlation(correlation);
        let _ = RUNNING_STREAM.try_with(|s| s.set(stream));
        saved
    }
}

impl Drop for WorkScope {
    fn drop(&mut self) {
        set_correlation(self.correlation);
        let _ = RUNNING_STREAM.try_with(|s| s.set(self.stream));
    }
}

/// One open range: its name and start, or `None` when it was pushed with
/// range recording off.
type OpenRange = Option<(Name, u64)>;

/// A thread's open ranges: no allocation once it has grown to the
/// thread's deepest nesting, and bounded.
struct RangeStack {
    open: Vec<OpenRange>,
    /// Pushes past [`MAX_RANGE_DEPTH`] not yet popped.
    overflow: usize,
}

impl RangeStack {
    const fn new() -> Self {
        Self { open: Vec::new(), overflow: 0 }
    }

    fn push(&mut self, range: OpenRange) {
        if self.open.len() >= MAX_RANGE_DEPTH {
            self.overflow += 1;
        } else {
            self.open.push(range);
        }
    }

    /// The innermost range; `None` for none open, `Some(None)` for one not
    /// recorded.
    fn pop(&mut self) -> Option<OpenRange> {
        if self.overflow > 0 {
            self.overflow -= 1;
            return Some(None);
        }
        self.open.pop()
    }
}

// ---------------------------------------------------------------------------
// The recording points, as `Runtime` methods
// ---------------------------------------------------------------------------

/// An API record in progress: started before a call's submission,
/// finished after it.
pub(crate) struct ApiCall {
    start_ns: u64,
    correlation: u64,
}

/// Where device work ran, for its record.
#[derive(Clone, Copy)]
pub(crate) struct Placement {
    pub(crate) device: usize,
    /// The stream handle; 0 for synchronous work.
    pub(crate) stream: u64,
    pub(crate) correlation: u64,
}

impl Runtime {
    /// Records the kinds whose bits ([`ActivityKind::bit`]) are set from
    /// now on; 0 stops. Staged records stay until drained.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a bit outside `TFL_ACTIVITY_ALL_KINDS`.
    pub fn activity_enable(&self, kinds: u32) -> Result<()> {
        self.activity.enable(kinds)
    }

    /// The kinds being recorded.
    pub fn activity_kinds(&self) -> u32 {
        self.activity.kinds()
    }

    /// Moves up to `capacity` staged records out, oldest first, with the
    /// number of records dropped since the previous drain.
    pub fn activity_drain(&self, capacity: usize) -> (Vec<ActivityRecord>, u64) {
        let mut out = Vec::new();
        let (_, dropped) = self.activity.drain(capacity, |_, r| out.push(r.clone()));
        (out, dropped)
    }

    /// [`Runtime::activity_drain`] through a callback (the ABI's, which
    /// writes into the host's array): returns how many records, and the
    /// number dropped.
    pub(crate) fn activity_drain_each(
        &self,
        capacity: usize,
        each: impl FnMut(usize, &ActivityRecord),
    ) -> (usize, u64) {
        self.activity.drain(capacity, each)
    }

    /// Device `device`'s clock and the host's `CLOCK_MONOTONIC`, read back
    /// to back: `(device_ns, host_ns)`.
    pub fn activity_clock(&self, device: usize) -> Result<(u64, u64)> {
        self.device(device)?;
        let at = Instant::now();
        let host = host_now_ns();
        Ok((self.activity.device_ns(device, at), host))
    }

    /// Opens a range named `name` on the calling thread.
    pub fn range_push(&self, name: &str) {
        let open =
            if self.activity.kinds() & RANGE != 0 { Some((Name::of(name), host_now_ns())) } else { None };
        let _ = RANGES.try_with(|r| r.borrow_mut().push(open));
    }

    /// Closes the calling thread's innermost range (none open: no-op),
    /// recording it if it was opened while ranges were recorded.
    pub fn range_pop(&self) {
        let Ok(Some(Some((name, start)))) = RANGES.try_with(|r| r.borrow_mut().pop()) else {
            return;
        };
        if self.activity.kinds() & RANGE != 0 {
            let end = host_now_ns();
            self.activity.push(ActivityRecord {
                kind: ActivityKind::Range,
                device: -1,
                stream: 0,
                correlation_id: correlation(),
                start_ns: start,
                end_ns: end.max(start),
                name,
                detail: Detail::new(),
            });
        }
    }

    /// Records an instant named `name`.
    pub fn range_mark(&self, name: &str) {
        if self.activity.kinds() & MARK != 0 {
            let now = host_now_ns();
            let detail = Detail::new();
            self.activity.host_record(ActivityKind::Mark, None, 0, correlation(), now, now, name, detail);
        }
    }

    /// Starts an API record when API records are on (one load when off).
    #[inline(always)]
    pub(crate) fn api_begin(&self) -> Option<ApiCall> {
        if self.activity.kinds() & API == 0 {
            return None;
        }
        Some(ApiCall { start_ns: host_now_ns(), correlation: correlation() })
    }

    /// Finishes an API record started by [`Runtime::api_begin`].
    pub(crate) fn api_end(
        &self,
        call: ApiCall,
        name: &str,
        device: usize,
        stream: u64,
        detail: impl FnOnce(&mut Detail),
    ) {
        let end = host_now_ns();
        let mut d = Detail::new();
        detail(&mut d);
        self.activity.host_record(
            ActivityKind::Api,
            Some(device),
            stream,
            call.correlation,
            call.start_ns,
            end,
            name,
            d,
        );
    }

    /// Times a synchronize when SYNC records are on.
    #[inline(always)]
    pub(crate) fn sync_begin(&self) -> Option<u64> {
        (self.activity.kinds() & SYNC != 0).then(host_now_ns)
    }

    /// Finishes a SYNC record started by [`Runtime::sync_begin`].
    pub(crate) fn sync_end(
        &self,
        start: u64,
        name: &str,
        device: usize,
        stream: u64,
        detail: fmt::Arguments<'_>,
    ) {
        let end = host_now_ns();
        let mut d = Detail::new();
        let _ = d.write_fmt(detail);
        self.activity.host_record(
            ActivityKind::Sync,
            Some(device),
            stream,
            correlation(),
            start,
            end,
            name,
            d,
        );
    }

    /// Where work submitted now from this thread to `stream` of `device`
    /// runs: inside a launched graph, the graph's stream.
    pub(crate) fn placement(device: usize, stream: Option<StreamHandle>) -> Placement {
        let running = running_stream();
        let stream = if running != 0 { running } else { stream.map_or(0, StreamHandle::to_raw) };
        Placement { device, stream, correlation: correlation() }
    }

    /// Wraps `work` (a copy's or a fill's) to record it as `kind` where it
    /// runs.
    pub(crate) fn timed_device_work(
        &self,
        kind: ActivityKind,
        at: Placement,
        name: &str,
        detail: Detail,
        work: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> impl FnOnce() -> Result<()> + Send + 'static {
        let recorder = Arc::clone(&self.activity);
        let name = Name::of(name);
        move || {
            let start = Instant::now();
            let outcome = work();
            let end = Instant::now();
            recorder.push(ActivityRecord {
                kind,
                device: device_id(Some(at.device)),
                stream: at.stream,
                correlation_id: at.correlation,
                start_ns: recorder.device_ns(at.device, start),
                end_ns: recorder.device_ns(at.device, end),
                name,
                detail,
            });
            outcome
        }
    }

    /// Wraps a kernel's `work` to record it as a KERNEL where it runs.
    pub(crate) fn timed_kernel(&self, at: Placement, name: &str, detail: Detail, work: Work) -> Work {
        Work::new(self.timed_device_work(ActivityKind::Kernel, at, name, detail, move || work.run()))
    }

    /// Finishes the API record of an `event_record` or
    /// `stream_wait_event`.
    pub(crate) fn api_event(
        &self,
        call: ApiCall,
        name: &str,
        device: usize,
        stream: StreamHandle,
        event: EventHandle,
    ) {
        self.api_end(call, name, device, stream.to_raw(), |d| {
            let _ = write!(d, "event {:#x}", event.to_raw());
        });
    }
}

/// `"N bytes, host to device"` and the like.
pub(crate) fn copy_detail(nbytes: usize, direction: &str) -> Detail {
    let mut d = Detail::new();
    let _ = write!(d, "{nbytes} bytes, {direction}");
    d
}

/// The recorder a runtime starts with.
pub(crate) fn new_recorder() -> Arc<Recorder> {
    Arc::new(Recorder::new(STAGING_CAPACITY))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::config::Config;

    fn record(kind: ActivityKind, name: &str) -> ActivityRecord {
        ActivityRecord {
            kind,
            device: 0,
            stream: 0,
            correlation_id: 0,
            start_ns: 1,
            end_ns: 2,
            name: Name::of(name),
            detail: Detail::new(),
        }
    }

    #[test]
    fn kinds_and_bits() {
        let all = [
            ActivityKind::Api,
            ActivityKind::Kernel,
            ActivityKind::Copy,
            ActivityKind::Memset,
            ActivityKind::Sync,
            ActivityKind::Build,
            ActivityKind::Range,
            ActivityKind::Mark,
        ];
        assert_eq!(all.iter().fold(0, |m, k| m | k.bit()), ffi::TFL_ACTIVITY_ALL_KINDS);
        for k in all {
            let device = matches!(k, ActivityKind::Kernel | ActivityKind::Copy | ActivityKind::Memset);
            assert_eq!(k.host_clock(), !device, "{k:?}");
        }
    }

    #[test]
    fn the_enable_mask_is_validated() {
        let r = Recorder::new(4);
        assert_eq!(r.kinds(), 0, "off until enabled");
        r.enable(ffi::TFL_ACTIVITY_ALL_KINDS).unwrap();
        assert_eq!(r.kinds(), ffi::TFL_ACTIVITY_ALL_KINDS);
        for bad in [1u32, 1 << 9, 0x8000_0000, ffi::TFL_ACTIVITY_ALL_KINDS | 1] {
            let e = r.enable(bad).unwrap_err();
            assert_eq!(e.code(), crate::ErrorCode::InvalidArgument, "{bad:#x}");
            assert!(e.message().contains("TFL_ACTIVITY_ALL_KINDS"), "{}", e.message());
        }
        assert_eq!(r.kinds(), ffi::TFL_ACTIVITY_ALL_KINDS, "a refused mask changes nothing");
        r.enable(0).unwrap();
        assert_eq!(r.kinds(), 0);
    }

    #[test]
    fn staging_is_bounded_and_counts_what_it_drops() {
        let r = Recorder::new(3);
        r.push(record(ActivityKind::Api, "off"));
        assert_eq!(r.drain(10, |_, _| {}), (0, 0), "nothing recorded while off");
        r.enable(ActivityKind::Api.bit()).unwrap();
        r.push(record(ActivityKind::Kernel, "not enabled"));
        for i in 0..5 {
            r.push(record(ActivityKind::Api, &format!("r{i}")));
        }
        let mut names = Vec::new();
        let (n, dropped) = r.drain(2, |i, rec| names.push((i, rec.name().to_owned())));
        assert_eq!((n, dropped), (2, 2), "three staged, two dropped");
        assert_eq!(names, [(0, "r0".to_owned()), (1, "r1".to_owned())], "oldest first");
        let (n, dropped) = r.drain(10, |_, rec| assert_eq!(rec.name(), "r2"));
        assert_eq!((n, dropped), (1, 0), "the dropped count was reset");
        r.push(record(ActivityKind::Api, "again"));
        assert_eq!(r.drain(0, |_, _| {}), (0, 0));
        assert_eq!(r.drain(1, |_, _| {}), (1, 0));
    }

    #[test]
    fn texts_truncate_at_character_boundaries() {
        let mut t = Text::<8>::new();
        t.push("abc");
        t.push("défgh");
        assert_eq!(t.as_str(), "abcdéf", "7 bytes at most, é is two");
        let long = Name::of(&"x".repeat(100));
        assert_eq!(long.as_str().len(), ffi::TFL_ACTIVITY_NAME_BYTES - 1);
        let c = long.to_c_array();
        assert_eq!(c[ffi::TFL_ACTIVITY_NAME_BYTES - 1], 0, "NUL-terminated");
        let e = Text::<4>::of("ééé");
        assert_eq!(e.as_str(), "é");
        let r = record(ActivityKind::Copy, "Memcpy HtoD").to_ffi();
        assert_eq!(r.struct_size, 248);
        assert_eq!((r.kind, r.flags), (ffi::TFL_ACTIVITY_COPY, 0));
        let r = record(ActivityKind::Api, "simMemcpy").to_ffi();
        assert_eq!(r.flags, ffi::TFL_ACTIVITY_HOST_CLOCK);
    }

    #[test]
    fn range_stacks_nest_per_thread_and_are_bounded() {
        let rt = Runtime::new(Config { devices: 1, ..Config::default() }).unwrap();
        rt.range_pop(); // none open: no-op
        rt.range_push("unrecorded"); // pushed while off
        rt.activity_enable(ActivityKind::Range.bit() | ActivityKind::Mark.bit()).unwrap();
        rt.range_push("outer");
        rt.range_push("inner");
        rt.range_mark("instant");
        rt.range_pop();
        std::thread::scope(|s| {
            s.spawn(|| rt.range_pop()); // another thread has no open range
        });
        rt.range_pop();
        rt.range_pop(); // "unrecorded"
        rt.range_pop(); // none open
        let (records, dropped) = rt.activity_drain(100);
        assert_eq!(dropped, 0);
        let got: Vec<_> = records.iter().map(|r| (r.kind, r.name())).collect();
        assert_eq!(
            got,
            [(ActivityKind::Mark, "instant"), (ActivityKind::Range, "inner"), (ActivityKind::Range, "outer")]
        );
        let (mark, inner, outer) = (&records[0], &records[1], &records[2]);
        assert_eq!(mark.start_ns, mark.end_ns);
        assert!(outer.start_ns <= inner.start_ns && inner.end_ns <= outer.end_ns);
        assert!(inner.start_ns <= mark.start_ns && mark.end_ns <= inner.end_ns);
        assert!(records.iter().all(|r| r.device == -1 && r.stream == 0));

        // Deeper than the bound: counted, popped in order, not recorded.
        for i in 0..MAX_RANGE_DEPTH + 3 {
            rt.range_push(&format!("r{i}"));
        }
        for _ in 0..MAX_RANGE_DEPTH + 3 {
            rt.range_pop();
        }
        let (records, _) = rt.activity_drain(usize::MAX);
        assert_eq!(records.len(), MAX_RANGE_DEPTH);
        assert_eq!(records.last().map(ActivityRecord::name), Some("r0"));
        assert_eq!(records.first().map(ActivityRecord::name), Some(&*format!("r{}", MAX_RANGE_DEPTH - 1)));
    }

    #[test]
    fn device_clocks_are_offset_from_the_host_s() {
        let rt = Runtime::new(Config { devices: 2, ..Config::default() }).unwrap();
        let (d0, h0) = rt.activity_clock(0).unwrap();
        let (d1, h1) = rt.activity_clock(1).unwrap();
        assert!(d0 >= 1_000_000_000 && d1 >= 2_000_000_000);
        assert!(d1 - d0 >= 1_000_000_000 && d1 - d0 < 1_100_000_000);
        assert!(h1 >= h0);
        assert_ne!(d0, h0);
        assert!(rt.activity_clock(2).is_err());
    }

    #[test]
    fn correlation_scopes_restore() {
        set_correlation(5);
        {
            let _s = WorkScope::enter(9, 0x40);
            assert_eq!((correlation(), running_stream()), (9, 0x40));
            assert_eq!(Runtime::placement(0, None).stream, 0x40);
        }
        assert_eq!((correlation(), running_stream()), (5, 0));
        set_correlation(0);
    }
}

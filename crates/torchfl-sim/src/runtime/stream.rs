//! Streams, fences and events.
//!
//! A stream is an in-order queue of work on one device. In asynchronous mode
//! each stream owns a worker thread that pops closures and runs them, so a
//! kernel launch only validates its arguments and enqueues: the host thread
//! runs ahead exactly as it would with a GPU, and a host that forgets to
//! synchronize reads stale data here as it would on hardware. In synchronous
//! mode the same closures run inline on the submitting thread.
//!
//! Progress is tracked with two counters per stream: `submitted` (jobs ever
//! enqueued: the tail of the stream's [`Queue`]) and `completed` (jobs
//! finished). Because a stream is in order,
//! "everything submitted up to now" is just the number `submitted`, and it
//! has completed once `completed` reaches it. A [`Fence`] is such a pair
//! (stream, target); events, `stream_wait_event` and the stream-ordered free
//! of [`super::memory`] are all built on fences.
//!
//! Launch overhead: the queue is lock-free ([`super::queue`]), so a launch
//! and the worker exchange only the job's slot. A worker that finds its
//! queue empty polls it for a while ([`WORKER_SPIN`]) before it sleeps, and
//! a submit wakes it (a system call) only if it sleeps. A thread that
//! synchronizes polls briefly ([`HOST_SPIN`]) before it sleeps, and a
//! completion notifies only when a thread sleeps. The counters are atomics
//! on cache lines apart from each other, and jobs ([`Work`]) are stored
//! inline in the queue's slots, so a kernel launch costs no allocation, no
//! lock and, while the worker keeps up, no system call.
//!
//! Work that fails (returns an error or panics) does not stop the stream; the
//! first failure since the device was last synchronized is kept in the
//! device's [`ErrorSink`] and reported by the next stream, event or device
//! synchronize, like CUDA's sticky asynchronous errors.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::log::Logger;
use crate::runtime::config::Mode;
use crate::runtime::queue::{self, Queue};

pub(crate) use crate::runtime::work::Work;

/// Locks a mutex, ignoring poisoning: every critical section in this crate
/// leaves its data consistent, and panics in stream work are caught before
/// they could poison anything.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// How long an idle worker polls its queue before it sleeps: long enough
/// to bridge the gaps between the launches of a busy host (PyTorch's eager
/// mode launches every few microseconds), so that a launch finds the worker
/// awake and costs no wake-up.
const WORKER_SPIN: Duration = Duration::from_micros(50);
/// How long a synchronizing host thread polls before it sleeps: long
/// enough for small kernels. Polling matters because waking a sleeping
/// thread can take tens of microseconds when its core has gone idle (and
/// more in virtual machines); it is a pure busy-wait because yielding the
/// CPU instead would, on a loaded machine, hand it to another process for a
/// whole time slice.
const HOST_SPIN: Duration = Duration::from_micros(20);

/// `spin_loop` hints between two polls of [`spin_until`] (a pause takes
/// from a few to about 40 nanoseconds depending on the CPU).
const POLL_PAUSES: u32 = 16;

/// Busy-polls `done` until it holds (`true`) or `limit` has passed
/// (`false`).
fn spin_until(limit: Duration, done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..32 {
            if done() {
                return true;
            }
            // Polling every few hundred nanoseconds rather than constantly
            // keeps the poller from pulling the line it watches away from
            // the thread writing it after every write.
            for _ in 0..POLL_PAUSES {
                std::hint::spin_loop();
            }
        }
        if start.elapsed() >= limit {
            return done();
        }
    }
}

/// The first asynchronous failure of a device since it was last reported.
#[derive(Debug, Default)]
pub(crate) struct ErrorSink {
    first: Mutex<Option<Error>>,
}

impl ErrorSink {
    /// Keeps `error` unless an earlier one is still unreported.
    pub(crate) fn record(&self, error: Error) {
        let mut first = lock(&self.first);
        if first.is_none() {
            *first = Some(error);
        }
    }
    /// Reports (and clears) the pending failure, if any.
    pub(crate) fn take(&self) -> Result<()> {
        match lock(&self.first).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// What the executing side writes.
struct Completion {
    /// Jobs finished; never exceeds the jobs submitted.
    completed: AtomicU64,
    /// Threads blocked in [`Stream::wait_for`]. A completion takes
    /// `progress_lock` and notifies `progress` only when this is non-zero,
    /// so the common case (nobody waiting) costs no system call.
    waiters: AtomicUsize,
}

/// Keeps its contents on cache lines of their own, so that the host thread
/// (which submits) and the worker (which completes) do not keep stealing
/// each other's lines.
#[repr(align(128))]
struct CacheLine<T>(T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// One stream of one device.
pub(crate) struct Stream {
    id: u64,
    device: usize,
    is_default: bool,
    mode: Mode,
    /// The jobs; its tail is the number of jobs ever submitted (in
    /// synchronous mode it has no slots and only counts).
    queue: Queue,
    done: CacheLine<Completion>,
    /// The worker found the queue empty and sleeps (or is about to) on
    /// `work_ready`: a submit must wake it. Written by the worker only when
    /// it goes to sleep or wakes, so submits read it from their own cache.
    sleeping: CacheLine<AtomicBool>,
    /// A value of `completed` some host thread read (never ahead of it):
    /// lets a free tell that the stream has no unfinished work without
    /// reading the line the worker writes per job. Written by host threads
    /// only, when what they read is newer.
    completed_seen: CacheLine<AtomicU64>,
    /// Held by the worker from its last look at the queue until it sleeps,
    /// and by a waker around its notification, so no wake-up is lost.
    sleep_lock: Mutex<()>,
    /// Signalled when a job is pushed to a sleeping worker or the stream is
    /// closed.
    work_ready: Condvar,
    progress_lock: Mutex<()>,
    /// Signalled whenever `completed` grows while someone waits.
    progress: Condvar,
    sink: Arc<ErrorSink>,
    log: Option<Logger>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.id)
            .field("device", &self.device)
            .field("is_default", &self.is_default)
            .field("submitted", &self.queue.submitted())
            .field("completed", &self.done.completed.load(Ordering::SeqCst))
            .field("closed", &self.queue.is_closed())
            .finish()
    }
}

impl Stream {
    /// Creates a stream; in asynchronous mode this starts its worker thread.
    pub(crate) fn new(
        id: u64,
        device: usize,
        is_default: bool,
        mode: Mode,
        sink: Arc<ErrorSink>,
        log: Option<Logger>,
    ) -> Result<Arc<Self>> {
        let capacity = if mode == Mode::Async { queue::CAPACITY } else { 0 };
        let stream = Arc::new(Self {
            id,
            device,
            is_default,
            mode,
            queue: Queue::new(capacity),
            done: CacheLine(Completion { completed: AtomicU64::new(0), waiters: AtomicUsize::new(0) }),
            sleeping: CacheLine(AtomicBool::new(false)),
            completed_seen: CacheLine(AtomicU64::new(0)),
            sleep_lock: Mutex::new(()),
            work_ready: Condvar::new(),
            progress_lock: Mutex::new(()),
            progress: Condvar::new(),
            sink,
            log,
            worker: Mutex::new(None),
        });
        if mode == Mode::Async {
            let worker = Arc::clone(&stream);
            let handle = std::thread::Builder::new()
                .name(format!("tfl-sim-d{device}-s{id}"))
                .spawn(move || worker.run_worker())
                .map_err(|e| Error::internal(format!("sim: cannot start a stream thread: {e}")))?;
            *lock(&stream.worker) = Some(handle);
        }
        Ok(stream)
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }
    pub(crate) fn device(&self) -> usize {
        self.device
    }
    pub(crate) fn is_default(&self) -> bool {
        self.is_default
    }

    /// The worker loop: run published jobs in order, until the stream is
    /// closed and drained.
    ///
    /// An empty queue is polled for [`WORKER_SPIN`] before the worker goes
    /// to sleep: a host launching a stream of kernels then never pays a
    /// wake-up (a system call and a context switch) per kernel.
    fn run_worker(&self) {
        let Some(mut consumer) = self.queue.consumer() else {
            return; // unreachable: the queue's consumer is taken only here
        };
        loop {
            while let Some(job) = consumer.pop() {
                self.execute(job);
                self.complete_one();
            }
            if consumer.drained() {
                return;
            }
            // Polls the next slot only (the line the next submit writes
            // anyway); a close is noticed when the worker goes to sleep.
            if spin_until(WORKER_SPIN, || consumer.ready()) {
                continue;
            }
            let mut guard = lock(&self.sleep_lock);
            // SeqCst, as `pending` and the submit's claim and load of
            // `sleeping`: either this thread sees the claim of a job, or
            // its submitter sees `sleeping` and wakes this thread (under
            // `sleep_lock`, so not before it waits).
            self.sleeping.store(true, Ordering::SeqCst);
            while !consumer.pending() && !self.queue.is_closed() {
                guard = wait(&self.work_ready, guard);
            }
            self.sleeping.store(false, Ordering::Relaxed);
        }
    }

    /// Counts one finished job and wakes the threads waiting for progress,
    /// if there are any.
    fn complete_one(&self) {
        // SeqCst pairs with `wait_for`: either this load sees the waiter's
        // registration, or the waiter's load sees this increment.
        self.done.completed.fetch_add(1, Ordering::SeqCst);
        if self.done.waiters.load(Ordering::SeqCst) != 0 {
            // Taking the lock orders this notification after a registered
            // waiter's check-then-wait, so the wake-up cannot be lost.
            drop(lock(&self.progress_lock));
            self.progress.notify_all();
        }
    }

    /// Runs one job, turning an error or a panic into a sticky device error.
    fn execute(&self, job: Work) {
        let outcome = match catch_unwind(AssertUnwindSafe(|| job.run())) {
            Ok(r) => r,
            Err(payload) => Err(Error::from_panic("stream work", payload.as_ref())),
        };
        if let Err(e) = outcome {
            if let Some(log) = &self.log {
                log.warning(&format!(
                    "sim: asynchronous failure on device {} stream {}: {} \
                     (reported by the next synchronize)",
                    self.device,
                    self.id,
                    e.message()
                ));
            }
            self.sink.record(e);
        }
    }

    /// Submits `job` and returns its position (the new number of jobs
    /// submitted).
    ///
    /// Asynchronous mode enqueues it; synchronous mode runs it before
    /// returning and reports its failure directly, which is the point of
    /// that mode.
    pub(crate) fn submit(&self, job: Work) -> Result<u64> {
        match self.mode {
            Mode::Async => {
                let Ok(position) = self.queue.push(job) else {
                    return Err(Error::invalid(format!(
                        "sim: stream {} of device {} was destroyed",
                        self.id, self.device
                    )));
                };
                // The other half of the handshake in `run_worker`; after the
                // claim, no fence is needed (see `Queue::push`).
                if self.sleeping.load(Ordering::SeqCst) {
                    drop(lock(&self.sleep_lock));
                    self.work_ready.notify_one();
                }
                Ok(position)
            }
            Mode::Sync => {
                let position = self.queue.count_inline();
                let outcome = catch_unwind(AssertUnwindSafe(|| job.run()))
                    .unwrap_or_else(|p| Err(Error::from_panic("kernel", p.as_ref())));
                self.complete_one();
                outcome.map(|()| position)
            }
        }
    }

    /// A fence on everything submitted so far.
    pub(crate) fn fence(self: &Arc<Self>) -> Fence {
        let target = self.queue.submitted();
        Fence { stream: Arc::clone(self), target }
    }

    /// A fence at `target`, a position returned by [`Stream::submit`].
    pub(crate) fn fence_at(self: &Arc<Self>, target: u64) -> Fence {
        Fence { stream: Arc::clone(self), target }
    }

    /// Whether every submitted job has completed.
    pub(crate) fn is_idle(&self) -> bool {
        let submitted = self.queue.submitted();
        self.completed(Ordering::SeqCst) >= submitted
    }

    /// Whether the stream may have unfinished work: `false` only when it
    /// certainly has none. In asynchronous mode this is judged from what
    /// host threads last read of `completed`, without a read of the
    /// worker's line (which costs a cache miss per kernel while the worker
    /// keeps up); work that finished since is counted as unfinished.
    pub(crate) fn maybe_busy(&self) -> bool {
        match self.mode {
            Mode::Async => self.queue.submitted() > self.completed_seen.load(Ordering::Relaxed),
            // Written by host threads only: reading it costs nothing more.
            Mode::Sync => !self.is_idle(),
        }
    }

    /// Reads `completed`, remembering the value for [`Stream::maybe_busy`].
    fn completed(&self, order: Ordering) -> u64 {
        let completed = self.done.completed.load(order);
        if completed > self.completed_seen.load(Ordering::Relaxed) {
            // A racing thread may store an older value: the hint only ever
            // lags, which `maybe_busy` tolerates.
            self.completed_seen.store(completed, Ordering::Relaxed);
        }
        completed
    }

    /// Whether the stream was destroyed and has drained its queue.
    pub(crate) fn is_retired(&self) -> bool {
        self.queue.is_closed() && self.is_idle()
    }

    fn reached(&self, target: u64) -> bool {
        self.completed(Ordering::Acquire) >= target
    }

    /// Blocks until `completed >= target`. In asynchronous mode it polls
    /// for [`HOST_SPIN`] first: short kernels finish well within that, and
    /// a synchronize then costs no sleep and wake-up.
    fn wait_for(&self, target: u64) {
        if self.reached(target) {
            return;
        }
        if self.mode == Mode::Async && spin_until(HOST_SPIN, || self.reached(target)) {
            return;
        }
        let mut guard = lock(&self.progress_lock);
        self.done.waiters.fetch_add(1, Ordering::SeqCst);
        while self.done.completed.load(Ordering::SeqCst) < target {
            guard = wait(&self.progress, guard);
        }
        self.done.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Blocks until everything submitted so far has completed.
    pub(crate) fn synchronize(self: &Arc<Self>) {
        self.fence().wait();
    }

    /// Stops accepting work; queued work still runs, then the worker exits.
    pub(crate) fn close(&self) {
        self.queue.close();
        drop(lock(&self.sleep_lock));
        self.work_ready.notify_all();
    }

    /// Joins the worker thread if it is still attached (after `close`).
    pub(crate) fn join(&self) {
        let handle = lock(&self.worker).take();
        if let Some(handle) = handle {
            // A worker never panics (jobs run under catch_unwind), so an
            // error here carries nothing worth reporting.
            let _ = handle.join();
        }
    }

    /// Detaches the worker: it exits by itself once the queue is drained.
    pub(crate) fn detach(&self) {
        drop(lock(&self.worker).take());
    }
}

/// A point in a stream: complete once the stream has completed `target` jobs.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    stream: Arc<Stream>,
    target: u64,
}

impl Fence {
    pub(crate) fn is_complete(&self) -> bool {
        self.stream.reached(self.target)
    }
    pub(crate) fn wait(&self) {
        self.stream.wait_for(self.target);
    }
    pub(crate) fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }
}

/// What an event captured when it was last recorded.
#[derive(Debug, Clone)]
struct Recording {
    fence: Fence,
    /// Set by the stream when it reaches the record point (timing events).
    time: Option<Arc<OnceLock<Instant>>>,
}

/// An event: a marker recorded on a stream.
#[derive(Debug)]
pub(crate) struct Event {
    device: usize,
    timing: bool,
    recording: Mutex<Option<Recording>>,
}

impl Event {
    pub(crate) fn new(device: usize, timing: bool) -> Self {
        Self { device, timing, recording: Mutex::new(None) }
    }

    pub(crate) fn device(&self) -> usize {
        self.device
    }

    /// Captures the work submitted to `stream` so far, replacing any earlier
    /// capture. A timing event enqueues a marker that stamps the time at
    /// which the stream actually gets there.
    pub(crate) fn record(&self, stream: &Arc<Stream>) -> Result<()> {
        let recording = if self.timing {
            let time = Arc::new(OnceLock::new());
            let stamp = Arc::clone(&time);
            let position = stream.submit(Work::new(move || {
                let _ = stamp.set(Instant::now());
                Ok(())
            }))?;
            Recording { fence: stream.fence_at(position), time: Some(time) }
        } else {
            Recording { fence: stream.fence(), time: None }
        };
        *lock(&self.recording) = Some(recording);
        Ok(())
    }

    fn current(&self) -> Option<Recording> {
        lock(&self.recording).clone()
    }

    /// Whether the recorded work has run (true when never recorded).
    pub(crate) fn is_complete(&self) -> bool {
        match self.current() {
            Some(r) => r.fence.is_complete(),
            None => true,
        }
    }

    /// Waits for the recorded work (returns at once when never recorded).
    pub(crate) fn synchronize(&self) {
        if let Some(r) = self.current() {
            r.fence.wait();
        }
    }

    /// The fence a `stream_wait_event` waits on; `None` when never recorded.
    pub(crate) fn fence(&self) -> Option<Fence> {
        self.current().map(|r| r.fence)
    }

    /// The time stamped at the record point, once it has been reached.
    fn timestamp(&self, which: &str) -> Result<Instant> {
        if !self.timing {
            return Err(Error::precondition(format!(
                "sim: event_elapsed_time: the {which} event was not created with TFL_EVENT_TIMING"
            )));
        }
        let Some(recording) = self.current() else {
            return Err(Error::precondition(format!(
                "sim: event_elapsed_time: the {which} event was never recorded"
            )));
        };
        match recording.time.as_ref().and_then(|t| t.get().copied()) {
            Some(t) if recording.fence.is_complete() => Ok(t),
            _ => Err(Error::precondition(format!(
                "sim: event_elapsed_time: the {which} event has not completed yet"
            ))),
        }
    }

    /// Milliseconds from `start` to `end` (negative when `end` came first).
    pub(crate) fn elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
        let (t0, t1) = (start.timestamp("start")?, end.timestamp("end")?);
        let ms = if t1 >= t0 {
            t1.duration_since(t0).as_secs_f64() * 1e3
        } else {
            -(t0.duration_since(t1).as_secs_f64() * 1e3)
        };
        Ok(ms as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(mode: Mode) -> Arc<Stream> {
        Stream::new(1, 0, false, mode, Arc::new(ErrorSink::default()), None).unwrap()
    }

    #[test]
    fn runs_in_order_and_counts() {
        let s = stream(Mode::Async);
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..100 {
            let log = Arc::clone(&log);
            s.submit(Work::new(move || {
                lock(&log).push(i);
                Ok(())
            }))
            .unwrap();
        }
        s.synchronize();
        assert!(s.is_idle());
        assert_eq!(*lock(&log), (0..100).collect::<Vec<_>>());
        s.close();
        s.join();
    }

    #[test]
    fn failures_are_sticky_until_taken() {
        let sink = Arc::new(ErrorSink::default());
        let s = Stream::new(1, 0, false, Mode::Async, Arc::clone(&sink), None).unwrap();
        s.submit(Work::new(|| Err(Error::internal("first")))).unwrap();
        s.submit(Work::new(|| panic!("second"))).unwrap();
        let ran = Arc::new(AtomicU64::new(0));
        let r = Arc::clone(&ran);
        s.submit(Work::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
        .unwrap();
        s.synchronize();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "later work still runs");
        assert_eq!(sink.take().unwrap_err().message(), "first");
        assert!(sink.take().is_ok());
        s.close();
        s.join();
    }

    #[test]
    fn sync_mode_reports_inline() {
        let s = stream(Mode::Sync);
        let e = s.submit(Work::new(|| panic!("boom"))).unwrap_err();
        assert!(e.message().contains("boom"));
        assert!(s.is_idle());
        assert_eq!(s.submit(Work::new(|| Ok(()))).unwrap(), 2);
    }

    #[test]
    fn untimed_and_unrecorded_events() {
        let s = stream(Mode::Async);
        let e = Event::new(0, false);
        assert!(e.is_complete(), "never recorded counts as complete");
        e.record(&s).unwrap();
        e.synchronize();
        assert!(e.is_complete());
        let err = Event::elapsed_ms(&e, &e).unwrap_err();
        assert!(err.message().contains("TFL_EVENT_TIMING"));
        s.close();
        s.join();
    }
}

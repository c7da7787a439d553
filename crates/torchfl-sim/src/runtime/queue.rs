//! [`Queue`]: a stream's job queue, lock-free.
//!
//! A bounded ring of [`Work`] slots with many producers (any host thread
//! may launch on a stream) and one consumer (the stream's worker). A
//! producer claims a position with one compare-and-swap on the tail, moves
//! its job into the position's slot and publishes it by storing the slot's
//! sequence number; the consumer polls that number, takes the job and
//! counts it in the head. Each side writes only its own lines: producers
//! the tail and the slots, the consumer the head, which producers read only
//! when the ring looks full to them (they remember the last head they saw).
//! Per kernel, then, the host thread and the worker exchange only the
//! slot, and for a small closure (the elementwise fast path's) only its
//! first cache line ([`Work::move_to`]), instead of bouncing a mutex, the
//! queue's storage and counters between them.
//!
//! The tail counts the positions ever claimed, i.e. the jobs ever
//! submitted; positions are claimed and run in order, which is what makes a
//! stream in-order. Closing sets a bit in the tail, so no position can be
//! claimed after the close (the compare-and-swap fails), and the consumer
//! knows it is done once it has taken every position claimed before.
//!
//! A full queue makes the producer wait for the worker (as a GPU's launch
//! queue does): [`CAPACITY`] jobs of lead are far more than a host needs to
//! stay ahead.

use std::cell::UnsafeCell;
use std::mem::{size_of, MaybeUninit};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::runtime::work::Work;

/// Slots of an asynchronous stream's queue (a power of two; 128 KiB).
pub(crate) const CAPACITY: usize = 1024;

/// Set in the tail once the queue is closed.
const CLOSED: u64 = 1 << 63;

/// One position of the ring; two cache lines.
#[repr(C, align(64))]
struct Slot {
    /// `p + 1` once the job of position `p` (the last one mapped to this
    /// slot) is published; written by producers only.
    seq: AtomicU64,
    /// The job, valid from its publication until the consumer takes it.
    job: UnsafeCell<MaybeUninit<Work>>,
}

const _: () = assert!(size_of::<Slot>() == 128);

/// Keeps what one side writes on cache lines of its own.
#[repr(align(128))]
struct Padded<T>(T);

/// What producers write.
struct Producers {
    /// Positions ever claimed (jobs ever submitted), plus [`CLOSED`].
    tail: AtomicU64,
    /// A head some producer read recently (never ahead of the real one):
    /// positions below it plus the capacity are free without reading the
    /// consumer's line.
    head_seen: AtomicU64,
}

/// A stream's queue of jobs.
pub(crate) struct Queue {
    producers: Padded<Producers>,
    /// Jobs the consumer has taken: their slots are free again. Written by
    /// the consumer only.
    head: Padded<AtomicU64>,
    /// Set (after [`CLOSED`]) by [`Queue::close`]: what the consumer
    /// polls, so that it reads the tail, which every submit writes, only
    /// once the queue is closed.
    closed: Padded<AtomicBool>,
    /// Whether [`Queue::consumer`] has handed out the consumer.
    consumer_taken: AtomicBool,
    slots: Box<[Slot]>,
}

// SAFETY: the only non-`Sync` part is the jobs' cells. A slot's job is
// written only by the producer that claimed its position (the tail's
// compare-and-swap hands each position to one producer), after it saw
// (acquire) that the consumer had taken the slot's previous job, and read
// only by the single consumer after it saw the release-store that
// published it; `Work` is `Send`, so moving it between threads this way is
// sound.
unsafe impl Sync for Queue {}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("submitted", &self.submitted())
            .field("closed", &self.is_closed())
            .field("capacity", &self.slots.len())
            .finish()
    }
}

impl Queue {
    /// A queue of `capacity` slots (rounded up to a power of two; 0 for a
    /// queue that only counts jobs run inline, see [`Queue::count_inline`]).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = if capacity == 0 { 0 } else { capacity.next_power_of_two() };
        let slots = (0..capacity)
            .map(|_| Slot { seq: AtomicU64::new(0), job: UnsafeCell::new(MaybeUninit::uninit()) })
            .collect();
        Self {
            producers: Padded(Producers { tail: AtomicU64::new(0), head_seen: AtomicU64::new(0) }),
            head: Padded(AtomicU64::new(0)),
            closed: Padded(AtomicBool::new(false)),
            consumer_taken: AtomicBool::new(false),
            slots,
        }
    }

    fn tail(&self) -> &AtomicU64 {
        &self.producers.0.tail
    }

    /// Jobs ever submitted (claimed positions; a job is published right
    /// after its position is claimed).
    pub(crate) fn submitted(&self) -> u64 {
        self.tail().load(Ordering::SeqCst) & !CLOSED
    }

    /// Whether [`Queue::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.0.load(Ordering::SeqCst)
    }

    /// Refuses every later [`Queue::push`]; jobs already claimed stay.
    pub(crate) fn close(&self) {
        self.tail().fetch_or(CLOSED, Ordering::SeqCst);
        self.closed.0.store(true, Ordering::SeqCst);
    }

    /// Counts a job that runs inline (synchronous mode, where the queue has
    /// no slots) and returns its position.
    pub(crate) fn count_inline(&self) -> u64 {
        (self.tail().fetch_add(1, Ordering::SeqCst) & !CLOSED) + 1
    }

    /// Whether position `pos` has a free slot: the consumer has taken the
    /// job one lap back. Reads the consumer's line only when the head this
    /// thread's producers saw last is not enough.
    fn has_room(&self, pos: u64) -> bool {
        let capacity = self.slots.len() as u64;
        // Acquire (both): the consumer's reads of the slot's previous job
        // happen before the caller overwrites it.
        if pos < self.producers.0.head_seen.load(Ordering::Acquire) + capacity {
            return true;
        }
        let head = self.head.0.load(Ordering::Acquire);
        self.producers.0.head_seen.fetch_max(head, Ordering::AcqRel);
        pos < head + capacity
    }

    /// Appends `work` and returns its position (the new number of jobs
    /// submitted), waiting while the queue is full; gives `work` back if
    /// the queue is closed (or has no slots).
    ///
    /// The claim is a sequentially consistent read-modify-write of the
    /// tail: a consumer that announces it goes to sleep and then checks
    /// [`Consumer::pending`] (both SeqCst) either sees this job, or this
    /// producer's next SeqCst load sees the announcement.
    pub(crate) fn push(&self, work: Work) -> Result<u64, Work> {
        let capacity = self.slots.len() as u64;
        if capacity == 0 {
            return Err(work);
        }
        let mut pos = self.tail().load(Ordering::Relaxed);
        let mut waited = 0u32;
        loop {
            if pos & CLOSED != 0 {
                return Err(work);
            }
            if !self.has_room(pos) {
                wait_for_room(&mut waited);
                pos = self.tail().load(Ordering::Relaxed);
                continue;
            }
            match self.tail().compare_exchange_weak(pos, pos + 1, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => break,
                Err(current) => pos = current,
            }
        }
        let slot = &self.slots[(pos & (capacity - 1)) as usize];
        // SAFETY: this producer owns position `pos` (its compare-and-swap
        // claimed it), the slot is free (`has_room`: the consumer took the
        // job one lap back) and the consumer does not read it before the
        // store below; the cell is aligned for a `Work`.
        unsafe { work.move_to((*slot.job.get()).as_mut_ptr()) };
        slot.seq.store(pos + 1, Ordering::Release);
        Ok(pos + 1)
    }

    /// The consumer, the first time this is called; `None` afterwards.
    pub(crate) fn consumer(&self) -> Option<Consumer<'_>> {
        if self.consumer_taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(Consumer { queue: self, head: self.head.0.load(Ordering::Acquire) })
    }
}

/// Backs off while the queue is full: the worker needs the CPU (on a
/// machine with few cores it may be the very thread this one waits for).
fn wait_for_room(waited: &mut u32) {
    *waited = waited.saturating_add(1);
    if *waited < 64 {
        for _ in 0..64 {
            std::hint::spin_loop();
        }
    } else if *waited < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let capacity = self.slots.len() as u64;
        if capacity == 0 {
            return;
        }
        let tail = *self.producers.0.tail.get_mut() & !CLOSED;
        let mut pos = *self.head.0.get_mut();
        while pos < tail {
            let slot = &mut self.slots[(pos & (capacity - 1)) as usize];
            if *slot.seq.get_mut() == pos + 1 {
                // SAFETY: published and never taken: the slot holds a job
                // that nothing else owns any more; taken once, then dropped.
                drop(unsafe { Work::take_from(slot.job.get_mut().as_ptr()) });
            }
            pos += 1;
        }
    }
}

/// The single consumer of a [`Queue`].
pub(crate) struct Consumer<'a> {
    queue: &'a Queue,
    /// The next position to take.
    head: u64,
}

impl Consumer<'_> {
    fn slot(&self) -> &Slot {
        let mask = self.queue.slots.len() as u64 - 1;
        &self.queue.slots[(self.head & mask) as usize]
    }

    /// Whether a job has been submitted that this consumer has not taken
    /// (it may not be published yet: its producer is about to). SeqCst:
    /// this is the consumer's half of the sleep handshake, see
    /// [`Queue::push`].
    pub(crate) fn pending(&self) -> bool {
        self.queue.submitted() > self.head
    }

    /// Whether the next job has been published.
    pub(crate) fn ready(&self) -> bool {
        !self.queue.slots.is_empty() && self.slot().seq.load(Ordering::Acquire) == self.head + 1
    }

    /// Whether the queue is closed and every job claimed before the close
    /// has been taken: nothing can arrive any more.
    pub(crate) fn drained(&self) -> bool {
        self.queue.is_closed() && self.queue.submitted() == self.head
    }

    /// Takes the next job, if it has been published.
    pub(crate) fn pop(&mut self) -> Option<Work> {
        if !self.ready() {
            return None;
        }
        // SAFETY: `seq == head + 1` (acquire-loaded by `ready`): the
        // producer of `head` has moved its job into the slot, and this
        // consumer is the only one (handed out once), so it is taken once;
        // the release-store of the head below lets the slot be reused only
        // after this read.
        let work = unsafe { Work::take_from((*self.slot().job.get()).as_ptr()) };
        self.head += 1;
        self.queue.head.0.store(self.head, Ordering::Release);
        Some(work)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Mutex};

    fn job(log: &Arc<Mutex<Vec<u64>>>, value: u64) -> Work {
        let log = Arc::clone(log);
        Work::new(move || {
            log.lock().unwrap().push(value);
            Ok(())
        })
    }

    #[test]
    fn fifo_wraps_and_closes() {
        let q = Queue::new(4);
        let mut c = q.consumer().unwrap();
        assert!(q.consumer().is_none(), "one consumer");
        let log = Arc::new(Mutex::new(Vec::new()));
        for round in 0..5u64 {
            for i in 0..4 {
                assert_eq!(q.push(job(&log, round * 4 + i)).ok(), Some(round * 4 + i + 1));
            }
            while let Some(w) = c.pop() {
                w.run().unwrap();
            }
        }
        assert_eq!(*log.lock().unwrap(), (0..20).collect::<Vec<_>>());
        assert!(!c.drained());
        q.close();
        assert!(q.is_closed() && c.drained());
        assert!(q.push(job(&log, 99)).is_err(), "closed");
        assert_eq!(q.submitted(), 20);
    }

    #[test]
    fn many_producers_one_consumer() {
        let q = Arc::new(Queue::new(8));
        let sum = Arc::new(AtomicUsize::new(0));
        let producers: Vec<_> = (0..4)
            .map(|_| {
                let (q, sum) = (Arc::clone(&q), Arc::clone(&sum));
                std::thread::spawn(move || {
                    for i in 1..=500 {
                        let sum = Arc::clone(&sum);
                        let w = Work::new(move || {
                            sum.fetch_add(i, Ordering::SeqCst);
                            Ok(())
                        });
                        assert!(q.push(w).is_ok());
                    }
                })
            })
            .collect();
        let mut c = q.consumer().unwrap();
        let mut taken = 0;
        while taken < 2000 {
            match c.pop() {
                Some(w) => {
                    w.run().unwrap();
                    taken += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        producers.into_iter().for_each(|p| p.join().unwrap());
        assert_eq!(sum.load(Ordering::SeqCst), 4 * 500 * 501 / 2);
        assert!(c.pop().is_none());
    }

    #[test]
    fn unconsumed_jobs_are_dropped_once() {
        let state = Arc::new(());
        let q = Queue::new(4);
        for _ in 0..3 {
            let s = Arc::clone(&state);
            assert!(q
                .push(Work::new(move || {
                    drop(s);
                    Ok(())
                }))
                .is_ok());
        }
        let mut c = q.consumer().unwrap();
        c.pop().unwrap().run().unwrap();
        assert_eq!(Arc::strong_count(&state), 3);
        drop(q);
        assert_eq!(Arc::strong_count(&state), 1);
    }

    #[test]
    fn inline_counting() {
        let q = Queue::new(0);
        assert!(q.push(Work::new(|| Ok(()))).is_err(), "no slots");
        assert_eq!(q.count_inline(), 1);
        assert_eq!(q.count_inline(), 2);
        q.close();
        assert_eq!(q.submitted(), 2);
    }
}

//! [`Work`]: a unit of stream work, stored inline.
//!
//! Every kernel launch hands its stream one closure. Boxing each one costs
//! an allocation on the host thread and a free on the stream's worker (a
//! cross-thread free, which glibc serialises on the allocating thread's
//! arena), per kernel. A `Work` instead keeps closures of up to
//! [`INLINE_BYTES`] inside itself, so queueing one is a copy into the
//! stream's queue, whose storage is reused from batch to batch; larger
//! closures are boxed as before.

use std::mem::{align_of, size_of, ManuallyDrop, MaybeUninit};
use std::ptr::{addr_of, addr_of_mut};

use crate::error::Result;

/// Closure bytes kept inline: enough for the elementwise fast path (a few
/// addresses and constants) and the runtime's copies, fills and markers,
/// while a `Work` plus the slot's sequence number of the stream's queue
/// ([`super::queue`]) fill exactly two cache lines, which is what the queue
/// moves between the host thread and the worker per kernel. Larger
/// closures (strided elementwise work, reductions, matrix products) are
/// boxed.
const INLINE_BYTES: usize = 112;
/// Alignment of the inline storage: a word, which is what closures of
/// addresses, sizes and scalars need; more strictly aligned ones are boxed.
const INLINE_ALIGN: usize = 8;

/// A boxed closure, for those too large or too aligned to keep inline.
type Boxed = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

const _: () = assert!(size_of::<Boxed>() <= INLINE_BYTES && align_of::<Boxed>() <= INLINE_ALIGN);

#[repr(C, align(8))]
struct Storage(MaybeUninit<[u8; INLINE_BYTES]>);

const _: () = assert!(align_of::<Storage>() == INLINE_ALIGN);

/// How to run or drop the closure of one type.
struct VTable {
    /// Moves the closure out of the storage and calls it.
    run: unsafe fn(*mut Storage) -> Result<()>,
    /// Drops the closure in the storage without calling it.
    drop: unsafe fn(*mut Storage),
    /// Whether the closure is a box of the caller's (too large to inline).
    boxed: bool,
    /// Bytes of the storage the closure occupies (`size_of` its type).
    size: usize,
}

/// The [`VTable`] of closures of type `F`.
struct VTableOf<F, const BOXED: bool>(std::marker::PhantomData<F>);

impl<F: FnOnce() -> Result<()>, const BOXED: bool> VTableOf<F, BOXED> {
    const VTABLE: VTable =
        VTable { run: run_in_place::<F>, drop: drop_in_place::<F>, boxed: BOXED, size: size_of::<F>() };
}

/// A unit of stream work: a closure that owns everything it needs (the call
/// frame that described it is gone by the time it runs).
///
/// `repr(C)`: the vtable comes first, so that in a queue slot (after an
/// 8-byte sequence number) the vtable and the first [`PREFIX_BYTES`] of the
/// closure share the slot's first cache line.
#[repr(C)]
pub(crate) struct Work {
    vtable: &'static VTable,
    /// The closure, of the type `vtable` was made for.
    storage: Storage,
    /// Opts out of the auto traits: `Send` is implemented below on the
    /// strength of `Work::new`'s bound, and a `Work` is not `Sync` (like
    /// the `Box<dyn FnOnce() + Send>` it replaces).
    _not_auto: std::marker::PhantomData<*mut ()>,
}

/// The queue's slots are a sequence number and a `Work`: 128 bytes.
pub(crate) const WORK_SIZE: usize = 120;

/// Closure bytes that, in a queue slot, share the first cache line with the
/// sequence number and the vtable: a closure this small (the elementwise
/// fast path's) crosses between threads as one line; [`Work::move_to`] and
/// [`Work::take_from`] copy only these bytes for it.
const PREFIX_BYTES: usize = 64 - 16;

/// The first [`PREFIX_BYTES`] of a [`Storage`].
type Prefix = MaybeUninit<[u8; PREFIX_BYTES]>;

const _: () = assert!(size_of::<Work>() == WORK_SIZE && align_of::<Work>() == 8);

// SAFETY: `Work::new` only accepts `Send` closures (and a box of one), so
// the value in `storage` may move to another thread; the function pointers
// are plain code.
unsafe impl Send for Work {}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work").field("boxed", &self.vtable.boxed).finish_non_exhaustive()
    }
}

/// # Safety
/// `storage` must hold an `F` that has not been moved out or dropped; it
/// is moved out here (the storage is logically empty afterwards).
unsafe fn run_in_place<F: FnOnce() -> Result<()>>(storage: *mut Storage) -> Result<()> {
    // SAFETY: caller contract; `Storage` is aligned for `F` (checked when
    // the value was written) and the read takes ownership.
    let f = unsafe { storage.cast::<F>().read() };
    f()
}

/// # Safety
/// `storage` must hold an `F` that has not been moved out or dropped; it
/// is dropped here.
unsafe fn drop_in_place<F>(storage: *mut Storage) {
    // SAFETY: caller contract.
    unsafe { storage.cast::<F>().drop_in_place() }
}

impl Work {
    /// Wraps `f`, inline when it fits.
    #[inline]
    pub(crate) fn new<F: FnOnce() -> Result<()> + Send + 'static>(f: F) -> Self {
        if size_of::<F>() <= INLINE_BYTES && align_of::<F>() <= INLINE_ALIGN {
            Self::store::<F, false>(f)
        } else {
            Self::store::<Boxed, true>(Box::new(f))
        }
    }

    /// Moves `f` into the inline storage.
    #[inline(always)]
    fn store<F: FnOnce() -> Result<()> + Send + 'static, const BOXED: bool>(f: F) -> Self {
        if size_of::<F>() > INLINE_BYTES || align_of::<F>() > INLINE_ALIGN {
            // Unreachable: `new` boxes such closures, and a box fits (see
            // the assertion on `Boxed`). Boxing again keeps it sound even
            // if that changed.
            return Self::store::<Boxed, true>(Box::new(f));
        }
        let mut storage = Storage(MaybeUninit::uninit());
        // SAFETY: `F` fits in the storage's size and alignment (checked
        // above); the storage is fresh, so nothing is overwritten.
        unsafe { std::ptr::addr_of_mut!(storage).cast::<F>().write(f) };
        Self { storage, vtable: &VTableOf::<F, BOXED>::VTABLE, _not_auto: std::marker::PhantomData }
    }

    /// Moves the job to `dst`, copying only the storage bytes its closure
    /// occupies (rounded up to [`PREFIX_BYTES`] or to the whole storage).
    ///
    /// # Safety
    /// `dst` must be valid for writes of a `Work` and aligned; whatever it
    /// held is overwritten without being dropped, and it holds this job
    /// afterwards (to be taken out with [`Work::take_from`]).
    #[inline(always)]
    pub(crate) unsafe fn move_to(self, dst: *mut Work) {
        let this = ManuallyDrop::new(self);
        let short = this.vtable.size <= PREFIX_BYTES;
        // SAFETY: `dst` is valid and aligned (contract); the storage is
        // plain bytes (possibly uninitialized, which `MaybeUninit` copies
        // allow), and the closure lies within the bytes copied, so `dst`
        // now owns it; `this` is never dropped, so it is not dropped twice.
        unsafe {
            addr_of_mut!((*dst).vtable).write(this.vtable);
            let to = addr_of_mut!((*dst).storage);
            if short {
                to.cast::<Prefix>().write(addr_of!(this.storage).cast::<Prefix>().read());
            } else {
                to.write(addr_of!(this.storage).read());
            }
        }
    }

    /// Moves the job that [`Work::move_to`] put at `src` out of it.
    ///
    /// # Safety
    /// `src` must hold a job written by [`Work::move_to`] and not taken
    /// since; afterwards it holds none (it must not be taken or dropped
    /// again).
    #[inline(always)]
    pub(crate) unsafe fn take_from(src: *const Work) -> Work {
        // SAFETY: `src` holds a job (contract): its vtable is initialized,
        // and its closure lies within the bytes copied (as in `move_to`).
        unsafe {
            let vtable = addr_of!((*src).vtable).read();
            let mut storage = Storage(MaybeUninit::uninit());
            let from = addr_of!((*src).storage);
            if vtable.size <= PREFIX_BYTES {
                addr_of_mut!(storage).cast::<Prefix>().write(from.cast::<Prefix>().read());
            } else {
                storage = from.read();
            }
            Self { vtable, storage, _not_auto: std::marker::PhantomData }
        }
    }

    /// Whether the closure had to be boxed.
    #[cfg(test)]
    pub(crate) fn is_boxed(&self) -> bool {
        self.vtable.boxed
    }

    /// Runs the closure.
    #[inline]
    pub(crate) fn run(self) -> Result<()> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `storage` holds the closure the vtable was made for, not
        // yet moved out (a Work runs at most once: this consumes it), and
        // `this` is never dropped, so the closure is not dropped again
        // after `run` has moved it out, even if it panics.
        unsafe { (this.vtable.run)(&mut this.storage) }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        // SAFETY: a Work that is dropped never ran (`run` consumes it
        // without dropping), so the closure is still in `storage`.
        unsafe { (self.vtable.drop)(&mut self.storage) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn runs_and_drops_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        struct Guard(Arc<AtomicUsize>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let g = Guard(Arc::clone(&drops));
        let w = Work::new(move || {
            let _g = &g;
            Ok(())
        });
        assert!(!w.is_boxed());
        let moved = w;
        moved.run().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1, "ran and dropped its state");

        let g = Guard(Arc::clone(&drops));
        drop(Work::new(move || {
            let _g = &g;
            Ok(())
        }));
        assert_eq!(drops.load(Ordering::SeqCst), 2, "dropped without running");

        let g = Guard(Arc::clone(&drops));
        let w = Work::new(move || {
            let _g = &g;
            panic!("boom")
        });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run()));
        assert!(r.is_err());
        assert_eq!(drops.load(Ordering::SeqCst), 3, "a panicking closure is dropped once");
    }

    /// Moves a closure of an Arc and `N` bytes through a slot full of
    /// garbage, runs it and checks that it saw its bytes.
    fn through_a_slot<const N: usize>() {
        let bytes: [u8; N] = std::array::from_fn(|i| (i as u8).wrapping_mul(7).wrapping_add(1));
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        let w = Work::new(move || {
            assert!(bytes.iter().enumerate().all(|(i, &b)| b == (i as u8).wrapping_mul(7).wrapping_add(1)));
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        assert_eq!(w.is_boxed(), N + 8 > INLINE_BYTES, "{N}");
        let mut slot = MaybeUninit::<Work>::uninit();
        let at = slot.as_mut_ptr();
        // SAFETY: an aligned slot for a Work, filled with garbage bytes,
        // then written once and taken once.
        let back = unsafe {
            std::ptr::write_bytes(at.cast::<u8>(), 0xAA, WORK_SIZE);
            w.move_to(at);
            Work::take_from(at)
        };
        back.run().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "closure of {N} bytes");
    }

    #[test]
    fn moves_through_a_slot_keep_the_closure() {
        through_a_slot::<1>();
        through_a_slot::<33>();
        through_a_slot::<{ PREFIX_BYTES - 8 }>();
        through_a_slot::<{ PREFIX_BYTES - 7 }>();
        through_a_slot::<{ INLINE_BYTES - 8 }>();
        through_a_slot::<{ INLINE_BYTES - 7 }>();
        // Small closures that hold exactly the prefix, moved and dropped.
        let drops = Arc::new(AtomicUsize::new(0));
        struct Guard(Arc<AtomicUsize>, [u64; 4]);
        impl Drop for Guard {
            fn drop(&mut self) {
                assert_eq!(self.1, [1, 2, 3, 4]);
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let g = Guard(Arc::clone(&drops), [1, 2, 3, 4]);
        let w = Work::new(move || {
            let _g = &g;
            Ok(())
        });
        assert!(w.vtable.size <= PREFIX_BYTES);
        let mut slot = MaybeUninit::<Work>::uninit();
        // SAFETY: a fresh, aligned slot, written once and taken once.
        let back = unsafe {
            w.move_to(slot.as_mut_ptr());
            Work::take_from(slot.as_ptr())
        };
        drop(back);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn large_closures_are_boxed() {
        let big = [7u8; INLINE_BYTES + 1];
        let w = Work::new(move || {
            assert_eq!(big[INLINE_BYTES], 7);
            Ok(())
        });
        assert!(w.is_boxed());
        w.run().unwrap();
        let aligned = Aligned([3; 4]);
        #[repr(align(64))]
        struct Aligned([u8; 4]);
        let w = Work::new(move || {
            let whole = &aligned; // the whole struct, not just its field
            assert_eq!(whole.0[0], 3);
            Ok(())
        });
        assert!(w.is_boxed());
        w.run().unwrap();
    }
}

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

use crate::error::Result;

/// Closure bytes kept inline: enough for the elementwise fast path (a few
/// addresses and constants) and the runtime's copies, fills and markers,
/// while a `Work` stays two cache lines, which is what the stream's queue
/// moves between the host thread and the worker per kernel. Larger
/// closures (strided elementwise work, reductions, matrix products) are
/// boxed.
const INLINE_BYTES: usize = 112;
/// Alignment of the inline storage.
const INLINE_ALIGN: usize = 16;

/// A boxed closure, for those too large or too aligned to keep inline.
type Boxed = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

const _: () = assert!(size_of::<Boxed>() <= INLINE_BYTES && align_of::<Boxed>() <= INLINE_ALIGN);

#[repr(C, align(16))]
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
}

/// The [`VTable`] of closures of type `F`.
struct VTableOf<F, const BOXED: bool>(std::marker::PhantomData<F>);

impl<F: FnOnce() -> Result<()>, const BOXED: bool> VTableOf<F, BOXED> {
    const VTABLE: VTable = VTable { run: run_in_place::<F>, drop: drop_in_place::<F>, boxed: BOXED };
}

/// A unit of stream work: a closure that owns everything it needs (the call
/// frame that described it is gone by the time it runs).
pub(crate) struct Work {
    /// The closure, of the type `vtable` was made for.
    storage: Storage,
    vtable: &'static VTable,
    /// Opts out of the auto traits: `Send` is implemented below on the
    /// strength of `Work::new`'s bound, and a `Work` is not `Sync` (like
    /// the `Box<dyn FnOnce() + Send>` it replaces).
    _not_auto: std::marker::PhantomData<*mut ()>,
}

const _: () = assert!(size_of::<Work>() == 128);

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

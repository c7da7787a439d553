//! Device memory: real host allocations with device semantics.
//!
//! Each device owns an allocator that hands out 64-byte aligned, zeroed
//! blocks from the host heap and accounts them against the configured
//! capacity, so out-of-memory errors, peaks and statistics behave like a real
//! device's while the memory itself is obtained on demand.
//!
//! # Stream-ordered free
//!
//! The host may free a buffer that queued work still reads (PyTorch's caching
//! allocator does so all the time: a temporary dies as soon as the Python
//! expression is done, long before the stream ran the kernel). `deallocate`
//! therefore only *retires* a block: it records fences on every stream that
//! had unfinished work at the time of the call, and the block is given back
//! to the host heap once all of them have completed. Retired blocks are swept
//! on every allocate, deallocate and synchronize, and an allocation that
//! would exceed the capacity waits for the retired blocks' fences before it
//! gives up. This is what makes device memory that kernels use outlive the
//! call frames that described it without any reference counting.
//!
//! Accounting: `allocated` drops at `deallocate` (the host no longer owns the
//! block), while `reserved` keeps counting retired blocks until they are
//! reclaimed (the plugin still holds them). The capacity limit applies to
//! `reserved`, i.e. to what is really held.
//!
//! # Range checks
//!
//! Every kernel launch checks each tensor's extent against the live blocks
//! ([`DeviceMemory::resolve`]). To keep that off the allocator's lock, each
//! thread remembers the last few blocks it resolved together with the
//! allocator's *generation*, a counter bumped (under the lock, before the
//! memory is released) whenever a block stops being live. A remembered block whose
//! generation is still current is therefore still live with the same size,
//! and a range inside it passes without locking; anything else takes the
//! locked path, which refreshes the memory.
//!
//! # Strict mode and tagged pointers
//!
//! With `strict=1` the pointers handed to the host are
//! `real + ((0xA0 + device) << 48)`: bits 48..55 carry a device tag. Such an
//! address is non-canonical on x86-64 and is not covered by aarch64's
//! top-byte-ignore, so a host that dereferences device memory faults at once
//! instead of silently working on the simulator and breaking on hardware
//! whose memory it cannot address. The host's pointer arithmetic (base plus
//! offset) keeps the tag intact; the plugin checks and removes it whenever it
//! touches memory, which also tells it which device a pointer belongs to.

use std::alloc::{self, Layout};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use torchfl_ffi::TFL_MemoryStats;

use crate::error::{Error, Result};
use crate::stream::{lock, Fence};

/// Alignment of every allocation, in bytes.
pub const ALIGNMENT: usize = 64;

const TAG_SHIFT: u32 = 48;
const TAG_MASK: u64 = 0xFF << TAG_SHIFT;
/// Bits that must be clear in a real (untagged) user-space address.
const HIGH_MASK: u64 = 0xFFFF << TAG_SHIFT;

/// The strict-mode tag of `device`: bits 48..55 = `0xA0 + device`.
pub fn strict_tag(device: usize) -> u64 {
    (0xA0 + device as u64) << TAG_SHIFT
}

/// Which device's tag `ptr` carries, if any.
fn tagged_device(ptr: u64) -> Option<usize> {
    let byte = (ptr & TAG_MASK) >> TAG_SHIFT;
    (ptr & !(TAG_MASK | ((1u64 << TAG_SHIFT) - 1)) == 0 && (0xA0..=0xFF).contains(&byte))
        .then(|| (byte - 0xA0) as usize)
}

/// Per-device statistics, mirroring `TFL_MemoryStats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in live allocations (owned by the host).
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes` since start or the last peak reset.
    pub peak_allocated_bytes: u64,
    /// Bytes held by the allocator: live plus retired-but-not-reclaimed.
    pub reserved_bytes: u64,
    /// The device's capacity.
    pub total_bytes: u64,
    /// Successful allocations.
    pub num_allocations: u64,
    /// Successful deallocations.
    pub num_frees: u64,
    /// Allocations refused for lack of memory.
    pub num_ooms: u64,
}

impl MemoryStats {
    /// The ABI form, with `struct_size` set for ABI 1.0.
    pub fn to_ffi(&self) -> TFL_MemoryStats {
        TFL_MemoryStats {
            struct_size: torchfl_ffi::struct_size!(TFL_MemoryStats, num_ooms),
            allocated_bytes: self.allocated_bytes,
            peak_allocated_bytes: self.peak_allocated_bytes,
            reserved_bytes: self.reserved_bytes,
            total_bytes: self.total_bytes,
            num_allocations: self.num_allocations,
            num_frees: self.num_frees,
            num_ooms: self.num_ooms,
        }
    }
}

/// One host allocation. Owns `layout.size()` bytes at the address it is
/// keyed by; freed exactly once, by [`Block::release`].
#[derive(Debug)]
struct Block {
    /// Bytes requested (and accounted); may be 0.
    size: usize,
    layout: Layout,
}

impl Block {
    /// Returns the block's memory to the host heap.
    ///
    /// # Safety
    /// `addr` must be the address this block was allocated at, and nothing
    /// may access the memory afterwards.
    unsafe fn release(self, addr: usize) {
        // SAFETY: the caller guarantees `addr` came from `alloc_zeroed` with
        // `self.layout` and is released only once.
        unsafe { alloc::dealloc(addr as *mut u8, self.layout) }
    }
}

#[derive(Debug)]
struct Retired {
    addr: usize,
    block: Block,
    fences: Vec<Fence>,
}

#[derive(Debug, Default)]
struct State {
    /// Live blocks by real address.
    live: BTreeMap<usize, Block>,
    /// Blocks freed by the host whose last users may still be queued.
    retired: Vec<Retired>,
    stats: MemoryStats,
}

impl State {
    /// Reclaims retired blocks whose fences have all completed.
    fn sweep(&mut self) {
        let mut i = 0;
        while i < self.retired.len() {
            if self.retired[i].fences.iter().all(Fence::is_complete) {
                let r = self.retired.swap_remove(i);
                self.stats.reserved_bytes -= r.block.size as u64;
                // SAFETY: the block was removed from `live` when it was
                // retired, so no new work can reference it, and every stream
                // that had work queued at that time has since passed its
                // fence: nothing can access the memory any more.
                unsafe { r.block.release(r.addr) };
            } else {
                i += 1;
            }
        }
    }
}

/// Identifies allocators process-wide; never reused, so a thread's memory
/// of a dropped allocator's blocks can never match a later allocator.
static NEXT_ALLOCATOR: AtomicU64 = AtomicU64::new(1);

/// A live block a thread resolved recently (see "Range checks" above).
#[derive(Debug, Clone, Copy)]
struct RecentBlock {
    /// [`DeviceMemory::id`]; 0 for an empty slot.
    allocator: u64,
    /// The allocator's generation when the block was seen live.
    generation: u64,
    base: usize,
    size: usize,
}

/// How many blocks each thread remembers (the inputs and output of a
/// typical kernel, plus one).
const RECENT_BLOCKS: usize = 4;

thread_local! {
    static RECENT: [Cell<RecentBlock>; RECENT_BLOCKS] = const {
        [const { Cell::new(RecentBlock { allocator: 0, generation: 0, base: 0, size: 0 }) }; RECENT_BLOCKS]
    };
    /// The slot the next remembered block replaces.
    static RECENT_NEXT: Cell<usize> = const { Cell::new(0) };
}

/// The allocator of one device.
#[derive(Debug)]
pub(crate) struct DeviceMemory {
    /// Unique across the process (from [`NEXT_ALLOCATOR`]).
    id: u64,
    device: usize,
    capacity: u64,
    /// 0 when not strict.
    tag: u64,
    /// Bumped under the `state` lock when a block leaves `live`, before its
    /// memory can be released.
    generation: AtomicU64,
    state: Mutex<State>,
}

impl DeviceMemory {
    pub(crate) fn new(device: usize, capacity: u64, strict: bool) -> Self {
        let stats = MemoryStats { total_bytes: capacity, ..MemoryStats::default() };
        Self {
            id: NEXT_ALLOCATOR.fetch_add(1, Ordering::Relaxed),
            device,
            capacity,
            tag: if strict { strict_tag(device) } else { 0 },
            generation: AtomicU64::new(0),
            state: Mutex::new(State { stats, ..State::default() }),
        }
    }

    /// Allocates `nbytes` (0 allowed) and returns the host-visible pointer.
    ///
    /// Before refusing for lack of capacity, waits for the retired blocks'
    /// fences and reclaims them; `num_ooms` counts only final refusals.
    pub(crate) fn allocate(&self, nbytes: usize) -> Result<u64> {
        let mut waited = false;
        loop {
            let mut st = lock(&self.state);
            st.sweep();
            let fits = st.stats.reserved_bytes.checked_add(nbytes as u64).is_some_and(|r| r <= self.capacity);
            if fits {
                return self.allocate_locked(&mut st, nbytes);
            }
            if waited || st.retired.is_empty() {
                st.stats.num_ooms += 1;
                return Err(Error::out_of_memory(format!(
                    "sim: device {} out of memory: tried to allocate {} bytes with {} bytes \
                     allocated ({} reserved) of {} bytes capacity",
                    self.device, nbytes, st.stats.allocated_bytes, st.stats.reserved_bytes, self.capacity
                )));
            }
            // Waiting must not hold the lock: other threads keep allocating.
            let fences: Vec<Fence> = st.retired.iter().flat_map(|r| r.fences.iter().cloned()).collect();
            drop(st);
            fences.iter().for_each(Fence::wait);
            waited = true;
        }
    }

    fn allocate_locked(&self, st: &mut State, nbytes: usize) -> Result<u64> {
        let layout = Layout::from_size_align(nbytes.max(1), ALIGNMENT).map_err(|_| {
            Error::out_of_memory(format!(
                "sim: device {}: {} bytes is not a valid allocation size",
                self.device, nbytes
            ))
        })?;
        // SAFETY: `layout` has a non-zero size. Zeroed memory keeps reads of
        // never-written device memory (`torch.empty`) defined.
        let addr = unsafe { alloc::alloc_zeroed(layout) } as usize;
        if addr == 0 {
            st.stats.num_ooms += 1;
            return Err(Error::out_of_memory(format!(
                "sim: device {}: the host could not provide {} bytes",
                self.device, nbytes
            )));
        }
        if self.tag != 0 && (addr as u64 + layout.size() as u64) & HIGH_MASK != 0 {
            // SAFETY: just allocated with `layout`, not yet shared.
            unsafe { alloc::dealloc(addr as *mut u8, layout) };
            return Err(Error::internal(
                "sim: strict mode needs host addresses below 2^48, but the host heap returned a \
                 higher one; run without TORCH_FL_SIM_STRICT",
            ));
        }
        st.live.insert(addr, Block { size: nbytes, layout });
        let s = &mut st.stats;
        s.allocated_bytes += nbytes as u64;
        s.reserved_bytes += nbytes as u64;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
        s.num_allocations += 1;
        Ok(addr as u64 + self.tag)
    }

    /// Retires the block at `ptr`; it is reclaimed once every fence in
    /// `fences` (a snapshot of unfinished work at the time of the call) has
    /// completed.
    pub(crate) fn deallocate(&self, ptr: u64, fences: Vec<Fence>) -> Result<()> {
        let addr = self.untag(ptr, &"deallocate")?;
        let mut st = lock(&self.state);
        let Some(block) = st.live.remove(&addr) else {
            return Err(Error::invalid(format!(
                "sim: deallocate: {ptr:#x} is not a live allocation of device {} (never \
                 allocated there, already freed, or not the start of an allocation)",
                self.device
            )));
        };
        // Forget every thread's remembered blocks before this one can be
        // released (below or by a later sweep), while still under the lock.
        self.generation.fetch_add(1, Ordering::SeqCst);
        let s = &mut st.stats;
        s.allocated_bytes -= block.size as u64;
        s.num_frees += 1;
        let fences: Vec<Fence> = fences.into_iter().filter(|f| !f.is_complete()).collect();
        if fences.is_empty() {
            st.stats.reserved_bytes -= block.size as u64;
            // SAFETY: removed from `live` above so no new work can use it,
            // and no stream had unfinished work, so nothing is using it.
            unsafe { block.release(addr) };
        } else {
            st.retired.push(Retired { addr, block, fences });
        }
        st.sweep();
        Ok(())
    }

    /// Reclaims retired blocks whose work has completed.
    pub(crate) fn sweep(&self) {
        lock(&self.state).sweep();
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        let mut st = lock(&self.state);
        st.sweep();
        st.stats
    }

    pub(crate) fn reset_peak(&self) {
        let mut st = lock(&self.state);
        st.stats.peak_allocated_bytes = st.stats.allocated_bytes;
    }

    /// Checks that `ptr` is this device's (tag included) and removes the tag.
    fn untag(&self, ptr: u64, what: &dyn fmt::Display) -> Result<usize> {
        if self.tag == 0 {
            return Ok(ptr as usize);
        }
        if ptr & !TAG_MASK & HIGH_MASK == 0 && ptr & TAG_MASK == self.tag {
            return Ok((ptr - self.tag) as usize);
        }
        Err(Error::invalid(match tagged_device(ptr) {
            Some(other) => {
                format!("sim: {what}: pointer {ptr:#x} belongs to device {other}, not device {}", self.device)
            }
            None => format!(
                "sim: {what}: {ptr:#x} is not a device pointer of device {} (strict mode: \
                 device pointers carry tag {:#x} in bits 48..55)",
                self.device,
                self.tag >> TAG_SHIFT
            ),
        }))
    }

    /// Resolves the byte range `[ptr + lo, ptr + hi)` (offsets may be
    /// negative) to a real address of `ptr`, checking that the whole range
    /// lies inside one live allocation of this device. `lo == hi` (an empty
    /// range) still requires `ptr` to point into or at the end of a block.
    pub(crate) fn resolve(&self, ptr: u64, lo: i128, hi: i128, what: &dyn fmt::Display) -> Result<usize> {
        let addr = self.untag(ptr, what)?;
        let start = addr as i128 + lo;
        let end = addr as i128 + hi;
        if self.recently_live(start, end) {
            return Ok(addr);
        }
        let st = lock(&self.state);
        // Read under the lock: consistent with `live` as seen here.
        let generation = self.generation.load(Ordering::SeqCst);
        let found = usize::try_from(start).ok().and_then(|s| {
            let (&base, block) = st.live.range(..=s).next_back()?;
            let within = end <= base as i128 + block.size as i128 && start <= end;
            within.then_some((base, block.size))
        });
        if let Some((base, size)) = found {
            self.remember(generation, base, size);
            return Ok(addr);
        }
        let owner = if st
            .live
            .range(..=addr)
            .next_back()
            .is_some_and(|(&b, blk)| addr >= b && addr <= b + blk.size)
        {
            "lies partly outside its allocation"
        } else {
            "is not inside a live allocation"
        };
        Err(Error::invalid(format!(
            "sim: {what}: the range [{:#x}, {:#x}) {owner} of device {}",
            (ptr as i128 + lo),
            (ptr as i128 + hi),
            self.device
        )))
    }

    /// Whether `[start, end)` lies in a block this thread resolved while the
    /// allocator was at its current generation, i.e. a block still live.
    fn recently_live(&self, start: i128, end: i128) -> bool {
        if start > end {
            return false;
        }
        let generation = self.generation.load(Ordering::SeqCst);
        RECENT.with(|recent| {
            recent.iter().any(|slot| {
                let b = slot.get();
                b.allocator == self.id
                    && b.generation == generation
                    && start >= b.base as i128
                    && end <= b.base as i128 + b.size as i128
            })
        })
    }

    /// Remembers that `[base, base + size)` was live at `generation`.
    fn remember(&self, generation: u64, base: usize, size: usize) {
        let block = RecentBlock { allocator: self.id, generation, base, size };
        let i = RECENT_NEXT.with(|next| {
            let i = next.get() % RECENT_BLOCKS;
            next.set(i + 1);
            i
        });
        RECENT.with(|recent| recent[i].set(block));
    }

    /// Whether `ptr` (tag removed if strict) starts or lies in a live block
    /// of this device; used to name the owner in error messages.
    pub(crate) fn owns(&self, ptr: u64) -> bool {
        let Ok(addr) = self.untag(ptr, &"") else {
            return false;
        };
        let st = lock(&self.state);
        st.live.range(..=addr).next_back().is_some_and(|(&b, blk)| addr < b + blk.size.max(1))
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // The runtime drains every stream before dropping its devices, so no
        // work can still reference these blocks.
        let st = self.state.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (addr, block) in std::mem::take(&mut st.live) {
            // SAFETY: owned by this allocator; nothing runs any more.
            unsafe { block.release(addr) };
        }
        for r in std::mem::take(&mut st.retired) {
            // SAFETY: as above.
            unsafe { r.block.release(r.addr) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn accounting_peak_and_oom() {
        let m = DeviceMemory::new(0, 1000, false);
        let a = m.allocate(600).unwrap();
        assert_eq!(a % ALIGNMENT as u64, 0);
        let e = m.allocate(500).unwrap_err();
        assert_eq!(e.code(), ErrorCode::OutOfMemory);
        for part in ["500", "600", "1000"] {
            assert!(e.message().contains(part), "{}", e.message());
        }
        let b = m.allocate(400).unwrap();
        m.deallocate(a, Vec::new()).unwrap();
        let s = m.stats();
        assert_eq!(s.allocated_bytes, 400);
        assert_eq!(s.reserved_bytes, 400);
        assert_eq!(s.peak_allocated_bytes, 1000);
        assert_eq!((s.num_allocations, s.num_frees, s.num_ooms), (2, 1, 1));
        m.reset_peak();
        assert_eq!(m.stats().peak_allocated_bytes, 400);
        m.deallocate(b, Vec::new()).unwrap();
        assert!(m.deallocate(b, Vec::new()).is_err(), "double free");
    }

    #[test]
    fn zero_byte_allocations_are_unique() {
        let m = DeviceMemory::new(0, 10, false);
        let a = m.allocate(0).unwrap();
        let b = m.allocate(0).unwrap();
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!(m.stats().allocated_bytes, 0);
        m.deallocate(a, Vec::new()).unwrap();
        m.deallocate(b, Vec::new()).unwrap();
    }

    #[test]
    fn remembered_blocks_are_forgotten_when_freed() {
        let m = DeviceMemory::new(0, 1 << 20, false);
        let p = m.allocate(64).unwrap();
        let q = m.allocate(32).unwrap();
        assert!(m.resolve(p, 0, 64, &"t").is_ok());
        assert!(m.resolve(q, 0, 32, &"t").is_ok());
        assert!(m.resolve(p, 16, 64, &"t").is_ok(), "remembered");
        assert!(m.resolve(p, 0, 65, &"t").is_err(), "a remembered block still bounds the range");
        assert!(m.resolve(p, 8, 4, &"t").is_err(), "reversed ranges are refused");
        assert!(m.resolve(p, -1, 4, &"t").is_err());
        m.deallocate(p, Vec::new()).unwrap();
        let e = m.resolve(p, 0, 64, &"t").unwrap_err();
        assert!(e.message().contains("is not inside a live allocation"), "{}", e.message());
        assert!(m.resolve(q, 0, 32, &"t").is_ok(), "other blocks are looked up again");
        let other = DeviceMemory::new(0, 1 << 20, false);
        assert!(other.resolve(q, 0, 32, &"t").is_err(), "memories are per allocator");
        m.deallocate(q, Vec::new()).unwrap();
        assert!(m.resolve(q, 0, 1, &"t").is_err());
    }

    #[test]
    fn strict_tags_and_ranges() {
        let m = DeviceMemory::new(1, 1 << 20, true);
        let p = m.allocate(256).unwrap();
        assert_eq!(p & TAG_MASK, strict_tag(1));
        assert_eq!(tagged_device(p), Some(1));
        assert!(m.resolve(p + 128, 0, 128, &"t").is_ok());
        assert!(m.resolve(p + 128, 0, 129, &"t").is_err());
        assert!(m.resolve(p, -1, 4, &"t").is_err());
        let e = m.resolve(p - strict_tag(1), 0, 4, &"t").unwrap_err();
        assert!(e.message().contains("tag"), "{}", e.message());
        let other = DeviceMemory::new(0, 1 << 20, true);
        let e = other.resolve(p, 0, 4, &"copy").unwrap_err();
        assert!(e.message().contains("belongs to device 1"), "{}", e.message());
        m.deallocate(p, Vec::new()).unwrap();
    }
}

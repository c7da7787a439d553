//! Device memory: real host allocations with device semantics.
//!
//! Each device owns an allocator that hands out 64-byte aligned, zeroed
//! blocks from the host heap and accounts them against the configured
//! capacity, so out-of-memory errors, peaks and statistics behave like a real
//! device's while the memory itself is obtained on demand.
//!
//! # Stream-ordered free
//!
//! The host may free a buffer that queued work still reads (PyTorch frees a
//! temporary as soon as the Python expression is done, long before the
//! stream ran the kernel). `deallocate` therefore only *retires* a block: it
//! records fences on every stream that had unfinished work at the time of
//! the call, and the block becomes reusable once all of them have
//! completed. This is what makes device memory that kernels use outlive the
//! call frames that described it without any reference counting.
//!
//! Retired blocks wait in a first-in, first-out queue. Its order is also
//! the order of completion: a later retirement's fences cover every stream
//! an earlier one had to wait for, at the same or a later point, because
//! the snapshots are taken under the allocator's lock, in queue order, and
//! a stream's counters only grow. Sweeping therefore looks only at the
//! front of the queue, however far the streams lag behind the host.
//!
//! Sweeping reads the streams' progress, a cache line the stream's worker
//! writes per job, so it costs a cache miss per look. An allocation
//! therefore sweeps only when the cache has no block of its size *and* the
//! queue has grown to [`SWEEP_BLOCKS`] blocks or [`SWEEP_BYTES`] bytes (or
//! the allocation would not fit otherwise): a host launching small kernels
//! then reclaims a batch of blocks per look. Statistics queries,
//! `empty_cache` and every synchronize sweep as well.
//!
//! # Cache
//!
//! A reclaimed block is not given back to the host heap but cached, by
//! size: the next allocation of the same size reuses it (eager PyTorch
//! allocates the same few sizes over and over), which costs neither a heap
//! allocation nor a free of memory another thread (the stream's worker) has
//! just written. A reused block is not zeroed: like any device's memory, it
//! holds what was last written there, but never uninitialized bytes. The
//! cache is emptied by `empty_cache`, and by an allocation that would not
//! fit otherwise, before it waits for retired blocks or fails; it holds at
//! most [`CACHE_LIMIT`] bytes (more freed memory goes back to the heap).
//!
//! Accounting: `allocated` drops at `deallocate` (the host no longer owns the
//! block), while `reserved` keeps counting retired and cached blocks until
//! they are given back to the host heap (the plugin still holds them). The
//! capacity limit applies to `reserved`, i.e. to what is really held.
//!
//! # Range checks
//!
//! Every kernel launch checks each tensor's extent against the live blocks
//! ([`DeviceMemory::resolve`]). To keep that off the allocator's lock, each
//! thread remembers the last few blocks it allocated or resolved, together
//! with the *generation* of the block's address: the allocator keeps
//! [`GENERATION_STRIPES`] counters, and freeing a block bumps the counter
//! its address hashes to (under the lock, before the block can be reused or
//! released). A remembered block whose counter has not moved since is
//! therefore still live with the same size, and a range inside it passes
//! without locking; anything else takes the locked path, which refreshes
//! the memory. Striping keeps the frees of a kernel's temporaries from
//! invalidating every thread's memory of its long-lived inputs.
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
//!
//! # One module
//!
//! The allocator, the stream-ordered free, the cache and the range checks
//! stay together although the file is long (mostly its unit tests): they
//! share one lock and the invariants kept under it (a freed block leaves
//! `live`, has its generation bumped and is retired or cached in one
//! critical section), which separate files would only spread apart.

use std::alloc::{self, Layout};
use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use torchfl_ffi::TFL_MemoryStats;

use crate::error::{Error, Result};
use crate::runtime::stream::{lock, Fence};

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

/// Per-device statistics: the ABI's `TFL_MemoryStats`, whose fields are
/// defined once in `torchfl-ffi`. The runtime's own figures leave
/// `struct_size` 0; `memory_stats` copies the fields the caller's size
/// covers.
pub type MemoryStats = TFL_MemoryStats;

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
    /// Unfinished work at the time of the free; never empty (a block
    /// without any is cached at once).
    fences: Vec<Fence>,
}

/// Emptied fence lists kept for reuse, at most: enough for a host running
/// that many frees ahead of its streams without allocating.
const SPARE_FENCE_LISTS: usize = 1024;

/// Bytes the cache holds at most: a freed block that would take it past
/// this goes back to the host heap at once. The simulator's device memory
/// is the host's, so it does not keep much of it that no tensor uses.
const CACHE_LIMIT: u64 = 256 << 20;

/// Retired blocks that make an allocation without a cached block of its
/// size sweep first (see "Stream-ordered free").
const SWEEP_BLOCKS: usize = 8;
/// Retired bytes that make an allocation without a cached block of its
/// size sweep first.
const SWEEP_BYTES: u64 = 1 << 20;

#[derive(Debug, Default)]
struct State {
    /// Live blocks by real address.
    live: BTreeMap<usize, Block>,
    /// Blocks freed by the host whose last users may still be queued, in
    /// the order they were freed (which is the order they become free; see
    /// "Stream-ordered free").
    retired: VecDeque<Retired>,
    /// Bytes in `retired`.
    retired_bytes: u64,
    /// Free blocks by size: (address, block), most recently freed last;
    /// lists may be empty.
    cached: BTreeMap<usize, Vec<(usize, Block)>>,
    /// Bytes in `cached`.
    cached_bytes: u64,
    /// Emptied `Retired::fences` lists, reused by later frees.
    spare_fences: Vec<Vec<Fence>>,
    stats: MemoryStats,
    /// Blocks taken from the host heap (not from the cache) so far: what a
    /// self-caching plugin's pool pays the allocation latency for.
    heap_allocations: u64,
}

impl State {
    /// Caches retired blocks whose fences have all completed: those at the
    /// front of the queue.
    fn sweep(&mut self) {
        while let Some(front) = self.retired.front() {
            if !front.fences.iter().all(Fence::is_complete) {
                break;
            }
            let Some(Retired { addr, block, mut fences }) = self.retired.pop_front() else {
                break;
            };
            self.retired_bytes -= block.size as u64;
            // The block was removed from `live` when it was retired, so no
            // new work can reference it, and every stream that had work
            // queued at that time has since passed its fence: nothing can
            // access the memory any more, and it may be handed out again.
            self.cache(addr, block);
            fences.clear();
            if self.spare_fences.len() < SPARE_FENCE_LISTS {
                self.spare_fences.push(fences);
            }
        }
    }

    /// Keeps a block nothing uses any more for reuse, or gives it back to
    /// the host heap if the cache is full.
    fn cache(&mut self, addr: usize, block: Block) {
        if self.cached_bytes + block.size as u64 > CACHE_LIMIT {
            self.stats.reserved_bytes -= block.size as u64;
            // SAFETY: the caller passes a block that is neither live nor
            // retired: nothing references it.
            unsafe { block.release(addr) };
            return;
        }
        self.cached_bytes += block.size as u64;
        self.cached.entry(block.size).or_default().push((addr, block));
    }

    /// A cached block of exactly `size` bytes, if there is one.
    fn take_cached(&mut self, size: usize) -> Option<(usize, Block)> {
        // An emptied list stays (with its capacity) until the cache is
        // released: sizes come back, and the list then costs no allocation.
        let found = self.cached.get_mut(&size)?.pop()?;
        self.cached_bytes -= size as u64;
        Some(found)
    }

    /// Gives every cached block back to the host heap.
    fn release_cached(&mut self) {
        for (_, blocks) in std::mem::take(&mut self.cached) {
            for (addr, block) in blocks {
                self.stats.reserved_bytes -= block.size as u64;
                // SAFETY: cached blocks are neither live nor retired:
                // nothing references them (see `sweep` and `deallocate`).
                unsafe { block.release(addr) };
            }
        }
        self.cached_bytes = 0;
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

/// How many blocks each thread remembers (the inputs and output of a few
/// kernels).
const RECENT_BLOCKS: usize = 8;

/// Generation counters per allocator (a power of two; see "Range checks").
pub(crate) const GENERATION_STRIPES: usize = 64;

/// The generation counter of the block at `base`.
fn stripe(base: usize) -> usize {
    // Blocks are 64-byte aligned: hash the bits above (Fibonacci hashing).
    let mixed = ((base as u64) >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> (64 - GENERATION_STRIPES.trailing_zeros())) as usize
}

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
    /// [`stripe`]`(base)` is bumped under the `state` lock when the block
    /// at `base` leaves `live`, before it can be reused or released.
    generations: [AtomicU64; GENERATION_STRIPES],
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
            generations: [const { AtomicU64::new(0) }; GENERATION_STRIPES],
            state: Mutex::new(State { stats, ..State::default() }),
        }
    }

    /// Allocates `nbytes` (0 allowed) and returns the host-visible pointer.
    ///
    /// Reuses a cached block of the same size if there is one (sweeping
    /// first if enough blocks are retired). Before refusing for lack of
    /// capacity, gives the cache back to the host heap, then waits for the
    /// retired blocks' fences and reclaims them; `num_ooms` counts only
    /// final refusals.
    pub(crate) fn allocate(&self, nbytes: usize) -> Result<u64> {
        let mut waited = false;
        loop {
            let mut st = lock(&self.state);
            if let Some((addr, block)) = st.take_cached(nbytes) {
                return Ok(self.hand_out(&mut st, addr, block));
            }
            let fits = |st: &State| {
                st.stats.reserved_bytes.checked_add(nbytes as u64).is_some_and(|r| r <= self.capacity)
            };
            if st.retired.len() >= SWEEP_BLOCKS || st.retired_bytes >= SWEEP_BYTES || !fits(&st) {
                st.sweep();
                if let Some((addr, block)) = st.take_cached(nbytes) {
                    return Ok(self.hand_out(&mut st, addr, block));
                }
            }
            if !fits(&st) && st.cached_bytes > 0 {
                st.release_cached();
            }
            if fits(&st) {
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
        st.stats.reserved_bytes += nbytes as u64;
        st.heap_allocations += 1;
        Ok(self.hand_out(st, addr, Block { size: nbytes, layout }))
    }

    /// Makes `block` (new, or cached and unused) live, accounts it and
    /// returns its host-visible pointer.
    fn hand_out(&self, st: &mut State, addr: usize, block: Block) -> u64 {
        let size = block.size;
        st.live.insert(addr, block);
        // The allocating thread is usually the one that launches work on
        // the block next.
        self.remember(self.generation(addr), addr, size);
        let s = &mut st.stats;
        s.allocated_bytes += size as u64;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
        s.num_allocations += 1;
        addr as u64 + self.tag
    }

    /// Retires the block at `ptr`; it is reused once every fence that
    /// `snapshot` adds (the unfinished work at the time of the call) has
    /// completed. `snapshot` runs under the allocator's lock (which keeps
    /// the retired queue in completion order) and receives an empty list.
    pub(crate) fn deallocate(&self, ptr: u64, snapshot: impl FnOnce(&mut Vec<Fence>)) -> Result<()> {
        let addr = self.untag(ptr, &"deallocate")?;
        let mut st = lock(&self.state);
        let Some(block) = st.live.remove(&addr) else {
            return Err(Error::invalid(format!(
                "sim: deallocate: {ptr:#x} is not a live allocation of device {} (never \
                 allocated there, already freed, or not the start of an allocation)",
                self.device
            )));
        };
        // Forget every thread's memory of this block before it can be
        // reused or released (below or later), while still under the lock.
        self.generations[stripe(addr)].fetch_add(1, Ordering::SeqCst);
        let s = &mut st.stats;
        s.allocated_bytes -= block.size as u64;
        s.num_frees += 1;
        let mut fences = st.spare_fences.pop().unwrap_or_default();
        snapshot(&mut fences);
        // Not filtered for fences that have completed meanwhile, nor swept
        // here: that reads the streams' progress, which the next allocation
        // (or synchronize) does anyway.
        if fences.is_empty() {
            // Removed from `live` above so no new work can use it, and no
            // stream has unfinished work, so nothing is using it.
            st.cache(addr, block);
            st.spare_fences.push(fences);
        } else {
            st.retired_bytes += block.size as u64;
            st.retired.push_back(Retired { addr, block, fences });
        }
        Ok(())
    }

    /// How many blocks came from the host heap rather than the cache.
    pub(crate) fn heap_allocations(&self) -> u64 {
        lock(&self.state).heap_allocations
    }

    /// Reclaims retired blocks whose work has completed (into the cache).
    pub(crate) fn sweep(&self) {
        lock(&self.state).sweep();
    }

    /// Reclaims what it can, then gives every cached block back to the
    /// host heap.
    pub(crate) fn empty_cache(&self) {
        let mut st = lock(&self.state);
        st.sweep();
        st.release_cached();
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
        let found = usize::try_from(start).ok().and_then(|s| {
            let (&base, block) = st.live.range(..=s).next_back()?;
            let within = end <= base as i128 + block.size as i128 && start <= end;
            within.then_some((base, block.size))
        });
        if let Some((base, size)) = found {
            // Read under the lock: consistent with `live` as seen here.
            self.remember(self.generation(base), base, size);
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

    /// The current generation of the block at `base`.
    fn generation(&self, base: usize) -> u64 {
        self.generations[stripe(base)].load(Ordering::SeqCst)
    }

    /// Whether `[start, end)` lies in a block this thread remembered and
    /// whose generation has not moved since, i.e. a block still live.
    fn recently_live(&self, start: i128, end: i128) -> bool {
        if start > end {
            return false;
        }
        RECENT.with(|recent| {
            recent.iter().any(|slot| {
                let b = slot.get();
                b.allocator == self.id
                    && start >= b.base as i128
                    && end <= b.base as i128 + b.size as i128
                    && b.generation == self.generation(b.base)
            })
        })
    }

    /// Remembers that `[base, base + size)` was live at `generation`, in
    /// place of an empty slot, of an older memory of the same block or of
    /// a block of this allocator freed since, or else of the oldest slot.
    fn remember(&self, generation: u64, base: usize, size: usize) {
        let block = RecentBlock { allocator: self.id, generation, base, size };
        RECENT.with(|recent| {
            let free = recent.iter().position(|slot| {
                let b = slot.get();
                b.allocator == 0
                    || (b.allocator == self.id && (b.base == base || b.generation != self.generation(b.base)))
            });
            let i = free.unwrap_or_else(|| {
                RECENT_NEXT.with(|next| {
                    let i = next.get() % RECENT_BLOCKS;
                    next.set(i + 1);
                    i
                })
            });
            recent[i].set(block);
        });
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
        st.release_cached();
    }
}

#[cfg(test)]
mod tests;

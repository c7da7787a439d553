//! Page-locked ("pinned") host memory (ABI 1.4 `host_allocate` /
//! `host_deallocate`) and the cost model's charging points.
//!
//! The simulator's pinned memory is ordinary heap memory: what makes it
//! pinned is that the runtime remembers its ranges, so a copy can tell
//! whether its host side lies in pinned memory and charge the pinned or the
//! pageable bandwidth (see [`super::cost`]).

use std::alloc::{self, Layout};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{Device, Runtime};
use crate::error::{Error, Result};
use crate::runtime::cost::{self, CostModel};
use crate::runtime::memory::ALIGNMENT;
use crate::runtime::stream::lock;

/// Counters of the pinned host memory and of the copies the cost model
/// charged, for tests and debugging (`torch_fl_sim_debug_host_memory`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostMemoryStats {
    /// `host_allocate` calls that succeeded.
    pub allocations: u64,
    /// `host_deallocate` calls that released a block.
    pub frees: u64,
    /// Bytes in live pinned blocks.
    pub live_bytes: u64,
    /// Host copies charged at pinned bandwidth (counted only while a cost
    /// model is on: telling them apart costs a lookup).
    pub pinned_copies: u64,
    /// Host copies charged at pageable bandwidth (likewise).
    pub pageable_copies: u64,
}

/// The live pinned blocks, by address.
#[derive(Debug, Default)]
pub(crate) struct PinnedRegistry {
    blocks: Mutex<BTreeMap<usize, Layout>>,
    allocations: AtomicU64,
    frees: AtomicU64,
    pinned_copies: AtomicU64,
    pageable_copies: AtomicU64,
}

impl PinnedRegistry {
    /// Whether `[addr, addr + len)` lies in one pinned block.
    pub(crate) fn contains(&self, addr: usize, len: usize) -> bool {
        let blocks = lock(&self.blocks);
        blocks.range(..=addr).next_back().is_some_and(|(&base, layout)| {
            addr.checked_add(len).is_some_and(|end| end <= base + layout.size())
        })
    }
}

impl Drop for PinnedRegistry {
    fn drop(&mut self) {
        let blocks = std::mem::take(self.blocks.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner));
        for (addr, layout) in blocks {
            // SAFETY: allocated with `layout` by `host_allocate` and not yet
            // released; the host cannot use a runtime's memory after the
            // runtime is gone.
            unsafe { alloc::dealloc(addr as *mut u8, layout) };
        }
    }
}

impl Runtime {
    /// Allocates `nbytes` of pinned host memory (0 allowed: a unique
    /// block), 64-byte aligned; returns its address.
    pub fn host_allocate(&self, nbytes: usize) -> Result<u64> {
        let layout = Layout::from_size_align(nbytes.max(1), ALIGNMENT).map_err(|_| {
            Error::out_of_memory(format!("sim: host_allocate: {nbytes} bytes is not a valid allocation size"))
        })?;
        // SAFETY: `layout` has a non-zero size.
        let addr = unsafe { alloc::alloc(layout) } as usize;
        if addr == 0 {
            return Err(Error::out_of_memory(format!(
                "sim: host_allocate: the host could not provide {nbytes} bytes of pinned memory"
            )));
        }
        lock(&self.pinned.blocks).insert(addr, layout);
        self.pinned.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(addr as u64)
    }

    /// Releases a block from [`Runtime::host_allocate`] at once (not
    /// stream-ordered); 0 is a no-op.
    pub fn host_deallocate(&self, ptr: u64) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let layout = lock(&self.pinned.blocks).remove(&(ptr as usize)).ok_or_else(|| {
            Error::invalid(format!("sim: host_deallocate: {ptr:#x} is not a block from host_allocate"))
        })?;
        // SAFETY: allocated with `layout` by `host_allocate`, removed from
        // the registry above, so released exactly once.
        unsafe { alloc::dealloc(ptr as usize as *mut u8, layout) };
        self.pinned.frees.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `[addr, addr + len)` lies in one pinned block.
    pub fn is_pinned(&self, addr: u64, len: usize) -> bool {
        self.pinned.contains(addr as usize, len)
    }

    /// The pinned-memory and copy counters.
    pub fn host_memory_stats(&self) -> HostMemoryStats {
        let live_bytes = lock(&self.pinned.blocks).values().map(|l| l.size() as u64).sum();
        HostMemoryStats {
            allocations: self.pinned.allocations.load(Ordering::Relaxed),
            frees: self.pinned.frees.load(Ordering::Relaxed),
            live_bytes,
            pinned_copies: self.pinned.pinned_copies.load(Ordering::Relaxed),
            pageable_copies: self.pinned.pageable_copies.load(Ordering::Relaxed),
        }
    }

    // ------------------------------------------------------ cost charging

    /// Charges an `allocate` (before it) on the calling thread.
    pub(crate) fn charge_allocate(&self, cost: &CostModel, device: &Device) {
        if self.config.self_caching {
            return; // charged only on a pool miss, see `charge_pool_miss`
        }
        if cost.alloc_sync {
            self.drain_device(device);
        }
        cost::busy_wait(Duration::from_nanos(cost.alloc_latency_ns));
    }

    /// Charges a `deallocate` on the calling thread: a stream-ordered pool
    /// returns blocks for free.
    pub(crate) fn charge_deallocate(&self, cost: &CostModel, device: &Device) {
        if !self.config.self_caching {
            self.charge_allocate(cost, device);
        }
    }

    /// A self-caching plugin's pool grew: the driver allocation it makes.
    pub(crate) fn charge_pool_miss(cost: &CostModel) {
        cost::busy_wait(Duration::from_nanos(cost.alloc_latency_ns));
    }

    /// Charges one enqueue (launch, copy, memset) on the calling thread.
    #[inline]
    pub(crate) fn charge_launch(cost: &CostModel) {
        cost::busy_wait(Duration::from_nanos(cost.launch_latency_ns));
    }

    /// The device time of a host copy whose host side is `[host, host +
    /// nbytes)`, and whether it is pageable; counts it.
    pub(crate) fn host_copy_time(&self, cost: &CostModel, host: u64, nbytes: usize) -> (Duration, bool) {
        let pinned = self.is_pinned(host, nbytes);
        let counter = if pinned { &self.pinned.pinned_copies } else { &self.pinned.pageable_copies };
        counter.fetch_add(1, Ordering::Relaxed);
        (cost.copy_time(nbytes, pinned), !pinned)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Runtime};

    #[test]
    fn pinned_ranges_are_looked_up_by_interior_address() {
        let rt = Runtime::new(Config { devices: 1, ..Config::default() }).unwrap();
        let a = rt.host_allocate(1000).unwrap();
        let b = rt.host_allocate(0).unwrap();
        assert_ne!(a, b);
        assert_eq!(a % 64, 0);
        assert!(rt.is_pinned(a, 1000) && rt.is_pinned(a + 10, 990) && rt.is_pinned(b, 1));
        assert!(!rt.is_pinned(a + 10, 991), "runs past the block");
        assert!(!rt.is_pinned(a.wrapping_sub(1), 2), "starts before the block");
        let heap = [0u8; 64];
        assert!(!rt.is_pinned(heap.as_ptr() as u64, 64));
        let s = rt.host_memory_stats();
        assert_eq!((s.allocations, s.frees, s.live_bytes), (2, 0, 1001));
        rt.host_deallocate(a).unwrap();
        assert!(!rt.is_pinned(a, 1));
        rt.host_deallocate(0).unwrap();
        let e = rt.host_deallocate(a).unwrap_err();
        assert!(e.message().contains("not a block from host_allocate"), "{}", e.message());
        let s = rt.host_memory_stats();
        assert_eq!((s.allocations, s.frees, s.live_bytes), (2, 1, 1));
    }
}

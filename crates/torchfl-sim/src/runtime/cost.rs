//! The cost model: what real hardware charges for allocation, launches,
//! copies and compute, so that a host's performance work (caching,
//! asynchronous copies, overlap) shows on the simulator.
//!
//! Off by default: the simulator then charges nothing, and a [`Runtime`]
//! holds no [`CostModel`] at all, so each charging point costs one branch on
//! an `Option` (see `Runtime::cost`). The keys are documented in
//! [`super::config`]; the `pcie-gpu` preset is [`CostModel::PCIE_GPU`].
//!
//! Where each cost is charged, and why there:
//!
//! - **Allocation** (`alloc_latency_us`, `alloc_sync`): on the calling host
//!   thread, per `allocate` *and* per `deallocate`, as a busy wait (a driver
//!   call burns host CPU), after waiting for the device to go idle when
//!   `alloc_sync` is set (`cudaMalloc`/`cudaFree` synchronize the device).
//!   With `self_caching=1` the plugin behaves like a stream-ordered pool
//!   (`cudaMallocAsync`): only an allocation the pool cannot serve from its
//!   cache pays the latency, nothing synchronizes, and `deallocate` is free.
//! - **Launch** (`launch_latency_us`): on the host, per kernel launch, copy
//!   and memset enqueue.
//! - **Copies** (`copy_latency_us`, `pinned_gbps`, `pageable_gbps`): latency
//!   plus bytes over bandwidth, on the *device* timeline: the stream's worker
//!   waits, so the time overlaps with host work and with other streams. A
//!   host buffer from `host_allocate` moves at pinned bandwidth, any other at
//!   pageable bandwidth, and a pageable copy also blocks the calling thread
//!   until it has run (`cudaMemcpyAsync` from pageable memory is effectively
//!   synchronous). A device-to-device copy across devices moves at pinned
//!   bandwidth (peer traffic crosses the same bus); within one device it
//!   pays the launch latency only (device memory is far faster than PCIe).
//! - **Compute** (`compute_factor`): each kernel's device time is stretched
//!   by the factor (the worker waits `(factor - 1)` times what the kernel
//!   took), a slower chip.
//!
//! In `mode=sync` all work runs inline, so every cost lands on the calling
//! thread.
//!
//! [`Runtime`]: crate::Runtime

use std::time::{Duration, Instant};

/// Costs per operation. All-zero (with `compute_factor` 1) is "no cost".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Host time per `allocate` and per `deallocate`, in nanoseconds.
    pub alloc_latency_ns: u64,
    /// `allocate` and `deallocate` first wait for the device to go idle.
    pub alloc_sync: bool,
    /// Host time per kernel launch, copy or memset enqueue, in nanoseconds.
    pub launch_latency_ns: u64,
    /// Device time per copy on top of its transfer time, in nanoseconds.
    pub copy_latency_ns: u64,
    /// Host memory from `host_allocate` to or from the device, in bytes per
    /// second (0: no transfer cost).
    pub pinned_bytes_per_s: u64,
    /// Any other host memory to or from the device, in bytes per second (0:
    /// no transfer cost).
    pub pageable_bytes_per_s: u64,
    /// Multiplies each kernel's device time; `>= 1.0`.
    pub compute_factor: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        Self::OFF
    }
}

/// 1 GB/s in bytes per second (decimal, as bus bandwidths are quoted).
const GBPS: u64 = 1_000_000_000;

impl CostModel {
    /// No cost anywhere (the default).
    pub const OFF: Self = Self {
        alloc_latency_ns: 0,
        alloc_sync: false,
        launch_latency_ns: 0,
        copy_latency_ns: 0,
        pinned_bytes_per_s: 0,
        pageable_bytes_per_s: 0,
        compute_factor: 1.0,
    };

    /// A discrete GPU on PCIe 4.0 x16 (`cost_model=pcie-gpu`), with figures
    /// of the order measured on such systems:
    ///
    /// - allocation 100 µs, synchronizing: `cudaMalloc`/`cudaFree` of
    ///   tensor-sized blocks take tens to hundreds of microseconds and
    ///   synchronize the device, which is why PyTorch caches;
    /// - launch 5 µs: a kernel launch through the driver costs 2 to 10 µs of
    ///   host time;
    /// - copy latency 10 µs: a small `cudaMemcpyAsync` completes in about
    ///   that (DMA setup and completion);
    /// - pinned 20 GB/s: PCIe 4.0 x16 carries about 25 GB/s raw, 20 to 24 in
    ///   practice from page-locked memory;
    /// - pageable 6 GB/s: pageable copies are staged through a driver bounce
    ///   buffer and typically reach a quarter to a third of pinned speed;
    /// - compute factor 1: the simulator's kernels already run at host-CPU
    ///   speed, slower than such a GPU, so no stretching is added.
    pub const PCIE_GPU: Self = Self {
        alloc_latency_ns: 100_000,
        alloc_sync: true,
        launch_latency_ns: 5_000,
        copy_latency_ns: 10_000,
        pinned_bytes_per_s: 20 * GBPS,
        pageable_bytes_per_s: 6 * GBPS,
        compute_factor: 1.0,
    };

    /// Whether nothing is charged anywhere.
    pub fn is_off(&self) -> bool {
        self.alloc_latency_ns == 0
            && !self.alloc_sync
            && self.launch_latency_ns == 0
            && self.copy_latency_ns == 0
            && self.pinned_bytes_per_s == 0
            && self.pageable_bytes_per_s == 0
            && self.compute_factor <= 1.0
    }

    /// Device time of a host copy of `nbytes`.
    pub fn copy_time(&self, nbytes: usize, pinned: bool) -> Duration {
        let rate = if pinned { self.pinned_bytes_per_s } else { self.pageable_bytes_per_s };
        Duration::from_nanos(self.copy_latency_ns) + transfer_time(nbytes, rate)
    }

    /// Device time of a device-to-device copy of `nbytes`: across devices
    /// it crosses the bus like pinned memory; within one it is free.
    pub fn peer_copy_time(&self, nbytes: usize, across: bool) -> Duration {
        if across {
            self.copy_time(nbytes, true)
        } else {
            Duration::ZERO
        }
    }
}

/// `nbytes` at `bytes_per_s` (0: infinitely fast).
fn transfer_time(nbytes: usize, bytes_per_s: u64) -> Duration {
    if bytes_per_s == 0 {
        return Duration::ZERO;
    }
    let ns = (nbytes as u128 * 1_000_000_000) / u128::from(bytes_per_s);
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// Burns host CPU for `d`, as a driver call does.
pub(crate) fn busy_wait(d: Duration) {
    if d.is_zero() {
        return;
    }
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

/// Waits a span of device time on a stream worker: sleeps for most of a
/// long wait (leaving the CPU to the host and to other streams), and spins
/// the rest, since a sleep overshoots by tens of microseconds.
pub(crate) fn device_wait(d: Duration) {
    const SPIN: Duration = Duration::from_micros(200);
    if d.is_zero() {
        return;
    }
    let deadline = Instant::now() + d;
    if d > SPIN {
        std::thread::sleep(d - SPIN);
    }
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets() {
        assert!(CostModel::OFF.is_off());
        assert!(CostModel::default().is_off());
        assert!(!CostModel::PCIE_GPU.is_off());
        assert!(!CostModel { compute_factor: 1.5, ..CostModel::OFF }.is_off());
        assert!(!CostModel { alloc_sync: true, ..CostModel::OFF }.is_off());
    }

    #[test]
    fn copy_times_follow_latency_and_bandwidth() {
        let m = CostModel::PCIE_GPU;
        // 20 MB at 20 GB/s: 1 ms, plus 10 µs.
        assert_eq!(m.copy_time(20_000_000, true), Duration::from_micros(1_010));
        // 6 MB at 6 GB/s: 1 ms, plus 10 µs.
        assert_eq!(m.copy_time(6_000_000, false), Duration::from_micros(1_010));
        assert_eq!(m.copy_time(0, false), Duration::from_micros(10));
        assert_eq!(m.peer_copy_time(20_000_000, true), Duration::from_micros(1_010));
        assert_eq!(m.peer_copy_time(20_000_000, false), Duration::ZERO);
        // Bandwidth 0 means no transfer cost, only latency.
        let latency_only = CostModel { copy_latency_ns: 3_000, ..CostModel::OFF };
        assert_eq!(latency_only.copy_time(1 << 30, true), Duration::from_micros(3));
        assert_eq!(CostModel::OFF.copy_time(usize::MAX, false), Duration::ZERO);
    }

    #[test]
    fn waits_last_at_least_their_span() {
        for d in [Duration::ZERO, Duration::from_micros(50), Duration::from_micros(600)] {
            let t = Instant::now();
            busy_wait(d);
            assert!(t.elapsed() >= d);
            let t = Instant::now();
            device_wait(d);
            assert!(t.elapsed() >= d);
        }
    }
}

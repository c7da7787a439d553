//! The cost model through the Rust API: what is charged where, observed
//! through behaviour (results, counters, capabilities), never through time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use torchfl_sim::{Config, CopyKind, CostModel, DType, Mode, RawCopy, Runtime};

fn runtime(mode: Mode, cost: CostModel, self_caching: bool) -> Runtime {
    Runtime::new(Config { devices: 2, memory: 1 << 26, mode, cost, self_caching, ..Config::default() })
        .unwrap()
}

/// A cheap cost model: every charging point is exercised, quickly.
const CHEAP: CostModel = CostModel {
    alloc_latency_ns: 1_000,
    alloc_sync: true,
    launch_latency_ns: 1_000,
    copy_latency_ns: 1_000,
    pinned_bytes_per_s: 20_000_000_000,
    pageable_bytes_per_s: 6_000_000_000,
    compute_factor: 1.5,
};

#[test]
fn copies_are_classified_by_their_host_memory() {
    for mode in [Mode::Async, Mode::Sync] {
        let rt = runtime(mode, CHEAP, false);
        let stream = rt.default_stream(0).unwrap();
        let dev = rt.allocate(0, 256).unwrap();
        let pinned = rt.host_allocate(256).unwrap();
        let mut pageable = vec![7u8; 256];
        // SAFETY: `pinned` is a live 256-byte block.
        unsafe { std::ptr::write_bytes(pinned as usize as *mut u8, 3, 256) };
        let h2d = |src: u64| RawCopy {
            kind: CopyKind::HostToDevice,
            dst_device: 0,
            src_device: 0,
            dst: dev,
            src,
            nbytes: 256,
            stream: Some(stream),
        };
        // SAFETY: both host buffers stay alive and unchanged until the
        // stream synchronizes below.
        unsafe { rt.copy_raw(&h2d(pinned)).unwrap() };
        let s = rt.host_memory_stats();
        assert_eq!((s.pinned_copies, s.pageable_copies), (1, 0), "{mode:?}");
        // A pageable copy returns only once it ran: the device holds its
        // bytes right away, without a synchronize.
        // SAFETY: as above.
        unsafe { rt.copy_raw(&h2d(pageable.as_ptr() as u64)).unwrap() };
        let mut back = vec![0u8; 256];
        rt.copy_to_host(0, dev, &mut back).unwrap();
        assert_eq!(back, vec![7u8; 256]);
        let s = rt.host_memory_stats();
        assert_eq!((s.pinned_copies, s.pageable_copies), (1, 2), "{mode:?}");
        // Device to pinned host memory.
        let d2h = RawCopy {
            kind: CopyKind::DeviceToHost,
            dst_device: 0,
            src_device: 0,
            dst: pinned,
            src: dev,
            nbytes: 256,
            stream: Some(stream),
        };
        // SAFETY: `pinned` stays alive until the synchronize.
        unsafe { rt.copy_raw(&d2h).unwrap() };
        rt.synchronize_device(0).unwrap();
        // SAFETY: the copy has run; the block is live.
        let got = unsafe { std::slice::from_raw_parts(pinned as usize as *const u8, 256) };
        assert_eq!(got, &[7u8; 256][..]);
        assert_eq!(rt.host_memory_stats().pinned_copies, 2);
        pageable.clear();
        rt.host_deallocate(pinned).unwrap();
        rt.deallocate(0, dev).unwrap();
    }
}

#[test]
fn without_a_cost_model_copies_are_not_classified() {
    let rt = runtime(Mode::Async, CostModel::OFF, false);
    let dev = rt.allocate(0, 64).unwrap();
    rt.copy_to_device(0, dev, &[1u8; 64], Some(rt.default_stream(0).unwrap())).unwrap();
    rt.synchronize_device(0).unwrap();
    let s = rt.host_memory_stats();
    assert_eq!((s.pinned_copies, s.pageable_copies), (0, 0));
}

#[test]
fn allocation_statistics_and_device_copies_stay_right_under_cost() {
    for self_caching in [false, true] {
        let rt = runtime(Mode::Async, CHEAP, self_caching);
        assert_eq!(
            rt.capabilities() & torchfl_ffi::TFL_CAP_CACHING_ALLOCATOR != 0,
            self_caching,
            "the capability follows self_caching"
        );
        let a = rt.allocate(0, 1000).unwrap();
        let b = rt.allocate(1, 1000).unwrap();
        rt.copy_to_device(0, a, &[5u8; 1000], Some(rt.default_stream(0).unwrap())).unwrap();
        rt.copy_device_to_device(1, b, 0, a, 1000, Some(rt.default_stream(0).unwrap())).unwrap();
        rt.set_memory(0, a, 0, 10, Some(rt.default_stream(0).unwrap())).unwrap();
        rt.synchronize_device(0).unwrap();
        let mut out = vec![0u8; 1000];
        rt.copy_to_host(1, b, &mut out).unwrap();
        assert_eq!(out, vec![5u8; 1000]);
        rt.deallocate(0, a).unwrap();
        let s = rt.memory_stats(0).unwrap();
        assert_eq!((s.allocated_bytes, s.num_allocations, s.num_frees), (0, 1, 1));
        // Same size again: served from the cache (a self-caching pool pays
        // no latency for it), same statistics either way.
        let c = rt.allocate(0, 1000).unwrap();
        assert_eq!(rt.memory_stats(0).unwrap().num_allocations, 2);
        rt.deallocate(0, c).unwrap();
        rt.deallocate(1, b).unwrap();
    }
}

#[test]
fn stretched_kernels_compute_the_same_results() {
    for mode in [Mode::Async, Mode::Sync] {
        let sim = Sim::with(Config {
            devices: 1,
            memory: 1 << 24,
            mode,
            cost: CostModel { compute_factor: 3.0, launch_latency_ns: 1_000, ..CostModel::OFF },
            ..Config::default()
        });
        let x = HTensor::new(DType::Float32, &[64, 33], |i| i as f64);
        let a = sim.place(&x, Layout::Contiguous);
        let b = sim.place(&x, Layout::Strided);
        let out = sim.empty(DType::Float32, &[64, 33], Layout::Contiguous);
        sim.call("add.Tensor", vec![t(&a), t(&b), scalar_i(1)], vec![out.arg.clone()]).unwrap();
        let expected: Vec<f64> = x.data.iter().map(|v| 2.0 * v).collect();
        assert_close(&sim.read(&out), &expected, &format!("{mode:?}"));
    }
}

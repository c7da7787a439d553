//! Device runtime behaviour through the safe API: memory accounting, OOM,
//! stream ordering, events, cross-stream waits, stream-ordered free, strict
//! mode and sync mode. Each test has its own `Runtime`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use torchfl_sim::{Arg, Config, DType, ErrorCode, Mode, Runtime};

fn config(mode: Mode, memory: u64, strict: bool) -> Config {
    Config { devices: 2, memory, mode, strict, ..Config::default() }
}

#[test]
fn memory_accounting_peak_oom_and_stats() {
    let rt = Runtime::new(config(Mode::Async, 1 << 20, false)).unwrap();
    let a = rt.allocate(0, 600 << 10).unwrap();
    assert_eq!(a % 64, 0, "64-byte alignment");
    let e = rt.allocate(0, 500 << 10).unwrap_err();
    assert_eq!(e.code(), ErrorCode::OutOfMemory);
    assert!(e.message().contains(&(500u64 << 10).to_string()), "{}", e.message());
    assert!(e.message().contains(&(1u64 << 20).to_string()), "{}", e.message());
    let b = rt.allocate(0, 100 << 10).unwrap();
    let s = rt.memory_stats(0).unwrap();
    assert_eq!(s.allocated_bytes, 700 << 10);
    assert_eq!(s.reserved_bytes, 700 << 10);
    assert_eq!(s.total_bytes, 1 << 20);
    assert_eq!((s.num_allocations, s.num_frees, s.num_ooms), (2, 0, 1));
    rt.deallocate(0, a).unwrap();
    rt.synchronize_device(0).unwrap();
    let s = rt.memory_stats(0).unwrap();
    assert_eq!(s.allocated_bytes, 100 << 10);
    assert_eq!(s.peak_allocated_bytes, 700 << 10);
    assert_eq!(s.num_frees, 1);
    rt.reset_peak_memory_stats(0).unwrap();
    assert_eq!(rt.memory_stats(0).unwrap().peak_allocated_bytes, 100 << 10);
    // devices are accounted separately
    assert_eq!(rt.memory_stats(1).unwrap().allocated_bytes, 0);
    // errors
    let e = rt.deallocate(0, a).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let e = rt.deallocate(1, b).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let e = rt.allocate(2, 1).unwrap_err();
    assert_eq!(e.message(), "sim: device 2 out of range (device_count = 2)");
    rt.deallocate(0, 0).unwrap();
    rt.empty_cache(0).unwrap();
    let p = rt.device_properties(1).unwrap();
    assert_eq!((p.total_memory, p.memory_alignment), (1 << 20, 64));
    assert!(p.compute_units >= 1);
}

#[test]
fn zero_byte_allocations() {
    let rt = Runtime::new(config(Mode::Async, 1 << 20, false)).unwrap();
    let ptrs: Vec<u64> = (0..4).map(|_| rt.allocate(0, 0).unwrap()).collect();
    assert!(ptrs.iter().all(|&p| p != 0));
    let mut unique = ptrs.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 4);
    assert_eq!(rt.memory_stats(0).unwrap().allocated_bytes, 0);
    for p in ptrs {
        rt.deallocate(0, p).unwrap();
    }
}

#[test]
fn kernels_on_one_stream_run_in_order_without_syncs() {
    for mode in [Mode::Async, Mode::Sync] {
        let sim = Sim::new(mode);
        let x = sim.empty(DType::Float32, &[256, 256], Layout::Contiguous);
        sim.call("fill_.Scalar", vec![t(&x), scalar_i(1)], vec![x.arg.clone()]).unwrap();
        for _ in 0..50 {
            sim.call("add_.Scalar", vec![t(&x), scalar_i(1), scalar_i(1)], vec![x.arg.clone()]).unwrap();
        }
        sim.call("mul_.Scalar", vec![t(&x), scalar_i(2)], vec![x.arg.clone()]).unwrap();
        if mode == Mode::Sync {
            assert!(sim.rt.query_stream(sim.stream).unwrap(), "sync mode is always idle");
        }
        sim.rt.synchronize_stream(sim.stream).unwrap();
        assert!(sim.rt.query_stream(sim.stream).unwrap());
        assert!(sim.read(&x).data.iter().all(|&v| v == 102.0));
    }
}

#[test]
fn events_query_sync_and_timing() {
    for mode in [Mode::Async, Mode::Sync] {
        let sim = Sim::new(mode);
        let rt = &sim.rt;
        let start = rt.create_event(0, true).unwrap();
        let end = rt.create_event(0, true).unwrap();
        let plain = rt.create_event(0, false).unwrap();
        assert!(rt.query_event(start).unwrap(), "never recorded counts as complete");
        let e = rt.elapsed_time(start, end).unwrap_err();
        assert_eq!(e.code(), ErrorCode::FailedPrecondition);
        assert!(e.message().contains("never recorded"), "{}", e.message());

        let x = sim.empty(DType::Float32, &[512, 512], Layout::Contiguous);
        rt.record_event(start, sim.stream).unwrap();
        for _ in 0..10 {
            sim.call("add_.Scalar", vec![t(&x), scalar_i(1), scalar_i(1)], vec![x.arg.clone()]).unwrap();
        }
        rt.record_event(end, sim.stream).unwrap();
        rt.record_event(plain, sim.stream).unwrap();
        rt.synchronize_event(end).unwrap();
        assert!(rt.query_event(end).unwrap() && rt.query_event(start).unwrap());
        assert!(sim.read(&x).data.iter().all(|&v| v == 10.0), "synchronize_event waited for the work");
        let ms = rt.elapsed_time(start, end).unwrap();
        assert!(ms > 0.0, "timed work takes time: {ms}");
        assert!(rt.elapsed_time(end, start).unwrap() < 0.0);
        let e = rt.elapsed_time(start, plain).unwrap_err();
        assert_eq!(e.code(), ErrorCode::FailedPrecondition);
        assert!(e.message().contains("TFL_EVENT_TIMING"), "{}", e.message());
        // events must be recorded on a stream of their device
        let s1 = rt.default_stream(1).unwrap();
        assert_eq!(rt.record_event(start, s1).unwrap_err().code(), ErrorCode::InvalidArgument);
        rt.destroy_event(plain).unwrap();
        assert_eq!(rt.query_event(plain).unwrap_err().code(), ErrorCode::InvalidArgument);
    }
}

#[test]
fn stream_wait_event_orders_two_streams() {
    for mode in [Mode::Async, Mode::Sync] {
        let sim = Sim::new(mode);
        let rt = &sim.rt;
        let producer = rt.create_stream(0, 0).unwrap();
        let consumer = rt.create_stream(0, -1).unwrap();
        let x = sim.empty(DType::Float32, &[512, 512], Layout::Contiguous);
        let y = sim.empty(DType::Float32, &[512, 512], Layout::Contiguous);
        sim.call_on(producer, "fill_.Scalar", vec![t(&x), scalar_i(1)], vec![x.arg.clone()]).unwrap();
        for _ in 0..20 {
            sim.call_on(producer, "add_.Scalar", vec![t(&x), scalar_i(1), scalar_i(1)], vec![x.arg.clone()])
                .unwrap();
        }
        let ready = rt.create_event(0, false).unwrap();
        rt.record_event(ready, producer).unwrap();
        rt.stream_wait_event(consumer, ready).unwrap();
        sim.call_on(consumer, "mul.Scalar", vec![t(&x), scalar_i(2)], vec![y.arg.clone()]).unwrap();
        // Only the consumer is synchronized: the wait alone must order it.
        rt.synchronize_stream(consumer).unwrap();
        let TensorArgPtr(yp) = TensorArgPtr::of(&y);
        let mut bytes = vec![0u8; 4];
        // read one element without synchronizing the device
        rt.copy_to_host(0, yp, &mut bytes).unwrap();
        assert_eq!(f32::from_ne_bytes(bytes.try_into().unwrap()), 42.0);
        assert!(sim.read(&y).data.iter().all(|&v| v == 42.0));
        rt.destroy_stream(producer).unwrap();
        rt.destroy_stream(consumer).unwrap();
        let e = rt.synchronize_stream(producer).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        let e = rt.destroy_stream(sim.stream).unwrap_err();
        assert!(e.message().contains("default stream"), "{}", e.message());
    }
}

/// The device address of a contiguous tensor's first element.
struct TensorArgPtr(u64);
impl TensorArgPtr {
    fn of(d: &DTensor) -> Self {
        match d.arg.data {
            torchfl_sim::TensorData::Device { ptr, byte_offset, .. } => Self(ptr + byte_offset),
            torchfl_sim::TensorData::Host(_)
            | torchfl_sim::TensorData::WrappedNumber(_)
            | torchfl_sim::TensorData::Meta => panic!("not a device tensor"),
        }
    }
}

#[test]
fn destroying_a_stream_lets_queued_work_finish() {
    let sim = Sim::new(Mode::Async);
    let s = sim.rt.create_stream(0, 0).unwrap();
    let x = sim.empty(DType::Float64, &[256, 256], Layout::Contiguous);
    for _ in 0..30 {
        sim.call_on(s, "add_.Scalar", vec![t(&x), scalar_i(1), scalar_i(1)], vec![x.arg.clone()]).unwrap();
    }
    sim.rt.destroy_stream(s).unwrap();
    let e = sim.call_on(s, "neg_", vec![t(&x)], vec![x.arg.clone()]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    // device synchronize covers the destroyed stream's remaining work
    sim.rt.synchronize_device(0).unwrap();
    assert!(sim.read(&x).data.iter().all(|&v| v == 30.0));
}

#[test]
fn stream_ordered_free_keeps_memory_alive_for_queued_work() {
    // Capacity for two buffers only: reallocating must wait for the freed
    // buffer's readers instead of reusing it under them or failing.
    let n = 1 << 18; // f32 elements, 1 MiB
    let sim = Sim::with(config(Mode::Async, 2 * (n as u64 * 4) + 4096, false));
    let rt = &sim.rt;
    let other = rt.create_stream(0, 0).unwrap();
    let a = sim.empty(DType::Float32, &[n], Layout::Contiguous);
    let b_ptr = rt.allocate(0, n * 4).unwrap();
    let b = DTensor {
        arg: torchfl_sim::TensorArg::contiguous(DType::Float32, &[n as i64], 0, b_ptr),
        ptr: b_ptr,
    };
    sim.call("fill_.Scalar", vec![t(&a), scalar_i(3)], vec![a.arg.clone()]).unwrap();
    for _ in 0..20 {
        sim.call("add_.Scalar", vec![t(&a), scalar_i(1), scalar_i(1)], vec![a.arg.clone()]).unwrap();
    }
    sim.call("mul.Scalar", vec![t(&a), scalar_i(2)], vec![b.arg.clone()]).unwrap();
    // Free `a` while the queued work still reads it.
    rt.deallocate(0, a.ptr).unwrap();
    let s = rt.memory_stats(0).unwrap();
    assert_eq!(s.allocated_bytes, (n * 4) as u64, "allocated drops at deallocate");
    assert!(s.reserved_bytes >= s.allocated_bytes);
    // Reallocate (would-be OOM: waits for the readers) and scribble on the
    // new buffer from another stream.
    let c_ptr = rt.allocate(0, n * 4).unwrap();
    let c = DTensor {
        arg: torchfl_sim::TensorArg::contiguous(DType::Float32, &[n as i64], 0, c_ptr),
        ptr: c_ptr,
    };
    sim.call_on(other, "fill_.Scalar", vec![t(&c), scalar_i(-1)], vec![c.arg.clone()]).unwrap();
    rt.synchronize_device(0).unwrap();
    assert!(sim.read(&b).data.iter().all(|&v| v == 46.0));
    let s = rt.memory_stats(0).unwrap();
    assert_eq!(s.reserved_bytes, s.allocated_bytes, "freed memory reclaimed after sync");
    assert_eq!(s.num_ooms, 0);
    // With nothing left to reclaim, the next allocation is refused.
    assert_eq!(rt.allocate(0, n * 4).unwrap_err().code(), ErrorCode::OutOfMemory);
    assert_eq!(rt.memory_stats(0).unwrap().num_ooms, 1);
}

#[test]
fn freed_memory_is_reused_across_streams_only_after_its_readers() {
    let sim = Sim::new(Mode::Async);
    let rt = &sim.rt;
    let other = rt.create_stream(0, 0).unwrap();
    let n = 1 << 16;
    let x = sim.place(&HTensor::new(DType::Float32, &[n], |i| i as f64), Layout::Contiguous);
    let y = sim.empty(DType::Float32, &[n], Layout::Contiguous);
    for _ in 0..20 {
        sim.call("add_.Scalar", vec![t(&x), scalar_i(1), scalar_i(1)], vec![x.arg.clone()]).unwrap();
    }
    sim.call("mul.Scalar", vec![t(&x), scalar_i(2)], vec![y.arg.clone()]).unwrap();
    // Free `x` under its queued readers, then scribble on a buffer of the
    // same size from another stream: if that were `x`'s memory, `y` would
    // read -1s.
    rt.deallocate(0, x.ptr).unwrap();
    let z_ptr = rt.allocate(0, n * 4).unwrap();
    let z = DTensor {
        arg: torchfl_sim::TensorArg::contiguous(DType::Float32, &[n as i64], 0, z_ptr),
        ptr: z_ptr,
    };
    sim.call_on(other, "fill_.Scalar", vec![t(&z), scalar_i(-1)], vec![z.arg.clone()]).unwrap();
    let expected: Vec<f64> = (0..n).map(|i| (i as f64 + 20.0) * 2.0).collect();
    assert_close(&sim.read(&y), &expected, "y");
    // Once the work has run, freed blocks are cached and handed out again.
    rt.deallocate(0, z_ptr).unwrap();
    let s = rt.memory_stats(0).unwrap();
    assert_eq!(s.allocated_bytes, (n * 4) as u64, "y only");
    assert!(s.reserved_bytes >= s.allocated_bytes + (n * 4) as u64, "the cache counts as reserved");
    let again = rt.allocate(0, n * 4).unwrap();
    assert!(again == x.ptr || again == z_ptr, "a cached block of the same size");
    rt.deallocate(0, again).unwrap();
    rt.synchronize_device(0).unwrap();
    rt.empty_cache(0).unwrap();
    let s = rt.memory_stats(0).unwrap();
    assert_eq!(s.reserved_bytes, s.allocated_bytes, "empty_cache gives the cache back");
    rt.destroy_stream(other).unwrap();
}

#[test]
fn a_stream_runs_more_work_than_its_queue_holds_in_order() {
    let sim = Sim::new(Mode::Async);
    let x = sim.place(&HTensor::new(DType::Float64, &[8], |i| i as f64), Layout::Contiguous);
    // Alternating add and mul: any reordering changes the result.
    for step in 0..3000 {
        if step % 2 == 0 {
            sim.call("add_.Scalar", vec![t(&x), scalar_i(1), scalar_i(1)], vec![x.arg.clone()]).unwrap();
        } else {
            sim.call("mul_.Scalar", vec![t(&x), scalar_f(0.5)], vec![x.arg.clone()]).unwrap();
        }
    }
    let expected: Vec<f64> = (0..8)
        .map(|i| (0..3000).fold(i as f64, |v, step| if step % 2 == 0 { v + 1.0 } else { v * 0.5 }))
        .collect();
    assert_close(&sim.read(&x), &expected, "x");
}

#[test]
fn host_threads_launch_on_one_stream_concurrently() {
    let sim = Sim::new(Mode::Async);
    let x = sim.place(&HTensor::new(DType::Int64, &[16], |_| 0.0), Layout::Contiguous);
    std::thread::scope(|scope| {
        for k in 0..4 {
            let (sim, x) = (&sim, &x);
            scope.spawn(move || {
                for _ in 0..500 {
                    sim.call("add_.Scalar", vec![t(x), scalar_i(1), scalar_i(1)], vec![x.arg.clone()])
                        .unwrap();
                    // Allocation and stream-ordered free from every thread.
                    let p = sim.rt.allocate(0, 64 * (k + 1)).unwrap();
                    sim.rt.deallocate(0, p).unwrap();
                }
            });
        }
    });
    assert_close(&sim.read(&x), &[2000.0; 16], "x");
    let s = sim.rt.memory_stats(0).unwrap();
    assert_eq!(s.num_allocations - s.num_frees, 1, "x only");
}

#[test]
fn copies_sync_async_and_across_devices() {
    for mode in [Mode::Async, Mode::Sync] {
        let rt = Runtime::new(config(mode, 1 << 24, false)).unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let d0 = rt.allocate(0, 1000).unwrap();
        let d1 = rt.allocate(1, 1000).unwrap();
        let s0 = rt.default_stream(0).unwrap();
        rt.copy_to_device(0, d0, &data, Some(s0)).unwrap();
        rt.copy_device_to_device(1, d1, 0, d0, 1000, Some(s0)).unwrap();
        rt.set_memory(0, d0, 7, 10, Some(s0)).unwrap();
        let mut back = vec![0u8; 1000];
        // The copy into device 1 ran on device 0's stream: synchronize it.
        rt.synchronize_device(0).unwrap();
        rt.copy_to_host(1, d1, &mut back).unwrap();
        assert_eq!(back, data);
        rt.copy_to_host(0, d0, &mut back).unwrap();
        assert!(back[..10].iter().all(|&b| b == 7) && back[10..] == data[10..]);
        // synchronous copy within one allocation (overlapping ranges)
        rt.copy_device_to_device(0, d0 + 1, 0, d0, 100, None).unwrap();
        rt.copy_to_host(0, d0, &mut back).unwrap();
        assert_eq!(back[1..11], [7u8; 10]);
        // out of bounds and wrong device
        let e = rt.copy_to_device(0, d0 + 900, &data, None).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        let e = rt.set_memory(0, d1, 0, 1, None).unwrap_err();
        assert!(e.message().contains("device 1"), "{}", e.message());
        let s1 = rt.default_stream(1).unwrap();
        let e = rt.set_memory(0, d0, 0, 1, Some(s1)).unwrap_err();
        assert!(e.message().contains("belongs to device 1"), "{}", e.message());
    }
}

#[test]
fn strict_mode_tags_pointers_and_checks_devices() {
    let sim = Sim::with(config(Mode::Async, 1 << 24, true));
    let rt = &sim.rt;
    assert_eq!(rt.capabilities() & torchfl_ffi::TFL_CAP_HOST_ADDRESSABLE_MEMORY, 0);
    assert_ne!(rt.capabilities() & torchfl_ffi::TFL_CAP_ASYNC_STREAMS, 0);
    let p0 = rt.allocate(0, 64).unwrap();
    let p1 = rt.allocate(1, 64).unwrap();
    assert_eq!((p0 >> 48) & 0xFF, 0xA0);
    assert_eq!((p1 >> 48) & 0xFF, 0xA1);
    let e = rt.deallocate(0, p1).unwrap_err();
    assert!(e.message().contains("belongs to device 1"), "{}", e.message());
    let e = rt.deallocate(0, p0 & ((1 << 48) - 1)).unwrap_err();
    assert!(e.message().contains("tag"), "{}", e.message());
    // Kernels and copies work through tagged pointers, with host-side
    // pointer arithmetic (base + offset) and byte offsets.
    let x = HTensor::new(DType::Int32, &[4, 4], |i| i as f64);
    let dx = sim.place(&x, Layout::Strided);
    let out = sim.empty(DType::Int32, &[4, 4], Layout::Transposed);
    sim.call("add.Tensor", vec![t(&dx), t(&dx), scalar_i(1)], vec![out.arg.clone()]).unwrap();
    assert_eq!(sim.read(&out).data, x.data.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    let mut four = [0u8; 4];
    rt.copy_to_host(0, TensorArgPtr::of(&out).0 + 4, &mut four).unwrap();
    // a tensor of device 1 handed to a device-0 kernel
    let on1 = sim.place_on(1, &x, Layout::Contiguous);
    let e = sim.call("neg", vec![t(&on1)], vec![out.arg.clone()]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let mut forged = on1.arg.clone();
    forged.data = torchfl_sim::TensorData::Device { device: 0, ptr: on1.ptr, byte_offset: 0 };
    let e = sim.call("neg", vec![Arg::Tensor(forged)], vec![out.arg.clone()]).unwrap_err();
    assert!(e.message().contains("belongs to device 1"), "{}", e.message());
}

#[test]
fn sync_mode_capabilities_and_inline_execution() {
    let sim = Sim::with(config(Mode::Sync, 1 << 24, false));
    let caps = sim.rt.capabilities();
    assert_eq!(caps & torchfl_ffi::TFL_CAP_ASYNC_STREAMS, 0);
    assert_ne!(caps & torchfl_ffi::TFL_CAP_HOST_ADDRESSABLE_MEMORY, 0);
    assert_ne!(caps & torchfl_ffi::TFL_CAP_EVENT_TIMING, 0);
    let x = sim.empty(DType::Float32, &[8], Layout::Contiguous);
    sim.call("fill_.Scalar", vec![t(&x), scalar_f(1.5)], vec![x.arg.clone()]).unwrap();
    // Non-strict, sync: device memory is host memory and already written.
    let mut bytes = [0u8; 4];
    sim.rt.copy_to_host(0, x.ptr, &mut bytes).unwrap();
    assert_eq!(f32::from_ne_bytes(bytes), 1.5);
}

/// The point of strict mode: a host that dereferences a device pointer
/// crashes instead of silently reading memory it must not touch. Runs the
/// dereference in a child process (this test binary, re-executed).
#[cfg(unix)]
#[test]
fn strict_pointers_fault_when_the_host_dereferences_them() {
    use std::os::unix::process::ExitStatusExt;
    const CHILD: &str = "TORCHFL_SIM_TEST_DEREF_CHILD";
    let name = "strict_pointers_fault_when_the_host_dereferences_them";
    if std::env::var_os(CHILD).is_some() {
        let sim = Sim::with(config(Mode::Sync, 1 << 20, true));
        let p = sim.rt.allocate(0, 64).unwrap();
        // SAFETY: none: this is the forbidden access the test expects to
        // fault, in a child process.
        let byte = unsafe { std::ptr::read_volatile(p as usize as *const u8) };
        println!("read {byte} through a strict device pointer");
        std::process::exit(0);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let signal = out.status.signal();
    assert!(
        matches!(signal, Some(libc::SIGSEGV) | Some(libc::SIGBUS)),
        "expected a fault, got {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

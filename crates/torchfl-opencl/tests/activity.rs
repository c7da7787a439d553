//! The OpenCL plugin's activity records (ABI 1.8) through torch-fl's core:
//! the CL calls each operation made, its kernels, copies and fills on the
//! device's profiling clock, the waits, the first-use build, user ranges,
//! and the clock pair that maps device times onto the host's.
//!
//! One test, alone in its binary: recording is process-wide, so a second
//! test running beside it would drain its records, and the kernel build it
//! expects happens only at the first use of the kernel in the process.
//!
//! It needs an OpenCL driver. Without one it checks that loading fails with
//! the message that says what to install, and says on stderr that it ran
//! only that check (as tests/plugin.rs does).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::sync::Arc;

use torchfl_core::{ActivityKind, ActivityRecord, Arg, LoadOptions, Plugin, ScalarArg, TensorArg};
use torchfl_ffi::{TFL_DType, TFL_ACTIVITY_ALL_KINDS};

fn plugin() -> Option<Arc<Plugin>> {
    match torchfl_core::load(&torchfl_testkit::opencl_plugin(), &LoadOptions::default()) {
        Ok(p) => Some(p),
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains("no OpenCL") && text.contains("pocl-opencl-icd"),
                "loading failed for another reason than a missing driver: {text}"
            );
            eprintln!("no OpenCL driver here: only the refusal was checked ({text})");
            None
        }
    }
}

/// The one record of `kind` named `name` with `correlation`.
fn one<'a>(
    records: &'a [ActivityRecord],
    kind: ActivityKind,
    name: &str,
    correlation: u64,
) -> &'a ActivityRecord {
    let found: Vec<&ActivityRecord> = records
        .iter()
        .filter(|r| r.kind == kind && r.name == name && r.correlation_id == correlation)
        .collect();
    assert_eq!(found.len(), 1, "{kind:?} {name} with correlation {correlation} in {records:#?}");
    found[0]
}

#[test]
fn operations_are_recorded_in_opencl_terms_on_the_device_clock() {
    let Some(p) = plugin() else { return };
    assert!(p.has_activity() && p.has_ranges());
    let f32_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
    let (da, db, dout) = (p.allocate(0, 24).unwrap(), p.allocate(0, 12).unwrap(), p.allocate(0, 24).unwrap());

    // Off: nothing is recorded.
    p.copy_to_device(&da, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])).unwrap();
    let drained = p.activity_drain().unwrap();
    assert!(drained.records.is_empty() && drained.dropped == 0, "{drained:?}");
    let unknown = p.activity_enable(1 << 9).unwrap_err().to_string();
    assert!(unknown.contains("TFL_ACTIVITY_ALL_KINDS"), "{unknown}");

    p.activity_enable(TFL_ACTIVITY_ALL_KINDS).unwrap();
    let (device0, host0) = p.activity_clock(0).unwrap();
    let stream = p.create_stream(0, 0).unwrap();
    let stream_id = stream.raw() as usize;

    // A synchronous copy: the device's queues are finished first (SYNC).
    p.activity_set_correlation(7).unwrap();
    p.copy_to_device(&db, 0, &f32_bytes(&[10.0, 20.0, 30.0])).unwrap();
    p.activity_set_correlation(0).unwrap();
    // A kernel on a stream, built at first use.
    let add = p.op("add.Tensor").cloned().unwrap();
    let a = TensorArg::contiguous(&da, TFL_DType::F32, &[2, 3]).unwrap();
    let b = TensorArg::contiguous(&db, TFL_DType::F32, &[3]).unwrap();
    let out = TensorArg::contiguous(&dout, TFL_DType::F32, &[2, 3]).unwrap();
    let args = [Arg::Tensor(a), Arg::Tensor(b), Arg::Scalar(ScalarArg::Float(1.0))];
    p.activity_set_correlation(8).unwrap();
    p.launch(&add, &stream, &args, std::slice::from_ref(&out)).unwrap();
    p.activity_set_correlation(0).unwrap();
    // A drain before the stream is synchronized never waits: the kernel's
    // record comes now or after the synchronize, once either way.
    let early = p.activity_drain().unwrap().records;
    p.activity_set_correlation(9).unwrap();
    p.set_memory(&da, 0, 0xAB, 12, Some(&stream)).unwrap();
    p.activity_set_correlation(0).unwrap();
    p.range_push("step").unwrap();
    p.range_mark("here").unwrap();
    p.range_pop().unwrap();
    stream.synchronize().unwrap();
    let (device1, host1) = p.activity_clock(0).unwrap();
    let drained = p.activity_drain().unwrap();
    assert_eq!(drained.dropped, 0);
    let records: Vec<ActivityRecord> = early.into_iter().chain(drained.records).collect();

    // API records name the CL call; device records carry the enqueuing
    // call's correlation and the stream.
    let write = one(&records, ActivityKind::Api, "clEnqueueWriteBuffer", 7);
    assert!(write.host_clock && write.detail == "12 bytes" && write.device == Some(0), "{write:?}");
    let copy = one(&records, ActivityKind::Copy, "memcpy HtoD", 7);
    assert!(!copy.host_clock && copy.detail == "12 bytes", "{copy:?}");
    let waits: Vec<_> = records
        .iter()
        .filter(|r| r.kind == ActivityKind::Sync && r.name == "clFinish" && r.correlation_id == 7)
        .collect();
    assert!(!waits.is_empty() && waits.iter().all(|r| r.detail == "device 0"), "{waits:?}");

    let build = one(&records, ActivityKind::Build, "clBuildProgram", 8);
    assert!(build.detail.starts_with("binary -DTA=float"), "{build:?}");
    let launch = one(&records, ActivityKind::Api, "clEnqueueNDRangeKernel", 8);
    assert_eq!((launch.detail.as_str(), launch.stream), ("binary global=[6] local=auto", stream_id));
    let kernel = one(&records, ActivityKind::Kernel, "binary", 8);
    assert_eq!((kernel.detail.as_str(), kernel.stream), ("add.Tensor global=[6] local=auto", stream_id));
    // On the device's clock, between the two clock readings.
    assert!(!kernel.host_clock);
    assert!(device0 <= kernel.start_ns && kernel.end_ns <= device1, "{device0} {kernel:?} {device1}");
    assert!(host0 < host1);
    let api_starts = launch.start_ns;
    assert!(host0 <= api_starts && launch.end_ns <= host1, "{host0} {launch:?} {host1}");

    let fill = one(&records, ActivityKind::Api, "clEnqueueFillBuffer", 9);
    assert_eq!((fill.detail.as_str(), fill.stream), ("12 bytes", stream_id));
    let memset = one(&records, ActivityKind::Memset, "memset", 9);
    assert_eq!(memset.detail, "12 bytes value=0xab");

    let sync = records
        .iter()
        .find(|r| r.kind == ActivityKind::Sync && r.detail == "stream_synchronize")
        .expect("the stream's synchronize");
    assert_eq!((sync.name.as_str(), sync.stream, sync.host_clock), ("clFinish", stream_id, true));

    let range = one(&records, ActivityKind::Range, "step", 0);
    let mark = one(&records, ActivityKind::Mark, "here", 0);
    assert!(range.start_ns <= mark.start_ns && mark.end_ns <= range.end_ns && mark.start_ns == mark.end_ns);
    assert_eq!(range.device, None);

    // Off again: nothing more.
    p.activity_enable(0).unwrap();
    p.copy_to_device(&da, 0, &[0u8; 4]).unwrap();
    assert!(p.activity_drain().unwrap().records.is_empty());
}

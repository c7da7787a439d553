//! Using a loaded plugin through the core's safe API: memory, copies,
//! streams, events, kernel calls and their errors — on the plain C example,
//! which proves the header is usable from C.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::sync::Arc;

use torchfl_core::{load, Arg, LoadOptions, Plugin, ScalarArg, TensorArg};
use torchfl_ffi::TFL_DType;
use torchfl_testkit::{c_example_plugin, fixture};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn f32_values(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn c_example() -> Arc<Plugin> {
    load(&c_example_plugin(), &LoadOptions::default()).unwrap()
}

fn upload(p: &Arc<Plugin>, v: &[f32]) -> torchfl_core::DeviceBuffer {
    let buf = p.allocate(0, v.len() * 4).unwrap();
    p.copy_to_device(&buf, 0, &f32_bytes(v)).unwrap();
    buf
}

fn download(p: &Plugin, buf: &torchfl_core::DeviceBuffer) -> Vec<f32> {
    let mut out = vec![0u8; buf.len()];
    p.copy_to_host(buf, 0, &mut out).unwrap();
    f32_values(&out)
}

#[test]
fn c_example_runs_add_with_broadcasting_and_alpha() {
    let p = c_example();
    let stream = p.default_stream(0).unwrap();
    let a = upload(&p, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = upload(&p, &[10.0, 20.0, 30.0]);
    let out = p.allocate(0, 24).unwrap();
    let add = p.op("add.Tensor").unwrap();
    p.launch(
        add,
        &stream,
        &[
            Arg::Tensor(TensorArg::contiguous(&a, TFL_DType::F32, &[2, 3]).unwrap()),
            Arg::Tensor(TensorArg::contiguous(&b, TFL_DType::F32, &[3]).unwrap()),
            Arg::Scalar(ScalarArg::Float(0.5)),
        ],
        &[TensorArg::contiguous(&out, TFL_DType::F32, &[2, 3]).unwrap()],
    )
    .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(download(&p, &out), [6.0, 12.0, 18.0, 9.0, 15.0, 21.0]);
}

#[test]
fn c_example_handles_strided_inputs_and_in_place_fill() {
    let p = c_example();
    let stream = p.default_stream(0).unwrap();
    // A transposed 2x3 view of a 3x2 buffer.
    let a = upload(&p, &[1.0, -2.0, 3.0, -4.0, 5.0, -6.0]);
    let out = p.allocate(0, 24).unwrap();
    let a_t = TensorArg::strided(&a, TFL_DType::F32, &[2, 3], &[1, 2], 0).unwrap();
    p.launch(
        p.op("relu").unwrap(),
        &stream,
        &[Arg::Tensor(a_t)],
        &[TensorArg::contiguous(&out, TFL_DType::F32, &[2, 3]).unwrap()],
    )
    .unwrap();
    assert_eq!(download(&p, &out), [1.0, 3.0, 5.0, 0.0, 0.0, 0.0]);

    let self_ = TensorArg::contiguous(&out, TFL_DType::F32, &[6]).unwrap();
    p.launch(
        p.op("fill_.Scalar").unwrap(),
        &stream,
        &[Arg::Tensor(self_.clone()), Arg::Scalar(ScalarArg::Int(3))],
        &[self_],
    )
    .unwrap();
    assert_eq!(download(&p, &out), [3.0; 6]);
}

#[test]
fn kernel_errors_come_back_with_the_op_and_the_plugins_message() {
    let p = c_example();
    let stream = p.default_stream(0).unwrap();
    let a = p.allocate(0, 24).unwrap();
    let out = p.allocate(0, 24).unwrap();
    // float64 is not implemented by the C example: UNIMPLEMENTED.
    let err = p
        .launch(
            p.op("neg").unwrap(),
            &stream,
            &[Arg::Tensor(TensorArg::contiguous(&a, TFL_DType::F64, &[3]).unwrap())],
            &[TensorArg::contiguous(&out, TFL_DType::F64, &[3]).unwrap()],
        )
        .unwrap_err();
    assert_eq!(err.kind(), "Kernel");
    let msg = err.to_string();
    assert!(msg.contains("'neg'") && msg.contains("only float32") && msg.contains("UNIMPLEMENTED"), "{msg}");

    // Shapes that do not broadcast: INVALID_ARGUMENT.
    let b = p.allocate(0, 16).unwrap();
    let err = p
        .launch(
            p.op("mul.Tensor").unwrap(),
            &stream,
            &[
                Arg::Tensor(TensorArg::contiguous(&a, TFL_DType::F32, &[6]).unwrap()),
                Arg::Tensor(TensorArg::contiguous(&b, TFL_DType::F32, &[4]).unwrap()),
            ],
            &[TensorArg::contiguous(&out, TFL_DType::F32, &[6]).unwrap()],
        )
        .unwrap_err();
    assert!(err.to_string().contains("INVALID_ARGUMENT"), "{err}");
}

#[test]
fn an_injected_kernel_failure_propagates() {
    let p = load(&fixture("failing_kernel", &["FIXTURE_FAILING_KERNEL"]), &LoadOptions::default()).unwrap();
    let stream = p.default_stream(0).unwrap();
    let a = p.allocate(0, 4).unwrap();
    let t = || TensorArg::contiguous(&a, TFL_DType::F32, &[1]).unwrap();
    let err = p
        .launch(
            p.op("sub.Tensor").unwrap(),
            &stream,
            &[Arg::Tensor(t()), Arg::Tensor(t()), Arg::Scalar(ScalarArg::Int(1))],
            &[t()],
        )
        .unwrap_err();
    assert_eq!(err.kind(), "Kernel");
    assert!(err.to_string().contains("fixture: sub.Tensor failed on purpose"), "{err}");
    assert!(err.to_string().contains("INTERNAL"), "{err}");
}

#[test]
fn a_kernel_message_that_is_not_utf8_is_decoded_lossily() {
    let path = fixture("failing_kernel_utf8", &["FIXTURE_FAILING_KERNEL", "FIXTURE_INVALID_UTF8"]);
    let p = load(&path, &LoadOptions::default()).unwrap();
    let stream = p.default_stream(0).unwrap();
    let a = p.allocate(0, 4).unwrap();
    let t = || TensorArg::contiguous(&a, TFL_DType::F32, &[1]).unwrap();
    let err = p
        .launch(
            p.op("sub.Tensor").unwrap(),
            &stream,
            &[Arg::Tensor(t()), Arg::Tensor(t()), Arg::Scalar(ScalarArg::Int(1))],
            &[t()],
        )
        .unwrap_err();
    assert_eq!(err.kind(), "Kernel");
    assert!(err.to_string().contains("failed on purpose [caf\u{FFFD} \u{FFFD} \u{FFFD}]"), "{err}");
}

#[test]
fn out_of_bounds_tensors_are_refused_before_the_plugin_runs() {
    let p = c_example();
    let a = p.allocate(0, 16).unwrap();
    let err = TensorArg::contiguous(&a, TFL_DType::F32, &[5]).unwrap_err();
    assert_eq!(err.kind(), "InvalidCall");
    let err = p.copy_to_device(&a, 8, &[0u8; 16]).unwrap_err();
    assert_eq!(err.kind(), "InvalidCall");
}

#[test]
fn memory_accounting_and_out_of_memory() {
    let p = load(&fixture("small_memory", &["MINIMAL_CAPACITY=4096"]), &LoadOptions::default()).unwrap();
    let before = p.memory_stats(0).unwrap();
    assert_eq!(before.total_bytes, 4096);
    let a = p.allocate(0, 3000).unwrap();
    let stats = p.memory_stats(0).unwrap();
    assert_eq!(stats.allocated_bytes, before.allocated_bytes + 3000);
    assert!(stats.peak_allocated_bytes >= 3000);

    let err = p.allocate(0, 2000).unwrap_err();
    assert_eq!(err.kind(), "OutOfMemory");
    let msg = err.to_string();
    assert!(msg.contains("out of memory") && msg.contains("cannot allocate 2000 bytes"), "{msg}");
    assert_eq!(p.memory_stats(0).unwrap().num_ooms, before.num_ooms + 1);

    drop(a);
    let after = p.memory_stats(0).unwrap();
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(after.num_frees, before.num_frees + 1);
    let _b = p.allocate(0, 2000).unwrap(); // fits again
}

#[test]
fn invalid_device_indices_are_errors_not_crashes() {
    let p = c_example();
    for device in [-1, 1, 99] {
        assert_eq!(p.allocate(device, 8).unwrap_err().kind(), "InvalidDevice");
        assert_eq!(p.default_stream(device).unwrap_err().kind(), "InvalidDevice");
    }
}

#[test]
fn streams_and_events_on_a_synchronous_plugin() {
    let p = c_example();
    let s = p.create_stream(0, 0).unwrap();
    let start = p.create_event(0, true).unwrap();
    let end = p.create_event(0, true).unwrap();
    assert!(start.query().unwrap(), "an event never recorded is complete");
    start.record(&s).unwrap();
    end.record(&s).unwrap();
    s.wait_event(&end).unwrap();
    end.synchronize().unwrap();
    assert!(s.query().unwrap());
    assert!(start.elapsed_ms(&end).unwrap() >= 0.0);
    let untimed = p.create_event(0, false).unwrap();
    untimed.record(&s).unwrap();
    let err = start.elapsed_ms(&untimed).unwrap_err();
    assert!(err.to_string().contains("TFL_EVENT_TIMING"), "{err}");
}

#[test]
fn device_to_device_copies_and_set_memory() {
    let p = c_example();
    let a = upload(&p, &[1.0, 2.0, 3.0, 4.0]);
    let b = p.allocate(0, 16).unwrap();
    let s = p.default_stream(0).unwrap();
    p.set_memory(&b, 0, 0, 16, Some(&s)).unwrap();
    p.copy_device_to_device(&b, 4, &a, 8, 8, Some(&s)).unwrap();
    s.synchronize().unwrap();
    assert_eq!(download(&p, &b), [0.0, 3.0, 4.0, 0.0]);
}

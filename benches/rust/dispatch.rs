//! Dispatch-path benches: what torch-fl adds between PyTorch and a kernel.
//!
//! - `load/*`: open + handshake + validation + symbol resolution + registry
//!   registration of a plugin with 100 operators (the library is already
//!   mapped after the first iteration, so this is the host's own work);
//! - `registry/lookup`: op name to winning kernel (lock-free read);
//! - `kernel/*`: a 4-element float32 `add.Tensor` on the simulated device in
//!   synchronous mode, through the resolved pointer with a prebuilt frame
//!   (what the C++ shim does) and through the safe `Plugin::launch` API
//!   (which builds the frame each call).
//!
//! Figures and how to reproduce them: benches/README.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly

use std::hint::black_box;
use std::ptr;

use criterion::{criterion_group, criterion_main, Criterion};
use torchfl_core::{load, Arg, LoadOptions, OpRegistry, PluginLibrary, ScalarArg, TensorArg};
use torchfl_ffi::*;

fn bench_load(c: &mut Criterion) {
    let path = torchfl_testkit::many_ops_plugin(100);
    let options = LoadOptions::default();
    let plugin = load(&path, &options).unwrap();
    assert_eq!(plugin.ops().len(), 100);
    c.bench_function("load/open_validate_100_ops", |b| {
        b.iter(|| black_box(PluginLibrary::open(&path, &options).unwrap()));
    });
    c.bench_function("load/open_validate_initialize_register_100_ops", |b| {
        b.iter(|| {
            let lib = PluginLibrary::open(&path, &options).unwrap();
            // Initialization returns the process' existing plugin: what a
            // second register_device_plugin call costs.
            let p = torchfl_core::loader::initialize(lib, &options).unwrap();
            let reg = OpRegistry::new();
            reg.register(&p, 0);
            black_box(reg)
        });
    });
}

fn bench_registry(c: &mut Criterion) {
    let plugin = load(&torchfl_testkit::many_ops_plugin(100), &LoadOptions::default()).unwrap();
    let reg = OpRegistry::new();
    reg.register(&plugin, 0);
    c.bench_function("registry/lookup", |b| {
        b.iter(|| black_box(reg.lookup(black_box("bench_op_57.Tensor"))))
    });
}

/// `resize_output` for a frame whose op never resizes.
unsafe extern "C" fn no_resize(_: *const TFL_CallFrame, _: usize, _: i32, _: *const i64) -> i32 {
    TFL_ERROR_UNIMPLEMENTED
}

fn bench_kernel(c: &mut Criterion) {
    let options = LoadOptions { init_options: "mode=sync".into(), ..Default::default() };
    let p = load(&torchfl_testkit::sim_plugin(), &options).unwrap();
    let op = p.op("add.Tensor").expect("sim implements add.Tensor").clone();
    let stream = p.default_stream(0).unwrap();
    let a = p.allocate(0, 16).unwrap();
    let bb = p.allocate(0, 16).unwrap();
    let out = p.allocate(0, 16).unwrap();
    p.copy_to_device(&a, 0, &[0u8; 16]).unwrap();
    p.copy_to_device(&bb, 0, &[0u8; 16]).unwrap();

    let shape = [4i64];
    let strides = [1i64];
    let tensor = |data: *mut std::ffi::c_void| TFL_Tensor {
        struct_size: struct_size!(TFL_Tensor, flags),
        data,
        byte_offset: 0,
        device_type: TFL_DEVICE_PLUGIN,
        device_index: 0,
        dtype: TFL_DType::F32,
        ndim: 1,
        shape: shape.as_ptr(),
        strides: strides.as_ptr(),
        flags: 0,
    };
    let (ta, tb, mut tout) = (tensor(a.as_ptr()), tensor(bb.as_ptr()), tensor(out.as_ptr()));
    let value = |tag, u| TFL_Value { struct_size: struct_size!(TFL_Value, u), tag, u };
    let alpha = TFL_Scalar { kind: TFL_SCALAR_INT, v: TFL_ScalarValue { i: 1 } };
    let values = [
        value(TFL_VALUE_TENSOR, TFL_ValueUnion { tensor: &ta }),
        value(TFL_VALUE_TENSOR, TFL_ValueUnion { tensor: &tb }),
        value(TFL_VALUE_SCALAR, TFL_ValueUnion { scalar: alpha }),
    ];
    let args: Vec<*const TFL_Value> = values.iter().map(ptr::from_ref).collect();
    let outputs = [ptr::from_mut(&mut tout)];
    let frame = TFL_CallFrame {
        struct_size: struct_size!(TFL_CallFrame, rng_offset),
        op_name: c"add.Tensor".as_ptr(),
        device_index: 0,
        stream: stream.raw(),
        args: args.as_ptr(),
        num_args: args.len(),
        outputs: outputs.as_ptr(),
        num_outputs: 1,
        resize_output: Some(no_resize),
        host_context: ptr::null_mut(),
        rng_seed: 0,
        rng_offset: 0,
    };
    c.bench_function("kernel/add_4xf32_resolved_pointer", |b| {
        b.iter(|| {
            // SAFETY: the frame describes three live 16-byte allocations of
            // device 0 and every pointer in it outlives the call.
            let status = unsafe { (op.kernel)(black_box(&frame)) };
            assert!(status.is_null());
        });
    });

    let view = |buf| TensorArg::contiguous(buf, TFL_DType::F32, &[4]).unwrap();
    let launch_args = [Arg::Tensor(view(&a)), Arg::Tensor(view(&bb)), Arg::Scalar(ScalarArg::Int(1))];
    let launch_out = [view(&out)];
    c.bench_function("kernel/add_4xf32_safe_launch", |b| {
        b.iter(|| p.launch(&op, &stream, black_box(&launch_args), &launch_out).unwrap());
    });
}

criterion_group!(benches, bench_load, bench_registry, bench_kernel);
criterion_main!(benches);

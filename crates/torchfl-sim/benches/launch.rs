//! Launch overhead of the simulated device in asynchronous mode (the
//! default), through the C ABI as a host calls it: the `add.Tensor` kernel
//! pointer from the op table, called with a prebuilt `TFL_CallFrame` on
//! three 4-element float32 tensors (the same frame as
//! `benches/rust/dispatch.rs` uses in synchronous mode).
//!
//! - `async/add_4xf32_enqueue_per_op`: the host submits 10 000 adds, then
//!   synchronizes the stream; the time reported is that total divided by
//!   10 000, i.e. what one enqueued op costs the host when the stream's
//!   worker keeps up (its work included, since the batch ends with a
//!   synchronize).
//! - `async/add_4xf32_round_trip`: one add, then a stream synchronize: the
//!   latency of a lone op through the worker thread.
//! - `async/add_4xf32_alloc_launch_free`: what an eager `torch.add(a, b)`
//!   asks of the plugin: allocate the 16-byte output, launch the add into
//!   it, and free it at once (its add is usually still queued), per op, in
//!   batches of 10 000 ending with a synchronize.
//!
//! Run with `cargo bench -p torchfl-sim --bench launch`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::ffi::{c_void, CStr};
use std::hint::black_box;
use std::ptr::{self, null, null_mut};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use torchfl_ffi::*;

/// Adds per batch in the enqueue bench.
const BATCH: u32 = 10_000;

fn check(api: &TFL_PluginApi, status: *mut TFL_Error) {
    if !status.is_null() {
        // SAFETY: a non-NULL status is an error object of this plugin.
        let message = unsafe { CStr::from_ptr(api.error_message.unwrap()(status)) };
        panic!("sim call failed: {}", message.to_string_lossy());
    }
}

/// `resize_output` for a frame whose op never resizes.
unsafe extern "C" fn no_resize(_: *const TFL_CallFrame, _: usize, _: i32, _: *const i64) -> i32 {
    TFL_ERROR_UNIMPLEMENTED
}

fn bench_async(c: &mut Criterion) {
    // SAFETY: NULL host table: no host services.
    let api = unsafe { &*torchfl_sim::torch_fl_plugin_get_api(null()) };
    let options = c"mode=async;devices=1";
    let init = TFL_InitArgs { struct_size: struct_size!(TFL_InitArgs, options), options: options.as_ptr() };
    // SAFETY: valid arguments for the call.
    check(api, unsafe { api.initialize.unwrap()(&init) });

    let mut table = TFL_OpTable {
        struct_size: struct_size!(TFL_OpTable, entry_size),
        entries: null(),
        num_entries: 0,
        entry_size: 0,
    };
    // SAFETY: `table` is valid for writes.
    check(api, unsafe { api.get_op_table.unwrap()(&mut table) });
    let kernel = (0..table.num_entries)
        .map(|i| {
            // SAFETY: the table holds `num_entries` entries `entry_size` apart.
            unsafe { &*table.entries.cast::<u8>().add(i * table.entry_size).cast::<TFL_OpEntry>() }
        })
        // SAFETY: entry names are static C strings.
        .find(|e| unsafe { CStr::from_ptr(e.name) } == c"add.Tensor")
        .and_then(|e| e.kernel)
        .expect("sim implements add.Tensor");

    let mut stream: *mut TFL_Stream = null_mut();
    // SAFETY: `stream` is valid for a write.
    check(api, unsafe { api.default_stream.unwrap()(0, &mut stream) });
    let alloc = || {
        let mut p: *mut c_void = null_mut();
        // SAFETY: `p` is valid for a write; allocations are zeroed.
        check(api, unsafe { api.allocate.unwrap()(0, 16, &mut p) });
        p
    };
    let (a, b, out) = (alloc(), alloc(), alloc());

    let shape = [4i64];
    let strides = [1i64];
    let tensor = |data: *mut c_void| TFL_Tensor {
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
    let (ta, tb, mut tout) = (tensor(a), tensor(b), tensor(out));
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
        stream,
        args: args.as_ptr(),
        num_args: args.len(),
        outputs: outputs.as_ptr(),
        num_outputs: 1,
        resize_output: Some(no_resize),
        host_context: null_mut(),
        rng_seed: 0,
        rng_offset: 0,
    };
    let launch = || {
        // SAFETY: the frame describes three live 16-byte allocations of
        // device 0 and every pointer in it outlives the call.
        check(api, unsafe { kernel(black_box(&frame)) });
    };
    let synchronize = || {
        // SAFETY: the default stream of device 0.
        check(api, unsafe { api.stream_synchronize.unwrap()(stream) });
    };

    let mut group = c.benchmark_group("async");
    group.sample_size(30).measurement_time(Duration::from_secs(6));
    group.bench_function("add_4xf32_enqueue_per_op", |bench| {
        bench.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                for _ in 0..BATCH {
                    launch();
                }
                synchronize();
            }
            // Per op, not per batch.
            start.elapsed() / BATCH
        });
    });
    group.sample_size(100).measurement_time(Duration::from_secs(5));
    group.bench_function("add_4xf32_round_trip", |bench| {
        bench.iter(|| {
            launch();
            synchronize();
        });
    });
    // SAFETY (for the closures below): `out_slot` points to `tout`, which
    // the frame's output list names and which outlives the bench.
    let out_slot: *mut TFL_Tensor = outputs[0];
    let free = |p: *mut c_void| {
        // SAFETY: a live allocation of device 0, freed once.
        check(api, unsafe { api.deallocate.unwrap()(0, p) });
    };
    group.sample_size(30).measurement_time(Duration::from_secs(6));
    group.bench_function("add_4xf32_alloc_launch_free", |bench| {
        bench.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                for _ in 0..BATCH {
                    let fresh = alloc();
                    // SAFETY: see `out_slot`; nothing else accesses `tout`.
                    unsafe { (*out_slot).data = fresh };
                    launch();
                    free(fresh);
                }
                synchronize();
            }
            start.elapsed() / BATCH
        });
    });
    // SAFETY: see `out_slot`.
    unsafe { (*out_slot).data = out };
    group.finish();
}

criterion_group!(benches, bench_async);
criterion_main!(benches);

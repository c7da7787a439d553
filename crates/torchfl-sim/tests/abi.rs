//! The plugin through its C ABI: the bootstrap symbol, every table entry,
//! the op table and kernels called with real `TFL_CallFrame`s, against the
//! process-wide instance (initialized once per test binary). A second,
//! strict-mode instance is loaded from the built shared library with
//! `dlopen`, which also checks that every kernel symbol is exported.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::{Mutex, Once};

use torchfl_ffi::*;

mod common;
use common::st;

static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

unsafe extern "C" fn host_log(_ctx: *mut c_void, _level: i32, message: *const c_char) {
    let m = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
    LOG.lock().unwrap().push(m);
}

struct Host(TFL_HostApi);
unsafe impl Sync for Host {}
static HOST: Host = Host(TFL_HostApi {
    struct_size: 32,
    abi_major: 1,
    abi_minor: 0,
    context: null_mut(),
    log: Some(host_log),
});

fn api() -> &'static TFL_PluginApi {
    unsafe { &*torchfl_sim::torch_fl_plugin_get_api(&HOST.0) }
}

static INIT: Once = Once::new();

/// Checks the pre-initialization behaviour, then initializes (once).
fn init() -> &'static TFL_PluginApi {
    INIT.call_once(|| {
        let api = api();
        let mut n = 0;
        let e = st(api, unsafe { api.device_count.unwrap()(&mut n) }).unwrap_err();
        assert_eq!(e, (TFL_ERROR_FAILED_PRECONDITION, "sim: call initialize first".to_owned()));
        let bad = CString::new("devices=3;colour=red").unwrap();
        let args = TFL_InitArgs { struct_size: 16, options: bad.as_ptr() };
        let e = st(api, unsafe { api.initialize.unwrap()(&args) }).unwrap_err();
        assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT);
        assert!(e.1.contains("\"colour\""), "{}", e.1);
        let good = CString::new("devices=3;memory=64MiB").unwrap();
        let args = TFL_InitArgs { struct_size: 16, options: good.as_ptr() };
        st(api, unsafe { api.initialize.unwrap()(&args) }).unwrap();
        let e = st(api, unsafe { api.initialize.unwrap()(&args) }).unwrap_err();
        assert_eq!(e.0, TFL_ERROR_FAILED_PRECONDITION);
        assert!(LOG.lock().unwrap().iter().any(|m| m.contains("3 simulated device(s)")));
    });
    api()
}

#[test]
fn bootstrap_table_and_info() {
    let api = api();
    assert_eq!(api as *const _, unsafe { torchfl_sim::torch_fl_plugin_get_api(null()) });
    assert_eq!(api.struct_size, struct_size!(TFL_PluginApi, get_activity));
    assert_eq!((api.abi_major, api.abi_minor), (TFL_ABI_VERSION_MAJOR, TFL_ABI_VERSION_MINOR));
    assert!(api.event_elapsed_time.is_some() && api.memory_stats.is_some());
    assert!(api.reset_peak_memory_stats.is_some() && api.empty_cache.is_some());
    let info = unsafe { &*api.get_info.unwrap()() };
    let s = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned();
    assert_eq!(info.struct_size, struct_size!(TFL_PluginInfo, capabilities));
    assert_eq!(s(info.name), "sim");
    assert_eq!(s(info.vendor), "torch-fl project");
    assert_eq!(s(info.chip_family), "simulated");
    assert_eq!(s(info.plugin_version), env!("CARGO_PKG_VERSION"));
    assert_eq!(s(info.min_torch_version), "2.4");
    assert_ne!(info.capabilities & TFL_CAP_EVENT_TIMING, 0);
}

#[test]
fn op_table_entries() {
    let api = api(); // callable before initialize
    let mut table = TFL_OpTable {
        struct_size: struct_size!(TFL_OpTable, entry_size),
        entries: null(),
        num_entries: 0,
        entry_size: 0,
    };
    st(api, unsafe { api.get_op_table.unwrap()(&mut table) }).unwrap();
    assert_eq!(table.entry_size, struct_size!(TFL_OpEntry, infer_outputs));
    assert!(table.num_entries >= 35);
    let mut names = Vec::new();
    for i in 0..table.num_entries {
        let e = unsafe { &*(table.entries as *const u8).add(i * table.entry_size).cast::<TFL_OpEntry>() };
        assert_eq!(e.struct_size, struct_size!(TFL_OpEntry, infer_outputs));
        let name = unsafe { CStr::from_ptr(e.name) }.to_str().unwrap();
        let symbol = unsafe { CStr::from_ptr(e.symbol) }.to_str().unwrap();
        assert_eq!(symbol, kernel_symbol(name).unwrap());
        assert!(e.kernel.is_some());
        if parse_op_name(name).unwrap().namespace == "aten" {
            assert!(e.schema.is_null() && e.infer_outputs.is_none(), "{name}");
        } else {
            let schema = unsafe { CStr::from_ptr(e.schema) }.to_str().unwrap();
            assert!(schema.starts_with(name.trim_start_matches("sim::")), "{name}: {schema}");
            assert!(e.infer_outputs.is_some(), "{name}");
        }
        names.push(name.to_owned());
    }
    for custom in [
        "sim::fused_bias_gelu",
        "sim::fused_bias_gelu_backward",
        "sim::softmax_cross_entropy",
        "sim::softmax_cross_entropy_backward",
    ] {
        assert!(names.iter().any(|n| n == custom), "{custom}");
    }
    for required in
        ["add.Tensor", "add_.Tensor", "copy_", "sum.dim_IntList", "mean.dim", "mm", "relu_", "ge.Scalar"]
    {
        assert!(names.iter().any(|n| n == required), "{required}");
    }
}

fn tensor(
    data: *mut c_void,
    device_type: i32,
    dtype: TFL_DType,
    shape: &[i64],
    strides: &[i64],
) -> TFL_Tensor {
    TFL_Tensor {
        struct_size: struct_size!(TFL_Tensor, flags),
        data,
        byte_offset: 0,
        device_type,
        device_index: 0,
        dtype,
        ndim: shape.len() as i32,
        shape: shape.as_ptr(),
        strides: strides.as_ptr(),
        flags: 0,
    }
}

fn value_tensor(t: &TFL_Tensor) -> TFL_Value {
    TFL_Value {
        struct_size: struct_size!(TFL_Value, u),
        tag: TFL_VALUE_TENSOR,
        u: TFL_ValueUnion { tensor: t },
    }
}

fn value_scalar(kind: i32, v: TFL_ScalarValue) -> TFL_Value {
    TFL_Value {
        struct_size: struct_size!(TFL_Value, u),
        tag: TFL_VALUE_SCALAR,
        u: TFL_ValueUnion { scalar: TFL_Scalar { kind, v } },
    }
}

fn entry(api: &TFL_PluginApi, name: &str) -> &'static TFL_OpEntry {
    let mut table = TFL_OpTable { struct_size: 32, entries: null(), num_entries: 0, entry_size: 0 };
    st(api, unsafe { api.get_op_table.unwrap()(&mut table) }).unwrap();
    (0..table.num_entries)
        .map(|i| unsafe { &*(table.entries as *const u8).add(i * table.entry_size).cast::<TFL_OpEntry>() })
        .find(|e| unsafe { CStr::from_ptr(e.name) }.to_str().unwrap() == name)
        .unwrap()
}

fn kernel(api: &TFL_PluginApi, name: &str) -> TFL_KernelFn {
    entry(api, name).kernel.unwrap()
}

unsafe extern "C" fn no_resize(_: *const TFL_CallFrame, _: usize, _: i32, _: *const i64) -> i32 {
    0
}

#[test]
fn devices_memory_and_copies() {
    let api = init();
    let mut n = 0;
    st(api, unsafe { api.device_count.unwrap()(&mut n) }).unwrap();
    assert_eq!(n, 3);
    let e = st(api, unsafe { api.device_synchronize.unwrap()(5) }).unwrap_err();
    assert_eq!(e, (TFL_ERROR_INVALID_ARGUMENT, "sim: device 5 out of range (device_count = 3)".to_owned()));
    let e = st(api, unsafe { api.device_count.unwrap()(null_mut()) }).unwrap_err();
    assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT);

    // A 1.0 host's struct: the 1.2 fields lie beyond it and stay untouched.
    let mut props = TFL_DeviceProperties {
        struct_size: struct_size!(TFL_DeviceProperties, memory_alignment),
        name: null(),
        total_memory: 0,
        compute_units: 0,
        memory_alignment: 0,
        capability_major: -7,
        capability_minor: -7,
    };
    st(api, unsafe { api.device_properties.unwrap()(2, &mut props) }).unwrap();
    assert_eq!((props.total_memory, props.memory_alignment), (64 << 20, 64));
    assert!(!props.name.is_null());
    assert_eq!((props.capability_major, props.capability_minor), (-7, -7));
    // A 1.2 host's struct gets the architecture revision.
    props.struct_size = struct_size!(TFL_DeviceProperties, capability_minor);
    st(api, unsafe { api.device_properties.unwrap()(2, &mut props) }).unwrap();
    assert_eq!((props.capability_major, props.capability_minor), (1, 0));

    // allocate, OOM with stats, 0-byte
    let mut p: *mut c_void = null_mut();
    st(api, unsafe { api.allocate.unwrap()(2, 4096, &mut p) }).unwrap();
    let mut untouched: *mut c_void = 0x1234 as *mut c_void;
    let e = st(api, unsafe { api.allocate.unwrap()(2, 65 << 20, &mut untouched) }).unwrap_err();
    assert_eq!(e.0, TFL_ERROR_OUT_OF_MEMORY);
    assert_eq!(untouched as usize, 0x1234, "outputs untouched on failure");
    let mut z: *mut c_void = null_mut();
    st(api, unsafe { api.allocate.unwrap()(2, 0, &mut z) }).unwrap();
    assert!(!z.is_null() && z != p);
    let mut stats =
        TFL_MemoryStats { struct_size: struct_size!(TFL_MemoryStats, num_ooms), ..Default::default() };
    st(api, unsafe { api.memory_stats.unwrap()(2, &mut stats) }).unwrap();
    assert_eq!(
        (stats.allocated_bytes, stats.total_bytes, stats.num_allocations, stats.num_ooms),
        (4096, 64 << 20, 2, 1)
    );
    // an older host's shorter struct: later fields are not written
    let mut short = TFL_MemoryStats {
        struct_size: struct_size!(TFL_MemoryStats, reserved_bytes),
        num_ooms: 77,
        ..Default::default()
    };
    st(api, unsafe { api.memory_stats.unwrap()(2, &mut short) }).unwrap();
    assert_eq!((short.reserved_bytes, short.num_ooms), (4096, 77));
    st(api, unsafe { api.reset_peak_memory_stats.unwrap()(2) }).unwrap();
    st(api, unsafe { api.empty_cache.unwrap()(2) }).unwrap();

    // H2D async on the default stream, D2H synchronous
    let mut s: *mut TFL_Stream = null_mut();
    st(api, unsafe { api.default_stream.unwrap()(2, &mut s) }).unwrap();
    let src: Vec<u8> = (0..=255).collect();
    let mut args = TFL_CopyArgs {
        struct_size: 56,
        kind: TFL_COPY_HOST_TO_DEVICE,
        dst_device: 2,
        src_device: 0,
        dst: p,
        src: src.as_ptr().cast(),
        nbytes: 256,
        stream: s,
    };
    st(api, unsafe { api.copy.unwrap()(&args) }).unwrap();
    st(api, unsafe { api.set_memory.unwrap()(2, p.cast::<u8>().add(8).cast(), 0xEE, 8, s) }).unwrap();
    let mut back = vec![0u8; 256];
    args = TFL_CopyArgs {
        kind: TFL_COPY_DEVICE_TO_HOST,
        dst_device: 0,
        src_device: 2,
        dst: back.as_mut_ptr().cast(),
        src: p,
        stream: null_mut(),
        ..args
    };
    st(api, unsafe { api.copy.unwrap()(&args) }).unwrap();
    assert_eq!(back[..8], src[..8]);
    assert_eq!(back[8..16], [0xEE; 8]);
    assert_eq!(back[16..], src[16..]);
    args.nbytes = 4097;
    let e = st(api, unsafe { api.copy.unwrap()(&args) }).unwrap_err();
    assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT);

    st(api, unsafe { api.deallocate.unwrap()(2, p) }).unwrap();
    st(api, unsafe { api.deallocate.unwrap()(2, z) }).unwrap();
    st(api, unsafe { api.deallocate.unwrap()(2, null_mut()) }).unwrap();
    let e = st(api, unsafe { api.deallocate.unwrap()(2, p) }).unwrap_err();
    assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT);
}

#[test]
fn streams_and_events() {
    let api = init();
    let mut s: *mut TFL_Stream = null_mut();
    st(api, unsafe { api.stream_create.unwrap()(1, 0, &mut s) }).unwrap();
    let (mut e0, mut e1, mut plain): (*mut TFL_Event, *mut TFL_Event, *mut TFL_Event) =
        (null_mut(), null_mut(), null_mut());
    st(api, unsafe { api.event_create.unwrap()(1, TFL_EVENT_TIMING, &mut e0) }).unwrap();
    st(api, unsafe { api.event_create.unwrap()(1, TFL_EVENT_TIMING, &mut e1) }).unwrap();
    st(api, unsafe { api.event_create.unwrap()(1, TFL_EVENT_DEFAULT, &mut plain) }).unwrap();
    let mut done = 0u8;
    st(api, unsafe { api.event_query.unwrap()(e0, &mut done) }).unwrap();
    assert_eq!(done, 1);
    let mut p: *mut c_void = null_mut();
    st(api, unsafe { api.allocate.unwrap()(1, 8 << 20, &mut p) }).unwrap();
    st(api, unsafe { api.event_record.unwrap()(e0, s) }).unwrap();
    for v in 0..8u8 {
        st(api, unsafe { api.set_memory.unwrap()(1, p, v, 8 << 20, s) }).unwrap();
    }
    st(api, unsafe { api.event_record.unwrap()(e1, s) }).unwrap();
    st(api, unsafe { api.event_record.unwrap()(plain, s) }).unwrap();
    // Another stream waits for the event without blocking the host.
    let mut s2: *mut TFL_Stream = null_mut();
    st(api, unsafe { api.stream_create.unwrap()(1, -1, &mut s2) }).unwrap();
    st(api, unsafe { api.stream_wait_event.unwrap()(s2, e1) }).unwrap();
    st(api, unsafe { api.set_memory.unwrap()(1, p, 9, 1, s2) }).unwrap();
    st(api, unsafe { api.stream_synchronize.unwrap()(s2) }).unwrap();
    st(api, unsafe { api.event_query.unwrap()(e1, &mut done) }).unwrap();
    assert_eq!(done, 1, "s2's wait implies e1 completed");
    let mut first = [0u8; 2];
    let args = TFL_CopyArgs {
        struct_size: 56,
        kind: TFL_COPY_DEVICE_TO_HOST,
        dst_device: 0,
        src_device: 1,
        dst: first.as_mut_ptr().cast(),
        src: p,
        nbytes: 2,
        stream: null_mut(),
    };
    st(api, unsafe { api.copy.unwrap()(&args) }).unwrap();
    assert_eq!(first, [9, 7]);
    let mut ms = -1.0f32;
    st(api, unsafe { api.event_synchronize.unwrap()(e1) }).unwrap();
    st(api, unsafe { api.event_elapsed_time.unwrap()(e0, e1, &mut ms) }).unwrap();
    assert!(ms > 0.0);
    let mut untouched = -5.0f32;
    let e = st(api, unsafe { api.event_elapsed_time.unwrap()(e0, plain, &mut untouched) }).unwrap_err();
    assert_eq!(e.0, TFL_ERROR_FAILED_PRECONDITION);
    assert_eq!(untouched, -5.0);
    st(api, unsafe { api.stream_query.unwrap()(s, &mut done) }).unwrap();
    assert_eq!(done, 1);
    // default streams cannot be destroyed; unknown handles are refused
    let mut d: *mut TFL_Stream = null_mut();
    st(api, unsafe { api.default_stream.unwrap()(1, &mut d) }).unwrap();
    assert_eq!(st(api, unsafe { api.stream_destroy.unwrap()(d) }).unwrap_err().0, TFL_ERROR_INVALID_ARGUMENT);
    for h in [s, s2] {
        st(api, unsafe { api.stream_destroy.unwrap()(h) }).unwrap();
    }
    assert_eq!(
        st(api, unsafe { api.stream_synchronize.unwrap()(s) }).unwrap_err().0,
        TFL_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        st(api, unsafe { api.stream_synchronize.unwrap()(0xdead0 as *mut TFL_Stream) }).unwrap_err().0,
        TFL_ERROR_INVALID_ARGUMENT
    );
    for ev in [e0, e1, plain] {
        st(api, unsafe { api.event_destroy.unwrap()(ev) }).unwrap();
    }
    st(api, unsafe { api.device_synchronize.unwrap()(1) }).unwrap();
    st(api, unsafe { api.deallocate.unwrap()(1, p) }).unwrap();
}

#[test]
fn kernels_through_call_frames() {
    let api = init();
    let mut stream: *mut TFL_Stream = null_mut();
    st(api, unsafe { api.default_stream.unwrap()(0, &mut stream) }).unwrap();
    let (mut a, mut out): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
    st(api, unsafe { api.allocate.unwrap()(0, 24, &mut a) }).unwrap();
    st(api, unsafe { api.allocate.unwrap()(0, 24, &mut out) }).unwrap();
    let host: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let copy = TFL_CopyArgs {
        struct_size: 56,
        kind: TFL_COPY_HOST_TO_DEVICE,
        dst_device: 0,
        src_device: 0,
        dst: a,
        src: host.as_ptr().cast(),
        nbytes: 24,
        stream: null_mut(),
    };
    st(api, unsafe { api.copy.unwrap()(&copy) }).unwrap();

    // out = a.t() + 0-dim host double 0.5 * alpha 2, with a transposed view
    let (shape, strides_t) = ([3i64, 2], [1i64, 3]);
    let at = tensor(a, TFL_DEVICE_PLUGIN, TFL_DType::F32, &shape, &strides_t);
    let half_value = 0.5f64;
    let hs = tensor((&half_value as *const f64).cast_mut().cast(), TFL_DEVICE_HOST, TFL_DType::F64, &[], &[]);
    let contiguous = [2i64, 1];
    let mut o = tensor(out, TFL_DEVICE_PLUGIN, TFL_DType::F32, &shape, &contiguous);
    let values =
        [value_tensor(&at), value_tensor(&hs), value_scalar(TFL_SCALAR_INT, TFL_ScalarValue { i: 2 })];
    let arg_ptrs: Vec<*const TFL_Value> = values.iter().map(|v| v as *const _).collect();
    let outs: Vec<*mut TFL_Tensor> = vec![&mut o];
    let name = CString::new("add.Tensor").unwrap();
    let frame = TFL_CallFrame {
        struct_size: struct_size!(TFL_CallFrame, rng_offset),
        op_name: name.as_ptr(),
        device_index: 0,
        stream,
        args: arg_ptrs.as_ptr(),
        num_args: arg_ptrs.len(),
        outputs: outs.as_ptr(),
        num_outputs: 1,
        resize_output: Some(no_resize as TFL_ResizeOutputFn),
        host_context: null_mut(),
        rng_seed: 0,
        rng_offset: 0,
    };
    let add = kernel(api, "add.Tensor");
    st(api, unsafe { add(&frame) }).unwrap();
    let mut result = vec![0f32; 6];
    let back =
        TFL_CopyArgs { kind: TFL_COPY_DEVICE_TO_HOST, dst: result.as_mut_ptr().cast(), src: out, ..copy };
    st(api, unsafe { api.copy.unwrap()(&back) }).unwrap();
    assert_eq!(result, vec![2.0, 5.0, 3.0, 6.0, 4.0, 7.0]);

    // shape mismatch: INVALID_ARGUMENT with the op name
    let bad_shape = [3i64, 3];
    let mut bad = tensor(out, TFL_DEVICE_PLUGIN, TFL_DType::F32, &bad_shape, &[3, 1]);
    let outs_bad: Vec<*mut TFL_Tensor> = vec![&mut bad];
    let f2 = TFL_CallFrame { outputs: outs_bad.as_ptr(), ..frame };
    let e = st(api, unsafe { add(&f2) }).unwrap_err();
    assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT);
    assert!(e.1.starts_with("sim: add.Tensor:"), "{}", e.1);
    // complex dtype: UNIMPLEMENTED (the host falls back to CPU)
    let cplx = tensor(a, TFL_DEVICE_PLUGIN, TFL_DType::new(TFL_DTYPE_COMPLEX, 64), &shape, &strides_t);
    let v2 = [value_tensor(&cplx), values[1], values[2]];
    let p2: Vec<*const TFL_Value> = v2.iter().map(|v| v as *const _).collect();
    let f3 = TFL_CallFrame { args: p2.as_ptr(), ..frame };
    assert_eq!(st(api, unsafe { add(&f3) }).unwrap_err().0, TFL_ERROR_UNIMPLEMENTED);
    // an unknown value tag
    let mut odd = values[2];
    odd.tag = 99;
    let v3 = [values[0], values[1], odd];
    let p3: Vec<*const TFL_Value> = v3.iter().map(|v| v as *const _).collect();
    let f4 = TFL_CallFrame { args: p3.as_ptr(), ..frame };
    let e = st(api, unsafe { add(&f4) }).unwrap_err();
    assert!(e.0 == TFL_ERROR_INVALID_ARGUMENT && e.1.contains("tag 99"), "{e:?}");
    // a device index out of range in the frame, and a NULL frame
    let f5 = TFL_CallFrame { device_index: 7, ..frame };
    let e = st(api, unsafe { add(&f5) }).unwrap_err();
    assert!(e.1.contains("device 7 out of range"), "{}", e.1);
    assert_eq!(st(api, unsafe { add(null()) }).unwrap_err().0, TFL_ERROR_INVALID_ARGUMENT);
    // the sum of the result through `sum` with a None dtype
    let mut total: *mut c_void = null_mut();
    st(api, unsafe { api.allocate.unwrap()(0, 4, &mut total) }).unwrap();
    let mut tt = tensor(total, TFL_DEVICE_PLUGIN, TFL_DType::F32, &[], &[]);
    let ot = tensor(out, TFL_DEVICE_PLUGIN, TFL_DType::F32, &shape, &contiguous);
    let none = TFL_Value {
        struct_size: struct_size!(TFL_Value, u),
        tag: TFL_VALUE_NONE,
        u: TFL_ValueUnion { i: 0 },
    };
    let sv = [value_tensor(&ot), none];
    let sp: Vec<*const TFL_Value> = sv.iter().map(|v| v as *const _).collect();
    let so: Vec<*mut TFL_Tensor> = vec![&mut tt];
    let sum_name = CString::new("sum").unwrap();
    let fs = TFL_CallFrame {
        op_name: sum_name.as_ptr(),
        args: sp.as_ptr(),
        num_args: 2,
        outputs: so.as_ptr(),
        ..frame
    };
    st(api, unsafe { kernel(api, "sum")(&fs) }).unwrap();
    let mut s = 0f32;
    let back = TFL_CopyArgs {
        kind: TFL_COPY_DEVICE_TO_HOST,
        dst: (&mut s as *mut f32).cast(),
        src: total,
        nbytes: 4,
        ..copy
    };
    st(api, unsafe { api.copy.unwrap()(&back) }).unwrap();
    assert_eq!(s, 27.0);
    for p in [a, out, total] {
        st(api, unsafe { api.deallocate.unwrap()(0, p) }).unwrap();
    }
}

fn output_meta(struct_size: usize) -> TFL_OutputMeta {
    TFL_OutputMeta {
        struct_size,
        dtype: TFL_DType::new(TFL_DTYPE_INT, 8),
        ndim: -1,
        shape: [-1; TFL_MAX_OUTPUT_DIMS],
    }
}

/// A custom operator through its op-table entry: `infer_outputs` on a frame
/// without data or stream (as torch.compile's tracing calls it), then the
/// kernel on the outputs allocated from its answer.
#[test]
fn custom_operator_infer_outputs_and_kernel() {
    let api = init();
    let e = entry(api, "sim::fused_bias_gelu_backward");
    let infer = e.infer_outputs.unwrap();
    let schema = unsafe { CStr::from_ptr(e.schema) }.to_str().unwrap();
    assert_eq!(schema, "fused_bias_gelu_backward(Tensor grad, Tensor x, Tensor bias) -> (Tensor, Tensor)");

    let (xs, xst, bs, bst) = ([2i64, 3], [3i64, 1], [3i64], [1i64]);
    let meta_x = tensor(null_mut(), TFL_DEVICE_PLUGIN, TFL_DType::F32, &xs, &xst);
    let meta_b = tensor(null_mut(), TFL_DEVICE_PLUGIN, TFL_DType::F32, &bs, &bst);
    let values = [value_tensor(&meta_x), value_tensor(&meta_x), value_tensor(&meta_b)];
    let ptrs: Vec<*const TFL_Value> = values.iter().map(|v| v as *const _).collect();
    let frame = TFL_CallFrame {
        struct_size: struct_size!(TFL_CallFrame, rng_offset),
        op_name: null(),
        device_index: 0,
        stream: null_mut(),
        args: ptrs.as_ptr(),
        num_args: 3,
        outputs: null(),
        num_outputs: 0,
        resize_output: Some(no_resize as TFL_ResizeOutputFn),
        host_context: null_mut(),
        rng_seed: 0,
        rng_offset: 0,
    };
    let full = struct_size!(TFL_OutputMeta, shape);
    let mut out = [output_meta(full), output_meta(full)];
    st(api, unsafe { infer(&frame, out.as_mut_ptr(), 2) }).unwrap();
    assert_eq!((out[0].dtype, out[0].ndim, &out[0].shape[..3]), (TFL_DType::F32, 2, &[2i64, 3, 0][..]));
    assert_eq!((out[1].dtype, out[1].ndim, out[1].shape[0]), (TFL_DType::F32, 1, 3));
    assert_eq!(out[0].struct_size, full, "struct_size is left as the host set it");

    // A host whose struct_size covers only dtype: nothing else is written.
    let short = struct_size!(TFL_OutputMeta, dtype);
    let mut out = [output_meta(short), output_meta(full)];
    st(api, unsafe { infer(&frame, out.as_mut_ptr(), 2) }).unwrap();
    assert_eq!((out[0].dtype, out[0].ndim, out[0].shape[0]), (TFL_DType::F32, -1, -1));
    assert_eq!(out[1].ndim, 1);

    // Errors: INVALID_ARGUMENT with the operator and the shapes, and the
    // outputs untouched.
    let bad_b = tensor(null_mut(), TFL_DEVICE_PLUGIN, TFL_DType::F32, &[2], &[1]);
    let bad_values = [values[0], values[1], value_tensor(&bad_b)];
    let bad_ptrs: Vec<*const TFL_Value> = bad_values.iter().map(|v| v as *const _).collect();
    let mut out = [output_meta(full), output_meta(full)];
    let bad = TFL_CallFrame { args: bad_ptrs.as_ptr(), ..frame };
    let err = st(api, unsafe { infer(&bad, out.as_mut_ptr(), 2) }).unwrap_err();
    assert_eq!(err.0, TFL_ERROR_INVALID_ARGUMENT);
    assert!(err.1.starts_with("sim: sim::fused_bias_gelu_backward: bias must be 1-D"), "{}", err.1);
    assert!(err.1.contains("[2]") && err.1.contains("[2, 3]"), "{}", err.1);
    assert_eq!(out[0].ndim, -1);
    let err = st(api, unsafe { infer(&frame, out.as_mut_ptr(), 1) }).unwrap_err();
    assert!(err.0 == TFL_ERROR_INVALID_ARGUMENT && err.1.contains("given 1 output(s)"), "{err:?}");
    assert_eq!(out[0].ndim, -1);
    let err = st(api, unsafe { infer(&frame, null_mut(), 2) }).unwrap_err();
    assert_eq!(err.0, TFL_ERROR_INVALID_ARGUMENT);
    assert_eq!(
        st(api, unsafe { infer(null(), out.as_mut_ptr(), 2) }).unwrap_err().0,
        TFL_ERROR_INVALID_ARGUMENT
    );
    let i64_x = tensor(null_mut(), TFL_DEVICE_PLUGIN, TFL_DType::new(TFL_DTYPE_INT, 64), &xs, &xst);
    let i64_b = tensor(null_mut(), TFL_DEVICE_PLUGIN, TFL_DType::new(TFL_DTYPE_INT, 64), &bs, &bst);
    let int_values = [value_tensor(&i64_x), value_tensor(&i64_x), value_tensor(&i64_b)];
    let int_ptrs: Vec<*const TFL_Value> = int_values.iter().map(|v| v as *const _).collect();
    let ints = TFL_CallFrame { args: int_ptrs.as_ptr(), ..frame };
    assert_eq!(st(api, unsafe { infer(&ints, out.as_mut_ptr(), 2) }).unwrap_err().0, TFL_ERROR_UNIMPLEMENTED);

    // The kernel on real memory: x rows equal -bias, so u = 0, gelu'(0) =
    // 1/2, grad_x = grad / 2 and grad_bias the column sums of that.
    let mut stream: *mut TFL_Stream = null_mut();
    st(api, unsafe { api.default_stream.unwrap()(0, &mut stream) }).unwrap();
    let mut bufs = [null_mut::<c_void>(); 5];
    for (p, n) in bufs.iter_mut().zip([24usize, 24, 12, 24, 12]) {
        st(api, unsafe { api.allocate.unwrap()(0, n, p) }).unwrap();
    }
    let [g, x, b, gx, gb] = bufs;
    let upload = |dst: *mut c_void, v: &[f32]| {
        let c = TFL_CopyArgs {
            struct_size: 56,
            kind: TFL_COPY_HOST_TO_DEVICE,
            dst_device: 0,
            src_device: 0,
            dst,
            src: v.as_ptr().cast(),
            nbytes: v.len() * 4,
            stream: null_mut(),
        };
        st(api, unsafe { api.copy.unwrap()(&c) }).unwrap();
    };
    upload(g, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    upload(x, &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    upload(b, &[-1.0, -2.0, -3.0]);
    let tg = tensor(g, TFL_DEVICE_PLUGIN, TFL_DType::F32, &xs, &xst);
    let tx = tensor(x, TFL_DEVICE_PLUGIN, TFL_DType::F32, &xs, &xst);
    let tb = tensor(b, TFL_DEVICE_PLUGIN, TFL_DType::F32, &bs, &bst);
    let mut tgx = tensor(gx, TFL_DEVICE_PLUGIN, TFL_DType::F32, &xs, &xst);
    let mut tgb = tensor(gb, TFL_DEVICE_PLUGIN, TFL_DType::F32, &bs, &bst);
    let run_values = [value_tensor(&tg), value_tensor(&tx), value_tensor(&tb)];
    let run_ptrs: Vec<*const TFL_Value> = run_values.iter().map(|v| v as *const _).collect();
    let outs: Vec<*mut TFL_Tensor> = vec![&mut tgx, &mut tgb];
    let run =
        TFL_CallFrame { stream, args: run_ptrs.as_ptr(), outputs: outs.as_ptr(), num_outputs: 2, ..frame };
    st(api, unsafe { e.kernel.unwrap()(&run) }).unwrap();
    st(api, unsafe { api.device_synchronize.unwrap()(0) }).unwrap();
    let download = |src: *mut c_void, n: usize| {
        let mut v = vec![0f32; n];
        let c = TFL_CopyArgs {
            struct_size: 56,
            kind: TFL_COPY_DEVICE_TO_HOST,
            dst_device: 0,
            src_device: 0,
            dst: v.as_mut_ptr().cast(),
            src,
            nbytes: n * 4,
            stream: null_mut(),
        };
        st(api, unsafe { api.copy.unwrap()(&c) }).unwrap();
        v
    };
    let close = |got: Vec<f32>, exp: &[f32]| {
        assert!(got.iter().zip(exp).all(|(a, b)| (a - b).abs() < 1e-5), "{got:?} vs {exp:?}");
    };
    close(download(gx, 6), &[0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
    close(download(gb, 3), &[2.5, 3.5, 4.5]);
    for p in bufs {
        st(api, unsafe { api.deallocate.unwrap()(0, p) }).unwrap();
    }
}

/// Builds the plugin's shared library with the cargo running these tests
/// (`cargo test` builds only the rlib; a no-op when up to date, and never a
/// stale library) and returns its path.
fn cdylib() -> std::path::PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let _once = BUILD.lock().unwrap();
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let target_dir = profile_dir.parent().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO"));
    cmd.args(["build", "--quiet", "-p", "torchfl-sim", "--lib"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TARGET_DIR", target_dir);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().unwrap();
    assert!(status.success(), "building the cdylib failed");
    let name = format!("{}torchfl_sim{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let lib = profile_dir.join(name);
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

/// Loads the built shared library: its exports match its op table, and as
/// an independent instance it can run in strict mode.
#[test]
fn shared_library_exports_and_strict_instance() {
    let lib = cdylib();
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null());
    let sym = |name: &str| {
        let c = CString::new(name).unwrap();
        unsafe { libc::dlsym(handle, c.as_ptr()) }
    };
    let get_api: TFL_GetPluginApiFn = unsafe { std::mem::transmute(sym(TFL_BOOTSTRAP_SYMBOL)) };
    let api = unsafe { &*get_api(null()) };
    let mut table = TFL_OpTable { struct_size: 32, entries: null(), num_entries: 0, entry_size: 0 };
    st(api, unsafe { api.get_op_table.unwrap()(&mut table) }).unwrap();
    for i in 0..table.num_entries {
        let e = unsafe { &*(table.entries as *const u8).add(i * table.entry_size).cast::<TFL_OpEntry>() };
        let symbol = unsafe { CStr::from_ptr(e.symbol) }.to_str().unwrap();
        assert_eq!(sym(symbol) as usize, e.kernel.unwrap() as usize, "{symbol} is the table's function");
    }
    let opts = CString::new("strict=1;devices=2;mode=sync").unwrap();
    let args = TFL_InitArgs { struct_size: 16, options: opts.as_ptr() };
    st(api, unsafe { api.initialize.unwrap()(&args) }).unwrap();
    let info = unsafe { &*api.get_info.unwrap()() };
    assert_eq!(info.capabilities & TFL_CAP_HOST_ADDRESSABLE_MEMORY, 0);
    assert_eq!(info.capabilities & TFL_CAP_ASYNC_STREAMS, 0);
    let (mut p0, mut p1): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
    st(api, unsafe { api.allocate.unwrap()(0, 64, &mut p0) }).unwrap();
    st(api, unsafe { api.allocate.unwrap()(1, 64, &mut p1) }).unwrap();
    assert_eq!((p0 as u64 >> 48) & 0xFF, 0xA0);
    assert_eq!((p1 as u64 >> 48) & 0xFF, 0xA1);
    let e = st(api, unsafe { api.set_memory.unwrap()(0, p1, 0, 4, null_mut()) }).unwrap_err();
    assert!(e.1.contains("belongs to device 1"), "{}", e.1);
    // base + offset arithmetic on a tagged pointer works
    st(api, unsafe { api.set_memory.unwrap()(0, p0.cast::<u8>().add(32).cast(), 5, 32, null_mut()) })
        .unwrap();
    let mut back = [0u8; 64];
    let c = TFL_CopyArgs {
        struct_size: 56,
        kind: TFL_COPY_DEVICE_TO_HOST,
        dst_device: 0,
        src_device: 0,
        dst: back.as_mut_ptr().cast(),
        src: p0,
        nbytes: 64,
        stream: null_mut(),
    };
    st(api, unsafe { api.copy.unwrap()(&c) }).unwrap();
    assert!(back[..32].iter().all(|&b| b == 0) && back[32..].iter().all(|&b| b == 5));
}

/// Two copies of the plugin loaded with `RTLD_GLOBAL`: each op table must
/// point at its own copy's kernels (no interposition through the GOT).
#[test]
fn kernels_bind_locally_under_rtld_global() {
    let original = cdylib();
    let name = original.file_name().unwrap().to_str().unwrap().to_owned();
    let copy = std::env::temp_dir().join(format!("interpose-{}-{name}", std::process::id()));
    std::fs::copy(&original, &copy).unwrap();
    let mut tables = Vec::new();
    for path in [&original, &copy] {
        let c = CString::new(path.to_str().unwrap()).unwrap();
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        assert!(!handle.is_null());
        let boot = CString::new(TFL_BOOTSTRAP_SYMBOL).unwrap();
        let get_api: TFL_GetPluginApiFn = unsafe { std::mem::transmute(libc::dlsym(handle, boot.as_ptr())) };
        let api = unsafe { &*get_api(null()) };
        let mut table = TFL_OpTable { struct_size: 32, entries: null(), num_entries: 0, entry_size: 0 };
        st(api, unsafe { api.get_op_table.unwrap()(&mut table) }).unwrap();
        tables.push((handle, table));
    }
    let _ = std::fs::remove_file(&copy);
    let (handle, table) = tables[1];
    for i in 0..table.num_entries {
        let e = unsafe { &*(table.entries as *const u8).add(i * table.entry_size).cast::<TFL_OpEntry>() };
        // dlsym on a handle searches that object first.
        let own = unsafe { libc::dlsym(handle, e.symbol) };
        assert_eq!(own as usize, e.kernel.unwrap() as usize, "{:?}", unsafe { CStr::from_ptr(e.symbol) });
        let first =
            unsafe { &*(tables[0].1.entries as *const u8).add(i * table.entry_size).cast::<TFL_OpEntry>() };
        assert_ne!(first.kernel.unwrap() as usize, e.kernel.unwrap() as usize);
    }
}

//! Activity records and ranges (ABI 1.8) through the C ABI: enabling,
//! correlation, draining, the device clock, graphs and ranges, against this
//! test binary's own process-wide instance. One test, in steps: the enabled
//! kinds and the staged records are process-wide.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};

use torchfl_ffi::*;

mod common;
use common::st;

const N: usize = 4096;
const BYTES: usize = N * 4;

fn api() -> &'static TFL_PluginApi {
    unsafe { &*torchfl_sim::torch_fl_plugin_get_api(null()) }
}

fn text(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a.iter().map(|&c| c as u8).collect();
    let end = bytes.iter().position(|&b| b == 0).expect("NUL-terminated");
    String::from_utf8(bytes[..end].to_vec()).unwrap()
}

/// A drained record, copied out.
#[derive(Debug, Clone)]
struct Rec {
    kind: u32,
    host_clock: bool,
    device: i32,
    stream: usize,
    correlation: u64,
    start: u64,
    end: u64,
    name: String,
    detail: String,
}

fn activity_table(api: &TFL_PluginApi) -> TFL_Activity {
    let mut t = TFL_Activity::empty(struct_size!(TFL_Activity, range_mark));
    st(api, unsafe { api.get_activity.unwrap()(&mut t) }).unwrap();
    t
}

/// Everything staged, through the host's own loop (drain until fewer than
/// the capacity come back), with every record checked.
fn drain(api: &TFL_PluginApi, t: &TFL_Activity) -> (Vec<Rec>, u64) {
    let mut out = Vec::new();
    let mut dropped_total = 0;
    loop {
        let mut buf = [TFL_ActivityRecord::zeroed(); 8];
        let (mut written, mut dropped) = (usize::MAX, u64::MAX);
        let size = std::mem::size_of::<TFL_ActivityRecord>();
        st(api, unsafe {
            t.activity_drain.unwrap()(buf.as_mut_ptr(), size, buf.len(), &mut written, &mut dropped)
        })
        .unwrap();
        dropped_total += dropped;
        for r in &buf[..written] {
            assert_eq!(r.struct_size, 248);
            assert_eq!(r.reserved, 0);
            assert!(r.end_ns >= r.start_ns, "{r:?}");
            assert_eq!(r.flags & !TFL_ACTIVITY_HOST_CLOCK, 0);
            out.push(Rec {
                kind: r.kind,
                host_clock: r.flags & TFL_ACTIVITY_HOST_CLOCK != 0,
                device: r.device,
                stream: r.stream as usize,
                correlation: r.correlation_id,
                start: r.start_ns,
                end: r.end_ns,
                name: text(&r.name),
                detail: text(&r.detail),
            });
        }
        if written < buf.len() {
            return (out, dropped_total);
        }
    }
}

fn find<'a>(records: &'a [Rec], kind: u32, name: &str) -> Vec<&'a Rec> {
    records.iter().filter(|r| r.kind == kind && r.name == name).collect()
}

fn one<'a>(records: &'a [Rec], kind: u32, name: &str) -> &'a Rec {
    let found = find(records, kind, name);
    assert_eq!(found.len(), 1, "{kind} {name}: {records:#?}");
    found[0]
}

fn tensor(data: *mut c_void, shape: &[i64], strides: &[i64]) -> TFL_Tensor {
    TFL_Tensor {
        struct_size: struct_size!(TFL_Tensor, flags),
        data,
        byte_offset: 0,
        device_type: TFL_DEVICE_PLUGIN,
        device_index: 0,
        dtype: TFL_DType::F32,
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

fn add_kernel(api: &TFL_PluginApi) -> TFL_KernelFn {
    let mut table = TFL_OpTable { struct_size: 32, entries: null(), num_entries: 0, entry_size: 0 };
    st(api, unsafe { api.get_op_table.unwrap()(&mut table) }).unwrap();
    (0..table.num_entries)
        .map(|i| unsafe { &*(table.entries as *const u8).add(i * table.entry_size).cast::<TFL_OpEntry>() })
        .find(|e| unsafe { CStr::from_ptr(e.name) }.to_str().unwrap() == "add.Tensor")
        .and_then(|e| e.kernel)
        .unwrap()
}

/// `out = a + b` on `stream`, all of 4096 f32. The frame lives for the
/// call only unless `keep` (a graph capture keeps it).
struct AddFrame {
    _shape: Box<[i64; 1]>,
    _strides: Box<[i64; 1]>,
    _inputs: Box<[TFL_Tensor; 2]>,
    _values: Box<[TFL_Value; 2]>,
    _arg_ptrs: Box<[*const TFL_Value; 2]>,
    _out: Box<TFL_Tensor>,
    _out_ptrs: Box<[*mut TFL_Tensor; 1]>,
    _name: CString,
    frame: Box<TFL_CallFrame>,
}

fn add_frame(a: *mut c_void, b: *mut c_void, out: *mut c_void, stream: *mut TFL_Stream) -> AddFrame {
    let shape = Box::new([N as i64]);
    let strides = Box::new([1i64]);
    let inputs = Box::new([tensor(a, &shape[..], &strides[..]), tensor(b, &shape[..], &strides[..])]);
    let values = Box::new([value_tensor(&inputs[0]), value_tensor(&inputs[1])]);
    let arg_ptrs = Box::new([&values[0] as *const TFL_Value, &values[1]]);
    let mut out = Box::new(tensor(out, &shape[..], &strides[..]));
    let out_ptrs = Box::new([&mut *out as *mut TFL_Tensor]);
    let name = CString::new("add.Tensor").unwrap();
    let frame = Box::new(TFL_CallFrame {
        struct_size: struct_size!(TFL_CallFrame, rng_offset),
        op_name: name.as_ptr(),
        device_index: 0,
        stream,
        args: arg_ptrs.as_ptr(),
        num_args: 2,
        outputs: out_ptrs.as_ptr(),
        num_outputs: 1,
        resize_output: None,
        host_context: null_mut(),
        rng_seed: 0,
        rng_offset: 0,
    });
    AddFrame {
        _shape: shape,
        _strides: strides,
        _inputs: inputs,
        _values: values,
        _arg_ptrs: arg_ptrs,
        _out: out,
        _out_ptrs: out_ptrs,
        _name: name,
        frame,
    }
}

fn copy_args(
    kind: i32,
    dst: *mut c_void,
    src: *const c_void,
    nbytes: usize,
    stream: *mut TFL_Stream,
) -> TFL_CopyArgs {
    TFL_CopyArgs {
        struct_size: struct_size!(TFL_CopyArgs, stream),
        kind,
        dst_device: 0,
        src_device: 0,
        dst,
        src: src.cast_mut(),
        nbytes,
        stream,
    }
}

/// `device_ns` on the host's clock, through a fresh `activity_clock` pair.
fn to_host(api: &TFL_PluginApi, t: &TFL_Activity, device_ns: u64) -> i128 {
    let (mut d, mut h) = (0u64, 0u64);
    st(api, unsafe { t.activity_clock.unwrap()(0, &mut d, &mut h) }).unwrap();
    i128::from(device_ns) - i128::from(d) + i128::from(h)
}

#[test]
fn activity_records_through_the_abi() {
    let api = api();
    assert_eq!(api.struct_size, struct_size!(TFL_PluginApi, get_activity));
    assert_eq!(api.abi_minor, 8);
    let mut early = TFL_Activity::empty(struct_size!(TFL_Activity, range_mark));
    let e = st(api, unsafe { api.get_activity.unwrap()(&mut early) }).unwrap_err();
    assert_eq!(e.0, TFL_ERROR_FAILED_PRECONDITION, "called once after initialize");
    let options = CString::new("devices=2;memory=64MiB").unwrap();
    let init = TFL_InitArgs { struct_size: 16, options: options.as_ptr() };
    st(api, unsafe { api.initialize.unwrap()(&init) }).unwrap();
    let t = activity_table(api);
    assert!(t.range_push.is_some() && t.range_pop.is_some() && t.range_mark.is_some());
    let set_correlation = t.activity_set_correlation.unwrap();

    // Off until enabled; bits outside the kinds are refused.
    assert!(drain(api, &t).0.is_empty());
    let e = st(api, unsafe { t.activity_enable.unwrap()(1 << 9) }).unwrap_err();
    assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT);
    let e = st(api, unsafe { t.activity_enable.unwrap()(TFL_ACTIVITY_ALL_KINDS | 1) }).unwrap_err();
    assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT);
    st(api, unsafe { t.activity_enable.unwrap()(TFL_ACTIVITY_ALL_KINDS) }).unwrap();

    // Memory, a stream, and the inputs uploaded on it under correlation 5.
    let mut stream: *mut TFL_Stream = null_mut();
    st(api, unsafe { api.stream_create.unwrap()(0, 0, &mut stream) }).unwrap();
    let mut bufs = [null_mut::<c_void>(); 3];
    for p in &mut bufs {
        st(api, unsafe { api.allocate.unwrap()(0, BYTES, p) }).unwrap();
    }
    let [a, b, out] = bufs;
    let host: Vec<f32> = (0..N).map(|i| i as f32).collect();
    unsafe { set_correlation(5) };
    for dst in [a, b] {
        let c = copy_args(TFL_COPY_HOST_TO_DEVICE, dst, host.as_ptr().cast(), BYTES, stream);
        st(api, unsafe { api.copy.unwrap()(&c) }).unwrap();
    }
    // The add under correlation 7, then a synchronize under none.
    let add = add_kernel(api);
    let frame = add_frame(a, b, out, stream);
    unsafe { set_correlation(7) };
    st(api, unsafe { add(&*frame.frame) }).unwrap();
    unsafe { set_correlation(0) };
    st(api, unsafe { api.stream_synchronize.unwrap()(stream) }).unwrap();

    let (records, dropped) = drain(api, &t);
    assert_eq!(dropped, 0);
    let kernel = one(&records, TFL_ACTIVITY_KERNEL, "add.Tensor");
    assert_eq!((kernel.correlation, kernel.device, kernel.stream), (7, 0, stream as usize));
    assert!(!kernel.host_clock);
    assert_eq!(kernel.detail, "f32[4096], f32[4096] -> f32[4096]");
    let launch = one(&records, TFL_ACTIVITY_API, "simLaunchKernel");
    assert_eq!((launch.correlation, launch.device, launch.stream), (7, 0, stream as usize));
    assert!(launch.host_clock);
    assert_eq!(launch.detail, "add.Tensor f32[4096], f32[4096] -> f32[4096]");
    let uploads = find(&records, TFL_ACTIVITY_COPY, "Memcpy HtoD");
    assert_eq!(uploads.len(), 2);
    for u in &uploads {
        assert_eq!(
            (u.correlation, u.stream, u.detail.as_str()),
            (5, stream as usize, "16384 bytes, host to device")
        );
        assert!(!u.host_clock);
    }
    let api_copies = find(&records, TFL_ACTIVITY_API, "simMemcpyAsync");
    assert_eq!(api_copies.len(), 2);
    assert!(api_copies.iter().all(|r| r.correlation == 5 && r.detail == "16384 bytes, host to device"));
    let sync = one(&records, TFL_ACTIVITY_SYNC, "simStreamSynchronize");
    assert_eq!((sync.correlation, sync.stream), (0, stream as usize));
    assert!(sync.host_clock);
    assert!(records.iter().all(|r| r.correlation != 0 || r.kind == TFL_ACTIVITY_SYNC), "{records:#?}");

    // The device clock is not the host's, and maps onto it through
    // activity_clock: the kernel ran after the uploads and its launch
    // started, and before the synchronize returned.
    let (mut d0, mut h0) = (0u64, 0u64);
    st(api, unsafe { t.activity_clock.unwrap()(0, &mut d0, &mut h0) }).unwrap();
    assert!(d0 >= 1_000_000_000 && d0 != h0);
    let (mut d1, mut h1) = (0u64, 0u64);
    st(api, unsafe { t.activity_clock.unwrap()(1, &mut d1, &mut h1) }).unwrap();
    assert!(d1 > d0 + 900_000_000, "device 1's clock is a second ahead of device 0's");
    assert_eq!(
        st(api, unsafe { t.activity_clock.unwrap()(2, &mut d0, &mut h0) }).unwrap_err().0,
        TFL_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        st(api, unsafe { t.activity_clock.unwrap()(0, null_mut(), &mut h0) }).unwrap_err().0,
        TFL_ERROR_INVALID_ARGUMENT
    );
    let slack = 1_000_000; // 1 ms of skew between the clocks' reads
    let (k_start, k_end) = (to_host(api, &t, kernel.start), to_host(api, &t, kernel.end));
    assert!(
        k_start + slack >= i128::from(launch.start),
        "kernel {k_start} before its launch {}",
        launch.start
    );
    assert!(k_end <= i128::from(sync.end) + slack, "kernel {k_end} after the synchronize {}", sync.end);
    for u in &uploads {
        assert!(to_host(api, &t, u.end) <= k_start + slack, "in stream order");
    }
    assert!(launch.start <= launch.end && launch.end <= sync.end);

    // The kernel record agrees with timing events around it.
    let (mut e0, mut e1) = (null_mut(), null_mut());
    st(api, unsafe { api.event_create.unwrap()(0, TFL_EVENT_TIMING, &mut e0) }).unwrap();
    st(api, unsafe { api.event_create.unwrap()(0, TFL_EVENT_TIMING, &mut e1) }).unwrap();
    st(api, unsafe { api.event_record.unwrap()(e0, stream) }).unwrap();
    unsafe { set_correlation(8) };
    st(api, unsafe { add(&*frame.frame) }).unwrap();
    unsafe { set_correlation(0) };
    st(api, unsafe { api.event_record.unwrap()(e1, stream) }).unwrap();
    st(api, unsafe { api.event_synchronize.unwrap()(e1) }).unwrap();
    let mut ms = 0f32;
    st(api, unsafe { api.event_elapsed_time.unwrap()(e0, e1, &mut ms) }).unwrap();
    let (records, _) = drain(api, &t);
    let kernel = one(&records, TFL_ACTIVITY_KERNEL, "add.Tensor");
    assert_eq!(kernel.correlation, 8);
    let kernel_ns = (kernel.end - kernel.start) as f64;
    assert!(kernel_ns <= f64::from(ms) * 1e6 + 1_000.0, "kernel {kernel_ns} ns within events {ms} ms apart");
    assert_eq!(find(&records, TFL_ACTIVITY_API, "simEventRecord").len(), 2);
    let wait = one(&records, TFL_ACTIVITY_SYNC, "simEventSynchronize");
    assert!(wait.detail.starts_with("event 0x"));

    // A synchronous copy back and an asynchronous fill.
    let mut back = vec![0f32; N];
    unsafe { set_correlation(11) };
    st(api, unsafe { api.set_memory.unwrap()(0, a, 0, BYTES, stream) }).unwrap();
    let c = copy_args(TFL_COPY_DEVICE_TO_HOST, back.as_mut_ptr().cast(), out, BYTES, null_mut());
    st(api, unsafe { api.copy.unwrap()(&c) }).unwrap();
    unsafe { set_correlation(0) };
    assert_eq!(back[3], 6.0);
    st(api, unsafe { api.device_synchronize.unwrap()(0) }).unwrap();
    let (records, _) = drain(api, &t);
    let fill = one(&records, TFL_ACTIVITY_MEMSET, "Memset");
    assert_eq!(
        (fill.correlation, fill.stream, fill.detail.as_str()),
        (11, stream as usize, "16384 bytes, value 0x00")
    );
    assert_eq!(one(&records, TFL_ACTIVITY_API, "simMemsetAsync").correlation, 11);
    let down = one(&records, TFL_ACTIVITY_COPY, "Memcpy DtoH");
    assert_eq!((down.correlation, down.stream, down.detail.as_str()), (11, 0, "16384 bytes, device to host"));
    assert_eq!(one(&records, TFL_ACTIVITY_API, "simMemcpy").correlation, 11);
    assert_eq!(one(&records, TFL_ACTIVITY_SYNC, "simDeviceSynchronize").detail, "device 0");

    // A native graph: one API record for the launch, a KERNEL record per
    // captured kernel, all with the launch's correlation and stream.
    let mut graphs = TFL_Graphs {
        struct_size: struct_size!(TFL_Graphs, graph_destroy),
        stream_begin_capture: None,
        stream_end_capture: None,
        graph_instantiate: None,
        graph_launch: None,
        graph_exec_destroy: None,
        graph_destroy: None,
    };
    st(api, unsafe { api.get_graphs.unwrap()(&mut graphs) }).unwrap();
    let mut capturing: *mut TFL_Stream = null_mut();
    st(api, unsafe { api.stream_create.unwrap()(0, 0, &mut capturing) }).unwrap();
    let captured = add_frame(a, b, out, capturing);
    st(api, unsafe { graphs.stream_begin_capture.unwrap()(capturing) }).unwrap();
    for _ in 0..2 {
        st(api, unsafe { add(&*captured.frame) }).unwrap();
    }
    let (mut graph, mut exec) = (null_mut(), null_mut());
    st(api, unsafe { graphs.stream_end_capture.unwrap()(capturing, &mut graph) }).unwrap();
    st(api, unsafe { graphs.graph_instantiate.unwrap()(graph, &mut exec) }).unwrap();
    assert!(find(&drain(api, &t).0, TFL_ACTIVITY_KERNEL, "add.Tensor").is_empty(), "capture runs nothing");
    let launch_args = TFL_GraphLaunchArgs {
        struct_size: struct_size!(TFL_GraphLaunchArgs, rng_offset_base),
        rng_seed: 0,
        rng_offset_base: 0,
    };
    unsafe { set_correlation(9) };
    st(api, unsafe { graphs.graph_launch.unwrap()(exec, stream, &launch_args) }).unwrap();
    unsafe { set_correlation(0) };
    st(api, unsafe { api.stream_synchronize.unwrap()(stream) }).unwrap();
    let (records, _) = drain(api, &t);
    let launch = one(&records, TFL_ACTIVITY_API, "simGraphLaunch");
    assert_eq!((launch.correlation, launch.stream), (9, stream as usize));
    assert!(launch.detail.starts_with("2 nodes"), "{}", launch.detail);
    let kernels = find(&records, TFL_ACTIVITY_KERNEL, "add.Tensor");
    assert_eq!(kernels.len(), 2);
    assert!(kernels.iter().all(|k| k.correlation == 9 && k.stream == stream as usize));
    assert!(kernels[0].end <= kernels[1].start, "in graph order");
    assert!(find(&records, TFL_ACTIVITY_API, "simLaunchKernel").is_empty());
    st(api, unsafe { graphs.graph_exec_destroy.unwrap()(exec) }).unwrap();
    st(api, unsafe { graphs.graph_destroy.unwrap()(graph) }).unwrap();

    // Ranges and marks, host clock, nested.
    let (outer, mark) = (CString::new("outer").unwrap(), CString::new("step 1").unwrap());
    unsafe {
        t.range_push.unwrap()(outer.as_ptr());
        t.range_mark.unwrap()(mark.as_ptr());
        t.range_push.unwrap()(null());
        t.range_pop.unwrap()();
        t.range_pop.unwrap()();
        t.range_pop.unwrap()(); // none open: a no-op
    }
    let (records, _) = drain(api, &t);
    let outer_range = one(&records, TFL_ACTIVITY_RANGE, "outer");
    let inner_range = one(&records, TFL_ACTIVITY_RANGE, "");
    let m = one(&records, TFL_ACTIVITY_MARK, "step 1");
    assert!(outer_range.host_clock && m.host_clock && outer_range.device == -1);
    assert_eq!(m.start, m.end);
    assert!(outer_range.start <= m.start && m.end <= inner_range.start && inner_range.end <= outer_range.end);

    // The drain's arguments, and records written at a larger host stride.
    let size = std::mem::size_of::<TFL_ActivityRecord>();
    let (mut written, mut dropped) = (0usize, 0u64);
    let mut raw = vec![0xABu8; 3 * 300];
    let rec = raw.as_mut_ptr().cast::<TFL_ActivityRecord>();
    let e = st(api, unsafe { t.activity_drain.unwrap()(rec, size - 1, 3, &mut written, &mut dropped) })
        .unwrap_err();
    assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT);
    let e =
        st(api, unsafe { t.activity_drain.unwrap()(rec, size, 3, null_mut(), &mut dropped) }).unwrap_err();
    assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT);
    let e = st(api, unsafe { t.activity_drain.unwrap()(null_mut(), size, 3, &mut written, &mut dropped) })
        .unwrap_err();
    assert_eq!(e.0, TFL_ERROR_INVALID_ARGUMENT);
    let long = CString::new("n".repeat(200)).unwrap();
    unsafe { t.range_mark.unwrap()(long.as_ptr()) };
    unsafe { t.range_mark.unwrap()(mark.as_ptr()) };
    st(api, unsafe { t.activity_drain.unwrap()(rec, 300, 3, &mut written, &mut dropped) }).unwrap();
    assert_eq!((written, dropped), (2, 0));
    for i in 0..2 {
        let r = unsafe { raw.as_ptr().add(i * 300).cast::<TFL_ActivityRecord>().read_unaligned() };
        assert_eq!((r.struct_size, r.kind), (248, TFL_ACTIVITY_MARK));
        let name = text(&r.name);
        assert_eq!(name, if i == 0 { "n".repeat(63) } else { "step 1".to_owned() }, "truncated to fit");
        assert!(raw[i * 300 + 248..(i + 1) * 300].iter().all(|&b| b == 0xAB), "nothing past the record");
    }
    assert!(raw[600..].iter().all(|&b| b == 0xAB), "no third record");

    // Disabled: nothing new is recorded, ranges included.
    st(api, unsafe { t.activity_enable.unwrap()(0) }).unwrap();
    unsafe { set_correlation(12) };
    st(api, unsafe { add(&*frame.frame) }).unwrap();
    let c = copy_args(TFL_COPY_HOST_TO_DEVICE, a, host.as_ptr().cast(), BYTES, stream);
    st(api, unsafe { api.copy.unwrap()(&c) }).unwrap();
    unsafe { set_correlation(0) };
    unsafe {
        t.range_push.unwrap()(outer.as_ptr());
        t.range_pop.unwrap()();
        t.range_mark.unwrap()(mark.as_ptr());
    }
    st(api, unsafe { api.stream_synchronize.unwrap()(stream) }).unwrap();
    st(api, unsafe { api.device_synchronize.unwrap()(0) }).unwrap();
    assert!(drain(api, &t).0.is_empty());

    // Only some kinds: KERNEL alone records no API or SYNC records.
    st(api, unsafe { t.activity_enable.unwrap()(1 << TFL_ACTIVITY_KERNEL) }).unwrap();
    st(api, unsafe { add(&*frame.frame) }).unwrap();
    st(api, unsafe { api.stream_synchronize.unwrap()(stream) }).unwrap();
    let (records, _) = drain(api, &t);
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0].kind, TFL_ACTIVITY_KERNEL);
    st(api, unsafe { t.activity_enable.unwrap()(0) }).unwrap();

    for p in bufs {
        st(api, unsafe { api.deallocate.unwrap()(0, p) }).unwrap();
    }
    for s in [stream, capturing] {
        st(api, unsafe { api.stream_destroy.unwrap()(s) }).unwrap();
    }
}

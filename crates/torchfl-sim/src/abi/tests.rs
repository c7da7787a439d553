//! Unit tests of the ABI layer that need its private parts: the generated
//! op table, frame decoding and its error messages.

use std::ffi::{c_char, c_void, CStr};

use torchfl_ffi::{TFL_CallFrame, TFL_Tensor, TFL_Value};

use super::frame::{decode_tensor, decode_value, Role};
use super::op_table::{launch_frame, op_entries, schema_declares};
use super::*;
use crate::kernels::pointwise;
use crate::runtime::config::Config;

fn cstr(p: *const c_char) -> String {
    // SAFETY: the table's strings are static and NUL-terminated.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned()
}

/// The build script derives every kernel symbol from its operator's name
/// (see `export_kernel!`); this checks what it derived against the ABI
/// mangling as torchfl-ffi, the one implementation of the rule, computes it
/// here, and the table against [`crate::kernels::OPS`].
#[test]
fn every_symbol_is_the_mangled_name() {
    let entries = op_entries();
    assert_eq!(entries.len(), crate::kernels::OPS.len());
    let (mut custom, mut external) = (0, 0);
    for (e, def) in entries.iter().zip(crate::kernels::OPS) {
        let name = cstr(e.name);
        assert_eq!(name, def.name);
        assert_eq!(cstr(e.symbol), ffi::kernel_symbol(&name).unwrap(), "{name}");
        assert!(e.kernel.is_some());
        assert_eq!(e.struct_size, 56);
        let parsed = ffi::parse_op_name(&name).unwrap();
        if parsed.namespace == "aten" {
            // PyTorch knows aten operators: no schema, no infer function.
            assert!(e.schema.is_null() && e.infer_outputs.is_none(), "{name}");
            assert!(def.schema.is_none() && def.infer.is_none(), "{name}");
        } else if e.flags & ffi::TFL_OP_EXTERNAL != 0 {
            // Another library's operator: the schema it was written for, no
            // infer function (the library has its own meta kernels).
            external += 1;
            assert_eq!(parsed.namespace, "torchvision", "{name}");
            assert!(!e.schema.is_null() && e.infer_outputs.is_none(), "{name}");
            let schema = cstr(e.schema);
            assert_eq!(Some(schema.as_str()), def.schema, "{name}");
            assert!(schema.starts_with(&format!("{}(", parsed.op)), "{schema}");
            assert!(def.infer.is_none(), "{name}");
        } else {
            custom += 1;
            assert_eq!(parsed.namespace, "sim", "{name}");
            assert!(!e.schema.is_null() && e.infer_outputs.is_some(), "{name}");
            let schema = cstr(e.schema);
            assert_eq!(Some(schema.as_str()), def.schema, "{name}");
            assert!(schema.starts_with(&format!("{}(", name.trim_start_matches("sim::"))), "{schema}");
            assert!(def.infer.is_some(), "{name}");
        }
    }
    assert_eq!(custom, 4, "the fused operators");
    assert_eq!(external, 3, "torchvision's operators");
    let mut names: Vec<String> = entries.iter().map(|e| cstr(e.name)).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), entries.len(), "names are unique");
}

#[test]
fn schema_declares_its_operator() {
    assert!(schema_declares("sim::fused_gelu", "fused_gelu(Tensor x) -> Tensor"));
    assert!(schema_declares("sim::op.out", "op.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)"));
    assert!(!schema_declares("sim::fused_gelu", "fused_gelu2(Tensor x) -> Tensor"));
    assert!(!schema_declares("sim::fused_gelu", "gelu(Tensor x) -> Tensor"));
    assert!(!schema_declares("sim::fused_gelu", "fused_gelu"));
    assert!(!schema_declares("sim::fused_gelu", "sim::fused_gelu(Tensor x) -> Tensor"));
}

#[test]
fn table_layout() {
    let api = api_table();
    assert_eq!(api.struct_size, 288); // 1.8 appended get_activity
    assert_eq!((api.abi_major, api.abi_minor), (1, 8));
    assert!(api.get_graphs.is_some() && api.get_activity.is_some());
    assert!(api.host_allocate.is_some() && api.host_deallocate.is_some());
    assert!(api.probe_devices.is_some());
}

fn sim() -> Runtime {
    let config =
        Config { devices: 1, memory: 1 << 20, mode: crate::Mode::Sync, strict: false, ..Config::default() };
    Runtime::new(config).unwrap()
}

fn tensor(data: *mut c_void, ndim: i32, shape: *const i64, strides: *const i64) -> TFL_Tensor {
    TFL_Tensor {
        struct_size: struct_size!(TFL_Tensor, flags),
        data,
        byte_offset: 0,
        device_type: ffi::TFL_DEVICE_PLUGIN,
        device_index: 0,
        dtype: ffi::TFL_DType::F32,
        ndim,
        shape,
        strides,
        flags: 0,
    }
}

fn message<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.unwrap_err().message().to_owned()
}

/// Decodes `t` (valid or NULL, with live arrays) and copies out its
/// shape and strides.
fn decode_t(rt: &Runtime, t: *const TFL_Tensor, role: Role) -> Result<(Vec<i64>, Vec<i64>)> {
    // SAFETY: callers pass NULL or a live descriptor whose arrays are
    // live or NULL (what is being tested) for this call.
    let t = unsafe { decode_tensor(Some(rt), t, "op", role) }?;
    Ok((t.shape.to_vec(), t.strides.to_vec()))
}

/// Decodes `v` (valid or NULL, with live contents), dropping the result.
fn decode_v(rt: &Runtime, v: *const TFL_Value, i: usize) -> Result<()> {
    // SAFETY: as in `decode_t`, for a value.
    unsafe { decode_value(Some(rt), v, "op", i) }.map(drop)
}

/// Error context is formatted lazily now; the messages must read as
/// they did when it was formatted eagerly.
#[test]
fn decode_errors_name_the_operand() {
    let rt = sim();
    let (shape, strides) = ([2i64, 2], [2i64, 1]);
    let ok = tensor(ptr::null_mut(), 2, shape.as_ptr(), strides.as_ptr());
    let (sh, st) = decode_t(&rt, &ok, Role::Output(0)).unwrap();
    assert_eq!((&sh[..], &st[..]), (&shape[..], &strides[..]));

    let no_shape = tensor(ptr::null_mut(), 2, ptr::null(), strides.as_ptr());
    let e = message(decode_t(&rt, &no_shape, Role::Argument(1)));
    assert_eq!(e, "sim: op: argument 1.shape: NULL list with 2 items");
    let no_strides = tensor(ptr::null_mut(), 2, shape.as_ptr(), ptr::null());
    let e = message(decode_t(&rt, &no_strides, Role::Output(0)));
    assert_eq!(e, "sim: op: output 0.strides: NULL list with 2 items");
    let deep = tensor(ptr::null_mut(), 65, shape.as_ptr(), strides.as_ptr());
    let e = message(decode_t(&rt, &deep, Role::Item(2, 3)));
    assert_eq!(e, "sim: op: argument 2[3] has ndim 65");
    let e = message(decode_t(&rt, ptr::null(), Role::Output(1)));
    assert_eq!(e, "sim: op: output 1 is a NULL tensor");
    let elsewhere = TFL_Tensor { device_index: 3, ..ok };
    let e = message(decode_t(&rt, &elsewhere, Role::Argument(0)));
    assert_eq!(e, "sim: op: argument 0: device 3 out of range (device_count = 1)");

    let items = [&ok as *const TFL_Tensor, &deep];
    let list = TFL_Value {
        struct_size: struct_size!(TFL_Value, u),
        tag: ffi::TFL_VALUE_TENSOR_LIST,
        u: ffi::TFL_ValueUnion { tensor_list: ffi::TFL_TensorList { items: items.as_ptr(), len: 2 } },
    };
    let e = message(decode_v(&rt, &list, 4));
    assert_eq!(e, "sim: op: argument 4[1] has ndim 65");
    let e = message(decode_v(&rt, ptr::null(), 5));
    assert_eq!(e, "sim: op: argument 5 is NULL");
    let no_items = TFL_Value {
        u: ffi::TFL_ValueUnion { int_list: ffi::TFL_IntList { items: ptr::null(), len: 3 } },
        tag: ffi::TFL_VALUE_INT_LIST,
        ..list
    };
    let e = message(decode_v(&rt, &no_items, 0));
    assert_eq!(e, "sim: op: NULL list with 3 items");
}

/// The frame's op name is used in messages as given, even when it is
/// not the table's.
#[test]
fn frame_op_names_reach_messages() {
    let rt = sim();
    let stream = rt.default_stream(0).unwrap();
    let frame = |op_name: *const c_char| TFL_CallFrame {
        struct_size: struct_size!(TFL_CallFrame, rng_offset),
        op_name,
        device_index: 0,
        stream: stream.to_raw() as usize as *mut TFL_Stream,
        args: ptr::null(),
        num_args: 0,
        outputs: ptr::null(),
        num_outputs: 0,
        resize_output: None,
        host_context: ptr::null_mut(),
        rng_seed: 0,
        rng_offset: 0,
    };
    let launch = |op_name| {
        let f = frame(op_name);
        // SAFETY: a complete frame with no arguments or outputs.
        message(unsafe { launch_frame(&rt, &f, "add.Tensor", pointwise::add_tensor) })
    };
    let expected = "expected 2 to 3 arguments, got 0";
    assert_eq!(launch(c"add.Tensor".as_ptr()), format!("sim: add.Tensor: {expected}"));
    assert_eq!(launch(c"aten::add.Tensor".as_ptr()), format!("sim: aten::add.Tensor: {expected}"));
    assert_eq!(launch(ptr::null()), format!("sim: add.Tensor: {expected}"));
    assert_eq!(launch(c"".as_ptr()), format!("sim: add.Tensor: {expected}"));
    let bad = frame(c"add.Tensor".as_ptr());
    let bad = TFL_CallFrame { num_args: 2, ..bad };
    // SAFETY: `args` is NULL with a count, which is what is tested.
    let e = message(unsafe { launch_frame(&rt, &bad, "add.Tensor", pointwise::add_tensor) });
    assert_eq!(e, "sim: add.Tensor: NULL list with 2 items");
}

//! The OpenCL plugin through torch-fl's core, as the host loads it: memory
//! behind device addresses, copies at odd offsets, streams and events, and
//! kernels on strided and broadcast operands.
//!
//! They need an OpenCL driver. Without one, each test checks that loading
//! fails with the message that says what to install, and says on stderr
//! that it ran only that check; `make test` installs PoCL first (as root),
//! so in CI they run whole.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly

use std::sync::{Arc, OnceLock};

use torchfl_core::{Arg, LoadOptions, Plugin, ScalarArg, TensorArg};
use torchfl_ffi::TFL_DType;

/// The loaded plugin, or `None` (after checking the refusal's message)
/// when this machine has no OpenCL.
fn plugin() -> Option<Arc<Plugin>> {
    static LOADED: OnceLock<Option<Arc<Plugin>>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
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
        })
        .clone()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
fn device_addresses_take_offsets_and_are_not_host_memory() {
    let Some(p) = plugin() else { return };
    assert!(p.device_count() >= 1);
    assert!(!p.capabilities().host_addressable_memory());
    let a = p.allocate(0, 10_000).unwrap();
    let b = p.allocate(0, 10_000).unwrap();
    let data: Vec<u8> = (0..5000).map(|i| (i * 7 % 251) as u8).collect();
    // At odd offsets in both buffers: the host's pointer arithmetic.
    p.copy_to_device(&a, 13, &data).unwrap();
    p.copy_device_to_device(&b, 4001, &a, 13, 5000, None).unwrap();
    let mut back = vec![0u8; 5000];
    p.copy_to_host(&b, 4001, &mut back).unwrap();
    assert_eq!(back, data);
    p.set_memory(&b, 4003, 0xAB, 2, None).unwrap();
    p.copy_to_host(&b, 4001, &mut back[..4]).unwrap();
    assert_eq!(back[..4], [data[0], data[1], 0xAB, 0xAB]);
    // A copy past the end of an allocation is refused, naming it.
    let err = p.copy_to_device(&a, 9_999, &[0u8; 2]).unwrap_err().to_string();
    assert!(err.contains("past the end") || err.contains("buffer"), "{err}");
}

#[test]
fn events_order_streams_and_time_the_device() {
    let Some(p) = plugin() else { return };
    let s1 = p.create_stream(0, 0).unwrap();
    let s2 = p.create_stream(0, 0).unwrap();
    let n = 1 << 20;
    let src = p.allocate(0, n).unwrap();
    let mid = p.allocate(0, n).unwrap();
    let dst = p.allocate(0, n).unwrap();
    let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    p.copy_to_device(&src, 0, &data).unwrap();
    let start = p.create_event(0, true).unwrap();
    let end = p.create_event(0, true).unwrap();
    start.record(&s1).unwrap();
    p.copy_device_to_device(&mid, 0, &src, 0, n, Some(&s1)).unwrap();
    end.record(&s1).unwrap();
    // s2 copies mid onward only after s1's copy: the event orders them.
    s2.wait_event(&end).unwrap();
    p.copy_device_to_device(&dst, 0, &mid, 0, n, Some(&s2)).unwrap();
    s2.synchronize().unwrap();
    let mut back = vec![0u8; n];
    p.copy_to_host(&dst, 0, &mut back).unwrap();
    assert!(back == data, "the second stream ran before the event it waited for");
    assert!(end.query().unwrap());
    let ms = start.elapsed_ms(&end).unwrap();
    assert!(ms.is_finite() && ms >= 0.0, "{ms}");
}

#[test]
fn add_broadcasts_a_strided_operand_and_a_host_number() {
    let Some(p) = plugin() else { return };
    let add = p.op("add.Tensor").cloned().unwrap();
    let stream = p.create_stream(0, 0).unwrap();
    // a: [2, 3] viewed transposed from a [3, 2] buffer; b: [3] broadcast.
    let a_data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]; // [[1,2],[3,4],[5,6]]
    let b_data = [10.0f32, 20.0, 30.0];
    let (da, db, dout) = (p.allocate(0, 24).unwrap(), p.allocate(0, 12).unwrap(), p.allocate(0, 24).unwrap());
    p.copy_to_device(&da, 0, &f32_bytes(&a_data)).unwrap();
    p.copy_to_device(&db, 0, &f32_bytes(&b_data)).unwrap();
    let at = TensorArg::strided(&da, TFL_DType::F32, &[2, 3], &[1, 2], 0).unwrap();
    let b = TensorArg::contiguous(&db, TFL_DType::F32, &[3]).unwrap();
    let out = TensorArg::contiguous(&dout, TFL_DType::F32, &[2, 3]).unwrap();
    let args = [Arg::Tensor(at), Arg::Tensor(b), Arg::Scalar(ScalarArg::Float(0.5))];
    p.launch(&add, &stream, &args, std::slice::from_ref(&out)).unwrap();
    stream.synchronize().unwrap();
    let mut back = vec![0u8; 24];
    p.copy_to_host(&dout, 0, &mut back).unwrap();
    // a^T = [[1,3,5],[2,4,6]]; + 0.5 * [10,20,30]
    assert_eq!(f32s(&back), [6.0, 13.0, 20.0, 7.0, 14.0, 21.0]);
}

#[test]
fn copy_converts_broadcasts_and_scatters_into_a_strided_view() {
    let Some(p) = plugin() else { return };
    let copy = p.op("copy_").cloned().unwrap();
    let stream = p.create_stream(0, 0).unwrap();
    let (dsrc, ddst) = (p.allocate(0, 24).unwrap(), p.allocate(0, 24).unwrap());
    let src: Vec<u8> = [7i64, 8, 9].iter().flat_map(|x| x.to_ne_bytes()).collect();
    p.copy_to_device(&dsrc, 0, &src).unwrap();
    p.set_memory(&ddst, 0, 0, 24, None).unwrap();
    // dst: a [2, 3] float32 view of a [3, 2] buffer (transposed); src: int64 [3].
    let dst = TensorArg::strided(&ddst, TFL_DType::F32, &[2, 3], &[1, 2], 0).unwrap();
    let args = [
        Arg::Tensor(dst.clone()),
        Arg::Tensor(TensorArg::contiguous(&dsrc, TFL_DType::I64, &[3]).unwrap()),
        Arg::Bool(false),
    ];
    p.launch(&copy, &stream, &args, std::slice::from_ref(&dst)).unwrap();
    stream.synchronize().unwrap();
    let mut back = vec![0u8; 24];
    p.copy_to_host(&ddst, 0, &mut back).unwrap();
    // The buffer is [3, 2] row-major: buffer[j][i] = dst[i][j] = src[j].
    assert_eq!(f32s(&back), [7.0, 7.0, 8.0, 8.0, 9.0, 9.0]);
}

#[test]
fn an_unsupported_dtype_is_unimplemented_so_the_host_falls_back() {
    let Some(p) = plugin() else { return };
    let mul = p.op("mul.Tensor").cloned().unwrap();
    let stream = p.create_stream(0, 0).unwrap();
    let buf = p.allocate(0, 8).unwrap();
    let t = || TensorArg::contiguous(&buf, TFL_DType::F64, &[1]).unwrap();
    let err = p.launch(&mul, &stream, &[Arg::Tensor(t()), Arg::Tensor(t())], &[t()]).unwrap_err();
    let unimplemented = matches!(
        &err,
        torchfl_core::Error::Kernel { status, .. } if status.code == torchfl_core::StatusCode::Unimplemented
    );
    assert!(unimplemented, "{err}");
}

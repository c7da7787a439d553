//! Every kernel against a naive reference: dtypes, broadcasting, strided and
//! transposed layouts, in-place forms, errors; in async and sync modes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use torchfl_sim::{Arg, DType, ErrorCode, Mode, Scalar, TensorArg};

const MODES: [Mode; 2] = [Mode::Async, Mode::Sync];

/// Small values that every dtype represents exactly (or nearly).
fn value(dtype: DType, i: usize, salt: usize) -> f64 {
    let k = (i * 7 + salt * 3) % 11;
    match dtype {
        DType::Bool => (k % 2) as f64,
        DType::UInt8 => k as f64,
        d if d.is_floating() => ((i + salt) as f64 * 0.37).sin() * 4.0,
        _ => k as f64 - 5.0,
    }
}

fn make(dtype: DType, shape: &[usize], salt: usize) -> HTensor {
    HTensor::new(dtype, shape, |i| value(dtype, i, salt))
}

fn broadcast_ref(a: &HTensor, b: &HTensor, shape: &[usize], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    let out = HTensor::new(DType::Float64, shape, |_| 0.0);
    (0..out.numel())
        .map(|i| {
            let idx = out.index(i);
            f(a.at_broadcast(&idx), b.at_broadcast(&idx))
        })
        .collect()
}

/// Wraps an integer result like the dtype does.
fn wrap(dtype: DType, v: f64) -> f64 {
    if dtype.is_floating() {
        v
    } else {
        round_to(dtype, v)
    }
}

#[test]
fn binary_arithmetic_all_dtypes_and_layouts() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for (op, f) in [
            ("add.Tensor", (|x, y| x + y) as fn(f64, f64) -> f64),
            ("sub.Tensor", |x, y| x - y),
            ("mul.Tensor", |x, y| x * y),
            ("div.Tensor", |x, y| x / y),
        ] {
            for dtype in numeric() {
                if op == "div.Tensor" && !dtype.is_floating() {
                    continue;
                }
                for (la, lb, lo) in [
                    (Layout::Contiguous, Layout::Contiguous, Layout::Contiguous),
                    (Layout::Transposed, Layout::Strided, Layout::Contiguous),
                    (Layout::Strided, Layout::Transposed, Layout::Transposed),
                    (Layout::Contiguous, Layout::Contiguous, Layout::Strided),
                ] {
                    for (sa, sb, so) in [
                        (vec![3, 4], vec![3, 4], vec![3, 4]),
                        (vec![2, 3, 4], vec![3, 1], vec![2, 3, 4]),
                        (vec![4], vec![2, 1, 4], vec![2, 1, 4]),
                    ] {
                        let a = make(dtype, &sa, 1);
                        let mut b = make(dtype, &sb, 2);
                        if op == "div.Tensor" {
                            b.data.iter_mut().for_each(|x| *x = round_to(dtype, *x + 5.0));
                        }
                        let (da, db) = (sim.place(&a, la), sim.place(&b, lb));
                        let out = sim.empty(dtype, &so, lo);
                        let mut args = vec![t(&da), t(&db)];
                        if op.starts_with("add") || op.starts_with("sub") {
                            args.push(scalar_i(1));
                        }
                        sim.call(op, args, vec![out.arg.clone()]).unwrap();
                        let expected: Vec<f64> =
                            broadcast_ref(&a, &b, &so, f).into_iter().map(|v| wrap(dtype, v)).collect();
                        assert_close(
                            &sim.read(&out),
                            &expected,
                            &format!("{op} {dtype:?} {la:?}/{lb:?}/{lo:?} {sa:?}x{sb:?}"),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn alpha_scalar_forms_and_in_place() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in numeric() {
            let a = make(dtype, &[5, 6], 3);
            let b = make(dtype, &[6], 4);
            let (alpha, alpha_arg) =
                if dtype.is_floating() { (0.5, scalar_f(0.5)) } else { (2.0, scalar_i(2)) };
            // sub.Tensor with alpha
            let (da, db) = (sim.place(&a, Layout::Contiguous), sim.place(&b, Layout::Strided));
            let out = sim.empty(dtype, &[5, 6], Layout::Contiguous);
            sim.call("sub.Tensor", vec![t(&da), t(&db), alpha_arg.clone()], vec![out.arg.clone()]).unwrap();
            let exp: Vec<f64> = broadcast_ref(&a, &b, &[5, 6], |x, y| wrap(dtype, x - alpha * y));
            assert_close(&sim.read(&out), &exp, &format!("sub alpha {dtype:?}"));

            // add_.Tensor in place with broadcasting, alpha
            sim.call("add_.Tensor", vec![t(&da), t(&db), alpha_arg.clone()], vec![da.arg.clone()]).unwrap();
            let exp: Vec<f64> = broadcast_ref(&a, &b, &[5, 6], |x, y| wrap(dtype, x + alpha * y));
            assert_close(&sim.read(&da), &exp, &format!("add_ alpha {dtype:?}"));

            // mul_.Scalar in place on a transposed tensor
            let dt = sim.place(&a, Layout::Transposed);
            sim.call("mul_.Scalar", vec![t(&dt), scalar_i(3)], vec![dt.arg.clone()]).unwrap();
            let exp: Vec<f64> = a.data.iter().map(|&x| wrap(dtype, x * 3.0)).collect();
            assert_close(&sim.read(&dt), &exp, &format!("mul_.Scalar {dtype:?}"));

            // add.Scalar / sub.Scalar with an int scalar keep the dtype
            for (op, f) in [("add.Scalar", 1.0), ("sub.Scalar", -1.0)] {
                let out = sim.empty(dtype, &[5, 6], Layout::Strided);
                sim.call(op, vec![t(&dt), scalar_i(2), scalar_i(1)], vec![out.arg.clone()]).unwrap();
                let exp: Vec<f64> =
                    a.data.iter().map(|&x| wrap(dtype, wrap(dtype, x * 3.0) + f * 2.0)).collect();
                assert_close(&sim.read(&out), &exp, &format!("{op} {dtype:?}"));
            }
        }
    }
}

#[test]
fn type_promotion_cases() {
    let sim = Sim::new(Mode::Async);
    // int tensor + float scalar -> float32 output computed in float
    let a = make(DType::Int64, &[7], 0);
    let da = sim.place(&a, Layout::Contiguous);
    let out = sim.empty(DType::Float32, &[7], Layout::Contiguous);
    sim.call("add.Scalar", vec![t(&da), scalar_f(2.5), scalar_i(1)], vec![out.arg.clone()]).unwrap();
    assert_close(&sim.read(&out), &a.data.iter().map(|x| x + 2.5).collect::<Vec<_>>(), "i64 + 2.5");
    // int / int true division -> float
    let b = HTensor::new(DType::Int32, &[7], |i| (i % 3 + 1) as f64);
    let db = sim.place(&b, Layout::Contiguous);
    sim.call("div.Tensor", vec![t(&da), t(&db)], vec![out.arg.clone()]).unwrap();
    let exp: Vec<f64> = a.data.iter().zip(&b.data).map(|(x, y)| round_to(DType::Float32, x / y)).collect();
    assert_close(&sim.read(&out), &exp, "int / int");
    // div.Scalar on ints -> float
    sim.call("div.Scalar", vec![t(&da), scalar_i(4)], vec![out.arg.clone()]).unwrap();
    assert_close(&sim.read(&out), &a.data.iter().map(|x| x / 4.0).collect::<Vec<_>>(), "int / 4");
    // uint8 + int8 -> int16
    let u = HTensor::new(DType::UInt8, &[4], |i| 250.0 + i as f64);
    let s = HTensor::new(DType::Int8, &[4], |i| -100.0 + i as f64);
    let (du, ds) = (sim.place(&u, Layout::Contiguous), sim.place(&s, Layout::Contiguous));
    let out16 = sim.empty(DType::Int16, &[4], Layout::Contiguous);
    sim.call("add.Tensor", vec![t(&du), t(&ds), scalar_i(1)], vec![out16.arg.clone()]).unwrap();
    assert_eq!(sim.read(&out16).data, vec![150.0, 152.0, 154.0, 156.0]);
    // float tensor + 0-dim host double tensor -> float
    let f = make(DType::Float32, &[3, 2], 5);
    let df = sim.place(&f, Layout::Contiguous);
    let outf = sim.empty(DType::Float32, &[3, 2], Layout::Contiguous);
    let host = Arg::Tensor(TensorArg::host_scalar(DType::Float64, Scalar::Float(1.25)));
    sim.call("mul.Tensor", vec![t(&df), host], vec![outf.arg.clone()]).unwrap();
    assert_close(&sim.read(&outf), &f.data.iter().map(|x| x * 1.25).collect::<Vec<_>>(), "host scalar");
    // bool arithmetic: add is or, mul is and
    let p = HTensor::new(DType::Bool, &[4], |i| (i & 1) as f64);
    let q = HTensor::new(DType::Bool, &[4], |i| (i >> 1) as f64);
    let (dp, dq) = (sim.place(&p, Layout::Contiguous), sim.place(&q, Layout::Contiguous));
    let outb = sim.empty(DType::Bool, &[4], Layout::Contiguous);
    sim.call("add.Tensor", vec![t(&dp), t(&dq), scalar_i(1)], vec![outb.arg.clone()]).unwrap();
    assert_eq!(sim.read(&outb).data, vec![0.0, 1.0, 1.0, 1.0]);
    sim.call("mul.Tensor", vec![t(&dp), t(&dq)], vec![outb.arg.clone()]).unwrap();
    assert_eq!(sim.read(&outb).data, vec![0.0, 0.0, 0.0, 1.0]);
}

#[test]
fn arithmetic_errors_match_pytorch() {
    let sim = Sim::new(Mode::Async);
    let p = sim.place(&HTensor::new(DType::Bool, &[4], |_| 1.0), Layout::Contiguous);
    let out = sim.empty(DType::Bool, &[4], Layout::Contiguous);
    let e = sim.call("sub.Tensor", vec![t(&p), t(&p), scalar_i(1)], vec![out.arg.clone()]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(
        e.message().contains("sub.Tensor") && e.message().contains("two bool tensors"),
        "{}",
        e.message()
    );
    let e = sim.call(
        "sub.Scalar",
        vec![t(&p), Arg::Scalar(Scalar::Bool(true)), scalar_i(1)],
        vec![out.arg.clone()],
    );
    assert!(e.unwrap_err().message().contains("Subtraction, the `-` operator"));

    let li = sim.place(&make(DType::Int64, &[4], 0), Layout::Contiguous);
    let e =
        sim.call("add_.Scalar", vec![t(&li), scalar_f(0.5), scalar_i(1)], vec![li.arg.clone()]).unwrap_err();
    assert!(
        e.message().contains("result type Float can't be cast to the desired output type Long"),
        "{}",
        e.message()
    );
    let e = sim.call("add.Tensor", vec![t(&li), t(&li), scalar_f(0.5)], vec![li.arg.clone()]).unwrap_err();
    assert!(e.message().contains("alpha must not be a floating point number"), "{}", e.message());

    let u8t = sim.place(&make(DType::UInt8, &[4], 0), Layout::Contiguous);
    let e =
        sim.call("add.Scalar", vec![t(&u8t), scalar_i(300), scalar_i(1)], vec![u8t.arg.clone()]).unwrap_err();
    assert!(e.message().contains("without overflow"), "{}", e.message());

    // Shape mismatch: INVALID_ARGUMENT naming the op; the output is untouched.
    let a = sim.place(&make(DType::Float32, &[2, 3], 0), Layout::Contiguous);
    let b = sim.place(&make(DType::Float32, &[2, 4], 0), Layout::Contiguous);
    let out = sim.place(&HTensor::new(DType::Float32, &[2, 3], |_| 7.0), Layout::Contiguous);
    let e = sim.call("add.Tensor", vec![t(&a), t(&b), scalar_i(1)], vec![out.arg.clone()]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().starts_with("sim: add.Tensor:"), "{}", e.message());
    assert!(e.message().contains("must match the size of tensor b"), "{}", e.message());
    assert!(sim.read(&out).data.iter().all(|&x| x == 7.0));
    // Output of the wrong shape.
    let e = sim.call("mul.Tensor", vec![t(&a), t(&a)], vec![b.arg.clone()]).unwrap_err();
    assert!(e.message().contains("doesn't match the broadcast shape"), "{}", e.message());
    // Partial overlap between input and in-place output.
    let mut shifted = a.arg.clone();
    if let torchfl_sim::TensorData::Device { byte_offset, .. } = &mut shifted.data {
        *byte_offset += 4;
    }
    shifted.shape = vec![5];
    shifted.strides = vec![1];
    let mut whole = a.arg.clone();
    whole.shape = vec![5];
    whole.strides = vec![1];
    let e = sim
        .call("add_.Tensor", vec![Arg::Tensor(whole.clone()), Arg::Tensor(shifted), scalar_i(1)], vec![whole])
        .unwrap_err();
    assert!(e.message().contains("refer to a single memory location"), "{}", e.message());
    // Wrong argument count and kind.
    let e = sim.call("mul.Tensor", vec![t(&a)], vec![out.arg.clone()]).unwrap_err();
    assert!(e.message().contains("expected 2 arguments"), "{}", e.message());
    let e = sim.call("relu", vec![scalar_i(1)], vec![out.arg.clone()]).unwrap_err();
    assert!(e.message().contains("must be a tensor"), "{}", e.message());
    // Unknown op.
    assert_eq!(sim.call("cosh", vec![], vec![]).unwrap_err().code(), ErrorCode::Unimplemented);
}

#[test]
fn unary_ops() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in numeric() {
            for layout in LAYOUTS {
                let a = make(dtype, &[4, 5], 6);
                let da = sim.place(&a, layout);
                let out = sim.empty(dtype, &[4, 5], Layout::Contiguous);
                sim.call("neg", vec![t(&da)], vec![out.arg.clone()]).unwrap();
                let exp: Vec<f64> = a.data.iter().map(|&x| wrap(dtype, -x)).collect();
                assert_close(&sim.read(&out), &exp, &format!("neg {dtype:?} {layout:?}"));
                sim.call("relu", vec![t(&da)], vec![out.arg.clone()]).unwrap();
                let exp: Vec<f64> = a.data.iter().map(|&x| x.max(0.0)).collect();
                assert_close(&sim.read(&out), &exp, &format!("relu {dtype:?} {layout:?}"));
                sim.call("relu_", vec![t(&da)], vec![da.arg.clone()]).unwrap();
                assert_close(&sim.read(&da), &exp, &format!("relu_ {dtype:?} {layout:?}"));
            }
        }
        let b = sim.place(&HTensor::new(DType::Bool, &[3], |_| 1.0), Layout::Contiguous);
        let e = sim.call("neg", vec![t(&b)], vec![b.arg.clone()]).unwrap_err();
        assert!(e.message().contains("Negation, the `-` operator, on a bool tensor"));
        let e = sim.call("relu", vec![t(&b)], vec![b.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unimplemented);
    }
    // NaN propagates through relu.
    let sim = Sim::new(Mode::Sync);
    let a = sim.place(
        &HTensor::new(DType::Float32, &[2], |i| if i == 0 { f64::NAN } else { -1.0 }),
        Layout::Contiguous,
    );
    sim.call("relu_", vec![t(&a)], vec![a.arg.clone()]).unwrap();
    let r = sim.read(&a);
    assert!(r.data[0].is_nan() && r.data[1] == 0.0);
}

#[test]
fn comparisons_tensor_and_scalar() {
    type Cmp = fn(f64, f64) -> bool;
    let ops: [(&str, Cmp); 6] = [
        ("eq", |x, y| x == y),
        ("ne", |x, y| x != y),
        ("lt", |x, y| x < y),
        ("le", |x, y| x <= y),
        ("gt", |x, y| x > y),
        ("ge", |x, y| x >= y),
    ];
    for mode in MODES {
        let sim = Sim::new(mode);
        let mut dtypes = numeric();
        dtypes.push(DType::Bool);
        for dtype in dtypes {
            let a = make(dtype, &[3, 4], 1);
            // Equal elements occur: b is a shifted copy of a in places.
            let b = HTensor::new(dtype, &[4], |i| a.data[i + 4 * (i % 2)]);
            let (da, db) = (sim.place(&a, Layout::Transposed), sim.place(&b, Layout::Strided));
            for (name, f) in ops {
                let out = sim.empty(DType::Bool, &[3, 4], Layout::Contiguous);
                sim.call(&format!("{name}.Tensor"), vec![t(&da), t(&db)], vec![out.arg.clone()]).unwrap();
                let exp = broadcast_ref(&a, &b, &[3, 4], |x, y| f64::from(u8::from(f(x, y))));
                assert_eq!(sim.read(&out).data, exp, "{name}.Tensor {dtype:?}");
                let s = if dtype == DType::Bool { Scalar::Bool(true) } else { Scalar::Int(1) };
                let sv = 1.0;
                sim.call(&format!("{name}.Scalar"), vec![t(&da), Arg::Scalar(s)], vec![out.arg.clone()])
                    .unwrap();
                let exp: Vec<f64> = a.data.iter().map(|&x| f64::from(u8::from(f(x, sv)))).collect();
                assert_eq!(sim.read(&out).data, exp, "{name}.Scalar {dtype:?}");
            }
        }
        // int tensor vs float scalar compares in float
        let i = sim.place(&HTensor::new(DType::Int64, &[4], |i| i as f64), Layout::Contiguous);
        let out = sim.empty(DType::Bool, &[4], Layout::Contiguous);
        sim.call("lt.Scalar", vec![t(&i), scalar_f(2.5)], vec![out.arg.clone()]).unwrap();
        assert_eq!(sim.read(&out).data, vec![1.0, 1.0, 1.0, 0.0]);
        // NaN: eq false, ne true
        let n = sim.place(&HTensor::new(DType::Float64, &[1], |_| f64::NAN), Layout::Contiguous);
        let o1 = sim.empty(DType::Bool, &[1], Layout::Contiguous);
        sim.call("eq.Tensor", vec![t(&n), t(&n)], vec![o1.arg.clone()]).unwrap();
        assert_eq!(sim.read(&o1).data, vec![0.0]);
        sim.call("ne.Tensor", vec![t(&n), t(&n)], vec![o1.arg.clone()]).unwrap();
        assert_eq!(sim.read(&o1).data, vec![1.0]);
    }
}

#[test]
fn fill_zero_and_copy() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let mut all = numeric();
        all.push(DType::Bool);
        for &dtype in &all {
            for layout in LAYOUTS {
                let d = sim.place(&make(dtype, &[3, 5], 0), layout);
                sim.call("fill_.Scalar", vec![t(&d), scalar_i(1)], vec![d.arg.clone()]).unwrap();
                assert!(sim.read(&d).data.iter().all(|&x| x == 1.0), "fill {dtype:?}");
                sim.call("zero_", vec![t(&d)], vec![d.arg.clone()]).unwrap();
                assert!(sim.read(&d).data.iter().all(|&x| x == 0.0), "zero {dtype:?}");
            }
            // copy_ from every dtype, with conversion and layouts
            for &src_dtype in &all {
                let src = make(src_dtype, &[4, 3], 2);
                let ds = sim.place(&src, Layout::Transposed);
                let dst = sim.empty(dtype, &[4, 3], Layout::Strided);
                sim.call("copy_", vec![t(&dst), t(&ds), Arg::Bool(false)], vec![dst.arg.clone()]).unwrap();
                let exp: Vec<f64> = src.data.iter().map(|&x| round_to(dtype, x)).collect();
                assert_close(&sim.read(&dst), &exp, &format!("copy {src_dtype:?} -> {dtype:?}"));
            }
        }
        let e = sim.place(&make(DType::UInt8, &[2], 0), Layout::Contiguous);
        let err = sim.call("fill_.Scalar", vec![t(&e), scalar_i(300)], vec![e.arg.clone()]).unwrap_err();
        assert!(err.message().contains("uint8_t without overflow"), "{}", err.message());
        // broadcast copy, cross-device source, host scalar source
        let row = make(DType::Float32, &[4], 9);
        let src1 = sim.place_on(1, &row, Layout::Contiguous);
        let dst = sim.empty(DType::Float64, &[3, 4], Layout::Contiguous);
        sim.call("copy_", vec![t(&dst), t(&src1)], vec![dst.arg.clone()]).unwrap();
        let exp: Vec<f64> = (0..12).map(|i| row.data[i % 4]).collect();
        assert_close(&sim.read(&dst), &exp, "broadcast cross-device copy");
        let host = Arg::Tensor(TensorArg::host_scalar(DType::Int64, Scalar::Int(-3)));
        sim.call("copy_", vec![t(&dst), host], vec![dst.arg.clone()]).unwrap();
        assert!(sim.read(&dst).data.iter().all(|&x| x == -3.0));
    }
}

fn reduce_ref(a: &HTensor, dims: &[usize], keepdim: bool, mean: bool) -> (Vec<usize>, Vec<f64>) {
    let nd = a.shape.len();
    let reduced = |d: usize| dims.is_empty() || dims.contains(&d);
    let out_shape: Vec<usize> = (0..nd)
        .filter_map(|d| match (reduced(d), keepdim) {
            (false, _) => Some(a.shape[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    let n_out: usize = out_shape.iter().product();
    let mut sums = vec![0.0; n_out];
    let mut counts = vec![0usize; n_out];
    for i in 0..a.numel() {
        let idx = a.index(i);
        let mut lin = 0;
        for (d, &x) in idx.iter().enumerate() {
            if !reduced(d) {
                lin = lin * a.shape[d] + x;
            }
        }
        sums[lin] += a.data[i];
        counts[lin] += 1;
    }
    let n_red: usize = (0..nd).filter(|&d| reduced(d)).map(|d| a.shape[d]).product();
    if mean {
        sums.iter_mut().for_each(|s| *s /= n_red as f64);
    }
    (out_shape, sums)
}

#[test]
fn sums_and_means() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let mut all = numeric();
        all.push(DType::Bool);
        for dtype in all {
            let a = make(dtype, &[3, 4, 5], 4);
            for layout in LAYOUTS {
                let da = sim.place(&a, layout);
                let out_dtype = if dtype.is_floating() { dtype } else { DType::Int64 };
                // full sum
                let out = sim.empty(out_dtype, &[], Layout::Contiguous);
                sim.call("sum", vec![t(&da), Arg::None], vec![out.arg.clone()]).unwrap();
                let (_, exp) = reduce_ref(&a, &[], false, false);
                let exp: Vec<f64> = exp.into_iter().map(|v| round_to(out_dtype, v)).collect();
                assert_close(&sim.read(&out), &exp, &format!("sum {dtype:?} {layout:?}"));
                for (dims, keepdim) in [
                    (vec![0i64], false),
                    (vec![1], true),
                    (vec![-1], false),
                    (vec![0, 2], true),
                    (vec![2, 0], false),
                    (vec![], false),
                ] {
                    let ud: Vec<usize> =
                        dims.iter().map(|&d| if d < 0 { (d + 3) as usize } else { d as usize }).collect();
                    let (shape, exp) = reduce_ref(&a, &ud, keepdim, false);
                    let out = sim.empty(out_dtype, &shape, Layout::Strided);
                    sim.call(
                        "sum.dim_IntList",
                        vec![t(&da), Arg::IntList(dims.clone()), Arg::Bool(keepdim), Arg::None],
                        vec![out.arg.clone()],
                    )
                    .unwrap();
                    let exp: Vec<f64> = exp.into_iter().map(|v| round_to(out_dtype, v)).collect();
                    assert_close(
                        &sim.read(&out),
                        &exp,
                        &format!("sum {dims:?} {keepdim} {dtype:?} {layout:?}"),
                    );
                    if dtype.is_floating() {
                        let (_, exp) = reduce_ref(&a, &ud, keepdim, true);
                        sim.call(
                            "mean.dim",
                            vec![t(&da), Arg::IntList(dims.clone()), Arg::Bool(keepdim), Arg::None],
                            vec![out.arg.clone()],
                        )
                        .unwrap();
                        let exp: Vec<f64> = exp.into_iter().map(|v| round_to(out_dtype, v)).collect();
                        assert_close(&sim.read(&out), &exp, &format!("mean {dims:?} {dtype:?}"));
                    }
                }
            }
        }
        // sum with dtype= converts before accumulating (ScalarType Double = 7)
        let a = make(DType::Int32, &[6], 1);
        let da = sim.place(&a, Layout::Contiguous);
        let out = sim.empty(DType::Float64, &[], Layout::Contiguous);
        sim.call("sum", vec![t(&da), Arg::Int(7)], vec![out.arg.clone()]).unwrap();
        assert_eq!(sim.read(&out).data, vec![a.data.iter().sum::<f64>()]);
        // errors
        let e = sim
            .call("sum.dim_IntList", vec![t(&da), Arg::IntList(vec![1])], vec![out.arg.clone()])
            .unwrap_err();
        assert!(
            e.message().contains("Dimension out of range (expected to be in range of [-1, 0], but got 1)"),
            "{}",
            e.message()
        );
        let e = sim
            .call("sum.dim_IntList", vec![t(&da), Arg::IntList(vec![0, -1])], vec![out.arg.clone()])
            .unwrap_err();
        assert!(e.message().contains("appears multiple times"), "{}", e.message());
        let o32 = sim.empty(DType::Float32, &[], Layout::Contiguous);
        let e = sim
            .call("mean.dim", vec![t(&da), Arg::None, Arg::Bool(false), Arg::None], vec![o32.arg.clone()])
            .unwrap_err();
        assert!(e.message().contains("mean(): could not infer output dtype"), "{}", e.message());
    }
}

#[test]
fn large_inputs_use_parallel_paths_correctly() {
    let sim = Sim::new(Mode::Async);
    let n = 300 * 257; // > 32K elements, odd sizes
    let a = HTensor::new(DType::Float32, &[300, 257], |i| ((i % 1000) as f64 * 0.001) - 0.3);
    let b = HTensor::new(DType::Float32, &[257], |i| i as f64 * 0.5);
    let da = sim.place(&a, Layout::Contiguous);
    let dat = sim.place(&a, Layout::Transposed);
    let db = sim.place(&b, Layout::Contiguous);
    let exp = broadcast_ref(&a, &b, &[300, 257], |x, y| x + y);
    for (src, what) in [(&da, "contiguous"), (&dat, "transposed")] {
        let out = sim.empty(DType::Float32, &[300, 257], Layout::Contiguous);
        sim.call("add.Tensor", vec![t(src), t(&db), scalar_i(1)], vec![out.arg.clone()]).unwrap();
        assert_close(&sim.read(&out), &exp, what);
        let o16 = sim.empty(DType::Float16, &[300, 257], Layout::Contiguous);
        sim.call("copy_", vec![t(&o16), t(src)], vec![o16.arg.clone()]).unwrap();
        let e16: Vec<f64> = a.data.iter().map(|&x| round_to(DType::Float16, x)).collect();
        assert_close(&sim.read(&o16), &e16, "f16 copy");
    }
    // in-place over a large tensor
    sim.call("mul_.Scalar", vec![t(&da), scalar_f(2.0)], vec![da.arg.clone()]).unwrap();
    let doubled: Vec<f64> = a.data.iter().map(|x| x * 2.0).collect();
    assert_close(&sim.read(&da), &doubled, "mul_");
    // full and partial reductions over many elements
    let out = sim.empty(DType::Float32, &[], Layout::Contiguous);
    sim.call("sum", vec![t(&da)], vec![out.arg.clone()]).unwrap();
    let total: f64 = doubled.iter().sum();
    let got = sim.read(&out).data[0];
    assert!((got - total).abs() <= 1e-5 * total.abs().max(1.0), "{got} vs {total}");
    for dim in [0i64, 1] {
        let shape = if dim == 0 { vec![257] } else { vec![300] };
        let out = sim.empty(DType::Float32, &shape, Layout::Contiguous);
        sim.call(
            "sum.dim_IntList",
            vec![t(&dat), Arg::IntList(vec![dim]), Arg::Bool(false)],
            vec![out.arg.clone()],
        )
        .unwrap();
        let (_, exp) = reduce_ref(&a, &[dim as usize], false, false);
        assert_close(&sim.read(&out), &exp, &format!("large sum dim {dim}"));
    }
    assert_eq!(n, a.numel());
}

fn mm_ref(a: &HTensor, b: &HTensor) -> Vec<f64> {
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|kk| a.data[i * k + kk] * b.data[kk * n + j]).sum();
        }
    }
    c
}

#[test]
fn matrix_multiplication() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in numeric() {
            for (m, k, n) in [(5, 7, 3), (33, 64, 17), (1, 0, 4)] {
                for (la, lb, lo) in [
                    (Layout::Contiguous, Layout::Contiguous, Layout::Contiguous),
                    (Layout::Transposed, Layout::Transposed, Layout::Strided),
                    (Layout::Strided, Layout::Contiguous, Layout::Transposed),
                ] {
                    let a = make(dtype, &[m, k], 1);
                    let b = make(dtype, &[k, n], 2);
                    let (da, db) = (sim.place(&a, la), sim.place(&b, lb));
                    let out = sim.empty(dtype, &[m, n], lo);
                    sim.call("mm", vec![t(&da), t(&db)], vec![out.arg.clone()]).unwrap();
                    let exp: Vec<f64> = mm_ref(&a, &b).into_iter().map(|v| wrap(dtype, v)).collect();
                    let got = sim.read(&out);
                    let scale = (k as f64).max(1.0) * 4.0;
                    for (i, (&g, &e)) in got.data.iter().zip(&exp).enumerate() {
                        let tol = tol(dtype) * 4.0 * scale.max(e.abs());
                        assert!((g - e).abs() <= tol, "mm {dtype:?} {m}x{k}x{n} {la:?}: [{i}] {g} vs {e}");
                    }
                }
            }
        }
        let a = sim.place(&make(DType::Float32, &[2, 3], 0), Layout::Contiguous);
        let b = sim.place(&make(DType::Float32, &[4, 5], 0), Layout::Contiguous);
        let out = sim.empty(DType::Float32, &[2, 5], Layout::Contiguous);
        let e = sim.call("mm", vec![t(&a), t(&b)], vec![out.arg.clone()]).unwrap_err();
        assert!(
            e.message().contains("mm: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"),
            "{}",
            e.message()
        );
        let d = sim.place(&make(DType::Float64, &[3, 5], 0), Layout::Contiguous);
        let e = sim.call("mm", vec![t(&a), t(&d)], vec![out.arg.clone()]).unwrap_err();
        assert!(e.message().contains("same dtype"), "{}", e.message());
        let bb = sim.place(&make(DType::Bool, &[3, 5], 0), Layout::Contiguous);
        let ab = sim.place(&make(DType::Bool, &[2, 3], 0), Layout::Contiguous);
        let ob = sim.empty(DType::Bool, &[2, 5], Layout::Contiguous);
        let e = sim.call("mm", vec![t(&ab), t(&bb)], vec![ob.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unimplemented);
    }
}

#[test]
fn mm_large_and_aliasing_output() {
    let sim = Sim::new(Mode::Async);
    let a = make(DType::Float32, &[96, 80], 3);
    let da = sim.place(&a, Layout::Transposed);
    let out = sim.empty(DType::Float32, &[96, 96], Layout::Contiguous);
    // a @ a.T with the transposed view expressed through strides only
    let mut at = da.arg.clone();
    at.shape.reverse();
    at.strides.reverse();
    sim.call("mm", vec![t(&da), Arg::Tensor(at)], vec![out.arg.clone()]).unwrap();
    let b = HTensor {
        dtype: DType::Float32,
        shape: vec![80, 96],
        data: (0..80 * 96).map(|i| a.data[(i % 96) * 80 + i / 96]).collect(),
    };
    let exp = mm_ref(&a, &b);
    let got = sim.read(&out);
    for (g, e) in got.data.iter().zip(&exp) {
        assert!((g - e).abs() <= 1e-4 * e.abs().max(1.0), "{g} vs {e}");
    }
    // output aliasing the input: x = x @ I computes from a staged copy
    let sq = make(DType::Float64, &[8, 8], 5);
    let dsq = sim.place(&sq, Layout::Contiguous);
    let eye = sim.place(
        &HTensor::new(DType::Float64, &[8, 8], |i| f64::from(u8::from(i % 9 == 0))),
        Layout::Contiguous,
    );
    sim.call("mm", vec![t(&dsq), t(&eye)], vec![dsq.arg.clone()]).unwrap();
    assert_close(&sim.read(&dsq), &sq.data, "aliased mm");
}

#[test]
fn invalid_pointers_are_refused() {
    let sim = Sim::new(Mode::Async);
    let a = sim.place(&make(DType::Float32, &[4], 0), Layout::Contiguous);
    let on1 = sim.place_on(1, &make(DType::Float32, &[4], 0), Layout::Contiguous);
    let out = sim.empty(DType::Float32, &[4], Layout::Contiguous);
    // a device-1 tensor on a device-0 kernel
    let e = sim.call("add.Tensor", vec![t(&a), t(&on1), scalar_i(1)], vec![out.arg.clone()]).unwrap_err();
    assert!(e.message().contains("device 1") && e.message().contains("add.Tensor"), "{}", e.message());
    // a view reaching past its allocation
    let mut big = a.arg.clone();
    big.shape = vec![5];
    let e = sim.call("neg", vec![Arg::Tensor(big)], vec![out.arg.clone()]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("neg"), "{}", e.message());
    // a pointer the allocator never returned
    let mut bogus = a.arg.clone();
    bogus.data = torchfl_sim::TensorData::Device { device: 0, ptr: 0x1000, byte_offset: 0 };
    assert!(sim.call("neg", vec![Arg::Tensor(bogus)], vec![out.arg.clone()]).is_err());
    // a freed buffer
    sim.rt.deallocate(0, a.ptr).unwrap();
    let e = sim.call("neg", vec![t(&a)], vec![out.arg.clone()]).unwrap_err();
    assert!(e.message().contains("not inside a live allocation"), "{}", e.message());
    // an output with internal overlap
    let mut expanded = out.arg.clone();
    expanded.strides = vec![0];
    let e = sim.call("zero_", vec![Arg::Tensor(expanded.clone())], vec![expanded]).unwrap_err();
    assert!(e.message().contains("more than one element of the written-to tensor"), "{}", e.message());
}

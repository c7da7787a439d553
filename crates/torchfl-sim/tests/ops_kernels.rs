//! The activation, softmax, loss, indexing, random, reduction and optimizer
//! math kernels against naive references written here: dtypes, strided and
//! transposed layouts, in-place forms, errors; in async and sync modes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop, clippy::type_complexity)]

mod common;

use common::*;
use torchfl_sim::{Arg, Call, DType, ErrorCode, Mode, Rng, Scalar, TensorArg};

const MODES: [Mode; 2] = [Mode::Async, Mode::Sync];
const REALS: [DType; 2] = [DType::Float32, DType::Float64];

fn vals(dtype: DType, shape: &[usize], salt: usize) -> HTensor {
    HTensor::new(dtype, shape, |i| ((i * 7 + salt * 13) as f64 * 0.37).sin() * 3.0)
}

fn int(v: i64) -> Arg {
    Arg::Int(v)
}

/// Softmax / log-softmax along `dim` of a row-major `shape`, naively.
fn softmax_ref(x: &HTensor, dim: usize, log: bool) -> Vec<f64> {
    let shape = &x.shape;
    let inner: usize = shape[dim + 1..].iter().product();
    let n = shape[dim];
    let outer: usize = shape[..dim].iter().product();
    let mut y = vec![0.0; x.numel()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let m = (0..n).map(|j| x.data[at(j)]).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..n).map(|j| (x.data[at(j)] - m).exp()).sum();
            for j in 0..n {
                y[at(j)] = if log { x.data[at(j)] - m - s.ln() } else { (x.data[at(j)] - m).exp() / s };
            }
        }
    }
    y
}

#[test]
fn softmax_forward_and_backward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in REALS {
            let shape = [3, 4, 5];
            let x = vals(dtype, &shape, 1);
            let g = vals(dtype, &shape, 2);
            for layout in LAYOUTS {
                for dim in 0..3 {
                    for log in [false, true] {
                        let dx = sim.place(&x, layout);
                        let out = sim.empty(dtype, &shape, Layout::Contiguous);
                        let op = if log { "_log_softmax" } else { "_softmax" };
                        sim.call(
                            op,
                            vec![t(&dx), int(dim as i64 - 3), Arg::Bool(false)],
                            vec![out.arg.clone()],
                        )
                        .unwrap();
                        let y = softmax_ref(&x, dim, log);
                        assert_close(&sim.read(&out), &y, &format!("{op} {dtype:?} {layout:?} dim {dim}"));

                        // Backward against the analytic formula.
                        let yt = HTensor { dtype, shape: shape.to_vec(), data: sim.read(&out).data };
                        let (dg, dy) = (sim.place(&g, layout), sim.place(&yt, Layout::Contiguous));
                        let gi = sim.empty(dtype, &shape, Layout::Strided);
                        let bop = if log { "_log_softmax_backward_data" } else { "_softmax_backward_data" };
                        sim.call(
                            bop,
                            vec![t(&dg), t(&dy), int(dim as i64), int(dtype_code(dtype))],
                            vec![gi.arg.clone()],
                        )
                        .unwrap();
                        let inner: usize = shape[dim + 1..].iter().product();
                        let n = shape[dim];
                        let mut exp = vec![0.0; x.numel()];
                        for k in 0..x.numel() {
                            let (o, i) = (k / (n * inner), k % inner);
                            let at = |j: usize| (o * n + j) * inner + i;
                            let s: f64 = (0..n)
                                .map(|j| if log { g.data[at(j)] } else { g.data[at(j)] * yt.data[at(j)] })
                                .sum();
                            exp[k] = if log {
                                g.data[k] - yt.data[k].exp() * s
                            } else {
                                yt.data[k] * (g.data[k] - s)
                            };
                        }
                        let got = sim.read(&gi);
                        for (a, b) in got.data.iter().zip(&exp) {
                            assert!((a - b).abs() < 1e-5, "{bop} {dtype:?} {layout:?} dim {dim}: {a} vs {b}");
                        }
                    }
                }
            }
        }
        // Errors: dim out of range, integer input.
        let x = vals(DType::Float32, &[2, 3], 0);
        let dx = sim.place(&x, Layout::Contiguous);
        let out = sim.empty(DType::Float32, &[2, 3], Layout::Contiguous);
        let e =
            sim.call("_softmax", vec![t(&dx), int(2), Arg::Bool(false)], vec![out.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        let xi = sim.place(&HTensor::new(DType::Int64, &[2, 3], |i| i as f64), Layout::Contiguous);
        let oi = sim.empty(DType::Int64, &[2, 3], Layout::Contiguous);
        let e =
            sim.call("_softmax", vec![t(&xi), int(1), Arg::Bool(false)], vec![oi.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unimplemented);
    }
}

/// PyTorch's ScalarType number (only informative for the kernels).
fn dtype_code(d: DType) -> i64 {
    match d {
        DType::Float64 => 7,
        _ => 6,
    }
}

#[test]
fn nll_loss_all_reductions() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in REALS {
            let (n, c) = (6, 5);
            let x = vals(dtype, &[n, c], 3);
            let target = HTensor::new(DType::Int64, &[n], |i| [0, 4, 2, 1, 2, 3][i] as f64);
            let w = HTensor::new(dtype, &[c], |i| 0.5 + i as f64 * 0.25);
            let ignore = 2i64;
            for weighted in [false, true] {
                for reduction in 0..3i64 {
                    let dx = sim.place(&x, Layout::Transposed);
                    let dt = sim.place(&target, Layout::Strided);
                    let dw = sim.place(&w, Layout::Contiguous);
                    let warg = if weighted { t(&dw) } else { Arg::None };
                    let out_shape: Vec<usize> = if reduction == 0 { vec![n] } else { vec![] };
                    let out = sim.empty(dtype, &out_shape, Layout::Contiguous);
                    let total = sim.empty(dtype, &[], Layout::Contiguous);
                    sim.call(
                        "nll_loss_forward",
                        vec![t(&dx), t(&dt), warg.clone(), int(reduction), int(ignore)],
                        vec![out.arg.clone(), total.arg.clone()],
                    )
                    .unwrap();
                    let mut losses = vec![0.0; n];
                    let (mut sum, mut wsum) = (0.0, 0.0);
                    for i in 0..n {
                        let tg = target.data[i] as usize;
                        if tg as i64 == ignore {
                            continue;
                        }
                        let wi = if weighted { w.data[tg] } else { 1.0 };
                        losses[i] = -wi * x.data[i * c + tg];
                        sum += losses[i];
                        wsum += wi;
                    }
                    let expected = match reduction {
                        0 => losses.clone(),
                        1 => vec![sum / wsum],
                        _ => vec![sum],
                    };
                    let what = format!("nll fwd {dtype:?} w={weighted} r={reduction}");
                    assert_close(&sim.read(&out), &expected, &what);
                    if reduction != 0 {
                        assert_close(&sim.read(&total), &[wsum], &what);
                    }

                    // Backward.
                    let go = HTensor::new(dtype, &out_shape, |i| 1.0 + i as f64 * 0.5);
                    let dgo = sim.place(&go, Layout::Contiguous);
                    let gi = sim.empty(dtype, &[n, c], Layout::Transposed);
                    sim.call(
                        "nll_loss_backward",
                        vec![t(&dgo), t(&dx), t(&dt), warg, int(reduction), int(ignore), t(&total)],
                        vec![gi.arg.clone()],
                    )
                    .unwrap();
                    let mut exp = vec![0.0; n * c];
                    for i in 0..n {
                        let tg = target.data[i] as usize;
                        if tg as i64 == ignore {
                            continue;
                        }
                        let wi = if weighted { w.data[tg] } else { 1.0 };
                        let g = if reduction == 0 { go.data[i] } else { go.data[0] };
                        exp[i * c + tg] = if reduction == 1 { -wi * g / wsum } else { -wi * g };
                    }
                    assert_close(
                        &sim.read(&gi),
                        &exp,
                        &format!("nll bwd {dtype:?} w={weighted} r={reduction}"),
                    );
                }
            }
        }
        // Shape errors.
        let x = sim.place(&vals(DType::Float32, &[3, 4], 0), Layout::Contiguous);
        let tg = sim.place(&HTensor::new(DType::Int64, &[2], |_| 0.0), Layout::Contiguous);
        let (o, tw) = (
            sim.empty(DType::Float32, &[], Layout::Contiguous),
            sim.empty(DType::Float32, &[], Layout::Contiguous),
        );
        let e = sim
            .call(
                "nll_loss_forward",
                vec![t(&x), t(&tg), Arg::None, int(1), int(-100)],
                vec![o.arg.clone(), tw.arg.clone()],
            )
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
}

#[test]
fn nll_loss_unbatched_none_reports_its_weight() {
    let sim = Sim::new(Mode::Async);
    let x = vals(DType::Float32, &[4], 1);
    let w = HTensor::new(DType::Float32, &[4], |i| 0.5 + i as f64);
    let (dx, dw) = (sim.place(&x, Layout::Contiguous), sim.place(&w, Layout::Contiguous));
    let tg = sim.place(&HTensor::new(DType::Int64, &[], |_| 2.0), Layout::Contiguous);
    let (o, tw) = (
        sim.empty(DType::Float32, &[], Layout::Contiguous),
        sim.empty(DType::Float32, &[], Layout::Contiguous),
    );
    sim.call(
        "nll_loss_forward",
        vec![t(&dx), t(&tg), t(&dw), int(0), int(-100)],
        vec![o.arg.clone(), tw.arg.clone()],
    )
    .unwrap();
    assert_close(&sim.read(&o), &[-w.data[2] * x.data[2]], "unbatched none");
    assert_close(&sim.read(&tw), &[w.data[2]], "unbatched none total_weight");
}

#[test]
fn nll_loss_target_out_of_bounds_is_reported() {
    let sim = Sim::new(Mode::Sync);
    let x = sim.place(&vals(DType::Float32, &[2, 3], 0), Layout::Contiguous);
    let tg = sim.place(&HTensor::new(DType::Int64, &[2], |i| (i * 7) as f64), Layout::Contiguous);
    let (o, tw) = (
        sim.empty(DType::Float32, &[], Layout::Contiguous),
        sim.empty(DType::Float32, &[], Layout::Contiguous),
    );
    let r = sim
        .call(
            "nll_loss_forward",
            vec![t(&x), t(&tg), Arg::None, int(1), int(-100)],
            vec![o.arg.clone(), tw.arg.clone()],
        )
        .and_then(|_| sim.rt.synchronize_device(0));
    assert!(r.is_err());
}

/// Optimizer math: in place, strided, broadcast.
#[test]
fn addcmul_addcdiv_lerp_and_unary_math() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in FLOATS {
            let shape = [4, 6];
            let a = vals(dtype, &shape, 1);
            let b = vals(dtype, &shape, 2);
            let c = HTensor::new(dtype, &shape, |i| 0.5 + (i % 5) as f64 * 0.3);
            for (la, lb) in [(Layout::Contiguous, Layout::Contiguous), (Layout::Transposed, Layout::Strided)]
            {
                let what = format!("{dtype:?} {la:?}/{lb:?}");
                // addcmul_ in place (outputs[0] is self).
                let da = sim.place(&a, la);
                let (db, dc) = (sim.place(&b, lb), sim.place(&c, lb));
                sim.call("addcmul", vec![t(&da), t(&db), t(&dc), scalar_f(0.5)], vec![da.arg.clone()])
                    .unwrap();
                let exp: Vec<f64> = (0..a.numel())
                    .map(|i| {
                        round_to(
                            dtype,
                            a.data[i]
                                + round_to(
                                    if dtype == DType::Float64 { dtype } else { DType::Float32 },
                                    0.5 * b.data[i] * c.data[i],
                                ),
                        )
                    })
                    .collect();
                assert_close(&sim.read(&da), &exp, &format!("addcmul_ {what}"));
                // addcdiv into a fresh output.
                let da = sim.place(&a, la);
                let out = sim.empty(dtype, &shape, lb);
                sim.call("addcdiv", vec![t(&da), t(&db), t(&dc), scalar_f(-2.0)], vec![out.arg.clone()])
                    .unwrap();
                let exp: Vec<f64> = (0..a.numel()).map(|i| a.data[i] - 2.0 * b.data[i] / c.data[i]).collect();
                assert_close(&sim.read(&out), &exp, &format!("addcdiv {what}"));
                // lerp.Scalar on both sides of 0.5, lerp.Tensor.
                for w in [0.1, 0.9] {
                    sim.call("lerp.Scalar", vec![t(&da), t(&db), scalar_f(w)], vec![out.arg.clone()])
                        .unwrap();
                    let exp: Vec<f64> =
                        (0..a.numel()).map(|i| a.data[i] + w * (b.data[i] - a.data[i])).collect();
                    assert_close(&sim.read(&out), &exp, &format!("lerp {w} {what}"));
                }
                sim.call("lerp.Tensor", vec![t(&da), t(&db), t(&dc)], vec![out.arg.clone()]).unwrap();
                let exp: Vec<f64> =
                    (0..a.numel()).map(|i| a.data[i] + c.data[i] * (b.data[i] - a.data[i])).collect();
                assert_close(&sim.read(&out), &exp, &format!("lerp.Tensor {what}"));
                // Unary math.
                let ops: [(&str, fn(f64) -> f64); 7] = [
                    ("sqrt", f64::sqrt),
                    ("rsqrt", |x| 1.0 / x.sqrt()),
                    ("exp", f64::exp),
                    ("log", f64::ln),
                    ("reciprocal", |x| 1.0 / x),
                    ("sigmoid", |x| 1.0 / (1.0 + (-x).exp())),
                    ("tanh", f64::tanh),
                ];
                for (op, f) in ops {
                    sim.call(op, vec![t(&dc)], vec![out.arg.clone()]).unwrap();
                    let exp: Vec<f64> = c.data.iter().map(|&x| f(x)).collect();
                    assert_close(&sim.read(&out), &exp, &format!("{op} {what}"));
                }
                sim.call("pow.Tensor_Scalar", vec![t(&dc), scalar_f(2.5)], vec![out.arg.clone()]).unwrap();
                assert_close(&sim.read(&out), &c.data.iter().map(|x| x.powf(2.5)).collect::<Vec<_>>(), "pow");
                sim.call("abs.out", vec![t(&db)], vec![out.arg.clone()]).unwrap();
                assert_close(&sim.read(&out), &b.data.iter().map(|x| x.abs()).collect::<Vec<_>>(), "abs");
                sim.call("sign", vec![t(&db)], vec![out.arg.clone()]).unwrap();
                assert_close(&sim.read(&out), &b.data.iter().map(|x| x.signum()).collect::<Vec<_>>(), "sign");
                sim.call("maximum", vec![t(&da), t(&db)], vec![out.arg.clone()]).unwrap();
                let exp: Vec<f64> = (0..a.numel()).map(|i| a.data[i].max(b.data[i])).collect();
                assert_close(&sim.read(&out), &exp, &format!("maximum {what}"));
                sim.call("clamp", vec![t(&da), scalar_f(-0.5), scalar_f(0.5)], vec![out.arg.clone()])
                    .unwrap();
                let exp: Vec<f64> = a.data.iter().map(|x| x.clamp(-0.5, 0.5)).collect();
                assert_close(&sim.read(&out), &exp, &format!("clamp {what}"));
            }
        }
        // Integer addcdiv is refused; integer sqrt output falls back.
        let di = sim.place(&HTensor::new(DType::Int64, &[3], |i| i as f64), Layout::Contiguous);
        let e =
            sim.call("addcdiv", vec![t(&di), t(&di), t(&di), scalar_i(1)], vec![di.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        let e = sim.call("sqrt", vec![t(&di)], vec![di.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unimplemented);
    }
}

#[test]
fn where_broadcasts_and_promotes() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let cond = HTensor::new(DType::Bool, &[3, 1], |i| (i % 2) as f64);
        let a = vals(DType::Float32, &[3, 4], 1);
        let b = HTensor::new(DType::Int64, &[4], |i| i as f64 * 10.0);
        let (dc, da, db) = (
            sim.place(&cond, Layout::Contiguous),
            sim.place(&a, Layout::Transposed),
            sim.place(&b, Layout::Strided),
        );
        let out = sim.empty(DType::Float32, &[3, 4], Layout::Contiguous);
        sim.call("where.self", vec![t(&dc), t(&da), t(&db)], vec![out.arg.clone()]).unwrap();
        let exp: Vec<f64> =
            (0..12).map(|k| if cond.data[k / 4] != 0.0 { a.data[k] } else { b.data[k % 4] }).collect();
        assert_close(&sim.read(&out), &exp, "where");
        let e = sim.call("where.self", vec![t(&da), t(&da), t(&db)], vec![out.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
}

#[test]
fn selection_and_logical_reductions() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in [DType::Float32, DType::Float64, DType::Int64, DType::Int32] {
            let shape = [3, 5];
            let x = HTensor::new(dtype, &shape, |i| ((i * 7) % 11) as f64 - 4.0);
            let dx = sim.place(&x, Layout::Transposed);
            // max.dim over dim 1 with indices (first occurrence on ties).
            let (v, ix) =
                (sim.empty(dtype, &[3], Layout::Contiguous), sim.empty(DType::Int64, &[3], Layout::Strided));
            sim.call("max.dim", vec![t(&dx), int(1), Arg::Bool(false)], vec![v.arg.clone(), ix.arg.clone()])
                .unwrap();
            let mut ev = vec![0.0; 3];
            let mut ei = vec![0.0; 3];
            for r in 0..3 {
                let row = &x.data[r * 5..r * 5 + 5];
                let (mut bi, mut bv) = (0, row[0]);
                for (j, &val) in row.iter().enumerate() {
                    if val > bv {
                        bv = val;
                        bi = j;
                    }
                }
                ev[r] = bv;
                ei[r] = bi as f64;
            }
            assert_close(&sim.read(&v), &ev, &format!("max.dim values {dtype:?}"));
            assert_close(&sim.read(&ix), &ei, &format!("max.dim indices {dtype:?}"));
            // argmin over dim 0, keepdim.
            let am = sim.empty(DType::Int64, &[1, 5], Layout::Contiguous);
            sim.call("argmin", vec![t(&dx), int(0), Arg::Bool(true)], vec![am.arg.clone()]).unwrap();
            let exp: Vec<f64> = (0..5)
                .map(|cidx| {
                    let col: Vec<f64> = (0..3).map(|r| x.data[r * 5 + cidx]).collect();
                    let mut bi = 0;
                    for r in 1..3 {
                        if col[r] < col[bi] {
                            bi = r;
                        }
                    }
                    bi as f64
                })
                .collect();
            assert_close(&sim.read(&am), &exp, &format!("argmin {dtype:?}"));
            // argmax over everything: the flat index.
            let ag = sim.empty(DType::Int64, &[], Layout::Contiguous);
            sim.call("argmax", vec![t(&dx), Arg::None, Arg::Bool(false)], vec![ag.arg.clone()]).unwrap();
            let mut bi = 0;
            for k in 0..15 {
                if x.data[k] > x.data[bi] {
                    bi = k;
                }
            }
            assert_close(&sim.read(&ag), &[bi as f64], &format!("argmax all {dtype:?}"));
            // amax over dims [0, 1], amin full.
            let mx = sim.empty(dtype, &[], Layout::Contiguous);
            sim.call("amax", vec![t(&dx), Arg::IntList(vec![0, 1]), Arg::Bool(false)], vec![mx.arg.clone()])
                .unwrap();
            assert_close(&sim.read(&mx), &[x.data.iter().cloned().fold(f64::MIN, f64::max)], "amax");
            // all / any per row.
            let o = sim.empty(DType::Bool, &[3], Layout::Contiguous);
            sim.call("all.dim", vec![t(&dx), int(1), Arg::Bool(false)], vec![o.arg.clone()]).unwrap();
            let exp: Vec<f64> = (0..3)
                .map(|r| f64::from(u8::from(x.data[r * 5..r * 5 + 5].iter().all(|&v| v != 0.0))))
                .collect();
            assert_close(&sim.read(&o), &exp, &format!("all.dim {dtype:?}"));
            let o1 = sim.empty(DType::Bool, &[], Layout::Contiguous);
            sim.call("any", vec![t(&dx)], vec![o1.arg.clone()]).unwrap();
            assert_close(&sim.read(&o1), &[1.0], "any");
        }
        // NaN wins max.
        let x = HTensor::new(DType::Float32, &[4], |i| if i == 2 { f64::NAN } else { i as f64 });
        let dx = sim.place(&x, Layout::Contiguous);
        let (v, ix) = (
            sim.empty(DType::Float32, &[], Layout::Contiguous),
            sim.empty(DType::Int64, &[], Layout::Contiguous),
        );
        sim.call("max.dim", vec![t(&dx), int(0)], vec![v.arg.clone(), ix.arg.clone()]).unwrap();
        assert!(sim.read(&v).data[0].is_nan());
        assert_eq!(sim.read(&ix).data[0], 2.0);
        // Empty reduction dimension.
        let de = sim.place(&HTensor::new(DType::Float32, &[2, 0], |_| 0.0), Layout::Contiguous);
        let (v, ix) = (
            sim.empty(DType::Float32, &[2], Layout::Contiguous),
            sim.empty(DType::Int64, &[2], Layout::Contiguous),
        );
        let e = sim.call("max.dim", vec![t(&de), int(1)], vec![v.arg.clone(), ix.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
}

#[test]
fn index_select_cat_and_embedding_backward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in [DType::Float32, DType::Float64, DType::Int64, DType::Float16] {
            let w = HTensor::new(dtype, &[6, 4], |i| i as f64);
            let idx = HTensor::new(DType::Int64, &[5], |i| [3, 0, 5, 3, 1][i] as f64);
            for layout in LAYOUTS {
                let (dw, di) = (sim.place(&w, layout), sim.place(&idx, Layout::Strided));
                let out = sim.empty(dtype, &[5, 4], Layout::Contiguous);
                sim.call("index_select", vec![t(&dw), int(0), t(&di)], vec![out.arg.clone()]).unwrap();
                let exp: Vec<f64> = (0..20).map(|k| w.data[idx.data[k / 4] as usize * 4 + k % 4]).collect();
                assert_close(&sim.read(&out), &exp, &format!("index_select d0 {dtype:?} {layout:?}"));
                let idx1 =
                    sim.place(&HTensor::new(DType::Int32, &[2], |i| [3.0, 1.0][i]), Layout::Contiguous);
                let out1 = sim.empty(dtype, &[6, 2], Layout::Transposed);
                sim.call("index_select", vec![t(&dw), int(-1), t(&idx1)], vec![out1.arg.clone()]).unwrap();
                let exp: Vec<f64> = (0..12).map(|k| w.data[(k / 2) * 4 + [3, 1][k % 2]]).collect();
                assert_close(&sim.read(&out1), &exp, &format!("index_select d1 {dtype:?} {layout:?}"));
            }
        }
        // cat: mixed dtypes promote to the output, legacy empty skipped.
        let a = vals(DType::Float32, &[2, 3], 1);
        let b = HTensor::new(DType::Int64, &[2, 2], |i| i as f64);
        let e = HTensor::new(DType::Float32, &[0], |_| 0.0);
        let (da, db, de) = (
            sim.place(&a, Layout::Transposed),
            sim.place(&b, Layout::Strided),
            sim.place(&e, Layout::Contiguous),
        );
        let out = sim.empty(DType::Float64, &[2, 5], Layout::Contiguous);
        let list = Arg::TensorList(vec![Some(da.arg.clone()), Some(de.arg.clone()), Some(db.arg.clone())]);
        sim.call("cat", vec![list, int(1)], vec![out.arg.clone()]).unwrap();
        let exp: Vec<f64> = (0..10)
            .map(|k| if k % 5 < 3 { a.data[(k / 5) * 3 + k % 5] } else { b.data[(k / 5) * 2 + k % 5 - 3] })
            .collect();
        assert_close(&sim.read(&out), &exp, "cat dim 1");
        let bad = Arg::TensorList(vec![Some(da.arg.clone()), Some(db.arg.clone())]);
        let out0 = sim.empty(DType::Float64, &[4, 3], Layout::Contiguous);
        assert_eq!(
            sim.call("cat", vec![bad, int(0)], vec![out0.arg.clone()]).unwrap_err().code(),
            ErrorCode::InvalidArgument
        );

        // embedding_dense_backward with padding and frequency scaling.
        for dtype in REALS {
            let idx = HTensor::new(DType::Int64, &[2, 3], |i| [1, 3, 3, 0, 4, 1][i] as f64);
            let g = vals(dtype, &[2, 3, 4], 5);
            for (pad, scale) in [(-1i64, false), (3, false), (-1, true)] {
                let (di, dg) = (sim.place(&idx, Layout::Transposed), sim.place(&g, Layout::Strided));
                let out = sim.empty(dtype, &[5, 4], Layout::Contiguous);
                sim.call(
                    "embedding_dense_backward",
                    vec![t(&dg), t(&di), int(5), int(pad), Arg::Bool(scale)],
                    vec![out.arg.clone()],
                )
                .unwrap();
                let mut exp = vec![0.0; 20];
                let mut count = [0.0; 5];
                for k in 0..6 {
                    count[idx.data[k] as usize] += 1.0;
                }
                for k in 0..6 {
                    let r = idx.data[k] as usize;
                    if r as i64 == pad {
                        continue;
                    }
                    for j in 0..4 {
                        exp[r * 4 + j] += g.data[k * 4 + j] / if scale { count[r] } else { 1.0 };
                    }
                }
                assert_close(
                    &sim.read(&out),
                    &exp,
                    &format!("embedding backward {dtype:?} pad {pad} scale {scale}"),
                );
            }
        }
    }
}

#[test]
fn index_out_of_range_is_reported() {
    let sim = Sim::new(Mode::Sync);
    let w = sim.place(&vals(DType::Float32, &[3, 2], 0), Layout::Contiguous);
    let idx = sim.place(&HTensor::new(DType::Int64, &[1], |_| 3.0), Layout::Contiguous);
    let out = sim.empty(DType::Float32, &[1, 2], Layout::Contiguous);
    let r = sim
        .call("index_select", vec![t(&w), int(0), t(&idx)], vec![out.arg.clone()])
        .and_then(|_| sim.rt.synchronize_device(0));
    assert!(r.is_err());
}

fn erf(x: f64) -> f64 {
    // Naive Taylor series, plenty for |x| < 3.
    let mut sum = 0.0;
    let mut term = x;
    for n in 0..200 {
        sum += term / (2 * n + 1) as f64;
        term *= -x * x / (n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn activations_and_their_backward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in FLOATS {
            let x = HTensor::new(dtype, &[3, 7], |i| (i as f64 - 10.0) * 0.25);
            let g = vals(dtype, &[3, 7], 4);
            let (dx, dg) = (sim.place(&x, Layout::Transposed), sim.place(&g, Layout::Strided));
            let out = sim.empty(dtype, &[3, 7], Layout::Contiguous);
            let phi = |v: f64| 0.5 * (1.0 + erf(v / 2f64.sqrt()));
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let gelu_t = |v: f64| 0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh());
            let cases: Vec<(&str, Vec<Arg>, Box<dyn Fn(f64) -> f64>)> = vec![
                ("gelu", vec![t(&dx)], Box::new(move |v| v * phi(v))),
                ("gelu", vec![t(&dx), Arg::Str("tanh".into())], Box::new(gelu_t)),
                ("silu", vec![t(&dx)], Box::new(|v| v / (1.0 + (-v).exp()))),
                ("hardtanh", vec![t(&dx), scalar_f(-1.0), scalar_f(0.5)], Box::new(|v| v.clamp(-1.0, 0.5))),
                ("leaky_relu", vec![t(&dx), scalar_f(0.2)], Box::new(|v| if v > 0.0 { v } else { 0.2 * v })),
            ];
            for (op, args, f) in cases {
                sim.call(op, args, vec![out.arg.clone()]).unwrap();
                let exp: Vec<f64> = x.data.iter().map(|&v| f(v)).collect();
                assert_close(&sim.read(&out), &exp, &format!("{op} {dtype:?}"));
            }
            // Backward ops against numeric derivatives / formulas.
            let gelu_d = |v: f64| phi(v) + v * (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt();
            sim.call("gelu_backward", vec![t(&dg), t(&dx)], vec![out.arg.clone()]).unwrap();
            let exp: Vec<f64> = (0..21).map(|i| g.data[i] * gelu_d(x.data[i])).collect();
            assert_close(&sim.read(&out), &exp, &format!("gelu_backward {dtype:?}"));
            sim.call("gelu_backward", vec![t(&dg), t(&dx), Arg::Str("tanh".into())], vec![out.arg.clone()])
                .unwrap();
            let h = 1e-6;
            let exp: Vec<f64> = (0..21)
                .map(|i| g.data[i] * (gelu_t(x.data[i] + h) - gelu_t(x.data[i] - h)) / (2.0 * h))
                .collect();
            let got = sim.read(&out);
            for (a, b) in got.data.iter().zip(&exp) {
                assert!(
                    (a - b).abs() <= 2.0 * tol(dtype).max(1e-6) * b.abs().max(1.0),
                    "gelu tanh backward {a} vs {b}"
                );
            }
            sim.call("sigmoid_backward", vec![t(&dg), t(&dx)], vec![out.arg.clone()]).unwrap();
            let exp: Vec<f64> = (0..21).map(|i| g.data[i] * (1.0 - x.data[i]) * x.data[i]).collect();
            assert_close(&sim.read(&out), &exp, &format!("sigmoid_backward {dtype:?}"));
            sim.call("tanh_backward", vec![t(&dg), t(&dx)], vec![out.arg.clone()]).unwrap();
            let exp: Vec<f64> = (0..21).map(|i| g.data[i] * (1.0 - x.data[i] * x.data[i])).collect();
            assert_close(&sim.read(&out), &exp, &format!("tanh_backward {dtype:?}"));
            sim.call(
                "hardtanh_backward",
                vec![t(&dg), t(&dx), scalar_f(-1.0), scalar_f(0.5)],
                vec![out.arg.clone()],
            )
            .unwrap();
            let exp: Vec<f64> = (0..21)
                .map(|i| if x.data[i] <= -1.0 || x.data[i] >= 0.5 { 0.0 } else { g.data[i] })
                .collect();
            assert_close(&sim.read(&out), &exp, &format!("hardtanh_backward {dtype:?}"));
            sim.call(
                "leaky_relu_backward",
                vec![t(&dg), t(&dx), scalar_f(0.2), Arg::Bool(false)],
                vec![out.arg.clone()],
            )
            .unwrap();
            let exp: Vec<f64> =
                (0..21).map(|i| if x.data[i] > 0.0 { g.data[i] } else { 0.2 * g.data[i] }).collect();
            assert_close(&sim.read(&out), &exp, &format!("leaky_relu_backward {dtype:?}"));
        }
        let dx = sim.place(&vals(DType::Float32, &[2], 0), Layout::Contiguous);
        let out = sim.empty(DType::Float32, &[2], Layout::Contiguous);
        let e = sim.call("gelu", vec![t(&dx), Arg::Str("fast".into())], vec![out.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
}

/// Launches a random op with an explicit generator state.
fn call_rng(sim: &Sim, op: &str, args: Vec<Arg>, outputs: Vec<TensorArg>, seed: u64, offset: u64) {
    sim.rt
        .launch(
            op,
            &Call {
                op_name: op.to_owned(),
                device: 0,
                stream: sim.stream,
                args,
                outputs,
                rng: Rng { seed, offset },
            },
        )
        .unwrap();
}

#[test]
fn random_fills_are_reproducible_and_distributed() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let n = 20_000;
        for dtype in [DType::Float32, DType::Float64] {
            // uniform_: same state, same numbers, whatever the layout.
            let a = sim.empty(dtype, &[n], Layout::Contiguous);
            let b = sim.empty(dtype, &[100, n / 100], Layout::Transposed);
            call_rng(
                &sim,
                "uniform_",
                vec![t(&a), Arg::Float(-1.0), Arg::Float(3.0)],
                vec![a.arg.clone()],
                42,
                7,
            );
            call_rng(
                &sim,
                "uniform_",
                vec![t(&b), Arg::Float(-1.0), Arg::Float(3.0)],
                vec![b.arg.clone()],
                42,
                7,
            );
            let (ra, rb) = (sim.read(&a), sim.read(&b));
            assert_eq!(ra.data, rb.data, "uniform_ depends only on (seed, offset, index)");
            assert!(ra.data.iter().all(|&v| (-1.0..3.0).contains(&v)));
            let mean = ra.data.iter().sum::<f64>() / n as f64;
            assert!((mean - 1.0).abs() < 0.05, "uniform mean {mean}");
            // A different offset gives different numbers, shifted by the offset.
            call_rng(
                &sim,
                "uniform_",
                vec![t(&b), Arg::Float(-1.0), Arg::Float(3.0)],
                vec![b.arg.clone()],
                42,
                8,
            );
            let rc = sim.read(&b);
            assert_eq!(&rc.data[..n - 1], &ra.data[1..], "element i uses counter offset + i");
            // normal_.
            call_rng(
                &sim,
                "normal_",
                vec![t(&a), Arg::Float(2.0), Arg::Float(0.5)],
                vec![a.arg.clone()],
                1,
                0,
            );
            let r = sim.read(&a);
            let mean = r.data.iter().sum::<f64>() / n as f64;
            let var = r.data.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
            assert!((mean - 2.0).abs() < 0.02 && (var.sqrt() - 0.5).abs() < 0.02, "normal {mean} {var}");
        }
        // bernoulli_ (float p) into int64, (tensor p) into float.
        let a = sim.empty(DType::Int64, &[n], Layout::Strided);
        call_rng(&sim, "bernoulli_.float", vec![t(&a), Arg::Float(0.25)], vec![a.arg.clone()], 3, 0);
        let r = sim.read(&a);
        assert!(r.data.iter().all(|&v| v == 0.0 || v == 1.0));
        let mean = r.data.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.25).abs() < 0.02, "bernoulli {mean}");
        let p = sim.place(&HTensor::new(DType::Float32, &[2, 1], |i| [0.0, 1.0][i]), Layout::Contiguous);
        let b = sim.empty(DType::Float32, &[2, 50], Layout::Contiguous);
        call_rng(&sim, "bernoulli_.Tensor", vec![t(&b), t(&p)], vec![b.arg.clone()], 3, 0);
        let r = sim.read(&b);
        assert!(r.data[..50].iter().all(|&v| v == 0.0) && r.data[50..].iter().all(|&v| v == 1.0));
        // random_ overloads.
        let c = sim.empty(DType::Int64, &[n], Layout::Contiguous);
        call_rng(&sim, "random_.from", vec![t(&c), int(-3), int(4)], vec![c.arg.clone()], 9, 0);
        let r = sim.read(&c);
        assert!(r.data.iter().all(|&v| (-3.0..4.0).contains(&v)));
        for v in -3..4 {
            assert!(r.data.contains(&(v as f64)), "random_ covers {v}");
        }
        call_rng(&sim, "random_.to", vec![t(&c), int(5)], vec![c.arg.clone()], 9, 0);
        assert!(sim.read(&c).data.iter().all(|&v| (0.0..5.0).contains(&v)));
        let f = sim.empty(DType::Float16, &[1000], Layout::Contiguous);
        call_rng(&sim, "random_", vec![t(&f)], vec![f.arg.clone()], 9, 0);
        assert!(sim.read(&f).data.iter().all(|&v| (0.0..=2048.0).contains(&v) && v.fract() == 0.0));
        // Errors.
        let e = sim
            .rt
            .launch(
                "uniform_",
                &Call {
                    op_name: "uniform_".into(),
                    device: 0,
                    stream: sim.stream,
                    args: vec![t(&c), Arg::Float(2.0), Arg::Float(1.0)],
                    outputs: vec![sim.empty(DType::Float32, &[2], Layout::Contiguous).arg],
                    rng: Rng::default(),
                },
            )
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
}

#[test]
fn dropout_forward_and_backward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in FLOATS {
            let n = 10_000;
            let x = HTensor::new(dtype, &[100, n / 100], |i| 1.0 + (i % 3) as f64);
            let dx = sim.place(&x, Layout::Transposed);
            let (out, mask) = (
                sim.empty(dtype, &[100, n / 100], Layout::Contiguous),
                sim.empty(DType::Bool, &[100, n / 100], Layout::Contiguous),
            );
            call_rng(
                &sim,
                "native_dropout",
                vec![t(&dx), Arg::Float(0.3), Arg::Bool(true)],
                vec![out.arg.clone(), mask.arg.clone()],
                5,
                0,
            );
            let (o, m) = (sim.read(&out), sim.read(&mask));
            let kept = m.data.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
            assert!((kept - 0.7).abs() < 0.03, "kept {kept}");
            let exp: Vec<f64> =
                (0..n).map(|i| if m.data[i] != 0.0 { x.data[i] / 0.7 } else { 0.0 }).collect();
            assert_close(&o, &exp, &format!("dropout {dtype:?}"));
            // Eval mode: a copy and an all-true mask.
            call_rng(
                &sim,
                "native_dropout",
                vec![t(&dx), Arg::Float(0.3), Arg::Bool(false)],
                vec![out.arg.clone(), mask.arg.clone()],
                5,
                0,
            );
            assert_close(&sim.read(&out), &x.data, "dropout eval");
            assert!(sim.read(&mask).data.iter().all(|&v| v == 1.0));
            // Backward.
            let g = vals(dtype, &[100, n / 100], 2);
            let mask_h = HTensor::new(DType::Bool, &[100, n / 100], |i| m.data[i]);
            let (dg, dm) = (sim.place(&g, Layout::Strided), sim.place(&mask_h, Layout::Contiguous));
            sim.call(
                "native_dropout_backward",
                vec![t(&dg), t(&dm), Arg::Float(1.0 / 0.7)],
                vec![out.arg.clone()],
            )
            .unwrap();
            let exp: Vec<f64> = (0..n).map(|i| g.data[i] * m.data[i] / 0.7).collect();
            assert_close(&sim.read(&out), &exp, &format!("dropout backward {dtype:?}"));
        }
        let _ = Scalar::Int(0);
    }
}

#[test]
fn masked_fill_bitwise_nan_to_num_softplus() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in [DType::Float32, DType::Float64, DType::Int64, DType::Float16] {
            let a = HTensor::new(dtype, &[3, 4], |i| i as f64 - 5.0);
            let mask = HTensor::new(DType::Bool, &[4], |i| (i % 2) as f64);
            let (da, dm) = (sim.place(&a, Layout::Transposed), sim.place(&mask, Layout::Strided));
            sim.call("masked_fill_.Scalar", vec![t(&da), t(&dm), scalar_i(7)], vec![da.arg.clone()]).unwrap();
            let exp: Vec<f64> =
                (0..12).map(|k| if mask.data[k % 4] != 0.0 { 7.0 } else { a.data[k] }).collect();
            assert_close(&sim.read(&da), &exp, &format!("masked_fill_ {dtype:?}"));
            // A 0-dim device tensor as the value.
            let v = sim.place(&HTensor::new(dtype, &[], |_| -2.0), Layout::Contiguous);
            let da = sim.place(&a, Layout::Contiguous);
            sim.call("masked_fill_.Tensor", vec![t(&da), t(&dm), t(&v)], vec![da.arg.clone()]).unwrap();
            let exp: Vec<f64> =
                (0..12).map(|k| if mask.data[k % 4] != 0.0 { -2.0 } else { a.data[k] }).collect();
            assert_close(&sim.read(&da), &exp, &format!("masked_fill_.Tensor {dtype:?}"));
        }
        // Bitwise ops on int64 and bool.
        let a = HTensor::new(DType::Int64, &[6], |i| i as f64 - 3.0);
        let b = HTensor::new(DType::Int64, &[6], |i| (i * 5 % 7) as f64);
        let (da, db) = (sim.place(&a, Layout::Strided), sim.place(&b, Layout::Contiguous));
        let out = sim.empty(DType::Int64, &[6], Layout::Contiguous);
        for (op, f) in [
            ("bitwise_and.Tensor", (|x, y| x & y) as fn(i64, i64) -> i64),
            ("bitwise_or.Tensor", |x, y| x | y),
            ("bitwise_xor.Tensor", |x, y| x ^ y),
        ] {
            sim.call(op, vec![t(&da), t(&db)], vec![out.arg.clone()]).unwrap();
            let exp: Vec<f64> = (0..6).map(|i| f(a.data[i] as i64, b.data[i] as i64) as f64).collect();
            assert_close(&sim.read(&out), &exp, op);
        }
        sim.call("bitwise_not", vec![t(&da)], vec![out.arg.clone()]).unwrap();
        assert_close(&sim.read(&out), &a.data.iter().map(|&x| !(x as i64) as f64).collect::<Vec<_>>(), "not");
        let bm =
            sim.place(&HTensor::new(DType::Bool, &[6], |i| (i % 3 == 0) as u8 as f64), Layout::Contiguous);
        let ob = sim.empty(DType::Bool, &[6], Layout::Contiguous);
        sim.call("bitwise_not", vec![t(&bm)], vec![ob.arg.clone()]).unwrap();
        assert_close(
            &sim.read(&ob),
            &(0..6).map(|i| f64::from(u8::from(i % 3 != 0))).collect::<Vec<_>>(),
            "bool not",
        );
        // nan_to_num with defaults and explicit replacements.
        for dtype in REALS {
            let x = HTensor::new(dtype, &[4], |i| [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.5][i]);
            let dx = sim.place(&x, Layout::Contiguous);
            let o = sim.empty(dtype, &[4], Layout::Contiguous);
            sim.call("nan_to_num.out", vec![t(&dx), Arg::None, Arg::None, Arg::None], vec![o.arg.clone()])
                .unwrap();
            let big = if dtype == DType::Float32 { f64::from(f32::MAX) } else { f64::MAX };
            assert_close(&sim.read(&o), &[0.0, big, -big, 1.5], "nan_to_num default");
            sim.call(
                "nan_to_num.out",
                vec![t(&dx), Arg::Float(1.0), Arg::Float(2.0), Arg::Float(-3.0)],
                vec![o.arg.clone()],
            )
            .unwrap();
            assert_close(&sim.read(&o), &[1.0, 2.0, -3.0, 1.5], "nan_to_num");
            // softplus and its backward.
            let x = HTensor::new(dtype, &[8], |i| i as f64 - 4.0);
            let g = vals(dtype, &[8], 1);
            let (dx, dg) = (sim.place(&x, Layout::Strided), sim.place(&g, Layout::Contiguous));
            let o = sim.empty(dtype, &[8], Layout::Contiguous);
            sim.call("softplus", vec![t(&dx), scalar_f(2.0), scalar_f(5.0)], vec![o.arg.clone()]).unwrap();
            let exp: Vec<f64> = x
                .data
                .iter()
                .map(|&v| if 2.0 * v > 5.0 { v } else { (1.0 + (2.0 * v).exp()).ln() / 2.0 })
                .collect();
            assert_close(&sim.read(&o), &exp, "softplus");
            sim.call(
                "softplus_backward",
                vec![t(&dg), t(&dx), scalar_f(2.0), scalar_f(5.0)],
                vec![o.arg.clone()],
            )
            .unwrap();
            let exp: Vec<f64> = (0..8)
                .map(|i| {
                    let z = (2.0 * x.data[i]).exp();
                    if 2.0 * x.data[i] > 5.0 {
                        g.data[i]
                    } else {
                        g.data[i] * z / (z + 1.0)
                    }
                })
                .collect();
            assert_close(&sim.read(&o), &exp, "softplus_backward");
        }
    }
}

#[test]
fn vector_norm_and_prod() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in REALS {
            let x = vals(dtype, &[3, 4], 2);
            let dx = sim.place(&x, Layout::Transposed);
            for ord in [2.0, 1.0, f64::INFINITY, f64::NEG_INFINITY, 0.0, 3.0] {
                let out = sim.empty(dtype, &[3, 1], Layout::Contiguous);
                sim.call(
                    "linalg_vector_norm",
                    vec![t(&dx), scalar_f(ord), Arg::IntList(vec![1]), Arg::Bool(true), Arg::None],
                    vec![out.arg.clone()],
                )
                .unwrap();
                let exp: Vec<f64> = (0..3)
                    .map(|r| {
                        let row = &x.data[r * 4..r * 4 + 4];
                        if ord == f64::INFINITY {
                            row.iter().fold(0.0, |a: f64, v| a.max(v.abs()))
                        } else if ord == f64::NEG_INFINITY {
                            row.iter().fold(f64::INFINITY, |a: f64, v| a.min(v.abs()))
                        } else if ord == 0.0 {
                            row.iter().filter(|&&v| v != 0.0).count() as f64
                        } else {
                            row.iter().map(|v| v.abs().powf(ord)).sum::<f64>().powf(1.0 / ord)
                        }
                    })
                    .collect();
                assert_close(&sim.read(&out), &exp, &format!("vector_norm {ord} {dtype:?}"));
            }
            let out = sim.empty(dtype, &[], Layout::Contiguous);
            sim.call("linalg_vector_norm", vec![t(&dx)], vec![out.arg.clone()]).unwrap();
            assert_close(&sim.read(&out), &[x.data.iter().map(|v| v * v).sum::<f64>().sqrt()], "norm all");
            sim.call("prod", vec![t(&dx)], vec![out.arg.clone()]).unwrap();
            assert_close(&sim.read(&out), &[x.data.iter().product()], "prod");
            let o4 = sim.empty(dtype, &[4], Layout::Strided);
            sim.call("prod.dim_int", vec![t(&dx), int(0), Arg::Bool(false), Arg::None], vec![o4.arg.clone()])
                .unwrap();
            let exp: Vec<f64> = (0..4).map(|c| (0..3).map(|r| x.data[r * 4 + c]).product()).collect();
            assert_close(&sim.read(&o4), &exp, "prod.dim_int");
        }
        let xi = sim.place(&HTensor::new(DType::Int32, &[5], |i| i as f64 + 1.0), Layout::Contiguous);
        let oi = sim.empty(DType::Int64, &[], Layout::Contiguous);
        sim.call("prod", vec![t(&xi), Arg::None], vec![oi.arg.clone()]).unwrap();
        assert_close(&sim.read(&oi), &[120.0], "int prod");
        let e = sim.call("linalg_vector_norm", vec![t(&xi)], vec![oi.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
}

#[test]
fn nll_loss2d_forward_and_backward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let (n, c, h, w) = (2, 3, 2, 2);
        let x = vals(DType::Float64, &[n, c, h, w], 4);
        let target = HTensor::new(DType::Int64, &[n, h, w], |i| [0, 2, 1, -100, 2, 2, 0, 1][i] as f64);
        let (dx, dt) = (sim.place(&x, Layout::Strided), sim.place(&target, Layout::Transposed));
        for reduction in 0..3i64 {
            let out_shape: Vec<usize> = if reduction == 0 { vec![n, h, w] } else { vec![] };
            let out = sim.empty(DType::Float64, &out_shape, Layout::Contiguous);
            let total = sim.empty(DType::Float64, &[], Layout::Contiguous);
            sim.call(
                "nll_loss2d_forward",
                vec![t(&dx), t(&dt), Arg::None, int(reduction), int(-100)],
                vec![out.arg.clone(), total.arg.clone()],
            )
            .unwrap();
            let at = |e: usize, k: usize| ((e / (h * w)) * c + k) * h * w + e % (h * w);
            let mut losses = vec![0.0; n * h * w];
            let mut count = 0.0;
            for e in 0..n * h * w {
                if target.data[e] >= 0.0 {
                    losses[e] = -x.data[at(e, target.data[e] as usize)];
                    count += 1.0;
                }
            }
            let sum: f64 = losses.iter().sum();
            let exp = match reduction {
                0 => losses.clone(),
                1 => vec![sum / count],
                _ => vec![sum],
            };
            assert_close(&sim.read(&out), &exp, &format!("nll2d r={reduction}"));
            let go = HTensor::new(DType::Float64, &out_shape, |i| 1.0 + i as f64);
            let dgo = sim.place(&go, Layout::Contiguous);
            let gi = sim.empty(DType::Float64, &[n, c, h, w], Layout::Contiguous);
            sim.call(
                "nll_loss2d_backward",
                vec![t(&dgo), t(&dx), t(&dt), Arg::None, int(reduction), int(-100), t(&total)],
                vec![gi.arg.clone()],
            )
            .unwrap();
            let mut exp = vec![0.0; x.numel()];
            for e in 0..n * h * w {
                if target.data[e] >= 0.0 {
                    let g = if reduction == 0 { go.data[e] } else { go.data[0] };
                    exp[at(e, target.data[e] as usize)] = if reduction == 1 { -g / count } else { -g };
                }
            }
            assert_close(&sim.read(&gi), &exp, &format!("nll2d backward r={reduction}"));
        }
        // A 2-D target is refused.
        let bad = sim.place(&HTensor::new(DType::Int64, &[n, h * w], |_| 0.0), Layout::Contiguous);
        let (o, tw) = (
            sim.empty(DType::Float64, &[], Layout::Contiguous),
            sim.empty(DType::Float64, &[], Layout::Contiguous),
        );
        let e = sim
            .call(
                "nll_loss2d_forward",
                vec![t(&dx), t(&bad), Arg::None, int(1), int(-100)],
                vec![o.arg.clone(), tw.arg.clone()],
            )
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
}

#[test]
fn foreach_in_place_ops_match_per_tensor_math() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let shapes: [&[usize]; 3] = [&[3, 4], &[5], &[2, 2, 2]];
        let a: Vec<HTensor> = shapes.iter().enumerate().map(|(i, s)| vals(DType::Float32, s, i)).collect();
        let b: Vec<HTensor> =
            shapes.iter().enumerate().map(|(i, s)| vals(DType::Float32, s, i + 5)).collect();
        let c: Vec<HTensor> =
            shapes.iter().enumerate().map(|(i, s)| vals(DType::Float32, s, i + 9)).collect();
        let place =
            |v: &[HTensor], layout| -> Vec<DTensor> { v.iter().map(|h| sim.place(h, layout)).collect() };
        let lst = |v: &[DTensor]| Arg::TensorList(v.iter().map(|d| Some(d.arg.clone())).collect());
        let r32 = |x: f64| round_to(DType::Float32, x);
        type Case = (&'static str, Vec<Arg>, fn(f64, f64, f64) -> f64);
        let cases = |da: &[DTensor], db: &[DTensor], dc: &[DTensor]| -> Vec<Case> {
            vec![
                ("_foreach_add_.Scalar", vec![lst(da), scalar_f(0.5)], |x, _, _| x + 0.5),
                ("_foreach_mul_.Scalar", vec![lst(da), scalar_f(0.9)], |x, _, _| x * 0.9),
                ("_foreach_add_.List", vec![lst(da), lst(db), scalar_f(-0.1)], |x, y, _| x - 0.1 * y),
                ("_foreach_lerp_.Scalar", vec![lst(da), lst(db), scalar_f(0.1)], |x, y, _| x + 0.1 * (y - x)),
                ("_foreach_addcmul_.Scalar", vec![lst(da), lst(db), lst(dc), scalar_f(0.01)], |x, y, z| {
                    x + 0.01 * y * z
                }),
            ]
        };
        for layout in [Layout::Contiguous, Layout::Transposed] {
            let (db, dc) = (place(&b, Layout::Strided), place(&c, Layout::Contiguous));
            let da = place(&a, layout);
            for (op, args, f) in cases(&da, &db, &dc) {
                // Each case starts again from `a`.
                let fresh = place(&a, layout);
                for (d, h) in da.iter().zip(&fresh) {
                    sim.call("copy_", vec![t(d), t(h)], vec![d.arg.clone()]).unwrap();
                }
                sim.call(op, args, vec![]).unwrap();
                for k in 0..3 {
                    let exp: Vec<f64> =
                        (0..a[k].numel()).map(|i| r32(f(a[k].data[i], b[k].data[i], c[k].data[i]))).collect();
                    assert_close(&sim.read(&da[k]), &exp, &format!("{op} {layout:?} tensor {k}"));
                }
            }
        }
        // Mismatched list lengths.
        let (da, db) = (place(&a, Layout::Contiguous), place(&b[..2], Layout::Contiguous));
        let e = sim.call("_foreach_add_.List", vec![lst(&da), lst(&db)], vec![]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
}

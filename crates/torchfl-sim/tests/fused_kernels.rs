//! The custom fused operators of the `sim` namespace (`kernels/fused.rs`):
//! `fused_bias_gelu`, `softmax_cross_entropy` and their backward kernels
//! against `f64` references written here (ranks 1 to 3, strided and
//! transposed inputs and outputs, float32/float64 and the half types),
//! finite-difference checks of both backward kernels against their forward
//! kernels in float64, the parallel path and its determinism, empty
//! tensors, the infer functions (`Runtime::infer_outputs`) and the errors,
//! which the kernels and the infer functions must report alike; in async
//! and sync modes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)]

mod common;

use common::*;
use torchfl_sim::{Arg, DType, ErrorCode, Mode, OutputMeta, Runtime, TensorArg};

const MODES: [Mode; 2] = [Mode::Async, Mode::Sync];
const REALS: [DType; 2] = [DType::Float32, DType::Float64];

const GELU: &str = "sim::fused_bias_gelu";
const GELU_BW: &str = "sim::fused_bias_gelu_backward";
const CE: &str = "sim::softmax_cross_entropy";
const CE_BW: &str = "sim::softmax_cross_entropy_backward";

/// Deterministic values in about [-1.5, 1.5].
fn vals(dtype: DType, shape: &[usize], salt: usize) -> HTensor {
    HTensor::new(dtype, shape, |i| ((i * 7 + salt * 13) as f64 * 0.37).sin() * 1.5)
}

/// Non-negative soft labels whose rows sum to `mass`.
fn probs(dtype: DType, n: usize, c: usize, salt: usize, mass: f64) -> HTensor {
    let raw: Vec<f64> = (0..n * c).map(|i| 0.1 + ((i * 5 + salt * 3) as f64 * 0.71).sin().abs()).collect();
    HTensor::new(dtype, &[n, c], |i| {
        let r = i / c;
        let s: f64 = raw[r * c..(r + 1) * c].iter().sum();
        raw[i] / s * mass
    })
}

/// `erf` to double precision for |x| < 6: the all-positive series
/// `2/sqrt(pi) * exp(-x^2) * sum_n 2^n x^(2n+1) / (2n+1)!!`.
fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a >= 6.0 {
        return 1f64.copysign(x);
    }
    let (mut term, mut sum, mut k) = (a, a, 1.0);
    while term > 1e-18 * sum {
        term *= 2.0 * a * a / (2.0 * k + 1.0);
        sum += term;
        k += 1.0;
    }
    (sum * (-a * a).exp() * std::f64::consts::FRAC_2_SQRT_PI).min(1.0).copysign(x)
}

fn gelu(u: f64) -> f64 {
    0.5 * u * (1.0 + erf(u / std::f64::consts::SQRT_2))
}

fn gelu_grad(u: f64) -> f64 {
    let cdf = 0.5 * (1.0 + erf(u / std::f64::consts::SQRT_2));
    let pdf = (-0.5 * u * u).exp() / (2.0 * std::f64::consts::PI).sqrt();
    cdf + u * pdf
}

/// `(y, grad_x, grad_bias)` for `x` of any rank, `bias` over the last dim.
fn bias_gelu_ref(x: &HTensor, bias: &HTensor, grad: &HTensor) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let c = bias.numel();
    let mut y = vec![0.0; x.numel()];
    let mut gx = vec![0.0; x.numel()];
    let mut gb = vec![0.0; c];
    for i in 0..x.numel() {
        let u = x.data[i] + bias.data[i % c];
        y[i] = gelu(u);
        gx[i] = grad.data[i] * gelu_grad(u);
        gb[i % c] += gx[i];
    }
    (y, gx, gb)
}

/// Row-wise log-softmax of `[n, c]`, naively.
fn log_softmax(x: &HTensor) -> Vec<f64> {
    let c = x.shape[1];
    let mut out = vec![0.0; x.numel()];
    for (r, row) in x.data.chunks(c).enumerate() {
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        for j in 0..c {
            out[r * c + j] = row[j] - lse;
        }
    }
    out
}

/// `(loss, grad_logits, grad_target)` for upstream gradient `g`.
fn cross_entropy_ref(logits: &HTensor, target: &HTensor, g: f64) -> (f64, Vec<f64>, Vec<f64>) {
    let (n, c) = (logits.shape[0], logits.shape[1]);
    let ls = log_softmax(logits);
    let loss = -ls.iter().zip(&target.data).map(|(l, t)| l * t).sum::<f64>() / n as f64;
    let mut gl = vec![0.0; n * c];
    let mut gt = vec![0.0; n * c];
    for r in 0..n {
        let tsum: f64 = target.data[r * c..(r + 1) * c].iter().sum();
        for j in 0..c {
            let i = r * c + j;
            gl[i] = g / n as f64 * (ls[i].exp() * tsum - target.data[i]);
            gt[i] = -g / n as f64 * ls[i];
        }
    }
    (loss, gl, gt)
}

/// Comparison for results that sum many terms: relative to the largest
/// expected magnitude.
fn close(got: &HTensor, exp: &[f64], what: &str) {
    let rtol = match got.dtype {
        DType::Float64 => 1e-11,
        DType::Float32 => 1e-5,
        DType::Float16 => 4e-3,
        _ => 3e-2,
    };
    assert_eq!(got.data.len(), exp.len(), "{what}: length");
    let scale = exp.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &e)) in got.data.iter().zip(exp).enumerate() {
        assert!(
            (g - e).abs() <= rtol * scale,
            "{what}: element {i}: got {g}, expected {e} ({:?})",
            got.dtype
        );
    }
}

fn scalar_tensor(sim: &Sim, dtype: DType, v: f64) -> DTensor {
    sim.place(&HTensor::new(dtype, &[], |_| v), Layout::Contiguous)
}

fn err_of(r: torchfl_sim::Result<()>) -> (ErrorCode, String) {
    let e = r.unwrap_err();
    (e.code(), e.message().to_owned())
}

// ------------------------------------------------------------ fused_bias_gelu

#[test]
fn bias_gelu_forward_and_backward_against_reference() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in [DType::Float32, DType::Float64, DType::Float16, DType::BFloat16] {
            for shape in [vec![6], vec![5, 7], vec![2, 3, 4]] {
                let c = *shape.last().unwrap();
                let x = vals(dtype, &shape, 1);
                let bias = vals(dtype, &[c], 2);
                let grad = vals(dtype, &shape, 3);
                let (y_ref, gx_ref, gb_ref) = bias_gelu_ref(&x, &bias, &grad);
                for layout in LAYOUTS {
                    let what = format!("{mode:?} {dtype:?} {shape:?} {layout:?}");
                    let (dx, db, dg) =
                        (sim.place(&x, layout), sim.place(&bias, layout), sim.place(&grad, layout));
                    // Outputs as the host allocates them, and strided ones.
                    let out_layout =
                        if layout == Layout::Strided { Layout::Strided } else { Layout::Contiguous };
                    let y = sim.empty(dtype, &shape, out_layout);
                    sim.call(GELU, vec![t(&dx), t(&db)], vec![y.arg.clone()]).unwrap();
                    assert_close(&sim.read(&y), &y_ref, &format!("forward {what}"));

                    let gx = sim.empty(dtype, &shape, out_layout);
                    let gb = sim.empty(dtype, &[c], out_layout);
                    sim.call(GELU_BW, vec![t(&dg), t(&dx), t(&db)], vec![gx.arg.clone(), gb.arg.clone()])
                        .unwrap();
                    assert_close(&sim.read(&gx), &gx_ref, &format!("grad_x {what}"));
                    close(&sim.read(&gb), &gb_ref, &format!("grad_bias {what}"));
                }
            }
        }
    }
}

/// Above one parallel task (64 x 1024 elements): the blocked, threaded
/// path gives the reference, and the same bits on every run.
#[test]
fn bias_gelu_parallel_and_deterministic() {
    let sim = Sim::new(Mode::Async);
    for dtype in REALS {
        let shape = [64, 1024];
        let x = vals(dtype, &shape, 4);
        let bias = vals(dtype, &[1024], 5);
        let grad = vals(dtype, &shape, 6);
        let (y_ref, gx_ref, gb_ref) = bias_gelu_ref(&x, &bias, &grad);
        let (dx, db, dg) = (
            sim.place(&x, Layout::Contiguous),
            sim.place(&bias, Layout::Contiguous),
            sim.place(&grad, Layout::Transposed),
        );
        let y = sim.empty(dtype, &shape, Layout::Contiguous);
        sim.call(GELU, vec![t(&dx), t(&db)], vec![y.arg.clone()]).unwrap();
        assert_close(&sim.read(&y), &y_ref, &format!("forward {dtype:?}"));
        let mut first: Option<Vec<f64>> = None;
        for _ in 0..3 {
            let gx = sim.empty(dtype, &shape, Layout::Contiguous);
            let gb = sim.empty(dtype, &[1024], Layout::Contiguous);
            sim.call(GELU_BW, vec![t(&dg), t(&dx), t(&db)], vec![gx.arg.clone(), gb.arg.clone()]).unwrap();
            assert_close(&sim.read(&gx), &gx_ref, &format!("grad_x {dtype:?}"));
            let gb = sim.read(&gb);
            close(&gb, &gb_ref, &format!("grad_bias {dtype:?}"));
            match &first {
                None => first = Some(gb.data),
                Some(f) => {
                    assert!(f.iter().zip(&gb.data).all(|(a, b)| a.to_bits() == b.to_bits()), "deterministic")
                }
            }
        }
    }
}

#[test]
fn bias_gelu_empty_batch_zeroes_grad_bias() {
    let sim = Sim::new(Mode::Sync);
    let x = HTensor::new(DType::Float32, &[0, 3], |_| 0.0);
    let bias = vals(DType::Float32, &[3], 1);
    let (dx, db) = (sim.place(&x, Layout::Contiguous), sim.place(&bias, Layout::Contiguous));
    let y = sim.empty(DType::Float32, &[0, 3], Layout::Contiguous);
    sim.call(GELU, vec![t(&dx), t(&db)], vec![y.arg.clone()]).unwrap();
    let gx = sim.empty(DType::Float32, &[0, 3], Layout::Contiguous);
    // Garbage in the output: the kernel must write zeros.
    let gb = sim.place(&HTensor::new(DType::Float32, &[3], |_| 7.0), Layout::Contiguous);
    sim.call(GELU_BW, vec![t(&dx), t(&dx), t(&db)], vec![gx.arg.clone(), gb.arg.clone()]).unwrap();
    assert_eq!(sim.read(&gb).data, vec![0.0; 3]);
}

// ------------------------------------------------------- softmax_cross_entropy

#[test]
fn cross_entropy_forward_and_backward_against_reference() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in [DType::Float32, DType::Float64, DType::Float16, DType::BFloat16] {
            for (n, c, mass) in [(4, 5, 1.0), (1, 3, 1.0), (6, 10, 0.8), (3, 1, 1.0)] {
                let logits = HTensor::new(dtype, &[n, c], |i| ((i * 11 + 3) as f64 * 0.53).sin() * 3.0);
                let target = probs(dtype, n, c, 2, mass);
                let g = round_to(dtype, 0.75);
                let (loss_ref, gl_ref, gt_ref) = cross_entropy_ref(&logits, &target, g);
                for layout in LAYOUTS {
                    let what = format!("{mode:?} {dtype:?} [{n}, {c}] {layout:?}");
                    let (dl, dt) = (sim.place(&logits, layout), sim.place(&target, Layout::Strided));
                    let loss = sim.empty(dtype, &[], Layout::Contiguous);
                    sim.call(CE, vec![t(&dl), t(&dt)], vec![loss.arg.clone()]).unwrap();
                    close(&sim.read(&loss), &[loss_ref], &format!("loss {what}"));

                    let dg = scalar_tensor(&sim, dtype, g);
                    let gl = sim.empty(dtype, &[n, c], layout);
                    let gt = sim.empty(dtype, &[n, c], Layout::Contiguous);
                    sim.call(CE_BW, vec![t(&dg), t(&dl), t(&dt)], vec![gl.arg.clone(), gt.arg.clone()])
                        .unwrap();
                    close(&sim.read(&gl), &gl_ref, &format!("grad_logits {what}"));
                    close(&sim.read(&gt), &gt_ref, &format!("grad_target {what}"));
                }
            }
        }
    }
}

/// Logits of 1000 and more: the row maximum is subtracted first, so the
/// result is finite and right even in float32.
#[test]
fn cross_entropy_is_numerically_stable() {
    let sim = Sim::new(Mode::Sync);
    for dtype in REALS {
        let logits = HTensor::new(dtype, &[2, 3], |i| 1000.0 + i as f64);
        let target = probs(dtype, 2, 3, 1, 1.0);
        let (loss_ref, gl_ref, _) = cross_entropy_ref(&logits, &target, 1.0);
        let (dl, dt) = (sim.place(&logits, Layout::Contiguous), sim.place(&target, Layout::Contiguous));
        let loss = sim.empty(dtype, &[], Layout::Contiguous);
        sim.call(CE, vec![t(&dl), t(&dt)], vec![loss.arg.clone()]).unwrap();
        let got = sim.read(&loss);
        assert!(got.data[0].is_finite());
        close(&got, &[loss_ref], &format!("loss {dtype:?}"));
        let dg = scalar_tensor(&sim, dtype, 1.0);
        let (gl, gt) =
            (sim.empty(dtype, &[2, 3], Layout::Contiguous), sim.empty(dtype, &[2, 3], Layout::Contiguous));
        sim.call(CE_BW, vec![t(&dg), t(&dl), t(&dt)], vec![gl.arg.clone(), gt.arg.clone()]).unwrap();
        close(&sim.read(&gl), &gl_ref, &format!("grad_logits {dtype:?}"));
    }
}

/// 600 x 40 elements: several parallel blocks of rows, same bits each run.
#[test]
fn cross_entropy_parallel_and_deterministic() {
    let sim = Sim::new(Mode::Async);
    for dtype in REALS {
        let (n, c) = (600, 40);
        let logits = HTensor::new(dtype, &[n, c], |i| ((i * 11 + 3) as f64 * 0.53).sin() * 4.0);
        let target = probs(dtype, n, c, 5, 1.0);
        let (loss_ref, gl_ref, gt_ref) = cross_entropy_ref(&logits, &target, 2.0);
        let (dl, dt) = (sim.place(&logits, Layout::Transposed), sim.place(&target, Layout::Contiguous));
        let dg = scalar_tensor(&sim, dtype, 2.0);
        let mut losses = Vec::new();
        for _ in 0..3 {
            let loss = sim.empty(dtype, &[], Layout::Contiguous);
            sim.call(CE, vec![t(&dl), t(&dt)], vec![loss.arg.clone()]).unwrap();
            let got = sim.read(&loss);
            close(&got, &[loss_ref], &format!("loss {dtype:?}"));
            losses.push(got.data[0].to_bits());
        }
        assert!(losses.windows(2).all(|w| w[0] == w[1]), "deterministic loss");
        let (gl, gt) =
            (sim.empty(dtype, &[n, c], Layout::Contiguous), sim.empty(dtype, &[n, c], Layout::Contiguous));
        sim.call(CE_BW, vec![t(&dg), t(&dl), t(&dt)], vec![gl.arg.clone(), gt.arg.clone()]).unwrap();
        close(&sim.read(&gl), &gl_ref, &format!("grad_logits {dtype:?}"));
        close(&sim.read(&gt), &gt_ref, &format!("grad_target {dtype:?}"));
    }
}

#[test]
fn cross_entropy_of_no_rows_is_nan() {
    let sim = Sim::new(Mode::Sync);
    let empty = HTensor::new(DType::Float64, &[0, 4], |_| 0.0);
    let (dl, dt) = (sim.place(&empty, Layout::Contiguous), sim.place(&empty, Layout::Contiguous));
    let loss = sim.empty(DType::Float64, &[], Layout::Contiguous);
    sim.call(CE, vec![t(&dl), t(&dt)], vec![loss.arg.clone()]).unwrap();
    assert!(sim.read(&loss).data[0].is_nan());
    let dg = scalar_tensor(&sim, DType::Float64, 1.0);
    let (gl, gt) = (
        sim.empty(DType::Float64, &[0, 4], Layout::Contiguous),
        sim.empty(DType::Float64, &[0, 4], Layout::Contiguous),
    );
    sim.call(CE_BW, vec![t(&dg), t(&dl), t(&dt)], vec![gl.arg.clone(), gt.arg.clone()]).unwrap();
}

// ------------------------------------------------------------ finite differences

/// Runs a single-output forward kernel on host values and returns its
/// output's values.
fn forward(sim: &Sim, op: &str, inputs: &[&HTensor], out_shape: &[usize]) -> Vec<f64> {
    let placed: Vec<DTensor> = inputs.iter().map(|h| sim.place(h, Layout::Contiguous)).collect();
    let out = sim.empty(DType::Float64, out_shape, Layout::Contiguous);
    sim.call(op, placed.iter().map(t).collect(), vec![out.arg.clone()]).unwrap();
    sim.read(&out).data
}

/// Central differences of `L = sum(w * op(inputs))` with respect to every
/// element of every input.
fn numeric_grads(sim: &Sim, op: &str, inputs: &[HTensor], w: &[f64], out_shape: &[usize]) -> Vec<Vec<f64>> {
    let h = 1e-6;
    let objective = |ins: &[HTensor]| -> f64 {
        let refs: Vec<&HTensor> = ins.iter().collect();
        forward(sim, op, &refs, out_shape).iter().zip(w).map(|(y, w)| y * w).sum()
    };
    (0..inputs.len())
        .map(|k| {
            (0..inputs[k].numel())
                .map(|i| {
                    let mut plus = inputs.to_vec();
                    plus[k].data[i] += h;
                    let mut minus = inputs.to_vec();
                    minus[k].data[i] -= h;
                    (objective(&plus) - objective(&minus)) / (2.0 * h)
                })
                .collect()
        })
        .collect()
}

fn assert_grad(analytic: &HTensor, numeric: &[f64], what: &str) {
    for (i, (&a, &n)) in analytic.data.iter().zip(numeric).enumerate() {
        assert!((a - n).abs() <= 1e-7 * n.abs().max(1.0), "{what}: element {i}: analytic {a}, numeric {n}");
    }
}

/// gradcheck in float64: the backward kernel's gradients are the forward
/// kernel's derivatives.
#[test]
fn bias_gelu_backward_matches_finite_differences() {
    let sim = Sim::new(Mode::Async);
    let d = DType::Float64;
    for shape in [vec![4], vec![2, 3], vec![2, 2, 3]] {
        let c = *shape.last().unwrap();
        let x = vals(d, &shape, 7);
        let bias = vals(d, &[c], 8);
        let w = vals(d, &shape, 9);
        let numeric = numeric_grads(&sim, GELU, &[x.clone(), bias.clone()], &w.data, &shape);
        let (dx, db, dw) = (
            sim.place(&x, Layout::Strided),
            sim.place(&bias, Layout::Contiguous),
            sim.place(&w, Layout::Transposed),
        );
        let (gx, gb) = (sim.empty(d, &shape, Layout::Contiguous), sim.empty(d, &[c], Layout::Contiguous));
        sim.call(GELU_BW, vec![t(&dw), t(&dx), t(&db)], vec![gx.arg.clone(), gb.arg.clone()]).unwrap();
        assert_grad(&sim.read(&gx), &numeric[0], &format!("grad_x {shape:?}"));
        assert_grad(&sim.read(&gb), &numeric[1], &format!("grad_bias {shape:?}"));
    }
}

#[test]
fn cross_entropy_backward_matches_finite_differences() {
    let sim = Sim::new(Mode::Async);
    let d = DType::Float64;
    for (n, c, mass) in [(3, 4, 1.0), (2, 5, 0.6)] {
        let logits = HTensor::new(d, &[n, c], |i| ((i * 11 + 3) as f64 * 0.53).sin() * 2.0);
        let target = probs(d, n, c, 4, mass);
        let g = 1.7;
        let numeric = numeric_grads(&sim, CE, &[logits.clone(), target.clone()], &[g], &[]);
        let (dl, dt) = (sim.place(&logits, Layout::Transposed), sim.place(&target, Layout::Strided));
        let dg = scalar_tensor(&sim, d, g);
        let (gl, gt) = (sim.empty(d, &[n, c], Layout::Contiguous), sim.empty(d, &[n, c], Layout::Contiguous));
        sim.call(CE_BW, vec![t(&dg), t(&dl), t(&dt)], vec![gl.arg.clone(), gt.arg.clone()]).unwrap();
        assert_grad(&sim.read(&gl), &numeric[0], &format!("grad_logits [{n}, {c}]"));
        assert_grad(&sim.read(&gt), &numeric[1], &format!("grad_target [{n}, {c}]"));
    }
}

// ------------------------------------------------------------ infer functions

/// A tensor argument for `infer_outputs`: only dtype and shape matter.
fn meta_arg(dtype: DType, shape: &[usize]) -> Arg {
    let shape: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
    Arg::Tensor(TensorArg::contiguous(dtype, &shape, 0, 0))
}

fn out(dtype: DType, shape: &[i64]) -> OutputMeta {
    OutputMeta { dtype, shape: shape.to_vec() }
}

#[test]
fn infer_outputs_shapes_and_dtypes() {
    for d in [DType::Float32, DType::Float64, DType::Float16, DType::BFloat16] {
        let x = meta_arg(d, &[2, 3, 4]);
        let b = meta_arg(d, &[4]);
        assert_eq!(Runtime::infer_outputs(GELU, &[x.clone(), b.clone()]).unwrap(), vec![out(d, &[2, 3, 4])]);
        assert_eq!(
            Runtime::infer_outputs(GELU_BW, &[x.clone(), x.clone(), b.clone()]).unwrap(),
            vec![out(d, &[2, 3, 4]), out(d, &[4])]
        );
        let (l, g) = (meta_arg(d, &[8, 5]), meta_arg(d, &[]));
        assert_eq!(Runtime::infer_outputs(CE, &[l.clone(), l.clone()]).unwrap(), vec![out(d, &[])]);
        assert_eq!(
            Runtime::infer_outputs(CE_BW, &[g, l.clone(), l]).unwrap(),
            vec![out(d, &[8, 5]), out(d, &[8, 5])]
        );
    }
    let x1 = meta_arg(DType::Float32, &[0]);
    let b0 = meta_arg(DType::Float32, &[0]);
    assert_eq!(Runtime::infer_outputs(GELU, &[x1, b0]).unwrap(), vec![out(DType::Float32, &[0])]);

    for (op, schema) in [
        (GELU, "fused_bias_gelu(Tensor x, Tensor bias) -> Tensor"),
        (GELU_BW, "fused_bias_gelu_backward(Tensor grad, Tensor x, Tensor bias) -> (Tensor, Tensor)"),
        (CE, "softmax_cross_entropy(Tensor logits, Tensor target) -> Tensor"),
        (
            CE_BW,
            "softmax_cross_entropy_backward(Tensor grad, Tensor logits, Tensor target) -> (Tensor, Tensor)",
        ),
    ] {
        assert_eq!(Runtime::op_schema(op), Some(schema));
        assert!(Runtime::op_names().any(|n| n == op));
    }
    assert_eq!(Runtime::op_schema("gelu"), None);
    let e = Runtime::infer_outputs("gelu", &[meta_arg(DType::Float32, &[2])]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let e = Runtime::infer_outputs("sim::nope", &[]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unimplemented);
}

/// Bad calls: the infer function and the kernel refuse them with the same
/// code and message.
#[test]
fn errors_agree_between_infer_and_kernel() {
    let sim = Sim::new(Mode::Async);
    let f = DType::Float32;
    let place = |d: DType, shape: &[usize]| sim.place(&vals(d, shape, 1), Layout::Contiguous);
    struct Case {
        op: &'static str,
        args: Vec<(DType, Vec<usize>)>,
        outs: Vec<(DType, Vec<usize>)>,
        code: ErrorCode,
        contains: &'static [&'static str],
    }
    let fx = |shape: &[usize]| (f, shape.to_vec());
    let cases = vec![
        Case {
            op: GELU,
            args: vec![fx(&[2, 3]), fx(&[4])],
            outs: vec![fx(&[2, 3])],
            code: ErrorCode::InvalidArgument,
            contains: &["sim: sim::fused_bias_gelu: bias must be 1-D", "[4]", "[2, 3]"],
        },
        Case {
            op: GELU,
            args: vec![fx(&[2, 3]), fx(&[1, 3])],
            outs: vec![fx(&[2, 3])],
            code: ErrorCode::InvalidArgument,
            contains: &["bias must be 1-D", "[1, 3]"],
        },
        Case {
            op: GELU,
            args: vec![fx(&[]), fx(&[1])],
            outs: vec![fx(&[])],
            code: ErrorCode::InvalidArgument,
            contains: &["x must have at least one dimension"],
        },
        Case {
            op: GELU,
            args: vec![fx(&[2, 3]), (DType::Float64, vec![3])],
            outs: vec![fx(&[2, 3])],
            code: ErrorCode::InvalidArgument,
            contains: &["bias has dtype Double but x has dtype Float"],
        },
        Case {
            op: GELU,
            args: vec![(DType::Int64, vec![2, 3]), (DType::Int64, vec![3])],
            outs: vec![(DType::Int64, vec![2, 3])],
            code: ErrorCode::Unimplemented,
            contains: &["Long is not supported"],
        },
        Case {
            op: GELU,
            args: vec![fx(&[2, 3])],
            outs: vec![fx(&[2, 3])],
            code: ErrorCode::InvalidArgument,
            contains: &["expected 2 arguments (x, bias), got 1"],
        },
        Case {
            op: GELU_BW,
            args: vec![fx(&[3, 2]), fx(&[2, 3]), fx(&[3])],
            outs: vec![fx(&[2, 3]), fx(&[3])],
            code: ErrorCode::InvalidArgument,
            contains: &["grad has shape [3, 2] but x has shape [2, 3]"],
        },
        Case {
            op: GELU_BW,
            args: vec![(DType::Float64, vec![2, 3]), fx(&[2, 3]), fx(&[3])],
            outs: vec![fx(&[2, 3]), fx(&[3])],
            code: ErrorCode::InvalidArgument,
            contains: &["grad has dtype Double"],
        },
        Case {
            op: CE,
            args: vec![fx(&[2, 3, 4]), fx(&[2, 3, 4])],
            outs: vec![fx(&[])],
            code: ErrorCode::InvalidArgument,
            contains: &["sim: sim::softmax_cross_entropy: logits must be 2-D [N, C], got shape [2, 3, 4]"],
        },
        Case {
            op: CE,
            args: vec![fx(&[2, 3]), fx(&[2, 4])],
            outs: vec![fx(&[])],
            code: ErrorCode::InvalidArgument,
            contains: &["must have the shape of logits [2, 3], got [2, 4]"],
        },
        Case {
            op: CE,
            args: vec![fx(&[2, 3]), (DType::Float64, vec![2, 3])],
            outs: vec![fx(&[])],
            code: ErrorCode::InvalidArgument,
            contains: &["target has dtype Double but logits has dtype Float"],
        },
        Case {
            op: CE,
            args: vec![(DType::Int32, vec![2, 3]), (DType::Int32, vec![2, 3])],
            outs: vec![(DType::Int32, vec![])],
            code: ErrorCode::Unimplemented,
            contains: &["Int is not supported"],
        },
        Case {
            op: CE_BW,
            args: vec![fx(&[1]), fx(&[2, 3]), fx(&[2, 3])],
            outs: vec![fx(&[2, 3]), fx(&[2, 3])],
            code: ErrorCode::InvalidArgument,
            contains: &["grad must be 0-dim", "[1]"],
        },
    ];
    for case in &cases {
        let what = format!("{} {:?}", case.op, case.args);
        let metas: Vec<Arg> = case.args.iter().map(|(d, s)| meta_arg(*d, s)).collect();
        let e = Runtime::infer_outputs(case.op, &metas).unwrap_err();
        assert_eq!(e.code(), case.code, "infer {what}: {}", e.message());
        for c in case.contains {
            assert!(e.message().contains(c), "infer {what}: {:?} lacks {c:?}", e.message());
        }
        let args: Vec<DTensor> = case.args.iter().map(|(d, s)| place(*d, s)).collect();
        let outs: Vec<DTensor> =
            case.outs.iter().map(|(d, s)| sim.empty(*d, s, Layout::Contiguous)).collect();
        let kernel = err_of(sim.call(
            case.op,
            args.iter().map(t).collect(),
            outs.iter().map(|o| o.arg.clone()).collect(),
        ));
        assert_eq!(kernel, (e.code(), e.message().to_owned()), "kernel and infer agree: {what}");
    }
}

/// Errors only a kernel can meet: outputs that are not what the infer
/// function said, and arguments that are not device tensors.
#[test]
fn kernel_checks_outputs_and_operands() {
    let sim = Sim::new(Mode::Async);
    let f = DType::Float32;
    let x = sim.place(&vals(f, &[2, 3], 1), Layout::Contiguous);
    let b = sim.place(&vals(f, &[3], 2), Layout::Contiguous);
    let wrong_shape = sim.empty(f, &[3, 2], Layout::Contiguous);
    let (code, msg) = err_of(sim.call(GELU, vec![t(&x), t(&b)], vec![wrong_shape.arg.clone()]));
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(msg.contains("output 0 is Float of shape [3, 2], expected Float of shape [2, 3]"), "{msg}");
    let wrong_dtype = sim.empty(DType::Float64, &[2, 3], Layout::Contiguous);
    let (code, msg) = err_of(sim.call(GELU, vec![t(&x), t(&b)], vec![wrong_dtype.arg.clone()]));
    assert_eq!(code, ErrorCode::InvalidArgument, "{msg}");
    let y = sim.empty(f, &[2, 3], Layout::Contiguous);
    let (code, msg) = err_of(sim.call(GELU, vec![t(&x), t(&b)], vec![]));
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(msg.contains("expected 1 output(s), got 0"), "{msg}");
    // The two outputs of a backward may not share memory.
    let gb_alias = TensorArg { shape: vec![3], strides: vec![1], ..y.arg.clone() };
    let (code, msg) = err_of(sim.call(GELU_BW, vec![t(&x), t(&x), t(&b)], vec![y.arg.clone(), gb_alias]));
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(msg.contains("overlaps another output"), "{msg}");
    // A host scalar where a device tensor is needed.
    let host = Arg::Tensor(TensorArg::host_scalar(f, torchfl_sim::Scalar::Float(1.0)));
    let l = sim.place(&vals(f, &[2, 3], 3), Layout::Contiguous);
    let (gl, gt) = (sim.empty(f, &[2, 3], Layout::Contiguous), sim.empty(f, &[2, 3], Layout::Contiguous));
    let (code, msg) = err_of(sim.call(CE_BW, vec![host, t(&l), t(&l)], vec![gl.arg.clone(), gt.arg.clone()]));
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(msg.contains("grad must be a device tensor"), "{msg}");
    // Meta tensors (no data) are refused by kernels.
    let meta = TensorArg { data: torchfl_sim::TensorData::Meta, ..x.arg.clone() };
    let (code, msg) = err_of(sim.call(GELU, vec![Arg::Tensor(meta), t(&b)], vec![y.arg.clone()]));
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(msg.contains("has no data"), "{msg}");
}

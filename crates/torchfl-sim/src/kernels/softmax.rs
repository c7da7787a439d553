//! Softmax and log-softmax along one dimension, forward and backward:
//! `_softmax`, `_log_softmax`, `_softmax_backward_data`,
//! `_log_softmax_backward_data` (each with its `.out` form).
//!
//! The tensor is seen as `[outer, n, inner]` around the softmax dimension.
//! Inputs are read as dense row-major buffers in the compute type (`f64`
//! for double outputs, `f32` otherwise, so half inputs and the
//! `half_to_float` variant compute in `f32` as on the CPU), outputs are
//! written densely (staged when not contiguous), and blocks of `outer`
//! run in parallel. Rows are reduced with the maximum subtracted first, so
//! large logits do not overflow; NaN propagates to its row.

use rayon::prelude::*;

use super::elementwise::{dense_input, with_dense_output};
use super::real::Real;
use super::view::TensorView;
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::Work;

/// Elements a parallel task should cover at least.
const TASK: usize = 16 * 1024;

/// Reads an `int` argument.
pub(crate) fn int_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<i64> {
    match call.args.get(i) {
        Some(ArgRef::Int(v)) => Ok(*v),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be an int"))),
    }
}

/// Wraps a possibly negative dimension of an `ndim`-dimensional tensor (a
/// 0-dim tensor accepts 0 and -1), with PyTorch's message.
pub(crate) fn wrap_dim(ctx: &KernelCtx<'_>, dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim.max(1) as i64;
    if dim < -n || dim >= n {
        return Err(ctx.invalid(format!(
            "Dimension out of range (expected to be in range of [{}, {}], but got {dim})",
            -n,
            n - 1
        )));
    }
    Ok(if dim < 0 { dim + n } else { dim } as usize)
}

/// `(outer, n, inner)` around `dim`.
fn split(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    if shape.is_empty() {
        return (1, 1, 1);
    }
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

/// Runs `f(x_block, y_block)` over the `[n, inner]` blocks of `outer`, in
/// parallel for large tensors.
fn for_blocks<C: Send + Sync, D: Send>(
    x: &[C],
    y: &mut [D],
    block: usize,
    f: impl Fn(&[C], &mut [D]) + Sync,
) {
    if block == 0 {
        return;
    }
    let per_task = (TASK / block).max(1) * block;
    if y.len() > TASK {
        y.par_chunks_mut(per_task).zip(x.par_chunks(per_task)).for_each(|(yc, xc)| {
            for (yb, xb) in yc.chunks_mut(block).zip(xc.chunks(block)) {
                f(xb, yb);
            }
        });
    } else {
        for (yb, xb) in y.chunks_mut(block).zip(x.chunks(block)) {
            f(xb, yb);
        }
    }
}

/// Like [`for_blocks`] with two inputs.
fn for_blocks2<C: Send + Sync>(
    a: &[C],
    b: &[C],
    y: &mut [C],
    block: usize,
    f: impl Fn(&[C], &[C], &mut [C]) + Sync,
) {
    if block == 0 {
        return;
    }
    let per_task = (TASK / block).max(1) * block;
    if y.len() > TASK {
        y.par_chunks_mut(per_task).zip(a.par_chunks(per_task)).zip(b.par_chunks(per_task)).for_each(
            |((yc, ac), bc)| {
                for ((yb, ab), bb) in yc.chunks_mut(block).zip(ac.chunks(block)).zip(bc.chunks(block)) {
                    f(ab, bb, yb);
                }
            },
        );
    } else {
        for ((yb, ab), bb) in y.chunks_mut(block).zip(a.chunks(block)).zip(b.chunks(block)) {
            f(ab, bb, yb);
        }
    }
}

#[inline(always)]
fn nan_max<C: Real>(m: C, x: C) -> C {
    if x.is_nan() || x > m {
        x
    } else {
        m
    }
}

/// Folds `x` with `f` over eight independent lanes (which LLVM
/// vectorises), then folds the lanes in order.
#[inline(always)]
fn lane_fold<C: Real>(x: &[C], init: C, f: impl Fn(C, C) -> C) -> C {
    let mut lanes = [init; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = f(*l, v);
        }
    }
    let mut acc = init;
    for l in lanes {
        acc = f(acc, l);
    }
    for &v in rest {
        acc = f(acc, v);
    }
    acc
}

/// Softmax (or log-softmax) of one `[n, inner]` block.
fn softmax_block<C: Real>(x: &[C], y: &mut [C], n: usize, inner: usize, log: bool) {
    if inner == 1 {
        // Vectorisable passes: lane maxima, exponentials, lane sums.
        let m = lane_fold(x, C::of(f64::NEG_INFINITY), nan_max);
        let m = if m == C::of(f64::NEG_INFINITY) { C::of(0.0) } else { m };
        for (yv, &xv) in y.iter_mut().zip(x) {
            *yv = (xv - m).exp();
        }
        let sum = lane_fold(y, C::of(0.0), |a, b| a + b);
        if log {
            let lse = m + sum.ln();
            for (yv, &xv) in y.iter_mut().zip(x) {
                *yv = xv - lse;
            }
        } else {
            let r = C::of(1.0) / sum;
            for yv in y.iter_mut() {
                *yv *= r;
            }
        }
        return;
    }
    let mut m = vec![C::of(f64::NEG_INFINITY); inner];
    for j in 0..n {
        for (mv, &xv) in m.iter_mut().zip(&x[j * inner..(j + 1) * inner]) {
            *mv = nan_max(*mv, xv);
        }
    }
    for mv in m.iter_mut() {
        if *mv == C::of(f64::NEG_INFINITY) {
            *mv = C::of(0.0);
        }
    }
    let mut sum = vec![C::of(0.0); inner];
    for j in 0..n {
        let (xr, yr) = (&x[j * inner..(j + 1) * inner], &mut y[j * inner..(j + 1) * inner]);
        for i in 0..inner {
            let e = (xr[i] - m[i]).exp();
            sum[i] += e;
            yr[i] = e;
        }
    }
    if log {
        for (mv, s) in m.iter_mut().zip(&sum) {
            *mv += s.ln();
        }
        for j in 0..n {
            let (xr, yr) = (&x[j * inner..(j + 1) * inner], &mut y[j * inner..(j + 1) * inner]);
            for i in 0..inner {
                yr[i] = xr[i] - m[i];
            }
        }
    } else {
        for s in sum.iter_mut() {
            *s = C::of(1.0) / *s;
        }
        for j in 0..n {
            for (yv, s) in y[j * inner..(j + 1) * inner].iter_mut().zip(&sum) {
                *yv *= *s;
            }
        }
    }
}

fn forward_work<C: Real>(input: TensorView, out: TensorView, dim: usize, log: bool) -> Work {
    Work::new(move || {
        let (_, n, inner) = split(input.shape(), dim);
        let x = dense_input::<C>(&input, &out);
        with_dense_output::<C>(&out, |y| {
            for_blocks(&x, y, n * inner, |xb, yb| softmax_block(xb, yb, n, inner, log));
        });
        Ok(())
    })
}

/// Validates a float view for the softmax kernels.
fn float_view(ctx: &KernelCtx<'_>, v: &TensorView, role: &str) -> Result<()> {
    if v.dtype().is_floating() {
        Ok(())
    } else {
        Err(ctx.unimplemented(format!("{role}: {} is not supported", v.dtype())))
    }
}

fn forward(ctx: &KernelCtx<'_>, call: &Frame<'_>, log: bool) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 3)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let dim = wrap_dim(ctx, int_arg(ctx, call, 1, "dim")?, input.ndim())?;
    let half_to_float = args.bool_or(2, "half_to_float", false)?;
    let out = ctx.output(call, 0)?;
    float_view(ctx, &input, "self")?;
    float_view(ctx, &out, "output")?;
    if half_to_float && out.dtype() != DType::Float32 {
        return Err(
            ctx.invalid("conversion from the input's dtype to Float is only supported for half types")
        );
    }
    if out.shape() != input.shape() {
        return Err(ctx.invalid(format!(
            "output has shape {:?} but the input has shape {:?}",
            out.shape(),
            input.shape()
        )));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(if out.dtype() == DType::Float64 {
        forward_work::<f64>(input, out, dim, log)
    } else {
        forward_work::<f32>(input, out, dim, log)
    }))
}

/// `_softmax(Tensor self, int dim, bool half_to_float) -> Tensor` (and
/// `_softmax.out`).
pub(crate) fn softmax(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    forward(ctx, call, false)
}

/// `_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor` (and
/// `_log_softmax.out`).
pub(crate) fn log_softmax(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    forward(ctx, call, true)
}

/// Backward of one `[n, inner]` block: softmax `gi = y * (g - sum(g * y))`,
/// log-softmax `gi = g - exp(y) * sum(g)`.
fn backward_block<C: Real>(g: &[C], yv: &[C], gi: &mut [C], n: usize, inner: usize, log: bool) {
    let mut s = vec![C::of(0.0); inner];
    for j in 0..n {
        let (gr, yr) = (&g[j * inner..(j + 1) * inner], &yv[j * inner..(j + 1) * inner]);
        for i in 0..inner {
            s[i] += if log { gr[i] } else { gr[i] * yr[i] };
        }
    }
    for j in 0..n {
        let (gr, yr) = (&g[j * inner..(j + 1) * inner], &yv[j * inner..(j + 1) * inner]);
        let out = &mut gi[j * inner..(j + 1) * inner];
        for i in 0..inner {
            out[i] = if log { gr[i] - yr[i].exp() * s[i] } else { yr[i] * (gr[i] - s[i]) };
        }
    }
}

fn backward_work<C: Real>(
    grad: TensorView,
    output: TensorView,
    out: TensorView,
    dim: usize,
    log: bool,
) -> Work {
    Work::new(move || {
        let (_, n, inner) = split(output.shape(), dim);
        let g = dense_input::<C>(&grad, &out);
        let y = dense_input::<C>(&output, &out);
        with_dense_output::<C>(&out, |gi| {
            for_blocks2(&g, &y, gi, n * inner, |gb, yb, ob| backward_block(gb, yb, ob, n, inner, log));
        });
        Ok(())
    })
}

fn backward(ctx: &KernelCtx<'_>, call: &Frame<'_>, log: bool) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 4, 4)?;
    let grad = ctx.device_view(args.tensor(0, "grad_output")?, "grad_output")?;
    let output = ctx.device_view(args.tensor(1, "output")?, "output")?;
    let dim = wrap_dim(ctx, int_arg(ctx, call, 2, "dim")?, output.ndim())?;
    args.opt_dtype(3, "input_dtype")?;
    let out = ctx.output(call, 0)?;
    float_view(ctx, &grad, "grad_output")?;
    float_view(ctx, &output, "output")?;
    float_view(ctx, &out, "grad_input")?;
    if grad.shape() != output.shape() || out.shape() != output.shape() {
        return Err(ctx.invalid(format!(
            "grad_output {:?}, output {:?} and grad_input {:?} must have the same shape",
            grad.shape(),
            output.shape(),
            out.shape()
        )));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(if out.dtype() == DType::Float64 {
        backward_work::<f64>(grad, output, out, dim, log)
    } else {
        backward_work::<f32>(grad, output, out, dim, log)
    }))
}

/// `_softmax_backward_data(Tensor grad_output, Tensor output, int dim,
/// ScalarType input_dtype) -> Tensor` (and `.out`).
pub(crate) fn softmax_backward_data(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    backward(ctx, call, false)
}

/// `_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim,
/// ScalarType input_dtype) -> Tensor` (and `.out`).
pub(crate) fn log_softmax_backward_data(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    backward(ctx, call, true)
}

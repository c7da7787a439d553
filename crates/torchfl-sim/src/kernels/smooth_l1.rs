//! `smooth_l1_loss` and its backward: the box-regression loss of detection
//! heads (Faster R-CNN's RPN and ROI heads).
//!
//! The elementwise loss is PyTorch's: with `z = |x - y|`, `0.5 z^2 / beta`
//! below `beta` and `z - 0.5 beta` above (plain L1 for `beta == 0`).
//! Reductions: 0 none, 1 mean, 2 sum; sums accumulate in `f64` over
//! parallel chunks combined in order, so results are deterministic. The
//! backward is `norm * clamp(x - y, -beta, beta) / beta * grad` in the same
//! branch form as PyTorch's CPU kernel (`norm = 1 / numel` for mean).

use rayon::prelude::*;

use super::elementwise::{gather, GRAIN, PAR_MIN};
use super::linalg::write_with;
use super::real::{with_real, Real};
use super::softmax::int_arg;
use super::view::{broadcast_shapes, disjoint, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::error::Result;
use crate::runtime::Work;

/// Reads the `float beta` argument at `i` (default 1.0) and checks it.
fn beta_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize) -> Result<f64> {
    let beta = match call.args.get(i) {
        None | Some(ArgRef::None) => 1.0,
        Some(ArgRef::Float(v)) => *v,
        Some(ArgRef::Int(v)) => *v as f64,
        _ => return Err(ctx.invalid(format!("argument {i} (beta) must be a float"))),
    };
    if beta < 0.0 {
        return Err(ctx.invalid("smooth_l1_loss does not support negative values for beta."));
    }
    Ok(beta)
}

fn reduction_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize) -> Result<i64> {
    let r = if call.args.len() > i { int_arg(ctx, call, i, "reduction")? } else { 1 };
    if !(0..=2).contains(&r) {
        return Err(ctx.invalid(format!("{r} is not a valid value for reduction")));
    }
    Ok(r)
}

/// The elementwise loss of a difference.
#[inline(always)]
fn loss<C: Real>(d: C, beta: C) -> C {
    let z = d.abs();
    if z < beta {
        C::of(0.5) * z * z / beta
    } else {
        z - C::of(0.5) * beta
    }
}

/// `self` and `target` broadcast to `shape`.
fn operands(
    ctx: &KernelCtx<'_>,
    x: TensorView,
    y: TensorView,
    shape: &[usize],
) -> Result<(TensorView, TensorView)> {
    let bad = |v: &TensorView| ctx.invalid(format!("shape {:?} cannot be broadcast to {shape:?}", v.shape()));
    let xb = x.broadcast_to(shape).ok_or_else(|| bad(&x))?;
    let yb = y.broadcast_to(shape).ok_or_else(|| bad(&y))?;
    Ok((xb, yb))
}

/// `smooth_l1_loss(Tensor self, Tensor target, int reduction=Mean, float
/// beta=1.0) -> Tensor` (and `.out`).
pub(crate) fn smooth_l1_loss(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 4)?;
    let x = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let y = ctx.device_view(args.tensor(1, "target")?, "target")?;
    let reduction = reduction_arg(ctx, call, 2)?;
    let beta = beta_arg(ctx, call, 3)?;
    let out = ctx.output(call, 0)?;
    let shape = broadcast_shapes(&[x.shape(), y.shape()]).map_err(|m| ctx.invalid(m))?.to_vec();
    let expected: &[usize] = if reduction == 0 { &shape } else { &[] };
    if out.shape() != expected || out.dtype() != x.dtype() || y.dtype() != x.dtype() {
        return Err(ctx.invalid(format!(
            "expected {} inputs and a {} output of shape {expected:?}, got self {}, target {}, output {} {:?}",
            out.dtype(),
            out.dtype(),
            x.dtype(),
            y.dtype(),
            out.dtype(),
            out.shape()
        )));
    }
    if !disjoint(&out, &x) || !disjoint(&out, &y) {
        return Err(ctx.invalid("the output must not overlap the inputs"));
    }
    let (xb, yb) = operands(ctx, x, y, &shape)?;
    let n: usize = shape.iter().product();
    with_real!(ctx, out.dtype(), C => Ok(Some(Work::new(move || {
        let (xs, ys) = (gather::<C>(&xb), gather::<C>(&yb));
        let b = C::of(beta);
        let elem = |(a, t): (&C, &C)| if beta == 0.0 { (*a - *t).abs() } else { loss(*a - *t, b) };
        if reduction == 0 {
            write_with::<C>(&out, &[&xb, &yb], |o| {
                if n >= PAR_MIN {
                    o.par_iter_mut().zip(xs.par_iter().zip(ys.par_iter())).for_each(|(v, p)| *v = elem(p));
                } else {
                    o.iter_mut().zip(xs.iter().zip(ys.iter())).for_each(|(v, p)| *v = elem(p));
                }
            });
            return Ok(());
        }
        let partial: Vec<f64> = xs
            .par_chunks(GRAIN)
            .zip(ys.par_chunks(GRAIN))
            .map(|(a, t)| a.iter().zip(t).map(|p| elem(p).wide()).sum::<f64>())
            .collect();
        let mut total: f64 = partial.iter().sum();
        if reduction == 1 {
            total /= n as f64;
        }
        write_with::<C>(&out, &[&xb, &yb], |o| o[0] = C::of(total));
        Ok(())
    }))))
}

/// `smooth_l1_loss_backward(Tensor grad_output, Tensor self, Tensor target,
/// int reduction, float beta) -> Tensor` (and `.grad_input`).
pub(crate) fn smooth_l1_loss_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 5, 5)?;
    let g = ctx.device_view(args.tensor(0, "grad_output")?, "grad_output")?;
    let x = ctx.device_view(args.tensor(1, "self")?, "self")?;
    let y = ctx.device_view(args.tensor(2, "target")?, "target")?;
    let reduction = reduction_arg(ctx, call, 3)?;
    let beta = beta_arg(ctx, call, 4)?;
    let out = ctx.output(call, 0)?;
    if out.shape() != x.shape()
        || out.dtype() != x.dtype()
        || g.dtype() != x.dtype()
        || y.dtype() != x.dtype()
    {
        return Err(ctx.invalid(format!(
            "expected grad_input shaped and typed like self ({} {:?}), got {} {:?}",
            x.dtype(),
            x.shape(),
            out.dtype(),
            out.shape()
        )));
    }
    if !disjoint(&out, &x) || !disjoint(&out, &y) || !disjoint(&out, &g) {
        return Err(ctx.invalid("grad_input must not overlap the inputs"));
    }
    let shape = out.shape().to_vec();
    let bad = |v: &TensorView| ctx.invalid(format!("shape {:?} cannot be broadcast to {shape:?}", v.shape()));
    let gb = g.broadcast_to(&shape).ok_or_else(|| bad(&g))?;
    let (xb, yb) = operands(ctx, x, y, &shape)?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(None);
    }
    let norm = if reduction == 1 { 1.0 / n as f64 } else { 1.0 };
    with_real!(ctx, out.dtype(), C => Ok(Some(Work::new(move || {
        let (gs, xs, ys) = (gather::<C>(&gb), gather::<C>(&xb), gather::<C>(&yb));
        let (b, nrm) = (C::of(beta), C::of(norm));
        let grad = |i: usize| {
            let d = xs[i] - ys[i];
            if beta == 0.0 {
                // L1's gradient: sign(x - y).
                let sign = if d > C::of(0.0) {
                    C::of(1.0)
                } else if d < C::of(0.0) {
                    C::of(-1.0)
                } else {
                    C::of(0.0)
                };
                nrm * sign * gs[i]
            } else if d <= -b {
                -nrm * gs[i]
            } else if d >= b {
                nrm * gs[i]
            } else {
                nrm * d * gs[i] / b
            }
        };
        write_with::<C>(&out, &[&gb, &xb, &yb], |o| {
            if n >= PAR_MIN {
                o.par_iter_mut().enumerate().for_each(|(i, v)| *v = grad(i));
            } else {
                o.iter_mut().enumerate().for_each(|(i, v)| *v = grad(i));
            }
        });
        Ok(())
    }))))
}

//! Arithmetic: `add`/`sub`/`mul`/`div`, `neg` and `relu`, `abs` and
//! `sign`, `maximum`/`minimum`, `clamp`, `addcmul`/`addcdiv` and `lerp`.
//!
//! They are together because they share one rule: they compute in the
//! output's arithmetic type (integers included, except where PyTorch
//! refuses them), after checking that the promoted input type casts to it.

use super::{check_cast, check_shapes, input, other, real_dtype, tensor_operand, Other};
use crate::dtype::{with_arith, Arith, DType, Element, Float};
use crate::error::Result;
use crate::kernels::elementwise::{map1, map2, map3};
use crate::kernels::promotion::result_type;
use crate::kernels::real::Real;
use crate::kernels::view::TensorView;
use crate::kernels::{ArgRef, Args, Frame, KernelCtx, Scalar};
use crate::runtime::Work;

// ----------------------------------------------------------------- arithmetic

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
}

fn is_one(s: Scalar) -> bool {
    match s {
        Scalar::Bool(b) => b,
        Scalar::Int(i) => i == 1,
        Scalar::Float(f) => f == 1.0,
    }
}

/// `add`/`sub`/`mul`/`div` in their Tensor, Scalar and in-place forms.
fn arith(ctx: &KernelCtx<'_>, call: &Frame<'_>, op: ArithOp) -> Result<Option<Work>> {
    let has_alpha = matches!(op, ArithOp::Add | ArithOp::Sub);
    let args = Args::new(ctx, call, 2, if has_alpha { 3 } else { 2 })?;
    let a = Other::Tensor(ctx.operand(args.tensor(0, "self")?, "self")?);
    let b = other(ctx, call, &args, 1)?;
    let alpha = if has_alpha { args.scalar(2, "alpha", Some(Scalar::Int(1)))? } else { Scalar::Int(1) };
    let out = ctx.output(call, 0)?;
    let out_dtype = out.dtype();

    if op == ArithOp::Sub {
        if a.is_bool() && b.is_bool() {
            return Err(ctx.invalid(
                "Subtraction, the `-` operator, with two bool tensors is not supported. Use the \
                 `^` or `logical_xor()` operator instead.",
            ));
        }
        if a.is_bool() || b.is_bool() {
            return Err(ctx.invalid(
                "Subtraction, the `-` operator, with a bool tensor is not supported. If you are \
                 trying to invert a mask, use the `~` or `logical_not()` operator instead.",
            ));
        }
    }
    let mut result = result_type(&[a.participant(), b.participant()]);
    if op == ArithOp::Div && !result.is_floating() {
        result = DType::Float32;
    }
    check_cast(ctx, result, out_dtype)?;
    if has_alpha {
        if matches!(alpha, Scalar::Bool(_)) && out_dtype != DType::Bool {
            return Err(ctx.invalid("Boolean alpha only supported for Boolean results."));
        }
        if !out_dtype.is_floating() && matches!(alpha, Scalar::Float(_)) {
            return Err(ctx
                .invalid("For integral input tensors, argument alpha must not be a floating point number."));
        }
    }
    check_shapes(ctx, &out, &[&a, &b])?;

    if op == ArithOp::Div {
        return match out_dtype {
            DType::Float64 => div_work::<f64>(ctx, out, a, b),
            DType::Float16 | DType::BFloat16 | DType::Float32 => div_work::<f32>(ctx, out, a, b),
            other => {
                Err(ctx
                    .invalid(format!("result type Float can't be cast to the desired output type {other}")))
            }
        };
    }
    with_arith!(out_dtype, C => {
        let ia = input::<C>(ctx, a, &out, out_dtype)?;
        let ib = input::<C>(ctx, b, &out, out_dtype)?;
        let alpha_c: C = ctx.scalar_to(alpha, out_dtype)?;
        let one = is_one(alpha);
        Ok(Some(match op {
            ArithOp::Add if one => map2::<C, C, _>(out, ia, ib, |x, y| x.add(y)),
            ArithOp::Add => map2::<C, C, _>(out, ia, ib, move |x, y| x.add(alpha_c.mul(y))),
            ArithOp::Sub if one => map2::<C, C, _>(out, ia, ib, |x, y| x.sub(y)),
            ArithOp::Sub => map2::<C, C, _>(out, ia, ib, move |x, y| x.sub(alpha_c.mul(y))),
            ArithOp::Mul | ArithOp::Div => map2::<C, C, _>(out, ia, ib, |x, y| x.mul(y)),
        }))
    })
}

fn div_work<C: Float>(ctx: &KernelCtx<'_>, out: TensorView, a: Other, b: Other) -> Result<Option<Work>> {
    let dtype = out.dtype();
    let ia = input::<C>(ctx, a, &out, dtype)?;
    let ib = input::<C>(ctx, b, &out, dtype)?;
    Ok(Some(map2::<C, C, _>(out, ia, ib, |x, y| x.div(y))))
}

/// `add.Tensor` / `add_.Tensor(Tensor self, Tensor other, *, Scalar alpha=1)`
pub(crate) fn add_tensor(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    arith(ctx, call, ArithOp::Add)
}
/// `add.Scalar` / `add_.Scalar(Tensor self, Scalar other, Scalar alpha=1)`
pub(crate) fn add_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    arith(ctx, call, ArithOp::Add)
}
/// `sub.Tensor` / `sub_.Tensor(Tensor self, Tensor other, *, Scalar alpha=1)`
pub(crate) fn sub_tensor(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    arith(ctx, call, ArithOp::Sub)
}
/// `sub.Scalar` / `sub_.Scalar(Tensor self, Scalar other, Scalar alpha=1)`
pub(crate) fn sub_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    arith(ctx, call, ArithOp::Sub)
}
/// `mul.Tensor` / `mul_.Tensor(Tensor self, Tensor other)`
pub(crate) fn mul_tensor(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    arith(ctx, call, ArithOp::Mul)
}
/// `mul.Scalar` / `mul_.Scalar(Tensor self, Scalar other)`
pub(crate) fn mul_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    arith(ctx, call, ArithOp::Mul)
}
/// `div.Tensor` / `div_.Tensor(Tensor self, Tensor other)`: true division.
pub(crate) fn div_tensor(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    arith(ctx, call, ArithOp::Div)
}
/// `div.Scalar` / `div_.Scalar(Tensor self, Scalar other)`: true division.
pub(crate) fn div_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    arith(ctx, call, ArithOp::Div)
}

// ---------------------------------------------------------------------- unary

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnaryOp {
    Neg,
    Relu,
}

fn unary(ctx: &KernelCtx<'_>, call: &Frame<'_>, op: UnaryOp) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    let a = Other::Tensor(ctx.operand(args.tensor(0, "self")?, "self")?);
    let out = ctx.output(call, 0)?;
    let dtype = out.dtype();
    let in_dtype = match &a {
        Other::Tensor(o) => o.dtype(),
        Other::Scalar(_) => dtype,
    };
    if in_dtype == DType::Bool || dtype == DType::Bool {
        return Err(match op {
            UnaryOp::Neg => ctx.invalid(
                "Negation, the `-` operator, on a bool tensor is not supported. If you are \
                 trying to invert a mask, use the `~` or `logical_not()` operator instead.",
            ),
            UnaryOp::Relu => ctx.unimplemented("bool tensors are not supported"),
        });
    }
    check_cast(ctx, in_dtype, dtype)?;
    check_shapes(ctx, &out, &[&a])?;
    with_arith!(dtype, C => {
        let ia = input::<C>(ctx, a, &out, dtype)?;
        Ok(Some(match op {
            UnaryOp::Neg => map1::<C, C, _>(out, ia, |x| x.neg()),
            UnaryOp::Relu => map1::<C, C, _>(out, ia, |x| x.relu()),
        }))
    })
}

/// `neg` / `neg_(Tensor self)`
pub(crate) fn neg(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    unary(ctx, call, UnaryOp::Neg)
}
/// `relu` / `relu_(Tensor self)`
pub(crate) fn relu(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    unary(ctx, call, UnaryOp::Relu)
}

/// A unary function over every arithmetic type (integers and floats).
trait GenericUnary: Copy + Send + Sync + 'static {
    fn call<C: Arith>(self, x: C) -> C;
}

#[derive(Debug, Clone, Copy)]
struct AbsFn;
impl GenericUnary for AbsFn {
    #[inline(always)]
    fn call<C: Arith>(self, x: C) -> C {
        if x < C::ZERO {
            x.neg()
        } else {
            // `0 + x` also turns -0.0 into 0.0.
            C::ZERO.add(x)
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct SignFn;
impl GenericUnary for SignFn {
    #[inline(always)]
    fn call<C: Arith>(self, x: C) -> C {
        // (0 < x) - (x < 0): 0 for NaN, like PyTorch's CPU kernel.
        let one = C::from_i64(1);
        if x > C::ZERO {
            one
        } else if x < C::ZERO {
            C::ZERO.sub(one)
        } else {
            C::ZERO
        }
    }
}

/// A unary op over the output's arithmetic type (bool refused).
fn int_or_float_unary<F: GenericUnary>(ctx: &KernelCtx<'_>, call: &Frame<'_>, f: F) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let out = ctx.output(call, 0)?;
    let dtype = out.dtype();
    if dtype == DType::Bool || a.is_bool() {
        return Err(ctx.unimplemented("bool tensors are not supported"));
    }
    check_shapes(ctx, &out, &[&a])?;
    with_arith!(dtype, C => {
        let ia = input::<C>(ctx, a, &out, dtype)?;
        Ok(Some(map1::<C, C, _>(out, ia, move |x| f.call(x))))
    })
}

/// `abs(Tensor self) -> Tensor` (and `abs_`, `abs.out`): any numeric dtype.
pub(crate) fn abs(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    int_or_float_unary(ctx, call, AbsFn)
}

/// `sign(Tensor self) -> Tensor` (and `sign_`, `sign.out`).
pub(crate) fn sign(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    int_or_float_unary(ctx, call, SignFn)
}

// -------------------------------------------------------- maximum / minimum

/// NaN-propagating maximum (`x != x` only for NaN).
#[inline(always)]
#[allow(clippy::eq_op)]
fn max_nan<C: Element>(x: C, y: C) -> C {
    if x != x || x > y {
        x
    } else {
        y
    }
}

/// NaN-propagating minimum.
#[inline(always)]
#[allow(clippy::eq_op)]
fn min_nan<C: Element>(x: C, y: C) -> C {
    if x != x || x < y {
        x
    } else {
        y
    }
}

fn max_min(ctx: &KernelCtx<'_>, call: &Frame<'_>, is_max: bool) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let b = tensor_operand(ctx, &args, 1, "other")?;
    let out = ctx.output(call, 0)?;
    check_shapes(ctx, &out, &[&a, &b])?;
    let dtype = out.dtype();
    with_arith!(dtype, C => {
        let ia = input::<C>(ctx, a, &out, dtype)?;
        let ib = input::<C>(ctx, b, &out, dtype)?;
        Ok(Some(if is_max {
            map2::<C, C, _>(out, ia, ib, max_nan)
        } else {
            map2::<C, C, _>(out, ia, ib, min_nan)
        }))
    })
}

/// `maximum(Tensor self, Tensor other) -> Tensor` (and `maximum.out`):
/// NaN propagates.
pub(crate) fn maximum(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    max_min(ctx, call, true)
}

/// `minimum(Tensor self, Tensor other) -> Tensor` (and `minimum.out`).
pub(crate) fn minimum(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    max_min(ctx, call, false)
}

// ---------------------------------------------------------------------- clamp

/// Reads optional argument `i` as a tensor operand, a Scalar, or absent.
fn opt_other(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    args: &Args<'_>,
    i: usize,
    name: &str,
) -> Result<Option<Other>> {
    match call.args.get(i) {
        None | Some(ArgRef::None) => Ok(None),
        Some(ArgRef::Tensor(t)) => Ok(Some(Other::Tensor(ctx.operand(t, name)?))),
        _ => Ok(Some(Other::Scalar(args.scalar(i, name, None)?))),
    }
}

/// `clamp(self, min?, max?)`: `min(max(x, lo), hi)`, NaN propagating.
fn clamp_impl(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    a: Other,
    lo: Option<Other>,
    hi: Option<Other>,
) -> Result<Option<Work>> {
    let out = ctx.output(call, 0)?;
    let dtype = out.dtype();
    if dtype == DType::Bool {
        return Err(ctx.unimplemented("bool tensors are not supported"));
    }
    {
        let mut all: Vec<&Other> = vec![&a];
        all.extend(lo.iter());
        all.extend(hi.iter());
        check_shapes(ctx, &out, &all)?;
    }
    #[inline(always)]
    fn clamp_lo<C: Element>(x: C, lo: C) -> C {
        #[allow(clippy::eq_op)]
        if x != x || lo != lo {
            if x != x {
                x
            } else {
                lo
            }
        } else if x < lo {
            lo
        } else {
            x
        }
    }
    #[inline(always)]
    fn clamp_hi<C: Element>(x: C, hi: C) -> C {
        #[allow(clippy::eq_op)]
        if x != x || hi != hi {
            if x != x {
                x
            } else {
                hi
            }
        } else if x > hi {
            hi
        } else {
            x
        }
    }
    with_arith!(dtype, C => {
        let ia = input::<C>(ctx, a, &out, dtype)?;
        Ok(Some(match (lo, hi) {
            (Some(l), Some(h)) => {
                let il = input::<C>(ctx, l, &out, dtype)?;
                let ih = input::<C>(ctx, h, &out, dtype)?;
                map3::<C, C, _>(out, ia, il, ih, |x, l, h| clamp_hi(clamp_lo(x, l), h))
            }
            (Some(l), None) => {
                let il = input::<C>(ctx, l, &out, dtype)?;
                map2::<C, C, _>(out, ia, il, clamp_lo)
            }
            (None, Some(h)) => {
                let ih = input::<C>(ctx, h, &out, dtype)?;
                map2::<C, C, _>(out, ia, ih, clamp_hi)
            }
            (None, None) => {
                return Err(ctx.invalid("torch.clamp: At least one of 'min' or 'max' must not be None"))
            }
        }))
    })
}

/// `clamp(Tensor self, Scalar? min=None, Scalar? max=None)` and
/// `clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None)` (and
/// their in-place and out= forms).
pub(crate) fn clamp(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 3)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let lo = opt_other(ctx, call, &args, 1, "min")?;
    let hi = opt_other(ctx, call, &args, 2, "max")?;
    clamp_impl(ctx, call, a, lo, hi)
}

/// `clamp_min(Tensor self, Scalar min)` / `clamp_min.Tensor(Tensor self,
/// Tensor min)` (and their in-place and out= forms).
pub(crate) fn clamp_min(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let lo = other(ctx, call, &args, 1)?;
    clamp_impl(ctx, call, a, Some(lo), None)
}

/// `clamp_max(Tensor self, Scalar max)` / `clamp_max.Tensor(Tensor self,
/// Tensor max)` (and their in-place and out= forms).
pub(crate) fn clamp_max(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let hi = other(ctx, call, &args, 1)?;
    clamp_impl(ctx, call, a, None, Some(hi))
}

// -------------------------------------------------- addcmul / addcdiv / lerp

/// `addcmul`/`addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *,
/// Scalar value=1)`.
fn addc(ctx: &KernelCtx<'_>, call: &Frame<'_>, div: bool) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 4)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let t1 = tensor_operand(ctx, &args, 1, "tensor1")?;
    let t2 = tensor_operand(ctx, &args, 2, "tensor2")?;
    let value = args.scalar(3, "value", Some(Scalar::Int(1)))?;
    let out = ctx.output(call, 0)?;
    let dtype = out.dtype();
    check_shapes(ctx, &out, &[&a, &t1, &t2])?;
    if div {
        if !dtype.is_floating() {
            return Err(ctx.invalid(
                "Integer division with addcdiv is no longer supported, and in a future release \
                 addcdiv will perform a true division of tensor1 and tensor2.",
            ));
        }
        return if dtype == DType::Float64 {
            addcdiv_work::<f64>(ctx, out, a, t1, t2, value)
        } else {
            addcdiv_work::<f32>(ctx, out, a, t1, t2, value)
        };
    }
    if dtype == DType::Bool {
        return Err(ctx.unimplemented("bool tensors are not supported"));
    }
    with_arith!(dtype, C => {
        let v: C = ctx.scalar_to(value, dtype)?;
        let ia = input::<C>(ctx, a, &out, dtype)?;
        let i1 = input::<C>(ctx, t1, &out, dtype)?;
        let i2 = input::<C>(ctx, t2, &out, dtype)?;
        Ok(Some(map3::<C, C, _>(out, ia, i1, i2, move |x, y, z| x.add(v.mul(y.mul(z))))))
    })
}

fn addcdiv_work<C: Real>(
    ctx: &KernelCtx<'_>,
    out: TensorView,
    a: Other,
    t1: Other,
    t2: Other,
    value: Scalar,
) -> Result<Option<Work>> {
    let dtype = out.dtype();
    let v: C = ctx.scalar_to(value, dtype)?;
    let ia = input::<C>(ctx, a, &out, dtype)?;
    let i1 = input::<C>(ctx, t1, &out, dtype)?;
    let i2 = input::<C>(ctx, t2, &out, dtype)?;
    Ok(Some(map3::<C, C, _>(out, ia, i1, i2, move |x, y, z| x + v * (y / z))))
}

/// `addcmul(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar
/// value=1) -> Tensor` (and `addcmul_`, `addcmul.out`):
/// `self + value * tensor1 * tensor2`.
pub(crate) fn addcmul(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    addc(ctx, call, false)
}

/// `addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar
/// value=1) -> Tensor` (and `addcdiv_`, `addcdiv.out`):
/// `self + value * tensor1 / tensor2`; floating outputs only.
pub(crate) fn addcdiv(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    addc(ctx, call, true)
}

/// PyTorch's `lerp`: `self + w * (end - self)` for `|w| < 0.5`, else
/// `end - (end - self) * (1 - w)` (exact at both ends).
#[inline(always)]
fn lerp_fn<C: Real>(x: C, e: C, w: C) -> C {
    let d = e - x;
    if w.abs() < C::of(0.5) {
        x + w * d
    } else {
        e - d * (C::of(1.0) - w)
    }
}

fn lerp_work<C: Real>(
    ctx: &KernelCtx<'_>,
    out: TensorView,
    a: Other,
    e: Other,
    w: Other,
) -> Result<Option<Work>> {
    let dtype = out.dtype();
    let ia = input::<C>(ctx, a, &out, dtype)?;
    let ie = input::<C>(ctx, e, &out, dtype)?;
    Ok(Some(match w {
        Other::Scalar(s) => {
            let wc = C::of(s.as_f64());
            map2::<C, C, _>(out, ia, ie, move |x, e| lerp_fn(x, e, wc))
        }
        w => {
            let iw = input::<C>(ctx, w, &out, dtype)?;
            map3::<C, C, _>(out, ia, ie, iw, lerp_fn)
        }
    }))
}

/// `lerp.Scalar(Tensor self, Tensor end, Scalar weight)` and
/// `lerp.Tensor(Tensor self, Tensor end, Tensor weight)` (and their
/// in-place and out= forms); floating outputs only.
pub(crate) fn lerp(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 3)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let e = tensor_operand(ctx, &args, 1, "end")?;
    let w = other(ctx, call, &args, 2)?;
    let out = ctx.output(call, 0)?;
    real_dtype(ctx, out.dtype())?;
    check_shapes(ctx, &out, &[&a, &e, &w])?;
    if out.dtype() == DType::Float64 {
        lerp_work::<f64>(ctx, out, a, e, w)
    } else {
        lerp_work::<f32>(ctx, out, a, e, w)
    }
}

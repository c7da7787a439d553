//! Pointwise operators: fill, zero, copy, arithmetic, unary and comparison
//! ops, each a validation step in front of the elementwise engine.
//!
//! Arithmetic computes in the *output* dtype (the host already applied type
//! promotion when it allocated the output; half types compute in `f32`), and
//! checks, like PyTorch, that the promoted type can be cast to it (which is
//! what rejects `int_tensor.add_(0.5)`). Comparisons compute in the promoted
//! type of their inputs, which the kernel derives with PyTorch's
//! `result_type` rules, and produce bool.

use super::dtype::{
    can_cast, result_type, with_arith, with_storage, Arith, DType, Element, Float, Participant, B8,
};
use super::elementwise::{fill, map1, map2, Input};
use super::view::TensorView;
use super::{broadcast_shapes, ArgRef, Args, Frame, KernelCtx, Operand, Scalar};
use crate::error::Result;
use crate::stream::Work;

/// The second operand of a binary op: a tensor or a `Scalar`.
enum Other {
    Tensor(Operand),
    Scalar(Scalar),
}

impl Other {
    fn participant(&self) -> Participant {
        match self {
            Other::Tensor(o) => o.participant(),
            Other::Scalar(s) => Participant::Wrapped(s.category()),
        }
    }
    fn shape(&self) -> &[usize] {
        match self {
            Other::Tensor(o) => o.shape(),
            Other::Scalar(_) => &[],
        }
    }
    fn is_bool(&self) -> bool {
        match self {
            Other::Tensor(o) => o.dtype() == DType::Bool,
            Other::Scalar(s) => matches!(s, Scalar::Bool(_)),
        }
    }
}

/// Reads argument `i` as a tensor operand or a Scalar.
#[inline(always)]
fn other(ctx: &KernelCtx<'_>, call: &Frame<'_>, args: &Args<'_>, i: usize) -> Result<Other> {
    match call.args.get(i) {
        Some(ArgRef::Tensor(t)) => Ok(Other::Tensor(ctx.operand(t, "other")?)),
        _ => Ok(Other::Scalar(args.scalar(i, "other", None)?)),
    }
}

/// An engine input in compute type `C` for an operand broadcast to `out`;
/// Scalars are converted with overflow checks against `target`.
#[inline(always)]
fn input<C: Element>(ctx: &KernelCtx<'_>, o: Other, out: &TensorView, target: DType) -> Result<Input<C>> {
    match o {
        Other::Tensor(Operand::View(v)) => v.into_broadcast(out.shape()).map(Input::View).map_err(|v| {
            ctx.invalid(format!(
                "shape {:?} cannot be broadcast to the output shape {:?}",
                v.shape(),
                out.shape()
            ))
        }),
        Other::Tensor(Operand::Host(_, value, _)) => Ok(Input::Const(value.cast::<C>())),
        Other::Scalar(s) => Ok(Input::Const(ctx.scalar_to::<C>(s, target)?)),
    }
}

/// Checks that the inputs broadcast to exactly the output's shape and do
/// not partially overlap it.
fn check_shapes(ctx: &KernelCtx<'_>, out: &TensorView, inputs: &[&Other]) -> Result<()> {
    if inputs.iter().any(|o| o.shape() != out.shape()) {
        check_broadcast(ctx, out, inputs)?;
    }
    for o in inputs {
        if let Other::Tensor(op) = o {
            ctx.check_overlap(out, op)?;
        }
    }
    Ok(())
}

/// The broadcast part of [`check_shapes`], for inputs whose shapes are not
/// all the output's.
fn check_broadcast(ctx: &KernelCtx<'_>, out: &TensorView, inputs: &[&Other]) -> Result<()> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|o| o.shape()).collect();
    let b = broadcast_shapes(&shapes).map_err(|m| ctx.invalid(m))?;
    if *b != *out.shape() {
        return Err(ctx.invalid(format!(
            "output with shape {:?} doesn't match the broadcast shape {:?}",
            out.shape(),
            b
        )));
    }
    Ok(())
}

fn check_cast(ctx: &KernelCtx<'_>, result: DType, out: DType) -> Result<()> {
    if can_cast(result, out) {
        Ok(())
    } else {
        Err(ctx.invalid(format!("result type {result} can't be cast to the desired output type {out}")))
    }
}

// ------------------------------------------------------------------ fill/copy

/// `fill_.Scalar(Tensor(a!) self, Scalar value)`
pub(crate) fn fill_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    args.tensor(0, "self")?;
    let value = args.scalar(1, "value", None)?;
    let out = ctx.output(call, 0)?;
    let dtype = out.dtype();
    with_storage!(dtype, T => {
        let v: T = ctx.scalar_to(value, dtype)?;
        Ok(Some(fill(out, v)))
    })
}

/// `zero_(Tensor(a!) self)`
pub(crate) fn zero(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    args.tensor(0, "self")?;
    let out = ctx.output(call, 0)?;
    with_storage!(out.dtype(), T => Ok(Some(fill(out, T::ZERO))))
}

/// `copy_(Tensor(a!) self, Tensor src, bool non_blocking=False)`: strided,
/// converting, broadcasting `src` to `self`; `src` may live on another
/// device of this plugin.
pub(crate) fn copy(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 3)?;
    args.tensor(0, "self")?;
    let src = Other::Tensor(ctx.operand_any_device(args.tensor(1, "src")?, "src")?);
    args.bool_or(2, "non_blocking", false)?;
    let out = ctx.output(call, 0)?;
    // `src` broadcasts to `self`, whose shape is fixed.
    if broadcast_shapes(&[out.shape(), src.shape()]).ok().as_deref() != Some(out.shape()) {
        return Err(ctx.invalid(format!(
            "the source of shape {:?} cannot be broadcast to the destination of shape {:?}",
            src.shape(),
            out.shape()
        )));
    }
    if let Other::Tensor(op) = &src {
        ctx.check_overlap(&out, op)?;
    }
    let dtype = out.dtype();
    with_storage!(dtype, T => {
        let a = input::<T>(ctx, src, &out, dtype)?;
        Ok(Some(map1::<T, T, _>(out, a, |x| x)))
    })
}

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

// ---------------------------------------------------------------- comparisons

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

fn compare_work<C: Element>(
    ctx: &KernelCtx<'_>,
    out: TensorView,
    a: Other,
    b: Other,
    result: DType,
    cmp: Cmp,
) -> Result<Option<Work>> {
    let ia = input::<C>(ctx, a, &out, result)?;
    let ib = input::<C>(ctx, b, &out, result)?;
    Ok(Some(match cmp {
        Cmp::Eq => map2::<C, B8, _>(out, ia, ib, |x, y| B8::from_bool(x == y)),
        Cmp::Ne => map2::<C, B8, _>(out, ia, ib, |x, y| B8::from_bool(x != y)),
        Cmp::Lt => map2::<C, B8, _>(out, ia, ib, |x, y| B8::from_bool(x < y)),
        Cmp::Le => map2::<C, B8, _>(out, ia, ib, |x, y| B8::from_bool(x <= y)),
        Cmp::Gt => map2::<C, B8, _>(out, ia, ib, |x, y| B8::from_bool(x > y)),
        Cmp::Ge => map2::<C, B8, _>(out, ia, ib, |x, y| B8::from_bool(x >= y)),
    }))
}

/// `eq/ne/lt/le/gt/ge` in `.Tensor` and `.Scalar` forms.
fn compare(ctx: &KernelCtx<'_>, call: &Frame<'_>, cmp: Cmp) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let a = Other::Tensor(ctx.operand(args.tensor(0, "self")?, "self")?);
    let b = other(ctx, call, &args, 1)?;
    let out = ctx.output(call, 0)?;
    check_shapes(ctx, &out, &[&a, &b])?;
    let result = result_type(&[a.participant(), b.participant()]);
    match result {
        DType::Float16 | DType::BFloat16 | DType::Float32 => compare_work::<f32>(ctx, out, a, b, result, cmp),
        other => with_storage!(other, C => compare_work::<C>(ctx, out, a, b, result, cmp)),
    }
}

/// `eq.Tensor` / `eq.Scalar`
pub(crate) fn eq(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    compare(ctx, call, Cmp::Eq)
}
/// `ne.Tensor` / `ne.Scalar`
pub(crate) fn ne(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    compare(ctx, call, Cmp::Ne)
}
/// `lt.Tensor` / `lt.Scalar`
pub(crate) fn lt(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    compare(ctx, call, Cmp::Lt)
}
/// `le.Tensor` / `le.Scalar`
pub(crate) fn le(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    compare(ctx, call, Cmp::Le)
}
/// `gt.Tensor` / `gt.Scalar`
pub(crate) fn gt(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    compare(ctx, call, Cmp::Gt)
}
/// `ge.Tensor` / `ge.Scalar`
pub(crate) fn ge(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    compare(ctx, call, Cmp::Ge)
}

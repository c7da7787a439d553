//! Comparisons (`eq` ... `ge`), logical ops, classification (`isnan`,
//! `isposinf`, `isneginf`) and bitwise ops: the pointwise operators whose
//! result is a truth value or a bit pattern rather than a number computed
//! in the output's type.

use super::{check_shapes, input, other, tensor_operand, Other};
use crate::dtype::{with_storage, DType, Element, B8};
use crate::error::Result;
use crate::kernels::elementwise::{map1, map2};
use crate::kernels::promotion::result_type;
use crate::kernels::view::TensorView;
use crate::kernels::{Args, Frame, KernelCtx};
use crate::runtime::Work;

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

// ------------------------------------------------------ logical and classify

/// `logical_not.out(Tensor self, *, Tensor(a!) out)`: any dtypes.
pub(crate) fn logical_not_out(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let out = ctx.output(call, 0)?;
    check_shapes(ctx, &out, &[&a])?;
    let ia = input::<f64>(ctx, a, &out, DType::Float64)?;
    Ok(Some(map1::<f64, B8, _>(out, ia, |x| B8::from_bool(x == 0.0))))
}

fn logical_binary(ctx: &KernelCtx<'_>, call: &Frame<'_>, and: bool) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let b = tensor_operand(ctx, &args, 1, "other")?;
    let out = ctx.output(call, 0)?;
    check_shapes(ctx, &out, &[&a, &b])?;
    let ia = input::<f64>(ctx, a, &out, DType::Float64)?;
    let ib = input::<f64>(ctx, b, &out, DType::Float64)?;
    Ok(Some(if and {
        map2::<f64, B8, _>(out, ia, ib, |x, y| B8::from_bool(x != 0.0 && y != 0.0))
    } else {
        map2::<f64, B8, _>(out, ia, ib, |x, y| B8::from_bool(x != 0.0 || y != 0.0))
    }))
}

/// `logical_and.out(Tensor self, Tensor other, *, Tensor(a!) out)`.
pub(crate) fn logical_and_out(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    logical_binary(ctx, call, true)
}

/// `logical_or.out(Tensor self, Tensor other, *, Tensor(a!) out)`.
pub(crate) fn logical_or_out(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    logical_binary(ctx, call, false)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Classify {
    Nan,
    PosInf,
    NegInf,
}

fn classify(ctx: &KernelCtx<'_>, call: &Frame<'_>, what: Classify) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let out = ctx.output(call, 0)?;
    check_shapes(ctx, &out, &[&a])?;
    let ia = input::<f64>(ctx, a, &out, DType::Float64)?;
    Ok(Some(match what {
        Classify::Nan => map1::<f64, B8, _>(out, ia, |x| B8::from_bool(x.is_nan())),
        Classify::PosInf => map1::<f64, B8, _>(out, ia, |x| B8::from_bool(x == f64::INFINITY)),
        Classify::NegInf => map1::<f64, B8, _>(out, ia, |x| B8::from_bool(x == f64::NEG_INFINITY)),
    }))
}

/// `isnan(Tensor self) -> Tensor`: bool.
pub(crate) fn isnan(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    classify(ctx, call, Classify::Nan)
}
/// `isposinf(Tensor self) -> Tensor` (and `isposinf.out`): bool.
pub(crate) fn isposinf(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    classify(ctx, call, Classify::PosInf)
}
/// `isneginf(Tensor self) -> Tensor` (and `isneginf.out`): bool.
pub(crate) fn isneginf(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    classify(ctx, call, Classify::NegInf)
}

// -------------------------------------------------------------------- bitwise

/// `bitwise_not(Tensor self) -> Tensor` (and `bitwise_not_`, `.out`):
/// logical not for bool, `!x` for integers.
pub(crate) fn bitwise_not(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let out = ctx.output(call, 0)?;
    check_shapes(ctx, &out, &[&a])?;
    match out.dtype() {
        DType::Bool => {
            let ia = input::<B8>(ctx, a, &out, DType::Bool)?;
            Ok(Some(map1::<B8, B8, _>(out, ia, |x| B8::from_bool(x.0 == 0))))
        }
        d if d.is_floating() => {
            Err(ctx.invalid("bitwise_not is only supported for integer and boolean tensors"))
        }
        d => {
            let ia = input::<i64>(ctx, a, &out, d)?;
            Ok(Some(map1::<i64, i64, _>(out, ia, |x| !x)))
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bitwise {
    And,
    Or,
    Xor,
}

fn bitwise(ctx: &KernelCtx<'_>, call: &Frame<'_>, op: Bitwise) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let b = other(ctx, call, &args, 1)?;
    let out = ctx.output(call, 0)?;
    check_shapes(ctx, &out, &[&a, &b])?;
    let dtype = out.dtype();
    if dtype.is_floating() {
        return Err(ctx.invalid("bitwise operations are only supported for integer and boolean tensors"));
    }
    // Bool values load as 0/1, so integer bit operations give the logical
    // results; the store converts back to the output's dtype.
    let ia = input::<i64>(ctx, a, &out, DType::Int64)?;
    let ib = input::<i64>(ctx, b, &out, DType::Int64)?;
    Ok(Some(match op {
        Bitwise::And => map2::<i64, i64, _>(out, ia, ib, |x, y| x & y),
        Bitwise::Or => map2::<i64, i64, _>(out, ia, ib, |x, y| x | y),
        Bitwise::Xor => map2::<i64, i64, _>(out, ia, ib, |x, y| x ^ y),
    }))
}

/// `bitwise_and.Tensor(Tensor self, Tensor other) -> Tensor` (and forms).
pub(crate) fn bitwise_and(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    bitwise(ctx, call, Bitwise::And)
}
/// `bitwise_or.Tensor(Tensor self, Tensor other) -> Tensor` (and forms).
pub(crate) fn bitwise_or(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    bitwise(ctx, call, Bitwise::Or)
}
/// `bitwise_xor.Tensor(Tensor self, Tensor other) -> Tensor` (and forms).
pub(crate) fn bitwise_xor(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    bitwise(ctx, call, Bitwise::Xor)
}

//! Operators that move or select values rather than compute them: `fill_`,
//! `zero_`, `copy_`, `where` and `masked_fill_`. They work in the output's
//! storage type, so any dtype (bool included) passes through unchanged.

use super::{check_shapes, input, tensor_operand, Other};
use crate::dtype::{with_storage, DType, Element};
use crate::error::Result;
use crate::kernels::elementwise::{fill, map1, map2, map3, Input};
use crate::kernels::view::broadcast_shapes;
use crate::kernels::{ArgRef, Args, Frame, KernelCtx};
use crate::runtime::Work;

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

// ---------------------------------------------------------------------- where

/// `where.self(Tensor condition, Tensor self, Tensor other) -> Tensor`
/// (and `where.self_out`): `condition ? self : other`, broadcasting, in
/// the output's (promoted) dtype.
pub(crate) fn where_self(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 3)?;
    let c = tensor_operand(ctx, &args, 0, "condition")?;
    if !matches!(&c, Other::Tensor(o) if matches!(o.dtype(), DType::Bool | DType::UInt8)) {
        return Err(ctx.invalid("where expected condition to be a boolean tensor"));
    }
    let a = tensor_operand(ctx, &args, 1, "self")?;
    let b = tensor_operand(ctx, &args, 2, "other")?;
    let out = ctx.output(call, 0)?;
    check_shapes(ctx, &out, &[&c, &a, &b])?;
    let dtype = out.dtype();
    with_storage!(dtype, T => {
        let ic = input::<T>(ctx, c, &out, dtype)?;
        let ia = input::<T>(ctx, a, &out, dtype)?;
        let ib = input::<T>(ctx, b, &out, dtype)?;
        Ok(Some(map3::<T, T, _>(out, ic, ia, ib, |c, x, y| if c != T::ZERO { x } else { y })))
    })
}

// ---------------------------------------------------------------- masked_fill

/// `masked_fill_.Scalar(Tensor(a!) self, Tensor mask, Scalar value)` and
/// `masked_fill_.Tensor(Tensor(a!) self, Tensor mask, Tensor value)` (a
/// 0-dim value): `self[mask] = value`, the mask broadcasting to `self`.
pub(crate) fn masked_fill(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 3)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let mask = tensor_operand(ctx, &args, 1, "mask")?;
    if !matches!(&mask, Other::Tensor(o) if o.dtype() == DType::Bool) {
        return Err(ctx.invalid("masked_fill_ only supports boolean masks"));
    }
    let value = match call.args.get(2) {
        Some(ArgRef::Tensor(t)) => {
            let v = ctx.operand(t, "value")?;
            if !v.shape().is_empty() {
                return Err(ctx.invalid(format!(
                    "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with {} \
                     dimension(s).",
                    v.shape().len()
                )));
            }
            Other::Tensor(v)
        }
        _ => Other::Scalar(args.scalar(2, "value", None)?),
    };
    let out = ctx.output(call, 0)?;
    check_shapes(ctx, &out, &[&a, &mask])?;
    let dtype = out.dtype();
    with_storage!(dtype, T => {
        let ia = input::<T>(ctx, a, &out, dtype)?;
        let im = input::<T>(ctx, mask, &out, dtype)?;
        let iv = input::<T>(ctx, value, &out, dtype)?;
        Ok(Some(match iv {
            Input::Const(v) => map2::<T, T, _>(out, ia, im, move |x, m| if m != T::ZERO { v } else { x }),
            iv => map3::<T, T, _>(out, ia, im, iv, |x, m, v| if m != T::ZERO { v } else { x }),
        }))
    })
}

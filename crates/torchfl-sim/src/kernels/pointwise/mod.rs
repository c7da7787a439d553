//! Pointwise operators: fill, zero, copy, arithmetic, unary and comparison
//! ops, each a validation step in front of the elementwise engine.
//!
//! Arithmetic computes in the *output* dtype (the host already applied type
//! promotion when it allocated the output; half types compute in `f32`), and
//! checks, like PyTorch, that the promoted type can be cast to it (which is
//! what rejects `int_tensor.add_(0.5)`). Comparisons compute in the promoted
//! type of their inputs, which the kernel derives with PyTorch's
//! `result_type` rules, and produce bool.
//!
//! The operators are grouped by what they compute: [`arithmetic`]
//! (add/sub/mul/div, neg, abs, min/max, clamp, addcmul/addcdiv, lerp),
//! [`comparison`] (comparisons, logical, classification and bitwise ops),
//! [`math`] (float-only functions such as `exp` or `pow`, and the
//! [`UnaryFn`]/[`BinaryFn`] scaffolding activations reuse) and [`select`]
//! (fill, copy, `where`, `masked_fill`). This module holds what all of them
//! share: reading an operand that may be a tensor or a Scalar, and the
//! broadcast, overlap and cast checks every pointwise kernel makes before
//! it hands its work to the engine.

use super::elementwise::Input;
use super::view::{broadcast_shapes, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx, Operand, Scalar};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::kernels::promotion::{can_cast, Participant};

mod arithmetic;
mod comparison;
mod math;
mod select;

// Language models
mod rounding;
pub(crate) use rounding::{div_mode, floor_divide, remainder};

pub(crate) use arithmetic::{
    abs, add_scalar, add_tensor, addcdiv, addcmul, clamp, clamp_max, clamp_min, div_scalar, div_tensor, lerp,
    maximum, minimum, mul_scalar, mul_tensor, neg, relu, sign, sub_scalar, sub_tensor,
};
pub(crate) use comparison::{
    bitwise_and, bitwise_not, bitwise_or, bitwise_xor, eq, ge, gt, isnan, isneginf, isposinf, le,
    logical_and_out, logical_not_out, logical_or_out, lt, ne,
};
pub(crate) use math::{
    exp, float_binary, float_unary, log, nan_to_num_out, pow_tensor_scalar, reciprocal, rsqrt, sigmoid, sqrt,
    tanh, BinaryFn, UnaryFn,
};
pub(crate) use select::{copy, fill_scalar, masked_fill, where_self, zero};

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

/// Reads tensor argument `i` as an operand.
fn tensor_operand(ctx: &KernelCtx<'_>, args: &Args<'_>, i: usize, name: &str) -> Result<Other> {
    Ok(Other::Tensor(ctx.operand(args.tensor(i, name)?, name)?))
}

/// Whether an output of `dtype` gets a real compute type.
fn real_dtype(ctx: &KernelCtx<'_>, dtype: DType) -> Result<()> {
    if dtype.is_floating() {
        Ok(())
    } else {
        Err(ctx.unimplemented(format!("{dtype} outputs are not supported")))
    }
}

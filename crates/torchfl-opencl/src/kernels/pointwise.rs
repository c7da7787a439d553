//! Pointwise operators of up to three operands and a number, as one
//! kernel (`pointwise.cl`) built per operator and dtypes: the backward of
//! relu (`threshold_backward`), GELU and its backward, the optimizers'
//! `addcmul`, `addcdiv` and `lerp`, `masked_fill`, `where` and
//! `bitwise_not`.

use super::{compute_type, enqueue, type_options, work_items, Args, Elem, Launch, Number, Operand, View};
use crate::error::{Error, Result};

const SOURCE: &str = concat!(include_str!("common.cl"), include_str!("pointwise.cl"));

/// The operators, each an `op_*` function of pointwise.cl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PointwiseOp {
    /// `grad if self > threshold else 0`: (grad_output, self), s = threshold.
    ThresholdBackward,
    /// GELU with the exact (erf) form.
    GeluNone,
    /// GELU with the tanh approximation.
    GeluTanh,
    /// GELU's backward, erf form: (grad_output, self).
    GeluBackwardNone,
    /// GELU's backward, tanh form: (grad_output, self).
    GeluBackwardTanh,
    /// `self + weight * (end - self)`: (self, end, weight).
    Lerp,
    /// `self + s * t1 * t2`.
    AddCMul,
    /// `self + s * t1 / t2`.
    AddCDiv,
    /// `value if mask else self`: (self, mask, value).
    MaskedFill,
    /// `self if condition else other`: (condition, self, other).
    Where,
    /// `~self` (logical not for bool).
    BitwiseNot,
    /// `self ** s`.
    PowScalar,
}

impl PointwiseOp {
    fn function(self) -> &'static str {
        match self {
            PointwiseOp::ThresholdBackward => "op_threshold_backward",
            PointwiseOp::GeluNone => "op_gelu_none",
            PointwiseOp::GeluTanh => "op_gelu_tanh",
            PointwiseOp::GeluBackwardNone => "op_gelu_backward_none",
            PointwiseOp::GeluBackwardTanh => "op_gelu_backward_tanh",
            PointwiseOp::Lerp => "op_lerp",
            PointwiseOp::AddCMul => "op_addcmul",
            PointwiseOp::AddCDiv => "op_addcdiv",
            PointwiseOp::MaskedFill => "op_masked_fill",
            PointwiseOp::Where => "op_where",
            PointwiseOp::BitwiseNot => "op_bitwise_not",
            PointwiseOp::PowScalar => "op_pow_scalar",
        }
    }

    /// Whether the operator exists for floating outputs only (true) or
    /// for integer and bool ones only (`bitwise_not`).
    fn takes(self, tc: Elem) -> bool {
        match self {
            PointwiseOp::GeluNone
            | PointwiseOp::GeluTanh
            | PointwiseOp::GeluBackwardNone
            | PointwiseOp::GeluBackwardTanh
            | PointwiseOp::Lerp
            | PointwiseOp::AddCDiv
            | PointwiseOp::PowScalar => tc.is_float(),
            PointwiseOp::BitwiseNot => !tc.is_float(),
            PointwiseOp::ThresholdBackward
            | PointwiseOp::AddCMul
            | PointwiseOp::MaskedFill
            | PointwiseOp::Where => true,
        }
    }
}

/// `out = op(x, y, z, s)`, each operand (absent, a host number or device
/// memory) broadcast to `out`, computed in the output's compute type.
pub(crate) fn pointwise(
    l: &Launch<'_>,
    op: PointwiseOp,
    operands: [Option<Operand<'_>>; 3],
    s: Number,
    out: &View<'_>,
) -> Result<()> {
    let Launch { rt, stream, op: name, .. } = *l;
    let device = stream.device;
    let tc = compute_type(out.elem);
    if !op.takes(tc) {
        return Err(Error::unimplemented(format!(
            "opencl: {name}: no kernel for a {} output",
            out.elem.c_name()
        )));
    }
    let mut args = Args::new();
    let mut types = Vec::with_capacity(4);
    let mut options = String::new();
    for ((operand, what), (type_macro, host_macro)) in
        operands.iter().zip(["x", "y", "z"]).zip([("TX", "X_HOST"), ("TY", "Y_HOST"), ("TZ", "Z_HOST")])
    {
        match operand {
            Some(Operand::Device(view)) => {
                args.broadcast(l, what, view, out.shape)?.number(tc, Number::Int(0));
                types.push((type_macro, view.elem));
            }
            Some(Operand::Host(v)) => {
                args.no_tensor().number(tc, *v);
                types.push((type_macro, tc));
                options.push_str(&format!(" -D{host_macro}"));
            }
            None => {
                args.no_tensor().number(tc, Number::Int(0));
                types.push((type_macro, tc));
                options.push_str(&format!(" -D{host_macro}"));
            }
        }
    }
    args.broadcast(l, "the output", out, out.shape)?.number(tc, s);
    types.push(("TO", out.elem));
    let mut all = type_options(rt, device, name, &types, tc)?;
    all.push_str(&options);
    all.push_str(&format!(" -DOP={}", op.function()));
    if tc.is_float() {
        all.push_str(" -DTC_FLOAT");
    }
    let n = work_items(out.shape);
    enqueue(l, (SOURCE, "pointwise"), all, &args, &[n], None)
}

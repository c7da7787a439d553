//! Pointwise operators of up to three operands (`kernels::pointwise`).

use crate::abi::frame::Call;
use crate::error::{Error, Result};
use crate::kernels::{pointwise, Number, Operand, PointwiseOp};

fn run(c: &Call<'_>, op: PointwiseOp, operands: [Option<Operand<'_>>; 3], s: Number) -> Result<()> {
    let out = c.output(0)?;
    pointwise(&c.launch(), op, operands, s, &out)
}

/// The `approximate` argument of GELU at `i`, when given: whether it is "tanh".
fn approximate_tanh(c: &Call<'_>, n: usize, i: usize) -> Result<bool> {
    if n <= i {
        return Ok(false);
    }
    match c.string(i)? {
        "none" => Ok(false),
        "tanh" => Ok(true),
        other => Err(Error::invalid(format!(
            "opencl: {}: approximate must be 'none' or 'tanh', not {other:?}",
            c.op()
        ))),
    }
}

/// `threshold_backward(Tensor grad_output, Tensor self, Scalar threshold)`.
pub(in crate::abi) fn threshold_backward(c: &Call<'_>) -> Result<()> {
    c.expect(3, 1)?;
    run(c, PointwiseOp::ThresholdBackward, [Some(c.operand(0)?), Some(c.operand(1)?), None], c.number(2)?)
}

/// `gelu(Tensor self, *, str approximate="none")`.
pub(in crate::abi) fn gelu(c: &Call<'_>) -> Result<()> {
    let n = c.expect_range(1, 2, 1)?;
    let op = if approximate_tanh(c, n, 1)? { PointwiseOp::GeluTanh } else { PointwiseOp::GeluNone };
    run(c, op, [Some(c.operand(0)?), None, None], Number::Int(0))
}

/// `gelu_backward(Tensor grad_output, Tensor self, *, str approximate="none")`.
pub(in crate::abi) fn gelu_backward(c: &Call<'_>) -> Result<()> {
    let n = c.expect_range(2, 3, 1)?;
    let op = if approximate_tanh(c, n, 2)? {
        PointwiseOp::GeluBackwardTanh
    } else {
        PointwiseOp::GeluBackwardNone
    };
    run(c, op, [Some(c.operand(0)?), Some(c.operand(1)?), None], Number::Int(0))
}

fn addc(c: &Call<'_>, op: PointwiseOp) -> Result<()> {
    let n = c.expect_range(3, 4, 1)?;
    let value = if n == 4 { c.number(3)? } else { Number::Int(1) };
    run(c, op, [Some(c.operand(0)?), Some(c.operand(1)?), Some(c.operand(2)?)], value)
}

/// `addcmul(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1)`.
pub(in crate::abi) fn addcmul(c: &Call<'_>) -> Result<()> {
    addc(c, PointwiseOp::AddCMul)
}

/// `addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1)`.
pub(in crate::abi) fn addcdiv(c: &Call<'_>) -> Result<()> {
    addc(c, PointwiseOp::AddCDiv)
}

/// `lerp.Scalar(Tensor self, Tensor end, Scalar weight)` and
/// `lerp.Tensor(Tensor self, Tensor end, Tensor weight)`.
pub(in crate::abi) fn lerp(c: &Call<'_>) -> Result<()> {
    c.expect(3, 1)?;
    let weight = if c.is_tensor(2)? { c.operand(2)? } else { Operand::Host(c.number(2)?) };
    run(c, PointwiseOp::Lerp, [Some(c.operand(0)?), Some(c.operand(1)?), Some(weight)], Number::Int(0))
}

/// `masked_fill_.Scalar(Tensor(a!) self, Tensor mask, Scalar value)` and
/// `masked_fill_.Tensor(Tensor(a!) self, Tensor mask, Tensor value)` (a
/// 0-dim value).
pub(in crate::abi) fn masked_fill(c: &Call<'_>) -> Result<()> {
    c.expect(3, 1)?;
    let mask = c.tensor(1)?;
    if mask.elem != crate::kernels::Elem::Bool {
        return Err(Error::invalid(format!("opencl: {}: masked_fill_ only supports boolean masks", c.op())));
    }
    let value = if c.is_tensor(2)? { c.operand(2)? } else { Operand::Host(c.number(2)?) };
    if let Operand::Device(v) = value {
        if !v.shape.is_empty() {
            return Err(Error::invalid(format!(
                "opencl: {}: masked_fill_ only supports a 0-dimensional value tensor, but got tensor with {} \
                 dimension(s).",
                c.op(),
                v.shape.len()
            )));
        }
    }
    run(
        c,
        PointwiseOp::MaskedFill,
        [Some(c.operand(0)?), Some(Operand::Device(mask)), Some(value)],
        Number::Int(0),
    )
}

/// `where.self(Tensor condition, Tensor self, Tensor other)`.
pub(in crate::abi) fn where_self(c: &Call<'_>) -> Result<()> {
    c.expect(3, 1)?;
    run(
        c,
        PointwiseOp::Where,
        [Some(c.operand(0)?), Some(c.operand(1)?), Some(c.operand(2)?)],
        Number::Int(0),
    )
}

/// `bitwise_not(Tensor self)`.
pub(in crate::abi) fn bitwise_not(c: &Call<'_>) -> Result<()> {
    c.expect(1, 1)?;
    run(c, PointwiseOp::BitwiseNot, [Some(c.operand(0)?), None, None], Number::Int(0))
}

/// `pow.Tensor_Scalar(Tensor self, Scalar exponent)`: floating outputs.
pub(in crate::abi) fn pow_tensor_scalar(c: &Call<'_>) -> Result<()> {
    c.expect(2, 1)?;
    run(c, PointwiseOp::PowScalar, [Some(c.operand(0)?), None, None], c.number(1)?)
}

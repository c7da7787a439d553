//! Pointwise operators vision models dispatch: `hardswish` and
//! `hardsigmoid` (MobileNet-v3) with their backwards, `log_sigmoid` (the
//! binary cross-entropy of detection heads) with its backward, and the
//! rounding and logarithm functions of box and anchor arithmetic (`floor`,
//! `ceil`, `log2`).
//!
//! Float functions run over the elementwise engine through the
//! [`UnaryFn`]/[`BinaryFn`] scaffolding of [`super::pointwise`]: `f64` for
//! double outputs, `f32` for float and the half types (rounded back when
//! stored, as PyTorch's CPU kernels compute them in float). The formulas
//! and their branch conditions are PyTorch's CPU ones, so results agree to
//! the last bit wherever the arithmetic is the same. `floor` and `ceil` of
//! integer tensors return the values unchanged, as PyTorch does.

use super::elementwise::{map1, Input};
use super::pointwise::{float_binary, float_unary, BinaryFn, UnaryFn};
use super::real::Real;
use super::view::TensorView;
use super::{Args, Frame, KernelCtx, Operand};
use crate::dtype::{with_storage, DType};
use crate::error::Result;
use crate::runtime::Work;

#[derive(Debug, Clone, Copy)]
struct Hardswish;

impl UnaryFn for Hardswish {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        let (zero, three, six) = (T::of(0.0), T::of(3.0), T::of(6.0));
        let r = x + three;
        // NaN propagates: both comparisons are false.
        let r = if r < zero { zero } else { r };
        let r = if r > six { six } else { r };
        x * r / six
    }
}

/// `hardswish(Tensor self) -> Tensor` (and `hardswish_`, `hardswish.out`):
/// `x * relu6(x + 3) / 6`.
pub(crate) fn hardswish(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    float_unary(ctx, call, &args, Hardswish)
}

#[derive(Debug, Clone, Copy)]
struct HardswishBackward;

impl BinaryFn for HardswishBackward {
    #[inline(always)]
    fn apply<T: Real>(self, g: T, x: T) -> T {
        let three = T::of(3.0);
        if x < -three {
            T::of(0.0)
        } else if x <= three {
            g * (x / three + T::of(0.5))
        } else {
            g
        }
    }
}

/// `hardswish_backward(Tensor grad_output, Tensor self) -> Tensor`: 0
/// below -3, `grad * (x / 3 + 1/2)` up to 3, `grad` above.
pub(crate) fn hardswish_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    float_binary(ctx, call, &args, ["grad_output", "self"], HardswishBackward)
}

#[derive(Debug, Clone, Copy)]
struct Hardsigmoid;

impl UnaryFn for Hardsigmoid {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        let (zero, six) = (T::of(0.0), T::of(6.0));
        let r = x + T::of(3.0);
        let r = if r < zero { zero } else { r };
        let r = if r > six { six } else { r };
        r / six
    }
}

/// `hardsigmoid(Tensor self) -> Tensor` (and `hardsigmoid_`,
/// `hardsigmoid.out`): `relu6(x + 3) / 6`.
pub(crate) fn hardsigmoid(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    float_unary(ctx, call, &args, Hardsigmoid)
}

#[derive(Debug, Clone, Copy)]
struct HardsigmoidBackward;

impl BinaryFn for HardsigmoidBackward {
    #[inline(always)]
    fn apply<T: Real>(self, g: T, x: T) -> T {
        let three = T::of(3.0);
        if x > -three && x < three {
            g * T::of(1.0 / 6.0)
        } else {
            T::of(0.0)
        }
    }
}

/// `hardsigmoid_backward(Tensor grad_output, Tensor self) -> Tensor` (and
/// `.grad_input`): `grad / 6` strictly inside (-3, 3), else 0.
pub(crate) fn hardsigmoid_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    float_binary(ctx, call, &args, ["grad_output", "self"], HardsigmoidBackward)
}

#[derive(Debug, Clone, Copy)]
struct LogSigmoid;

impl UnaryFn for LogSigmoid {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        // min(x, 0) - log1p(exp(-|x|)): no overflow for large |x|.
        let zero = T::of(0.0);
        let min = if x < zero { x } else { zero };
        let z = (-x.abs()).exp();
        min - T::of(z.wide().ln_1p())
    }
}

#[derive(Debug, Clone, Copy)]
struct ExpNegAbs;

impl UnaryFn for ExpNegAbs {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        (-x.abs()).exp()
    }
}

/// The float map `out = u(x)` over one validated input and output of the
/// same shape.
fn float_map<U: UnaryFn>(ctx: &KernelCtx<'_>, x: &TensorView, out: TensorView, u: U) -> Result<Work> {
    if !out.dtype().is_floating() {
        return Err(ctx.unimplemented(format!("{} outputs are not supported", out.dtype())));
    }
    if out.shape() != x.shape() {
        return Err(ctx.invalid(format!(
            "output shape {:?} does not match input shape {:?}",
            out.shape(),
            x.shape()
        )));
    }
    ctx.check_overlap(&out, &Operand::View(x.clone()))?;
    Ok(if out.dtype() == DType::Float64 {
        map1::<f64, f64, _>(out, Input::View(x.clone()), move |v| u.apply(v))
    } else {
        map1::<f32, f32, _>(out, Input::View(x.clone()), move |v| u.apply(v))
    })
}

/// `log_sigmoid_forward(Tensor self) -> (Tensor output, Tensor buffer)`:
/// `output = min(x, 0) - log1p(exp(-|x|))`; `buffer = exp(-|x|)`, as
/// PyTorch's CPU kernel keeps it (CUDA's buffer is empty; the backward
/// below recomputes it and never reads it).
pub(crate) fn log_sigmoid_forward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    let x = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let out = ctx.output(call, 0)?;
    let buffer = ctx.output(call, 1)?;
    let main = float_map(ctx, &x, out, LogSigmoid)?;
    if buffer.numel() == 0 {
        return Ok(Some(main));
    }
    let side = float_map(ctx, &x, buffer, ExpNegAbs)?;
    Ok(Some(Work::new(move || {
        main.run()?;
        side.run()
    })))
}

#[derive(Debug, Clone, Copy)]
struct LogSigmoidBackward;

impl BinaryFn for LogSigmoidBackward {
    #[inline(always)]
    fn apply<T: Real>(self, g: T, x: T) -> T {
        let zero = T::of(0.0);
        let one = T::of(1.0);
        let z = (-x.abs()).exp();
        let (max_deriv, sign) = if x < zero { (one, one) } else { (zero, -one) };
        (max_deriv - sign * (z / (one + z))) * g
    }
}

/// `log_sigmoid_backward(Tensor grad_output, Tensor self, Tensor buffer) ->
/// Tensor` (and `.grad_input`): `grad * sigmoid(-x)`, in PyTorch's form.
pub(crate) fn log_sigmoid_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 3)?;
    let _buffer = ctx.operand(args.tensor(2, "buffer")?, "buffer")?;
    float_binary(ctx, call, &args, ["grad_output", "self"], LogSigmoidBackward)
}

#[derive(Debug, Clone, Copy)]
struct Log2;

impl UnaryFn for Log2 {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        T::of(x.wide().log2())
    }
}

/// `log2(Tensor self) -> Tensor` (and `log2_`, `log2.out`).
pub(crate) fn log2(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    float_unary(ctx, call, &args, Log2)
}

#[derive(Debug, Clone, Copy)]
struct Floor;

impl UnaryFn for Floor {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        T::of(x.wide().floor())
    }
}

#[derive(Debug, Clone, Copy)]
struct Ceil;

impl UnaryFn for Ceil {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        T::of(x.wide().ceil())
    }
}

/// `floor`/`ceil` of an integer (or bool) tensor: the values themselves.
fn integral_identity(ctx: &KernelCtx<'_>, call: &Frame<'_>, args: &Args<'_>) -> Result<Option<Work>> {
    let x = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let out = ctx.output(call, 0)?;
    if x.dtype() != out.dtype() || x.shape() != out.shape() {
        return Err(ctx.invalid(format!(
            "expected an output of dtype {} and shape {:?}, got {} {:?}",
            x.dtype(),
            x.shape(),
            out.dtype(),
            out.shape()
        )));
    }
    ctx.check_overlap(&out, &Operand::View(x.clone()))?;
    Ok(Some(with_storage!(out.dtype(), T => map1::<T, T, _>(out, Input::View(x), |v| v))))
}

/// `floor(Tensor self) -> Tensor` (and `floor_`, `floor.out`).
pub(crate) fn floor(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    match call.outputs.first().map(|o| o.dtype) {
        Some(d) if !d.is_floating() => integral_identity(ctx, call, &args),
        _ => float_unary(ctx, call, &args, Floor),
    }
}

/// `ceil(Tensor self) -> Tensor` (and `ceil_`, `ceil.out`).
pub(crate) fn ceil(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    match call.outputs.first().map(|o| o.dtype) {
        Some(d) if !d.is_floating() => integral_identity(ctx, call, &args),
        _ => float_unary(ctx, call, &args, Ceil),
    }
}

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
use super::elementwise::{fill, map1, map2, map3, Input};
use super::view::broadcast_shapes;
use super::view::TensorView;
use super::{ArgRef, Args, Frame, KernelCtx, Operand, Scalar};
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

// ============================================================================
// Math for optimizers and activations: float unary functions, min/max,
// clamp, pow, logical and classification ops, addcmul/addcdiv/lerp, where.
//
// Float-only functions compute in `f64` for double outputs and in `f32`
// otherwise (half types round back when stored, as PyTorch CPU does); an
// integral or bool output is reported as unimplemented (the host falls back
// to the CPU). Functions that make sense for integers (abs, sign, min/max,
// clamp, addcmul, where) compute in the output's arithmetic type.
// ============================================================================

/// A real compute type (`f32` or `f64`) with the functions the math
/// kernels need, so each kernel is written once, generically.
pub(crate) trait Real:
    Float
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
{
    /// A constant.
    fn c(v: f64) -> Self;
    fn sqrt(self) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn tanh(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn erf(self) -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! real_common {
    ($t:ty) => {
        #[inline(always)]
        fn c(v: f64) -> Self {
            v as $t
        }
        #[inline(always)]
        fn sqrt(self) -> Self {
            <$t>::sqrt(self)
        }
        #[inline(always)]
        fn ln(self) -> Self {
            <$t>::ln(self)
        }
        #[inline(always)]
        fn abs(self) -> Self {
            <$t>::abs(self)
        }
        #[inline(always)]
        fn powf(self, e: Self) -> Self {
            <$t>::powf(self, e)
        }
        #[inline(always)]
        fn is_nan(self) -> bool {
            <$t>::is_nan(self)
        }
    };
}

impl Real for f32 {
    real_common!(f32);
    #[inline(always)]
    fn exp(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn erf(self) -> Self {
        erf_f32(self)
    }
    #[inline(always)]
    fn tanh(self) -> Self {
        tanh_f32(self)
    }
}

impl Real for f64 {
    real_common!(f64);
    #[inline(always)]
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline(always)]
    fn erf(self) -> Self {
        erf64(self)
    }
    #[inline(always)]
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
}

/// `exp` for `f32` in straight-line arithmetic that LLVM vectorises (the
/// libm call does not): Cephes' `expf` polynomial after reducing by
/// `n = round(x / ln 2)`, with the rounding done by the `1.5 * 2^23`
/// trick and `2^n` applied as two normal powers of two built from exponent
/// bits (so results near overflow and in the subnormal range come out
/// right), without any SSE4 instruction. About 1 ulp; `exp(-inf) = 0`,
/// `exp(inf) = inf`, NaN propagates.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let xc = x.clamp(-104.0, 89.0);
    let t = xc * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * z + r + 1.0;
    // n lies in [-150, 129]; 2^n = 2^n1 * 2^n2 with both halves normal.
    let ni = t.to_bits().wrapping_sub(MAGIC.to_bits()) as i32;
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let p1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let p2 = f32::from_bits(((n2 + 127) as u32) << 23);
    let v = y * p1 * p2;
    if x < -104.0 {
        0.0
    } else {
        v
    }
}

/// `tanh` for `f32` in vectorisable arithmetic: an odd Taylor polynomial
/// below `|x| = 0.125` (where `1 - 2 / (e^2x + 1)` would cancel), else
/// that formula with [`exp_f32`]; within a few ulp.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let x2 = x * x;
    let small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))));
    let big = (1.0 - 2.0 / (exp_f32(2.0 * a) + 1.0)).copysign(x);
    if a < 0.125 {
        small
    } else {
        big
    }
}

/// `erf` for `f32`: Abramowitz and Stegun 7.1.26 (absolute error below
/// 1.5e-7), the approximation PyTorch's vectorised CPU kernels use.
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly =
        ((((1.061_405_4 * t - 1.453_152_1) * t + 1.421_413_8) * t - 0.284_496_72) * t + 0.254_829_6) * t;
    let r = 1.0 - poly * exp_f32(-a * a);
    r.copysign(x)
}

/// The error function to double precision. For `|x| < 6` it sums the
/// series `erf(x) = 2/sqrt(pi) * exp(-x^2) * sum_n 2^n x^(2n+1) / (2n+1)!!`,
/// whose terms are all positive (no cancellation); beyond, `erf` is `+-1`
/// in double precision.
pub(crate) fn erf64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a >= 6.0 {
        return 1f64.copysign(x);
    }
    let two_x2 = 2.0 * a * a;
    let (mut term, mut sum) = (a, a);
    let mut k = 1.0;
    while term > sum * 1e-17 {
        term *= two_x2 / (2.0 * k + 1.0);
        sum += term;
        k += 1.0;
    }
    let r = sum * (-a * a).exp() * std::f64::consts::FRAC_2_SQRT_PI;
    r.min(1.0).copysign(x)
}

/// A float function of one value (a unit struct or a few parameters).
pub(crate) trait UnaryFn: Copy + Send + Sync + 'static {
    fn apply<T: Real>(self, x: T) -> T;
}

/// A float function of two values (typically `grad` and an input).
pub(crate) trait BinaryFn: Copy + Send + Sync + 'static {
    fn apply<T: Real>(self, x: T, y: T) -> T;
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

fn unary_work<C: Real, U: UnaryFn>(
    ctx: &KernelCtx<'_>,
    out: TensorView,
    a: Other,
    u: U,
) -> Result<Option<Work>> {
    let dtype = out.dtype();
    let ia = input::<C>(ctx, a, &out, dtype)?;
    Ok(Some(map1::<C, C, _>(out, ia, move |x| u.apply(x))))
}

/// A float unary op: `self` is argument 0, the result `outputs[0]`
/// (functional, in-place and out= forms alike).
pub(crate) fn float_unary<U: UnaryFn>(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    args: &Args<'_>,
    u: U,
) -> Result<Option<Work>> {
    let a = tensor_operand(ctx, args, 0, "self")?;
    let out = ctx.output(call, 0)?;
    real_dtype(ctx, out.dtype())?;
    check_shapes(ctx, &out, &[&a])?;
    if out.dtype() == DType::Float64 {
        unary_work::<f64, U>(ctx, out, a, u)
    } else {
        unary_work::<f32, U>(ctx, out, a, u)
    }
}

fn binary_work<C: Real, B: BinaryFn>(
    ctx: &KernelCtx<'_>,
    out: TensorView,
    a: Other,
    b: Other,
    f: B,
) -> Result<Option<Work>> {
    let dtype = out.dtype();
    let ia = input::<C>(ctx, a, &out, dtype)?;
    let ib = input::<C>(ctx, b, &out, dtype)?;
    Ok(Some(map2::<C, C, _>(out, ia, ib, move |x, y| f.apply(x, y))))
}

/// A float binary op over tensor arguments 0 and 1 (a Scalar is accepted
/// as argument 1), the result `outputs[0]`.
pub(crate) fn float_binary<B: BinaryFn>(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    args: &Args<'_>,
    names: [&str; 2],
    f: B,
) -> Result<Option<Work>> {
    let a = tensor_operand(ctx, args, 0, names[0])?;
    let b = match call.args.get(1) {
        Some(ArgRef::Tensor(t)) => Other::Tensor(ctx.operand(t, names[1])?),
        _ => Other::Scalar(args.scalar(1, names[1], None)?),
    };
    let out = ctx.output(call, 0)?;
    real_dtype(ctx, out.dtype())?;
    check_shapes(ctx, &out, &[&a, &b])?;
    if out.dtype() == DType::Float64 {
        binary_work::<f64, B>(ctx, out, a, b, f)
    } else {
        binary_work::<f32, B>(ctx, out, a, b, f)
    }
}

macro_rules! unary_fns {
    ($($(#[$doc:meta])* $name:ident / $kernel:ident: |$x:ident| $body:expr;)*) => {$(
        #[derive(Debug, Clone, Copy)]
        struct $name;
        impl UnaryFn for $name {
            #[inline(always)]
            fn apply<T: Real>(self, $x: T) -> T {
                $body
            }
        }
        $(#[$doc])*
        pub(crate) fn $kernel(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
            let args = Args::new(ctx, call, 1, 1)?;
            float_unary(ctx, call, &args, $name)
        }
    )*};
}

unary_fns! {
    /// `sqrt(Tensor self) -> Tensor` (and `sqrt_`, `sqrt.out`).
    SqrtFn / sqrt: |x| x.sqrt();
    /// `rsqrt(Tensor self) -> Tensor` (and `rsqrt_`, `rsqrt.out`).
    RsqrtFn / rsqrt: |x| T::c(1.0) / x.sqrt();
    /// `exp(Tensor self) -> Tensor` (and `exp_`, `exp.out`).
    ExpFn / exp: |x| x.exp();
    /// `log(Tensor self) -> Tensor` (and `log_`, `log.out`).
    LogFn / log: |x| x.ln();
    /// `reciprocal(Tensor self) -> Tensor` (and `reciprocal_`, `reciprocal.out`).
    ReciprocalFn / reciprocal: |x| T::c(1.0) / x;
    /// `sigmoid(Tensor self) -> Tensor` (and `sigmoid_`, `sigmoid.out`).
    SigmoidFn / sigmoid: |x| T::c(1.0) / (T::c(1.0) + (-x).exp());
    /// `tanh(Tensor self) -> Tensor` (and `tanh_`, `tanh.out`).
    TanhFn / tanh: |x| x.tanh();
}

/// `pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor` (and the
/// in-place and out= forms); floating outputs only. The common exponents
/// take exact shortcuts, as PyTorch's CPU kernel does.
pub(crate) fn pow_tensor_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    #[derive(Debug, Clone, Copy)]
    struct Pow(f64);
    impl UnaryFn for Pow {
        #[inline(always)]
        fn apply<T: Real>(self, x: T) -> T {
            match self.0 {
                0.5 => x.sqrt(),
                -0.5 => T::c(1.0) / x.sqrt(),
                1.0 => x,
                2.0 => x * x,
                3.0 => x * x * x,
                -1.0 => T::c(1.0) / x,
                -2.0 => T::c(1.0) / (x * x),
                e => x.powf(T::c(e)),
            }
        }
    }
    let args = Args::new(ctx, call, 2, 2)?;
    let e = args.scalar(1, "exponent", None)?;
    float_unary(ctx, call, &args, Pow(e.as_f64()))
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
    if w.abs() < C::c(0.5) {
        x + w * d
    } else {
        e - d * (C::c(1.0) - w)
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
            let wc = C::c(s.as_f64());
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

#[cfg(test)]
mod math_tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate() {
        let mut x = -90.0f32;
        while x < 89.0 {
            let (got, want) = (exp_f32(x), f64::from(x).exp());
            if want < f64::from(f32::MIN_POSITIVE) {
                assert!((f64::from(got) - want).abs() <= 2e-45, "exp({x}) = {got}");
            } else if want > f64::from(f32::MAX) {
                assert!(got.is_infinite(), "exp({x}) = {got}");
            } else {
                assert!(((f64::from(got) - want) / want).abs() < 3e-7, "exp({x}) = {got}, want {want}");
            }
            x += 0.0137;
        }
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
    }

    #[test]
    fn erf_approximations() {
        let mut x = -7.0f64;
        while x < 7.0 {
            // Reference: the series for small |x|, the asymptotic
            // continued fraction is not needed at this tolerance.
            let e = erf64(x);
            assert!(e.abs() <= 1.0);
            assert!((f64::from(erf_f32(x as f32)) - e).abs() < 5e-7, "erf_f32({x})");
            x += 0.013;
        }
        for (x, want) in
            [(0.5, 0.520_499_877_813_046_5), (1.0, 0.842_700_792_949_714_9), (2.0, 0.995_322_265_018_952_7)]
        {
            assert!((erf64(x) - want).abs() < 1e-15, "erf64({x})");
            assert!((erf64(-x) + want).abs() < 1e-15);
        }
        assert!(erf64(f64::NAN).is_nan());
        let mut x = -12.0f32;
        while x < 12.0 {
            let want = f64::from(x).tanh();
            assert!((f64::from(tanh_f32(x)) - want).abs() <= 1e-6 * want.abs().max(1e-30), "tanh({x})");
            x += 0.0071;
        }
        assert!(tanh_f32(f32::NAN).is_nan());
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(erf64(10.0), 1.0);
    }
}

// ------------------------------------------------ masked_fill, bitwise, nan

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

/// `nan_to_num.out(Tensor self, float? nan=None, float? posinf=None,
/// float? neginf=None, *, Tensor(a!) out)`: NaN to `nan` (0), infinities
/// to `posinf`/`neginf` (the dtype's largest/lowest finite values);
/// integral tensors are copied.
pub(crate) fn nan_to_num_out(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 4)?;
    let a = tensor_operand(ctx, &args, 0, "self")?;
    let opt = |i: usize, name: &str| -> Result<Option<f64>> {
        match call.args.get(i) {
            None | Some(ArgRef::None) => Ok(None),
            Some(ArgRef::Float(v)) => Ok(Some(*v)),
            Some(ArgRef::Int(v)) => Ok(Some(*v as f64)),
            _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a float or None"))),
        }
    };
    let nan = opt(1, "nan")?.unwrap_or(0.0);
    let out = ctx.output(call, 0)?;
    check_shapes(ctx, &out, &[&a])?;
    let dtype = out.dtype();
    let (lo, hi) = match dtype {
        DType::Float16 => (f64::from(half::f16::MIN), f64::from(half::f16::MAX)),
        DType::BFloat16 => (f64::from(half::bf16::MIN), f64::from(half::bf16::MAX)),
        DType::Float32 => (f64::from(f32::MIN), f64::from(f32::MAX)),
        _ => (f64::MIN, f64::MAX),
    };
    let posinf = opt(2, "posinf")?.unwrap_or(hi);
    let neginf = opt(3, "neginf")?.unwrap_or(lo);
    if !dtype.is_floating() {
        return with_storage!(dtype, T => {
            let ia = input::<T>(ctx, a, &out, dtype)?;
            Ok(Some(map1::<T, T, _>(out, ia, |x| x)))
        });
    }
    let f = move |x: f64| {
        if x.is_nan() {
            nan
        } else if x == f64::INFINITY {
            posinf
        } else if x == f64::NEG_INFINITY {
            neginf
        } else {
            x
        }
    };
    if dtype == DType::Float64 {
        let ia = input::<f64>(ctx, a, &out, dtype)?;
        Ok(Some(map1::<f64, f64, _>(out, ia, f)))
    } else {
        let ia = input::<f32>(ctx, a, &out, dtype)?;
        Ok(Some(map1::<f32, f32, _>(out, ia, move |x| f(f64::from(x)) as f32)))
    }
}

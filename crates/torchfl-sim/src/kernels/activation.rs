//! Activation functions and their backward formulas: `gelu` (exact and
//! tanh approximation), `silu`, `sigmoid`/`tanh` backward, `hardtanh` and
//! `leaky_relu`, each with its backward.
//!
//! They are pointwise, so each is a small [`UnaryFn`]/[`BinaryFn`] run by
//! the float helpers of [`super::pointwise`] over the elementwise engine:
//! `f64` for double outputs, `f32` for float and the half types (rounded
//! back when stored, as PyTorch's CPU kernels do); integral outputs are
//! reported as unimplemented and fall back to the CPU.

use super::pointwise::{float_binary, float_unary, BinaryFn, UnaryFn};
use super::real::Real;
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::error::Result;
use crate::runtime::Work;

/// `sqrt(2 / pi)`.
const K_BETA: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh approximation.
const K_KAPPA: f64 = 0.044_715;

/// Reads the `approximate` string argument at `i` (default `"none"`):
/// `true` for `"tanh"`.
fn approximate(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize) -> Result<bool> {
    match call.args.get(i) {
        None | Some(ArgRef::None) => Ok(false),
        Some(ArgRef::Str(s)) if s == "none" => Ok(false),
        Some(ArgRef::Str(s)) if s == "tanh" => Ok(true),
        Some(ArgRef::Str(s)) => {
            Err(ctx.invalid(format!("approximate argument must be either none or tanh, got {s}")))
        }
        Some(_) => Err(ctx.invalid(format!("argument {i} (approximate) must be a string"))),
    }
}

/// Exact gelu, `x * Phi(x)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GeluErf;

impl UnaryFn for GeluErf {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        x * T::of(0.5) * (T::of(1.0) + (x * T::of(std::f64::consts::FRAC_1_SQRT_2)).erf())
    }
}

/// The tanh approximation of gelu.
#[derive(Debug, Clone, Copy)]
struct GeluTanh;

impl UnaryFn for GeluTanh {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        let inner = T::of(K_BETA) * (x + T::of(K_KAPPA) * x * x * x);
        T::of(0.5) * x * (T::of(1.0) + inner.tanh())
    }
}

/// Backward of the exact gelu: `grad * (Phi(x) + x * phi(x))`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GeluErfBackward;

impl BinaryFn for GeluErfBackward {
    #[inline(always)]
    fn apply<T: Real>(self, g: T, x: T) -> T {
        let half = T::of(0.5);
        // 1 / sqrt(2 pi)
        let k_alpha = T::of(0.398_942_280_401_432_7);
        let cdf = half * (T::of(1.0) + (x * T::of(std::f64::consts::FRAC_1_SQRT_2)).erf());
        let pdf = k_alpha * (-half * x * x).exp();
        g * (cdf + x * pdf)
    }
}

/// Backward of the tanh approximation (PyTorch's formula).
#[derive(Debug, Clone, Copy)]
struct GeluTanhBackward;

impl BinaryFn for GeluTanhBackward {
    #[inline(always)]
    fn apply<T: Real>(self, g: T, x: T) -> T {
        let half = T::of(0.5);
        let one = T::of(1.0);
        let x_sq = x * x;
        let inner = T::of(K_BETA) * (x + T::of(K_KAPPA) * x_sq * x);
        let t = inner.tanh();
        let left = half * x;
        let right = one + t;
        let left_derivative = half * right;
        let right_derivative = left * (one - t * t) * T::of(K_BETA) * (one + T::of(3.0 * K_KAPPA) * x_sq);
        g * (left_derivative + right_derivative)
    }
}

/// `gelu(Tensor self, *, str approximate="none") -> Tensor` (and `gelu_`,
/// `gelu.out`): `x * Phi(x)`, or the tanh approximation.
pub(crate) fn gelu(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 2)?;
    let tanh = approximate(ctx, call, 1)?;
    if tanh {
        float_unary(ctx, call, &args, GeluTanh)
    } else {
        float_unary(ctx, call, &args, GeluErf)
    }
}

/// `gelu_backward(Tensor grad_output, Tensor self, *, str
/// approximate="none") -> Tensor` (and `gelu_backward.grad_input`).
pub(crate) fn gelu_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 3)?;
    let tanh = approximate(ctx, call, 2)?;
    if tanh {
        float_binary(ctx, call, &args, ["grad_output", "self"], GeluTanhBackward)
    } else {
        float_binary(ctx, call, &args, ["grad_output", "self"], GeluErfBackward)
    }
}

#[derive(Debug, Clone, Copy)]
struct Silu;

impl UnaryFn for Silu {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        x / (T::of(1.0) + (-x).exp())
    }
}

/// `silu(Tensor self) -> Tensor` (and `silu_`, `silu.out`):
/// `x * sigmoid(x)`. (`silu_backward` is composite in PyTorch.)
pub(crate) fn silu(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    float_unary(ctx, call, &args, Silu)
}

#[derive(Debug, Clone, Copy)]
struct SigmoidBackward;

impl BinaryFn for SigmoidBackward {
    #[inline(always)]
    fn apply<T: Real>(self, g: T, y: T) -> T {
        g * (T::of(1.0) - y) * y
    }
}

/// `sigmoid_backward(Tensor grad_output, Tensor output) -> Tensor` (and
/// `sigmoid_backward.grad_input`): `grad * (1 - y) * y`.
pub(crate) fn sigmoid_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    float_binary(ctx, call, &args, ["grad_output", "output"], SigmoidBackward)
}

#[derive(Debug, Clone, Copy)]
struct TanhBackward;

impl BinaryFn for TanhBackward {
    #[inline(always)]
    fn apply<T: Real>(self, g: T, y: T) -> T {
        g * (T::of(1.0) - y * y)
    }
}

/// `tanh_backward(Tensor grad_output, Tensor output) -> Tensor` (and
/// `tanh_backward.grad_input`): `grad * (1 - y^2)`.
pub(crate) fn tanh_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    float_binary(ctx, call, &args, ["grad_output", "output"], TanhBackward)
}

#[derive(Debug, Clone, Copy)]
struct Hardtanh {
    lo: f64,
    hi: f64,
}

impl UnaryFn for Hardtanh {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        let (lo, hi) = (T::of(self.lo), T::of(self.hi));
        // NaN propagates (both comparisons are false).
        if x < lo {
            lo
        } else if x > hi {
            hi
        } else {
            x
        }
    }
}

/// `hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor`
/// and `hardtanh_`: clamps to `[min_val, max_val]`.
pub(crate) fn hardtanh(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 3)?;
    let lo = args.scalar(1, "min_val", Some(super::Scalar::Int(-1)))?.as_f64();
    let hi = args.scalar(2, "max_val", Some(super::Scalar::Int(1)))?.as_f64();
    float_unary(ctx, call, &args, Hardtanh { lo, hi })
}

#[derive(Debug, Clone, Copy)]
struct HardtanhBackward {
    lo: f64,
    hi: f64,
}

impl BinaryFn for HardtanhBackward {
    #[inline(always)]
    fn apply<T: Real>(self, g: T, x: T) -> T {
        if x <= T::of(self.lo) || x >= T::of(self.hi) {
            T::of(0.0)
        } else {
            g
        }
    }
}

/// `hardtanh_backward(Tensor grad_output, Tensor self, Scalar min_val,
/// Scalar max_val) -> Tensor` (and `.grad_input`): `grad` strictly inside
/// `(min_val, max_val)`, else 0.
pub(crate) fn hardtanh_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 4, 4)?;
    let lo = args.scalar(2, "min_val", None)?.as_f64();
    let hi = args.scalar(3, "max_val", None)?.as_f64();
    float_binary(ctx, call, &args, ["grad_output", "self"], HardtanhBackward { lo, hi })
}

#[derive(Debug, Clone, Copy)]
struct LeakyRelu {
    slope: f64,
}

impl UnaryFn for LeakyRelu {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        if x > T::of(0.0) {
            x
        } else {
            x * T::of(self.slope)
        }
    }
}

/// `leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor` (and
/// `leaky_relu_`, `leaky_relu.out`).
pub(crate) fn leaky_relu(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 2)?;
    let slope = args.scalar(1, "negative_slope", Some(super::Scalar::Float(0.01)))?.as_f64();
    float_unary(ctx, call, &args, LeakyRelu { slope })
}

#[derive(Debug, Clone, Copy)]
struct LeakyReluBackward {
    slope: f64,
}

impl BinaryFn for LeakyReluBackward {
    #[inline(always)]
    fn apply<T: Real>(self, g: T, x: T) -> T {
        if x > T::of(0.0) {
            g
        } else {
            g * T::of(self.slope)
        }
    }
}

/// `leaky_relu_backward(Tensor grad_output, Tensor self, Scalar
/// negative_slope, bool self_is_result) -> Tensor` (and `.grad_input`).
pub(crate) fn leaky_relu_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 4)?;
    let slope = args.scalar(2, "negative_slope", None)?.as_f64();
    let self_is_result = args.bool_or(3, "self_is_result", false)?;
    if self_is_result && slope < 0.0 {
        return Err(ctx.invalid(
            "In-place leakyReLu backward calculation is triggered with a negative slope which is not \
             supported. This is caused by calling in-place forward function with a negative slope, \
             please call out-of-place version instead.",
        ));
    }
    float_binary(ctx, call, &args, ["grad_output", "self"], LeakyReluBackward { slope })
}

#[derive(Debug, Clone, Copy)]
struct Softplus {
    beta: f64,
    threshold: f64,
}

impl UnaryFn for Softplus {
    #[inline(always)]
    fn apply<T: Real>(self, x: T) -> T {
        let (beta, threshold) = (T::of(self.beta), T::of(self.threshold));
        if x * beta > threshold {
            x
        } else {
            (T::of(1.0) + (x * beta).exp()).ln() / beta
        }
    }
}

/// `softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor`
/// (and `softplus.out`): `log(1 + exp(beta x)) / beta`, linear above the
/// threshold.
pub(crate) fn softplus(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 3)?;
    let beta = args.scalar(1, "beta", Some(super::Scalar::Int(1)))?.as_f64();
    let threshold = args.scalar(2, "threshold", Some(super::Scalar::Int(20)))?.as_f64();
    float_unary(ctx, call, &args, Softplus { beta, threshold })
}

#[derive(Debug, Clone, Copy)]
struct SoftplusBackward {
    beta: f64,
    threshold: f64,
}

impl BinaryFn for SoftplusBackward {
    #[inline(always)]
    fn apply<T: Real>(self, g: T, x: T) -> T {
        let (beta, threshold) = (T::of(self.beta), T::of(self.threshold));
        let z = (x * beta).exp();
        if x * beta > threshold {
            g
        } else {
            g * z / (z + T::of(1.0))
        }
    }
}

/// `softplus_backward(Tensor grad_output, Tensor self, Scalar beta, Scalar
/// threshold) -> Tensor` (and `.grad_input`).
pub(crate) fn softplus_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 4, 4)?;
    let beta = args.scalar(2, "beta", None)?.as_f64();
    let threshold = args.scalar(3, "threshold", None)?.as_f64();
    float_binary(ctx, call, &args, ["grad_output", "self"], SoftplusBackward { beta, threshold })
}

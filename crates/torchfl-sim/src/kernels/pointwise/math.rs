//! Float math: functions defined only for floating outputs (`sqrt`,
//! `exp`, `log`, `sigmoid`, `tanh`, `pow`, ...) and `nan_to_num`.
//!
//! They compute in `f64` for double outputs and in `f32` otherwise (half
//! types round back when stored, as PyTorch CPU does); an integral or bool
//! output is reported as unimplemented (the host falls back to the CPU).
//! Each function is a [`UnaryFn`] or [`BinaryFn`] written once over
//! [`Real`]; the activations and fused kernels reuse the same scaffolding.

use super::{check_shapes, input, real_dtype, tensor_operand, Other};
use crate::dtype::{with_storage, DType};
use crate::error::Result;
use crate::kernels::elementwise::{map1, map2};
use crate::kernels::real::Real;
use crate::kernels::view::TensorView;
use crate::kernels::{ArgRef, Args, Frame, KernelCtx};
use crate::runtime::Work;

/// A float function of one value (a unit struct or a few parameters).
pub(crate) trait UnaryFn: Copy + Send + Sync + 'static {
    fn apply<T: Real>(self, x: T) -> T;
}

/// A float function of two values (typically `grad` and an input).
pub(crate) trait BinaryFn: Copy + Send + Sync + 'static {
    fn apply<T: Real>(self, x: T, y: T) -> T;
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
    RsqrtFn / rsqrt: |x| T::of(1.0) / x.sqrt();
    /// `exp(Tensor self) -> Tensor` (and `exp_`, `exp.out`).
    ExpFn / exp: |x| x.exp();
    /// `log(Tensor self) -> Tensor` (and `log_`, `log.out`).
    LogFn / log: |x| x.ln();
    /// `reciprocal(Tensor self) -> Tensor` (and `reciprocal_`, `reciprocal.out`).
    ReciprocalFn / reciprocal: |x| T::of(1.0) / x;
    /// `sigmoid(Tensor self) -> Tensor` (and `sigmoid_`, `sigmoid.out`).
    SigmoidFn / sigmoid: |x| T::of(1.0) / (T::of(1.0) + (-x).exp());
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
                -0.5 => T::of(1.0) / x.sqrt(),
                1.0 => x,
                2.0 => x * x,
                3.0 => x * x * x,
                -1.0 => T::of(1.0) / x,
                -2.0 => T::of(1.0) / (x * x),
                e => x.powf(T::of(e)),
            }
        }
    }
    let args = Args::new(ctx, call, 2, 2)?;
    let e = args.scalar(1, "exponent", None)?;
    float_unary(ctx, call, &args, Pow(e.as_f64()))
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

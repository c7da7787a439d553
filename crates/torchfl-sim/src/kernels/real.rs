//! The floating compute types: `f32` (for `f32`, `f16` and `bf16`
//! tensors, rounded back on store as PyTorch's CPU kernels do) and `f64`,
//! behind one trait, [`Real`]: the crate's one [`Float`] trait (shared with
//! the collectives' reductions) plus the math only kernels need.
//!
//! Floating kernels are written once, generically over `Real`, and
//! instantiated for both types by [`with_real!`] or a `match` on the output
//! dtype. The trait is shared by every family (pointwise math, activations,
//! losses, GEMM-based kernels) so that there is one notion of "a real
//! number" and one place that decides how, say, `exp` is computed in `f32`:
//! here, in straight-line arithmetic LLVM vectorises, where the libm call
//! would not.

use crate::dtype::Float;

/// A real compute type (`f32` or `f64`) with the arithmetic, the math
/// functions and the GEMM the floating kernels need, so each kernel is
/// written once, generically.
pub(crate) trait Real:
    Float
    + Default
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::AddAssign
    + std::ops::MulAssign
    + std::ops::Neg<Output = Self>
{
    /// `v` rounded to this type (also how kernels write constants).
    fn of(v: f64) -> Self;
    /// Widened to `f64`.
    fn wide(self) -> f64;
    fn sqrt(self) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn tanh(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn erf(self) -> Self;
    /// matrixmultiply's `sgemm`/`dgemm`.
    ///
    /// # Safety
    /// matrixmultiply's contract: every element of A, B and C addressed
    /// through the given strides is valid, C for writes, and C does not
    /// overlap A or B.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

macro_rules! real {
    ($t:ty, gemm: $gemm:path, exp: $exp:path, tanh: $tanh:path, erf: $erf:path) => {
        impl Real for $t {
            #[inline(always)]
            fn of(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn wide(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $tanh(self)
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
            fn erf(self) -> Self {
                $erf(self)
            }
            unsafe fn gemm_raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                // SAFETY: forwarded caller contract.
                unsafe { $gemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
            }
        }
    };
}
real!(f32, gemm: matrixmultiply::sgemm, exp: exp_f32, tanh: tanh_f32, erf: erf_f32);
real!(f64, gemm: matrixmultiply::dgemm, exp: f64::exp, tanh: f64::tanh, erf: erf64);

/// Runs `$body` with `$C` bound to the [`Real`] compute type of a floating
/// `$dtype`; other dtypes return `$ctx.unimplemented`.
macro_rules! with_real {
    ($ctx:expr, $dtype:expr, $C:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::Float64 => {
                type $C = f64;
                $body
            }
            $crate::dtype::DType::Float32
            | $crate::dtype::DType::Float16
            | $crate::dtype::DType::BFloat16 => {
                type $C = f32;
                $body
            }
            other => Err($ctx.unimplemented(format!("dtype {other} is not supported"))),
        }
    };
}
pub(crate) use with_real;

/// `exp` for `f32` in straight-line arithmetic that LLVM vectorises (the
/// libm call does not): Cephes' `expf` polynomial after reducing by
/// `n = round(x / ln 2)`, with the rounding done by the `1.5 * 2^23`
/// trick and `2^n` applied as two normal powers of two built from exponent
/// bits (so results near overflow and in the subnormal range come out
/// right), without any SSE4 instruction. About 1 ulp; `exp(-inf) = 0`,
/// `exp(inf) = inf`, NaN propagates.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
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
fn tanh_f32(x: f32) -> f32 {
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
fn erf_f32(x: f32) -> f32 {
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
fn erf64(x: f64) -> f64 {
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

#[cfg(test)]
mod tests {
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

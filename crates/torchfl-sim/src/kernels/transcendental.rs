//! `sin`, `cos` (rotary position embeddings) and `pow` with a tensor
//! exponent (`pow.Scalar`: rotary frequencies `base ** (arange / dim)`;
//! `pow.Tensor_Tensor`: ALiBi slopes and the like).
//!
//! `sin`/`cos` of `float`, `half` and `bfloat16` outputs compute in `f64`
//! with a branch-free Cody-Waite reduction by pi/2 and fdlibm's minimax
//! polynomials, which LLVM vectorises; the result is rounded once, so it
//! is within one unit in the last place of PyTorch's (SLEEF) results. A
//! block holding an argument beyond `REDUCE_LIMIT`, where the two-part
//! reduction loses accuracy, takes the library functions instead; `double`
//! outputs always do. Blocks run in parallel.
//!
//! `pow` computes floating results in `f64` and rounds once; integer
//! results use exact square-and-multiply with wrapping, and PyTorch's rule
//! for negative exponents (`1`, `+-1` for a base of `-1`, else `0`).

use rayon::prelude::*;

use super::elementwise::{dense_input, map2, with_dense_output, Input, PAR_MIN};
use super::promotion::{result_type, Participant};
use super::view::TensorView;
use super::{ArgRef, Args, Frame, KernelCtx, Operand, Scalar};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::runtime::Work;

/// Elements per block: the unit of the fast/library choice.
const BLOCK: usize = 256;
/// Arguments up to this magnitude reduce accurately with two parts of pi/2.
const REDUCE_LIMIT: f64 = 1.0e5;

/// pi/2 split (fdlibm's `pio2_1`, `pio2_1t`): the first 33 bits, and the rest.
const PIO2_HI: f64 = f64::from_bits(0x3FF9_21FB_5440_0000);
const PIO2_LO: f64 = f64::from_bits(0x3DD0_B461_1A62_6331);
/// 1.5 * 2^52: adding and subtracting it rounds to the nearest integer.
const ROUNDER: f64 = 6_755_399_441_055_744.0;
/// fdlibm's `__kernel_sin` and `__kernel_cos` coefficients on [-pi/4, pi/4].
const S: [f64; 6] = [
    f64::from_bits(0xBFC5_5555_5555_5549),
    f64::from_bits(0x3F81_1111_1110_F8A6),
    f64::from_bits(0xBF2A_01A0_19C1_61D5),
    f64::from_bits(0x3EC7_1DE3_57B1_FE7D),
    f64::from_bits(0xBE5A_E5E6_8A2B_9CEB),
    f64::from_bits(0x3DE5_D93A_5ACF_D57C),
];
const C: [f64; 6] = [
    f64::from_bits(0x3FA5_5555_5555_554C),
    f64::from_bits(0xBF56_C16C_16C1_5177),
    f64::from_bits(0x3EFA_01A0_19CB_1590),
    f64::from_bits(0xBE92_7E4F_809C_52AD),
    f64::from_bits(0x3E21_EE9E_BDB4_B1C4),
    f64::from_bits(0xBDA8_FAE9_BE88_38D4),
];

/// `(sin x, cos x)` for `|x| <= REDUCE_LIMIT`, branch-free.
#[inline(always)]
fn sincos(x: f64) -> (f64, f64) {
    let k = (x * std::f64::consts::FRAC_2_PI + ROUNDER) - ROUNDER;
    let r = (x - k * PIO2_HI) - k * PIO2_LO;
    let z = r * r;
    let s = r + r * z * (S[0] + z * (S[1] + z * (S[2] + z * (S[3] + z * (S[4] + z * S[5])))));
    let c = 1.0 - 0.5 * z + z * z * (C[0] + z * (C[1] + z * (C[2] + z * (C[3] + z * (C[4] + z * C[5])))));
    let q = k as i64;
    let (a, b) = if q & 1 == 0 { (s, c) } else { (c, -s) };
    if q & 2 == 0 {
        (a, b)
    } else {
        (-a, -b)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trig {
    Sin,
    Cos,
}

#[inline(always)]
fn fast(which: Trig, x: f64) -> f64 {
    let (s, c) = sincos(x);
    if which == Trig::Sin {
        s
    } else {
        c
    }
}

#[inline(always)]
fn exact(which: Trig, x: f64) -> f64 {
    if which == Trig::Sin {
        x.sin()
    } else {
        x.cos()
    }
}

/// One block of `f32`-precision results.
fn trig_block(which: Trig, x: &[f32], y: &mut [f32]) {
    if x.iter().all(|v| f64::from(v.abs()) <= REDUCE_LIMIT) {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = fast(which, f64::from(v)) as f32;
        }
    } else {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = exact(which, f64::from(v)) as f32;
        }
    }
}

fn trig(ctx: &KernelCtx<'_>, call: &Frame<'_>, which: Trig) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let out = ctx.output(call, 0)?;
    if !out.dtype().is_floating() {
        return Err(ctx.unimplemented(format!("{} outputs are not supported", out.dtype())));
    }
    if out.shape() != input.shape() {
        return Err(ctx.invalid(format!("out has shape {:?}, expected {:?}", out.shape(), input.shape())));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        if out.dtype() == DType::Float64 {
            let x = dense_input::<f64>(&input, &out);
            with_dense_output::<f64>(&out, |y| {
                let f = |(o, v): (&mut f64, &f64)| *o = exact(which, *v);
                if y.len() >= PAR_MIN {
                    y.par_iter_mut().zip(x.par_iter()).for_each(f);
                } else {
                    y.iter_mut().zip(x.iter()).for_each(f);
                }
            });
        } else {
            // Half inputs widen to f32 exactly; f32 results round to the
            // output dtype when stored.
            let x = dense_input::<f32>(&input, &out);
            with_dense_output::<f32>(&out, |y| {
                if y.len() >= PAR_MIN {
                    y.par_chunks_mut(BLOCK)
                        .zip(x.par_chunks(BLOCK))
                        .for_each(|(yb, xb)| trig_block(which, xb, yb));
                } else {
                    y.chunks_mut(BLOCK).zip(x.chunks(BLOCK)).for_each(|(yb, xb)| trig_block(which, xb, yb));
                }
            });
        }
        Ok(())
    })))
}

/// `sin(Tensor self) -> Tensor` (and `sin_`; registered for `sin.out`).
pub(crate) fn sin(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    trig(ctx, call, Trig::Sin)
}

/// `cos(Tensor self) -> Tensor` (and `cos_`; registered for `cos.out`).
pub(crate) fn cos(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    trig(ctx, call, Trig::Cos)
}

/// PyTorch's integer power: exact (wrapping) for non-negative exponents.
#[inline(always)]
fn powi(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut result, mut b, mut e) = (1i64, base, exp);
    while e > 0 {
        if e & 1 == 1 {
            result = result.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    result
}

/// An operand of `pow`: a device tensor, or a number (a Scalar or a
/// 0-dim host tensor) with its part in type promotion.
enum PowArg {
    View(TensorView),
    Number(Scalar, Participant),
}

impl PowArg {
    fn of(operand: Operand) -> Self {
        let part = operand.participant();
        match operand {
            Operand::View(v) => PowArg::View(v),
            Operand::Host(_, s, _) => PowArg::Number(s, part),
        }
    }
    fn participant(&self) -> Participant {
        match self {
            PowArg::View(v) => Operand::View(v.clone()).participant(),
            PowArg::Number(_, part) => *part,
        }
    }
}

/// `out = base ** exponent` over broadcast operands, in the output dtype.
fn pow_impl(ctx: &KernelCtx<'_>, call: &Frame<'_>, base: PowArg, exp: PowArg) -> Result<Option<Work>> {
    let out = ctx.output(call, 0)?;
    let dtype = out.dtype();
    let promoted = result_type(&[base.participant(), exp.participant()]);
    if promoted != dtype {
        return Err(
            ctx.invalid(format!("result type {promoted} can't be cast to the desired output type {dtype}"))
        );
    }
    if dtype == DType::Bool {
        return Err(ctx.unimplemented("\"pow\" not implemented for 'Bool'"));
    }
    let floating = dtype.is_floating();
    let input = |a: PowArg, role: &str| -> Result<Input<f64>> {
        Ok(match a {
            PowArg::View(v) => {
                if !super::view::disjoint(&v, &out) && !v.same_layout(&out) {
                    return Err(ctx.invalid("unsupported operation: an input partially overlaps the output"));
                }
                Input::View(v.into_broadcast(out.shape()).map_err(|v| {
                    ctx.invalid(format!(
                        "{role} of shape {:?} cannot be broadcast to the output shape {:?}",
                        v.shape(),
                        out.shape()
                    ))
                })?)
            }
            // The number is first converted to the output dtype.
            PowArg::Number(s, _) => Input::Const(if floating {
                crate::dtype::with_storage!(dtype, T => {
                    ctx.scalar_to::<T>(s, dtype)?.to_f64()
                })
            } else {
                ctx.scalar_to::<i64>(s, DType::Int64)? as f64
            }),
        })
    };
    let (b, e) = (input(base, "self")?, input(exp, "exponent")?);
    if out.numel() == 0 {
        return Ok(None);
    }
    if floating {
        return Ok(Some(map2::<f64, f64, _>(out, b, e, |x, y| x.powf(y))));
    }
    let int = |i: Input<f64>| match i {
        Input::View(v) => Input::View(v),
        Input::Const(c) => Input::Const(c as i64),
    };
    Ok(Some(map2::<i64, i64, _>(out, int(b), int(e), powi)))
}

/// `pow.Scalar(Scalar self, Tensor exponent) -> Tensor` (registered for
/// `pow.Scalar_out`).
pub(crate) fn pow_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let base = args.scalar(0, "self", None)?;
    let exp = PowArg::of(ctx.operand(args.tensor(1, "exponent")?, "exponent")?);
    pow_impl(ctx, call, PowArg::Number(base, Participant::Wrapped(base.category())), exp)
}

/// `pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor` (and
/// `pow_.Tensor`; registered for `pow.Tensor_Tensor_out`).
pub(crate) fn pow_tensor_tensor(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let arg = |i: usize, name: &str| -> Result<PowArg> {
        match call.args.get(i) {
            Some(ArgRef::Tensor(t)) => Ok(PowArg::of(ctx.operand(t, name)?)),
            _ => {
                let s = args.scalar(i, name, None)?;
                Ok(PowArg::Number(s, Participant::Wrapped(s.category())))
            }
        }
    };
    pow_impl(ctx, call, arg(0, "self")?, arg(1, "exponent")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_sincos_matches_the_library_to_f32_precision() {
        let mut worst = 0.0f64;
        for i in 0..200_000 {
            let x = (i as f64 - 100_000.0) * 0.4999;
            let (s, c) = sincos(x);
            worst = worst.max((s - x.sin()).abs()).max((c - x.cos()).abs());
        }
        assert!(worst < 1e-12, "max error {worst}");
        assert_eq!(sincos(0.0), (0.0, 1.0));
    }

    #[test]
    fn integer_powers() {
        assert_eq!(powi(3, 4), 81);
        assert_eq!(powi(2, 63), i64::MIN);
        assert_eq!(powi(-1, -3), -1);
        assert_eq!(powi(-1, -2), 1);
        assert_eq!(powi(1, -5), 1);
        assert_eq!(powi(5, -1), 0);
        assert_eq!(powi(0, 0), 1);
    }
}

//! Rounding divisions: `floor_divide` (`a // b`: beam search splits a
//! flattened top-k index into beam and token), `div` with a rounding mode
//! (`"trunc"`, `"floor"`, or None for true division) and `remainder`
//! (`a % b`, Python's sign convention).
//!
//! They compute in the output's arithmetic type (the promoted dtype), with
//! PyTorch's CPU formulas: floating floor division is `(a - fmod(a, b)) /
//! b` corrected towards minus infinity and rounded to the nearest integer
//! (so it agrees with Python's `//`), with IEEE results for a zero
//! divisor; integer division wraps (`i64::MIN // -1`) and a zero divisor
//! raises `ZeroDivisionError`, as on the CPU (checked when the work runs
//! for a tensor divisor).

use super::{check_cast, check_shapes, input, other, tensor_operand, Other};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::elementwise::{gather, map2, Input};
use crate::kernels::promotion::result_type;
use crate::kernels::real::Real;
use crate::kernels::view::TensorView;
use crate::kernels::{ArgRef, Args, Frame, KernelCtx, Operand};
use crate::runtime::Work;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    True,
    Trunc,
    Floor,
    Remainder,
}

#[inline(always)]
fn floor_div<T: Real>(a: T, b: T) -> T {
    let zero = T::of(0.0);
    if b == zero {
        return a / b;
    }
    let rem = fmod(a, b);
    let mut div = (a - rem) / b;
    if rem != zero && (b < zero) != (rem < zero) {
        div = div - T::of(1.0);
    }
    if div != zero {
        let mut floored = T::of(div.wide().floor());
        if div - floored > T::of(0.5) {
            floored += T::of(1.0);
        }
        floored
    } else {
        // A signed zero, with the sign of the true quotient.
        T::of(0.0_f64.copysign((a / b).wide()))
    }
}

#[inline(always)]
fn fmod<T: Real>(a: T, b: T) -> T {
    T::of(a.wide() % b.wide())
}

#[inline(always)]
fn float_op<T: Real>(mode: Mode, a: T, b: T) -> T {
    match mode {
        Mode::True => a / b,
        Mode::Trunc => T::of((a / b).wide().trunc()),
        Mode::Floor => floor_div(a, b),
        Mode::Remainder => {
            let m = fmod(a, b);
            let zero = T::of(0.0);
            if m != zero && (b < zero) != (m < zero) {
                m + b
            } else {
                m
            }
        }
    }
}

#[inline(always)]
fn int_op(mode: Mode, a: i64, b: i64) -> i64 {
    match mode {
        Mode::True | Mode::Trunc => a.wrapping_div(b),
        Mode::Floor => {
            let q = a.wrapping_div(b);
            if (a < 0) != (b < 0) && a.wrapping_rem(b) != 0 {
                q - 1
            } else {
                q
            }
        }
        Mode::Remainder => {
            let r = a.wrapping_rem(b);
            if r != 0 && (r < 0) != (b < 0) {
                r + b
            } else {
                r
            }
        }
    }
}

fn rounding(ctx: &KernelCtx<'_>, call: &Frame<'_>, args: &Args<'_>, mode: Mode) -> Result<Option<Work>> {
    let a = tensor_operand(ctx, args, 0, "self")?;
    let b = other(ctx, call, args, 1)?;
    let out = ctx.output(call, 0)?;
    let dtype = out.dtype();
    let mut result = result_type(&[a.participant(), b.participant()]);
    if mode == Mode::True && !result.is_floating() {
        result = DType::Float32;
    }
    check_cast(ctx, result, dtype)?;
    check_shapes(ctx, &out, &[&a, &b])?;
    match dtype {
        DType::Bool => Err(ctx.unimplemented("bool outputs are not supported")),
        DType::Float64 => {
            let (ia, ib) = (input::<f64>(ctx, a, &out, dtype)?, input::<f64>(ctx, b, &out, dtype)?);
            Ok(Some(map2::<f64, f64, _>(out, ia, ib, move |x, y| float_op(mode, x, y))))
        }
        DType::Float16 | DType::BFloat16 | DType::Float32 => {
            let (ia, ib) = (input::<f32>(ctx, a, &out, dtype)?, input::<f32>(ctx, b, &out, dtype)?);
            Ok(Some(map2::<f32, f32, _>(out, ia, ib, move |x, y| float_op(mode, x, y))))
        }
        _ => {
            let divisor: Option<TensorView> = match &b {
                Other::Tensor(Operand::View(v)) => Some(v.clone()),
                _ => None,
            };
            let (ia, ib) = (input::<i64>(ctx, a, &out, dtype)?, input::<i64>(ctx, b, &out, dtype)?);
            if matches!(ib, Input::Const(0)) {
                return Err(ctx.invalid("ZeroDivisionError"));
            }
            let op = ctx.op().to_owned();
            let work = map2::<i64, i64, _>(out, ia, ib, move |x, y| int_op(mode, x, y));
            Ok(Some(Work::new(move || {
                if let Some(v) = divisor {
                    if gather::<i64>(&v).contains(&0) {
                        return Err(Error::invalid(format!("sim: {op}: ZeroDivisionError")));
                    }
                }
                work.run()
            })))
        }
    }
}

/// `floor_divide(Tensor self, Tensor other) -> Tensor` and
/// `floor_divide_.Tensor` (a Python number arrives as a wrapped tensor).
pub(crate) fn floor_divide(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    rounding(ctx, call, &args, Mode::Floor)
}

/// `div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) ->
/// Tensor` (and `div_.Tensor_mode`; registered for `div.out_mode`).
pub(crate) fn div_mode(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 3)?;
    let mode = match call.args.get(2) {
        None | Some(ArgRef::None) => Mode::True,
        Some(ArgRef::Str(s)) if s == "trunc" => Mode::Trunc,
        Some(ArgRef::Str(s)) if s == "floor" => Mode::Floor,
        Some(ArgRef::Str(s)) => {
            return Err(ctx.invalid(format!(
                "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{s}'"
            )))
        }
        _ => return Err(ctx.invalid("argument 2 (rounding_mode) must be a string or None")),
    };
    rounding(ctx, call, &args, mode)
}

/// `remainder.Tensor(Tensor self, Tensor other) -> Tensor` (and
/// `remainder_.Tensor`; registered for `remainder.Tensor_out`).
pub(crate) fn remainder(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    rounding(ctx, call, &args, Mode::Remainder)
}

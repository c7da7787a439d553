//! Random operators: `uniform_`, `normal_`, `bernoulli_` (float and tensor
//! probabilities), `random_` (all three overloads), and `native_dropout`
//! with its backward.
//!
//! # The random number scheme
//!
//! Every random kernel is flagged `TFL_OP_RANDOM`, so the host reserves a
//! counter range for the call from its generator and passes `(seed,
//! offset)` in [`Frame::rng`]; it advances its offset by the number of
//! output elements (at least 1). The kernels draw nothing else: output
//! element `i` (its row-major logical index, whatever the memory layout)
//! takes the 128 bits of **Philox4x32-10** (Salmon et al., SC'11, the
//! generator of cuRAND and PyTorch's CUDA backend) at
//!
//! - key     = `[seed as u32, (seed >> 32) as u32]`,
//! - counter = `[c as u32, (c >> 32) as u32, 0, 0]` with `c = offset + i`
//!   (wrapping),
//!
//! giving words `r0..r3`, from which:
//!
//! - a `f32`-precision uniform in `[0, 1)` is `(r0 >> 8) * 2^-24` and a
//!   double one `((r0 << 32 | r1) >> 11) * 2^-53` (used for `f64` outputs
//!   and for all probabilities, so `bernoulli_(p)` compares with 53 bits);
//! - a normal is Box-Muller, `sqrt(-2 ln(1 - u1)) * cos(2 pi u2)`, with
//!   `u1` from `(r0, r1)` and `u2` from `(r2, r3)` as doubles;
//! - an integer in a span of `s` values is `(r0 << 32 | r1) mod s`.
//!
//! So the result is a pure function of `(seed, offset, i)`: `torch.manual_seed`
//! reproduces runs, consecutive calls use disjoint counters, and neither
//! the stream thread's timing nor the rayon split can change a value.

use rayon::prelude::*;

use super::elementwise::{gather, map2, with_dense_output, Input};
use super::view::TensorView;
use super::{ArgRef, Args, Frame, KernelCtx, Operand, Rng};
use crate::dtype::{with_storage, DType, Element, B8};
use crate::error::Result;
use crate::runtime::Work;

/// Elements per parallel task.
const TASK: usize = 16 * 1024;

/// Philox4x32-10 of `counter` under `key`.
#[inline(always)]
pub(crate) fn philox(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let p0 = M0 * u64::from(c[0]);
        let p1 = M1 * u64::from(c[2]);
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    c
}

/// The 128 random bits of element `i` of a call (see the module doc).
#[inline(always)]
pub(crate) fn bits(rng: Rng, i: u64) -> [u32; 4] {
    let c = rng.offset.wrapping_add(i);
    philox([c as u32, (c >> 32) as u32, 0, 0], [rng.seed as u32, (rng.seed >> 32) as u32])
}

#[inline(always)]
fn unit_f32(r: [u32; 4]) -> f32 {
    (r[0] >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[inline(always)]
fn u64_of(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

#[inline(always)]
fn unit_f64(hi: u32, lo: u32) -> f64 {
    (u64_of(hi, lo) >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
}

/// A standard normal from the element's bits.
#[inline(always)]
fn normal(r: [u32; 4]) -> f64 {
    let u1 = unit_f64(r[0], r[1]);
    let u2 = unit_f64(r[2], r[3]);
    (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Fills `out` with `f(i)` for each row-major index `i`, in parallel.
fn fill_indexed<T: Element>(out: &TensorView, f: impl Fn(u64) -> T + Sync) {
    with_dense_output::<T>(out, |o| {
        if o.len() > TASK {
            o.par_chunks_mut(TASK).enumerate().for_each(|(c, chunk)| {
                let base = (c * TASK) as u64;
                for (j, v) in chunk.iter_mut().enumerate() {
                    *v = f(base + j as u64);
                }
            });
        } else {
            for (j, v) in o.iter_mut().enumerate() {
                *v = f(j as u64);
            }
        }
    });
}

/// Reads a `float` argument (ints accepted).
fn float_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str, default: f64) -> Result<f64> {
    match call.args.get(i) {
        None | Some(ArgRef::None) => Ok(default),
        Some(ArgRef::Float(v)) => Ok(*v),
        Some(ArgRef::Int(v)) => Ok(*v as f64),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a float"))),
    }
}

/// Reads an `int?` argument.
fn opt_int_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<Option<i64>> {
    match call.args.get(i) {
        None | Some(ArgRef::None) => Ok(None),
        Some(ArgRef::Int(v)) => Ok(Some(*v)),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be an int or None"))),
    }
}

/// The in-place output (`self`) of a random fill.
fn self_output(ctx: &KernelCtx<'_>, call: &Frame<'_>, args: &Args<'_>) -> Result<Option<TensorView>> {
    args.tensor(0, "self")?;
    let out = ctx.output(call, 0)?;
    Ok(if out.numel() == 0 { None } else { Some(out) })
}

/// `uniform_(Tensor(a!) self, float from=0., float to=1., *, Generator?
/// generator=None)`: floating dtypes.
pub(crate) fn uniform(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 4)?;
    let from = float_arg(ctx, call, 1, "from", 0.0)?;
    let to = float_arg(ctx, call, 2, "to", 1.0)?;
    let Some(out) = self_output(ctx, call, &args)? else { return Ok(None) };
    if !out.dtype().is_floating() {
        return Err(ctx.unimplemented(format!("{} is not supported", out.dtype())));
    }
    if from > to {
        return Err(ctx.invalid(format!(
            "uniform_ expects to return a [from, to) range, but found from={from} > to={to}"
        )));
    }
    let rng = call.rng;
    let span = to - from;
    Ok(Some(Work::new(move || {
        match out.dtype() {
            DType::Float64 => fill_indexed::<f64>(&out, |i| {
                let r = bits(rng, i);
                from + span * unit_f64(r[0], r[1])
            }),
            dtype => with_storage!(dtype, T => fill_indexed::<T>(&out, |i| {
                let u = unit_f32(bits(rng, i));
                T::from_f32((from + span * f64::from(u)) as f32)
            })),
        }
        Ok(())
    })))
}

/// `normal_(Tensor(a!) self, float mean=0., float std=1., *, Generator?
/// generator=None)`: floating dtypes.
pub(crate) fn normal_(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 4)?;
    let mean = float_arg(ctx, call, 1, "mean", 0.0)?;
    let std = float_arg(ctx, call, 2, "std", 1.0)?;
    let Some(out) = self_output(ctx, call, &args)? else { return Ok(None) };
    if !out.dtype().is_floating() {
        return Err(ctx.unimplemented(format!("{} is not supported", out.dtype())));
    }
    if std < 0.0 || std.is_nan() {
        return Err(ctx.invalid(format!("normal expects std >= 0.0, but found std {std}")));
    }
    let rng = call.rng;
    Ok(Some(Work::new(move || {
        with_storage!(out.dtype(), T => fill_indexed::<T>(&out, |i| {
            T::from_f64(mean + std * normal(bits(rng, i)))
        }));
        Ok(())
    })))
}

/// `bernoulli_.float(Tensor(a!) self, float p=0.5, *, Generator?
/// generator=None)`: 1 with probability `p`, any dtype.
pub(crate) fn bernoulli_float(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 3)?;
    let p = float_arg(ctx, call, 1, "p", 0.5)?;
    if !(0.0..=1.0).contains(&p) {
        return Err(ctx.invalid(format!("bernoulli_ expects p to be in [0, 1], but got p={p}")));
    }
    let Some(out) = self_output(ctx, call, &args)? else { return Ok(None) };
    let rng = call.rng;
    Ok(Some(Work::new(move || {
        with_storage!(out.dtype(), T => fill_indexed::<T>(&out, |i| {
            let r = bits(rng, i);
            T::from_bool(unit_f64(r[0], r[1]) < p)
        }));
        Ok(())
    })))
}

/// `bernoulli_.Tensor(Tensor(a!) self, Tensor p, *, Generator?
/// generator=None)`: `p` broadcasts to `self`.
pub(crate) fn bernoulli_tensor(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 3)?;
    let p = match ctx.operand(args.tensor(1, "p")?, "p")? {
        Operand::View(v) => Input::View(v),
        Operand::Host(_, s, _) => Input::Const(s.cast::<f64>()),
    };
    let Some(out) = self_output(ctx, call, &args)? else { return Ok(None) };
    let p = match p {
        Input::View(v) => Input::View(v.into_broadcast(out.shape()).map_err(|v| {
            ctx.invalid(format!(
                "p of shape {:?} cannot be broadcast to self's shape {:?}",
                v.shape(),
                out.shape()
            ))
        })?),
        c => c,
    };
    let rng = call.rng;
    Ok(Some(Work::new(move || {
        let probs = match &p {
            Input::View(v) => gather::<f64>(v),
            Input::Const(c) => vec![*c; out.numel()],
        };
        with_storage!(out.dtype(), T => fill_indexed::<T>(&out, |i| {
            let r = bits(rng, i);
            T::from_bool(unit_f64(r[0], r[1]) < probs[i as usize])
        }));
        Ok(())
    })))
}

/// The largest integer `random_` produces for `dtype` without `to`
/// (floats: every integer up to `2^digits` is exact).
fn random_max(dtype: DType) -> i64 {
    match dtype {
        DType::Bool => 1,
        DType::UInt8 => 255,
        DType::Int8 => 127,
        DType::Int16 => i64::from(i16::MAX),
        DType::Int32 => i64::from(i32::MAX),
        DType::Int64 => i64::MAX,
        DType::Float16 => 1 << 11,
        DType::BFloat16 => 1 << 8,
        DType::Float32 => 1 << 24,
        DType::Float64 => 1 << 53,
    }
}

fn random_work(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    out: TensorView,
    from: i64,
    to: Option<i64>,
) -> Result<Option<Work>> {
    // Values lie in [from, last], `span` of them (0 means 2^64).
    let last = match to {
        Some(t) => {
            if from >= t {
                return Err(ctx.invalid(format!(
                    "random_ expects 'from' to be less than 'to', but got from={from} >= to={t}"
                )));
            }
            t - 1
        }
        None => random_max(out.dtype()),
    };
    if last < from {
        return Err(ctx.invalid(format!(
            "random_ expects 'from' casted to dtype to be less than or equal to 'to' casted to dtype, but \
             got from={from} > to={last}"
        )));
    }
    let span = (last as i128 - from as i128 + 1) as u128;
    let span = if span > u128::from(u64::MAX) { 0 } else { span as u64 };
    let rng = call.rng;
    Ok(Some(Work::new(move || {
        with_storage!(out.dtype(), T => fill_indexed::<T>(&out, |i| {
            let r = bits(rng, i);
            let x = u64_of(r[0], r[1]);
            let v = if span == 0 { x } else { x % span };
            T::from_i64(from.wrapping_add(v as i64))
        }));
        Ok(())
    })))
}

/// `random_(Tensor(a!) self, *, Generator? generator=None)`: integers in
/// `[0, max]` (`2^digits` for floating dtypes).
pub(crate) fn random(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 2)?;
    let Some(out) = self_output(ctx, call, &args)? else { return Ok(None) };
    random_work(ctx, call, out, 0, None)
}

/// `random_.from(Tensor(a!) self, int from, int? to, *, Generator?
/// generator=None)`: integers in `[from, to)` (`[from, max]` without `to`).
pub(crate) fn random_from(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 4)?;
    let from = opt_int_arg(ctx, call, 1, "from")?.unwrap_or(0);
    let to = opt_int_arg(ctx, call, 2, "to")?;
    let Some(out) = self_output(ctx, call, &args)? else { return Ok(None) };
    random_work(ctx, call, out, from, to)
}

/// `random_.to(Tensor(a!) self, int to, *, Generator? generator=None)`:
/// integers in `[0, to)`.
pub(crate) fn random_to(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 3)?;
    let to = opt_int_arg(ctx, call, 1, "to")?;
    let Some(out) = self_output(ctx, call, &args)? else { return Ok(None) };
    random_work(ctx, call, out, 0, to)
}

/// `native_dropout(Tensor input, float p, bool? train) -> (Tensor,
/// Tensor)`: in training (or `train` None), element `i` is kept when its
/// uniform (53 bits) is below `1 - p`, and scaled by `1 / (1 - p)` (0 when
/// `p == 1`); the second output is the bool keep mask. In eval, a copy and
/// an all-true mask.
pub(crate) fn native_dropout(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 3)?;
    let input = ctx.device_view(args.tensor(0, "input")?, "input")?;
    let p = float_arg(ctx, call, 1, "p", 0.5)?;
    let train = match call.args.get(2) {
        None | Some(ArgRef::None) => true,
        _ => args.bool_or(2, "train", true)?,
    };
    let out = ctx.output(call, 0)?;
    let mask = ctx.output(call, 1)?;
    if !(0.0..=1.0).contains(&p) {
        return Err(ctx.invalid(format!("dropout probability has to be between 0 and 1, but got {p}")));
    }
    if !out.dtype().is_floating() {
        return Err(ctx.unimplemented(format!("{} is not supported", out.dtype())));
    }
    if out.shape() != input.shape() || mask.shape() != input.shape() || mask.dtype() != DType::Bool {
        return Err(ctx.invalid("outputs must have the input's shape (the mask bool)"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    let rng = call.rng;
    let p1m = 1.0 - p;
    let scale = if p1m == 0.0 { 0.0 } else { 1.0 / p1m };
    Ok(Some(Work::new(move || {
        let keep = |i: u64| -> bool {
            if !train {
                return true;
            }
            let r = bits(rng, i);
            unit_f64(r[0], r[1]) < p1m
        };
        fill_indexed::<B8>(&mask, |i| B8::from_bool(keep(i)));
        let m = gather::<B8>(&mask);
        if out.dtype() == DType::Float64 {
            let x = gather::<f64>(&input);
            fill_indexed::<f64>(&out, |i| {
                let i = i as usize;
                if !train {
                    x[i]
                } else if m[i].0 != 0 {
                    x[i] * scale
                } else {
                    0.0
                }
            });
        } else {
            let x = gather::<f32>(&input);
            let s = scale as f32;
            with_storage!(out.dtype(), T => fill_indexed::<T>(&out, |i| {
                let i = i as usize;
                T::from_f32(if !train { x[i] } else if m[i].0 != 0 { x[i] * s } else { 0.0 })
            }));
        }
        Ok(())
    })))
}

/// `native_dropout_backward(Tensor grad_output, Tensor mask, float scale)
/// -> Tensor` (and `.out`): `grad * mask * scale`.
pub(crate) fn native_dropout_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 3)?;
    let grad = ctx.device_view(args.tensor(0, "grad_output")?, "grad_output")?;
    let mask = ctx.device_view(args.tensor(1, "mask")?, "mask")?;
    let scale = float_arg(ctx, call, 2, "scale", 1.0)?;
    let out = ctx.output(call, 0)?;
    if mask.dtype() != DType::Bool {
        return Err(ctx.invalid(format!("Mask should be Bool Scalar Type {}", mask.dtype())));
    }
    if !out.dtype().is_floating() {
        return Err(ctx.unimplemented(format!("{} is not supported", out.dtype())));
    }
    let shape = out.shape().to_vec();
    let bc = |v: TensorView, role: &str| {
        v.into_broadcast(&shape)
            .map_err(|v| ctx.invalid(format!("{role} of shape {:?} does not match {:?}", v.shape(), shape)))
    };
    let (grad, mask) = (bc(grad, "grad_output")?, bc(mask, "mask")?);
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(if out.dtype() == DType::Float64 {
        map2::<f64, f64, _>(out, Input::View(grad), Input::View(mask), move |g, m| g * m * scale)
    } else {
        let s = scale as f32;
        map2::<f32, f32, _>(out, Input::View(grad), Input::View(mask), move |g, m| g * m * s)
    }))
}

//! Random sampling: `multinomial` (the token sampler of every generation
//! loop), flagged `TFL_OP_RANDOM` so it draws from the device generator: `torch.manual_seed` and
//! `torch.Generator(device=...)` reproduce it.
//!
//! # Random numbers
//!
//! The host reserves one Philox counter per output element
//! ([`super::random`]'s scheme: element `i` uses counter `offset + i` with
//! the upper counter words 0). Sampling without replacement needs a random
//! number per *category*, more than one per output element, so this
//! module also uses sub-streams: category `k` of row `r` takes
//! `philox([c, c >> 32, k, 1], key)` with `c = offset + r * num_samples`,
//! the row's first reserved counter. The last word (1) keeps sub-streams
//! apart from the plain scheme, and `c` from other rows and calls, so no
//! two draws share a counter.
//!
//! `multinomial` follows PyTorch's algorithms: without replacement (and
//! for a single sample) the exponential race, `argmax`/top-k of `p / q`
//! with `q ~ Exp(1)` (the Gumbel-max trick CUDA and CPU use); with
//! replacement, inverse-CDF sampling (a uniform per sample,
//! binary-searched in the row's cumulative distribution). Invalid
//! distributions (negative, inf or NaN entries, a zero row, too few
//! nonzero categories for sampling without replacement) fail the work with
//! PyTorch's messages. Rows run in parallel.
//! (`randperm` is in [`super::randperm`].)

use rayon::prelude::*;

use super::elementwise::{gather, with_dense_output, PAR_MIN};
use super::random::{bits, philox};
use super::{Args, Frame, KernelCtx, Rng};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::Work;

/// A uniform in `[0, 1)` with 53 random bits.
#[inline(always)]
fn unit(r: [u32; 4]) -> f64 {
    (((u64::from(r[0]) << 32) | u64::from(r[1])) >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
}

/// The bits of sub-stream `k` of counter `c` (see the module doc).
#[inline(always)]
fn sub_bits(rng: Rng, c: u64, k: u64) -> [u32; 4] {
    let c = rng.offset.wrapping_add(c);
    philox([c as u32, (c >> 32) as u32, k as u32, 1], [rng.seed as u32, (rng.seed >> 32) as u32])
}

/// Checks one row of probabilities; returns its sum.
fn check_row(p: &[f64], samples: usize, replacement: bool) -> Result<f64> {
    let mut sum = 0.0;
    let mut nonzero = 0usize;
    for &x in p {
        if !x.is_finite() || x < 0.0 {
            return Err(Error::invalid(
                "sim: multinomial: probability tensor contains either `inf`, `nan` or element < 0",
            ));
        }
        sum += x;
        nonzero += usize::from(x > 0.0);
    }
    if sum <= 0.0 {
        return Err(Error::invalid(
            "sim: multinomial: invalid multinomial distribution (sum of probabilities <= 0)",
        ));
    }
    if !replacement && nonzero < samples {
        return Err(Error::invalid(
            "sim: multinomial: invalid multinomial distribution (with replacement=False, not enough non-negative \
             category to sample)",
        ));
    }
    Ok(sum)
}

/// Draws the samples of row `r` into `dst`.
fn sample_row(p: &[f64], r: usize, dst: &mut [i64], replacement: bool, rng: Rng) -> Result<()> {
    let samples = dst.len();
    let sum = check_row(p, samples, replacement)?;
    let first = (r * samples) as u64;
    if !replacement || samples == 1 {
        // Exponential race: the largest p / q, q ~ Exp(1), in order.
        let mut keys: Vec<(f64, usize)> = p
            .iter()
            .enumerate()
            .map(|(k, &x)| {
                let q = -(1.0 - unit(sub_bits(rng, first, k as u64))).ln();
                // A zero-probability category never wins (not even 0 / 0).
                (if x > 0.0 { x / q } else { -1.0 }, k)
            })
            .collect();
        let order = |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if samples < keys.len() {
            keys.select_nth_unstable_by(samples - 1, order);
        }
        keys[..samples].sort_unstable_by(order);
        for (d, &(_, k)) in dst.iter_mut().zip(&keys) {
            *d = k as i64;
        }
        return Ok(());
    }
    let mut cdf = Vec::with_capacity(p.len());
    let mut acc = 0.0;
    for &x in p {
        acc += x / sum;
        cdf.push(acc);
    }
    for (j, d) in dst.iter_mut().enumerate() {
        let u = unit(bits(rng, first + j as u64));
        // The first category whose cumulative probability exceeds u,
        // skipping zero-probability ones at the end of rounding.
        let mut k = cdf.partition_point(|&c| c <= u).min(p.len() - 1);
        while p[k] == 0.0 && k > 0 {
            k -= 1;
        }
        *d = k as i64;
    }
    Ok(())
}

/// `multinomial(Tensor self, SymInt num_samples, bool replacement=False, *,
/// Generator? generator=None) -> Tensor`: int64 category indices, one row
/// of `num_samples` per row of probabilities (`self` 1-D or 2-D, any
/// floating dtype; rows need not sum to 1).
pub(crate) fn multinomial(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 4)?;
    let probs = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let samples = super::softmax::int_arg(ctx, call, 1, "num_samples")?;
    let replacement = args.bool_or(2, "replacement", false)?;
    let out = ctx.output(call, 0)?;
    if !probs.dtype().is_floating() {
        return Err(ctx.invalid(format!(
            "multinomial only supports floating-point dtypes for input, got: {}",
            probs.dtype()
        )));
    }
    if probs.ndim() == 0 || probs.ndim() > 2 {
        return Err(ctx.invalid("prob_dist must be 1 or 2 dim"));
    }
    let categories = probs.shape()[probs.ndim() - 1];
    if categories == 0 {
        return Err(ctx.invalid("multinomial: number of categories cannot be zero"));
    }
    if categories > 1 << 24 {
        return Err(ctx.invalid("number of categories cannot exceed 2^24"));
    }
    if samples <= 0 {
        return Err(ctx.invalid("cannot sample n_sample <= 0 samples"));
    }
    let samples = samples as usize;
    if !replacement && samples > categories {
        return Err(ctx.invalid("cannot sample n_sample > prob_dist.size(-1) samples without replacement"));
    }
    let rows = if probs.ndim() == 2 { probs.shape()[0] } else { 1 };
    let expected: Vec<usize> = if probs.ndim() == 2 { vec![rows, samples] } else { vec![samples] };
    if out.dtype() != DType::Int64 || out.shape() != expected.as_slice() {
        return Err(ctx.invalid(format!("out must be int64 of shape {expected:?}")));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    let rng = call.rng;
    Ok(Some(Work::new(move || {
        let p = gather::<f64>(&probs);
        let mut result = vec![0i64; rows * samples];
        let row = |(r, dst): (usize, &mut [i64])| {
            sample_row(&p[r * categories..(r + 1) * categories], r, dst, replacement, rng)
        };
        if p.len() >= PAR_MIN / 4 && rows > 1 {
            result.par_chunks_mut(samples).enumerate().try_for_each(row)?;
        } else {
            result.chunks_mut(samples).enumerate().try_for_each(row)?;
        }
        with_dense_output::<i64>(&out, |o| o.copy_from_slice(&result));
        Ok(())
    })))
}

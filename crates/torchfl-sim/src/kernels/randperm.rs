//! `randperm`: a random permutation of `0..n`, driven by the device
//! generator (Faster R-CNN's sampler draws its positive and negative
//! anchors with it).
//!
//! Each position `i` gets a 64-bit key from the Philox stream of the call
//! (the scheme of [`super::random`]: a pure function of the generator's
//! seed and offset and of `i`), and the permutation is the positions
//! sorted by key, ties by position: uniform up to key collisions, which
//! are negligible, reproducible under `torch.manual_seed`, and sorted in
//! parallel.

use rayon::prelude::*;

use super::elementwise::PAR_MIN;
use super::linalg::write_with;
use super::random::bits;
use super::softmax::int_arg;
use super::{Frame, KernelCtx, Rng};
use crate::dtype::{with_storage, DType, Element};
use crate::error::Result;
use crate::runtime::Work;

/// The largest `n` whose values `0..n` a dtype holds exactly.
fn exact_limit(dtype: DType) -> u64 {
    match dtype {
        DType::Float16 => 2048,
        DType::BFloat16 => 256,
        DType::Float32 => 1 << 24,
        DType::Float64 => 1 << 53,
        DType::UInt8 => 256,
        DType::Int8 => 128,
        DType::Int16 => 1 << 15,
        DType::Int32 => 1 << 31,
        DType::Int64 => u64::MAX,
        DType::Bool => 0,
    }
}

/// `randperm.generator_out(SymInt n, *, Generator? generator, Tensor(a!)
/// out) -> Tensor(a!)`, which `torch.randperm` dispatches.
pub(crate) fn randperm(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let n = int_arg(ctx, call, 0, "n")?;
    if n < 0 {
        return Err(ctx.invalid(format!("n must be non-negative, got{n}")));
    }
    let out = ctx.output(call, 0)?;
    if out.shape() != [n as usize] {
        return Err(ctx.invalid(format!("the output has shape {:?}, expected [{n}]", out.shape())));
    }
    if n as u64 > exact_limit(out.dtype()) {
        return Err(ctx.invalid(format!(
            "n must be at most {} for dtype {}",
            exact_limit(out.dtype()),
            out.dtype()
        )));
    }
    if n == 0 {
        return Ok(None);
    }
    let rng = call.rng;
    Ok(Some(with_storage!(out.dtype(), T => Work::new(move || {
        let perm = permutation(n as usize, rng);
        write_with::<T>(&out, &[], |o| {
            for (v, &p) in o.iter_mut().zip(&perm) {
                *v = T::from_i64(p as i64);
            }
        });
        Ok(())
    }))))
}

fn permutation(n: usize, rng: Rng) -> Vec<usize> {
    let key = |i: usize| {
        let r = bits(rng, i as u64);
        ((u64::from(r[0]) << 32) | u64::from(r[1]), i)
    };
    let mut keyed: Vec<(u64, usize)> =
        if n >= PAR_MIN { (0..n).into_par_iter().map(key).collect() } else { (0..n).map(key).collect() };
    if n >= PAR_MIN {
        keyed.par_sort_unstable();
    } else {
        keyed.sort_unstable();
    }
    keyed.into_iter().map(|(_, i)| i).collect()
}

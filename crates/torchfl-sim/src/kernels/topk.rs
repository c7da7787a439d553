//! `topk`: the `k` largest (or smallest) elements of each slice along a
//! dimension, with their indices. Detection models take the top anchors
//! of each feature level with it; language models sample from it.
//!
//! Each slice is selected in its storage type (no conversion, so int64
//! values keep their order exactly) with a partial selection and then
//! sorted. The order is PyTorch's: NaN counts as larger than every number
//! (first when `largest`, last otherwise), and the output is sorted from
//! the first pick on. Ties, which PyTorch leaves unspecified, go to the
//! lower index, so results are deterministic. Slices run in parallel.

use std::cmp::Ordering;

use rayon::prelude::*;

use super::elementwise::PAR_MIN;
use super::linalg::{read, write_with};
use super::softmax::{int_arg, wrap_dim};
use super::view::{disjoint, TensorView};
use super::{Args, Frame, KernelCtx};
use crate::dtype::{with_storage, Element};
use crate::error::Result;
use crate::runtime::Work;

/// `a` before `b` in a descending order where NaN is the largest value.
#[inline(always)]
fn descending<T: Element>(a: T, b: T) -> Ordering {
    match b.partial_cmp(&a) {
        Some(o) => o,
        // At least one NaN (a value unordered with itself).
        None => {
            let (a_nan, b_nan) = (a.partial_cmp(&a).is_none(), b.partial_cmp(&b).is_none());
            b_nan.cmp(&a_nan)
        }
    }
}

/// Descending order of `(value, index)` pairs, NaN first, ties by index:
/// a stable descending sort (`torchvision::nms` visits boxes in it).
#[inline(always)]
pub(crate) fn descending_index<T: Element>(a: T, ai: usize, b: T, bi: usize) -> Ordering {
    descending(a, b).then(ai.cmp(&bi))
}

/// The selection order of a `(value, index)` pair: by value (descending
/// for `largest`, ascending otherwise, NaN the largest), ties by index.
#[inline(always)]
fn order<T: Element>(largest: bool) -> impl Fn(&(T, usize), &(T, usize)) -> Ordering + Copy {
    move |a, b| {
        let by_value = if largest { descending(a.0, b.0) } else { descending(b.0, a.0) };
        by_value.then(a.1.cmp(&b.1))
    }
}

/// The shape of one call: `outer` slices of `n` values `inner` apart.
#[derive(Debug, Clone, Copy)]
struct Slices {
    outer: usize,
    n: usize,
    inner: usize,
    k: usize,
    largest: bool,
}

/// `topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool
/// sorted=True) -> (Tensor values, Tensor indices)` (and `topk.values`).
pub(crate) fn topk(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 5)?;
    let x = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let k = int_arg(ctx, call, 1, "k")?;
    let dim_arg = if call.args.len() > 2 { int_arg(ctx, call, 2, "dim")? } else { -1 };
    let dim = wrap_dim(ctx, dim_arg, x.ndim())?;
    let largest = args.bool_or(3, "largest", true)?;
    let values = ctx.output(call, 0)?;
    let indices = ctx.output(call, 1)?;
    let shape = x.shape();
    let n = shape.get(dim).copied().unwrap_or(1);
    if k < 0 || k as usize > n {
        return Err(ctx.invalid("selected index k out of range"));
    }
    let k = k as usize;
    let mut expected = shape.to_vec();
    if let Some(d) = expected.get_mut(dim) {
        *d = k;
    }
    if values.shape() != expected.as_slice() || indices.shape() != expected.as_slice() {
        return Err(ctx.invalid(format!(
            "outputs have shapes {:?} and {:?}, expected {expected:?}",
            values.shape(),
            indices.shape()
        )));
    }
    if values.dtype() != x.dtype() || indices.dtype() != crate::dtype::DType::Int64 {
        return Err(ctx.invalid(format!(
            "expected values of dtype {} and int64 indices, got {} and {}",
            x.dtype(),
            values.dtype(),
            indices.dtype()
        )));
    }
    if !disjoint(&values, &x) || !disjoint(&indices, &x) || !disjoint(&values, &indices) {
        return Err(ctx.invalid("the outputs must not overlap each other or the input"));
    }
    if values.numel() == 0 {
        return Ok(None);
    }
    let outer = shape.get(..dim).map_or(1, |s| s.iter().product());
    let inner = shape.get(dim + 1..).map_or(1, |s| s.iter().product());
    let s = Slices { outer, n, inner, k, largest };
    Ok(Some(with_storage!(x.dtype(), T => topk_work::<T>(x, values, indices, s))))
}

fn topk_work<T: Element>(x: TensorView, values: TensorView, indices: TensorView, s: Slices) -> Work {
    Work::new(move || {
        let xs = read::<T>(&x);
        let block = s.k * s.inner;
        let mut vals = vec![T::ZERO; s.outer * block];
        let mut idxs = vec![0i64; s.outer * block];
        let select = |(o, (vb, ib)): (usize, (&mut [T], &mut [i64]))| {
            let mut pairs: Vec<(T, usize)> = Vec::with_capacity(s.n);
            for i in 0..s.inner {
                pairs.clear();
                let base = o * s.n * s.inner + i;
                pairs.extend((0..s.n).map(|j| (xs[base + j * s.inner], j)));
                let cmp = order::<T>(s.largest);
                if s.k < s.n {
                    pairs.select_nth_unstable_by(s.k, cmp);
                }
                let top = &mut pairs[..s.k];
                top.sort_unstable_by(cmp);
                for (j, &(v, index)) in top.iter().enumerate() {
                    vb[j * s.inner + i] = v;
                    ib[j * s.inner + i] = index as i64;
                }
            }
        };
        if s.outer > 1 && s.outer * s.n * s.inner >= PAR_MIN {
            vals.par_chunks_mut(block).zip(idxs.par_chunks_mut(block)).enumerate().for_each(select);
        } else {
            vals.chunks_mut(block).zip(idxs.chunks_mut(block)).enumerate().for_each(select);
        }
        write_with::<T>(&values, &[&x], |o| o.copy_from_slice(&vals));
        write_with::<i64>(&indices, &[&x], |o| o.copy_from_slice(&idxs));
        Ok(())
    })
}

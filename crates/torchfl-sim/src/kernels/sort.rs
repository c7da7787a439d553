//! Sorting along one dimension: `sort` (top-p sampling sorts the logits).
//! (`topk` has its own module, shared with detection models.)
//!
//! Order is PyTorch's: NaN is larger than every number (last when
//! ascending, first when descending), `-0.0 == 0.0`, and equal values keep
//! their original order (a stable sort; PyTorch's CPU sorts short rows
//! stably too, and `stable=True` always).
//!
//! Each line is moved to a contiguous row (`lines::to_rows`), rows are
//! sorted in parallel (a single long row with rayon's parallel stable
//! sort), and results are moved back. Keys are `f64` for floating dtypes
//! (exact for all of them) and `i64` for integers and bool.

use std::cmp::Ordering;

use rayon::prelude::*;

use super::elementwise::{gather, with_dense_output, PAR_MIN};
use super::lines::{from_rows, split, to_rows};
use super::softmax::{int_arg, wrap_dim};
use super::view::TensorView;
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::dtype::{with_storage, DType, Element};
use crate::error::Result;
use crate::runtime::Work;

/// A sort key: a total order with NaN largest and `-0.0 == 0.0`.
trait Key: Copy + Send + Sync + Default + 'static {
    fn of<T: Element>(v: T) -> Self;
    fn order(a: Self, b: Self) -> Ordering;
}

impl Key for f64 {
    #[inline(always)]
    fn of<T: Element>(v: T) -> Self {
        v.to_f64()
    }
    #[inline(always)]
    fn order(a: Self, b: Self) -> Ordering {
        match (a.is_nan(), b.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
        }
    }
}

impl Key for i64 {
    #[inline(always)]
    fn of<T: Element>(v: T) -> Self {
        v.to_i64()
    }
    #[inline(always)]
    fn order(a: Self, b: Self) -> Ordering {
        a.cmp(&b)
    }
}

/// The order of `(key, index)` pairs: by key (reversed when `descending`),
/// then by original index, which makes every sort stable and every
/// selection deterministic.
#[inline(always)]
fn pair_order<K: Key>(a: &(K, i64), b: &(K, i64), descending: bool) -> Ordering {
    let by_key = if descending { K::order(b.0, a.0) } else { K::order(a.0, b.0) };
    by_key.then(a.1.cmp(&b.1))
}

/// Sorts each row of `n` keys and keeps its first `k` entries: the
/// selected indices, row by row (`rows * k` of them).
fn select_rows<K: Key>(keys: &[K], n: usize, k: usize, descending: bool) -> Vec<i64> {
    let rows = keys.len() / n.max(1);
    let mut result = vec![0i64; rows * k];
    if k == 0 || n == 0 {
        return result;
    }
    let one = |(row, dst): (&[K], &mut [i64])| {
        let mut pairs: Vec<(K, i64)> = row.iter().enumerate().map(|(i, &v)| (v, i as i64)).collect();
        let cmp = |a: &(K, i64), b: &(K, i64)| pair_order(a, b, descending);
        if rows == 1 && n >= PAR_MIN {
            pairs.par_sort_by(cmp);
        } else if k < n / 8 {
            // Partition around the k-th, then sort the k selected.
            pairs.select_nth_unstable_by(k - 1, cmp);
            pairs[..k].sort_unstable_by(cmp);
        } else {
            // The index tie-break makes the unstable sort stable.
            pairs.sort_unstable_by(cmp);
        }
        for (d, p) in dst.iter_mut().zip(&pairs[..k]) {
            *d = p.1;
        }
    };
    if keys.len() >= PAR_MIN && rows > 1 {
        keys.par_chunks(n).zip(result.par_chunks_mut(k)).for_each(one);
    } else {
        keys.chunks(n).zip(result.chunks_mut(k)).for_each(one);
    }
    result
}

/// Sorts (`k == n`) or selects the top `k` of every line of `input` along
/// `dim`, writing the values and int64 indices.
fn sort_work<T: Element, K: Key>(
    input: TensorView,
    values: TensorView,
    indices: TensorView,
    dim: usize,
    k: usize,
    descending: bool,
) -> Work {
    Work::new(move || {
        let in_dims = split(input.shape(), dim);
        let (outer, n, inner) = in_dims;
        let x = gather::<T>(&input);
        let keys: Vec<K> = x.iter().map(|&v| K::of(v)).collect();
        let rows = to_rows(&keys, in_dims);
        let picked = select_rows::<K>(&rows, n, k, descending);
        // Values of each selected index, still row by row.
        let xr = to_rows(&x, in_dims);
        let mut vals = vec![T::ZERO; picked.len()];
        for (r, (dst, idx)) in vals.chunks_mut(k.max(1)).zip(picked.chunks(k.max(1))).enumerate() {
            for (d, &i) in dst.iter_mut().zip(idx) {
                *d = xr[r * n + i as usize];
            }
        }
        let out_dims = (outer, k, inner);
        with_dense_output::<T>(&values, |o| from_rows(&vals, o, out_dims));
        with_dense_output::<i64>(&indices, |o| from_rows(&picked, o, out_dims));
        Ok(())
    })
}

fn dispatch(
    input: TensorView,
    values: TensorView,
    indices: TensorView,
    dim: usize,
    k: usize,
    descending: bool,
) -> Work {
    let dtype = input.dtype();
    with_storage!(dtype, T => if dtype.is_floating() {
        sort_work::<T, f64>(input, values, indices, dim, k, descending)
    } else {
        sort_work::<T, i64>(input, values, indices, dim, k, descending)
    })
}

/// The two outputs of a sort or top-k: values (self's dtype) and int64
/// indices, both of `shape`.
fn outputs(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    input: &TensorView,
    shape: &[usize],
) -> Result<(TensorView, TensorView)> {
    let values = ctx.output(call, 0)?;
    let indices = ctx.output(call, 1)?;
    if values.dtype() != input.dtype() || indices.dtype() != DType::Int64 {
        return Err(ctx.invalid(format!(
            "values must have self's dtype {} and indices int64 (got {} and {})",
            input.dtype(),
            values.dtype(),
            indices.dtype()
        )));
    }
    if values.shape() != shape || indices.shape() != shape {
        return Err(ctx.invalid(format!(
            "values and indices must have shape {shape:?} (got {:?} and {:?})",
            values.shape(),
            indices.shape()
        )));
    }
    Ok((values, indices))
}

/// `sort.stable(Tensor self, *, bool? stable, int dim=-1, bool
/// descending=False) -> (Tensor values, Tensor indices)` (registered for
/// `sort.values_stable`).
pub(crate) fn sort_stable(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 4)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    if !matches!(call.args.get(1), None | Some(ArgRef::None | ArgRef::Bool(_))) {
        return Err(ctx.invalid("argument 1 (stable) must be a bool or None"));
    }
    let dim = match call.args.get(2) {
        None => -1,
        Some(_) => int_arg(ctx, call, 2, "dim")?,
    };
    let dim = wrap_dim(ctx, dim, input.ndim())?;
    let descending = args.bool_or(3, "descending", false)?;
    let shape = input.shape().to_vec();
    let (values, indices) = outputs(ctx, call, &input, &shape)?;
    if input.numel() == 0 {
        return Ok(None);
    }
    let n = split(input.shape(), dim).1;
    Ok(Some(dispatch(input, values, indices, dim, n, descending)))
}

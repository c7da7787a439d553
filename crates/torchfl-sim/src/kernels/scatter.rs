//! `gather`, `scatter` (`.src`, `.value`) and `scatter_add`: index along
//! one dimension with an index tensor of the same rank. Language models
//! gather the log-probabilities of chosen tokens (`logp.gather(-1,
//! tokens)`, whose backward is `scatter_add`), and top-p sampling scatters
//! its removal mask back to vocabulary order.
//!
//! The index is seen as lines along `dim`: line `(o, i)` fixes every
//! coordinate but `dim`, so it reads (gather) or writes (scatter) elements
//! that no other line touches. Lines run in parallel; along a line, writes
//! happen in index order, so a repeated index ends with the last write
//! (scatter) or sums in index order (scatter_add) — exactly PyTorch's CPU
//! results, deterministic where CUDA's are not. Indices are data: they are
//! range-checked when the work runs (no negative indices, as in PyTorch)
//! and an out-of-range one fails the work with PyTorch's message.

use rayon::prelude::*;

use super::elementwise::{gather as gather_dense, map1, scatter, with_dense_output, Input, PAR_MIN};
use super::lines::{split, SharedPtr};
use super::softmax::{int_arg, wrap_dim};
use super::view::{disjoint, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx, Scalar};
use crate::dtype::{with_storage, DType, Element};
use crate::error::{Error, Result};
use crate::runtime::Work;

/// Element offsets of every row-major position of `shape` under `strides`.
fn offsets(shape: &[usize], strides: &[isize]) -> Vec<isize> {
    let mut out = vec![0isize];
    for (&size, &stride) in shape.iter().zip(strides) {
        let mut next = Vec::with_capacity(out.len() * size);
        for &base in &out {
            for k in 0..size {
                next.push(base + k as isize * stride);
            }
        }
        out = next;
    }
    out
}

/// Offsets of the lines `(o, i)` of `shape` around `dim`, under the strides
/// of `v` (the `dim` coordinate excluded): `(outer offsets, inner
/// offsets)`. A 0-dim `v` beside a one-element 1-D index has no strides:
/// its only element is at offset 0.
fn line_offsets(shape: &[usize], v: &TensorView, dim: usize) -> (Vec<isize>, Vec<isize>) {
    let strides: Vec<isize> =
        if v.ndim() == shape.len() { v.strides().to_vec() } else { vec![0; shape.len()] };
    line_offsets_of(shape, &strides, dim)
}

/// [`line_offsets`] under explicit strides (one per dimension of `shape`).
fn line_offsets_of(shape: &[usize], strides: &[isize], dim: usize) -> (Vec<isize>, Vec<isize>) {
    if shape.is_empty() {
        return (vec![0], vec![0]);
    }
    (offsets(&shape[..dim], &strides[..dim]), offsets(&shape[dim + 1..], &strides[dim + 1..]))
}

fn stride_of(v: &TensorView, dim: usize) -> isize {
    v.strides().get(dim).copied().unwrap_or(0)
}

fn size_of_dim(v: &TensorView, dim: usize) -> usize {
    v.shape().get(dim).copied().unwrap_or(1)
}

/// Reads the index (int64 or int32) and checks every value lies in `[0, size)`.
fn checked_index(op: &str, index: &TensorView, dim: usize, size: usize) -> Result<Vec<i64>> {
    let idx = gather_dense::<i64>(index);
    if let Some(&bad) = idx.iter().find(|&&i| i < 0 || i as usize >= size) {
        return Err(Error::invalid(format!(
            "sim: {op}: index {bad} is out of bounds for dimension {dim} with size {size}"
        )));
    }
    Ok(idx)
}

/// The checks PyTorch's `gather`/`scatter` make on shapes: same rank, and
/// the index no larger than `self` (apart from `dim`) and than `src`.
fn check_index(
    ctx: &KernelCtx<'_>,
    input: &TensorView,
    dim: usize,
    index: &TensorView,
    src: Option<&TensorView>,
) -> Result<()> {
    if index.numel() == 0 {
        // PyTorch checks nothing about an empty index: nothing is read.
        return Ok(());
    }
    if !matches!(index.dtype(), DType::Int64 | DType::Int32) {
        return Err(ctx.invalid(format!("Expected dtype int32/int64 for index, got {}", index.dtype())));
    }
    if index.ndim().max(1) != input.ndim().max(1) {
        return Err(ctx.invalid("Index tensor must have the same number of dimensions as input tensor"));
    }
    for d in 0..index.ndim() {
        let n = index.shape()[d];
        if d != dim && n > size_of_dim(input, d) {
            return Err(ctx.invalid(format!(
                "Size does not match at dimension {d} expected index {:?} to be no larger than self {:?} \
                 apart from dimension {dim}",
                index.shape(),
                input.shape()
            )));
        }
        if let Some(src) = src {
            if n > size_of_dim(src, d) {
                return Err(ctx.invalid(format!(
                    "Expected index {:?} to be no larger than src {:?}",
                    index.shape(),
                    src.shape()
                )));
            }
        }
    }
    Ok(())
}

/// `gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False)
/// -> Tensor` (registered for `gather.out`): `out[c] = self[c with
/// c[dim] = index[c]]`.
pub(crate) fn gather(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 4)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let dim = wrap_dim(ctx, int_arg(ctx, call, 1, "dim")?, input.ndim())?;
    let index = ctx.device_view(args.tensor(2, "index")?, "index")?;
    args.bool_or(3, "sparse_grad", false)?;
    let out = ctx.output(call, 0)?;
    check_index(ctx, &input, dim, &index, None)?;
    if out.shape() != index.shape() || out.dtype() != input.dtype() {
        return Err(ctx.invalid(format!(
            "out must have the index's shape {:?} and self's dtype {} (got {:?}, {})",
            index.shape(),
            input.dtype(),
            out.shape(),
            out.dtype()
        )));
    }
    if !disjoint(&out, &input) || !disjoint(&out, &index) {
        return Err(ctx.invalid("unsupported operation: the output must not overlap the inputs"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        let size = size_of_dim(&input, dim);
        let idx = checked_index("gather", &index, dim, size)?;
        let (_, n, inner) = split(index.shape(), dim);
        let (outer_off, inner_off) = line_offsets(index.shape(), &input, dim);
        let step = stride_of(&input, dim);
        with_storage!(out.dtype(), T => {
            let base = SharedPtr::reading(input.addr() as *const T);
            with_dense_output::<T>(&out, |o| {
                let block = |(b, dst): (usize, &mut [T])| {
                    for j in 0..n {
                        for (i, &io) in inner_off.iter().enumerate() {
                            let p = (b * n + j) * inner + i;
                            let off = outer_off[b] + io + idx[p] as isize * step;
                            // SAFETY: every coordinate is inside `self`
                            // (index no larger apart from `dim`, index
                            // values checked), a validated view.
                            dst[j * inner + i] = unsafe { base.read(off) };
                        }
                    }
                };
                let width = (n * inner).max(1);
                if o.len() >= PAR_MIN {
                    o.par_chunks_mut(width).enumerate().for_each(block);
                } else {
                    o.chunks_mut(width).enumerate().for_each(block);
                }
            });
        });
        Ok(())
    })))
}

/// What a scatter writes.
#[derive(Debug, Clone, Copy)]
enum Source {
    Tensor,
    Value(Scalar),
}

#[inline(always)]
fn add_elem<T: Element>(a: T, b: T) -> T {
    if T::DTYPE.is_floating() {
        // Exact in f64, so one rounding: the storage type's own sum.
        T::from_f64(a.to_f64() + b.to_f64())
    } else {
        T::from_i64(a.to_i64().wrapping_add(b.to_i64()))
    }
}

/// The lines of an index along `dim`, and its values.
struct Lines<'a> {
    outer: usize,
    n: usize,
    inner: usize,
    idx: &'a [i64],
    parallel: bool,
}

impl Lines<'_> {
    /// `dst[line offset + idx[p] * step] = combine(old, value(p))` for every
    /// index position `p`, lines in parallel and in index order along each.
    ///
    /// # Safety
    /// Every offset must address a valid element of `dst`, and distinct
    /// lines must address distinct elements (no other access meanwhile).
    unsafe fn apply<E: Copy + Send>(
        &self,
        dst: SharedPtr<E>,
        (outer_off, inner_off, step): (&[isize], &[isize], isize),
        value: impl Fn(usize) -> E + Sync,
        combine: impl Fn(E, E) -> E + Sync,
    ) {
        let block = |b: usize| {
            for (i, &io) in inner_off.iter().enumerate() {
                for j in 0..self.n {
                    let p = (b * self.n + j) * self.inner + i;
                    let at = dst.at(outer_off[b] + io + self.idx[p] as isize * step);
                    // SAFETY: caller contract.
                    unsafe { *at = combine(*at, value(p)) };
                }
            }
        };
        if self.parallel {
            (0..self.outer).into_par_iter().for_each(block);
        } else {
            (0..self.outer).for_each(block);
        }
    }
}

/// Row-major strides of `shape`.
fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut s = 1isize;
    for d in (0..shape.len()).rev() {
        strides[d] = s;
        s *= shape[d].max(1) as isize;
    }
    strides
}

#[allow(clippy::too_many_arguments)]
fn scatter_work<T: Element>(
    input: TensorView,
    index: TensorView,
    src: Option<TensorView>,
    value: T,
    out: TensorView,
    dim: usize,
    accumulate: bool,
    op: &'static str,
) -> Work {
    Work::new(move || {
        if !out.same_layout(&input) {
            // The out= form starts from a copy of self.
            with_storage!(out.dtype(), S => map1::<S, S, _>(out.clone(), Input::View(input.clone()), |x| x).run()?);
        }
        let size = size_of_dim(&out, dim);
        let idx = checked_index(op, &index, dim, size)?;
        let (outer, n, inner) = split(index.shape(), dim);
        let (out_outer, out_inner) = line_offsets(index.shape(), &out, dim);
        let out_step = stride_of(&out, dim);
        // Source values in index order (src may be larger than the index).
        let vals: Option<Vec<T>> = src.as_ref().map(|s| {
            let (so, si) = line_offsets(index.shape(), s, dim);
            let s_step = stride_of(s, dim);
            let base = s.addr() as *const T;
            let mut v = Vec::with_capacity(index.numel());
            for &ob in &so {
                for j in 0..n {
                    for &ii in &si {
                        // SAFETY: inside `src` (index no larger than src in
                        // every dimension), a validated view.
                        v.push(unsafe { base.offset(ob + ii + j as isize * s_step).read() });
                    }
                }
            }
            v
        });
        let lines = Lines { outer, n, inner, idx: &idx, parallel: index.numel() >= PAR_MIN };
        if accumulate && matches!(out.dtype(), DType::Float16 | DType::BFloat16) {
            // PyTorch's CPU adds half types in float and rounds each
            // element once at the end: work on a dense float copy.
            let mut acc = gather_dense::<f32>(&out);
            let dense = contiguous_strides(out.shape());
            let (d_outer, d_inner) = line_offsets_of(index.shape(), &dense, dim);
            let step = dense.get(dim).copied().unwrap_or(0);
            let v = |p: usize| vals.as_ref().map_or(value, |vals| vals[p]).to_f32();
            // SAFETY: `acc` holds every element of `out` densely; offsets
            // are in range (index values checked) and disjoint per line.
            unsafe { lines.apply(SharedPtr(acc.as_mut_ptr()), (&d_outer, &d_inner, step), v, |a, x| a + x) };
            scatter(&out, &acc);
        } else {
            let v = |p: usize| vals.as_ref().map_or(value, |vals| vals[p]);
            let combine = |a: T, x: T| if accumulate { add_elem(a, x) } else { x };
            // SAFETY: inside `out` (validated, index values checked), which
            // has no internal overlap (checked at launch), so lines write
            // disjoint elements.
            unsafe {
                lines.apply(SharedPtr(out.addr() as *mut T), (&out_outer, &out_inner, out_step), v, combine)
            };
        }
        Ok(())
    })
}

fn scatter_impl(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    source: Source,
    accumulate: bool,
) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 4, 4)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let dim = wrap_dim(ctx, int_arg(ctx, call, 1, "dim")?, input.ndim())?;
    let index = ctx.device_view(args.tensor(2, "index")?, "index")?;
    let src = match source {
        Source::Tensor => {
            let s = ctx.device_view(args.tensor(3, "src")?, "src")?;
            if s.dtype() != input.dtype() {
                return Err(ctx.invalid(format!(
                    "Expected self.dtype to be equal to src.dtype (got {} and {})",
                    input.dtype(),
                    s.dtype()
                )));
            }
            Some(s)
        }
        Source::Value(_) => None,
    };
    let out = ctx.output(call, 0)?;
    check_index(ctx, &input, dim, &index, src.as_ref())?;
    if out.shape() != input.shape() || out.dtype() != input.dtype() {
        return Err(ctx.invalid("out must have self's shape and dtype"));
    }
    if !out.same_layout(&input) && !disjoint(&out, &input) {
        return Err(ctx.invalid("unsupported operation: out partially overlaps self"));
    }
    if !disjoint(&out, &index) || src.as_ref().is_some_and(|s| !disjoint(&out, s)) {
        return Err(ctx.invalid("unsupported operation: the output must not overlap index or src"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    let dtype = out.dtype();
    let op = if accumulate { "scatter_add" } else { "scatter" };
    with_storage!(dtype, T => {
        let value: T = match source {
            Source::Value(s) => ctx.scalar_to::<T>(s, dtype)?,
            Source::Tensor => T::ZERO,
        };
        if index.numel() == 0 && out.same_layout(&input) {
            return Ok(None);
        }
        Ok(Some(scatter_work::<T>(input, index, src, value, out, dim, accumulate, op)))
    })
}

/// `scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor`
/// (and `scatter_.src`; registered for `scatter.src_out`).
pub(crate) fn scatter_src(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    scatter_impl(ctx, call, Source::Tensor, false)
}

/// `scatter.value(Tensor self, int dim, Tensor index, Scalar value) ->
/// Tensor` (and `scatter_.value`; registered for `scatter.value_out`).
pub(crate) fn scatter_value(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let value = match call.args.get(3) {
        Some(ArgRef::Scalar(s)) => *s,
        Some(ArgRef::Int(v)) => Scalar::Int(*v),
        Some(ArgRef::Float(v)) => Scalar::Float(*v),
        Some(ArgRef::Bool(v)) => Scalar::Bool(*v),
        _ => return Err(ctx.invalid("argument 3 (value) must be a Scalar")),
    };
    scatter_impl(ctx, call, Source::Value(value), false)
}

/// `scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor`
/// (and `scatter_add_`; registered for `scatter_add.out`).
pub(crate) fn scatter_add(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    scatter_impl(ctx, call, Source::Tensor, true)
}

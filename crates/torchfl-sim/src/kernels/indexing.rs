//! Indexing and joining: `index_select` (which also serves `embedding`,
//! a composite of it), `embedding_dense_backward` and `cat`.
//!
//! All three move sub-tensors: a slice of the source at a fixed index of
//! one dimension to a slice of the output. [`copy_region`] copies one such
//! strided region (memcpy for dense runs, converting dtypes when they
//! differ, as `cat` of mixed dtypes needs). Indices are data, so they are
//! range-checked when the work runs and reported with PyTorch's message.
//! `embedding_dense_backward` groups token positions by row (a stable
//! counting sort) and sums each row's gradients in position order, in
//! parallel over rows, so the result is deterministic.

use rayon::prelude::*;

use super::elementwise::{dense_input, gather, load, store, with_dense_output, Plan, MAX_OPS, PAR_MIN};
use super::softmax::{int_arg, wrap_dim};
use super::view::{disjoint, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::dtype::{with_storage, DType};
use crate::error::{Error, Result};
use crate::runtime::Work;

/// A strided region of device memory: element address of index 0, shape,
/// element strides and dtype.
#[derive(Debug, Clone, Copy)]
struct Region<'a> {
    addr: usize,
    shape: &'a [usize],
    strides: &'a [isize],
    dtype: DType,
}

/// Copies `src` to `dst` (same shape), converting the dtype if needed.
///
/// # Safety
/// Every element of both regions must lie inside live validated memory
/// (`src` readable, `dst` writable), and no other thread may access the
/// elements of `dst` concurrently.
unsafe fn copy_region(dst: Region<'_>, src: Region<'_>) {
    let n: usize = dst.shape.iter().product();
    if n == 0 {
        return;
    }
    let (di, si) = (dst.dtype.itemsize(), src.dtype.itemsize());
    let plan = Plan::new(dst.shape, &[(dst.addr, dst.strides, di), (src.addr, src.strides, si)], true);
    plan.for_each_run(0..n, [0; MAX_OPS], |p, s, len| {
        if dst.dtype == src.dtype {
            if s[0] == di as isize && s[1] == si as isize {
                // SAFETY: `len` dense elements of both regions (plan over
                // validated regions, caller contract); disjoint unless the
                // same memory, which `copy` (memmove) allows.
                unsafe { std::ptr::copy(p[1] as *const u8, p[0] as *mut u8, len * di) };
            } else {
                for j in 0..len as isize {
                    // SAFETY: as above, element by element.
                    unsafe {
                        std::ptr::copy(
                            p[1].wrapping_add_signed(j * s[1]) as *const u8,
                            p[0].wrapping_add_signed(j * s[0]) as *mut u8,
                            di,
                        )
                    };
                }
            }
        } else {
            with_storage!(dst.dtype, T => {
                let mut buf = [<T as crate::dtype::Element>::ZERO; 256];
                let mut i = 0;
                while i < len {
                    let m = 256.min(len - i);
                    // SAFETY: addresses inside the regions (caller contract).
                    unsafe {
                        load::<T>(src.dtype, p[1].wrapping_add_signed(i as isize * s[1]), s[1], &mut buf[..m]);
                        store::<T>(dst.dtype, p[0].wrapping_add_signed(i as isize * s[0]), s[0], &buf[..m]);
                    }
                    i += m;
                }
            })
        }
    });
}

/// Shape and strides of `v` without dimension `dim`.
fn drop_dim(v: &TensorView, dim: usize) -> (Vec<usize>, Vec<isize>) {
    let mut shape = v.shape().to_vec();
    let mut strides = v.strides().to_vec();
    if dim < shape.len() {
        shape.remove(dim);
        strides.remove(dim);
    }
    (shape, strides)
}

/// Reads a 0-d or 1-d integer index tensor.
fn index_view(ctx: &KernelCtx<'_>, v: TensorView, role: &str) -> Result<TensorView> {
    if !matches!(v.dtype(), DType::Int64 | DType::Int32) {
        return Err(ctx.invalid(format!("{role}: expected scalar type Long or Int but found {}", v.dtype())));
    }
    Ok(v)
}

/// `index_select(Tensor self, int dim, Tensor index) -> Tensor`:
/// `out.select(dim, j) = self.select(dim, index[j])`.
pub(crate) fn index_select(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 3)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let dim = wrap_dim(ctx, int_arg(ctx, call, 1, "dim")?, input.ndim())?;
    let index = index_view(ctx, ctx.device_view(args.tensor(2, "index")?, "index")?, "index")?;
    let out = ctx.output(call, 0)?;
    if index.ndim() > 1 {
        return Err(ctx.invalid("index_select(): Index is supposed to be a vector"));
    }
    if out.dtype() != input.dtype() {
        return Err(ctx.invalid(format!(
            "index_select(): self and result must have the same scalar type, got {} and {}",
            input.dtype(),
            out.dtype()
        )));
    }
    let k = index.numel();
    let mut expected = input.shape().to_vec();
    if expected.is_empty() {
        if k != 1 {
            return Err(ctx.invalid("index_select(): Index to scalar can have only 1 value"));
        }
    } else {
        expected[dim] = k;
    }
    if out.shape() != expected.as_slice() {
        return Err(ctx.invalid(format!("output has shape {:?}, expected {expected:?}", out.shape())));
    }
    if !disjoint(&out, &input) || !disjoint(&out, &index) {
        return Err(ctx.invalid("unsupported operation: the output must not overlap the inputs"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        let idx = gather::<i64>(&index);
        let size = input.shape().get(dim).copied().unwrap_or(1) as i64;
        if let Some(&bad) = idx.iter().find(|&&i| i < 0 || i >= size) {
            return Err(Error::invalid(format!(
                "sim: index_select: index out of range in self (index {bad}, size {size})"
            )));
        }
        let (sub_shape, in_strides) = drop_dim(&input, dim);
        let (_, out_strides) = drop_dim(&out, dim);
        let in_step = input.strides().get(dim).copied().unwrap_or(0) * input.itemsize() as isize;
        let out_step = out.strides().get(dim).copied().unwrap_or(0) * out.itemsize() as isize;
        let copy = |j: usize| {
            let dst = Region {
                addr: out.addr().wrapping_add_signed(j as isize * out_step),
                shape: &sub_shape,
                strides: &out_strides,
                dtype: out.dtype(),
            };
            let src = Region {
                addr: input.addr().wrapping_add_signed(idx[j] as isize * in_step),
                shape: &sub_shape,
                strides: &in_strides,
                dtype: input.dtype(),
            };
            // SAFETY: both regions are sub-views (one index fixed, checked
            // in range above) of validated views; the output is disjoint
            // from the inputs, and distinct `j` write distinct elements
            // when the output does not overlap itself (checked before
            // running in parallel).
            unsafe { copy_region(dst, src) };
        };
        if out.numel() >= PAR_MIN && out.is_non_overlapping() {
            (0..k).into_par_iter().for_each(copy);
        } else {
            (0..k).for_each(copy);
        }
        Ok(())
    })))
}

/// `cat(Tensor[] tensors, int dim=0) -> Tensor` (and `cat.out`): inputs
/// are converted to the output's (promoted) dtype; legacy empty 1-D
/// tensors (shape `[0]`) are skipped, as PyTorch does.
pub(crate) fn cat(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 2)?;
    let list = match call.args.first() {
        Some(ArgRef::TensorList(l)) => l,
        _ => return Err(ctx.invalid("argument 0 (tensors) must be a tensor list")),
    };
    let dim_arg = match call.args.get(1) {
        None => 0,
        Some(_) => int_arg(ctx, call, 1, "dim")?,
    };
    let _ = &args;
    let out = ctx.output(call, 0)?;
    let mut inputs = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let t = t.as_ref().ok_or_else(|| ctx.invalid(format!("tensors[{i}] is None")))?;
        let v = ctx.device_view(t, "tensors")?;
        if v.ndim() == 1 && v.shape()[0] == 0 {
            continue;
        }
        inputs.push(v);
    }
    if list.is_empty() {
        return Err(ctx.invalid("torch.cat(): expected a non-empty list of Tensors"));
    }
    let Some(first) = inputs.first() else {
        // Only legacy empty tensors: the output is empty too.
        return Ok(None);
    };
    if first.ndim() == 0 {
        return Err(ctx.invalid("zero-dimensional tensor (at position 0) cannot be concatenated"));
    }
    let nd = first.ndim();
    let dim = wrap_dim(ctx, dim_arg, nd)?;
    let mut total = 0usize;
    for (i, v) in inputs.iter().enumerate() {
        if v.ndim() != nd {
            return Err(ctx
                .invalid(format!("Tensors must have same number of dimensions: got {nd} and {}", v.ndim())));
        }
        for d in 0..nd {
            if d != dim && v.shape()[d] != first.shape()[d] {
                return Err(ctx.invalid(format!(
                    "Sizes of tensors must match except in dimension {dim}. Expected size {} but got size \
                     {} for tensor number {i} in the list.",
                    first.shape()[d],
                    v.shape()[d]
                )));
            }
        }
        if !disjoint(v, &out) {
            return Err(ctx.invalid(
                "unsupported operation: the input tensors cannot refer to any of the output memory \
                 locations. Found overlap in input tensor",
            ));
        }
        total += v.shape()[dim];
    }
    let mut expected = first.shape().to_vec();
    expected[dim] = total;
    if out.shape() != expected.as_slice() {
        return Err(ctx.invalid(format!("output has shape {:?}, expected {expected:?}", out.shape())));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        let step = out.strides()[dim] * out.itemsize() as isize;
        let mut offsets = Vec::with_capacity(inputs.len());
        let mut off = 0usize;
        for v in &inputs {
            offsets.push(off);
            off += v.shape()[dim];
        }
        let copy = |(v, &o): (&TensorView, &usize)| {
            let dst = Region {
                addr: out.addr().wrapping_add_signed(o as isize * step),
                shape: v.shape(),
                strides: out.strides(),
                dtype: out.dtype(),
            };
            let src = Region { addr: v.addr(), shape: v.shape(), strides: v.strides(), dtype: v.dtype() };
            // SAFETY: the destination is the slice [o, o + size) of the
            // validated output along `dim` (sizes checked to add up), the
            // source a validated input disjoint from the output; slices of
            // distinct inputs are distinct elements when the output does
            // not overlap itself (checked before running in parallel).
            unsafe { copy_region(dst, src) };
        };
        if out.numel() >= PAR_MIN && out.is_non_overlapping() {
            inputs.par_iter().zip(offsets.par_iter()).for_each(copy);
        } else {
            inputs.iter().zip(offsets.iter()).for_each(copy);
        }
        Ok(())
    })))
}

fn embedding_backward_work<C>(
    grad: TensorView,
    indices: TensorView,
    out: TensorView,
    padding_idx: i64,
    scale_by_freq: bool,
) -> Work
where
    C: super::real::Real,
{
    Work::new(move || {
        let rows = out.shape()[0];
        let d = out.shape()[1];
        let idx = gather::<i64>(&indices);
        if let Some(&bad) = idx.iter().find(|&&i| i < 0 || i as usize >= rows) {
            return Err(Error::invalid(format!(
                "sim: embedding_dense_backward: index {bad} is out of range for {rows} embeddings"
            )));
        }
        // Stable counting sort of positions by row.
        let mut start = vec![0usize; rows + 1];
        for &i in &idx {
            start[i as usize + 1] += 1;
        }
        for r in 0..rows {
            start[r + 1] += start[r];
        }
        let mut fill = start.clone();
        let mut order = vec![0usize; idx.len()];
        for (pos, &i) in idx.iter().enumerate() {
            order[fill[i as usize]] = pos;
            fill[i as usize] += 1;
        }
        let g = dense_input::<C>(&grad, &out);
        with_dense_output::<C>(&out, |o| {
            let row = |(r, orow): (usize, &mut [C])| {
                orow.fill(C::of(0.0));
                if r as i64 == padding_idx {
                    return;
                }
                let positions = &order[start[r]..start[r + 1]];
                for &pos in positions {
                    for (ov, &gv) in orow.iter_mut().zip(&g[pos * d..(pos + 1) * d]) {
                        *ov += gv;
                    }
                }
                if scale_by_freq && positions.len() > 1 {
                    let s = C::of(1.0 / positions.len() as f64);
                    for ov in orow.iter_mut() {
                        *ov *= s;
                    }
                }
            };
            if d == 0 {
                return;
            }
            if o.len() >= PAR_MIN {
                o.par_chunks_mut(d).enumerate().for_each(row);
            } else {
                o.chunks_mut(d).enumerate().for_each(row);
            }
        });
        Ok(())
    })
}

/// `embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt
/// num_weights, SymInt padding_idx, bool scale_grad_by_freq) -> Tensor`:
/// `grad_weight[indices[k]] += grad_output[k]` (rows at `padding_idx`
/// stay 0; with `scale_grad_by_freq` each row is divided by its count).
pub(crate) fn embedding_dense_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 5, 5)?;
    let grad = ctx.device_view(args.tensor(0, "grad_output")?, "grad_output")?;
    let indices = index_view(ctx, ctx.device_view(args.tensor(1, "indices")?, "indices")?, "indices")?;
    let num_weights = int_arg(ctx, call, 2, "num_weights")?;
    let padding_idx = int_arg(ctx, call, 3, "padding_idx")?;
    let scale = args.bool_or(4, "scale_grad_by_freq", false)?;
    let out = ctx.output(call, 0)?;
    if !out.dtype().is_floating() {
        return Err(ctx.unimplemented(format!("{} is not supported", out.dtype())));
    }
    let d = grad.shape().last().copied().unwrap_or(1);
    if out.shape() != [num_weights.max(0) as usize, d] || grad.numel() != indices.numel() * d {
        return Err(ctx.invalid(format!(
            "grad_output {:?} must be indices {:?} plus an embedding dimension, and the output [{num_weights}, {d}] \
             (got {:?})",
            grad.shape(),
            indices.shape(),
            out.shape()
        )));
    }
    if !disjoint(&out, &grad) {
        return Err(ctx.invalid("unsupported operation: the output must not overlap the inputs"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(if out.dtype() == DType::Float64 {
        embedding_backward_work::<f64>(grad, indices, out, padding_idx, scale)
    } else {
        embedding_backward_work::<f32>(grad, indices, out, padding_idx, scale)
    }))
}

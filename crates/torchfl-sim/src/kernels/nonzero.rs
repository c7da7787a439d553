//! Operators whose output shape depends on data: `nonzero` (what
//! `torch.where(cond)` and detection's box filtering dispatch) and
//! `masked_select`.
//!
//! They are flagged `TFL_OP_DYNAMIC_SHAPE`: the host passes outputs of
//! shape `[0]`, and the kernel waits for its inputs (the work queued before
//! it on its stream), counts, resizes the outputs through the host's
//! `resize_output` and fills them before returning. That wait is the
//! device-to-host synchronization these operators cost on CUDA too. The
//! count and the fill run in parallel chunks, each chunk writing from the
//! offset the counts before it give, so the result is in row-major order
//! whatever the split.

use rayon::prelude::*;

use super::elementwise::{gather, GRAIN, PAR_MIN};
use super::linalg::read;
use super::view::{broadcast_shapes, disjoint, TensorView};
use super::{Args, Frame, KernelCtx};
use crate::dtype::DType;
use crate::dtype::{with_storage, Element};
use crate::error::Result;
use crate::runtime::Work;

/// The positions of the non-zero elements of `v` (row-major), counted and
/// listed in parallel chunks.
fn hits(flags: &[bool]) -> Vec<usize> {
    if flags.len() < PAR_MIN {
        return flags.iter().enumerate().filter(|(_, &f)| f).map(|(i, _)| i).collect();
    }
    let chunks: Vec<Vec<usize>> = flags
        .par_chunks(GRAIN)
        .enumerate()
        .map(|(c, chunk)| chunk.iter().enumerate().filter(|(_, &f)| f).map(|(i, _)| c * GRAIN + i).collect())
        .collect();
    chunks.concat()
}

/// Whether each element of `v` is non-zero (NaN is).
fn nonzero_flags(v: &TensorView) -> Vec<bool> {
    with_storage!(v.dtype(), T => {
        let data = read::<T>(v);
        if data.len() >= PAR_MIN {
            data.par_iter().map(|x| x.to_bool()).collect()
        } else {
            data.iter().map(|x| x.to_bool()).collect()
        }
    })
}

/// `nonzero(Tensor self) -> Tensor` (and `nonzero.out`): an int64
/// `[n, ndim]` tensor of the coordinates of the `n` non-zero elements.
pub(crate) fn nonzero(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    let x = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let out = ctx.output(call, 0)?;
    if out.dtype() != DType::Int64 {
        return Err(ctx.invalid(format!("the output must be int64, got {}", out.dtype())));
    }
    ctx.wait_for_inputs(call)?;
    let found = hits(&nonzero_flags(&x));
    let ndim = x.ndim();
    let out = ctx.resize_output(call, 0, &[found.len() as i64, ndim as i64])?;
    if !disjoint(&out, &x) {
        return Err(ctx.invalid("the output must not overlap the input"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    let shape = x.shape().to_vec();
    let mut coords = vec![0i64; found.len() * ndim];
    let fill = |(row, &p): (&mut [i64], &usize)| {
        let mut rem = p;
        for d in (0..ndim).rev() {
            row[d] = (rem % shape[d]) as i64;
            rem /= shape[d];
        }
    };
    if coords.len() >= PAR_MIN {
        coords.par_chunks_mut(ndim).zip(found.par_iter()).for_each(fill);
    } else {
        coords.chunks_mut(ndim).zip(found.iter()).for_each(fill);
    }
    super::linalg::write_with::<i64>(&out, &[&x], |o| o.copy_from_slice(&coords));
    Ok(None)
}

/// `masked_select(Tensor self, Tensor mask) -> Tensor` (and
/// `masked_select.out`): the elements of `self` where `mask` (broadcast
/// together) is true, as a 1-D tensor in row-major order.
pub(crate) fn masked_select(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let x = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let mask = ctx.device_view(args.tensor(1, "mask")?, "mask")?;
    let out = ctx.output(call, 0)?;
    if !matches!(mask.dtype(), DType::Bool | DType::UInt8) {
        return Err(ctx.invalid(format!("masked_select: expected BoolTensor for mask, got {}", mask.dtype())));
    }
    if out.dtype() != x.dtype() {
        return Err(ctx.invalid(format!("the output has dtype {}, expected {}", out.dtype(), x.dtype())));
    }
    let shape = broadcast_shapes(&[x.shape(), mask.shape()]).map_err(|m| ctx.invalid(m))?;
    let bad =
        |v: TensorView| ctx.invalid(format!("shape {:?} cannot be broadcast to {:?}", v.shape(), shape));
    let xb = x.broadcast_to(&shape).ok_or_else(|| bad(x.clone()))?;
    let mb = mask.broadcast_to(&shape).ok_or_else(|| bad(mask.clone()))?;
    ctx.wait_for_inputs(call)?;
    let flags: Vec<bool> = gather::<i64>(&mb).iter().map(|&m| m != 0).collect();
    let found = hits(&flags);
    let out = ctx.resize_output(call, 0, &[found.len() as i64])?;
    if !disjoint(&out, &x) || !disjoint(&out, &mask) {
        return Err(ctx.invalid("the output must not overlap the inputs"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    with_storage!(x.dtype(), T => select_into::<T>(&xb, &out, &found));
    Ok(None)
}

fn select_into<T: Element>(x: &TensorView, out: &TensorView, found: &[usize]) {
    let data = gather::<T>(x);
    let picked: Vec<T> = if found.len() >= PAR_MIN {
        found.par_iter().map(|&p| data[p]).collect()
    } else {
        found.iter().map(|&p| data[p]).collect()
    };
    super::linalg::write_with::<T>(out, &[x], |o| o.copy_from_slice(&picked));
}

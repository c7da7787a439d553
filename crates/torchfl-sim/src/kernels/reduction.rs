//! Reduction operators: `sum`, `sum.dim_IntList`, `mean.dim`.

use super::dtype::DType;
use super::reduce::{self, Finish};
use super::view::disjoint;
use super::{Args, Frame, KernelCtx};
use crate::error::Result;
use crate::stream::Work;

/// Normalises a dim list (PyTorch's `maybe_wrap_dim` plus the duplicate
/// check) into a per-dimension mask; `None` or an empty list reduce all.
fn reduce_mask(ctx: &KernelCtx<'_>, ndim: usize, dims: Option<&[i64]>) -> Result<Vec<bool>> {
    let dims = match dims {
        None | Some([]) => return Ok(vec![true; ndim]),
        Some(d) => d,
    };
    let mut mask = vec![false; ndim];
    let wrap = ndim.max(1) as i64;
    for &d in dims {
        if d < -wrap || d >= wrap {
            return Err(ctx.invalid(format!(
                "Dimension out of range (expected to be in range of [{}, {}], but got {d})",
                -wrap,
                wrap - 1
            )));
        }
        let w = if d < 0 { d + wrap } else { d } as usize;
        if ndim == 0 {
            continue;
        }
        if mask[w] {
            return Err(ctx.invalid(format!("dim {w} appears multiple times in the list of dims")));
        }
        mask[w] = true;
    }
    Ok(mask)
}

fn reduction(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    dims: Option<Vec<i64>>,
    keepdim: bool,
    dtype: Option<DType>,
    finish: Finish,
) -> Result<Option<Work>> {
    let input = ctx.device_view(
        match call.args.first() {
            Some(super::ArgRef::Tensor(t)) => t,
            _ => return Err(ctx.invalid("argument 0 (self) must be a tensor")),
        },
        "self",
    )?;
    let out = ctx.output(call, 0)?;
    let mask = reduce_mask(ctx, input.ndim(), dims.as_deref())?;
    if let Some(d) = dtype {
        if d != out.dtype() {
            return Err(
                ctx.invalid(format!("dtype argument {d} does not match the output's dtype {}", out.dtype()))
            );
        }
    }
    if finish == Finish::Mean {
        if dtype.is_none() && !input.dtype().is_floating() {
            return Err(ctx.invalid(format!(
                "mean(): could not infer output dtype. Input dtype must be either a floating \
                 point or complex dtype. Got: {}",
                input.dtype()
            )));
        }
        if !out.dtype().is_floating() {
            return Err(ctx.invalid(format!(
                "mean(): could not infer output dtype. Optional dtype must be either a floating \
                 point or complex dtype. Got: {}",
                out.dtype()
            )));
        }
    }
    let expected: Vec<usize> = input
        .shape()
        .iter()
        .zip(&mask)
        .filter_map(|(&s, &r)| match (r, keepdim) {
            (false, _) => Some(s),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    if out.shape() != expected.as_slice() {
        return Err(ctx.invalid(format!(
            "output has shape {:?} but the reduction of {:?} gives {:?}",
            out.shape(),
            input.shape(),
            expected
        )));
    }
    if !disjoint(&out, &input) {
        return Err(
            ctx.invalid("unsupported operation: the output of a reduction must not overlap its input")
        );
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(reduce::sum(input, out, mask, finish)))
}

/// `sum(Tensor self, *, ScalarType? dtype=None)`
pub(crate) fn sum(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 2)?;
    args.tensor(0, "self")?;
    let dtype = args.opt_dtype(1, "dtype")?;
    reduction(ctx, call, None, false, dtype, Finish::Sum)
}

/// `sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *,
/// ScalarType? dtype=None)`
pub(crate) fn sum_dim(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 4)?;
    args.tensor(0, "self")?;
    let dims = args.opt_int_list(1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    let dtype = args.opt_dtype(3, "dtype")?;
    reduction(ctx, call, dims, keepdim, dtype, Finish::Sum)
}

/// `mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *,
/// ScalarType? dtype=None)`
pub(crate) fn mean_dim(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 4)?;
    args.tensor(0, "self")?;
    let dims = args.opt_int_list(1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    let dtype = args.opt_dtype(3, "dtype")?;
    reduction(ctx, call, dims, keepdim, dtype, Finish::Mean)
}

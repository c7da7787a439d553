//! Reductions (`kernels::reduce`): `sum`, `sum.dim_IntList`, `mean.dim`,
//! `max`/`min` (all elements, and `.dim` with indices), `amax`/`amin` and
//! `argmax`/`argmin`; and the argument helpers the softmax and loss
//! families share.

use crate::abi::frame::Call;
use crate::error::{Error, Result};
use crate::kernels::{reduce_select, reduce_sum, Number, Selected};

/// Argument `i` as a bool, or `default` when left out (`n` arguments).
pub(super) fn bool_or(c: &Call<'_>, n: usize, i: usize, default: bool) -> Result<bool> {
    if i < n {
        c.bool(i)
    } else {
        Ok(default)
    }
}

/// Wraps a possibly negative dimension of an `ndim`-dimensional tensor (a
/// 0-dim tensor takes 0 and -1), with PyTorch's message.
pub(super) fn wrap_dim(op: &str, dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim.max(1) as i64;
    if dim < -n || dim >= n {
        return Err(Error::invalid(format!(
            "opencl: {op}: Dimension out of range (expected to be in range of [{}, {}], but got {dim})",
            -n,
            n - 1
        )));
    }
    Ok(if dim < 0 { dim + n } else { dim } as usize)
}

/// Argument `i` as a dimension list: `None` when absent or None, one
/// dimension for an `int`, or an `int[]`.
fn dims_arg(c: &Call<'_>, n: usize, i: usize) -> Result<Option<Vec<i64>>> {
    if i >= n {
        return Ok(None);
    }
    match c.opt_number(i) {
        Ok(None) => Ok(None),
        Ok(Some(Number::Int(d))) => Ok(Some(vec![d])),
        _ => Ok(c.opt_ints(i)?.map(<[i64]>::to_vec)),
    }
}

/// The reduced dimensions of an `ndim`-dimensional tensor as a mask; `None`
/// or an empty list reduce them all. Checks range and duplicates.
fn reduce_mask(op: &str, ndim: usize, dims: Option<&[i64]>) -> Result<Vec<bool>> {
    let dims = match dims {
        None | Some([]) => return Ok(vec![true; ndim]),
        Some(d) => d,
    };
    let mut mask = vec![false; ndim];
    for &d in dims {
        let w = wrap_dim(op, d, ndim)?;
        if ndim == 0 {
            continue;
        }
        if mask[w] {
            return Err(Error::invalid(format!(
                "opencl: {op}: dim {w} appears multiple times in the list of dims"
            )));
        }
        mask[w] = true;
    }
    Ok(mask)
}

fn sum_impl(c: &Call<'_>, dims: Option<Vec<i64>>, keepdim: bool, mean: bool) -> Result<()> {
    let (x, out) = (c.tensor(0)?, c.output(0)?);
    let mask = reduce_mask(c.op(), x.shape.len(), dims.as_deref())?;
    reduce_sum(&c.launch(), &x, &out, (&mask, keepdim), mean)
}

/// `sum(Tensor self, *, ScalarType? dtype=None)`: the output's dtype is
/// the one asked for.
pub(in crate::abi) fn sum(c: &Call<'_>) -> Result<()> {
    c.expect_range(1, 2, 1)?;
    sum_impl(c, None, false, false)
}

/// `sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *,
/// ScalarType? dtype=None)`; no (or an empty) `dim` reduces everything.
pub(in crate::abi) fn sum_dim(c: &Call<'_>) -> Result<()> {
    let n = c.expect_range(2, 4, 1)?;
    sum_impl(c, dims_arg(c, n, 1)?, bool_or(c, n, 2, false)?, false)
}

/// `mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *,
/// ScalarType? dtype=None)`.
pub(in crate::abi) fn mean_dim(c: &Call<'_>) -> Result<()> {
    let n = c.expect_range(2, 4, 1)?;
    sum_impl(c, dims_arg(c, n, 1)?, bool_or(c, n, 2, false)?, true)
}

/// Which outputs a selection writes.
#[derive(Debug, Clone, Copy)]
enum Outputs {
    Values,
    Indices,
    Both,
}

fn select_impl(
    c: &Call<'_>,
    (dims, keepdim): (Option<Vec<i64>>, bool),
    outputs: Outputs,
    is_max: bool,
    label: &str,
) -> Result<()> {
    let x = c.tensor(0)?;
    let mask = reduce_mask(c.op(), x.shape.len(), dims.as_deref())?;
    let first = c.output(0)?;
    let second = match outputs {
        Outputs::Both => Some(c.output(1)?),
        _ => None,
    };
    let out = match outputs {
        Outputs::Values => Selected { values: Some(&first), indices: None },
        Outputs::Indices => Selected { values: None, indices: Some(&first) },
        Outputs::Both => Selected { values: Some(&first), indices: second.as_ref() },
    };
    reduce_select(&c.launch(), label, &x, out, (&mask, keepdim), is_max)
}

/// `argmax`/`argmin(Tensor self, int? dim=None, bool keepdim=False)`: with
/// no `dim`, the flat index (every dimension kept as 1 with `keepdim`).
fn arg(c: &Call<'_>, is_max: bool, label: &str) -> Result<()> {
    let n = c.expect_range(1, 3, 1)?;
    let dims = dims_arg(c, n, 1)?;
    select_impl(c, (dims, bool_or(c, n, 2, false)?), Outputs::Indices, is_max, label)
}

/// `argmax(Tensor self, int? dim=None, bool keepdim=False)`.
pub(in crate::abi) fn argmax(c: &Call<'_>) -> Result<()> {
    arg(c, true, "argmax")
}

/// `argmin(Tensor self, int? dim=None, bool keepdim=False)`.
pub(in crate::abi) fn argmin(c: &Call<'_>) -> Result<()> {
    arg(c, false, "argmin")
}

/// `max.dim`/`min.dim(Tensor self, int dim, bool keepdim=False) -> (values, indices)`.
fn along(c: &Call<'_>, is_max: bool, label: &str) -> Result<()> {
    let n = c.expect_range(2, 3, 2)?;
    let dim = c.int(1)?;
    select_impl(c, (Some(vec![dim]), bool_or(c, n, 2, false)?), Outputs::Both, is_max, label)
}

/// `max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)`.
pub(in crate::abi) fn max_dim(c: &Call<'_>) -> Result<()> {
    along(c, true, "max")
}

/// `min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)`.
pub(in crate::abi) fn min_dim(c: &Call<'_>) -> Result<()> {
    along(c, false, "min")
}

/// `amax`/`amin(Tensor self, int[1] dim=[], bool keepdim=False)`: an empty
/// `dim` reduces everything.
fn extreme(c: &Call<'_>, is_max: bool, label: &str) -> Result<()> {
    let n = c.expect_range(1, 3, 1)?;
    let dims = dims_arg(c, n, 1)?;
    select_impl(c, (dims, bool_or(c, n, 2, false)?), Outputs::Values, is_max, label)
}

/// `amax(Tensor self, int[1] dim=[], bool keepdim=False)`.
pub(in crate::abi) fn amax(c: &Call<'_>) -> Result<()> {
    extreme(c, true, "amax")
}

/// `amin(Tensor self, int[1] dim=[], bool keepdim=False)`.
pub(in crate::abi) fn amin(c: &Call<'_>) -> Result<()> {
    extreme(c, false, "amin")
}

/// `max(Tensor self)`: the maximum of all elements (NaN wins).
pub(in crate::abi) fn max(c: &Call<'_>) -> Result<()> {
    c.expect_range(1, 1, 1)?;
    select_impl(c, (None, false), Outputs::Values, true, "max")
}

/// `min(Tensor self)`: the minimum of all elements (NaN wins).
pub(in crate::abi) fn min(c: &Call<'_>) -> Result<()> {
    c.expect_range(1, 1, 1)?;
    select_impl(c, (None, false), Outputs::Values, false, "min")
}

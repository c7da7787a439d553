//! Indexing and joining (`kernels::index`): `index_select` (which also
//! serves `embedding`, a composite of it), `embedding_dense_backward` and
//! `cat`, checked as PyTorch checks them.
//!
//! Index values are not checked: they are device data, and reading them
//! would wait for the stream. An index out of range reads nothing out of
//! bounds: `index_select` writes 0 for it, `embedding_dense_backward`
//! leaves it out (PyTorch reports "index out of range in self").

use crate::abi::frame::Call;
use crate::error::{Error, Result};
use crate::kernels::{self, Elem, View};

/// `dim` wrapped into `0..ndim` (a 0-dim tensor takes 0 and -1).
fn wrap_dim(c: &Call<'_>, dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim.max(1) as i64;
    if dim < -n || dim >= n {
        return Err(Error::invalid(format!(
            "opencl: {}: Dimension out of range (expected to be in range of [{}, {}], but got {dim})",
            c.op(),
            -n,
            n - 1
        )));
    }
    Ok(if dim < 0 { dim + n } else { dim } as usize)
}

/// Checks an index tensor is int64 (int32 ones are UNIMPLEMENTED: the
/// plugin has no int32 dtype, so they do not reach here).
fn int64_index(c: &Call<'_>, v: &View<'_>, what: &str) -> Result<()> {
    if v.elem != Elem::I64 {
        return Err(Error::invalid(format!(
            "opencl: {}: {what}: expected scalar type Long or Int but found {}",
            c.op(),
            v.elem.c_name()
        )));
    }
    Ok(())
}

/// `index_select(Tensor self, int dim, Tensor index) -> Tensor`.
pub(in crate::abi) fn index_select(c: &Call<'_>) -> Result<()> {
    c.expect(3, 1)?;
    let (x, index, out) = (c.tensor(0)?, c.tensor(2)?, c.output(0)?);
    let dim = wrap_dim(c, c.int(1)?, x.shape.len())?;
    int64_index(c, &index, "index_select(): Expected dtype int32/int64 for index")?;
    if index.shape.len() > 1 {
        return Err(Error::invalid(format!(
            "opencl: {}: index_select(): Index is supposed to be a vector",
            c.op()
        )));
    }
    if out.elem != x.elem {
        return Err(Error::invalid(format!(
            "opencl: {}: index_select(): self and result must have the same scalar type",
            c.op()
        )));
    }
    let k = index.shape.first().copied().unwrap_or(1);
    let mut expected = x.shape.to_vec();
    if expected.is_empty() {
        if k != 1 {
            return Err(Error::invalid(format!(
                "opencl: {}: index_select(): Index to scalar can have only 1 value, got {k} value(s)",
                c.op()
            )));
        }
    } else {
        expected[dim] = k;
    }
    if out.shape != expected.as_slice() {
        return Err(Error::invalid(format!(
            "opencl: {}: output has shape {:?}, expected {expected:?}",
            c.op(),
            out.shape
        )));
    }
    if k > 0 && x.shape.get(dim) == Some(&0) {
        return Err(Error::invalid(format!("opencl: {}: index out of range in self", c.op())));
    }
    kernels::index_select(&c.launch(), &x, dim, &index, &out)
}

/// `embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt
/// num_weights, SymInt padding_idx, bool scale_grad_by_freq) -> Tensor`.
pub(in crate::abi) fn embedding_dense_backward(c: &Call<'_>) -> Result<()> {
    c.expect(5, 1)?;
    let (grad, indices, out) = (c.tensor(0)?, c.tensor(1)?, c.output(0)?);
    let (num_weights, padding_idx, scale) = (c.int(2)?, c.int(3)?, c.bool(4)?);
    int64_index(c, &indices, "embedding_backward: indices")?;
    let d = grad.shape.last().copied().unwrap_or(1);
    let k: i64 = indices.shape.iter().product();
    // As PyTorch's CPU kernel, grad_output is read as [K, D] in row-major order.
    let rows_match = k.checked_mul(d) == Some(grad.shape.iter().product()) && !grad.shape.is_empty();
    if out.shape != [num_weights, d] || !rows_match {
        return Err(Error::invalid(format!(
            "opencl: {}: grad_output {:?} must be indices {:?} plus an embedding dimension, and the output \
             [{num_weights}, {d}] (got {:?})",
            c.op(),
            grad.shape,
            indices.shape,
            out.shape
        )));
    }
    kernels::embedding_dense_backward(&c.launch(), &grad, &indices, &out, padding_idx, scale)
}

/// `cat(Tensor[] tensors, int dim=0) -> Tensor`: inputs convert to the
/// output's (promoted) dtype; legacy empty 1-D tensors (shape `[0]`) are
/// skipped, as PyTorch skips them.
pub(in crate::abi) fn cat(c: &Call<'_>) -> Result<()> {
    let n = c.expect_range(1, 2, 1)?;
    let list = c.tensors(0)?;
    let dim = if n > 1 { c.int(1)? } else { 0 };
    let out = c.output(0)?;
    if list.is_empty() {
        return Err(Error::invalid(format!(
            "opencl: {}: torch.cat(): expected a non-empty list of Tensors",
            c.op()
        )));
    }
    let inputs: Vec<View<'_>> = list.into_iter().filter(|v| v.shape != [0]).collect();
    let Some(first) = inputs.first() else {
        // Only legacy empty tensors: so is the output.
        return Ok(());
    };
    let nd = first.shape.len();
    if nd == 0 {
        return Err(Error::invalid(format!(
            "opencl: {}: zero-dimensional tensor (at position 0) cannot be concatenated",
            c.op()
        )));
    }
    let dim = wrap_dim(c, dim, nd)?;
    let mut total = 0i64;
    for (i, v) in inputs.iter().enumerate() {
        if v.shape.len() != nd {
            return Err(Error::invalid(format!(
                "opencl: {}: Tensors must have same number of dimensions: got {nd} and {}",
                c.op(),
                v.shape.len()
            )));
        }
        if let Some(d) = (0..nd).find(|&d| d != dim && v.shape[d] != first.shape[d]) {
            return Err(Error::invalid(format!(
                "opencl: {}: Sizes of tensors must match except in dimension {dim}. Expected size {} but got \
                 size {} for tensor number {i} in the list.",
                c.op(),
                first.shape[d],
                v.shape[d]
            )));
        }
        total += v.shape[dim];
    }
    let mut expected = first.shape.to_vec();
    expected[dim] = total;
    if out.shape != expected.as_slice() {
        return Err(Error::invalid(format!(
            "opencl: {}: output has shape {:?}, expected {expected:?}",
            c.op(),
            out.shape
        )));
    }
    kernels::cat(&c.launch(), &inputs, dim, &out)
}

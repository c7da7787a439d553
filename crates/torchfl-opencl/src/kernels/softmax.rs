//! Softmax and log-softmax along one dimension, forward and backward
//! (`softmax.cl`), computed in float: one local row of work items per row
//! of the softmax dimension (kernels/reduce.rs's geometry), the row's
//! maximum subtracted first.

use super::reduce::{group_range, lanes_for};
use super::{enqueue, type_options, Args, Elem, Launch, View};
use crate::error::{Error, Result};

const SOURCE: &str = concat!(include_str!("common.cl"), include_str!("group.cl"), include_str!("softmax.cl"));

/// A view's shape and strides with dimension `dim` moved last (a 0-dim
/// view becomes one row of one element).
fn dim_last(v: &View<'_>, dim: usize) -> (Vec<i64>, Vec<i64>) {
    if v.shape.is_empty() {
        return (vec![1], vec![0]);
    }
    let order = (0..v.shape.len()).filter(|&d| d != dim).chain([dim]);
    order.map(|d| (v.shape[d], v.strides[d])).unzip()
}

/// Checks the operands are floating and of one shape; returns (rows, n).
fn rows(name: &str, dim: usize, views: &[&View<'_>]) -> Result<(i64, i64)> {
    let first = views[0];
    if let Some(v) = views.iter().find(|v| !v.elem.is_float()) {
        return Err(Error::unimplemented(format!("opencl: {name}: an operand of dtype {}", v.elem.c_name())));
    }
    if let Some(v) = views.iter().find(|v| v.shape != first.shape) {
        return Err(Error::invalid(format!(
            "opencl: {name}: operands of shapes {:?} and {:?}",
            first.shape, v.shape
        )));
    }
    let n = first.shape.get(dim).copied().unwrap_or(1);
    let numel: i64 = first.shape.iter().product();
    Ok((if n == 0 { 0 } else { numel / n }, n))
}

/// `out = softmax(input)` (or `log_softmax` when `log`) along `dim`
/// (wrapped); `out` may be float for a half input (`half_to_float`).
pub(crate) fn softmax(l: &Launch<'_>, input: &View<'_>, out: &View<'_>, dim: usize, log: bool) -> Result<()> {
    let Launch { rt, stream, op: name, .. } = *l;
    let device = stream.device;
    let (rows, n) = rows(name, dim, &[input, out])?;
    if rows == 0 {
        return Ok(());
    }
    let options = type_options(rt, device, name, &[("TX", input.elem), ("TO", out.elem)], Elem::F32)?;
    let (xs, xt) = dim_last(input, dim);
    let (os, ot) = dim_last(out, dim);
    let mut args = Args::new();
    args.tensor(l, "self", &View { shape: &xs, strides: &xt, ..*input })?
        .tensor(l, "the output", &View { shape: &os, strides: &ot, ..*out })?
        .long(rows)
        .long(n)
        .int(i32::from(log));
    let (global, local) = group_range(rows, lanes_for(n));
    let options = options + " -DTC_FLOAT";
    enqueue(l, (SOURCE, "softmax_forward"), options, &args, &global, Some(&local))
}

/// The input gradient of softmax (or log-softmax when `log`) along `dim`
/// (wrapped), from its output and the output's gradient.
pub(crate) fn softmax_backward(
    l: &Launch<'_>,
    (grad, output): (&View<'_>, &View<'_>),
    grad_input: &View<'_>,
    dim: usize,
    log: bool,
) -> Result<()> {
    let Launch { rt, stream, op: name, .. } = *l;
    let device = stream.device;
    let (rows, n) = rows(name, dim, &[grad, output, grad_input])?;
    if rows == 0 {
        return Ok(());
    }
    if grad.elem != output.elem {
        return Err(Error::unimplemented(format!(
            "opencl: {name}: grad_output of dtype {} and output of dtype {}",
            grad.elem.c_name(),
            output.elem.c_name()
        )));
    }
    let options = type_options(rt, device, name, &[("TX", grad.elem), ("TO", grad_input.elem)], Elem::F32)?;
    let (gs, gt) = dim_last(grad, dim);
    let (ys, yt) = dim_last(output, dim);
    let (os, ot) = dim_last(grad_input, dim);
    let mut args = Args::new();
    args.tensor(l, "grad_output", &View { shape: &gs, strides: &gt, ..*grad })?
        .tensor(l, "output", &View { shape: &ys, strides: &yt, ..*output })?
        .tensor(l, "grad_input", &View { shape: &os, strides: &ot, ..*grad_input })?
        .long(rows)
        .long(n)
        .int(i32::from(log));
    let (global, local) = group_range(rows, lanes_for(n));
    let options = options + " -DTC_FLOAT";
    enqueue(l, (SOURCE, "softmax_backward"), options, &args, &global, Some(&local))
}

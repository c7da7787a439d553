//! The negative log-likelihood loss, forward and backward
//! (`kernels::loss`): `nll_loss_forward`, `nll_loss_backward` (the second
//! half of `F.cross_entropy`) and their spatial forms `nll_loss2d_*`.

use crate::abi::frame::Call;
use crate::error::{Error, Result};
use crate::kernels::{as_nchw, as_nhw, nll_backward, nll_forward, Nll, View};

/// The checked operands of either direction: the target as `[N, H, W]`,
/// whether the reduction is none over a batch (a loss per entry), and the
/// entries' count.
struct Checked {
    target_shape: (Vec<i64>, Vec<i64>),
    per_entry: bool,
    entries: i64,
}

/// PyTorch's checks of input, target, weight and reduction (`two_d`: the
/// `nll_loss2d` shapes).
fn check(
    op: &str,
    x: &View<'_>,
    target: &View<'_>,
    weight: Option<&View<'_>>,
    reduction: i64,
    two_d: bool,
) -> Result<Checked> {
    if !(0..=2).contains(&reduction) {
        return Err(Error::invalid(format!("opencl: {op}: {reduction} is not a valid value for reduction")));
    }
    let (xs, ts) = (x.shape, target.shape);
    if two_d {
        if xs.len() != 4 {
            return Err(Error::invalid(format!(
                "opencl: {op}: only batches of spatial inputs supported (4D tensors), but got input of \
                 dimension: {}",
                xs.len()
            )));
        }
        if ts.len() != 3 {
            return Err(Error::invalid(format!(
                "opencl: {op}: only batches of spatial targets supported (3D tensors) but got targets of \
                 dimension: {}",
                ts.len()
            )));
        }
        if xs[0] != ts[0] || xs[2] != ts[1] || xs[3] != ts[2] {
            return Err(Error::invalid(format!(
                "opencl: {op}: input and target batch or spatial sizes don't match: target {ts:?}, input {xs:?}"
            )));
        }
    } else {
        if xs.is_empty() || xs.len() > 2 {
            return Err(Error::invalid(format!("opencl: {op}: input tensor should be 1D or 2D")));
        }
        if ts.len() > 1 {
            return Err(Error::invalid(format!(
                "opencl: {op}: 0D or 1D target tensor expected, multi-target not supported"
            )));
        }
        if xs.len() == 1 && !ts.is_empty() {
            // PyTorch's odd case of a [C] input with a [C] target.
            return Err(Error::unimplemented(format!("opencl: {op}: a 1-D input with a 1-D target")));
        }
        if xs.len() == 2 && xs[0] != ts.first().copied().unwrap_or(1) {
            return Err(Error::invalid(format!(
                "opencl: {op}: Expected input batch_size ({}) to match target batch_size ({}).",
                xs[0],
                ts.first().copied().unwrap_or(1)
            )));
        }
    }
    let classes = if two_d { xs[1] } else { xs[xs.len() - 1] };
    if let Some(w) = weight {
        if w.shape.iter().product::<i64>() != classes {
            return Err(Error::invalid(format!(
                "opencl: {op}: weight tensor should be defined either for all {classes} classes or no classes \
                 but got weight tensor of shape: {:?}",
                w.shape
            )));
        }
    }
    let target_shape = as_nhw(target);
    let entries = target_shape.0.iter().product();
    Ok(Checked { target_shape, per_entry: reduction == 0 && (two_d || xs.len() == 2), entries })
}

fn forward(c: &Call<'_>, two_d: bool) -> Result<()> {
    c.expect(5, 2)?;
    let (x, target, weight) = (c.tensor(0)?, c.tensor(1)?, c.opt_tensor(2)?);
    let (reduction, ignore_index) = (c.int(3)?, c.int(4)?);
    let (output, total_weight) = (c.output(0)?, c.output(1)?);
    let op = c.op();
    let k = check(op, &x, &target, weight.as_ref(), reduction, two_d)?;
    let want: &[i64] = if k.per_entry { target.shape } else { &[] };
    if output.shape != want || total_weight.shape.iter().product::<i64>() != 1 {
        return Err(Error::invalid(format!(
            "opencl: {op}: outputs of shapes {:?} and {:?}, expected {want:?} and []",
            output.shape, total_weight.shape
        )));
    }
    let nll = Nll { target: (&target, &k.target_shape), weight: weight.as_ref(), reduction, ignore_index };
    let x_shape = as_nchw(&x);
    let outputs = (&output, &total_weight);
    nll_forward(&c.launch(), (&x, &x_shape), nll, outputs, k.per_entry)
}

/// `nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int
/// reduction, SymInt ignore_index) -> (Tensor output, Tensor total_weight)`.
pub(in crate::abi) fn nll_loss_forward(c: &Call<'_>) -> Result<()> {
    forward(c, false)
}

/// `nll_loss2d_forward(...)`: `nll_loss_forward` over `[N, C, H, W]` with
/// an `[N, H, W]` target.
pub(in crate::abi) fn nll_loss2d_forward(c: &Call<'_>) -> Result<()> {
    forward(c, true)
}

fn backward(c: &Call<'_>, two_d: bool) -> Result<()> {
    c.expect(7, 1)?;
    let (grad, x, target, weight) = (c.tensor(0)?, c.tensor(1)?, c.tensor(2)?, c.opt_tensor(3)?);
    let (reduction, ignore_index, total_weight) = (c.int(4)?, c.int(5)?, c.tensor(6)?);
    let grad_input = c.output(0)?;
    let op = c.op();
    let k = check(op, &x, &target, weight.as_ref(), reduction, two_d)?;
    let numel = |v: &View<'_>| v.shape.iter().product::<i64>();
    if numel(&total_weight) != 1 {
        return Err(Error::invalid(format!(
            "opencl: {op}: expected total_weight to be a single element tensor, got: {:?} ({} elements)",
            total_weight.shape,
            numel(&total_weight)
        )));
    }
    let expected = if k.per_entry { k.entries } else { 1 };
    if numel(&grad) != expected || (k.per_entry && grad.shape != target.shape) {
        return Err(Error::invalid(format!(
            "opencl: {op}: Expected a tensor of dimension 1 and tensor.size[0] == {expected} but got: dimension \
             {} and tensor.size[0] == {}",
            grad.shape.len(),
            grad.shape.first().copied().unwrap_or(1)
        )));
    }
    if grad_input.shape != x.shape {
        return Err(Error::invalid(format!(
            "opencl: {op}: grad_input has shape {:?}, expected {:?}",
            grad_input.shape, x.shape
        )));
    }
    // A scalar gradient is read at every entry (strides 0).
    let grad_shape =
        if k.per_entry { as_nhw(&grad) } else { (k.target_shape.0.clone(), vec![0; k.target_shape.0.len()]) };
    let gi_shape = as_nchw(&grad_input);
    let nll = Nll { target: (&target, &k.target_shape), weight: weight.as_ref(), reduction, ignore_index };
    let (g, gi) = ((&grad, &grad_shape), (&grad_input, &gi_shape));
    nll_backward(&c.launch(), g, nll, &total_weight, gi)
}

/// `nll_loss_backward(Tensor grad_output, Tensor self, Tensor target,
/// Tensor? weight, int reduction, SymInt ignore_index, Tensor total_weight)`.
pub(in crate::abi) fn nll_loss_backward(c: &Call<'_>) -> Result<()> {
    backward(c, false)
}

/// `nll_loss2d_backward(...)`: `nll_loss_backward` over `[N, C, H, W]`.
pub(in crate::abi) fn nll_loss2d_backward(c: &Call<'_>) -> Result<()> {
    backward(c, true)
}

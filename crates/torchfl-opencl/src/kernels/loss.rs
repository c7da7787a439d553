//! The negative log-likelihood loss, forward and backward (`loss.cl`):
//! `nll_loss_*` over `[C]` or `[N, C]` inputs and `nll_loss2d_*` over
//! `[N, C, H, W]` ones, computed in float.
//!
//! Every operand is reshaped (as views: sizes and strides only) to the
//! kernels' four- or three-dimensional form: the input and its gradient as
//! `[N, C, H, W]`, the target and per-entry losses or gradients as
//! `[N, H, W]`. Sums over entries run in one work group in a fixed order,
//! so they are deterministic. A target out of range is not read: its term
//! is NaN, where the CPU raises "Target t is out of bounds." (a kernel
//! cannot, and checking first would cost a synchronising read).

use super::reduce::GROUP;
use super::{enqueue, type_options, work_items, Args, Elem, Launch, View};
use crate::error::{Error, Result};

const SOURCE: &str = concat!(include_str!("common.cl"), include_str!("group.cl"), include_str!("loss.cl"));

/// Sizes and strides of a reshaped view.
type Shape = (Vec<i64>, Vec<i64>);

/// The input (or its gradient) as `[N, C, H, W]`: `[C]` is `[1, C, 1, 1]`,
/// `[N, C]` is `[N, C, 1, 1]`.
pub(crate) fn as_nchw(v: &View<'_>) -> Shape {
    match (v.shape, v.strides) {
        ([c], [sc]) => (vec![1, *c, 1, 1], vec![0, *sc, 0, 0]),
        ([n, c], [sn, sc]) => (vec![*n, *c, 1, 1], vec![*sn, *sc, 0, 0]),
        _ => (v.shape.to_vec(), v.strides.to_vec()),
    }
}

/// A per-entry tensor (target, losses, gradients) as `[N, H, W]`: `[]` is
/// `[1, 1, 1]`, `[N]` is `[N, 1, 1]`.
pub(crate) fn as_nhw(v: &View<'_>) -> Shape {
    match (v.shape, v.strides) {
        ([], []) => (vec![1, 1, 1], vec![0, 0, 0]),
        ([n], [sn]) => (vec![*n, 1, 1], vec![*sn, 0, 0]),
        _ => (v.shape.to_vec(), v.strides.to_vec()),
    }
}

/// A view with the sizes and strides of `shape`.
fn reshaped<'s>(v: &View<'_>, shape: &'s Shape) -> View<'s> {
    View { addr: v.addr, elem: v.elem, shape: &shape.0, strides: &shape.1 }
}

/// The operands both directions share: the target (int64), the optional
/// class weights, the reduction (0 none, 1 mean, 2 sum) and the ignored
/// class.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Nll<'v, 'a> {
    /// The target, as `[N, H, W]` ([`as_nhw`]).
    pub(crate) target: (&'v View<'a>, &'v Shape),
    /// The class weights.
    pub(crate) weight: Option<&'v View<'a>>,
    /// 0 none, 1 mean, 2 sum.
    pub(crate) reduction: i64,
    /// The target value whose entries count for nothing.
    pub(crate) ignore_index: i64,
}

impl Nll<'_, '_> {
    /// Pushes the target and weight arguments.
    fn push(&self, l: &Launch<'_>, args: &mut Args) -> Result<()> {
        let (target, shape) = self.target;
        args.tensor(l, "target", &reshaped(target, shape))?;
        args.opt_tensor(l, "weight", self.weight)?;
        Ok(())
    }

    /// Checks dtypes: the target int64, the weight of the input's dtype.
    fn check(&self, name: &str, elem: Elem) -> Result<()> {
        if self.target.0.elem != Elem::I64 {
            return Err(Error::invalid(format!(
                "opencl: {name}: expected scalar type Long but found {}",
                self.target.0.elem.c_name()
            )));
        }
        match self.weight {
            Some(w) if w.elem != elem => Err(Error::unimplemented(format!(
                "opencl: {name}: a weight of dtype {} for an input of dtype {}",
                w.elem.c_name(),
                elem.c_name()
            ))),
            _ => Ok(()),
        }
    }
}

/// The loss: `output` per entry when `per_entry` (reduction none over a
/// batch; `total_weight` 0), else the sum (or mean) of the entries' losses
/// with `total_weight` their summed weight.
pub(crate) fn nll_forward(
    l: &Launch<'_>,
    input: (&View<'_>, &Shape),
    nll: Nll<'_, '_>,
    (output, total_weight): (&View<'_>, &View<'_>),
    per_entry: bool,
) -> Result<()> {
    let Launch { rt, stream, op: name, .. } = *l;
    let device = stream.device;
    let (x, x_shape) = input;
    if !x.elem.is_float() || !output.elem.is_float() || !total_weight.elem.is_float() {
        return Err(Error::unimplemented(format!("opencl: {name}: non-floating operands")));
    }
    nll.check(name, x.elem)?;
    let options =
        type_options(rt, device, name, &[("TX", x.elem), ("TO", output.elem)], Elem::F32)? + " -DTC_FLOAT";
    if total_weight.elem != output.elem {
        return Err(Error::unimplemented(format!("opencl: {name}: outputs of two dtypes")));
    }
    let out_shape = as_nhw(output);
    let mut args = Args::new();
    args.tensor(l, "self", &reshaped(x, x_shape))?;
    nll.push(l, &mut args)?;
    args.tensor(l, "output", &reshaped(output, &out_shape))?
        .tensor(l, "total_weight", total_weight)?
        .long(nll.ignore_index);
    if per_entry {
        let entries = work_items(&nll.target.1 .0);
        // One work item at least: item 0 writes total_weight.
        let global = [entries.max(1)];
        enqueue(l, (SOURCE, "nll_forward_none"), options, &args, &global, None)
    } else {
        args.int(i32::from(nll.reduction == 1));
        let range = [GROUP, 1];
        enqueue(l, (SOURCE, "nll_forward_reduce"), options, &args, &range, Some(&range))
    }
}

/// The input's gradient, `grad_input` as `[N, C, H, W]` ([`as_nchw`]),
/// from the output's gradient (per entry when the reduction is none over a
/// batch, else a scalar) and the forward's total weight.
pub(crate) fn nll_backward(
    l: &Launch<'_>,
    grad: (&View<'_>, &Shape),
    nll: Nll<'_, '_>,
    total_weight: &View<'_>,
    grad_input: (&View<'_>, &Shape),
) -> Result<()> {
    let Launch { rt, stream, op: name, .. } = *l;
    let device = stream.device;
    let ((g, g_shape), (gi, gi_shape)) = (grad, grad_input);
    if [g.elem, total_weight.elem, gi.elem].iter().any(|e| !e.is_float()) {
        return Err(Error::unimplemented(format!("opencl: {name}: non-floating operands")));
    }
    if g.elem != total_weight.elem {
        return Err(Error::unimplemented(format!(
            "opencl: {name}: grad_output and total_weight of two dtypes"
        )));
    }
    nll.check(name, g.elem)?;
    let options =
        type_options(rt, device, name, &[("TX", g.elem), ("TO", gi.elem)], Elem::F32)? + " -DTC_FLOAT";
    let mut args = Args::new();
    args.tensor(l, "grad_output", &reshaped(g, g_shape))?;
    nll.push(l, &mut args)?;
    args.tensor(l, "total_weight", total_weight)?
        .tensor(l, "grad_input", &reshaped(gi, gi_shape))?
        .long(nll.ignore_index)
        .int(nll.reduction as i32);
    let n = work_items(&gi_shape.0);
    enqueue(l, (SOURCE, "nll_backward"), options, &args, &[n], None)
}

//! Normalization kernels (`norm.cl`): batch norm forward and backward as
//! one work group per channel (statistics reduced across the group in a
//! fixed order, then every element of the channel written by the same
//! group), layer norm forward and input gradient as one work item per row,
//! and its weight and bias gradients as one work item per normalized
//! element looping over the rows. No atomics: results are deterministic.
//!
//! Every tensor of a call has one floating dtype (float32, or float16
//! computed in float32); mixed dtypes are UNIMPLEMENTED (the CPU runs
//! them).

use super::{compute_type, enqueue, type_options, work_items, Args, Elem, Launch, View};
use crate::error::{Error, Result};

const SOURCE: &str = concat!(include_str!("common.cl"), include_str!("norm.cl"));

/// Work items per batch-norm work group (`BN_WG` in norm.cl).
const BN_GROUP: usize = 64;

/// Where a call's kernels run, and its name for messages.
#[derive(Clone, Copy)]
pub(crate) struct NormCall<'a> {
    /// Where it runs: the runtime, programs, stream and operator.
    pub(crate) l: Launch<'a>,
}

impl NormCall<'_> {
    /// Build options for tensors of `elem`: UNIMPLEMENTED unless every
    /// tensor in `others` has that dtype and it is floating.
    fn options<'v>(&self, elem: Elem, others: impl IntoIterator<Item = &'v View<'v>>) -> Result<String> {
        if !elem.is_float() || others.into_iter().any(|v| v.elem != elem) {
            return Err(Error::unimplemented(format!(
                "opencl: {}: the normalization kernels take float32 or float16 tensors of one dtype",
                self.l.op
            )));
        }
        type_options(self.l.rt, self.l.stream.device, self.l.op, &[("T", elem)], compute_type(elem))
    }

    fn tensor(&self, args: &mut Args, what: &str, view: &View<'_>) -> Result<()> {
        args.tensor(&self.l, what, view).map(drop)
    }

    fn opt_tensor(&self, args: &mut Args, what: &str, view: Option<&View<'_>>) -> Result<()> {
        args.opt_tensor(&self.l, what, view).map(drop)
    }

    fn vector(&self, args: &mut Args, what: &str, view: &View<'_>) -> Result<()> {
        args.vector(&self.l, what, view).map(drop)
    }

    fn opt_vector(&self, args: &mut Args, what: &str, view: Option<&View<'_>>) -> Result<()> {
        args.opt_vector(&self.l, what, view).map(drop)
    }

    fn enqueue(
        &self,
        kernel: &'static str,
        options: String,
        args: &Args,
        global: usize,
        local: Option<usize>,
    ) -> Result<()> {
        let local = local.map(|l| [l]);
        enqueue(&self.l, (SOURCE, kernel), options, args, &[global], local.as_ref().map(|l| &l[..]))
    }
}

/// A batch norm forward over an `[N, C, *]` input.
pub(crate) struct BatchNorm<'v> {
    /// The input.
    pub(crate) input: View<'v>,
    /// The output (the input's shape).
    pub(crate) out: View<'v>,
    /// Per-channel scale.
    pub(crate) weight: Option<View<'v>>,
    /// Per-channel shift.
    pub(crate) bias: Option<View<'v>>,
    /// Running mean: updated in training, read in evaluation.
    pub(crate) running_mean: Option<View<'v>>,
    /// Running variance: updated (unbiased) in training, read in evaluation.
    pub(crate) running_var: Option<View<'v>>,
    /// Batch mean (evaluation: the running mean), written when present.
    pub(crate) save_mean: Option<View<'v>>,
    /// Batch inverse standard deviation (evaluation: from the running
    /// variance), written when present.
    pub(crate) save_invstd: Option<View<'v>>,
    /// Batch statistics (true) or running ones.
    pub(crate) training: bool,
    /// The running statistics' update rate.
    pub(crate) momentum: f64,
    /// Added to the variance.
    pub(crate) eps: f64,
}

/// Batch norm forward: in training one work group per channel, in
/// evaluation (both running statistics present) one work item per element.
pub(crate) fn batch_norm(on: &NormCall<'_>, p: &BatchNorm<'_>) -> Result<()> {
    let vectors = [&p.weight, &p.bias, &p.running_mean, &p.running_var, &p.save_mean, &p.save_invstd];
    let options =
        on.options(p.input.elem, std::iter::once(&p.out).chain(vectors.iter().copied().flatten()))?;
    let channels = usize::try_from(p.input.shape.get(1).copied().unwrap_or(0)).unwrap_or(0);
    let mut args = Args::new();
    on.tensor(&mut args, "input", &p.input)?;
    on.tensor(&mut args, "the output", &p.out)?;
    on.opt_vector(&mut args, "weight", p.weight.as_ref())?;
    on.opt_vector(&mut args, "bias", p.bias.as_ref())?;
    if !p.training {
        let (Some(mean), Some(var)) = (&p.running_mean, &p.running_var) else {
            return Err(Error::invalid(format!(
                "opencl: {}: running_mean and running_var must be defined in evaluation mode",
                on.l.op
            )));
        };
        on.vector(&mut args, "running_mean", mean)?;
        on.vector(&mut args, "running_var", var)?;
        on.opt_vector(&mut args, "save_mean", p.save_mean.as_ref())?;
        on.opt_vector(&mut args, "save_invstd", p.save_invstd.as_ref())?;
        args.float(p.eps);
        let n = work_items(p.input.shape).max(channels);
        return on.enqueue("batch_norm_eval", options, &args, n, None);
    }
    for (view, what) in vectors[2..].iter().zip(["running_mean", "running_var", "save_mean", "save_invstd"]) {
        on.opt_vector(&mut args, what, view.as_ref())?;
    }
    args.float(p.momentum).float(p.eps);
    on.enqueue("batch_norm_train", options, &args, channels * BN_GROUP, Some(BN_GROUP))
}

/// A batch norm backward over an `[N, C, *]` input.
pub(crate) struct BatchNormBackward<'v> {
    /// The output's gradient.
    pub(crate) grad_out: View<'v>,
    /// The forward's input.
    pub(crate) input: View<'v>,
    /// Per-channel scale.
    pub(crate) weight: Option<View<'v>>,
    /// The saved mean (train) or the running mean.
    pub(crate) mean: View<'v>,
    /// The saved inverse standard deviation (train) or the running variance.
    pub(crate) spread: View<'v>,
    /// Whether the forward used batch statistics.
    pub(crate) train: bool,
    /// Added to the running variance (evaluation).
    pub(crate) eps: f64,
    /// Gradients for input, weight and bias, each when wanted.
    pub(crate) grads: [Option<View<'v>>; 3],
}

/// Batch norm backward: one work group per channel.
pub(crate) fn batch_norm_backward(on: &NormCall<'_>, p: &BatchNormBackward<'_>) -> Result<()> {
    let tensors = [&p.grad_out, &p.mean, &p.spread];
    let rest = p.weight.iter().chain(p.grads.iter().flatten());
    let options = on.options(p.input.elem, tensors.into_iter().chain(rest))?;
    let channels = usize::try_from(p.input.shape.get(1).copied().unwrap_or(0)).unwrap_or(0);
    let mut args = Args::new();
    on.tensor(&mut args, "grad_out", &p.grad_out)?;
    on.tensor(&mut args, "input", &p.input)?;
    on.opt_vector(&mut args, "weight", p.weight.as_ref())?;
    on.vector(&mut args, "mean", &p.mean)?;
    on.vector(&mut args, if p.train { "save_invstd" } else { "running_var" }, &p.spread)?;
    on.opt_tensor(&mut args, "grad_input", p.grads[0].as_ref())?;
    on.opt_vector(&mut args, "grad_weight", p.grads[1].as_ref())?;
    on.opt_vector(&mut args, "grad_bias", p.grads[2].as_ref())?;
    args.int(i32::from(p.train)).float(p.eps);
    on.enqueue("batch_norm_backward", options, &args, channels * BN_GROUP, Some(BN_GROUP))
}

/// How a layer norm input splits into rows: `rows` rows of `len`
/// elements, the row elements being dimensions `from..`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows {
    /// Rows.
    pub(crate) rows: i64,
    /// Elements per row.
    pub(crate) len: i64,
    /// The first normalized dimension.
    pub(crate) from: usize,
}

/// A layer norm forward.
pub(crate) struct LayerNorm<'v> {
    /// The input.
    pub(crate) input: View<'v>,
    /// Its split into rows.
    pub(crate) rows: Rows,
    /// Per-element scale (the normalized shape).
    pub(crate) weight: Option<View<'v>>,
    /// Per-element shift.
    pub(crate) bias: Option<View<'v>>,
    /// Added to the variance.
    pub(crate) eps: f64,
    /// The output (the input's shape).
    pub(crate) out: View<'v>,
    /// Per-row mean, when wanted.
    pub(crate) mean: Option<View<'v>>,
    /// Per-row reciprocal standard deviation, when wanted.
    pub(crate) rstd: Option<View<'v>>,
}

/// Layer norm forward: one work item per row.
pub(crate) fn layer_norm(on: &NormCall<'_>, p: &LayerNorm<'_>) -> Result<()> {
    let others = [&p.weight, &p.bias, &p.mean, &p.rstd];
    let options =
        on.options(p.input.elem, std::iter::once(&p.out).chain(others.iter().copied().flatten()))?;
    let mut args = Args::new();
    on.tensor(&mut args, "input", &p.input)?;
    on.tensor(&mut args, "the output", &p.out)?;
    on.opt_tensor(&mut args, "weight", p.weight.as_ref())?;
    on.opt_tensor(&mut args, "bias", p.bias.as_ref())?;
    on.opt_vector(&mut args, "mean", p.mean.as_ref())?;
    on.opt_vector(&mut args, "rstd", p.rstd.as_ref())?;
    let Rows { rows, len, from } = p.rows;
    args.long(rows).long(len).int(from as i32).float(p.eps);
    on.enqueue("layer_norm_forward", options, &args, usize::try_from(rows).unwrap_or(0), None)
}

/// A layer norm backward.
pub(crate) struct LayerNormBackward<'v> {
    /// The output's gradient.
    pub(crate) grad_out: View<'v>,
    /// The forward's input.
    pub(crate) input: View<'v>,
    /// Its split into rows.
    pub(crate) rows: Rows,
    /// The forward's per-row mean.
    pub(crate) mean: View<'v>,
    /// The forward's per-row reciprocal standard deviation.
    pub(crate) rstd: View<'v>,
    /// Per-element scale.
    pub(crate) weight: Option<View<'v>>,
    /// Gradients for input, weight and bias, each when wanted.
    pub(crate) grads: [Option<View<'v>>; 3],
}

/// Layer norm backward: the input gradient one work item per row, the
/// weight and bias gradients one work item per normalized element.
pub(crate) fn layer_norm_backward(on: &NormCall<'_>, p: &LayerNormBackward<'_>) -> Result<()> {
    let tensors = [&p.grad_out, &p.mean, &p.rstd];
    let rest = p.weight.iter().chain(p.grads.iter().flatten());
    let options = on.options(p.input.elem, tensors.into_iter().chain(rest))?;
    let Rows { rows, len, from } = p.rows;
    let common = |args: &mut Args| -> Result<()> {
        on.tensor(args, "grad_out", &p.grad_out)?;
        on.tensor(args, "input", &p.input)?;
        on.vector(args, "mean", &p.mean)?;
        on.vector(args, "rstd", &p.rstd)
    };
    if let Some(gx) = &p.grads[0] {
        let mut args = Args::new();
        common(&mut args)?;
        on.opt_tensor(&mut args, "weight", p.weight.as_ref())?;
        on.tensor(&mut args, "grad_input", gx)?;
        args.long(rows).long(len).int(from as i32);
        let n = usize::try_from(rows).unwrap_or(0);
        on.enqueue("layer_norm_backward_input", options.clone(), &args, n, None)?;
    }
    if p.grads[1].is_some() || p.grads[2].is_some() {
        let mut args = Args::new();
        common(&mut args)?;
        on.opt_vector(&mut args, "grad_weight", p.grads[1].as_ref())?;
        on.opt_vector(&mut args, "grad_bias", p.grads[2].as_ref())?;
        args.long(rows).long(len).int(from as i32);
        on.enqueue("layer_norm_backward_params", options, &args, usize::try_from(len).unwrap_or(0), None)?;
    }
    Ok(())
}

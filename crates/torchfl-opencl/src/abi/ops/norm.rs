//! Normalization operators (`kernels::norm`): batch norm
//! (`native_batch_norm`, `_native_batch_norm_legit.no_stats`,
//! `_native_batch_norm_legit_no_training`, `native_batch_norm_backward`) and
//! layer norm (`native_layer_norm`, `native_layer_norm_backward`).
//!
//! Training-mode batch norm updates the running statistics, which are
//! arguments, in place. In evaluation mode, saved statistics the host
//! allocated empty (PyTorch's CPU shape) are not written; allocated with one
//! element per channel (as this host does), they get what PyTorch's
//! decomposition returns on devices other than the CPU: the running mean
//! and `1 / sqrt(running_var + eps)`.

use crate::abi::frame::Call;
use crate::error::{Error, Result};
use crate::kernels::{
    batch_norm, batch_norm_backward, layer_norm, layer_norm_backward, numel, BatchNorm, BatchNormBackward,
    LayerNorm, LayerNormBackward, NormCall, Rows, View,
};

fn on<'a>(c: &'a Call<'_>) -> NormCall<'a> {
    NormCall { l: c.launch() }
}

fn invalid(c: &Call<'_>, message: impl std::fmt::Display) -> Error {
    Error::invalid(format!("opencl: {}: {message}", c.op()))
}

/// Checks that an optional per-feature tensor has `n` elements.
fn check_vec(c: &Call<'_>, v: &Option<View<'_>>, n: i64, name: &str) -> Result<()> {
    match v {
        Some(v) if numel(v) != n => {
            Err(invalid(c, format_args!("{name} should contain {n} elements not {}", numel(v))))
        }
        _ => Ok(()),
    }
}

/// Checks that `v` has the shape `want`.
fn check_shape(c: &Call<'_>, v: &View<'_>, want: &[i64], name: &str) -> Result<()> {
    if v.shape != want {
        return Err(invalid(c, format_args!("{name} has shape {:?}, expected {want:?}", v.shape)));
    }
    Ok(())
}

/// Output `i` of `n` elements, when it is to be written: defined (its
/// mask entry set) and not allocated empty (evaluation-mode saved
/// statistics) unless `n` is 0. Other sizes are refused.
fn stat_output<'a>(c: &Call<'a>, i: usize, n: i64, want: bool) -> Result<Option<View<'a>>> {
    if !want {
        return Ok(None);
    }
    match c.opt_output(i)? {
        Some(o) if numel(&o) == 0 && n != 0 => Ok(None),
        Some(o) if numel(&o) != n => {
            Err(invalid(c, format_args!("output {i} has {} elements, expected {n}", numel(&o))))
        }
        other => Ok(other),
    }
}

/// Output 0 of a backward, the input's gradient, when wanted.
fn grad_input<'a>(c: &Call<'a>, input: &View<'_>, want: bool) -> Result<Option<View<'a>>> {
    let gx = if want { c.opt_output(0)? } else { None };
    if let Some(gx) = &gx {
        check_shape(c, gx, input.shape, "grad_input")?;
    }
    Ok(gx)
}

/// The channel count of a batch norm input (`[N, C, *]`).
fn channels(c: &Call<'_>, x: &View<'_>) -> Result<i64> {
    match x.shape {
        [_, ch, ..] => Ok(*ch),
        _ => Err(invalid(c, format_args!("input must have at least 2 dimensions, got {}", x.shape.len()))),
    }
}

/// Shared front end of the batch norm forwards: `stats` is the argument
/// index of `running_mean` (then `running_var`), or `None` (`no_stats`);
/// `training` the index of the flag or, when fixed, its value. `momentum`
/// and `eps` follow.
fn batch_norm_impl(
    c: &Call<'_>,
    stats: Option<usize>,
    training: std::result::Result<usize, bool>,
) -> Result<()> {
    let after = stats.map_or(3, |i| i + 2);
    let momentum_at = after + usize::from(training.is_ok());
    c.expect(momentum_at + 2, 3)?;
    let input = c.tensor(0)?;
    let ch = channels(c, &input)?;
    let (weight, bias) = (c.opt_tensor(1)?, c.opt_tensor(2)?);
    let (running_mean, running_var) = match stats {
        Some(i) => (c.opt_tensor(i)?, c.opt_tensor(i + 1)?),
        None => (None, None),
    };
    let training = match training {
        Ok(i) => c.bool(i)?,
        Err(fixed) => fixed,
    };
    let (momentum, eps) = (c.float(momentum_at)?, c.float(momentum_at + 1)?);
    for (v, name) in
        [(&weight, "weight"), (&bias, "bias"), (&running_mean, "running_mean"), (&running_var, "running_var")]
    {
        check_vec(c, v, ch, name)?;
    }
    if !training && (running_mean.is_none() || running_var.is_none()) {
        return Err(invalid(c, "running_mean and running_var must be defined in evaluation mode"));
    }
    let out = c.output(0)?;
    check_shape(c, &out, input.shape, "the output")?;
    let save_mean = stat_output(c, 1, ch, true)?;
    let save_invstd = stat_output(c, 2, ch, true)?;
    let p = BatchNorm {
        input,
        out,
        weight,
        bias,
        running_mean,
        running_var,
        save_mean,
        save_invstd,
        training,
        momentum,
        eps,
    };
    batch_norm(&on(c), &p)
}

/// `native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor?
/// running_mean, Tensor? running_var, bool training, float momentum, float
/// eps) -> (Tensor, Tensor, Tensor)`: output, saved mean and saved inverse
/// standard deviation (the latter two empty in evaluation mode).
pub(in crate::abi) fn native_batch_norm(c: &Call<'_>) -> Result<()> {
    batch_norm_impl(c, Some(3), Ok(5))
}

/// `_native_batch_norm_legit.no_stats(Tensor input, Tensor? weight, Tensor?
/// bias, bool training, float momentum, float eps) -> (Tensor, Tensor,
/// Tensor)`.
pub(in crate::abi) fn native_batch_norm_legit_no_stats(c: &Call<'_>) -> Result<()> {
    batch_norm_impl(c, None, Ok(3))
}

/// `_native_batch_norm_legit_no_training(Tensor input, Tensor? weight,
/// Tensor? bias, Tensor running_mean, Tensor running_var, float momentum,
/// float eps) -> (Tensor, Tensor, Tensor)`.
pub(in crate::abi) fn native_batch_norm_legit_no_training(c: &Call<'_>) -> Result<()> {
    batch_norm_impl(c, Some(3), Err(false))
}

/// `output_mask` (`bool[3]`) at argument `i`.
fn mask(c: &Call<'_>, i: usize) -> Result<[bool; 3]> {
    match c.bools(i)?[..] {
        [a, b, d] => Ok([a, b, d]),
        _ => Err(invalid(c, format_args!("argument {i} (output_mask) must be a list of 3 bools"))),
    }
}

/// `native_batch_norm_backward(Tensor grad_out, Tensor input, Tensor?
/// weight, Tensor? running_mean, Tensor? running_var, Tensor? save_mean,
/// Tensor? save_invstd, bool train, float eps, bool[3] output_mask) ->
/// (Tensor, Tensor, Tensor)`: gradients for input, weight and bias.
pub(in crate::abi) fn native_batch_norm_backward(c: &Call<'_>) -> Result<()> {
    c.expect(10, 3)?;
    let (grad_out, input) = (c.tensor(0)?, c.tensor(1)?);
    let ch = channels(c, &input)?;
    check_shape(c, &grad_out, input.shape, "grad_out")?;
    let weight = c.opt_tensor(2)?;
    let train = c.bool(7)?;
    let eps = c.float(8)?;
    let m = mask(c, 9)?;
    // Saved statistics may be empty when the forward did not train.
    let nonempty = |v: &View<'_>| numel(v) > 0 || ch == 0;
    let (mean, spread) = if train {
        (c.opt_tensor(5)?.filter(nonempty), c.opt_tensor(6)?.filter(nonempty))
    } else {
        (c.opt_tensor(3)?, c.opt_tensor(4)?)
    };
    let (Some(mean), Some(spread)) = (mean, spread) else {
        return Err(invalid(
            c,
            if train {
                "save_mean and save_invstd must be defined in training mode"
            } else {
                "running_mean and running_var must be defined in evaluation mode"
            },
        ));
    };
    check_vec(c, &weight, ch, "weight")?;
    check_vec(c, &Some(mean), ch, if train { "save_mean" } else { "running_mean" })?;
    check_vec(c, &Some(spread), ch, if train { "save_invstd" } else { "running_var" })?;
    let grads = [grad_input(c, &input, m[0])?, stat_output(c, 1, ch, m[1])?, stat_output(c, 2, ch, m[2])?];
    if grads.iter().all(Option::is_none) {
        return Ok(());
    }
    let p = BatchNormBackward { grad_out, input, weight, mean, spread, train, eps, grads };
    batch_norm_backward(&on(c), &p)
}

/// Splits `x`'s shape at `normalized_shape` (argument `i`).
fn rows(c: &Call<'_>, x: &View<'_>, i: usize) -> Result<Rows> {
    let normalized = c.ints(i)?;
    let (nd, shape) = (normalized.len(), x.shape);
    if nd == 0 || nd > shape.len() || shape[shape.len() - nd..] != *normalized {
        let dims: Vec<String> = normalized.iter().map(i64::to_string).collect();
        return Err(invalid(
            c,
            format_args!(
                "Given normalized_shape={normalized:?}, expected input with shape [*, {}], but got input of \
                 size{shape:?}",
                dims.join(", ")
            ),
        ));
    }
    let from = shape.len() - nd;
    Ok(Rows { rows: shape[..from].iter().product(), len: shape[from..].iter().product(), from })
}

/// `native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor?
/// weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)`: output,
/// per-row mean and reciprocal standard deviation.
pub(in crate::abi) fn native_layer_norm(c: &Call<'_>) -> Result<()> {
    c.expect(5, 3)?;
    let input = c.tensor(0)?;
    let split = rows(c, &input, 1)?;
    let (weight, bias) = (c.opt_tensor(2)?, c.opt_tensor(3)?);
    let eps = c.float(4)?;
    check_vec(c, &weight, split.len, "weight")?;
    check_vec(c, &bias, split.len, "bias")?;
    let out = c.output(0)?;
    check_shape(c, &out, input.shape, "the output")?;
    let mean = stat_output(c, 1, split.rows, true)?;
    let rstd = stat_output(c, 2, split.rows, true)?;
    layer_norm(&on(c), &LayerNorm { input, rows: split, weight, bias, eps, out, mean, rstd })
}

/// `native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[]
/// normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor?
/// bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)`.
pub(in crate::abi) fn native_layer_norm_backward(c: &Call<'_>) -> Result<()> {
    c.expect(8, 3)?;
    let (grad_out, input) = (c.tensor(0)?, c.tensor(1)?);
    let split = rows(c, &input, 2)?;
    check_shape(c, &grad_out, input.shape, "grad_out")?;
    let (mean, rstd) = (c.tensor(3)?, c.tensor(4)?);
    if numel(&mean) != split.rows || numel(&rstd) != split.rows {
        return Err(invalid(c, format_args!("mean and rstd must have {} elements", split.rows)));
    }
    let weight = c.opt_tensor(5)?;
    check_vec(c, &weight, split.len, "weight")?;
    let m = mask(c, 7)?;
    let grads = [
        grad_input(c, &input, m[0])?,
        stat_output(c, 1, split.len, m[1])?,
        stat_output(c, 2, split.len, m[2])?,
    ];
    layer_norm_backward(
        &on(c),
        &LayerNormBackward { grad_out, input, rows: split, mean, rstd, weight, grads },
    )
}

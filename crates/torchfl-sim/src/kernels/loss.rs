//! Negative log-likelihood loss, forward and backward: `nll_loss_forward`
//! and `nll_loss_backward` (with their `.output`/`.grad_input` forms), the
//! second half of `F.cross_entropy` after `_log_softmax`, and their
//! spatial variants `nll_loss2d_forward`/`nll_loss2d_backward`.
//!
//! The input is `[C]` or `[N, C]` log-probabilities, the target `[]` or
//! `[N]` class indices; an optional `weight[C]` rescales classes and
//! `ignore_index` drops entries. Reductions: 0 none, 1 mean (divided by
//! the summed weights of the kept entries, `total_weight`), 2 sum. Sums
//! accumulate in `f64` in index order, so results are deterministic. A
//! target outside `[0, C)` (other than `ignore_index`) is detected when the
//! work runs and reported as PyTorch's "Target t is out of bounds." error.

use super::elementwise::{gather, with_dense_output};
use super::real::Real;
use super::softmax::int_arg;
use super::view::TensorView;
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::Work;

/// The validated operands shared by forward and backward. The input is
/// seen as `[batch, classes, spatial]` (`spatial` is 1 except for
/// `nll_loss2d`, whose input is `[N, C, H, W]` and target `[N, H, W]`).
struct Nll {
    input_shape: Vec<usize>,
    two_d: bool,
    target: TensorView,
    weight: Option<TensorView>,
    reduction: i64,
    ignore_index: i64,
}

impl Nll {
    fn batch(&self) -> usize {
        if self.input_shape.len() >= 2 {
            self.input_shape[0]
        } else {
            1
        }
    }
    fn classes(&self) -> usize {
        if self.two_d {
            self.input_shape[1]
        } else {
            self.input_shape.last().copied().unwrap_or(0)
        }
    }
    fn spatial(&self) -> usize {
        if self.two_d {
            self.input_shape[2..].iter().product()
        } else {
            1
        }
    }
    /// Entries (loss terms): batch times spatial positions.
    fn entries(&self) -> usize {
        self.batch() * self.spatial()
    }
    /// Flat input index of class `t` for entry `e`.
    fn at(&self, e: usize, t: usize) -> usize {
        let s = self.spatial();
        (e / s * self.classes() + t) * s + e % s
    }
    /// Targets and per-class weights, read when the work runs; checks the
    /// target range.
    fn read(&self) -> Result<(Vec<i64>, Option<Vec<f64>>)> {
        let targets = gather::<i64>(&self.target);
        let c = self.classes() as i64;
        for &t in &targets {
            if t != self.ignore_index && (t < 0 || t >= c) {
                return Err(Error::invalid(format!("sim: nll_loss: Target {t} is out of bounds.")));
            }
        }
        Ok((targets, self.weight.as_ref().map(gather::<f64>)))
    }
}

fn validate(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    args: &Args<'_>,
    first: usize,
    input: &TensorView,
    two_d: bool,
) -> Result<Nll> {
    let target = ctx.device_view(args.tensor(first + 1, "target")?, "target")?;
    let weight = match call.args.get(first + 2) {
        None | Some(ArgRef::None) => None,
        Some(ArgRef::Tensor(t)) => Some(ctx.device_view(t, "weight")?),
        Some(_) => return Err(ctx.invalid("argument weight must be a tensor or None")),
    };
    let reduction = int_arg(ctx, call, first + 3, "reduction")?;
    let ignore_index = int_arg(ctx, call, first + 4, "ignore_index")?;
    if !input.dtype().is_floating() {
        return Err(ctx.unimplemented(format!("self: {} is not supported", input.dtype())));
    }
    if !(0..=2).contains(&reduction) {
        return Err(ctx.invalid(format!("{reduction} is not a valid value for reduction")));
    }
    let nd = input.ndim();
    if two_d {
        if nd != 4 {
            return Err(ctx.invalid(format!(
                "only batches of spatial inputs supported (4D tensors), but got input of dimension: {nd}"
            )));
        }
        if target.ndim() != 3 {
            return Err(ctx.invalid(format!(
                "only batches of spatial targets supported (3D tensors) but got targets of dimension: {}",
                target.ndim()
            )));
        }
        let (i, t) = (input.shape(), target.shape());
        if i[0] != t[0] || i[2] != t[1] || i[3] != t[2] {
            return Err(ctx.invalid(format!(
                "input and target batch or spatial sizes don't match: target {t:?}, input {i:?}"
            )));
        }
    } else {
        if nd == 0 || nd > 2 {
            return Err(ctx.invalid("input tensor should be 1D or 2D"));
        }
        if target.ndim() > 1 {
            return Err(ctx.invalid("0D or 1D target tensor expected, multi-target not supported"));
        }
        let no_batch = nd == 1 && target.ndim() == 0;
        if !no_batch && input.shape()[0] != target.shape().first().copied().unwrap_or(1) {
            return Err(ctx.invalid(format!(
                "Expected input batch_size ({}) to match target batch_size ({}).",
                input.shape()[0],
                target.shape().first().copied().unwrap_or(1)
            )));
        }
    }
    if target.dtype().is_floating() || target.dtype() == DType::Bool {
        return Err(ctx.invalid(format!("expected scalar type Long but found {}", target.dtype())));
    }
    let classes = if two_d { input.shape()[1] } else { input.shape()[nd - 1] };
    if let Some(w) = &weight {
        if w.numel() != classes {
            return Err(ctx.invalid(format!(
                "weight tensor should be defined either for all {classes} classes or no classes but got \
                 weight tensor of shape: {:?}",
                w.shape()
            )));
        }
    }
    Ok(Nll { input_shape: input.shape().to_vec(), two_d, target, weight, reduction, ignore_index })
}

fn forward_work<C: Real>(nll: Nll, input: TensorView, output: TensorView, total: TensorView) -> Work {
    Work::new(move || {
        let (targets, weights) = nll.read()?;
        let x = gather::<f64>(&input);
        let n = nll.entries();
        let mut losses = vec![0f64; n];
        let (mut sum, mut wsum) = (0f64, 0f64);
        for i in 0..n {
            let t = targets[i.min(targets.len().saturating_sub(1))];
            if t == nll.ignore_index {
                continue;
            }
            let w = weights.as_ref().map_or(1.0, |w| w[t as usize]);
            let l = -w * x[nll.at(i, t as usize)];
            losses[i] = l;
            sum += l;
            wsum += w;
        }
        // Batched `none` gives per-entry losses (and total_weight 0); an
        // unbatched `none` is its single term, with its weight, like `sum`.
        let batched = nll.two_d || nll.input_shape.len() == 2;
        match nll.reduction {
            0 if batched => {
                with_dense_output::<C>(&output, |o| {
                    for (ov, &l) in o.iter_mut().zip(&losses) {
                        *ov = C::of(l);
                    }
                });
                with_dense_output::<C>(&total, |t| t.fill(C::of(0.0)));
            }
            r => {
                let v = if r == 1 { sum / wsum } else { sum };
                with_dense_output::<C>(&output, |o| o.fill(C::of(v)));
                with_dense_output::<C>(&total, |t| t.fill(C::of(wsum)));
            }
        }
        Ok(())
    })
}

fn forward(ctx: &KernelCtx<'_>, call: &Frame<'_>, two_d: bool) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 5, 5)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let nll = validate(ctx, call, &args, 0, &input, two_d)?;
    let output = ctx.output(call, 0)?;
    let total = ctx.output(call, 1)?;
    let expected: Vec<usize> = match (nll.reduction, two_d, input.ndim()) {
        (0, true, _) => nll.target.shape().to_vec(),
        (0, false, 2) => vec![nll.batch()],
        _ => Vec::new(),
    };
    if output.shape() != expected.as_slice() || total.numel() != 1 {
        return Err(ctx.invalid(format!(
            "outputs have shapes {:?} and {:?}, expected {expected:?} and []",
            output.shape(),
            total.shape()
        )));
    }
    if !output.dtype().is_floating() || !total.dtype().is_floating() {
        return Err(ctx.unimplemented("non-floating outputs are not supported"));
    }
    Ok(Some(if output.dtype() == DType::Float64 {
        forward_work::<f64>(nll, input, output, total)
    } else {
        forward_work::<f32>(nll, input, output, total)
    }))
}

/// `nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int
/// reduction, SymInt ignore_index) -> (Tensor output, Tensor
/// total_weight)` (and `nll_loss_forward.output`).
pub(crate) fn nll_loss_forward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    forward(ctx, call, false)
}

/// `nll_loss2d_forward(Tensor self, Tensor target, Tensor? weight, int
/// reduction, SymInt ignore_index) -> (Tensor output, Tensor
/// total_weight)`: input `[N, C, H, W]`, target `[N, H, W]`.
pub(crate) fn nll_loss2d_forward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    forward(ctx, call, true)
}

fn backward_work<C: Real>(nll: Nll, grad: TensorView, total: TensorView, out: TensorView) -> Work {
    Work::new(move || {
        let (targets, weights) = nll.read()?;
        let g = gather::<f64>(&grad);
        let tw = gather::<f64>(&total).first().copied().unwrap_or(0.0);
        let n = nll.entries();
        with_dense_output::<C>(&out, |gi| {
            gi.fill(C::of(0.0));
            for i in 0..n {
                let t = targets[i.min(targets.len().saturating_sub(1))];
                if t == nll.ignore_index {
                    continue;
                }
                let w = weights.as_ref().map_or(1.0, |w| w[t as usize]);
                let go = if nll.reduction == 0 { g[i.min(g.len().saturating_sub(1))] } else { g[0] };
                let v = if nll.reduction == 1 { -w * go / tw } else { -w * go };
                gi[nll.at(i, t as usize)] = C::of(v);
            }
        });
        Ok(())
    })
}

fn backward(ctx: &KernelCtx<'_>, call: &Frame<'_>, two_d: bool) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 7, 7)?;
    let grad = ctx.device_view(args.tensor(0, "grad_output")?, "grad_output")?;
    let input = ctx.device_view(args.tensor(1, "self")?, "self")?;
    let nll = validate(ctx, call, &args, 1, &input, two_d)?;
    let total = ctx.device_view(args.tensor(6, "total_weight")?, "total_weight")?;
    let out = ctx.output(call, 0)?;
    if total.numel() != 1 {
        return Err(ctx.invalid(format!(
            "expected total_weight to be a single element tensor, got: {:?} ({} elements)",
            total.shape(),
            total.numel()
        )));
    }
    let expected = if nll.reduction == 0 && (two_d || input.ndim() == 2) { nll.entries() } else { 1 };
    if grad.numel() != expected || (nll.reduction != 0 && grad.ndim() != 0) && grad.numel() != 1 {
        return Err(ctx.invalid(format!(
            "Expected a tensor of dimension 1 and tensor.size[0] == {expected} but got: dimension {} and \
             tensor.size[0] == {}",
            grad.ndim(),
            grad.shape().first().copied().unwrap_or(1)
        )));
    }
    if out.shape() != input.shape() {
        return Err(ctx.invalid(format!(
            "grad_input has shape {:?}, expected {:?}",
            out.shape(),
            input.shape()
        )));
    }
    if !out.dtype().is_floating() {
        return Err(ctx.unimplemented(format!("{} grad_input is not supported", out.dtype())));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(if out.dtype() == DType::Float64 {
        backward_work::<f64>(nll, grad, total, out)
    } else {
        backward_work::<f32>(nll, grad, total, out)
    }))
}

/// `nll_loss_backward(Tensor grad_output, Tensor self, Tensor target,
/// Tensor? weight, int reduction, SymInt ignore_index, Tensor
/// total_weight) -> Tensor` (and `nll_loss_backward.grad_input`).
pub(crate) fn nll_loss_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    backward(ctx, call, false)
}

/// `nll_loss2d_backward(Tensor grad_output, Tensor self, Tensor target,
/// Tensor? weight, int reduction, SymInt ignore_index, Tensor
/// total_weight) -> Tensor` (and `.grad_input`).
pub(crate) fn nll_loss2d_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    backward(ctx, call, true)
}

//! Custom fused operators of the `sim` namespace, each with its backward
//! kernel: the worked example of how a plugin ships operators of its own.
//!
//! | operator | schema (`TFL_OpEntry.schema`) |
//! |---|---|
//! | `sim::fused_bias_gelu` | `fused_bias_gelu(Tensor x, Tensor bias) -> Tensor` |
//! | `sim::fused_bias_gelu_backward` | `fused_bias_gelu_backward(Tensor grad, Tensor x, Tensor bias) -> (Tensor, Tensor)` |
//! | `sim::softmax_cross_entropy` | `softmax_cross_entropy(Tensor logits, Tensor target) -> Tensor` |
//! | `sim::softmax_cross_entropy_backward` | `softmax_cross_entropy_backward(Tensor grad, Tensor logits, Tensor target) -> (Tensor, Tensor)` |
//!
//! # Why these operators are fused
//!
//! Written with aten operators, both computations make several passes over
//! memory and keep intermediates alive for the backward pass:
//!
//! - **bias + GELU**, the activation after a linear layer without its bias
//!   (`gelu(x @ w + b)` where the matmul runs bias-free): `x + bias`
//!   materialises a tensor the size of `x`, `gelu` reads it again, and the
//!   backward runs `gelu_backward` and then a separate `sum` over the batch
//!   dimensions for the bias gradient. The fused forward reads `x` once and
//!   writes `y` once; the fused backward computes `grad_x` and accumulates
//!   `grad_bias` in the same pass.
//! - **softmax + cross-entropy** with soft labels (class probabilities, as
//!   in label smoothing or distillation): `log_softmax`, a product with the
//!   target, a sum and a division each make a pass and the log-softmax is
//!   saved. The fused forward reduces each row to one number; the backward
//!   has a closed form (`softmax * sum(target) - target`) that needs no
//!   saved intermediate, only the inputs.
//!
//! # The kernels
//!
//! - `fused_bias_gelu`: `y = gelu(x + bias)` with the exact GELU
//!   `u * Phi(u)` (PyTorch's `approximate='none'`; the very formula of the
//!   aten `gelu` kernel). `x` has any rank >= 1 and `bias` is 1-D of size
//!   `x.shape[-1]`, broadcast over the last dimension. The output has the
//!   shape and dtype of `x`.
//! - `fused_bias_gelu_backward`: with `u = x + bias`,
//!   `grad_x = grad * gelu'(u)` where `gelu'(u) = Phi(u) + u * phi(u)`, and
//!   `grad_bias = grad_x` summed over every dimension but the last. Outputs
//!   `(grad_x, grad_bias)`, shaped like `x` and `bias`.
//! - `softmax_cross_entropy`: `logits` and `target` are `[N, C]`, `target`
//!   holding class probabilities; the result is the 0-dim
//!   `-(1/N) * sum_n sum_c target[n, c] * log_softmax(logits)[n, c]`,
//!   which is `torch.nn.functional.cross_entropy(logits, target)` with
//!   probability targets and `reduction='mean'`. The log-softmax is the
//!   stable one: `x - (m + log(sum(exp(x - m))))` with `m` the row maximum.
//! - `softmax_cross_entropy_backward`: `grad` is the 0-dim gradient `g` of
//!   the loss; `grad_logits[n, c] = (g/N) * (softmax[n, c] * sum_c'
//!   target[n, c'] - target[n, c])` and `grad_target[n, c] = -(g/N) *
//!   log_softmax[n, c]`. Outputs `(grad_logits, grad_target)`.
//!
//! All four accept float32 and float64 (float64 is what
//! `torch.autograd.gradcheck` uses), and float16 and bfloat16, which are
//! computed in float32 and rounded when stored. Other dtypes are
//! `UNIMPLEMENTED`; a dtype mismatch between the tensors, and any shape
//! error, is `INVALID_ARGUMENT` naming the operator and the shapes. Inputs
//! may have any strides (they are read through [`dense_input`], which
//! gathers non-contiguous views); outputs are written through
//! [`with_dense_output`]. Rows are split across rayon tasks in blocks that
//! depend only on the sizes, and every reduction (`grad_bias`, the loss,
//! each row's log-sum-exp) accumulates in `f64` in a fixed order, so
//! results are deterministic whatever the thread count.
//!
//! # Autograd: the `_backward` convention
//!
//! torch-fl wires autograd for custom operators by name, with no Python
//! code from the vendor:
//!
//! > A custom operator `ns::op` whose op table also has `ns::op_backward`
//! > gets autograd. The backward takes **one gradient per output of the
//! > forward, followed by the forward's inputs** (in schema order), and
//! > returns **one gradient per Tensor input of the forward**, in order.
//!
//! So `fused_bias_gelu(x, bias) -> y` pairs with
//! `fused_bias_gelu_backward(grad_y, x, bias) -> (grad_x, grad_bias)`, and
//! `softmax_cross_entropy(logits, target) -> loss` with
//! `softmax_cross_entropy_backward(grad_loss, logits, target) ->
//! (grad_logits, grad_target)`. The backward recomputes what it needs from
//! the inputs (here `x + bias` and the row log-sum-exp), which is cheaper
//! than saving intermediates when the forward is memory bound. A gradient
//! the user does not need (the target's, usually) is simply not used.
//!
//! # What a custom operator needs in the op table
//!
//! Each entry in the `custom` group of [`super::for_each_op!`] names the
//! operator (its exported kernel symbol, `sim::x` -> `torch_fl_op_sim__x`,
//! is derived from the name by the build script), the kernel, the schema
//! without namespace (checked at compile time to declare the operator) and
//! an **infer function** (`TFL_OpEntry.infer_outputs`): PyTorch has no
//! shape function for a custom operator, so the host asks the plugin for
//! each output's dtype and shape before allocating it (and torch.compile
//! asks while tracing, with tensors that have no data). Here each operator
//! has one validation function (`check_*`) that both its kernel and its
//! infer function call, so the two can never disagree about what is valid
//! or what the outputs are.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use rayon::prelude::*;

use super::activation::{GeluErf, GeluErfBackward};
use super::elementwise::{dense_input, gather, with_dense_output};
use super::pointwise::{BinaryFn, UnaryFn};
use super::real::Real;
use super::view::{disjoint, TensorView};
use super::{ArgRef, Frame, KernelCtx, OutputMeta, TensorRef};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::Work;

/// Elements of work a parallel task should cover at least.
const TASK: usize = 16 * 1024;

// ---------------------------------------------------------------------------
// Validation shared by kernels and infer functions
// ---------------------------------------------------------------------------

fn invalid(op: &str, message: impl fmt::Display) -> Error {
    Error::invalid(format!("sim: {op}: {message}"))
}

/// Checks the argument count against the schema's parameter names.
fn arity(op: &str, args: &[ArgRef<'_>], names: &[&str]) -> Result<()> {
    if args.len() == names.len() {
        Ok(())
    } else {
        Err(invalid(
            op,
            format!("expected {} arguments ({}), got {}", names.len(), names.join(", "), args.len()),
        ))
    }
}

/// Tensor argument `i`, with non-negative sizes.
fn tensor<'a, 'b>(op: &str, args: &'a [ArgRef<'b>], i: usize, name: &str) -> Result<&'a TensorRef<'b>> {
    match args.get(i) {
        Some(ArgRef::Tensor(t)) => {
            if t.shape.iter().any(|&s| s < 0) {
                return Err(invalid(op, format!("{name}: negative size in {:?}", t.shape)));
            }
            Ok(t)
        }
        _ => Err(invalid(op, format!("argument {i} ({name}) must be a tensor"))),
    }
}

/// `b` must have `a`'s dtype, which must be a supported float type.
fn same_float_dtype(op: &str, a: (&str, &TensorRef<'_>), b: (&str, &TensorRef<'_>)) -> Result<()> {
    if a.1.dtype != b.1.dtype {
        return Err(invalid(
            op,
            format!("{} has dtype {} but {} has dtype {}; they must match", b.0, b.1.dtype, a.0, a.1.dtype),
        ));
    }
    match a.1.dtype {
        DType::Float32 | DType::Float64 | DType::Float16 | DType::BFloat16 => Ok(()),
        d => Err(Error::unimplemented(format!(
            "sim: {op}: {}: {d} is not supported (Float, Double, Half and BFloat16 are)",
            a.0
        ))),
    }
}

fn meta(t: &TensorRef<'_>) -> OutputMeta {
    OutputMeta { dtype: t.dtype, shape: t.shape.to_vec() }
}

/// Validates `fused_bias_gelu(x, bias)` or, with `backward`,
/// `fused_bias_gelu_backward(grad, x, bias)`; returns the outputs.
fn check_bias_gelu(op: &str, args: &[ArgRef<'_>], backward: bool) -> Result<Vec<OutputMeta>> {
    let first = usize::from(backward);
    arity(op, args, if backward { &["grad", "x", "bias"] } else { &["x", "bias"] })?;
    let x = tensor(op, args, first, "x")?;
    let bias = tensor(op, args, first + 1, "bias")?;
    let Some(&cols) = x.shape.last() else {
        return Err(invalid(op, "x must have at least one dimension, got a 0-dim tensor"));
    };
    if bias.shape != [cols] {
        return Err(invalid(
            op,
            format!(
                "bias must be 1-D with x.shape[-1] = {cols} elements, got bias of shape {:?} for x of shape {:?}",
                bias.shape, x.shape
            ),
        ));
    }
    if backward {
        let grad = tensor(op, args, 0, "grad")?;
        if grad.shape != x.shape {
            return Err(invalid(
                op,
                format!("grad has shape {:?} but x has shape {:?}; they must match", grad.shape, x.shape),
            ));
        }
        same_float_dtype(op, ("x", x), ("grad", grad))?;
    }
    same_float_dtype(op, ("x", x), ("bias", bias))?;
    Ok(if backward { vec![meta(x), meta(bias)] } else { vec![meta(x)] })
}

/// Validates `softmax_cross_entropy(logits, target)` or, with `backward`,
/// `softmax_cross_entropy_backward(grad, logits, target)`; returns the
/// outputs.
fn check_cross_entropy(op: &str, args: &[ArgRef<'_>], backward: bool) -> Result<Vec<OutputMeta>> {
    let first = usize::from(backward);
    arity(op, args, if backward { &["grad", "logits", "target"] } else { &["logits", "target"] })?;
    let logits = tensor(op, args, first, "logits")?;
    let target = tensor(op, args, first + 1, "target")?;
    if logits.shape.len() != 2 {
        return Err(invalid(op, format!("logits must be 2-D [N, C], got shape {:?}", logits.shape)));
    }
    if target.shape != logits.shape {
        return Err(invalid(
            op,
            format!(
                "target (class probabilities) must have the shape of logits {:?}, got {:?}",
                logits.shape, target.shape
            ),
        ));
    }
    if backward {
        let grad = tensor(op, args, 0, "grad")?;
        if !grad.shape.is_empty() {
            return Err(invalid(
                op,
                format!("grad must be 0-dim (the gradient of the scalar loss), got shape {:?}", grad.shape),
            ));
        }
        same_float_dtype(op, ("logits", logits), ("grad", grad))?;
    }
    same_float_dtype(op, ("logits", logits), ("target", target))?;
    Ok(if backward {
        vec![meta(logits), meta(target)]
    } else {
        vec![OutputMeta { dtype: logits.dtype, shape: Vec::new() }]
    })
}

/// `infer_outputs` of `sim::fused_bias_gelu`.
pub(crate) fn fused_bias_gelu_infer(op: &str, args: &[ArgRef<'_>]) -> Result<Vec<OutputMeta>> {
    check_bias_gelu(op, args, false)
}

/// `infer_outputs` of `sim::fused_bias_gelu_backward`.
pub(crate) fn fused_bias_gelu_backward_infer(op: &str, args: &[ArgRef<'_>]) -> Result<Vec<OutputMeta>> {
    check_bias_gelu(op, args, true)
}

/// `infer_outputs` of `sim::softmax_cross_entropy`.
pub(crate) fn softmax_cross_entropy_infer(op: &str, args: &[ArgRef<'_>]) -> Result<Vec<OutputMeta>> {
    check_cross_entropy(op, args, false)
}

/// `infer_outputs` of `sim::softmax_cross_entropy_backward`.
pub(crate) fn softmax_cross_entropy_backward_infer(op: &str, args: &[ArgRef<'_>]) -> Result<Vec<OutputMeta>> {
    check_cross_entropy(op, args, true)
}

// ---------------------------------------------------------------------------
// Kernel plumbing
// ---------------------------------------------------------------------------

/// Input `i` as a validated device view.
fn input_view(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<TensorView> {
    ctx.device_view(tensor(ctx.op(), call.args, i, name)?, name)
}

/// The call's outputs, checked against what the infer function computed
/// (the host allocates them from it, so a mismatch is a host error) and
/// against each other.
fn outputs<const N: usize>(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    metas: &[OutputMeta],
) -> Result<[TensorView; N]> {
    if call.outputs.len() != N || metas.len() != N {
        return Err(ctx.invalid(format!("expected {N} output(s), got {}", call.outputs.len())));
    }
    let mut views = Vec::with_capacity(N);
    for (i, m) in metas.iter().enumerate() {
        let v = ctx.output(call, i)?;
        let shape_ok = v.shape().len() == m.shape.len()
            && v.shape().iter().zip(&m.shape).all(|(&a, &b)| i64::try_from(a) == Ok(b));
        if v.dtype() != m.dtype || !shape_ok {
            return Err(ctx.invalid(format!(
                "output {i} is {} of shape {:?}, expected {} of shape {:?}",
                v.dtype(),
                v.shape(),
                m.dtype,
                m.shape
            )));
        }
        if views.iter().any(|o: &TensorView| !disjoint(o, &v)) {
            return Err(ctx.invalid(format!("output {i} overlaps another output")));
        }
        views.push(v);
    }
    views.try_into().map_err(|_| ctx.invalid("output count"))
}

/// An input's elements as a row-major slice of `C` (see [`dense_input`]),
/// borrowed only when disjoint from every output, so that no mutable
/// output slice can alias it.
fn input<'v, C: Element>(v: &'v TensorView, outs: &[&TensorView]) -> Cow<'v, [C]> {
    match outs.split_first() {
        Some((first, rest)) if rest.iter().all(|o| disjoint(v, o)) => dense_input::<C>(v, first),
        _ => Cow::Owned(gather::<C>(v)),
    }
}

/// Row `k` of a row-major `[_, cols]` buffer.
#[inline(always)]
fn row<T>(data: &[T], k: usize, cols: usize) -> &[T] {
    &data[k * cols..(k + 1) * cols]
}

/// Runs `f(rows, block)` over blocks of whole rows of `out`, a row-major
/// buffer with `rows` rows (of any width), where each row is `cols`
/// elements of work, and returns the results in row order. Blocks cover at
/// least [`TASK`] elements of work and run in parallel when there are
/// several; their boundaries depend on the sizes only, so a caller that
/// combines the results in order gets the same answer on any number of
/// threads.
fn row_blocks<T: Send, R: Send>(
    out: &mut [T],
    rows: usize,
    cols: usize,
    f: impl Fn(Range<usize>, &mut [T]) -> R + Sync + Send,
) -> Vec<R> {
    if rows == 0 {
        return Vec::new();
    }
    let width = out.len() / rows;
    let per = (TASK / cols.max(1)).max(1);
    if rows <= per || width == 0 {
        return vec![f(0..rows, out)];
    }
    out.par_chunks_mut(per * width)
        .enumerate()
        .map(|(k, block)| {
            let start = k * per;
            f(start..start + block.len() / width, block)
        })
        .collect()
}

// ---------------------------------------------------------------------------
// fused_bias_gelu
// ---------------------------------------------------------------------------

fn bias_gelu_work<C: Real>(x: TensorView, bias: TensorView, out: TensorView) -> Work {
    Work::new(move || {
        let cols = bias.numel();
        let rows = out.numel() / cols.max(1);
        let xs = input::<C>(&x, &[&out]);
        let bs = input::<C>(&bias, &[&out]);
        with_dense_output::<C>(&out, |y| {
            row_blocks(y, rows, cols, |r, block| {
                for (k, yr) in r.zip(block.chunks_exact_mut(cols)) {
                    for ((yv, &xv), &bv) in yr.iter_mut().zip(row(&xs, k, cols)).zip(bs.iter()) {
                        *yv = GeluErf.apply(xv + bv);
                    }
                }
            });
        });
        Ok(())
    })
}

/// `sim::fused_bias_gelu(Tensor x, Tensor bias) -> Tensor`:
/// `gelu(x + bias)`, `bias` broadcast over the last dimension.
pub(crate) fn fused_bias_gelu(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let metas = check_bias_gelu(ctx.op(), call.args, false)?;
    let x = input_view(ctx, call, 0, "x")?;
    let bias = input_view(ctx, call, 1, "bias")?;
    let [out] = outputs::<1>(ctx, call, &metas)?;
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(if out.dtype() == DType::Float64 {
        bias_gelu_work::<f64>(x, bias, out)
    } else {
        bias_gelu_work::<f32>(x, bias, out)
    }))
}

fn bias_gelu_backward_work<C: Real>(
    grad: TensorView,
    x: TensorView,
    bias: TensorView,
    grad_x: TensorView,
    grad_bias: TensorView,
) -> Work {
    Work::new(move || {
        let cols = bias.numel();
        let rows = x.numel().checked_div(cols).unwrap_or(0);
        let outs = [&grad_x, &grad_bias];
        let gs = input::<C>(&grad, &outs);
        let xs = input::<C>(&x, &outs);
        let bs = input::<C>(&bias, &outs);
        // Column sums of grad_x: one f64 partial per block of rows, added
        // in block order.
        let mut sums = vec![0f64; cols];
        with_dense_output::<C>(&grad_x, |gx| {
            let partials = row_blocks(gx, rows, cols, |r, block| {
                let mut acc = vec![0f64; cols];
                for (k, gxr) in r.zip(block.chunks_exact_mut(cols)) {
                    let (gr, xr) = (row(&gs, k, cols), row(&xs, k, cols));
                    for j in 0..cols {
                        let v = GeluErfBackward.apply(gr[j], xr[j] + bs[j]);
                        gxr[j] = v;
                        acc[j] += v.to_f64();
                    }
                }
                acc
            });
            for p in partials {
                for (s, v) in sums.iter_mut().zip(p) {
                    *s += v;
                }
            }
        });
        with_dense_output::<C>(&grad_bias, |gb| {
            for (o, &s) in gb.iter_mut().zip(&sums) {
                *o = C::from_f64(s);
            }
        });
        Ok(())
    })
}

/// `sim::fused_bias_gelu_backward(Tensor grad, Tensor x, Tensor bias) ->
/// (Tensor, Tensor)`: `grad_x = grad * gelu'(x + bias)` and `grad_bias`,
/// its sum over all dimensions but the last.
pub(crate) fn fused_bias_gelu_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let metas = check_bias_gelu(ctx.op(), call.args, true)?;
    let grad = input_view(ctx, call, 0, "grad")?;
    let x = input_view(ctx, call, 1, "x")?;
    let bias = input_view(ctx, call, 2, "bias")?;
    let [grad_x, grad_bias] = outputs::<2>(ctx, call, &metas)?;
    // An empty batch still has a (zero) bias gradient to write.
    if grad_x.numel() == 0 && grad_bias.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(if grad_x.dtype() == DType::Float64 {
        bias_gelu_backward_work::<f64>(grad, x, bias, grad_x, grad_bias)
    } else {
        bias_gelu_backward_work::<f32>(grad, x, bias, grad_x, grad_bias)
    }))
}

// ---------------------------------------------------------------------------
// softmax_cross_entropy
// ---------------------------------------------------------------------------

/// The log-sum-exp of a row of logits, in `f64`, with the row maximum
/// subtracted first so that large logits do not overflow. NaN propagates;
/// a row of `-inf` gives `-inf`.
fn log_sum_exp<C: Real>(x: &[C]) -> f64 {
    let mut m = f64::NEG_INFINITY;
    for &v in x {
        let v = v.to_f64();
        if v.is_nan() || v > m {
            m = v;
        }
    }
    if m == f64::NEG_INFINITY {
        m = 0.0;
    }
    let s: f64 = x.iter().map(|&v| (v.to_f64() - m).exp()).sum();
    m + s.ln()
}

fn cross_entropy_work<C: Real>(logits: TensorView, target: TensorView, out: TensorView) -> Work {
    Work::new(move || {
        let (rows, cols) = (logits.shape()[0], logits.shape()[1]);
        let xs = input::<C>(&logits, &[&out]);
        let ts = input::<C>(&target, &[&out]);
        // sum_c target * log_softmax, per row; added in row order.
        let mut per_row = vec![0f64; rows];
        row_blocks(&mut per_row, rows, cols, |r, block| {
            for (k, l) in r.zip(block.iter_mut()) {
                let (xr, tr) = (row(&xs, k, cols), row(&ts, k, cols));
                let lse = log_sum_exp(xr);
                *l = xr.iter().zip(tr).map(|(&x, &t)| t.to_f64() * (x.to_f64() - lse)).sum();
            }
        });
        let total: f64 = per_row.iter().sum();
        // The mean over no rows is NaN, as in PyTorch.
        let loss = -total / rows as f64;
        with_dense_output::<C>(&out, |o| o.fill(C::from_f64(loss)));
        Ok(())
    })
}

/// `sim::softmax_cross_entropy(Tensor logits, Tensor target) -> Tensor`:
/// the mean cross-entropy of `[N, C]` logits against class probabilities.
pub(crate) fn softmax_cross_entropy(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let metas = check_cross_entropy(ctx.op(), call.args, false)?;
    let logits = input_view(ctx, call, 0, "logits")?;
    let target = input_view(ctx, call, 1, "target")?;
    let [out] = outputs::<1>(ctx, call, &metas)?;
    Ok(Some(if out.dtype() == DType::Float64 {
        cross_entropy_work::<f64>(logits, target, out)
    } else {
        cross_entropy_work::<f32>(logits, target, out)
    }))
}

fn cross_entropy_backward_work<C: Real>(
    grad: TensorView,
    logits: TensorView,
    target: TensorView,
    grad_logits: TensorView,
    grad_target: TensorView,
) -> Work {
    Work::new(move || {
        let (rows, cols) = (logits.shape()[0], logits.shape()[1]);
        let g = gather::<f64>(&grad).first().copied().unwrap_or(f64::NAN);
        let scale = g / rows as f64;
        let outs = [&grad_logits, &grad_target];
        let xs = input::<C>(&logits, &outs);
        let ts = input::<C>(&target, &outs);
        // Per row: log-sum-exp and the sum of the targets.
        let mut stats = vec![(0f64, 0f64); rows];
        row_blocks(&mut stats, rows, cols, |r, block| {
            for (k, s) in r.zip(block.iter_mut()) {
                let tsum = row(&ts, k, cols).iter().map(|t| t.to_f64()).sum();
                *s = (log_sum_exp(row(&xs, k, cols)), tsum);
            }
        });
        with_dense_output::<C>(&grad_logits, |gl| {
            row_blocks(gl, rows, cols, |r, block| {
                for (k, out) in r.zip(block.chunks_exact_mut(cols)) {
                    let (lse, tsum) = stats[k];
                    for ((o, &x), &t) in out.iter_mut().zip(row(&xs, k, cols)).zip(row(&ts, k, cols)) {
                        let p = (x.to_f64() - lse).exp();
                        *o = C::from_f64(scale * (p * tsum - t.to_f64()));
                    }
                }
            });
        });
        with_dense_output::<C>(&grad_target, |gt| {
            row_blocks(gt, rows, cols, |r, block| {
                for (k, out) in r.zip(block.chunks_exact_mut(cols)) {
                    let lse = stats[k].0;
                    for (o, &x) in out.iter_mut().zip(row(&xs, k, cols)) {
                        *o = C::from_f64(-scale * (x.to_f64() - lse));
                    }
                }
            });
        });
        Ok(())
    })
}

/// `sim::softmax_cross_entropy_backward(Tensor grad, Tensor logits, Tensor
/// target) -> (Tensor, Tensor)`: the gradients of the loss with respect to
/// the logits and the target, for the 0-dim upstream gradient `grad`.
pub(crate) fn softmax_cross_entropy_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let metas = check_cross_entropy(ctx.op(), call.args, true)?;
    let grad = input_view(ctx, call, 0, "grad")?;
    let logits = input_view(ctx, call, 1, "logits")?;
    let target = input_view(ctx, call, 2, "target")?;
    let [grad_logits, grad_target] = outputs::<2>(ctx, call, &metas)?;
    if grad_logits.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(if grad_logits.dtype() == DType::Float64 {
        cross_entropy_backward_work::<f64>(grad, logits, target, grad_logits, grad_target)
    } else {
        cross_entropy_backward_work::<f32>(grad, logits, target, grad_logits, grad_target)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<'a>(dtype: DType, shape: &'a [i64]) -> ArgRef<'a> {
        ArgRef::Tensor(TensorRef { dtype, shape, strides: shape, data: super::super::TensorData::Meta })
    }

    #[test]
    fn row_blocks_are_fixed_by_sizes() {
        // 3 rows of TASK elements each: one block per row, in order.
        let mut out = vec![0u32; 3];
        let ranges = row_blocks(&mut out, 3, TASK, |r, b| {
            for v in b.iter_mut() {
                *v = r.start as u32 + 1;
            }
            r
        });
        assert_eq!(ranges, vec![0..1, 1..2, 2..3]);
        assert_eq!(out, vec![1, 2, 3]);
        // Small work: one block.
        let mut out = vec![0u8; 8];
        assert_eq!(row_blocks(&mut out, 4, 2, |r, b| (r, b.len())), vec![(0..4, 8)]);
        assert!(row_blocks(&mut out[..0], 0, 2, |r, _| r).is_empty());
    }

    #[test]
    fn log_sum_exp_is_stable() {
        let lse = log_sum_exp(&[1000.0f64, 1000.0]);
        assert!((lse - (1000.0 + 2f64.ln())).abs() < 1e-12);
        assert_eq!(log_sum_exp(&[f64::NEG_INFINITY, f64::NEG_INFINITY]), f64::NEG_INFINITY);
        assert!(log_sum_exp(&[f64::NAN, 1.0]).is_nan());
        assert_eq!(log_sum_exp::<f32>(&[]), f64::NEG_INFINITY);
    }

    #[test]
    fn checks_name_the_operator_and_shapes() {
        let (x, b4, b3) = ([2i64, 3, 4], [4i64], [3i64]);
        let ok =
            check_bias_gelu("sim::fused_bias_gelu", &[t(DType::Float32, &x), t(DType::Float32, &b4)], false)
                .unwrap();
        assert_eq!(ok, vec![OutputMeta { dtype: DType::Float32, shape: x.to_vec() }]);
        let e =
            check_bias_gelu("sim::fused_bias_gelu", &[t(DType::Float32, &x), t(DType::Float32, &b3)], false)
                .unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::InvalidArgument);
        assert!(e.message().starts_with("sim: sim::fused_bias_gelu: bias must be 1-D"), "{}", e.message());
        assert!(e.message().contains("[3]") && e.message().contains("[2, 3, 4]"), "{}", e.message());
        let e = check_bias_gelu("op", &[t(DType::Int64, &x), t(DType::Int64, &b4)], false).unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Unimplemented);
        let e =
            check_cross_entropy("op", &[t(DType::Float64, &x), t(DType::Float64, &x)], false).unwrap_err();
        assert!(e.message().contains("2-D"), "{}", e.message());
    }
}

//! Normalization: batch norm (`native_batch_norm`,
//! `_native_batch_norm_legit.no_stats`,
//! `_native_batch_norm_legit_no_training` and `native_batch_norm_backward`)
//! and layer norm (`native_layer_norm`, `native_layer_norm_backward`).
//!
//! Inputs are read as dense row-major buffers of the compute type (`f32`
//! for `f32`/`f16`/`bf16`, `f64` for `f64`); per-channel (batch norm) and
//! per-row (layer norm) statistics accumulate in `f64` with two passes
//! (mean, then centred squares), which is at least as accurate as
//! PyTorch's CPU kernels. Channels (statistics) and rows (outputs) are
//! spread across rayon. Weights, biases, running and saved statistics may
//! have another floating dtype than the input (mixed precision): they are
//! converted on load and store. Training-mode batch norm updates the
//! running statistics in place with PyTorch's momentum rule, the variance
//! unbiased (`var * M / (M - 1)`).
//!
//! `_native_batch_norm_legit` (the functional overload with mutable
//! running statistics) is not in the table: the host refuses to register it
//! (its returns do not alias its mutated arguments); PyTorch's CPU path
//! calls `native_batch_norm` anyway.

use rayon::prelude::*;

use super::elementwise::{gather, scatter};
use super::linalg::{read, write_with};
use super::real::{with_real, Real};
use super::view::{disjoint, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::Work;

/// Argument `i` as an optional device tensor.
fn opt_view(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<Option<TensorView>> {
    match call.args.get(i) {
        Some(ArgRef::Tensor(t)) => Ok(Some(ctx.device_view(t, name)?)),
        None | Some(ArgRef::None) => Ok(None),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a tensor or None"))),
    }
}

fn float_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<f64> {
    match call.args.get(i) {
        Some(ArgRef::Float(v)) => Ok(*v),
        Some(ArgRef::Int(v)) => Ok(*v as f64),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a float"))),
    }
}

fn mask_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize) -> Result<[bool; 3]> {
    match call.args.get(i) {
        Some(ArgRef::BoolList(m)) if m.len() == 3 => Ok([m[0], m[1], m[2]]),
        _ => Err(ctx.invalid(format!("argument {i} (output_mask) must be a list of 3 bools"))),
    }
}

/// Checks that an optional per-feature tensor has `n` elements and a
/// floating dtype.
fn check_vec(ctx: &KernelCtx<'_>, v: &Option<TensorView>, n: usize, name: &str) -> Result<()> {
    if let Some(v) = v {
        if v.numel() != n {
            return Err(ctx.invalid(format!("{name} should contain {n} elements, got {}", v.numel())));
        }
        if !v.dtype().is_floating() {
            return Err(ctx.unimplemented(format!("{name} of dtype {} is not supported", v.dtype())));
        }
    }
    Ok(())
}

/// Output `i` when it is to be written: present (mask), and with `n`
/// elements (an output the host allocated empty, like eval-mode saved
/// statistics, is skipped). Other sizes are refused.
fn opt_output(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    i: usize,
    n: usize,
    want: bool,
) -> Result<Option<TensorView>> {
    if !want || call.outputs.len() <= i {
        return Ok(None);
    }
    let o = ctx.output(call, i)?;
    if o.numel() == 0 && n != 0 {
        return Ok(None);
    }
    if o.numel() != n {
        return Err(ctx.invalid(format!("output {i} has {} elements, expected {n}", o.numel())));
    }
    if !o.dtype().is_floating() {
        return Err(ctx.invalid(format!("output {i} must be floating, got {}", o.dtype())));
    }
    Ok(Some(o))
}

fn check_disjoint(ctx: &KernelCtx<'_>, written: &[&TensorView], others: &[&TensorView]) -> Result<()> {
    for (i, w) in written.iter().enumerate() {
        for o in others.iter().chain(&written[i + 1..]) {
            if !disjoint(w, o) {
                return Err(ctx.invalid("an output shares memory with another operand"));
            }
        }
    }
    Ok(())
}

// ----------------------------------------------------------------- batch norm

/// The shape of a batch norm: `n` samples, `c` channels, `s` elements per
/// sample and channel.
#[derive(Debug, Clone, Copy)]
struct Bn {
    n: usize,
    c: usize,
    s: usize,
}

impl Bn {
    fn of(ctx: &KernelCtx<'_>, x: &TensorView) -> Result<Bn> {
        if x.ndim() < 2 {
            return Err(ctx.invalid(format!("input must have at least 2 dimensions, got {}", x.ndim())));
        }
        let sh = x.shape();
        Ok(Bn { n: sh[0], c: sh[1], s: sh[2..].iter().product() })
    }
    /// Elements per channel.
    fn m(&self) -> usize {
        self.n * self.s
    }
}

/// `for (n, c) rows of s elements`, per channel `c` in parallel:
/// `(sum of f(x), ...)`.
fn channel_sums(bn: Bn, f: impl Fn(usize, usize) -> f64 + Sync) -> Vec<f64> {
    (0..bn.c).into_par_iter().map(|c| (0..bn.n).map(|n| f(n, c)).sum()).collect()
}

struct BnForward {
    bn: Bn,
    x: TensorView,
    w: Option<TensorView>,
    b: Option<TensorView>,
    rm: Option<TensorView>,
    rv: Option<TensorView>,
    training: bool,
    momentum: f64,
    eps: f64,
    out: TensorView,
    save_mean: Option<TensorView>,
    save_invstd: Option<TensorView>,
}

fn bn_forward<C: Real>(p: &BnForward) {
    let Bn { n: _, c: nc, s } = p.bn;
    let xs = read::<C>(&p.x);
    let row = |n: usize, c: usize| &xs[(n * nc + c) * s..(n * nc + c + 1) * s];
    let (mean, invstd): (Vec<f64>, Vec<f64>) = if p.training {
        let m = p.bn.m().max(1) as f64;
        let mean: Vec<f64> = channel_sums(p.bn, |n, c| row(n, c).iter().map(|v| v.wide()).sum())
            .into_iter()
            .map(|v| v / m)
            .collect();
        let var: Vec<f64> = channel_sums(p.bn, |n, c| {
            row(n, c).iter().map(|v| (v.wide() - mean[c]) * (v.wide() - mean[c])).sum()
        })
        .into_iter()
        .map(|v| v / m)
        .collect();
        let cnt = p.bn.m() as f64;
        if let Some(rm) = &p.rm {
            let old = gather::<f64>(rm);
            let new: Vec<f64> =
                old.iter().zip(&mean).map(|(&o, &v)| (1.0 - p.momentum) * o + p.momentum * v).collect();
            scatter(rm, &new);
        }
        if let Some(rv) = &p.rv {
            let old = gather::<f64>(rv);
            let new: Vec<f64> = old
                .iter()
                .zip(&var)
                .map(|(&o, &v)| (1.0 - p.momentum) * o + p.momentum * v * cnt / (cnt - 1.0))
                .collect();
            scatter(rv, &new);
        }
        let invstd = var.iter().map(|&v| 1.0 / (v + p.eps).sqrt()).collect();
        (mean, invstd)
    } else {
        // Validation guarantees both running statistics in eval mode.
        let mean = p.rm.as_ref().map(gather::<f64>).unwrap_or_else(|| vec![0.0; nc]);
        let var = p.rv.as_ref().map(gather::<f64>).unwrap_or_else(|| vec![1.0; nc]);
        (mean, var.iter().map(|&v| 1.0 / (v + p.eps).sqrt()).collect())
    };
    let w = p.w.as_ref().map(gather::<f64>);
    let b = p.b.as_ref().map(gather::<f64>);
    // out = x * scale + shift, per channel.
    let scale: Vec<C> = (0..nc).map(|c| C::of(invstd[c] * w.as_ref().map_or(1.0, |w| w[c]))).collect();
    let shift: Vec<C> = (0..nc)
        .map(|c| {
            let sc = invstd[c] * w.as_ref().map_or(1.0, |w| w[c]);
            C::of(b.as_ref().map_or(0.0, |b| b[c]) - mean[c] * sc)
        })
        .collect();
    let mut ins = vec![&p.x];
    ins.extend(p.w.iter().chain(&p.b).chain(&p.rm).chain(&p.rv));
    if s > 0 {
        write_with::<C>(&p.out, &ins, |o| {
            o.par_chunks_mut(s).zip(xs.par_chunks(s)).enumerate().for_each(|(i, (orow, xrow))| {
                let (sc, sh) = (scale[i % nc], shift[i % nc]);
                orow.iter_mut().zip(xrow).for_each(|(o, &x)| *o = x * sc + sh);
            });
        });
    }
    if let Some(o) = &p.save_mean {
        scatter(o, &mean);
    }
    if let Some(o) = &p.save_invstd {
        scatter(o, &invstd);
    }
}

/// Shared front end of the batch-norm forwards. `stats`: argument index of
/// `running_mean` (followed by `running_var`), or `None` (`no_stats`);
/// `training`: the index of the `training` flag or a fixed value; then
/// `momentum` and `eps` follow.
fn batch_norm_impl(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    stats: Option<usize>,
    training: Result<usize, bool>,
) -> Result<Option<Work>> {
    let after = stats.map_or(3, |i| i + 2);
    let mom_i = after + usize::from(training.is_ok());
    let args = Args::new(ctx, call, mom_i + 2, mom_i + 2)?;
    let x = ctx.device_view(args.tensor(0, "input")?, "input")?;
    let bn = Bn::of(ctx, &x)?;
    let w = opt_view(ctx, call, 1, "weight")?;
    let b = opt_view(ctx, call, 2, "bias")?;
    let (rm, rv) = match stats {
        Some(i) => (opt_view(ctx, call, i, "running_mean")?, opt_view(ctx, call, i + 1, "running_var")?),
        None => (None, None),
    };
    let training = match training {
        Ok(i) => args.bool_or(i, "training", false)?,
        Err(t) => t,
    };
    let momentum = float_arg(ctx, call, mom_i, "momentum")?;
    let eps = float_arg(ctx, call, mom_i + 1, "eps")?;
    for (v, name) in [(&w, "weight"), (&b, "bias"), (&rm, "running_mean"), (&rv, "running_var")] {
        check_vec(ctx, v, bn.c, name)?;
    }
    if !training && (rm.is_none() || rv.is_none()) {
        return Err(ctx.invalid("running_mean and running_var must be defined in evaluation mode"));
    }
    let out = ctx.output(call, 0)?;
    if out.shape() != x.shape() {
        return Err(ctx.invalid(format!("output has shape {:?}, expected {:?}", out.shape(), x.shape())));
    }
    let save_mean = opt_output(ctx, call, 1, bn.c, true)?;
    let save_invstd = opt_output(ctx, call, 2, bn.c, true)?;
    {
        let mut written: Vec<&TensorView> = vec![&out];
        if training {
            written.extend(rm.iter().chain(&rv));
        }
        written.extend(save_mean.iter().chain(&save_invstd));
        let mut others = vec![&x];
        others.extend(w.iter().chain(&b));
        if !training {
            others.extend(rm.iter().chain(&rv));
        }
        check_disjoint(ctx, &written, &others)?;
    }
    if bn.c == 0 && x.numel() == 0 {
        return Ok(None);
    }
    let p = BnForward { bn, x, w, b, rm, rv, training, momentum, eps, out, save_mean, save_invstd };
    with_real!(ctx, p.x.dtype(), C => Ok(Some(Work::new(move || {
        bn_forward::<C>(&p);
        Ok(())
    }))))
}

/// `native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor?
/// running_mean, Tensor? running_var, bool training, float momentum, float
/// eps) -> (Tensor, Tensor, Tensor)`: output, saved mean and saved inverse
/// standard deviation (the latter two empty in evaluation mode).
pub(crate) fn native_batch_norm(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    batch_norm_impl(ctx, call, Some(3), Ok(5))
}

/// `_native_batch_norm_legit.no_stats(Tensor input, Tensor? weight, Tensor?
/// bias, bool training, float momentum, float eps) -> (Tensor, Tensor,
/// Tensor)`
pub(crate) fn native_batch_norm_legit_no_stats(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
) -> Result<Option<Work>> {
    batch_norm_impl(ctx, call, None, Ok(3))
}

/// `_native_batch_norm_legit_no_training(Tensor input, Tensor? weight,
/// Tensor? bias, Tensor running_mean, Tensor running_var, float momentum,
/// float eps) -> (Tensor, Tensor, Tensor)`
pub(crate) fn native_batch_norm_legit_no_training(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
) -> Result<Option<Work>> {
    batch_norm_impl(ctx, call, Some(3), Err(false))
}

struct BnBackward {
    bn: Bn,
    gy: TensorView,
    x: TensorView,
    w: Option<TensorView>,
    /// Mean and inverse standard deviation (saved or from running stats).
    mean: TensorView,
    invstd: Option<TensorView>,
    var: Option<TensorView>,
    train: bool,
    eps: f64,
    outs: [Option<TensorView>; 3],
}

fn bn_backward<C: Real>(p: &BnBackward) {
    let Bn { n: _, c: nc, s } = p.bn;
    let (gys, xs) = (read::<C>(&p.gy), read::<C>(&p.x));
    let mean = gather::<f64>(&p.mean);
    let invstd: Vec<f64> = match (&p.invstd, &p.var) {
        (Some(i), _) => gather::<f64>(i),
        (None, Some(v)) => gather::<f64>(v).iter().map(|&v| 1.0 / (v + p.eps).sqrt()).collect(),
        (None, None) => vec![1.0; nc],
    };
    let w = p.w.as_ref().map_or_else(|| vec![1.0; nc], gather::<f64>);
    let at = |n: usize, c: usize| (n * nc + c) * s..(n * nc + c + 1) * s;
    let sum_gy = channel_sums(p.bn, |n, c| gys[at(n, c)].iter().map(|v| v.wide()).sum());
    let dotp = channel_sums(p.bn, |n, c| {
        gys[at(n, c)].iter().zip(&xs[at(n, c)]).map(|(g, x)| g.wide() * (x.wide() - mean[c])).sum()
    });
    let mut ins = vec![&p.gy, &p.x, &p.mean];
    ins.extend(p.w.iter().chain(&p.invstd).chain(&p.var));
    if let Some(gx) = &p.outs[0] {
        let m = p.bn.m().max(1) as f64;
        // PyTorch's form: gx = (gy - mean(gy) - (x - mean) * proj) * k,
        // centring x before scaling (folding the mean into a per-channel
        // constant would bias every element of a channel by the same
        // rounding error, which the weight gradient of the layer below
        // then sums up).
        let coef: Vec<(C, C, C, C)> = (0..nc)
            .map(|c| {
                let k = invstd[c] * w[c];
                if p.train {
                    let proj = dotp[c] * invstd[c] * invstd[c] / m;
                    (C::of(k), C::of(mean[c]), C::of(proj), C::of(sum_gy[c] / m))
                } else {
                    (C::of(k), C::ZERO, C::ZERO, C::ZERO)
                }
            })
            .collect();
        if s > 0 {
            write_with::<C>(gx, &ins, |o| {
                o.par_chunks_mut(s).zip(gys.par_chunks(s).zip(xs.par_chunks(s))).enumerate().for_each(
                    |(i, (orow, (grow, xrow)))| {
                        let (k, mu, proj, gm) = coef[i % nc];
                        if p.train {
                            for ((o, &g), &x) in orow.iter_mut().zip(grow).zip(xrow) {
                                *o = (g - gm - (x - mu) * proj) * k;
                            }
                        } else {
                            for (o, &g) in orow.iter_mut().zip(grow) {
                                *o = g * k;
                            }
                        }
                    },
                );
            });
        }
    }
    if let Some(gw) = &p.outs[1] {
        let v: Vec<f64> = (0..nc).map(|c| dotp[c] * invstd[c]).collect();
        scatter(gw, &v);
    }
    if let Some(gb) = &p.outs[2] {
        scatter(gb, &sum_gy);
    }
}

/// `native_batch_norm_backward(Tensor grad_out, Tensor input, Tensor?
/// weight, Tensor? running_mean, Tensor? running_var, Tensor? save_mean,
/// Tensor? save_invstd, bool train, float eps, bool[3] output_mask) ->
/// (Tensor, Tensor, Tensor)`: gradients for input, weight and bias.
pub(crate) fn native_batch_norm_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 10, 10)?;
    let gy = ctx.device_view(args.tensor(0, "grad_out")?, "grad_out")?;
    let x = ctx.device_view(args.tensor(1, "input")?, "input")?;
    let bn = Bn::of(ctx, &x)?;
    let w = opt_view(ctx, call, 2, "weight")?;
    let rm = opt_view(ctx, call, 3, "running_mean")?;
    let rv = opt_view(ctx, call, 4, "running_var")?;
    let sm = opt_view(ctx, call, 5, "save_mean")?;
    let si = opt_view(ctx, call, 6, "save_invstd")?;
    let train = args.bool_or(7, "train", false)?;
    let eps = float_arg(ctx, call, 8, "eps")?;
    let mask = mask_arg(ctx, call, 9)?;
    if gy.shape() != x.shape() || gy.dtype() != x.dtype() {
        return Err(ctx.invalid(format!(
            "grad_out ({:?}, {}) must match input ({:?}, {})",
            gy.shape(),
            gy.dtype(),
            x.shape(),
            x.dtype()
        )));
    }
    // Saved statistics may be empty when training is off.
    let sm = sm.filter(|v| v.numel() > 0 || bn.c == 0);
    let si = si.filter(|v| v.numel() > 0 || bn.c == 0);
    for (v, name) in [
        (&w, "weight"),
        (&rm, "running_mean"),
        (&rv, "running_var"),
        (&sm, "save_mean"),
        (&si, "save_invstd"),
    ] {
        check_vec(ctx, v, bn.c, name)?;
    }
    let (mean, invstd, var) = if train {
        match (sm, si) {
            (Some(m), Some(i)) => (m, Some(i), None),
            _ => return Err(ctx.invalid("save_mean and save_invstd must be defined in training mode")),
        }
    } else {
        match (rm, rv) {
            (Some(m), Some(v)) => (m, None, Some(v)),
            _ => return Err(ctx.invalid("running_mean and running_var must be defined in evaluation mode")),
        }
    };
    let outs = [
        opt_output(ctx, call, 0, x.numel(), mask[0])?,
        opt_output(ctx, call, 1, bn.c, mask[1])?,
        opt_output(ctx, call, 2, bn.c, mask[2])?,
    ];
    if let Some(o) = &outs[0] {
        if o.shape() != x.shape() {
            return Err(ctx.invalid(format!(
                "grad_input has shape {:?}, expected {:?}",
                o.shape(),
                x.shape()
            )));
        }
    }
    {
        let written: Vec<&TensorView> = outs.iter().flatten().collect();
        let mut others = vec![&gy, &x, &mean];
        others.extend(w.iter().chain(&invstd).chain(&var));
        check_disjoint(ctx, &written, &others)?;
    }
    if outs.iter().all(Option::is_none) {
        return Ok(None);
    }
    let p = BnBackward { bn, gy, x, w, mean, invstd, var, train, eps, outs };
    with_real!(ctx, p.x.dtype(), C => Ok(Some(Work::new(move || {
        bn_backward::<C>(&p);
        Ok(())
    }))))
}

// ----------------------------------------------------------------- layer norm

/// Splits `input`'s shape at `normalized_shape`: (rows, row length).
fn ln_split(ctx: &KernelCtx<'_>, x: &TensorView, normalized: &[i64]) -> Result<(usize, usize)> {
    let nd = normalized.len();
    let xs = x.shape();
    let ok = nd >= 1
        && nd <= xs.len()
        && xs[xs.len() - nd..].iter().zip(normalized).all(|(&a, &b)| b >= 0 && a == b as usize);
    if !ok {
        return Err(ctx.invalid(format!(
            "Given normalized_shape={normalized:?}, expected input with shape [*, {}], but got input \
             of size {xs:?}",
            normalized.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
        )));
    }
    let inner: usize = xs[xs.len() - nd..].iter().product();
    let outer: usize = xs[..xs.len() - nd].iter().product();
    Ok((outer, inner))
}

fn int_list<'a>(ctx: &KernelCtx<'_>, call: &'a Frame<'a>, i: usize, name: &str) -> Result<&'a [i64]> {
    match call.args.get(i) {
        Some(ArgRef::IntList(v)) => Ok(v),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be an int list"))),
    }
}

/// `native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor?
/// weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)`: output,
/// per-row mean and reciprocal standard deviation.
pub(crate) fn native_layer_norm(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 5, 5)?;
    let x = ctx.device_view(args.tensor(0, "input")?, "input")?;
    let (rows, len) = ln_split(ctx, &x, int_list(ctx, call, 1, "normalized_shape")?)?;
    let w = opt_view(ctx, call, 2, "weight")?;
    let b = opt_view(ctx, call, 3, "bias")?;
    let eps = float_arg(ctx, call, 4, "eps")?;
    check_vec(ctx, &w, len, "weight")?;
    check_vec(ctx, &b, len, "bias")?;
    let out = ctx.output(call, 0)?;
    if out.shape() != x.shape() {
        return Err(ctx.invalid(format!("output has shape {:?}, expected {:?}", out.shape(), x.shape())));
    }
    let mean = opt_output(ctx, call, 1, rows, true)?;
    let rstd = opt_output(ctx, call, 2, rows, true)?;
    {
        let written: Vec<&TensorView> = std::iter::once(&out).chain(&mean).chain(&rstd).collect();
        let mut others = vec![&x];
        others.extend(w.iter().chain(&b));
        check_disjoint(ctx, &written, &others)?;
    }
    if rows == 0 {
        return Ok(None);
    }
    with_real!(ctx, x.dtype(), C => Ok(Some(Work::new(move || {
        let xs = read::<C>(&x);
        let wv = w.as_ref().map(gather::<C>);
        let bv = b.as_ref().map(gather::<C>);
        let mut stats = vec![(0f64, 0f64); rows];
        let mut ins = vec![&x];
        ins.extend(w.iter().chain(&b));
        if len > 0 {
            write_with::<C>(&out, &ins, |o| {
                o.par_chunks_mut(len).zip(xs.par_chunks(len)).zip(stats.par_iter_mut()).for_each(
                    |((orow, xrow), st)| {
                        let mu = xrow.iter().map(|v| v.wide()).sum::<f64>() / len as f64;
                        let var = xrow.iter().map(|v| (v.wide() - mu) * (v.wide() - mu)).sum::<f64>()
                            / len as f64;
                        let r = 1.0 / (var + eps).sqrt();
                        *st = (mu, r);
                        let (muc, rc) = (C::of(mu), C::of(r));
                        for (j, (o, &xv)) in orow.iter_mut().zip(xrow).enumerate() {
                            let mut v = (xv - muc) * rc;
                            if let Some(w) = &wv {
                                v *= w[j];
                            }
                            if let Some(b) = &bv {
                                v += b[j];
                            }
                            *o = v;
                        }
                    },
                );
            });
        } else {
            stats.iter_mut().for_each(|s| *s = (f64::NAN, f64::NAN));
        }
        if let Some(m) = &mean {
            scatter(m, &stats.iter().map(|s| s.0).collect::<Vec<_>>());
        }
        if let Some(r) = &rstd {
            scatter(r, &stats.iter().map(|s| s.1).collect::<Vec<_>>());
        }
        Ok(())
    }))))
}

/// `native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[]
/// normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor?
/// bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)`
pub(crate) fn native_layer_norm_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 8, 8)?;
    let gy = ctx.device_view(args.tensor(0, "grad_out")?, "grad_out")?;
    let x = ctx.device_view(args.tensor(1, "input")?, "input")?;
    let (rows, len) = ln_split(ctx, &x, int_list(ctx, call, 2, "normalized_shape")?)?;
    let mean = ctx.device_view(args.tensor(3, "mean")?, "mean")?;
    let rstd = ctx.device_view(args.tensor(4, "rstd")?, "rstd")?;
    let w = opt_view(ctx, call, 5, "weight")?;
    opt_view(ctx, call, 6, "bias")?;
    let mask = mask_arg(ctx, call, 7)?;
    if gy.shape() != x.shape() {
        return Err(ctx.invalid(format!("grad_out has shape {:?}, expected {:?}", gy.shape(), x.shape())));
    }
    if mean.numel() != rows || rstd.numel() != rows {
        return Err(ctx.invalid(format!("mean and rstd must have {rows} elements")));
    }
    check_vec(ctx, &w, len, "weight")?;
    let outs = [
        opt_output(ctx, call, 0, x.numel(), mask[0])?,
        opt_output(ctx, call, 1, len, mask[1])?,
        opt_output(ctx, call, 2, len, mask[2])?,
    ];
    {
        let written: Vec<&TensorView> = outs.iter().flatten().collect();
        let mut others = vec![&gy, &x, &mean, &rstd];
        others.extend(w.iter());
        check_disjoint(ctx, &written, &others)?;
    }
    if outs.iter().all(Option::is_none) {
        return Ok(None);
    }
    if x.dtype() == DType::Bool {
        return Err(ctx.unimplemented("bool input"));
    }
    with_real!(ctx, x.dtype(), C => Ok(Some(Work::new(move || {
        let (gys, xs) = (read::<C>(&gy), read::<C>(&x));
        let (mu, rs) = (gather::<f64>(&mean), gather::<f64>(&rstd));
        let wv: Vec<f64> = w.as_ref().map_or_else(|| vec![1.0; len], gather::<f64>);
        let mut ins = vec![&gy, &x, &mean, &rstd];
        ins.extend(w.iter());
        if let (Some(gx), true) = (&outs[0], len > 0) {
            write_with::<C>(gx, &ins, |o| {
                o.par_chunks_mut(len).zip(gys.par_chunks(len).zip(xs.par_chunks(len))).enumerate().for_each(
                    |(i, (orow, (grow, xrow)))| {
                        let (m, r) = (mu[i], rs[i]);
                        let (mut sa, mut sax) = (0f64, 0f64);
                        for j in 0..len {
                            let a = grow[j].wide() * wv[j];
                            sa += a;
                            sax += a * (xrow[j].wide() - m) * r;
                        }
                        let (sa, sax) = (sa / len as f64, sax / len as f64);
                        for j in 0..len {
                            let xh = (xrow[j].wide() - m) * r;
                            orow[j] = C::of(r * (grow[j].wide() * wv[j] - sa - xh * sax));
                        }
                    },
                );
            });
        }
        if (outs[1].is_some() || outs[2].is_some()) && len > 0 {
            let threads = rayon::current_num_threads().clamp(1, rows.max(1));
            let per = rows.div_ceil(threads).max(1);
            let (gw, gb) = (0..threads)
                .into_par_iter()
                .map(|t| {
                    let (mut gw, mut gb) = (vec![0f64; len], vec![0f64; len]);
                    for i in t * per..((t + 1) * per).min(rows) {
                        let (grow, xrow) = (&gys[i * len..(i + 1) * len], &xs[i * len..(i + 1) * len]);
                        for j in 0..len {
                            let g = grow[j].wide();
                            gw[j] += g * (xrow[j].wide() - mu[i]) * rs[i];
                            gb[j] += g;
                        }
                    }
                    (gw, gb)
                })
                .reduce_with(|(mut a, mut b), (c, d)| {
                    a.iter_mut().zip(&c).for_each(|(x, y)| *x += y);
                    b.iter_mut().zip(&d).for_each(|(x, y)| *x += y);
                    (a, b)
                })
                .unwrap_or_else(|| (vec![0.0; len], vec![0.0; len]));
            if let Some(o) = &outs[1] {
                scatter(o, &gw);
            }
            if let Some(o) = &outs[2] {
                scatter(o, &gb);
            }
        }
        Ok(())
    }))))
}

//! 2-D pooling: `max_pool2d_with_indices`, `avg_pool2d`,
//! `_adaptive_avg_pool2d` and their backwards, for batched (`N, C, H, W`)
//! and unbatched (`C, H, W`) inputs.
//!
//! Every op treats its input as `planes` independent `H x W` images read
//! as one dense buffer of the compute type (`f32` for `f32`/`f16`/`bf16`,
//! `f64` for `f64`) and processes planes in parallel. Window bounds follow
//! PyTorch's CPU kernels exactly (padding, dilation, `ceil_mode`'s clipped
//! last window, `count_include_pad`, `divisor_override`, adaptive
//! `floor`/`ceil` bounds), and max pooling propagates NaN and records the
//! flat `h * W + w` index of the first maximum, as PyTorch does. Backwards
//! scatter-add into a zeroed plane, so overlapping windows accumulate.

use rayon::prelude::*;

use super::linalg::{read, write_with};
use super::real::{with_real, Real};
use super::view::{disjoint, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::Work;

/// Sizes of a pooling: images of `h x w` in, `ho x wo`
/// out.
#[derive(Debug, Clone, Copy)]
struct Planes {
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
}

impl Planes {
    fn of(ctx: &KernelCtx<'_>, x: &TensorView, out: &[usize]) -> Result<Planes> {
        let xs = x.shape();
        if !(xs.len() == 3 || xs.len() == 4) || out.len() != xs.len() {
            return Err(ctx.invalid(format!(
                "expected a 3-D or 4-D input (and output of the same rank), got input {xs:?}, output \
                 {out:?}"
            )));
        }
        let d = xs.len();
        if xs[..d - 2] != out[..d - 2] {
            return Err(ctx.invalid(format!("output shape {out:?} does not match input shape {xs:?}")));
        }
        let planes: usize = xs[..d - 2].iter().product();
        if planes > 0 && xs[d - 2] * xs[d - 1] == 0 {
            return Err(ctx.invalid(format!("expected non-empty spatial dimensions, got input {xs:?}")));
        }
        Ok(Planes { h: xs[d - 2], w: xs[d - 1], ho: out[d - 2], wo: out[d - 1] })
    }
    fn hw(&self) -> usize {
        self.h * self.w
    }
    fn hwo(&self) -> usize {
        self.ho * self.wo
    }
}

/// A pooling window: rows `h0..h1`, columns `w0..w1`, every `dh`/`dw`-th,
/// and the averaging divisor.
#[derive(Debug, Clone, Copy)]
struct Window {
    h0: usize,
    h1: usize,
    w0: usize,
    w1: usize,
    div: f64,
}

/// The kernel-size/stride/padding/dilation parameters of a fixed-window
/// pooling.
#[derive(Debug, Clone, Copy)]
struct Params {
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
    dh: usize,
    dw: usize,
}

/// Reads an `int[2]` argument (one value means both); `None` when absent
/// or empty.
fn pair(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<Option<[i64; 2]>> {
    match call.args.get(i) {
        None | Some(ArgRef::None) => Ok(None),
        Some(ArgRef::IntList([])) => Ok(None),
        Some(ArgRef::IntList(v)) if v.len() == 1 => Ok(Some([v[0], v[0]])),
        Some(ArgRef::IntList(v)) if v.len() == 2 => Ok(Some([v[0], v[1]])),
        Some(ArgRef::Int(v)) => Ok(Some([*v, *v])),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a list of 1 or 2 ints"))),
    }
}

/// PyTorch's `pooling_output_shape`.
fn out_size(input: usize, k: usize, pad: usize, stride: usize, dil: usize, ceil: bool) -> i64 {
    let (i, k, p, s, d) = (input as i64, k as i64, pad as i64, stride as i64, dil as i64);
    let num = i + 2 * p - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 };
    let mut o = num.div_euclid(s) + 1;
    if ceil && (o - 1) * s >= i + p {
        o -= 1;
    }
    o
}

/// Parses `kernel_size, stride, padding[, dilation]` from argument `i` on
/// and checks the output size against PyTorch's formula.
fn params(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    i: usize,
    dilation: bool,
    ceil: bool,
    pl: &Planes,
) -> Result<Params> {
    let k = pair(ctx, call, i, "kernel_size")?
        .ok_or_else(|| ctx.invalid("kernel_size must have 1 or 2 values"))?;
    let s = pair(ctx, call, i + 1, "stride")?.unwrap_or(k);
    let p = pair(ctx, call, i + 2, "padding")?.unwrap_or([0, 0]);
    let d = if dilation { pair(ctx, call, i + 3, "dilation")?.unwrap_or([1, 1]) } else { [1, 1] };
    if k.iter().any(|&v| v <= 0) {
        return Err(ctx.invalid(format!("kernel size should be greater than zero, but got {k:?}")));
    }
    if s.iter().any(|&v| v <= 0) {
        return Err(ctx.invalid(format!("stride should be greater than zero, but got {s:?}")));
    }
    if d.iter().any(|&v| v <= 0) {
        return Err(ctx.invalid(format!("dilation should be greater than zero, but got {d:?}")));
    }
    if p.iter().any(|&v| v < 0) || p[0] > ((k[0] - 1) * d[0] + 1) / 2 || p[1] > ((k[1] - 1) * d[1] + 1) / 2 {
        return Err(ctx.invalid(format!(
            "pad should be at most half of effective kernel size, but got pad={p:?}, kernel_size={k:?}"
        )));
    }
    let u = |v: i64| v as usize;
    let q = Params {
        kh: u(k[0]),
        kw: u(k[1]),
        sh: u(s[0]),
        sw: u(s[1]),
        ph: u(p[0]),
        pw: u(p[1]),
        dh: u(d[0]),
        dw: u(d[1]),
    };
    let eh = out_size(pl.h, q.kh, q.ph, q.sh, q.dh, ceil);
    let ew = out_size(pl.w, q.kw, q.pw, q.sw, q.dw, ceil);
    if eh < 1 || ew < 1 || eh as usize != pl.ho || ew as usize != pl.wo {
        return Err(ctx.invalid(format!(
            "output size {}x{} does not match the expected {eh}x{ew} for input {}x{}",
            pl.ho, pl.wo, pl.h, pl.w
        )));
    }
    Ok(q)
}

fn check_dtypes(ctx: &KernelCtx<'_>, x: &TensorView, others: &[&TensorView]) -> Result<()> {
    for o in others {
        if o.dtype() != x.dtype() {
            return Err(ctx.invalid(format!("expected dtype {}, got {}", x.dtype(), o.dtype())));
        }
    }
    Ok(())
}

// ------------------------------------------------------------------- max pool

/// The max-pool window of output `(oh, ow)` (PyTorch's CPU bounds: the
/// start advanced past the padding by whole dilation steps).
fn max_window(q: &Params, pl: &Planes, oh: usize, ow: usize) -> Window {
    let bound = |o: usize, s: usize, p: usize, k: usize, d: usize, n: usize| {
        let mut start = (o * s) as isize - p as isize;
        let end = (start + ((k - 1) * d) as isize + 1).min(n as isize);
        while start < 0 {
            start += d as isize;
        }
        (start as usize, end.max(start) as usize)
    };
    let (h0, h1) = bound(oh, q.sh, q.ph, q.kh, q.dh, pl.h);
    let (w0, w1) = bound(ow, q.sw, q.pw, q.kw, q.dw, pl.w);
    Window { h0, h1, w0, w1, div: 1.0 }
}

/// `max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2]
/// stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) ->
/// (Tensor, Tensor)` (outputs: values, int64 indices).
pub(crate) fn max_pool2d_with_indices(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 6)?;
    let x = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let out = ctx.output(call, 0)?;
    let idx = ctx.output(call, 1)?;
    let pl = Planes::of(ctx, &x, out.shape())?;
    let ceil = args.bool_or(5, "ceil_mode", false)?;
    let q = params(ctx, call, 1, true, ceil, &pl)?;
    check_dtypes(ctx, &x, &[&out])?;
    if idx.dtype() != DType::Int64 || idx.shape() != out.shape() {
        return Err(ctx.invalid("indices must be an int64 tensor shaped like the output"));
    }
    if !disjoint(&out, &idx) || !disjoint(&out, &x) || !disjoint(&idx, &x) {
        return Err(ctx.invalid("the outputs share memory with each other or the input"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    with_real!(ctx, x.dtype(), C => Ok(Some(Work::new(move || {
        let xs = read::<C>(&x);
        let mut best = vec![0i64; out.numel()];
        write_with::<C>(&out, &[&x], |o| {
            o.par_chunks_mut(pl.hwo()).zip(best.par_chunks_mut(pl.hwo())).zip(xs.par_chunks(pl.hw())).for_each(
                |((orow, irow), plane)| {
                    for oh in 0..pl.ho {
                        for ow in 0..pl.wo {
                            let wd = max_window(&q, &pl, oh, ow);
                            let mut bi = wd.h0 * pl.w + wd.w0;
                            let mut bv = C::of(f64::NEG_INFINITY);
                            for ih in (wd.h0..wd.h1).step_by(q.dh) {
                                for iw in (wd.w0..wd.w1).step_by(q.dw) {
                                    let v = plane[ih * pl.w + iw];
                                    if v > bv || v.is_nan() {
                                        bv = v;
                                        bi = ih * pl.w + iw;
                                    }
                                }
                            }
                            orow[oh * pl.wo + ow] = bv;
                            irow[oh * pl.wo + ow] = bi as i64;
                        }
                    }
                },
            );
        });
        write_with::<i64>(&idx, &[&x], |o| o.copy_from_slice(&best));
        Ok(())
    }))))
}

/// `max_pool2d_with_indices_backward(Tensor grad_output, Tensor self,
/// int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool
/// ceil_mode, Tensor indices) -> Tensor`
pub(crate) fn max_pool2d_with_indices_backward(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 8, 8)?;
    let gy = ctx.device_view(args.tensor(0, "grad_output")?, "grad_output")?;
    let x = ctx.device_view(args.tensor(1, "self")?, "self")?;
    let idx = ctx.device_view(args.tensor(7, "indices")?, "indices")?;
    let gx = ctx.output(call, 0)?;
    let pl = Planes::of(ctx, &x, gy.shape())?;
    let ceil = args.bool_or(6, "ceil_mode", false)?;
    params(ctx, call, 2, true, ceil, &pl)?;
    check_dtypes(ctx, &x, &[&gy, &gx])?;
    if gx.shape() != x.shape() {
        return Err(ctx.invalid(format!("grad_input has shape {:?}, expected {:?}", gx.shape(), x.shape())));
    }
    if idx.dtype() != DType::Int64 || idx.shape() != gy.shape() {
        return Err(ctx.invalid("indices must be an int64 tensor shaped like grad_output"));
    }
    if !disjoint(&gx, &gy) || !disjoint(&gx, &idx) {
        return Err(ctx.invalid("grad_input shares memory with an input"));
    }
    if gx.numel() == 0 {
        return Ok(None);
    }
    with_real!(ctx, x.dtype(), C => Ok(Some(Work::new(move || {
        let (gs, is) = (read::<C>(&gy), read::<i64>(&idx));
        let hw = pl.hw();
        if is.iter().any(|&i| i < 0 || i as usize >= hw) {
            return Err(Error::invalid("sim: max_pool2d_with_indices_backward: index out of range"));
        }
        write_with::<C>(&gx, &[&gy, &idx], |o| {
            o.par_chunks_mut(hw).enumerate().for_each(|(p, plane)| {
                plane.fill(C::ZERO);
                let n = pl.hwo();
                for (&g, &i) in gs[p * n..(p + 1) * n].iter().zip(&is[p * n..(p + 1) * n]) {
                    plane[i as usize] += g;
                }
            });
        });
        Ok(())
    }))))
}

// ------------------------------------------------------------------- avg pool

/// How an average pooling picks its windows.
#[derive(Debug, Clone, Copy)]
enum Avg {
    Fixed { q: Params, count_include_pad: bool, divisor: Option<usize> },
    Adaptive,
}

impl Avg {
    fn window(&self, pl: &Planes, oh: usize, ow: usize) -> Window {
        match *self {
            Avg::Fixed { q, count_include_pad, divisor } => {
                let span = |o: usize, s: usize, p: usize, k: usize, n: usize| {
                    let start = (o * s) as isize - p as isize;
                    let end = (start + k as isize).min((n + p) as isize);
                    let size = end - start;
                    (start.max(0) as usize, end.min(n as isize).max(0) as usize, size)
                };
                let (h0, h1, sh) = span(oh, q.sh, q.ph, q.kh, pl.h);
                let (w0, w1, sw) = span(ow, q.sw, q.pw, q.kw, pl.w);
                let div = match divisor {
                    Some(d) => d as f64,
                    None if count_include_pad => (sh * sw) as f64,
                    None => (h1.saturating_sub(h0) * w1.saturating_sub(w0)) as f64,
                };
                Window { h0, h1: h1.max(h0), w0, w1: w1.max(w0), div }
            }
            Avg::Adaptive => {
                let lo = |o: usize, i: usize, n: usize| (o * i) / n;
                let hi = |o: usize, i: usize, n: usize| ((o + 1) * i).div_ceil(n);
                let (h0, h1) = (lo(oh, pl.h, pl.ho), hi(oh, pl.h, pl.ho));
                let (w0, w1) = (lo(ow, pl.w, pl.wo), hi(ow, pl.w, pl.wo));
                Window { h0, h1, w0, w1, div: ((h1 - h0) * (w1 - w0)) as f64 }
            }
        }
    }
}

fn avg_forward(
    ctx: &KernelCtx<'_>,
    x: TensorView,
    out: TensorView,
    pl: Planes,
    avg: Avg,
) -> Result<Option<Work>> {
    check_dtypes(ctx, &x, &[&out])?;
    if !disjoint(&out, &x) {
        return Err(ctx.invalid("the output shares memory with the input"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    with_real!(ctx, x.dtype(), C => Ok(Some(Work::new(move || {
        let xs = read::<C>(&x);
        write_with::<C>(&out, &[&x], |o| {
            o.par_chunks_mut(pl.hwo()).zip(xs.par_chunks(pl.hw().max(1))).for_each(|(orow, plane)| {
                for oh in 0..pl.ho {
                    for ow in 0..pl.wo {
                        let wd = avg.window(&pl, oh, ow);
                        let mut sum = C::ZERO;
                        for ih in wd.h0..wd.h1 {
                            for &v in &plane[ih * pl.w + wd.w0..ih * pl.w + wd.w1] {
                                sum += v;
                            }
                        }
                        orow[oh * pl.wo + ow] =
                            if wd.h0 >= wd.h1 || wd.w0 >= wd.w1 { C::ZERO } else { sum / C::of(wd.div) };
                    }
                }
            });
        });
        Ok(())
    }))))
}

fn avg_backward(
    ctx: &KernelCtx<'_>,
    gy: TensorView,
    x: &TensorView,
    gx: TensorView,
    pl: Planes,
    avg: Avg,
) -> Result<Option<Work>> {
    check_dtypes(ctx, x, &[&gy, &gx])?;
    if gx.shape() != x.shape() {
        return Err(ctx.invalid(format!("grad_input has shape {:?}, expected {:?}", gx.shape(), x.shape())));
    }
    if !disjoint(&gx, &gy) {
        return Err(ctx.invalid("grad_input shares memory with grad_output"));
    }
    if gx.numel() == 0 {
        return Ok(None);
    }
    with_real!(ctx, x.dtype(), C => Ok(Some(Work::new(move || {
        let gs = read::<C>(&gy);
        write_with::<C>(&gx, &[&gy], |o| {
            o.par_chunks_mut(pl.hw()).enumerate().for_each(|(p, plane)| {
                plane.fill(C::ZERO);
                for oh in 0..pl.ho {
                    for ow in 0..pl.wo {
                        let wd = avg.window(&pl, oh, ow);
                        if wd.h0 >= wd.h1 || wd.w0 >= wd.w1 {
                            continue;
                        }
                        let g = gs[p * pl.hwo() + oh * pl.wo + ow] / C::of(wd.div);
                        for ih in wd.h0..wd.h1 {
                            for v in &mut plane[ih * pl.w + wd.w0..ih * pl.w + wd.w1] {
                                *v += g;
                            }
                        }
                    }
                }
            });
        });
        Ok(())
    }))))
}

/// Parses `ceil_mode, count_include_pad, divisor_override` from argument `i`.
fn avg_params(ctx: &KernelCtx<'_>, call: &Frame<'_>, args: &Args<'_>, pl: &Planes) -> Result<Avg> {
    let ceil = args.bool_or(4, "ceil_mode", false)?;
    let count_include_pad = args.bool_or(5, "count_include_pad", true)?;
    let divisor = match call.args.get(6) {
        None | Some(ArgRef::None) => None,
        Some(ArgRef::Int(0)) => return Err(ctx.invalid("divisor must be not zero")),
        Some(ArgRef::Int(d)) if *d > 0 => Some(*d as usize),
        _ => return Err(ctx.unimplemented("divisor_override must be a positive int")),
    };
    let q = params(ctx, call, 1, false, ceil, pl)?;
    Ok(Avg::Fixed { q, count_include_pad, divisor })
}

/// `avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2]
/// padding=0, bool ceil_mode=False, bool count_include_pad=True, int?
/// divisor_override=None) -> Tensor`
pub(crate) fn avg_pool2d(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 7)?;
    let x = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let out = ctx.output(call, 0)?;
    let pl = Planes::of(ctx, &x, out.shape())?;
    let avg = avg_params(ctx, call, &args, &pl)?;
    avg_forward(ctx, x, out, pl, avg)
}

/// `avg_pool2d_backward(Tensor grad_output, Tensor self, int[2]
/// kernel_size, int[2] stride, int[2] padding, bool ceil_mode, bool
/// count_include_pad, int? divisor_override) -> Tensor`
pub(crate) fn avg_pool2d_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 8, 8)?;
    let gy = ctx.device_view(args.tensor(0, "grad_output")?, "grad_output")?;
    let x = ctx.device_view(args.tensor(1, "self")?, "self")?;
    let gx = ctx.output(call, 0)?;
    let pl = Planes::of(ctx, &x, gy.shape())?;
    // Same layout as the forward, shifted by one (grad_output first).
    let f = Frame {
        op_name: call.op_name,
        device: call.device,
        stream: call.stream,
        args: &call.args[1..],
        outputs: call.outputs,
        rng: call.rng,
        resizer: None,
    };
    let sargs = Args::new(ctx, &f, 7, 7)?;
    let avg = avg_params(ctx, &f, &sargs, &pl)?;
    avg_backward(ctx, gy, &x, gx, pl, avg)
}

/// `_adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor`
pub(crate) fn adaptive_avg_pool2d(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let x = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let out = ctx.output(call, 0)?;
    let pl = Planes::of(ctx, &x, out.shape())?;
    if let Some([oh, ow]) = pair(ctx, call, 1, "output_size")? {
        if oh < 0 || ow < 0 || oh as usize != pl.ho || ow as usize != pl.wo {
            return Err(
                ctx.invalid(format!("output has spatial size {}x{}, expected {oh}x{ow}", pl.ho, pl.wo))
            );
        }
    }
    if pl.ho * pl.wo > 0 && pl.hw() == 0 {
        return Err(ctx.invalid("input has an empty spatial dimension"));
    }
    avg_forward(ctx, x, out, pl, Avg::Adaptive)
}

/// `_adaptive_avg_pool2d_backward(Tensor grad_output, Tensor self) ->
/// Tensor`
pub(crate) fn adaptive_avg_pool2d_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let gy = ctx.device_view(args.tensor(0, "grad_output")?, "grad_output")?;
    let x = ctx.device_view(args.tensor(1, "self")?, "self")?;
    let gx = ctx.output(call, 0)?;
    let pl = Planes::of(ctx, &x, gy.shape())?;
    if pl.ho * pl.wo == 0 {
        return Err(ctx.invalid("grad_output has an empty spatial dimension"));
    }
    avg_backward(ctx, gy, &x, gx, pl, Avg::Adaptive)
}

//! Operators torchvision defines, served on the device: `torchvision::nms`
//! and `torchvision::roi_align` with its backward (`_roi_align_backward`),
//! which Faster R-CNN dispatches in its region-proposal and box heads.
//!
//! They are the worked example of a plugin serving another library's
//! operators: their op-table entries are flagged `TFL_OP_EXTERNAL` with
//! torchvision's schemas, so the host binds them once torchvision has
//! defined the operators, whether it was imported before or after the
//! plugin was registered (docs/plugin-abi.md, "Other libraries'
//! operators"). torchvision's own autograd formula for `roi_align` calls
//! `_roi_align_backward` through the dispatcher, so gradients reach the
//! backward kernel here too.
//!
//! The arithmetic is torchvision's CPU kernels', step for step (a box's
//! coordinates scaled in double, then sampled in the compute type; `nms`
//! visits boxes by a stable descending sort of the scores and suppresses
//! by IoU strictly above the threshold), so results agree with the CPU.
//! `roi_align` runs (roi, channel) pairs in parallel; its backward runs one
//! thread per (image, channel) plane and adds contributions in the CPU's
//! order, so it is deterministic; `nms` suppresses in parallel once many
//! boxes remain.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::elementwise::PAR_MIN;
use super::linalg::{read, write_with};
use super::real::{with_real, Real};
use super::softmax::int_arg;
use super::topk::descending_index;
use super::view::{disjoint, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::Work;

fn float_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<f64> {
    match call.args.get(i) {
        Some(ArgRef::Float(v)) => Ok(*v),
        Some(ArgRef::Int(v)) => Ok(*v as f64),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a float"))),
    }
}

fn bool_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<bool> {
    match call.args.get(i) {
        Some(ArgRef::Bool(v)) => Ok(*v),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a bool"))),
    }
}

// ----------------------------------------------------------------------- nms

/// `torchvision::nms(Tensor dets, Tensor scores, float iou_threshold) ->
/// Tensor`: the indices (int64) of the boxes kept, by decreasing score.
/// Flagged `TFL_OP_DYNAMIC_SHAPE`: the kernel waits for its inputs, then
/// sizes its output.
pub(crate) fn nms(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 3)?;
    let dets = ctx.device_view(args.tensor(0, "dets")?, "dets")?;
    let scores = ctx.device_view(args.tensor(1, "scores")?, "scores")?;
    let threshold = float_arg(ctx, call, 2, "iou_threshold")?;
    if dets.ndim() != 2 || dets.shape()[1] != 4 {
        return Err(
            ctx.invalid(format!("boxes should be a 2d tensor of shape [N, 4], got {:?}", dets.shape()))
        );
    }
    if scores.ndim() != 1 || scores.shape()[0] != dets.shape()[0] {
        return Err(ctx.invalid(format!(
            "scores should be a 1d tensor with one score per box, got {:?} for {} boxes",
            scores.shape(),
            dets.shape()[0]
        )));
    }
    if dets.dtype() != scores.dtype() {
        return Err(ctx.invalid(format!(
            "dets should have the same type as scores, got {} and {}",
            dets.dtype(),
            scores.dtype()
        )));
    }
    if ctx.output(call, 0)?.dtype() != DType::Int64 {
        return Err(ctx.invalid("the output must be int64"));
    }
    ctx.wait_for_inputs(call)?;
    let keep = with_real!(ctx, dets.dtype(), C => Ok(suppress::<C>(&dets, &scores, threshold)))?;
    let out = ctx.resize_output(call, 0, &[keep.len() as i64])?;
    if !disjoint(&out, &dets) || !disjoint(&out, &scores) {
        return Err(ctx.invalid("the output must not overlap the inputs"));
    }
    write_with::<i64>(&out, &[&dets, &scores], |o| o.copy_from_slice(&keep));
    Ok(None)
}

/// torchvision's CPU `nms`: boxes in order of decreasing score (a stable
/// sort: ties keep index order, NaN first), each kept unless a kept box
/// overlaps it with IoU above `threshold`.
fn suppress<C: Real>(dets: &TensorView, scores: &TensorView, threshold: f64) -> Vec<i64> {
    let n = dets.shape()[0];
    let boxes = read::<C>(dets);
    let s = read::<C>(scores);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| descending_index(s[a], a, s[b], b));
    let coord = |i: usize, k: usize| boxes[i * 4 + k];
    let area = |i: usize| (coord(i, 2) - coord(i, 0)) * (coord(i, 3) - coord(i, 1));
    let suppressed: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    let mut keep = Vec::new();
    for (pos, &i) in order.iter().enumerate() {
        if suppressed[i].load(Ordering::Relaxed) {
            continue;
        }
        keep.push(i as i64);
        let (ix1, iy1, ix2, iy2, iarea) = (coord(i, 0), coord(i, 1), coord(i, 2), coord(i, 3), area(i));
        let check = |&j: &usize| {
            if suppressed[j].load(Ordering::Relaxed) {
                return;
            }
            let max = |a: C, b: C| if a < b { b } else { a };
            let min = |a: C, b: C| if b < a { b } else { a };
            let w = max(C::of(0.0), min(ix2, coord(j, 2)) - max(ix1, coord(j, 0)));
            let h = max(C::of(0.0), min(iy2, coord(j, 3)) - max(iy1, coord(j, 1)));
            let inter = w * h;
            let iou = inter / (iarea + area(j) - inter);
            if iou.wide() > threshold {
                suppressed[j].store(true, Ordering::Relaxed);
            }
        };
        // Each j is written by its own check only: the split cannot change
        // the outcome.
        let rest = &order[pos + 1..];
        if rest.len() * 16 >= PAR_MIN {
            rest.par_iter().for_each(check);
        } else {
            rest.iter().for_each(check);
        }
    }
    keep
}

// ----------------------------------------------------------------- roi_align

/// The geometry of one call.
#[derive(Debug, Clone, Copy)]
struct Pool {
    channels: usize,
    height: usize,
    width: usize,
    ph: usize,
    pw: usize,
    spatial_scale: f64,
    sampling_ratio: i64,
    aligned: bool,
}

/// One region's sampling grid, as torchvision computes it.
#[derive(Debug, Clone, Copy)]
struct Region<C> {
    batch: usize,
    start_h: C,
    start_w: C,
    bin_h: C,
    bin_w: C,
    grid_h: usize,
    grid_w: usize,
}

impl Pool {
    fn region<C: Real>(&self, roi: &[C], batch_size: usize) -> Result<Region<C>> {
        let b = roi[0].wide();
        if !(b >= 0.0 && (b as usize) < batch_size) {
            return Err(Error::invalid(format!(
                "sim: roi_align: a roi's batch index {b} is outside the batch of {batch_size} images"
            )));
        }
        let offset = if self.aligned { 0.5 } else { 0.0 };
        // torchvision scales in double and stores in the compute type.
        let scaled = |v: C| C::of(v.wide() * self.spatial_scale - offset);
        let (start_w, start_h, end_w, end_h) =
            (scaled(roi[1]), scaled(roi[2]), scaled(roi[3]), scaled(roi[4]));
        let (mut rw, mut rh) = (end_w - start_w, end_h - start_h);
        if !self.aligned {
            let one = C::of(1.0);
            rw = if rw < one { one } else { rw };
            rh = if rh < one { one } else { rh };
        }
        let (bin_h, bin_w) = (rh / C::of(self.ph as f64), rw / C::of(self.pw as f64));
        let grid = |r: C, p: usize| {
            if self.sampling_ratio > 0 {
                self.sampling_ratio as usize
            } else {
                (r / C::of(p as f64)).wide().ceil().max(0.0) as usize
            }
        };
        Ok(Region {
            batch: b as usize,
            start_h,
            start_w,
            bin_h,
            bin_w,
            grid_h: grid(rh, self.ph),
            grid_w: grid(rw, self.pw),
        })
    }
}

/// A sample's four neighbours (flat plane offsets) and weights; `None`
/// outside the feature map (torchvision's bounds, one pixel of slack).
#[derive(Debug, Clone, Copy)]
struct Taps<C> {
    pos: [usize; 4],
    w: [C; 4],
}

fn taps<C: Real>(height: usize, width: usize, y: C, x: C) -> Option<Taps<C>> {
    if height == 0
        || width == 0
        || y < C::of(-1.0)
        || y > C::of(height as f64)
        || x < C::of(-1.0)
        || x > C::of(width as f64)
    {
        return None;
    }
    let zero = C::of(0.0);
    let (mut y, mut x) = (if y <= zero { zero } else { y }, if x <= zero { zero } else { x });
    let (mut y_low, mut x_low) = (y.wide() as usize, x.wide() as usize);
    let (y_high, x_high);
    if y_low >= height - 1 {
        y_low = height - 1;
        y_high = y_low;
        y = C::of(y_low as f64);
    } else {
        y_high = y_low + 1;
    }
    if x_low >= width - 1 {
        x_low = width - 1;
        x_high = x_low;
        x = C::of(x_low as f64);
    } else {
        x_high = x_low + 1;
    }
    let (ly, lx) = (y - C::of(y_low as f64), x - C::of(x_low as f64));
    let (hy, hx) = (C::of(1.0) - ly, C::of(1.0) - lx);
    Some(Taps {
        pos: [y_low * width + x_low, y_low * width + x_high, y_high * width + x_low, y_high * width + x_high],
        w: [hy * hx, hy * lx, ly * hx, ly * lx],
    })
}

/// The sample points of bin `(ph, pw)` of a region, in torchvision's order.
fn samples<C: Real>(r: &Region<C>, ph: usize, pw: usize) -> impl Iterator<Item = (C, C)> + '_ {
    (0..r.grid_h).flat_map(move |iy| {
        let y = r.start_h
            + C::of(ph as f64) * r.bin_h
            + C::of(iy as f64 + 0.5) * r.bin_h / C::of(r.grid_h as f64);
        (0..r.grid_w).map(move |ix| {
            let x = r.start_w
                + C::of(pw as f64) * r.bin_w
                + C::of(ix as f64 + 0.5) * r.bin_w / C::of(r.grid_w as f64);
            (y, x)
        })
    })
}

fn pool_args(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    sampling_at: usize,
) -> Result<(f64, usize, usize, i64, bool)> {
    let spatial_scale = float_arg(ctx, call, 2, "spatial_scale")?;
    let ph = int_arg(ctx, call, 3, "pooled_height")?;
    let pw = int_arg(ctx, call, 4, "pooled_width")?;
    if ph <= 0 || pw <= 0 {
        return Err(ctx.invalid(format!("pooled sizes must be positive, got {ph}x{pw}")));
    }
    let sampling_ratio = int_arg(ctx, call, sampling_at, "sampling_ratio")?;
    let aligned = bool_arg(ctx, call, sampling_at + 1, "aligned")?;
    Ok((spatial_scale, ph as usize, pw as usize, sampling_ratio, aligned))
}

fn check_rois(ctx: &KernelCtx<'_>, rois: &TensorView, dtype: DType) -> Result<usize> {
    if rois.ndim() != 2 || rois.shape()[1] != 5 {
        return Err(ctx.invalid(format!("rois must have shape as Tensor[K, 5], got {:?}", rois.shape())));
    }
    if rois.dtype() != dtype {
        return Err(ctx.invalid(format!(
            "Expected tensor for input to have the same type as tensor for rois; but type {dtype} does not equal {}",
            rois.dtype()
        )));
    }
    Ok(rois.shape()[0])
}

/// `torchvision::roi_align(Tensor input, Tensor rois, float spatial_scale,
/// SymInt pooled_height, SymInt pooled_width, int sampling_ratio, bool
/// aligned) -> Tensor`: `[K, C, pooled_height, pooled_width]`, each bin the
/// mean of bilinear samples of the region of image `rois[k, 0]` with
/// corners `rois[k, 1:]` (in input coordinates, times `spatial_scale`).
pub(crate) fn roi_align(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 7, 7)?;
    let x = ctx.device_view(args.tensor(0, "input")?, "input")?;
    let rois = ctx.device_view(args.tensor(1, "rois")?, "rois")?;
    let (spatial_scale, ph, pw, sampling_ratio, aligned) = pool_args(ctx, call, 5)?;
    if x.ndim() != 4 {
        return Err(ctx.invalid(format!("input must be a 4-D tensor [N, C, H, W], got {:?}", x.shape())));
    }
    let k = check_rois(ctx, &rois, x.dtype())?;
    let out = ctx.output(call, 0)?;
    let (n, c, h, w) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    if out.shape() != [k, c, ph, pw] || out.dtype() != x.dtype() {
        return Err(ctx.invalid(format!(
            "the output has shape {:?}, expected {:?}",
            out.shape(),
            [k, c, ph, pw]
        )));
    }
    if !disjoint(&out, &x) || !disjoint(&out, &rois) {
        return Err(ctx.invalid("the output must not overlap the inputs"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    let pool = Pool { channels: c, height: h, width: w, ph, pw, spatial_scale, sampling_ratio, aligned };
    with_real!(ctx, x.dtype(), C => Ok(Some(Work::new(move || {
        let (xs, rs) = (read::<C>(&x), read::<C>(&rois));
        let regions = rs.chunks(5).map(|r| pool.region::<C>(r, n)).collect::<Result<Vec<_>>>()?;
        let plane = pool.height * pool.width;
        let bins = pool.ph * pool.pw;
        write_with::<C>(&out, &[&x, &rois], |o| {
            let run = |(kc, dst): (usize, &mut [C])| {
                let r = &regions[kc / pool.channels];
                let ch = kc % pool.channels;
                let src = &xs[(r.batch * pool.channels + ch) * plane..][..plane];
                let count = C::of((r.grid_h * r.grid_w).max(1) as f64);
                for (bin, v) in dst.iter_mut().enumerate() {
                    let mut acc = C::of(0.0);
                    for (y, xv) in samples(r, bin / pool.pw, bin % pool.pw) {
                        if let Some(t) = taps(pool.height, pool.width, y, xv) {
                            acc += t.w[0] * src[t.pos[0]]
                                + t.w[1] * src[t.pos[1]]
                                + t.w[2] * src[t.pos[2]]
                                + t.w[3] * src[t.pos[3]];
                        }
                    }
                    *v = acc / count;
                }
            };
            if o.len() >= PAR_MIN / 16 {
                o.par_chunks_mut(bins).enumerate().for_each(run);
            } else {
                o.chunks_mut(bins).enumerate().for_each(run);
            }
        });
        Ok(())
    }))))
}

/// `torchvision::_roi_align_backward(Tensor grad, Tensor rois, float
/// spatial_scale, SymInt pooled_height, SymInt pooled_width, SymInt
/// batch_size, SymInt channels, SymInt height, SymInt width, int
/// sampling_ratio, bool aligned) -> Tensor`: the gradient of `input`.
pub(crate) fn roi_align_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 11, 11)?;
    let g = ctx.device_view(args.tensor(0, "grad")?, "grad")?;
    let rois = ctx.device_view(args.tensor(1, "rois")?, "rois")?;
    let (spatial_scale, ph, pw, sampling_ratio, aligned) = pool_args(ctx, call, 9)?;
    let dims: Vec<i64> = (5..9).map(|i| int_arg(ctx, call, i, "input size")).collect::<Result<_>>()?;
    if dims.iter().any(|&d| d < 0) {
        return Err(ctx.invalid(format!("negative input size {dims:?}")));
    }
    let [n, c, h, w] = [dims[0] as usize, dims[1] as usize, dims[2] as usize, dims[3] as usize];
    let k = check_rois(ctx, &rois, g.dtype())?;
    if g.shape() != [k, c, ph, pw] {
        return Err(ctx.invalid(format!("grad has shape {:?}, expected {:?}", g.shape(), [k, c, ph, pw])));
    }
    let out = ctx.output(call, 0)?;
    if out.shape() != [n, c, h, w] || out.dtype() != g.dtype() {
        return Err(ctx.invalid(format!(
            "grad_input has shape {:?}, expected {:?}",
            out.shape(),
            [n, c, h, w]
        )));
    }
    if !disjoint(&out, &g) || !disjoint(&out, &rois) {
        return Err(ctx.invalid("grad_input must not overlap the inputs"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    let pool = Pool { channels: c, height: h, width: w, ph, pw, spatial_scale, sampling_ratio, aligned };
    with_real!(ctx, g.dtype(), C => Ok(Some(Work::new(move || {
        let (gs, rs) = (read::<C>(&g), read::<C>(&rois));
        let regions = rs.chunks(5).map(|r| pool.region::<C>(r, n)).collect::<Result<Vec<_>>>()?;
        let plane = pool.height * pool.width;
        let bins = pool.ph * pool.pw;
        write_with::<C>(&out, &[&g, &rois], |o| {
            // One (image, channel) plane per task; its regions in index
            // order, as the CPU kernel visits them.
            let run = |(bc, dst): (usize, &mut [C])| {
                dst.fill(C::of(0.0));
                let (b, ch) = (bc / pool.channels, bc % pool.channels);
                for (ki, r) in regions.iter().enumerate().filter(|(_, r)| r.batch == b) {
                    let grads = &gs[(ki * pool.channels + ch) * bins..][..bins];
                    let count = C::of((r.grid_h * r.grid_w) as f64);
                    for (bin, &gv) in grads.iter().enumerate() {
                        for (y, xv) in samples(r, bin / pool.pw, bin % pool.pw) {
                            if let Some(t) = taps(pool.height, pool.width, y, xv) {
                                for q in 0..4 {
                                    dst[t.pos[q]] += gv * t.w[q] / count;
                                }
                            }
                        }
                    }
                }
            };
            if o.len() >= PAR_MIN / 16 {
                o.par_chunks_mut(plane).enumerate().for_each(run);
            } else {
                o.chunks_mut(plane).enumerate().for_each(run);
            }
        });
        Ok(())
    }))))
}

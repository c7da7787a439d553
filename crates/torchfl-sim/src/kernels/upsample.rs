//! 2-D upsampling: `upsample_bilinear2d` and `upsample_nearest2d` (what
//! `F.interpolate` dispatches for `"bilinear"` and `"nearest"`: DeepLabV3's
//! output resize, the FPN's top-down pathway, detection transforms) and
//! their backwards.
//!
//! Inputs are `[N, C, H, W]` and are processed as `N * C` independent
//! planes, in parallel. Source coordinates follow PyTorch's CPU kernels
//! exactly, including the arithmetic type: `area_pixel_compute_scale` and
//! `area_pixel_compute_source_index` in the compute type (`f32` for float
//! and half types, `f64` for double) for bilinear, and `nearest_idx`'s
//! `float` arithmetic (with its exact-2x and identity shortcuts) for
//! nearest. An explicit `scales_h`/`scales_w` (`recompute_scale_factor=False`)
//! replaces `in / out` with `1 / scale`, as in PyTorch. Nearest forward is a
//! gather and works for every dtype; the rest computes in the compute type
//! and rounds on store. Backwards scatter-add into zeroed planes, each plane
//! by one thread in output order, so results are deterministic.

use rayon::prelude::*;

use super::elementwise::PAR_MIN;
use super::linalg::{read, write_with};
use super::real::{with_real, Real};
use super::view::{disjoint, TensorView};
use super::{ArgRef, Frame, KernelCtx};
use crate::dtype::{with_storage, DType, Element};
use crate::error::Result;
use crate::runtime::Work;

/// Planes of `ih x iw` (input side) and `oh x ow` (output side), and the
/// explicit scales.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    ih: usize,
    iw: usize,
    oh: usize,
    ow: usize,
    scale_h: Option<f64>,
    scale_w: Option<f64>,
}

impl Geometry {
    fn input_plane(&self) -> usize {
        self.ih * self.iw
    }
    fn output_plane(&self) -> usize {
        self.oh * self.ow
    }
}

/// Reads an `int[N]` argument of exactly `n` values.
fn sizes(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str, n: usize) -> Result<Vec<usize>> {
    match call.args.get(i) {
        Some(ArgRef::IntList(v)) if v.len() == n && v.iter().all(|&s| s >= 0) => {
            Ok(v.iter().map(|&s| s as usize).collect())
        }
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a list of {n} non-negative ints"))),
    }
}

/// Reads a `float?` argument; absent, `None`.
fn opt_float(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<Option<f64>> {
    match call.args.get(i) {
        None | Some(ArgRef::None) => Ok(None),
        Some(ArgRef::Float(v)) => Ok(Some(*v)),
        Some(ArgRef::Int(v)) => Ok(Some(*v as f64)),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a float or None"))),
    }
}

/// Checks that `v` is the 4-D `[N, C, H, W]` tensor of `size`.
fn check_4d(ctx: &KernelCtx<'_>, v: &TensorView, role: &str, size: &[usize]) -> Result<()> {
    if v.shape() != size {
        return Err(ctx.invalid(format!("{role} has shape {:?}, expected {size:?}", v.shape())));
    }
    Ok(())
}

/// The geometry of a forward call: `self` at argument 0, `output_size` at
/// argument 1, the scales at `scales_at` and `scales_at + 1`.
fn forward_geometry(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    x: &TensorView,
    out: &TensorView,
    scales_at: usize,
) -> Result<Geometry> {
    let out_size = sizes(ctx, call, 1, "output_size", 2)?;
    let xs = x.shape();
    if xs.len() != 4 {
        return Err(ctx.invalid(format!("expected a 4-D input (N, C, H, W), got shape {xs:?}")));
    }
    if xs[2] == 0 || xs[3] == 0 || out_size[0] == 0 || out_size[1] == 0 {
        return Err(ctx.invalid(format!(
            "input and output sizes should be greater than 0, but got input (H: {}, W: {}) output (H: {}, W: {})",
            xs[2], xs[3], out_size[0], out_size[1]
        )));
    }
    check_4d(ctx, out, "output", &[xs[0], xs[1], out_size[0], out_size[1]])?;
    if out.dtype() != x.dtype() {
        return Err(ctx.invalid(format!("output has dtype {}, expected {}", out.dtype(), x.dtype())));
    }
    if !disjoint(out, x) {
        return Err(ctx.invalid("the output must not overlap the input"));
    }
    Ok(Geometry {
        ih: xs[2],
        iw: xs[3],
        oh: out_size[0],
        ow: out_size[1],
        scale_h: opt_float(ctx, call, scales_at, "scales_h")?,
        scale_w: opt_float(ctx, call, scales_at + 1, "scales_w")?,
    })
}

/// The geometry of a backward call: `grad_output` at argument 0,
/// `output_size` at 1, `input_size` at 2, the scales at `scales_at`.
fn backward_geometry(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    gy: &TensorView,
    gx: &TensorView,
    scales_at: usize,
) -> Result<Geometry> {
    let out_size = sizes(ctx, call, 1, "output_size", 2)?;
    let in_size = sizes(ctx, call, 2, "input_size", 4)?;
    if in_size[2] == 0 || in_size[3] == 0 || out_size[0] == 0 || out_size[1] == 0 {
        return Err(ctx.invalid("input and output sizes should be greater than 0"));
    }
    check_4d(ctx, gx, "grad_input", &in_size)?;
    check_4d(ctx, gy, "grad_output", &[in_size[0], in_size[1], out_size[0], out_size[1]])?;
    if gx.dtype() != gy.dtype() {
        return Err(ctx.invalid(format!("grad_input has dtype {}, expected {}", gx.dtype(), gy.dtype())));
    }
    if !disjoint(gx, gy) {
        return Err(ctx.invalid("grad_input must not overlap grad_output"));
    }
    Ok(Geometry {
        ih: in_size[2],
        iw: in_size[3],
        oh: out_size[0],
        ow: out_size[1],
        scale_h: opt_float(ctx, call, scales_at, "scales_h")?,
        scale_w: opt_float(ctx, call, scales_at + 1, "scales_w")?,
    })
}

/// Runs `f(plane, out_plane)` over the planes of `out`, in parallel when
/// the work is large enough to pay for it.
fn per_plane<C: Send>(o: &mut [C], plane: usize, total: usize, f: impl Fn(usize, &mut [C]) + Sync + Send) {
    if plane == 0 {
        return;
    }
    if total >= PAR_MIN {
        o.par_chunks_mut(plane).enumerate().for_each(|(p, c)| f(p, c));
    } else {
        o.chunks_mut(plane).enumerate().for_each(|(p, c)| f(p, c));
    }
}

// ------------------------------------------------------------------ bilinear

/// One output coordinate's two source indices and weights.
#[derive(Debug, Clone, Copy)]
struct Tap<C> {
    i0: usize,
    i1: usize,
    w0: C,
    w1: C,
}

/// PyTorch's `area_pixel_compute_scale` in the compute type.
fn area_scale<C: Real>(input: usize, output: usize, align_corners: bool, scale: Option<f64>) -> C {
    if align_corners {
        if output > 1 {
            C::of((input - 1) as f64) / C::of((output - 1) as f64)
        } else {
            C::of(0.0)
        }
    } else {
        match scale {
            Some(s) if s > 0.0 => C::of(1.0 / s),
            _ => C::of(input as f64) / C::of(output as f64),
        }
    }
}

/// The taps of every output coordinate along one axis (PyTorch's
/// `area_pixel_compute_source_index`, then the clamped floor and weight).
fn bilinear_taps<C: Real>(
    input: usize,
    output: usize,
    align_corners: bool,
    scale: Option<f64>,
) -> Vec<Tap<C>> {
    let s = area_scale::<C>(input, output, align_corners, scale);
    (0..output)
        .map(|o| {
            let src = if align_corners {
                s * C::of(o as f64)
            } else {
                let v = s * (C::of(o as f64) + C::of(0.5)) - C::of(0.5);
                if v < C::of(0.0) {
                    C::of(0.0)
                } else {
                    v
                }
            };
            let i0 = (src.wide().floor() as usize).min(input - 1);
            let i1 = if i0 < input - 1 { i0 + 1 } else { i0 };
            let mut l = src - C::of(i0 as f64);
            if l < C::of(0.0) {
                l = C::of(0.0);
            } else if l > C::of(1.0) {
                l = C::of(1.0);
            }
            Tap { i0, i1, w0: C::of(1.0) - l, w1: l }
        })
        .collect()
}

fn align_corners_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize) -> Result<bool> {
    match call.args.get(i) {
        Some(ArgRef::Bool(b)) => Ok(*b),
        _ => Err(ctx.invalid(format!("argument {i} (align_corners) must be a bool"))),
    }
}

/// `upsample_bilinear2d(Tensor self, SymInt[2] output_size, bool
/// align_corners, float? scales_h=None, float? scales_w=None) -> Tensor`
/// (and `.out`).
pub(crate) fn upsample_bilinear2d(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let x = ctx.device_view(super::Args::new(ctx, call, 3, 5)?.tensor(0, "self")?, "self")?;
    let out = ctx.output(call, 0)?;
    let align = align_corners_arg(ctx, call, 2)?;
    let g = forward_geometry(ctx, call, &x, &out, 3)?;
    if out.numel() == 0 {
        return Ok(None);
    }
    with_real!(ctx, x.dtype(), C => Ok(Some(Work::new(move || {
        let th = bilinear_taps::<C>(g.ih, g.oh, align, g.scale_h);
        let tw = bilinear_taps::<C>(g.iw, g.ow, align, g.scale_w);
        let xs = read::<C>(&x);
        write_with::<C>(&out, &[&x], |o| {
            per_plane(o, g.output_plane(), o.len(), |p, plane| {
                let src = &xs[p * g.input_plane()..(p + 1) * g.input_plane()];
                for (oh, h) in th.iter().enumerate() {
                    let (r0, r1) = (&src[h.i0 * g.iw..(h.i0 + 1) * g.iw], &src[h.i1 * g.iw..(h.i1 + 1) * g.iw]);
                    for (v, w) in plane[oh * g.ow..(oh + 1) * g.ow].iter_mut().zip(&tw) {
                        *v = h.w0 * (w.w0 * r0[w.i0] + w.w1 * r0[w.i1]) + h.w1 * (w.w0 * r1[w.i0] + w.w1 * r1[w.i1]);
                    }
                }
            });
        });
        Ok(())
    }))))
}

/// `upsample_bilinear2d_backward(Tensor grad_output, SymInt[2]
/// output_size, SymInt[4] input_size, bool align_corners, float?
/// scales_h=None, float? scales_w=None) -> Tensor` (and `.grad_input`).
pub(crate) fn upsample_bilinear2d_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let gy = ctx.device_view(super::Args::new(ctx, call, 4, 6)?.tensor(0, "grad_output")?, "grad_output")?;
    let gx = ctx.output(call, 0)?;
    let align = align_corners_arg(ctx, call, 3)?;
    let g = backward_geometry(ctx, call, &gy, &gx, 4)?;
    if gx.numel() == 0 {
        return Ok(None);
    }
    with_real!(ctx, gy.dtype(), C => Ok(Some(Work::new(move || {
        let th = bilinear_taps::<C>(g.ih, g.oh, align, g.scale_h);
        let tw = bilinear_taps::<C>(g.iw, g.ow, align, g.scale_w);
        let gs = read::<C>(&gy);
        write_with::<C>(&gx, &[&gy], |o| {
            per_plane(o, g.input_plane(), gs.len(), |p, plane| {
                plane.fill(C::ZERO);
                let src = &gs[p * g.output_plane()..(p + 1) * g.output_plane()];
                for (oh, h) in th.iter().enumerate() {
                    for (ow, w) in tw.iter().enumerate() {
                        let v = src[oh * g.ow + ow];
                        plane[h.i0 * g.iw + w.i0] += h.w0 * w.w0 * v;
                        plane[h.i0 * g.iw + w.i1] += h.w0 * w.w1 * v;
                        plane[h.i1 * g.iw + w.i0] += h.w1 * w.w0 * v;
                        plane[h.i1 * g.iw + w.i1] += h.w1 * w.w1 * v;
                    }
                }
            });
        });
        Ok(())
    }))))
}

// ------------------------------------------------------------------- nearest

/// PyTorch's `nearest_idx` for every output coordinate along one axis,
/// in its `float` arithmetic.
fn nearest_indices(input: usize, output: usize, scale: Option<f64>) -> Vec<usize> {
    if output == input {
        return (0..output).collect();
    }
    if output == 2 * input {
        return (0..output).map(|o| o >> 1).collect();
    }
    let s: f32 = match scale {
        Some(v) if v > 0.0 => (1.0 / v) as f32,
        _ => input as f32 / output as f32,
    };
    (0..output).map(|o| ((o as f32 * s).floor() as usize).min(input - 1)).collect()
}

/// `upsample_nearest2d(Tensor self, SymInt[2] output_size, float?
/// scales_h=None, float? scales_w=None) -> Tensor` (and `.out`): every
/// dtype, a gather.
pub(crate) fn upsample_nearest2d(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let x = ctx.device_view(super::Args::new(ctx, call, 2, 4)?.tensor(0, "self")?, "self")?;
    let out = ctx.output(call, 0)?;
    let g = forward_geometry(ctx, call, &x, &out, 2)?;
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(with_storage!(x.dtype(), T => nearest_work::<T>(x, out, g))))
}

fn nearest_work<T: Element>(x: TensorView, out: TensorView, g: Geometry) -> Work {
    Work::new(move || {
        let hi = nearest_indices(g.ih, g.oh, g.scale_h);
        let wi = nearest_indices(g.iw, g.ow, g.scale_w);
        let xs = read::<T>(&x);
        write_with::<T>(&out, &[&x], |o| {
            per_plane(o, g.output_plane(), o.len(), |p, plane| {
                let src = &xs[p * g.input_plane()..(p + 1) * g.input_plane()];
                for (row, &h) in plane.chunks_mut(g.ow).zip(&hi) {
                    let src_row = &src[h * g.iw..(h + 1) * g.iw];
                    for (v, &w) in row.iter_mut().zip(&wi) {
                        *v = src_row[w];
                    }
                }
            });
        });
        Ok(())
    })
}

/// `upsample_nearest2d_backward(Tensor grad_output, SymInt[2] output_size,
/// SymInt[4] input_size, float? scales_h=None, float? scales_w=None) ->
/// Tensor` (and `.grad_input`): each input pixel sums the gradients of the
/// output pixels it was copied to.
pub(crate) fn upsample_nearest2d_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let gy = ctx.device_view(super::Args::new(ctx, call, 3, 5)?.tensor(0, "grad_output")?, "grad_output")?;
    let gx = ctx.output(call, 0)?;
    let g = backward_geometry(ctx, call, &gy, &gx, 3)?;
    if gx.numel() == 0 {
        return Ok(None);
    }
    if !gy.dtype().is_floating() || gy.dtype() == DType::Bool {
        return Err(ctx.unimplemented(format!("dtype {} is not supported", gy.dtype())));
    }
    with_real!(ctx, gy.dtype(), C => Ok(Some(Work::new(move || {
        let hi = nearest_indices(g.ih, g.oh, g.scale_h);
        let wi = nearest_indices(g.iw, g.ow, g.scale_w);
        let gs = read::<C>(&gy);
        write_with::<C>(&gx, &[&gy], |o| {
            per_plane(o, g.input_plane(), gs.len(), |p, plane| {
                plane.fill(C::ZERO);
                let src = &gs[p * g.output_plane()..(p + 1) * g.output_plane()];
                for (row, &h) in src.chunks(g.ow).zip(&hi) {
                    for (&v, &w) in row.iter().zip(&wi) {
                        plane[h * g.iw + w] += v;
                    }
                }
            });
        });
        Ok(())
    }))))
}

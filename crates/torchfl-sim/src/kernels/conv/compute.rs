//! The arithmetic of convolutions on GEMM: lowering to columns
//! (`im2col`/`col2im`), the forward pass and the three gradients, all
//! driven by a validated [`Geom`] and nothing else.

use std::ops::Range;

use rayon::prelude::*;

use super::geometry::Geom;
use crate::dtype::Element;
use crate::kernels::linalg::{gemm, read, write_with, Mat};
use crate::kernels::real::Real;
use crate::kernels::view::TensorView;

/// Lowers one sample-group `x` (`cin_g x h x w`) into columns `off..off +
/// hwo` of `col` (`kk` rows of stride `ld`).
fn im2col<C: Element>(g: &Geom, x: &[C], col: &mut [C], ld: usize, off: usize) {
    let hwo = g.hwo();
    if g.pointwise() {
        for c in 0..g.cin_g() {
            col[c * ld + off..c * ld + off + hwo].copy_from_slice(&x[c * hwo..(c + 1) * hwo]);
        }
        return;
    }
    for c in 0..g.cin_g() {
        let plane = &x[c * g.hwi()..(c + 1) * g.hwi()];
        for i in 0..g.kh {
            for j in 0..g.kw {
                let row = &mut col[((c * g.kh + i) * g.kw + j) * ld + off..][..hwo];
                let off_w = (j * g.dw) as isize - g.pw as isize;
                for oh in 0..g.ho {
                    let ih = (oh * g.sh + i * g.dh) as isize - g.ph as isize;
                    let dst = &mut row[oh * g.wo..(oh + 1) * g.wo];
                    if ih < 0 || ih as usize >= g.h {
                        dst.fill(C::ZERO);
                        continue;
                    }
                    let src = &plane[ih as usize * g.w..(ih as usize + 1) * g.w];
                    if g.sw == 1 && off_w >= 0 && off_w as usize + g.wo <= g.w {
                        dst.copy_from_slice(&src[off_w as usize..off_w as usize + g.wo]);
                        continue;
                    }
                    for (ow, d) in dst.iter_mut().enumerate() {
                        let iw = (ow * g.sw) as isize + off_w;
                        *d = if iw >= 0 && (iw as usize) < g.w { src[iw as usize] } else { C::ZERO };
                    }
                }
            }
        }
    }
}

/// Adds columns `off..off + hwo` of `col` (`kk` rows of stride `ld`) back
/// into one sample-group `x` (`cin_g x h x w`), which the caller zeroed.
fn col2im<C: Real>(g: &Geom, col: &[C], ld: usize, off: usize, x: &mut [C]) {
    let hwo = g.hwo();
    let hwi = g.hwi();
    for c in 0..g.cin_g() {
        let plane = &mut x[c * hwi..(c + 1) * hwi];
        for i in 0..g.kh {
            for j in 0..g.kw {
                let row = &col[((c * g.kh + i) * g.kw + j) * ld + off..][..hwo];
                let off_w = (j * g.dw) as isize - g.pw as isize;
                for oh in 0..g.ho {
                    let ih = (oh * g.sh + i * g.dh) as isize - g.ph as isize;
                    if ih < 0 || ih as usize >= g.h {
                        continue;
                    }
                    let dst = &mut plane[ih as usize * g.w..(ih as usize + 1) * g.w];
                    for (ow, &v) in row[oh * g.wo..(oh + 1) * g.wo].iter().enumerate() {
                        let iw = (ow * g.sw) as isize + off_w;
                        if iw >= 0 && (iw as usize) < g.w {
                            dst[iw as usize] += v;
                        }
                    }
                }
            }
        }
    }
}

/// Copies group `gi` of a block of `ns` samples (`[ns, channels, hw]`,
/// `per` channels per group) into a `per x ns*hw` matrix.
fn gather_block<C: Element>(
    src: &[C],
    ns: usize,
    channels: usize,
    per: usize,
    gi: usize,
    hw: usize,
    dst: &mut [C],
) {
    let ld = ns * hw;
    for s in 0..ns {
        for c in 0..per {
            let from = &src[(s * channels + gi * per + c) * hw..][..hw];
            dst[c * ld + s * hw..c * ld + (s + 1) * hw].copy_from_slice(from);
        }
    }
}

/// Group `gi` of a block of `ns` input samples (`xb`) as the column
/// matrix (`kk x ns*hwo`) of a GEMM: the input itself for one sample of a
/// 1x1 convolution, else lowered into `col` (sized by the caller).
fn columns<'a, C: Element>(g: &Geom, xb: &'a [C], ns: usize, gi: usize, col: &'a mut [C]) -> &'a [C] {
    let (cin_g, hwi, hwo) = (g.cin_g(), g.hwi(), g.hwo());
    if ns == 1 && g.pointwise() {
        return &xb[gi * cin_g * hwi..(gi + 1) * cin_g * hwi];
    }
    for s in 0..ns {
        let xg = &xb[s * g.cin * hwi + gi * cin_g * hwi..][..cin_g * hwi];
        im2col(g, xg, col, ns * hwo, s * hwo);
    }
    col
}

/// Group `gi` of a block of `ns` output-gradient samples (`gb`) as a
/// `cout_g x ns*hwo` matrix: a slice of `gb` for one sample, else gathered
/// into `buf`.
fn grad_rows<'a, C: Element>(g: &Geom, gb: &'a [C], ns: usize, gi: usize, buf: &'a mut Vec<C>) -> &'a [C] {
    let (cout_g, hwo) = (g.cout_g(), g.hwo());
    if ns == 1 {
        return &gb[gi * cout_g * hwo..(gi + 1) * cout_g * hwo];
    }
    buf.resize(cout_g * ns * hwo, C::ZERO);
    gather_block(gb, ns, g.cout, cout_g, gi, hwo, buf);
    buf
}

pub(super) fn forward<C: Real>(
    g: Geom,
    x: &TensorView,
    w: &TensorView,
    bias: Option<&TensorView>,
    out: &TensorView,
) {
    let (xs, ws) = (read::<C>(x), read::<C>(w));
    let bs: Option<Vec<C>> = bias.map(|b| read::<C>(b).into_owned());
    let (cout_g, kk, hwi, hwo) = (g.cout_g(), g.kk(), g.hwi(), g.hwo());
    let nb = g.block();
    let mut ins = vec![x, w];
    ins.extend(bias);
    write_with::<C>(out, &ins, |o| {
        if g.cin * hwi == 0 {
            // No input elements: the output is the bias (or zero).
            o.chunks_mut(g.cout * hwo).for_each(|on| {
                for (c, row) in on.chunks_mut(hwo).enumerate() {
                    row.fill(bs.as_ref().map_or(C::ZERO, |b| b[c]));
                }
            });
            return;
        }
        let block = |(col, tmp): &mut (Vec<C>, Vec<C>), (ob, xb): (&mut [C], &[C])| {
            let ns = ob.len() / (g.cout * hwo);
            let ld = ns * hwo;
            col.resize(kk * ld, C::ZERO);
            for gi in 0..g.groups {
                let wg = Mat::rows(&ws[gi * cout_g * kk..(gi + 1) * cout_g * kk], kk);
                let cols = columns(&g, xb, ns, gi, col);
                if ns == 1 {
                    let og = &mut ob[gi * cout_g * hwo..(gi + 1) * cout_g * hwo];
                    gemm(cout_g, kk, hwo, C::of(1.0), wg, Mat::rows(cols, hwo), C::ZERO, og, hwo);
                } else {
                    tmp.resize(cout_g * ld, C::ZERO);
                    gemm(cout_g, kk, ld, C::of(1.0), wg, Mat::rows(cols, ld), C::ZERO, tmp, ld);
                    for s in 0..ns {
                        for co in 0..cout_g {
                            let dst = &mut ob[(s * g.cout + gi * cout_g + co) * hwo..][..hwo];
                            dst.copy_from_slice(&tmp[co * ld + s * hwo..co * ld + (s + 1) * hwo]);
                        }
                    }
                }
            }
            if let Some(b) = &bs {
                for (i, row) in ob.chunks_mut(hwo).enumerate() {
                    let bv = b[i % g.cout];
                    row.iter_mut().for_each(|v| *v += bv);
                }
            }
        };
        o.par_chunks_mut(nb * g.cout * hwo)
            .zip(xs.par_chunks(nb * g.cin * hwi))
            .for_each_init(|| (Vec::new(), Vec::new()), block);
    });
}

/// The gradients of a regular convolution of geometry `g` (`outs`: input,
/// weight, bias). `gx_bias`, added to the input gradient, serves the
/// transposed convolution's forward.
pub(super) fn backward<C: Real>(
    g: Geom,
    gy: &TensorView,
    x: &TensorView,
    w: &TensorView,
    outs: &[Option<TensorView>; 3],
    gx_bias: Option<&TensorView>,
) {
    let (gys, ws) = (read::<C>(gy), read::<C>(w));
    let mut ins = vec![gy, x, w];
    ins.extend(gx_bias);
    if let Some(gx) = &outs[0] {
        input_grad::<C>(&g, &gys, &ws, gx, gx_bias, &ins);
    }
    if let Some(gw) = &outs[1] {
        let acc = weight_grad::<C>(&g, &read::<C>(x), &gys);
        write_with::<C>(gw, &ins, |o| o.copy_from_slice(&acc));
    }
    if let Some(gb) = &outs[2] {
        write_channel_sums::<C>(gb, &ins, &gys, g.cout, g.hwo());
    }
}

/// Writes the input gradient (plus `gx_bias` per channel, if given) of a
/// convolution whose output gradient is `gys` and weight `ws` to `gx`.
fn input_grad<C: Real>(
    g: &Geom,
    gys: &[C],
    ws: &[C],
    gx: &TensorView,
    gx_bias: Option<&TensorView>,
    ins: &[&TensorView],
) {
    let (hwi, hwo, nb) = (g.hwi(), g.hwo(), g.block());
    let bias: Option<Vec<C>> = gx_bias.map(|b| read::<C>(b).into_owned());
    let add_bias = |o: &mut [C]| {
        if let (Some(b), true) = (&bias, hwi > 0) {
            for (i, row) in o.chunks_mut(hwi).enumerate() {
                let bv = b[i % g.cin];
                row.iter_mut().for_each(|v| *v += bv);
            }
        }
    };
    write_with::<C>(gx, ins, |o| {
        if g.cout * hwo == 0 {
            o.fill(C::ZERO);
            add_bias(o);
            return;
        }
        o.par_chunks_mut(nb * g.cin * hwi).zip(gys.par_chunks(nb * g.cout * hwo)).for_each_init(
            || (Vec::new(), Vec::new()),
            |scratch, (xb, gb)| input_grad_block(g, ws, scratch, xb, gb),
        );
        add_bias(o);
    });
}

/// The input gradient of one block of samples (`xb`, overwritten) from
/// its output gradient `gb`: per group, `columns = W^T * grad_out`, folded
/// back into the input's shape (`col2im`).
fn input_grad_block<C: Real>(g: &Geom, ws: &[C], (col, gyb): &mut (Vec<C>, Vec<C>), xb: &mut [C], gb: &[C]) {
    let (cin_g, cout_g, kk, hwi, hwo) = (g.cin_g(), g.cout_g(), g.kk(), g.hwi(), g.hwo());
    let ns = xb.len() / (g.cin * hwi);
    let ld = ns * hwo;
    col.resize(kk * ld, C::ZERO);
    xb.fill(C::ZERO);
    for gi in 0..g.groups {
        let wt = Mat::rows_t(&ws[gi * cout_g * kk..(gi + 1) * cout_g * kk], kk);
        let gmat = grad_rows(g, gb, ns, gi, gyb);
        gemm(kk, cout_g, ld, C::of(1.0), wt, Mat::rows(gmat, ld), C::ZERO, col, ld);
        for s in 0..ns {
            let xg = &mut xb[s * g.cin * hwi + gi * cin_g * hwi..][..cin_g * hwi];
            if g.pointwise() {
                for c in 0..cin_g {
                    xg[c * hwi..(c + 1) * hwi].copy_from_slice(&col[c * ld + s * hwo..][..hwo]);
                }
            } else {
                col2im(g, col, ld, s * hwo, xg);
            }
        }
    }
}

/// The weight gradient, `grad_out * columns^T` summed over samples: blocks
/// of samples are split among the threads, each accumulating its own sum,
/// and the per-thread sums are added at the end.
fn weight_grad<C: Real>(g: &Geom, xs: &[C], gys: &[C]) -> Vec<C> {
    let wn = g.cout * g.kk();
    let nb = g.block();
    let nblocks = g.n.div_ceil(nb);
    let threads = rayon::current_num_threads().clamp(1, nblocks.max(1));
    let per = nblocks.div_ceil(threads).max(1);
    (0..threads)
        .into_par_iter()
        .map(|t| {
            let mut acc = vec![C::ZERO; wn];
            let mut scratch = (Vec::new(), Vec::new());
            for blk in t * per..((t + 1) * per).min(nblocks) {
                let samples = blk * nb..((blk + 1) * nb).min(g.n);
                accumulate_weight_grad(g, xs, gys, samples, &mut scratch, &mut acc);
            }
            acc
        })
        .reduce_with(|mut a, b| {
            a.iter_mut().zip(&b).for_each(|(x, &y)| *x += y);
            a
        })
        .unwrap_or_else(|| vec![C::ZERO; wn])
}

/// Adds the weight gradient of the block of `samples` to `acc`.
fn accumulate_weight_grad<C: Real>(
    g: &Geom,
    xs: &[C],
    gys: &[C],
    samples: Range<usize>,
    (col, gyb): &mut (Vec<C>, Vec<C>),
    acc: &mut [C],
) {
    let (cout_g, kk, hwi, hwo) = (g.cout_g(), g.kk(), g.hwi(), g.hwo());
    let (s0, s1) = (samples.start, samples.end);
    let ns = s1 - s0;
    let ld = ns * hwo;
    let xb = &xs[s0 * g.cin * hwi..s1 * g.cin * hwi];
    let gb = &gys[s0 * g.cout * hwo..s1 * g.cout * hwo];
    col.resize(kk * ld, C::ZERO);
    for gi in 0..g.groups {
        let gmat = grad_rows(g, gb, ns, gi, gyb);
        let cols = columns(g, xb, ns, gi, col);
        let ag = &mut acc[gi * cout_g * kk..(gi + 1) * cout_g * kk];
        gemm(cout_g, ld, kk, C::of(1.0), Mat::rows(gmat, ld), Mat::rows_t(cols, ld), C::of(1.0), ag, kk);
    }
}

/// Writes the per-channel sums of `grad` (`[n, channels, hw]`), a bias
/// gradient, to `out`.
fn write_channel_sums<C: Real>(
    out: &TensorView,
    ins: &[&TensorView],
    grad: &[C],
    channels: usize,
    hw: usize,
) {
    let mut sums = vec![0f64; channels];
    if hw > 0 {
        for (i, row) in grad.chunks(hw).enumerate() {
            sums[i % channels] += row.iter().map(|v| v.wide()).sum::<f64>();
        }
    }
    write_with::<C>(out, ins, |o| o.iter_mut().zip(&sums).for_each(|(o, &s)| *o = C::of(s)));
}

/// The gradients of a transposed convolution whose regular twin has
/// geometry `g` (`gy` has the twin's input shape, `x` its output shape):
/// the input gradient is the twin's forward of `gy`, the weight gradient
/// the twin's weight gradient with the roles of `x` and `gy` swapped.
pub(super) fn backward_transposed<C: Real>(
    g: Geom,
    gy: &TensorView,
    x: &TensorView,
    w: &TensorView,
    outs: &[Option<TensorView>; 3],
) {
    if let Some(gx) = &outs[0] {
        forward::<C>(g, gy, w, None, gx);
    }
    if let Some(gw) = &outs[1] {
        backward::<C>(g, x, gy, w, &[None, Some(gw.clone()), None], None);
    }
    if let Some(gb) = &outs[2] {
        write_channel_sums::<C>(gb, &[gy, x, w], &read::<C>(gy), g.cin, g.hwi());
    }
}

//! Convolution: `convolution` and `convolution_backward` for 1-D and 2-D
//! inputs with groups, stride, padding and dilation.
//!
//! Both directions are built on GEMM, per sample and per group, samples in
//! parallel (rayon): the forward pass lowers the input window to columns
//! (`im2col`, `C_in/g * kh * kw` rows by `H_out * W_out` columns) and
//! multiplies the group's weight matrix by them; a 1x1 convolution with
//! stride 1 and no padding skips the lowering (the input *is* the column
//! matrix). The input gradient multiplies the transposed weight by the
//! output gradient and folds the columns back (`col2im`); the weight
//! gradient accumulates `grad_out * columns^T` over samples, one
//! accumulator per thread. Computation is in `f32` for `f32`/`f16`/`bf16`
//! (rounded back on store, as PyTorch's CPU does) and in `f64` for `f64`.
//! A transposed convolution is the input gradient of the regular
//! convolution whose input has the transposed output's shape, so it runs
//! on the same code with that "twin" geometry (forward: the twin's input
//! gradient plus bias; backward: the twin's forward for the input gradient
//! and its weight gradient with input and output gradient swapped). 3-D
//! convolutions return `UNIMPLEMENTED` (the host falls back to the CPU), as
//! does a transposed `output_padding` that is not below the stride.

use rayon::prelude::*;

use super::dtype::{DType, Element};
use super::linalg::{gemm, read, write_with, Mat};
use super::real::{with_real, Real};
use super::view::{disjoint, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::error::Result;
use crate::stream::Work;

/// The shape of one 2-D convolution (1-D ones have `h == kh == ho == 1`).
#[derive(Debug, Clone, Copy)]
struct Geom {
    n: usize,
    cin: usize,
    h: usize,
    w: usize,
    cout: usize,
    kh: usize,
    kw: usize,
    ho: usize,
    wo: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
    dh: usize,
    dw: usize,
    groups: usize,
}

impl Geom {
    fn cin_g(&self) -> usize {
        self.cin / self.groups
    }
    fn cout_g(&self) -> usize {
        self.cout / self.groups
    }
    /// Rows of the column matrix (= columns of a group's weight matrix).
    fn kk(&self) -> usize {
        self.cin_g() * self.kh * self.kw
    }
    fn hwi(&self) -> usize {
        self.h * self.w
    }
    fn hwo(&self) -> usize {
        self.ho * self.wo
    }
    /// A 1x1 convolution that needs no lowering.
    fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.sh == 1 && self.sw == 1 && self.ph == 0 && self.pw == 0
    }
}

/// Reads an `int[]` parameter of 1 or `nd` entries as `nd` non-negative
/// values (a 1-D convolution's come out as `[1/0, v]`).
fn params(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    i: usize,
    name: &str,
    nd: usize,
    min: i64,
) -> Result<[usize; 2]> {
    let v: Vec<i64> = match call.args.get(i) {
        Some(ArgRef::IntList(v)) => v.to_vec(),
        Some(ArgRef::Int(v)) => vec![*v],
        _ => return Err(ctx.invalid(format!("argument {i} ({name}) must be an int list"))),
    };
    let v = match v.len() {
        1 => vec![v[0]; nd],
        l if l == nd => v,
        l => return Err(ctx.invalid(format!("{name} must have 1 or {nd} values, got {l}"))),
    };
    if v.iter().any(|&x| x < min) {
        return Err(ctx.invalid(format!("{name} must be at least {min}, got {v:?}")));
    }
    let neutral = if min == 0 { 0 } else { 1 };
    Ok(if nd == 1 { [neutral, v[0] as usize] } else { [v[0] as usize, v[1] as usize] })
}

/// Parses and checks the shared convolution parameters (`input`, `weight`
/// at argument positions `xi`, `xi + 1`, then `stride, padding, dilation,
/// transposed, output_padding, groups` from `pi` on) against an output
/// (or output gradient) of shape `out_shape`.
fn geometry(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    x: &TensorView,
    w: &TensorView,
    pi: usize,
    out_shape: &[usize],
) -> Result<(Geom, bool)> {
    let args = Args::new(ctx, call, pi + 6, pi + 7)?;
    let transposed = args.bool_or(pi + 3, "transposed", false)?;
    let nd = match x.ndim() {
        3 => 1,
        4 => 2,
        5 => return Err(ctx.unimplemented("3-D convolution is not supported")),
        d => return Err(ctx.invalid(format!("expected a 3-D or 4-D (batched) input, got {d}-D"))),
    };
    if w.ndim() != x.ndim() {
        return Err(ctx.invalid(format!(
            "expected a {}-D weight for a {}-D input, got {}-D",
            x.ndim(),
            x.ndim(),
            w.ndim()
        )));
    }
    let [sh, sw] = params(ctx, call, pi, "stride", nd, 1)?;
    let [ph, pw] = params(ctx, call, pi + 1, "padding", nd, 0)?;
    let [dh, dw] = params(ctx, call, pi + 2, "dilation", nd, 1)?;
    let [oph, opw] = params(ctx, call, pi + 4, "output_padding", nd, 0)?;
    let groups = match call.args.get(pi + 5) {
        Some(ArgRef::Int(g)) if *g >= 1 => *g as usize,
        _ => return Err(ctx.invalid("groups must be a positive int")),
    };
    let (xs, ws) = (x.shape(), w.shape());
    let (h, wd, kh, kw) = if nd == 1 { (1, xs[2], 1, ws[2]) } else { (xs[2], xs[3], ws[2], ws[3]) };
    if kh == 0 || kw == 0 {
        return Err(ctx.invalid(format!("weight of size {ws:?} has an empty kernel")));
    }
    let spatial = |a: usize, b: usize| if nd == 1 { vec![b] } else { vec![a, b] };
    if !transposed {
        let (n, cin, cout) = (xs[0], xs[1], ws[0]);
        if cin != ws[1] * groups || cout % groups != 0 {
            return Err(ctx.invalid(format!(
                "Given groups={groups}, weight of size {ws:?}, expected input{xs:?} to have {} channels, \
                 but got {cin} channels instead",
                ws[1] * groups
            )));
        }
        if oph != 0 || opw != 0 {
            return Err(ctx.invalid("output_padding is only supported for transposed convolution"));
        }
        let size = |i: usize, k: usize, s: usize, p: usize, d: usize| -> Option<usize> {
            (i + 2 * p).checked_sub(d * (k - 1) + 1).map(|r| r / s + 1)
        };
        let (ho, wo) = match (size(h, kh, sh, ph, dh), size(wd, kw, sw, pw, dw)) {
            (Some(a), Some(b)) => (a, b),
            _ => {
                return Err(ctx.invalid(format!("kernel size {ws:?} is larger than the padded input {xs:?}")))
            }
        };
        let mut expect = vec![n, cout];
        expect.extend(spatial(ho, wo));
        if out_shape != expect.as_slice() {
            return Err(ctx.invalid(format!("output has shape {out_shape:?}, expected {expect:?}")));
        }
        return Ok((Geom { n, cin, h, w: wd, cout, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw, groups }, false));
    }
    // A transposed convolution is the input gradient of the regular one
    // whose input has the transposed output's shape and whose output has
    // the transposed input's: describe that regular convolution.
    let (n, cin_t) = (xs[0], xs[1]);
    if cin_t != ws[0] || cin_t % groups != 0 {
        return Err(ctx.invalid(format!(
            "Given transposed=1, weight of size {ws:?}, expected input{xs:?} to have {} channels, but got \
             {cin_t} channels instead",
            ws[0]
        )));
    }
    if oph >= sh || opw >= sw {
        // PyTorch also allows output_padding < dilation; that case has no
        // regular-convolution twin here.
        return Err(ctx.unimplemented("output_padding must be smaller than stride"));
    }
    let cout_t = ws[1] * groups;
    let size = |i: usize, k: usize, s: usize, p: usize, d: usize, op: usize| -> Option<usize> {
        ((i.max(1) - 1) * s + d * (k - 1) + op + 1).checked_sub(2 * p)
    };
    let (ht, wt) = match (size(h, kh, sh, ph, dh, oph), size(wd, kw, sw, pw, dw, opw)) {
        (Some(a), Some(b)) if a > 0 && b > 0 && h > 0 && wd > 0 => (a, b),
        _ => return Err(ctx.invalid(format!("input {xs:?} and weight {ws:?} give an empty output"))),
    };
    let mut expect = vec![n, cout_t];
    expect.extend(spatial(ht, wt));
    if out_shape != expect.as_slice() {
        return Err(ctx.invalid(format!("output has shape {out_shape:?}, expected {expect:?}")));
    }
    Ok((
        Geom {
            n,
            cin: cout_t,
            h: ht,
            w: wt,
            cout: cin_t,
            kh,
            kw,
            ho: h,
            wo: wd,
            sh,
            sw,
            ph,
            pw,
            dh,
            dw,
            groups,
        },
        true,
    ))
}

fn check_float(ctx: &KernelCtx<'_>, views: &[&TensorView], dtype: DType) -> Result<()> {
    for v in views {
        if v.dtype() != dtype {
            return Err(ctx.invalid(format!(
                "Input type ({}) and weight type ({}) should be the same",
                dtype,
                v.dtype()
            )));
        }
    }
    if !dtype.is_floating() {
        return Err(ctx.unimplemented(format!("convolution of {dtype} tensors is not supported")));
    }
    Ok(())
}

/// `convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride,
/// SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[]
/// output_padding, SymInt groups) -> Tensor`
pub(crate) fn convolution(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 9, 9)?;
    let x = ctx.device_view(args.tensor(0, "input")?, "input")?;
    let w = ctx.device_view(args.tensor(1, "weight")?, "weight")?;
    let bias = match call.args.get(2) {
        Some(ArgRef::Tensor(t)) => Some(ctx.device_view(t, "bias")?),
        _ => None,
    };
    let out = ctx.output(call, 0)?;
    let (g, transposed) = geometry(ctx, call, &x, &w, 3, out.shape())?;
    let out_channels = if transposed { g.cin } else { g.cout };
    let mut ins = vec![&w, &out];
    if let Some(b) = &bias {
        if b.shape() != [out_channels] {
            return Err(ctx.invalid(format!("bias has shape {:?}, expected [{out_channels}]", b.shape())));
        }
        ins.push(b);
    }
    check_float(ctx, &ins, x.dtype())?;
    if [Some(&x), Some(&w), bias.as_ref()].into_iter().flatten().any(|v| !disjoint(&out, v)) {
        return Err(ctx.invalid("the output shares memory with an input"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    with_real!(ctx, x.dtype(), C => Ok(Some(Work::new(move || {
        if transposed {
            backward::<C>(g, &x, &x, &w, &[Some(out), None, None], bias.as_ref());
        } else {
            forward::<C>(g, &x, &w, bias.as_ref(), &out);
        }
        Ok(())
    }))))
}

/// Columns a block of samples should give a GEMM: small images are
/// batched so that the GEMM's `n` dimension is wide enough to be
/// efficient (e.g. 2x2 outputs in the last ResNet stage).
const BLOCK_COLS: usize = 256;

impl Geom {
    /// Samples per block.
    fn block(&self) -> usize {
        BLOCK_COLS.div_ceil(self.hwo().max(1)).clamp(1, self.n.max(1))
    }
}

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

fn forward<C: Real>(g: Geom, x: &TensorView, w: &TensorView, bias: Option<&TensorView>, out: &TensorView) {
    let (xs, ws) = (read::<C>(x), read::<C>(w));
    let bs: Option<Vec<C>> = bias.map(|b| read::<C>(b).into_owned());
    let (cin_g, cout_g, kk, hwi, hwo) = (g.cin_g(), g.cout_g(), g.kk(), g.hwi(), g.hwo());
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
                let cols: &[C] = if ns == 1 && g.pointwise() {
                    &xb[gi * cin_g * hwi..(gi + 1) * cin_g * hwi]
                } else {
                    for s in 0..ns {
                        let xg = &xb[s * g.cin * hwi + gi * cin_g * hwi..][..cin_g * hwi];
                        im2col(&g, xg, col, ld, s * hwo);
                    }
                    &col[..]
                };
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

/// `convolution_backward(Tensor grad_output, Tensor input, Tensor weight,
/// SymInt[]? bias_sizes, SymInt[] stride, SymInt[] padding, SymInt[]
/// dilation, bool transposed, SymInt[] output_padding, SymInt groups,
/// bool[3] output_mask) -> (Tensor, Tensor, Tensor)`: the gradients with
/// respect to input, weight and bias; outputs whose mask entry is false
/// are left alone.
pub(crate) fn convolution_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 11, 11)?;
    let gy = ctx.device_view(args.tensor(0, "grad_output")?, "grad_output")?;
    let x = ctx.device_view(args.tensor(1, "input")?, "input")?;
    let w = ctx.device_view(args.tensor(2, "weight")?, "weight")?;
    let mask: [bool; 3] = match call.args.get(10) {
        Some(ArgRef::BoolList(m)) if m.len() == 3 => [m[0], m[1], m[2]],
        _ => return Err(ctx.invalid("argument 10 (output_mask) must be a list of 3 bools")),
    };
    let (g, transposed) = geometry(ctx, call, &x, &w, 4, gy.shape())?;
    check_float(ctx, &[&gy, &w], x.dtype())?;
    let mut outs: [Option<TensorView>; 3] = [None, None, None];
    let out_channels = [if transposed { g.cin } else { g.cout }];
    let expect: [&[usize]; 3] = [x.shape(), w.shape(), &out_channels];
    for i in 0..3 {
        if !mask[i] {
            continue;
        }
        let o = ctx.output(call, i)?;
        if o.numel() == 0 && expect[i].iter().product::<usize>() != 0 {
            continue;
        }
        if o.shape() != expect[i] {
            return Err(ctx.invalid(format!(
                "output {i} has shape {:?}, expected {:?}",
                o.shape(),
                expect[i]
            )));
        }
        check_float(ctx, &[&o], x.dtype())?;
        for prev in outs.iter().flatten().chain([&gy, &x, &w]) {
            if !disjoint(prev, &o) {
                return Err(ctx.invalid("a gradient output shares memory with another operand"));
            }
        }
        outs[i] = Some(o);
    }
    if outs.iter().all(Option::is_none) {
        return Ok(None);
    }
    with_real!(ctx, x.dtype(), C => Ok(Some(Work::new(move || {
        if transposed {
            backward_transposed::<C>(g, &gy, &x, &w, &outs);
        } else {
            backward::<C>(g, &gy, &x, &w, &outs, None);
        }
        Ok(())
    }))))
}

/// The gradients of a regular convolution of geometry `g` (`outs`: input,
/// weight, bias). `gx_bias`, added to the input gradient, serves the
/// transposed convolution's forward.
fn backward<C: Real>(
    g: Geom,
    gy: &TensorView,
    x: &TensorView,
    w: &TensorView,
    outs: &[Option<TensorView>; 3],
    gx_bias: Option<&TensorView>,
) {
    let (gys, ws) = (read::<C>(gy), read::<C>(w));
    let (cin_g, cout_g, kk, hwi, hwo) = (g.cin_g(), g.cout_g(), g.kk(), g.hwi(), g.hwo());
    let mut ins = vec![gy, x, w];
    ins.extend(gx_bias);
    let nb = g.block();
    if let Some(gx) = &outs[0] {
        let bias: Option<Vec<C>> = gx_bias.map(|b| read::<C>(b).into_owned());
        let add_bias = |o: &mut [C]| {
            if let (Some(b), true) = (&bias, hwi > 0) {
                for (i, row) in o.chunks_mut(hwi).enumerate() {
                    let bv = b[i % g.cin];
                    row.iter_mut().for_each(|v| *v += bv);
                }
            }
        };
        write_with::<C>(gx, &ins, |o| {
            if g.cout * hwo == 0 {
                o.fill(C::ZERO);
                add_bias(o);
                return;
            }
            let block = |(col, gyb): &mut (Vec<C>, Vec<C>), (xb, gb): (&mut [C], &[C])| {
                let ns = xb.len() / (g.cin * hwi);
                let ld = ns * hwo;
                col.resize(kk * ld, C::ZERO);
                xb.fill(C::ZERO);
                for gi in 0..g.groups {
                    let wt = Mat::rows_t(&ws[gi * cout_g * kk..(gi + 1) * cout_g * kk], kk);
                    let gmat: &[C] = if ns == 1 {
                        &gb[gi * cout_g * hwo..(gi + 1) * cout_g * hwo]
                    } else {
                        gyb.resize(cout_g * ld, C::ZERO);
                        gather_block(gb, ns, g.cout, cout_g, gi, hwo, gyb);
                        &gyb[..]
                    };
                    gemm(kk, cout_g, ld, C::of(1.0), wt, Mat::rows(gmat, ld), C::ZERO, col, ld);
                    for s in 0..ns {
                        let xg = &mut xb[s * g.cin * hwi + gi * cin_g * hwi..][..cin_g * hwi];
                        if g.pointwise() {
                            for c in 0..cin_g {
                                xg[c * hwi..(c + 1) * hwi].copy_from_slice(&col[c * ld + s * hwo..][..hwo]);
                            }
                        } else {
                            col2im(&g, col, ld, s * hwo, xg);
                        }
                    }
                }
            };
            o.par_chunks_mut(nb * g.cin * hwi)
                .zip(gys.par_chunks(nb * g.cout * hwo))
                .for_each_init(|| (Vec::new(), Vec::new()), block);
            add_bias(o);
        });
    }
    if let Some(gw) = &outs[1] {
        let xs = read::<C>(x);
        let wn = g.cout * kk;
        let nblocks = g.n.div_ceil(nb);
        let threads = rayon::current_num_threads().clamp(1, nblocks.max(1));
        let per = nblocks.div_ceil(threads).max(1);
        let acc = (0..threads)
            .into_par_iter()
            .map(|t| {
                let mut acc = vec![C::ZERO; wn];
                let (mut col, mut gyb) = (Vec::new(), Vec::new());
                for blk in t * per..((t + 1) * per).min(nblocks) {
                    let (s0, s1) = (blk * nb, ((blk + 1) * nb).min(g.n));
                    let ns = s1 - s0;
                    let ld = ns * hwo;
                    let xb = &xs[s0 * g.cin * hwi..s1 * g.cin * hwi];
                    let gb = &gys[s0 * g.cout * hwo..s1 * g.cout * hwo];
                    col.resize(kk * ld, C::ZERO);
                    for gi in 0..g.groups {
                        let gmat: &[C] = if ns == 1 {
                            &gb[gi * cout_g * hwo..(gi + 1) * cout_g * hwo]
                        } else {
                            gyb.resize(cout_g * ld, C::ZERO);
                            gather_block(gb, ns, g.cout, cout_g, gi, hwo, &mut gyb);
                            &gyb[..]
                        };
                        let cols: &[C] = if ns == 1 && g.pointwise() {
                            &xb[gi * cin_g * hwi..(gi + 1) * cin_g * hwi]
                        } else {
                            for s in 0..ns {
                                let xg = &xb[s * g.cin * hwi + gi * cin_g * hwi..][..cin_g * hwi];
                                im2col(&g, xg, &mut col, ld, s * hwo);
                            }
                            &col[..]
                        };
                        let ag = &mut acc[gi * cout_g * kk..(gi + 1) * cout_g * kk];
                        gemm(
                            cout_g,
                            ld,
                            kk,
                            C::of(1.0),
                            Mat::rows(gmat, ld),
                            Mat::rows_t(cols, ld),
                            C::of(1.0),
                            ag,
                            kk,
                        );
                    }
                }
                acc
            })
            .reduce_with(|mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, &y)| *x += y);
                a
            })
            .unwrap_or_else(|| vec![C::ZERO; wn]);
        write_with::<C>(gw, &ins, |o| o.copy_from_slice(&acc));
    }
    if let Some(gb) = &outs[2] {
        let mut sums = vec![0f64; g.cout];
        if hwo > 0 {
            for (i, row) in gys.chunks(hwo).enumerate() {
                sums[i % g.cout] += row.iter().map(|v| v.wide()).sum::<f64>();
            }
        }
        write_with::<C>(gb, &ins, |o| o.iter_mut().zip(&sums).for_each(|(o, &s)| *o = C::of(s)));
    }
}

/// The gradients of a transposed convolution whose regular twin has
/// geometry `g` (`gy` has the twin's input shape, `x` its output shape):
/// the input gradient is the twin's forward of `gy`, the weight gradient
/// the twin's weight gradient with the roles of `x` and `gy` swapped.
fn backward_transposed<C: Real>(
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
        let gys = read::<C>(gy);
        let hw = g.hwi();
        let mut sums = vec![0f64; g.cin];
        if hw > 0 {
            for (i, row) in gys.chunks(hw).enumerate() {
                sums[i % g.cin] += row.iter().map(|v| v.wide()).sum::<f64>();
            }
        }
        write_with::<C>(gb, &[gy, x, w], |o| o.iter_mut().zip(&sums).for_each(|(o, &s)| *o = C::of(s)));
    }
}

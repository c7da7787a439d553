//! The geometry of a convolution: the parameters read from the call,
//! checked against the input, weight and output shapes, as one [`Geom`]
//! that the compute half needs nothing else from.

use crate::error::Result;
use crate::kernels::view::TensorView;
use crate::kernels::{ArgRef, Args, Frame, KernelCtx};

/// The shape of one 2-D convolution (1-D ones have `h == kh == ho == 1`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Geom {
    pub(super) n: usize,
    pub(super) cin: usize,
    pub(super) h: usize,
    pub(super) w: usize,
    pub(super) cout: usize,
    pub(super) kh: usize,
    pub(super) kw: usize,
    pub(super) ho: usize,
    pub(super) wo: usize,
    pub(super) sh: usize,
    pub(super) sw: usize,
    pub(super) ph: usize,
    pub(super) pw: usize,
    pub(super) dh: usize,
    pub(super) dw: usize,
    pub(super) groups: usize,
}

/// Columns a block of samples should give a GEMM: small images are
/// batched so that the GEMM's `n` dimension is wide enough to be
/// efficient (e.g. 2x2 outputs in the last ResNet stage).
const BLOCK_COLS: usize = 256;

impl Geom {
    pub(super) fn cin_g(&self) -> usize {
        self.cin / self.groups
    }
    pub(super) fn cout_g(&self) -> usize {
        self.cout / self.groups
    }
    /// Rows of the column matrix (= columns of a group's weight matrix).
    pub(super) fn kk(&self) -> usize {
        self.cin_g() * self.kh * self.kw
    }
    pub(super) fn hwi(&self) -> usize {
        self.h * self.w
    }
    pub(super) fn hwo(&self) -> usize {
        self.ho * self.wo
    }
    /// A 1x1 convolution that needs no lowering.
    pub(super) fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.sh == 1 && self.sw == 1 && self.ph == 0 && self.pw == 0
    }
    /// Samples per block.
    pub(super) fn block(&self) -> usize {
        BLOCK_COLS.div_ceil(self.hwo().max(1)).clamp(1, self.n.max(1))
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

/// The convolution parameters as given, range-checked, with the spatial
/// sizes of input and kernel (a 1-D convolution has `h == kh == 1`); not
/// yet checked against the channel counts or the output.
#[derive(Debug, Clone, Copy)]
struct Params {
    /// Spatial dimensions: 1 or 2.
    nd: usize,
    transposed: bool,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    output_padding: [usize; 2],
    groups: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
}

/// Parses and checks the shared convolution parameters (`input`, `weight`
/// at argument positions `xi`, `xi + 1`, then `stride, padding, dilation,
/// transposed, output_padding, groups` from `pi` on) against an output
/// (or output gradient) of shape `out_shape`.
pub(super) fn geometry(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    x: &TensorView,
    w: &TensorView,
    pi: usize,
    out_shape: &[usize],
) -> Result<(Geom, bool)> {
    let p = parse_params(ctx, call, x, w, pi)?;
    if p.transposed {
        Ok((transposed_twin(ctx, &p, x.shape(), w.shape(), out_shape)?, true))
    } else {
        Ok((regular(ctx, &p, x.shape(), w.shape(), out_shape)?, false))
    }
}

/// The first half of [`geometry`]: the arguments, their kinds and ranges.
fn parse_params(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    x: &TensorView,
    w: &TensorView,
    pi: usize,
) -> Result<Params> {
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
    let stride = params(ctx, call, pi, "stride", nd, 1)?;
    let padding = params(ctx, call, pi + 1, "padding", nd, 0)?;
    let dilation = params(ctx, call, pi + 2, "dilation", nd, 1)?;
    let output_padding = params(ctx, call, pi + 4, "output_padding", nd, 0)?;
    let groups = match call.args.get(pi + 5) {
        Some(ArgRef::Int(g)) if *g >= 1 => *g as usize,
        _ => return Err(ctx.invalid("groups must be a positive int")),
    };
    let (xs, ws) = (x.shape(), w.shape());
    let (h, wd, kh, kw) = if nd == 1 { (1, xs[2], 1, ws[2]) } else { (xs[2], xs[3], ws[2], ws[3]) };
    if kh == 0 || kw == 0 {
        return Err(ctx.invalid(format!("weight of size {ws:?} has an empty kernel")));
    }
    Ok(Params { nd, transposed, stride, padding, dilation, output_padding, groups, h, w: wd, kh, kw })
}

/// Checks that `out_shape` is `[n, channels]` followed by the spatial
/// sizes `(a, b)` (only `b` for a 1-D convolution).
fn check_output(
    ctx: &KernelCtx<'_>,
    p: &Params,
    out_shape: &[usize],
    n: usize,
    channels: usize,
    (a, b): (usize, usize),
) -> Result<()> {
    let mut expect = vec![n, channels];
    expect.extend(if p.nd == 1 { vec![b] } else { vec![a, b] });
    if out_shape != expect.as_slice() {
        return Err(ctx.invalid(format!("output has shape {out_shape:?}, expected {expect:?}")));
    }
    Ok(())
}

/// The geometry of a regular convolution of input shape `xs` with weight
/// shape `ws`.
fn regular(ctx: &KernelCtx<'_>, p: &Params, xs: &[usize], ws: &[usize], out_shape: &[usize]) -> Result<Geom> {
    let Params { h, w: wd, kh, kw, groups, .. } = *p;
    let ([sh, sw], [ph, pw], [dh, dw], [oph, opw]) = (p.stride, p.padding, p.dilation, p.output_padding);
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
        _ => return Err(ctx.invalid(format!("kernel size {ws:?} is larger than the padded input {xs:?}"))),
    };
    check_output(ctx, p, out_shape, n, cout, (ho, wo))?;
    Ok(Geom { n, cin, h, w: wd, cout, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw, groups })
}

/// The geometry of a transposed convolution of input shape `xs` with
/// weight shape `ws`, described as its regular twin: a transposed
/// convolution is the input gradient of the regular one whose input has
/// the transposed output's shape and whose output has the transposed
/// input's.
fn transposed_twin(
    ctx: &KernelCtx<'_>,
    p: &Params,
    xs: &[usize],
    ws: &[usize],
    out_shape: &[usize],
) -> Result<Geom> {
    let Params { h, w: wd, kh, kw, groups, .. } = *p;
    let ([sh, sw], [ph, pw], [dh, dw], [oph, opw]) = (p.stride, p.padding, p.dilation, p.output_padding);
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
    check_output(ctx, p, out_shape, n, cout_t, (ht, wt))?;
    Ok(Geom {
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
    })
}

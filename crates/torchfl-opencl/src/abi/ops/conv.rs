//! Convolution: `convolution` and `convolution_backward` for 1-D and 2-D
//! inputs with any stride, padding, dilation and groups, regular or
//! transposed (`kernels::conv`). 3-D convolutions are UNIMPLEMENTED (the
//! host runs the CPU kernel).
//!
//! A transposed convolution is the input gradient of the regular one (its
//! "twin") whose input has the transposed output's shape and whose output
//! has the transposed input's, with the same weight; so its forward pass
//! is the twin's input gradient, its input gradient the twin's forward
//! pass, and its weight gradient the twin's with input and output gradient
//! swapped.

use crate::abi::frame::Call;
use crate::error::{Error, Result};
use crate::kernels::{Conv, ConvGeom, Elem, View};

/// The convolution parameters as given, range-checked, with the spatial
/// sizes of input and kernel (a 1-D convolution has `h == kh == 1` and the
/// neutral stride, padding and dilation along that height).
#[derive(Debug, Clone, Copy)]
struct Params {
    /// Spatial dimensions: 1 or 2.
    nd: usize,
    transposed: bool,
    stride: [i64; 2],
    padding: [i64; 2],
    dilation: [i64; 2],
    output_padding: [i64; 2],
    groups: i64,
    h: i64,
    w: i64,
    kh: i64,
    kw: i64,
}

/// Argument `i`, an `int[]` of 1 or `nd` entries (or a bare int), as `nd`
/// values of at least `min` (a 1-D convolution's come out as `[neutral, v]`).
fn pair(c: &Call<'_>, i: usize, name: &str, nd: usize, min: i64) -> Result<[i64; 2]> {
    let v = match c.ints(i) {
        Ok(v) => v.to_vec(),
        Err(_) => vec![c.int(i).map_err(|_| {
            Error::invalid(format!("opencl: {}: argument {i} ({name}) must be an int list", c.op()))
        })?],
    };
    let v = match v.len() {
        1 => vec![v[0]; nd],
        l if l == nd => v,
        l => {
            return Err(Error::invalid(format!(
                "opencl: {}: {name} must have 1 or {nd} values, got {l}",
                c.op()
            )))
        }
    };
    if v.iter().any(|&x| x < min) {
        return Err(Error::invalid(format!("opencl: {}: {name} must be at least {min}, got {v:?}", c.op())));
    }
    Ok(if nd == 1 { [min.min(1), v[0]] } else { [v[0], v[1]] })
}

/// Reads `stride, padding, dilation, transposed, output_padding, groups`
/// from argument `pi` on, for input `x` and weight `w`.
fn params(c: &Call<'_>, x: &View<'_>, w: &View<'_>, pi: usize) -> Result<Params> {
    let nd = match x.shape.len() {
        3 => 1,
        4 => 2,
        5 => return Err(Error::unimplemented(format!("opencl: {}: 3-D convolution", c.op()))),
        d => {
            return Err(Error::invalid(format!(
                "opencl: {}: expected a 3-D or 4-D (batched) input, got {d}-D",
                c.op()
            )))
        }
    };
    if w.shape.len() != x.shape.len() {
        return Err(Error::invalid(format!(
            "opencl: {}: expected a {}-D weight for a {}-D input, got {}-D",
            c.op(),
            x.shape.len(),
            x.shape.len(),
            w.shape.len()
        )));
    }
    let stride = pair(c, pi, "stride", nd, 1)?;
    let padding = pair(c, pi + 1, "padding", nd, 0)?;
    let dilation = pair(c, pi + 2, "dilation", nd, 1)?;
    let transposed = c.bool(pi + 3)?;
    let output_padding = pair(c, pi + 4, "output_padding", nd, 0)?;
    let groups = c.int(pi + 5)?;
    if groups < 1 {
        return Err(Error::invalid(format!("opencl: {}: non-positive groups is not supported", c.op())));
    }
    let (xs, ws) = (x.shape, w.shape);
    let (h, wd, kh, kw) = if nd == 1 { (1, xs[2], 1, ws[2]) } else { (xs[2], xs[3], ws[2], ws[3]) };
    if kh == 0 || kw == 0 {
        return Err(Error::invalid(format!("opencl: {}: weight of size {ws:?} has an empty kernel", c.op())));
    }
    Ok(Params { nd, transposed, stride, padding, dilation, output_padding, groups, h, w: wd, kh, kw })
}

/// Checks that `out_shape` is `[n, channels]` and the spatial sizes
/// `(a, b)` (only `b` for a 1-D convolution).
fn check_output(
    c: &Call<'_>,
    p: &Params,
    out_shape: &[i64],
    n: i64,
    channels: i64,
    (a, b): (i64, i64),
) -> Result<()> {
    let mut expect = vec![n, channels];
    expect.extend(if p.nd == 1 { vec![b] } else { vec![a, b] });
    if out_shape != expect.as_slice() {
        return Err(Error::invalid(format!(
            "opencl: {}: output has shape {out_shape:?}, expected {expect:?}",
            c.op()
        )));
    }
    Ok(())
}

/// The geometry of a regular convolution of `xs` by `ws`.
fn regular(c: &Call<'_>, p: &Params, xs: &[i64], ws: &[i64], out_shape: &[i64]) -> Result<ConvGeom> {
    let Params { h, w, kh, kw, groups, .. } = *p;
    let ([sh, sw], [ph, pw], [dh, dw]) = (p.stride, p.padding, p.dilation);
    let (n, cin, cout) = (xs[0], xs[1], ws[0]);
    if cin != ws[1] * groups || cout % groups != 0 {
        return Err(Error::invalid(format!(
            "opencl: {}: Given groups={groups}, weight of size {ws:?}, expected input{xs:?} to have {} \
             channels, but got {cin} channels instead",
            c.op(),
            ws[1] * groups
        )));
    }
    if p.output_padding != [0, 0] {
        return Err(Error::invalid(format!(
            "opencl: {}: output_padding is only supported for transposed convolution",
            c.op()
        )));
    }
    let size = |i: i64, k: i64, s: i64, p: i64, d: i64| {
        let span = i + 2 * p - d * (k - 1) - 1;
        (span >= 0).then(|| span / s + 1)
    };
    let (Some(ho), Some(wo)) = (size(h, kh, sh, ph, dh), size(w, kw, sw, pw, dw)) else {
        return Err(Error::invalid(format!(
            "opencl: {}: kernel size {ws:?} is larger than the padded input {xs:?}",
            c.op()
        )));
    };
    check_output(c, p, out_shape, n, cout, (ho, wo))?;
    Ok(ConvGeom { n, cin, h, w, cout, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw, groups })
}

/// The regular twin of a transposed convolution of `xs` by `ws`.
fn transposed_twin(c: &Call<'_>, p: &Params, xs: &[i64], ws: &[i64], out_shape: &[i64]) -> Result<ConvGeom> {
    let Params { h, w, kh, kw, groups, .. } = *p;
    let ([sh, sw], [ph, pw], [dh, dw], [oph, opw]) = (p.stride, p.padding, p.dilation, p.output_padding);
    let (n, cin_t) = (xs[0], xs[1]);
    if cin_t != ws[0] || cin_t % groups != 0 {
        return Err(Error::invalid(format!(
            "opencl: {}: Given transposed=1, weight of size {ws:?}, expected input{xs:?} to have {} \
             channels, but got {cin_t} channels instead",
            c.op(),
            ws[0]
        )));
    }
    if (oph >= sh && oph >= dh) || (opw >= sw && opw >= dw) {
        return Err(Error::invalid(format!(
            "opencl: {}: output padding must be smaller than either stride or dilation, but got \
             output_padding={:?}, stride={:?}, dilation={:?}",
            c.op(),
            p.output_padding,
            p.stride,
            p.dilation
        )));
    }
    let cout_t = ws[1] * groups;
    // The direct kernels bound every tap by the sizes given, so the twin
    // needs no relation between them beyond these.
    let size = |i: i64, k: i64, s: i64, p: i64, d: i64, op: i64| (i - 1) * s + d * (k - 1) + op + 1 - 2 * p;
    let (ht, wt) = (size(h, kh, sh, ph, dh, oph), size(w, kw, sw, pw, dw, opw));
    if ht <= 0 || wt <= 0 || h <= 0 || w <= 0 {
        return Err(Error::invalid(format!(
            "opencl: {}: input {xs:?} and weight {ws:?} give an empty output",
            c.op()
        )));
    }
    check_output(c, p, out_shape, n, cout_t, (ht, wt))?;
    Ok(ConvGeom {
        n,
        cin: cout_t,
        h: ht,
        w: wt,
        cout: cin_t,
        kh,
        kw,
        ho: h,
        wo: w,
        sh,
        sw,
        ph,
        pw,
        dh,
        dw,
        groups,
    })
}

/// The regular geometry of the call (the twin's, for a transposed one) and
/// whether it is transposed; `out_shape` is the (transposed) output's.
fn geometry(
    c: &Call<'_>,
    x: &View<'_>,
    w: &View<'_>,
    pi: usize,
    out_shape: &[i64],
) -> Result<(ConvGeom, bool)> {
    let p = params(c, x, w, pi)?;
    if p.transposed {
        Ok((transposed_twin(c, &p, x.shape, w.shape, out_shape)?, true))
    } else {
        Ok((regular(c, &p, x.shape, w.shape, out_shape)?, false))
    }
}

/// Every view has the input's dtype: INVALID otherwise (PyTorch checks it
/// before dispatch); a non-float one is UNIMPLEMENTED.
fn check_dtypes(c: &Call<'_>, input: Elem, views: &[&View<'_>]) -> Result<()> {
    if let Some(v) = views.iter().find(|v| v.elem != input) {
        return Err(Error::invalid(format!(
            "opencl: {}: Input type ({}) and weight type ({}) should be the same",
            c.op(),
            input.c_name(),
            v.elem.c_name()
        )));
    }
    if !input.is_float() {
        return Err(Error::unimplemented(format!(
            "opencl: {}: convolution of {} tensors",
            c.op(),
            input.c_name()
        )));
    }
    Ok(())
}

fn launcher<'a>(c: &Call<'a>, geom: ConvGeom) -> Conv<'a> {
    Conv { l: c.launch(), geom }
}

/// `convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride,
/// SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[]
/// output_padding, SymInt groups) -> Tensor`.
pub(in crate::abi) fn convolution(c: &Call<'_>) -> Result<()> {
    c.expect(9, 1)?;
    let (x, w, bias, out) = (c.tensor(0)?, c.tensor(1)?, c.opt_tensor(2)?, c.output(0)?);
    let (geom, transposed) = geometry(c, &x, &w, 3, out.shape)?;
    let channels = if transposed { geom.cin } else { geom.cout };
    if let Some(b) = &bias {
        if b.shape != [channels] {
            return Err(Error::invalid(format!(
                "opencl: {}: bias has shape {:?}, expected [{channels}]",
                c.op(),
                b.shape
            )));
        }
    }
    let mut views = vec![&w, &out];
    views.extend(bias.as_ref());
    check_dtypes(c, x.elem, &views)?;
    let conv = launcher(c, geom);
    if transposed {
        conv.grad_input(&x, &w, bias.as_ref(), &out)
    } else {
        conv.forward(&x, &w, bias.as_ref(), &out)
    }
}

/// `convolution_backward(Tensor grad_output, Tensor input, Tensor weight,
/// SymInt[]? bias_sizes, SymInt[] stride, SymInt[] padding, SymInt[]
/// dilation, bool transposed, SymInt[] output_padding, SymInt groups,
/// bool[3] output_mask) -> (Tensor, Tensor, Tensor)`: the gradients with
/// respect to input, weight and bias, each only where the mask asks for it
/// and the host defined the output.
pub(in crate::abi) fn convolution_backward(c: &Call<'_>) -> Result<()> {
    c.expect(11, 3)?;
    let (gy, x, w) = (c.tensor(0)?, c.tensor(1)?, c.tensor(2)?);
    let mask = c.bools(10)?;
    if mask.len() != 3 {
        return Err(Error::invalid(format!("opencl: {}: output_mask must have 3 entries", c.op())));
    }
    let (geom, transposed) = geometry(c, &x, &w, 4, gy.shape)?;
    check_dtypes(c, x.elem, &[&gy, &w])?;
    let channels = [if transposed { geom.cin } else { geom.cout }];
    let expect: [&[i64]; 3] = [x.shape, w.shape, &channels];
    let mut outs: [Option<View<'_>>; 3] = [None, None, None];
    for i in 0..3 {
        let Some(o) = c.opt_output(i)?.filter(|_| mask[i]) else { continue };
        if o.shape != expect[i] {
            return Err(Error::invalid(format!(
                "opencl: {}: output {i} has shape {:?}, expected {:?}",
                c.op(),
                o.shape,
                expect[i]
            )));
        }
        check_dtypes(c, x.elem, &[&o])?;
        outs[i] = Some(o);
    }
    let conv = launcher(c, geom);
    let [gx, gw, gb] = &outs;
    if let Some(gx) = gx {
        if transposed {
            conv.forward(&gy, &w, None, gx)?;
        } else {
            conv.grad_input(&gy, &w, None, gx)?;
        }
    }
    if let Some(gw) = gw {
        if transposed {
            conv.grad_weight(&x, &gy, gw)?;
        } else {
            conv.grad_weight(&gy, &x, gw)?;
        }
    }
    if let Some(gb) = gb {
        conv.grad_bias(&gy, gb)?;
    }
    Ok(())
}

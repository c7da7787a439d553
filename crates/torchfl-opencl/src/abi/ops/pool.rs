//! 2-D pooling (`kernels::pool`): `max_pool2d_with_indices`, `avg_pool2d`,
//! `_adaptive_avg_pool2d` and their backwards, for batched (N, C, H, W)
//! and unbatched (C, H, W) inputs, checked as PyTorch checks them.

use crate::abi::frame::Call;
use crate::error::{Error, Result};
use crate::kernels::{self, Avg, Elem, View, Window};

/// Argument `i` as an `int[2]` (one value means both); `None` when absent,
/// `None` or empty (`stride=[]` means the kernel size).
fn pair(c: &Call<'_>, i: usize, name: &str) -> Result<Option<[i64; 2]>> {
    if i >= c.num_args() {
        return Ok(None);
    }
    let list = match c.opt_ints(i) {
        Ok(list) => list,
        // A single int where the schema says int[2].
        Err(e) => return c.int(i).map(|v| Some([v, v])).map_err(|_| e),
    };
    match list {
        None | Some([]) => Ok(None),
        Some([v]) => Ok(Some([*v, *v])),
        Some([h, w]) => Ok(Some([*h, *w])),
        Some(_) => Err(Error::invalid(format!(
            "opencl: {}: {name} must either be a single int, or a tuple of two ints",
            c.op()
        ))),
    }
}

/// Argument `i` as a bool, `default` when absent.
fn bool_or(c: &Call<'_>, i: usize, default: bool) -> Result<bool> {
    if i < c.num_args() {
        c.bool(i)
    } else {
        Ok(default)
    }
}

/// The spatial sizes of a pooling: input `h x w`, output `ho x wo`.
#[derive(Debug, Clone, Copy)]
struct Planes {
    h: i64,
    w: i64,
    ho: i64,
    wo: i64,
}

/// Checks `x` is 3-D or 4-D, `out` has its leading dimensions, and the
/// planes are not empty.
fn planes(c: &Call<'_>, x: &View<'_>, out: &[i64]) -> Result<Planes> {
    let xs = x.shape;
    let d = xs.len();
    if !(d == 3 || d == 4) || out.len() != d {
        return Err(Error::invalid(format!(
            "opencl: {}: expected 3D or 4D (batch mode) tensor for input, got input {xs:?} and output \
             {out:?}",
            c.op()
        )));
    }
    if xs[..d - 2] != out[..d - 2] {
        return Err(Error::invalid(format!(
            "opencl: {}: output shape {out:?} does not match input shape {xs:?}",
            c.op()
        )));
    }
    if xs[d - 2] * xs[d - 1] == 0 && xs[..d - 2].iter().product::<i64>() > 0 {
        return Err(Error::invalid(format!(
            "opencl: {}: Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but \
             got: {xs:?}",
            c.op()
        )));
    }
    Ok(Planes { h: xs[d - 2], w: xs[d - 1], ho: out[d - 2], wo: out[d - 1] })
}

/// PyTorch's `pooling_output_shape`.
fn out_size(input: i64, k: i64, pad: i64, stride: i64, dil: i64, ceil: bool) -> i64 {
    let num = input + 2 * pad - dil * (k - 1) - 1 + if ceil { stride - 1 } else { 0 };
    let mut o = num.div_euclid(stride) + 1;
    if ceil && (o - 1) * stride >= input + pad {
        o -= 1;
    }
    o
}

/// Parses `kernel_size, stride, padding[, dilation]` from argument `i` on
/// and checks them and the output's spatial size as PyTorch does.
fn window(c: &Call<'_>, i: usize, dilation: bool, ceil: bool, pl: &Planes) -> Result<Window> {
    let op = c.op();
    let k = pair(c, i, "kernel_size")?.ok_or_else(|| {
        Error::invalid(format!(
            "opencl: {op}: kernel_size must either be a single int, or a tuple of two ints"
        ))
    })?;
    let s = pair(c, i + 1, "stride")?.unwrap_or(k);
    let p = pair(c, i + 2, "padding")?.unwrap_or([0, 0]);
    let d = if dilation { pair(c, i + 3, "dilation")?.unwrap_or([1, 1]) } else { [1, 1] };
    let small = |v: &[i64; 2]| v.iter().all(|&x| x <= i64::from(i32::MAX));
    if k.iter().any(|&v| v <= 0) {
        return Err(Error::invalid(format!(
            "opencl: {op}: kernel size should be greater than zero, but got {k:?}"
        )));
    }
    if s.iter().any(|&v| v <= 0) {
        return Err(Error::invalid(format!(
            "opencl: {op}: stride should be greater than zero, but got {s:?}"
        )));
    }
    if d.iter().any(|&v| v <= 0) {
        return Err(Error::invalid(format!(
            "opencl: {op}: dilation should be greater than zero, but got {d:?}"
        )));
    }
    if p.iter().any(|&v| v < 0) || p[0] > ((k[0] - 1) * d[0] + 1) / 2 || p[1] > ((k[1] - 1) * d[1] + 1) / 2 {
        return Err(Error::invalid(format!(
            "opencl: {op}: pad should be at most half of effective kernel size, but got pad={p:?}, \
             kernel_size={k:?} and dilation={d:?}"
        )));
    }
    if ![k, s, p, d].iter().all(small) {
        return Err(Error::unimplemented(format!("opencl: {op}: pooling parameters past 2^31")));
    }
    let eh = out_size(pl.h, k[0], p[0], s[0], d[0], ceil);
    let ew = out_size(pl.w, k[1], p[1], s[1], d[1], ceil);
    if eh < 1 || ew < 1 {
        return Err(Error::invalid(format!(
            "opencl: {op}: Given input size: {}x{}. Calculated output size: {eh}x{ew}. Output size is too \
             small",
            pl.h, pl.w
        )));
    }
    if eh != pl.ho || ew != pl.wo {
        return Err(Error::invalid(format!(
            "opencl: {op}: output size {}x{} does not match the expected {eh}x{ew} for input {}x{}",
            pl.ho, pl.wo, pl.h, pl.w
        )));
    }
    let n = |v: [i64; 2]| [v[0] as i32, v[1] as i32];
    Ok(Window { kernel: n(k), stride: n(s), padding: n(p), dilation: n(d) })
}

/// Checks every tensor has `x`'s dtype.
fn same_dtype(c: &Call<'_>, x: &View<'_>, others: &[&View<'_>]) -> Result<()> {
    for o in others {
        if o.elem != x.elem {
            return Err(Error::invalid(format!(
                "opencl: {}: expected dtype {}, got {}",
                c.op(),
                x.elem.c_name(),
                o.elem.c_name()
            )));
        }
    }
    Ok(())
}

/// Checks `grad_input` is shaped like `self`.
fn grad_shape(c: &Call<'_>, gx: &View<'_>, x: &View<'_>) -> Result<()> {
    if gx.shape != x.shape {
        return Err(Error::invalid(format!(
            "opencl: {}: grad_input has shape {:?}, expected {:?}",
            c.op(),
            gx.shape,
            x.shape
        )));
    }
    Ok(())
}

/// `max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2]
/// stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False)
/// -> (Tensor, Tensor)`.
pub(in crate::abi) fn max_pool2d_with_indices(c: &Call<'_>) -> Result<()> {
    c.expect_range(2, 6, 2)?;
    let x = c.tensor(0)?;
    let (out, indices) = (c.output(0)?, c.output(1)?);
    let pl = planes(c, &x, out.shape)?;
    let w = window(c, 1, true, bool_or(c, 5, false)?, &pl)?;
    same_dtype(c, &x, &[&out])?;
    if indices.elem != Elem::I64 || indices.shape != out.shape {
        return Err(Error::invalid(format!(
            "opencl: {}: indices must be an int64 tensor shaped like the output",
            c.op()
        )));
    }
    kernels::max_pool2d(&c.launch(), &x, &out, &indices, &w)
}

/// `max_pool2d_with_indices_backward(Tensor grad_output, Tensor self,
/// int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool
/// ceil_mode, Tensor indices) -> Tensor`.
pub(in crate::abi) fn max_pool2d_with_indices_backward(c: &Call<'_>) -> Result<()> {
    c.expect(8, 1)?;
    let (gy, x, indices, gx) = (c.tensor(0)?, c.tensor(1)?, c.tensor(7)?, c.output(0)?);
    let pl = planes(c, &x, gy.shape)?;
    let w = window(c, 2, true, c.bool(6)?, &pl)?;
    same_dtype(c, &x, &[&gy, &gx])?;
    grad_shape(c, &gx, &x)?;
    if indices.elem != Elem::I64 || indices.shape != gy.shape {
        return Err(Error::invalid(format!(
            "opencl: {}: indices must be an int64 tensor shaped like grad_output",
            c.op()
        )));
    }
    kernels::max_pool2d_backward(&c.launch(), &gy, &indices, &gx, &w)
}

/// Parses `kernel_size, stride, padding, ceil_mode, count_include_pad,
/// divisor_override`, `kernel_size` at argument `i`.
fn avg_params(c: &Call<'_>, i: usize, pl: &Planes) -> Result<Avg> {
    let ceil = bool_or(c, i + 3, false)?;
    let count_include_pad = bool_or(c, i + 4, true)?;
    let divisor = match if i + 5 < c.num_args() { c.opt_number(i + 5)? } else { None } {
        None => None,
        Some(_) => match c.int(i + 5)? {
            0 => return Err(Error::invalid(format!("opencl: {}: divisor must be not zero", c.op()))),
            d => Some(i32::try_from(d).map_err(|_| {
                Error::unimplemented(format!("opencl: {}: divisor_override {d} past 2^31", c.op()))
            })?),
        },
    };
    let window = window(c, i, false, ceil, pl)?;
    Ok(Avg::Fixed { window, count_include_pad, divisor })
}

/// `avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2]
/// padding=0, bool ceil_mode=False, bool count_include_pad=True, int?
/// divisor_override=None) -> Tensor`.
pub(in crate::abi) fn avg_pool2d(c: &Call<'_>) -> Result<()> {
    c.expect_range(2, 7, 1)?;
    let (x, out) = (c.tensor(0)?, c.output(0)?);
    let pl = planes(c, &x, out.shape)?;
    let avg = avg_params(c, 1, &pl)?;
    same_dtype(c, &x, &[&out])?;
    kernels::avg_pool2d(&c.launch(), &x, &out, avg)
}

/// `avg_pool2d_backward(Tensor grad_output, Tensor self, int[2]
/// kernel_size, int[2] stride, int[2] padding, bool ceil_mode, bool
/// count_include_pad, int? divisor_override) -> Tensor`.
pub(in crate::abi) fn avg_pool2d_backward(c: &Call<'_>) -> Result<()> {
    c.expect(8, 1)?;
    let (gy, x, gx) = (c.tensor(0)?, c.tensor(1)?, c.output(0)?);
    let pl = planes(c, &x, gy.shape)?;
    let avg = avg_params(c, 2, &pl)?;
    same_dtype(c, &x, &[&gy, &gx])?;
    grad_shape(c, &gx, &x)?;
    kernels::avg_pool2d_backward(&c.launch(), &gy, &gx, avg)
}

/// `_adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor`.
pub(in crate::abi) fn adaptive_avg_pool2d(c: &Call<'_>) -> Result<()> {
    c.expect(2, 1)?;
    let (x, out) = (c.tensor(0)?, c.output(0)?);
    let pl = planes(c, &x, out.shape)?;
    if let Some([oh, ow]) = pair(c, 1, "output_size")? {
        if oh != pl.ho || ow != pl.wo {
            return Err(Error::invalid(format!(
                "opencl: {}: output has spatial size {}x{}, expected {oh}x{ow}",
                c.op(),
                pl.ho,
                pl.wo
            )));
        }
    }
    same_dtype(c, &x, &[&out])?;
    kernels::avg_pool2d(&c.launch(), &x, &out, Avg::Adaptive)
}

/// `_adaptive_avg_pool2d_backward(Tensor grad_output, Tensor self) ->
/// Tensor`.
pub(in crate::abi) fn adaptive_avg_pool2d_backward(c: &Call<'_>) -> Result<()> {
    c.expect(2, 1)?;
    let (gy, x, gx) = (c.tensor(0)?, c.tensor(1)?, c.output(0)?);
    let pl = planes(c, &x, gy.shape)?;
    if pl.ho * pl.wo == 0 && pl.h * pl.w > 0 {
        return Err(Error::invalid(format!(
            "opencl: {}: grad_output has an empty spatial dimension",
            c.op()
        )));
    }
    same_dtype(c, &x, &[&gy, &gx])?;
    grad_shape(c, &gx, &x)?;
    kernels::avg_pool2d_backward(&c.launch(), &gy, &gx, Avg::Adaptive)
}

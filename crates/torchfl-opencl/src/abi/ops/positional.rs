//! `tril`, `triu` and `arange.start_out` (`kernels::positional`).

use crate::abi::frame::Call;
use crate::error::{Error, Result};
use crate::kernels::{arange, triangle, Elem, Number};

fn tri(c: &Call<'_>, upper: bool) -> Result<()> {
    let n = c.expect_range(1, 2, 1)?;
    let diagonal = if n == 2 { c.int(1)? } else { 0 };
    triangle(&c.launch(), &c.tensor(0)?, &c.output(0)?, diagonal, upper)
}

/// `tril(Tensor self, SymInt diagonal=0)`.
pub(in crate::abi) fn tril(c: &Call<'_>) -> Result<()> {
    tri(c, false)
}

/// `triu(Tensor self, SymInt diagonal=0)`.
pub(in crate::abi) fn triu(c: &Call<'_>) -> Result<()> {
    tri(c, true)
}

fn as_f64(n: Number) -> f64 {
    match n {
        Number::Int(i) => i as f64,
        Number::Float(f) => f,
    }
}

/// `arange.start_out(Scalar start, Scalar end, Scalar step=1, *, Tensor(a!)
/// out)`: the host sized `out` (PyTorch's meta function computes the
/// length); the range is checked as PyTorch checks it.
pub(in crate::abi) fn arange_start_out(c: &Call<'_>) -> Result<()> {
    let n = c.expect_range(2, 3, 1)?;
    let (start, end) = (c.number(0)?, c.number(1)?);
    let step = if n == 3 { c.number(2)? } else { Number::Int(1) };
    let out = c.output(0)?;
    if out.elem == Elem::Bool {
        return Err(Error::unimplemented(format!(
            "opencl: {}: \"arange_cpu\" not implemented for 'Bool'",
            c.op()
        )));
    }
    let (xs, xe, xd) = (as_f64(start), as_f64(end), as_f64(step));
    if xd == 0.0 {
        return Err(Error::invalid(format!("opencl: {}: step must be nonzero", c.op())));
    }
    if !xs.is_finite() || !xe.is_finite() {
        return Err(Error::invalid(format!("opencl: {}: unsupported range: {xs} -> {xe}", c.op())));
    }
    if !((xd > 0.0 && xe >= xs) || (xd < 0.0 && xe <= xs)) {
        return Err(Error::invalid(format!(
            "opencl: {}: upper bound and larger bound inconsistent with step sign",
            c.op()
        )));
    }
    arange(&c.launch(), &out, start, step)
}

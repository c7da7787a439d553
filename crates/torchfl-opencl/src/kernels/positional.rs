//! Operators whose result depends on the element's position
//! (`positional.cl`): `tril`/`triu` (causal masks) and `arange`.

use super::{compute_type, enqueue, type_options, work_items, Args, Launch, Number, View};
use crate::error::{Error, Result};

const SOURCE: &str = concat!(include_str!("common.cl"), include_str!("positional.cl"));

/// `out = tril(x, diagonal)` (`upper`: triu) over the last two dimensions.
pub(crate) fn triangle(
    l: &Launch<'_>,
    x: &View<'_>,
    out: &View<'_>,
    diagonal: i64,
    upper: bool,
) -> Result<()> {
    let Launch { rt, stream, op: name, .. } = *l;
    if out.shape.len() < 2 || x.shape != out.shape || x.elem != out.elem {
        return Err(Error::invalid(format!(
            "opencl: {name}: input tensor must have at least 2 dimensions and the output its shape and dtype"
        )));
    }
    let device = stream.device;
    let options = type_options(rt, device, name, &[("T", out.elem)], compute_type(out.elem))?;
    let mut args = Args::new();
    args.tensor(l, "self", x)?.tensor(l, "the output", out)?;
    args.long(diagonal).int(i32::from(upper));
    enqueue(l, (SOURCE, "triangle"), options, &args, &[work_items(out.shape)], None)
}

/// `out[i] = start + step * i` for a 1-D `out` the host sized.
pub(crate) fn arange(l: &Launch<'_>, out: &View<'_>, start: Number, step: Number) -> Result<()> {
    let Launch { rt, stream, op: name, .. } = *l;
    if out.shape.len() != 1 {
        return Err(Error::invalid(format!("opencl: {name}: the output must be 1-D, not {:?}", out.shape)));
    }
    let device = stream.device;
    let tc = compute_type(out.elem);
    let options = type_options(rt, device, name, &[("T", out.elem)], tc)?;
    let mut args = Args::new();
    args.tensor(l, "the output", out)?.number(tc, start).number(tc, step);
    enqueue(l, (SOURCE, "arange"), options, &args, &[work_items(out.shape)], None)
}

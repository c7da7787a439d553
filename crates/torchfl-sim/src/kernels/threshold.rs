//! `threshold_backward`, ReLU's backward: `grad_output` where `self >
//! threshold`, else 0. A validation step in front of the elementwise
//! engine (broadcasting, strided layouts, half types computed in `f32`).

use super::elementwise::{map2, Input};
use super::view::broadcast_shapes;
use super::{Args, Frame, KernelCtx};
use crate::dtype::{with_arith, DType, Element};
use crate::error::Result;
use crate::runtime::Work;

/// `threshold_backward(Tensor grad_output, Tensor self, Scalar threshold)
/// -> Tensor` (also `threshold_backward.grad_input`): `self <= threshold ?
/// 0 : grad_output`.
pub(crate) fn threshold_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 3)?;
    let g = ctx.device_view(args.tensor(0, "grad_output")?, "grad_output")?;
    let x = ctx.device_view(args.tensor(1, "self")?, "self")?;
    let th = args.scalar(2, "threshold", None)?;
    let out = ctx.output(call, 0)?;
    let dtype = out.dtype();
    if dtype == DType::Bool || g.dtype() != dtype || x.dtype() != dtype {
        return Err(ctx.unimplemented(format!(
            "dtypes grad_output {}, self {}, output {} are not supported",
            g.dtype(),
            x.dtype(),
            dtype
        )));
    }
    let b = broadcast_shapes(&[g.shape(), x.shape()]).map_err(|m| ctx.invalid(m))?;
    if *b != *out.shape() {
        return Err(ctx.invalid(format!(
            "output with shape {:?} doesn't match the broadcast shape {:?}",
            out.shape(),
            b
        )));
    }
    for v in [&g, &x] {
        ctx.check_overlap(&out, &super::Operand::View(v.clone()))?;
    }
    let bad = |v: super::view::TensorView| ctx.invalid(format!("shape {:?} cannot be broadcast", v.shape()));
    let g = g.into_broadcast(out.shape()).map_err(bad)?;
    let x = x.into_broadcast(out.shape()).map_err(bad)?;
    with_arith!(dtype, C => {
        let t: C = ctx.scalar_to(th, dtype)?;
        Ok(Some(map2::<C, C, _>(out, Input::View(g), Input::View(x), move |gv, xv| {
            if xv <= t {
                C::ZERO
            } else {
                gv
            }
        })))
    })
}

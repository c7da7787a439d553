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
//!
//! The kernels here only validate; [`geometry`] derives the shape of the
//! computation from the arguments (and the regular "twin" of a transposed
//! convolution), and [`compute`] does the arithmetic on that geometry
//! alone, so the two can be read, and changed, apart.

use super::real::with_real;
use super::view::{disjoint, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::Work;

mod compute;
mod geometry;

use compute::{backward, backward_transposed, forward};
use geometry::geometry;

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

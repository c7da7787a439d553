//! In-place `_foreach_*` operators, the multi-tensor ops PyTorch's
//! optimizers call on this device (its `foreach` implementation is chosen
//! for PrivateUse1 tensors): `_foreach_add_.Scalar`, `_foreach_add_.List`,
//! `_foreach_mul_.Scalar`, `_foreach_lerp_.Scalar`,
//! `_foreach_addcmul_.Scalar`.
//!
//! Each is the per-tensor kernel of [`super::pointwise`] applied to every
//! index of the lists: the kernel validates tensor `i` exactly as the
//! single op would (so semantics, dtypes, broadcasting and messages are
//! the same), and the resulting works run in list order as *one* stream
//! work, which saves a launch per parameter. A case a per-tensor kernel
//! does not support makes the whole call fall back to the CPU.
//!
//! The functional forms (`_foreach_sqrt`, `_foreach_add.List`) return
//! `Tensor[]` and the `.ScalarList` overloads take `Scalar[]`, which the
//! plugin ABI cannot pass; PyTorch runs those through its per-tensor
//! composite, which reaches the single-tensor kernels.

use super::{pointwise, ArgRef, Frame, KernelCtx, TensorRef};
use crate::error::Result;
use crate::runtime::Work;

/// The tensor list at argument `i`, every entry present.
fn list<'a>(ctx: &KernelCtx<'_>, call: &'a Frame<'a>, i: usize, name: &str) -> Result<Vec<TensorRef<'a>>> {
    match call.args.get(i) {
        Some(ArgRef::TensorList(l)) => l
            .iter()
            .enumerate()
            .map(|(k, t)| t.ok_or_else(|| ctx.invalid(format!("{name}[{k}] is None"))))
            .collect(),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a tensor list"))),
    }
}

/// Runs `kernel` for each index of the lists at `lists` (the first is
/// `self`, also the output), with the non-list arguments after them
/// appended, and combines the works.
fn foreach(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    lists: usize,
    kernel: super::KernelFn,
) -> Result<Option<Work>> {
    let names = ["self", "other", "tensor2"];
    let mut ls = Vec::with_capacity(lists);
    for (i, name) in names.iter().enumerate().take(lists) {
        ls.push(list(ctx, call, i, name)?);
    }
    let n = ls[0].len();
    if let Some(bad) = ls.iter().find(|l| l.len() != n) {
        return Err(ctx.invalid(format!(
            "Tensor lists must have the same number of tensors, got {n} and {}",
            bad.len()
        )));
    }
    let rest = call.args.get(lists..).unwrap_or(&[]);
    let mut works = Vec::with_capacity(n);
    for k in 0..n {
        let mut args: Vec<ArgRef<'_>> = ls.iter().map(|l| ArgRef::Tensor(l[k])).collect();
        args.extend(rest.iter().cloned());
        let outputs = [ls[0][k]];
        let frame = Frame {
            op_name: call.op_name,
            device: call.device,
            stream: call.stream,
            args: &args,
            outputs: &outputs,
            rng: call.rng,
            resizer: None,
        };
        if let Some(w) = kernel(ctx, &frame)? {
            works.push(w);
        }
    }
    if works.is_empty() {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        for w in works {
            w.run()?;
        }
        Ok(())
    })))
}

/// `_foreach_add_.Scalar(Tensor(a!)[] self, Scalar scalar) -> ()`
pub(crate) fn foreach_add_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    foreach(ctx, call, 1, pointwise::add_scalar)
}

/// `_foreach_add_.List(Tensor(a!)[] self, Tensor[] other, *, Scalar
/// alpha=1) -> ()`
pub(crate) fn foreach_add_list(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    foreach(ctx, call, 2, pointwise::add_tensor)
}

/// `_foreach_mul_.Scalar(Tensor(a!)[] self, Scalar scalar) -> ()`
pub(crate) fn foreach_mul_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    foreach(ctx, call, 1, pointwise::mul_scalar)
}

/// `_foreach_lerp_.Scalar(Tensor(a!)[] self, Tensor[] tensors1, Scalar
/// weight) -> ()`
pub(crate) fn foreach_lerp_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    foreach(ctx, call, 2, pointwise::lerp)
}

/// `_foreach_addcmul_.Scalar(Tensor(a!)[] self, Tensor[] tensor1,
/// Tensor[] tensor2, Scalar value=1) -> ()`
pub(crate) fn foreach_addcmul_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    foreach(ctx, call, 3, pointwise::addcmul)
}

//! Operator kernels: the half of the simulator above the runtime.
//!
//! A kernel is a plain Rust function `fn(&KernelCtx, &Frame) ->
//! Result<Option<Work>>`, where a `Frame` is a [`Call`] whose contents are
//! borrowed (from the host's `TFL_CallFrame`, valid for the call, or from a
//! `Call`), so that a launch copies nothing it does not keep. It validates
//! its call *synchronously* (argument count and kinds, dtypes, shapes, that
//! every device pointer lies inside a live allocation of the right device)
//! and returns a closure that owns copies of everything it needs; the
//! runtime enqueues that closure on the call's stream. Nothing a kernel
//! returns refers to the call frame, which is gone when the closure runs,
//! and device memory stays valid because deallocation is stream-ordered
//! ([`crate::runtime::memory`]).
//!
//! The runtime knows work, not operators: this half's [`launch`] (the
//! `Runtime::launch` of the Rust API) runs a kernel and hands its work to
//! the runtime, so every arrow between the two halves points from here
//! down.
//!
//! A launch is described by four modules: [`call`] (the call model:
//! [`Call`], its borrowed form [`Frame`], the argument and output types),
//! [`context`] ([`KernelCtx`], which validates tensors against the
//! runtime's memory and words errors as PyTorch does), [`args`] (positional
//! argument parsing with schema defaults) and [`ops`] (the op table,
//! [`for_each_op!`]).
//!
//! The kernels' layers, bottom up:
//! - [`crate::dtype`] (below both halves): element types and conversions;
//!   [`promotion`]: PyTorch's type promotion over them; [`real`]: the
//!   floating compute types (`f32`, `f64`) and the math every floating
//!   kernel shares;
//! - [`view`]: [`view::TensorView`], a validated strided view (shape and
//!   strides copied out of the descriptor), with broadcasting and overlap
//!   analysis;
//! - [`elementwise`] and [`reduce`]: the shared engines. Elementwise ops pick
//!   a contiguous fast path over slices (vectorised by LLVM, no per-element
//!   dispatch) or a general strided N-d iterator that converts dtypes in
//!   blocks, and split large work across rayon. Reductions accumulate in
//!   `f64`/`i64` deterministically;
//! - the operators, each validation over an engine or a GEMM, grouped by
//!   family: `pointwise` (arithmetic, comparisons, unary math, clamps),
//!   `reduction` (sums, means, arg/min/max, all/any), `linalg` (the GEMM
//!   wrapper and mm/addmm/bmm), `conv` (convolutions and their backward,
//!   on the GEMM), `norm` (batch and layer norm), `pool`, `threshold`
//!   (ReLU's backward), `activation`, `softmax`, `loss`, `indexing`
//!   (index_select, cat, embedding backward, where), `random` (Philox
//!   fills and dropout, driven by the call's [`Rng`]), `optim` (the
//!   `_foreach_` ops optimizers use) and `amp` (the unscale/inf-check and
//!   scale-update ops of `torch.amp.GradScaler`). A new operator adds a
//!   function to its family and a line to [`for_each_op!`];
//! - [`attention`]: fused scaled-dot-product attention (PyTorch's
//!   overrideable route), forward and backward, blocked so the attention
//!   matrix is never materialised;
//! - custom operators of the `sim::` namespace, in `fused` (bias + GELU
//!   and softmax + cross-entropy, each with its backward): the worked
//!   example of a vendor's own fused kernels, with the schema and infer
//!   function the ABI asks of operators PyTorch does not know;
//! - what torchvision's models add: `vision_pointwise`
//!   (hardswish, hardsigmoid, log_sigmoid, floor/ceil/log2), `upsample`
//!   (bilinear and nearest 2-D), `topk`, `index_put` (advanced indexing:
//!   `index.Tensor` and `_index_put_impl_`), `nonzero` (`nonzero` and
//!   `masked_select`, whose output shapes depend on data), `smooth_l1`,
//!   `randperm`, and `torchvision_ops` (`torchvision::nms`, `roi_align`
//!   and its backward): the worked example of serving another library's
//!   operators (`TFL_OP_EXTERNAL`).
//! - what language models need: `positional` (`arange`,
//!   `tril`/`triu`, `flip`), `transcendental` (`sin`/`cos`, `pow` with a
//!   tensor exponent), `pointwise::rounding` (`floor_divide`, `div` with
//!   a rounding mode, `remainder`), `scan` (`cumsum`/`cumprod`), `sort`
//!   (`sort`), `isin`, `scatter` (`gather`, `scatter`,
//!   `scatter_add`), `sampling` (`multinomial`) and `fused_adam`
//!   (`_fused_adam(w)_`), over `lines` (helpers for work along one
//!   dimension).
//!
//! This module only declares the layers and re-exports what the ABI layer
//! and the kernel families use.

pub(crate) mod activation;
pub(crate) mod amp;
pub(crate) mod args;
pub(crate) mod attention;
pub(crate) mod call;
pub(crate) mod context;
pub(crate) mod conv;
pub(crate) mod elementwise;
pub(crate) mod fused;
pub(crate) mod index_put;
pub(crate) mod indexing;
pub(crate) mod launch;
pub(crate) mod linalg;
pub(crate) mod loss;
pub(crate) mod nonzero;
pub(crate) mod norm;
pub(crate) mod ops;
pub(crate) mod optim;
pub(crate) mod pointwise;
pub(crate) mod pool;
pub(crate) mod promotion;
pub(crate) mod random;
pub(crate) mod randperm;
pub(crate) mod real;
pub(crate) mod reduce;
pub(crate) mod reduction;
pub(crate) mod smooth_l1;
pub(crate) mod softmax;
pub(crate) mod threshold;
pub(crate) mod topk;
pub(crate) mod torchvision_ops;
pub(crate) mod upsample;
pub(crate) mod view;
pub(crate) mod vision_pointwise;

// Language models
pub(crate) mod fused_adam;
pub(crate) mod isin;
pub(crate) mod lines;
pub(crate) mod positional;
pub(crate) mod sampling;
pub(crate) mod scan;
pub(crate) mod scatter;
pub(crate) mod sort;
pub(crate) mod transcendental;

pub(crate) use args::Args;
pub use call::{Arg, Call, OutputMeta, Rng, Scalar, TensorArg, TensorData};
pub(crate) use call::{ArgList, ArgRef, Frame, OutputList, OutputResizer, TensorRef};
pub(crate) use context::{KernelCtx, Operand};
pub(crate) use ops::{find, for_each_op, InferFn, KernelFn, OPS};

//! Optimizer support. PyTorch's optimizers pick their `foreach`
//! implementation for PrivateUse1 tensors; on this device the `_foreach_*`
//! operators run through PyTorch's per-tensor composites, which reach the
//! single-tensor kernels of [`super::pointwise`] (`add_`, `mul_`, `lerp_`,
//! `addcmul_`, `addcdiv_`, `sqrt`, `div_`...), so every optimizer step runs
//! on the device.
//!
//! No `_foreach_*` kernel is registered (yet): the in-place overloads
//! return `()`, and the shim's typed-entry matcher reads the first return's
//! argument index unconditionally for in-place routes
//! (`cpp_shim/src/typed_kernels.cpp`, `Typed::matches`, `k.return_arg(0)`
//! on an empty `return_args_`), which crashes plugin registration; the
//! functional overloads return `Tensor[]` and the `.ScalarList` ones take
//! `Scalar[]`, which the plugin ABI cannot pass.

//! The operator table: every operator the simulator serves, its kernel
//! and, for custom operators, its schema and infer function.
//!
//! One list ([`for_each_op!`]) is the single source of truth: the op table
//! the ABI publishes, the exported kernel symbols and [`OPS`], which the
//! Rust API looks operators up in, are all expanded from it, so they cannot
//! disagree on names, kernels or order.

use std::sync::OnceLock;

use super::{
    activation, amp, attention, conv, fused, index_put, indexing, linalg, loss, nonzero, norm, optim,
    pointwise, pool, random, randperm, reduction, smooth_l1, softmax, threshold, topk, torchvision_ops,
    upsample, vision_pointwise,
};
// Language models
use super::{fused_adam, isin, positional, sampling, scan, scatter, sort, transcendental};
use super::{ArgRef, Frame, KernelCtx, OutputMeta};
use crate::error::Result;
use crate::runtime::Work;

/// A kernel: validates, then returns the work to enqueue (`None`: nothing
/// to do, e.g. an empty tensor).
pub(crate) type KernelFn = fn(&KernelCtx<'_>, &Frame<'_>) -> Result<Option<Work>>;

/// An infer function (`TFL_OpEntry.infer_outputs`) of a custom operator:
/// the dtypes and shapes of its outputs, one per schema return, from its
/// arguments alone. `op` names the operator in messages. Tensors carry
/// dtype, shape and strides only (their data is [`TensorData::Meta`](super::TensorData::Meta) when
/// the call comes through the ABI); an infer function validates exactly
/// what its kernel validates about them, with the same errors, and never
/// touches memory.
pub(crate) type InferFn = fn(op: &str, args: &[ArgRef<'_>]) -> Result<Vec<OutputMeta>>;

/// An entry of the operator table.
#[derive(Debug)]
pub(crate) struct OpDef {
    pub(crate) name: &'static str,
    pub(crate) kernel: KernelFn,
    /// The schema without namespace, for custom operators only.
    pub(crate) schema: Option<&'static str>,
    /// Output metadata without running, for custom operators only.
    pub(crate) infer: Option<InferFn>,
}

/// The single list of operators, in three groups:
///
/// - `aten`: ATen name, kernel, and optionally `[flags]` (`TFL_OP_*`, e.g.
///   `[torchfl_ffi::TFL_OP_RANDOM]`);
/// - `custom`: operators of the plugin's own namespace (`sim::`), which
///   PyTorch knows nothing about, so each also carries its schema (without
///   the namespace) and the function that infers its outputs' dtypes and
///   shapes (`TFL_OpEntry.schema` and `.infer_outputs`), then optional
///   `[flags]`;
/// - `external`: operators another library defines (`torchvision::nms`),
///   with the schema the kernel was written for; the ABI layer flags them
///   `TFL_OP_EXTERNAL` (ABI 1.3), so the host binds them once the library
///   is loaded instead of defining them, and lists them only to hosts that
///   know the flag.
///
/// [`crate::abi`] expands it into the exported kernels and the
/// `TFL_OpEntry` table (aten entries first, external ones last), and this
/// module into [`OPS`] in the same order. No entry spells its kernel
/// symbol: the crate's build script reads the operator names of this list
/// (each string literal followed by `=>`, one entry per line) and derives
/// each symbol with torchfl-ffi's mangling, `torchfl_ffi::kernel_symbol`,
/// so a name and its symbol cannot disagree. The ABI layer checks at
/// compile time that each schema declares its operator.
macro_rules! for_each_op {
    ($m:ident) => {
        $m! {
          aten: [
            "fill_.Scalar" => pointwise::fill_scalar,
            "zero_" => pointwise::zero,
            "copy_" => pointwise::copy,
            "add.Tensor" => pointwise::add_tensor,
            "add_.Tensor" => pointwise::add_tensor,
            "add.Scalar" => pointwise::add_scalar,
            "add_.Scalar" => pointwise::add_scalar,
            "sub.Tensor" => pointwise::sub_tensor,
            "sub_.Tensor" => pointwise::sub_tensor,
            "sub.Scalar" => pointwise::sub_scalar,
            "sub_.Scalar" => pointwise::sub_scalar,
            "mul.Tensor" => pointwise::mul_tensor,
            "mul_.Tensor" => pointwise::mul_tensor,
            "mul.Scalar" => pointwise::mul_scalar,
            "mul_.Scalar" => pointwise::mul_scalar,
            "div.Tensor" => pointwise::div_tensor,
            "div_.Tensor" => pointwise::div_tensor,
            "div.Scalar" => pointwise::div_scalar,
            "div_.Scalar" => pointwise::div_scalar,
            "neg" => pointwise::neg,
            "neg_" => pointwise::neg,
            "relu" => pointwise::relu,
            "relu_" => pointwise::relu,
            "eq.Tensor" => pointwise::eq,
            "eq.Scalar" => pointwise::eq,
            "ne.Tensor" => pointwise::ne,
            "ne.Scalar" => pointwise::ne,
            "lt.Tensor" => pointwise::lt,
            "lt.Scalar" => pointwise::lt,
            "le.Tensor" => pointwise::le,
            "le.Scalar" => pointwise::le,
            "gt.Tensor" => pointwise::gt,
            "gt.Scalar" => pointwise::gt,
            "ge.Tensor" => pointwise::ge,
            "ge.Scalar" => pointwise::ge,
            "sum" => reduction::sum,
            "sum.dim_IntList" => reduction::sum_dim,
            "mean.dim" => reduction::mean_dim,
            "mm" => linalg::mm,
            // -- convolution, normalization, pooling, matrix products --
            "convolution" => conv::convolution,
            "convolution_backward" => conv::convolution_backward,
            "native_batch_norm" => norm::native_batch_norm,
            "_native_batch_norm_legit.no_stats" => norm::native_batch_norm_legit_no_stats,
            "_native_batch_norm_legit_no_training" => norm::native_batch_norm_legit_no_training,
            "native_batch_norm_backward" => norm::native_batch_norm_backward,
            "native_layer_norm" => norm::native_layer_norm,
            "native_layer_norm_backward" => norm::native_layer_norm_backward,
            "max_pool2d_with_indices" => pool::max_pool2d_with_indices,
            "max_pool2d_with_indices_backward" => pool::max_pool2d_with_indices_backward,
            "avg_pool2d" => pool::avg_pool2d,
            "avg_pool2d_backward" => pool::avg_pool2d_backward,
            "_adaptive_avg_pool2d" => pool::adaptive_avg_pool2d,
            "_adaptive_avg_pool2d_backward" => pool::adaptive_avg_pool2d_backward,
            "addmm" => linalg::addmm,
            "bmm" => linalg::bmm,
            "baddbmm" => linalg::baddbmm,
            "threshold_backward" => threshold::threshold_backward,
            // -- activations, softmax, losses, indexing, random, optimizers --
            "_softmax" => softmax::softmax,
            "_log_softmax" => softmax::log_softmax,
            "_softmax_backward_data" => softmax::softmax_backward_data,
            "_log_softmax_backward_data" => softmax::log_softmax_backward_data,
            "nll_loss_forward" => loss::nll_loss_forward,
            "nll_loss_backward" => loss::nll_loss_backward,
            "nll_loss2d_forward" => loss::nll_loss2d_forward,
            "nll_loss2d_backward" => loss::nll_loss2d_backward,
            "native_dropout" => random::native_dropout [torchfl_ffi::TFL_OP_RANDOM],
            "native_dropout_backward" => random::native_dropout_backward,
            "uniform_" => random::uniform [torchfl_ffi::TFL_OP_RANDOM],
            "normal_" => random::normal_ [torchfl_ffi::TFL_OP_RANDOM],
            "bernoulli_.float" => random::bernoulli_float [torchfl_ffi::TFL_OP_RANDOM],
            "bernoulli_.Tensor" => random::bernoulli_tensor [torchfl_ffi::TFL_OP_RANDOM],
            "random_" => random::random [torchfl_ffi::TFL_OP_RANDOM],
            "random_.from" => random::random_from [torchfl_ffi::TFL_OP_RANDOM],
            "random_.to" => random::random_to [torchfl_ffi::TFL_OP_RANDOM],
            "index_select" => indexing::index_select,
            "cat" => indexing::cat,
            "embedding_dense_backward" => indexing::embedding_dense_backward,
            "where.self" => pointwise::where_self,
            "where.self_out" => pointwise::where_self,
            "argmax" => reduction::argmax,
            "argmin" => reduction::argmin,
            "max.dim" => reduction::max_dim,
            "min.dim" => reduction::min_dim,
            "max" => reduction::max_all,
            "min" => reduction::min_all,
            "amax" => reduction::amax,
            "amin" => reduction::amin,
            "all" => reduction::all,
            "all.dim" => reduction::all,
            "all.dims" => reduction::all,
            "any" => reduction::any,
            "any.dim" => reduction::any,
            "any.dims" => reduction::any,
            "isnan" => pointwise::isnan,
            "isposinf" => pointwise::isposinf,
            "isneginf" => pointwise::isneginf,
            "logical_not.out" => pointwise::logical_not_out,
            "logical_and.out" => pointwise::logical_and_out,
            "logical_or.out" => pointwise::logical_or_out,
            "clamp" => pointwise::clamp,
            "clamp.Tensor" => pointwise::clamp,
            "clamp_min" => pointwise::clamp_min,
            "clamp_min.Tensor" => pointwise::clamp_min,
            "clamp_max" => pointwise::clamp_max,
            "clamp_max.Tensor" => pointwise::clamp_max,
            "addcmul" => pointwise::addcmul,
            "addcdiv" => pointwise::addcdiv,
            "lerp.Scalar" => pointwise::lerp,
            "lerp.Tensor" => pointwise::lerp,
            "sqrt" => pointwise::sqrt,
            "rsqrt" => pointwise::rsqrt,
            "abs.out" => pointwise::abs,
            "exp" => pointwise::exp,
            "log" => pointwise::log,
            "pow.Tensor_Scalar" => pointwise::pow_tensor_scalar,
            "reciprocal" => pointwise::reciprocal,
            "maximum" => pointwise::maximum,
            "minimum" => pointwise::minimum,
            "sign" => pointwise::sign,
            "sigmoid" => pointwise::sigmoid,
            "tanh" => pointwise::tanh,
            "gelu" => activation::gelu,
            "gelu_backward" => activation::gelu_backward,
            "silu" => activation::silu,
            "sigmoid_backward" => activation::sigmoid_backward,
            "tanh_backward" => activation::tanh_backward,
            "hardtanh" => activation::hardtanh,
            "hardtanh_" => activation::hardtanh,
            "hardtanh_backward" => activation::hardtanh_backward,
            "leaky_relu" => activation::leaky_relu,
            "leaky_relu_backward" => activation::leaky_relu_backward,
            "masked_fill_.Scalar" => pointwise::masked_fill,
            "masked_fill_.Tensor" => pointwise::masked_fill,
            "bitwise_not" => pointwise::bitwise_not,
            "bitwise_and.Tensor" => pointwise::bitwise_and,
            "bitwise_or.Tensor" => pointwise::bitwise_or,
            "bitwise_xor.Tensor" => pointwise::bitwise_xor,
            "nan_to_num.out" => pointwise::nan_to_num_out,
            "softplus" => activation::softplus,
            "softplus_backward" => activation::softplus_backward,
            "prod" => reduction::prod,
            "prod.dim_int" => reduction::prod_dim,
            "linalg_vector_norm" => reduction::linalg_vector_norm,
            "_foreach_add_.Scalar" => optim::foreach_add_scalar,
            "_foreach_add_.List" => optim::foreach_add_list,
            "_foreach_mul_.Scalar" => optim::foreach_mul_scalar,
            "_foreach_lerp_.Scalar" => optim::foreach_lerp_scalar,
            "_foreach_addcmul_.Scalar" => optim::foreach_addcmul_scalar,
            // -- torch.amp.GradScaler --
            "_amp_foreach_non_finite_check_and_unscale_" => amp::non_finite_check_and_unscale,
            "_amp_update_scale_" => amp::update_scale,
            // Vision models (MobileNet-v3, DeepLabV3, Faster R-CNN, ViT)
            "hardswish" => vision_pointwise::hardswish,
            "hardswish_" => vision_pointwise::hardswish,
            "hardswish_backward" => vision_pointwise::hardswish_backward,
            "hardsigmoid" => vision_pointwise::hardsigmoid,
            "hardsigmoid_backward" => vision_pointwise::hardsigmoid_backward,
            "log_sigmoid_forward" => vision_pointwise::log_sigmoid_forward,
            "log_sigmoid_backward" => vision_pointwise::log_sigmoid_backward,
            "log2" => vision_pointwise::log2,
            "floor" => vision_pointwise::floor,
            "ceil" => vision_pointwise::ceil,
            "upsample_bilinear2d" => upsample::upsample_bilinear2d,
            "upsample_bilinear2d_backward" => upsample::upsample_bilinear2d_backward,
            "upsample_nearest2d" => upsample::upsample_nearest2d,
            "upsample_nearest2d_backward" => upsample::upsample_nearest2d_backward,
            "smooth_l1_loss" => smooth_l1::smooth_l1_loss,
            "smooth_l1_loss_backward" => smooth_l1::smooth_l1_loss_backward,
            "topk" => topk::topk,
            "index.Tensor" => index_put::index,
            "_index_put_impl_" => index_put::index_put_impl,
            "nonzero" => nonzero::nonzero [torchfl_ffi::TFL_OP_DYNAMIC_SHAPE],
            "masked_select" => nonzero::masked_select [torchfl_ffi::TFL_OP_DYNAMIC_SHAPE],
            "randperm.generator_out" => randperm::randperm [torchfl_ffi::TFL_OP_RANDOM],
            // Fused attention
            "_scaled_dot_product_fused_attention_overrideable" => attention::sdpa_forward [torchfl_ffi::TFL_OP_RANDOM],
            "_scaled_dot_product_fused_attention_overrideable_backward" => attention::sdpa_backward,
            // Language models
            "arange.start_out" => positional::arange_start_out,
            "tril" => positional::tril,
            "triu" => positional::triu,
            "flip" => positional::flip,
            "sin" => transcendental::sin,
            "cos" => transcendental::cos,
            "pow.Scalar" => transcendental::pow_scalar,
            "pow.Tensor_Tensor" => transcendental::pow_tensor_tensor,
            "floor_divide" => pointwise::floor_divide,
            "floor_divide_.Tensor" => pointwise::floor_divide,
            "div.Tensor_mode" => pointwise::div_mode,
            "remainder.Tensor" => pointwise::remainder,
            "cumsum" => scan::cumsum,
            "cumprod" => scan::cumprod,
            "sort.stable" => sort::sort_stable,
            "isin.Tensor_Tensor" => isin::isin_tensor_tensor,
            "isin.Tensor_Scalar" => isin::isin_tensor_scalar,
            "gather" => scatter::gather,
            "scatter.src" => scatter::scatter_src,
            "scatter.value" => scatter::scatter_value,
            "scatter_add" => scatter::scatter_add,
            "multinomial" => sampling::multinomial [torchfl_ffi::TFL_OP_RANDOM],
            "_fused_adam_" => fused_adam::fused_adam,
            "_fused_adam_.tensor_lr" => fused_adam::fused_adam,
            "_fused_adamw_" => fused_adam::fused_adamw,
            "_fused_adamw_.tensor_lr" => fused_adam::fused_adamw,
          ],
          custom: [
            // -- fused operators with backward kernels (see `fused`) --
            "sim::fused_bias_gelu" => fused::fused_bias_gelu {
                schema: "fused_bias_gelu(Tensor x, Tensor bias) -> Tensor",
                infer: fused::fused_bias_gelu_infer,
            },
            "sim::fused_bias_gelu_backward" => fused::fused_bias_gelu_backward {
                schema: "fused_bias_gelu_backward(Tensor grad, Tensor x, Tensor bias) -> (Tensor, Tensor)",
                infer: fused::fused_bias_gelu_backward_infer,
            },
            "sim::softmax_cross_entropy" => fused::softmax_cross_entropy {
                schema: "softmax_cross_entropy(Tensor logits, Tensor target) -> Tensor",
                infer: fused::softmax_cross_entropy_infer,
            },
            "sim::softmax_cross_entropy_backward" => fused::softmax_cross_entropy_backward {
                schema: "softmax_cross_entropy_backward(Tensor grad, Tensor logits, Tensor target) -> (Tensor, Tensor)",
                infer: fused::softmax_cross_entropy_backward_infer,
            },
          ],
          external: [
            // torchvision's detection operators (see `torchvision_ops`)
            "torchvision::nms" => torchvision_ops::nms {
                schema: "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            } [torchfl_ffi::TFL_OP_DYNAMIC_SHAPE],
            "torchvision::roi_align" => torchvision_ops::roi_align {
                schema: "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, \
                         SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
            },
            "torchvision::_roi_align_backward" => torchvision_ops::roi_align_backward {
                schema: "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, \
                         SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, \
                         int sampling_ratio, bool aligned) -> Tensor",
            },
          ],
        }
    };
}
pub(crate) use for_each_op;

macro_rules! define_ops {
    (
        aten: [$($name:literal => $kernel:path $([$_flags:expr])?),* $(,)?],
        custom: [$(
            $cname:literal => $ckernel:path {
                schema: $schema:literal,
                infer: $infer:path $(,)?
            } $([$_cflags:expr])?
        ),* $(,)?],
        external: [$(
            $ename:literal => $ekernel:path { schema: $eschema:literal $(,)? } $([$_eflags:expr])?
        ),* $(,)?] $(,)?
    ) => {
        /// Every operator, in table order: aten operators, custom ones,
        /// then other libraries' operators.
        pub(crate) static OPS: &[OpDef] = &[
            $(OpDef { name: $name, kernel: $kernel, schema: None, infer: None },)*
            $(OpDef { name: $cname, kernel: $ckernel, schema: Some($schema), infer: Some($infer) },)*
            $(OpDef { name: $ename, kernel: $ekernel, schema: Some($eschema), infer: None },)*
        ];
    };
}
for_each_op!(define_ops);

/// The operator named `name`.
pub(crate) fn find(name: &str) -> Option<&'static OpDef> {
    static INDEX: OnceLock<std::collections::HashMap<&'static str, usize>> = OnceLock::new();
    let index = INDEX.get_or_init(|| OPS.iter().enumerate().map(|(i, op)| (op.name, i)).collect());
    index.get(name).map(|&i| &OPS[i])
}

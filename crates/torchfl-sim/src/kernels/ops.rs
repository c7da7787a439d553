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
// issue 14: language models
use super::{fused_adam, isin, positional, sampling, scan, scatter, sort, transcendental};
use super::{ArgRef, Frame, KernelCtx, OutputMeta};
use crate::error::Result;
use crate::stream::Work;

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
/// - `aten`: ATen name, exported symbol, kernel, and optionally `[flags]`
///   (`TFL_OP_*`, e.g. `[torchfl_ffi::TFL_OP_RANDOM]`);
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
/// [`crate::abi`] expands it into `#[no_mangle]` exports and the
/// `TFL_OpEntry` table (aten entries first, external ones last), and this
/// module into [`OPS`] in the same order. The ABI layer checks at compile time that each
/// schema declares its operator, and its unit tests that each symbol is the
/// mangling of its name (`torchfl_ffi::kernel_symbol`).
macro_rules! for_each_op {
    ($m:ident) => {
        $m! {
          aten: [
            "fill_.Scalar" => torch_fl_op_fill__Scalar: pointwise::fill_scalar,
            "zero_" => torch_fl_op_zero_: pointwise::zero,
            "copy_" => torch_fl_op_copy_: pointwise::copy,
            "add.Tensor" => torch_fl_op_add_Tensor: pointwise::add_tensor,
            "add_.Tensor" => torch_fl_op_add__Tensor: pointwise::add_tensor,
            "add.Scalar" => torch_fl_op_add_Scalar: pointwise::add_scalar,
            "add_.Scalar" => torch_fl_op_add__Scalar: pointwise::add_scalar,
            "sub.Tensor" => torch_fl_op_sub_Tensor: pointwise::sub_tensor,
            "sub_.Tensor" => torch_fl_op_sub__Tensor: pointwise::sub_tensor,
            "sub.Scalar" => torch_fl_op_sub_Scalar: pointwise::sub_scalar,
            "sub_.Scalar" => torch_fl_op_sub__Scalar: pointwise::sub_scalar,
            "mul.Tensor" => torch_fl_op_mul_Tensor: pointwise::mul_tensor,
            "mul_.Tensor" => torch_fl_op_mul__Tensor: pointwise::mul_tensor,
            "mul.Scalar" => torch_fl_op_mul_Scalar: pointwise::mul_scalar,
            "mul_.Scalar" => torch_fl_op_mul__Scalar: pointwise::mul_scalar,
            "div.Tensor" => torch_fl_op_div_Tensor: pointwise::div_tensor,
            "div_.Tensor" => torch_fl_op_div__Tensor: pointwise::div_tensor,
            "div.Scalar" => torch_fl_op_div_Scalar: pointwise::div_scalar,
            "div_.Scalar" => torch_fl_op_div__Scalar: pointwise::div_scalar,
            "neg" => torch_fl_op_neg: pointwise::neg,
            "neg_" => torch_fl_op_neg_: pointwise::neg,
            "relu" => torch_fl_op_relu: pointwise::relu,
            "relu_" => torch_fl_op_relu_: pointwise::relu,
            "eq.Tensor" => torch_fl_op_eq_Tensor: pointwise::eq,
            "eq.Scalar" => torch_fl_op_eq_Scalar: pointwise::eq,
            "ne.Tensor" => torch_fl_op_ne_Tensor: pointwise::ne,
            "ne.Scalar" => torch_fl_op_ne_Scalar: pointwise::ne,
            "lt.Tensor" => torch_fl_op_lt_Tensor: pointwise::lt,
            "lt.Scalar" => torch_fl_op_lt_Scalar: pointwise::lt,
            "le.Tensor" => torch_fl_op_le_Tensor: pointwise::le,
            "le.Scalar" => torch_fl_op_le_Scalar: pointwise::le,
            "gt.Tensor" => torch_fl_op_gt_Tensor: pointwise::gt,
            "gt.Scalar" => torch_fl_op_gt_Scalar: pointwise::gt,
            "ge.Tensor" => torch_fl_op_ge_Tensor: pointwise::ge,
            "ge.Scalar" => torch_fl_op_ge_Scalar: pointwise::ge,
            "sum" => torch_fl_op_sum: reduction::sum,
            "sum.dim_IntList" => torch_fl_op_sum_dim_IntList: reduction::sum_dim,
            "mean.dim" => torch_fl_op_mean_dim: reduction::mean_dim,
            "mm" => torch_fl_op_mm: linalg::mm,
            // -- convolution, normalization, pooling, matrix products --
            "convolution" => torch_fl_op_convolution: conv::convolution,
            "convolution_backward" => torch_fl_op_convolution_backward: conv::convolution_backward,
            "native_batch_norm" => torch_fl_op_native_batch_norm: norm::native_batch_norm,
            "_native_batch_norm_legit.no_stats" => torch_fl_op__native_batch_norm_legit_no_stats: norm::native_batch_norm_legit_no_stats,
            "_native_batch_norm_legit_no_training" => torch_fl_op__native_batch_norm_legit_no_training: norm::native_batch_norm_legit_no_training,
            "native_batch_norm_backward" => torch_fl_op_native_batch_norm_backward: norm::native_batch_norm_backward,
            "native_layer_norm" => torch_fl_op_native_layer_norm: norm::native_layer_norm,
            "native_layer_norm_backward" => torch_fl_op_native_layer_norm_backward: norm::native_layer_norm_backward,
            "max_pool2d_with_indices" => torch_fl_op_max_pool2d_with_indices: pool::max_pool2d_with_indices,
            "max_pool2d_with_indices_backward" => torch_fl_op_max_pool2d_with_indices_backward: pool::max_pool2d_with_indices_backward,
            "avg_pool2d" => torch_fl_op_avg_pool2d: pool::avg_pool2d,
            "avg_pool2d_backward" => torch_fl_op_avg_pool2d_backward: pool::avg_pool2d_backward,
            "_adaptive_avg_pool2d" => torch_fl_op__adaptive_avg_pool2d: pool::adaptive_avg_pool2d,
            "_adaptive_avg_pool2d_backward" => torch_fl_op__adaptive_avg_pool2d_backward: pool::adaptive_avg_pool2d_backward,
            "addmm" => torch_fl_op_addmm: linalg::addmm,
            "bmm" => torch_fl_op_bmm: linalg::bmm,
            "baddbmm" => torch_fl_op_baddbmm: linalg::baddbmm,
            "threshold_backward" => torch_fl_op_threshold_backward: threshold::threshold_backward,
            // -- activations, softmax, losses, indexing, random, optimizers --
            "_softmax" => torch_fl_op__softmax: softmax::softmax,
            "_log_softmax" => torch_fl_op__log_softmax: softmax::log_softmax,
            "_softmax_backward_data" => torch_fl_op__softmax_backward_data: softmax::softmax_backward_data,
            "_log_softmax_backward_data" => torch_fl_op__log_softmax_backward_data: softmax::log_softmax_backward_data,
            "nll_loss_forward" => torch_fl_op_nll_loss_forward: loss::nll_loss_forward,
            "nll_loss_backward" => torch_fl_op_nll_loss_backward: loss::nll_loss_backward,
            "nll_loss2d_forward" => torch_fl_op_nll_loss2d_forward: loss::nll_loss2d_forward,
            "nll_loss2d_backward" => torch_fl_op_nll_loss2d_backward: loss::nll_loss2d_backward,
            "native_dropout" => torch_fl_op_native_dropout: random::native_dropout [torchfl_ffi::TFL_OP_RANDOM],
            "native_dropout_backward" => torch_fl_op_native_dropout_backward: random::native_dropout_backward,
            "uniform_" => torch_fl_op_uniform_: random::uniform [torchfl_ffi::TFL_OP_RANDOM],
            "normal_" => torch_fl_op_normal_: random::normal_ [torchfl_ffi::TFL_OP_RANDOM],
            "bernoulli_.float" => torch_fl_op_bernoulli__float: random::bernoulli_float [torchfl_ffi::TFL_OP_RANDOM],
            "bernoulli_.Tensor" => torch_fl_op_bernoulli__Tensor: random::bernoulli_tensor [torchfl_ffi::TFL_OP_RANDOM],
            "random_" => torch_fl_op_random_: random::random [torchfl_ffi::TFL_OP_RANDOM],
            "random_.from" => torch_fl_op_random__from: random::random_from [torchfl_ffi::TFL_OP_RANDOM],
            "random_.to" => torch_fl_op_random__to: random::random_to [torchfl_ffi::TFL_OP_RANDOM],
            "index_select" => torch_fl_op_index_select: indexing::index_select,
            "cat" => torch_fl_op_cat: indexing::cat,
            "embedding_dense_backward" => torch_fl_op_embedding_dense_backward: indexing::embedding_dense_backward,
            "where.self" => torch_fl_op_where_self: pointwise::where_self,
            "where.self_out" => torch_fl_op_where_self_out: pointwise::where_self,
            "argmax" => torch_fl_op_argmax: reduction::argmax,
            "argmin" => torch_fl_op_argmin: reduction::argmin,
            "max.dim" => torch_fl_op_max_dim: reduction::max_dim,
            "min.dim" => torch_fl_op_min_dim: reduction::min_dim,
            "max" => torch_fl_op_max: reduction::max_all,
            "min" => torch_fl_op_min: reduction::min_all,
            "amax" => torch_fl_op_amax: reduction::amax,
            "amin" => torch_fl_op_amin: reduction::amin,
            "all" => torch_fl_op_all: reduction::all,
            "all.dim" => torch_fl_op_all_dim: reduction::all,
            "all.dims" => torch_fl_op_all_dims: reduction::all,
            "any" => torch_fl_op_any: reduction::any,
            "any.dim" => torch_fl_op_any_dim: reduction::any,
            "any.dims" => torch_fl_op_any_dims: reduction::any,
            "isnan" => torch_fl_op_isnan: pointwise::isnan,
            "isposinf" => torch_fl_op_isposinf: pointwise::isposinf,
            "isneginf" => torch_fl_op_isneginf: pointwise::isneginf,
            "logical_not.out" => torch_fl_op_logical_not_out: pointwise::logical_not_out,
            "logical_and.out" => torch_fl_op_logical_and_out: pointwise::logical_and_out,
            "logical_or.out" => torch_fl_op_logical_or_out: pointwise::logical_or_out,
            "clamp" => torch_fl_op_clamp: pointwise::clamp,
            "clamp.Tensor" => torch_fl_op_clamp_Tensor: pointwise::clamp,
            "clamp_min" => torch_fl_op_clamp_min: pointwise::clamp_min,
            "clamp_min.Tensor" => torch_fl_op_clamp_min_Tensor: pointwise::clamp_min,
            "clamp_max" => torch_fl_op_clamp_max: pointwise::clamp_max,
            "clamp_max.Tensor" => torch_fl_op_clamp_max_Tensor: pointwise::clamp_max,
            "addcmul" => torch_fl_op_addcmul: pointwise::addcmul,
            "addcdiv" => torch_fl_op_addcdiv: pointwise::addcdiv,
            "lerp.Scalar" => torch_fl_op_lerp_Scalar: pointwise::lerp,
            "lerp.Tensor" => torch_fl_op_lerp_Tensor: pointwise::lerp,
            "sqrt" => torch_fl_op_sqrt: pointwise::sqrt,
            "rsqrt" => torch_fl_op_rsqrt: pointwise::rsqrt,
            "abs.out" => torch_fl_op_abs_out: pointwise::abs,
            "exp" => torch_fl_op_exp: pointwise::exp,
            "log" => torch_fl_op_log: pointwise::log,
            "pow.Tensor_Scalar" => torch_fl_op_pow_Tensor_Scalar: pointwise::pow_tensor_scalar,
            "reciprocal" => torch_fl_op_reciprocal: pointwise::reciprocal,
            "maximum" => torch_fl_op_maximum: pointwise::maximum,
            "minimum" => torch_fl_op_minimum: pointwise::minimum,
            "sign" => torch_fl_op_sign: pointwise::sign,
            "sigmoid" => torch_fl_op_sigmoid: pointwise::sigmoid,
            "tanh" => torch_fl_op_tanh: pointwise::tanh,
            "gelu" => torch_fl_op_gelu: activation::gelu,
            "gelu_backward" => torch_fl_op_gelu_backward: activation::gelu_backward,
            "silu" => torch_fl_op_silu: activation::silu,
            "sigmoid_backward" => torch_fl_op_sigmoid_backward: activation::sigmoid_backward,
            "tanh_backward" => torch_fl_op_tanh_backward: activation::tanh_backward,
            "hardtanh" => torch_fl_op_hardtanh: activation::hardtanh,
            "hardtanh_" => torch_fl_op_hardtanh_: activation::hardtanh,
            "hardtanh_backward" => torch_fl_op_hardtanh_backward: activation::hardtanh_backward,
            "leaky_relu" => torch_fl_op_leaky_relu: activation::leaky_relu,
            "leaky_relu_backward" => torch_fl_op_leaky_relu_backward: activation::leaky_relu_backward,
            "masked_fill_.Scalar" => torch_fl_op_masked_fill__Scalar: pointwise::masked_fill,
            "masked_fill_.Tensor" => torch_fl_op_masked_fill__Tensor: pointwise::masked_fill,
            "bitwise_not" => torch_fl_op_bitwise_not: pointwise::bitwise_not,
            "bitwise_and.Tensor" => torch_fl_op_bitwise_and_Tensor: pointwise::bitwise_and,
            "bitwise_or.Tensor" => torch_fl_op_bitwise_or_Tensor: pointwise::bitwise_or,
            "bitwise_xor.Tensor" => torch_fl_op_bitwise_xor_Tensor: pointwise::bitwise_xor,
            "nan_to_num.out" => torch_fl_op_nan_to_num_out: pointwise::nan_to_num_out,
            "softplus" => torch_fl_op_softplus: activation::softplus,
            "softplus_backward" => torch_fl_op_softplus_backward: activation::softplus_backward,
            "prod" => torch_fl_op_prod: reduction::prod,
            "prod.dim_int" => torch_fl_op_prod_dim_int: reduction::prod_dim,
            "linalg_vector_norm" => torch_fl_op_linalg_vector_norm: reduction::linalg_vector_norm,
            "_foreach_add_.Scalar" => torch_fl_op__foreach_add__Scalar: optim::foreach_add_scalar,
            "_foreach_add_.List" => torch_fl_op__foreach_add__List: optim::foreach_add_list,
            "_foreach_mul_.Scalar" => torch_fl_op__foreach_mul__Scalar: optim::foreach_mul_scalar,
            "_foreach_lerp_.Scalar" => torch_fl_op__foreach_lerp__Scalar: optim::foreach_lerp_scalar,
            "_foreach_addcmul_.Scalar" => torch_fl_op__foreach_addcmul__Scalar: optim::foreach_addcmul_scalar,
            // -- torch.amp.GradScaler --
            "_amp_foreach_non_finite_check_and_unscale_" => torch_fl_op__amp_foreach_non_finite_check_and_unscale_: amp::non_finite_check_and_unscale,
            "_amp_update_scale_" => torch_fl_op__amp_update_scale_: amp::update_scale,
            // issue 14: vision models (MobileNet-v3, DeepLabV3, Faster R-CNN, ViT)
            "hardswish" => torch_fl_op_hardswish: vision_pointwise::hardswish,
            "hardswish_" => torch_fl_op_hardswish_: vision_pointwise::hardswish,
            "hardswish_backward" => torch_fl_op_hardswish_backward: vision_pointwise::hardswish_backward,
            "hardsigmoid" => torch_fl_op_hardsigmoid: vision_pointwise::hardsigmoid,
            "hardsigmoid_backward" => torch_fl_op_hardsigmoid_backward: vision_pointwise::hardsigmoid_backward,
            "log_sigmoid_forward" => torch_fl_op_log_sigmoid_forward: vision_pointwise::log_sigmoid_forward,
            "log_sigmoid_backward" => torch_fl_op_log_sigmoid_backward: vision_pointwise::log_sigmoid_backward,
            "log2" => torch_fl_op_log2: vision_pointwise::log2,
            "floor" => torch_fl_op_floor: vision_pointwise::floor,
            "ceil" => torch_fl_op_ceil: vision_pointwise::ceil,
            "upsample_bilinear2d" => torch_fl_op_upsample_bilinear2d: upsample::upsample_bilinear2d,
            "upsample_bilinear2d_backward" => torch_fl_op_upsample_bilinear2d_backward: upsample::upsample_bilinear2d_backward,
            "upsample_nearest2d" => torch_fl_op_upsample_nearest2d: upsample::upsample_nearest2d,
            "upsample_nearest2d_backward" => torch_fl_op_upsample_nearest2d_backward: upsample::upsample_nearest2d_backward,
            "smooth_l1_loss" => torch_fl_op_smooth_l1_loss: smooth_l1::smooth_l1_loss,
            "smooth_l1_loss_backward" => torch_fl_op_smooth_l1_loss_backward: smooth_l1::smooth_l1_loss_backward,
            "topk" => torch_fl_op_topk: topk::topk,
            "index.Tensor" => torch_fl_op_index_Tensor: index_put::index,
            "_index_put_impl_" => torch_fl_op__index_put_impl_: index_put::index_put_impl,
            "nonzero" => torch_fl_op_nonzero: nonzero::nonzero [torchfl_ffi::TFL_OP_DYNAMIC_SHAPE],
            "masked_select" => torch_fl_op_masked_select: nonzero::masked_select [torchfl_ffi::TFL_OP_DYNAMIC_SHAPE],
            "randperm.generator_out" => torch_fl_op_randperm_generator_out: randperm::randperm [torchfl_ffi::TFL_OP_RANDOM],
            // issue 14: fused attention
            "_scaled_dot_product_fused_attention_overrideable" => torch_fl_op__scaled_dot_product_fused_attention_overrideable: attention::sdpa_forward [torchfl_ffi::TFL_OP_RANDOM],
            "_scaled_dot_product_fused_attention_overrideable_backward" => torch_fl_op__scaled_dot_product_fused_attention_overrideable_backward: attention::sdpa_backward,
            // issue 14: language models
            "arange.start_out" => torch_fl_op_arange_start_out: positional::arange_start_out,
            "tril" => torch_fl_op_tril: positional::tril,
            "triu" => torch_fl_op_triu: positional::triu,
            "flip" => torch_fl_op_flip: positional::flip,
            "sin" => torch_fl_op_sin: transcendental::sin,
            "cos" => torch_fl_op_cos: transcendental::cos,
            "pow.Scalar" => torch_fl_op_pow_Scalar: transcendental::pow_scalar,
            "pow.Tensor_Tensor" => torch_fl_op_pow_Tensor_Tensor: transcendental::pow_tensor_tensor,
            "floor_divide" => torch_fl_op_floor_divide: pointwise::floor_divide,
            "floor_divide_.Tensor" => torch_fl_op_floor_divide__Tensor: pointwise::floor_divide,
            "div.Tensor_mode" => torch_fl_op_div_Tensor_mode: pointwise::div_mode,
            "remainder.Tensor" => torch_fl_op_remainder_Tensor: pointwise::remainder,
            "cumsum" => torch_fl_op_cumsum: scan::cumsum,
            "cumprod" => torch_fl_op_cumprod: scan::cumprod,
            "sort.stable" => torch_fl_op_sort_stable: sort::sort_stable,
            "isin.Tensor_Tensor" => torch_fl_op_isin_Tensor_Tensor: isin::isin_tensor_tensor,
            "isin.Tensor_Scalar" => torch_fl_op_isin_Tensor_Scalar: isin::isin_tensor_scalar,
            "gather" => torch_fl_op_gather: scatter::gather,
            "scatter.src" => torch_fl_op_scatter_src: scatter::scatter_src,
            "scatter.value" => torch_fl_op_scatter_value: scatter::scatter_value,
            "scatter_add" => torch_fl_op_scatter_add: scatter::scatter_add,
            "multinomial" => torch_fl_op_multinomial: sampling::multinomial [torchfl_ffi::TFL_OP_RANDOM],
            "_fused_adam_" => torch_fl_op__fused_adam_: fused_adam::fused_adam,
            "_fused_adam_.tensor_lr" => torch_fl_op__fused_adam__tensor_lr: fused_adam::fused_adam,
            "_fused_adamw_" => torch_fl_op__fused_adamw_: fused_adam::fused_adamw,
            "_fused_adamw_.tensor_lr" => torch_fl_op__fused_adamw__tensor_lr: fused_adam::fused_adamw,
          ],
          custom: [
            // -- fused operators with backward kernels (see `fused`) --
            "sim::fused_bias_gelu" => torch_fl_op_sim__fused_bias_gelu: fused::fused_bias_gelu {
                schema: "fused_bias_gelu(Tensor x, Tensor bias) -> Tensor",
                infer: fused::fused_bias_gelu_infer,
            },
            "sim::fused_bias_gelu_backward" => torch_fl_op_sim__fused_bias_gelu_backward: fused::fused_bias_gelu_backward {
                schema: "fused_bias_gelu_backward(Tensor grad, Tensor x, Tensor bias) -> (Tensor, Tensor)",
                infer: fused::fused_bias_gelu_backward_infer,
            },
            "sim::softmax_cross_entropy" => torch_fl_op_sim__softmax_cross_entropy: fused::softmax_cross_entropy {
                schema: "softmax_cross_entropy(Tensor logits, Tensor target) -> Tensor",
                infer: fused::softmax_cross_entropy_infer,
            },
            "sim::softmax_cross_entropy_backward" => torch_fl_op_sim__softmax_cross_entropy_backward: fused::softmax_cross_entropy_backward {
                schema: "softmax_cross_entropy_backward(Tensor grad, Tensor logits, Tensor target) -> (Tensor, Tensor)",
                infer: fused::softmax_cross_entropy_backward_infer,
            },
          ],
          external: [
            // torchvision's detection operators (see `torchvision_ops`)
            "torchvision::nms" => torch_fl_op_torchvision__nms: torchvision_ops::nms {
                schema: "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            } [torchfl_ffi::TFL_OP_DYNAMIC_SHAPE],
            "torchvision::roi_align" => torch_fl_op_torchvision__roi_align: torchvision_ops::roi_align {
                schema: "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, \
                         SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
            },
            "torchvision::_roi_align_backward" => torch_fl_op_torchvision___roi_align_backward: torchvision_ops::roi_align_backward {
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
        aten: [$($name:literal => $sym:ident : $kernel:path $([$_flags:expr])?),* $(,)?],
        custom: [$(
            $cname:literal => $csym:ident : $ckernel:path {
                schema: $schema:literal,
                infer: $infer:path $(,)?
            } $([$_cflags:expr])?
        ),* $(,)?],
        external: [$(
            $ename:literal => $esym:ident : $ekernel:path { schema: $eschema:literal $(,)? } $([$_eflags:expr])?
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

//! Operator kernels.
//!
//! A kernel is a plain Rust function `fn(&KernelCtx, &Frame) ->
//! Result<Option<Work>>`, where a `Frame` is a [`Call`] whose contents are
//! borrowed (from the host's `TFL_CallFrame`, valid for the call, or from a
//! `Call`), so that a launch copies nothing it does not keep. It validates
//! its call *synchronously* (argument count and kinds, dtypes, shapes, that
//! every device pointer lies inside a live allocation of the right device)
//! and returns a closure that owns copies of everything it needs; the
//! runtime enqueues that closure on the call's stream. Nothing a kernel returns refers to the call frame, which
//! is gone when the closure runs, and device memory stays valid because
//! deallocation is stream-ordered ([`crate::memory`]).
//!
//! The layers, bottom up:
//! - [`dtype`]: element types, conversions, type promotion;
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
//! - custom operators of the `sim::` namespace, in `fused` (bias + GELU
//!   and softmax + cross-entropy, each with its backward): the worked
//!   example of a vendor's own fused kernels, with the schema and infer
//!   function the ABI asks of operators PyTorch does not know.

use std::borrow::Cow;
use std::fmt;
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::runtime::{Runtime, StreamHandle};
use crate::small::{Dims, SmallVec};
use crate::stream::Work;

pub(crate) mod activation;
pub(crate) mod amp;
pub(crate) mod conv;
pub(crate) mod dtype;
pub(crate) mod elementwise;
pub(crate) mod fused;
pub(crate) mod indexing;
pub(crate) mod linalg;
pub(crate) mod loss;
pub(crate) mod norm;
pub(crate) mod optim;
pub(crate) mod pointwise;
pub(crate) mod pool;
pub(crate) mod random;
pub(crate) mod reduce;
pub(crate) mod reduction;
pub(crate) mod softmax;
pub(crate) mod threshold;
pub(crate) mod view;

pub use dtype::DType;
use dtype::{Category, Element, Participant};
use view::TensorView;

/// A PyTorch `Scalar` (an untyped number).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// `True`/`False`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
}

impl Scalar {
    pub(crate) fn category(self) -> Category {
        match self {
            Scalar::Bool(_) => Category::Bool,
            Scalar::Int(_) => Category::Integral,
            Scalar::Float(_) => Category::Floating,
        }
    }
    /// Converts with `static_cast` semantics (a tensor value, no checks).
    pub(crate) fn cast<T: Element>(self) -> T {
        match self {
            Scalar::Bool(b) => T::from_bool(b),
            Scalar::Int(i) => dtype::cast::<i64, T>(i),
            Scalar::Float(f) => dtype::cast::<f64, T>(f),
        }
    }
    fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => f64::from(u8::from(b)),
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }
}

/// Where a tensor argument's data lives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TensorData {
    /// Device memory: `ptr` as returned by `allocate` (tagged in strict
    /// mode), the first element at `ptr + byte_offset`.
    Device {
        /// The device the memory belongs to.
        device: usize,
        /// The allocation's pointer (or a pointer into it).
        ptr: u64,
        /// Offset of the first element, in bytes.
        byte_offset: u64,
    },
    /// A 0-dim CPU tensor, read when the kernel was called.
    Host(Scalar),
    /// A Python number PyTorch wrapped into a 0-dim CPU tensor
    /// (`TFL_TENSOR_WRAPPED_NUMBER`): only its category counts for type
    /// promotion.
    WrappedNumber(Scalar),
    /// No data: a tensor of an `infer_outputs` frame, where only dtype,
    /// shape and strides are meaningful. Kernels refuse it.
    Meta,
}

/// A tensor argument or output: dtype, shape, strides (in elements) and data.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorArg {
    /// Element type.
    pub dtype: DType,
    /// Sizes, outermost first.
    pub shape: Vec<i64>,
    /// Strides in elements, one per dimension; may be 0 or negative.
    pub strides: Vec<i64>,
    /// The data.
    pub data: TensorData,
}

impl TensorArg {
    /// A contiguous device tensor at `ptr` on `device`.
    pub fn contiguous(dtype: DType, shape: &[i64], device: usize, ptr: u64) -> Self {
        let mut strides = vec![0i64; shape.len()];
        let mut s = 1i64;
        for d in (0..shape.len()).rev() {
            strides[d] = s;
            s *= shape[d].max(1);
        }
        Self {
            dtype,
            shape: shape.to_vec(),
            strides,
            data: TensorData::Device { device, ptr, byte_offset: 0 },
        }
    }
    /// A 0-dim host tensor holding `value`.
    pub fn host_scalar(dtype: DType, value: Scalar) -> Self {
        Self { dtype, shape: Vec::new(), strides: Vec::new(), data: TensorData::Host(value) }
    }
}

/// One argument of an operator call (`TFL_Value`).
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// An absent optional.
    None,
    /// `Tensor`.
    Tensor(TensorArg),
    /// `Tensor[]` / `Tensor?[]`.
    TensorList(Vec<Option<TensorArg>>),
    /// `int`, `SymInt`, `ScalarType`, ...
    Int(i64),
    /// `float`.
    Float(f64),
    /// `bool`.
    Bool(bool),
    /// `Scalar`.
    Scalar(Scalar),
    /// `int[]`.
    IntList(Vec<i64>),
    /// `float[]`.
    FloatList(Vec<f64>),
    /// `bool[N]`.
    BoolList(Vec<bool>),
    /// `str`.
    Str(String),
}

/// An operator call (`TFL_CallFrame`), owned.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The ATen operator name for messages (`"add.Tensor"`); empty: the
    /// table's name.
    pub op_name: String,
    /// The device the kernel runs on.
    pub device: usize,
    /// The stream to run on.
    pub stream: StreamHandle,
    /// Arguments in schema order, out= arguments excluded.
    pub args: Vec<Arg>,
    /// Pre-allocated outputs; for in-place ops `outputs[0]` is `self`.
    pub outputs: Vec<TensorArg>,
    /// Random operators: the Philox-style counter base (`TFL_CallFrame`'s
    /// `rng_seed` and `rng_offset`) the host's generator reserved for this
    /// call; 0 for other operators.
    pub rng: Rng,
}

/// The random state of one call (`rng_seed`, `rng_offset`): a random
/// kernel's output is a pure function of it, the element index and the
/// operator, which is what makes `torch.manual_seed` reproduce a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rng {
    /// The generator's seed.
    pub seed: u64,
    /// The first counter value reserved for this call.
    pub offset: u64,
}

/// A tensor argument borrowed for the duration of one launch: the ABI layer
/// points `shape` and `strides` straight at the host's arrays (valid for
/// the call), the Rust API at a [`TensorArg`]'s vectors. Kernels copy what
/// their work needs into [`view::TensorView`]s, so nothing borrowed
/// outlives the launch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorRef<'a> {
    pub(crate) dtype: DType,
    pub(crate) shape: &'a [i64],
    pub(crate) strides: &'a [i64],
    pub(crate) data: TensorData,
}

impl Default for TensorRef<'_> {
    fn default() -> Self {
        Self { dtype: DType::Float32, shape: &[], strides: &[], data: TensorData::Host(Scalar::Int(0)) }
    }
}

impl TensorArg {
    /// The borrowed form kernels consume.
    pub(crate) fn to_ref(&self) -> TensorRef<'_> {
        TensorRef { dtype: self.dtype, shape: &self.shape, strides: &self.strides, data: self.data }
    }
}

/// One argument of a launch, borrowed where the source allows it (see
/// [`TensorRef`]); the owned variants come from conversions the ABI layer
/// has to make anyway (`bool` lists, lossy strings).
///
/// No current kernel reads float or bool lists or strings; they are
/// decoded (and validated) all the same, and kept for the kernels that
/// will.
#[derive(Debug, Clone, Default)]
#[allow(dead_code)]
pub(crate) enum ArgRef<'a> {
    #[default]
    None,
    Tensor(TensorRef<'a>),
    TensorList(Vec<Option<TensorRef<'a>>>),
    Int(i64),
    Float(f64),
    Bool(bool),
    Scalar(Scalar),
    IntList(&'a [i64]),
    FloatList(&'a [f64]),
    BoolList(Cow<'a, [bool]>),
    Str(Cow<'a, str>),
}

impl Arg {
    /// The borrowed form kernels consume.
    pub(crate) fn to_ref(&self) -> ArgRef<'_> {
        match self {
            Arg::None => ArgRef::None,
            Arg::Tensor(t) => ArgRef::Tensor(t.to_ref()),
            Arg::TensorList(l) => {
                ArgRef::TensorList(l.iter().map(|t| t.as_ref().map(TensorArg::to_ref)).collect())
            }
            Arg::Int(v) => ArgRef::Int(*v),
            Arg::Float(v) => ArgRef::Float(*v),
            Arg::Bool(v) => ArgRef::Bool(*v),
            Arg::Scalar(v) => ArgRef::Scalar(*v),
            Arg::IntList(v) => ArgRef::IntList(v),
            Arg::FloatList(v) => ArgRef::FloatList(v),
            Arg::BoolList(v) => ArgRef::BoolList(Cow::Borrowed(v)),
            Arg::Str(v) => ArgRef::Str(Cow::Borrowed(v)),
        }
    }
}

/// Argument lists of a launch; most schemas have at most six.
pub(crate) type ArgList<'a> = SmallVec<ArgRef<'a>, 6>;
/// Output lists of a launch.
pub(crate) type OutputList<'a> = SmallVec<TensorRef<'a>, 2>;

/// A launch as kernels see it: [`Call`] with borrowed contents.
#[derive(Debug)]
pub(crate) struct Frame<'a> {
    /// The operator name for messages (never empty).
    pub(crate) op_name: &'a str,
    pub(crate) device: usize,
    pub(crate) stream: StreamHandle,
    pub(crate) args: &'a [ArgRef<'a>],
    pub(crate) outputs: &'a [TensorRef<'a>],
    /// Meaningful only for operators flagged [`TFL_OP_RANDOM`](torchfl_ffi::TFL_OP_RANDOM).
    pub(crate) rng: Rng,
}

/// A kernel: validates, then returns the work to enqueue (`None`: nothing
/// to do, e.g. an empty tensor).
pub(crate) type KernelFn = fn(&KernelCtx<'_>, &Frame<'_>) -> Result<Option<Work>>;

/// The dtype and shape of one output of a call, as an operator's infer
/// function computes them without running it (`TFL_OutputMeta`). The host
/// allocates the output contiguous with this metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputMeta {
    /// Element type.
    pub dtype: DType,
    /// Sizes, outermost first (empty for a 0-dim tensor).
    pub shape: Vec<i64>,
}

/// An infer function (`TFL_OpEntry.infer_outputs`) of a custom operator:
/// the dtypes and shapes of its outputs, one per schema return, from its
/// arguments alone. `op` names the operator in messages. Tensors carry
/// dtype, shape and strides only (their data is [`TensorData::Meta`] when
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

/// The single list of operators, in two groups:
///
/// - `aten`: ATen name, exported symbol, kernel, and optionally `[flags]`
///   (`TFL_OP_*`, e.g. `[torchfl_ffi::TFL_OP_RANDOM]`);
/// - `custom`: operators of the plugin's own namespace (`sim::`), which
///   PyTorch knows nothing about, so each also carries its schema (without
///   the namespace) and the function that infers its outputs' dtypes and
///   shapes (`TFL_OpEntry.schema` and `.infer_outputs`), then optional
///   `[flags]`.
///
/// [`crate::abi`] expands it into `#[no_mangle]` exports and the
/// `TFL_OpEntry` table (aten entries first), and this module into [`OPS`]
/// in the same order; the ABI layer checks at compile time that each
/// symbol is the mangling of its name and that each schema declares its
/// operator.
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
        ),* $(,)?] $(,)?
    ) => {
        /// Every operator, in table order: aten operators, then custom ones.
        pub(crate) static OPS: &[OpDef] = &[
            $(OpDef { name: $name, kernel: $kernel, schema: None, infer: None },)*
            $(OpDef { name: $cname, kernel: $ckernel, schema: Some($schema), infer: Some($infer) },)*
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

/// An input operand after validation.
#[derive(Debug, Clone)]
pub(crate) enum Operand {
    /// Device memory.
    View(TensorView),
    /// A 0-dim host tensor: its dtype, its value, and whether it is a
    /// wrapped Python number.
    Host(DType, Scalar, bool),
}

impl Operand {
    pub(crate) fn dtype(&self) -> DType {
        match self {
            Operand::View(v) => v.dtype(),
            Operand::Host(d, ..) => *d,
        }
    }
    pub(crate) fn shape(&self) -> &[usize] {
        match self {
            Operand::View(v) => v.shape(),
            Operand::Host(..) => &[],
        }
    }
    pub(crate) fn participant(&self) -> Participant {
        if let Operand::Host(_, value, true) = self {
            Participant::Wrapped(value.category())
        } else if self.shape().is_empty() {
            Participant::ZeroDim(self.dtype())
        } else {
            Participant::Dimensioned(self.dtype())
        }
    }
}

/// What a kernel knows about the call besides its arguments: the runtime
/// (for memory validation), the device and the operator name for messages.
pub(crate) struct KernelCtx<'a> {
    rt: &'a Runtime,
    device: usize,
    op: &'a str,
}

/// `"{op}: {role}"`, formatted only when an error message needs it.
struct OpRole<'a> {
    op: &'a str,
    role: &'a str,
}

impl fmt::Display for OpRole<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.role)
    }
}

impl<'a> KernelCtx<'a> {
    pub(crate) fn new(rt: &'a Runtime, device: usize, op: &'a str) -> Self {
        Self { rt, device, op }
    }

    /// The operator name used in messages.
    pub(crate) fn op(&self) -> &'a str {
        self.op
    }

    /// `INVALID_ARGUMENT` naming the operator.
    pub(crate) fn invalid(&self, message: impl std::fmt::Display) -> Error {
        Error::invalid(format!("sim: {}: {message}", self.op))
    }

    /// `UNIMPLEMENTED` naming the operator (the host falls back to CPU).
    pub(crate) fn unimplemented(&self, message: impl std::fmt::Display) -> Error {
        Error::unimplemented(format!("sim: {}: {message}", self.op))
    }

    /// Validates a tensor argument: shape, strides and, for device memory,
    /// that every element lies in a live allocation of its device.
    /// `any_device` allows another device of this plugin (`copy_`).
    #[inline(always)]
    fn operand_impl(&self, t: &TensorRef<'_>, role: &str, any_device: bool) -> Result<Operand> {
        if t.shape.len() != t.strides.len() {
            return Err(self.invalid(format!(
                "{role}: {} sizes but {} strides",
                t.shape.len(),
                t.strides.len()
            )));
        }
        let mut shape: Dims<usize> = Dims::from_elem(0, t.shape.len());
        let mut strides: Dims<isize> = Dims::from_elem(0, t.strides.len());
        let (mut negative, mut out_of_range) = (false, false);
        for (d, (&size, &stride)) in t.shape.iter().zip(t.strides).enumerate() {
            negative |= size < 0;
            shape[d] = size as usize;
            let s = isize::try_from(stride);
            out_of_range |= s.is_err();
            strides[d] = s.unwrap_or(0);
        }
        if negative {
            return Err(self.invalid(format!("{role}: negative size in {:?}", t.shape)));
        }
        if out_of_range {
            return Err(self.invalid(format!("{role}: stride out of range")));
        }
        match t.data {
            TensorData::Host(value) | TensorData::WrappedNumber(value) => {
                if !shape.is_empty() {
                    return Err(self.invalid(format!(
                        "{role}: host (CPU) tensors are only accepted as 0-dim scalars, got \
                         shape {:?}",
                        t.shape
                    )));
                }
                Ok(Operand::Host(t.dtype, value, matches!(t.data, TensorData::WrappedNumber(_))))
            }
            TensorData::Meta => {
                Err(self.invalid(format!("{role} has no data (a tensor of an infer_outputs call)")))
            }
            TensorData::Device { device, ptr, byte_offset } => {
                if device != self.device && !any_device {
                    return Err(self.invalid(format!(
                        "{role} is on device {device} but the kernel runs on device {}",
                        self.device
                    )));
                }
                let item = t.dtype.itemsize() as i128;
                let numel = shape
                    .iter()
                    .try_fold(1usize, |acc, &s| acc.checked_mul(s))
                    .ok_or_else(|| self.invalid(format!("{role}: too many elements")))?;
                let mut addr = 0usize;
                if numel > 0 {
                    let (lo, hi) = view::extent(&shape, &strides);
                    let off = i128::from(byte_offset);
                    let what = OpRole { op: self.op, role };
                    let base = self
                        .rt
                        .resolve(device, ptr, off + lo * item, off + (hi + 1) * item, &what)
                        .map_err(|e| Error::invalid(e.message().to_owned()))?;
                    addr = base.wrapping_add(byte_offset as usize);
                    if addr % t.dtype.itemsize() != 0 {
                        return Err(self.invalid(format!(
                            "{role}: data is not aligned to its element size ({} bytes)",
                            t.dtype.itemsize()
                        )));
                    }
                }
                // SAFETY: when the view has elements, its whole extent was
                // resolved inside one live allocation of `device` above and
                // `addr` was checked to be aligned; an empty view is never
                // dereferenced.
                Ok(Operand::View(unsafe { TensorView::from_validated(addr, t.dtype, shape, strides) }))
            }
        }
    }

    /// A validated input on this kernel's device (or a host scalar).
    #[inline(always)]
    pub(crate) fn operand(&self, t: &TensorRef<'_>, role: &str) -> Result<Operand> {
        self.operand_impl(t, role, false)
    }

    /// Like [`KernelCtx::operand`], accepting any device of the plugin.
    pub(crate) fn operand_any_device(&self, t: &TensorRef<'_>, role: &str) -> Result<Operand> {
        self.operand_impl(t, role, true)
    }

    /// A validated device tensor on this kernel's device.
    #[inline(always)]
    pub(crate) fn device_view(&self, t: &TensorRef<'_>, role: &str) -> Result<TensorView> {
        match self.operand(t, role)? {
            Operand::View(v) => Ok(v),
            Operand::Host(..) => Err(self.invalid(format!("{role} must be a device tensor"))),
        }
    }

    /// Output `i`, validated and checked for internal overlap (PyTorch
    /// refuses to write where several elements share memory).
    #[inline(always)]
    pub(crate) fn output(&self, call: &Frame<'_>, i: usize) -> Result<TensorView> {
        let t = call.outputs.get(i).ok_or_else(|| {
            self.invalid(format!("expected at least {} output(s), got {}", i + 1, call.outputs.len()))
        })?;
        self.written(t, "output")
    }

    /// A device tensor the kernel writes in place (an output, or a mutated
    /// argument such as a `Tensor(a!)[]` entry), validated and checked for
    /// internal overlap like [`KernelCtx::output`].
    #[inline(always)]
    pub(crate) fn written(&self, t: &TensorRef<'_>, role: &str) -> Result<TensorView> {
        let v = self.device_view(t, role)?;
        if v.has_internal_overlap() {
            return Err(self.invalid(
                "unsupported operation: more than one element of the written-to tensor refers \
                 to a single memory location. Please clone() the tensor before performing the \
                 operation.",
            ));
        }
        Ok(v)
    }

    /// PyTorch's `assert_no_partial_overlap` between an output and an input.
    #[inline(always)]
    pub(crate) fn check_overlap(&self, out: &TensorView, input: &Operand) -> Result<()> {
        if let Operand::View(v) = input {
            // Disjoint memory (the common case) can never overlap partially.
            if !view::disjoint(out, v) && view::overlap(out, v) == view::Overlap::Partial {
                return Err(self.invalid(
                    "unsupported operation: some elements of the input tensor and the \
                     written-to tensor refer to a single memory location. Please clone() the \
                     tensor before performing the operation.",
                ));
            }
        }
        Ok(())
    }

    /// Converts a `Scalar` argument to the element type used for `target`,
    /// refusing values that overflow `target` (c10's `checked_convert`).
    pub(crate) fn scalar_to<T: Element>(&self, s: Scalar, target: DType) -> Result<T> {
        let overflow = || {
            self.invalid(format!(
                "value cannot be converted to type {} without overflow",
                cpp_type_name(target)
            ))
        };
        match (target.category(), s) {
            (Category::Bool, _) | (_, Scalar::Bool(_)) => {}
            (Category::Integral, Scalar::Int(i)) => {
                let (lo, hi) = int_range(target);
                if i < lo || i > hi {
                    return Err(overflow());
                }
            }
            (Category::Integral, Scalar::Float(f)) => {
                let (lo, hi) = int_range(target);
                if f.is_nan() || f.trunc() < lo as f64 || f.trunc() > hi as f64 {
                    return Err(overflow());
                }
            }
            (Category::Floating, v) => {
                let f = v.as_f64();
                let max = match target {
                    DType::Float16 => f64::from(half::f16::MAX),
                    DType::BFloat16 => f64::from(half::bf16::MAX),
                    DType::Float32 => f64::from(f32::MAX),
                    _ => f64::MAX,
                };
                if f.is_finite() && f.abs() > max {
                    return Err(overflow());
                }
            }
        }
        Ok(s.cast())
    }
}

fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::UInt8 => (0, 255),
        DType::Int8 => (-128, 127),
        DType::Int16 => (i64::from(i16::MIN), i64::from(i16::MAX)),
        DType::Int32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        _ => (i64::MIN, i64::MAX),
    }
}

fn cpp_type_name(d: DType) -> &'static str {
    match d {
        DType::Bool => "bool",
        DType::UInt8 => "uint8_t",
        DType::Int8 => "int8_t",
        DType::Int16 => "int16_t",
        DType::Int32 => "int32_t",
        DType::Int64 => "int64_t",
        DType::Float16 => "c10::Half",
        DType::BFloat16 => "c10::BFloat16",
        DType::Float32 => "float",
        DType::Float64 => "double",
    }
}

/// Positional access to a call's arguments with schema defaults and
/// messages that name the operator and the parameter.
pub(crate) struct Args<'a> {
    ctx: &'a KernelCtx<'a>,
    call: &'a Frame<'a>,
}

impl<'a> Args<'a> {
    /// Checks `min <= num_args <= max` (trailing defaulted arguments may be
    /// omitted).
    pub(crate) fn new(ctx: &'a KernelCtx<'a>, call: &'a Frame<'a>, min: usize, max: usize) -> Result<Self> {
        let n = call.args.len();
        if n < min || n > max {
            let expected = if min == max { format!("{min}") } else { format!("{min} to {max}") };
            return Err(ctx.invalid(format!("expected {expected} arguments, got {n}")));
        }
        Ok(Self { ctx, call })
    }

    fn get(&self, i: usize) -> Option<&'a ArgRef<'a>> {
        self.call.args.get(i)
    }

    fn wrong(&self, i: usize, name: &str, expected: &str) -> Error {
        let got = match self.get(i) {
            None => "nothing",
            Some(ArgRef::None) => "None",
            Some(ArgRef::Tensor(_)) => "a tensor",
            Some(ArgRef::TensorList(_)) => "a tensor list",
            Some(ArgRef::Int(_)) => "an int",
            Some(ArgRef::Float(_)) => "a float",
            Some(ArgRef::Bool(_)) => "a bool",
            Some(ArgRef::Scalar(_)) => "a Scalar",
            Some(ArgRef::IntList(_)) => "an int list",
            Some(ArgRef::FloatList(_)) => "a float list",
            Some(ArgRef::BoolList(_)) => "a bool list",
            Some(ArgRef::Str(_)) => "a string",
        };
        self.ctx.invalid(format!("argument {i} ({name}) must be {expected}, got {got}"))
    }

    pub(crate) fn tensor(&self, i: usize, name: &str) -> Result<&'a TensorRef<'a>> {
        match self.get(i) {
            Some(ArgRef::Tensor(t)) => Ok(t),
            _ => Err(self.wrong(i, name, "a tensor")),
        }
    }

    /// A `Scalar` parameter (int, float and bool values are accepted too).
    pub(crate) fn scalar(&self, i: usize, name: &str, default: Option<Scalar>) -> Result<Scalar> {
        match (self.get(i), default) {
            (Some(ArgRef::Scalar(s)), _) => Ok(*s),
            (Some(ArgRef::Int(v)), _) => Ok(Scalar::Int(*v)),
            (Some(ArgRef::Float(v)), _) => Ok(Scalar::Float(*v)),
            (Some(ArgRef::Bool(v)), _) => Ok(Scalar::Bool(*v)),
            (None, Some(d)) => Ok(d),
            _ => Err(self.wrong(i, name, "a Scalar")),
        }
    }

    pub(crate) fn bool_or(&self, i: usize, name: &str, default: bool) -> Result<bool> {
        match self.get(i) {
            Some(ArgRef::Bool(b)) => Ok(*b),
            Some(ArgRef::Int(v)) if *v == 0 || *v == 1 => Ok(*v == 1),
            None | Some(ArgRef::None) => Ok(default),
            _ => Err(self.wrong(i, name, "a bool")),
        }
    }

    /// A `ScalarType?` parameter.
    pub(crate) fn opt_dtype(&self, i: usize, name: &str) -> Result<Option<DType>> {
        match self.get(i) {
            None | Some(ArgRef::None) => Ok(None),
            Some(ArgRef::Int(n)) => DType::from_scalar_type(*n)
                .map(Some)
                .ok_or_else(|| self.ctx.unimplemented(format!("{name}: ScalarType {n} is not supported"))),
            _ => Err(self.wrong(i, name, "a ScalarType or None")),
        }
    }

    /// An `int[]?` parameter (an int is accepted as a one-element list).
    pub(crate) fn opt_int_list(&self, i: usize, name: &str) -> Result<Option<Vec<i64>>> {
        match self.get(i) {
            None | Some(ArgRef::None) => Ok(None),
            Some(ArgRef::IntList(v)) => Ok(Some(v.to_vec())),
            Some(ArgRef::Int(v)) => Ok(Some(vec![*v])),
            _ => Err(self.wrong(i, name, "an int list or None")),
        }
    }
}

/// The result shape of broadcasting `shapes` together, or PyTorch's message.
pub(crate) fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Dims<usize>, String> {
    let ndim = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = Dims::from_elem(1usize, ndim);
    for shape in shapes {
        for (j, &size) in shape.iter().rev().enumerate() {
            let d = ndim - 1 - j;
            if out[d] == 1 {
                out[d] = size;
            } else if size != 1 && size != out[d] {
                return Err(format!(
                    "The size of tensor a ({}) must match the size of tensor b ({size}) at \
                     non-singleton dimension {d}",
                    out[d]
                ));
            }
        }
    }
    Ok(out)
}

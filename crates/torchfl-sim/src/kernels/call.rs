//! The call model: an operator call as the runtime receives it and as
//! kernels read it.
//!
//! A call exists in two forms. [`Call`] owns its contents: it is what Rust
//! hosts and tests build. [`Frame`] borrows them, from a `Call` or straight
//! from the host's `TFL_CallFrame` (the ABI layer decodes into it without
//! copying the shape and stride arrays), so that the hot launch path copies
//! nothing a kernel does not keep. Kernels see only `Frame`s.

use std::borrow::Cow;

use crate::dtype::{self, Category, DType, Element};
use crate::runtime::small::SmallVec;
use crate::runtime::StreamHandle;

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
    pub(crate) fn as_f64(self) -> f64 {
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
/// their work needs into [`TensorView`](super::view::TensorView)s, so nothing borrowed
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

/// Resizes the outputs of a dynamic-shape operator
/// ([`TFL_OP_DYNAMIC_SHAPE`](torchfl_ffi::TFL_OP_DYNAMIC_SHAPE)): the host's
/// `resize_output` callback, seen from a kernel.
pub(crate) trait OutputResizer {
    /// Makes output `i` a contiguous tensor of `shape` (reallocating it)
    /// and returns its new descriptor.
    fn resize(&self, i: usize, shape: &[i64]) -> crate::error::Result<TensorRef<'_>>;
}

impl std::fmt::Debug for dyn OutputResizer + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutputResizer")
    }
}

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
    /// The host's `resize_output`, for dynamic-shape operators; `None`
    /// where no host can resize (the Rust API).
    pub(crate) resizer: Option<&'a dyn OutputResizer>,
}

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

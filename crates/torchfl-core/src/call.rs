//! A safe way to call a plugin kernel from Rust: owned arguments in, a
//! `TFL_CallFrame` built and checked for you.
//!
//! This is what `torchfl-abi verify`, the benches and the tests use. The C++
//! shim builds frames itself on PyTorch's hot path; the rules it follows are
//! the ones checked here: every tensor lies inside a live allocation of the
//! frame's device, and every pointer outlives the call.

use std::ffi::{c_char, CString};
use std::ptr;

use torchfl_ffi::*;

use crate::error::{Error, Result, StatusCode};
use crate::plugin::{DeviceBuffer, OpKernel, Plugin, Stream};

/// A tensor argument: a strided view of a [`DeviceBuffer`].
#[derive(Debug, Clone)]
pub struct TensorArg<'a> {
    buffer: &'a DeviceBuffer,
    dtype: TFL_DType,
    shape: Vec<i64>,
    strides: Vec<i64>,
    byte_offset: u64,
}

/// Row-major strides for `shape`. Saturates at `i64::MAX` for shapes no
/// buffer can hold (which [`TensorArg::strided`] then refuses).
pub fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    strides
}

impl<'a> TensorArg<'a> {
    /// A contiguous tensor at the start of `buffer`.
    pub fn contiguous(buffer: &'a DeviceBuffer, dtype: TFL_DType, shape: &[i64]) -> Result<Self> {
        Self::strided(buffer, dtype, shape, &contiguous_strides(shape), 0)
    }

    /// A strided view. Fails when any element would lie outside `buffer`.
    pub fn strided(
        buffer: &'a DeviceBuffer,
        dtype: TFL_DType,
        shape: &[i64],
        strides: &[i64],
        byte_offset: u64,
    ) -> Result<Self> {
        let invalid =
            |reason: String| Error::InvalidCall { plugin: buffer.plugin().label().to_owned(), reason };
        if shape.len() != strides.len() {
            return Err(invalid(format!("shape {shape:?} and strides {strides:?} differ in length")));
        }
        if shape.iter().any(|&d| d < 0) || strides.iter().any(|&s| s < 0) {
            return Err(invalid(format!("negative size or stride in shape {shape:?}, strides {strides:?}")));
        }
        let itemsize = dtype.itemsize() as u64;
        if shape.iter().all(|&d| d > 0) {
            // Offset of the last element, in elements: each term fits an
            // i128, their sum and the byte count saturate (past any buffer).
            let last: i128 = shape
                .iter()
                .zip(strides)
                .map(|(&d, &s)| i128::from(d - 1) * i128::from(s))
                .fold(0i128, i128::saturating_add);
            let end = i128::from(byte_offset)
                .saturating_add(last.saturating_add(1).saturating_mul(i128::from(itemsize)));
            if end > buffer.len() as i128 {
                return Err(invalid(format!(
                    "a tensor of shape {shape:?}, strides {strides:?}, offset {byte_offset} needs {end} bytes but \
                     its buffer has {}",
                    buffer.len()
                )));
            }
        }
        Ok(Self { buffer, dtype, shape: shape.to_vec(), strides: strides.to_vec(), byte_offset })
    }

    /// The sizes of the view, one per dimension.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The view's descriptor, its sizes and strides pointing into `dims`,
    /// which the caller keeps (a view's own vectors may go before the call
    /// does: a captured call outlives its arguments).
    fn descriptor(&self, dims: &mut Vec<Box<[i64]>>) -> TFL_Tensor {
        let owned: Box<[i64]> = self.shape.iter().chain(&self.strides).copied().collect();
        let (shape, strides) = (owned.as_ptr(), owned.as_ptr().wrapping_add(self.shape.len()));
        dims.push(owned);
        TFL_Tensor {
            struct_size: struct_size!(TFL_Tensor, flags),
            data: self.buffer.as_ptr(),
            byte_offset: self.byte_offset,
            device_type: TFL_DEVICE_PLUGIN,
            device_index: self.buffer.device(),
            dtype: self.dtype,
            ndim: self.shape.len() as i32,
            shape,
            strides,
            flags: 0,
        }
    }
}

/// A PyTorch `Scalar`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScalarArg {
    /// Passed as `TFL_SCALAR_INT`.
    Int(i64),
    /// Passed as `TFL_SCALAR_FLOAT`.
    Float(f64),
    /// Passed as `TFL_SCALAR_BOOL`.
    Bool(bool),
}

/// One kernel argument, in ATen schema order.
#[derive(Debug, Clone)]
pub enum Arg<'a> {
    /// An absent optional argument (`T?` passed as `None`): `TFL_VALUE_NONE`.
    None,
    /// `Tensor` or a present `Tensor?`: `TFL_VALUE_TENSOR`.
    Tensor(TensorArg<'a>),
    /// `Tensor[]`: `TFL_VALUE_TENSOR_LIST`.
    TensorList(Vec<TensorArg<'a>>),
    /// `int`, `SymInt`, `ScalarType` and other integer-like schema types:
    /// `TFL_VALUE_INT`.
    Int(i64),
    /// `float`: `TFL_VALUE_FLOAT`.
    Float(f64),
    /// `bool`: `TFL_VALUE_BOOL`.
    Bool(bool),
    /// `Scalar`: `TFL_VALUE_SCALAR`.
    Scalar(ScalarArg),
    /// `int[]`, `SymInt[]`: `TFL_VALUE_INT_LIST`.
    IntList(Vec<i64>),
    /// `float[]`: `TFL_VALUE_FLOAT_LIST`.
    FloatList(Vec<f64>),
    /// `bool[N]`: `TFL_VALUE_BOOL_LIST`.
    BoolList(Vec<bool>),
    /// `str`: `TFL_VALUE_STRING`; must not contain NUL.
    Str(String),
}

impl Plugin {
    /// Runs `op`'s kernel on `stream` with `args` (ATen schema order, out=
    /// arguments excluded) writing into pre-allocated `outputs`.
    ///
    /// Every tensor must live on the stream's device of this plugin. A
    /// failed status is [`Error::Kernel`] (or [`Error::OutOfMemory`]).
    pub fn launch(
        &self,
        op: &OpKernel,
        stream: &Stream,
        args: &[Arg<'_>],
        outputs: &[TensorArg<'_>],
    ) -> Result<()> {
        let call = self.prepare(op, stream, args, outputs)?;
        self.call_prepared(&call)
    }

    /// Builds the frame of a call of `op` on `stream` (see
    /// [`Plugin::launch`]), with everything it points to owned by the
    /// result, boxed so that the frame's address is stable: a captured call
    /// (ABI 1.7 graphs) must stay valid until its graph is destroyed.
    pub(crate) fn prepare(
        &self,
        op: &OpKernel,
        stream: &Stream,
        args: &[Arg<'_>],
        outputs: &[TensorArg<'_>],
    ) -> Result<Box<PreparedCall>> {
        let invalid = |reason: String| Error::InvalidCall { plugin: self.label().to_owned(), reason };
        if !self.ops().iter().any(|k| k.kernel as usize == op.kernel as usize) {
            return Err(invalid(format!("operator '{}' is not a kernel of this plugin", op.name)));
        }
        let device = stream.device();
        let check = |t: &TensorArg<'_>| {
            if !std::ptr::eq(t.buffer.plugin().as_ref(), self) || t.buffer.device() != device {
                return Err(invalid(format!(
                    "a tensor of {}:{} was passed to a kernel running on {}:{device}",
                    t.buffer.plugin().name(),
                    t.buffer.device(),
                    self.name()
                )));
            }
            Ok(())
        };

        let mut marshalled = Marshalled::new(args, outputs, check, invalid)?;
        let base = marshalled.descriptors.as_mut_ptr();
        // `wrapping_add` below stays inside `descriptors` (indices < len).
        let lists: Vec<Vec<*const TFL_Tensor>> = args
            .iter()
            .zip(&marshalled.slots)
            .map(|(arg, slot)| match arg {
                Arg::TensorList(_) => slot.clone().map(|i| base.wrapping_add(i).cast_const()).collect(),
                _ => Vec::new(),
            })
            .collect();
        let bools: Vec<Vec<u8>> = args
            .iter()
            .map(|a| match a {
                Arg::BoolList(v) => v.iter().map(|&b| u8::from(b)).collect(),
                _ => Vec::new(),
            })
            .collect();
        let values: Vec<TFL_Value> = args
            .iter()
            .enumerate()
            .map(|(i, arg)| marshalled.value(arg, i, base, &lists[i], &bools[i]))
            .collect();
        let value_ptrs: Vec<*const TFL_Value> = values.iter().map(ptr::from_ref).collect();
        let output_ptrs: Vec<*mut TFL_Tensor> =
            (marshalled.first_output..marshalled.descriptors.len()).map(|i| base.wrapping_add(i)).collect();
        let op_name =
            CString::new(op.name.as_str()).map_err(|_| invalid("operator name contains NUL".into()))?;
        let frame = TFL_CallFrame {
            struct_size: struct_size!(TFL_CallFrame, rng_offset),
            op_name: op_name.as_ptr(),
            device_index: device,
            stream: stream.raw(),
            args: value_ptrs.as_ptr(),
            num_args: value_ptrs.len(),
            outputs: output_ptrs.as_ptr(),
            num_outputs: output_ptrs.len(),
            resize_output: Some(crate::ffi::resize_output_unsupported),
            host_context: ptr::null_mut(),
            rng_seed: 0,
            rng_offset: 0,
        };
        // Moving the vectors into the box keeps their heap buffers, which
        // the frame points into, where they are.
        Ok(Box::new(PreparedCall {
            frame,
            kernel: op.kernel,
            op: op.name.clone(),
            device,
            _op_name: op_name,
            _marshalled: marshalled,
            _lists: lists,
            _bools: bools,
            _values: values,
            _value_ptrs: value_ptrs,
            _output_ptrs: output_ptrs,
        }))
    }

    /// Calls the kernel of a prepared call.
    pub(crate) fn call_prepared(&self, call: &PreparedCall) -> Result<()> {
        let table = self.table(crate::inflight::intern(&call.op))?;
        // SAFETY: every tensor was checked to lie inside a live allocation
        // of the device (TensorArg::strided and `prepare`'s check), and every
        // pointer in the frame refers to storage `call` owns.
        let result = unsafe { table.call_kernel(call.kernel, &call.frame) };
        result.map_err(|status| {
            if status.code == StatusCode::OutOfMemory {
                Error::OutOfMemory { plugin: self.label().to_owned(), device: call.device, status }
            } else {
                Error::Kernel { plugin: self.label().to_owned(), op: call.op.clone(), status }
            }
        })
    }
}

/// A kernel call's frame and everything it points to.
pub(crate) struct PreparedCall {
    frame: TFL_CallFrame,
    kernel: TFL_KernelFn,
    op: String,
    device: i32,
    _op_name: CString,
    _marshalled: Marshalled,
    _lists: Vec<Vec<*const TFL_Tensor>>,
    _bools: Vec<Vec<u8>>,
    _values: Vec<TFL_Value>,
    _value_ptrs: Vec<*const TFL_Value>,
    _output_ptrs: Vec<*mut TFL_Tensor>,
}

// SAFETY: the frame's pointers refer to storage the call owns (never shared
// mutably) and to device memory; nothing is tied to the creating thread.
unsafe impl Send for PreparedCall {}
// SAFETY: as for Send; the call is only read once built.
unsafe impl Sync for PreparedCall {}

/// The owned storage a call frame points into: built before any pointer is
/// taken, and not grown afterwards, so those pointers stay valid.
struct Marshalled {
    /// Tensor descriptors of every argument, then of every output.
    descriptors: Vec<TFL_Tensor>,
    /// The string arguments, NUL-terminated.
    strings: Vec<CString>,
    /// Per argument: the index of its descriptor (tensors), the range of its
    /// descriptors (tensor lists) or of its string.
    slots: Vec<std::ops::Range<usize>>,
    /// Index in `descriptors` of the first output.
    first_output: usize,
    /// Each descriptor's sizes then strides (boxed: their addresses stay put
    /// as the vector grows).
    _dims: Vec<Box<[i64]>>,
}

impl Marshalled {
    /// Checks every tensor with `check` and lays out the descriptors and
    /// strings of `args` and `outputs`.
    fn new(
        args: &[Arg<'_>],
        outputs: &[TensorArg<'_>],
        check: impl Fn(&TensorArg<'_>) -> Result<()>,
        invalid: impl Fn(String) -> Error,
    ) -> Result<Self> {
        // Descriptors first, all in one vector, so that the pointers taken
        // later stay valid: nothing is pushed after they are taken.
        let mut descriptors: Vec<TFL_Tensor> = Vec::new();
        let mut strings: Vec<CString> = Vec::new();
        let mut slots: Vec<std::ops::Range<usize>> = Vec::with_capacity(args.len());
        let mut dims: Vec<Box<[i64]>> = Vec::new();
        for arg in args {
            let start = descriptors.len();
            match arg {
                Arg::Tensor(t) => {
                    check(t)?;
                    descriptors.push(t.descriptor(&mut dims));
                }
                Arg::TensorList(ts) => {
                    for t in ts {
                        check(t)?;
                        descriptors.push(t.descriptor(&mut dims));
                    }
                }
                Arg::Str(s) => {
                    strings.push(
                        CString::new(s.as_str())
                            .map_err(|_| invalid("a string argument contains NUL".into()))?,
                    );
                    slots.push(strings.len() - 1..strings.len());
                    continue;
                }
                _ => {}
            }
            slots.push(start..descriptors.len());
        }
        let first_output = descriptors.len();
        for t in outputs {
            check(t)?;
            descriptors.push(t.descriptor(&mut dims));
        }
        Ok(Self { descriptors, strings, slots, first_output, _dims: dims })
    }

    /// The `TFL_Value` of argument `i`. `base` is `descriptors.as_mut_ptr()`;
    /// `list` and `bools` are the argument's tensor-pointer and byte arrays
    /// (empty for other kinds), owned by the caller for the call's duration.
    fn value(
        &self,
        arg: &Arg<'_>,
        i: usize,
        base: *mut TFL_Tensor,
        list: &[*const TFL_Tensor],
        bools: &[u8],
    ) -> TFL_Value {
        let (tag, u) = match arg {
            Arg::None => (TFL_VALUE_NONE, TFL_ValueUnion { i: 0 }),
            Arg::Tensor(_) => {
                // `slots[i].start < descriptors.len()`: stays inside the vector.
                (
                    TFL_VALUE_TENSOR,
                    TFL_ValueUnion { tensor: base.wrapping_add(self.slots[i].start).cast_const() },
                )
            }
            Arg::TensorList(_) => (
                TFL_VALUE_TENSOR_LIST,
                TFL_ValueUnion { tensor_list: TFL_TensorList { items: list.as_ptr(), len: list.len() } },
            ),
            Arg::Int(v) => (TFL_VALUE_INT, TFL_ValueUnion { i: *v }),
            Arg::Float(v) => (TFL_VALUE_FLOAT, TFL_ValueUnion { f: *v }),
            Arg::Bool(v) => (TFL_VALUE_BOOL, TFL_ValueUnion { b: u8::from(*v) }),
            Arg::Scalar(s) => (TFL_VALUE_SCALAR, TFL_ValueUnion { scalar: scalar(*s) }),
            Arg::IntList(v) => (
                TFL_VALUE_INT_LIST,
                TFL_ValueUnion { int_list: TFL_IntList { items: v.as_ptr(), len: v.len() } },
            ),
            Arg::FloatList(v) => (
                TFL_VALUE_FLOAT_LIST,
                TFL_ValueUnion { float_list: TFL_FloatList { items: v.as_ptr(), len: v.len() } },
            ),
            Arg::BoolList(_) => (
                TFL_VALUE_BOOL_LIST,
                TFL_ValueUnion { bool_list: TFL_BoolList { items: bools.as_ptr(), len: bools.len() } },
            ),
            Arg::Str(_) => {
                let s = &self.strings[self.slots[i].start];
                (
                    TFL_VALUE_STRING,
                    TFL_ValueUnion {
                        string: TFL_String { data: s.as_ptr().cast::<c_char>(), len: s.as_bytes().len() },
                    },
                )
            }
        };
        TFL_Value { struct_size: struct_size!(TFL_Value, u), tag, u }
    }
}

fn scalar(s: ScalarArg) -> TFL_Scalar {
    match s {
        ScalarArg::Int(i) => TFL_Scalar { kind: TFL_SCALAR_INT, v: TFL_ScalarValue { i } },
        ScalarArg::Float(f) => TFL_Scalar { kind: TFL_SCALAR_FLOAT, v: TFL_ScalarValue { f } },
        ScalarArg::Bool(b) => TFL_Scalar { kind: TFL_SCALAR_BOOL, v: TFL_ScalarValue { b: u8::from(b) } },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_are_row_major() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[5]), vec![1]);
        assert!(contiguous_strides(&[]).is_empty());
        assert_eq!(contiguous_strides(&[2, 0, 3]), vec![3, 3, 1]);
    }
}

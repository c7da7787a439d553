//! Decoding a host `TFL_CallFrame`: the frame's fields, its tensors as
//! [`View`]s or host numbers, and its other arguments (integers, lists,
//! strings, optional tensors) through [`Call`].
//!
//! Nothing is copied that can be borrowed: shape, stride and list arrays
//! stay the host's, valid for the call (the header's guarantee).

use std::ffi::CStr;
use std::ptr::addr_of;

use torchfl_ffi::{self as ffi, struct_size};
use torchfl_ffi::{TFL_CallFrame, TFL_Scalar, TFL_Tensor, TFL_Value};

use super::{check_size, device, null_arg, stream, PROGRAMS};
use crate::error::{Error, Result};
use crate::kernels::{Elem, Launch, Number, Operand, ProgramCache, View};
use crate::runtime::{Runtime, Stream};

/// The most dimensions accepted from the host before reading shapes.
const MAX_NDIM: i32 = 64;
/// The longest argument list accepted from the host (guards against garbage).
const MAX_LIST: usize = 1 << 24;

/// A frame's fields the kernels use.
pub(super) struct Frame<'a> {
    pub(super) op: &'a str,
    pub(super) device: usize,
    pub(super) stream: &'a Stream,
    pub(super) args: &'a [*const TFL_Value],
    pub(super) outputs: &'a [*mut TFL_Tensor],
}

/// # Safety
/// `frame` must be a valid call frame for the duration of `'a`.
pub(super) unsafe fn read_frame<'a>(
    rt: &Runtime,
    frame: *const TFL_CallFrame,
    fallback_name: &'a str,
) -> Result<Frame<'a>> {
    if frame.is_null() {
        return Err(null_arg(fallback_name, "frame"));
    }
    // SAFETY: per this function's contract; the size is checked first, and
    // the arrays are the host's, valid for the call.
    unsafe {
        check_size(addr_of!((*frame).struct_size), struct_size!(TFL_CallFrame, rng_offset), fallback_name)?;
        let name = rd!(frame, op_name);
        let op = if name.is_null() {
            fallback_name
        } else {
            CStr::from_ptr(name).to_str().unwrap_or(fallback_name)
        };
        let d = device(rt, rd!(frame, device_index))?;
        let s = stream(rd!(frame, stream)).ok_or_else(|| null_arg(op, "frame->stream"))?;
        let (args, num_args) = (rd!(frame, args), rd!(frame, num_args));
        let (outputs, num_outputs) = (rd!(frame, outputs), rd!(frame, num_outputs));
        if (num_args > 0 && args.is_null())
            || (num_outputs > 0 && outputs.is_null())
            || num_args > 64
            || num_outputs > 64
        {
            return Err(Error::invalid(format!(
                "opencl: {op}: malformed frame ({num_args} args, {num_outputs} outputs)"
            )));
        }
        let args = if num_args == 0 { &[][..] } else { std::slice::from_raw_parts(args, num_args) };
        let outputs: &[*mut TFL_Tensor] =
            if num_outputs == 0 { &[] } else { std::slice::from_raw_parts(outputs.cast(), num_outputs) };
        Ok(Frame { op, device: d, stream: s, args, outputs })
    }
}

/// Tensor `t` as a device view or a wrapped host number. `what` names it in
/// error messages, formatted only when one is reported (kernels are the
/// hot path).
///
/// # Safety
/// `t` must be a valid tensor descriptor for `'a`.
pub(super) unsafe fn operand<'a>(
    f: &Frame<'_>,
    t: *const TFL_Tensor,
    what: impl std::fmt::Display,
) -> Result<Operand<'a>> {
    if t.is_null() {
        return Err(Error::invalid(format!("opencl: {}: {what} is NULL", f.op)));
    }
    // SAFETY: per this function's contract, size checked first; shape and
    // strides arrays hold ndim entries for the call.
    unsafe {
        check_size(addr_of!((*t).struct_size), struct_size!(TFL_Tensor, flags), f.op)?;
        let dtype = rd!(t, dtype);
        let ndim = rd!(t, ndim);
        if !(0..=MAX_NDIM).contains(&ndim) {
            return Err(Error::invalid(format!("opencl: {}: {what} has {ndim} dimensions", f.op)));
        }
        let data = rd!(t, data) as usize;
        let byte_offset = rd!(t, byte_offset) as usize;
        if rd!(t, device_type) == ffi::TFL_DEVICE_HOST {
            // A wrapped Python number: read it in whatever type PyTorch
            // wrapped it (double for a float, int64 for an int).
            if ndim != 0 || data == 0 {
                return Err(Error::invalid(format!(
                    "opencl: {}: {what} is a host tensor that is not a 0-dim number",
                    f.op
                )));
            }
            let at = (data + byte_offset) as *const u8;
            let n = match (dtype.code, dtype.bits) {
                (ffi::TFL_DTYPE_FLOAT, 64) => Number::Float(at.cast::<f64>().read_unaligned()),
                (ffi::TFL_DTYPE_FLOAT, 32) => Number::Float(f64::from(at.cast::<f32>().read_unaligned())),
                (ffi::TFL_DTYPE_INT, 64) => Number::Int(at.cast::<i64>().read_unaligned()),
                (ffi::TFL_DTYPE_INT, 32) => Number::Int(i64::from(at.cast::<i32>().read_unaligned())),
                (ffi::TFL_DTYPE_BOOL, 8) => Number::Int(i64::from(at.read() != 0)),
                _ => {
                    return Err(Error::unimplemented(format!(
                        "opencl: {}: {what} is a host number of dtype (code {}, {} bits)",
                        f.op, dtype.code, dtype.bits
                    )))
                }
            };
            return Ok(Operand::Host(n));
        }
        let elem = Elem::from_ffi(dtype).ok_or_else(|| {
            Error::unimplemented(format!(
                "opencl: {}: {what} has dtype (code {}, {} bits), which the OpenCL kernels do not take yet",
                f.op, dtype.code, dtype.bits
            ))
        })?;
        if rd!(t, device_index) as usize != f.device {
            return Err(Error::invalid(format!(
                "opencl: {}: {what} is on device {}, the call on device {}",
                f.op,
                rd!(t, device_index),
                f.device
            )));
        }
        let n = ndim as usize;
        let (shape, strides) = (rd!(t, shape), rd!(t, strides));
        if n > 0 && (shape.is_null() || strides.is_null()) {
            return Err(Error::invalid(format!("opencl: {}: {what} has NULL shape or strides", f.op)));
        }
        let shape = if n == 0 { &[][..] } else { std::slice::from_raw_parts(shape, n) };
        let strides = if n == 0 { &[][..] } else { std::slice::from_raw_parts(strides, n) };
        Ok(Operand::Device(View { addr: data.wrapping_add(byte_offset), elem, shape, strides }))
    }
}

/// # Safety
/// `v` must be a valid value for the call.
pub(super) unsafe fn value_tensor(v: *const TFL_Value) -> Option<*const TFL_Tensor> {
    // SAFETY: per the contract; the tag says which member is live.
    unsafe { (!v.is_null() && rd!(v, tag) == ffi::TFL_VALUE_TENSOR).then(|| rd!(v, u).tensor) }
}

/// # Safety
/// `v` must be a valid value for the call.
pub(super) unsafe fn value_scalar(v: *const TFL_Value, op: &str) -> Result<Number> {
    // SAFETY: per the contract; the tags say which members are live.
    unsafe {
        if v.is_null() {
            return Err(Error::invalid(format!("opencl: {op}: expected a number, got NULL")));
        }
        match rd!(v, tag) {
            ffi::TFL_VALUE_SCALAR => {}
            ffi::TFL_VALUE_INT => return Ok(Number::Int(rd!(v, u).i)),
            ffi::TFL_VALUE_FLOAT => return Ok(Number::Float(rd!(v, u).f)),
            ffi::TFL_VALUE_BOOL => return Ok(Number::Int(i64::from(rd!(v, u).b != 0))),
            tag => {
                return Err(Error::invalid(format!("opencl: {op}: expected a number, got value tag {tag}")))
            }
        }
        let s: TFL_Scalar = rd!(v, u).scalar;
        match s.kind {
            ffi::TFL_SCALAR_INT => Ok(Number::Int(s.v.i)),
            ffi::TFL_SCALAR_FLOAT => Ok(Number::Float(s.v.f)),
            ffi::TFL_SCALAR_BOOL => Ok(Number::Int(i64::from(s.v.b))),
            _ => Err(Error::unimplemented(format!("opencl: {op}: a complex number"))),
        }
    }
}

/// One kernel call: the runtime, the program cache and the decoded frame,
/// with typed access to its arguments by position (the operator's schema
/// order) and to its outputs.
///
/// Built only by [`Call::new`], whose contract makes every accessor safe:
/// the frame and everything it points to are valid for the call.
pub(crate) struct Call<'a> {
    /// The runtime.
    pub(crate) rt: &'a Runtime,
    /// Built programs.
    pub(crate) programs: &'a ProgramCache,
    frame: Frame<'a>,
}

impl<'a> Call<'a> {
    /// # Safety
    /// `frame` must be a valid call frame for `'a`.
    pub(super) unsafe fn new(rt: &'a Runtime, frame: *const TFL_CallFrame, name: &'a str) -> Result<Self> {
        // SAFETY: forwarded contract.
        let frame = unsafe { read_frame(rt, frame, name)? };
        Ok(Call { rt, programs: PROGRAMS.get_or_init(ProgramCache::default), frame })
    }

    /// Where this call's kernels run.
    pub(crate) fn launch(&self) -> Launch<'a> {
        Launch { rt: self.rt, cache: self.programs, stream: self.frame.stream, op: self.frame.op }
    }

    /// The operator's name, for messages.
    pub(crate) fn op(&self) -> &'a str {
        self.frame.op
    }

    /// Checks the argument and output counts: INVALID_ARGUMENT otherwise.
    pub(crate) fn expect(&self, args: usize, outputs: usize) -> Result<()> {
        self.expect_range(args, args, outputs).map(drop)
    }

    /// Checks there are `min..=max` arguments (trailing defaulted ones may
    /// be left out) and `outputs` outputs; returns the argument count.
    pub(crate) fn expect_range(&self, min: usize, max: usize, outputs: usize) -> Result<usize> {
        let f = &self.frame;
        let n = f.args.len();
        if !(min..=max).contains(&n) || f.outputs.len() != outputs {
            let args = if min == max { min.to_string() } else { format!("{min} to {max}") };
            return Err(Error::invalid(format!(
                "opencl: {}: expected {args} arguments and {outputs} outputs, got {n} and {}",
                f.op,
                f.outputs.len()
            )));
        }
        Ok(n)
    }

    /// The number of arguments the host passed.
    pub(crate) fn num_args(&self) -> usize {
        self.frame.args.len()
    }

    /// Whether argument `i` is a tensor (rather than a number, a list, ...).
    pub(crate) fn is_tensor(&self, i: usize) -> Result<bool> {
        Ok(self.tag(i)? == ffi::TFL_VALUE_TENSOR)
    }

    fn value(&self, i: usize) -> Result<*const TFL_Value> {
        match self.frame.args.get(i) {
            Some(v) if !v.is_null() => {
                // SAFETY: a valid value for the call (Call::new's contract);
                // its size is checked before its tag is read.
                unsafe {
                    check_size(addr_of!((**v).struct_size), struct_size!(TFL_Value, u), self.frame.op)?
                };
                Ok(*v)
            }
            Some(_) => Err(Error::invalid(format!("opencl: {}: argument {i} is NULL", self.frame.op))),
            None => Err(Error::invalid(format!(
                "opencl: {}: argument {i} is missing ({} given)",
                self.frame.op,
                self.frame.args.len()
            ))),
        }
    }

    fn tag(&self, i: usize) -> Result<ffi::TFL_ValueTag> {
        let v = self.value(i)?;
        // SAFETY: checked by `value`.
        Ok(unsafe { rd!(v, tag) })
    }

    fn mismatch(&self, i: usize, want: &str) -> Error {
        let tag = self.tag(i).unwrap_or(-1);
        Error::invalid(format!("opencl: {}: argument {i} is not {want} (value tag {tag})", self.frame.op))
    }

    /// Argument `i`: a tensor, in device memory or a wrapped host number.
    pub(crate) fn operand(&self, i: usize) -> Result<Operand<'a>> {
        let v = self.value(i)?;
        // SAFETY: a valid value and tensor for the call (Call::new).
        unsafe {
            let t = value_tensor(v).ok_or_else(|| self.mismatch(i, "a tensor"))?;
            operand(&self.frame, t, format_args!("argument {i}"))
        }
    }

    /// Argument `i`: a tensor in device memory.
    pub(crate) fn tensor(&self, i: usize) -> Result<View<'a>> {
        match self.operand(i)? {
            Operand::Device(v) => Ok(v),
            Operand::Host(_) => Err(Error::unimplemented(format!(
                "opencl: {}: argument {i} is a host number where a device tensor is expected",
                self.frame.op
            ))),
        }
    }

    /// Argument `i`: an optional device tensor (`Tensor?`), `None` when absent.
    pub(crate) fn opt_tensor(&self, i: usize) -> Result<Option<View<'a>>> {
        if self.tag(i)? == ffi::TFL_VALUE_NONE {
            return Ok(None);
        }
        self.tensor(i).map(Some)
    }

    /// Argument `i`: a list of device tensors (`Tensor[]`).
    pub(crate) fn tensors(&self, i: usize) -> Result<Vec<View<'a>>> {
        let v = self.value(i)?;
        if self.tag(i)? != ffi::TFL_VALUE_TENSOR_LIST {
            return Err(self.mismatch(i, "a tensor list"));
        }
        // SAFETY: the live member per the tag; items valid for the call.
        unsafe {
            let list = rd!(v, u).tensor_list;
            let items = self.list(i, list.items, list.len)?;
            items
                .iter()
                .enumerate()
                .map(|(j, &t)| match operand(&self.frame, t, format_args!("argument {i}[{j}]"))? {
                    Operand::Device(view) => Ok(view),
                    Operand::Host(_) => Err(Error::unimplemented(format!(
                        "opencl: {}: argument {i}[{j}] is a host number",
                        self.frame.op
                    ))),
                })
                .collect()
        }
    }

    /// # Safety
    /// `items` must be NULL or valid for `len` reads for the call.
    unsafe fn list<T>(&self, i: usize, items: *const T, len: usize) -> Result<&'a [T]> {
        if len == 0 {
            return Ok(&[]);
        }
        if items.is_null() || len > MAX_LIST {
            return Err(Error::invalid(format!(
                "opencl: {}: argument {i} is a malformed list ({len} items)",
                self.frame.op
            )));
        }
        // SAFETY: per the contract.
        Ok(unsafe { std::slice::from_raw_parts(items, len) })
    }

    /// Argument `i`: a number (`Scalar`, `int`, `float` or `bool`).
    pub(crate) fn number(&self, i: usize) -> Result<Number> {
        let v = self.value(i)?;
        // SAFETY: checked by `value`.
        unsafe { value_scalar(v, self.frame.op) }
    }

    /// Argument `i`: an optional number (`Scalar?`, `float?`, ...).
    pub(crate) fn opt_number(&self, i: usize) -> Result<Option<Number>> {
        if self.tag(i)? == ffi::TFL_VALUE_NONE {
            return Ok(None);
        }
        self.number(i).map(Some)
    }

    /// Argument `i`: an `int` (or `SymInt`).
    pub(crate) fn int(&self, i: usize) -> Result<i64> {
        match self.number(i)? {
            Number::Int(n) => Ok(n),
            Number::Float(_) => Err(self.mismatch(i, "an integer")),
        }
    }

    /// Argument `i`: a `float` (an integer converts).
    pub(crate) fn float(&self, i: usize) -> Result<f64> {
        Ok(match self.number(i)? {
            Number::Int(n) => n as f64,
            Number::Float(x) => x,
        })
    }

    /// Argument `i`: a `bool`.
    pub(crate) fn bool(&self, i: usize) -> Result<bool> {
        match self.number(i)? {
            Number::Int(n) => Ok(n != 0),
            Number::Float(_) => Err(self.mismatch(i, "a bool")),
        }
    }

    /// Argument `i`: an `int[]` (or `SymInt[]`).
    pub(crate) fn ints(&self, i: usize) -> Result<&'a [i64]> {
        let v = self.value(i)?;
        if self.tag(i)? != ffi::TFL_VALUE_INT_LIST {
            return Err(self.mismatch(i, "an integer list"));
        }
        // SAFETY: the live member per the tag; items valid for the call.
        unsafe {
            let list = rd!(v, u).int_list;
            self.list(i, list.items, list.len)
        }
    }

    /// Argument `i`: an optional `int[]?`, `None` when absent.
    pub(crate) fn opt_ints(&self, i: usize) -> Result<Option<&'a [i64]>> {
        if self.tag(i)? == ffi::TFL_VALUE_NONE {
            return Ok(None);
        }
        self.ints(i).map(Some)
    }

    /// Argument `i`: a `bool[]`.
    pub(crate) fn bools(&self, i: usize) -> Result<Vec<bool>> {
        let v = self.value(i)?;
        if self.tag(i)? != ffi::TFL_VALUE_BOOL_LIST {
            return Err(self.mismatch(i, "a bool list"));
        }
        // SAFETY: the live member per the tag; items valid for the call.
        unsafe {
            let list = rd!(v, u).bool_list;
            Ok(self.list(i, list.items, list.len)?.iter().map(|&b| b != 0).collect())
        }
    }

    /// Argument `i`: a `str`.
    pub(crate) fn string(&self, i: usize) -> Result<&'a str> {
        let v = self.value(i)?;
        if self.tag(i)? != ffi::TFL_VALUE_STRING {
            return Err(self.mismatch(i, "a string"));
        }
        // SAFETY: the live member per the tag; `len` bytes valid for the call.
        unsafe {
            let s = rd!(v, u).string;
            let bytes = self.list(i, s.data.cast::<u8>(), s.len)?;
            std::str::from_utf8(bytes).map_err(|_| self.mismatch(i, "a UTF-8 string"))
        }
    }

    /// Output `i`, in device memory; `None` when the host marked it
    /// undefined (`TFL_TENSOR_UNDEFINED`: an output mask left it out).
    pub(crate) fn opt_output(&self, i: usize) -> Result<Option<View<'a>>> {
        let t = *self
            .frame
            .outputs
            .get(i)
            .ok_or_else(|| Error::invalid(format!("opencl: {}: output {i} is missing", self.frame.op)))?;
        if t.is_null() {
            return Err(Error::invalid(format!("opencl: {}: output {i} is NULL", self.frame.op)));
        }
        // SAFETY: a valid tensor for the call (Call::new); its size is
        // checked before `flags` is read.
        unsafe {
            check_size(addr_of!((*t).struct_size), struct_size!(TFL_Tensor, flags), self.frame.op)?;
            if rd!(t, flags) & ffi::TFL_TENSOR_UNDEFINED != 0 {
                return Ok(None);
            }
            match operand(&self.frame, t, format_args!("output {i}"))? {
                Operand::Device(v) => Ok(Some(v)),
                Operand::Host(_) => {
                    Err(Error::invalid(format!("opencl: {}: output {i} is not device memory", self.frame.op)))
                }
            }
        }
    }

    /// Output `i`, in device memory.
    pub(crate) fn output(&self, i: usize) -> Result<View<'a>> {
        self.opt_output(i)?
            .ok_or_else(|| Error::invalid(format!("opencl: {}: output {i} is undefined", self.frame.op)))
    }
}

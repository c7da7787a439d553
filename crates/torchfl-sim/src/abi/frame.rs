//! Decoding a host `TFL_CallFrame` into a borrowed
//! [`Frame`](crate::kernels::Frame).
//!
//! Kernels are the hot path, so nothing here copies or allocates what it
//! can borrow: shape, stride and list arrays stay the host's (valid for the
//! call, as the header guarantees), and error context such as `argument 2`
//! is a [`Role`], formatted only when an error is reported. The same
//! decoder serves `infer_outputs` frames, whose tensors have no data.

use std::borrow::Cow;
use std::ffi::CStr;
use std::fmt;
use std::ptr::addr_of;

use torchfl_ffi::{self as ffi, struct_size};
use torchfl_ffi::{TFL_CallFrame, TFL_Scalar, TFL_Tensor, TFL_Value};

use super::check_size;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{ArgRef, Scalar, TensorData, TensorRef};
use crate::runtime::Runtime;

/// The largest `ndim` accepted from the host.
const MAX_NDIM: i32 = 64;
/// The largest list length accepted from the host (guards against garbage).
const MAX_LIST: usize = 1 << 24;

/// Borrows a host array for the duration of the call.
///
/// `what` names the list in error messages; it is only formatted when the
/// list is rejected.
///
/// # Safety
/// When `len > 0`, `items` must be NULL or valid (and aligned) for `len`
/// reads for the lifetime `'a`, and not written during it.
pub(super) unsafe fn borrow_list<'a, T>(
    items: *const T,
    len: usize,
    what: &dyn fmt::Display,
) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if items.is_null() {
        return Err(Error::invalid(format!("sim: {what}: NULL list with {len} items")));
    }
    if len > MAX_LIST {
        return Err(Error::invalid(format!("sim: {what}: list length {len} is implausible")));
    }
    // SAFETY: non-NULL and valid for `len` reads during 'a (caller contract).
    Ok(unsafe { std::slice::from_raw_parts(items, len) })
}

/// Which tensor of a frame is being decoded, for error messages; formatted
/// only when a message is built.
#[derive(Debug, Clone, Copy)]
pub(super) enum Role {
    /// `argument {i}`
    Argument(usize),
    /// `argument {i}[{j}]`: item `j` of a tensor list.
    Item(usize, usize),
    /// `output {i}`
    Output(usize),
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Role::Argument(i) => write!(f, "argument {i}"),
            Role::Item(i, j) => write!(f, "argument {i}[{j}]"),
            Role::Output(i) => write!(f, "output {i}"),
        }
    }
}

/// # Safety
/// `s` must be a valid scalar.
unsafe fn decode_scalar(s: TFL_Scalar, op: &str) -> Result<Scalar> {
    // SAFETY: `kind` says which union member the host wrote.
    unsafe {
        match s.kind {
            ffi::TFL_SCALAR_INT => Ok(Scalar::Int(s.v.i)),
            ffi::TFL_SCALAR_FLOAT => Ok(Scalar::Float(s.v.f)),
            ffi::TFL_SCALAR_BOOL => Ok(Scalar::Bool(s.v.b != 0)),
            ffi::TFL_SCALAR_COMPLEX => {
                Err(Error::unimplemented(format!("sim: {op}: complex scalars are not supported")))
            }
            k => Err(Error::invalid(format!("sim: {op}: unknown scalar kind {k}"))),
        }
    }
}

/// Decodes a tensor descriptor; its shape and strides stay borrowed from
/// the host's arrays.
///
/// `rt` is the runtime for a kernel's frame, whose device tensors are
/// checked against its devices and whose host scalars are read; `None`
/// decodes an `infer_outputs` frame, whose tensors have no data (they
/// become [`TensorData::Meta`]) and need no runtime.
///
/// # Safety
/// `t` must be NULL or a valid `TFL_Tensor` (with its arrays and, for host
/// tensors of a kernel's frame, its data) for the lifetime `'a`.
#[inline(always)]
pub(super) unsafe fn decode_tensor<'a>(
    rt: Option<&Runtime>,
    t: *const TFL_Tensor,
    op: &str,
    role: Role,
) -> Result<TensorRef<'a>> {
    if t.is_null() {
        return Err(Error::invalid(format!("sim: {op}: {role} is a NULL tensor")));
    }
    // SAFETY: valid for the call (contract); size checked before the read.
    let t = unsafe {
        check_size(addr_of!((*t).struct_size), struct_size!(TFL_Tensor, flags), op)?;
        t.read()
    };
    let dtype = DType::from_ffi(t.dtype).ok_or_else(|| {
        Error::unimplemented(format!(
            "sim: {op}: {role} has unsupported dtype {{code {}, bits {}, lanes {}}}",
            t.dtype.code, t.dtype.bits, t.dtype.lanes
        ))
    })?;
    if !(0..=MAX_NDIM).contains(&t.ndim) {
        return Err(Error::invalid(format!("sim: {op}: {role} has ndim {}", t.ndim)));
    }
    let n = t.ndim as usize;
    // SAFETY: the header guarantees `ndim` entries in shape and strides,
    // valid and unchanged for the call ('a).
    let (shape, strides) = unsafe {
        (
            borrow_list(t.shape, n, &format_args!("{op}: {role}.shape"))?,
            borrow_list(t.strides, n, &format_args!("{op}: {role}.strides"))?,
        )
    };
    let data = match (t.device_type, rt) {
        (ffi::TFL_DEVICE_PLUGIN | ffi::TFL_DEVICE_HOST, None) => {
            if t.device_type == ffi::TFL_DEVICE_HOST && n != 0 {
                return Err(Error::invalid(format!(
                    "sim: {op}: {role}: host tensors must be 0-dim scalars, got {n} dimensions"
                )));
            }
            TensorData::Meta
        }
        (ffi::TFL_DEVICE_PLUGIN, Some(rt)) => TensorData::Device {
            device: rt.check_device(i64::from(t.device_index)).map_err(|e| {
                Error::invalid(format!("sim: {op}: {role}: {}", e.message().trim_start_matches("sim: ")))
            })?,
            ptr: t.data as usize as u64,
            byte_offset: t.byte_offset,
        },
        (ffi::TFL_DEVICE_HOST, Some(_)) => {
            if n != 0 {
                return Err(Error::invalid(format!(
                    "sim: {op}: {role}: host tensors must be 0-dim scalars, got {n} dimensions"
                )));
            }
            if t.data.is_null() {
                return Err(Error::invalid(format!("sim: {op}: {role}: host tensor data is NULL")));
            }
            let p = (t.data as usize).wrapping_add(t.byte_offset as usize);
            // SAFETY: a host 0-dim tensor holds one readable element at
            // data + byte_offset for the duration of the call.
            let value = unsafe { read_host_scalar(dtype, p) };
            if t.flags & ffi::TFL_TENSOR_WRAPPED_NUMBER != 0 {
                TensorData::WrappedNumber(value)
            } else {
                TensorData::Host(value)
            }
        }
        (d, _) => return Err(Error::invalid(format!("sim: {op}: {role}: unknown device_type {d}"))),
    };
    Ok(TensorRef { dtype, shape, strides, data })
}

/// # Safety
/// `p` must be readable for one element of `dtype` (any alignment).
unsafe fn read_host_scalar(dtype: DType, p: usize) -> Scalar {
    // SAFETY: forwarded contract; unaligned reads.
    unsafe {
        match dtype {
            DType::Bool => Scalar::Bool((p as *const u8).read() != 0),
            DType::UInt8 => Scalar::Int(i64::from((p as *const u8).read())),
            DType::Int8 => Scalar::Int(i64::from((p as *const i8).read())),
            DType::Int16 => Scalar::Int(i64::from((p as *const i16).read_unaligned())),
            DType::Int32 => Scalar::Int(i64::from((p as *const i32).read_unaligned())),
            DType::Int64 => Scalar::Int((p as *const i64).read_unaligned()),
            DType::Float16 => Scalar::Float((p as *const half::f16).read_unaligned().to_f64()),
            DType::BFloat16 => Scalar::Float((p as *const half::bf16).read_unaligned().to_f64()),
            DType::Float32 => Scalar::Float(f64::from((p as *const f32).read_unaligned())),
            DType::Float64 => Scalar::Float((p as *const f64).read_unaligned()),
        }
    }
}

/// Decodes one argument; `rt` as for [`decode_tensor`].
///
/// # Safety
/// `v` must be NULL or a valid `TFL_Value` for the lifetime `'a`.
pub(super) unsafe fn decode_value<'a>(
    rt: Option<&Runtime>,
    v: *const TFL_Value,
    op: &str,
    i: usize,
) -> Result<ArgRef<'a>> {
    if v.is_null() {
        return Err(Error::invalid(format!("sim: {op}: argument {i} is NULL")));
    }
    let role = Role::Argument(i);
    // SAFETY: valid for the call (contract); size checked before the read;
    // union members are read according to `tag`, and the pointers they
    // carry are valid for the call.
    unsafe {
        check_size(addr_of!((*v).struct_size), struct_size!(TFL_Value, u), op)?;
        let v = v.read();
        Ok(match v.tag {
            ffi::TFL_VALUE_NONE => ArgRef::None,
            ffi::TFL_VALUE_TENSOR => ArgRef::Tensor(decode_tensor(rt, v.u.tensor, op, role)?),
            ffi::TFL_VALUE_TENSOR_LIST => {
                let items = borrow_list(v.u.tensor_list.items, v.u.tensor_list.len, &op)?;
                let mut list = Vec::with_capacity(items.len());
                for (j, &t) in items.iter().enumerate() {
                    list.push(if t.is_null() {
                        None
                    } else {
                        Some(decode_tensor(rt, t, op, Role::Item(i, j))?)
                    });
                }
                ArgRef::TensorList(list)
            }
            ffi::TFL_VALUE_INT => ArgRef::Int(v.u.i),
            ffi::TFL_VALUE_FLOAT => ArgRef::Float(v.u.f),
            ffi::TFL_VALUE_BOOL => ArgRef::Bool(v.u.b != 0),
            ffi::TFL_VALUE_SCALAR => ArgRef::Scalar(decode_scalar(v.u.scalar, op)?),
            ffi::TFL_VALUE_INT_LIST => {
                ArgRef::IntList(borrow_list(v.u.int_list.items, v.u.int_list.len, &op)?)
            }
            ffi::TFL_VALUE_FLOAT_LIST => {
                ArgRef::FloatList(borrow_list(v.u.float_list.items, v.u.float_list.len, &op)?)
            }
            ffi::TFL_VALUE_BOOL_LIST => ArgRef::BoolList(Cow::Owned(
                borrow_list(v.u.bool_list.items, v.u.bool_list.len, &op)?.iter().map(|&b| b != 0).collect(),
            )),
            ffi::TFL_VALUE_STRING => {
                let bytes = borrow_list::<u8>(v.u.string.data.cast::<u8>(), v.u.string.len, &op)?;
                ArgRef::Str(String::from_utf8_lossy(bytes))
            }
            tag => {
                return Err(Error::invalid(format!(
                    "sim: {op}: argument {i} has unknown TFL_Value tag {tag}"
                )))
            }
        })
    }
}

/// Checks a frame's size and reads it.
///
/// # Safety
/// `frame` must be NULL or a valid `TFL_CallFrame` for the duration of the
/// call.
pub(super) unsafe fn read_frame(frame: *const TFL_CallFrame, name: &str) -> Result<TFL_CallFrame> {
    if frame.is_null() {
        return Err(Error::invalid(format!("sim: {name}: NULL call frame")));
    }
    // SAFETY: valid for the call (contract); size checked before the read.
    unsafe {
        check_size(addr_of!((*frame).struct_size), struct_size!(TFL_CallFrame, rng_offset), name)?;
        Ok(frame.read())
    }
}

/// The operator name for messages: the frame's `op_name` as given, or the
/// table's `name` when it is NULL (or the same).
///
/// # Safety
/// `f.op_name` must be NULL or a NUL-terminated string valid for `'f`.
pub(super) unsafe fn frame_op_name<'f>(f: &TFL_CallFrame, name: &'static str) -> Cow<'f, str> {
    if f.op_name.is_null() {
        return Cow::Borrowed(name);
    }
    // SAFETY: forwarded contract.
    let given = unsafe { CStr::from_ptr::<'f>(f.op_name) };
    if given.to_bytes() == name.as_bytes() {
        // The usual case: the table's own name, already valid UTF-8.
        Cow::Borrowed(name)
    } else {
        given.to_string_lossy()
    }
}

//! The kernels: decoding a host `TFL_CallFrame`, the exported kernel
//! symbols and the op table.

use std::ffi::CStr;
use std::ptr::{self, addr_of};
use std::sync::OnceLock;

use torchfl_ffi::{self as ffi, struct_size};
use torchfl_ffi::{TFL_CallFrame, TFL_Error, TFL_OpEntry, TFL_OpTable, TFL_Scalar, TFL_Tensor, TFL_Value};

use super::{check_size, device, guard, null_arg, runtime, stream, PROGRAMS};
use crate::error::{Error, Result};
use crate::kernels::{self, BinaryOp, Elem, Number, Operand, ProgramCache, UnaryOp, View};
use crate::runtime::{Runtime, Stream};

// ---------------------------------------------------------------------------
// Kernels: frame decoding and the op table
// ---------------------------------------------------------------------------

/// The most dimensions accepted from the host before reading shapes.
const MAX_NDIM: i32 = 64;

/// A frame's fields the kernels use.
struct Frame<'a> {
    op: &'a str,
    device: usize,
    stream: &'a Stream,
    args: &'a [*const TFL_Value],
    outputs: &'a [*mut TFL_Tensor],
}

/// # Safety
/// `frame` must be a valid call frame for the duration of `'a`.
unsafe fn read_frame<'a>(
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

/// # Safety
/// `t` must be a valid tensor descriptor for `'a`.
unsafe fn operand<'a>(f: &Frame<'_>, t: *const TFL_Tensor, what: &str) -> Result<Operand<'a>> {
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
unsafe fn value_tensor(v: *const TFL_Value) -> Option<*const TFL_Tensor> {
    // SAFETY: per the contract; the tag says which member is live.
    unsafe { (!v.is_null() && rd!(v, tag) == ffi::TFL_VALUE_TENSOR).then(|| rd!(v, u).tensor) }
}

/// # Safety
/// `v` must be a valid value for the call.
unsafe fn value_scalar(v: *const TFL_Value, op: &str) -> Result<Number> {
    // SAFETY: per the contract; the tags say which members are live.
    unsafe {
        if v.is_null() || rd!(v, tag) != ffi::TFL_VALUE_SCALAR {
            return Err(Error::invalid(format!("opencl: {op}: expected a Scalar")));
        }
        let s: TFL_Scalar = rd!(v, u).scalar;
        match s.kind {
            ffi::TFL_SCALAR_INT => Ok(Number::Int(s.v.i)),
            ffi::TFL_SCALAR_FLOAT => Ok(Number::Float(s.v.f)),
            ffi::TFL_SCALAR_BOOL => Ok(Number::Int(i64::from(s.v.b))),
            _ => Err(Error::unimplemented(format!("opencl: {op}: a complex alpha"))),
        }
    }
}

/// How an operator's arguments map onto a kernel.
#[derive(Debug, Clone, Copy)]
enum Form {
    /// `(self, other[, alpha]) -> out`; in place when out is self.
    Binary(BinaryOp, bool),
    /// `(self) -> out`; in place when out is self.
    Unary(UnaryOp),
    /// `copy_(self, src, non_blocking)`: out (self) = src.
    Copy,
    /// `fill_(self, value)`: out (self) = value.
    Fill,
    /// `zero_(self)`: out (self) = 0.
    Zero,
    /// `mm(self, mat2)` and `bmm(self, mat2)`.
    MatMul,
    /// `addmm(self, mat1, mat2, beta, alpha)`.
    AddMm,
}

impl Form {
    fn arg_count(self) -> usize {
        match self {
            Form::Binary(_, true) | Form::Copy => 3,
            Form::Binary(_, false) | Form::Fill | Form::MatMul => 2,
            Form::AddMm => 5,
            Form::Unary(_) | Form::Zero => 1,
        }
    }
}

/// Every kernel: decodes the frame by `form` and launches.
///
/// # Safety
/// `frame` must be a valid call frame.
unsafe fn run(frame: *const TFL_CallFrame, name: &str, form: Form) -> *mut TFL_Error {
    guard(name, || {
        let rt = runtime()?;
        // SAFETY: per this function's contract; everything read is borrowed
        // for the call only.
        unsafe {
            let f = read_frame(rt, frame, name)?;
            let want = form.arg_count();
            if f.args.len() != want || f.outputs.len() != 1 {
                return Err(Error::invalid(format!(
                    "opencl: {}: expected {want} arguments and 1 output, got {} and {}",
                    f.op,
                    f.args.len(),
                    f.outputs.len()
                )));
            }
            let tensor = |i: usize, what: &str| {
                value_tensor(f.args[i])
                    .ok_or_else(|| Error::invalid(format!("opencl: {}: {what} is not a tensor", f.op)))
            };
            let out = operand(&f, f.outputs[0], "the output")?;
            let programs = PROGRAMS.get_or_init(ProgramCache::default);
            let (rt, s) = (rt, f.stream);
            match form {
                Form::Binary(op, has_alpha) => {
                    let a = operand(&f, tensor(0, "self")?, "self")?;
                    let b = operand(&f, tensor(1, "other")?, "other")?;
                    let alpha = if has_alpha { value_scalar(f.args[2], f.op)? } else { Number::Int(1) };
                    kernels::binary(rt, programs, s, f.op, op, &a, &b, alpha, &out)
                }
                Form::Unary(op) => {
                    let a = operand(&f, tensor(0, "self")?, "self")?;
                    kernels::unary(rt, programs, s, f.op, op, &a, Number::Int(0), &out)
                }
                Form::Copy => {
                    let src = operand(&f, tensor(1, "src")?, "src")?;
                    kernels::unary(rt, programs, s, f.op, UnaryOp::Copy, &src, Number::Int(0), &out)
                }
                Form::Fill => {
                    let value = value_scalar(f.args[1], f.op)?;
                    kernels::unary(rt, programs, s, f.op, UnaryOp::Fill, &out, value, &out)
                }
                Form::Zero => {
                    kernels::unary(rt, programs, s, f.op, UnaryOp::Fill, &out, Number::Int(0), &out)
                }
                Form::MatMul | Form::AddMm => {
                    fn view<'v>(o: Operand<'v>, op: &str, what: &str) -> Result<View<'v>> {
                        match o {
                            Operand::Device(v) => Ok(v),
                            Operand::Host(_) => {
                                Err(Error::unimplemented(format!("opencl: {op}: {what} is a host number")))
                            }
                        }
                    }
                    let first = usize::from(matches!(form, Form::AddMm));
                    let a = view(operand(&f, tensor(first, "mat1")?, "mat1")?, f.op, "mat1")?;
                    let b = view(operand(&f, tensor(first + 1, "mat2")?, "mat2")?, f.op, "mat2")?;
                    let out = view(out, f.op, "the output")?;
                    let (c, beta, alpha) = if first == 1 {
                        let c = view(operand(&f, tensor(0, "self")?, "self")?, f.op, "self")?;
                        (Some(c), value_scalar(f.args[3], f.op)?, value_scalar(f.args[4], f.op)?)
                    } else {
                        (None, Number::Int(0), Number::Int(1))
                    };
                    kernels::gemm(rt, programs, s, f.op, a, b, c, out, alpha, beta)
                }
            }
        }
    })
}

macro_rules! kernels {
    ($($symbol:ident = $name:literal, $form:expr;)*) => {
        $(
            /// An exported kernel (`TFL_KernelFn`): `#[no_mangle]` exports
            /// it from the cdylib whatever its Rust visibility.
            ///
            /// # Safety
            /// `frame` must be a valid call frame.
            #[no_mangle]
            unsafe extern "C" fn $symbol(frame: *const TFL_CallFrame) -> *mut TFL_Error {
                // SAFETY: forwarded contract.
                unsafe { run(frame, $name, $form) }
            }
        )*

        /// The op table, one entry per kernel.
        fn op_entries() -> Vec<TFL_OpEntry> {
            vec![$(
                TFL_OpEntry {
                    struct_size: struct_size!(TFL_OpEntry, infer_outputs),
                    name: concat!($name, "\0").as_ptr().cast(),
                    symbol: concat!(stringify!($symbol), "\0").as_ptr().cast(),
                    kernel: Some($symbol),
                    flags: 0,
                    schema: ptr::null(),
                    infer_outputs: None,
                },
            )*]
        }
    };
}

use BinaryOp::{Add, Div, Mul, Sub};
use UnaryOp::{Abs, Cos, Exp, Log, Neg, Relu, Rsqrt, Sigmoid, Sin, Sqrt, Tanh};

kernels! {
    torch_fl_op_add_Tensor = "add.Tensor", Form::Binary(Add, true);
    torch_fl_op_add__Tensor = "add_.Tensor", Form::Binary(Add, true);
    torch_fl_op_sub_Tensor = "sub.Tensor", Form::Binary(Sub, true);
    torch_fl_op_sub__Tensor = "sub_.Tensor", Form::Binary(Sub, true);
    torch_fl_op_mul_Tensor = "mul.Tensor", Form::Binary(Mul, false);
    torch_fl_op_mul__Tensor = "mul_.Tensor", Form::Binary(Mul, false);
    torch_fl_op_div_Tensor = "div.Tensor", Form::Binary(Div, false);
    torch_fl_op_div__Tensor = "div_.Tensor", Form::Binary(Div, false);
    torch_fl_op_relu = "relu", Form::Unary(Relu);
    torch_fl_op_relu_ = "relu_", Form::Unary(Relu);
    torch_fl_op_neg = "neg", Form::Unary(Neg);
    torch_fl_op_abs = "abs", Form::Unary(Abs);
    torch_fl_op_exp = "exp", Form::Unary(Exp);
    torch_fl_op_log = "log", Form::Unary(Log);
    torch_fl_op_sqrt = "sqrt", Form::Unary(Sqrt);
    torch_fl_op_rsqrt = "rsqrt", Form::Unary(Rsqrt);
    torch_fl_op_sigmoid = "sigmoid", Form::Unary(Sigmoid);
    torch_fl_op_tanh = "tanh", Form::Unary(Tanh);
    torch_fl_op_sin = "sin", Form::Unary(Sin);
    torch_fl_op_cos = "cos", Form::Unary(Cos);
    torch_fl_op_copy_ = "copy_", Form::Copy;
    torch_fl_op_fill__Scalar = "fill_.Scalar", Form::Fill;
    torch_fl_op_zero_ = "zero_", Form::Zero;
    torch_fl_op_mm = "mm", Form::MatMul;
    torch_fl_op_bmm = "bmm", Form::MatMul;
    torch_fl_op_addmm = "addmm", Form::AddMm;
}

struct Table(Vec<TFL_OpEntry>);
// SAFETY: the entries point at 'static strings and functions only.
unsafe impl Sync for Table {}
// SAFETY: as above.
unsafe impl Send for Table {}
static TABLE: OnceLock<Table> = OnceLock::new();

/// # Safety
/// `out` must be NULL or a `TFL_OpTable` with `struct_size` set.
pub(super) unsafe extern "C" fn get_op_table(out: *mut TFL_OpTable) -> *mut TFL_Error {
    guard("get_op_table", || {
        if out.is_null() {
            return Err(null_arg("get_op_table", "out"));
        }
        let table = &TABLE.get_or_init(|| Table(op_entries())).0;
        // SAFETY: valid for the call; the 1.0 fields are checked to fit.
        unsafe {
            check_size(addr_of!((*out).struct_size), struct_size!(TFL_OpTable, entry_size), "get_op_table")?;
            addr_of_mut_write(out, table);
        }
        Ok(())
    })
}

/// # Safety
/// `out` must be writable for the 1.0 fields of `TFL_OpTable`.
unsafe fn addr_of_mut_write(out: *mut TFL_OpTable, table: &'static [TFL_OpEntry]) {
    // SAFETY: per the contract.
    unsafe {
        ptr::addr_of_mut!((*out).entries).write(table.as_ptr());
        ptr::addr_of_mut!((*out).num_entries).write(table.len());
        ptr::addr_of_mut!((*out).entry_size).write(std::mem::size_of::<TFL_OpEntry>());
    }
}

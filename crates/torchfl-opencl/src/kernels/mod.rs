//! Operators as OpenCL C kernels, built by the driver at first use and
//! cached per (device, build options).
//!
//! Operands arrive as [`Operand`]s: a device address (resolved through the
//! address map to a buffer and an element offset) with the shape and
//! strides the host gave, or a host number (a wrapped Python scalar). No
//! operand is assumed contiguous; broadcasting is a stride of 0.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::ptr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::cl::{self, Cl};
use crate::error::{Error, Result};
use crate::runtime::{Handle, Runtime, Stream};

/// The kernels' OpenCL C sources, each after what they share.
const BINARY_SOURCE: &str = concat!(include_str!("common.cl"), include_str!("binary.cl"));
const UNARY_SOURCE: &str = concat!(include_str!("common.cl"), include_str!("unary.cl"));

mod args;
mod conv;
mod gemm;
mod index;
mod loss;
mod norm;
mod pointwise;
mod pool;
mod positional;
mod reduce;
mod softmax;
pub(crate) use args::{enqueue, numel, Args};
pub(crate) use conv::{Conv, ConvGeom};
pub(crate) use gemm::gemm;
pub(crate) use index::{cat, embedding_dense_backward, index_select};
pub(crate) use loss::{as_nchw, as_nhw, nll_backward, nll_forward, Nll};
pub(crate) use norm::{
    batch_norm, batch_norm_backward, layer_norm, layer_norm_backward, BatchNorm, BatchNormBackward,
    LayerNorm, LayerNormBackward, NormCall, Rows,
};
pub(crate) use pointwise::{pointwise, PointwiseOp};
pub(crate) use pool::{avg_pool2d, avg_pool2d_backward, max_pool2d, max_pool2d_backward, Avg, Window};
pub(crate) use positional::{arange, triangle};
pub(crate) use reduce::{select as reduce_select, sum as reduce_sum, Selected};
pub(crate) use softmax::{softmax, softmax_backward};

/// The most dimensions a kernel takes (the `Geometry` struct's arrays).
pub(crate) const MAX_DIMS: usize = 8;

/// Element types the kernels handle. Others are UNIMPLEMENTED (the host
/// then runs the CPU kernel on copies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Elem {
    F32,
    F16,
    I64,
    /// `torch.bool`: one byte, 0 or 1 (`uchar` in the kernels, since
    /// OpenCL C has no `bool` buffers).
    Bool,
}

impl Elem {
    /// From the ABI's DLPack-style dtype.
    pub(crate) fn from_ffi(dtype: torchfl_ffi::TFL_DType) -> Option<Self> {
        match (dtype.code, dtype.bits, dtype.lanes) {
            (torchfl_ffi::TFL_DTYPE_FLOAT, 32, 1) => Some(Elem::F32),
            (torchfl_ffi::TFL_DTYPE_FLOAT, 16, 1) => Some(Elem::F16),
            (torchfl_ffi::TFL_DTYPE_INT, 64, 1) => Some(Elem::I64),
            (torchfl_ffi::TFL_DTYPE_BOOL, 8, 1) => Some(Elem::Bool),
            _ => None,
        }
    }
    /// The OpenCL C type.
    pub(crate) fn c_name(self) -> &'static str {
        match self {
            Elem::F32 => "float",
            Elem::F16 => "half",
            Elem::I64 => "long",
            Elem::Bool => "uchar",
        }
    }
    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F16 => 2,
            Elem::I64 => 8,
            Elem::Bool => 1,
        }
    }
    /// Whether the type is floating point.
    pub(crate) fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F16)
    }
}

/// A number: a Scalar argument or a wrapped host tensor's value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Number {
    Int(i64),
    Float(f64),
}

/// A tensor in device memory: its first element's address (data plus
/// byte offset), element type, shape and strides (in elements).
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    pub(crate) addr: usize,
    pub(crate) elem: Elem,
    pub(crate) shape: &'a [i64],
    pub(crate) strides: &'a [i64],
}

/// One operand of an elementwise kernel.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Operand<'a> {
    /// Device memory.
    Device(View<'a>),
    /// A host number, passed by value.
    Host(Number),
}

/// The elementwise binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl BinaryOp {
    /// The `OP(x, y, alpha)` macro's body; no spaces, since the build
    /// options are split at whitespace.
    fn expression(self) -> &'static str {
        match self {
            BinaryOp::Add => "((x)+(alpha)*(y))",
            BinaryOp::Sub => "((x)-(alpha)*(y))",
            BinaryOp::Mul => "((x)*(y))",
            BinaryOp::Div => "((x)/(y))",
            BinaryOp::Eq => "((x)==(y))",
            BinaryOp::Ne => "((x)!=(y))",
            BinaryOp::Lt => "((x)<(y))",
            BinaryOp::Le => "((x)<=(y))",
            BinaryOp::Gt => "((x)>(y))",
            BinaryOp::Ge => "((x)>=(y))",
        }
    }

    /// Comparisons compute in the operands' type, not the (bool) output's.
    fn is_comparison(self) -> bool {
        !matches!(self, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div)
    }
}

/// The `Geometry` kernel argument: sizes and per-operand strides, in
/// elements, padded to [`MAX_DIMS`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Geometry {
    size: [i64; MAX_DIMS],
    a: [i64; MAX_DIMS],
    b: [i64; MAX_DIMS],
    o: [i64; MAX_DIMS],
}

/// A built program's kernel (which holds the program: OpenCL keeps a
/// program alive while a kernel of it exists). `clSetKernelArg` on one
/// kernel object is not thread-safe, so setting arguments and enqueueing
/// happen under the lock.
#[derive(Debug)]
struct Built {
    kernel: Mutex<Handle>,
}

/// What a program is cached by: (device, kernel name, build options).
/// Kernel names are unique across the sources.
type ProgramKey = (usize, &'static str, String);

/// Programs built so far, per [`ProgramKey`].
#[derive(Debug, Default)]
pub(crate) struct ProgramCache {
    built: Mutex<HashMap<ProgramKey, Arc<Built>>>,
}

impl ProgramCache {
    fn get(
        &self,
        rt: &Runtime,
        device: usize,
        source: &str,
        kernel: &'static str,
        options: String,
    ) -> Result<Arc<Built>> {
        let key = (device, kernel, options);
        if let Some(b) = self.built.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return Ok(b.clone());
        }
        // Built outside the lock: a build takes milliseconds to seconds.
        // Two threads may build the same program once each; one is kept.
        let built = Arc::new(build(rt, device, source, kernel, &key.2)?);
        let mut cache = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(cache.entry(key).or_insert(built).clone())
    }
}

fn build(rt: &Runtime, device: usize, source: &str, kernel: &str, options: &str) -> Result<Built> {
    let cl = rt.cl;
    let dev = rt.device(device).id as cl::DeviceId;
    let text = CString::new(source).map_err(|_| Error::internal("opencl: a kernel source contains NUL"))?;
    let strings = [text.as_ptr()];
    let mut status = 0;
    // SAFETY: one NUL-terminated source string; lengths NULL.
    let program = unsafe {
        (cl.create_program_with_source)(
            rt.context as cl::Context,
            1,
            strings.as_ptr(),
            ptr::null(),
            &mut status,
        )
    };
    Cl::check(status, "clCreateProgramWithSource", kernel)?;
    let release = |program: cl::Program| {
        // SAFETY: the program was created above and is released once.
        unsafe { (cl.release_program)(program) };
    };
    let opts = CString::new(options).map_err(|_| Error::internal("opencl: build options contain NUL"))?;
    // SAFETY: one device of the program's context; no callback.
    status = unsafe { (cl.build_program)(program, 1, &dev, opts.as_ptr(), None, ptr::null_mut()) };
    if status != cl::SUCCESS {
        // SAFETY: the build log of a program of this device.
        let log = unsafe {
            let mut len = 0usize;
            (cl.get_program_build_info)(program, dev, cl::PROGRAM_BUILD_LOG, 0, ptr::null_mut(), &mut len);
            let mut buf = vec![0u8; len.max(1)];
            (cl.get_program_build_info)(
                program,
                dev,
                cl::PROGRAM_BUILD_LOG,
                buf.len(),
                buf.as_mut_ptr().cast(),
                ptr::null_mut(),
            );
            String::from_utf8_lossy(&buf).trim_end_matches('\0').trim().to_owned()
        };
        release(program);
        let e = Error::cl("clBuildProgram", format_args!("{kernel} with {options}"), status);
        return Err(Error::new(e.code(), format!("{}; build log:\n{log}", e.message())));
    }
    let name = CString::new(kernel).map_err(|_| Error::internal("opencl: a kernel name contains NUL"))?;
    // SAFETY: a built program; the name is NUL-terminated.
    let k = unsafe { (cl.create_kernel)(program, name.as_ptr(), &mut status) };
    // The kernel, if created, keeps the program alive.
    release(program);
    Cl::check(status, "clCreateKernel", kernel)?;
    Ok(Built { kernel: Mutex::new(k as Handle) })
}

/// A device operand resolved to its buffer and element offset, with its
/// strides broadcast to the output's shape.
struct Placed {
    mem: Handle,
    offset: u64,
    strides: [i64; MAX_DIMS],
}

fn place(
    rt: &Runtime,
    device: usize,
    op: &str,
    what: &str,
    view: View<'_>,
    out_shape: &[i64],
) -> Result<Placed> {
    let View { addr, elem, shape, strides } = view;
    if shape.len() > out_shape.len() || strides.len() != shape.len() {
        return Err(Error::invalid(format!(
            "opencl: {op}: {what} has {} dimensions, more than the output's {}",
            shape.len(),
            out_shape.len()
        )));
    }
    let lead = out_shape.len() - shape.len();
    let mut placed = [0i64; MAX_DIMS];
    let mut extent: i64 = 0; // the last element's offset, in elements
    for (j, (&size, &stride)) in shape.iter().zip(strides).enumerate() {
        let want = out_shape[lead + j];
        if size != want && size != 1 {
            return Err(Error::invalid(format!(
                "opencl: {op}: {what} of shape {shape:?} does not broadcast to {out_shape:?}"
            )));
        }
        if stride < 0 {
            return Err(Error::unimplemented(format!("opencl: {op}: {what} has a negative stride")));
        }
        placed[lead + j] = if size == 1 { 0 } else { stride };
        extent = extent.saturating_add((size.max(1) - 1).saturating_mul(stride));
    }
    if out_shape.contains(&0) {
        // Nothing is read or written; an empty view may even start just
        // past its allocation's end.
        return Ok(Placed { mem: 0, offset: 0, strides: placed });
    }
    let bytes = (extent as usize + 1) * elem.size();
    let (buffer, byte_offset) = rt.resolve(device, addr, bytes, &format_args!("{op}: {what}"))?;
    if byte_offset % elem.size() != 0 {
        return Err(Error::unimplemented(format!(
            "opencl: {op}: {what} starts {byte_offset} bytes into its buffer, not at a multiple of its \
             {}-byte elements",
            elem.size()
        )));
    }
    Ok(Placed { mem: buffer.mem, offset: (byte_offset / elem.size()) as u64, strides: placed })
}

/// The type an operator computes in: float for half (PyTorch's opmath:
/// half is a storage type), else the output's own.
/// Bool computes as long and is stored as `x != 0`.
pub(crate) fn compute_type(out: Elem) -> Elem {
    match out {
        Elem::F16 => Elem::F32,
        Elem::Bool => Elem::I64,
        other => other,
    }
}

/// The output and first operand of an elementwise call, checked and placed.
struct Elementwise<'v> {
    out: View<'v>,
    a: View<'v>,
    placed_o: Placed,
    placed_a: Placed,
    n: usize,
}

fn elementwise<'v>(
    rt: &Runtime,
    device: usize,
    name: &str,
    a: &Operand<'v>,
    out: &Operand<'v>,
) -> Result<Elementwise<'v>> {
    let Operand::Device(o_view) = *out else {
        return Err(Error::invalid(format!("opencl: {name}: the output is not device memory")));
    };
    let Operand::Device(a_view) = *a else {
        return Err(Error::unimplemented(format!("opencl: {name}: self is a host number")));
    };
    if o_view.shape.len() > MAX_DIMS {
        return Err(Error::unimplemented(format!(
            "opencl: {name}: {} dimensions (the kernels take at most {MAX_DIMS})",
            o_view.shape.len()
        )));
    }
    let n = usize::try_from(o_view.shape.iter().product::<i64>()).unwrap_or(0);
    let placed_o = place(rt, device, name, "the output", o_view, o_view.shape)?;
    let placed_a = place(rt, device, name, "self", a_view, o_view.shape)?;
    Ok(Elementwise { out: o_view, a: a_view, placed_o, placed_a, n })
}

/// Build options defining each `(macro, type)` and the compute type `TC`,
/// plus `USE_HALF` when some type is half (UNIMPLEMENTED on a device
/// without `cl_khr_fp16`) and `TO_BOOL` when the macro `TO` is bool (see
/// `TO_OUT` in common.cl).
pub(crate) fn type_options(
    rt: &Runtime,
    device: usize,
    name: &str,
    types: &[(&str, Elem)],
    tc: Elem,
) -> Result<String> {
    let mut options = String::new();
    for (macro_name, elem) in types {
        options.push_str(&format!("-D{macro_name}={} ", elem.c_name()));
        if *macro_name == "TO" && *elem == Elem::Bool {
            options.push_str("-DTO_BOOL ");
        }
    }
    options.push_str(&format!("-DTC={}", tc.c_name()));
    if types.iter().any(|(_, e)| *e == Elem::F16) {
        if !rt.device(device).fp16 {
            return Err(Error::unimplemented(format!("opencl: {name}: the device has no cl_khr_fp16")));
        }
        options.push_str(" -DUSE_HALF");
    }
    Ok(options)
}

/// `o = op(a, b, alpha)`, enqueued on `stream`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn binary(
    rt: &Runtime,
    cache: &ProgramCache,
    stream: &Stream,
    name: &str,
    op: BinaryOp,
    a: &Operand<'_>,
    b: &Operand<'_>,
    alpha: Number,
    out: &Operand<'_>,
) -> Result<()> {
    let device = stream.device;
    let Operand::Device(o_view) = *out else {
        return Err(Error::invalid(format!("opencl: {name}: the output is not device memory")));
    };
    if o_view.shape.len() > MAX_DIMS {
        return Err(Error::unimplemented(format!(
            "opencl: {name}: {} dimensions (the kernels take at most {MAX_DIMS})",
            o_view.shape.len()
        )));
    }
    // Either operand may be a host number (`2 * t` arrives as mul(2, t)
    // from some decompositions), not both.
    let side =
        |operand: &Operand<'_>, what: &str| -> Result<(Option<Elem>, Option<Placed>, Option<Number>)> {
            Ok(match *operand {
                Operand::Device(view) => {
                    (Some(view.elem), Some(place(rt, device, name, what, view, o_view.shape)?), None)
                }
                Operand::Host(v) => (None, None, Some(v)),
            })
        };
    let (ta, placed_a, a_value) = side(a, "self")?;
    let (tb, placed_b, b_value) = side(b, "other")?;
    let placed_o = place(rt, device, name, "the output", o_view, o_view.shape)?;
    let n = usize::try_from(o_view.shape.iter().product::<i64>()).unwrap_or(0);
    if n == 0 {
        return Ok(());
    }
    // A comparison computes in float when either side is floating (a
    // float number included, as PyTorch's promotion does), else in long.
    let float_operand = |t: Option<Elem>, v: Option<Number>| {
        t.is_some_and(Elem::is_float) || matches!(v, Some(Number::Float(_)))
    };
    let tc = if !op.is_comparison() {
        compute_type(o_view.elem)
    } else if float_operand(ta, a_value) || float_operand(tb, b_value) {
        Elem::F32
    } else {
        Elem::I64
    };
    let Some(first) = ta.or(tb) else {
        return Err(Error::unimplemented(format!("opencl: {name}: both operands are host numbers")));
    };
    let types = [("TA", ta.unwrap_or(first)), ("TB", tb.unwrap_or(first)), ("TO", o_view.elem)];
    let mut options = type_options(rt, device, name, &types, tc)?;
    options.push_str(&format!(" -DOP(x,y,alpha)={}", op.expression()));
    if a_value.is_some() {
        options.push_str(" -DA_SCALAR");
    }
    if b_value.is_some() {
        options.push_str(" -DB_SCALAR");
    }
    let built = cache.get(rt, device, BINARY_SOURCE, "binary", options)?;

    let mut geometry = Geometry::default();
    geometry.size[..o_view.shape.len()].copy_from_slice(o_view.shape);
    geometry.o = placed_o.strides;
    let (mut a_mem, mut a_off, mut b_mem, mut b_off) = (0, 0, 0, 0);
    if let Some(p) = &placed_a {
        (geometry.a, a_mem, a_off) = (p.strides, p.mem, p.offset);
    }
    if let Some(p) = &placed_b {
        (geometry.b, b_mem, b_off) = (p.strides, p.mem, p.offset);
    }
    let a_scalar = TypedNumber::new(tc, a_value.unwrap_or(Number::Int(0)));
    let b_scalar = TypedNumber::new(tc, b_value.unwrap_or(Number::Int(0)));
    let alpha = TypedNumber::new(tc, alpha);
    let (ndim, count) = (o_view.shape.len() as i32, n as u64);
    let args = [
        arg(&a_mem),
        arg(&a_off),
        a_scalar.arg(),
        arg(&b_mem),
        arg(&b_off),
        b_scalar.arg(),
        arg(&placed_o.mem),
        arg(&placed_o.offset),
        arg(&geometry),
        arg(&ndim),
        arg(&count),
        alpha.arg(),
    ];
    launch(rt, &built, stream, name, &args, n)
}

/// The elementwise unary operators, and the two that write without reading
/// an operation of their input: `copy_` (a converting, broadcasting,
/// strided copy) and `fill_`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum UnaryOp {
    Relu,
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sigmoid,
    Tanh,
    Sin,
    Cos,
    Reciprocal,
    Copy,
    Fill,
}

impl UnaryOp {
    /// The `OP(x, v)` macro's body for compute type `tc` (no spaces: the
    /// build options are split at whitespace); `None` when the operator
    /// has no integer form.
    fn expression(self, tc: Elem) -> Option<&'static str> {
        let float = tc != Elem::I64;
        Some(match self {
            // x < 0 is false for NaN, which stays NaN as in PyTorch.
            UnaryOp::Relu => "((x)<(TC)0?(TC)0:(x))",
            UnaryOp::Neg => "(-(x))",
            UnaryOp::Abs if float => "fabs(x)",
            UnaryOp::Abs => "((x)<0?-(x):(x))",
            UnaryOp::Copy => "(x)",
            UnaryOp::Fill => "(v)",
            _ if !float => return None,
            UnaryOp::Exp => "exp(x)",
            UnaryOp::Log => "log(x)",
            UnaryOp::Sqrt => "sqrt(x)",
            UnaryOp::Rsqrt => "rsqrt(x)",
            UnaryOp::Sigmoid => "(1/(1+exp(-(x))))",
            UnaryOp::Tanh => "tanh(x)",
            UnaryOp::Sin => "sin(x)",
            UnaryOp::Cos => "cos(x)",
            UnaryOp::Reciprocal => "((TC)1/(x))",
        })
    }
}

/// `o = op(a)` (for `fill_`, `o = value`), enqueued on `stream`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn unary(
    rt: &Runtime,
    cache: &ProgramCache,
    stream: &Stream,
    name: &str,
    op: UnaryOp,
    a: &Operand<'_>,
    value: Number,
    out: &Operand<'_>,
) -> Result<()> {
    let device = stream.device;
    let e = elementwise(rt, device, name, a, out)?;
    if e.n == 0 {
        return Ok(());
    }
    // A copy to bool tests the source for nonzero in the source's type
    // (0.5 is true).
    let tc =
        compute_type(if op == UnaryOp::Copy && e.out.elem == Elem::Bool { e.a.elem } else { e.out.elem });
    let expression = op.expression(tc).ok_or_else(|| {
        Error::unimplemented(format!("opencl: {name}: no integer form (PyTorch gives it a floating output)"))
    })?;
    let mut options = type_options(rt, device, name, &[("TA", e.a.elem), ("TO", e.out.elem)], tc)?;
    options.push_str(&format!(" -DOP(x,v)={expression}"));
    let built = cache.get(rt, device, UNARY_SOURCE, "unary", options)?;

    let mut geometry = Geometry::default();
    geometry.size[..e.out.shape.len()].copy_from_slice(e.out.shape);
    geometry.a = e.placed_a.strides;
    geometry.o = e.placed_o.strides;
    let value = TypedNumber::new(tc, value);
    let (ndim, count) = (e.out.shape.len() as i32, e.n as u64);
    let args = [
        arg(&e.placed_a.mem),
        arg(&e.placed_a.offset),
        arg(&e.placed_o.mem),
        arg(&e.placed_o.offset),
        arg(&geometry),
        arg(&ndim),
        arg(&count),
        value.arg(),
    ];
    launch(rt, &built, stream, name, &args, e.n)
}

/// Sets the kernel's arguments and enqueues `n` work items on `stream`.
fn launch(
    rt: &Runtime,
    built: &Built,
    stream: &Stream,
    name: &str,
    args: &[(usize, *const c_void)],
    n: usize,
) -> Result<()> {
    launch_range(rt, built, stream, name, args, &[n], None)
}

/// Sets the kernel's arguments and enqueues the range `global` (in work
/// groups of `local`, or of the driver's choice) on `stream`, under the
/// kernel's lock (`clSetKernelArg` is not thread-safe on one kernel object).
fn launch_range(
    rt: &Runtime,
    built: &Built,
    stream: &Stream,
    name: &str,
    args: &[(usize, *const c_void)],
    global: &[usize],
    local: Option<&[usize]>,
) -> Result<()> {
    let cl = rt.cl;
    let kernel = built.kernel.lock().unwrap_or_else(PoisonError::into_inner);
    let k = *kernel as cl::Kernel;
    for (i, (size, value)) in args.iter().enumerate() {
        // SAFETY: each value outlives this call and has the size of the
        // kernel's parameter `i` (binary.cl, unary.cl, gemm.cl; `Args`
        // for the others).
        let status = unsafe { (cl.set_kernel_arg)(k, i as u32, *size, *value) };
        Cl::check(status, "clSetKernelArg", name)?;
    }
    stream.submitted();
    // SAFETY: every argument is set; `global` (and `local`, when given)
    // has one entry per dimension of the range.
    let status = unsafe {
        (cl.enqueue_nd_range_kernel)(
            stream.queue as cl::Queue,
            k,
            global.len() as u32,
            ptr::null(),
            global.as_ptr(),
            local.map_or(ptr::null(), <[usize]>::as_ptr),
            0,
            ptr::null(),
            ptr::null_mut(),
        )
    };
    Cl::check(status, "clEnqueueNDRangeKernel", name)
}

fn arg<T>(value: &T) -> (usize, *const c_void) {
    (std::mem::size_of::<T>(), (value as *const T).cast())
}

/// A number converted to a kernel's compute type, for a by-value argument.
enum TypedNumber {
    F32(f32),
    F16(u16),
    I64(i64),
}

impl TypedNumber {
    fn new(elem: Elem, v: Number) -> Self {
        let f = match v {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        };
        match elem {
            Elem::F32 => TypedNumber::F32(f as f32),
            Elem::F16 => TypedNumber::F16(f32_to_f16(f as f32)),
            Elem::I64 => TypedNumber::I64(match v {
                Number::Int(i) => i,
                Number::Float(f) => f as i64,
            }),
            Elem::Bool => TypedNumber::I64(i64::from(f != 0.0)),
        }
    }
    fn arg(&self) -> (usize, *const c_void) {
        match self {
            TypedNumber::F32(v) => arg(v),
            TypedNumber::F16(v) => arg(v),
            TypedNumber::I64(v) => arg(v),
        }
    }
}

/// IEEE half from single, rounding to nearest even (for by-value `half`
/// arguments; OpenCL has no host-side half type).
fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = (mant | 0x80_0000) >> (1 - e);
        let round = (m & 0x1fff) > 0x1000 || ((m & 0x1fff) == 0x1000 && (m & 0x2000) != 0);
        return sign | ((m >> 13) as u16 + u16::from(round));
    }
    let round = (mant & 0x1fff) > 0x1000 || ((mant & 0x1fff) == 0x1000 && (mant & 0x2000) != 0);
    let h = ((e as u32) << 10) | (mant >> 13);
    sign | (h as u16).wrapping_add(u16::from(round))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversion_rounds_to_nearest_even() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert_eq!(f32_to_f16(0.5), 0x3800);
        assert_eq!(f32_to_f16(f32::NAN) & 0x7c00, 0x7c00);
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001); // the smallest subnormal
    }

    #[test]
    fn the_geometry_struct_is_what_the_kernel_expects() {
        assert_eq!(std::mem::size_of::<Geometry>(), 4 * MAX_DIMS * 8);
    }
}

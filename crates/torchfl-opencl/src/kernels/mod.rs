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

use crate::activity::{Site, Work, RECORDER};
use crate::cl::{self, Cl};
use crate::error::{Error, Result};
use crate::runtime::{Handle, Runtime, Stream};

mod args;
mod conv;
mod elementwise;
mod gemm;
mod index;
mod loss;
mod norm;
mod pointwise;
mod pool;
mod positional;
mod reduce;
mod softmax;
pub(crate) use args::{enqueue, numel, work_items, Args};
pub(crate) use conv::{Conv, ConvGeom};
pub(crate) use elementwise::{binary, unary, BinaryOp, UnaryOp};
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

/// A built program's kernel (which holds the program: OpenCL keeps a
/// program alive while a kernel of it exists). `clSetKernelArg` on one
/// kernel object is not thread-safe, so setting arguments and enqueueing
/// happen under the lock.
#[derive(Debug)]
struct Built {
    kernel: Mutex<Handle>,
    /// The kernel function's name, for activity records.
    name: &'static str,
}

/// Where a kernel call runs: the runtime, the built programs, the stream
/// (and with it the device) and the operator's name for messages. Every
/// operator family's launch function takes one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch<'a> {
    /// The runtime.
    pub(crate) rt: &'a Runtime,
    /// Built programs.
    pub(crate) cache: &'a ProgramCache,
    /// The stream to enqueue on.
    pub(crate) stream: &'a Stream,
    /// The operator, for messages.
    pub(crate) op: &'a str,
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

fn build(rt: &Runtime, device: usize, source: &str, kernel: &'static str, options: &str) -> Result<Built> {
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
    status = RECORDER.build(
        Site { call: "clBuildProgram", device, stream: 0, detail: format_args!("{kernel} {options}") },
        || {
            // SAFETY: one device of the program's context; no callback.
            unsafe { (cl.build_program)(program, 1, &dev, opts.as_ptr(), None, ptr::null_mut()) }
        },
    );
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
    Ok(Built { kernel: Mutex::new(k as Handle), name: kernel })
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
    let (kernel_name, local_size) = (built.name, LocalSize(local));
    let status = RECORDER.enqueue(
        cl,
        Site {
            call: "clEnqueueNDRangeKernel",
            device: stream.device,
            stream: stream.handle(),
            detail: format_args!("{kernel_name} global={global:?} local={local_size}"),
        },
        Work {
            kind: torchfl_ffi::TFL_ACTIVITY_KERNEL,
            name: kernel_name,
            detail: format_args!("{name} global={global:?} local={local_size}"),
        },
        |event| {
            // SAFETY: every argument is set; `global` (and `local`, when given)
            // has one entry per dimension of the range; `event` is NULL or
            // writable.
            unsafe {
                (cl.enqueue_nd_range_kernel)(
                    stream.queue as cl::Queue,
                    k,
                    global.len() as u32,
                    ptr::null(),
                    global.as_ptr(),
                    local.map_or(ptr::null(), <[usize]>::as_ptr),
                    0,
                    ptr::null(),
                    event,
                )
            }
        },
    );
    Cl::check(status, "clEnqueueNDRangeKernel", name)
}

/// A work-group size for a record's detail: `[16, 16, 1]`, or `auto` when
/// the driver chooses.
struct LocalSize<'a>(Option<&'a [usize]>);

impl std::fmt::Display for LocalSize<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(local) => write!(f, "{local:?}"),
            None => f.write_str("auto"),
        }
    }
}

fn arg<T>(value: &T) -> (usize, *const c_void) {
    (std::mem::size_of::<T>(), (value as *const T).cast())
}

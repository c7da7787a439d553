//! The OpenCL API, opened at run time: the crate's one FFI module toward
//! the driver.
//!
//! `libOpenCL.so.1` is the ICD loader every OpenCL installation provides;
//! it dispatches to the installed drivers (PoCL, Intel's, ROCm's, Mali's).
//! Opening it with `dlopen` instead of linking it means the plugin loads on
//! a machine without any OpenCL, and says so in `initialize`, instead of
//! failing to load with a linker error that names no remedy.
//! `TORCH_FL_OPENCL_LIBRARY` names another loader or a driver library.
//!
//! Only the OpenCL 1.2 entries the plugin uses are declared (and one
//! optional 2.1 entry, `clGetDeviceAndHostTimer`), with the types of
//! `CL/cl.h`; [`Cl::check`] turns a status into an [`Error`] that
//! names the call and the CL error.

use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// `cl_int`.
pub type ClInt = i32;
/// `cl_uint`.
pub type ClUint = u32;
/// `cl_bitfield` and its aliases (`cl_device_type`, `cl_mem_flags`, ...).
pub type ClBitfield = u64;

macro_rules! opaque {
    ($($name:ident),*) => {$(
        /// An OpenCL object handle (`*_id` or `cl_*`), owned per the CL rules.
        pub type $name = *mut c_void;
    )*};
}
opaque!(PlatformId, DeviceId, Context, Queue, Mem, Program, Kernel, Event);

/// `CL_SUCCESS`.
pub const SUCCESS: ClInt = 0;
/// `CL_COMPLETE`, an event's final execution status.
pub const COMPLETE: ClInt = 0;
/// `CL_TRUE`.
pub const TRUE: ClUint = 1;
/// `CL_DEVICE_TYPE_ALL`.
pub const DEVICE_TYPE_ALL: ClBitfield = 0xFFFF_FFFF;
/// `CL_MEM_READ_WRITE`.
pub const MEM_READ_WRITE: ClBitfield = 1;
/// `CL_QUEUE_PROFILING_ENABLE`.
pub const QUEUE_PROFILING_ENABLE: ClBitfield = 1 << 1;

/// `clGetPlatformInfo` names.
pub const PLATFORM_NAME: ClUint = 0x0902;
/// `clGetDeviceInfo` names.
pub const DEVICE_MAX_COMPUTE_UNITS: ClUint = 0x1002;
/// `CL_DEVICE_MAX_MEM_ALLOC_SIZE`.
pub const DEVICE_MAX_MEM_ALLOC_SIZE: ClUint = 0x1010;
/// `CL_DEVICE_MEM_BASE_ADDR_ALIGN` (in bits).
pub const DEVICE_MEM_BASE_ADDR_ALIGN: ClUint = 0x1019;
/// `CL_DEVICE_GLOBAL_MEM_SIZE`.
pub const DEVICE_GLOBAL_MEM_SIZE: ClUint = 0x101F;
/// `CL_DEVICE_NAME`.
pub const DEVICE_NAME: ClUint = 0x102B;
/// `CL_DEVICE_VERSION`.
pub const DEVICE_VERSION: ClUint = 0x102F;
/// `CL_DEVICE_EXTENSIONS`.
pub const DEVICE_EXTENSIONS: ClUint = 0x1030;
/// `CL_EVENT_COMMAND_EXECUTION_STATUS`.
pub const EVENT_COMMAND_EXECUTION_STATUS: ClUint = 0x11D3;
/// `CL_PROFILING_COMMAND_START`.
pub const PROFILING_COMMAND_START: ClUint = 0x1282;
/// `CL_PROFILING_COMMAND_END`.
pub const PROFILING_COMMAND_END: ClUint = 0x1283;
/// `CL_PROGRAM_BUILD_LOG`.
pub const PROGRAM_BUILD_LOG: ClUint = 0x1183;

type InfoFn<T> = unsafe extern "C" fn(T, ClUint, usize, *mut c_void, *mut usize) -> ClInt;

/// The entry points, resolved from the loader. Each field is the C function
/// of the same name; their contracts are OpenCL's.
#[allow(clippy::type_complexity)]
#[derive(Debug)]
pub struct Cl {
    _library: libloading::Library,
    /// `clGetPlatformIDs`.
    pub get_platform_ids: unsafe extern "C" fn(ClUint, *mut PlatformId, *mut ClUint) -> ClInt,
    /// `clGetPlatformInfo`.
    pub get_platform_info: InfoFn<PlatformId>,
    /// `clGetDeviceIDs`.
    pub get_device_ids:
        unsafe extern "C" fn(PlatformId, ClBitfield, ClUint, *mut DeviceId, *mut ClUint) -> ClInt,
    /// `clGetDeviceInfo`.
    pub get_device_info: InfoFn<DeviceId>,
    /// `clCreateContext`.
    pub create_context: unsafe extern "C" fn(
        *const isize,
        ClUint,
        *const DeviceId,
        Option<unsafe extern "C" fn(*const c_char, *const c_void, usize, *mut c_void)>,
        *mut c_void,
        *mut ClInt,
    ) -> Context,
    /// `clCreateCommandQueue` (OpenCL 1.2's; deprecated, not removed, in
    /// 2.0 and 3.0, and the one every 1.2 device has).
    pub create_command_queue: unsafe extern "C" fn(Context, DeviceId, ClBitfield, *mut ClInt) -> Queue,
    /// `clReleaseCommandQueue`.
    pub release_command_queue: unsafe extern "C" fn(Queue) -> ClInt,
    /// `clFlush`.
    pub flush: unsafe extern "C" fn(Queue) -> ClInt,
    /// `clFinish`.
    pub finish: unsafe extern "C" fn(Queue) -> ClInt,
    /// `clCreateBuffer`.
    pub create_buffer: unsafe extern "C" fn(Context, ClBitfield, usize, *mut c_void, *mut ClInt) -> Mem,
    /// `clReleaseMemObject`: the buffer is deleted once queued commands
    /// that use it have finished, which makes `deallocate` stream-ordered.
    pub release_mem_object: unsafe extern "C" fn(Mem) -> ClInt,
    /// `clEnqueueReadBuffer`.
    pub enqueue_read_buffer: unsafe extern "C" fn(
        Queue,
        Mem,
        ClUint,
        usize,
        usize,
        *mut c_void,
        ClUint,
        *const Event,
        *mut Event,
    ) -> ClInt,
    /// `clEnqueueWriteBuffer`.
    pub enqueue_write_buffer: unsafe extern "C" fn(
        Queue,
        Mem,
        ClUint,
        usize,
        usize,
        *const c_void,
        ClUint,
        *const Event,
        *mut Event,
    ) -> ClInt,
    /// `clEnqueueCopyBuffer`.
    pub enqueue_copy_buffer:
        unsafe extern "C" fn(Queue, Mem, Mem, usize, usize, usize, ClUint, *const Event, *mut Event) -> ClInt,
    /// `clEnqueueFillBuffer`.
    pub enqueue_fill_buffer: unsafe extern "C" fn(
        Queue,
        Mem,
        *const c_void,
        usize,
        usize,
        usize,
        ClUint,
        *const Event,
        *mut Event,
    ) -> ClInt,
    /// `clEnqueueMarkerWithWaitList`.
    pub enqueue_marker_with_wait_list: unsafe extern "C" fn(Queue, ClUint, *const Event, *mut Event) -> ClInt,
    /// `clEnqueueBarrierWithWaitList`.
    pub enqueue_barrier_with_wait_list:
        unsafe extern "C" fn(Queue, ClUint, *const Event, *mut Event) -> ClInt,
    /// `clWaitForEvents`.
    pub wait_for_events: unsafe extern "C" fn(ClUint, *const Event) -> ClInt,
    /// `clGetEventInfo`.
    pub get_event_info: InfoFn<Event>,
    /// `clGetEventProfilingInfo`.
    pub get_event_profiling_info: InfoFn<Event>,
    /// `clReleaseEvent`.
    pub release_event: unsafe extern "C" fn(Event) -> ClInt,
    /// `clCreateProgramWithSource`.
    pub create_program_with_source:
        unsafe extern "C" fn(Context, ClUint, *const *const c_char, *const usize, *mut ClInt) -> Program,
    /// `clBuildProgram`.
    pub build_program: unsafe extern "C" fn(
        Program,
        ClUint,
        *const DeviceId,
        *const c_char,
        Option<unsafe extern "C" fn(Program, *mut c_void)>,
        *mut c_void,
    ) -> ClInt,
    /// `clGetProgramBuildInfo`.
    pub get_program_build_info:
        unsafe extern "C" fn(Program, DeviceId, ClUint, usize, *mut c_void, *mut usize) -> ClInt,
    /// `clReleaseProgram`.
    pub release_program: unsafe extern "C" fn(Program) -> ClInt,
    /// `clCreateKernel`.
    pub create_kernel: unsafe extern "C" fn(Program, *const c_char, *mut ClInt) -> Kernel,
    /// `clSetKernelArg`.
    pub set_kernel_arg: unsafe extern "C" fn(Kernel, ClUint, usize, *const c_void) -> ClInt,
    /// `clEnqueueNDRangeKernel`.
    pub enqueue_nd_range_kernel: unsafe extern "C" fn(
        Queue,
        Kernel,
        ClUint,
        *const usize,
        *const usize,
        *const usize,
        ClUint,
        *const Event,
        *mut Event,
    ) -> ClInt,
    /// `clReleaseKernel`.
    pub release_kernel: unsafe extern "C" fn(Kernel) -> ClInt,
    /// `clGetDeviceAndHostTimer` (OpenCL 2.1): `None` when the loader lacks
    /// it. A driver without a host timer (PoCL 3) returns
    /// `CL_INVALID_OPERATION` from it.
    pub get_device_and_host_timer: Option<unsafe extern "C" fn(DeviceId, *mut u64, *mut u64) -> ClInt>,
}

/// Library names tried in order when `TORCH_FL_OPENCL_LIBRARY` is unset.
const LIBRARIES: &[&str] = &["libOpenCL.so.1", "libOpenCL.so"];

static CL: OnceLock<std::result::Result<Cl, String>> = OnceLock::new();

impl Cl {
    /// The process-wide OpenCL entry points, opened on first use. The error
    /// says what to install.
    pub fn get() -> Result<&'static Cl> {
        CL.get_or_init(Self::open).as_ref().map_err(|e| Error::precondition(e.clone()))
    }

    fn open() -> std::result::Result<Cl, String> {
        let names: Vec<String> = match std::env::var("TORCH_FL_OPENCL_LIBRARY") {
            Ok(path) if !path.is_empty() => vec![path],
            _ => LIBRARIES.iter().map(|s| (*s).to_owned()).collect(),
        };
        let mut tried = Vec::new();
        for name in &names {
            // SAFETY: loading the OpenCL ICD loader runs its initializers,
            // which only register the installed drivers.
            match unsafe { libloading::Library::new(name) } {
                Ok(library) => return Self::resolve(library).map_err(|e| format!("opencl: {name}: {e}")),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(format!(
            "opencl: no OpenCL driver: cannot open the OpenCL loader ({}). Install an OpenCL \
             runtime: on Debian or Ubuntu `apt install ocl-icd-libopencl1 pocl-opencl-icd` (PoCL, \
             OpenCL on the CPU) or your GPU vendor's driver, or set TORCH_FL_OPENCL_LIBRARY to the \
             library's path",
            tried.join("; ")
        ))
    }

    fn resolve(library: libloading::Library) -> std::result::Result<Cl, String> {
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol is the OpenCL 1.2 function of that name,
                // and the field it is stored in has its C signature.
                let f = unsafe { library.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("the library lacks {}: {e} (is it an OpenCL 1.2 loader?)", $name))?;
                *f
            }};
        }
        Ok(Cl {
            get_platform_ids: sym!("clGetPlatformIDs"),
            get_platform_info: sym!("clGetPlatformInfo"),
            get_device_ids: sym!("clGetDeviceIDs"),
            get_device_info: sym!("clGetDeviceInfo"),
            create_context: sym!("clCreateContext"),
            create_command_queue: sym!("clCreateCommandQueue"),
            release_command_queue: sym!("clReleaseCommandQueue"),
            flush: sym!("clFlush"),
            finish: sym!("clFinish"),
            create_buffer: sym!("clCreateBuffer"),
            release_mem_object: sym!("clReleaseMemObject"),
            enqueue_read_buffer: sym!("clEnqueueReadBuffer"),
            enqueue_write_buffer: sym!("clEnqueueWriteBuffer"),
            enqueue_copy_buffer: sym!("clEnqueueCopyBuffer"),
            enqueue_fill_buffer: sym!("clEnqueueFillBuffer"),
            enqueue_marker_with_wait_list: sym!("clEnqueueMarkerWithWaitList"),
            enqueue_barrier_with_wait_list: sym!("clEnqueueBarrierWithWaitList"),
            wait_for_events: sym!("clWaitForEvents"),
            get_event_info: sym!("clGetEventInfo"),
            get_event_profiling_info: sym!("clGetEventProfilingInfo"),
            release_event: sym!("clReleaseEvent"),
            create_program_with_source: sym!("clCreateProgramWithSource"),
            build_program: sym!("clBuildProgram"),
            get_program_build_info: sym!("clGetProgramBuildInfo"),
            release_program: sym!("clReleaseProgram"),
            create_kernel: sym!("clCreateKernel"),
            set_kernel_arg: sym!("clSetKernelArg"),
            enqueue_nd_range_kernel: sym!("clEnqueueNDRangeKernel"),
            release_kernel: sym!("clReleaseKernel"),
            // SAFETY: the symbol, where the loader has it, is the OpenCL 2.1
            // function of that name, and the field has its C signature.
            get_device_and_host_timer: unsafe { library.get(b"clGetDeviceAndHostTimer\0") }.ok().map(|f| *f),
            _library: library,
        })
    }

    /// `Ok` for `CL_SUCCESS`, otherwise the error naming `call`, `context`
    /// and the status. `context` is formatted only for an error: copies and
    /// kernel launches pass `format_args!` and allocate nothing on success.
    pub fn check(status: ClInt, call: &str, context: impl std::fmt::Display) -> Result<()> {
        if status == SUCCESS {
            Ok(())
        } else {
            Err(Error::cl(call, context, status))
        }
    }

    /// A string parameter of a platform or device (`clGet*Info`).
    ///
    /// # Safety
    /// `object` must be a valid object for `info`.
    pub unsafe fn info_string<T: Copy>(
        info: InfoFn<T>,
        object: T,
        name: ClUint,
        call: &str,
    ) -> Result<String> {
        let mut len = 0usize;
        // SAFETY: a size query writes only `len`.
        Self::check(unsafe { info(object, name, 0, std::ptr::null_mut(), &mut len) }, call, "size")?;
        let mut buf = vec![0u8; len.max(1)];
        // SAFETY: `buf` holds `len` bytes.
        let status = unsafe { info(object, name, buf.len(), buf.as_mut_ptr().cast(), std::ptr::null_mut()) };
        Self::check(status, call, "")?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim().to_owned())
    }

    /// A fixed-size parameter (`cl_ulong`, `cl_uint`) of an object.
    ///
    /// # Safety
    /// `object` must be a valid object for `info`, and `name` a parameter
    /// of exactly `size_of::<V>()` bytes.
    pub unsafe fn info_value<T: Copy, V: Copy + Default>(
        info: InfoFn<T>,
        object: T,
        name: ClUint,
        call: &str,
    ) -> Result<V> {
        let mut value = V::default();
        // SAFETY: `value` has the parameter's size (caller contract).
        let status = unsafe {
            info(object, name, std::mem::size_of::<V>(), (&mut value as *mut V).cast(), std::ptr::null_mut())
        };
        Self::check(status, call, "")?;
        Ok(value)
    }
}

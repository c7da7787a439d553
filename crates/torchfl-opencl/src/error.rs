//! The crate's error type: an ABI error code and a message that starts with
//! `opencl:` and, for a failed OpenCL call, names the call and the CL error
//! (`opencl: clEnqueueNDRangeKernel (add.Tensor): CL_INVALID_KERNEL_ARGS
//! (-52)`), so a user can search for it in the driver's documentation.

use std::fmt;

use torchfl_ffi as ffi;

/// An error with its `TFL_ErrorCode` and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    code: ffi::TFL_ErrorCode,
    message: String,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with `code` and `message`, used as given.
    pub fn new(code: ffi::TFL_ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
    /// `INVALID_ARGUMENT`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ffi::TFL_ERROR_INVALID_ARGUMENT, message)
    }
    /// `UNIMPLEMENTED`: the host falls back to its CPU implementation.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(ffi::TFL_ERROR_UNIMPLEMENTED, message)
    }
    /// `FAILED_PRECONDITION`.
    pub fn precondition(message: impl Into<String>) -> Self {
        Self::new(ffi::TFL_ERROR_FAILED_PRECONDITION, message)
    }
    /// `OUT_OF_MEMORY`.
    pub fn out_of_memory(message: impl Into<String>) -> Self {
        Self::new(ffi::TFL_ERROR_OUT_OF_MEMORY, message)
    }
    /// `INTERNAL`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ffi::TFL_ERROR_INTERNAL, message)
    }

    /// The error of an OpenCL call that returned `status`: the call and
    /// what it was for (`context`) and the CL error's name. Allocation
    /// failures are the ABI's `OUT_OF_MEMORY`, a lost device `DEVICE_LOST`.
    pub fn cl(call: &str, context: impl fmt::Display, status: i32) -> Self {
        let code = match status {
            -6..=-4 => ffi::TFL_ERROR_OUT_OF_MEMORY,
            -14 => ffi::TFL_ERROR_DEVICE_LOST,
            -72..=-30 => ffi::TFL_ERROR_INVALID_ARGUMENT,
            _ => ffi::TFL_ERROR_INTERNAL,
        };
        let context = context.to_string();
        let context = if context.is_empty() { context } else { format!(" ({context})") };
        Self::new(code, format!("opencl: {call}{context}: {} ({status})", cl_error_name(status)))
    }

    /// The `TFL_ErrorCode`.
    pub fn code(&self) -> ffi::TFL_ErrorCode {
        self.code
    }
    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// A caught panic as an `INTERNAL` error.
    pub(crate) fn from_panic(context: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        let what = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_owned()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "unknown panic payload".to_owned()
        };
        Self::internal(format!("opencl: internal error in {context}: {what}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The name of an OpenCL status code, as `cl.h` spells it.
pub fn cl_error_name(status: i32) -> &'static str {
    match status {
        0 => "CL_SUCCESS",
        -1 => "CL_DEVICE_NOT_FOUND",
        -2 => "CL_DEVICE_NOT_AVAILABLE",
        -3 => "CL_COMPILER_NOT_AVAILABLE",
        -4 => "CL_MEM_OBJECT_ALLOCATION_FAILURE",
        -5 => "CL_OUT_OF_RESOURCES",
        -6 => "CL_OUT_OF_HOST_MEMORY",
        -7 => "CL_PROFILING_INFO_NOT_AVAILABLE",
        -8 => "CL_MEM_COPY_OVERLAP",
        -9 => "CL_IMAGE_FORMAT_MISMATCH",
        -10 => "CL_IMAGE_FORMAT_NOT_SUPPORTED",
        -11 => "CL_BUILD_PROGRAM_FAILURE",
        -12 => "CL_MAP_FAILURE",
        -13 => "CL_MISALIGNED_SUB_BUFFER_OFFSET",
        -14 => "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
        -15 => "CL_COMPILE_PROGRAM_FAILURE",
        -16 => "CL_LINKER_NOT_AVAILABLE",
        -17 => "CL_LINK_PROGRAM_FAILURE",
        -18 => "CL_DEVICE_PARTITION_FAILED",
        -19 => "CL_KERNEL_ARG_INFO_NOT_AVAILABLE",
        -30 => "CL_INVALID_VALUE",
        -31 => "CL_INVALID_DEVICE_TYPE",
        -32 => "CL_INVALID_PLATFORM",
        -33 => "CL_INVALID_DEVICE",
        -34 => "CL_INVALID_CONTEXT",
        -35 => "CL_INVALID_QUEUE_PROPERTIES",
        -36 => "CL_INVALID_COMMAND_QUEUE",
        -37 => "CL_INVALID_HOST_PTR",
        -38 => "CL_INVALID_MEM_OBJECT",
        -39 => "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR",
        -40 => "CL_INVALID_IMAGE_SIZE",
        -41 => "CL_INVALID_SAMPLER",
        -42 => "CL_INVALID_BINARY",
        -43 => "CL_INVALID_BUILD_OPTIONS",
        -44 => "CL_INVALID_PROGRAM",
        -45 => "CL_INVALID_PROGRAM_EXECUTABLE",
        -46 => "CL_INVALID_KERNEL_NAME",
        -47 => "CL_INVALID_KERNEL_DEFINITION",
        -48 => "CL_INVALID_KERNEL",
        -49 => "CL_INVALID_ARG_INDEX",
        -50 => "CL_INVALID_ARG_VALUE",
        -51 => "CL_INVALID_ARG_SIZE",
        -52 => "CL_INVALID_KERNEL_ARGS",
        -53 => "CL_INVALID_WORK_DIMENSION",
        -54 => "CL_INVALID_WORK_GROUP_SIZE",
        -55 => "CL_INVALID_WORK_ITEM_SIZE",
        -56 => "CL_INVALID_GLOBAL_OFFSET",
        -57 => "CL_INVALID_EVENT_WAIT_LIST",
        -58 => "CL_INVALID_EVENT",
        -59 => "CL_INVALID_OPERATION",
        -60 => "CL_INVALID_GL_OBJECT",
        -61 => "CL_INVALID_BUFFER_SIZE",
        -62 => "CL_INVALID_MIP_LEVEL",
        -63 => "CL_INVALID_GLOBAL_WORK_SIZE",
        -64 => "CL_INVALID_PROPERTY",
        -65 => "CL_INVALID_IMAGE_DESCRIPTOR",
        -66 => "CL_INVALID_COMPILER_OPTIONS",
        -67 => "CL_INVALID_LINKER_OPTIONS",
        -68 => "CL_INVALID_DEVICE_PARTITION_COUNT",
        -69 => "CL_INVALID_PIPE_SIZE",
        -70 => "CL_INVALID_DEVICE_QUEUE",
        -71 => "CL_INVALID_SPEC_ID",
        -72 => "CL_MAX_SIZE_RESTRICTION_EXCEEDED",
        -1001 => "CL_PLATFORM_NOT_FOUND_KHR",
        _ => "an unknown CL error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cl_error_names_the_call_and_the_code() {
        let e = Error::cl("clEnqueueNDRangeKernel", "add.Tensor", -52);
        assert_eq!(e.message(), "opencl: clEnqueueNDRangeKernel (add.Tensor): CL_INVALID_KERNEL_ARGS (-52)");
        assert_eq!(e.code(), ffi::TFL_ERROR_INVALID_ARGUMENT);
        assert_eq!(Error::cl("clCreateBuffer", "", -4).code(), ffi::TFL_ERROR_OUT_OF_MEMORY);
        assert_eq!(
            Error::cl("clFinish", "", -9999).message(),
            "opencl: clFinish: an unknown CL error (-9999)"
        );
    }
}

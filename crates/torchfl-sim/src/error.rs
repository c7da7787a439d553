//! The crate's error type: a [`ErrorCode`] from the ABI plus a message.
//!
//! Every fallible operation of the runtime returns [`Result`]; the ABI layer
//! turns an [`Error`] into a heap-allocated `TFL_Error` only at the boundary,
//! so the rest of the crate never deals with raw error objects.

use std::fmt;

use torchfl_ffi as ffi;

/// The ABI error codes the simulator produces (`TFL_ErrorCode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// `TFL_ERROR_INVALID_ARGUMENT`: a bad pointer, device, shape, option...
    InvalidArgument,
    /// `TFL_ERROR_OUT_OF_MEMORY`: the device's capacity would be exceeded.
    OutOfMemory,
    /// `TFL_ERROR_UNIMPLEMENTED`: an unsupported dtype or argument
    /// combination; the host falls back to its CPU implementation.
    Unimplemented,
    /// `TFL_ERROR_INTERNAL`: a bug in the simulator (a caught panic).
    Internal,
    /// `TFL_ERROR_FAILED_PRECONDITION`: valid call, wrong state.
    FailedPrecondition,
}

impl ErrorCode {
    /// The numeric `TFL_ErrorCode` value.
    pub fn to_ffi(self) -> ffi::TFL_ErrorCode {
        match self {
            ErrorCode::InvalidArgument => ffi::TFL_ERROR_INVALID_ARGUMENT,
            ErrorCode::OutOfMemory => ffi::TFL_ERROR_OUT_OF_MEMORY,
            ErrorCode::Unimplemented => ffi::TFL_ERROR_UNIMPLEMENTED,
            ErrorCode::Internal => ffi::TFL_ERROR_INTERNAL,
            ErrorCode::FailedPrecondition => ffi::TFL_ERROR_FAILED_PRECONDITION,
        }
    }
}

/// An error with its ABI code and a human-readable message. Messages start
/// with `"sim: "` so that users can tell which plugin produced them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
}

/// `Result` with the simulator's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with `code`; `message` is used as given.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
    /// `INVALID_ARGUMENT`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }
    /// `FAILED_PRECONDITION`.
    pub fn precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::FailedPrecondition, message)
    }
    /// `UNIMPLEMENTED`.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unimplemented, message)
    }
    /// `INTERNAL`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
    /// `OUT_OF_MEMORY`.
    pub fn out_of_memory(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::OutOfMemory, message)
    }
    /// The error's code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }
    /// The error's message.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// Turns a caught panic payload into an `INTERNAL` error.
    pub(crate) fn from_panic(context: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        let what = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_owned()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "unknown panic payload".to_owned()
        };
        Self::internal(format!("sim: internal error in {context}: {what}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?})", self.message, self.code)
    }
}

impl std::error::Error for Error {}

//! Softmax and log-softmax, forward and backward (`kernels::softmax`).

use super::reduce::wrap_dim;
use crate::abi::frame::Call;
use crate::error::{Error, Result};
use crate::kernels::{softmax as softmax_kernel, softmax_backward, Elem};

fn forward(c: &Call<'_>, log: bool) -> Result<()> {
    c.expect(3, 1)?;
    let (x, out) = (c.tensor(0)?, c.output(0)?);
    let dim = wrap_dim(c.op(), c.int(1)?, x.shape.len())?;
    if c.bool(2)? && (x.elem != Elem::F16 || out.elem != Elem::F32) {
        return Err(Error::invalid(format!(
            "opencl: {}: conversion from {} to float is only supported for half",
            c.op(),
            x.elem.c_name()
        )));
    }
    softmax_kernel(&c.launch(), &x, &out, dim, log)
}

/// `_softmax(Tensor self, int dim, bool half_to_float)`.
pub(in crate::abi) fn softmax(c: &Call<'_>) -> Result<()> {
    forward(c, false)
}

/// `_log_softmax(Tensor self, int dim, bool half_to_float)`.
pub(in crate::abi) fn log_softmax(c: &Call<'_>) -> Result<()> {
    forward(c, true)
}

fn backward(c: &Call<'_>, log: bool) -> Result<()> {
    // The input dtype (argument 3) is the output's, which arrives allocated.
    c.expect(4, 1)?;
    let (grad, output, grad_input) = (c.tensor(0)?, c.tensor(1)?, c.output(0)?);
    let dim = wrap_dim(c.op(), c.int(2)?, output.shape.len())?;
    softmax_backward(&c.launch(), (&grad, &output), &grad_input, dim, log)
}

/// `_softmax_backward_data(Tensor grad_output, Tensor output, int dim,
/// ScalarType input_dtype)`.
pub(in crate::abi) fn softmax_backward_data(c: &Call<'_>) -> Result<()> {
    backward(c, false)
}

/// `_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim,
/// ScalarType input_dtype)`.
pub(in crate::abi) fn log_softmax_backward_data(c: &Call<'_>) -> Result<()> {
    backward(c, true)
}

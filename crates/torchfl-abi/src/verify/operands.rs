//! The kernel-launch setup the checks that call `add.Tensor` and
//! `mul.Tensor` outside `kernels` share (`graphs`, `activity`): float32 1-D
//! buffers on device 0 holding [`KERNEL_A`] and [`KERNEL_B`], zeroed output
//! buffers of their size, and the arguments of each call.

use std::sync::Arc;

use torchfl_core::plugin::{DeviceBuffer, Stream};
use torchfl_core::{Arg, Error, Plugin, ScalarArg, TensorArg};
use torchfl_ffi::TFL_DType;

use super::runtime::{from_bytes, to_bytes, KERNEL_A, KERNEL_B};

/// The inputs `a` ([`KERNEL_A`]) and `b` ([`KERNEL_B`]) on device 0.
pub(super) struct Operands {
    p: Arc<Plugin>,
    /// [`KERNEL_A`].
    pub(super) a: DeviceBuffer,
    /// [`KERNEL_B`].
    pub(super) b: DeviceBuffer,
    shape: [i64; 1],
}

impl Operands {
    /// Allocates `a` and `b` on device 0 and copies their values in.
    pub(super) fn new(p: &Arc<Plugin>) -> Result<Self, Error> {
        let bytes = Self::bytes();
        let (a, b) = (p.allocate(0, bytes)?, p.allocate(0, bytes)?);
        p.copy_to_device(&a, 0, &to_bytes(KERNEL_A))?;
        p.copy_to_device(&b, 0, &to_bytes(KERNEL_B))?;
        Ok(Self { p: Arc::clone(p), a, b, shape: [KERNEL_A.len() as i64] })
    }

    fn bytes() -> usize {
        KERNEL_A.len() * 4
    }

    /// A new buffer of the operands' size on device 0, zeroed.
    pub(super) fn output(&self) -> Result<DeviceBuffer, Error> {
        let out = self.p.allocate(0, Self::bytes())?;
        self.p.set_memory(&out, 0, 0, Self::bytes(), None)?;
        Ok(out)
    }

    /// `buffer` as a float32 tensor of the operands' shape.
    pub(super) fn tensor<'a>(&self, buffer: &'a DeviceBuffer) -> Result<TensorArg<'a>, Error> {
        TensorArg::contiguous(buffer, TFL_DType::F32, &self.shape)
    }

    /// The arguments of `add.Tensor(x, y, alpha=1)`.
    pub(super) fn add_args<'a>(
        &self,
        x: &'a DeviceBuffer,
        y: &'a DeviceBuffer,
    ) -> Result<Vec<Arg<'a>>, Error> {
        Ok(vec![
            Arg::Tensor(self.tensor(x)?),
            Arg::Tensor(self.tensor(y)?),
            Arg::Scalar(ScalarArg::Float(1.0)),
        ])
    }

    /// The arguments of `mul.Tensor(x, y)`.
    pub(super) fn mul_args<'a>(
        &self,
        x: &'a DeviceBuffer,
        y: &'a DeviceBuffer,
    ) -> Result<Vec<Arg<'a>>, Error> {
        Ok(vec![Arg::Tensor(self.tensor(x)?), Arg::Tensor(self.tensor(y)?)])
    }

    /// Synchronizes `stream`, then reads `buffer` back.
    pub(super) fn read(&self, stream: &Stream, buffer: &DeviceBuffer) -> Result<Vec<f32>, Error> {
        stream.synchronize()?;
        let mut back = vec![0u8; Self::bytes()];
        self.p.copy_to_host(buffer, 0, &mut back)?;
        Ok(from_bytes(&back))
    }
}

//! The kernel context: what a kernel knows about its launch besides the
//! arguments, and the validation every kernel shares.
//!
//! Validation lives here, not in each kernel, because it is where the
//! simulator's safety rests: [`KernelCtx::operand`] and friends are the only
//! way to turn a tensor descriptor into a [`TensorView`] a kernel may read
//! or write, and they check it against the runtime's live allocations
//! first. They also word errors the way PyTorch does, so that every kernel
//! reports the same mistake with the same message.

use std::fmt;

use super::call::{Frame, Scalar, TensorData, TensorRef};
use super::promotion::Participant;
use super::view::{self, TensorView};
use crate::dtype::{Category, DType, Element};
use crate::error::{Error, Result};
use crate::runtime::small::Dims;
use crate::runtime::Runtime;

/// An input operand after validation.
#[derive(Debug, Clone)]
pub(crate) enum Operand {
    /// Device memory.
    View(TensorView),
    /// A 0-dim host tensor: its dtype, its value, and whether it is a
    /// wrapped Python number.
    Host(DType, Scalar, bool),
}

impl Operand {
    pub(crate) fn dtype(&self) -> DType {
        match self {
            Operand::View(v) => v.dtype(),
            Operand::Host(d, ..) => *d,
        }
    }
    pub(crate) fn shape(&self) -> &[usize] {
        match self {
            Operand::View(v) => v.shape(),
            Operand::Host(..) => &[],
        }
    }
    pub(crate) fn participant(&self) -> Participant {
        if let Operand::Host(_, value, true) = self {
            Participant::Wrapped(value.category())
        } else if self.shape().is_empty() {
            Participant::ZeroDim(self.dtype())
        } else {
            Participant::Dimensioned(self.dtype())
        }
    }
}

/// What a kernel knows about the call besides its arguments: the runtime
/// (for memory validation), the device and the operator name for messages.
pub(crate) struct KernelCtx<'a> {
    rt: &'a Runtime,
    device: usize,
    op: &'a str,
}

/// `"{op}: {role}"`, formatted only when an error message needs it.
struct OpRole<'a> {
    op: &'a str,
    role: &'a str,
}

impl fmt::Display for OpRole<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.role)
    }
}

impl<'a> KernelCtx<'a> {
    pub(crate) fn new(rt: &'a Runtime, device: usize, op: &'a str) -> Self {
        Self { rt, device, op }
    }

    /// The operator name used in messages.
    pub(crate) fn op(&self) -> &'a str {
        self.op
    }

    /// `INVALID_ARGUMENT` naming the operator.
    pub(crate) fn invalid(&self, message: impl std::fmt::Display) -> Error {
        Error::invalid(format!("sim: {}: {message}", self.op))
    }

    /// `UNIMPLEMENTED` naming the operator (the host falls back to CPU).
    pub(crate) fn unimplemented(&self, message: impl std::fmt::Display) -> Error {
        Error::unimplemented(format!("sim: {}: {message}", self.op))
    }

    /// Validates a tensor argument: shape, strides and, for device memory,
    /// that every element lies in a live allocation of its device.
    /// `any_device` allows another device of this plugin (`copy_`).
    #[inline(always)]
    fn operand_impl(&self, t: &TensorRef<'_>, role: &str, any_device: bool) -> Result<Operand> {
        if t.shape.len() != t.strides.len() {
            return Err(self.invalid(format!(
                "{role}: {} sizes but {} strides",
                t.shape.len(),
                t.strides.len()
            )));
        }
        let mut shape: Dims<usize> = Dims::from_elem(0, t.shape.len());
        let mut strides: Dims<isize> = Dims::from_elem(0, t.strides.len());
        let (mut negative, mut out_of_range) = (false, false);
        for (d, (&size, &stride)) in t.shape.iter().zip(t.strides).enumerate() {
            negative |= size < 0;
            shape[d] = size as usize;
            let s = isize::try_from(stride);
            out_of_range |= s.is_err();
            strides[d] = s.unwrap_or(0);
        }
        if negative {
            return Err(self.invalid(format!("{role}: negative size in {:?}", t.shape)));
        }
        if out_of_range {
            return Err(self.invalid(format!("{role}: stride out of range")));
        }
        match t.data {
            TensorData::Host(value) | TensorData::WrappedNumber(value) => {
                if !shape.is_empty() {
                    return Err(self.invalid(format!(
                        "{role}: host (CPU) tensors are only accepted as 0-dim scalars, got \
                         shape {:?}",
                        t.shape
                    )));
                }
                Ok(Operand::Host(t.dtype, value, matches!(t.data, TensorData::WrappedNumber(_))))
            }
            TensorData::Meta => {
                Err(self.invalid(format!("{role} has no data (a tensor of an infer_outputs call)")))
            }
            TensorData::Device { device, ptr, byte_offset } => {
                if device != self.device && !any_device {
                    return Err(self.invalid(format!(
                        "{role} is on device {device} but the kernel runs on device {}",
                        self.device
                    )));
                }
                let item = t.dtype.itemsize() as i128;
                let numel = shape
                    .iter()
                    .try_fold(1usize, |acc, &s| acc.checked_mul(s))
                    .ok_or_else(|| self.invalid(format!("{role}: too many elements")))?;
                let mut addr = 0usize;
                if numel > 0 {
                    let (lo, hi) = view::extent(&shape, &strides);
                    let off = i128::from(byte_offset);
                    let what = OpRole { op: self.op, role };
                    let base = self
                        .rt
                        .resolve(device, ptr, off + lo * item, off + (hi + 1) * item, &what)
                        .map_err(|e| Error::invalid(e.message().to_owned()))?;
                    addr = base.wrapping_add(byte_offset as usize);
                    if addr % t.dtype.itemsize() != 0 {
                        return Err(self.invalid(format!(
                            "{role}: data is not aligned to its element size ({} bytes)",
                            t.dtype.itemsize()
                        )));
                    }
                }
                // SAFETY: when the view has elements, its whole extent was
                // resolved inside one live allocation of `device` above and
                // `addr` was checked to be aligned; an empty view is never
                // dereferenced.
                Ok(Operand::View(unsafe { TensorView::from_validated(addr, t.dtype, shape, strides) }))
            }
        }
    }

    /// Waits until the work queued on the call's stream before this call
    /// has run, so the kernel can read its inputs now: what an operator
    /// whose output shape depends on data (`nonzero`) needs, and what CUDA
    /// does for it. Reports the device's asynchronous failure, if any, as
    /// a synchronization does.
    pub(crate) fn wait_for_inputs(&self, call: &Frame<'_>) -> Result<()> {
        self.rt.synchronize_stream(call.stream)
    }

    /// Resizes output `i` of a dynamic-shape call to the contiguous
    /// `shape` through the host, and returns it validated like
    /// [`KernelCtx::output`].
    pub(crate) fn resize_output(&self, call: &Frame<'_>, i: usize, shape: &[i64]) -> Result<TensorView> {
        let resizer = call.resizer.ok_or_else(|| {
            self.unimplemented("the output shape depends on data, and this caller cannot resize outputs")
        })?;
        let t = resizer.resize(i, shape)?;
        self.written(&t, "output")
    }

    /// A validated input on this kernel's device (or a host scalar).
    #[inline(always)]
    pub(crate) fn operand(&self, t: &TensorRef<'_>, role: &str) -> Result<Operand> {
        self.operand_impl(t, role, false)
    }

    /// Like [`KernelCtx::operand`], accepting any device of the plugin.
    pub(crate) fn operand_any_device(&self, t: &TensorRef<'_>, role: &str) -> Result<Operand> {
        self.operand_impl(t, role, true)
    }

    /// A validated device tensor on this kernel's device.
    #[inline(always)]
    pub(crate) fn device_view(&self, t: &TensorRef<'_>, role: &str) -> Result<TensorView> {
        match self.operand(t, role)? {
            Operand::View(v) => Ok(v),
            Operand::Host(..) => Err(self.invalid(format!("{role} must be a device tensor"))),
        }
    }

    /// Output `i`, validated and checked for internal overlap (PyTorch
    /// refuses to write where several elements share memory).
    #[inline(always)]
    pub(crate) fn output(&self, call: &Frame<'_>, i: usize) -> Result<TensorView> {
        let t = call.outputs.get(i).ok_or_else(|| {
            self.invalid(format!("expected at least {} output(s), got {}", i + 1, call.outputs.len()))
        })?;
        self.written(t, "output")
    }

    /// A device tensor the kernel writes in place (an output, or a mutated
    /// argument such as a `Tensor(a!)[]` entry), validated and checked for
    /// internal overlap like [`KernelCtx::output`].
    #[inline(always)]
    pub(crate) fn written(&self, t: &TensorRef<'_>, role: &str) -> Result<TensorView> {
        let v = self.device_view(t, role)?;
        if v.has_internal_overlap() {
            return Err(self.invalid(
                "unsupported operation: more than one element of the written-to tensor refers \
                 to a single memory location. Please clone() the tensor before performing the \
                 operation.",
            ));
        }
        Ok(v)
    }

    /// PyTorch's `assert_no_partial_overlap` between an output and an input.
    #[inline(always)]
    pub(crate) fn check_overlap(&self, out: &TensorView, input: &Operand) -> Result<()> {
        if let Operand::View(v) = input {
            // Disjoint memory (the common case) can never overlap partially.
            if !view::disjoint(out, v) && view::overlap(out, v) == view::Overlap::Partial {
                return Err(self.invalid(
                    "unsupported operation: some elements of the input tensor and the \
                     written-to tensor refer to a single memory location. Please clone() the \
                     tensor before performing the operation.",
                ));
            }
        }
        Ok(())
    }

    /// Converts a `Scalar` argument to the element type used for `target`,
    /// refusing values that overflow `target` (c10's `checked_convert`).
    pub(crate) fn scalar_to<T: Element>(&self, s: Scalar, target: DType) -> Result<T> {
        let overflow = || {
            self.invalid(format!(
                "value cannot be converted to type {} without overflow",
                cpp_type_name(target)
            ))
        };
        match (target.category(), s) {
            (Category::Bool, _) | (_, Scalar::Bool(_)) => {}
            (Category::Integral, Scalar::Int(i)) => {
                let (lo, hi) = int_range(target);
                if i < lo || i > hi {
                    return Err(overflow());
                }
            }
            (Category::Integral, Scalar::Float(f)) => {
                let (lo, hi) = int_range(target);
                if f.is_nan() || f.trunc() < lo as f64 || f.trunc() > hi as f64 {
                    return Err(overflow());
                }
            }
            (Category::Floating, v) => {
                let f = v.as_f64();
                let max = match target {
                    DType::Float16 => f64::from(half::f16::MAX),
                    DType::BFloat16 => f64::from(half::bf16::MAX),
                    DType::Float32 => f64::from(f32::MAX),
                    _ => f64::MAX,
                };
                if f.is_finite() && f.abs() > max {
                    return Err(overflow());
                }
            }
        }
        Ok(s.cast())
    }
}

fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::UInt8 => (0, 255),
        DType::Int8 => (-128, 127),
        DType::Int16 => (i64::from(i16::MIN), i64::from(i16::MAX)),
        DType::Int32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        _ => (i64::MIN, i64::MAX),
    }
}

fn cpp_type_name(d: DType) -> &'static str {
    match d {
        DType::Bool => "bool",
        DType::UInt8 => "uint8_t",
        DType::Int8 => "int8_t",
        DType::Int16 => "int16_t",
        DType::Int32 => "int32_t",
        DType::Int64 => "int64_t",
        DType::Float16 => "c10::Half",
        DType::BFloat16 => "c10::BFloat16",
        DType::Float32 => "float",
        DType::Float64 => "double",
    }
}

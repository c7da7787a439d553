//! The two operators behind `torch.amp.GradScaler`:
//! `_amp_foreach_non_finite_check_and_unscale_` (`scaler.unscale_`, and
//! `scaler.step` when the gradients were not unscaled yet) and
//! `_amp_update_scale_` (`scaler.update`).
//!
//! PyTorch has CPU and CUDA kernels only, so without these a mixed-precision
//! training step on this device runs both through the CPU fallback: every
//! gradient, the scale and the flags make a round trip to the host each
//! step, and the step synchronizes the device. Here they are ordinary stream
//! work: arguments are validated when the kernel is called, the reads of
//! `inv_scale`, `found_inf`, the scale and the tracker happen when the work
//! runs (they are device tensors that earlier work on the stream writes),
//! so nothing waits for the device.
//!
//! The semantics are those of PyTorch's CPU kernels
//! (`aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp`):
//! - unscale multiplies every element by `inv_scale` in the element's math
//!   type (`float` for `float`, `half` and `bfloat16`; `double` for
//!   `double`) and sets `found_inf` to 1.0 when an *input* value is inf or
//!   NaN. `found_inf` is never cleared (the caller zeroes it), an empty list
//!   is a no-op checked before anything else, and a tensor of another dtype
//!   is `UNIMPLEMENTED` (PyTorch's dispatch refuses it too). PyTorch skips
//!   the multiplication when `inv_scale == 1`; multiplying by 1 gives the
//!   same values, so this kernel always multiplies.
//! - update_scale backs the scale off and resets the tracker when
//!   `found_inf` is nonzero (NaN counts), otherwise counts a successful
//!   step and grows the scale every `growth_interval` of them, unless the
//!   grown scale would not be finite in `float`.
//!
//! Like CUDA's kernels (and unlike the CPU ones, which want CPU tensors),
//! the one-element tensors must be device tensors of this device.

use half::{bf16, f16};
use rayon::prelude::*;

use super::elementwise::{gather, load, scatter, store, GRAIN, PAR_MIN};
use super::view::TensorView;
use super::{ArgRef, Args, Frame, KernelCtx, TensorRef};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::runtime::Work;

/// A one-element device tensor of `dtype` (`what`: "a float", "an int"),
/// refused with PyTorch's messages otherwise; `written` also checks it as a
/// written-to tensor.
fn one_element(
    ctx: &KernelCtx<'_>,
    t: &TensorRef<'_>,
    role: &str,
    dtype: DType,
    what: &str,
    written: bool,
) -> Result<TensorView> {
    let v = if written { ctx.written(t, role)? } else { ctx.device_view(t, role)? };
    if v.numel() != 1 {
        return Err(ctx.invalid(format!("{role} must be a 1-element tensor.")));
    }
    if v.dtype() != dtype {
        return Err(ctx.invalid(format!("{role} must be {what} tensor.")));
    }
    Ok(v)
}

/// The single element of `v`, converted to `T`. Call only from stream work.
fn read_one<T: Element>(v: &TensorView) -> T {
    let mut buf = [T::ZERO];
    // SAFETY: `v` is a validated view (TensorView invariant: its element
    // lies in a live allocation, kept alive by stream-ordered frees while
    // this work runs) with exactly one element, at `v.addr()`, aligned for
    // its dtype.
    unsafe { load(v.dtype(), v.addr(), 0, &mut buf) };
    buf[0]
}

/// Stores `value` (converted) into the single element of `v`. Call only
/// from stream work.
fn write_one<T: Element>(v: &TensorView, value: T) {
    // SAFETY: as in `read_one`; the stream runs this work alone and the
    // work holds no reference into device memory while it writes.
    unsafe { store(v.dtype(), v.addr(), 0, &[value]) };
}

/// Multiplies `data` by `inv` in the math type of `T` and returns whether
/// any input value was inf or NaN.
#[inline]
fn unscale_run<T: Element>(data: &mut [T], inv: f32) -> bool {
    let mut found = false;
    if T::DTYPE == DType::Float64 {
        // `double * float`: the factor is promoted to double.
        let inv = f64::from(inv);
        for x in data.iter_mut() {
            let v = x.to_f64();
            found |= !v.is_finite();
            *x = T::from_f64(v * inv);
        }
    } else {
        // float, and the half types through float (their opmath type).
        for x in data.iter_mut() {
            let v = x.to_f32();
            found |= !v.is_finite();
            *x = T::from_f32(v * inv);
        }
    }
    found
}

/// [`unscale_run`], split across rayon above [`PAR_MIN`] elements (every
/// chunk runs to the end: no short-circuit, all values are scaled).
fn unscale_slice<T: Element>(data: &mut [T], inv: f32) -> bool {
    if data.len() >= PAR_MIN {
        data.par_chunks_mut(GRAIN).map(|c| unscale_run(c, inv)).reduce(|| false, |a, b| a | b)
    } else {
        unscale_run(data, inv)
    }
}

/// Unscales one gradient of element type `T` (its dtype) in place; returns
/// whether it held an inf or NaN. Call only from stream work.
fn unscale_view<T: Element>(v: &TensorView, inv: f32) -> bool {
    let n = v.numel();
    if n == 0 {
        return false;
    }
    if v.is_contiguous() {
        // SAFETY: a contiguous validated view of `n` aligned elements of
        // `T` (the caller dispatched on its dtype), live while this work
        // runs; the work creates no other reference into device memory
        // while this slice exists (the one-element tensors are read before
        // and written after).
        let data = unsafe { std::slice::from_raw_parts_mut(v.addr() as *mut T, n) };
        unscale_slice(data, inv)
    } else {
        // Any other layout (transposed, sliced, offset): through a
        // row-major copy, which no aliasing between elements can break.
        let mut buf = gather::<T>(v);
        let found = unscale_slice(&mut buf, inv);
        scatter(v, &buf);
        found
    }
}

/// Whether unscale supports `dtype` (PyTorch's floating types).
fn unscalable(dtype: DType) -> bool {
    matches!(dtype, DType::Float32 | DType::Float64 | DType::Float16 | DType::BFloat16)
}

/// Dispatches [`unscale_view`] on the view's dtype.
fn unscale(v: &TensorView, inv: f32) -> bool {
    match v.dtype() {
        DType::Float32 => unscale_view::<f32>(v, inv),
        DType::Float64 => unscale_view::<f64>(v, inv),
        DType::Float16 => unscale_view::<f16>(v, inv),
        DType::BFloat16 => unscale_view::<bf16>(v, inv),
        // Refused when the kernel was called (`unscalable`).
        _ => false,
    }
}

/// `_amp_foreach_non_finite_check_and_unscale_(Tensor(a!)[] self,
/// Tensor(b!) found_inf, Tensor inv_scale) -> ()`
pub(crate) fn non_finite_check_and_unscale(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 3)?;
    let Some(ArgRef::TensorList(grads)) = call.args.first() else {
        return Err(ctx.invalid("argument 0 (self) must be a tensor list"));
    };
    let found_t = args.tensor(1, "found_inf")?;
    let inv_t = args.tensor(2, "inv_scale")?;
    // PyTorch returns before any other check.
    if grads.is_empty() {
        return Ok(None);
    }
    let found = one_element(ctx, found_t, "found_inf", DType::Float32, "a float", true)?;
    let inv = one_element(ctx, inv_t, "inv_scale", DType::Float32, "a float", false)?;
    let mut views = Vec::with_capacity(grads.len());
    for (k, g) in grads.iter().enumerate() {
        let g = g.as_ref().ok_or_else(|| ctx.invalid(format!("scaled_grads[{k}] is None")))?;
        let v = ctx.written(g, "scaled_grads")?;
        if !unscalable(v.dtype()) {
            return Err(ctx.unimplemented(format!(
                "scaled_grads[{k}]: dtype {} is not supported (floating types only)",
                v.dtype()
            )));
        }
        if v.numel() > 0 {
            views.push(v);
        }
    }
    if views.is_empty() {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        let inv = read_one::<f32>(&inv);
        let mut any = false;
        for v in &views {
            any |= unscale(v, inv);
        }
        if any {
            write_one(&found, 1.0f32);
        }
        Ok(())
    })))
}

/// PyTorch's `_amp_update_scale_cpu_kernel` on values: the new scale and
/// growth tracker.
fn next_scale(
    scale: f32,
    tracker: i32,
    found_inf: f32,
    growth: f64,
    backoff: f64,
    interval: i64,
) -> (f32, i32) {
    // `if (*found_inf_ptr)`: any nonzero value, NaN included.
    if found_inf != 0.0 {
        // `float * double`, stored back to float.
        return ((f64::from(scale) * backoff) as f32, 0);
    }
    // A successful step: count it before comparing with the interval.
    let successful = tracker.wrapping_add(1);
    if i64::from(successful) == interval {
        let grown = (f64::from(scale) * growth) as f32;
        // Do not grow the scale past float's range to inf.
        (if grown.is_finite() { grown } else { scale }, 0)
    } else {
        (scale, successful)
    }
}

/// A `float` argument (an int is accepted too).
fn float_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<f64> {
    match call.args.get(i) {
        Some(ArgRef::Float(v)) => Ok(*v),
        Some(ArgRef::Int(v)) => Ok(*v as f64),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a float"))),
    }
}

/// `_amp_update_scale_(Tensor(a!) self, Tensor(b!) growth_tracker, Tensor
/// found_inf, float scale_growth_factor, float scale_backoff_factor, int
/// growth_interval) -> Tensor(a!)`
///
/// Reads the scale from `self` and writes it to `outputs[0]`, which the ABI
/// makes `self` for this in-place operator; a call without outputs (the
/// Rust API) writes `self`.
pub(crate) fn update_scale(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 6, 6)?;
    let scale_t = args.tensor(0, "self")?;
    let tracker_t = args.tensor(1, "growth_tracker")?;
    let found_t = args.tensor(2, "found_inf")?;
    let growth = float_arg(ctx, call, 3, "scale_growth_factor")?;
    let backoff = float_arg(ctx, call, 4, "scale_backoff_factor")?;
    let interval = match call.args.get(5) {
        Some(ArgRef::Int(v)) => *v,
        _ => return Err(ctx.invalid("argument 5 (growth_interval) must be an int")),
    };
    let tracker = one_element(ctx, tracker_t, "growth_tracker", DType::Int32, "an int", true)?;
    let scale = one_element(ctx, scale_t, "current_scale", DType::Float32, "a float", true)?;
    let out = match call.outputs.first() {
        Some(o) => one_element(ctx, o, "current_scale", DType::Float32, "a float", true)?,
        None => scale.clone(),
    };
    let found = one_element(ctx, found_t, "found_inf", DType::Float32, "a float", false)?;
    Ok(Some(Work::new(move || {
        let (s, t) = next_scale(
            read_one::<f32>(&scale),
            read_one::<i32>(&tracker),
            read_one::<f32>(&found),
            growth,
            backoff,
            interval,
        );
        write_one(&out, s);
        write_one(&tracker, t);
        Ok(())
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_scale_follows_pytorch() {
        // Backoff on inf (and on NaN, and on any nonzero flag).
        assert_eq!(next_scale(1024.0, 5, 1.0, 2.0, 0.5, 2000), (512.0, 0));
        assert_eq!(next_scale(1024.0, 5, f32::NAN, 2.0, 0.5, 2000), (512.0, 0));
        assert_eq!(next_scale(1024.0, 5, -1.0, 2.0, 0.5, 2000), (512.0, 0));
        // Counting, then growth at the interval.
        assert_eq!(next_scale(1024.0, 0, 0.0, 2.0, 0.5, 3), (1024.0, 1));
        assert_eq!(next_scale(1024.0, 2, 0.0, 2.0, 0.5, 3), (2048.0, 0));
        // Growth to inf is suppressed, the tracker still resets.
        assert_eq!(next_scale(f32::MAX, 0, 0.0, 2.0, 0.5, 1), (f32::MAX, 0));
        // The product is computed in double and rounded once.
        let s = 3.0f32;
        assert_eq!(next_scale(s, 0, 0.0, 1.1, 0.5, 1).0, (3.0f64 * 1.1) as f32);
        // An interval the tracker never reaches (0, negative) never grows.
        assert_eq!(next_scale(8.0, 0, 0.0, 2.0, 0.5, 0), (8.0, 1));
    }

    #[test]
    fn unscale_run_checks_inputs_and_scales() {
        let mut v = [1.0f32, 2.0, 4.0];
        assert!(!unscale_run(&mut v, 0.5));
        assert_eq!(v, [0.5, 1.0, 2.0]);
        let mut v = [1.0f64, f64::INFINITY];
        assert!(unscale_run(&mut v, 0.25));
        assert_eq!(v, [0.25, f64::INFINITY]);
        // A finite value that overflows after scaling is not flagged (the
        // input is checked, as in PyTorch).
        let mut v = [f16::from_f32(60000.0)];
        assert!(!unscale_run(&mut v, 2.0));
        assert!(v[0].is_infinite());
        let mut v = [bf16::from_f32(3.0), bf16::NAN];
        assert!(unscale_run(&mut v, 2.0));
        assert_eq!(v[0], bf16::from_f32(6.0));
        assert!(v[1].is_nan());
    }
}

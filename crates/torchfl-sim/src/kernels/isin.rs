//! `isin`: whether each element occurs among test elements (generation
//! stops on end-of-sequence tokens with `isin(tokens, eos_ids)`, masked-LM
//! data preparation excludes special tokens with it).
//!
//! Both sides are converted to their promoted dtype (`torch.result_type`),
//! as PyTorch's CPU kernel does, and compared there: NaN matches nothing
//! and `-0.0` matches `0.0`. The test elements are sorted and deduplicated
//! once; the elements are then binary-searched in parallel.

use super::elementwise::{gather, par_chunks_mut, with_dense_output, GRAIN, PAR_MIN};
use super::promotion::{result_type, Participant};
use super::view::TensorView;
use super::{ArgRef, Args, Frame, KernelCtx, Operand, Scalar};
use crate::dtype::{cast, with_storage, DType, Element, B8};
use crate::error::Result;
use crate::runtime::Work;

/// The test elements of a call.
#[derive(Debug, Clone)]
enum Tests {
    Tensor(TensorView),
    Value(Scalar),
}

/// Values of `v` converted to `T` (the promoted dtype), then widened to
/// `f64` (floating `T`) for comparison.
fn floats<T: Element>(v: &TensorView) -> Vec<f64> {
    with_storage!(v.dtype(), S => gather::<S>(v).into_iter().map(|x| cast::<S, T>(x).to_f64()).collect())
}

fn ints<T: Element>(v: &TensorView) -> Vec<i64> {
    with_storage!(v.dtype(), S => gather::<S>(v).into_iter().map(|x| cast::<S, T>(x).to_i64()).collect())
}

/// Writes `found(x) != invert` for each element into `out`.
fn membership<K: Copy + Send + Sync>(
    out: &TensorView,
    xs: &[K],
    found: impl Fn(K) -> bool + Sync,
    invert: bool,
) {
    with_dense_output::<B8>(out, |o| {
        let fill = |start: usize, dst: &mut [B8]| {
            for (d, &x) in dst.iter_mut().zip(&xs[start..]) {
                *d = B8::from_bool(found(x) != invert);
            }
        };
        if o.len() >= PAR_MIN {
            par_chunks_mut(o, GRAIN, &fill);
        } else {
            fill(0, o);
        }
    });
}

fn isin_work<T: Element>(elements: TensorView, tests: Tests, out: TensorView, invert: bool) -> Work {
    Work::new(move || {
        if T::DTYPE.is_floating() {
            let xs = floats::<T>(&elements);
            let mut keys: Vec<f64> = match &tests {
                Tests::Tensor(t) => floats::<T>(t),
                Tests::Value(s) => vec![s.cast::<T>().to_f64()],
            };
            // `+ 0.0` turns -0.0 into 0.0; NaN never matches.
            keys.retain(|k| !k.is_nan());
            keys.iter_mut().for_each(|k| *k += 0.0);
            keys.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            keys.dedup();
            let found = |x: f64| !x.is_nan() && keys.binary_search_by(|k| k.total_cmp(&(x + 0.0))).is_ok();
            membership(&out, &xs, found, invert);
        } else {
            let xs = ints::<T>(&elements);
            let mut keys: Vec<i64> = match &tests {
                Tests::Tensor(t) => ints::<T>(t),
                Tests::Value(s) => vec![s.cast::<T>().to_i64()],
            };
            keys.sort_unstable();
            keys.dedup();
            membership(&out, &xs, |x| keys.binary_search(&x).is_ok(), invert);
        }
        Ok(())
    })
}

fn isin_impl(ctx: &KernelCtx<'_>, call: &Frame<'_>, scalar_test: bool) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 4)?;
    let elements = ctx.device_view(args.tensor(0, "elements")?, "elements")?;
    let (tests, test_part) = if scalar_test {
        let s = match call.args.get(1) {
            Some(ArgRef::Scalar(s)) => *s,
            Some(ArgRef::Int(v)) => Scalar::Int(*v),
            Some(ArgRef::Float(v)) => Scalar::Float(*v),
            Some(ArgRef::Bool(v)) => Scalar::Bool(*v),
            _ => return Err(ctx.invalid("argument 1 (test_element) must be a Scalar")),
        };
        (Tests::Value(s), Participant::Wrapped(s.category()))
    } else {
        match ctx.operand(args.tensor(1, "test_elements")?, "test_elements")? {
            Operand::View(v) => {
                let part = Operand::View(v.clone()).participant();
                (Tests::Tensor(v), part)
            }
            Operand::Host(d, s, wrapped) => {
                let part = Operand::Host(d, s, wrapped).participant();
                (Tests::Value(s), part)
            }
        }
    };
    args.bool_or(2, "assume_unique", false)?;
    let invert = args.bool_or(3, "invert", false)?;
    let out = ctx.output(call, 0)?;
    if out.dtype() != DType::Bool || out.shape() != elements.shape() {
        return Err(ctx.invalid(format!(
            "out must be a bool tensor of the elements' shape {:?} (got {} {:?})",
            elements.shape(),
            out.dtype(),
            out.shape()
        )));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    let common = result_type(&[Operand::View(elements.clone()).participant(), test_part]);
    Ok(Some(with_storage!(common, T => isin_work::<T>(elements, tests, out, invert))))
}

/// `isin.Tensor_Tensor(Tensor elements, Tensor test_elements, *, bool
/// assume_unique=False, bool invert=False) -> Tensor` (registered for its
/// out= form).
pub(crate) fn isin_tensor_tensor(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    isin_impl(ctx, call, false)
}

/// `isin.Tensor_Scalar(Tensor elements, Scalar test_element, *, bool
/// assume_unique=False, bool invert=False) -> Tensor` (registered for its
/// out= form).
pub(crate) fn isin_tensor_scalar(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    isin_impl(ctx, call, true)
}

//! Reduction operators: `sum`, `sum.dim_IntList`, `mean.dim`.

use super::reduce::{self, Finish};
use super::view::disjoint;
use super::{Args, Frame, KernelCtx};
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::Work;

/// Normalises a dim list (PyTorch's `maybe_wrap_dim` plus the duplicate
/// check) into a per-dimension mask; `None` or an empty list reduce all.
fn reduce_mask(ctx: &KernelCtx<'_>, ndim: usize, dims: Option<&[i64]>) -> Result<Vec<bool>> {
    let dims = match dims {
        None | Some([]) => return Ok(vec![true; ndim]),
        Some(d) => d,
    };
    let mut mask = vec![false; ndim];
    let wrap = ndim.max(1) as i64;
    for &d in dims {
        if d < -wrap || d >= wrap {
            return Err(ctx.invalid(format!(
                "Dimension out of range (expected to be in range of [{}, {}], but got {d})",
                -wrap,
                wrap - 1
            )));
        }
        let w = if d < 0 { d + wrap } else { d } as usize;
        if ndim == 0 {
            continue;
        }
        if mask[w] {
            return Err(ctx.invalid(format!("dim {w} appears multiple times in the list of dims")));
        }
        mask[w] = true;
    }
    Ok(mask)
}

fn reduction(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    dims: Option<Vec<i64>>,
    keepdim: bool,
    dtype: Option<DType>,
    finish: Finish,
) -> Result<Option<Work>> {
    let input = ctx.device_view(
        match call.args.first() {
            Some(super::ArgRef::Tensor(t)) => t,
            _ => return Err(ctx.invalid("argument 0 (self) must be a tensor")),
        },
        "self",
    )?;
    let out = ctx.output(call, 0)?;
    let mask = reduce_mask(ctx, input.ndim(), dims.as_deref())?;
    if let Some(d) = dtype {
        if d != out.dtype() {
            return Err(
                ctx.invalid(format!("dtype argument {d} does not match the output's dtype {}", out.dtype()))
            );
        }
    }
    if finish == Finish::Mean {
        if dtype.is_none() && !input.dtype().is_floating() {
            return Err(ctx.invalid(format!(
                "mean(): could not infer output dtype. Input dtype must be either a floating \
                 point or complex dtype. Got: {}",
                input.dtype()
            )));
        }
        if !out.dtype().is_floating() {
            return Err(ctx.invalid(format!(
                "mean(): could not infer output dtype. Optional dtype must be either a floating \
                 point or complex dtype. Got: {}",
                out.dtype()
            )));
        }
    }
    let expected: Vec<usize> = input
        .shape()
        .iter()
        .zip(&mask)
        .filter_map(|(&s, &r)| match (r, keepdim) {
            (false, _) => Some(s),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    if out.shape() != expected.as_slice() {
        return Err(ctx.invalid(format!(
            "output has shape {:?} but the reduction of {:?} gives {:?}",
            out.shape(),
            input.shape(),
            expected
        )));
    }
    if !disjoint(&out, &input) {
        return Err(
            ctx.invalid("unsupported operation: the output of a reduction must not overlap its input")
        );
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(reduce::sum(input, out, mask, finish)))
}

/// `sum(Tensor self, *, ScalarType? dtype=None)`
pub(crate) fn sum(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 2)?;
    args.tensor(0, "self")?;
    let dtype = args.opt_dtype(1, "dtype")?;
    reduction(ctx, call, None, false, dtype, Finish::Sum)
}

/// `sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *,
/// ScalarType? dtype=None)`
pub(crate) fn sum_dim(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 4)?;
    args.tensor(0, "self")?;
    let dims = args.opt_int_list(1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    let dtype = args.opt_dtype(3, "dtype")?;
    reduction(ctx, call, dims, keepdim, dtype, Finish::Sum)
}

/// `mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *,
/// ScalarType? dtype=None)`
pub(crate) fn mean_dim(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 4)?;
    args.tensor(0, "self")?;
    let dims = args.opt_int_list(1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    let dtype = args.opt_dtype(3, "dtype")?;
    reduction(ctx, call, dims, keepdim, dtype, Finish::Mean)
}

// ============================================================================
// Selection and logical reductions: `max`/`min` (full and `.dim` with
// indices), `argmax`/`argmin`, `amax`/`amin`, `all`/`any` (full, `.dim`,
// `.dims`).
//
// They read the input in its own storage type (so int64 values stay
// exact), walk each output's reduced elements in row-major order (which
// makes the index of `argmax` with `dim=None` the flat index, and ties
// resolve to the first occurrence, as in PyTorch), and let NaN win
// `max`/`min` (its first occurrence gives the index). Outputs are
// computed in parallel when there is enough work.
// ============================================================================

use rayon::prelude::*;

use super::elementwise::{load, with_dense_output, Plan};
use super::view::TensorView;
use crate::dtype::{with_storage, Element};

/// What a selection reduction computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fold {
    Max,
    Min,
    All,
    Any,
}

/// Folds every output's reduced elements: `(value, index)` per output in
/// row-major order of the kept dimensions. For `All`/`Any` the value is
/// `T::from_bool` of the answer and the index 0.
fn fold_all<T: Element>(input: &TensorView, mask: &[bool], fold: Fold) -> Vec<(T, i64)> {
    /// The running answer for one output; `pos` counts the elements seen.
    #[derive(Clone, Copy)]
    struct State<T> {
        best: T,
        best_i: i64,
        flag: bool,
        pos: i64,
    }
    let init = State { best: T::ZERO, best_i: 0, flag: fold == Fold::All, pos: 0 };
    let states = fold_generic::<T, State<T>>(input, mask, init, |mut st, x| {
        #[allow(clippy::eq_op)]
        let x_nan = x != x;
        #[allow(clippy::eq_op)]
        let best_nan = st.best != st.best;
        match fold {
            Fold::Max | Fold::Min => {
                let better = if fold == Fold::Max { x > st.best } else { x < st.best };
                // NaN wins, and ties keep the first occurrence, as PyTorch.
                if st.pos == 0 || (!best_nan && (x_nan || better)) {
                    st.best = x;
                    st.best_i = st.pos;
                }
            }
            Fold::All => st.flag &= x.to_bool(),
            Fold::Any => st.flag |= x.to_bool(),
        }
        st.pos += 1;
        st
    });
    states
        .into_iter()
        .map(|st| match fold {
            Fold::Max | Fold::Min => (st.best, st.best_i),
            Fold::All | Fold::Any => (T::from_bool(st.flag), 0),
        })
        .collect()
}

/// The expected output shape of reducing `shape` over `mask`.
fn reduced_shape(shape: &[usize], mask: &[bool], keepdim: bool) -> Vec<usize> {
    shape
        .iter()
        .zip(mask)
        .filter_map(|(&s, &r)| match (r, keepdim) {
            (false, _) => Some(s),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// Validates and launches a selection reduction. `outputs` says which of
/// values and indices the op produces (in that order).
fn select_reduce(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    dims: Option<Vec<i64>>,
    keepdim: bool,
    fold: Fold,
    (values, indices): (bool, bool),
    name: &str,
) -> Result<Option<Work>> {
    let input = ctx.device_view(
        match call.args.first() {
            Some(super::ArgRef::Tensor(t)) => t,
            _ => return Err(ctx.invalid("argument 0 (self) must be a tensor")),
        },
        "self",
    )?;
    let mask = reduce_mask(ctx, input.ndim(), dims.as_deref())?;
    let expected = reduced_shape(input.shape(), &mask, keepdim);
    let nred: usize = input.shape().iter().zip(&mask).filter(|(_, &r)| r).map(|(&s, _)| s).product();
    if matches!(fold, Fold::Max | Fold::Min) && nred == 0 && input.numel() == 0 {
        return Err(ctx.invalid(format!(
            "{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction \
             dim with the 'dim' argument."
        )));
    }
    if matches!(fold, Fold::Max | Fold::Min) && nred == 0 {
        return Err(ctx.invalid(format!("{name}(): Expected reduction dim to have non-zero size.")));
    }
    let mut outs = Vec::new();
    for i in 0..usize::from(values) + usize::from(indices) {
        let o = ctx.output(call, i)?;
        if o.shape() != expected.as_slice() {
            return Err(ctx.invalid(format!(
                "output {i} has shape {:?} but the reduction of {:?} gives {expected:?}",
                o.shape(),
                input.shape()
            )));
        }
        if !disjoint(&o, &input) {
            return Err(
                ctx.invalid("unsupported operation: the output of a reduction must not overlap its input")
            );
        }
        outs.push(o);
    }
    if indices {
        if let Some(ix) = outs.last() {
            if ix.dtype() != DType::Int64 {
                return Err(ctx.invalid(format!("expected indices of dtype Long, got {}", ix.dtype())));
            }
        }
    }
    if outs.iter().any(|o| o.numel() == 0) {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        with_storage!(input.dtype(), T => {
            let res = fold_all::<T>(&input, &mask, fold);
            let mut k = 0;
            if values {
                with_dense_output::<T>(&outs[k], |o| {
                    for (ov, r) in o.iter_mut().zip(&res) {
                        *ov = r.0;
                    }
                });
                k += 1;
            }
            if indices {
                with_dense_output::<i64>(&outs[k], |o| {
                    for (ov, r) in o.iter_mut().zip(&res) {
                        *ov = r.1;
                    }
                });
            }
        });
        Ok(())
    })))
}

/// Reads an `int` argument.
fn int_at(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<i64> {
    super::softmax::int_arg(ctx, call, i, name)
}

/// `argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor`
/// (and `argmax.out`).
pub(crate) fn argmax(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    arg_reduce(ctx, call, Fold::Max, "argmax")
}

/// `argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor`
/// (and `argmin.out`).
pub(crate) fn argmin(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    arg_reduce(ctx, call, Fold::Min, "argmin")
}

fn arg_reduce(ctx: &KernelCtx<'_>, call: &Frame<'_>, fold: Fold, name: &str) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 3)?;
    args.tensor(0, "self")?;
    let dim = args.opt_int_list(1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    if dim.is_none() && keepdim {
        // Every dimension kept as size 1.
        return select_reduce(ctx, call, None, true, fold, (false, true), name);
    }
    select_reduce(ctx, call, dim, keepdim, fold, (false, true), name)
}

/// `max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values,
/// Tensor indices)` (and `max.dim_max`).
pub(crate) fn max_dim(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 3)?;
    args.tensor(0, "self")?;
    let dim = int_at(ctx, call, 1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    select_reduce(ctx, call, Some(vec![dim]), keepdim, Fold::Max, (true, true), "max")
}

/// `min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values,
/// Tensor indices)` (and `min.dim_min`).
pub(crate) fn min_dim(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 3)?;
    args.tensor(0, "self")?;
    let dim = int_at(ctx, call, 1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    select_reduce(ctx, call, Some(vec![dim]), keepdim, Fold::Min, (true, true), "min")
}

/// `max(Tensor self) -> Tensor`: the maximum of all elements (NaN wins).
pub(crate) fn max_all(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    args.tensor(0, "self")?;
    select_reduce(ctx, call, None, false, Fold::Max, (true, false), "max")
}

/// `min(Tensor self) -> Tensor`: the minimum of all elements (NaN wins).
pub(crate) fn min_all(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 1)?;
    args.tensor(0, "self")?;
    select_reduce(ctx, call, None, false, Fold::Min, (true, false), "min")
}

/// `amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor` (and
/// `amax.out`); an empty `dim` reduces everything.
pub(crate) fn amax(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 3)?;
    args.tensor(0, "self")?;
    let dims = args.opt_int_list(1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    select_reduce(ctx, call, dims, keepdim, Fold::Max, (true, false), "amax")
}

/// `amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor` (and
/// `amin.out`).
pub(crate) fn amin(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 3)?;
    args.tensor(0, "self")?;
    let dims = args.opt_int_list(1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    select_reduce(ctx, call, dims, keepdim, Fold::Min, (true, false), "amin")
}

/// `all`/`any` in their three forms: `(self)`, `.dim(self, int dim, bool
/// keepdim=False)`, `.dims(self, int[]? dim=None, bool keepdim=False)`.
fn logical_reduce(ctx: &KernelCtx<'_>, call: &Frame<'_>, fold: Fold, name: &str) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 3)?;
    args.tensor(0, "self")?;
    let dims = args.opt_int_list(1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    let out = ctx.output(call, 0)?;
    if !matches!(out.dtype(), DType::Bool | DType::UInt8) {
        return Err(ctx.invalid(format!("{name}: result dtype must be Bool or Byte, got {}", out.dtype())));
    }
    select_reduce(ctx, call, dims, keepdim, fold, (true, false), name)
}

/// `all(Tensor self)`, `all.dim`, `all.dims` (and their out= forms).
pub(crate) fn all(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    logical_reduce(ctx, call, Fold::All, "all")
}

/// `any(Tensor self)`, `any.dim`, `any.dims` (and their out= forms).
pub(crate) fn any(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    logical_reduce(ctx, call, Fold::Any, "any")
}

// ---------------------------------------------------- accumulating folds

/// Folds each output's reduced elements, loaded as `L`, with `step` from
/// `init`, in row-major order: one state per output (row-major over the
/// kept dimensions). Outputs run in parallel when there is enough work.
fn fold_generic<L, S>(input: &TensorView, mask: &[bool], init: S, step: impl Fn(S, L) -> S + Sync) -> Vec<S>
where
    L: Element,
    S: Copy + Send + Sync,
{
    let nd = input.ndim();
    let (mut kept_shape, mut kept_strides, mut red_shape, mut red_strides) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((&size, &stride), &reduced) in input.shape().iter().zip(input.strides()).zip(mask).take(nd) {
        if reduced {
            red_shape.push(size);
            red_strides.push(stride);
        } else {
            kept_shape.push(size);
            kept_strides.push(stride);
        }
    }
    let nout: usize = kept_shape.iter().product();
    let nred: usize = red_shape.iter().product();
    let item = input.itemsize();
    let plan = Plan::new(&red_shape, &[(input.addr(), &red_strides, item)], false);
    let dtype = input.dtype();
    let one = |o: usize| -> S {
        let mut rem = o;
        let mut off = 0isize;
        for d in (0..kept_shape.len()).rev() {
            off += (rem % kept_shape[d]) as isize * kept_strides[d] * item as isize;
            rem /= kept_shape[d];
        }
        let mut acc = init;
        let mut buf = [L::ZERO; 256];
        plan.for_each_run(0..nred, [off, 0, 0], |p, s, len| {
            let mut i = 0;
            while i < len {
                let m = 256.min(len - i);
                // SAFETY: run addresses lie inside the validated input view.
                unsafe { load::<L>(dtype, p[0].wrapping_add_signed(i as isize * s[0]), s[0], &mut buf[..m]) };
                for &x in &buf[..m] {
                    acc = step(acc, x);
                }
                i += m;
            }
        });
        acc
    };
    if nout > 1 && nout.saturating_mul(nred) >= super::elementwise::PAR_MIN {
        (0..nout).into_par_iter().map(one).collect()
    } else {
        (0..nout).map(one).collect()
    }
}

/// Validates the output of an accumulating reduction and returns it with
/// the mask.
fn accumulate_setup(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    input: &TensorView,
    dims: Option<&[i64]>,
    keepdim: bool,
) -> Result<(TensorView, Vec<bool>)> {
    let mask = reduce_mask(ctx, input.ndim(), dims)?;
    let expected = reduced_shape(input.shape(), &mask, keepdim);
    let out = ctx.output(call, 0)?;
    if out.shape() != expected.as_slice() {
        return Err(ctx.invalid(format!(
            "output has shape {:?} but the reduction of {:?} gives {expected:?}",
            out.shape(),
            input.shape()
        )));
    }
    if !disjoint(&out, input) {
        return Err(
            ctx.invalid("unsupported operation: the output of a reduction must not overlap its input")
        );
    }
    Ok((out, mask))
}

fn self_view(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<TensorView> {
    match call.args.first() {
        Some(super::ArgRef::Tensor(t)) => ctx.device_view(t, "self"),
        _ => Err(ctx.invalid("argument 0 (self) must be a tensor")),
    }
}

fn prod_impl(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    dims: Option<Vec<i64>>,
    keepdim: bool,
) -> Result<Option<Work>> {
    let input = self_view(ctx, call)?;
    let (out, mask) = accumulate_setup(ctx, call, &input, dims.as_deref(), keepdim)?;
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        if out.dtype().is_floating() {
            let res = fold_generic::<f64, f64>(&input, &mask, 1.0, |a, x| a * x);
            with_dense_output::<f64>(&out, |o| o.copy_from_slice(&res));
        } else {
            let res = fold_generic::<i64, i64>(&input, &mask, 1, |a, x| a.wrapping_mul(x));
            with_dense_output::<i64>(&out, |o| o.copy_from_slice(&res));
        }
        Ok(())
    })))
}

/// `prod(Tensor self, *, ScalarType? dtype=None) -> Tensor`: the product
/// of all elements (floating outputs in `f64`, integral ones wrapping
/// `i64`).
pub(crate) fn prod(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 2)?;
    args.tensor(0, "self")?;
    args.opt_dtype(1, "dtype")?;
    prod_impl(ctx, call, None, false)
}

/// `prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType?
/// dtype=None) -> Tensor` (and `prod.int_out`).
pub(crate) fn prod_dim(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 4)?;
    args.tensor(0, "self")?;
    let dim = int_at(ctx, call, 1, "dim")?;
    let keepdim = args.bool_or(2, "keepdim", false)?;
    args.opt_dtype(3, "dtype")?;
    prod_impl(ctx, call, Some(vec![dim]), keepdim)
}

/// `linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool
/// keepdim=False, *, ScalarType? dtype=None) -> Tensor` (and `.out`):
/// `(sum |x|^ord)^(1/ord)`, with `inf`/`-inf` the max/min of `|x|` and 0
/// the count of non-zeros; accumulated in `f64`.
pub(crate) fn linalg_vector_norm(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 5)?;
    args.tensor(0, "self")?;
    let ord = args.scalar(1, "ord", Some(super::Scalar::Int(2)))?.as_f64();
    let dims = args.opt_int_list(2, "dim")?;
    let keepdim = args.bool_or(3, "keepdim", false)?;
    args.opt_dtype(4, "dtype")?;
    let input = self_view(ctx, call)?;
    if !input.dtype().is_floating() {
        return Err(ctx.invalid(format!(
            "linalg.vector_norm: Expected a floating point or complex tensor as input. Got {}",
            input.dtype()
        )));
    }
    let (out, mask) = accumulate_setup(ctx, call, &input, dims.as_deref(), keepdim)?;
    if !out.dtype().is_floating() {
        return Err(ctx.unimplemented(format!("{} outputs are not supported", out.dtype())));
    }
    let nred: usize = input.shape().iter().zip(&mask).filter(|(_, &r)| r).map(|(&s, _)| s).product();
    if ord.is_infinite() && nred == 0 {
        return Err(ctx.invalid(
            "linalg.vector_norm cannot compute the inf norm on an empty tensor because the operation does \
             not have an identity",
        ));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        let res: Vec<f64> = if ord == 2.0 {
            fold_generic::<f64, f64>(&input, &mask, 0.0, |a, x| a + x * x)
                .into_iter()
                .map(f64::sqrt)
                .collect()
        } else if ord == 1.0 {
            fold_generic::<f64, f64>(&input, &mask, 0.0, |a, x| a + x.abs())
        } else if ord == f64::INFINITY {
            fold_generic::<f64, f64>(&input, &mask, 0.0, |a, x| {
                if x.is_nan() || a.is_nan() {
                    f64::NAN
                } else {
                    a.max(x.abs())
                }
            })
        } else if ord == f64::NEG_INFINITY {
            fold_generic::<f64, f64>(&input, &mask, f64::INFINITY, |a, x| {
                if x.is_nan() || a.is_nan() {
                    f64::NAN
                } else {
                    a.min(x.abs())
                }
            })
        } else if ord == 0.0 {
            fold_generic::<f64, f64>(&input, &mask, 0.0, |a, x| a + f64::from(u8::from(x != 0.0)))
        } else {
            fold_generic::<f64, f64>(&input, &mask, 0.0, |a, x| a + x.abs().powf(ord))
                .into_iter()
                .map(|s| s.powf(1.0 / ord))
                .collect()
        };
        with_dense_output::<f64>(&out, |o| o.copy_from_slice(&res));
        Ok(())
    })))
}

//! Operators whose result depends on element positions: `arange`
//! (`arange.start_out`: position ids, rotary frequencies), `tril`/`triu`
//! (causal masks) and `flip` (the backward of `cumsum`).
//!
//! `arange` computes `start + step * i` in PyTorch's CPU accumulation type
//! (`double` for `float`/`double`, `float` for the half types, `int64` for
//! integers) and rounds once. `tril`/`triu` copy or zero whole row
//! segments (`copy_from_slice`/`fill`, which vectorise), rows in parallel.
//! `flip` is a copy through a view with negated strides, so it runs on the
//! elementwise engine (blocked, multi-threaded) like any strided copy.

use rayon::prelude::*;

use super::elementwise::{dense_input, map1, par_chunks_mut, with_dense_output, Input, GRAIN, PAR_MIN};
use super::softmax::{int_arg, wrap_dim};
use super::view::{disjoint, TensorView};
use super::{Args, Frame, KernelCtx, Scalar};
use crate::dtype::{with_storage, DType, Element};
use crate::error::Result;
use crate::runtime::small::Dims;
use crate::runtime::Work;

/// Fills `out` (dense, row-major) with `f(i)`, in parallel for large outputs.
fn fill_positions<T: Element>(o: &mut [T], f: impl Fn(usize) -> T + Sync) {
    if o.len() >= PAR_MIN {
        par_chunks_mut(o, GRAIN, &|start, chunk| {
            for (j, v) in chunk.iter_mut().enumerate() {
                *v = f(start + j);
            }
        });
    } else {
        for (i, v) in o.iter_mut().enumerate() {
            *v = f(i);
        }
    }
}

/// `arange.start_out(Scalar start, Scalar end, Scalar step=1, *, Tensor(a!)
/// out)`: `out[i] = start + step * i`. The host sized `out` (PyTorch's meta
/// function computes the length); the kernel checks the range as PyTorch
/// does and that the length agrees.
pub(crate) fn arange_start_out(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 3)?;
    let start = args.scalar(0, "start", None)?;
    let end = args.scalar(1, "end", None)?;
    let step = args.scalar(2, "step", Some(Scalar::Int(1)))?;
    let out = ctx.output(call, 0)?;
    let dtype = out.dtype();
    if dtype == DType::Bool {
        return Err(ctx.unimplemented("\"arange_cpu\" not implemented for 'Bool'"));
    }
    let (xs, xe, xd) = (start.as_f64(), end.as_f64(), step.as_f64());
    if xd == 0.0 {
        return Err(ctx.invalid("step must be nonzero"));
    }
    if !xs.is_finite() || !xe.is_finite() {
        return Err(ctx.invalid(format!("unsupported range: {xs} -> {xe}")));
    }
    if !((xd > 0.0 && xe >= xs) || (xd < 0.0 && xe <= xs)) {
        return Err(ctx.invalid("upper bound and larger bound inconsistent with step sign"));
    }
    let expected = if dtype.is_floating() {
        ((xe - xs) / xd).ceil() as usize
    } else {
        let (s, e, d) = (start.cast::<i64>() as i128, end.cast::<i64>() as i128, step.cast::<i64>() as i128);
        // ceil((e - s) / d) for a step of either sign.
        ((e - s + d - d.signum()) / d).max(0) as usize
    };
    if out.ndim() != 1 || out.numel() != expected {
        return Err(ctx.invalid(format!(
            "out has shape {:?}, but the range {xs} -> {xe} with step {xd} has {expected} elements",
            out.shape()
        )));
    }
    if expected == 0 {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        match dtype {
            DType::Float32 | DType::Float64 => {
                let (s, d) = (start.as_f64(), step.as_f64());
                with_storage!(dtype, T => with_dense_output::<T>(&out, |o| {
                    fill_positions(o, |i| T::from_f64(s + d * i as f64))
                }));
            }
            DType::Float16 | DType::BFloat16 => {
                let (s, d) = (start.as_f64() as f32, step.as_f64() as f32);
                with_storage!(dtype, T => with_dense_output::<T>(&out, |o| {
                    fill_positions(o, |i| T::from_f32(s + d * i as f32))
                }));
            }
            _ => {
                let (s, d) = (start.cast::<i64>(), step.cast::<i64>());
                with_storage!(dtype, T => with_dense_output::<T>(&out, |o| {
                    fill_positions(o, |i| T::from_i64(s.wrapping_add(d.wrapping_mul(i as i64))))
                }));
            }
        }
        Ok(())
    })))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Triangle {
    Lower,
    Upper,
}

/// `tril`/`triu(Tensor self, SymInt diagonal=0)` (and their in-place and
/// out= forms): the last two dimensions are matrices; `tril` keeps
/// element `(i, j)` when `j - i <= diagonal`, `triu` when `j - i >=
/// diagonal`, and zeroes the rest. Every dtype.
fn triangle(ctx: &KernelCtx<'_>, call: &Frame<'_>, which: Triangle) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 1, 2)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let diagonal = if call.args.len() > 1 { int_arg(ctx, call, 1, "diagonal")? } else { 0 };
    let out = ctx.output(call, 0)?;
    let name = if which == Triangle::Lower { "tril" } else { "triu" };
    if input.ndim() < 2 {
        return Err(ctx.invalid(format!("{name}: input tensor must have at least 2 dimensions")));
    }
    if out.shape() != input.shape() || out.dtype() != input.dtype() {
        return Err(ctx.invalid(format!(
            "out must have self's shape {:?} and dtype {} (got {:?}, {})",
            input.shape(),
            input.dtype(),
            out.shape(),
            out.dtype()
        )));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    let rows = input.shape()[input.ndim() - 2];
    let cols = input.shape()[input.ndim() - 1];
    Ok(Some(Work::new(move || {
        with_storage!(out.dtype(), T => {
            // An in-place call reads a copy (dense_input copies an input
            // that shares memory with the output).
            let x = dense_input::<T>(&input, &out);
            with_dense_output::<T>(&out, |o| {
                let row = |(g, dst): (usize, &mut [T])| {
                    let r = (g % rows) as i64;
                    let src = &x[g * cols..(g + 1) * cols];
                    // The kept columns are [0, keep) for tril, [keep, cols) for triu.
                    let edge = match which {
                        Triangle::Lower => r + diagonal + 1,
                        Triangle::Upper => r + diagonal,
                    };
                    let keep = edge.clamp(0, cols as i64) as usize;
                    let (head, tail) = dst.split_at_mut(keep);
                    match which {
                        Triangle::Lower => {
                            head.copy_from_slice(&src[..keep]);
                            tail.fill(T::ZERO);
                        }
                        Triangle::Upper => {
                            head.fill(T::ZERO);
                            tail.copy_from_slice(&src[keep..]);
                        }
                    }
                };
                if o.len() >= PAR_MIN {
                    o.par_chunks_mut(cols).enumerate().for_each(row);
                } else {
                    o.chunks_mut(cols).enumerate().for_each(row);
                }
            });
        });
        Ok(())
    })))
}

/// `tril(Tensor self, SymInt diagonal=0) -> Tensor` (registered for `tril.out`).
pub(crate) fn tril(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    triangle(ctx, call, Triangle::Lower)
}

/// `triu(Tensor self, SymInt diagonal=0) -> Tensor` (registered for `triu.out`).
pub(crate) fn triu(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    triangle(ctx, call, Triangle::Upper)
}

/// `flip(Tensor self, int[] dims) -> Tensor`: `out[.., i, ..] = self[..,
/// n - 1 - i, ..]` along each of `dims`. Every dtype.
pub(crate) fn flip(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let dims = args.opt_int_list(1, "dims")?.unwrap_or_default();
    let out = ctx.output(call, 0)?;
    if out.shape() != input.shape() || out.dtype() != input.dtype() {
        return Err(ctx.invalid("out must have self's shape and dtype"));
    }
    let mut flipped = vec![false; input.ndim()];
    for &d in &dims {
        let d = wrap_dim(ctx, d, input.ndim())?;
        if input.ndim() == 0 {
            continue;
        }
        if flipped[d] {
            return Err(ctx.invalid(format!("dim {d} appears multiple times in the list of dims")));
        }
        flipped[d] = true;
    }
    if !disjoint(&out, &input) {
        return Err(ctx.invalid("unsupported operation: the output must not overlap the input"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    let mut strides: Dims<isize> = Dims::from_slice(input.strides());
    let mut addr = input.addr();
    for (d, &f) in flipped.iter().enumerate() {
        if f {
            let span = (input.shape()[d] as isize - 1) * strides[d] * input.itemsize() as isize;
            addr = addr.wrapping_add_signed(span);
            strides[d] = -strides[d];
        }
    }
    // SAFETY: the flipped view addresses exactly the elements of `input`
    // (each flipped dimension starts at its last index and walks back), a
    // validated view, and `addr` stays aligned (whole elements moved).
    let view =
        unsafe { TensorView::from_validated(addr, input.dtype(), Dims::from_slice(input.shape()), strides) };
    Ok(Some(with_storage!(out.dtype(), T => map1::<T, T, _>(out, Input::View(view), |x| x))))
}

//! The elementwise engine: `out[i] = f(a[i], b[i])` over broadcast strided
//! views with dtype conversion, shared by every pointwise operator.
//!
//! Execution picks one of two paths:
//!
//! - **Contiguous fast path.** When the iteration space coalesces to one
//!   dimension, the output and the tensor inputs are dense in exactly the
//!   compute types, the loop runs over Rust slices (`&mut [R]`, `&[A]`, or a
//!   hoisted constant for broadcast scalars). That is a plain zip loop with
//!   the operator inlined and no per-element dispatch, which LLVM
//!   vectorises. An input that *is* the output (in-place ops) is read
//!   through the output slice, never through a second aliasing slice.
//! - **General path.** A [`Plan`] reorders dimensions by output stride,
//!   drops size-1 dimensions and merges dimensions that are contiguous in
//!   every operand, then walks the space as 1-D runs. Each run is processed
//!   in blocks of [`BLOCK`] elements: inputs are loaded (and converted) into
//!   stack buffers, `f` runs over the buffers, results are converted and
//!   stored. Dtype dispatch happens once per block, not per element.
//!
//! Work above [`PAR_MIN`] elements is split across rayon in [`GRAIN`]-sized
//! chunks, but only when that cannot race: the output must provably not
//! overlap itself and each input must be either the output's exact layout or
//! disjoint from it. Anything else (e.g. `a.add_(a.t())`, which PyTorch also
//! leaves undefined) runs sequentially through raw pointers, so no overlap
//! can ever produce aliasing references or data races.
//!
//! The engine is split by arity: [`plan`] holds the strided iteration and
//! the load/store primitives (shared with the reduction and indexing
//! kernels), [`binary`] the `map1`/`map2` engine described above, and
//! [`ternary`] `map3`, which has a raw-pointer loop for dense operands and
//! otherwise gathers, computes and scatters (correct under any aliasing)
//! rather than walking strides itself. This module holds the parameters
//! and the helpers other kernels use to read inputs and write outputs
//! densely.

use std::borrow::Cow;

use super::view::{disjoint, TensorView};
use crate::dtype::Element;

mod binary;
mod plan;
mod ternary;

pub(crate) use binary::{fill, map1, map2};
pub(crate) use plan::{chunks, gather, load, par_chunks_mut, par_ranges, scatter, store, Plan};
pub(crate) use ternary::map3;

/// Elements below which work is not split across threads.
pub(crate) const PAR_MIN: usize = 32 * 1024;
/// Elements per parallel task.
pub(crate) const GRAIN: usize = 32 * 1024;
/// Elements per conversion block on the general path.
const BLOCK: usize = 256;
/// Operands a plan can carry (output plus two inputs).
pub(crate) const MAX_OPS: usize = 3;

/// An input of the engine: a view already broadcast to the output's shape,
/// or a constant in the compute type.
#[derive(Debug, Clone)]
pub(crate) enum Input<A> {
    View(TensorView),
    Const(A),
}

/// Whether splitting the output across threads cannot race: the output
/// does not overlap itself and every input either is laid out exactly like
/// it or does not touch its memory.
pub(crate) fn parallel_ok<'a>(out: &TensorView, inputs: impl Iterator<Item = &'a TensorView>) -> bool {
    out.is_non_overlapping() && {
        let mut ok = true;
        for v in inputs {
            ok &= v.same_layout(out) || disjoint(v, out);
        }
        ok
    }
}

/// A view's elements as a row-major slice of `A`: borrowed from device
/// memory when the view is contiguous, of exactly type `A` and disjoint
/// from `out` (so no mutable slice of `out` can alias it), else gathered
/// (and converted) into a new vector. Call only from stream work, while the
/// view's memory is guaranteed live.
pub(crate) fn dense_input<'v, A: Element>(v: &'v TensorView, out: &TensorView) -> Cow<'v, [A]> {
    if v.numel() > 0 && v.is_contiguous() && v.dtype() == A::DTYPE && disjoint(v, out) {
        // SAFETY: a contiguous validated view of `numel` aligned elements
        // of type A (view invariant), live while the work runs, and not
        // written by this work (it is disjoint from the only output).
        Cow::Borrowed(unsafe { std::slice::from_raw_parts(v.addr() as *const A, v.numel()) })
    } else {
        Cow::Owned(gather::<A>(v))
    }
}

/// Runs `f` over the output as a mutable row-major slice of `R`: the
/// device memory itself when `out` is contiguous and of type `R`, else a
/// zero-initialised buffer that is scattered (converted) into `out`
/// afterwards. Call only from stream work; the caller's input slices must
/// come from [`dense_input`] with this `out`.
pub(crate) fn with_dense_output<R: Element>(out: &TensorView, f: impl FnOnce(&mut [R])) {
    let n = out.numel();
    if n == 0 {
        return;
    }
    if out.is_contiguous() && out.dtype() == R::DTYPE {
        // SAFETY: a contiguous validated view of `n` aligned elements of R,
        // live while the work runs; inputs read through `dense_input` are
        // disjoint from it or copies, so this is the only reference.
        f(unsafe { std::slice::from_raw_parts_mut(out.addr() as *mut R, n) });
    } else {
        let mut buf = vec![R::ZERO; n];
        f(&mut buf);
        scatter(out, &buf);
    }
}

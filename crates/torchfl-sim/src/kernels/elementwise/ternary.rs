//! The three-input engine (`map3`), for `where`, `clamp`, `addcmul`,
//! `lerp` and the like.

use std::ops::Range;

use super::plan::{gather, par_chunks_mut, par_ranges, scatter};
use super::{Input, GRAIN, PAR_MIN};
use crate::dtype::Element;
use crate::kernels::view::{disjoint, TensorView};
use crate::runtime::Work;

/// Where a [`map3`] fast-path input comes from.
#[derive(Debug, Clone, Copy)]
enum Src3<A> {
    /// `n` dense elements of `A` at this address: disjoint from the
    /// output or exactly the output (in place); read through raw pointers
    /// only, element `i` before output element `i` is written.
    Ptr(usize),
    Const(A),
}

/// `out = f(a, b, c)` elementwise, computing in `A` and producing `R` (see
/// [`map2`]); inputs must already be broadcast to the output's shape.
///
/// Dense operands of exactly the compute types take a raw-pointer loop
/// (split across rayon above [`PAR_MIN`] elements); anything else gathers
/// the inputs into row-major buffers of `A`, computes, and scatters the
/// result, which is correct for any aliasing between inputs and output.
pub(crate) fn map3<A, R, F>(out: TensorView, a: Input<A>, b: Input<A>, c: Input<A>, f: F) -> Work
where
    A: Element,
    R: Element,
    F: Fn(A, A, A) -> R + Copy + Send + Sync + 'static,
{
    Work::new(move || {
        run_map3(&out, [&a, &b, &c], f);
        Ok(())
    })
}

fn run_map3<A, R, F>(out: &TensorView, inputs: [&Input<A>; 3], f: F)
where
    A: Element,
    R: Element,
    F: Fn(A, A, A) -> R + Copy + Send + Sync,
{
    let n = out.numel();
    if n == 0 {
        return;
    }
    let Some(srcs) = dense_sources::<A, R>(out, inputs) else {
        run_gathered3(out, inputs, f);
        return;
    };
    let o = out.addr();
    let body = move |range: Range<usize>| {
        let get = |s: Src3<A>, i: usize| match s {
            // SAFETY: `Ptr` inputs are `n` dense readable elements of A
            // (view invariant, checked by `dense_sources`) and `i < n`.
            Src3::Ptr(p) => unsafe { (p as *const A).add(i).read() },
            Src3::Const(c) => c,
        };
        if let [Src3::Ptr(pa), Src3::Ptr(pb), Src3::Ptr(pc)] = srcs {
            for i in range {
                // SAFETY: as in `get`; the output is `n` dense writable
                // elements of R (checked by `dense_sources`), and element
                // `i` of every input (possibly the output itself) was read
                // above.
                unsafe {
                    let v = f(
                        (pa as *const A).add(i).read(),
                        (pb as *const A).add(i).read(),
                        (pc as *const A).add(i).read(),
                    );
                    (o as *mut R).add(i).write(v);
                }
            }
        } else {
            for i in range {
                let v = f(get(srcs[0], i), get(srcs[1], i), get(srcs[2], i));
                // SAFETY: the output is `n` dense writable elements of R
                // (checked by `dense_sources`) and `i < n`; each index is
                // written by one task.
                unsafe { (o as *mut R).add(i).write(v) };
            }
        }
    };
    if n >= PAR_MIN {
        par_ranges(n, GRAIN, &body);
    } else {
        body(0..n);
    }
}

/// Where the raw-pointer loop of [`run_map3`] reads each input, or `None`
/// when it does not apply: the output must be dense in `R`, and each input
/// a constant, a broadcast element, or dense in `A` and either disjoint
/// from the output or exactly it.
fn dense_sources<A: Element, R: Element>(out: &TensorView, inputs: [&Input<A>; 3]) -> Option<[Src3<A>; 3]> {
    if !out.is_contiguous() || out.dtype() != R::DTYPE {
        return None;
    }
    let mut srcs = [Src3::Const(A::ZERO); 3];
    for (k, input) in inputs.iter().enumerate() {
        srcs[k] = match input {
            Input::Const(c) => Src3::Const(*c),
            Input::View(v) if v.dtype() == A::DTYPE && v.strides().iter().all(|&s| s == 0) => {
                // SAFETY: a readable element of a validated view of type A,
                // read before anything is written.
                Src3::Const(unsafe { (v.addr() as *const A).read() })
            }
            Input::View(v)
                if v.dtype() == A::DTYPE
                    && v.is_contiguous()
                    && (disjoint(v, out) || (v.addr() == out.addr() && A::DTYPE == R::DTYPE)) =>
            {
                Src3::Ptr(v.addr())
            }
            Input::View(_) => return None,
        };
    }
    Some(srcs)
}

/// [`run_map3`] for any layout and aliasing: gathers the inputs into
/// row-major buffers, computes, and scatters the result.
fn run_gathered3<A, R, F>(out: &TensorView, inputs: [&Input<A>; 3], f: F)
where
    A: Element,
    R: Element,
    F: Fn(A, A, A) -> R + Copy + Send + Sync,
{
    let n = out.numel();
    let load_all = |i: &Input<A>| -> Vec<A> {
        match i {
            Input::Const(c) => vec![*c; n],
            Input::View(v) => gather::<A>(v),
        }
    };
    let (va, vb, vc) = (load_all(inputs[0]), load_all(inputs[1]), load_all(inputs[2]));
    let mut res = vec![R::ZERO; n];
    if n >= PAR_MIN {
        par_chunks_mut(&mut res, GRAIN, &|start, chunk| {
            for (j, r) in chunk.iter_mut().enumerate() {
                *r = f(va[start + j], vb[start + j], vc[start + j]);
            }
        });
    } else {
        for (j, r) in res.iter_mut().enumerate() {
            *r = f(va[j], vb[j], vc[j]);
        }
    }
    scatter(out, &res);
}

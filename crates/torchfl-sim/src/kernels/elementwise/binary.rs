//! The one- and two-input engine (`map1`, `map2`, `fill`): the hot path
//! of every pointwise operator, hence its two paths (a contiguous loop over
//! slices, and a blocked strided walk) and the care taken to keep dense
//! work unboxed.

use std::ops::Range;

use super::plan::{load, par_chunks_mut, par_ranges, store, Plan};
use super::{parallel_ok, Input, BLOCK, GRAIN, MAX_OPS, PAR_MIN};
use crate::dtype::{cast, DType, Element};
use crate::kernels::view::TensorView;
use crate::runtime::small::Dims;
use crate::runtime::Work;

/// A fast-path source.
#[derive(Clone, Copy)]
enum Src<'a, A> {
    /// The output itself (in-place); read through the output slice.
    Out,
    Slice(&'a [A]),
    Const(A),
}

impl<A: Copy> Src<'_, A> {
    fn sub(&self, start: usize, len: usize) -> Self {
        match *self {
            Src::Slice(s) => Src::Slice(&s[start..start + len]),
            other => other,
        }
    }
}

#[inline(always)]
fn fast2<A: Element, R: Element, F: Fn(A, A) -> R>(o: &mut [R], a: Src<'_, A>, b: Src<'_, A>, f: &F) {
    // `Out` is produced only when R and A are the same type, so the casts
    // below are identities.
    match (a, b) {
        (Src::Slice(a), Src::Slice(b)) => {
            for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        }
        (Src::Slice(a), Src::Const(y)) => {
            for (o, &x) in o.iter_mut().zip(a) {
                *o = f(x, y);
            }
        }
        (Src::Const(x), Src::Slice(b)) => {
            for (o, &y) in o.iter_mut().zip(b) {
                *o = f(x, y);
            }
        }
        (Src::Const(x), Src::Const(y)) => o.fill(f(x, y)),
        (Src::Out, Src::Slice(b)) => {
            for (o, &y) in o.iter_mut().zip(b) {
                *o = f(cast(*o), y);
            }
        }
        (Src::Out, Src::Const(y)) => {
            for o in o.iter_mut() {
                *o = f(cast(*o), y);
            }
        }
        (Src::Slice(a), Src::Out) => {
            for (o, &x) in o.iter_mut().zip(a) {
                *o = f(x, cast(*o));
            }
        }
        (Src::Const(x), Src::Out) => {
            for o in o.iter_mut() {
                *o = f(x, cast(*o));
            }
        }
        (Src::Out, Src::Out) => {
            for o in o.iter_mut() {
                let v: A = cast(*o);
                *o = f(v, v);
            }
        }
    }
}

/// `out = f(a, b)` elementwise, computing in `A` and producing `R` (then
/// converted to the output's dtype). Inputs must already be broadcast to
/// the output's shape.
pub(crate) fn map2<A, R, F>(out: TensorView, a: Input<A>, b: Input<A>, f: F) -> Work
where
    A: Element,
    R: Element,
    F: Fn(A, A) -> R + Copy + Send + Sync + 'static,
{
    // Row-major dense operands (the common case) are one flat run, known
    // already: the work then carries a few addresses instead of the views.
    if let Some(flat) = dense_inner_strides(&out, [&a, &b]).and_then(|s| Flat::new::<R>(&out, [&a, &b], s)) {
        return Work::new(move || {
            flat.run(f);
            Ok(())
        });
    }
    Work::new(move || {
        run_map2(&out, &a, &b, f);
        Ok(())
    })
}

/// `out = f(a)` elementwise (see [`map2`]).
pub(crate) fn map1<A, R, F>(out: TensorView, a: Input<A>, f: F) -> Work
where
    A: Element,
    R: Element,
    F: Fn(A) -> R + Copy + Send + Sync + 'static,
{
    map2(out, a, Input::Const(A::ZERO), move |x, _| f(x))
}

/// Fills `out` with `value` (already in the output's storage type).
pub(crate) fn fill<T: Element>(out: TensorView, value: T) -> Work {
    map2(out, Input::Const(value), Input::Const(value), |x: T, _| x)
}

fn run_map2<A, R, F>(out: &TensorView, a: &Input<A>, b: &Input<A>, f: F)
where
    A: Element,
    R: Element,
    F: Fn(A, A) -> R + Copy + Send + Sync,
{
    match plan2::<A, R>(out, [a, b]) {
        Planned::Empty => {}
        Planned::Flat(flat) => flat.run(f),
        // The strided path calls `f` on blocks behind a `dyn` (one call per
        // BLOCK elements): its plan walk and dtype conversions are compiled
        // once per dtype pair instead of once per operator.
        Planned::Strided(plan) => general2::<A, R>(out, &plan, [a, b], &|x: &[A], y: &[A], r: &mut [R]| {
            for ((r, &x), &y) in r.iter_mut().zip(x).zip(y) {
                *r = f(x, y);
            }
        }),
    }
}

/// How [`run_map2`] iterates.
enum Planned<A> {
    Empty,
    Flat(Flat<A>),
    Strided(Plan),
}

fn plan2<A: Element, R: Element>(out: &TensorView, inputs: [&Input<A>; 2]) -> Planned<A> {
    if out.numel() == 0 {
        return Planned::Empty;
    }
    let zeros: Dims<isize> = Dims::from_elem(0, out.ndim());
    fn op<'a, A>(input: &'a Input<A>, zeros: &'a [isize]) -> (usize, &'a [isize], usize) {
        match input {
            Input::View(v) => (v.addr(), v.strides(), v.itemsize()),
            Input::Const(_) => (0, zeros, 0),
        }
    }
    let ops = [(out.addr(), out.strides(), out.itemsize()), op(inputs[0], &zeros), op(inputs[1], &zeros)];
    let plan = Plan::new(out.shape(), &ops, true);
    if plan.is_flat() {
        let inner = [plan.inner_stride(0), plan.inner_stride(1), plan.inner_stride(2)];
        if let Some(flat) = Flat::new::<R>(out, inputs, inner) {
            return Planned::Flat(flat);
        }
    }
    Planned::Strided(plan)
}

/// The flat byte strides of row-major dense operands (inputs that are whole
/// broadcast scalars count, with stride 0), or `None`.
fn dense_inner_strides<A>(out: &TensorView, inputs: [&Input<A>; 2]) -> Option<[isize; MAX_OPS]> {
    if !out.is_contiguous() {
        return None;
    }
    let mut inner = [out.itemsize() as isize, 0, 0];
    for (k, input) in inputs.iter().enumerate() {
        inner[k + 1] = match input {
            Input::Const(_) => 0,
            Input::View(v) if v.is_contiguous() => v.itemsize() as isize,
            Input::View(v) if v.strides().iter().all(|&s| s == 0) => 0,
            Input::View(_) => return None,
        };
    }
    Some(inner)
}

/// Where a [`Flat`] run reads an input.
#[derive(Debug, Clone, Copy)]
enum FlatSrc<A> {
    /// The output itself (in-place, same type).
    Out,
    /// `n` contiguous elements at this address, disjoint from the output.
    Dense(usize),
    /// One element at this address, read when the work runs.
    Elem(usize),
    Const(A),
}

/// The contiguous fast path: `n` dense output elements of `R`, inputs
/// dense, broadcast or constant in exactly the compute type. Built only
/// from validated views ([`Flat::new`]), so its addresses carry their
/// guarantees: readable (inputs) and writable (output) for `n` elements
/// until the work has run.
#[derive(Debug, Clone, Copy)]
struct Flat<A> {
    out: usize,
    n: usize,
    srcs: [FlatSrc<A>; 2],
}

impl<A: Element> Flat<A> {
    /// The fast path for an iteration space that is one flat run with
    /// byte strides `inner` (output, then inputs); `None` when it does not
    /// apply.
    fn new<R: Element>(out: &TensorView, inputs: [&Input<A>; 2], inner: [isize; MAX_OPS]) -> Option<Self> {
        let n = out.numel();
        let r_size = std::mem::size_of::<R>() as isize;
        let a_size = std::mem::size_of::<A>() as isize;
        if n == 0 || out.dtype() != R::DTYPE || inner[0] != r_size {
            return None;
        }
        let out_range = out.addr()..out.addr() + n * r_size as usize;
        let mut srcs = [FlatSrc::Const(A::ZERO); 2];
        for (k, input) in inputs.iter().enumerate() {
            srcs[k] = match input {
                Input::Const(c) => FlatSrc::Const(*c),
                Input::View(v) => {
                    if v.dtype() != A::DTYPE {
                        return None;
                    }
                    let stride = inner[k + 1];
                    if stride == 0 {
                        FlatSrc::Elem(v.addr())
                    } else if stride != a_size {
                        return None;
                    } else if v.addr() == out.addr() && A::DTYPE == R::DTYPE {
                        FlatSrc::Out
                    } else {
                        let r = v.addr()..v.addr() + n * a_size as usize;
                        if r.start < out_range.end && out_range.start < r.end {
                            return None;
                        }
                        FlatSrc::Dense(v.addr())
                    }
                }
            };
        }
        Some(Flat { out: out.addr(), n, srcs })
    }

    /// Computes `out = f(a, b)` over the run.
    fn run<R, F>(&self, f: F)
    where
        R: Element,
        F: Fn(A, A) -> R + Copy + Send + Sync,
    {
        let n = self.n;
        let src = |s: FlatSrc<A>| match s {
            FlatSrc::Out => Src::Out,
            // SAFETY: `n` contiguous, aligned, initialised elements of type
            // A (view invariant + the checks in `new`), disjoint from the
            // output, which is the only memory written.
            FlatSrc::Dense(addr) => Src::Slice(unsafe { std::slice::from_raw_parts(addr as *const A, n) }),
            // SAFETY: a readable element of a validated view of type A; it
            // is read once, before any write.
            FlatSrc::Elem(addr) => Src::Const(unsafe { (addr as *const A).read() }),
            FlatSrc::Const(c) => Src::Const(c),
        };
        let [sa, sb] = self.srcs.map(src);
        // SAFETY: the output is `n` contiguous, aligned elements of R (view
        // invariant + checks in `new`), and no other live reference aliases
        // it: inputs are disjoint, constants, or read through this very
        // slice.
        let o = unsafe { std::slice::from_raw_parts_mut(self.out as *mut R, n) };
        if n >= PAR_MIN {
            par_chunks_mut(o, GRAIN, &|start, oc| {
                fast2(oc, sa.sub(start, oc.len()), sb.sub(start, oc.len()), &f)
            });
        } else {
            fast2(o, sa, sb, &f);
        }
    }
}

/// One block of outputs from one block of each input (the strided path's
/// only operator-specific code).
type BlockFn<'f, A, R> = dyn Fn(&[A], &[A], &mut [R]) + Sync + 'f;

/// The general strided path with blocked dtype conversion: `block` computes
/// one block of outputs from one block of each input.
fn general2<A: Element, R: Element>(
    out: &TensorView,
    plan: &Plan,
    inputs: [&Input<A>; 2],
    block: &BlockFn<'_, A, R>,
) {
    let n = plan.numel();
    let consts: [Option<A>; 2] = inputs.map(|i| match i {
        Input::Const(c) => Some(*c),
        Input::View(_) => None,
    });
    let dtypes: [DType; 2] = inputs.map(|i| match i {
        Input::View(v) => v.dtype(),
        Input::Const(_) => A::DTYPE,
    });
    let out_dtype = out.dtype();
    let run = |range: Range<usize>| {
        let mut ba = [A::ZERO; BLOCK];
        let mut bb = [A::ZERO; BLOCK];
        let mut br = [R::ZERO; BLOCK];
        plan.for_each_run(range, [0; MAX_OPS], |p, s, len| {
            let mut i = 0;
            while i < len {
                let m = BLOCK.min(len - i);
                for (k, buf) in [&mut ba, &mut bb].into_iter().enumerate() {
                    match consts[k] {
                        Some(c) => buf[..m].fill(c),
                        // SAFETY: run addresses stay inside the validated
                        // views (plan invariant), so they are readable.
                        None => unsafe {
                            load(
                                dtypes[k],
                                p[k + 1].wrapping_add_signed(i as isize * s[k + 1]),
                                s[k + 1],
                                &mut buf[..m],
                            )
                        },
                    }
                }
                block(&ba[..m], &bb[..m], &mut br[..m]);
                // SAFETY: output addresses are inside the validated output;
                // when chunks run in parallel they are disjoint (checked by
                // `parallel_ok`), and reads of the same block happened
                // before this write.
                unsafe { store(out_dtype, p[0].wrapping_add_signed(i as isize * s[0]), s[0], &br[..m]) };
                i += m;
            }
        });
    };
    if n >= PAR_MIN
        && parallel_ok(
            out,
            inputs.iter().filter_map(|i| match i {
                Input::View(v) => Some(v),
                Input::Const(_) => None,
            }),
        )
    {
        par_ranges(n, GRAIN, &run);
    } else {
        run(0..n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_elementwise_work_is_not_boxed() {
        // SAFETY: never dereferenced (the work is dropped without running).
        let v = |addr: usize, shape: &[usize], strides: &[isize]| unsafe {
            TensorView::from_validated(
                addr,
                DType::Float64,
                Dims::from_slice(shape),
                Dims::from_slice(strides),
            )
        };
        let dense = |addr| v(addr, &[2, 3, 4, 5, 6], &[360, 120, 30, 6, 1]);
        let w = map2::<f64, f64, _>(dense(0), Input::View(dense(8192)), Input::View(dense(0)), |x, y| x + y);
        assert!(!w.is_boxed(), "dense, in place");
        let scalar = v(16384, &[2, 3, 4, 5, 6], &[0; 5]);
        let w = map2::<f64, f64, _>(dense(0), Input::View(scalar), Input::Const(2.0), |x, y| x * y);
        assert!(!w.is_boxed(), "broadcast scalar and constant");
        let transposed = v(8192, &[2, 3], &[1, 2]);
        let w = map2::<f64, f64, _>(
            v(0, &[2, 3], &[3, 1]),
            Input::View(transposed),
            Input::Const(1.0),
            |x, y| x + y,
        );
        drop(w); // strided work may be boxed
    }
}

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

use std::ops::Range;

use rayon::prelude::*;

use super::dtype::{cast, with_storage, DType, Element};
use super::view::{disjoint, TensorView};
use crate::small::{Dims, SmallVec, DIMS};
use crate::stream::Work;

/// Elements below which work is not split across threads.
pub(crate) const PAR_MIN: usize = 32 * 1024;
/// Elements per parallel task.
pub(crate) const GRAIN: usize = 32 * 1024;
/// Elements per conversion block on the general path.
const BLOCK: usize = 256;
/// Operands a plan can carry (output plus two inputs).
pub(crate) const MAX_OPS: usize = 3;

/// An iteration plan over up to [`MAX_OPS`] strided operands.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Sizes, outermost first; never empty.
    shape: Dims<usize>,
    /// Byte strides per dimension and operand.
    strides: SmallVec<[isize; MAX_OPS], DIMS>,
    /// Address of element 0 of each operand.
    base: [usize; MAX_OPS],
    numel: usize,
}

impl Plan {
    /// Plans iteration over `shape` for operands `(address, element
    /// strides, itemsize)`. `reorder` sorts dimensions by the first
    /// operand's stride (fast memory order); without it the logical
    /// row-major order is kept (for gathers into contiguous buffers).
    pub(crate) fn new(shape: &[usize], ops: &[(usize, &[isize], usize)], reorder: bool) -> Plan {
        let n = ops.len().min(MAX_OPS);
        let byte_stride = |d: usize| -> [isize; MAX_OPS] {
            let mut s = [0isize; MAX_OPS];
            for (k, op) in ops.iter().take(n).enumerate() {
                s[k] = op.1[d] * op.2 as isize;
            }
            s
        };
        let mut dims: Dims<usize> = (0..shape.len()).filter(|&d| shape[d] != 1).collect();
        if reorder && n > 0 {
            dims.sort_by_key(|&d| std::cmp::Reverse(ops[0].1[d].unsigned_abs()));
        }
        // Coalesce from the innermost dimension outwards.
        let mut sizes: Dims<usize> = Dims::new();
        let mut strides: SmallVec<[isize; MAX_OPS], DIMS> = SmallVec::new();
        for &d in dims.iter().rev() {
            let st = byte_stride(d);
            if let (Some(last_size), Some(last_st)) = (sizes.last_mut(), strides.last()) {
                if (0..n).all(|k| st[k] == last_st[k] * *last_size as isize) {
                    *last_size *= shape[d];
                    continue;
                }
            }
            sizes.push(shape[d]);
            strides.push(st);
        }
        sizes.reverse();
        strides.reverse();
        if sizes.is_empty() {
            sizes.push(1);
            strides.push([0; MAX_OPS]);
        }
        let mut base = [0usize; MAX_OPS];
        for (k, op) in ops.iter().take(n).enumerate() {
            base[k] = op.0;
        }
        Plan { numel: sizes.iter().product(), shape: sizes, strides, base }
    }

    pub(crate) fn numel(&self) -> usize {
        self.numel
    }

    /// One dimension after coalescing.
    pub(crate) fn is_flat(&self) -> bool {
        self.shape.len() == 1
    }

    /// Byte stride of operand `k` along the innermost dimension.
    pub(crate) fn inner_stride(&self, k: usize) -> isize {
        self.strides[self.shape.len() - 1][k]
    }

    /// Calls `f(addresses, inner byte strides, len)` for each maximal 1-D
    /// run of the linear index range `range` (row-major over the plan),
    /// with operand addresses offset by `offset[k]` bytes.
    pub(crate) fn for_each_run(
        &self,
        range: Range<usize>,
        offset: [isize; MAX_OPS],
        mut f: impl FnMut(&[usize; MAX_OPS], &[isize; MAX_OPS], usize),
    ) {
        if range.is_empty() {
            return;
        }
        let nd = self.shape.len();
        let inner = nd - 1;
        let mut idx: Dims<usize> = Dims::from_elem(0, nd);
        let mut rem = range.start;
        for d in (0..nd).rev() {
            idx[d] = rem % self.shape[d];
            rem /= self.shape[d];
        }
        let inner_strides = self.strides[inner];
        let mut pos = range.start;
        while pos < range.end {
            let len = (self.shape[inner] - idx[inner]).min(range.end - pos);
            let mut ptrs = [0usize; MAX_OPS];
            for (k, p) in ptrs.iter_mut().enumerate() {
                let mut a = self.base[k].wrapping_add_signed(offset[k]);
                for (&i, st) in idx.iter().zip(self.strides.iter()) {
                    a = a.wrapping_add_signed(i as isize * st[k]);
                }
                *p = a;
            }
            f(&ptrs, &inner_strides, len);
            pos += len;
            idx[inner] += len;
            let mut d = inner;
            while d > 0 && idx[d] == self.shape[d] {
                idx[d] = 0;
                d -= 1;
                idx[d] += 1;
            }
        }
    }
}

/// Splits `0..n` into [`GRAIN`]-sized ranges.
pub(crate) fn chunks(n: usize, grain: usize) -> impl IndexedParallelIterator<Item = Range<usize>> {
    let grain = grain.max(1);
    (0..n.div_ceil(grain)).into_par_iter().map(move |c| c * grain..((c + 1) * grain).min(n))
}

/// Loads `buf.len()` elements of `dtype` from `addr` every `stride` bytes,
/// converting them to `A`.
///
/// # Safety
/// Every address read must be valid for a read of `dtype`.
#[inline]
pub(crate) unsafe fn load<A: Element>(dtype: DType, addr: usize, stride: isize, buf: &mut [A]) {
    with_storage!(dtype, T => {
        if stride == std::mem::size_of::<T>() as isize {
            for (j, slot) in buf.iter_mut().enumerate() {
                // SAFETY: caller guarantees the addresses are readable.
                *slot = cast::<T, A>(unsafe { (addr as *const T).add(j).read_unaligned() });
            }
        } else {
            for (j, slot) in buf.iter_mut().enumerate() {
                let p = addr.wrapping_add_signed(stride * j as isize) as *const T;
                // SAFETY: caller guarantees the addresses are readable.
                *slot = cast::<T, A>(unsafe { p.read_unaligned() });
            }
        }
    })
}

/// Stores `buf` to `addr` every `stride` bytes, converting to `dtype`.
///
/// # Safety
/// Every address written must be valid for a write of `dtype`, and no other
/// thread may access them concurrently.
#[inline]
pub(crate) unsafe fn store<R: Element>(dtype: DType, addr: usize, stride: isize, buf: &[R]) {
    with_storage!(dtype, T => {
        for (j, &v) in buf.iter().enumerate() {
            let p = addr.wrapping_add_signed(stride * j as isize) as *mut T;
            // SAFETY: caller guarantees the addresses are writable.
            unsafe { p.write_unaligned(cast::<R, T>(v)) };
        }
    })
}

/// Reads a view into a row-major vector of `A`.
pub(crate) fn gather<A: Element>(v: &TensorView) -> Vec<A> {
    let n = v.numel();
    let mut out = vec![A::ZERO; n];
    if n == 0 {
        return out;
    }
    let plan = Plan::new(v.shape(), &[(v.addr(), v.strides(), v.itemsize())], false);
    let mut pos = 0;
    plan.for_each_run(0..n, [0; MAX_OPS], |p, s, len| {
        // SAFETY: a TensorView's elements are readable (its invariant).
        unsafe { load(v.dtype(), p[0], s[0], &mut out[pos..pos + len]) };
        pos += len;
    });
    out
}

/// Writes a row-major slice into a view (sequentially).
pub(crate) fn scatter<A: Element>(v: &TensorView, data: &[A]) {
    let n = v.numel().min(data.len());
    if n == 0 {
        return;
    }
    let plan = Plan::new(v.shape(), &[(v.addr(), v.strides(), v.itemsize())], false);
    let mut pos = 0;
    plan.for_each_run(0..n, [0; MAX_OPS], |p, s, len| {
        // SAFETY: a TensorView's elements are writable (its invariant), and
        // this loop is the only writer.
        unsafe { store(v.dtype(), p[0], s[0], &data[pos..pos + len]) };
        pos += len;
    });
}

/// An input of the engine: a view already broadcast to the output's shape,
/// or a constant in the compute type.
#[derive(Debug, Clone)]
pub(crate) enum Input<A> {
    View(TensorView),
    Const(A),
}

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
    let n = out.numel();
    if n == 0 {
        return;
    }
    let inputs = [a, b];
    let zeros: Dims<isize> = Dims::from_elem(0, out.ndim());
    fn op<'a, A>(input: &'a Input<A>, zeros: &'a [isize]) -> (usize, &'a [isize], usize) {
        match input {
            Input::View(v) => (v.addr(), v.strides(), v.itemsize()),
            Input::Const(_) => (0, zeros, 0),
        }
    }
    let ops = [(out.addr(), out.strides(), out.itemsize()), op(a, &zeros), op(b, &zeros)];
    let plan = Plan::new(out.shape(), &ops, true);
    if plan.is_flat() {
        let inner = [plan.inner_stride(0), plan.inner_stride(1), plan.inner_stride(2)];
        if let Some(flat) = Flat::new::<R>(out, inputs, inner) {
            flat.run(f);
            return;
        }
    }
    general2(out, &plan, inputs, f);
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
            o.par_chunks_mut(GRAIN).enumerate().for_each(|(i, oc)| {
                let start = i * GRAIN;
                fast2(oc, sa.sub(start, oc.len()), sb.sub(start, oc.len()), &f);
            });
        } else {
            fast2(o, sa, sb, &f);
        }
    }
}

/// The general strided path with blocked dtype conversion.
fn general2<A, R, F>(out: &TensorView, plan: &Plan, inputs: [&Input<A>; 2], f: F)
where
    A: Element,
    R: Element,
    F: Fn(A, A) -> R + Copy + Send + Sync,
{
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
                for j in 0..m {
                    br[j] = f(ba[j], bb[j]);
                }
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
        chunks(n, GRAIN).for_each(run);
    } else {
        run(0..n);
    }
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
pub(crate) fn dense_input<'v, A: Element>(v: &'v TensorView, out: &TensorView) -> std::borrow::Cow<'v, [A]> {
    if v.numel() > 0 && v.is_contiguous() && v.dtype() == A::DTYPE && disjoint(v, out) {
        // SAFETY: a contiguous validated view of `numel` aligned elements
        // of type A (view invariant), live while the work runs, and not
        // written by this work (it is disjoint from the only output).
        std::borrow::Cow::Borrowed(unsafe { std::slice::from_raw_parts(v.addr() as *const A, v.numel()) })
    } else {
        std::borrow::Cow::Owned(gather::<A>(v))
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
    if out.is_contiguous() && out.dtype() == R::DTYPE {
        let mut srcs = [Src3::Const(A::ZERO); 3];
        let mut ok = true;
        for (k, input) in inputs.iter().enumerate() {
            srcs[k] = match input {
                Input::Const(c) => Src3::Const(*c),
                Input::View(v) if v.dtype() == A::DTYPE && v.strides().iter().all(|&s| s == 0) => {
                    // SAFETY: a readable element of a validated view of
                    // type A, read before anything is written.
                    Src3::Const(unsafe { (v.addr() as *const A).read() })
                }
                Input::View(v)
                    if v.dtype() == A::DTYPE
                        && v.is_contiguous()
                        && (disjoint(v, out) || (v.addr() == out.addr() && A::DTYPE == R::DTYPE)) =>
                {
                    Src3::Ptr(v.addr())
                }
                Input::View(_) => {
                    ok = false;
                    Src3::Const(A::ZERO)
                }
            };
        }
        if ok {
            let o = out.addr();
            let body = move |range: Range<usize>| {
                let get = |s: Src3<A>, i: usize| match s {
                    // SAFETY: `Ptr` inputs are `n` dense readable elements
                    // of A (view invariant, checked above) and `i < n`.
                    Src3::Ptr(p) => unsafe { (p as *const A).add(i).read() },
                    Src3::Const(c) => c,
                };
                if let [Src3::Ptr(pa), Src3::Ptr(pb), Src3::Ptr(pc)] = srcs {
                    for i in range {
                        // SAFETY: as in `get`; the output is `n` dense
                        // writable elements of R, and element `i` of every
                        // input (possibly the output itself) was read above.
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
                        // SAFETY: the output is `n` dense writable elements
                        // of R and `i < n`; each index is written by one task.
                        unsafe { (o as *mut R).add(i).write(v) };
                    }
                }
            };
            if n >= PAR_MIN {
                chunks(n, GRAIN).for_each(body);
            } else {
                body(0..n);
            }
            return;
        }
    }
    let load_all = |i: &Input<A>| -> Vec<A> {
        match i {
            Input::Const(c) => vec![*c; n],
            Input::View(v) => gather::<A>(v),
        }
    };
    let (va, vb, vc) = (load_all(inputs[0]), load_all(inputs[1]), load_all(inputs[2]));
    let mut res = vec![R::ZERO; n];
    if n >= PAR_MIN {
        res.par_chunks_mut(GRAIN).enumerate().for_each(|(k, chunk)| {
            let start = k * GRAIN;
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

    #[test]
    fn plan_coalesces_contiguous() {
        let p = Plan::new(&[2, 3, 4], &[(0, &[12, 4, 1], 4), (0, &[12, 4, 1], 4)], true);
        assert!(p.is_flat());
        assert_eq!(p.numel(), 24);
        assert_eq!(p.inner_stride(0), 4);
        // A transposed input prevents full coalescing.
        let p = Plan::new(&[3, 4], &[(0, &[4, 1], 4), (0, &[1, 3], 4)], true);
        assert!(!p.is_flat());
    }

    #[test]
    fn plan_reorders_by_output_stride() {
        // Output is column-major: the plan makes dim 0 innermost.
        let p = Plan::new(&[3, 4], &[(0, &[1, 3], 4)], true);
        assert!(p.is_flat());
        let p = Plan::new(&[3, 4], &[(0, &[1, 3], 4)], false);
        assert!(!p.is_flat());
    }

    #[test]
    fn runs_cover_ranges_in_order() {
        let p = Plan::new(&[3, 5], &[(1000, &[10, 1], 1)], false);
        let mut seen = Vec::new();
        p.for_each_run(2..13, [0; MAX_OPS], |ptrs, s, len| {
            for j in 0..len {
                seen.push(ptrs[0] as isize + j as isize * s[0] - 1000);
            }
        });
        let expected: Vec<isize> = (2..13).map(|i| (i / 5) * 10 + i % 5).collect();
        assert_eq!(seen, expected);
    }
}

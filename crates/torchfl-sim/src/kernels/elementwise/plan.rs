//! Iteration plans and the strided load/store primitives: the part of the
//! elementwise engine that the reduction and indexing kernels build on
//! too, so that every engine walks strided memory and converts dtypes the
//! same way.

use std::ops::Range;

use rayon::prelude::*;

use super::MAX_OPS;
use crate::dtype::{cast, with_storage, DType, Element};
use crate::kernels::view::TensorView;
use crate::runtime::small::{Dims, SmallVec, DIMS};

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

// The two drivers below take their body as `&dyn Fn` on purpose. A body is
// one closure type per (operator, dtype, layout), and rayon's splitting and
// joining was compiled again for each of them: about 1,200 copies, a third
// of the simulator's machine code and of its release build time. Behind one
// indirect call per chunk of `GRAIN` elements, rayon is compiled once, while
// each body (the kernel's inner loop) stays monomorphized and inlined.

/// Calls `body` on each `grain`-sized range of `0..n`, in parallel.
pub(crate) fn par_ranges(n: usize, grain: usize, body: &(dyn Fn(Range<usize>) + Sync)) {
    chunks(n, grain).for_each(body);
}

/// Calls `body(start, chunk)` on each `grain`-sized chunk of `out`, in
/// parallel; `start` is the chunk's first index in `out`.
pub(crate) fn par_chunks_mut<T: Send>(out: &mut [T], grain: usize, body: &(dyn Fn(usize, &mut [T]) + Sync)) {
    let grain = grain.max(1);
    out.par_chunks_mut(grain).enumerate().for_each(|(i, chunk)| body(i * grain, chunk));
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

#[cfg(test)]
mod tests {
    use super::*;

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

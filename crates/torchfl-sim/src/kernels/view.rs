//! [`TensorView`]: a validated strided view of device memory.
//!
//! A view is a copy of a tensor descriptor (the frame's shape and stride
//! arrays die when the kernel returns) plus the *real* address of its first
//! element. Its fields are private and the only ways to get one are
//! [`TensorView::from_validated`], called by the kernel context after it has
//! checked the view's whole extent against the allocator, and
//! transformations that never reach outside the original extent
//! (broadcasting adds only zero strides). So holding a `TensorView` means
//! "every element address is inside a live allocation"; stream-ordered free
//! keeps it true until the work using the view has run. The engines rely on
//! this invariant for their raw reads and writes.

use crate::dtype::DType;
use crate::runtime::small::{Dims, SmallVec, DIMS};

/// A strided view of device memory with a validated extent.
#[derive(Debug, Clone)]
pub(crate) struct TensorView {
    addr: usize,
    dtype: DType,
    shape: Dims<usize>,
    strides: Dims<isize>,
}

/// The smallest and largest element offsets reached by a non-empty view.
pub(crate) fn extent(shape: &[usize], strides: &[isize]) -> (i128, i128) {
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&size, &stride) in shape.iter().zip(strides) {
        if size == 0 {
            continue;
        }
        let span = stride as i128 * (size as i128 - 1);
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    (lo, hi)
}

/// How two views share memory (PyTorch's `MemOverlapStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlap {
    /// Disjoint memory.
    None,
    /// Exactly the same memory range.
    Full,
    /// Ranges intersect without being equal.
    Partial,
    /// Not dense: cannot tell cheaply (treated as "no error", like PyTorch).
    TooHard,
}

impl TensorView {
    /// A view whose every element address has been checked to lie inside a
    /// live allocation (`addr` is the real address of element 0, ignored
    /// when the view is empty).
    ///
    /// # Safety
    /// The caller must have validated the extent of `shape`/`strides` from
    /// `addr` against the allocator, and `addr` must be aligned for `dtype`.
    pub(crate) unsafe fn from_validated(
        addr: usize,
        dtype: DType,
        shape: Dims<usize>,
        strides: Dims<isize>,
    ) -> Self {
        Self { addr, dtype, shape, strides }
    }

    pub(crate) fn addr(&self) -> usize {
        self.addr
    }
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }
    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub(crate) fn strides(&self) -> &[isize] {
        &self.strides
    }
    pub(crate) fn ndim(&self) -> usize {
        self.shape.len()
    }
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub(crate) fn itemsize(&self) -> usize {
        self.dtype.itemsize()
    }

    /// The view expanded to `shape` (trailing alignment, stride 0 for new
    /// and size-1 dimensions), or `None` if not broadcastable.
    #[inline(always)]
    pub(crate) fn broadcast_to(&self, shape: &[usize]) -> Option<TensorView> {
        if *self.shape == *shape {
            // Already that shape (the common case): only size-1 dimensions
            // change, to stride 0.
            let mut v = self.clone();
            for (&size, stride) in v.shape.iter().zip(v.strides.iter_mut()) {
                if size == 1 {
                    *stride = 0;
                }
            }
            return Some(v);
        }
        if self.ndim() > shape.len() {
            return None;
        }
        let lead = shape.len() - self.ndim();
        let mut strides = Dims::from_elem(0isize, shape.len());
        for (d, &size) in shape.iter().enumerate().skip(lead) {
            let own = self.shape[d - lead];
            if own == size {
                strides[d] = if size == 1 { 0 } else { self.strides[d - lead] };
            } else if own == 1 {
                strides[d] = 0;
            } else {
                return None;
            }
        }
        Some(TensorView { addr: self.addr, dtype: self.dtype, shape: Dims::from_slice(shape), strides })
    }

    /// [`TensorView::broadcast_to`] consuming the view, which the common
    /// case (already that shape) adjusts in place; gives the view back when
    /// it does not broadcast.
    #[inline(always)]
    pub(crate) fn into_broadcast(mut self, shape: &[usize]) -> Result<TensorView, TensorView> {
        if *self.shape == *shape {
            for (&size, stride) in self.shape.iter().zip(self.strides.iter_mut()) {
                if size == 1 {
                    *stride = 0;
                }
            }
            return Ok(self);
        }
        self.broadcast_to(shape).ok_or(self)
    }

    /// Whether several indices certainly share an element: a dimension of
    /// size > 1 with stride 0 (PyTorch's `has_internal_overlap == YES`).
    pub(crate) fn has_internal_overlap(&self) -> bool {
        self.shape.iter().zip(&self.strides).any(|(&s, &st)| s > 1 && st == 0)
    }

    /// Whether the view is non-empty and row-major contiguous (size-1
    /// dimensions may have any stride, as in PyTorch's `is_contiguous`).
    /// Such a view is trivially non-overlapping and dense, which lets the
    /// common case skip the general analyses below.
    pub(crate) fn is_contiguous(&self) -> bool {
        let mut expected = 1isize;
        for (&size, &stride) in self.shape.iter().zip(self.strides.iter()).rev() {
            if size == 0 {
                return false;
            }
            if size != 1 {
                if stride != expected {
                    return false;
                }
                expected = expected.saturating_mul(size as isize);
            }
        }
        true
    }

    /// Whether distinct indices provably address distinct elements (each
    /// dimension's stride exceeds the span of all smaller-stride ones).
    pub(crate) fn is_non_overlapping(&self) -> bool {
        if self.is_contiguous() {
            return true;
        }
        let mut dims: SmallVec<(usize, usize), DIMS> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&s, _)| s > 1)
            .map(|(&s, &st)| (st.unsigned_abs(), s))
            .collect();
        dims.sort_unstable();
        let mut span = 0usize;
        for &(stride, size) in &dims {
            if stride <= span {
                return false;
            }
            span = span.saturating_add(stride.saturating_mul(size - 1));
        }
        true
    }

    /// PyTorch's `is_non_overlapping_and_dense`: a permutation of a
    /// contiguous layout.
    pub(crate) fn is_non_overlapping_and_dense(&self) -> bool {
        if self.is_contiguous() {
            return true;
        }
        let mut dims: SmallVec<(isize, usize), DIMS> =
            self.shape.iter().zip(&self.strides).filter(|(&s, _)| s != 1).map(|(&s, &st)| (st, s)).collect();
        dims.sort_unstable();
        let mut expected = 1isize;
        for &(stride, size) in &dims {
            if stride != expected {
                return false;
            }
            expected = expected.saturating_mul(size as isize);
        }
        true
    }

    /// `[lo, hi)` byte addresses covered; `None` when empty.
    #[inline(always)]
    pub(crate) fn byte_range(&self) -> Option<(usize, usize)> {
        if self.numel() == 0 {
            return None;
        }
        let (lo, hi) = extent(&self.shape, &self.strides);
        let item = self.itemsize() as i128;
        let a = self.addr as i128;
        Some(((a + lo * item) as usize, (a + (hi + 1) * item) as usize))
    }

    /// Whether both views address the same elements in the same order.
    pub(crate) fn same_layout(&self, o: &TensorView) -> bool {
        self.addr == o.addr
            && self.dtype.itemsize() == o.dtype.itemsize()
            && self.shape == o.shape
            && self.strides == o.strides
    }
}

/// Whether the memory of `a` and `b` is disjoint (empty views always are).
pub(crate) fn disjoint(a: &TensorView, b: &TensorView) -> bool {
    match (a.byte_range(), b.byte_range()) {
        (Some((a0, a1)), Some((b0, b1))) => a1 <= b0 || b1 <= a0,
        _ => true,
    }
}

/// PyTorch's `get_overlap_status` for two views.
pub(crate) fn overlap(a: &TensorView, b: &TensorView) -> Overlap {
    if a.same_layout(b) && a.numel() > 0 {
        return Overlap::Full;
    }
    let (Some((a0, a1)), Some((b0, b1))) = (a.byte_range(), b.byte_range()) else {
        return Overlap::None;
    };
    if !a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense() {
        return Overlap::TooHard;
    }
    if a0 == b0 && a1 == b1 {
        Overlap::Full
    } else if a0 < b1 && b0 < a1 {
        Overlap::Partial
    } else {
        Overlap::None
    }
}

/// The result shape of broadcasting `shapes` together, or PyTorch's message.
pub(crate) fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Dims<usize>, String> {
    let ndim = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = Dims::from_elem(1usize, ndim);
    for shape in shapes {
        for (j, &size) in shape.iter().rev().enumerate() {
            let d = ndim - 1 - j;
            if out[d] == 1 {
                out[d] = size;
            } else if size != 1 && size != out[d] {
                return Err(format!(
                    "The size of tensor a ({}) must match the size of tensor b ({size}) at \
                     non-singleton dimension {d}",
                    out[d]
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(addr: usize, shape: &[usize], strides: &[isize]) -> TensorView {
        // SAFETY: these views are never dereferenced.
        unsafe {
            TensorView::from_validated(
                addr,
                DType::Float32,
                Dims::from_slice(shape),
                Dims::from_slice(strides),
            )
        }
    }

    #[test]
    fn extents() {
        assert_eq!(extent(&[2, 3], &[3, 1]), (0, 5));
        assert_eq!(extent(&[2, 3], &[-3, 1]), (-3, 2));
        assert_eq!(extent(&[4], &[0]), (0, 0));
    }

    #[test]
    fn broadcasting() {
        let a = v(64, &[3, 1], &[1, 1]);
        let b = a.broadcast_to(&[2, 3, 4]).unwrap();
        assert_eq!(b.strides(), &[0, 1, 0]);
        assert!(v(0, &[2, 3], &[3, 1]).is_contiguous());
        assert!(v(0, &[2, 1, 3], &[3, 7, 1]).is_contiguous());
        assert!(!v(0, &[2, 3], &[1, 2]).is_contiguous());
        assert!(!v(0, &[2, 3], &[6, 2]).is_contiguous());
        assert!(!v(0, &[2, 0], &[0, 1]).is_contiguous(), "empty views take the general analyses");
        assert!(a.broadcast_to(&[2, 4]).is_none());
        assert!(v(64, &[2, 3], &[3, 1]).broadcast_to(&[3]).is_none());
    }

    #[test]
    fn overlap_analysis() {
        let a = v(1000, &[4], &[1]);
        assert!(a.is_non_overlapping() && a.is_non_overlapping_and_dense());
        assert!(!v(0, &[2, 2], &[1, 1]).is_non_overlapping());
        assert!(v(0, &[2, 2], &[1, 2]).is_non_overlapping());
        assert!(v(0, &[3, 2], &[0, 1]).has_internal_overlap());
        assert_eq!(overlap(&a, &v(1000, &[4], &[1])), Overlap::Full);
        assert_eq!(overlap(&a, &v(1004, &[4], &[1])), Overlap::Partial);
        assert_eq!(overlap(&a, &v(1016, &[4], &[1])), Overlap::None);
        assert_eq!(overlap(&a, &v(1004, &[2], &[2])), Overlap::TooHard);
        assert!(disjoint(&a, &v(1016, &[1], &[1])));
    }
}

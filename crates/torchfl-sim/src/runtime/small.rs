//! [`SmallVec`]: a vector that keeps its first `N` items inline.
//!
//! The launch path copies small per-call lists (a tensor's shape and
//! strides, a call's decoded arguments, an iteration plan's dimensions) that
//! almost always have a handful of items. Keeping them inline avoids a heap
//! allocation and a free per list per call, which on a 4-element kernel cost
//! more than the arithmetic. Longer lists spill to a `Vec` transparently.
//!
//! Entirely safe code: unused inline slots hold `T::default()`.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// Inline capacity used for tensor dimensions (PyTorch's `DimVector` keeps
/// five inline; one more covers channels-last 5-D layouts with a batch).
pub(crate) const DIMS: usize = 4;

/// A vector holding up to `N` items inline before spilling to the heap.
#[derive(Clone)]
pub(crate) enum SmallVec<T, const N: usize> {
    /// `len <= N` items in `buf[..len]`.
    Inline { len: usize, buf: [T; N] },
    /// More than `N` items (or spilled once).
    Heap(Vec<T>),
}

/// Shape- or stride-like lists of tensor dimensions.
pub(crate) type Dims<T> = SmallVec<T, DIMS>;

impl<T: Default, const N: usize> SmallVec<T, N> {
    /// An empty vector.
    #[inline(always)]
    pub(crate) fn new() -> Self {
        SmallVec::Inline { len: 0, buf: std::array::from_fn(|_| T::default()) }
    }

    /// Appends `value`, spilling to the heap when the inline part is full.
    #[inline(always)]
    pub(crate) fn push(&mut self, value: T) {
        match self {
            SmallVec::Inline { len, buf } if *len < N => {
                buf[*len] = value;
                *len += 1;
            }
            SmallVec::Inline { len, buf } => {
                let mut v = Vec::with_capacity(2 * N.max(1));
                v.extend(buf[..*len].iter_mut().map(std::mem::take));
                v.push(value);
                *self = SmallVec::Heap(v);
            }
            SmallVec::Heap(v) => v.push(value),
        }
    }
}

impl<T: Copy, const N: usize> SmallVec<T, N> {
    /// A copy of `items`.
    #[inline(always)]
    pub(crate) fn from_slice(items: &[T]) -> Self
    where
        T: Default,
    {
        if items.len() <= N {
            let mut buf = [T::default(); N];
            buf[..items.len()].copy_from_slice(items);
            SmallVec::Inline { len: items.len(), buf }
        } else {
            SmallVec::Heap(items.to_vec())
        }
    }

    /// `n` copies of `value`.
    #[inline(always)]
    pub(crate) fn from_elem(value: T, n: usize) -> Self {
        if n <= N {
            // Slots past `n` are never read; filling them with `value` too
            // keeps this a single splat.
            SmallVec::Inline { len: n, buf: [value; N] }
        } else {
            SmallVec::Heap(vec![value; n])
        }
    }
}

impl<T: Default, const N: usize> Default for SmallVec<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> Deref for SmallVec<T, N> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        match self {
            SmallVec::Inline { len, buf } => &buf[..*len],
            SmallVec::Heap(v) => v,
        }
    }
}

impl<T, const N: usize> DerefMut for SmallVec<T, N> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            SmallVec::Inline { len, buf } => &mut buf[..*len],
            SmallVec::Heap(v) => v,
        }
    }
}

impl<T: Default, const N: usize> FromIterator<T> for SmallVec<T, N> {
    #[inline(always)]
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut v = Self::new();
        for item in iter {
            v.push(item);
        }
        v
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a SmallVec<T, N> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: fmt::Debug, const N: usize> fmt::Debug for SmallVec<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: PartialEq, const N: usize> PartialEq for SmallVec<T, N> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_then_spills() {
        let mut v: SmallVec<u32, 2> = SmallVec::new();
        assert!(v.is_empty());
        v.push(1);
        v.push(2);
        assert!(matches!(v, SmallVec::Inline { len: 2, .. }));
        v.push(3);
        assert!(matches!(v, SmallVec::Heap(_)));
        assert_eq!(&*v, &[1, 2, 3]);
        v[0] = 7;
        assert_eq!(&*v, &[7, 2, 3]);
        let w: SmallVec<u32, 2> = (0..5).collect();
        assert_eq!(&*w, &[0, 1, 2, 3, 4]);
        assert_eq!(&*SmallVec::<i64, 4>::from_slice(&[1, 2]), &[1, 2]);
        assert_eq!(&*SmallVec::<i64, 1>::from_slice(&[1, 2]), &[1, 2]);
        assert_eq!(&*SmallVec::<i64, 2>::from_elem(9, 3), &[9, 9, 9]);
        assert_eq!(SmallVec::<i64, 2>::from_elem(0, 2), SmallVec::from_slice(&[0, 0]));
        assert_eq!(format!("{:?}", SmallVec::<i64, 2>::from_slice(&[4])), "[4]");
    }
}

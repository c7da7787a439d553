//! Helpers for kernels that work along one dimension (scans, sorts,
//! top-k, gathers): the `[outer, n, inner]` split around the dimension,
//! moving the dimension last so that each line is a contiguous row
//! (`to_rows`/`from_rows`), and a raw pointer that rayon tasks writing
//! provably disjoint elements may share.

use rayon::prelude::*;

use super::elementwise::PAR_MIN;

/// `(outer, n, inner)` around `dim` (a 0-dim tensor is one line of one).
pub(crate) fn split(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    if shape.is_empty() {
        return (1, 1, 1);
    }
    let outer = shape[..dim].iter().product();
    let inner = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

/// Row-major `[outer, n, inner]` data as `[outer * inner, n]` rows: line
/// `(o, i)` becomes row `o * inner + i`. Borrows when `inner == 1`.
pub(crate) fn to_rows<T: Copy + Send + Sync>(
    x: &[T],
    (_, n, inner): (usize, usize, usize),
) -> std::borrow::Cow<'_, [T]> {
    if inner == 1 {
        return std::borrow::Cow::Borrowed(x);
    }
    // Every element is overwritten; copying `x` just sizes the buffer.
    let mut rows = x.to_vec();
    let block = n * inner;
    let permute = |(o, dst): (usize, &mut [T])| {
        let src = &x[o * block..(o + 1) * block];
        for (j, line) in src.chunks(inner).enumerate() {
            for (i, &v) in line.iter().enumerate() {
                dst[i * n + j] = v;
            }
        }
    };
    if x.len() >= PAR_MIN {
        rows.par_chunks_mut(block.max(1)).enumerate().for_each(permute);
    } else {
        rows.chunks_mut(block.max(1)).enumerate().for_each(permute);
    }
    std::borrow::Cow::Owned(rows)
}

/// The inverse of [`to_rows`]: rows of `n` (`[outer * inner, n]`) back to
/// row-major `[outer, n, inner]`, written into `out`.
pub(crate) fn from_rows<T: Copy + Send + Sync>(
    rows: &[T],
    out: &mut [T],
    (_, n, inner): (usize, usize, usize),
) {
    if inner == 1 {
        out.copy_from_slice(rows);
        return;
    }
    let block = n * inner;
    let permute = |(o, dst): (usize, &mut [T])| {
        let src = &rows[o * block..(o + 1) * block];
        for (i, row) in src.chunks(n.max(1)).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                dst[j * inner + i] = v;
            }
        }
    };
    if out.len() >= PAR_MIN {
        out.par_chunks_mut(block.max(1)).enumerate().for_each(permute);
    } else {
        out.chunks_mut(block.max(1)).enumerate().for_each(permute);
    }
}

/// A raw element pointer that parallel tasks may share. Whoever writes
/// through it must guarantee that no two tasks touch the same element and
/// that the memory stays valid (device memory of a validated view, kept
/// alive by stream-ordered frees while the work runs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SharedPtr<T>(pub(crate) *mut T);

// SAFETY: the pointer is only dereferenced under the contract above:
// disjoint elements per task, memory alive for the work's duration.
unsafe impl<T: Send> Send for SharedPtr<T> {}
// SAFETY: as above; sharing the address itself is harmless.
unsafe impl<T: Send> Sync for SharedPtr<T> {}

impl<T> SharedPtr<T> {
    /// Shares a pointer that is only read through.
    pub(crate) fn reading(p: *const T) -> Self {
        Self(p.cast_mut())
    }
    /// The element `offset` elements from the base.
    pub(crate) fn at(self, offset: isize) -> *mut T {
        self.0.wrapping_offset(offset)
    }
    /// Reads the element `offset` elements from the base.
    ///
    /// # Safety
    /// The element must be valid for reads and not written concurrently.
    pub(crate) unsafe fn read(self, offset: isize) -> T
    where
        T: Copy,
    {
        // SAFETY: caller contract.
        unsafe { self.at(offset).read() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip() {
        let dims = (2, 3, 4);
        let x: Vec<i32> = (0..24).collect();
        let rows = to_rows(&x, dims);
        // Line (o=1, i=2) is elements 1*12 + j*4 + 2.
        assert_eq!(&rows[(4 + 2) * 3..(4 + 2) * 3 + 3], &[14, 18, 22]);
        let mut back = vec![0; 24];
        from_rows(&rows, &mut back, dims);
        assert_eq!(back, x);
    }
}

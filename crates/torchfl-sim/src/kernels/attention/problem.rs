//! What the forward and backward passes share: the validated problem
//! ([`Problem`]), strided row access to the 4-D operands, the score blocks
//! both passes compute, and the dropout mask both passes must agree on.

use super::super::elementwise::{load, store};
use super::super::linalg::{gemm, Mat};
use super::super::random::bits;
use super::super::real::Real;
use super::super::view::TensorView;
use super::super::Rng;
use crate::dtype::DType;

/// Query rows per block (one tile of the score matrix is `BR x BC`).
pub(super) const BR: usize = 64;
/// Key columns per block.
pub(super) const BC: usize = 64;

/// The sizes of one call: batch, query heads, key/value heads, query and
/// key lengths, the query/key head size and the value head size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sizes {
    pub(super) b: usize,
    pub(super) hq: usize,
    pub(super) hkv: usize,
    pub(super) l: usize,
    pub(super) s: usize,
    pub(super) e: usize,
    pub(super) ev: usize,
}

impl Sizes {
    /// Query heads per key/value head (grouped-query attention).
    pub(super) fn group(&self) -> usize {
        self.hq / self.hkv
    }
    /// Multiply-adds of one pass over all score blocks (for the choice
    /// between running inline and splitting across threads).
    pub(super) fn work(&self) -> usize {
        self.b * self.hq * self.l * self.s * (self.e + self.ev)
    }
}

/// The dropout applied to the attention probabilities: which entries are
/// kept is a pure function of the call's random state and the entry's
/// index in the `(B, Hq, L, S)` probability tensor, so the backward pass
/// regenerates exactly the forward's mask from `(seed, offset)`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dropout {
    keep: f64,
    scale: f32,
    rng: Rng,
}

impl Dropout {
    /// `None` when `p` is 0 (no dropout).
    pub(super) fn new(p: f64, rng: Rng) -> Option<Self> {
        (p > 0.0).then(|| Self { keep: 1.0 - p, scale: (1.0 / (1.0 - p)) as f32, rng })
    }

    /// The multiplier of probability `(b, h, i, j)`: `1 / (1 - p)` when
    /// kept, else 0. Philox counter `offset + ((b * Hq + h) * L + i) * S +
    /// j`, kept when its 53-bit uniform is below `1 - p` (as
    /// `native_dropout` draws).
    #[inline(always)]
    pub(super) fn multiplier(&self, index: u64) -> f32 {
        let r = bits(self.rng, index);
        let u = (((u64::from(r[0]) << 32) | u64::from(r[1])) >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0);
        if u < self.keep {
            self.scale
        } else {
            0.0
        }
    }
}

/// A validated call: the operands as views, the sizes and the options.
#[derive(Debug, Clone)]
pub(super) struct Problem {
    pub(super) sizes: Sizes,
    pub(super) q: TensorView,
    pub(super) k: TensorView,
    pub(super) v: TensorView,
    /// Broadcast to `(B, Hq, L, S)` (zero strides where it repeats);
    /// floating values are added to the scores, `false` entries of a
    /// boolean mask exclude theirs.
    pub(super) bias: Option<TensorView>,
    pub(super) scale: f32,
    pub(super) causal: bool,
    pub(super) dropout: Option<Dropout>,
}

impl Problem {
    /// The Philox counter index of probability `(b, h, i, j)`.
    #[inline(always)]
    pub(super) fn prob_index(&self, b: usize, h: usize, i: usize, j: usize) -> u64 {
        let z = &self.sizes;
        (((b * z.hq + h) * z.l + i) * z.s + j) as u64
    }

    /// Key columns query rows `i0..i0 + rows` attend to at most: all of
    /// them, or up to the last row's diagonal under the (top-left aligned)
    /// causal mask, PyTorch's `ones(L, S).tril()`.
    pub(super) fn key_limit(&self, i0: usize, rows: usize) -> usize {
        if self.causal {
            (i0 + rows).min(self.sizes.s)
        } else {
            self.sizes.s
        }
    }

    /// Fills `out` (`rows x cols`, row-major) with the scores of query rows
    /// `i0..` against key rows `j0..` of head `(b, h)`: `scale * q . k`
    /// plus the bias, `-inf` where a mask excludes the pair. `q_tile` holds
    /// the query rows (`rows x E`), `keys` all keys of the head (`S x E`);
    /// `scratch` is at least `cols` long.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scores(
        &self,
        (b, h): (usize, usize),
        (i0, rows): (usize, usize),
        (j0, cols): (usize, usize),
        q_tile: &[f32],
        keys: &[f32],
        scratch: &mut [f32],
        out: &mut [f32],
    ) {
        let e = self.sizes.e;
        gemm::<f32>(
            rows,
            e,
            cols,
            self.scale,
            Mat::rows(q_tile, e),
            Mat { data: &keys[j0 * e..], rs: 1, cs: e },
            0.0,
            out,
            cols,
        );
        for r in 0..rows {
            let row = &mut out[r * cols..(r + 1) * cols];
            if let Some(bias) = &self.bias {
                let add = &mut scratch[..cols];
                load_row(bias, (b, h), i0 + r, j0, add);
                if bias.dtype() == DType::Bool {
                    for (s, &keep) in row.iter_mut().zip(add.iter()) {
                        if keep == 0.0 {
                            *s = f32::NEG_INFINITY;
                        }
                    }
                } else {
                    for (s, &a) in row.iter_mut().zip(add.iter()) {
                        *s += a;
                    }
                }
            }
            if self.causal {
                // Columns past the diagonal of row i (j > i) are excluded.
                let first_masked = (i0 + r + 1).saturating_sub(j0).min(cols);
                row[first_masked..].fill(f32::NEG_INFINITY);
            }
        }
    }
}

/// `exp(d)` for a score minus a maximum (`d <= 0`, possibly `-inf` for a
/// masked pair): 0 below `-87`, where `exp` would go through subnormal
/// intermediates, which x86 computes about a hundred times slower. Masked
/// pairs are common (a causal mask given as a tensor masks half of them),
/// and the values lost are below 1.2e-38, far under float32's resolution
/// next to the row's largest term, `exp(0) = 1`. NaN stays NaN.
#[inline(always)]
pub(super) fn exp_shifted(d: f32) -> f32 {
    let e = Real::exp(if d < -87.0 { -87.0 } else { d });
    if d < -87.0 {
        0.0
    } else {
        e
    }
}

/// The byte address of element `(i0, i1, i2, j)` of a 4-D view.
#[inline(always)]
fn address(v: &TensorView, (i0, i1): (usize, usize), i2: usize, j: usize) -> usize {
    debug_assert!(v.ndim() == 4 && i0 < v.shape()[0] && i1 < v.shape()[1] && i2 < v.shape()[2]);
    let st = v.strides();
    let item = v.itemsize() as isize;
    let offset =
        (i0 as isize * st[0] + i1 as isize * st[1] + i2 as isize * st[2] + j as isize * st[3]) * item;
    v.addr().wrapping_add_signed(offset)
}

/// Loads `buf.len()` elements of row `i2` of matrix `m` of a 4-D view,
/// from column `j`, converted to `f32`. Call only from stream work (the
/// view's memory is live then).
pub(super) fn load_row(v: &TensorView, m: (usize, usize), i2: usize, j: usize, buf: &mut [f32]) {
    if buf.is_empty() {
        return;
    }
    debug_assert!(j + buf.len() <= v.shape()[3]);
    let stride = v.strides()[3] * v.itemsize() as isize;
    // SAFETY: every index addressed lies inside the view's shape (callers
    // derive them from it), so each address is inside its validated extent
    // (the `TensorView` invariant).
    unsafe { load(v.dtype(), address(v, m, i2, j), stride, buf) };
}

/// Loads rows `r0..r0 + rows` of matrix `m` of a 4-D view into `buf`
/// (row-major, as many columns as the view has).
pub(super) fn load_rows(v: &TensorView, m: (usize, usize), r0: usize, rows: usize, buf: &mut [f32]) {
    let cols = v.shape()[3];
    for r in 0..rows {
        load_row(v, m, r0 + r, 0, &mut buf[r * cols..(r + 1) * cols]);
    }
}

/// Stores `buf` into row `i2` of matrix `m` of a 4-D view from column `j`,
/// converting to the view's dtype. Call only from stream work, for
/// elements no other task writes.
pub(super) fn store_row(v: &TensorView, m: (usize, usize), i2: usize, j: usize, buf: &[f32]) {
    if buf.is_empty() {
        return;
    }
    debug_assert!(j + buf.len() <= v.shape()[3]);
    let stride = v.strides()[3] * v.itemsize() as isize;
    // SAFETY: as in `load_row`; the caller guarantees no concurrent access
    // to these elements.
    unsafe { store(v.dtype(), address(v, m, i2, j), stride, buf) };
}

/// Stores `buf` (row-major, as many columns as the view has) into rows
/// `r0..` of matrix `m` of a 4-D view.
pub(super) fn store_rows(v: &TensorView, m: (usize, usize), r0: usize, buf: &[f32]) {
    let cols = v.shape()[3];
    if cols == 0 {
        return;
    }
    for (r, row) in buf.chunks(cols).enumerate() {
        store_row(v, m, r0 + r, 0, row);
    }
}

/// Element `(b, h, i)` of the 3-D log-sum-exp view, as its byte address.
#[inline(always)]
pub(super) fn lse_address(v: &TensorView, b: usize, h: usize, i: usize) -> usize {
    debug_assert!(v.ndim() == 3 && b < v.shape()[0] && h < v.shape()[1] && i < v.shape()[2]);
    let st = v.strides();
    let offset = (b as isize * st[0] + h as isize * st[1] + i as isize * st[2]) * v.itemsize() as isize;
    v.addr().wrapping_add_signed(offset)
}

/// Loads `buf.len()` log-sum-exps of head `(b, h)` from row `i0`.
pub(super) fn load_lse(v: &TensorView, (b, h): (usize, usize), i0: usize, buf: &mut [f32]) {
    if buf.is_empty() {
        return;
    }
    let stride = v.strides()[2] * v.itemsize() as isize;
    // SAFETY: rows i0..i0 + len lie inside the view (callers derive them
    // from its shape), hence inside its validated extent.
    unsafe { load(v.dtype(), lse_address(v, b, h, i0), stride, buf) };
}

/// Stores log-sum-exps of head `(b, h)` from row `i0`.
pub(super) fn store_lse(v: &TensorView, (b, h): (usize, usize), i0: usize, buf: &[f32]) {
    if buf.is_empty() {
        return;
    }
    let stride = v.strides()[2] * v.itemsize() as isize;
    // SAFETY: as in `load_lse`; each task writes the rows of its own head
    // and block only.
    unsafe { store(v.dtype(), lse_address(v, b, h, i0), stride, buf) };
}

//! Scans along one dimension: `cumsum` (top-p sampling's cumulative
//! probabilities, position ids from attention masks) and `cumprod`.
//!
//! As on PyTorch's CPU, the input is first converted to the output dtype
//! (`self.to(dtype)`), then accumulated in the CPU's accumulation type:
//! `double` for `float` and `double`, `float` for the half types, `int64`
//! (wrapping) for integers; each prefix is rounded to the output dtype
//! once. So results match the CPU's bit for bit.
//!
//! The tensor is `[outer, n, inner]` around the dimension. A block of
//! `inner` running accumulators walks the `n` steps (the inner loop over
//! `inner` vectorises); blocks of `outer`, and column ranges of `inner`
//! when `outer` is small, run in parallel.

use rayon::prelude::*;

use super::elementwise::{gather, with_dense_output, PAR_MIN};
use super::lines::{split, SharedPtr};
use super::softmax::{int_arg, wrap_dim};
use super::{Args, Frame, KernelCtx};
use crate::dtype::{with_storage, DType, Element};
use crate::error::Result;
use crate::runtime::Work;

/// Columns of `inner` one parallel task scans.
const COLS: usize = 1024;

/// An accumulation type and its operation.
trait Acc: Copy + Send + Sync {
    fn from_elem<T: Element>(v: T) -> Self;
    fn to_elem<T: Element>(self) -> T;
}

impl Acc for f64 {
    #[inline(always)]
    fn from_elem<T: Element>(v: T) -> Self {
        v.to_f64()
    }
    #[inline(always)]
    fn to_elem<T: Element>(self) -> T {
        T::from_f64(self)
    }
}

impl Acc for f32 {
    #[inline(always)]
    fn from_elem<T: Element>(v: T) -> Self {
        v.to_f32()
    }
    #[inline(always)]
    fn to_elem<T: Element>(self) -> T {
        T::from_f32(self)
    }
}

impl Acc for i64 {
    #[inline(always)]
    fn from_elem<T: Element>(v: T) -> Self {
        v.to_i64()
    }
    #[inline(always)]
    fn to_elem<T: Element>(self) -> T {
        T::from_i64(self)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScanOp {
    Sum,
    Prod,
}

trait Combine: Acc {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}

impl Combine for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
}
impl Combine for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
}
impl Combine for i64 {
    const ZERO: Self = 0;
    const ONE: Self = 1;
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    fn mul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
}

/// Scans columns `cols` of every `[n, inner]` block of `x` into `y`
/// (both dense, row-major `[outer, n, inner]`), blocks `blocks`.
///
/// # Safety
/// `y` must point at `outer * n * inner` writable elements, and no other
/// task may write the columns `cols` of the blocks `blocks`.
unsafe fn scan_cols<T: Element, A: Combine>(
    x: &[T],
    y: SharedPtr<T>,
    (n, inner): (usize, usize),
    blocks: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    op: ScanOp,
) {
    let width = cols.len();
    let mut acc = vec![A::ZERO; width];
    for b in blocks {
        acc.fill(if op == ScanOp::Sum { A::ZERO } else { A::ONE });
        for j in 0..n {
            let base = (b * n + j) * inner + cols.start;
            let src = &x[base..base + width];
            match op {
                ScanOp::Sum => {
                    for (a, &v) in acc.iter_mut().zip(src) {
                        *a = a.add(A::from_elem(v));
                    }
                }
                ScanOp::Prod => {
                    for (a, &v) in acc.iter_mut().zip(src) {
                        *a = a.mul(A::from_elem(v));
                    }
                }
            }
            for (k, a) in acc.iter().enumerate() {
                // SAFETY: inside the caller's range of elements, which no
                // other task writes (caller contract).
                unsafe { *y.at((base + k) as isize) = a.to_elem::<T>() };
            }
        }
    }
}

fn scan_work<T: Element, A: Combine>(
    input: super::view::TensorView,
    out: super::view::TensorView,
    dim: usize,
    op: ScanOp,
) -> Work {
    Work::new(move || {
        let dims = split(out.shape(), dim);
        let (outer, n, inner) = dims;
        // `self.to(dtype)` first, as the CPU does.
        let x = gather::<T>(&input);
        with_dense_output::<T>(&out, |y| {
            let ptr = SharedPtr(y.as_mut_ptr());
            let total = y.len();
            if total < PAR_MIN {
                // SAFETY: one task writes every element of `y`.
                unsafe { scan_cols::<T, A>(&x, ptr, (n, inner), 0..outer, 0..inner, op) };
            } else if outer >= rayon::current_num_threads() || inner <= COLS {
                let per = (PAR_MIN / (n * inner).max(1)).max(1);
                (0..outer.div_ceil(per)).into_par_iter().for_each(|t| {
                    let blocks = t * per..((t + 1) * per).min(outer);
                    // SAFETY: tasks own disjoint blocks; `y` is dense.
                    unsafe { scan_cols::<T, A>(&x, ptr, (n, inner), blocks, 0..inner, op) };
                });
            } else {
                let tasks: Vec<(usize, usize)> =
                    (0..outer).flat_map(|b| (0..inner.div_ceil(COLS)).map(move |c| (b, c))).collect();
                tasks.into_par_iter().for_each(|(b, c)| {
                    let cols = c * COLS..((c + 1) * COLS).min(inner);
                    // SAFETY: tasks own disjoint (block, column range) pairs.
                    unsafe { scan_cols::<T, A>(&x, ptr, (n, inner), b..b + 1, cols, op) };
                });
            }
        });
        Ok(())
    })
}

/// `cumsum`/`cumprod(Tensor self, int dim, *, ScalarType? dtype=None)`
/// (registered for their out= forms; the host chose the output dtype).
fn scan(ctx: &KernelCtx<'_>, call: &Frame<'_>, op: ScanOp) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 3)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let dim = wrap_dim(ctx, int_arg(ctx, call, 1, "dim")?, input.ndim())?;
    let requested = args.opt_dtype(2, "dtype")?;
    let out = ctx.output(call, 0)?;
    let dtype = out.dtype();
    if let Some(d) = requested {
        if d != dtype {
            return Err(
                ctx.invalid(format!("Expected out tensor to have dtype {d}, but got {dtype} instead"))
            );
        }
    }
    if out.shape() != input.shape() {
        return Err(ctx.invalid(format!("out has shape {:?}, expected {:?}", out.shape(), input.shape())));
    }
    if dtype == DType::Bool {
        return Err(ctx.unimplemented("bool outputs are not supported"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(with_storage!(dtype, T => match dtype {
        DType::Float32 | DType::Float64 => scan_work::<T, f64>(input, out, dim, op),
        DType::Float16 | DType::BFloat16 => scan_work::<T, f32>(input, out, dim, op),
        _ => scan_work::<T, i64>(input, out, dim, op),
    })))
}

/// `cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor`.
pub(crate) fn cumsum(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    scan(ctx, call, ScanOp::Sum)
}

/// `cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor`.
pub(crate) fn cumprod(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    scan(ctx, call, ScanOp::Prod)
}

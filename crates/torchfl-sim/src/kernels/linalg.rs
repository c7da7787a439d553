//! Matrix multiplication.
//!
//! `f32`/`f64` call matrixmultiply's packed GEMM directly on device memory
//! with the tensors' real strides, so transposed or sliced operands cost no
//! copies. Half types are converted to `f32`, multiplied, and rounded back
//! (as PyTorch's CPU kernels do); integers use a simple row-parallel loop
//! with wrapping `i64` accumulation. When the output overlaps an input (or
//! itself), the operands are staged through contiguous buffers first.
//!
//! `addmm`, `bmm` and `baddbmm` (floating types) share the compute layer
//! defined here over the [`Real`] types, which the convolution,
//! normalization and pooling kernels use too: a safe, bounds-checked GEMM
//! over slices ([`gemm`]), [`read`] (borrow a dense input of the compute
//! type, or convert a copy) and [`write_with`] (hand a kernel the output's
//! memory directly when it is dense in the compute type and disjoint from
//! the inputs, else a staging buffer that is scattered afterwards).

use std::borrow::Cow;

use rayon::prelude::*;

use super::elementwise::{gather, scatter};
use super::real::{with_real, Real};
use super::view::{disjoint, TensorView};
use super::{Args, Frame, KernelCtx, Operand, Scalar};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::runtime::Work;

/// `mm(Tensor self, Tensor mat2) -> Tensor`
pub(crate) fn mm(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let a = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let b = ctx.device_view(args.tensor(1, "mat2")?, "mat2")?;
    let out = ctx.output(call, 0)?;
    if a.ndim() != 2 {
        return Err(ctx.invalid(format!("self must be a matrix, got {}-D", a.ndim())));
    }
    if b.ndim() != 2 {
        return Err(ctx.invalid(format!("mat2 must be a matrix, got {}-D", b.ndim())));
    }
    let (m, k, k2, n) = (a.shape()[0], a.shape()[1], b.shape()[0], b.shape()[1]);
    if k != k2 {
        return Err(ctx.invalid(format!("mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {k2}x{n})")));
    }
    if a.dtype() != b.dtype() {
        return Err(ctx.invalid(format!(
            "expected mat1 and mat2 to have the same dtype, but got: {} != {}",
            a.dtype(),
            b.dtype()
        )));
    }
    if out.shape() != [m, n] {
        return Err(ctx.invalid(format!("output has shape {:?}, expected [{m}, {n}]", out.shape())));
    }
    if out.dtype() != a.dtype() {
        return Err(ctx.invalid(format!(
            "expected the output to have dtype {}, but got {}",
            a.dtype(),
            out.dtype()
        )));
    }
    if a.dtype() == DType::Bool {
        return Err(ctx.unimplemented("matrix multiplication of bool tensors is not supported"));
    }
    if m == 0 || n == 0 {
        return Ok(None);
    }
    let staged = !disjoint(&out, &a) || !disjoint(&out, &b) || !out.is_non_overlapping();
    Ok(Some(Work::new(move || {
        match out.dtype() {
            DType::Float32 if !staged => gemm_f32_direct(&a, &b, &out),
            DType::Float64 if !staged => gemm_f64_direct(&a, &b, &out),
            DType::Float64 => {
                let c = gemm_f64_staged(&gather(&a), &gather(&b), m, k, n);
                scatter(&out, &c);
            }
            d if d.is_floating() => {
                let c = gemm_f32_staged(&gather(&a), &gather(&b), m, k, n);
                scatter(&out, &c);
            }
            _ => {
                let c = gemm_int(&gather::<i64>(&a), &gather::<i64>(&b), m, k, n);
                scatter(&out, &c);
            }
        }
        Ok(())
    })))
}

fn gemm_f32_direct(a: &TensorView, b: &TensorView, c: &TensorView) {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    // SAFETY: all three views are validated f32 views (every element
    // address readable/writable for the life of this work), `c` does not
    // overlap itself or the inputs (otherwise the staged path runs), and
    // matrixmultiply accepts arbitrary strides for A and B.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.addr() as *const f32,
            a.strides()[0],
            a.strides()[1],
            b.addr() as *const f32,
            b.strides()[0],
            b.strides()[1],
            0.0,
            c.addr() as *mut f32,
            c.strides()[0],
            c.strides()[1],
        )
    }
}

fn gemm_f64_direct(a: &TensorView, b: &TensorView, c: &TensorView) {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    // SAFETY: as in `gemm_f32_direct`, for f64 views.
    unsafe {
        matrixmultiply::dgemm(
            m,
            k,
            n,
            1.0,
            a.addr() as *const f64,
            a.strides()[0],
            a.strides()[1],
            b.addr() as *const f64,
            b.strides()[0],
            b.strides()[1],
            0.0,
            c.addr() as *mut f64,
            c.strides()[0],
            c.strides()[1],
        )
    }
}

/// Row-major `m x k` times `k x n` in f32.
fn gemm_f32_staged(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    // SAFETY: `a`, `b`, `c` are live row-major buffers of the given sizes
    // and `c` is exclusively borrowed.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    };
    c
}

/// Row-major `m x k` times `k x n` in f64.
fn gemm_f64_staged(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    // SAFETY: as in `gemm_f32_staged`.
    unsafe {
        matrixmultiply::dgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    };
    c
}

/// Integer matmul, rows in parallel, `k` in blocks so a block of `b` rows
/// stays in cache while a row of `c` accumulates (wrapping, as PyTorch).
fn gemm_int(a: &[i64], b: &[i64], m: usize, k: usize, n: usize) -> Vec<i64> {
    const KB: usize = 128;
    let mut c = vec![0i64; m * n];
    if k == 0 {
        return c;
    }
    let row = |(i, crow): (usize, &mut [i64])| {
        for k0 in (0..k).step_by(KB) {
            for kk in k0..(k0 + KB).min(k) {
                let aik = a[i * k + kk];
                if aik == 0 {
                    continue;
                }
                for (cj, &bj) in crow.iter_mut().zip(&b[kk * n..(kk + 1) * n]) {
                    *cj = cj.wrapping_add(aik.wrapping_mul(bj));
                }
            }
        }
    };
    if m * n * k >= 1 << 16 {
        c.par_chunks_mut(n).enumerate().for_each(row);
    } else {
        c.chunks_mut(n).enumerate().for_each(row);
    }
    c
}

// ------------------------------------------------------------ compute layer

/// A matrix operand of [`gemm`]: a slice and the (row, column) strides of
/// the matrix inside it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mat<'a, C> {
    pub(crate) data: &'a [C],
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

impl<'a, C> Mat<'a, C> {
    /// A row-major matrix with `cols` columns.
    pub(crate) fn rows(data: &'a [C], cols: usize) -> Self {
        Self { data, rs: cols, cs: 1 }
    }
    /// The transpose of a row-major matrix with `cols` columns.
    pub(crate) fn rows_t(data: &'a [C], cols: usize) -> Self {
        Self { data, rs: 1, cs: cols }
    }
}

/// The last element index a `rows x cols` matrix with strides `(rs, cs)`
/// reaches (both dimensions non-zero).
fn last(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    (rows - 1) * rs + (cols - 1) * cs
}

/// `c = alpha * a(m x k) * b(k x n) + beta * c`, `c` row-major with row
/// stride `rsc`. Panics (an internal bug, never user input: callers derive
/// every extent from validated shapes) if a matrix does not fit its slice.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<C: Real>(
    m: usize,
    k: usize,
    n: usize,
    alpha: C,
    a: Mat<'_, C>,
    b: Mat<'_, C>,
    beta: C,
    c: &mut [C],
    rsc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(last(m, n, rsc, 1) < c.len(), "gemm: C out of bounds");
    if k == 0 {
        for i in 0..m {
            for v in &mut c[i * rsc..i * rsc + n] {
                *v = if beta == C::ZERO { C::ZERO } else { beta * *v };
            }
        }
        return;
    }
    assert!(last(m, k, a.rs, a.cs) < a.data.len(), "gemm: A out of bounds");
    assert!(last(k, n, b.rs, b.cs) < b.data.len(), "gemm: B out of bounds");
    // SAFETY: the assertions above keep every addressed element inside its
    // slice; `c` is borrowed mutably, so it overlaps neither `a` nor `b`.
    unsafe {
        C::gemm_raw(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr(),
            rsc as isize,
            1,
        )
    }
}

/// A view's elements in row-major order as `C`: borrowed when the view is
/// contiguous and already of type `C`, else a converted copy.
///
/// Borrowing is sound only while nothing writes the view's memory: kernels
/// pass every view they read to [`write_with`], which then stages its
/// output instead of handing out a slice that could alias them, and borrow
/// only inputs that are disjoint from everything they store to (kernels
/// check this when they validate, or copy such inputs).
pub(crate) fn read<C: Element>(v: &TensorView) -> Cow<'_, [C]> {
    if v.dtype() == C::DTYPE && v.is_contiguous() && v.numel() > 0 {
        // SAFETY: a TensorView's elements are readable for the life of the
        // work (its invariant); it is contiguous and of type `C`, so its
        // `numel` elements are consecutive `C`s at its (aligned) address;
        // writes to that memory during the borrow are excluded by
        // `write_with`'s disjointness check (see above).
        Cow::Borrowed(unsafe { std::slice::from_raw_parts(v.addr() as *const C, v.numel()) })
    } else {
        Cow::Owned(gather(v))
    }
}

/// [`read`], but a copy when `v` shares memory with `written`.
pub(crate) fn read_unless_written<'a, C: Element>(v: &'a TensorView, written: &TensorView) -> Cow<'a, [C]> {
    if disjoint(written, v) {
        read(v)
    } else {
        Cow::Owned(gather(v))
    }
}

/// Runs `f` on a row-major buffer for `out` and makes its contents the
/// output's. `f` must write every element (the buffer may hold garbage).
/// The output's own memory is used when it is contiguous, of type `C` and
/// disjoint from every view in `inputs`; otherwise a staging buffer.
pub(crate) fn write_with<C: Element>(out: &TensorView, inputs: &[&TensorView], f: impl FnOnce(&mut [C])) {
    let n = out.numel();
    if n == 0 {
        return;
    }
    if out.dtype() == C::DTYPE && out.is_contiguous() && inputs.iter().all(|v| disjoint(out, v)) {
        // SAFETY: a TensorView's elements are writable for the life of the
        // work; the view is contiguous, of type `C` and aligned, so it is
        // `n` consecutive `C`s; no slice from `read` aliases it (disjoint
        // from every input), and the stream runs one work at a time.
        f(unsafe { std::slice::from_raw_parts_mut(out.addr() as *mut C, n) });
    } else {
        let mut buf = vec![C::ZERO; n];
        f(&mut buf);
        scatter(out, &buf);
    }
}

// ------------------------------------------------------- addmm, bmm, baddbmm

fn same_dtype(ctx: &KernelCtx<'_>, views: &[&TensorView], out: &TensorView) -> Result<()> {
    for v in views {
        if v.dtype() != out.dtype() {
            return Err(ctx.invalid(format!(
                "expected all operands to have the same dtype, but got {} and {}",
                v.dtype(),
                out.dtype()
            )));
        }
    }
    Ok(())
}

fn scalar_f64(s: Scalar) -> f64 {
    match s {
        Scalar::Bool(b) => f64::from(u8::from(b)),
        Scalar::Int(i) => i as f64,
        Scalar::Float(f) => f,
    }
}

/// `addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar
/// alpha=1) -> Tensor` (also `addmm_` and `addmm.out`): `beta * self +
/// alpha * mat1 @ mat2`, `self` broadcast to the output; with `beta == 0`
/// `self` is ignored (NaNs in it do not propagate).
pub(crate) fn addmm(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 5)?;
    let bias = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let a = ctx.device_view(args.tensor(1, "mat1")?, "mat1")?;
    let b = ctx.device_view(args.tensor(2, "mat2")?, "mat2")?;
    let beta = scalar_f64(args.scalar(3, "beta", Some(Scalar::Int(1)))?);
    let alpha = scalar_f64(args.scalar(4, "alpha", Some(Scalar::Int(1)))?);
    let out = ctx.output(call, 0)?;
    if a.ndim() != 2 || b.ndim() != 2 {
        return Err(ctx.invalid(format!(
            "mat1 and mat2 must be matrices, got {}-D and {}-D",
            a.ndim(),
            b.ndim()
        )));
    }
    let (m, k, k2, n) = (a.shape()[0], a.shape()[1], b.shape()[0], b.shape()[1]);
    if k != k2 {
        return Err(ctx.invalid(format!("mat1 and mat2 shapes cannot be multiplied ({m}x{k} and {k2}x{n})")));
    }
    if out.shape() != [m, n] {
        return Err(ctx.invalid(format!("output has shape {:?}, expected [{m}, {n}]", out.shape())));
    }
    same_dtype(ctx, &[&a, &b, &bias], &out)?;
    let bias = bias.into_broadcast(&[m, n]).map_err(|v| {
        ctx.invalid(format!("self of shape {:?} cannot be broadcast to [{m}, {n}]", v.shape()))
    })?;
    ctx.check_overlap(&out, &Operand::View(a.clone()))?;
    ctx.check_overlap(&out, &Operand::View(b.clone()))?;
    if m == 0 || n == 0 {
        return Ok(None);
    }
    with_real!(ctx, out.dtype(), C => Ok(Some(Work::new(move || {
        batched::<C>(1, m, k, n, alpha, &a, &b, Some((&bias, beta)), &out);
        Ok(())
    }))))
}

/// `bmm(Tensor self, Tensor mat2) -> Tensor` (and `bmm.out`).
pub(crate) fn bmm(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let a = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let b = ctx.device_view(args.tensor(1, "mat2")?, "mat2")?;
    bmm_common(ctx, call, a, b, None, 1.0)
}

/// `baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1,
/// Scalar alpha=1) -> Tensor` (also `baddbmm_` and `baddbmm.out`).
pub(crate) fn baddbmm(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 5)?;
    let bias = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let a = ctx.device_view(args.tensor(1, "batch1")?, "batch1")?;
    let b = ctx.device_view(args.tensor(2, "batch2")?, "batch2")?;
    let beta = scalar_f64(args.scalar(3, "beta", Some(Scalar::Int(1)))?);
    let alpha = scalar_f64(args.scalar(4, "alpha", Some(Scalar::Int(1)))?);
    bmm_common(ctx, call, a, b, Some((bias, beta)), alpha)
}

fn bmm_common(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    a: TensorView,
    b: TensorView,
    bias: Option<(TensorView, f64)>,
    alpha: f64,
) -> Result<Option<Work>> {
    let out = ctx.output(call, 0)?;
    if a.ndim() != 3 || b.ndim() != 3 {
        return Err(ctx.invalid(format!(
            "batch1 and batch2 must be 3-D, got {}-D and {}-D",
            a.ndim(),
            b.ndim()
        )));
    }
    let (bs, m, k) = (a.shape()[0], a.shape()[1], a.shape()[2]);
    let (bs2, k2, n) = (b.shape()[0], b.shape()[1], b.shape()[2]);
    if bs != bs2 || k != k2 {
        return Err(ctx.invalid(format!(
            "batch1 and batch2 shapes cannot be multiplied ({bs}x{m}x{k} and {bs2}x{k2}x{n})"
        )));
    }
    if out.shape() != [bs, m, n] {
        return Err(ctx.invalid(format!("output has shape {:?}, expected [{bs}, {m}, {n}]", out.shape())));
    }
    same_dtype(ctx, &[&a, &b], &out)?;
    let bias = match bias {
        Some((v, beta)) => {
            same_dtype(ctx, &[&v], &out)?;
            let v = v.into_broadcast(&[bs, m, n]).map_err(|v| {
                ctx.invalid(format!("self of shape {:?} cannot be broadcast to [{bs}, {m}, {n}]", v.shape()))
            })?;
            Some((v, beta))
        }
        None => None,
    };
    ctx.check_overlap(&out, &Operand::View(a.clone()))?;
    ctx.check_overlap(&out, &Operand::View(b.clone()))?;
    if bs == 0 || m == 0 || n == 0 {
        return Ok(None);
    }
    with_real!(ctx, out.dtype(), C => Ok(Some(Work::new(move || {
        batched::<C>(bs, m, k, n, alpha, &a, &b, bias.as_ref().map(|(v, beta)| (v, *beta)), &out);
        Ok(())
    }))))
}

/// `out[i] = beta * bias[i] + alpha * a[i] @ b[i]` for `bs` batches of
/// `m x k` by `k x n` (2-D operands when `bs == 1` and they are matrices).
#[allow(clippy::too_many_arguments)]
fn batched<C: Real>(
    bs: usize,
    m: usize,
    k: usize,
    n: usize,
    alpha: f64,
    a: &TensorView,
    b: &TensorView,
    bias: Option<(&TensorView, f64)>,
    out: &TensorView,
) {
    // The bias is always copied (it may be the output itself, `addmm_`).
    let bias = bias.filter(|(_, beta)| *beta != 0.0).map(|(v, beta)| (gather::<C>(v), C::of(beta)));
    // Operands that share memory with the output are copied, so that no
    // borrowed slice of them is alive while the staged result is stored.
    let (av, bv) = (read_unless_written::<C>(a, out), read_unless_written::<C>(b, out));
    let (sa, sb, sc) = (m * k, k * n, m * n);
    write_with::<C>(out, &[a, b], |o| {
        let one = |(i, c): (usize, &mut [C])| {
            let beta = match &bias {
                Some((bias, beta)) => {
                    for (cv, &bv) in c.iter_mut().zip(&bias[i * sc..(i + 1) * sc]) {
                        *cv = *beta * bv;
                    }
                    C::of(1.0)
                }
                None => C::ZERO,
            };
            let am = Mat::rows(&av[i * sa..(i + 1) * sa], k);
            let bm = Mat::rows(&bv[i * sb..(i + 1) * sb], n);
            gemm(m, k, n, C::of(alpha), am, bm, beta, c, n);
        };
        if bs > 1 && m * n * k >= 1 << 15 {
            o.par_chunks_mut(sc).enumerate().for_each(one);
        } else {
            o.chunks_mut(sc).enumerate().for_each(one);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_gemm_matches_naive() {
        let (m, k, n) = (5, 300, 7);
        let a: Vec<i64> = (0..m * k).map(|i| (i as i64 % 13) - 6).collect();
        let b: Vec<i64> = (0..k * n).map(|i| (i as i64 % 7) - 3).collect();
        let c = gemm_int(&a, &b, m, k, n);
        for i in 0..m {
            for j in 0..n {
                let r: i64 = (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum();
                assert_eq!(c[i * n + j], r);
            }
        }
    }
}

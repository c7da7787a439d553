//! Matrix multiplication.
//!
//! `f32`/`f64` call matrixmultiply's packed GEMM directly on device memory
//! with the tensors' real strides, so transposed or sliced operands cost no
//! copies. Half types are converted to `f32`, multiplied, and rounded back
//! (as PyTorch's CPU kernels do); integers use a simple row-parallel loop
//! with wrapping `i64` accumulation. When the output overlaps an input (or
//! itself), the operands are staged through contiguous buffers first.

use rayon::prelude::*;

use super::dtype::DType;
use super::elementwise::{gather, scatter};
use super::view::{disjoint, TensorView};
use super::{Args, Frame, KernelCtx};
use crate::error::Result;
use crate::stream::Work;

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

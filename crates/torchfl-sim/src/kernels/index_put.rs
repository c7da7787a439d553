//! Advanced indexing: `index.Tensor` (`x[idx]`, `x[mask]`, `x[:, idx]`)
//! and `_index_put_impl_` (`x[idx] = v`, `index_put_`, with `accumulate`).
//!
//! Both follow NumPy/PyTorch semantics: `indices` is a `Tensor?[]` with
//! one entry per leading dimension (`None` keeps a dimension whole); a
//! bool or uint8 mask stands for the coordinates of its true elements
//! (PyTorch's `expandTensors`, so it covers as many dimensions as it has);
//! the integer index tensors (int64 or int32, negative values counting
//! from the end) broadcast to one shape `B`. The result has `B` where the
//! indexed dimensions were when they are adjacent, and first otherwise,
//! followed (or surrounded) by the dimensions left whole.
//!
//! A call is resolved into one source offset per position of `B` (bounds
//! checked with PyTorch's message), then each position copies one
//! sub-block of the whole dimensions, in parallel over positions. Writes
//! go to distinct places (the output of `index`; `index_put` with distinct
//! positions) or, when `index_put` positions repeat, run in order so that
//! the last value wins and accumulation sums in index order, as on the CPU.
//! Masks are read where the data is: `index` resolves them when its work
//! runs (the host already sized the output, running the meta kernel on the
//! device); `index_put` waits for its inputs and resolves them before it
//! returns, as CUDA does, so shape errors are reported at once.

use rayon::prelude::*;

use super::elementwise::{gather, PAR_MIN};
use super::view::{broadcast_shapes, disjoint, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx, Operand};
use crate::dtype::{with_storage, DType, Element, B8};
use crate::error::{Error, Result};
use crate::runtime::Work;

/// Binds `$T` to the storage type of `$dtype` and `$C` to the type
/// PyTorch's CPU kernels accumulate it in (`f32` for the half types).
macro_rules! with_pair {
    ($dtype:expr, $T:ident, $C:ident => $body:expr) => {
        match $dtype {
            DType::Bool => {
                type $T = B8;
                type $C = B8;
                $body
            }
            DType::UInt8 => {
                type $T = u8;
                type $C = u8;
                $body
            }
            DType::Int8 => {
                type $T = i8;
                type $C = i8;
                $body
            }
            DType::Int16 => {
                type $T = i16;
                type $C = i16;
                $body
            }
            DType::Int32 => {
                type $T = i32;
                type $C = i32;
                $body
            }
            DType::Int64 => {
                type $T = i64;
                type $C = i64;
                $body
            }
            DType::Float16 => {
                type $T = half::f16;
                type $C = f32;
                $body
            }
            DType::BFloat16 => {
                type $T = half::bf16;
                type $C = f32;
                $body
            }
            DType::Float32 => {
                type $T = f32;
                type $C = f32;
                $body
            }
            DType::Float64 => {
                type $T = f64;
                type $C = f64;
                $body
            }
        }
    };
}

/// An index entry after validation: the first dimension of `self` it
/// indexes and the tensor, a mask or integer indices.
#[derive(Debug, Clone)]
struct Entry {
    dim: usize,
    tensor: TensorView,
    mask: bool,
}

/// The `indices` of a call, validated against `self`'s shape.
fn entries(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, shape: &[usize]) -> Result<Vec<Entry>> {
    let list = match call.args.get(i) {
        Some(ArgRef::TensorList(l)) => l,
        _ => return Err(ctx.invalid(format!("argument {i} (indices) must be a list of optional tensors"))),
    };
    let mut out = Vec::new();
    let mut dim = 0usize;
    for (j, item) in list.iter().enumerate() {
        let Some(t) = item else {
            dim += 1;
            continue;
        };
        let v = ctx.device_view(t, "indices")?;
        let mask = match v.dtype() {
            DType::Bool | DType::UInt8 => true,
            DType::Int64 | DType::Int32 => false,
            other => {
                return Err(ctx.invalid(format!(
                    "tensors used as indices must be long, int, byte or bool tensors, got {other}"
                )))
            }
        };
        let covers = if mask { v.ndim() } else { 1 };
        if mask && v.ndim() == 0 {
            return Err(ctx.unimplemented("0-dim boolean indices are not supported"));
        }
        if dim + covers > shape.len() {
            return Err(ctx.invalid(format!(
                "too many indices for tensor of dimension {} (got {})",
                shape.len(),
                dim + covers
            )));
        }
        if mask && v.shape() != &shape[dim..dim + covers] {
            return Err(ctx.invalid(format!(
                "The shape of the mask {:?} at index {j} does not match the shape of the indexed tensor {shape:?} \
                 at index {dim}",
                v.shape()
            )));
        }
        out.push(Entry { dim, tensor: v, mask });
        dim += covers;
    }
    if out.is_empty() {
        return Err(ctx.invalid("at least one index must be a tensor"));
    }
    Ok(out)
}

/// Indices resolved to data: the indexed dimensions of `self` and, per
/// position of the broadcast index shape `b_shape`, the element offset of
/// the sub-block it selects.
#[derive(Debug, Clone)]
struct Resolved {
    dims: Vec<usize>,
    b_shape: Vec<usize>,
    offsets: Vec<isize>,
}

impl Resolved {
    fn adjacent(&self) -> bool {
        self.dims.windows(2).all(|w| w[1] == w[0] + 1)
    }

    /// The dimensions of `self` left whole, in order.
    fn rest(&self, ndim: usize) -> Vec<usize> {
        (0..ndim).filter(|d| !self.dims.contains(d)).collect()
    }

    /// The result shape, and where its `B` dimensions start.
    fn result_shape(&self, shape: &[usize]) -> (Vec<usize>, usize) {
        let rest = self.rest(shape.len());
        let start = if self.adjacent() { self.dims[0] } else { 0 };
        let mut out: Vec<usize> = rest.iter().take_while(|&&d| d < start).map(|&d| shape[d]).collect();
        out.extend(&self.b_shape);
        out.extend(rest.iter().skip_while(|&&d| d < start).map(|&d| shape[d]));
        (out, start)
    }
}

/// Reads the entries' data and resolves them against `self` (`shape`,
/// `strides`): masks to coordinates, negative indices wrapped, bounds
/// checked. Call where the data is ready.
fn resolve(op: &str, entries: &[Entry], shape: &[usize], strides: &[isize]) -> Result<Resolved> {
    // One (dim, values, shape) per indexed dimension.
    let mut parts: Vec<(usize, Vec<i64>, Vec<usize>)> = Vec::new();
    for e in entries {
        let values = gather::<i64>(&e.tensor);
        if e.mask {
            let ms = e.tensor.shape();
            let hits: Vec<usize> =
                values.iter().enumerate().filter(|(_, &v)| v != 0).map(|(p, _)| p).collect();
            for (k, _) in ms.iter().enumerate() {
                let inner: usize = ms[k + 1..].iter().product();
                let coords = hits.iter().map(|&p| ((p / inner) % ms[k]) as i64).collect();
                parts.push((e.dim + k, coords, vec![hits.len()]));
            }
        } else {
            parts.push((e.dim, values, e.tensor.shape().to_vec()));
        }
    }
    let shapes: Vec<&[usize]> = parts.iter().map(|p| p.2.as_slice()).collect();
    let b_shape = broadcast_shapes(&shapes)
        .map_err(|m| {
            Error::invalid(format!(
                "sim: {op}: shape mismatch: indexing tensors could not be broadcast together: {m}"
            ))
        })?
        .to_vec();
    let n: usize = b_shape.iter().product();
    let mut offsets = vec![0isize; n];
    for (dim, values, vshape) in &parts {
        let size = shape[*dim] as i64;
        // Strides of this index tensor within B (0 where it broadcasts).
        let mut vstrides = vec![0usize; b_shape.len()];
        let mut s = 1usize;
        for (j, &len) in vshape.iter().enumerate().rev() {
            let d = b_shape.len() - vshape.len() + j;
            vstrides[d] = if len == 1 { 0 } else { s };
            s *= len;
        }
        let mut coord = vec![0usize; b_shape.len()];
        for off in offsets.iter_mut() {
            let at: usize = coord.iter().zip(&vstrides).map(|(c, s)| c * s).sum();
            let mut v = values[at];
            if v < -size || v >= size {
                return Err(Error::invalid(format!(
                    "sim: {op}: index {v} is out of bounds for dimension {dim} with size {size}"
                )));
            }
            if v < 0 {
                v += size;
            }
            *off += v as isize * strides[*dim];
            for d in (0..coord.len()).rev() {
                coord[d] += 1;
                if coord[d] < b_shape[d] {
                    break;
                }
                coord[d] = 0;
            }
        }
    }
    Ok(Resolved { dims: parts.iter().map(|p| p.0).collect(), b_shape, offsets })
}

/// Element offsets of every position of a row-major walk over `shape`
/// with `strides`.
fn walk(shape: &[usize], strides: &[isize]) -> Vec<isize> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut coord = vec![0usize; shape.len()];
    for _ in 0..n {
        out.push(coord.iter().zip(strides).map(|(&c, &s)| c as isize * s).sum());
        for d in (0..coord.len()).rev() {
            coord[d] += 1;
            if coord[d] < shape[d] {
                break;
            }
            coord[d] = 0;
        }
    }
    out
}

/// How a result-shaped tensor (the output of `index`, the values of
/// `index_put`) splits into positions of `B` and the whole dimensions:
/// the element offset of each position, and of each element of a block.
fn split_result(r: &Resolved, result_strides: &[isize], start: usize) -> (Vec<isize>, Vec<isize>) {
    let nb = r.b_shape.len();
    let b_strides = &result_strides[start..start + nb];
    let rest_strides: Vec<isize> =
        result_strides[..start].iter().chain(&result_strides[start + nb..]).copied().collect();
    (walk(&r.b_shape, b_strides), rest_strides)
}

/// `index.Tensor(Tensor self, Tensor?[] indices) -> Tensor` (and
/// `index.Tensor_out`).
pub(crate) fn index(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let x = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let list = entries(ctx, call, 1, x.shape())?;
    let out = ctx.output(call, 0)?;
    if out.dtype() != x.dtype() {
        return Err(ctx.invalid(format!("output has dtype {}, expected {}", out.dtype(), x.dtype())));
    }
    if !disjoint(&out, &x) || list.iter().any(|e| !disjoint(&out, &e.tensor)) {
        return Err(ctx.invalid("unsupported operation: the output must not overlap the inputs"));
    }
    let op = ctx.op().to_owned();
    Ok(Some(with_storage!(x.dtype(), T => index_work::<T>(op, x, list, out))))
}

fn index_work<T: Element>(op: String, x: TensorView, list: Vec<Entry>, out: TensorView) -> Work {
    Work::new(move || {
        let r = resolve(&op, &list, x.shape(), x.strides())?;
        let (expected, start) = r.result_shape(x.shape());
        if out.shape() != expected.as_slice() {
            return Err(Error::invalid(format!(
                "sim: {op}: the output has shape {:?}, but indexing gives {expected:?}",
                out.shape()
            )));
        }
        if out.numel() == 0 {
            return Ok(());
        }
        let rest = r.rest(x.ndim());
        let rest_shape: Vec<usize> = rest.iter().map(|&d| x.shape()[d]).collect();
        let src_rest = walk(&rest_shape, &rest.iter().map(|&d| x.strides()[d]).collect::<Vec<_>>());
        let (dst_pos, dst_rest_strides) = split_result(&r, out.strides(), start);
        let dst_rest = walk(&rest_shape, &dst_rest_strides);
        let (src, dst) = (x.addr(), out.addr());
        let copy = |b: usize| {
            let (s0, d0) = (r.offsets[b], dst_pos[b]);
            for (&s, &d) in src_rest.iter().zip(&dst_rest) {
                // SAFETY: source offsets are in-bounds coordinates of the
                // validated `self` (checked by `resolve`), destination
                // offsets coordinates of the validated output (its shape
                // checked above); the output does not overlap itself or the
                // input, so positions write distinct elements.
                unsafe {
                    let v = (src as *const T).offset(s0 + s).read();
                    (dst as *mut T).offset(d0 + d).write(v);
                }
            }
        };
        if out.numel() >= PAR_MIN {
            (0..r.offsets.len()).into_par_iter().for_each(copy);
        } else {
            (0..r.offsets.len()).for_each(copy);
        }
        Ok(())
    })
}

/// `_index_put_impl_(Tensor(a!) self, Tensor?[] indices, Tensor values,
/// bool accumulate=False, bool unsafe=False) -> Tensor(a!)`, what
/// `index_put_` and `x[idx] = v` dispatch.
pub(crate) fn index_put_impl(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 5)?;
    let x = ctx.written(args.tensor(0, "self")?, "self")?;
    let list = entries(ctx, call, 1, x.shape())?;
    let values = ctx.operand(args.tensor(2, "values")?, "values")?;
    let accumulate = args.bool_or(3, "accumulate", false)?;
    if values.dtype() != x.dtype() {
        return Err(ctx.invalid(format!(
            "Index put requires the source and destination dtypes match, got {} for the destination and {} for \
             the source.",
            x.dtype(),
            values.dtype()
        )));
    }
    if list.iter().any(|e| !disjoint(&x, &e.tensor)) {
        return Err(ctx.invalid("unsupported operation: the indices must not overlap the written-to tensor"));
    }
    // Masks are data: wait for them and resolve now, as CUDA does.
    let resolved = if list.iter().any(|e| e.mask) {
        ctx.wait_for_inputs(call)?;
        Some(resolve(ctx.op(), &list, x.shape(), x.strides())?)
    } else {
        None
    };
    // The result shape is known now when no mask is involved or masks
    // were resolved: check the values against it before anything runs.
    let shapes: Vec<Vec<usize>> = list.iter().map(|e| e.tensor.shape().to_vec()).collect();
    let result = match &resolved {
        Some(r) => r.result_shape(x.shape()).0,
        None => {
            let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
            let b = broadcast_shapes(&refs).map_err(|m| {
                ctx.invalid(format!("shape mismatch: indexing tensors could not be broadcast together: {m}"))
            })?;
            let dims = list.iter().map(|e| e.dim).collect();
            Resolved { dims, b_shape: b.to_vec(), offsets: Vec::new() }.result_shape(x.shape()).0
        }
    };
    if broadcast_shapes(&[values.shape(), &result]).ok().as_deref() != Some(result.as_slice()) {
        return Err(ctx.invalid(format!(
            "shape mismatch: value tensor of shape {:?} cannot be broadcast to indexing result of shape {result:?}",
            values.shape()
        )));
    }
    let op = ctx.op().to_owned();
    let job = PutJob { op, x, list, values, accumulate, resolved };
    Ok(Some(with_pair!(job.x.dtype(), T, C => put_work::<T, C>(job))))
}

/// Everything `_index_put_impl_`'s work needs.
struct PutJob {
    op: String,
    x: TensorView,
    list: Vec<Entry>,
    values: Operand,
    accumulate: bool,
    resolved: Option<Resolved>,
}

fn put_work<T: Element, C: crate::dtype::Arith>(job: PutJob) -> Work {
    Work::new(move || {
        let PutJob { op, x, list, values, accumulate, resolved } = job;
        let r = match resolved {
            Some(r) => r,
            None => resolve(&op, &list, x.shape(), x.strides())?,
        };
        let (result, start) = r.result_shape(x.shape());
        let n: usize = result.iter().product();
        if n == 0 {
            return Ok(());
        }
        // The values, broadcast to the result shape, as a row-major buffer
        // (a copy: they may share memory with `self`).
        let vals: Vec<T> = match &values {
            Operand::View(v) => {
                let b = v.broadcast_to(&result).ok_or_else(|| {
                    Error::invalid(format!(
                        "sim: {op}: shape mismatch: value tensor of shape {:?} cannot be broadcast to indexing result \
                         of shape {result:?}",
                        v.shape()
                    ))
                })?;
                gather::<T>(&b)
            }
            Operand::Host(_, s, _) => vec![s.cast::<T>(); n],
        };
        let mut dense_strides = vec![0isize; result.len()];
        let mut s = 1isize;
        for d in (0..result.len()).rev() {
            dense_strides[d] = s;
            s *= result[d] as isize;
        }
        let rest = r.rest(x.ndim());
        let rest_shape: Vec<usize> = rest.iter().map(|&d| x.shape()[d]).collect();
        let dst_rest = walk(&rest_shape, &rest.iter().map(|&d| x.strides()[d]).collect::<Vec<_>>());
        let (src_pos, src_rest_strides) = split_result(&r, &dense_strides, start);
        let src_rest = walk(&rest_shape, &src_rest_strides);
        let dst = x.addr();
        let put = |b: usize| {
            let (d0, s0) = (r.offsets[b], src_pos[b]);
            for (&d, &s) in dst_rest.iter().zip(&src_rest) {
                let v = vals[(s0 + s) as usize];
                // SAFETY: destination offsets are in-bounds coordinates of
                // the validated, non-self-overlapping `self` (checked by
                // `resolve`); concurrent calls of `put` write distinct
                // elements (positions are distinct when run in parallel).
                unsafe {
                    let p = (dst as *mut T).offset(d0 + d);
                    if accumulate {
                        let sum = crate::dtype::cast::<T, C>(p.read()).add(crate::dtype::cast::<T, C>(v));
                        p.write(crate::dtype::cast::<C, T>(sum));
                    } else {
                        p.write(v);
                    }
                }
            }
        };
        let mut sorted = r.offsets.clone();
        sorted.sort_unstable();
        let distinct = sorted.windows(2).all(|w| w[0] != w[1]);
        if distinct && n >= PAR_MIN {
            (0..r.offsets.len()).into_par_iter().for_each(put);
        } else {
            (0..r.offsets.len()).for_each(put);
        }
        Ok(())
    })
}

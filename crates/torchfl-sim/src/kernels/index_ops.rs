//! Advanced indexing: `index.Tensor` (`x[idx]`, `logits[:, [-1]]`,
//! `seqs[rows]`, boolean masks) and `_index_put_impl_` (`x[idx] = v`,
//! `index_put_`, and the backward of indexing with `accumulate=True`).
//!
//! PyTorch's rules: each entry of the index list indexes one dimension of
//! `self` (None keeps it whole); a bool (or uint8) mask of `k` dimensions
//! stands for the `k` long index tensors of its nonzero coordinates; the
//! index tensors broadcast to one shape `B`; negative indices count from
//! the end. When the indexed dimensions are adjacent the result is
//! `self.shape[..first] + B + self.shape[last + 1..]`, otherwise `B`
//! followed by the dimensions not indexed. So every result element is
//! `self[a, b, c]` for a prefix `a`, a position `b` of `B` and a suffix
//! `c`, at element offset `off_a[a] + off_b[b] + off_c[c]`: [`Plan`]
//! holds those three offset tables.
//!
//! Masks and index values are data, so they are read when the work runs;
//! a bad index (or a mask count that disagrees with the output the host
//! allocated) fails the work with PyTorch's message. Without masks the
//! shapes are checked at launch as well.
//!
//! `index` copies rows of `off_c` in parallel (a memcpy when the suffix is
//! contiguous). `index_put` runs prefixes and suffix ranges in parallel
//! and the positions of `B` in order within each, so duplicate indices
//! accumulate (or overwrite) in PyTorch's CPU order, deterministically.

use rayon::prelude::*;

use super::dtype::{with_storage, DType, Element};
use super::elementwise::{gather, with_dense_output, GRAIN, PAR_MIN};
use super::lines::SharedPtr;
use super::view::{broadcast_shapes, disjoint, TensorView};
use super::{ArgRef, Args, Frame, KernelCtx};
use crate::error::{Error, Result};
use crate::stream::Work;

/// An index entry as the kernel receives it.
#[derive(Debug, Clone)]
enum Entry {
    Full,
    Index(TensorView),
    Mask(TensorView),
}

/// An index entry after masks were expanded: the values of one index
/// tensor, row-major, with its shape.
#[derive(Debug, Clone)]
struct Values {
    shape: Vec<usize>,
    data: Vec<i64>,
}

/// Where each result element comes from (see the module doc).
#[derive(Debug)]
struct Plan {
    /// The result's shape: prefix, broadcast index shape, suffix.
    shape: Vec<usize>,
    off_a: Vec<isize>,
    off_b: Vec<isize>,
    off_c: Vec<isize>,
}

/// Element offsets of every row-major position of `dims` (`(size, stride)`).
fn offsets(dims: &[(usize, isize)]) -> Vec<isize> {
    let mut out = vec![0isize];
    for &(size, stride) in dims {
        out = out.iter().flat_map(|&base| (0..size).map(move |k| base + k as isize * stride)).collect();
    }
    out
}

/// Reads the entries of `self`'s index list, refusing other dtypes.
fn entries(ctx: &KernelCtx<'_>, call: &Frame<'_>, ndim: usize) -> Result<Vec<Entry>> {
    let Some(ArgRef::TensorList(list)) = call.args.get(1) else {
        return Err(ctx.invalid("argument 1 (indices) must be a list of optional tensors"));
    };
    let mut out = Vec::with_capacity(list.len());
    let mut dims = 0usize;
    for t in list.iter() {
        let Some(t) = t else {
            out.push(Entry::Full);
            dims += 1;
            continue;
        };
        let v = ctx.device_view(t, "indices")?;
        match v.dtype() {
            DType::Int64 | DType::Int32 => {
                dims += 1;
                out.push(Entry::Index(v));
            }
            DType::Bool | DType::UInt8 => {
                dims += v.ndim().max(1);
                out.push(Entry::Mask(v));
            }
            other => {
                return Err(ctx.invalid(format!(
                    "tensors used as indices must be long, int, byte or bool tensors (got {other})"
                )))
            }
        }
    }
    if dims > ndim.max(1) {
        return Err(ctx.invalid(format!("too many indices for tensor of dimension {ndim} (got {dims})")));
    }
    Ok(out)
}

/// Expands masks into their nonzero coordinates (reads data: stream work
/// only) and reads index values; one entry per dimension of `self`.
fn expand(entries: &[Entry], self_shape: &[usize]) -> Result<Vec<Option<Values>>> {
    let mut out = Vec::new();
    for e in entries {
        match e {
            Entry::Full => out.push(None),
            Entry::Index(v) => out.push(Some(Values { shape: v.shape().to_vec(), data: gather::<i64>(v) })),
            Entry::Mask(m) => {
                let first = out.len();
                let k = m.ndim();
                for (j, &size) in m.shape().iter().enumerate() {
                    if self_shape.get(first + j) != Some(&size) {
                        return Err(Error::invalid(format!(
                            "sim: index: The shape of the mask {:?} at index {j} does not match the shape of the \
                             indexed tensor {self_shape:?} at index {}",
                            m.shape(),
                            first + j
                        )));
                    }
                }
                let bits = gather::<i64>(m);
                let hits: Vec<usize> = (0..bits.len()).filter(|&i| bits[i] != 0).collect();
                if k == 0 {
                    // A 0-dim mask adds a dimension of size 0 or 1.
                    out.push(Some(Values { shape: vec![hits.len()], data: vec![0; hits.len()] }));
                    continue;
                }
                for j in 0..k {
                    let inner: usize = m.shape()[j + 1..].iter().product();
                    let data = hits.iter().map(|&i| ((i / inner) % m.shape()[j]) as i64).collect();
                    out.push(Some(Values { shape: vec![hits.len()], data }));
                }
            }
        }
    }
    Ok(out)
}

/// The plan of `self[indices]` from the shapes alone (`values` None: only
/// shapes are checked) or with index values (offsets filled, bounds
/// checked).
fn plan(
    shape: &[usize],
    strides: &[isize],
    shapes: &[Option<Vec<usize>>],
    values: Option<&[Option<Values>]>,
) -> std::result::Result<Plan, String> {
    let indexed: Vec<usize> = (0..shapes.len()).filter(|&d| shapes[d].is_some()).collect();
    let idx_shapes: Vec<&[usize]> = indexed.iter().filter_map(|&d| shapes[d].as_deref()).collect();
    let b = broadcast_shapes(&idx_shapes)
        .map_err(|e| format!("shape mismatch: indexing tensors could not be broadcast together ({e})"))?;
    let b: Vec<usize> = b.to_vec();
    // A 0-dim self indexed by one entry behaves as a 1-element vector.
    let (shape, strides): (Vec<usize>, Vec<isize>) =
        if shape.is_empty() { (vec![1], vec![0]) } else { (shape.to_vec(), strides.to_vec()) };
    let dims = |ds: &mut dyn Iterator<Item = usize>| -> Vec<(usize, isize)> {
        ds.map(|d| (shape[d], strides[d])).collect()
    };
    let (first, last) = (indexed.first().copied().unwrap_or(0), indexed.last().copied().unwrap_or(0));
    let adjacent = indexed.is_empty() || last - first + 1 == indexed.len();
    let (a_dims, c_dims) = if adjacent {
        (dims(&mut (0..first)), dims(&mut (last + 1..shape.len())))
    } else {
        (Vec::new(), dims(&mut (0..shape.len()).filter(|d| !indexed.contains(d))))
    };
    let mut result: Vec<usize> = a_dims.iter().map(|&(s, _)| s).collect();
    result.extend(&b);
    result.extend(c_dims.iter().map(|&(s, _)| s));
    let nb: usize = b.iter().product();
    let mut off_b = vec![0isize; if values.is_some() { nb } else { 0 }];
    if let Some(values) = values {
        for &d in &indexed {
            let v = values[d].as_ref().ok_or("internal: index values missing")?;
            // Broadcast strides of this index within B.
            let lead = b.len() - v.shape.len();
            let mut vstrides = vec![0usize; b.len()];
            let mut s = 1usize;
            for k in (0..v.shape.len()).rev() {
                vstrides[lead + k] = if v.shape[k] == 1 { 0 } else { s };
                s *= v.shape[k];
            }
            let size = shape[d] as i64;
            for (p, off) in off_b.iter_mut().enumerate() {
                let (mut rem, mut at) = (p, 0usize);
                for k in (0..b.len()).rev() {
                    at += (rem % b[k]) * vstrides[k];
                    rem /= b[k];
                }
                let mut i = v.data[at];
                if i < -size || i >= size {
                    return Err(format!("index {i} is out of bounds for dimension {d} with size {size}"));
                }
                if i < 0 {
                    i += size;
                }
                *off += i as isize * strides[d];
            }
        }
    }
    Ok(Plan { shape: result, off_a: offsets(&a_dims), off_b, off_c: offsets(&c_dims) })
}

/// The shape of each entry per dimension of `self` without data (`None`
/// when a mask makes it data-dependent).
fn static_shapes(entries: &[Entry]) -> Option<Vec<Option<Vec<usize>>>> {
    let mut out = Vec::new();
    for e in entries {
        match e {
            Entry::Full => out.push(None),
            Entry::Index(v) => out.push(Some(v.shape().to_vec())),
            Entry::Mask(_) => return None,
        }
    }
    Some(out)
}

/// The plan of a call, built when its work runs.
fn runtime_plan(op: &str, input: &TensorView, entries: &[Entry]) -> Result<Plan> {
    let fail = |m: String| Error::invalid(format!("sim: {op}: {m}"));
    let values = expand(entries, input.shape())?;
    let shapes: Vec<Option<Vec<usize>>> =
        values.iter().map(|v| v.as_ref().map(|v| v.shape.clone())).collect();
    plan(input.shape(), input.strides(), &shapes, Some(&values)).map_err(fail)
}

/// `index.Tensor_out(Tensor self, Tensor?[] indices, *, Tensor(a!) out)`,
/// which PyTorch's `index.Tensor` calls once its meta sized `out`.
pub(crate) fn index(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 2, 2)?;
    let input = ctx.device_view(args.tensor(0, "self")?, "self")?;
    let list = entries(ctx, call, input.ndim())?;
    let out = ctx.output(call, 0)?;
    if out.dtype() != input.dtype() {
        return Err(ctx.invalid("out must have self's dtype"));
    }
    if let Some(shapes) = static_shapes(&list) {
        let p = plan(input.shape(), input.strides(), &shapes, None).map_err(|m| ctx.invalid(m))?;
        if p.shape != out.shape() {
            return Err(ctx.invalid(format!("out has shape {:?}, expected {:?}", out.shape(), p.shape)));
        }
    }
    if !disjoint(&out, &input) {
        return Err(ctx.invalid("unsupported operation: the output must not overlap self"));
    }
    if out.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        let p = runtime_plan("index", &input, &list)?;
        if p.shape != out.shape() {
            return Err(Error::invalid(format!(
                "sim: index: the indices select shape {:?}, but the output has shape {:?}",
                p.shape,
                out.shape()
            )));
        }
        with_storage!(out.dtype(), T => copy_rows::<T>(&input, &out, &p));
        Ok(())
    })))
}

/// Copies `self[a, b, :]` into result row `(a, b)` for every row.
fn copy_rows<T: Element>(input: &TensorView, out: &TensorView, p: &Plan) {
    let nc = p.off_c.len();
    let nb = p.off_b.len();
    let contiguous = p.off_c.iter().enumerate().all(|(i, &o)| o == i as isize);
    let base = SharedPtr::reading(input.addr() as *const T);
    with_dense_output::<T>(out, |o| {
        let rows_per_task = (GRAIN / nc.max(1)).max(1);
        let task = |(t, dst): (usize, &mut [T])| {
            for (k, row) in dst.chunks_mut(nc).enumerate() {
                let r = t * rows_per_task + k;
                let src = p.off_a[r / nb] + p.off_b[r % nb];
                if contiguous {
                    // SAFETY: a row of `nc` consecutive elements of `self`
                    // (offsets checked in range by the plan), a validated
                    // view disjoint from the output.
                    row.copy_from_slice(unsafe { std::slice::from_raw_parts(base.at(src), nc) });
                } else {
                    for (d, &c) in row.iter_mut().zip(&p.off_c) {
                        // SAFETY: as above, one element.
                        *d = unsafe { base.read(src + c) };
                    }
                }
            }
        };
        let width = rows_per_task * nc;
        if o.len() >= PAR_MIN {
            o.par_chunks_mut(width).enumerate().for_each(task);
        } else {
            o.chunks_mut(width).enumerate().for_each(task);
        }
    });
}

/// `_index_put_impl_(Tensor(a!) self, Tensor?[] indices, Tensor values,
/// bool accumulate=False, bool unsafe=False) -> Tensor(a!)`: `self[indices]
/// = values` (`+=` with `accumulate`), `values` broadcast to the indexed
/// shape.
pub(crate) fn index_put_impl(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 5)?;
    let target = ctx.written(args.tensor(0, "self")?, "self")?;
    let list = entries(ctx, call, target.ndim())?;
    let values = ctx.device_view(args.tensor(2, "values")?, "values")?;
    let accumulate = args.bool_or(3, "accumulate", false)?;
    args.bool_or(4, "unsafe", false)?;
    if values.dtype() != target.dtype() {
        return Err(ctx.invalid(format!(
            "Index put requires the source and destination dtypes match, got {} for the destination and {} for \
             the source.",
            target.dtype(),
            values.dtype()
        )));
    }
    if let Some(shapes) = static_shapes(&list) {
        let p = plan(target.shape(), target.strides(), &shapes, None).map_err(|m| ctx.invalid(m))?;
        if values.broadcast_to(&p.shape).is_none() {
            return Err(ctx.invalid(format!(
                "shape mismatch: value tensor of shape {:?} cannot be broadcast to indexing result of shape {:?}",
                values.shape(),
                p.shape
            )));
        }
    }
    if !disjoint(&target, &values) {
        return Err(ctx.invalid("unsupported operation: values must not overlap self"));
    }
    if target.numel() == 0 {
        return Ok(None);
    }
    Ok(Some(Work::new(move || {
        let p = runtime_plan("index_put", &target, &list)?;
        let Some(v) = values.broadcast_to(&p.shape) else {
            return Err(Error::invalid(format!(
                "sim: index_put: shape mismatch: value tensor of shape {:?} cannot be broadcast to indexing result \
                 of shape {:?}",
                values.shape(),
                p.shape
            )));
        };
        with_storage!(target.dtype(), T => put_rows::<T>(&target, &v, &p, accumulate));
        Ok(())
    })))
}

#[inline(always)]
fn add_elem<T: Element>(a: T, b: T) -> T {
    if T::DTYPE.is_floating() {
        // Exact in f64, so one rounding: the storage type's own sum.
        T::from_f64(a.to_f64() + b.to_f64())
    } else {
        T::from_i64(a.to_i64().wrapping_add(b.to_i64()))
    }
}

/// Writes (or adds) the broadcast `values` into `self[a, b, c]`.
fn put_rows<T: Element>(target: &TensorView, values: &TensorView, p: &Plan, accumulate: bool) {
    let v = gather::<T>(values);
    let (nb, nc) = (p.off_b.len(), p.off_c.len());
    if nb == 0 || nc == 0 {
        return;
    }
    let dst = SharedPtr(target.addr() as *mut T);
    // Tasks own (prefix, suffix range) pairs: distinct prefixes or
    // suffixes are distinct elements, so only positions of B can collide,
    // and each task visits those in order.
    let chunk = if nc >= GRAIN { GRAIN } else { nc };
    let per_a = nc.div_ceil(chunk);
    let task = |t: usize| {
        let (a, cr) = (t / per_a, t % per_a);
        let cs = cr * chunk..((cr + 1) * chunk).min(nc);
        for b in 0..nb {
            let row = (a * nb + b) * nc;
            let base = p.off_a[a] + p.off_b[b];
            for c in cs.clone() {
                let at = dst.at(base + p.off_c[c]);
                let x = v[row + c];
                // SAFETY: inside `self` (offsets checked by the plan), a
                // validated view without internal overlap, disjoint from
                // `values`; tasks write disjoint elements (above).
                unsafe { *at = if accumulate { add_elem(*at, x) } else { x } };
            }
        }
    };
    let tasks = p.off_a.len() * per_a;
    if v.len() >= PAR_MIN && tasks > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

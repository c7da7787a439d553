//! Indexing and joining: `index_select` and `embedding_dense_backward`
//! (`index.cl`), and `cat` as one converting, strided copy (`unary.cl`'s
//! copy) per input into its slice of the output.

use super::{
    compute_type, enqueue, type_options, unary, work_items, Args, Elem, Launch, Number, Operand, UnaryOp,
    View,
};
use crate::error::{Error, Result};

const SOURCE: &str = concat!(include_str!("common.cl"), include_str!("index.cl"));

/// The columns of the result one `embedding_dense_backward` work item
/// owns (`COLUMNS` in index.cl): each pass over the indices serves them all.
const EMBEDDING_COLUMNS: usize = 16;

/// The unsigned OpenCL C type of `elem`'s size: `index_select` moves
/// values as bits, so one program serves every dtype of a size (half
/// needs no `cl_khr_fp16`).
fn bits_type(elem: Elem) -> &'static str {
    match elem.size() {
        1 => "uchar",
        2 => "ushort",
        4 => "uint",
        _ => "ulong",
    }
}

/// The stride that steps through `shape`'s elements in row-major order,
/// when one does (its dimensions merge into one); `None` otherwise.
fn merged_stride(shape: &[i64], strides: &[i64]) -> Option<i64> {
    let mut inner: Option<(i64, i64)> = None; // (stride, elements) of the merged inner block
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n == 1 {
            continue;
        }
        inner = match inner {
            None => Some((s, n)),
            Some((b, span)) if s == b * span => Some((b, span * n)),
            Some(_) => return None,
        };
    }
    Some(inner.map_or(1, |(b, _)| b))
}

/// `out = x.index_select(dim, index)`: `x` and `out` of the same dtype and
/// rank (`dim` wrapped; a 0-dim `x` takes a one-element `index`), `index`
/// 0-dim or 1-D int64.
pub(crate) fn index_select(
    l: &Launch<'_>,
    x: &View<'_>,
    dim: usize,
    index: &View<'_>,
    out: &View<'_>,
) -> Result<()> {
    // A 0-dim self is a 1-element vector here, as is a 0-dim index.
    fn vector<'v>(v: &View<'v>) -> View<'v> {
        if v.shape.is_empty() {
            View { shape: &[1], strides: &[0], ..*v }
        } else {
            *v
        }
    }
    let (x, out) = (vector(x), vector(out));
    let index_shape = [index.shape.first().copied().unwrap_or(1)];
    let index_strides = [index.strides.first().copied().unwrap_or(0)];
    let index = View { shape: &index_shape, strides: &index_strides, ..*index };
    let mut args = Args::new();
    args.tensor(l, "self", &x)?.tensor(l, "index", &index)?.tensor(l, "the output", &out)?.int(dim as i32);
    let options = format!("-DT={}", bits_type(x.elem));
    enqueue(l, (SOURCE, "index_select"), options, &args, &[work_items(out.shape)], None)
}

/// `out[r] = sum of grad[k] over the positions k with indices[k] == r`
/// (`out` is `[num_weights, D]`, `grad` `indices.shape + [D]`, both
/// floating); row `padding_idx` stays 0; with `scale_by_freq` each
/// position's row is scaled by 1 / (its index's count).
pub(crate) fn embedding_dense_backward(
    l: &Launch<'_>,
    grad: &View<'_>,
    indices: &View<'_>,
    out: &View<'_>,
    padding_idx: i64,
    scale_by_freq: bool,
) -> Result<()> {
    let Launch { rt, stream, op, .. } = *l;
    let device = stream.device;
    if !out.elem.is_float() || grad.elem != out.elem {
        return Err(Error::unimplemented(format!(
            "opencl: {op}: no kernel for a {} gradient and a {} result",
            grad.elem.c_name(),
            out.elem.c_name()
        )));
    }
    let k = work_items(indices.shape);
    let d = out.shape.get(1).copied().unwrap_or(0);
    let (rows, cols) = (work_items(&out.shape[..1]), usize::try_from(d).unwrap_or(0));
    // The kernel walks the indices and grad_output's rows by one stride
    // where their dimensions merge, else through their full layouts.
    let index_shape = [k as i64];
    let index_strides = [merged_stride(indices.shape, indices.strides).unwrap_or(0)];
    let flat_indices = View { shape: &index_shape, strides: &index_strides, ..*indices };
    let indices =
        if merged_stride(indices.shape, indices.strides).is_some() { flat_indices } else { *indices };
    let lead = grad.shape.len().saturating_sub(1);
    let grad_shape = [k as i64, d];
    let grad_strides = [
        merged_stride(&grad.shape[..lead], &grad.strides[..lead]).unwrap_or(0),
        grad.strides.last().copied().unwrap_or(0),
    ];
    let grad = match merged_stride(&grad.shape[..lead], &grad.strides[..lead]) {
        Some(_) => View { shape: &grad_shape, strides: &grad_strides, ..*grad },
        None => *grad,
    };
    let mut args = Args::new();
    args.tensor(l, "grad_output", &grad)?
        .tensor(l, "indices", &indices)?
        .tensor(l, "the output", out)?
        .long(padding_idx)
        .int(i32::from(scale_by_freq));
    let options = type_options(rt, device, op, &[("T", out.elem)], compute_type(out.elem))?;
    let global = [cols.div_ceil(EMBEDDING_COLUMNS), rows];
    enqueue(l, (SOURCE, "embedding_dense_backward"), options, &args, &global, None)
}

/// `out = cat(inputs, dim)`: each input (shaped like `out` but along
/// `dim`, any dtype, any strides) copied, converting, into its slice of
/// `out` along `dim`, in order.
pub(crate) fn cat(l: &Launch<'_>, inputs: &[View<'_>], dim: usize, out: &View<'_>) -> Result<()> {
    let op = l.op;
    let step = out.strides[dim].checked_mul(out.elem.size() as i64);
    let mut at = 0i64;
    for input in inputs {
        let size = input.shape[dim];
        let bytes = step.and_then(|s| s.checked_mul(at)).and_then(|b| isize::try_from(b).ok());
        let bytes = bytes
            .ok_or_else(|| Error::invalid(format!("opencl: {op}: the output's slice offset overflows")))?;
        let slice = View { addr: out.addr.wrapping_add_signed(bytes), shape: input.shape, ..*out };
        unary(l, UnaryOp::Copy, &Operand::Device(*input), Number::Int(0), &Operand::Device(slice))?;
        at += size;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_merge_only_when_one_stride_steps_through_them() {
        assert_eq!(merged_stride(&[2, 3], &[3, 1]), Some(1));
        assert_eq!(merged_stride(&[2, 3], &[6, 2]), Some(2));
        assert_eq!(merged_stride(&[3, 2], &[1, 3]), None);
        assert_eq!(merged_stride(&[1, 4, 1], &[9, 5, 7]), Some(5));
        assert_eq!(merged_stride(&[], &[]), Some(1));
    }
}

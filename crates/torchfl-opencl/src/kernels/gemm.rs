//! Matrix products: `mm`, `bmm` and `addmm` as one tiled kernel
//! (`gemm.cl`), computing in float32 for float32 and float16 operands.

use super::{arg, launch_range, place, Elem, Launch, Number, View, MAX_DIMS};
use crate::error::{Error, Result};
use crate::runtime::Runtime;

const GEMM_SOURCE: &str = concat!(include_str!("common.cl"), include_str!("gemm.cl"));
// Matrices are placed as 3-D views.
const _: () = assert!(MAX_DIMS >= 3);

/// The kernel's tile edge (`TILE` in gemm.cl): work groups are TILE x TILE.
const TILE: usize = 16;

/// One operand as the kernel addresses it: buffer, element offset, and the
/// (batch, row, column) strides.
struct Matrix {
    mem: usize,
    offset: u64,
    strides: [i64; 3],
}

/// Places `view` as a [batch, rows, cols] matrix broadcast to `shape`
/// (3 entries; a 2-D view gets batch stride 0).
fn matrix(
    rt: &Runtime,
    device: usize,
    op: &str,
    what: &str,
    view: View<'_>,
    shape: &[i64; 3],
) -> Result<Matrix> {
    let placed = place(rt, device, op, what, view, shape)?;
    let s = &placed.strides;
    Ok(Matrix { mem: placed.mem, offset: placed.offset, strides: [s[0], s[1], s[2]] })
}

fn as_f32(n: Number) -> f32 {
    match n {
        Number::Int(i) => i as f32,
        Number::Float(f) => f as f32,
    }
}

/// `out = alpha * a @ b + beta * c` (`c` absent: `out = a @ b`). Shapes are
/// [M, K] @ [K, N] (or batched [B, M, K] @ [B, K, N]); `c` broadcasts to the
/// output. float32 and float16 only: integer products are UNIMPLEMENTED (the
/// CPU fallback runs them).
pub(crate) fn gemm(
    l: &Launch<'_>,
    a: View<'_>,
    b: View<'_>,
    c: Option<View<'_>>,
    out: View<'_>,
    alpha: Number,
    beta: Number,
) -> Result<()> {
    let Launch { rt, cache, stream, op: name } = *l;
    let device = stream.device;
    let t = out.elem;
    if t == Elem::I64 || [a.elem, b.elem].iter().chain(c.as_ref().map(|c| &c.elem)).any(|&e| e != t) {
        return Err(Error::unimplemented(format!(
            "opencl: {name}: the matrix kernel takes float32 or float16 operands of one dtype"
        )));
    }
    let batched = out.shape.len() == 3;
    let dims = |v: &View<'_>, what: &str| -> Result<[i64; 3]> {
        match (v.shape, batched) {
            ([r, k], false) => Ok([1, *r, *k]),
            ([b, r, k], true) => Ok([*b, *r, *k]),
            (shape, _) => Err(Error::invalid(format!("opencl: {name}: {what} has shape {shape:?}"))),
        }
    };
    let (ad, bd, od) = (dims(&a, "self")?, dims(&b, "mat2")?, dims(&out, "the output")?);
    let (batch, m, k, n) = (od[0], ad[1], ad[2], bd[2]);
    if bd[1] != k || od[1] != m || od[2] != n || ad[0] != batch || bd[0] != batch {
        return Err(Error::invalid(format!(
            "opencl: {name}: shapes {:?} @ {:?} -> {:?} do not multiply",
            a.shape, b.shape, out.shape
        )));
    }
    // 2-D views as [1, rows, cols]: prepend a unit batch dimension.
    let lift = |v: View<'_>, what: &str, shape: [i64; 3]| -> Result<Matrix> {
        if batched {
            return matrix(rt, device, name, what, v, &shape);
        }
        let (sizes, strides) = (v.shape.to_vec(), v.strides.to_vec());
        let sizes3: Vec<i64> = std::iter::once(1).chain(sizes).collect();
        let strides3: Vec<i64> = std::iter::once(0).chain(strides).collect();
        matrix(rt, device, name, what, View { shape: &sizes3, strides: &strides3, ..v }, &shape)
    };
    let om = lift(out, "the output", [batch, m, n])?;
    let am = lift(a, "self", [batch, m, k])?;
    let bm = lift(b, "mat2", [batch, k, n])?;
    let beta = as_f32(beta);
    let cm = match c {
        // addmm's beta = 0 ignores self entirely (NaN in it included).
        Some(view) if beta != 0.0 => {
            let (sizes, strides) = (view.shape.to_vec(), view.strides.to_vec());
            let lead = 3 - sizes.len().min(3);
            let sizes3: Vec<i64> = std::iter::repeat_n(1, lead).chain(sizes).collect();
            let strides3: Vec<i64> = std::iter::repeat_n(0, lead).chain(strides).collect();
            Some(matrix(
                rt,
                device,
                name,
                "self",
                View { shape: &sizes3, strides: &strides3, ..view },
                &[batch, m, n],
            )?)
        }
        _ => None,
    };
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let mut options = format!("-DT={}", t.c_name());
    if t == Elem::F16 {
        if !rt.device(device).fp16 {
            return Err(Error::unimplemented(format!("opencl: {name}: the device has no cl_khr_fp16")));
        }
        options.push_str(" -DUSE_HALF");
    }
    let built = cache.get(rt, device, GEMM_SOURCE, "gemm", options)?;
    let has_c = i32::from(cm.is_some());
    let c_ref = cm.as_ref().unwrap_or(&am); // unread when has_c is 0
    let alpha = as_f32(alpha);
    let args = [
        arg(&am.mem),
        arg(&am.offset),
        arg(&am.strides[0]),
        arg(&am.strides[1]),
        arg(&am.strides[2]),
        arg(&bm.mem),
        arg(&bm.offset),
        arg(&bm.strides[0]),
        arg(&bm.strides[1]),
        arg(&bm.strides[2]),
        arg(&c_ref.mem),
        arg(&c_ref.offset),
        arg(&c_ref.strides[0]),
        arg(&c_ref.strides[1]),
        arg(&c_ref.strides[2]),
        arg(&om.mem),
        arg(&om.offset),
        arg(&om.strides[0]),
        arg(&om.strides[1]),
        arg(&om.strides[2]),
        arg(&m),
        arg(&n),
        arg(&k),
        arg(&alpha),
        arg(&beta),
        arg(&has_c),
    ];
    let round = |x: i64| (x as usize).div_ceil(TILE) * TILE;
    let global = [round(m), round(n), batch as usize];
    launch_range(rt, &built, stream, name, &args, &global, Some(&[TILE, TILE, 1]))
}

//! Fused scaled-dot-product attention: PyTorch's overrideable route,
//! `_scaled_dot_product_fused_attention_overrideable` and its backward.
//!
//! `F.scaled_dot_product_attention` on the device reaches these kernels
//! when the host's backend choice picks `SDPBackend.OVERRIDEABLE`, which
//! torch-fl does for any plugin whose op table has the forward (and, for
//! inputs that require grad, the backward) entry; see
//! docs/design/privateuse1-notes.md, "Fused attention". The math path
//! materialises the `(B, H, L, S)` probabilities, saves them for backward
//! and makes a pass per operator; these kernels never hold more than one
//! `BR x BC` block of them ([`forward`], [`backward`]).
//!
//! # The calling convention
//!
//! Arguments in schema order; one output per `Tensor` return, with the
//! ones the dense case leaves undefined (`cum_seq_q`, `cum_seq_k`,
//! `debug_attn_mask`, and gradients not asked for) flagged undefined
//! (zero elements, never written). The host computes the two `SymInt`
//! returns (`max_q = L`, `max_k = S`) itself.
//!
//! - forward `(query, key, value, attn_bias?, dropout_p, is_causal,
//!   return_debug_mask, *, scale?)`: `query` is `(B, Hq, L, E)`, `key`
//!   `(B, Hkv, S, E)`, `value` `(B, Hkv, S, Ev)` with `Hkv` dividing `Hq`
//!   (grouped-query attention: query head `h` reads key/value head
//!   `h / (Hq / Hkv)`, as `repeat_interleave` would arrange them);
//!   `attn_bias` is additive (the query's dtype; PyTorch turns boolean
//!   masks into `0`/`-inf` before this call) or boolean (`false` excludes),
//!   broadcastable to `(B, Hq, L, S)`; `is_causal` excludes `j > i`
//!   (top-left aligned, `ones(L, S).tril()`); `scale` defaults to
//!   `1 / sqrt(E)`. Outputs: `output` `(B, Hq, L, Ev)` in the query's
//!   dtype, any strides; `logsumexp` `(B, Hq, L)` float32; `philox_seed`
//!   and `philox_offset`, 0-dim int64 device tensors that receive the
//!   call's random state (the entry is flagged `TFL_OP_RANDOM`; the host
//!   reserves one counter per probability, `B * Hq * L * S`, when
//!   `dropout_p > 0`).
//! - backward `(grad_out, query, key, value, attn_bias?, grad_input_mask,
//!   out, logsumexp, cum_seq_q?, cum_seq_k?, max_q, max_k, dropout_p,
//!   is_causal, philox_seed, philox_offset, *, scale?)` with the forward's
//!   tensors: outputs `grad_query`, `grad_key`, `grad_value` shaped like
//!   their inputs, and `grad_attn_bias` as the full `(B, Hq, L, S)` (the
//!   host sums it to the bias's own shape). `philox_seed`/`philox_offset`
//!   may be device tensors or host 0-dim scalars.
//!
//! Query, key and value share one dtype: float32, float16 or bfloat16,
//! computed in float32 (others are `UNIMPLEMENTED`). Rows whose keys are
//! all excluded give zeros (and `logsumexp = -inf`), as PyTorch's math
//! path does.

mod backward;
mod forward;
mod problem;

use super::elementwise::{load, store};
use super::view::TensorView;
use super::{ArgRef, Args, Frame, KernelCtx, Operand, Rng, Scalar};
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::Work;
use backward::{Grads, Saved};
use problem::{Dropout, Problem, Sizes};

/// A `float` argument (ints accepted).
fn float_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<f64> {
    match call.args.get(i) {
        Some(ArgRef::Float(v)) => Ok(*v),
        Some(ArgRef::Int(v)) => Ok(*v as f64),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a float"))),
    }
}

/// A `float?` argument.
fn opt_float_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<Option<f64>> {
    match call.args.get(i) {
        None | Some(ArgRef::None) => Ok(None),
        _ => float_arg(ctx, call, i, name).map(Some),
    }
}

/// A `Tensor?` argument on the device.
fn opt_tensor_arg(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<Option<TensorView>> {
    match call.args.get(i) {
        None | Some(ArgRef::None) => Ok(None),
        Some(ArgRef::Tensor(t)) => ctx.device_view(t, name).map(Some),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a tensor or None"))),
    }
}

fn four_d(ctx: &KernelCtx<'_>, v: &TensorView, name: &str) -> Result<()> {
    if v.ndim() == 4 {
        Ok(())
    } else {
        Err(ctx.invalid(format!(
            "{name} must be 4-D (batch, heads, length, head size), got shape {:?}",
            v.shape()
        )))
    }
}

/// Validates the operands and options both passes share.
fn problem(
    ctx: &KernelCtx<'_>,
    (q, k, v): (TensorView, TensorView, TensorView),
    bias: Option<TensorView>,
    dropout_p: f64,
    causal: bool,
    scale: Option<f64>,
) -> Result<Problem> {
    for (t, name) in [(&q, "query"), (&k, "key"), (&v, "value")] {
        four_d(ctx, t, name)?;
    }
    if !matches!(q.dtype(), DType::Float32 | DType::Float16 | DType::BFloat16) {
        return Err(ctx.unimplemented(format!("{} is not supported (float32, float16, bfloat16)", q.dtype())));
    }
    if k.dtype() != q.dtype() || v.dtype() != q.dtype() {
        return Err(ctx.invalid(format!(
            "query, key and value must have one dtype, got {}, {} and {}",
            q.dtype(),
            k.dtype(),
            v.dtype()
        )));
    }
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    let sizes = Sizes { b: qs[0], hq: qs[1], hkv: ks[1], l: qs[2], s: ks[2], e: qs[3], ev: vs[3] };
    let heads_fit = if sizes.hkv == 0 { sizes.hq == 0 } else { sizes.hq % sizes.hkv == 0 };
    if ks[0] != sizes.b
        || vs[0] != sizes.b
        || vs[1] != sizes.hkv
        || vs[2] != sizes.s
        || ks[3] != sizes.e
        || !heads_fit
    {
        return Err(ctx.invalid(format!(
            "shapes do not fit together: query {qs:?}, key {ks:?}, value {vs:?} (expected (B, Hq, L, E), \
             (B, Hkv, S, E), (B, Hkv, S, Ev) with Hkv dividing Hq)"
        )));
    }
    let bias = match bias {
        None => None,
        Some(b) => {
            if !(b.dtype().is_floating() || b.dtype() == DType::Bool) {
                return Err(ctx.invalid(format!("attn_bias must be floating or bool, got {}", b.dtype())));
            }
            let full = [sizes.b, sizes.hq, sizes.l, sizes.s];
            Some(b.into_broadcast(&full).map_err(|b| {
                ctx.invalid(format!("attn_bias of shape {:?} does not broadcast to {full:?}", b.shape()))
            })?)
        }
    };
    if !(0.0..=1.0).contains(&dropout_p) {
        return Err(ctx.invalid(format!("dropout_p must be in [0, 1], got {dropout_p}")));
    }
    let scale = scale.unwrap_or_else(|| 1.0 / (sizes.e as f64).sqrt()) as f32;
    Ok(Problem { sizes, q, k, v, bias, scale, causal, dropout: None })
}

/// Output `i` if the host passed a defined one (undefined outputs have
/// zero elements where the expected shape has some).
fn opt_output(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    i: usize,
    shape: &[usize],
    dtype: Option<DType>,
) -> Result<Option<TensorView>> {
    if i >= call.outputs.len() {
        return Ok(None);
    }
    let o = ctx.output(call, i)?;
    if o.numel() == 0 && shape.iter().product::<usize>() != 0 {
        return Ok(None);
    }
    if o.shape() != shape || dtype.is_some_and(|d| d != o.dtype()) {
        return Err(ctx.invalid(format!(
            "output {i} is {:?} of shape {:?}, expected {} of shape {shape:?}",
            o.dtype(),
            o.shape(),
            dtype.map_or("a floating tensor".to_owned(), |d| d.to_string())
        )));
    }
    Ok(Some(o))
}

/// Refuses outputs that share memory with an input or with each other.
fn check_disjoint(ctx: &KernelCtx<'_>, outputs: &[&TensorView], inputs: &[&TensorView]) -> Result<()> {
    for (n, o) in outputs.iter().enumerate() {
        for other in inputs.iter().chain(&outputs[..n]) {
            if !super::view::disjoint(o, other) {
                return Err(ctx.invalid("an output shares memory with another operand"));
            }
        }
    }
    Ok(())
}

/// `_scaled_dot_product_fused_attention_overrideable` (see the module doc).
pub(crate) fn sdpa_forward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 3, 8)?;
    let q = ctx.device_view(args.tensor(0, "query")?, "query")?;
    let k = ctx.device_view(args.tensor(1, "key")?, "key")?;
    let v = ctx.device_view(args.tensor(2, "value")?, "value")?;
    let bias = opt_tensor_arg(ctx, call, 3, "attn_bias")?;
    let dropout_p = match call.args.get(4) {
        None | Some(ArgRef::None) => 0.0,
        _ => float_arg(ctx, call, 4, "dropout_p")?,
    };
    let causal = args.bool_or(5, "is_causal", false)?;
    args.bool_or(6, "return_debug_mask", false)?;
    let scale = opt_float_arg(ctx, call, 7, "scale")?;
    let mut p = problem(ctx, (q, k, v), bias, dropout_p, causal, scale)?;
    p.dropout = Dropout::new(dropout_p, call.rng);
    let z = p.sizes;
    let out = opt_output(ctx, call, 0, &[z.b, z.hq, z.l, z.ev], Some(p.q.dtype()))?
        .ok_or_else(|| ctx.invalid("output 0 (output) is required"))?;
    let lse = opt_output(ctx, call, 1, &[z.b, z.hq, z.l], Some(DType::Float32))?
        .ok_or_else(|| ctx.invalid("output 1 (logsumexp) is required"))?;
    let seed = opt_output(ctx, call, 4, &[], Some(DType::Int64))?;
    let offset = opt_output(ctx, call, 5, &[], Some(DType::Int64))?;
    let written: Vec<&TensorView> =
        [Some(&out), Some(&lse), seed.as_ref(), offset.as_ref()].into_iter().flatten().collect();
    let read: Vec<&TensorView> =
        [Some(&p.q), Some(&p.k), Some(&p.v), p.bias.as_ref()].into_iter().flatten().collect();
    check_disjoint(ctx, &written, &read)?;
    let rng = call.rng;
    Ok(Some(Work::new(move || {
        forward::run(&p, &out, &lse);
        // The random state, for the backward to regenerate the mask.
        for (view, value) in [(seed, rng.seed), (offset, rng.offset)] {
            if let Some(view) = view {
                // SAFETY: a validated 0-dim int64 output (one writable
                // element at its address), written by this work only.
                unsafe { store(view.dtype(), view.addr(), 0, &[value as i64]) };
            }
        }
        Ok(())
    })))
}

/// A random-state argument of the backward: a host scalar, read now, or a
/// device tensor, read when the work runs.
#[derive(Debug, Clone)]
enum Counter {
    Known(u64),
    Device(TensorView),
}

impl Counter {
    fn parse(ctx: &KernelCtx<'_>, args: &Args<'_>, i: usize, name: &str) -> Result<Self> {
        let t = args.tensor(i, name)?;
        match ctx.operand(t, name)? {
            // A seed is 64 random bits: reinterpret, never round.
            Operand::Host(_, Scalar::Int(value), _) => Ok(Counter::Known(value as u64)),
            Operand::View(v) if v.numel() == 1 && matches!(v.dtype(), DType::Int64 | DType::Int32) => {
                Ok(Counter::Device(v))
            }
            _ => Err(ctx.invalid(format!("{name} must be a 0-dim integer tensor"))),
        }
    }

    /// Call only from stream work.
    fn value(&self) -> u64 {
        match self {
            Counter::Known(v) => *v,
            Counter::Device(view) => {
                let mut buf = [0i64];
                // SAFETY: a validated view of one integer element, live while
                // the work runs.
                unsafe { load(view.dtype(), view.addr(), 0, &mut buf) };
                buf[0] as u64
            }
        }
    }
}

/// `_scaled_dot_product_fused_attention_overrideable_backward` (see the
/// module doc).
pub(crate) fn sdpa_backward(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    let args = Args::new(ctx, call, 16, 17)?;
    let view = |i: usize, name: &str| ctx.device_view(args.tensor(i, name)?, name);
    let grad_out = view(0, "grad_out")?;
    let (q, k, v) = (view(1, "query")?, view(2, "key")?, view(3, "value")?);
    let bias = opt_tensor_arg(ctx, call, 4, "attn_bias")?;
    let mask: [bool; 4] = match call.args.get(5) {
        Some(ArgRef::BoolList(m)) if m.len() == 4 => [m[0], m[1], m[2], m[3]],
        _ => return Err(ctx.invalid("argument 5 (grad_input_mask) must be a list of 4 bools")),
    };
    let (out, lse) = (view(6, "out")?, view(7, "logsumexp")?);
    let dropout_p = float_arg(ctx, call, 12, "dropout_p")?;
    let causal = args.bool_or(13, "is_causal", false)?;
    let seed = Counter::parse(ctx, &args, 14, "philox_seed")?;
    let offset = Counter::parse(ctx, &args, 15, "philox_offset")?;
    let scale = opt_float_arg(ctx, call, 16, "scale")?;
    let p = problem(ctx, (q, k, v), bias, dropout_p, causal, scale)?;
    let z = p.sizes;
    let dtype = p.q.dtype();
    let head_out = [z.b, z.hq, z.l, z.ev];
    for (t, name) in [(&grad_out, "grad_out"), (&out, "out")] {
        if t.shape() != head_out || t.dtype() != dtype {
            return Err(ctx.invalid(format!(
                "{name} is {} of shape {:?}, expected {dtype} of shape {head_out:?}",
                t.dtype(),
                t.shape()
            )));
        }
    }
    if lse.shape() != [z.b, z.hq, z.l] || !lse.dtype().is_floating() {
        return Err(ctx.invalid(format!(
            "logsumexp has shape {:?}, expected {:?}",
            lse.shape(),
            [z.b, z.hq, z.l]
        )));
    }
    let want = |i: usize, shape: &[usize]| -> Result<Option<TensorView>> {
        if mask[i] {
            opt_output(ctx, call, i, shape, Some(dtype))
        } else {
            Ok(None)
        }
    };
    let grads = Grads {
        query: want(0, p.q.shape())?,
        key: want(1, p.k.shape())?,
        value: want(2, p.v.shape())?,
        bias: match &p.bias {
            Some(_) if mask[3] => opt_output(ctx, call, 3, &[z.b, z.hq, z.l, z.s], None)?,
            _ => None,
        },
    };
    if grads.bias.as_ref().is_some_and(|g| !g.dtype().is_floating()) {
        return Err(ctx.invalid("output 3 (grad_attn_bias) must be floating"));
    }
    let written: Vec<&TensorView> =
        [&grads.query, &grads.key, &grads.value, &grads.bias].into_iter().flatten().collect();
    if written.is_empty() {
        return Ok(None);
    }
    let read: Vec<&TensorView> =
        [Some(&p.q), Some(&p.k), Some(&p.v), p.bias.as_ref(), Some(&grad_out), Some(&out), Some(&lse)]
            .into_iter()
            .flatten()
            .collect();
    check_disjoint(ctx, &written, &read)?;
    let saved = Saved { grad_out, out, lse };
    Ok(Some(Work::new(move || {
        let mut p = p;
        p.dropout = Dropout::new(dropout_p, Rng { seed: seed.value(), offset: offset.value() });
        backward::run(&p, &saved, &grads);
        Ok(())
    })))
}

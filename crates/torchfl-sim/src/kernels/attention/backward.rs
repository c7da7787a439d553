//! The backward pass: FlashAttention-2's recomputation.
//!
//! Nothing of size `L x S` was saved: each block of probabilities is
//! recomputed from the scores and the forward's log-sum-exp,
//! `P = exp(s - lse)`, and the dropout mask from the forward's random
//! state. With `Z` the dropout multipliers and `D_i = dO_i . O_i` (which
//! equals `sum_j P_ij Z_ij dP_ij`), per block:
//!
//! ```text
//! dV += (P * Z)^T dO          dP = (dO V^T) * Z
//! dS  = P * (dP - D)          dQ += scale * dS K      dK += scale * dS^T Q
//! ```
//!
//! and `dS` is also the gradient of an additive bias. Tasks are
//! `(batch, key/value head)` pairs: each owns the `dK` and `dV` of its head
//! and the `dQ` of the query heads of its group, so no two tasks write the
//! same element and results do not depend on the split.

use rayon::prelude::*;

use super::super::linalg::{gemm, Mat};
use super::super::view::TensorView;
use super::problem::{exp_shifted, load_lse, load_rows, store_row, store_rows, Problem, BC, BR};

/// Below this many multiply-adds the pass runs inline.
const PARALLEL_WORK: usize = 1 << 17;

/// The gradients to write; `None` for those not requested.
#[derive(Debug, Clone)]
pub(super) struct Grads {
    pub(super) query: Option<TensorView>,
    pub(super) key: Option<TensorView>,
    pub(super) value: Option<TensorView>,
    /// `(B, Hq, L, S)`, dense.
    pub(super) bias: Option<TensorView>,
}

/// The forward's results the backward reads.
#[derive(Debug, Clone)]
pub(super) struct Saved {
    pub(super) grad_out: TensorView,
    pub(super) out: TensorView,
    pub(super) lse: TensorView,
}

/// Writes the requested gradients of `p`.
pub(super) fn run(p: &Problem, saved: &Saved, grads: &Grads) {
    let z = p.sizes;
    let tasks = z.b * z.hkv;
    let task = |t: usize| kv_head(p, (t / z.hkv, t % z.hkv), saved, grads);
    if z.work() >= PARALLEL_WORK && tasks > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Scratch of one task, allocated once.
struct Tiles {
    q: Vec<f32>,
    grad_out: Vec<f32>,
    out: Vec<f32>,
    delta: [f32; BR],
    lse: [f32; BR],
    grad_q: Vec<f32>,
    probs: Vec<f32>,
    /// Dropout multipliers of the block and the probabilities after them.
    multipliers: Vec<f32>,
    dropped: Vec<f32>,
    grad_scores: Vec<f32>,
    scratch: Vec<f32>,
}

/// Key/value head `kvh` of batch `b` and the query heads of its group.
fn kv_head(p: &Problem, (b, kvh): (usize, usize), saved: &Saved, grads: &Grads) {
    let z = p.sizes;
    let (e, ev, s) = (z.e, z.ev, z.s);
    let mut keys = vec![0f32; s * e];
    let mut values = vec![0f32; s * ev];
    load_rows(&p.k, (b, kvh), 0, s, &mut keys);
    load_rows(&p.v, (b, kvh), 0, s, &mut values);
    let mut grad_keys = vec![0f32; s * e];
    let mut grad_values = vec![0f32; s * ev];
    let mut t = Tiles {
        q: vec![0.0; BR * e],
        grad_out: vec![0.0; BR * ev],
        out: vec![0.0; BR * ev],
        delta: [0.0; BR],
        lse: [0.0; BR],
        grad_q: vec![0.0; BR * e],
        probs: vec![0.0; BR * BC],
        multipliers: vec![0.0; if p.dropout.is_some() { BR * BC } else { 0 }],
        dropped: vec![0.0; if p.dropout.is_some() { BR * BC } else { 0 }],
        grad_scores: vec![0.0; BR * BC],
        scratch: vec![0.0; BC.max(s)],
    };
    let group = z.group();
    for h in kvh * group..(kvh + 1) * group {
        for i0 in (0..z.l).step_by(BR) {
            let rows = BR.min(z.l - i0);
            row_block(
                p,
                (b, h),
                (i0, rows),
                (&keys, &values),
                (&mut grad_keys, &mut grad_values),
                saved,
                grads,
                &mut t,
            );
        }
    }
    if let Some(gk) = &grads.key {
        store_rows(gk, (b, kvh), 0, &grad_keys);
    }
    if let Some(gv) = &grads.value {
        store_rows(gv, (b, kvh), 0, &grad_values);
    }
}

/// Query rows `i0..i0 + rows` of head `(b, h)`: accumulates into the key
/// and value gradients of its group, writes its query (and bias) gradient.
#[allow(clippy::too_many_arguments)]
fn row_block(
    p: &Problem,
    (b, h): (usize, usize),
    (i0, rows): (usize, usize),
    (keys, values): (&[f32], &[f32]),
    (grad_keys, grad_values): (&mut [f32], &mut [f32]),
    saved: &Saved,
    grads: &Grads,
    t: &mut Tiles,
) {
    let z = p.sizes;
    let (e, ev) = (z.e, z.ev);
    load_rows(&p.q, (b, h), i0, rows, &mut t.q[..rows * e]);
    load_rows(&saved.grad_out, (b, h), i0, rows, &mut t.grad_out[..rows * ev]);
    load_rows(&saved.out, (b, h), i0, rows, &mut t.out[..rows * ev]);
    load_lse(&saved.lse, (b, h), i0, &mut t.lse[..rows]);
    for r in 0..rows {
        let (go, o) = (&t.grad_out[r * ev..(r + 1) * ev], &t.out[r * ev..(r + 1) * ev]);
        t.delta[r] = go.iter().zip(o).map(|(a, b)| a * b).sum();
    }
    t.grad_q[..rows * e].fill(0.0);
    let limit = p.key_limit(i0, rows);
    for j0 in (0..limit).step_by(BC) {
        let cols = BC.min(limit - j0);
        let n = rows * cols;
        let probs = &mut t.probs[..n];
        p.scores((b, h), (i0, rows), (j0, cols), &t.q[..rows * e], keys, &mut t.scratch, probs);
        for r in 0..rows {
            let lse = t.lse[r];
            for x in &mut probs[r * cols..(r + 1) * cols] {
                // A fully masked row (lse = -inf) has no probabilities.
                *x = if lse == f32::NEG_INFINITY { 0.0 } else { exp_shifted(*x - lse) };
            }
        }
        // The probabilities that reached the output, after dropout.
        let dropped: &[f32] = match &p.dropout {
            None => probs,
            Some(d) => {
                let (mult, dropped) = (&mut t.multipliers[..n], &mut t.dropped[..n]);
                for r in 0..rows {
                    for j in 0..cols {
                        let k = r * cols + j;
                        mult[k] = d.multiplier(p.prob_index(b, h, i0 + r, j0 + j));
                        dropped[k] = probs[k] * mult[k];
                    }
                }
                dropped
            }
        };
        gemm::<f32>(
            cols,
            rows,
            ev,
            1.0,
            Mat::rows_t(dropped, cols),
            Mat::rows(&t.grad_out[..rows * ev], ev),
            1.0,
            &mut grad_values[j0 * ev..],
            ev,
        );
        let grad_scores = &mut t.grad_scores[..n];
        gemm::<f32>(
            rows,
            ev,
            cols,
            1.0,
            Mat::rows(&t.grad_out[..rows * ev], ev),
            Mat { data: &values[j0 * ev..], rs: 1, cs: ev },
            0.0,
            grad_scores,
            cols,
        );
        for r in 0..rows {
            for j in 0..cols {
                let k = r * cols + j;
                // The gradient of the undropped probability.
                let dp = if p.dropout.is_some() { grad_scores[k] * t.multipliers[k] } else { grad_scores[k] };
                grad_scores[k] = probs[k] * (dp - t.delta[r]);
            }
            if let Some(gb) = &grads.bias {
                store_row(gb, (b, h), i0 + r, j0, &grad_scores[r * cols..(r + 1) * cols]);
            }
        }
        gemm::<f32>(
            rows,
            cols,
            e,
            p.scale,
            Mat::rows(grad_scores, cols),
            Mat::rows(&keys[j0 * e..], e),
            1.0,
            &mut t.grad_q[..rows * e],
            e,
        );
        gemm::<f32>(
            cols,
            rows,
            e,
            p.scale,
            Mat::rows_t(grad_scores, cols),
            Mat::rows(&t.q[..rows * e], e),
            1.0,
            &mut grad_keys[j0 * e..],
            e,
        );
    }
    if let Some(gb) = &grads.bias {
        // Pairs past the causal diagonal of every row of the block.
        let zeros = &mut t.scratch[..z.s - limit];
        zeros.fill(0.0);
        for r in 0..rows {
            store_row(gb, (b, h), i0 + r, limit, zeros);
        }
    }
    if let Some(gq) = &grads.query {
        store_rows(gq, (b, h), i0, &t.grad_q[..rows * e]);
    }
}

//! The forward pass: FlashAttention's blocked online softmax.
//!
//! For each head and block of `BR` query rows, key/value blocks of `BC`
//! rows stream past: the block of scores is one GEMM, each row keeps its
//! running maximum `m` and normaliser `l`, and the accumulated output is
//! rescaled by `exp(m_old - m_new)` whenever the maximum grows, so no
//! exponential overflows and the `L x S` probability matrix never exists.
//! At the end `out = acc / l` and `lse = m + ln(l)`, which the backward pass
//! uses to recompute any block of probabilities. Dropout multiplies the
//! probabilities that enter the output, not the normaliser, as
//! `dropout(softmax(s)) @ v` does.
//!
//! Tasks are `(head, chunk of query rows)` pairs, sized so that there are
//! at least twice as many as threads; each writes only its own rows of the
//! output and the log-sum-exp, so results do not depend on the split.

use rayon::prelude::*;

use super::super::linalg::{gemm, Mat};
use super::super::view::TensorView;
use super::problem::{exp_shifted, load_rows, store_lse, store_rows, Problem, BC, BR};

/// Below this many multiply-adds the pass runs inline (a generation step).
const PARALLEL_WORK: usize = 1 << 18;

#[inline(always)]
fn nan_max(m: f32, x: f32) -> f32 {
    if x.is_nan() || x > m {
        x
    } else {
        m
    }
}

/// Query rows per task: a multiple of `BR`, small enough that every thread
/// gets about two tasks.
fn rows_per_task(p: &Problem) -> usize {
    let z = &p.sizes;
    let heads = (z.b * z.hq).max(1);
    let wanted = (2 * rayon::current_num_threads()).div_ceil(heads).max(1);
    z.l.div_ceil(wanted).div_ceil(BR).max(1) * BR
}

/// Writes `out` (`(B, Hq, L, Ev)`) and `lse` (`(B, Hq, L)`) for `p`.
pub(super) fn run(p: &Problem, out: &TensorView, lse: &TensorView) {
    let z = p.sizes;
    if z.b * z.hq == 0 || z.l == 0 {
        return;
    }
    let chunk = rows_per_task(p);
    let chunks = z.l.div_ceil(chunk);
    let task = |t: usize| {
        let (bh, c) = (t / chunks, t % chunks);
        let rows = (c * chunk, ((c + 1) * chunk).min(z.l));
        head_rows(p, (bh / z.hq, bh % z.hq), rows, out, lse);
    };
    let tasks = z.b * z.hq * chunks;
    if z.work() >= PARALLEL_WORK && tasks > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Query rows `r0..r1` of head `(b, h)`.
fn head_rows(
    p: &Problem,
    (b, h): (usize, usize),
    (r0, r1): (usize, usize),
    out: &TensorView,
    lse: &TensorView,
) {
    let z = p.sizes;
    let (e, ev) = (z.e, z.ev);
    let kvh = h / z.group();
    let keys_needed = p.key_limit(r0, r1 - r0);
    let mut keys = vec![0f32; keys_needed * e];
    let mut values = vec![0f32; keys_needed * ev];
    load_rows(&p.k, (b, kvh), 0, keys_needed, &mut keys);
    load_rows(&p.v, (b, kvh), 0, keys_needed, &mut values);

    let mut q_tile = vec![0f32; BR * e];
    let mut block = vec![0f32; BR * BC];
    let mut scratch = vec![0f32; BC];
    let mut acc = vec![0f32; BR * ev];
    let (mut m, mut l, mut lse_rows) = ([0f32; BR], [0f32; BR], [0f32; BR]);

    for i0 in (r0..r1).step_by(BR) {
        let rows = BR.min(r1 - i0);
        load_rows(&p.q, (b, h), i0, rows, &mut q_tile[..rows * e]);
        m[..rows].fill(f32::NEG_INFINITY);
        l[..rows].fill(0.0);
        acc[..rows * ev].fill(0.0);
        let limit = p.key_limit(i0, rows);
        for j0 in (0..limit).step_by(BC) {
            let cols = BC.min(limit - j0);
            let scores = &mut block[..rows * cols];
            p.scores((b, h), (i0, rows), (j0, cols), &q_tile[..rows * e], &keys, &mut scratch, scores);
            for r in 0..rows {
                let row = &mut scores[r * cols..(r + 1) * cols];
                let m_new = nan_max(m[r], row.iter().fold(f32::NEG_INFINITY, |a, &x| nan_max(a, x)));
                if m_new == f32::NEG_INFINITY {
                    // Every key so far is masked out: nothing to add.
                    row.fill(0.0);
                    continue;
                }
                let alpha = exp_shifted(m[r] - m_new);
                let mut sum = 0.0;
                for x in row.iter_mut() {
                    *x = exp_shifted(*x - m_new);
                    sum += *x;
                }
                l[r] = l[r] * alpha + sum;
                m[r] = m_new;
                if alpha != 1.0 {
                    acc[r * ev..(r + 1) * ev].iter_mut().for_each(|a| *a *= alpha);
                }
                if let Some(d) = &p.dropout {
                    for (j, x) in row.iter_mut().enumerate() {
                        *x *= d.multiplier(p.prob_index(b, h, i0 + r, j0 + j));
                    }
                }
            }
            gemm::<f32>(
                rows,
                cols,
                ev,
                1.0,
                Mat::rows(scores, cols),
                Mat::rows(&values[j0 * ev..], ev),
                1.0,
                &mut acc[..rows * ev],
                ev,
            );
        }
        for r in 0..rows {
            let row = &mut acc[r * ev..(r + 1) * ev];
            if l[r] == 0.0 {
                // A fully masked row attends to nothing: zeros, as the math
                // path's safe softmax gives.
                row.fill(0.0);
                lse_rows[r] = f32::NEG_INFINITY;
            } else {
                let inv = 1.0 / l[r];
                row.iter_mut().for_each(|x| *x *= inv);
                lse_rows[r] = m[r] + l[r].ln();
            }
        }
        store_rows(out, (b, h), i0, &acc[..rows * ev]);
        store_lse(lse, (b, h), i0, &lse_rows[..rows]);
    }
}

//! The fused attention kernels (`kernels/attention`):
//! `_scaled_dot_product_fused_attention_overrideable` and its backward
//! against an `f64` reference written here: float32 and the half types,
//! grouped-query heads, `L != S` across several blocks, causal masks,
//! additive and boolean biases, a custom scale, strided and transposed
//! operands, fully masked rows, dropout (its mask recovered with identity
//! values, then both passes checked against the reference with that mask,
//! and its reproducibility), the parallel split's determinism, and the
//! errors; in async and sync modes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop, clippy::too_many_arguments)]

mod common;

use common::*;
use torchfl_sim::{Arg, Call, DType, ErrorCode, Mode, Rng, TensorArg, TensorData};

const FWD: &str = "_scaled_dot_product_fused_attention_overrideable";
const BWD: &str = "_scaled_dot_product_fused_attention_overrideable_backward";

/// Sizes: batch, query heads, key/value heads, L, S, E, Ev.
#[derive(Debug, Clone, Copy)]
struct Sz {
    b: usize,
    hq: usize,
    hkv: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
}

/// Deterministic values in about [-1, 1].
fn vals(dtype: DType, shape: &[usize], salt: usize) -> HTensor {
    HTensor::new(dtype, shape, |i| ((i * 7 + salt * 13) as f64 * 0.61).sin())
}

/// What the reference takes besides q, k and v.
struct Opts<'a> {
    bias: Option<&'a HTensor>,
    causal: bool,
    scale: Option<f64>,
    /// Dropout multipliers of every probability, `(B, Hq, L, S)`.
    drop: Option<&'a [f64]>,
}

/// The probabilities (undropped) of `(b, h, i, :)`, and the row's lse.
fn probs(z: Sz, q: &HTensor, k: &HTensor, o: &Opts<'_>, b: usize, h: usize, i: usize) -> (Vec<f64>, f64) {
    let kvh = h / (z.hq / z.hkv);
    let scale = o.scale.unwrap_or(1.0 / (z.e as f64).sqrt());
    let mut s: Vec<f64> = (0..z.s)
        .map(|j| {
            let dot: f64 = (0..z.e)
                .map(|c| {
                    q.data[((b * z.hq + h) * z.l + i) * z.e + c]
                        * k.data[((b * z.hkv + kvh) * z.s + j) * z.e + c]
                })
                .sum();
            let mut v = dot * scale;
            if let Some(bias) = o.bias {
                let x = bias.at_broadcast(&[b, h, i, j]);
                if bias.dtype == DType::Bool {
                    if x == 0.0 {
                        v = f64::NEG_INFINITY;
                    }
                } else {
                    v += x;
                }
            }
            if o.causal && j > i {
                v = f64::NEG_INFINITY;
            }
            v
        })
        .collect();
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return (vec![0.0; z.s], f64::NEG_INFINITY);
    }
    let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
    for x in &mut s {
        *x = (*x - m).exp() / sum;
    }
    (s, m + sum.ln())
}

fn drop_at(z: Sz, o: &Opts<'_>, b: usize, h: usize, i: usize, j: usize) -> f64 {
    o.drop.map_or(1.0, |d| d[((b * z.hq + h) * z.l + i) * z.s + j])
}

/// `(output, lse)`.
fn reference(z: Sz, q: &HTensor, k: &HTensor, v: &HTensor, o: &Opts<'_>) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; z.b * z.hq * z.l * z.ev];
    let mut lse = vec![0.0; z.b * z.hq * z.l];
    for b in 0..z.b {
        for h in 0..z.hq {
            let kvh = h / (z.hq / z.hkv);
            for i in 0..z.l {
                let (p, l) = probs(z, q, k, o, b, h, i);
                lse[(b * z.hq + h) * z.l + i] = l;
                for c in 0..z.ev {
                    out[((b * z.hq + h) * z.l + i) * z.ev + c] = (0..z.s)
                        .map(|j| {
                            p[j] * drop_at(z, o, b, h, i, j)
                                * v.data[((b * z.hkv + kvh) * z.s + j) * z.ev + c]
                        })
                        .sum();
                }
            }
        }
    }
    (out, lse)
}

/// `(grad_q, grad_k, grad_v, grad_bias (B, Hq, L, S))`.
fn reference_grads(
    z: Sz,
    q: &HTensor,
    k: &HTensor,
    v: &HTensor,
    go: &HTensor,
    o: &Opts<'_>,
) -> [Vec<f64>; 4] {
    let scale = o.scale.unwrap_or(1.0 / (z.e as f64).sqrt());
    let (mut gq, mut gk, mut gv) = (vec![0.0; q.numel()], vec![0.0; k.numel()], vec![0.0; v.numel()]);
    let mut gb = vec![0.0; z.b * z.hq * z.l * z.s];
    for b in 0..z.b {
        for h in 0..z.hq {
            let kvh = h / (z.hq / z.hkv);
            let kv = |j: usize| (b * z.hkv + kvh) * z.s + j;
            for i in 0..z.l {
                let row = (b * z.hq + h) * z.l + i;
                let (p, _) = probs(z, q, k, o, b, h, i);
                let dp: Vec<f64> = (0..z.s)
                    .map(|j| {
                        let dot: f64 =
                            (0..z.ev).map(|c| go.data[row * z.ev + c] * v.data[kv(j) * z.ev + c]).sum();
                        dot * drop_at(z, o, b, h, i, j)
                    })
                    .collect();
                let delta: f64 = (0..z.s).map(|j| p[j] * dp[j]).sum();
                for j in 0..z.s {
                    let pd = p[j] * drop_at(z, o, b, h, i, j);
                    for c in 0..z.ev {
                        gv[kv(j) * z.ev + c] += pd * go.data[row * z.ev + c];
                    }
                    let ds = p[j] * (dp[j] - delta);
                    gb[row * z.s + j] = ds;
                    for c in 0..z.e {
                        gq[row * z.e + c] += scale * ds * k.data[kv(j) * z.e + c];
                        gk[kv(j) * z.e + c] += scale * ds * q.data[row * z.e + c];
                    }
                }
            }
        }
    }
    [gq, gk, gv, gb]
}

/// Compares with a tolerance relative to the largest reference magnitude.
fn close(got: &HTensor, exp: &[f64], what: &str) {
    let rtol = match got.dtype {
        DType::Float32 => 2e-5,
        DType::Float16 => 4e-3,
        _ => 3e-2,
    };
    assert_eq!(got.data.len(), exp.len(), "{what}: length");
    let scale = exp.iter().filter(|v| v.is_finite()).fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &e)) in got.data.iter().zip(exp).enumerate() {
        let ok = if e.is_infinite() { g == e } else { (g - e).abs() <= rtol * scale };
        assert!(ok, "{what}: element {i}: got {g}, expected {e} ({:?})", got.dtype);
    }
}

/// An output the host leaves undefined: no elements, no data.
fn undefined(dtype: DType) -> TensorArg {
    TensorArg {
        dtype,
        shape: vec![0],
        strides: vec![1],
        data: TensorData::Device { device: 0, ptr: 0, byte_offset: 0 },
    }
}

fn launch(sim: &Sim, op: &str, args: Vec<Arg>, outputs: Vec<TensorArg>, rng: Rng) -> torchfl_sim::Result<()> {
    sim.rt.launch(op, &Call { op_name: op.to_owned(), device: 0, stream: sim.stream, args, outputs, rng })
}

/// Device tensors of one call.
struct Placed {
    q: DTensor,
    k: DTensor,
    v: DTensor,
    bias: Option<DTensor>,
}

fn place(sim: &Sim, q: &HTensor, k: &HTensor, v: &HTensor, bias: Option<&HTensor>, layout: Layout) -> Placed {
    Placed {
        q: sim.place(q, layout),
        k: sim.place(k, Layout::Contiguous),
        v: sim.place(v, layout),
        bias: bias.map(|b| sim.place(b, Layout::Contiguous)),
    }
}

/// Runs the forward; returns `(out, lse, seed, offset)` tensors.
fn forward(
    sim: &Sim,
    z: Sz,
    d: &Placed,
    dropout: f64,
    causal: bool,
    scale: Option<f64>,
    rng: Rng,
) -> [DTensor; 4] {
    let dtype = d.q.arg.dtype;
    let out = sim.empty(dtype, &[z.b, z.hq, z.l, z.ev], Layout::Transposed);
    let lse = sim.empty(DType::Float32, &[z.b, z.hq, z.l], Layout::Contiguous);
    let seed = sim.empty(DType::Int64, &[], Layout::Contiguous);
    let offset = sim.empty(DType::Int64, &[], Layout::Contiguous);
    let args = vec![
        t(&d.q),
        t(&d.k),
        t(&d.v),
        d.bias.as_ref().map_or(Arg::None, t),
        Arg::Float(dropout),
        Arg::Bool(causal),
        Arg::Bool(false),
        scale.map_or(Arg::None, Arg::Float),
    ];
    let outputs = vec![
        out.arg.clone(),
        lse.arg.clone(),
        undefined(DType::Int32),
        undefined(DType::Int32),
        seed.arg.clone(),
        offset.arg.clone(),
        undefined(DType::Float32),
    ];
    launch(sim, FWD, args, outputs, rng).unwrap();
    [out, lse, seed, offset]
}

/// Runs the backward; returns the four gradients (bias: full shape).
fn backward(
    sim: &Sim,
    z: Sz,
    d: &Placed,
    go: &DTensor,
    fwd: &[DTensor; 4],
    dropout: f64,
    causal: bool,
    scale: Option<f64>,
) -> [Option<DTensor>; 4] {
    let dtype = d.q.arg.dtype;
    let shapes = [
        vec![z.b, z.hq, z.l, z.e],
        vec![z.b, z.hkv, z.s, z.e],
        vec![z.b, z.hkv, z.s, z.ev],
        vec![z.b, z.hq, z.l, z.s],
    ];
    let grads: Vec<Option<DTensor>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| (i < 3 || d.bias.is_some()).then(|| sim.empty(dtype, s, Layout::Strided)))
        .collect();
    let args = vec![
        t(go),
        t(&d.q),
        t(&d.k),
        t(&d.v),
        d.bias.as_ref().map_or(Arg::None, t),
        Arg::BoolList(vec![true, true, true, d.bias.is_some()]),
        t(&fwd[0]),
        t(&fwd[1]),
        Arg::None,
        Arg::None,
        Arg::Int(z.l as i64),
        Arg::Int(z.s as i64),
        Arg::Float(dropout),
        Arg::Bool(causal),
        t(&fwd[2]),
        t(&fwd[3]),
        scale.map_or(Arg::None, Arg::Float),
    ];
    let outputs = grads.iter().map(|g| g.as_ref().map_or(undefined(dtype), |g| g.arg.clone())).collect();
    launch(sim, BWD, args, outputs, Rng::default()).unwrap();
    let mut grads = grads.into_iter();
    std::array::from_fn(|_| grads.next().unwrap())
}

fn shape_of(z: Sz) -> [[usize; 4]; 4] {
    [[z.b, z.hq, z.l, z.e], [z.b, z.hkv, z.s, z.e], [z.b, z.hkv, z.s, z.ev], [z.b, z.hq, z.l, z.ev]]
}

#[test]
fn forward_and_backward_against_reference() {
    let cases = [
        // L != S across block boundaries, Ev != E, grouped-query heads.
        (Sz { b: 2, hq: 4, hkv: 2, l: 70, s: 130, e: 8, ev: 6 }, false, None),
        (Sz { b: 1, hq: 2, hkv: 2, l: 5, s: 5, e: 4, ev: 4 }, true, Some(0.3)),
        (Sz { b: 2, hq: 3, hkv: 1, l: 66, s: 66, e: 5, ev: 7 }, true, None),
        (Sz { b: 1, hq: 2, hkv: 1, l: 9, s: 3, e: 4, ev: 4 }, true, Some(-0.5)),
    ];
    for mode in [Mode::Async, Mode::Sync] {
        let sim = Sim::new(mode);
        for (z, causal, scale) in cases {
            let [qs, ks, vs, os] = shape_of(z);
            let additive = vals(DType::Float32, &[z.l, z.s], 9);
            let boolean = HTensor::new(DType::Bool, &[z.b, 1, z.l, z.s], |i| f64::from(u8::from(i % 3 != 1)));
            for dtype in [DType::Float32, DType::Float16, DType::BFloat16] {
                let (q, k, v, go) =
                    (vals(dtype, &qs, 1), vals(dtype, &ks, 2), vals(dtype, &vs, 3), vals(dtype, &os, 4));
                let additive = HTensor::new(dtype, &additive.shape, |i| additive.data[i]);
                for bias in [None, Some(&additive), Some(&boolean)] {
                    let layout = if bias.is_some() { Layout::Strided } else { Layout::Transposed };
                    let what =
                        format!("{mode:?} {dtype:?} {z:?} causal={causal} bias={:?}", bias.map(|b| b.dtype));
                    let o = Opts { bias, causal, scale, drop: None };
                    let (out_ref, lse_ref) = reference(z, &q, &k, &v, &o);
                    let d = place(&sim, &q, &k, &v, bias, layout);
                    let fwd = forward(&sim, z, &d, 0.0, causal, scale, Rng::default());
                    close(&sim.read(&fwd[0]), &out_ref, &format!("output {what}"));
                    close(&sim.read(&fwd[1]), &lse_ref, &format!("lse {what}"));
                    if dtype != DType::Float32 {
                        continue;
                    }
                    let dgo = sim.place(&go, Layout::Strided);
                    let grads = backward(&sim, z, &d, &dgo, &fwd, 0.0, causal, scale);
                    let expected = reference_grads(z, &q, &k, &v, &go, &o);
                    for (i, name) in ["grad_q", "grad_k", "grad_v"].iter().enumerate() {
                        close(&sim.read(grads[i].as_ref().unwrap()), &expected[i], &format!("{name} {what}"));
                    }
                    if let Some(gb) = &grads[3] {
                        if bias.unwrap().dtype != DType::Bool {
                            close(&sim.read(gb), &expected[3], &format!("grad_bias {what}"));
                        }
                    }
                }
            }
        }
    }
}

/// A row whose keys are all masked out attends to nothing: zeros, lse
/// `-inf`, zero gradients (never NaN).
#[test]
fn fully_masked_rows_give_zeros() {
    let sim = Sim::new(Mode::Sync);
    let z = Sz { b: 1, hq: 1, hkv: 1, l: 3, s: 4, e: 4, ev: 4 };
    let [qs, ks, vs, os] = shape_of(z);
    let (q, k, v, go) = (
        vals(DType::Float32, &qs, 1),
        vals(DType::Float32, &ks, 2),
        vals(DType::Float32, &vs, 3),
        vals(DType::Float32, &os, 4),
    );
    let mask = HTensor::new(DType::Bool, &[z.l, z.s], |i| f64::from(u8::from(i / z.s != 1)));
    let d = place(&sim, &q, &k, &v, Some(&mask), Layout::Contiguous);
    let fwd = forward(&sim, z, &d, 0.0, false, None, Rng::default());
    let (out, lse) = (sim.read(&fwd[0]), sim.read(&fwd[1]));
    assert_eq!(&out.data[4..8], &[0.0; 4]);
    assert_eq!(lse.data[1], f64::NEG_INFINITY);
    let o = Opts { bias: Some(&mask), causal: false, scale: None, drop: None };
    close(&out, &reference(z, &q, &k, &v, &o).0, "output");
    let dgo = sim.place(&go, Layout::Contiguous);
    let grads = backward(&sim, z, &d, &dgo, &fwd, 0.0, false, None);
    let gq = sim.read(grads[0].as_ref().unwrap());
    assert!(gq.data.iter().all(|x| x.is_finite()));
    assert_eq!(&gq.data[4..8], &[0.0; 4]);
}

/// A NaN in a query row makes that row NaN (as the math path's softmax
/// does) and leaves the others alone; a masked pair never turns into NaN.
#[test]
fn nan_propagates_to_its_row_only() {
    let sim = Sim::new(Mode::Sync);
    let z = Sz { b: 1, hq: 1, hkv: 1, l: 3, s: 70, e: 4, ev: 4 };
    let [qs, ks, vs, _] = shape_of(z);
    let mut q = vals(DType::Float32, &qs, 1);
    q.data[4] = f64::NAN; // row 1
    let (k, v) = (vals(DType::Float32, &ks, 2), vals(DType::Float32, &vs, 3));
    let d = place(&sim, &q, &k, &v, None, Layout::Contiguous);
    let out = sim.read(&forward(&sim, z, &d, 0.0, true, None, Rng::default())[0]);
    assert!(out.data[4..8].iter().all(|x| x.is_nan()), "{:?}", out.data);
    assert!(out.data[..4].iter().chain(&out.data[8..]).all(|x| x.is_finite()), "{:?}", out.data);
}

/// The dropout mask, recovered by attending over identity values (the
/// output row then is the dropped probabilities), drives both passes as
/// the reference with that mask computes them; the same random state
/// gives the same mask, another offset another one.
#[test]
fn dropout_is_consistent_and_reproducible() {
    let sim = Sim::new(Mode::Async);
    let z = Sz { b: 2, hq: 2, hkv: 1, l: 40, s: 80, e: 8, ev: 80 };
    let p = 0.25;
    let [qs, ks, _, _] = shape_of(z);
    let (q, k) = (vals(DType::Float32, &qs, 1), vals(DType::Float32, &ks, 2));
    let identity = HTensor::new(DType::Float32, &[z.b, z.hkv, z.s, z.s], |i| {
        f64::from(u8::from(i % z.s == (i / z.s) % z.s))
    });
    // A seed with high bits set (exact in the f64 `Sim::read` returns).
    let rng = Rng { seed: (1 << 52) + 12_345, offset: 7 };
    let d = place(&sim, &q, &k, &identity, None, Layout::Contiguous);
    let mask_of = |rng: Rng| -> Vec<f64> {
        let fwd = forward(&sim, z, &d, p, false, None, rng);
        assert_eq!(sim.read(&fwd[2]).data[0], rng.seed as f64);
        assert_eq!(sim.read(&fwd[3]).data[0], rng.offset as f64);
        sim.read(&fwd[0]).data.iter().map(|&x| if x == 0.0 { 0.0 } else { 1.0 / (1.0 - p) }).collect()
    };
    let mask = mask_of(rng);
    assert_eq!(mask, mask_of(rng), "same random state, same mask");
    assert_ne!(mask, mask_of(Rng { offset: 8 + 4096, ..rng }), "another offset, another mask");
    let kept = mask.iter().filter(|&&m| m > 0.0).count() as f64 / mask.len() as f64;
    assert!((kept - (1.0 - p)).abs() < 0.02, "kept {kept}");

    let z = Sz { ev: 6, ..z };
    let v = vals(DType::Float32, &[z.b, z.hkv, z.s, z.ev], 3);
    let go = vals(DType::Float32, &[z.b, z.hq, z.l, z.ev], 4);
    let o = Opts { bias: None, causal: false, scale: None, drop: Some(&mask) };
    let d = place(&sim, &q, &k, &v, None, Layout::Transposed);
    let fwd = forward(&sim, z, &d, p, false, None, rng);
    close(&sim.read(&fwd[0]), &reference(z, &q, &k, &v, &o).0, "output with dropout");
    let dgo = sim.place(&go, Layout::Contiguous);
    let grads = backward(&sim, z, &d, &dgo, &fwd, p, false, None);
    let expected = reference_grads(z, &q, &k, &v, &go, &o);
    for (i, name) in ["grad_q", "grad_k", "grad_v"].iter().enumerate() {
        close(&sim.read(grads[i].as_ref().unwrap()), &expected[i], &format!("{name} with dropout"));
    }
}

/// Enough work to split across threads: the reference, and the same bits
/// on every run.
#[test]
fn parallel_split_is_deterministic() {
    let sim = Sim::new(Mode::Async);
    let z = Sz { b: 2, hq: 4, hkv: 4, l: 200, s: 200, e: 16, ev: 16 };
    let [qs, ks, vs, os] = shape_of(z);
    let (q, k, v, go) = (
        vals(DType::Float32, &qs, 5),
        vals(DType::Float32, &ks, 6),
        vals(DType::Float32, &vs, 7),
        vals(DType::Float32, &os, 8),
    );
    let d = place(&sim, &q, &k, &v, None, Layout::Contiguous);
    let dgo = sim.place(&go, Layout::Contiguous);
    let o = Opts { bias: None, causal: true, scale: None, drop: None };
    let (out_ref, _) = reference(z, &q, &k, &v, &o);
    let expected = reference_grads(z, &q, &k, &v, &go, &o);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let fwd = forward(&sim, z, &d, 0.0, true, None, Rng::default());
        let out = sim.read(&fwd[0]);
        close(&out, &out_ref, "output");
        let grads = backward(&sim, z, &d, &dgo, &fwd, 0.0, true, None);
        let gk = sim.read(grads[1].as_ref().unwrap());
        close(&gk, &expected[1], "grad_k");
        runs.push((out.data, gk.data));
    }
    assert!(runs[0].0.iter().zip(&runs[1].0).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(runs[0].1.iter().zip(&runs[1].1).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn bad_calls_are_refused() {
    let sim = Sim::new(Mode::Sync);
    let call = |q: &[usize], k: &[usize], dtype: DType| {
        let (dq, dk) = (
            sim.place(&vals(dtype, q, 1), Layout::Contiguous),
            sim.place(&vals(dtype, k, 2), Layout::Contiguous),
        );
        let out = sim.empty(dtype, q, Layout::Contiguous);
        let lse = sim.empty(DType::Float32, &q[..q.len().saturating_sub(1)], Layout::Contiguous);
        let err = launch(
            &sim,
            FWD,
            vec![t(&dq), t(&dk), t(&dk)],
            vec![out.arg.clone(), lse.arg.clone()],
            Rng::default(),
        )
        .unwrap_err();
        (err.code(), err.message().to_owned())
    };
    let (code, msg) = call(&[2, 3, 4], &[2, 3, 4], DType::Float32);
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(msg.contains("must be 4-D") && msg.contains(FWD), "{msg}");
    let (code, msg) = call(&[1, 3, 4, 8], &[1, 2, 4, 8], DType::Float32);
    assert_eq!(code, ErrorCode::InvalidArgument);
    assert!(msg.contains("Hkv dividing Hq"), "{msg}");
    let (code, msg) = call(&[1, 2, 4, 8], &[1, 2, 4, 8], DType::Float64);
    assert_eq!(code, ErrorCode::Unimplemented);
    assert!(msg.contains("float32, float16, bfloat16"), "{msg}");
}

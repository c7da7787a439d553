//! The `torch.amp.GradScaler` kernels against PyTorch's CPU semantics:
//! `_amp_foreach_non_finite_check_and_unscale_` (scaling in every floating
//! dtype and layout, inf/NaN detection, `found_inf` never cleared, empty
//! lists, the parallel path, errors) and `_amp_update_scale_` (backoff,
//! counting, growth, growth suppressed at inf, errors); in async and sync
//! modes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use torchfl_sim::{Arg, DType, ErrorCode, Mode};

const MODES: [Mode; 2] = [Mode::Async, Mode::Sync];
const UNSCALE: &str = "_amp_foreach_non_finite_check_and_unscale_";
const UPDATE: &str = "_amp_update_scale_";

fn vals(dtype: DType, shape: &[usize], salt: usize) -> HTensor {
    HTensor::new(dtype, shape, |i| ((i * 7 + salt * 13) as f64 * 0.37).sin() * 300.0)
}

/// A 0-dim device tensor holding `v` (what `torch.full((), v)` gives).
fn scalar(sim: &Sim, dtype: DType, v: f64) -> DTensor {
    sim.place(&HTensor::new(dtype, &[], |_| v), Layout::Contiguous)
}

fn lst(v: &[&DTensor]) -> Arg {
    Arg::TensorList(v.iter().map(|d| Some(d.arg.clone())).collect())
}

fn value(sim: &Sim, d: &DTensor) -> f64 {
    sim.read(d).data[0]
}

/// `x * inv` as the kernel computes it for `dtype`: in float for float and
/// the half types, in double for double, then stored.
fn scaled(dtype: DType, x: f64, inv: f32) -> f64 {
    let p = if dtype == DType::Float64 { x * f64::from(inv) } else { f64::from(x as f32 * inv) };
    round_to(dtype, p)
}

#[test]
fn unscale_scales_finite_values_without_flagging() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in FLOATS {
            for layout in LAYOUTS {
                let hs = [vals(dtype, &[3, 4], 1), vals(dtype, &[5], 2), vals(dtype, &[2, 1, 3], 3)];
                let ds: Vec<DTensor> = hs.iter().map(|h| sim.place(h, layout)).collect();
                let found = scalar(&sim, DType::Float32, 0.0);
                let inv = scalar(&sim, DType::Float32, 1.0 / 1024.0);
                sim.call(UNSCALE, vec![lst(&ds.iter().collect::<Vec<_>>()), t(&found), t(&inv)], vec![])
                    .unwrap();
                for (h, d) in hs.iter().zip(&ds) {
                    let got = sim.read(d);
                    let exp: Vec<f64> = h.data.iter().map(|&x| scaled(dtype, x, 1.0 / 1024.0)).collect();
                    assert_eq!(got.data, exp, "{dtype:?} {layout:?} {mode:?}");
                }
                assert_eq!(value(&sim, &found), 0.0, "{dtype:?} {layout:?}");
            }
        }
    }
}

#[test]
fn unscale_flags_inf_and_nan_in_a_later_tensor() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in FLOATS {
            for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
                let a = vals(dtype, &[4, 3], 1);
                let mut b = vals(dtype, &[6], 2);
                b.data[4] = bad;
                let (da, db) = (sim.place(&a, Layout::Contiguous), sim.place(&b, Layout::Strided));
                let found = scalar(&sim, DType::Float32, 0.0);
                let inv = scalar(&sim, DType::Float32, 0.5);
                sim.call(UNSCALE, vec![lst(&[&da, &db]), t(&found), t(&inv)], vec![]).unwrap();
                assert_eq!(value(&sim, &found), 1.0, "{dtype:?} {bad}");
                // Every tensor is still scaled, the non-finite value kept.
                let exp_a: Vec<f64> = a.data.iter().map(|&x| scaled(dtype, x, 0.5)).collect();
                assert_eq!(sim.read(&da).data, exp_a, "{dtype:?} {bad}");
                let exp_b: Vec<f64> = b.data.iter().map(|&x| scaled(dtype, x, 0.5)).collect();
                let got = sim.read(&db).data;
                for (i, (&g, &e)) in got.iter().zip(&exp_b).enumerate() {
                    assert!(g == e || g.is_nan() && e.is_nan(), "{dtype:?} {bad} element {i}: {g} vs {e}");
                }
                let got = got[4];
                assert!(if bad.is_nan() { got.is_nan() } else { got == bad }, "{dtype:?}: {got}");
            }
        }
    }
}

#[test]
fn unscale_float16_rounds_through_float() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let h = HTensor::new(DType::Float16, &[5], |i| [65504.0, 3.0, -0.1, 1e-4, 2048.0][i]);
        let d = sim.place(&h, Layout::Contiguous);
        let found = scalar(&sim, DType::Float32, 0.0);
        let inv = scalar(&sim, DType::Float32, 1.0 / 3.0);
        sim.call(UNSCALE, vec![lst(&[&d]), t(&found), t(&inv)], vec![]).unwrap();
        let exp: Vec<f64> = h.data.iter().map(|&x| scaled(DType::Float16, x, 1.0 / 3.0)).collect();
        assert_eq!(sim.read(&d).data, exp);
        assert_eq!(value(&sim, &found), 0.0);
        // A finite half that overflows after scaling: the input is what is
        // checked, as in PyTorch.
        let inv = scalar(&sim, DType::Float32, 4.0);
        sim.call(UNSCALE, vec![lst(&[&d]), t(&found), t(&inv)], vec![]).unwrap();
        assert!(sim.read(&d).data[0].is_infinite());
        assert_eq!(value(&sim, &found), 0.0);
        // The next call sees that inf.
        sim.call(UNSCALE, vec![lst(&[&d]), t(&found), t(&inv)], vec![]).unwrap();
        assert_eq!(value(&sim, &found), 1.0);
    }
}

#[test]
fn unscale_never_clears_found_inf_and_accepts_empty_lists() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let found = scalar(&sim, DType::Float32, 1.0);
        let inv = scalar(&sim, DType::Float32, 0.5);
        let d = sim.place(&vals(DType::Float32, &[4], 0), Layout::Contiguous);
        sim.call(UNSCALE, vec![lst(&[&d]), t(&found), t(&inv)], vec![]).unwrap();
        assert_eq!(value(&sim, &found), 1.0);
        // Empty list: nothing is checked or written.
        let zero = scalar(&sim, DType::Float32, 0.0);
        sim.call(UNSCALE, vec![Arg::TensorList(vec![]), t(&zero), t(&inv)], vec![]).unwrap();
        assert_eq!(value(&sim, &zero), 0.0);
        let wrong = scalar(&sim, DType::Float64, 0.0);
        sim.call(UNSCALE, vec![Arg::TensorList(vec![]), t(&wrong), t(&wrong)], vec![]).unwrap();
        // Empty tensors in the list are fine too.
        let e = sim.place(&HTensor::new(DType::Float32, &[0, 3], |_| 0.0), Layout::Contiguous);
        sim.call(UNSCALE, vec![lst(&[&e]), t(&zero), t(&inv)], vec![]).unwrap();
        assert_eq!(value(&sim, &zero), 0.0);
    }
}

#[test]
fn unscale_large_tensors_split_across_threads() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let n = 100_003;
        for layout in [Layout::Contiguous, Layout::Strided] {
            for bad_at in [None, Some(n - 1), Some(40_000)] {
                let mut h = HTensor::new(DType::Float32, &[n], |i| (i % 97) as f64 - 48.0);
                if let Some(i) = bad_at {
                    h.data[i] = f64::INFINITY;
                }
                let d = sim.place(&h, layout);
                let found = scalar(&sim, DType::Float32, 0.0);
                let inv = scalar(&sim, DType::Float32, 0.125);
                sim.call(UNSCALE, vec![lst(&[&d]), t(&found), t(&inv)], vec![]).unwrap();
                let exp: Vec<f64> = h.data.iter().map(|&x| scaled(DType::Float32, x, 0.125)).collect();
                assert_eq!(sim.read(&d).data, exp, "{layout:?} {bad_at:?}");
                assert_eq!(value(&sim, &found), if bad_at.is_some() { 1.0 } else { 0.0 });
            }
        }
    }
}

#[test]
fn unscale_refuses_bad_arguments() {
    let sim = Sim::new(Mode::Sync);
    let d = sim.place(&vals(DType::Float32, &[4], 0), Layout::Contiguous);
    let found = scalar(&sim, DType::Float32, 0.0);
    let inv = scalar(&sim, DType::Float32, 0.5);
    let f64_scalar = scalar(&sim, DType::Float64, 0.0);
    let pair = sim.place(&vals(DType::Float32, &[2], 0), Layout::Contiguous);
    let cases: Vec<(Vec<Arg>, ErrorCode, &str)> = vec![
        (vec![lst(&[&d]), t(&f64_scalar), t(&inv)], ErrorCode::InvalidArgument, "found_inf must be a float"),
        (
            vec![lst(&[&d]), t(&found), t(&f64_scalar)],
            ErrorCode::InvalidArgument,
            "inv_scale must be a float",
        ),
        (vec![lst(&[&d]), t(&pair), t(&inv)], ErrorCode::InvalidArgument, "found_inf must be a 1-element"),
        (vec![lst(&[&d]), t(&found), t(&pair)], ErrorCode::InvalidArgument, "inv_scale must be a 1-element"),
        (vec![Arg::TensorList(vec![None]), t(&found), t(&inv)], ErrorCode::InvalidArgument, "is None"),
        (vec![t(&d), t(&found), t(&inv)], ErrorCode::InvalidArgument, "tensor list"),
        (vec![lst(&[&d]), t(&found)], ErrorCode::InvalidArgument, "arguments"),
    ];
    for (args, code, msg) in cases {
        let e = sim.call(UNSCALE, args, vec![]).unwrap_err();
        assert_eq!(e.code(), code, "{}", e.message());
        assert!(e.message().contains(UNSCALE) && e.message().contains(msg), "{}", e.message());
    }
    // Integer gradients: not implemented (the host falls back), nothing
    // touched.
    let i = sim.place(&HTensor::new(DType::Int32, &[3], |k| k as f64), Layout::Contiguous);
    let e = sim.call(UNSCALE, vec![lst(&[&d, &i]), t(&found), t(&inv)], vec![]).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unimplemented, "{}", e.message());
    assert_eq!(sim.read(&d).data, vals(DType::Float32, &[4], 0).data);
    // A gradient expanded over a stride-0 dimension is refused as a
    // written-to tensor.
    let mut expanded = d.arg.clone();
    expanded.shape = vec![3, 4];
    expanded.strides = vec![0, 1];
    let e = sim
        .call(UNSCALE, vec![Arg::TensorList(vec![Some(expanded)]), t(&found), t(&inv)], vec![])
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{}", e.message());
}

/// One `_amp_update_scale_` call the way the ABI makes it (`outputs[0]` is
/// `self`).
fn update(
    sim: &Sim,
    scale: &DTensor,
    tracker: &DTensor,
    found: &DTensor,
    growth: f64,
    backoff: f64,
    interval: i64,
) {
    sim.call(
        UPDATE,
        vec![t(scale), t(tracker), t(found), Arg::Float(growth), Arg::Float(backoff), Arg::Int(interval)],
        vec![scale.arg.clone()],
    )
    .unwrap();
}

#[test]
fn update_scale_backs_off_on_inf() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for flag in [1.0, f64::NAN] {
            let scale = scalar(&sim, DType::Float32, 65536.0);
            let tracker = scalar(&sim, DType::Int32, 7.0);
            let found = scalar(&sim, DType::Float32, flag);
            update(&sim, &scale, &tracker, &found, 2.0, 0.5, 2000);
            assert_eq!(value(&sim, &scale), 32768.0, "{flag}");
            assert_eq!(value(&sim, &tracker), 0.0, "{flag}");
        }
        // The product is taken in double and rounded to float once.
        let scale = scalar(&sim, DType::Float32, 3.0);
        let tracker = scalar(&sim, DType::Int32, 0.0);
        let found = scalar(&sim, DType::Float32, 1.0);
        update(&sim, &scale, &tracker, &found, 2.0, 0.3, 2000);
        assert_eq!(value(&sim, &scale), f64::from((3.0f64 * 0.3) as f32));
    }
}

#[test]
fn update_scale_counts_then_grows_at_the_interval() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let scale = scalar(&sim, DType::Float32, 1024.0);
        let tracker = scalar(&sim, DType::Int32, 0.0);
        let found = scalar(&sim, DType::Float32, 0.0);
        // Queued back to back: each call reads what the previous one wrote.
        for _ in 0..3 {
            update(&sim, &scale, &tracker, &found, 2.0, 0.5, 4);
        }
        assert_eq!(value(&sim, &tracker), 3.0);
        assert_eq!(value(&sim, &scale), 1024.0);
        update(&sim, &scale, &tracker, &found, 2.0, 0.5, 4);
        assert_eq!(value(&sim, &tracker), 0.0);
        assert_eq!(value(&sim, &scale), 2048.0);
        for _ in 0..4 {
            update(&sim, &scale, &tracker, &found, 2.0, 0.5, 4);
        }
        assert_eq!(value(&sim, &scale), 4096.0);
        // A call without outputs (the Rust API) writes `self`.
        sim.call(
            UPDATE,
            vec![t(&scale), t(&tracker), t(&found), Arg::Float(2.0), Arg::Float(0.5), Arg::Int(1)],
            vec![],
        )
        .unwrap();
        assert_eq!(value(&sim, &scale), 8192.0);
        assert_eq!(value(&sim, &tracker), 0.0);
    }
}

#[test]
fn update_scale_does_not_grow_to_inf() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let max = f64::from(f32::MAX);
        let scale = scalar(&sim, DType::Float32, max);
        let tracker = scalar(&sim, DType::Int32, 0.0);
        let found = scalar(&sim, DType::Float32, 0.0);
        update(&sim, &scale, &tracker, &found, 2.0, 0.5, 1);
        assert_eq!(value(&sim, &scale), max);
        assert_eq!(value(&sim, &tracker), 0.0);
        // A growth that stays finite still applies.
        let scale = scalar(&sim, DType::Float32, max / 4.0);
        update(&sim, &scale, &tracker, &found, 2.0, 0.5, 1);
        assert_eq!(value(&sim, &scale), f64::from((max / 4.0 * 2.0) as f32));
    }
}

#[test]
fn update_scale_refuses_bad_arguments() {
    let sim = Sim::new(Mode::Sync);
    let scale = scalar(&sim, DType::Float32, 1.0);
    let tracker = scalar(&sim, DType::Int32, 0.0);
    let found = scalar(&sim, DType::Float32, 0.0);
    let f_tracker = scalar(&sim, DType::Float32, 0.0);
    let pair = sim.place(&vals(DType::Float32, &[2], 0), Layout::Contiguous);
    let d_found = scalar(&sim, DType::Float64, 0.0);
    let args = |s: &DTensor, g: &DTensor, f: &DTensor| {
        vec![t(s), t(g), t(f), Arg::Float(2.0), Arg::Float(0.5), Arg::Int(2000)]
    };
    let cases: Vec<(Vec<Arg>, &str)> = vec![
        (args(&scale, &f_tracker, &found), "growth_tracker must be an int tensor"),
        (args(&pair, &tracker, &found), "current_scale must be a 1-element tensor"),
        (args(&scale, &tracker, &d_found), "found_inf must be a float tensor"),
        (args(&scale, &tracker, &pair), "found_inf must be a 1-element tensor"),
        (
            vec![t(&scale), t(&tracker), t(&found), Arg::Float(2.0), Arg::Float(0.5), Arg::Float(1.0)],
            "growth_interval",
        ),
        (vec![t(&scale), t(&tracker), t(&found)], "arguments"),
    ];
    for (args, msg) in cases {
        let e = sim.call(UPDATE, args, vec![scale.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument, "{}", e.message());
        assert!(e.message().contains(UPDATE) && e.message().contains(msg), "{}", e.message());
    }
    // Nothing was written.
    assert_eq!(value(&sim, &scale), 1.0);
    assert_eq!(value(&sim, &tracker), 0.0);
}

//! The language-model kernels against naive references written
//! here, in every layout, in async and sync modes and in strict mode:
//! triangles, scans, sorts and top-k, gathers and scatters, advanced
//! indexing, rounding divisions, and the random samplers' reproducibility.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)]

mod common;

use common::*;
use torchfl_sim::{Arg, Call, Config, DType, Mode, Rng, Scalar};

const MODES: [Mode; 2] = [Mode::Async, Mode::Sync];

fn int(v: i64) -> Arg {
    Arg::Int(v)
}

fn vals(dtype: DType, shape: &[usize], salt: usize) -> HTensor {
    HTensor::new(dtype, shape, |i| (((i * 7 + salt * 13) % 23) as f64 - 11.0) * 0.5)
}

fn strict_sim() -> Sim {
    Sim::with(Config { devices: 1, memory: 1 << 28, mode: Mode::Async, strict: true, ..Config::default() })
}

#[test]
fn tril_and_triu_in_every_layout() {
    for sim in [Sim::new(Mode::Async), Sim::new(Mode::Sync), strict_sim()] {
        for dtype in [DType::Float32, DType::Int64, DType::Bool] {
            let x = vals(dtype, &[2, 4, 5], 1);
            for layout in LAYOUTS {
                for (op, lower) in [("tril", true), ("triu", false)] {
                    for diag in [-1i64, 0, 2] {
                        let dx = sim.place(&x, layout);
                        let out = sim.empty(dtype, &[2, 4, 5], layout);
                        sim.call(op, vec![t(&dx), int(diag)], vec![out.arg.clone()]).unwrap();
                        let expected: Vec<f64> = (0..x.numel())
                            .map(|k| {
                                let idx = x.index(k);
                                let (i, j) = (idx[1] as i64, idx[2] as i64);
                                let keep = if lower { j - i <= diag } else { j - i >= diag };
                                if keep {
                                    x.data[k]
                                } else {
                                    0.0
                                }
                            })
                            .collect();
                        assert_close(
                            &sim.read(&out),
                            &expected,
                            &format!("{op} {dtype:?} {layout:?} {diag}"),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn cumsum_converts_then_accumulates_along_every_dim() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let x = vals(DType::Int32, &[3, 4, 5], 2);
        for layout in LAYOUTS {
            for dim in 0..3usize {
                let dx = sim.place(&x, layout);
                let out = sim.empty(DType::Int64, &[3, 4, 5], Layout::Contiguous);
                sim.call("cumsum", vec![t(&dx), int(dim as i64), Arg::Int(4)], vec![out.arg.clone()])
                    .unwrap();
                let inner: usize = x.shape[dim + 1..].iter().product();
                let n = x.shape[dim];
                let expected: Vec<f64> = (0..x.numel())
                    .map(|k| {
                        let j = (k / inner) % n;
                        (0..=j).map(|m| x.data[k - (j - m) * inner].trunc()).sum()
                    })
                    .collect();
                assert_close(&sim.read(&out), &expected, &format!("cumsum {layout:?} dim {dim}"));
            }
        }
    }
}

#[test]
fn sort_is_stable_and_topk_prefers_lower_indices() {
    let sim = strict_sim();
    let x = HTensor::new(DType::Float32, &[2, 6], |i| [3.0, 1.0, 3.0, f64::NAN, 1.0, 2.0][i % 6]);
    for layout in LAYOUTS {
        let dx = sim.place(&x, layout);
        let (v, i) = (sim.empty(DType::Float32, &[2, 6], layout), sim.empty(DType::Int64, &[2, 6], layout));
        let args = vec![t(&dx), Arg::Bool(true), int(1), Arg::Bool(true)];
        sim.call("sort.stable", args, vec![v.arg.clone(), i.arg.clone()]).unwrap();
        let row_idx = [3.0, 0.0, 2.0, 5.0, 1.0, 4.0]; // NaN first when descending; ties in order
        let got = sim.read(&i).data;
        assert_eq!(&got[..6], &row_idx, "{layout:?}");
        assert_eq!(&got[6..], &row_idx, "{layout:?}");
        assert!(sim.read(&v).data[0].is_nan());

        let (v, i) = (sim.empty(DType::Float32, &[2, 2], layout), sim.empty(DType::Int64, &[2, 2], layout));
        let args = vec![t(&dx), int(2), int(-1), Arg::Bool(false), Arg::Bool(true)];
        sim.call("topk", args, vec![v.arg.clone(), i.arg.clone()]).unwrap();
        assert_eq!(
            sim.read(&i).data,
            vec![1.0, 4.0, 1.0, 4.0],
            "smallest two: equal values, lower index first"
        );
    }
}

#[test]
fn gather_and_scatter_add_follow_the_definition() {
    for mode in MODES {
        let sim = Sim::new(mode);
        let x = vals(DType::Float64, &[4, 5], 3);
        let idx = HTensor::new(DType::Int64, &[3, 5], |i| ((i * 3) % 4) as f64);
        let src = vals(DType::Float64, &[3, 5], 4);
        for layout in LAYOUTS {
            let (dx, di, ds) = (sim.place(&x, layout), sim.place(&idx, layout), sim.place(&src, layout));
            let out = sim.empty(DType::Float64, &[3, 5], layout);
            sim.call("gather", vec![t(&dx), int(0), t(&di)], vec![out.arg.clone()]).unwrap();
            let expected: Vec<f64> = (0..15).map(|k| x.data[idx.data[k] as usize * 5 + k % 5]).collect();
            assert_close(&sim.read(&out), &expected, &format!("gather {layout:?}"));

            let acc = sim.empty(DType::Float64, &[4, 5], layout);
            sim.call("scatter_add", vec![t(&dx), int(0), t(&di), t(&ds)], vec![acc.arg.clone()]).unwrap();
            let mut expected = x.data.clone();
            for k in 0..15 {
                expected[idx.data[k] as usize * 5 + k % 5] += src.data[k];
            }
            assert_close(&sim.read(&acc), &expected, &format!("scatter_add {layout:?}"));
        }
        let bad = sim.place(&HTensor::new(DType::Int64, &[1, 5], |_| 4.0), Layout::Contiguous);
        let out = sim.empty(DType::Float64, &[1, 5], Layout::Contiguous);
        let dx = sim.place(&x, Layout::Contiguous);
        let err = sim
            .call("gather", vec![t(&dx), int(0), t(&bad)], vec![out.arg.clone()])
            .and_then(|()| sim.rt.synchronize_device(0));
        assert!(err.unwrap_err().message().contains("index 4 is out of bounds for dimension 0 with size 4"));
    }
}

#[test]
fn advanced_indexing_with_negative_indices_and_masks() {
    let sim = strict_sim();
    let x = vals(DType::Float32, &[4, 3], 5);
    let dx = sim.place(&x, Layout::Transposed);
    let rows = sim.place(&HTensor::new(DType::Int64, &[3], |i| [-1.0, 0.0, 2.0][i]), Layout::Contiguous);
    let out = sim.empty(DType::Float32, &[3, 3], Layout::Contiguous);
    let list = Arg::TensorList(vec![Some(rows.arg.clone())]);
    sim.call("index.Tensor", vec![t(&dx), list], vec![out.arg.clone()]).unwrap();
    let expected: Vec<f64> = [3, 0, 2].iter().flat_map(|&r| x.data[r * 3..r * 3 + 3].to_vec()).collect();
    assert_close(&sim.read(&out), &expected, "rows");

    let mask =
        sim.place(&HTensor::new(DType::Bool, &[4, 3], |i| f64::from(u8::from(i % 5 == 0))), Layout::Strided);
    let out = sim.empty(DType::Float32, &[3], Layout::Contiguous);
    let list = Arg::TensorList(vec![Some(mask.arg.clone())]);
    sim.call("index.Tensor", vec![t(&dx), list], vec![out.arg.clone()]).unwrap();
    assert_close(&sim.read(&out), &[x.data[0], x.data[5], x.data[10]], "mask");

    // index_put with accumulate: duplicates add up.
    let target = sim.place(&HTensor::new(DType::Float32, &[4], |_| 0.0), Layout::Contiguous);
    let idx = sim.place(&HTensor::new(DType::Int64, &[4], |i| [1.0, 1.0, -1.0, 1.0][i]), Layout::Contiguous);
    let v = sim.place(&HTensor::new(DType::Float32, &[4], |i| i as f64 + 1.0), Layout::Contiguous);
    let args = vec![t(&target), Arg::TensorList(vec![Some(idx.arg.clone())]), t(&v), Arg::Bool(true)];
    sim.call("_index_put_impl_", args, vec![target.arg.clone()]).unwrap();
    assert_close(&sim.read(&target), &[0.0, 7.0, 0.0, 3.0], "index_put accumulate");
}

#[test]
fn floor_division_and_remainder_follow_python() {
    let sim = Sim::new(Mode::Sync);
    let a = HTensor::new(DType::Int64, &[6], |i| [-7.0, 7.0, -7.0, 7.0, 0.0, i64::MIN as f64][i]);
    let b = HTensor::new(DType::Int64, &[6], |i| [2.0, -2.0, -2.0, 2.0, 3.0, -1.0][i]);
    let (da, db) = (sim.place(&a, Layout::Contiguous), sim.place(&b, Layout::Contiguous));
    let out = sim.empty(DType::Int64, &[6], Layout::Contiguous);
    sim.call("floor_divide", vec![t(&da), t(&db)], vec![out.arg.clone()]).unwrap();
    assert_eq!(sim.read(&out).data, vec![-4.0, -4.0, 3.0, 3.0, 0.0, i64::MIN as f64], "wraps like CUDA");
    sim.call("remainder.Tensor", vec![t(&da), t(&db)], vec![out.arg.clone()]).unwrap();
    assert_eq!(sim.read(&out).data, vec![1.0, -1.0, -1.0, 1.0, 0.0, 0.0]);
    let zero = sim.place(&HTensor::new(DType::Int64, &[6], |_| 0.0), Layout::Contiguous);
    let err = sim.call("floor_divide", vec![t(&da), t(&zero)], vec![out.arg.clone()]);
    assert!(err.unwrap_err().message().contains("ZeroDivisionError"));
}

fn random_call(sim: &Sim, op: &str, args: Vec<Arg>, out: &DTensor, rng: Rng) -> HTensor {
    let call =
        Call { op_name: op.into(), device: 0, stream: sim.stream, args, outputs: vec![out.arg.clone()], rng };
    sim.rt.launch(op, &call).unwrap();
    sim.read(out)
}

#[test]
fn samplers_are_pure_functions_of_seed_and_offset() {
    let sim = strict_sim();
    let probs =
        sim.place(&HTensor::new(DType::Float32, &[3, 50], |i| (i % 50 % 7) as f64), Layout::Transposed);
    let out = sim.empty(DType::Int64, &[3, 10], Layout::Contiguous);
    let draw = |rng: Rng, replacement: bool| {
        random_call(&sim, "multinomial", vec![t(&probs), int(10), Arg::Bool(replacement)], &out, rng).data
    };
    for replacement in [false, true] {
        let a = draw(Rng { seed: 1, offset: 0 }, replacement);
        assert_eq!(a, draw(Rng { seed: 1, offset: 0 }, replacement));
        assert_ne!(a, draw(Rng { seed: 1, offset: 30 }, replacement));
        assert_ne!(a, draw(Rng { seed: 2, offset: 0 }, replacement));
        assert!(a.iter().all(|&k| k as usize % 7 != 0), "zero-probability categories are never drawn");
        if !replacement {
            for row in a.chunks(10) {
                let mut r = row.to_vec();
                r.sort_by(f64::total_cmp);
                r.dedup();
                assert_eq!(r.len(), 10, "without replacement: distinct");
            }
        }
    }

    let perm = sim.empty(DType::Int32, &[1000], Layout::Strided);
    let p =
        random_call(&sim, "randperm.generator_out", vec![int(1000)], &perm, Rng { seed: 9, offset: 4 }).data;
    let mut sorted = p.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(sorted, (0..1000).map(f64::from).collect::<Vec<_>>());
    let q =
        random_call(&sim, "randperm.generator_out", vec![int(1000)], &perm, Rng { seed: 9, offset: 4 }).data;
    assert_eq!(p, q);
}

#[test]
fn isin_compares_in_the_promoted_dtype() {
    let sim = Sim::new(Mode::Async);
    let x = sim.place(&HTensor::new(DType::Int64, &[5], |i| i as f64), Layout::Strided);
    let tests = sim.place(&HTensor::new(DType::Float32, &[3], |i| [1.0, 3.5, 4.0][i]), Layout::Contiguous);
    let out = sim.empty(DType::Bool, &[5], Layout::Contiguous);
    sim.call("isin.Tensor_Tensor", vec![t(&x), t(&tests)], vec![out.arg.clone()]).unwrap();
    assert_eq!(sim.read(&out).data, vec![0.0, 1.0, 0.0, 0.0, 1.0]);
    let args = vec![t(&x), Arg::Scalar(Scalar::Int(2)), Arg::Bool(false), Arg::Bool(true)];
    sim.call("isin.Tensor_Scalar", args, vec![out.arg.clone()]).unwrap();
    assert_eq!(sim.read(&out).data, vec![1.0, 1.0, 0.0, 1.0, 1.0], "invert");
}

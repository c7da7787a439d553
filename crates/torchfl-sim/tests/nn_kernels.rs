//! Neural-network kernels against naive references: convolution forward
//! and backward (groups, stride, padding, dilation, 1-D, output masks),
//! batch and layer norm (train/eval, running statistics, backward), max,
//! average and adaptive pooling, addmm/bmm/baddbmm and threshold_backward;
//! strided and transposed layouts, half types, and error cases; in async
//! and sync modes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_arguments, clippy::needless_range_loop)]

mod common;

use common::*;
use torchfl_sim::{Arg, DType, ErrorCode, Mode, TensorArg};

const MODES: [Mode; 2] = [Mode::Async, Mode::Sync];

fn make(dtype: DType, shape: &[usize], salt: usize) -> HTensor {
    HTensor::new(dtype, shape, |i| (((i * 7 + salt * 13) % 23) as f64 * 0.37 + salt as f64).sin() * 1.5)
}

fn ints(v: &[i64]) -> Arg {
    Arg::IntList(v.to_vec())
}

/// Loose comparison for results accumulated over many terms.
fn close(got: &HTensor, exp: &[f64], what: &str) {
    let rtol = match got.dtype {
        DType::Float64 => 1e-10,
        DType::Float32 => 2e-5,
        DType::Float16 => 4e-3,
        _ => 3e-2,
    };
    assert_eq!(got.data.len(), exp.len(), "{what}: length");
    let scale = exp.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &e)) in got.data.iter().zip(exp).enumerate() {
        let ok = if e.is_nan() { g.is_nan() } else { (g - e).abs() <= rtol * scale };
        assert!(ok, "{what}: element {i}: got {g}, expected {e} ({:?})", got.dtype);
    }
}

// ---------------------------------------------------------------- convolution

#[derive(Debug, Clone, Copy)]
struct Conv {
    n: usize,
    cin: usize,
    cout: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    groups: usize,
    one_d: bool,
}

impl Conv {
    fn out(&self) -> (usize, usize) {
        let o = |i: usize, k: usize, s: usize, p: usize, d: usize| (i + 2 * p - d * (k - 1) - 1) / s + 1;
        (
            o(self.h, self.kh, self.s[0], self.p[0], self.d[0]),
            o(self.w, self.kw, self.s[1], self.p[1], self.d[1]),
        )
    }
    fn x_shape(&self) -> Vec<usize> {
        if self.one_d {
            vec![self.n, self.cin, self.w]
        } else {
            vec![self.n, self.cin, self.h, self.w]
        }
    }
    fn w_shape(&self) -> Vec<usize> {
        let c = self.cin / self.groups;
        if self.one_d {
            vec![self.cout, c, self.kw]
        } else {
            vec![self.cout, c, self.kh, self.kw]
        }
    }
    fn y_shape(&self) -> Vec<usize> {
        let (ho, wo) = self.out();
        if self.one_d {
            vec![self.n, self.cout, wo]
        } else {
            vec![self.n, self.cout, ho, wo]
        }
    }
    fn params(&self) -> Vec<Arg> {
        let l =
            |v: [usize; 2]| if self.one_d { ints(&[v[1] as i64]) } else { ints(&[v[0] as i64, v[1] as i64]) };
        vec![
            l(self.s),
            l(self.p),
            l(self.d),
            Arg::Bool(false),
            if self.one_d { ints(&[0]) } else { ints(&[0, 0]) },
            Arg::Int(self.groups as i64),
        ]
    }
    /// Calls `f(n, co, oh, ow, ci, ih, iw, kidx)` for every contributing
    /// (output, input, weight) triple.
    fn each(&self, mut f: impl FnMut(usize, usize, usize, usize, usize, usize, usize, usize)) {
        let (ho, wo) = self.out();
        let (cig, cog) = (self.cin / self.groups, self.cout / self.groups);
        for n in 0..self.n {
            for co in 0..self.cout {
                let g = co / cog;
                for oh in 0..ho {
                    for ow in 0..wo {
                        for c in 0..cig {
                            for i in 0..self.kh {
                                for j in 0..self.kw {
                                    let ih = (oh * self.s[0] + i * self.d[0]) as isize - self.p[0] as isize;
                                    let iw = (ow * self.s[1] + j * self.d[1]) as isize - self.p[1] as isize;
                                    if ih < 0 || iw < 0 || ih as usize >= self.h || iw as usize >= self.w {
                                        continue;
                                    }
                                    let ci = g * cig + c;
                                    f(
                                        n,
                                        co,
                                        oh,
                                        ow,
                                        ci,
                                        ih as usize,
                                        iw as usize,
                                        (c * self.kh + i) * self.kw + j,
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    fn xi(&self, n: usize, c: usize, h: usize, w: usize) -> usize {
        ((n * self.cin + c) * self.h + h) * self.w + w
    }
    fn yi(&self, n: usize, c: usize, h: usize, w: usize) -> usize {
        let (ho, wo) = self.out();
        ((n * self.cout + c) * ho + h) * wo + w
    }
    fn wi(&self, co: usize, k: usize) -> usize {
        co * (self.cin / self.groups) * self.kh * self.kw + k
    }
    fn forward(&self, x: &HTensor, w: &HTensor, b: Option<&HTensor>) -> Vec<f64> {
        let n: usize = self.y_shape().iter().product();
        let mut y = vec![0.0; n];
        if let Some(b) = b {
            for (i, v) in y.iter_mut().enumerate() {
                let (ho, wo) = self.out();
                *v = b.data[(i / (ho * wo)) % self.cout];
            }
        }
        self.each(|n, co, oh, ow, ci, ih, iw, k| {
            y[self.yi(n, co, oh, ow)] += x.data[self.xi(n, ci, ih, iw)] * w.data[self.wi(co, k)];
        });
        y
    }
    fn backward(&self, gy: &HTensor, x: &HTensor, w: &HTensor) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut gx = vec![0.0; x.numel()];
        let mut gw = vec![0.0; w.numel()];
        let mut gb = vec![0.0; self.cout];
        self.each(|n, co, oh, ow, ci, ih, iw, k| {
            let g = gy.data[self.yi(n, co, oh, ow)];
            gx[self.xi(n, ci, ih, iw)] += g * w.data[self.wi(co, k)];
            gw[self.wi(co, k)] += g * x.data[self.xi(n, ci, ih, iw)];
        });
        let (ho, wo) = self.out();
        for (i, &g) in gy.data.iter().enumerate() {
            gb[(i / (ho * wo)) % self.cout] += g;
        }
        (gx, gw, gb)
    }
}

fn geometries() -> Vec<Conv> {
    let base = Conv {
        n: 2,
        cin: 4,
        cout: 6,
        h: 7,
        w: 6,
        kh: 3,
        kw: 3,
        s: [1, 1],
        p: [1, 1],
        d: [1, 1],
        groups: 1,
        one_d: false,
    };
    vec![
        base,
        Conv { s: [2, 1], p: [0, 2], d: [1, 2], ..base },
        Conv { groups: 2, s: [2, 2], ..base },
        Conv { groups: 4, cout: 4, ..base },
        Conv { kh: 1, kw: 1, p: [0, 0], ..base },
        Conv { kh: 1, kw: 1, p: [0, 0], s: [2, 2], ..base },
        Conv { kh: 2, kw: 3, n: 5, h: 2, w: 2, p: [1, 1], ..base },
        Conv { one_d: true, h: 1, kh: 1, s: [1, 2], p: [0, 1], ..base },
        // Large enough for one sample per GEMM.
        Conv { n: 3, h: 17, w: 16, ..base },
        Conv { kh: 1, kw: 1, p: [0, 0], h: 16, w: 17, groups: 2, ..base },
    ]
}

#[test]
fn convolution_forward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for g in geometries() {
            for dtype in FLOATS {
                for (bias, layout) in
                    [(true, Layout::Contiguous), (false, Layout::Strided), (true, Layout::Transposed)]
                {
                    let x = make(dtype, &g.x_shape(), 1);
                    let w = make(dtype, &g.w_shape(), 2);
                    let b = make(dtype, &[g.cout], 3);
                    let y = sim.empty(dtype, &g.y_shape(), Layout::Contiguous);
                    let mut args = vec![
                        t(&sim.place(&x, layout)),
                        t(&sim.place(&w, Layout::Contiguous)),
                        if bias { t(&sim.place(&b, Layout::Strided)) } else { Arg::None },
                    ];
                    args.extend(g.params());
                    sim.call("convolution", args, vec![y.arg.clone()]).unwrap();
                    let exp = g.forward(&x, &w, bias.then_some(&b));
                    close(&sim.read(&y), &exp, &format!("conv {g:?} {dtype:?} {layout:?}"));
                }
            }
        }
    }
}

#[test]
fn convolution_backward_with_masks() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for g in geometries() {
            for dtype in [DType::Float32, DType::Float64, DType::BFloat16] {
                for mask in [[true, true, true], [false, true, false], [true, false, false]] {
                    let x = make(dtype, &g.x_shape(), 1);
                    let w = make(dtype, &g.w_shape(), 2);
                    let gy = make(dtype, &g.y_shape(), 4);
                    let (ex, ew, eb) = g.backward(&gy, &x, &w);
                    // Masked-off outputs arrive 0-element.
                    let shape = |on: bool, s: Vec<usize>| if on { s } else { vec![0] };
                    let gx = sim.empty(dtype, &shape(mask[0], g.x_shape()), Layout::Contiguous);
                    let gw = sim.empty(dtype, &shape(mask[1], g.w_shape()), Layout::Transposed);
                    let gb = sim.empty(dtype, &shape(mask[2], vec![g.cout]), Layout::Contiguous);
                    let mut args = vec![
                        t(&sim.place(&gy, Layout::Strided)),
                        t(&sim.place(&x, Layout::Transposed)),
                        t(&sim.place(&w, Layout::Contiguous)),
                        ints(&[g.cout as i64]),
                    ];
                    args.extend(g.params());
                    args.push(Arg::BoolList(mask.to_vec()));
                    sim.call(
                        "convolution_backward",
                        args,
                        vec![gx.arg.clone(), gw.arg.clone(), gb.arg.clone()],
                    )
                    .unwrap();
                    let what = format!("conv bwd {g:?} {dtype:?} {mask:?}");
                    if mask[0] {
                        close(&sim.read(&gx), &ex, &format!("{what} grad_input"));
                    }
                    if mask[1] {
                        close(&sim.read(&gw), &ew, &format!("{what} grad_weight"));
                    }
                    if mask[2] {
                        close(&sim.read(&gb), &eb, &format!("{what} grad_bias"));
                    }
                }
            }
        }
    }
}

/// Transposed convolutions, checked through their regular "twin" (the
/// convolution whose input gradient the transposed forward is).
#[test]
fn transposed_convolution() {
    let base = geometries()[0];
    let twins = [
        (Conv { h: 8, w: 7, s: [2, 2], p: [1, 0], ..base }, [1usize, 0usize]),
        (Conv { groups: 2, d: [2, 1], ..base }, [0, 0]),
        (Conv { one_d: true, h: 1, kh: 1, w: 9, s: [1, 3], p: [0, 1], ..base }, [0, 2]),
    ];
    for mode in MODES {
        let sim = Sim::new(mode);
        for (tw, op) in twins {
            for dtype in [DType::Float32, DType::Float64] {
                // The transposed conv maps the twin's output shape to its input shape.
                let xt = make(dtype, &tw.y_shape(), 1);
                let w = make(dtype, &tw.w_shape(), 2);
                let b = make(dtype, &[tw.cin], 3);
                let gyt = make(dtype, &tw.x_shape(), 4);
                let (fwd, _, _) = tw.backward(&xt, &gyt, &w);
                let (ho, wo) = (tw.h, tw.w);
                let exp: Vec<f64> =
                    fwd.iter().enumerate().map(|(i, v)| v + b.data[(i / (ho * wo)) % tw.cin]).collect();
                let mut params = tw.params();
                params[3] = Arg::Bool(true);
                params[4] =
                    if tw.one_d { ints(&[op[1] as i64]) } else { ints(&[op[0] as i64, op[1] as i64]) };
                let (xd, wd) = (sim.place(&xt, Layout::Strided), sim.place(&w, Layout::Transposed));
                let y = sim.empty(dtype, &tw.x_shape(), Layout::Contiguous);
                let mut args = vec![t(&xd), t(&wd), t(&sim.place(&b, Layout::Contiguous))];
                args.extend(params.clone());
                sim.call("convolution", args, vec![y.arg.clone()]).unwrap();
                let what = format!("conv_transpose {tw:?} {dtype:?}");
                close(&sim.read(&y), &exp, &what);
                // Backward: input gradient = twin forward, weight gradient =
                // twin weight gradient with input and output swapped.
                let egx = tw.forward(&gyt, &w, None);
                let (_, egw, _) = tw.backward(&xt, &gyt, &w);
                let mut egb = vec![0.0; tw.cin];
                for (i, v) in gyt.data.iter().enumerate() {
                    egb[(i / (ho * wo)) % tw.cin] += v;
                }
                let gx = sim.empty(dtype, &tw.y_shape(), Layout::Contiguous);
                let gw = sim.empty(dtype, &tw.w_shape(), Layout::Contiguous);
                let gb = sim.empty(dtype, &[tw.cin], Layout::Contiguous);
                let mut args =
                    vec![t(&sim.place(&gyt, Layout::Transposed)), t(&xd), t(&wd), ints(&[tw.cin as i64])];
                args.extend(params);
                args.push(Arg::BoolList(vec![true, true, true]));
                sim.call("convolution_backward", args, vec![gx.arg.clone(), gw.arg.clone(), gb.arg.clone()])
                    .unwrap();
                close(&sim.read(&gx), &egx, &format!("{what} grad_input"));
                close(&sim.read(&gw), &egw, &format!("{what} grad_weight"));
                close(&sim.read(&gb), &egb, &format!("{what} grad_bias"));
            }
        }
    }
}

#[test]
fn convolution_errors() {
    let sim = Sim::new(Mode::Async);
    let g = geometries()[0];
    let x = sim.place(&make(DType::Float32, &g.x_shape(), 1), Layout::Contiguous);
    let w = sim.place(&make(DType::Float32, &g.w_shape(), 2), Layout::Contiguous);
    let y = sim.empty(DType::Float32, &g.y_shape(), Layout::Contiguous);
    let call = |x: &DTensor, w: &DTensor, y: &TensorArg, edit: &dyn Fn(&mut Vec<Arg>)| {
        let mut args = vec![t(x), t(w), Arg::None];
        args.extend(g.params());
        edit(&mut args);
        sim.call("convolution", args, vec![y.clone()]).unwrap_err()
    };
    let e = call(&x, &w, &y.arg, &|a| a[6] = Arg::Bool(true));
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "transposed channels: {}", e.message());
    let e = call(&x, &w, &y.arg, &|a| a[7] = ints(&[1, 0]));
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "output_padding: {}", e.message());
    let e = call(&x, &w, &y.arg, &|a| a[8] = Arg::Int(3));
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("channels"), "{}", e.message());
    let bad = sim.empty(DType::Float32, &[2, 6, 7, 5], Layout::Contiguous);
    let e = call(&x, &w, &bad.arg, &|_| {});
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("expected [2, 6, 7, 6]"), "{}", e.message());
    let xi = sim.place(&make(DType::Int64, &g.x_shape(), 1), Layout::Contiguous);
    let wi = sim.place(&make(DType::Int64, &g.w_shape(), 2), Layout::Contiguous);
    let yi = sim.empty(DType::Int64, &g.y_shape(), Layout::Contiguous);
    assert_eq!(call(&xi, &wi, &yi.arg, &|_| {}).code(), ErrorCode::Unimplemented);
    let e = call(&x, &wi, &y.arg, &|_| {});
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let e = call(&x, &w, &y.arg, &|a| a[3] = ints(&[0, 1]));
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
}

// ----------------------------------------------------------------- batch norm

struct BnRef {
    out: Vec<f64>,
    mean: Vec<f64>,
    invstd: Vec<f64>,
    rm: Vec<f64>,
    rv: Vec<f64>,
}

fn bn_ref(
    x: &HTensor,
    w: &[f64],
    b: &[f64],
    rm: &[f64],
    rv: &[f64],
    train: bool,
    mom: f64,
    eps: f64,
) -> BnRef {
    let (n, c) = (x.shape[0], x.shape[1]);
    let s: usize = x.shape[2..].iter().product();
    let at = |i: usize, ch: usize, k: usize| x.data[(i * c + ch) * s + k];
    let mut r =
        BnRef { out: vec![0.0; x.numel()], mean: vec![], invstd: vec![], rm: rm.to_vec(), rv: rv.to_vec() };
    for ch in 0..c {
        let vals: Vec<f64> =
            (0..n).flat_map(|i| (0..s).map(move |k| (i, k))).map(|(i, k)| at(i, ch, k)).collect();
        let m = vals.len() as f64;
        let (mean, var) = if train {
            let mean = vals.iter().sum::<f64>() / m;
            let var = vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / m;
            r.rm[ch] = (1.0 - mom) * rm[ch] + mom * mean;
            r.rv[ch] = (1.0 - mom) * rv[ch] + mom * var * m / (m - 1.0);
            (mean, var)
        } else {
            (rm[ch], rv[ch])
        };
        let inv = 1.0 / (var + eps).sqrt();
        r.mean.push(mean);
        r.invstd.push(inv);
        for i in 0..n {
            for k in 0..s {
                r.out[(i * c + ch) * s + k] = (at(i, ch, k) - mean) * inv * w[ch] + b[ch];
            }
        }
    }
    r
}

#[test]
fn batch_norm_forward_train_and_eval() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for (dtype, shape) in [
            (DType::Float32, vec![4, 3, 5, 2]),
            (DType::Float64, vec![3, 5]),
            (DType::Float16, vec![2, 3, 7]),
        ] {
            let c = shape[1];
            let x = make(dtype, &shape, 1);
            let w = make(DType::Float32, &[c], 2);
            let b = make(DType::Float32, &[c], 3);
            // Running statistics in f32 (as with a half/f32 model), values
            // exactly representable.
            let rm0: Vec<f64> = (0..c).map(|i| i as f64 * 0.125).collect();
            let rv0: Vec<f64> = (0..c).map(|i| 1.0 + i as f64 * 0.25).collect();
            for train in [true, false] {
                let rm = sim.place(
                    &HTensor { dtype: DType::Float32, shape: vec![c], data: rm0.clone() },
                    Layout::Strided,
                );
                let rv = sim.place(
                    &HTensor { dtype: DType::Float32, shape: vec![c], data: rv0.clone() },
                    Layout::Contiguous,
                );
                let out = sim.empty(dtype, &shape, Layout::Transposed);
                let stat = if train { vec![c] } else { vec![0] };
                let sm = sim.empty(DType::Float32, &stat, Layout::Contiguous);
                let si = sim.empty(DType::Float32, &stat, Layout::Contiguous);
                let args = vec![
                    t(&sim.place(&x, Layout::Strided)),
                    t(&sim.place(&w, Layout::Contiguous)),
                    t(&sim.place(&b, Layout::Contiguous)),
                    t(&rm),
                    t(&rv),
                    Arg::Bool(train),
                    Arg::Float(0.1),
                    Arg::Float(1e-5),
                ];
                sim.call("native_batch_norm", args, vec![out.arg.clone(), sm.arg.clone(), si.arg.clone()])
                    .unwrap();
                let r = bn_ref(&x, &w.data, &b.data, &rm0, &rv0, train, 0.1, 1e-5);
                let what = format!("bn {dtype:?} {shape:?} train={train}");
                close(&sim.read(&out), &r.out, &what);
                if train {
                    close(&sim.read(&sm), &r.mean, &format!("{what} save_mean"));
                    close(&sim.read(&si), &r.invstd, &format!("{what} save_invstd"));
                }
                close(&sim.read(&rm), &r.rm, &format!("{what} running_mean"));
                close(&sim.read(&rv), &r.rv, &format!("{what} running_var"));
            }
        }
        // no_stats (no running statistics, no affine) and no_training.
        let shape = [3, 2, 4];
        let x = make(DType::Float64, &shape, 5);
        let out = sim.empty(DType::Float64, &shape, Layout::Contiguous);
        let sm = sim.empty(DType::Float64, &[2], Layout::Contiguous);
        let si = sim.empty(DType::Float64, &[2], Layout::Contiguous);
        let args = vec![
            t(&sim.place(&x, Layout::Contiguous)),
            Arg::None,
            Arg::None,
            Arg::Bool(true),
            Arg::Float(0.1),
            Arg::Float(1e-5),
        ];
        sim.call(
            "_native_batch_norm_legit.no_stats",
            args,
            vec![out.arg.clone(), sm.arg.clone(), si.arg.clone()],
        )
        .unwrap();
        let r = bn_ref(&x, &[1.0; 2], &[0.0; 2], &[0.0; 2], &[1.0; 2], true, 0.1, 1e-5);
        close(&sim.read(&out), &r.out, "no_stats");
        close(&sim.read(&si), &r.invstd, "no_stats invstd");
        let rm = sim.place(
            &HTensor { dtype: DType::Float64, shape: vec![2], data: vec![0.5, -0.5] },
            Layout::Contiguous,
        );
        let rv = sim.place(
            &HTensor { dtype: DType::Float64, shape: vec![2], data: vec![2.0, 0.5] },
            Layout::Contiguous,
        );
        let e0 = sim.empty(DType::Float64, &[0], Layout::Contiguous);
        let args = vec![
            t(&sim.place(&x, Layout::Contiguous)),
            Arg::None,
            Arg::None,
            t(&rm),
            t(&rv),
            Arg::Float(0.1),
            Arg::Float(1e-5),
        ];
        sim.call(
            "_native_batch_norm_legit_no_training",
            args,
            vec![out.arg.clone(), e0.arg.clone(), e0.arg.clone()],
        )
        .unwrap();
        let r = bn_ref(&x, &[1.0; 2], &[0.0; 2], &[0.5, -0.5], &[2.0, 0.5], false, 0.1, 1e-5);
        close(&sim.read(&out), &r.out, "no_training");
        // Eval mode needs running statistics.
        let args = vec![
            t(&sim.place(&x, Layout::Contiguous)),
            Arg::None,
            Arg::None,
            Arg::None,
            Arg::None,
            Arg::Bool(false),
            Arg::Float(0.1),
            Arg::Float(1e-5),
        ];
        let e = sim
            .call("native_batch_norm", args, vec![out.arg.clone(), e0.arg.clone(), e0.arg.clone()])
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
}

#[test]
fn batch_norm_backward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for (dtype, shape) in [(DType::Float64, vec![4, 3, 5]), (DType::Float32, vec![5, 2, 2, 3])] {
            let c = shape[1];
            let s: usize = shape[2..].iter().product();
            let n = shape[0];
            let m = (n * s) as f64;
            let x = make(dtype, &shape, 1);
            let gy = make(dtype, &shape, 2);
            let w = make(dtype, &[c], 3);
            let r = bn_ref(&x, &w.data, &vec![0.0; c], &vec![0.0; c], &vec![1.0; c], true, 0.1, 1e-5);
            let rv: Vec<f64> = (0..c).map(|i| 0.5 + i as f64).collect();
            for train in [true, false] {
                let (mean, inv): (Vec<f64>, Vec<f64>) = if train {
                    (r.mean.clone(), r.invstd.clone())
                } else {
                    (vec![0.25; c], rv.iter().map(|v| 1.0 / (v + 1e-5f64).sqrt()).collect())
                };
                let mut ex = vec![0.0; x.numel()];
                let (mut ew, mut eb) = (vec![0.0; c], vec![0.0; c]);
                for ch in 0..c {
                    let idx: Vec<usize> =
                        (0..n).flat_map(|i| (0..s).map(move |k| (i * c + ch) * s + k)).collect();
                    let sg: f64 = idx.iter().map(|&i| gy.data[i]).sum();
                    let dot: f64 = idx.iter().map(|&i| gy.data[i] * (x.data[i] - mean[ch])).sum();
                    ew[ch] = dot * inv[ch];
                    eb[ch] = sg;
                    for &i in &idx {
                        ex[i] = if train {
                            (gy.data[i] - sg / m - (x.data[i] - mean[ch]) * inv[ch] * inv[ch] * dot / m)
                                * inv[ch]
                                * w.data[ch]
                        } else {
                            gy.data[i] * inv[ch] * w.data[ch]
                        };
                    }
                }
                let f = |v: &[f64]| HTensor { dtype, shape: vec![c], data: v.to_vec() };
                let (rm_d, rv_d) = (
                    sim.place(&f(&[0.25].repeat(c)), Layout::Contiguous),
                    sim.place(&f(&rv), Layout::Contiguous),
                );
                let (sm_d, si_d) =
                    (sim.place(&f(&r.mean), Layout::Contiguous), sim.place(&f(&r.invstd), Layout::Strided));
                for mask in [[true, true, true], [true, false, false], [false, true, true]] {
                    let gx = sim.empty(dtype, if mask[0] { &shape } else { &[0] }, Layout::Transposed);
                    let gw = sim.empty(dtype, &[c], Layout::Contiguous);
                    let gb = sim.empty(dtype, &[c], Layout::Contiguous);
                    let args = vec![
                        t(&sim.place(&gy, Layout::Strided)),
                        t(&sim.place(&x, Layout::Contiguous)),
                        t(&sim.place(&w, Layout::Contiguous)),
                        t(&rm_d),
                        t(&rv_d),
                        if train { t(&sm_d) } else { Arg::None },
                        if train { t(&si_d) } else { Arg::None },
                        Arg::Bool(train),
                        Arg::Float(1e-5),
                        Arg::BoolList(mask.to_vec()),
                    ];
                    sim.call(
                        "native_batch_norm_backward",
                        args,
                        vec![gx.arg.clone(), gw.arg.clone(), gb.arg.clone()],
                    )
                    .unwrap();
                    let what = format!("bn bwd {dtype:?} train={train} {mask:?}");
                    if mask[0] {
                        close(&sim.read(&gx), &ex, &format!("{what} gx"));
                    }
                    if mask[1] {
                        close(&sim.read(&gw), &ew, &format!("{what} gw"));
                        close(&sim.read(&gb), &eb, &format!("{what} gb"));
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------- layer norm

#[test]
fn layer_norm_forward_and_backward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for (dtype, shape, norm) in [
            (DType::Float64, vec![3, 4, 5], vec![4, 5]),
            (DType::Float32, vec![6, 7], vec![7]),
            (DType::BFloat16, vec![2, 8], vec![8]),
        ] {
            let len: usize = norm.iter().product();
            let rows = shape.iter().product::<usize>() / len;
            let x = make(dtype, &shape, 1);
            let w = make(dtype, &norm, 2);
            let b = make(dtype, &norm, 3);
            let gy = make(dtype, &shape, 4);
            let mut stat_shape: Vec<usize> = shape[..shape.len() - norm.len()].to_vec();
            stat_shape.extend(std::iter::repeat_n(1, norm.len()));
            let (mut ey, mut em, mut er) = (vec![0.0; x.numel()], vec![0.0; rows], vec![0.0; rows]);
            let (mut egx, mut egw, mut egb) = (vec![0.0; x.numel()], vec![0.0; len], vec![0.0; len]);
            for r in 0..rows {
                let xs = &x.data[r * len..(r + 1) * len];
                let mu = xs.iter().sum::<f64>() / len as f64;
                let var = xs.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / len as f64;
                let rs = 1.0 / (var + 1e-5).sqrt();
                em[r] = mu;
                er[r] = rs;
                let xh: Vec<f64> = xs.iter().map(|v| (v - mu) * rs).collect();
                let a: Vec<f64> = (0..len).map(|j| gy.data[r * len + j] * w.data[j]).collect();
                let ma = a.iter().sum::<f64>() / len as f64;
                let max = a.iter().zip(&xh).map(|(a, h)| a * h).sum::<f64>() / len as f64;
                for j in 0..len {
                    ey[r * len + j] = xh[j] * w.data[j] + b.data[j];
                    egx[r * len + j] = rs * (a[j] - ma - xh[j] * max);
                    egw[j] += gy.data[r * len + j] * xh[j];
                    egb[j] += gy.data[r * len + j];
                }
            }
            let y = sim.empty(dtype, &shape, Layout::Contiguous);
            let sdt = if dtype == DType::Float64 { DType::Float64 } else { DType::Float32 };
            let mean = sim.empty(sdt, &stat_shape, Layout::Contiguous);
            let rstd = sim.empty(sdt, &stat_shape, Layout::Contiguous);
            let (xd, wd, bd) = (
                sim.place(&x, Layout::Transposed),
                sim.place(&w, Layout::Contiguous),
                sim.place(&b, Layout::Strided),
            );
            let normi: Vec<i64> = norm.iter().map(|&v| v as i64).collect();
            sim.call(
                "native_layer_norm",
                vec![t(&xd), ints(&normi), t(&wd), t(&bd), Arg::Float(1e-5)],
                vec![y.arg.clone(), mean.arg.clone(), rstd.arg.clone()],
            )
            .unwrap();
            let what = format!("ln {dtype:?} {shape:?}");
            close(&sim.read(&y), &ey, &what);
            close(&sim.read(&mean), &em, &format!("{what} mean"));
            close(&sim.read(&rstd), &er, &format!("{what} rstd"));
            for mask in [[true, true, true], [true, false, false], [false, true, true]] {
                let gx = sim.empty(dtype, if mask[0] { &shape } else { &[0] }, Layout::Contiguous);
                let gw = sim.empty(dtype, if mask[1] { &norm } else { &[0] }, Layout::Contiguous);
                let gb = sim.empty(dtype, if mask[2] { &norm } else { &[0] }, Layout::Contiguous);
                sim.call(
                    "native_layer_norm_backward",
                    vec![
                        t(&sim.place(&gy, Layout::Strided)),
                        t(&xd),
                        ints(&normi),
                        t(&mean),
                        t(&rstd),
                        t(&wd),
                        t(&bd),
                        Arg::BoolList(mask.to_vec()),
                    ],
                    vec![gx.arg.clone(), gw.arg.clone(), gb.arg.clone()],
                )
                .unwrap();
                if mask[0] {
                    close(&sim.read(&gx), &egx, &format!("{what} gx"));
                }
                if mask[1] {
                    close(&sim.read(&gw), &egw, &format!("{what} gw"));
                    close(&sim.read(&gb), &egb, &format!("{what} gb"));
                }
            }
        }
        let x = sim.place(&make(DType::Float32, &[2, 3], 1), Layout::Contiguous);
        let y = sim.empty(DType::Float32, &[2, 3], Layout::Contiguous);
        let s = sim.empty(DType::Float32, &[2, 1], Layout::Contiguous);
        let e = sim
            .call(
                "native_layer_norm",
                vec![t(&x), ints(&[4]), Arg::None, Arg::None, Arg::Float(1e-5)],
                vec![y.arg.clone(), s.arg.clone(), s.arg.clone()],
            )
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(e.message().contains("normalized_shape"), "{}", e.message());
    }
}

// -------------------------------------------------------------------- pooling

/// PyTorch's pooling output size.
fn pool_out(i: usize, k: usize, p: usize, s: usize, d: usize, ceil: bool) -> usize {
    let (i, k, p, s, d) = (i as i64, k as i64, p as i64, s as i64, d as i64);
    let mut o = (i + 2 * p - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 }).div_euclid(s) + 1;
    if ceil && (o - 1) * s >= i + p {
        o -= 1;
    }
    o as usize
}

#[test]
fn max_pool_forward_backward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for (shape, k, s, p, d, ceil) in [
            (vec![2, 3, 9, 8], [3, 3], [2, 2], [1, 1], [1, 1], false),
            (vec![3, 9, 8], [2, 3], [2, 1], [1, 0], [2, 1], true),
            (vec![1, 2, 5, 5], [2, 2], [2, 2], [0, 0], [1, 1], true),
        ] {
            for dtype in [DType::Float32, DType::Float64, DType::BFloat16] {
                let mut x = make(dtype, &shape, 1);
                x.data[3] = f64::NAN;
                let nd = shape.len();
                let (h, w) = (shape[nd - 2], shape[nd - 1]);
                let (ho, wo) =
                    (pool_out(h, k[0], p[0], s[0], d[0], ceil), pool_out(w, k[1], p[1], s[1], d[1], ceil));
                let planes: usize = shape[..nd - 2].iter().product();
                let mut oshape = shape.clone();
                oshape[nd - 2] = ho;
                oshape[nd - 1] = wo;
                let (mut ev, mut ei) = (vec![0.0; planes * ho * wo], vec![0.0; planes * ho * wo]);
                for pl in 0..planes {
                    for oh in 0..ho {
                        for ow in 0..wo {
                            let (mut best, mut bi) = (f64::NEG_INFINITY, -1i64);
                            for i in 0..k[0] {
                                for j in 0..k[1] {
                                    let ih = (oh * s[0] + i * d[0]) as i64 - p[0] as i64;
                                    let iw = (ow * s[1] + j * d[1]) as i64 - p[1] as i64;
                                    if ih < 0 || iw < 0 || ih >= h as i64 || iw >= w as i64 {
                                        continue;
                                    }
                                    let v = x.data[pl * h * w + ih as usize * w + iw as usize];
                                    if bi < 0 || v > best || (v.is_nan() && !best.is_nan()) {
                                        best = v;
                                        bi = ih * w as i64 + iw;
                                    }
                                }
                            }
                            ev[pl * ho * wo + oh * wo + ow] = best;
                            ei[pl * ho * wo + oh * wo + ow] = bi as f64;
                        }
                    }
                }
                let out = sim.empty(dtype, &oshape, Layout::Contiguous);
                let idx = sim.empty(DType::Int64, &oshape, Layout::Transposed);
                let i64s = |v: [usize; 2]| ints(&[v[0] as i64, v[1] as i64]);
                let xd = sim.place(&x, Layout::Strided);
                sim.call(
                    "max_pool2d_with_indices",
                    vec![t(&xd), i64s(k), i64s(s), i64s(p), i64s(d), Arg::Bool(ceil)],
                    vec![out.arg.clone(), idx.arg.clone()],
                )
                .unwrap();
                let what = format!("maxpool {shape:?} {dtype:?}");
                close(&sim.read(&out), &ev, &what);
                assert_eq!(sim.read(&idx).data, ei, "{what} indices");
                let gy = make(dtype, &oshape, 2);
                let mut eg = vec![0.0; x.numel()];
                for (o, &i) in ei.iter().enumerate() {
                    eg[(o / (ho * wo)) * h * w + i as usize] += gy.data[o];
                }
                let gx = sim.empty(dtype, &shape, Layout::Contiguous);
                sim.call(
                    "max_pool2d_with_indices_backward",
                    vec![
                        t(&sim.place(&gy, Layout::Contiguous)),
                        t(&xd),
                        i64s(k),
                        i64s(s),
                        i64s(p),
                        i64s(d),
                        Arg::Bool(ceil),
                        t(&idx),
                    ],
                    vec![gx.arg.clone()],
                )
                .unwrap();
                close(&sim.read(&gx), &eg, &format!("{what} backward"));
            }
        }
        // Padding larger than half the kernel is refused.
        let x = sim.place(&make(DType::Float32, &[1, 4, 4], 0), Layout::Contiguous);
        let out = sim.empty(DType::Float32, &[1, 4, 4], Layout::Contiguous);
        let idx = sim.empty(DType::Int64, &[1, 4, 4], Layout::Contiguous);
        let e = sim
            .call(
                "max_pool2d_with_indices",
                vec![t(&x), ints(&[2]), ints(&[1]), ints(&[2])],
                vec![out.arg, idx.arg],
            )
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(e.message().contains("pad should be at most half"), "{}", e.message());
    }
}

#[test]
fn avg_pool_forward_backward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for (shape, k, s, p, ceil, cip, div) in [
            (vec![2, 3, 9, 8], [3, 3], [2, 2], [1, 1], false, true, None),
            (vec![3, 9, 8], [3, 2], [2, 2], [1, 1], true, false, None),
            (vec![1, 2, 6, 6], [2, 2], [2, 2], [0, 0], false, true, Some(3i64)),
        ] {
            for dtype in [DType::Float32, DType::Float64, DType::Float16] {
                let x = make(dtype, &shape, 1);
                let nd = shape.len();
                let (h, w) = (shape[nd - 2], shape[nd - 1]);
                let (ho, wo) =
                    (pool_out(h, k[0], p[0], s[0], 1, ceil), pool_out(w, k[1], p[1], s[1], 1, ceil));
                let planes: usize = shape[..nd - 2].iter().product();
                let mut oshape = shape.clone();
                oshape[nd - 2] = ho;
                oshape[nd - 1] = wo;
                let gy = make(dtype, &oshape, 2);
                let mut ey = vec![0.0; planes * ho * wo];
                let mut eg = vec![0.0; x.numel()];
                for pl in 0..planes {
                    for oh in 0..ho {
                        for ow in 0..wo {
                            let h0 = (oh * s[0]) as i64 - p[0] as i64;
                            let w0 = (ow * s[1]) as i64 - p[1] as i64;
                            let h1 = (h0 + k[0] as i64).min((h + p[0]) as i64);
                            let w1 = (w0 + k[1] as i64).min((w + p[1]) as i64);
                            let size = (h1 - h0) * (w1 - w0);
                            let (h0, w0, h1, w1) = (h0.max(0), w0.max(0), h1.min(h as i64), w1.min(w as i64));
                            let divisor =
                                div.map_or(if cip { size } else { (h1 - h0) * (w1 - w0) }, |d| d) as f64;
                            let o = pl * ho * wo + oh * wo + ow;
                            for ih in h0..h1 {
                                for iw in w0..w1 {
                                    let i = pl * h * w + ih as usize * w + iw as usize;
                                    ey[o] += x.data[i] / divisor;
                                    eg[i] += gy.data[o] / divisor;
                                }
                            }
                        }
                    }
                }
                let i64s = |v: [usize; 2]| ints(&[v[0] as i64, v[1] as i64]);
                let dv = div.map_or(Arg::None, Arg::Int);
                let xd = sim.place(&x, Layout::Transposed);
                let out = sim.empty(dtype, &oshape, Layout::Contiguous);
                sim.call(
                    "avg_pool2d",
                    vec![t(&xd), i64s(k), i64s(s), i64s(p), Arg::Bool(ceil), Arg::Bool(cip), dv.clone()],
                    vec![out.arg.clone()],
                )
                .unwrap();
                let what = format!("avgpool {shape:?} {dtype:?}");
                close(&sim.read(&out), &ey, &what);
                let gx = sim.empty(dtype, &shape, Layout::Strided);
                sim.call(
                    "avg_pool2d_backward",
                    vec![
                        t(&sim.place(&gy, Layout::Strided)),
                        t(&xd),
                        i64s(k),
                        i64s(s),
                        i64s(p),
                        Arg::Bool(ceil),
                        Arg::Bool(cip),
                        dv,
                    ],
                    vec![gx.arg.clone()],
                )
                .unwrap();
                close(&sim.read(&gx), &eg, &format!("{what} backward"));
            }
        }
        let x = sim.place(&make(DType::Float32, &[1, 4, 4], 0), Layout::Contiguous);
        let out = sim.empty(DType::Float32, &[1, 2, 2], Layout::Contiguous);
        let e = sim
            .call(
                "avg_pool2d",
                vec![
                    t(&x),
                    ints(&[2]),
                    ints(&[2]),
                    ints(&[0]),
                    Arg::Bool(false),
                    Arg::Bool(true),
                    Arg::Int(0),
                ],
                vec![out.arg],
            )
            .unwrap_err();
        assert!(e.message().contains("divisor must be not zero"), "{}", e.message());
    }
}

#[test]
fn adaptive_avg_pool_forward_backward() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for (shape, out_hw) in
            [(vec![2, 3, 7, 5], [3, 2]), (vec![3, 4, 4], [1, 1]), (vec![1, 2, 3, 3], [5, 4])]
        {
            for dtype in [DType::Float32, DType::Float64] {
                let x = make(dtype, &shape, 1);
                let nd = shape.len();
                let (h, w) = (shape[nd - 2], shape[nd - 1]);
                let [ho, wo] = out_hw;
                let planes: usize = shape[..nd - 2].iter().product();
                let mut oshape = shape.clone();
                oshape[nd - 2] = ho;
                oshape[nd - 1] = wo;
                let gy = make(dtype, &oshape, 2);
                let mut ey = vec![0.0; planes * ho * wo];
                let mut eg = vec![0.0; x.numel()];
                for pl in 0..planes {
                    for oh in 0..ho {
                        for ow in 0..wo {
                            let (h0, h1) = (oh * h / ho, ((oh + 1) * h).div_ceil(ho));
                            let (w0, w1) = (ow * w / wo, ((ow + 1) * w).div_ceil(wo));
                            let n = ((h1 - h0) * (w1 - w0)) as f64;
                            let o = pl * ho * wo + oh * wo + ow;
                            for ih in h0..h1 {
                                for iw in w0..w1 {
                                    let i = pl * h * w + ih * w + iw;
                                    ey[o] += x.data[i] / n;
                                    eg[i] += gy.data[o] / n;
                                }
                            }
                        }
                    }
                }
                let xd = sim.place(&x, Layout::Strided);
                let out = sim.empty(dtype, &oshape, Layout::Contiguous);
                sim.call(
                    "_adaptive_avg_pool2d",
                    vec![t(&xd), ints(&[ho as i64, wo as i64])],
                    vec![out.arg.clone()],
                )
                .unwrap();
                let what = format!("adaptive {shape:?} {dtype:?}");
                close(&sim.read(&out), &ey, &what);
                let gx = sim.empty(dtype, &shape, Layout::Contiguous);
                sim.call(
                    "_adaptive_avg_pool2d_backward",
                    vec![t(&sim.place(&gy, Layout::Transposed)), t(&xd)],
                    vec![gx.arg.clone()],
                )
                .unwrap();
                close(&sim.read(&gx), &eg, &format!("{what} backward"));
            }
        }
    }
}

// ------------------------------------------------------------ matrix products

fn bmm_ref(a: &HTensor, b: &HTensor) -> Vec<f64> {
    let (bs, m, k, n) = (a.shape[0], a.shape[1], a.shape[2], b.shape[2]);
    let mut c = vec![0.0; bs * m * n];
    for p in 0..bs {
        for i in 0..m {
            for j in 0..n {
                c[(p * m + i) * n + j] =
                    (0..k).map(|q| a.data[(p * m + i) * k + q] * b.data[(p * k + q) * n + j]).sum();
            }
        }
    }
    c
}

#[test]
fn addmm_bmm_baddbmm() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in FLOATS {
            for (m, k, n) in [(5, 7, 3), (33, 64, 17), (4, 0, 3)] {
                for (la, lb) in
                    [(Layout::Contiguous, Layout::Contiguous), (Layout::Transposed, Layout::Strided)]
                {
                    // addmm with a row-vector bias, beta 0.5, alpha 2.
                    let a = make(dtype, &[1, m, k], 1);
                    let b = make(dtype, &[1, k, n], 2);
                    let bias = make(dtype, &[n], 3);
                    let prod = bmm_ref(&a, &b);
                    let exp: Vec<f64> = (0..m * n).map(|i| 0.5 * bias.data[i % n] + 2.0 * prod[i]).collect();
                    let a2 = HTensor { shape: vec![m, k], ..a.clone() };
                    let b2 = HTensor { shape: vec![k, n], ..b.clone() };
                    let out = sim.empty(dtype, &[m, n], Layout::Contiguous);
                    sim.call(
                        "addmm",
                        vec![
                            t(&sim.place(&bias, Layout::Strided)),
                            t(&sim.place(&a2, la)),
                            t(&sim.place(&b2, lb)),
                            scalar_f(0.5),
                            scalar_i(2),
                        ],
                        vec![out.arg.clone()],
                    )
                    .unwrap();
                    close(&sim.read(&out), &exp, &format!("addmm {dtype:?} {m}x{k}x{n} {la:?}"));
                    // bmm and baddbmm over 3 batches.
                    let a = make(dtype, &[3, m, k], 4);
                    let b = make(dtype, &[3, k, n], 5);
                    let prod = bmm_ref(&a, &b);
                    let out = sim.empty(dtype, &[3, m, n], Layout::Transposed);
                    let (ad, bd) = (sim.place(&a, la), sim.place(&b, lb));
                    sim.call("bmm", vec![t(&ad), t(&bd)], vec![out.arg.clone()]).unwrap();
                    close(&sim.read(&out), &prod, &format!("bmm {dtype:?} {m}x{k}x{n}"));
                    let c = make(dtype, &[1, m, n], 6);
                    let exp: Vec<f64> =
                        prod.iter().enumerate().map(|(i, p)| 0.5 * p - c.data[i % (m * n)]).collect();
                    sim.call(
                        "baddbmm",
                        vec![
                            t(&sim.place(&c, Layout::Contiguous)),
                            t(&ad),
                            t(&bd),
                            scalar_i(-1),
                            scalar_f(0.5),
                        ],
                        vec![out.arg.clone()],
                    )
                    .unwrap();
                    close(&sim.read(&out), &exp, &format!("baddbmm {dtype:?} {m}x{k}x{n}"));
                }
            }
        }
        // beta = 0 ignores NaN in self; in-place addmm_ (output is self).
        let a = make(DType::Float32, &[2, 3], 1);
        let b = make(DType::Float32, &[3, 2], 2);
        let prod = bmm_ref(
            &HTensor { shape: vec![1, 2, 3], ..a.clone() },
            &HTensor { shape: vec![1, 3, 2], ..b.clone() },
        );
        let nan = sim.place(&HTensor::new(DType::Float32, &[2, 2], |_| f64::NAN), Layout::Contiguous);
        let (ad, bd) = (sim.place(&a, Layout::Contiguous), sim.place(&b, Layout::Contiguous));
        sim.call("addmm", vec![t(&nan), t(&ad), t(&bd), scalar_i(0), scalar_i(1)], vec![nan.arg.clone()])
            .unwrap();
        close(&sim.read(&nan), &prod, "addmm beta=0");
        sim.call("addmm", vec![t(&nan), t(&ad), t(&bd), scalar_i(1), scalar_i(1)], vec![nan.arg.clone()])
            .unwrap();
        close(&sim.read(&nan), &prod.iter().map(|p| 2.0 * p).collect::<Vec<_>>(), "addmm_ in place");
        // The output may be an operand (staged, operands copied first).
        let sq = make(DType::Float32, &[3, 3], 7);
        let sq3 = HTensor { shape: vec![1, 3, 3], ..sq.clone() };
        let exp: Vec<f64> = bmm_ref(&sq3, &sq3).iter().map(|p| 3.0 * p).collect();
        let sd = sim.place(&sq, Layout::Transposed);
        let zero = sim.empty(DType::Float32, &[3], Layout::Contiguous);
        sim.call("addmm", vec![t(&zero), t(&sd), t(&sd), scalar_i(1), scalar_i(3)], vec![sd.arg.clone()])
            .unwrap();
        close(&sim.read(&sd), &exp, "addmm into an operand");
        // Errors.
        let e = sim.call("bmm", vec![t(&ad), t(&bd)], vec![nan.arg.clone()]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        let ai = sim.place(&make(DType::Int64, &[1, 2, 3], 1), Layout::Contiguous);
        let bi = sim.place(&make(DType::Int64, &[1, 3, 2], 1), Layout::Contiguous);
        let oi = sim.empty(DType::Int64, &[1, 2, 2], Layout::Contiguous);
        let e = sim.call("bmm", vec![t(&ai), t(&bi)], vec![oi.arg]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unimplemented);
        let e = sim.call("addmm", vec![t(&nan), t(&ad), t(&ad)], vec![nan.arg.clone()]).unwrap_err();
        assert!(e.message().contains("cannot be multiplied"), "{}", e.message());
    }
}

// --------------------------------------------------------- threshold_backward

#[test]
fn threshold_backward_matches_reference() {
    for mode in MODES {
        let sim = Sim::new(mode);
        for dtype in FLOATS.iter().copied().chain([DType::Int32]) {
            for (shape, layout) in [(vec![4, 5], Layout::Contiguous), (vec![3, 300, 70], Layout::Transposed)]
            {
                let g = make(dtype, &shape, 1);
                let x = HTensor::new(dtype, &shape, |i| ((i % 5) as f64) - 2.0);
                let exp: Vec<f64> =
                    g.data.iter().zip(&x.data).map(|(&g, &x)| if x <= 1.0 { 0.0 } else { g }).collect();
                let out = sim.empty(dtype, &shape, Layout::Contiguous);
                sim.call(
                    "threshold_backward",
                    vec![t(&sim.place(&g, layout)), t(&sim.place(&x, Layout::Strided)), scalar_i(1)],
                    vec![out.arg.clone()],
                )
                .unwrap();
                assert_close(&sim.read(&out), &exp, &format!("threshold_backward {dtype:?} {shape:?}"));
            }
        }
        let g = sim.place(&make(DType::Float32, &[2, 3], 1), Layout::Contiguous);
        let x = sim.place(&make(DType::Float32, &[3, 2], 1), Layout::Contiguous);
        let out = sim.empty(DType::Float32, &[2, 3], Layout::Contiguous);
        let e = sim.call("threshold_backward", vec![t(&g), t(&x), scalar_i(0)], vec![out.arg]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
    }
}

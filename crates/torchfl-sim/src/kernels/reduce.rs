//! The reduction engine: sums (and means) over any set of dimensions.
//!
//! Floating outputs accumulate in `f64` and integral or bool outputs in
//! wrapping `i64`, so results match PyTorch within float tolerance (they are
//! usually more accurate, as PyTorch accumulates `float` in `float`).
//! Contiguous runs are summed over slices with eight independent
//! accumulators, which LLVM vectorises without needing to reassociate.
//!
//! Parallelism: many outputs are computed in parallel chunks of outputs; a
//! few outputs with long reductions split each reduction into fixed
//! [`GRAIN`]-sized partial sums that are combined *in order*, so results do
//! not depend on thread scheduling.

use rayon::prelude::*;

use super::elementwise::{chunks, par_ranges, store, Plan, GRAIN, MAX_OPS, PAR_MIN};
use super::view::TensorView;
use crate::dtype::{cast, with_storage, Arith, DType};
use crate::runtime::Work;

/// What to produce from the accumulated sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    Sum,
    /// Sum divided by the number of reduced elements.
    Mean,
}

/// Reduces `input` over the dimensions `d` with `reduce[d]` into `out`,
/// whose shape is the input's with those dimensions removed (or kept as
/// size 1). The caller has validated shapes and that `out` does not overlap
/// `input`.
pub(crate) fn sum(input: TensorView, out: TensorView, reduce: Vec<bool>, finish: Finish) -> Work {
    Work::new(move || {
        if out.dtype().is_floating() || finish == Finish::Mean {
            run::<f64>(&input, &out, &reduce, finish);
        } else {
            run::<i64>(&input, &out, &reduce, finish);
        }
        Ok(())
    })
}

/// Sums `len` elements of `dtype` at `addr` every `stride` bytes into `Acc`.
///
/// # Safety
/// All addresses must be readable elements of `dtype`, aligned.
unsafe fn sum_run<Acc: Arith>(dtype: DType, addr: usize, stride: isize, len: usize) -> Acc {
    with_storage!(dtype, T => {
        if stride == std::mem::size_of::<T>() as isize {
            // SAFETY: `len` contiguous aligned elements (caller contract).
            let s = unsafe { std::slice::from_raw_parts(addr as *const T, len) };
            let mut lanes = [Acc::ZERO; 8];
            let exact = s.chunks_exact(8);
            let rest = exact.remainder();
            for c in exact {
                for (lane, &x) in lanes.iter_mut().zip(c) {
                    *lane = lane.add(cast::<T, Acc>(x));
                }
            }
            let mut acc = Acc::ZERO;
            for l in lanes {
                acc = acc.add(l);
            }
            for &x in rest {
                acc = acc.add(cast::<T, Acc>(x));
            }
            acc
        } else {
            let mut acc = Acc::ZERO;
            for j in 0..len {
                let p = addr.wrapping_add_signed(stride * j as isize) as *const T;
                // SAFETY: readable per the caller's contract.
                acc = acc.add(cast::<T, Acc>(unsafe { p.read() }));
            }
            acc
        }
    })
}

fn run<Acc: Arith>(input: &TensorView, out: &TensorView, reduce: &[bool], finish: Finish) {
    let nd = input.ndim();
    let keepdim = out.ndim() == nd;
    let (mut kept_shape, mut in_kept, mut out_kept) = (Vec::new(), Vec::new(), Vec::new());
    let (mut red_shape, mut in_red) = (Vec::new(), Vec::new());
    let mut out_dim = 0;
    for (d, &reduced) in reduce.iter().enumerate().take(nd) {
        if reduced {
            red_shape.push(input.shape()[d]);
            in_red.push(input.strides()[d]);
            if keepdim {
                out_dim += 1;
            }
        } else {
            kept_shape.push(input.shape()[d]);
            in_kept.push(input.strides()[d]);
            out_kept.push(out.strides()[out_dim]);
            out_dim += 1;
        }
    }
    let nout: usize = kept_shape.iter().product();
    let nred: usize = red_shape.iter().product();
    if nout == 0 {
        return;
    }
    let in_item = input.itemsize();
    let red_plan = Plan::new(&red_shape, &[(input.addr(), &in_red, in_item)], true);
    let kept_plan = Plan::new(
        &kept_shape,
        &[(out.addr(), &out_kept, out.itemsize()), (input.addr(), &in_kept, in_item)],
        true,
    );
    let in_dtype = input.dtype();
    let reduce_range = |offset: isize, range: std::ops::Range<usize>| -> Acc {
        let mut acc = Acc::ZERO;
        red_plan.for_each_run(range, [offset, 0, 0], |p, s, len| {
            // SAFETY: run addresses lie inside the validated input view.
            acc = acc.add(unsafe { sum_run::<Acc>(in_dtype, p[0], s[0], len) });
        });
        acc
    };
    let out_dtype = out.dtype();
    let write = |addr: usize, acc: Acc| {
        // SAFETY: `addr` is an element of the validated output, written by
        // exactly one task (outputs do not overlap themselves or the input).
        unsafe {
            match finish {
                Finish::Sum => store(out_dtype, addr, 0, &[acc]),
                Finish::Mean => store(out_dtype, addr, 0, &[acc.to_f64() / nred as f64]),
            }
        }
    };
    let base = input.addr() as isize;
    let offset_of = |p: usize| p as isize - base;
    if nout < 16 && nred >= PAR_MIN {
        // Few long reductions: split each one, combine partials in order.
        kept_plan.for_each_run(0..nout, [0; MAX_OPS], |p, s, len| {
            for j in 0..len {
                let off = offset_of(p[1].wrapping_add_signed(j as isize * s[1]));
                let partials: Vec<Acc> = chunks(nred, GRAIN).map(|r| reduce_range(off, r)).collect();
                let acc = partials.into_iter().fold(Acc::ZERO, Acc::add);
                write(p[0].wrapping_add_signed(j as isize * s[0]), acc);
            }
        });
        return;
    }
    let per_output = |range: std::ops::Range<usize>| {
        kept_plan.for_each_run(range, [0; MAX_OPS], |p, s, len| {
            for j in 0..len {
                let off = offset_of(p[1].wrapping_add_signed(j as isize * s[1]));
                let acc = reduce_range(off, 0..nred);
                write(p[0].wrapping_add_signed(j as isize * s[0]), acc);
            }
        });
    };
    if nout.saturating_mul(nred.max(1)) >= PAR_MIN && out.is_non_overlapping() {
        let grain = (GRAIN / nred.max(1)).max(1);
        par_ranges(nout, grain, &per_output);
    } else {
        per_output(0..nout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_sum_matches_naive() {
        let data: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.37).sin()).collect();
        // SAFETY: a live, aligned slice.
        let s: f64 = unsafe { sum_run::<f64>(DType::Float32, data.as_ptr() as usize, 4, data.len()) };
        let naive: f64 = data.iter().map(|&x| x as f64).sum();
        assert!((s - naive).abs() < 1e-9);
        // SAFETY: as above, every other element.
        let s: f64 = unsafe { sum_run::<f64>(DType::Float32, data.as_ptr() as usize, 8, 501) };
        let naive: f64 = data.iter().step_by(2).take(501).map(|&x| x as f64).sum();
        assert!((s - naive).abs() < 1e-9);
    }
}

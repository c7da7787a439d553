//! `_fused_adam_` and `_fused_adamw_` (with a float or a tensor learning
//! rate): the kernels behind `torch.optim.Adam/AdamW(..., fused=True)`,
//! which PyTorch allows on PrivateUse1 devices
//! (`torch.utils._foreach_utils._get_fused_kernels_supported_devices`).
//!
//! One update per element in one pass over parameter, gradient and
//! moments, with PyTorch's CPU kernel's arithmetic
//! (`aten/src/ATen/native/cpu/FusedAdamKernel.cpp`): in the parameter's
//! math type (`f64` for double, `f32` otherwise), bias corrections in
//! `double` from the step (read from the device `state_steps` tensor when
//! the work runs), the first moment as `lerp(m, g, 1 - beta1)` and the
//! weight decay either added to the gradient (Adam) or applied to the
//! parameter (AdamW). With a `grad_scale` the gradient is unscaled (and
//! stored back, as PyTorch does); with a `found_inf` holding 1 the step is
//! skipped. Tensors of every list must share one dense layout (the
//! optimizer's own state always does); others fall back to the CPU.
//! The lists' elements are split into chunks that run in parallel.

use rayon::prelude::*;

use super::elementwise::{load, GRAIN};
use super::real::Real;
use super::view::TensorView;
use super::{ArgRef, Frame, KernelCtx, TensorRef};
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::Work;

/// One parameter's tensors.
#[derive(Debug, Clone)]
struct Group {
    param: TensorView,
    grad: TensorView,
    exp_avg: TensorView,
    exp_avg_sq: TensorView,
    max_exp_avg_sq: Option<TensorView>,
    step: TensorView,
}

/// Hyperparameters of a call.
#[derive(Debug, Clone, Copy)]
struct Hyper {
    beta1: f64,
    beta2: f64,
    weight_decay: f64,
    eps: f64,
    amsgrad: bool,
    maximize: bool,
    adamw: bool,
}

/// The learning rate: a number, or a one-element tensor read when the
/// work runs.
#[derive(Debug, Clone)]
enum Lr {
    Value(f64),
    Tensor(TensorView),
}

fn list<'a>(
    ctx: &KernelCtx<'_>,
    call: &'a Frame<'a>,
    i: usize,
    name: &str,
) -> Result<&'a [Option<TensorRef<'a>>]> {
    match call.args.get(i) {
        Some(ArgRef::TensorList(l)) => Ok(l),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a tensor list"))),
    }
}

fn float(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<f64> {
    match call.args.get(i) {
        Some(ArgRef::Float(v)) => Ok(*v),
        Some(ArgRef::Int(v)) => Ok(*v as f64),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a float"))),
    }
}

fn flag(ctx: &KernelCtx<'_>, call: &Frame<'_>, i: usize, name: &str) -> Result<bool> {
    match call.args.get(i) {
        Some(ArgRef::Bool(v)) => Ok(*v),
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a bool"))),
    }
}

/// An optional one-element float32 device tensor argument.
fn opt_scalar_tensor(
    ctx: &KernelCtx<'_>,
    call: &Frame<'_>,
    i: usize,
    name: &str,
) -> Result<Option<TensorView>> {
    match call.args.get(i) {
        None | Some(ArgRef::None) => Ok(None),
        Some(ArgRef::Tensor(t)) => {
            let v = ctx.device_view(t, name)?;
            if v.numel() != 1 || v.dtype() != DType::Float32 {
                return Err(ctx.invalid(format!("{name} must be a one-element float32 tensor")));
            }
            Ok(Some(v))
        }
        _ => Err(ctx.invalid(format!("argument {i} ({name}) must be a tensor or None"))),
    }
}

/// The single element of a one-element tensor, as `f64` (stream work only).
fn read_one(v: &TensorView) -> f64 {
    let mut buf = [0f64];
    // SAFETY: a validated view with one element at `addr`, aligned.
    unsafe { load(v.dtype(), v.addr(), 0, &mut buf) };
    buf[0]
}

/// Adam or AdamW on one dense chunk: slices of parameter, gradient and
/// moments in storage type `T`, computing in `C`.
#[allow(clippy::too_many_arguments)]
fn update<T: crate::dtype::Element, C: Real>(
    p: &mut [T],
    g: &mut [T],
    m: &mut [T],
    v: &mut [T],
    vmax: Option<&mut [T]>,
    h: &Hyper,
    lr: f64,
    step: f64,
    grad_scale: Option<f32>,
) {
    let bias1 = 1.0 - h.beta1.powf(step);
    let bias2_sqrt = (1.0 - h.beta2.powf(step)).sqrt();
    let step_size = C::of(-(lr / bias1));
    let w = C::of(1.0 - h.beta1);
    let (small, coeff) = if w.abs() < C::of(0.5) { (true, w) } else { (false, w - C::of(1.0)) };
    let (beta2, sq_coeff) = (C::of(h.beta2), C::of(1.0 - h.beta2));
    let (bc2, eps) = (C::of(bias2_sqrt), C::of(h.eps));
    let (decay, shrink) = (C::of(h.weight_decay), C::of(1.0 - lr * h.weight_decay));
    let scale = grad_scale.map(|s| C::of(f64::from(s)));
    let mut vmax = vmax;
    for i in 0..p.len() {
        let mut param: C = crate::dtype::cast(p[i]);
        let mut grad: C = crate::dtype::cast(g[i]);
        if let Some(s) = scale {
            grad = grad / s;
            g[i] = crate::dtype::cast(grad);
        }
        if h.maximize {
            grad = -grad;
        }
        if h.weight_decay != 0.0 {
            if h.adamw {
                param *= shrink;
            } else {
                grad += param * decay;
            }
        }
        let mi: C = crate::dtype::cast(m[i]);
        let mi = if small { mi + coeff * (grad - mi) } else { grad + coeff * (grad - mi) };
        let vi: C = crate::dtype::cast(v[i]);
        let vi = vi * beta2 + sq_coeff * grad * grad;
        m[i] = crate::dtype::cast(mi);
        v[i] = crate::dtype::cast(vi);
        let second = match vmax.as_deref_mut() {
            Some(vm) => {
                let cur: C = crate::dtype::cast(vm[i]);
                // `maximum`: NaN when either is NaN.
                let top = if vi.is_nan() || (!cur.is_nan() && vi > cur) { vi } else { cur };
                vm[i] = crate::dtype::cast(top);
                top
            }
            None => vi,
        };
        let denom = second.sqrt() / bc2 + eps;
        p[i] = crate::dtype::cast(param + step_size * mi / denom);
    }
}

/// A slice of `len` elements of `v` from element `start` (dense views).
///
/// # Safety
/// `v` must be dense (non-overlapping and dense, laid out like the
/// parameter), `start + len` within it, and no other live reference may
/// access those elements.
#[allow(clippy::mut_from_ref)]
unsafe fn chunk<T>(v: &TensorView, start: usize, len: usize) -> &mut [T] {
    // SAFETY: caller contract; a dense view's elements are the `numel`
    // elements from its lowest address, which for the same strides as the
    // parameter map element k to element k of every other tensor.
    unsafe { std::slice::from_raw_parts_mut((lowest(v) as *mut T).add(start), len) }
}

/// The lowest element address of a dense view.
fn lowest(v: &TensorView) -> usize {
    v.byte_range().map_or(v.addr(), |(lo, _)| lo)
}

fn run<T: crate::dtype::Element, C: Real>(groups: &[Group], h: Hyper, lr: &Lr, scale: &Option<TensorView>) {
    let lr = match lr {
        Lr::Value(v) => *v,
        Lr::Tensor(t) => read_one(t),
    };
    let grad_scale = scale.as_ref().map(|s| read_one(s) as f32);
    let steps: Vec<f64> = groups.iter().map(|g| read_one(&g.step)).collect();
    let tasks: Vec<(usize, usize, usize)> = groups
        .iter()
        .enumerate()
        .flat_map(|(k, g)| {
            let n = g.param.numel();
            (0..n.div_ceil(GRAIN)).map(move |c| (k, c * GRAIN, GRAIN.min(n - c * GRAIN)))
        })
        .collect();
    tasks.into_par_iter().for_each(|(k, start, len)| {
        let g = &groups[k];
        // SAFETY: every tensor of the group is dense with the parameter's
        // strides and distinct from the others (checked at launch); tasks
        // cover disjoint element ranges.
        unsafe {
            update::<T, C>(
                chunk(&g.param, start, len),
                chunk(&g.grad, start, len),
                chunk(&g.exp_avg, start, len),
                chunk(&g.exp_avg_sq, start, len),
                g.max_exp_avg_sq.as_ref().map(|t| chunk(t, start, len)),
                &h,
                lr,
                steps[k],
                grad_scale,
            )
        };
    });
}

/// Checks one parameter's tensors: the call's floating dtype, one step,
/// one dense layout shared by all, and no shared memory.
fn check_group(ctx: &KernelCtx<'_>, group: &Group, dtype: DType) -> Result<()> {
    if group.param.dtype() != dtype {
        return Err(ctx.invalid(format!("all params must have dtype {dtype}, got {}", group.param.dtype())));
    }
    if !dtype.is_floating() {
        return Err(ctx.invalid(format!("params must be floating point, got {dtype}")));
    }
    if group.step.numel() != 1 {
        return Err(ctx.invalid("each state_steps entry must be a one-element tensor"));
    }
    let mut state = vec![&group.grad, &group.exp_avg, &group.exp_avg_sq];
    state.extend(group.max_exp_avg_sq.as_ref());
    let dense = group.param.is_non_overlapping_and_dense()
        && state.iter().all(|t| {
            t.dtype() == dtype && t.shape() == group.param.shape() && t.strides() == group.param.strides()
        });
    if !dense {
        return Err(ctx.unimplemented(
            "the kernel needs every tensor of a parameter in the parameter's dtype and dense layout",
        ));
    }
    let mut all = vec![&group.param];
    all.extend(state.iter().copied());
    for (i, a) in all.iter().enumerate() {
        if all[i + 1..].iter().any(|b| !super::view::disjoint(a, b)) {
            return Err(ctx.invalid("a parameter, its gradient and its moments must not share memory"));
        }
    }
    Ok(())
}

fn fused_adam_impl(ctx: &KernelCtx<'_>, call: &Frame<'_>, adamw: bool) -> Result<Option<Work>> {
    if call.args.len() < 13 || call.args.len() > 15 {
        return Err(ctx.invalid(format!("expected 13 to 15 arguments, got {}", call.args.len())));
    }
    let names = ["self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps"];
    let lists: Vec<_> =
        names.iter().enumerate().map(|(i, n)| list(ctx, call, i, n)).collect::<Result<_>>()?;
    let lr = match call.args.get(6) {
        Some(ArgRef::Tensor(t)) => match ctx.operand(t, "lr")? {
            super::Operand::View(v) if v.numel() == 1 => Lr::Tensor(v),
            super::Operand::Host(_, s, _) => Lr::Value(s.as_f64()),
            _ => return Err(ctx.invalid("lr must be a one-element tensor")),
        },
        _ => Lr::Value(float(ctx, call, 6, "lr")?),
    };
    let h = Hyper {
        beta1: float(ctx, call, 7, "beta1")?,
        beta2: float(ctx, call, 8, "beta2")?,
        weight_decay: float(ctx, call, 9, "weight_decay")?,
        eps: float(ctx, call, 10, "eps")?,
        amsgrad: flag(ctx, call, 11, "amsgrad")?,
        maximize: flag(ctx, call, 12, "maximize")?,
        adamw,
    };
    let grad_scale = opt_scalar_tensor(ctx, call, 13, "grad_scale")?;
    let found_inf = opt_scalar_tensor(ctx, call, 14, "found_inf")?;
    let n = lists[0].len();
    for (l, name) in lists.iter().zip(names) {
        let expected = if name == "max_exp_avg_sqs" && !h.amsgrad { l.len() } else { n };
        if l.len() != expected {
            return Err(ctx.invalid(format!("{name} must have {n} tensors, got {}", l.len())));
        }
    }
    let mut groups = Vec::with_capacity(n);
    let mut dtype = None;
    #[allow(clippy::needless_range_loop)] // k indexes six lists at once
    for k in 0..n {
        let get = |l: usize, role: &str, written: bool| -> Result<TensorView> {
            let t = lists[l][k].as_ref().ok_or_else(|| ctx.invalid(format!("{role}[{k}] is None")))?;
            if written {
                ctx.written(t, role)
            } else {
                ctx.device_view(t, role)
            }
        };
        let param = get(0, "self", true)?;
        let group = Group {
            grad: get(1, "grads", true)?,
            exp_avg: get(2, "exp_avgs", true)?,
            exp_avg_sq: get(3, "exp_avg_sqs", true)?,
            max_exp_avg_sq: if h.amsgrad { Some(get(4, "max_exp_avg_sqs", true)?) } else { None },
            step: get(5, "state_steps", false)?,
            param,
        };
        let d = *dtype.get_or_insert(group.param.dtype());
        check_group(ctx, &group, d)?;
        groups.push(group);
    }
    let Some(dtype) = dtype else { return Ok(None) };
    Ok(Some(Work::new(move || {
        if found_inf.as_ref().is_some_and(|f| read_one(f) == 1.0) {
            return Ok(());
        }
        if dtype == DType::Float64 {
            run::<f64, f64>(&groups, h, &lr, &grad_scale);
        } else {
            crate::dtype::with_storage!(dtype, T => run::<T, f32>(&groups, h, &lr, &grad_scale));
        }
        Ok(())
    })))
}

/// `_fused_adam_(Tensor(a!)[] self, Tensor(b!)[] grads, Tensor(c!)[]
/// exp_avgs, Tensor(d!)[] exp_avg_sqs, Tensor(e!)[] max_exp_avg_sqs,
/// Tensor[] state_steps, *, float lr, float beta1, float beta2, float
/// weight_decay, float eps, bool amsgrad, bool maximize, Tensor?
/// grad_scale=None, Tensor? found_inf=None) -> ()` (and `.tensor_lr`).
pub(crate) fn fused_adam(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    fused_adam_impl(ctx, call, false)
}

/// `_fused_adamw_(...)`: as [`fused_adam`] with decoupled weight decay
/// (and `.tensor_lr`).
pub(crate) fn fused_adamw(ctx: &KernelCtx<'_>, call: &Frame<'_>) -> Result<Option<Work>> {
    fused_adam_impl(ctx, call, true)
}

//! 2-D pooling (`pool.cl`): max pooling with indices, average and
//! adaptive average pooling, and their backwards, one work item per output
//! element forward and per input element backward (a gather in the CPU
//! kernel's order, so no float atomics and results match the CPU's).

use super::{compute_type, enqueue, type_options, work_items, Args, Elem, Launch, View};
use crate::error::{Error, Result};
use crate::runtime::Runtime;

const SOURCE: &str = concat!(include_str!("common.cl"), include_str!("pool.cl"));

/// A fixed pooling window: kernel size, stride, padding and dilation,
/// each (height, width), checked positive (padding non-negative) and
/// within `i32`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    /// Kernel size.
    pub(crate) kernel: [i32; 2],
    /// Stride.
    pub(crate) stride: [i32; 2],
    /// Padding.
    pub(crate) padding: [i32; 2],
    /// Dilation (1 for average pooling).
    pub(crate) dilation: [i32; 2],
}

/// How an average pooling picks its windows and divisors.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Avg {
    /// `avg_pool2d`: fixed windows; `divisor` overrides the window's size
    /// when given (nonzero).
    Fixed { window: Window, count_include_pad: bool, divisor: Option<i32> },
    /// `_adaptive_avg_pool2d`: PyTorch's floor/ceil windows.
    Adaptive,
}

/// pool.cl's `AvgArgs`, passed as its nine `int` fields in order.
#[derive(Debug, Clone, Copy)]
struct AvgArgs {
    kh: i32,
    kw: i32,
    sh: i32,
    sw: i32,
    ph: i32,
    pw: i32,
    adaptive: i32,
    count_include_pad: i32,
    divisor: i32,
}

impl AvgArgs {
    fn of(avg: Avg) -> Self {
        match avg {
            Avg::Fixed { window: w, count_include_pad, divisor } => AvgArgs {
                kh: w.kernel[0],
                kw: w.kernel[1],
                sh: w.stride[0],
                sw: w.stride[1],
                ph: w.padding[0],
                pw: w.padding[1],
                adaptive: 0,
                count_include_pad: i32::from(count_include_pad),
                divisor: divisor.unwrap_or(0),
            },
            Avg::Adaptive => AvgArgs {
                kh: 1,
                kw: 1,
                sh: 1,
                sw: 1,
                ph: 0,
                pw: 0,
                adaptive: 1,
                count_include_pad: 0,
                divisor: 0,
            },
        }
    }

    fn push(&self, args: &mut Args) {
        let a = self;
        for v in [a.kh, a.kw, a.sh, a.sw, a.ph, a.pw, a.adaptive, a.count_include_pad, a.divisor] {
            args.int(v);
        }
    }
}

/// A 3-D (C, H, W) or 4-D (N, C, H, W) tensor's sizes and strides as 4-D
/// (a 3-D one gets N = 1).
struct Planar {
    shape: [i64; 4],
    strides: [i64; 4],
}

impl Planar {
    /// `view` as 4-D: UNIMPLEMENTED unless it has 3 or 4 dimensions (the
    /// callers check that first).
    fn of(op: &str, view: &View<'_>) -> Result<Self> {
        match (view.shape, view.strides) {
            ([c, h, w], [sc, sh, sw]) => Ok(Planar { shape: [1, *c, *h, *w], strides: [0, *sc, *sh, *sw] }),
            ([n, c, h, w], [sn, sc, sh, sw]) => {
                Ok(Planar { shape: [*n, *c, *h, *w], strides: [*sn, *sc, *sh, *sw] })
            }
            _ => Err(Error::unimplemented(format!(
                "opencl: {op}: pooling takes 3-D or 4-D tensors, not {:?}",
                view.shape
            ))),
        }
    }

    /// The 4-D view of `view`'s memory.
    fn view<'s>(&'s self, view: &View<'_>) -> View<'s> {
        View { addr: view.addr, elem: view.elem, shape: &self.shape, strides: &self.strides }
    }
}

/// Pushes `view` as a 4-D tensor argument.
fn planar(args: &mut Args, l: &Launch<'_>, what: &str, view: &View<'_>) -> Result<()> {
    let p = Planar::of(l.op, view)?;
    args.tensor(l, what, &p.view(view))?;
    Ok(())
}

/// The build options for element type `elem`: float32 and float16
/// (computed in float) only.
fn options(rt: &Runtime, device: usize, op: &str, elem: Elem) -> Result<String> {
    if !elem.is_float() {
        return Err(Error::unimplemented(format!(
            "opencl: {op}: no pooling kernel for {} tensors",
            elem.c_name()
        )));
    }
    type_options(rt, device, op, &[("T", elem)], compute_type(elem))
}

fn window_args(args: &mut Args, w: &Window) {
    for v in [w.kernel, w.stride, w.padding, w.dilation] {
        args.int(v[0]).int(v[1]);
    }
}

/// `max_pool2d_with_indices`: `out` and `indices` (int64) from `x`, all
/// 3-D or 4-D with the same leading dimensions (checked by the caller).
pub(crate) fn max_pool2d(
    l: &Launch<'_>,
    x: &View<'_>,
    out: &View<'_>,
    indices: &View<'_>,
    w: &Window,
) -> Result<()> {
    let Launch { rt, stream, op, .. } = *l;
    let device = stream.device;
    let options = options(rt, device, op, x.elem)?;
    let mut args = Args::new();
    planar(&mut args, l, "self", x)?;
    planar(&mut args, l, "the output", out)?;
    planar(&mut args, l, "the indices", indices)?;
    window_args(&mut args, w);
    enqueue(l, (SOURCE, "max_pool2d_forward"), options, &args, &[work_items(out.shape)], None)
}

/// `max_pool2d_with_indices_backward`: `grad_input` from `grad_output`
/// and the forward's `indices`.
pub(crate) fn max_pool2d_backward(
    l: &Launch<'_>,
    grad_output: &View<'_>,
    indices: &View<'_>,
    grad_input: &View<'_>,
    w: &Window,
) -> Result<()> {
    let Launch { rt, stream, op, .. } = *l;
    let device = stream.device;
    let options = options(rt, device, op, grad_input.elem)?;
    let mut args = Args::new();
    planar(&mut args, l, "grad_output", grad_output)?;
    planar(&mut args, l, "indices", indices)?;
    planar(&mut args, l, "grad_input", grad_input)?;
    window_args(&mut args, w);
    let global = [work_items(grad_input.shape)];
    enqueue(l, (SOURCE, "max_pool2d_backward"), options, &args, &global, None)
}

/// `avg_pool2d` and `_adaptive_avg_pool2d`: `out` from `x`.
pub(crate) fn avg_pool2d(l: &Launch<'_>, x: &View<'_>, out: &View<'_>, avg: Avg) -> Result<()> {
    let Launch { rt, stream, op, .. } = *l;
    let device = stream.device;
    let options = options(rt, device, op, x.elem)?;
    let mut args = Args::new();
    planar(&mut args, l, "self", x)?;
    planar(&mut args, l, "the output", out)?;
    AvgArgs::of(avg).push(&mut args);
    enqueue(l, (SOURCE, "avg_pool2d_forward"), options, &args, &[work_items(out.shape)], None)
}

/// `avg_pool2d_backward` and `_adaptive_avg_pool2d_backward`:
/// `grad_input` from `grad_output`.
pub(crate) fn avg_pool2d_backward(
    l: &Launch<'_>,
    grad_output: &View<'_>,
    grad_input: &View<'_>,
    avg: Avg,
) -> Result<()> {
    let Launch { rt, stream, op, .. } = *l;
    let device = stream.device;
    let options = options(rt, device, op, grad_input.elem)?;
    let mut args = Args::new();
    planar(&mut args, l, "grad_output", grad_output)?;
    planar(&mut args, l, "grad_input", grad_input)?;
    AvgArgs::of(avg).push(&mut args);
    let global = [work_items(grad_input.shape)];
    enqueue(l, (SOURCE, "avg_pool2d_backward"), options, &args, &global, None)
}

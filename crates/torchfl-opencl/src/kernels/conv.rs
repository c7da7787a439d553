//! Convolution as direct loops (`conv.cl`): the forward pass and the
//! input, weight and bias gradients of a regular 2-D convolution, each
//! work item owning one element of what it writes. A 1-D convolution runs
//! as a 2-D one of height 1 (its 3-D tensors lifted to 4-D here), and a
//! transposed one as its regular twin (`abi::ops::conv` derives it): its
//! forward pass is the twin's input gradient, and so on.

use super::{compute_type, enqueue, type_options, work_items, Args, Launch, View};
use crate::error::{Error, Result};

const SOURCE: &str = concat!(include_str!("common.cl"), include_str!("conv.cl"));

/// Work items per group: the range is rounded up to a multiple (the
/// kernels return past the end), so the driver never falls back to tiny
/// groups for an awkward element count.
const GROUP: usize = 64;

/// The shape of one regular 2-D convolution (a 1-D one has `h == kh ==
/// ho == 1`): input `[n, cin, h, w]`, weight `[cout, cin / groups, kh,
/// kw]`, output `[n, cout, ho, wo]`, and the stride, padding and dilation
/// per spatial dimension.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConvGeom {
    pub(crate) n: i64,
    pub(crate) cin: i64,
    pub(crate) h: i64,
    pub(crate) w: i64,
    pub(crate) cout: i64,
    pub(crate) kh: i64,
    pub(crate) kw: i64,
    pub(crate) ho: i64,
    pub(crate) wo: i64,
    pub(crate) sh: i64,
    pub(crate) sw: i64,
    pub(crate) ph: i64,
    pub(crate) pw: i64,
    pub(crate) dh: i64,
    pub(crate) dw: i64,
    pub(crate) groups: i64,
}

impl ConvGeom {
    /// Pushes the geometry as conv.cl's `CONV_GEOM` parameters (`int`s:
    /// UNIMPLEMENTED past `i32::MAX`).
    fn push(&self, args: &mut Args, op: &str) -> Result<()> {
        let g = self;
        for v in [
            g.n, g.cin, g.h, g.w, g.cout, g.kh, g.kw, g.ho, g.wo, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw,
            g.groups,
        ] {
            let v = i32::try_from(v).map_err(|_| {
                Error::unimplemented(format!("opencl: {op}: a convolution size of {v} does not fit an int"))
            })?;
            args.int(v);
        }
        Ok(())
    }
}

/// Pushes `view` as a 4-D tensor: a 3-D one (a 1-D convolution's) gets a
/// height of 1 inserted at dimension 2.
fn tensor4(args: &mut Args, l: &Launch<'_>, what: &str, view: &View<'_>) -> Result<()> {
    let op = l.op;
    match (view.shape, view.strides) {
        ([n, c, w], [s0, s1, s2]) => {
            let (shape, strides) = ([*n, *c, 1, *w], [*s0, *s1, 0, *s2]);
            args.tensor(l, what, &View { shape: &shape, strides: &strides, ..*view })?;
        }
        ([_, _, _, _], [_, _, _, _]) => {
            args.tensor(l, what, view)?;
        }
        (shape, _) => {
            return Err(Error::invalid(format!(
                "opencl: {op}: {what} has shape {shape:?}, expected 3-D or 4-D"
            )))
        }
    }
    Ok(())
}

/// One convolution call: where to enqueue, what to name in messages, and
/// the geometry every kernel of the call shares.
#[derive(Debug)]
pub(crate) struct Conv<'a> {
    /// Where it runs: the runtime, programs, stream and operator.
    pub(crate) l: Launch<'a>,
    /// The (regular) convolution's shape.
    pub(crate) geom: ConvGeom,
}

impl Conv<'_> {
    fn tensor(&self, args: &mut Args, what: &str, view: &View<'_>) -> Result<()> {
        tensor4(args, &self.l, what, view)
    }

    /// Enqueues `kernel` over one work item per element of `out` (of
    /// element type float32, or float16 computed in float32), in groups of
    /// `group`; `geom`: whether the kernel takes the geometry.
    fn launch(
        &self,
        kernel: &'static str,
        args: &mut Args,
        out: &View<'_>,
        group: usize,
        geom: bool,
    ) -> Result<()> {
        if !out.elem.is_float() {
            return Err(Error::unimplemented(format!(
                "opencl: {}: convolution of {} tensors",
                self.l.op,
                out.elem.c_name()
            )));
        }
        if geom {
            self.geom.push(args, self.l.op)?;
        }
        let (rt, device) = (self.l.rt, self.l.stream.device);
        let options = type_options(rt, device, self.l.op, &[("T", out.elem)], compute_type(out.elem))?;
        let n = work_items(out.shape);
        let global = n.div_ceil(group) * group;
        enqueue(&self.l, (SOURCE, kernel), options, args, &[global], Some(&[group]))
    }

    /// `out = conv(x, w) + bias`: `out` is `[n, cout, ho, wo]`.
    pub(crate) fn forward(
        &self,
        x: &View<'_>,
        w: &View<'_>,
        bias: Option<&View<'_>>,
        out: &View<'_>,
    ) -> Result<()> {
        let mut args = Args::new();
        self.tensor(&mut args, "input", x)?;
        self.tensor(&mut args, "weight", w)?;
        args.opt_tensor(&self.l, "bias", bias)?;
        self.tensor(&mut args, "the output", out)?;
        self.launch("conv_forward", &mut args, out, GROUP, true)
    }

    /// `gx` (`[n, cin, h, w]`) = the input gradient for output gradient
    /// `gy`, plus `bias` per input channel (a transposed convolution's).
    pub(crate) fn grad_input(
        &self,
        gy: &View<'_>,
        w: &View<'_>,
        bias: Option<&View<'_>>,
        gx: &View<'_>,
    ) -> Result<()> {
        let mut args = Args::new();
        self.tensor(&mut args, "grad_output", gy)?;
        self.tensor(&mut args, "weight", w)?;
        args.opt_tensor(&self.l, "bias", bias)?;
        self.tensor(&mut args, "grad_input", gx)?;
        self.launch("conv_grad_input", &mut args, gx, GROUP, true)
    }

    /// `gw` (`[cout, cin / groups, kh, kw]`) = the weight gradient for
    /// output gradient `gy` and input `x`.
    pub(crate) fn grad_weight(&self, gy: &View<'_>, x: &View<'_>, gw: &View<'_>) -> Result<()> {
        let mut args = Args::new();
        self.tensor(&mut args, "grad_output", gy)?;
        self.tensor(&mut args, "input", x)?;
        self.tensor(&mut args, "grad_weight", gw)?;
        self.launch("conv_grad_weight", &mut args, gw, GROUP, true)
    }

    /// `gb[c]` = the sum of `gy[:, c]` (`gy` 3-D or 4-D, `gb` 1-D).
    pub(crate) fn grad_bias(&self, gy: &View<'_>, gb: &View<'_>) -> Result<()> {
        let mut args = Args::new();
        self.tensor(&mut args, "grad_output", gy)?;
        args.tensor(&self.l, "grad_bias", gb)?;
        // One work item per channel, each a long sum: groups of one spread
        // the few channels over every core.
        self.launch("conv_grad_bias", &mut args, gb, 1, false)
    }
}

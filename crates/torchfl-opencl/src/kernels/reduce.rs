//! Reductions over any set of dimensions (`reduce.cl`): sums and means
//! (`reduce_sum`), and the maximum or minimum with its index
//! (`reduce_select`), plus the work-group geometry the reducing kernels
//! share (`group.cl`; softmax and the loss use it too).
//!
//! One local row of work items owns one output element and folds its
//! reduced elements in a fixed order, combining its lanes' partial results
//! in a fixed tree: results are deterministic, and a long sum is split
//! over up to [`GROUP`] lanes, which keeps float32 sums of 10^5 elements
//! close to the CPU's.

use super::{enqueue, type_options, Args, Elem, Launch, View};
use crate::error::{Error, Result};

const SOURCE: &str = concat!(include_str!("common.cl"), include_str!("group.cl"), include_str!("reduce.cl"));

/// Work items per work group of the reducing kernels (group.cl's `GROUP`).
pub(crate) const GROUP: usize = 128;

/// How many lanes share a reduction of `n` elements: one for short
/// reductions, else a power of two up to [`GROUP`] giving each lane at
/// least eight elements.
pub(crate) fn lanes_for(n: i64) -> usize {
    if n < 64 {
        return 1;
    }
    let want = usize::try_from(n / 8).unwrap_or(GROUP).min(GROUP);
    1 << want.ilog2()
}

/// The 2-D range (global, local) of `rows` reductions of `lanes` lanes
/// each, `GROUP / lanes` rows per work group (the last one padded).
pub(crate) fn group_range(rows: i64, lanes: usize) -> ([usize; 2], [usize; 2]) {
    let per_group = GROUP / lanes;
    let rows = usize::try_from(rows).unwrap_or(0);
    ([lanes, rows.div_ceil(per_group) * per_group], [lanes, per_group])
}

/// One dimension of a reduction: its size and its stride in each operand
/// (the input's first, then each output's).
type Dim = (i64, Vec<i64>);

/// Drops size-1 dimensions and merges neighbours that every operand walks
/// as one (outer stride = inner stride * inner size), keeping row-major
/// order, so the kernels decompose fewer dimensions.
fn merge(dims: Vec<Dim>) -> Vec<Dim> {
    let mut merged: Vec<Dim> = Vec::with_capacity(dims.len());
    for (size, strides) in dims {
        if size == 1 {
            continue;
        }
        if let Some((outer, outer_strides)) = merged.last_mut() {
            if outer_strides.iter().zip(&strides).all(|(&o, &s)| o == s * size) {
                *outer *= size;
                *outer_strides = strides;
                continue;
            }
        }
        merged.push((size, strides));
    }
    merged
}

/// A reduction's operands as reduce.cl sees them: the input with its kept
/// dimensions first and its reduced ones after (each group in its original
/// order, merged), each output with the kept dimensions only.
#[derive(Debug)]
pub(crate) struct Plan {
    in_shape: Vec<i64>,
    in_strides: Vec<i64>,
    out_shape: Vec<i64>,
    out_strides: Vec<Vec<i64>>,
    /// Kept (leading) dimensions of the input's view.
    nk: usize,
    /// Output elements.
    pub(crate) nout: i64,
    /// Reduced elements per output.
    pub(crate) nred: i64,
}

impl Plan {
    /// Plans reducing `input` over the dimensions `mask` marks into
    /// `outputs`, whose shape must be the input's without them (size 1
    /// with `keepdim`): INVALID_ARGUMENT otherwise.
    pub(crate) fn new(
        name: &str,
        input: &View<'_>,
        mask: &[bool],
        keepdim: bool,
        outputs: &[&View<'_>],
    ) -> Result<Self> {
        let expected: Vec<i64> = input
            .shape
            .iter()
            .zip(mask)
            .filter_map(|(&s, &r)| match (r, keepdim) {
                (false, _) => Some(s),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
        if let Some(o) = outputs.iter().find(|o| o.shape != expected.as_slice()) {
            return Err(Error::invalid(format!(
                "opencl: {name}: an output has shape {:?} but the reduction of {:?} gives {expected:?}",
                o.shape, input.shape
            )));
        }
        let (mut kept, mut reduced) = (Vec::new(), Vec::new());
        let mut out_dim = 0;
        for (d, (&size, &stride)) in input.shape.iter().zip(input.strides).enumerate() {
            if mask.get(d).copied().unwrap_or(false) {
                reduced.push((size, vec![stride]));
                out_dim += usize::from(keepdim);
            } else {
                let strides = std::iter::once(stride)
                    .chain(outputs.iter().map(|o| o.strides.get(out_dim).copied().unwrap_or(0)))
                    .collect();
                kept.push((size, strides));
                out_dim += 1;
            }
        }
        let nout = kept.iter().map(|d| d.0).product();
        let nred = reduced.iter().map(|d| d.0).product();
        let (kept, reduced) = (merge(kept), merge(reduced));
        let out_shape: Vec<i64> = kept.iter().map(|d| d.0).collect();
        let out_strides = (0..outputs.len()).map(|i| kept.iter().map(|d| d.1[i + 1]).collect()).collect();
        let in_shape = kept.iter().chain(&reduced).map(|d| d.0).collect();
        let in_strides = kept.iter().chain(&reduced).map(|d| d.1[0]).collect();
        Ok(Plan { in_shape, in_strides, nk: out_shape.len(), out_shape, out_strides, nout, nred })
    }

    /// The input as the kernels see it.
    fn input<'p>(&'p self, input: &View<'_>) -> View<'p> {
        View { addr: input.addr, elem: input.elem, shape: &self.in_shape, strides: &self.in_strides }
    }

    /// Output `i` (of those given to [`Plan::new`]) as the kernels see it.
    fn output<'p>(&'p self, out: &View<'_>, i: usize) -> View<'p> {
        View { addr: out.addr, elem: out.elem, shape: &self.out_shape, strides: &self.out_strides[i] }
    }
}

/// `out = sum(input)` over the dimensions `mask` marks, divided by the
/// number of reduced elements when `mean`. Floating outputs accumulate in
/// float, integer ones (int64) in long; a bool input counts its trues.
pub(crate) fn sum(
    l: &Launch<'_>,
    input: &View<'_>,
    out: &View<'_>,
    (mask, keepdim): (&[bool], bool),
    mean: bool,
) -> Result<()> {
    let Launch { rt, stream, op: name, .. } = *l;
    let device = stream.device;
    if out.elem == Elem::Bool {
        return Err(Error::unimplemented(format!("opencl: {name}: a bool output")));
    }
    if mean && !out.elem.is_float() {
        return Err(Error::invalid(format!(
            "opencl: {name}: mean(): could not infer output dtype. Optional dtype must be either a floating \
             point or complex dtype. Got: {}",
            out.elem.c_name()
        )));
    }
    let plan = Plan::new(name, input, mask, keepdim, &[out])?;
    if plan.nout == 0 {
        return Ok(());
    }
    let tc = if out.elem.is_float() { Elem::F32 } else { Elem::I64 };
    let mut options = type_options(rt, device, name, &[("TX", input.elem), ("TO", out.elem)], tc)?;
    if tc.is_float() {
        options.push_str(" -DTC_FLOAT");
    }
    let divisor = if mean { plan.nred as f64 } else { 1.0 };
    let mut args = Args::new();
    args.tensor(l, "self", &plan.input(input))?
        .tensor(l, "the output", &plan.output(out, 0))?
        .int(plan.nk as i32)
        .long(plan.nout)
        .long(plan.nred)
        .float(divisor);
    let (global, local) = group_range(plan.nout, lanes_for(plan.nred));
    enqueue(l, (SOURCE, "reduce_sum"), options, &args, &global, Some(&local))
}

/// What a selection produces: the values (of the input's dtype), the
/// int64 indices, or both.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Selected<'v, 'a> {
    /// The maxima or minima.
    pub(crate) values: Option<&'v View<'a>>,
    /// Their positions: row-major over the reduced dimensions, the first
    /// on ties (the first NaN, which wins).
    pub(crate) indices: Option<&'v View<'a>>,
}

/// The maximum (`is_max`) or minimum of `input` over the dimensions `mask`
/// marks, with its index. `label` names the operator in PyTorch's messages
/// (`max`, `argmax`, ...).
pub(crate) fn select(
    l: &Launch<'_>,
    label: &str,
    input: &View<'_>,
    out: Selected<'_, '_>,
    (mask, keepdim): (&[bool], bool),
    is_max: bool,
) -> Result<()> {
    let Launch { rt, stream, op: name, .. } = *l;
    let device = stream.device;
    if let Some(v) = out.values {
        if v.elem != input.elem {
            return Err(Error::unimplemented(format!(
                "opencl: {name}: values of dtype {} from an input of dtype {}",
                v.elem.c_name(),
                input.elem.c_name()
            )));
        }
    }
    if let Some(i) = out.indices {
        if i.elem != Elem::I64 {
            return Err(Error::invalid(format!(
                "opencl: {name}: expected indices of dtype Long, got {}",
                i.elem.c_name()
            )));
        }
    }
    let outputs: Vec<&View<'_>> = out.values.iter().chain(&out.indices).copied().collect();
    let plan = Plan::new(name, input, mask, keepdim, &outputs)?;
    if plan.nred == 0 {
        let numel: i64 = input.shape.iter().product();
        return Err(Error::invalid(if numel == 0 && mask.iter().all(|&r| r) {
            format!(
                "opencl: {name}: {label}(): Expected reduction dim to be specified for input.numel() == 0. \
                 Specify the reduction dim with the 'dim' argument."
            )
        } else {
            format!("opencl: {name}: {label}(): Expected reduction dim to have non-zero size.")
        }));
    }
    if plan.nout == 0 {
        return Ok(());
    }
    let tc = if input.elem.is_float() { Elem::F32 } else { Elem::I64 };
    let mut options = type_options(rt, device, name, &[("TX", input.elem), ("TO", input.elem)], tc)?;
    if tc.is_float() {
        options.push_str(" -DTC_FLOAT");
    }
    let mut args = Args::new();
    args.tensor(l, "self", &plan.input(input))?;
    let values = out.values.map(|v| plan.output(v, 0));
    args.opt_tensor(l, "the values", values.as_ref())?;
    let indices = out.indices.map(|i| plan.output(i, outputs.len() - 1));
    args.opt_tensor(l, "the indices", indices.as_ref())?;
    args.int(plan.nk as i32).long(plan.nout).long(plan.nred).int(i32::from(is_max));
    let (global, local) = group_range(plan.nout, lanes_for(plan.nred));
    enqueue(l, (SOURCE, "reduce_select"), options, &args, &global, Some(&local))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_are_powers_of_two_within_a_group() {
        assert_eq!(lanes_for(0), 1);
        assert_eq!(lanes_for(63), 1);
        assert_eq!(lanes_for(64), 8);
        assert_eq!(lanes_for(100), 8);
        assert_eq!(lanes_for(1 << 20), GROUP);
        assert_eq!(group_range(3, 1), ([1, GROUP], [1, GROUP]));
        assert_eq!(group_range(3, GROUP), ([GROUP, 3], [GROUP, 1]));
    }

    #[test]
    fn contiguous_dimensions_merge_and_unit_ones_drop() {
        // [2, 3, 4] contiguous, one operand.
        let dims = vec![(2, vec![12]), (3, vec![4]), (1, vec![0]), (4, vec![1])];
        assert_eq!(merge(dims), vec![(24, vec![1])]);
        // A transposed pair does not merge.
        assert_eq!(merge(vec![(3, vec![1]), (4, vec![3])]), vec![(3, vec![1]), (4, vec![3])]);
        // Merging needs every operand to agree.
        assert_eq!(merge(vec![(2, vec![4, 1]), (4, vec![1, 2])]), vec![(2, vec![4, 1]), (4, vec![1, 2])]);
    }
}

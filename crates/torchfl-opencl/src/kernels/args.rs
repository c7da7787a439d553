//! Kernel arguments for the operator families beyond the elementwise ones:
//! tensors as (buffer, element offset, [`Layout`]) triples and numbers by
//! value, collected in an [`Args`] and enqueued with [`enqueue`].
//!
//! A kernel taking a tensor declares three parameters for it, in this
//! order: `__global T* x, ulong x_off, Layout x_l` (common.cl's `Layout`),
//! and indexes it as `x[x_off + ...]` through `x_l.stride`, so no tensor
//! needs to be contiguous.
//!
//! OpenCL guarantees only 1024 bytes of kernel parameters (PoCL's CPU
//! device has no more), and a `Layout` takes 144: a kernel takes about
//! five tensors that way. Per-feature vectors (weights, statistics) pass as
//! [`Args::vector`]s instead: buffer, offset and one stride, 24 bytes.

use std::ffi::c_void;

use super::{launch_range, place, Elem, Launch, Number, View, MAX_DIMS};
use crate::error::{Error, Result};
use crate::runtime::Handle;

/// A tensor's sizes and strides in elements, as common.cl's `Layout`.
/// Dimensions past `ndim` are size 1, stride 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Sizes.
    pub(crate) size: [i64; MAX_DIMS],
    /// Strides, in elements.
    pub(crate) stride: [i64; MAX_DIMS],
    /// Dimensions.
    pub(crate) ndim: i64,
    /// Elements.
    pub(crate) numel: i64,
}

impl Layout {
    /// The layout of `view`: UNIMPLEMENTED past [`MAX_DIMS`] dimensions.
    pub(crate) fn of(op: &str, what: &str, view: &View<'_>) -> Result<Self> {
        let n = view.shape.len();
        if n > MAX_DIMS {
            return Err(Error::unimplemented(format!(
                "opencl: {op}: {what} has {n} dimensions (the kernels take at most {MAX_DIMS})"
            )));
        }
        let mut l = Layout { size: [1; MAX_DIMS], stride: [0; MAX_DIMS], ndim: n as i64, numel: numel(view) };
        l.size[..n].copy_from_slice(view.shape);
        l.stride[..n].copy_from_slice(view.strides);
        Ok(l)
    }
}

/// The number of elements of `view`.
pub(crate) fn numel(view: &View<'_>) -> i64 {
    view.shape.iter().product()
}

/// Work items for one per element of `shape`: its element count, 0 for a
/// (nonsensical) negative one.
pub(crate) fn work_items(shape: &[i64]) -> usize {
    usize::try_from(shape.iter().product::<i64>()).unwrap_or(0)
}

/// One argument, held by value until the launch.
#[derive(Debug, Clone, Copy)]
enum Value {
    Mem(Handle),
    U64(u64),
    I64(i64),
    I32(i32),
    F32(f32),
    Layout(Layout),
}

/// A kernel's arguments in parameter order.
#[derive(Debug, Default)]
pub(crate) struct Args {
    values: Vec<Value>,
}

impl Args {
    /// No arguments yet.
    pub(crate) fn new() -> Self {
        Args::default()
    }

    /// A tensor as three parameters: its buffer, its first element's
    /// offset in elements, and its `Layout`. An empty tensor passes a NULL
    /// buffer (never read). Negative strides are UNIMPLEMENTED.
    pub(crate) fn tensor(&mut self, l: &Launch<'_>, what: &str, view: &View<'_>) -> Result<&mut Self> {
        let Launch { rt, stream, op, .. } = *l;
        let device = stream.device;
        let layout = Layout::of(op, what, view)?;
        let placed = place(rt, device, op, what, *view, view.shape)?;
        // `place` zeroes the strides of size-1 dimensions, which is what
        // a kernel indexing them at 0 needs anyway.
        self.values.push(Value::Mem(placed.mem));
        self.values.push(Value::U64(placed.offset));
        self.values.push(Value::Layout(layout));
        Ok(self)
    }

    /// A tensor broadcast to `out_shape` (its trailing dimensions aligned
    /// with the output's, as PyTorch broadcasts): the same three
    /// parameters, with the output's sizes and the tensor's strides (0
    /// along broadcast dimensions), so the kernel indexes it by the
    /// output's element index.
    pub(crate) fn broadcast(
        &mut self,
        l: &Launch<'_>,
        what: &str,
        view: &View<'_>,
        out_shape: &[i64],
    ) -> Result<&mut Self> {
        let Launch { rt, stream, op, .. } = *l;
        let device = stream.device;
        let n = out_shape.len();
        if n > MAX_DIMS {
            return Err(Error::unimplemented(format!(
                "opencl: {op}: {n} dimensions (the kernels take at most {MAX_DIMS})"
            )));
        }
        let placed = place(rt, device, op, what, *view, out_shape)?;
        let mut layout = Layout {
            size: [1; MAX_DIMS],
            stride: placed.strides,
            ndim: n as i64,
            numel: out_shape.iter().product(),
        };
        layout.size[..n].copy_from_slice(out_shape);
        self.values.extend([Value::Mem(placed.mem), Value::U64(placed.offset), Value::Layout(layout)]);
        Ok(self)
    }

    /// The three parameters of a tensor that is not there: a NULL buffer,
    /// offset 0 and an empty layout (the kernel must not read it).
    pub(crate) fn no_tensor(&mut self) -> &mut Self {
        let empty = Layout { size: [1; MAX_DIMS], stride: [0; MAX_DIMS], ndim: 0, numel: 0 };
        self.values.extend([Value::Mem(0), Value::U64(0), Value::Layout(empty)]);
        self
    }

    /// An optional tensor: when absent, a NULL buffer, offset 0 and an
    /// empty layout, plus (always) an `int` flag saying whether it is
    /// present, so the kernel declares four parameters for it.
    pub(crate) fn opt_tensor(
        &mut self,
        l: &Launch<'_>,
        what: &str,
        view: Option<&View<'_>>,
    ) -> Result<&mut Self> {
        match view {
            Some(v) => {
                self.tensor(l, what, v)?;
                self.values.push(Value::I32(1));
            }
            None => {
                self.no_tensor().int(0);
            }
        }
        Ok(self)
    }

    /// A tensor whose elements, in row-major order, lie one stride apart
    /// (any 1-D tensor; size-1 dimensions do not count), as three
    /// parameters: `__global T* x, ulong x_off, long x_st`, element `i` at
    /// `x[x_off + i * x_st]`. UNIMPLEMENTED for other layouts.
    pub(crate) fn vector(&mut self, l: &Launch<'_>, what: &str, view: &View<'_>) -> Result<&mut Self> {
        let Launch { rt, stream, op, .. } = *l;
        let device = stream.device;
        let stride = single_stride(view).ok_or_else(|| {
            Error::unimplemented(format!(
                "opencl: {op}: {what} (shape {:?}, strides {:?}) is not one run of equally spaced elements",
                view.shape, view.strides
            ))
        })?;
        let placed = place(rt, device, op, what, *view, view.shape)?;
        self.values.extend([Value::Mem(placed.mem), Value::U64(placed.offset), Value::I64(stride)]);
        Ok(self)
    }

    /// An optional [`Args::vector`]: when absent, a NULL buffer, offset 0
    /// and stride 0, plus (always) an `int` flag saying whether it is
    /// present, so the kernel declares four parameters for it.
    pub(crate) fn opt_vector(
        &mut self,
        l: &Launch<'_>,
        what: &str,
        view: Option<&View<'_>>,
    ) -> Result<&mut Self> {
        match view {
            Some(v) => self.vector(l, what, v)?.int(1),
            None => {
                self.values.extend([Value::Mem(0), Value::U64(0), Value::I64(0)]);
                self.int(0)
            }
        };
        Ok(self)
    }

    /// A `long` parameter.
    pub(crate) fn long(&mut self, v: i64) -> &mut Self {
        self.values.push(Value::I64(v));
        self
    }

    /// An `int` parameter.
    pub(crate) fn int(&mut self, v: i32) -> &mut Self {
        self.values.push(Value::I32(v));
        self
    }

    /// A `float` parameter (kernels compute half in float).
    pub(crate) fn float(&mut self, v: f64) -> &mut Self {
        self.values.push(Value::F32(v as f32));
        self
    }

    /// A number in compute type `tc`: a `long` for integer types, else a
    /// `float`.
    pub(crate) fn number(&mut self, tc: Elem, v: Number) -> &mut Self {
        match (tc.is_float(), v) {
            (true, Number::Int(i)) => self.float(i as f64),
            (true, Number::Float(f)) => self.float(f),
            (false, Number::Int(i)) => self.long(i),
            (false, Number::Float(f)) => self.long(f as i64),
        }
    }

    fn raw(&self) -> Vec<(usize, *const c_void)> {
        fn arg<T>(v: &T) -> (usize, *const c_void) {
            (std::mem::size_of::<T>(), (v as *const T).cast())
        }
        self.values
            .iter()
            .map(|v| match v {
                Value::Mem(m) => arg(m),
                Value::U64(x) => arg(x),
                Value::I64(x) => arg(x),
                Value::I32(x) => arg(x),
                Value::F32(x) => arg(x),
                Value::Layout(l) => arg(l),
            })
            .collect()
    }
}

/// The stride between consecutive elements (row-major) of `view` when it
/// is one: strides of size-1 dimensions do not matter.
fn single_stride(view: &View<'_>) -> Option<i64> {
    let mut dims = view.shape.iter().zip(view.strides).rev().filter(|(&size, _)| size != 1);
    let Some((&size, &stride)) = dims.next() else {
        return Some(0);
    };
    let mut next = size.saturating_mul(stride);
    for (&size, &s) in dims {
        if s != next {
            return None;
        }
        next = size.saturating_mul(s);
    }
    Some(stride)
}

/// The kernel parameter bytes every OpenCL device takes (the minimum of
/// `CL_DEVICE_MAX_PARAMETER_SIZE`, and PoCL's CPU value): past it PoCL
/// overruns its argument storage instead of failing.
const MAX_PARAMETER_BYTES: usize = 1024;

/// Builds (or finds) `kernel` of `source` with `options` and enqueues the
/// range `global` (in work groups of `local`, or of the driver's choice)
/// on `stream`. A range with no work items enqueues nothing.
pub(crate) fn enqueue(
    l: &Launch<'_>,
    (source, kernel): (&str, &'static str),
    options: String,
    args: &Args,
    global: &[usize],
    local: Option<&[usize]>,
) -> Result<()> {
    let Launch { rt, cache, stream, op } = *l;
    if global.contains(&0) {
        return Ok(());
    }
    let raw = args.raw();
    // Each parameter padded to 8 bytes: an upper bound of the driver's
    // layout (a Layout is 8-aligned, smaller scalars at most pad to 8).
    let bytes: usize = raw.iter().map(|(size, _)| size.next_multiple_of(8)).sum();
    if bytes > MAX_PARAMETER_BYTES {
        return Err(Error::internal(format!(
            "opencl: {op}: {kernel} takes {bytes} bytes of parameters, more than the {MAX_PARAMETER_BYTES} \
             every device accepts"
        )));
    }
    let built = cache.get(rt, stream.device, source, kernel, options)?;
    launch_range(rt, &built, stream, op, &raw, global, local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_stride_ignores_size_one_dimensions() {
        let view = |shape: &'static [i64], strides: &'static [i64]| View {
            addr: 0,
            elem: Elem::F32,
            shape,
            strides,
        };
        assert_eq!(single_stride(&view(&[5], &[3])), Some(3));
        assert_eq!(single_stride(&view(&[1, 5, 1], &[99, 2, 7])), Some(2));
        assert_eq!(single_stride(&view(&[2, 3], &[3, 1])), Some(1));
        assert_eq!(single_stride(&view(&[2, 3], &[1, 2])), None);
        assert_eq!(single_stride(&view(&[1, 1], &[4, 4])), Some(0));
        assert_eq!(single_stride(&view(&[], &[])), Some(0));
    }

    #[test]
    fn the_layout_struct_is_what_the_kernels_expect() {
        // common.cl: two long[MAX_DIMS] arrays, then two longs.
        assert_eq!(std::mem::size_of::<Layout>(), (2 * MAX_DIMS + 2) * 8);
    }
}

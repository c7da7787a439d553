//! The elementwise operators: binary arithmetic and comparisons, unary
//! functions, and the converting, broadcasting, strided `copy_` and `fill_`
//! (`binary.cl`, `unary.cl`). Operands may be host numbers; every device
//! operand is indexed through its own strides (0 along broadcast
//! dimensions), so none needs to be contiguous.

use std::ffi::c_void;

use super::{
    arg, compute_type, launch_range, place, type_options, work_items, Built, Elem, Launch, Number, Operand,
    Placed, View, MAX_DIMS,
};
use crate::error::{Error, Result};
use crate::runtime::{Runtime, Stream};

/// The kernels' OpenCL C sources, each after what they share.
const BINARY_SOURCE: &str = concat!(include_str!("common.cl"), include_str!("binary.cl"));
const UNARY_SOURCE: &str = concat!(include_str!("common.cl"), include_str!("unary.cl"));

/// The elementwise binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl BinaryOp {
    /// The `OP(x, y, alpha)` macro's body; no spaces, since the build
    /// options are split at whitespace.
    fn expression(self) -> &'static str {
        match self {
            BinaryOp::Add => "((x)+(alpha)*(y))",
            BinaryOp::Sub => "((x)-(alpha)*(y))",
            BinaryOp::Mul => "((x)*(y))",
            BinaryOp::Div => "((x)/(y))",
            BinaryOp::Eq => "((x)==(y))",
            BinaryOp::Ne => "((x)!=(y))",
            BinaryOp::Lt => "((x)<(y))",
            BinaryOp::Le => "((x)<=(y))",
            BinaryOp::Gt => "((x)>(y))",
            BinaryOp::Ge => "((x)>=(y))",
        }
    }

    /// Comparisons compute in the operands' type, not the (bool) output's.
    fn is_comparison(self) -> bool {
        !matches!(self, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div)
    }
}

/// The `Geometry` kernel argument: sizes and per-operand strides, in
/// elements, padded to [`MAX_DIMS`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Geometry {
    size: [i64; MAX_DIMS],
    a: [i64; MAX_DIMS],
    b: [i64; MAX_DIMS],
    o: [i64; MAX_DIMS],
}

/// The output and first operand of an elementwise call, checked and placed.
struct Elementwise<'v> {
    out: View<'v>,
    a: View<'v>,
    placed_o: Placed,
    placed_a: Placed,
    n: usize,
}

fn elementwise<'v>(
    rt: &Runtime,
    device: usize,
    name: &str,
    a: &Operand<'v>,
    out: &Operand<'v>,
) -> Result<Elementwise<'v>> {
    let Operand::Device(o_view) = *out else {
        return Err(Error::invalid(format!("opencl: {name}: the output is not device memory")));
    };
    let Operand::Device(a_view) = *a else {
        return Err(Error::unimplemented(format!("opencl: {name}: self is a host number")));
    };
    if o_view.shape.len() > MAX_DIMS {
        return Err(Error::unimplemented(format!(
            "opencl: {name}: {} dimensions (the kernels take at most {MAX_DIMS})",
            o_view.shape.len()
        )));
    }
    let n = work_items(o_view.shape);
    let placed_o = place(rt, device, name, "the output", o_view, o_view.shape)?;
    let placed_a = place(rt, device, name, "self", a_view, o_view.shape)?;
    Ok(Elementwise { out: o_view, a: a_view, placed_o, placed_a, n })
}

/// `o = op(a, b, alpha)`, enqueued on `stream`.
pub(crate) fn binary(
    l: &Launch<'_>,
    op: BinaryOp,
    a: &Operand<'_>,
    b: &Operand<'_>,
    alpha: Number,
    out: &Operand<'_>,
) -> Result<()> {
    let Launch { rt, cache, stream, op: name } = *l;
    let device = stream.device;
    let Operand::Device(o_view) = *out else {
        return Err(Error::invalid(format!("opencl: {name}: the output is not device memory")));
    };
    if o_view.shape.len() > MAX_DIMS {
        return Err(Error::unimplemented(format!(
            "opencl: {name}: {} dimensions (the kernels take at most {MAX_DIMS})",
            o_view.shape.len()
        )));
    }
    // Either operand may be a host number (`2 * t` arrives as mul(2, t)
    // from some decompositions), not both.
    let side =
        |operand: &Operand<'_>, what: &str| -> Result<(Option<Elem>, Option<Placed>, Option<Number>)> {
            Ok(match *operand {
                Operand::Device(view) => {
                    (Some(view.elem), Some(place(rt, device, name, what, view, o_view.shape)?), None)
                }
                Operand::Host(v) => (None, None, Some(v)),
            })
        };
    let (ta, placed_a, a_value) = side(a, "self")?;
    let (tb, placed_b, b_value) = side(b, "other")?;
    let placed_o = place(rt, device, name, "the output", o_view, o_view.shape)?;
    let n = work_items(o_view.shape);
    if n == 0 {
        return Ok(());
    }
    // A comparison computes in float when either side is floating (a
    // float number included, as PyTorch's promotion does), else in long.
    let float_operand = |t: Option<Elem>, v: Option<Number>| {
        t.is_some_and(Elem::is_float) || matches!(v, Some(Number::Float(_)))
    };
    let tc = if !op.is_comparison() {
        compute_type(o_view.elem)
    } else if float_operand(ta, a_value) || float_operand(tb, b_value) {
        Elem::F32
    } else {
        Elem::I64
    };
    let Some(first) = ta.or(tb) else {
        return Err(Error::unimplemented(format!("opencl: {name}: both operands are host numbers")));
    };
    let types = [("TA", ta.unwrap_or(first)), ("TB", tb.unwrap_or(first)), ("TO", o_view.elem)];
    let mut options = type_options(rt, device, name, &types, tc)?;
    options.push_str(&format!(" -DOP(x,y,alpha)={}", op.expression()));
    if a_value.is_some() {
        options.push_str(" -DA_SCALAR");
    }
    if b_value.is_some() {
        options.push_str(" -DB_SCALAR");
    }
    let built = cache.get(rt, device, BINARY_SOURCE, "binary", options)?;

    let mut geometry = Geometry::default();
    geometry.size[..o_view.shape.len()].copy_from_slice(o_view.shape);
    geometry.o = placed_o.strides;
    let (mut a_mem, mut a_off, mut b_mem, mut b_off) = (0, 0, 0, 0);
    if let Some(p) = &placed_a {
        (geometry.a, a_mem, a_off) = (p.strides, p.mem, p.offset);
    }
    if let Some(p) = &placed_b {
        (geometry.b, b_mem, b_off) = (p.strides, p.mem, p.offset);
    }
    let a_scalar = TypedNumber::new(tc, a_value.unwrap_or(Number::Int(0)));
    let b_scalar = TypedNumber::new(tc, b_value.unwrap_or(Number::Int(0)));
    let alpha = TypedNumber::new(tc, alpha);
    let (ndim, count) = (o_view.shape.len() as i32, n as u64);
    let args = [
        arg(&a_mem),
        arg(&a_off),
        a_scalar.arg(),
        arg(&b_mem),
        arg(&b_off),
        b_scalar.arg(),
        arg(&placed_o.mem),
        arg(&placed_o.offset),
        arg(&geometry),
        arg(&ndim),
        arg(&count),
        alpha.arg(),
    ];
    launch(rt, &built, stream, name, &args, n)
}

/// The elementwise unary operators, and the two that write without reading
/// an operation of their input: `copy_` (a converting, broadcasting,
/// strided copy) and `fill_`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum UnaryOp {
    Relu,
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sigmoid,
    Tanh,
    Sin,
    Cos,
    Reciprocal,
    Copy,
    Fill,
}

impl UnaryOp {
    /// The `OP(x, v)` macro's body for compute type `tc` (no spaces: the
    /// build options are split at whitespace); `None` when the operator
    /// has no integer form.
    fn expression(self, tc: Elem) -> Option<&'static str> {
        let float = tc != Elem::I64;
        Some(match self {
            // x < 0 is false for NaN, which stays NaN as in PyTorch.
            UnaryOp::Relu => "((x)<(TC)0?(TC)0:(x))",
            UnaryOp::Neg => "(-(x))",
            UnaryOp::Abs if float => "fabs(x)",
            UnaryOp::Abs => "((x)<0?-(x):(x))",
            UnaryOp::Copy => "(x)",
            UnaryOp::Fill => "(v)",
            _ if !float => return None,
            UnaryOp::Exp => "exp(x)",
            UnaryOp::Log => "log(x)",
            UnaryOp::Sqrt => "sqrt(x)",
            UnaryOp::Rsqrt => "rsqrt(x)",
            UnaryOp::Sigmoid => "(1/(1+exp(-(x))))",
            UnaryOp::Tanh => "tanh(x)",
            UnaryOp::Sin => "sin(x)",
            UnaryOp::Cos => "cos(x)",
            UnaryOp::Reciprocal => "((TC)1/(x))",
        })
    }
}

/// `o = op(a)` (for `fill_`, `o = value`), enqueued on `stream`.
pub(crate) fn unary(
    l: &Launch<'_>,
    op: UnaryOp,
    a: &Operand<'_>,
    value: Number,
    out: &Operand<'_>,
) -> Result<()> {
    let Launch { rt, cache, stream, op: name } = *l;
    let device = stream.device;
    let e = elementwise(rt, device, name, a, out)?;
    if e.n == 0 {
        return Ok(());
    }
    // A copy to bool tests the source for nonzero in the source's type
    // (0.5 is true).
    let tc =
        compute_type(if op == UnaryOp::Copy && e.out.elem == Elem::Bool { e.a.elem } else { e.out.elem });
    let expression = op.expression(tc).ok_or_else(|| {
        Error::unimplemented(format!("opencl: {name}: no integer form (PyTorch gives it a floating output)"))
    })?;
    let mut options = type_options(rt, device, name, &[("TA", e.a.elem), ("TO", e.out.elem)], tc)?;
    options.push_str(&format!(" -DOP(x,v)={expression}"));
    let built = cache.get(rt, device, UNARY_SOURCE, "unary", options)?;

    let mut geometry = Geometry::default();
    geometry.size[..e.out.shape.len()].copy_from_slice(e.out.shape);
    geometry.a = e.placed_a.strides;
    geometry.o = e.placed_o.strides;
    let value = TypedNumber::new(tc, value);
    let (ndim, count) = (e.out.shape.len() as i32, e.n as u64);
    let args = [
        arg(&e.placed_a.mem),
        arg(&e.placed_a.offset),
        arg(&e.placed_o.mem),
        arg(&e.placed_o.offset),
        arg(&geometry),
        arg(&ndim),
        arg(&count),
        value.arg(),
    ];
    launch(rt, &built, stream, name, &args, e.n)
}

/// Sets the kernel's arguments and enqueues `n` work items on `stream`.
fn launch(
    rt: &Runtime,
    built: &Built,
    stream: &Stream,
    name: &str,
    args: &[(usize, *const c_void)],
    n: usize,
) -> Result<()> {
    launch_range(rt, built, stream, name, args, &[n], None)
}

/// A number converted to a kernel's compute type, for a by-value argument.
enum TypedNumber {
    F32(f32),
    F16(u16),
    I64(i64),
}

impl TypedNumber {
    fn new(elem: Elem, v: Number) -> Self {
        let f = match v {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        };
        match elem {
            Elem::F32 => TypedNumber::F32(f as f32),
            Elem::F16 => TypedNumber::F16(f32_to_f16(f as f32)),
            Elem::I64 => TypedNumber::I64(match v {
                Number::Int(i) => i,
                Number::Float(f) => f as i64,
            }),
            Elem::Bool => TypedNumber::I64(i64::from(f != 0.0)),
        }
    }
    fn arg(&self) -> (usize, *const c_void) {
        match self {
            TypedNumber::F32(v) => arg(v),
            TypedNumber::F16(v) => arg(v),
            TypedNumber::I64(v) => arg(v),
        }
    }
}

/// IEEE half from single, rounding to nearest even (for by-value `half`
/// arguments; OpenCL has no host-side half type).
fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = (mant | 0x80_0000) >> (1 - e);
        let round = (m & 0x1fff) > 0x1000 || ((m & 0x1fff) == 0x1000 && (m & 0x2000) != 0);
        return sign | ((m >> 13) as u16 + u16::from(round));
    }
    let round = (mant & 0x1fff) > 0x1000 || ((mant & 0x1fff) == 0x1000 && (mant & 0x2000) != 0);
    let h = ((e as u32) << 10) | (mant >> 13);
    sign | (h as u16).wrapping_add(u16::from(round))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversion_rounds_to_nearest_even() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert_eq!(f32_to_f16(0.5), 0x3800);
        assert_eq!(f32_to_f16(f32::NAN) & 0x7c00, 0x7c00);
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001); // the smallest subnormal
    }

    #[test]
    fn the_geometry_struct_is_what_the_kernel_expects() {
        assert_eq!(std::mem::size_of::<Geometry>(), 4 * MAX_DIMS * 8);
    }
}

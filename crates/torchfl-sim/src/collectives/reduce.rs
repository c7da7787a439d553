//! Element types and reductions of the collectives, over byte buffers.
//!
//! Buffers are device memory at element-aligned, not necessarily
//! type-aligned, addresses (a view's `data_ptr`), so elements are read and
//! written as native-endian bytes.

use half::{bf16, f16};
use torchfl_ffi::{
    TFL_DType, TFL_DTYPE_BFLOAT, TFL_DTYPE_BOOL, TFL_DTYPE_FLOAT, TFL_DTYPE_INT, TFL_DTYPE_UINT,
};

use crate::error::{Error, Result};

/// The element types the collectives accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    F32,
    F64,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl Elem {
    pub(crate) fn from_ffi(d: TFL_DType) -> Result<Self> {
        let e = match (d.code, d.bits, d.lanes) {
            (TFL_DTYPE_FLOAT, 32, 1) => Self::F32,
            (TFL_DTYPE_FLOAT, 64, 1) => Self::F64,
            (TFL_DTYPE_FLOAT, 16, 1) => Self::F16,
            (TFL_DTYPE_BFLOAT, 16, 1) => Self::BF16,
            (TFL_DTYPE_INT, 64, 1) => Self::I64,
            (TFL_DTYPE_INT, 32, 1) => Self::I32,
            (TFL_DTYPE_INT, 16, 1) => Self::I16,
            (TFL_DTYPE_INT, 8, 1) => Self::I8,
            (TFL_DTYPE_UINT, 8, 1) => Self::U8,
            (TFL_DTYPE_BOOL, 8, 1) => Self::Bool,
            _ => {
                return Err(Error::unimplemented(format!(
                    "sim: collectives do not support dtype {{code {}, bits {}, lanes {}}}",
                    d.code, d.bits, d.lanes
                )))
            }
        };
        Ok(e)
    }

    pub(crate) fn size(self) -> usize {
        match self {
            Self::F64 | Self::I64 => 8,
            Self::F32 | Self::I32 => 4,
            Self::F16 | Self::BF16 | Self::I16 => 2,
            Self::I8 | Self::U8 | Self::Bool => 1,
        }
    }
}

/// A reduction operator (`TFL_ReduceOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
}

impl Op {
    pub(crate) fn from_ffi(op: i32, elem: Elem) -> Result<Self> {
        let o = match op {
            torchfl_ffi::TFL_REDUCE_SUM => Self::Sum,
            torchfl_ffi::TFL_REDUCE_PROD => Self::Prod,
            torchfl_ffi::TFL_REDUCE_MIN => Self::Min,
            torchfl_ffi::TFL_REDUCE_MAX => Self::Max,
            torchfl_ffi::TFL_REDUCE_AVG => Self::Avg,
            _ => return Err(Error::unimplemented(format!("sim: unknown reduction operator {op}"))),
        };
        if o == Self::Avg && elem == Elem::Bool {
            return Err(Error::invalid("sim: the average of bool tensors is not defined (use sum or max)"));
        }
        Ok(o)
    }

    pub(crate) fn code(self) -> u8 {
        self as u8
    }
}

macro_rules! fold {
    ($acc:expr, $src:expr, $t:ty, $n:expr, $f:expr) => {{
        for (a, b) in $acc.chunks_exact_mut($n).zip($src.chunks_exact($n)) {
            let x = <$t>::from_ne_bytes(a.try_into().unwrap_or_default());
            let y = <$t>::from_ne_bytes(b.try_into().unwrap_or_default());
            a.copy_from_slice(&$f(x, y).to_ne_bytes());
        }
    }};
}

fn float<T: num_like::Float>(op: Op) -> fn(T, T) -> T {
    match op {
        Op::Sum | Op::Avg => |a, b| a + b,
        Op::Prod => |a, b| a * b,
        // NaN propagates (a NaN `b` fails `a < b` and is taken), as
        // torch.distributed's reductions do on CPU.
        Op::Min => |a: T, b: T| if a.is_nan() || a < b { a } else { b },
        Op::Max => |a: T, b: T| if a.is_nan() || a > b { a } else { b },
    }
}

macro_rules! int_op {
    ($op:expr, $t:ty) => {
        match $op {
            Op::Sum | Op::Avg => |a: $t, b: $t| a.wrapping_add(b),
            Op::Prod => |a: $t, b: $t| a.wrapping_mul(b),
            Op::Min => |a: $t, b: $t| a.min(b),
            Op::Max => |a: $t, b: $t| a.max(b),
        }
    };
}

/// `acc[i] = op(acc[i], src[i])` for every element.
pub(crate) fn combine(acc: &mut [u8], src: &[u8], elem: Elem, op: Op) {
    match elem {
        Elem::F32 => fold!(acc, src, f32, 4, float::<f32>(op)),
        Elem::F64 => fold!(acc, src, f64, 8, float::<f64>(op)),
        Elem::F16 => {
            fold!(acc, src, f16, 2, |a: f16, b: f16| f16::from_f32(float::<f32>(op)(a.to_f32(), b.to_f32())))
        }
        Elem::BF16 => {
            fold!(acc, src, bf16, 2, |a: bf16, b: bf16| bf16::from_f32(float::<f32>(op)(
                a.to_f32(),
                b.to_f32()
            )))
        }
        Elem::I64 => fold!(acc, src, i64, 8, int_op!(op, i64)),
        Elem::I32 => fold!(acc, src, i32, 4, int_op!(op, i32)),
        Elem::I16 => fold!(acc, src, i16, 2, int_op!(op, i16)),
        Elem::I8 => fold!(acc, src, i8, 1, int_op!(op, i8)),
        Elem::U8 => fold!(acc, src, u8, 1, int_op!(op, u8)),
        Elem::Bool => {
            for (a, b) in acc.iter_mut().zip(src) {
                let (x, y) = (*a != 0, *b != 0);
                *a = u8::from(match op {
                    Op::Sum | Op::Max | Op::Avg => x || y,
                    Op::Prod | Op::Min => x && y,
                });
            }
        }
    }
}

/// Divides every element by `n` (the last step of AVG): true division for
/// floating types, C's truncating division for integers, as NCCL does.
pub(crate) fn divide(buf: &mut [u8], elem: Elem, n: usize) {
    macro_rules! each {
        ($t:ty, $s:expr, $f:expr) => {
            for a in buf.chunks_exact_mut($s) {
                let x = <$t>::from_ne_bytes(a.try_into().unwrap_or_default());
                a.copy_from_slice(&$f(x).to_ne_bytes());
            }
        };
    }
    match elem {
        Elem::F32 => each!(f32, 4, |x: f32| x / n as f32),
        Elem::F64 => each!(f64, 8, |x: f64| x / n as f64),
        Elem::F16 => each!(f16, 2, |x: f16| f16::from_f32(x.to_f32() / n as f32)),
        Elem::BF16 => each!(bf16, 2, |x: bf16| bf16::from_f32(x.to_f32() / n as f32)),
        Elem::I64 => each!(i64, 8, |x: i64| x / n as i64),
        Elem::I32 => each!(i32, 4, |x: i32| x / n as i32),
        Elem::I16 => each!(i16, 2, |x: i16| x / n as i16),
        Elem::I8 => each!(i8, 1, |x: i8| x / n as i8),
        Elem::U8 => each!(u8, 1, |x: u8| x / n as u8),
        Elem::Bool => {}
    }
}

/// The floating-point operations [`float`] needs, for f32 and f64.
mod num_like {
    pub(crate) trait Float:
        Copy + PartialOrd + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self>
    {
        fn is_nan(self) -> bool;
    }
    impl Float for f32 {
        fn is_nan(self) -> bool {
            f32::is_nan(self)
        }
    }
    impl Float for f64 {
        fn is_nan(self) -> bool {
            f64::is_nan(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn float_and_integer_reductions_match_their_definition() {
        let mut a = f32s(&[1.0, -2.0, f32::NAN]);
        combine(&mut a, &f32s(&[3.0, 5.0, 1.0]), Elem::F32, Op::Max);
        let got: Vec<f32> =
            a.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap_or_default())).collect();
        assert_eq!(&got[..2], &[3.0, 5.0]);
        assert!(got[2].is_nan());
        let mut i: Vec<u8> = [7i64, -7].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let j: Vec<u8> = [2i64, 0].iter().flat_map(|x| x.to_ne_bytes()).collect();
        combine(&mut i, &j, Elem::I64, Op::Sum);
        divide(&mut i, Elem::I64, 2);
        let got: Vec<i64> =
            i.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap_or_default())).collect();
        assert_eq!(got, vec![4, -3]);
        let mut b = vec![1u8, 0, 1];
        combine(&mut b, &[0, 0, 1], Elem::Bool, Op::Min);
        assert_eq!(b, vec![0, 0, 1]);
        assert!(Op::from_ffi(torchfl_ffi::TFL_REDUCE_AVG, Elem::Bool).is_err());
    }
}

//! The reductions of the collectives, over byte buffers of any [`DType`].
//!
//! Buffers are device memory at element-aligned, not necessarily
//! type-aligned, addresses (a view's `data_ptr`), so elements are read and
//! written as native-endian bytes.

use half::{bf16, f16};
use torchfl_ffi::TFL_DType;

use crate::dtype::{DType, Float};
use crate::error::{Error, Result};

/// The element type of a collective's buffers: any dtype the simulator
/// has, refused otherwise with the collectives' own message.
pub(crate) fn elem_from_ffi(d: TFL_DType) -> Result<DType> {
    DType::from_ffi(d).ok_or_else(|| {
        Error::unimplemented(format!(
            "sim: collectives do not support dtype {{code {}, bits {}, lanes {}}}",
            d.code, d.bits, d.lanes
        ))
    })
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
    pub(crate) fn from_ffi(op: i32, elem: DType) -> Result<Self> {
        let o = match op {
            torchfl_ffi::TFL_REDUCE_SUM => Self::Sum,
            torchfl_ffi::TFL_REDUCE_PROD => Self::Prod,
            torchfl_ffi::TFL_REDUCE_MIN => Self::Min,
            torchfl_ffi::TFL_REDUCE_MAX => Self::Max,
            torchfl_ffi::TFL_REDUCE_AVG => Self::Avg,
            _ => return Err(Error::unimplemented(format!("sim: unknown reduction operator {op}"))),
        };
        if o == Self::Avg && elem == DType::Bool {
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

fn float<T: Float>(op: Op) -> fn(T, T) -> T {
    match op {
        Op::Sum | Op::Avg => |a: T, b: T| a.add(b),
        Op::Prod => |a: T, b: T| a.mul(b),
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
pub(crate) fn combine(acc: &mut [u8], src: &[u8], elem: DType, op: Op) {
    match elem {
        DType::Float32 => fold!(acc, src, f32, 4, float::<f32>(op)),
        DType::Float64 => fold!(acc, src, f64, 8, float::<f64>(op)),
        DType::Float16 => {
            fold!(acc, src, f16, 2, |a: f16, b: f16| f16::from_f32(float::<f32>(op)(a.to_f32(), b.to_f32())))
        }
        DType::BFloat16 => {
            fold!(acc, src, bf16, 2, |a: bf16, b: bf16| bf16::from_f32(float::<f32>(op)(
                a.to_f32(),
                b.to_f32()
            )))
        }
        DType::Int64 => fold!(acc, src, i64, 8, int_op!(op, i64)),
        DType::Int32 => fold!(acc, src, i32, 4, int_op!(op, i32)),
        DType::Int16 => fold!(acc, src, i16, 2, int_op!(op, i16)),
        DType::Int8 => fold!(acc, src, i8, 1, int_op!(op, i8)),
        DType::UInt8 => fold!(acc, src, u8, 1, int_op!(op, u8)),
        DType::Bool => {
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
pub(crate) fn divide(buf: &mut [u8], elem: DType, n: usize) {
    macro_rules! each {
        ($t:ty, $s:expr, $f:expr) => {
            for a in buf.chunks_exact_mut($s) {
                let x = <$t>::from_ne_bytes(a.try_into().unwrap_or_default());
                a.copy_from_slice(&$f(x).to_ne_bytes());
            }
        };
    }
    match elem {
        DType::Float32 => each!(f32, 4, |x: f32| x / n as f32),
        DType::Float64 => each!(f64, 8, |x: f64| x / n as f64),
        DType::Float16 => each!(f16, 2, |x: f16| f16::from_f32(x.to_f32() / n as f32)),
        DType::BFloat16 => each!(bf16, 2, |x: bf16| bf16::from_f32(x.to_f32() / n as f32)),
        DType::Int64 => each!(i64, 8, |x: i64| x / n as i64),
        DType::Int32 => each!(i32, 4, |x: i32| x / n as i32),
        DType::Int16 => each!(i16, 2, |x: i16| x / n as i16),
        DType::Int8 => each!(i8, 1, |x: i8| x / n as i8),
        DType::UInt8 => each!(u8, 1, |x: u8| x / n as u8),
        DType::Bool => {}
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
        combine(&mut a, &f32s(&[3.0, 5.0, 1.0]), DType::Float32, Op::Max);
        let got: Vec<f32> =
            a.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap_or_default())).collect();
        assert_eq!(&got[..2], &[3.0, 5.0]);
        assert!(got[2].is_nan());
        let mut i: Vec<u8> = [7i64, -7].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let j: Vec<u8> = [2i64, 0].iter().flat_map(|x| x.to_ne_bytes()).collect();
        combine(&mut i, &j, DType::Int64, Op::Sum);
        divide(&mut i, DType::Int64, 2);
        let got: Vec<i64> =
            i.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap_or_default())).collect();
        assert_eq!(got, vec![4, -3]);
        let mut b = vec![1u8, 0, 1];
        combine(&mut b, &[0, 0, 1], DType::Bool, Op::Min);
        assert_eq!(b, vec![0, 0, 1]);
        assert!(Op::from_ffi(torchfl_ffi::TFL_REDUCE_AVG, DType::Bool).is_err());
    }
}

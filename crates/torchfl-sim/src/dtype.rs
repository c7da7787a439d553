//! Element types, shared by both halves of the simulator: the [`DType`]
//! enum (what a tensor holds for the kernels, what a buffer holds for the
//! collectives), the [`Element`] trait that gives every storage type the
//! same conversions, and the compute types' arithmetic ([`Arith`],
//! [`Float`]). PyTorch's type-promotion rules, which only the kernels
//! apply, are in `kernels::promotion`.
//!
//! Conversions follow c10's `static_cast` semantics where PyTorch defines
//! them: half and bfloat16 are produced from `f32` (c10's constructors take a
//! float, so `f64 -> f16` rounds twice exactly as PyTorch does), `uint8` from
//! a float goes through `int64` (c10's special case), other narrow integers
//! truncate, and bool is "not zero".

use half::{bf16, f16};
use torchfl_ffi::TFL_DType;

/// An element type the simulator stores and computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// `torch.bool` (one byte, 0 or 1 when written by the simulator).
    Bool,
    /// `torch.uint8`
    UInt8,
    /// `torch.int8`
    Int8,
    /// `torch.int16`
    Int16,
    /// `torch.int32`
    Int32,
    /// `torch.int64`
    Int64,
    /// `torch.float16`
    Float16,
    /// `torch.bfloat16`
    BFloat16,
    /// `torch.float32`
    Float32,
    /// `torch.float64`
    Float64,
}

/// Bool < integral < floating: the categories of type promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Category {
    Bool,
    Integral,
    Floating,
}

impl DType {
    /// All supported dtypes.
    pub const ALL: [DType; 10] = [
        DType::Bool,
        DType::UInt8,
        DType::Int8,
        DType::Int16,
        DType::Int32,
        DType::Int64,
        DType::Float16,
        DType::BFloat16,
        DType::Float32,
        DType::Float64,
    ];

    /// The dtype of an ABI descriptor; `None` for unsupported ones
    /// (complex, vector lanes, odd widths).
    pub fn from_ffi(d: TFL_DType) -> Option<Self> {
        use torchfl_ffi::*;
        if d.lanes != 1 {
            return None;
        }
        Some(match (d.code, d.bits) {
            (TFL_DTYPE_BOOL, 8) => DType::Bool,
            (TFL_DTYPE_UINT, 8) => DType::UInt8,
            (TFL_DTYPE_INT, 8) => DType::Int8,
            (TFL_DTYPE_INT, 16) => DType::Int16,
            (TFL_DTYPE_INT, 32) => DType::Int32,
            (TFL_DTYPE_INT, 64) => DType::Int64,
            (TFL_DTYPE_FLOAT, 16) => DType::Float16,
            (TFL_DTYPE_BFLOAT, 16) => DType::BFloat16,
            (TFL_DTYPE_FLOAT, 32) => DType::Float32,
            (TFL_DTYPE_FLOAT, 64) => DType::Float64,
            _ => return None,
        })
    }

    /// The ABI descriptor.
    pub fn to_ffi(self) -> TFL_DType {
        match self {
            DType::Bool => TFL_DType::BOOL,
            DType::UInt8 => TFL_DType::U8,
            DType::Int8 => TFL_DType::I8,
            DType::Int16 => TFL_DType::I16,
            DType::Int32 => TFL_DType::I32,
            DType::Int64 => TFL_DType::I64,
            DType::Float16 => TFL_DType::F16,
            DType::BFloat16 => TFL_DType::BF16,
            DType::Float32 => TFL_DType::F32,
            DType::Float64 => TFL_DType::F64,
        }
    }

    /// The dtype with c10 `ScalarType` number `n` (`Float = 6`), as passed
    /// for `ScalarType` arguments; `None` for types the simulator lacks.
    pub fn from_scalar_type(n: i64) -> Option<Self> {
        Some(match n {
            0 => DType::UInt8,
            1 => DType::Int8,
            2 => DType::Int16,
            3 => DType::Int32,
            4 => DType::Int64,
            5 => DType::Float16,
            6 => DType::Float32,
            7 => DType::Float64,
            11 => DType::Bool,
            15 => DType::BFloat16,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        match self {
            DType::Bool | DType::UInt8 | DType::Int8 => 1,
            DType::Int16 | DType::Float16 | DType::BFloat16 => 2,
            DType::Int32 | DType::Float32 => 4,
            DType::Int64 | DType::Float64 => 8,
        }
    }

    /// c10's name, as PyTorch prints it in error messages ("Float").
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "Bool",
            DType::UInt8 => "Byte",
            DType::Int8 => "Char",
            DType::Int16 => "Short",
            DType::Int32 => "Int",
            DType::Int64 => "Long",
            DType::Float16 => "Half",
            DType::BFloat16 => "BFloat16",
            DType::Float32 => "Float",
            DType::Float64 => "Double",
        }
    }

    /// Whether the type is a floating-point type.
    pub fn is_floating(self) -> bool {
        matches!(self, DType::Float16 | DType::BFloat16 | DType::Float32 | DType::Float64)
    }

    pub(crate) fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            d if d.is_floating() => Category::Floating,
            _ => Category::Integral,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A byte holding a bool. Device memory may hold any byte value (for
/// example never-written memory reinterpreted as bool), which Rust's `bool`
/// must not, so bool tensors are read as `B8` and compared by truthiness.
#[derive(Debug, Clone, Copy, Default)]
#[repr(transparent)]
pub(crate) struct B8(pub(crate) u8);

impl PartialEq for B8 {
    fn eq(&self, o: &Self) -> bool {
        (self.0 != 0) == (o.0 != 0)
    }
}
impl PartialOrd for B8 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        (self.0 != 0).partial_cmp(&(o.0 != 0))
    }
}

/// A storage type of device memory, with conversions to and from the four
/// value domains. Only `cast` should combine them.
pub(crate) trait Element: Copy + Send + Sync + 'static + PartialOrd {
    const DTYPE: DType;
    const ZERO: Self;
    fn to_f32(self) -> f32;
    fn to_f64(self) -> f64;
    fn to_i64(self) -> i64;
    fn to_bool(self) -> bool;
    fn from_f32(v: f32) -> Self;
    fn from_f64(v: f64) -> Self;
    fn from_i64(v: i64) -> Self;
    fn from_bool(v: bool) -> Self;
}

/// Converts between element types with PyTorch's semantics. Monomorphised
/// per pair; the `match` folds away.
#[inline(always)]
pub(crate) fn cast<S: Element, D: Element>(s: S) -> D {
    match D::DTYPE {
        DType::Float32 | DType::Float16 | DType::BFloat16 => D::from_f32(s.to_f32()),
        DType::Float64 => D::from_f64(s.to_f64()),
        DType::Bool => D::from_bool(s.to_bool()),
        _ => D::from_i64(s.to_i64()),
    }
}

macro_rules! int_element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            const ZERO: Self = 0;
            #[inline(always)]
            fn to_f32(self) -> f32 {
                self as f32
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn to_bool(self) -> bool {
                self != 0
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                v as i64 as $t
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as i64 as $t
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_bool(v: bool) -> Self {
                v as $t
            }
        }
    };
}
int_element!(u8, UInt8);
int_element!(i8, Int8);
int_element!(i16, Int16);
int_element!(i32, Int32);
int_element!(i64, Int64);

macro_rules! float_element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            const ZERO: Self = 0.0;
            #[inline(always)]
            fn to_f32(self) -> f32 {
                self as f32
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn to_bool(self) -> bool {
                self != 0.0
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_bool(v: bool) -> Self {
                if v {
                    1.0
                } else {
                    0.0
                }
            }
        }
    };
}
float_element!(f32, Float32);
float_element!(f64, Float64);

macro_rules! half_element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            const ZERO: Self = <$t>::ZERO;
            #[inline(always)]
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                <$t>::to_f32(self) as i64
            }
            #[inline(always)]
            fn to_bool(self) -> bool {
                <$t>::to_f32(self) != 0.0
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                <$t>::from_f32(v)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                // c10 builds half types from float: round to f32 first.
                <$t>::from_f32(v as f32)
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
            #[inline(always)]
            fn from_bool(v: bool) -> Self {
                if v {
                    <$t>::ONE
                } else {
                    <$t>::ZERO
                }
            }
        }
    };
}
half_element!(f16, Float16);
half_element!(bf16, BFloat16);

impl Element for B8 {
    const DTYPE: DType = DType::Bool;
    const ZERO: Self = B8(0);
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from(u8::from(self.0 != 0))
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self.0 != 0))
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        i64::from(self.0 != 0)
    }
    #[inline(always)]
    fn to_bool(self) -> bool {
        self.0 != 0
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        B8(u8::from(v != 0.0))
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        B8(u8::from(v != 0.0))
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        B8(u8::from(v != 0))
    }
    #[inline(always)]
    fn from_bool(v: bool) -> Self {
        B8(u8::from(v))
    }
}

/// Arithmetic in a compute type. Integers wrap (as in PyTorch); bool adds
/// as logical or and multiplies as logical and.
pub(crate) trait Arith: Element {
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn relu(self) -> Self;
}

/// A floating compute type (`f32`, `f64`): what a floating kernel (through
/// the math of `kernels::real::Real`, which extends it) and a floating
/// collective reduction compute in.
pub(crate) trait Float: Arith {
    /// True division.
    fn div(self, o: Self) -> Self;
    /// `true` for NaN.
    fn is_nan(self) -> bool;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)]
            fn sub(self, o: Self) -> Self { self.wrapping_sub(o) }
            #[inline(always)]
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)]
            fn neg(self) -> Self { self.wrapping_neg() }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn relu(self) -> Self { if self < 0 { 0 } else { self } }
        }
    )*};
}
int_arith!(u8, i8, i16, i32, i64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self { self + o }
            #[inline(always)]
            fn sub(self, o: Self) -> Self { self - o }
            #[inline(always)]
            fn mul(self, o: Self) -> Self { self * o }
            #[inline(always)]
            fn neg(self) -> Self { -self }
            // NaN propagates, as in PyTorch (NaN < 0 is false).
            #[inline(always)]
            fn relu(self) -> Self { if self < 0.0 { 0.0 } else { self } }
        }
        impl Float for $t {
            #[inline(always)]
            fn div(self, o: Self) -> Self { self / o }
            #[inline(always)]
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
        }
    )*};
}
float_arith!(f32, f64);

impl Arith for B8 {
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        B8(u8::from(self.0 != 0 || o.0 != 0))
    }
    /// Never reached: kernels refuse bool subtraction as PyTorch does.
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        B8(u8::from((self.0 != 0) != (o.0 != 0)))
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        B8(u8::from(self.0 != 0 && o.0 != 0))
    }
    #[inline(always)]
    fn neg(self) -> Self {
        self
    }
    #[inline(always)]
    fn relu(self) -> Self {
        self
    }
}

/// Runs `$body` with `$T` bound to the storage type of `$dtype`.
macro_rules! with_storage {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::Bool => {
                type $T = $crate::dtype::B8;
                $body
            }
            $crate::dtype::DType::UInt8 => {
                type $T = u8;
                $body
            }
            $crate::dtype::DType::Int8 => {
                type $T = i8;
                $body
            }
            $crate::dtype::DType::Int16 => {
                type $T = i16;
                $body
            }
            $crate::dtype::DType::Int32 => {
                type $T = i32;
                $body
            }
            $crate::dtype::DType::Int64 => {
                type $T = i64;
                $body
            }
            $crate::dtype::DType::Float16 => {
                type $T = half::f16;
                $body
            }
            $crate::dtype::DType::BFloat16 => {
                type $T = half::bf16;
                $body
            }
            $crate::dtype::DType::Float32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::Float64 => {
                type $T = f64;
                $body
            }
        }
    };
}
pub(crate) use with_storage;

/// Runs `$body` with `$T` bound to the type arithmetic producing `$dtype`
/// computes in: the storage type itself, except `f32` for half types.
macro_rules! with_arith {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::Float16
            | $crate::dtype::DType::BFloat16
            | $crate::dtype::DType::Float32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::Float64 => {
                type $T = f64;
                $body
            }
            $crate::dtype::DType::Bool => {
                type $T = $crate::dtype::B8;
                $body
            }
            $crate::dtype::DType::UInt8 => {
                type $T = u8;
                $body
            }
            $crate::dtype::DType::Int8 => {
                type $T = i8;
                $body
            }
            $crate::dtype::DType::Int16 => {
                type $T = i16;
                $body
            }
            $crate::dtype::DType::Int32 => {
                type $T = i32;
                $body
            }
            $crate::dtype::DType::Int64 => {
                type $T = i64;
                $body
            }
        }
    };
}
pub(crate) use with_arith;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_follow_c10() {
        assert_eq!(cast::<f32, u8>(-1.0), 255);
        assert_eq!(cast::<f32, i8>(3.9), 3);
        assert_eq!(cast::<i64, i8>(300), 44);
        assert!(cast::<B8, f32>(B8(7)) == 1.0);
        assert!(cast::<f32, B8>(0.5) == B8(1));
        assert_eq!(cast::<f64, f16>(1.0 / 3.0), f16::from_f32((1.0f64 / 3.0) as f32));
        assert_eq!(cast::<i64, bf16>(3), bf16::from_f32(3.0));
    }
}

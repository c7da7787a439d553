//! PyTorch's type promotion over [`DType`]: c10's `promoteTypes`,
//! `at::result_type` and `canCast`, which every kernel that mixes dtypes
//! applies the same way.

use crate::dtype::{Category, DType};

/// c10's `promoteTypes` for the supported dtypes.
pub(crate) fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (a, b) {
        (Bool, x) | (x, Bool) => x,
        (Float16, BFloat16) | (BFloat16, Float16) => Float32,
        (x, y) if x.is_floating() && y.is_floating() => {
            if x.itemsize() >= y.itemsize() {
                x
            } else {
                y
            }
        }
        (x, _) if x.is_floating() => x,
        (_, y) if y.is_floating() => y,
        (UInt8, Int8) | (Int8, UInt8) => Int16,
        (UInt8, x) | (x, UInt8) => x,
        (x, y) => {
            if x.itemsize() >= y.itemsize() {
                x
            } else {
                y
            }
        }
    }
}

/// What an operand contributes to `result_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Participant {
    /// A tensor with at least one dimension.
    Dimensioned(DType),
    /// A 0-dim tensor (device or host).
    ZeroDim(DType),
    /// A `Scalar` argument (a wrapped number): only its category counts.
    Wrapped(Category),
}

/// PyTorch's `at::result_type`: dimensioned tensors take precedence over
/// 0-dim tensors, which take precedence over wrapped numbers; a lower tier
/// only matters when its category is higher (bool < integral < floating).
/// Wrapped numbers contribute `bool`, `int64` or the default `float32`.
pub(crate) fn result_type(parts: &[Participant]) -> DType {
    fn merge(slot: &mut Option<DType>, d: DType) {
        *slot = Some(slot.map_or(d, |s| promote_types(s, d)));
    }
    let (mut dim, mut zero, mut wrapped) = (None, None, None);
    for p in parts {
        match *p {
            Participant::Dimensioned(d) => merge(&mut dim, d),
            Participant::ZeroDim(d) => merge(&mut zero, d),
            Participant::Wrapped(c) => merge(
                &mut wrapped,
                match c {
                    Category::Bool => DType::Bool,
                    Category::Integral => DType::Int64,
                    Category::Floating => DType::Float32,
                },
            ),
        }
    }
    fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
        match (higher, lower) {
            (Some(h), _) if h.is_floating() => Some(h),
            (Some(h), Some(l)) if h == DType::Bool || l.is_floating() => Some(promote_types(h, l)),
            (Some(h), _) => Some(h),
            (None, l) => l,
        }
    }
    combine(dim, combine(zero, wrapped)).unwrap_or(DType::Float32)
}

/// c10's `canCast`: no floating to integral, no non-bool to bool.
pub(crate) fn can_cast(from: DType, to: DType) -> bool {
    !(from.is_floating() && !to.is_floating() || from != DType::Bool && to == DType::Bool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn promotion_table() {
        assert_eq!(promote_types(UInt8, Int8), Int16);
        assert_eq!(promote_types(UInt8, Int32), Int32);
        assert_eq!(promote_types(Bool, Int8), Int8);
        assert_eq!(promote_types(Int64, Float16), Float16);
        assert_eq!(promote_types(Float16, BFloat16), Float32);
        assert_eq!(promote_types(BFloat16, Float64), Float64);
        assert_eq!(promote_types(Int32, Int16), Int32);
        for a in DType::ALL {
            for b in DType::ALL {
                assert_eq!(promote_types(a, b), promote_types(b, a), "{a} {b}");
            }
        }
    }

    #[test]
    fn result_type_tiers() {
        use Participant::*;
        // int tensor vs float scalar -> default float
        assert_eq!(result_type(&[Dimensioned(Int64), Wrapped(Category::Floating)]), Float32);
        // float16 tensor vs double scalar -> float16
        assert_eq!(result_type(&[Dimensioned(Float16), Wrapped(Category::Floating)]), Float16);
        // uint8 tensor vs int scalar -> uint8
        assert_eq!(result_type(&[Dimensioned(UInt8), Wrapped(Category::Integral)]), UInt8);
        // int32 tensor vs 0-dim int64 tensor -> int32
        assert_eq!(result_type(&[Dimensioned(Int32), ZeroDim(Int64)]), Int32);
        // int32 tensor vs 0-dim double tensor -> double
        assert_eq!(result_type(&[Dimensioned(Int32), ZeroDim(Float64)]), Float64);
        // float tensor vs 0-dim double -> float
        assert_eq!(result_type(&[Dimensioned(Float32), ZeroDim(Float64)]), Float32);
        // bool tensor vs int scalar -> int64
        assert_eq!(result_type(&[Dimensioned(Bool), Wrapped(Category::Integral)]), Int64);
        // 0-dim only
        assert_eq!(result_type(&[ZeroDim(Int8), ZeroDim(UInt8)]), Int16);
    }

    #[test]
    fn can_cast_follows_c10() {
        assert!(can_cast(Int64, Float32) && !can_cast(Float32, Int64));
        assert!(!can_cast(Int64, Bool) && can_cast(Bool, Int8));
    }
}

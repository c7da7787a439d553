//! Operators beyond the elementwise forms of the op table: one module per
//! family, each decoding its operators' arguments through [`Call`] (schema
//! order) and launching the family's kernels (`crate::kernels::*`).
//!
//! [`Call`]: super::frame::Call

pub(super) mod conv;
pub(super) mod index;
pub(super) mod loss;
pub(super) mod norm;
pub(super) mod pointwise;
pub(super) mod pool;
pub(super) mod positional;
pub(super) mod reduce;
pub(super) mod softmax;

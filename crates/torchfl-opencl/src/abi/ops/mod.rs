//! Operators beyond the elementwise forms of the op table: one module per
//! family, each decoding its operators' arguments through [`Call`] (schema
//! order) and launching the family's kernels (`crate::kernels::*`).
//!
//! [`Call`]: super::frame::Call

pub(super) mod norm;
pub(super) mod pointwise;

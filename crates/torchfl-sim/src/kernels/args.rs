//! Argument parsing: positional access to a call's arguments.
//!
//! Kernels read their arguments through [`Args`] rather than matching on
//! [`ArgRef`]s themselves so that schema defaults, the kinds PyTorch lets
//! stand in for one another (an int for a `Scalar`, an int for a one-item
//! `int[]`) and the messages for a wrong argument are the same for every
//! operator.

use super::call::{ArgRef, Frame, Scalar, TensorRef};
use super::context::KernelCtx;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Positional access to a call's arguments with schema defaults and
/// messages that name the operator and the parameter.
pub(crate) struct Args<'a> {
    ctx: &'a KernelCtx<'a>,
    call: &'a Frame<'a>,
}

impl<'a> Args<'a> {
    /// Checks `min <= num_args <= max` (trailing defaulted arguments may be
    /// omitted).
    pub(crate) fn new(ctx: &'a KernelCtx<'a>, call: &'a Frame<'a>, min: usize, max: usize) -> Result<Self> {
        let n = call.args.len();
        if n < min || n > max {
            let expected = if min == max { format!("{min}") } else { format!("{min} to {max}") };
            return Err(ctx.invalid(format!("expected {expected} arguments, got {n}")));
        }
        Ok(Self { ctx, call })
    }

    fn get(&self, i: usize) -> Option<&'a ArgRef<'a>> {
        self.call.args.get(i)
    }

    fn wrong(&self, i: usize, name: &str, expected: &str) -> Error {
        let got = match self.get(i) {
            None => "nothing",
            Some(ArgRef::None) => "None",
            Some(ArgRef::Tensor(_)) => "a tensor",
            Some(ArgRef::TensorList(_)) => "a tensor list",
            Some(ArgRef::Int(_)) => "an int",
            Some(ArgRef::Float(_)) => "a float",
            Some(ArgRef::Bool(_)) => "a bool",
            Some(ArgRef::Scalar(_)) => "a Scalar",
            Some(ArgRef::IntList(_)) => "an int list",
            Some(ArgRef::FloatList(_)) => "a float list",
            Some(ArgRef::BoolList(_)) => "a bool list",
            Some(ArgRef::Str(_)) => "a string",
        };
        self.ctx.invalid(format!("argument {i} ({name}) must be {expected}, got {got}"))
    }

    pub(crate) fn tensor(&self, i: usize, name: &str) -> Result<&'a TensorRef<'a>> {
        match self.get(i) {
            Some(ArgRef::Tensor(t)) => Ok(t),
            _ => Err(self.wrong(i, name, "a tensor")),
        }
    }

    /// A `Scalar` parameter (int, float and bool values are accepted too).
    pub(crate) fn scalar(&self, i: usize, name: &str, default: Option<Scalar>) -> Result<Scalar> {
        match (self.get(i), default) {
            (Some(ArgRef::Scalar(s)), _) => Ok(*s),
            (Some(ArgRef::Int(v)), _) => Ok(Scalar::Int(*v)),
            (Some(ArgRef::Float(v)), _) => Ok(Scalar::Float(*v)),
            (Some(ArgRef::Bool(v)), _) => Ok(Scalar::Bool(*v)),
            (None, Some(d)) => Ok(d),
            _ => Err(self.wrong(i, name, "a Scalar")),
        }
    }

    pub(crate) fn bool_or(&self, i: usize, name: &str, default: bool) -> Result<bool> {
        match self.get(i) {
            Some(ArgRef::Bool(b)) => Ok(*b),
            Some(ArgRef::Int(v)) if *v == 0 || *v == 1 => Ok(*v == 1),
            None | Some(ArgRef::None) => Ok(default),
            _ => Err(self.wrong(i, name, "a bool")),
        }
    }

    /// A `ScalarType?` parameter.
    pub(crate) fn opt_dtype(&self, i: usize, name: &str) -> Result<Option<DType>> {
        match self.get(i) {
            None | Some(ArgRef::None) => Ok(None),
            Some(ArgRef::Int(n)) => DType::from_scalar_type(*n)
                .map(Some)
                .ok_or_else(|| self.ctx.unimplemented(format!("{name}: ScalarType {n} is not supported"))),
            _ => Err(self.wrong(i, name, "a ScalarType or None")),
        }
    }

    /// An `int[]?` parameter (an int is accepted as a one-element list).
    pub(crate) fn opt_int_list(&self, i: usize, name: &str) -> Result<Option<Vec<i64>>> {
        match self.get(i) {
            None | Some(ArgRef::None) => Ok(None),
            Some(ArgRef::IntList(v)) => Ok(Some(v.to_vec())),
            Some(ArgRef::Int(v)) => Ok(Some(vec![*v])),
            _ => Err(self.wrong(i, name, "an int list or None")),
        }
    }
}

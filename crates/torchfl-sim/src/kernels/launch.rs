//! Operator launches through the Rust API: looking an operator up in the
//! op table, inferring a custom operator's outputs, and validating a
//! kernel's call into work for the runtime to enqueue (the step the ABI's
//! exported kernels share).
//!
//! These are `impl Runtime` blocks of the kernels half: the runtime only
//! enqueues work ([`Runtime::enqueue`]) and knows no operator, so the
//! arrows between the halves all run from here to the runtime.

use std::fmt::Write as _;

use super::call::{ArgRef, TensorRef};
use super::{find, Arg, ArgList, Call, Frame, KernelCtx, KernelFn, OutputList, OutputMeta, TensorArg, OPS};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::activity::Detail;
use crate::runtime::Runtime;

impl Runtime {
    /// The names of all operators this runtime implements.
    pub fn op_names() -> impl Iterator<Item = &'static str> {
        OPS.iter().map(|op| op.name)
    }

    /// The schema (without namespace) of custom operator `op`, as its
    /// op-table entry gives it; `None` for aten and unknown operators.
    pub fn op_schema(op: &str) -> Option<&'static str> {
        find(op).and_then(|def| def.schema)
    }

    /// The dtypes and shapes of the outputs of custom operator `op` (e.g.
    /// `"sim::fused_bias_gelu"`) called with `args`, without running it:
    /// what its op-table entry's `infer_outputs` computes. Tensor data is
    /// never read, so any [`TensorData`](crate::TensorData) will do.
    ///
    /// # Errors
    /// `UNIMPLEMENTED` for an unknown operator, `INVALID_ARGUMENT` for an
    /// aten operator (PyTorch infers those itself) and for the arguments
    /// the operator's kernel would refuse, with the kernel's messages.
    pub fn infer_outputs(op: &str, args: &[Arg]) -> Result<Vec<OutputMeta>> {
        let def =
            find(op).ok_or_else(|| Error::unimplemented(format!("sim: no kernel for operator {op:?}")))?;
        let infer = def.infer.ok_or_else(|| {
            Error::invalid(format!("sim: {op}: not a custom operator, it has no infer function"))
        })?;
        let args: ArgList<'_> = args.iter().map(Arg::to_ref).collect();
        infer(def.name, &args)
    }

    /// Runs operator `op` (e.g. `"add.Tensor"`): validates `call`
    /// synchronously, then enqueues the work on `call.stream`.
    pub fn launch(&self, op: &str, call: &Call) -> Result<()> {
        let def =
            find(op).ok_or_else(|| Error::unimplemented(format!("sim: no kernel for operator {op:?}")))?;
        let args: ArgList<'_> = call.args.iter().map(Arg::to_ref).collect();
        let outputs: OutputList<'_> = call.outputs.iter().map(TensorArg::to_ref).collect();
        let frame = Frame {
            op_name: if call.op_name.is_empty() { def.name } else { &call.op_name },
            device: call.device,
            stream: call.stream,
            args: &args,
            outputs: &outputs,
            rng: call.rng,
            resizer: None,
        };
        self.launch_kernel(def.kernel, &frame)
    }

    /// Validates `frame` with `kernel` and enqueues the resulting work.
    pub(crate) fn launch_kernel(&self, kernel: KernelFn, frame: &Frame<'_>) -> Result<()> {
        let op = frame.op_name;
        self.enqueue(
            frame.device,
            frame.stream,
            op,
            |detail| describe(frame, detail),
            || kernel(&KernelCtx::new(self, frame.device, op), frame),
        )
    }
}

/// A dtype's short name in activity records (`f32`).
fn short_name(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "bool",
        DType::UInt8 => "u8",
        DType::Int8 => "i8",
        DType::Int16 => "i16",
        DType::Int32 => "i32",
        DType::Int64 => "i64",
        DType::Float16 => "f16",
        DType::BFloat16 => "bf16",
        DType::Float32 => "f32",
        DType::Float64 => "f64",
    }
}

/// Writes `t` as `f32[4, 1024]`.
fn describe_tensor(t: &TensorRef<'_>, out: &mut Detail) {
    let _ = write!(out, "{}[", short_name(t.dtype));
    for (i, size) in t.shape.iter().enumerate() {
        let _ = if i == 0 { write!(out, "{size}") } else { write!(out, ", {size}") };
    }
    out.push("]");
}

/// A kernel's activity-record detail: its tensor arguments and outputs,
/// `f32[4096], f32[4096] -> f32[4096]` (a list's tensors in brackets; other
/// arguments left out), truncated to the record's array.
fn describe(frame: &Frame<'_>, out: &mut Detail) {
    let mut first = true;
    let mut sep = |out: &mut Detail| {
        if !std::mem::take(&mut first) {
            out.push(", ");
        }
    };
    for arg in frame.args {
        match arg {
            ArgRef::Tensor(t) => {
                sep(out);
                describe_tensor(t, out);
            }
            ArgRef::TensorList(list) => {
                sep(out);
                out.push("[");
                for (i, t) in list.iter().enumerate() {
                    if i > 0 {
                        out.push(", ");
                    }
                    match t {
                        Some(t) => describe_tensor(t, out),
                        None => out.push("None"),
                    }
                }
                out.push("]");
            }
            _ => {}
        }
    }
    out.push(" ->");
    for (i, t) in frame.outputs.iter().enumerate() {
        out.push(if i == 0 { " " } else { ", " });
        describe_tensor(t, out);
    }
}

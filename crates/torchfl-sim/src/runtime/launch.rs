//! Operator launches through the Rust API: looking an operator up in the
//! op table, inferring a custom operator's outputs, and validating and
//! enqueueing a kernel (the step the ABI's exported kernels share).

use std::time::Instant;

use super::Runtime;
use crate::error::{Error, Result};
use crate::kernels::{self, Arg, ArgList, Call, Frame, KernelCtx, KernelFn, OutputList, TensorArg};
use crate::stream::Work;

impl Runtime {
    /// The names of all operators this runtime implements.
    pub fn op_names() -> impl Iterator<Item = &'static str> {
        kernels::OPS.iter().map(|op| op.name)
    }

    /// The schema (without namespace) of custom operator `op`, as its
    /// op-table entry gives it; `None` for aten and unknown operators.
    pub fn op_schema(op: &str) -> Option<&'static str> {
        kernels::find(op).and_then(|def| def.schema)
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
    pub fn infer_outputs(op: &str, args: &[Arg]) -> Result<Vec<kernels::OutputMeta>> {
        let def = kernels::find(op)
            .ok_or_else(|| Error::unimplemented(format!("sim: no kernel for operator {op:?}")))?;
        let infer = def.infer.ok_or_else(|| {
            Error::invalid(format!("sim: {op}: not a custom operator, it has no infer function"))
        })?;
        let args: ArgList<'_> = args.iter().map(Arg::to_ref).collect();
        infer(def.name, &args)
    }

    /// Runs operator `op` (e.g. `"add.Tensor"`): validates `call`
    /// synchronously, then enqueues the work on `call.stream`.
    pub fn launch(&self, op: &str, call: &Call) -> Result<()> {
        let def = kernels::find(op)
            .ok_or_else(|| Error::unimplemented(format!("sim: no kernel for operator {op:?}")))?;
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
        let d = self
            .device(frame.device)
            .map_err(|e| Error::invalid(format!("sim: {op}: {}", e.message().trim_start_matches("sim: "))))?;
        let device = frame.device;
        // The default stream (the usual case) needs no registry lookup: it
        // lives as long as the runtime and cannot be destroyed.
        let other;
        let stream = if frame.stream.to_raw() == d.default_stream.id() {
            &d.default_stream
        } else {
            other = self.stream_on(frame.stream, device, op)?;
            &other
        };
        let ctx = KernelCtx::new(self, device, op);
        let Some(cost) = &self.cost else {
            if let Some(work) = kernel(&ctx, frame)? {
                stream.submit(work)?;
            }
            return Ok(());
        };
        Self::charge_launch(cost);
        if let Some(work) = kernel(&ctx, frame)? {
            let factor = cost.compute_factor;
            if factor > 1.0 {
                // A slower chip: the worker waits (factor - 1) times what
                // the kernel took.
                stream.submit(Work::new(move || {
                    let start = Instant::now();
                    let outcome = work.run();
                    crate::cost::device_wait(start.elapsed().mul_f64(factor - 1.0));
                    outcome
                }))?;
            } else {
                stream.submit(work)?;
            }
        }
        Ok(())
    }
}

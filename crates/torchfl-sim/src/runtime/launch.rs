//! Enqueueing a launch's work: the runtime's half of a kernel launch, the
//! steps every launch shares whatever its operator (the kernels half builds
//! the work, in `crate::kernels::launch`).

use std::time::Instant;

use super::{Runtime, StreamHandle, Work};
use crate::error::{Error, Result};

impl Runtime {
    /// Finds `stream` of `device`, charges the cost model's launch latency,
    /// runs `prepare` (the launch's synchronous part: a kernel's
    /// validation) and enqueues the work it returns, if any, on the
    /// stream. `op` names the launch in errors.
    ///
    /// `prepare` runs after the lookups, so a bad device or stream is
    /// reported before anything about the call itself.
    pub(crate) fn enqueue(
        &self,
        device: usize,
        stream: StreamHandle,
        op: &str,
        prepare: impl FnOnce() -> Result<Option<Work>>,
    ) -> Result<()> {
        if super::inline_active() {
            // Inside a launched graph, on the stream's worker: run now, in
            // graph order (the graph's launch paid the launch latency).
            self.device(device)?;
            return match prepare()? {
                Some(work) => work.run(),
                None => Ok(()),
            };
        }
        let d = self
            .device(device)
            .map_err(|e| Error::invalid(format!("sim: {op}: {}", e.message().trim_start_matches("sim: "))))?;
        // The default stream (the usual case) needs no registry lookup: it
        // lives as long as the runtime and cannot be destroyed.
        let other;
        let stream = if stream.to_raw() == d.default_stream.id() {
            &d.default_stream
        } else {
            other = self.stream_on(stream, device, op)?;
            &other
        };
        let Some(cost) = &self.cost else {
            if let Some(work) = prepare()? {
                stream.submit(work)?;
            }
            return Ok(());
        };
        Self::charge_launch(cost);
        if let Some(work) = prepare()? {
            let factor = cost.compute_factor;
            if factor > 1.0 {
                // A slower chip: the worker waits (factor - 1) times what
                // the kernel took.
                stream.submit(Work::new(move || {
                    let start = Instant::now();
                    let outcome = work.run();
                    super::cost::device_wait(start.elapsed().mul_f64(factor - 1.0));
                    outcome
                }))?;
            } else {
                stream.submit(work)?;
            }
        }
        Ok(())
    }
}

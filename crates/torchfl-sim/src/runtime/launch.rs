//! Enqueueing a launch's work: the runtime's half of a kernel launch, the
//! steps every launch shares whatever its operator (the kernels half builds
//! the work, in `crate::kernels::launch`).

use std::time::Instant;

use super::activity::Detail;
use super::{Runtime, StreamHandle, Work};
use crate::error::{Error, Result};

impl Runtime {
    /// Finds `stream` of `device`, charges the cost model's launch latency,
    /// runs `prepare` (the launch's synchronous part: a kernel's
    /// validation) and enqueues the work it returns, if any, on the
    /// stream. `op` names the launch in errors and activity records, and
    /// `describe` writes its details (called only while recording).
    ///
    /// `prepare` runs after the lookups, so a bad device or stream is
    /// reported before anything about the call itself.
    pub(crate) fn enqueue(
        &self,
        device: usize,
        stream: StreamHandle,
        op: &str,
        describe: impl FnOnce(&mut Detail),
        prepare: impl FnOnce() -> Result<Option<Work>>,
    ) -> Result<()> {
        if super::inline_active() {
            // Inside a launched graph, on the stream's worker: run now, in
            // graph order (the graph's launch paid the launch latency).
            self.device(device)?;
            let Some(work) = prepare()? else { return Ok(()) };
            if self.activity.kinds() & super::ActivityKind::Kernel.bit() == 0 {
                return work.run();
            }
            let mut detail = Detail::new();
            describe(&mut detail);
            return self.timed_kernel(Self::placement(device, Some(stream)), op, detail, work).run();
        }
        // The one cost of activity records on this path while they are off.
        let kinds = self.activity.kinds();
        if kinds == 0 {
            return self.submit_launch(device, stream, op, prepare, |work| work).map(drop);
        }
        self.enqueue_recorded(kinds, device, stream, op, describe, prepare)
    }

    /// [`Runtime::enqueue`] while activity records are on: an API record
    /// around the submission, a KERNEL record where the work runs.
    #[inline(never)]
    fn enqueue_recorded(
        &self,
        kinds: u32,
        device: usize,
        stream: StreamHandle,
        op: &str,
        describe: impl FnOnce(&mut Detail),
        prepare: impl FnOnce() -> Result<Option<Work>>,
    ) -> Result<()> {
        let api = self.api_begin();
        let at = Self::placement(device, Some(stream));
        let mut detail = Detail::new();
        describe(&mut detail);
        let kernel = kinds & super::ActivityKind::Kernel.bit() != 0;
        let submitted = self.submit_launch(device, stream, op, prepare, |work| {
            if kernel {
                self.timed_kernel(at, op, detail, work)
            } else {
                work
            }
        })?;
        if let (Some(call), true) = (api, submitted) {
            self.api_end(call, "simLaunchKernel", device, stream.to_raw(), |d| {
                d.push(op);
                d.push(" ");
                d.push(detail.as_str());
            });
        }
        Ok(())
    }

    /// The launch proper: lookups, launch latency, `prepare`, and the
    /// submission of its work (through `wrap`, outermost); whether work was
    /// submitted.
    #[inline(always)]
    fn submit_launch(
        &self,
        device: usize,
        stream: StreamHandle,
        op: &str,
        prepare: impl FnOnce() -> Result<Option<Work>>,
        wrap: impl FnOnce(Work) -> Work,
    ) -> Result<bool> {
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
                stream.submit(wrap(work))?;
                return Ok(true);
            }
            return Ok(false);
        };
        Self::charge_launch(cost);
        let Some(work) = prepare()? else { return Ok(false) };
        let factor = cost.compute_factor;
        if factor > 1.0 {
            // A slower chip: the worker waits (factor - 1) times what the
            // kernel took.
            stream.submit(wrap(Work::new(move || {
                let start = Instant::now();
                let outcome = work.run();
                super::cost::device_wait(start.elapsed().mul_f64(factor - 1.0));
                outcome
            })))?;
        } else {
            stream.submit(wrap(work))?;
        }
        Ok(true)
    }
}

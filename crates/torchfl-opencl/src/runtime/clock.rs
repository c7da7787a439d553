//! `activity_clock`: one time of the device's profiling clock and the
//! host's `CLOCK_MONOTONIC` at the same moment, which the host maps device
//! records onto its timeline with.

use std::ptr;
use std::sync::PoisonError;

use super::{Handle, Runtime};
use crate::activity::host_now_ns;
use crate::cl::{self, Cl};
use crate::error::Result;

impl Runtime {
    /// `(device_ns, host_ns)`: a time of `device`'s profiling clock (the
    /// clock of `CL_PROFILING_COMMAND_*`) and the host's `CLOCK_MONOTONIC`
    /// at the same moment, as close as OpenCL lets them be read.
    ///
    /// - With `clGetDeviceAndHostTimer` (OpenCL 2.1, where the driver has a
    ///   host timer): the device time it returns, paired with the midpoint
    ///   of two `CLOCK_MONOTONIC` reads around the call. The call's own host
    ///   time is on the driver's host timer, which OpenCL does not tie to
    ///   `CLOCK_MONOTONIC`, so it is not used; the error is at most half the
    ///   call's duration (microseconds).
    /// - Otherwise (OpenCL 1.2 drivers, and PoCL 3, whose
    ///   `clGetDeviceAndHostTimer` is `CL_INVALID_OPERATION`): a marker is
    ///   enqueued on a profiling queue of the device's own (so no other
    ///   work is waited for), `clFinish`ed, and its `CL_PROFILING_COMMAND_END`
    ///   paired with `CLOCK_MONOTONIC` read right after `clFinish` returns.
    ///   This is an approximation: the host time is late by the time from
    ///   the marker's completion to `clFinish` returning (typically a few
    ///   to tens of microseconds on PoCL), so device records map that much
    ///   early onto the host's timeline.
    pub(crate) fn activity_clock(&self, device: usize) -> Result<(u64, u64)> {
        let id = self.devices[device].id as cl::DeviceId;
        if let Some(timer) = self.cl.get_device_and_host_timer {
            let (mut device_ns, mut timer_host_ns) = (0u64, 0u64);
            let before = host_now_ns();
            // SAFETY: a device of the context; both outputs are writable
            // cl_ulongs.
            let status = unsafe { timer(id, &mut device_ns, &mut timer_host_ns) };
            let after = host_now_ns();
            if status == cl::SUCCESS && device_ns != 0 {
                return Ok((device_ns, before + after.saturating_sub(before) / 2));
            }
        }
        self.marker_clock(device)
    }

    /// The fallback of [`activity_clock`](Self::activity_clock): a marker's
    /// end on the device's clock queue and the host time after `clFinish`.
    fn marker_clock(&self, device: usize) -> Result<(u64, u64)> {
        let cl = self.cl;
        // Held throughout: one clock reading at a time per device.
        let mut slot = self.devices[device].clock_queue.lock().unwrap_or_else(PoisonError::into_inner);
        let queue: Handle = match *slot {
            Some(queue) => queue,
            None => *slot.insert(self.create_queue(self.devices[device].id)?),
        };
        let queue = queue as cl::Queue;
        let mut event: cl::Event = ptr::null_mut();
        // SAFETY: the clock queue is live (never released); `event`
        // receives a new event.
        let status = unsafe { (cl.enqueue_marker_with_wait_list)(queue, 0, ptr::null(), &mut event) };
        Cl::check(status, "clEnqueueMarkerWithWaitList", "activity_clock")?;
        let event = event as Handle;
        // SAFETY: a live queue.
        let status = unsafe { (cl.finish)(queue) };
        let host_ns = host_now_ns();
        let end = Cl::check(status, "clFinish", "activity_clock").and_then(|()| {
            // SAFETY: a completed marker of a profiling queue; a cl_ulong.
            unsafe {
                Cl::info_value::<_, u64>(
                    cl.get_event_profiling_info,
                    event as cl::Event,
                    cl::PROFILING_COMMAND_END,
                    "clGetEventProfilingInfo",
                )
            }
        });
        // SAFETY: the marker's event, released once.
        unsafe { (cl.release_event)(event as cl::Event) };
        Ok((end?, host_ns))
    }
}

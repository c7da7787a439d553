//! Streams and events: in-order queues, and markers with the device's
//! profiling timestamps.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Handle, Runtime};
use crate::activity::{Site, RECORDER};
use crate::cl::{self, Cl};
use crate::error::{Error, Result};

/// A stream: an in-order queue with profiling on (event timing needs it).
#[derive(Debug)]
pub struct Stream {
    pub(crate) device: usize,
    pub(crate) queue: Handle,
    pub(super) default: bool,
    pub(super) progress: Arc<Progress>,
}

/// What is known of a queue's progress. OpenCL cannot ask a queue whether
/// it is idle; a marker can be asked, but a fresh marker is itself pending
/// for a moment. So commands are counted as they are enqueued, a finish
/// marks everything before it done, and a query keeps its marker (tagged
/// with the count it covers) to ask again next time instead of enqueueing
/// another: a synchronized stream queries as idle at once, and a busy one
/// as idle once its last marker has run.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Commands enqueued so far.
    submitted: AtomicU64,
    /// A count of commands known to have completed.
    completed: AtomicU64,
    /// The last query's marker and the count it covers.
    marker: Mutex<Option<(u64, Handle)>>,
}

impl Stream {
    /// Notes that a command was enqueued on the stream's queue.
    pub(crate) fn submitted(&self) {
        self.progress.submitted.fetch_add(1, Ordering::AcqRel);
    }

    /// The `TFL_Stream*` the host knows this stream by, as an address (the
    /// stream is boxed: it does not move).
    pub(crate) fn handle(&self) -> usize {
        self as *const Self as usize
    }
}

/// An event: the marker it last captured, if any.
#[derive(Debug)]
pub struct Event {
    device: usize,
    timing: bool,
    marker: Mutex<Option<Handle>>,
}

impl Runtime {
    // -----------------------------------------------------------------
    // Streams and synchronization
    // -----------------------------------------------------------------

    /// The stream to run on: the given one, or for NULL ("synchronous") the
    /// default stream after every queue of the device has finished; and
    /// whether the call must wait for its work (NULL).
    pub(crate) fn queue_for<'a>(
        &'a self,
        device: usize,
        stream: Option<&'a Stream>,
    ) -> Result<(&'a Stream, bool)> {
        match stream {
            Some(s) if s.device != device => Err(Error::invalid(format!(
                "opencl: a stream of device {} was given for work on device {device}",
                s.device
            ))),
            Some(s) => {
                s.submitted();
                Ok((s, false))
            }
            None => {
                self.synchronize_device(device)?;
                Ok((&self.devices[device].default_stream, true))
            }
        }
    }

    /// Waits for every queue of the device.
    pub fn synchronize_device(&self, device: usize) -> Result<()> {
        let queues = self.devices[device].queues.lock().unwrap_or_else(PoisonError::into_inner);
        for (queue, progress, stream) in queues.iter() {
            self.finish(*queue, progress, (device, *stream), format_args!("device {device}"))?;
        }
        Ok(())
    }

    /// `clFinish`, and what it proves about the queue's progress. `at` is
    /// (device, `TFL_Stream*`) for the activity records, `what` their detail.
    pub(super) fn finish(
        &self,
        queue: Handle,
        progress: &Progress,
        (device, stream): (usize, usize),
        what: std::fmt::Arguments<'_>,
    ) -> Result<()> {
        let before = progress.submitted.load(Ordering::Acquire);
        let status = RECORDER.wait(Site { call: "clFinish", device, stream, detail: what }, || {
            // SAFETY: the caller keeps the queue live.
            unsafe { (self.cl.finish)(queue as cl::Queue) }
        });
        Cl::check(status, "clFinish", what)?;
        progress.completed.fetch_max(before, Ordering::AcqRel);
        Ok(())
    }

    /// `clFinish` on `stream`'s queue.
    pub(crate) fn finish_stream(&self, stream: &Stream, what: std::fmt::Arguments<'_>) -> Result<()> {
        self.finish(stream.queue, &stream.progress, (stream.device, stream.handle()), what)
    }

    /// The device's default stream.
    pub fn default_stream(&self, device: usize) -> &Stream {
        &self.devices[device].default_stream
    }

    /// A new in-order queue on `device`.
    pub fn create_stream(&self, device: usize) -> Result<Box<Stream>> {
        let queue = self.create_queue(self.devices[device].id)?;
        let progress = Arc::new(Progress::default());
        let stream = Box::new(Stream { device, queue, default: false, progress: progress.clone() });
        self.devices[device].queues.lock().unwrap_or_else(PoisonError::into_inner).push((
            queue,
            progress,
            stream.handle(),
        ));
        Ok(stream)
    }

    /// Releases a stream made by [`create_stream`](Self::create_stream);
    /// work already queued still runs (releasing a queue flushes it).
    pub fn destroy_stream(&self, stream: Box<Stream>) -> Result<()> {
        if stream.default {
            // Never freed: the box is owned by the device.
            std::mem::forget(stream);
            return Err(Error::invalid("opencl: stream_destroy: a default stream cannot be destroyed"));
        }
        self.devices[stream.device]
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(q, _, _)| *q != stream.queue);
        if let Some((_, marker)) =
            stream.progress.marker.lock().unwrap_or_else(PoisonError::into_inner).take()
        {
            // SAFETY: the stream owned its query marker.
            unsafe { (self.cl.release_event)(marker as cl::Event) };
        }
        // SAFETY: the queue is released once; it is no longer listed.
        Cl::check(
            unsafe { (self.cl.release_command_queue)(stream.queue as cl::Queue) },
            "clReleaseCommandQueue",
            "",
        )
    }

    /// Waits for the stream's work.
    pub fn synchronize_stream(&self, stream: &Stream) -> Result<()> {
        self.finish_stream(stream, format_args!("stream_synchronize"))
    }

    /// Whether the stream's work has all run (see [`Progress`]).
    pub fn query_stream(&self, stream: &Stream) -> Result<bool> {
        let p = &stream.progress;
        let submitted = p.submitted.load(Ordering::Acquire);
        if p.completed.load(Ordering::Acquire) >= submitted {
            return Ok(true);
        }
        let mut slot = p.marker.lock().unwrap_or_else(PoisonError::into_inner);
        let marker = match *slot {
            Some((covers, marker)) if covers == submitted => marker,
            stale => {
                if let Some((_, old)) = stale {
                    // SAFETY: the stream owned the stale marker.
                    unsafe { (self.cl.release_event)(old as cl::Event) };
                }
                let marker = self.marker(stream, "stream_query")?;
                *slot = Some((submitted, marker));
                marker
            }
        };
        let done = self.event_complete(marker)?;
        if done {
            p.completed.fetch_max(submitted, Ordering::AcqRel);
        }
        Ok(done)
    }

    fn marker(&self, stream: &Stream, what: &str) -> Result<Handle> {
        let queue = stream.queue;
        let mut event: cl::Event = ptr::null_mut();
        let status = RECORDER.call(
            Site {
                call: "clEnqueueMarkerWithWaitList",
                device: stream.device,
                stream: stream.handle(),
                detail: format_args!("{what}"),
            },
            || {
                // SAFETY: the queue is live; `event` receives a new event.
                unsafe {
                    (self.cl.enqueue_marker_with_wait_list)(queue as cl::Queue, 0, ptr::null(), &mut event)
                }
            },
        );
        Cl::check(status, "clEnqueueMarkerWithWaitList", "")?;
        // A marker must reach the device to complete: flush, as CUDA's
        // record does implicitly.
        // SAFETY: as above.
        Cl::check(unsafe { (self.cl.flush)(queue as cl::Queue) }, "clFlush", "")?;
        Ok(event as Handle)
    }

    fn event_complete(&self, event: Handle) -> Result<bool> {
        // SAFETY: a live event; CL_EVENT_COMMAND_EXECUTION_STATUS is a cl_int.
        let status: i32 = unsafe {
            Cl::info_value(
                self.cl.get_event_info,
                event as cl::Event,
                cl::EVENT_COMMAND_EXECUTION_STATUS,
                "clGetEventInfo",
            )
        }?;
        if status < 0 {
            return Err(Error::cl("a queued command", "reported by its event", status));
        }
        Ok(status == cl::COMPLETE)
    }

    /// Later work on `stream` waits for `event`'s capture.
    pub fn stream_wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        let Some(marker) = *event.marker.lock().unwrap_or_else(PoisonError::into_inner) else {
            return Ok(()); // never recorded: complete
        };
        let list = [marker as cl::Event];
        stream.submitted();
        let status = RECORDER.call(
            Site {
                call: "clEnqueueBarrierWithWaitList",
                device: stream.device,
                stream: stream.handle(),
                detail: format_args!("stream_wait_event"),
            },
            || {
                // SAFETY: the queue and the marker are live; no event out.
                unsafe {
                    (self.cl.enqueue_barrier_with_wait_list)(
                        stream.queue as cl::Queue,
                        1,
                        list.as_ptr(),
                        ptr::null_mut(),
                    )
                }
            },
        );
        Cl::check(status, "clEnqueueBarrierWithWaitList", "stream_wait_event")
    }

    // -----------------------------------------------------------------
    // Events
    // -----------------------------------------------------------------

    /// A new event on `device`.
    pub fn create_event(&self, device: usize, timing: bool) -> Box<Event> {
        Box::new(Event { device, timing, marker: Mutex::new(None) })
    }

    /// Releases an event's marker.
    pub fn destroy_event(&self, event: &Event) {
        if let Some(marker) = event.marker.lock().unwrap_or_else(PoisonError::into_inner).take() {
            // SAFETY: the event owns its marker.
            unsafe { (self.cl.release_event)(marker as cl::Event) };
        }
    }

    /// Captures the work queued on `stream` so far.
    pub fn record_event(&self, event: &Event, stream: &Stream) -> Result<()> {
        if event.device != stream.device {
            return Err(Error::invalid(format!(
                "opencl: event_record: an event of device {} recorded on a stream of device {}",
                event.device, stream.device
            )));
        }
        stream.submitted();
        let marker = self.marker(stream, "event_record")?;
        let old = event.marker.lock().unwrap_or_else(PoisonError::into_inner).replace(marker);
        if let Some(old) = old {
            // SAFETY: the event owned the replaced marker.
            unsafe { (self.cl.release_event)(old as cl::Event) };
        }
        Ok(())
    }

    /// Whether the captured work has run (an event never recorded has).
    pub fn query_event(&self, event: &Event) -> Result<bool> {
        match *event.marker.lock().unwrap_or_else(PoisonError::into_inner) {
            None => Ok(true),
            Some(marker) => self.event_complete(marker),
        }
    }

    /// Waits for the captured work.
    pub fn synchronize_event(&self, event: &Event) -> Result<()> {
        let Some(marker) = *event.marker.lock().unwrap_or_else(PoisonError::into_inner) else {
            return Ok(());
        };
        let list = [marker as cl::Event];
        let status = RECORDER.wait(
            Site {
                call: "clWaitForEvents",
                device: event.device,
                stream: 0,
                detail: format_args!("event_synchronize"),
            },
            || {
                // SAFETY: a live event.
                unsafe { (self.cl.wait_for_events)(1, list.as_ptr()) }
            },
        );
        Cl::check(status, "clWaitForEvents", "event_synchronize")
    }

    /// Milliseconds between two completed timing events, from the device's
    /// profiling clock (`CL_PROFILING_COMMAND_END` of their markers).
    pub fn elapsed_ms(&self, start: &Event, end: &Event) -> Result<f32> {
        if !start.timing || !end.timing {
            return Err(Error::precondition(
                "opencl: event_elapsed_time: both events must be created with timing (TFL_EVENT_TIMING)",
            ));
        }
        let stamp = |e: &Event, which: &str| -> Result<u64> {
            let marker = (*e.marker.lock().unwrap_or_else(PoisonError::into_inner)).ok_or_else(|| {
                Error::precondition(format!(
                    "opencl: event_elapsed_time: the {which} event was never recorded"
                ))
            })?;
            if !self.event_complete(marker)? {
                return Err(Error::precondition(format!(
                    "opencl: event_elapsed_time: the {which} event has not completed; synchronize it first"
                )));
            }
            // SAFETY: a completed marker of a profiling queue; the value is a cl_ulong.
            unsafe {
                Cl::info_value(
                    self.cl.get_event_profiling_info,
                    marker as cl::Event,
                    cl::PROFILING_COMMAND_END,
                    "clGetEventProfilingInfo",
                )
            }
        };
        let (a, b) = (stamp(start, "start")?, stamp(end, "end")?);
        Ok(((b as i128 - a as i128) as f64 / 1e6) as f32)
    }
}

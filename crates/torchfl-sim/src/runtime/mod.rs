//! The simulator's runtime, the half below the kernels: devices, memory,
//! streams, events, copies and collectives, as a safe Rust API. It knows
//! work ([`Work`], a closure to run in stream order), never operators: the
//! kernels half ([`crate::kernels`]) validates an operator call into work
//! and hands it to [`Runtime::enqueue`] (its `Runtime::launch` is an
//! `impl Runtime` block of that half), so every arrow between the two runs
//! from the kernels to here.
//!
//! Its parts, bottom up:
//! - [`config`] (the options and `TORCH_FL_SIM_*` keys) and [`cost`] (what
//!   allocation, launches, copies and compute are charged);
//! - `small` (inline vectors for shapes and strides) and `work` (a job
//!   stored inline in a queue slot);
//! - `queue` (a stream's lock-free queue) and `stream` (streams, fences,
//!   events and the device's sticky asynchronous error);
//! - [`memory`]: a device's allocator, with its capacity, statistics,
//!   stream-ordered frees and strict mode;
//! - [`Runtime`] (this module): the devices, the stream and event
//!   registries, and the services over them in files of their own, each a
//!   further `impl Runtime` block: copies (`copy`), pinned host memory
//!   (`host_memory`) and enqueueing work (`launch`);
//! - [`collectives`]: communicators and their operations over TCP, enqueued
//!   on the runtime's streams.
//! - [`activity`]: activity records (ABI 1.8) of the calls' submissions and
//!   of the device work, on the simulator's own device clock, and user
//!   ranges.
//!
//! [`Runtime`] is what the C ABI in [`crate::abi`] drives (through one
//! process-wide instance) and what Rust code and tests can use directly:
//! every instance is independent, so tests can run many differently
//! configured simulators in one process.
//!
//! Streams and events are named by opaque handles ([`StreamHandle`],
//! [`EventHandle`]) that are looked up in a registry on every use instead of
//! being dereferenced. A handle the host made up, or one that was destroyed,
//! is thus an `INVALID_ARGUMENT` error rather than a crash, and handles are
//! never reused, so a stale one cannot silently name a newer object.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::error::{Error, Result};
// Re-exported: the logger's public path was `runtime::` before it moved.
pub use crate::log::{LogLevel, Logger};

pub mod activity;
pub mod collectives;
pub mod config;
pub mod cost;
pub mod memory;
pub(crate) mod queue;
pub(crate) mod small;
pub(crate) mod stream;
pub(crate) mod work;

mod copy;
mod graph;
mod host_memory;
mod launch;

use config::{Config, Mode};
use cost::CostModel;
use memory::{DeviceMemory, MemoryStats, ALIGNMENT};
use stream::{lock, ErrorSink, Event, Fence, Stream};

pub use activity::{ActivityKind, ActivityRecord};
pub use copy::{CopyKind, RawCopy};
pub(crate) use graph::inline_active;
pub use host_memory::HostMemoryStats;
pub(crate) use work::Work;

/// Handles are unique across all runtimes of the process and never reused.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

fn next_id() -> NonZeroU64 {
    // Spaced by 16 so that handles look like (aligned) pointers in a debugger.
    let n = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) << 4;
    NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN)
}

/// Names a stream of a [`Runtime`]; crosses the ABI as `TFL_Stream*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamHandle(NonZeroU64);

/// Names an event of a [`Runtime`]; crosses the ABI as `TFL_Event*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHandle(NonZeroU64);

macro_rules! handle_raw {
    ($t:ident) => {
        impl $t {
            /// The handle's opaque value.
            pub fn to_raw(self) -> u64 {
                self.0.get()
            }
            /// A handle from an opaque value; `None` for 0. Whether it names
            /// a live object is checked when it is used.
            pub fn from_raw(raw: u64) -> Option<Self> {
                NonZeroU64::new(raw).map(Self)
            }
        }
    };
}
handle_raw!(StreamHandle);
handle_raw!(EventHandle);

/// What `device_properties` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProperties {
    /// Marketing name.
    pub name: &'static str,
    /// Capacity in bytes.
    pub total_memory: u64,
    /// The host threads kernels are spread over.
    pub compute_units: i32,
    /// Alignment of allocations in bytes.
    pub memory_alignment: u32,
    /// Architecture revision `(major, minor)` (ABI 1.2).
    pub capability: (i32, i32),
}

/// The device name reported by `device_properties`.
pub const DEVICE_NAME: &str = "torch-fl simulated accelerator";

/// The architecture revision reported by `device_properties`: the
/// simulator's first (and only) generation.
pub const CAPABILITY: (i32, i32) = (1, 0);

pub(crate) struct Device {
    memory: DeviceMemory,
    default_stream: Arc<Stream>,
    /// Every stream of the device that may still have work: live ones and
    /// destroyed ones that have not drained yet.
    streams: Mutex<Vec<Arc<Stream>>>,
    /// How many of `streams` are not the default stream; changed under the
    /// `streams` lock. While it is 0 (a host that never made a stream), the
    /// snapshot of a free needs no lock.
    other_streams: AtomicUsize,
    sink: Arc<ErrorSink>,
}

/// One simulated accelerator runtime with `config.devices` devices.
pub struct Runtime {
    config: Config,
    devices: Vec<Device>,
    streams: RwLock<HashMap<StreamHandle, Arc<Stream>>>,
    events: RwLock<HashMap<EventHandle, Arc<Event>>>,
    log: Option<Logger>,
    /// `None` when nothing costs anything: each charging point is then one
    /// branch on this field.
    cost: Option<CostModel>,
    pinned: host_memory::PinnedRegistry,
    graphs: graph::Graphs,
    /// Activity records (ABI 1.8); shared with the work that records
    /// itself where it runs.
    activity: Arc<activity::Recorder>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("config", &self.config).finish_non_exhaustive()
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}
fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Runtime {
    /// Starts a runtime: one allocator and one default stream per device.
    pub fn new(config: Config) -> Result<Self> {
        Self::with_logger(config, None)
    }

    /// Like [`Runtime::new`], sending warnings to `log`.
    pub fn with_logger(config: Config, log: Option<Logger>) -> Result<Self> {
        if config.devices > config::MAX_DEVICES {
            return Err(Error::invalid(format!(
                "sim: at most {} devices are supported",
                config::MAX_DEVICES
            )));
        }
        let mut rt = Self {
            config: config.clone(),
            devices: Vec::with_capacity(config.devices),
            streams: RwLock::new(HashMap::new()),
            events: RwLock::new(HashMap::new()),
            log,
            cost: (!config.cost.is_off()).then_some(config.cost),
            pinned: host_memory::PinnedRegistry::default(),
            graphs: graph::Graphs::default(),
            activity: activity::new_recorder(),
        };
        for index in 0..config.devices {
            let sink = Arc::new(ErrorSink::default());
            let id = next_id();
            let default_stream =
                Stream::new(id.get(), index, true, config.mode, Arc::clone(&sink), rt.log.clone())?;
            write(&rt.streams).insert(StreamHandle(id), Arc::clone(&default_stream));
            rt.devices.push(Device {
                memory: DeviceMemory::new(index, config.memory, config.strict),
                streams: Mutex::new(vec![Arc::clone(&default_stream)]),
                other_streams: AtomicUsize::new(0),
                default_stream,
                sink,
            });
        }
        Ok(rt)
    }

    /// The configuration the runtime was started with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// `TFL_CAP_*` bits this runtime honours.
    pub fn capabilities(&self) -> u64 {
        capabilities(&self.config)
    }

    /// Number of devices.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    pub(crate) fn device(&self, device: usize) -> Result<&Device> {
        self.devices.get(device).ok_or_else(|| {
            Error::invalid(format!(
                "sim: device {device} out of range (device_count = {})",
                self.devices.len()
            ))
        })
    }

    /// Validates a device index coming from the ABI (an `i32`).
    pub fn check_device(&self, device: i64) -> Result<usize> {
        usize::try_from(device).ok().filter(|&d| d < self.devices.len()).ok_or_else(|| {
            Error::invalid(format!(
                "sim: device {device} out of range (device_count = {})",
                self.devices.len()
            ))
        })
    }

    /// The properties of `device`.
    pub fn device_properties(&self, device: usize) -> Result<DeviceProperties> {
        self.device(device)?;
        let units = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(DeviceProperties {
            name: DEVICE_NAME,
            total_memory: self.config.memory,
            compute_units: i32::try_from(units).unwrap_or(i32::MAX),
            memory_alignment: ALIGNMENT as u32,
            capability: CAPABILITY,
        })
    }

    /// Fences on the unfinished work of every stream of `device`, dropping
    /// destroyed streams that have drained.
    fn device_fences(&self, device: &Device) -> Vec<Fence> {
        let mut fences = Vec::new();
        self.device_fences_into(device, &mut fences);
        fences
    }

    /// Appends to `out` fences on the unfinished work of every stream of
    /// `device` (and perhaps on work that has just finished), dropping
    /// destroyed streams that have drained.
    fn device_fences_into(&self, device: &Device, out: &mut Vec<Fence>) {
        if device.other_streams.load(Ordering::Acquire) == 0 {
            // Only the default stream, which lives as long as the runtime.
            if device.default_stream.maybe_busy() {
                out.push(device.default_stream.fence());
            }
            return;
        }
        let mut streams = lock(&device.streams);
        streams.retain(|s| s.is_default() || !s.is_retired());
        device.other_streams.store(streams.len() - 1, Ordering::Release);
        out.extend(streams.iter().filter(|s| s.maybe_busy()).map(|s| s.fence()));
    }

    /// Waits for all work submitted to every stream of `device` (without
    /// reporting errors).
    pub(crate) fn drain_device(&self, device: &Device) {
        for fence in self.device_fences(device) {
            fence.wait();
        }
        device.memory.sweep();
    }

    /// Waits for all work on every stream of `device`, then reports the
    /// first asynchronous failure since the last report, if any.
    pub fn synchronize_device(&self, device: usize) -> Result<()> {
        let d = self.device(device)?;
        let sync = self.sync_begin();
        self.drain_device(d);
        if let Some(start) = sync {
            self.sync_end(start, "simDeviceSynchronize", device, 0, format_args!("device {device}"));
        }
        d.sink.take()
    }

    // ----------------------------------------------------------------- memory

    /// Allocates `nbytes` on `device`; returns the pointer the host sees
    /// (tagged in strict mode).
    pub fn allocate(&self, device: usize, nbytes: usize) -> Result<u64> {
        let d = self.device(device)?;
        let Some(cost) = &self.cost else {
            return d.memory.allocate(nbytes);
        };
        self.charge_allocate(cost, d);
        if !self.config.self_caching {
            return d.memory.allocate(nbytes);
        }
        let before = d.memory.heap_allocations();
        let ptr = d.memory.allocate(nbytes)?;
        if d.memory.heap_allocations() != before {
            Self::charge_pool_miss(cost);
        }
        Ok(ptr)
    }

    /// Stream-ordered free: the memory is reused only once all work
    /// submitted so far (to any stream of any device) has completed. A null
    /// pointer is a no-op.
    pub fn deallocate(&self, device: usize, ptr: u64) -> Result<()> {
        let d = self.device(device)?;
        if ptr == 0 {
            return Ok(());
        }
        if let Some(cost) = &self.cost {
            self.charge_deallocate(cost, d);
        }
        // Work on another device's stream can touch this device's memory
        // (a cross-device copy runs on the source device's stream), so the
        // snapshot covers every device.
        d.memory.deallocate(ptr, |fences| {
            for device in &self.devices {
                self.device_fences_into(device, fences);
            }
        })
    }

    /// The memory statistics of `device`.
    pub fn memory_stats(&self, device: usize) -> Result<MemoryStats> {
        Ok(self.device(device)?.memory.stats())
    }

    /// Sets the peak to the current allocation.
    pub fn reset_peak_memory_stats(&self, device: usize) -> Result<()> {
        self.device(device)?.memory.reset_peak();
        Ok(())
    }

    /// Gives the cached blocks (freed blocks whose work is done) back to
    /// the host heap.
    pub fn empty_cache(&self, device: usize) -> Result<()> {
        self.device(device)?.memory.empty_cache();
        Ok(())
    }

    /// Resolves `[ptr + lo, ptr + hi)` on `device` to the real address of
    /// `ptr`, checking that the range lies in one live allocation.
    ///
    /// `what` names the range in error messages; it is formatted only on
    /// failure.
    pub(crate) fn resolve(
        &self,
        device: usize,
        ptr: u64,
        lo: i128,
        hi: i128,
        what: &dyn std::fmt::Display,
    ) -> Result<usize> {
        let d = self.device(device)?;
        d.memory.resolve(ptr, lo, hi, what).map_err(|e| {
            match (0..self.devices.len()).find(|&o| o != device && self.devices[o].memory.owns(ptr)) {
                Some(owner) => {
                    Error::invalid(format!("{} (the pointer belongs to device {owner})", e.message()))
                }
                None => e,
            }
        })
    }

    // ---------------------------------------------------------------- streams

    pub(crate) fn stream(&self, handle: StreamHandle) -> Result<Arc<Stream>> {
        read(&self.streams).get(&handle).cloned().ok_or_else(|| {
            Error::invalid(format!(
                "sim: unknown stream handle {:#x} (never created or already destroyed)",
                handle.to_raw()
            ))
        })
    }

    pub(crate) fn stream_on(&self, handle: StreamHandle, device: usize, what: &str) -> Result<Arc<Stream>> {
        let s = self.stream(handle)?;
        if s.device() != device {
            return Err(Error::invalid(format!(
                "sim: {what}: stream {:#x} belongs to device {}, not device {device}",
                handle.to_raw(),
                s.device()
            )));
        }
        Ok(s)
    }

    /// The default stream of `device`.
    pub fn default_stream(&self, device: usize) -> Result<StreamHandle> {
        let id = self.device(device)?.default_stream.id();
        StreamHandle::from_raw(id).ok_or_else(|| Error::internal("sim: default stream id is 0"))
    }

    /// Creates a stream on `device`. Priorities are accepted and ignored.
    pub fn create_stream(&self, device: usize, _priority: i32) -> Result<StreamHandle> {
        let d = self.device(device)?;
        let id = next_id();
        let s =
            Stream::new(id.get(), device, false, self.config.mode, Arc::clone(&d.sink), self.log.clone())?;
        {
            let mut streams = lock(&d.streams);
            streams.push(Arc::clone(&s));
            // Before the handle exists: work submitted to the stream
            // happens after the count includes it.
            d.other_streams.store(streams.len() - 1, Ordering::Release);
        }
        write(&self.streams).insert(StreamHandle(id), s);
        Ok(StreamHandle(id))
    }

    /// Destroys a stream: it stops accepting work, and work already queued
    /// still runs on its (now detached) worker thread.
    pub fn destroy_stream(&self, handle: StreamHandle) -> Result<()> {
        let mut streams = write(&self.streams);
        let s = streams.get(&handle).cloned().ok_or_else(|| {
            Error::invalid(format!("sim: stream_destroy: unknown stream handle {:#x}", handle.to_raw()))
        })?;
        if s.is_default() {
            return Err(Error::invalid(format!(
                "sim: stream_destroy: the default stream of device {} cannot be destroyed",
                s.device()
            )));
        }
        streams.remove(&handle);
        drop(streams);
        s.close();
        s.detach();
        Ok(())
    }

    /// Waits for the stream's work and reports its device's first
    /// asynchronous failure, if any.
    pub fn synchronize_stream(&self, handle: StreamHandle) -> Result<()> {
        let s = self.stream(handle)?;
        let sync = self.sync_begin();
        s.synchronize();
        if let Some(start) = sync {
            let raw = handle.to_raw();
            self.sync_end(start, "simStreamSynchronize", s.device(), raw, format_args!("stream {raw:#x}"));
        }
        let d = self.device(s.device())?;
        d.memory.sweep();
        d.sink.take()
    }

    /// Whether all work submitted to the stream has run.
    pub fn query_stream(&self, handle: StreamHandle) -> Result<bool> {
        Ok(self.stream(handle)?.is_idle())
    }

    /// Makes work submitted to `stream` after this call wait for `event` (as
    /// last recorded), without blocking the caller.
    pub fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()> {
        let s = self.stream(stream)?;
        let e = self.event(event)?;
        match e.fence() {
            Some(fence) if !fence.is_complete() && !Arc::ptr_eq(fence.stream(), &s) => {
                let api = self.api_begin();
                s.submit(Work::new(move || {
                    fence.wait();
                    Ok(())
                }))?;
                if let Some(call) = api {
                    self.api_event(call, "simStreamWaitEvent", s.device(), stream, event);
                }
            }
            // Never recorded, already complete, or earlier on the same
            // in-order stream: nothing to wait for.
            _ => {}
        }
        Ok(())
    }

    // ----------------------------------------------------------------- events

    fn event(&self, handle: EventHandle) -> Result<Arc<Event>> {
        read(&self.events).get(&handle).cloned().ok_or_else(|| {
            Error::invalid(format!(
                "sim: unknown event handle {:#x} (never created or already destroyed)",
                handle.to_raw()
            ))
        })
    }

    /// Creates an event; `timing` enables [`Runtime::elapsed_time`].
    pub fn create_event(&self, device: usize, timing: bool) -> Result<EventHandle> {
        self.device(device)?;
        let id = next_id();
        write(&self.events).insert(EventHandle(id), Arc::new(Event::new(device, timing)));
        Ok(EventHandle(id))
    }

    /// Destroys an event; pending waits on it are unaffected.
    pub fn destroy_event(&self, handle: EventHandle) -> Result<()> {
        write(&self.events).remove(&handle).map(drop).ok_or_else(|| {
            Error::invalid(format!("sim: event_destroy: unknown event handle {:#x}", handle.to_raw()))
        })
    }

    /// Captures the work submitted to `stream` so far.
    pub fn record_event(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        let e = self.event(event)?;
        let s = self.stream_on(stream, e.device(), "event_record")?;
        let api = self.api_begin();
        e.record(&s)?;
        if let Some(call) = api {
            self.api_event(call, "simEventRecord", e.device(), stream, event);
        }
        Ok(())
    }

    /// Whether the recorded work has run (true when never recorded).
    pub fn query_event(&self, event: EventHandle) -> Result<bool> {
        Ok(self.event(event)?.is_complete())
    }

    /// Waits for the recorded work; reports the device's first asynchronous
    /// failure, if any.
    pub fn synchronize_event(&self, event: EventHandle) -> Result<()> {
        let e = self.event(event)?;
        let sync = self.sync_begin();
        e.synchronize();
        if let Some(start) = sync {
            let raw = event.to_raw();
            self.sync_end(start, "simEventSynchronize", e.device(), 0, format_args!("event {raw:#x}"));
        }
        let d = self.device(e.device())?;
        d.memory.sweep();
        d.sink.take()
    }

    /// Milliseconds between two completed timing events.
    pub fn elapsed_time(&self, start: EventHandle, end: EventHandle) -> Result<f32> {
        Event::elapsed_ms(&*self.event(start)?, &*self.event(end)?)
    }
}

/// The `TFL_CAP_*` bits a runtime with `config` honours.
pub fn capabilities(config: &Config) -> u64 {
    let mut caps =
        torchfl_ffi::TFL_CAP_EVENT_TIMING | torchfl_ffi::TFL_CAP_FLOAT16 | torchfl_ffi::TFL_CAP_BFLOAT16;
    if config.mode == Mode::Async {
        caps |= torchfl_ffi::TFL_CAP_ASYNC_STREAMS;
    }
    if !config.strict {
        caps |= torchfl_ffi::TFL_CAP_HOST_ADDRESSABLE_MEMORY;
    }
    if config.self_caching {
        caps |= torchfl_ffi::TFL_CAP_CACHING_ALLOCATOR;
    }
    caps
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Drain every stream before the allocators free their blocks, so no
        // worker can touch freed memory, then join the attached workers.
        for d in &self.devices {
            let streams: Vec<Arc<Stream>> = lock(&d.streams).clone();
            for s in &streams {
                s.close();
            }
            for s in &streams {
                s.synchronize();
                s.join();
            }
        }
    }
}

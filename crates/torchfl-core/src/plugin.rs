//! A loaded, initialized plugin and safe handles to what it owns: device
//! memory, streams and events.
//!
//! The handles release what they own when dropped and keep their plugin
//! alive through an `Arc`, so a handle can never outlive the function table
//! it calls through.

use std::ffi::{c_void, CStr};
use std::fmt;
use std::path::Path;
use std::ptr;
use std::sync::Arc;

use torchfl_ffi::*;

use crate::error::{Error, PluginStatus, Result, StatusCode};
use crate::ffi::{ApiTable, DeviceCall, EventCall, StreamCall};
use crate::open::PluginLibrary;
use crate::types::Finding;
pub use crate::types::{Capabilities, DeviceProperties, MemoryStats, OpKernel, PluginInfo};
use crate::version::Negotiated;

/// An initialized plugin.
#[derive(Debug)]
pub struct Plugin {
    library: PluginLibrary,
    device_count: i32,
    init_options: String,
    warnings: Vec<Finding>,
    /// The label as the in-flight record names the plugin.
    c_label: &'static std::ffi::CStr,
    /// The collectives table (ABI 1.3), when the plugin offers one.
    pub(crate) collectives: Option<crate::ffi::CollTable>,
    /// The graphs table (ABI 1.7), validated, when the plugin offers one.
    graphs: Option<torchfl_ffi::TFL_Graphs>,
    /// The activity table (ABI 1.8), validated, when the plugin offers one.
    activity: Option<torchfl_ffi::TFL_Activity>,
}

impl Plugin {
    pub(crate) fn new(
        library: PluginLibrary,
        device_count: i32,
        init_options: String,
        warnings: Vec<Finding>,
        collectives: Option<crate::ffi::CollTable>,
        graphs: Option<torchfl_ffi::TFL_Graphs>,
        activity: Option<torchfl_ffi::TFL_Activity>,
    ) -> Self {
        let c_label = crate::inflight::intern(&library.label);
        Self { library, device_count, init_options, warnings, c_label, collectives, graphs, activity }
    }

    /// What loading warned about: operators left out, devices reporting
    /// odd properties (see [`crate::validate`]).
    pub fn warnings(&self) -> &[Finding] {
        &self.warnings
    }

    /// The label as a C string that lives for the whole process (the shim
    /// records it around its calls into the plugin).
    pub fn c_label(&self) -> &'static std::ffi::CStr {
        self.c_label
    }

    pub(crate) fn library(&self) -> &PluginLibrary {
        &self.library
    }

    /// The plugin's identity, as read after `initialize`.
    pub fn info(&self) -> &PluginInfo {
        &self.library.info
    }
    /// The plugin's short identifier, e.g. `"sim"`.
    pub fn name(&self) -> &str {
        &self.library.info.name
    }
    /// `'name' (path)`: how errors and logs refer to this plugin.
    pub fn label(&self) -> &str {
        &self.library.label
    }
    /// The file it was loaded from; `None` for the main program.
    pub fn path(&self) -> Option<&Path> {
        self.library.path.as_deref()
    }
    /// The ABI versions of the handshake and the one both sides use.
    pub fn abi(&self) -> Negotiated {
        self.library.negotiated
    }
    /// The plugin's `TFL_PluginApi.struct_size`.
    pub fn table_size(&self) -> usize {
        self.library.table_size()
    }
    /// Address of the plugin's `TFL_PluginApi`, for the C++ shim, which
    /// calls the plugin directly on the hot path.
    pub fn api_address(&self) -> usize {
        self.library.api_address
    }
    /// The plugin's graphs table (ABI 1.7), every entry found in code, for
    /// the C++ shim's native device graphs; `None` when the plugin has none.
    pub fn graphs_table(&self) -> Option<&torchfl_ffi::TFL_Graphs> {
        self.graphs.as_ref()
    }
    /// The plugin's activity table (ABI 1.8), every entry found in code, for
    /// the C++ shim's device trace; `None` when the plugin has none.
    pub fn activity_table(&self) -> Option<&torchfl_ffi::TFL_Activity> {
        self.activity.as_ref()
    }
    /// What the plugin declares it can do (final after `initialize`).
    pub fn capabilities(&self) -> Capabilities {
        self.library.info.capabilities
    }
    /// The options `initialize` was given; a later load in the same process
    /// must ask for the same ones.
    pub fn init_options(&self) -> &str {
        &self.init_options
    }
    /// Number of devices; valid indices are `0..device_count()`.
    pub fn device_count(&self) -> i32 {
        self.device_count
    }
    /// The validated op table, in the plugin's order.
    pub fn ops(&self) -> &[OpKernel] {
        &self.library.ops
    }
    /// The op-table entry named `name` (`"add.Tensor"`), if any.
    pub fn op(&self, name: &str) -> Option<&OpKernel> {
        self.library.ops.iter().find(|op| op.name == name)
    }
    /// The kernel `reference` names: an op-table entry (`"sim::fused_gelu"`),
    /// the exported symbol of one (`"torch_fl_op_sim__fused_gelu"`), or any
    /// other symbol the library exports with the kernel signature. A kernel
    /// found only by symbol serves `op_name` with no flags.
    ///
    /// # Errors
    /// [`Error::KernelSymbol`] when the library exports no such symbol.
    pub fn find_kernel(&self, op_name: &str, reference: &str) -> Result<OpKernel> {
        if let Some(op) = self.library.ops.iter().find(|op| op.name == reference || op.symbol == reference) {
            return Ok(OpKernel { name: op_name.to_owned(), ..op.clone() });
        }
        let symbol_error = |reason: String| Error::KernelSymbol {
            plugin: self.label().to_owned(),
            op: op_name.to_owned(),
            symbol: reference.to_owned(),
            reason,
        };
        let kernel = self
            .library
            .kernel_by_symbol(reference)
            .map_err(|at| symbol_error(format!("names an exported symbol that is not a function (it lies at {at})")))?
            .ok_or_else(|| {
                symbol_error(format!(
                    "names a kernel that is neither in the op table nor an exported symbol of the plugin's library \
                     (table entries: {})",
                    self.library
                        .ops
                        .iter()
                        .filter(|op| op.schema.is_some())
                        .map(|op| op.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        Ok(OpKernel {
            name: op_name.to_owned(),
            symbol: reference.to_owned(),
            kernel,
            flags: 0,
            schema: None,
            infer_outputs: None,
        })
    }
    /// Optional entries and whether the plugin provides each.
    pub fn optional_entries(&self) -> Vec<(&'static str, bool)> {
        self.library.optional_entries()
    }
    /// Names of the required entries of ABI 1.0.
    pub fn required_entries() -> &'static [&'static str] {
        crate::ffi::REQUIRED_ENTRIES
    }

    pub(crate) fn check_device(&self, device: i32) -> Result<()> {
        if (0..self.device_count).contains(&device) {
            Ok(())
        } else {
            Err(Error::InvalidDevice { plugin: self.label().to_owned(), device, count: self.device_count })
        }
    }

    pub(crate) fn runtime_error(&self, function: &'static str, status: PluginStatus) -> Error {
        if status.code == StatusCode::Unimplemented {
            return Error::Unimplemented {
                plugin: self.label().to_owned(),
                what: format!("{function}: {}", status.message),
            };
        }
        Error::RuntimeCall { plugin: self.label().to_owned(), function, status }
    }

    fn unimplemented(&self, what: &str) -> Error {
        Error::Unimplemented { plugin: self.label().to_owned(), what: format!("the optional entry {what}") }
    }

    /// Queries the properties of `device`.
    pub fn device_properties(&self, device: i32) -> Result<DeviceProperties> {
        self.check_device(device)?;
        let (name, p) = self
            .table(c"device_properties")?
            .device_properties(
                &crate::ffi::probe::MemoryMap::snapshot(),
                device,
                self.library.negotiated.effective.minor,
            )
            .map_err(|s| self.runtime_error("device_properties", s))?;
        Ok(DeviceProperties {
            // Validated at load; a name unreadable now reads as the default.
            name: name.ok().flatten().unwrap_or_else(|| format!("{}:{device}", self.name())),
            total_memory: p.total_memory,
            compute_units: p.compute_units,
            memory_alignment: p.memory_alignment,
            capability: (p.capability_major, p.capability_minor),
        })
    }

    /// Waits for all work on every stream of `device`, reporting the first
    /// asynchronous failure since the last synchronization.
    pub fn synchronize(&self, device: i32) -> Result<()> {
        self.check_device(device)?;
        self.table(c"device_synchronize")?
            .device_synchronize(device)
            .map_err(|s| self.runtime_error("device_synchronize", s))
    }

    /// Allocates `nbytes` on `device`. Lack of memory is
    /// [`Error::OutOfMemory`].
    pub fn allocate(self: &Arc<Self>, device: i32, nbytes: usize) -> Result<DeviceBuffer> {
        self.check_device(device)?;
        match self.table(c"allocate")?.allocate(device, nbytes) {
            Ok(ptr) => Ok(DeviceBuffer { plugin: Arc::clone(self), device, ptr, len: nbytes }),
            Err(status) if status.code == StatusCode::OutOfMemory => {
                Err(Error::OutOfMemory { plugin: self.label().to_owned(), device, status })
            }
            Err(status) => Err(self.runtime_error("allocate", status)),
        }
    }

    /// Allocates and frees `nbytes` on `device` **without** the host's own
    /// device-range check, returning the plugin's raw status. For
    /// conformance tools that check how the plugin itself reports bad input.
    pub fn conformance_allocate(&self, device: i32, nbytes: usize) -> std::result::Result<(), PluginStatus> {
        if crate::fork::in_bad_fork() {
            // Conformance tools never fork; refused as a call in the wrong state.
            let message = crate::fork::bad_fork("call allocate").to_string();
            return Err(PluginStatus { code: StatusCode::FailedPrecondition, message });
        }
        let ptr = self.library.table.allocate(device, nbytes)?;
        // SAFETY: `ptr` was just allocated on `device` and is not used again.
        unsafe { self.library.table.deallocate(device, ptr) }
    }

    /// The memory statistics of `device`; [`Error::Unimplemented`] when the
    /// plugin lacks the optional `memory_stats` entry.
    pub fn memory_stats(&self, device: i32) -> Result<MemoryStats> {
        self.check_device(device)?;
        let stats = self
            .table(c"memory_stats")?
            .memory_stats(device)
            .ok_or_else(|| self.unimplemented("memory_stats"))?
            .map_err(|s| self.runtime_error("memory_stats", s))?;
        Ok(stats)
    }

    /// Restarts the peak of `allocated_bytes` from the current value;
    /// [`Error::Unimplemented`] when the plugin lacks the optional entry.
    pub fn reset_peak_memory_stats(&self, device: i32) -> Result<()> {
        self.check_device(device)?;
        self.table(c"reset_peak_memory_stats")?
            .device_call(DeviceCall::ResetPeak, device)
            .ok_or_else(|| self.unimplemented("reset_peak_memory_stats"))?
            .map_err(|s| self.runtime_error("reset_peak_memory_stats", s))
    }

    /// Returns cached memory to the system; a no-op for plugins without a
    /// cache.
    pub fn empty_cache(&self, device: i32) -> Result<()> {
        self.check_device(device)?;
        match self.table(c"empty_cache")?.device_call(DeviceCall::EmptyCache, device) {
            None => Ok(()),
            Some(r) => r.map_err(|s| self.runtime_error("empty_cache", s)),
        }
    }

    /// The default stream of `device`; dropping the handle leaves the stream
    /// alone, since the plugin owns it for the life of the process.
    pub fn default_stream(self: &Arc<Self>, device: i32) -> Result<Stream> {
        self.check_device(device)?;
        let raw = self
            .table(c"default_stream")?
            .default_stream(device)
            .map_err(|s| self.runtime_error("default_stream", s))?;
        Ok(Stream { plugin: Arc::clone(self), raw, device, owned: false })
    }

    /// Creates a stream on `device`, destroyed when the handle drops.
    /// `priority` is 0 for normal, negative for higher; plugins may ignore it.
    pub fn create_stream(self: &Arc<Self>, device: i32, priority: i32) -> Result<Stream> {
        self.check_device(device)?;
        let raw = self
            .table(c"stream_create")?
            .stream_create(device, priority)
            .map_err(|s| self.runtime_error("stream_create", s))?;
        Ok(Stream { plugin: Arc::clone(self), raw, device, owned: true })
    }

    /// Creates an event on `device`, destroyed when the handle drops; with
    /// `timing` it can measure [`Event::elapsed_ms`].
    pub fn create_event(self: &Arc<Self>, device: i32, timing: bool) -> Result<Event> {
        self.check_device(device)?;
        let flags = if timing { TFL_EVENT_TIMING } else { TFL_EVENT_DEFAULT };
        let raw = self
            .table(c"event_create")?
            .event_create(device, flags)
            .map_err(|s| self.runtime_error("event_create", s))?;
        Ok(Event { plugin: Arc::clone(self), raw })
    }

    /// Copies host bytes into `dst` at `offset`, synchronously.
    pub fn copy_to_device(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        dst.check_range(offset, src.len())?;
        let args = TFL_CopyArgs {
            struct_size: struct_size!(TFL_CopyArgs, stream),
            kind: TFL_COPY_HOST_TO_DEVICE,
            dst_device: dst.device,
            src_device: -1,
            dst: dst.ptr_at(offset),
            src: src.as_ptr().cast(),
            nbytes: src.len(),
            stream: ptr::null_mut(),
        };
        let table = self.table(c"copy")?;
        // SAFETY: the range was checked against the live allocation, `src`
        // is a host slice valid for the synchronous copy.
        unsafe { table.copy(&args) }.map_err(|s| self.runtime_error("copy (host to device)", s))
    }

    /// Copies device bytes at `offset` into `dst`, synchronously.
    pub fn copy_to_host(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        src.check_range(offset, dst.len())?;
        let args = TFL_CopyArgs {
            struct_size: struct_size!(TFL_CopyArgs, stream),
            kind: TFL_COPY_DEVICE_TO_HOST,
            dst_device: -1,
            src_device: src.device,
            dst: dst.as_mut_ptr().cast(),
            src: src.ptr_at(offset),
            nbytes: dst.len(),
            stream: ptr::null_mut(),
        };
        let table = self.table(c"copy")?;
        // SAFETY: the range was checked; `dst` is writable for the
        // synchronous copy.
        unsafe { table.copy(&args) }.map_err(|s| self.runtime_error("copy (device to host)", s))
    }

    /// Copies `nbytes` between device buffers (possibly on two devices),
    /// ordered on `stream` when given, else synchronously.
    pub fn copy_device_to_device(
        &self,
        dst: &DeviceBuffer,
        dst_offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        nbytes: usize,
        stream: Option<&Stream>,
    ) -> Result<()> {
        dst.check_range(dst_offset, nbytes)?;
        src.check_range(src_offset, nbytes)?;
        let args = TFL_CopyArgs {
            struct_size: struct_size!(TFL_CopyArgs, stream),
            kind: TFL_COPY_DEVICE_TO_DEVICE,
            dst_device: dst.device,
            src_device: src.device,
            dst: dst.ptr_at(dst_offset),
            src: src.ptr_at(src_offset),
            nbytes,
            stream: stream.map_or(ptr::null_mut(), |s| s.raw),
        };
        let table = self.table(c"copy")?;
        // SAFETY: both ranges lie in live allocations; device memory freed
        // while the copy is queued stays valid because deallocate is
        // stream-ordered.
        unsafe { table.copy(&args) }.map_err(|s| self.runtime_error("copy (device to device)", s))
    }

    /// Sets `nbytes` at `offset` to `value`, on `stream` or synchronously.
    pub fn set_memory(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        value: u8,
        nbytes: usize,
        stream: Option<&Stream>,
    ) -> Result<()> {
        dst.check_range(offset, nbytes)?;
        let stream = stream.map_or(ptr::null_mut(), |s| s.raw);
        let table = self.table(c"set_memory")?;
        // SAFETY: the range lies in a live allocation of dst.device.
        unsafe { table.set_memory(dst.device, dst.ptr_at(offset), value, nbytes, stream) }
            .map_err(|s| self.runtime_error("set_memory", s))
    }
}

impl Plugin {
    /// The function table, to call `function` through: the gate every
    /// plugin call of this crate passes, refused in a bad fork (see
    /// [`crate::fork`]). The call is recorded as in flight (see
    /// [`crate::inflight`]) until the returned guard is dropped, at the end
    /// of the caller's statement or binding.
    #[inline]
    pub(crate) fn table(&self, function: &'static CStr) -> Result<Calling<'_>> {
        if crate::fork::in_bad_fork() {
            return Err(crate::fork::bad_fork(&format!(
                "call {} of plugin {}",
                function.to_string_lossy(),
                self.label()
            )));
        }
        Ok(Calling {
            table: &self.library().table,
            _in_flight: crate::inflight::enter(self.c_label(), function),
        })
    }
}

/// The function table while one call through it is recorded as in flight.
pub(crate) struct Calling<'a> {
    table: &'a ApiTable,
    _in_flight: crate::inflight::Scope,
}

impl std::ops::Deref for Calling<'_> {
    type Target = ApiTable;

    fn deref(&self) -> &ApiTable {
        self.table
    }
}

/// Device memory from [`Plugin::allocate`], released on drop.
pub struct DeviceBuffer {
    plugin: Arc<Plugin>,
    device: i32,
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: the pointer is an opaque device address owned by this value; the
// ABI makes every plugin entry thread-safe, so using and releasing it from
// any thread is allowed.
unsafe impl Send for DeviceBuffer {}
// SAFETY: shared access only reads the address; see Send.
unsafe impl Sync for DeviceBuffer {}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({}:{} {:p}, {} bytes)", self.plugin.name(), self.device, self.ptr, self.len)
    }
}

impl DeviceBuffer {
    /// The device index the memory belongs to.
    pub fn device(&self) -> i32 {
        self.device
    }
    /// Size of the allocation in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the allocation is zero bytes (still a unique address).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The device address. Not dereferenceable by the host unless the
    /// plugin declares host-addressable memory.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }
    /// The plugin that owns the memory and will release it.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    fn ptr_at(&self, offset: usize) -> *mut c_void {
        // Device addresses are opaque integers to the host: wrapping
        // arithmetic never dereferences them.
        self.ptr.cast::<u8>().wrapping_add(offset).cast()
    }

    pub(crate) fn check_range(&self, offset: usize, nbytes: usize) -> Result<()> {
        match offset.checked_add(nbytes) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidCall {
                plugin: self.plugin.label().to_owned(),
                reason: format!("bytes {offset}..{offset}+{nbytes} exceed a {}-byte buffer", self.len),
            }),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if crate::fork::in_bad_fork() {
            return; // leaked: the plugin must not be called in this child
        }
        // SAFETY: `ptr` came from allocate on `device` and this is its only
        // owner; nothing uses it after drop.
        if let Err(status) = unsafe { self.plugin.library.table.deallocate(self.device, self.ptr) } {
            crate::log::plugin_message(
                self.plugin.label(),
                TFL_LOG_ERROR,
                &format!("deallocate of {:p} on device {} failed: {status}", self.ptr, self.device),
            );
        }
    }
}

/// A stream of a plugin device. Streams from [`Plugin::create_stream`] are
/// destroyed on drop; default streams are not.
pub struct Stream {
    plugin: Arc<Plugin>,
    raw: *mut TFL_Stream,
    device: i32,
    owned: bool,
}

// SAFETY: the handle is opaque and every stream entry is thread-safe.
unsafe impl Send for Stream {}
// SAFETY: as for Send.
unsafe impl Sync for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Stream({}:{} {:p}{})",
            self.plugin.name(),
            self.device,
            self.raw,
            if self.owned { "" } else { ", default" }
        )
    }
}

impl Stream {
    /// The device index the stream runs work on.
    pub fn device(&self) -> i32 {
        self.device
    }
    /// Whether this is the device's default stream (not destroyed on drop).
    pub fn is_default(&self) -> bool {
        !self.owned
    }
    /// The plugin's handle, for building call frames; valid while `self`
    /// lives.
    pub fn raw(&self) -> *mut TFL_Stream {
        self.raw
    }

    fn call(&self, which: StreamCall, name: &'static CStr) -> Result<bool> {
        let table = self.plugin.table(name)?;
        // SAFETY: `raw` is live while self exists (destroyed only in Drop).
        unsafe { table.stream_call(which, self.raw) }
            .map_err(|s| self.plugin.runtime_error(name.to_str().unwrap_or("?"), s))
    }

    /// Waits until all work submitted to the stream has run.
    pub fn synchronize(&self) -> Result<()> {
        self.call(StreamCall::Synchronize, c"stream_synchronize").map(drop)
    }
    /// Whether all submitted work has completed.
    pub fn query(&self) -> Result<bool> {
        self.call(StreamCall::Query, c"stream_query")
    }
    /// Makes later work on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let table = self.plugin.table(c"stream_wait_event")?;
        // SAFETY: both handles are live while borrowed.
        unsafe { table.stream_wait_event(self.raw, event.raw) }
            .map_err(|s| self.plugin.runtime_error("stream_wait_event", s))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // In a bad fork the stream is leaked: the plugin must not be called.
        if self.owned && !crate::fork::in_bad_fork() {
            if let Err(e) = self.call(StreamCall::Destroy, c"stream_destroy") {
                crate::log::plugin_message(self.plugin.label(), TFL_LOG_ERROR, &e.to_string());
            }
        }
    }
}

/// An event of a plugin device, destroyed on drop.
pub struct Event {
    plugin: Arc<Plugin>,
    raw: *mut TFL_Event,
}

// SAFETY: the handle is opaque and every event entry is thread-safe.
unsafe impl Send for Event {}
// SAFETY: as for Send.
unsafe impl Sync for Event {}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event({} {:p})", self.plugin.name(), self.raw)
    }
}

impl Event {
    fn call(&self, which: EventCall, stream: *mut TFL_Stream, name: &'static CStr) -> Result<bool> {
        let table = self.plugin.table(name)?;
        // SAFETY: `raw` is live while self exists; `stream` is NULL or a live
        // stream borrowed by the caller.
        unsafe { table.event_call(which, self.raw, stream) }
            .map_err(|s| self.plugin.runtime_error(name.to_str().unwrap_or("?"), s))
    }

    /// Captures the work submitted to `stream` so far.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.call(EventCall::Record, stream.raw, c"event_record").map(drop)
    }
    /// Whether the recorded work has completed (true for an event never
    /// recorded).
    pub fn query(&self) -> Result<bool> {
        self.call(EventCall::Query, ptr::null_mut(), c"event_query")
    }
    /// Waits until the recorded work has run.
    pub fn synchronize(&self) -> Result<()> {
        self.call(EventCall::Synchronize, ptr::null_mut(), c"event_synchronize").map(drop)
    }
    /// Milliseconds from `self` to `end`; both must be timed and complete.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let table = self.plugin.table(c"event_elapsed_time")?;
        // SAFETY: both handles are live while borrowed.
        unsafe { table.event_elapsed_time(self.raw, end.raw) }
            .ok_or_else(|| self.plugin.unimplemented("event_elapsed_time"))?
            .map_err(|s| self.plugin.runtime_error("event_elapsed_time", s))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if crate::fork::in_bad_fork() {
            return; // leaked: the plugin must not be called in this child
        }
        if let Err(e) = self.call(EventCall::Destroy, ptr::null_mut(), c"event_destroy") {
            crate::log::plugin_message(self.plugin.label(), TFL_LOG_ERROR, &e.to_string());
        }
    }
}

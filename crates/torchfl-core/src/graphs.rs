//! Native device graphs (ABI 1.7) from Rust: capture kernel launches on a
//! stream into the plugin's graph, instantiate it, launch it as one unit.
//!
//! This is what `torchfl-abi verify` checks a plugin's graphs table with;
//! the C++ shim drives the same entries for PyTorch's graphs. The rules of
//! the header are kept by construction:
//! - a captured call's frame is owned by the graph (boxed, never moved or
//!   written), and the device buffers it names are borrowed for the graph's
//!   lifetime `'a`;
//! - an exec keeps its graph alive, and waits for the device before it is
//!   destroyed, so no launch still reads the frames.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use torchfl_ffi::*;

use crate::call::{Arg, PreparedCall, TensorArg};
use crate::error::{Error, Result};
use crate::ffi::GraphCall;
use crate::plugin::{DeviceBuffer, OpKernel, Plugin, Stream};

impl Plugin {
    /// Whether the plugin offers native graphs (a validated ABI 1.7 graphs
    /// table).
    pub fn has_graphs(&self) -> bool {
        self.graphs_table().is_some()
    }

    /// Makes one call through the graphs table.
    fn graph_call(&self, call: GraphCall, name: &'static str) -> Result<*mut c_void> {
        let Some(t) = self.graphs_table() else {
            return Err(Error::Unimplemented {
                plugin: self.label().to_owned(),
                what: format!("{name}: the plugin offers no native graphs (the optional ABI 1.7 get_graphs)"),
            });
        };
        let table = self.table(crate::inflight::intern(name))?;
        // SAFETY: callers pass handles this plugin returned and keep the
        // header's frame and memory rules (see this module's docs).
        unsafe { table.graph_call(t, call) }.map_err(|s| self.runtime_error(name, s))
    }

    /// Puts `stream` (not a default stream) in capture mode: kernels
    /// launched through the returned [`Capture`] are recorded, not run.
    pub fn begin_capture<'a>(self: &Arc<Self>, stream: &'a Stream) -> Result<Capture<'a>> {
        self.graph_call(GraphCall::BeginCapture(stream.raw()), "stream_begin_capture")?;
        Ok(Capture {
            plugin: Arc::clone(self),
            stream,
            calls: Vec::new(),
            ended: false,
            _buffers: PhantomData,
        })
    }
}

/// A stream in capture mode; ends (discarding what it recorded) on drop
/// unless [`Capture::end`] made a graph of it.
pub struct Capture<'a> {
    plugin: Arc<Plugin>,
    stream: &'a Stream,
    #[allow(
        clippy::vec_box,
        reason = "the plugin keeps pointers to each frame: it must not move as the vector grows"
    )]
    calls: Vec<Box<PreparedCall>>,
    ended: bool,
    _buffers: PhantomData<&'a DeviceBuffer>,
}

impl std::fmt::Debug for Capture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Capture({:?}, {} calls)", self.stream, self.calls.len())
    }
}

impl<'a> Capture<'a> {
    /// Records `op` on the capturing stream (as [`Plugin::launch`] would
    /// run it); the buffers are borrowed for as long as the graph lives.
    pub fn launch(&mut self, op: &OpKernel, args: &[Arg<'a>], outputs: &[TensorArg<'a>]) -> Result<()> {
        let call = self.plugin.prepare(op, self.stream, args, outputs)?;
        self.plugin.call_prepared(&call)?;
        self.calls.push(call);
        Ok(())
    }

    /// Ends capture mode and returns what was recorded as a graph.
    pub fn end(mut self) -> Result<Graph<'a>> {
        self.ended = true;
        let raw = self.plugin.graph_call(GraphCall::EndCapture(self.stream.raw()), "stream_end_capture")?;
        let calls = std::mem::take(&mut self.calls);
        Ok(Graph {
            inner: Arc::new(GraphInner { plugin: Arc::clone(&self.plugin), raw: raw.cast(), calls }),
            _buffers: PhantomData,
        })
    }
}

impl Drop for Capture<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if let Ok(raw) =
            self.plugin.graph_call(GraphCall::EndCapture(self.stream.raw()), "stream_end_capture")
        {
            drop(GraphInner { plugin: Arc::clone(&self.plugin), raw: raw.cast(), calls: Vec::new() });
        }
    }
}

struct GraphInner {
    plugin: Arc<Plugin>,
    raw: *mut TFL_Graph,
    /// The captured frames, which the plugin may read until the graph and
    /// its execs are gone (boxed: they must not move).
    #[allow(clippy::vec_box, reason = "the plugin keeps pointers to each frame: it must not move")]
    calls: Vec<Box<PreparedCall>>,
}

// SAFETY: the graph handle is opaque and the header allows its entries from
// any thread (one at a time per graph, which `&mut`-free use through Arc
// does not violate: the plugin serializes per graph as documented).
unsafe impl Send for GraphInner {}
// SAFETY: as for Send.
unsafe impl Sync for GraphInner {}

impl Drop for GraphInner {
    fn drop(&mut self) {
        if crate::fork::in_bad_fork() || self.raw.is_null() {
            return;
        }
        if let Err(e) = self.plugin.graph_call(GraphCall::Destroy(self.raw), "graph_destroy") {
            crate::log::plugin_message(self.plugin.label(), TFL_LOG_ERROR, &e.to_string());
        }
    }
}

/// A recorded capture of the plugin's; destroyed on drop (after its execs).
pub struct Graph<'a> {
    inner: Arc<GraphInner>,
    _buffers: PhantomData<&'a DeviceBuffer>,
}

impl std::fmt::Debug for Graph<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({:p}, {} calls)", self.inner.raw, self.inner.calls.len())
    }
}

impl<'a> Graph<'a> {
    /// A launchable exec of the graph.
    pub fn instantiate(&self) -> Result<GraphExec<'a>> {
        let raw =
            self.inner.plugin.graph_call(GraphCall::Instantiate(self.inner.raw), "graph_instantiate")?;
        Ok(GraphExec {
            graph: Arc::clone(&self.inner),
            raw: raw.cast(),
            devices: Vec::new(),
            _buffers: PhantomData,
        })
    }
}

/// An instantiated graph; waits for its launches' devices, then is
/// destroyed, on drop.
pub struct GraphExec<'a> {
    graph: Arc<GraphInner>,
    raw: *mut TFL_GraphExec,
    devices: Vec<i32>,
    _buffers: PhantomData<&'a DeviceBuffer>,
}

impl std::fmt::Debug for GraphExec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GraphExec({:p})", self.raw)
    }
}

impl GraphExec<'_> {
    /// Enqueues one run of the graph on `stream`; recorded random kernels
    /// draw with `rng_seed` and `rng_offset_base` plus their recorded offset.
    pub fn launch(&mut self, stream: &Stream, rng_seed: u64, rng_offset_base: u64) -> Result<()> {
        let args = TFL_GraphLaunchArgs {
            struct_size: struct_size!(TFL_GraphLaunchArgs, rng_offset_base),
            rng_seed,
            rng_offset_base,
        };
        self.graph.plugin.graph_call(GraphCall::Launch(self.raw, stream.raw(), args), "graph_launch")?;
        if !self.devices.contains(&stream.device()) {
            self.devices.push(stream.device());
        }
        Ok(())
    }
}

impl Drop for GraphExec<'_> {
    fn drop(&mut self) {
        if crate::fork::in_bad_fork() || self.raw.is_null() {
            return;
        }
        let plugin = &self.graph.plugin;
        // The plugin may read the captured frames until every launch ran.
        for &device in &self.devices {
            if let Err(e) = plugin.synchronize(device) {
                crate::log::plugin_message(plugin.label(), TFL_LOG_ERROR, &e.to_string());
            }
        }
        if let Err(e) = plugin.graph_call(GraphCall::DestroyExec(self.raw), "graph_exec_destroy") {
            crate::log::plugin_message(plugin.label(), TFL_LOG_ERROR, &e.to_string());
        }
    }
}

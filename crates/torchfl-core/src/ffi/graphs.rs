//! The graphs table (ABI 1.7): read once after `initialize`, validated, and
//! handed to the C++ shim, which records and launches device graphs with it.
//!
//! As with the collectives table, the host allocates the `TFL_Graphs` the
//! plugin fills, so nothing of the plugin's memory is read but the function
//! pointers it wrote, and each must point into executable memory.

use std::ffi::c_void;

use torchfl_ffi::*;

use super::collectives::Extension;
use super::probe::MemoryMap;
use super::table::ApiTable;
use crate::error::{PluginStatus, StatusCode};

/// The entries of `t`, by name, in table order.
fn entries(t: &TFL_Graphs) -> [(&'static str, Option<usize>); 6] {
    [
        ("stream_begin_capture", t.stream_begin_capture.map(|f| f as usize)),
        ("stream_end_capture", t.stream_end_capture.map(|f| f as usize)),
        ("graph_instantiate", t.graph_instantiate.map(|f| f as usize)),
        ("graph_launch", t.graph_launch.map(|f| f as usize)),
        ("graph_exec_destroy", t.graph_exec_destroy.map(|f| f as usize)),
        ("graph_destroy", t.graph_destroy.map(|f| f as usize)),
    ]
}

impl ApiTable {
    /// Asks for the graphs table, after initialize (`minor`: the negotiated
    /// ABI minor; below 1.7 the host does not ask). An error is a malformed
    /// table (an entry left NULL or pointing outside code), which refuses
    /// the plugin.
    pub(crate) fn graphs(&self, map: &MemoryMap, minor: u32) -> Result<Extension<TFL_Graphs>, String> {
        if minor < 7 {
            return Ok(Extension::Absent(format!("the plugin speaks ABI 1.{minor}, graphs came in 1.7")));
        }
        let Some(get) = self.get_graphs else {
            return Ok(Extension::Absent("its get_graphs entry is NULL".to_owned()));
        };
        let mut out = TFL_Graphs {
            struct_size: struct_size!(TFL_Graphs, graph_destroy),
            stream_begin_capture: None,
            stream_end_capture: None,
            graph_instantiate: None,
            graph_launch: None,
            graph_exec_destroy: None,
            graph_destroy: None,
        };
        // SAFETY: get_graphs was found in executable memory when the table
        // was read; `out` is a host struct whose struct_size says how much
        // the plugin may write.
        if let Err(status) = self.check(unsafe { get(&mut out) }) {
            return Ok(Extension::Absent(format!("get_graphs reported {status}")));
        }
        for (name, entry) in entries(&out) {
            let address = entry.ok_or_else(|| {
                format!(
                    "get_graphs succeeded but left TFL_Graphs.{name} NULL: every 1.7 entry of the graphs table is \
                     required (return an error from get_graphs to offer no native graphs)"
                )
            })?;
            map.executable(address)
                .map_err(|at| format!("TFL_Graphs.{name} does not point to code: {at}"))?;
        }
        Ok(Extension::Present(out))
    }
}

/// The graph entries a [`crate::graphs`] call needs, in one enum so that
/// one function makes every call (and so states its safety once).
#[derive(Debug, Clone, Copy)]
pub(crate) enum GraphCall {
    /// `stream_begin_capture(stream)`.
    BeginCapture(*mut TFL_Stream),
    /// `stream_end_capture(stream, &graph)`.
    EndCapture(*mut TFL_Stream),
    /// `graph_instantiate(graph, &exec)`.
    Instantiate(*mut TFL_Graph),
    /// `graph_launch(exec, stream, args)`.
    Launch(*mut TFL_GraphExec, *mut TFL_Stream, TFL_GraphLaunchArgs),
    /// `graph_exec_destroy(exec)`.
    DestroyExec(*mut TFL_GraphExec),
    /// `graph_destroy(graph)`.
    Destroy(*mut TFL_Graph),
}

impl ApiTable {
    /// Makes `call` through the validated graphs table `t`; returns the
    /// handle an entry creates (a graph or an exec), else NULL.
    ///
    /// # Safety
    /// Every handle in `call` must be one this plugin returned and not yet
    /// destroyed (streams included), and for captures and launches the
    /// host's frame and memory rules of the header's "Device graphs" hold.
    pub(crate) unsafe fn graph_call(
        &self,
        t: &TFL_Graphs,
        call: GraphCall,
    ) -> Result<*mut c_void, PluginStatus> {
        // Every entry was checked non-NULL and in code when `t` was read, so
        // the `None` arms cannot happen; they report instead of panicking.
        let missing = || PluginStatus {
            code: StatusCode::Internal,
            message: "a validated graphs entry is NULL".into(),
        };
        let mut created: *mut c_void = std::ptr::null_mut();
        // SAFETY: the entries point to code (checked when read); the
        // arguments follow the caller's contract; `created` is writable.
        let status = unsafe {
            match call {
                GraphCall::BeginCapture(s) => t.stream_begin_capture.ok_or_else(missing)?(s),
                GraphCall::EndCapture(s) => {
                    t.stream_end_capture.ok_or_else(missing)?(s, (&raw mut created).cast())
                }
                GraphCall::Instantiate(g) => {
                    t.graph_instantiate.ok_or_else(missing)?(g, (&raw mut created).cast())
                }
                GraphCall::Launch(e, s, args) => t.graph_launch.ok_or_else(missing)?(e, s, &args),
                GraphCall::DestroyExec(e) => t.graph_exec_destroy.ok_or_else(missing)?(e),
                GraphCall::Destroy(g) => t.graph_destroy.ok_or_else(missing)?(g),
            }
        };
        self.check(status).map(|()| created)
    }
}

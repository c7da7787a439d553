//! The graphs extension (ABI 1.7): the `TFL_Graphs` entries, and the
//! recording of copies queued on a capturing stream (kernel launches are
//! recorded beside their decoding, in `super::op_table`;
//! `crate::runtime::graph` keeps captures and launches graphs).
//!
//! Graphs and execs cross the ABI as handles, like streams and events: the
//! host's `TFL_Graph*` is a handle the runtime looks up, never a pointer
//! this plugin dereferences.

use std::ptr::addr_of;

use torchfl_ffi::struct_size;
use torchfl_ffi::{TFL_Error, TFL_Graph, TFL_GraphExec, TFL_GraphLaunchArgs, TFL_Graphs, TFL_Stream};

use super::{check_size, guard, null_arg, opt_stream, runtime};
use crate::error::Result;
use crate::runtime::{RawCopy, Runtime, StreamHandle};

/// Records a copy on a capturing stream; false when its stream does not
/// capture.
pub(super) fn record_copy(rt: &Runtime, c: RawCopy) -> bool {
    let Some(stream) = c.stream.filter(|&s| rt.capturing(s)) else {
        return false;
    };
    rt.record(
        stream,
        Box::new(move |_, _| {
            // SAFETY: the host keeps a graph's device buffers allocated while
            // it holds the graph (header, "Device graphs"); device pointers
            // are validated again here.
            unsafe { runtime()?.copy_raw(&c) }
        }),
    )
}

fn stream_arg(stream: *mut TFL_Stream, what: &str) -> Result<StreamHandle> {
    opt_stream(stream).ok_or_else(|| null_arg(what, "stream"))
}

fn handle_of<T>(p: *mut T) -> u64 {
    p as usize as u64
}

unsafe extern "C" fn stream_begin_capture(stream: *mut TFL_Stream) -> *mut TFL_Error {
    guard("stream_begin_capture", || runtime()?.begin_capture(stream_arg(stream, "stream_begin_capture")?))
}

/// # Safety
/// `out` must be NULL or writable.
unsafe extern "C" fn stream_end_capture(stream: *mut TFL_Stream, out: *mut *mut TFL_Graph) -> *mut TFL_Error {
    guard("stream_end_capture", || {
        if out.is_null() {
            return Err(null_arg("stream_end_capture", "out"));
        }
        let graph = runtime()?.end_capture(stream_arg(stream, "stream_end_capture")?)?;
        // SAFETY: `out` is writable (contract).
        unsafe { out.write(graph as usize as *mut TFL_Graph) };
        Ok(())
    })
}

/// # Safety
/// `out` must be NULL or writable.
unsafe extern "C" fn graph_instantiate(
    graph: *mut TFL_Graph,
    out: *mut *mut TFL_GraphExec,
) -> *mut TFL_Error {
    guard("graph_instantiate", || {
        if out.is_null() {
            return Err(null_arg("graph_instantiate", "out"));
        }
        let exec = runtime()?.instantiate_graph(handle_of(graph))?;
        // SAFETY: `out` is writable (contract).
        unsafe { out.write(exec as usize as *mut TFL_GraphExec) };
        Ok(())
    })
}

/// # Safety
/// `args` must be NULL or a valid `TFL_GraphLaunchArgs` for the call.
unsafe extern "C" fn graph_launch(
    exec: *mut TFL_GraphExec,
    stream: *mut TFL_Stream,
    args: *const TFL_GraphLaunchArgs,
) -> *mut TFL_Error {
    guard("graph_launch", || {
        if args.is_null() {
            return Err(null_arg("graph_launch", "args"));
        }
        // SAFETY: `args` is valid for the call; its size is checked before
        // the fields are read.
        let a = unsafe {
            check_size(
                addr_of!((*args).struct_size),
                struct_size!(TFL_GraphLaunchArgs, rng_offset_base),
                "graph_launch",
            )?;
            args.read()
        };
        runtime()?.launch_graph(
            handle_of(exec),
            stream_arg(stream, "graph_launch")?,
            a.rng_seed,
            a.rng_offset_base,
        )
    })
}

unsafe extern "C" fn graph_exec_destroy(exec: *mut TFL_GraphExec) -> *mut TFL_Error {
    guard("graph_exec_destroy", || runtime()?.destroy_graph_exec(handle_of(exec)))
}

unsafe extern "C" fn graph_destroy(graph: *mut TFL_Graph) -> *mut TFL_Error {
    guard("graph_destroy", || runtime()?.destroy_graph(handle_of(graph)))
}

/// `TFL_PluginApi.get_graphs`.
///
/// # Safety
/// `out` must be NULL or point to a `TFL_Graphs` whose `struct_size` the
/// host has set.
pub(super) unsafe extern "C" fn get_graphs(out: *mut TFL_Graphs) -> *mut TFL_Error {
    guard("get_graphs", || {
        if out.is_null() {
            return Err(null_arg("get_graphs", "out"));
        }
        runtime()?;
        // SAFETY: `out` is valid for the call; fields are written only when
        // the host's struct_size covers them.
        unsafe {
            let size = check_size(
                addr_of!((*out).struct_size),
                struct_size!(TFL_Graphs, graph_destroy),
                "get_graphs",
            )?;
            wr!(out, TFL_Graphs, size, stream_begin_capture, Some(stream_begin_capture));
            wr!(out, TFL_Graphs, size, stream_end_capture, Some(stream_end_capture));
            wr!(out, TFL_Graphs, size, graph_instantiate, Some(graph_instantiate));
            wr!(out, TFL_Graphs, size, graph_launch, Some(graph_launch));
            wr!(out, TFL_Graphs, size, graph_exec_destroy, Some(graph_exec_destroy));
            wr!(out, TFL_Graphs, size, graph_destroy, Some(graph_destroy));
        }
        Ok(())
    })
}

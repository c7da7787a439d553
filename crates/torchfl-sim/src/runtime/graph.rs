//! Device graphs (ABI 1.7): capture a stream's launches, launch them again
//! as one unit of stream work.
//!
//! While a stream captures, the ABI layer hands each kernel launch and copy
//! queued on it to [`Runtime::record`] as a [`Replay`] (a closure that runs
//! the launch again) instead of running it. A launched graph is ONE piece of
//! work on the stream, charged one launch latency by the cost model (what a
//! real device's graph launch saves over a launch per kernel); when the
//! stream's worker runs it, each replay runs inline on the worker: kernels
//! validate and execute at once instead of being queued
//! ([`inline_active`]).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::stream::lock;
use super::{next_id, Runtime, StreamHandle, Work};
use crate::error::{Error, Result};

/// Runs one recorded launch again, with the launch's random seed and base
/// offset (added to the launch's own, graph-relative offset).
pub(crate) type Replay = Box<dyn Fn(u64, u64) -> Result<()> + Send + Sync>;

/// The recorded launches of a graph, in capture order.
pub(crate) type Nodes = Arc<[Replay]>;

thread_local! {
    static INLINE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is running a launched graph: launches and copies
/// then execute at once, in graph order, instead of being queued.
pub(crate) fn inline_active() -> bool {
    INLINE.with(Cell::get)
}

/// Marks this thread as running a graph for the scope.
struct InlineScope(bool);

impl InlineScope {
    fn enter() -> Self {
        Self(INLINE.with(|c| c.replace(true)))
    }
}

impl Drop for InlineScope {
    fn drop(&mut self) {
        INLINE.with(|c| c.set(self.0));
    }
}

/// Captures underway (by stream), recorded graphs and their executables.
#[derive(Default)]
pub(crate) struct Graphs {
    /// How many streams capture: the launch path's one check when none do.
    capturing: AtomicUsize,
    captures: Mutex<HashMap<StreamHandle, Vec<Replay>>>,
    graphs: Mutex<HashMap<u64, (usize, Nodes)>>,
    execs: Mutex<HashMap<u64, (usize, Nodes)>>,
}

impl Runtime {
    /// Puts `stream` (not a default stream) in capture mode.
    pub fn begin_capture(&self, stream: StreamHandle) -> Result<()> {
        let s = self.stream(stream)?;
        if s.id() == self.device(s.device())?.default_stream.id() {
            return Err(Error::invalid("sim: stream_begin_capture: a default stream cannot capture"));
        }
        let mut captures = lock(&self.graphs.captures);
        if captures.contains_key(&stream) {
            return Err(Error::invalid(format!(
                "sim: stream_begin_capture: stream {:#x} is already capturing",
                stream.to_raw()
            )));
        }
        captures.insert(stream, Vec::new());
        self.graphs.capturing.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Ends capture mode of `stream`; returns the new graph's handle.
    pub fn end_capture(&self, stream: StreamHandle) -> Result<u64> {
        let device = self.stream(stream)?.device();
        let nodes = lock(&self.graphs.captures).remove(&stream).ok_or_else(|| {
            Error::invalid(format!("sim: stream_end_capture: stream {:#x} is not capturing", stream.to_raw()))
        })?;
        self.graphs.capturing.fetch_sub(1, Ordering::Relaxed);
        let id = next_id().get();
        lock(&self.graphs.graphs).insert(id, (device, nodes.into()));
        Ok(id)
    }

    /// Whether work for `stream` is to be recorded rather than run.
    pub(crate) fn capturing(&self, stream: StreamHandle) -> bool {
        self.graphs.capturing.load(Ordering::Relaxed) != 0
            && !inline_active()
            && lock(&self.graphs.captures).contains_key(&stream)
    }

    /// Records `replay` into `stream`'s capture; false when the stream does
    /// not capture (nothing was recorded).
    pub(crate) fn record(&self, stream: StreamHandle, replay: Replay) -> bool {
        match lock(&self.graphs.captures).get_mut(&stream) {
            Some(nodes) => {
                nodes.push(replay);
                true
            }
            None => false,
        }
    }

    /// An executable of graph `graph`; returns its handle.
    pub fn instantiate_graph(&self, graph: u64) -> Result<u64> {
        let entry = lock(&self.graphs.graphs)
            .get(&graph)
            .map(|(device, nodes)| (*device, Arc::clone(nodes)))
            .ok_or_else(|| Error::invalid(format!("sim: graph_instantiate: unknown graph {graph:#x}")))?;
        let id = next_id().get();
        lock(&self.graphs.execs).insert(id, entry);
        Ok(id)
    }

    /// Enqueues one run of executable `exec` on `stream`: one piece of work
    /// that runs every recorded launch in order.
    pub fn launch_graph(&self, exec: u64, stream: StreamHandle, seed: u64, base: u64) -> Result<()> {
        let (device, nodes) = lock(&self.graphs.execs)
            .get(&exec)
            .map(|(device, nodes)| (*device, Arc::clone(nodes)))
            .ok_or_else(|| Error::invalid(format!("sim: graph_launch: unknown graph exec {exec:#x}")))?;
        // The one cost of activity records on this path while they are off.
        let kinds = self.activity.kinds();
        let api = if kinds == 0 { None } else { self.api_begin() };
        let s = self.stream_on(stream, device, "graph_launch")?;
        if let Some(cost) = &self.cost {
            Self::charge_launch(cost);
        }
        if kinds == 0 {
            return s
                .submit(Work::new(move || {
                    let _inline = InlineScope::enter();
                    nodes.iter().try_for_each(|replay| replay(seed, base))
                }))
                .map(drop);
        }
        // Recording: the graph's kernels and copies, run inline on the
        // worker, carry the launch's correlation id and stream.
        let (correlation, count) = (super::activity::correlation(), nodes.len());
        s.submit(Work::new(move || {
            let _inline = InlineScope::enter();
            let _scope = super::activity::WorkScope::enter(correlation, stream.to_raw());
            nodes.iter().try_for_each(|replay| replay(seed, base))
        }))?;
        if let Some(call) = api {
            self.api_end(call, "simGraphLaunch", device, stream.to_raw(), |d| {
                let _ = std::fmt::Write::write_fmt(d, format_args!("{count} nodes, exec {exec:#x}"));
            });
        }
        Ok(())
    }

    /// Destroys executable `exec` (its launches already queued still run).
    pub fn destroy_graph_exec(&self, exec: u64) -> Result<()> {
        lock(&self.graphs.execs)
            .remove(&exec)
            .map(drop)
            .ok_or_else(|| Error::invalid(format!("sim: graph_exec_destroy: unknown graph exec {exec:#x}")))
    }

    /// Destroys graph `graph`.
    pub fn destroy_graph(&self, graph: u64) -> Result<()> {
        lock(&self.graphs.graphs)
            .remove(&graph)
            .map(drop)
            .ok_or_else(|| Error::invalid(format!("sim: graph_destroy: unknown graph {graph:#x}")))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::runtime::config::Config;

    #[test]
    fn recorded_work_runs_only_when_launched_in_order_with_the_launch_s_rng() {
        let rt = Runtime::new(Config { devices: 1, ..Config::default() }).unwrap();
        let stream = rt.create_stream(0, 0).unwrap();
        assert!(!rt.capturing(stream));
        rt.begin_capture(stream).unwrap();
        assert!(rt.capturing(stream));
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..3u64 {
            let seen = Arc::clone(&seen);
            assert!(rt.record(
                stream,
                Box::new(move |seed, base| {
                    lock(&seen).push((i, seed, base));
                    Ok(())
                })
            ));
        }
        let graph = rt.end_capture(stream).unwrap();
        assert!(!rt.capturing(stream) && !rt.record(stream, Box::new(|_, _| Ok(()))));
        let exec = rt.instantiate_graph(graph).unwrap();
        assert!(lock(&seen).is_empty(), "recording ran something");
        rt.launch_graph(exec, stream, 7, 100).unwrap();
        rt.launch_graph(exec, stream, 7, 200).unwrap();
        rt.stream(stream).unwrap().fence().wait();
        let runs: Vec<_> = lock(&seen).clone();
        assert_eq!(runs, [(0, 7, 100), (1, 7, 100), (2, 7, 100), (0, 7, 200), (1, 7, 200), (2, 7, 200)]);
        rt.destroy_graph_exec(exec).unwrap();
        rt.destroy_graph(graph).unwrap();
        assert!(rt.launch_graph(exec, stream, 0, 0).is_err());
    }

    #[test]
    fn a_default_stream_or_a_second_capture_is_refused() {
        let rt = Runtime::new(Config { devices: 1, ..Config::default() }).unwrap();
        let default = rt.default_stream(0).unwrap();
        assert!(rt.begin_capture(default).unwrap_err().message().contains("default stream"));
        let stream = rt.create_stream(0, 0).unwrap();
        rt.begin_capture(stream).unwrap();
        assert!(rt.begin_capture(stream).unwrap_err().message().contains("already capturing"));
        rt.end_capture(stream).unwrap();
        assert!(rt.end_capture(stream).unwrap_err().message().contains("not capturing"));
    }

    #[test]
    fn work_inside_a_launch_runs_inline() {
        let rt = Runtime::new(Config { devices: 1, ..Config::default() }).unwrap();
        let stream = rt.create_stream(0, 0).unwrap();
        let inline = Arc::new(AtomicU64::new(0));
        rt.begin_capture(stream).unwrap();
        let flag = Arc::clone(&inline);
        rt.record(
            stream,
            Box::new(move |_, _| {
                flag.store(u64::from(inline_active()), Ordering::SeqCst);
                Ok(())
            }),
        );
        let exec = rt.instantiate_graph(rt.end_capture(stream).unwrap()).unwrap();
        rt.launch_graph(exec, stream, 0, 0).unwrap();
        rt.stream(stream).unwrap().fence().wait();
        assert_eq!(inline.load(Ordering::SeqCst), 1);
        assert!(!inline_active());
    }
}

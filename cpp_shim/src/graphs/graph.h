// Device graphs: capture a stream's work once, replay it without Python, the
// dispatcher or torch-fl's operator entry (torch.<device>.graph,
// torch.accelerator.Graph).
//
// Capture records, on the current stream of the current device, every plugin
// kernel launch and device-to-device copy the shim would have queued
// (runtime/capture.h says what else it refuses). Nothing runs: outputs are
// placeholders until the first replay. Tensors allocated during capture come
// from the graph's private pool of the caching allocator, so their addresses
// stay the graph's for every replay; several graphs may share a pool when
// they replay in the order they were captured, as on CUDA.
//
// replay() submits the recorded work, in capture order, on the stream that is
// current when it is called (any stream of the device): one kernel call per
// node and nothing else. Random kernels draw fresh numbers on every replay:
// each generator the capture drew from is advanced by the whole graph's draw,
// and every kernel gets that base plus its offset inside the graph, so a
// replay right after manual_seed(s) draws what eager execution would.
//
// Native graphs (ABI 1.7): when the plugin offers a graphs table,
// instantiate() hands the recording to the plugin once (on a stream of its
// own in capture mode) and replay() is one graph_launch, so the plugin can
// submit the whole graph to its device at once. A graph drawing from more
// than one generator, a plugin kernel that declines capture
// (UNIMPLEMENTED), or TORCH_FL_GRAPHS=shim keeps the shim's replay.
//
// A Graph is used from one thread at a time, as torch.cuda.CUDAGraph is.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "memory/caching_allocator.h"
#include "runtime/capture.h"
#include "torch_fl/plugin.h"

namespace torchfl::graphs {

class Graph {
 public:
  // keep_graph: capture_end leaves instantiation to instantiate() or the
  // first replay(), as with torch.cuda.CUDAGraph(keep_graph=True).
  explicit Graph(bool keep_graph = false) : keep_graph_(keep_graph) {}
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts capturing the current stream of the current device. `pool`:
  // (0, 0) for a pool of the graph's own, else a MemPool's id, another
  // graph's pool() or graph_pool_handle(), shared with them.
  void capture_begin(caching::PoolId pool, capture::Mode mode);
  void capture_end();
  void instantiate();
  void replay();
  // Drops the recording and the graph's use of its pool; the graph can
  // capture again.
  void reset();
  caching::PoolId pool() const;
  // torch.cuda.CUDAGraph's debug mode keeps the graph for debug_dump; a
  // shim graph always keeps its recording, so there is nothing to enable.
  void enable_debug_mode() {}
  // Writes the recorded nodes as text, one per line.
  void debug_dump(const std::string& path) const;

  size_t num_nodes() const { return recording_.nodes.size(); }
  bool capturing() const { return capture_id_ != 0; }
  // Whether replay() is one launch of the plugin's native graph.
  bool native() const { return native_exec_ != nullptr; }

 private:
  void end_routing() noexcept;
  std::string describe() const;
  // Records the recording into a plugin graph; false (nothing kept) when
  // a kernel declines to be captured.
  bool build_native();
  void release_native();

  bool keep_graph_;
  bool has_graph_ = false;
  bool instantiated_ = false;
  c10::DeviceIndex device_ = -1;
  TFL_Stream* capture_stream_ = nullptr;
  uint64_t capture_id_ = 0;
  bool routing_ = false;
  caching::PoolId pool_{0, 0};
  capture::Recording recording_;
  TFL_Graph* native_graph_ = nullptr;
  TFL_GraphExec* native_exec_ = nullptr;
  std::vector<TFL_Stream*> launch_streams_;  // streams native launches went to
};

// A pool id to share between captures (torch.<device>.graph_pool_handle()).
caching::PoolId graph_pool_handle();

}  // namespace torchfl::graphs

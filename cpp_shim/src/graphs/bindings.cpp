// torch_fl._C's graph functions (graphs/graph.h), added to the module by
// PyInit__C. A graph is a capsule that owns its Graph; torch_fl's
// device_module/graphs.py wraps it in the torch.cuda-shaped classes.
#include "python_module.h"

#include "graphs/bindings.h"
#include "graphs/graph.h"
#include "graphs/graph_impl.h"
#include "runtime/capture.h"
#include "runtime/runtime.h"
#include "runtime/streams.h"

namespace torchfl::graphs {
namespace {

using py::translated;

constexpr const char* kCapsule = "torch_fl._C.Graph";

void destroy_graph(PyObject* capsule) {
  delete static_cast<Graph*>(PyCapsule_GetPointer(capsule, kCapsule));
}

Graph* graph_of(PyObject* capsule) {
  return static_cast<Graph*>(PyCapsule_GetPointer(capsule, kCapsule));  // NULL with TypeError set on a bad object
}

PyObject* pool_tuple(caching::PoolId id) {
  return Py_BuildValue("(KK)", static_cast<unsigned long long>(id.first), static_cast<unsigned long long>(id.second));
}

PyObject* graph_new(PyObject*, PyObject* arg) {
  const int keep = PyObject_IsTrue(arg);
  if (keep < 0) return nullptr;
  auto* graph = new Graph(keep != 0);
  PyObject* capsule = PyCapsule_New(graph, kCapsule, &destroy_graph);
  if (capsule == nullptr) delete graph;
  return capsule;
}

PyObject* graph_capture_begin(PyObject*, PyObject* args) {
  PyObject* capsule = nullptr;
  unsigned long long a = 0, b = 0;
  const char* mode = nullptr;
  if (!PyArg_ParseTuple(args, "O(KK)s", &capsule, &a, &b, &mode)) return nullptr;
  Graph* graph = graph_of(capsule);
  if (graph == nullptr) return nullptr;
  return translated([graph, a, b, mode]() -> PyObject* {
    graph->capture_begin({a, b}, capture::parse_mode(mode));
    Py_RETURN_NONE;
  });
}

// The methods that take only the graph.
template <void (Graph::*Method)()>
PyObject* call(PyObject*, PyObject* capsule) {
  Graph* graph = graph_of(capsule);
  if (graph == nullptr) return nullptr;
  return translated([graph]() -> PyObject* {
    (graph->*Method)();
    Py_RETURN_NONE;
  });
}

PyObject* graph_replay(PyObject*, PyObject* capsule) {
  Graph* graph = graph_of(capsule);
  if (graph == nullptr) return nullptr;
  // Without the GIL: submitting may wait for room in the plugin's queues.
  return py::without_gil(
      [graph] {
        graph->replay();
        return true;
      },
      [](bool) { Py_RETURN_NONE; });
}

PyObject* graph_pool(PyObject*, PyObject* capsule) {
  Graph* graph = graph_of(capsule);
  if (graph == nullptr) return nullptr;
  return translated([graph] { return pool_tuple(graph->pool()); });
}

PyObject* graph_num_nodes(PyObject*, PyObject* capsule) {
  Graph* graph = graph_of(capsule);
  if (graph == nullptr) return nullptr;
  return PyLong_FromSize_t(graph->num_nodes());
}

PyObject* graph_is_native(PyObject*, PyObject* capsule) {
  Graph* graph = graph_of(capsule);
  if (graph == nullptr) return nullptr;
  return PyBool_FromLong(graph->native());
}

PyObject* graph_debug_dump(PyObject*, PyObject* args) {
  PyObject* capsule = nullptr;
  const char* path = nullptr;
  if (!PyArg_ParseTuple(args, "Os", &capsule, &path)) return nullptr;
  Graph* graph = graph_of(capsule);
  if (graph == nullptr) return nullptr;
  return translated([graph, path]() -> PyObject* {
    graph->debug_dump(path);
    Py_RETURN_NONE;
  });
}

PyObject* graph_pool_handle_py(PyObject*, PyObject*) {
  return translated([] { return pool_tuple(graph_pool_handle()); });
}

PyObject* stream_is_capturing(PyObject*, PyObject* arg) {
  c10::DeviceIndex index = -1;
  if (!py::device_arg(arg, &index)) return nullptr;
  return translated([index] {
    if (!capture::any() || attached_device() == nullptr) Py_RETURN_FALSE;
    const c10::DeviceIndex device = index == -1 ? current_device() : index;
    check_device_index(device);
    return PyBool_FromLong(capture::capture_of(plugin_stream(current_stream(device))) != 0);
  });
}

PyObject* register_graph_impl_py(PyObject*, PyObject*) {
  return translated([] { return PyBool_FromLong(register_graph_impl()); });
}

// Docstrings start with the signature (Argument Clinic's form), as
// module.cpp's do, for inspect.signature and the stub check.
PyMethodDef g_methods[] = {
    {"graph_new", graph_new, METH_O,
     "graph_new($module, keep_graph, /)\n--\n\nA new, empty device graph (a capsule that owns it)."},
    {"graph_capture_begin", graph_capture_begin, METH_VARARGS,
     "graph_capture_begin($module, graph, pool, mode, /)\n--\n\nStarts capturing the current stream of the current "
     "device into `graph`; `pool` is (0, 0) for a pool of its own; `mode` a capture_error_mode."},
    {"graph_capture_end", call<&Graph::capture_end>, METH_O,
     "graph_capture_end($module, graph, /)\n--\n\nEnds the capture (on the stream it began on)."},
    {"graph_instantiate", call<&Graph::instantiate>, METH_O,
     "graph_instantiate($module, graph, /)\n--\n\nMakes the captured graph replayable."},
    {"graph_replay", graph_replay, METH_O,
     "graph_replay($module, graph, /)\n--\n\nSubmits the captured work on the current stream, without the GIL."},
    {"graph_reset", call<&Graph::reset>, METH_O,
     "graph_reset($module, graph, /)\n--\n\nDrops the capture and the graph's use of its memory pool."},
    {"graph_pool", graph_pool, METH_O,
     "graph_pool($module, graph, /)\n--\n\nThe id (a, b) of the graph's memory pool."},
    {"graph_num_nodes", graph_num_nodes, METH_O,
     "graph_num_nodes($module, graph, /)\n--\n\nHow many kernel launches and copies the graph holds."},
    {"graph_is_native", graph_is_native, METH_O,
     "graph_is_native($module, graph, /)\n--\n\nWhether a replay is one launch of the plugin's native graph (ABI "
     "1.7)."},
    {"graph_debug_dump", graph_debug_dump, METH_VARARGS,
     "graph_debug_dump($module, graph, path, /)\n--\n\nWrites the graph's nodes to `path` as text."},
    {"graph_pool_handle", graph_pool_handle_py, METH_NOARGS,
     "graph_pool_handle($module, /)\n--\n\nA fresh pool id (0, n) for captures to share."},
    {"stream_is_capturing", stream_is_capturing, METH_O,
     "stream_is_capturing($module, device, /)\n--\n\nWhether this thread's current stream of `device` (-1: the "
     "current device) is being captured."},
    {"register_graph_impl", register_graph_impl_py, METH_NOARGS,
     "register_graph_impl($module, /)\n--\n\nRegisters the device's torch.accelerator.Graph implementation (once; "
     "after the device is named). False on a torch without PyTorch's graph registry."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

PyMethodDef* python_methods() {
  return g_methods;
}

}  // namespace torchfl::graphs

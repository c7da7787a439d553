// torch_fl._C: the shim's own Python module, for everything PyTorch-facing
// that the Rust core never touches (the fallback policy and its counts, the
// layer profile, the memory snapshot, the device trace, generators, host
// synchronization counters). The shim library is this extension module; its
// one export is PyInit__C. The core's table (interface.h) reaches Rust as
// the capsule `_shim_interface`, so nothing else is exported or looked up
// by name.
//
// Plain CPython API: pybind11 would add seconds of compile time per build
// (and the first use under another torch builds the shim on the user's
// machine) for a dozen functions of scalars and strings.

// Python's headers come first, as the CPython documentation requires;
// torch/csrc/Generator.h brings them.
#include <torch/csrc/Generator.h>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/fallback.h"
#include "graphs/bindings.h"
#include "interface.h"
#include "memory/caching_allocator.h"
#include "memory/device_allocator.h"
#include "observe/layer_profile.h"
#include "observe/trace.h"
#include "python_module.h"
#include "runtime/generator.h"
#include "runtime/runtime.h"
#include "runtime/streams.h"

using torchfl::py::device_arg;
using torchfl::py::message_of;
using torchfl::py::translated;
using torchfl::py::unicode;
using torchfl::py::without_gil;

namespace {

// {name: count} from `items`; `entry(item)` is the item's (name, count).
template <typename Items, typename Entry>
PyObject* count_dict(const Items& items, Entry entry) {
  PyObject* dict = PyDict_New();
  if (dict == nullptr) return nullptr;
  for (const auto& item : items) {
    const auto [name, count] = entry(item);
    PyObject* v = PyLong_FromUnsignedLongLong(count);
    if (v == nullptr || PyDict_SetItemString(dict, name, v) != 0) {
      Py_XDECREF(v);
      Py_DECREF(dict);
      return nullptr;
    }
    Py_DECREF(v);
  }
  return dict;
}

// {name: value} from (name, value) pairs of counters.
template <size_t N>
PyObject* counters(const std::pair<const char*, uint64_t> (&items)[N]) {
  return count_dict(items, [](const auto& item) { return item; });
}

PyObject* set_fallback_mode(PyObject*, PyObject* arg) {
  const char* mode = PyUnicode_AsUTF8(arg);
  if (mode == nullptr) return nullptr;
  const std::string m = mode;
  if (m != "cpu" && m != "error") {
    PyErr_Format(PyExc_ValueError, "fallback mode must be 'cpu' or 'error', not %R", arg);
    return nullptr;
  }
  torchfl::set_fallback_mode(m == "error" ? torchfl::FallbackMode::Error : torchfl::FallbackMode::Cpu);
  Py_RETURN_NONE;
}

PyObject* fallback_mode(PyObject*, PyObject*) {
  return PyUnicode_FromString(torchfl::fallback_mode() == torchfl::FallbackMode::Error ? "error" : "cpu");
}

PyObject* fallback_counts(PyObject*, PyObject*) {
  return translated([]() -> PyObject* {
    const std::vector<torchfl::FallbackCount> counts = torchfl::fallback_counts();
    return count_dict(counts, [](const torchfl::FallbackCount& c) { return std::pair(c.op_name.c_str(), c.count); });
  });
}

PyObject* reset_fallback_counts(PyObject*, PyObject*) {
  return translated([]() -> PyObject* {
    torchfl::reset_fallback_counts();
    Py_RETURN_NONE;
  });
}

PyObject* set_layer_profiling(PyObject*, PyObject* arg) {
  const int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  torchfl::set_layer_profiling(on != 0);
  Py_RETURN_NONE;
}

PyObject* layer_profile(PyObject*, PyObject*) {
  const torchfl::LayerProfile p = torchfl::layer_profile();
  const std::pair<const char*, uint64_t> items[] = {
      {"entries", p.entries},           {"entry_ns", p.entry_ns}, {"kernel_ns", p.kernel_ns},
      {"kernel_calls", p.kernel_calls}, {"alloc_ns", p.alloc_ns}, {"alloc_calls", p.alloc_calls},
  };
  return counters(items);
}

PyObject* reset_layer_profile(PyObject*, PyObject*) {
  torchfl::reset_layer_profile();
  Py_RETURN_NONE;
}

PyObject* layer_profile_operators_json(PyObject*, PyObject*) {
  return translated([] { return unicode(torchfl::layer_profile_operators_json()); });
}

PyObject* memory_snapshot_json(PyObject*, PyObject*) {
  return translated([] { return unicode(torchfl::memory_snapshot_json()); });
}

// Private memory pools (torch.<device>.MemPool): each function takes the
// device index and, but for mempool_create, the pool id (a, b).
bool pool_args(PyObject* args, c10::DeviceIndex* device, torchfl::caching::PoolId* id) {
  int index = -1;
  unsigned long long a = 0, b = 0;
  if (!PyArg_ParseTuple(args, "i(KK)", &index, &a, &b)) return false;
  *device = static_cast<c10::DeviceIndex>(index);
  *id = {a, b};
  return true;
}

void check_pools_available() {
  TORCH_CHECK(torchfl::caching_enabled(),
              "torch-fl: memory pools are part of torch-fl's caching allocator, which is off (TORCH_FL_ALLOC_CONF="
              "backend:plugin, or a plugin that caches memory itself): unset TORCH_FL_ALLOC_CONF to use MemPool");
}

PyObject* mempool_create(PyObject*, PyObject* arg) {
  c10::DeviceIndex index = -1;
  if (!device_arg(arg, &index)) return nullptr;
  return translated([index] {
    check_pools_available();
    torchfl::check_device_index(index);
    const torchfl::caching::PoolId id = torchfl::caching::create_pool(index, /*graph=*/false);
    return Py_BuildValue("(KK)", static_cast<unsigned long long>(id.first), static_cast<unsigned long long>(id.second));
  });
}

// Parses (device, id) from `args` and runs body(device, id) with C++
// exceptions translated.
template <typename F>
PyObject* with_pool(PyObject* args, F&& body) {
  c10::DeviceIndex index = -1;
  torchfl::caching::PoolId id;
  if (!pool_args(args, &index, &id)) return nullptr;
  return translated([&] { return body(index, id); });
}

PyObject* mempool_release(PyObject*, PyObject* args) {
  return with_pool(args, [](c10::DeviceIndex index, torchfl::caching::PoolId id) -> PyObject* {
    torchfl::caching::release_pool(index, id);
    Py_RETURN_NONE;
  });
}

PyObject* mempool_use_count(PyObject*, PyObject* args) {
  return with_pool(args, [](c10::DeviceIndex index, torchfl::caching::PoolId id) {
    return PyLong_FromLong(torchfl::caching::pool_use_count(index, id));
  });
}

PyObject* mempool_begin(PyObject*, PyObject* args) {
  return with_pool(args, [](c10::DeviceIndex index, torchfl::caching::PoolId id) -> PyObject* {
    check_pools_available();
    torchfl::caching::begin_allocate_to_pool(index, id);
    Py_RETURN_NONE;
  });
}

PyObject* mempool_end(PyObject*, PyObject* args) {
  return with_pool(args, [](c10::DeviceIndex index, torchfl::caching::PoolId id) -> PyObject* {
    torchfl::caching::end_allocate_to_pool(index, id);
    Py_RETURN_NONE;
  });
}

PyObject* allocator_backend(PyObject*, PyObject*) {
  try {
    return PyUnicode_FromString(torchfl::caching_enabled() ? "caching" : "plugin");
  } catch (const std::exception& e) {
    // Only the setting can be wrong here: say which value and what to set.
    const char* conf = std::getenv("TORCH_FL_ALLOC_CONF");
    const std::string text = "TORCH_FL_ALLOC_CONF=\"" + std::string(conf == nullptr ? "" : conf) +
                             "\" is invalid: " + message_of(e) +
                             ". Set backend:caching (the default) or backend:plugin, or unset it";
    PyErr_SetString(PyExc_RuntimeError, text.c_str());
    return nullptr;
  }
}

PyObject* trace_begin(PyObject*, PyObject*) {
  return translated([] { return PyLong_FromUnsignedLongLong(torchfl::trace_begin()); });
}

bool token_arg(PyObject* arg, uint64_t* token) {
  const unsigned long long value = PyLong_AsUnsignedLongLong(arg);
  if (value == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return false;
  *token = value;
  return true;
}

PyObject* trace_collect(PyObject*, PyObject* arg) {
  uint64_t token = 0;
  if (!token_arg(arg, &token)) return nullptr;
  return without_gil([token] { return torchfl::trace_json(token); }, unicode);
}

PyObject* trace_end(PyObject*, PyObject* arg) {
  uint64_t token = 0;
  if (!token_arg(arg, &token)) return nullptr;
  return translated([token]() -> PyObject* {
    torchfl::trace_end(token);
    Py_RETURN_NONE;
  });
}

PyObject* activity_status(PyObject*, PyObject*) {
  return Py_BuildValue("(OO)", torchfl::activity::available() ? Py_True : Py_False,
                       torchfl::activity::has_ranges() ? Py_True : Py_False);
}

// The range entries take a str; the plugin gets it as UTF-8.
PyObject* range_call(PyObject* arg, void (*forward)(const char*) noexcept) {
  const char* name = PyUnicode_AsUTF8(arg);
  if (name == nullptr) return nullptr;
  forward(name);
  Py_RETURN_NONE;
}

PyObject* range_push(PyObject*, PyObject* arg) {
  return range_call(arg, &torchfl::activity::range_push);
}

PyObject* range_mark(PyObject*, PyObject* arg) {
  return range_call(arg, &torchfl::activity::range_mark);
}

PyObject* range_pop(PyObject*, PyObject*) {
  torchfl::activity::range_pop();
  Py_RETURN_NONE;
}

PyObject* wait_current_stream_if_pending(PyObject*, PyObject* arg) {
  c10::DeviceIndex index = -1;
  if (!device_arg(arg, &index)) return nullptr;
  return without_gil(
      [index] {
        if (index >= 0) torchfl::check_device_index(index);
        return torchfl::wait_current_stream_if_pending(index);
      },
      [](bool waited) { return PyBool_FromLong(waited ? 1 : 0); });
}

PyObject* sync_counts(PyObject*, PyObject*) {
  const torchfl::SyncCounts c = torchfl::sync_counts();
  const std::pair<const char*, uint64_t> items[] = {{"host_kernel_waits", c.host_kernel_waits},
                                                    {"copy_waits", c.copy_waits}};
  return counters(items);
}

PyObject* reset_sync_counts(PyObject*, PyObject*) {
  torchfl::reset_sync_counts();
  Py_RETURN_NONE;
}

// Raises torch_fl.errors.TorchIntegrationError, as the core's errors about
// PyTorch are raised (RuntimeError should the package be half imported).
void raise_integration_error(const std::string& message) {
  const std::string text = "PyTorch integration failed: " + message;
  PyObject* errors = PyImport_ImportModule("torch_fl.errors");
  PyObject* cls = errors == nullptr ? nullptr : PyObject_GetAttrString(errors, "TorchIntegrationError");
  Py_XDECREF(errors);
  if (cls == nullptr) {
    PyErr_Clear();
    PyErr_SetString(PyExc_RuntimeError, text.c_str());
    return;
  }
  PyErr_SetString(cls, text.c_str());
  Py_DECREF(cls);
}

PyObject* default_generator(PyObject*, PyObject* arg) {
  c10::DeviceIndex index = -1;
  if (!device_arg(arg, &index)) return nullptr;
  try {
    torchfl::check_device_index(index);
    // THPGenerator_Wrap keeps one Python object per generator, so every call
    // (and torch._C._accelerator_getDefaultGenerator where it exists)
    // returns the same torch.Generator.
    return THPGenerator_Wrap(torchfl::default_generator(index));
  } catch (const std::exception& e) {
    raise_integration_error(message_of(e));
  } catch (...) {
    raise_integration_error("unknown C++ exception");
  }
  return nullptr;
}

// Docstrings start with the signature (Argument Clinic's form), so that
// inspect.signature, and with it the stub check, sees the parameters.
PyMethodDef methods[] = {
    {"set_fallback_mode", set_fallback_mode, METH_O,
     "set_fallback_mode($module, mode, /)\n--\n\nSets the CPU-fallback policy: \"cpu\" or \"error\"."},
    {"fallback_mode", fallback_mode, METH_NOARGS,
     "fallback_mode($module, /)\n--\n\nThe CPU-fallback policy: \"cpu\" or \"error\"."},
    {"fallback_counts", fallback_counts, METH_NOARGS,
     "fallback_counts($module, /)\n--\n\n{operator: times it fell back to the CPU}."},
    {"reset_fallback_counts", reset_fallback_counts, METH_NOARGS,
     "reset_fallback_counts($module, /)\n--\n\nForgets the fallback counts and the once-per-operator warnings."},
    {"set_layer_profiling", set_layer_profiling, METH_O,
     "set_layer_profiling($module, on, /)\n--\n\nTurns the layer profile (time in torch-fl's operator entries and in "
     "plugin kernels) on or off."},
    {"layer_profile", layer_profile, METH_NOARGS,
     "layer_profile($module, /)\n--\n\nThe layer profile counters: {\"entries\", \"entry_ns\", \"kernel_ns\", "
     "\"kernel_calls\", \"alloc_ns\", \"alloc_calls\"}."},
    {"reset_layer_profile", reset_layer_profile, METH_NOARGS,
     "reset_layer_profile($module, /)\n--\n\nZeroes the layer profile counters, the per-operator ones included."},
    {"layer_profile_operators_json", layer_profile_operators_json, METH_NOARGS,
     "layer_profile_operators_json($module, /)\n--\n\nThe layer profile per operator, as a JSON array of "
     "{\"operator\", \"entries\", \"entry_ns\", \"kernel_ns\"} objects sorted by operator name."},
    {"mempool_create", mempool_create, METH_O,
     "mempool_create($module, device, /)\n--\n\nA new private memory pool on the device, with one use: its id (a, "
     "b)."},
    {"mempool_release", mempool_release, METH_VARARGS,
     "mempool_release($module, device, id, /)\n--\n\nDrops one use of the pool; at none its cached memory goes back "
     "to the plugin at the next empty_cache()."},
    {"mempool_use_count", mempool_use_count, METH_VARARGS,
     "mempool_use_count($module, device, id, /)\n--\n\nThe pool's uses (0 once released)."},
    {"mempool_begin", mempool_begin, METH_VARARGS,
     "mempool_begin($module, device, id, /)\n--\n\nRoutes the calling thread's allocations on the device to the "
     "pool."},
    {"mempool_end", mempool_end, METH_VARARGS,
     "mempool_end($module, device, id, /)\n--\n\nEnds the innermost routing of this thread to the pool."},
    {"memory_snapshot_json", memory_snapshot_json, METH_NOARGS,
     "memory_snapshot_json($module, /)\n--\n\nThe device allocator's segments and blocks, as a JSON document in the "
     "form of torch.cuda.memory._snapshot()."},
    {"allocator_backend", allocator_backend, METH_NOARGS,
     "allocator_backend($module, /)\n--\n\n\"caching\" or \"plugin\": whether device allocations go through "
     "torch-fl's caching allocator (decided at the first allocation; before that, what it will be)."},
    {"trace_begin", trace_begin, METH_NOARGS,
     "trace_begin($module, /)\n--\n\nStarts a device-trace consumer (recording on); returns its token, for "
     "trace_collect and trace_end."},
    {"trace_collect", trace_collect, METH_O,
     "trace_collect($module, token, /)\n--\n\nThe consumer's device-trace records and the plugin's activity "
     "records as JSON (cpp_shim/src/observe/trace.h); waits for the devices' queued work, without the GIL."},
    {"trace_end", trace_end, METH_O,
     "trace_end($module, token, /)\n--\n\nEnds a device-trace consumer; the last one turns recording off."},
    {"activity_status", activity_status, METH_NOARGS,
     "activity_status($module, /)\n--\n\n(records, ranges): whether the attached plugin reports activity records "
     "(ABI 1.8) and whether it forwards user ranges."},
    {"range_push", range_push, METH_O,
     "range_push($module, name, /)\n--\n\nOpens a user range in the plugin (its vendor tools see it); no-op "
     "without range entries."},
    {"range_pop", range_pop, METH_NOARGS,
     "range_pop($module, /)\n--\n\nCloses this thread's innermost user range in the plugin."},
    {"range_mark", range_mark, METH_O, "range_mark($module, name, /)\n--\n\nMarks an instant in the plugin."},
    {"wait_current_stream_if_pending", wait_current_stream_if_pending, METH_O,
     "wait_current_stream_if_pending($module, device, /)\n--\n\nBefore a host kernel over device memory "
     "(Inductor's generated code): synchronizes this thread's current stream of `device` (-1: the current device) "
     "if work was queued on it since the last such wait. Returns whether it waited."},
    {"sync_counts", sync_counts, METH_NOARGS,
     "sync_counts($module, /)\n--\n\nHost synchronizations torch-fl made: {\"host_kernel_waits\", \"copy_waits\"}."},
    {"reset_sync_counts", reset_sync_counts, METH_NOARGS,
     "reset_sync_counts($module, /)\n--\n\nZeroes the host synchronization counters."},
    {"default_generator", default_generator, METH_O,
     "default_generator($module, device, /)\n--\n\nThe torch.Generator of `device`'s default generator (the same "
     "object on every call): what torch.<name>.manual_seed and the RNG state functions use on torch releases "
     "without torch._C._accelerator_getDefaultGenerator (2.13)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "torch_fl._C",
    "torch-fl's C++ shim inside PyTorch's dispatcher: its PyTorch-facing functions, and the table the Rust core "
    "attaches with (_shim_interface).",
    -1,
    methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__C(void) {
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  if (PyModule_AddFunctions(module, torchfl::graphs::python_methods()) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  // The capsule does not own the table: it is static (interface.cpp).
  PyObject* capsule =
      PyCapsule_New(const_cast<TFL_ShimInterface*>(torchfl::shim_interface()), TFL_SHIM_CAPSULE_NAME, nullptr);
  if (capsule == nullptr) {
    Py_DECREF(module);
    return nullptr;
  }
  if (PyModule_AddObject(module, "_shim_interface", capsule) != 0) {  // steals `capsule` only on success
    Py_DECREF(capsule);
    Py_DECREF(module);
    return nullptr;
  }
  if (PyModule_AddIntConstant(module, "INTERFACE_VERSION", TFL_SHIM_INTERFACE_VERSION) != 0 ||
      PyModule_AddStringConstant(module, "TORCH_VERSION", torchfl::shim_interface()->torch_version) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}

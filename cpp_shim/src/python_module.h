// Helpers for the CPython functions of torch_fl._C (module.cpp and the
// graphs' bindings): C++ exceptions as Python errors, work without the GIL,
// and argument conversion.
//
// Include first in a translation unit: Python's headers must precede any
// standard header, as the CPython documentation requires.
#pragma once

#include <Python.h>

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <exception>
#include <optional>
#include <string>

namespace torchfl::py {

// A C++ exception's message, the way torch's own bindings show it (no C++
// backtrace).
inline std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

// Runs `body` (which returns a new reference, or NULL with an exception
// set) with C++ exceptions raised as RuntimeError, as the shim's other
// PyTorch-facing errors are, but for c10::ValueError (TORCH_CHECK_VALUE):
// ValueError, as torch's own bindings raise it.
template <typename F>
inline PyObject* translated(F&& body) {
  try {
    return body();
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, message_of(e).c_str());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "torch-fl shim: unknown C++ exception");
  }
  return nullptr;
}

// Runs `body` without the GIL (it may wait for device work), then converts
// its result with `to_python` once the GIL is held again.
template <typename F, typename G>
inline PyObject* without_gil(F&& body, G&& to_python) {
  std::optional<decltype(body())> result;
  std::string error;
  Py_BEGIN_ALLOW_THREADS;
  try {
    result.emplace(body());
  } catch (const std::exception& e) {
    error = message_of(e);
  } catch (...) {
    error = "torch-fl shim: unknown C++ exception";
  }
  Py_END_ALLOW_THREADS;
  if (!result) {
    PyErr_SetString(PyExc_RuntimeError, error.c_str());
    return nullptr;
  }
  return to_python(*result);
}

inline PyObject* unicode(const std::string& s) {
  return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
}

// A device index argument: a Python int that fits c10::DeviceIndex, -1
// meaning "the current device" where a function allows it.
inline bool device_arg(PyObject* arg, c10::DeviceIndex* out) {
  const long v = PyLong_AsLong(arg);
  if (v == -1 && PyErr_Occurred()) return false;
  if (v < -1 || v > 127) {
    PyErr_Format(PyExc_RuntimeError, "Invalid device index %ld", v);
    return false;
  }
  *out = static_cast<c10::DeviceIndex>(v);
  return true;
}

}  // namespace torchfl::py

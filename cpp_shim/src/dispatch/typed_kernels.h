// Unboxed entry points for plugin kernels of common operator signatures.
//
// A boxed kernel makes the dispatcher copy every argument into an IValue.
// For a tensor Python owns, that copy takes the C++ refcount from 1 to 2 and
// back, and each crossing increfs or decrefs the PyObject, taking the GIL the
// Python binding had released: about 0.1 us per tensor argument, a large
// share of a small op. Operators whose signature is in a small menu
// (elementwise ops with tensors and Scalars, reductions over dims) are
// registered with a typed entry instead, which reads its arguments by
// reference. Its fast path covers the common case - one device, a memo hit
// for the outputs, a kernel that succeeds - and everything else (first call
// for a signature, device errors, fallbacks, random or dynamic-shape ops)
// boxes the arguments and runs the general PluginKernel path.
#pragma once

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/dispatch/CppSignature.h>

#include <optional>

#include "dispatch/plugin_kernel.h"

namespace torchfl {

// An entry as c10::Dispatcher::registerImpl takes it. Registration goes
// straight to the dispatcher rather than through torch::Library, which
// would parse the operator name again and format a debug string per
// operator (registration.cpp).
struct EntryKernel {
  c10::KernelFunction kernel;
  std::optional<c10::impl::CppSignature> signature;  // typed entries only
};

// A typed entry for `kernel`'s operator, or nullopt when its signature is
// not in the menu (register the boxed entry then). Its C++ signature has
// been checked against the operator's schema.
std::optional<EntryKernel> typed_entry(PluginKernel* kernel);

// The boxed entry: forwards to `kernel`.
EntryKernel boxed_entry(PluginKernel* kernel);

}  // namespace torchfl

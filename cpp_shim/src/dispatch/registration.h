// Registering plugin kernels with the dispatcher at run time
// (TFL_ShimInterface.register_kernel).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include "torchfl_shim.h"

namespace torchfl {

class PluginKernel;

// Registers `kernel` and returns the outcome. Throws ShimError
// (TFL_SHIM_ERROR_INVALID / _UNKNOWN_OP) or c10::Error (PyTorch refused).
// Serialized internally; callable from any thread.
TFL_ShimRegistration register_kernel(const TFL_ShimKernel& kernel);

// Whether any external operator's kernel (TFL_OP_EXTERNAL) still waits for
// its library to define the operator. Lock-free.
bool has_pending_kernels();

// Binds the pending kernel for `op`, now that its library has defined it,
// and returns the kernel object that serves it on the device; nullptr when
// none is pending for `op` or binding failed (warned: e.g. the library's
// schema differs from the plugin's). For the boxed fallback, which every
// operator without a device kernel reaches.
PluginKernel* bind_pending(const c10::OperatorHandle& op);

}  // namespace torchfl

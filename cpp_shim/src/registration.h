// Registering plugin kernels with the dispatcher at run time
// (tfl_shim_register_kernel).
#pragma once

#include "torchfl_shim.h"

namespace torchfl {

// Registers `kernel` and returns the outcome. Throws ShimError
// (TFL_SHIM_ERROR_INVALID / _UNKNOWN_OP) or c10::Error (PyTorch refused).
// Serialized internally; callable from any thread.
TFL_ShimRegistration register_kernel(const TFL_ShimKernel& kernel);

}  // namespace torchfl

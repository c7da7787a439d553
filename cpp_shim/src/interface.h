// The Rust core's table (include/torchfl_shim.h), which the Python module
// (module.cpp) hands to the core in a capsule.
#pragma once

#include "torchfl_shim.h"

namespace torchfl {

// The process' one table; static storage.
const TFL_ShimInterface* shim_interface();

}  // namespace torchfl

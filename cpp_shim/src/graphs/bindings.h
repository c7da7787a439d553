// torch_fl._C's device-graph functions (bindings.cpp).
#pragma once

#include <Python.h>

namespace torchfl::graphs {

// The functions, NULL-terminated, for PyModule_AddFunctions.
PyMethodDef* python_methods();

}  // namespace torchfl::graphs

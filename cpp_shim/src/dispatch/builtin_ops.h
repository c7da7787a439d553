// Which operators the shim implements itself (builtin_ops.cpp); plugin
// kernels for them are not registered (TFL_SHIM_SKIPPED_BUILTIN).
#pragma once

#include <ATen/core/operator_name.h>

namespace torchfl {

bool is_builtin_op(const c10::OperatorName& name);

}  // namespace torchfl

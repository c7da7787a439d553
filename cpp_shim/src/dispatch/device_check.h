// The same-device check PyTorch's dispatcher does not do for PrivateUse1.
//
// CUDA kernels get a device check from codegen; PrivateUse1 kernels and the
// boxed CPU fallback get none (notes §5, pitfall P4), so without this
// `sim_tensor + cpu_matrix` would silently copy or crash in the plugin. The
// message is TensorIterator's, which users know from CUDA. 0-dim CPU tensors
// are exempt: PyTorch allows them beside device tensors (Python scalars
// often arrive as wrapped 0-dim CPU tensors).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <optional>

namespace torchfl {

// Returns the common device of the tensor arguments `args` (the last
// arguments of `op` on the stack), or nullopt when all are 0-dim CPU
// tensors or there are none. Raises RuntimeError for two different devices.
std::optional<c10::Device> check_same_device(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args);

}  // namespace torchfl

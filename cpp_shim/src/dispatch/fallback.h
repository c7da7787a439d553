// The fallback for operators no plugin serves (registered as the boxed
// PrivateUse1 fallback, and run by plugin kernels that return
// UNIMPLEMENTED).
//
// Policy (torch_fl._C.set_fallback_mode, initially env TORCH_FL_FALLBACK):
//   cpu    run the operator on the CPU, warning once per operator;
//   error  raise NotImplementedError naming the operator and the kernel
//          symbol a vendor would export.
// On the CPU: when device memory is host-addressable, device memory is
// wrapped as CPU tensors (zero copy) so results land in place and views
// keep sharing storage; otherwise PyTorch's cpu_fallback copies arguments
// to the host and back, and view operators are an error (a view of a copy
// would silently stop aliasing).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torchfl {

// `plugin_reason`: why a plugin kernel declined (its UNIMPLEMENTED
// message), or nullptr when no plugin serves the operator.
void run_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack,
                  const std::string* plugin_reason);

enum class FallbackMode : int32_t { Cpu = 0, Error = 1 };
void set_fallback_mode(FallbackMode mode);
FallbackMode fallback_mode();

struct FallbackCount {
  std::string op_name;  // "exp.out", "sim::foo"
  uint64_t count;
};
// Operators that fell back, sorted by name.
std::vector<FallbackCount> fallback_counts();
void reset_fallback_counts();

// "[ns::]op[.overload]" with the aten namespace dropped, as op tables
// name operators.
std::string table_name(const c10::OperatorName& name);
// The kernel symbol a plugin exports for `name` (docs/plugin-abi.md,
// "Kernel symbols"), as the Rust core mangles it
// (TFL_ShimDevice.kernel_symbol).
std::string kernel_symbol(const c10::OperatorName& name);

}  // namespace torchfl

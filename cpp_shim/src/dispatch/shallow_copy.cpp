// Shallow-copy compatibility for the plugin device: why nn.Parameters keep
// their identity through Module.to(device), as on CUDA.
//
// nn.Module._apply keeps each Parameter object (it assigns `param.data =
// moved`) only when torch._has_compatible_shallow_copy_type(param, moved) is
// true; otherwise it builds new Parameters, so weights tied between modules
// untie and an optimizer built before .to() holds the old tensors. `param.data
// = t` (VariableHooks::set_data) refuses the same pairs ("incompatible tensor
// type"). Both ask the dispatcher operator aten::_has_compatible_shallow_copy_type:
// set_data's unqualified call binds to at::_has_compatible_shallow_copy_type, the
// dispatched function (checked on 2.14.1: a PrivateUse1 kernel is reached from
// `.data =`). PyTorch's CompositeImplicitAutograd kernel asks the inline
// TensorImpl::has_compatible_shallow_copy_type, whose dense backends (CPU, CUDA,
// MPS, HIP, XPU, HPU, MTIA) leave out PrivateUse1.
//
// The kernel below answers as that function does with PrivateUse1 among the
// dense backends: the pending upstream fix (pytorch#196975, #196978), which
// also makes a plugin tensor compatible with CUDA, XPU, ... like CPU is. The
// dispatcher picks it only when an argument is a PrivateUse1 tensor, so pairs
// without the plugin device keep PyTorch's kernel; sparse, meta and other
// non-dense tensors keep PyTorch's answer. The operator is
// CompositeImplicitAutograd, so a plugin's op table never replaces this kernel
// (registration.cpp skips such operators); AutogradPrivateUse1 takes PyTorch's
// autograd fallback, which passes the bool result through.
#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/library.h>

namespace torchfl {
namespace {

// c10/core/TensorImpl.h's dense_backends in 2.14.1, plus PrivateUse1Bit.
bool is_dense(c10::DispatchKeySet ks) {
  constexpr auto dense_backends =
      c10::DispatchKeySet({c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit, c10::BackendComponent::MPSBit,
                           c10::BackendComponent::HIPBit, c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
                           c10::BackendComponent::MTIABit, c10::BackendComponent::PrivateUse1Bit});
  constexpr auto dense_k = c10::DispatchKeySet(c10::DispatchKey::Dense);
  return ks.has_any(dense_k) && ks.has_any(dense_backends);
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (is_dense(self.key_set()) && is_dense(from.key_set()));
}

}  // namespace
}  // namespace torchfl

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(torchfl::has_compatible_shallow_copy_type));
}

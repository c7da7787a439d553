#include "dispatch/device_check.h"

#include <c10/util/Exception.h>

namespace torchfl {
namespace {

// Folds `t` into `common`; raises on a second device.
void visit(const at::Tensor& t, std::optional<c10::Device>& common, const c10::OperatorHandle& op, size_t arg) {
  if (!t.defined()) return;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Device device = impl->device();
  if (device.is_cpu() && impl->dim() == 0) return;  // CPU scalars allowed
  if (!common.has_value()) {
    common = device;
    return;
  }
  if (C10_LIKELY(*common == device)) return;
  TORCH_CHECK(false,
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ",
              *common, " and ", device, "! (when checking argument '", op.schema().arguments()[arg].name(),
              "' in method ", op.schema().operator_name(), ")");
}

}  // namespace

std::optional<c10::Device> check_same_device(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> common;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      visit(v.toTensor(), common, op, i);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) visit(t, common, op, i);
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        if (t.has_value()) visit(*t, common, op, i);
      }
    }
  }
  return common;
}

}  // namespace torchfl

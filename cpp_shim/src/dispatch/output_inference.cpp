#include "dispatch/output_inference.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <vector>

namespace torchfl {
namespace {

class SilentWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& /*warning*/) override {}
};

// A copy of `v` whose device tensors are meta tensors of the same metadata.
c10::IValue to_meta(const c10::IValue& v) {
  auto convert = [](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) {
      return t;  // undefined, or a CPU scalar: meta kernels accept those
    }
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::DeviceType::Meta));
  };
  if (v.isTensor()) return convert(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(convert(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
      out.push_back(t.has_value() ? std::optional<at::Tensor>(convert(*t)) : std::nullopt);
    }
    return out;
  }
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
    return c10::Device(c10::DeviceType::Meta);
  }
  if (v.isGenerator()) return c10::IValue();  // meta kernels draw nothing
  return v;
}

// A copy of `v` whose device tensors are empty CPU tensors of the same
// dtype and rank: every size 0, or with `keep_trailing` only the first
// (for kernels that check trailing sizes, like boxes of shape [N, 4]).
c10::IValue to_empty_cpu(const c10::IValue& v, bool keep_trailing) {
  auto convert = [keep_trailing](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) {
      return t;
    }
    std::vector<int64_t> sizes(static_cast<size_t>(t.dim()), 0);
    if (keep_trailing) {
      for (int64_t d = 1; d < t.dim(); ++d) sizes[static_cast<size_t>(d)] = t.size(d);
    }
    return at::empty(sizes, t.options().device(c10::DeviceType::CPU));
  };
  if (v.isTensor()) return convert(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(convert(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
      out.push_back(t.has_value() ? std::optional<at::Tensor>(convert(*t)) : std::nullopt);
    }
    return out;
  }
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
    return c10::Device(c10::DeviceType::CPU);
  }
  if (v.isGenerator()) return c10::IValue();
  return v;
}

OutputSpec spec_of(const at::Tensor& t) {
  OutputSpec spec;
  if (!t.defined()) {
    spec.undefined = true;
    return spec;
  }
  spec.sizes.assign(t.sizes().begin(), t.sizes().end());
  spec.strides.assign(t.strides().begin(), t.strides().end());
  spec.dtype = t.scalar_type();
  return spec;
}

}  // namespace

std::shared_ptr<const InferredOutputs> infer_with_meta(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                                       c10::ArrayRef<int> out_args) {
  torch::jit::Stack stack;
  stack.reserve(args.size());
  for (const c10::IValue& v : args) stack.push_back(to_meta(v));
  {
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  }
  auto result = std::make_shared<InferredOutputs>();
  for (size_t j = 0; j < stack.size(); ++j) {
    TORCH_INTERNAL_ASSERT(stack[j].isTensor() || stack[j].isNone(), op.schema().operator_name(), ": return ", j,
                          " is not a tensor");
    OutputSpec spec = stack[j].isNone() ? OutputSpec{} : spec_of(stack[j].toTensor());
    spec.undefined = spec.undefined || stack[j].isNone();
    if (j < out_args.size() && !spec.undefined) {
      const at::Tensor& real = args[out_args[j]].toTensor();
      spec.resize = !real.sizes().equals(spec.sizes);
      if (!spec.resize) {
        spec.strides.assign(real.strides().begin(), real.strides().end());
      }
    }
    result->outputs.push_back(std::move(spec));
  }
  return result;
}

std::shared_ptr<const InferredOutputs> infer_with_meta_on_device(const c10::OperatorHandle& op,
                                                                 c10::ArrayRef<c10::IValue> args,
                                                                 c10::ArrayRef<int> out_args) {
  torch::jit::Stack stack(args.begin(), args.end());
  for (c10::IValue& v : stack) {
    if (v.isGenerator()) v = c10::IValue();  // meta kernels draw nothing
  }
  {
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  }
  auto result = std::make_shared<InferredOutputs>();
  for (size_t j = 0; j < stack.size(); ++j) {
    TORCH_INTERNAL_ASSERT(stack[j].isTensor() || stack[j].isNone(), op.schema().operator_name(), ": return ", j,
                          " is not a tensor");
    OutputSpec spec = stack[j].isNone() ? OutputSpec{} : spec_of(stack[j].toTensor());
    spec.undefined = spec.undefined || stack[j].isNone();
    (void)out_args;  // the meta kernel resized out= arguments itself
    result->outputs.push_back(std::move(spec));
  }
  return result;
}

std::shared_ptr<const InferredOutputs> infer_dtypes_on_empty_cpu(const c10::OperatorHandle& op,
                                                                 c10::ArrayRef<c10::IValue> args) {
  auto run = [&](bool keep_trailing) {
    torch::jit::Stack stack;
    stack.reserve(args.size());
    for (const c10::IValue& v : args) stack.push_back(to_empty_cpu(v, keep_trailing));
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
    return stack;
  };
  torch::jit::Stack stack;
  try {
    stack = run(/*keep_trailing=*/false);
  } catch (const c10::NotImplementedError&) {
    throw;
  } catch (const std::exception&) {
    // A kernel that checks trailing sizes (torchvision::nms wants boxes of
    // shape [N, 4]): empty in the first dimension only. Its error, if it
    // fails again, is the one for these arguments.
    stack = run(/*keep_trailing=*/true);
  }
  auto result = std::make_shared<InferredOutputs>();
  for (const c10::IValue& r : stack) {
    TORCH_INTERNAL_ASSERT(r.isTensor(), op.schema().operator_name(), ": a return is not a tensor");
    OutputSpec spec;
    spec.sizes.push_back(0);
    spec.strides.push_back(1);
    spec.dtype = r.toTensor().scalar_type();
    result->outputs.push_back(std::move(spec));
  }
  return result;
}

}  // namespace torchfl

#include "dispatch/meta_kernel.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <memory>
#include <vector>

#include "dispatch/arguments.h"
#include "dispatch/call_frame.h"
#include "dispatch/dtype.h"
#include "runtime/fork.h"
#include "runtime/status.h"

namespace torchfl {
namespace {

constexpr size_t kMetaSize = TFL_STRUCT_SIZE(TFL_OutputMeta, shape);

// The frame's resize_output is never NULL; an infer call has no outputs to
// resize.
int32_t no_resize(const TFL_CallFrame*, size_t, int32_t, const int64_t*) noexcept {
  return TFL_ERROR_FAILED_PRECONDITION;
}

class MetaKernel final : public c10::OperatorKernel {
 public:
  MetaKernel(TFL_InferOutputsFn infer, const TFL_PluginApi* api, std::string label, std::string plugin_op,
             std::vector<ArgKind> kinds, size_t num_returns)
      : infer_(infer),
        api_(api),
        label_(std::move(label)),
        plugin_op_(std::move(plugin_op)),
        kinds_(std::move(kinds)),
        num_returns_(num_returns) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    check_not_forked("shape function of", plugin_op_.c_str());  // plugin code, like a kernel
    const auto args = torch::jit::last(*stack, kinds_.size());
    CallFrameBuilder fb;
    for (size_t i = 0; i < kinds_.size(); ++i) {
      TORCH_CHECK(add_argument(fb, kinds_[i], args[i]), op.operator_name(), ": argument ", i,
                  " has a dtype the plugin ABI cannot describe");
    }
    TFL_CallFrame* frame = fb.finish(plugin_op_.c_str(), 0, nullptr, &no_resize, nullptr);
    std::vector<TFL_OutputMeta> metas(num_returns_);
    for (TFL_OutputMeta& m : metas) {
      m = TFL_OutputMeta{};
      m.struct_size = kMetaSize;
      m.ndim = -1;  // a plugin that fills nothing is caught below
    }
    const PluginRef owner{api_, label_.c_str()};
    const std::string what = c10::str(plugin_op_, " (infer_outputs)");
    TFL_CHECK_STATUS(owner, what, infer_(frame, metas.data(), metas.size()));

    std::vector<at::Tensor> outputs;
    outputs.reserve(num_returns_);
    for (size_t j = 0; j < metas.size(); ++j) {
      const TFL_OutputMeta& m = metas[j];
      const std::optional<c10::ScalarType> dtype = from_tfl_dtype(m.dtype);
      TORCH_CHECK(m.ndim >= 0 && m.ndim <= TFL_MAX_OUTPUT_DIMS && dtype, "plugin ", label_, ": ", plugin_op_,
                  " (infer_outputs) reported output ", j, " with ndim ", m.ndim, " and dtype code ",
                  static_cast<int>(m.dtype.code), "/", static_cast<int>(m.dtype.bits),
                  ", which is not a tensor PyTorch can allocate; the plugin "
                  "must fill every output's dtype and shape");
      c10::IntArrayRef shape(m.shape, static_cast<size_t>(m.ndim));
      for (int64_t d : shape) {
        TORCH_CHECK(d >= 0, "plugin ", label_, ": ", plugin_op_,
                    " (infer_outputs) reported a negative size for output ", j, ": ", shape);
      }
      outputs.push_back(at::empty(shape, at::TensorOptions().dtype(*dtype).device(at::kMeta)));
    }
    torch::jit::drop(*stack, kinds_.size());
    for (at::Tensor& t : outputs) stack->emplace_back(std::move(t));
  }

 private:
  TFL_InferOutputsFn infer_;
  const TFL_PluginApi* api_;
  std::string label_;
  std::string plugin_op_;
  std::vector<ArgKind> kinds_;
  size_t num_returns_;
};

}  // namespace

std::optional<torch::CppFunction> make_meta_kernel(const c10::OperatorHandle& op, TFL_InferOutputsFn infer,
                                                   const TFL_PluginApi* owner_api, const std::string& plugin_label,
                                                   const std::string& plugin_op, std::string* why) {
  TORCH_INTERNAL_ASSERT(infer != nullptr && owner_api != nullptr);
  const c10::FunctionSchema& schema = op.schema();
  std::vector<ArgKind> kinds;
  for (const c10::Argument& a : schema.arguments()) {
    const std::optional<ArgKind> kind = classify_argument(a.type());
    if (!kind.has_value() || a.is_out()) {
      *why = c10::str("argument '", a.name(), "' (", a.type()->str(), ") cannot be passed to infer_outputs");
      return std::nullopt;
    }
    kinds.push_back(*kind);
  }
  for (const c10::Argument& r : schema.returns()) {
    if (r.type()->kind() != c10::TypeKind::TensorType || r.alias_info()) {
      *why = "infer_outputs serves operators returning fresh tensors only";
      return std::nullopt;
    }
  }
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<MetaKernel>(
      infer, owner_api, plugin_label, plugin_op, std::move(kinds), schema.returns().size()));
}

}  // namespace torchfl

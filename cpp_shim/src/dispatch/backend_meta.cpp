// Backend metadata of device tensors and its serialization hook.
//
// PyTorch lets the PrivateUse1 backend attach metadata to a tensor
// (c10::BackendMeta on the TensorImpl) and carry it through torch.save /
// torch.load as bool-valued keys: torch._utils.get_tensor_metadata calls
// the "serialize" function registered here, _rebuild_tensor_v2 the
// "deserialize" one. A torch-fl tensor carries no metadata of its own:
// plugin memory is plain strided memory, and ABI 1.x has no per-tensor
// layouts. What the hook keeps is what code attached with
// torch._utils.set_tensor_metadata, so it survives saving, loading,
// shallow copies and torch._C._copy_backend_meta, as on PyTorch's
// reference backend.
#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <string>
#include <unordered_map>
#include <utility>

namespace torchfl {
namespace {

using Metadata = std::unordered_map<std::string, bool>;

struct TensorMetadata final : c10::BackendMeta {
  Metadata values;

  explicit TensorMetadata(Metadata v) : values(std::move(v)) {}

  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>& /*ptr*/) const override {
    return c10::make_intrusive<TensorMetadata>(values);
  }
};

// Serialization: adds the tensor's keys to what torch.save writes. Keys
// PyTorch itself set (conj, neg) win.
void write_metadata(const at::Tensor& tensor, Metadata& out) {
  const auto* meta = dynamic_cast<const TensorMetadata*>(tensor.unsafeGetTensorImpl()->get_backend_meta());
  if (meta == nullptr) return;
  for (const auto& [key, value] : meta->values) out.emplace(key, value);
}

// Deserialization (and set_tensor_metadata): PyTorch has taken its own
// keys out of `in`; the rest are ours. Keys accumulate: setting some keys
// keeps the others.
void read_metadata(const at::Tensor& tensor, Metadata& in) {
  if (in.empty()) return;
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  Metadata merged;
  if (const auto* meta = dynamic_cast<const TensorMetadata*>(impl->get_backend_meta())) merged = meta->values;
  for (const auto& [key, value] : in) merged[key] = value;
  impl->set_backend_meta(c10::make_intrusive<TensorMetadata>(std::move(merged)));
}

// At load, like the other PrivateUse1 registrations. Registering twice
// raises; that happens only when another PrivateUse1 extension is loaded, which
// registration refuses later with a clear error. An exception must not
// escape a static initializer (it would terminate the process).
[[maybe_unused]] const bool g_metadata_hook_registered = [] {
  try {
    torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1, &write_metadata, &read_metadata);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}();

}  // namespace
}  // namespace torchfl

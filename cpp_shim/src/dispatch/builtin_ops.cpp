// The operators the shim implements itself for PrivateUse1: allocation,
// views (metadata only), resizing, copies, scalars and storage swaps.
//
// Views must be kernels of their own: through the CPU fallback they would
// return copies that silently stop aliasing (pitfall P17). resize_ and the
// set_ overloads must never let PyTorch's CPU code grow a storage, which it
// does by memcpy on the host (pitfall P2).
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Storage.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "dispatch/builtin_ops.h"
#include "memory/copy.h"
#include "memory/device_allocator.h"
#include "memory/storage_resize.h"
#include "observe/layer_profile.h"
#include "runtime/runtime.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

const c10::DispatchKeySet kDeviceKeys(c10::DispatchKey::PrivateUse1);

c10::DeviceIndex target_device(std::optional<c10::Device> device) {
  if (device.has_value()) {
    TORCH_CHECK(device->type() == c10::DeviceType::PrivateUse1, "expected a ", device_type_name(), " device, got ",
                *device);
    if (device->has_index()) {
      check_device_index(device->index());
      return device->index();
    }
  }
  const c10::DeviceIndex current = current_device();
  check_device_index(current);
  return current;
}

void check_factory_options(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, device_type_name(),
              " tensors support the strided layout only");
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  EntryTimer timer("aten::empty.memory_format");
  check_factory_options(layout, pin_memory);
  CurrentDeviceScope scope(target_device(device));
  return at::detail::empty_generic(size, device_allocator(), kDeviceKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  EntryTimer timer("aten::empty_strided");
  check_factory_options(layout, pin_memory);
  CurrentDeviceScope scope(target_device(device));
  return at::detail::empty_strided_generic(size, stride, device_allocator(), kDeviceKeys, c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  EntryTimer timer("aten::as_strided");
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  EntryTimer timer("aten::view");
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  EntryTimer timer("aten::_reshape_alias");
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

at::Tensor view_as_real(const at::Tensor& self) {
  return at::native::view_as_real(self);
}

at::Tensor view_as_complex(const at::Tensor& self) {
  return at::native::view_as_complex(self);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  EntryTimer timer("aten::resize_");
  return resize_device_tensor(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, c10::SymInt storage_offset,
                               c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  const int64_t offset = storage_offset.expect_int();
  const c10::IntArrayRef sizes = C10_AS_INTARRAYREF_SLOW(size);
  const c10::IntArrayRef strides = C10_AS_INTARRAYREF_SLOW(stride);
  at::native::checkSetStorage(self, std::move(source), offset, sizes, strides);
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  const at::OptionalIntArrayRef stride_opt =
      strides.data() != nullptr ? at::OptionalIntArrayRef(strides) : std::nullopt;
  // Metadata only; a storage too small for the new view grows through the
  // plugin instead of resize_bytes_cpu.
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), sizes, stride_opt,
                               /*resize_storage=*/false);
  ensure_storage_fits(self);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage_offset(self, source.storage(), source.sym_storage_offset(), source.sym_sizes(),
                            source.sym_strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  CurrentDeviceScope scope(self.device().index());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(),
                       /*resizable=*/true);
  return set_storage_offset(self, std::move(storage), 0, {0}, {});
}

// Tells the allocator that `self`'s memory is in use on `stream` too, so it
// is not handed out again until the work queued there so far has run (as
// CUDA's caching allocator does). The allocator decides what that costs:
// one that frees in stream order through the plugin needs no bookkeeping.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1, "record_stream: expected a ", device_type_name(),
              " stream, got one of ", stream.device());
  TORCH_CHECK(stream.device_index() == self.device().index(), "record_stream: the tensor is on ", self.device(),
              " but the stream is on ", stream.device(), "; record a stream of the tensor's device");
  device_allocator()->recordStream(self.storage().data_ptr(), stream);
}

}  // namespace

bool is_builtin_op(const c10::OperatorName& name) {
  // The operators registered below, plus copy_, whose plugin kernel the
  // shim keeps for _copy_from instead of registering (plugin_kernel.h).
  static constexpr std::pair<const char*, const char*> kBuiltins[] = {
      {"aten::empty", "memory_format"},
      {"aten::empty_strided", ""},
      {"aten::as_strided", ""},
      {"aten::view", ""},
      {"aten::_reshape_alias", ""},
      {"aten::unfold", ""},
      {"aten::view_as_real", ""},
      {"aten::view_as_complex", ""},
      {"aten::resize_", ""},
      {"aten::_copy_from", ""},
      {"aten::_copy_from_and_resize", ""},
      {"aten::_local_scalar_dense", ""},
      {"aten::set_", "source_Tensor"},
      {"aten::set_", "source_Storage"},
      {"aten::set_", "source_Storage_storage_offset"},
      {"aten::set_", ""},
      {"aten::record_stream", ""},
      {"aten::copy_", ""},
      // Served by the fallback (fallback.cpp): plugins implement
      // aten::convolution and aten::convolution_backward instead, which
      // PyTorch reaches first.
      {"aten::convolution_overrideable", ""},
      {"aten::convolution_backward_overrideable", ""},
  };
  for (const auto& [op, overload] : kBuiltins) {
    if (name.name == op && name.overload_name == overload) return true;
  }
  return false;
}

}  // namespace torchfl

// Keep in sync with is_builtin_op above.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(torchfl::empty_memory_format));
  m.impl("empty_strided", TORCH_FN(torchfl::empty_strided));
  m.impl("as_strided", TORCH_FN(torchfl::as_strided));
  m.impl("view", TORCH_FN(torchfl::view));
  m.impl("_reshape_alias", TORCH_FN(torchfl::reshape_alias));
  m.impl("unfold", TORCH_FN(torchfl::unfold));
  m.impl("view_as_real", TORCH_FN(torchfl::view_as_real));
  m.impl("view_as_complex", TORCH_FN(torchfl::view_as_complex));
  m.impl("resize_", TORCH_FN(torchfl::resize_));
  m.impl("_copy_from", TORCH_FN(torchfl::copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(torchfl::copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(torchfl::local_scalar_dense));
  m.impl("set_.source_Tensor", TORCH_FN(torchfl::set_tensor));
  m.impl("set_.source_Storage", TORCH_FN(torchfl::set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(torchfl::set_storage_offset));
  m.impl("set_", TORCH_FN(torchfl::set_empty));
  m.impl("record_stream", TORCH_FN(torchfl::record_stream));
}

// _copy_from reads lazy conjugate/negative bits itself (copy.cpp). Without
// these fallthroughs the Conjugate/Negative fallbacks would materialize a
// conj source with clone(), which copies through _copy_from again: endless
// recursion. (CPU and CUDA never reach _copy_from, so nothing else changes.)
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

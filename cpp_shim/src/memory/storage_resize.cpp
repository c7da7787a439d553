#include "memory/storage_resize.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "memory/device_allocator.h"
#include "runtime/runtime.h"
#include "runtime/streams.h"

namespace torchfl {

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  TORCH_INTERNAL_ASSERT(storage.device_type() == c10::DeviceType::PrivateUse1);
  const c10::DeviceIndex device = storage.device().index();
  CurrentDeviceScope scope(device);
  c10::DataPtr fresh = allocate_on(device, nbytes);
  const size_t keep = std::min(nbytes, storage.nbytes());
  if (keep > 0 && storage.data() != nullptr) {
    // Queued on the current stream, like the kernels that wrote the old
    // bytes; freeing the old allocation right after is safe because the
    // plugin's deallocate is stream-ordered.
    copy_d2d(device, fresh.get(), device, storage.data(), keep, current_plugin_stream(device));
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
  storage.unsafeGetStorageImpl()->set_nbytes(nbytes);
}

void ensure_storage_fits(const at::Tensor& self) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (impl->numel() == 0) return;
  const size_t needed = at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), impl->dtype().itemsize(),
                                                         impl->storage_offset());
  if (needed > impl->unsafe_storage().nbytes()) {
    resize_storage_bytes(impl->unsafe_storage(), needed);
  }
}

const at::Tensor& resize_device_tensor(const at::Tensor& self, c10::IntArrayRef size,
                                       std::optional<c10::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  // Metadata only (resize_storage=false), then grow through the plugin.
  at::native::resize_impl_cpu_(impl, size, /*stride=*/std::nullopt,
                               /*resize_storage=*/false);
  ensure_storage_fits(self);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve, "Unsupported memory format", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

}  // namespace torchfl

// Strict-safe resizing of device storages and tensors.
//
// at::native::resize_ grows storages with resize_bytes_cpu, which memcpys
// the old bytes on the host: a crash when device memory is not
// host-addressable (pitfall P2). These versions allocate through the plugin
// and move the old bytes with a device-to-device copy on the current stream.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/Storage.h>

#include <optional>

namespace torchfl {

// Reallocates `storage` (a PrivateUse1 storage) to `nbytes`, keeping the
// first min(old, new) bytes.
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);

// aten::resize_ for a device tensor.
const at::Tensor& resize_device_tensor(const at::Tensor& self, c10::IntArrayRef size,
                                       std::optional<c10::MemoryFormat> memory_format);

// Grows the storage of `self` if its current sizes/strides/offset need
// more bytes than it has.
void ensure_storage_fits(const at::Tensor& self);

}  // namespace torchfl

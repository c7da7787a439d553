// Copies between the device and everything else, without the host ever
// touching device memory (it may not be host-addressable; sim strict mode).
//
// All data moves through the plugin's `copy` entry; what a byte copy cannot
// do (dtype conversion, broadcasting, strided layouts) happens on the host
// on a staging buffer, or on the device with the plugin's copy_ kernel.
// Ordering follows CUDA: copies run on the current stream; a copy into
// pageable host memory is complete when it returns; host-to-device copies
// stage through a pinned buffer the host allocator keeps alive until the
// copy ran, so neither direction blocks on queued kernels unless it has to
// produce host data; non_blocking copies from or into pinned memory are
// queued and return at once. Device-to-device copies never block the host:
// across devices the copy runs on the source device's current stream,
// ordered after the current streams of both devices and before the
// destination's later work with events, as CUDA's copy_device_to_device;
// converting or strided copies across devices run the plugin's copy_ on each
// device around the byte copy.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

namespace torchfl {

// aten::_copy_from(Tensor self, Tensor dst, bool non_blocking): self (the
// source) into dst; at least one is a device tensor, the other may be a
// CPU, CUDA (PrivateUse1 outranks CUDA in dispatch, pitfall P3) or device
// tensor of another index.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);

// aten::_copy_from_and_resize: what cpu_fallback writes results back with.
at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst);

// aten::_local_scalar_dense: .item(), bool(t), printing (pitfall P13).
c10::Scalar local_scalar_dense(const at::Tensor& self);

// A CPU tensor with the values of device tensor `src` (same sizes, strides
// need not match), complete when returned.
at::Tensor to_host(const at::Tensor& src);

}  // namespace torchfl

// Pinned ("page-locked") host memory for the PrivateUse1 device: what
// tensor.pin_memory(), is_pinned() and DataLoader(pin_memory=True) use, and
// the staging buffers of host<->device copies.
//
// The ABI has no host-registration entry, so "pinned" here means "owned by
// this allocator": memory the shim may hand to asynchronous copies, because
// it keeps each block alive until the copies that use it have run (events
// recorded with record_event). A block freed while copies are pending is
// parked and reused only once its events completed; freed blocks are cached
// by power-of-two size class until empty_cache().
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Stream.h>

namespace torchfl {

at::HostAllocator* host_allocator();

// Whether `ptr` points into a live block of the pinned allocator (interior
// pointers included: a slice of a pinned tensor is pinned too).
bool is_pinned_ptr(const void* ptr);

// Whether `data_ptr` (a storage's) comes from the pinned allocator.
bool is_pinned_data(const c10::DataPtr& data_ptr);

// Keeps the pinned block behind `data_ptr` (of any tensor storage) alive
// until the work queued so far on `stream` has run. Returns false when the
// storage is not from the pinned allocator.
bool record_host_use(const c10::DataPtr& data_ptr, c10::Stream stream);

}  // namespace torchfl

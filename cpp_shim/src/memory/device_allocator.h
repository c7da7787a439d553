// The PrivateUse1 device allocator: a c10::DeviceAllocator
// (torch.accelerator.memory_* require one, not a plain c10::Allocator; notes
// §1.3) with two backends: torch-fl's caching allocator
// (caching_allocator.h), the default, and "plugin", every allocation a call
// to the plugin's allocate. Native serves plugins that declare
// TFL_CAP_CACHING_ALLOCATOR and users who set
// TORCH_FL_ALLOC_CONF=backend:plugin.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstddef>
#include <string>

namespace torchfl {

// The registered allocator (static lifetime: c10::SetAllocator does not
// take ownership).
c10::DeviceAllocator* device_allocator();

// Allocates `nbytes` on `device` (not the current device), e.g. to grow a
// storage that lives on another device than the current one.
c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);

// Whether allocations go through the caching allocator. Decided once, at
// the first call after attach (TORCH_FL_ALLOC_CONF and the plugin's
// capabilities); raises for an invalid TORCH_FL_ALLOC_CONF.
bool caching_enabled();

// torch.<device>.memory_snapshot()'s document (caching::snapshot_json, or
// no segments under the plugin backend).
std::string memory_snapshot_json();

// "1.50 GiB"
std::string format_bytes(size_t nbytes);

}  // namespace torchfl

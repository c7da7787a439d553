// The PrivateUse1 device allocator: a c10::DeviceAllocator over the
// plugin's allocate/deallocate (torch.accelerator.memory_* require a
// DeviceAllocator, not a plain c10::Allocator; notes §1.3).
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

// "1.50 GiB"
std::string format_bytes(size_t nbytes);

}  // namespace torchfl

// The Python object of a device's default generator. torch 2.14 reaches it
// through torch._C._accelerator_getDefaultGenerator; torch 2.13 has no
// Python API for a PrivateUse1 default generator, so the device module asks
// the shim (tfl_shim_default_generator).
#pragma once

#include <c10/core/Device.h>

namespace torchfl {

// A new reference to the torch.Generator of `device`'s default generator
// (a PyObject*), or NULL with a Python exception set. Needs the GIL.
void* default_generator_object(c10::DeviceIndex device);

}  // namespace torchfl

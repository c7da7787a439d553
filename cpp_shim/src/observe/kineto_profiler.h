// torch.profiler's PrivateUse1 activity for the plugin device
// (kineto_profiler.cpp).
#pragma once

namespace torchfl {

// Registers torch-fl's kineto child profiler, once per process; called when
// the device is attached. Does nothing when PyTorch was built without
// kineto.
void register_kineto_profiler();
// Whether this shim was built with kineto (torch.profiler can then show
// device activities).
bool kineto_profiler_available() noexcept;

}  // namespace torchfl

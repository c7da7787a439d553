// Running an operator's CPU kernel directly on device memory, for devices
// whose memory the host can address (TFL_CAP_HOST_ADDRESSABLE_MEMORY).
//
// Each device storage gets a CPU "twin": a CPU storage over the same bytes
// that holds a reference to the device storage. Device tensors become CPU
// tensors over their twins (views of one storage share one twin), the CPU
// kernel runs, and then:
//  - results written into arguments are already in place (no copy back);
//  - returned views come back as device tensors over the same device
//    storage, so aliasing survives (never a view that is silently a copy);
//  - new results are copied to the device;
//  - an out= argument the kernel had to grow (its twin moved to host
//    memory) is resized on the device and copied back.
// Queued device work is synchronized first when streams are asynchronous.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "runtime/runtime.h"

namespace torchfl {

// Runs `op` (its arguments on `stack`) on the CPU over device memory;
// `target` is where new results go.
void run_on_host_memory(const c10::OperatorHandle& op, torch::jit::Stack* stack, const AttachedDevice& device,
                        c10::Device target);

}  // namespace torchfl

// Fused scaled-dot-product attention through PyTorch's overrideable route.
//
// F.scaled_dot_product_attention asks the device's _fused_sdp_choice_stub
// which backend to use. The shim answers OVERRIDEABLE when the plugins bound
// to the device offer _scaled_dot_product_fused_attention_overrideable (and
// its backward, when an input requires grad) for these inputs, else MATH, so
// the decision follows the op table of whatever plugin serves the device.
// Those two operators cannot take the generic plugin-kernel path (the
// forward returns SymInts), so they get dedicated kernels here that follow
// the ABI's calling convention for them (docs/design/privateuse1-notes.md,
// "Fused attention").
#pragma once

#include <ATen/core/operator_name.h>

#include "dispatch/plugin_kernel.h"

namespace torchfl {

// Binds `binding` if it serves one of the two attention operators (and
// registers their kernel the first time); false for any other operator.
bool bind_attention_kernel(const c10::OperatorName& name, const KernelBinding* binding);

}  // namespace torchfl

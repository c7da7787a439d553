// Meta kernels for plugin-defined (custom) operators.
//
// PyTorch allocates an operator's outputs, and torch.compile traces it,
// through the operator's Meta kernel (its "fake" implementation). ATen
// operators have one; a plugin's custom operator (`sim::fused_bias_gelu`)
// gets one here when its op-table entry provides TFL_OpEntry.infer_outputs
// (ABI 1.1): the Meta kernel describes the meta inputs in a data-less call
// frame, asks the plugin for the output dtypes and shapes, and returns
// empty meta tensors. The eager path then needs nothing else (the shim
// infers outputs by running the operator on Meta, output_inference.h), and
// FakeTensor tracing runs the same kernel.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

#include "torch_fl/plugin.h"

namespace torchfl {

// A boxed Meta kernel for `op` over `infer`. `owner_api` releases the
// plugin's errors; `plugin_label` and `plugin_op` name it in messages.
// Returns nullopt and sets *why when the schema has an argument type the
// ABI cannot pass or a return that is not a Tensor.
std::optional<torch::CppFunction> make_meta_kernel(const c10::OperatorHandle& op, TFL_InferOutputsFn infer,
                                                   const TFL_PluginApi* owner_api, const std::string& plugin_label,
                                                   const std::string& plugin_op, std::string* why);

}  // namespace torchfl

// Output metadata for plugin kernels: what PyTorch would allocate (or how
// it would resize an out= argument), found by running the operator on the
// Meta device.
//
// Redispatching to Meta costs 10-120 us (many meta kernels are Python;
// pitfall P14), far more than a small kernel, so callers memoize the
// results per argument signature (signature.h, output_cache.h): the result
// depends only on the arguments' metadata.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <memory>

#include "dispatch/output_cache.h"

namespace torchfl {

// Runs `op` on meta copies of `args` (the operator's full argument list,
// out= arguments included) and reports its returns. For out= operators
// (`out_args` non-empty: the argument index of each return) it reports
// whether and how PyTorch would resize each out= tensor. Warnings from the
// meta run are swallowed: the real resize emits PyTorch's own. Raises what
// the meta kernel raises (shape or dtype errors, exactly as PyTorch would).
std::shared_ptr<const InferredOutputs> infer_with_meta(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                                       c10::ArrayRef<int> out_args);

// For meta kernels that need data (indexing with a boolean mask calls
// nonzero): runs the operator's meta kernel on the real arguments, so that
// what it computes from data runs on the device, and reports its returns.
// out= arguments come back already resized. Not memoizable.
std::shared_ptr<const InferredOutputs> infer_with_meta_on_device(const c10::OperatorHandle& op,
                                                                 c10::ArrayRef<c10::IValue> args,
                                                                 c10::ArrayRef<int> out_args);

// For operators whose output shapes depend on data (TFL_OP_DYNAMIC_SHAPE),
// which have no usable meta kernel: the output dtypes, found by running the
// CPU kernel on empty inputs of the same dtypes and ranks (all sizes 0, or,
// when the kernel refuses that, the first size 0 and the others kept).
std::shared_ptr<const InferredOutputs> infer_dtypes_on_empty_cpu(const c10::OperatorHandle& op,
                                                                 c10::ArrayRef<c10::IValue> args);

}  // namespace torchfl

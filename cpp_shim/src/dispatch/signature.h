// The signature of an operator call's arguments: the key under which the
// shim memoizes output metadata (see output_cache.h).
//
// It holds what can change output metadata: the sizes, strides and dtype
// of every tensor (and whether it is a device tensor, a CPU scalar or a
// wrapped Python number, and its lazy conj/neg bits) and the values of the
// non-tensor arguments. Scalar *values* are left out (only their kind
// counts, as in type promotion), so `x * lr` with a changing lr keeps
// hitting; for operators without tensor inputs (factories) they are kept,
// since there they can decide shapes.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Scalar.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/util/SmallVector.h>

#include <optional>

namespace torchfl {

using Signature = c10::SmallVector<int64_t, 48>;

// Appends the signature of boxed arguments `args`. `is_scalar[i]` says
// whether argument i is a `Scalar` (or `Scalar?`): its value is left out
// unless `scalar_values`.
void append_signature(c10::ArrayRef<c10::IValue> args, c10::ArrayRef<uint8_t> is_scalar, bool scalar_values,
                      Signature& key);

// The encoders append_signature uses, one per value type, for typed
// (unboxed) callers: a typed call must build exactly the key a boxed call
// with the same values builds, or it would never hit the boxed call's
// entries.
void append_value(Signature& key, const at::Tensor& t);
void append_scalar_kind(Signature& key, const c10::Scalar& s);
void append_value(Signature& key, bool v);
void append_value(Signature& key, int64_t v);
void append_value(Signature& key, double v);
void append_value(Signature& key, std::optional<c10::ScalarType> v);
void append_value(Signature& key, c10::IntArrayRef v);
void append_value(Signature& key, at::OptionalIntArrayRef v);

}  // namespace torchfl

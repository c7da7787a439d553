// How operator arguments travel in a TFL_CallFrame: the ABI value kind of
// each schema type (the mapping in plugin.h / docs/plugin-abi.md), and the
// conversion of a boxed argument into the frame.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <cstdint>
#include <optional>

#include "call_frame.h"

namespace torchfl {

enum class ArgKind : uint8_t {
  Tensor,
  TensorList,
  OptionalTensorList,
  Int,
  Float,
  Bool,
  Scalar,
  IntList,
  FloatList,
  BoolList,
  String,
  Device,
  Generator,
};

// The kind of an argument of schema type `type` (optional types included);
// nullopt for types the ABI cannot pass (Dimname, Storage, Stream, ...).
std::optional<ArgKind> classify_argument(const c10::TypePtr& type);

// Adds argument `v` of kind `kind` to the frame (None for absent optionals;
// a Generator keeps its position as None: its state travels in
// rng_seed/rng_offset). False: a tensor dtype the ABI cannot describe.
bool add_argument(CallFrameBuilder& fb, ArgKind kind, const c10::IValue& v);

}  // namespace torchfl

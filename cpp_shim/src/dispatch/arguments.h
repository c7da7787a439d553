// How operator arguments travel in a TFL_CallFrame: the ABI value kind of
// each schema type, and the conversion of a boxed argument into the frame.
//
// The kind of a schema type is decided once, by the Rust core's schema
// parser (torchfl_core::schema, which also checks plugins' custom-operator
// schemas): the shim prints each argument's type the way PyTorch does
// ("Tensor?", "int[]") and asks the core through
// TFL_ShimDevice.argument_kind, at registration only. One table, no
// generated code, and a plugin's custom schema and an ATen schema are
// judged alike.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <cstdint>
#include <optional>

#include "dispatch/call_frame.h"
#include "torchfl_shim.h"

namespace torchfl {

// TFL_ShimArgKind.
enum class ArgKind : uint8_t {
  Tensor = TFL_SHIM_ARG_TENSOR,
  TensorList = TFL_SHIM_ARG_TENSOR_LIST,
  OptionalTensorList = TFL_SHIM_ARG_OPTIONAL_TENSOR_LIST,
  Int = TFL_SHIM_ARG_INT,
  Float = TFL_SHIM_ARG_FLOAT,
  Bool = TFL_SHIM_ARG_BOOL,
  Scalar = TFL_SHIM_ARG_SCALAR,
  IntList = TFL_SHIM_ARG_INT_LIST,
  FloatList = TFL_SHIM_ARG_FLOAT_LIST,
  BoolList = TFL_SHIM_ARG_BOOL_LIST,
  String = TFL_SHIM_ARG_STRING,
  Device = TFL_SHIM_ARG_DEVICE,
  Generator = TFL_SHIM_ARG_GENERATOR,
};

// The kind of an argument of schema type `type` (optional types included),
// as the Rust core decides it; nullopt for types the ABI cannot pass
// (Dimname, Storage, Stream, ...). Raises before a device is attached.
std::optional<ArgKind> classify_argument(const c10::TypePtr& type);

// Adds argument `v` of kind `kind` to the frame (None for absent optionals;
// a Generator keeps its position as None: its state travels in
// rng_seed/rng_offset). False: a tensor dtype the ABI cannot describe.
bool add_argument(CallFrameBuilder& fb, ArgKind kind, const c10::IValue& v);

}  // namespace torchfl

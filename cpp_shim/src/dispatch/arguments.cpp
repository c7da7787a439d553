#include "dispatch/arguments.h"

#include <c10/util/SmallVector.h>

#include "runtime/runtime.h"
#include "runtime/shim_error.h"

namespace torchfl {

// The ABI kind of an argument type, as the Rust core decides it
// (arguments.h); nullopt when it has none.
std::optional<ArgKind> classify_argument(const c10::TypePtr& type) {
  const AttachedDevice* d = attached_device();
  if (d == nullptr) {
    throw ShimError(TFL_SHIM_ERROR_STATE, "torch-fl: kernels are registered after TFL_ShimInterface.attach_device");
  }
  const int32_t kind = d->argument_kind(type->str().c_str());
  if (kind < TFL_SHIM_ARG_TENSOR || kind > TFL_SHIM_ARG_GENERATOR) return std::nullopt;
  return static_cast<ArgKind>(kind);
}

// Adds argument `v` of kind `kind` to the frame. False: a dtype the ABI
// cannot describe.
bool add_argument(CallFrameBuilder& fb, ArgKind kind, const c10::IValue& v) {
  if (v.isNone()) {
    fb.add_none();
    return true;
  }
  switch (kind) {
    case ArgKind::Tensor:
      return fb.add_tensor(v.toTensor());
    case ArgKind::TensorList:
      return fb.add_tensor_list(v.toTensorList());
    case ArgKind::OptionalTensorList:
      return fb.add_optional_tensor_list(v.toOptionalTensorList());
    case ArgKind::Int:
      fb.add_int(v.isInt() ? v.toInt() : v.toSymInt().expect_int());
      return true;
    case ArgKind::Float:
      fb.add_float(v.isDouble() ? v.toDouble() : v.toScalar().toDouble());
      return true;
    case ArgKind::Bool:
      fb.add_bool(v.toBool());
      return true;
    case ArgKind::Scalar:
      fb.add_scalar(v.toScalar());
      return true;
    case ArgKind::IntList:
      if (v.isIntList()) {
        fb.add_int_list(v.toIntList());
      } else {
        c10::SmallVector<int64_t, 8> ints;
        for (const c10::SymInt& s : v.toSymIntList()) {
          ints.push_back(s.expect_int());
        }
        fb.add_int_list(ints);
      }
      return true;
    case ArgKind::FloatList:
      fb.add_float_list(v.toDoubleList());
      return true;
    case ArgKind::BoolList:
      fb.add_bool_list(v.toBoolList());
      return true;
    case ArgKind::String:
      fb.add_string(v.toStringRef());
      return true;
    case ArgKind::Device:
      fb.add_int(v.toDevice().has_index() ? v.toDevice().index() : -1);
      return true;
    case ArgKind::Generator:
      // The generator's state travels in rng_seed/rng_offset; the argument
      // keeps its position as NONE.
      fb.add_none();
      return true;
  }
  return false;
}

}  // namespace torchfl

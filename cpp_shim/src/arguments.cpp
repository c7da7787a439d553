#include "arguments.h"

#include <c10/util/SmallVector.h>

namespace torchfl {

// The ABI kind of an argument type; nullopt when it has none.
std::optional<ArgKind> classify_argument(const c10::TypePtr& declared) {
  c10::TypePtr type = declared;
  if (type->kind() == c10::TypeKind::OptionalType) {
    type = type->expectRef<c10::OptionalType>().getElementType();
  }
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return ArgKind::Tensor;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
      return ArgKind::Int;
    case c10::TypeKind::FloatType:
      return ArgKind::Float;
    case c10::TypeKind::BoolType:
      return ArgKind::Bool;
    case c10::TypeKind::NumberType:
      return ArgKind::Scalar;
    case c10::TypeKind::StringType:
      return ArgKind::String;
    case c10::TypeKind::DeviceObjType:
      return ArgKind::Device;
    case c10::TypeKind::GeneratorType:
      return ArgKind::Generator;
    case c10::TypeKind::ListType: {
      const c10::TypePtr elem = type->expectRef<c10::ListType>().getElementType();
      switch (elem->kind()) {
        case c10::TypeKind::TensorType:
          return ArgKind::TensorList;
        case c10::TypeKind::OptionalType:
          if (elem->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::TensorType) {
            return ArgKind::OptionalTensorList;
          }
          return std::nullopt;
        case c10::TypeKind::IntType:
        case c10::TypeKind::SymIntType:
          return ArgKind::IntList;
        case c10::TypeKind::FloatType:
          return ArgKind::FloatList;
        case c10::TypeKind::BoolType:
          return ArgKind::BoolList;
        default:
          return std::nullopt;
      }
    }
    default:
      return std::nullopt;
  }
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

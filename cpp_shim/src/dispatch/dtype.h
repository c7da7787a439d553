// PyTorch element types as the ABI describes them (DLPack codes).
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "torch_fl/plugin.h"

namespace torchfl {

// Sets *out and returns true for dtypes the ABI can describe; false for the
// others (float8, quantized, bit types...), which a kernel can then never
// receive: the shim treats such calls as UNIMPLEMENTED.
inline bool to_tfl_dtype(c10::ScalarType t, TFL_DType* out) noexcept {
  auto set = [out](uint8_t code, uint8_t bits) {
    *out = TFL_DType{code, bits, 1};
    return true;
  };
  switch (t) {
    case c10::ScalarType::Bool:
      return set(TFL_DTYPE_BOOL, 8);
    case c10::ScalarType::Byte:
      return set(TFL_DTYPE_UINT, 8);
    case c10::ScalarType::UInt16:
      return set(TFL_DTYPE_UINT, 16);
    case c10::ScalarType::UInt32:
      return set(TFL_DTYPE_UINT, 32);
    case c10::ScalarType::UInt64:
      return set(TFL_DTYPE_UINT, 64);
    case c10::ScalarType::Char:
      return set(TFL_DTYPE_INT, 8);
    case c10::ScalarType::Short:
      return set(TFL_DTYPE_INT, 16);
    case c10::ScalarType::Int:
      return set(TFL_DTYPE_INT, 32);
    case c10::ScalarType::Long:
      return set(TFL_DTYPE_INT, 64);
    case c10::ScalarType::Half:
      return set(TFL_DTYPE_FLOAT, 16);
    case c10::ScalarType::Float:
      return set(TFL_DTYPE_FLOAT, 32);
    case c10::ScalarType::Double:
      return set(TFL_DTYPE_FLOAT, 64);
    case c10::ScalarType::BFloat16:
      return set(TFL_DTYPE_BFLOAT, 16);
    case c10::ScalarType::ComplexHalf:
      return set(TFL_DTYPE_COMPLEX, 32);
    case c10::ScalarType::ComplexFloat:
      return set(TFL_DTYPE_COMPLEX, 64);
    case c10::ScalarType::ComplexDouble:
      return set(TFL_DTYPE_COMPLEX, 128);
    default:
      return false;
  }
}

// The inverse of to_tfl_dtype, for dtypes a plugin reports (infer_outputs).
inline std::optional<c10::ScalarType> from_tfl_dtype(TFL_DType d) noexcept {
  for (c10::ScalarType t :
       {c10::ScalarType::Bool, c10::ScalarType::Byte, c10::ScalarType::UInt16, c10::ScalarType::UInt32,
        c10::ScalarType::UInt64, c10::ScalarType::Char, c10::ScalarType::Short, c10::ScalarType::Int,
        c10::ScalarType::Long, c10::ScalarType::Half, c10::ScalarType::Float, c10::ScalarType::Double,
        c10::ScalarType::BFloat16, c10::ScalarType::ComplexHalf, c10::ScalarType::ComplexFloat,
        c10::ScalarType::ComplexDouble}) {
    TFL_DType e{};
    if (to_tfl_dtype(t, &e) && e.code == d.code && e.bits == d.bits && e.lanes == d.lanes) {
      return t;
    }
  }
  return std::nullopt;
}

}  // namespace torchfl

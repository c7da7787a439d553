// An error with a TFL_SHIM_* return code, thrown inside the shim and turned
// into that code (plus message) at the C interface (api.cpp).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace torchfl {

struct ShimError : std::runtime_error {
  ShimError(int32_t code, const std::string& message) : std::runtime_error(message), code(code) {}
  int32_t code;
};

}  // namespace torchfl

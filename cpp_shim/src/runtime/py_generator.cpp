#include "runtime/py_generator.h"

// Python's headers (through torch/csrc/Generator.h) only here: the rest of
// the shim is plain C++ against libtorch.
#include <torch/csrc/Generator.h>

#include "runtime/generator.h"

namespace torchfl {

void* default_generator_object(c10::DeviceIndex device) {
  // THPGenerator_Wrap keeps one Python object per generator, so every call
  // (and torch._C._accelerator_getDefaultGenerator where it exists) returns
  // the same torch.Generator.
  return THPGenerator_Wrap(default_generator(device));
}

}  // namespace torchfl

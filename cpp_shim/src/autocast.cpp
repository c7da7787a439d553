// Autocast for PrivateUse1: a fallthrough for now.
//
// PyTorch registers no backend fallback for AutocastPrivateUse1 (unlike
// AutocastCPU/AutocastCUDA), so without this every operator called inside
// torch.autocast("sim") would fail to dispatch (pitfall P9). A fallthrough
// runs operators unchanged (no casts); the per-operator autocast policy is a
// later step.
#include <torch/library.h>

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

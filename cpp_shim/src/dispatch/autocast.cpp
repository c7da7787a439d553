// Autocast for PrivateUse1: the same per-operator policy PyTorch applies
// under torch.autocast("cuda").
//
// PyTorch registers no backend fallback for AutocastPrivateUse1 (unlike
// AutocastCPU/AutocastCUDA), so without the fallthrough every operator
// called inside torch.autocast("sim") would fail to dispatch (pitfall P9).
// The operator lists are PyTorch's own (ATen/autocast_mode.h), shared by
// the CUDA, XPU and MTIA backends: matmul and convolution families run in
// the autocast dtype, softmax, losses and norms in float32, and mixed-dtype
// ops like addcmul at the widest input dtype. Which dtype autocast uses, and
// which dtypes it accepts, is decided in Python (torch.<name>.
// get_amp_supported_dtype, from the plugin's capabilities).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

// AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE spells signatures unqualified,
// as inside namespace at.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define TFL_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(TFL_LOWER_PRECISION_FP)
#undef TFL_LOWER_PRECISION_FP

#define TFL_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(TFL_FP32)
#undef TFL_FP32

#define TFL_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(TFL_FP32_SET_OPT_DTYPE)
#undef TFL_FP32_SET_OPT_DTYPE

  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)

#define TFL_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(TFL_PROMOTE)
#undef TFL_PROMOTE
}

}  // namespace

// Running one plugin kernel for one operator.
//
// One PluginKernel exists per registered operator (under PrivateUse1),
// reached through a boxed or a typed entry (typed_kernels.h). It holds
// what it needs resolved up front: the plugin kernel pointer and flags (in
// an immutable KernelBinding, swapped atomically when the operator is
// registered again), the argument kinds of the schema, and how outputs are
// produced. The op registry is never consulted on the call path.
//
// Per call it: checks that all tensors are on one device (0-dim CPU scalars
// allowed), makes that device current, turns the stack into a
// TFL_CallFrame, provides the outputs, fills the RNG state for random ops,
// calls the kernel on the current stream, and pushes the results. A kernel
// that returns UNIMPLEMENTED (say, for a dtype it lacks) gets the fallback
// policy instead, as if no plugin served the operator.
//
// Outputs, by route:
//   InPlace     the mutated arguments (outputs[0] = self);
//   Out         the out= arguments, resized first exactly as PyTorch would
//               (see output_inference.h) - this is also how in-place forms
//               of structured ops arrive, after PyTorch's C++ meta checked
//               them (TFL_SHIM_REGISTERED_AS_OUT);
//   Functional  allocated on the device with the metadata the operator's
//               meta kernel gives, memoized per input signature (exact:
//               the metadata depends on nothing else).
// Operators flagged TFL_OP_DYNAMIC_SHAPE get outputs of shape [0] that the
// kernel sizes through resize_output.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/arguments.h"
#include "dispatch/output_cache.h"
#include "observe/layer_profile.h"
#include "runtime/capture.h"
#include "runtime/runtime.h"
#include "runtime/status.h"
#include "torch_fl/plugin.h"

namespace torchfl {

// One plugin kernel as registered. Immutable; leaked when replaced, since a
// concurrent call may still be using it.
struct KernelBinding {
  TFL_KernelFn fn = nullptr;
  uint64_t flags = 0;
  std::string op_name;  // the plugin table's name, passed as frame.op_name
  std::string label;    // the owner plugin's label
  const TFL_PluginApi* owner_api = nullptr;
  bool foreign = false;

  PluginRef owner() const { return {owner_api, label.c_str()}; }
};

// Runs `b`'s kernel on `frame->stream`, or records the launch there when the
// stream is being captured into a device graph (runtime/capture.h). `rng` is
// the generator a random kernel's frame drew from (capture::claim_rng).
inline TFL_Error* launch(const KernelBinding& b, TFL_CallFrame* frame, Generator* rng = nullptr) {
  if (capture::any() &&
      capture::record_kernel({b.fn, b.op_name.c_str(), b.label.c_str(), b.owner_api}, *frame, rng, b.foreign)) {
    return nullptr;
  }
  // A kernel of another plugin cannot order itself after this plugin's
  // streams, so the stream must be idle first.
  if (b.foreign) stream_synchronize(frame->stream);
  return call_kernel(b.fn, frame, b.label.c_str(), b.op_name.c_str());
}

enum class Route : uint8_t { Functional, InPlace, Out };

class PluginKernel final {
 public:
  // Returns nullptr and sets *why when the schema has an argument or return
  // type the ABI cannot express.
  static std::unique_ptr<PluginKernel> create(const c10::OperatorHandle& op, Route route, const KernelBinding* binding,
                                              std::string* why);

  // The general (boxed) path; handles every case.
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

  void rebind(const KernelBinding* binding) { binding_.store(binding, std::memory_order_release); }

  // For the typed fast paths (typed_kernels.h).
  const KernelBinding& binding() const { return *binding_.load(std::memory_order_acquire); }
  Route route() const { return route_; }
  const c10::OperatorHandle& op() const { return *op_; }
  // "aten::add.out": the layer profile's name for this kernel's entries.
  const char* name() const { return name_.c_str(); }
  bool is_out(size_t arg) const { return is_out_[arg] != 0; }
  // InPlace/Out: the argument return `j` aliases.
  int return_arg(size_t j) const { return return_args_[j]; }
  OutputCache& cache() { return cache_; }

 private:
  PluginKernel() = default;

  // Fills `outputs` for the Out and Functional routes; false when the call
  // must fall back (no way to infer outputs).
  bool prepare_outputs(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, const KernelBinding& binding,
                       c10::SmallVector<at::Tensor, 2>& outputs);

  // Runs output inference for a signature not seen before into
  // `inferred`: true when the result may be memoized, false when it came
  // from the meta kernel run on the real arguments (it needs data),
  // nullopt when there is no meta kernel (or, for dynamic-shape operators,
  // no CPU kernel) to infer with.
  std::optional<bool> infer_outputs(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, bool dynamic,
                                    std::shared_ptr<const InferredOutputs>& inferred) const;

  // The device the call runs on: the tensors' common device, else the
  // device argument (factory-like operators), else the current device.
  c10::DeviceIndex call_device(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) const;

  // Replaces the arguments on `stack` (viewed by `args`) with the results:
  // the new `outputs` for the Functional route, else the mutated arguments.
  void push_results(c10::ArrayRef<c10::IValue> args, c10::SmallVector<at::Tensor, 2>& outputs,
                    torch::jit::Stack* stack) const;

  std::optional<c10::OperatorHandle> op_;
  std::string name_;
  std::atomic<const KernelBinding*> binding_{nullptr};
  Route route_ = Route::Functional;
  std::vector<ArgKind> kinds_;      // per schema argument
  std::vector<uint8_t> is_out_;     // per schema argument
  std::vector<uint8_t> is_scalar_;  // per schema argument (signature)
  std::vector<int> return_args_;    // InPlace/Out: argument of each return
  size_t num_args_ = 0;
  size_t num_returns_ = 0;
  int generator_arg_ = -1;
  int device_arg_ = -1;
  int indices_arg_ = -1;  // advanced indexing: `Tensor?[] indices` (see operator())
  bool has_tensor_inputs_ = false;
  std::atomic<bool> meta_unavailable_{false};
  OutputCache cache_;
};

// Raises for a failed kernel call (any status but UNIMPLEMENTED, which the
// callers handle), with what a failed resize_output said, if anything.
[[noreturn]] void raise_kernel_error(const KernelBinding& binding, TFL_Error* error, const std::string& resize_error);

// The plugin's copy_ kernel, which the shim keeps for on-device copies that
// a plain memcpy cannot do (strided, broadcast, dtype-converting) instead of
// registering it: copy_ must stay PyTorch's, which routes every copy through
// _copy_from (host, CUDA and cross-device copies included).
void set_copy_kernel(const KernelBinding* binding);

// dst.copy_(src) on dst's device with the plugin's copy_ kernel. Returns
// false when there is none, or it does not support this case
// (UNIMPLEMENTED) or a dtype; raises on other errors.
bool run_plugin_copy(const at::Tensor& dst, const at::Tensor& src);

}  // namespace torchfl

#include "dispatch/plugin_kernel.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <c10/util/Exception.h>

#include "dispatch/arguments.h"
#include "dispatch/call_frame.h"
#include "dispatch/device_check.h"
#include "dispatch/fallback.h"
#include "dispatch/output_inference.h"
#include "dispatch/signature.h"
#include "memory/device_allocator.h"
#include "memory/storage_resize.h"
#include "observe/layer_profile.h"
#include "runtime/fork.h"
#include "runtime/generator.h"
#include "runtime/runtime.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

std::atomic<const KernelBinding*> g_copy_kernel{nullptr};

// Random numbers the call may consume: one Philox counter per output
// element at most, so consecutive calls draw disjoint counter ranges.
uint64_t rng_increment(c10::ArrayRef<at::Tensor> outputs, c10::ArrayRef<c10::IValue> args) {
  uint64_t n = 0;
  for (const at::Tensor& t : outputs) n += static_cast<uint64_t>(t.numel());
  if (n == 0) {  // dynamic-shape outputs: bound by the inputs instead
    for (const c10::IValue& v : args) {
      if (v.isTensor()) n += static_cast<uint64_t>(v.toTensor().numel());
    }
  }
  return std::max<uint64_t>(n, 1);
}

// Called when the output shapes are unknown (no meta kernel): raises unless
// the operator can still run through the CPU fallback. Plugin-defined
// operators have no CPU kernel, nor do dynamic-shape ones whose output
// dtypes would have come from running one.
void require_cpu_kernel_for_fallback(const c10::OperatorHandle& op, const KernelBinding& b) {
  const bool has_cpu_kernel = op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
                              op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
  TORCH_CHECK_NOT_IMPLEMENTED(has_cpu_kernel || (b.flags & TFL_OP_DYNAMIC_SHAPE) == 0,
                              "torch-fl: cannot run plugin kernel '", b.op_name, "' of ", b.label,
                              ": it is flagged TFL_OP_DYNAMIC_SHAPE, and '", op.operator_name(),
                              "' has no CPU kernel to learn its output dtypes from.");
  TORCH_CHECK_NOT_IMPLEMENTED(has_cpu_kernel, "torch-fl: cannot run plugin kernel '", b.op_name, "' of ", b.label,
                              ": PyTorch has no meta (fake) implementation of '", op.operator_name(),
                              "', so the output shapes are unknown. Register one, e.g. "
                              "torch.library.register_fake(\"",
                              op.operator_name().name,
                              "\"), or flag the operator TFL_OP_DYNAMIC_SHAPE in the plugin if "
                              "the kernel sizes its outputs itself.");
}

// PyTorch's advanced indexing moves index tensors to self's device
// (make_info in TensorAdvancedIndexing.cpp), so a CUDA tensor accepts CPU
// indices; a plugin device does too. `indices` is a Tensor?[] argument.
void move_indices_to_device(c10::IValue& indices, const c10::IValue& self) {
  if (!self.isTensor() || !indices.isList()) return;
  const at::Tensor& base = self.toTensor();
  if (!base.defined() || base.device().type() != c10::DeviceType::PrivateUse1) return;
  bool moved = false;
  c10::List<std::optional<at::Tensor>> out;
  for (const c10::IValue& item : indices.toListRef()) {
    std::optional<at::Tensor> t;
    if (item.isTensor() && item.toTensor().defined()) {
      t = item.toTensor();
      if (t->device().is_cpu()) {
        t = t->to(base.device());
        moved = true;
      }
    }
    out.push_back(std::move(t));
  }
  if (moved) indices = std::move(out);
}

}  // namespace

void raise_kernel_error(const KernelBinding& b, TFL_Error* error, const std::string& resize_error) {
  if (resize_error.empty()) {
    TFL_CHECK_STATUS(b.owner(), b.op_name, error);
  } else {
    TFL_CHECK_STATUS(b.owner(), b.op_name, error, " (resize_output failed: ", resize_error, ")");
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

std::unique_ptr<PluginKernel> PluginKernel::create(const c10::OperatorHandle& op, Route route,
                                                   const KernelBinding* binding, std::string* why) {
  const c10::FunctionSchema& schema = op.schema();
  std::unique_ptr<PluginKernel> k(new PluginKernel());
  k->op_ = op;
  k->name_ = c10::toString(op.operator_name());
  k->route_ = route;
  k->binding_.store(binding, std::memory_order_relaxed);
  const auto& args = schema.arguments();
  k->num_args_ = args.size();
  k->num_returns_ = schema.returns().size();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::optional<ArgKind> kind = classify_argument(args[i].type());
    if (!kind.has_value()) {
      *why = c10::str("argument '", args[i].name(), "' has type ", args[i].type()->str(),
                      ", which the plugin ABI cannot pass");
      return nullptr;
    }
    k->kinds_.push_back(*kind);
    k->is_out_.push_back(args[i].is_out() ? 1 : 0);
    k->is_scalar_.push_back(*kind == ArgKind::Scalar ? 1 : 0);
    if (*kind == ArgKind::Generator) k->generator_arg_ = static_cast<int>(i);
    if (*kind == ArgKind::OptionalTensorList && args[i].name() == "indices" && i > 0 && args[0].name() == "self") {
      k->indices_arg_ = static_cast<int>(i);
    }
    if (*kind == ArgKind::Device) k->device_arg_ = static_cast<int>(i);
    if (!args[i].is_out() &&
        (*kind == ArgKind::Tensor || *kind == ArgKind::TensorList || *kind == ArgKind::OptionalTensorList)) {
      k->has_tensor_inputs_ = true;
    }
  }
  for (const c10::Argument& r : schema.returns()) {
    if (r.type()->kind() != c10::TypeKind::TensorType) {
      *why = c10::str("it returns ", r.type()->str(), "; plugin kernels return tensors only");
      return nullptr;
    }
    if (route == Route::Functional) continue;
    // InPlace/Out: each return aliases (a!) a written argument.
    int found = -1;
    const c10::AliasInfo* ra = r.alias_info();
    for (size_t i = 0; ra != nullptr && i < args.size(); ++i) {
      const c10::AliasInfo* aa = args[i].alias_info();
      if (aa != nullptr && aa->isWrite() && aa->beforeSets() == ra->beforeSets()) {
        found = static_cast<int>(i);
        break;
      }
    }
    if (found < 0) {
      *why = "a return does not alias a mutated argument";
      return nullptr;
    }
    k->return_args_.push_back(found);
  }
  return k;
}

namespace {
// Output shapes that depend on tensor values cannot be known while the
// values are still being captured.
constexpr const char* kDataDependent =
    "its output shape depends on tensor values, which a capture has not computed. Keep such operators (nonzero, "
    "masked_select, boolean-mask indexing, unique) out of the capture";
}  // namespace

bool PluginKernel::prepare_outputs(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                   const KernelBinding& binding, c10::SmallVector<at::Tensor, 2>& outputs) {
  const bool dynamic = (binding.flags & TFL_OP_DYNAMIC_SHAPE) != 0;
  if (dynamic) capture::check_capturable(name_.c_str(), kDataDependent);
  if (route_ == Route::Out && dynamic) {
    // The kernel sizes them; start from [0] as the ABI promises.
    for (int a : return_args_) {
      const at::Tensor& out = args[a].toTensor();
      resize_device_tensor(out, {0}, std::nullopt);
      outputs.push_back(out);
    }
    return true;
  }

  Signature key;
  append_signature(args, is_scalar_, /*scalar_values=*/!has_tensor_inputs_, key);
  std::shared_ptr<const InferredOutputs> inferred = cache_.find(key);
  if (inferred != nullptr && inferred->data_dependent) {
    capture::check_capturable(name_.c_str(), kDataDependent);
    inferred = infer_with_meta_on_device(op, args, return_args_);
  } else if (inferred == nullptr) {
    if (meta_unavailable_.load(std::memory_order_relaxed)) {
      // Retry once a meta kernel appears (torch.library.register_fake).
      if (!op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) return false;
      meta_unavailable_.store(false, std::memory_order_relaxed);
    }
    std::optional<bool> ok = infer_outputs(op, args, dynamic, inferred);
    if (!ok.has_value()) {
      // No meta kernel: the shim cannot know the output shapes, so the
      // operator runs through the fallback policy from now on.
      meta_unavailable_.store(true, std::memory_order_relaxed);
      return false;
    }
    TORCH_INTERNAL_ASSERT(inferred->outputs.size() == num_returns_);
    if (*ok) {
      cache_.insert(key, inferred);
    } else {
      auto marker = std::make_shared<InferredOutputs>();
      marker->data_dependent = true;
      cache_.insert(key, std::move(marker));
    }
  }

  if (route_ == Route::Out) {
    for (size_t j = 0; j < return_args_.size(); ++j) {
      const at::Tensor& out = args[return_args_[j]].toTensor();
      const OutputSpec& spec = inferred->outputs[j];
      if (spec.resize) {
        // PyTorch's own resize: same warning for a non-empty out=.
        at::native::resize_output(out, spec.sizes);
        if (!out.strides().equals(spec.strides)) {
          out.unsafeGetTensorImpl()->set_sizes_and_strides(spec.sizes, spec.strides);
          ensure_storage_fits(out);
        }
      }
      outputs.push_back(out);
    }
    return true;
  }

  // Functional: allocate on the current device, which the caller set.
  for (const OutputSpec& spec : inferred->outputs) {
    if (spec.undefined) {
      outputs.emplace_back();
      continue;
    }
    outputs.push_back(at::detail::empty_strided_generic(
        spec.sizes, spec.strides, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), spec.dtype));
  }
  return true;
}

std::optional<bool> PluginKernel::infer_outputs(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                                bool dynamic, std::shared_ptr<const InferredOutputs>& inferred) const {
  if (dynamic) {
    try {
      inferred = infer_dtypes_on_empty_cpu(op, args);
      return true;
    } catch (const c10::NotImplementedError&) {
      return std::nullopt;
    }
  }
  try {
    inferred = infer_with_meta(op, args, return_args_);
    return true;
  } catch (const c10::NotImplementedError&) {
    if (!op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) return std::nullopt;
    // A meta kernel that needs data (C++ metas say so with
    // NotImplementedError): run it on the device.
  } catch (const c10::Error&) {
    throw;  // PyTorch's own error for these arguments (shapes, dtypes)
  } catch (const std::exception&) {
    // A Python meta kernel failed: most likely one that needs data (a
    // boolean mask index calls nonzero); if the arguments are wrong
    // instead, the run below raises PyTorch's error for them.
  }
  capture::check_capturable(name_.c_str(), kDataDependent);
  inferred = infer_with_meta_on_device(op, args, return_args_);
  return false;
}

c10::DeviceIndex PluginKernel::call_device(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) const {
  if (const auto common = check_same_device(op, args)) {
    TORCH_CHECK(common->type() == c10::DeviceType::PrivateUse1, op.schema().operator_name(), ": expected ",
                device_type_name(), " tensors, got tensors on ", *common);
    return common->index();
  }
  if (device_arg_ >= 0 && args[device_arg_].isDevice() && args[device_arg_].toDevice().has_index()) {
    return args[device_arg_].toDevice().index();
  }
  return current_device();
}

void PluginKernel::push_results(c10::ArrayRef<c10::IValue> args, c10::SmallVector<at::Tensor, 2>& outputs,
                                torch::jit::Stack* stack) const {
  if (route_ == Route::Functional) {
    torch::jit::drop(*stack, num_args_);
    for (at::Tensor& out : outputs) stack->emplace_back(std::move(out));
  } else {
    // `args` views the stack: take the results before dropping it.
    c10::SmallVector<c10::IValue, 2> results;
    for (int a : return_args_) results.push_back(args[a]);
    torch::jit::drop(*stack, num_args_);
    for (c10::IValue& r : results) stack->push_back(std::move(r));
  }
}

void PluginKernel::operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const KernelBinding& b = *binding_.load(std::memory_order_acquire);
  check_not_forked("operator", b.op_name.c_str());
  if (indices_arg_ >= 0) {
    const size_t base = stack->size() - num_args_;
    move_indices_to_device((*stack)[base + static_cast<size_t>(indices_arg_)], (*stack)[base]);
  }
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(*stack, num_args_);

  // 1. One device for all tensors (CPU scalars allowed), made current.
  const c10::DeviceIndex device = call_device(op, args);
  CurrentDeviceScope device_scope(device);

  // 2. Arguments (out= excluded, as the ABI says).
  CallFrameBuilder fb;
  for (size_t i = 0; i < num_args_; ++i) {
    if (is_out_[i]) continue;
    if (C10_UNLIKELY(!add_argument(fb, kinds_[i], args[i]))) {
      static const std::string reason = "an argument's dtype cannot be passed through the plugin ABI";
      run_fallback(op, ks, stack, &reason);
      return;
    }
  }

  // 3. Outputs.
  c10::SmallVector<at::Tensor, 2> outputs;
  if (route_ == Route::InPlace) {
    for (int a : return_args_) outputs.push_back(args[a].toTensor());
  } else if (C10_UNLIKELY(!prepare_outputs(op, args, b, outputs))) {
    // Without a meta kernel the output shapes are unknown: only the CPU
    // fallback can run the call.
    require_cpu_kernel_for_fallback(op, b);
    static const std::string reason = "PyTorch has no meta kernel to infer its output shapes";
    run_fallback(op, ks, stack, &reason);
    return;
  }
  for (const at::Tensor& out : outputs) {
    if (C10_UNLIKELY(!fb.add_output(out))) {
      static const std::string reason = "an output's dtype cannot be passed through the plugin ABI";
      run_fallback(op, ks, stack, &reason);
      return;
    }
  }

  ResizeContext resize_ctx{outputs.data(), fb.output_descriptors(), outputs.size(), {}};
  TFL_CallFrame* frame =
      fb.finish(b.op_name.c_str(), device, current_plugin_stream(device), &resize_output_callback, &resize_ctx);

  // 4. Random state: the Generator? argument, else the device default.
  Generator* rng = nullptr;
  if (b.flags & TFL_OP_RANDOM) {
    std::optional<at::Generator> gen;
    if (generator_arg_ >= 0 && args[generator_arg_].isGenerator()) {
      gen = args[generator_arg_].toGenerator();
    }
    rng = resolve_generator(gen, device);
    std::tie(frame->rng_seed, frame->rng_offset) = capture::claim_rng(rng, frame->stream, rng_increment(outputs, args));
  }

  // 5. Run.
  if (TFL_Error* error = launch(b, frame, rng); C10_UNLIKELY(error != nullptr)) {
    if (b.owner_api->error_code(error) == TFL_ERROR_UNIMPLEMENTED) {
      const PluginStatus status = take_status(b.owner_api, error);
      run_fallback(op, ks, stack, &status.message);
      return;
    }
    raise_kernel_error(b, error, resize_ctx.error);
  }

  // 6. Results: in-place and out= ops return their mutated arguments.
  push_results(args, outputs, stack);
}

void set_copy_kernel(const KernelBinding* binding) {
  g_copy_kernel.store(binding, std::memory_order_release);
}

bool run_plugin_copy(const at::Tensor& dst, const at::Tensor& src) {
  const KernelBinding* b = g_copy_kernel.load(std::memory_order_acquire);
  if (b == nullptr) return false;
  check_not_forked("operator", b->op_name.c_str());
  const c10::DeviceIndex device = dst.device().index();
  CurrentDeviceScope device_scope(device);
  // copy_(Tensor(a!) self, Tensor src, bool non_blocking=False)
  CallFrameBuilder fb;
  if (!fb.add_tensor(dst) || !fb.add_tensor(src)) return false;
  fb.add_bool(false);
  if (!fb.add_output(dst)) return false;
  at::Tensor out = dst;
  ResizeContext resize_ctx{&out, fb.output_descriptors(), 1, {}};
  TFL_CallFrame* frame =
      fb.finish(b->op_name.c_str(), device, current_plugin_stream(device), &resize_output_callback, &resize_ctx);
  if (TFL_Error* error = launch(*b, frame); error != nullptr) {
    if (b->owner_api->error_code(error) == TFL_ERROR_UNIMPLEMENTED) {
      b->owner_api->error_destroy(error);
      return false;
    }
    raise_kernel_error(*b, error, resize_ctx.error);
  }
  return true;
}

}  // namespace torchfl

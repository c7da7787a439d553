#include "dispatch/typed_kernels.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <c10/util/Exception.h>

#include <type_traits>

#include "dispatch/call_frame.h"
#include "dispatch/output_cache.h"
#include "dispatch/signature.h"
#include "memory/device_allocator.h"
#include "observe/layer_profile.h"
#include "runtime/fork.h"
#include "runtime/runtime.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

// --- per-argument helpers, overloaded by type -----------------------------

// The same-device scan of check_same_device, without the message: a
// mismatch sends the call to the general path, which raises it.
struct DeviceScan {
  c10::Device common{c10::kCPU};
  bool found = false;
  bool mixed = false;
};

inline void scan(DeviceScan& d, const at::Tensor& t) {
  if (!t.defined()) return;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Device device = impl->device();
  if (device.is_cpu() && impl->dim() == 0) return;  // CPU scalars allowed
  if (!d.found) {
    d.common = device;
    d.found = true;
  } else if (device != d.common) {
    d.mixed = true;
  }
}
template <class T>
inline void scan(DeviceScan&, const T&) {}

inline bool frame_arg(CallFrameBuilder& fb, const at::Tensor& t) {
  return fb.add_tensor(t);
}
inline bool frame_arg(CallFrameBuilder& fb, const c10::Scalar& s) {
  fb.add_scalar(s);
  return true;
}
inline bool frame_arg(CallFrameBuilder& fb, bool v) {
  fb.add_bool(v);
  return true;
}
inline bool frame_arg(CallFrameBuilder& fb, std::optional<c10::ScalarType> v) {
  if (v.has_value()) {
    fb.add_int(static_cast<int64_t>(*v));
  } else {
    fb.add_none();
  }
  return true;
}
inline bool frame_arg(CallFrameBuilder& fb, at::OptionalIntArrayRef v) {
  if (v.has_value()) {
    fb.add_int_list(*v);
  } else {
    fb.add_none();
  }
  return true;
}

// Must encode exactly as append_signature does for the boxed values.
inline void key_arg(Signature& key, const c10::Scalar& s) {
  append_scalar_kind(key, s);
}
template <class T>
inline void key_arg(Signature& key, const T& v) {
  append_value(key, v);
}

// The one non-const tensor parameter of in-place and out= signatures.
template <class T, class... Rest>
at::Tensor& mutable_arg(T&& first, Rest&&... rest) {
  if constexpr (std::is_same_v<T, at::Tensor&>) {
    return first;
  } else {
    return mutable_arg(std::forward<Rest>(rest)...);
  }
}

template <class... Args>
constexpr int mutable_index() {
  constexpr bool flags[] = {std::is_same_v<Args, at::Tensor&>...};
  for (int i = 0; i < static_cast<int>(sizeof...(Args)); ++i) {
    if (flags[i]) return i;
  }
  return -1;
}

// --- the fast path ----------------------------------------------------------

// Runs the common case; false means "take the general path" (nothing has
// happened that the general path would repeat, except a kernel call that
// returned UNIMPLEMENTED and touched nothing, which the general path makes
// again before falling back).
template <class... Args>
bool fast_path(PluginKernel& k, at::Tensor& result, const Args&... args) {
  const KernelBinding& b = k.binding();
  check_not_forked("operator", b.op_name.c_str());
  if (b.flags & (TFL_OP_RANDOM | TFL_OP_DYNAMIC_SHAPE)) return false;
  DeviceScan devices;
  (scan(devices, args), ...);
  if (!devices.found || devices.mixed || devices.common.type() != c10::DeviceType::PrivateUse1) {
    return false;
  }
  const c10::DeviceIndex device = devices.common.index();
  CurrentDeviceScope device_scope(device);

  CallFrameBuilder fb;
  bool ok = true;
  size_t i = 0;
  ((ok = ok && (k.is_out(i) || frame_arg(fb, args)), ++i), ...);
  if (!ok) return false;

  // Outputs. Typed::matches guarantees the route fits the signature:
  // in-place and out= signatures have their mutated tensor, functional ones
  // return a new tensor.
  const at::Tensor* output = nullptr;
  std::shared_ptr<const InferredOutputs> inferred;
  if (k.route() != Route::InPlace) {
    Signature key;
    (key_arg(key, args), ...);
    inferred = k.cache().find(key);
    if (inferred == nullptr || inferred->data_dependent) return false;
  }
  if constexpr (mutable_index<Args...>() >= 0) {
    if (k.route() == Route::Out && inferred->outputs[0].resize) return false;
    output = &mutable_arg(args...);
  } else {
    const OutputSpec& spec = inferred->outputs[0];
    result = at::detail::empty_strided_generic(spec.sizes, spec.strides, device_allocator(),
                                               c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), spec.dtype);
    output = &result;
  }
  if (!fb.add_output(*output)) return false;

  ResizeContext resize_ctx{nullptr, fb.output_descriptors(), 0, {}};
  TFL_CallFrame* frame =
      fb.finish(b.op_name.c_str(), device, current_plugin_stream(device), &resize_output_callback, &resize_ctx);
  if (TFL_Error* error = launch(b, frame); C10_UNLIKELY(error != nullptr)) {
    if (b.owner_api->error_code(error) == TFL_ERROR_UNIMPLEMENTED) {
      b.owner_api->error_destroy(error);
      return false;
    }
    raise_kernel_error(b, error, resize_ctx.error);
  }
  return true;
}

template <class Ret, class... Args>
Ret run(PluginKernel& k, c10::DispatchKeySet ks, Args... args) {
  at::Tensor result;
  if (C10_LIKELY(fast_path<Args...>(k, result, args...))) {
    if constexpr (std::is_same_v<Ret, at::Tensor>) {
      return result;
    } else {
      return mutable_arg(args...);
    }
  }
  // The general path, on boxed arguments.
  torch::jit::Stack stack;
  stack.reserve(sizeof...(Args));
  torch::jit::push(stack, args...);
  k(k.op(), ks, &stack);
  if constexpr (std::is_same_v<Ret, at::Tensor>) {
    return std::move(stack.back()).toTensor();
  } else {
    return mutable_arg(args...);
  }
}

template <class Sig>
struct Typed;

template <class Ret, class... Args>
struct Typed<Ret(Args...)> {
  static bool matches(PluginKernel& k) {
    constexpr bool functional = std::is_same_v<Ret, at::Tensor>;
    if ((k.route() == Route::Functional) != functional) return false;
    // Every typed signature returns one tensor; an in-place or out= op
    // that returns nothing (the _foreach_ family) stays boxed.
    if (k.op().schema().returns().size() != 1) return false;
    if (!functional && k.return_arg(0) != mutable_index<Args...>()) {  // which arg it returns
      return false;
    }
    // Cheap rejections first: registration asks every menu entry in turn.
    if (k.op().schema().arguments().size() != sizeof...(Args)) return false;
    // Inferred once per menu entry, not once per registered operator.
    static const c10::FunctionSchema inferred = c10::inferFunctionSchemaFlattenedReturns<Ret(Args...)>();
    return !c10::findSchemaDifferences(inferred, k.op().schema()).has_value();
  }

  static EntryKernel make(PluginKernel* k) {
    auto entry = [k](c10::DispatchKeySet ks, Args... args) -> Ret {
      EntryTimer timer(k->name());
      return run<Ret, Args...>(*k, ks, args...);
    };
    return {c10::KernelFunction::makeFromUnboxedLambda(std::move(entry)),
            c10::impl::CppSignature::make<decltype(entry)>()};
  }
};

using T = const at::Tensor&;
using M = at::Tensor&;
using S = const c10::Scalar&;
using Dims = at::OptionalIntArrayRef;
using DType = std::optional<c10::ScalarType>;

template <class... Sigs>
std::optional<EntryKernel> pick(PluginKernel* k) {
  std::optional<EntryKernel> out;
  ((!out.has_value() && Typed<Sigs>::matches(*k) ? (out.emplace(Typed<Sigs>::make(k)), true) : false), ...);
  return out;
}

struct BoxedEntry final : public c10::OperatorKernel {
  explicit BoxedEntry(PluginKernel* k) : kernel(k) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    EntryTimer timer(kernel->name());
    (*kernel)(op, ks, stack);
  }
  PluginKernel* kernel;
};

}  // namespace

std::optional<EntryKernel> typed_entry(PluginKernel* k) {
  return pick<
      // functional: relu, mul/div/comparisons, add/sub, Scalar forms,
      // sum, sum.dim_IntList / mean.dim
      at::Tensor(T), at::Tensor(T, T), at::Tensor(T, T, S), at::Tensor(T, S), at::Tensor(T, S, S), at::Tensor(T, DType),
      at::Tensor(T, Dims, bool, DType),
      // in-place: zero_/neg_/relu_, mul_/div_, add_/sub_, fill_/mul_.Scalar,
      // add_.Scalar
      M(M), M(M, T), M(M, T, S), M(M, S), M(M, S, S),
      // out=: neg.out, mul.out/mm.out/eq.Tensor_out, add.out,
      // eq.Scalar_out, sum.IntList_out/mean.out
      M(T, M), M(T, T, M), M(T, T, S, M), M(T, S, M), M(T, Dims, bool, DType, M)>(k);
}

EntryKernel boxed_entry(PluginKernel* k) {
  return {c10::KernelFunction::makeFromBoxedFunctor(std::make_unique<BoxedEntry>(k)), std::nullopt};
}

}  // namespace torchfl

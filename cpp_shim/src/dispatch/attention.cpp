#include "dispatch/attention.h"

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/SDPBackend.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>

#include "dispatch/call_frame.h"
#include "observe/layer_profile.h"
#include "runtime/fork.h"
#include "runtime/generator.h"
#include "runtime/runtime.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

constexpr const char* kForward = "_scaled_dot_product_fused_attention_overrideable";
constexpr const char* kBackward = "_scaled_dot_product_fused_attention_overrideable_backward";

// The bound kernels; nullptr until a plugin offers them. Bindings are
// immutable and never freed (KernelBinding), so a reader may keep one.
std::atomic<const KernelBinding*> g_forward{nullptr};
std::atomic<const KernelBinding*> g_backward{nullptr};

bool any_requires_grad(std::initializer_list<const at::Tensor*> tensors) {
  if (!c10::GradMode::is_enabled()) return false;
  return std::any_of(tensors.begin(), tensors.end(),
                     [](const at::Tensor* t) { return t->defined() && t->requires_grad(); });
}

// Whether `mask` broadcasts to (B, H, L, S).
bool broadcasts_to(const at::Tensor& mask, std::array<int64_t, 4> full) {
  if (mask.dim() > 4) return false;
  for (int64_t d = 1; d <= mask.dim(); ++d) {
    const int64_t size = mask.size(-d);
    if (size != 1 && size != full[4 - d]) return false;
  }
  return true;
}

// Why the bound plugin kernel cannot run these inputs; empty when it can.
// What the ABI cannot tell (a plugin refusing a head size, say) surfaces
// as the kernel's UNIMPLEMENTED error instead.
std::string fused_unsupported(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                              bool enable_gqa) {
  const KernelBinding* fwd = g_forward.load(std::memory_order_acquire);
  if (fwd == nullptr) return c10::str("the plugin's op table has no ", kForward);
  const at::Tensor no_mask;
  const at::Tensor& m = mask.has_value() ? *mask : no_mask;
  if (any_requires_grad({&q, &k, &v, &m}) && g_backward.load(std::memory_order_acquire) == nullptr) {
    return c10::str("an input requires grad and the plugin's op table has no ", kBackward);
  }
  if (q.is_nested() || k.is_nested() || v.is_nested()) return "nested tensors";
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return "inputs that are not 4-D (batch, heads, length, size)";
  const at::ScalarType dtype = q.scalar_type();
  const AttachedDevice* attached = attached_device();
  const uint64_t caps = attached != nullptr ? attached->capabilities : 0;
  const bool dtype_ok = dtype == at::kFloat || (dtype == at::kHalf && (caps & TFL_CAP_FLOAT16) != 0) ||
                        (dtype == at::kBFloat16 && (caps & TFL_CAP_BFLOAT16) != 0);
  if (!dtype_ok || k.scalar_type() != dtype || v.scalar_type() != dtype) return c10::str("dtype ", dtype);
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) return "empty inputs";
  const int64_t hq = q.size(1);
  const int64_t hkv = k.size(1);
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0) || v.size(1) != hkv || v.size(2) != k.size(2) ||
      k.size(3) != q.size(3) || hq % hkv != 0 || (hq != hkv && !enable_gqa)) {
    return "shapes the math path must check (or report)";
  }
  if (m.defined() && (is_causal || !broadcasts_to(m, {q.size(0), hq, q.size(2), k.size(2)}))) {
    return "an attn_mask with is_causal, or one that does not broadcast";
  }
  if (dropout_p > 0.0 && (fwd->flags & TFL_OP_RANDOM) == 0) {
    return c10::str("dropout: the plugin's ", kForward, " is not flagged TFL_OP_RANDOM");
  }
  return {};
}

// The device's _fused_sdp_choice (the op and the stub).
int64_t choose_sdp_backend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                           std::optional<double> /*scale*/, bool enable_gqa) {
  const at::Context& ctx = at::globalContext();
  const std::string why = ctx.userEnabledOverrideableSDP()
                              ? fused_unsupported(q, k, v, mask, dropout_p, is_causal, enable_gqa)
                              : "SDPBackend.OVERRIDEABLE is disabled (torch.nn.attention.sdpa_kernel)";
  if (why.empty()) return static_cast<int64_t>(at::SDPBackend::overrideable);
  TORCH_CHECK(ctx.userEnabledMathSDP(), "No available kernel for scaled_dot_product_attention on ", device_type_name(),
              ": the math backend is disabled and the fused kernel cannot run: ", why,
              ". Enable SDPBackend.MATH in torch.nn.attention.sdpa_kernel.");
  return static_cast<int64_t>(at::SDPBackend::math);
}

// The common device of the defined tensors (0-dim CPU tensors allowed, as
// the ABI passes them as host scalars), made current for the call.
c10::DeviceIndex call_device(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  std::optional<c10::Device> common;
  for (const at::Tensor* t : tensors) {
    if (!t->defined() || (t->is_cpu() && t->dim() == 0)) continue;
    if (!common.has_value()) common = t->device();
    TORCH_CHECK(t->device() == *common, op, ": expected all tensors on one device, got ", *common, " and ",
                t->device());
  }
  TORCH_CHECK(common.has_value() && common->is_privateuseone(), op, ": expected ", device_type_name(), " tensors");
  return common->index();
}

// Runs `b` on the frame `fb` holds; a kernel declining the call
// (UNIMPLEMENTED) becomes NotImplementedError: the CPU has no kernel for
// these operators to fall back to.
void run(const KernelBinding& b, CallFrameBuilder& fb, bool described, c10::DeviceIndex device,
         c10::ArrayRef<at::Tensor> outputs, Generator* rng = nullptr, uint64_t rng_increment = 0) {
  TORCH_CHECK_NOT_IMPLEMENTED(described, "torch-fl: ", b.op_name, " of ", b.label,
                              ": a tensor's dtype cannot be passed through the plugin ABI");
  std::vector<at::Tensor> outs(outputs.begin(), outputs.end());
  ResizeContext resize_ctx{outs.data(), fb.output_descriptors(), outs.size(), {}};
  TFL_CallFrame* frame =
      fb.finish(b.op_name.c_str(), device, current_plugin_stream(device), &resize_output_callback, &resize_ctx);
  if (rng != nullptr) {
    std::tie(frame->rng_seed, frame->rng_offset) = capture::claim_rng(rng, frame->stream, rng_increment);
  }
  if (TFL_Error* error = launch(b, frame, rng); error != nullptr) {
    if (b.owner_api->error_code(error) == TFL_ERROR_UNIMPLEMENTED) {
      const PluginStatus status = take_status(b.owner_api, error);
      TORCH_CHECK_NOT_IMPLEMENTED(false, "torch-fl: plugin ", b.label, " declined ", b.op_name, ": ", status.message,
                                  ". Use the math path: with torch.nn.attention.sdpa_kernel(SDPBackend.MATH).");
    }
    raise_kernel_error(b, error, resize_ctx.error);
  }
}

// An output laid out like `query` (the operator's meta function does the
// same, so eager and traced strides agree).
at::Tensor like_query(const at::Tensor& q, std::array<int64_t, 4> shape) {
  if (q.sizes().equals(shape)) return at::empty_like(q);
  std::array<int64_t, 4> order{0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return q.stride(a) > q.stride(b); });
  std::array<int64_t, 4> strides{};
  int64_t stride = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    strides[*it] = stride;
    stride *= shape[*it];
  }
  return at::empty_strided(shape, strides, q.options());
}

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
                                 at::Tensor, at::Tensor>;

ForwardResult fused_forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal,
                            bool return_debug_mask, std::optional<double> scale) {
  EntryTimer timer("aten::_scaled_dot_product_fused_attention_overrideable");
  const KernelBinding& b = *g_forward.load(std::memory_order_acquire);
  check_not_forked("operator", b.op_name.c_str());
  const at::Tensor bias_arg = attn_bias.has_value() ? *attn_bias : at::Tensor();
  CurrentDeviceScope scope(call_device(kForward, {&query, &key, &value, &bias_arg}));
  const c10::DeviceIndex device = current_device();
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, kForward,
              " on a plugin device takes 4-D (batch, heads, length, size) query, key and value, got ", query.dim(),
              "-D, ", key.dim(), "-D and ", value.dim(), "-D");
  const int64_t B = query.size(0), H = query.size(1), L = query.size(2), S = key.size(2);
  // The plugin sees the bias at its full shape (zero strides where it
  // repeats), whatever the caller's broadcast.
  at::Tensor bias;
  if (bias_arg.defined()) {
    TORCH_CHECK(broadcasts_to(bias_arg, {B, H, L, S}), kForward, ": attn_bias of shape ", bias_arg.sizes(),
                " does not broadcast to ", c10::IntArrayRef({B, H, L, S}));
    bias = bias_arg.expand({B, H, L, S});
  }
  const at::Tensor out = like_query(query, {B, H, L, value.size(3)});
  const at::Tensor lse = at::empty({B, H, L}, query.options().dtype(at::kFloat));
  const at::Tensor seed = at::empty({}, query.options().dtype(at::kLong));
  const at::Tensor offset = at::empty({}, query.options().dtype(at::kLong));
  CallFrameBuilder fb;
  bool described = fb.add_tensor(query) && fb.add_tensor(key) && fb.add_tensor(value) && fb.add_tensor(bias);
  fb.add_float(dropout_p);
  fb.add_bool(is_causal);
  fb.add_bool(return_debug_mask);
  scale.has_value() ? fb.add_float(*scale) : fb.add_none();
  // One output per Tensor return; cum_seq_q/k and the debug mask stay
  // undefined in the dense case.
  const std::array<at::Tensor, 7> outputs{out, lse, at::Tensor(), at::Tensor(), seed, offset, at::Tensor()};
  for (const at::Tensor& t : outputs) described = described && fb.add_output(t);
  // One Philox counter per attention probability, reserved only when the
  // kernel draws any (as CUDA's flash attention advances its generator).
  Generator* rng = dropout_p > 0.0 ? resolve_generator(std::nullopt, device) : nullptr;
  run(b, fb, described, device, outputs, rng, static_cast<uint64_t>(B * H * L * S));
  return {out, lse, at::Tensor(), at::Tensor(), c10::SymInt(L), c10::SymInt(S), seed, offset, at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, int64_t max_q, int64_t max_k,
    double dropout_p, bool is_causal, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    std::optional<double> scale) {
  EntryTimer timer("aten::_scaled_dot_product_fused_attention_overrideable_backward");
  const KernelBinding& b = *g_backward.load(std::memory_order_acquire);
  check_not_forked("operator", b.op_name.c_str());
  CurrentDeviceScope scope(call_device(
      kBackward, {&grad_out, &query, &key, &value, &attn_bias, &out, &logsumexp, &philox_seed, &philox_offset}));
  const c10::DeviceIndex device = current_device();
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4, kBackward, " on a plugin device takes 4-D query and key");
  const std::array<int64_t, 4> full{query.size(0), query.size(1), query.size(2), key.size(2)};
  at::Tensor bias;
  if (attn_bias.defined()) {
    TORCH_CHECK(broadcasts_to(attn_bias, full), kBackward, ": attn_bias of shape ", attn_bias.sizes(),
                " does not broadcast to ", c10::IntArrayRef(full));
    bias = attn_bias.expand(full);
  }
  const auto grad_if = [&](size_t i, const at::Tensor& like) {
    return grad_input_mask[i] ? at::empty_like(like) : at::Tensor();
  };
  // The plugin writes the bias gradient at the full shape; summed to the
  // bias's own shape below, as autograd would reduce a broadcast.
  const at::Tensor grad_bias_full =
      grad_input_mask[3] && bias.defined() ? at::empty(full, attn_bias.options()) : at::Tensor();
  const std::array<at::Tensor, 4> grads{grad_if(0, query), grad_if(1, key), grad_if(2, value), grad_bias_full};
  CallFrameBuilder fb;
  bool described = fb.add_tensor(grad_out) && fb.add_tensor(query) && fb.add_tensor(key) && fb.add_tensor(value) &&
                   fb.add_tensor(bias);
  fb.add_bool_list(c10::List<bool>({grad_input_mask[0], grad_input_mask[1], grad_input_mask[2], grad_input_mask[3]}));
  described = described && fb.add_tensor(out) && fb.add_tensor(logsumexp) && fb.add_tensor(cum_seq_q) &&
              fb.add_tensor(cum_seq_k);
  fb.add_int(max_q);
  fb.add_int(max_k);
  fb.add_float(dropout_p);
  fb.add_bool(is_causal);
  described = described && fb.add_tensor(philox_seed) && fb.add_tensor(philox_offset);
  scale.has_value() ? fb.add_float(*scale) : fb.add_none();
  for (const at::Tensor& t : grads) described = described && fb.add_output(t);
  if (std::none_of(grads.begin(), grads.end(), [](const at::Tensor& t) { return t.defined(); })) {
    return {};
  }
  run(b, fb, described, device, grads);
  const at::Tensor grad_bias = grad_bias_full.defined() ? at::sum_to(grad_bias_full, attn_bias.sizes()) : at::Tensor();
  return {grads[0], grads[1], grads[2], grad_bias};
}

torch::Library& attention_library() {
  // Leaked on purpose: destroying a Library unregisters its kernels (P7).
  static auto* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  return *lib;
}

}  // namespace

bool bind_attention_kernel(const c10::OperatorName& name, const KernelBinding* binding) {
  const bool forward = name == c10::OperatorName(c10::str("aten::", kForward), "");
  if (!forward && name != c10::OperatorName(c10::str("aten::", kBackward), "")) return false;
  std::atomic<const KernelBinding*>& slot = forward ? g_forward : g_backward;
  // The kernel is registered once; later plugins only rebind it.
  if (slot.exchange(binding, std::memory_order_acq_rel) == nullptr) {
    if (forward) {
      attention_library().impl(kForward, TORCH_FN(fused_forward));
    } else {
      attention_library().impl(kBackward, TORCH_FN(fused_backward));
    }
  }
  return true;
}

}  // namespace torchfl

// SDPA's backend choice for the device: scaled_dot_product_attention asks
// the stub, torch._fused_sdp_choice the operator. Both exist whether or not
// a plugin offers the fused kernel (the answer is then MATH), which also
// keeps the CPU's choice (flash attention for CPU) from leaking through the
// fallback.
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchfl::choose_sdp_backend)
}  // namespace at::native

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", TORCH_FN(torchfl::choose_sdp_backend));
}

#include "dispatch/fallback.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "dispatch/device_check.h"
#include "dispatch/plugin_kernel.h"
#include "dispatch/registration.h"
#include "dispatch/zero_copy_fallback.h"
#include "observe/trace.h"
#include "runtime/fork.h"
#include "runtime/generator.h"
#include "runtime/runtime.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

FallbackMode initial_mode() {
  const char* env = std::getenv("TORCH_FL_FALLBACK");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "cpu") == 0) {
    return FallbackMode::Cpu;
  }
  if (std::strcmp(env, "error") == 0) return FallbackMode::Error;
  TORCH_WARN("torch-fl: TORCH_FL_FALLBACK=", env, " is neither 'cpu' nor 'error'; using 'cpu'");
  return FallbackMode::Cpu;
}

std::atomic<int32_t> g_mode{static_cast<int32_t>(initial_mode())};

// Per-operator accounting. Entries are created once per operator and never
// freed, so the pointers handed out stay valid; a reset only zeroes them.
struct OpRecord {
  std::string name;
  std::atomic<uint64_t> count{0};
  std::atomic<bool> warned{false};
};
std::mutex g_records_mutex;
std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpRecord>>& records() {
  static auto* map = new std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpRecord>>();
  return *map;
}

OpRecord& record_for(const c10::OperatorHandle& op) {
  const c10::FunctionSchema* key = &op.schema();  // stable per operator
  std::lock_guard<std::mutex> lock(g_records_mutex);
  std::unique_ptr<OpRecord>& r = records()[key];
  if (r == nullptr) {
    r = std::make_unique<OpRecord>();
    r->name = table_name(op.operator_name());
  }
  return *r;
}

bool is_generator_type(const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (t->kind() == c10::TypeKind::OptionalType) {
    t = t->expectRef<c10::OptionalType>().getElementType();
  }
  return t->kind() == c10::TypeKind::GeneratorType;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// CPU kernels refuse device generators (pitfall P8), and with none they
// would draw from the CPU's default generator, which device seeding does
// not control. So each random op gets a CPU generator derived from the
// device generator's (seed, offset), whose offset then advances: seeded
// device runs are reproducible and consecutive calls differ.
void rewrite_generators(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args_view, torch::jit::Stack* stack,
                        size_t base, c10::DeviceIndex device) {
  const auto& schema_args = op.schema().arguments();
  for (size_t i = 0; i < args_view.size(); ++i) {
    if (!is_generator_type(schema_args[i].type())) continue;
    c10::IValue& v = (*stack)[base + i];
    std::optional<at::Generator> gen;
    if (v.isGenerator()) {
      gen = v.toGenerator();
      if (gen->device().type() != c10::DeviceType::PrivateUse1) continue;
    }
    Generator* g = resolve_generator(gen, device);
    const auto [seed, offset] = g->claim(1);
    v = at::detail::createCPUGenerator(splitmix64(seed ^ splitmix64(offset)));
  }
}

// Lazy conjugate/negative bits have no CPU twin over the same bytes.
bool has_lazy_bits(c10::ArrayRef<c10::IValue> args) {
  auto lazy = [](const at::Tensor& t) {
    return t.defined() && (t.is_conj() || t.is_neg());
  };
  for (const c10::IValue& v : args) {
    if (v.isTensor() && lazy(v.toTensor())) return true;
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (lazy(t)) return true;
      }
    }
  }
  return false;
}

// The functional operator an out= overload belongs to, by PyTorch's naming
// ("exp.out" -> "exp", "eq.Tensor_out" -> "eq.Tensor"), if it exists.
std::optional<c10::OperatorName> functional_sibling(const c10::OperatorName& name) {
  const std::string& overload = name.overload_name;
  std::string base;
  if (overload == "out") {
    base = "";
  } else if (overload.size() > 4 && overload.compare(overload.size() - 4, 4, "_out") == 0) {
    base = overload.substr(0, overload.size() - 4);
  } else {
    return std::nullopt;
  }
  c10::OperatorName functional(name.name, base);
  if (!c10::Dispatcher::singleton().findSchema(functional).has_value()) {
    return std::nullopt;
  }
  return functional;
}

std::string not_implemented_message(const c10::OperatorHandle& op, const std::string* plugin_reason) {
  const c10::OperatorName& name = op.operator_name();
  const std::string why = plugin_reason != nullptr
                              ? c10::str("its plugin kernel cannot run this call (", *plugin_reason, ")")
                              : std::string("no plugin provides a kernel for it");
  // Structured functional ops reach the backend as their out= overload
  // ("exp" as "exp.out"); a plugin may implement either form, so name both.
  std::string alternative;
  if (const auto functional = functional_sibling(name)) {
    alternative = c10::str(" (or `", kernel_symbol(*functional), "` for \"", table_name(*functional), "\")");
  }
  return c10::str("torch-fl: '", name, "' is not implemented for the '", device_type_name(), "' device: ", why,
                  ", and the CPU fallback is disabled (TORCH_FL_FALLBACK=error). A "
                  "plugin implements it by exporting the kernel symbol `",
                  kernel_symbol(name), "` for op \"", table_name(name), "\"", alternative,
                  " in its op table (docs/plugin-abi.md, \"Kernel symbols\"). Set "
                  "TORCH_FL_FALLBACK=cpu to run it on the CPU instead.");
}

void fallback_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  // An operator of a library loaded after the plugin was registered gets
  // here on its first call: bind the plugin's kernel and run it.
  if (C10_UNLIKELY(has_pending_kernels())) {
    if (PluginKernel* kernel = bind_pending(op)) {
      (*kernel)(op, ks, stack);
      return;
    }
  }
  run_fallback(op, ks, stack, nullptr);
}

// Out= arguments swapped for zero-element tensors around a CPU kernel (see
// run_fallback): the caller's tensor and the stand-in the kernel resized.
struct SwappedOut {
  at::Tensor original;
  at::Tensor stand_in;
};

// Some of PyTorch's CPU kernels resize an out= argument through an
// intermediate shape: mse_loss.out's meta first builds a binary
// TensorIterator over `out` ([3, 4] for a mean loss), so even an `out` of
// the final shape [] triggers the deprecated-resize warning, which a later
// PyTorch turns into an error. A zero-element `out` may be resized freely,
// so the CPU kernel gets such stand-ins (same dtype, so its casting checks
// are unchanged) and the results move into the caller's tensors afterwards.
std::vector<SwappedOut> swap_in_empty_outs(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  std::vector<SwappedOut> swapped;
  const size_t n = schema.arguments().size();
  const size_t base = stack->size() - n;
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (!schema.arguments()[i].is_out() || !v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || t.numel() == 0 || t.device().type() != c10::DeviceType::PrivateUse1) continue;
    at::Tensor stand_in = at::empty({0}, t.options());
    swapped.push_back({t, stand_in});
    v = stand_in;
  }
  return swapped;
}

// Moves each stand-in's result into the caller's tensor, resizing it only
// where its shape differs (warning as PyTorch does for a wrongly sized
// out=), and returns the caller's tensors in the stand-ins' places.
void restore_outs(const std::vector<SwappedOut>& swapped, torch::jit::Stack* stack, size_t num_returns) {
  const size_t rbase = stack->size() - num_returns;
  for (const SwappedOut& s : swapped) {
    at::native::resize_output(s.original, s.stand_in.sizes());
    s.original.copy_(s.stand_in);
    for (size_t j = rbase; j < stack->size(); ++j) {
      c10::IValue& r = (*stack)[j];
      if (r.isTensor() && r.toTensor().is_same(s.stand_in)) r = s.original;
    }
  }
}

}  // namespace

std::string table_name(const c10::OperatorName& name) {
  std::string out = name.name;
  if (out.rfind("aten::", 0) == 0) out.erase(0, 6);
  if (!name.overload_name.empty()) out += "." + name.overload_name;
  return out;
}

std::string kernel_symbol(const c10::OperatorName& name) {
  // The mangling rule is the Rust core's (torchfl_ffi::kernel_symbol); the
  // shim asks it through TFL_ShimDevice.kernel_symbol instead of restating
  // it. Before attach no operator reaches the device, so no message needs it.
  const std::string op = table_name(name);
  const AttachedDevice* d = attached_device();
  if (d == nullptr) return c10::str("<the kernel symbol of ", op, ">");
  std::string out(64, '\0');
  size_t len = d->kernel_symbol(op.c_str(), out.data(), out.size());
  if (len >= out.size()) {
    out.assign(len + 1, '\0');
    len = d->kernel_symbol(op.c_str(), out.data(), out.size());
  }
  if (len == 0 || len >= out.size()) return c10::str("<the kernel symbol of ", op, ">");
  out.resize(len);
  return out;
}

// PyTorch routes convolutions on out-of-tree backends to the
// `*_overrideable` operators, which have no CPU kernel; falling back means
// running the CPU's own convolution operator on the same arguments.
// Returns the operator to run on the CPU, adjusting the stack if its schema
// differs.
c10::OperatorHandle cpu_equivalent(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.operator_name();
  if (name.name == "aten::convolution_overrideable") {
    // Same arguments as aten::convolution.
    static const c10::OperatorHandle conv = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
    return conv;
  }
  if (name.name == "aten::convolution_backward_overrideable") {
    // aten::convolution_backward takes bias_sizes after weight: the bias
    // gradient's size, needed only when output_mask[2] asks for it.
    static const c10::OperatorHandle conv_backward =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
    const size_t n = op.schema().arguments().size();
    const size_t base = stack->size() - n;
    const at::Tensor& weight = (*stack)[base + 2].toTensor();
    const bool transposed = (*stack)[base + 6].toBool();
    const int64_t groups = (*stack)[base + 8].toInt();
    const bool wants_bias = (*stack)[base + 9].toBoolList().get(2);
    c10::IValue bias_sizes;
    if (wants_bias) {
      const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
      bias_sizes = c10::IValue(std::vector<int64_t>{channels});
    }
    stack->insert(stack->begin() + static_cast<std::ptrdiff_t>(base + 3), std::move(bias_sizes));
    return conv_backward;
  }
  return op;
}

void run_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet /*ks*/, torch::jit::Stack* stack,
                  const std::string* plugin_reason) {
  // Only device operators get here; on the CPU they would still read device
  // memory the plugin may be writing in threads that no longer exist.
  check_not_forked("CPU fallback of", op.operator_name().name.c_str());
  capture::check_capturable(
      c10::toString(op.operator_name()).c_str(),
      "the plugin has no kernel for it, and its CPU fallback needs the data on the host. Give the plugin a kernel for "
      "it (python -m torch_fl compat lists what falls back), or keep it out of the capture");
  const size_t num_args = op.schema().arguments().size();
  const c10::ArrayRef<c10::IValue> args = torch::jit::last(*stack, num_args);
  const std::optional<c10::Device> common = check_same_device(op, args);

  TORCH_CHECK_NOT_IMPLEMENTED(fallback_mode() != FallbackMode::Error, not_implemented_message(op, plugin_reason));

  OpRecord& record = record_for(op);
  record.count.fetch_add(1, std::memory_order_relaxed);
  const AttachedDevice* d = attached_device();
  const bool zero_copy = d != nullptr && d->host_addressable() && !has_lazy_bits(args);
  if (!record.warned.exchange(true, std::memory_order_relaxed)) {
    TORCH_WARN(
        "torch-fl: '", op.operator_name(), "' has no '", device_type_name(), "' kernel (",
        plugin_reason != nullptr ? c10::str("its plugin kernel cannot run this call: ", *plugin_reason)
                                 : std::string("no plugin provides it"),
        "), so it runs on the CPU",
        zero_copy ? " directly on the device's host-addressable memory" : ", copying its tensors to the host and back",
        ". Set TORCH_FL_FALLBACK=error to make this an error. (Warned once "
        "per operator.)");
  }

  c10::DeviceIndex device = current_device();
  if (common.has_value() && common->type() == c10::DeviceType::PrivateUse1) {
    device = common->index();
  }
  const TraceScope trace(TraceKind::Fallback, tracing() ? c10::toString(op.operator_name()).c_str() : nullptr, nullptr,
                         device, nullptr, tracing() ? describe_arguments(args) : std::string());
  rewrite_generators(op, args, stack, stack->size() - num_args, device);
  const c10::OperatorHandle cpu_op = cpu_equivalent(op, stack);

  const std::vector<SwappedOut> swapped = swap_in_empty_outs(cpu_op.schema(), stack);
  if (zero_copy) {
    run_on_host_memory(cpu_op, stack, *d, c10::Device(c10::DeviceType::PrivateUse1, device));
  } else {
    // Copies through _copy_from; view operators raise instead of returning
    // copies that would silently not alias.
    at::native::cpu_fallback(cpu_op, stack, /*error_on_views=*/true);
  }
  restore_outs(swapped, stack, cpu_op.schema().returns().size());
}

void set_fallback_mode(FallbackMode mode) {
  g_mode.store(static_cast<int32_t>(mode), std::memory_order_relaxed);
}

FallbackMode fallback_mode() {
  return static_cast<FallbackMode>(g_mode.load(std::memory_order_relaxed));
}

std::vector<FallbackCount> fallback_counts() {
  std::vector<FallbackCount> out;
  {
    std::lock_guard<std::mutex> lock(g_records_mutex);
    for (const auto& [schema, r] : records()) {
      const uint64_t n = r->count.load(std::memory_order_relaxed);
      if (n > 0) out.push_back({r->name, n});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const FallbackCount& a, const FallbackCount& b) { return a.op_name < b.op_name; });
  return out;
}

void reset_fallback_counts() {
  std::lock_guard<std::mutex> lock(g_records_mutex);
  for (auto& [schema, r] : records()) {
    r->count.store(0, std::memory_order_relaxed);
    r->warned.store(false, std::memory_order_relaxed);
  }
}

}  // namespace torchfl

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torchfl::fallback_kernel>());
}

// PyTorch's convolution entry points for out-of-tree backends have a
// CompositeExplicitAutograd kernel that only raises, and it would win over
// the boxed fallback above: registered explicitly, they fall back too.
// A plugin serves convolutions through aten::convolution and
// aten::convolution_backward, which PyTorch dispatches before these.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&torchfl::fallback_kernel>());
  m.impl("convolution_backward_overrideable", torch::CppFunction::makeFromBoxedFunction<&torchfl::fallback_kernel>());
}

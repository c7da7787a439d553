// How a plugin kernel reaches the dispatcher.
//
// Rules (notes §3.3):
//  - an operator PyTorch does not know is refused (Library::impl would
//    silently create a dangling registration, pitfall P6), unless a
//    non-aten plugin operator comes with its schema, which defines it;
//  - CompositeImplicitAutograd operators are skipped: a backend kernel
//    would hide the decomposition and with it autograd (P5);
//  - view/alias operators are skipped: a kernel would break storage
//    sharing; PyTorch's metadata implementations (over the shim's
//    as_strided) serve them;
//  - operators the shim implements itself are skipped (copy_'s kernel is
//    kept for on-device copies, see plugin_kernel.h);
//  - the fused attention operators get dedicated kernels (attention.h);
//  - a functional operator with a CompositeExplicitAutogradNonFunctional
//    (structured) kernel and a matching out= overload is registered for the
//    out= overload: PyTorch's C++ meta then computes output shapes, dtypes
//    and the device check, and the functional, in-place and out= forms all
//    reach the plugin kernel;
//  - in-place and out= operators are registered as they are;
//  - other functional operators take the general path (outputs inferred
//    with Meta, memoized).
// Kernel objects are registered once per operator and rebound when the
// operator is registered again, so re-registration never touches the
// dispatch tables of an operator that may be running.
//
// Operators of other libraries (TFL_OP_EXTERNAL, e.g. torchvision::nms) are
// never defined here: the library defines them when it is loaded, possibly
// after the plugin was registered. Until then the kernel waits in a pending
// table; bind_pending() installs it the first time the operator reaches the
// device, which an operator without a PrivateUse1 kernel does through the
// shim's boxed fallback (fallback.cpp). Binding at that point rather than
// from a dispatcher registration listener is deliberate: listeners run
// under the dispatcher's lock (registering from one would deadlock) and as
// soon as the schema is defined, before the library's own kernels (its
// Meta and CPU kernels, which output inference needs) are registered.
#include "dispatch/registration.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/headeronly/version.h>
#include <torch/library.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dispatch/attention.h"
#include "dispatch/builtin_ops.h"
#include "dispatch/meta_kernel.h"
#include "dispatch/plugin_kernel.h"
#include "dispatch/typed_kernels.h"
#include "runtime/shim_error.h"

namespace torchfl {
namespace {

std::mutex g_mutex;

// An external operator's kernel, kept until its library defines it. Owns
// copies of the strings the registration call only lent.
struct PendingKernel {
  std::string op_name;
  std::string schema;
  std::string label;
  TFL_KernelFn kernel = nullptr;
  uint64_t flags = 0;
  const TFL_PluginApi* owner_api = nullptr;
  int32_t foreign = 0;
  TFL_InferOutputsFn infer_outputs = nullptr;
};

// Entries in State::pending, readable without the lock: the fallback path
// checks it on every call.
std::atomic<size_t> g_num_pending{0};

struct State {
  // Leaked on purpose: destroying a Library unregisters its kernels (P7).
  std::unordered_map<std::string, torch::Library*> def_libs;   // by namespace
  std::unordered_map<std::string, torch::Library*> meta_libs;  // by namespace
  // Registered kernel objects by target operator; owned by the dispatcher.
  std::unordered_map<c10::OperatorName, PluginKernel*> kernels;
  // Their registrations; destroying one would unregister its kernel (P7).
  std::deque<c10::RegistrationHandleRAII> handles;
  // Overload names by operator name, for finding out= overloads.
  std::unordered_map<std::string, std::vector<std::string>> overloads;
  bool overloads_indexed = false;
  // External operators whose library has not defined them yet.
  std::unordered_map<c10::OperatorName, PendingKernel> pending;
};

State& state() {
  static auto* s = new State();
  return *s;
}

struct ParsedName {
  std::string ns;
  std::string op;
  std::string overload;
};

ParsedName parse_name(const char* text) {
  std::string s = text;
  ParsedName p;
  const size_t sep = s.find("::");
  if (sep != std::string::npos) {
    p.ns = s.substr(0, sep);
    s = s.substr(sep + 2);
  } else {
    p.ns = "aten";
  }
  const size_t dot = s.find('.');
  p.op = s.substr(0, dot);
  if (dot != std::string::npos) p.overload = s.substr(dot + 1);
  if (p.ns.empty() || p.op.empty() || (dot != std::string::npos && p.overload.empty()) ||
      s.find_first_of(" ()") != std::string::npos) {
    throw ShimError(TFL_SHIM_ERROR_INVALID,
                    c10::str("malformed operator name '", text, "': expected \"[ns::]op[.overload]\""));
  }
  return p;
}

torch::Library& def_library(const std::string& ns) {
  torch::Library*& lib = state().def_libs[ns];
  if (lib == nullptr) {
    lib = new torch::Library(torch::Library::FRAGMENT, ns, std::nullopt, __FILE__, __LINE__);
  }
  return *lib;
}

torch::Library& meta_library(const std::string& ns) {
  torch::Library*& lib = state().meta_libs[ns];
  if (lib == nullptr) {
    lib = new torch::Library(torch::Library::IMPL, ns, c10::DispatchKey::Meta, __FILE__, __LINE__);
  }
  return *lib;
}

// Gives a custom operator the plugin's infer_outputs as its Meta kernel,
// unless it has one (a Python fake, or an earlier plugin's).
void install_meta(const c10::OperatorHandle& op, const ParsedName& parsed, const TFL_ShimKernel& k) {
  if (op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) return;
  std::string why;
  std::optional<torch::CppFunction> meta = make_meta_kernel(
      op, k.infer_outputs, k.owner_api, k.plugin_label != nullptr ? k.plugin_label : "", k.op_name, &why);
  if (!meta.has_value()) {
    throw ShimError(TFL_SHIM_ERROR_INVALID, c10::str("cannot use infer_outputs of '", k.op_name, "': ", why));
  }
  std::string impl_name = parsed.op;
  if (!parsed.overload.empty()) impl_name += "." + parsed.overload;
  meta_library(parsed.ns).impl(impl_name.c_str(), std::move(*meta));
}

// A return that aliases an input without writing it: a view.
bool is_view_op(const c10::FunctionSchema& schema) {
  for (const c10::Argument& r : schema.returns()) {
    const c10::AliasInfo* info = r.alias_info();
    if (info != nullptr && !info->isWrite()) return true;
  }
  return false;
}

const std::vector<std::string>& overloads_of(const std::string& name) {
  State& s = state();
  if (!s.overloads_indexed) {
    for (const c10::OperatorName& n : c10::Dispatcher::singleton().getAllOpNames()) {
      s.overloads[n.name].push_back(n.overload_name);
    }
    s.overloads_indexed = true;
  }
  static const std::vector<std::string> kNone;
  auto it = s.overloads.find(name);
  return it == s.overloads.end() ? kNone : it->second;
}

// Whether `candidate`'s non-out arguments are exactly `functional`'s and
// its out= arguments match the functional's returns.
bool is_out_overload_of(const c10::FunctionSchema& candidate, const c10::FunctionSchema& functional) {
  const auto& args = candidate.arguments();
  const auto& inputs = functional.arguments();
  size_t outs = 0;
  size_t j = 0;
  for (const c10::Argument& a : args) {
    if (a.is_out()) {
      ++outs;
      continue;
    }
    if (j >= inputs.size() || a.name() != inputs[j].name() || *a.type() != *inputs[j].type()) return false;
    ++j;
  }
  return outs != 0 && outs == functional.returns().size() && j == inputs.size();
}

// The out= overload whose non-out arguments are exactly `functional`'s and
// whose out= arguments match its returns.
std::optional<c10::OperatorHandle> find_out_overload(const c10::FunctionSchema& functional) {
  auto& dispatcher = c10::Dispatcher::singleton();
  // ATen names nearly every out= overload "out" or "<overload>_out"
  // (add.out, pow.Tensor_Scalar_out): two lookups instead of indexing all
  // of the dispatcher's ~2,500 operator names, which cost more than
  // registering a 100-operator plugin. The index still decides the rest.
  const std::string& overload = functional.overload_name();
  for (const std::string& guess : {std::string("out"), overload.empty() ? std::string() : overload + "_out"}) {
    if (guess.empty()) continue;
    auto h = dispatcher.findSchema(c10::OperatorName(functional.name(), guess));
    if (h.has_value() && is_out_overload_of(h->schema(), functional)) return h;
  }
  for (const std::string& candidate : overloads_of(functional.name())) {
    auto h = dispatcher.findSchema(c10::OperatorName(functional.name(), candidate));
    if (h.has_value() && is_out_overload_of(h->schema(), functional)) return h;
  }
  return std::nullopt;
}

// Registers a PluginKernel for `target`, or rebinds the one already there.
void install(const c10::OperatorHandle& target, Route route, const KernelBinding* binding, const char* plugin_op) {
  State& s = state();
  const c10::OperatorName& target_name = target.operator_name();
  if (auto it = s.kernels.find(target_name); it != s.kernels.end()) {
    it->second->rebind(binding);
    return;
  }
  std::string why;
  std::unique_ptr<PluginKernel> kernel = PluginKernel::create(target, route, binding, &why);
  if (kernel == nullptr) {
    throw ShimError(TFL_SHIM_ERROR_INVALID, c10::str("cannot register '", plugin_op, "': ", why));
  }
  // Lives as long as the process, like the registration that points at it.
  PluginKernel* raw = kernel.release();
  std::optional<EntryKernel> typed = typed_entry(raw);
  EntryKernel entry = typed.has_value() ? std::move(*typed) : boxed_entry(raw);
  // No inferred schema: typed_entry compared the entry's signature with the
  // operator's schema already, and a boxed entry has none.
  s.handles.push_back(c10::Dispatcher::singleton().registerImpl(
      target_name, c10::DispatchKey::PrivateUse1, std::move(entry.kernel), std::move(entry.signature),
      /*inferred_function_schema=*/nullptr, std::string("torch-fl: plugin kernel '") + plugin_op + "'"));
  s.kernels.emplace(target_name, raw);
}

// Refuses to bind a kernel written for another schema than the one the
// owning library defined: the kernel would misread its arguments.
void check_external_schema(const c10::OperatorHandle& op, const ParsedName& parsed, const TFL_ShimKernel& k,
                           const char* schema_text) {
  if (schema_text == nullptr) return;
  c10::FunctionSchema expected = [&] {
    try {
      return torch::jit::parseSchema(parsed.ns + "::" + schema_text);
    } catch (const std::exception& e) {
      throw ShimError(TFL_SHIM_ERROR_INVALID,
                      c10::str("the schema of external operator '", k.op_name, "' does not parse: ", e.what()));
    }
  }();
  if (auto diff = c10::findSchemaDifferences(expected, op.schema())) {
    throw ShimError(TFL_SHIM_ERROR_INVALID,
                    c10::str("the kernel for '", k.op_name, "' of ", k.plugin_label != nullptr ? k.plugin_label : "",
                             " was written for the schema '", schema_text, "', but the loaded library defines '",
                             op.schema(), "' (", *diff,
                             "); it is not bound and the operator runs through the CPU fallback. Update the plugin "
                             "for this version of the library"));
  }
}

PendingKernel make_pending(const TFL_ShimKernel& k, const char* schema_text, TFL_InferOutputsFn infer) {
  PendingKernel p;
  p.op_name = k.op_name;
  p.schema = schema_text != nullptr ? schema_text : "";
  p.label = k.plugin_label != nullptr ? k.plugin_label : "";
  p.kernel = k.kernel;
  p.flags = k.flags;
  p.owner_api = k.owner_api;
  p.foreign = k.foreign;
  p.infer_outputs = infer;
  return p;
}

TFL_ShimRegistration register_locked(const TFL_ShimKernel& k);

}  // namespace

bool has_pending_kernels() {
  return g_num_pending.load(std::memory_order_acquire) != 0;
}

PluginKernel* bind_pending(const c10::OperatorHandle& op) {
  if (!has_pending_kernels()) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = state();
  auto it = s.pending.find(op.operator_name());
  if (it == s.pending.end()) return nullptr;
  const PendingKernel p = std::move(it->second);
  s.pending.erase(it);
  g_num_pending.fetch_sub(1, std::memory_order_release);
  TFL_ShimKernel k{};
  k.struct_size = TFL_STRUCT_SIZE(TFL_ShimKernel, infer_outputs);
  k.op_name = p.op_name.c_str();
  k.kernel = p.kernel;
  k.flags = p.flags;
  k.owner_api = p.owner_api;
  k.plugin_label = p.label.c_str();
  k.foreign = p.foreign;
  k.schema = p.schema.empty() ? nullptr : p.schema.c_str();
  k.infer_outputs = p.infer_outputs;
  try {
    const TFL_ShimRegistration outcome = register_locked(k);
    if (outcome != TFL_SHIM_REGISTERED && outcome != TFL_SHIM_REGISTERED_AS_OUT) return nullptr;
  } catch (const std::exception& e) {
    TORCH_WARN("torch-fl: ", e.what());
    return nullptr;
  }
  auto kernel = s.kernels.find(op.operator_name());
  return kernel == s.kernels.end() ? nullptr : kernel->second;
}

TFL_ShimRegistration register_kernel(const TFL_ShimKernel& k) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return register_locked(k);
}

namespace {

TFL_ShimRegistration register_locked(const TFL_ShimKernel& k) {
  if (k.struct_size < TFL_STRUCT_SIZE(TFL_ShimKernel, foreign) || k.op_name == nullptr || k.kernel == nullptr ||
      k.owner_api == nullptr) {
    throw ShimError(TFL_SHIM_ERROR_INVALID,
                    "TFL_ShimInterface.register_kernel: struct_size, op_name, kernel "
                    "and owner_api are required");
  }
  const char* schema_text = TFL_HAS_FIELD(TFL_ShimKernel, schema, k.struct_size) ? k.schema : nullptr;
  const TFL_InferOutputsFn infer =
      TFL_HAS_FIELD(TFL_ShimKernel, infer_outputs, k.struct_size) ? k.infer_outputs : nullptr;
  const ParsedName parsed = parse_name(k.op_name);
  const c10::OperatorName name(parsed.ns + "::" + parsed.op, parsed.overload);
  const bool external = (k.flags & TFL_OP_EXTERNAL) != 0;
  if (external && parsed.ns == "aten") {
    throw ShimError(TFL_SHIM_ERROR_INVALID, c10::str("'", k.op_name,
                                                     "' is flagged TFL_OP_EXTERNAL, but aten operators belong to "
                                                     "PyTorch; only another library's operators can be external"));
  }

  auto& dispatcher = c10::Dispatcher::singleton();
  std::optional<c10::OperatorHandle> handle = dispatcher.findSchema(name);
  if (external) {
    if (!handle.has_value()) {
      // Not loaded yet: bound when the operator first reaches the device.
      State& s = state();
      const bool added = !s.pending.contains(name);
      s.pending.insert_or_assign(name, make_pending(k, schema_text, infer));
      if (added) g_num_pending.fetch_add(1, std::memory_order_release);
      return TFL_SHIM_DEFERRED;
    }
    check_external_schema(*handle, parsed, k, schema_text);
  } else if (!handle.has_value() && schema_text != nullptr && parsed.ns != "aten") {
    def_library(parsed.ns).def(schema_text);
    handle = dispatcher.findSchema(name);
  }
  if (!handle.has_value()) {
    throw ShimError(TFL_SHIM_ERROR_UNKNOWN_OP, c10::str("PyTorch ", TORCH_VERSION, " has no operator '", k.op_name, "'",
                                                        parsed.ns == "aten" ? "" : " and no schema was given"));
  }
  if (infer != nullptr && parsed.ns != "aten") install_meta(*handle, parsed, k);
  const c10::FunctionSchema& schema = handle->schema();
  if (handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    return TFL_SHIM_SKIPPED_COMPOSITE_IMPLICIT;
  }
  if (is_view_op(schema)) return TFL_SHIM_SKIPPED_VIEW;

  auto* binding = new KernelBinding();  // leaked: see KernelBinding
  binding->fn = k.kernel;
  binding->flags = k.flags;
  binding->op_name = k.op_name;
  binding->label = k.plugin_label != nullptr ? k.plugin_label : "";
  binding->owner_api = k.owner_api;
  binding->foreign = k.foreign != 0;

  // Fused attention returns SymInts, which the generic kernel cannot.
  if (bind_attention_kernel(name, binding)) return TFL_SHIM_REGISTERED;
  static const c10::OperatorName kCopy("aten::copy_", "");
  if (name == kCopy) {
    set_copy_kernel(binding);
    return TFL_SHIM_SKIPPED_BUILTIN;
  }
  if (is_builtin_op(name)) {
    delete binding;
    return TFL_SHIM_SKIPPED_BUILTIN;
  }

  bool has_out = false;
  bool has_write = false;
  for (const c10::Argument& a : schema.arguments()) {
    has_out = has_out || a.is_out();
    has_write = has_write || (a.alias_info() && a.alias_info()->isWrite());
  }
  Route route = Route::Functional;
  TFL_ShimRegistration outcome = TFL_SHIM_REGISTERED;
  c10::OperatorHandle target = *handle;
  if (has_out) {
    route = Route::Out;
  } else if (has_write) {
    route = Route::InPlace;
  } else if (handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
    if (auto out = find_out_overload(schema)) {
      route = Route::Out;
      target = *out;
      outcome = TFL_SHIM_REGISTERED_AS_OUT;
    }
  }

  install(target, route, binding, k.op_name);
  if (outcome == TFL_SHIM_REGISTERED_AS_OUT) {
    // The functional form also gets the kernel directly (outputs from the
    // memoized meta inference): that skips the structured wrapper's
    // TensorIterator build and its second trip through the dispatcher,
    // about 0.5 us of a 4-element add (cpp_shim/README.md, "Hot path").
    // The out= registration above still serves the in-place and out= forms.
    install(*handle, Route::Functional, binding, k.op_name);
  }
  return outcome;
}

}  // namespace
}  // namespace torchfl

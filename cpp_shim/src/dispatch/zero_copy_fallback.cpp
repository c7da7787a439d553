#include "dispatch/zero_copy_fallback.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/_copy_from.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <vector>

#include "memory/storage_resize.h"

namespace torchfl {
namespace {

void release_storage_ref(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

// The device storages of one call and their CPU twins over the same bytes.
class HostAliases {
 public:
  // A CPU tensor viewing the same memory as device tensor `t`.
  at::Tensor cpu_alias(const at::Tensor& t) {
    c10::StorageImpl* dev = t.storage().unsafeGetStorageImpl();
    c10::Storage* cpu = nullptr;
    for (auto& [d, c] : storages_) {
      if (d == dev) cpu = &c;  // views of one storage share one twin
    }
    if (cpu == nullptr) {
      // The twin's DataPtr holds a reference to the device storage, so the
      // device memory outlives every CPU tensor over it. Resizable with the
      // CPU allocator: a CPU kernel that must grow an out= argument moves
      // it to host memory, which the caller detects and copies back.
      c10::raw::intrusive_ptr::incref(dev);
      c10::DataPtr data(const_cast<void*>(dev->data()), dev, &release_storage_ref, c10::Device(c10::kCPU));
      storages_.emplace_back(
          dev, c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), dev->nbytes(),
                                                                  std::move(data), c10::GetCPUAllocator(),
                                                                  /*resizable=*/true)));
      cpu = &storages_.back().second;
    }
    at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(*cpu),
                                                                c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    return alias;
  }

  // The device storage whose memory `t` still views through a twin, or
  // nullptr. A twin a CPU kernel grew has moved to host memory and no
  // longer counts.
  c10::StorageImpl* device_storage_of(const at::Tensor& t) const {
    if (!t.has_storage()) return nullptr;
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    for (const auto& [d, c] : storages_) {
      if (c.unsafeGetStorageImpl() == s) {
        return s->data() == d->data() ? d : nullptr;
      }
    }
    return nullptr;
  }

 private:
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> storages_;
};

// A device tensor over `storage` with the metadata of CPU view `view`.
at::Tensor device_view(c10::StorageImpl* storage, const at::Tensor& view) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage)),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), view.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(view.sizes(), view.strides(), view.storage_offset());
  return t;
}

bool on_device(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// Waits for the devices of the call's tensor arguments (from `base` on the
// stack), each once: queued kernels may still be writing these tensors.
void synchronize_argument_devices(const torch::jit::Stack& stack, size_t base) {
  uint64_t synced = 0;
  auto sync = [&](const at::Tensor& t) {
    if (!on_device(t)) return;
    const c10::DeviceIndex i = t.device().index();
    if (synced & (uint64_t{1} << i)) return;
    synced |= uint64_t{1} << i;
    device_synchronize(i);
  };
  for (size_t i = base; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) sync(v.toTensor());
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) sync(t);
    }
    if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        if (t.has_value()) sync(*t);
      }
    }
  }
}

// Replaces the device tensors among the `num_args` arguments at `base` with
// CPU twins over the same memory, and device arguments with the CPU.
// Returns the twin of each plain tensor argument (undefined for others).
std::vector<at::Tensor> swap_in_host_aliases(torch::jit::Stack* stack, size_t base, size_t num_args,
                                             HostAliases& aliases) {
  std::vector<at::Tensor> twins(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (v.isTensor() && on_device(v.toTensor())) {
      twins[i] = aliases.cpu_alias(v.toTensor());
      v = twins[i];
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) {
        list.push_back(on_device(t) ? aliases.cpu_alias(t) : t);
      }
      v = list;
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        list.push_back(t.has_value() && on_device(*t) ? std::optional<at::Tensor>(aliases.cpu_alias(*t)) : t);
      }
      v = list;
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      v = c10::Device(c10::kCPU);
    }
  }
  return twins;
}

// Mutated tensor arguments whose CPU twin changed shape (out= resized by
// the kernel): carries the change over to the device tensor in `originals`.
void carry_back_resizes(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& originals,
                        const std::vector<at::Tensor>& twins, const HostAliases& aliases) {
  for (size_t i = 0; i < twins.size(); ++i) {
    const c10::AliasInfo* info = schema.arguments()[i].alias_info();
    if (info == nullptr || !info->isWrite() || !twins[i].defined()) continue;
    const at::Tensor& dev = originals[i].toTensor();
    const at::Tensor& cpu = twins[i];
    if (aliases.device_storage_of(cpu) != nullptr) {
      // Still over device memory (grown storages move to the host).
      if (!cpu.sizes().equals(dev.sizes()) || !cpu.strides().equals(dev.strides()) ||
          cpu.storage_offset() != dev.storage_offset()) {
        dev.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
      }
    } else {
      // The kernel grew it, which moved it to host memory: give the device
      // tensor the same metadata (growing its storage through the plugin)
      // and copy the result back.
      dev.unsafeGetTensorImpl()->set_sizes_and_strides(cpu.sizes(), cpu.strides(), cpu.storage_offset());
      ensure_storage_fits(dev);
      at::_copy_from(cpu, dev, /*non_blocking=*/false);
    }
  }
}

// Rewrites the CPU kernel's returns on top of the stack: mutated arguments
// come back as the device tensors they are (from `originals`), views as
// device tensors over the same storage, new tensors are copied to `target`.
void returns_to_device(const c10::FunctionSchema& schema, torch::jit::Stack* stack,
                       const std::vector<c10::IValue>& originals, const HostAliases& aliases, c10::Device target) {
  const size_t num_args = originals.size();
  const size_t num_returns = schema.returns().size();
  const size_t rbase = stack->size() - num_returns;
  auto to_device = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != c10::DeviceType::CPU) return t;
    if (c10::StorageImpl* s = aliases.device_storage_of(t)) {
      return device_view(s, t);
    }
    return t.to(target);
  };
  for (size_t j = 0; j < num_returns; ++j) {
    c10::IValue& r = (*stack)[rbase + j];
    const c10::AliasInfo* info = schema.returns()[j].alias_info();
    if (info != nullptr && info->isWrite()) {
      for (size_t i = 0; i < num_args; ++i) {
        const c10::AliasInfo* a = schema.arguments()[i].alias_info();
        if (a != nullptr && a->isWrite() && a->beforeSets() == info->beforeSets()) {
          r = originals[i];
          break;
        }
      }
      continue;
    }
    if (r.isTensor()) {
      r = to_device(r.toTensor());
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : r.toTensorList()) list.push_back(to_device(t));
      r = list;
    }
  }
}

}  // namespace

void run_on_host_memory(const c10::OperatorHandle& op, torch::jit::Stack* stack, const AttachedDevice& d,
                        c10::Device target) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t base = stack->size() - num_args;
  if (d.async_streams()) synchronize_argument_devices(*stack, base);

  // Swap device tensors for CPU twins; keep the originals for the returns.
  HostAliases aliases;
  std::vector<c10::IValue> originals(stack->begin() + base, stack->end());
  const std::vector<at::Tensor> twins = swap_in_host_aliases(stack, base, num_args, aliases);

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  carry_back_resizes(schema, originals, twins, aliases);
  returns_to_device(schema, stack, originals, aliases, target);
}

}  // namespace torchfl

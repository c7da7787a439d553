// at::PrivateUse1HooksInterface: what PyTorch's device-generic code asks
// the PrivateUse1 backend (availability, current device, generators, pinned
// memory, storage resizing).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/util/Exception.h>

#include "memory/host_allocator.h"
#include "memory/storage_resize.h"
#include "runtime/fork.h"
#include "runtime/generator.h"
#include "runtime/runtime.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }

  // Must not throw.
  bool isAvailable() const override {
    const AttachedDevice* d = attached_device();
    return d != nullptr && d->device_count > 0;
  }

  // The Rust core initializes the plugin before attaching it, so an
  // attached device is fully initialized; a forked child has no context.
  bool hasPrimaryContext(c10::DeviceIndex device) const override {
    const AttachedDevice* d = attached_device();
    return d != nullptr && !in_bad_fork() && device >= 0 && device < d->device_count;
  }

  void init() const override {}

  // The real count (0 before attach). Only the device guard reports a
  // provisional count before attach, for the autograd engine's sake.
  c10::DeviceIndex deviceCount() const override {
    const AttachedDevice* d = attached_device();
    return d != nullptr ? static_cast<c10::DeviceIndex>(d->device_count) : 0;
  }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_device_index(device);
    set_current_device(device);
  }

  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::DeviceIndex previous = current_device();
    if (device >= 0 && device != previous) {
      check_device_index(device);
      set_current_device(device);
    }
    return previous;
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override { return default_generator(device); }

  at::Generator getNewGenerator(c10::DeviceIndex device) const override { return make_generator(device); }

  // Device pointers are opaque to the shim and the ABI has no "which device
  // owns this pointer" entry, so the answer is the current device: right for
  // the usual at::from_blob on memory just allocated under a device guard.
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current_device());
  }

  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }

  at::Allocator* getPinnedMemoryAllocator() const override { return host_allocator(); }

  // UntypedStorage.resize_() on a device storage.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
};

[[maybe_unused]] const bool g_hooks_registered = [] {
  // Leaked on purpose: PyTorch keeps the pointer for the process lifetime.
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  return true;
}();

}  // namespace
}  // namespace torchfl

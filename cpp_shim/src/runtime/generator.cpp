#include "runtime/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

#include "runtime/fork.h"
#include "runtime/runtime.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

constexpr size_t kStateBytes = 2 * sizeof(uint64_t);  // seed, offset

std::array<std::atomic<at::Generator*>, kMaxDevices> g_defaults{};
std::mutex g_defaults_mutex;

}  // namespace

Generator::Generator(c10::DeviceIndex device)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(c10::default_rng_seed_val) {}

// PyTorch takes `mutex_` around the public seed/state methods (e.g.
// torch.Generator.manual_seed); `claim` takes it itself.
void Generator::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t Generator::current_seed() const {
  return seed_;
}

uint64_t Generator::seed() {
  const uint64_t s = c10::detail::getNonDeterministicRandom(true);
  set_current_seed(s);
  return s;
}

void Generator::set_offset(uint64_t offset) {
  offset_ = offset;
}

uint64_t Generator::get_offset() const {
  return offset_;
}

c10::intrusive_ptr<c10::TensorImpl> Generator::get_state() const {
  at::Tensor state = at::empty({static_cast<int64_t>(kStateBytes)}, at::TensorOptions().dtype(at::kByte));
  const uint64_t words[2] = {seed_, offset_};
  std::memcpy(state.mutable_data_ptr(), words, kStateBytes);
  return state.getIntrusivePtr();
}

void Generator::set_state(const c10::TensorImpl& new_state) {
  at::detail::check_rng_state(new_state);
  TORCH_CHECK(new_state.numel() == static_cast<int64_t>(kStateBytes), "RNG state for a ", device_type_name(),
              " generator must be ", kStateBytes, " bytes (seed, offset), got ", new_state.numel());
  uint64_t words[2];
  std::memcpy(words, new_state.data(), kStateBytes);
  seed_ = words[0];
  offset_ = words[1];
}

std::pair<uint64_t, uint64_t> Generator::claim(uint64_t increment) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::pair<uint64_t, uint64_t> state{seed_, offset_};
  offset_ += increment;
  return state;
}

Generator* Generator::clone_impl() const {
  auto* g = new Generator(device().index());
  g->seed_ = seed_;
  g->offset_ = offset_;
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  // A generator serves random kernels, which a bad fork cannot run;
  // torch.manual_seed skips the device there (torch.<name>._is_in_bad_fork).
  check_not_forked("use a generator");
  if (device == -1) device = current_device();
  const AttachedDevice* d = attached_device();
  const int limit = d != nullptr ? d->device_count : kProvisionalDeviceCount;
  TORCH_CHECK(device >= 0 && device < limit, "Invalid device index ", static_cast<int>(device), " for a ",
              device_type_name(), " generator (", limit, " device(s))");
  at::Generator* g = g_defaults[device].load(std::memory_order_acquire);
  if (g == nullptr) {
    std::lock_guard<std::mutex> lock(g_defaults_mutex);
    g = g_defaults[device].load(std::memory_order_relaxed);
    if (g == nullptr) {
      // Leaked: PyTorch holds references to default generators forever.
      g = new at::Generator(at::make_generator<Generator>(device));
      g_defaults[device].store(g, std::memory_order_release);
    }
  }
  return *g;
}

at::Generator make_generator(c10::DeviceIndex device) {
  check_not_forked("create a generator");
  if (device == -1) device = current_device();
  return at::make_generator<Generator>(device);
}

Generator* resolve_generator(const std::optional<at::Generator>& gen, c10::DeviceIndex device) {
  if (gen.has_value() && gen->defined()) {
    TORCH_CHECK(gen->device().type() == c10::DeviceType::PrivateUse1, "Expected a '", device_type_name(),
                "' device type for generator but found '", gen->device().type(), "'");
    return at::check_generator<Generator>(gen);
  }
  return at::check_generator<Generator>(default_generator(device));
}

}  // namespace torchfl

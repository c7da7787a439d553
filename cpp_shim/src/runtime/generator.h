// The PrivateUse1 random generator: a counter-based (Philox-style) key and
// counter per device, which is exactly what the ABI hands to kernels flagged
// TFL_OP_RANDOM (TFL_CallFrame.rng_seed / rng_offset). manual_seed sets the
// key and rewinds the counter, so seeded runs are reproducible.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <cstdint>
#include <optional>

namespace torchfl {

class Generator final : public c10::GeneratorImpl {
 public:
  explicit Generator(c10::DeviceIndex device);

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  void set_state(const c10::TensorImpl& new_state) override;

  // Returns the current (seed, offset) and advances the offset by
  // `increment`, atomically with respect to other users of the generator.
  std::pair<uint64_t, uint64_t> claim(uint64_t increment);

 private:
  Generator* clone_impl() const override;

  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The default generator of `device` (-1: the current device). Valid before
// attach for indices below the provisional device count.
const at::Generator& default_generator(c10::DeviceIndex device);

at::Generator make_generator(c10::DeviceIndex device);

// The generator a random op uses: `gen` if given (checked to be ours),
// else the default generator of `device`.
Generator* resolve_generator(const std::optional<at::Generator>& gen, c10::DeviceIndex device);

}  // namespace torchfl

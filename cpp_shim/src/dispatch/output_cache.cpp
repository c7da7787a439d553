#include "dispatch/output_cache.h"

namespace torchfl {

size_t OutputCache::Hash::operator()(c10::ArrayRef<int64_t> k) const noexcept {
  // Multiply-xorshift: a few cycles per word; keys are short.
  uint64_t h = 0x9e3779b97f4a7c15ull ^ k.size();
  for (int64_t x : k) {
    h = (h ^ static_cast<uint64_t>(x)) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return static_cast<size_t>(h);
}

namespace {
// A small per-thread, direct-mapped front for all caches: a hit costs no
// lock and no shared atomic. Entries never go stale - a signature's outputs
// never change - so nothing needs invalidating when a cache is cleared.
struct FrontSlot {
  const OutputCache* owner = nullptr;
  size_t hash = 0;
  std::vector<int64_t> key;
  std::shared_ptr<const InferredOutputs> value;
};
constexpr size_t kFrontSlots = 64;
thread_local FrontSlot t_front[kFrontSlots];
}  // namespace

std::shared_ptr<const InferredOutputs> OutputCache::find(c10::ArrayRef<int64_t> key) const {
  const size_t hash = Hash{}(key);
  FrontSlot& slot = t_front[(hash ^ (reinterpret_cast<uintptr_t>(this) >> 6)) % kFrontSlots];
  if (slot.owner == this && slot.hash == hash && c10::ArrayRef<int64_t>(slot.key).equals(key)) {
    return slot.value;
  }
  std::shared_ptr<const InferredOutputs> value;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    value = it->second;
  }
  slot.owner = this;
  slot.hash = hash;
  slot.key.assign(key.begin(), key.end());
  slot.value = value;
  return value;
}

void OutputCache::insert(c10::ArrayRef<int64_t> key, std::shared_ptr<const InferredOutputs> value) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (map_.size() >= kMaxEntries) map_.clear();  // rare: many layouts
  map_.insert_or_assign(key.vec(), std::move(value));
}

}  // namespace torchfl

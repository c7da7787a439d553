#include "memory/host_allocator.h"

#include <c10/util/Exception.h>
#include <c10/util/llvmMathExtras.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/fork.h"
#include "runtime/runtime.h"
#include "runtime/status.h"
#include "runtime/streams.h"

namespace torchfl {
namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kAlignment = 64;

struct Block {
  size_t size = 0;
  bool allocated = false;
  // From the plugin's host_allocate (ABI 1.4), else from aligned_alloc.
  bool from_plugin = false;
  // Events recorded on streams whose queued copies use this block.
  std::vector<TFL_Event*> events;
};

void host_free(void* ctx);

class HostAllocatorImpl final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    // Pinned memory is for copies to the device, which a bad fork cannot
    // make (and reusing a cached block would query the plugin's events).
    check_not_forked("allocate pinned memory");
    // Power-of-two size classes make cached blocks reusable across requests
    // of similar size (as CUDA's host allocator does).
    const size_t size = std::max(kMinBlock, static_cast<size_t>(c10::llvm::PowerOf2Ceil(std::max<size_t>(nbytes, 1))));
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending_locked();
    void* ptr = nullptr;
    bool from_plugin = false;
    auto cached = free_.find(size);
    if (cached != free_.end() && !cached->second.empty()) {
      ptr = cached->second.back();
      cached->second.pop_back();
      from_plugin = blocks_.at(reinterpret_cast<uintptr_t>(ptr)).from_plugin;
    } else {
      from_plugin = allocate_block(size, &ptr);
      stats_.allocations.increase(1);
      stats_.allocated_bytes.increase(static_cast<int64_t>(size));
      stats_.num_host_alloc += 1;
    }
    Block& b = blocks_[reinterpret_cast<uintptr_t>(ptr)];
    b.size = size;
    b.from_plugin = from_plugin;
    b.allocated = true;
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(static_cast<int64_t>(size));
    // ctx == ptr, so raw_allocate/raw_deleter work too.
    return {ptr, ptr, &host_free, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &host_free; }

  void copy_data(void* dest, const void* src, size_t count) const override { std::memcpy(dest, src, count); }

  void free(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
    TORCH_INTERNAL_ASSERT(it != blocks_.end() && it->second.allocated);
    Block& b = it->second;
    b.allocated = false;
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(static_cast<int64_t>(b.size));
    if (b.events.empty()) {
      free_[b.size].push_back(ptr);
    } else {
      pending_.push_back(ptr);  // reusable once its copies have run
    }
  }

  bool record_event(void* /*ptr*/, void* ctx, c10::Stream stream) override {
    const AttachedDevice& d = runtime("record pinned memory use");
    TFL_Event* event = nullptr;
    TFL_CHECK_STATUS(d.ref(), "event_create", d.api->event_create(stream.device_index(), TFL_EVENT_DEFAULT, &event));
    TFL_Error* error = d.api->event_record(event, plugin_stream(stream));
    if (error != nullptr) {
      destroy_event(d, event);
      TFL_CHECK_STATUS(d.ref(), "event_record", error);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(reinterpret_cast<uintptr_t>(ctx));
    if (it == blocks_.end() || !it->second.allocated) {
      destroy_event(d, event);
      return false;
    }
    prune_events_locked(d, it->second);
    it->second.events.push_back(event);
    return true;
  }

  void empty_cache() override {
    check_not_forked("empty the pinned memory cache");
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending_locked();
    for (auto& [size, ptrs] : free_) {
      for (void* p : ptrs) {
        auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
        release_block(p, it->second.from_plugin);
        blocks_.erase(it);
        stats_.allocations.decrease(1);
        stats_.allocated_bytes.decrease(static_cast<int64_t>(size));
        stats_.num_host_free += 1;
      }
    }
    free_.clear();
  }

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.active_requests.reset_accumulated();
    stats_.active_bytes.reset_accumulated();
    stats_.allocations.reset_accumulated();
    stats_.allocated_bytes.reset_accumulated();
    stats_.num_host_alloc = 0;
    stats_.num_host_free = 0;
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.active_requests.reset_peak();
    stats_.active_bytes.reset_peak();
    stats_.allocations.reset_peak();
    stats_.allocated_bytes.reset_peak();
  }

  bool contains(const void* ptr) {
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return false;
    --it;
    return it->second.allocated && p < it->first + it->second.size;
  }

 private:
  // Gets a block from the plugin's page-locked memory when it offers some
  // (the device copies from it faster, and may copy asynchronously), else
  // from ordinary host memory. Returns whether the plugin's memory was used.
  static bool allocate_block(size_t size, void** out) {
    const AttachedDevice* d = attached_device();
    if (d != nullptr && d->host_allocate != nullptr) {
      *out = nullptr;
      TFL_CHECK_STATUS(d->ref(), "host_allocate", d->host_allocate(size, out));
      TORCH_CHECK(*out != nullptr, "torch-fl: plugin ", d->plugin_label,
                  " returned NULL from host_allocate without an error: report this to the plugin's vendor");
      return true;
    }
    *out = std::aligned_alloc(kAlignment, size);
    TORCH_CHECK_WITH(OutOfMemoryError, *out != nullptr, "torch-fl: cannot allocate ", size,
                     " bytes of pinned host memory");
    return false;
  }

  // Called only for blocks without pending copies (see process_pending_locked),
  // as host_deallocate is not stream-ordered.
  static void release_block(void* p, bool from_plugin) {
    if (!from_plugin) {
      std::free(p);
      return;
    }
    const AttachedDevice* d = attached_device();
    // A plugin-backed block exists only once a plugin is attached, and the
    // attachment is never undone.
    TORCH_INTERNAL_ASSERT(d != nullptr && d->host_deallocate != nullptr);
    if (TFL_Error* e = d->host_deallocate(p)) d->api->error_destroy(e);
  }

  static void destroy_event(const AttachedDevice& d, TFL_Event* event) {
    if (TFL_Error* e = d.api->event_destroy(event)) d.api->error_destroy(e);
  }

  // Drops the events of `b` whose work has completed.
  static void prune_events_locked(const AttachedDevice& d, Block& b) {
    size_t kept = 0;
    for (TFL_Event* e : b.events) {
      uint8_t complete = 0;
      TFL_Error* error = d.api->event_query(e, &complete);
      if (error != nullptr) {
        // A failed copy surfaces at the next synchronization of its stream;
        // the block itself is free to go.
        d.api->error_destroy(error);
        complete = 1;
      }
      if (complete) {
        destroy_event(d, e);
      } else {
        b.events[kept++] = e;
      }
    }
    b.events.resize(kept);
  }

  void process_pending_locked() {
    if (pending_.empty()) return;
    const AttachedDevice* d = attached_device();
    if (d == nullptr) return;
    size_t kept = 0;
    for (void* p : pending_) {
      Block& b = blocks_.at(reinterpret_cast<uintptr_t>(p));
      prune_events_locked(*d, b);
      if (b.events.empty()) {
        free_[b.size].push_back(p);
      } else {
        pending_[kept++] = p;
      }
    }
    pending_.resize(kept);
  }

  std::mutex mutex_;
  std::map<uintptr_t, Block> blocks_;          // by base address: interior lookup
  std::map<size_t, std::vector<void*>> free_;  // cached, by size class
  std::vector<void*> pending_;                 // freed, waiting for their copies
  at::HostStats stats_;
};

// Immortal: pinned blocks may be freed by tensors that die during static
// destruction, after a plain static would already be gone.
HostAllocatorImpl& instance() {
  static auto* impl = new HostAllocatorImpl();
  return *impl;
}

void host_free(void* ctx) {
  // In a bad fork the block is leaked: the allocator's lock may have been
  // held by a parent thread at fork time.
  if (in_bad_fork()) return;
  instance().free(ctx);
}

}  // namespace

at::HostAllocator* host_allocator() {
  return &instance();
}

bool is_pinned_ptr(const void* ptr) {
  // A forked child inherits no page locks (mlock(2)), and the allocator's
  // lock may have been held by a parent thread at fork time.
  return ptr != nullptr && !in_bad_fork() && instance().contains(ptr);
}

bool is_pinned_data(const c10::DataPtr& data_ptr) {
  return data_ptr.get_deleter() == &host_free;
}

bool record_host_use(const c10::DataPtr& data_ptr, c10::Stream stream) {
  if (data_ptr.get_deleter() != &host_free) return false;
  return instance().record_event(data_ptr.get(), data_ptr.get_context(), stream);
}

}  // namespace torchfl

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, torchfl::host_allocator())

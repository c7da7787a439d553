#include "memory/caching_allocator.h"

#include <c10/core/AllocatorConfig.h>
#include <c10/util/Exception.h>
#include <c10/util/llvmMathExtras.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "memory/device_allocator.h"
#include "observe/layer_profile.h"
#include "runtime/fork.h"
#include "runtime/runtime.h"
#include "runtime/status.h"
#include "runtime/streams.h"

namespace torchfl::caching {
namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;
using Config = c10::CachingAllocator::AcceleratorAllocatorConfig;

// CUDACachingAllocator's size classes: they balance fragmentation against
// the number of (expensive) device allocations, and users' tuning of
// PYTORCH_ALLOC_CONF assumes them.
constexpr size_t kMinBlockSize = 512;      // every size rounds to a multiple
constexpr size_t kSmallSize = 1 << 20;     // largest request of the small pool
constexpr size_t kSmallBuffer = 2 << 20;   // segment size of the small pool
constexpr size_t kLargeBuffer = 20 << 20;  // segment for requests under kMinLargeAlloc
constexpr size_t kMinLargeAlloc = 10 << 20;
constexpr size_t kRoundLarge = 2 << 20;  // larger segments round to this

struct Block;

// Free blocks ordered for best fit on the caller's stream.
struct ByStream {
  bool operator()(const Block* a, const Block* b) const;
};

struct Pool {
  explicit Pool(bool small, PoolId id = {0, 0}) : small(small), id(id) {}
  bool small;
  PoolId id;  // (0, 0): the default pool
  std::set<Block*, ByStream> free;
};

// A private pool: a small and a large pool of its own. Lives while it has
// uses or segments (the Pools its blocks point to must outlive them).
struct PrivatePool {
  explicit PrivatePool(PoolId id) : small(true, id), large(false, id) {}
  Pool small;
  Pool large;
  int use_count = 1;
};

// Allocations that go to a private pool: a thread's
// (begin_allocate_to_pool), or those on the streams a filter accepts
// (begin_allocate_streams_to_pool).
struct Route {
  PoolId id;
  std::thread::id thread;
  StreamFilter streams;  // set: routes by stream, any thread
};

struct Block {
  c10::DeviceIndex device = 0;
  c10::StreamId stream = 0;  // the stream it was allocated on
  size_t size = 0;
  size_t requested = 0;  // what the tensor asked for (before rounding)
  char* ptr = nullptr;
  Pool* pool = nullptr;
  bool allocated = false;
  int pending_events = 0;  // freed, waiting for other streams' uses
  Block* prev = nullptr;   // neighbours in the segment
  Block* next = nullptr;
  std::vector<c10::StreamId> uses;  // other streams (record_stream)

  bool is_free() const { return !allocated && pending_events == 0; }
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

bool ByStream::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

size_t pool_index(const Pool& pool) {
  return static_cast<size_t>(pool.small ? StatType::SMALL_POOL : StatType::LARGE_POOL);
}

void increase(StatArray& stat, const Pool& pool, size_t amount) {
  stat[static_cast<size_t>(StatType::AGGREGATE)].increase(amount);
  stat[pool_index(pool)].increase(amount);
}

void decrease(StatArray& stat, const Pool& pool, size_t amount) {
  stat[static_cast<size_t>(StatType::AGGREGATE)].decrease(amount);
  stat[pool_index(pool)].decrease(amount);
}

// A request's size after rounding (see the size classes above).
size_t round_size(size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  const size_t divisions = Config::roundup_power2_divisions(nbytes);
  if (divisions > 1 && nbytes > kMinBlockSize * divisions && !c10::llvm::isPowerOf2_64(nbytes)) {
    // `divisions` equal steps between the two powers of two around nbytes.
    const size_t floor = c10::llvm::PowerOf2Floor(nbytes);
    const size_t step = floor / c10::llvm::PowerOf2Floor(divisions);
    if (step == 0) return floor << 1;
    return (nbytes + step - 1) / step * step;
  }
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

// The segment to ask the plugin for when no cached block fits.
size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

c10::Stream stream_of(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

void free_block_context(void* ctx);

// One device's cache. Every member runs under mutex_; plugin calls made
// under it (allocate, deallocate, events) never call back into the host.
class DeviceCache {
 public:
  Block* malloc(c10::DeviceIndex device, size_t nbytes, c10::Stream stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    process_events();
    const size_t size = round_size(nbytes);
    Pool& pool = pool_for(size, stream.id());
    Block* block = take_free(pool, stream.id(), size);
    if (block == nullptr) {
      collect_garbage(device);
      block = new_segment(device, pool, stream.id(), size);
    }
    if (block == nullptr) block = take_from_other_stream(pool, stream, size);
    if (block == nullptr) {
      // As CUDA does before reporting out-of-memory: give every cached
      // segment back and retry once.
      stats_.num_alloc_retries += 1;
      wait_for_pending_frees();
      release_cached(device);
      block = new_segment(device, pool, stream.id(), size);
    }
    if (block == nullptr && segment_size(size) > size) {
      // A device too small for the pool's segment size still serves the
      // request itself.
      block = new_segment(device, pool, stream.id(), size, size);
    }
    if (block == nullptr) {
      stats_.num_ooms += 1;
      report_oom(device, nbytes);
    }
    if (should_split(*block, size)) split(block, size);
    block->allocated = true;
    block->requested = nbytes;
    increase(stats_.allocation, pool, 1);
    increase(stats_.allocated_bytes, pool, block->size);
    increase(stats_.active, pool, 1);
    increase(stats_.active_bytes, pool, block->size);
    increase(stats_.requested_bytes, pool, nbytes);
    if (block->size >= Config::max_split_size()) stats_.oversize_allocations.increase(1);
    return block;
  }

  void free(Block* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    Pool& pool = *block->pool;
    block->allocated = false;
    decrease(stats_.allocation, pool, 1);
    decrease(stats_.allocated_bytes, pool, block->size);
    decrease(stats_.requested_bytes, pool, block->requested);
    if (block->size >= Config::max_split_size()) stats_.oversize_allocations.decrease(1);
    if (!block->uses.empty() && record_use_events(block)) return;
    release_block(block);
  }

  void record_stream(Block* block, c10::StreamId stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    // The allocation stream needs no event: reuse there is stream-ordered.
    if (stream == block->stream) return;
    if (std::find(block->uses.begin(), block->uses.end(), stream) == block->uses.end()) {
      block->uses.push_back(stream);
    }
  }

  void empty_cache(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    wait_for_pending_frees();
    release_cached(device);
  }

  // --- private pools ----------------------------------------------------

  void create_pool(PoolId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = private_[id];
    TORCH_CHECK(slot == nullptr, "torch-fl: memory pool (", id.first, ", ", id.second, ") already exists");
    slot = std::make_unique<PrivatePool>(id);
  }

  void retain_pool(PoolId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = private_[id];
    if (slot == nullptr) {
      slot = std::make_unique<PrivatePool>(id);
    } else {
      slot->use_count += 1;
    }
  }

  void release_pool(PoolId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = private_.find(id);
    if (it == private_.end() || it->second->use_count == 0) return;
    it->second->use_count -= 1;
  }

  int use_count(PoolId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = private_.find(id);
    return it == private_.end() ? 0 : it->second->use_count;
  }

  void begin_route(PoolId id, StreamFilter streams) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = private_.find(id);
    TORCH_CHECK(it != private_.end() && it->second->use_count > 0, "torch-fl: memory pool (", id.first, ", ", id.second,
                ") does not exist on this device or was released: allocate to a live MemPool");
    routes_.push_back({id, std::this_thread::get_id(), std::move(streams)});
  }

  void end_route(PoolId id, bool by_stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::thread::id self = std::this_thread::get_id();
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
      if (it->id == id && (by_stream ? it->streams != nullptr : it->streams == nullptr && it->thread == self)) {
        routes_.erase(std::next(it).base());
        return;
      }
    }
    TORCH_CHECK(false, "torch-fl: this thread does not allocate to memory pool (", id.first, ", ", id.second,
                "): end_allocate_to_pool without begin_allocate_to_pool");
  }

  DeviceStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats out = stats_;
    out.max_split_size = static_cast<int64_t>(std::min<size_t>(Config::max_split_size(), INT64_MAX));
    return out;
  }

  void reset_accumulated() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (StatArray* s : all_stat_arrays()) {
      for (Stat& stat : *s) stat.reset_accumulated();
    }
    stats_.oversize_allocations.reset_accumulated();
    stats_.oversize_segments.reset_accumulated();
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_sync_all_streams = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (StatArray* s : all_stat_arrays()) {
      for (Stat& stat : *s) stat.reset_peak();
    }
    stats_.oversize_allocations.reset_peak();
    stats_.oversize_segments.reset_peak();
  }

  // Appends this device's segments to a JSON array (comma-separated).
  void snapshot(std::ostringstream& out, bool& first) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Block* head : segments_) {
      size_t total = 0, allocated = 0, active = 0, requested = 0;
      std::ostringstream blocks;
      for (Block* b = head; b != nullptr; b = b->next) {
        total += b->size;
        const char* state = "inactive";
        if (b->allocated) {
          state = "active_allocated";
          allocated += b->size;
          requested += b->requested;
        } else if (b->pending_events > 0) {
          state = "active_pending_free";
        }
        if (!b->is_free()) active += b->size;
        if (b != head) blocks << ',';
        blocks << R"({"address":)" << reinterpret_cast<uintptr_t>(b->ptr) << R"(,"size":)" << b->size
               << R"(,"requested_size":)" << (b->allocated ? b->requested : 0) << R"(,"state":")" << state
               << R"(","frames":[]})";
      }
      out << (first ? "" : ",") << R"({"device":)" << static_cast<int>(head->device) << R"(,"address":)"
          << reinterpret_cast<uintptr_t>(head->ptr) << R"(,"total_size":)" << total << R"(,"allocated_size":)"
          << allocated << R"(,"active_size":)" << active << R"(,"requested_size":)" << requested << R"(,"stream":)"
          << head->stream << R"(,"segment_type":")" << (head->pool->small ? "small" : "large")
          << R"(","segment_pool_id":[)" << head->pool->id.first << ',' << head->pool->id.second
          << R"(],"is_expandable":false,"frames":[],"blocks":[)" << blocks.str() << "]}";
      first = false;
    }
  }

 private:
  std::array<StatArray*, 8> all_stat_arrays() {
    return {&stats_.allocation,      &stats_.segment,        &stats_.active,       &stats_.inactive_split,
            &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes, &stats_.inactive_split_bytes};
  }

  // The pool an allocation of `size` by this thread on `stream` comes from:
  // the innermost matching route's private pool, else the default one.
  Pool& pool_for(size_t size, c10::StreamId stream) {
    const bool small = size <= kSmallSize;
    if (!routes_.empty()) {
      const std::thread::id self = std::this_thread::get_id();
      for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
        if (it->streams != nullptr ? !it->streams(stream) : it->thread != self) continue;
        PrivatePool& pp = *private_.at(it->id);
        return small ? pp.small : pp.large;
      }
    }
    return small ? small_ : large_;
  }

  // The default pools, and those of private pools without uses (whose
  // cached segments go back to the plugin).
  std::vector<Pool*> releasable_pools() {
    std::vector<Pool*> out{&small_, &large_};
    for (auto& [id, pp] : private_) {
      if (pp->use_count == 0) {
        out.push_back(&pp->small);
        out.push_back(&pp->large);
      }
    }
    return out;
  }

  // Forgets released private pools that no segment uses any more.
  void drop_empty_pools() {
    for (auto it = private_.begin(); it != private_.end();) {
      PrivatePool* pp = it->second.get();
      const PoolId id = it->first;
      const bool used = pp->use_count > 0 ||
                        std::any_of(routes_.begin(), routes_.end(), [id](const Route& r) { return r.id == id; }) ||
                        std::any_of(segments_.begin(), segments_.end(),
                                    [pp](const Block* b) { return b->pool == &pp->small || b->pool == &pp->large; });
      it = used ? std::next(it) : private_.erase(it);
    }
  }

  // --- the free lists ---------------------------------------------------

  void insert_free(Block* block) {
    block->pool->free.insert(block);
    if (block->is_split()) {
      increase(stats_.inactive_split, *block->pool, 1);
      increase(stats_.inactive_split_bytes, *block->pool, block->size);
    }
  }

  void erase_free(Block* block) {
    block->pool->free.erase(block);
    if (block->is_split()) {
      decrease(stats_.inactive_split, *block->pool, 1);
      decrease(stats_.inactive_split_bytes, *block->pool, block->size);
    }
  }

  // The smallest cached block of `stream` that fits `size`, taken off the
  // free list. Oversize blocks (>= max_split_size, never split) serve only
  // requests close to their size, or they would be wasted on small ones.
  Block* take_free(Pool& pool, c10::StreamId stream, size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.free.lower_bound(&key);
    if (it == pool.free.end() || (*it)->stream != stream) return nullptr;
    Block* block = *it;
    const size_t max_split = Config::max_split_size();
    if (size < max_split && block->size >= max_split) return nullptr;
    if (size >= max_split && block->size >= size + Config::max_non_split_rounding_size()) return nullptr;
    erase_free(block);
    return block;
  }

  // A whole free segment of another stream, made safe for `stream`: work
  // queued later on `stream` waits for an event recorded now on the owner
  // stream, which follows every use of the memory there. Used only when
  // the plugin is out of memory, because the wait ties the two streams.
  Block* take_from_other_stream(Pool& pool, c10::Stream stream, size_t size) {
    for (Block* candidate : pool.free) {
      if (candidate->stream == stream.id() || candidate->is_split() || candidate->size < size) continue;
      const AttachedDevice& d = runtime("allocate");
      TFL_Event* event = acquire_event(d, stream.device_index());
      // Reusable once it completed, also when recording or waiting failed.
      pending_spare_.push_back(event);
      TFL_CHECK_STATUS(d.ref(), "event_record",
                       d.api->event_record(event, plugin_stream(stream_of(stream.device_index(), candidate->stream))));
      TFL_CHECK_STATUS(d.ref(), "stream_wait_event", d.api->stream_wait_event(plugin_stream(stream), event));
      erase_free(candidate);
      candidate->stream = stream.id();
      return candidate;
    }
    return nullptr;
  }

  bool should_split(const Block& block, size_t size) const {
    const size_t remaining = block.size - size;
    if (block.pool->small) return remaining >= kMinBlockSize;
    return size < Config::max_split_size() && remaining > kSmallSize;
  }

  void split(Block* block, size_t size) {
    auto* rest = new Block(*block);
    rest->uses.clear();
    rest->ptr = block->ptr + size;
    rest->size = block->size - size;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    insert_free(rest);
  }

  // Returns a freed block to its free list, merged with free neighbours.
  // The earlier block of a pair survives, so a segment's first block (the
  // one segments_ lists) lives as long as the segment.
  void release_block(Block* block) {
    decrease(stats_.active, *block->pool, 1);
    decrease(stats_.active_bytes, *block->pool, block->size);
    block->uses.clear();
    if (block->next != nullptr && block->next->is_free()) {
      Block* next = block->next;
      erase_free(next);
      block->size += next->size;
      block->next = next->next;
      if (block->next != nullptr) block->next->prev = block;
      delete next;
    }
    if (block->prev != nullptr && block->prev->is_free()) {
      Block* prev = block->prev;
      erase_free(prev);
      prev->size += block->size;
      prev->next = block->next;
      if (prev->next != nullptr) prev->next->prev = prev;
      delete block;
      block = prev;
    }
    insert_free(block);
  }

  // --- events -----------------------------------------------------------

  TFL_Event* acquire_event(const AttachedDevice& d, c10::DeviceIndex device) {
    if (!spare_events_.empty()) {
      TFL_Event* event = spare_events_.back();
      spare_events_.pop_back();
      return event;
    }
    TFL_Event* event = nullptr;
    TFL_CHECK_STATUS(d.ref(), "event_create", d.api->event_create(device, TFL_EVENT_DEFAULT, &event));
    return event;
  }

  // Records an event on every other stream that used `block`; the block is
  // reused once they completed. Runs in a deleter, so it must not throw:
  // when the plugin cannot record, the block is leaked with a warning
  // rather than reused while those streams may still read it.
  bool record_use_events(Block* block) {
    const AttachedDevice* d = attached_device();
    if (d == nullptr) return false;
    for (c10::StreamId use : block->uses) {
      TFL_Event* event = nullptr;
      try {
        event = acquire_event(*d, block->device);
        TFL_CHECK_STATUS(d->ref(), "event_record",
                         d->api->event_record(event, plugin_stream(stream_of(block->device, use))));
      } catch (const c10::Error& e) {
        TORCH_WARN("torch-fl: a freed block of ", format_bytes(block->size), " on ", d->device_name, ":",
                   static_cast<int>(block->device),
                   " stays reserved: cannot record its use on another stream: ", e.what_without_backtrace());
        if (event != nullptr) spare_events_.push_back(event);
        block->pending_events += 1;  // never completes: the block is leaked
        return true;
      }
      pending_.push_back({event, block});
      block->pending_events += 1;
    }
    block->uses.clear();
    return true;
  }

  // Moves blocks whose other-stream uses have completed to the free lists.
  void process_events() {
    if (pending_.empty() && pending_spare_.empty()) return;
    const AttachedDevice* d = attached_device();
    if (d == nullptr) return;
    const auto complete = [d](TFL_Event* event) {
      uint8_t done = 0;
      if (TFL_Error* e = d->api->event_query(event, &done)) {
        d->api->error_destroy(e);
        return false;  // asked again later; empty_cache waits for it
      }
      return done != 0;
    };
    size_t kept = 0;
    for (auto& [event, block] : pending_) {
      if (complete(event)) {
        spare_events_.push_back(event);
        if (--block->pending_events == 0) release_block(block);
      } else {
        pending_[kept++] = {event, block};
      }
    }
    pending_.resize(kept);
    kept = 0;
    for (TFL_Event* event : pending_spare_) {
      if (complete(event)) {
        spare_events_.push_back(event);
      } else {
        pending_spare_[kept++] = event;
      }
    }
    pending_spare_.resize(kept);
  }

  void wait_for_pending_frees() {
    if (pending_.empty()) return;
    const AttachedDevice& d = runtime("empty the cache");
    stats_.num_sync_all_streams += 1;
    for (auto& [event, block] : pending_) {
      TFL_CHECK_STATUS(d.ref(), "event_synchronize", d.api->event_synchronize(event));
    }
    process_events();
  }

  // --- segments ---------------------------------------------------------

  // A new segment from the plugin, or nullptr when it is out of memory.
  Block* new_segment(c10::DeviceIndex device, Pool& pool, c10::StreamId stream, size_t size, size_t nbytes = 0) {
    const AttachedDevice& d = runtime("allocate");
    if (nbytes == 0) nbytes = segment_size(size);
    void* ptr = nullptr;
    TFL_Error* error = nullptr;
    {
      const AllocTimer timer;
      const InFlightScope in_flight(d.plugin_label.c_str(), "allocate");
      error = d.api->allocate(device, nbytes, &ptr);
    }
    if (error != nullptr && d.api->error_code(error) == TFL_ERROR_OUT_OF_MEMORY) {
      oom_status_ = take_status(d.api, error);
      return nullptr;
    }
    TFL_CHECK_STATUS(d.ref(), "allocate", error, ". ", d.device_name, ":", static_cast<int>(device),
                     " could not allocate a segment of ", format_bytes(nbytes));
    TORCH_CHECK(ptr != nullptr, "plugin ", d.plugin_label, ": allocate returned NULL without an error");
    auto* block = new Block();
    block->device = device;
    block->stream = stream;
    block->size = nbytes;
    block->ptr = static_cast<char*>(ptr);
    block->pool = &pool;
    segments_.insert(block);
    increase(stats_.segment, pool, 1);
    increase(stats_.reserved_bytes, pool, nbytes);
    stats_.num_device_alloc += 1;
    if (nbytes >= Config::max_split_size()) stats_.oversize_segments.increase(1);
    return block;
  }

  // Gives every whole free segment back to the plugin. Its deallocate is
  // stream-ordered, so memory still read by queued work is safe.
  void release_cached(c10::DeviceIndex device) {
    const AttachedDevice& d = runtime("empty the cache");
    for (Pool* pool : releasable_pools()) {
      for (auto it = pool->free.begin(); it != pool->free.end();) {
        Block* block = *it;
        if (block->is_split()) {
          ++it;
          continue;
        }
        it = pool->free.erase(it);
        segments_.erase(block);
        TFL_Error* error = nullptr;
        {
          const AllocTimer timer;
          const InFlightScope in_flight(d.plugin_label.c_str(), "deallocate");
          error = d.api->deallocate(device, block->ptr);
        }
        decrease(stats_.segment, *pool, 1);
        decrease(stats_.reserved_bytes, *pool, block->size);
        stats_.num_device_free += 1;
        if (block->size >= Config::max_split_size()) stats_.oversize_segments.decrease(1);
        delete block;
        TFL_CHECK_STATUS(d.ref(), "deallocate", error);
      }
    }
    drop_empty_pools();
  }

  // PYTORCH_ALLOC_CONF's garbage_collection_threshold: past that share of
  // the device's memory, cached segments go back before a new one is taken.
  void collect_garbage(c10::DeviceIndex device) {
    const double threshold = Config::garbage_collection_threshold();
    if (threshold <= 0.0) return;
    if (total_memory_ == 0) total_memory_ = device_properties(device).total_memory;
    const auto reserved = static_cast<double>(stats_.reserved_bytes[0].current);
    if (total_memory_ > 0 && reserved > threshold * static_cast<double>(total_memory_)) release_cached(device);
  }

  // The plugin's out-of-memory error, with the allocator's figures and
  // what to do. The cache was already given back (see malloc), so unlike
  // the plugin backend's message this one does not suggest empty_cache().
  [[noreturn]] void report_oom(c10::DeviceIndex device, size_t nbytes) {
    const AttachedDevice& d = runtime("allocate");
    const auto allocated = static_cast<size_t>(stats_.allocated_bytes[0].current);
    const auto reserved = static_cast<size_t>(stats_.reserved_bytes[0].current);
    throw_status(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, d.ref(), oom_status_,
                 "allocate",
                 c10::str(". ", d.device_name, ":", static_cast<int>(device), " could not allocate ",
                          format_bytes(nbytes), " (", format_bytes(allocated), " in use by tensors on this device); ",
                          "torch-fl's allocator holds ", format_bytes(reserved - allocated),
                          " more, reserved but unallocated. Free tensors you no longer need "
                          "(`del t`), reduce the batch size, or give the device more memory if the plugin allows it. "
                          "If reserved but unallocated memory is large, set max_split_size_mb in PYTORCH_ALLOC_CONF "
                          "to limit fragmentation."));
  }

  std::mutex mutex_;
  Pool small_{true};
  Pool large_{false};
  std::map<PoolId, std::unique_ptr<PrivatePool>> private_;
  std::vector<Route> routes_;
  std::set<Block*> segments_;  // each segment's first block
  std::vector<std::pair<TFL_Event*, Block*>> pending_;
  std::vector<TFL_Event*> pending_spare_;  // cross-stream waits in flight
  std::vector<TFL_Event*> spare_events_;
  DeviceStats stats_;
  PluginStatus oom_status_;  // of the last allocate refused for lack of memory
  uint64_t total_memory_ = 0;
};

// Immortal, like the allocations it hands out: storages freed during static
// destruction must still find their cache.
DeviceCache& cache(c10::DeviceIndex device) {
  static auto* table = new std::array<DeviceCache, kMaxDevices>();
  return (*table)[static_cast<size_t>(device)];
}

void free_block_context(void* ctx) {
  // In a bad fork the memory is leaked: the child must not call the plugin,
  // and the cache's lock may have been held by a parent thread at fork time.
  if (in_bad_fork()) return;
  auto* block = static_cast<Block*>(ctx);
  cache(block->device).free(block);
}

}  // namespace

c10::DataPtr allocate(c10::DeviceIndex device, size_t nbytes) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid device index ", static_cast<int>(device));
  Block* block = cache(device).malloc(device, nbytes, current_stream(device));
  return c10::DataPtr(block->ptr, block, &free_block_context, c10::Device(c10::DeviceType::PrivateUse1, device));
}

bool owns(const c10::DataPtr& ptr) {
  return ptr.get_deleter() == &free_block_context;
}

void record_stream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (!owns(ptr)) return;
  auto* block = static_cast<Block*>(ptr.get_context());
  TORCH_CHECK(stream.device_index() == block->device, "record_stream: the stream is on ", device_type_name(), ":",
              static_cast<int>(stream.device_index()), " but the tensor's memory is on ", device_type_name(), ":",
              static_cast<int>(block->device));
  cache(block->device).record_stream(block, stream.id());
}

void empty_cache() {
  const AttachedDevice* d = attached_device();
  if (d == nullptr) return;
  for (int32_t i = 0; i < d->device_count; ++i) {
    cache(static_cast<c10::DeviceIndex>(i)).empty_cache(static_cast<c10::DeviceIndex>(i));
  }
}

DeviceStats device_stats(c10::DeviceIndex device) {
  return cache(device).stats();
}

void reset_accumulated_stats(c10::DeviceIndex device) {
  cache(device).reset_accumulated();
}

void reset_peak_stats(c10::DeviceIndex device) {
  cache(device).reset_peak();
}

namespace {
// Unique across devices and kinds, as CUDA's ids are.
uint64_t next_pool_number() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}
}  // namespace

PoolId create_pool(c10::DeviceIndex device, bool graph) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid device index ", static_cast<int>(device));
  const uint64_t n = next_pool_number();
  const PoolId id = graph ? PoolId{0, n} : PoolId{n, 0};
  cache(device).create_pool(id);
  return id;
}

void release_pool(c10::DeviceIndex device, PoolId id) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid device index ", static_cast<int>(device));
  cache(device).release_pool(id);
}

int pool_use_count(c10::DeviceIndex device, PoolId id) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid device index ", static_cast<int>(device));
  return cache(device).use_count(id);
}

PoolId new_graph_pool_id() {
  return {0, next_pool_number()};
}

void retain_pool(c10::DeviceIndex device, PoolId id) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid device index ", static_cast<int>(device));
  TORCH_CHECK((id.first == 0) != (id.second == 0), "torch-fl: (", id.first, ", ", id.second,
              ") is not a memory pool id: pass a MemPool, a graph's pool() or graph_pool_handle()");
  cache(device).retain_pool(id);
}

void begin_allocate_to_pool(c10::DeviceIndex device, PoolId id) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid device index ", static_cast<int>(device));
  cache(device).begin_route(id, nullptr);
}

void end_allocate_to_pool(c10::DeviceIndex device, PoolId id) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid device index ", static_cast<int>(device));
  cache(device).end_route(id, /*by_stream=*/false);
}

void begin_allocate_streams_to_pool(c10::DeviceIndex device, PoolId id, StreamFilter filter) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid device index ", static_cast<int>(device));
  TORCH_CHECK(filter != nullptr, "begin_allocate_streams_to_pool needs a stream filter");
  cache(device).begin_route(id, std::move(filter));
}

void end_allocate_streams_to_pool(c10::DeviceIndex device, PoolId id) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "invalid device index ", static_cast<int>(device));
  cache(device).end_route(id, /*by_stream=*/true);
}

std::string snapshot_json() {
  std::ostringstream out;
  out << R"({"segments":[)";
  const AttachedDevice* d = attached_device();
  const int32_t count = d == nullptr ? 0 : d->device_count;
  bool first = true;
  for (int32_t i = 0; i < count; ++i) cache(static_cast<c10::DeviceIndex>(i)).snapshot(out, first);
  out << R"(],"device_traces":[)";
  for (int32_t i = 0; i < count; ++i) out << (i == 0 ? "[]" : ",[]");
  out << "]}";
  return out.str();
}

}  // namespace torchfl::caching

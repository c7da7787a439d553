// The host-side caching allocator for device memory, on by default.
//
// A real accelerator's allocate costs tens to hundreds of microseconds and
// often synchronizes the device; a training step allocates and frees
// hundreds of tensors. Like CUDACachingAllocator, this allocator asks the
// plugin for large segments and carves tensors out of them, so that in the
// steady state no tensor allocation reaches the plugin:
//
//  - sizes round up to 512 bytes (or to power-of-two divisions, per
//    PYTORCH_ALLOC_CONF's roundup_power2_divisions); requests up to 1 MiB
//    come from 2 MiB segments (the small pool), larger ones from 20 MiB
//    segments or a segment of their own (the large pool);
//  - a free block of a segment is split to serve a smaller request, and
//    merged with its free neighbours when freed; blocks above
//    max_split_size_mb are never split;
//  - every block belongs to the stream it was allocated on. Freed, it is
//    reused at once by allocations on the same stream (stream order makes
//    that safe, as on CUDA), and by another stream only when memory runs
//    short, after that stream was made to wait for an event recorded on the
//    block's stream. A block used on other streams (record_stream) is
//    reused only after events recorded on those streams at free time have
//    completed;
//  - when the plugin reports out-of-memory, cached blocks are given back to
//    the plugin (its deallocate is stream-ordered, so no synchronization is
//    needed) and the allocation retried once before OutOfMemoryError;
//  - private pools (MemPool; device graphs' memory) have small and large
//    pools of their own: a thread routed to one allocates only from its
//    segments, and nothing outside it ever does.
//
// Statistics follow CUDA's (memory_stats keys, small/large pools), and
// snapshot() lists segments and blocks in torch.cuda.memory_snapshot()'s
// format. Configuration: TORCH_FL_ALLOC_CONF=backend:plugin turns caching
// off (every allocation is a plugin call, as before); the device-generic
// keys of PYTORCH_ALLOC_CONF (max_split_size_mb, roundup_power2_divisions,
// max_non_split_rounding_mb, garbage_collection_threshold) apply through
// c10's AcceleratorAllocatorConfig. A plugin that caches itself
// (TFL_CAP_CACHING_ALLOCATOR) gets allocations passed straight through.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace torchfl::caching {

// Allocates `nbytes` on `device` for the calling thread's current stream.
c10::DataPtr allocate(c10::DeviceIndex device, size_t nbytes);

// Whether `ptr` came from allocate() (its deleter is this allocator's).
bool owns(const c10::DataPtr& ptr);

// Marks the block behind `ptr` as used on `stream` (Tensor.record_stream).
void record_stream(const c10::DataPtr& ptr, c10::Stream stream);

// Gives every fully free cached segment of every device back to the plugin
// (after waiting for the events of blocks freed with pending uses).
void empty_cache();

c10::CachingDeviceAllocator::DeviceStats device_stats(c10::DeviceIndex device);
void reset_accumulated_stats(c10::DeviceIndex device);
void reset_peak_stats(c10::DeviceIndex device);

// Private pools (torch.<device>.MemPool, and the memory of device graphs):
// segments of their own, which other allocations never use, so a tensor
// allocated from a pool gets addresses no tensor outside it shares. Ids
// follow c10::MempoolId_t: (n, 0) for MemPool objects, (0, n) for graph
// pools; (0, 0) is the default pool.
using PoolId = std::pair<uint64_t, uint64_t>;

// A new pool on `device`, with one use (its owner's).
PoolId create_pool(c10::DeviceIndex device, bool graph);

// Drops one use of the pool. At none, its cached segments go back to the
// plugin at the next empty_cache() (or when memory runs short), and the
// pool itself once its last tensor is freed.
void release_pool(c10::DeviceIndex device, PoolId id);

// The pool's uses (0 once released, or for an unknown id).
int pool_use_count(c10::DeviceIndex device, PoolId id);

// A fresh graph pool id, (0, n), for a pool that a capture creates
// (torch.<device>.graph_pool_handle()).
PoolId new_graph_pool_id();

// One more use of the pool; creates it (with one use) if it does not exist.
void retain_pool(c10::DeviceIndex device, PoolId id);

// Routes the calling thread's allocations on `device` to the pool, until
// end_allocate_to_pool: innermost first when nested.
void begin_allocate_to_pool(c10::DeviceIndex device, PoolId id);
void end_allocate_to_pool(c10::DeviceIndex device, PoolId id);

// Routes every thread's allocations on `device` for the streams `filter`
// accepts to the pool (a graph capture's: its streams, whichever thread
// queues on them), until end_allocate_streams_to_pool. `filter` runs under
// the allocator's lock and must not allocate device memory.
using StreamFilter = std::function<bool(c10::StreamId)>;
void begin_allocate_streams_to_pool(c10::DeviceIndex device, PoolId id, StreamFilter filter);
void end_allocate_streams_to_pool(c10::DeviceIndex device, PoolId id);

// Every device's segments and blocks as a JSON document:
// {"segments": [...], "device_traces": [[]...]} in the form of
// torch.cuda.memory._snapshot().
std::string snapshot_json();

}  // namespace torchfl::caching

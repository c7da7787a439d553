// Fork safety: a child forked from a process that had initialized the device
// never calls the plugin.
//
// The plugin's worker threads exist only in the process that started them,
// and a lock one of them held at fork() stays held forever in the child: a
// forked child that enqueues work on an inherited device tensor waits for
// threads that do not exist, and hangs. As CUDA does ("Cannot re-initialize
// CUDA in forked subprocess"), such a child is marked *in a bad fork* by a
// pthread_atfork child handler, and every shim path that would reach the
// plugin checks the mark first (one relaxed atomic load) and raises a
// RuntimeError naming the device and the remedy. Destructors leak instead
// (deallocate, event destroy, pinned blocks): they run in the child too, and
// must neither throw nor call the plugin. Bookkeeping that never reaches the
// plugin keeps working, as CUDA's does: device_count, is_available, the
// current device and stream of a thread.
//
// A child forked before the device was attached is unaffected. The Rust core
// keeps the same mark for plugin calls it makes itself (crates/torchfl-core,
// fork.rs), and PyTorch's device_lazy_init makes Python factories and .to()
// call torch.<name>._lazy_init() again in the child, which raises there.
#pragma once

#include <c10/macros/Macros.h>

#include <atomic>

namespace torchfl {

namespace detail {
extern std::atomic<bool> g_in_bad_fork;
}  // namespace detail

// Whether this process was forked after the device was attached.
inline bool in_bad_fork() noexcept {
  return detail::g_in_bad_fork.load(std::memory_order_relaxed);
}

// Raises the bad-fork error; `what` says what was refused ("allocate"), or
// is nullptr, and `name` (optional) what it was refused for ("operator",
// "add.out").
[[noreturn]] C10_NOINLINE void raise_bad_fork(const char* what, const char* name);

// The one check before anything that would reach the plugin.
inline void check_not_forked(const char* what, const char* name = nullptr) {
  if (C10_UNLIKELY(in_bad_fork())) raise_bad_fork(what, name);
}

// Called by attach_device before it first calls the plugin: from now on a
// forked child is in a bad fork.
void note_device_attaching();

}  // namespace torchfl

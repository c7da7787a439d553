/*
 * torch-fl plugin helpers
 * =======================
 *
 * Optional, header-only (C99, everything `static inline`): the boilerplate
 * every plugin repeats, so that a port starts with its kernels and its
 * memory, not with error objects and stream bookkeeping. Nothing here is
 * part of the ABI: plugin.h is the contract, and a plugin may use any part
 * of this file, all of it, or none. Used by the C projects `torchfl-abi new`
 * writes (examples/c_plugin is one).
 *
 * It includes plugin.h itself, from its own directory, so the two files
 * are kept side by side (`torchfl-abi header --include-dir DIR` writes
 * both). It defines struct TFL_Error (and, unless TFLH_NO_SYNC_STREAMS,
 * struct TFL_Stream and struct TFL_Event), so a plugin using it does not
 * define its own. Include it in the translation unit that defines the
 * plugin's TFL_PluginApi table, or in several: every function is static,
 * and nothing relies on there being one copy (the static error and the
 * default streams are recognized by a flag, not by their address). Needs
 * POSIX threads and clocks: define _POSIX_C_SOURCE 200809L before including
 * any header, and link -lpthread.
 *
 * Configuration, by macros defined before the include:
 *
 *   TFLH_PLUGIN_NAME     string literal that starts every message the
 *                        helpers write (default "plugin"); use the plugin's
 *                        TFL_PluginInfo.name so errors name the plugin.
 *   TFLH_DEVICE_COUNT    expression: the number of devices, for the range
 *                        checks (default 1). Evaluated at each check.
 *   TFLH_NO_SYNC_STREAMS define when the plugin has asynchronous hardware
 *                        and its own TFL_Stream/TFL_Event: leaves section 2
 *                        out.
 *   TFLH_ACTIVITY_RANGE_DEPTH  ranges open at once per thread that section
 *                        5 records (default 64); deeper ones still pair.
 *   TFLH_THREAD_LOCAL    the thread-local storage class, when the compiler
 *                        is neither C11, C++11, GCC/Clang nor MSVC.
 *
 * The five parts, each a set of functions with the exact signatures of
 * TFL_PluginApi entries where one exists, so they go straight into the
 * table:
 *
 *   1. errors            struct TFL_Error, tflh_error(code, fmt, ...) and
 *                        the error_code/error_message/error_destroy entries;
 *                        tflh_check_device.
 *   2. synchronous       default streams, streams and events for a device
 *      streams, events   that runs every call to completion before
 *                        returning (no TFL_CAP_ASYNC_STREAMS): bookkeeping,
 *                        and event timing from the host's monotonic clock.
 *   3. memory counters   TFL_MemoryStats kept per device under a mutex, with
 *                        the capacity check and the OUT_OF_MEMORY error.
 *   4. device addresses  for memory that is handles, not addresses (OpenCL
 *                        buffers): reserved address ranges mapped back to
 *                        (handle, offset).
 *   5. activity records  ABI 1.8: a bounded, locked buffer of
 *                        TFL_ActivityRecord with the drain rules of
 *                        plugin.h, the thread's correlation id, and user
 *                        ranges on a per-thread stack.
 *   and tflh_op_table, the get_op_table entry for a static op array.
 *
 * Conventions (as in plugin.h): a function returning TFL_Error* returns NULL
 * on success, or an error the caller owns (release with tflh_error_destroy);
 * on failure outputs are untouched. Each function states its thread-safety.
 */
#ifndef TORCH_FL_PLUGIN_HELPERS_H_
#define TORCH_FL_PLUGIN_HELPERS_H_

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include "plugin.h"

#if !defined(CLOCK_MONOTONIC)
#error "torch_fl/plugin_helpers.h needs POSIX clocks: #define _POSIX_C_SOURCE 200809L before including any header"
#endif

#ifndef TFLH_PLUGIN_NAME
#define TFLH_PLUGIN_NAME "plugin"
#endif
#ifndef TFLH_DEVICE_COUNT
#define TFLH_DEVICE_COUNT 1
#endif
/* Longer messages are truncated, never overflow. */
#ifndef TFLH_ERROR_MESSAGE_SIZE
#define TFLH_ERROR_MESSAGE_SIZE 256
#endif

/* Lets the compiler check tflh_error's format string against its arguments. */
#if defined(__GNUC__)
#define TFLH_PRINTF(fmt_index, first_arg) \
  __attribute__((format(printf, fmt_index, first_arg)))
#else
#define TFLH_PRINTF(fmt_index, first_arg)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* 1. Errors                                                                */
/* ------------------------------------------------------------------------ */

/* The plugin's error object (plugin.h leaves TFL_Error to the plugin).
 * `is_static` marks the one error that is not heap-allocated: the
 * out-of-memory error tflh_error returns when it cannot allocate. */
struct TFL_Error {
  int32_t code; /* a TFL_ErrorCode */
  int32_t is_static;
  char message[TFLH_ERROR_MESSAGE_SIZE];
};

/* A new error with `code` and a printf-formatted message (truncated to
 * TFLH_ERROR_MESSAGE_SIZE - 1 bytes). Start the message with the plugin's
 * name, as the host shows it verbatim. Never returns NULL: when the error
 * itself cannot be allocated, returns a static OUT_OF_MEMORY error (which
 * tflh_error_destroy knows not to free).
 * Ownership: the caller owns the result (usually returning it to the host,
 * which releases it with the table's error_destroy). Thread-safe. */
static inline TFLH_PRINTF(2, 3) TFL_Error* tflh_error(int32_t code,
                                                      const char* fmt, ...) {
  static TFL_Error out_of_memory = {TFL_ERROR_OUT_OF_MEMORY, 1,
                                    TFLH_PLUGIN_NAME ": out of host memory"};
  TFL_Error* e = (TFL_Error*)malloc(sizeof(TFL_Error));
  va_list ap;
  if (e == NULL) return &out_of_memory;
  e->code = code;
  e->is_static = 0;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return e;
}

/* The error_code entry. `error` is borrowed and not NULL. Thread-safe. */
static inline int32_t tflh_error_code(const TFL_Error* error) {
  return error->code;
}

/* The error_message entry: valid until the error is destroyed. `error` is
 * borrowed and not NULL. Thread-safe. */
static inline const char* tflh_error_message(const TFL_Error* error) {
  return error->message;
}

/* The error_destroy entry: releases an error from tflh_error (from any
 * translation unit). NULL is a no-op. Takes ownership of `error`.
 * Thread-safe on distinct errors. */
static inline void tflh_error_destroy(TFL_Error* error) {
  if (error != NULL && !error->is_static) free(error);
}

/* INVALID_ARGUMENT unless 0 <= device < TFLH_DEVICE_COUNT, as the ABI
 * requires of every entry taking a device index. Thread-safe as far as
 * TFLH_DEVICE_COUNT is. */
static inline TFL_Error* tflh_check_device(int32_t device) {
  int32_t count = (int32_t)(TFLH_DEVICE_COUNT);
  if (device < 0 || device >= count) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      TFLH_PLUGIN_NAME
                      ": device %d out of range (device_count = %d)",
                      (int)device, (int)count);
  }
  return NULL;
}

/* The device_synchronize entry of a synchronous device: every call has
 * completed when it returns, so there is nothing to wait for beyond the
 * range check. Thread-safe. */
static inline TFL_Error* tflh_sync_device_synchronize(int32_t device) {
  return tflh_check_device(device);
}

/* Milliseconds on the monotonic clock (event timing). Thread-safe. */
static inline double tflh_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ------------------------------------------------------------------------ */
/* 2. Streams and events of a synchronous device                            */
/* ------------------------------------------------------------------------ */

#ifndef TFLH_NO_SYNC_STREAMS

/* All work runs to completion on the calling thread before the call that
 * submitted it returns, so a stream is already in order, always complete,
 * and waiting on an event never blocks. `created` is 0 for the default
 * streams (static, never destroyed). */
struct TFL_Stream {
  int32_t device;
  int32_t created;
};

/* An event remembers when it was last recorded; its fields are guarded by
 * `lock` since the same event may be recorded and read concurrently. */
struct TFL_Event {
  pthread_mutex_t lock;
  int32_t device;
  uint32_t flags; /* TFL_EVENT_* */
  int32_t recorded;
  double time_ms;
};

/* The default_stream entry: one static stream per device, owned by the
 * helpers (never destroyed). `out` is written on success only.
 * Thread-safe. */
static inline TFL_Error* tflh_sync_default_stream(int32_t device,
                                                  TFL_Stream** out) {
  /* Zero-initialized: every one is a default stream (created == 0). Only
   * the address is handed out; the device field stays unused. */
  static TFL_Stream defaults[TFL_MAX_DEVICES];
  TFL_Error* err = tflh_check_device(device);
  if (err != NULL) return err;
  if (device >= TFL_MAX_DEVICES) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      TFLH_PLUGIN_NAME ": device %d beyond TFL_MAX_DEVICES",
                      (int)device);
  }
  *out = &defaults[device];
  return NULL;
}

/* The stream_create entry; `priority` is ignored (all work runs at once).
 * Ownership: the host owns the stream until stream_destroy. Thread-safe. */
static inline TFL_Error* tflh_sync_stream_create(int32_t device,
                                                 int32_t priority,
                                                 TFL_Stream** out) {
  TFL_Error* err = tflh_check_device(device);
  TFL_Stream* s;
  (void)priority;
  if (err != NULL) return err;
  s = (TFL_Stream*)calloc(1, sizeof *s);
  if (s == NULL) {
    return tflh_error(TFL_ERROR_OUT_OF_MEMORY,
                      TFLH_PLUGIN_NAME ": cannot allocate a stream");
  }
  s->device = device;
  s->created = 1;
  *out = s;
  return NULL;
}

/* The stream_destroy entry: takes ownership of a stream from
 * tflh_sync_stream_create; a default stream is INVALID_ARGUMENT, as the ABI
 * says. Thread-safe on distinct streams. */
static inline TFL_Error* tflh_sync_stream_destroy(TFL_Stream* stream) {
  if (!stream->created) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      TFLH_PLUGIN_NAME
                      ": the default stream cannot be destroyed");
  }
  free(stream);
  return NULL;
}

/* The stream_synchronize entry: nothing is ever pending. Thread-safe. */
static inline TFL_Error* tflh_sync_stream_synchronize(TFL_Stream* stream) {
  (void)stream;
  return NULL;
}

/* The stream_query entry: always complete. Thread-safe. */
static inline TFL_Error* tflh_sync_stream_query(TFL_Stream* stream,
                                                uint8_t* out_complete) {
  (void)stream;
  *out_complete = 1;
  return NULL;
}

/* The stream_wait_event entry: the event's work has already run.
 * Thread-safe. */
static inline TFL_Error* tflh_sync_stream_wait_event(TFL_Stream* stream,
                                                     TFL_Event* event) {
  (void)stream;
  (void)event;
  return NULL;
}

/* The event_create entry. Ownership: the host owns the event until
 * event_destroy. Thread-safe. */
static inline TFL_Error* tflh_sync_event_create(int32_t device, uint32_t flags,
                                                TFL_Event** out) {
  TFL_Error* err = tflh_check_device(device);
  TFL_Event* e;
  if (err != NULL) return err;
  e = (TFL_Event*)calloc(1, sizeof *e);
  if (e == NULL || pthread_mutex_init(&e->lock, NULL) != 0) {
    free(e);
    return tflh_error(TFL_ERROR_OUT_OF_MEMORY,
                      TFLH_PLUGIN_NAME ": cannot allocate an event");
  }
  e->device = device;
  e->flags = flags;
  *out = e;
  return NULL;
}

/* The event_destroy entry: takes ownership of the event and frees it.
 * Thread-safe on distinct events (the host destroys an event only when no
 * other call uses it). */
static inline TFL_Error* tflh_sync_event_destroy(TFL_Event* event) {
  pthread_mutex_destroy(&event->lock);
  free(event);
  return NULL;
}

/* The event_record entry: all work submitted so far has completed, so the
 * event completes now; notes the time for event_elapsed_time. Thread-safe. */
static inline TFL_Error* tflh_sync_event_record(TFL_Event* event,
                                                TFL_Stream* stream) {
  double now = tflh_now_ms();
  (void)stream;
  pthread_mutex_lock(&event->lock);
  event->recorded = 1;
  event->time_ms = now;
  pthread_mutex_unlock(&event->lock);
  return NULL;
}

/* The event_query entry: always complete (recorded or not). Thread-safe. */
static inline TFL_Error* tflh_sync_event_query(TFL_Event* event,
                                               uint8_t* out_complete) {
  (void)event;
  *out_complete = 1;
  return NULL;
}

/* The event_synchronize entry: nothing to wait for. Thread-safe. */
static inline TFL_Error* tflh_sync_event_synchronize(TFL_Event* event) {
  (void)event;
  return NULL;
}

/* The event_elapsed_time entry: milliseconds between the last records of
 * two events created with TFL_EVENT_TIMING; FAILED_PRECONDITION when either
 * lacks the flag or was never recorded. Writes *out_ms on success only.
 * Thread-safe. */
static inline TFL_Error* tflh_sync_event_elapsed_time(TFL_Event* start,
                                                      TFL_Event* end,
                                                      float* out_ms) {
  double t0, t1;
  int32_t recorded;
  if (!(start->flags & TFL_EVENT_TIMING) || !(end->flags & TFL_EVENT_TIMING)) {
    return tflh_error(TFL_ERROR_FAILED_PRECONDITION,
                      TFLH_PLUGIN_NAME ": both events need TFL_EVENT_TIMING");
  }
  pthread_mutex_lock(&start->lock);
  recorded = start->recorded;
  t0 = start->time_ms;
  pthread_mutex_unlock(&start->lock);
  pthread_mutex_lock(&end->lock);
  recorded = recorded && end->recorded;
  t1 = end->time_ms;
  pthread_mutex_unlock(&end->lock);
  if (!recorded) {
    return tflh_error(TFL_ERROR_FAILED_PRECONDITION,
                      TFLH_PLUGIN_NAME
                      ": both events must be recorded first");
  }
  *out_ms = (float)(t1 - t0);
  return NULL;
}

#endif /* TFLH_NO_SYNC_STREAMS */

/* ------------------------------------------------------------------------ */
/* 3. Memory statistics counters                                            */
/* ------------------------------------------------------------------------ */

/* One device's counters. Initialize with TFLH_MEMORY_COUNTERS_INIT (static
 * storage) and keep one per device; every function below takes the lock,
 * so all are thread-safe. The plugin does the allocating; the counters only
 * account for it. No caching allocator: reserved_bytes reads as
 * allocated_bytes. */
typedef struct TFLH_MemoryCounters {
  pthread_mutex_t lock;
  uint64_t capacity; /* bytes the device offers; TFL_MemoryStats.total_bytes */
  TFL_MemoryStats stats;
} TFLH_MemoryCounters;

#define TFLH_MEMORY_COUNTERS_INIT(capacity_bytes) \
  {PTHREAD_MUTEX_INITIALIZER, (capacity_bytes), {0, 0, 0, 0, 0, 0, 0, 0}}

/* Call before allocating nbytes on `device`: counts them as allocated, or,
 * when they would exceed the capacity, counts an OOM and returns the
 * OUT_OF_MEMORY error (nothing else changes). When the allocation then
 * fails after all, undo with tflh_memory_unreserve. Thread-safe. */
static inline TFL_Error* tflh_memory_reserve(TFLH_MemoryCounters* c,
                                             int32_t device, size_t nbytes) {
  uint64_t in_use;
  pthread_mutex_lock(&c->lock);
  in_use = c->stats.allocated_bytes;
  if (nbytes > c->capacity - in_use) {
    c->stats.num_ooms++;
    pthread_mutex_unlock(&c->lock);
    return tflh_error(TFL_ERROR_OUT_OF_MEMORY,
                      TFLH_PLUGIN_NAME
                      ": cannot allocate %zu bytes on device %d "
                      "(%llu of %llu in use)",
                      nbytes, (int)device, (unsigned long long)in_use,
                      (unsigned long long)c->capacity);
  }
  c->stats.allocated_bytes += nbytes;
  if (c->stats.allocated_bytes > c->stats.peak_allocated_bytes)
    c->stats.peak_allocated_bytes = c->stats.allocated_bytes;
  c->stats.num_allocations++;
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

/* Undoes a tflh_memory_reserve whose allocation failed (the peak keeps it).
 * Thread-safe. */
static inline void tflh_memory_unreserve(TFLH_MemoryCounters* c,
                                         size_t nbytes) {
  pthread_mutex_lock(&c->lock);
  c->stats.allocated_bytes -= nbytes;
  c->stats.num_allocations--;
  pthread_mutex_unlock(&c->lock);
}

/* Call when nbytes allocated through tflh_memory_reserve are freed.
 * Thread-safe. */
static inline void tflh_memory_release(TFLH_MemoryCounters* c, size_t nbytes) {
  pthread_mutex_lock(&c->lock);
  c->stats.allocated_bytes -= nbytes;
  c->stats.num_frees++;
  pthread_mutex_unlock(&c->lock);
}

/* Fills `out` for the memory_stats entry: a consistent snapshot, written
 * only as far as the caller's out->struct_size covers (struct_size itself
 * unchanged). `out` is borrowed. Thread-safe. */
static inline TFL_Error* tflh_memory_stats(TFLH_MemoryCounters* c,
                                           TFL_MemoryStats* out) {
  TFL_MemoryStats snapshot;
  size_t size;
  pthread_mutex_lock(&c->lock);
  snapshot = c->stats;
  snapshot.total_bytes = c->capacity;
  pthread_mutex_unlock(&c->lock);
  snapshot.reserved_bytes = snapshot.allocated_bytes;
  size = out->struct_size < sizeof snapshot ? out->struct_size : sizeof snapshot;
  snapshot.struct_size = out->struct_size;
  memcpy(out, &snapshot, size);
  return NULL;
}

/* For the reset_peak_memory_stats entry: the peak becomes what is in use
 * now. Thread-safe. */
static inline TFL_Error* tflh_memory_reset_peak(TFLH_MemoryCounters* c) {
  pthread_mutex_lock(&c->lock);
  c->stats.peak_allocated_bytes = c->stats.allocated_bytes;
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* 4. Device addresses for handle-based memory                              */
/* ------------------------------------------------------------------------ */

/* For a runtime whose buffers are handles (OpenCL's cl_mem, Vulkan's
 * VkBuffer) rather than addresses: the address-map scheme of
 * docs/plugin-abi.md, "Handle-based memory". Each allocation reserves a
 * range of the process' address space (mmap PROT_NONE: no memory committed,
 * never handed to anything else while reserved, a fault if host code
 * dereferences it); the range's start is the pointer allocate returns, and
 * any address the host derives from it resolves to (handle, offset).
 *
 *   static TFLH_AddressMap addresses = TFLH_ADDRESS_MAP_INIT;
 *   allocate:   create the buffer, then tflh_address_insert(&addresses,
 *               nbytes, buffer, out_ptr)
 *   kernels, copies, set_memory: tflh_address_resolve(&addresses, ptr,
 *               nbytes, &buffer, &offset)
 *   deallocate: tflh_address_remove(&addresses, ptr, &buffer), then
 *               release the buffer
 *
 * Lookups are a binary search under a mutex. Every function is
 * thread-safe. */

typedef struct TFLH_AddressRange {
  uintptr_t start;
  size_t length; /* reserved bytes: nbytes rounded up to whole pages */
  void* handle;
} TFLH_AddressRange;

typedef struct TFLH_AddressMap {
  pthread_mutex_t lock;
  TFLH_AddressRange* ranges; /* sorted by start */
  size_t count, capacity;
} TFLH_AddressMap;

#define TFLH_ADDRESS_MAP_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0}

/* Reserves `length` bytes of inaccessible address space; NULL on failure.
 * MAP_ANONYMOUS is not POSIX before 2024: without it, /dev/zero serves. */
static inline void* tflh_address_reserve(size_t length) {
  void* p;
  int flags = MAP_PRIVATE;
#if defined(MAP_NORESERVE)
  flags |= MAP_NORESERVE;
#endif
#if defined(MAP_ANONYMOUS)
  p = mmap(NULL, length, PROT_NONE, flags | MAP_ANONYMOUS, -1, 0);
#else
  {
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0) return NULL;
    p = mmap(NULL, length, PROT_NONE, flags, fd, 0);
    close(fd);
  }
#endif
  return p == MAP_FAILED ? NULL : p;
}

/* Index of the first range whose start is > addr. Caller holds the lock. */
static inline size_t tflh_address_upper(const TFLH_AddressMap* m,
                                        uintptr_t addr) {
  size_t lo = 0, hi = m->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (m->ranges[mid].start <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* A fresh range of at least nbytes (0 allowed) for `handle`; its start,
 * page-aligned, goes to *out_ptr. OUT_OF_MEMORY when the address space or
 * the map's own memory runs out. */
static inline TFL_Error* tflh_address_insert(TFLH_AddressMap* m, size_t nbytes,
                                             void* handle, void** out_ptr) {
  long page = sysconf(_SC_PAGESIZE);
  size_t unit = page > 0 ? (size_t)page : 4096;
  size_t length = (nbytes == 0 ? 1 : nbytes);
  void* start;
  size_t at;
  if (length > SIZE_MAX - unit) {
    return tflh_error(TFL_ERROR_OUT_OF_MEMORY,
                      TFLH_PLUGIN_NAME ": %zu bytes cannot be reserved",
                      nbytes);
  }
  length = (length + unit - 1) / unit * unit;
  start = tflh_address_reserve(length);
  if (start == NULL) {
    return tflh_error(
        TFL_ERROR_OUT_OF_MEMORY,
        TFLH_PLUGIN_NAME
        ": cannot reserve %zu bytes of address space for an allocation",
        length);
  }
  pthread_mutex_lock(&m->lock);
  if (m->count == m->capacity) {
    size_t capacity = m->capacity == 0 ? 64 : m->capacity * 2;
    TFLH_AddressRange* grown = (TFLH_AddressRange*)realloc(
        m->ranges, capacity * sizeof(TFLH_AddressRange));
    if (grown == NULL) {
      pthread_mutex_unlock(&m->lock);
      munmap(start, length);
      return tflh_error(TFL_ERROR_OUT_OF_MEMORY, TFLH_PLUGIN_NAME
                        ": out of host memory for the address map");
    }
    m->ranges = grown;
    m->capacity = capacity;
  }
  at = tflh_address_upper(m, (uintptr_t)start);
  memmove(&m->ranges[at + 1], &m->ranges[at],
          (m->count - at) * sizeof(TFLH_AddressRange));
  m->ranges[at].start = (uintptr_t)start;
  m->ranges[at].length = length;
  m->ranges[at].handle = handle;
  m->count++;
  pthread_mutex_unlock(&m->lock);
  *out_ptr = start;
  return NULL;
}

/* Releases the range that starts at `ptr` and sets *out_handle to its
 * handle. INVALID_ARGUMENT when no range starts there (a pointer insert did
 * not return, or one already removed). */
static inline TFL_Error* tflh_address_remove(TFLH_AddressMap* m, void* ptr,
                                             void** out_handle) {
  size_t at;
  pthread_mutex_lock(&m->lock);
  at = tflh_address_upper(m, (uintptr_t)ptr);
  if (at == 0 || m->ranges[at - 1].start != (uintptr_t)ptr) {
    pthread_mutex_unlock(&m->lock);
    return tflh_error(
        TFL_ERROR_INVALID_ARGUMENT,
        TFLH_PLUGIN_NAME ": %p is not an allocation of this plugin", ptr);
  }
  at--;
  *out_handle = m->ranges[at].handle;
  munmap((void*)m->ranges[at].start, m->ranges[at].length);
  memmove(&m->ranges[at], &m->ranges[at + 1],
          (m->count - at - 1) * sizeof(TFLH_AddressRange));
  m->count--;
  pthread_mutex_unlock(&m->lock);
  return NULL;
}

/* The handle of the range holding [ptr, ptr + nbytes) and ptr's offset in
 * it. INVALID_ARGUMENT, naming the address, when ptr is in no range or the
 * bytes run past its end. */
static inline TFL_Error* tflh_address_resolve(TFLH_AddressMap* m,
                                              const void* ptr, size_t nbytes,
                                              void** out_handle,
                                              size_t* out_offset) {
  uintptr_t addr = (uintptr_t)ptr;
  size_t at;
  const TFLH_AddressRange* r;
  pthread_mutex_lock(&m->lock);
  at = tflh_address_upper(m, addr);
  r = at == 0 ? NULL : &m->ranges[at - 1];
  if (r == NULL || addr - r->start >= r->length) {
    pthread_mutex_unlock(&m->lock);
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      TFLH_PLUGIN_NAME
                      ": %p is not a device address of this plugin (freed, or "
                      "never allocated)",
                      ptr);
  }
  if (nbytes > r->length - (addr - r->start)) {
    size_t reserved = r->length;
    pthread_mutex_unlock(&m->lock);
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      TFLH_PLUGIN_NAME
                      ": %zu bytes at %p run past the end of their allocation "
                      "(%zu bytes reserved)",
                      nbytes, ptr, reserved);
  }
  *out_handle = r->handle;
  *out_offset = (size_t)(addr - r->start);
  pthread_mutex_unlock(&m->lock);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* 5. Activity records (ABI 1.8)                                            */
/* ------------------------------------------------------------------------ */

/* For the TFL_Activity table (plugin.h, "Activity records and ranges"): a
 * buffer of complete records, bounded, under a mutex, with the enabled kinds
 * beside it for a lock-free check on every call.
 *
 *   static TFL_ActivityRecord storage[4096];
 *   static TFLH_ActivityBuffer activity =
 *       TFLH_ACTIVITY_BUFFER_INIT(storage, 4096);
 *   activity_enable:          tflh_activity_enable(&activity, kinds)
 *   activity_set_correlation: tflh_activity_set_correlation(id)
 *   activity_drain:           tflh_activity_drain_into(&activity, records,
 *                             record_size, capacity, out_written, out_dropped)
 *   around a native call:     when tflh_activity_enabled(&activity,
 *                             TFL_ACTIVITY_API), tflh_activity_host_now_ns()
 *                             before and after, then tflh_activity_append
 *                             with TFL_ACTIVITY_HOST_CLOCK
 *   range_push / range_pop / range_mark: tflh_activity_range_push(&activity,
 *                             name), tflh_activity_range_pop(&activity),
 *                             tflh_activity_range_mark(&activity, name)
 *
 * The buffer holds complete records only (their end known): a plugin whose
 * device work finishes later keeps that work's records itself and appends
 * each once its end time is known. activity_clock is the plugin's own: it
 * reads its device's clock and tflh_activity_host_now_ns() together.
 *
 * The correlation id and the range stack are thread-local variables inside
 * static functions, so each translation unit including this file has its
 * own: call tflh_activity_set_correlation, tflh_activity_correlation and
 * the range functions from one translation unit (the one defining the
 * activity table), or wrap them in functions of your own. */

#if defined(TFLH_THREAD_LOCAL)
/* Defined by the build. */
#elif defined(__cplusplus) && __cplusplus >= 201103L
#define TFLH_THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define TFLH_THREAD_LOCAL _Thread_local
#elif defined(__GNUC__) || defined(__clang__)
#define TFLH_THREAD_LOCAL __thread
#elif defined(_MSC_VER)
#define TFLH_THREAD_LOCAL __declspec(thread)
#else
#error "torch_fl/plugin_helpers.h: #define TFLH_THREAD_LOCAL as your compiler's thread-local storage class"
#endif

/* The kinds mask is read on every call without the lock: a relaxed atomic
 * load where the compiler has one, else a volatile 32-bit load. */
#if defined(__GNUC__) || defined(__clang__)
#define TFLH_LOAD_RELAXED_U32(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define TFLH_STORE_RELAXED_U32(p, v) \
  __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#else
#define TFLH_LOAD_RELAXED_U32(p) (*(const volatile uint32_t*)(p))
#define TFLH_STORE_RELAXED_U32(p, v) (*(volatile uint32_t*)(p) = (v))
#endif

#ifndef TFLH_ACTIVITY_RANGE_DEPTH
#define TFLH_ACTIVITY_RANGE_DEPTH 64
#endif

/* A kind's bit in the mask activity_enable takes. */
#define TFLH_ACTIVITY_BIT(kind) (1u << (kind))

/* A ring of `capacity` records in `records` (the oldest at `head`), the
 * kinds enabled, and the records lost to the bound since the last drain.
 * Initialize with TFLH_ACTIVITY_BUFFER_INIT (static storage) or
 * tflh_activity_init. Every function below is thread-safe. */
typedef struct TFLH_ActivityBuffer {
  pthread_mutex_t lock;
  uint32_t kinds; /* read and written relaxed, without the lock */
  int32_t owned;  /* `records` came from tflh_activity_init */
  TFL_ActivityRecord* records;
  size_t capacity, head, count;
  uint64_t dropped;
} TFLH_ActivityBuffer;

/* A buffer over a static array `storage` of `capacity` records, recording
 * nothing until tflh_activity_enable. */
#define TFLH_ACTIVITY_BUFFER_INIT(storage, capacity) \
  {PTHREAD_MUTEX_INITIALIZER, 0u, 0, (storage), (capacity), 0, 0, 0}

/* Initializes `buf` with room for `capacity` records (allocated), recording
 * nothing until tflh_activity_enable. OUT_OF_MEMORY when they cannot be
 * allocated (`buf` is then unusable). Release with tflh_activity_destroy. */
static inline TFL_Error* tflh_activity_init(TFLH_ActivityBuffer* buf,
                                            size_t capacity) {
  memset(buf, 0, sizeof *buf);
  if (capacity > 0) {
    buf->records =
        (TFL_ActivityRecord*)calloc(capacity, sizeof(TFL_ActivityRecord));
    if (buf->records == NULL) {
      return tflh_error(TFL_ERROR_OUT_OF_MEMORY,
                        TFLH_PLUGIN_NAME
                        ": cannot allocate %zu activity records",
                        capacity);
    }
  }
  if (pthread_mutex_init(&buf->lock, NULL) != 0) {
    free(buf->records);
    buf->records = NULL;
    return tflh_error(TFL_ERROR_INTERNAL,
                      TFLH_PLUGIN_NAME ": cannot initialize a mutex");
  }
  buf->owned = 1;
  buf->capacity = capacity;
  return NULL;
}

/* Releases what tflh_activity_init allocated; the records still staged are
 * lost. Not to be called while another thread uses `buf`. */
static inline void tflh_activity_destroy(TFLH_ActivityBuffer* buf) {
  if (!buf->owned) return;
  pthread_mutex_destroy(&buf->lock);
  free(buf->records);
  buf->records = NULL;
  buf->capacity = buf->count = buf->head = 0;
  buf->owned = 0;
}

/* The enabled kinds: one relaxed load, the whole cost of a recording site
 * while recording is off. */
static inline uint32_t tflh_activity_kinds(const TFLH_ActivityBuffer* buf) {
  return TFLH_LOAD_RELAXED_U32(&buf->kinds);
}

/* Whether records of `kind` (a TFL_ActivityKind) are wanted now. */
static inline int tflh_activity_enabled(const TFLH_ActivityBuffer* buf,
                                        uint32_t kind) {
  return kind < 32 && (tflh_activity_kinds(buf) & TFLH_ACTIVITY_BIT(kind)) != 0;
}

/* The activity_enable entry's body: records the kinds in `kinds` from now
 * on, 0 stops; INVALID_ARGUMENT for a bit outside TFL_ACTIVITY_ALL_KINDS
 * (nothing changes then). */
static inline TFL_Error* tflh_activity_enable(TFLH_ActivityBuffer* buf,
                                              uint32_t kinds) {
  if ((kinds & ~(uint32_t)TFL_ACTIVITY_ALL_KINDS) != 0) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      TFLH_PLUGIN_NAME
                      ": activity_enable: kinds 0x%x has bits outside "
                      "TFL_ACTIVITY_ALL_KINDS (0x%x)",
                      (unsigned)kinds, (unsigned)TFL_ACTIVITY_ALL_KINDS);
  }
  TFLH_STORE_RELAXED_U32(&buf->kinds, kinds);
  return NULL;
}

/* The host's CLOCK_MONOTONIC in nanoseconds: the clock of records flagged
 * TFL_ACTIVITY_HOST_CLOCK and of activity_clock's host time (0 if it
 * cannot be read). */
static inline uint64_t tflh_activity_host_now_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0;
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Copies `src` (NULL: empty) into `dst` of `size` bytes, NUL-terminated,
 * truncated before a UTF-8 sequence it would cut. */
static inline void tflh_activity_copy_text(char* dst, size_t size,
                                           const char* src) {
  size_t n = 0;
  if (size == 0) return;
  if (src != NULL) {
    while (n < size - 1 && src[n] != '\0') n++;
    if (src[n] != '\0') {
      /* Truncated: step back over a partly copied multi-byte character. */
      while (n > 0 && ((unsigned char)src[n] & 0xC0u) == 0x80u) n--;
    }
    memcpy(dst, src, n);
  }
  memset(dst + n, 0, size - n);
}

/* Stages one complete record (start_ns <= end_ns; an earlier end is raised
 * to the start). `name` and `detail` (NULL: empty) are copied, truncated to
 * their arrays. When the buffer is full the record is counted as dropped
 * instead (the next drain reports it). The caller decides what to record:
 * check tflh_activity_enabled first, and read clocks only then. Returns 1
 * when staged, 0 when dropped. */
static inline int tflh_activity_append(TFLH_ActivityBuffer* buf, uint32_t kind,
                                       uint32_t flags, int32_t device,
                                       TFL_Stream* stream, uint64_t correlation,
                                       uint64_t start_ns, uint64_t end_ns,
                                       const char* name, const char* detail) {
  TFL_ActivityRecord* r;
  pthread_mutex_lock(&buf->lock);
  if (buf->count >= buf->capacity) {
    buf->dropped++;
    pthread_mutex_unlock(&buf->lock);
    return 0;
  }
  r = &buf->records[(buf->head + buf->count) % buf->capacity];
  buf->count++;
  memset(r, 0, sizeof *r);
  r->struct_size = sizeof *r;
  r->kind = kind;
  r->flags = flags;
  r->device = device;
  r->stream = stream;
  r->correlation_id = correlation;
  r->start_ns = start_ns;
  r->end_ns = end_ns < start_ns ? start_ns : end_ns;
  tflh_activity_copy_text(r->name, sizeof r->name, name);
  tflh_activity_copy_text(r->detail, sizeof r->detail, detail);
  pthread_mutex_unlock(&buf->lock);
  return 1;
}

/* The activity_drain entry's body (plugin.h, "Buffers"): moves up to
 * `capacity` records, oldest first, to `records` (record i at
 * (char*)records + i * record_size), writing min(record_size,
 * sizeof(TFL_ActivityRecord)) bytes of each with struct_size set to that;
 * *out_written gets how many, *out_dropped how many were lost to the bound
 * since the previous drain. INVALID_ARGUMENT (nothing moves) for a
 * record_size below the 1.8 size of TFL_ActivityRecord, a NULL output, or
 * NULL records with a nonzero capacity. */
static inline TFL_Error* tflh_activity_drain_into(TFLH_ActivityBuffer* buf,
                                                  TFL_ActivityRecord* records,
                                                  size_t record_size,
                                                  size_t capacity,
                                                  size_t* out_written,
                                                  uint64_t* out_dropped) {
  size_t minimum = TFL_STRUCT_SIZE(TFL_ActivityRecord, detail);
  size_t bytes = record_size < sizeof(TFL_ActivityRecord)
                     ? record_size
                     : sizeof(TFL_ActivityRecord);
  size_t n = 0;
  if (record_size < minimum) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      TFLH_PLUGIN_NAME
                      ": activity_drain: record_size %zu is below the ABI "
                      "1.8 size of TFL_ActivityRecord (%zu)",
                      record_size, minimum);
  }
  if (out_written == NULL || out_dropped == NULL ||
      (records == NULL && capacity > 0)) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      TFLH_PLUGIN_NAME
                      ": activity_drain: records, out_written or out_dropped "
                      "is NULL");
  }
  pthread_mutex_lock(&buf->lock);
  while (n < capacity && buf->count > 0) {
    TFL_ActivityRecord r = buf->records[buf->head];
    r.struct_size = bytes;
    memcpy((char*)records + n * record_size, &r, bytes);
    buf->head = (buf->head + 1) % buf->capacity;
    buf->count--;
    n++;
  }
  *out_dropped = buf->dropped;
  buf->dropped = 0;
  pthread_mutex_unlock(&buf->lock);
  *out_written = n;
  return NULL;
}

/* The calling thread's correlation id (see the note above on translation
 * units). */
static inline uint64_t* tflh_activity_correlation_slot(void) {
  static TFLH_THREAD_LOCAL uint64_t id;
  return &id;
}

/* The activity_set_correlation entry's body: the id the calling thread's
 * records carry from now on (0: none). Never fails, never blocks. */
static inline void tflh_activity_set_correlation(uint64_t id) {
  *tflh_activity_correlation_slot() = id;
}

/* The calling thread's correlation id, for the records it makes. */
static inline uint64_t tflh_activity_correlation(void) {
  return *tflh_activity_correlation_slot();
}

/* The calling thread's open ranges: the first TFLH_ACTIVITY_RANGE_DEPTH
 * are kept; deeper ones are only counted, so that pops still pair. */
typedef struct TFLH_ActivityRange {
  uint64_t start_ns;
  int32_t recording; /* RANGE was on at the push */
  char name[TFL_ACTIVITY_NAME_BYTES];
} TFLH_ActivityRange;

typedef struct TFLH_ActivityRangeStack {
  size_t depth;
  TFLH_ActivityRange open[TFLH_ACTIVITY_RANGE_DEPTH];
} TFLH_ActivityRangeStack;

static inline TFLH_ActivityRangeStack* tflh_activity_range_stack(void) {
  static TFLH_THREAD_LOCAL TFLH_ActivityRangeStack stack;
  return &stack;
}

/* The range_push entry's body: opens a range named `name` (borrowed for
 * the call; NULL: empty) on the calling thread. No allocation, no lock. */
static inline void tflh_activity_range_push(TFLH_ActivityBuffer* buf,
                                            const char* name) {
  TFLH_ActivityRangeStack* s = tflh_activity_range_stack();
  if (s->depth < TFLH_ACTIVITY_RANGE_DEPTH) {
    TFLH_ActivityRange* r = &s->open[s->depth];
    r->recording = tflh_activity_enabled(buf, TFL_ACTIVITY_RANGE);
    if (r->recording) {
      r->start_ns = tflh_activity_host_now_ns();
      tflh_activity_copy_text(r->name, sizeof r->name, name);
    }
  }
  s->depth++;
}

/* The range_pop entry's body: closes the calling thread's innermost range
 * (none open: nothing), staging a TFL_ACTIVITY_RANGE record when RANGE was
 * on at its push and still is. */
static inline void tflh_activity_range_pop(TFLH_ActivityBuffer* buf) {
  TFLH_ActivityRangeStack* s = tflh_activity_range_stack();
  TFLH_ActivityRange* r;
  if (s->depth == 0) return;
  s->depth--;
  if (s->depth >= TFLH_ACTIVITY_RANGE_DEPTH) return;
  r = &s->open[s->depth];
  if (r->recording && tflh_activity_enabled(buf, TFL_ACTIVITY_RANGE)) {
    tflh_activity_append(buf, TFL_ACTIVITY_RANGE, TFL_ACTIVITY_HOST_CLOCK, -1,
                         NULL, tflh_activity_correlation(), r->start_ns,
                         tflh_activity_host_now_ns(), r->name, NULL);
  }
}

/* The range_mark entry's body: a TFL_ACTIVITY_MARK record (start == end)
 * when MARK is on. */
static inline void tflh_activity_range_mark(TFLH_ActivityBuffer* buf,
                                            const char* name) {
  uint64_t now;
  if (!tflh_activity_enabled(buf, TFL_ACTIVITY_MARK)) return;
  now = tflh_activity_host_now_ns();
  tflh_activity_append(buf, TFL_ACTIVITY_MARK, TFL_ACTIVITY_HOST_CLOCK, -1,
                       NULL, tflh_activity_correlation(), now, now, name,
                       NULL);
}

/* ------------------------------------------------------------------------ */
/* The op table                                                             */
/* ------------------------------------------------------------------------ */

/* A TFL_OpEntry for the kernel `symbol`, exported under its own name (see
 * TFL_KERNEL_SYMBOL_PREFIX for the naming rule), no flags, no schema, no
 * shape function: TFLH_OP("add.Tensor", torch_fl_op_add_Tensor). */
#define TFLH_OP(name, symbol)                                               \
  {TFL_STRUCT_SIZE(TFL_OpEntry, infer_outputs), name, #symbol, symbol, 0, \
   NULL, NULL}

/* Fills `out` for the get_op_table entry with a static array of
 * num_entries entries (which must outlive the process), as far as
 * out->struct_size covers. Thread-safe. */
static inline TFL_Error* tflh_op_table(TFL_OpTable* out,
                                       const TFL_OpEntry* entries,
                                       size_t num_entries) {
  if (TFL_HAS_FIELD(TFL_OpTable, entries, out->struct_size))
    out->entries = entries;
  if (TFL_HAS_FIELD(TFL_OpTable, num_entries, out->struct_size))
    out->num_entries = num_entries;
  if (TFL_HAS_FIELD(TFL_OpTable, entry_size, out->struct_size))
    out->entry_size = sizeof(TFL_OpEntry);
  return NULL;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TORCH_FL_PLUGIN_HELPERS_H_ */

/*
 * A complete torch-fl plugin in plain C99 + POSIX: one synchronous "device"
 * backed by host memory and five float32 kernels.
 *
 * It is the smallest thing a vendor can copy to start a port: every required
 * entry of the ABI is here, each one doing the simplest correct thing. Build:
 *
 *   cc -std=c99 -O2 -fPIC -shared -I <torch-fl>/crates/torchfl-ffi/include \
 *      minimal_plugin.c -o libtorchfl_minimal.so -lpthread
 *
 * then `torchfl-abi verify ./libtorchfl_minimal.so`.
 *
 * Memory is plain host memory, so the plugin sets
 * TFL_CAP_HOST_ADDRESSABLE_MEMORY; work runs synchronously on the calling
 * thread, so it does not set TFL_CAP_ASYNC_STREAMS and its streams and events
 * are bookkeeping only.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "torch_fl/plugin.h"

#define MINIMAL_ALIGNMENT 64
#ifndef MINIMAL_CAPACITY
#define MINIMAL_CAPACITY ((uint64_t)256 << 20) /* bytes, one device */
#endif

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

struct TFL_Error {
  int32_t code;
  char message[256];
};

/* Returned when even the error cannot be allocated; never freed. */
static TFL_Error g_alloc_failed = {TFL_ERROR_OUT_OF_MEMORY,
                                   "minimal: out of host memory"};

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static TFL_Error* make_error(int32_t code, const char* fmt, ...) {
  TFL_Error* e = (TFL_Error*)malloc(sizeof(TFL_Error));
  va_list ap;
  if (e == NULL) return &g_alloc_failed;
  e->code = code;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return e;
}

static int32_t error_code(const TFL_Error* e) { return e->code; }
static const char* error_message(const TFL_Error* e) { return e->message; }
static void error_destroy(TFL_Error* e) {
  if (e != NULL && e != &g_alloc_failed) free(e);
}

/* ------------------------------------------------------------------------ */
/* Identity and lifecycle                                                   */
/* ------------------------------------------------------------------------ */

static const TFL_HostApi* g_host;
static int g_initialized;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static const TFL_PluginInfo g_info = {
    TFL_STRUCT_SIZE(TFL_PluginInfo, capabilities),
    "minimal_c",
    "torch-fl examples",
    "host-memory",
    "0.1.0",
    NULL,
    TFL_CAP_HOST_ADDRESSABLE_MEMORY | TFL_CAP_EVENT_TIMING,
};

static const TFL_PluginInfo* get_info(void) { return &g_info; }

static TFL_Error* initialize(const TFL_InitArgs* args) {
  TFL_Error* err = NULL;
  if (args != NULL && args->options != NULL && args->options[0] != '\0') {
    return make_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: takes no options, got \"%s\"", args->options);
  }
  pthread_mutex_lock(&g_lock);
  if (g_initialized) {
    err = make_error(TFL_ERROR_FAILED_PRECONDITION,
                     "minimal_c: initialize called twice");
  }
  g_initialized = 1;
  pthread_mutex_unlock(&g_lock);
  /* Host services are versioned too: check before using one. */
  if (err == NULL && g_host != NULL &&
      TFL_HAS_FIELD(TFL_HostApi, log, g_host->struct_size) && g_host->log) {
    g_host->log(g_host->context, TFL_LOG_DEBUG, "minimal_c: initialized");
  }
  return err;
}

static TFL_Error* check_device(int32_t device) {
  if (device != 0) {
    return make_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: device %d out of range (device_count = 1)",
                      (int)device);
  }
  return NULL;
}

static TFL_Error* device_count(int32_t* out) {
  *out = 1;
  return NULL;
}

static TFL_Error* device_properties(int32_t device, TFL_DeviceProperties* out) {
  TFL_Error* err = check_device(device);
  if (err) return err;
  if (TFL_HAS_FIELD(TFL_DeviceProperties, name, out->struct_size))
    out->name = "minimal-c host device";
  if (TFL_HAS_FIELD(TFL_DeviceProperties, total_memory, out->struct_size))
    out->total_memory = MINIMAL_CAPACITY;
  if (TFL_HAS_FIELD(TFL_DeviceProperties, compute_units, out->struct_size))
    out->compute_units = 1;
  if (TFL_HAS_FIELD(TFL_DeviceProperties, memory_alignment, out->struct_size))
    out->memory_alignment = MINIMAL_ALIGNMENT;
  /* 1.2: a host at 1.0 or 1.1 passes a struct that ends before these. */
  if (TFL_HAS_FIELD(TFL_DeviceProperties, capability_minor, out->struct_size)) {
    out->capability_major = 1;
    out->capability_minor = 0;
  }
  return NULL;
}

static TFL_Error* device_synchronize(int32_t device) {
  return check_device(device); /* all work is synchronous */
}

/* ------------------------------------------------------------------------ */
/* Memory: host allocations with a header holding the size, for accounting */
/* ------------------------------------------------------------------------ */

static TFL_MemoryStats g_stats;

static TFL_Error* allocate(int32_t device, size_t nbytes, void** out) {
  TFL_Error* err = check_device(device);
  void* base = NULL;
  if (err) return err;
  pthread_mutex_lock(&g_lock);
  if (g_stats.allocated_bytes + nbytes > MINIMAL_CAPACITY) {
    g_stats.num_ooms++;
    pthread_mutex_unlock(&g_lock);
    return make_error(TFL_ERROR_OUT_OF_MEMORY,
                      "minimal_c: cannot allocate %zu bytes (%llu of %llu in use)",
                      nbytes, (unsigned long long)g_stats.allocated_bytes,
                      (unsigned long long)MINIMAL_CAPACITY);
  }
  if (posix_memalign(&base, MINIMAL_ALIGNMENT, nbytes + MINIMAL_ALIGNMENT) != 0) {
    pthread_mutex_unlock(&g_lock);
    return make_error(TFL_ERROR_OUT_OF_MEMORY,
                      "minimal_c: host allocation of %zu bytes failed", nbytes);
  }
  *(size_t*)base = nbytes;
  g_stats.allocated_bytes += nbytes;
  if (g_stats.allocated_bytes > g_stats.peak_allocated_bytes)
    g_stats.peak_allocated_bytes = g_stats.allocated_bytes;
  g_stats.num_allocations++;
  pthread_mutex_unlock(&g_lock);
  *out = (char*)base + MINIMAL_ALIGNMENT;
  return NULL;
}

static TFL_Error* deallocate(int32_t device, void* ptr) {
  TFL_Error* err = check_device(device);
  char* base;
  if (err || ptr == NULL) return err;
  base = (char*)ptr - MINIMAL_ALIGNMENT;
  pthread_mutex_lock(&g_lock);
  g_stats.allocated_bytes -= *(size_t*)base;
  g_stats.num_frees++;
  pthread_mutex_unlock(&g_lock);
  free(base);
  return NULL;
}

static TFL_Error* copy(const TFL_CopyArgs* args) {
  /* Every pointer is host memory, so every kind of copy is a memmove. */
  if (args->nbytes > 0) memmove(args->dst, args->src, args->nbytes);
  return NULL;
}

static TFL_Error* set_memory(int32_t device, void* ptr, uint8_t value,
                             size_t nbytes, TFL_Stream* stream) {
  TFL_Error* err = check_device(device);
  (void)stream; /* synchronous device: every stream is already in order */
  if (err) return err;
  memset(ptr, value, nbytes);
  return NULL;
}

static TFL_Error* memory_stats(int32_t device, TFL_MemoryStats* out) {
  TFL_Error* err = check_device(device);
  size_t size;
  TFL_MemoryStats snapshot;
  if (err) return err;
  pthread_mutex_lock(&g_lock);
  snapshot = g_stats;
  pthread_mutex_unlock(&g_lock);
  snapshot.reserved_bytes = snapshot.allocated_bytes;
  snapshot.total_bytes = MINIMAL_CAPACITY;
  /* Write only what the caller's struct_size covers. */
  size = out->struct_size < sizeof snapshot ? out->struct_size : sizeof snapshot;
  snapshot.struct_size = out->struct_size;
  memcpy(out, &snapshot, size);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Streams and events: bookkeeping only, as all work is synchronous         */
/* ------------------------------------------------------------------------ */

struct TFL_Stream {
  int is_default;
};
struct TFL_Event {
  uint32_t flags;
  int recorded;
  double time_ms;
};

static TFL_Stream g_default_stream = {1};

static TFL_Error* default_stream(int32_t device, TFL_Stream** out) {
  TFL_Error* err = check_device(device);
  if (err) return err;
  *out = &g_default_stream;
  return NULL;
}

static TFL_Error* stream_create(int32_t device, int32_t priority,
                                TFL_Stream** out) {
  TFL_Error* err = check_device(device);
  TFL_Stream* s;
  (void)priority;
  if (err) return err;
  s = (TFL_Stream*)calloc(1, sizeof *s);
  if (s == NULL) return &g_alloc_failed;
  *out = s;
  return NULL;
}

static TFL_Error* stream_destroy(TFL_Stream* s) {
  if (s->is_default) {
    return make_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: the default stream cannot be destroyed");
  }
  free(s);
  return NULL;
}

static TFL_Error* stream_synchronize(TFL_Stream* s) {
  (void)s;
  return NULL;
}

static TFL_Error* stream_query(TFL_Stream* s, uint8_t* done) {
  (void)s;
  *done = 1;
  return NULL;
}

static TFL_Error* stream_wait_event(TFL_Stream* s, TFL_Event* e) {
  (void)s;
  (void)e;
  return NULL;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static TFL_Error* event_create(int32_t device, uint32_t flags, TFL_Event** out) {
  TFL_Error* err = check_device(device);
  TFL_Event* e;
  if (err) return err;
  e = (TFL_Event*)calloc(1, sizeof *e);
  if (e == NULL) return &g_alloc_failed;
  e->flags = flags;
  *out = e;
  return NULL;
}

static TFL_Error* event_destroy(TFL_Event* e) {
  free(e);
  return NULL;
}

static TFL_Error* event_record(TFL_Event* e, TFL_Stream* s) {
  (void)s;
  e->recorded = 1;
  e->time_ms = now_ms();
  return NULL;
}

static TFL_Error* event_query(TFL_Event* e, uint8_t* done) {
  (void)e;
  *done = 1;
  return NULL;
}

static TFL_Error* event_synchronize(TFL_Event* e) {
  (void)e;
  return NULL;
}

static TFL_Error* event_elapsed_time(TFL_Event* start, TFL_Event* end,
                                     float* out_ms) {
  if (!(start->flags & TFL_EVENT_TIMING) || !(end->flags & TFL_EVENT_TIMING)) {
    return make_error(TFL_ERROR_FAILED_PRECONDITION,
                      "minimal_c: both events need TFL_EVENT_TIMING");
  }
  if (!start->recorded || !end->recorded) {
    return make_error(TFL_ERROR_FAILED_PRECONDITION,
                      "minimal_c: both events must be recorded first");
  }
  *out_ms = (float)(end->time_ms - start->time_ms);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Kernels: float32, any strides, broadcasting of inputs to the output      */
/* ------------------------------------------------------------------------ */

#define MAX_DIMS 16

static int is_f32(const TFL_Tensor* t) {
  return t->dtype.code == TFL_DTYPE_FLOAT && t->dtype.bits == 32 &&
         t->dtype.lanes == 1;
}

/* Fetches argument `i` as a tensor, or reports why it is not one. */
static TFL_Error* tensor_arg(const TFL_CallFrame* f, size_t i,
                             const TFL_Tensor** out) {
  if (i >= f->num_args || f->args[i]->tag != TFL_VALUE_TENSOR) {
    return make_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: %s: argument %zu must be a tensor", f->op_name, i);
  }
  *out = f->args[i]->u.tensor;
  if ((*out)->ndim > MAX_DIMS) {
    return make_error(TFL_ERROR_UNIMPLEMENTED, "minimal_c: %s: more than %d dims",
                      f->op_name, MAX_DIMS);
  }
  if (!is_f32(*out)) {
    return make_error(TFL_ERROR_UNIMPLEMENTED,
                      "minimal_c: %s: only float32 is implemented", f->op_name);
  }
  return NULL;
}

static double scalar_value(const TFL_Scalar* s) {
  switch (s->kind) {
    case TFL_SCALAR_INT: return (double)s->v.i;
    case TFL_SCALAR_BOOL: return s->v.b ? 1.0 : 0.0;
    default: return s->v.f;
  }
}

/* Element strides of `t` seen through `out`'s shape: right-aligned, with
 * stride 0 for broadcast dimensions. Fails when shapes do not broadcast. */
static int broadcast_strides(const TFL_Tensor* t, const TFL_Tensor* out,
                             int64_t* strides) {
  int d;
  for (d = 0; d < out->ndim; ++d) {
    int td = d - (out->ndim - t->ndim);
    strides[d] = 0;
    if (td < 0) continue;
    if (t->shape[td] == out->shape[d]) {
      strides[d] = t->strides[td];
    } else if (t->shape[td] != 1) {
      return 0;
    }
  }
  return t->ndim <= out->ndim;
}

static float* element(const TFL_Tensor* t) {
  return (float*)((char*)t->data + t->byte_offset);
}

typedef float (*BinaryFn)(float a, float b, float alpha);

static float add_fn(float a, float b, float alpha) { return a + alpha * b; }
static float mul_fn(float a, float b, float alpha) { (void)alpha; return a * b; }
static float neg_fn(float a, float b, float alpha) { (void)b; (void)alpha; return -a; }
static float relu_fn(float a, float b, float alpha) {
  (void)b;
  (void)alpha;
  return a > 0.0f ? a : 0.0f;
}

/* out = fn(a, b, alpha) elementwise; b may be NULL for unary ops. */
static TFL_Error* elementwise(const TFL_CallFrame* f, const TFL_Tensor* a,
                              const TFL_Tensor* b, float alpha, BinaryFn fn) {
  const TFL_Tensor* out;
  int64_t sa[MAX_DIMS], sb[MAX_DIMS], index[MAX_DIMS];
  int64_t numel = 1, i;
  int d;
  if (f->num_outputs != 1 || !is_f32(f->outputs[0])) {
    return make_error(TFL_ERROR_UNIMPLEMENTED,
                      "minimal_c: %s: needs one float32 output", f->op_name);
  }
  out = f->outputs[0];
  if (out->ndim > MAX_DIMS || !broadcast_strides(a, out, sa) ||
      (b != NULL && !broadcast_strides(b, out, sb))) {
    return make_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: %s: input shapes do not broadcast to the output",
                      f->op_name);
  }
  for (d = 0; d < out->ndim; ++d) {
    numel *= out->shape[d];
    index[d] = 0;
  }
  for (i = 0; i < numel; ++i) {
    int64_t oa = 0, ob = 0, oo = 0;
    for (d = 0; d < out->ndim; ++d) {
      oa += index[d] * sa[d];
      ob += index[d] * (b != NULL ? sb[d] : 0);
      oo += index[d] * out->strides[d];
    }
    element(out)[oo] = fn(element(a)[oa], b != NULL ? element(b)[ob] : 0.0f, alpha);
    for (d = out->ndim - 1; d >= 0; --d) {
      if (++index[d] < out->shape[d]) break;
      index[d] = 0;
    }
  }
  return NULL;
}

TFL_EXPORT TFL_Error* torch_fl_op_add_Tensor(const TFL_CallFrame* f) {
  const TFL_Tensor *a = NULL, *b = NULL;
  TFL_Error* err;
  if ((err = tensor_arg(f, 0, &a)) || (err = tensor_arg(f, 1, &b))) return err;
  if (f->num_args != 3 || f->args[2]->tag != TFL_VALUE_SCALAR) {
    return make_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: add.Tensor takes (self, other, alpha)");
  }
  return elementwise(f, a, b, (float)scalar_value(&f->args[2]->u.scalar), add_fn);
}

TFL_EXPORT TFL_Error* torch_fl_op_mul_Tensor(const TFL_CallFrame* f) {
  const TFL_Tensor *a = NULL, *b = NULL;
  TFL_Error* err;
  if ((err = tensor_arg(f, 0, &a)) || (err = tensor_arg(f, 1, &b))) return err;
  return elementwise(f, a, b, 1.0f, mul_fn);
}

TFL_EXPORT TFL_Error* torch_fl_op_neg(const TFL_CallFrame* f) {
  const TFL_Tensor* a = NULL;
  TFL_Error* err = tensor_arg(f, 0, &a);
  return err ? err : elementwise(f, a, NULL, 1.0f, neg_fn);
}

TFL_EXPORT TFL_Error* torch_fl_op_relu(const TFL_CallFrame* f) {
  const TFL_Tensor* a = NULL;
  TFL_Error* err = tensor_arg(f, 0, &a);
  return err ? err : elementwise(f, a, NULL, 1.0f, relu_fn);
}

static float fill_fn(float a, float b, float value) {
  (void)a;
  (void)b;
  return value;
}

/* fill_.Scalar(Tensor(a!) self, Scalar value): outputs[0] is self. */
TFL_EXPORT TFL_Error* torch_fl_op_fill__Scalar(const TFL_CallFrame* f) {
  const TFL_Tensor* self = NULL;
  TFL_Error* err = tensor_arg(f, 0, &self);
  if (err) return err;
  if (f->num_args != 2 || f->args[1]->tag != TFL_VALUE_SCALAR) {
    return make_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: fill_.Scalar takes (self, value)");
  }
  return elementwise(f, self, NULL, (float)scalar_value(&f->args[1]->u.scalar),
                     fill_fn);
}

#define OP(name, symbol) \
  {TFL_STRUCT_SIZE(TFL_OpEntry, infer_outputs), name, #symbol, symbol, 0, NULL, NULL}

static const TFL_OpEntry g_ops[] = {
    OP("add.Tensor", torch_fl_op_add_Tensor),
    OP("mul.Tensor", torch_fl_op_mul_Tensor),
    OP("neg", torch_fl_op_neg),
    OP("relu", torch_fl_op_relu),
    OP("fill_.Scalar", torch_fl_op_fill__Scalar),
};

static TFL_Error* get_op_table(TFL_OpTable* out) {
  if (TFL_HAS_FIELD(TFL_OpTable, entries, out->struct_size)) out->entries = g_ops;
  if (TFL_HAS_FIELD(TFL_OpTable, num_entries, out->struct_size))
    out->num_entries = sizeof g_ops / sizeof g_ops[0];
  if (TFL_HAS_FIELD(TFL_OpTable, entry_size, out->struct_size))
    out->entry_size = sizeof(TFL_OpEntry);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* The function table and the bootstrap symbol                              */
/* ------------------------------------------------------------------------ */

static const TFL_PluginApi g_api = {
    TFL_STRUCT_SIZE(TFL_PluginApi, get_collectives),
    TFL_ABI_VERSION_MAJOR,
    TFL_ABI_VERSION_MINOR,
    error_code,
    error_message,
    error_destroy,
    get_info,
    initialize,
    get_op_table,
    device_count,
    device_properties,
    device_synchronize,
    allocate,
    deallocate,
    copy,
    set_memory,
    default_stream,
    stream_create,
    stream_destroy,
    stream_synchronize,
    stream_query,
    stream_wait_event,
    event_create,
    event_destroy,
    event_record,
    event_query,
    event_synchronize,
    event_elapsed_time,
    memory_stats,
    NULL, /* reset_peak_memory_stats: optional, not implemented */
    NULL, /* empty_cache: optional, nothing is cached */
    NULL, /* get_collectives (1.3): optional; torch.distributed then stages
             collectives through host memory */
};

/* The test suite's fault-injection fixture includes this file and exports a
 * bootstrap of its own. */
#ifndef MINIMAL_PLUGIN_NO_BOOTSTRAP
TFL_EXPORT const TFL_PluginApi* torch_fl_plugin_get_api(const TFL_HostApi* host) {
  g_host = host;
  return &g_api;
}
#endif

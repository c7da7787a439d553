/*
 * The minimal_c accelerator plugin for torch-fl, in C99 + POSIX.
 *
 * Written by `torchfl-abi new minimal_c` as a starting point: one
 * synchronous device backed by host memory and five float32 kernels
 * (add.Tensor, mul.Tensor, neg, relu, fill_.Scalar), every required entry of
 * the ABI doing the simplest correct thing, enough to pass `torchfl-abi
 * verify`. Port it by replacing the memory entries with the device's
 * allocator and copies, and the kernels with launches on the device.
 *
 * Memory is plain host memory, so the plugin sets
 * TFL_CAP_HOST_ADDRESSABLE_MEMORY; work runs synchronously on the calling
 * thread, so it does not set TFL_CAP_ASYNC_STREAMS and its streams and events
 * are the helpers' bookkeeping. A device with asynchronous queues defines
 * TFLH_NO_SYNC_STREAMS, brings its own streams and events, and sets
 * TFL_CAP_ASYNC_STREAMS.
 *
 * It also records what each call did (ABI 1.8 activity records, for
 * torch_fl.trace and torch.profiler): a native-call record per launch, copy
 * and fill, the kernel's (copy's, fill's) execution on the device clock,
 * waits, and user ranges. A port records its runtime's calls there.
 *
 * The contract is include/torch_fl/plugin.h; include/torch_fl/plugin_helpers.h
 * provides the error objects, the synchronous streams and events, the
 * memory counters and the activity buffer used below. ./ci.sh builds and
 * checks it.
 */
#define _POSIX_C_SOURCE 200809L

#define TFLH_PLUGIN_NAME "minimal_c" /* starts every helper message */
#define TFLH_DEVICE_COUNT 1
#include "torch_fl/plugin.h"
#include "torch_fl/plugin_helpers.h"

#define PLUGIN_ALIGNMENT 64
#ifndef PLUGIN_CAPACITY
#define PLUGIN_CAPACITY ((uint64_t)256 << 20) /* bytes, one device */
#endif

/* ------------------------------------------------------------------------ */
/* Identity and lifecycle                                                   */
/* ------------------------------------------------------------------------ */

static const TFL_HostApi* g_host;
static int g_initialized;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static const TFL_PluginInfo g_info = {
    TFL_STRUCT_SIZE(TFL_PluginInfo, capabilities),
    "minimal_c",
    "minimal_c vendor",
    "host-memory",
    "0.1.0",
    NULL,
    TFL_CAP_HOST_ADDRESSABLE_MEMORY | TFL_CAP_EVENT_TIMING,
};

static const TFL_PluginInfo* get_info(void) { return &g_info; }

static TFL_Error* initialize(const TFL_InitArgs* args) {
  TFL_Error* err = NULL;
  if (args != NULL && args->options != NULL && args->options[0] != '\0') {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: takes no options, got \"%s\"", args->options);
  }
  pthread_mutex_lock(&g_lock);
  if (g_initialized) {
    err = tflh_error(TFL_ERROR_FAILED_PRECONDITION,
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

static TFL_Error* device_count(int32_t* out) {
  *out = 1;
  return NULL;
}

/* 1.6: what initialize would find, without initializing. A plugin over a
 * vendor runtime asks the runtime's cheapest enumeration here (and returns
 * an error saying what to install when the driver is missing), so that
 * autoload can choose among installed plugins by the hardware present. */
static TFL_Error* probe_devices(const char* options, int32_t* out_count) {
  (void)options;
  *out_count = 1;
  return NULL;
}

static TFL_Error* device_properties(int32_t device, TFL_DeviceProperties* out) {
  TFL_Error* err = tflh_check_device(device);
  if (err) return err;
  if (TFL_HAS_FIELD(TFL_DeviceProperties, name, out->struct_size))
    out->name = "minimal_c device";
  if (TFL_HAS_FIELD(TFL_DeviceProperties, total_memory, out->struct_size))
    out->total_memory = PLUGIN_CAPACITY;
  if (TFL_HAS_FIELD(TFL_DeviceProperties, compute_units, out->struct_size))
    out->compute_units = 1;
  if (TFL_HAS_FIELD(TFL_DeviceProperties, memory_alignment, out->struct_size))
    out->memory_alignment = PLUGIN_ALIGNMENT;
  /* 1.2: a host at 1.0 or 1.1 passes a struct that ends before these. */
  if (TFL_HAS_FIELD(TFL_DeviceProperties, capability_minor, out->struct_size)) {
    out->capability_major = 1;
    out->capability_minor = 0;
  }
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Activity records (1.8): what each call did, for torch_fl.trace           */
/* ------------------------------------------------------------------------ */

/* Records staged between the host's drains; past this many, records are
 * counted as dropped. */
#ifndef PLUGIN_ACTIVITY_CAPACITY
#define PLUGIN_ACTIVITY_CAPACITY 4096
#endif

static TFL_ActivityRecord g_activity_records[PLUGIN_ACTIVITY_CAPACITY];
static TFLH_ActivityBuffer g_activity =
    TFLH_ACTIVITY_BUFFER_INIT(g_activity_records, PLUGIN_ACTIVITY_CAPACITY);

/* The device's clock. This device is the host's CPU, so its clock is the
 * host's CLOCK_MONOTONIC; a port reads its device's timer here, or takes
 * the start and end the device recorded for work that finishes later. */
static uint64_t device_now_ns(void) { return tflh_activity_host_now_ns(); }

/* A call being recorded: the kinds wanted (read once: all a call costs while
 * recording is off) and, when any is, its start on both clocks. */
typedef struct Activity {
  uint32_t kinds;
  uint64_t host_start_ns, device_start_ns;
} Activity;

/* Starts recording a call that makes records of the kinds in `mask`
 * (TFLH_ACTIVITY_BIT of each). */
static Activity activity_begin(uint32_t mask) {
  Activity a;
  a.kinds = tflh_activity_kinds(&g_activity) & mask;
  a.host_start_ns = a.kinds != 0 ? tflh_activity_host_now_ns() : 0;
  a.device_start_ns = a.kinds != 0 ? device_now_ns() : 0;
  return a;
}

/* Ends it: a TFL_ACTIVITY_API record named `call` (the native call, host
 * clock) and a record of `work_kind` named `work` (its execution, device
 * clock), each if wanted, both with the printf-formatted detail. Here the
 * work runs inside the call; a device with queues records the call when it
 * enqueues, and the work once the device reports its start and end. */
static TFLH_PRINTF(7, 8) void activity_end(const Activity* a, int32_t device,
                                           TFL_Stream* stream,
                                           const char* call,
                                           uint32_t work_kind,
                                           const char* work,
                                           const char* detail_format, ...) {
  char detail[TFL_ACTIVITY_DETAIL_BYTES];
  uint64_t host_end, device_end, correlation;
  va_list ap;
  if (a->kinds == 0) return;
  host_end = tflh_activity_host_now_ns();
  device_end = device_now_ns();
  correlation = tflh_activity_correlation();
  va_start(ap, detail_format);
  vsnprintf(detail, sizeof detail, detail_format, ap);
  va_end(ap);
  if (a->kinds & TFLH_ACTIVITY_BIT(TFL_ACTIVITY_API)) {
    tflh_activity_append(&g_activity, TFL_ACTIVITY_API, TFL_ACTIVITY_HOST_CLOCK,
                         device, stream, correlation, a->host_start_ns,
                         host_end, call, detail);
  }
  if (a->kinds & TFLH_ACTIVITY_BIT(work_kind)) {
    tflh_activity_append(&g_activity, work_kind, 0, device, stream,
                         correlation, a->device_start_ns, device_end, work,
                         detail);
  }
}

/* Ends a wait: a TFL_ACTIVITY_SYNC record named after the entry. Nothing is
 * ever pending on this device, so it is short; a device with queues blocks
 * here until its work has run. */
static void activity_wait_end(const Activity* a, int32_t device,
                              TFL_Stream* stream, const char* entry) {
  if (a->kinds & TFLH_ACTIVITY_BIT(TFL_ACTIVITY_SYNC)) {
    tflh_activity_append(&g_activity, TFL_ACTIVITY_SYNC,
                         TFL_ACTIVITY_HOST_CLOCK, device, stream,
                         tflh_activity_correlation(), a->host_start_ns,
                         tflh_activity_host_now_ns(), entry, NULL);
  }
}

#define ACTIVITY_WAIT TFLH_ACTIVITY_BIT(TFL_ACTIVITY_SYNC)

static TFL_Error* device_synchronize(int32_t device) {
  Activity a = activity_begin(ACTIVITY_WAIT);
  TFL_Error* err = tflh_sync_device_synchronize(device);
  activity_wait_end(&a, device, NULL, "device_synchronize");
  return err;
}

static TFL_Error* stream_synchronize(TFL_Stream* stream) {
  Activity a = activity_begin(ACTIVITY_WAIT);
  TFL_Error* err = tflh_sync_stream_synchronize(stream);
  activity_wait_end(&a, 0, stream, "stream_synchronize"); /* one device */
  return err;
}

static TFL_Error* event_synchronize(TFL_Event* event) {
  Activity a = activity_begin(ACTIVITY_WAIT);
  TFL_Error* err = tflh_sync_event_synchronize(event);
  activity_wait_end(&a, event->device, NULL, "event_synchronize");
  return err;
}

/* The activity table's entries, over the helpers' buffer. */
static TFL_Error* activity_enable(uint32_t kinds) {
  return tflh_activity_enable(&g_activity, kinds);
}

static void activity_set_correlation(uint64_t id) {
  tflh_activity_set_correlation(id);
}

static TFL_Error* activity_drain(TFL_ActivityRecord* records,
                                 size_t record_size, size_t capacity,
                                 size_t* out_written, uint64_t* out_dropped) {
  return tflh_activity_drain_into(&g_activity, records, record_size, capacity,
                                  out_written, out_dropped);
}

/* One device time and CLOCK_MONOTONIC at the same moment. Here they are one
 * clock, read once; a port reads its device's timer and
 * tflh_activity_host_now_ns() back to back (or one driver call returning
 * both). */
static TFL_Error* activity_clock(int32_t device, uint64_t* out_device_ns,
                                 uint64_t* out_host_ns) {
  TFL_Error* err = tflh_check_device(device);
  uint64_t now;
  if (err) return err;
  now = device_now_ns();
  *out_device_ns = now;
  *out_host_ns = now;
  return NULL;
}

static void range_push(const char* name) {
  tflh_activity_range_push(&g_activity, name);
}

static void range_pop(void) { tflh_activity_range_pop(&g_activity); }

static void range_mark(const char* name) {
  tflh_activity_range_mark(&g_activity, name);
}

/* 1.8: fills the activity table, as far as the host's struct goes. */
static TFL_Error* get_activity(TFL_Activity* out) {
  if (!TFL_HAS_FIELD(TFL_Activity, activity_clock, out->struct_size)) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: get_activity: struct_size %zu is too small",
                      out->struct_size);
  }
  out->activity_enable = activity_enable;
  out->activity_set_correlation = activity_set_correlation;
  out->activity_drain = activity_drain;
  out->activity_clock = activity_clock;
  if (TFL_HAS_FIELD(TFL_Activity, range_mark, out->struct_size)) {
    out->range_push = range_push;
    out->range_pop = range_pop;
    out->range_mark = range_mark;
  }
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Memory: host allocations with a header holding the size, for accounting */
/* ------------------------------------------------------------------------ */

static TFLH_MemoryCounters g_memory = TFLH_MEMORY_COUNTERS_INIT(PLUGIN_CAPACITY);

static TFL_Error* allocate(int32_t device, size_t nbytes, void** out) {
  TFL_Error* err = tflh_check_device(device);
  void* base = NULL;
  if (err || (err = tflh_memory_reserve(&g_memory, device, nbytes))) return err;
  if (posix_memalign(&base, PLUGIN_ALIGNMENT, nbytes + PLUGIN_ALIGNMENT) != 0) {
    tflh_memory_unreserve(&g_memory, nbytes);
    return tflh_error(TFL_ERROR_OUT_OF_MEMORY,
                      "minimal_c: host allocation of %zu bytes failed", nbytes);
  }
  *(size_t*)base = nbytes;
  *out = (char*)base + PLUGIN_ALIGNMENT;
  return NULL;
}

static TFL_Error* deallocate(int32_t device, void* ptr) {
  TFL_Error* err = tflh_check_device(device);
  char* base;
  if (err || ptr == NULL) return err;
  base = (char*)ptr - PLUGIN_ALIGNMENT;
  tflh_memory_release(&g_memory, *(size_t*)base);
  free(base);
  return NULL;
}

#define ACTIVITY_COPY \
  (TFLH_ACTIVITY_BIT(TFL_ACTIVITY_API) | TFLH_ACTIVITY_BIT(TFL_ACTIVITY_COPY))
#define ACTIVITY_MEMSET \
  (TFLH_ACTIVITY_BIT(TFL_ACTIVITY_API) | TFLH_ACTIVITY_BIT(TFL_ACTIVITY_MEMSET))

static TFL_Error* copy(const TFL_CopyArgs* args) {
  int to_device = args->kind == TFL_COPY_HOST_TO_DEVICE;
  Activity a = activity_begin(ACTIVITY_COPY);
  /* Every pointer is host memory, so every kind of copy is a memmove. */
  if (args->nbytes > 0) memmove(args->dst, args->src, args->nbytes);
  activity_end(&a, to_device ? args->dst_device : args->src_device,
               args->stream, "memmove", TFL_ACTIVITY_COPY,
               to_device                                 ? "memcpy HtoD"
               : args->kind == TFL_COPY_DEVICE_TO_HOST ? "memcpy DtoH"
                                                       : "memcpy DtoD",
               "%zu bytes", args->nbytes);
  return NULL;
}

static TFL_Error* set_memory(int32_t device, void* ptr, uint8_t value,
                             size_t nbytes, TFL_Stream* stream) {
  TFL_Error* err = tflh_check_device(device);
  Activity a;
  if (err) return err;
  /* Synchronous device: every stream is already in order. */
  a = activity_begin(ACTIVITY_MEMSET);
  memset(ptr, value, nbytes);
  activity_end(&a, device, stream, "memset", TFL_ACTIVITY_MEMSET, "memset",
               "%zu bytes value=0x%02x", nbytes, (unsigned)value);
  return NULL;
}

static TFL_Error* memory_stats(int32_t device, TFL_MemoryStats* out) {
  TFL_Error* err = tflh_check_device(device);
  return err ? err : tflh_memory_stats(&g_memory, out);
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
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: %s: argument %zu must be a tensor", f->op_name, i);
  }
  *out = f->args[i]->u.tensor;
  if ((*out)->ndim > MAX_DIMS) {
    return tflh_error(TFL_ERROR_UNIMPLEMENTED, "minimal_c: %s: more than %d dims",
                      f->op_name, MAX_DIMS);
  }
  if (!is_f32(*out)) {
    return tflh_error(TFL_ERROR_UNIMPLEMENTED,
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

#define ACTIVITY_LAUNCH \
  (TFLH_ACTIVITY_BIT(TFL_ACTIVITY_API) | TFLH_ACTIVITY_BIT(TFL_ACTIVITY_KERNEL))

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
  Activity activity;
  if (f->num_outputs != 1 || !is_f32(f->outputs[0])) {
    return tflh_error(TFL_ERROR_UNIMPLEMENTED,
                      "minimal_c: %s: needs one float32 output", f->op_name);
  }
  out = f->outputs[0];
  if (out->ndim > MAX_DIMS || !broadcast_strides(a, out, sa) ||
      (b != NULL && !broadcast_strides(b, out, sb))) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: %s: input shapes do not broadcast to the output",
                      f->op_name);
  }
  for (d = 0; d < out->ndim; ++d) {
    numel *= out->shape[d];
    index[d] = 0;
  }
  activity = activity_begin(ACTIVITY_LAUNCH);
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
  /* The launch as a native call, the loop as the kernel's execution. */
  activity_end(&activity, f->device_index, f->stream, "launch_kernel",
               TFL_ACTIVITY_KERNEL, "elementwise_f32", "%s %lld elements",
               f->op_name, (long long)numel);
  return NULL;
}

TFL_EXPORT TFL_Error* torch_fl_op_add_Tensor(const TFL_CallFrame* f) {
  const TFL_Tensor *a = NULL, *b = NULL;
  TFL_Error* err;
  if ((err = tensor_arg(f, 0, &a)) || (err = tensor_arg(f, 1, &b))) return err;
  if (f->num_args != 3 || f->args[2]->tag != TFL_VALUE_SCALAR) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
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
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT,
                      "minimal_c: fill_.Scalar takes (self, value)");
  }
  return elementwise(f, self, NULL, (float)scalar_value(&f->args[1]->u.scalar),
                     fill_fn);
}

static const TFL_OpEntry g_ops[] = {
    TFLH_OP("add.Tensor", torch_fl_op_add_Tensor),
    TFLH_OP("mul.Tensor", torch_fl_op_mul_Tensor),
    TFLH_OP("neg", torch_fl_op_neg),
    TFLH_OP("relu", torch_fl_op_relu),
    TFLH_OP("fill_.Scalar", torch_fl_op_fill__Scalar),
};

static TFL_Error* get_op_table(TFL_OpTable* out) {
  return tflh_op_table(out, g_ops, sizeof g_ops / sizeof g_ops[0]);
}

/* ------------------------------------------------------------------------ */
/* The function table and the bootstrap symbol                              */
/* ------------------------------------------------------------------------ */

static const TFL_PluginApi g_api = {
    TFL_STRUCT_SIZE(TFL_PluginApi, get_activity),
    TFL_ABI_VERSION_MAJOR,
    TFL_ABI_VERSION_MINOR,
    tflh_error_code,
    tflh_error_message,
    tflh_error_destroy,
    get_info,
    initialize,
    get_op_table,
    device_count,
    device_properties,
    device_synchronize, /* all work is synchronous: records the wait only */
    allocate,
    deallocate,
    copy,
    set_memory,
    tflh_sync_default_stream,
    tflh_sync_stream_create,
    tflh_sync_stream_destroy,
    stream_synchronize,
    tflh_sync_stream_query,
    tflh_sync_stream_wait_event,
    tflh_sync_event_create,
    tflh_sync_event_destroy,
    tflh_sync_event_record,
    tflh_sync_event_query,
    event_synchronize,
    tflh_sync_event_elapsed_time,
    memory_stats,
    NULL, /* reset_peak_memory_stats: optional, not implemented */
    NULL, /* empty_cache: optional, nothing is cached */
    NULL, /* get_collectives (1.3): optional; torch.distributed then stages
             collectives through host memory */
    NULL, /* host_allocate (1.4): optional; pinned tensors then live in
             ordinary host memory */
    NULL, /* host_deallocate (1.4) */
    probe_devices, /* 1.6, optional */
    NULL, /* get_graphs (1.7): optional; torch-fl then replays device graphs
             one kernel call at a time */
    get_activity, /* 1.8, optional: without it torch-fl times each call
                     with a pair of timing events */
};

/* A test harness may #include this file with PLUGIN_NO_BOOTSTRAP defined and
 * export a bootstrap of its own that returns a modified copy of g_api: fault
 * injection, to see how the host copes with a broken plugin. */
#ifndef PLUGIN_NO_BOOTSTRAP
TFL_EXPORT const TFL_PluginApi* torch_fl_plugin_get_api(const TFL_HostApi* host) {
  g_host = host;
  return &g_api;
}
#endif

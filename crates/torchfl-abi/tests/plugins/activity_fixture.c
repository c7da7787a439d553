/*
 * The C example with an activity table (ABI 1.8) of its own, for the
 * `activity` check of `torchfl-abi verify` (tests/cli.rs): add.Tensor
 * records an API record and a KERNEL record (the latter on a "device clock"
 * FXA_DEVICE_OFFSET ns ahead of CLOCK_MONOTONIC), ranges and marks are
 * recorded, and each define below breaks one rule:
 *
 *   FXA_ACCEPT_BAD_MASK    activity_enable accepts bits outside ALL_KINDS
 *   FXA_NO_KERNEL          add.Tensor records no KERNEL record
 *   FXA_WRONG_ID           the KERNEL record carries an id nobody set
 *   FXA_IGNORE_OFF         activity_enable(0) does not stop recording
 *   FXA_MARK_SPAN          a mark's end is after its start
 *   FXA_CLOCK_PAIR_OFFSET  activity_clock leaves the device offset out: the
 *                          kernel maps far from its launch
 *   FXA_NO_RANGES          no range entries (optional: still passes)
 *
 * Single-threaded by design (the check calls from one thread): one mutex
 * guards the records, the correlation id is process-wide.
 */
/* The example's add.Tensor becomes fx_example_add; this file exports the
 * conventional symbol, recording around it. */
#define torch_fl_op_add_Tensor fx_example_add
#include "base.h"
#undef torch_fl_op_add_Tensor

#ifdef FXA_CLOCK_PAIR_OFFSET
#define FXA_DEVICE_OFFSET 100000000000ull /* 100 s */
#else
#define FXA_DEVICE_OFFSET 123456789ull
#endif
#define FXA_CAPACITY 1024

static pthread_mutex_t g_fxa_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t g_fxa_kinds;
static uint64_t g_fxa_id;
static TFL_ActivityRecord g_fxa_records[FXA_CAPACITY];
static size_t g_fxa_count;
static uint64_t g_fxa_dropped;

static uint64_t fxa_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fxa_record(uint32_t kind, int host_clock, uint64_t id, uint64_t start, uint64_t end,
                       const char* name) {
  TFL_ActivityRecord* r;
  pthread_mutex_lock(&g_fxa_mu);
  if (!(g_fxa_kinds & (1u << kind))) {
    pthread_mutex_unlock(&g_fxa_mu);
    return;
  }
  if (g_fxa_count == FXA_CAPACITY) {
    g_fxa_dropped++;
    pthread_mutex_unlock(&g_fxa_mu);
    return;
  }
  r = &g_fxa_records[g_fxa_count++];
  memset(r, 0, sizeof *r);
  r->struct_size = sizeof *r;
  r->kind = kind;
  r->flags = host_clock ? TFL_ACTIVITY_HOST_CLOCK : 0;
  r->device = 0;
  r->correlation_id = id;
  r->start_ns = start;
  r->end_ns = end;
  strncpy(r->name, name, sizeof r->name - 1);
  pthread_mutex_unlock(&g_fxa_mu);
}

static TFL_Error* fxa_enable(uint32_t kinds) {
#ifndef FXA_ACCEPT_BAD_MASK
  if (kinds & ~TFL_ACTIVITY_ALL_KINDS) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT, "activity fixture: unknown kind bits");
  }
#endif
#ifdef FXA_IGNORE_OFF
  if (kinds == 0) return NULL;
#endif
  pthread_mutex_lock(&g_fxa_mu);
  g_fxa_kinds = kinds;
  pthread_mutex_unlock(&g_fxa_mu);
  return NULL;
}

static void fxa_set_correlation(uint64_t id) { g_fxa_id = id; }

static TFL_Error* fxa_drain(TFL_ActivityRecord* records, size_t record_size, size_t capacity,
                            size_t* out_written, uint64_t* out_dropped) {
  size_t n, i;
  size_t bytes = record_size < sizeof(TFL_ActivityRecord) ? record_size : sizeof(TFL_ActivityRecord);
  if (record_size < TFL_STRUCT_SIZE(TFL_ActivityRecord, detail)) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT, "activity fixture: record_size too small");
  }
  pthread_mutex_lock(&g_fxa_mu);
  n = g_fxa_count < capacity ? g_fxa_count : capacity;
  for (i = 0; i < n; i++) {
    TFL_ActivityRecord* dst = (TFL_ActivityRecord*)((char*)records + i * record_size);
    memcpy(dst, &g_fxa_records[i], bytes);
    dst->struct_size = bytes;
  }
  memmove(g_fxa_records, g_fxa_records + n, (g_fxa_count - n) * sizeof g_fxa_records[0]);
  g_fxa_count -= n;
  *out_written = n;
  *out_dropped = g_fxa_dropped;
  g_fxa_dropped = 0;
  pthread_mutex_unlock(&g_fxa_mu);
  return NULL;
}

static TFL_Error* fxa_clock(int32_t device, uint64_t* out_device_ns, uint64_t* out_host_ns) {
  uint64_t now = fxa_now();
  (void)device;
  *out_host_ns = now;
#ifdef FXA_CLOCK_PAIR_OFFSET
  *out_device_ns = now;
#else
  *out_device_ns = now + FXA_DEVICE_OFFSET;
#endif
  return NULL;
}

#define FXA_MAX_DEPTH 16
/* Names are borrowed for the call only: copied. */
static char g_fxa_range_names[FXA_MAX_DEPTH][TFL_ACTIVITY_NAME_BYTES];
static uint64_t g_fxa_range_starts[FXA_MAX_DEPTH];
static int g_fxa_depth;

static void fxa_range_push(const char* name) {
  if (g_fxa_depth < FXA_MAX_DEPTH) {
    strncpy(g_fxa_range_names[g_fxa_depth], name, TFL_ACTIVITY_NAME_BYTES - 1);
    g_fxa_range_starts[g_fxa_depth++] = fxa_now();
  }
}

static void fxa_range_pop(void) {
  if (g_fxa_depth > 0) {
    --g_fxa_depth;
    fxa_record(TFL_ACTIVITY_RANGE, 1, g_fxa_id, g_fxa_range_starts[g_fxa_depth], fxa_now(),
               g_fxa_range_names[g_fxa_depth]);
  }
}

static void fxa_range_mark(const char* name) {
  uint64_t now = fxa_now();
#ifdef FXA_MARK_SPAN
  fxa_record(TFL_ACTIVITY_MARK, 1, g_fxa_id, now, now + 5, name);
#else
  fxa_record(TFL_ACTIVITY_MARK, 1, g_fxa_id, now, now, name);
#endif
}

static TFL_Error* fxa_get_activity(TFL_Activity* out) {
  out->activity_enable = fxa_enable;
  out->activity_set_correlation = fxa_set_correlation;
  out->activity_drain = fxa_drain;
  out->activity_clock = fxa_clock;
#ifdef FXA_NO_RANGES
  (void)fxa_range_push;
  (void)fxa_range_pop;
  (void)fxa_range_mark;
#else
  out->range_push = fxa_range_push;
  out->range_pop = fxa_range_pop;
  out->range_mark = fxa_range_mark;
#endif
  return NULL;
}

TFL_EXPORT TFL_Error* torch_fl_op_add_Tensor(const TFL_CallFrame* f) {
  uint64_t id = g_fxa_id, start = fxa_now();
  TFL_Error* err;
  fxa_record(TFL_ACTIVITY_API, 1, id, start, start + 10, "fixtureLaunch");
  err = fx_example_add(f);
#ifndef FXA_NO_KERNEL
#ifdef FXA_WRONG_ID
  id += 7;
#endif
  fxa_record(TFL_ACTIVITY_KERNEL, 0, id, start + FXA_DEVICE_OFFSET,
             fxa_now() + FXA_DEVICE_OFFSET, "add.Tensor");
#endif
  return err;
}

/* The example's op table with add.Tensor pointing here. */
static TFL_OpEntry g_fxa_ops[sizeof g_ops / sizeof g_ops[0]];

static TFL_Error* fxa_get_op_table(TFL_OpTable* out) {
  size_t i, n = sizeof g_ops / sizeof g_ops[0];
  for (i = 0; i < n; i++) {
    g_fxa_ops[i] = g_ops[i];
    if (strcmp(g_fxa_ops[i].name, "add.Tensor") == 0) g_fxa_ops[i].kernel = torch_fl_op_add_Tensor;
  }
  return tflh_op_table(out, g_fxa_ops, n);
}

static TFL_PluginApi g_fxa_api;

TFL_EXPORT const TFL_PluginApi* torch_fl_plugin_get_api(const TFL_HostApi* host) {
  g_host = host;
  g_fxa_api = g_api;
  g_fxa_api.struct_size = TFL_STRUCT_SIZE(TFL_PluginApi, get_activity);
  g_fxa_api.get_op_table = fxa_get_op_table;
  g_fxa_api.get_activity = fxa_get_activity;
  return &g_fxa_api;
}

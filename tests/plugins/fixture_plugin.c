/*
 * Fault-injection fixture: the C example plugin (base.h), re-exported with
 * one defect chosen at compile time. The test suites build one library per
 * variant, with the flags of cflags.txt, and check the exact error each must
 * produce.
 *
 *   (no define)                a working plugin
 *   FIXTURE_NAME="x"           identity name override
 *   FIXTURE_NO_BOOTSTRAP       does not export torch_fl_plugin_get_api
 *   FIXTURE_NULL_API           bootstrap returns NULL
 *   FIXTURE_ABI_MAJOR=n        announces another major
 *   FIXTURE_ABI_MINOR=n        announces another minor
 *   FIXTURE_NEWER_TABLE        a 1.9 plugin: larger tables with entries this
 *                              host does not know (must load, ignored)
 *   FIXTURE_OLDER_TABLE        table ends before the optional entries
 *                              (must load; they read as absent)
 *   FIXTURE_TINY_TABLE         struct_size too small for the required entries
 *   FIXTURE_NULL_ENTRY=name    required entry `name` is NULL
 *   FIXTURE_NULL_OPTIONAL      every optional entry is NULL
 *   FIXTURE_INIT_FAILS         initialize returns an error
 *   FIXTURE_FAILING_KERNEL     sub.Tensor returns an error
 *   FIXTURE_INVALID_UTF8       the messages of those two errors contain
 *                              bytes that are not UTF-8 (host must replace
 *                              them with U+FFFD, never fail to decode)
 *   FIXTURE_NO_EVENT_TIMING    declares no TFL_CAP_EVENT_TIMING and has no
 *                              event_elapsed_time (profilers must report no
 *                              device time, not garbage)
 *   FIXTURE_CRASHING_KERNEL    div.Tensor dereferences NULL
 *   FIXTURE_MISSING_SYMBOL     mul_.Tensor's kernel is not exported
 *   FIXTURE_WRONG_SYMBOL_NAME  an entry declares an unconventional symbol
 *   FIXTURE_WRONG_OOM_CODE     lack of memory reported as INTERNAL
 *   FIXTURE_WRONG_NUMBERS      loads and runs, but computes wrong numbers:
 *                              sub.Tensor is off by a relative 2^-12 (a
 *                              few thousand float32 ulps) and sum drops the
 *                              last element; conformance tools must flag both
 *   FIXTURE_CHATTY_STDOUT      initialize prints to stdout, without a newline
 *                              (must not corrupt verify --json)
 *   FIXTURE_HANGING_SYNC       device_synchronize never returns (a hung
 *                              device; torchfl-abi verify --timeout)
 *   FIXTURE_HANGING_INIT       initialize never returns (TORCH_FL_INIT_TIMEOUT)
 *   FIXTURE_CRASHING_INIT      initialize dereferences NULL (the crash report
 *                              must name the plugin and the call)
 *   FIXTURE_EXITING_INIT       initialize calls exit(3)
 *   FIXTURE_FORK_TRAP          a plugin that is not fork-safe: its memory,
 *                              copy, synchronize and destroy entries abort
 *                              when called in a process forked after it was
 *                              initialized (the host must never do that)
 *   MINIMAL_CAPACITY=bytes     device capacity (small values test OOM)
 *
 * Malformed declarations the host must refuse (or warn about) without
 * reading past the plugin's memory (docs/plugin-abi.md, "What the host
 * validates"):
 *
 *   FIXTURE_OPS_COUNT_IN_BYTES num_entries is the array's size in bytes
 *                              (the `sizeof ops` slip)
 *   FIXTURE_OPS_COUNT_HUGE     num_entries is 2^40
 *   FIXTURE_OPS_COUNT_PAST_END num_entries is one more than the array, which
 *                              ends right before an unreadable page
 *   FIXTURE_BOOTSTRAP_IS_DATA  torch_fl_plugin_get_api is an exported variable
 *   FIXTURE_INFO_STRUCT_SIZE_ZERO  TFL_PluginInfo.struct_size is 0
 *   FIXTURE_MIN_TORCH_VERSION="x"  min_torch_version override ("banana")
 *   FIXTURE_NULL_DEFAULT_STREAM    default_stream succeeds with NULL
 *   FIXTURE_ZERO_MEMORY        device_properties reports total_memory 0
 *   FIXTURE_ZERO_DEVICES       device_count is 0 (valid: no device present),
 *                              and probe_devices (1.6) counts 0 too
 *   FIXTURE_PROBE_NO_DRIVER    probe_devices fails as a plugin whose vendor
 *                              driver is missing (FAILED_PRECONDITION); it
 *                              and initialize print to stderr when called
 *   FIXTURE_NO_PROBE           no probe_devices entry (a 1.5-sized table)
 *   FIXTURE_UNKNOWN_ATEN_OP    declares frobnicate.Tensor, no ATen operator
 *   FIXTURE_BAD_SCHEMA         custom operator fx::scale, schema with a
 *                              syntax error
 *   FIXTURE_SCHEMA_NAME_MISMATCH   custom operator fx::scale whose schema
 *                              declares another operator
 *   (FIXTURE_ABI_MAJOR=0xFFFFFFFFu is an implausible version: malformed)
 *
 * The collectives table (ABI 1.3; these variants announce minor 3):
 *
 *   FIXTURE_COLLECTIVES_IS_DATA     get_collectives points to a variable
 *   FIXTURE_COLLECTIVES_NULL_ENTRY  get_collectives succeeds but leaves
 *                                   all_reduce NULL
 *   FIXTURE_COLLECTIVES_UNAVAILABLE get_collectives returns UNIMPLEMENTED
 *                                   (no collectives; must load)
 *
 * Page-locked host memory (ABI 1.4; announces minor 4):
 *
 *   FIXTURE_HOST_ALLOC_IS_DATA      host_allocate points to a variable
 *
 * The activity table (ABI 1.8; these variants announce minor 8):
 *
 *   FIXTURE_ACTIVITY_NULL_ENTRY     get_activity succeeds but leaves
 *                                   activity_drain NULL
 *   FIXTURE_ACTIVITY_HALF_RANGES    range_push and range_mark without
 *                                   range_pop
 */
/* The suites size the device by this name; the base calls it PLUGIN_CAPACITY. */
#ifdef MINIMAL_CAPACITY
#define PLUGIN_CAPACITY MINIMAL_CAPACITY
#endif
#include "base.h"

#include <sys/mman.h>
#include <unistd.h>

/* The fixture's identity is its own: the example's strings come from the
 * template and change with it, while the suites check these. */
#ifndef FIXTURE_NAME
#define FIXTURE_NAME "minimal_c"
#endif
#define FIXTURE_VENDOR "torch-fl examples"
#define FIXTURE_DEVICE_NAME "minimal-c host device"
#ifndef FIXTURE_ABI_MAJOR
#define FIXTURE_ABI_MAJOR TFL_ABI_VERSION_MAJOR
#endif
#if defined(FIXTURE_ACTIVITY_NULL_ENTRY) || defined(FIXTURE_ACTIVITY_HALF_RANGES)
#define FIXTURE_ACTIVITY 1
#define FIXTURE_ABI_MINOR 8
#endif
#if defined(FIXTURE_COLLECTIVES_IS_DATA) || defined(FIXTURE_COLLECTIVES_NULL_ENTRY) || \
    defined(FIXTURE_COLLECTIVES_UNAVAILABLE)
#define FIXTURE_COLLECTIVES 1
#define FIXTURE_ABI_MINOR 3
#endif
#ifdef FIXTURE_HOST_ALLOC_IS_DATA
#define FIXTURE_ABI_MINOR 4
#endif
#ifndef FIXTURE_ABI_MINOR
#ifdef FIXTURE_NEWER_TABLE
#define FIXTURE_ABI_MINOR 9
#else
/* A 1.0 plugin: every fixture also exercises this host meeting an older
 * minor (no infer_outputs, no dtype capability bits). */
#define FIXTURE_ABI_MINOR 0
#endif
#endif

/* A plugin from the future: every table is larger than this host knows. */
typedef struct FixtureApiV1_9 {
  TFL_PluginApi v1_0;
  TFL_Error* (*future_entry)(int32_t device);
  uint64_t future_field;
} FixtureApiV1_9;

typedef struct FixtureInfoV1_9 {
  TFL_PluginInfo v1_0;
  const char* future_string;
} FixtureInfoV1_9;

typedef struct FixtureOpEntryV1_9 {
  TFL_OpEntry v1_0;
  uint64_t future_flags;
} FixtureOpEntryV1_9;

/* Appended to the injected error messages: Latin-1 "e acute" (0xE9), a
 * lone continuation byte and a truncated 3-byte sequence; each is one
 * U+FFFD after lossy decoding: "caf\uFFFD \uFFFD \uFFFD]". */
#ifdef FIXTURE_INVALID_UTF8
#define FIXTURE_BAD_BYTES " [caf\xE9 \x80 \xE2\x82]"
#else
#define FIXTURE_BAD_BYTES ""
#endif

static FixtureApiV1_9 g_fixture_api;
static FixtureInfoV1_9 g_fixture_info;

static const TFL_PluginInfo* fixture_get_info(void) { return &g_fixture_info.v1_0; }

#ifdef FIXTURE_INIT_FAILS
static TFL_Error* fixture_initialize(const TFL_InitArgs* args) {
  (void)args;
  return tflh_error(TFL_ERROR_DEVICE_LOST,
                    "fixture: no accelerator found on the PCI bus (injected)" FIXTURE_BAD_BYTES);
}
#endif

#ifdef FIXTURE_WRONG_NUMBERS
static float biased_sub_fn(float a, float b, float alpha) {
  return (a - alpha * b) * (1.0f + 1.0f / 4096.0f);
}

TFL_EXPORT TFL_Error* torch_fl_op_sub_Tensor(const TFL_CallFrame* f) {
  const TFL_Tensor *a = NULL, *b = NULL;
  TFL_Error* err;
  if ((err = tensor_arg(f, 0, &a)) || (err = tensor_arg(f, 1, &b))) return err;
  if (f->num_args != 3 || f->args[2]->tag != TFL_VALUE_SCALAR) {
    return tflh_error(TFL_ERROR_INVALID_ARGUMENT, "fixture: sub.Tensor takes (self, other, alpha)");
  }
  return elementwise(f, a, b, (float)scalar_value(&f->args[2]->u.scalar), biased_sub_fn);
}

/* sum(Tensor self, *, ScalarType? dtype=None): forgets the last element. */
TFL_EXPORT TFL_Error* torch_fl_op_sum(const TFL_CallFrame* f) {
  const TFL_Tensor* self = NULL;
  TFL_Error* err = tensor_arg(f, 0, &self);
  int64_t numel = 1, expected = 1, i;
  int d;
  double total = 0.0;
  if (err) return err;
  if (f->num_args != 2 || f->args[1]->tag != TFL_VALUE_NONE || f->num_outputs != 1 ||
      !is_f32(f->outputs[0])) {
    return tflh_error(TFL_ERROR_UNIMPLEMENTED, "fixture: sum: float32 without dtype= only");
  }
  for (d = self->ndim - 1; d >= 0; --d) {
    if (self->shape[d] != 1 && self->strides[d] != expected) {
      return tflh_error(TFL_ERROR_UNIMPLEMENTED, "fixture: sum: contiguous inputs only");
    }
    expected *= self->shape[d];
    numel *= self->shape[d];
  }
  for (i = 0; i + 1 < numel; ++i) total += element(self)[i]; /* the injected bug */
  element(f->outputs[0])[0] = (float)total;
  return NULL;
}
#else
TFL_EXPORT TFL_Error* torch_fl_op_sub_Tensor(const TFL_CallFrame* f) {
  return tflh_error(TFL_ERROR_INTERNAL, "fixture: %s failed on purpose" FIXTURE_BAD_BYTES,
                    f->op_name);
}
#endif

TFL_EXPORT TFL_Error* torch_fl_op_div_Tensor(const TFL_CallFrame* f) {
  volatile int* volatile nowhere = NULL;
  (void)f;
  *nowhere = 1; /* the injected crash */
  return NULL;
}

#ifdef FIXTURE_WRONG_OOM_CODE
static TFL_Error* fixture_allocate(int32_t device, size_t nbytes, void** out) {
  TFL_Error* err = allocate(device, nbytes, out);
  if (err != NULL && err->code == TFL_ERROR_OUT_OF_MEMORY) err->code = TFL_ERROR_INTERNAL;
  return err;
}
#endif

#ifdef FIXTURE_CHATTY_STDOUT
static TFL_Error* fixture_chatty_initialize(const TFL_InitArgs* args) {
  printf("fixture: initializing, chatty on stdout");  /* no newline */
  fflush(stdout);
  return g_api.initialize(args);
}
#endif

#if defined(FIXTURE_HANGING_INIT) || defined(FIXTURE_HANGING_SYNC)
/* The injected hang: blocks the calling thread forever. */
static void hang_forever(void) {
  static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
  static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
  pthread_mutex_lock(&mutex);
  for (;;) pthread_cond_wait(&never, &mutex);
}
#endif

#ifdef FIXTURE_HANGING_INIT
static TFL_Error* fixture_hanging_initialize(const TFL_InitArgs* args) {
  (void)args;
  hang_forever();
  return NULL;
}
#endif

#ifdef FIXTURE_CRASHING_INIT
static TFL_Error* fixture_crashing_initialize(const TFL_InitArgs* args) {
  volatile int* volatile nowhere = NULL;
  (void)args;
  *nowhere = 1; /* the injected crash */
  return NULL;
}
#endif

#ifdef FIXTURE_EXITING_INIT
static TFL_Error* fixture_exiting_initialize(const TFL_InitArgs* args) {
  (void)args;
  exit(3); /* the injected exit */
}
#endif

#ifdef FIXTURE_HANGING_SYNC
static TFL_Error* fixture_device_synchronize(int32_t device) {
  (void)device;
  hang_forever();
  return NULL;
}
#endif

#ifdef FIXTURE_NULL_DEFAULT_STREAM
static TFL_Error* fixture_default_stream(int32_t device, TFL_Stream** out) {
  (void)device;
  *out = NULL; /* the injected defect: success, but no stream */
  return NULL;
}
#endif

static TFL_Error* fixture_device_properties(int32_t device, TFL_DeviceProperties* out) {
  TFL_Error* err = device_properties(device, out);
  if (err != NULL) return err;
  if (TFL_HAS_FIELD(TFL_DeviceProperties, name, out->struct_size)) out->name = FIXTURE_DEVICE_NAME;
#ifdef FIXTURE_ZERO_MEMORY
  out->total_memory = 0;
#endif
  return NULL;
}

#ifdef FIXTURE_ZERO_DEVICES
static TFL_Error* fixture_device_count(int32_t* out) {
  *out = 0;
  return NULL;
}

static TFL_Error* fixture_probe_none(const char* options, int32_t* out_count) {
  (void)options;
  *out_count = 0;
  return NULL;
}

/* No device: every index is out of range. */
static TFL_Error* fixture_no_device_allocate(int32_t device, size_t nbytes, void** out) {
  (void)nbytes;
  (void)out;
  return tflh_error(TFL_ERROR_INVALID_ARGUMENT, "fixture: device %d out of range (device_count = 0)", (int)device);
}
#endif

#if defined(FIXTURE_UNKNOWN_ATEN_OP)
TFL_EXPORT TFL_Error* torch_fl_op_frobnicate_Tensor(const TFL_CallFrame* f) {
  return torch_fl_op_add_Tensor(f);
}
#endif

#if defined(FIXTURE_BAD_SCHEMA) || defined(FIXTURE_SCHEMA_NAME_MISMATCH)
TFL_EXPORT TFL_Error* torch_fl_op_fx__scale(const TFL_CallFrame* f) {
  return torch_fl_op_neg(f);
}
#endif

#ifdef FIXTURE_FORK_TRAP
#include <unistd.h>

static pid_t g_initialized_in;

static void fork_trap(const char* entry) {
  if (getpid() != g_initialized_in) {
    fprintf(stderr, "fixture: %s called in a forked child (injected trap)\n", entry);
    abort();
  }
}

static TFL_Error* trap_initialize(const TFL_InitArgs* args) {
  g_initialized_in = getpid();
  return g_api.initialize(args);
}
static TFL_Error* trap_device_synchronize(int32_t device) {
  fork_trap("device_synchronize");
  return g_api.device_synchronize(device);
}
static TFL_Error* trap_allocate(int32_t device, size_t nbytes, void** out) {
  fork_trap("allocate");
  return g_api.allocate(device, nbytes, out);
}
static TFL_Error* trap_deallocate(int32_t device, void* ptr) {
  fork_trap("deallocate");
  return g_api.deallocate(device, ptr);
}
static TFL_Error* trap_copy(const TFL_CopyArgs* args) {
  fork_trap("copy");
  return g_api.copy(args);
}
static TFL_Error* trap_stream_destroy(TFL_Stream* stream) {
  fork_trap("stream_destroy");
  return g_api.stream_destroy(stream);
}
static TFL_Error* trap_event_destroy(TFL_Event* event) {
  fork_trap("event_destroy");
  return g_api.event_destroy(event);
}
#endif

/* Deliberately not exported. */
static TFL_Error* unexported_mul_inplace(const TFL_CallFrame* f) {
  return torch_fl_op_mul_Tensor(f);
}

#define FIXTURE_MAX_OPS 16
static FixtureOpEntryV1_9 g_fixture_ops[FIXTURE_MAX_OPS];
static size_t g_fixture_num_ops;

static void add_op(const char* name, const char* symbol, TFL_KernelFn kernel) {
  FixtureOpEntryV1_9* e = &g_fixture_ops[g_fixture_num_ops++];
  e->v1_0.struct_size = TFL_STRUCT_SIZE(TFL_OpEntry, schema);
  e->v1_0.name = name;
  e->v1_0.symbol = symbol;
  e->v1_0.kernel = kernel;
#ifdef FIXTURE_NEWER_TABLE
  e->v1_0.struct_size = sizeof(FixtureOpEntryV1_9);
  e->future_flags = 42;
#endif
}

#ifdef FIXTURE_OPS_COUNT_PAST_END
/* The entries copied to the end of a page whose next page is unreadable:
 * entry num_entries would lie in that page. */
static const FixtureOpEntryV1_9* guarded_ops(void) {
  static FixtureOpEntryV1_9* copy;
  long page = sysconf(_SC_PAGESIZE);
  char* block = NULL;
  if (copy != NULL) return copy;
  if (page <= 0 || posix_memalign((void**)&block, (size_t)page, 2 * (size_t)page) != 0) return NULL;
  if (mprotect(block + page, (size_t)page, PROT_NONE) != 0) return NULL;
  copy = (FixtureOpEntryV1_9*)(block + page - g_fixture_num_ops * sizeof(FixtureOpEntryV1_9));
  memcpy(copy, g_fixture_ops, g_fixture_num_ops * sizeof(FixtureOpEntryV1_9));
  return copy;
}
#endif

static TFL_Error* fixture_get_op_table(TFL_OpTable* out) {
  out->entries = &g_fixture_ops[0].v1_0;
  out->num_entries = g_fixture_num_ops;
  out->entry_size = sizeof(FixtureOpEntryV1_9);
#ifdef FIXTURE_OPS_COUNT_IN_BYTES
  out->num_entries = g_fixture_num_ops * sizeof(FixtureOpEntryV1_9);
#endif
#ifdef FIXTURE_OPS_COUNT_HUGE
  out->num_entries = (size_t)1 << 40;
#endif
#ifdef FIXTURE_OPS_COUNT_PAST_END
  out->entries = &guarded_ops()->v1_0;
  out->num_entries = g_fixture_num_ops + 1;
#endif
  return NULL;
}

static void build_ops(void) {
  size_t i;
  for (i = 0; i < sizeof g_ops / sizeof g_ops[0]; ++i) {
    add_op(g_ops[i].name, g_ops[i].symbol, g_ops[i].kernel);
  }
#if defined(FIXTURE_FAILING_KERNEL) || defined(FIXTURE_WRONG_NUMBERS)
  add_op("sub.Tensor", "torch_fl_op_sub_Tensor", torch_fl_op_sub_Tensor);
#endif
#ifdef FIXTURE_WRONG_NUMBERS
  add_op("sum", "torch_fl_op_sum", torch_fl_op_sum);
#endif
#ifdef FIXTURE_CRASHING_KERNEL
  add_op("div.Tensor", "torch_fl_op_div_Tensor", torch_fl_op_div_Tensor);
#endif
#ifdef FIXTURE_MISSING_SYMBOL
  add_op("mul_.Tensor", "torch_fl_op_mul__Tensor", unexported_mul_inplace);
#else
  (void)unexported_mul_inplace;
#endif
#ifdef FIXTURE_WRONG_SYMBOL_NAME
  g_fixture_ops[0].v1_0.symbol = "my_add_kernel";
#endif
#ifdef FIXTURE_UNKNOWN_ATEN_OP
  add_op("frobnicate.Tensor", "torch_fl_op_frobnicate_Tensor", torch_fl_op_frobnicate_Tensor);
#endif
#if defined(FIXTURE_BAD_SCHEMA) || defined(FIXTURE_SCHEMA_NAME_MISMATCH)
  add_op("fx::scale", "torch_fl_op_fx__scale", torch_fl_op_fx__scale);
#ifdef FIXTURE_BAD_SCHEMA
  g_fixture_ops[g_fixture_num_ops - 1].v1_0.schema = "scale(Tensor x, float factor -> Tensor";
#else
  g_fixture_ops[g_fixture_num_ops - 1].v1_0.schema = "scaled(Tensor x, float factor) -> Tensor";
#endif
#endif
}

#ifdef FIXTURE_PROBE_NO_DRIVER
/* A plugin whose vendor driver is absent: probing says so, and a test can
 * see (on stderr) that the host never initialized it. */
static TFL_Error* fixture_probe_no_driver(const char* options, int32_t* out_count) {
  (void)options;
  (void)out_count;
  fprintf(stderr, "fixture: probe_devices called\n");
  return tflh_error(TFL_ERROR_FAILED_PRECONDITION,
                    "fixture: no fixture driver: install fixture-driver-dkms");
}

static TFL_Error* fixture_loud_initialize(const TFL_InitArgs* args) {
  fprintf(stderr, "fixture: initialize called\n");
  return g_api.initialize(args);
}
#endif

#ifdef FIXTURE_COLLECTIVES
#ifdef FIXTURE_COLLECTIVES_IS_DATA
/* Data where a function should be. */
static char g_not_code[64] = "a variable, not get_collectives";
#endif
#ifdef FIXTURE_COLLECTIVES_NULL_ENTRY
static TFL_Error* fixture_group(TFL_Comm* comm) {
  (void)comm;
  return tflh_error(TFL_ERROR_UNIMPLEMENTED, "fixture: no communicators");
}
#endif
#ifndef FIXTURE_COLLECTIVES_IS_DATA
static TFL_Error* fixture_get_collectives(TFL_Collectives* out) {
#ifdef FIXTURE_COLLECTIVES_UNAVAILABLE
  (void)out;
  return tflh_error(TFL_ERROR_UNIMPLEMENTED, "fixture: the communication library is not installed");
#else
  /* Every entry but all_reduce, which stays NULL: a stand-in function
   * (never called: the host refuses the table first). */
  typedef TFL_Error* (*Any)(TFL_Comm*);
  Any f = fixture_group;
  size_t n = (out->struct_size - sizeof(size_t)) / sizeof(Any);
  Any* entries = (Any*)((char*)out + sizeof(size_t));
  for (size_t i = 0; i < n; i++) entries[i] = f;
  out->all_reduce = NULL;
  return NULL;
#endif
}
#endif
#endif

#ifdef FIXTURE_ACTIVITY
/* Stand-ins: never called, the host refuses the table first. */
static TFL_Error* fixture_activity_enable(uint32_t kinds) {
  (void)kinds;
  return NULL;
}
static void fixture_set_correlation(uint64_t id) { (void)id; }
static TFL_Error* fixture_activity_drain(TFL_ActivityRecord* records, size_t record_size, size_t capacity,
                                         size_t* out_written, uint64_t* out_dropped) {
  (void)records;
  (void)record_size;
  (void)capacity;
  *out_written = 0;
  *out_dropped = 0;
  return NULL;
}
static TFL_Error* fixture_activity_clock(int32_t device, uint64_t* out_device_ns, uint64_t* out_host_ns) {
  (void)device;
  *out_device_ns = 0;
  *out_host_ns = 0;
  return NULL;
}
#ifdef FIXTURE_ACTIVITY_HALF_RANGES
static void fixture_range(const char* name) { (void)name; }
#endif
static TFL_Error* fixture_get_activity(TFL_Activity* out) {
  out->activity_enable = fixture_activity_enable;
  out->activity_set_correlation = fixture_set_correlation;
  out->activity_drain = fixture_activity_drain;
  out->activity_clock = fixture_activity_clock;
#ifdef FIXTURE_ACTIVITY_NULL_ENTRY
  out->activity_drain = NULL;
#endif
#ifdef FIXTURE_ACTIVITY_HALF_RANGES
  out->range_push = fixture_range;
  out->range_pop = NULL;
  out->range_mark = fixture_range;
#endif
  return NULL;
}
#endif

#ifdef FIXTURE_HOST_ALLOC_IS_DATA
/* Data where a function should be. */
static char g_not_host_alloc[64] = "a variable, not host_allocate";
static TFL_Error* fixture_host_deallocate(void* ptr) {
  (void)ptr;
  return NULL;
}
#endif

static void build_fixture(void) {
  build_ops();
  g_fixture_info.v1_0 = g_info;
  g_fixture_info.v1_0.name = FIXTURE_NAME;
  g_fixture_info.v1_0.vendor = FIXTURE_VENDOR;
#ifdef FIXTURE_MIN_TORCH_VERSION
  g_fixture_info.v1_0.min_torch_version = FIXTURE_MIN_TORCH_VERSION;
#endif
#ifdef FIXTURE_INFO_STRUCT_SIZE_ZERO
  g_fixture_info.v1_0.struct_size = 0;
#endif
  g_fixture_api.v1_0 = g_api;
  g_fixture_api.v1_0.abi_major = FIXTURE_ABI_MAJOR;
  g_fixture_api.v1_0.abi_minor = FIXTURE_ABI_MINOR;
  g_fixture_api.v1_0.get_info = fixture_get_info;
  g_fixture_api.v1_0.get_op_table = fixture_get_op_table;
  g_fixture_api.v1_0.device_properties = fixture_device_properties;
#ifdef FIXTURE_ACTIVITY
  g_fixture_api.v1_0.get_activity = fixture_get_activity;
#endif
#ifdef FIXTURE_NEWER_TABLE
  g_fixture_api.v1_0.struct_size = TFL_STRUCT_SIZE(FixtureApiV1_9, future_field);
  g_fixture_info.v1_0.struct_size = TFL_STRUCT_SIZE(FixtureInfoV1_9, future_string);
  g_fixture_info.future_string = "from the future";
  g_fixture_api.future_field = 7;
#endif
#ifdef FIXTURE_OLDER_TABLE
  g_fixture_api.v1_0.struct_size = offsetof(TFL_PluginApi, event_elapsed_time);
  /* Poison what an older plugin would not have: the host must not read it. */
  g_fixture_api.v1_0.event_elapsed_time = NULL;
  memset(&g_fixture_api.v1_0.memory_stats, 0xAB,
         sizeof(TFL_PluginApi) - offsetof(TFL_PluginApi, memory_stats));
#endif
#ifdef FIXTURE_TINY_TABLE
  g_fixture_api.v1_0.struct_size = offsetof(TFL_PluginApi, get_info);
#endif
#ifdef FIXTURE_NULL_ENTRY
  g_fixture_api.v1_0.FIXTURE_NULL_ENTRY = NULL;
#endif
#ifdef FIXTURE_COLLECTIVES
  g_fixture_api.v1_0.struct_size = TFL_STRUCT_SIZE(TFL_PluginApi, get_collectives);
#ifdef FIXTURE_COLLECTIVES_IS_DATA
  g_fixture_api.v1_0.get_collectives = (TFL_Error * (*)(TFL_Collectives*))(uintptr_t)g_not_code;
#else
  g_fixture_api.v1_0.get_collectives = fixture_get_collectives;
#endif
#endif
#ifdef FIXTURE_HOST_ALLOC_IS_DATA
  g_fixture_api.v1_0.struct_size = TFL_STRUCT_SIZE(TFL_PluginApi, host_deallocate);
  g_fixture_api.v1_0.get_collectives = NULL;
  g_fixture_api.v1_0.host_allocate = (TFL_Error * (*)(size_t, void**))(uintptr_t)g_not_host_alloc;
  g_fixture_api.v1_0.host_deallocate = fixture_host_deallocate;
#endif
#ifdef FIXTURE_NULL_OPTIONAL
  g_fixture_api.v1_0.event_elapsed_time = NULL;
  g_fixture_api.v1_0.memory_stats = NULL;
  g_fixture_api.v1_0.reset_peak_memory_stats = NULL;
  g_fixture_api.v1_0.empty_cache = NULL;
  g_fixture_api.v1_0.probe_devices = NULL;
  g_fixture_api.v1_0.get_activity = NULL;
#endif
#ifdef FIXTURE_INIT_FAILS
  g_fixture_api.v1_0.initialize = fixture_initialize;
#endif
#ifdef FIXTURE_NO_EVENT_TIMING
  g_fixture_info.v1_0.capabilities &= ~TFL_CAP_EVENT_TIMING;
  g_fixture_api.v1_0.event_elapsed_time = NULL;
#endif
#ifdef FIXTURE_WRONG_OOM_CODE
  g_fixture_api.v1_0.allocate = fixture_allocate;
#endif
#ifdef FIXTURE_CHATTY_STDOUT
  g_fixture_api.v1_0.initialize = fixture_chatty_initialize;
#endif
#ifdef FIXTURE_HANGING_SYNC
  g_fixture_api.v1_0.device_synchronize = fixture_device_synchronize;
#endif
#ifdef FIXTURE_HANGING_INIT
  g_fixture_api.v1_0.initialize = fixture_hanging_initialize;
#endif
#ifdef FIXTURE_CRASHING_INIT
  g_fixture_api.v1_0.initialize = fixture_crashing_initialize;
#endif
#ifdef FIXTURE_EXITING_INIT
  g_fixture_api.v1_0.initialize = fixture_exiting_initialize;
#endif
#ifdef FIXTURE_NULL_DEFAULT_STREAM
  g_fixture_api.v1_0.default_stream = fixture_default_stream;
#endif
#ifdef FIXTURE_ZERO_DEVICES
  g_fixture_api.v1_0.device_count = fixture_device_count;
  g_fixture_api.v1_0.allocate = fixture_no_device_allocate;
  g_fixture_api.v1_0.probe_devices = fixture_probe_none;
#endif
#ifdef FIXTURE_PROBE_NO_DRIVER
  g_fixture_api.v1_0.probe_devices = fixture_probe_no_driver;
  g_fixture_api.v1_0.initialize = fixture_loud_initialize;
#endif
#ifdef FIXTURE_NO_PROBE
  g_fixture_api.v1_0.struct_size = TFL_STRUCT_SIZE(TFL_PluginApi, host_deallocate);
  g_fixture_api.v1_0.probe_devices = NULL;
#endif
#ifdef FIXTURE_FORK_TRAP
  g_fixture_api.v1_0.initialize = trap_initialize;
  g_fixture_api.v1_0.device_synchronize = trap_device_synchronize;
  g_fixture_api.v1_0.allocate = trap_allocate;
  g_fixture_api.v1_0.deallocate = trap_deallocate;
  g_fixture_api.v1_0.copy = trap_copy;
  g_fixture_api.v1_0.stream_destroy = trap_stream_destroy;
  g_fixture_api.v1_0.event_destroy = trap_event_destroy;
#endif
}

#if defined(FIXTURE_BOOTSTRAP_IS_DATA)
/* A table where the function should be: calling it would crash the host. */
TFL_EXPORT const char torch_fl_plugin_get_api[64] = "a variable, not the bootstrap function";
void fixture_unused_builder(void);
void fixture_unused_builder(void) { build_fixture(); }
#elif !defined(FIXTURE_NO_BOOTSTRAP)
TFL_EXPORT const TFL_PluginApi* torch_fl_plugin_get_api(const TFL_HostApi* host) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  g_host = host;
  pthread_once(&once, build_fixture);
#ifdef FIXTURE_NULL_API
  return NULL;
#else
  return &g_fixture_api.v1_0;
#endif
}
#else
/* Keep the unused builder referenced so -Werror builds stay quiet. */
void fixture_unused_builder(void);
void fixture_unused_builder(void) { build_fixture(); }
#endif

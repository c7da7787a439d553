/*
 * The C interface of torch-fl's C++ shim.
 *
 * The shim is the only torch-fl code that links libtorch. It is a shared
 * library loaded after `import torch`; its static registrations (device
 * guard, hooks, allocator, minimal operators, the boxed CPU fallback, the
 * autocast fallthrough) run at load time. The Rust core loads, validates and
 * initializes plugins, resolves which plugin serves each operator, and then
 * hands the shim what it needs through this interface:
 *
 *   1. tfl_shim_attach_device: once per process, the plugin that provides
 *      the device runtime (memory, copies, streams, events) of the
 *      PrivateUse1 device;
 *   2. tfl_shim_register_kernel: once per operator, the winning kernel.
 *
 * The shim caches each kernel pointer inside the boxed kernel it registers
 * with the PyTorch dispatcher, so the op registry is never consulted on the
 * hot path.
 *
 * Conventions: every function is callable from any thread (the shim
 * serializes registration internally); strings are borrowed for the call
 * (the shim copies what it keeps); the plugin tables passed in must live as
 * long as the process (plugins are never unloaded). Functions that can fail
 * return 0 on success and otherwise write a NUL-terminated message of at
 * most `error_len` bytes into `error` and return a TFL_SHIM_* code.
 */
#ifndef TORCHFL_SHIM_H_
#define TORCHFL_SHIM_H_

#include <stddef.h>
#include <stdint.h>

#include "torch_fl/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when this interface changes; the Python package refuses a shim
 * built for another version. */
#define TFL_SHIM_INTERFACE_VERSION 7

/* Return codes. */
#define TFL_SHIM_OK 0
#define TFL_SHIM_ERROR_INVALID 1    /* malformed arguments */
#define TFL_SHIM_ERROR_STATE 2      /* e.g. attaching a second device */
#define TFL_SHIM_ERROR_UNKNOWN_OP 3 /* no such operator in PyTorch */
#define TFL_SHIM_ERROR_TORCH 4      /* PyTorch raised while registering */

/* How an operator argument travels in a TFL_CallFrame, by its schema type
 * (the TFL_Value mapping of plugin.h); the answer of
 * TFL_ShimDevice.argument_kind. */
typedef enum TFL_ShimArgKind {
  TFL_SHIM_ARG_TENSOR = 0,               /* Tensor, Tensor? */
  TFL_SHIM_ARG_TENSOR_LIST = 1,          /* Tensor[] */
  TFL_SHIM_ARG_OPTIONAL_TENSOR_LIST = 2, /* Tensor?[] */
  TFL_SHIM_ARG_INT = 3,                  /* int, SymInt, ScalarType, Layout, MemoryFormat */
  TFL_SHIM_ARG_FLOAT = 4,
  TFL_SHIM_ARG_BOOL = 5,
  TFL_SHIM_ARG_SCALAR = 6,
  TFL_SHIM_ARG_INT_LIST = 7, /* int[], SymInt[] */
  TFL_SHIM_ARG_FLOAT_LIST = 8,
  TFL_SHIM_ARG_BOOL_LIST = 9,
  TFL_SHIM_ARG_STRING = 10,
  TFL_SHIM_ARG_DEVICE = 11,   /* passed as its index */
  TFL_SHIM_ARG_GENERATOR = 12 /* passed as NONE; the state in rng_seed/rng_offset */
} TFL_ShimArgKind;

/* The plugin providing the device runtime of the PrivateUse1 device. */
typedef struct TFL_ShimDevice {
  size_t struct_size;
  /* The device name PrivateUse1 was renamed to ("sim"). */
  const char* device_name;
  /* How messages name the plugin: "'sim' (/path/libtorchfl_sim.so)". */
  const char* plugin_label;
  /* The plugin's validated, initialized function table. */
  const TFL_PluginApi* api;
  /* Negotiated ABI minor: the shim reads no field newer than this. */
  uint32_t abi_minor;
  int32_t device_count;
  uint64_t capabilities; /* TFL_CAP_*, as read after initialize */
  /* Returns the calling thread's in-flight record (torch-fl's crash report,
   * cpp_shim/src/runtime/inflight.h), which the shim writes around each call into
   * the plugin. NULL: nothing is recorded. Read only when struct_size
   * covers it. */
  void* (*inflight_slot)(void);
  /* Interface 7: rules the Rust core owns, asked for rather than restated
   * here. Required (the shim registers no kernel and names no kernel
   * symbol without them).
   *
   * kernel_symbol: writes the kernel symbol a plugin exports for operator
   * `op_name` ("[ns::]op[.overload]", as op tables name operators) into
   * `out`, NUL-terminated, when `capacity` covers it, and returns its length
   * without the NUL; 0 when the name is malformed.
   *
   * argument_kind: the TFL_ShimArgKind of an argument of the schema type
   * `type` as PyTorch prints it ("Tensor?", "int[]"), or -1 for a type the
   * plugin ABI cannot pass. */
  size_t (*kernel_symbol)(const char* op_name, char* out, size_t capacity);
  int32_t (*argument_kind)(const char* type);
} TFL_ShimDevice;

/* Outcome of tfl_shim_register_kernel. */
typedef enum TFL_ShimRegistration {
  /* Registered for the operator itself. */
  TFL_SHIM_REGISTERED = 0,
  /* A functional operator whose PyTorch implementation is structured
   * (CompositeExplicitAutogradNonFunctional): registered for its out=
   * overload, which PyTorch's in-place and out= forms reach after
   * computing output shapes, dtypes and the same-device check. The
   * functional form itself is registered too, with output metadata from
   * the operator's meta kernel memoized per input signature: measured
   * faster than the structured wrapper (cpp_shim/README.md, "Hot path"). */
  TFL_SHIM_REGISTERED_AS_OUT = 1,
  /* Not registered: CompositeImplicitAutograd (a kernel would lose the
   * decomposition's autograd), a view or alias operator (a kernel would
   * break storage sharing), or an operator the shim implements itself. */
  TFL_SHIM_SKIPPED_COMPOSITE_IMPLICIT = 2,
  TFL_SHIM_SKIPPED_VIEW = 3,
  TFL_SHIM_SKIPPED_BUILTIN = 4,
  /* Interface 3: an operator of another library (TFL_OP_EXTERNAL) that is
   * not loaded yet. The kernel is bound the first time the operator reaches
   * the device after the library defined it (registration.h). */
  TFL_SHIM_DEFERRED = 5
} TFL_ShimRegistration;

/* One operator's winning kernel. */
typedef struct TFL_ShimKernel {
  size_t struct_size;
  /* "[ns::]op[.overload]" as in the plugin's op table. */
  const char* op_name;
  TFL_KernelFn kernel;
  uint64_t flags; /* TFL_OP_* */
  /* The plugin that owns the kernel (its errors are released with this
   * table's error_destroy), and how messages name it. */
  const TFL_PluginApi* owner_api;
  const char* plugin_label;
  /* Nonzero when the owner is not the device-runtime plugin: the shim then
   * synchronizes the current stream before calling the kernel, because the
   * owner cannot order its work after the runtime plugin's streams. */
  int32_t foreign;
  /* The operator's schema for operators outside the aten namespace, as in
   * the plugin's op table ("fused_gelu(Tensor x) -> Tensor"); NULL for aten
   * operators. The shim defines the operator with it when PyTorch does not
   * know it yet, unless it is flagged TFL_OP_EXTERNAL: then the schema is
   * only compared with the one the owning library defines. Read only when
   * struct_size covers it (absent: NULL). */
  const char* schema;
  /* TFL_OpEntry.infer_outputs (ABI 1.1) for operators outside the aten
   * namespace, or NULL. The shim registers a Meta kernel over it, unless
   * the operator already has one. Read only when struct_size covers it. */
  TFL_InferOutputsFn infer_outputs;
} TFL_ShimKernel;

/* The fallback policy for operators no plugin serves (TORCH_FL_FALLBACK). */
typedef enum TFL_ShimFallbackMode {
  /* Run on the CPU, warning once per operator. */
  TFL_SHIM_FALLBACK_CPU = 0,
  /* Raise NotImplementedError naming the operator and the kernel symbol a
   * vendor would export. */
  TFL_SHIM_FALLBACK_ERROR = 1
} TFL_ShimFallbackMode;

/* Per-operator fallback count, for fallback accounting. */
typedef struct TFL_ShimFallbackCount {
  const char* op_name; /* owned by the shim, valid until the next call */
  uint64_t count;
} TFL_ShimFallbackCount;

/* TFL_SHIM_INTERFACE_VERSION of the loaded shim. */
uint32_t tfl_shim_interface_version(void);

/* The PyTorch version the shim was compiled against ("2.14.1"). */
const char* tfl_shim_torch_version(void);

/* Makes `device` the runtime of the PrivateUse1 device. Once per process:
 * a second call with another plugin returns TFL_SHIM_ERROR_STATE. */
int32_t tfl_shim_attach_device(const TFL_ShimDevice* device, char* error, size_t error_len);

/* Registers `kernel` with the dispatcher. On success stores a
 * TFL_ShimRegistration in *outcome. Registering an operator again replaces
 * the previous kernel (priorities are resolved by the caller). */
int32_t tfl_shim_register_kernel(const TFL_ShimKernel* kernel, int32_t* outcome, char* error, size_t error_len);

/* Sets the fallback policy (TFL_ShimFallbackMode). */
void tfl_shim_set_fallback_mode(int32_t mode);
int32_t tfl_shim_fallback_mode(void);

/* Copies up to `capacity` per-operator fallback counts into `out`, sorted
 * by operator name, and returns how many operators fell back in all. */
size_t tfl_shim_fallback_counts(TFL_ShimFallbackCount* out, size_t capacity);

/* Forgets all fallback counts (and the once-per-operator warnings). */
void tfl_shim_reset_fallback_counts(void);

/* The layer profile: time in the shim's operator entries, and the part of
 * it spent inside plugin kernel calls (cpp_shim/src/observe/layer_profile.h). */
typedef struct TFL_ShimLayerProfile {
  uint64_t entries;
  uint64_t entry_ns;
  uint64_t kernel_ns;
  uint64_t kernel_calls;
  uint64_t alloc_ns; /* inside the plugin's allocate/deallocate calls */
  uint64_t alloc_calls;
} TFL_ShimLayerProfile;

/* Turns the layer profile on (nonzero) or off; off by default. */
void tfl_shim_set_layer_profiling(int32_t on);
/* Copies the counters into *out (which must not be NULL). */
void tfl_shim_layer_profile(TFL_ShimLayerProfile* out);
/* Zeroes the counters, the per-operator ones included. */
void tfl_shim_reset_layer_profile(void);
/* The layer profile per operator: a JSON array of {"operator", "entries",
 * "entry_ns", "kernel_ns"} objects sorted by operator name. *out_len, `out`
 * and `capacity` as for tfl_shim_memory_snapshot. */
int32_t tfl_shim_layer_profile_operators(char* out, size_t capacity, size_t* out_len, char* error, size_t error_len);

/* The device allocator's segments and blocks as JSON, in the form of
 * torch.cuda.memory._snapshot() (cpp_shim/src/memory/caching_allocator.h). Stores
 * the document's length in *out_len and, when `capacity` covers it, the
 * document (not NUL-terminated) in `out`; call again with a larger buffer
 * otherwise. */
int32_t tfl_shim_memory_snapshot(char* out, size_t capacity, size_t* out_len, char* error, size_t error_len);

/* Stores in *out_caching 1 when device allocations go through torch-fl's
 * caching allocator, 0 when they go straight to the plugin
 * (TORCH_FL_ALLOC_CONF=backend:plugin, or a plugin with
 * TFL_CAP_CACHING_ALLOCATOR). Decided at the first allocation after attach;
 * before that, what it will be. TFL_SHIM_ERROR_TORCH with a message when
 * TORCH_FL_ALLOC_CONF is invalid. */
int32_t tfl_shim_allocator_backend(int32_t* out_caching, char* error, size_t error_len);

/* Stores in *out_stream the plugin's TFL_Stream* behind PyTorch's current
 * stream of `device` for the calling thread (what collectives enqueue on).
 * TFL_SHIM_ERROR_TORCH with a message for an invalid device or before
 * attach. */
int32_t tfl_shim_current_stream(int32_t device, void** out_stream, char* error, size_t error_len);

/* Stores in *out_generator a new reference to the Python torch.Generator of
 * `device`'s default generator (a PyObject*; the same object on every call),
 * or NULL with a Python exception set. The caller holds the GIL and owns the
 * reference. TFL_SHIM_ERROR_TORCH with a message for an invalid device. */
int32_t tfl_shim_default_generator(int32_t device, void** out_generator, char* error, size_t error_len);

/* Before a kernel that runs on the host over device memory (Inductor's
 * generated code): synchronizes the calling thread's current stream of
 * `device` (-1: the current device) if work was queued on it since the last
 * such wait, and stores in *out_waited whether it did. Other streams are not
 * waited for (CUDA's ordering: the user orders them with events).
 * TFL_SHIM_ERROR_TORCH with a message for an invalid device, before attach,
 * or when the queued work failed. */
int32_t tfl_shim_wait_current_stream_if_pending(int32_t device, int32_t* out_waited, char* error, size_t error_len);

/* Host synchronizations the shim made since the last reset. */
typedef struct TFL_ShimSyncCounts {
  uint64_t host_kernel_waits; /* by tfl_shim_wait_current_stream_if_pending */
  uint64_t copy_waits;        /* by copies whose caller reads host memory next */
} TFL_ShimSyncCounts;

/* Copies the counters into *out (which must not be NULL). */
void tfl_shim_sync_counts(TFL_ShimSyncCounts* out);
/* Zeroes the counters. */
void tfl_shim_reset_sync_counts(void);

/* The device trace (cpp_shim/src/observe/trace.h). tfl_shim_trace_begin starts a
 * consumer, turning recording on, and stores in *out_start where its
 * records begin. tfl_shim_trace_collect stores the records since `start`,
 * device times resolved (it waits for the devices' queued work), as JSON,
 * the way tfl_shim_memory_snapshot does. tfl_shim_trace_end ends a
 * consumer; the last one turns recording off and frees the records. Any
 * thread; a consumer's calls come from one thread at a time. */
int32_t tfl_shim_trace_begin(uint64_t* out_start, char* error, size_t error_len);
int32_t tfl_shim_trace_collect(uint64_t start, char* out, size_t capacity, size_t* out_len, char* error,
                               size_t error_len);
void tfl_shim_trace_end(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TORCHFL_SHIM_H_ */

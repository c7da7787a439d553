/*
 * The C interface of torch-fl's C++ shim.
 *
 * The shim is the only torch-fl code that links libtorch. It is a Python
 * extension module, torch_fl._C, imported after `import torch`; its static
 * registrations (device guard, hooks, allocator, minimal operators, the
 * boxed CPU fallback, the autocast fallthrough) run as it loads. The Rust
 * core loads, validates and initializes plugins, resolves which plugin
 * serves each operator, and then hands the shim what it needs through the
 * table of this header (TFL_ShimInterface):
 *
 *   1. attach_device: once per process, the plugin that provides the device
 *      runtime (memory, copies, streams, events) of the PrivateUse1 device;
 *   2. register_kernel: once per operator, the winning kernel;
 *   3. current_stream: the stream a collective enqueues on.
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
#define TFL_SHIM_INTERFACE_VERSION 10

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
  /* Interface 9: the plugin's graphs table (ABI 1.7), every entry validated
   * by the core to point into code; NULL when the plugin offers no native
   * graphs. Borrowed for the call: the shim copies the table. Read only
   * when struct_size covers it. */
  const TFL_Graphs* graphs;
  /* Interface 10: the plugin's activity table (ABI 1.8), its required
   * entries validated by the core to point into code (the range entries
   * all set or all NULL); NULL when the plugin offers no activity records.
   * Borrowed for the call: the shim copies the table. Read only when
   * struct_size covers it. */
  const TFL_Activity* activity;
} TFL_ShimDevice;

/* Outcome of TFL_ShimInterface.register_kernel. */
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

/* The Rust core's view of the shim: what it needs to attach the device,
 * register kernels and enqueue collectives, and nothing else. Everything
 * PyTorch-facing (fallback policy and counts, the layer profile, the memory
 * snapshot, the device trace, generators, host-synchronization counters) is
 * the shim's own Python module, torch_fl._C (cpp_shim/src/module.cpp).
 *
 * The module hands this table to the core as a PyCapsule named
 * TFL_SHIM_CAPSULE_NAME, its attribute `_shim_interface`; the table lives as
 * long as the process (extension modules are never unloaded). The core
 * refuses a table whose interface_version is not its own, and reads no
 * field past struct_size. tests/test_shim_interface.py compiles this header
 * and compares every offset with the Rust mirror
 * (crates/torchfl-python/src/shim.rs). */
#define TFL_SHIM_CAPSULE_NAME "torch_fl._C._shim_interface"

typedef struct TFL_ShimInterface {
  size_t struct_size;
  /* TFL_SHIM_INTERFACE_VERSION of the shim that filled the table. */
  uint32_t interface_version;
  /* The PyTorch version the shim was compiled against ("2.14.1"); static. */
  const char* torch_version;

  /* Makes `device` the runtime of the PrivateUse1 device. Once per
   * process: a second call with another plugin returns
   * TFL_SHIM_ERROR_STATE. */
  int32_t (*attach_device)(const TFL_ShimDevice* device, char* error, size_t error_len);

  /* Registers `kernel` with the dispatcher. On success stores a
   * TFL_ShimRegistration in *outcome. Registering an operator again
   * replaces the previous kernel (priorities are resolved by the caller). */
  int32_t (*register_kernel)(const TFL_ShimKernel* kernel, int32_t* outcome, char* error, size_t error_len);

  /* Stores in *out_stream the plugin's TFL_Stream* behind PyTorch's current
   * stream of `device` for the calling thread (what collectives enqueue
   * on). TFL_SHIM_ERROR_TORCH with a message for an invalid device or
   * before attach. */
  int32_t (*current_stream)(int32_t device, void** out_stream, char* error, size_t error_len);
} TFL_ShimInterface;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TORCHFL_SHIM_H_ */

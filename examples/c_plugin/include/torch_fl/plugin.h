/*
 * torch-fl plugin ABI
 * ===================
 *
 * This header is the whole contract between torch-fl (the "host") and an
 * accelerator plugin: one shared library that implements a device runtime and
 * operator kernels. A plugin includes this header, never links libtorch, and
 * keeps working when the user upgrades PyTorch; only torch-fl is rebuilt.
 *
 * The prose specification, with a worked example of every kind of version
 * mismatch, lives in docs/plugin-abi.md. This header is normative; the
 * document explains it.
 *
 * ---------------------------------------------------------------------------
 * Versioning
 * ---------------------------------------------------------------------------
 *
 * The ABI has a major and a minor version (TFL_ABI_VERSION_MAJOR/MINOR).
 *
 *  - A MINOR release only appends: new fields at the end of a struct, new
 *    entries at the end of a function table, new enumerator values, new
 *    flag bits. Nothing is removed, reordered or retyped. A peer built
 *    against an older minor keeps working unchanged.
 *  - A MAJOR release may change anything. Host and plugin with different
 *    majors refuse each other during the handshake, before either calls
 *    anything else.
 *
 * The handshake is two-way. The host passes its version and its service
 * table to the bootstrap symbol; the plugin returns its version and its
 * function table. Both sides then work at the LOWER of the two minors:
 *
 *  - every struct that crosses the boundary starts with `size_t struct_size`,
 *    set by whoever fills the struct to the size it was compiled with
 *    (use TFL_STRUCT_SIZE, never sizeof, which would include padding after
 *    the last field);
 *  - a reader reads a field only when struct_size covers it
 *    (`struct_size >= offsetof(T, f) + sizeof(f)`, see TFL_HAS_FIELD) and
 *    uses the documented default otherwise. A smaller struct from an older
 *    peer is never an error by itself;
 *  - fields a reader does not know (from a newer peer) are ignored.
 *
 * Fields and entries are marked below with the version that introduced
 * them. Released layouts are locked by static assertions in this header and
 * by layout tests in the torchfl-ffi crate.
 *
 * ---------------------------------------------------------------------------
 * Conventions that hold for every function unless its comment says otherwise
 * ---------------------------------------------------------------------------
 *
 * Errors.    A function returns TFL_Error*: NULL on success, otherwise an
 *            error object the CALLER owns and must release with the
 *            table's error_destroy. On failure, outputs are left untouched.
 *            No C++ exception, Rust panic or longjmp may cross this boundary.
 * Pointers.  Pointer arguments are borrowed for the duration of the call
 *            only. A callee that needs data after returning (for example to
 *            run work asynchronously on a stream) copies it.
 *            Strings are NUL-terminated UTF-8.
 * Threads.   Every function may be called concurrently from any host thread,
 *            including for the same device and the same stream.
 * Devices.   Device indices run from 0 to device_count-1. An out-of-range
 *            index is reported as TFL_ERROR_INVALID_ARGUMENT, never a crash.
 * Streams.   A NULL stream argument means "synchronous": the call returns
 *            after the work is complete, and the work is ordered after all
 *            work previously submitted to any stream of that device.
 * Async      A failure of work already queued on a stream is reported by
 * failures.  the next synchronizing call for that device (device_synchronize,
 *            or stream_/event_synchronize on one of its streams or events),
 *            once, then cleared, as CUDA does.
 * Outputs.   A struct the caller passes for the callee to fill carries the
 *            caller's struct_size; the callee writes only the fields that
 *            size covers and leaves struct_size unchanged.
 */
#ifndef TORCH_FL_PLUGIN_H_
#define TORCH_FL_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Version and struct-size helpers                                          */
/* ------------------------------------------------------------------------ */

#define TFL_ABI_VERSION_MAJOR 1
#define TFL_ABI_VERSION_MINOR 8

/* The size of `type` up to and including `last_field`: what a writer stores
 * in struct_size. */
#define TFL_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/* Whether a struct of type `type` whose struct_size is `size` contains
 * `field`. Readers test this before reading any field added after 1.0. */
#define TFL_HAS_FIELD(type, field, size) \
  ((size) >= TFL_STRUCT_SIZE(type, field))

/* Limits. The host checks every count, size and string a plugin hands it
 * against these BEFORE reading what they describe, and refuses a plugin that
 * exceeds one with an error naming the field (docs/plugin-abi.md, "What the
 * host validates"). They are far above anything a real plugin needs; a value
 * past them is a bug, such as an op-table count given in bytes.
 *
 *   TFL_MAX_ABI_VERSION    abi_major and abi_minor above this are not
 *                          versions: the table is malformed (garbage, or a
 *                          pointer to something that is not a TFL_PluginApi)
 *   TFL_MAX_STRUCT_SIZE    struct_size of TFL_PluginApi and TFL_PluginInfo
 *   TFL_MAX_OP_ENTRIES     TFL_OpTable.num_entries
 *   TFL_MAX_OP_ENTRY_SIZE  TFL_OpTable.entry_size
 *   TFL_MAX_STRING_LENGTH  bytes before the NUL of every string the plugin
 *                          returns: identity, operator names, symbols,
 *                          schemas, device names, error messages (messages
 *                          are cut there, the rest refused)
 *   TFL_MAX_DEVICES        device_count (0 is allowed: no device present)
 *
 * Beyond the limits, the host (on Linux) reads plugin memory only where it is
 * mapped readable, entry by entry and string by string, and calls a function
 * pointer only when it points into executable memory (a plugin's image, or
 * code a JIT-compiling plugin generated). */
#define TFL_MAX_ABI_VERSION 1000u
#define TFL_MAX_STRUCT_SIZE ((size_t)65536)
#define TFL_MAX_OP_ENTRIES ((size_t)65536)
#define TFL_MAX_OP_ENTRY_SIZE ((size_t)4096)
#define TFL_MAX_STRING_LENGTH ((size_t)4096)
#define TFL_MAX_DEVICES 64

/* The bootstrap symbol's name. Its signature (TFL_GetPluginApiFn) never
 * changes, in any major version. */
#define TFL_BOOTSTRAP_SYMBOL "torch_fl_plugin_get_api"

/* Kernel symbols: a plugin also exports each kernel of its op table under
 * TFL_KERNEL_SYMBOL_PREFIX followed by the mangled operator name, so kernels
 * are findable in a debugger and checkable by `torchfl-abi verify`.
 * Mangling of "<op>.<overload>" (docs/plugin-abi.md, "Kernel symbols"):
 *   add.Tensor           -> torch_fl_op_add_Tensor
 *   add_.Tensor          -> torch_fl_op_add__Tensor   (in-place: op is "add_")
 *   relu                 -> torch_fl_op_relu          (default overload)
 *   relu_                -> torch_fl_op_relu_
 *   convolution_backward -> torch_fl_op_convolution_backward
 *   sim::fused_gelu      -> torch_fl_op_sim__fused_gelu (non-aten namespace)
 * i.e. prefix + [ns + "__" if ns != "aten"] + op + ["_" + overload].
 * The op table is the source of truth; the exported symbol must be the very
 * function the table points to. */
#define TFL_KERNEL_SYMBOL_PREFIX "torch_fl_op_"

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* An error created by the plugin, owned by whoever received it, released
 * with TFL_PluginApi.error_destroy. Opaque to the host. */
typedef struct TFL_Error TFL_Error;

/* Codes are stable across all versions; new codes may be added in a minor
 * release, and a reader maps unknown codes to TFL_ERROR_UNKNOWN. */
typedef enum TFL_ErrorCode {
  TFL_ERROR_UNKNOWN = 1,
  TFL_ERROR_INVALID_ARGUMENT = 2,
  TFL_ERROR_OUT_OF_MEMORY = 3,
  /* The function or this combination of arguments (a dtype, a layout) is not
   * implemented. A kernel returning it must not have touched its outputs;
   * the host then applies its fallback policy as if the op were absent. */
  TFL_ERROR_UNIMPLEMENTED = 4,
  TFL_ERROR_INTERNAL = 5,
  /* The device is unusable (reset, removed, hung). */
  TFL_ERROR_DEVICE_LOST = 6,
  /* The call is valid but not in this state (e.g. init twice, elapsed time
   * between events that were not recorded with timing). */
  TFL_ERROR_FAILED_PRECONDITION = 7
} TFL_ErrorCode;

/* ------------------------------------------------------------------------ */
/* Host services: passed by the host to the bootstrap function              */
/* ------------------------------------------------------------------------ */

typedef enum TFL_LogLevel {
  TFL_LOG_DEBUG = 0,
  TFL_LOG_INFO = 1,
  TFL_LOG_WARNING = 2,
  TFL_LOG_ERROR = 3
} TFL_LogLevel;

/* Owned by the host; valid, unchanged, for the life of the process. The
 * plugin may keep the pointer. */
typedef struct TFL_HostApi {
  size_t struct_size;
  uint32_t abi_major; /* host's TFL_ABI_VERSION_MAJOR; offset fixed forever */
  uint32_t abi_minor; /* host's TFL_ABI_VERSION_MINOR; offset fixed forever */
  /* --- 1.0 --- */
  /* Opaque host state, passed back to every host function. */
  void* context;
  /* Emit a diagnostic through the host's logging. `message` is borrowed.
   * Thread-safe. Never NULL. */
  void (*log)(void* context, int32_t level /* TFL_LogLevel */,
              const char* message);
} TFL_HostApi;

/* ------------------------------------------------------------------------ */
/* Plugin identity                                                          */
/* ------------------------------------------------------------------------ */

/* Capability flags (TFL_PluginInfo.capabilities). Unknown bits are ignored. */
/* Device pointers returned by `allocate` may be dereferenced by host code
 * (unified or host memory). Lets the host run CPU fallbacks without copies.
 * A plugin that cannot promise this must leave the bit clear. */
#define TFL_CAP_HOST_ADDRESSABLE_MEMORY ((uint64_t)1 << 0)
/* Stream work runs asynchronously to the host: the host must synchronize
 * (stream, event or device) before reading results with host code. */
#define TFL_CAP_ASYNC_STREAMS ((uint64_t)1 << 1)
/* Events created with TFL_EVENT_TIMING support event_elapsed_time. */
#define TFL_CAP_EVENT_TIMING ((uint64_t)1 << 2)
/* 1.1: kernels accept float16 / bfloat16 tensors, so the host offers the
 * dtype to torch.autocast. A host meeting a 1.0 plugin assumes both (1.0
 * had no way to say), and routes ops whose kernel lacks the dtype
 * (UNIMPLEMENTED) to the fallback as usual. */
#define TFL_CAP_FLOAT16 ((uint64_t)1 << 3)
#define TFL_CAP_BFLOAT16 ((uint64_t)1 << 4)
/* 1.4: the plugin's allocate/deallocate are already cheap and cache memory
 * themselves (as a stream-ordered pool such as cudaMallocAsync's does). The
 * host then passes every tensor allocation straight to the plugin instead of
 * caching on top. Bit clear (and every plugin older than 1.4): allocate is
 * assumed to be expensive, and the host keeps freed blocks in its own
 * stream-aware cache and reuses them. */
#define TFL_CAP_CACHING_ALLOCATOR ((uint64_t)1 << 5)

/* Owned by the plugin; valid for the life of the process. The identity
 * strings never change. `capabilities` may depend on the options given to
 * initialize: before initialize it describes the plugin under default
 * options, and it is final once initialize has returned; the host reads it
 * (calling get_info again) after initialize. */
typedef struct TFL_PluginInfo {
  size_t struct_size;
  /* --- 1.0 --- */
  const char* name;              /* short identifier, e.g. "sim"; required */
  const char* vendor;            /* e.g. "torch-fl project"; required */
  const char* chip_family;       /* e.g. "simulated"; required */
  const char* plugin_version;    /* the plugin's own version, e.g. "1.2.0"; required */
  /* Lowest PyTorch version the plugin was validated with, e.g. "2.4", or
   * NULL for no constraint: MAJOR.MINOR[.PATCH], optionally followed by a
   * pre-release or local suffix ("2.5.0a0", "2.4+cpu"). Anything else is
   * refused at load. The host checks it when registering. */
  const char* min_torch_version;
  uint64_t capabilities;         /* TFL_CAP_* bits; see above */
} TFL_PluginInfo;

/* ------------------------------------------------------------------------ */
/* Device runtime types                                                     */
/* ------------------------------------------------------------------------ */

/* A stream: an in-order queue of work on one device. Owned by the plugin.
 * Streams from stream_create are released with stream_destroy; the default
 * stream of each device lives as long as the process. */
typedef struct TFL_Stream TFL_Stream;

/* An event: a marker recorded on a stream. Created with event_create,
 * released with event_destroy. */
typedef struct TFL_Event TFL_Event;

/* Filled by device_properties. The caller sets struct_size to the size it
 * knows; the plugin writes only the fields that size covers. */
typedef struct TFL_DeviceProperties {
  size_t struct_size;
  /* --- 1.0 --- */
  const char* name;             /* owned by the plugin, static lifetime */
  uint64_t total_memory;        /* bytes the device can allocate in all;
                                   0 is reported as a warning */
  int32_t compute_units;        /* 0 when unknown */
  uint32_t memory_alignment;    /* alignment of allocate's pointers, bytes */
  /* --- 1.2 --- */
  /* The device's architecture revision, as the vendor numbers its chip
   * generations (what torch.<name>.get_device_capability() returns, like
   * CUDA's compute capability). Only the vendor's own code can interpret
   * it. A host working at 1.0 or 1.1 does not ask for these fields and
   * reports (0, 0): "not declared". */
  int32_t capability_major;
  int32_t capability_minor;
} TFL_DeviceProperties;

/* Filled by memory_stats. Caller sets struct_size; all counts in bytes or
 * events since device start (peaks since the last reset_peak_memory_stats). */
typedef struct TFL_MemoryStats {
  size_t struct_size;
  /* --- 1.0 --- */
  uint64_t allocated_bytes;      /* live allocations */
  uint64_t peak_allocated_bytes;
  uint64_t reserved_bytes;       /* held by the plugin's allocator, >= allocated */
  uint64_t total_bytes;          /* capacity */
  uint64_t num_allocations;      /* successful allocate calls */
  uint64_t num_frees;
  uint64_t num_ooms;             /* allocate calls refused for lack of memory */
} TFL_MemoryStats;

typedef enum TFL_CopyKind {
  TFL_COPY_HOST_TO_DEVICE = 1,
  TFL_COPY_DEVICE_TO_HOST = 2,
  /* Source and destination may be on different devices of this plugin. */
  TFL_COPY_DEVICE_TO_DEVICE = 3
} TFL_CopyKind;

typedef struct TFL_CopyArgs {
  size_t struct_size;
  /* --- 1.0 --- */
  int32_t kind; /* TFL_CopyKind */
  int32_t dst_device;   /* ignored for DEVICE_TO_HOST */
  int32_t src_device;   /* ignored for HOST_TO_DEVICE */
  void* dst;
  const void* src;
  size_t nbytes;
  /* NULL: synchronous, ordered after all work previously submitted to the
   * devices involved (both, for DEVICE_TO_DEVICE across devices).
   * Otherwise a stream of the device that runs the copy (for
   * DEVICE_TO_DEVICE across devices: of src_device); the call returns once
   * the copy is queued and host buffers must stay valid and unchanged until
   * the stream has executed it. */
  TFL_Stream* stream;
} TFL_CopyArgs;

/* event_create flags. Unknown bits are ignored. */
#define TFL_EVENT_DEFAULT 0u
/* Record a timestamp so event_elapsed_time can be used. */
#define TFL_EVENT_TIMING 1u

/* ------------------------------------------------------------------------ */
/* Kernel call frame                                                        */
/* ------------------------------------------------------------------------ */

/* DLPack's type codes, so descriptors convert to DLTensor without tables. */
typedef enum TFL_DTypeCode {
  TFL_DTYPE_INT = 0,
  TFL_DTYPE_UINT = 1,
  TFL_DTYPE_FLOAT = 2,
  TFL_DTYPE_BFLOAT = 4,
  TFL_DTYPE_COMPLEX = 5,
  TFL_DTYPE_BOOL = 6
} TFL_DTypeCode;

/* An element type, as DLDataType: {code, bits, lanes}. bool is {BOOL, 8, 1},
 * float32 {FLOAT, 32, 1}, bfloat16 {BFLOAT, 16, 1}. A 4-byte value type,
 * frozen like DLDataType: it carries no struct_size. */
typedef struct TFL_DType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} TFL_DType;

/* TFL_Tensor.flags */
/* A Python number PyTorch wrapped into a 0-dim tensor (`t + 2.5` arrives
 * as add.Tensor): for type promotion only its category (bool, integral,
 * floating) counts, as in at::result_type. Always a HOST tensor. */
#define TFL_TENSOR_WRAPPED_NUMBER ((uint64_t)1 << 0)
/* An output the operator leaves undefined, such as a gradient that
 * convolution_backward's output_mask turned off: 1-D, zero elements, data
 * NULL, on the frame's device. The kernel must not write it. Only ever set
 * on outputs. */
#define TFL_TENSOR_UNDEFINED ((uint64_t)1 << 1)

typedef enum TFL_DeviceType {
  TFL_DEVICE_HOST = 1,   /* host memory; see TFL_Tensor.device_type */
  TFL_DEVICE_PLUGIN = 2  /* memory of this plugin's device device_index */
} TFL_DeviceType;

/* A strided view of memory, shaped like DLTensor. Built by the host,
 * borrowed by the kernel for the duration of the call. */
typedef struct TFL_Tensor {
  size_t struct_size;
  /* --- 1.0 --- */
  /* A device address inside one allocation: what allocate returned, or an
   * address the host derived from it by adding an offset that stays inside
   * the allocation (the host's caching allocator hands out parts of one
   * allocation, and a view's storage may start inside a block). For host
   * tensors, host memory. The first element is at data + byte_offset.
   * A plugin whose memory has no addresses maps addresses to its handles
   * (docs/plugin-abi.md, "Handle-based memory"). */
  void* data;
  uint64_t byte_offset;
  int32_t device_type;  /* TFL_DeviceType. v1 hosts pass HOST tensors only
                           for 0-dim wrapped scalars (PyTorch allows a 0-dim
                           CPU tensor beside device tensors) */
  int32_t device_index;
  TFL_DType dtype;
  int32_t ndim;         /* 0 for a scalar tensor */
  const int64_t* shape; /* ndim entries; may be NULL only when ndim == 0 */
  /* ndim entries, in elements (not bytes), never NULL when ndim > 0. A
   * stride may be 0 (a broadcast or expanded dimension) or any other
   * value: kernels must not assume contiguity without checking it. */
  const int64_t* strides;
  uint64_t flags; /* TFL_TENSOR_* bits; unknown bits are ignored */
} TFL_Tensor;

/* The kind of a TFL_Scalar. */
typedef enum TFL_ScalarKind {
  TFL_SCALAR_INT = 1,
  TFL_SCALAR_FLOAT = 2,
  TFL_SCALAR_BOOL = 3,
  TFL_SCALAR_COMPLEX = 4
} TFL_ScalarKind;

/* A PyTorch Scalar (an untyped number, as in add(Tensor, Scalar other)). */
typedef struct TFL_Scalar {
  int32_t kind; /* TFL_ScalarKind */
  union {
    int64_t i;
    double f;
    uint8_t b;
    double c[2]; /* real, imaginary */
  } v;
} TFL_Scalar;

/* Tags of TFL_Value. ATen schema types map as follows:
 *   Tensor                 -> TENSOR
 *   Tensor?                -> TENSOR, or NONE when absent
 *   Tensor[]               -> TENSOR_LIST (no NULL items)
 *   Tensor?[]              -> TENSOR_LIST (NULL items for absent entries)
 *   int, SymInt, ScalarType, Layout, MemoryFormat, Device index -> INT
 *   float                  -> FLOAT
 *   bool                   -> BOOL
 *   Scalar                 -> SCALAR
 *   int[], SymInt[]        -> INT_LIST
 *   float[]                -> FLOAT_LIST
 *   bool[N]                -> BOOL_LIST
 *   str                    -> STRING
 *   any optional `T?` absent -> NONE
 * ScalarType values use PyTorch's c10::ScalarType numbering (Float = 6);
 * see docs/plugin-abi.md. New tags are added only in minor releases; a
 * kernel that meets a tag it does not know returns INVALID_ARGUMENT. */
typedef enum TFL_ValueTag {
  TFL_VALUE_NONE = 0,
  TFL_VALUE_TENSOR = 1,
  TFL_VALUE_TENSOR_LIST = 2,
  TFL_VALUE_INT = 3,
  TFL_VALUE_FLOAT = 4,
  TFL_VALUE_BOOL = 5,
  TFL_VALUE_SCALAR = 6,
  TFL_VALUE_INT_LIST = 7,
  TFL_VALUE_FLOAT_LIST = 8,
  TFL_VALUE_BOOL_LIST = 9,
  TFL_VALUE_STRING = 10
} TFL_ValueTag;

/* One argument of an operator call. Built by the host, borrowed by the
 * kernel for the duration of the call. */
typedef struct TFL_Value {
  size_t struct_size;
  /* --- 1.0 --- */
  int32_t tag; /* TFL_ValueTag */
  union {
    const TFL_Tensor* tensor;
    struct {
      const TFL_Tensor* const* items;
      size_t len;
    } tensor_list;
    int64_t i;
    double f;
    uint8_t b; /* 0 or 1 */
    TFL_Scalar scalar;
    struct {
      const int64_t* items;
      size_t len;
    } int_list;
    struct {
      const double* items;
      size_t len;
    } float_list;
    struct {
      const uint8_t* items;
      size_t len;
    } bool_list;
    struct {
      const char* data; /* NUL-terminated; len excludes the NUL */
      size_t len;
    } string;
  } u;
} TFL_Value;

typedef struct TFL_CallFrame TFL_CallFrame;

/* Host callback for operators whose output shape depends on data (nonzero,
 * unique, masked_select): resizes output `output_index` to `shape`
 * (contiguous), reallocating its memory if needed, and updates
 * frame->outputs[output_index] in place. The kernel must re-read that
 * descriptor afterwards. Call it from the kernel call itself, never from
 * asynchronous stream work. Returns 0 on success, otherwise a TFL_ErrorCode
 * (OUT_OF_MEMORY, INVALID_ARGUMENT), which the kernel reports in an error
 * of its own: the host cannot create plugin error objects. */
typedef int32_t (*TFL_ResizeOutputFn)(const TFL_CallFrame* frame,
                                      size_t output_index, int32_t ndim,
                                      const int64_t* shape);

/* Everything a kernel receives. Owned by the host; the frame and everything
 * it points to are valid only until the kernel returns. Device memory that
 * the tensors refer to stays valid until the work the kernel enqueued has
 * run, because the plugin's deallocate is stream-ordered (see `deallocate`). */
struct TFL_CallFrame {
  size_t struct_size;
  /* --- 1.0 --- */
  /* The ATen operator being run, "add.Tensor": for error messages. */
  const char* op_name;
  int32_t device_index;
  /* The stream to run on; never NULL (the host passes the device's current
   * stream, which may be its default stream). */
  TFL_Stream* stream;
  /* Arguments in ATen schema order, out= arguments excluded. */
  const TFL_Value* const* args;
  size_t num_args;
  /* Outputs, one per schema return, allocated by the host with the shape,
   * dtype and strides PyTorch would give them (out-variant semantics). For
   * an in-place op (`add_.Tensor`) outputs[0] is `self`, which is also
   * args[0]. Writable by the kernel only through resize_output. */
  TFL_Tensor* const* outputs;
  size_t num_outputs;
  TFL_ResizeOutputFn resize_output; /* never NULL */
  void* host_context;               /* for the host's use in resize_output */
  /* Philox-style counter-based RNG state for ops flagged TFL_OP_RANDOM:
   * the kernel draws numbers for counter values starting at rng_offset
   * under key rng_seed. 0 for other ops. */
  uint64_t rng_seed;
  uint64_t rng_offset;
};

/* A kernel. Returns NULL on success. It may enqueue work on frame->stream
 * and return before it runs; it must validate arguments first and report
 * invalid ones synchronously. Thread-safe. */
typedef TFL_Error* (*TFL_KernelFn)(const TFL_CallFrame* frame);

/* 1.1: the most dimensions an output of an operator with infer_outputs can
 * have. */
#define TFL_MAX_OUTPUT_DIMS 16

/* 1.1: the metadata of one output, filled by TFL_OpEntry.infer_outputs.
 * The host allocates the output contiguous with this dtype and shape. */
typedef struct TFL_OutputMeta {
  size_t struct_size; /* set by the host */
  /* --- 1.1 --- */
  TFL_DType dtype;
  int32_t ndim; /* 0..TFL_MAX_OUTPUT_DIMS */
  int64_t shape[TFL_MAX_OUTPUT_DIMS];
} TFL_OutputMeta;

/* 1.1: computes the dtype and shape of every output of a call without
 * running it, for operators PyTorch has no shape function for (custom
 * operators): this is their "meta" or "fake" implementation, which eager
 * output allocation and torch.compile's tracing use.
 * The frame is as for the kernel except: every tensor's `data` is NULL
 * (only dtype, shape and strides are meaningful), `stream` is NULL,
 * `outputs` is NULL and `num_outputs` is 0. `out` has `num_outputs`
 * entries (one per schema return) whose struct_size the host has set.
 * Must not touch device memory or enqueue work. Returns NULL, or an
 * INVALID_ARGUMENT error whose message PyTorch users will see (shape
 * mismatches are reported here, before any memory is allocated).
 * Thread-safe. */
typedef TFL_Error* (*TFL_InferOutputsFn)(const TFL_CallFrame* frame,
                                         TFL_OutputMeta* out,
                                         size_t num_outputs);

/* ------------------------------------------------------------------------ */
/* Operator table                                                           */
/* ------------------------------------------------------------------------ */

/* TFL_OpEntry.flags */
/* Consumes random numbers: the host fills rng_seed/rng_offset. */
#define TFL_OP_RANDOM ((uint64_t)1 << 0)
/* Output shape depends on input data: the host passes outputs of shape
 * [0] and the kernel calls resize_output. */
#define TFL_OP_DYNAMIC_SHAPE ((uint64_t)1 << 1)
/* Results may differ between runs on identical inputs. */
#define TFL_OP_NONDETERMINISTIC ((uint64_t)1 << 2)
/* 1.3: the operator belongs to another library ("torchvision::nms"), which
 * defines it when it is loaded. `schema` states the schema the kernel was
 * written for: the host never defines the operator from it, it binds the
 * kernel once the library has defined the operator with that schema (also
 * when the library is loaded after the plugin was registered) and refuses
 * a library whose schema differs. A host older than 1.3 does not know this
 * bit and would define the operator itself: list such entries only to
 * hosts whose TFL_HostApi.abi_minor is 3 or more. */
#define TFL_OP_EXTERNAL ((uint64_t)1 << 3)

typedef struct TFL_OpEntry {
  size_t struct_size;
  /* --- 1.0 --- */
  /* "[ns::]op[.overload]": "add.Tensor", "add_.Tensor", "relu",
   * "sim::fused_gelu". Unique within a table. */
  const char* name;
  /* The exported symbol for this kernel (see TFL_KERNEL_SYMBOL_PREFIX). */
  const char* symbol;
  TFL_KernelFn kernel; /* never NULL */
  uint64_t flags;      /* TFL_OP_* */
  /* For operators outside the aten namespace: the full schema, e.g.
   * "fused_gelu(Tensor x, Tensor bias) -> Tensor". NULL for aten ops. */
  const char* schema;
  /* --- 1.1 --- */
  /* Output metadata for operators outside the aten namespace (see
   * TFL_InferOutputsFn); NULL otherwise. Without it the host can run such
   * an operator only once Python code registers a fake implementation
   * (torch.library.register_fake). */
  TFL_InferOutputsFn infer_outputs;
} TFL_OpEntry;

/* Filled by get_op_table. Entries are laid out every `entry_size` bytes
 * (the plugin's TFL_STRUCT_SIZE of TFL_OpEntry), so the entry struct can
 * grow in minor releases. */
typedef struct TFL_OpTable {
  size_t struct_size;
  /* --- 1.0 --- */
  const TFL_OpEntry* entries; /* owned by the plugin, static lifetime */
  /* The number of ENTRIES (sizeof ops / sizeof ops[0], not sizeof ops), at
   * most TFL_MAX_OP_ENTRIES. */
  size_t num_entries;
  size_t entry_size; /* at least TFL_STRUCT_SIZE(TFL_OpEntry, kernel), at
                        most TFL_MAX_OP_ENTRY_SIZE */
} TFL_OpTable;

/* ------------------------------------------------------------------------ */
/* Initialization                                                           */
/* ------------------------------------------------------------------------ */

typedef struct TFL_InitArgs {
  size_t struct_size;
  /* --- 1.0 --- */
  /* Plugin-specific configuration as "key=value" pairs separated by ';',
   * e.g. "devices=2;memory=1GiB"; NULL or "" for defaults. Unknown keys are
   * an INVALID_ARGUMENT error naming the key. Borrowed. */
  const char* options;
} TFL_InitArgs;

/* ------------------------------------------------------------------------ */
/* Collective communication (1.3, OPTIONAL)                                 */
/* ------------------------------------------------------------------------ */

/* The collectives extension: communicators spanning one device in each of
 * several processes (ranks), and the collective and point-to-point
 * operations torch.distributed runs over them. It is shaped like NCCL (and
 * HCCL, CNCL, RCCL, which copy NCCL) so that a vendor maps each entry to one
 * library call. docs/plugin-abi.md, "Collectives (ABI 1.3)", states the
 * rules; the essentials:
 *
 *  - The extension is found through TFL_PluginApi.get_collectives. A plugin
 *    older than 1.3, a NULL entry, or get_collectives returning an error
 *    means "no collectives": the host then runs collectives through host
 *    memory (copy to host, the CPU backend, copy back).
 *  - Every rank issues the same collectives on a communicator in the same
 *    order, with the same count, dtype, op and root (as NCCL requires). A
 *    plugin should report a mismatch it can detect as INVALID_ARGUMENT,
 *    synchronously or as an asynchronous error.
 *  - Each operation is ENQUEUED on `stream` (a stream of the communicator's
 *    device) and ordered with kernels, copies and events on that stream;
 *    the call returns once the operation is queued (validation errors are
 *    reported synchronously). A NULL stream means "synchronous", as
 *    everywhere in the ABI: the call returns when the operation is
 *    complete on this rank. Device buffers must stay allocated until the
 *    stream has run the operation (the runtime's stream-ordered free
 *    guarantees this for buffers the host frees after enqueueing).
 *  - A failure of queued work (a peer that died, a timeout, a mismatch) is
 *    reported through comm_get_async_error, and also like any asynchronous
 *    failure, by the next synchronizing call of the device.
 *  - Threads: calls that name a communicator come from one host thread at
 *    a time per communicator (the host serializes them), except
 *    comm_get_async_error and comm_abort, which may be called from any
 *    thread at any time, also while another call on the communicator
 *    blocks. Different communicators may be used concurrently.
 *  - A communicator belongs to the process that created it: a forked child
 *    never uses it (the host refuses all plugin calls in such a child).
 *  - Settings (1.5): comm_init_rank_config takes a TFL_CommConfig with the
 *    timeout the user gave torch.distributed and blocking or non-blocking
 *    creation, as NCCL's ncclCommInitRankConfig does. A plugin without it
 *    (NULL, or older than 1.5) gets comm_init_rank, and the host enforces
 *    its own timeout. */

/* The size of a unique id: NCCL's NCCL_UNIQUE_ID_BYTES. */
#define TFL_UNIQUE_ID_BYTES 128

/* What ranks need to find each other: created by get_unique_id in one
 * process, sent by the host to every rank (through torch.distributed's
 * rendezvous store) as opaque bytes, and passed to comm_init_rank. A frozen
 * 128-byte value type, like TFL_DType: it carries no struct_size. */
typedef struct TFL_UniqueId {
  uint8_t bytes[TFL_UNIQUE_ID_BYTES];
} TFL_UniqueId;

/* A communicator: this process' member of a group of ranks. Owned by the
 * plugin; created by comm_init_rank, released by comm_destroy. */
typedef struct TFL_Comm TFL_Comm;

/* Reduction operators (the `op` argument). Values are frozen; new ones may
 * be added in a minor release, and a plugin answers one it does not know
 * with UNIMPLEMENTED. AVG divides the sum by the world size (for integer
 * dtypes with C's integer division, as NCCL does). For bool, SUM and MAX
 * are logical or, PROD and MIN logical and; AVG is INVALID_ARGUMENT. */
typedef enum TFL_ReduceOp {
  TFL_REDUCE_SUM = 0,
  TFL_REDUCE_PROD = 1,
  TFL_REDUCE_MIN = 2,
  TFL_REDUCE_MAX = 3,
  TFL_REDUCE_AVG = 4
} TFL_ReduceOp;

/* Settings of a new communicator (1.5), like NCCL's ncclConfig_t. The host
 * fills it; a plugin reads only the fields that struct_size covers and uses
 * its defaults for the rest. Borrowed for the call. */
typedef struct TFL_CommConfig {
  size_t struct_size;
  /* --- 1.5 --- */
  /* How long the communicator waits for its peers, in milliseconds: the
   * rendezvous of comm_init_rank_config and every later wait for a peer.
   * 0: the plugin's default. */
  uint64_t timeout_ms;
  /* 1: comm_init_rank_config returns once every rank has joined, as
   * comm_init_rank does. 0 (NCCL's blocking = 0): it returns at once with
   * the communicator; joining completes in the background, operations
   * enqueued meanwhile wait for it (they stay ordered), and a failure to
   * join becomes the communicator's asynchronous error
   * (comm_get_async_error, and the device's next synchronize). comm_abort
   * and comm_destroy work at any point. */
  int32_t blocking;
} TFL_CommConfig;

/* The collectives table, filled by TFL_PluginApi.get_collectives into a
 * struct the host allocates (its struct_size set by the host, see
 * "Outputs" above). Every 1.3 entry is REQUIRED (non-NULL) when
 * get_collectives succeeds; the host refuses a plugin otherwise. Entries
 * added in later minors are appended and marked, each with whether it may
 * be NULL; the host reads one only when both sides speak its minor.
 *
 * In every operation: `count` is in elements of `dtype` (0 is allowed and
 * still takes part in the collective); `dtype` is one of the dtypes the
 * kernels accept (a plugin answers one it cannot reduce with
 * UNIMPLEMENTED); buffers are device addresses inside allocations of the
 * communicator's device (a pointer from `allocate` plus an offset, as for
 * tensors), borrowed until the stream has run the operation; send and
 * receive buffers may be the same pointer (in place) where noted. */
typedef struct TFL_Collectives {
  size_t struct_size;
  /* --- 1.3 --- */
  /* Creates a unique id for a new group. Called in ONE process (the host
   * uses rank 0); the process must stay alive until every rank's
   * comm_init_rank has returned. Thread-safe. */
  TFL_Error* (*get_unique_id)(TFL_UniqueId* out);
  /* Creates this process' member `rank` (0..world_size-1) of the group
   * named by `id`, on `device`. Blocks until all world_size ranks have
   * joined, or fails (DEVICE_LOST or FAILED_PRECONDITION, with a message
   * naming the missing ranks) after the plugin's timeout. At most one
   * communicator per (group, rank). `id` is borrowed. Thread-safe. */
  TFL_Error* (*comm_init_rank)(const TFL_UniqueId* id, int32_t world_size,
                               int32_t rank, int32_t device,
                               TFL_Comm** out_comm);
  /* Waits for the communicator's queued operations, then releases it (and
   * any error it held). No call on `comm` may be in progress or follow.
   * Destroying an aborted communicator is valid and does not wait. */
  TFL_Error* (*comm_destroy)(TFL_Comm* comm);
  /* Aborts the communicator: operations waiting for peers fail promptly
   * (as asynchronous errors), queued ones are dropped, and later
   * operations on `comm` fail with FAILED_PRECONDITION. The device stays
   * usable. The communicator must still be destroyed. Callable from any
   * thread, also while another call on `comm` blocks. */
  TFL_Error* (*comm_abort)(TFL_Comm* comm);
  /* Sets *out_error to the communicator's first asynchronous failure (an
   * error the caller owns), or to NULL when there is none. The failure
   * stays set: a failed communicator stays failed, as in NCCL, and must be
   * aborted. Callable from any thread. */
  TFL_Error* (*comm_get_async_error)(TFL_Comm* comm, TFL_Error** out_error);
  /* recv[i] = op over all ranks of send[i], for i < count, on every rank.
   * In place when send == recv. */
  TFL_Error* (*all_reduce)(const void* send, void* recv, size_t count,
                           TFL_DType dtype, int32_t op /* TFL_ReduceOp */,
                           TFL_Comm* comm, TFL_Stream* stream);
  /* recv = root's send on every rank (send is read on root only and may
   * be NULL elsewhere). In place when send == recv. */
  TFL_Error* (*broadcast)(const void* send, void* recv, size_t count,
                          TFL_DType dtype, int32_t root, TFL_Comm* comm,
                          TFL_Stream* stream);
  /* recv on `root` = op over all ranks of send; recv is written on root
   * only and may be NULL elsewhere. In place when send == recv. */
  TFL_Error* (*reduce)(const void* send, void* recv, size_t count,
                       TFL_DType dtype, int32_t op /* TFL_ReduceOp */,
                       int32_t root, TFL_Comm* comm, TFL_Stream* stream);
  /* recv (world_size * send_count elements) = the ranks' send buffers
   * concatenated in rank order. In place when send == recv + rank *
   * send_count. */
  TFL_Error* (*all_gather)(const void* send, void* recv, size_t send_count,
                           TFL_DType dtype, TFL_Comm* comm,
                           TFL_Stream* stream);
  /* recv (recv_count elements) = block `rank` of op over all ranks of send
   * (world_size * recv_count elements). In place when recv == send + rank
   * * recv_count. */
  TFL_Error* (*reduce_scatter)(const void* send, void* recv,
                               size_t recv_count, TFL_DType dtype,
                               int32_t op /* TFL_ReduceOp */, TFL_Comm* comm,
                               TFL_Stream* stream);
  /* Block j (count_per_rank elements) of send goes to rank j, which stores
   * it as block `rank` of its recv. send and recv hold world_size blocks
   * and must not overlap. */
  TFL_Error* (*all_to_all)(const void* send, void* recv,
                           size_t count_per_rank, TFL_DType dtype,
                           TFL_Comm* comm, TFL_Stream* stream);
  /* Sends count elements to `peer`, which calls recv with this rank, the
   * same count and dtype. Point-to-point calls between two ranks match in
   * issue order. A send and a recv that depend on each other (an exchange)
   * must be in one group, or they may deadlock as in NCCL. */
  TFL_Error* (*send)(const void* buf, size_t count, TFL_DType dtype,
                     int32_t peer, TFL_Comm* comm, TFL_Stream* stream);
  TFL_Error* (*recv)(void* buf, size_t count, TFL_DType dtype, int32_t peer,
                     TFL_Comm* comm, TFL_Stream* stream);
  /* Operations on `comm` issued by this thread between group_start and
   * group_end form one group: the plugin may defer them to group_end and
   * runs them so that sends and receives among them cannot deadlock (and
   * may fuse collectives). Groups nest; only the outermost group_end
   * launches. All operations of a group use the same stream. A plugin
   * built on NCCL maps these to ncclGroupStart/ncclGroupEnd. */
  TFL_Error* (*group_start)(TFL_Comm* comm);
  TFL_Error* (*group_end)(TFL_Comm* comm);

  /* --- 1.5: OPTIONAL (may be NULL) --- */
  /* comm_init_rank with settings: `config` (borrowed; NULL means the
   * defaults, as comm_init_rank) gives the timeout for the rendezvous and
   * every later wait for a peer, and whether the call blocks until every
   * rank has joined (see TFL_CommConfig). Failing to join within the
   * timeout is DEVICE_LOST or FAILED_PRECONDITION, synchronously when
   * blocking, as the communicator's asynchronous error when not. The
   * communicator is released by comm_destroy like any other. At most one
   * communicator per (group, rank). Thread-safe.
   * Absent (NULL, or a plugin older than 1.5): the host calls
   * comm_init_rank, which blocks, and enforces the timeout itself. */
  TFL_Error* (*comm_init_rank_config)(const TFL_UniqueId* id,
                                      int32_t world_size, int32_t rank,
                                      int32_t device,
                                      const TFL_CommConfig* config,
                                      TFL_Comm** out_comm);
} TFL_Collectives;

/* ------------------------------------------------------------------------ */
/* Device graphs (1.7, OPTIONAL)                                            */
/* ------------------------------------------------------------------------ */

/* The graphs extension: record a sequence of kernel launches and copies once,
 * then launch it as one unit, as cudaStreamBeginCapture / cudaGraphLaunch
 * (and Ascend's aclmdlRICapture*) do. Without it the host still gives every
 * plugin device graphs: it records the launches itself and replays them one
 * kernel call at a time (docs/plugin-abi.md, "Device graphs (ABI 1.7)").
 * With it, a replay is one call into the plugin, and the plugin can submit
 * the whole graph to its device at once. The rules:
 *
 *  - Found through TFL_PluginApi.get_graphs. A plugin older than 1.7, a NULL
 *    entry, or get_graphs returning an error means "no native graphs".
 *  - Capture. After stream_begin_capture(stream), kernels the host calls on
 *    that stream (TFL_CallFrame.stream) and copies it queues on it
 *    (TFL_CopyArgs.stream, device to device) are RECORDED, not run: the call
 *    validates and returns, and nothing is executed or queued until the
 *    graph is launched. Other streams are unaffected. The host never
 *    synchronizes, queries, records events on or copies to or from the host
 *    on a capturing stream, and calls no kernel flagged
 *    TFL_OP_DYNAMIC_SHAPE on it. stream_end_capture returns what was
 *    recorded as a TFL_Graph and ends capture mode.
 *  - Frames. The frame of a kernel called on a capturing stream, and
 *    everything it points to, stays valid and unchanged until the graph and
 *    every exec instantiated from it are destroyed; a plugin may keep
 *    pointers into it instead of copying. Its stream field names the
 *    capturing stream, which the host may destroy once capture has ended.
 *    resize_output refuses every call during capture.
 *  - Random numbers. A recorded random kernel's frame holds an rng_offset
 *    RELATIVE to the graph's draw (rng_seed is 0). Each launch passes the
 *    seed and a base offset (TFL_GraphLaunchArgs): the kernel then draws as
 *    if called with rng_seed = seed and rng_offset = base + its recorded
 *    rng_offset. Replays therefore draw fresh numbers, as CUDA graphs do
 *    with their philox offset.
 *  - Launch. graph_launch enqueues the whole graph on `stream` (any stream
 *    of the graph's device; not NULL), ordered after the work queued there
 *    before it and before the work queued after it, and returns without
 *    waiting. An exec may be launched again before earlier launches ran;
 *    launches of one exec on one stream run in order. Failures of launched
 *    work are asynchronous failures (the device's next synchronizing call).
 *  - Memory. Device addresses in recorded frames stay valid while the host
 *    holds the graph: the host keeps every tensor a graph reads or writes
 *    allocated until it destroys the graph and its execs, and destroys an
 *    exec only after every launch of it has completed.
 *  - Threads. Calls naming one graph or exec come from one host thread at a
 *    time; different graphs may be used concurrently. */

/* A recorded capture, owned by the plugin; released by graph_destroy. */
typedef struct TFL_Graph TFL_Graph;
/* A launchable (instantiated) graph, owned by the plugin; released by
 * graph_exec_destroy. */
typedef struct TFL_GraphExec TFL_GraphExec;

/* What one launch draws from. Filled by the host; borrowed for the call. */
typedef struct TFL_GraphLaunchArgs {
  size_t struct_size;
  /* --- 1.7 --- */
  uint64_t rng_seed;        /* every recorded random kernel's rng_seed */
  uint64_t rng_offset_base; /* added to each recorded rng_offset */
} TFL_GraphLaunchArgs;

/* The graphs table, filled by TFL_PluginApi.get_graphs into a struct the
 * host allocates (its struct_size set by the host). Every 1.7 entry is
 * REQUIRED (non-NULL) when get_graphs succeeds; the host uses none of them
 * otherwise. */
typedef struct TFL_Graphs {
  size_t struct_size;
  /* --- 1.7 --- */
  /* Puts `stream` (not a default stream, not NULL) in capture mode. A
   * stream already capturing is INVALID_ARGUMENT. */
  TFL_Error* (*stream_begin_capture)(TFL_Stream* stream);
  /* Ends capture mode of `stream` and returns what it recorded (possibly
   * nothing) as a new graph. A stream not capturing is INVALID_ARGUMENT. */
  TFL_Error* (*stream_end_capture)(TFL_Stream* stream, TFL_Graph** out);
  /* Makes a launchable exec of `graph`; the graph may be destroyed before
   * the exec only if the plugin copied what the exec needs (the host
   * destroys execs first). */
  TFL_Error* (*graph_instantiate)(TFL_Graph* graph, TFL_GraphExec** out);
  /* Enqueues one run of the graph on `stream` (see "Launch"). */
  TFL_Error* (*graph_launch)(TFL_GraphExec* exec, TFL_Stream* stream,
                             const TFL_GraphLaunchArgs* args);
  TFL_Error* (*graph_exec_destroy)(TFL_GraphExec* exec);
  TFL_Error* (*graph_destroy)(TFL_Graph* graph);
} TFL_Graphs;

/* ------------------------------------------------------------------------ */
/* Activity records and ranges (1.8, OPTIONAL)                              */
/* ------------------------------------------------------------------------ */

/* The activity extension: what the plugin itself did for each call, in its
 * vendor runtime's own terms and on its device's own clock, as CUPTI's
 * activity API (and roctracer, msprof) report for CUDA, ROCm and Ascend:
 * which native calls one operator made (clEnqueueNDRangeKernel three times,
 * a program build on first use), and when its kernels and copies ran on the
 * device. The host nests the records under the operator that caused them
 * (torch_fl.trace, torch.profiler; docs/plugin-abi.md, "Activity records
 * (ABI 1.8)"). Without it the host still times each call with a pair of
 * timing events around it. The rules:
 *
 *  - Found through TFL_PluginApi.get_activity. A plugin older than 1.8, a
 *    NULL entry, or get_activity returning an error means "no records".
 *  - Recording. activity_enable(kinds) records the kinds whose bit
 *    (1u << TFL_ActivityKind) is set, from then on; activity_enable(0)
 *    stops. Recording is off until the host enables it, and a plugin with
 *    recording off must cost nothing measurable (a relaxed load per call).
 *  - Correlation. Around each call the host makes into the plugin for an
 *    operator (a kernel, a copy), it calls activity_set_correlation(id) on
 *    the calling thread before, and after it restores the id of the call it
 *    is nested in (0 outside any). Every
 *    record for what that thread did meanwhile, and for the device work it
 *    queued, carries `id` as correlation_id, including records made later on
 *    another thread (a queue's worker, a completion callback): the plugin
 *    carries the id along with the work. Work without a call (a build at
 *    initialize, a sync the host asked for) carries the thread's current id,
 *    0 when none.
 *  - Buffers. The plugin stages records in memory it owns, bounded: a
 *    record that does not fit is counted as dropped, never blocks, never
 *    grows memory without limit. activity_drain moves up to `capacity`
 *    COMPLETE records (their end time known), oldest first, into the host's
 *    array: record i at (char*)records + i * record_size. The plugin writes
 *    min(record_size, its sizeof(TFL_ActivityRecord)) bytes of each and sets
 *    each record's struct_size to the number it wrote; names are
 *    NUL-terminated within their arrays. Records of unfinished work wait for
 *    a later drain. The host drains after its synchronizing calls and when a
 *    trace ends, until fewer than `capacity` come back.
 *  - Clocks. Times are nanoseconds. A record flagged TFL_ACTIVITY_HOST_CLOCK
 *    (a native call, a build, a range) is on the host's CLOCK_MONOTONIC;
 *    any other on the device's own clock (any epoch, monotonic).
 *    activity_clock returns one device time and the CLOCK_MONOTONIC time at
 *    the same moment, as close together as the plugin can read them; the
 *    host maps device times onto its timeline through such pairs.
 *  - Ranges. range_push / range_pop / range_mark forward user annotations
 *    (torch.<device>.nvtx, torch.profiler.record_function) to the vendor's
 *    own tools, as nvtxRangePush does for Nsight. Ranges nest per thread; the
 *    name is borrowed for the call. The three are present together or all
 *    NULL (no annotations). A plugin also records them (TFL_ACTIVITY_RANGE,
 *    TFL_ACTIVITY_MARK) when those kinds are enabled.
 *  - Threads. Every entry is thread-safe. activity_set_correlation and the
 *    range entries are on the host's per-operator path: no blocking, no
 *    allocation in the common case. */

/* What a record describes (TFL_ActivityRecord.kind). */
typedef enum TFL_ActivityKind {
  TFL_ACTIVITY_API = 1,    /* a native runtime call the plugin made (host clock) */
  TFL_ACTIVITY_KERNEL = 2, /* a kernel's execution on the device */
  TFL_ACTIVITY_COPY = 3,   /* a copy's execution on the device */
  TFL_ACTIVITY_MEMSET = 4, /* a fill's execution on the device */
  TFL_ACTIVITY_SYNC = 5,   /* a wait: the host blocked on the device */
  TFL_ACTIVITY_BUILD = 6,  /* a program or kernel build (host clock) */
  TFL_ACTIVITY_RANGE = 7,  /* a user range, push to pop (host clock) */
  TFL_ACTIVITY_MARK = 8    /* a user mark, start == end (host clock) */
} TFL_ActivityKind;

/* Every kind's bit, for activity_enable. */
#define TFL_ACTIVITY_ALL_KINDS 0x1FEu

/* TFL_ActivityRecord.flags: start_ns and end_ns are on the host's
 * CLOCK_MONOTONIC, not the device clock. */
#define TFL_ACTIVITY_HOST_CLOCK (1u << 0)

#define TFL_ACTIVITY_NAME_BYTES 64
#define TFL_ACTIVITY_DETAIL_BYTES 128

/* One record, written by the plugin into the host's array (see "Buffers"). */
typedef struct TFL_ActivityRecord {
  size_t struct_size; /* bytes the plugin wrote */
  /* --- 1.8 --- */
  uint32_t kind;           /* TFL_ActivityKind */
  uint32_t flags;          /* TFL_ACTIVITY_HOST_CLOCK */
  int32_t device;          /* the device, -1 for none */
  uint32_t reserved;       /* 0 */
  TFL_Stream* stream;      /* the stream the work ran on; NULL: none */
  uint64_t correlation_id; /* the host's id (see "Correlation"), 0: none */
  uint64_t start_ns;
  uint64_t end_ns; /* >= start_ns */
  /* The native call, kernel or range: "clEnqueueNDRangeKernel", "add_f32". */
  char name[TFL_ACTIVITY_NAME_BYTES];
  /* Details, possibly empty: "global=[1024] local=[64]", "4096 bytes". */
  char detail[TFL_ACTIVITY_DETAIL_BYTES];
} TFL_ActivityRecord;

/* The activity table, filled by TFL_PluginApi.get_activity into a struct
 * the host allocates (its struct_size set by the host). The four activity
 * entries are REQUIRED (non-NULL) when get_activity succeeds; the three
 * range entries are present together or all NULL. */
typedef struct TFL_Activity {
  size_t struct_size;
  /* --- 1.8 --- */
  /* Records the kinds in the mask from now on; 0 stops. A bit of a kind the
   * plugin does not produce is accepted and ignored; a bit outside
   * TFL_ACTIVITY_ALL_KINDS is INVALID_ARGUMENT. */
  TFL_Error* (*activity_enable)(uint32_t kinds);
  /* The calling thread's correlation id for what it does next (0: none).
   * Never fails. */
  void (*activity_set_correlation)(uint64_t id);
  /* Moves up to `capacity` complete records into `records` (see "Buffers");
   * *out_written gets how many, *out_dropped how many were lost to the
   * plugin's bound since the previous drain. `record_size` below the 1.8
   * size of TFL_ActivityRecord is INVALID_ARGUMENT. */
  TFL_Error* (*activity_drain)(TFL_ActivityRecord* records, size_t record_size,
                               size_t capacity, size_t* out_written,
                               uint64_t* out_dropped);
  /* One device time of `device` and the host's CLOCK_MONOTONIC time at the
   * same moment (see "Clocks"). */
  TFL_Error* (*activity_clock)(int32_t device, uint64_t* out_device_ns,
                               uint64_t* out_host_ns);
  /* Opens a range named `name` on the calling thread. */
  void (*range_push)(const char* name);
  /* Closes the calling thread's innermost range; none open: no-op. */
  void (*range_pop)(void);
  /* An instant named `name`. */
  void (*range_mark)(const char* name);
} TFL_Activity;

/* ------------------------------------------------------------------------ */
/* The plugin's function table                                              */
/* ------------------------------------------------------------------------ */

/* Entries marked REQUIRED are non-NULL in every plugin; the host checks all
 * of them once, at load, and refuses a plugin with a NULL one. OPTIONAL
 * entries may be NULL: the host then reports "unimplemented" for what needs
 * them, and never crashes.
 *
 * The table is owned by the plugin and must stay valid and unchanged for
 * the life of the process (the host never unloads a plugin). */
typedef struct TFL_PluginApi {
  size_t struct_size;
  uint32_t abi_major; /* plugin's TFL_ABI_VERSION_MAJOR; offset fixed forever */
  uint32_t abi_minor; /* plugin's TFL_ABI_VERSION_MINOR; offset fixed forever */

  /* --- 1.0: errors (REQUIRED) --- */
  /* Thread-safe on distinct errors. `error` is not NULL. */
  /* A TFL_ErrorCode value. */
  int32_t (*error_code)(const TFL_Error* error);
  /* The message stays valid until error_destroy. */
  const char* (*error_message)(const TFL_Error* error);
  /* Releases an error received from any entry or kernel. NULL is a no-op. */
  void (*error_destroy)(TFL_Error* error);

  /* --- 1.0: identity and lifecycle (REQUIRED) --- */
  /* Callable before initialize. Never NULL. */
  const TFL_PluginInfo* (*get_info)(void);
  /* Called once by the host before any other entry except error_*,
   * get_info and get_op_table. A second call returns FAILED_PRECONDITION.
   * `args` is borrowed. */
  TFL_Error* (*initialize)(const TFL_InitArgs* args);
  /* Callable before initialize. `out->struct_size` is set by the host. */
  TFL_Error* (*get_op_table)(TFL_OpTable* out);

  /* --- 1.0: devices (REQUIRED) --- */
  /* 0 to TFL_MAX_DEVICES. 0 (no device present) is valid: the host
   * registers the device type, which then reports no devices. */
  TFL_Error* (*device_count)(int32_t* out_count);
  TFL_Error* (*device_properties)(int32_t device, TFL_DeviceProperties* out);
  /* Waits for all work submitted to every stream of the device. Reports the
   * first asynchronous failure since the last synchronization, if any. */
  TFL_Error* (*device_synchronize)(int32_t device);

  /* --- 1.0: memory (REQUIRED) --- */
  /* Allocates nbytes (0 allowed: returns a unique non-NULL pointer) aligned
   * to at least 64 bytes. Reports lack of memory as OUT_OF_MEMORY, never by
   * returning NULL. The memory is owned by the caller until `deallocate`.
   * The host does arithmetic on the pointer: every device pointer it later
   * passes (tensors, copies, set_memory, collectives) is this pointer plus
   * an offset inside the allocation, and it never dereferences one unless
   * TFL_CAP_HOST_ADDRESSABLE_MEMORY is set. A runtime whose buffers are
   * handles (OpenCL's cl_mem) returns an address it maps to the handle
   * (docs/plugin-abi.md, "Handle-based memory"). */
  TFL_Error* (*allocate)(int32_t device, size_t nbytes, void** out_ptr);
  /* Releases memory from allocate on the same device. Stream-ordered: the
   * plugin reuses it only after all work submitted before this call, on any
   * stream of the device, has completed, so the host may free a buffer that
   * queued work still reads. NULL ptr is a no-op. */
  TFL_Error* (*deallocate)(int32_t device, void* ptr);
  TFL_Error* (*copy)(const TFL_CopyArgs* args);
  /* Sets nbytes at ptr to `value`. NULL stream: synchronous. */
  TFL_Error* (*set_memory)(int32_t device, void* ptr, uint8_t value,
                           size_t nbytes, TFL_Stream* stream);

  /* --- 1.0: streams (REQUIRED) --- */
  /* The device's default stream: owned by the plugin, never destroyed, never
   * NULL (the host asks for it on every device at load and refuses NULL). */
  TFL_Error* (*default_stream)(int32_t device, TFL_Stream** out);
  /* priority: 0 normal, negative higher; a plugin may ignore it. */
  TFL_Error* (*stream_create)(int32_t device, int32_t priority,
                              TFL_Stream** out);
  /* Work already queued still runs. Destroying a default stream is
   * INVALID_ARGUMENT. */
  TFL_Error* (*stream_destroy)(TFL_Stream* stream);
  TFL_Error* (*stream_synchronize)(TFL_Stream* stream);
  /* *out_complete = 1 when all submitted work has run, else 0. */
  TFL_Error* (*stream_query)(TFL_Stream* stream, uint8_t* out_complete);
  /* Work submitted to `stream` after this call waits until `event` (as last
   * recorded) has completed. Returns without blocking the host. */
  TFL_Error* (*stream_wait_event)(TFL_Stream* stream, TFL_Event* event);

  /* --- 1.0: events (REQUIRED) --- */
  TFL_Error* (*event_create)(int32_t device, uint32_t flags, TFL_Event** out);
  TFL_Error* (*event_destroy)(TFL_Event* event);
  /* Captures the work submitted to `stream` so far; re-recording replaces
   * the previous capture. */
  TFL_Error* (*event_record)(TFL_Event* event, TFL_Stream* stream);
  /* *out_complete = 1 when the recorded work has run (or the event was
   * never recorded), else 0. */
  TFL_Error* (*event_query)(TFL_Event* event, uint8_t* out_complete);
  TFL_Error* (*event_synchronize)(TFL_Event* event);

  /* --- 1.0: OPTIONAL entries (may be NULL) --- */
  /* Milliseconds between two completed events created with
   * TFL_EVENT_TIMING. Absent: the host reports elapsed time as
   * unimplemented. */
  TFL_Error* (*event_elapsed_time)(TFL_Event* start, TFL_Event* end,
                                   float* out_ms);
  /* Absent: the host reports zeros, and allocation counts it tracks
   * itself. */
  TFL_Error* (*memory_stats)(int32_t device, TFL_MemoryStats* out);
  TFL_Error* (*reset_peak_memory_stats)(int32_t device);
  /* Returns cached, unused device memory to the system. Absent: no-op. */
  TFL_Error* (*empty_cache)(int32_t device);

  /* --- 1.3: OPTIONAL --- */
  /* Fills the collectives table (see TFL_Collectives); `out->struct_size`
   * is set by the host, and the plugin fills the entries it covers. Called
   * once, after initialize. An error (UNIMPLEMENTED, say, when the vendor's
   * communication library is not installed) or a NULL entry means "no
   * collectives". Thread-safe. */
  TFL_Error* (*get_collectives)(TFL_Collectives* out);

  /* --- 1.4: OPTIONAL, page-locked host memory --- */
  /* Allocates nbytes of page-locked ("pinned") host memory that the device
   * can DMA from and to, like cudaHostAlloc. The block is ordinary host
   * memory for host code, aligned to at least 64 bytes, and owned by the
   * caller until host_deallocate. 0 bytes returns a unique non-NULL pointer.
   * Lack of memory is OUT_OF_MEMORY, never a NULL pointer. Thread-safe;
   * callable after initialize. The plugin may copy faster from and to such
   * memory, and may run such copies asynchronously.
   * Absent (NULL, or a plugin older than 1.4): the host backs its pinned
   * memory pool (Tensor.pin_memory(), pin_memory=True) with ordinary host
   * memory. */
  TFL_Error* (*host_allocate)(size_t nbytes, void** out_ptr);
  /* Releases a block from host_allocate; NULL is a no-op. NOT stream-ordered,
   * unlike deallocate (cudaFreeHost is not either): the block is gone when
   * the call returns, so the host frees only after every copy that uses the
   * block has completed (it tracks them with events). Thread-safe. Required
   * when host_allocate is present. */
  TFL_Error* (*host_deallocate)(void* ptr);

  /* --- 1.6: OPTIONAL, device discovery without initialization --- */
  /* Sets *out_count to the number of devices initialize(options) would
   * find, WITHOUT initializing: no contexts, queues, memory or kernel builds,
   * only the vendor runtime's cheapest enumeration (cuDeviceGetCount;
   * clGetPlatformIDs and clGetDeviceIDs). `options` is what initialize would
   * get (TFL_InitArgs.options; NULL for none). Zero devices is a success
   * with *out_count = 0. A missing driver or runtime is an error (typically
   * FAILED_PRECONDITION) whose message says what is missing and what to
   * install. Callable any number of times, before or after initialize and
   * from any thread; it changes no plugin state. The host calls it to choose
   * among several installed plugins by the hardware present (autoload) and
   * to say why one was passed over.
   * Absent (NULL, or a plugin older than 1.6): the host cannot tell without
   * initializing, and assumes the plugin's devices are present. */
  TFL_Error* (*probe_devices)(const char* options, int32_t* out_count);

  /* --- 1.7: OPTIONAL, device graphs --- */
  /* Fills the graphs table (see TFL_Graphs); `out->struct_size` is set by
   * the host. Called once, after initialize. An error, or a NULL entry,
   * means "no native graphs": the host then replays its own recording of
   * the launches. Thread-safe. */
  TFL_Error* (*get_graphs)(TFL_Graphs* out);

  /* --- 1.8: OPTIONAL, activity records and ranges --- */
  /* Fills the activity table (see TFL_Activity); `out->struct_size` is set
   * by the host. Called once, after initialize. An error, or a NULL entry,
   * means "no records": the host then times calls with events. Thread-safe. */
  TFL_Error* (*get_activity)(TFL_Activity* out);
} TFL_PluginApi;

/* The bootstrap function, exported as TFL_BOOTSTRAP_SYMBOL. It must be a
 * function: the host refuses a symbol of that name in non-executable memory
 * (a variable) instead of calling it.
 *
 * `host` is owned by the host and valid for the life of the process. The
 * function returns the plugin's table (never NULL for a well-formed plugin),
 * does no other work, has no side effects beyond remembering `host`, and is
 * safe to call more than once and from any thread. A plugin that supports
 * several majors may pick the table matching host->abi_major; otherwise it
 * returns its own, and the host refuses a major it does not speak. */
typedef const TFL_PluginApi* (*TFL_GetPluginApiFn)(const TFL_HostApi* host);

/* Marks the bootstrap function and kernel symbols for export.
 *
 * On ELF platforms it uses "protected" visibility: the symbol is exported,
 * but references from inside the plugin (its op table) bind to the plugin's
 * own definition. With plain default visibility, a second plugin exporting
 * the same kernel names and loaded with RTLD_GLOBAL would interpose its
 * kernels into this plugin's op table; the host detects that and refuses
 * the plugin. Plugins that export symbols another way should link with
 * -Wl,-Bsymbolic-functions for the same effect. */
#if defined(TFL_EXPORT)
/* Defined by the build. */
#elif defined(_WIN32)
#define TFL_EXPORT __declspec(dllexport)
#elif defined(__ELF__)
#define TFL_EXPORT __attribute__((visibility("protected")))
#else
#define TFL_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------ */
/* Layout locks for ABI 1.0 to 1.8 (LP64 and LLP64 targets).                 */
/* ------------------------------------------------------------------------ */

#if defined(__cplusplus)
#define TFL_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define TFL_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#else
/* C99: a negative array size fails the build. */
#define TFL_STATIC_ASSERT_CAT2(a, b) a##b
#define TFL_STATIC_ASSERT_CAT(a, b) TFL_STATIC_ASSERT_CAT2(a, b)
#define TFL_STATIC_ASSERT(cond, msg) \
  typedef char TFL_STATIC_ASSERT_CAT(tfl_static_assert_, __LINE__)[(cond) ? 1 : -1]
#endif

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
TFL_STATIC_ASSERT(offsetof(TFL_PluginApi, abi_major) == 8, "abi_major moved");
TFL_STATIC_ASSERT(offsetof(TFL_PluginApi, abi_minor) == 12, "abi_minor moved");
TFL_STATIC_ASSERT(offsetof(TFL_HostApi, abi_major) == 8, "abi_major moved");
TFL_STATIC_ASSERT(offsetof(TFL_HostApi, abi_minor) == 12, "abi_minor moved");
TFL_STATIC_ASSERT(sizeof(TFL_DType) == 4, "TFL_DType is frozen");
TFL_STATIC_ASSERT(sizeof(TFL_Scalar) == 24, "TFL_Scalar is frozen");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_HostApi, log) == 32, "TFL_HostApi 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_PluginInfo, capabilities) == 56,
                  "TFL_PluginInfo 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_DeviceProperties, memory_alignment) == 32,
                  "TFL_DeviceProperties 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_DeviceProperties, capability_minor) == 40,
                  "TFL_DeviceProperties 1.2");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_MemoryStats, num_ooms) == 64,
                  "TFL_MemoryStats 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_CopyArgs, stream) == 56,
                  "TFL_CopyArgs 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_Tensor, flags) == 64, "TFL_Tensor 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_Value, u) == 40, "TFL_Value 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_CallFrame, rng_offset) == 96,
                  "TFL_CallFrame 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_OpEntry, schema) == 48, "TFL_OpEntry 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_OpEntry, infer_outputs) == 56,
                  "TFL_OpEntry 1.1");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_OutputMeta, shape) == 144,
                  "TFL_OutputMeta 1.1");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_OpTable, entry_size) == 32,
                  "TFL_OpTable 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_InitArgs, options) == 16,
                  "TFL_InitArgs 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_PluginApi, empty_cache) == 240,
                  "TFL_PluginApi 1.0");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_PluginApi, get_collectives) == 248,
                  "TFL_PluginApi 1.3");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_PluginApi, host_deallocate) == 264,
                  "TFL_PluginApi 1.4");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_PluginApi, probe_devices) == 272,
                  "TFL_PluginApi 1.6");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_PluginApi, get_graphs) == 280,
                  "TFL_PluginApi 1.7");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_Graphs, graph_destroy) == 56,
                  "TFL_Graphs 1.7");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_GraphLaunchArgs, rng_offset_base) == 24,
                  "TFL_GraphLaunchArgs 1.7");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_PluginApi, get_activity) == 288,
                  "TFL_PluginApi 1.8");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_Activity, range_mark) == 64,
                  "TFL_Activity 1.8");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_ActivityRecord, detail) == 248,
                  "TFL_ActivityRecord 1.8");
TFL_STATIC_ASSERT(sizeof(TFL_UniqueId) == 128, "TFL_UniqueId is frozen");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_Collectives, group_end) == 128,
                  "TFL_Collectives 1.3");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_Collectives, comm_init_rank_config) == 136,
                  "TFL_Collectives 1.5");
TFL_STATIC_ASSERT(TFL_STRUCT_SIZE(TFL_CommConfig, blocking) == 20,
                  "TFL_CommConfig 1.5");
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TORCH_FL_PLUGIN_H_ */

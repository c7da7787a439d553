// What every kernel source starts with (kernels/mod.rs prepends it).
#ifdef USE_HALF
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif

#define MAX_DIMS 8

// Sizes and per-operand strides in elements, padded to MAX_DIMS; passed by
// value, and the host's struct has the same layout (8-byte fields).
typedef struct {
    long size[MAX_DIMS];
    long a[MAX_DIMS];
    long b[MAX_DIMS];
    long o[MAX_DIMS];
} Geometry;


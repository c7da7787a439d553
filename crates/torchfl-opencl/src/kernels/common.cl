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

// One tensor's sizes and strides in elements (kernels/mod.rs `Layout`,
// same layout: 8-byte fields), passed by value after its buffer and
// element offset. Dimensions past ndim are size 1, stride 0.
typedef struct {
    long size[MAX_DIMS];
    long stride[MAX_DIMS];
    long ndim;
    long numel;
} Layout;

// The element offset (from the tensor's first element) of element i in
// row-major order of l's sizes.
inline long layout_offset(const Layout* l, long i) {
    long off = 0;
    for (int d = (int)l->ndim - 1; d >= 0; --d) {
        long k = i % l->size[d];
        i /= l->size[d];
        off += k * l->stride[d];
    }
    return off;
}

// Stores a computed value in the output type TO; a bool output (TO_BOOL,
// set with TO=uchar) stores 1 for any nonzero value, as PyTorch converts.
#ifdef TO_BOOL
#define TO_OUT(x) ((uchar)((x) != 0))
#else
#define TO_OUT(x) ((TO)(x))
#endif

// Elementwise unary operators (and copy_, fill_) over a strided,
// broadcast operand.
//
// Built per (operator, dtypes) with -D options (kernels/mod.rs):
//   TA, TO       the element types of a and the output
//   TC           the type the operator computes in (float for half, as
//                PyTorch's opmath does; else the output's)
//   OP(x, v)     the result for input x; v is the by-value argument (fill_'s
//                value, or unused)
//   USE_HALF     some type is half: needs cl_khr_fp16
//
// Geometry and the half pragma come from common.cl.
//
// Work item i computes output element i in row-major order of the output's
// shape; the operand is found through its own strides (0 along broadcast
// dimensions); Geometry's `b` is unused.
__kernel void unary(__global const TA* a, ulong a_off, __global TO* o, ulong o_off, Geometry g, int ndim,
                    ulong n, TC v) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    long rem = (long)i;
    long ia = (long)a_off, io = (long)o_off;
    for (int d = ndim - 1; d >= 0; --d) {
        long k = rem % g.size[d];
        rem /= g.size[d];
        ia += k * g.a[d];
        io += k * g.o[d];
    }
    TC x = (TC)a[ia];
    o[io] = TO_OUT(OP(x, v));
}

// Elementwise binary operators over strided, broadcast operands.
//
// Built per (operator, dtypes) with -D options (kernels/mod.rs):
//   TA, TB, TO   the element types of a, b and the output
//   TC           the type the operator computes in (float for half, as
//                PyTorch's opmath does; else the output's)
//   OP(x, y, alpha)
//   A_SCALAR     a is a host number passed by value (a_value), not a buffer
//   B_SCALAR     b is a host number passed by value (b_value), not a buffer
//   USE_HALF     some type is half: needs cl_khr_fp16
//
// Geometry and the half pragma come from common.cl.
//
// Work item i computes output element i in row-major order of the output's
// shape; each operand's element is found through its own strides (0 along
// broadcast dimensions), so no operand needs to be contiguous.
__kernel void binary(__global const TA* a, ulong a_off, TC a_value, __global const TB* b, ulong b_off,
                     TC b_value, __global TO* o, ulong o_off, Geometry g, int ndim, ulong n, TC alpha) {
    ulong i = get_global_id(0);
    if (i >= n) return;
    long rem = (long)i;
    long ia = (long)a_off, ib = (long)b_off, io = (long)o_off;
    for (int d = ndim - 1; d >= 0; --d) {
        long k = rem % g.size[d];
        rem /= g.size[d];
        ia += k * g.a[d];
        ib += k * g.b[d];
        io += k * g.o[d];
    }
#ifdef A_SCALAR
    TC x = a_value;
#else
    TC x = (TC)a[ia];
#endif
#ifdef B_SCALAR
    TC y = b_value;
#else
    TC y = (TC)b[ib];
#endif
    o[io] = TO_OUT(OP(x, y, alpha));
}

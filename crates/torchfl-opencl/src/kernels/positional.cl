// Operators whose result depends on the element's position: tril/triu and
// arange.
//
// Built per dtype with -D T=... (kernels/positional.rs).

// out = self where (col - row <= diagonal) for tril (upper = 0), where
// (col - row >= diagonal) for triu (upper = 1), else 0; over the last two
// dimensions, batched over the others. Work item i computes element i in
// row-major order of the shape; both tensors are indexed through their
// strides, so the call may be in place.
__kernel void triangle(__global const T* x, ulong x_off, Layout x_l, __global T* o, ulong o_off, Layout o_l,
                       long diagonal, int upper) {
    const long i = get_global_id(0);
    if (i >= o_l.numel) return;
    const int nd = (int)o_l.ndim;
    const long cols = o_l.size[nd - 1], rows = o_l.size[nd - 2];
    const long col = i % cols, row = (i / cols) % rows;
    const long k = col - row;
    const bool keep = upper ? k >= diagonal : k <= diagonal;
    o[o_off + layout_offset(&o_l, i)] = keep ? x[x_off + layout_offset(&x_l, i)] : (T)0;
}

// out[i] = start + step * i, computed in TC (double is not required of a
// device, so float for floating outputs, long for integer ones).
__kernel void arange(__global T* o, ulong o_off, Layout o_l, TC start, TC step) {
    const long i = get_global_id(0);
    if (i >= o_l.numel) return;
    o[o_off + i * o_l.stride[0]] = (T)(start + step * (TC)i);
}

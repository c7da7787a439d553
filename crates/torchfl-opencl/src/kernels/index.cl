// Indexing: index_select (which also serves embedding's forward) and
// embedding_dense_backward. cat is copy_'s kernel (unary.cl), once per input.
//
// Built with -D options (kernels/index.rs):
//   T    index_select: an unsigned type of the element's size (the values
//        move as bits); embedding_dense_backward: the gradient's type
//   TC   embedding_dense_backward's compute type (float for half); the
//        kernel exists only when it is defined
//
// Indices are data the host cannot read before the kernel runs, so one
// out of range is not reported: index_select writes 0 for it and
// embedding_dense_backward leaves it out; nothing is read out of bounds.

// index_select: output element i (row-major in the output's shape) is
// self's element with the same coordinates, except index[k] along dim
// where the output's coordinate is k. index is 1-D.
__kernel void index_select(__global const T* x, ulong x_off, Layout x_l,
                           __global const long* idx, ulong idx_off, Layout idx_l,
                           __global T* o, ulong o_off, Layout o_l, int dim) {
    const long i = get_global_id(0);
    if (i >= o_l.numel) return;
    long rem = i, ix = (long)x_off, io = (long)o_off;
    int ok = 1;
    for (int d = (int)o_l.ndim - 1; d >= 0; --d) {
        const long k = rem % o_l.size[d];
        rem /= o_l.size[d];
        io += k * o_l.stride[d];
        if (d == dim) {
            const long j = idx[idx_off + k * idx_l.stride[0]];
            if (j < 0 || j >= x_l.size[d]) ok = 0;
            else ix += j * x_l.stride[d];
        } else {
            ix += k * x_l.stride[d];
        }
    }
    o[io] = ok ? x[ix] : (T)0;
}

#ifdef TC
// Position k of the indices (row-major), from a 1-D layout directly.
inline long index_at(__global const long* idx, ulong idx_off, const Layout* l, long k) {
    return idx[idx_off + (l->ndim == 1 ? k * l->stride[0] : layout_offset(l, k))];
}

// The columns one embedding_dense_backward work item owns (kernels/index.rs
// EMBEDDING_COLUMNS): each scan of the indices serves that many columns.
#define COLUMNS 16

// embedding_dense_backward: work item (chunk, row) owns columns [chunk *
// COLUMNS, +COLUMNS) of row `row` of the [num_weights, D] result: it sums
// grad_output's rows of the positions whose index is `row`, in position
// order as the CPU kernel adds them (each scaled by 1 / count with
// scale_by_freq); the padding_idx row stays 0. grad_output is [K, D] (or
// its full shape when its leading dimensions do not merge), element
// (k, col) at row-major index k * D + col.
__kernel void embedding_dense_backward(__global const T* g, ulong g_off, Layout g_l,
                                       __global const long* idx, ulong idx_off, Layout idx_l,
                                       __global T* o, ulong o_off, Layout o_l,
                                       long padding_idx, int scale_by_freq) {
    const long col0 = get_global_id(0) * COLUMNS, row = get_global_id(1);
    const long D = o_l.size[1];
    if (col0 >= D || row >= o_l.size[0]) return;
    const int n = (int)min((long)COLUMNS, D - col0);
    const long K = idx_l.numel;
    TC sum[COLUMNS];
    for (int j = 0; j < COLUMNS; ++j) sum[j] = (TC)0;
    if (row != padding_idx) {
        TC scale = (TC)1;
        if (scale_by_freq) {
            long count = 0;
            for (long k = 0; k < K; ++k) count += index_at(idx, idx_off, &idx_l, k) == row;
            if (count > 0) scale = (TC)(1.0f / (float)count);
        }
        for (long k = 0; k < K; ++k) {
            if (index_at(idx, idx_off, &idx_l, k) != row) continue;
            for (int j = 0; j < n; ++j) {
                const long col = col0 + j;
                const long at = g_l.ndim == 2 ? k * g_l.stride[0] + col * g_l.stride[1]
                                              : layout_offset(&g_l, k * D + col);
                const TC v = (TC)g[g_off + at];
                sum[j] += scale_by_freq ? v * scale : v;
            }
        }
    }
    for (int j = 0; j < n; ++j) {
        o[o_off + row * o_l.stride[0] + (col0 + j) * o_l.stride[1]] = (T)sum[j];
    }
}
#endif

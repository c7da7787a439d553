// Softmax and log-softmax along one dimension, forward and backward
// (kernels/softmax.rs), computed in float (TC).
//
// Built per dtypes with -D options: TX the inputs' element type, TO the
// output's (float for half_to_float), TC = float.
//
// The host moves the softmax dimension last in every operand's Layout, so
// a row is the last dimension (n elements at stride l.stride[ndim - 1])
// and rows are numbered row-major over the others. Local row
// get_local_id(1) owns row get_global_id(1); its lanes take the row's
// elements j = lane, lane + lanes, ... (group.cl).

// The offset of row r's first element.
inline long row_offset(const Layout* l, long r) {
    long off = 0;
    for (int d = (int)l->ndim - 2; d >= 0; --d) {
        const long k = r % l->size[d];
        r /= l->size[d];
        off += k * l->stride[d];
    }
    return off;
}

// o = softmax(x) or log_softmax(x) (is_log) along each row, the row's
// maximum subtracted first so that large inputs do not overflow.
__kernel void softmax_forward(__global const TX* x, ulong x_off, Layout x_l,
                              __global TO* o, ulong o_off, Layout o_l,
                              long rows, long n, int is_log) {
    __local TC part[GROUP];
    const long row = get_global_id(1);
    const long lane = get_local_id(0), lanes = get_local_size(0);
    const int live = row < rows;
    const int last = (int)x_l.ndim - 1;
    const long xb = (long)x_off + (live ? row_offset(&x_l, row) : 0), sx = x_l.stride[last];
    const long ob = (long)o_off + (live ? row_offset(&o_l, row) : 0), so = o_l.stride[last];
    TC m = -INFINITY;
    if (live) {
        for (long j = lane; j < n; j += lanes) {
            const TC v = (TC)x[xb + j * sx];
            if (isnan(v) || v > m) m = v;
        }
    }
    m = group_max(part, m);
    // A row of -inf: exp gives 0 and the result NaN, as PyTorch's.
    if (m == -INFINITY) m = 0;
    Sum sum = sum_new();
    if (live) {
        for (long j = lane; j < n; j += lanes) sum_add(&sum, exp((TC)x[xb + j * sx] - m));
    }
    const TC s = group_sum(part, sum_value(&sum));
    if (!live) return;
    if (is_log) {
        const TC lse = log(s);
        for (long j = lane; j < n; j += lanes) o[ob + j * so] = TO_OUT(((TC)x[xb + j * sx] - m) - lse);
    } else {
        const TC r = 1 / s;
        for (long j = lane; j < n; j += lanes) o[ob + j * so] = TO_OUT(exp((TC)x[xb + j * sx] - m) * r);
    }
}

// The input gradient from the output y and its gradient g, along each row:
// softmax y * (g - sum(g * y)), log-softmax (is_log) g - exp(y) * sum(g).
__kernel void softmax_backward(__global const TX* g, ulong g_off, Layout g_l,
                               __global const TX* y, ulong y_off, Layout y_l,
                               __global TO* o, ulong o_off, Layout o_l,
                               long rows, long n, int is_log) {
    __local TC part[GROUP];
    const long row = get_global_id(1);
    const long lane = get_local_id(0), lanes = get_local_size(0);
    const int live = row < rows;
    const int last = (int)g_l.ndim - 1;
    const long gb = (long)g_off + (live ? row_offset(&g_l, row) : 0), sg = g_l.stride[last];
    const long yb = (long)y_off + (live ? row_offset(&y_l, row) : 0), sy = y_l.stride[last];
    const long ob = (long)o_off + (live ? row_offset(&o_l, row) : 0), so = o_l.stride[last];
    Sum sum = sum_new();
    if (live) {
        for (long j = lane; j < n; j += lanes) {
            const TC gv = (TC)g[gb + j * sg];
            sum_add(&sum, is_log ? gv : gv * (TC)y[yb + j * sy]);
        }
    }
    const TC s = group_sum(part, sum_value(&sum));
    if (!live) return;
    for (long j = lane; j < n; j += lanes) {
        const TC gv = (TC)g[gb + j * sg], yv = (TC)y[yb + j * sy];
        o[ob + j * so] = TO_OUT(is_log ? gv - exp(yv) * s : yv * (gv - s));
    }
}

// Reductions over any set of dimensions (kernels/reduce.rs): sums and
// means (reduce_sum), and the selections max/min with their indices
// (reduce_select: max, min, amax, amin, argmax, argmin, max.dim, min.dim).
//
// Built per dtypes with -D options:
//   TX        the input's element type
//   TO        the output's (the values' for a selection)
//   TC        what is accumulated or compared: float for floating types
//             (half included), long otherwise; TC_FLOAT when float
//
// The host permutes and merges the input's Layout: its first nk
// dimensions are the kept ones (the outputs' shape, merged where every
// operand allows), the rest the reduced ones in their original order, so
// the running position j of a reduced element (row-major over the
// reduced dimensions) is PyTorch's index. Local row get_local_id(1) owns
// output get_global_id(1); its lanes take j = lane, lane + lanes, ...

// The input offset of output o's first reduced element.
inline long kept_offset(const Layout* l, int nk, long o) {
    long off = 0;
    for (int d = nk - 1; d >= 0; --d) {
        const long k = o % l->size[d];
        o /= l->size[d];
        off += k * l->stride[d];
    }
    return off;
}

// The offset of reduced element j from the output's first one.
inline long reduced_offset(const Layout* l, int nk, long j) {
    long off = 0;
    for (int d = (int)l->ndim - 1; d >= nk; --d) {
        const long k = j % l->size[d];
        j /= l->size[d];
        off += k * l->stride[d];
    }
    return off;
}

// o = sum (divided by `divisor` for a floating output: 1 for sum, the
// number of reduced elements for mean).
__kernel void reduce_sum(__global const TX* x, ulong x_off, Layout x_l,
                         __global TO* o, ulong o_off, Layout o_l,
                         int nk, long nout, long nred, float divisor) {
    __local TC part[GROUP];
    const long out = get_global_id(1);
    const long lane = get_local_id(0), lanes = get_local_size(0);
    Sum sum = sum_new();
    if (out < nout) {
        const long base = (long)x_off + kept_offset(&x_l, nk, out);
        if (x_l.ndim - nk == 1) {
            const long s = x_l.stride[nk];
            for (long j = lane; j < nred; j += lanes) sum_add(&sum, (TC)x[base + j * s]);
        } else {
            for (long j = lane; j < nred; j += lanes) sum_add(&sum, (TC)x[base + reduced_offset(&x_l, nk, j)]);
        }
    }
    TC acc = group_sum(part, sum_value(&sum));
    if (lane == 0 && out < nout) {
#ifdef TC_FLOAT
        acc /= divisor;
#endif
        o[o_off + layout_offset(&o_l, out)] = TO_OUT(acc);
    }
}

// Whether (a at index ai) beats (b at index bi): NaN beats numbers (the
// first NaN wins), then the larger (is_max) or smaller value, then the
// smaller index, as PyTorch's max/min/argmax/argmin.
inline int beats(TC a, long ai, TC b, long bi, int is_max) {
#ifdef TC_FLOAT
    const int an = isnan(a), bn = isnan(b);
    if (an || bn) return an && (!bn || ai < bi);
#endif
    if (a == b) return ai < bi;
    return is_max ? a > b : a < b;
}

// Values (when has_v) and int64 indices (when has_i) of the maximum
// (is_max) or minimum of each output's reduced elements; nred >= 1.
__kernel void reduce_select(__global const TX* x, ulong x_off, Layout x_l,
                            __global TO* v, ulong v_off, Layout v_l, int has_v,
                            __global long* ix, ulong i_off, Layout i_l, int has_i,
                            int nk, long nout, long nred, int is_max) {
    __local TC best_v[GROUP];
    __local long best_i[GROUP];
    const long out = get_global_id(1);
    const int lane = (int)get_local_id(0), lanes = (int)get_local_size(0);
    const int first = (int)get_local_id(1) * lanes;
    TC bv = 0;
    long bi = -1; // none yet
    if (out < nout) {
        const long base = (long)x_off + kept_offset(&x_l, nk, out);
        for (long j = lane; j < nred; j += lanes) {
            const TC xv = (TC)x[base + reduced_offset(&x_l, nk, j)];
            if (bi < 0 || beats(xv, j, bv, bi, is_max)) {
                bv = xv;
                bi = j;
            }
        }
    }
    best_v[first + lane] = bv;
    best_i[first + lane] = bi;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = lanes >> 1; s > 0; s >>= 1) {
        if (lane < s) {
            const int a = first + lane, b = a + s;
            if (best_i[b] >= 0 && (best_i[a] < 0 || beats(best_v[b], best_i[b], best_v[a], best_i[a], is_max))) {
                best_v[a] = best_v[b];
                best_i[a] = best_i[b];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lane == 0 && out < nout) {
        if (has_v) v[v_off + layout_offset(&v_l, out)] = TO_OUT(best_v[first]);
        if (has_i) ix[i_off + layout_offset(&i_l, out)] = best_i[first];
    }
}

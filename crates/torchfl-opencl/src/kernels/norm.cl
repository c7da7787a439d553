// Normalization: batch norm (forward and backward, one work group per
// channel) and layer norm (forward and input gradient one work item per
// row; weight and bias gradients one work item per normalized element).
//
// Built per element type with -D options (kernels/norm.rs):
//   T    the element type of every tensor (float, or half)
//   TC   the compute type (float)
//
// Tensors are indexed through their own Layout, per-feature vectors through
// their stride (Args::vector); nothing is assumed contiguous.
// Statistics take two passes (mean, then centred squares); reductions are
// sequential per work item and, for batch norm, a fixed tree across the
// work group, so results do not depend on scheduling.

// Batch norm work-group size (norm.rs BN_GROUP).
#define BN_WG 64

// The single stride that walks dimensions [from, ndim) of l in row-major
// order, or -1 when they do not collapse into one (size-1 dimensions are
// skipped; all of size 1: 0).
inline long collapsed_stride(const Layout* l, int from) {
    long stride = 0, next = 0;
    int found = 0;
    for (int d = (int)l->ndim - 1; d >= from; --d) {
        if (l->size[d] == 1) continue;
        if (found && l->stride[d] != next) return -1;
        if (!found) stride = l->stride[d];
        found = 1;
        next = l->stride[d] * l->size[d];
    }
    return stride;
}

// The element offset of the i-th element (row-major) of dimensions
// [from, ndim) of l.
inline long tail_offset(const Layout* l, int from, long i) {
    long off = 0;
    for (int d = (int)l->ndim - 1; d >= from; --d) {
        const long k = i % l->size[d];
        i /= l->size[d];
        off += k * l->stride[d];
    }
    return off;
}

// Elements per sample and channel of an [N, C, *] tensor.
inline long bn_spatial(const Layout* l) {
    long S = 1;
    for (int d = 2; d < MAX_DIMS; ++d) S *= l->size[d];
    return S;
}

// Element j of channel c of an [N, C, *] tensor, j = n * S + s (s the
// spatial index, S elements per sample and channel); sp is
// collapsed_stride(l, 2).
inline long bn_offset(const Layout* l, long sp, long S, long c, long j) {
    const long n = j / S, s = j - n * S;
    const long base = n * l->stride[0] + c * l->stride[1];
    return base + (sp >= 0 ? s * sp : tail_offset(l, 2, s));
}

// The sum of every work item's v, identical in each work item. `red` is
// reused: the last barrier keeps a next call from overwriting it early.
inline TC bn_group_sum(__local TC* red, TC v) {
    const int lid = get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = BN_WG / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const TC r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// Element c of a vector (norm.rs passes buffer, offset and stride).
#define VEC(t, c) t[t##_off + (c) * t##_st]

// Training, one work group per channel: batch statistics (written to
// save_mean / save_invstd when present, and folded into the running
// statistics, the variance unbiased), then
// out = x * (invstd * w) + (b - mean * invstd * w), as PyTorch computes it.
// Every work item reaches every barrier, none under a condition: PoCL
// (3.1) miscompiled barriers under even a uniform `if (training)`, running
// the loops after them out of bounds.
__kernel __attribute__((reqd_work_group_size(BN_WG, 1, 1)))
void batch_norm_train(__global const T* x, ulong x_off, Layout x_l,
                      __global T* o, ulong o_off, Layout o_l,
                      __global const T* w, ulong w_off, long w_st, int has_w,
                      __global const T* b, ulong b_off, long b_st, int has_b,
                      __global T* rm, ulong rm_off, long rm_st, int has_rm,
                      __global T* rv, ulong rv_off, long rv_st, int has_rv,
                      __global T* sm, ulong sm_off, long sm_st, int has_sm,
                      __global T* si, ulong si_off, long si_st, int has_si,
                      float momentum, float eps) {
    __local TC red[BN_WG];
    const long c = get_group_id(0);
    const int lid = get_local_id(0);
    const long S = bn_spatial(&x_l), m = x_l.size[0] * S;
    const long xs = collapsed_stride(&x_l, 2);
    const TC count = (TC)(m > 0 ? m : 1);
    TC acc = 0;
    for (long j = lid; j < m; j += BN_WG) acc += (TC)x[x_off + bn_offset(&x_l, xs, S, c, j)];
    const TC mean = bn_group_sum(red, acc) / count;
    acc = 0;
    for (long j = lid; j < m; j += BN_WG) {
        const TC d = (TC)x[x_off + bn_offset(&x_l, xs, S, c, j)] - mean;
        acc += d * d;
    }
    const TC var = bn_group_sum(red, acc) / count;
    const TC invstd = (TC)1 / sqrt(var + (TC)eps);
    if (lid == 0) {
        if (has_sm) VEC(sm, c) = (T)mean;
        if (has_si) VEC(si, c) = (T)invstd;
        const TC mom = (TC)momentum;
        if (has_rm) VEC(rm, c) = (T)(((TC)1 - mom) * (TC)VEC(rm, c) + mom * mean);
        if (has_rv) {
            const TC unbiased = var * (TC)m / (TC)(m - 1);
            VEC(rv, c) = (T)(((TC)1 - mom) * (TC)VEC(rv, c) + mom * unbiased);
        }
    }
    const TC scale = invstd * (has_w ? (TC)VEC(w, c) : (TC)1);
    const TC shift = (has_b ? (TC)VEC(b, c) : (TC)0) - mean * scale;
    const long os = collapsed_stride(&o_l, 2);
    for (long j = lid; j < m; j += BN_WG) {
        const TC v = (TC)x[x_off + bn_offset(&x_l, xs, S, c, j)];
        o[o_off + bn_offset(&o_l, os, S, c, j)] = (T)(v * scale + shift);
    }
}

// Evaluation, one work item per element (and at least one per channel):
// the running statistics. save_mean / save_invstd, when present, get the
// running mean and 1 / sqrt(running_var + eps), as PyTorch's decomposition
// returns on devices other than the CPU.
__kernel void batch_norm_eval(__global const T* x, ulong x_off, Layout x_l,
                              __global T* o, ulong o_off, Layout o_l,
                              __global const T* w, ulong w_off, long w_st, int has_w,
                              __global const T* b, ulong b_off, long b_st, int has_b,
                              __global const T* rm, ulong rm_off, long rm_st,
                              __global const T* rv, ulong rv_off, long rv_st,
                              __global T* sm, ulong sm_off, long sm_st, int has_sm,
                              __global T* si, ulong si_off, long si_st, int has_si,
                              float eps) {
    const long i = get_global_id(0);
    if (i < x_l.size[1]) {
        if (has_sm) VEC(sm, i) = VEC(rm, i);
        if (has_si) VEC(si, i) = (T)((TC)1 / sqrt((TC)VEC(rv, i) + (TC)eps));
    }
    if (i >= x_l.numel) return;
    long rem = i, ix = (long)x_off, io = (long)o_off, c = 0;
    for (int d = (int)x_l.ndim - 1; d >= 0; --d) {
        const long k = rem % x_l.size[d];
        rem /= x_l.size[d];
        ix += k * x_l.stride[d];
        io += k * o_l.stride[d];
        if (d == 1) c = k;
    }
    const TC scale = (TC)1 / sqrt((TC)VEC(rv, c) + (TC)eps) * (has_w ? (TC)VEC(w, c) : (TC)1);
    const TC shift = (has_b ? (TC)VEC(b, c) : (TC)0) - (TC)VEC(rm, c) * scale;
    o[io] = (T)((TC)x[ix] * scale + shift);
}

// One work group per channel: sum(gy) and sum(gy * (x - mean)) over the
// channel (always, even when only grad_input of evaluation mode is wanted:
// no barrier is under a condition), then grad_weight = the latter * invstd,
// grad_bias = the former, and grad_input (training: gy - mean(gy) - (x - mean) * proj, PyTorch's
// form; evaluation: gy), scaled by invstd * w. mean/st are the saved mean
// and inverse standard deviation (train) or the running mean and variance.
__kernel __attribute__((reqd_work_group_size(BN_WG, 1, 1)))
void batch_norm_backward(__global const T* g, ulong g_off, Layout g_l,
                         __global const T* x, ulong x_off, Layout x_l,
                         __global const T* w, ulong w_off, long w_st, int has_w,
                         __global const T* mu, ulong mu_off, long mu_st,
                         __global const T* st, ulong st_off, long st_st,
                         __global T* gx, ulong gx_off, Layout gx_l, int has_gx,
                         __global T* gw, ulong gw_off, long gw_st, int has_gw,
                         __global T* gb, ulong gb_off, long gb_st, int has_gb,
                         int train, float eps) {
    __local TC red[BN_WG];
    const long c = get_group_id(0);
    const int lid = get_local_id(0);
    const long S = bn_spatial(&x_l), m = x_l.size[0] * S;
    const long xs = collapsed_stride(&x_l, 2), gs = collapsed_stride(&g_l, 2);
    const TC mean = (TC)VEC(mu, c);
    const TC invstd = train ? (TC)VEC(st, c) : (TC)1 / sqrt((TC)VEC(st, c) + (TC)eps);
    TC sum_g = 0, dot = 0;
    for (long j = lid; j < m; j += BN_WG) {
        const TC gv = (TC)g[g_off + bn_offset(&g_l, gs, S, c, j)];
        sum_g += gv;
        dot += gv * ((TC)x[x_off + bn_offset(&x_l, xs, S, c, j)] - mean);
    }
    sum_g = bn_group_sum(red, sum_g);
    dot = bn_group_sum(red, dot);
    if (lid == 0) {
        if (has_gw) VEC(gw, c) = (T)(dot * invstd);
        if (has_gb) VEC(gb, c) = (T)sum_g;
    }
    if (!has_gx) return;
    const long os = collapsed_stride(&gx_l, 2);
    const TC k = invstd * (has_w ? (TC)VEC(w, c) : (TC)1);
    const TC count = (TC)(m > 0 ? m : 1);
    const TC proj = train ? dot * invstd * invstd / count : (TC)0;
    const TC gm = train ? sum_g / count : (TC)0;
    for (long j = lid; j < m; j += BN_WG) {
        const TC gv = (TC)g[g_off + bn_offset(&g_l, gs, S, c, j)];
        TC v;
        if (train) {
            const TC xv = (TC)x[x_off + bn_offset(&x_l, xs, S, c, j)];
            v = (gv - gm - (xv - mean) * proj) * k;
        } else {
            v = gv * k;
        }
        gx[gx_off + bn_offset(&gx_l, os, S, c, j)] = (T)v;
    }
}

// The element offset of row r of a tensor whose dimensions [from, ndim)
// are the rows: r's row-major index over dimensions [0, from).
inline long head_offset(const Layout* l, int from, long r) {
    long off = 0;
    for (int d = from - 1; d >= 0; --d) {
        const long k = r % l->size[d];
        r /= l->size[d];
        off += k * l->stride[d];
    }
    return off;
}

// The offset of element k within a row; inner is collapsed_stride(l, from).
inline long ln_offset(const Layout* l, int from, long inner, long k) {
    return inner >= 0 ? k * inner : tail_offset(l, from, k);
}

// One work item per row of `len` elements (the trailing dimensions from
// `from`): mean, rstd = 1 / sqrt(var + eps) (both written when present),
// out = (x - mean) * rstd * w + b.
__kernel void layer_norm_forward(__global const T* x, ulong x_off, Layout x_l,
                                 __global T* o, ulong o_off, Layout o_l,
                                 __global const T* w, ulong w_off, Layout w_l, int has_w,
                                 __global const T* b, ulong b_off, Layout b_l, int has_b,
                                 __global T* mo, ulong mo_off, long mo_st, int has_mo,
                                 __global T* ro, ulong ro_off, long ro_st, int has_ro,
                                 long rows, long len, int from, float eps) {
    const long r = get_global_id(0);
    if (r >= rows) return;
    const long xi = collapsed_stride(&x_l, from), oi = collapsed_stride(&o_l, from);
    const long wi = collapsed_stride(&w_l, 0), bi = collapsed_stride(&b_l, 0);
    const long xb = x_off + head_offset(&x_l, from, r), ob = o_off + head_offset(&o_l, from, r);
    TC acc = 0;
    for (long k = 0; k < len; ++k) acc += (TC)x[xb + ln_offset(&x_l, from, xi, k)];
    const TC mean = acc / (TC)len;
    acc = 0;
    for (long k = 0; k < len; ++k) {
        const TC d = (TC)x[xb + ln_offset(&x_l, from, xi, k)] - mean;
        acc += d * d;
    }
    const TC rstd = (TC)1 / sqrt(acc / (TC)len + (TC)eps);
    if (has_mo) VEC(mo, r) = (T)mean;
    if (has_ro) VEC(ro, r) = (T)rstd;
    for (long k = 0; k < len; ++k) {
        TC v = ((TC)x[xb + ln_offset(&x_l, from, xi, k)] - mean) * rstd;
        if (has_w) v *= (TC)w[w_off + ln_offset(&w_l, 0, wi, k)];
        if (has_b) v += (TC)b[b_off + ln_offset(&b_l, 0, bi, k)];
        o[ob + ln_offset(&o_l, from, oi, k)] = (T)v;
    }
}

// Weight element k of layer_norm_backward_input, 1 without a weight.
#define LN_W(k) (has_w ? (TC)w[w_off + ln_offset(&w_l, 0, wi, (k))] : (TC)1)

// One work item per row: with a = gy * w and xh = (x - mean) * rstd,
// gx = rstd * (a - mean(a) - xh * mean(a * xh)).
__kernel void layer_norm_backward_input(__global const T* g, ulong g_off, Layout g_l,
                                        __global const T* x, ulong x_off, Layout x_l,
                                        __global const T* mu, ulong mu_off, long mu_st,
                                        __global const T* rs, ulong rs_off, long rs_st,
                                        __global const T* w, ulong w_off, Layout w_l, int has_w,
                                        __global T* gx, ulong gx_off, Layout gx_l,
                                        long rows, long len, int from) {
    const long r = get_global_id(0);
    if (r >= rows) return;
    const long gi = collapsed_stride(&g_l, from), xi = collapsed_stride(&x_l, from);
    const long oi = collapsed_stride(&gx_l, from), wi = collapsed_stride(&w_l, 0);
    const long gb = g_off + head_offset(&g_l, from, r), xb = x_off + head_offset(&x_l, from, r);
    const long ob = gx_off + head_offset(&gx_l, from, r);
    const TC mean = (TC)VEC(mu, r), rstd = (TC)VEC(rs, r);
    TC sa = 0, sax = 0;
    for (long k = 0; k < len; ++k) {
        const TC a = (TC)g[gb + ln_offset(&g_l, from, gi, k)] * LN_W(k);
        sa += a;
        sax += a * ((TC)x[xb + ln_offset(&x_l, from, xi, k)] - mean) * rstd;
    }
    sa /= (TC)len;
    sax /= (TC)len;
    for (long k = 0; k < len; ++k) {
        const TC a = (TC)g[gb + ln_offset(&g_l, from, gi, k)] * LN_W(k);
        const TC xh = ((TC)x[xb + ln_offset(&x_l, from, xi, k)] - mean) * rstd;
        gx[ob + ln_offset(&gx_l, from, oi, k)] = (T)(rstd * (a - sa - xh * sax));
    }
}

// One work item per normalized element k: grad_weight = sum over rows of
// gy * (x - mean) * rstd, grad_bias = sum over rows of gy.
__kernel void layer_norm_backward_params(__global const T* g, ulong g_off, Layout g_l,
                                         __global const T* x, ulong x_off, Layout x_l,
                                         __global const T* mu, ulong mu_off, long mu_st,
                                         __global const T* rs, ulong rs_off, long rs_st,
                                         __global T* gw, ulong gw_off, long gw_st, int has_gw,
                                         __global T* gb, ulong gb_off, long gb_st, int has_gb,
                                         long rows, long len, int from) {
    const long k = get_global_id(0);
    if (k >= len) return;
    const long gk = g_off + tail_offset(&g_l, from, k), xk = x_off + tail_offset(&x_l, from, k);
    TC sw = 0, sb = 0;
    for (long r = 0; r < rows; ++r) {
        const TC gv = (TC)g[gk + head_offset(&g_l, from, r)];
        sb += gv;
        if (has_gw) {
            const TC xv = (TC)x[xk + head_offset(&x_l, from, r)];
            sw += gv * (xv - (TC)VEC(mu, r)) * (TC)VEC(rs, r);
        }
    }
    if (has_gw) VEC(gw, k) = (T)sw;
    if (has_gb) VEC(gb, k) = (T)sb;
}

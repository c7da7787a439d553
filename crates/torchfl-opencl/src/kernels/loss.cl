// The negative log-likelihood loss, forward and backward (kernels/loss.rs),
// computed in float (TC).
//
// Built per dtypes with -D options: TX the input's (and weight's) element
// type, TO the outputs', TC = float.
//
// The host gives every operand four or three dimensions: the input (and
// its gradient) as [N, C, H, W], with H = W = 1 for nll_loss (a [C] input
// is [1, C, 1, 1]), the target, a per-entry loss and a per-entry gradient
// as [N, H, W] (a scalar gradient with strides 0). An entry e is one loss
// term, row-major over [N, H, W]. A target outside [0, C) other than
// ignore_index is not read: its term is NaN (a kernel cannot raise
// PyTorch's "Target t is out of bounds." error).

// The offset of entry e in a [N, H, W] layout.
inline long entry_offset(const Layout* l, long e) {
    const long w = e % l->size[2], h = (e / l->size[2]) % l->size[1], n = e / (l->size[2] * l->size[1]);
    return n * l->stride[0] + h * l->stride[1] + w * l->stride[2];
}

// Entry e's loss -w[t] * x[n, t, h, w] and weight w[t]: (0, 0) when its
// target is ignore_index, (NaN, NaN) when it is out of range.
inline float2 nll_term(__global const TX* x, ulong x_off, const Layout* x_l,
                       __global const long* t, ulong t_off, const Layout* t_l,
                       __global const TX* w, ulong w_off, const Layout* w_l, int has_w,
                       long e, long ignore_index) {
    const long target = t[t_off + entry_offset(t_l, e)];
    if (target == ignore_index) return (float2)(0, 0);
    if (target < 0 || target >= x_l->size[1]) return (float2)(NAN, NAN);
    const long hw = x_l->size[2] * x_l->size[3], s = e % hw;
    const long at = (e / hw) * x_l->stride[0] + target * x_l->stride[1] + (s / x_l->size[3]) * x_l->stride[2] +
                    (s % x_l->size[3]) * x_l->stride[3];
    const TC weight = has_w ? (TC)w[w_off + layout_offset(w_l, target)] : (TC)1;
    return (float2)(-weight * (TC)x[x_off + at], weight);
}

// reduction=none over a batch: each entry's loss; total_weight is 0.
__kernel void nll_forward_none(__global const TX* x, ulong x_off, Layout x_l,
                               __global const long* t, ulong t_off, Layout t_l,
                               __global const TX* w, ulong w_off, Layout w_l, int has_w,
                               __global TO* o, ulong o_off, Layout o_l,
                               __global TO* tw, ulong tw_off, Layout tw_l, long ignore_index) {
    const long e = get_global_id(0);
    if (e == 0) tw[tw_off] = TO_OUT(0);
    if (e >= t_l.numel) return;
    const float2 term = nll_term(x, x_off, &x_l, t, t_off, &t_l, w, w_off, &w_l, has_w, e, ignore_index);
    o[o_off + entry_offset(&o_l, e)] = TO_OUT(term.x);
}

// reduction=sum or mean (and none of one unbatched entry): one work group
// sums the entries' losses and weights; the output is the sum, or the sum
// divided by the summed weight (mean), total_weight the summed weight.
__kernel void nll_forward_reduce(__global const TX* x, ulong x_off, Layout x_l,
                                 __global const long* t, ulong t_off, Layout t_l,
                                 __global const TX* w, ulong w_off, Layout w_l, int has_w,
                                 __global TO* o, ulong o_off, Layout o_l,
                                 __global TO* tw, ulong tw_off, Layout tw_l, long ignore_index, int mean) {
    __local TC part[GROUP];
    const long lane = get_local_id(0), lanes = get_local_size(0);
    Sum loss_sum = sum_new(), weight_sum = sum_new();
    for (long e = lane; e < t_l.numel; e += lanes) {
        const float2 term = nll_term(x, x_off, &x_l, t, t_off, &t_l, w, w_off, &w_l, has_w, e, ignore_index);
        sum_add(&loss_sum, term.x);
        sum_add(&weight_sum, term.y);
    }
    const TC loss = group_sum(part, sum_value(&loss_sum));
    const TC weight = group_sum(part, sum_value(&weight_sum));
    if (lane == 0) {
        o[o_off] = TO_OUT(mean ? loss / weight : loss);
        tw[tw_off] = TO_OUT(weight);
    }
}

// The input's gradient, one work item per element: at the target class
// -w[t] * g[e] (reduction none), -(g / total_weight) * w[t] (mean) or
// -g * w[t] (sum), else 0. g is the output's gradient, per entry or scalar.
__kernel void nll_backward(__global const TX* g, ulong g_off, Layout g_l,
                           __global const long* t, ulong t_off, Layout t_l,
                           __global const TX* w, ulong w_off, Layout w_l, int has_w,
                           __global const TX* tw, ulong tw_off, Layout tw_l,
                           __global TO* gi, ulong gi_off, Layout gi_l, long ignore_index, int reduction) {
    const long i = get_global_id(0);
    if (i >= gi_l.numel) return;
    const long W = gi_l.size[3], H = gi_l.size[2], C = gi_l.size[1];
    const long wi = i % W, hi = (i / W) % H, c = (i / (W * H)) % C, n = i / (W * H * C);
    const long e = (n * H + hi) * W + wi;
    const long target = t[t_off + entry_offset(&t_l, e)];
    TC value = 0;
    if (target == c && target != ignore_index) {
        const TC weight = has_w ? (TC)w[w_off + layout_offset(&w_l, target)] : (TC)1;
        const TC go = (TC)g[g_off + entry_offset(&g_l, e)];
        if (reduction == 0) value = -weight * go;
        else if (reduction == 1) value = -(go / (TC)tw[tw_off]) * weight;
        else value = -go * weight;
    }
    gi[gi_off + n * gi_l.stride[0] + c * gi_l.stride[1] + hi * gi_l.stride[2] + wi * gi_l.stride[3]] = TO_OUT(value);
}

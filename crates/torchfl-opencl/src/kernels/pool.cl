// 2-D pooling: max_pool2d_with_indices, avg_pool2d, _adaptive_avg_pool2d
// and their backwards.
//
// Built per dtype with -D options (kernels/pool.rs):
//   T    the element type of the input, output and gradients
//   TC   the compute type (float for half)
//
// Every tensor arrives as (N, C, H, W) (a 3-D one as N = 1) with its own
// strides. Window bounds are PyTorch's CPU kernels' (MaxPoolKernel.cpp,
// AvgPoolKernel.cpp, AdaptiveAvgPoolKernel.cpp), and so is the summation
// order: a backward work item owns one input element and gathers, in
// increasing (oh, ow) order, what the CPU kernel scatters to it, so results
// match the CPU's without float atomics.

// Element (n, c, h, w) of a 4-D layout, from the tensor's first element.
#define AT4(l, n, c, h, w) \
    ((n) * (l).stride[0] + (c) * (l).stride[1] + (h) * (l).stride[2] + (w) * (l).stride[3])

// Splits work item i of a (N, C, H, W) range into its coordinates.
#define SPLIT4(l, i, n, c, h, w)                  \
    const long w = (i) % (l).size[3];             \
    const long h = ((i) / (l).size[3]) % (l).size[2]; \
    const long c = ((i) / ((l).size[3] * (l).size[2])) % (l).size[1]; \
    const long n = (i) / ((l).size[3] * (l).size[2] * (l).size[1])

// The first output whose window [o * s - p, o * s - p + span] reaches
// input position i (span: the window's extent minus one).
inline long first_window(long i, long p, long span, long s) {
    const long d = i + p - span;
    return d <= 0 ? 0 : (d + s - 1) / s;
}

// The last output whose window starts at or before input position i.
inline long last_window(long i, long p, long s, long n_out) {
    return min((i + p) / s, n_out - 1);
}

// One output: the first maximum of its window (NaN wins and propagates)
// and its flat h * W + w index in the input plane.
__kernel void max_pool2d_forward(__global const T* x, ulong x_off, Layout x_l,
                                 __global T* o, ulong o_off, Layout o_l,
                                 __global long* ind, ulong i_off, Layout i_l,
                                 int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
    const long i = get_global_id(0);
    if (i >= o_l.numel) return;
    SPLIT4(o_l, i, n, c, oh, ow);
    const long H = x_l.size[2], W = x_l.size[3];
    long h0 = oh * sh - ph, w0 = ow * sw - pw;
    const long h1 = min(h0 + (long)(kh - 1) * dh + 1, H);
    const long w1 = min(w0 + (long)(kw - 1) * dw + 1, W);
    while (h0 < 0) h0 += dh;
    while (w0 < 0) w0 += dw;
    __global const T* plane = x + x_off + n * x_l.stride[0] + c * x_l.stride[1];
    long best = h0 * W + w0;
    TC m = -INFINITY;
    for (long ih = h0; ih < h1; ih += dh) {
        for (long iw = w0; iw < w1; iw += dw) {
            const TC v = (TC)plane[ih * x_l.stride[2] + iw * x_l.stride[3]];
            if (v > m || isnan(v)) {
                m = v;
                best = ih * W + iw;
            }
        }
    }
    o[o_off + AT4(o_l, n, c, oh, ow)] = (T)m;
    ind[i_off + AT4(i_l, n, c, oh, ow)] = best;
}

// One input element: the sum of the gradients of the outputs whose
// recorded index is this element (only windows containing it can be).
__kernel void max_pool2d_backward(__global const T* gy, ulong gy_off, Layout gy_l,
                                  __global const long* ind, ulong i_off, Layout i_l,
                                  __global T* gx, ulong gx_off, Layout gx_l,
                                  int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
    const long i = get_global_id(0);
    if (i >= gx_l.numel) return;
    SPLIT4(gx_l, i, n, c, ih, iw);
    const long target = ih * gx_l.size[3] + iw;
    const long oh0 = first_window(ih, ph, (long)(kh - 1) * dh, sh);
    const long oh1 = last_window(ih, ph, sh, gy_l.size[2]);
    const long ow0 = first_window(iw, pw, (long)(kw - 1) * dw, sw);
    const long ow1 = last_window(iw, pw, sw, gy_l.size[3]);
    TC sum = (TC)0;
    for (long oh = oh0; oh <= oh1; ++oh) {
        for (long ow = ow0; ow <= ow1; ++ow) {
            if (ind[i_off + AT4(i_l, n, c, oh, ow)] == target) {
                sum += (TC)gy[gy_off + AT4(gy_l, n, c, oh, ow)];
            }
        }
    }
    gx[gx_off + AT4(gx_l, n, c, ih, iw)] = (T)sum;
}

// An average pooling's parameters, passed as the kernels' nine trailing
// int arguments (kernels/pool.rs `AvgArgs::push`). adaptive: windows
// [floor(o * n / no), ceil((o + 1) * n / no)), divided by their height and
// then their width; otherwise fixed windows with count_include_pad and
// divisor (0: none).
typedef struct {
    int kh, kw, sh, sw, ph, pw;
    int adaptive, count_include_pad, divisor;
} AvgArgs;
#define AVG_PARAMS \
    int kh, int kw, int sh, int sw, int ph, int pw, int adaptive, int count_include_pad, int divisor
#define AVG_ARGS {kh, kw, sh, sw, ph, pw, adaptive, count_include_pad, divisor}

// The window of output (oh, ow) clipped to the input, rows [h0, h1) and
// columns [w0, w1), and the divisors avg_divide applies to its sum (or
// gradient).
typedef struct {
    long h0, h1, w0, w1, div_h, div_w;
} AvgWindow;

inline AvgWindow avg_window(const AvgArgs* a, long oh, long ow, long H, long W, long ho, long wo) {
    AvgWindow r;
    if (a->adaptive) {
        r.h0 = (oh * H) / ho;
        r.h1 = ((oh + 1) * H + ho - 1) / ho;
        r.w0 = (ow * W) / wo;
        r.w1 = ((ow + 1) * W + wo - 1) / wo;
        r.div_h = r.h1 - r.h0;
        r.div_w = r.w1 - r.w0;
        return r;
    }
    long h0 = oh * a->sh - a->ph, w0 = ow * a->sw - a->pw;
    long h1 = min(h0 + a->kh, H + a->ph), w1 = min(w0 + a->kw, W + a->pw);
    const long pool = (h1 - h0) * (w1 - w0);
    r.h0 = max(h0, 0L);
    r.w0 = max(w0, 0L);
    r.h1 = min(h1, H);
    r.w1 = min(w1, W);
    r.div_h = a->divisor != 0 ? a->divisor
              : a->count_include_pad ? pool
                                     : (r.h1 - r.h0) * (r.w1 - r.w0);
    r.div_w = 1;
    return r;
}

// PyTorch's CPU kernels divide an adaptive window's sum by its height and
// then its width, a fixed window's by its divisor once.
inline TC avg_divide(TC v, const AvgWindow* r) {
    v = v / (TC)r->div_h;
    return r->div_w == 1 ? v : v / (TC)r->div_w;
}

__kernel void avg_pool2d_forward(__global const T* x, ulong x_off, Layout x_l,
                                 __global T* o, ulong o_off, Layout o_l, AVG_PARAMS) {
    const AvgArgs a = AVG_ARGS;
    const long i = get_global_id(0);
    if (i >= o_l.numel) return;
    SPLIT4(o_l, i, n, c, oh, ow);
    const AvgWindow r = avg_window(&a, oh, ow, x_l.size[2], x_l.size[3], o_l.size[2], o_l.size[3]);
    TC out = (TC)0;
    if (r.h0 < r.h1 && r.w0 < r.w1) {
        __global const T* plane = x + x_off + n * x_l.stride[0] + c * x_l.stride[1];
        TC sum = (TC)0;
        for (long ih = r.h0; ih < r.h1; ++ih) {
            for (long iw = r.w0; iw < r.w1; ++iw) {
                sum += (TC)plane[ih * x_l.stride[2] + iw * x_l.stride[3]];
            }
        }
        out = avg_divide(sum, &r);
    }
    o[o_off + AT4(o_l, n, c, oh, ow)] = (T)out;
}

// One input element: the divided gradients of the outputs whose (clipped)
// window contains it, as the CPU kernel adds them.
__kernel void avg_pool2d_backward(__global const T* gy, ulong gy_off, Layout gy_l,
                                  __global T* gx, ulong gx_off, Layout gx_l, AVG_PARAMS) {
    const AvgArgs a = AVG_ARGS;
    const long i = get_global_id(0);
    if (i >= gx_l.numel) return;
    SPLIT4(gx_l, i, n, c, ih, iw);
    const long H = gx_l.size[2], W = gx_l.size[3], ho = gy_l.size[2], wo = gy_l.size[3];
    long oh0, oh1, ow0, ow1;
    if (a.adaptive) {
        oh0 = (ih * ho) / H;
        oh1 = min(((ih + 1) * ho + H - 1) / H, ho) - 1;
        ow0 = (iw * wo) / W;
        ow1 = min(((iw + 1) * wo + W - 1) / W, wo) - 1;
    } else {
        oh0 = first_window(ih, a.ph, a.kh - 1, a.sh);
        oh1 = last_window(ih, a.ph, a.sh, ho);
        ow0 = first_window(iw, a.pw, a.kw - 1, a.sw);
        ow1 = last_window(iw, a.pw, a.sw, wo);
    }
    TC sum = (TC)0;
    for (long oh = oh0; oh <= oh1; ++oh) {
        for (long ow = ow0; ow <= ow1; ++ow) {
            const AvgWindow r = avg_window(&a, oh, ow, H, W, ho, wo);
            if (ih < r.h0 || ih >= r.h1 || iw < r.w0 || iw >= r.w1) continue;
            const TC g = (TC)gy[gy_off + AT4(gy_l, n, c, oh, ow)];
            // The CPU kernel rounds each share to the element type.
            sum += (TC)(T)avg_divide(g, &r);
        }
    }
    gx[gx_off + AT4(gx_l, n, c, ih, iw)] = (T)sum;
}

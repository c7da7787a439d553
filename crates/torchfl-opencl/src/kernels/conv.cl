// Convolution as direct loops: the forward pass, the input gradient, the
// weight gradient and the bias gradient of a regular 2-D convolution (a
// 1-D one arrives as 2-D with H = KH = 1; a transposed one as its regular
// "twin", kernels/conv.rs).
//
// Built per element type with -D T=... (and USE_HALF for half); computes in
// float. Every tensor is 4-D [N, C, H, W] (weights [COUT, CIN/G, KH, KW])
// and is addressed through its own strides, so channels-last and other
// non-contiguous layouts need no copy. One work item owns one output
// element and loops over everything it sums (no atomics: deterministic).
// The geometry is runtime arguments, so one build serves every layer.
//
// Work items run in groups of a fixed size over a range rounded up to it;
// those past the end return.

#define CONV_GEOM                                                                   \
    int N, int CIN, int H, int W, int COUT, int KH, int KW, int HO, int WO, int SH, \
        int SW, int PH, int PW, int DH, int DW, int G

// out[n, co, oh, ow] = bias[co] + sum over (c, ki, kj) of
//   x[n, g*cin_g + c, oh*SH - PH + ki*DH, ow*SW - PW + kj*DW] * w[co, c, ki, kj].
// Ordered with ow fastest, so neighbouring work items read neighbouring
// input and the same weights.
__kernel void conv_forward(__global const T* x, ulong x_off, Layout x_l,
                           __global const T* w, ulong w_off, Layout w_l,
                           __global const T* b, ulong b_off, Layout b_l, int has_b,
                           __global T* o, ulong o_off, Layout o_l, CONV_GEOM) {
    const long i = get_global_id(0);
    if (i >= o_l.numel) return;
    const int ow = (int)(i % WO);
    long r = i / WO;
    const int oh = (int)(r % HO);
    r /= HO;
    const int co = (int)(r % COUT);
    const int n = (int)(r / COUT);
    const int cin_g = CIN / G, cout_g = COUT / G;
    const int grp = co / cout_g;
    const long xs1 = x_l.stride[1], xs2 = x_l.stride[2], xs3 = x_l.stride[3];
    const long ws1 = w_l.stride[1], ws2 = w_l.stride[2], ws3 = w_l.stride[3];
    const long xbase = (long)x_off + n * x_l.stride[0] + (long)grp * cin_g * xs1;
    const long wbase = (long)w_off + co * w_l.stride[0];
    const int ih0 = oh * SH - PH, iw0 = ow * SW - PW;
    float acc = has_b ? (float)b[b_off + co * b_l.stride[0]] : 0.0f;
    for (int ki = 0; ki < KH; ++ki) {
        const int ih = ih0 + ki * DH;
        if (ih < 0 || ih >= H) continue;
        for (int kj = 0; kj < KW; ++kj) {
            const int iw = iw0 + kj * DW;
            if (iw < 0 || iw >= W) continue;
            const long xo = xbase + ih * xs2 + iw * xs3;
            const long wo = wbase + ki * ws2 + kj * ws3;
            for (int c = 0; c < cin_g; ++c) acc += (float)x[xo + c * xs1] * (float)w[wo + c * ws1];
        }
    }
    o[o_off + n * o_l.stride[0] + co * o_l.stride[1] + oh * o_l.stride[2] + ow * o_l.stride[3]] = (T)acc;
}

// gx[n, ci, ih, iw] = bias[ci] + sum over the output positions (oh, ow) and
// kernel taps (ki, kj) with oh*SH - PH + ki*DH == ih (same for w), and over
// the output channels co of ci's group, of gy[n, co, oh, ow] * w[co, c, ki, kj]:
// the input gradient gathered, so no two work items write one element.
// (The bias is the transposed convolution's, whose forward pass this is.)
__kernel void conv_grad_input(__global const T* gy, ulong gy_off, Layout gy_l,
                              __global const T* w, ulong w_off, Layout w_l,
                              __global const T* b, ulong b_off, Layout b_l, int has_b,
                              __global T* gx, ulong gx_off, Layout gx_l, CONV_GEOM) {
    const long i = get_global_id(0);
    if (i >= gx_l.numel) return;
    const int iw = (int)(i % W);
    long r = i / W;
    const int ih = (int)(r % H);
    r /= H;
    const int ci = (int)(r % CIN);
    const int n = (int)(r / CIN);
    const int cin_g = CIN / G, cout_g = COUT / G;
    const int grp = ci / cin_g, c = ci % cin_g;
    const long gs1 = gy_l.stride[1], gs2 = gy_l.stride[2], gs3 = gy_l.stride[3];
    const long ws0 = w_l.stride[0], ws2 = w_l.stride[2], ws3 = w_l.stride[3];
    const long gbase = (long)gy_off + n * gy_l.stride[0] + (long)grp * cout_g * gs1;
    const long wbase = (long)w_off + (long)grp * cout_g * ws0 + c * w_l.stride[1];
    float acc = has_b ? (float)b[b_off + ci * b_l.stride[0]] : 0.0f;
    for (int ki = 0; ki < KH; ++ki) {
        const int th = ih + PH - ki * DH;
        if (th < 0 || th % SH != 0) continue;
        const int oh = th / SH;
        if (oh >= HO) continue;
        for (int kj = 0; kj < KW; ++kj) {
            const int tw = iw + PW - kj * DW;
            if (tw < 0 || tw % SW != 0) continue;
            const int ow = tw / SW;
            if (ow >= WO) continue;
            const long go = gbase + oh * gs2 + ow * gs3;
            const long wo = wbase + ki * ws2 + kj * ws3;
            for (int k = 0; k < cout_g; ++k) acc += (float)gy[go + k * gs1] * (float)w[wo + k * ws0];
        }
    }
    gx[gx_off + n * gx_l.stride[0] + ci * gx_l.stride[1] + ih * gx_l.stride[2] + iw * gx_l.stride[3]] = (T)acc;
}

// The first output position o >= 0 whose input position o*s - a is >= 0.
inline int tap_first(int a, int s) { return a > 0 ? (a + s - 1) / s : 0; }
// One past the last output position o < out whose input position o*s - a
// is < size (at most the first's: an empty range).
inline int tap_end(int a, int s, int size, int out) {
    const int t = size - 1 + a;
    return t < 0 ? 0 : min(out, t / s + 1);
}

// gw[co, c, ki, kj] = sum over (n, oh, ow) of
//   gy[n, co, oh, ow] * x[n, g*cin_g + c, oh*SH - PH + ki*DH, ow*SW - PW + kj*DW],
// the output positions whose input tap is inside the image only.
__kernel void conv_grad_weight(__global const T* gy, ulong gy_off, Layout gy_l,
                               __global const T* x, ulong x_off, Layout x_l,
                               __global T* gw, ulong gw_off, Layout gw_l, CONV_GEOM) {
    const long i = get_global_id(0);
    if (i >= gw_l.numel) return;
    const int cin_g = CIN / G, cout_g = COUT / G;
    const int kj = (int)(i % KW);
    long r = i / KW;
    const int ki = (int)(r % KH);
    r /= KH;
    const int c = (int)(r % cin_g);
    const int co = (int)(r / cin_g);
    const int grp = co / cout_g;
    const long gs2 = gy_l.stride[2], gs3 = gy_l.stride[3];
    const long xs2 = x_l.stride[2], xs3 = x_l.stride[3];
    // Only the output rows (columns) whose tap ki (kj) lands inside the input.
    const int oh_lo = tap_first(PH - ki * DH, SH), oh_hi = tap_end(PH - ki * DH, SH, H, HO);
    const int ow_lo = tap_first(PW - kj * DW, SW), ow_hi = tap_end(PW - kj * DW, SW, W, WO);
    float acc = 0.0f;
    for (int n = 0; n < N; ++n) {
        const long gbase = (long)gy_off + n * gy_l.stride[0] + co * gy_l.stride[1];
        const long xbase = (long)x_off + n * x_l.stride[0] + ((long)grp * cin_g + c) * x_l.stride[1];
        for (int oh = oh_lo; oh < oh_hi; ++oh) {
            const long grow = gbase + oh * gs2;
            const long xrow = xbase + (oh * SH - PH + ki * DH) * xs2 + (kj * DW - PW) * xs3;
            for (int ow = ow_lo; ow < ow_hi; ++ow)
                acc += (float)gy[grow + ow * gs3] * (float)x[xrow + ow * SW * xs3];
        }
    }
    gw[gw_off + co * gw_l.stride[0] + c * gw_l.stride[1] + ki * gw_l.stride[2] + kj * gw_l.stride[3]] = (T)acc;
}

// gb[co] = sum over (n, oh, ow) of gy[n, co, oh, ow].
__kernel void conv_grad_bias(__global const T* gy, ulong gy_off, Layout gy_l,
                             __global T* gb, ulong gb_off, Layout gb_l) {
    const long co = get_global_id(0);
    if (co >= gb_l.numel) return;
    float acc = 0.0f;
    for (long n = 0; n < gy_l.size[0]; ++n) {
        const long base = (long)gy_off + n * gy_l.stride[0] + co * gy_l.stride[1];
        for (long h = 0; h < gy_l.size[2]; ++h)
            for (long w = 0; w < gy_l.size[3]; ++w) acc += (float)gy[base + h * gy_l.stride[2] + w * gy_l.stride[3]];
    }
    gb[gb_off + co * gb_l.stride[0]] = (T)acc;
}

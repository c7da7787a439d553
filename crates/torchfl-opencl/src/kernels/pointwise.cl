// Pointwise operators of up to three operands (x, y, z) and a number s:
// threshold_backward, gelu and its backward, addcmul, addcdiv, lerp,
// masked_fill, where, bitwise_not.
//
// Built per (operator, dtypes) with -D options (kernels/pointwise.rs):
//   TX, TY, TZ, TO   the operands' and the output's element types
//   TC               the compute type (float for half, long for bool)
//   OP               the op_* function below
//   X_HOST, Y_HOST, Z_HOST  the operand is a number passed by value
//   TC_FLOAT         TC is floating point (the float-only functions exist)
//
// Work item i computes output element i in row-major order of the output's
// shape; each operand's Layout holds the output's sizes and the operand's
// strides broadcast to them (0 along broadcast dimensions).

#ifdef TC_FLOAT
inline TC op_gelu_none(TC x, TC y, TC z, TC s) {
    return (TC)0.5 * x * ((TC)1 + erf(x * (TC)M_SQRT1_2_F));
}
inline TC op_gelu_tanh(TC x, TC y, TC z, TC s) {
    const TC beta = (TC)(M_SQRT2_F * M_2_SQRTPI_F * 0.5f);
    return (TC)0.5 * x * ((TC)1 + tanh(beta * (x + (TC)0.044715 * x * x * x)));
}
// x = grad_output, y = self: PyTorch's GeluBackward formulas.
inline TC op_gelu_backward_none(TC x, TC y, TC z, TC s) {
    const TC cdf = (TC)0.5 * ((TC)1 + erf(y * (TC)M_SQRT1_2_F));
    const TC pdf = exp((TC)-0.5 * y * y) * (TC)(M_2_SQRTPI_F * M_SQRT1_2_F * 0.5f);
    return x * (cdf + y * pdf);
}
inline TC op_gelu_backward_tanh(TC x, TC y, TC z, TC s) {
    const TC beta = (TC)(M_SQRT2_F * M_2_SQRTPI_F * 0.5f), kappa = (TC)0.044715;
    const TC inner = beta * (y + kappa * y * y * y);
    const TC t = tanh(inner);
    const TC left = (TC)0.5 * y, right = (TC)1 + t;
    const TC right_derivative = left * ((TC)1 - t * t) * beta * ((TC)1 + (TC)3 * kappa * y * y);
    return x * ((TC)0.5 * right + right_derivative);
}
// self ** s; a square is a product, as PyTorch's kernel makes it.
inline TC op_pow_scalar(TC x, TC y, TC z, TC s) { return s == (TC)2 ? x * x : pow(x, s); }
// PyTorch's lerp: exact at both ends.
inline TC op_lerp(TC x, TC y, TC z, TC s) {
    const TC d = y - x;
    return fabs(z) < (TC)0.5 ? x + z * d : y - d * ((TC)1 - z);
}
#endif
// x = grad_output, y = self, s = threshold.
inline TC op_threshold_backward(TC x, TC y, TC z, TC s) { return y <= s ? (TC)0 : x; }
inline TC op_addcmul(TC x, TC y, TC z, TC s) { return x + s * y * z; }
inline TC op_addcdiv(TC x, TC y, TC z, TC s) { return x + s * y / z; }
// x = self, y = mask, z = value.
inline TC op_masked_fill(TC x, TC y, TC z, TC s) { return y != (TC)0 ? z : x; }
// x = condition, y = self, z = other.
inline TC op_where(TC x, TC y, TC z, TC s) { return x != (TC)0 ? y : z; }
#ifndef TC_FLOAT
#ifdef TO_BOOL
inline TC op_bitwise_not(TC x, TC y, TC z, TC s) { return x == (TC)0; }
#else
inline TC op_bitwise_not(TC x, TC y, TC z, TC s) { return ~x; }
#endif
#endif

#ifdef X_HOST
#define LOAD_X x_v
#else
#define LOAD_X ((TC)x[ix])
#endif
#ifdef Y_HOST
#define LOAD_Y y_v
#else
#define LOAD_Y ((TC)y[iy])
#endif
#ifdef Z_HOST
#define LOAD_Z z_v
#else
#define LOAD_Z ((TC)z[iz])
#endif

__kernel void pointwise(__global const TX* x, ulong x_off, Layout x_l, TC x_v,
                        __global const TY* y, ulong y_off, Layout y_l, TC y_v,
                        __global const TZ* z, ulong z_off, Layout z_l, TC z_v,
                        __global TO* o, ulong o_off, Layout o_l, TC s) {
    const long i = get_global_id(0);
    if (i >= o_l.numel) return;
    long rem = i;
    long ix = (long)x_off, iy = (long)y_off, iz = (long)z_off, io = (long)o_off;
    for (int d = (int)o_l.ndim - 1; d >= 0; --d) {
        const long k = rem % o_l.size[d];
        rem /= o_l.size[d];
        ix += k * x_l.stride[d];
        iy += k * y_l.stride[d];
        iz += k * z_l.stride[d];
        io += k * o_l.stride[d];
    }
    o[io] = TO_OUT(OP(LOAD_X, LOAD_Y, LOAD_Z, s));
}

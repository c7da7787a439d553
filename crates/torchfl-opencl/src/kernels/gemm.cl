// o[b] = alpha * a[b] @ b[b] (+ beta * c[b]): mm, bmm and addmm.
//
// Built per element type with -D T=... (and USE_HALF for half); computes in
// float. Each operand is addressed through its own strides (batch, row,
// column), so transposed and broadcast operands (addmm's bias row, `x.t()`)
// need no copy. One 16x16 work group computes a 16x16 tile of the output,
// staging tiles of a and b in local memory.
#define TILE 16

__kernel void gemm(__global const T* a, ulong a_off, long a_s0, long a_s1, long a_s2,
                   __global const T* b, ulong b_off, long b_s0, long b_s1, long b_s2,
                   __global const T* c, ulong c_off, long c_s0, long c_s1, long c_s2,
                   __global T* o, ulong o_off, long o_s0, long o_s1, long o_s2,
                   long M, long N, long K, float alpha, float beta, int has_c) {
    const int tm = get_local_id(0), tn = get_local_id(1);
    const long m = get_group_id(0) * TILE + tm;
    const long n = get_group_id(1) * TILE + tn;
    const long batch = get_global_id(2);
    __local float as[TILE][TILE];
    __local float bs[TILE][TILE];
    float acc = 0.0f;
    for (long k0 = 0; k0 < K; k0 += TILE) {
        const long ka = k0 + tn, kb = k0 + tm;
        as[tm][tn] = (m < M && ka < K) ? (float)a[a_off + batch * a_s0 + m * a_s1 + ka * a_s2] : 0.0f;
        bs[tm][tn] = (kb < K && n < N) ? (float)b[b_off + batch * b_s0 + kb * b_s1 + n * b_s2] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TILE; ++kk) acc += as[tm][kk] * bs[kk][tn];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (m < M && n < N) {
        float r = alpha * acc;
        if (has_c) r += beta * (float)c[c_off + batch * c_s0 + m * c_s1 + n * c_s2];
        o[o_off + batch * o_s0 + m * o_s1 + n * o_s2] = (T)r;
    }
}

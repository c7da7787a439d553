// Work-group reductions through local memory, shared by reduce.cl,
// softmax.cl and loss.cl (each source is common.cl, then this, then its
// own; TC is the type reduced).
//
// Those kernels run over a 2-D range (lanes, rows): the get_local_size(0)
// lanes of one local row (get_local_id(1)) share one reduction, each
// folding every lanes-th element, and these helpers combine the lanes'
// partial results in a fixed tree, so a result depends on the shapes only,
// never on scheduling. Every work item of the group must call them (they
// hold barriers), live or not. GROUP bounds lanes * rows per work group
// (kernels/reduce.rs `GROUP`).
#define GROUP 128

// A lane's running sum, blocked: BLOCK terms are added into `block` before
// it is added to `total`, so a long float sum's rounding error stays near
// that of sums BLOCK long (a plain running sum's grows with its length),
// while inf and NaN propagate as in a plain sum.
#define BLOCK 32
typedef struct {
    TC total, block;
    int n;
} Sum;

inline Sum sum_new(void) {
    Sum s = {0, 0, 0};
    return s;
}

inline void sum_add(Sum* s, TC v) {
    s->block += v;
    if (++s->n == BLOCK) {
        s->total += s->block;
        s->block = 0;
        s->n = 0;
    }
}

inline TC sum_value(const Sum* s) { return s->total + s->block; }

// The sum of v over the lanes of the caller's local row.
inline TC group_sum(__local TC* part, TC v) {
    const int lanes = (int)get_local_size(0), lane = (int)get_local_id(0);
    const int first = (int)get_local_id(1) * lanes;
    barrier(CLK_LOCAL_MEM_FENCE); // a previous reduction's readers are done
    part[first + lane] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = lanes >> 1; s > 0; s >>= 1) {
        if (lane < s) part[first + lane] += part[first + lane + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[first];
}

#ifdef TC_FLOAT
// The maximum of v over the lanes of the caller's local row; NaN wins.
inline TC group_max(__local TC* part, TC v) {
    const int lanes = (int)get_local_size(0), lane = (int)get_local_id(0);
    const int first = (int)get_local_id(1) * lanes;
    barrier(CLK_LOCAL_MEM_FENCE);
    part[first + lane] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = lanes >> 1; s > 0; s >>= 1) {
        if (lane < s) {
            const TC other = part[first + lane + s];
            if (isnan(other) || other > part[first + lane]) part[first + lane] = other;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[first];
}
#endif

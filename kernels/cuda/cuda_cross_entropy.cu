// cuda_cross_entropy.cu: the vocab-parallel cross-entropy pieces of the CUDA
// backend (Megatron vocab_parallel_cross_entropy; formulas in kernels/ops.h
// and kernels/cpu/generic/cross_entropy.h). One block per row for the row
// reductions; rowmax, partials, loss and lse are FP32.
#include "cuda_internal.cuh"

#define CE_THREADS 256

// rowmax (N,) = max over columns [0, Vvalid) of logits (N, Vl); -inf when Vvalid == 0.
__global__ void ce_row_max_kernel(float *rowmax, struct dptr logits, int Vl, int Vvalid) {
    __shared__ float shared[32];
    size_t row = (size_t)blockIdx.x * Vl;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < Vvalid; j += blockDim.x) mx = fmaxf(mx, ld(logits, row + j));
    mx = block_max(mx, shared);
    if (threadIdx.x == 0) rowmax[blockIdx.x] = mx;
}

void cuda_ce_row_max(struct backend *be, struct tensor rowmax, struct tensor logits, int N, int Vl,
                     int Vvalid) {
    struct dptr pl = dptr_of("ce_row_max", "logits", logits);
    CUDA_CHECK_SAME("ce_row_max", "rowmax", rowmax, DTYPE_FP32);
    if (N == 0) return;
    CUDA_TRAFFIC(tbytes(logits, (size_t)N * Vvalid) + sizeof(float) * N);
    ce_row_max_kernel<<<N, CE_THREADS, 0, cuda_stream(be)>>>((float *)rowmax.data, pl, Vl, Vvalid);
    CHECK_LAUNCH();
}

// partials (N, 3) = [sum_j exp(z_ij - rowmax_i), z_{i,y_i} when owned else 0, sum_j z_ij].
__global__ void ce_partials_kernel(float *partials, struct dptr logits, const float *rowmax,
                                   const int32_t *targets, int Vl, int Vvalid, int vocab_start) {
    __shared__ float shared[32];
    size_t row = (size_t)blockIdx.x * Vl;
    float mx = rowmax[blockIdx.x], se = 0, sz = 0;
    for (int j = threadIdx.x; j < Vvalid; j += blockDim.x) {
        float z = ld(logits, row + j);
        se += expf(z - mx);
        sz += z;
    }
    se = block_sum(se, shared);
    sz = block_sum(sz, shared);
    if (threadIdx.x == 0) {
        int y = targets[blockIdx.x] - vocab_start;
        float *p = partials + 3 * (size_t)blockIdx.x;
        p[0] = se;
        p[1] = y >= 0 && y < Vvalid ? ld(logits, row + y) : 0.0f;
        p[2] = sz;
    }
}

void cuda_ce_partials(struct backend *be, struct tensor partials, struct tensor logits,
                      struct tensor rowmax, struct tensor targets, int N, int Vl, int Vvalid,
                      int vocab_start) {
    const char *op = "ce_partials";
    struct dptr pl = dptr_of(op, "logits", logits);
    CUDA_CHECK_SAME(op, "rowmax", rowmax, DTYPE_FP32);
    CUDA_CHECK_SAME(op, "partials", partials, DTYPE_FP32);
    if (N == 0) return;
    CUDA_TRAFFIC(tbytes(logits, (size_t)N * Vvalid) + sizeof(float) * 4 * N + sizeof(int32_t) * N);
    ce_partials_kernel<<<N, CE_THREADS, 0, cuda_stream(be)>>>(
        (float *)partials.data, pl, (const float *)rowmax.data, (const int32_t *)targets.data, Vl,
        Vvalid, vocab_start);
    CHECK_LAUNCH();
}

// loss (N,), lse (N,) from the reduced partials; an ignored row has loss 0 and
// lse 0 when not finite. Targets neither ignored nor in [0, V) are counted in
// *bad (reported by synchronize).
__global__ void ce_loss_kernel(float *loss, float *lse, const float *partials,
                               const float *rowmax, const int32_t *targets, int N, int V,
                               float smoothing, int ignore_index, int *bad) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float *p = partials + 3 * (size_t)i;
    double l = (double)rowmax[i] + log((double)p[0]);
    if (targets[i] == ignore_index) {
        lse[i] = isfinite(l) ? (float)l : 0.0f;
        loss[i] = 0;
        return;
    }
    if (targets[i] < 0 || targets[i] >= V) atomicAdd(bad, 1);
    lse[i] = (float)l;
    loss[i] = (float)(l - (1.0 - (double)smoothing) * p[1] - (double)smoothing / V * p[2]);
}

void cuda_ce_loss(struct backend *be, struct tensor loss, struct tensor lse,
                  struct tensor partials, struct tensor rowmax, struct tensor targets, int N,
                  int V, float smoothing, int ignore_index) {
    const char *op = "ce_loss";
    CUDA_CHECK_SAME(op, "loss", loss, DTYPE_FP32);
    CUDA_CHECK_SAME(op, "lse", lse, DTYPE_FP32);
    CUDA_CHECK_SAME(op, "partials", partials, DTYPE_FP32);
    CUDA_CHECK_SAME(op, "rowmax", rowmax, DTYPE_FP32);
    if (N == 0) return;
    CUDA_TRAFFIC(sizeof(float) * 6 * (size_t)N + sizeof(int32_t) * N);
    ce_loss_kernel<<<(N + CE_THREADS - 1) / CE_THREADS, CE_THREADS, 0, cuda_stream(be)>>>(
        (float *)loss.data, (float *)lse.data, (const float *)partials.data,
        (const float *)rowmax.data, (const int32_t *)targets.data, N, V, smoothing, ignore_index,
        cuda_state(be)->bad);
    CHECK_LAUNCH();
}

// dlogits (N, Vl) = scale (exp(z - lse) - (1 - s) onehot(y) - s / V) on real
// columns; 0 on padding columns and ignored rows. One block per row.
__global__ void ce_backward_kernel(struct dptr dlogits, struct dptr logits, const float *lse,
                                   const int32_t *targets, int Vl, int Vvalid, int vocab_start,
                                   float uniform, float onehot, float scale, int ignore_index) {
    size_t row = (size_t)blockIdx.x * Vl;
    int t = targets[blockIdx.x];
    bool ignored = t == ignore_index;
    int y = t - vocab_start;
    float l = lse[blockIdx.x];
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        float d = 0;
        if (!ignored && j < Vvalid) {
            d = scale * (expf(ld(logits, row + j) - l) - uniform);
            if (j == y) d -= scale * onehot;
        }
        st(dlogits, row + j, d);
    }
}

void cuda_ce_backward(struct backend *be, struct tensor dlogits, struct tensor logits,
                      struct tensor lse, struct tensor targets, int N, int Vl, int Vvalid,
                      int vocab_start, int V, float smoothing, int ignore_index, double scale) {
    const char *op = "ce_backward";
    struct dptr pd = dptr_of(op, "dlogits", dlogits), pl = dptr_of(op, "logits", logits);
    CUDA_CHECK_SAME(op, "lse", lse, DTYPE_FP32);
    CHECK(Vvalid >= 0 && Vvalid <= Vl, "ce_backward: Vvalid=%d outside [0, Vl=%d]", Vvalid, Vl);
    if (N == 0) return;
    CUDA_TRAFFIC(tbytes(dlogits, (size_t)N * Vl) + tbytes(logits, (size_t)N * Vvalid) +
                 (sizeof(float) + sizeof(int32_t)) * N);
    ce_backward_kernel<<<N, CE_THREADS, 0, cuda_stream(be)>>>(
        pd, pl, (const float *)lse.data, (const int32_t *)targets.data, Vl, Vvalid, vocab_start,
        smoothing / V, 1.0f - smoothing, (float)scale, ignore_index);
    CHECK_LAUNCH();
}

// *acc += sum of x (n,), one block: FP64 per-thread sums over a fixed
// stride, added in a fixed tree order (deterministic). n is a microbatch's
// token count (B T): one block reads it at a fraction of a kernel's cost.
__global__ void sum_into_kernel(double *acc, struct dptr x, size_t n) {
    __shared__ double shared[CE_THREADS];
    double s = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += ld(x, i);
    shared[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) shared[threadIdx.x] += shared[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *acc += shared[0];
}

void cuda_sum_into(struct backend *be, struct tensor acc, struct tensor x, size_t n) {
    struct dptr px = dptr_of("sum_into", "x", x);
    if (!n) return;
    CUDA_TRAFFIC(n * dtype_size(x.dtype) + 2 * sizeof(double));
    sum_into_kernel<<<1, CE_THREADS, 0, cuda_stream(be)>>>((double *)acc.data, px, n);
    CHECK_LAUNCH();
}

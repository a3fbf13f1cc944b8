// cuda_moe.cu: the mixture-of-experts ops of the CUDA backend (kernels/ops.h,
// "mixture of experts"): routing (one thread per token; E and k are small),
// its statistics and backward, the dispatch plan (a stable counting sort:
// one block per expert scans the assignments in order), and the row gathers
// of permute / combine and their backward. Math and order of every sum as
// the CPU bodies (kernels/cpu/generic/moe.h), the specification; routing in
// FP32 only (the CUDA backend's statistics dtype). No atomics: every output
// element has one writer, so results are the same run to run.
#include "cuda_internal.cuh"

#define MOE_THREADS 256

static inline unsigned moe_grid(size_t n) { return grid_for(n, MOE_THREADS); }

#define MOE_LAUNCH(be, n) <<<moe_grid(n), MOE_THREADS, 0, cuda_stream(be)>>>

#define MOE_GRID_STRIDE(i, n)                                                  \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);    \
         i += (size_t)gridDim.x * blockDim.x)

// ---- routing ---------------------------------------------------------------------

// One thread per token: softmax, logsumexp, the k largest keys (probs +
// bias), descending, ties to the lower index; weights renormalised or not.
__global__ void moe_route_kernel(float *probs, float *lse, int *topk_idx, float *topk_w,
                                 const float *logits, const float *bias, int N, int E, int k,
                                 bool renorm) {
    MOE_GRID_STRIDE(t, (size_t)N) {
        const float *l = logits + t * E;
        float *p = probs + t * E;
        int *idx = topk_idx + t * k;
        float *w = topk_w + t * k;
        float mx = l[0];
        for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += (double)(p[e] = expf(l[e] - mx));
        for (int e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
        lse[t] = (float)(mx + log(sum));
        double wsum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            float key = 0;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int m = 0; m < j; m++) taken |= idx[m] == e;
                float ke = bias ? p[e] + bias[e] : p[e];
                if (!taken && (best < 0 || ke > key)) best = e, key = ke;
            }
            idx[j] = best;
            w[j] = p[best];
            wsum += p[best];
        }
        if (renorm)
            for (int j = 0; j < k; j++) w[j] = (float)(w[j] / wsum);
    }
}

// stats[e] = sum_t probs[t, e] (block e < E), stats[E] = sum_t lse[t]^2
// (block E): per thread a strided FP64 sum, then a fixed tree.
__global__ void moe_route_stats_kernel(double *stats, const float *probs, const float *lse, int N,
                                       int E) {
    __shared__ double shared[MOE_THREADS];
    int e = blockIdx.x;
    double s = 0;
    for (int t = threadIdx.x; t < N; t += blockDim.x)
        s += e < E ? (double)probs[(size_t)t * E + e] : (double)lse[t] * lse[t];
    shared[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) shared[threadIdx.x] += shared[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) stats[e] = shared[0];
}

void cuda_moe_route(struct backend *be, struct tensor probs, struct tensor lse,
                    struct tensor topk_idx, struct tensor topk_w, struct tensor stats,
                    struct tensor logits, struct tensor sel_bias, int N, int E, int k,
                    bool renorm) {
    CUDA_CHECK_SAME("moe_route", "logits", logits, DTYPE_FP32);
    if (N > 0) {
        CUDA_TRAFFIC(sizeof(float) * (size_t)N * (2 * E + 1 + k) + sizeof(int) * (size_t)N * k);
        moe_route_kernel MOE_LAUNCH(be, N)((float *)probs.data, (float *)lse.data,
                                           (int *)topk_idx.data, (float *)topk_w.data,
                                           (const float *)logits.data,
                                           sel_bias.numel ? (const float *)sel_bias.data : NULL, N,
                                           E, k, renorm);
        CHECK_LAUNCH();
    }
    CUDA_TRAFFIC(sizeof(float) * (size_t)N * (E + 1) + sizeof(double) * (E + 1));
    moe_route_stats_kernel<<<E + 1, MOE_THREADS, 0, cuda_stream(be)>>>(
        (double *)stats.data, (const float *)probs.data, (const float *)lse.data, N, E);
    CHECK_LAUNCH();
}

// One thread per token, as the CPU body: dlogits row first holds dp.
__global__ void moe_route_backward_kernel(float *dlogits, const float *dw, const float *probs,
                                          const float *lse, const int *topk_idx,
                                          const float *aux_w, int N, int E, int k, bool renorm,
                                          float z_scale) {
    MOE_GRID_STRIDE(t, (size_t)N) {
        const float *p = probs + t * E, *dwt = dw + t * k;
        const int *idx = topk_idx + t * k;
        float *dl = dlogits + t * E;
        for (int e = 0; e < E; e++) dl[e] = aux_w ? aux_w[e] : 0.0f;
        double S = 0, dot = 0;
        for (int j = 0; j < k; j++) S += p[idx[j]];
        for (int j = 0; j < k; j++) dot += (double)dwt[j] * (p[idx[j]] / S);
        for (int j = 0; j < k; j++) dl[idx[j]] += renorm ? (float)((dwt[j] - dot) / S) : dwt[j];
        double pdp = 0;
        for (int e = 0; e < E; e++) pdp += (double)p[e] * dl[e];
        for (int e = 0; e < E; e++)
            dl[e] = (float)(p[e] * ((double)dl[e] - pdp) + (double)z_scale * lse[t] * p[e]);
    }
}

void cuda_moe_route_backward(struct backend *be, struct tensor dlogits, struct tensor dtopk_w,
                             struct tensor probs, struct tensor lse, struct tensor topk_idx,
                             struct tensor aux_w, int N, int E, int k, bool renorm, float z_scale) {
    CUDA_CHECK_SAME("moe_route_backward", "probs", probs, DTYPE_FP32);
    if (N <= 0) return;
    CUDA_TRAFFIC(sizeof(float) * (size_t)N * (2 * E + 1 + k) + sizeof(int) * (size_t)N * k);
    moe_route_backward_kernel MOE_LAUNCH(be, N)(
        (float *)dlogits.data, (const float *)dtopk_w.data, (const float *)probs.data,
        (const float *)lse.data, (const int *)topk_idx.data,
        aux_w.numel ? (const float *)aux_w.data : NULL, N, E, k, renorm, z_scale);
    CHECK_LAUNCH();
}

// ---- dispatch plan ---------------------------------------------------------------

__global__ void moe_fill_kernel(int *x, size_t n, int v) { MOE_GRID_STRIDE(i, n) x[i] = v; }

// Block e: the ranks of expert e's assignments in assignment order (a block
// scan of the flags, MOE_THREADS at a time), into dest; counts[E + e] the
// routed total, counts[e] what the capacity keeps.
__global__ void moe_rank_kernel(int *counts, int *dest, const int *idx, size_t n, int E,
                                int capacity) {
    __shared__ int scan[MOE_THREADS];
    int e = blockIdx.x, base = 0;
    for (size_t start = 0; start < n; start += blockDim.x) {
        size_t a = start + threadIdx.x;
        int flag = a < n && idx[a] == e;
        scan[threadIdx.x] = flag;
        __syncthreads();
        for (int o = 1; o < (int)blockDim.x; o <<= 1) { // inclusive Hillis-Steele scan
            int v = (int)threadIdx.x >= o ? scan[threadIdx.x - o] : 0;
            __syncthreads();
            scan[threadIdx.x] += v;
            __syncthreads();
        }
        if (flag) dest[a] = base + scan[threadIdx.x] - 1;
        base += scan[blockDim.x - 1];
        __syncthreads(); // scan[] is rewritten next round
    }
    if (threadIdx.x == 0) {
        counts[E + e] = base;
        counts[e] = capacity > 0 && base > capacity ? capacity : base;
    }
}

// Assignment a: its row offset_e + rank when kept (dest, and src at that
// row), else dest -1. offset_e sums the kept counts of the experts before e.
__global__ void moe_place_kernel(int *dest, int *src, const int *counts, const int *idx, size_t n) {
    MOE_GRID_STRIDE(a, n) {
        int e = idx[a], offset = 0;
        for (int m = 0; m < e; m++) offset += counts[m];
        int rank = dest[a];
        if (rank < counts[e]) {
            dest[a] = offset + rank;
            src[offset + rank] = (int)a;
        } else {
            dest[a] = -1;
        }
    }
}

void cuda_moe_dispatch(struct backend *be, struct tensor counts, struct tensor dest,
                       struct tensor src, struct tensor topk_idx, int N, int E, int k,
                       int capacity) {
    size_t n = (size_t)N * k;
    int *cnt = (int *)counts.data, *d = (int *)dest.data, *s = (int *)src.data;
    const int *idx = (const int *)topk_idx.data;
    if (n) {
        CUDA_TRAFFIC(sizeof(int) * n);
        moe_fill_kernel MOE_LAUNCH(be, n)(s, n, -1);
        CHECK_LAUNCH();
    }
    CUDA_TRAFFIC(sizeof(int) * (n * (size_t)E + n + 2 * (size_t)E));
    moe_rank_kernel<<<E, MOE_THREADS, 0, cuda_stream(be)>>>(cnt, d, idx, n, E, capacity);
    CHECK_LAUNCH();
    if (n) {
        CUDA_TRAFFIC(sizeof(int) * 4 * n);
        moe_place_kernel MOE_LAUNCH(be, n)(d, s, cnt, idx, n);
        CHECK_LAUNCH();
    }
}

// ---- permute and combine ------------------------------------------------------------

__global__ void moe_permute_kernel(struct dptr xp, struct dptr x, const int *src, size_t M, int C,
                                   int k) {
    MOE_GRID_STRIDE(i, M * C) {
        size_t r = i / C, c = i % C;
        st(xp, i, ld(x, (size_t)(src[r] / k) * C + c));
    }
}

void cuda_moe_permute(struct backend *be, struct tensor xp, struct tensor x, struct tensor src,
                      int M, int C, int k) {
    struct dptr px = dptr_of("moe_permute", "x", x), pxp = dptr_of("moe_permute", "xp", xp);
    if (M <= 0) return;
    CUDA_TRAFFIC(2 * tbytes(x, (size_t)M * C) + sizeof(int) * (size_t)M);
    moe_permute_kernel MOE_LAUNCH(be, (size_t)M * C)(pxp, px, (const int *)src.data, M, C, k);
    CHECK_LAUNCH();
}

__global__ void moe_permute_backward_kernel(struct dptr dx, struct dptr dxp, const int *dest,
                                            size_t N, int C, int k) {
    MOE_GRID_STRIDE(i, N * C) {
        size_t t = i / C, c = i % C;
        float s = 0;
        for (int j = 0; j < k; j++) {
            int r = dest[t * k + j];
            if (r >= 0) s += ld(dxp, (size_t)r * C + c);
        }
        st(dx, i, ld(dx, i) + s);
    }
}

void cuda_moe_permute_backward(struct backend *be, struct tensor dx, struct tensor dxp,
                               struct tensor dest, int N, int C, int k) {
    const char *op = "moe_permute_backward";
    struct dptr pdx = dptr_of(op, "dx", dx), pdxp = dptr_of(op, "dxp", dxp);
    if (N <= 0) return;
    CUDA_TRAFFIC((2 + (size_t)k) * tbytes(dx, (size_t)N * C) + sizeof(int) * (size_t)N * k);
    moe_permute_backward_kernel MOE_LAUNCH(be, (size_t)N * C)(pdx, pdxp, (const int *)dest.data, N,
                                                              C, k);
    CHECK_LAUNCH();
}

__device__ __forceinline__ float moe_gate(float w, bool sigmoid) {
    return sigmoid ? 1.0f / (1.0f + expf(-w)) : w;
}

__global__ void moe_combine_kernel(struct dptr y, struct dptr yp, const float *w, const int *dest,
                                   size_t N, int C, int k, bool sigmoid, bool accumulate) {
    MOE_GRID_STRIDE(i, N * C) {
        size_t t = i / C, c = i % C;
        float s = 0;
        for (int j = 0; j < k; j++) {
            size_t a = t * k + j;
            int r = dest ? dest[a] : (int)a;
            if (r >= 0) s += moe_gate(w[a], sigmoid) * ld(yp, (size_t)r * C + c);
        }
        st(y, i, accumulate ? ld(y, i) + s : s);
    }
}

void cuda_moe_combine(struct backend *be, struct tensor y, struct tensor yp, struct tensor w,
                      struct tensor dest, int N, int C, int k, bool sigmoid, bool accumulate) {
    const char *op = "moe_combine";
    struct dptr py = dptr_of(op, "y", y), pyp = dptr_of(op, "yp", yp);
    CUDA_CHECK_SAME(op, "w", w, DTYPE_FP32);
    if (N <= 0) return;
    CUDA_TRAFFIC(((size_t)k + 1 + accumulate) * tbytes(y, (size_t)N * C) +
                 (sizeof(float) + sizeof(int)) * (size_t)N * k);
    moe_combine_kernel MOE_LAUNCH(be, (size_t)N * C)(py, pyp, (const float *)w.data,
                                                     dest.numel ? (const int *)dest.data : NULL, N,
                                                     C, k, sigmoid, accumulate);
    CHECK_LAUNCH();
}

// dyp row r(a) = g(w[a]) dy row a / k, one thread per element of the kept rows.
__global__ void moe_combine_dyp_kernel(struct dptr dyp, struct dptr dy, const float *w,
                                       const int *dest, size_t n, int C, int k, bool sigmoid) {
    MOE_GRID_STRIDE(i, n * C) {
        size_t a = i / C, c = i % C;
        int r = dest ? dest[a] : (int)a;
        if (r >= 0) st(dyp, (size_t)r * C + c, moe_gate(w[a], sigmoid) * ld(dy, (a / k) * C + c));
    }
}

// dw[a] = g'(w[a]) <dy row a / k, yp row r(a)>: one warp per assignment, lane
// sums strided over C then a fixed shuffle tree.
__global__ void moe_combine_dw_kernel(float *dw, struct dptr dy, struct dptr yp, const float *w,
                                      const int *dest, size_t n, int C, int k, bool sigmoid) {
    int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (size_t a = (size_t)blockIdx.x * warps + threadIdx.x / 32; a < n;
         a += (size_t)gridDim.x * warps) {
        int r = dest ? dest[a] : (int)a;
        float s = 0;
        if (r >= 0)
            for (int c = lane; c < C; c += 32)
                s += ld(dy, (a / k) * C + c) * ld(yp, (size_t)r * C + c);
        s = warp_sum(s);
        if (lane == 0) {
            float g = moe_gate(w[a], sigmoid);
            dw[a] = r < 0 ? 0.0f : sigmoid ? s * g * (1.0f - g) : s;
        }
    }
}

void cuda_moe_combine_backward(struct backend *be, struct tensor dyp, struct tensor dw,
                               struct tensor dy, struct tensor yp, struct tensor w,
                               struct tensor dest, int N, int C, int k, bool sigmoid) {
    const char *op = "moe_combine_backward";
    struct dptr pdyp = dptr_of(op, "dyp", dyp), pdy = dptr_of(op, "dy", dy),
                pyp = dptr_of(op, "yp", yp);
    CUDA_CHECK_SAME(op, "w", w, DTYPE_FP32);
    CUDA_CHECK_SAME(op, "dw", dw, DTYPE_FP32);
    size_t n = (size_t)N * k;
    if (!n) return;
    const int *d = dest.numel ? (const int *)dest.data : NULL;
    CUDA_TRAFFIC(2 * tbytes(dy, n * C) + (sizeof(float) + sizeof(int)) * n);
    moe_combine_dyp_kernel MOE_LAUNCH(be, n * C)(pdyp, pdy, (const float *)w.data, d, n, C, k,
                                                 sigmoid);
    CHECK_LAUNCH();
    CUDA_TRAFFIC(2 * tbytes(dy, n * C) + (2 * sizeof(float) + sizeof(int)) * n);
    moe_combine_dw_kernel<<<grid_for(n, MOE_THREADS / 32), MOE_THREADS, 0, cuda_stream(be)>>>(
        (float *)dw.data, pdy, pyp, (const float *)w.data, d, n, C, k, sigmoid);
    CHECK_LAUNCH();
}

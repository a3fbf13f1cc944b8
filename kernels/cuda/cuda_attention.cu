// cuda_attention.cu: causal grouped-query attention of the CUDA backend, plain
// kernels (no tensor cores, no shared-memory tiling): correct first, fast
// later. Each entry point first offers the call to cuDNN's fused attention
// (cuda_attention_cudnn.cu, [system] attention); these kernels run when it
// declines (FP32, attention = native, a shape cuDNN cannot plan).
//
// Layouts (kernels/ops.h): q, out, dq, dout (B, T, H, D); k, v, dk, dv
// (B, T, Hkv, D); lse (B, H, T) FP32; query head h reads kv head h / (H / Hkv).
// One warp per output row. Scores go 32 at a time: lane l takes key (or
// query) j0 + l and computes its dot products over the whole head alone (no
// reduction per pair); the chunk's softmax statistics are warp reductions;
// then the row's accumulator, of which lane l holds elements d = l + 32 e
// (e < NPL, so D <= 32 * NPL <= 256), takes the 32 weighted rows one by one
// with the weight broadcast by a shuffle.
//
// Forward: online softmax over keys j <= i (Milakov & Gimelshein 2018),
// saving lse_i = m + log(l).
// Backward (FlashAttention, Dao et al. 2022, alg. 2/4, P recomputed from lse):
//   P_ij = exp(scale q_i.k_j - lse_i), dP_ij = dO_i.v_j, D_i = dO_i.O_i,
//   dS_ij = P_ij (dP_ij - D_i), dq_i = scale sum_j dS_ij k_j,
//   dk_j = scale sum_{h in group, i >= j} dS_ij q_i, dv_j = sum P_ij dO_i.
// The dq kernel (warp per query row) also writes D (B, H, T) to scratch; the
// dk/dv kernel (warp per key row) then reads it. No atomics: each output row
// has one owner, so results are deterministic.
#include "cuda_internal.cuh"

#define ATTN_WARPS 4 // warps (rows) per block

// Dot product of two head vectors (D,) read whole by one lane.
__device__ __forceinline__ float dot_row(struct dptr a, size_t ao, struct dptr b, size_t bo, int D) {
    float s = 0;
    for (int d = 0; d < D; d++) s += ld(a, ao + d) * ld(b, bo + d);
    return s;
}

template <int NPL>
__global__ void attention_forward_kernel(struct dptr out, float *lse, struct dptr q, struct dptr k,
                                         struct dptr v, int T, int H, int Hkv, int D, float scale,
                                         size_t rows) {
    size_t row = (size_t)blockIdx.x * ATTN_WARPS + threadIdx.x / 32; // (b, h, i)
    if (row >= rows) return; // the whole warp leaves together
    int lane = threadIdx.x % 32;
    int i = (int)(row % T), h = (int)((row / T) % H), b = (int)(row / ((size_t)T * H));
    int hk = h / (H / Hkv);
    size_t qo = ((size_t)b * T + i) * H * D + (size_t)h * D;
    size_t kbase = (size_t)b * T * Hkv * D + (size_t)hk * D, ks = (size_t)Hkv * D;
    float o[NPL];
#pragma unroll
    for (int e = 0; e < NPL; e++) o[e] = 0;
    float m = -INFINITY, l = 0;
    for (int j0 = 0; j0 <= i; j0 += 32) {
        int j = j0 + lane, nj = min(32, i - j0 + 1);
        float s = j <= i ? dot_row(q, qo, k, kbase + (size_t)j * ks, D) * scale : -INFINITY;
        float mn = fmaxf(m, warp_max(s)); // finite: key j0 <= i is in every chunk
        float p = j <= i ? expf(s - mn) : 0.0f, corr = expf(m - mn);
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int e = 0; e < NPL; e++) o[e] *= corr;
        for (int t = 0; t < nj; t++) {
            float pt = __shfl_sync(0xffffffffu, p, t);
            size_t vo = kbase + (size_t)(j0 + t) * ks;
#pragma unroll
            for (int e = 0; e < NPL; e++) {
                int d = lane + 32 * e;
                if (d < D) o[e] += pt * ld(v, vo + d);
            }
        }
        m = mn;
    }
    float inv = 1.0f / l;
#pragma unroll
    for (int e = 0; e < NPL; e++) {
        int d = lane + 32 * e;
        if (d < D) st(out, qo + d, o[e] * inv);
    }
    if (lane == 0) lse[row] = m + logf(l);
}

template <int NPL>
__global__ void attention_backward_dq_kernel(struct dptr dq, float *Dvec, struct dptr dout,
                                             struct dptr q, struct dptr k, struct dptr v,
                                             struct dptr out, const float *lse, int T, int H,
                                             int Hkv, int D, float scale, size_t rows) {
    size_t row = (size_t)blockIdx.x * ATTN_WARPS + threadIdx.x / 32; // (b, h, i)
    if (row >= rows) return;
    int lane = threadIdx.x % 32;
    int i = (int)(row % T), h = (int)((row / T) % H), b = (int)(row / ((size_t)T * H));
    int hk = h / (H / Hkv);
    size_t qo = ((size_t)b * T + i) * H * D + (size_t)h * D;
    size_t kbase = (size_t)b * T * Hkv * D + (size_t)hk * D, ks = (size_t)Hkv * D;
    float acc[NPL], di = 0;
#pragma unroll
    for (int e = 0; e < NPL; e++) {
        int d = lane + 32 * e;
        di += d < D ? ld(dout, qo + d) * ld(out, qo + d) : 0.0f;
        acc[e] = 0;
    }
    di = warp_sum(di);
    if (lane == 0) Dvec[row] = di;
    float li = lse[row];
    for (int j0 = 0; j0 <= i; j0 += 32) {
        int j = j0 + lane, nj = min(32, i - j0 + 1);
        float ds = 0;
        if (j <= i) {
            size_t ko = kbase + (size_t)j * ks;
            float p = expf(dot_row(q, qo, k, ko, D) * scale - li);
            ds = p * (dot_row(dout, qo, v, ko, D) - di);
        }
        for (int t = 0; t < nj; t++) {
            float dst = __shfl_sync(0xffffffffu, ds, t);
            size_t ko = kbase + (size_t)(j0 + t) * ks;
#pragma unroll
            for (int e = 0; e < NPL; e++) {
                int d = lane + 32 * e;
                if (d < D) acc[e] += dst * ld(k, ko + d);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < NPL; e++) {
        int d = lane + 32 * e;
        if (d < D) st(dq, qo + d, scale * acc[e]);
    }
}

template <int NPL>
__global__ void attention_backward_dkv_kernel(struct dptr dk, struct dptr dv, const float *Dvec,
                                              struct dptr dout, struct dptr q, struct dptr k,
                                              struct dptr v, const float *lse, int T, int H,
                                              int Hkv, int D, float scale, size_t rows) {
    size_t row = (size_t)blockIdx.x * ATTN_WARPS + threadIdx.x / 32; // (b, hk, j)
    if (row >= rows) return;
    int lane = threadIdx.x % 32;
    int j = (int)(row % T), hk = (int)((row / T) % Hkv), b = (int)(row / ((size_t)T * Hkv));
    int G = H / Hkv;
    size_t ko = ((size_t)b * T + j) * Hkv * D + (size_t)hk * D;
    size_t qs = (size_t)H * D;
    float dka[NPL], dva[NPL];
#pragma unroll
    for (int e = 0; e < NPL; e++) dka[e] = dva[e] = 0;
    for (int h = hk * G; h < (hk + 1) * G; h++) {
        const float *lh = lse + ((size_t)b * H + h) * T, *Dh = Dvec + ((size_t)b * H + h) * T;
        size_t qbase = (size_t)b * T * H * D + (size_t)h * D;
        for (int i0 = j; i0 < T; i0 += 32) {
            int i = i0 + lane, ni = min(32, T - i0);
            float p = 0, ds = 0;
            if (i < T) {
                size_t qo = qbase + (size_t)i * qs;
                p = expf(dot_row(q, qo, k, ko, D) * scale - lh[i]);
                ds = p * (dot_row(dout, qo, v, ko, D) - Dh[i]);
            }
            for (int t = 0; t < ni; t++) {
                float pt = __shfl_sync(0xffffffffu, p, t), dst = __shfl_sync(0xffffffffu, ds, t);
                size_t qo = qbase + (size_t)(i0 + t) * qs;
#pragma unroll
                for (int e = 0; e < NPL; e++) {
                    int d = lane + 32 * e;
                    if (d < D) {
                        dva[e] += pt * ld(dout, qo + d);
                        dka[e] += dst * ld(q, qo + d);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int e = 0; e < NPL; e++) {
        int d = lane + 32 * e;
        if (d < D) {
            st(dk, ko + d, scale * dka[e]);
            st(dv, ko + d, dva[e]);
        }
    }
}

// Elements per lane for head size D; aborts above 256.
static int lanes_for(const char *op, int D) {
    CHECK(D >= 1 && D <= 256, "%s: head size D=%d; the cuda attention kernels take D <= 256", op, D);
    return D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : 8;
}

#define DISPATCH_NPL(npl, KERNEL, grid, stream, ...)                           \
    do {                                                                       \
        dim3 block_(32 * ATTN_WARPS);                                          \
        switch (npl) {                                                         \
        case 1: KERNEL<1><<<grid, block_, 0, stream>>>(__VA_ARGS__); break;    \
        case 2: KERNEL<2><<<grid, block_, 0, stream>>>(__VA_ARGS__); break;    \
        case 4: KERNEL<4><<<grid, block_, 0, stream>>>(__VA_ARGS__); break;    \
        default: KERNEL<8><<<grid, block_, 0, stream>>>(__VA_ARGS__); break;   \
        }                                                                      \
        CHECK_LAUNCH();                                                        \
    } while (0)

void cuda_attention_forward(struct backend *be, struct tensor out, struct tensor lse,
                            struct tensor q, struct tensor k, struct tensor v, int B, int T, int H,
                            int Hkv, int D) {
    if (cuda_attention_cudnn_forward(be, out, lse, q, k, v, B, T, H, Hkv, D)) return;
    const char *op = "attention_forward";
    struct dptr po = dptr_of(op, "out", out), pq = dptr_of(op, "q", q);
    struct dptr pk = dptr_of(op, "k", k), pv = dptr_of(op, "v", v);
    CUDA_CHECK_SAME(op, "lse", lse, DTYPE_FP32);
    int npl = lanes_for(op, D);
    size_t rows = (size_t)B * H * T;
    if (rows == 0) return;
    float scale = (float)(1.0 / sqrt((double)D));
    unsigned grid = (unsigned)((rows + ATTN_WARPS - 1) / ATTN_WARPS);
    DISPATCH_NPL(npl, attention_forward_kernel, grid, cuda_stream(be), po, (float *)lse.data, pq,
                 pk, pv, T, H, Hkv, D, scale, rows);
}

void cuda_attention_backward(struct backend *be, struct tensor dq, struct tensor dk,
                             struct tensor dv, struct tensor dout, struct tensor q,
                             struct tensor k, struct tensor v, struct tensor out,
                             struct tensor lse, int B, int T, int H, int Hkv, int D) {
    if (cuda_attention_cudnn_backward(be, dq, dk, dv, dout, q, k, v, out, lse, B, T, H, Hkv, D)) return;
    const char *op = "attention_backward";
    struct dptr pdq = dptr_of(op, "dq", dq), pdk = dptr_of(op, "dk", dk), pdv = dptr_of(op, "dv", dv);
    struct dptr pg = dptr_of(op, "dout", dout), po = dptr_of(op, "out", out);
    struct dptr pq = dptr_of(op, "q", q), pk = dptr_of(op, "k", k), pv = dptr_of(op, "v", v);
    CUDA_CHECK_SAME(op, "lse", lse, DTYPE_FP32);
    int npl = lanes_for(op, D);
    size_t rows_q = (size_t)B * H * T, rows_k = (size_t)B * Hkv * T;
    if (rows_q == 0) return;
    float scale = (float)(1.0 / sqrt((double)D));
    float *Dvec = (float *)cuda_scratch(be, sizeof(float) * rows_q);
    const float *pl = (const float *)lse.data;
    unsigned grid_q = (unsigned)((rows_q + ATTN_WARPS - 1) / ATTN_WARPS);
    unsigned grid_k = (unsigned)((rows_k + ATTN_WARPS - 1) / ATTN_WARPS);
    DISPATCH_NPL(npl, attention_backward_dq_kernel, grid_q, cuda_stream(be), pdq, Dvec, pg, pq, pk,
                 pv, po, pl, T, H, Hkv, D, scale, rows_q);
    DISPATCH_NPL(npl, attention_backward_dkv_kernel, grid_k, cuda_stream(be), pdk, pdv, Dvec, pg,
                 pq, pk, pv, pl, T, H, Hkv, D, scale, rows_k);
}

// cuda_attention.cu: causal grouped-query attention of the CUDA backend, plain
// kernels (no tensor cores): correct first, fast later (cuDNN's fused SDPA or
// a FlashAttention-style tiled kernel would replace these behind the same
// entry points).
//
// Layouts (kernels/ops.h): q, out, dq, dout (B, T, H, D); k, v, dk, dv
// (B, T, Hkv, D); lse (B, H, T) FP32; query head h reads kv head h / (H / Hkv).
// One warp per row: lane l holds elements d = l + 32 e (e < NPL) of a head
// vector, so D <= 32 * NPL (NPL in 1, 2, 4, 8: D <= 256); dot products are
// warp reductions.
//
// Forward: per query row i, online softmax over keys j <= i (Milakov &
// Gimelshein 2018), saving lse_i = m + log(l).
// Backward (FlashAttention, Dao et al. 2022, alg. 2/4, P recomputed from lse):
//   P_ij = exp(scale q_i.k_j - lse_i), dP_ij = dO_i.v_j, D_i = dO_i.O_i,
//   dS_ij = P_ij (dP_ij - D_i), dq_i = scale sum_j dS_ij k_j,
//   dk_j = scale sum_{h in group, i >= j} dS_ij q_i, dv_j = sum P_ij dO_i.
// The dq kernel (warp per query row) also writes D (B, H, T) to scratch; the
// dk/dv kernel (warp per key row) then reads it. No atomics: each output row
// has one owner, so results are deterministic.
#include "cuda_internal.cuh"

#define ATTN_WARPS 4 // warps (rows) per block

template <int NPL>
__global__ void attention_forward_kernel(struct dptr out, float *lse, struct dptr q, struct dptr k,
                                         struct dptr v, int T, int H, int Hkv, int D, float scale,
                                         size_t rows) {
    size_t row = (size_t)blockIdx.x * ATTN_WARPS + threadIdx.x / 32; // (b, h, i)
    if (row >= rows) return; // the whole warp leaves together
    int lane = threadIdx.x % 32;
    int i = (int)(row % T), h = (int)((row / T) % H), b = (int)(row / ((size_t)T * H));
    int hk = h / (H / Hkv);
    size_t qo = ((size_t)(b * (size_t)T + i) * H + h) * D;
    float qr[NPL], o[NPL];
#pragma unroll
    for (int e = 0; e < NPL; e++) {
        int d = lane + 32 * e;
        qr[e] = d < D ? ld(q, qo + d) : 0.0f;
        o[e] = 0;
    }
    float m = -INFINITY, l = 0;
    for (int j = 0; j <= i; j++) {
        size_t ko = ((size_t)(b * (size_t)T + j) * Hkv + hk) * D;
        float s = 0;
#pragma unroll
        for (int e = 0; e < NPL; e++) {
            int d = lane + 32 * e;
            if (d < D) s += qr[e] * ld(k, ko + d);
        }
        s = warp_sum(s) * scale;
        float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
#pragma unroll
        for (int e = 0; e < NPL; e++) {
            int d = lane + 32 * e;
            if (d < D) o[e] = o[e] * corr + p * ld(v, ko + d);
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
    size_t qo = ((size_t)(b * (size_t)T + i) * H + h) * D;
    float qr[NPL], gr[NPL], acc[NPL], di = 0;
#pragma unroll
    for (int e = 0; e < NPL; e++) {
        int d = lane + 32 * e;
        qr[e] = d < D ? ld(q, qo + d) : 0.0f;
        gr[e] = d < D ? ld(dout, qo + d) : 0.0f;
        di += d < D ? gr[e] * ld(out, qo + d) : 0.0f;
        acc[e] = 0;
    }
    di = warp_sum(di);
    if (lane == 0) Dvec[row] = di;
    float li = lse[row];
    for (int j = 0; j <= i; j++) {
        size_t ko = ((size_t)(b * (size_t)T + j) * Hkv + hk) * D;
        float s = 0, dp = 0;
#pragma unroll
        for (int e = 0; e < NPL; e++) {
            int d = lane + 32 * e;
            if (d < D) {
                s += qr[e] * ld(k, ko + d);
                dp += gr[e] * ld(v, ko + d);
            }
        }
        s = warp_sum(s);
        dp = warp_sum(dp);
        float p = expf(s * scale - li), ds = p * (dp - di);
#pragma unroll
        for (int e = 0; e < NPL; e++) {
            int d = lane + 32 * e;
            if (d < D) acc[e] += ds * ld(k, ko + d);
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
    size_t ko = ((size_t)(b * (size_t)T + j) * Hkv + hk) * D;
    float kr[NPL], vr[NPL], dka[NPL], dva[NPL];
#pragma unroll
    for (int e = 0; e < NPL; e++) {
        int d = lane + 32 * e;
        kr[e] = d < D ? ld(k, ko + d) : 0.0f;
        vr[e] = d < D ? ld(v, ko + d) : 0.0f;
        dka[e] = dva[e] = 0;
    }
    for (int h = hk * G; h < (hk + 1) * G; h++) {
        const float *lh = lse + ((size_t)b * H + h) * T, *Dh = Dvec + ((size_t)b * H + h) * T;
        for (int i = j; i < T; i++) {
            size_t qo = ((size_t)(b * (size_t)T + i) * H + h) * D;
            float s = 0, dp = 0;
#pragma unroll
            for (int e = 0; e < NPL; e++) {
                int d = lane + 32 * e;
                if (d < D) {
                    s += kr[e] * ld(q, qo + d);
                    dp += vr[e] * ld(dout, qo + d);
                }
            }
            s = warp_sum(s);
            dp = warp_sum(dp);
            float p = expf(s * scale - lh[i]), ds = p * (dp - Dh[i]);
#pragma unroll
            for (int e = 0; e < NPL; e++) {
                int d = lane + 32 * e;
                if (d < D) {
                    dva[e] += p * ld(dout, qo + d);
                    dka[e] += ds * ld(q, qo + d);
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

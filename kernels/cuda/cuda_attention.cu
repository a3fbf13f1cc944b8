// cuda_attention.cu: causal grouped-query attention of the CUDA backend as
// tiled kernels in the manner of FlashAttention-2 (Dao 2023, "FlashAttention-2:
// Faster Attention with Better Parallelism and Work Partitioning", algorithm 1
// forward, algorithm 2 backward), FP32 math on CUDA cores for FP32, BF16 and
// FP16 storage (the fallback where cuDNN's fused SDPA is absent or refuses).
//
// Layouts (kernels/ops.h): q, out, dq, dout (B, T, H, D); k, v, dk, dv
// (B, T, Hkv, D); lse (B, H, T) FP32, lse_i = log sum_{j<=i} exp(scale q_i.k_j)
// with scale = 1/sqrt(D), as kernels/cpu/cpu_attention.c; query head h reads
// kv head h / (H / Hkv).
//
// Tiling. A block is 128 threads seen as a 16 x 8 grid: thread (tr, tc), tr =
// tid / 8, tc = tid % 8. Tiles live in dynamic shared memory as FP32 rows of
// DP + 4 floats (DP: the head size rounded up to 32, 64, 128 or 256, columns
// >= D zero; the 4 floats of padding put rows 4 banks apart). A score tile
// (rows x 32 columns) is computed as register micro-tiles: thread (tr, tc)
// owns rows tr + 16 r (r < RM) and columns tc + 8 n (n < 4), reading one
// float of each operand row per head element (RM + 4 loads, 4 RM FMAs). An
// output accumulator (rows x DP) stays in registers: thread (tr, tc) holds
// rows tr + 16 r, head elements tc + 8 e (e < DP / 8).
//
// Forward (alg. 1), grid (ceil(T / BR), H, B), BR = 16 RM query rows: the
// block's Q tile is staged once; K and V tiles of 32 keys stream through
// shared memory, only those with a key <= the block's last query (causal:
// fully masked tiles are never loaded); S = scale Q K^T in registers, masked
// on the diagonal tile; the running row max m (FP32) from the 8 threads of a
// row through shared memory; P = exp(S - m) to shared memory; O = O corr + P V
// with corr = exp(m_old - m_new); l (row sum) kept per thread, summed at the
// end; out = O / l, lse = m + log l. No T x T matrix exists anywhere.
//
// Backward (alg. 2, P recomputed from lse, no atomics, deterministic):
//   P_ij = exp(scale q_i.k_j - lse_i), dP_ij = dO_i.v_j, D_i = dO_i.O_i,
//   dS_ij = P_ij (dP_ij - D_i), dq_i = scale sum_j dS_ij k_j,
//   dk_j = scale sum_{h in group, i >= j} dS_ij q_i, dv_j = sum P_ij dO_i.
// Two kernels instead of FA2's one with atomicAdd on dq: each output row has
// one owner, so results are bitwise reproducible and BF16/FP16 dq needs no
// FP32 side buffer, at the price of recomputing S and dP once more (7 instead
// of 5 tile GEMMs). The dq kernel, parallel over query blocks (as the
// forward), also computes D_i = dO_i.O_i for its rows into scratch (B, H, T);
// the dk/dv kernel, parallel over key blocks of BK = 16 RK keys of one kv
// head, runs after it on the same stream and streams the Q, dO tiles (32
// queries, i >= the block's first key) of every query head of its group.
//
// Shared memory per block (FP32, LD = DP + 4 floats a row), bytes:
//   forward  (BR = 64, 64, 64, 32):  (BR + 64) LD + BR 33 + BR 8   floats
//   dq       (BR = 64, 64, 64, 32):  (2 BR + 64) LD + BR 33 + BR 8 floats
//   dk/dv    (BK = 64, 64, 32, 16):  (2 BK + 64) LD + 2 BK 33 + 64 floats
// i.e. at DP = 32, 64, 128, 256: forward 28, 44, 78, 105 KiB; dq 46, 78, 110,
// 137 KiB; dk/dv 46, 78, 78, 104 KiB (above 48 KiB through
// cudaFuncAttributeMaxDynamicSharedMemorySize; sm_80 allows 163 KiB, sm_90
// 227 KiB).
#include "cuda_internal.cuh"

#define ATTN_THREADS 128 // threads per block: a 16 x 8 grid
#define ATTN_TR 16       // thread rows
#define ATTN_TC 8        // thread columns
#define ATTN_BC 32       // keys per K/V tile (forward, dq), queries per Q tile (dk/dv)
#define ATTN_RN (ATTN_BC / ATTN_TC) // score columns per thread

// Query rows per thread in the forward and dq kernels (BR = 16 RM), key rows
// per thread in the dk/dv kernel (BK = 16 RK): accumulators of RM x DP / 8
// (forward, dq) and 2 RK x DP / 8 (dk, dv) floats, 64 registers at most.
__host__ __device__ constexpr int attn_rm(int DP) { return DP <= 128 ? 4 : 2; }
__host__ __device__ constexpr int attn_rk(int DP) { return DP <= 64 ? 4 : DP <= 128 ? 2 : 1; }
__host__ __device__ constexpr int attn_ld(int DP) { return DP + 4; }

// Dynamic shared memory of each kernel in bytes (layouts in the kernels).
static constexpr size_t attn_fwd_smem(int DP) {
    return sizeof(float) * ((size_t)(ATTN_TR * attn_rm(DP) + 2 * ATTN_BC) * attn_ld(DP) +
                            (size_t)ATTN_TR * attn_rm(DP) * (ATTN_BC + 1 + ATTN_TC));
}
static constexpr size_t attn_dq_smem(int DP) {
    return sizeof(float) * ((size_t)(2 * ATTN_TR * attn_rm(DP) + 2 * ATTN_BC) * attn_ld(DP) +
                            (size_t)ATTN_TR * attn_rm(DP) * (ATTN_BC + 1 + ATTN_TC));
}
static constexpr size_t attn_dkv_smem(int DP) {
    return sizeof(float) * ((size_t)(2 * ATTN_TR * attn_rk(DP) + 2 * ATTN_BC) * attn_ld(DP) +
                            (size_t)2 * ATTN_TR * attn_rk(DP) * (ATTN_BC + 1) + 2 * ATTN_BC);
}

// Shared rows dst[r][0, DP) (row stride DP + 4) := rows r0 + r (r < n) of a
// (B, T, heads, D) tensor, head elements [0, D) from src + base + row stride,
// zero for rows >= T and elements >= D. Consecutive threads read consecutive
// elements of a row (coalesced).
template <int DP>
__device__ __forceinline__ void attn_load_rows(float *dst, struct dptr src, size_t base,
                                               size_t stride, int r0, int n, int T, int D) {
    for (int idx = threadIdx.x; idx < n * DP; idx += ATTN_THREADS) {
        int r = idx / DP, c = idx % DP, row = r0 + r;
        dst[r * attn_ld(DP) + c] = row < T && c < D ? ld(src, base + (size_t)row * stride + c) : 0.0f;
    }
}

// s[r][n] = A[tr + 16 r] . B[tc + 8 n] over head elements [0, D) of shared
// rows (stride DP + 4): one register micro-tile of a score tile.
template <int DP, int RM>
__device__ __forceinline__ void attn_tile_dot(float (&s)[RM][ATTN_RN], const float *A,
                                              const float *B, int tr, int tc, int D) {
    constexpr int LD = attn_ld(DP);
#pragma unroll
    for (int r = 0; r < RM; r++)
#pragma unroll
        for (int n = 0; n < ATTN_RN; n++) s[r][n] = 0;
    const float *a0 = A + tr * LD, *b0 = B + tc * LD;
    for (int d = 0; d < D; d++) {
        float a[RM], b[ATTN_RN];
#pragma unroll
        for (int r = 0; r < RM; r++) a[r] = a0[r * ATTN_TR * LD + d];
#pragma unroll
        for (int n = 0; n < ATTN_RN; n++) b[n] = b0[n * ATTN_TC * LD + d];
#pragma unroll
        for (int r = 0; r < RM; r++)
#pragma unroll
            for (int n = 0; n < ATTN_RN; n++) s[r][n] += a[r] * b[n];
    }
}

// Forward, algorithm 1: block (x, h, b) owns query rows [q0, q0 + BR) of head
// h, the last blocks first (they have the most key tiles). Shared: Qs (BR,
// LD), Ks, Vs (32, LD), Ps (BR, 33), red (BR, 8).
template <int DP>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_forward_kernel(struct dptr out, float *lse, struct dptr q, struct dptr k, struct dptr v,
                         int T, int H, int Hkv, int D, float scale) {
    constexpr int LD = attn_ld(DP), RM = attn_rm(DP), BR = ATTN_TR * RM, BC = ATTN_BC;
    constexpr int RN = ATTN_RN, DN = DP / ATTN_TC, PL = BC + 1;
    extern __shared__ float attn_smem[];
    float *Qs = attn_smem, *Ks = Qs + BR * LD, *Vs = Ks + BC * LD, *Ps = Vs + BC * LD;
    float *red = Ps + BR * PL;
    int tr = threadIdx.x / ATTN_TC, tc = threadIdx.x % ATTN_TC;
    int q0 = (int)(gridDim.x - 1 - blockIdx.x) * BR, h = blockIdx.y, b = blockIdx.z;
    int hk = h / (H / Hkv);
    size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
    size_t qbase = (size_t)b * T * qs + (size_t)h * D, kbase = (size_t)b * T * ks + (size_t)hk * D;
    attn_load_rows<DP>(Qs, q, qbase, qs, q0, BR, T, D);
    float o[RM][DN], m[RM], l[RM];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        m[r] = -INFINITY, l[r] = 0;
#pragma unroll
        for (int e = 0; e < DN; e++) o[r][e] = 0;
    }
    int kend = min(T, q0 + BR); // keys [0, kend): tiles past the block's last row are skipped
    for (int k0 = 0; k0 < kend; k0 += BC) {
        __syncthreads(); // the previous tile's Ks, Vs, Ps are consumed
        attn_load_rows<DP>(Ks, k, kbase, ks, k0, BC, T, D);
        attn_load_rows<DP>(Vs, v, kbase, ks, k0, BC, T, D);
        __syncthreads();
        float s[RM][RN];
        attn_tile_dot<DP, RM>(s, Qs, Ks, tr, tc, D);
        bool diag = k0 + BC - 1 > q0; // some key of the tile is after some row
#pragma unroll
        for (int r = 0; r < RM; r++) {
            int i = q0 + tr + ATTN_TR * r;
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < RN; n++) {
                s[r][n] = diag && k0 + tc + ATTN_TC * n > i ? -INFINITY : s[r][n] * scale;
                mx = fmaxf(mx, s[r][n]);
            }
            red[(tr + ATTN_TR * r) * ATTN_TC + tc] = mx;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RM; r++) {
            int row = tr + ATTN_TR * r;
            float mt = m[r];
#pragma unroll
            for (int c = 0; c < ATTN_TC; c++) mt = fmaxf(mt, red[row * ATTN_TC + c]);
            // mt is finite: key 0 is in the first tile of every row
            float corr = expf(m[r] - mt), ls = 0;
#pragma unroll
            for (int n = 0; n < RN; n++) {
                float p = expf(s[r][n] - mt); // masked: exp(-inf) = 0
                Ps[row * PL + tc + ATTN_TC * n] = p;
                ls += p;
            }
            l[r] = l[r] * corr + ls;
            m[r] = mt;
#pragma unroll
            for (int e = 0; e < DN; e++) o[r][e] *= corr;
        }
        __syncthreads();
        // O += P V: keys past T have P = 0 for every row < T
        for (int j = 0; j < BC; j++) {
            float vj[DN];
#pragma unroll
            for (int e = 0; e < DN; e++) vj[e] = Vs[j * LD + tc + ATTN_TC * e];
#pragma unroll
            for (int r = 0; r < RM; r++) {
                float p = Ps[(tr + ATTN_TR * r) * PL + j];
#pragma unroll
                for (int e = 0; e < DN; e++) o[r][e] += p * vj[e];
            }
        }
    }
    // l: the sum of the row's 8 partial sums (red is free: its last readers
    // passed the barrier before O += P V)
#pragma unroll
    for (int r = 0; r < RM; r++) red[(tr + ATTN_TR * r) * ATTN_TC + tc] = l[r];
    __syncthreads();
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int row = tr + ATTN_TR * r, i = q0 + row;
        float lt = 0;
#pragma unroll
        for (int c = 0; c < ATTN_TC; c++) lt += red[row * ATTN_TC + c];
        if (i >= T) continue;
        float inv = 1.0f / lt;
        size_t oo = qbase + (size_t)i * qs;
#pragma unroll
        for (int e = 0; e < DN; e++) {
            int d = tc + ATTN_TC * e;
            if (d < D) st(out, oo + d, o[r][e] * inv);
        }
        if (tc == 0) lse[((size_t)b * H + h) * T + i] = m[r] + logf(lt);
    }
}

// Backward dq (and D_i = dO_i.O_i into Dvec): block (x, h, b) owns query rows
// [q0, q0 + BR) of head h. Shared: Qs, dOs (BR, LD), Ks, Vs (32, LD), dSs
// (BR, 33), red (BR, 8).
template <int DP>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_backward_dq_kernel(struct dptr dq, float *Dvec, struct dptr dout, struct dptr q,
                             struct dptr k, struct dptr v, struct dptr out, const float *lse,
                             int T, int H, int Hkv, int D, float scale) {
    constexpr int LD = attn_ld(DP), RM = attn_rm(DP), BR = ATTN_TR * RM, BC = ATTN_BC;
    constexpr int RN = ATTN_RN, DN = DP / ATTN_TC, PL = BC + 1;
    extern __shared__ float attn_smem[];
    float *Qs = attn_smem, *dOs = Qs + BR * LD, *Ks = dOs + BR * LD, *Vs = Ks + BC * LD;
    float *dSs = Vs + BC * LD, *red = dSs + BR * PL;
    int tr = threadIdx.x / ATTN_TC, tc = threadIdx.x % ATTN_TC;
    int q0 = (int)(gridDim.x - 1 - blockIdx.x) * BR, h = blockIdx.y, b = blockIdx.z;
    int hk = h / (H / Hkv);
    size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
    size_t qbase = (size_t)b * T * qs + (size_t)h * D, kbase = (size_t)b * T * ks + (size_t)hk * D;
    size_t lbase = ((size_t)b * H + h) * T;
    attn_load_rows<DP>(Qs, q, qbase, qs, q0, BR, T, D);
    attn_load_rows<DP>(dOs, dout, qbase, qs, q0, BR, T, D);
    __syncthreads();
    // D_i: partial dot products over this thread's head elements, then the row's 8
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int row = tr + ATTN_TR * r, i = q0 + row;
        float part = 0;
        if (i < T) {
            size_t oo = qbase + (size_t)i * qs;
#pragma unroll
            for (int e = 0; e < DN; e++) {
                int d = tc + ATTN_TC * e;
                if (d < D) part += dOs[row * LD + d] * ld(out, oo + d);
            }
        }
        red[row * ATTN_TC + tc] = part;
    }
    __syncthreads();
    float Di[RM], li[RM], acc[RM][DN];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int row = tr + ATTN_TR * r, i = q0 + row;
        float di = 0;
#pragma unroll
        for (int c = 0; c < ATTN_TC; c++) di += red[row * ATTN_TC + c];
        Di[r] = di;
        li[r] = i < T ? lse[lbase + i] : 0.0f;
        if (tc == 0 && i < T) Dvec[lbase + i] = di;
#pragma unroll
        for (int e = 0; e < DN; e++) acc[r][e] = 0;
    }
    int kend = min(T, q0 + BR);
    for (int k0 = 0; k0 < kend; k0 += BC) {
        __syncthreads(); // the previous tile's Ks, Vs, dSs are consumed
        attn_load_rows<DP>(Ks, k, kbase, ks, k0, BC, T, D);
        attn_load_rows<DP>(Vs, v, kbase, ks, k0, BC, T, D);
        __syncthreads();
        float s[RM][RN], dp[RM][RN];
        attn_tile_dot<DP, RM>(s, Qs, Ks, tr, tc, D);
        attn_tile_dot<DP, RM>(dp, dOs, Vs, tr, tc, D);
#pragma unroll
        for (int r = 0; r < RM; r++) {
            int row = tr + ATTN_TR * r, i = q0 + row;
#pragma unroll
            for (int n = 0; n < RN; n++) {
                int j = k0 + tc + ATTN_TC * n;
                float p = j <= i ? expf(s[r][n] * scale - li[r]) : 0.0f;
                dSs[row * PL + tc + ATTN_TC * n] = p * (dp[r][n] - Di[r]);
            }
        }
        __syncthreads();
        // dQ += dS K
        for (int j = 0; j < BC; j++) {
            float kj[DN];
#pragma unroll
            for (int e = 0; e < DN; e++) kj[e] = Ks[j * LD + tc + ATTN_TC * e];
#pragma unroll
            for (int r = 0; r < RM; r++) {
                float ds = dSs[(tr + ATTN_TR * r) * PL + j];
#pragma unroll
                for (int e = 0; e < DN; e++) acc[r][e] += ds * kj[e];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int i = q0 + tr + ATTN_TR * r;
        if (i >= T) continue;
        size_t oo = qbase + (size_t)i * qs;
#pragma unroll
        for (int e = 0; e < DN; e++) {
            int d = tc + ATTN_TC * e;
            if (d < D) st(dq, oo + d, scale * acc[r][e]);
        }
    }
}

// Backward dk, dv: block (x, hk, b) owns keys [k0, k0 + BK) of kv head hk,
// the first blocks last (they see the most queries); for each query head of
// the group, the query tiles from the one holding k0 on. Shared: Ks, Vs (BK,
// LD), Qs, dOs (32, LD), Ps, dSs (BK, 33), ls, Ds (32).
template <int DP>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_backward_dkv_kernel(struct dptr dk, struct dptr dv, const float *Dvec,
                              struct dptr dout, struct dptr q, struct dptr k, struct dptr v,
                              const float *lse, int T, int H, int Hkv, int D, float scale) {
    constexpr int LD = attn_ld(DP), RK = attn_rk(DP), BK = ATTN_TR * RK, BQ = ATTN_BC;
    constexpr int RN = ATTN_RN, DN = DP / ATTN_TC, PL = BQ + 1;
    extern __shared__ float attn_smem[];
    float *Ks = attn_smem, *Vs = Ks + BK * LD, *Qs = Vs + BK * LD, *dOs = Qs + BQ * LD;
    float *Ps = dOs + BQ * LD, *dSs = Ps + BK * PL, *ls = dSs + BK * PL, *Ds = ls + BQ;
    int tr = threadIdx.x / ATTN_TC, tc = threadIdx.x % ATTN_TC;
    int k0 = (int)(gridDim.x - 1 - blockIdx.x) * BK, hk = blockIdx.y, b = blockIdx.z;
    int G = H / Hkv;
    size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
    size_t kbase = (size_t)b * T * ks + (size_t)hk * D;
    attn_load_rows<DP>(Ks, k, kbase, ks, k0, BK, T, D);
    attn_load_rows<DP>(Vs, v, kbase, ks, k0, BK, T, D);
    float dka[RK][DN], dva[RK][DN];
#pragma unroll
    for (int r = 0; r < RK; r++)
#pragma unroll
        for (int e = 0; e < DN; e++) dka[r][e] = dva[r][e] = 0;
    for (int h = hk * G; h < (hk + 1) * G; h++) {
        size_t qbase = (size_t)b * T * qs + (size_t)h * D, lbase = ((size_t)b * H + h) * T;
        for (int i0 = k0 / BQ * BQ; i0 < T; i0 += BQ) {
            __syncthreads(); // the previous tile's Qs, dOs, Ps, dSs, ls, Ds are consumed
            attn_load_rows<DP>(Qs, q, qbase, qs, i0, BQ, T, D);
            attn_load_rows<DP>(dOs, dout, qbase, qs, i0, BQ, T, D);
            if (threadIdx.x < BQ) {
                int i = i0 + threadIdx.x;
                ls[threadIdx.x] = i < T ? lse[lbase + i] : 0.0f;
                Ds[threadIdx.x] = i < T ? Dvec[lbase + i] : 0.0f;
            }
            __syncthreads();
            // transposed score tile: rows are keys, columns queries
            float s[RK][RN], dp[RK][RN];
            attn_tile_dot<DP, RK>(s, Ks, Qs, tr, tc, D);
            attn_tile_dot<DP, RK>(dp, Vs, dOs, tr, tc, D);
#pragma unroll
            for (int r = 0; r < RK; r++) {
                int row = tr + ATTN_TR * r, j = k0 + row;
#pragma unroll
                for (int n = 0; n < RN; n++) {
                    int c = tc + ATTN_TC * n, i = i0 + c;
                    float p = i >= j && i < T ? expf(s[r][n] * scale - ls[c]) : 0.0f;
                    Ps[row * PL + c] = p;
                    dSs[row * PL + c] = p * (dp[r][n] - Ds[c]);
                }
            }
            __syncthreads();
            // dV += P^T dO, dK += dS^T Q
            for (int c = 0; c < BQ; c++) {
                float qc[DN], gc[DN];
#pragma unroll
                for (int e = 0; e < DN; e++) {
                    qc[e] = Qs[c * LD + tc + ATTN_TC * e];
                    gc[e] = dOs[c * LD + tc + ATTN_TC * e];
                }
#pragma unroll
                for (int r = 0; r < RK; r++) {
                    int row = tr + ATTN_TR * r;
                    float p = Ps[row * PL + c], ds = dSs[row * PL + c];
#pragma unroll
                    for (int e = 0; e < DN; e++) {
                        dva[r][e] += p * gc[e];
                        dka[r][e] += ds * qc[e];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RK; r++) {
        int j = k0 + tr + ATTN_TR * r;
        if (j >= T) continue;
        size_t ko = kbase + (size_t)j * ks;
#pragma unroll
        for (int e = 0; e < DN; e++) {
            int d = tc + ATTN_TC * e;
            if (d < D) {
                st(dk, ko + d, scale * dka[r][e]);
                st(dv, ko + d, dva[r][e]);
            }
        }
    }
}

// The head-size bucket DP (32, 64, 128, 256) of D; aborts above 256.
static int attn_bucket(const char *op, int D) {
    CHECK(D >= 1 && D <= 256, "%s: head size D=%d; the cuda attention kernels take D <= 256", op, D);
    return D <= 32 ? 32 : D <= 64 ? 64 : D <= 128 ? 128 : 256;
}

// Launches KERNEL<DP> with grid and SMEM(DP) bytes of dynamic shared memory,
// first raising the kernel's limit past the default 48 KiB.
#define ATTN_LAUNCH_DP(DP, KERNEL, SMEM, grid, stream, ...)                                      \
    do {                                                                                         \
        size_t smem_ = SMEM(DP);                                                                 \
        if (smem_ > 48 * 1024)                                                                   \
            CHECK_CUDA(cudaFuncSetAttribute(KERNEL<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                            (int)smem_));                                        \
        KERNEL<DP><<<grid, ATTN_THREADS, smem_, stream>>>(__VA_ARGS__);                          \
    } while (0)
#define ATTN_LAUNCH(dp, KERNEL, SMEM, grid, stream, ...)                                         \
    do {                                                                                         \
        switch (dp) {                                                                            \
        case 32: ATTN_LAUNCH_DP(32, KERNEL, SMEM, grid, stream, __VA_ARGS__); break;              \
        case 64: ATTN_LAUNCH_DP(64, KERNEL, SMEM, grid, stream, __VA_ARGS__); break;              \
        case 128: ATTN_LAUNCH_DP(128, KERNEL, SMEM, grid, stream, __VA_ARGS__); break;            \
        default: ATTN_LAUNCH_DP(256, KERNEL, SMEM, grid, stream, __VA_ARGS__); break;             \
        }                                                                                        \
        CHECK_LAUNCH();                                                                          \
    } while (0)

// Rows (queries) per forward / dq block and keys per dk/dv block of bucket dp.
static int attn_br(int dp) { return ATTN_TR * attn_rm(dp); }
static int attn_bk(int dp) { return ATTN_TR * attn_rk(dp); }

void cuda_attention_forward(struct backend *be, struct tensor out, struct tensor lse,
                            struct tensor q, struct tensor k, struct tensor v, int B, int T, int H,
                            int Hkv, int D) {
    const char *op = "attention_forward";
    struct dptr po = dptr_of(op, "out", out), pq = dptr_of(op, "q", q);
    struct dptr pk = dptr_of(op, "k", k), pv = dptr_of(op, "v", v);
    CUDA_CHECK_SAME(op, "lse", lse, DTYPE_FP32);
    int dp = attn_bucket(op, D);
    if ((size_t)B * H * T == 0) return;
    CHECK(H <= 65535 && B <= 65535, "%s: H=%d, B=%d; the grid takes at most 65535", op, H, B);
    float scale = (float)(1.0 / sqrt((double)D));
    dim3 grid((unsigned)((T + attn_br(dp) - 1) / attn_br(dp)), (unsigned)H, (unsigned)B);
    ATTN_LAUNCH(dp, attention_forward_kernel, attn_fwd_smem, grid, cuda_stream(be), po,
                (float *)lse.data, pq, pk, pv, T, H, Hkv, D, scale);
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
    int dp = attn_bucket(op, D);
    if ((size_t)B * H * T == 0) return;
    CHECK(H <= 65535 && B <= 65535, "%s: H=%d, B=%d; the grid takes at most 65535", op, H, B);
    float scale = (float)(1.0 / sqrt((double)D));
    float *Dvec = (float *)cuda_scratch(be, sizeof(float) * (size_t)B * H * T);
    const float *pl = (const float *)lse.data;
    dim3 grid_q((unsigned)((T + attn_br(dp) - 1) / attn_br(dp)), (unsigned)H, (unsigned)B);
    dim3 grid_k((unsigned)((T + attn_bk(dp) - 1) / attn_bk(dp)), (unsigned)Hkv, (unsigned)B);
    ATTN_LAUNCH(dp, attention_backward_dq_kernel, attn_dq_smem, grid_q, cuda_stream(be), pdq, Dvec,
                pg, pq, pk, pv, po, pl, T, H, Hkv, D, scale);
    ATTN_LAUNCH(dp, attention_backward_dkv_kernel, attn_dkv_smem, grid_k, cuda_stream(be), pdk, pdv,
                Dvec, pg, pq, pk, pv, pl, T, H, Hkv, D, scale);
}

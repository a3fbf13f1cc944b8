// cuda_attention.cuh: the device helpers and launch machinery shared by the
// tiled attention kernels of cuda_attention.cu (whole-sequence causal
// attention) and cuda_attention_block.cu (one block of context-parallel ring
// attention): the 16 x 8 thread grid, the head-size buckets, the shared-memory
// tile layout, the register micro-tile products and the launch macro. The
// tiling is described in cuda_attention.cu's file comment.
#ifndef TRIDENT_CUDA_ATTENTION_CUH
#define TRIDENT_CUDA_ATTENTION_CUH

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
                            (size_t)ATTN_TR * attn_rm(DP) * (ATTN_BC + 4 + ATTN_TC));
}
static constexpr size_t attn_dq_smem(int DP) {
    return sizeof(float) * ((size_t)(2 * ATTN_TR * attn_rm(DP) + 2 * ATTN_BC) * attn_ld(DP) +
                            (size_t)ATTN_TR * attn_rm(DP) * (ATTN_BC + 4 + ATTN_TC));
}
static constexpr size_t attn_dkv_smem(int DP) {
    return sizeof(float) * ((size_t)(2 * ATTN_TR * attn_rk(DP) + 2 * ATTN_BC) * attn_ld(DP) +
                            (size_t)2 * ATTN_TR * attn_rk(DP) * (ATTN_BC + 4) + 2 * ATTN_BC);
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
        float x = row < T && c < D ? ld(src, base + (size_t)row * stride + c) : 0.0f;
        dst[r * attn_ld(DP) + c] = x;
    }
}

// Component i (0..3, a constant once unrolled) of v.
__device__ __forceinline__ float attn_f4(float4 v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// s[r][n] = A[tr + 16 r] . B[tc + 8 n] over head elements [0, D) of shared
// rows (stride DP + 4, columns >= D zero): one register micro-tile of a score
// tile, 4 head elements per 128-bit shared load (RM + 4 loads, 16 RM FMAs; a
// warp's 4 A rows and 8 B rows fall in distinct bank groups, the padding
// shifting each row by 16 bytes).
template <int DP, int RM>
__device__ __forceinline__ void attn_tile_dot(float (&s)[RM][ATTN_RN], const float *A,
                                              const float *B, int tr, int tc, int D) {
    constexpr int LD4 = attn_ld(DP) / 4;
#pragma unroll
    for (int r = 0; r < RM; r++)
#pragma unroll
        for (int n = 0; n < ATTN_RN; n++) s[r][n] = 0;
    const float4 *a0 = (const float4 *)A + tr * LD4, *b0 = (const float4 *)B + tc * LD4;
    int D4 = (D + 3) / 4;
    for (int d4 = 0; d4 < D4; d4++) {
        float4 a[RM], b[ATTN_RN];
#pragma unroll
        for (int r = 0; r < RM; r++) a[r] = a0[r * ATTN_TR * LD4 + d4];
#pragma unroll
        for (int n = 0; n < ATTN_RN; n++) b[n] = b0[n * ATTN_TC * LD4 + d4];
#pragma unroll
        for (int r = 0; r < RM; r++)
#pragma unroll
            for (int n = 0; n < ATTN_RN; n++) {
                float t = s[r][n];
                t = fmaf(a[r].x, b[n].x, t);
                t = fmaf(a[r].y, b[n].y, t);
                t = fmaf(a[r].z, b[n].z, t);
                s[r][n] = fmaf(a[r].w, b[n].w, t);
            }
    }
}

// acc[r][4 e + c] += sum_{j < 32} W[tr + 16 r][j] X[j][4 tc + 32 e + c]: a
// register accumulator (rows x DP, this thread's rows tr + 16 r and head
// elements 4 tc + 32 e + c) plus a weight tile W (shared, rows of 36 floats)
// times 32 shared rows X (stride DP + 4); 128-bit loads of 4 weights and of 4
// head elements (a warp's 8 column threads read one 128-byte row segment).
template <int DP, int RM>
__device__ __forceinline__ void attn_tile_acc(float (&acc)[RM][DP / ATTN_TC], const float *W,
                                              const float *X, int tr, int tc) {
    constexpr int LD4 = attn_ld(DP) / 4, PL4 = (ATTN_BC + 4) / 4, E4 = DP / 32;
    const float4 *w0 = (const float4 *)W + tr * PL4, *x0 = (const float4 *)X + tc;
    for (int j4 = 0; j4 < ATTN_BC / 4; j4++) {
        float4 w[RM];
#pragma unroll
        for (int r = 0; r < RM; r++) w[r] = w0[r * ATTN_TR * PL4 + j4];
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            float4 x[E4];
#pragma unroll
            for (int e = 0; e < E4; e++) x[e] = x0[(4 * j4 + jj) * LD4 + 8 * e];
#pragma unroll
            for (int r = 0; r < RM; r++) {
                float wr = attn_f4(w[r], jj);
#pragma unroll
                for (int e = 0; e < E4; e++) {
                    acc[r][4 * e] = fmaf(wr, x[e].x, acc[r][4 * e]);
                    acc[r][4 * e + 1] = fmaf(wr, x[e].y, acc[r][4 * e + 1]);
                    acc[r][4 * e + 2] = fmaf(wr, x[e].z, acc[r][4 * e + 2]);
                    acc[r][4 * e + 3] = fmaf(wr, x[e].w, acc[r][4 * e + 3]);
                }
            }
        }
    }
}

// Head element of accumulator slot i (< DP / 8) of column thread tc.
__device__ __forceinline__ int attn_col(int tc, int i) { return 4 * tc + 32 * (i / 4) + i % 4; }

// ---- steps of the kernels, shared by whole-sequence and block attention ----
// Each is called by every thread of the block; those that contain a barrier
// say so. Rows are this thread's tr + 16 r (r < RM), score columns tc + 8 n.

// Forward, one key tile: the maxima of this thread's scores s (scaled, masked
// to -inf) of each row into red (rows of 8 partials).
template <int RM>
__device__ __forceinline__ void attn_tile_rowmax(const float (&s)[RM][ATTN_RN], float *red, int tr, int tc) {
#pragma unroll
    for (int r = 0; r < RM; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < ATTN_RN; n++) mx = fmaxf(mx, s[r][n]);
        red[(tr + ATTN_TR * r) * ATTN_TC + tc] = mx;
    }
}

// Forward, one key tile, after the barrier that follows attn_tile_rowmax
// (alg. 1's online softmax): m_new = max(m, the row's tile maximum), P =
// exp(s - m_new) into Ps (rows of 36), l = l corr + rowsum P (this thread's
// part), O *= corr with corr = exp(m - m_new). A row with no key yet keeps m =
// -inf and uses 0 as its reference (corr = 0, P = 0: no NaN).
template <int DP, int RM>
__device__ __forceinline__ void attn_tile_softmax(const float (&s)[RM][ATTN_RN], float (&m)[RM], float (&l)[RM],
                                                  float (&o)[RM][DP / ATTN_TC], float *Ps, const float *red,
                                                  int tr, int tc) {
    constexpr int PL = ATTN_BC + 4;
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int row = tr + ATTN_TR * r;
        float mt = m[r];
#pragma unroll
        for (int c = 0; c < ATTN_TC; c++) mt = fmaxf(mt, red[row * ATTN_TC + c]);
        float mref = mt == -INFINITY ? 0.0f : mt;
        float corr = expf(m[r] - mref), ls = 0;
#pragma unroll
        for (int n = 0; n < ATTN_RN; n++) {
            float p = expf(s[r][n] - mref); // masked: exp(-inf) = 0
            Ps[row * PL + tc + ATTN_TC * n] = p;
            ls += p;
        }
        l[r] = l[r] * corr + ls;
        m[r] = mt;
#pragma unroll
        for (int e = 0; e < DP / ATTN_TC; e++) o[r][e] *= corr;
    }
}

// Forward epilogue: lt = each row's l summed over its 8 threads, through red
// (free once the last tile's P V has passed its barrier). Contains a barrier.
template <int RM>
__device__ __forceinline__ void attn_row_sums(float (&lt)[RM], const float (&l)[RM], float *red, int tr, int tc) {
#pragma unroll
    for (int r = 0; r < RM; r++) red[(tr + ATTN_TR * r) * ATTN_TC + tc] = l[r];
    __syncthreads();
#pragma unroll
    for (int r = 0; r < RM; r++) {
        float t = 0;
#pragma unroll
        for (int c = 0; c < ATTN_TC; c++) t += red[(tr + ATTN_TR * r) * ATTN_TC + c];
        lt[r] = t;
    }
}

// Backward dq kernels: Di = dO_i . O_i for rows q0 + tr + 16 r (0 past T),
// dO from the staged dOs (stride DP + 4), O from out (rows of stride qs from
// qbase). Contains two barriers (the first: dOs staged).
template <int DP, int RM>
__device__ __forceinline__ void attn_rows_delta(float (&Di)[RM], const float *dOs, struct dptr out, size_t qbase,
                                                size_t qs, int q0, int T, int D, float *red, int tr, int tc) {
    __syncthreads();
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int row = tr + ATTN_TR * r, i = q0 + row;
        float part = 0;
        if (i < T) {
            size_t oo = qbase + (size_t)i * qs;
#pragma unroll
            for (int e = 0; e < DP / ATTN_TC; e++) {
                int d = attn_col(tc, e);
                if (d < D) part += dOs[row * attn_ld(DP) + d] * ld(out, oo + d);
            }
        }
        red[row * ATTN_TC + tc] = part;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < RM; r++) {
        float di = 0;
#pragma unroll
        for (int c = 0; c < ATTN_TC; c++) di += red[(tr + ATTN_TR * r) * ATTN_TC + c];
        Di[r] = di;
    }
}

// Backward dq kernels, one key tile: dS = P (dP - D_i) into dSs (rows of 36),
// P = exp(scale s - lse_i) where keep(r, n), else 0.
template <int RM, class Keep>
__device__ __forceinline__ void attn_tile_ds(float *dSs, const float (&s)[RM][ATTN_RN],
                                             const float (&dp)[RM][ATTN_RN], const float (&li)[RM],
                                             const float (&Di)[RM], float scale, int tr, int tc, Keep keep) {
    constexpr int PL = ATTN_BC + 4;
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int row = tr + ATTN_TR * r;
#pragma unroll
        for (int n = 0; n < ATTN_RN; n++) {
            float p = keep(r, n) ? expf(s[r][n] * scale - li[r]) : 0.0f;
            dSs[row * PL + tc + ATTN_TC * n] = p * (dp[r][n] - Di[r]);
        }
    }
}

// Backward dk/dv kernels, one query tile (transposed: rows keys, columns
// queries c = tc + 8 n with lse ls[c], D Ds[c]): P into Ps, dS = P (dP - D)
// into dSs, P = 0 where !keep(r, n).
template <int RK, class Keep>
__device__ __forceinline__ void attn_tile_p_ds(float *Ps, float *dSs, const float (&s)[RK][ATTN_RN],
                                               const float (&dp)[RK][ATTN_RN], const float *ls, const float *Ds,
                                               float scale, int tr, int tc, Keep keep) {
    constexpr int PL = ATTN_BC + 4;
#pragma unroll
    for (int r = 0; r < RK; r++) {
        int row = tr + ATTN_TR * r;
#pragma unroll
        for (int n = 0; n < ATTN_RN; n++) {
            int c = tc + ATTN_TC * n;
            float p = keep(r, n) ? expf(s[r][n] * scale - ls[c]) : 0.0f;
            Ps[row * PL + c] = p;
            dSs[row * PL + c] = p * (dp[r][n] - Ds[c]);
        }
    }
}

// The head-size bucket DP (32, 64, 128, 256) of D; aborts above 256.
static inline int attn_bucket(const char *op, int D) {
    CHECK(D >= 1 && D <= 256, "%s: head size D=%d; the cuda attention kernels take D <= 256", op, D);
    return D <= 32 ? 32 : D <= 64 ? 64 : D <= 128 ? 128 : 256;
}

// Launches KERNEL<DP> with grid and SMEM(DP) bytes of dynamic shared memory,
// first raising the kernel's limit past the default 48 KiB.
#define ATTN_LAUNCH_DP(DP, KERNEL, SMEM, grid, stream, ...)                                      \
    do {                                                                                         \
        size_t smem_ = SMEM(DP);                                                                 \
        if (smem_ > 48 * 1024)                                                                   \
            CHECK_CUDA(cudaFuncSetAttribute(                                                     \
                KERNEL<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_));           \
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
static inline int attn_br(int dp) { return ATTN_TR * attn_rm(dp); }
static inline int attn_bk(int dp) { return ATTN_TR * attn_rk(dp); }

#endif

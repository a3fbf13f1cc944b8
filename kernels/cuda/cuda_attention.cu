// cuda_attention.cu: causal grouped-query attention of the CUDA backend as
// tiled kernels in the manner of FlashAttention-2 (Dao 2023, "FlashAttention-2:
// Faster Attention with Better Parallelism and Work Partitioning", algorithm 1
// forward, algorithm 2 backward), FP32 math on CUDA cores for FP32, BF16 and
// FP16 storage. Each entry point first offers the call to cuDNN's fused
// attention (cuda_attention_cudnn.cu, [system] attention); these kernels run
// when it declines (FP32, attention = native, a shape cuDNN cannot plan).
//
// Layouts (kernels/ops.h): q, out, dq, dout (B, T, H, D); k, v, dk, dv
// (B, T, Hkv, D); lse (B, H, T) FP32, lse_i = log sum_{j<=i} exp(scale q_i.k_j)
// with scale = 1/sqrt(D), as kernels/cpu/cpu_attention.c; query head h reads
// kv head h / (H / Hkv).
//
// Tiling. A block is 128 threads seen as a 16 x 8 grid: thread (tr, tc), tr =
// tid / 8, tc = tid % 8. Tiles live in dynamic shared memory as FP32 rows of
// LD = DP + 4 floats (DP: the head size rounded up to 32, 64, 128 or 256,
// columns >= D zero; the 4 floats of padding shift each row by one 16-byte
// bank group, so 128-bit loads of 8 rows by a warp do not conflict). A score
// tile (rows x 32 columns) is computed as register micro-tiles: thread (tr,
// tc) owns rows tr + 16 r (r < RM) and columns tc + 8 n (n < 4) and reads 4
// head elements of each operand row per 128-bit load (RM + 4 loads for 16 RM
// FMAs). An output accumulator (rows x DP) stays in registers: thread (tr,
// tc) holds rows tr + 16 r and head elements 4 tc + 32 e + c (c < 4), so a
// warp's 8 column threads read one 128-byte segment of a V (K, Q, dO) row per
// load. Global memory is read coalesced (consecutive threads, consecutive
// elements of a row) through ld(), converted to FP32 once when staged.
//
// Forward (alg. 1), grid (ceil(T / BR), H, B), BR = 16 RM query rows: the
// block's Q tile is staged once; K and V tiles of 32 keys stream through
// shared memory, only those with a key <= the block's last query (causal:
// fully masked tiles are never loaded; the mask is applied on tiles that
// cross the diagonal only); S = scale Q K^T in registers; the running row max
// m (FP32) from the 8 threads of a row through shared memory; P = exp(S - m)
// to shared memory; O = O corr + P V with corr = exp(m_old - m_new); l (row
// sum) kept per thread, summed at the end; out = O / l, lse = m + log l. No
// T x T matrix exists anywhere. Blocks are issued last query block first
// (the longest causal rows start early).
//
// Packed documents ([data] packing = concat_reset; doc_start (B, T) I32,
// kernels/ops.h; NULL: plain causal, the code above bit for bit): query i
// reads keys [doc_start[i], i]. doc_start is non-decreasing, so a query
// block's key tiles start at the tile holding doc_start of its first row
// (earlier documents' tiles are never loaded) and the dk/dv kernel stops at
// the first query tile whose first query starts after the block's last key;
// scores in the tiles that remain are masked per element. A row whose keys
// all lie in later tiles keeps m = -inf through the first ones: its
// correction and probabilities use 0 in place of -inf (no NaN).
//
// Backward (alg. 2, P recomputed from lse, no atomics, deterministic):
//   P_ij = exp(scale q_i.k_j - lse_i), dP_ij = dO_i.v_j, D_i = dO_i.O_i,
//   dS_ij = P_ij (dP_ij - D_i), dq_i = scale sum_j dS_ij k_j,
//   dk_j = scale sum_{h in group, i >= j} dS_ij q_i, dv_j = sum P_ij dO_i.
// Two kernels instead of FA2's one with atomicAdd on dq: each output row has
// one owner, so results are bitwise reproducible run to run and BF16/FP16 dq
// needs no FP32 side buffer and conversion pass, at the price of computing S
// and dP twice (7 tile GEMMs instead of 5). The dq kernel, parallel over
// query blocks (as the forward), also computes D_i = dO_i.O_i for its rows
// into scratch (B, H, T); the dk/dv kernel, parallel over key blocks of BK =
// 16 RK keys of one kv head (GQA: the group's H / Hkv query heads are summed
// inside the block, in order), runs after it on the same stream and streams
// Q, dO tiles of 32 queries, i >= the block's first key.
//
// Shared memory per block (floats; LD = DP + 4; rows of P, dS: 36 floats):
//   forward  BR = 64, 64, 64, 32:  (BR + 64) LD + BR (36 + 8)
//   dq       BR = 64, 64, 64, 32:  (2 BR + 64) LD + BR (36 + 8)
//   dk/dv    BK = 64, 64, 32, 16:  (2 BK + 64) LD + 2 BK 36 + 64
// for DP = 32, 64, 128, 256: forward 29, 45, 77, 103 KiB; dq 38, 62, 110,
// 136 KiB; dk/dv 45, 69, 75, 102 KiB (above 48 KiB through
// cudaFuncAttributeMaxDynamicSharedMemorySize; sm_80 allows 163 KiB a block,
// sm_90 227 KiB).
#include "cuda_attention.cuh"

// Forward, algorithm 1: block (x, h, b) owns query rows [q0, q0 + BR) of head
// h, q0 = (gridDim.x - 1 - x) BR (the last query blocks, which have the most
// key tiles, are issued first). Shared: Qs (BR, LD), Ks, Vs (32, LD), Ps (BR,
// 36), red (BR, 8).
template <int DP>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_forward_kernel(struct dptr out, float *lse, struct dptr q, struct dptr k, struct dptr v,
                         const int32_t *doc_start, int T, int H, int Hkv, int D, float scale) {
    constexpr int LD = attn_ld(DP), RM = attn_rm(DP), BR = ATTN_TR * RM, BC = ATTN_BC;
    constexpr int RN = ATTN_RN, DN = DP / ATTN_TC, PL = BC + 4;
    extern __shared__ float4 attn_smem[]; // float4: 16-byte aligned
    float *Qs = (float *)attn_smem, *Ks = Qs + BR * LD, *Vs = Ks + BC * LD, *Ps = Vs + BC * LD;
    float *red = Ps + BR * PL;
    int tr = threadIdx.x / ATTN_TC, tc = threadIdx.x % ATTN_TC;
    int q0 = (int)(gridDim.x - 1 - blockIdx.x) * BR, h = blockIdx.y, b = blockIdx.z;
    int hk = h / (H / Hkv);
    size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
    size_t qbase = (size_t)b * T * qs + (size_t)h * D, kbase = (size_t)b * T * ks + (size_t)hk * D;
    attn_load_rows<DP>(Qs, q, qbase, qs, q0, BR, T, D);
    const int32_t *ds = doc_start ? doc_start + (size_t)b * T : NULL;
    float o[RM][DN], m[RM], l[RM];
    int dsr[RM]; // each row's document start (0: plain causal)
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int i = q0 + tr + ATTN_TR * r;
        m[r] = -INFINITY, l[r] = 0, dsr[r] = ds && i < T ? ds[i] : 0;
#pragma unroll
        for (int e = 0; e < DN; e++) o[r][e] = 0;
    }
    int kend = min(T, q0 + BR); // keys [kbeg, kend): tiles past the block's last row are skipped
    int kbeg = ds ? ds[q0] / BC * BC : 0; // and those of earlier documents
    for (int k0 = kbeg; k0 < kend; k0 += BC) {
        __syncthreads(); // the previous tile's Ks, Vs, Ps are consumed
        attn_load_rows<DP>(Ks, k, kbase, ks, k0, BC, T, D);
        attn_load_rows<DP>(Vs, v, kbase, ks, k0, BC, T, D);
        __syncthreads();
        float s[RM][RN];
        attn_tile_dot<DP, RM>(s, Qs, Ks, tr, tc, D);
        bool diag = k0 + BC - 1 > q0; // some key of the tile is after some row
        bool mask = diag || ds;       // or, with documents, maybe before a row's start
#pragma unroll
        for (int r = 0; r < RM; r++) {
            int i = q0 + tr + ATTN_TR * r;
#pragma unroll
            for (int n = 0; n < RN; n++) {
                int j = k0 + tc + ATTN_TC * n;
                s[r][n] = mask && (j > i || j < dsr[r]) ? -INFINITY : s[r][n] * scale;
            }
        }
        attn_tile_rowmax<RM>(s, red, tr, tc);
        __syncthreads();
        // Without documents m is finite (key 0 is in the first tile of every
        // row); with them a row may have no key yet (m stays -inf).
        attn_tile_softmax<DP, RM>(s, m, l, o, Ps, red, tr, tc);
        __syncthreads();
        attn_tile_acc<DP, RM>(o, Ps, Vs, tr, tc); // O += P V (keys past T: P = 0 for rows < T)
    }
    float lts[RM]; // l: the sum of the row's 8 partial sums
    attn_row_sums<RM>(lts, l, red, tr, tc);
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int row = tr + ATTN_TR * r, i = q0 + row;
        float lt = lts[r];
        if (i >= T) continue;
        float inv = 1.0f / lt;
        size_t oo = qbase + (size_t)i * qs;
#pragma unroll
        for (int e = 0; e < DN; e++) {
            int d = attn_col(tc, e);
            if (d < D) st(out, oo + d, o[r][e] * inv);
        }
        if (tc == 0) lse[((size_t)b * H + h) * T + i] = m[r] + logf(lt);
    }
}

// Backward dq (and D_i = dO_i.O_i into Dvec): block (x, h, b) owns query rows
// [q0, q0 + BR) of head h, issued as in the forward. Shared: Qs, dOs (BR,
// LD), Ks, Vs (32, LD), dSs (BR, 36), red (BR, 8).
template <int DP>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_backward_dq_kernel(struct dptr dq, float *Dvec, struct dptr dout, struct dptr q,
                             struct dptr k, struct dptr v, struct dptr out, const float *lse,
                             const int32_t *doc_start, int T, int H, int Hkv, int D, float scale) {
    constexpr int LD = attn_ld(DP), RM = attn_rm(DP), BR = ATTN_TR * RM, BC = ATTN_BC;
    constexpr int RN = ATTN_RN, DN = DP / ATTN_TC, PL = BC + 4;
    extern __shared__ float4 attn_smem[]; // float4: 16-byte aligned
    float *Qs = (float *)attn_smem, *dOs = Qs + BR * LD, *Ks = dOs + BR * LD, *Vs = Ks + BC * LD;
    float *dSs = Vs + BC * LD, *red = dSs + BR * PL;
    int tr = threadIdx.x / ATTN_TC, tc = threadIdx.x % ATTN_TC;
    int q0 = (int)(gridDim.x - 1 - blockIdx.x) * BR, h = blockIdx.y, b = blockIdx.z;
    int hk = h / (H / Hkv);
    size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
    size_t qbase = (size_t)b * T * qs + (size_t)h * D, kbase = (size_t)b * T * ks + (size_t)hk * D;
    size_t lbase = ((size_t)b * H + h) * T;
    attn_load_rows<DP>(Qs, q, qbase, qs, q0, BR, T, D);
    attn_load_rows<DP>(dOs, dout, qbase, qs, q0, BR, T, D);
    const int32_t *ds = doc_start ? doc_start + (size_t)b * T : NULL;
    float Di[RM], li[RM], acc[RM][DN];
    int dsr[RM];
    attn_rows_delta<DP, RM>(Di, dOs, out, qbase, qs, q0, T, D, red, tr, tc);
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int row = tr + ATTN_TR * r, i = q0 + row;
        dsr[r] = ds && i < T ? ds[i] : 0;
        li[r] = i < T ? lse[lbase + i] : 0.0f;
        if (tc == 0 && i < T) Dvec[lbase + i] = Di[r];
#pragma unroll
        for (int e = 0; e < DN; e++) acc[r][e] = 0;
    }
    int kend = min(T, q0 + BR), kbeg = ds ? ds[q0] / BC * BC : 0;
    for (int k0 = kbeg; k0 < kend; k0 += BC) {
        __syncthreads(); // the previous tile's Ks, Vs, dSs are consumed
        attn_load_rows<DP>(Ks, k, kbase, ks, k0, BC, T, D);
        attn_load_rows<DP>(Vs, v, kbase, ks, k0, BC, T, D);
        __syncthreads();
        float s[RM][RN], dp[RM][RN];
        attn_tile_dot<DP, RM>(s, Qs, Ks, tr, tc, D);
        attn_tile_dot<DP, RM>(dp, dOs, Vs, tr, tc, D);
        bool diag = k0 + BC - 1 > q0; // some key of the tile is after some row
        attn_tile_ds<RM>(dSs, s, dp, li, Di, scale, tr, tc, [&](int r, int n) {
            int i = q0 + tr + ATTN_TR * r, j = k0 + tc + ATTN_TC * n;
            return ds ? j <= i && j >= dsr[r] : !diag || j <= i;
        });
        __syncthreads();
        attn_tile_acc<DP, RM>(acc, dSs, Ks, tr, tc); // dQ += dS K
    }
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int i = q0 + tr + ATTN_TR * r;
        if (i >= T) continue;
        size_t oo = qbase + (size_t)i * qs;
#pragma unroll
        for (int e = 0; e < DN; e++) {
            int d = attn_col(tc, e);
            if (d < D) st(dq, oo + d, scale * acc[r][e]);
        }
    }
}

// Backward dk, dv: block (x, hk, b) owns keys [k0, k0 + BK) of kv head hk,
// k0 = x BK (the first key blocks, which see the most queries, are issued
// first); for each query head of the group, the query tiles from the one
// holding k0 on. Shared: Ks, Vs (BK, LD), Qs, dOs (32, LD), Ps, dSs (BK, 36),
// ls, Ds (32).
template <int DP>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_backward_dkv_kernel(struct dptr dk, struct dptr dv, const float *Dvec,
                              struct dptr dout, struct dptr q, struct dptr k, struct dptr v,
                              const float *lse, const int32_t *doc_start, int T, int H, int Hkv,
                              int D, float scale) {
    constexpr int LD = attn_ld(DP), RK = attn_rk(DP), BK = ATTN_TR * RK, BQ = ATTN_BC;
    constexpr int RN = ATTN_RN, DN = DP / ATTN_TC, PL = BQ + 4;
    extern __shared__ float4 attn_smem[]; // float4: 16-byte aligned
    float *Ks = (float *)attn_smem, *Vs = Ks + BK * LD, *Qs = Vs + BK * LD, *dOs = Qs + BQ * LD;
    float *Ps = dOs + BQ * LD, *dSs = Ps + BK * PL, *ls = dSs + BK * PL, *Ds = ls + BQ;
    int tr = threadIdx.x / ATTN_TC, tc = threadIdx.x % ATTN_TC;
    int k0 = (int)blockIdx.x * BK, hk = blockIdx.y, b = blockIdx.z;
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
    const int32_t *ds = doc_start ? doc_start + (size_t)b * T : NULL;
    int jlast = min(T, k0 + BK) - 1; // the block's last key
    for (int h = hk * G; h < (hk + 1) * G; h++) {
        size_t qbase = (size_t)b * T * qs + (size_t)h * D, lbase = ((size_t)b * H + h) * T;
        for (int i0 = k0 / BQ * BQ; i0 < T; i0 += BQ) {
            // this and later query tiles start after the last key's document
            if (ds && i0 > jlast && ds[i0] > jlast) break;
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
            // some query of the tile is before some key, or past T
            bool edge = i0 < k0 + BK - 1 || i0 + BQ > T;
            attn_tile_p_ds<RK>(Ps, dSs, s, dp, ls, Ds, scale, tr, tc, [&](int r, int n) {
                int j = k0 + tr + ATTN_TR * r, i = i0 + tc + ATTN_TC * n;
                return ds ? i >= j && i < T && ds[i] <= j : !edge || (i >= j && i < T);
            });
            __syncthreads();
            attn_tile_acc<DP, RK>(dva, Ps, dOs, tr, tc);  // dV += P^T dO
            attn_tile_acc<DP, RK>(dka, dSs, Qs, tr, tc);  // dK += dS^T Q
        }
    }
#pragma unroll
    for (int r = 0; r < RK; r++) {
        int j = k0 + tr + ATTN_TR * r;
        if (j >= T) continue;
        size_t ko = kbase + (size_t)j * ks;
#pragma unroll
        for (int e = 0; e < DN; e++) {
            int d = attn_col(tc, e);
            if (d < D) {
                st(dk, ko + d, scale * dka[r][e]);
                st(dv, ko + d, dva[r][e]);
            }
        }
    }
}

// out (B, T, H, D) = causal softmax(scale q k^T) v per head, lse (B, H, T)
// FP32 = log-sum-exp of each scaled score row; q (B, T, H, D), k, v (B, T,
// Hkv, D); out, q, k, v FP32, BF16 or FP16 each (FP32 math), scale =
// 1/sqrt(D). The tiled forward kernel (alg. 1 above), one launch on the
// backend's stream. Aborts (CHECK) on D > 256, another dtype, or B or H
// above 65535; H must be a multiple of Hkv (ops.c checks).
void cuda_attention_forward(struct backend *be, struct tensor out, struct tensor lse,
                            struct tensor q, struct tensor k, struct tensor v,
                            struct tensor doc_start, int B, int T, int H, int Hkv, int D) {
    // cuDNN's SDPA graph is not given the document mask here (it would take
    // padding-style ragged offsets or a bias tensor): with doc_start these
    // kernels run (docs/design.md §3).
    const int32_t *ds = doc_start.numel ? (const int32_t *)doc_start.data : NULL;
    if (cuda_attention_cudnn_forward(be, out, lse, q, k, v, ds != NULL, B, T, H, Hkv, D)) return;
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
                (float *)lse.data, pq, pk, pv, ds, T, H, Hkv, D, scale);
}

// dq (B, T, H, D), dk, dv (B, T, Hkv, D) := the gradients of
// attention_forward given dout (B, T, H, D) and the forward's out and lse
// (written, not accumulated); dtypes as the forward. Two launches on the
// backend's stream: the dq kernel (which also fills D = rowsum(dout * out),
// B x H x T FP32, in the backend's scratch), then the dk/dv kernel.
// Deterministic. Aborts as the forward.
void cuda_attention_backward(struct backend *be, struct tensor dq, struct tensor dk,
                             struct tensor dv, struct tensor dout, struct tensor q,
                             struct tensor k, struct tensor v, struct tensor out,
                             struct tensor lse, struct tensor doc_start, int B, int T, int H,
                             int Hkv, int D) {
    const int32_t *ds = doc_start.numel ? (const int32_t *)doc_start.data : NULL; // cuDNN: none
    if (cuda_attention_cudnn_backward(be, dq, dk, dv, dout, q, k, v, out, lse, ds != NULL, B, T, H, Hkv, D))
        return;
    const char *op = "attention_backward";
    struct dptr pdq = dptr_of(op, "dq", dq), pdk = dptr_of(op, "dk", dk), pdv = dptr_of(op, "dv", dv);
    struct dptr pg = dptr_of(op, "dout", dout), po = dptr_of(op, "out", out);
    struct dptr pq = dptr_of(op, "q", q), pk = dptr_of(op, "k", k), pv = dptr_of(op, "v", v);
    CUDA_CHECK_SAME(op, "lse", lse, DTYPE_FP32);
    int dp = attn_bucket(op, D);
    if ((size_t)B * H * T == 0) return;
    CHECK(H <= 65535 && B <= 65535, "%s: H=%d, B=%d; the grid takes at most 65535", op, H, B);
    float scale = (float)(1.0 / sqrt((double)D));
    float *Dvec = (float *)cuda_scratch(be, cuda_scratch_attention_backward(B, T, H));
    const float *pl = (const float *)lse.data;
    dim3 grid_q((unsigned)((T + attn_br(dp) - 1) / attn_br(dp)), (unsigned)H, (unsigned)B);
    dim3 grid_k((unsigned)((T + attn_bk(dp) - 1) / attn_bk(dp)), (unsigned)Hkv, (unsigned)B);
    ATTN_LAUNCH(dp, attention_backward_dq_kernel, attn_dq_smem, grid_q, cuda_stream(be), pdq, Dvec,
                pg, pq, pk, pv, po, pl, ds, T, H, Hkv, D, scale);
    ATTN_LAUNCH(dp, attention_backward_dkv_kernel, attn_dkv_smem, grid_k, cuda_stream(be), pdk, pdv,
                Dvec, pg, pq, pk, pv, pl, ds, T, H, Hkv, D, scale);
}

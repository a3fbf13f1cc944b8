// cuda_attention_block.cu: one block of context-parallel ring attention on the
// CUDA backend (attention_block_forward, attention_block_backward; contract
// in kernels/ops.h): the queries of one rank against the keys and values of
// one (possibly another rank's) chunk pair, masked by global positions, the
// forward merged into the running (out, lse) by the online-softmax rule, the
// backward adding this block's dq, dk, dv (FlashAttention-2's backward from
// the final out and lse). The tiled kernels of cuda_attention.cu (Dao 2023,
// alg. 1 and 2; tiling and shared-memory layout there, helpers shared through
// cuda_attention.cuh) generalised to Tq != Tk and a mask by positions; BF16
// and FP16 calls are first offered to cuDNN per chunk pair
// (cuda_attention_cudnn_block.cu), which declines what it cannot run.
//
// Layouts: q, out, dq, dout (B, Tq, H, D); k, v, dk, dv (B, Tk, Hkv, D); lse
// (B, H, Tq) FP32; q_pos, q_doc (B, Tq) and k_pos (B, Tk) I32 (q_doc empty:
// 0 for every query). Query i reads key j iff q_doc[i] <= k_pos[j] <= q_pos[i];
// scale 1/sqrt(D); query head h reads kv head h / (H / Hkv).
//
// Skipping. Positions are arbitrary (under cp a rank's rows are two runs of
// consecutive positions), so which tiles hold a readable key is found from
// position ranges: a first small kernel reduces each granule of 16 rows to
// [min, max] of q_pos and of q_doc (queries) or of k_pos (keys), into
// scratch. A (query rows, key rows) tile pair can hold a readable pair only
// if kmin <= max q_pos and kmax >= min q_doc; otherwise it is skipped, its K
// and V (Q and dO) never loaded. It needs no mask at all when every key is
// readable by every row (kmax <= min q_pos, kmin >= max q_doc, no padding
// row or key); otherwise scores are masked per element from the positions
// staged with the tile. The test is conservative: a tile that passes may
// still hold no readable pair (rows spanning two runs, documents), then it is
// computed and masked; a tile with a readable pair is never skipped.
//
// Forward, grid (ceil(Tq / BR), H, B): algorithm 1 over the key tiles that
// pass, rows with no readable key yet keeping m = -inf (their reference is 0:
// corrections and probabilities 0, no NaN). This block's o_blk = O / l and
// lse_blk = m + log l (-inf, o_blk 0 when no key: l = 0). accumulate = false:
// out = o_blk, lse = lse_blk. accumulate = true: lse' = logaddexp(lse,
// lse_blk), out' = out e^(lse - lse') + o_blk e^(lse_blk - lse') (FP32 math,
// one rounding of out'); a row with no key in this block is left untouched
// (bit for bit), one with lse = -inf before takes o_blk (its old out, 0 by
// contract, is not read).
//
// Backward, as cuda_attention.cu's two kernels with the same skipping: the dq
// kernel also writes D_i = dO_i . O_i (scratch, B x H x Tq) from the final
// out; P = exp(scale q.k - lse) with the final lse, dS = P (dP - D);
// dq += scale dS K, dk += scale dS^T Q, dv += P^T dO, each summed in FP32
// registers over this call and added to the stored value with one rounding.
// No atomics: bitwise reproducible.
#include "cuda_attention.cuh"

#include <limits.h>

#define ATTN_GRAN 16 // rows per position-range granule (divides BR, BK and the 32-row tiles)

// Granule ranges: qr (B, ngq, 4) = min q_pos, max q_pos, min q_doc, max q_doc
// of the granule's rows < Tq; kr (B, ngk, 2) = min k_pos, max k_pos of its
// rows < Tk. One thread a granule.
__global__ void attention_block_ranges_kernel(int *qr, int *kr, const int32_t *q_pos, const int32_t *q_doc,
                                              const int32_t *k_pos, int B, int Tq, int Tk, int ngq, int ngk,
                                              const int *gate) {
    if (gate && !*gate) return;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t nq = (size_t)B * ngq, nk = (size_t)B * ngk;
    if (idx < nq) {
        int b = (int)(idx / ngq), g = (int)(idx % ngq), r1 = min(Tq, (g + 1) * ATTN_GRAN);
        int pmin = INT_MAX, pmax = INT_MIN, dmin = INT_MAX, dmax = INT_MIN;
        for (int r = g * ATTN_GRAN; r < r1; r++) {
            int p = q_pos[(size_t)b * Tq + r], d = q_doc ? q_doc[(size_t)b * Tq + r] : 0;
            pmin = min(pmin, p), pmax = max(pmax, p), dmin = min(dmin, d), dmax = max(dmax, d);
        }
        qr[4 * idx] = pmin, qr[4 * idx + 1] = pmax, qr[4 * idx + 2] = dmin, qr[4 * idx + 3] = dmax;
    } else if (idx < nq + nk) {
        idx -= nq;
        int b = (int)(idx / ngk), g = (int)(idx % ngk), r1 = min(Tk, (g + 1) * ATTN_GRAN);
        int kmin = INT_MAX, kmax = INT_MIN;
        for (int r = g * ATTN_GRAN; r < r1; r++) {
            int p = k_pos[(size_t)b * Tk + r];
            kmin = min(kmin, p), kmax = max(kmax, p);
        }
        kr[2 * idx] = kmin, kr[2 * idx + 1] = kmax;
    }
}

// Position ranges of rows [r0, r0 + n) of batch row b (n a multiple of
// ATTN_GRAN; granules past the last are ignored). Uniform across a block.
struct attn_qrange { int pmin, pmax, dmin, dmax; };
struct attn_krange { int kmin, kmax; };
__device__ __forceinline__ attn_qrange attn_qrange_of(const int *qr, int b, int ng, int r0, int n) {
    attn_qrange x = {INT_MAX, INT_MIN, INT_MAX, INT_MIN};
    for (int g = r0 / ATTN_GRAN; g < min(ng, (r0 + n) / ATTN_GRAN); g++) {
        const int *e = qr + 4 * ((size_t)b * ng + g);
        x.pmin = min(x.pmin, e[0]), x.pmax = max(x.pmax, e[1]);
        x.dmin = min(x.dmin, e[2]), x.dmax = max(x.dmax, e[3]);
    }
    return x;
}
__device__ __forceinline__ attn_krange attn_krange_of(const int *kr, int b, int ng, int r0, int n) {
    attn_krange x = {INT_MAX, INT_MIN};
    for (int g = r0 / ATTN_GRAN; g < min(ng, (r0 + n) / ATTN_GRAN); g++) {
        const int *e = kr + 2 * ((size_t)b * ng + g);
        x.kmin = min(x.kmin, e[0]), x.kmax = max(x.kmax, e[1]);
    }
    return x;
}
// Whether some key of k may be readable by some row of q (else: skip), and
// whether every key of k is readable by every row of q (no mask needed; the
// caller adds "no padding row or key").
__device__ __forceinline__ bool attn_may_read(attn_qrange q, attn_krange k) {
    return k.kmin <= q.pmax && k.kmax >= q.dmin;
}
__device__ __forceinline__ bool attn_reads_all(attn_qrange q, attn_krange k) {
    return k.kmax <= q.pmin && k.kmin >= q.dmax;
}

// Each row's last and first readable position, q_pos and q_doc (0 when
// empty), for rows q0 + tr + 16 r (padding rows past Tq: none readable).
template <int RM>
__device__ __forceinline__ void attn_row_bounds(int (&qp)[RM], int (&qd)[RM], const int32_t *q_pos,
                                                const int32_t *q_doc, int b, int Tq, int q0, int tr) {
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int i = q0 + tr + ATTN_TR * r;
        bool in = i < Tq;
        qp[r] = in ? q_pos[(size_t)b * Tq + i] : INT_MIN;
        qd[r] = !in ? INT_MAX : q_doc ? q_doc[(size_t)b * Tq + i] : 0;
    }
}

// Stages key tile [k0, k0 + 32): K and V rows into Ks, Vs and the keys'
// positions into kps (past Tk: INT_MAX, never readable). The caller's
// barriers surround it.
template <int DP>
__device__ __forceinline__ void attn_stage_keys(float *Ks, float *Vs, int *kps, struct dptr k, struct dptr v,
                                                size_t kbase, size_t ks, const int32_t *k_pos, int b, int k0,
                                                int Tk, int D) {
    attn_load_rows<DP>(Ks, k, kbase, ks, k0, ATTN_BC, Tk, D);
    attn_load_rows<DP>(Vs, v, kbase, ks, k0, ATTN_BC, Tk, D);
    if (threadIdx.x < ATTN_BC) {
        int j = k0 + threadIdx.x;
        kps[threadIdx.x] = j < Tk ? k_pos[(size_t)b * Tk + j] : INT_MAX;
    }
}

// Forward: block (x, h, b) owns query rows [q0, q0 + BR) of head h, q0 = x
// BR. Shared: Qs (BR, LD), Ks, Vs (32, LD), Ps (BR, 36), red (BR, 8) as
// attention_forward_kernel; kps (32): the key tile's positions.
template <int DP>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_block_forward_kernel(struct dptr out, float *lse, struct dptr q, struct dptr k, struct dptr v,
                               const int32_t *q_pos, const int32_t *q_doc, const int32_t *k_pos,
                               const int *qr, const int *kr, int Tq, int Tk, int H, int Hkv, int D,
                               float scale, bool accumulate, const int *gate) {
    if (gate && !*gate) return; // the cuDNN pair path ran instead
    constexpr int LD = attn_ld(DP), RM = attn_rm(DP), BR = ATTN_TR * RM, BC = ATTN_BC;
    constexpr int RN = ATTN_RN, DN = DP / ATTN_TC, PL = BC + 4;
    extern __shared__ float4 attn_smem[]; // float4: 16-byte aligned
    __shared__ int kps[BC];
    float *Qs = (float *)attn_smem, *Ks = Qs + BR * LD, *Vs = Ks + BC * LD, *Ps = Vs + BC * LD;
    float *red = Ps + BR * PL;
    int tr = threadIdx.x / ATTN_TC, tc = threadIdx.x % ATTN_TC;
    int q0 = (int)blockIdx.x * BR, h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
    int ngq = (Tq + ATTN_GRAN - 1) / ATTN_GRAN, ngk = (Tk + ATTN_GRAN - 1) / ATTN_GRAN;
    size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
    size_t qbase = (size_t)b * Tq * qs + (size_t)h * D, kbase = (size_t)b * Tk * ks + (size_t)hk * D;
    size_t lbase = ((size_t)b * H + h) * Tq;
    attn_qrange R = attn_qrange_of(qr, b, ngq, q0, BR);
    attn_load_rows<DP>(Qs, q, qbase, qs, q0, BR, Tq, D);
    float o[RM][DN], m[RM], l[RM];
    int qp[RM], qd[RM];
    attn_row_bounds<RM>(qp, qd, q_pos, q_doc, b, Tq, q0, tr);
#pragma unroll
    for (int r = 0; r < RM; r++) {
        m[r] = -INFINITY, l[r] = 0;
#pragma unroll
        for (int e = 0; e < DN; e++) o[r][e] = 0;
    }
    for (int k0 = 0; k0 < Tk; k0 += BC) {
        attn_krange K = attn_krange_of(kr, b, ngk, k0, BC);
        if (!attn_may_read(R, K)) continue; // uniform: no barrier skipped by part of the block
        bool mask = !attn_reads_all(R, K) || k0 + BC > Tk || q0 + BR > Tq;
        __syncthreads(); // the previous tile's Ks, Vs, Ps, kps are consumed
        attn_stage_keys<DP>(Ks, Vs, kps, k, v, kbase, ks, k_pos, b, k0, Tk, D);
        __syncthreads();
        float s[RM][RN];
        attn_tile_dot<DP, RM>(s, Qs, Ks, tr, tc, D);
#pragma unroll
        for (int r = 0; r < RM; r++)
#pragma unroll
            for (int n = 0; n < RN; n++) {
                int kp = kps[tc + ATTN_TC * n];
                s[r][n] = mask && !(qd[r] <= kp && kp <= qp[r]) ? -INFINITY : s[r][n] * scale;
            }
        attn_tile_rowmax<RM>(s, red, tr, tc);
        __syncthreads();
        attn_tile_softmax<DP, RM>(s, m, l, o, Ps, red, tr, tc); // a row with no key yet: m = -inf, P = 0
        __syncthreads();
        attn_tile_acc<DP, RM>(o, Ps, Vs, tr, tc); // O += P V
    }
    // the old lse is read by every thread of its row before the barrier of
    // the row sums, hence before any of them writes it
    float lo[RM], lts[RM];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int i = q0 + tr + ATTN_TR * r;
        lo[r] = accumulate && i < Tq ? lse[lbase + i] : -INFINITY;
    }
    attn_row_sums<RM>(lts, l, red, tr, tc);
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int i = q0 + tr + ATTN_TR * r;
        float lt = lts[r];
        if (i >= Tq) continue;
        float lb = lt > 0 ? m[r] + logf(lt) : -INFINITY, inv = lt > 0 ? 1.0f / lt : 0.0f;
        float a = 0, c = inv, ln = lb; // out' = a out + c O
        if (accumulate) {
            if (lb == -INFINITY) continue; // nothing to merge: the row stays as it is
            float mx = fmaxf(lo[r], lb), ea = expf(lo[r] - mx), eb = expf(lb - mx), sum = ea + eb;
            a = lo[r] == -INFINITY ? 0.0f : ea / sum, c = inv * (eb / sum), ln = mx + logf(sum);
        }
        size_t oo = qbase + (size_t)i * qs;
#pragma unroll
        for (int e = 0; e < DN; e++) {
            int d = attn_col(tc, e);
            if (d < D) st(out, oo + d, (a != 0 ? a * ld(out, oo + d) : 0.0f) + c * o[r][e]);
        }
        if (tc == 0) lse[lbase + i] = ln;
    }
}

// Backward dq (and D_i = dO_i.O_i into Dvec): block (x, h, b) owns query rows
// [q0, q0 + BR) of head h. Shared as attention_backward_dq_kernel, and kps.
template <int DP>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_block_backward_dq_kernel(struct dptr dq, float *Dvec, struct dptr dout, struct dptr q, struct dptr k,
                                   struct dptr v, struct dptr out, const float *lse, const int32_t *q_pos,
                                   const int32_t *q_doc, const int32_t *k_pos, const int *qr, const int *kr,
                                   int Tq, int Tk, int H, int Hkv, int D, float scale, const int *gate) {
    if (gate && !*gate) return;
    constexpr int LD = attn_ld(DP), RM = attn_rm(DP), BR = ATTN_TR * RM, BC = ATTN_BC;
    constexpr int RN = ATTN_RN, DN = DP / ATTN_TC, PL = BC + 4;
    extern __shared__ float4 attn_smem[]; // float4: 16-byte aligned
    __shared__ int kps[BC];
    float *Qs = (float *)attn_smem, *dOs = Qs + BR * LD, *Ks = dOs + BR * LD, *Vs = Ks + BC * LD;
    float *dSs = Vs + BC * LD, *red = dSs + BR * PL;
    int tr = threadIdx.x / ATTN_TC, tc = threadIdx.x % ATTN_TC;
    int q0 = (int)blockIdx.x * BR, h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
    int ngq = (Tq + ATTN_GRAN - 1) / ATTN_GRAN, ngk = (Tk + ATTN_GRAN - 1) / ATTN_GRAN;
    size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
    size_t qbase = (size_t)b * Tq * qs + (size_t)h * D, kbase = (size_t)b * Tk * ks + (size_t)hk * D;
    size_t lbase = ((size_t)b * H + h) * Tq;
    attn_qrange R = attn_qrange_of(qr, b, ngq, q0, BR);
    attn_load_rows<DP>(Qs, q, qbase, qs, q0, BR, Tq, D);
    attn_load_rows<DP>(dOs, dout, qbase, qs, q0, BR, Tq, D);
    float Di[RM], li[RM], acc[RM][DN];
    int qp[RM], qd[RM];
    attn_rows_delta<DP, RM>(Di, dOs, out, qbase, qs, q0, Tq, D, red, tr, tc);
    attn_row_bounds<RM>(qp, qd, q_pos, q_doc, b, Tq, q0, tr);
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int i = q0 + tr + ATTN_TR * r;
        bool in = i < Tq;
        li[r] = in ? lse[lbase + i] : 0.0f;
        if (tc == 0 && in) Dvec[lbase + i] = Di[r];
#pragma unroll
        for (int e = 0; e < DN; e++) acc[r][e] = 0;
    }
    bool any = false;
    for (int k0 = 0; k0 < Tk; k0 += BC) {
        attn_krange K = attn_krange_of(kr, b, ngk, k0, BC);
        if (!attn_may_read(R, K)) continue;
        bool mask = !attn_reads_all(R, K) || k0 + BC > Tk || q0 + BR > Tq;
        any = true;
        __syncthreads(); // the previous tile's Ks, Vs, dSs, kps are consumed
        attn_stage_keys<DP>(Ks, Vs, kps, k, v, kbase, ks, k_pos, b, k0, Tk, D);
        __syncthreads();
        float s[RM][RN], dp[RM][RN];
        attn_tile_dot<DP, RM>(s, Qs, Ks, tr, tc, D);
        attn_tile_dot<DP, RM>(dp, dOs, Vs, tr, tc, D);
        attn_tile_ds<RM>(dSs, s, dp, li, Di, scale, tr, tc, [&](int r, int n) {
            int kp = kps[tc + ATTN_TC * n];
            return !mask || (qd[r] <= kp && kp <= qp[r]);
        });
        __syncthreads();
        attn_tile_acc<DP, RM>(acc, dSs, Ks, tr, tc); // dQ += dS K
    }
    if (!any) return; // no key of this block is readable by these rows: dq unchanged
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int i = q0 + tr + ATTN_TR * r;
        if (i >= Tq) continue;
        size_t oo = qbase + (size_t)i * qs;
#pragma unroll
        for (int e = 0; e < DN; e++) {
            int d = attn_col(tc, e);
            if (d < D) st(dq, oo + d, ld(dq, oo + d) + scale * acc[r][e]);
        }
    }
}

// Backward dk, dv: block (x, hk, b) owns keys [k0, k0 + BK) of kv head hk, k0
// = x BK; for each query head of the group, in order, the query tiles of 32
// rows that may read them. Shared as attention_backward_dkv_kernel, and the
// query tile's q_pos and q_doc (qps, qds).
template <int DP>
__global__ void __launch_bounds__(ATTN_THREADS)
attention_block_backward_dkv_kernel(struct dptr dk, struct dptr dv, const float *Dvec, struct dptr dout,
                                    struct dptr q, struct dptr k, struct dptr v, const float *lse,
                                    const int32_t *q_pos, const int32_t *q_doc, const int32_t *k_pos,
                                    const int *qr, const int *kr, int Tq, int Tk, int H, int Hkv, int D,
                                    float scale, const int *gate) {
    if (gate && !*gate) return;
    constexpr int LD = attn_ld(DP), RK = attn_rk(DP), BK = ATTN_TR * RK, BQ = ATTN_BC;
    constexpr int RN = ATTN_RN, DN = DP / ATTN_TC, PL = BQ + 4;
    extern __shared__ float4 attn_smem[]; // float4: 16-byte aligned
    __shared__ int qps[BQ], qds[BQ];
    float *Ks = (float *)attn_smem, *Vs = Ks + BK * LD, *Qs = Vs + BK * LD, *dOs = Qs + BQ * LD;
    float *Ps = dOs + BQ * LD, *dSs = Ps + BK * PL, *ls = dSs + BK * PL, *Ds = ls + BQ;
    int tr = threadIdx.x / ATTN_TC, tc = threadIdx.x % ATTN_TC;
    int k0 = (int)blockIdx.x * BK, hk = blockIdx.y, b = blockIdx.z, G = H / Hkv;
    int ngq = (Tq + ATTN_GRAN - 1) / ATTN_GRAN, ngk = (Tk + ATTN_GRAN - 1) / ATTN_GRAN;
    size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
    size_t kbase = (size_t)b * Tk * ks + (size_t)hk * D;
    attn_krange K = attn_krange_of(kr, b, ngk, k0, BK);
    attn_load_rows<DP>(Ks, k, kbase, ks, k0, BK, Tk, D);
    attn_load_rows<DP>(Vs, v, kbase, ks, k0, BK, Tk, D);
    float dka[RK][DN], dva[RK][DN];
    int kp[RK]; // each key row's position (past Tk: never readable)
#pragma unroll
    for (int r = 0; r < RK; r++) {
        int j = k0 + tr + ATTN_TR * r;
        kp[r] = j < Tk ? k_pos[(size_t)b * Tk + j] : INT_MAX;
#pragma unroll
        for (int e = 0; e < DN; e++) dka[r][e] = dva[r][e] = 0;
    }
    bool any = false;
    for (int h = hk * G; h < (hk + 1) * G; h++) {
        size_t qbase = (size_t)b * Tq * qs + (size_t)h * D, lbase = ((size_t)b * H + h) * Tq;
        for (int i0 = 0; i0 < Tq; i0 += BQ) {
            attn_qrange R = attn_qrange_of(qr, b, ngq, i0, BQ);
            if (!attn_may_read(R, K)) continue;
            bool mask = !attn_reads_all(R, K) || i0 + BQ > Tq || k0 + BK > Tk;
            any = true;
            __syncthreads(); // the previous tile's Qs, dOs, Ps, dSs, ls, Ds, qps, qds are consumed
            attn_load_rows<DP>(Qs, q, qbase, qs, i0, BQ, Tq, D);
            attn_load_rows<DP>(dOs, dout, qbase, qs, i0, BQ, Tq, D);
            if (threadIdx.x < BQ) {
                int i = i0 + threadIdx.x;
                bool in = i < Tq;
                ls[threadIdx.x] = in ? lse[lbase + i] : 0.0f;
                Ds[threadIdx.x] = in ? Dvec[lbase + i] : 0.0f;
                qps[threadIdx.x] = in ? q_pos[(size_t)b * Tq + i] : INT_MIN;
                qds[threadIdx.x] = !in ? INT_MAX : q_doc ? q_doc[(size_t)b * Tq + i] : 0;
            }
            __syncthreads();
            float s[RK][RN], dp[RK][RN]; // transposed score tile: rows keys, columns queries
            attn_tile_dot<DP, RK>(s, Ks, Qs, tr, tc, D);
            attn_tile_dot<DP, RK>(dp, Vs, dOs, tr, tc, D);
            attn_tile_p_ds<RK>(Ps, dSs, s, dp, ls, Ds, scale, tr, tc, [&](int r, int n) {
                int c = tc + ATTN_TC * n;
                return !mask || (qds[c] <= kp[r] && kp[r] <= qps[c]);
            });
            __syncthreads();
            attn_tile_acc<DP, RK>(dva, Ps, dOs, tr, tc); // dV += P^T dO
            attn_tile_acc<DP, RK>(dka, dSs, Qs, tr, tc); // dK += dS^T Q
        }
    }
    if (!any) return; // no query reads these keys: dk, dv unchanged
#pragma unroll
    for (int r = 0; r < RK; r++) {
        int j = k0 + tr + ATTN_TR * r;
        if (j >= Tk) continue;
        size_t ko = kbase + (size_t)j * ks;
#pragma unroll
        for (int e = 0; e < DN; e++) {
            int d = attn_col(tc, e);
            if (d < D) {
                st(dk, ko + d, ld(dk, ko + d) + scale * dka[r][e]);
                st(dv, ko + d, ld(dv, ko + d) + dva[r][e]);
            }
        }
    }
}

// The position tensors' checks and device pointers (q_doc: NULL when empty).
static void block_positions(const char *op, struct tensor q_pos, struct tensor q_doc, struct tensor k_pos,
                            int B, int Tq, int Tk, const int32_t **qp, const int32_t **qd, const int32_t **kp) {
    CUDA_CHECK_SAME(op, "q_pos", q_pos, DTYPE_I32);
    CUDA_CHECK_SAME(op, "k_pos", k_pos, DTYPE_I32);
    if (q_doc.numel) CUDA_CHECK_SAME(op, "q_doc", q_doc, DTYPE_I32);
    CHECK(q_pos.numel >= (size_t)B * Tq && k_pos.numel >= (size_t)B * Tk &&
              (q_doc.numel == 0 || q_doc.numel >= (size_t)B * Tq),
          "%s: q_pos %zu, q_doc %zu, k_pos %zu elements for B=%d Tq=%d Tk=%d", op, q_pos.numel, q_doc.numel,
          k_pos.numel, B, Tq, Tk);
    *qp = (const int32_t *)q_pos.data, *kp = (const int32_t *)k_pos.data;
    *qd = q_doc.numel ? (const int32_t *)q_doc.data : NULL;
}

// Launches the granule-range kernel into the front of the scratch: qr (B,
// ngq, 4) then kr (B, ngk, 2) ints; returns the bytes used (256-aligned).
static size_t block_ranges(struct backend *be, char *scratch, int **qr, int **kr, const int32_t *qp,
                           const int32_t *qd, const int32_t *kp, int B, int Tq, int Tk, const int *gate) {
    int ngq = (Tq + ATTN_GRAN - 1) / ATTN_GRAN, ngk = (Tk + ATTN_GRAN - 1) / ATTN_GRAN;
    *qr = (int *)scratch;
    *kr = *qr + (size_t)4 * B * ngq;
    size_t n = (size_t)B * (ngq + ngk);
    attention_block_ranges_kernel<<<grid_for(n, 256), 256, 0, cuda_stream(be)>>>(*qr, *kr, qp, qd, kp, B, Tq, Tk,
                                                                                 ngq, ngk, gate);
    CHECK_LAUNCH();
    return (sizeof(int) * (size_t)B * (4 * ngq + 2 * ngk) + 255) / 256 * 256;
}

void cuda_attention_block_native_forward(struct backend *be, struct tensor out, struct tensor lse,
                                         struct tensor q, struct tensor k, struct tensor v, struct tensor q_pos,
                                         struct tensor q_doc, struct tensor k_pos, int B, int Tq, int Tk, int H,
                                         int Hkv, int D, bool accumulate, char *scratch, const int *gate) {
    const char *op = "attention_block_forward";
    struct dptr po = dptr_of(op, "out", out), pq = dptr_of(op, "q", q);
    struct dptr pk = dptr_of(op, "k", k), pv = dptr_of(op, "v", v);
    const int32_t *qp, *qd, *kp;
    block_positions(op, q_pos, q_doc, k_pos, B, Tq, Tk, &qp, &qd, &kp);
    int dp = attn_bucket(op, D);
    float scale = (float)(1.0 / sqrt((double)D));
    int *qr, *kr;
    block_ranges(be, scratch, &qr, &kr, qp, qd, kp, B, Tq, Tk, gate);
    dim3 grid((unsigned)((Tq + attn_br(dp) - 1) / attn_br(dp)), (unsigned)H, (unsigned)B);
    ATTN_LAUNCH(dp, attention_block_forward_kernel, attn_fwd_smem, grid, cuda_stream(be), po, (float *)lse.data, pq,
                pk, pv, qp, qd, kp, qr, kr, Tq, Tk, H, Hkv, D, scale, accumulate, gate);
}

// out (B, Tq, H, D), lse (B, H, Tq) FP32 := this block's attention, or merged
// into them (accumulate); see the file comment and kernels/ops.h. Two
// launches on the backend's stream (ranges, forward) unless cuDNN takes the
// call. Aborts (CHECK) on D > 256, another dtype, B or H above 65535.
void cuda_attention_block_forward(struct backend *be, struct tensor out, struct tensor lse, struct tensor q,
                                  struct tensor k, struct tensor v, struct tensor q_pos, struct tensor q_doc,
                                  struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv, int D,
                                  bool accumulate) {
    const char *op = "attention_block_forward";
    dptr_of(op, "out", out), dptr_of(op, "q", q), dptr_of(op, "k", k), dptr_of(op, "v", v);
    CUDA_CHECK_SAME(op, "lse", lse, DTYPE_FP32);
    const int32_t *qp, *qd, *kp;
    block_positions(op, q_pos, q_doc, k_pos, B, Tq, Tk, &qp, &qd, &kp);
    attn_bucket(op, D);
    if ((size_t)B * H * Tq == 0) return;
    CHECK(H <= 65535 && B <= 65535, "%s: H=%d, B=%d; the grid takes at most 65535", op, H, B);
    if (cuda_attention_cudnn_block_forward(be, out, lse, q, k, v, q_pos, q_doc, k_pos, B, Tq, Tk, H, Hkv, D,
                                           accumulate))
        return;
    char *scratch = (char *)cuda_scratch(be, cuda_scratch_attention_block(B, Tq, Tk, H, false));
    cuda_attention_block_native_forward(be, out, lse, q, k, v, q_pos, q_doc, k_pos, B, Tq, Tk, H, Hkv, D,
                                        accumulate, scratch, NULL);
}

void cuda_attention_block_native_backward(struct backend *be, struct tensor dq, struct tensor dk, struct tensor dv,
                                          struct tensor dout, struct tensor q, struct tensor k, struct tensor v,
                                          struct tensor out, struct tensor lse, struct tensor q_pos,
                                          struct tensor q_doc, struct tensor k_pos, int B, int Tq, int Tk, int H,
                                          int Hkv, int D, char *scratch, const int *gate) {
    const char *op = "attention_block_backward";
    struct dptr pdq = dptr_of(op, "dq", dq), pdk = dptr_of(op, "dk", dk), pdv = dptr_of(op, "dv", dv);
    struct dptr pg = dptr_of(op, "dout", dout), po = dptr_of(op, "out", out);
    struct dptr pq = dptr_of(op, "q", q), pk = dptr_of(op, "k", k), pv = dptr_of(op, "v", v);
    const int32_t *qp, *qd, *kp;
    block_positions(op, q_pos, q_doc, k_pos, B, Tq, Tk, &qp, &qd, &kp);
    int dp = attn_bucket(op, D);
    float scale = (float)(1.0 / sqrt((double)D));
    int *qr, *kr;
    float *Dvec = (float *)(scratch + block_ranges(be, scratch, &qr, &kr, qp, qd, kp, B, Tq, Tk, gate));
    const float *pl = (const float *)lse.data;
    dim3 grid_q((unsigned)((Tq + attn_br(dp) - 1) / attn_br(dp)), (unsigned)H, (unsigned)B);
    dim3 grid_k((unsigned)((Tk + attn_bk(dp) - 1) / attn_bk(dp)), (unsigned)Hkv, (unsigned)B);
    ATTN_LAUNCH(dp, attention_block_backward_dq_kernel, attn_dq_smem, grid_q, cuda_stream(be), pdq, Dvec, pg, pq,
                pk, pv, po, pl, qp, qd, kp, qr, kr, Tq, Tk, H, Hkv, D, scale, gate);
    ATTN_LAUNCH(dp, attention_block_backward_dkv_kernel, attn_dkv_smem, grid_k, cuda_stream(be), pdk, pdv, Dvec,
                pg, pq, pk, pv, pl, qp, qd, kp, qr, kr, Tq, Tk, H, Hkv, D, scale, gate);
}

// dq (B, Tq, H, D) +=, dk, dv (B, Tk, Hkv, D) += this block's gradients given
// dout and the final out and lse of the query rows; dtypes as the forward.
// Three launches on the backend's stream (ranges, dq with D = rowsum(dout *
// out) into scratch, dk/dv) unless cuDNN takes the call. Deterministic.
// Aborts as the forward.
void cuda_attention_block_backward(struct backend *be, struct tensor dq, struct tensor dk, struct tensor dv,
                                   struct tensor dout, struct tensor q, struct tensor k, struct tensor v,
                                   struct tensor out, struct tensor lse, struct tensor q_pos, struct tensor q_doc,
                                   struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv, int D) {
    const char *op = "attention_block_backward";
    dptr_of(op, "dq", dq), dptr_of(op, "dk", dk), dptr_of(op, "dv", dv), dptr_of(op, "dout", dout);
    dptr_of(op, "out", out), dptr_of(op, "q", q), dptr_of(op, "k", k), dptr_of(op, "v", v);
    CUDA_CHECK_SAME(op, "lse", lse, DTYPE_FP32);
    const int32_t *qp, *qd, *kp;
    block_positions(op, q_pos, q_doc, k_pos, B, Tq, Tk, &qp, &qd, &kp);
    attn_bucket(op, D);
    if ((size_t)B * H * Tq == 0 || Tk == 0) return;
    CHECK(H <= 65535 && B <= 65535, "%s: H=%d, B=%d; the grid takes at most 65535", op, H, B);
    if (cuda_attention_cudnn_block_backward(be, dq, dk, dv, dout, q, k, v, out, lse, q_pos, q_doc, k_pos, B, Tq,
                                            Tk, H, Hkv, D))
        return;
    char *scratch = (char *)cuda_scratch(be, cuda_scratch_attention_block(B, Tq, Tk, H, true));
    cuda_attention_block_native_backward(be, dq, dk, dv, dout, q, k, v, out, lse, q_pos, q_doc, k_pos, B, Tq, Tk,
                                         H, Hkv, D, scratch, NULL);
}

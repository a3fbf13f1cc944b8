// generic/attention_block.h: one block of context-parallel ring attention
// (kernels/ops.h, backend_attention_block_forward / _backward), forward and
// backward, instantiated by cpu_attention_block.c for FP32 and FP64 (BF16 /
// FP16 convert each head to FP32 there and call the per-head functions).
//
// A block is a rank's Tq queries against one rank's Tk keys, each token
// known by its global position; query i reads key j iff
// qdoc[i] <= kpos[j] <= qpos[i] (qdoc NULL: 0). Per (batch b, query head h)
// the queries are taken in tiles of up to BLOCK_BQ rows and the keys in
// tiles of up to BLOCK_BK, a tile also ending where its positions stop
// running consecutively (block_tile_end): a key tile is a candidate for a
// query tile when its positions [min, max] meet [min qdoc, max qpos] of the
// query tile; every other key tile is skipped, not computed and masked
// (under context parallelism a rank's positions are two runs, one per
// chunk, so no tile straddles both and the causal upper triangle and
// earlier documents' keys cost nothing whatever the chunk size).
// Consecutive candidate tiles form a run, and each run is one GEMM (as
// generic/attention.h, whose query-block loop this follows): the score block
// S (BLOCK_BQ, Tk) holds a run's columns at their key indices, and the mask
// is applied per element inside the runs only.
//
// Matrices are read in place from the (B, Tq, H, D) / (B, Tk, Hkv, D)
// layouts with leading dimension H*D or Hkv*D. BLAS calls run inside the
// OpenMP region and are single-threaded there (see cpu_backend.c).

// One (batch, query head) of the forward: o (Tq, D), l (Tq,) = this block's
// attention, or merged into them (accumulate): kernels/ops.h. q and o rows
// are ldq apart, k and v rows ldk apart; qpos, qdoc (or NULL) (Tq,), kpos
// (Tk,). S: block_scratch_elems(Tq, Tk, D, false) scratch (the score
// block, the block's output rows when accumulating, the runs).
static void FN(attention_block_head_forward)(real *o, real *l, const real *q, int ldq,
                                             const real *k, const real *v, int ldk,
                                             const int32_t *qpos, const int32_t *qdoc,
                                             const int32_t *kpos, int Tq, int Tk, int D,
                                             bool accumulate, real *S) {
    real scale = (real)(1.0 / sqrt((double)D));
    real *ob = S + (size_t)BLOCK_BQ * Tk; // (BLOCK_BQ, D) when accumulating
    int *runs = block_runs_of(S, Tk, D);
    for (int i0 = 0, i1; i0 < Tq; i0 = i1) {
        i1 = block_tile_end(qpos, i0, Tq, BLOCK_BQ);
        int m = i1 - i0, lo, hi;
        block_query_span(qpos, qdoc, i0, i1, &lo, &hi);
        int nr = block_runs(kpos, Tk, lo, hi, runs);
        // S[:, ja:jb] (m, jb - ja) = scale * Q[i0:i1] K[ja:jb]^T, per run
        for (int r = 0; r < nr; r++) {
            int ja = runs[2 * r], jb = runs[2 * r + 1];
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, m, jb - ja, D, scale,
                 q + (size_t)i0 * ldq, ldq, k + (size_t)ja * ldk, ldk, 0, S + ja, Tk);
        }
        if (nr == 0) { // nothing readable in this query tile
            if (!accumulate)
                for (int i = i0; i < i1; i++) {
                    memset(o + (size_t)i * ldq, 0, (size_t)D * sizeof(real));
                    l[i] = -INFINITY;
                }
            continue;
        }
        real lbs[BLOCK_BQ]; // each row's log-sum-exp over this block (-inf: none readable)
        for (int i = i0; i < i1; i++) {
            real *s = S + (size_t)(i - i0) * Tk, mx = -INFINITY;
            int rlo = qdoc ? qdoc[i] : 0, rhi = qpos[i];
            for (int r = 0; r < nr; r++) {
                int ja = runs[2 * r], jb = runs[2 * r + 1];
#pragma omp simd reduction(max : mx)
                for (int j = ja; j < jb; j++) {
                    bool ok = (kpos[j] >= rlo) & (kpos[j] <= rhi);
                    real x = ok ? s[j] : -INFINITY;
                    mx = x > mx ? x : mx;
                }
            }
            if (mx == -INFINITY) rhi = rlo - 1; // no readable key in this row: P = 0
            accreal sum = 0;
            for (int r = 0; r < nr; r++) {
                int ja = runs[2 * r], jb = runs[2 * r + 1];
#pragma omp simd reduction(+ : sum)
                for (int j = ja; j < jb; j++) {
                    bool ok = (kpos[j] >= rlo) & (kpos[j] <= rhi);
                    s[j] = EXP(ok ? s[j] - mx : -INFINITY); // branch-free: vectorizes
                    sum += s[j];
                }
            }
            lbs[i - i0] = -INFINITY;
            if (mx == -INFINITY) continue;
            real inv = (real)(1.0 / sum);
            lbs[i - i0] = (real)(mx + log(sum));
            for (int r = 0; r < nr; r++) {
                int ja = runs[2 * r], jb = runs[2 * r + 1];
#pragma omp simd
                for (int j = ja; j < jb; j++) s[j] *= inv;
            }
        }
        // the block's rows (m, D) = P (m, runs) V[runs] (runs, D): into o, or
        // into ob for the merge
        real *dst = accumulate ? ob : o + (size_t)i0 * ldq;
        int ldd = accumulate ? D : ldq;
        for (int r = 0; r < nr; r++) {
            int ja = runs[2 * r], jb = runs[2 * r + 1];
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, jb - ja, 1, S + ja, Tk,
                 v + (size_t)ja * ldk, ldk, r == 0 ? 0 : 1, dst, ldd);
        }
        if (!accumulate) {
            memcpy(l + i0, lbs, (size_t)m * sizeof(real));
            continue;
        }
        // online-softmax merge (FlashAttention-2 alg. 1): lse' = logaddexp(l, lb),
        // o' = o e^(l - lse') + ob e^(lb - lse'); an empty block row stays as it is
        for (int i = i0; i < i1; i++) {
            real lb = lbs[i - i0], old = l[i], *oi = o + (size_t)i * ldq;
            const real *bi = ob + (size_t)(i - i0) * D;
            if (lb == -INFINITY) continue;
            if (old == -INFINITY) {
                memcpy(oi, bi, (size_t)D * sizeof(real));
                l[i] = lb;
                continue;
            }
            real big = old > lb ? old : lb, small = old > lb ? lb : old;
            real ln = (real)(big + log1p(exp((double)(small - big))));
            real a = EXP(old - ln), c = EXP(lb - ln);
            for (int d = 0; d < D; d++) oi[d] = oi[d] * a + bi[d] * c;
            l[i] = ln;
        }
    }
}

// out (B, Tq, H, D), lse (B, H, Tq) = this block's attention, or merged into
// them; kernels/ops.h. Parallel over (b, query head). scratch: per thread
// block_scratch_elems(Tq, Tk, D, false) reals.
static void FN(attention_block_forward)(real *out, real *lse, const real *q, const real *k,
                                        const real *v, const int32_t *q_pos, const int32_t *q_doc,
                                        const int32_t *k_pos, int B, int Tq, int Tk, int H,
                                        int Hkv, int D, bool accumulate, real *scratch) {
    int G = H / Hkv, ldq = H * D, ldk = Hkv * D;
    size_t per = block_scratch_elems(Tq, Tk, D, false);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, hk = h / G;
        real *S = scratch + (size_t)omp_get_thread_num() * per;
        size_t qoff = (size_t)b * Tq * ldq + (size_t)h * D, koff = (size_t)b * Tk * ldk + (size_t)hk * D;
        FN(attention_block_head_forward)(out + qoff, lse + ((size_t)b * H + h) * Tq, q + qoff, ldq,
                                         k + koff, v + koff, ldk, q_pos + (size_t)b * Tq,
                                         q_doc ? q_doc + (size_t)b * Tq : NULL,
                                         k_pos + (size_t)b * Tk, Tq, Tk, D, accumulate, S);
    }
}

// One (batch, query head) of the backward: dq (Tq, D) +=, dk, dv (Tk, D) +=
// this block's gradients given dout, the final merged o and l
// (FlashAttention-2 alg. 2, P recomputed from l):
//   P = exp(S - l), dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
//   dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO,
// over the candidate key runs only. Rows ldq / ldk apart as the forward. P:
// block_scratch_elems(Tq, Tk, D, false) scratch (P and dP blocks, column j
// key j; the runs).
static void FN(attention_block_head_backward)(real *dq, const real *q, const real *o,
                                              const real *dout, int ldq, real *dk, real *dv,
                                              const real *k, const real *v, int ldk,
                                              const real *l, const int32_t *qpos,
                                              const int32_t *qdoc, const int32_t *kpos, int Tq,
                                              int Tk, int D, real *P) {
    real scale = (real)(1.0 / sqrt((double)D));
    real *dP = P + (size_t)BLOCK_BQ * Tk;
    int *runs = block_runs_of(P, Tk, D);
    for (int i0 = 0, i1; i0 < Tq; i0 = i1) {
        i1 = block_tile_end(qpos, i0, Tq, BLOCK_BQ);
        int m = i1 - i0, lo, hi;
        block_query_span(qpos, qdoc, i0, i1, &lo, &hi);
        const real *qi = q + (size_t)i0 * ldq, *doi = dout + (size_t)i0 * ldq;
        int nr = block_runs(kpos, Tk, lo, hi, runs);
        for (int r = 0; r < nr; r++) {
            int ja = runs[2 * r], jb = runs[2 * r + 1];
            // S (m, run) = scale * Q K[run]^T into P; dP (m, run) = dO V[run]^T
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, m, jb - ja, D, scale, qi, ldq,
                 k + (size_t)ja * ldk, ldk, 0, P + ja, Tk);
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, m, jb - ja, D, 1, doi, ldq,
                 v + (size_t)ja * ldk, ldk, 0, dP + ja, Tk);
        }
        if (nr == 0) continue;
        for (int i = i0; i < i1; i++) {
            real *p = P + (size_t)(i - i0) * Tk, *dp = dP + (size_t)(i - i0) * Tk;
            const real *oi = o + (size_t)i * ldq, *g = dout + (size_t)i * ldq;
            int rlo = qdoc ? qdoc[i] : 0, rhi = qpos[i];
            real li = l[i];
            if (li == -INFINITY) rhi = rlo - 1; // no readable key anywhere: P = 0
            accreal Di = 0;
#pragma omp simd reduction(+ : Di)
            for (int d = 0; d < D; d++) Di += (accreal)g[d] * oi[d];
            real di = (real)Di;
            for (int r = 0; r < nr; r++) {
                int ja = runs[2 * r], jb = runs[2 * r + 1];
#pragma omp simd
                for (int j = ja; j < jb; j++) { // masked scores to -inf: exp gives 0
                    bool ok = (kpos[j] >= rlo) & (kpos[j] <= rhi);
                    p[j] = ok ? p[j] - li : -INFINITY;
                }
#pragma omp simd
                for (int j = ja; j < jb; j++) {
                    p[j] = EXP(p[j]);
                    dp[j] = p[j] * (dp[j] - di); // dS
                }
            }
        }
        for (int r = 0; r < nr; r++) {
            int ja = runs[2 * r], n = runs[2 * r + 1] - ja;
            // dQ[i0:i1] (m, D) += scale * dS (m, n) K[run] (n, D)
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, n, scale, dP + ja, Tk,
                 k + (size_t)ja * ldk, ldk, 1, dq + (size_t)i0 * ldq, ldq);
            // dK[run] (n, D) += scale * dS^T (n, m) Q[i0:i1] (m, D)
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, m, scale, dP + ja, Tk, qi, ldq, 1,
                 dk + (size_t)ja * ldk, ldk);
            // dV[run] (n, D) += P^T (n, m) dO[i0:i1] (m, D)
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, m, 1, P + ja, Tk, doi, ldq, 1,
                 dv + (size_t)ja * ldk, ldk);
        }
    }
}

// dq (B, Tq, H, D) +=, dk, dv (B, Tk, Hkv, D) += this block's gradients;
// kernels/ops.h. Parallel over (b, kv head): one thread owns dk, dv of its kv
// head and dq of the H / Hkv query heads that read it, so nothing races.
static void FN(attention_block_backward)(real *dq, real *dk, real *dv, const real *dout,
                                         const real *q, const real *k, const real *v,
                                         const real *out, const real *lse, const int32_t *q_pos,
                                         const int32_t *q_doc, const int32_t *k_pos, int B,
                                         int Tq, int Tk, int H, int Hkv, int D, real *scratch) {
    int G = H / Hkv, ldq = H * D, ldk = Hkv * D;
    size_t per = block_scratch_elems(Tq, Tk, D, false);
#pragma omp parallel for schedule(static)
    for (int bk = 0; bk < B * Hkv; bk++) {
        int b = bk / Hkv, hk = bk % Hkv;
        real *P = scratch + (size_t)omp_get_thread_num() * per;
        size_t koff = (size_t)b * Tk * ldk + (size_t)hk * D;
        for (int h = hk * G; h < (hk + 1) * G; h++) {
            size_t off = (size_t)b * Tq * ldq + (size_t)h * D;
            FN(attention_block_head_backward)(dq + off, q + off, out + off, dout + off, ldq,
                                              dk + koff, dv + koff, k + koff, v + koff, ldk,
                                              lse + ((size_t)b * H + h) * Tq, q_pos + (size_t)b * Tq,
                                              q_doc ? q_doc + (size_t)b * Tq : NULL,
                                              k_pos + (size_t)b * Tk, Tq, Tk, D, P);
        }
    }
}

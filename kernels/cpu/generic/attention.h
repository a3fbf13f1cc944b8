// generic/attention.h: causal grouped-query attention, forward and backward,
// instantiated by cpu_attention.c for FP32 and FP64 (see cpu.h; BF16/FP16
// convert each head to FP32 there and call the per-head functions below).
//
// Per (batch b, query head h) the scores are computed in row blocks of
// ATTN_BLOCK queries: block [i0, i1) only needs keys [js, i1) (causal), so the
// GEMMs skip most of the masked upper triangle. js is 0, or with packed
// documents (doc_start, [data] packing = concat_reset) the start of query
// i0's document: query i reads keys [doc_start[i], i] only (block-diagonal
// causal), so the keys of earlier documents are skipped, not masked. An
// empty doc_start (NULL) runs exactly the plain causal code. Matrices are read in place
// from the (B, T, H, D) / (B, T, Hkv, D) layouts with leading dimension H*D or
// Hkv*D; nothing is transposed or copied. BLAS calls run inside the OpenMP
// region and are single-threaded there (see cpu_backend.c).
//
// scratch: per thread 2 * ATTN_BLOCK * T reals (one score block, one dP
// block), indexed by omp_get_thread_num(); the caller provides it.

// One (batch, query head): o (T, D) = softmax(q k^T / sqrt(D) + mask) v and
// l (T,) = the log-sum-exp of each scaled score row; the mask is causal, and
// with ds (T,) (this row's doc_start, NULL: none) also keys j < ds[i] are
// out. q and o rows are ldq apart, k and v rows ldk apart. S: ATTN_BLOCK * T
// scratch; score column c of a block is key js + c.
static void FN(attention_head_forward)(real *o, real *l, const real *q, int ldq, const real *k,
                                       const real *v, int ldk, const int32_t *ds, int T, int D,
                                       real *S) {
    real scale = (real)(1.0 / sqrt((double)D));
    for (int i0 = 0; i0 < T; i0 += ATTN_BLOCK) {
        int i1 = MIN(T, i0 + ATTN_BLOCK), m = i1 - i0;
        int js = ds ? ds[i0] : 0, nk = i1 - js; // keys [js, i1): ds is non-decreasing
        // S (m, nk) = scale * Q[i0:i1] K[js:i1]^T
        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, D, scale, q + (size_t)i0 * ldq, ldq,
             k + (size_t)js * ldk, ldk, 0, S, T);
        for (int i = i0; i < i1; i++) {
            real *s = S + (size_t)(i - i0) * T;
            int lo = ds ? ds[i] - js : 0, hi = i - js; // the row's keys, inclusive
            real mx = s[lo];
#pragma omp simd reduction(max : mx)
            for (int j = lo + 1; j <= hi; j++) mx = s[j] > mx ? s[j] : mx;
            accreal sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int j = lo; j <= hi; j++) {
                s[j] = EXP(s[j] - mx);
                sum += s[j];
            }
            real inv = (real)(1.0 / sum);
            for (int j = lo; j <= hi; j++) s[j] *= inv;
            for (int j = 0; j < lo; j++) s[j] = 0;       // an earlier document: P = 0
            for (int j = hi + 1; j < nk; j++) s[j] = 0; // causal: P = 0
            l[i] = (real)(mx + log(sum));
        }
        // O[i0:i1] (m, D) = P (m, nk) V[js:i1] (nk, D)
        GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, nk, 1, S, T, v + (size_t)js * ldk,
             ldk, 0, o + (size_t)i0 * ldq, ldq);
    }
}

// out (B, T, H, D) = softmax(q k^T / sqrt(D) + causal mask) v; lse (B, H, T)
// = log-sum-exp of each scaled score row. q: (B, T, H, D); k, v: (B, T, Hkv,
// D); query head h reads kv head h / (H / Hkv); doc_start (B, T) or NULL
// (kernels/ops.h). Math: Vaswani et al. 2017 eq. 1; GQA: Ainslie et al.
// 2023; as torch scaled_dot_product_attention with is_causal=True (with
// doc_start: its attn_mask, block-diagonal causal).
static void FN(attention_forward)(real *out, real *lse, const real *q, const real *k,
                                  const real *v, const int32_t *doc_start, int B, int T, int H,
                                  int Hkv, int D, real *scratch) {
    int G = H / Hkv;
    int ldq = H * D, ldk = Hkv * D;
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, hk = h / G;
        real *S = scratch + (size_t)omp_get_thread_num() * 2 * ATTN_BLOCK * T; // (ATTN_BLOCK, T)
        size_t qoff = (size_t)b * T * ldq + (size_t)h * D, koff = (size_t)b * T * ldk + (size_t)hk * D;
        FN(attention_head_forward)(out + qoff, lse + ((size_t)b * H + h) * T, q + qoff, ldq,
                                   k + koff, v + koff, ldk,
                                   doc_start ? doc_start + (size_t)b * T : NULL, T, D, S);
    }
}

// One (batch, query head) of the backward pass: dq (T, D) = and dk, dv (T, D)
// += (over the query heads of a kv head) the gradients given dout, the
// forward's o and l. q, o, dout, dq rows are ldq apart; k, v, dk, dv rows ldk
// apart; ds (T,) this row's doc_start or NULL, as in the forward. P is
// recomputed from q, k and l (FlashAttention, Dao et al. 2022, alg. 2 / 4):
//   P = exp(S - lse), dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
//   dQ = scale dS K, dK += scale dS^T Q, dV += P^T dO.
// P: 2 * ATTN_BLOCK * T scratch (P and dP blocks); column c is key js + c.
static void FN(attention_head_backward)(real *dq, const real *q, const real *o, const real *dout,
                                        int ldq, real *dk, real *dv, const real *k, const real *v,
                                        int ldk, const real *l, const int32_t *ds, int T, int D,
                                        real *P) {
    real scale = (real)(1.0 / sqrt((double)D));
    real *dP = P + (size_t)ATTN_BLOCK * T; // (ATTN_BLOCK, T)
    for (int i0 = 0; i0 < T; i0 += ATTN_BLOCK) {
        int i1 = MIN(T, i0 + ATTN_BLOCK), m = i1 - i0;
        int js = ds ? ds[i0] : 0, nk = i1 - js; // keys [js, i1)
        const real *qi = q + (size_t)i0 * ldq, *doi = dout + (size_t)i0 * ldq;
        const real *kj = k + (size_t)js * ldk, *vj = v + (size_t)js * ldk;
        // S (m, nk) = scale * Q[i0:i1] K[js:i1]^T, into P
        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, D, scale, qi, ldq, kj, ldk, 0, P, T);
        // dP (m, nk) = dO[i0:i1] V[js:i1]^T
        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, D, 1, doi, ldq, vj, ldk, 0, dP, T);
        for (int i = i0; i < i1; i++) {
            real *p = P + (size_t)(i - i0) * T, *dp = dP + (size_t)(i - i0) * T;
            const real *oi = o + (size_t)i * ldq, *g = dout + (size_t)i * ldq;
            int lo = ds ? ds[i] - js : 0, hi = i - js;
            accreal Di = 0;
#pragma omp simd reduction(+ : Di)
            for (int d = 0; d < D; d++) Di += (accreal)g[d] * oi[d];
            real li = l[i], di = (real)Di;
#pragma omp simd
            for (int j = lo; j <= hi; j++) {
                p[j] = EXP(p[j] - li);
                dp[j] = p[j] * (dp[j] - di); // dS
            }
            for (int j = 0; j < lo; j++) p[j] = dp[j] = 0;
            for (int j = hi + 1; j < nk; j++) p[j] = dp[j] = 0;
        }
        // dQ[i0:i1] (m, D) = scale * dS (m, nk) K[js:i1] (nk, D)
        GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, nk, scale, dP, T, kj, ldk, 0,
             dq + (size_t)i0 * ldq, ldq);
        // dK[js:i1] (nk, D) += scale * dS^T (nk, m) Q[i0:i1] (m, D)
        GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, m, scale, dP, T, qi, ldq, 1,
             dk + (size_t)js * ldk, ldk);
        // dV[js:i1] (nk, D) += P^T (nk, m) dO[i0:i1] (m, D)
        GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, m, 1, P, T, doi, ldq, 1,
             dv + (size_t)js * ldk, ldk);
    }
}

// dq (B, T, H, D) =, dk, dv (B, T, Hkv, D) = gradients of the forward given
// dout (B, T, H, D), the forward's out and lse. Parallel over (b, kv head):
// one thread owns dk, dv of its kv head and loops over the H / Hkv query
// heads that read it, so nothing races.
static void FN(attention_backward)(real *dq, real *dk, real *dv, const real *dout, const real *q,
                                   const real *k, const real *v, const real *out,
                                   const real *lse, const int32_t *doc_start, int B, int T, int H,
                                   int Hkv, int D, real *scratch) {
    int G = H / Hkv;
    int ldq = H * D, ldk = Hkv * D;
#pragma omp parallel for schedule(static)
    for (int bk = 0; bk < B * Hkv; bk++) {
        int b = bk / Hkv, hk = bk % Hkv;
        real *P = scratch + (size_t)omp_get_thread_num() * 2 * ATTN_BLOCK * T;
        size_t koff = (size_t)b * T * ldk + (size_t)hk * D;
        for (int t = 0; t < T; t++) {
            memset(dk + koff + (size_t)t * ldk, 0, (size_t)D * sizeof(real));
            memset(dv + koff + (size_t)t * ldk, 0, (size_t)D * sizeof(real));
        }
        for (int h = hk * G; h < (hk + 1) * G; h++) {
            size_t off = (size_t)b * T * ldq + (size_t)h * D;
            FN(attention_head_backward)(dq + off, q + off, out + off, dout + off, ldq, dk + koff,
                                        dv + koff, k + koff, v + koff, ldk,
                                        lse + ((size_t)b * H + h) * T,
                                        doc_start ? doc_start + (size_t)b * T : NULL, T, D, P);
        }
    }
}

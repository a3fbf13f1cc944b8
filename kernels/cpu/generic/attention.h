// generic/attention.h: causal grouped-query attention, forward and backward,
// instantiated by cpu_attention.c (see cpu.h).
//
// Per (batch b, query head h) the scores are computed in row blocks of
// ATTN_BLOCK queries: block [i0, i1) only needs keys [0, i1) (causal), so the
// GEMMs skip most of the masked upper triangle. Matrices are read in place
// from the (B, T, H, D) / (B, T, Hkv, D) layouts with leading dimension H*D or
// Hkv*D; nothing is transposed or copied. BLAS calls run inside the OpenMP
// region and are single-threaded there (see cpu_backend.c).
//
// scratch: per thread 2 * ATTN_BLOCK * T reals (one score block, one dP
// block), indexed by omp_get_thread_num(); the caller provides it.

// out (B, T, H, D) = softmax(q k^T / sqrt(D) + causal mask) v; lse (B, H, T)
// = log-sum-exp of each scaled score row. q: (B, T, H, D); k, v: (B, T, Hkv,
// D); query head h reads kv head h / (H / Hkv). Math: Vaswani et al. 2017
// eq. 1; GQA: Ainslie et al. 2023; as torch scaled_dot_product_attention with
// is_causal=True.
static void FN(attention_forward)(real *out, real *lse, const real *q, const real *k,
                                  const real *v, int B, int T, int H, int Hkv, int D,
                                  real *scratch) {
    int G = H / Hkv;
    int ldq = H * D, ldk = Hkv * D;
    real scale = (real)(1.0 / sqrt((double)D));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, hk = h / G;
        real *S = scratch + (size_t)omp_get_thread_num() * 2 * ATTN_BLOCK * T; // (ATTN_BLOCK, T)
        const real *qb = q + (size_t)b * T * ldq + (size_t)h * D;
        const real *kb = k + (size_t)b * T * ldk + (size_t)hk * D;
        const real *vb = v + (size_t)b * T * ldk + (size_t)hk * D;
        real *ob = out + (size_t)b * T * ldq + (size_t)h * D;
        real *lb = lse + ((size_t)b * H + h) * T;
        for (int i0 = 0; i0 < T; i0 += ATTN_BLOCK) {
            int i1 = MIN(T, i0 + ATTN_BLOCK), m = i1 - i0;
            // S (m, i1) = scale * Q[i0:i1] K[0:i1]^T
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, D, scale, qb + (size_t)i0 * ldq,
                 ldq, kb, ldk, 0, S, T);
            for (int i = i0; i < i1; i++) {
                real *s = S + (size_t)(i - i0) * T;
                real mx = s[0];
#pragma omp simd reduction(max : mx)
                for (int j = 1; j <= i; j++) mx = s[j] > mx ? s[j] : mx;
                accreal sum = 0;
#pragma omp simd reduction(+ : sum)
                for (int j = 0; j <= i; j++) {
                    s[j] = EXP(s[j] - mx);
                    sum += s[j];
                }
                real inv = (real)(1.0 / sum);
                for (int j = 0; j <= i; j++) s[j] *= inv;
                for (int j = i + 1; j < i1; j++) s[j] = 0; // masked: P = 0
                lb[i] = (real)(mx + log(sum));
            }
            // O[i0:i1] (m, D) = P (m, i1) V[0:i1] (i1, D)
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, i1, 1, S, T, vb, ldk, 0,
                 ob + (size_t)i0 * ldq, ldq);
        }
    }
}

// dq (B, T, H, D) =, dk, dv (B, T, Hkv, D) = gradients of the forward given
// dout (B, T, H, D), the forward's out and lse. P is recomputed from q, k and
// lse (FlashAttention, Dao et al. 2022, alg. 2 / 4):
//   P = exp(S - lse), dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
//   dQ = scale dS K, dK += scale dS^T Q, dV += P^T dO.
// Parallel over (b, kv head): one thread owns dk, dv of its kv head and loops
// over the H / Hkv query heads that read it, so nothing races.
static void FN(attention_backward)(real *dq, real *dk, real *dv, const real *dout, const real *q,
                                   const real *k, const real *v, const real *out,
                                   const real *lse, int B, int T, int H, int Hkv, int D,
                                   real *scratch) {
    int G = H / Hkv;
    int ldq = H * D, ldk = Hkv * D;
    real scale = (real)(1.0 / sqrt((double)D));
#pragma omp parallel for schedule(static)
    for (int bk = 0; bk < B * Hkv; bk++) {
        int b = bk / Hkv, hk = bk % Hkv;
        real *P = scratch + (size_t)omp_get_thread_num() * 2 * ATTN_BLOCK * T; // (ATTN_BLOCK, T)
        real *dP = P + (size_t)ATTN_BLOCK * T;                                  // (ATTN_BLOCK, T)
        const real *kb = k + (size_t)b * T * ldk + (size_t)hk * D;
        const real *vb = v + (size_t)b * T * ldk + (size_t)hk * D;
        real *dkb = dk + (size_t)b * T * ldk + (size_t)hk * D;
        real *dvb = dv + (size_t)b * T * ldk + (size_t)hk * D;
        for (int t = 0; t < T; t++) {
            memset(dkb + (size_t)t * ldk, 0, (size_t)D * sizeof(real));
            memset(dvb + (size_t)t * ldk, 0, (size_t)D * sizeof(real));
        }
        for (int h = hk * G; h < (hk + 1) * G; h++) {
            size_t off = (size_t)b * T * ldq + (size_t)h * D;
            const real *qb = q + off, *ob = out + off, *dob = dout + off;
            real *dqb = dq + off;
            const real *lb = lse + ((size_t)b * H + h) * T;
            for (int i0 = 0; i0 < T; i0 += ATTN_BLOCK) {
                int i1 = MIN(T, i0 + ATTN_BLOCK), m = i1 - i0;
                const real *qi = qb + (size_t)i0 * ldq, *doi = dob + (size_t)i0 * ldq;
                // S (m, i1) = scale * Q[i0:i1] K[0:i1]^T, into P
                GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, D, scale, qi, ldq, kb, ldk, 0,
                     P, T);
                // dP (m, i1) = dO[i0:i1] V[0:i1]^T
                GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, D, 1, doi, ldq, vb, ldk, 0,
                     dP, T);
                for (int i = i0; i < i1; i++) {
                    real *p = P + (size_t)(i - i0) * T, *dp = dP + (size_t)(i - i0) * T;
                    const real *o = ob + (size_t)i * ldq, *g = dob + (size_t)i * ldq;
                    accreal Di = 0;
#pragma omp simd reduction(+ : Di)
                    for (int d = 0; d < D; d++) Di += (accreal)g[d] * o[d];
                    real l = lb[i], di = (real)Di;
#pragma omp simd
                    for (int j = 0; j <= i; j++) {
                        p[j] = EXP(p[j] - l);
                        dp[j] = p[j] * (dp[j] - di); // dS
                    }
                    for (int j = i + 1; j < i1; j++) p[j] = dp[j] = 0;
                }
                // dQ[i0:i1] (m, D) = scale * dS (m, i1) K[0:i1] (i1, D)
                GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, i1, scale, dP, T, kb, ldk, 0,
                     dqb + (size_t)i0 * ldq, ldq);
                // dK[0:i1] (i1, D) += scale * dS^T (i1, m) Q[i0:i1] (m, D)
                GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, i1, D, m, scale, dP, T, qi, ldq, 1,
                     dkb, ldk);
                // dV[0:i1] (i1, D) += P^T (i1, m) dO[i0:i1] (m, D)
                GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, i1, D, m, 1, P, T, doi, ldq, 1, dvb,
                     ldk);
            }
        }
    }
}

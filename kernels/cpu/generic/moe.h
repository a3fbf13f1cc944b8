// generic/moe.h: the mixture-of-experts ops' bodies (kernels/ops.h, "mixture
// of experts"), instantiated by cpu_moe.c for FP32, FP64, BF16 and FP16. The
// routing bodies work on the statistics dtype (creal: FP32, FP64 for FP64)
// and exist in the FP32 and FP64 instantiations only (#if !LOWP). Loops run
// over tokens or rows, each output element with one owner, so results do not
// depend on the thread count. Shapes as kernels/ops.h.

#if !LOWP
// One token's routing: softmax of l (E,) into p, its logsumexp, and the k
// largest keys p[e] + bias[e] (bias NULL: none), descending, ties to the
// lower index (a selection pass per slot: E and k are small).
static void FN(moe_route_row)(creal *p, creal *lse, int32_t *idx, creal *w, const creal *l,
                              const creal *bias, int E, int k, bool renorm) {
    creal mx = l[0];
    for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    accreal sum = 0;
    for (int e = 0; e < E; e++) sum += (accreal)(p[e] = EXP(l[e] - mx));
    for (int e = 0; e < E; e++) p[e] = (creal)(p[e] / sum);
    *lse = (creal)(mx + log(sum));
    accreal wsum = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        creal key = 0;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int m = 0; m < j; m++) taken |= idx[m] == e;
            creal ke = bias ? p[e] + bias[e] : p[e];
            if (!taken && (best < 0 || ke > key)) best = e, key = ke;
        }
        idx[j] = best;
        w[j] = p[best];
        wsum += p[best];
    }
    if (renorm)
        for (int j = 0; j < k; j++) w[j] = (creal)(w[j] / wsum);
}

static void FN(moe_route)(creal *probs, creal *lse, int32_t *topk_idx, creal *topk_w,
                          double *stats, const creal *logits, const creal *bias, int N, int E,
                          int k, bool renorm) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        FN(moe_route_row)(probs + (size_t)t * E, lse + t, topk_idx + (size_t)t * k,
                          topk_w + (size_t)t * k, logits + (size_t)t * E, bias, E, k, renorm);
    // column sums over tokens in token order (one owner per column)
#pragma omp parallel for schedule(static)
    for (int e = 0; e <= E; e++) {
        double s = 0;
        if (e < E)
            for (int t = 0; t < N; t++) s += probs[(size_t)t * E + e];
        else
            for (int t = 0; t < N; t++) s += (double)lse[t] * lse[t];
        stats[e] = s;
    }
}

// dlogits row t = p (dp - <p, dp>) + z_scale lse p, dp[e] = aux_w[e] + the
// slots' ds_j at e (ds_j = dw_j, or (dw_j - sum_m dw_m w_m) / S with renorm,
// s_j = p[idx_j], S = sum_j s_j, w_m = s_m / S).
static void FN(moe_route_backward)(creal *dlogits, const creal *dw, const creal *probs,
                                   const creal *lse, const int32_t *topk_idx, const creal *aux_w,
                                   int N, int E, int k, bool renorm, creal z_scale) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const creal *p = probs + (size_t)t * E, *dwt = dw + (size_t)t * k;
        const int32_t *idx = topk_idx + (size_t)t * k;
        creal *dl = dlogits + (size_t)t * E;
        for (int e = 0; e < E; e++) dl[e] = aux_w ? aux_w[e] : 0; // dl holds dp first
        accreal S = 0, dot = 0;
        for (int j = 0; j < k; j++) S += p[idx[j]];
        for (int j = 0; j < k; j++) dot += (accreal)dwt[j] * (p[idx[j]] / S);
        for (int j = 0; j < k; j++)
            dl[idx[j]] += renorm ? (creal)((dwt[j] - dot) / S) : dwt[j];
        accreal pdp = 0;
        for (int e = 0; e < E; e++) pdp += (accreal)p[e] * dl[e];
        for (int e = 0; e < E; e++)
            dl[e] = (creal)(p[e] * ((accreal)dl[e] - pdp) + (accreal)z_scale * lse[t] * p[e]);
    }
}
#endif

// xp row r = x row src[r] / k.
static void FN(moe_permute)(real *xp, const real *x, const int32_t *src, int M, int C, int k) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++)
        memcpy(xp + (size_t)r * C, x + (size_t)(src[r] / k) * C, (size_t)C * sizeof(real));
}

// dx row t += sum over kept slots j of dxp row dest[t k + j].
static void FN(moe_permute_backward)(real *dx, const real *dxp, const int32_t *dest, int N,
                                     int C, int k) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        real *d = dx + (size_t)t * C;
        for (int c = 0; c < C; c++) { // the slots' sum, then one add (one rounding)
            creal s = 0;
            for (int j = 0; j < k; j++) {
                int r = dest[(size_t)t * k + j];
                if (r >= 0) s += LD(dxp[(size_t)r * C + c]);
            }
            d[c] = ST(LD(d[c]) + s);
        }
    }
}

static inline creal FN(moe_gate)(creal w, bool sigmoid) {
    return sigmoid ? 1 / (1 + EXP(-w)) : w;
}

// y row t (+)= sum_j g(w[t k + j]) yp row r(t k + j).
static void FN(moe_combine)(real *y, const real *yp, const creal *w, const int32_t *dest, int N,
                            int C, int k, bool sigmoid, bool accumulate) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        real *yt = y + (size_t)t * C;
        creal g[k > 0 ? k : 1];
        int rows[k > 0 ? k : 1];
        for (int j = 0; j < k; j++) {
            size_t a = (size_t)t * k + j;
            rows[j] = dest ? dest[a] : (int)a;
            g[j] = FN(moe_gate)(w[a], sigmoid);
        }
        for (int c = 0; c < C; c++) {
            creal s = 0;
            for (int j = 0; j < k; j++)
                if (rows[j] >= 0) s += g[j] * LD(yp[(size_t)rows[j] * C + c]);
            yt[c] = ST(accumulate ? LD(yt[c]) + s : s);
        }
    }
}

// dyp row r(a) = g(w[a]) dy row a / k; dw[a] = g'(w[a]) <dy row, yp row>.
static void FN(moe_combine_backward)(real *dyp, creal *dw, const real *dy, const real *yp,
                                     const creal *w, const int32_t *dest, int N, int C, int k,
                                     bool sigmoid) {
#pragma omp parallel for schedule(static)
    for (size_t a = 0; a < (size_t)N * k; a++) {
        int r = dest ? dest[a] : (int)a;
        if (r < 0) {
            dw[a] = 0;
            continue;
        }
        const real *dyt = dy + (a / k) * C, *ypr = yp + (size_t)r * C;
        creal g = FN(moe_gate)(w[a], sigmoid);
        accreal dot = 0;
        for (int c = 0; c < C; c++) {
            dot += (accreal)LD(dyt[c]) * LD(ypr[c]);
            dyp[(size_t)r * C + c] = ST(g * LD(dyt[c]));
        }
        dw[a] = (creal)(sigmoid ? dot * g * (1 - g) : dot);
    }
}

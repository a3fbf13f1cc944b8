// generic/attention_decode.h: the body of attention against a key/value cache
// (kernels/ops.h, backend_attention_decode), instantiated by
// cpu_attention_decode.c for FP32, FP64, BF16 and FP16 (see cpu.h). Each
// query row is independent: its scores over the causal keys of its cache row,
// softmax and weighted sum of the values, in creal; out rounded once. A
// row's sums run in an order set by D and its position alone (not by the
// step's shape, the thread, or an address's alignment), so a step of one
// token computes the row as a step over the whole window does (generation's
// batch invariance, model.h): each score is DECODE_LANES partial sums of
// q_e k_e (lane l takes e = l, l + DECODE_LANES, ...), added by a fixed
// tree; the softmax sum and the values' weighted sum run over keys in order.

#ifndef DECODE_LANES
#define DECODE_LANES 16
// lanes (DECODE_LANES,) added pairwise: halves, then quarters, ...
#define DECODE_LANES_SUM(l)                                                    \
    ((((l[0] + l[8]) + (l[4] + l[12])) + ((l[2] + l[10]) + (l[6] + l[14]))) + \
     (((l[1] + l[9]) + (l[5] + l[13])) + ((l[3] + l[11]) + (l[7] + l[15]))))
#endif

// q (D,) . k (D,) in DECODE_LANES lanes, as above.
static inline creal FN(decode_dot)(const real *q, const real *k, int D) {
    creal l[DECODE_LANES] = {0};
    int e0 = 0;
    for (; e0 + DECODE_LANES <= D; e0 += DECODE_LANES)
        for (int e = 0; e < DECODE_LANES; e++) l[e] = FMA(LD(q[e0 + e]), LD(k[e0 + e]), l[e]);
    for (int e = 0; e0 + e < D; e++) l[e] = FMA(LD(q[e0 + e]), LD(k[e0 + e]), l[e]);
    return DECODE_LANES_SUM(l);
}

// Writes k, v (B, Tq, Hkv, D) into the caches (B, Tmax, Hkv, D) at rows
// pos[b] + t, then out (B, Tq, H, D) from q against the caches. Work units:
// the heads of a query row cut into hc chunks (hc > 1 when the rows are
// fewer than the threads); a unit walks its keys (and then its values) in
// position order, all its heads at each position, so the cache row is read
// front to back once (the heads of a position are consecutive). scratch:
// H (Tmax + D + 2) creals per OpenMP thread.
static void FN(attention_decode)(real *out, const real *q, const real *k, const real *v,
                                 real *k_cache, real *v_cache, const int32_t *pos, int B, int Tq,
                                 int Tmax, int H, int Hkv, int D, int hc, creal *scratch) {
    size_t ldk = (size_t)Hkv * D, ldq = (size_t)H * D;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tq; t++) {
            size_t dst = ((size_t)b * Tmax + pos[b] + t) * ldk, src = ((size_t)b * Tq + t) * ldk;
            memcpy(k_cache + dst, k + src, ldk * sizeof(real));
            memcpy(v_cache + dst, v + src, ldk * sizeof(real));
        }
    int G = H / Hkv;
    creal scale = 1 / SQRT((creal)D);
#pragma omp parallel for schedule(static)
    for (int u = 0; u < B * Tq * hc; u++) {
        int row = u / hc, c = u % hc, b = row / Tq, p = pos[b] + row % Tq;
        int h0 = (int)((long)c * H / hc), h1 = (int)((long)(c + 1) * H / hc), nh = h1 - h0;
        creal *s = scratch + (size_t)omp_get_thread_num() * H * (Tmax + D + 2); // (nh, Tmax)
        creal *acc = s + (size_t)nh * Tmax, *mx = acc + (size_t)nh * D, *sum = mx + nh;
        const real *qr = q + (size_t)row * ldq + (size_t)h0 * D;
        const real *kb = k_cache + (size_t)b * Tmax * ldk, *vb = v_cache + (size_t)b * Tmax * ldk;
        for (int h = 0; h < nh; h++) mx[h] = -INFINITY, sum[h] = 0;
        for (int j = 0; j <= p; j++) {
            const real *kj = kb + (size_t)j * ldk;
            for (int h = 0; h < nh; h++) {
                creal x = FN(decode_dot)(qr + (size_t)h * D, kj + (size_t)((h0 + h) / G) * D, D) * scale;
                s[(size_t)h * Tmax + j] = x;
                mx[h] = x > mx[h] ? x : mx[h];
            }
        }
        for (size_t e = 0; e < (size_t)nh * D; e++) acc[e] = 0;
        for (int j = 0; j <= p; j++) {
            const real *vj = vb + (size_t)j * ldk;
            for (int h = 0; h < nh; h++) {
                creal w = EXP(s[(size_t)h * Tmax + j] - mx[h]), *ah = acc + (size_t)h * D;
                const real *vh = vj + (size_t)((h0 + h) / G) * D;
                sum[h] += w;
                for (int e = 0; e < D; e++) ah[e] = FMA(w, LD(vh[e]), ah[e]);
            }
        }
        real *o = out + (size_t)row * ldq + (size_t)h0 * D;
        for (int h = 0; h < nh; h++)
            for (int e = 0; e < D; e++) o[(size_t)h * D + e] = ST(acc[(size_t)h * D + e] / sum[h]);
    }
}

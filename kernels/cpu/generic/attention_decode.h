// generic/attention_decode.h: the body of attention against a key/value cache
// (kernels/ops.h, backend_attention_decode), instantiated by
// cpu_attention_decode.c for FP32, FP64, BF16 and FP16 (see cpu.h). Each
// query row is independent: its scores over the causal keys of its cache row,
// softmax and weighted sum of the values, in creal; out rounded once.

// Writes k, v (B, Tq, Hkv, D) into the caches (B, Tmax, Hkv, D) at rows
// pos[b] + t, then out (B, Tq, H, D) from q against the caches. scratch:
// (Tmax + D) creals per OpenMP thread.
static void FN(attention_decode)(real *out, const real *q, const real *k, const real *v,
                                 real *k_cache, real *v_cache, const int32_t *pos, int B, int Tq,
                                 int Tmax, int H, int Hkv, int D, creal *scratch) {
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
    for (int i = 0; i < B * Tq * H; i++) {
        int b = i / (Tq * H), t = i / H % Tq, h = i % H, p = pos[b] + t;
        creal *s = scratch + (size_t)omp_get_thread_num() * (Tmax + D), *acc = s + Tmax;
        const real *qi = q + (size_t)(b * Tq + t) * ldq + (size_t)h * D;
        const real *kb = k_cache + (size_t)b * Tmax * ldk + (size_t)(h / G) * D;
        const real *vb = v_cache + (size_t)b * Tmax * ldk + (size_t)(h / G) * D;
        creal mx = -INFINITY, sum = 0;
        for (int j = 0; j <= p; j++) {
            const real *kj = kb + (size_t)j * ldk;
            creal d = 0;
            for (int e = 0; e < D; e++) d += LD(qi[e]) * LD(kj[e]);
            s[j] = d * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int e = 0; e < D; e++) acc[e] = 0;
        for (int j = 0; j <= p; j++) {
            creal w = EXP(s[j] - mx);
            const real *vj = vb + (size_t)j * ldk;
            sum += w;
            for (int e = 0; e < D; e++) acc[e] += w * LD(vj[e]);
        }
        real *o = out + (size_t)(b * Tq + t) * ldq + (size_t)h * D;
        for (int e = 0; e < D; e++) o[e] = ST(acc[e] / sum);
    }
}

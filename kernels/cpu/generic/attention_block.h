// generic/attention_block.h: one block of context-parallel ring attention
// (kernels/ops.h, backend_attention_block_forward / _backward), instantiated
// by cpu_attention_block.c for every storage dtype. The plain version: one
// query row (forward, dq) or one key row (dk, dv) at a time, dot products in
// creal, keys a query cannot read skipped by the mask test.
//
// scratch: per thread 2 * D creal (one output row's accumulators), indexed
// by omp_get_thread_num(); the caller provides it.

// out (B, Tq, H, D), lse (B, H, Tq) = this block's attention, or merged into
// them (accumulate); kernels/ops.h. Parallel over (b, query head).
static void FN(attention_block_forward)(real *out, creal *lse, const real *q, const real *k,
                                        const real *v, const int32_t *q_pos,
                                        const int32_t *q_doc, const int32_t *k_pos, int B, int Tq,
                                        int Tk, int H, int Hkv, int D, bool accumulate,
                                        creal *scratch) {
    int G = H / Hkv;
    creal scale = (creal)(1.0 / sqrt((double)D));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, hk = h / G;
        creal *o = scratch + (size_t)omp_get_thread_num() * 2 * D; // (D,)
        for (int i = 0; i < Tq; i++) {
            const real *qi = q + (((size_t)b * Tq + i) * H + h) * D;
            real *oi = out + (((size_t)b * Tq + i) * H + h) * D;
            creal *li = lse + ((size_t)b * H + h) * Tq + i;
            int lo = q_doc ? q_doc[(size_t)b * Tq + i] : 0, hi = q_pos[(size_t)b * Tq + i];
            creal mx = -INFINITY;
            for (int j = 0; j < Tk; j++) {
                int p = k_pos[(size_t)b * Tk + j];
                if (p < lo || p > hi) continue;
                const real *kj = k + (((size_t)b * Tk + j) * Hkv + hk) * D;
                creal s = 0;
                for (int d = 0; d < D; d++) s += LD(qi[d]) * LD(kj[d]);
                s *= scale;
                mx = s > mx ? s : mx;
            }
            if (mx == -INFINITY) { // no readable key in this block
                if (!accumulate) {
                    for (int d = 0; d < D; d++) oi[d] = ST(0);
                    *li = -INFINITY;
                }
                continue;
            }
            for (int d = 0; d < D; d++) o[d] = 0;
            accreal sum = 0;
            for (int j = 0; j < Tk; j++) {
                int p = k_pos[(size_t)b * Tk + j];
                if (p < lo || p > hi) continue;
                const real *kj = k + (((size_t)b * Tk + j) * Hkv + hk) * D;
                const real *vj = v + (((size_t)b * Tk + j) * Hkv + hk) * D;
                creal s = 0;
                for (int d = 0; d < D; d++) s += LD(qi[d]) * LD(kj[d]);
                creal e = EXP(s * scale - mx);
                sum += e;
                for (int d = 0; d < D; d++) o[d] += e * LD(vj[d]);
            }
            creal lb = (creal)(mx + log(sum)), old = *li;
            if (accumulate && old != -INFINITY) {
                // lse' = logaddexp(old, lb); out' = out e^(old - lse') + o/sum e^(lb - lse')
                creal hi2 = old > lb ? old : lb, lo2 = old > lb ? lb : old;
                creal ln = (creal)(hi2 + log1p(exp((double)(lo2 - hi2))));
                creal a = EXP(old - ln), c = (creal)(EXP(lb - ln) / sum);
                for (int d = 0; d < D; d++) oi[d] = ST(LD(oi[d]) * a + o[d] * c);
                *li = ln;
            } else {
                creal inv = (creal)(1.0 / sum);
                for (int d = 0; d < D; d++) oi[d] = ST(o[d] * inv);
                *li = lb;
            }
        }
    }
}

// dq +=, dk +=, dv += this block's gradients (kernels/ops.h). Two passes,
// each output row with one owner: dq parallel over (b, query head), dk and dv
// over (b, kv head) summing the group's query heads; each accumulates its
// row in creal and adds it to the stored value once.
static void FN(attention_block_backward)(real *dq, real *dk, real *dv, const real *dout,
                                         const real *q, const real *k, const real *v,
                                         const real *out, const creal *lse, const int32_t *q_pos,
                                         const int32_t *q_doc, const int32_t *k_pos, int B,
                                         int Tq, int Tk, int H, int Hkv, int D, creal *scratch) {
    int G = H / Hkv;
    creal scale = (creal)(1.0 / sqrt((double)D));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, hk = h / G;
        creal *g = scratch + (size_t)omp_get_thread_num() * 2 * D; // (D,) dq row
        for (int i = 0; i < Tq; i++) {
            size_t qi0 = (((size_t)b * Tq + i) * H + h) * D;
            creal li = lse[((size_t)b * H + h) * Tq + i];
            int lo = q_doc ? q_doc[(size_t)b * Tq + i] : 0, hi = q_pos[(size_t)b * Tq + i];
            if (li == -INFINITY) continue;
            accreal Di = 0;
            for (int d = 0; d < D; d++) Di += (accreal)LD(dout[qi0 + d]) * LD(out[qi0 + d]);
            bool any = false;
            for (int d = 0; d < D; d++) g[d] = 0;
            for (int j = 0; j < Tk; j++) {
                int p = k_pos[(size_t)b * Tk + j];
                if (p < lo || p > hi) continue;
                size_t kj0 = (((size_t)b * Tk + j) * Hkv + hk) * D;
                creal s = 0, dp = 0;
                for (int d = 0; d < D; d++) {
                    s += LD(q[qi0 + d]) * LD(k[kj0 + d]);
                    dp += LD(dout[qi0 + d]) * LD(v[kj0 + d]);
                }
                creal pr = EXP(s * scale - li), ds = pr * (dp - (creal)Di);
                for (int d = 0; d < D; d++) g[d] += ds * LD(k[kj0 + d]);
                any = true;
            }
            if (any)
                for (int d = 0; d < D; d++) dq[qi0 + d] = ST(LD(dq[qi0 + d]) + scale * g[d]);
        }
    }
#pragma omp parallel for schedule(static)
    for (int bk = 0; bk < B * Hkv; bk++) {
        int b = bk / Hkv, hk = bk % Hkv;
        creal *gk = scratch + (size_t)omp_get_thread_num() * 2 * D, *gv = gk + D;
        for (int j = 0; j < Tk; j++) {
            size_t kj0 = (((size_t)b * Tk + j) * Hkv + hk) * D;
            int p = k_pos[(size_t)b * Tk + j];
            bool any = false;
            for (int d = 0; d < D; d++) gk[d] = gv[d] = 0;
            for (int h = hk * G; h < (hk + 1) * G; h++)
                for (int i = 0; i < Tq; i++) {
                    int lo = q_doc ? q_doc[(size_t)b * Tq + i] : 0, hi = q_pos[(size_t)b * Tq + i];
                    creal li = lse[((size_t)b * H + h) * Tq + i];
                    if (p < lo || p > hi || li == -INFINITY) continue;
                    size_t qi0 = (((size_t)b * Tq + i) * H + h) * D;
                    accreal Di = 0;
                    creal s = 0, dp = 0;
                    for (int d = 0; d < D; d++) {
                        Di += (accreal)LD(dout[qi0 + d]) * LD(out[qi0 + d]);
                        s += LD(q[qi0 + d]) * LD(k[kj0 + d]);
                        dp += LD(dout[qi0 + d]) * LD(v[kj0 + d]);
                    }
                    creal pr = EXP(s * scale - li), ds = pr * (dp - (creal)Di);
                    for (int d = 0; d < D; d++) {
                        gk[d] += ds * LD(q[qi0 + d]);
                        gv[d] += pr * LD(dout[qi0 + d]);
                    }
                    any = true;
                }
            if (any)
                for (int d = 0; d < D; d++) {
                    dk[kj0 + d] = ST(LD(dk[kj0 + d]) + scale * gk[d]);
                    dv[kj0 + d] = ST(LD(dv[kj0 + d]) + gv[d]);
                }
        }
    }
}

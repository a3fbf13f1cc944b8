// generic/norm.h: RMSNorm, embedding and RoPE bodies, instantiated by
// cpu_norm.c for FP32, FP64, BF16 and FP16 (see cpu.h). OpenMP loops run over rows; reductions over rows
// (dw, dwte) run over column blocks instead, so that each output element has
// one owner and the sum order is fixed (results do not depend on threads).

// Columns per block of a reduction over rows.
#ifndef NORM_COL_BLOCK
#define NORM_COL_BLOCK 64
#endif

// y (N, C) = x * rstd * w, rstd (N,) = 1 / sqrt(mean(x^2) + eps).
// x: (N, C); w: (C,). Math: Zhang & Sennrich 2019 eq. 4; as torch
// LlamaRMSNorm, the mean of squares is taken in the accumulation type (double
// here) and y = w * (x * rstd).
static void FN(rmsnorm_row)(real *yi, creal *rstd_i, const real *xi, const real *w, int C,
                            creal eps) {
    accreal ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < C; j++) ss += (accreal)LD(xi[j]) * LD(xi[j]);
    creal r = (creal)(1.0 / sqrt(ss / C + (accreal)eps));
    *rstd_i = r;
    for (int j = 0; j < C; j++) yi[j] = ST(LD(w[j]) * (LD(xi[j]) * r));
}

static void FN(rmsnorm_forward)(real *y, creal *rstd, const real *x, const real *w, int N, int C,
                                creal eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        FN(rmsnorm_row)(y + (size_t)i * C, rstd + i, x + (size_t)i * C, w, C, eps);
}

// xout (N, C) = a + b (as FN(add)), then the rows of rmsnorm_forward on
// xout: the bits of the two ops in turn (the specification of the fused
// CUDA kernel). xout may alias a or b.
static void FN(add_rmsnorm_forward)(real *xout, real *y, creal *rstd, const real *a,
                                    const real *b, const real *w, int N, int C, creal eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        size_t o = (size_t)i * C;
        for (int j = 0; j < C; j++) xout[o + j] = ST(LD(a[o + j]) + LD(b[o + j]));
        FN(rmsnorm_row)(y + o, rstd + i, xout + o, w, C, eps);
    }
}

// dx (N, C) += w * dy * r - x * r^3 / C * sum_k(dy_k w_k x_k) per row;
// dw (C,) += sum over rows of dy * x * r. dy, x: (N, C); w: (C,); rstd (N,)
// from the forward (r). Derivation: dr/dx_j = -r^3 x_j / C. dw has dtype dw_dtype
// (creal's, or the storage dtype: cpu_grad_add).
static void FN(rmsnorm_backward)(real *dx, void *dw, enum dtype dw_dtype, const real *dy,
                                 const real *x, const real *w, const creal *rstd, int N, int C) {
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int i = 0; i < N; i++) {
            const real *dyi = dy + (size_t)i * C, *xi = x + (size_t)i * C;
            real *dxi = dx + (size_t)i * C;
            creal r = rstd[i];
            accreal dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j < C; j++) dot += (accreal)LD(dyi[j]) * LD(w[j]) * LD(xi[j]);
            creal k = (creal)(dot * r * r * r / C);
            for (int j = 0; j < C; j++)
                dxi[j] = ST(LD(dxi[j]) + (LD(w[j]) * LD(dyi[j]) * r - LD(xi[j]) * k));
        }
#pragma omp for schedule(static)
        for (int j0 = 0; j0 < C; j0 += NORM_COL_BLOCK) {
            int nj = MIN(NORM_COL_BLOCK, C - j0);
            accreal acc[NORM_COL_BLOCK] = {0};
            for (int i = 0; i < N; i++) {
                const real *dyi = dy + (size_t)i * C + j0, *xi = x + (size_t)i * C + j0;
                accreal r = rstd[i];
                for (int j = 0; j < nj; j++) acc[j] += (accreal)LD(dyi[j]) * LD(xi[j]) * r;
            }
            for (int j = 0; j < nj; j++) cpu_grad_add(dw, dw_dtype, (size_t)j0 + j, acc[j]);
        }
    }
}

// out (N, C) = wte (Vl, C) row tokens[i] - vocab_start when this shard owns
// the token, else zeros. tokens: (N,) global ids. Megatron VocabParallelEmbedding.
static void FN(embedding_forward)(real *out, const real *wte, const int32_t *tokens, int N, int C,
                                  int vocab_start, int Vl) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        int row = tokens[i] - vocab_start;
        real *oi = out + (size_t)i * C;
        if (row >= 0 && row < Vl) memcpy(oi, wte + (size_t)row * C, (size_t)C * sizeof(real));
        else memset(oi, 0, (size_t)C * sizeof(real));
    }
}

// dwte (Vl, C) += dout (N, C) rows scattered to the rows of owned tokens.
// Parallel over column blocks: a repeated token never races, and each element
// sums its rows in token order. dwte has dtype dwte_dtype (creal's, or the
// storage dtype, then rounded after each row added: cpu_grad_add).
static void FN(embedding_backward)(void *dwte, enum dtype dwte_dtype, const real *dout,
                                   const int32_t *tokens, int N, int C, int vocab_start, int Vl) {
#pragma omp parallel for schedule(static)
    for (int j0 = 0; j0 < C; j0 += NORM_COL_BLOCK) {
        int nj = MIN(NORM_COL_BLOCK, C - j0);
        for (int i = 0; i < N; i++) {
            int row = tokens[i] - vocab_start;
            if (row < 0 || row >= Vl) continue;
            size_t d = (size_t)row * C + j0;
            const real *g = dout + (size_t)i * C + j0;
            for (int j = 0; j < nj; j++) cpu_grad_add(dwte, dwte_dtype, d + j, LD(g[j]));
        }
    }
}

// In place on x (B, T, Hx, D), position p = pos_offset + t - doc_start[b, t]
// (doc_start (B, T) NULL: 0), i < D/2:
//   x'[i] = x[i] c - x[i + D/2] s,  x'[i + D/2] = x[i + D/2] c + x[i] s
// with c, s = cos, sin (Tmax, D/2) at [p, i]; inverse negates s (the
// transposed rotation, i.e. the backward pass). Math: RoFormer eq. 34 in HF
// LLaMA's rotate_half layout. The tables are creal (FP32 for BF16/FP16 x).
// rope_qkv (kernels/ops.h): split (inverse false) q, k rotated and v copied
// out of the packed rows of qkv (B*T, H + 2 Hkv, D); join (inverse true) the
// packed rows from dq, dk rotated back and dv. The rotation of FN(rope).
static void FN(rope_qkv)(real *qkv, real *q, real *k, real *v, const creal *cos,
                         const creal *sin, const int32_t *doc_start, int B, int T, int H, int Hkv,
                         int D, bool inverse) {
    int half = D / 2, Hr = H + Hkv;
    size_t W = (size_t)(H + 2 * Hkv) * D, KD = (size_t)Hkv * D;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int p = bt % T - (doc_start ? doc_start[bt] : 0);
        const creal *c = cos + (size_t)p * half, *s = sin + (size_t)p * half;
        creal sign = inverse ? -1 : 1;
        real *row = qkv + (size_t)bt * W;
        for (int h = 0; h < Hr; h++) {
            real *P = row + (size_t)h * D;
            real *S = h < H ? q + ((size_t)bt * H + h) * D : k + ((size_t)bt * Hkv + h - H) * D;
            const real *src = inverse ? S : P;
            real *dst = inverse ? P : S;
            for (int i = 0; i < half; i++) {
                creal a = LD(src[i]), b = LD(src[i + half]), si = sign * s[i];
                dst[i] = ST(a * c[i] - b * si);
                dst[i + half] = ST(b * c[i] + a * si);
            }
        }
        real *pv = row + (size_t)Hr * D, *sv = v + (size_t)bt * KD;
        if (inverse) memcpy(pv, sv, KD * sizeof(real));
        else memcpy(sv, pv, KD * sizeof(real));
    }
}

static void FN(rope)(real *x, const creal *cos, const creal *sin, const int32_t *doc_start,
                     int B, int T, int Hx, int D, int pos_offset, bool inverse) {
    int half = D / 2;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int p = pos_offset + bt % T - (doc_start ? doc_start[bt] : 0);
        const creal *c = cos + (size_t)p * half, *s = sin + (size_t)p * half;
        creal sign = inverse ? -1 : 1;
        for (int h = 0; h < Hx; h++) {
            real *x1 = x + ((size_t)bt * Hx + h) * D, *x2 = x1 + half;
            for (int i = 0; i < half; i++) {
                creal a = LD(x1[i]), b = LD(x2[i]), si = sign * s[i];
                x1[i] = ST(a * c[i] - b * si);
                x2[i] = ST(b * c[i] + a * si);
            }
        }
    }
}

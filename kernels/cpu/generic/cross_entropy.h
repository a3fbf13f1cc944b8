// generic/cross_entropy.h: vocab-parallel cross-entropy pieces, instantiated
// by cpu_cross_entropy.c for FP32, FP64, BF16 and FP16 logits (see cpu.h);
// rowmax, partials, loss and lse are creal (FP32 for BF16/FP16 logits). The row loss, with s the label smoothing
// over V real classes (torch cross_entropy(label_smoothing=s)), is
//   lse_i - (1 - s) z_{i,y_i} - (s / V) sum_j z_ij.
// Only the first Vvalid of the Vl local columns are real; the others are
// never read. Megatron vocab_parallel_cross_entropy composes the pieces with a
// MAX all-reduce of rowmax and a SUM all-reduce of the partials.

// rowmax (N,) = max over columns [0, Vvalid) of logits (N, Vl); -inf when
// Vvalid == 0.
static void FN(ce_row_max)(creal *rowmax, const real *logits, int N, int Vl, int Vvalid) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const real *z = logits + (size_t)i * Vl;
        creal mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < Vvalid; j++) mx = LD(z[j]) > mx ? LD(z[j]) : mx;
        rowmax[i] = mx;
    }
}

// partials (N, 3) = [sum_j exp(z_ij - rowmax_i), z_{i,y_i} if y_i is in
// [vocab_start, vocab_start + Vvalid) else 0, sum_j z_ij] over j < Vvalid.
// rowmax (N,) is the global (all-reduced) row max; targets (N,) global ids.
static void FN(ce_partials)(creal *partials, const real *logits, const creal *rowmax,
                            const int32_t *targets, int N, int Vl, int Vvalid, int vocab_start) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const real *z = logits + (size_t)i * Vl;
        creal mx = rowmax[i];
        accreal sumexp = 0, sumz = 0;
#pragma omp simd reduction(+ : sumexp, sumz)
        for (int j = 0; j < Vvalid; j++) {
            creal zj = LD(z[j]);
            sumexp += EXP(zj - mx);
            sumz += zj;
        }
        int y = targets[i] - vocab_start;
        partials[3 * (size_t)i + 0] = (creal)sumexp;
        partials[3 * (size_t)i + 1] = y >= 0 && y < Vvalid ? LD(z[y]) : 0;
        partials[3 * (size_t)i + 2] = (creal)sumz;
    }
}

// loss (N,), lse (N,) from the reduced partials (N, 3) and rowmax (N,):
// lse_i = rowmax_i + log(partials_i0), loss_i = lse_i - (1 - s) partials_i1 -
// (s / V) partials_i2. Rows with targets[i] == ignore_index get loss 0 (and
// lse 0 when it is not finite). Returns the number of targets that are
// neither ignore_index nor in [0, V) (a bug upstream; the caller checks).
// Statistics only: FP32 and FP64 (BF16/FP16 logits have FP32 partials).
#if !LOWP
static int FN(ce_loss)(real *loss, real *lse, const real *partials, const real *rowmax,
                       const int32_t *targets, int N, int V, real smoothing, int ignore_index) {
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (int i = 0; i < N; i++) {
        const real *p = partials + 3 * (size_t)i;
        accreal l = (accreal)rowmax[i] + log((accreal)p[0]);
        if (targets[i] == ignore_index) {
            lse[i] = (real)(isfinite(l) ? l : 0);
            loss[i] = 0;
            continue;
        }
        bad += targets[i] < 0 || targets[i] >= V;
        lse[i] = (real)l;
        loss[i] = (real)(l - (1 - (accreal)smoothing) * p[1] - (accreal)smoothing / V * p[2]);
    }
    return bad;
}
#endif

// dlogits (N, Vl) = scale * (exp(z - lse) - (1 - s) onehot(y) - s / V) on
// columns j < Vvalid (global id vocab_start + j); 0 on padding columns and on
// rows with targets[i] == ignore_index. logits (N, Vl); lse (N,).
static void FN(ce_backward)(real *dlogits, const real *logits, const creal *lse,
                            const int32_t *targets, int N, int Vl, int Vvalid, int vocab_start,
                            int V, creal smoothing, int ignore_index, creal scale) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        real *dz = dlogits + (size_t)i * Vl;
        if (targets[i] == ignore_index) {
            memset(dz, 0, (size_t)Vl * sizeof(real));
            continue;
        }
        const real *z = logits + (size_t)i * Vl;
        creal l = lse[i], uniform = smoothing / V;
        int y = targets[i] - vocab_start;
#if LOWP // the target column from its unrounded value: rounded once. Its logit
         // is read before the row is written: dlogits may be logits (recompute)
        creal zy = y >= 0 && y < Vvalid ? LD(z[y]) : 0;
#endif
#pragma omp simd
        for (int j = 0; j < Vvalid; j++) dz[j] = ST(scale * (EXP(LD(z[j]) - l) - uniform));
#if LOWP
        if (y >= 0 && y < Vvalid)
            dz[y] = ST(scale * (EXP(zy - l) - uniform) - scale * (1 - smoothing));
#else
        if (y >= 0 && y < Vvalid) dz[y] -= scale * (1 - smoothing);
#endif
        for (int j = Vvalid; j < Vl; j++) dz[j] = 0;
    }
}

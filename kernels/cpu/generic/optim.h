// generic/optim.h: AdamW and the sum of squares, instantiated by
// cpu_optim.c for FP32, FP64, BF16 and FP16 (see cpu.h).

// One AdamW step on w (n,), g = grad * grad_scale (Loshchilov & Hutter 2019,
// alg. 2, in torch.optim.AdamW's single-tensor form):
//   w *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   w -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// The bias corrections are computed in double (torch: Python floats), the
// elementwise update in creal. w, grad, m, v are creal (the FP32 master
// weights and moments of BF16/FP16 params); copy (n,), when not NULL,
// receives the new w rounded to real (the working copy of the params). The
// BF16/FP16 instantiations are called with a copy only.
static void FN(adamw)(creal *w, real *copy, const creal *grad, creal *m, creal *v, size_t n,
                      double lr, double beta1, double beta2, double eps, double weight_decay,
                      double grad_scale, int step) {
    creal decay = (creal)fma(-lr, weight_decay, 1); // 1 - lr * weight_decay
    creal step_size = (creal)(lr / (1 - pow(beta1, step)));
    creal bc2_sqrt = (creal)sqrt(1 - pow(beta2, step));
    creal b1 = (creal)beta1, b2 = (creal)beta2, gs = (creal)grad_scale, e = (creal)eps;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        // cpu_optim.c is built without FMA contraction: the fused
        // multiply-adds are these explicit ones, the same in the vectorized
        // loop and its scalar remainder (those GCC's contraction chose when
        // the loop was scalar: the results did not change).
        creal g = grad[i] * gs;
        creal wi = w[i] * decay;
        creal mi = FMA(b1, m[i], (1 - b1) * g);
        creal vi = FMA(b2, v[i], (1 - b2) * g * g);
        wi -= step_size * mi / (SQRT(vi) / bc2_sqrt + e);
        m[i] = mi;
        v[i] = vi;
        w[i] = wi;
        if (copy) copy[i] = ST(wi);
    }
}

// sum_i x_i^2 over x (n,), in double. Each thread sums a fixed static chunk;
// the per-thread sums are added in thread order, so the result is the same
// for the same thread count (no atomic or unordered reduction).
static double FN(sum_squares)(const real *x, size_t n) {
    int nt = omp_get_max_threads();
    double part[nt]; // on the stack: no heap allocation per call
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), used = omp_get_num_threads();
        size_t lo = n * t / used, hi = n * (t + 1) / used;
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (size_t i = lo; i < hi; i++) s = fma((double)LD(x[i]), LD(x[i]), s);
        part[t] = s;
        if (t == 0)
            for (int u = used; u < nt; u++) part[u] = 0; // fewer threads than asked for
    }
    double total = 0;
    for (int t = 0; t < nt; t++) total += part[t];
    return total;
}

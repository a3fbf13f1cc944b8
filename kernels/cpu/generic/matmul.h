// generic/matmul.h: GEMM body, instantiated by cpu_matmul.c (see cpu.h).

// out (M, N) = alpha * op(a) (M, K) @ op(b) (K, N) + beta * out, row-major.
// a is stored (M, K), or (K, M) when trans_a; b (K, N), or (N, K) when trans_b.
// Math: BLAS xGEMM (OpenBLAS).
//
// Threads: the product is cut into one slab of rows of out (or of columns,
// when N > M) per OpenMP thread and each slab is one single-threaded GEMM
// (OpenBLAS runs single-threaded inside a parallel region). OpenBLAS's own
// threaded GEMM is not used because it mallocs its job table on every call,
// and a training step must not touch the heap after the first one. Cutting
// the larger of M and N copies the smaller operand's packing per thread.
static void FN(matmul)(real *out, const real *a, const real *b, int M, int N, int K,
                       bool trans_a, bool trans_b, real alpha, real beta) {
    if (M == 0 || N == 0) return;
    if (K == 0) { // BLAS rejects lda = 0; the product is empty, out = beta * out
        for (size_t i = 0; i < (size_t)M * N; i++) out[i] = beta == 0 ? 0 : beta * out[i];
        return;
    }
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    int lda = trans_a ? M : K, ldb = trans_b ? K : N;
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt == 1 || (double)M * N * K < MATMUL_SERIAL_WORK) {
        GEMM(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, out, N);
        return;
    }
    bool split_m = M >= N;
    int dim = split_m ? M : N;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), used = omp_get_num_threads();
        int chunk = ((dim + used - 1) / used + MATMUL_ALIGN - 1) / MATMUL_ALIGN * MATMUL_ALIGN;
        int lo = MIN(dim, t * chunk), hi = MIN(dim, lo + chunk);
        if (hi > lo && split_m) // rows [lo, hi) of out and op(a)
            GEMM(CblasRowMajor, ta, tb, hi - lo, N, K, alpha, a + (trans_a ? (size_t)lo : (size_t)lo * K),
                 lda, b, ldb, beta, out + (size_t)lo * N, N);
        else if (hi > lo) // columns [lo, hi) of out and op(b)
            GEMM(CblasRowMajor, ta, tb, M, hi - lo, K, alpha, a, lda,
                 b + (trans_b ? (size_t)lo * K : (size_t)lo), ldb, beta, out + lo, N);
    }
}

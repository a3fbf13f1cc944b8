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
//
// A product with one row or one column of out (generation's one-token steps:
// x (1, K) @ W^T, or W @ x^T) is a matrix-vector product: xGEMV over the
// matrix operand, whose rows are cut into one slab per thread. (A GEMM of one
// row still packs the whole matrix operand first: three times the memory
// traffic of the product itself, which memory bandwidth bounds.)
static void FN(matvec)(real *out, const real *a, const real *b, int M, int N, int K,
                       bool trans_a, bool trans_b, real alpha, real beta) {
    // out (R,) = alpha * mat (rows R, K: op(mat) = mat, or stored (K, R): op = trans) @ x + beta * out
    const real *mat = M == 1 ? b : a, *x = M == 1 ? a : b;
    int R = M == 1 ? N : M;
    bool stored_kr = M == 1 ? !trans_b : trans_a; // mat stored (K, R)
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if ((double)R * K < MATMUL_SERIAL_WORK) nt = 1;
    if (nt == 1) { // no parallel region: libgomp allocates a team even for one thread
        if (stored_kr)
            GEMV(CblasRowMajor, CblasTrans, K, R, alpha, mat, R, x, 1, beta, out, 1);
        else
            GEMV(CblasRowMajor, CblasNoTrans, R, K, alpha, mat, K, x, 1, beta, out, 1);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), used = omp_get_num_threads();
        int chunk = ((R + used - 1) / used + MATMUL_ALIGN - 1) / MATMUL_ALIGN * MATMUL_ALIGN;
        int lo = MIN(R, t * chunk), hi = MIN(R, lo + chunk);
        if (hi > lo && stored_kr) // out[lo:hi] = mat[:, lo:hi]^T x
            GEMV(CblasRowMajor, CblasTrans, K, hi - lo, alpha, mat + lo, R, x, 1, beta, out + lo, 1);
        else if (hi > lo)
            GEMV(CblasRowMajor, CblasNoTrans, hi - lo, K, alpha, mat + (size_t)lo * K, K, x, 1, beta,
                 out + lo, 1);
    }
}

static void FN(matmul)(real *out, const real *a, const real *b, int M, int N, int K,
                       bool trans_a, bool trans_b, real alpha, real beta) {
    if (M == 0 || N == 0) return;
    if (K == 0) { // BLAS rejects lda = 0; the product is empty, out = beta * out
        for (size_t i = 0; i < (size_t)M * N; i++) out[i] = beta == 0 ? 0 : beta * out[i];
        return;
    }
    if ((M == 1 || N == 1) && K > 1) { // x's elements are consecutive either way
        FN(matvec)(out, a, b, M, N, K, trans_a, trans_b, alpha, beta);
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

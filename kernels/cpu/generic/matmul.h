// generic/matmul.h: GEMM body, instantiated by cpu_matmul.c (see cpu.h).

// out (M, N) = alpha * op(a) (M, K) @ op(b) (K, N) + beta * out, row-major.
// a is stored (M, K), or (K, M) when trans_a; b (K, N), or (N, K) when trans_b.
// Math: BLAS xGEMM (OpenBLAS), which multithreads at top level.
static void FN(matmul)(real *out, const real *a, const real *b, int M, int N, int K,
                       bool trans_a, bool trans_b, real alpha, real beta) {
    if (M == 0 || N == 0) return;
    if (K == 0) { // BLAS rejects lda = 0; the product is empty, out = beta * out
        for (size_t i = 0; i < (size_t)M * N; i++) out[i] = beta == 0 ? 0 : beta * out[i];
        return;
    }
    GEMM(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
         M, N, K, alpha, a, trans_a ? M : K, b, trans_b ? K : N, beta, out, N);
}

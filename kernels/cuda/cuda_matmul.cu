// cuda_matmul.cu: matmul of the CUDA backend through cuBLASLt.
//
// Row-major out (M, N) = op(a) op(b) is, read column-major, out^T (N, M) =
// op(b)^T op(a)^T: cuBLASLt (column-major) multiplies b by a with m = N,
// n = M, and the transposes of b and a in that order; no data moves.
// Storage: a and b FP32, BF16 or FP16 (the same), out of their dtype or FP32
// (e.g. FP32 weight gradients of BF16/FP16 activations). Compute:
// CUBLAS_COMPUTE_32F for all three (FP32 accumulation, FP32 alpha and beta;
// no TF32, so FP32 matches the CPU to ~1e-6; a 16-bit out is rounded once).
#include "cuda_internal.cuh"

#include <string.h>

static cudaDataType_t cuda_type(enum dtype d) {
    return d == DTYPE_BF16 ? CUDA_R_16BF : d == DTYPE_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic
// assumes 256-byte aligned operands unless told otherwise, and a slice of a
// tensor (a layer's weights in the arena) can be less aligned.
static uint32_t ptr_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

// One column-major operand layout: rows x cols with leading dimension ld.
static cublasLtMatrixLayout_t layout(enum dtype d, uint64_t rows, uint64_t cols, int64_t ld) {
    cublasLtMatrixLayout_t l;
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&l, cuda_type(d), rows, cols, ld));
    return l;
}

// out = beta * out when the product is empty (K == 0): cuBLASLt rejects k = 0.
__global__ void scale_kernel(struct dptr x, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        st(x, i, s == 0.0f ? 0.0f : s * ld(x, i));
}

// out (M, N) = alpha op(a) op(b) + beta out, one thread per element, row-major
// as in ops.h: the fallback when cuBLASLt offers no algorithm (slow, exact
// semantics: beta == 0 never reads out). Grid (ceil(N / blockDim.x),
// min(M, GEMM_NAIVE_ROWS)): blocks stride over rows, since gridDim.y may not
// exceed 65535 (an LM head's rows are B * T, 16384 and more).
#define GEMM_NAIVE_ROWS 65535
__global__ void gemm_naive_kernel(struct dptr out, struct dptr a, struct dptr b, int M, int N,
                                  int K, bool ta, bool tb, float alpha, float beta) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= N) return;
    for (int i = blockIdx.y; i < M; i += gridDim.y) {
        float s = 0;
        for (int k = 0; k < K; k++)
            s += ld(a, ta ? (size_t)k * M + i : (size_t)i * K + k) *
                 ld(b, tb ? (size_t)j * K + k : (size_t)k * N + j);
        size_t o = (size_t)i * N + j;
        st(out, o, beta == 0.0f ? alpha * s : alpha * s + beta * ld(out, o));
    }
}

void cuda_matmul(struct backend *be, struct tensor out, struct tensor a, struct tensor b, int M,
                 int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    const char *op = "matmul";
    struct cuda_backend *c = cuda_state(be);
    struct dptr o = dptr_of(op, "out", out), pa = dptr_of(op, "a", a), pb = dptr_of(op, "b", b);
    CUDA_CHECK_SAME(op, "b", b, a.dtype);
    CHECK(out.dtype == a.dtype || out.dtype == DTYPE_FP32,
          "matmul: out is %s, expected %s or fp32", dtype_name(out.dtype), dtype_name(a.dtype));
    if (M == 0 || N == 0) return;
    if (K == 0) {
        scale_kernel<<<grid_for((size_t)M * N, 256), 256, 0, c->stream>>>(o, beta, (size_t)M * N);
        CHECK_LAUNCH();
        return;
    }
    cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; // first operand: b
    cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; // second operand: a
    // b stored (K, N) row-major is column-major (N, K), ld N; stored (N, K): (K, N), ld K.
    cublasLtMatrixLayout_t lb = trans_b ? layout(b.dtype, K, N, K) : layout(b.dtype, N, K, N);
    // a stored (M, K) row-major is column-major (K, M), ld K; stored (K, M): (M, K), ld M.
    cublasLtMatrixLayout_t la = trans_a ? layout(a.dtype, M, K, M) : layout(a.dtype, K, M, K);
    cublasLtMatrixLayout_t lc = layout(out.dtype, N, M, N);

    cublasLtMatmulDesc_t desc;
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tb, sizeof tb));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &ta, sizeof ta));

    uint32_t al_a = ptr_alignment(b.data), al_b = ptr_alignment(a.data), al_c = ptr_alignment(out.data);
    struct algo_entry *e = NULL;
    for (int i = 0; i < c->n_algos && !e; i++) {
        struct algo_entry *x = &c->algos[i];
        if (x->M == M && x->N == N && x->K == K && x->ta == trans_a && x->tb == trans_b &&
            x->ab == a.dtype && x->c == out.dtype && x->al_a == al_a && x->al_b == al_b &&
            x->al_c == al_c)
            e = x;
    }
    struct algo_entry fresh;
    if (!e) {
        cublasLtMatmulPreference_t pref;
        CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = c->workspace_bytes;
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
        cublasLtMatmulHeuristicResult_t heur;
        memset(&heur, 0, sizeof heur);
        int found = 0;
        // NOT_SUPPORTED (no algorithm for this problem) is an answer, not an error.
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, desc, lb, la, lc, lc, pref, 1,
                                                           &heur, &found);
        if (st != CUBLAS_STATUS_NOT_SUPPORTED) CHECK_CUBLAS(st);
        cublasLtMatmulPreferenceDestroy(pref);
        fresh = (struct algo_entry){M, N, K, trans_a, trans_b, a.dtype, out.dtype, al_a, al_b,
                                    al_c, st == CUBLAS_STATUS_SUCCESS && found > 0, heur.algo};
        e = &fresh;
        if (c->n_algos < CUDA_ALGO_CACHE) {
            c->algos[c->n_algos] = fresh;
            e = &c->algos[c->n_algos++];
        }
    }
    if (e->found) {
        CHECK_CUBLAS(cublasLtMatmul(c->lt, desc, &alpha, b.data, lb, a.data, la, &beta, out.data,
                                    lc, out.data, lc, &e->algo, c->workspace, c->workspace_bytes,
                                    c->stream));
    } else {
        dim3 grid((N + 127) / 128, M < GEMM_NAIVE_ROWS ? M : GEMM_NAIVE_ROWS);
        gemm_naive_kernel<<<grid, 128, 0, c->stream>>>(o, pa, pb, M, N, K, trans_a, trans_b,
                                                       alpha, beta);
        CHECK_LAUNCH();
    }
    // Descriptors are host objects: destroying them does not wait for the GEMM.
    cublasLtMatmulDescDestroy(desc);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
}

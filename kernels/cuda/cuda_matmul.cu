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

// log2 of the largest power of two (<= 256) dividing the address: cuBLASLt's
// heuristic assumes 256-byte aligned operands unless told otherwise, and a
// slice of a tensor can be less aligned (the model's arenas align every
// tensor to 256 bytes: src/model/model.c).
static uint32_t ptr_align_class(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t k = 8;
    while (k > 0 && a % (1u << k)) k--;
    return k;
}

static bool key_equal(const struct gemm_key *x, const struct gemm_key *y) {
    return x->M == y->M && x->N == y->N && x->K == y->K && x->ta == y->ta && x->tb == y->tb &&
           x->ab == y->ab && x->c == y->c && x->al == y->al;
}

static uint64_t key_hash(const struct gemm_key *k) {
    uint64_t v[] = {(uint64_t)k->M, (uint64_t)k->N, (uint64_t)k->K,
                    (uint64_t)k->ta | (uint64_t)k->tb << 1 | (uint64_t)k->ab << 2 | (uint64_t)k->c << 8,
                    k->al};
    uint64_t h = 1469598103934665603ull; // FNV-1a over the fields
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) h = (h ^ v[i]) * 1099511628211ull;
    return h;
}

// One column-major operand layout: rows x cols with leading dimension ld.
static cublasLtMatrixLayout_t layout(enum dtype d, uint64_t rows, uint64_t cols, int64_t ld) {
    cublasLtMatrixLayout_t l;
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&l, cuda_type(d), rows, cols, ld));
    return l;
}

// Makes p's descriptor, layouts and algorithm for p->key (see cuda_matmul
// for the row-major to column-major mapping).
static void plan_make(struct cuda_backend *c, struct gemm_plan *p) {
    const struct gemm_key *k = &p->key;
    int M = k->M, N = k->N, K = k->K;
    cublasOperation_t tb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N; // first operand: b
    cublasOperation_t ta = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N; // second operand: a
    // b stored (K, N) row-major is column-major (N, K), ld N; stored (N, K): (K, N), ld K.
    p->lb = k->tb ? layout(k->ab, K, N, K) : layout(k->ab, N, K, N);
    // a stored (M, K) row-major is column-major (K, M), ld K; stored (K, M): (M, K), ld M.
    p->la = k->ta ? layout(k->ab, M, K, M) : layout(k->ab, K, M, K);
    p->lc = layout(k->c, N, M, N);
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &tb, sizeof tb));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &ta, sizeof ta));
    uint32_t al_b = 1u << (k->al & 15), al_a = 1u << (k->al >> 4 & 15), al_c = 1u << (k->al >> 8 & 15);
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = c->workspace_bytes;
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                      sizeof ws));
    // cuBLASLt's A is trident's b, its B trident's a (the transpose trick).
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b,
                                                      sizeof al_b));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a,
                                                      sizeof al_a));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                      sizeof al_c));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                                      sizeof al_c));
    cublasLtMatmulHeuristicResult_t heur;
    memset(&heur, 0, sizeof heur);
    int found = 0;
    // NOT_SUPPORTED (no algorithm for this problem) is an answer, not an error.
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->lb, p->la, p->lc, p->lc, pref, 1,
                                                       &heur, &found);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) CHECK_CUBLAS(st);
    cublasLtMatmulPreferenceDestroy(pref);
    p->found = st == CUBLAS_STATUS_SUCCESS && found > 0;
    p->algo = heur.algo;
}

// Destroys p's descriptors (host objects: no GEMM waits on them).
static void plan_destroy(struct gemm_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    memset(p, 0, sizeof *p);
}

void cuda_matmul_plans_free(struct cuda_backend *c) {
    if (!c->plans) return;
    for (int i = 0; i < CUDA_GEMM_PLANS; i++)
        if (c->plans[i].used) plan_destroy(&c->plans[i]);
    free(c->plans);
    c->plans = NULL;
}

// The cached plan of key, made on first use; NULL when the table is full and
// key is new (the caller then makes one in *spare and destroys it after).
static struct gemm_plan *plan_find(struct cuda_backend *c, const struct gemm_key *key) {
    uint64_t h = key_hash(key);
    for (int i = 0; i < CUDA_GEMM_PLANS; i++) {
        struct gemm_plan *p = &c->plans[(h + i) % CUDA_GEMM_PLANS];
        if (p->used && key_equal(&p->key, key)) return p;
        if (p->used) continue;
        if (c->n_plans >= CUDA_GEMM_PLANS * 3 / 4) return NULL; // keep probes short
        p->used = true;
        p->key = *key;
        plan_make(c, p);
        c->n_plans++;
        return p;
    }
    return NULL;
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
    struct gemm_key key = {M, N, K, trans_a, trans_b, a.dtype, out.dtype,
                           (uint16_t)(ptr_align_class(b.data) | ptr_align_class(a.data) << 4 |
                                      ptr_align_class(out.data) << 8)};
    struct gemm_plan spare, *p = plan_find(c, &key);
    if (!p) {
        memset(&spare, 0, sizeof spare);
        spare.key = key;
        plan_make(c, &spare);
        p = &spare;
    }
    if (p->found) {
        CHECK_CUBLAS(cublasLtMatmul(c->lt, p->desc, &alpha, b.data, p->lb, a.data, p->la, &beta, out.data,
                                    p->lc, out.data, p->lc, &p->algo, c->workspace, c->workspace_bytes,
                                    c->stream));
    } else {
        dim3 grid((N + 127) / 128, M < GEMM_NAIVE_ROWS ? M : GEMM_NAIVE_ROWS);
        gemm_naive_kernel<<<grid, 128, 0, c->stream>>>(o, pa, pb, M, N, K, trans_a, trans_b,
                                                       alpha, beta);
        CHECK_LAUNCH();
    }
    if (p == &spare) plan_destroy(&spare);
}

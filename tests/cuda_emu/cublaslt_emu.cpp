// cublaslt_emu.cpp: the emulated cuBLASLt of cuda_emu.h. Column-major, as the
// real library: D (m, n) = alpha op(A) op(B) + beta C, op(A) (m, k), op(B)
// (k, n), element (i, j) of a layout at i + j * ld. Only what trident sets
// is honoured: TRANSA / TRANSB, the A and B scale pointers of FP8 operands,
// FAST_ACCUM (accepted; the preferences are accepted and ignored); compute
// CUBLAS_COMPUTE_32F with FP32 alpha and beta (host pointers, read at the
// call). beta == 0 never reads C, as in cuBLAS. cublasLtMatmul is queued on
// its stream (runtime_emu.cpp) with copies of the layouts and of the
// descriptor's settings: the caller may destroy or change them at once.
// FP8 operands (the restrictions: cuda_emu.h) are decoded exactly (written
// apart from kernels/cuda/cuda_fp8.cu's decoder, from the OCP formats), so
// an FP8 GEMM is the CPU backend's: exact products, FP32 sums in k order,
// times (alpha scale_a scale_b), plus beta C, rounded once to D's type.
#include "cuda_emu.h"

#include <vector>

struct emu_lt {
    int unused;
};
struct emu_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct emu_lt_desc {
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    const float *scale_a = nullptr, *scale_b = nullptr; // device pointers; NULL: 1
    int8_t fast_accum = 0;
};
struct emu_lt_pref {
    int unused;
};

namespace {

// An OCP FP8 byte's value: sign, exponent field e of ebits bits (bias
// 2^(ebits-1) - 1), mantissa field m of mbits bits; e = 0: subnormal
// m 2^(1 - bias - mbits). E4M3: S.1111.111 is NaN, no infinities; E5M2:
// e = 31 is inf (m = 0) or NaN.
float fp8_value(uint8_t b, bool e4m3) {
    int ebits = e4m3 ? 4 : 5, mbits = e4m3 ? 3 : 2, bias = (1 << (ebits - 1)) - 1;
    int e = (b >> mbits) & ((1 << ebits) - 1), m = b & ((1 << mbits) - 1);
    float v;
    if (e4m3 && e == 15 && m == 7) v = NAN;
    else if (!e4m3 && e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexpf((float)m, 1 - bias - mbits);
    else v = ldexpf((float)((1 << mbits) | m), e - bias - mbits);
    return b & 0x80 ? -v : v;
}

bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

float load(cudaDataType_t t, const void *p, size_t i) {
    switch (t) {
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    case CUDA_R_8F_E4M3: return fp8_value(((const uint8_t *)p)[i], true);
    case CUDA_R_8F_E5M2: return fp8_value(((const uint8_t *)p)[i], false);
    default: return ((const float *)p)[i];
    }
}

// Whether an FP8 problem meets cuBLASLt's FP8 requirements (cuda_emu.h);
// true for a problem without FP8 operands.
bool fp8_supported(const emu_lt_desc *d, const emu_lt_layout *a, const emu_lt_layout *b, const emu_lt_layout *c,
                   const emu_lt_layout *dl) {
    if (!is_fp8(a->type) && !is_fp8(b->type)) return true;
    if (!is_fp8(a->type) || !is_fp8(b->type) || (a->type == CUDA_R_8F_E5M2 && b->type == CUDA_R_8F_E5M2))
        return false;
    if (d->ta != CUBLAS_OP_T || d->tb != CUBLAS_OP_N) return false; // "TN"
    if (c->type != dl->type || is_fp8(c->type)) return false;
    uint64_t m = dl->rows, n = dl->cols, k = a->rows;
    return m % 16 == 0 && n % 16 == 0 && k % 16 == 0 && a->ld % 16 == 0 && b->ld % 16 == 0;
}

void store(cudaDataType_t t, void *p, size_t i, float v) {
    switch (t) {
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn(v); break;
    default: ((float *)p)[i] = v;
    }
}

// op(X) of layout l as FP32, (r, c) column-major with ld r.
std::vector<float> op_of(const emu_lt_layout *l, const void *x, cublasOperation_t op, uint64_t r, uint64_t c) {
    std::vector<float> out(r * c);
    for (uint64_t j = 0; j < c; j++)
        for (uint64_t i = 0; i < r; i++)
            out[i + j * r] = load(l->type, x, op == CUBLAS_OP_N ? i + j * l->ld : j + i * l->ld);
    return out;
}

bool enabled() {
    const char *s = getenv("TRIDENT_EMU_CUBLASLT");
    return !s || strcmp(s, "0") != 0;
}

} // namespace

const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED (emulated)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (emulated)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (emulated)";
    default: return "emulated cuBLAS status";
    }
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new emu_lt{0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE;
    emu_count_lt_setup();
    *l = new emu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    emu_count_lt_setup();
    *d = new emu_lt_desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, int attr, const void *buf, size_t n) {
    void *dst;
    size_t want;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: dst = &d->ta, want = sizeof d->ta; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: dst = &d->tb, want = sizeof d->tb; break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: dst = &d->scale_a, want = sizeof d->scale_a; break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: dst = &d->scale_b, want = sizeof d->scale_b; break;
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: dst = &d->fast_accum, want = sizeof d->fast_accum; break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (n != want) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(dst, buf, n);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    emu_count_lt_setup();
    *p = new emu_lt_pref{0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, int, const void *, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t la,
                                              cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                                              cublasLtMatrixLayout_t ld, cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t *results, int *found) {
    emu_count_lt_setup();
    *found = 0;
    if (!enabled() || requested < 1 || !fp8_supported(d, la, lb, lc, ld)) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = 0x454d55; // any non-zero pattern: "the emulated algorithm"
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha_p, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb,
                              const void *beta_p, const void *C, cublasLtMatrixLayout_t lc, void *D,
                              cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *, void *, size_t,
                              cudaStream_t stream) {
    if (((uintptr_t)A | (uintptr_t)B | (uintptr_t)C | (uintptr_t)D) % 256) emu_count_lt_unaligned();
    uint64_t m = ld->rows, n = ld->cols;
    uint64_t k = d->ta == CUBLAS_OP_N ? la->cols : la->rows;
    uint64_t am = d->ta == CUBLAS_OP_N ? la->rows : la->cols;
    uint64_t bk = d->tb == CUBLAS_OP_N ? lb->rows : lb->cols, bn = d->tb == CUBLAS_OP_N ? lb->cols : lb->rows;
    if (am != m || bk != k || bn != n || lc->rows != m || lc->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    if (!fp8_supported(d, la, lb, lc, ld)) return CUBLAS_STATUS_NOT_SUPPORTED;
    emu_count_gemm(m, n, k);
    if (emu_count_only()) return CUBLAS_STATUS_SUCCESS;
    float alpha, beta; // host pointer mode: read at the call
    memcpy(&alpha, alpha_p, 4);
    memcpy(&beta, beta_p, 4);
    // Queued on the stream with the layouts and transposes copied: the caller
    // may destroy its descriptors as soon as this returns.
    emu_lt_layout a_l = *la, b_l = *lb, c_l = *lc, d_l = *ld;
    cublasOperation_t ta = d->ta, tb = d->tb;
    const float *scale_a = d->scale_a, *scale_b = d->scale_b;
    bool fp8 = is_fp8(la->type);
    emu_enqueue(stream, [=]() {
        // The scales as the stream sees them (written by earlier work on it).
        float alpha_s = alpha * (scale_a ? *scale_a : 1.0f) * (scale_b ? *scale_b : 1.0f);
        std::vector<float> a = op_of(&a_l, A, ta, m, k), b = op_of(&b_l, B, tb, k, n), acc(m);
        for (uint64_t j = 0; j < n; j++) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (uint64_t p = 0; p < k; p++) {
                float bpj = b[p + j * k];
                const float *ap = &a[p * m];
                for (uint64_t i = 0; i < m; i++) acc[i] += ap[i] * bpj;
            }
            for (uint64_t i = 0; i < m; i++) {
                float v = alpha_s * acc[i];
                // FP8: beta C added by one FMA, as the CPU backend's matmul_fp8
                // (kernels/ops.h); cuBLASLt does not say how its epilogue rounds.
                if (beta != 0.0f && fp8) v = fmaf(beta, load(c_l.type, C, i + j * c_l.ld), v);
                else if (beta != 0.0f) v += beta * load(c_l.type, C, i + j * c_l.ld);
                store(d_l.type, D, i + j * d_l.ld, v);
            }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

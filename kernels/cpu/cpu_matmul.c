// cpu_matmul.c: matmul of the CPU backend. FP32/FP64: OpenBLAS sgemm/dgemm,
// row-major, threaded by slabs of the output (generic/matmul.h). BF16/FP16
// operands: FP32 accumulation, out FP32 or rounded once to the operands'
// dtype:
//   - BF16 on a CPU with AVX512_BF16 (cpu_backend.bf16_gemm): oneDNN's
//     dnnl_gemm_bf16bf16f32 (vdpbf16ps: BF16 products, FP32 sums), threaded
//     by oneDNN's own OpenMP loops;
//   - otherwise (FP16, BF16 elsewhere): the operands converted to FP32 in the
//     backend's scratch (exact) and the FP32 path above.
// oneDNN's GEMM mallocs its packing buffers on every call, so a BF16 step is
// not allocation-free (test_no_alloc checks the FP32 step); the fallback
// allocates only when its scratch grows.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

#include "cpu.h"

// Below this many multiply-adds one thread does the whole product: forking
// costs more than it saves.
#define MATMUL_SERIAL_WORK (64.0 * 64 * 64)
// Slabs of out per thread are cut at multiples of this (GEMM kernels unroll
// by up to 16 rows or columns).
#define MATMUL_ALIGN 16

#define GENERIC_FILE "kernels/cpu/generic/matmul.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE

// C (M, N) = alpha * op(A) @ op(B) + beta * C, BF16 A and B, FP32 C,
// row-major, transa/transb 'N' or 'T' (as dnnl_sgemm). libdnnl exports it
// (DNNL_API, extern "C", src/cpu/gemm/gemm.cpp) but oneDNN 2.6's public
// headers do not declare it; oneDNN's own tests (tests/gtests/
// test_gemm_common.hpp) declare it as here (bfloat16_t is a uint16_t).
dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N,
                                    dnnl_dim_t K, float alpha, const uint16_t *A, dnnl_dim_t lda,
                                    const uint16_t *B, dnnl_dim_t ldb, float beta, float *C,
                                    dnnl_dim_t ldc);

#ifndef CPU_SERIAL // defined once, by the OpenMP build
bool cpu_bf16_gemm_available(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return false;
    // One tiny product proves the library takes the call: 1.5 * 2 = 3.
    uint16_t a = bf16_from_f32(1.5f), b = bf16_from_f32(2.0f);
    float c = 0;
    return dnnl_gemm_bf16bf16f32('N', 'N', 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1) == dnnl_success &&
           c == 3.0f;
}
#endif

// dst (n,) FP32 = src (n,) of BF16/FP16 dtype dt, or the reverse (rounded).
static void lowp_to_f32(float *dst, const uint16_t *src, enum dtype dt, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = dt == DTYPE_BF16 ? bf16_to_f32(src[i]) : fp16_to_f32(src[i]);
}
static void lowp_from_f32(uint16_t *dst, const float *src, enum dtype dt, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = dt == DTYPE_BF16 ? bf16_from_f32(src[i]) : fp16_from_f32(src[i]);
}

static size_t round_up16(size_t n) { return (n + 15) / 16 * 16; } // floats: 64-byte aligned

// BF16/FP16 a and b; out FP32 or of a's dtype (then computed in FP32 scratch
// and rounded once).
static void matmul_lowp(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                        int M, int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    if (M == 0 || N == 0) return;
    enum dtype dt = a.dtype;
    bool out_f32 = out.dtype == DTYPE_FP32;
    bool onednn = dt == DTYPE_BF16 && K > 0 && ((struct cpu_backend *)be->impl)->bf16_gemm;
    size_t mn = (size_t)M * N, mk = (size_t)M * K, kn = (size_t)K * N;
    size_t c_elems = out_f32 ? 0 : round_up16(mn), ab_elems = onednn ? 0 : round_up16(mk) + kn;
    float *scratch = c_elems + ab_elems ? cpu_scratch(be, (c_elems + ab_elems) * sizeof(float)) : NULL;
    float *c = out_f32 ? out.data : scratch;
    if (!out_f32) {
        if (beta != 0) lowp_to_f32(c, out.data, dt, mn);
        else memset(c, 0, mn * sizeof(float));
    }
    if (onednn) {
        dnnl_status_t st = dnnl_gemm_bf16bf16f32(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K,
                                                 alpha, a.data, trans_a ? M : K, b.data,
                                                 trans_b ? K : N, beta, c, N);
        CHECK(st == dnnl_success, "matmul: dnnl_gemm_bf16bf16f32 %dx%dx%d failed: status %d", M, N,
              K, (int)st);
    } else {
        float *af = scratch + c_elems, *bf = af + round_up16(mk);
        lowp_to_f32(af, a.data, dt, mk);
        lowp_to_f32(bf, b.data, dt, kn);
        matmul_f32(c, af, bf, M, N, K, trans_a, trans_b, alpha, beta);
    }
    if (!out_f32) lowp_from_f32(out.data, c, dt, mn);
}

void cpu_matmul(struct backend *be, struct tensor out, struct tensor a, struct tensor b, int M,
                int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    CPU_CHECK_DTYPE("matmul", a.dtype);
    CPU_CHECK_SAME("matmul", "b", b, a.dtype);
    if (a.dtype == DTYPE_BF16 || a.dtype == DTYPE_FP16) {
        CHECK(out.dtype == a.dtype || out.dtype == DTYPE_FP32, "matmul: out is %s, expected %s or fp32",
              dtype_name(out.dtype), dtype_name(a.dtype));
        matmul_lowp(be, out, a, b, M, N, K, trans_a, trans_b, alpha, beta);
        return;
    }
    CPU_CHECK_SAME("matmul", "out", out, a.dtype);
    if (out.dtype == DTYPE_FP32)
        matmul_f32(out.data, a.data, b.data, M, N, K, trans_a, trans_b, alpha, beta);
    else
        matmul_f64(out.data, a.data, b.data, M, N, K, trans_a, trans_b, alpha, beta);
}

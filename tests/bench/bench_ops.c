// bench_ops.c: times the CPU backend's attention (forward + backward) against
// the GEMM of an MLP projection at the benchmark model's shapes, to check
// that attention stays a small share of a training step; and the
// (1024, 768) x (768, 3072) matmul in FP32 and BF16 side by side (issue 11's
// goal: BF16 >= 1.8x FP32 on a CPU with BF16 instructions); matmul_fp8
// against BF16 in a linear layer's three layouts, and fp8_cast.
// Usage: bench_ops [B T C H Hkv iters]   (default 4 256 768 12 12 5)
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "bench.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"

static float *filled(struct backend *be, size_t n, float scale) {
    float *p = backend_alloc(be, n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = scale * ((float)((i * 2654435761u) % 1000) / 500 - 1);
    return p;
}

// Best time of iters calls of out (M, N) = a (M, K) @ b (K, N), all of dtype dt.
static double time_matmul(struct backend *be, enum dtype dt, int M, int N, int K, int iters) {
    size_t es = dtype_size(dt);
    struct tensor a = tensor_view(backend_alloc(be, (size_t)M * K * es), dt, (size_t)M * K);
    struct tensor b = tensor_view(backend_alloc(be, (size_t)K * N * es), dt, (size_t)K * N);
    struct tensor o = tensor_view(backend_alloc(be, (size_t)M * N * es), dt, (size_t)M * N);
    struct tensor f = tensor_view(filled(be, (size_t)K * N, 1), DTYPE_FP32, (size_t)K * N);
    backend_copy(be, a, tensor_slice(f, 0, (size_t)M * K), (size_t)M * K);
    backend_copy(be, b, f, (size_t)K * N);
    double best = 1e30;
    for (int it = 0; it < iters + 1; it++) {
        double t0 = time_now_s();
        backend_matmul(be, o, a, b, M, N, K, false, false, 1, 0);
        if (it) best = MIN(best, time_now_s() - t0);
    }
    backend_dealloc(be, a.data), backend_dealloc(be, b.data), backend_dealloc(be, o.data);
    backend_dealloc(be, f.data);
    return best;
}

static void bench_matmul_bf16(struct backend *be, int iters) {
    int M = 1024, K = 768, N = 3072;
    char flags[64];
    bench_cpu_bf16_flags(flags, sizeof flags);
    double t32 = time_matmul(be, DTYPE_FP32, M, N, K, iters);
    double t16 = time_matmul(be, DTYPE_BF16, M, N, K, iters);
    double flop = 2.0 * M * N * K;
    printf("matmul %dx%dx%d: cpu bf16 flags: %s; bf16 via %s\n", M, K, N, flags,
           ((struct cpu_backend *)be->impl)->bf16_gemm ? "oneDNN" : "FP32 fallback");
    printf("matmul %dx%dx%d fp32 %8.2f ms %6.1f GFLOP/s | bf16 %8.2f ms %6.1f GFLOP/s | "
           "bf16/fp32 speedup %.2fx\n", M, K, N, 1e3 * t32, flop / t32 * 1e-9, 1e3 * t16, flop / t16 * 1e-9, t32 / t16);
}

// matmul_fp8 against the BF16 matmul at a 124M-model MLP shape in the three
// layouts of a linear layer (issue 29): forward y (M, F) = x (M, C) @ w^T
// (w (F, C)), dx (M, C) = dy (M, F) @ w, dw (F, C) += dy^T @ x (FP32, beta
// 1); and the fp8_cast (with amax) of x. The CPU's FP8 GEMM converts its
// operands to BF16 and runs the BF16 GEMM: it is the reference, not faster.
static void bench_matmul_fp8(struct backend *be, int iters) {
    int M = 1024, C = 768, F = 3072;
    struct tensor f = tensor_view(filled(be, (size_t)F * C, 1), DTYPE_FP32, (size_t)F * C);
    struct tensor one = tensor_view(filled(be, 1, 0), DTYPE_FP32, 1);
    ((float *)one.data)[0] = 1;
    struct tensor x16 = tensor_view(backend_alloc(be, (size_t)M * F * 2), DTYPE_BF16, (size_t)M * F);
    struct tensor w16 = tensor_view(backend_alloc(be, (size_t)F * C * 2), DTYPE_BF16, (size_t)F * C);
    struct tensor x8 = tensor_view(backend_alloc(be, (size_t)M * F), DTYPE_FP8_E4M3, (size_t)M * F);
    struct tensor w8 = tensor_view(backend_alloc(be, (size_t)F * C), DTYPE_FP8_E4M3, (size_t)F * C);
    struct tensor y16 = tensor_view(backend_alloc(be, (size_t)M * F * 2), DTYPE_BF16, (size_t)M * F);
    struct tensor dw = tensor_view(filled(be, (size_t)F * C, 0), DTYPE_FP32, (size_t)F * C);
    backend_copy(be, x16, tensor_slice(f, 0, (size_t)M * C), (size_t)M * C);
    backend_copy(be, w16, f, (size_t)F * C);
    struct tensor amax = tensor_view(filled(be, 1, 0), DTYPE_FP32, 1);
    backend_fp8_cast(be, x8, amax, tensor_view(NULL, DTYPE_I64, 0), x16, one, (size_t)M * F);
    backend_fp8_cast(be, w8, amax, tensor_view(NULL, DTYPE_I64, 0), w16, one, (size_t)F * C);
    // the three layouts as (M, N, K, trans_a, trans_b, out FP32)
    struct { const char *name; int m, n, k; bool ta, tb, f32; } l[] = {
        {"forward x @ w^T", M, F, C, false, true, false},
        {"dx = dy @ w", M, C, F, false, false, false},
        {"dw += dy^T @ x", F, C, M, true, false, true},
    };
    for (int i = 0; i < 3; i++) {
        double t8 = 1e30, t16 = 1e30;
        size_t mn = (size_t)l[i].m * l[i].n, mk = (size_t)l[i].m * l[i].k, kn = (size_t)l[i].k * l[i].n;
        struct tensor out = l[i].f32 ? tensor_slice(dw, 0, mn) : tensor_slice(y16, 0, mn);
        for (int it = 0; it < iters + 1; it++) {
            double t0 = time_now_s();
            backend_matmul_fp8(be, out, tensor_slice(x8, 0, mk), tensor_slice(w8, 0, kn), one, one,
                               l[i].m, l[i].n, l[i].k, l[i].ta, l[i].tb, l[i].f32 ? 1 : 0);
            double t1 = time_now_s();
            backend_matmul(be, out, tensor_slice(x16, 0, mk), tensor_slice(w16, 0, kn), l[i].m,
                           l[i].n, l[i].k, l[i].ta, l[i].tb, 1, l[i].f32 ? 1 : 0);
            double t2 = time_now_s();
            if (it) t8 = MIN(t8, t1 - t0), t16 = MIN(t16, t2 - t1);
        }
        double flop = 2.0 * mn * l[i].k;
        printf("matmul_fp8 %-16s %dx%dx%d: fp8 %7.2f ms %6.1f GFLOP/s | bf16 %7.2f ms %6.1f GFLOP/s | "
               "fp8/bf16 time %.2fx\n", l[i].name, l[i].m, l[i].n, l[i].k, 1e3 * t8, flop / t8 * 1e-9,
               1e3 * t16, flop / t16 * 1e-9, t8 / t16);
    }
    double tc = 1e30;
    for (int it = 0; it < iters + 1; it++) {
        double t0 = time_now_s();
        backend_fp8_cast(be, x8, amax, tensor_view(NULL, DTYPE_I64, 0), x16, one, (size_t)M * F);
        if (it) tc = MIN(tc, time_now_s() - t0);
    }
    printf("fp8_cast bf16 -> e4m3 with amax, %d elements: %.2f ms (%.2f GB/s read)\n", M * F, 1e3 * tc,
           2.0 * M * F / tc * 1e-9);
    struct tensor all[] = {f, one, x16, w16, x8, w8, y16, dw, amax};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) backend_dealloc(be, all[i].data);
}

int main(int argc, char **argv) {
    int B = 4, T = 256, C = 768, H = 12, Hkv = 12, iters = 5;
    if (argc == 7) B = atoi(argv[1]), T = atoi(argv[2]), C = atoi(argv[3]), H = atoi(argv[4]),
                   Hkv = atoi(argv[5]), iters = atoi(argv[6]);
    int D = C / H, N = B * T;
    struct backend *be = backend_cpu_init(0);
    size_t nq = (size_t)N * H * D, nk = (size_t)N * Hkv * D;
    float *q = filled(be, nq, 1), *k = filled(be, nk, 1), *v = filled(be, nk, 1);
    float *out = filled(be, nq, 0), *dout = filled(be, nq, 1), *lse = filled(be, (size_t)B * H * T, 0);
    float *dq = filled(be, nq, 0), *dk = filled(be, nk, 0), *dv = filled(be, nk, 0);
    float *x = filled(be, (size_t)N * C, 1), *w = filled(be, (size_t)4 * C * C, 0.03f);
    float *y = filled(be, (size_t)N * 4 * C, 0);
#define F32(p, n) tensor_view(p, DTYPE_FP32, n)
    double t_fwd = 1e30, t_bwd = 1e30, t_mm = 1e30, t_blas = 1e30;
    for (int it = 0; it < iters + 1; it++) { // best of iters after one warm-up
        double t0 = time_now_s();
        backend_attention_forward(be, F32(out, nq), F32(lse, (size_t)B * H * T), F32(q, nq),
                                  F32(k, nk), F32(v, nk), B, T, H, Hkv, D);
        double t1 = time_now_s();
        backend_attention_backward(be, F32(dq, nq), F32(dk, nk), F32(dv, nk), F32(dout, nq),
                                   F32(q, nq), F32(k, nk), F32(v, nk), F32(out, nq),
                                   F32(lse, (size_t)B * H * T), B, T, H, Hkv, D);
        double t2 = time_now_s();
        // y (N, 4C) = x (N, C) W^T, W (4C, C): the MLP up projection
        backend_matmul(be, F32(y, (size_t)N * 4 * C), F32(x, (size_t)N * C),
                       F32(w, (size_t)4 * C * C), N, 4 * C, C, false, true, 1, 0);
        double t3 = time_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, 4 * C, C, 1, x, C, w, C, 0, y,
                    4 * C);
        double t4 = time_now_s();
        if (it == 0) continue;
        t_fwd = MIN(t_fwd, t1 - t0), t_bwd = MIN(t_bwd, t2 - t1);
        t_mm = MIN(t_mm, t3 - t2), t_blas = MIN(t_blas, t4 - t3);
    }
    // cross-entropy over V = 32000 (all four pieces) vs the LM-head GEMM
    int V = 32000;
    float *logits = filled(be, (size_t)N * V, 3), *dlogits = filled(be, (size_t)N * V, 0);
    float *stats = filled(be, (size_t)N * 6, 0), *wlm = filled(be, (size_t)V * C, 0.03f);
    int32_t *targets = backend_alloc(be, (size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) targets[i] = (i * 7919) % V;
    double t_ce = 1e30, t_lm = 1e30;
    for (int it = 0; it < 3; it++) {
        double t0 = time_now_s();
        struct tensor rm = F32(stats, N), part = F32(stats + N, 3 * (size_t)N);
        struct tensor loss = F32(stats + 4 * N, N), lse_ce = F32(stats + 5 * N, N);
        struct tensor tz = F32(logits, (size_t)N * V), tt = tensor_view(targets, DTYPE_I32, N);
        backend_ce_row_max(be, rm, tz, N, V, V);
        backend_ce_partials(be, part, tz, rm, tt, N, V, V, 0);
        backend_ce_loss(be, loss, lse_ce, part, rm, tt, N, V, 0.1f, -100);
        backend_ce_backward(be, F32(dlogits, (size_t)N * V), tz, lse_ce, tt, N, V, V, 0, V, 0.1f,
                            -100, 1.0f / N);
        double t1 = time_now_s();
        backend_matmul(be, tz, F32(x, (size_t)N * C), F32(wlm, (size_t)V * C), N, V, C, false,
                       true, 1, 0);
        double t2 = time_now_s();
        t_ce = MIN(t_ce, t1 - t0), t_lm = MIN(t_lm, t2 - t1);
    }
    double gemm_flops = 2.0 * N * 4 * C * C;
    printf("B=%d T=%d C=%d H=%d Hkv=%d D=%d threads=%d (best of %d)\n", B, T, C, H, Hkv, D,
           be->threads, iters);
    printf("attention forward           %8.2f ms\n", 1e3 * t_fwd);
    printf("attention backward          %8.2f ms\n", 1e3 * t_bwd);
    printf("attention fwd+bwd           %8.2f ms\n", 1e3 * (t_fwd + t_bwd));
    printf("matmul (N,C)x(C,4C)         %8.2f ms  %6.1f GFLOP/s\n", 1e3 * t_mm,
           gemm_flops / t_mm * 1e-9);
    printf("OpenBLAS threaded sgemm     %8.2f ms  %6.1f GFLOP/s\n", 1e3 * t_blas,
           gemm_flops / t_blas * 1e-9);
    printf("cross-entropy V=%d (4 pieces) %8.2f ms\n", V, 1e3 * t_ce);
    printf("LM head matmul (N,C)x(C,V)  %8.2f ms\n", 1e3 * t_lm);
    // One LLaMA block (F = 4C MLP as in this GEMM, 4 C^2 attention projections):
    // forward GEMMs = 4 C^2 + 3 C F = 16 C^2 per token = 4 GEMMs of (N,C)x(C,4C);
    // backward twice that: 12 such GEMM times per layer step.
    double layer_mm = 12 * t_mm, att = t_fwd + t_bwd;
    printf("attention share of a block's (GEMM + attention) time: %.1f%%\n",
           100 * att / (att + layer_mm));
    bench_matmul_bf16(be, iters);
    bench_matmul_fp8(be, iters);
    backend_free(be);
    return 0;
}

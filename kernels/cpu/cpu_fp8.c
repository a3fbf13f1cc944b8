// cpu_fp8.c: FP8 ops of the CPU backend (kernels/ops.h, "FP8"). Stubs: the
// API is fixed; the implementations land with issue 29's ops work.
#include "cpu.h"

void cpu_fp8_amax(struct backend *be, struct tensor amax, struct tensor x, size_t n) {
    (void)be, (void)amax, (void)x, (void)n;
    CHECK(0, "fp8_amax: not implemented yet on the CPU backend");
}

void cpu_fp8_cast(struct backend *be, struct tensor out, struct tensor amax,
                  struct tensor saturated, struct tensor x, struct tensor scale, size_t n) {
    (void)be, (void)out, (void)amax, (void)saturated, (void)x, (void)scale, (void)n;
    CHECK(0, "fp8_cast: not implemented yet on the CPU backend");
}

void cpu_fp8_update_scale(struct backend *be, struct tensor scale, struct tensor scale_inv,
                          struct tensor history, struct tensor amax, int n, int len, float fp8_max,
                          int margin, bool most_recent) {
    (void)be, (void)scale, (void)scale_inv, (void)history, (void)amax, (void)n, (void)len,
        (void)fp8_max, (void)margin, (void)most_recent;
    CHECK(0, "fp8_update_scale: not implemented yet on the CPU backend");
}

void cpu_matmul_fp8(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                    struct tensor scale_inv_a, struct tensor scale_inv_b, int M, int N, int K,
                    bool trans_a, bool trans_b, float beta) {
    (void)be, (void)out, (void)a, (void)b, (void)scale_inv_a, (void)scale_inv_b, (void)M, (void)N,
        (void)K, (void)trans_a, (void)trans_b, (void)beta;
    CHECK(0, "matmul_fp8: not implemented yet on the CPU backend");
}

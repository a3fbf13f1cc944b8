// cpu_matmul.c: matmul of the CPU backend (OpenBLAS sgemm/dgemm, row-major).
#include <cblas.h>
#include <math.h>

#include "cpu.h"

#define GENERIC_FILE "cpu/generic/matmul.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE

void cpu_matmul(struct backend *be, struct tensor out, struct tensor a, struct tensor b, int M,
                int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    CPU_CHECK_DTYPE("matmul", out.dtype);
    if (out.dtype == DTYPE_FP32)
        matmul_f32(out.data, a.data, b.data, M, N, K, trans_a, trans_b, alpha, beta);
    else
        matmul_f64(out.data, a.data, b.data, M, N, K, trans_a, trans_b, alpha, beta);
}

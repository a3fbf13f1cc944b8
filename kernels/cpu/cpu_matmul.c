// cpu_matmul.c: matmul of the CPU backend (OpenBLAS sgemm/dgemm, row-major,
// threaded by slabs of the output; see generic/matmul.h).
#include <cblas.h>
#include <math.h>
#include <omp.h>

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

void cpu_matmul(struct backend *be, struct tensor out, struct tensor a, struct tensor b, int M,
                int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    CPU_CHECK_DTYPE("matmul", out.dtype);
    CPU_CHECK_SAME("matmul", "a", a, out.dtype); // ops.c lets FP32 out take BF16 a, b
    if (out.dtype == DTYPE_FP32)
        matmul_f32(out.data, a.data, b.data, M, N, K, trans_a, trans_b, alpha, beta);
    else
        matmul_f64(out.data, a.data, b.data, M, N, K, trans_a, trans_b, alpha, beta);
}

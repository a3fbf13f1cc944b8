// cpu_optim.c: AdamW and sum_squares of the CPU backend; bodies in
// generic/optim.h, instantiated for FP32, FP64, BF16 and FP16.
//
// Built with -fno-math-errno -ffp-contract=off (Makefile; a pragma or
// attribute does not reach OpenMP's outlined loop bodies). Without errno
// (sqrt of a negative number never happens here: v >= 0) GCC vectorizes
// AdamW's update (vsqrtps/vdivps, 16 elements an instruction) instead of
// calling scalar sqrtf and dividing one element at a time, which made AdamW
// ~11% of the 124M step. Without contraction the fused multiply-adds are the
// explicit FMA()s of generic/optim.h, those GCC had chosen for the scalar
// loop: IEEE sqrt, division and fma are correctly rounded in any width, so
// the results are bit-identical to the scalar loop's.
#include <math.h>
#include <omp.h>

#include "cpu.h"

#define GENERIC_FILE "kernels/cpu/generic/optim.h"
#define GENERIC_LOWP
#include "generic/instantiate.h"
#undef GENERIC_LOWP
#undef GENERIC_FILE

// Without master weights param, grad, m, v share one dtype (FP32 or FP64).
// With master (FP32) the update runs on master with FP32 grad, m, v and param
// (FP32, BF16 or FP16) receives the new weights rounded to its dtype.
void cpu_adamw(struct backend *be, struct tensor param, struct tensor master, struct tensor grad,
               struct tensor m, struct tensor v, size_t n, double lr, double beta1, double beta2,
               double eps, double weight_decay, double grad_scale, int step) {
    const char *op = "adamw";
    struct tensor w = master.data ? master : param;
    CPU_CHECK_DTYPE(op, param.dtype);
    if (master.data) {
        CPU_CHECK_SAME(op, "master", master, DTYPE_FP32);
        CHECK(param.dtype != DTYPE_FP64, "%s: fp64 param with fp32 master weights", op);
    } else
        CHECK(param.dtype == DTYPE_FP32 || param.dtype == DTYPE_FP64,
              "%s: %s param needs fp32 master weights", op, dtype_name(param.dtype));
    CPU_CHECK_SAME(op, "grad", grad, w.dtype);
    CPU_CHECK_SAME(op, "m", m, w.dtype);
    CPU_CHECK_SAME(op, "v", v, w.dtype);
    if (!master.data) {
        CPU_DISPATCH(op, w.dtype, adamw, w.data, NULL, grad.data, m.data, v.data, n, lr, beta1,
                     beta2, eps, weight_decay, grad_scale, step);
        return;
    }
    CPU_DISPATCH(op, param.dtype, adamw, w.data, param.data, grad.data, m.data, v.data, n, lr,
                 beta1, beta2, eps, weight_decay, grad_scale, step);
}

// acc += sum_i x_i in double, in index order (serial: n is a microbatch's
// token count).
void cpu_sum_into(struct backend *be, struct tensor acc, struct tensor x, size_t n) {
    double s = 0;
    if (x.dtype == DTYPE_FP32)
        for (size_t i = 0; i < n; i++) s += ((const float *)x.data)[i];
    else if (x.dtype == DTYPE_FP64)
        for (size_t i = 0; i < n; i++) s += ((const double *)x.data)[i];
    else CPU_CHECK_DTYPE("sum_into", x.dtype);
    *(double *)acc.data += s;
}

double cpu_sum_squares(struct backend *be, struct tensor x, size_t n) {
    switch (x.dtype) {
    case DTYPE_FP32: return sum_squares_f32(x.data, n);
    case DTYPE_FP64: return sum_squares_f64(x.data, n);
    case DTYPE_BF16: return sum_squares_bf16(x.data, n);
    case DTYPE_FP16: return sum_squares_fp16(x.data, n);
    default: CPU_CHECK_DTYPE("sum_squares", x.dtype);
    }
    return 0;
}

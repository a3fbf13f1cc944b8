// cpu_optim.c: AdamW and sum_squares of the CPU backend; bodies in
// generic/optim.h, instantiated for FP32 and FP64.
#include <math.h>
#include <omp.h>

#include "cpu.h"

#define GENERIC_FILE "kernels/cpu/generic/optim.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE

// Without master weights param, grad, m, v share one dtype (FP32 or FP64).
// With master (FP32) the update runs on master with FP32 grad, m, v and param
// receives a copy: param must then be FP32 until BF16/FP16 kernels exist.
void cpu_adamw(struct backend *be, struct tensor param, struct tensor master, struct tensor grad,
               struct tensor m, struct tensor v, size_t n, double lr, double beta1, double beta2,
               double eps, double weight_decay, double grad_scale, int step) {
    const char *op = "adamw";
    struct tensor w = master.data ? master : param;
    CPU_CHECK_DTYPE(op, param.dtype);
    CPU_CHECK_DTYPE(op, w.dtype);
    if (master.data) {
        CPU_CHECK_SAME(op, "master", master, DTYPE_FP32);
        CPU_CHECK_SAME(op, "param", param, DTYPE_FP32);
    }
    CPU_CHECK_SAME(op, "grad", grad, w.dtype);
    CPU_CHECK_SAME(op, "m", m, w.dtype);
    CPU_CHECK_SAME(op, "v", v, w.dtype);
    if (w.dtype == DTYPE_FP32)
        adamw_f32(w.data, master.data ? param.data : NULL, grad.data, m.data, v.data, n, lr, beta1,
                  beta2, eps, weight_decay, grad_scale, step);
    else
        adamw_f64(w.data, NULL, grad.data, m.data, v.data, n, lr, beta1, beta2, eps, weight_decay,
                  grad_scale, step);
}

double cpu_sum_squares(struct backend *be, struct tensor x, size_t n) {
    CPU_CHECK_DTYPE("sum_squares", x.dtype);
    return x.dtype == DTYPE_FP32 ? sum_squares_f32(x.data, n) : sum_squares_f64(x.data, n);
}

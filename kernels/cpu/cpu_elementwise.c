// cpu_elementwise.c: SwiGLU, add and copy of the CPU backend;
// bodies in generic/elementwise.h, instantiated for FP32 and FP64.
#include <math.h>
#include <string.h>

#include "cpu.h"

#define GENERIC_FILE "kernels/cpu/generic/elementwise.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE

void cpu_swiglu_forward(struct backend *be, struct tensor out, struct tensor gate, struct tensor up,
                        size_t n) {
    CPU_CHECK_DTYPE("swiglu_forward", out.dtype);
    if (out.dtype == DTYPE_FP32) swiglu_forward_f32(out.data, gate.data, up.data, n);
    else swiglu_forward_f64(out.data, gate.data, up.data, n);
}

void cpu_swiglu_backward(struct backend *be, struct tensor dgate, struct tensor dup,
                         struct tensor dout, struct tensor gate, struct tensor up, size_t n) {
    const char *op = "swiglu_backward";
    CPU_CHECK_DTYPE(op, gate.dtype);
    CPU_CHECK_SAME(op, "dgate", dgate, gate.dtype);
    CPU_CHECK_SAME(op, "dup", dup, gate.dtype);
    CPU_CHECK_SAME(op, "dout", dout, gate.dtype);
    CPU_CHECK_SAME(op, "up", up, gate.dtype);
    if (gate.dtype == DTYPE_FP32)
        swiglu_backward_f32(dgate.data, dup.data, dout.data, gate.data, up.data, n);
    else
        swiglu_backward_f64(dgate.data, dup.data, dout.data, gate.data, up.data, n);
}

void cpu_add(struct backend *be, struct tensor out, struct tensor a, struct tensor b, size_t n) {
    CPU_CHECK_DTYPE("add", out.dtype);
    if (out.dtype == DTYPE_FP32) add_f32(out.data, a.data, b.data, n);
    else add_f64(out.data, a.data, b.data, n);
}

// dst (n,) = src (n,): memcpy for equal dtypes (any dtype), else FP32 <-> FP64
// conversion (round to nearest when narrowing).
void cpu_copy(struct backend *be, struct tensor dst, struct tensor src, size_t n) {
    if (dst.dtype == src.dtype) {
        memcpy(dst.data, src.data, n * dtype_size(dst.dtype));
    } else if (dst.dtype == DTYPE_FP32 && src.dtype == DTYPE_FP64) {
        float *d = dst.data;
        const double *s = src.data;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = (float)s[i];
    } else if (dst.dtype == DTYPE_FP64 && src.dtype == DTYPE_FP32) {
        double *d = dst.data;
        const float *s = src.data;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = s[i];
    } else {
        CHECK(dst.dtype == src.dtype, "copy: %s to %s: dtype not supported by cpu backend",
              dtype_name(src.dtype), dtype_name(dst.dtype));
    }
}

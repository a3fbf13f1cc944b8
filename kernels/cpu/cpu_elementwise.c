// cpu_elementwise.c: SwiGLU, add and copy of the CPU backend; bodies in
// generic/elementwise.h, instantiated for FP32, FP64, BF16 and FP16.
#include <math.h>
#include <string.h>

#include "cpu.h"

#define GENERIC_FILE "kernels/cpu/generic/elementwise.h"
#define GENERIC_LOWP
#include "generic/instantiate.h"
#undef GENERIC_LOWP
#undef GENERIC_FILE

void cpu_swiglu_forward(struct backend *be, struct tensor out, struct tensor gate, struct tensor up,
                        size_t n) {
    CPU_DISPATCH("swiglu_forward", out.dtype, swiglu_forward, out.data, gate.data, up.data, n);
}

void cpu_swiglu_backward(struct backend *be, struct tensor dgate, struct tensor dup,
                         struct tensor dout, struct tensor gate, struct tensor up, size_t n) {
    const char *op = "swiglu_backward";
    CPU_CHECK_SAME(op, "dgate", dgate, gate.dtype);
    CPU_CHECK_SAME(op, "dup", dup, gate.dtype);
    CPU_CHECK_SAME(op, "dout", dout, gate.dtype);
    CPU_CHECK_SAME(op, "up", up, gate.dtype);
    CPU_DISPATCH(op, gate.dtype, swiglu_backward, dgate.data, dup.data, dout.data, gate.data,
                 up.data, n);
}

void cpu_add(struct backend *be, struct tensor out, struct tensor a, struct tensor b, size_t n) {
    CPU_DISPATCH("add", out.dtype, add, out.data, a.data, b.data, n);
}

// Element i of a float tensor's data of dtype d, as double (exact).
static inline double copy_load(const void *p, enum dtype d, size_t i) {
    switch (d) {
    case DTYPE_FP64: return ((const double *)p)[i];
    case DTYPE_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case DTYPE_FP16: return fp16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

// Element i of dtype d := v, rounded to nearest (FP64 to BF16/FP16 through
// FP32: the two roundings differ from one only for values within 2^-29
// relative of a 16-bit halfway point).
static inline void copy_store(void *p, enum dtype d, size_t i, double v) {
    switch (d) {
    case DTYPE_FP64: ((double *)p)[i] = v; break;
    case DTYPE_BF16: ((uint16_t *)p)[i] = bf16_from_f32((float)v); break;
    case DTYPE_FP16: ((uint16_t *)p)[i] = fp16_from_f32((float)v); break;
    default: ((float *)p)[i] = (float)v; break;
    }
}

// dst (n,) = src (n,): memcpy for equal dtypes (any dtype), else a conversion
// between FP32, FP64, BF16 and FP16 (round to nearest even when narrowing).
void cpu_copy(struct backend *be, struct tensor dst, struct tensor src, size_t n) {
    if (dst.dtype == src.dtype) {
        memcpy(dst.data, src.data, n * dtype_size(dst.dtype));
        return;
    }
    CPU_CHECK_DTYPE("copy", dst.dtype);
    CPU_CHECK_DTYPE("copy", src.dtype);
    enum dtype dd = dst.dtype, sd = src.dtype;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) copy_store(dst.data, dd, i, copy_load(src.data, sd, i));
}

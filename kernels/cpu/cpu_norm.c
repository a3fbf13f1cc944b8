// cpu_norm.c: RMSNorm, embedding and RoPE of the CPU backend; bodies in
// generic/norm.h, instantiated for FP32 and FP64.
#include <math.h>
#include <string.h>

#include "cpu.h"

#define GENERIC_FILE "kernels/cpu/generic/norm.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE

void cpu_rmsnorm_forward(struct backend *be, struct tensor y, struct tensor rstd, struct tensor x,
                         struct tensor w, int N, int C, float eps) {
    CPU_CHECK_DTYPE("rmsnorm_forward", x.dtype);
    CPU_CHECK_SAME("rmsnorm_forward", "w", w, x.dtype);
    if (x.dtype == DTYPE_FP32)
        rmsnorm_forward_f32(y.data, rstd.data, x.data, w.data, N, C, eps);
    else
        rmsnorm_forward_f64(y.data, rstd.data, x.data, w.data, N, C, eps);
}

void cpu_rmsnorm_backward(struct backend *be, struct tensor dx, struct tensor dw, struct tensor dy,
                          struct tensor x, struct tensor w, struct tensor rstd, int N, int C) {
    CPU_CHECK_DTYPE("rmsnorm_backward", x.dtype);
    CPU_CHECK_SAME("rmsnorm_backward", "dx", dx, x.dtype);
    CPU_CHECK_SAME("rmsnorm_backward", "dw", dw, x.dtype);
    CPU_CHECK_SAME("rmsnorm_backward", "dy", dy, x.dtype);
    CPU_CHECK_SAME("rmsnorm_backward", "w", w, x.dtype);
    if (x.dtype == DTYPE_FP32)
        rmsnorm_backward_f32(dx.data, dw.data, dy.data, x.data, w.data, rstd.data, N, C);
    else
        rmsnorm_backward_f64(dx.data, dw.data, dy.data, x.data, w.data, rstd.data, N, C);
}

void cpu_embedding_forward(struct backend *be, struct tensor out, struct tensor wte,
                           struct tensor tokens, int N, int C, int vocab_start, int Vl) {
    CPU_CHECK_DTYPE("embedding_forward", out.dtype);
    if (out.dtype == DTYPE_FP32)
        embedding_forward_f32(out.data, wte.data, tokens.data, N, C, vocab_start, Vl);
    else
        embedding_forward_f64(out.data, wte.data, tokens.data, N, C, vocab_start, Vl);
}

void cpu_embedding_backward(struct backend *be, struct tensor dwte, struct tensor dout,
                            struct tensor tokens, int N, int C, int vocab_start, int Vl) {
    CPU_CHECK_DTYPE("embedding_backward", dwte.dtype);
    CPU_CHECK_SAME("embedding_backward", "dout", dout, dwte.dtype);
    if (dwte.dtype == DTYPE_FP32)
        embedding_backward_f32(dwte.data, dout.data, tokens.data, N, C, vocab_start, Vl);
    else
        embedding_backward_f64(dwte.data, dout.data, tokens.data, N, C, vocab_start, Vl);
}

void cpu_rope(struct backend *be, struct tensor x, struct tensor cos, struct tensor sin, int B,
              int T, int Hx, int D, int pos_offset, bool inverse) {
    CPU_CHECK_DTYPE(inverse ? "rope_backward" : "rope_forward", x.dtype);
    if (x.dtype == DTYPE_FP32)
        rope_f32(x.data, cos.data, sin.data, B, T, Hx, D, pos_offset, inverse);
    else
        rope_f64(x.data, cos.data, sin.data, B, T, Hx, D, pos_offset, inverse);
}

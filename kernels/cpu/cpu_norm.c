// cpu_norm.c: RMSNorm, embedding and RoPE of the CPU backend; bodies in
// generic/norm.h, instantiated for FP32, FP64, BF16 and FP16.
#include <math.h>
#include <string.h>

#include "cpu.h"

#define GENERIC_FILE "kernels/cpu/generic/norm.h"
#define GENERIC_LOWP
#include "generic/instantiate.h"
#undef GENERIC_LOWP
#undef GENERIC_FILE

void cpu_rmsnorm_forward(struct backend *be, struct tensor y, struct tensor rstd, struct tensor x,
                         struct tensor w, int N, int C, float eps) {
    CPU_CHECK_SAME("rmsnorm_forward", "w", w, x.dtype);
    CPU_DISPATCH("rmsnorm_forward", x.dtype, rmsnorm_forward, y.data, rstd.data, x.data, w.data,
                 N, C, eps);
}

void cpu_add_rmsnorm_forward(struct backend *be, struct tensor xout, struct tensor y,
                             struct tensor rstd, struct tensor a, struct tensor b, struct tensor w,
                             int N, int C, float eps) {
    const char *op = "add_rmsnorm_forward";
    CPU_CHECK_SAME(op, "a", a, xout.dtype);
    CPU_CHECK_SAME(op, "b", b, xout.dtype);
    CPU_CHECK_SAME(op, "y", y, xout.dtype);
    CPU_CHECK_SAME(op, "w", w, xout.dtype);
    CPU_DISPATCH(op, xout.dtype, add_rmsnorm_forward, xout.data, y.data, rstd.data, a.data,
                 b.data, w.data, N, C, eps);
}

void cpu_rmsnorm_backward(struct backend *be, struct tensor dx, struct tensor dw, struct tensor dy,
                          struct tensor x, struct tensor w, struct tensor rstd, int N, int C) {
    const char *op = "rmsnorm_backward";
    CPU_CHECK_SAME(op, "dx", dx, x.dtype);
    CPU_CHECK_GRAD(op, "dw", dw, x.dtype);
    CPU_CHECK_SAME(op, "dy", dy, x.dtype);
    CPU_CHECK_SAME(op, "w", w, x.dtype);
    CPU_DISPATCH(op, x.dtype, rmsnorm_backward, dx.data, dw.data, dw.dtype, dy.data, x.data,
                 w.data, rstd.data, N, C);
}

void cpu_embedding_forward(struct backend *be, struct tensor out, struct tensor wte,
                           struct tensor tokens, int N, int C, int vocab_start, int Vl) {
    CPU_DISPATCH("embedding_forward", out.dtype, embedding_forward, out.data, wte.data,
                 tokens.data, N, C, vocab_start, Vl);
}

void cpu_embedding_backward(struct backend *be, struct tensor dwte, struct tensor dout,
                            struct tensor tokens, int N, int C, int vocab_start, int Vl) {
    CPU_CHECK_GRAD("embedding_backward", "dwte", dwte, dout.dtype);
    CPU_DISPATCH("embedding_backward", dout.dtype, embedding_backward, dwte.data, dwte.dtype,
                 dout.data, tokens.data, N, C, vocab_start, Vl);
}

void cpu_rope_qkv(struct backend *be, struct tensor qkv, struct tensor q, struct tensor k,
                  struct tensor v, struct tensor cos, struct tensor sin, struct tensor doc_start,
                  int B, int T, int H, int Hkv, int D, bool inverse) {
    const int32_t *ds = doc_start.numel ? (const int32_t *)doc_start.data : NULL;
    CPU_DISPATCH(inverse ? "rope_qkv_join" : "rope_qkv_split", qkv.dtype, rope_qkv, qkv.data,
                 q.data, k.data, v.data, cos.data, sin.data, ds, B, T, H, Hkv, D, inverse);
}

void cpu_rope(struct backend *be, struct tensor x, struct tensor cos, struct tensor sin,
              struct tensor doc_start, int B, int T, int Hx, int D, int pos_offset, bool inverse) {
    const int32_t *ds = doc_start.numel ? (const int32_t *)doc_start.data : NULL;
    CPU_DISPATCH(inverse ? "rope_backward" : "rope_forward", x.dtype, rope, x.data, cos.data,
                 sin.data, ds, B, T, Hx, D, pos_offset, inverse);
}

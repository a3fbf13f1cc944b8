// cpu_attention.c: causal GQA attention of the CPU backend; bodies in
// generic/attention.h, instantiated for FP32 and FP64.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"

// Query rows per score block: block [i0, i0 + ATTN_BLOCK) reads keys [0, i1).
// 64 keeps a block's GEMMs large enough for BLAS while skipping ~3/8 of the
// T x T work at T = 256 (the causal upper triangle).
#define ATTN_BLOCK 64

#define GENERIC_FILE "kernels/cpu/generic/attention.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE

// Per-thread scratch for T: 2 * ATTN_BLOCK * T elements of elem bytes each.
static void *attention_scratch(struct backend *be, int T, size_t elem) {
    size_t per_thread = (size_t)2 * ATTN_BLOCK * (T > 0 ? T : 1) * elem;
    return cpu_scratch(be, per_thread * (size_t)omp_get_max_threads());
}

void cpu_attention_forward(struct backend *be, struct tensor out, struct tensor lse,
                           struct tensor q, struct tensor k, struct tensor v, int B, int T, int H,
                           int Hkv, int D) {
    CPU_CHECK_DTYPE("attention_forward", out.dtype);
    CHECK(D > 0, "attention_forward: head size D=%d", D);
    void *scratch = attention_scratch(be, T, dtype_size(out.dtype));
    if (out.dtype == DTYPE_FP32)
        attention_forward_f32(out.data, lse.data, q.data, k.data, v.data, B, T, H, Hkv, D, scratch);
    else
        attention_forward_f64(out.data, lse.data, q.data, k.data, v.data, B, T, H, Hkv, D, scratch);
}

void cpu_attention_backward(struct backend *be, struct tensor dq, struct tensor dk,
                            struct tensor dv, struct tensor dout, struct tensor q, struct tensor k,
                            struct tensor v, struct tensor out, struct tensor lse, int B, int T,
                            int H, int Hkv, int D) {
    const char *op = "attention_backward";
    CPU_CHECK_DTYPE(op, out.dtype);
    CHECK(D > 0, "attention_backward: head size D=%d", D);
    CPU_CHECK_SAME(op, "dq", dq, out.dtype);
    CPU_CHECK_SAME(op, "dk", dk, out.dtype);
    CPU_CHECK_SAME(op, "dv", dv, out.dtype);
    CPU_CHECK_SAME(op, "dout", dout, out.dtype);
    void *scratch = attention_scratch(be, T, dtype_size(out.dtype));
    if (out.dtype == DTYPE_FP32)
        attention_backward_f32(dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data,
                               out.data, lse.data, B, T, H, Hkv, D, scratch);
    else
        attention_backward_f64(dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data,
                               out.data, lse.data, B, T, H, Hkv, D, scratch);
}

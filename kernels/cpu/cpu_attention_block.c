// cpu_attention_block.c: one block of context-parallel ring attention on the
// CPU backend (kernels/ops.h, backend_attention_block_forward / _backward);
// bodies in generic/attention_block.h, instantiated for every storage dtype.
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"

#define GENERIC_LOWP
#define GENERIC_FILE "kernels/cpu/generic/attention_block.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE
#undef GENERIC_LOWP

static void *block_scratch(struct backend *be, int D, enum dtype dt) {
    return cpu_scratch(be, (size_t)2 * D * dtype_size(cpu_compute_dtype(dt)) *
                               (size_t)omp_get_max_threads());
}

void cpu_attention_block_forward(struct backend *be, struct tensor out, struct tensor lse,
                                 struct tensor q, struct tensor k, struct tensor v,
                                 struct tensor q_pos, struct tensor q_doc, struct tensor k_pos,
                                 int B, int Tq, int Tk, int H, int Hkv, int D, bool accumulate) {
    const char *op = "attention_block_forward";
    CPU_CHECK_DTYPE(op, out.dtype);
    const int32_t *qd = q_doc.numel ? (const int32_t *)q_doc.data : NULL;
    void *scratch = block_scratch(be, D, out.dtype);
    CPU_DISPATCH(op, out.dtype, attention_block_forward, out.data, lse.data, q.data, k.data,
                 v.data, q_pos.data, qd, k_pos.data, B, Tq, Tk, H, Hkv, D, accumulate, scratch);
}

void cpu_attention_block_backward(struct backend *be, struct tensor dq, struct tensor dk,
                                  struct tensor dv, struct tensor dout, struct tensor q,
                                  struct tensor k, struct tensor v, struct tensor out,
                                  struct tensor lse, struct tensor q_pos, struct tensor q_doc,
                                  struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv,
                                  int D) {
    const char *op = "attention_block_backward";
    CPU_CHECK_DTYPE(op, out.dtype);
    const int32_t *qd = q_doc.numel ? (const int32_t *)q_doc.data : NULL;
    void *scratch = block_scratch(be, D, out.dtype);
    CPU_DISPATCH(op, out.dtype, attention_block_backward, dq.data, dk.data, dv.data, dout.data,
                 q.data, k.data, v.data, out.data, lse.data, q_pos.data, qd, k_pos.data, B, Tq,
                 Tk, H, Hkv, D, scratch);
}

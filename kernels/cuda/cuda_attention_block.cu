// cuda_attention_block.cu: one block of context-parallel ring attention on
// the CUDA backend (kernels/ops.h, backend_attention_block_forward /
// _backward). A placeholder until the kernels land (issue 26): both entry
// points abort with a CHECK naming the op. The CPU backend's version is
// kernels/cpu/cpu_attention_block.c.
#include "cuda_internal.cuh"

void cuda_attention_block_forward(struct backend *be, struct tensor out, struct tensor lse,
                                  struct tensor q, struct tensor k, struct tensor v,
                                  struct tensor q_pos, struct tensor q_doc, struct tensor k_pos,
                                  int B, int Tq, int Tk, int H, int Hkv, int D, bool accumulate) {
    CHECK(false, "attention_block_forward: not built yet on the cuda backend (issue 26)");
}

void cuda_attention_block_backward(struct backend *be, struct tensor dq, struct tensor dk,
                                   struct tensor dv, struct tensor dout, struct tensor q,
                                   struct tensor k, struct tensor v, struct tensor out,
                                   struct tensor lse, struct tensor q_pos, struct tensor q_doc,
                                   struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv,
                                   int D) {
    CHECK(false, "attention_block_backward: not built yet on the cuda backend (issue 26)");
}

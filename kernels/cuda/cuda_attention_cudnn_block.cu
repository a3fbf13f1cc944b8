// cuda_attention_cudnn_block.cu: (placeholder while the native kernels are tested)
#include "cuda_internal.cuh"

bool cuda_attention_cudnn_block_forward(struct backend *be, struct tensor out, struct tensor lse,
                                        struct tensor q, struct tensor k, struct tensor v, struct tensor q_pos,
                                        bool doc_mask, struct tensor k_pos, int B, int Tq, int Tk, int H,
                                        int Hkv, int D, bool accumulate) {
    return false;
}
bool cuda_attention_cudnn_block_backward(struct backend *be, struct tensor dq, struct tensor dk,
                                         struct tensor dv, struct tensor dout, struct tensor q, struct tensor k,
                                         struct tensor v, struct tensor out, struct tensor lse,
                                         struct tensor q_pos, bool doc_mask, struct tensor k_pos, int B, int Tq,
                                         int Tk, int H, int Hkv, int D) {
    return false;
}

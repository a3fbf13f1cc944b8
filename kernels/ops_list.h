// ops_list.h: the compute ops of a backend, one X(name, return type,
// (parameters)) each: the one place an op's signature is written for the
// backends (docs/design.md §3, "Adding an op"). From this list come
//   - the entries of struct backend_ops (kernels/ops.h);
//   - the prototypes cpu_<name> (kernels/cpu/cpu.h) and cuda_<name>
//     (kernels/cuda/cuda_internal.cuh) that each backend defines;
//   - both tables (kernels/cpu/cpu_table.c, kernels/cuda/cuda_backend.cu);
//   - the link names cpu_serial_<name> of the CPU backend's serial build
//     (kernels/cpu/cpu.h).
// What each op computes, with shapes and dtypes: at its checked wrapper
// backend_<name>() in kernels/ops.h. rope is two wrappers:
// backend_rope_forward (inverse = false) and backend_rope_backward
// (inverse = true), and backend_rope_forward_docs / _backward_docs with
// per-token positions; likewise backend_attention_forward(_docs) and
// backend_attention_backward(_docs): the plain wrappers pass an empty
// doc_start (plain causal). attention_block_forward / _backward are one
// block (a rank's queries against one rank's keys) of context-parallel ring
// attention. attention_decode is generation's attention against a key/value
// cache (src/model, model_decode_chunk). fp8_* and matmul_fp8 are FP8
// training's linear layers (docs/design.md §5). moe_* are the
// mixture-of-experts layer's routing, dispatch and combine (src/model/moe.h).
// The memory entries (alloc, to_device, ...) are written
// out in struct backend_ops. Valid C and C++ (the CUDA backend).
#ifndef TRIDENT_OPS_LIST_H
#define TRIDENT_OPS_LIST_H

#define BACKEND_OPS(X)                                                                            \
    X(matmul, void, (struct backend *be, struct tensor out, struct tensor a, struct tensor b,     \
      int M, int N, int K, bool trans_a, bool trans_b, float alpha, float beta))                  \
    X(embedding_forward, void, (struct backend *be, struct tensor out, struct tensor wte,         \
      struct tensor tokens, int N, int C, int vocab_start, int Vl))                               \
    X(embedding_backward, void, (struct backend *be, struct tensor dwte, struct tensor dout,      \
      struct tensor tokens, int N, int C, int vocab_start, int Vl))                               \
    X(rmsnorm_forward, void, (struct backend *be, struct tensor y, struct tensor rstd,            \
      struct tensor x, struct tensor w, int N, int C, float eps))                                 \
    X(add_rmsnorm_forward, void, (struct backend *be, struct tensor xout, struct tensor y,       \
      struct tensor rstd, struct tensor a, struct tensor b, struct tensor w, int N, int C,        \
      float eps))                                                                                 \
    X(rmsnorm_backward, void, (struct backend *be, struct tensor dx, struct tensor dw,            \
      struct tensor dy, struct tensor x, struct tensor w, struct tensor rstd, int N, int C))      \
    X(rope, void, (struct backend *be, struct tensor x, struct tensor cos, struct tensor sin,     \
      struct tensor doc_start, int B, int T, int Hx, int D, int pos_offset, bool inverse))        \
    X(rope_qkv, void, (struct backend *be, struct tensor qkv, struct tensor q, struct tensor k,   \
      struct tensor v, struct tensor cos, struct tensor sin, struct tensor doc_start, int B,      \
      int T, int H, int Hkv, int D, bool inverse))                                                \
    X(attention_forward, void, (struct backend *be, struct tensor out, struct tensor lse,         \
      struct tensor q, struct tensor k, struct tensor v, struct tensor doc_start, int B, int T,   \
      int H, int Hkv, int D))                                                                     \
    X(attention_backward, void, (struct backend *be, struct tensor dq, struct tensor dk,          \
      struct tensor dv, struct tensor dout, struct tensor q, struct tensor k, struct tensor v,    \
      struct tensor out, struct tensor lse, struct tensor doc_start, int B, int T, int H,         \
      int Hkv, int D))                                                                            \
    X(attention_block_forward, void, (struct backend *be, struct tensor out, struct tensor lse,   \
      struct tensor q, struct tensor k, struct tensor v, struct tensor q_pos,                     \
      struct tensor q_doc, struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv, int D,     \
      bool accumulate))                                                                           \
    X(attention_block_backward, void, (struct backend *be, struct tensor dq, struct tensor dk,    \
      struct tensor dv, struct tensor dout, struct tensor q, struct tensor k, struct tensor v,    \
      struct tensor out, struct tensor lse, struct tensor q_pos, struct tensor q_doc,             \
      struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv, int D))                         \
    X(attention_decode, void, (struct backend *be, struct tensor out, struct tensor q,            \
      struct tensor k, struct tensor v, struct tensor k_cache, struct tensor v_cache,             \
      struct tensor pos, int B, int Tq, int Tmax, int H, int Hkv, int D))                         \
    X(swiglu_forward, void, (struct backend *be, struct tensor out, struct tensor gate,           \
      struct tensor up, size_t n))                                                                \
    X(swiglu_backward, void, (struct backend *be, struct tensor dgate, struct tensor dup,         \
      struct tensor dout, struct tensor gate, struct tensor up, size_t n))                        \
    X(ce_row_max, void, (struct backend *be, struct tensor rowmax, struct tensor logits, int N,   \
      int Vl, int Vvalid))                                                                        \
    X(ce_partials, void, (struct backend *be, struct tensor partials, struct tensor logits,       \
      struct tensor rowmax, struct tensor targets, int N, int Vl, int Vvalid, int vocab_start))   \
    X(ce_loss, void, (struct backend *be, struct tensor loss, struct tensor lse,                  \
      struct tensor partials, struct tensor rowmax, struct tensor targets, int N, int V,          \
      float smoothing, int ignore_index))                                                         \
    X(ce_backward, void, (struct backend *be, struct tensor dlogits, struct tensor logits,        \
      struct tensor lse, struct tensor targets, int N, int Vl, int Vvalid, int vocab_start,       \
      int V, float smoothing, int ignore_index, double scale))                                    \
    X(adamw, void, (struct backend *be, struct tensor param, struct tensor master,                \
      struct tensor grad, struct tensor m, struct tensor v, size_t n, double lr, double beta1,    \
      double beta2, double eps, double weight_decay, double grad_scale, int step))                \
    X(sum_squares, double, (struct backend *be, struct tensor x, size_t n))                       \
    X(sum_into, void, (struct backend *be, struct tensor acc, struct tensor x, size_t n))         \
    X(add, void, (struct backend *be, struct tensor out, struct tensor a, struct tensor b,        \
      size_t n))                                                                                  \
    X(copy, void, (struct backend *be, struct tensor dst, struct tensor src, size_t n))        \
    X(fp8_amax, void, (struct backend *be, struct tensor amax, struct tensor x, size_t n))        \
    X(fp8_cast, void, (struct backend *be, struct tensor out, struct tensor amax,                 \
      struct tensor saturated, struct tensor x, struct tensor scale, size_t n))                   \
    X(fp8_update_scale, void, (struct backend *be, struct tensor scale, struct tensor scale_inv,  \
      struct tensor history, struct tensor amax, int n, int len, float fp8_max, int margin,       \
      bool most_recent))                                                                          \
    X(matmul_fp8, void, (struct backend *be, struct tensor out, struct tensor a, struct tensor b, \
      struct tensor scale_inv_a, struct tensor scale_inv_b, int M, int N, int K, bool trans_a,    \
      bool trans_b, float beta))                                                                  \
    X(moe_route, void, (struct backend *be, struct tensor probs, struct tensor lse,               \
      struct tensor topk_idx, struct tensor topk_w, struct tensor stats, struct tensor logits,    \
      struct tensor sel_bias, int N, int E, int k, bool renorm))                                  \
    X(moe_route_backward, void, (struct backend *be, struct tensor dlogits, struct tensor dtopk_w,\
      struct tensor probs, struct tensor lse, struct tensor topk_idx, struct tensor aux_w, int N, \
      int E, int k, bool renorm, float z_scale))                                                  \
    X(moe_dispatch, void, (struct backend *be, struct tensor counts, struct tensor dest,          \
      struct tensor src, struct tensor topk_idx, int N, int E, int k, int capacity))              \
    X(moe_permute, void, (struct backend *be, struct tensor xp, struct tensor x, struct tensor src,\
      int M, int C, int k))                                                                       \
    X(moe_permute_backward, void, (struct backend *be, struct tensor dx, struct tensor dxp,       \
      struct tensor dest, int N, int C, int k))                                                   \
    X(moe_combine, void, (struct backend *be, struct tensor y, struct tensor yp, struct tensor w,  \
      struct tensor dest, int N, int C, int k, bool sigmoid, bool accumulate))                    \
    X(moe_combine_backward, void, (struct backend *be, struct tensor dyp, struct tensor dw,       \
      struct tensor dy, struct tensor yp, struct tensor w, struct tensor dest, int N, int C,      \
      int k, bool sigmoid))

#endif

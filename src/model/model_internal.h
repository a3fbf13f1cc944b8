// model_internal.h: the private state of struct model, shared by model.c
// (layout, arenas, parameters) and model_pass.c (forward and backward).
#ifndef TRIDENT_MODEL_INTERNAL_H
#define TRIDENT_MODEL_INTERNAL_H

#include "model.h"
#include "moe.h"

// Every tensor of the arenas starts at a multiple of TENSOR_ALIGN bytes from
// the arena's base (a backend allocation, 256-byte aligned on CUDA): cuBLASLt
// picks its fastest kernels only for 256-byte aligned operands (its default
// assumption; a less aligned pointer gets a slower kernel), cuDNN's plans want
// 16. Parameters are placed by element offset, ALIGN_ELEMS elements apart:
// 128 elements are 256 bytes in the narrowest dtype (BF16/FP16 weights) and
// more in the gradient arena's FP32.
enum { TENSOR_ALIGN = 256, ALIGN_ELEMS = 128 };

// Weights of one decoder block (views into the parameter or gradient arena).
struct block {
    struct tensor ln1_w;  // (C,)
    struct tensor wq;     // (Hl*D, C)
    struct tensor wk;     // (Hkvl*D, C)
    struct tensor wv;     // (Hkvl*D, C)
    struct tensor bq, bk, bv; // (Hl*D,), (Hkvl*D,) x2: qkv_bias, else empty
    struct tensor qn_w, kn_w; // (D,) each: qk_norm's q_norm, k_norm, else empty
    struct tensor wo;     // (C, Hl*D)
    struct tensor ln2_w;  // (C,)
    struct tensor wgate;  // (Fl, C)
    struct tensor wup;    // (Fl, C)
    struct tensor wdown;  // (C, Fl)
    // A mixture-of-experts block (llama_layer_moe): wgate, wup, wdown are
    // empty and moe holds the router, the stacked experts and the shared
    // expert (moe.h; expert_bias empty).
    bool is_moe;
    struct moe_weights moe;
};

// Activations of one block for the backward pass. A slot holds those its
// recompute mode keeps (block_keeps in model.c); the others are views of the
// one recompute buffer (model.re) that every block and slot shares, which
// the backward pass refills (model_pass.c, block_recompute) just before the
// block's backward. Norm outputs are (Ns, C): sequence-sharded under
// sequence parallelism, all-gathered into model.ln_full where a GEMM reads them.
struct block_acts {
    struct tensor ln1, rstd1;     // (Ns, C), (Ns,)
    struct tensor q, k, v;        // (B, T, Hl, D), (B, T, Hkvl, D) x2, after RoPE
    struct tensor qr, kr;         // qk_norm: q, k before their norm (projection + bias), else empty
    struct tensor rstdq, rstdk;   // qk_norm: (B T Hl,), (B T Hkvl,) the norms' 1 / rms
    struct tensor att, lse;       // (B, T, Hl, D), (B, Hl, T)
    struct tensor xmid;           // (Ns, C) residual after attention
    struct tensor ln2, rstd2;     // (Ns, C), (Ns,)
    struct tensor gate, up, act;  // (N, Fl) each; empty for a MoE block
    struct tensor moe;            // MoE block: moe_activation_bytes (as I32 words), else empty
};

// The routing of a microbatch summed over some MoE blocks, in block order:
// what transformers' load-balancing loss over the model's blocks needs
// (moe_aux_loss_layers), carried from stage to stage in the tail of the
// pipeline's messages (model_pass.c), with the backward's loss scale.
struct moe_route_sum {
    double routed[MOE_MAX_EXPERTS];   // tokens routed to expert e (top-k, before the capacity)
    double prob_sum[MOE_MAX_EXPERTS]; // sum over tokens of p[t, e]
    double loss_scale;                // backward: the last virtual stage's loss_scale (forward: 0)
};

// What one microbatch in flight keeps between its forward and its backward
// through one model chunk: a pipeline stage holds up to n_slots of these.
struct slot {
    struct tensor *x;              // (max_layers + 1) residual streams (Ns, C)
    struct block_acts *acts;       // (max_layers)
    struct tensor lnf, rstdf;      // (Ns, C), (Ns,)       last stage only; lnf is
                                   // model.re_lnf unless recompute is none
    struct tensor logits, dlogits; // (N, Vl)               last stage only; dlogits
                                   // is logits (overwritten) unless recompute is none
    struct tensor rowmax, partials, lse, loss; // (N,), (N, 3), (N,), (N,)
    struct tensor tokens, targets; // (N,) I32
    struct tensor doc_start;       // (N,) I32: (B, T) document starts (model_set_doc_eot);
                                   // under cp > 1 their global positions (ring_attention.h)
    struct tensor rope_pos;        // (N,) I32 under cp > 1: RoPE's doc_start argument,
                                   // t - (global position - document start); else empty
    // (max_layers) the routing each MoE block's forward left for its
    // backward (moe.h; unused for dense blocks), host memory
    struct moe_stats *moe_st;
    // MoE models: the routing of the model's MoE blocks before this chunk
    // (the stage message's tail, model_pass.c), host memory
    struct moe_route_sum moe_in;
};

// shard.split_backward (model.h, model_memory.w_stash_bytes): one of the
// shard.n_wstash W stashes, everything the deferred W of a B reads (the
// slot is reused after the B), model.c wstash_bytes. chunk: the chunk whose
// W is pending (-1: none); used: the stash bytes its B wrote.
struct wstash {
    struct tensor t; // wstash_bytes / 4 I32 words
    int chunk;
    size_t used;
};

// Generation's key/value cache (model_kv_cache_init, model_decode_chunk):
// one allocation, rows 0 while there is none.
struct kv_cache {
    int rows, len;             // sequences, positions of each
    struct tensor *k, *v;      // (n_local_layers) each (rows, len, Hkvl, D), model dtype
    struct tensor pos;         // (rows,) I32: each row's first new position of the step
    struct tensor rope_off;    // (rows * len,) I32: RoPE's doc_start argument, -position
    struct tensor row32;       // (Vl,) FP32: one logits row widened (model_decode_logits_at)
    int32_t *host_off;         // (rows * len,) rope_off staged on the host
    int Tq;                    // new tokens per row of the last step (0: none yet)
    struct tensor msg[2];      // a pipeline stage's messages in and out (rows x
                               // model_decode_max_tokens x C; empty for a whole model)
    void *host_msg[2];         // the same in host memory when the messages are
    void *base;                // the backend allocation
};

// FP8 linear layers (model.h "FP8 linear layers", model_fp8.c). Tensor i
// of the scaling arrays: the forward tensors (x, w) of FP8 block b, site s
// at (b * FP8_SITES + s) * 2 + {0: x, 1: w}, then the output gradients at
// n_fwd + b * FP8_SITES + s (two formats: fp8_update_scale runs on each range).
enum { FP8_SITE_QKV, FP8_SITE_O, FP8_SITE_GATE_UP, FP8_SITE_DOWN, FP8_SITES };
struct model_fp8 {
    struct model_fp8_config cfg;    // cfg.on false: no FP8
    int n_blocks;                   // FP8 blocks of this rank
    int *block;                     // (n_local_layers) FP8 block index of each block, -1: none
    int *layer;                     // (n_blocks) global layer of each
    int n_fwd, n;                   // forward tensors (8 per block), all (12 per block)
    size_t w_off[FP8_SITES + 1];    // element offsets of each site's weight in a block's copy
    struct tensor w8;               // (n_blocks * w_off[FP8_SITES]) E4M3 weight copies
    struct tensor x8, dy8;          // scratch: a GEMM input (E4M3), an output gradient
    struct tensor scale, scale_inv, amax; // (n,) FP32
    struct tensor history;          // (n, history_len) FP32 under delayed scaling, else empty
    struct tensor saturated;        // (1,) I64: this step's count (fp8_cast)
    bool *w_fresh;                  // (n_blocks) the copy holds this step's cast
    bool training;                  // inside a training step (model_fp8_step_begin/_end)
    bool recomputing;               // in block_recompute: casts repeat the forward's
    void *base;                     // the backend allocation
};

struct model {
    struct llama_config cfg;
    struct model_shard shard;
    struct backend *be;
    enum dtype dtype;       // weights and activations
    enum dtype stat;        // saved statistics: fp32, fp64 for an fp64 model
    int B, T, N;            // microbatch shape, N = B*T: T = Tg / cp, this rank's tokens
    int Tg;                 // tokens of a whole sequence (the caller's T)
    int cp, cp_rank;        // context parallel: ring size and this rank's place (1, 0: none)
    int Ns;                 // rows of the residual stream: N / tp with sequence parallel, else N
    bool sp;
    int C, D, Hl, Hkvl, Fl; // local widths
    int Vl, vocab_start, Vvalid;
    int n_local_layers;     // over all chunks
    int block0[MODEL_MAX_CHUNKS]; // index of each chunk's first block in blocks
    int max_layers;         // of one chunk
    bool first, last;       // holds the first / last virtual stage

    int n_params;
    struct param_info *params;
    struct model_memory mem;
    struct tensor param_arena, grad_arena, act_arena;

    struct tensor wte, dwte;       // (Vl, C) embedding, when held
    struct tensor norm_w, dnorm_w; // (C,) final norm (last stage)
    struct tensor head, dhead;     // (Vl, C) lm_head or the tied embedding
    // (Vl, C) gradient dtype: with split_backward on a rank that runs both the
    // embedding's and the tied head's pass (ZB-V's stage 0), the head's dW of
    // the tied weight accumulates here (dhead points at it), and
    // model_finish_grads adds it to dwte: the sum 1F1B's two copies make
    // (model.h, model_finish_grads). Lives past the gradient arena's
    // n_params elements, in the same allocation; else empty.
    struct tensor tied_dhead;
    struct block *blocks, *dblocks;

    struct slot *slots;            // (n_slots)
    struct wstash *wstash;         // (n_wstash) under split_backward, else NULL
    int slots_used;                // high-water mark: 1 + the largest slot index used
    struct tensor rope_cos, rope_sin; // (max_seq_len, D/2)
    struct tensor loss_acc;           // (1,) FP64: the device loss sum (model_loss_sum_take)
    // Context parallelism (cp > 1, ring_attention.h; else empty): every cp
    // rank's global token positions, constant; the ring's two travelling
    // buffers [k | v | dk | dv], each part (N, Hkvl*D) in the model dtype.
    struct tensor cp_pos;             // (cp, N) I32
    struct tensor ring[2];            // (4 N Hkvl D) each
    // backward scratch
    struct tensor tmp, dx, dln;    // (N, C), (Ns, C), (N, C)
    // Sequence parallel: the all-gathered norm output (N, C) that the GEMMs
    // read, row-parallel output after its reduce-scatter, input gradient after
    // its reduce-scatter (Ns, C), and the all-gathered residual gradient
    // (N, C). Without it ln_full is unused (the GEMMs read the norm output)
    // and the others alias their full-size twins (tmp, dln, dx).
    struct tensor ln_full, tmp_s, dln_s, dx_full;
    // What the blocks do not keep (recompute selective or full): one set,
    // refilled before each block's backward; and the final norm's output.
    struct block_acts re;
    struct tensor re_lnf;          // (Ns, C)
    struct tensor datt, dq, dk, dv; // (N, Hl*D), (N, Hl*D), (N, Hkvl*D) x2
    struct tensor dqr, dkr;        // qk_norm: (N, Hl*D), (N, Hkvl*D) the gradients of qr, kr
    struct tensor ones;            // qkv_bias: (N,) ones in the model dtype (bias GEMMs)
    // (N, (Hl + 2 Hkvl) D): the one QKV GEMM's output rows [q | k | v] before
    // the RoPE split (forward), then their gradient (backward)
    struct tensor qkv;
    struct tensor dgate, dup, dact; // (N, Fl)
    struct tensor kv_grad;         // (Hkv*D, C) when key/value heads are replicated over TP
    struct tensor red, red_s;      // (N, C), (Ns, C) FP32: TP sums of BF16/FP16 activations

    // Mixture of experts (cfg.moe_experts > 0): the layer's shape, the one
    // scratch every MoE block's forward and backward share, the rank's MoE
    // blocks (n_moe), the model's (n_moe_model, moe_layer[j] the layer of the
    // j-th) and what the training backward passes routed since
    // model_moe_stats_take: [microbatches, aux loss sum, z loss sum, dropped,
    // routed (n_moe_model, E)] (model.h).
    struct moe_config moe;
    struct tensor moe_scratch;
    int n_moe, n_moe_model;
    int *moe_layer;
    double *moe_log;
    struct model_fp8 fp8;          // FP8 linear layers (model_fp8_init); fp8.cfg.on false: none
    struct kv_cache kv;            // generation's cache (kv.rows 0: none)
    bool decoding;                 // inside model_decode_chunk: the pass is a decode step
                                   // (shape (kv.rows, kv.Tq), attention against kv)
    bool decode_variant;           // model_set_decode_invariant(m, false): steps use backend_matmul
    struct parallel_groups groups; // model_set_groups; groups.tp NULL: tp = 1
    bool messages_on_device;       // stage messages (in, out, dout, din) are backend memory
    int kv_head0, kv_replicas;

    void (*grad_ready)(void *ctx, size_t ready_from);
    void *grad_ready_ctx;
    void (*unit_hook)(void *ctx, int unit, enum model_unit_event ev);
    void *unit_hook_ctx;
    int n_units;
    struct model_unit *units;      // (n_units)
    struct tensor *unit_params, *unit_grads; // (n_units) where each unit is bound
    int embed_unit, head_unit;     // -1 when not held
    int *block_unit;               // (L_local) unit of each block
    size_t *block_offset;          // (L_local,) arena offset of each block's first parameter
    size_t head_offset;            // arena offset of model.norm.weight (last stage)

    double *host_loss;             // (N,)
    int32_t doc_eot;               // end-of-text id that starts documents; -1: plain causal
    int32_t *host_doc;             // (B, Tg) doc_start built on the host
    int32_t *host_tok, *host_tgt;  // (N,) this rank's chunks of tokens, targets (cp > 1)
    int32_t *host_pos;             // (2 N,) rope offsets and document starts staged for
                                   // upload (cp > 1)
};

static inline int model_chunk_layers(const struct model *m, int chunk) {
    return m->shard.layer_end[chunk] - m->shard.layer_begin[chunk];
}
static inline bool model_chunk_first(const struct model *m, int chunk) {
    return chunk == 0 && m->first;
}
static inline bool model_chunk_last(const struct model *m, int chunk) {
    return chunk == m->shard.n_chunks - 1 && m->last;
}

// The attention's projections to q, k, v after the GEMMs (model_pass.c),
// for every path that runs a block's attention (training passes, and
// generation with a key/value cache): Hugging Face's Qwen2Attention /
// Qwen3Attention / LlamaAttention order. qp (R, Hl D), kp (R, Hkvl D), v
// (R, Hkvl D), R = B T rows, hold x @ W^T of the block's w (model dtype);
// in place, qkv_bias adds bq, bk, bv (R <= m->N). Then q (R, Hl D) and k
// (R, Hkvl D) receive qk_norm's RMSNorm over each head's D values (weights
// w->qn_w, w->kn_w, eps norm_eps, statistics into rstd_q (R Hl,), rstd_k
// (R Hkvl,)) of qp and kp, which keep their values; without qk_norm q, k are
// copies of qp, kp (or qp, kp themselves when they alias). Last, RoPE on q
// and k at positions pos_offset + t - docs[b, t] (docs as
// backend_rope_forward_docs; empty: plain). Shapes (B, T, heads, D).
void model_attn_qkv_post(struct model *m, const struct block *w, struct tensor qp, struct tensor kp,
                         struct tensor v, struct tensor q, struct tensor k, struct tensor rstd_q,
                         struct tensor rstd_k, struct tensor docs, int B, int T, int pos_offset);

// Sums (or maxes) a tensor-parallel partial result over the TP group, in place
// (model_pass.c). A no-op for tp = 1.
void model_tp_all_reduce(struct model *m, struct tensor t, enum comm_op op);

// ---- FP8 sites of block blk (model_fp8.c), called by model_pass.c when
// model_fp8_block(m, blk): the GEMMs of the model-dtype path with FP8 operands
// (model.h). Shapes as the model-dtype GEMMs they replace; weights are the
// block's copy (cast on first use in a step, model_fp8_weights).

// Whether block blk (local index) runs FP8 GEMMs now (not while decoding).
static inline bool model_fp8_block(const struct model *m, int blk) {
    return m->fp8.cfg.on && !m->decoding && m->fp8.block[blk] >= 0;
}
// Casts the block's weights w into its copy unless this step's cast is there.
void model_fp8_weights(struct model *m, int blk, const struct block *w);
// qkv (N, Hl D + 2 Hkvl D) = n1 (N, C) @ [Wq; Wk; Wv]^T when qkv.numel, else
// qp (N, Hl D), kp, v (N, Hkvl D) the three projections.
void model_fp8_qkv(struct model *m, int blk, struct tensor n1, struct tensor qkv, struct tensor qp,
                   struct tensor kp, struct tensor v);
// y (N, C) = att (N, Hl D) @ Wo^T.
void model_fp8_o(struct model *m, int blk, struct tensor y, struct tensor att);
// [gate^T; up^T] (2 Fl, N) = [Wgate; Wup] @ n2^T: gu when gu.numel, else gate, up (Fl, N).
void model_fp8_gate_up(struct model *m, int blk, struct tensor n2, struct tensor gu,
                       struct tensor gate, struct tensor up);
// y (N, C) = act^T @ Wdown^T, act stored (Fl, N).
void model_fp8_down(struct model *m, int blk, struct tensor y, struct tensor act);
// dact (Fl, N) = Wdown^T @ dy^T, dwdown (C, Fl) += dy^T @ act^T; dy (N, C).
void model_fp8_down_backward(struct model *m, int blk, struct tensor dact, struct tensor dwdown,
                             struct tensor dy, struct tensor act);
// dln (N, C) = dgate^T-part @ Wgate + dup^T-part @ Wup; dwgate, dwup (Fl, C)
// += dgate (Fl, N) @ n2, dup @ n2 (dwgu (2 Fl, C) at once when its numel is set).
void model_fp8_gate_up_backward(struct model *m, int blk, struct tensor dln, struct tensor dwgu,
                                struct tensor dwgate, struct tensor dwup, struct tensor dgate,
                                struct tensor dup, struct tensor n2);
// datt (N, Hl D) = dy (N, C) @ Wo; dwo (C, Hl D) += dy^T @ att.
void model_fp8_o_backward(struct model *m, int blk, struct tensor datt, struct tensor dwo,
                          struct tensor dy, struct tensor att);
// dln (N, C) = the gradients dy of the projections through [Wq; Wk; Wv]; the
// weights' gradients += dy^T @ n1: fused (dqkv (N, Hl D + 2 Hkvl D) and dwqkv
// when dwqkv.numel) or per projection (dq (N, Hl D), dk, dv (N, Hkvl D) into
// dwq, dwk, dwv).
void model_fp8_qkv_backward(struct model *m, int blk, struct tensor dln, struct tensor n1,
                            struct tensor dqkv, struct tensor dwqkv, struct tensor dq,
                            struct tensor dk, struct tensor dv, struct tensor dwq,
                            struct tensor dwk, struct tensor dwv);

// Reports a unit event to the unit hook (model.h); a no-op without a hook or unit (-1).
static inline void model_unit_event(struct model *m, int unit, enum model_unit_event ev) {
    if (m->unit_hook && unit >= 0) m->unit_hook(m->unit_hook_ctx, unit, ev);
}

#endif

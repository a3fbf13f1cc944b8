// model_pass.c: forward and backward passes of the decoder (model.h) for one
// model chunk of one microbatch, with the tensor- and sequence-parallel
// communication of Megatron-LM (Shoeybi et al. 2019 §3; Korthikanti et al.
// 2022 §4.2.2: the g / g-bar conjugate all-gather and reduce-scatter).
#include <string.h>

#include "base/nvtx.h"

#include "model.h"
#include "model_internal.h"
#include "ring_attention.h"

void model_set_groups(struct model *m, const struct parallel_groups *groups) {
    struct parallel_groups g = groups ? *groups : (struct parallel_groups){0};
    struct comm_group *tp_host = parallel_host_group(g.tp, g.host_tp);
    CHECK((!g.tp || g.tp->size == m->shard.tp_size) && (!tp_host || tp_host->size == m->shard.tp_size),
          "TP group of %d ranks (host %d) for a shard of tp %d", g.tp ? g.tp->size : 0,
          tp_host ? tp_host->size : 0, m->shard.tp_size);
    CHECK(m->cp == 1 || (g.cp && g.cp->size == m->cp), "CP group of %d ranks for cp %d",
          g.cp ? g.cp->size : 0, m->cp);
    m->groups = g;
    if (m->cfg.moe_experts) { // expert parallelism's all-to-alls (moe.h, struct moe_ep)
        CHECK(m->moe.ep.size <= 1 || (g.ep && g.ep->size == m->moe.ep.size),
              "EP group of %d ranks for ep %d", g.ep ? g.ep->size : 0, m->moe.ep.size);
        m->moe.ep.group = g.ep, m->moe.ep.host = g.host_ep;
    }
}

// The host waits for the compute stream before a TP collective, unless the
// group orders itself after it (NCCL: comm_stream_ordered).
static void sync_for_tp(struct model *m) {
    comm_order_after_compute(m->groups.tp, m->be);
}

void model_tp_all_reduce(struct model *m, struct tensor t, enum comm_op op) {
    if (m->shard.tp_size == 1) return;
    CHECK(m->groups.tp, "tp = %d but no TP group was set (model_set_groups)", m->shard.tp_size);
    sync_for_tp(m);
    comm_all_reduce(m->groups.tp, t.data, t.numel, t.dtype, op);
}
static void tp_sum(struct model *m, struct tensor t) { model_tp_all_reduce(m, t, COMM_SUM); }

// full (N, C) = the all-gather over TP of part (Ns, C), under sequence
// parallelism (Megatron's g); without it part already is full.
static void sp_gather(struct model *m, struct tensor full, struct tensor part) {
    if (!m->sp) return;
    sync_for_tp(m);
    comm_all_gather(m->groups.tp, part.data, full.data, (size_t)m->Ns * m->C, full.dtype);
}

// Completes a TP-partial (N, C) result: under sequence parallelism the
// reduce-scatter of full into part (Ns, C) (Megatron's g-bar); without it the
// all-reduce of full in place (part aliases full).
// BF16/FP16 activations are widened into m->red and summed in FP32, then
// rounded once (design.md §5: FP32 reductions).
static void sp_reduce(struct model *m, struct tensor part, struct tensor full) {
    if (m->shard.tp_size == 1) return;
    size_t nf = (size_t)m->N * m->C, np = (size_t)m->Ns * m->C;
    bool lowp = full.dtype == DTYPE_BF16 || full.dtype == DTYPE_FP16;
    if (lowp) {
        backend_copy(m->be, m->red, full, nf);
        full = m->red;
    }
    if (!m->sp) {
        tp_sum(m, full);
        if (lowp) backend_copy(m->be, part, m->red, nf);
        return;
    }
    sync_for_tp(m);
    struct tensor out = lowp ? m->red_s : part;
    comm_reduce_scatter(m->groups.tp, full.data, out.data, np, full.dtype, COMM_SUM);
    if (lowp) backend_copy(m->be, part, m->red_s, np);
}

// The (N, C) rows a GEMM reads of a norm output (Ns, C): under sequence
// parallelism its all-gather into m->ln_full (Megatron's g), else itself.
// The activations keep the sequence-sharded rows (Korthikanti et al. 2022,
// §4.2.2), so the backward pass gathers them again.
static struct tensor gathered(struct model *m, struct tensor norm) {
    if (!m->sp) return norm;
    sp_gather(m, m->ln_full, norm);
    return m->ln_full;
}

// part (Ns, C) = this rank's rows of full (N, C) under sequence parallelism
// (the rows its reduce-scatter would give it: rank r's Ns from r Ns), of a
// result every TP rank computed whole (the MoE layer); without it part
// aliases full.
static void own_rows(struct model *m, struct tensor part, struct tensor full) {
    if (!m->sp) return;
    size_t np = (size_t)m->Ns * m->C;
    backend_copy(m->be, part, tensor_slice(full, (size_t)m->shard.tp_rank * np, np), np);
}

static void grads_ready(struct model *m, size_t from) {
    if (m->grad_ready) m->grad_ready(m->grad_ready_ctx, from);
}

void model_finish_unit_grads(struct model *m, int u) {
    const struct model_unit *un = &m->units[u];
    if (m->shard.tp_size > 1) // under SP each rank's norm-gain gradient covers only its rows;
                              // qk_norm's gains' only its heads
        for (int i = un->first_param; i < un->first_param + un->n_params; i++)
            if ((m->sp && m->params[i].tp_replicated && !m->params[i].tp_whole_grad) ||
                m->params[i].tp_sum_grad) {
                const struct param_info *p = &m->params[i];
                tp_sum(m, tensor_slice(m->unit_grads[u], p->offset - un->begin, p->numel));
            }
    if (m->kv_replicas == 1 || un->kind != MODEL_UNIT_BLOCK) return;
    // a key/value head's rows of k_proj, v_proj (D C elements) and biases (D)
    const struct block *db = &m->dblocks[un->block];
    struct tensor g[4] = {db->wk, db->wv, db->bk, db->bv};
    size_t head[4] = {(size_t)m->D * m->C, (size_t)m->D * m->C, (size_t)m->D, (size_t)m->D};
    for (int i = 0; i < (m->cfg.qkv_bias ? 4 : 2); i++) {
        struct tensor all = tensor_slice(m->kv_grad, 0, (size_t)m->cfg.n_kv_heads * head[i]);
        backend_memset0(m->be, all);
        struct tensor mine = tensor_slice(all, (size_t)m->kv_head0 * head[i], head[i]);
        backend_copy(m->be, mine, g[i], head[i]);
        tp_sum(m, all);
        backend_copy(m->be, g[i], mine, head[i]);
    }
}

void model_finish_grads(struct model *m) {
    for (int u = 0; u < m->n_units; u++) model_finish_unit_grads(m, u);
    if (m->tied_dhead.numel) { // the embedding's gradient + the head's, then the buffer emptied
        backend_add(m->be, m->dwte, m->dwte, m->tied_dhead, m->tied_dhead.numel);
        backend_memset0(m->be, m->tied_dhead);
    }
}

// ---- forward ---------------------------------------------------------------------

void model_set_doc_eot(struct model *m, int32_t eot) { m->doc_eot = eot < 0 ? -1 : eot; }

// The document starts the kernels of slot S read: its doc_start (B, T), or
// an empty tensor (plain causal) without model_set_doc_eot.
static struct tensor docs_of(const struct model *m, const struct slot *S) {
    return m->doc_eot >= 0 ? S->doc_start : tensor_view(NULL, DTYPE_I32, 0);
}

// The doc_start argument of the RoPE ops: under context parallelism the
// offsets that rotate each local token by its global position in its
// document (ring_attention.h, cp_slot_positions), else docs_of.
static struct tensor rope_docs_of(const struct model *m, const struct slot *S) {
    if (m->decoding) return tensor_slice(m->kv.rope_off, 0, (size_t)m->N); // -position per row
    return m->cp > 1 ? S->rope_pos : docs_of(m, S);
}

// backend_matmul of the forward pass; in a generation step the
// batch-invariant product (backend_matmul_invariant: each row's bits
// independent of the step's shape), unless model_set_decode_invariant(m,
// false).
static void forward_matmul(struct model *m, struct tensor out, struct tensor a, struct tensor b,
                           int M, int N, int K, bool trans_a, bool trans_b, float beta) {
    if (m->decoding && !m->decode_variant)
        backend_matmul_invariant(m->be, out, a, b, M, N, K, trans_a, trans_b, 1.0f, beta);
    else
        backend_matmul(m->be, out, a, b, M, N, K, trans_a, trans_b, 1.0f, beta);
}

// y (N, out) = x (N, in) @ W^T, W (out, in) in PyTorch's Linear layout.
static void linear(struct model *m, struct tensor y, struct tensor x, struct tensor w, int out,
                   int in) {
    forward_matmul(m, y, x, w, m->N, out, in, false, true, 0.0f);
}

// The norm that reads a block's output x[i+1] next in the same chunk: the
// next block's input norm, or the final norm after the last stage's last
// block; none (n.y.data NULL) when x[i+1] leaves the chunk as a stage
// message. The block's last residual add computes it in the same pass
// (backend_add_rmsnorm_forward), and the next block skips its own.
struct next_norm {
    struct tensor y, rstd, w;
};

// Which part of a backward pass runs (model.h): all of it (model_backward_chunk),
// B (model_backward_chunk_input: every op but the weight-gradient GEMMs, whose
// operands it stashes) or W (model_backward_chunk_weight: only those GEMMs,
// from the stash). One walk over the same code in every mode, so B and W of a
// microbatch issue exactly the fused pass's ops (Qi et al. 2024 §2).
enum bwd_mode { BWD_FUSED, BWD_INPUT, BWD_WEIGHT };
struct bwd {
    enum bwd_mode mode;
    char *stash;          // the W stash (model.c, wstash_bytes; split only), cap bytes
    size_t cap, at;       // bytes of it, and used so far by this walk
    struct tensor last_x; // the previous weight-gradient GEMM's x (a stash piece under split)
};

// The walk runs the input half: everything but the weight-gradient GEMMs.
static bool bwd_input(const struct bwd *b) { return b->mode != BWD_WEIGHT; }

// The next n elements (src's dtype) of the stash, TENSOR_ALIGN-aligned: B
// copies src there, W reads them (src's data unused).
static struct tensor stash_piece(struct model *m, struct bwd *b, struct tensor src, size_t n) {
    size_t bytes = n * dtype_size(src.dtype);
    CHECK(b->at + bytes <= b->cap, "W stash: %zu + %zu bytes of %zu (model.c, wstash_bytes)", b->at,
          bytes, b->cap);
    struct tensor t = tensor_view(b->stash + b->at, src.dtype, n);
    b->at += (bytes + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN;
    if (b->mode == BWD_INPUT) backend_copy(m->be, t, src, n);
    return t;
}

// Without a gradient arena (ZeRO-2/3) the unit's gradient views B wrote
// (fsdp's buffer, reused before the W) are not those the W writes: at the
// end of B the unit's gradients that are no GEMM's (the vectors: norm
// gains, biases) go to the stash, and at the end of the W come back into
// the views bound for it, which then hold the fused pass's gradients of
// the microbatch (zero-initialised buffers both: the same bits).
static void unit_input_grads(struct model *m, struct bwd *b, int u) {
    if (b->mode == BWD_FUSED || !m->shard.no_grad_arena || u < 0) return;
    const struct model_unit *un = &m->units[u];
    for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
        const struct param_info *p = &m->params[i];
        if (p->cols != 1) continue;
        struct tensor g = tensor_slice(m->unit_grads[u], p->offset - un->begin, p->numel);
        struct tensor t = stash_piece(m, b, g, p->numel);
        if (b->mode == BWD_WEIGHT) backend_copy(m->be, g, t, p->numel);
    }
}

// A GEMM operand t of n elements into the stash (B) or back from it (W).
// part: under sequence parallelism t is the all-gather (N, C) of part (Ns,
// C) (m->ln_full of a norm output, m->dx_full of m->dx): the stash keeps
// part, and W gathers it again into t (the same bits; t is W's buffer: the
// scratch m->ln_full or m->dx_full); else NULL, or ignored without it.
static struct tensor stash_operand(struct model *m, struct bwd *b, struct tensor t, size_t n,
                                   const struct tensor *part) {
    if (!m->sp || !part) return stash_piece(m, b, t, n);
    struct tensor piece = stash_piece(m, b, *part, (size_t)m->Ns * m->C);
    if (b->mode == BWD_WEIGHT) sp_gather(m, t, piece);
    return t;
}

// A weight-gradient GEMM dw (M, Nn) += op(dy) (M, K) @ op(x) (K, Nn)
// (backend_matmul, beta 1): run now (fused), both operands copied into the
// stash (B: the slot is reused after it, the scratch sooner) or run from the
// stash (W: dy and x give only their dtypes, or are the gather buffers).
// dy_part, x_part as stash_operand's part; same_x: x is the previous GEMM's
// x, stashed once.
static void wgrad(struct model *m, struct bwd *b, struct tensor dw, struct tensor dy,
                  const struct tensor *dy_part, struct tensor x, const struct tensor *x_part,
                  bool same_x, int M, int Nn, int K, bool ta, bool tb) {
    if (b->mode != BWD_FUSED) {
        dy = stash_operand(m, b, dy, (size_t)M * K, dy_part);
        x = same_x ? b->last_x : stash_operand(m, b, x, (size_t)K * Nn, x_part);
        b->last_x = x;
        if (b->mode == BWD_INPUT) return;
    }
    backend_matmul(m->be, dw, dy, x, M, Nn, K, ta, tb, 1.0f, 1.0f);
}

// dx (N, in) = dy (N, out) @ W (out, in); dW (out, in) += dy^T @ x (N, in)
// (the latter through wgrad, x_part and same_x as there).
static void linear_backward(struct model *m, struct bwd *b, struct tensor dx, float beta_dx,
                            struct tensor dw, struct tensor dy, struct tensor x,
                            const struct tensor *x_part, bool same_x, struct tensor w, int out,
                            int in) {
    if (bwd_input(b)) backend_matmul(m->be, dx, dy, w, m->N, in, out, false, false, 1.0f, beta_dx);
    wgrad(m, b, dw, dy, NULL, x, x_part, same_x, out, in, m->N, true, false);
}

// a and b as one tensor when b follows a in memory (a numel 0 view otherwise):
// q, k, v and gate, up are consecutive in every arena (model.c), with no
// padding between them unless a size is not a multiple of ALIGN_ELEMS.
static struct tensor joined(struct tensor a, struct tensor b) {
    bool next = a.dtype == b.dtype && (char *)a.data + a.numel * dtype_size(a.dtype) == b.data;
    return tensor_view(a.data, a.dtype, next ? a.numel + b.numel : 0);
}

// y (R, n) += the bias b (n,) on every row: ones (R, 1) @ b (1, n), a GEMM of
// depth 1 (one rounding of y + b in BF16/FP16, as a Linear's bias epilogue).
static void bias_add(struct model *m, struct tensor y, struct tensor b, int R, int n) {
    forward_matmul(m, y, tensor_slice(m->ones, 0, (size_t)R), b, R, n, 1, false, false, 1.0f);
}

// db (n,) += the column sums of dy (N, n): dy^T @ ones (N, 1).
static void bias_backward(struct model *m, struct tensor db, struct tensor dy, int n) {
    backend_matmul(m->be, db, dy, m->ones, n, 1, m->N, true, false, 1.0f, 1.0f);
}

void model_attn_qkv_post(struct model *m, const struct block *w, struct tensor qp, struct tensor kp,
                         struct tensor v, struct tensor q, struct tensor k, struct tensor rstd_q,
                         struct tensor rstd_k, struct tensor docs, int B, int T, int pos_offset) {
    struct backend *be = m->be;
    int R = B * T, HD = m->Hl * m->D, KD = m->Hkvl * m->D;
    if (m->cfg.qkv_bias) {
        bias_add(m, qp, w->bq, R, HD);
        bias_add(m, kp, w->bk, R, KD);
        bias_add(m, v, w->bv, R, KD);
    }
    if (m->cfg.qk_norm) {
        float eps = m->cfg.norm_eps;
        backend_rmsnorm_forward(be, q, rstd_q, qp, w->qn_w, R * m->Hl, m->D, eps);
        backend_rmsnorm_forward(be, k, rstd_k, kp, w->kn_w, R * m->Hkvl, m->D, eps);
    } else {
        if (q.data != qp.data) backend_copy(be, q, qp, (size_t)R * HD);
        if (k.data != kp.data) backend_copy(be, k, kp, (size_t)R * KD);
    }
    backend_rope_forward_docs(be, q, m->rope_cos, m->rope_sin, docs, B, T, m->Hl, m->D, pos_offset);
    backend_rope_forward_docs(be, k, m->rope_cos, m->rope_sin, docs, B, T, m->Hkvl, m->D,
                              pos_offset);
}

// The backward of model_attn_qkv_post over the N rows of a microbatch: dq,
// dk (N, Hl D), (N, Hkvl D) the gradients of the rotated q, k, rotated back
// in place; then through qk_norm into m->dqr, m->dkr (dw->qn_w, dw->kn_w
// +=); dw->bq, bk, bv += the column sums of the projections' gradients.
// Returns in *dqp, *dkp where the gradients of the projections qp, kp are
// (m->dqr, m->dkr under qk_norm, else dq, dk); v's is dv.
static void attn_qkv_post_backward(struct model *m, struct slot *S, const struct block_acts *a,
                                   const struct block *w, struct block *dw, struct tensor dq,
                                   struct tensor dk, struct tensor dv, struct tensor *dqp,
                                   struct tensor *dkp) {
    struct backend *be = m->be;
    int N = m->N, HD = m->Hl * m->D, KD = m->Hkvl * m->D;
    struct tensor ds = rope_docs_of(m, S);
    backend_rope_backward_docs(be, dq, m->rope_cos, m->rope_sin, ds, m->B, m->T, m->Hl, m->D, 0);
    backend_rope_backward_docs(be, dk, m->rope_cos, m->rope_sin, ds, m->B, m->T, m->Hkvl, m->D, 0);
    *dqp = dq, *dkp = dk;
    if (m->cfg.qk_norm) {
        backend_memset0(be, m->dqr);
        backend_memset0(be, m->dkr);
        backend_rmsnorm_backward(be, m->dqr, dw->qn_w, dq, a->qr, w->qn_w, a->rstdq, N * m->Hl,
                                 m->D);
        backend_rmsnorm_backward(be, m->dkr, dw->kn_w, dk, a->kr, w->kn_w, a->rstdk, N * m->Hkvl,
                                 m->D);
        *dqp = m->dqr, *dkp = m->dkr;
    }
    if (m->cfg.qkv_bias) {
        bias_backward(m, dw->bq, *dqp, HD);
        bias_backward(m, dw->bk, *dkp, KD);
        bias_backward(m, dw->bv, dv, KD);
    }
}

// The attention's q, k, v: one GEMM over the consecutive [Wq; Wk; Wv] (Hl D
// + 2 Hkvl D, C) into m->qkv (N, Hl D + 2 Hkvl D), the biases [bq; bk; bv]
// added in one more GEMM when consecutive, and its RoPE split writes q and
// k rotated and v (backend_rope_qkv_split: issue 24); with qk_norm, or
// weights or biases not consecutive, three GEMMs into q (qr under qk_norm),
// k (kr), v, then model_attn_qkv_post. Block blk's GEMMs in FP8 when it has them.
static void qkv_forward(struct model *m, struct slot *S, struct block_acts *a, int blk,
                        struct tensor n1) {
    struct backend *be = m->be;
    struct block *w = &m->blocks[blk];
    int C = m->C, HD = m->Hl * m->D, KD = m->Hkvl * m->D;
    struct tensor ds = rope_docs_of(m, S), wqkv = joined(joined(w->wq, w->wk), w->wv);
    struct tensor bqkv = joined(joined(w->bq, w->bk), w->bv);
    bool fused = wqkv.numel && !m->cfg.qk_norm && (!m->cfg.qkv_bias || bqkv.numel);
    bool f8 = model_fp8_block(m, blk);
    struct tensor none = tensor_view(NULL, m->dtype, 0);
    if (fused) {
        if (f8) model_fp8_qkv(m, blk, n1, m->qkv, none, none, none);
        else linear(m, m->qkv, n1, wqkv, HD + 2 * KD, C);
        if (m->cfg.qkv_bias) bias_add(m, m->qkv, bqkv, m->N, HD + 2 * KD);
        backend_rope_qkv_split(be, a->q, a->k, a->v, m->qkv, m->rope_cos, m->rope_sin, ds, m->B,
                               m->T, m->Hl, m->Hkvl, m->D);
        return;
    }
    struct tensor qp = m->cfg.qk_norm ? a->qr : a->q, kp = m->cfg.qk_norm ? a->kr : a->k;
    if (f8) {
        model_fp8_qkv(m, blk, n1, none, qp, kp, a->v);
    } else {
        linear(m, qp, n1, w->wq, HD, C);
        linear(m, kp, n1, w->wk, KD, C);
        linear(m, a->v, n1, w->wv, KD, C);
    }
    model_attn_qkv_post(m, w, qp, kp, a->v, a->q, a->k, a->rstdq, a->rstdk, ds, m->B, m->T, 0);
}

// dln (N, C) = the gradient through q, k, v from m->dq, m->dk, m->dv (before
// RoPE's inverse); d[Wq; Wk; Wv] +=: the join (inverse RoPE and packing into
// m->qkv), the biases' column sums and two GEMMs over the consecutive
// weights and gradients, else attn_qkv_post_backward and six GEMMs (in FP8
// for an FP8 block blk). The weight GEMMs through wgrad (b's mode; n1_part:
// the norm output n1 gathers, as wgrad's x_part); under W only they run.
static void qkv_backward(struct model *m, struct slot *S, const struct block_acts *a, int blk,
                         struct bwd *b, struct tensor n1, const struct tensor *n1_part) {
    struct backend *be = m->be;
    struct block *w = &m->blocks[blk], *dw = &m->dblocks[blk];
    bool f8 = model_fp8_block(m, blk), in = bwd_input(b);
    struct tensor none = tensor_view(NULL, m->dtype, 0);
    int C = m->C, HD = m->Hl * m->D, KD = m->Hkvl * m->D;
    struct tensor ds = rope_docs_of(m, S);
    struct tensor wqkv = joined(joined(w->wq, w->wk), w->wv);
    struct tensor dwqkv = joined(joined(dw->wq, dw->wk), dw->wv);
    struct tensor dbqkv = joined(joined(dw->bq, dw->bk), dw->bv);
    bool fused = wqkv.numel && dwqkv.numel && !m->cfg.qk_norm &&
                 (!m->cfg.qkv_bias || dbqkv.numel);
    if (fused) {
        if (in) {
            backend_rope_qkv_join(be, m->qkv, m->dq, m->dk, m->dv, m->rope_cos, m->rope_sin, ds,
                                  m->B, m->T, m->Hl, m->Hkvl, m->D);
            if (m->cfg.qkv_bias) bias_backward(m, dbqkv, m->qkv, HD + 2 * KD);
        }
        if (f8)
            model_fp8_qkv_backward(m, blk, m->dln, n1, m->qkv, dwqkv, none, none, none, none, none,
                                   none);
        else
            linear_backward(m, b, m->dln, 0.0f, dwqkv, m->qkv, n1, n1_part, false, wqkv,
                            HD + 2 * KD, C);
        return;
    }
    struct tensor dqp = m->dq, dkp = m->dk; // W reads them from the stash
    if (in) attn_qkv_post_backward(m, S, a, w, dw, m->dq, m->dk, m->dv, &dqp, &dkp);
    if (f8) {
        struct tensor g = tensor_view(NULL, DTYPE_FP32, 0);
        model_fp8_qkv_backward(m, blk, m->dln, n1, none, g, dqp, dkp, m->dv, dw->wq, dw->wk, dw->wv);
        return;
    }
    linear_backward(m, b, m->dln, 0.0f, dw->wq, dqp, n1, n1_part, false, w->wq, HD, C);
    linear_backward(m, b, m->dln, 1.0f, dw->wk, dkp, n1, n1_part, true, w->wk, KD, C);
    linear_backward(m, b, m->dln, 1.0f, dw->wv, m->dv, n1, n1_part, true, w->wv, KD, C);
}

// The MLP's gate and up projections are stored transposed, gate^T and up^T
// (Fl, N) one after the other in the slot (model.c carves them so), and so
// are act^T (Fl, N) and their gradients: then [gate^T; up^T] (2 Fl, N) =
// [Wgate; Wup] (2 Fl, C) @ n2^T is one GEMM over the consecutive weights
// (issue 24), and its backward two (dx and dW) instead of four. SwiGLU is
// elementwise, so it does not see the layout.
static void gate_up_forward(struct model *m, struct block_acts *a, int blk, struct tensor n2) {
    struct block *w = &m->blocks[blk];
    struct tensor wgu = joined(w->wgate, w->wup), gu = joined(a->gate, a->up);
    int Fl = m->Fl, C = m->C, N = m->N;
    if (model_fp8_block(m, blk)) { // one GEMM when gate^T and up^T are consecutive
        model_fp8_gate_up(m, blk, n2, gu, a->gate, a->up);
        return;
    }
    // A decode step's N rows are fewer than the slot's: gate^T (Fl, N) no
    // longer ends where up^T starts, so the two GEMMs.
    if (wgu.numel && gu.numel && !m->decoding) {
        backend_matmul(m->be, gu, wgu, n2, 2 * Fl, N, C, false, true, 1.0f, 0.0f);
        return;
    }
    forward_matmul(m, a->gate, w->wgate, n2, Fl, N, C, false, true, 0.0f);
    forward_matmul(m, a->up, w->wup, n2, Fl, N, C, false, true, 0.0f);
}

// dln (N, C) = [dgate^T; dup^T]^T @ [Wgate; Wup]; d[Wgate; Wup] += [dgate^T;
// dup^T] @ n2, from m->dgate, m->dup (Fl, N) each; the weight GEMMs through
// wgrad (b's mode; n2_part as qkv_backward's n1_part).
static void gate_up_backward(struct model *m, int blk, struct bwd *b, struct tensor n2,
                             const struct tensor *n2_part) {
    struct block *w = &m->blocks[blk], *dw = &m->dblocks[blk];
    struct tensor wgu = joined(w->wgate, w->wup), dwgu = joined(dw->wgate, dw->wup);
    struct tensor dgu = joined(m->dgate, m->dup);
    int Fl = m->Fl, C = m->C, N = m->N;
    bool in = bwd_input(b);
    if (model_fp8_block(m, blk)) {
        model_fp8_gate_up_backward(m, blk, m->dln, dwgu, dw->wgate, dw->wup, m->dgate, m->dup, n2);
        return;
    }
    if (wgu.numel && dwgu.numel && dgu.numel) {
        if (in) backend_matmul(m->be, m->dln, dgu, wgu, N, C, 2 * Fl, true, false, 1.0f, 0.0f);
        wgrad(m, b, dwgu, dgu, NULL, n2, n2_part, false, 2 * Fl, C, N, false, false);
        return;
    }
    if (in) {
        backend_matmul(m->be, m->dln, m->dgate, w->wgate, N, C, Fl, true, false, 1.0f, 0.0f);
        backend_matmul(m->be, m->dln, m->dup, w->wup, N, C, Fl, true, false, 1.0f, 1.0f);
    }
    wgrad(m, b, dw->wgate, m->dgate, NULL, n2, n2_part, false, Fl, C, N, false, false);
    wgrad(m, b, dw->wup, m->dup, NULL, n2, n2_part, true, Fl, C, N, false, false);
}

// recompute = full, MoE block blk (the chunk's i-th of slot S): the
// layer's forward again on the recomputed ln2, refilling a->moe (m->re.moe)
// for its backward; its output (m->tmp) is dropped, x[i+1] being kept.
// Same kernels, same input, same routing: the same bits, and under expert
// parallelism the same collectives (the counts' all-gather and the two
// all-to-alls), which pair up because every rank of the ep group runs the
// same schedule (the data-parallel ranks of one pipeline stage), so it
// re-runs this block of this microbatch at the same point of its backward.
// The statistics go to a scratch moe_stats: the slot's moe_st[i] already
// holds the forward's routing, which the step's logs and the auxiliary
// losses used (moe_losses: before the recompute, so nothing counts twice
// and the aux and z gradients it set stay). The recomputation must route
// as the forward did: a difference is a bug (a nondeterministic kernel),
// caught here.
static void moe_recompute(struct model *m, struct slot *S, struct block_acts *a, int blk, int i) {
    struct moe_stats again;
    const struct moe_stats *st = &S->moe_st[i];
    moe_forward(m->be, &m->moe, m->tmp, gathered(m, a->ln2), &m->blocks[blk].moe, m->N,
                a->moe.data, m->moe_scratch.data, &again);
    size_t E = (size_t)m->moe.E;
    CHECK(again.M == st->M && again.R == st->R && again.dropped == st->dropped &&
              !memcmp(again.kept, st->kept, E * sizeof *st->kept) &&
              !memcmp(again.routed, st->routed, E * sizeof *st->routed) &&
              !memcmp(again.recv_rows, st->recv_rows, E * sizeof *st->recv_rows) &&
              !memcmp(again.prob_sum, st->prob_sum, E * sizeof *st->prob_sum) &&
              again.z_sum == st->z_sum,
          "block %d: the recomputed MoE layer routed otherwise than its forward (rows %d vs %d, "
          "z sum %.17g vs %.17g)", blk, again.M, st->M, again.z_sum, st->z_sum);
}

// Block `blk` of the rank (weights) on the chunk's i-th activations of slot S.
// ln1_done: a->ln1 and a->rstd1 already hold the input norm (the previous
// block's fused residual add); next: the norm after x[i+1] (above).
// again: the recomputation of recompute = full, which refills the block's
// activations (the same ops on the same input, collectives included, so the
// same bits on every TP rank) and leaves its output x[i+1] alone.
static void block_forward(struct model *m, struct slot *S, int blk, int i, bool again,
                          bool ln1_done, struct next_norm next) {
    struct backend *be = m->be;
    struct block *w = &m->blocks[blk];
    struct block_acts *a = &S->acts[i];
    int Ns = m->Ns, C = m->C, HD = m->Hl * m->D;
    float eps = m->cfg.norm_eps;
    bool f8 = model_fp8_block(m, blk);
    if (f8) model_fp8_weights(m, blk, w); // once per step
    if (!ln1_done) backend_rmsnorm_forward(be, a->ln1, a->rstd1, S->x[i], w->ln1_w, Ns, C, eps);
    qkv_forward(m, S, a, blk, gathered(m, a->ln1));
    if (m->decoding) { // generation: the new rows' k, v into the cache, q against it
        backend_attention_decode(be, a->att, a->q, a->k, a->v, m->kv.k[blk], m->kv.v[blk],
                                 m->kv.pos, m->B, m->T, m->kv.len, m->Hl, m->Hkvl, m->D);
    } else if (m->cp > 1) { // the ring over the CP group (ring_attention.h)
        ring_attention_forward(m, S, a);
    } else {
        struct tensor ds = docs_of(m, S);
        backend_attention_forward_docs(be, a->att, a->lse, a->q, a->k, a->v, ds, m->B, m->T, m->Hl,
                                       m->Hkvl, m->D);
    }
    if (f8) model_fp8_o(m, blk, m->tmp, a->att);
    else linear(m, m->tmp, a->att, w->wo, C, HD);
    sp_reduce(m, m->tmp_s, m->tmp);
    backend_add_rmsnorm_forward(be, a->xmid, a->ln2, a->rstd2, S->x[i], m->tmp_s, w->ln2_w, Ns, C,
                                eps);
    if (w->is_moe) {
        // tmp (N, C) = the MoE layer on ln2, its routing and expert
        // activations into a->moe (the slot's; m->re's under full) and its
        // statistics into moe_st for the backward. The experts are not split
        // over TP: every TP rank runs the whole layer on all N rows (under
        // sequence parallelism ln2's all-gather), so tmp is complete, the
        // same on each (no TP sum, unlike the row-parallel down projection),
        // and the rank keeps its rows of it.
        // In a generation step (m->decoding) the same layer over the step's
        // rows: its GEMMs batch-invariant (model_decode_chunk sets
        // m->moe.invariant), its statistics into slot 0's moe_st, which no
        // backward reads before the next training forward overwrites them.
        if (again) { // recompute = full: the layer again, its output unused
            moe_recompute(m, S, a, blk, i);
            return;
        }
        moe_forward(be, &m->moe, m->tmp, gathered(m, a->ln2), &w->moe, m->N, a->moe.data,
                    m->moe_scratch.data, &S->moe_st[i]);
        own_rows(m, m->tmp_s, m->tmp);
    } else {
        gate_up_forward(m, a, blk, gathered(m, a->ln2));
        backend_swiglu_forward(be, a->act, a->gate, a->up, (size_t)m->N * m->Fl);
        if (again) return; // the down projection's output is x[i+1], kept
        // tmp (N, C) = act (N, Fl) @ Wdown^T, act stored transposed
        if (f8) model_fp8_down(m, blk, m->tmp, a->act);
        else forward_matmul(m, m->tmp, a->act, w->wdown, m->N, C, m->Fl, true, true, 0.0f);
        sp_reduce(m, m->tmp_s, m->tmp);
    }
    if (next.y.data)
        backend_add_rmsnorm_forward(be, S->x[i + 1], next.y, next.rstd, a->xmid, m->tmp_s, next.w,
                                    Ns, C, eps);
    else
        backend_add(be, S->x[i + 1], a->xmid, m->tmp_s, (size_t)Ns * C);
}

// Loss of each row from the logits, composed across the vocab shards.
// norm_done: S->lnf and S->rstdf already hold the final norm of x (the last
// block's fused residual add).
static void head_forward(struct model *m, struct slot *S, struct tensor x, bool norm_done) {
    struct backend *be = m->be;
    int N = m->N, C = m->C;
    if (!norm_done)
        backend_rmsnorm_forward(be, S->lnf, S->rstdf, x, m->norm_w, m->Ns, C, m->cfg.norm_eps);
    linear(m, S->logits, gathered(m, S->lnf), m->head, m->Vl, C);
    if (m->decoding) return; // generation reads the logits, no loss
    backend_ce_row_max(be, S->rowmax, S->logits, N, m->Vl, m->Vvalid);
    model_tp_all_reduce(m, S->rowmax, COMM_MAX);
    backend_ce_partials(be, S->partials, S->logits, S->rowmax, S->targets, N, m->Vl, m->Vvalid,
                        m->vocab_start);
    tp_sum(m, S->partials);
    backend_ce_loss(be, S->loss, S->lse, S->partials, S->rowmax, S->targets, N,
                    m->cfg.vocab_size, m->cfg.label_smoothing, IGNORE_INDEX);
}

// Sum and count of the per-token losses of slot S over non-ignored targets.
static void loss_sum_of(struct model *m, struct slot *S, const int32_t *targets, double *sum,
                        long *count) {
    if (m->stat == DTYPE_FP64) {
        backend_to_host(m->be, m->host_loss, S->loss.data, (size_t)m->N * sizeof(double));
    } else {
        float *f = (float *)m->host_loss; // fp32 values unpacked in place, back to front
        backend_to_host(m->be, f, S->loss.data, (size_t)m->N * sizeof(float));
        for (int i = m->N - 1; i >= 0; i--) m->host_loss[i] = f[i];
    }
    *sum = 0, *count = 0;
    for (int i = 0; i < m->N; i++)
        if (targets[i] != IGNORE_INDEX) *sum += m->host_loss[i], (*count)++;
}

void model_set_stage_messages_on_device(struct model *m, bool on_device) {
    m->messages_on_device = on_device;
}

// dst (Ns, C) of the backend = the stage message src (host or backend memory).
static void message_in(struct model *m, struct tensor dst, const void *src) {
    size_t n = (size_t)m->Ns * m->C;
    if (m->messages_on_device)
        backend_copy(m->be, dst, tensor_view((void *)src, dst.dtype, n), n);
    else
        backend_to_device(m->be, dst.data, src, n * dtype_size(dst.dtype));
}

// The stage message dst (host or backend memory) = src (Ns, C) of the backend.
static void message_out(struct model *m, void *dst, struct tensor src) {
    size_t n = (size_t)m->Ns * m->C;
    if (m->messages_on_device)
        backend_copy(m->be, tensor_view(dst, src.dtype, n), src, n);
    else
        backend_to_host(m->be, dst, src.data, n * dtype_size(src.dtype));
}

// ---- the routing in the stage messages (mixture of experts) ----
//
// A MoE model's load-balancing loss is transformers' over all its MoE
// blocks (moe_aux_loss_layers: their routing concatenated), not a sum of
// per-block terms, and its gradient in every block reads the tokens routed
// to each expert over all of them. Under pipeline parallelism the stage
// messages carry those sums after their (Ns, C) rows (model.h,
// model_stage_message_numel): E routed counts then E probability sums,
// doubles. Forward: over the MoE blocks before the receiving chunk (a chunk
// adds its blocks' to what it received, in block order: the sums of one
// rank's pass, bit for bit); backward: over all of them (the last virtual
// stage completes them), and then the last stage's loss_scale (the other
// stages' backward passes need not know the step's target count: the
// auxiliary terms' gradients are scaled by it). Every TP rank of a stage
// runs the same MoE layers on the same rows, so its messages carry the
// same sums.

static size_t moe_tail_bytes(const struct model *m) {
    return m->cfg.moe_experts ? (2 * (size_t)m->moe.E + 1) * sizeof(double) : 0;
}

// t (2 E + 1) = r's routed (E), prob_sum (E) and loss_scale, packed; and back.
static void route_pack(double *t, const struct moe_route_sum *r, size_t E) {
    memcpy(t, r->routed, E * sizeof *t);
    memcpy(t + E, r->prob_sum, E * sizeof *t);
    t[2 * E] = r->loss_scale;
}
static void route_unpack(struct moe_route_sum *r, const double *t, size_t E) {
    memcpy(r->routed, t, E * sizeof *t);
    memcpy(r->prob_sum, t + E, E * sizeof *t);
    r->loss_scale = t[2 * E];
}

// *r = the tail of stage message msg (host or backend memory).
static void moe_tail_in(struct model *m, struct moe_route_sum *r, const void *msg) {
    size_t E = (size_t)m->moe.E, bytes = moe_tail_bytes(m);
    double t[2 * MOE_MAX_EXPERTS + 1];
    const char *src = (const char *)msg + (size_t)m->Ns * m->C * dtype_size(m->dtype);
    if (m->messages_on_device) backend_to_host(m->be, t, src, bytes);
    else memcpy(t, src, bytes);
    route_unpack(r, t, E);
}

// The tail of stage message msg (host or backend memory) = *r.
static void moe_tail_out(struct model *m, void *msg, const struct moe_route_sum *r) {
    size_t E = (size_t)m->moe.E, bytes = moe_tail_bytes(m);
    double t[2 * MOE_MAX_EXPERTS + 1];
    route_pack(t, r, E);
    char *dst = (char *)msg + (size_t)m->Ns * m->C * dtype_size(m->dtype);
    if (m->messages_on_device) backend_to_device(m->be, dst, t, bytes);
    else memcpy(dst, t, bytes);
}

// *r = S->moe_in plus the routing of chunk `chunk`'s MoE blocks (their forward's
// moe_st), in block order.
static void moe_route_add(const struct model *m, const struct slot *S, int chunk,
                          struct moe_route_sum *r) {
    *r = S->moe_in;
    for (int i = 0, b0 = m->block0[chunk]; i < model_chunk_layers(m, chunk); i++)
        if (m->blocks[b0 + i].is_moe)
            for (int e = 0; e < m->moe.E; e++)
                r->routed[e] += S->moe_st[i].routed[e], r->prob_sum[e] += S->moe_st[i].prob_sum[e];
}

static struct slot *slot_of(struct model *m, int slot) {
    CHECK(slot >= 0 && slot < m->shard.n_slots, "activation slot %d of %d", slot, m->shard.n_slots);
    m->slots_used = MAX(m->slots_used, slot + 1);
    return &m->slots[slot];
}

static void forward_chunk(struct model *m, int chunk, int slot, const int32_t *tokens,
                          const void *in, const int32_t *targets, void *out, double *loss_sum,
                          long *n_targets) {
    struct backend *be = m->be;
    struct slot *S = slot_of(m, slot);
    int nl = model_chunk_layers(m, chunk), b0 = m->block0[chunk];
    if (loss_sum) *loss_sum = 0;
    if (n_targets) *n_targets = 0;
    if (m->cp > 1) { // whole sequences in: this rank's chunks, positions, document starts
        cp_slot_positions(m, S, tokens);
        if (tokens) cp_split_rows(m, m->host_tok, tokens), tokens = m->host_tok;
        if (targets) cp_split_rows(m, m->host_tgt, targets), targets = m->host_tgt;
    } else if (m->doc_eot >= 0) { // every chunk of a pipeline derives it from the tokens
        CHECK(tokens, "packed documents (model_set_doc_eot) but no tokens for chunk %d", chunk);
        doc_start_fill(m->host_doc, tokens, m->B, m->T, m->doc_eot);
        backend_to_device(be, S->doc_start.data, m->host_doc, (size_t)m->N * sizeof(int32_t));
    }
    if (model_chunk_first(m, chunk)) {
        backend_to_device(be, S->tokens.data, tokens, (size_t)m->N * sizeof(int32_t));
        // Each vocab shard looks up its own ids (zero rows elsewhere); the
        // sum over TP completes the lookup (reduce-scattered under SP).
        struct tensor e = m->sp ? m->tmp : S->x[0];
        model_unit_event(m, m->embed_unit, MODEL_UNIT_FORWARD);
        backend_embedding_forward(be, e, m->wte, S->tokens, m->N, m->C, m->vocab_start, m->Vl);
        sp_reduce(m, S->x[0], e);
        model_unit_event(m, m->embed_unit, MODEL_UNIT_FORWARD_DONE);
    } else {
        message_in(m, S->x[0], in);
    }
    // the routing of the blocks before the chunk (not in a generation step:
    // its messages carry the activations alone, model_decode_message_numel)
    if (m->cfg.moe_experts && !m->decoding) {
        if (model_chunk_first(m, chunk)) memset(&S->moe_in, 0, sizeof S->moe_in);
        else moe_tail_in(m, &S->moe_in, in);
    }
    bool last = model_chunk_last(m, chunk);
    // Under the unit hook each unit reads only its own parameters: no fusion
    // with the next unit's norm (the same bits, model.h).
    bool fuse = !m->unit_hook;
    for (int i = 0; i < nl; i++) {
        struct next_norm next = {{0}, {0}, {0}};
        if (fuse && i + 1 < nl)
            next = (struct next_norm){S->acts[i + 1].ln1, S->acts[i + 1].rstd1,
                                      m->blocks[b0 + i + 1].ln1_w};
        else if (fuse && last)
            next = (struct next_norm){S->lnf, S->rstdf, m->norm_w};
        model_unit_event(m, m->block_unit[b0 + i], MODEL_UNIT_FORWARD);
        block_forward(m, S, b0 + i, i, false, fuse && i > 0, next);
        model_unit_event(m, m->block_unit[b0 + i], MODEL_UNIT_FORWARD_DONE);
    }
    if (!last) {
        message_out(m, out, S->x[nl]);
        if (m->cfg.moe_experts && !m->decoding) {
            struct moe_route_sum r;
            moe_route_add(m, S, chunk, &r);
            moe_tail_out(m, out, &r);
        }
        return;
    }
    if (!m->decoding)
        backend_to_device(be, S->targets.data, targets, (size_t)m->N * sizeof(int32_t));
    model_unit_event(m, m->head_unit, MODEL_UNIT_FORWARD);
    head_forward(m, S, S->x[nl], fuse && nl > 0);
    model_unit_event(m, m->head_unit, MODEL_UNIT_FORWARD_DONE);
    if (m->decoding) return;
    if (loss_sum) {
        loss_sum_of(m, S, targets, loss_sum, n_targets);
        return;
    }
    backend_sum_into(be, m->loss_acc, S->loss, m->N); // ignored rows hold 0 (ce_loss)
    if (n_targets)
        for (int i = 0; i < m->N; i++) *n_targets += targets[i] != IGNORE_INDEX;
}

int64_t model_count_targets(const struct model *m, const int32_t *targets, int n_micro) {
    if (m->cp > 1) return cp_count_targets(m, targets, n_micro);
    int64_t count = 0;
    for (size_t i = 0, n = (size_t)n_micro * m->N; i < n; i++) count += targets[i] != IGNORE_INDEX;
    return count;
}

double model_loss_sum_take(struct model *m) {
    if (!m->last) return 0;
    double sum;
    backend_to_host(m->be, &sum, m->loss_acc.data, sizeof sum);
    backend_memset0(m->be, m->loss_acc);
    return sum;
}

// The pass inside an NVTX range "forward" (src/base/nvtx.h).
void model_forward_chunk(struct model *m, int chunk, int slot, const int32_t *tokens,
                         const void *in, const int32_t *targets, void *out, double *loss_sum,
                         long *n_targets) {
    NVTX_PUSH("forward");
    forward_chunk(m, chunk, slot, tokens, in, targets, out, loss_sum, n_targets);
    NVTX_POP();
}

void model_forward(struct model *m, const int32_t *tokens, const int32_t *targets,
                   double *loss_sum, long *n_targets) {
    CHECK(m->shard.n_chunks == 1 && m->first && m->last,
          "model_forward runs a whole model; a pipeline stage uses model_forward_chunk");
    model_forward_chunk(m, 0, 0, tokens, NULL, targets, NULL, loss_sum, n_targets);
}

void model_microbatch_shape(const struct model *m, int *B, int *T, int *V) {
    *B = m->B, *T = m->T, *V = m->cfg.vocab_size;
}

size_t model_stage_message_numel(const struct model *m) {
    size_t es = dtype_size(m->dtype);
    return (size_t)m->Ns * m->C + (moe_tail_bytes(m) + es - 1) / es;
}

int model_slots_used(const struct model *m) { return m->slots_used; }

// out (V,) = the logits of row `row` of slot 0's (rows, Vl), gathered over
// the TP group; BF16/FP16 widened through stage (Vl,) FP32 when it is given.
static void logits_row(struct model *m, size_t row, struct tensor stage, double *out) {
    int tp = m->shard.tp_size;
    double *all = xmalloc((size_t)tp * m->Vl * sizeof *all);
    double *mine = all + (size_t)m->shard.tp_rank * m->Vl;
    struct tensor src = tensor_slice(m->slots[0].logits, row * m->Vl, m->Vl);
    if (stage.numel && (src.dtype == DTYPE_BF16 || src.dtype == DTYPE_FP16)) {
        float *f = xmalloc((size_t)m->Vl * sizeof *f);
        backend_copy(m->be, stage, src, m->Vl);
        backend_to_host(m->be, f, stage.data, (size_t)m->Vl * sizeof *f);
        for (int j = 0; j < m->Vl; j++) mine[j] = f[j];
        free(f);
    } else {
        model_to_host_f64(m, src, mine);
    }
    if (tp > 1) comm_all_gather(parallel_host_group(m->groups.tp, m->groups.host_tp), mine, all, m->Vl, DTYPE_FP64);
    for (int j = 0; j < m->cfg.vocab_size; j++) // shard r holds [r*Vl, (r+1)*Vl), padding last
        out[j] = all[j];
    free(all);
}

void model_get_logits_at(struct model *m, int b, int t, double *out) {
    CHECK(m->last && b >= 0 && b < m->B && t >= 0 && t < m->T, "logits of (%d, %d)", b, t);
    logits_row(m, (size_t)b * m->T + t, tensor_view(NULL, DTYPE_FP32, 0), out);
}

void model_get_logits(struct model *m, double *out) {
    CHECK(m->last, "logits live on the last pipeline stage");
    model_to_host_f64(m, tensor_slice(m->slots[0].logits, 0, (size_t)m->N * m->Vl), out);
}

// ---- backward --------------------------------------------------------------------

// Refills what block i of slot S did not keep (model.c, block_acts_layout)
// before its backward: selective recomputes the two norm outputs from x[i]
// and xmid (rewriting their kept rstd with the same values), q and k from
// the first (two GEMMs and RoPE) and, in a dense block, the SwiGLU product
// from gate and up (a MoE block keeps its layer's activations); full re-runs
// the block's forward from x[i], a MoE block's layer included
// (moe_recompute). The same kernels on the same
// inputs give the bits of the first forward, so every mode's gradients are
// those of recompute = none.
static void block_recompute(struct model *m, struct slot *S, int blk, int i) {
    struct backend *be = m->be;
    struct block *w = &m->blocks[blk];
    struct block_acts *a = &S->acts[i];
    int Ns = m->Ns, C = m->C;
    float eps = m->cfg.norm_eps;
    // FP8 casts repeat the forward's (the same weight copy and scales, the
    // same bits; model_fp8.c counts no saturation twice).
    m->fp8.recomputing = true;
    switch (m->shard.recompute) {
    case RECOMPUTE_NONE: break;
    case RECOMPUTE_FULL: {
        struct next_norm none = {{0}, {0}, {0}};
        block_forward(m, S, blk, i, true, false, none);
        break;
    }
    case RECOMPUTE_SELECTIVE:
        backend_rmsnorm_forward(be, a->ln1, a->rstd1, S->x[i], w->ln1_w, Ns, C, eps);
        // the forward's GEMM and split (v rewritten with its kept bits), so that
        // q and k have the bits of the first forward
        qkv_forward(m, S, a, blk, gathered(m, a->ln1));
        backend_rmsnorm_forward(be, a->ln2, a->rstd2, a->xmid, w->ln2_w, Ns, C, eps);
        if (!w->is_moe) backend_swiglu_forward(be, a->act, a->gate, a->up, (size_t)m->N * m->Fl);
        break;
    }
    m->fp8.recomputing = false;
}

// The (N, C) rows the GEMMs read of a norm output (Ns, C) in b's mode: its
// gather (gathered) in B and fused; in W the buffer the stash is gathered
// into under sequence parallelism (m->ln_full), else norm (its dtype only).
static struct tensor norm_operand(struct model *m, const struct bwd *b, struct tensor norm) {
    if (b->mode == BWD_WEIGHT) return m->sp ? m->ln_full : norm;
    return gathered(m, norm);
}

// On entry m->dx (Ns, C) holds d x[i+1]; on exit d x[i] (B and fused). The
// weight GEMMs through wgrad: B stashes both operands of each (the slot is
// free after B; under sequence parallelism the Ns rows of a gathered one);
// W reads only the stash (S's tensors give dtypes only).
static void block_backward(struct model *m, struct slot *S, int blk, int i, struct bwd *b) {
    struct backend *be = m->be;
    struct block *w = &m->blocks[blk], *dw = &m->dblocks[blk];
    struct block_acts *a = &S->acts[i];
    int N = m->N, Ns = m->Ns, C = m->C, HD = m->Hl * m->D, Fl = m->Fl;
    bool f8 = model_fp8_block(m, blk), in = bwd_input(b);
    CHECK(!f8 || b->mode == BWD_FUSED, "FP8 block %d: the backward split is not built for FP8 "
          "GEMMs (config_validate refuses precision.fp8 with a split schedule)", blk);
    if (f8) model_fp8_weights(m, blk, w); // cast by the forward already: a no-op
    // x[i+1] = xmid + down(act): d xmid += dx through the residual.
    // (transposed: dact^T (Fl, N) = Wdown^T @ dx^T; dWdown += dx^T @ act)
    if (in) sp_gather(m, m->dx_full, m->dx);
    if (w->is_moe) {
        // dln (N, C) = the MoE layer's input gradient (moe_backward adds into
        // it), its parameter gradients += (the aux and z terms included:
        // backward_chunk set moe_st's aux_grad, z_grad); fused only (model_setup).
        // a->moe: the forward's, or under full block_recompute's (moe_recompute).
        // Every TP rank runs it on the whole d x[i+1] (N, C) (all-gathered
        // above under sequence parallelism) and ln2's N rows: the same whole
        // gradients on each (param_info.tp_whole_grad) and a complete dln.
        CHECK(b->mode == BWD_FUSED, "block %d: the split backward is not built for MoE blocks", blk);
        backend_memset0(be, m->dln);
        moe_backward(be, &m->moe, m->dln, &dw->moe, m->dx_full, gathered(m, a->ln2), &w->moe, N,
                     a->moe.data, m->moe_scratch.data, &S->moe_st[i]);
    } else {
        if (f8) {
            model_fp8_down_backward(m, blk, m->dact, dw->wdown, m->dx_full, a->act);
        } else {
            if (in)
                backend_matmul(be, m->dact, w->wdown, m->dx_full, Fl, N, C, true, true, 1.0f, 0.0f);
            wgrad(m, b, dw->wdown, m->dx_full, &m->dx, a->act, NULL, false, C, Fl, N, true, true);
        }
        if (in)
            backend_swiglu_backward(be, m->dgate, m->dup, m->dact, a->gate, a->up, (size_t)N * Fl);
        gate_up_backward(m, blk, b, norm_operand(m, b, a->ln2), &a->ln2);
    }
    if (in) {
        // the column-parallel gate and up leave dln partial over TP (Megatron's
        // f: its sum); the MoE layer's is whole on every TP rank, summed by none
        if (w->is_moe) own_rows(m, m->dln_s, m->dln);
        else sp_reduce(m, m->dln_s, m->dln);
        backend_rmsnorm_backward(be, m->dx, dw->ln2_w, m->dln_s, a->xmid, w->ln2_w, a->rstd2, Ns, C);
        // xmid = x[i] + o(att)
        sp_gather(m, m->dx_full, m->dx);
    }
    if (f8) {
        model_fp8_o_backward(m, blk, m->datt, dw->wo, m->dx_full, a->att);
    } else {
        if (in) backend_matmul(be, m->datt, m->dx_full, w->wo, N, HD, C, false, false, 1.0f, 0.0f);
        wgrad(m, b, dw->wo, m->dx_full, &m->dx, a->att, NULL, false, C, HD, N, true, false);
    }
    if (in && m->cp > 1) {
        ring_attention_backward(m, S, a, m->datt);
    } else if (in) {
        struct tensor ds = docs_of(m, S);
        backend_attention_backward_docs(be, m->dq, m->dk, m->dv, m->datt, a->q, a->k, a->v, a->att,
                                        a->lse, ds, m->B, m->T, m->Hl, m->Hkvl, m->D);
    }
    qkv_backward(m, S, a, blk, b, norm_operand(m, b, a->ln1), &a->ln1);
    if (!in) return;
    sp_reduce(m, m->dln_s, m->dln);
    backend_rmsnorm_backward(be, m->dx, dw->ln1_w, m->dln_s, S->x[i], w->ln1_w, a->rstd1, Ns, C);
}

// A unit's part of the pass begins: its parameters (B, fused) or its
// gradient views (W) are needed (model.h, enum model_unit_event).
static void unit_begin(struct model *m, const struct bwd *b, int unit) {
    model_unit_event(m, unit, b->mode == BWD_WEIGHT ? MODEL_UNIT_WEIGHT : MODEL_UNIT_BACKWARD);
}

// A unit's part of the pass has ended; its gradients from arena offset
// `from` on are final (fused, W: grads_ready) or wait for the W (B).
static void unit_end(struct model *m, struct bwd *b, int unit, size_t from) {
    static const enum model_unit_event done[] = {
        [BWD_FUSED] = MODEL_UNIT_BACKWARD_DONE, [BWD_INPUT] = MODEL_UNIT_INPUT_DONE,
        [BWD_WEIGHT] = MODEL_UNIT_WEIGHT_DONE};
    unit_input_grads(m, b, unit);
    model_unit_event(m, unit, done[b->mode]);
    if (b->mode != BWD_INPUT) grads_ready(m, from);
}

void model_moe_topk(struct model *m, int slot, int block, int32_t *out) {
    CHECK(block >= 0 && block < m->n_local_layers && m->blocks[block].is_moe,
          "model_moe_topk: block %d is not a MoE block", block);
    CHECK(m->shard.recompute != RECOMPUTE_FULL, "model_moe_topk: under recompute = full no "
          "block keeps its routing");
    int chunk = 0;
    while (chunk + 1 < m->shard.n_chunks && block >= m->block0[chunk + 1]) chunk++;
    struct slot *S = slot_of(m, slot);
    struct moe_routing r = moe_routing_view(&m->moe, m->N, m->dtype, S->acts[block - m->block0[chunk]].moe.data);
    backend_to_host(m->be, out, r.topk_idx.data, (size_t)m->N * m->moe.k * sizeof *out);
}

// The MoE blocks' auxiliary losses of the microbatch in slot S, before its
// backward through chunk `chunk`, given `all`: its routing summed over the
// model's MoE blocks and the last virtual stage's loss_scale (the stage
// messages' tail). transformers' load-balancing
// loss over the model's L MoE blocks (MixtralForCausalLM's aux_loss,
// coefficient moe_aux_loss_coeff) is one layer's over their L N rows, the
// router logits concatenated (moe_aux_loss_layers on a moe_stats of those
// sums); each block's z-loss has coefficient moe_z_loss_coeff, summed over
// blocks. Each is weighted in the step's loss as its microbatch's N tokens
// are in the LM loss: the gradients are scaled by loss_scale N (loss_scale
// = the LM loss's d loss / d token loss, times the fp16 loss scale), so the
// aux term of a step is the mean over its microbatches when no target is
// ignored. Under context parallelism the microbatch is cp ranks' N rows:
// `all` holds the cp ranks' sums (backward_chunk), the load-balancing loss
// is over their cp N rows and each rank's z-loss a mean over its N (its
// gradient scaled by 1 / cp). Logs them (model_moe_stats_take): the loss and
// the microbatch on the last virtual stage, each chunk its blocks' z-losses,
// drops and routing (every cp rank: the microbatch counted cp times, the
// means unchanged); on TP rank 0 only (the TP ranks run the same MoE layers); not
// for a loss scale of 0 (the backward of a pipeline's evaluation pass,
// train_step.c, or a step with no target: the terms add nothing).
static void moe_losses(struct model *m, struct slot *S, int chunk,
                       const struct moe_route_sum *all) {
    int nl = model_chunk_layers(m, chunk), b0 = m->block0[chunk], E = m->moe.E;
    double *log = m->shard.tp_rank == 0 && all->loss_scale != 0 ? m->moe_log : NULL;
    struct moe_stats model_st = {0}, *one = &model_st; // the model's MoE blocks as one layer
    int Nm = m->N * m->cp; // the microbatch's rows
    one->N = m->n_moe_model * Nm, one->E = E;
    for (int e = 0; e < E; e++)
        one->routed[e] = (int32_t)all->routed[e], one->prob_sum[e] = all->prob_sum[e];
    double aux = moe_aux_loss_layers(&one, 1, m->moe.aux_coeff);
    if (log && model_chunk_last(m, chunk)) log[0] += 1, log[1] += aux;
    int l0 = m->shard.layer_begin[chunk], j = 0; // the chunk's first MoE block among the model's
    while (j < m->n_moe_model && m->moe_layer[j] < l0) j++;
    double w = all->loss_scale * Nm;
    for (int i = 0; i < nl; i++) {
        if (!m->blocks[b0 + i].is_moe) continue;
        struct moe_stats *st = &S->moe_st[i];
        CHECK(j < m->n_moe_model && m->moe_layer[j] == l0 + i,
              "MoE block %d: layer %d is not the model's MoE block %d", b0 + i, l0 + i, j);
        if (log) {
            log[2] += st->z_loss;
            log[3] += (double)st->dropped;
            for (int e = 0; e < E; e++) log[4 + (size_t)j * E + e] += st->routed[e];
        }
        for (int e = 0; e < E; e++) st->aux_grad[e] = one->aux_grad[e] * w;
        st->z_grad *= w / m->cp; // z_coeff / N of this rank's rows: the microbatch's mean
        j++;
    }
}

// The backward of chunk `chunk` in b's mode: fused, all of it from
// activation slot `slot`; B, all but the weight GEMMs from the slot, whose
// operands go to W stash `wslot`; W, those GEMMs from the stash alone (slot
// unused: slot 0's tensors stand for the operands' dtypes, no data read).
static void backward_chunk(struct model *m, int chunk, int slot, int wslot, double loss_scale,
                           const void *dout, void *din, struct bwd *b) {
    struct backend *be = m->be;
    struct slot *S = b->mode == BWD_WEIGHT ? &m->slots[0] : slot_of(m, slot);
    int N = m->N, C = m->C, nl = model_chunk_layers(m, chunk), b0 = m->block0[chunk];
    bool in = bwd_input(b);
    struct wstash *ws = NULL;
    if (b->mode != BWD_FUSED) {
        CHECK(wslot >= 0 && wslot < m->shard.n_wstash, "W stash %d of %d (chunk %d)", wslot,
              m->shard.n_wstash, chunk);
        ws = &m->wstash[wslot];
        b->stash = ws->t.data, b->cap = ws->t.numel * dtype_size(ws->t.dtype);
    }
    if (b->mode == BWD_WEIGHT)
        CHECK(ws->chunk == chunk, "model_backward_chunk_weight(chunk %d, W stash %d): %s", chunk,
              wslot, ws->chunk < 0 ? "no B filled that stash"
                                   : "the stash's B was of another chunk");
    else if (ws)
        CHECK(ws->chunk < 0, "B of chunk %d into W stash %d before the W of its last B (chunk %d)",
              chunk, wslot, ws->chunk);
    if (model_chunk_last(m, chunk)) {
        // Under recompute, dlogits is the logits' own storage (model.c) and
        // the final norm's output is recomputed.
        unit_begin(m, b, m->head_unit);
        if (in) {
            backend_ce_backward(be, S->dlogits, S->logits, S->lse, S->targets, N, m->Vl, m->Vvalid,
                                m->vocab_start, m->cfg.vocab_size, m->cfg.label_smoothing,
                                IGNORE_INDEX, loss_scale);
            if (m->shard.recompute != RECOMPUTE_NONE)
                backend_rmsnorm_forward(be, S->lnf, S->rstdf, S->x[nl], m->norm_w, m->Ns, C,
                                        m->cfg.norm_eps);
        }
        linear_backward(m, b, m->dln, 0.0f, m->dhead, S->dlogits, norm_operand(m, b, S->lnf),
                        &S->lnf, false, m->head, m->Vl, C);
        if (in) {
            sp_reduce(m, m->dln_s, m->dln);
            backend_memset0(be, m->dx);
            backend_rmsnorm_backward(be, m->dx, m->dnorm_w, m->dln_s, S->x[nl], m->norm_w, S->rstdf,
                                     m->Ns, C);
        }
        // A tied embedding sits at offset 0, so it is not final before the end.
        unit_end(m, b, m->head_unit, m->head_offset);
    } else if (in) {
        message_in(m, m->dx, dout);
    }
    // The microbatch's routing over the model's MoE blocks and the loss
    // scale of their auxiliary terms: the last virtual stage's.
    struct moe_route_sum all;
    if (in && m->cfg.moe_experts) {
        if (model_chunk_last(m, chunk)) {
            moe_route_add(m, S, chunk, &all);
            all.loss_scale = loss_scale;
            // Under context parallelism the microbatch's rows are spread over
            // the cp ranks: their routing sums, so that every cp rank's
            // auxiliary gradients are the whole microbatch's (as at cp 1)
            if (m->cp > 1) { // the 2 E sums (the loss scale, the same on each, stays)
                struct comm_group *cp = parallel_host_group(m->groups.cp, m->groups.host_cp);
                double t[2 * MOE_MAX_EXPERTS + 1];
                route_pack(t, &all, (size_t)m->moe.E);
                comm_all_reduce(cp, t, 2 * (size_t)m->moe.E, DTYPE_FP64, COMM_SUM);
                route_unpack(&all, t, (size_t)m->moe.E);
            }
        } else {
            moe_tail_in(m, &all, dout);
        }
        moe_losses(m, S, chunk, &all);
    }
    for (int i = nl - 1; i >= 0; i--) {
        unit_begin(m, b, m->block_unit[b0 + i]);
        if (in) block_recompute(m, S, b0 + i, i);
        block_backward(m, S, b0 + i, i, b);
        unit_end(m, b, m->block_unit[b0 + i], m->block_offset[b0 + i]);
    }
    if (model_chunk_first(m, chunk)) {
        // The embedding's gradient is no GEMM: B runs it whole, with the
        // fused pass's unit events (final at its end); its W has no work
        // and no event, only the gradient-ready report (every block's W
        // precedes it).
        if (in) {
            model_unit_event(m, m->embed_unit, MODEL_UNIT_BACKWARD);
            sp_gather(m, m->dx_full, m->dx);
            backend_embedding_backward(be, m->dwte, m->dx_full, S->tokens, N, C, m->vocab_start,
                                       m->Vl);
            model_unit_event(m, m->embed_unit, MODEL_UNIT_BACKWARD_DONE);
        }
        if (b->mode != BWD_INPUT) grads_ready(m, 0);
    } else if (in) {
        message_out(m, din, m->dx);
        if (m->cfg.moe_experts) moe_tail_out(m, din, &all);
    }
    if (b->mode == BWD_INPUT) ws->chunk = chunk, ws->used = b->at;
    if (b->mode == BWD_WEIGHT) {
        CHECK(b->at == ws->used, "W of chunk %d read %zu stash bytes, its B wrote %zu", chunk,
              b->at, ws->used);
        ws->chunk = -1;
    }
}

// The passes inside NVTX ranges "backward", "backward_input", "backward_weight"
// (src/base/nvtx.h).
void model_backward_chunk(struct model *m, int chunk, int slot, double loss_scale,
                          const void *dout, void *din) {
    struct bwd b = {.mode = BWD_FUSED};
    NVTX_PUSH("backward");
    backward_chunk(m, chunk, slot, -1, loss_scale, dout, din, &b);
    NVTX_POP();
}

void model_backward_chunk_input(struct model *m, int chunk, int slot, int wslot, double loss_scale,
                                const void *dout, void *din) {
    CHECK(m->shard.split_backward, "model_backward_chunk_input on a model without "
          "model_shard.split_backward (no W stash)");
    struct bwd b = {.mode = BWD_INPUT};
    NVTX_PUSH("backward_input");
    backward_chunk(m, chunk, slot, wslot, loss_scale, dout, din, &b);
    NVTX_POP();
}

void model_backward_chunk_weight(struct model *m, int chunk, int wslot) {
    CHECK(m->shard.split_backward, "model_backward_chunk_weight on a model without "
          "model_shard.split_backward (no W stash)");
    struct bwd b = {.mode = BWD_WEIGHT};
    NVTX_PUSH("backward_weight");
    backward_chunk(m, chunk, -1, wslot, 0.0, NULL, NULL, &b);
    NVTX_POP();
}

void model_backward(struct model *m, double loss_scale) {
    CHECK(m->shard.n_chunks == 1 && m->first && m->last,
          "model_backward runs a whole model; a pipeline stage uses model_backward_chunk");
    model_backward_chunk(m, 0, 0, loss_scale, NULL, NULL);
}

// ---- generation with a key/value cache -------------------------------------------

void model_set_decode_invariant(struct model *m, bool on) { m->decode_variant = !on; }

int model_kv_cache_rows(const struct model *m) { return m->kv.rows; }
int model_kv_cache_len(const struct model *m) { return m->kv.len; }

int model_decode_max_tokens(const struct model *m) {
    return m->kv.rows ? MIN(m->kv.len, m->Ns / m->kv.rows) : 0;
}

size_t model_decode_message_numel(const struct model *m, int Tq) {
    return (size_t)m->kv.rows * Tq * m->C;
}

// The pass inside an NVTX range "decode": forward_chunk on the shape (rows,
// Tq) of the cache's rows, with this rank's whole sequence (no sequence or
// context sharding: every rank of a TP or CP group computes all rows, TP
// partial sums all-reduced), no document masks, and block_forward's
// attention against the cache (m->decoding). The training shape, and the
// buffers sequence parallelism splits, are put back after.
void model_decode_chunk(struct model *m, int chunk, const int32_t *pos, int Tq,
                        const int32_t *tokens, const void *in, void *out) {
    struct kv_cache *kv = &m->kv;
    CHECK(kv->rows > 0, "model_decode_chunk: no key/value cache (model_kv_cache_init)");
    CHECK(Tq >= 1 && Tq <= model_decode_max_tokens(m),
          "model_decode_chunk: %d new tokens per row; at most %d (rows %d, activation rows %d)",
          Tq, model_decode_max_tokens(m), kv->rows, m->Ns);
    for (int b = 0; b < kv->rows; b++) {
        CHECK(pos[b] >= 0 && pos[b] + Tq <= kv->len,
              "model_decode_chunk: row %d: positions [%d, %d) outside the cache's %d", b, pos[b],
              pos[b] + Tq, kv->len);
        for (int t = 0; t < Tq; t++) kv->host_off[b * Tq + t] = -pos[b];
    }
    backend_to_device(m->be, kv->pos.data, pos, (size_t)kv->rows * sizeof *pos);
    backend_to_device(m->be, kv->rope_off.data, kv->host_off,
                      (size_t)kv->rows * Tq * sizeof *kv->host_off);
    int B = m->B, T = m->T, N = m->N, Ns = m->Ns, cp = m->cp;
    bool sp = m->sp;
    int32_t eot = m->doc_eot;
    struct tensor tmp_s = m->tmp_s, red_s = m->red_s;
    m->B = kv->rows, m->T = Tq, m->N = m->Ns = kv->rows * Tq, m->cp = 1, m->sp = false;
    m->doc_eot = -1, m->tmp_s = m->tmp, m->red_s = m->red;
    m->decoding = true;
    m->moe.invariant = !m->decode_variant; // the MoE layers' GEMMs as forward_matmul's
    kv->Tq = Tq;
    NVTX_PUSH("decode");
    forward_chunk(m, chunk, 0, tokens, in, NULL, out, NULL, NULL);
    NVTX_POP();
    m->decoding = false;
    m->moe.invariant = false;
    m->B = B, m->T = T, m->N = N, m->Ns = Ns, m->cp = cp, m->sp = sp;
    m->doc_eot = eot, m->tmp_s = tmp_s, m->red_s = red_s;
}

// The group the stage messages travel on and the buffers they use: the pp
// group over backend memory when the messages live there, else over host
// memory (host copies made on first use).
static struct comm_group *decode_pp(struct model *m, void **msg) {
    struct kv_cache *kv = &m->kv;
    if (m->messages_on_device) {
        msg[0] = kv->msg[0].data, msg[1] = kv->msg[1].data;
        return m->groups.pp;
    }
    for (int i = 0; i < 2; i++) {
        if (!kv->host_msg[i]) kv->host_msg[i] = xmalloc(kv->msg[i].numel * dtype_size(m->dtype));
        msg[i] = kv->host_msg[i];
    }
    return parallel_host_group(m->groups.pp, m->groups.host_pp);
}

// A step runs between training steps, when no pipeline message is in flight.
enum { DECODE_TAG = 32000 }; // below the least MPI_TAG_UB (32767)

void model_decode(struct model *m, const int32_t *pos, int Tq, const int32_t *tokens) {
    if (m->shard.n_chunks == 1 && m->first && m->last) {
        model_decode_chunk(m, 0, pos, Tq, tokens, NULL, NULL);
        return;
    }
    void *msg[2];
    struct comm_group *pp = decode_pp(m, msg);
    CHECK(pp && pp->size > 1, "model_decode: a pipeline stage without a pp group (model_set_groups)");
    int p = pp->size, s = pp->rank;
    enum pp_schedule kind = m->shard.schedule;
    size_t n = model_decode_message_numel(m, Tq);
    // Chunk c's neighbours hold virtual stages u - 1 and u + 1 (ZB-V: the
    // next stage, the previous one, or this one at the V's turn, where the
    // message is a copy).
    bool self_in = false;
    for (int c = 0; c < m->shard.n_chunks; c++) {
        bool first = model_chunk_first(m, c), last = model_chunk_last(m, c);
        int u = pipeline_virtual_stage(kind, p, s, c);
        if (!first && !self_in)
            comm_recv(pp, msg[0], n, m->dtype, pipeline_stage_of(kind, p, u - 1), DECODE_TAG);
        model_decode_chunk(m, c, pos, Tq, tokens, first ? NULL : msg[0], last ? NULL : msg[1]);
        self_in = false;
        if (last) continue;
        int next = pipeline_stage_of(kind, p, u + 1);
        if (next == s) { // the next chunk is this rank's: its input is this output
            if (m->messages_on_device) backend_copy(m->be, m->kv.msg[0], m->kv.msg[1], n);
            else memcpy(msg[0], msg[1], n * dtype_size(m->dtype));
            self_in = true;
            continue;
        }
        if (m->messages_on_device) comm_order_after_compute(pp, m->be);
        comm_send(pp, msg[1], n, m->dtype, next, DECODE_TAG);
    }
}

void model_decode_logits_at(struct model *m, int b, int t, double *out) {
    CHECK(b >= 0 && b < m->kv.rows && t >= 0 && t < m->kv.Tq,
          "decode logits of (%d, %d): the last step had %d rows of %d tokens", b, t, m->kv.rows,
          m->kv.Tq);
    if (m->last) logits_row(m, (size_t)b * m->kv.Tq + t, m->kv.row32, out);
    if (m->shard.n_chunks == 1 && m->first && m->last) return;
    struct comm_group *pp = parallel_host_group(m->groups.pp, m->groups.host_pp);
    CHECK(pp && pp->size > 1, "model_decode_logits_at: a pipeline stage without a pp group");
    comm_broadcast(pp, out, (size_t)m->cfg.vocab_size, DTYPE_FP64,
                   pipeline_last_stage(m->shard.schedule, pp->size));
}

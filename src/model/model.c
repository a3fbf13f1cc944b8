// model.c: the LLaMA decoder of model.h: its parameter table, arenas,
// initialisation and parameter I/O. Every buffer comes from one of three
// arenas (parameters, gradients, activations) carved by a size table that
// model_plan computes first. The passes are in model_pass.c.
#include "model.h"
#include "model_internal.h"
#include "ring_attention.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/rng.h"

// ---- the size table ------------------------------------------------------------

struct carver {
    char *base;   // NULL while only counting
    size_t bytes; // running size
};

static struct tensor carve(struct carver *c, enum dtype dtype, size_t numel) {
    size_t at = c->bytes;
    c->bytes += (numel * dtype_size(dtype) + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN;
    return tensor_view(c->base ? c->base + at : NULL, dtype, numel);
}

// Carves bytes of MoE buffers (moe.h's activations or scratch, as I32 words)
// and counts what they take, padding included, in mem.moe_bytes.
static struct tensor carve_moe(struct carver *c, size_t bytes, size_t *moe_bytes) {
    size_t at = c->bytes;
    struct tensor t = carve(c, DTYPE_I32, (bytes + 3) / 4);
    *moe_bytes += c->bytes - at;
    return t;
}

struct dims {
    int C, D, Hl, Hkvl, Fl, Vl, vocab_start, Vvalid, Lloc, max_layers;
    int kv_head0, kv_replicas; // first local key/value head; ranks holding each copy
    bool first, last, holds_wte;
};

static enum status dims_compute(const struct llama_config *cfg, const struct model_shard *s,
                                struct dims *d, struct error *err) {
    int tp = s->tp_size;
    if (cfg->n_heads <= 0 || (!cfg->head_dim && cfg->d_model % cfg->n_heads))
        return error_set(err, STATUS_BAD_INPUT, "model: d_model %d is not a multiple of n_heads %d",
                         cfg->d_model, cfg->n_heads);
    if (cfg->head_dim < 0 || cfg->head_dim > LLAMA_MAX_HEAD_DIM)
        return error_set(err, STATUS_BAD_INPUT, "model: head_dim %d outside [0, %d]", cfg->head_dim,
                         LLAMA_MAX_HEAD_DIM);
    const struct rope_scaling *rs = &cfg->rope_scaling;
    if (rs->type != ROPE_SCALING_NONE &&
        (!(rs->factor > 0) || (rs->type == ROPE_SCALING_LLAMA3 &&
                               (!(rs->low_freq_factor > 0) || !(rs->high_freq_factor > rs->low_freq_factor) ||
                                rs->original_max_pos < 1))))
        return error_set(err, STATUS_BAD_INPUT, "model: rope_scaling factor %g, low_freq_factor %g, "
                         "high_freq_factor %g, original_max_pos %d: expected factor > 0 and for llama3 "
                         "high > low > 0, original_max_pos >= 1", rs->factor, rs->low_freq_factor,
                         rs->high_freq_factor, rs->original_max_pos);
    if (cfg->n_kv_heads <= 0 || cfg->n_heads % cfg->n_kv_heads)
        return error_set(err, STATUS_BAD_INPUT, "model: n_heads %d is not a multiple of n_kv_heads %d",
                         cfg->n_heads, cfg->n_kv_heads);
    if (llama_head_dim(cfg) % 2 || llama_head_dim(cfg) < 2)
        return error_set(err, STATUS_BAD_INPUT, "model: head size %d must be even for RoPE",
                         llama_head_dim(cfg));
    if (tp < 1 || s->tp_rank < 0 || s->tp_rank >= tp || cfg->n_heads % tp || cfg->ffn_dim % tp ||
        (cfg->n_kv_heads % tp && tp % cfg->n_kv_heads))
        return error_set(err, STATUS_BAD_INPUT,
                         "model: tp %d must divide n_heads %d and ffn_dim %d, and divide or be a "
                         "multiple of n_kv_heads %d", tp, cfg->n_heads, cfg->ffn_dim, cfg->n_kv_heads);
    if (cfg->moe_experts) {
        struct moe_config mc;
        model_moe_config(cfg, &mc);
        enum status ms = moe_config_check(&mc, err);
        if (ms) return ms;
        if (cfg->moe_first_dense_layers < 0 || cfg->moe_first_dense_layers >= cfg->n_layers)
            return error_set(err, STATUS_BAD_INPUT, "model: moe_experts %d needs "
                             "moe_first_dense_layers %d in [0, n_layers %d)", cfg->moe_experts,
                             cfg->moe_first_dense_layers, cfg->n_layers);
    }
    int ep = MAX(1, s->ep_size);
    if (ep > 1 && (!cfg->moe_experts || cfg->moe_experts % ep || s->ep_rank < 0 || s->ep_rank >= ep))
        return error_set(err, STATUS_BAD_INPUT, "model: ep %d (rank %d) must divide moe_experts %d "
                         "(> 0)", ep, s->ep_rank, cfg->moe_experts);
    if (s->n_chunks < 1 || s->n_chunks > MODEL_MAX_CHUNKS)
        return error_set(err, STATUS_BAD_INPUT, "model: %d model chunks, expected 1 to %d",
                         s->n_chunks, MODEL_MAX_CHUNKS);
    d->Lloc = 0, d->max_layers = 0;
    for (int c = 0; c < s->n_chunks; c++) {
        int b = s->layer_begin[c], e = s->layer_end[c];
        if (b < 0 || e > cfg->n_layers || b >= e || (c > 0 && b < s->layer_end[c - 1]))
            return error_set(err, STATUS_BAD_INPUT,
                             "model: chunk %d holds layers [%d, %d): not an ordered, non-empty "
                             "range inside [0, %d)", c, b, e, cfg->n_layers);
        d->Lloc += e - b;
        d->max_layers = MAX(d->max_layers, e - b);
    }
    d->C = cfg->d_model;
    d->D = llama_head_dim(cfg);
    d->Hl = cfg->n_heads / tp;
    // n_kv_heads % tp == 0: each rank holds n_kv_heads / tp key/value heads.
    // Otherwise (tp a multiple of n_kv_heads) the tp / n_kv_heads consecutive
    // ranks whose query heads share a key/value head each hold a copy of it.
    d->Hkvl = cfg->n_kv_heads % tp == 0 ? cfg->n_kv_heads / tp : 1;
    d->kv_head0 = cfg->n_kv_heads % tp == 0 ? s->tp_rank * d->Hkvl
                                            : s->tp_rank / (tp / cfg->n_kv_heads);
    d->kv_replicas = cfg->n_kv_heads % tp == 0 ? 1 : tp / cfg->n_kv_heads;
    d->Fl = cfg->ffn_dim / tp;
    d->Vl = (cfg->vocab_size + tp - 1) / tp;
    d->vocab_start = s->tp_rank * d->Vl;
    d->Vvalid = MAX(0, MIN(d->Vl, cfg->vocab_size - d->vocab_start));
    d->first = s->layer_begin[0] == 0;
    d->last = s->layer_end[s->n_chunks - 1] == cfg->n_layers;
    d->holds_wte = d->first || (d->last && cfg->tie_embeddings);
    return STATUS_OK;
}

void model_moe_config(const struct llama_config *cfg, struct moe_config *out) {
    int Fs = llama_moe_shared_ffn(cfg);
    *out = (struct moe_config){.C = cfg->d_model, .E = cfg->moe_experts, .k = cfg->moe_top_k,
                               .F = llama_moe_ffn(cfg), .shared_F = Fs,
                               .shared_gate = Fs > 0 && cfg->moe_shared_gate,
                               .norm_topk = cfg->moe_norm_topk,
                               .capacity_factor = cfg->moe_capacity_factor,
                               .aux_coeff = cfg->moe_aux_loss_coeff, .z_coeff = cfg->moe_z_loss_coeff};
}

// A MoE block counts its active parameters: the router, k routed experts and
// the shared expert (with its gate), not the E - k idle experts.
double model_flops_per_token(const struct llama_config *cfg, int T) {
    double C = cfg->d_model, F = cfg->ffn_dim, L = cfg->n_layers, V = cfg->vocab_size;
    double HD = (double)cfg->n_heads * llama_head_dim(cfg);
    double kv = (double)cfg->n_kv_heads * llama_head_dim(cfg);
    double attn = HD * C + 2 * kv * C + C * HD; // q, k, v, o
    double mlp = 0;
    for (int l = 0; l < cfg->n_layers; l++) {
        if (!llama_layer_moe(cfg, l)) { mlp += 3 * C * F; continue; } // gate, up, down
        double Fs = llama_moe_shared_ffn(cfg);
        mlp += C * cfg->moe_experts + 3 * C * (cfg->moe_top_k * (double)llama_moe_ffn(cfg) + Fs) +
               (Fs > 0 && cfg->moe_shared_gate ? C : 0);
    }
    return 6.0 * (L * attn + mlp + V * C) + 6.0 * L * HD * T;
}

// Appends one parameter to the table (params may be NULL: count only).
static void param_add(struct param_info *params, int *n, size_t *offset, const char *name,
                      int rows, int cols, int grows, int gcols, int row_offset, int col_offset,
                      int valid_rows, bool decay, bool replicated, float init_std) {
    if (params) {
        struct param_info *p = &params[*n];
        memset(p, 0, sizeof *p);
        snprintf(p->name, sizeof p->name, "%s", name);
        p->rows = rows, p->cols = cols, p->grows = grows, p->gcols = gcols;
        p->row_offset = row_offset, p->col_offset = col_offset, p->valid_rows = valid_rows;
        p->offset = *offset, p->numel = (size_t)rows * cols;
        p->decay = decay, p->tp_replicated = replicated, p->init_std = init_std;
    }
    (*n)++;
    *offset += (((size_t)rows * cols + ALIGN_ELEMS - 1) / ALIGN_ELEMS) * ALIGN_ELEMS;
}

// The end of a unit (model.h): its range padded to unit_multiple elements.
static void unit_pad(size_t *offset, const struct model_shard *s) {
    size_t k = s->unit_multiple > 1 ? (size_t)s->unit_multiple : 1;
    *offset = (*offset + k - 1) / k * k;
}

// The parameter table in arena order; returns the count and the arena length.
static int params_layout(const struct llama_config *cfg, const struct model_shard *s,
                         const struct dims *d, struct param_info *params, size_t *total) {
    int n = 0, tr = s->tp_rank, C = d->C, D = d->D, H = cfg->n_heads, Hkv = cfg->n_kv_heads;
    int V = cfg->vocab_size, F = cfg->ffn_dim;
    size_t off = 0;
    float std = cfg->init_std, out_std = cfg->init_std / sqrtf(2.0f * cfg->n_layers);
    char name[96];
    if (d->holds_wte)
        param_add(params, &n, &off, "model.embed_tokens.weight", d->Vl, C, V, C, d->vocab_start,
                  0, d->Vvalid, true, false, std);
    if (d->holds_wte) unit_pad(&off, s);
    for (int c = 0; c < s->n_chunks; c++)
    for (int l = s->layer_begin[c]; l < s->layer_end[c]; l++) {
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%d." fmt, l), name)
        param_add(params, &n, &off, NAME("input_layernorm.weight"), C, 1, C, 1, 0, 0, C, false, true, 0);
        param_add(params, &n, &off, NAME("self_attn.q_proj.weight"), d->Hl * D, C, H * D, C,
                  tr * d->Hl * D, 0, d->Hl * D, true, false, std);
        param_add(params, &n, &off, NAME("self_attn.k_proj.weight"), d->Hkvl * D, C, Hkv * D, C,
                  d->kv_head0 * D, 0, d->Hkvl * D, true, false, std);
        param_add(params, &n, &off, NAME("self_attn.v_proj.weight"), d->Hkvl * D, C, Hkv * D, C,
                  d->kv_head0 * D, 0, d->Hkvl * D, true, false, std);
        if (cfg->qkv_bias) { // Qwen2: sharded with the weights' rows; zeros, no decay
            param_add(params, &n, &off, NAME("self_attn.q_proj.bias"), d->Hl * D, 1, H * D, 1,
                      tr * d->Hl * D, 0, d->Hl * D, false, false, 0);
            if (params) params[n - 1].init_zero = true;
            param_add(params, &n, &off, NAME("self_attn.k_proj.bias"), d->Hkvl * D, 1, Hkv * D, 1,
                      d->kv_head0 * D, 0, d->Hkvl * D, false, false, 0);
            if (params) params[n - 1].init_zero = true;
            param_add(params, &n, &off, NAME("self_attn.v_proj.bias"), d->Hkvl * D, 1, Hkv * D, 1,
                      d->kv_head0 * D, 0, d->Hkvl * D, false, false, 0);
            if (params) params[n - 1].init_zero = true;
        }
        if (cfg->qk_norm) { // Qwen3: gains of ones, replicated over TP, gradients TP-summed
            param_add(params, &n, &off, NAME("self_attn.q_norm.weight"), D, 1, D, 1, 0, 0, D,
                      false, true, 0);
            if (params) params[n - 1].tp_sum_grad = true;
            param_add(params, &n, &off, NAME("self_attn.k_norm.weight"), D, 1, D, 1, 0, 0, D,
                      false, true, 0);
            if (params) params[n - 1].tp_sum_grad = true;
        }
        param_add(params, &n, &off, NAME("self_attn.o_proj.weight"), C, d->Hl * D, C, H * D, 0,
                  tr * d->Hl * D, C, true, false, out_std);
        param_add(params, &n, &off, NAME("post_attention_layernorm.weight"), C, 1, C, 1, 0, 0, C,
                  false, true, 0);
        if (llama_layer_moe(cfg, l)) {
            // The routed experts split over ep: this rank's El of E, rows of the
            // stacked (E F, C) and (E C, F) tensors (param_info.expert). No TP
            // split: every TP rank runs the whole layer on all N rows
            // (model_pass.c), each tensor replicated with its whole gradient.
            int E = cfg->moe_experts, Fe = llama_moe_ffn(cfg), Fs = llama_moe_shared_ffn(cfg);
            int ep = MAX(1, s->ep_size), El = E / ep, e0 = s->ep_rank * El, first = n;
            param_add(params, &n, &off, NAME("mlp.gate.weight"), E, C, E, C, 0, 0, E, true, true,
                      std);
            param_add(params, &n, &off, NAME("mlp.experts.gate_proj.weight"), El * Fe, C, E * Fe, C,
                      e0 * Fe, 0, El * Fe, true, true, std);
            if (params) params[n - 1].expert = true;
            param_add(params, &n, &off, NAME("mlp.experts.up_proj.weight"), El * Fe, C, E * Fe, C,
                      e0 * Fe, 0, El * Fe, true, true, std);
            if (params) params[n - 1].expert = true;
            param_add(params, &n, &off, NAME("mlp.experts.down_proj.weight"), El * C, Fe, E * C, Fe,
                      e0 * C, 0, El * C, true, true, out_std);
            if (params) params[n - 1].expert = true;
            if (Fs) {
                param_add(params, &n, &off, NAME("mlp.shared_expert.gate_proj.weight"), Fs, C, Fs,
                          C, 0, 0, Fs, true, true, std);
                param_add(params, &n, &off, NAME("mlp.shared_expert.up_proj.weight"), Fs, C, Fs, C,
                          0, 0, Fs, true, true, std);
                param_add(params, &n, &off, NAME("mlp.shared_expert.down_proj.weight"), C, Fs, C,
                          Fs, 0, 0, C, true, true, out_std);
                if (cfg->moe_shared_gate)
                    param_add(params, &n, &off, NAME("mlp.shared_expert_gate.weight"), 1, C, 1, C,
                              0, 0, 1, true, true, std);
            }
            for (int i = first; params && i < n; i++) params[i].tp_whole_grad = true;
        } else {
            param_add(params, &n, &off, NAME("mlp.gate_proj.weight"), d->Fl, C, F, C, tr * d->Fl,
                      0, d->Fl, true, false, std);
            param_add(params, &n, &off, NAME("mlp.up_proj.weight"), d->Fl, C, F, C, tr * d->Fl, 0,
                      d->Fl, true, false, std);
            param_add(params, &n, &off, NAME("mlp.down_proj.weight"), C, d->Fl, C, F, 0,
                      tr * d->Fl, C, true, false, out_std);
        }
        unit_pad(&off, s);
#undef NAME
    }
    if (d->last) {
        param_add(params, &n, &off, "model.norm.weight", C, 1, C, 1, 0, 0, C, false, true, 0);
        if (!cfg->tie_embeddings)
            param_add(params, &n, &off, "lm_head.weight", d->Vl, C, V, C, d->vocab_start, 0,
                      d->Vvalid, true, false, std);
        unit_pad(&off, s);
    }
    if (s->arena_multiple > 1) off = (off + s->arena_multiple - 1) / s->arena_multiple * s->arena_multiple;
    *total = off;
    if (params) // who counts each tensor in the global gradient norm
        for (int i = 0; i < n; i++) {
            struct param_info *p = &params[i];
            p->kv_shared = d->kv_replicas > 1 &&
                           (strstr(p->name, ".k_proj.") || strstr(p->name, ".v_proj."));
            p->norm_skip = (p->tp_replicated && tr != 0) ||
                           (p->kv_shared && tr % d->kv_replicas != 0) ||
                           (!strcmp(p->name, "model.embed_tokens.weight") && !d->first);
        }
    return n;
}

// The unit table (model.h) of a parameter table of n entries over an arena
// of total elements: a unit starts at the embedding, at each block's input
// norm and at the final norm, and ends where the next starts (its padding
// included). units NULL: count only. Block indices count the rank's blocks
// in order; chunk_of_block (may be NULL when units is) maps them to chunks.
static int units_layout(const struct param_info *p, int n, size_t total,
                        const struct model_shard *s, struct model_unit *units) {
    int k = 0, block = 0;
    for (int i = 0; i < n; i++) {
        enum model_unit_kind kind;
        if (!strcmp(p[i].name, "model.embed_tokens.weight")) kind = MODEL_UNIT_EMBED;
        else if (strstr(p[i].name, ".input_layernorm.")) kind = MODEL_UNIT_BLOCK;
        else if (!strcmp(p[i].name, "model.norm.weight")) kind = MODEL_UNIT_HEAD;
        else continue;
        if (units) {
            if (k > 0) units[k - 1].end = p[i].offset, units[k - 1].n_params = i - units[k - 1].first_param;
            int chunk = 0;
            if (kind == MODEL_UNIT_HEAD) chunk = s->n_chunks - 1;
            if (kind == MODEL_UNIT_BLOCK)
                for (int c = 0, b0 = 0; c < s->n_chunks; b0 += s->layer_end[c] - s->layer_begin[c], c++)
                    if (block >= b0) chunk = c;
            units[k] = (struct model_unit){kind, chunk, kind == MODEL_UNIT_BLOCK ? block : -1,
                                           p[i].offset, total, i, n - i};
        }
        if (kind == MODEL_UNIT_BLOCK) block++;
        k++;
    }
    return k;
}

enum status model_shard_param_table(const struct llama_config *cfg, const struct model_shard *shard,
                                    struct param_info **out, int *n, struct error *err) {
    *out = NULL, *n = 0;
    struct dims d;
    enum status st = dims_compute(cfg, shard, &d, err);
    if (st) return st;
    size_t total;
    int count = params_layout(cfg, shard, &d, NULL, &total);
    *out = xcalloc((size_t)count, sizeof **out);
    *n = params_layout(cfg, shard, &d, *out, &total);
    return STATUS_OK;
}

enum status model_param_table(const struct llama_config *cfg, struct param_info **out, int *n,
                              struct error *err) {
    struct model_shard s = model_shard_full(cfg);
    return model_shard_param_table(cfg, &s, out, n, err);
}

static enum dtype grad_dtype(enum dtype d) { return d == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32; }

// What a block keeps in its slot under each recompute mode (model.h): none
// keeps everything; selective drops the norm outputs, the RoPE'd q and k and
// the SwiGLU product (recomputed from x, xmid, rstd, gate and up with two
// norms, the q and k GEMMs, RoPE and a SwiGLU); full keeps only the block's
// input (the slot's x[i]). Carves b's kept tensors (shared false: b is in a
// slot, the others are views of m->re) or its recomputed ones (shared true:
// b is m->re, the kept ones are empty). A MoE block's own activations
// (b->moe: moe_activation_bytes) are carved by the callers: in the slot
// under none and selective, once in m->re under full (moe_in_slot).
// Whether the i-th block of some chunk is dense (the slot's acts[i] then
// holds the SwiGLU's) and whether that of some chunk is a MoE block.
static void slot_layer_kinds(const struct model *m, int i, bool *dense, bool *moe) {
    *dense = *moe = false;
    for (int c = 0; c < m->shard.n_chunks; c++) {
        int l = m->shard.layer_begin[c] + i;
        if (l >= m->shard.layer_end[c]) continue;
        if (llama_layer_moe(&m->cfg, l)) *moe = true;
        else *dense = true;
    }
}

// Whether a MoE block's routing and expert activations stay in its slot
// from the forward to the backward (none, selective: selective recomputes
// the norms and q, k around the layer, not the layer) or are recomputed by
// the backward's re-run of the block's forward into the one m->re.moe
// (full: they then exist for the block being back-propagated only).
static bool moe_in_slot(const struct model *m) { return m->shard.recompute != RECOMPUTE_FULL; }

static void block_acts_layout(struct model *m, struct block_acts *b, struct carver *c,
                              bool shared, bool dense) {
    size_t N = m->N, Ns = m->Ns, C = m->C, HD = (size_t)m->Hl * m->D, KD = (size_t)m->Hkvl * m->D;
    size_t Fl = dense ? m->Fl : 0;
    enum dtype a = m->dtype, s = m->stat;
    bool all = m->shard.recompute == RECOMPUTE_NONE, most = m->shard.recompute != RECOMPUTE_FULL;
#define ACT(f, keep, dt, n) \
    b->f = (keep) != shared ? carve(c, dt, n) : shared ? tensor_view(NULL, dt, 0) : m->re.f
    ACT(ln1, all, a, Ns * C);
    ACT(rstd1, most, s, Ns);
    ACT(q, all, a, N * HD);
    ACT(k, all, a, N * KD);
    bool qkn = m->cfg.qk_norm; // qk_norm's inputs and statistics: recomputed with q and k
    ACT(qr, all, a, qkn ? N * HD : 0);
    ACT(kr, all, a, qkn ? N * KD : 0);
    ACT(rstdq, all, s, qkn ? N * m->Hl : 0);
    ACT(rstdk, all, s, qkn ? N * m->Hkvl : 0);
    ACT(v, most, a, N * KD);
    ACT(att, most, a, N * HD);
    ACT(lse, most, s, N * m->Hl);
    ACT(xmid, most, a, Ns * C);
    ACT(ln2, all, a, Ns * C);
    ACT(rstd2, most, s, Ns);
    ACT(gate, most, a, N * Fl);
    ACT(up, most, a, N * Fl);
    ACT(act, all, a, N * Fl);
#undef ACT
    b->moe = tensor_view(NULL, DTYPE_I32, 0);
}

// Bytes of one W stash under split_backward (model.h,
// model_memory.w_stash_bytes; model_pass.c, wgrad and unit_input_grads), 0
// otherwise: everything the weight-gradient GEMMs of the largest chunk read,
// since B frees the activation slot and W reads only the stash; each piece
// padded to TENSOR_ALIGN bytes as the walk takes them. Per block, in the
// model dtype, the output gradients: d x[i+1] (Ns, C) of down, dgate and dup
// (N, Fl) each (one piece when joined), d xmid (Ns, C) of o, dq (N, Hl D),
// dk, dv (N, Hkvl D) each (one piece when q, k, v are joined); and the
// inputs: act (N, Fl) of down, ln2 (Ns, C) of gate and up, att (N, Hl D) of
// o, ln1 (Ns, C) of q, k, v (each once for the GEMMs sharing it). The head
// (last virtual stage): dlogits (N, Vl) and the final norm's output (Ns, C).
// Under sequence parallelism the (Ns, C) pieces are this rank's rows of
// what the GEMMs read, all-gathered again by W (model_pass.c,
// stash_operand): a stash is then no larger than a slot. Without a
// gradient arena (ZeRO-2/3) also the gradients B computes, in the gradient
// dtype: per block ln1, ln2 (C), the biases (Hl D, Hkvl D x2) and qk_norm's
// gains (D x2); the head's final norm (C).
static size_t wstash_bytes(const struct model *m) {
    if (!m->shard.split_backward) return 0;
    size_t es = dtype_size(m->dtype), gs = dtype_size(grad_dtype(m->dtype));
    size_t N = m->N, Ns = m->Ns, C = m->C, HD = (size_t)m->Hl * m->D;
    size_t KD = (size_t)m->Hkvl * m->D, Fl = m->Fl;
#define PIECE(n, size) (((n) * (size) + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN)
    size_t block = 2 * PIECE(Ns * C, es) + 2 * PIECE(N * Fl, es) + PIECE(N * HD, es) +
                   2 * PIECE(N * KD, es);                                      // dy
    block += PIECE(N * Fl, es) + 2 * PIECE(Ns * C, es) + PIECE(N * HD, es);   // x
    size_t head = m->last ? PIECE(N * (size_t)m->Vl, es) + PIECE(Ns * C, es) : 0;
    if (m->shard.no_grad_arena) {
        block += 2 * PIECE(C, gs);
        if (m->cfg.qkv_bias) block += PIECE(HD, gs) + 2 * PIECE(KD, gs);
        if (m->cfg.qk_norm) block += 2 * PIECE((size_t)m->D, gs);
        head += m->last ? PIECE(C, gs) : 0;
    }
#undef PIECE
    return (size_t)m->max_layers * block + head;
}

// Carves one activation slot (base NULL: counts only). Under recompute the
// final norm's output is recomputed too, and the logits' gradient is
// written over the logits (ce_backward is elementwise).
static void slot_layout(struct model *m, struct slot *S, struct carver *c) {
    int N = m->N, Ns = m->Ns, C = m->C;
    enum dtype a = m->dtype, s = m->stat;
    bool all = m->shard.recompute == RECOMPUTE_NONE;
    for (int l = 0; l <= m->max_layers; l++) S->x[l] = carve(c, a, (size_t)Ns * C);
    for (int l = 0; l < m->max_layers; l++) {
        bool dense, moe;
        slot_layer_kinds(m, l, &dense, &moe);
        block_acts_layout(m, &S->acts[l], c, false, dense);
        if (moe && !moe_in_slot(m)) {
            S->acts[l].moe = m->re.moe;
        } else if (moe) {
            S->acts[l].moe = carve_moe(c, moe_activation_bytes(&m->moe, m->N, a), &m->mem.moe_bytes);
        }
    }
    if (m->last) {
        S->lnf = all ? carve(c, a, (size_t)Ns * C) : m->re_lnf;
        S->rstdf = carve(c, s, Ns);
        S->logits = carve(c, a, (size_t)N * m->Vl);
        S->dlogits = all ? carve(c, a, (size_t)N * m->Vl) : S->logits;
        S->rowmax = carve(c, s, N);
        S->partials = carve(c, s, (size_t)N * 3);
        S->lse = carve(c, s, N);
        S->loss = carve(c, s, N);
    }
    S->tokens = carve(c, DTYPE_I32, N);
    S->targets = carve(c, DTYPE_I32, N);
    S->doc_start = carve(c, DTYPE_I32, N);
    S->rope_pos = m->cp > 1 ? carve(c, DTYPE_I32, N) : tensor_view(NULL, DTYPE_I32, 0);
}

// Carves the activation arena: the recompute buffer, the slots, then the
// shared scratch (base NULL: counts only). m->mem.slot_bytes is the size of
// one slot, m->mem.recompute_bytes that of the recompute buffer.
static void acts_layout(struct model *m, struct carver *c) {
    int N = m->N, Ns = m->Ns, C = m->C, HD = m->Hl * m->D, KD = m->Hkvl * m->D, Fl = m->Fl;
    enum dtype a = m->dtype, s = m->stat;
    size_t before = c->bytes;
    m->mem.moe_bytes = 0;
    block_acts_layout(m, &m->re, c, true, true);
    bool any_moe = false; // a MoE block among the rank's: under full its layer's buffer here
    for (int l = 0; l < m->max_layers; l++) {
        bool dense, moe;
        slot_layer_kinds(m, l, &dense, &moe);
        any_moe |= moe;
    }
    if (any_moe && !moe_in_slot(m))
        m->re.moe = carve_moe(c, moe_activation_bytes(&m->moe, m->N, a), &m->mem.moe_bytes);
    bool re_lnf = m->last && m->shard.recompute != RECOMPUTE_NONE;
    m->re_lnf = re_lnf ? carve(c, a, (size_t)Ns * C) : tensor_view(NULL, a, 0);
    m->mem.recompute_bytes = c->bytes - before;
    for (int i = 0; i < m->shard.n_slots; i++) {
        before = c->bytes;
        slot_layout(m, &m->slots[i], c);
        m->mem.slot_bytes = c->bytes - before;
    }
    // The W stashes (split_backward): a pool of their own, B to W, beside
    // the slots (F to B or to the backward).
    size_t ws = wstash_bytes(m);
    for (int i = 0; i < m->shard.n_wstash; i++) {
        struct tensor t = carve(c, DTYPE_I32, ws / 4); // bytes, as 4-byte words
        if (m->wstash) m->wstash[i].t = t;
    }
    m->mem.w_stash_bytes = (size_t)m->shard.n_wstash * ws;
    m->rope_cos = carve(c, s, (size_t)m->cfg.max_seq_len * (m->D / 2));
    m->rope_sin = carve(c, s, (size_t)m->cfg.max_seq_len * (m->D / 2));
    m->loss_acc = carve(c, DTYPE_FP64, 1); // zeroed with the arena
    // Context parallelism (ring_attention.h): the positions of every cp
    // rank's tokens, cp x N I32, and two travelling buffers of 4 N Hkvl D
    // elements in the model dtype ([k | v | dk | dv]); nothing at cp = 1.
    // model_memory.cp_bytes counts them; `trident plan` has them from model_plan.
    before = c->bytes;
    if (m->cp > 1) {
        size_t ring = 4 * (size_t)N * KD;
        m->cp_pos = carve(c, DTYPE_I32, (size_t)m->cp * N);
        m->ring[0] = carve(c, a, ring);
        m->ring[1] = carve(c, a, ring);
    } else {
        m->cp_pos = tensor_view(NULL, DTYPE_I32, 0);
        m->ring[0] = m->ring[1] = tensor_view(NULL, a, 0);
    }
    m->mem.cp_bytes = c->bytes - before;
    m->moe_scratch = carve_moe(c, m->cfg.moe_experts ? moe_scratch_bytes(&m->moe, N, a) : 0,
                               &m->mem.moe_bytes);
    m->tmp = carve(c, a, (size_t)N * C);
    m->dx = carve(c, a, (size_t)Ns * C);
    m->dln = carve(c, a, (size_t)N * C);
    if (m->sp) {
        m->ln_full = carve(c, a, (size_t)N * C);
        m->tmp_s = carve(c, a, (size_t)Ns * C);
        m->dln_s = carve(c, a, (size_t)Ns * C);
        m->dx_full = carve(c, a, (size_t)N * C);
    } else {
        m->ln_full = tensor_view(NULL, a, 0); // unused: the GEMMs read the norm output
        m->tmp_s = m->tmp, m->dln_s = m->dln, m->dx_full = m->dx;
    }
    m->datt = carve(c, a, (size_t)N * HD);
    m->dq = carve(c, a, (size_t)N * HD);
    m->dk = carve(c, a, (size_t)N * KD);
    m->dv = carve(c, a, (size_t)N * KD);
    m->dqr = carve(c, a, m->cfg.qk_norm ? (size_t)N * HD : 0);
    m->dkr = carve(c, a, m->cfg.qk_norm ? (size_t)N * KD : 0);
    m->ones = carve(c, a, m->cfg.qkv_bias ? (size_t)N : 0); // filled by model_init
    // qkv (N, Hl D + 2 Hkvl D) is live only from the QKV GEMM to its RoPE
    // split (forward, recomputed forward) and from the join to the two GEMMs
    // after it (backward); dgate and dup only inside a block's MLP backward,
    // which never overlaps those: qkv shares their memory when it fits there
    // (dgate and dup adjacent: no padding between them).
    size_t nqkv = (size_t)N * (HD + 2 * KD), nfl = (size_t)N * Fl;
    m->dgate = carve(c, a, nfl);
    m->dup = carve(c, a, nfl);
    bool share = 2 * nfl >= nqkv && nfl * dtype_size(a) % TENSOR_ALIGN == 0;
    m->qkv = share ? tensor_view(m->dgate.data, a, nqkv) : carve(c, a, nqkv);
    m->dact = carve(c, a, (size_t)N * Fl);
    if (m->kv_replicas > 1)
        m->kv_grad = carve(c, grad_dtype(a), (size_t)m->cfg.n_kv_heads * m->D * C);
    // BF16/FP16 activations are summed over TP in FP32 (docs/design.md §5):
    // converted into red (N, C), reduced, converted back (red_s (Ns, C)
    // receives the reduce-scatter under sequence parallelism).
    bool lowp = a == DTYPE_BF16 || a == DTYPE_FP16;
    if (lowp && m->shard.tp_size > 1) {
        m->red = carve(c, DTYPE_FP32, (size_t)N * C);
        m->red_s = m->sp ? carve(c, DTYPE_FP32, (size_t)Ns * C) : m->red;
    } else {
        m->red = m->red_s = tensor_view(NULL, DTYPE_FP32, 0);
    }
}

// Whether the head's dW of a tied embedding gets its own buffer
// (model.tied_dhead): split_backward on a rank running both passes.
static bool model_tied_head_split(const struct model *m, const struct llama_config *cfg) {
    return m->shard.split_backward && cfg->tie_embeddings && m->first && m->last;
}

// Fills the fields of m that the size table needs (no allocation).
static enum status model_setup(struct model *m, const struct llama_config *cfg,
                               const struct model_shard *shard, enum dtype dtype, int B, int T,
                               struct error *err) {
    if (dtype != DTYPE_FP32 && dtype != DTYPE_FP64 && dtype != DTYPE_BF16 && dtype != DTYPE_FP16)
        return error_set(err, STATUS_BAD_INPUT, "model: dtype %s, expected fp32, bf16, fp16 "
                         "or fp64", dtype_name(dtype));
    if (B < 1 || T < 1 || T > cfg->max_seq_len)
        return error_set(err, STATUS_BAD_INPUT,
                         "model: microbatch (B=%d, T=%d) must be positive with T <= max_seq_len %d",
                         B, T, cfg->max_seq_len);
    int cp = MAX(1, shard->cp_size);
    if (cp > 1 && (T % (2 * cp) || shard->cp_rank < 0 || shard->cp_rank >= cp))
        return error_set(err, STATUS_BAD_INPUT, "model: context parallel rank %d of %d needs T = %d "
                         "to be a multiple of 2 cp = %d", shard->cp_rank, cp, T, 2 * cp);
    struct dims d;
    enum status st = dims_compute(cfg, shard, &d, err);
    if (st) return st;
    m->cfg = *cfg, m->shard = *shard, m->dtype = dtype;
    m->stat = dtype == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32;
    m->cp = cp, m->cp_rank = cp > 1 ? shard->cp_rank : 0;
    m->B = B, m->Tg = T, m->T = T / cp, m->N = B * m->T;
    if (shard->recompute != RECOMPUTE_NONE && shard->recompute != RECOMPUTE_SELECTIVE &&
        shard->recompute != RECOMPUTE_FULL)
        return error_set(err, STATUS_BAD_INPUT, "model: recompute mode %d, expected none, "
                         "selective or full", (int)shard->recompute);
    if (cfg->moe_experts) {
        model_moe_config(cfg, &m->moe);
        // expert parallelism: the buffers' row bounds (moe_rows_recv_max);
        // the groups come with model_set_groups
        m->moe.ep = (struct moe_ep){.size = MAX(1, shard->ep_size), .rank = shard->ep_rank};
        if (shard->split_backward)
            return error_set(err, STATUS_BAD_INPUT, "model: the mixture-of-experts blocks need "
                             "a fused backward (no split B/W schedule) for now");
    }
    m->sp = shard->sequence_parallel && shard->tp_size > 1;
    if (m->sp && m->N % shard->tp_size)
        return error_set(err, STATUS_BAD_INPUT, "model: sequence parallel needs B*T = %d rows "
                         "divisible by tp = %d", m->N, shard->tp_size);
    m->Ns = m->sp ? m->N / shard->tp_size : m->N;
    m->C = d.C, m->D = d.D, m->Hl = d.Hl, m->Hkvl = d.Hkvl, m->Fl = d.Fl;
    m->Vl = d.Vl, m->vocab_start = d.vocab_start, m->Vvalid = d.Vvalid;
    m->n_local_layers = d.Lloc, m->first = d.first, m->last = d.last;
    m->max_layers = d.max_layers;
    for (int c = 0, b = 0; c < shard->n_chunks; b += shard->layer_end[c] - shard->layer_begin[c], c++)
        m->block0[c] = b;
    if (m->shard.n_slots < 1) m->shard.n_slots = 1;
    if (!m->shard.split_backward) m->shard.n_wstash = 0;
    else if (m->shard.n_wstash < 1) m->shard.n_wstash = 1;
    m->kv_head0 = d.kv_head0, m->kv_replicas = d.kv_replicas;
    size_t total;
    m->n_params = params_layout(cfg, shard, &d, NULL, &total);
    m->mem.n_params = total;
    m->mem.param_bytes = shard->no_param_arena ? 0 : total * dtype_size(dtype);
    m->mem.grad_bytes = shard->no_grad_arena ? 0 : total * dtype_size(grad_dtype(dtype));
    if (model_tied_head_split(m, cfg) && m->mem.grad_bytes) // model.tied_dhead, after the arena
        m->mem.grad_bytes = (m->mem.grad_bytes + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN +
                            (size_t)d.Vl * d.C * dtype_size(grad_dtype(dtype));
    struct param_info *p = xcalloc((size_t)m->n_params, sizeof *p);
    params_layout(cfg, shard, &d, p, &total);
    m->mem.n_expert_params = 0; // each tensor padded to ALIGN_ELEMS, as param_add places them
    for (int i = 0; i < m->n_params; i++)
        if (p[i].expert) m->mem.n_expert_params += (p[i].numel + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    m->mem.n_units = units_layout(p, m->n_params, total, shard, NULL);
    struct model_unit *u = xcalloc((size_t)m->mem.n_units, sizeof *u);
    units_layout(p, m->n_params, total, shard, u);
    m->mem.max_unit_numel = 0;
    m->mem.tied_embed_numel = 0;
    for (int i = 0; i < m->mem.n_units; i++) {
        m->mem.max_unit_numel = MAX(m->mem.max_unit_numel, u[i].end - u[i].begin);
        if (u[i].kind == MODEL_UNIT_EMBED && d.last && cfg->tie_embeddings)
            m->mem.tied_embed_numel = u[i].end - u[i].begin;
    }
    free(u), free(p);
    return STATUS_OK;
}

enum status model_plan(const struct llama_config *cfg, const struct model_shard *shard,
                       enum dtype dtype, int B, int T, struct model_memory *out,
                       struct error *err) {
    struct model m = {0};
    enum status st = model_setup(&m, cfg, shard, dtype, B, T, err);
    if (st) return st;
    struct slot slots[m.shard.n_slots];
    struct tensor xs[m.shard.n_slots][m.max_layers + 1];
    struct block_acts acts[m.shard.n_slots][m.max_layers];
    for (int i = 0; i < m.shard.n_slots; i++) slots[i].x = xs[i], slots[i].acts = acts[i];
    m.slots = slots;
    m.wstash = NULL; // counted only
    struct carver c = {0};
    acts_layout(&m, &c);
    m.mem.activation_bytes = c.bytes;
    *out = m.mem;
    return STATUS_OK;
}

struct model_shard model_shard_full(const struct llama_config *cfg) {
    return model_shard_pipeline(cfg, PP_SCHEDULE_1F1B, 1, 0, 1);
}

struct model_shard model_shard_pipeline(const struct llama_config *cfg, enum pp_schedule kind,
                                        int p, int s, int v) {
    bool split = pipeline_schedule_splits(kind);
    struct model_shard sh = {.n_chunks = v, .tp_rank = 0, .tp_size = 1, .n_slots = 1,
                             .schedule = kind, .split_backward = split, .n_wstash = split};
    int L = cfg->n_layers, pv = p * v;
    for (int c = 0; c < v && c < MODEL_MAX_CHUNKS; c++) {
        int u = pipeline_virtual_stage(kind, p, s, c);
        sh.layer_begin[c] = (int)((long)u * L / pv);
        sh.layer_end[c] = (int)((long)(u + 1) * L / pv);
    }
    return sh;
}

// The global layer of the rank's block blk.
static int block_layer(const struct model *m, int blk) {
    for (int c = 0; c < m->shard.n_chunks; c++)
        if (blk < m->block0[c] + model_chunk_layers(m, c))
            return m->shard.layer_begin[c] + blk - m->block0[c];
    CHECK(0, "block %d of %d", blk, m->n_local_layers);
}

// Points unit u's tensors (parameters, or with grads its gradients) at base
// (end - begin elements laid out as the unit's range of the arena).
static void unit_bind(struct model *m, int u, struct tensor base, bool grads) {
    const struct model_unit *un = &m->units[u];
    const struct param_info *p = m->params;
    int i = un->first_param;
#define NEXT() (i++, tensor_slice(base, p[i - 1].offset - un->begin, p[i - 1].numel))
    switch (un->kind) {
    case MODEL_UNIT_EMBED:
        *(grads ? &m->dwte : &m->wte) = NEXT();
        break;
    case MODEL_UNIT_BLOCK: {
        struct block *b = grads ? &m->dblocks[un->block] : &m->blocks[un->block];
        struct tensor none = tensor_view(NULL, base.dtype, 0);
        b->ln1_w = NEXT(); b->wq = NEXT(); b->wk = NEXT(); b->wv = NEXT();
        b->bq = b->bk = b->bv = b->qn_w = b->kn_w = none;
        if (m->cfg.qkv_bias) { b->bq = NEXT(); b->bk = NEXT(); b->bv = NEXT(); }
        if (m->cfg.qk_norm) { b->qn_w = NEXT(); b->kn_w = NEXT(); }
        b->wo = NEXT();
        b->ln2_w = NEXT();
        b->is_moe = llama_layer_moe(&m->cfg, block_layer(m, un->block));
        if (b->is_moe) {
            struct moe_weights *mw = &b->moe;
            b->wgate = b->wup = b->wdown = none;
            mw->router = NEXT(); mw->gate = NEXT(); mw->up = NEXT(); mw->down = NEXT();
            mw->sh_gate = mw->sh_up = mw->sh_down = mw->sh_router = none;
            if (m->moe.shared_F) { mw->sh_gate = NEXT(); mw->sh_up = NEXT(); mw->sh_down = NEXT(); }
            if (m->moe.shared_gate) mw->sh_router = NEXT();
            mw->expert_bias = tensor_view(NULL, m->stat, 0);
        } else {
            b->wgate = NEXT(); b->wup = NEXT(); b->wdown = NEXT();
        }
        break;
    }
    case MODEL_UNIT_HEAD:
        *(grads ? &m->dnorm_w : &m->norm_w) = NEXT();
        if (m->cfg.tie_embeddings)
            *(grads ? &m->dhead : &m->head) = !grads ? m->wte : m->tied_dhead.numel ? m->tied_dhead : m->dwte;
        else *(grads ? &m->dhead : &m->head) = NEXT();
        break;
    }
#undef NEXT
    CHECK(i == un->first_param + un->n_params, "unit %d: bound %d of %d parameters", u,
          i - un->first_param, un->n_params);
    (grads ? m->unit_grads : m->unit_params)[u] = base;
}

// Points every unit at its range of the arenas that exist; records where
// each block and the head start (the gradient-ready offsets).
static void blocks_bind(struct model *m) {
    for (int u = 0; u < m->n_units; u++) {
        const struct model_unit *un = &m->units[u];
        size_t n = un->end - un->begin;
        if (un->kind == MODEL_UNIT_BLOCK) m->block_offset[un->block] = un->begin, m->block_unit[un->block] = u;
        if (un->kind == MODEL_UNIT_HEAD) m->head_offset = un->begin, m->head_unit = u;
        if (un->kind == MODEL_UNIT_EMBED) m->embed_unit = u;
        m->unit_params[u] = tensor_view(NULL, m->param_arena.dtype, n);
        m->unit_grads[u] = tensor_view(NULL, m->grad_arena.dtype, n);
        if (m->param_arena.data) unit_bind(m, u, tensor_slice(m->param_arena, un->begin, n), false);
        if (m->grad_arena.data) unit_bind(m, u, tensor_slice(m->grad_arena, un->begin, n), true);
    }
}

const struct model_unit *model_units(const struct model *m, int *n) {
    *n = m->n_units;
    return m->units;
}

void model_unit_bind(struct model *m, int u, void *params, void *grads) {
    CHECK(u >= 0 && u < m->n_units, "unit %d of %d", u, m->n_units);
    size_t n = m->units[u].end - m->units[u].begin;
    if (params) unit_bind(m, u, tensor_view(params, m->dtype, n), false);
    if (grads) unit_bind(m, u, tensor_view(grads, grad_dtype(m->dtype), n), true);
}

void model_set_unit_hook(struct model *m, void (*fn)(void *ctx, int unit, enum model_unit_event ev),
                         void *ctx) {
    m->unit_hook = fn, m->unit_hook_ctx = ctx;
}

void model_init_unit_weights(struct model *m, int u, uint64_t seed) {
    const struct model_unit *un = &m->units[u];
    size_t max_numel = 0;
    for (int i = un->first_param; i < un->first_param + un->n_params; i++)
        max_numel = MAX(max_numel, (size_t)m->params[i].grows * m->params[i].gcols);
    float *host = xmalloc(max_numel * sizeof *host);
    for (int i = un->first_param; i < un->first_param + un->n_params; i++) {
        const struct param_info *p = &m->params[i];
        if (p->init_zero) memset(host, 0, sizeof *host * (size_t)p->grows * p->gcols);
        else rng_fill_normal(host, (size_t)p->grows * p->gcols, seed, p->name, p->init_std);
        model_set_param(m, p, host);
    }
    free(host);
}

// The unit holding parameter p (by its arena offset: p may be the same
// entry of another model's table of this layout).
static int unit_of(const struct model *m, const struct param_info *p) {
    for (int u = 0; u < m->n_units; u++)
        if (p->offset >= m->units[u].begin && p->offset < m->units[u].end) return u;
    CHECK(0, "parameter %s (offset %zu) in no unit", p->name, p->offset);
}

// Where parameter p (or its gradient) is bound now.
static struct tensor param_view(const struct model *m, const struct param_info *p, bool grads) {
    int u = unit_of(m, p);
    struct tensor base = (grads ? m->unit_grads : m->unit_params)[u];
    CHECK(base.data, "%s of %s: unit %d is not bound", grads ? "gradient" : "parameter", p->name, u);
    return tensor_slice(base, p->offset - m->units[u].begin, p->numel);
}

static void to_device_as(struct model *m, struct tensor dst, const void *host, enum dtype host_dtype);

enum status model_init(struct model **out, struct backend *be, const struct llama_config *cfg,
                       const struct model_shard *shard, enum dtype dtype, int B, int T,
                       uint64_t seed, struct error *err) {
    struct model *m = xcalloc(1, sizeof *m);
    enum status st = model_setup(m, cfg, shard, dtype, B, T, err);
    if (st) { free(m); return st; }
    m->be = be;
    struct dims d;
    dims_compute(cfg, shard, &d, NULL);
    m->params = xcalloc(m->n_params, sizeof *m->params);
    size_t total;
    params_layout(cfg, shard, &d, m->params, &total);
    m->blocks = xcalloc(m->n_local_layers, sizeof *m->blocks);
    m->dblocks = xcalloc(m->n_local_layers, sizeof *m->dblocks);
    m->slots = xcalloc(m->shard.n_slots, sizeof *m->slots);
    for (int i = 0; i < m->shard.n_slots; i++) {
        m->slots[i].x = xcalloc(m->max_layers + 1, sizeof *m->slots[i].x);
        m->slots[i].acts = xcalloc(m->max_layers, sizeof *m->slots[i].acts);
        if (cfg->moe_experts) m->slots[i].moe_st = xcalloc(m->max_layers, sizeof *m->slots[i].moe_st);
    }
    m->wstash = m->shard.n_wstash ? xcalloc(m->shard.n_wstash, sizeof *m->wstash) : NULL;
    m->block_offset = xcalloc(m->n_local_layers, sizeof *m->block_offset);
    m->block_unit = xcalloc(m->n_local_layers, sizeof *m->block_unit);
    m->n_units = units_layout(m->params, m->n_params, total, &m->shard, NULL);
    m->units = xcalloc((size_t)m->n_units, sizeof *m->units);
    units_layout(m->params, m->n_params, total, &m->shard, m->units);
    m->unit_params = xcalloc((size_t)m->n_units, sizeof *m->unit_params);
    m->unit_grads = xcalloc((size_t)m->n_units, sizeof *m->unit_grads);
    m->embed_unit = m->head_unit = -1;

    struct carver count = {0};
    acts_layout(m, &count);
    m->mem.activation_bytes = count.bytes;
    void *pa = m->mem.param_bytes ? backend_alloc(be, m->mem.param_bytes) : NULL;
    void *ga = m->mem.grad_bytes ? backend_alloc(be, m->mem.grad_bytes) : NULL;
    void *aa = backend_alloc(be, m->mem.activation_bytes);
    if ((!pa && m->mem.param_bytes) || (!ga && m->mem.grad_bytes) || !aa) {
        backend_dealloc(be, pa), backend_dealloc(be, ga), backend_dealloc(be, aa);
        error_set(err, STATUS_RUNTIME,
                  "model: out of %s memory (params %zu B, grads %zu B, activations %zu B)",
                  be->ops->name, m->mem.param_bytes, m->mem.grad_bytes, m->mem.activation_bytes);
        model_free(m); // after the message: it reads m->mem
        return STATUS_RUNTIME;
    }
    m->param_arena = tensor_view(pa, dtype, total);
    m->grad_arena = tensor_view(ga, grad_dtype(dtype), total);
    m->tied_dhead = tensor_view(NULL, grad_dtype(dtype), 0);
    if (ga && model_tied_head_split(m, cfg)) {
        size_t at = (total * dtype_size(grad_dtype(dtype)) + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN;
        m->tied_dhead = tensor_view((char *)ga + at, grad_dtype(dtype), (size_t)m->Vl * m->C);
        backend_memset0(be, m->tied_dhead);
    }
    m->act_arena = tensor_view(aa, DTYPE_I32, m->mem.activation_bytes / 4); // bytes, as 4-byte words
    struct carver c = {aa, 0};
    acts_layout(m, &c);
    for (int i = 0; i < m->shard.n_wstash; i++) m->wstash[i].chunk = -1;
    blocks_bind(m);
    if (cfg->moe_experts) {
        m->moe_layer = xcalloc((size_t)cfg->n_layers, sizeof *m->moe_layer);
        for (int l = 0; l < cfg->n_layers; l++)
            if (llama_layer_moe(cfg, l)) m->moe_layer[m->n_moe_model++] = l;
        for (int b = 0; b < m->n_local_layers; b++) m->n_moe += m->blocks[b].is_moe;
        m->moe_log = xcalloc(model_moe_stats_numel(m), sizeof *m->moe_log);
    }
    if (pa) backend_memset0(be, m->param_arena);
    if (ga) backend_memset0(be, m->grad_arena);
    backend_memset0(be, m->act_arena);
    // The kernels' working memory for this model's largest ops, now: a step
    // then allocates nothing on the device.
    // fp8_gemm 0 here: model_fp8_init reserves the FP8 GEMMs' bound.
    struct backend_bounds bounds = {m->N, m->C, B, m->T, m->Hl, m->Hkvl, m->D, dtype, 0};
    // qk_norm's RMSNorm runs over (N Hl, D) rows
    struct backend_bounds qk = {m->N * m->Hl, m->D, B, m->T, m->Hl, m->Hkvl, m->D, dtype, 0};
    if (backend_reserve(be, &bounds, err) || (cfg->qk_norm && backend_reserve(be, &qk, err))) {
        model_free(m);
        return err->status;
    }
    if (cfg->qkv_bias) { // the bias GEMMs' column of ones
        double *one = xmalloc((size_t)m->N * sizeof *one);
        for (int i = 0; i < m->N; i++) one[i] = 1.0;
        if (m->dtype == DTYPE_FP64) {
            backend_to_device(be, m->ones.data, one, (size_t)m->N * sizeof *one);
        } else {
            float *f = (float *)one; // in place, front to back
            for (int i = 0; i < m->N; i++) f[i] = 1.0f;
            to_device_as(m, m->ones, f, DTYPE_FP32);
        }
        free(one);
    }

    // RoPE tables, angles in double.
    size_t half = (size_t)cfg->max_seq_len * (m->D / 2);
    size_t tab_bytes = half * dtype_size(m->stat);
    char *tab = xmalloc(2 * tab_bytes);
    if (m->stat == DTYPE_FP64)
        rope_table_fill_scaled_f64((double *)tab, (double *)(tab + tab_bytes), cfg->max_seq_len,
                                   m->D, cfg->rope_theta, &cfg->rope_scaling);
    else
        rope_table_fill_scaled((float *)tab, (float *)(tab + tab_bytes), cfg->max_seq_len, m->D,
                               cfg->rope_theta, &cfg->rope_scaling);
    backend_to_device(be, m->rope_cos.data, tab, tab_bytes);
    backend_to_device(be, m->rope_sin.data, tab + tab_bytes, tab_bytes);
    free(tab);

    // Weights: every element from (seed, name, global index); without a
    // parameter arena the trainer initialises them unit by unit.
    if (pa)
        for (int u = 0; u < m->n_units; u++) model_init_unit_weights(m, u, seed);
    m->host_loss = xcalloc(m->N, sizeof *m->host_loss);
    m->host_doc = xcalloc((size_t)B * m->Tg, sizeof *m->host_doc);
    m->doc_eot = -1;
    if (m->cp > 1) {
        m->host_tok = xcalloc(m->N, sizeof *m->host_tok);
        m->host_tgt = xcalloc(m->N, sizeof *m->host_tgt);
        m->host_pos = xcalloc(2 * (size_t)m->N, sizeof *m->host_pos);
        cp_upload_positions(m);
    }
    *out = m;
    return STATUS_OK;
}

// ---- generation's key/value cache ------------------------------------------------

// Carves the cache of rows x len positions for m's local layers (base NULL:
// counts only, c->bytes the size).
static void kv_layout(struct model *m, struct kv_cache *kv, struct carver *c, int rows, int len) {
    size_t n = (size_t)rows * len * m->Hkvl * m->D;
    for (int l = 0; l < m->n_local_layers; l++) {
        kv->k[l] = carve(c, m->dtype, n);
        kv->v[l] = carve(c, m->dtype, n);
    }
    kv->pos = carve(c, DTYPE_I32, (size_t)rows);
    kv->rope_off = carve(c, DTYPE_I32, (size_t)rows * len);
    kv->row32 = carve(c, DTYPE_FP32, m->last ? (size_t)m->Vl : 0);
    bool whole = m->shard.n_chunks == 1 && m->first && m->last;
    size_t msg = whole ? 0 : (size_t)rows * MAX(1, MIN(len, m->Ns / rows)) * m->C;
    kv->msg[0] = carve(c, m->dtype, msg);
    kv->msg[1] = carve(c, m->dtype, msg);
}

enum status model_kv_cache_bytes(const struct llama_config *cfg, const struct model_shard *shard,
                                 enum dtype dtype, int B, int T, int rows, int len, size_t *bytes,
                                 struct error *err) {
    struct model m = {0};
    enum status st = model_setup(&m, cfg, shard, dtype, B, T, err);
    if (st) return st;
    struct tensor k[m.n_local_layers], v[m.n_local_layers];
    struct kv_cache kv = {.k = k, .v = v};
    struct carver c = {0};
    kv_layout(&m, &kv, &c, rows, len);
    *bytes = c.bytes;
    return STATUS_OK;
}

static void kv_free(struct model *m) {
    if (m->kv.base && m->be) backend_dealloc(m->be, m->kv.base);
    free(m->kv.k), free(m->kv.v), free(m->kv.host_off);
    free(m->kv.host_msg[0]), free(m->kv.host_msg[1]);
    m->kv = (struct kv_cache){0};
}

enum status model_kv_cache_init(struct model *m, int rows, int len, struct error *err) {
    if (rows < 1 || rows > LLAMA_MAX_MICRO_BATCH || len < 1 || len > m->cfg.max_seq_len)
        return error_set(err, STATUS_BAD_INPUT, "model: a key/value cache of %d rows of %d "
                         "positions (rows 1 to %d, positions 1 to max_seq_len %d)", rows, len,
                         LLAMA_MAX_MICRO_BATCH, m->cfg.max_seq_len);
    if (m->kv.rows == rows && m->kv.len == len) return STATUS_OK;
    kv_free(m);
    struct kv_cache kv = {.rows = rows, .len = len};
    kv.k = xcalloc((size_t)MAX(1, m->n_local_layers), sizeof *kv.k);
    kv.v = xcalloc((size_t)MAX(1, m->n_local_layers), sizeof *kv.v);
    struct carver count = {0};
    kv_layout(m, &kv, &count, rows, len);
    void *base = backend_alloc(m->be, count.bytes);
    if (!base) {
        free(kv.k), free(kv.v);
        return error_set(err, STATUS_RUNTIME, "model: out of %s memory for a key/value cache of "
                         "%zu B (%d rows of %d positions)", m->be->ops->name, count.bytes, rows, len);
    }
    struct carver c = {base, 0};
    kv_layout(m, &kv, &c, rows, len);
    backend_memset0(m->be, tensor_view(base, DTYPE_I32, count.bytes / 4));
    kv.host_off = xcalloc((size_t)rows * len, sizeof *kv.host_off);
    kv.base = base;
    m->kv = kv;
    return STATUS_OK;
}

void model_free(struct model *m) {
    if (!m) return;
    kv_free(m);
    // the FP8 state (model_fp8_init), freed here: model_fp8.c calls this file,
    // not the other way round
    if (m->fp8.base && m->be) backend_dealloc(m->be, m->fp8.base);
    free(m->fp8.block), free(m->fp8.layer), free(m->fp8.w_fresh);
    if (m->be) {
        backend_dealloc(m->be, m->param_arena.data);
        backend_dealloc(m->be, m->grad_arena.data);
        backend_dealloc(m->be, m->act_arena.data);
    }
    for (int i = 0; m->slots && i < m->shard.n_slots; i++)
        free(m->slots[i].x), free(m->slots[i].acts), free(m->slots[i].moe_st);
    free(m->moe_layer), free(m->moe_log);
    free(m->params), free(m->blocks), free(m->dblocks), free(m->slots);
    free(m->wstash);
    free(m->block_offset), free(m->block_unit), free(m->units);
    free(m->unit_params), free(m->unit_grads);
    free(m->host_loss);
    free(m->host_doc);
    free(m->host_tok), free(m->host_tgt), free(m->host_pos);
    free(m);
}

size_t model_moe_stats_numel(const struct model *m) {
    return m->cfg.moe_experts ? 4 + (size_t)m->n_moe_model * m->cfg.moe_experts : 0;
}

int model_moe_layers(const struct model *m, const int **layers) {
    if (layers) *layers = m->moe_layer;
    return m->n_moe_model;
}

void model_moe_stats_take(struct model *m, double *out) {
    size_t n = model_moe_stats_numel(m);
    if (!n) return;
    memcpy(out, m->moe_log, n * sizeof *out);
    memset(m->moe_log, 0, n * sizeof *out);
}

const struct param_info *model_params(const struct model *m, int *n) {
    *n = m->n_params;
    return m->params;
}
struct tensor model_param_arena(struct model *m) { return m->param_arena; }
struct tensor model_grad_arena(struct model *m) { return m->grad_arena; }
struct tensor model_tied_head_grad(struct model *m) { return m->tied_dhead; }
const struct model_memory *model_memory(const struct model *m) { return &m->mem; }
struct backend *model_backend(const struct model *m) { return m->be; }
bool model_is_last_stage(const struct model *m) { return m->last; }
bool model_is_first_stage(const struct model *m) { return m->first; }

const struct param_info *model_find_param(const struct model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

// Copies n host floats (FP32 or FP64 as dtype) into backend memory dst of
// dtype dst_dtype, rounding to BF16/FP16 through the backend's copy (RNE).
static void to_device_as(struct model *m, struct tensor dst, const void *host, enum dtype host_dtype) {
    size_t n = dst.numel, bytes = n * dtype_size(host_dtype);
    if (dst.dtype == host_dtype) {
        backend_to_device(m->be, dst.data, host, bytes);
        return;
    }
    if (backend_host_memory(m->be)) { // the CPU backend rounds straight from host memory
        backend_copy(m->be, dst, tensor_view((void *)host, host_dtype, n), n);
        return;
    }
    void *tmp = backend_alloc(m->be, bytes);
    CHECK(tmp, "out of backend memory for %zu bytes of staging", bytes);
    backend_to_device(m->be, tmp, host, bytes);
    backend_copy(m->be, dst, tensor_view(tmp, host_dtype, n), n);
    backend_synchronize(m->be);
    backend_dealloc(m->be, tmp);
}

void model_set_param(struct model *m, const struct param_info *p, const float *global) {
    bool f64 = m->dtype == DTYPE_FP64;
    char *local = xcalloc(p->numel, f64 ? sizeof(double) : sizeof(float));
    for (int r = 0; r < p->valid_rows; r++)
        for (int c = 0; c < p->cols; c++) {
            float v = global[(size_t)(p->row_offset + r) * p->gcols + p->col_offset + c];
            if (f64) ((double *)local)[(size_t)r * p->cols + c] = v;
            else ((float *)local)[(size_t)r * p->cols + c] = v;
        }
    to_device_as(m, param_view(m, p, false), local, f64 ? DTYPE_FP64 : DTYPE_FP32);
    free(local);
}

void model_to_host_f64(struct model *m, struct tensor src, double *out) {
    size_t n = src.numel;
    if (src.dtype == DTYPE_FP64) {
        backend_to_host(m->be, out, src.data, n * sizeof(double));
        return;
    }
    float *f = xmalloc(n * sizeof *f);
    if (src.dtype == DTYPE_FP32) {
        backend_to_host(m->be, f, src.data, n * sizeof *f);
    } else { // BF16 / FP16: widened exactly on the backend
        void *tmp = backend_alloc(m->be, n * sizeof *f);
        CHECK(tmp, "out of backend memory for %zu bytes of staging", n * sizeof *f);
        backend_copy(m->be, tensor_view(tmp, DTYPE_FP32, n), src, n);
        backend_to_host(m->be, f, tmp, n * sizeof *f);
        backend_dealloc(m->be, tmp);
    }
    for (size_t i = 0; i < n; i++) out[i] = f[i];
    free(f);
}

void model_get_param(struct model *m, const struct param_info *p, double *local) {
    model_to_host_f64(m, param_view(m, p, false), local);
}
void model_get_grad(struct model *m, const struct param_info *p, double *local) {
    model_to_host_f64(m, param_view(m, p, true), local);
}

void model_set_grad_ready_hook(struct model *m, void (*fn)(void *ctx, size_t ready_from),
                               void *ctx) {
    m->grad_ready = fn, m->grad_ready_ctx = ctx;
}


void model_zero_grad(struct model *m) {
    if (m->grad_arena.data) backend_memset0(m->be, m->grad_arena);
    if (m->tied_dhead.numel) backend_memset0(m->be, m->tied_dhead);
}


// model.c: the LLaMA decoder of model.h, forward and backward, on any backend.
// Every buffer comes from one of three arenas (parameters, gradients,
// activations) carved by a size table that model_plan computes first.
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "init.h"

enum { IGNORE_INDEX = -100, ALIGN_ELEMS = 16 };

// Weights of one decoder block (views into the parameter or gradient arena).
struct block {
    struct tensor ln1_w;  // (C,)
    struct tensor wq;     // (Hl*D, C)
    struct tensor wk;     // (Hkvl*D, C)
    struct tensor wv;     // (Hkvl*D, C)
    struct tensor wo;     // (C, Hl*D)
    struct tensor ln2_w;  // (C,)
    struct tensor wgate;  // (Fl, C)
    struct tensor wup;    // (Fl, C)
    struct tensor wdown;  // (C, Fl)
};

// Activations of one block saved for the backward pass.
struct block_acts {
    struct tensor ln1, rstd1;     // (N, C) all-gathered, (Ns,)
    struct tensor q, k, v;        // (B, T, Hl, D), (B, T, Hkvl, D) x2, after RoPE
    struct tensor att, lse;       // (B, T, Hl, D), (B, Hl, T)
    struct tensor xmid;           // (Ns, C) residual after attention
    struct tensor ln2, rstd2;     // (N, C) all-gathered, (Ns,)
    struct tensor gate, up, act;  // (N, Fl) each
};

struct model {
    struct llama_config cfg;
    struct model_shard shard;
    struct backend *be;
    enum dtype dtype;       // weights and activations
    enum dtype stat;        // saved statistics: fp32, fp64 for an fp64 model
    int B, T, N;            // microbatch shape, N = B*T
    int Ns;                 // rows of the residual stream: N / tp with sequence parallel, else N
    bool sp;
    int C, D, Hl, Hkvl, Fl; // local widths
    int Vl, vocab_start, Vvalid;
    int n_local_layers;
    bool first, last;

    int n_params;
    struct param_info *params;
    struct model_memory mem;
    struct tensor param_arena, grad_arena, act_arena;

    struct tensor wte, dwte;       // (Vl, C) embedding, when held
    struct tensor norm_w, dnorm_w; // (C,) final norm (last stage)
    struct tensor head, dhead;     // (Vl, C) lm_head or the tied embedding
    struct block *blocks, *dblocks;

    // activations
    struct tensor *x;              // (L_local + 1) residual streams (Ns, C)
    struct block_acts *acts;
    struct tensor lnf, rstdf;      // (N, C), (Ns,)
    struct tensor logits, dlogits; // (N, Vl)
    struct tensor rowmax, partials, lse, loss; // (N,), (N, 3), (N,), (N,)
    struct tensor tokens, targets; // (N,) I32
    struct tensor rope_cos, rope_sin; // (max_seq_len, D/2)
    // backward scratch
    struct tensor tmp, dx, dln;    // (N, C), (Ns, C), (N, C)
    // Sequence parallel: (Ns, C) norm output before its all-gather, row-parallel
    // output after its reduce-scatter, input gradient after its reduce-scatter,
    // and the all-gathered residual gradient (N, C). Without it each aliases
    // its full-size twin (tmp, dln, dx) and the norm writes its saved output.
    struct tensor norm_s, tmp_s, dln_s, dx_full;
    struct tensor datt, dq, dk, dv; // (N, Hl*D), (N, Hl*D), (N, Hkvl*D) x2
    struct tensor dgate, dup, dact; // (N, Fl)
    struct tensor kv_grad;         // (Hkv*D, C) when key/value heads are replicated over TP

    struct comm_group *tp;         // tensor-parallel group; NULL: tp = 1
    int kv_head0, kv_replicas;

    void (*grad_ready)(void *ctx, size_t ready_from);
    void *grad_ready_ctx;
    size_t *block_offset;          // (L_local,) arena offset of each block's first parameter
    size_t head_offset;            // arena offset of model.norm.weight (last stage)

    double *host_loss;             // (N,)
    int32_t *host_targets;         // (N,) of the last forward
};

// ---- the size table ------------------------------------------------------------

struct carver {
    char *base;   // NULL while only counting
    size_t bytes; // running size
};

static struct tensor carve(struct carver *c, enum dtype dtype, size_t numel) {
    size_t at = c->bytes;
    c->bytes += ((numel * dtype_size(dtype) + 63) / 64) * 64;
    return tensor_view(c->base ? c->base + at : NULL, dtype, numel);
}

struct dims {
    int C, D, Hl, Hkvl, Fl, Vl, vocab_start, Vvalid, Lloc;
    int kv_head0, kv_replicas; // first local key/value head; ranks holding each copy
    bool first, last, holds_wte;
};

static enum status dims_compute(const struct llama_config *cfg, const struct model_shard *s,
                                struct dims *d, struct error *err) {
    int tp = s->tp_size;
    if (cfg->n_heads <= 0 || cfg->d_model % cfg->n_heads)
        return error_set(err, STATUS_BAD_INPUT, "model: d_model %d is not a multiple of n_heads %d",
                         cfg->d_model, cfg->n_heads);
    if (cfg->n_kv_heads <= 0 || cfg->n_heads % cfg->n_kv_heads)
        return error_set(err, STATUS_BAD_INPUT, "model: n_heads %d is not a multiple of n_kv_heads %d",
                         cfg->n_heads, cfg->n_kv_heads);
    if ((cfg->d_model / cfg->n_heads) % 2)
        return error_set(err, STATUS_BAD_INPUT, "model: head size %d must be even for RoPE",
                         cfg->d_model / cfg->n_heads);
    if (tp < 1 || s->tp_rank < 0 || s->tp_rank >= tp || cfg->n_heads % tp || cfg->ffn_dim % tp ||
        (cfg->n_kv_heads % tp && tp % cfg->n_kv_heads))
        return error_set(err, STATUS_BAD_INPUT,
                         "model: tp %d must divide n_heads %d and ffn_dim %d, and divide or be a "
                         "multiple of n_kv_heads %d", tp, cfg->n_heads, cfg->ffn_dim, cfg->n_kv_heads);
    if (s->layer_begin < 0 || s->layer_end > cfg->n_layers || s->layer_begin >= s->layer_end)
        return error_set(err, STATUS_BAD_INPUT, "model: layer range [%d, %d) outside [0, %d)",
                         s->layer_begin, s->layer_end, cfg->n_layers);
    d->C = cfg->d_model;
    d->D = cfg->d_model / cfg->n_heads;
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
    d->Lloc = s->layer_end - s->layer_begin;
    d->first = s->layer_begin == 0;
    d->last = s->layer_end == cfg->n_layers;
    d->holds_wte = d->first || (d->last && cfg->tie_embeddings);
    return STATUS_OK;
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
    for (int l = s->layer_begin; l < s->layer_end; l++) {
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%d." fmt, l), name)
        param_add(params, &n, &off, NAME("input_layernorm.weight"), C, 1, C, 1, 0, 0, C, false, true, 0);
        param_add(params, &n, &off, NAME("self_attn.q_proj.weight"), d->Hl * D, C, H * D, C,
                  tr * d->Hl * D, 0, d->Hl * D, true, false, std);
        param_add(params, &n, &off, NAME("self_attn.k_proj.weight"), d->Hkvl * D, C, Hkv * D, C,
                  d->kv_head0 * D, 0, d->Hkvl * D, true, false, std);
        param_add(params, &n, &off, NAME("self_attn.v_proj.weight"), d->Hkvl * D, C, Hkv * D, C,
                  d->kv_head0 * D, 0, d->Hkvl * D, true, false, std);
        param_add(params, &n, &off, NAME("self_attn.o_proj.weight"), C, d->Hl * D, C, H * D, 0,
                  tr * d->Hl * D, C, true, false, out_std);
        param_add(params, &n, &off, NAME("post_attention_layernorm.weight"), C, 1, C, 1, 0, 0, C,
                  false, true, 0);
        param_add(params, &n, &off, NAME("mlp.gate_proj.weight"), d->Fl, C, F, C, tr * d->Fl, 0,
                  d->Fl, true, false, std);
        param_add(params, &n, &off, NAME("mlp.up_proj.weight"), d->Fl, C, F, C, tr * d->Fl, 0,
                  d->Fl, true, false, std);
        param_add(params, &n, &off, NAME("mlp.down_proj.weight"), C, d->Fl, C, F, 0, tr * d->Fl,
                  C, true, false, out_std);
#undef NAME
    }
    if (d->last) {
        param_add(params, &n, &off, "model.norm.weight", C, 1, C, 1, 0, 0, C, false, true, 0);
        if (!cfg->tie_embeddings)
            param_add(params, &n, &off, "lm_head.weight", d->Vl, C, V, C, d->vocab_start, 0,
                      d->Vvalid, true, false, std);
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

static enum dtype grad_dtype(enum dtype d) { return d == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32; }

// Carves the activation arena (base NULL: counts only).
static void acts_layout(struct model *m, struct carver *c) {
    int N = m->N, Ns = m->Ns, C = m->C, HD = m->Hl * m->D, KD = m->Hkvl * m->D, Fl = m->Fl;
    enum dtype a = m->dtype, s = m->stat;
    for (int l = 0; l <= m->n_local_layers; l++) m->x[l] = carve(c, a, (size_t)Ns * C);
    for (int l = 0; l < m->n_local_layers; l++) {
        struct block_acts *b = &m->acts[l];
        b->ln1 = carve(c, a, (size_t)N * C);
        b->rstd1 = carve(c, s, Ns);
        b->q = carve(c, a, (size_t)N * HD);
        b->k = carve(c, a, (size_t)N * KD);
        b->v = carve(c, a, (size_t)N * KD);
        b->att = carve(c, a, (size_t)N * HD);
        b->lse = carve(c, s, (size_t)N * m->Hl);
        b->xmid = carve(c, a, (size_t)Ns * C);
        b->ln2 = carve(c, a, (size_t)N * C);
        b->rstd2 = carve(c, s, Ns);
        b->gate = carve(c, a, (size_t)N * Fl);
        b->up = carve(c, a, (size_t)N * Fl);
        b->act = carve(c, a, (size_t)N * Fl);
    }
    if (m->last) {
        m->lnf = carve(c, a, (size_t)N * C);
        m->rstdf = carve(c, s, Ns);
        m->logits = carve(c, a, (size_t)N * m->Vl);
        m->dlogits = carve(c, a, (size_t)N * m->Vl);
        m->rowmax = carve(c, s, N);
        m->partials = carve(c, s, (size_t)N * 3);
        m->lse = carve(c, s, N);
        m->loss = carve(c, s, N);
    }
    m->tokens = carve(c, DTYPE_I32, N);
    m->targets = carve(c, DTYPE_I32, N);
    m->rope_cos = carve(c, s, (size_t)m->cfg.max_seq_len * (m->D / 2));
    m->rope_sin = carve(c, s, (size_t)m->cfg.max_seq_len * (m->D / 2));
    m->tmp = carve(c, a, (size_t)N * C);
    m->dx = carve(c, a, (size_t)Ns * C);
    m->dln = carve(c, a, (size_t)N * C);
    if (m->sp) {
        m->norm_s = carve(c, a, (size_t)Ns * C);
        m->tmp_s = carve(c, a, (size_t)Ns * C);
        m->dln_s = carve(c, a, (size_t)Ns * C);
        m->dx_full = carve(c, a, (size_t)N * C);
    } else {
        m->norm_s = tensor_view(NULL, a, 0); // unused: norms write their saved output
        m->tmp_s = m->tmp, m->dln_s = m->dln, m->dx_full = m->dx;
    }
    m->datt = carve(c, a, (size_t)N * HD);
    m->dq = carve(c, a, (size_t)N * HD);
    m->dk = carve(c, a, (size_t)N * KD);
    m->dv = carve(c, a, (size_t)N * KD);
    m->dgate = carve(c, a, (size_t)N * Fl);
    m->dup = carve(c, a, (size_t)N * Fl);
    m->dact = carve(c, a, (size_t)N * Fl);
    if (m->kv_replicas > 1)
        m->kv_grad = carve(c, grad_dtype(a), (size_t)m->cfg.n_kv_heads * m->D * C);
}

// Fills the fields of m that the size table needs (no allocation).
static enum status model_setup(struct model *m, const struct llama_config *cfg,
                               const struct model_shard *shard, enum dtype dtype, int B, int T,
                               struct error *err) {
    if (dtype != DTYPE_FP32 && dtype != DTYPE_FP64)
        return error_set(err, STATUS_BAD_INPUT, "model: dtype %s is not supported yet (fp32)",
                         dtype_name(dtype));
    if (B < 1 || T < 1 || T > cfg->max_seq_len)
        return error_set(err, STATUS_BAD_INPUT,
                         "model: microbatch (B=%d, T=%d) must be positive with T <= max_seq_len %d",
                         B, T, cfg->max_seq_len);
    struct dims d;
    enum status st = dims_compute(cfg, shard, &d, err);
    if (st) return st;
    m->cfg = *cfg, m->shard = *shard, m->dtype = dtype;
    m->stat = dtype == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32;
    m->B = B, m->T = T, m->N = B * T;
    m->sp = shard->sequence_parallel && shard->tp_size > 1;
    if (m->sp && m->N % shard->tp_size)
        return error_set(err, STATUS_BAD_INPUT, "model: sequence parallel needs B*T = %d rows "
                         "divisible by tp = %d", m->N, shard->tp_size);
    m->Ns = m->sp ? m->N / shard->tp_size : m->N;
    m->C = d.C, m->D = d.D, m->Hl = d.Hl, m->Hkvl = d.Hkvl, m->Fl = d.Fl;
    m->Vl = d.Vl, m->vocab_start = d.vocab_start, m->Vvalid = d.Vvalid;
    m->n_local_layers = d.Lloc, m->first = d.first, m->last = d.last;
    m->kv_head0 = d.kv_head0, m->kv_replicas = d.kv_replicas;
    size_t total;
    m->n_params = params_layout(cfg, shard, &d, NULL, &total);
    m->mem.n_params = total;
    m->mem.param_bytes = total * dtype_size(dtype);
    m->mem.grad_bytes = total * dtype_size(grad_dtype(dtype));
    return STATUS_OK;
}

enum status model_plan(const struct llama_config *cfg, const struct model_shard *shard,
                       enum dtype dtype, int B, int T, struct model_memory *out,
                       struct error *err) {
    struct model m = {0};
    enum status st = model_setup(&m, cfg, shard, dtype, B, T, err);
    if (st) return st;
    struct tensor xs[m.n_local_layers + 1];
    struct block_acts acts[m.n_local_layers];
    m.x = xs, m.acts = acts;
    struct carver c = {0};
    acts_layout(&m, &c);
    m.mem.activation_bytes = c.bytes;
    *out = m.mem;
    return STATUS_OK;
}

struct model_shard model_shard_full(const struct llama_config *cfg) {
    struct model_shard s = {0, cfg->n_layers, 0, 1, 0, false};
    return s;
}

// Points a block's tensors at the arena holding parameters (or gradients).
static void blocks_bind(struct model *m, struct tensor arena, struct block *blocks,
                        struct tensor *wte, struct tensor *norm_w, struct tensor *head) {
    int i = 0;
    struct param_info *p = m->params;
#define NEXT() (i++, tensor_slice(arena, p[i - 1].offset, p[i - 1].numel))
    if (m->first || (m->last && m->cfg.tie_embeddings)) { *wte = NEXT(); }
    for (int l = 0; l < m->n_local_layers; l++) {
        struct block *b = &blocks[l];
        m->block_offset[l] = p[i].offset;
        b->ln1_w = NEXT(); b->wq = NEXT(); b->wk = NEXT(); b->wv = NEXT(); b->wo = NEXT();
        b->ln2_w = NEXT(); b->wgate = NEXT(); b->wup = NEXT(); b->wdown = NEXT();
    }
    if (m->last) {
        m->head_offset = p[i].offset;
        *norm_w = NEXT();
        *head = m->cfg.tie_embeddings ? *wte : NEXT();
    }
#undef NEXT
    CHECK(i == m->n_params, "bound %d of %d parameters", i, m->n_params);
}

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
    m->x = xcalloc(m->n_local_layers + 1, sizeof *m->x);
    m->acts = xcalloc(m->n_local_layers, sizeof *m->acts);
    m->block_offset = xcalloc(m->n_local_layers, sizeof *m->block_offset);

    struct carver count = {0};
    acts_layout(m, &count);
    m->mem.activation_bytes = count.bytes;
    void *pa = backend_alloc(be, m->mem.param_bytes);
    void *ga = backend_alloc(be, m->mem.grad_bytes);
    void *aa = backend_alloc(be, m->mem.activation_bytes);
    if (!pa || !ga || !aa) {
        backend_dealloc(be, pa), backend_dealloc(be, ga), backend_dealloc(be, aa);
        model_free(m);
        return error_set(err, STATUS_RUNTIME,
                         "model: out of %s memory (params %zu B, grads %zu B, activations %zu B)",
                         be->ops->name, m->mem.param_bytes, m->mem.grad_bytes,
                         m->mem.activation_bytes);
    }
    m->param_arena = tensor_view(pa, dtype, total);
    m->grad_arena = tensor_view(ga, grad_dtype(dtype), total);
    m->act_arena = tensor_view(aa, DTYPE_I32, 0);
    struct carver c = {aa, 0};
    acts_layout(m, &c);
    blocks_bind(m, m->param_arena, m->blocks, &m->wte, &m->norm_w, &m->head);
    blocks_bind(m, m->grad_arena, m->dblocks, &m->dwte, &m->dnorm_w, &m->dhead);
    backend_memset0(be, m->param_arena);
    backend_memset0(be, m->grad_arena);
    backend_memset0(be, tensor_view(aa, DTYPE_I32, m->mem.activation_bytes / 4));

    // RoPE tables, angles in double.
    size_t half = (size_t)cfg->max_seq_len * (m->D / 2);
    size_t tab_bytes = half * dtype_size(m->stat);
    char *tab = xmalloc(2 * tab_bytes);
    if (m->stat == DTYPE_FP64)
        rope_table_fill_f64((double *)tab, (double *)(tab + tab_bytes), cfg->max_seq_len, m->D,
                            cfg->rope_theta);
    else
        rope_table_fill((float *)tab, (float *)(tab + tab_bytes), cfg->max_seq_len, m->D,
                        cfg->rope_theta);
    backend_to_device(be, m->rope_cos.data, tab, tab_bytes);
    backend_to_device(be, m->rope_sin.data, tab + tab_bytes, tab_bytes);
    free(tab);

    // Weights: every element from (seed, name, global index).
    size_t max_numel = 0;
    for (int i = 0; i < m->n_params; i++) max_numel = MAX(max_numel, (size_t)m->params[i].grows * m->params[i].gcols);
    float *host = xmalloc(max_numel * sizeof *host);
    for (int i = 0; i < m->n_params; i++) {
        const struct param_info *p = &m->params[i];
        init_fill_normal(host, (size_t)p->grows * p->gcols, seed, p->name, p->init_std);
        model_set_param(m, p, host);
    }
    free(host);
    m->host_loss = xcalloc(m->N, sizeof *m->host_loss);
    m->host_targets = xcalloc(m->N, sizeof *m->host_targets);
    *out = m;
    return STATUS_OK;
}

void model_free(struct model *m) {
    if (!m) return;
    if (m->be) {
        backend_dealloc(m->be, m->param_arena.data);
        backend_dealloc(m->be, m->grad_arena.data);
        backend_dealloc(m->be, m->act_arena.data);
    }
    free(m->params), free(m->blocks), free(m->dblocks), free(m->x), free(m->acts);
    free(m->block_offset);
    free(m->host_loss), free(m->host_targets);
    free(m);
}

const struct param_info *model_params(const struct model *m, int *n) {
    *n = m->n_params;
    return m->params;
}
struct tensor model_param_arena(struct model *m) { return m->param_arena; }
struct tensor model_grad_arena(struct model *m) { return m->grad_arena; }
const struct model_memory *model_memory(const struct model *m) { return &m->mem; }
bool model_is_first_stage(const struct model *m) { return m->first; }
bool model_is_last_stage(const struct model *m) { return m->last; }

const struct param_info *model_find_param(const struct model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

void model_set_param(struct model *m, const struct param_info *p, const float *global) {
    char *local = xcalloc(p->numel, dtype_size(m->dtype));
    for (int r = 0; r < p->valid_rows; r++)
        for (int c = 0; c < p->cols; c++) {
            float v = global[(size_t)(p->row_offset + r) * p->gcols + p->col_offset + c];
            if (m->dtype == DTYPE_FP64) ((double *)local)[(size_t)r * p->cols + c] = v;
            else ((float *)local)[(size_t)r * p->cols + c] = v;
        }
    backend_to_device(m->be, tensor_slice(m->param_arena, p->offset, p->numel).data, local,
                      p->numel * dtype_size(m->dtype));
    free(local);
}

static void get_local(struct model *m, struct tensor arena, const struct param_info *p, double *out) {
    size_t es = dtype_size(arena.dtype);
    void *host = xmalloc(p->numel * es);
    backend_to_host(m->be, host, tensor_slice(arena, p->offset, p->numel).data, p->numel * es);
    for (size_t i = 0; i < p->numel; i++)
        out[i] = arena.dtype == DTYPE_FP64 ? ((double *)host)[i] : ((float *)host)[i];
    free(host);
}

void model_get_param(struct model *m, const struct param_info *p, double *local) {
    get_local(m, m->param_arena, p, local);
}
void model_get_grad(struct model *m, const struct param_info *p, double *local) {
    get_local(m, m->grad_arena, p, local);
}

void model_set_grad_ready_hook(struct model *m, void (*fn)(void *ctx, size_t ready_from),
                               void *ctx) {
    m->grad_ready = fn, m->grad_ready_ctx = ctx;
}

static void grads_ready(struct model *m, size_t from) {
    if (m->grad_ready) m->grad_ready(m->grad_ready_ctx, from);
}

void model_zero_grad(struct model *m) { backend_memset0(m->be, m->grad_arena); }

// ---- forward ---------------------------------------------------------------------

void model_set_tp_group(struct model *m, struct comm_group *tp) {
    CHECK(!tp || tp->size == m->shard.tp_size, "TP group of %d ranks for a shard of tp %d",
          tp ? tp->size : 0, m->shard.tp_size);
    m->tp = tp;
}

// Sums (or maxes) a tensor-parallel partial result over the TP group, in place.
static void tp_all_reduce(struct model *m, struct tensor t, enum comm_op op) {
    if (m->shard.tp_size == 1) return;
    CHECK(m->tp, "tp = %d but no TP group was set (model_set_tp_group)", m->shard.tp_size);
    backend_synchronize(m->be);
    comm_all_reduce(m->tp, t.data, t.numel, t.dtype, op);
}
static void tp_all_reduce_sum(struct model *m, struct tensor t) { tp_all_reduce(m, t, COMM_SUM); }
static void tp_all_reduce_max(struct model *m, struct tensor t) { tp_all_reduce(m, t, COMM_MAX); }

// full (N, C) = the all-gather over TP of part (Ns, C), under sequence
// parallelism (Megatron's g); without it part already is full.
static void sp_gather(struct model *m, struct tensor full, struct tensor part) {
    if (!m->sp) return;
    backend_synchronize(m->be);
    comm_all_gather(m->tp, part.data, full.data, (size_t)m->Ns * m->C, full.dtype);
}

// Completes a TP-partial (N, C) result: under sequence parallelism the
// reduce-scatter of full into part (Ns, C) (Megatron's g-bar); without it the
// all-reduce of full in place (part aliases full).
static void sp_reduce(struct model *m, struct tensor part, struct tensor full) {
    if (!m->sp) {
        tp_all_reduce_sum(m, full);
        return;
    }
    backend_synchronize(m->be);
    comm_reduce_scatter(m->tp, full.data, part.data, (size_t)m->Ns * m->C, full.dtype, COMM_SUM);
}

// Where a norm writes: the (Ns, C) scratch before its all-gather into saved,
// or saved itself without sequence parallelism.
static struct tensor norm_out(struct model *m, struct tensor saved) {
    return m->sp ? m->norm_s : saved;
}

void model_finish_grads(struct model *m) {
    if (m->sp) // each rank's norm-gain gradient covers only its rows
        for (int i = 0; i < m->n_params; i++)
            if (m->params[i].tp_replicated)
                tp_all_reduce_sum(m, tensor_slice(m->grad_arena, m->params[i].offset, m->params[i].numel));
    if (m->kv_replicas == 1) return;
    size_t block = (size_t)m->D * m->C; // one key/value head's rows
    for (int l = 0; l < m->n_local_layers; l++) {
        struct tensor g[2] = {m->dblocks[l].wk, m->dblocks[l].wv};
        for (int i = 0; i < 2; i++) {
            backend_memset0(m->be, m->kv_grad);
            struct tensor mine = tensor_slice(m->kv_grad, (size_t)m->kv_head0 * block, block);
            backend_copy(m->be, mine, g[i], block);
            tp_all_reduce_sum(m, m->kv_grad);
            backend_copy(m->be, g[i], mine, block);
        }
    }
}

// y (N, out) = x (N, in) @ W^T, W (out, in) in PyTorch's Linear layout.
static void linear(struct model *m, struct tensor y, struct tensor x, struct tensor w, int out,
                   int in) {
    backend_matmul(m->be, y, x, w, m->N, out, in, false, true, 1.0f, 0.0f);
}

static void block_forward(struct model *m, int l) {
    struct backend *be = m->be;
    struct block *w = &m->blocks[l];
    struct block_acts *a = &m->acts[l];
    int Ns = m->Ns, C = m->C, HD = m->Hl * m->D, KD = m->Hkvl * m->D;
    float eps = m->cfg.norm_eps;
    struct tensor n1 = norm_out(m, a->ln1), n2 = norm_out(m, a->ln2);
    backend_rmsnorm_forward(be, n1, a->rstd1, m->x[l], w->ln1_w, Ns, C, eps);
    sp_gather(m, a->ln1, n1);
    linear(m, a->q, a->ln1, w->wq, HD, C);
    linear(m, a->k, a->ln1, w->wk, KD, C);
    linear(m, a->v, a->ln1, w->wv, KD, C);
    backend_rope_forward(be, a->q, m->rope_cos, m->rope_sin, m->B, m->T, m->Hl, m->D, 0);
    backend_rope_forward(be, a->k, m->rope_cos, m->rope_sin, m->B, m->T, m->Hkvl, m->D, 0);
    backend_attention_forward(be, a->att, a->lse, a->q, a->k, a->v, m->B, m->T, m->Hl, m->Hkvl, m->D);
    linear(m, m->tmp, a->att, w->wo, C, HD);
    sp_reduce(m, m->tmp_s, m->tmp);
    backend_add(be, a->xmid, m->x[l], m->tmp_s, (size_t)Ns * C);
    backend_rmsnorm_forward(be, n2, a->rstd2, a->xmid, w->ln2_w, Ns, C, eps);
    sp_gather(m, a->ln2, n2);
    linear(m, a->gate, a->ln2, w->wgate, m->Fl, C);
    linear(m, a->up, a->ln2, w->wup, m->Fl, C);
    backend_swiglu_forward(be, a->act, a->gate, a->up, (size_t)m->N * m->Fl);
    linear(m, m->tmp, a->act, w->wdown, C, m->Fl);
    sp_reduce(m, m->tmp_s, m->tmp);
    backend_add(be, m->x[l + 1], a->xmid, m->tmp_s, (size_t)Ns * C);
}

// Loss of each row from the logits, composed across the vocab shards.
static void head_forward(struct model *m) {
    struct backend *be = m->be;
    int N = m->N, C = m->C, L = m->n_local_layers;
    struct tensor nf = norm_out(m, m->lnf);
    backend_rmsnorm_forward(be, nf, m->rstdf, m->x[L], m->norm_w, m->Ns, C, m->cfg.norm_eps);
    sp_gather(m, m->lnf, nf);
    linear(m, m->logits, m->lnf, m->head, m->Vl, C);
    backend_ce_row_max(be, m->rowmax, m->logits, N, m->Vl, m->Vvalid);
    tp_all_reduce_max(m, m->rowmax);
    backend_ce_partials(be, m->partials, m->logits, m->rowmax, m->targets, N, m->Vl, m->Vvalid,
                        m->vocab_start);
    tp_all_reduce_sum(m, m->partials);
    backend_ce_loss(be, m->loss, m->lse, m->partials, m->rowmax, m->targets, N,
                    m->cfg.vocab_size, m->cfg.label_smoothing, IGNORE_INDEX);
}

void model_forward(struct model *m, const int32_t *tokens, const int32_t *targets,
                   double *loss_sum, long *n_targets) {
    struct backend *be = m->be;
    *loss_sum = 0, *n_targets = 0;
    if (m->first) {
        backend_to_device(be, m->tokens.data, tokens, (size_t)m->N * sizeof(int32_t));
        // Each vocab shard looks up its own ids (zero rows elsewhere); the
        // sum over TP completes the lookup (reduce-scattered under SP).
        struct tensor e = m->sp ? m->tmp : m->x[0];
        backend_embedding_forward(be, e, m->wte, m->tokens, m->N, m->C, m->vocab_start, m->Vl);
        sp_reduce(m, m->x[0], e);
    }
    for (int l = 0; l < m->n_local_layers; l++) block_forward(m, l);
    if (!m->last) return;
    memcpy(m->host_targets, targets, (size_t)m->N * sizeof(int32_t));
    backend_to_device(be, m->targets.data, targets, (size_t)m->N * sizeof(int32_t));
    head_forward(m);
    if (m->stat == DTYPE_FP64) {
        backend_to_host(be, m->host_loss, m->loss.data, (size_t)m->N * sizeof(double));
    } else {
        float *f = (float *)m->host_loss; // fp32 values unpacked in place, back to front
        backend_to_host(be, f, m->loss.data, (size_t)m->N * sizeof(float));
        for (int i = m->N - 1; i >= 0; i--) m->host_loss[i] = f[i];
    }
    double sum = 0;
    long count = 0;
    for (int i = 0; i < m->N; i++) {
        if (targets[i] == IGNORE_INDEX) continue;
        sum += m->host_loss[i];
        count++;
    }
    *loss_sum = sum, *n_targets = count;
}

void model_microbatch_shape(const struct model *m, int *B, int *T, int *V) {
    *B = m->B, *T = m->T, *V = m->cfg.vocab_size;
}

void model_get_logits_at(struct model *m, int b, int t, double *out) {
    CHECK(m->last && b >= 0 && b < m->B && t >= 0 && t < m->T, "logits of (%d, %d)", b, t);
    int tp = m->shard.tp_size;
    size_t es = dtype_size(m->dtype), row = (size_t)(b * m->T + t) * m->Vl;
    char *all = xmalloc((size_t)tp * m->Vl * es);
    char *mine = all + (size_t)m->shard.tp_rank * m->Vl * es;
    backend_to_host(m->be, mine, (char *)m->logits.data + row * es, m->Vl * es);
    if (tp > 1) comm_all_gather(m->tp, mine, all, m->Vl, m->dtype);
    for (int j = 0; j < m->cfg.vocab_size; j++) // shard r holds [r*Vl, (r+1)*Vl), padding last
        out[j] = m->dtype == DTYPE_FP64 ? ((double *)all)[j] : ((float *)all)[j];
    free(all);
}

void model_get_logits(struct model *m, double *out) {
    CHECK(m->last, "logits live on the last pipeline stage");
    size_t n = (size_t)m->N * m->Vl, es = dtype_size(m->dtype);
    void *host = xmalloc(n * es);
    backend_to_host(m->be, host, m->logits.data, n * es);
    for (size_t i = 0; i < n; i++)
        out[i] = m->dtype == DTYPE_FP64 ? ((double *)host)[i] : ((float *)host)[i];
    free(host);
}

// ---- backward --------------------------------------------------------------------

// dx (N, in) = dy (N, out) @ W (out, in); dW (out, in) += dy^T @ x (N, in).
static void linear_backward(struct model *m, struct tensor dx, float beta_dx, struct tensor dw,
                            struct tensor dy, struct tensor x, struct tensor w, int out, int in) {
    backend_matmul(m->be, dx, dy, w, m->N, in, out, false, false, 1.0f, beta_dx);
    backend_matmul(m->be, dw, dy, x, out, in, m->N, true, false, 1.0f, 1.0f);
}

// On entry m->dx (Ns, C) holds d x[l+1]; on exit d x[l].
static void block_backward(struct model *m, int l) {
    struct backend *be = m->be;
    struct block *w = &m->blocks[l], *dw = &m->dblocks[l];
    struct block_acts *a = &m->acts[l];
    int N = m->N, Ns = m->Ns, C = m->C, HD = m->Hl * m->D, KD = m->Hkvl * m->D, Fl = m->Fl;
    // x[l+1] = xmid + down(act): d xmid += dx through the residual.
    sp_gather(m, m->dx_full, m->dx);
    backend_matmul(be, m->dact, m->dx_full, w->wdown, N, Fl, C, false, false, 1.0f, 0.0f);
    backend_matmul(be, dw->wdown, m->dx_full, a->act, C, Fl, N, true, false, 1.0f, 1.0f);
    backend_swiglu_backward(be, m->dgate, m->dup, m->dact, a->gate, a->up, (size_t)N * Fl);
    linear_backward(m, m->dln, 0.0f, dw->wgate, m->dgate, a->ln2, w->wgate, Fl, C);
    linear_backward(m, m->dln, 1.0f, dw->wup, m->dup, a->ln2, w->wup, Fl, C);
    sp_reduce(m, m->dln_s, m->dln);
    backend_rmsnorm_backward(be, m->dx, dw->ln2_w, m->dln_s, a->xmid, w->ln2_w, a->rstd2, Ns, C);
    // xmid = x[l] + o(att)
    sp_gather(m, m->dx_full, m->dx);
    backend_matmul(be, m->datt, m->dx_full, w->wo, N, HD, C, false, false, 1.0f, 0.0f);
    backend_matmul(be, dw->wo, m->dx_full, a->att, C, HD, N, true, false, 1.0f, 1.0f);
    backend_attention_backward(be, m->dq, m->dk, m->dv, m->datt, a->q, a->k, a->v, a->att, a->lse,
                               m->B, m->T, m->Hl, m->Hkvl, m->D);
    backend_rope_backward(be, m->dq, m->rope_cos, m->rope_sin, m->B, m->T, m->Hl, m->D, 0);
    backend_rope_backward(be, m->dk, m->rope_cos, m->rope_sin, m->B, m->T, m->Hkvl, m->D, 0);
    linear_backward(m, m->dln, 0.0f, dw->wq, m->dq, a->ln1, w->wq, HD, C);
    linear_backward(m, m->dln, 1.0f, dw->wk, m->dk, a->ln1, w->wk, KD, C);
    linear_backward(m, m->dln, 1.0f, dw->wv, m->dv, a->ln1, w->wv, KD, C);
    sp_reduce(m, m->dln_s, m->dln);
    backend_rmsnorm_backward(be, m->dx, dw->ln1_w, m->dln_s, m->x[l], w->ln1_w, a->rstd1, Ns, C);
}

void model_backward(struct model *m, double loss_scale) {
    struct backend *be = m->be;
    int N = m->N, C = m->C, L = m->n_local_layers;
    if (m->last) {
        backend_ce_backward(be, m->dlogits, m->logits, m->lse, m->targets, N, m->Vl, m->Vvalid,
                            m->vocab_start, m->cfg.vocab_size, m->cfg.label_smoothing,
                            IGNORE_INDEX, loss_scale);
        linear_backward(m, m->dln, 0.0f, m->dhead, m->dlogits, m->lnf, m->head, m->Vl, C);
        sp_reduce(m, m->dln_s, m->dln);
        backend_memset0(be, m->dx);
        backend_rmsnorm_backward(be, m->dx, m->dnorm_w, m->dln_s, m->x[L], m->norm_w, m->rstdf,
                                 m->Ns, C);
        // A tied embedding sits at offset 0, so it is not final before the end.
        grads_ready(m, m->head_offset);
    }
    for (int l = L - 1; l >= 0; l--) {
        block_backward(m, l);
        grads_ready(m, m->block_offset[l]);
    }
    if (m->first) {
        sp_gather(m, m->dx_full, m->dx);
        backend_embedding_backward(be, m->dwte, m->dx_full, m->tokens, N, C, m->vocab_start, m->Vl);
    }
    grads_ready(m, 0);
}

// model_fp8.c: the FP8 linear layers of the decoder's blocks (model.h "FP8
// linear layers"; docs/design.md §5 "FP8"): per-tensor scaling state, the
// casts and the FP8 GEMMs of each site, forward and backward, written once
// against kernels/ops.h ("FP8"). Transformer Engine's recipe
// (transformer_engine/pytorch/fp8.py, DelayedScaling and current scaling;
// Micikevicius et al. 2022): E4M3 activations and weights, E5M2 (hybrid) or
// E4M3 output gradients, FP32 accumulation, outputs in the model dtype.
#include <math.h>
#include <string.h>

#include "model.h"
#include "model_internal.h"

// The three tensors of a site.
enum fp8_kind { FP8_X, FP8_W, FP8_DY };

// ---- sizes ---------------------------------------------------------------------

// What an FP8 model holds beyond the model: the FP8 blocks, their weight
// elements per block, the scratch buffers and the scaling tensors.
struct fp8_dims {
    int n_blocks;
    size_t w_off[FP8_SITES + 1]; // a block's weight copy: q/k/v, o, gate/up, down
    size_t x_numel, dy_numel;    // scratch
    int n;                       // scaling tensors
};

static bool skipped_layer(const struct model_fp8_config *c, int L, int layer) {
    return layer < c->skip_first || layer >= L - c->skip_last;
}

static void fp8_dims_of(const struct model *m, const struct model_fp8_config *c, struct fp8_dims *d) {
    memset(d, 0, sizeof *d);
    for (int ch = 0; ch < m->shard.n_chunks; ch++)
        for (int l = m->shard.layer_begin[ch]; l < m->shard.layer_end[ch]; l++)
            d->n_blocks += !skipped_layer(c, m->cfg.n_layers, l);
    size_t N = (size_t)m->N, C = m->C, HD = (size_t)m->Hl * m->D, KD = (size_t)m->Hkvl * m->D,
           Fl = m->Fl;
    size_t w[FP8_SITES] = {(HD + 2 * KD) * C, C * HD, 2 * Fl * C, C * Fl};
    for (int s = 0; s < FP8_SITES; s++) d->w_off[s + 1] = d->w_off[s] + w[s];
    d->x_numel = MAX(N * C, MAX(N * HD, N * Fl));
    d->dy_numel = MAX(N * (HD + 2 * KD), MAX(N * C, 2 * N * Fl));
    d->n = d->n_blocks * MODEL_FP8_TENSORS;
}

// Carves the FP8 state in a 256-byte aligned layout (base NULL: counts).
struct fp8_carver {
    char *base;
    size_t bytes;
};

static struct tensor fp8_carve(struct fp8_carver *c, enum dtype dtype, size_t numel) {
    size_t at = c->bytes;
    c->bytes += (numel * dtype_size(dtype) + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN;
    return tensor_view(c->base ? c->base + at : NULL, dtype, numel);
}

// Carves the FP8 state; mem (may be NULL): the bytes of each part.
static void fp8_layout(struct model_fp8 *f, const struct fp8_dims *d, struct fp8_carver *c,
                       struct model_fp8_memory *mem) {
    size_t len = f->cfg.delayed ? (size_t)f->cfg.history_len : 0, at = c->bytes;
    f->w8 = fp8_carve(c, DTYPE_FP8_E4M3, (size_t)d->n_blocks * d->w_off[FP8_SITES]);
    if (mem) mem->weights = c->bytes - at, at = c->bytes;
    f->x8 = fp8_carve(c, DTYPE_FP8_E4M3, d->x_numel);
    f->dy8 = fp8_carve(c, f->cfg.grad, d->dy_numel);
    if (mem) mem->scratch = c->bytes - at, at = c->bytes;
    f->scale = fp8_carve(c, DTYPE_FP32, (size_t)d->n);
    f->scale_inv = fp8_carve(c, DTYPE_FP32, (size_t)d->n);
    f->amax = fp8_carve(c, DTYPE_FP32, (size_t)d->n);
    f->history = fp8_carve(c, DTYPE_FP32, (size_t)d->n * len);
    f->saturated = fp8_carve(c, DTYPE_I64, 1);
    if (mem) mem->state = c->bytes - at;
}

static enum status fp8_config_check(const struct model_fp8_config *c, enum dtype dtype,
                                    struct error *err) {
    if (dtype != DTYPE_BF16)
        return error_set(err, STATUS_BAD_INPUT, "model: FP8 linear layers need a bf16 model, not %s",
                         dtype_name(dtype));
    if (c->grad != DTYPE_FP8_E4M3 && c->grad != DTYPE_FP8_E5M2)
        return error_set(err, STATUS_BAD_INPUT, "model: FP8 output gradients in %s, expected fp8_e4m3 "
                         "or fp8_e5m2", dtype_name(c->grad));
    if ((c->delayed && c->history_len < 1) || c->margin < 0 || c->margin > 32 || c->skip_first < 0 ||
        c->skip_last < 0)
        return error_set(err, STATUS_BAD_INPUT, "model: FP8 history_len %d (>= 1 when delayed), margin "
                         "%d (0..32), skipped blocks %d + %d (>= 0)", c->history_len, c->margin,
                         c->skip_first, c->skip_last);
    return STATUS_OK;
}

enum status model_fp8_plan_bytes(const struct llama_config *cfg, const struct model_shard *shard,
                                 const struct model_fp8_config *c, int B, int T,
                                 struct model_fp8_memory *out, struct error *err) {
    *out = (struct model_fp8_memory){0};
    if (!c->on) return STATUS_OK;
    struct model m = {0};
    m.cfg = *cfg, m.shard = *shard;
    struct model_memory mem;
    enum status st = model_plan(cfg, shard, DTYPE_BF16, B, T, &mem, err);
    if (st) return st;
    // the local widths, as model_setup computes them
    int tp = shard->tp_size, cp = MAX(1, shard->cp_size);
    m.D = llama_head_dim(cfg), m.C = cfg->d_model, m.Hl = cfg->n_heads / tp;
    m.Hkvl = cfg->n_kv_heads % tp == 0 ? cfg->n_kv_heads / tp : 1;
    m.Fl = cfg->ffn_dim / tp, m.N = B * (T / cp);
    struct fp8_dims d;
    fp8_dims_of(&m, c, &d);
    struct model_fp8 f = {.cfg = *c};
    struct fp8_carver count = {0};
    fp8_layout(&f, &d, &count, out);
    return fp8_config_check(c, DTYPE_BF16, err);
}

enum status model_fp8_init(struct model *m, const struct model_fp8_config *c, struct error *err) {
    struct model_fp8 *f = &m->fp8;
    CHECK(!f->cfg.on, "model_fp8_init called twice");
    if (!c->on) return STATUS_OK;
    enum status st = fp8_config_check(c, m->dtype, err);
    if (st) return st;
    struct fp8_dims d;
    fp8_dims_of(m, c, &d);
    *f = (struct model_fp8){.cfg = *c, .n_blocks = d.n_blocks, .n_fwd = 8 * d.n_blocks, .n = d.n};
    memcpy(f->w_off, d.w_off, sizeof f->w_off);
    struct fp8_carver count = {0};
    fp8_layout(f, &d, &count, NULL);
    f->base = backend_alloc(m->be, count.bytes);
    if (!f->base) {
        f->cfg.on = false;
        return error_set(err, STATUS_RUNTIME, "model: out of %s memory for the FP8 state (%zu B)",
                         m->be->ops->name, count.bytes);
    }
    struct fp8_carver c2 = {f->base, 0};
    fp8_layout(f, &d, &c2, NULL);
    backend_memset0(m->be, tensor_view(f->base, DTYPE_I32, count.bytes / 4));
    f->block = xcalloc((size_t)MAX(1, m->n_local_layers), sizeof *f->block);
    f->layer = xcalloc((size_t)MAX(1, d.n_blocks), sizeof *f->layer);
    f->w_fresh = xcalloc((size_t)MAX(1, d.n_blocks), sizeof *f->w_fresh);
    for (int ch = 0, b = 0, k = 0; ch < m->shard.n_chunks; ch++)
        for (int l = m->shard.layer_begin[ch]; l < m->shard.layer_end[ch]; l++, b++) {
            f->block[b] = skipped_layer(c, m->cfg.n_layers, l) ? -1 : k;
            if (f->block[b] >= 0) f->layer[k++] = l;
        }
    // The backend's working memory for matmul_fp8 (backend_bounds.fp8_gemm:
    // the CUDA backend's K-major copies of operands, docs/cuda.md "FP8"):
    // a call's two operands are two of x8, dy8 and a weight slice.
    size_t w_max = 0;
    for (int s = 0; s < FP8_SITES; s++) w_max = MAX(w_max, d.w_off[s + 1] - d.w_off[s]);
    struct backend_bounds bounds = {m->N, m->C, m->B, m->T, m->Hl, m->Hkvl, m->D, m->dtype,
                                    d.x_numel + d.dy_numel + w_max};
    if ((st = backend_reserve(m->be, &bounds, err))) return st; // the state is model_free's
    // Scales start at 1 (Transformer Engine's initial scale), scale_inv too.
    float *one = xmalloc((size_t)MAX(1, f->n) * sizeof *one);
    for (int i = 0; i < f->n; i++) one[i] = 1.0f;
    backend_to_device(m->be, f->scale.data, one, (size_t)f->n * sizeof *one);
    backend_to_device(m->be, f->scale_inv.data, one, (size_t)f->n * sizeof *one);
    free(one);
    return STATUS_OK;
}

bool model_fp8_on(const struct model *m) { return m->fp8.cfg.on; }

// ---- scaling --------------------------------------------------------------------

// Index of tensor `kind` of site s of FP8 block fb in the scaling arrays.
static int tensor_index(const struct model_fp8 *f, int fb, int s, enum fp8_kind kind) {
    return kind == FP8_DY ? f->n_fwd + fb * FP8_SITES + s : (fb * FP8_SITES + s) * 2 + (int)kind;
}

static struct tensor at(struct tensor t, int i) { return tensor_slice(t, (size_t)i, 1); }

static struct tensor none_of(enum dtype dt) { return tensor_view(NULL, dt, 0); }

// Whether the tensors of a kind at a site are split over the TP group (each
// rank holds a part: their amax is all-reduced) or replicated on every TP
// rank (the norm outputs and the residual gradient, gathered under sequence
// parallelism: the same bits, the same amax).
static bool tp_split(const struct model *m, int s, enum fp8_kind kind) {
    if (m->shard.tp_size == 1) return false;
    switch (kind) {
    case FP8_W: return true;
    case FP8_X: return s == FP8_SITE_O || s == FP8_SITE_DOWN;       // att, act
    case FP8_DY: return s == FP8_SITE_QKV || s == FP8_SITE_GATE_UP; // dq/dk/dv, dgate/dup
    }
    return true;
}

static bool dp_first(const struct model *m) { return !m->groups.dp || m->groups.dp->rank == 0; }

// t (amaxes, FP32) = their max over group g, in place; a no-op for one rank.
// (Here rather than model_pass.c's model_tp_all_reduce: model_pass.c calls
// this file, and the layering check wants no call cycle between objects.)
static void all_max(struct model *m, struct comm_group *g, struct tensor t) {
    if (!g || g->size <= 1) return;
    comm_order_after_compute(g, m->be);
    comm_all_reduce(g, t.data, t.numel, DTYPE_FP32, COMM_MAX);
}

// How a cast counts: a forward's first cast of x, the step's cast of a
// weight, an output gradient's (counted), or a repeat (the backward's cast
// of x, a recomputation: not counted, its amax already recorded).
enum fp8_cast_use { CAST_FIRST, CAST_REPEAT };

// out8 = the FP8 cast of the n parts of one tensor (laid out one after the
// other in out8) with the tensor's scale; its amax: current scaling measures
// it first (all-reduced over TP when split) and sets the scale; delayed
// scaling records it in the step (training only).
static void cast_parts(struct model *m, int fb, int s, enum fp8_kind kind, struct tensor out8,
                       const struct tensor *parts, int n, enum fp8_cast_use use) {
    struct model_fp8 *f = &m->fp8;
    struct backend *be = m->be;
    int i = tensor_index(f, fb, s, kind);
    enum dtype fmt = kind == FP8_DY ? f->cfg.grad : DTYPE_FP8_E4M3;
    bool split = tp_split(m, s, kind);
    struct tensor scale = at(f->scale, i), amax = at(f->amax, i), rec = none_of(DTYPE_FP32);
    if (!f->cfg.delayed) {
        for (int k = 0; k < n; k++) backend_fp8_amax(be, amax, parts[k], parts[k].numel);
        if (split) all_max(m, m->groups.tp, amax);
        backend_fp8_update_scale(be, scale, at(f->scale_inv, i), none_of(DTYPE_FP32), amax, 1, 0,
                                 fp8_max_finite(fmt), f->cfg.margin, false);
    } else if (f->training) {
        rec = amax;
    }
    // Each distinct value counted once over the TP and gradient groups.
    bool count = f->training && use == CAST_FIRST && !f->recomputing &&
                 (split || m->shard.tp_rank == 0) && (kind != FP8_W || dp_first(m));
    struct tensor sat = count ? f->saturated : none_of(DTYPE_I64);
    size_t off = 0;
    for (int k = 0; k < n; k++) {
        backend_fp8_cast(be, tensor_slice(out8, off, parts[k].numel), rec, sat, parts[k], scale,
                         parts[k].numel);
        off += parts[k].numel;
    }
}

static void cast_one(struct model *m, int fb, int s, enum fp8_kind kind, struct tensor out8,
                     struct tensor x, enum fp8_cast_use use) {
    cast_parts(m, fb, s, kind, out8, &x, 1, use);
}

static struct tensor sinv(const struct model *m, int fb, int s, enum fp8_kind kind) {
    return at(m->fp8.scale_inv, tensor_index(&m->fp8, fb, s, kind));
}

// The weight copy of site s of FP8 block fb, (rows, cols) as the weight.
static struct tensor w8_of(const struct model *m, int fb, int s) {
    const struct model_fp8 *f = &m->fp8;
    size_t per = f->w_off[FP8_SITES];
    return tensor_slice(f->w8, (size_t)fb * per + f->w_off[s], f->w_off[s + 1] - f->w_off[s]);
}

void model_fp8_weights(struct model *m, int blk, const struct block *w) {
    struct model_fp8 *f = &m->fp8;
    int fb = f->block[blk];
    if (f->w_fresh[fb]) return;
    const struct tensor qkv[3] = {w->wq, w->wk, w->wv}, gu[2] = {w->wgate, w->wup};
    cast_parts(m, fb, FP8_SITE_QKV, FP8_W, w8_of(m, fb, FP8_SITE_QKV), qkv, 3, CAST_FIRST);
    cast_one(m, fb, FP8_SITE_O, FP8_W, w8_of(m, fb, FP8_SITE_O), w->wo, CAST_FIRST);
    cast_parts(m, fb, FP8_SITE_GATE_UP, FP8_W, w8_of(m, fb, FP8_SITE_GATE_UP), gu, 2, CAST_FIRST);
    cast_one(m, fb, FP8_SITE_DOWN, FP8_W, w8_of(m, fb, FP8_SITE_DOWN), w->wdown, CAST_FIRST);
    f->w_fresh[fb] = true;
}

void model_fp8_step_begin(struct model *m) {
    struct model_fp8 *f = &m->fp8;
    if (!f->cfg.on) return;
    for (int b = 0; b < f->n_blocks; b++) f->w_fresh[b] = false;
    f->training = true;
}

// Scales of tensors [first, first + count) of format fmt from their amaxes
// and histories (fp8_update_scale).
static void update_scales(struct model *m, int first, int count, enum dtype fmt) {
    struct model_fp8 *f = &m->fp8;
    size_t o = (size_t)first, n = (size_t)count, len = (size_t)f->cfg.history_len;
    backend_fp8_update_scale(m->be, tensor_slice(f->scale, o, n), tensor_slice(f->scale_inv, o, n),
                             tensor_slice(f->history, o * len, n * len), tensor_slice(f->amax, o, n),
                             count, f->cfg.history_len, fp8_max_finite(fmt), f->cfg.margin,
                             f->cfg.most_recent);
}

// Under delayed scaling: the step's amaxes, all-reduced (max) over TP and
// the gradient group, into the histories and the next scales; per format
// (the forward's E4M3 tensors first, then the output gradients').
static void delayed_update(struct model *m) {
    struct model_fp8 *f = &m->fp8;
    all_max(m, m->groups.tp, f->amax);
    all_max(m, m->groups.dp, f->amax);
    update_scales(m, 0, f->n_fwd, DTYPE_FP8_E4M3);
    update_scales(m, f->n_fwd, f->n - f->n_fwd, f->cfg.grad);
}

int64_t model_fp8_step_end(struct model *m, bool skipped) {
    struct model_fp8 *f = &m->fp8;
    if (!f->cfg.on) return 0;
    if (f->cfg.delayed && f->n > 0) {
        if (skipped) backend_memset0(m->be, f->amax); // not pushed: the step left no trace
        else delayed_update(m);
    }
    int64_t sat = 0;
    backend_to_host(m->be, &sat, f->saturated.data, sizeof sat);
    backend_memset0(m->be, f->saturated);
    for (int b = 0; b < f->n_blocks; b++) f->w_fresh[b] = false; // the optimizer changes them
    f->training = false;
    return sat;
}

// ---- checkpointed state ---------------------------------------------------------

int model_fp8_blocks(const struct model *m) { return m->fp8.cfg.on ? m->fp8.n_blocks : 0; }

int model_fp8_block_layer(const struct model *m, int i) {
    CHECK(i >= 0 && i < model_fp8_blocks(m), "FP8 block %d of %d", i, model_fp8_blocks(m));
    return m->fp8.layer[i];
}

int model_fp8_state_cols(const struct model *m) {
    return 2 + (m->fp8.cfg.delayed ? m->fp8.cfg.history_len : 0);
}

// Row r of a block's state tensor (site-major: x, w, dy of each site) is
// scaling tensor row_index(r).
static int row_index(const struct model_fp8 *f, int fb, int r) {
    return tensor_index(f, fb, r / 3, (enum fp8_kind)(r % 3));
}

void model_fp8_state_get(struct model *m, int i, float *host) {
    struct model_fp8 *f = &m->fp8;
    CHECK(i >= 0 && i < model_fp8_blocks(m), "FP8 block %d of %d", i, model_fp8_blocks(m));
    int cols = model_fp8_state_cols(m), len = cols - 2;
    for (int r = 0; r < MODEL_FP8_TENSORS; r++) {
        int k = row_index(f, i, r);
        float *row = host + (size_t)r * cols;
        backend_to_host(m->be, &row[0], at(f->scale, k).data, sizeof(float));
        backend_to_host(m->be, &row[1], at(f->amax, k).data, sizeof(float));
        if (len)
            backend_to_host(m->be, &row[2], tensor_slice(f->history, (size_t)k * len, (size_t)len).data,
                            (size_t)len * sizeof(float));
    }
}

enum status model_fp8_state_set(struct model *m, int i, const float *host, int cols, struct error *err) {
    struct model_fp8 *f = &m->fp8;
    CHECK(i >= 0 && i < model_fp8_blocks(m) && cols >= 2, "FP8 block %d of %d, %d columns", i,
          model_fp8_blocks(m), cols);
    int len = model_fp8_state_cols(m) - 2, keep = MIN(len, cols - 2);
    float *hist = xcalloc((size_t)MAX(1, len), sizeof *hist);
    for (int r = 0; r < MODEL_FP8_TENSORS; r++) {
        const float *row = host + (size_t)r * cols;
        if (!(isfinite(row[0]) && row[0] > 0) || !(isfinite(row[1]) && row[1] >= 0)) {
            free(hist);
            return error_set(err, STATUS_BAD_INPUT, "FP8 scaling state of layer %d, tensor %d: scale %g, "
                             "amax %g (expected a finite scale > 0 and amax >= 0)", f->layer[i], r,
                             (double)row[0], (double)row[1]);
        }
    }
    for (int r = 0; r < MODEL_FP8_TENSORS; r++) {
        const float *row = host + (size_t)r * cols;
        int k = row_index(f, i, r);
        float inv = 1.0f / row[0]; // as fp8_update_scale computes it
        backend_to_device(m->be, at(f->scale, k).data, &row[0], sizeof(float));
        backend_to_device(m->be, at(f->scale_inv, k).data, &inv, sizeof(float));
        backend_to_device(m->be, at(f->amax, k).data, &row[1], sizeof(float));
        if (!len) continue;
        memset(hist, 0, (size_t)len * sizeof *hist);
        memcpy(hist, row + 2, (size_t)keep * sizeof *hist);
        backend_to_device(m->be, tensor_slice(f->history, (size_t)k * len, (size_t)len).data, hist,
                          (size_t)len * sizeof *hist);
    }
    free(hist);
    return STATUS_OK;
}

// ---- the sites ------------------------------------------------------------------

static int fblock(const struct model *m, int blk) {
    int fb = m->fp8.block[blk];
    CHECK(fb >= 0 && m->fp8.w_fresh[fb], "FP8 GEMM of block %d without its weight cast", blk);
    return fb;
}

// The first use of an input in the forward counts; a recomputation repeats.
static enum fp8_cast_use fwd_use(const struct model *m) {
    return m->fp8.recomputing ? CAST_REPEAT : CAST_FIRST;
}

void model_fp8_qkv(struct model *m, int blk, struct tensor n1, struct tensor qkv, struct tensor qp,
                   struct tensor kp, struct tensor v) {
    struct model_fp8 *f = &m->fp8;
    int fb = fblock(m, blk), N = m->N, C = m->C, HD = m->Hl * m->D, KD = m->Hkvl * m->D;
    struct tensor x8 = tensor_slice(f->x8, 0, (size_t)N * C), w8 = w8_of(m, fb, FP8_SITE_QKV);
    cast_one(m, fb, FP8_SITE_QKV, FP8_X, x8, n1, fwd_use(m));
    struct tensor sx = sinv(m, fb, FP8_SITE_QKV, FP8_X), sw = sinv(m, fb, FP8_SITE_QKV, FP8_W);
    if (qkv.numel) {
        backend_matmul_fp8(m->be, qkv, x8, w8, sx, sw, N, HD + 2 * KD, C, false, true, 0.0f);
        return;
    }
    backend_matmul_fp8(m->be, qp, x8, tensor_slice(w8, 0, (size_t)HD * C), sx, sw, N, HD, C, false,
                       true, 0.0f);
    backend_matmul_fp8(m->be, kp, x8, tensor_slice(w8, (size_t)HD * C, (size_t)KD * C), sx, sw, N, KD,
                       C, false, true, 0.0f);
    backend_matmul_fp8(m->be, v, x8, tensor_slice(w8, (size_t)(HD + KD) * C, (size_t)KD * C), sx, sw,
                       N, KD, C, false, true, 0.0f);
}

void model_fp8_o(struct model *m, int blk, struct tensor y, struct tensor att) {
    int fb = fblock(m, blk), N = m->N, C = m->C, HD = m->Hl * m->D;
    struct tensor x8 = tensor_slice(m->fp8.x8, 0, (size_t)N * HD);
    cast_one(m, fb, FP8_SITE_O, FP8_X, x8, att, fwd_use(m));
    backend_matmul_fp8(m->be, y, x8, w8_of(m, fb, FP8_SITE_O), sinv(m, fb, FP8_SITE_O, FP8_X),
                       sinv(m, fb, FP8_SITE_O, FP8_W), N, C, HD, false, true, 0.0f);
}

void model_fp8_gate_up(struct model *m, int blk, struct tensor n2, struct tensor gu,
                       struct tensor gate, struct tensor up) {
    int fb = fblock(m, blk), N = m->N, C = m->C, Fl = m->Fl;
    struct tensor x8 = tensor_slice(m->fp8.x8, 0, (size_t)N * C), w8 = w8_of(m, fb, FP8_SITE_GATE_UP);
    cast_one(m, fb, FP8_SITE_GATE_UP, FP8_X, x8, n2, fwd_use(m));
    struct tensor sx = sinv(m, fb, FP8_SITE_GATE_UP, FP8_X), sw = sinv(m, fb, FP8_SITE_GATE_UP, FP8_W);
    if (gu.numel) {
        backend_matmul_fp8(m->be, gu, w8, x8, sw, sx, 2 * Fl, N, C, false, true, 0.0f);
        return;
    }
    size_t half = (size_t)Fl * C;
    backend_matmul_fp8(m->be, gate, tensor_slice(w8, 0, half), x8, sw, sx, Fl, N, C, false, true, 0.0f);
    backend_matmul_fp8(m->be, up, tensor_slice(w8, half, half), x8, sw, sx, Fl, N, C, false, true, 0.0f);
}

void model_fp8_down(struct model *m, int blk, struct tensor y, struct tensor act) {
    int fb = fblock(m, blk), N = m->N, C = m->C, Fl = m->Fl;
    struct tensor x8 = tensor_slice(m->fp8.x8, 0, (size_t)N * Fl);
    cast_one(m, fb, FP8_SITE_DOWN, FP8_X, x8, act, fwd_use(m));
    backend_matmul_fp8(m->be, y, x8, w8_of(m, fb, FP8_SITE_DOWN), sinv(m, fb, FP8_SITE_DOWN, FP8_X),
                       sinv(m, fb, FP8_SITE_DOWN, FP8_W), N, C, Fl, true, true, 0.0f);
}

void model_fp8_down_backward(struct model *m, int blk, struct tensor dact, struct tensor dwdown,
                             struct tensor dy, struct tensor act) {
    struct model_fp8 *f = &m->fp8;
    int fb = fblock(m, blk), N = m->N, C = m->C, Fl = m->Fl;
    struct tensor dy8 = tensor_slice(f->dy8, 0, (size_t)N * C), x8 = tensor_slice(f->x8, 0, (size_t)N * Fl);
    struct tensor sx = sinv(m, fb, FP8_SITE_DOWN, FP8_X), sw = sinv(m, fb, FP8_SITE_DOWN, FP8_W);
    struct tensor sdy = sinv(m, fb, FP8_SITE_DOWN, FP8_DY);
    cast_one(m, fb, FP8_SITE_DOWN, FP8_DY, dy8, dy, CAST_FIRST);
    backend_matmul_fp8(m->be, dact, w8_of(m, fb, FP8_SITE_DOWN), dy8, sw, sdy, Fl, N, C, true, true, 0.0f);
    cast_one(m, fb, FP8_SITE_DOWN, FP8_X, x8, act, CAST_REPEAT);
    backend_matmul_fp8(m->be, dwdown, dy8, x8, sdy, sx, C, Fl, N, true, true, 1.0f);
}

void model_fp8_gate_up_backward(struct model *m, int blk, struct tensor dln, struct tensor dwgu,
                                struct tensor dwgate, struct tensor dwup, struct tensor dgate,
                                struct tensor dup, struct tensor n2) {
    struct model_fp8 *f = &m->fp8;
    int fb = fblock(m, blk), N = m->N, C = m->C, Fl = m->Fl;
    size_t nfl = (size_t)N * Fl, half = (size_t)Fl * C;
    struct tensor dy8 = tensor_slice(f->dy8, 0, 2 * nfl), x8 = tensor_slice(f->x8, 0, (size_t)N * C);
    struct tensor w8 = w8_of(m, fb, FP8_SITE_GATE_UP);
    struct tensor sx = sinv(m, fb, FP8_SITE_GATE_UP, FP8_X), sw = sinv(m, fb, FP8_SITE_GATE_UP, FP8_W);
    struct tensor sdy = sinv(m, fb, FP8_SITE_GATE_UP, FP8_DY);
    const struct tensor parts[2] = {dgate, dup};
    cast_parts(m, fb, FP8_SITE_GATE_UP, FP8_DY, dy8, parts, 2, CAST_FIRST);
    cast_one(m, fb, FP8_SITE_GATE_UP, FP8_X, x8, n2, CAST_REPEAT);
    if (dwgu.numel) { // [dgate; dup] (2 Fl, N): one GEMM each way
        backend_matmul_fp8(m->be, dln, dy8, w8, sdy, sw, N, C, 2 * Fl, true, false, 0.0f);
        backend_matmul_fp8(m->be, dwgu, dy8, x8, sdy, sx, 2 * Fl, C, N, false, false, 1.0f);
        return;
    }
    struct tensor dyg = tensor_slice(dy8, 0, nfl), dyu = tensor_slice(dy8, nfl, nfl);
    backend_matmul_fp8(m->be, dln, dyg, tensor_slice(w8, 0, half), sdy, sw, N, C, Fl, true, false, 0.0f);
    backend_matmul_fp8(m->be, dln, dyu, tensor_slice(w8, half, half), sdy, sw, N, C, Fl, true, false, 1.0f);
    backend_matmul_fp8(m->be, dwgate, dyg, x8, sdy, sx, Fl, C, N, false, false, 1.0f);
    backend_matmul_fp8(m->be, dwup, dyu, x8, sdy, sx, Fl, C, N, false, false, 1.0f);
}

void model_fp8_o_backward(struct model *m, int blk, struct tensor datt, struct tensor dwo,
                          struct tensor dy, struct tensor att) {
    struct model_fp8 *f = &m->fp8;
    int fb = fblock(m, blk), N = m->N, C = m->C, HD = m->Hl * m->D;
    struct tensor dy8 = tensor_slice(f->dy8, 0, (size_t)N * C), x8 = tensor_slice(f->x8, 0, (size_t)N * HD);
    struct tensor sx = sinv(m, fb, FP8_SITE_O, FP8_X), sw = sinv(m, fb, FP8_SITE_O, FP8_W);
    struct tensor sdy = sinv(m, fb, FP8_SITE_O, FP8_DY);
    cast_one(m, fb, FP8_SITE_O, FP8_DY, dy8, dy, CAST_FIRST);
    backend_matmul_fp8(m->be, datt, dy8, w8_of(m, fb, FP8_SITE_O), sdy, sw, N, HD, C, false, false, 0.0f);
    cast_one(m, fb, FP8_SITE_O, FP8_X, x8, att, CAST_REPEAT);
    backend_matmul_fp8(m->be, dwo, dy8, x8, sdy, sx, C, HD, N, true, false, 1.0f);
}

void model_fp8_qkv_backward(struct model *m, int blk, struct tensor dln, struct tensor n1,
                            struct tensor dqkv, struct tensor dwqkv, struct tensor dq,
                            struct tensor dk, struct tensor dv, struct tensor dwq,
                            struct tensor dwk, struct tensor dwv) {
    struct model_fp8 *f = &m->fp8;
    int fb = fblock(m, blk), N = m->N, C = m->C, HD = m->Hl * m->D, KD = m->Hkvl * m->D, W = HD + 2 * KD;
    struct tensor dy8 = tensor_slice(f->dy8, 0, (size_t)N * W), x8 = tensor_slice(f->x8, 0, (size_t)N * C);
    struct tensor w8 = w8_of(m, fb, FP8_SITE_QKV);
    struct tensor sx = sinv(m, fb, FP8_SITE_QKV, FP8_X), sw = sinv(m, fb, FP8_SITE_QKV, FP8_W);
    struct tensor sdy = sinv(m, fb, FP8_SITE_QKV, FP8_DY);
    cast_one(m, fb, FP8_SITE_QKV, FP8_X, x8, n1, CAST_REPEAT);
    if (dwqkv.numel) {
        cast_one(m, fb, FP8_SITE_QKV, FP8_DY, dy8, dqkv, CAST_FIRST);
        backend_matmul_fp8(m->be, dln, dy8, w8, sdy, sw, N, C, W, false, false, 0.0f);
        backend_matmul_fp8(m->be, dwqkv, dy8, x8, sdy, sx, W, C, N, true, false, 1.0f);
        return;
    }
    // dy8 holds [dq (N, HD) | dk (N, KD) | dv (N, KD)], one scale
    const struct tensor parts[3] = {dq, dk, dv};
    cast_parts(m, fb, FP8_SITE_QKV, FP8_DY, dy8, parts, 3, CAST_FIRST);
    size_t nq = (size_t)N * HD, nk = (size_t)N * KD;
    struct tensor d8[3] = {tensor_slice(dy8, 0, nq), tensor_slice(dy8, nq, nk), tensor_slice(dy8, nq + nk, nk)};
    struct tensor w[3] = {tensor_slice(w8, 0, (size_t)HD * C), tensor_slice(w8, (size_t)HD * C, (size_t)KD * C),
                          tensor_slice(w8, (size_t)(HD + KD) * C, (size_t)KD * C)};
    struct tensor dw[3] = {dwq, dwk, dwv};
    int rows[3] = {HD, KD, KD};
    for (int j = 0; j < 3; j++) {
        backend_matmul_fp8(m->be, dln, d8[j], w[j], sdy, sw, N, C, rows[j], false, false, j ? 1.0f : 0.0f);
        backend_matmul_fp8(m->be, dw[j], d8[j], x8, sdy, sx, rows[j], C, N, true, false, 1.0f);
    }
}

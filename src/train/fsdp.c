// fsdp.c: ZeRO-2 and ZeRO-3 through the model's unit hook (fsdp.h).
#include "fsdp.h"

#include <math.h>
#include <string.h>

// A gather buffer (stage 3): which unit it holds (-1: free) and its transfer.
struct gather_buf {
    struct tensor t;          // model dtype, room for the unit
    int unit;
    struct comm_request req;  // the unit's all-gather into t
};

// A unit gradient buffer and its reduce-scatter.
struct grad_buf {
    struct tensor g;          // (max_unit,) gradient dtype (a tied embedding's: its unit's size)
    struct tensor recv;       // (max_unit / S,) the reduce-scatter's result
    struct tensor g16, r16;   // grad_dtype bf16: their BF16 twins; else empty
    int unit;                 // the unit whose gradients it holds or reduces; -1: none
    bool pending;             // a reduce-scatter started and not yet added into the shard
    struct comm_request req;
};

struct fsdp {
    struct fsdp_config cfg;
    struct model *model;
    struct optimizer *opt;
    struct backend *be;
    struct comm_group *g;     // the shard group
    struct comm_group *rep;   // hybrid sharding: the replicate group (NULL: none)
    int S;
    int n_units;
    const struct model_unit *units;
    const size_t *at;         // (n_units) each unit's slice in the optimizer's shards
    size_t max_unit;
    enum dtype pdt, gdt;      // parameter (model) and gradient dtypes
    struct tensor gshard, pshard; // the optimizer's
    int n_gather;             // stage 3: 2, or n_units without reshard_after_forward
    struct gather_buf *gather;
    void *stage_buf;          // stage 3 without reshard_after_forward: one buffer, unit u at units[u].begin
    int *where;               // (n_units) gather buffer holding unit u; -1: none
    int kept;                 // reshard_after_forward: the last unit of a chunk left gathered
                              // after its forward for its backward, which comes next; -1: none
    struct grad_buf gb[2];
    int next_gb;
    // A tied embedding: the head reads the embedding unit's parameters and
    // adds to its gradients. Its gradients get a buffer of their own, bound
    // from the head's backward to the embedding's (or, on a last stage
    // without the embedding's pass, to the end of the head's backward).
    bool tied;
    int embed, head;          // their units; -1: none
    bool embed_pass;          // this rank runs the embedding's forward and backward
    struct grad_buf tied_gb;
    struct fsdp_stats stats;
    bool fault_grad_inf;      // tests: the next bound gradient buffer gets an inf (fsdp_fault_grad_inf)
};

static size_t unit_len(const struct fsdp *f, int u) { return f->units[u].end - f->units[u].begin; }

// Before a collective on backend buffers: the host waits for the compute
// stream unless the group orders itself after it (NCCL).
static void sync_for(struct fsdp *f) {
    comm_order_after_compute(f->g, f->be);
}

static int live_units(const struct fsdp *f) {
    int n = 0;
    for (int b = 0; b < f->n_gather; b++) n += f->gather[b].unit >= 0;
    return n;
}

// ---- parameters (stage 3) ------------------------------------------------------

// Starts the all-gather of unit u into a free buffer (ahead: before the
// event of its own use: a prefetch).
static void params_release(struct fsdp *f, int u);

static int free_buffer(const struct fsdp *f) {
    int b = 0;
    while (b < f->n_gather && f->gather[b].unit >= 0) b++;
    return b;
}

static void gather_start(struct fsdp *f, int u, bool ahead) {
    int b = 0;
    if (f->stage_buf) b = u;
    else if ((b = free_buffer(f)) == f->n_gather && f->kept >= 0) {
        // another pass came first (a pipeline's next forward, an evaluation):
        // the kept unit goes, as reshard_after_forward would have done
        int k = f->kept;
        f->kept = -1;
        params_release(f, k);
        b = free_buffer(f);
    }
    CHECK(b < f->n_gather && f->gather[b].unit < 0, "fsdp: no free gather buffer for unit %d", u);
    struct gather_buf *gb = &f->gather[b];
    size_t per = unit_len(f, u) / f->S;
    sync_for(f);
    comm_all_gather_start(f->g, tensor_slice(f->pshard, f->at[u], per).data, gb->t.data, per,
                          f->pdt, &gb->req);
    gb->unit = u, f->where[u] = b;
    f->stats.gathers++;
    if (ahead) f->stats.prefetched++;
    f->stats.live_max = MAX(f->stats.live_max, live_units(f));
}

// Unit u gathered and bound (its gather waited for).
static void gather_ready(struct fsdp *f, int u) {
    if (f->where[u] < 0) gather_start(f, u, false);
    struct gather_buf *gb = &f->gather[f->where[u]];
    comm_wait(&gb->req);
    model_unit_bind(f->model, u, gb->t.data, NULL);
}

static void gather_release(struct fsdp *f, int u) {
    if (f->where[u] < 0) return;
    struct gather_buf *gb = &f->gather[f->where[u]];
    comm_wait(&gb->req); // a prefetch never used (not expected): complete it first
    gb->unit = -1, f->where[u] = -1;
}

// The unit after u in direction dir (+1 forward, -1 backward) within u's
// model chunk; -1 when none.
static int neighbour(const struct fsdp *f, int u, int dir) {
    int v = u + dir;
    if (v < 0 || v >= f->n_units || f->units[v].chunk != f->units[u].chunk) return -1;
    return v;
}

// Gathers the unit after u ahead (the embedding's backward needs no parameters).
static void prefetch(struct fsdp *f, int u, int dir) {
    int v = neighbour(f, u, dir);
    if (dir < 0 && v == f->embed) return;
    if (f->cfg.prefetch && v >= 0 && f->where[v] < 0) gather_start(f, v, true);
}

// ---- gradients -------------------------------------------------------------------

// Waits for buffer k's reduce-scatter and adds its result into the gradient shard.
static void rs_complete(struct fsdp *f, struct grad_buf *k) {
    if (!k->pending) return;
    comm_wait(&k->req);
    size_t per = unit_len(f, k->unit) / f->S;
    if (f->rep) { // HSDP: the shard summed over the replicas, in grad_dtype
        struct tensor r = k->r16.numel ? k->r16 : k->recv;
        sync_for(f);
        comm_all_reduce(f->rep, r.data, per, r.dtype, COMM_SUM);
    }
    if (k->r16.numel) backend_copy(f->be, k->recv, k->r16, per);
    struct tensor dst = tensor_slice(f->gshard, f->at[k->unit], per);
    backend_add(f->be, dst, dst, k->recv, per);
    k->pending = false, k->unit = -1;
}

// Before unit u's backward: a zeroed gradient buffer bound as its gradients.
static void grads_bind(struct fsdp *f, int u) {
    struct grad_buf *k = &f->gb[f->next_gb];
    f->next_gb ^= 1;
    rs_complete(f, k);
    struct tensor g = tensor_slice(k->g, 0, unit_len(f, u));
    backend_memset0(f->be, g);
    if (f->fault_grad_inf) { // before the backward adds into it: reduced like a real overflow
        float inf = INFINITY;
        backend_to_device(f->be, g.data, &inf, sizeof inf);
        f->fault_grad_inf = false;
    }
    k->unit = u;
    model_unit_bind(f->model, u, NULL, g.data);
}

// Starts the reduce-scatter of buffer k, holding unit u's gradients, after
// the unit's TP sums.
static void rs_start(struct fsdp *f, struct grad_buf *k, int u) {
    model_finish_unit_grads(f->model, u);
    size_t len = unit_len(f, u), per = len / f->S;
    struct tensor send = tensor_slice(k->g, 0, len), recv = k->recv;
    sync_for(f);
    if (k->g16.numel) { // grad_dtype bf16: rounded for the transfer
        backend_copy(f->be, tensor_slice(k->g16, 0, len), send, len);
        sync_for(f);
        send = tensor_slice(k->g16, 0, len), recv = k->r16;
    }
    comm_reduce_scatter_start(f->g, send.data, recv.data, per, send.dtype, COMM_SUM, &k->req);
    k->pending = true;
    f->stats.rs++;
    if (f->cfg.overlap) f->stats.rs_early++;
    else rs_complete(f, k);
}

// After unit u's backward: its reduce-scatter from its rotating buffer.
static void grads_reduce(struct fsdp *f, int u) {
    struct grad_buf *k = f->gb[0].unit == u && !f->gb[0].pending ? &f->gb[0] : &f->gb[1];
    CHECK(k->unit == u && !k->pending, "fsdp: unit %d has no gradient buffer", u);
    rs_start(f, k, u);
}

// After unit u's B (the split backward): its buffer, bound at its BACKWARD,
// holds nothing the W needs (model_pass.c stashed it): free for the next bind.
static void grads_drop(struct fsdp *f, int u) {
    struct grad_buf *k = f->gb[0].unit == u && !f->gb[0].pending ? &f->gb[0] : &f->gb[1];
    CHECK(k->unit == u && !k->pending, "fsdp: unit %d has no gradient buffer", u);
    k->unit = -1;
}

// Before the head's backward with a tied embedding: the embedding's
// gradients bound to their own buffer, zeroed (after its previous
// reduce-scatter), to which the head and then the embedding's pass add.
static void tied_bind(struct fsdp *f) {
    struct grad_buf *k = &f->tied_gb;
    rs_complete(f, k);
    struct tensor g = tensor_slice(k->g, 0, unit_len(f, f->embed));
    backend_memset0(f->be, g);
    k->unit = f->embed;
    model_unit_bind(f->model, f->embed, NULL, g.data);
}

// ---- the hook ---------------------------------------------------------------------

// Stage 3: unit u's parameters gathered and bound, and the head's tied
// embedding first (the head's views point at the embedding's).
static void params_ready(struct fsdp *f, int u) {
    if (f->tied && u == f->head) gather_ready(f, f->embed);
    gather_ready(f, u);
}

static void params_release(struct fsdp *f, int u) {
    gather_release(f, u);
    if (f->tied && u == f->head) gather_release(f, f->embed);
}

static void on_unit(void *ctx, int u, enum model_unit_event ev) {
    struct fsdp *f = ctx;
    bool z3 = f->cfg.stage == 3, tied_embed = f->tied && u == f->embed;
    switch (ev) {
    case MODEL_UNIT_FORWARD:
        if (z3) params_ready(f, u), prefetch(f, u, +1);
        break;
    case MODEL_UNIT_FORWARD_DONE:
        // The last unit of a chunk stays gathered: its backward is usually next
        // (FSDP does not reshard its root either); gather_start frees it if not.
        if (z3 && f->cfg.reshard_after_forward && (f->kept < 0 || f->kept == u) &&
            neighbour(f, u, +1) < 0)
            f->kept = u;
        else if (z3 && f->cfg.reshard_after_forward) params_release(f, u);
        break;
    case MODEL_UNIT_BACKWARD:
        if (u == f->kept) f->kept = -1; // in use again: released after its backward
        // The embedding's backward reads no parameter (only its gradient).
        if (z3 && u != f->embed) params_ready(f, u), prefetch(f, u, -1);
        if (f->tied && u == f->head) tied_bind(f);
        if (!tied_embed) grads_bind(f, u); // a tied embedding's stay bound since the head's
        break;
    case MODEL_UNIT_BACKWARD_DONE:
        if (tied_embed) rs_start(f, &f->tied_gb, u);
        else grads_reduce(f, u);
        if (f->tied && u == f->head && !f->embed_pass) rs_start(f, &f->tied_gb, f->embed);
        if (z3 && f->cfg.reshard_after_forward) params_release(f, u);
        break;
    // The split backward (model.h: B between BACKWARD and INPUT_DONE, W
    // between WEIGHT and WEIGHT_DONE). B's gradients that are no GEMM's went
    // to the model's stash at INPUT_DONE, so its buffer is free again; the W
    // gets a zeroed one, the model puts them back at its end, and the
    // reduce-scatter starts then: per microbatch, as the fused pass does.
    case MODEL_UNIT_INPUT_DONE:
        grads_drop(f, u);
        if (z3 && f->cfg.reshard_after_forward) params_release(f, u);
        break;
    case MODEL_UNIT_WEIGHT:
        CHECK(!tied_embed, "fsdp: a W of the embedding unit (the model reports none)");
        if (f->tied && u == f->head) {
            CHECK(!f->embed_pass, "fsdp: a tied embedding with the split backward on the rank of "
                  "its pass (ZB-V's stage 0) is not built: config_validate refuses it");
            tied_bind(f);
        }
        grads_bind(f, u);
        break;
    case MODEL_UNIT_WEIGHT_DONE:
        grads_reduce(f, u);
        if (f->tied && u == f->head) rs_start(f, &f->tied_gb, f->embed);
        break;
    }
    fsdp_poll(f);
}

void fsdp_poll(struct fsdp *f) {
    for (int k = 0; k < 2; k++)
        if (f->gb[k].pending) comm_test(&f->gb[k].req);
    if (f->tied_gb.pending) comm_test(&f->tied_gb.req);
    for (int b = 0; b < f->n_gather; b++)
        if (f->gather[b].unit >= 0) comm_test(&f->gather[b].req);
}

void fsdp_step_begin(struct fsdp *f) {
    f->kept = -1;
    for (int u = 0; u < f->n_units; u++) gather_release(f, u); // kept by samples' forwards
    backend_memset0(f->be, f->gshard);
    memset(&f->stats, 0, sizeof f->stats);
}

void fsdp_fault_grad_inf(struct fsdp *f) { f->fault_grad_inf = true; }

void fsdp_step_end(struct fsdp *f) {
    // the older first (next_gb is bound next: the least recently bound), so
    // a unit's results add into its shard in the order of its backwards
    for (int k = 0; k < 2; k++) rs_complete(f, &f->gb[f->next_gb ^ k]);
    rs_complete(f, &f->tied_gb);
    f->kept = -1;
    for (int u = 0; u < f->n_units; u++) gather_release(f, u);
}

void fsdp_stats(const struct fsdp *f, struct fsdp_stats *out) { *out = f->stats; }

struct tensor fsdp_embed_grad_shard(struct fsdp *f) {
    if (f->embed < 0) return tensor_view(NULL, f->gdt, 0);
    return tensor_slice(f->gshard, f->at[f->embed], unit_len(f, f->embed) / f->S);
}

// ---- set-up -----------------------------------------------------------------------

static void *alloc_or_null(struct backend *be, size_t bytes, bool *ok) {
    if (!bytes) return NULL;
    void *p = backend_alloc(be, bytes);
    if (!p) *ok = false;
    return p;
}

enum status fsdp_init(struct fsdp **out, struct model *m, struct optimizer *opt,
                      struct comm_group *shard, struct comm_group *replicate,
                      const struct fsdp_config *cfg, uint64_t seed, struct error *err) {
    struct fsdp *f = xcalloc(1, sizeof *f);
    f->cfg = *cfg, f->model = m, f->opt = opt, f->be = model_backend(m), f->g = shard;
    f->rep = replicate && replicate->size > 1 ? replicate : NULL;
    f->S = shard->size;
    f->units = model_units(m, &f->n_units);
    const size_t *rb, *re;
    CHECK(optimizer_ranges(opt, &rb, &re, &f->at) == f->n_units, "fsdp: optimizer ranges != units");
    f->max_unit = model_memory(m)->max_unit_numel;
    f->pdt = model_param_arena(m).dtype, f->gdt = model_grad_arena(m).dtype;
    f->gshard = optimizer_grad_shard(opt), f->pshard = optimizer_param_shard(opt);
    f->where = xcalloc((size_t)f->n_units, sizeof *f->where);
    for (int u = 0; u < f->n_units; u++) f->where[u] = -1;
    f->kept = -1;
    bool ok = true, z3 = cfg->stage == 3, b16 = cfg->grad_dtype == DTYPE_BF16 && f->gdt == DTYPE_FP32;
    f->embed = f->head = -1;
    for (int u = 0; u < f->n_units; u++) {
        if (f->units[u].kind == MODEL_UNIT_EMBED) f->embed = u;
        if (f->units[u].kind == MODEL_UNIT_HEAD) f->head = u;
    }
    f->tied = cfg->tied && f->embed >= 0 && f->head >= 0;
    f->embed_pass = model_is_first_stage(m);
    for (int k = 0; k < 3; k++) {
        struct grad_buf *b = k < 2 ? &f->gb[k] : &f->tied_gb;
        b->unit = -1;
        if (k == 2 && !f->tied) break;
        size_t len = k < 2 ? f->max_unit : unit_len(f, f->embed), per = len / f->S;
        b->g = tensor_view(alloc_or_null(f->be, len * dtype_size(f->gdt), &ok), f->gdt, len);
        b->recv = tensor_view(alloc_or_null(f->be, per * dtype_size(f->gdt), &ok), f->gdt, per);
        b->g16 = tensor_view(b16 ? alloc_or_null(f->be, len * 2, &ok) : NULL, DTYPE_BF16, b16 ? len : 0);
        b->r16 = tensor_view(b16 ? alloc_or_null(f->be, per * 2, &ok) : NULL, DTYPE_BF16, b16 ? per : 0);
    }
    if (z3) {
        bool keep = !cfg->reshard_after_forward;
        // A tied head needs the embedding gathered beside it: one more.
        f->n_gather = keep ? f->n_units : f->tied ? 3 : 2;
        f->gather = xcalloc((size_t)f->n_gather, sizeof *f->gather);
        size_t n_params = model_memory(m)->n_params, es = dtype_size(f->pdt);
        if (keep) f->stage_buf = alloc_or_null(f->be, n_params * es, &ok);
        for (int b = 0; b < f->n_gather; b++) {
            f->gather[b].unit = -1;
            if (keep)
                f->gather[b].t = tensor_view(f->stage_buf ? (char *)f->stage_buf + f->units[b].begin * es : NULL,
                                             f->pdt, unit_len(f, b));
            else
                f->gather[b].t = tensor_view(alloc_or_null(f->be, f->max_unit * es, &ok), f->pdt, f->max_unit);
        }
    }
    if (!ok) {
        fsdp_free(f);
        return error_set(err, STATUS_RUNTIME, "zero_stage %d: out of %s memory for the unit buffers",
                         cfg->stage, f->be->ops->name);
    }
    if (z3) { // weights unit by unit through a gather buffer: this rank keeps its slices
        struct tensor buf = f->gather[0].t;
        for (int u = 0; u < f->n_units; u++) {
            size_t len = unit_len(f, u), s = len / f->S;
            struct tensor t = f->stage_buf ? f->gather[u].t : tensor_slice(buf, 0, len);
            backend_memset0(f->be, t);
            model_unit_bind(m, u, t.data, NULL);
            model_init_unit_weights(m, u, seed);
            backend_copy(f->be, tensor_slice(f->pshard, f->at[u], s),
                         tensor_slice(t, s * (size_t)shard->rank, s), s);
        }
        optimizer_sync_master(opt);
        backend_synchronize(f->be);
    }
    model_set_unit_hook(m, on_unit, f);
    *out = f;
    return STATUS_OK;
}

void fsdp_free(struct fsdp *f) {
    if (!f) return;
    model_set_unit_hook(f->model, NULL, NULL);
    for (int k = 0; k < 3; k++) {
        struct grad_buf *b = k < 2 ? &f->gb[k] : &f->tied_gb;
        backend_dealloc(f->be, b->g.data), backend_dealloc(f->be, b->recv.data);
        backend_dealloc(f->be, b->g16.data), backend_dealloc(f->be, b->r16.data);
    }
    if (f->stage_buf) backend_dealloc(f->be, f->stage_buf);
    else
        for (int b = 0; b < f->n_gather; b++) backend_dealloc(f->be, f->gather[b].t.data);
    free(f->gather), free(f->where);
    free(f);
}

void fsdp_plan_bytes(int stage, bool reshard_after_forward, enum dtype dtype,
                     enum dtype grad_dtype, const struct model_memory *mem, int S, size_t *params,
                     size_t *grads) {
    enum dtype gdt = dtype == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32;
    size_t es = dtype_size(dtype), gs = dtype_size(gdt), shard = mem->n_params / S;
    size_t big = mem->max_unit_numel, tied = mem->tied_embed_numel;
    bool b16 = grad_dtype == DTYPE_BF16 && gdt == DTYPE_FP32;
    // the gradient shard, two unit buffers of the largest unit and a tied
    // embedding's own, each with its reduce-scatter result (and BF16 twins)
    size_t bufs = 2 * (big + big / S) + tied + tied / S;
    *grads = shard * gs + bufs * gs + (b16 ? bufs * 2 : 0);
    *params = 0;
    if (stage == 3) // the shard; 2 gather buffers (3 beside a tied head) or the whole stage
        *params = shard * es + (reshard_after_forward ? (tied ? 3 : 2) * big : mem->n_params) * es;
}

static size_t bytes_of(struct tensor t) { return t.data ? t.numel * dtype_size(t.dtype) : 0; }

void fsdp_bytes(const struct fsdp *f, size_t *params, size_t *grads) {
    *grads = bytes_of(f->gshard), *params = bytes_of(f->pshard);
    for (int k = 0; k < 3; k++) {
        const struct grad_buf *b = k < 2 ? &f->gb[k] : &f->tied_gb;
        *grads += bytes_of(b->g) + bytes_of(b->recv) + bytes_of(b->g16) + bytes_of(b->r16);
    }
    // (fsdp_plan_bytes computes the same from sizes: plan_matches_run.sh)
    if (f->stage_buf) *params += model_memory(f->model)->n_params * dtype_size(f->pdt);
    else
        for (int b = 0; b < f->n_gather; b++) *params += bytes_of(f->gather[b].t);
}

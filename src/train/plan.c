// plan.c: shards and memory per rank from the config (plan.h); `trident plan`
// (src/cli/cmd_plan.c) prints them for a layout that is not running.
#include "plan.h"

#include <string.h>

#include "data/dataset.h"
#include "model/optimizer.h"
#include "train/grad_sync.h"
#include "parallel/pipeline.h"

struct llama_config plan_llama(const struct config *c) {
    return (struct llama_config){
        .vocab_size = c->model.vocab_size, .d_model = c->model.d_model,
        .n_layers = c->model.n_layers, .n_heads = c->model.n_heads,
        .n_kv_heads = c->model.n_kv_heads, .ffn_dim = c->model.ffn_dim,
        .max_seq_len = c->model.max_seq_len, .rope_theta = c->model.rope_theta,
        .norm_eps = (float)c->model.norm_eps, .tie_embeddings = c->model.tie_embeddings,
        .init_std = (float)c->model.init_std, .label_smoothing = (float)c->train.label_smoothing,
    };
}

struct plan_sharding plan_sharding_of(const struct config *c) {
    return (struct plan_sharding){.zero_stage = c->parallel.zero_stage, .shard_ranks = MAX(1, c->parallel.dp),
                                  .reshard_after_forward = true, .prefetch = 1};
}

// Elements ZeRO shards evenly: the arena is padded to a multiple of 64 x the
// ranks it is split over (ZeRO-1: dp; 2 and 3: S).
static int arena_multiple(const struct config *c, const struct plan_sharding *z) {
    return z->zero_stage == 1 ? 64 * c->parallel.dp : z->zero_stage >= 2 ? 64 * z->shard_ranks : 0;
}

int plan_microbatches(const struct config *c) {
    return loader_microbatches(c->train.global_batch_size, c->train.micro_batch_size, c->parallel.dp);
}

enum status plan_shard(const struct config *c, struct grid_coord coord, struct model_shard *out,
                       struct error *err) {
    struct llama_config lc = plan_llama(c);
    int pp = c->parallel.pp, v = MAX(1, c->parallel.virtual_stages), s = coord.p;
    int m = plan_microbatches(c);
    struct model_shard shard = model_shard_pipeline(&lc, pp, s, v);
    shard.tp_rank = coord.t, shard.tp_size = c->parallel.tp;
    struct plan_sharding z = plan_sharding_of(c);
    shard.arena_multiple = arena_multiple(c, &z);
    shard.sequence_parallel = c->parallel.sequence_parallel;
    shard.recompute = c->model.recompute;
    if (pp > 1 || v > 1) {
        shard.n_slots = pipeline_max_in_flight(pp, s, m, v);
        if (shard.n_slots < 1) { // refused: the schedule says why
            struct error why = {0};
            struct pp_op *probe = xcalloc(2 * (size_t)m * v, sizeof *probe);
            pipeline_schedule(pp, s, m, v, probe, &why);
            free(probe);
            return error_set(err, STATUS_BAD_INPUT,
                             "%s: [parallel] pp = %d, virtual_stages = %d with %d microbatches "
                             "per step (global_batch_size / (micro_batch_size * dp)): %s",
                             c->file, pp, v, m, why.msg);
        }
    }
    *out = shard;
    return STATUS_OK;
}

size_t plan_rank_total(const struct plan_rank_bytes *b) {
    return b->params + b->grads + b->optimizer + b->activations;
}

// Elements of tensor-parallel rank t's parameters for layers [begin, end) as
// one chunk (model_plan's count: holds the embedding when begin = 0, the
// final norm and head when end = L).
static enum status layers_elems(const struct config *c, int t, int begin, int end, size_t *out,
                                struct error *err) {
    struct llama_config lc = plan_llama(c);
    struct model_shard s = {.n_chunks = 1, .tp_rank = t, .tp_size = c->parallel.tp, .n_slots = 1};
    s.layer_begin[0] = begin, s.layer_end[0] = end;
    struct model_memory mem;
    enum status st = model_plan(&lc, &s, c->precision.dtype, 1, c->train.seq_len, &mem, err);
    *out = mem.n_params;
    return st;
}

enum status plan_unit_elems(const struct config *c, struct grid_coord coord, size_t *out,
                            struct error *err) {
    int L = c->model.n_layers, t = coord.t;
    size_t one, two, tail;
    enum status st = layers_elems(c, t, 0, 1, &one, err);
    if (st) return st;
    if (L < 2) { // one layer: every part on the one stage; the whole shard as one unit (an upper bound)
        *out = one;
        return STATUS_OK;
    }
    if ((st = layers_elems(c, t, 0, 2, &two, err)) || (st = layers_elems(c, t, L - 1, L, &tail, err)))
        return st;
    size_t block = two - one, embed = one - block, head = tail - block;
    struct model_shard sh;
    if ((st = plan_shard(c, coord, &sh, err))) return st;
    bool first = sh.layer_begin[0] == 0, last = sh.layer_end[sh.n_chunks - 1] == L;
    *out = MAX(block, MAX(first ? embed : 0, last ? head : 0));
    return STATUS_OK;
}

enum status plan_rank(const struct config *c, struct grid_coord coord, struct plan_rank_bytes *out,
                      struct error *err) {
    struct plan_sharding z = plan_sharding_of(c);
    return plan_rank_sharded(c, &z, coord, out, err);
}

enum status plan_rank_sharded(const struct config *c, const struct plan_sharding *z,
                              struct grid_coord coord, struct plan_rank_bytes *out, struct error *err) {
    struct llama_config lc = plan_llama(c);
    struct model_shard shard;
    struct model_memory mem;
    enum status st = plan_shard(c, coord, &shard, err);
    if (st) return st;
    shard.arena_multiple = arena_multiple(c, z);
    st = model_plan(&lc, &shard, c->precision.dtype, c->train.micro_batch_size, c->train.seq_len, &mem,
                    err);
    if (st) return st;
    int dp = c->parallel.dp;
    *out = (struct plan_rank_bytes){
        .params = mem.param_bytes,
        // grad_dtype = bf16 without ZeRO-1: the BF16 copy the buckets all-reduce
        .grads = mem.grad_bytes + grad_sync_plan_bytes(mem.n_params, dp, z->zero_stage,
                                                       c->precision.grad_dtype),
        .optimizer = optimizer_plan_bytes(mem.n_params, c->precision.dtype, dp, z->zero_stage,
                                          c->precision.grad_dtype),
        .activations = mem.activation_bytes,
        .slot_bytes = mem.slot_bytes,
        .recompute_bytes = mem.recompute_bytes,
        .n_slots = MAX(1, shard.n_slots),
        .n_params = mem.n_params,
    };
    if (z->zero_stage < 2) return STATUS_OK;
    // ZeRO-2 / 3 (plan.h): n divides by S (arena_multiple).
    int S = z->shard_ranks;
    size_t n = mem.n_params, nS = n / S, U, P = dtype_size(c->precision.dtype);
    size_t G = mem.grad_bytes / MAX(n, 1); // 4, or 8 for an fp64 model
    if ((st = plan_unit_elems(c, coord, &U, err))) return st;
    out->zero_stage = z->zero_stage, out->shard_ranks = S, out->unit_elems = U;
    out->grads_shard = nS * G, out->grads_units = 2 * U * G;
    out->grads_transfer = c->precision.grad_dtype == DTYPE_BF16 ? 2 * U * sizeof(uint16_t) : 0;
    out->grads = out->grads_shard + out->grads_units + out->grads_transfer;
    // m, v (and the FP32 master weights) over the shard: ZeRO-1's over S ranks
    out->optimizer = optimizer_plan_bytes(n, c->precision.dtype, S, 1, DTYPE_FP32);
    out->opt_master = c->precision.dtype == DTYPE_BF16 || c->precision.dtype == DTYPE_FP16 ? nS * sizeof(float) : 0;
    out->opt_moments = out->optimizer - out->opt_master;
    if (z->zero_stage == 3) {
        out->params_shard = nS * P;
        out->n_gathered = z->reshard_after_forward ? z->prefetch + 1 : 0;
        out->params_gathered = z->reshard_after_forward ? (size_t)out->n_gathered * U * P : n * P;
        out->params = out->params_shard + out->params_gathered;
    }
    return STATUS_OK;
}

static bool rank_bytes_equal(const struct plan_rank_bytes *a, const struct plan_rank_bytes *b) {
    return a->params == b->params && a->grads == b->grads && a->optimizer == b->optimizer &&
           a->activations == b->activations && a->slot_bytes == b->slot_bytes &&
           a->recompute_bytes == b->recompute_bytes && a->n_slots == b->n_slots &&
           a->unit_elems == b->unit_elems && a->params_gathered == b->params_gathered;
}

enum status plan_groups(const struct config *c, struct plan_group *out, int *n_out, size_t *peak,
                        double *sum, struct error *err) {
    int tp = c->parallel.tp, pp = c->parallel.pp, dp = c->parallel.dp, n = 0;
    *peak = 0, *sum = 0;
    for (int p = 0; p < pp; p++) {
        const char *role = pp == 1 ? "only" : p == 0 ? "first" : p == pp - 1 ? "last" : "middle";
        for (int t = 0; t < tp; t++) {
            struct plan_rank_bytes b;
            enum status st = plan_rank(c, (struct grid_coord){t, 0, p}, &b, err);
            if (st) return st;
            size_t tot = plan_rank_total(&b);
            *peak = MAX(*peak, tot), *sum += (double)tot * dp;
            struct plan_group *g = n ? &out[n - 1] : NULL;
            if (g && !strcmp(g->role, role) && rank_bytes_equal(&g->bytes, &b) &&
                (g->stage_end == p || (g->stage_end == p - 1 && t == 0))) {
                g->stage_end = p;
                g->n_ranks += dp;
                continue;
            }
            out[n++] = (struct plan_group){p, p, role, dp, b};
        }
    }
    *n_out = n;
    return STATUS_OK;
}

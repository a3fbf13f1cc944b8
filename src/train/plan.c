// plan.c: shards and memory per rank from the config (plan.h); `trident plan`
// (src/cli/cmd_plan.c) prints them for a layout that is not running.
#include "plan.h"

#include "data/dataset.h"
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
    shard.arena_multiple = c->parallel.zero_stage == 1 ? 64 * c->parallel.dp : 0;
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

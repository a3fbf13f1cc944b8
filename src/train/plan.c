// plan.c: shards and memory per rank from the config (plan.h), and the
// `trident plan` subcommand that prints them for a layout that is not running.
#include "plan.h"

#include <string.h>

#include "cli/cli.h"
#include "model/optimizer.h"
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
    return c->train.global_batch_size / (c->train.micro_batch_size * c->parallel.dp);
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

static double mib(size_t b) { return b / 1048576.0; }

int cmd_plan(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: trident plan CONFIG.ini [section.key=value ...]\n"
                "  prints the bytes each rank of that layout allocates (parameters, gradients,\n"
                "  AdamW state, activations), without running it\n");
        return argc < 2 ? STATUS_BAD_INPUT : STATUS_OK;
    }
    struct config c;
    struct error err = {0};
    int tp, pp, dp;
    if (config_load(argv[1], argc - 2, argv + 2, &c, &err) ||
        config_validate(&c, c.parallel.tp * c.parallel.pp * c.parallel.dp, true, &err)) {
        fprintf(stderr, "trident plan: %s\n", err.msg);
        return err.status;
    }
    tp = c.parallel.tp, pp = c.parallel.pp, dp = c.parallel.dp;
    struct llama_config lc = plan_llama(&c);
    printf("plan: %s, tp %d x pp %d x dp %d = %d ranks, zero_stage %d, %d microbatches of %d x %d "
           "tokens per rank per step, %s\n", c.file, tp, pp, dp, tp * pp * dp, c.parallel.zero_stage,
           plan_microbatches(&c), c.train.micro_batch_size, c.train.seq_len,
           dtype_name(c.precision.dtype));
    printf("%-6s %-6s %12s %12s %12s %14s %12s %6s\n", "stage", "tp", "params MiB", "grads MiB",
           "AdamW MiB", "activ. MiB", "total MiB", "slots");
    double total = 0;
    for (int p = 0; p < pp; p++)
        for (int t = 0; t < tp; t++) {
            struct grid_coord coord = {t, 0, p};
            struct model_shard shard;
            struct model_memory mem;
            if (plan_shard(&c, coord, &shard, &err) ||
                model_plan(&lc, &shard, c.precision.dtype, c.train.micro_batch_size,
                           c.train.seq_len, &mem, &err)) {
                fprintf(stderr, "trident plan: %s\n", err.msg);
                return err.status;
            }
            size_t opt = optimizer_plan_bytes(mem.n_params, c.precision.dtype, dp,
                                              c.parallel.zero_stage);
            size_t sum = mem.param_bytes + mem.grad_bytes + opt + mem.activation_bytes;
            printf("%-6d %-6d %12.1f %12.1f %12.1f %14.1f %12.1f %6d\n", p, t, mib(mem.param_bytes),
                   mib(mem.grad_bytes), mib(opt), mib(mem.activation_bytes), mib(sum),
                   MAX(1, shard.n_slots));
            printf("       bytes: params %zu, grads %zu, optimizer %zu, activations %zu\n",
                   mem.param_bytes, mem.grad_bytes, opt, mem.activation_bytes);
            total += (double)sum * dp;
        }
    printf("all %d ranks: %.1f MiB (each data-parallel replica holds its stage's row)\n",
           tp * pp * dp, total / 1048576.0);
    return STATUS_OK;
}

// cmd_plan.c: `trident plan CONFIG.ini [section.key=value ...]`: the bytes
// each rank of a layout allocates, from src/train/plan.h, without running it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/optimizer.h"
#include "train/grad_sync.h"
#include "train/plan.h"

static double mib(size_t b) { return b / 1048576.0; }

int cmd_plan(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: trident plan CONFIG.ini [--world-size N] [section.key=value ...]\n"
                "  prints the bytes each rank of that layout allocates (parameters, gradients,\n"
                "  AdamW state, activations), without running it; --world-size N: the ranks the\n"
                "  run will have (parallel.dp = 0 infers dp = N / (tp * pp); without it, dp = 0\n"
                "  means 1)\n");
        return argc < 2 ? STATUS_BAD_INPUT : STATUS_OK;
    }
    struct config c;
    struct error err = {0};
    int tp, pp, dp, world = 0;
    // --world-size N anywhere after CONFIG.ini; the rest are overrides.
    char **over = xmalloc(sizeof(char *) * (size_t)argc);
    int n_over = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--world-size")) {
            over[n_over++] = argv[i];
            continue;
        }
        char *end = NULL;
        long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
        if (!end || *end || v < 1 || v > (1 << 24)) {
            fprintf(stderr, "trident plan: --world-size needs a number of ranks >= 1, got '%s'\n",
                    i + 1 < argc ? argv[i + 1] : "");
            free(over);
            return STATUS_BAD_INPUT;
        }
        world = (int)v, i++;
    }
    enum status st = config_load(argv[1], n_over, over, &c, &err);
    free(over);
    // Without --world-size the layout checks itself: dp = 0 resolves to 1.
    if (!st && !world) st = config_resolve_dp(&c, 0, &err);
    if (st || config_validate(&c, world ? world : c.parallel.tp * c.parallel.pp * c.parallel.dp, true, &err)) {
        fprintf(stderr, "trident plan: %s\n", err.msg);
        return err.status;
    }
    tp = c.parallel.tp, pp = c.parallel.pp, dp = c.parallel.dp;
    struct llama_config lc = plan_llama(&c);
    static const char *recompute_names[] = {"none", "selective", "full"};
    printf("plan: %s, tp %d x pp %d x dp %d = %d ranks, zero_stage %d, %d microbatches of %d x %d "
           "tokens per rank per step, %s, recompute %s\n", c.file, tp, pp, dp, tp * pp * dp,
           c.parallel.zero_stage, plan_microbatches(&c), c.train.micro_batch_size,
           c.train.seq_len, dtype_name(c.precision.dtype), recompute_names[c.model.recompute]);
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
                                              c.parallel.zero_stage, c.precision.grad_dtype);
            // grad_dtype = bf16 without ZeRO-1: the BF16 copy the buckets all-reduce
            mem.grad_bytes += grad_sync_plan_bytes(mem.n_params, dp, c.parallel.zero_stage,
                                                   c.precision.grad_dtype);
            size_t sum = mem.param_bytes + mem.grad_bytes + opt + mem.activation_bytes;
            printf("%-6d %-6d %12.1f %12.1f %12.1f %14.1f %12.1f %6d\n", p, t, mib(mem.param_bytes),
                   mib(mem.grad_bytes), mib(opt), mib(mem.activation_bytes), mib(sum),
                   MAX(1, shard.n_slots));
            printf("       bytes: params %zu, grads %zu, optimizer %zu, activations %zu\n",
                   mem.param_bytes, mem.grad_bytes, opt, mem.activation_bytes);
            printf("       activations: %d slots of %zu bytes, recompute buffer %zu, scratch %zu\n",
                   MAX(1, shard.n_slots), mem.slot_bytes, mem.recompute_bytes,
                   mem.activation_bytes - mem.recompute_bytes -
                       (size_t)MAX(1, shard.n_slots) * mem.slot_bytes);
            total += (double)sum * dp;
        }
    printf("all %d ranks: %.1f MiB (each data-parallel replica holds its stage's row)\n",
           tp * pp * dp, total / 1048576.0);
    return STATUS_OK;
}

// test_fp8_tp.c: FP8 linear layers under tensor parallelism (issue 29,
// acceptance 2 at the model level; docs/design.md §5 "FP8"), run by
// tests/e2e/fp8_tp_scales.sh on 2 ranks: a BF16 model in FP8 hybrid at tp 2
// with sequence parallelism trains 4 steps (train_step: forward, backward,
// AdamW) on the same batch on both ranks; then every FP8 block's scaling
// state (model_fp8_state_get: scale, amax, history of each of its 12
// tensors) is bitwise equal on both ranks, and the scales have moved from
// their initial 1 (the test measures something). Under delayed scaling the
// amaxes are all-reduced (max) over the TP group at the end of each step;
// under current scaling before each cast of a tensor split over TP. Without
// those reductions the ranks' scales of the split tensors (weights, the
// attention output, the SwiGLU product, the q/k/v and gate/up gradients)
// differ: removing either all-reduce from src/model/model_fp8.c makes this
// test fail (checked when it was written).
//
//   mpirun -np 2 test_fp8_tp   exit 0 pass, 1 fail
#include <string.h>

#include "base/mpi_util.h"
#include "base/rng.h"
#include "kernels/backend.h"
#include "model/optimizer.h"
#include "parallel/comm_mpi.h"
#include "train/train_step.h"
#include "../unit/test.h"

enum { V = 96, B = 2, T = 16, STEPS = 4 };

static struct llama_config config(void) {
    return (struct llama_config){
        .vocab_size = V, .d_model = 64, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2,
        .ffn_dim = 160, .max_seq_len = 32, .rope_theta = 10000.0, .norm_eps = 1e-5f,
        .tie_embeddings = false, .init_std = 0.05f, .label_smoothing = 0.0f,
    };
}

// Trains STEPS steps of one scaling mode and checks the state across ranks.
static void run(struct backend *be, struct comm_group *world, int rank, bool delayed) {
    struct error err = {0};
    struct llama_config cfg = config();
    struct model_shard sh = model_shard_full(&cfg);
    sh.tp_rank = rank, sh.tp_size = 2, sh.sequence_parallel = true;
    struct model *m;
    CHECK(!model_init(&m, be, &cfg, &sh, DTYPE_BF16, B, T, 5, &err), "%s", err.msg);
    struct parallel_groups g = {.tp = world};
    model_set_groups(m, &g);
    // the last block stays bf16 (fp8_skip_layers = last): FP8 blocks 0 and 1
    struct model_fp8_config fc = {.on = true, .grad = DTYPE_FP8_E5M2, .delayed = delayed,
                                  .history_len = 4, .margin = 0, .skip_last = 1};
    CHECK(!model_fp8_init(m, &fc, &err), "%s", err.msg);
    EXPECT(model_fp8_blocks(m) == 2, "%d FP8 blocks, expected 2 of 3", model_fp8_blocks(m));
    struct optimizer_config oc = {.lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 1, .steps = STEPS,
                                  .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                                  .grad_clip = 1.0};
    struct optimizer *opt;
    CHECK(!optimizer_init(&opt, be, m, &oc, &g, &err), "%s", err.msg);
    int32_t tokens[B * T], targets[B * T];
    uint64_t s = 3;
    for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)((s = rng_splitmix64(s)) >> 33) % V;
    for (int i = 0; i < B * T; i++) targets[i] = tokens[(i + 1) % (B * T)];
    for (int step = 0; step < STEPS; step++) {
        struct train_step_result r;
        train_step(m, opt, &oc, &g, NULL, step, tokens, targets, 1, B, T, &r);
        EXPECT(!r.skipped, "step %d skipped (loss %g)", step + 1, r.loss);
    }
    int cols = model_fp8_state_cols(m), nb = model_fp8_blocks(m);
    size_t per = (size_t)MODEL_FP8_TENSORS * cols, n = (size_t)nb * per;
    float *mine = calloc(n, sizeof *mine), *all = calloc(2 * n, sizeof *all);
    for (int i = 0; i < nb; i++) model_fp8_state_get(m, i, mine + i * per);
    comm_all_gather(world, mine, all, n, DTYPE_FP32);
    size_t differ = 0, moved = 0;
    for (size_t k = 0; k < n; k++) differ += memcmp(&all[k], &all[n + k], sizeof(float)) != 0;
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < MODEL_FP8_TENSORS; r++) moved += mine[i * per + (size_t)r * cols] != 1.0f;
    printf("rank %d: %s scaling, tp 2 + sp, %d steps: %zu of %zu state values differ between the "
           "ranks; %zu of %d scales moved from 1\n", rank, delayed ? "delayed" : "current", STEPS, differ,
           n, moved, nb * MODEL_FP8_TENSORS);
    EXPECT(differ == 0, "%s: %zu of %zu FP8 state values differ between the TP ranks",
           delayed ? "delayed" : "current", differ, n);
    EXPECT(moved == (size_t)nb * MODEL_FP8_TENSORS, "%s: only %zu of %d scales moved from 1",
           delayed ? "delayed" : "current", moved, nb * MODEL_FP8_TENSORS);
    free(mine), free(all);
    optimizer_free(opt);
    model_free(m);
}

int main(int argc, char **argv) {
    struct error err = {0};
    CHECK(!mpi_util_start(&argc, &argv, &err), "%s", err.msg);
    mpi_util_init(MPI_COMM_WORLD);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) mpi_exit_all(STATUS_BAD_INPUT, "usage: mpirun -np 2 test_fp8_tp");
    struct comm_group world;
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    comm_mpi_init(&world, dup);
    struct backend *be = backend_cpu_init(1);
    run(be, &world, rank, true);
    run(be, &world, rank, false);
    backend_free(be);
    int failed = test_failures, any;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    comm_group_free(&world);
    MPI_Finalize();
    return any ? 1 : 0;
}

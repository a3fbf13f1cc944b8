// test_fsdp_split.c: ZeRO-2 and ZeRO-3 (src/train/fsdp.c) under the backward
// split of the zero-bubble schedules (model.h, model_backward_chunk_input /
// _weight), under mpirun on 2 ranks (tests/e2e/fsdp_split_mpi.sh). Each rank
// runs three microbatches of its own tokens forward into three slots, then
// the split backward B0 B1 W0 B2 W1 W2 (W stashes 0 1 0) on one model and the fused backward in
// order on a second model from the same seed, each with its optimizer and
// fsdp over the same group: the optimizer's gradient shards (per-unit,
// per-microbatch reduce-scatters added in order) are bit-identical (memcmp),
// in fp32 and bf16, recompute none and full, with reshard_after_forward on
// and off at stage 3, and with grad_dtype bf16.
#include <mpi.h>
#include <string.h>

#include "base/mpi_util.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "parallel/comm_mpi.h"
#include "train/fsdp.h"

enum { B_ = 2, T_ = 8, MICRO = 3 };

// One step's gradient shard (bytes, malloc'd) of a model with zero stage
// `stage`, split or fused.
static char *run(struct backend *be, struct comm_group *dp, int stage, enum dtype dt,
                 enum recompute r, bool reshard, enum dtype grad_dtype, bool split, size_t *bytes) {
    struct llama_config cfg = {
        .vocab_size = 64, .d_model = 32, .n_layers = 3, .n_heads = 4, .n_kv_heads = 2,
        .ffn_dim = 48, .max_seq_len = 16, .rope_theta = 10000.0, .norm_eps = 1e-5f,
        .tie_embeddings = false, .init_std = 0.05f, .qkv_bias = true,
    };
    struct model_shard shard = model_shard_full(&cfg);
    shard.n_slots = MICRO, shard.recompute = r, shard.split_backward = split, shard.n_wstash = 2;
    shard.unit_multiple = 128 * dp->size, shard.no_grad_arena = true;
    shard.no_param_arena = stage == 3;
    struct model *m;
    struct error err;
    CHECK(!model_init(&m, be, &cfg, &shard, dt, B_, T_, 5, &err), "%s", err.msg);
    struct parallel_groups groups = {.dp = dp, .zero_stage = stage};
    model_set_groups(m, &groups);
    struct optimizer_config oc = {.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 1, .steps = 10,
                                  .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    struct optimizer *opt;
    CHECK(!optimizer_init(&opt, be, m, &oc, &groups, &err), "%s", err.msg);
    struct fsdp_config fc = {stage, reshard, true, true, grad_dtype, false};
    struct fsdp *f;
    CHECK(!fsdp_init(&f, m, opt, dp, NULL, &fc, 5, &err), "%s", err.msg);
    int n = B_ * T_;
    int32_t tokens[MICRO][n], targets[MICRO][n];
    fsdp_step_begin(f);
    for (int k = 0; k < MICRO; k++) {
        for (int i = 0; i < n; i++) {
            tokens[k][i] = (i * 5 + dp->rank * 11 + k * 7) % 64;
            targets[k][i] = (i * 3 + dp->rank + k) % 64;
        }
        double loss;
        long count;
        model_forward_chunk(m, 0, k, tokens[k], NULL, targets[k], NULL, &loss, &count);
    }
    double s = 1.0 / (MICRO * n * dp->size);
    if (split) {
        model_backward_chunk_input(m, 0, 0, 0, s, NULL, NULL);
        model_backward_chunk_input(m, 0, 1, 1, s, NULL, NULL);
        model_backward_chunk_weight(m, 0, 0);
        model_backward_chunk_input(m, 0, 2, 0, s, NULL, NULL);
        model_backward_chunk_weight(m, 0, 1);
        model_backward_chunk_weight(m, 0, 0);
    } else {
        for (int k = 0; k < MICRO; k++) model_backward_chunk(m, 0, k, s, NULL, NULL);
    }
    fsdp_step_end(f);
    struct tensor g = optimizer_grad_shard(opt);
    *bytes = g.numel * dtype_size(g.dtype);
    char *out = xmalloc(*bytes);
    backend_to_host(be, out, g.data, *bytes);
    fsdp_free(f);
    optimizer_free(opt);
    model_free(m);
    return out;
}

int main(int argc, char **argv) {
    struct error start_err = {0};
    CHECK(!mpi_util_start(&argc, &argv, &start_err), "%s", start_err.msg);
    mpi_util_init(MPI_COMM_WORLD);
    struct comm_group dp;
    MPI_Comm dup;
    CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    comm_mpi_init(&dp, dup);
    struct backend *be = backend_cpu_init(1);
    int failures = 0, cases = 0;
    static const char *rname[] = {"none", "selective", "full"};
    for (int stage = 2; stage <= 3; stage++)
        for (int d = 0; d < 2; d++)
            for (enum recompute r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r += 2)
                for (int variant = 0; variant < 3; variant++) {
                    // 0: reshard, fp32 reduce; 1: keep gathered (stage 3); 2: bf16 reduce
                    if (variant == 1 && stage == 2) continue;
                    enum dtype dt = d ? DTYPE_BF16 : DTYPE_FP32;
                    bool reshard = variant != 1;
                    enum dtype gd = variant == 2 ? DTYPE_BF16 : DTYPE_FP32;
                    size_t nf, ns;
                    char *fused = run(be, &dp, stage, dt, r, reshard, gd, false, &nf);
                    char *split = run(be, &dp, stage, dt, r, reshard, gd, true, &ns);
                    bool same = nf == ns && !memcmp(fused, split, nf), nonzero = false;
                    for (size_t i = 0; i < nf; i++) nonzero |= fused[i] != 0;
                    cases++;
                    if (!same || !nonzero) {
                        failures++;
                        fprintf(stderr, "FAIL rank %d: zero_stage %d, %s, recompute %s, reshard %d, "
                                "grad_dtype %s: %s\n", dp.rank, stage, dtype_name(dt), rname[r], reshard,
                                dtype_name(gd), !nonzero ? "the fused gradient shard is all zero"
                                                         : "split and fused gradient shards differ");
                    }
                    free(fused), free(split);
                }
    backend_free(be);
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (dp.rank == 0)
        printf("fsdp split: %d cases on %d ranks, %s\n", cases, dp.size,
               failures ? "FAILED" : "gradient shards bit-identical to the fused backward");
    comm_group_free(&dp);
    MPI_Finalize();
    return failures ? 1 : 0;
}

// test_grad_sync.c: the bucketed data-parallel all-reduce of gradients
// (src/train/grad_sync.c) under mpirun (run by tests/e2e/grad_sync_mpi.sh). Every
// rank runs one backward on its own tokens with the sync armed and small
// buckets; then (1) the gradients equal the sum over ranks of each rank's
// own gradients, computed here without the sync by a second model and summed
// with a plain all-reduce, and (2) all buckets but those holding the
// embedding (completed only at the end of the backward) were started from
// the gradient-ready hook, during the backward: the overlap.
#include <math.h>
#include <mpi.h>
#include <string.h>

#include "base/mpi_util.h"
#include "model/model.h"
#include "parallel/comm_mpi.h"
#include "train/grad_sync.h"

int main(int argc, char **argv) {
    mpi_util_start(&argc, &argv);
    mpi_util_init(MPI_COMM_WORLD);
    struct comm_group dp;
    MPI_Comm dup;
    CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    comm_mpi_init(&dp, dup);
    struct backend *be = backend_cpu_init(1);
    struct llama_config cfg = {
        .vocab_size = 64, .d_model = 32, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2,
        .ffn_dim = 48, .max_seq_len = 16, .rope_theta = 10000.0, .norm_eps = 1e-5f,
        .tie_embeddings = false, .init_std = 0.02f,
    };
    struct model_shard shard = model_shard_full(&cfg);
    struct model *synced, *plain;
    struct error err;
    CHECK(!model_init(&synced, be, &cfg, &shard, DTYPE_FP32, 2, 8, 5, &err), "%s", err.msg);
    CHECK(!model_init(&plain, be, &cfg, &shard, DTYPE_FP32, 2, 8, 5, &err), "%s", err.msg);
    int32_t tokens[16], targets[16];
    for (int i = 0; i < 16; i++) tokens[i] = (i * 5 + dp.rank * 11) % 64, targets[i] = (i * 3 + dp.rank) % 64;
    size_t bucket_bytes = 4096;
    struct grad_sync *sync = grad_sync_init(synced, &dp, bucket_bytes, DTYPE_FP32);
    double loss;
    long count;
    model_zero_grad(synced), model_zero_grad(plain);
    model_forward(synced, tokens, targets, &loss, &count);
    grad_sync_arm(sync);
    model_backward(synced, 1.0 / 32);
    grad_sync_finish(sync);
    model_forward(plain, tokens, targets, &loss, &count);
    model_backward(plain, 1.0 / 32);
    struct tensor gp = model_grad_arena(plain), gs = model_grad_arena(synced);
    comm_all_reduce(&dp, gp.data, gp.numel, gp.dtype, COMM_SUM);
    double num = 0, den = 0;
    for (size_t i = 0; i < gp.numel; i++) {
        double a = ((float *)gs.data)[i], b = ((float *)gp.data)[i];
        num += (a - b) * (a - b), den += b * b;
    }
    int failures = 0;
    double rel = sqrt(num / den);
    if (!(rel <= 1e-6)) failures++, fprintf(stderr, "FAIL rank %d: synced gradients differ by %.2e\n", dp.rank, rel);
    // Buckets entirely after the embedding start during the backward.
    const struct param_info *emb = model_find_param(synced, "model.embed_tokens.weight");
    size_t emb_end = emb->offset + emb->numel, per = bucket_bytes / 4;
    int n = grad_sync_buckets(sync), early = grad_sync_started_early(sync);
    int expect = (int)((gs.numel - emb_end) / per); // buckets wholly past the embedding
    if (n < 4 || early < expect) failures++, fprintf(stderr, "FAIL rank %d: %d of %d buckets started during the backward, expected >= %d\n", dp.rank, early, n, expect);
    if (dp.rank == 0) printf("grad_sync: %d buckets, %d started during the backward (>= %d expected), gradients match to %.1e\n", n, early, expect, rel);
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    grad_sync_free(sync);
    model_free(synced), model_free(plain);
    backend_free(be);
    comm_group_free(&dp);
    MPI_Finalize();
    return failures ? 1 : 0;
}

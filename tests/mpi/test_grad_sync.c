// test_grad_sync.c: the bucketed data-parallel all-reduce of gradients
// (src/train/grad_sync.c) under mpirun (run by tests/e2e/grad_sync_mpi.sh). Every
// rank runs one backward on its own tokens with the sync armed and small
// buckets; then (1) the gradients equal the sum over ranks of each rank's
// own gradients, computed here without the sync by a second model and summed
// with a plain all-reduce, and (2) all buckets but those holding the
// embedding (completed only at the end of the backward) were started from
// the gradient-ready hook, during the backward: the overlap.
// A second case runs where the build has CUDA and a device (the emulated
// build, tests/e2e/nccl_emulated.sh): the same check on the CUDA backend
// over a NCCL group (comm_nccl.c) with 1 KiB buckets, so that more than 64
// buckets (about 140) are started during the backward before any wait, as
// a ~1B model's 167 buckets of 25 MiB are at dp = 2: the old ring of 64
// events per group failed its "more than 64 operations in flight" check.
#include <math.h>
#include <mpi.h>
#include <string.h>

#include "base/mpi_util.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/comm_mpi.h"
#include "train/grad_sync.h"
#ifdef TRIDENT_CUDA
#include "parallel/comm_nccl.h"
#endif

// One backward with the sync armed on a model on be, gradients all-reduced
// over dp in bucket_bytes buckets, against a second model's own gradients
// summed over host (an MPI group over the same ranks). min_buckets: the
// buckets the case needs to mean anything. Returns this rank's failures.
static int run_case(const char *name, struct backend *be, struct comm_group *dp,
                    struct comm_group *host, size_t bucket_bytes, int min_buckets) {
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
    for (int i = 0; i < 16; i++) tokens[i] = (i * 5 + dp->rank * 11) % 64, targets[i] = (i * 3 + dp->rank) % 64;
    struct grad_sync *sync = grad_sync_init(synced, dp, bucket_bytes, DTYPE_FP32);
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
    float *hp = xmalloc(gp.numel * sizeof(float)), *hs = xmalloc(gs.numel * sizeof(float));
    backend_to_host(be, hp, gp.data, gp.numel * sizeof(float));
    backend_to_host(be, hs, gs.data, gs.numel * sizeof(float));
    comm_all_reduce(host, hp, gp.numel, DTYPE_FP32, COMM_SUM);
    double num = 0, den = 0;
    for (size_t i = 0; i < gp.numel; i++) {
        double a = hs[i], b = hp[i];
        num += (a - b) * (a - b), den += b * b;
    }
    int failures = 0;
    double rel = sqrt(num / den);
    if (!(rel <= 1e-6)) failures++, fprintf(stderr, "FAIL %s rank %d: synced gradients differ by %.2e\n", name, dp->rank, rel);
    // Buckets entirely after the embedding start during the backward.
    const struct param_info *emb = model_find_param(synced, "model.embed_tokens.weight");
    size_t emb_end = emb->offset + emb->numel, per = bucket_bytes / 4;
    int n = grad_sync_buckets(sync), early = grad_sync_started_early(sync);
    int expect = (int)((gs.numel - emb_end) / per); // buckets wholly past the embedding
    if (n < min_buckets || early < expect) failures++, fprintf(stderr, "FAIL %s rank %d: %d of %d buckets started during the backward, expected >= %d of >= %d\n", name, dp->rank, early, n, expect, min_buckets);
    if (dp->rank == 0) printf("grad_sync %s: %d buckets, %d started during the backward (>= %d expected), gradients match to %.1e\n", name, n, early, expect, rel);
    grad_sync_free(sync);
    model_free(synced), model_free(plain);
    free(hp), free(hs);
    return failures;
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
    int failures = run_case("cpu/mpi", be, &dp, &dp, 4096, 4);
    backend_free(be);
#ifdef TRIDENT_CUDA
    if (backend_device_count() > 0) {
        int local = 0;
        MPI_Comm node;
        CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, dp.rank, MPI_INFO_NULL, &node));
        CHECK_MPI(MPI_Comm_rank(node, &local));
        MPI_Comm_free(&node);
        struct error err;
        be = backend_init(BACKEND_CUDA, local % backend_device_count(), 0, &err);
        CHECK(be, "%s", err.msg);
        struct comm_group nccl;
        comm_nccl_init(&nccl, &dp, be, "dp", false);
        failures += run_case("cuda/nccl", be, &nccl, &dp, 1024, 65);
        comm_group_free(&nccl);
        backend_free(be);
    }
#endif
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    comm_group_free(&dp);
    MPI_Finalize();
    return failures ? 1 : 0;
}

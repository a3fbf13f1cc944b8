// test_kv_decode_mpi.c: generation with a key/value cache (model_decode)
// across ranks, run by tests/e2e/kv_decode_mpi.sh on 2 ranks: the cached
// logits of a model split over the 2 ranks equal, at every position, the
// full window's forward of the whole model built on each rank alone
// (kv_decode_check.h: two rows of different lengths, a padded prefill, a
// 3-token step, then one token per step), relative error <= 1e-5 in FP32 and
// 1e-2 in BF16 (one cached key or value rounded to the neighbouring BF16
// value by oneDNN's GEMM of a few rows: tests/unit/test_kv_decode.c):
//   tp: tensor parallel 2 with sequence parallelism (a decode step turns it
//       off: every rank computes all rows, Megatron's all-reduces);
//   pp: pipeline parallel 2 with 2 virtual stages (4 layers; the step's
//       activations passed stage to stage, rank 1 -> rank 0 between chunks;
//       the logits broadcast from the last stage);
//   zbv: the same under the ZB-V placement (pipeline.h: virtual stages 0 1 2 3
//       on stages 0 1 1 0: stage 1's chunk 0 feeds its own chunk 1, stage 0
//       holds the embedding and the head, the logits broadcast from it).
// And against the full recompute of generation (kv_recompute_logits: one
// step over the whole window from an empty cache, the same layout): <= 1e-5
// in both dtypes (measured 0: the steps are batch-invariant).
// Every rank prints "<mode> <dtype>: relative error E" and checks it.
//
//   test_kv_decode_mpi tp|pp|zbv   exit 0 pass, 1 fail
#include <string.h>

#include "base/mpi_util.h"
#include "base/rng.h"
#include "kernels/backend.h"
#include "parallel/comm_mpi.h"
#include "../unit/kv_decode_check.h"

enum { V = 96 };

static struct llama_config config(void) {
    return (struct llama_config){
        .vocab_size = V, .d_model = 64, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2,
        .ffn_dim = 160, .max_seq_len = 64, .rope_theta = 10000.0, .norm_eps = 1e-5f,
        .tie_embeddings = false, .init_std = 0.05f, .label_smoothing = 0.0f,
    };
}

// The full window's logits (2, KVC_T, V) of a 2-stage pipeline model of
// microbatch (2, KVC_T) on the world's 2 ranks: each chunk in virtual-stage
// order, activations sent to the next stage, the last stage's logits
// broadcast from rank 1. malloc'd.
static double *pipeline_logits(struct model *m, enum pp_schedule kind, int rank, const int32_t *tokens) {
    int32_t targets[2 * KVC_T];
    for (int i = 0; i < 2 * KVC_T; i++) targets[i] = IGNORE_INDEX;
    size_t n = model_stage_message_numel(m);
    size_t esz = model_param_arena(m).dtype == DTYPE_BF16 ? 2 : 4;
    MPI_Datatype mt = esz == 2 ? MPI_UINT16_T : MPI_FLOAT;
    void *in = malloc(n * esz), *out = malloc(n * esz);
    double loss;
    long cnt;
    // The four virtual stages in order, each on its stage (1F1B's 0 1 1 0
    // chunks 0 0 1 1; ZB-V's stages 0 1 1 0), the message passed on by hand.
    for (int u = 0; u < 4; u++) {
        int at = pipeline_stage_of(kind, 2, u), c = u / 2;
        if (at != rank) continue;
        int from = u > 0 ? pipeline_stage_of(kind, 2, u - 1) : -1;
        if (from >= 0 && from != rank) MPI_Recv(in, (int)n, mt, from, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (from == rank) memcpy(in, out, n * esz);
        model_forward_chunk(m, c, 0, tokens, u == 0 ? NULL : in, targets, u == 3 ? NULL : out, &loss, &cnt);
        int to = u < 3 ? pipeline_stage_of(kind, 2, u + 1) : -1;
        if (to >= 0 && to != rank) MPI_Send(out, (int)n, mt, to, 5, MPI_COMM_WORLD);
    }
    int last = pipeline_last_stage(kind, 2);
    double *ref = malloc(sizeof *ref * 2 * KVC_T * V);
    if (rank == last)
        for (int b = 0; b < 2; b++)
            for (int t = 0; t < KVC_T; t++) model_get_logits_at(m, b, t, ref + ((size_t)b * KVC_T + t) * V);
    MPI_Bcast(ref, 2 * KVC_T * V, MPI_DOUBLE, last, MPI_COMM_WORLD);
    free(in), free(out);
    return ref;
}

int main(int argc, char **argv) {
    struct error err = {0};
    CHECK(!mpi_util_start(&argc, &argv, &err), "%s", err.msg);
    mpi_util_init(MPI_COMM_WORLD);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    bool tp = argc == 2 && !strcmp(argv[1], "tp"), zbv = argc == 2 && !strcmp(argv[1], "zbv");
    bool pp = zbv || (argc == 2 && !strcmp(argv[1], "pp"));
    enum pp_schedule kind = zbv ? PP_SCHEDULE_ZBV : PP_SCHEDULE_1F1B;
    if ((!tp && !pp) || size != 2) mpi_exit_all(STATUS_BAD_INPUT, "usage: mpirun -np 2 test_kv_decode_mpi tp|pp|zbv");
    struct comm_group world;
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    comm_mpi_init(&world, dup);
    int32_t tokens[2 * KVC_T];
    uint64_t s = 11;
    for (int i = 0; i < 2 * KVC_T; i++) tokens[i] = (int32_t)((s = rng_splitmix64(s)) >> 33) % V;
    struct llama_config cfg = config();
    struct backend *be = backend_cpu_init(1);
    const enum dtype dts[2] = {DTYPE_FP32, DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        struct model_shard whole = model_shard_full(&cfg), part = whole;
        if (tp) {
            part.tp_rank = rank, part.tp_size = 2, part.sequence_parallel = true;
        } else {
            part = model_shard_pipeline(&cfg, kind, 2, rank, 2);
        }
        struct model *full, *dec;
        struct parallel_groups g = {0};
        if (tp) g.tp = &world;
        else g.pp = &world;
        // The reference: the same layout's full window (in BF16 a TP sum or
        // a stage boundary rounds where the whole model does not).
        CHECK(!model_init(&full, be, &cfg, &part, dts[d], 2, KVC_T, 7, &err), "%s", err.msg);
        model_set_groups(full, &g);
        CHECK(!model_init(&dec, be, &cfg, &part, dts[d], 2, 24, 7, &err), "%s", err.msg); // SP: 24 rows a rank
        model_set_groups(dec, &g);
        CHECK(!model_kv_cache_init(dec, 2, KVC_LEN, &err), "%s", err.msg);
        // the recompute's step holds the whole window: (2, KVC_T) rows on
        // each rank, so no sequence sharding of the microbatch under tp
        struct model *rec = full;
        if (tp) {
            struct model_shard whole_rows = part;
            whole_rows.sequence_parallel = false;
            CHECK(!model_init(&rec, be, &cfg, &whole_rows, dts[d], 2, KVC_T, 7, &err), "%s", err.msg);
            model_set_groups(rec, &g);
        }
        CHECK(!model_kv_cache_init(rec, 2, KVC_LEN, &err), "%s", err.msg);
        double *ref = tp ? kv_full_logits(full, tokens, V) : pipeline_logits(full, kind, rank, tokens);
        double e = kv_decode_vs(ref, dec, tokens, V);
        free(ref);
        // and the full recompute (one generation step over the window): the
        // same bits (batch-invariant steps, the same collectives per row)
        ref = kv_recompute_logits(rec, tokens, V);
        if (rec != full) model_free(rec);
        double e_rec = kv_decode_vs(ref, dec, tokens, V);
        free(ref);
        printf("rank %d: %s %s: cached logits against the full window: relative error %.3e; "
               "against the full recompute: %.3e\n", rank, tp ? "tp 2 + sp" : zbv ? "pp 2 (ZB-V: stage 0 holds both ends)" : "pp 2 (2 virtual stages)",
               dtype_name(dts[d]), e, e_rec);
        double tol = dts[d] == DTYPE_BF16 ? 1e-2 : 1e-5;
        EXPECT(e <= tol, "rank %d %s: relative error %.3e > %.0e", rank, dtype_name(dts[d]), e, tol);
        EXPECT(e_rec <= 1e-5, "rank %d %s: against the full recompute: relative error %.3e > 1e-5",
               rank, dtype_name(dts[d]), e_rec);
        model_free(full), model_free(dec);
    }
    backend_free(be);
    int failed = test_failures, any;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    comm_group_free(&world);
    MPI_Finalize();
    return any ? 1 : 0;
}

// ckpt_driver.c: saves and loads checkpoints for tests/e2e/ckpt_crash.sh.
//
//   mpirun -np 4 ckpt_driver save DIR   layout tp=2 x dp=2 (ZeRO-1): saves
//       steps 1, 2, 3 with keep_last=2; rank 0 prints "committed step S" after
//       each save returned OK on every rank, and every rank prints
//       "calls rank R after step S: N" (its storage calls so far).
//       TRIDENT_FAULT (src/ckpt/durable.h) kills or fails a storage call.
//   mpirun -np 4 ckpt_driver asave DIR  the same saves asynchronously
//       (checkpoint_save_begin with a copy, then the arrays are overwritten
//       as training would): steps 1 and 3 poll every rank's background
//       work (an all-reduce) and advance once all are done (the writes
//       agreed, then rank 0's commit); step 2 stays in flight until step
//       3's save arrives and commits it first.
//   ckpt_driver load DIR                one rank (another layout: resharding):
//       resumes from DIR/latest, checks every tensor against the closed form
//       of its step, prints "loaded step S" (or "loaded none"), exit 0; a
//       bad checkpoint: the message and exit 2; a wrong value: exit 1.
//
// Tensors (values: step * 1000 + row * 10 + col + 0.5, exact in fp32), W
// and NORM two tensors of `model` (ckpt verify checks a checkpoint holds
// exactly its manifest's model's tensors):
//   param/W    (8, 8)  row block t of 4 rows on TP rank t, whole on each DP rank
//   adam_m/W, adam_v/W (8, 8): row block t, flat halves by DP rank (ZeRO-1)
//   param/NORM (8, 1)  replicated on every rank
//   every other tensor of the model (param/, adam_m/, adam_v/): zeros, whole,
//   on rank 0 (not checked on load)
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mpi_util.h"
#include "ckpt/checkpoint.h"
#include "ckpt/durable.h"
#include "parallel/comm_mpi.h"
#include "train/train_state.h"

enum { GR = 8, GC = 8 };
#define W "model.layers.0.self_attn.q_proj.weight"
#define NORM "model.norm.weight"

static const struct llama_config model = {.vocab_size = 64, .d_model = 8, .n_layers = 1,
                                          .n_heads = 2, .n_kv_heads = 2, .ffn_dim = 12,
                                          .max_seq_len = 16, .rope_theta = 10000,
                                          .norm_eps = 1e-5f};

static float value(int64_t step, int tensor, int r, int c) {
    return (float)(step * 1000 + tensor * 100000 + r * 10 + c) + 0.5f;
}

static int failed;

// After the save of step returned st on this rank: the lines the test reads.
static int report(int rank, int64_t step, enum status st, const struct error *err) {
    printf("calls rank %d after step %lld: %ld\n", rank, (long long)step, durable_calls());
    if (st) {
        fprintf(stderr, "[rank %d] save failed: %s\n", rank, err->msg);
        return failed = 1;
    }
    if (rank == 0) printf("committed step %lld\n", (long long)step);
    fflush(stdout);
    return 0;
}

static int save(const char *dir, int rank, struct comm_group *world, bool async) {
    int t = rank % 2, d = rank / 2, n_params;
    struct ckpt_async *inflight = NULL;
    struct param_info *params;
    struct error perr = {0};
    CHECK(!model_param_table(&model, &params, &n_params, &perr), "%s", perr.msg);
    static float zeros[64 * GC]; // the largest tensor: (vocab_size, d_model)
    for (int64_t step = 1; step <= 3; step++) {
        float w[4 * GC], m[2 * GC], v[2 * GC], norm[GC];
        for (int f = 0; f < 4 * GC; f++) w[f] = value(step, 0, 4 * t + f / GC, f % GC);
        for (int f = 0; f < 2 * GC; f++) {
            int g = 2 * GC * d + f;
            m[f] = value(step, 1, 4 * t + g / GC, g % GC);
            v[f] = value(step, 2, 4 * t + g / GC, g % GC);
        }
        for (int i = 0; i < GC; i++) norm[i] = value(step, 3, i, 0);
        struct ckpt_piece *p = xcalloc(4 + 3 * (size_t)n_params, sizeof *p);
        p[0] = (struct ckpt_piece){"param/" W, GR, GC, 4 * t, 0, 4, GC, 0, 4 * GC, DTYPE_FP32, w};
        p[1] = (struct ckpt_piece){"adam_m/" W, GR, GC, 4 * t, 0, 4, GC, 2 * GC * d, 2 * GC * d + 2 * GC, DTYPE_FP32, m};
        p[2] = (struct ckpt_piece){"adam_v/" W, GR, GC, 4 * t, 0, 4, GC, 2 * GC * d, 2 * GC * d + 2 * GC, DTYPE_FP32, v};
        p[3] = (struct ckpt_piece){"param/" NORM, GC, 1, 0, 0, GC, 1, 0, GC, DTYPE_FP32, norm};
        int n_pieces = 4;
        static const char *prefixes[3] = {"param", "adam_m", "adam_v"};
        for (int i = 0; rank == 0 && i < n_params; i++)
            for (int k = 0; k < 3; k++) {
                const struct param_info *q = &params[i];
                if (!strcmp(q->name, W) || (k == 0 && !strcmp(q->name, NORM))) continue;
                struct ckpt_piece *x = &p[n_pieces++];
                snprintf(x->name, sizeof x->name, "%s/%s", prefixes[k], q->name);
                x->grows = x->rows = q->grows, x->gcols = x->cols = q->gcols;
                x->flat_end = (size_t)q->grows * (size_t)q->gcols;
                x->dtype = DTYPE_FP32, x->data = zeros;
            }
        // The trainer's state, as its owners' entries (an asynchronous save
        // copies their values: s may change once begin returned).
        struct trainer_saved s = {.progress = {.lr_step = step, .rng_seed = 1},
                                  .opt = {.opt_steps = step, .has_schedule = true, .steps = 100, .lr = 1e-3},
                                  .scaler = {.scale = 1}, .loader = {.format = 2, .sample = (uint64_t)step}};
        loader_saved_pack(&s.loader, &s.loader_saved);
        struct state_entry e[TRAINER_STATE_MAX_ENTRIES];
        int n_e = trainer_state_entries(&s, e, TRAINER_STATE_MAX_ENTRIES);
        struct ckpt_save_args a = {.dir = dir, .step = step, .layout = topology_layout(2, 1, 2, 0, 1),
                                   .zero_stage = 1, .rank = rank, .model = &model,
                                   .tokenizer_id = "test-bpe", .pieces = p, .n_pieces = n_pieces,
                                   .entries = e, .n_entries = n_e, .keep_last = 2};
        struct error err = {0};
        enum status st;
        if (!async) {
            st = checkpoint_save(&a, world, &err);
            free(p);
            if (report(rank, step, st, &err)) break;
            continue;
        }
        if (inflight) { // step 3's save arrives while step 2's is written
            int64_t was = checkpoint_save_step(inflight);
            st = checkpoint_save_finish(inflight, world, NULL, &err);
            inflight = NULL;
            if (report(rank, was, st, &err)) break;
        }
        struct ckpt_async *h;
        st = checkpoint_save_begin(&a, true, world, &h, &err);
        free(p);
        if (st && report(rank, step, st, &err)) break;
        // Training goes on: the arrays change while the writer writes.
        for (int f = 0; f < 4 * GC; f++) w[f] = -1;
        for (int f = 0; f < 2 * GC; f++) m[f] = v[f] = -1;
        for (int i = 0; i < GC; i++) norm[i] = -1;
        if (step == 2) {
            inflight = h;
            continue;
        }
        st = STATUS_OK;
        while (h && !st) { // the trainer's step boundaries: any rank's background work running, any failed
            int mine = checkpoint_save_writer_state(h), flags[2] = {mine == 0, mine == 2};
            comm_all_reduce(world, flags, 2, DTYPE_I32, COMM_MAX);
            if (!flags[0] || flags[1]) st = checkpoint_save_advance(&h, world, NULL, &err);
            else usleep(1000);
        }
        if (report(rank, step, st, &err)) break;
    }
    free(params);
    return failed;
}


static int load(const char *dir) {
    char path[CKPT_PATH_MAX];
    struct error err = {0};
    struct ckpt_reader *r;
    if (checkpoint_resolve(dir, RESUME_AUTO, NULL, path, &err) ||
        (path[0] && (checkpoint_open(path, &r, &err) ||
                     checkpoint_check_model(r, &model, "test-bpe", &err)))) {
        fprintf(stderr, "load: %s\n", err.msg);
        return err.status;
    }
    if (!path[0]) {
        printf("loaded none\n");
        return 0;
    }
    struct trainer_saved s;
    if (trainer_state_verify(r, &err) || trainer_state_read(r, -1, &s, &err)) {
        fprintf(stderr, "load: %s\n", err.msg);
        return err.status;
    }
    int64_t step = checkpoint_info(r)->step;
    int bad = s.progress.lr_step != step || s.opt.opt_steps != step || s.loader.sample != (uint64_t)step;
    static const char *names[3] = {"param/" W, "adam_m/" W, "adam_v/" W};
    for (int k = 0; k < 3; k++) {
        // A column block of width 4 at column 1, its flat range [5, 30).
        float buf[32];
        struct ckpt_piece want = {"", GR, GC, 0, 1, GR, 4, 5, 32, DTYPE_FP32, buf};
        snprintf(want.name, sizeof want.name, "%s", names[k]);
        if (checkpoint_read_piece(r, &want, &err)) {
            fprintf(stderr, "load: %s\n", err.msg);
            return err.status;
        }
        for (int f = 5; f < 32; f++)
            if (buf[f - 5] != value(step, k, f / 4, 1 + f % 4)) bad++;
    }
    float norm[GC];
    struct ckpt_piece want = {"param/" NORM, GC, 1, 0, 0, GC, 1, 0, GC, DTYPE_FP32, norm};
    if (checkpoint_read_piece(r, &want, &err)) {
        fprintf(stderr, "load: %s\n", err.msg);
        return err.status;
    }
    for (int i = 0; i < GC; i++) bad += norm[i] != value(step, 3, i, 0);
    checkpoint_close(r);
    if (bad) {
        fprintf(stderr, "load: step %lld: %d values differ from the closed form\n",
                (long long)step, bad);
        return 1;
    }
    printf("loaded step %lld\n", (long long)step);
    return 0;
}

int main(int argc, char **argv) {
    struct error start_err = {0};
    CHECK(!mpi_util_start(&argc, &argv, &start_err), "%s", start_err.msg);
    mpi_util_init(MPI_COMM_WORLD);
    int rank, size, rc = 2;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    bool async = argc == 3 && !strcmp(argv[1], "asave");
    if (argc == 3 && (!strcmp(argv[1], "save") || async) && size == 4) {
        struct comm_group world;
        MPI_Comm dup;
        CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
        comm_mpi_init(&world, dup);
        rc = save(argv[2], rank, &world, async);
        comm_group_free(&world);
    } else if (argc == 3 && !strcmp(argv[1], "load") && size == 1) {
        rc = load(argv[2]);
    } else {
        fprintf(stderr, "usage: mpirun -np 4 ckpt_driver save|asave DIR | ckpt_driver load DIR\n");
    }
    MPI_Finalize();
    return rc;
}

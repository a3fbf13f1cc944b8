// train_ckpt.c: the trainer's checkpoints (docs/design.md §7): what a rank saves,
// and resuming from a checkpoint written in any (tp, pp, dp, zero) layout.
// The format and the commit protocol are in checkpoint.c.
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "base/mpi_util.h"
#include "trainer.h"

// Host buffers for the parameter arena and this rank's moments (allocated on
// first use: a run that never saves nor resumes does not pay for them).
static void host_buffers(struct trainer *t) {
    if (t->host_params) return;
    int n;
    model_params(t->model, &n);
    size_t zb, ze;
    optimizer_shard_range(t->opt, &zb, &ze);
    t->host_params = xcalloc(model_param_arena(t->model).numel, sizeof(float));
    t->host_m = xcalloc(ze - zb, sizeof(float));
    t->host_v = xcalloc(ze - zb, sizeof(float));
    t->pieces = xcalloc(3 * (size_t)n, sizeof *t->pieces);
}

// Fills t->pieces: parameters (when with_params) and this rank's moments
// (when with_moments); returns how many.
static int pieces(struct trainer *t, bool with_params, bool with_moments) {
    int n, k = 0;
    const struct param_info *p = model_params(t->model, &n);
    size_t zb, ze;
    optimizer_shard_range(t->opt, &zb, &ze);
    if (with_params)
        k += checkpoint_pieces_from_params(p, n, "param", t->host_params, DTYPE_FP32, 0, SIZE_MAX,
                                           t->pieces + k);
    if (with_moments) {
        k += checkpoint_pieces_from_params(p, n, "adam_m", t->host_m, DTYPE_FP32, zb, ze, t->pieces + k);
        k += checkpoint_pieces_from_params(p, n, "adam_v", t->host_v, DTYPE_FP32, zb, ze, t->pieces + k);
    }
    return k;
}

void trainer_save(struct trainer *t, int steps_done) {
    const struct config *c = &t->cfg;
    struct error err = {0};
    host_buffers(t);
    struct tensor w = model_param_arena(t->model), m, v;
    optimizer_moments(t->opt, &m, &v);
    backend_to_host(t->be, t->host_params, w.data, w.numel * sizeof(float));
    backend_to_host(t->be, t->host_m, m.data, m.numel * sizeof(float));
    backend_to_host(t->be, t->host_v, v.data, v.numel * sizeof(float));
    // DP replicas hold the same parameters (and, without ZeRO, moments): DP
    // rank 0 writes them; under ZeRO-1 every DP rank writes its moment shard.
    bool first_replica = t->topo.coord.d == 0;
    int n = pieces(t, first_replica, first_replica || c->parallel.zero_stage == 1);
    struct ckpt_state st = {
        .step = steps_done, .lr_step = steps_done, .opt_steps = optimizer_steps_done(t->opt),
        .rng_seed = (uint64_t)c->train.seed, .loss_scale = 1.0,
    };
    loader_state_save(&t->train_loader, &st.loader);
    struct ckpt_save_args a = {
        .dir = c->checkpoint.dir, .step = steps_done, .tp = c->parallel.tp, .pp = c->parallel.pp,
        .dp = c->parallel.dp, .zero_stage = c->parallel.zero_stage, .rank = t->topo.world_rank,
        .model = &t->lc, .tokenizer_id = t->ds->index.tokenizer, .pieces = t->pieces,
        .n_pieces = n, .state = &st, .keep_last = c->checkpoint.keep_last,
    };
    double t0 = time_now_s();
    if (checkpoint_save(&a, &t->topo.world, &err)) {
        err.status = STATUS_RUNTIME;
        trainer_fail_all(t, &err);
    }
    t->last_saved = steps_done;
    watchdog_kick(t->watchdog);
    if (t->topo.world_rank == 0) {
        printf("checkpoint: %s/step-%06d saved in %.2f s\n", c->checkpoint.dir, steps_done,
               time_now_s() - t0);
        fflush(stdout);
    }
}

void trainer_resume(struct trainer *t) {
    const struct config *c = &t->cfg;
    struct error err = {0};
    char path[CKPT_PATH_MAX];
    t->start_step = 0, t->last_saved = -1;
    if (!c->checkpoint.dir[0] && c->checkpoint.resume != RESUME_PATH) return;
    if (checkpoint_resolve(c->checkpoint.dir, c->checkpoint.resume, c->checkpoint.resume_path,
                           path, &err))
        trainer_fail_all(t, &err);
    // A fresh run must not share a folder with another run's checkpoints:
    // rotation would delete one run's steps to keep the other's.
    char latest[CONFIG_PATH_MAX + 16];
    snprintf(latest, sizeof latest, "%s/latest", c->checkpoint.dir);
    if (c->checkpoint.resume == RESUME_NONE && c->checkpoint.dir[0] && access(latest, F_OK) == 0) {
        error_set(&err, STATUS_BAD_INPUT, "[checkpoint] dir = %s already holds checkpoints (%s) "
                  "and resume = none: give this run its own dir, or resume = auto to continue "
                  "that run", c->checkpoint.dir, latest);
        trainer_fail_all(t, &err);
    }
    if (!path[0]) return;
    // Rank 0 verifies every checksum once; the others trust its verdict.
    struct ckpt_reader *r = NULL;
    int verdict = 0;
    if (t->topo.world_rank == 0) verdict = checkpoint_open(path, &r, &err);
    comm_all_reduce(&t->topo.world, &verdict, 1, DTYPE_I32, COMM_MAX);
    if (verdict) {
        if (t->topo.world_rank == 0) mpi_exit_all(verdict, err.msg);
        mpi_exit_all(verdict, NULL);
    }
    if (t->topo.world_rank != 0 && checkpoint_open_trusted(path, &r, &err)) trainer_fail_here(&err);
    if (checkpoint_check_model(r, &t->lc, t->ds->index.tokenizer, &err)) trainer_fail_all(t, &err);
    host_buffers(t);
    struct tensor w = model_param_arena(t->model), m, v;
    optimizer_moments(t->opt, &m, &v);
    memset(t->host_params, 0, w.numel * sizeof(float)); // vocab padding and arena gaps stay 0
    int n = pieces(t, true, true);
    if (checkpoint_read_pieces(r, t->pieces, n, &err)) trainer_fail_here(&err);
    struct ckpt_state st;
    if (checkpoint_read_state(r, -1, &st, &err)) trainer_fail_here(&err);
    if (loader_state_load(&t->train_loader, &st.loader, &err)) trainer_fail_all(t, &err);
    backend_to_device(t->be, w.data, t->host_params, w.numel * sizeof(float));
    backend_to_device(t->be, m.data, t->host_m, m.numel * sizeof(float));
    backend_to_device(t->be, v.data, t->host_v, v.numel * sizeof(float));
    optimizer_set_steps_done(t->opt, (int)st.opt_steps);
    const struct ckpt_info *info = checkpoint_info(r);
    if (t->topo.world_rank == 0) {
        printf("resumed from %s: step %lld, saved in layout tp %d x pp %d x dp %d (zero_stage %d)\n",
               path, (long long)st.step, info->tp, info->pp, info->dp, info->zero_stage);
        fflush(stdout);
    }
    t->start_step = (int)st.step, t->last_saved = (int)st.step;
    checkpoint_close(r);
}

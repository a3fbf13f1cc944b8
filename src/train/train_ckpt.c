// train_ckpt.c: the trainer's checkpoints (docs/design.md §7): what a rank saves,
// and resuming from a checkpoint written in any (tp, pp, dp, zero) layout.
// The format and the commit protocol are in src/ckpt/checkpoint.c.
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "trainer.h"

// The "param" tensors of a checkpoint are FP32 master values: the parameter
// arena of an FP32 model, the optimizer's master weights of a BF16/FP16 one
// (ZeRO-1 shards those with the moments). So a checkpoint resumes in any dtype.
static bool has_master(struct trainer *t) { return optimizer_master(t->m.opt).numel > 0; }

// Host buffers for the parameter arena and this rank's moments (allocated on
// first use: a run that never saves nor resumes does not pay for them).
static void host_buffers(struct trainer *t) {
    if (t->ckpt.host_params) return;
    int n;
    model_params(t->m.model, &n);
    size_t zb, ze;
    optimizer_shard_range(t->m.opt, &zb, &ze);
    t->ckpt.host_params = xcalloc(model_param_arena(t->m.model).numel, sizeof(float));
    if (has_master(t)) t->ckpt.host_master = xcalloc(ze - zb, sizeof(float));
    t->ckpt.host_m = xcalloc(ze - zb, sizeof(float));
    t->ckpt.host_v = xcalloc(ze - zb, sizeof(float));
    t->ckpt.pieces = xcalloc(3 * (size_t)n, sizeof *t->ckpt.pieces);
}

// Fills t->ckpt.pieces: parameters (when with_params) and this rank's moments
// (when with_moments); returns how many. Parameters come from (or go to)
// the whole arena in host_params, or with from_master this rank's range of
// the master weights in host_master (saving a BF16/FP16 model).
static int pieces(struct trainer *t, bool with_params, bool from_master, bool with_moments) {
    int n, k = 0;
    const struct param_info *p = model_params(t->m.model, &n);
    size_t zb, ze;
    optimizer_shard_range(t->m.opt, &zb, &ze);
    if (with_params && from_master)
        k += checkpoint_pieces_from_params(p, n, "param", t->ckpt.host_master, DTYPE_FP32, zb, ze,
                                           t->ckpt.pieces + k);
    else if (with_params)
        k += checkpoint_pieces_from_params(p, n, "param", t->ckpt.host_params, DTYPE_FP32, 0, SIZE_MAX,
                                           t->ckpt.pieces + k);
    if (with_moments) {
        k += checkpoint_pieces_from_params(p, n, "adam_m", t->ckpt.host_m, DTYPE_FP32, zb, ze, t->ckpt.pieces + k);
        k += checkpoint_pieces_from_params(p, n, "adam_v", t->ckpt.host_v, DTYPE_FP32, zb, ze, t->ckpt.pieces + k);
    }
    return k;
}

enum status trainer_save(struct trainer *t, int steps_done, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    host_buffers(t);
    struct tensor w = model_param_arena(t->m.model), m, v;
    optimizer_moments(t->m.opt, &m, &v);
    bool master = has_master(t);
    if (master) {
        struct tensor mw = optimizer_master(t->m.opt);
        backend_to_host(t->m.be, t->ckpt.host_master, mw.data, mw.numel * sizeof(float));
    } else {
        backend_to_host(t->m.be, t->ckpt.host_params, w.data, w.numel * sizeof(float));
    }
    backend_to_host(t->m.be, t->ckpt.host_m, m.data, m.numel * sizeof(float));
    backend_to_host(t->m.be, t->ckpt.host_v, v.data, v.numel * sizeof(float));
    // DP replicas hold the same parameters (and, without ZeRO, moments): DP
    // rank 0 writes them; under ZeRO-1 every DP rank writes its moment shard
    // (and its master-weight shard of a BF16/FP16 model).
    bool first_replica = t->par.topo.coord.d == 0, zero = c->parallel.zero_stage == 1;
    int n = pieces(t, first_replica || (master && zero), master, first_replica || zero);
    struct ckpt_state st = {
        .step = steps_done, .lr_step = t->progress.lr_step,
        .opt_steps = optimizer_steps_done(t->m.opt), .rng_seed = (uint64_t)c->train.seed,
        .loss_scale = t->par.ctx.scaler ? t->scaler.scale : 0.0,
        .loss_scale_good_steps = t->par.ctx.scaler ? t->scaler.good_steps : 0,
        .skipped_steps = t->progress.skipped_steps,
        .consecutive_skips = t->progress.consecutive_skips,
    };
    loader_state_save(&t->data.train_loader, &st.loader);
    struct ckpt_save_args a = {
        .dir = c->checkpoint.dir, .step = steps_done, .tp = c->parallel.tp, .pp = c->parallel.pp,
        .dp = c->parallel.dp, .zero_stage = c->parallel.zero_stage, .rank = t->par.topo.world_rank,
        .model = &t->m.lc, .tokenizer_id = t->data.ds->index.tokenizer, .pieces = t->ckpt.pieces,
        .n_pieces = n, .state = &st, .keep_last = c->checkpoint.keep_last,
    };
    double t0 = time_now_s();
    // An error on every rank (checkpoint_save agrees on it), whatever its cause: a runtime failure.
    if (checkpoint_save(&a, &t->par.topo.world, &err->err))
        return err->err.status = STATUS_RUNTIME;
    watchdog_kick(t->watchdog);
    snprintf(t->ckpt.last, sizeof t->ckpt.last, "%s/step-%06d", c->checkpoint.dir, steps_done);
    if (t->par.topo.world_rank == 0) {
        printf("checkpoint: %s saved in %.2f s\n", t->ckpt.last, time_now_s() - t0);
        fflush(stdout);
    }
    return STATUS_OK;
}

// Reads the checkpoint at path into the model, the optimizer and the train
// loader; fills st. Errors of the checkpoint's content are every rank's, read
// failures this rank's alone.
static enum status resume_from(struct trainer *t, const char *path, struct ckpt_state *st,
                               struct trainer_error *err) {
    // Rank 0 verifies every checksum once; the others trust its verdict.
    struct ckpt_reader *r = NULL;
    int verdict = 0;
    bool root = t->par.topo.world_rank == 0;
    if (root) verdict = checkpoint_open(path, &r, &err->err);
    comm_all_reduce(&t->par.topo.world, &verdict, 1, DTYPE_I32, COMM_MAX);
    if (verdict) { // rank 0 holds the message
        if (!root) err->err.msg[0] = '\0';
        return err->err.status = (enum status)verdict;
    }
    if (!root && checkpoint_open_trusted(path, &r, &err->err)) return trainer_alone(err);
    enum status s = STATUS_OK;
    if (checkpoint_check_model(r, &t->m.lc, t->data.ds->index.tokenizer, &err->err)) {
        s = err->err.status;
        goto out;
    }
    host_buffers(t);
    struct tensor w = model_param_arena(t->m.model), m, v;
    optimizer_moments(t->m.opt, &m, &v);
    memset(t->ckpt.host_params, 0, w.numel * sizeof(float)); // vocab padding and arena gaps stay 0
    int n = pieces(t, true, false, true);
    if (checkpoint_read_pieces(r, t->ckpt.pieces, n, &err->err) ||
        checkpoint_read_state(r, -1, st, &err->err)) {
        s = trainer_alone(err);
        goto out;
    }
    if (loader_state_load(&t->data.train_loader, &st->loader, &err->err)) {
        s = err->err.status;
        goto out;
    }
    if (has_master(t)) { // the FP32 values are the master weights; the model gets them rounded
        struct tensor mw = optimizer_master(t->m.opt);
        size_t zb, ze;
        optimizer_shard_range(t->m.opt, &zb, &ze);
        backend_to_device(t->m.be, mw.data, t->ckpt.host_params + zb, mw.numel * sizeof(float));
        void *tmp = backend_alloc(t->m.be, w.numel * sizeof(float));
        if (!tmp) {
            error_set(&err->err, STATUS_RUNTIME, "resume: out of %s memory for %zu bytes of "
                      "staging", t->m.be->ops->name, w.numel * sizeof(float));
            s = trainer_alone(err);
            goto out;
        }
        backend_to_device(t->m.be, tmp, t->ckpt.host_params, w.numel * sizeof(float));
        backend_copy(t->m.be, w, tensor_view(tmp, DTYPE_FP32, w.numel), w.numel);
        backend_synchronize(t->m.be);
        backend_dealloc(t->m.be, tmp);
    } else {
        backend_to_device(t->m.be, w.data, t->ckpt.host_params, w.numel * sizeof(float));
    }
    backend_to_device(t->m.be, m.data, t->ckpt.host_m, m.numel * sizeof(float));
    backend_to_device(t->m.be, v.data, t->ckpt.host_v, v.numel * sizeof(float));
    optimizer_set_steps_done(t->m.opt, (int)st->opt_steps);
    const struct ckpt_info *info = checkpoint_info(r);
    if (root) {
        const struct loader_state *ls = &t->data.train_loader.state;
        char change[160] = "";
        uint64_t old_g = st->loader.global_batch_size, new_g = ls->global_batch_size;
        if (st->loader.format < 2)
            snprintf(change, sizeof change, " (a batch-index loader state of an older checkpoint, "
                     "converted with this run's global_batch_size)");
        else if (old_g && old_g != new_g)
            snprintf(change, sizeof change, " ([train] global_batch_size changed from %llu to %llu: "
                     "the next unconsumed sample)", (unsigned long long)old_g, (unsigned long long)new_g);
        printf("resumed from %s: step %lld, saved in layout tp %d x pp %d x dp %d (zero_stage %d); "
               "data continues at epoch %llu, sample %llu%s\n",
               path, (long long)st->step, info->tp, info->pp, info->dp, info->zero_stage,
               (unsigned long long)ls->epoch, (unsigned long long)ls->sample, change);
        fflush(stdout);
    }
out:
    checkpoint_close(r);
    return s;
}

enum status trainer_resume(struct trainer *t, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    char path[CKPT_PATH_MAX];
    t->ckpt.start_step = 0;
    if (!c->checkpoint.dir[0] && c->checkpoint.resume != RESUME_PATH) return STATUS_OK;
    if (checkpoint_resolve(c->checkpoint.dir, c->checkpoint.resume, c->checkpoint.resume_path,
                           path, &err->err))
        return err->err.status;
    // A fresh run must not share a folder with another run's checkpoints:
    // rotation would delete one run's steps to keep the other's.
    char latest[CONFIG_PATH_MAX + 16];
    snprintf(latest, sizeof latest, "%s/latest", c->checkpoint.dir);
    if (c->checkpoint.resume == RESUME_NONE && c->checkpoint.dir[0] && access(latest, F_OK) == 0)
        return error_set(&err->err, STATUS_BAD_INPUT, "[checkpoint] dir = %s already holds "
                         "checkpoints (%s) and resume = none: give this run its own dir, or "
                         "resume = auto to continue that run", c->checkpoint.dir, latest);
    if (!path[0]) return STATUS_OK;
    struct ckpt_state st;
    enum status s = resume_from(t, path, &st, err);
    if (s) return s;
    t->ckpt.start_step = (int)st.step;
    // Checkpoints before skipped steps existed hold lr_step = step and no skip counts (0).
    t->progress = (struct trainer_progress){(int)st.lr_step, (int)st.skipped_steps,
                                            (int)st.consecutive_skips};
    // A dynamic fp16 scale continues where it was; one saved without a
    // scaler (0: bf16 or fp32) leaves this run's initial scale.
    if (t->par.ctx.scaler && t->scaler.dynamic && st.loss_scale > 0)
        t->scaler.scale = st.loss_scale, t->scaler.good_steps = (int)st.loss_scale_good_steps;
    snprintf(t->ckpt.last, sizeof t->ckpt.last, "%s", path);
    return STATUS_OK;
}

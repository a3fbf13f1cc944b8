// train_ckpt.c: the trainer's checkpoints (docs/design.md §7): what a rank saves,
// and resuming from a checkpoint written in any (tp, pp, dp, zero) layout.
// The format and the commit protocol are in src/ckpt/checkpoint.c.
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "tokenizer/tokenizer.h"
#include "trainer.h"

// The "param" tensors of a checkpoint are FP32 master values: the parameter
// arena of an FP32 model, the optimizer's master weights of a BF16/FP16 one
// (ZeRO-1 shards those with the moments). So a checkpoint resumes in any dtype.
static bool has_master(struct trainer *t) { return optimizer_master(t->m.opt).numel > 0; }

// ZeRO-2/3: every DP rank saves the parameters of its ranges (optimizer_ranges).
// Appends to checkpoint_check_tokenizer's mismatch message ("... but the
// run's data uses ...", two identities) where the run's tokenizer comes from:
// the dataset folder whose index.ini records it and the [data] tokenizer file
// checked against it (or the folder's own tokenizer.json), so a user sees
// which setting to change (configs/sft-tiny.ini names the KJV tokenizer).
static void tokenizer_origin(const struct trainer *t, struct error *e) {
    if (!strstr(e->msg, "but the run's data uses")) return;
    const struct config *c = &t->cfg;
    size_t k = strlen(e->msg);
    snprintf(e->msg + k, sizeof e->msg - k, " (the run's data: %s, prepared with %s%s%s; the checkpoint was "
             "trained with another tokenizer: prepare the data with that one, or start without init_from)",
             t->data.ds->dir, c->data.tokenizer[0] ? "[data] tokenizer = " : "", c->data.tokenizer[0] ?
             c->data.tokenizer : t->data.ds->dir, c->data.tokenizer[0] ? "" : "/tokenizer.json");
}

static bool units_sharded(const struct trainer *t) { return t->cfg.parallel.zero_stage >= 2; }
// ZeRO-3 also reads only its ranges' parameters (into host_master): no host
// copy of the whole model either.
static bool params_by_range(const struct trainer *t) { return t->cfg.parallel.zero_stage == 3; }

// The table of pieces a save or a load fills (3 per parameter tensor at
// most, and one per FP8 block).
static void piece_table(struct trainer *t) {
    int n;
    model_params(t->m.model, &n);
    if (!t->ckpt.pieces)
        t->ckpt.pieces = xcalloc(3 * (size_t)n + (size_t)model_fp8_blocks(t->m.model), sizeof *t->ckpt.pieces);
}

// The FP8 scaling state is the model's (model.h): checkpointed under delayed
// scaling, where it carries from step to step (current scaling keeps none).
static bool fp8_saves(const struct trainer *t) {
    return model_fp8_blocks(t->m.model) > 0 && t->cfg.precision.fp8_scaling == FP8_SCALING_DELAYED;
}

static void fp8_piece_name(char *name, int layer) {
    snprintf(name, CKPT_NAME_MAX, "%s/model.layers.%d", MODEL_FP8_STATE_PREFIX, layer);
}

// The pieces of the FP8 scaling state (one whole (MODEL_FP8_TENSORS, cols)
// tensor per FP8 block of this rank), copied into host_fp8: written by TP
// rank 0 of the gradient group's rank 0 (every rank of the TP and gradient
// groups holds the same state, model_fp8_step_end). Returns how many.
static int fp8_pieces(struct trainer *t, struct ckpt_piece *out) {
    struct model *m = t->m.model;
    if (!fp8_saves(t) || topology_rank_in(&t->par.topo, GROUP_TP) != 0 ||
        topology_rank_in(&t->par.topo, GROUP_DP_CP) != 0)
        return 0;
    int nb = model_fp8_blocks(m), cols = model_fp8_state_cols(m);
    size_t per = (size_t)MODEL_FP8_TENSORS * cols;
    if (!t->ckpt.host_fp8) t->ckpt.host_fp8 = xcalloc((size_t)nb * per, sizeof *t->ckpt.host_fp8);
    for (int i = 0; i < nb; i++) {
        float *host = t->ckpt.host_fp8 + i * per;
        model_fp8_state_get(m, i, host);
        struct ckpt_piece *p = &out[i];
        *p = (struct ckpt_piece){.grows = MODEL_FP8_TENSORS, .gcols = cols, .rows = MODEL_FP8_TENSORS,
                                 .cols = cols, .flat_end = per, .dtype = DTYPE_FP32, .data = host};
        fp8_piece_name(p->name, model_fp8_block_layer(m, i));
    }
    return nb;
}

// A resume of a run under delayed scaling: each FP8 block's state from the
// checkpoint's tensor of its layer when there is one (a checkpoint of
// another history length gives its newest entries); without one (a bf16 or
// fp32 checkpoint, current scaling, a layer then skipped) the block starts
// as a fresh run's: scale 1, empty history. Errors: STATUS_BAD_INPUT for a
// tensor of another shape or invalid values (every rank reads the same).
static enum status fp8_resume(struct trainer *t, struct ckpt_reader *r, int *restored, struct error *err) {
    struct model *m = t->m.model;
    *restored = 0;
    if (!fp8_saves(t)) return STATUS_OK;
    char name[CKPT_NAME_MAX];
    for (int i = 0; i < model_fp8_blocks(m); i++) {
        fp8_piece_name(name, model_fp8_block_layer(m, i));
        const struct ckpt_piece *stored = NULL;
        for (int k = 0; k < checkpoint_n_pieces(r) && !stored; k++) {
            int file;
            const struct ckpt_piece *p = checkpoint_piece_at(r, k, &file);
            if (!strcmp(p->name, name)) stored = p;
        }
        if (!stored) continue;
        if (stored->grows != MODEL_FP8_TENSORS || stored->gcols < 2)
            return error_set(err, STATUS_BAD_INPUT, "%s: tensor %s is (%d, %d); FP8 scaling state is (%d, 2 + "
                             "history length)", checkpoint_info(r)->path, name, stored->grows, stored->gcols,
                             MODEL_FP8_TENSORS);
        int cols = stored->gcols;
        size_t per = (size_t)MODEL_FP8_TENSORS * cols;
        float *host = xcalloc(per, sizeof *host);
        struct ckpt_piece want = {.grows = MODEL_FP8_TENSORS, .gcols = cols, .rows = MODEL_FP8_TENSORS,
                                  .cols = cols, .flat_end = per, .dtype = DTYPE_FP32, .data = host};
        snprintf(want.name, sizeof want.name, "%s", name);
        enum status st = checkpoint_read_piece(r, &want, err);
        if (!st) st = model_fp8_state_set(m, i, host, cols, err);
        free(host);
        if (st) return st;
        (*restored)++;
    }
    return STATUS_OK;
}

// Host buffers for the parameter arena and this rank's moments (allocated on
// first use: a run that never loads, nor saves from device memory, does not
// pay for them), and the piece table.
static void host_buffers(struct trainer *t) {
    piece_table(t);
    if (t->ckpt.host_m) return; // (no host_params under ZeRO-3)
    size_t k = optimizer_numel(t->m.opt);
    if (!params_by_range(t)) t->ckpt.host_params = xcalloc(model_param_arena(t->m.model).numel, sizeof(float));
    if (has_master(t) || units_sharded(t)) t->ckpt.host_master = xcalloc(k, sizeof(float));
    t->ckpt.host_m = xcalloc(k, sizeof(float));
    t->ckpt.host_v = xcalloc(k, sizeof(float));
}

// The memory the pieces of a save read (or a load writes): the whole FP32
// parameter arena; this rank's ranges of the FP32 master values (master
// weights of a BF16/FP16 model, the parameters under ZeRO-2/3) and of the
// moments, each concatenated in range order (optimizer_ranges' at), except
// master values that are the arena's own elements (master_in_arena: an FP32
// model under ZeRO-2, read in place on the CPU backend).
struct piece_src {
    float *params, *master, *m, *v;
    bool master_in_arena;
};

// The pieces of prefix over this rank's ranges of the optimizer (one, or
// ZeRO-2/3's slice of each unit): range r from host + at[r], or with
// in_arena from host + its arena offset.
static int range_pieces(struct trainer *t, const char *prefix, float *host, bool in_arena,
                        struct ckpt_piece *out) {
    int n, k = 0;
    const struct param_info *p = model_params(t->m.model, &n);
    const size_t *rb, *re, *at;
    int nr = optimizer_ranges(t->m.opt, &rb, &re, &at);
    for (int r = 0; r < nr; r++)
        k += checkpoint_pieces_from_params(p, n, prefix, host + (in_arena ? rb[r] : at[r]), DTYPE_FP32,
                                           rb[r], re[r], out + k);
    return k;
}

// Fills t->ckpt.pieces: parameters (when with_params) and this rank's moments
// (when with_moments); returns how many. Parameters come from (or go to)
// the whole arena in src.params, or with from_master this rank's ranges of
// the master values in src.master (saving a BF16/FP16 model, or any model
// under ZeRO-2/3).
static int pieces_of(struct trainer *t, struct piece_src src, bool with_params, bool from_master,
                     bool with_moments) {
    int n, k = 0;
    const struct param_info *p = model_params(t->m.model, &n);
    if (with_params && from_master)
        k += range_pieces(t, "param", src.master, src.master_in_arena, t->ckpt.pieces + k);
    else if (with_params)
        k += checkpoint_pieces_from_params(p, n, "param", src.params, DTYPE_FP32, 0, SIZE_MAX,
                                           t->ckpt.pieces + k);
    if (with_moments) { // named by the optimizer, in optimizer_moments' order
        const char *const *names;
        CHECK(optimizer_state_names(&names) == 2, "the optimizer's state is two moments");
        k += range_pieces(t, names[0], src.m, false, t->ckpt.pieces + k);
        k += range_pieces(t, names[1], src.v, false, t->ckpt.pieces + k);
    }
    return k;
}

// The same over the host buffers (host_buffers).
static int pieces(struct trainer *t, bool with_params, bool from_master, bool with_moments) {
    struct piece_src src = {t->ckpt.host_params, t->ckpt.host_master, t->ckpt.host_m, t->ckpt.host_v,
                            false};
    return pieces_of(t, src, with_params, from_master, with_moments);
}

// ZeRO-2/3 with an FP32 model: this rank's parameters of its ranges into
// host_master (the parameter shard under ZeRO-3, the arena's slices under ZeRO-2).
static void shard_params_to_host(struct trainer *t) {
    struct tensor ps = optimizer_param_shard(t->m.opt);
    if (ps.numel) {
        backend_to_host(t->m.be, t->ckpt.host_master, ps.data, ps.numel * sizeof(float));
        return;
    }
    struct tensor w = model_param_arena(t->m.model);
    const size_t *rb, *re, *at;
    int nr = optimizer_ranges(t->m.opt, &rb, &re, &at);
    for (int r = 0; r < nr; r++)
        backend_to_host(t->m.be, t->ckpt.host_master + at[r], tensor_slice(w, rb[r], re[r] - rb[r]).data,
                        (re[r] - rb[r]) * sizeof(float));
}

// Copies the arenas into the host buffers (host_buffers): CUDA's device
// memory always; the CPU backend's for an asynchronous save (its snapshot,
// the training steps that follow change the arenas).
static struct piece_src snapshot_to_host(struct trainer *t) {
    struct tensor w = model_param_arena(t->m.model), m, v;
    optimizer_moments(t->m.opt, &m, &v);
    host_buffers(t);
    struct piece_src src = {t->ckpt.host_params, t->ckpt.host_master, t->ckpt.host_m, t->ckpt.host_v, false};
    if (has_master(t)) {
        struct tensor mw = optimizer_master(t->m.opt);
        backend_to_host(t->m.be, t->ckpt.host_master, mw.data, mw.numel * sizeof(float));
    } else if (units_sharded(t)) {
        shard_params_to_host(t);
    } else {
        backend_to_host(t->m.be, t->ckpt.host_params, w.data, w.numel * sizeof(float));
    }
    backend_to_host(t->m.be, t->ckpt.host_m, m.data, m.numel * sizeof(float));
    backend_to_host(t->m.be, t->ckpt.host_v, v.data, v.numel * sizeof(float));
    return src;
}

// Keeps the pieces of routed-expert tensors (param_info.expert) among the n
// pieces, in order; returns how many.
static int keep_expert_pieces(struct trainer *t, struct ckpt_piece *pc, int n) {
    int np, k = 0;
    const struct param_info *p = model_params(t->m.model, &np);
    for (int i = 0; i < n; i++) {
        const char *slash = strchr(pc[i].name, '/');
        const char *name = slash ? slash + 1 : pc[i].name;
        bool expert = false;
        for (int j = 0; j < np && !expert; j++) expert = p[j].expert && !strcmp(p[j].name, name);
        if (expert) pc[k++] = pc[i];
    }
    return k;
}

// The pieces and named state entries of a save of steps_done (into
// t->ckpt.pieces, *sv and e: every owner's, trainer_state_entries; *a). A synchronous save reads the arenas themselves where the backend's
// memory is host memory (the CPU backend: no copy of the model,
// docs/design.md §5); else (CUDA, or with to_host) the host buffers.
static void save_args(struct trainer *t, int steps_done, bool to_host, struct trainer_saved *sv,
                      struct state_entry e[TRAINER_STATE_MAX_ENTRIES], struct ckpt_save_args *a) {
    const struct config *c = &t->cfg;
    struct tensor w = model_param_arena(t->m.model), m, v;
    optimizer_moments(t->m.opt, &m, &v);
    bool master = has_master(t);
    struct piece_src src;
    if (backend_host_memory(t->m.be) && !to_host) {
        piece_table(t);
        backend_synchronize(t->m.be);
        struct tensor ps = optimizer_param_shard(t->m.opt);
        src = (struct piece_src){.params = w.data, .m = m.data, .v = v.data};
        if (master) src.master = optimizer_master(t->m.opt).data;
        else if (units_sharded(t) && ps.numel) src.master = ps.data;
        else if (units_sharded(t)) src.master = w.data, src.master_in_arena = true;
    } else {
        src = snapshot_to_host(t);
    }
    // DP replicas hold the same parameters (and, without ZeRO, moments): DP
    // rank 0 writes them; under ZeRO-1 every DP rank writes its moment shard
    // (and its master-weight shard of a BF16/FP16 model); under ZeRO-2/3 its
    // parameters, master weights and moments of its slice of every unit.
    // (The ranks of the gradient group, data x context: cp ranks hold the same parameters.)
    bool first_replica = topology_rank_in(&t->par.topo, GROUP_DP_CP) == 0, zero = c->parallel.zero_stage >= 1;
    // Hybrid sharding: the replicas of a shard group hold the same slices; the first writes them.
    bool sharded = units_sharded(t) && topology_rank_in(&t->par.topo, GROUP_DP_REPLICATE) == 0;
    if (units_sharded(t)) first_replica = sharded, zero = sharded;
    // Expert parallelism (ZeRO 0): the ranks of an ep group hold different
    // experts; the first of each expert_dp group writes its experts' values
    // (parameters and moments) and, unless it is also dp rank 0, nothing else.
    // (ZeRO-1: below.)
    bool expert_writer = !first_replica && topology_group_size(&t->par.topo.layout, GROUP_EP) > 1 &&
                         topology_rank_in(&t->par.topo, GROUP_EXPERT_DP) == 0;
    bool experts_only = expert_writer && !zero;
    int n = experts_only
                ? keep_expert_pieces(t, t->ckpt.pieces, pieces_of(t, src, true, master, true))
                : pieces_of(t, src, first_replica || (master && zero) || sharded,
                            master || sharded, first_replica || zero);
    // ZeRO-1 of an FP32 model under ep: each rank writes its ranges' moments
    // (the experts' over expert_dp, optimizer_init), and the parameters come
    // from the arena, whose experts are this ep rank's: the first of each
    // expert_dp group writes them beside dp rank 0's whole arena.
    if (expert_writer && zero && !master && !units_sharded(t)) {
        int np;
        const struct param_info *p = model_params(t->m.model, &np);
        int k = checkpoint_pieces_from_params(p, np, "param", src.params, DTYPE_FP32, 0, SIZE_MAX,
                                              t->ckpt.pieces + n);
        n += keep_expert_pieces(t, t->ckpt.pieces + n, k);
    }
    n += fp8_pieces(t, t->ckpt.pieces + n);
    // Each owner's values (the trainer's progress is its own), then every
    // owner's entries over them.
    *sv = (struct trainer_saved){.step = steps_done};
    trainer_progress_saved_of(&t->progress, c->train.seed, c->train.loss_on, &sv->progress);
    optimizer_saved_of(t->m.opt, &t->m.oc, &sv->opt);
    loss_scaler_saved_of(t->par.ctx.scaler, &sv->scaler);
    loader_state_save(&t->data.train_loader, &sv->loader);
    loader_saved_pack(&sv->loader, &sv->loader_saved);
    int n_entries = trainer_state_entries(sv, e, TRAINER_STATE_MAX_ENTRIES);
    *a = (struct ckpt_save_args){
        .dir = c->checkpoint.dir, .step = steps_done, .layout = t->par.topo.layout, .zero_stage = c->parallel.zero_stage, .rank = t->par.topo.world_rank,
        .model = &t->m.lc, .tokenizer_id = t->data.ds->index.tokenizer, .pieces = t->ckpt.pieces,
        .n_pieces = n, .keep_last = c->checkpoint.keep_last, .entries = e, .n_entries = n_entries,
    };
}

// One checkpoint record of metrics.jsonl (rank 0), when a save is
// committed: {"event": "checkpoint", "step", "async", "stall_s" (the seconds
// training stood still for it: the whole save when synchronous; the
// snapshot and begin, then the collectives of its two phases, when
// asynchronous), "wait_s" (of an asynchronous save: of stall_s, the seconds
// of a forced finish: the next save, a stop or the end arrived while some
// rank's writer or rank 0's commit still ran), "write_s" (the whole save, or from the snapshot to
// the commit when asynchronous)}.
static void log_ckpt_record(struct trainer *t, int step, bool async, double stall_s, double wait_s,
                            double write_s) {
    if (t->par.topo.world_rank || !t->log.metrics) return;
    fprintf(t->log.metrics, "{\"event\": \"checkpoint\", \"step\": %d, \"async\": %s, \"stall_s\": %.4f, "
            "\"wait_s\": %.4f, \"write_s\": %.4f}\n", step, async ? "true" : "false", stall_s, wait_s, write_s);
    fflush(t->log.metrics);
}

bool trainer_save_in_flight(const struct trainer *t) { return t->ckpt.inflight != NULL; }

int trainer_save_writer_state(const struct trainer *t) {
    return t->ckpt.inflight ? checkpoint_save_writer_state(t->ckpt.inflight) : 1;
}

// Advances the save in flight: one phase (checkpoint_save_advance) or, with
// all, until it is committed. Logs the commit.
static enum status save_advance(struct trainer *t, bool all, struct trainer_error *err) {
    struct ckpt_async *h = t->ckpt.inflight;
    if (!h) return STATUS_OK;
    int step = (int)checkpoint_save_step(h);
    double t0 = time_now_s();
    char phase[96];
    snprintf(phase, sizeof phase, "checkpoint save of step %d (the background writer, the commit)", step);
    watchdog_phase(t->watchdog, phase, 1, 1);
    enum status s = all ? checkpoint_save_finish(h, &t->par.topo.world, NULL, &err->err)
                        : checkpoint_save_advance(&t->ckpt.inflight, &t->par.topo.world, NULL, &err->err);
    if (all || s) t->ckpt.inflight = NULL; // freed either way
    watchdog_kick(t->watchdog);
    double dt = time_now_s() - t0;
    // Forced (the next save, a stop or the end arrived first): every second
    // of it waited for some rank's background work (its collectives wait
    // for the slowest rank); at a boundary that saw all done, none.
    t->ckpt.inflight_stall_s += dt, t->ckpt.inflight_wait_s += all ? dt : 0;
    t->log.save_s += dt;
    if (s) return err->err.status = STATUS_RUNTIME;
    if (t->ckpt.inflight) return STATUS_OK; // written and agreed; rank 0 commits in the background
    snprintf(t->ckpt.last, sizeof t->ckpt.last, "%s/step-%06d", t->cfg.checkpoint.dir, step);
    double since = time_now_s() - t->ckpt.inflight_begun_s;
    if (t->par.topo.world_rank == 0) {
        printf("checkpoint: %s saved in the background (%.2f s since its snapshot); training stood "
               "still %.2f s for it", t->ckpt.last, since, t->ckpt.inflight_stall_s);
        if (t->ckpt.inflight_wait_s >= 0.0005)
            printf(", of which %.2f s waiting for the background work", t->ckpt.inflight_wait_s);
        printf("\n");
        fflush(stdout);
    }
    log_ckpt_record(t, step, true, t->ckpt.inflight_stall_s, t->ckpt.inflight_wait_s, since);
    return STATUS_OK;
}

enum status trainer_save_advance(struct trainer *t, struct trainer_error *err) {
    return save_advance(t, false, err);
}

enum status trainer_save_complete(struct trainer *t, struct trainer_error *err) {
    return save_advance(t, true, err);
}

enum status trainer_save(struct trainer *t, int steps_done, struct trainer_error *err) {
    enum status s = trainer_save_complete(t, err); // the one in flight commits first
    if (s) return s;
    struct trainer_saved sv;
    struct state_entry e[TRAINER_STATE_MAX_ENTRIES];
    struct ckpt_save_args a;
    double t0 = time_now_s();
    save_args(t, steps_done, false, &sv, e, &a);
    char phase[64];
    snprintf(phase, sizeof phase, "checkpoint save of step %d", steps_done);
    watchdog_phase(t->watchdog, phase, 1, 1);
    // An error on every rank (checkpoint_save agrees on it), whatever its cause: a runtime failure.
    if (checkpoint_save(&a, &t->par.topo.world, &err->err))
        return err->err.status = STATUS_RUNTIME;
    watchdog_kick(t->watchdog);
    snprintf(t->ckpt.last, sizeof t->ckpt.last, "%s/step-%06d", t->cfg.checkpoint.dir, steps_done);
    double dt = time_now_s() - t0;
    if (t->par.topo.world_rank == 0) {
        printf("checkpoint: %s saved in %.2f s\n", t->ckpt.last, dt);
        fflush(stdout);
    }
    log_ckpt_record(t, steps_done, false, dt, 0, dt);
    t->log.save_s += dt;
    return STATUS_OK;
}

enum status trainer_save_async(struct trainer *t, int steps_done, struct trainer_error *err) {
    double w0 = time_now_s();
    enum status s = trainer_save_complete(t, err); // at most one save in flight
    if (s) return s;
    double waited = time_now_s() - w0;
    struct trainer_saved sv;
    struct state_entry e[TRAINER_STATE_MAX_ENTRIES]; // begin copies their values
    struct ckpt_save_args a;
    double t0 = time_now_s();
    char phase[96];
    snprintf(phase, sizeof phase, "checkpoint save of step %d (snapshot to host memory)", steps_done);
    watchdog_phase(t->watchdog, phase, 1, 1);
    save_args(t, steps_done, true, &sv, e, &a);
    // The host buffers hold the snapshot: nothing writes them until this save
    // commits (the next save and a resume come after trainer_save_complete).
    if (checkpoint_save_begin(&a, false, &t->par.topo.world, &t->ckpt.inflight, &err->err))
        return err->err.status = STATUS_RUNTIME;
    watchdog_kick(t->watchdog);
    t->ckpt.inflight_begun_s = time_now_s();
    t->ckpt.inflight_stall_s = t->ckpt.inflight_begun_s - t0, t->ckpt.inflight_wait_s = 0;
    t->log.save_s += t->ckpt.inflight_begun_s - t0;
    if (t->par.topo.world_rank == 0) {
        printf("checkpoint: step %d snapshot taken in %.2f s; written in the background", steps_done,
               t->ckpt.inflight_stall_s);
        if (waited >= 0.0005) printf(" (this save waited %.2f s for the previous one)", waited);
        printf("\n");
        fflush(stdout);
    }
    return STATUS_OK;
}

void trainer_save_abandon(struct trainer *t) {
    checkpoint_save_abandon(t->ckpt.inflight);
    t->ckpt.inflight = NULL;
}

static const char *schedule_name(int64_t s) {
    static const char *names[] = {"cosine", "linear", "constant"};
    return s >= 0 && s < 3 ? names[s] : "?";
}

__attribute__((format(printf, 5, 6)))
static void add_change(struct resume_check *rc, const char *key, const char *rule, bool refused,
                       const char *fmt, ...) {
    if (rc->n >= RESUME_MAX_CHANGES) return;
    struct resume_change *ch = &rc->change[rc->n++];
    snprintf(ch->key, sizeof ch->key, "%s", key);
    // fmt formats the saved value, "|", then this run's
    char both[sizeof ch->saved + sizeof ch->now + 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(both, sizeof both, fmt, ap);
    va_end(ap);
    char *bar = strchr(both, '|');
    if (bar) *bar = '\0';
    snprintf(ch->saved, sizeof ch->saved, "%.*s", (int)sizeof ch->saved - 1, both);
    snprintf(ch->now, sizeof ch->now, "%.*s", (int)sizeof ch->now - 1, bar ? bar + 1 : "");
    ch->rule = rule, ch->refused = refused;
    rc->refused = rc->refused || refused;
}

// What a resume may change (docs/design.md §7's table): one row per key,
// walked in order by trainer_resume_compare. A row's check() says whether the
// checkpoint's value and the run's differ (false too when the checkpoint
// predates the value: not compared) and, when they do, writes "SAVED|NOW"
// into buf for the message.
enum resume_kind {
    RESUME_SCHEDULE,  // refused unless train.override_schedule; then continued (the rebase)
    RESUME_REFUSED,   // refused, no override
    RESUME_CONTINUES  // listed, and the run continues
};
struct resume_rule {
    const char *key;
    enum resume_kind kind;
    const char *rule; // the message's reason ("data: ...", "loss: ..."); NULL for RESUME_SCHEDULE
    bool (*check)(const struct trainer_saved *s, const struct train_config *tc, char *buf, size_t n);
};

static const char *const loss_on_names[] = {"all", "response"};
static bool known_schedule(int64_t s) { return s >= LR_SCHEDULE_COSINE && s <= LR_SCHEDULE_CONSTANT; }

// RULE_CHECK(name, differs, format, saved, now): a row's check().
#define RULE_CHECK(fn, differs, ...)                                                                 \
    static bool fn(const struct trainer_saved *s, const struct train_config *tc, char *buf, size_t n) { \
        if (!(differs)) return false;                                                                \
        snprintf(buf, n, __VA_ARGS__);                                                               \
        return true;                                                                                 \
    }
RULE_CHECK(c_steps, s->opt.has_schedule && s->opt.steps != tc->steps, "%" PRId64 "|%d", s->opt.steps, tc->steps)
RULE_CHECK(c_lr, s->opt.has_schedule && s->opt.lr != tc->lr, "%.9g|%.9g", s->opt.lr, tc->lr)
RULE_CHECK(c_min_lr, s->opt.has_schedule && s->opt.min_lr != tc->min_lr, "%.9g|%.9g", s->opt.min_lr, tc->min_lr)
RULE_CHECK(c_warmup, s->opt.has_schedule && s->opt.warmup_steps != tc->warmup_steps, "%" PRId64 "|%d",
           s->opt.warmup_steps, tc->warmup_steps)
RULE_CHECK(c_schedule_unknown, s->opt.has_schedule && !known_schedule(s->opt.schedule), "%" PRId64 "|%s",
           s->opt.schedule, schedule_name(tc->lr_schedule))
RULE_CHECK(c_schedule, s->opt.has_schedule && known_schedule(s->opt.schedule) &&
           s->opt.schedule != (int64_t)tc->lr_schedule, "%s|%s", schedule_name(s->opt.schedule),
           schedule_name(tc->lr_schedule))
RULE_CHECK(c_seed, s->loader.seed != (uint64_t)tc->seed, "%" PRIu64 "|%" PRId64, s->loader.seed, tc->seed)
RULE_CHECK(c_seq_len, s->loader.format >= 2 && s->loader.seq_len != (uint64_t)tc->seq_len, "%" PRIu64 "|%d",
           s->loader.seq_len, tc->seq_len)
RULE_CHECK(c_loss_on, s->progress.loss_on >= 0 && s->progress.loss_on != (int64_t)tc->loss_on, "%s|%s",
           loss_on_names[s->progress.loss_on & 1], loss_on_names[tc->loss_on & 1])
RULE_CHECK(c_global_batch, s->loader.format >= 2 && s->loader.global_batch_size &&
           s->loader.global_batch_size != (uint64_t)tc->global_batch_size, "%" PRIu64 "|%d",
           s->loader.global_batch_size, tc->global_batch_size)
#undef RULE_CHECK

static const struct resume_rule resume_rules[] = {
    {"train.steps", RESUME_SCHEDULE, NULL, c_steps},
    {"train.lr", RESUME_SCHEDULE, NULL, c_lr},
    {"train.min_lr", RESUME_SCHEDULE, NULL, c_min_lr},
    {"train.warmup_steps", RESUME_SCHEDULE, NULL, c_warmup},
    {"train.lr_schedule", RESUME_REFUSED, "schedule: refused, the checkpoint's lr_schedule is none this "
     "trident knows", c_schedule_unknown},
    {"train.lr_schedule", RESUME_SCHEDULE, NULL, c_schedule},
    {"train.seed", RESUME_REFUSED, "data: refused, the sample order is drawn from it", c_seed},
    {"train.seq_len", RESUME_REFUSED, "data: refused, the samples are cut by it", c_seq_len},
    {"train.loss_on", RESUME_REFUSED, "loss: refused, the loss would change what it measures mid-run", c_loss_on},
    {"train.global_batch_size", RESUME_CONTINUES, "data: continues at the next unconsumed sample", c_global_batch},
};

void trainer_resume_compare(const struct trainer_saved *saved, const struct config *c,
                            struct resume_check *out) {
    *out = (struct resume_check){0};
    const struct train_config *tc = &c->train;
    bool over = tc->override_schedule;
    const char *sched = over ? "schedule: continued without a jump (train.override_schedule)"
                             : "schedule: refused without train.override_schedule = true";
    out->schedule_unknown = !saved->opt.has_schedule;
    for (size_t i = 0; i < sizeof resume_rules / sizeof resume_rules[0]; i++) {
        const struct resume_rule *r = &resume_rules[i];
        char both[96];
        if (!r->check(saved, tc, both, sizeof both)) continue;
        bool schedule = r->kind == RESUME_SCHEDULE;
        add_change(out, r->key, schedule ? sched : r->rule, r->kind == RESUME_REFUSED || (schedule && !over),
                   "%s", both);
        // A schedule key changed (a refused unknown schedule counts: it is one).
        out->schedule_changed = out->schedule_changed || schedule || !strncmp(r->rule, "schedule", 8);
    }
}

void trainer_resume_message(const struct resume_check *rc, const char *path, char *buf, size_t n) {
    size_t k = 0;
#define PUT(...) (k += (size_t)snprintf(buf + MIN(k, n), n - MIN(k, n), __VA_ARGS__))
    PUT("%s: this run's config differs from the checkpoint's:", path);
    for (int i = 0; i < rc->n; i++) {
        const struct resume_change *ch = &rc->change[i];
        PUT("%s %s %s -> %s (%s)", i ? ";" : "", ch->key, ch->saved, ch->now, ch->rule);
    }
    if (rc->refused) {
        bool data = false, sched = false, loss = false;
        for (int i = 0; i < rc->n; i++)
            if (rc->change[i].refused) {
                if (!strncmp(rc->change[i].rule, "data", 4)) data = true;
                else if (!strncmp(rc->change[i].rule, "loss", 4)) loss = true;
                else sched = true;
            }
        PUT(". Resume refused");
        if (sched)
            PUT("; to resume with the new schedule set train.override_schedule = true (the lr "
                "continues from its value at the resumed step, then decays to min_lr at the new "
                "last step), or restore the checkpoint's values");
        if (data)
            PUT("; seq_len and seed cannot change within a run (the data order would not "
                "continue): restore them");
        if (loss)
            PUT("; train.loss_on cannot change within a run (its loss curve and validation "
                "would mix two measures): restore it, or start the new phase (say fine-tuning "
                "on responses) as a fresh run from these weights with model.init_from = %s", path);
        PUT("; or start a fresh run: a new [checkpoint] dir (or move the old one away)");
    }
#undef PUT
}

// Copies t->ckpt.host_params (the whole parameter arena, FP32) into the model
// and, for a BF16/FP16 model, this rank's ranges into the FP32 master weights
// (the model gets them rounded); under ZeRO-3 t->ckpt.host_master (this
// rank's ranges, FP32) into its parameter shard (no arena) and master weights. Errors: STATUS_RUNTIME, out of device memory.
static enum status upload_params(struct trainer *t, struct trainer_error *err) {
    struct tensor w = model_param_arena(t->m.model);
    struct tensor ps = optimizer_param_shard(t->m.opt); // ZeRO-3: no arena
    if (params_by_range(t)) { // host_master: this rank's ranges, FP32
        struct tensor mw = optimizer_master(t->m.opt);
        if (has_master(t)) {
            backend_to_device(t->m.be, mw.data, t->ckpt.host_master, mw.numel * sizeof(float));
            backend_copy(t->m.be, ps, mw, ps.numel); // rounded
        } else {
            backend_to_device(t->m.be, ps.data, t->ckpt.host_master, ps.numel * sizeof(float));
        }
        backend_synchronize(t->m.be);
        return STATUS_OK;
    }
    if (has_master(t)) {
        const size_t *rb, *re, *at;
        int nr = optimizer_ranges(t->m.opt, &rb, &re, &at);
        for (int r = 0; r < nr; r++) {
            struct tensor mw = tensor_slice(optimizer_master(t->m.opt), at[r], re[r] - rb[r]);
            backend_to_device(t->m.be, mw.data, t->ckpt.host_params + rb[r], mw.numel * sizeof(float));
        }
    }
    if (has_master(t)) {
        void *tmp = backend_alloc(t->m.be, w.numel * sizeof(float));
        if (!tmp)
            return error_set(&err->err, STATUS_RUNTIME, "loading weights: out of %s memory for "
                             "%zu bytes of staging", t->m.be->ops->name, w.numel * sizeof(float));
        backend_to_device(t->m.be, tmp, t->ckpt.host_params, w.numel * sizeof(float));
        backend_copy(t->m.be, w, tensor_view(tmp, DTYPE_FP32, w.numel), w.numel);
        backend_synchronize(t->m.be);
        backend_dealloc(t->m.be, tmp);
    } else {
        backend_to_device(t->m.be, w.data, t->ckpt.host_params, w.numel * sizeof(float));
    }
    return STATUS_OK;
}

// The watchdog allowance (x [system] watchdog_s) of reading the weights in
// folder dir: WATCHDOG_FIRST_STEP plus 1 per WATCHDOG_READ_BYTES_PER_S x
// watchdog_s bytes of its regular files (a checkpoint's every rank file is
// checksummed by each rank: the whole folder is read before any tensor).
static double load_allowance(const struct trainer *t, const char *dir) {
    double bytes = 0, per = WATCHDOG_READ_BYTES_PER_S * MAX(t->cfg.system.watchdog_s, 1e-3);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char p[CKPT_PATH_MAX + 300];
        struct stat s;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!stat(p, &s) && S_ISREG(s.st_mode)) bytes += (double)s.st_size;
    }
    if (d) closedir(d);
    return WATCHDOG_FIRST_STEP + bytes / per;
}

// [model] init_from: a fresh run's parameters from a Hugging Face folder
// (config.json present) or a trident checkpoint, in this run's layout: each
// rank reads only the blocks its pieces describe (safetensors byte ranges, or
// checkpoint_read_piece's resharding). The model config must match (a
// mismatch names the key and both values, every differing key of a Hugging
// Face folder at once, the same on every rank); the
// optimizer state, step and data position stay those of a fresh run.
static enum status init_from(struct trainer *t, const char *path, struct trainer_error *err) {
    char cfg[CONFIG_PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    bool hf = access(cfg, F_OK) == 0;
    char manifest[CONFIG_PATH_MAX + 16];
    snprintf(manifest, sizeof manifest, "%s/manifest.ini", path);
    struct stat sb;
    bool missing = stat(path, &sb) != 0;
    if (!hf && access(manifest, F_OK) && (missing || !S_ISDIR(sb.st_mode)))
        return error_set(&err->err, STATUS_BAD_INPUT, "[model] init_from = %s: %s; expected a "
                         "trident checkpoint (step-NNNNNN with manifest.ini, or its [checkpoint] "
                         "dir) or a Hugging Face folder (config.json + *.safetensors)", path,
                         missing ? "no such folder" : "not a folder");
    char phase[CKPT_PATH_MAX + 64];
    snprintf(phase, sizeof phase, "start-up: reading model.init_from weights from %.*s", CKPT_PATH_MAX, path);
    watchdog_phase(t->watchdog, phase, load_allowance(t, path), 0);
    host_buffers(t);
    if (t->ckpt.host_params) memset(t->ckpt.host_params, 0, model_param_arena(t->m.model).numel * sizeof(float));
    if (t->ckpt.host_master) memset(t->ckpt.host_master, 0, optimizer_numel(t->m.opt) * sizeof(float));
    int n = pieces(t, true, params_by_range(t), false);
    enum status s = STATUS_OK;
    struct hf_meta meta = {.bos_id = -1, .pad_id = -1};
    bool have_ids = false;
    if (hf) {
        struct hf_model *h;
        if (hf_open(path, &t->m.lc, &h, &err->err)) return err->err.status;
        meta = *hf_model_meta(h), have_ids = true;
        // The folder's tokenizer.json, when present, is checked as a checkpoint's tokenizer is.
        char tok_file[CONFIG_PATH_MAX + 16], tok_id[64];
        snprintf(tok_file, sizeof tok_file, "%s/tokenizer.json", path);
        if (tokenizer_folder_identity(path, tok_id, sizeof tok_id, &err->err) ||
            checkpoint_check_tokenizer(tok_file, tok_id, t->data.ds->index.tokenizer, &err->err)) {
            tokenizer_origin(t, &err->err);
            hf_close(h);
            return err->err.status;
        }
        if (!tok_id[0] && t->par.topo.world_rank == 0)
            printf("init_from: note: %s holds no tokenizer.json; its tokenizer could not be "
                   "checked against the data's\n", path);
        for (int i = 0; i < n && !s; i++) {
            s = hf_read_piece(h, &t->ckpt.pieces[i], &err->err);
            watchdog_kick(t->watchdog);
        }
        hf_close(h);
        // A piece (a non-finite value) is this rank's to report: others read other blocks.
        if (s) return trainer_alone(err);
    } else {
        struct ckpt_reader *r;
        if (checkpoint_open(path, &r, &err->err)) {
            char why[sizeof err->err.msg];
            snprintf(why, sizeof why, "%s", err->err.msg);
            return error_set(&err->err, err->err.status, "[model] init_from = %s: %s (a Hugging "
                             "Face folder, config.json + *.safetensors, is also accepted)", path, why);
        }
        if (checkpoint_check_model(r, &t->m.lc, t->data.ds->index.tokenizer, &err->err)) {
            tokenizer_origin(t, &err->err);
            checkpoint_close(r);
            return err->err.status;
        }
        s = checkpoint_read_pieces(r, t->ckpt.pieces, n, t->watchdog, &err->err);
        checkpoint_close(r);
        // The ids `trident import` (or an earlier init_from) kept with it.
        for (int up = 0; up <= 1 && !s && !have_ids; up++) {
            char gc[CONFIG_PATH_MAX + 40];
            snprintf(gc, sizeof gc, "%s%s/generation_config.json", path, up ? "/.." : "");
            s = hf_read_generation_config(gc, t->m.lc.vocab_size, &meta, &have_ids, &err->err);
        }
    }
    if (s) return s == STATUS_RUNTIME ? trainer_alone(err) : s;
    // The source's token ids (every eos id) kept in this run's [checkpoint]
    // dir, where generate and ckpt export of its checkpoints read them.
    if (have_ids && t->par.topo.world_rank == 0 && t->cfg.checkpoint.dir[0]) {
        char gc[CONFIG_PATH_MAX + 40];
        snprintf(gc, sizeof gc, "%s/generation_config.json", t->cfg.checkpoint.dir);
        struct error e2 = {0};
        if (mkdir(t->cfg.checkpoint.dir, 0777) && errno != EEXIST)
            error_set(&e2, STATUS_RUNTIME, "%s: cannot create: %s", t->cfg.checkpoint.dir, strerror(errno));
        if (e2.status || hf_write_generation_config(gc, &meta, &e2))
            printf("init_from: note: the model's token ids not kept: %s\n", e2.msg);
    }
    if (upload_params(t, err)) return trainer_alone(err);
    if (t->par.topo.world_rank == 0) {
        printf("init_from: %s weights from %s (optimizer, step and data start fresh)\n",
               hf ? "Hugging Face" : "checkpoint", path);
        fflush(stdout);
    }
    return STATUS_OK;
}

// checkpoint_open (checksums) and the checks a resume makes before reading
// any tensor: the tensors of the manifest's model, the manifest's layout
// against the pieces, every rank file's /state by its owners. *out: NULL on
// an error (the reader closed).
static enum status open_checked(const char *path, struct ckpt_reader **out, struct error *err) {
    const char *const *state_names;
    int n_state = optimizer_state_names(&state_names);
    const char *const fp8_optional[] = {MODEL_FP8_STATE_PREFIX}; // the model's FP8 scaling state, when saved
    struct ckpt_reader *r = NULL;
    enum status st = checkpoint_open(path, &r, err);
    if (!st) st = checkpoint_check_tensors(r, state_names, n_state, fp8_optional, 1, err);
    if (!st) st = checkpoint_check_layout(r, err);
    if (!st) st = trainer_state_verify(r, err);
    if (st) checkpoint_close(r), r = NULL;
    *out = r;
    return st;
}

// Automatic resume refused the newest checkpoint (path, which dir/latest
// names) on rank 0's checks: rank 0 looks for the newest older step-N of
// [checkpoint] dir that passes the same checks (open_checked, every file
// read) and appends to its message how to continue from it; the refused
// one is left where it is (checkpoint.branch moves it aside, never deletes
// it). Collective: the other ranks wait at a barrier, so that rank 0's
// message gets out before any rank ends the job. Nothing for a resume =
// PATH (the user named that checkpoint) or without older steps.
static void older_checkpoint_hint(struct trainer *t, const char *path, struct error *err) {
    const struct config *c = &t->cfg;
    int64_t newest = checkpoint_latest_step(c->checkpoint.dir), *steps;
    if (c->checkpoint.resume != RESUME_AUTO || newest < 0) return;
    // the complete step folders below the newest, ascending
    int n = MAX(0, checkpoint_list_steps(c->checkpoint.dir, &steps));
    while (n > 0 && steps[n - 1] >= newest) n--;
    double allowance = 1;
    char older[CKPT_PATH_MAX + 32], phase[CKPT_PATH_MAX + 128];
    for (int i = 0; i < n; i++) {
        snprintf(older, sizeof older, "%s/step-%06lld", c->checkpoint.dir, (long long)steps[i]);
        allowance += load_allowance(t, older);
    }
    snprintf(phase, sizeof phase, "start-up: %.160s refused; rank 0 checks the older checkpoints of "
             "%.160s (a barrier)", path, c->checkpoint.dir);
    watchdog_phase(t->watchdog, phase, allowance, 1);
    int found = -1;
    for (int i = n - 1; t->par.topo.world_rank == 0 && i >= 0 && found < 0; i--) { // newest first
        struct ckpt_reader *r;
        struct error ignored;
        snprintf(older, sizeof older, "%s/step-%06lld", c->checkpoint.dir, (long long)steps[i]);
        if (open_checked(older, &r, &ignored)) continue;
        if (!checkpoint_info(r)->weights_only) found = i; // an import's weights do not resume
        checkpoint_close(r);
        watchdog_kick(t->watchdog);
    }
    comm_barrier(&t->par.topo.world);
    size_t k = strlen(err->msg);
    if (t->par.topo.world_rank == 0 && found >= 0)
        snprintf(err->msg + k, sizeof err->msg - k, "; the newest older checkpoint that passes these "
                 "checks is %s/step-%06lld: to continue from it, set checkpoint.resume = "
                 "%s/step-%06lld and checkpoint.branch = true (the steps after it, step-%06lld "
                 "among them, then move aside into %s/branched-after-step-%06lld-<time>/, kept)",
                 c->checkpoint.dir, (long long)steps[found], c->checkpoint.dir,
                 (long long)steps[found], (long long)newest, c->checkpoint.dir,
                 (long long)steps[found]);
    else if (t->par.topo.world_rank == 0 && n > 0)
        snprintf(err->msg + k, sizeof err->msg - k, "; no older checkpoint of %s passes these checks "
                 "either", c->checkpoint.dir);
    free(steps);
}

// Reads the checkpoint at path into the model, the optimizer and the train
// loader; fills sv (every owner's saved state). Errors of the checkpoint's content are every rank's, read
// failures this rank's alone.
static enum status resume_from(struct trainer *t, const char *path, struct trainer_saved *sv,
                               struct trainer_error *err) {
    // Every rank verifies the checksums of the files it reads (issue 18: only
    // rank 0 did, so a file changed after its check reached the others' HDF5
    // reads unchecked). verdict: {any rank's refusal, rank 0's}. Rank 0's
    // refusal is every rank's and rank 0 reports it; a refusal of another
    // rank alone (its copy differs from rank 0's) is that rank's to report.
    struct ckpt_reader *r = NULL;
    bool root = t->par.topo.world_rank == 0;
    // The watchdog: the checksums of every rank file, then each tensor piece
    // (a kick per piece), under an allowance scaled by the folder's bytes.
    const char *base = strrchr(path, '/');
    base = base && base[1] ? base + 1 : path;
    char phase[256];
    double allowance = load_allowance(t, path);
    snprintf(phase, sizeof phase, "start-up: loading checkpoint %.160s (checksums of its files)", base);
    watchdog_phase(t->watchdog, phase, allowance, 0);
    int own = open_checked(path, &r, &err->err);
    int verdict[2] = {own, root ? own : 0};
    snprintf(phase, sizeof phase, "start-up: loading checkpoint %.160s (every rank's checksum verdict, a "
             "collective)", base);
    watchdog_phase(t->watchdog, phase, allowance, 1);
    comm_all_reduce(&t->par.topo.world, verdict, 2, DTYPE_I32, COMM_MAX);
    snprintf(phase, sizeof phase, "start-up: loading checkpoint %.160s (its tensors)", base);
    watchdog_phase(t->watchdog, phase, allowance, 0);
    if (verdict[0]) {
        checkpoint_close(r);
        if (verdict[1]) { // rank 0 holds the message
            older_checkpoint_hint(t, path, &err->err);
            if (!root) err->err.msg[0] = '\0';
            return err->err.status = (enum status)verdict[1];
        }
        if (own) return trainer_alone(err);
        snprintf(err->err.msg, sizeof err->err.msg, "%.900s: another rank refused the checkpoint (its message above)",
                 path);
        return err->err.status = (enum status)verdict[0];
    }
    enum status s = STATUS_OK;
    if (checkpoint_info(r)->weights_only) { // every rank reads the same manifest
        error_set(&err->err, STATUS_BAD_INPUT, "%s: weights only (trident import: no optimizer "
                  "state, step or data position), not a checkpoint to resume: start a run from "
                  "it with model.init_from = %s and a [checkpoint] dir of its own", path, path);
        s = err->err.status;
        goto out;
    }
    if (checkpoint_check_model(r, &t->m.lc, t->data.ds->index.tokenizer, &err->err)) {
        tokenizer_origin(t, &err->err);
        // Another model: say how to start fresh (resume = none is refused
        // for a dir holding checkpoints, trainer_resume); a checkpoint named
        // by checkpoint.resume = PATH is not the dir's, so drop the key.
        size_t k = strlen(err->err.msg);
        if (t->cfg.checkpoint.resume == RESUME_PATH)
            snprintf(err->err.msg + k, sizeof err->err.msg - k, ". To train this model from "
                     "scratch, drop checkpoint.resume = %s; to continue that run, use its [model] "
                     "values", t->cfg.checkpoint.resume_path);
        else
            snprintf(err->err.msg + k, sizeof err->err.msg - k, ". To train this model from "
                     "scratch, give it a new [checkpoint] dir (or move %s away); to continue that "
                     "run, use its [model] values",
                     t->cfg.checkpoint.dir[0] ? t->cfg.checkpoint.dir : "that folder");
        s = err->err.status;
        goto out;
    }
    // The config against the checkpoint's saved values, before anything is
    // read into the model: a refusal leaves every rank as it was (and the run
    // folder unwritten: setup_log comes after). Every rank reads rank 0's state.
    if (trainer_state_read(r, -1, sv, &err->err)) {
        s = trainer_alone(err);
        goto out;
    }
    struct resume_check rc;
    trainer_resume_compare(sv, &t->cfg, &rc);
    if (rc.refused) {
        trainer_resume_message(&rc, path, err->err.msg, sizeof err->err.msg);
        s = err->err.status = STATUS_BAD_INPUT;
        goto out;
    }
    if (root && rc.n) {
        char msg[sizeof err->err.msg];
        trainer_resume_message(&rc, path, msg, sizeof msg);
        printf("resume: %s\n", msg);
    }
    if (root && rc.schedule_unknown)
        printf("note: %s predates stored LR schedules: [train] steps, lr, min_lr, warmup_steps and "
               "lr_schedule were not compared with it\n", path);
    struct optimizer_config *oc = &t->m.oc;
    int64_t lr_step = sv->progress.lr_step;
    if (rc.schedule_changed && lr_step > 0) {
        // The lr of the last applied step under the checkpoint's schedule
        // (itself perhaps continued); the new one starts there.
        struct optimizer_config old = optimizer_saved_schedule(&sv->opt, oc);
        oc->rebase_step = (int)lr_step;
        oc->rebase_lr = optimizer_lr(&old, (int)lr_step - 1);
        if (root && sv->step < t->cfg.train.steps) // else nothing to train (trainer_run says so)
            printf("resume: the LR schedule continues from %.3e, the lr it had reached, at schedule "
                   "position %lld, to min_lr %.3e at step %d (docs/design.md §7)\n", oc->rebase_lr,
                   (long long)lr_step, t->cfg.train.min_lr, t->cfg.train.steps);
    } else if (!rc.schedule_changed && sv->opt.has_schedule) {
        oc->rebase_step = (int)sv->opt.rebase_step, oc->rebase_lr = sv->opt.rebase_lr;
    }
    if (root) fflush(stdout);
    host_buffers(t);
    struct tensor w = model_param_arena(t->m.model), m, v;
    optimizer_moments(t->m.opt, &m, &v);
    // vocab padding and arena gaps stay 0
    if (t->ckpt.host_params) memset(t->ckpt.host_params, 0, w.numel * sizeof(float));
    if (t->ckpt.host_master) memset(t->ckpt.host_master, 0, optimizer_numel(t->m.opt) * sizeof(float));
    int n = pieces(t, true, params_by_range(t), true);
    if (checkpoint_read_pieces(r, t->ckpt.pieces, n, t->watchdog, &err->err)) {
        s = trainer_alone(err);
        goto out;
    }
    if (loader_state_load(&t->data.train_loader, &sv->loader, &err->err)) {
        s = err->err.status;
        goto out;
    }
    if (upload_params(t, err)) {
        s = trainer_alone(err);
        goto out;
    }
    backend_to_device(t->m.be, m.data, t->ckpt.host_m, m.numel * sizeof(float));
    backend_to_device(t->m.be, v.data, t->ckpt.host_v, v.numel * sizeof(float));
    optimizer_saved_restore(t->m.opt, &sv->opt);
    int fp8_restored;
    if (fp8_resume(t, r, &fp8_restored, &err->err)) {
        s = err->err.status;
        goto out;
    }
    if (root && fp8_saves(t))
        printf("resume: FP8 scaling state of %d of rank 0's %d FP8 blocks from the checkpoint%s\n", fp8_restored,
               model_fp8_blocks(t->m.model), fp8_restored < model_fp8_blocks(t->m.model) ? " (the others start "
               "with scale 1 and an empty amax history)" : "");
    const struct ckpt_info *info = checkpoint_info(r);
    if (root) {
        const struct loader_state *ls = &t->data.train_loader.state;
        char change[160] = "";
        uint64_t old_g = sv->loader.global_batch_size, new_g = ls->global_batch_size;
        if (sv->loader.format < 2)
            snprintf(change, sizeof change, " (a batch-index loader state of an older checkpoint, "
                     "converted with this run's global_batch_size)");
        else if (old_g && old_g != new_g)
            snprintf(change, sizeof change, " ([train] global_batch_size changed from %llu to %llu: "
                     "the next unconsumed sample)", (unsigned long long)old_g, (unsigned long long)new_g);
        char grid[256];
        printf("resumed from %s: step %lld, saved in layout %s (zero_stage %d); "
               "data continues at epoch %llu, sample %llu%s\n", path, (long long)sv->step,
               topology_layout_line(&info->layout, grid, sizeof grid), info->zero_stage,
               (unsigned long long)ls->epoch, (unsigned long long)ls->sample, change);
        fflush(stdout);
    }
out:
    checkpoint_close(r);
    return s;
}

static enum status resume(struct trainer *t, struct trainer_error *err);

// A branch, found at start: resuming from step S (path) into [checkpoint]
// dir whose latest is step L > S would train to L and then refuse to save
// over the latest. Refused (exit 2, every rank the same verdict from the
// same files; rank 0 prints) unless checkpoint.branch = true: then rank 0
// moves the steps after S aside (checkpoint_branch) and the run goes on. The
// manifest's step is read without the checksums (resume_from checks them).
static enum status check_branch(struct trainer *t, const char *path, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    if (!c->checkpoint.dir[0]) return STATUS_OK;
    int64_t latest = checkpoint_latest_step(c->checkpoint.dir);
    struct ckpt_reader *r;
    struct error ignored;
    if (latest < 0 || checkpoint_open_trusted(path, &r, &ignored)) return STATUS_OK; // resume_from reports
    int64_t step = checkpoint_info(r)->step;
    bool weights_only = checkpoint_info(r)->weights_only; // resume_from refuses it, naming init_from
    checkpoint_close(r);
    if (latest <= step || weights_only) return STATUS_OK;
    if (!c->checkpoint.branch)
        return error_set(&err->err, STATUS_BAD_INPUT, "resuming from step %lld (%s) into [checkpoint] "
                         "dir = %s, whose latest is step %lld: a branch, whose saves would collide "
                         "with steps %lld to %lld; give this run a new [checkpoint] dir, or set "
                         "checkpoint.branch = true to move the steps after %lld aside (into "
                         "%s/branched-after-step-%06lld-<time>/) and continue", (long long)step, path,
                         c->checkpoint.dir, (long long)latest, (long long)step + 1, (long long)latest,
                         (long long)step, c->checkpoint.dir, (long long)step);
    if (t->par.topo.world_rank != 0) return STATUS_OK;
    char aside[CKPT_PATH_MAX];
    if (checkpoint_branch(c->checkpoint.dir, step, aside, &err->err)) return trainer_alone(err);
    printf("checkpoint.branch: resuming from step %lld; the steps after it (latest was %lld) moved "
           "aside to %s\n", (long long)step, (long long)latest, aside);
    return STATUS_OK;
}

// On a backend whose memory is host memory the host buffers serve only a
// load (a save reads the arenas): freed once it is done, so that a resumed
// run holds what a fresh one does (docs/design.md §5).
enum status trainer_resume(struct trainer *t, struct trainer_error *err) {
    enum status s = resume(t, err);
    if (backend_host_memory(t->m.be)) {
        free(t->ckpt.host_params), free(t->ckpt.host_master), free(t->ckpt.host_m), free(t->ckpt.host_v);
        t->ckpt.host_params = t->ckpt.host_master = t->ckpt.host_m = t->ckpt.host_v = NULL;
    }
    return s;
}

static enum status resume(struct trainer *t, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    char path[CKPT_PATH_MAX];
    t->ckpt.start_step = 0;
    if (!c->checkpoint.dir[0] && c->checkpoint.resume != RESUME_PATH)
        return c->model.init_from[0] ? init_from(t, c->model.init_from, err) : STATUS_OK;
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
    if (!path[0]) return c->model.init_from[0] ? init_from(t, c->model.init_from, err) : STATUS_OK;
    enum status s = check_branch(t, path, err);
    if (s) return s;
    struct trainer_saved sv;
    s = resume_from(t, path, &sv, err);
    if (s) return s;
    t->ckpt.start_step = (int)sv.step;
    trainer_progress_saved_restore(&t->progress, &sv.progress);
    loss_scaler_saved_restore(t->par.ctx.scaler, &sv.scaler);
    snprintf(t->ckpt.last, sizeof t->ckpt.last, "%s", path);
    // A resume continues its own weights; init_from only starts fresh runs.
    // Say so: a stale checkpoint folder would otherwise win unnoticed over
    // the weights the config names.
    if (c->model.init_from[0] && t->par.topo.world_rank == 0)
        printf("note: [model] init_from = %s is not read: this run resumes from %s (init_from only "
               "starts a fresh run; for a fresh run from it, give it a new [checkpoint] dir)\n",
               c->model.init_from, path);
    return STATUS_OK;
}

// train_state.c: a checkpoint's /state gathered from its owners and judged
// by them (train_state.h); the trainer's own part, its progress.
#include "train_state.h"

#include <limits.h>
#include <string.h>

void trainer_progress_saved_of(const struct trainer_progress *p, int64_t seed, int loss_on,
                               struct trainer_progress_saved *out) {
    *out = (struct trainer_progress_saved){.lr_step = p->lr_step, .skipped_steps = p->skipped_steps,
                                           .consecutive_skips = p->consecutive_skips, .rng_seed = (uint64_t)seed,
                                           .loss_on = loss_on};
}

void trainer_progress_saved_restore(struct trainer_progress *p, const struct trainer_progress_saved *s) {
    *p = (struct trainer_progress){.lr_step = (int)s->lr_step, .skipped_steps = (int)s->skipped_steps,
                                   .consecutive_skips = (int)s->consecutive_skips};
}

static int progress_entries(struct trainer_progress_saved *s, struct state_entry *out, int cap) {
    const struct state_entry mine[] = {
        {"lr_step", STATE_I64, 1, &s->lr_step, .required = true},
        {"skipped_steps", STATE_I64, 1, &s->skipped_steps, .dflt = 0}, // absent in older files
        {"consecutive_skips", STATE_I64, 1, &s->consecutive_skips, .dflt = 0},
        {"rng_seed", STATE_U64, 1, &s->rng_seed, .required = true},
        {"rng_state", STATE_U64, 4, s->rng_state, .required = true},
        {"loss_on", STATE_I64, 1, &s->loss_on, .dflt = -1},
    };
    return state_entries_put(out, cap, mine, sizeof mine / sizeof mine[0]);
}

static enum status progress_check(const struct trainer_progress_saved *s, int64_t step, struct error *err) {
    enum status st;
    if ((st = state_entry_range("lr_step", s->lr_step, 0, INT_MAX, err)) ||
        (st = state_entry_range("skipped_steps", s->skipped_steps, 0, step, err)) ||
        (st = state_entry_range("consecutive_skips", s->consecutive_skips, 0, step, err)))
        return st;
    return state_entry_range("loss_on", s->loss_on, -1, 1, err);
}

// The order rank files have held /state's attributes in since before the
// owners held them (their creation order, hence the file's bytes): a save
// writes the owners' entries in it, so that a rank file is byte for byte
// what earlier builds wrote. A name not listed (a newer entry) follows them,
// in its owner's order; no entry needs to be listed here.
static const char *const file_order[] = {
    "lr_step", "opt_steps", "loader_samples", "loader_weights", "rng_seed", "rng_state", "loss_scale",
    "loss_scale_good_steps", "skipped_steps", "consecutive_skips", "train_steps", "lr", "min_lr",
    "warmup_steps", "lr_schedule", "lr_rebase_step", "lr_rebase_lr", "loss_on"};
enum { N_ORDER = sizeof file_order / sizeof file_order[0] };

static int order_of(const char *name) {
    for (int i = 0; i < N_ORDER; i++)
        if (!strcmp(file_order[i], name)) return i;
    return N_ORDER;
}

int trainer_state_entries(struct trainer_saved *sv, struct state_entry *out, int cap) {
    int n = progress_entries(&sv->progress, out, cap);
    n += optimizer_state_entries(&sv->opt, out + n, cap - n);
    n += loss_scaler_state_entries(&sv->scaler, out + n, cap - n);
    n += loader_state_entries(&sv->loader_saved, out + n, cap - n);
    for (int i = 1; i < n; i++) { // a stable insertion sort by file_order
        struct state_entry e = out[i];
        int k = i, rank = order_of(e.name);
        for (; k > 0 && order_of(out[k - 1].name) > rank; k--) out[k] = out[k - 1];
        out[k] = e;
    }
    return n;
}

enum status trainer_state_read(struct ckpt_reader *r, int rank, struct trainer_saved *sv, struct error *err) {
    memset(sv, 0, sizeof *sv);
    sv->step = checkpoint_info(r)->step;
    struct state_entry e[TRAINER_STATE_MAX_ENTRIES];
    int n = trainer_state_entries(sv, e, TRAINER_STATE_MAX_ENTRIES);
    enum status st = checkpoint_read_entries(r, rank, e, n, err);
    if (st) return st;
    if ((st = progress_check(&sv->progress, sv->step, err)) || (st = optimizer_saved_check(&sv->opt, err)) ||
        (st = loss_scaler_saved_check(&sv->scaler, err)) ||
        (st = loader_saved_unpack(&sv->loader_saved, &sv->loader, err))) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return error_set(err, st, "%s/rank-%05d.h5: %s", checkpoint_info(r)->path, rank < 0 ? 0 : rank, why);
    }
    return STATUS_OK;
}

enum status trainer_state_verify(struct ckpt_reader *r, struct error *err) {
    const struct ckpt_info *in = checkpoint_info(r);
    if (in->weights_only) return STATUS_OK;
    struct trainer_saved sv;
    enum status st = STATUS_OK;
    for (int rank = 0; !st && rank < in->world_size; rank++) st = trainer_state_read(r, rank, &sv, err);
    return st;
}

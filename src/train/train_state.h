// train_state.h: a checkpoint's /state as its owners hold it (docs/design.md
// §7, "Who owns what a checkpoint holds"): the loader's position
// (data/dataset.h struct loader_saved), the optimizer's step counter and LR
// schedule (model/optimizer.h struct optimizer_saved), the fp16 loss scaler
// (train_step.h struct loss_scaler_saved) and the trainer's own progress
// (below). Each owner describes its values as named entries
// (base/state_entry.h) and judges them on load; the trainer gathers every
// owner's entries into a save (ckpt_save_args.entries) and reads them back
// (checkpoint_read_entries). The checkpoint layer knows none of them: a new
// saved scalar is one field and one entry of its owner's, nothing else.
#ifndef TRIDENT_TRAIN_STATE_H
#define TRIDENT_TRAIN_STATE_H

#include <stdint.h>

#include "base/state_entry.h"
#include "ckpt/checkpoint.h"
#include "data/dataset.h"
#include "model/optimizer.h"
#include "train_step.h"

// Where the run stands beyond its step count; saved in checkpoints (its
// saved form below) and restored on resume.
struct trainer_progress {
    int lr_step;           // place in the LR schedule: steps applied, not skipped
    int skipped_steps;     // steps skipped (train_step_should_skip), in all
    int consecutive_skips; // the latest of them in a row that count toward [train]
                           // max_skipped_steps (not fp16 overflows the scale absorbed);
                           // 0 after an applied step
};

// The trainer's own saved values: "lr_step" (the place in the LR schedule:
// steps applied), "skipped_steps" and "consecutive_skips" (steps skipped for
// a non-finite loss or gradient norm, in all and the latest in a row; absent
// in older files: 0), "rng_seed" ([train] seed), "rng_state" (uint64 (4,),
// a generator's state; 0 while the trainer has none), "loss_on" ([train]
// loss_on, config.h enum loss_on; absent in older files: -1, not compared).
struct trainer_progress_saved {
    int64_t lr_step, skipped_steps, consecutive_skips;
    uint64_t rng_seed, rng_state[4];
    int64_t loss_on;
};

// What a save holds of the trainer's progress p, of a run of [train] seed
// and loss_on; and a resume putting p back (checkpoints before skipped steps
// existed hold lr_step = step and no skip counts: 0).
void trainer_progress_saved_of(const struct trainer_progress *p, int64_t seed, int loss_on,
                               struct trainer_progress_saved *out);
void trainer_progress_saved_restore(struct trainer_progress *p, const struct trainer_progress_saved *s);

// A checkpoint's /state, every owner's part.
struct trainer_saved {
    int64_t step; // the checkpoint's (checkpoint_info; /state step is the checkpoint layer's)
    struct trainer_progress_saved progress;
    struct optimizer_saved opt;
    struct loss_scaler_saved scaler;
    struct loader_saved loader_saved; // as stored; loader: unpacked by trainer_state_read
    struct loader_state loader;
};

// Room for every owner's entries (a CHECK when they outgrow it).
#define TRAINER_STATE_MAX_ENTRIES 64

// Every owner's entries over sv, into out (room for cap), in the order files
// have held them (train_state.c file_order; newer ones after); returns how many.
int trainer_state_entries(struct trainer_saved *sv, struct state_entry *out, int cap);

// Reads world rank `rank`'s file (-1: rank 0's) into *sv: the entries, then
// each owner's judgement of its values (ranges, the loader's format).
// Errors: STATUS_BAD_INPUT naming the file and the entry.
enum status trainer_state_read(struct ckpt_reader *r, int rank, struct trainer_saved *sv, struct error *err);

// trainer_state_read of every rank file (a weights_only checkpoint holds no
// training state: nothing to read), so that `ckpt verify` and every
// resuming rank refuse the same files. Errors: as trainer_state_read.
enum status trainer_state_verify(struct ckpt_reader *r, struct error *err);

#endif

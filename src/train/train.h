// train.h: the trainer behind `trident train` (src/cli/cmd_train.c). Config,
// grid, data, model and optimizer are set up and checked before the first step
// (docs/design.md §8); then the loop of microbatches, data-parallel gradient
// all-reduce, clipping, schedule and AdamW, with validation, samples,
// checkpoints, a log line per step and metrics.jsonl (docs/design.md §9).
//
// Every rank calls each function, in the same order (they are collective over
// the world). Nothing here ends the process: a failure comes back as a status
// and the caller ends the job on every rank (docs/design.md §8).
#ifndef TRIDENT_TRAIN_H
#define TRIDENT_TRAIN_H

#include <signal.h>
#include <stdbool.h>

#include "base/common.h"
#include "config/config.h"

struct trainer;

// A failure returned by the trainer. Every rank's job must end within
// seconds; how depends on who found the error:
// alone false: every rank returns this error, found the same way (rank 0's
//   message is the one to print; other ranks' msg may be empty);
// alone true: only this rank found it; its peers may be blocked in a
//   collective it will never join, so the job must be aborted from here.
struct trainer_error {
    struct error err;
    bool alone;
};

// How a run that returned STATUS_OK ended.
struct trainer_outcome {
    int signal;     // the signal (any rank's) that stopped the run after a step; 0: none
    int steps_done; // optimizer steps done when the run ended (resumed ones included)
    bool saved;     // a checkpoint of steps_done was written ([checkpoint] dir is set)
    bool out_of_time; // stopped before [train] exit_duration_mins would pass: requeue as for a signal
    const char *stopped_in; // where a signal stopped it: "step" (after one), "evaluation" or
                            // "sample" (within one batch or token of it), "start"; NULL: none
};

// Builds the trainer of cfg (loaded and validated by config_validate with
// this world's size): grid, data, model, optimizer, pipeline, gradient sync,
// resume from a checkpoint, run folder (rank 0), and prints the banner (rank
// 0). Errors: STATUS_BAD_INPUT for a config, data, checkpoint or run folder
// that cannot be used; STATUS_RUNTIME for the machine. After a failure *out is
// NULL and what was built is not freed: freeing communicators is collective,
// and the caller ends the job anyway.
enum status trainer_open(struct trainer **out, const struct config *cfg,
                         struct trainer_error *err);

// Trains from the resumed step to [train] steps. Stops early after a step
// (with a checkpoint when [checkpoint] dir is set) at [train] exit_interval,
// when *stop is non-zero on any rank (a signal handler sets it: SIGTERM,
// SIGUSR1), or when on any rank the time since trainer_open plus the mean
// step time of this run would pass [train] exit_duration_mins; out says which. Already at the last step: prints "nothing to do"
// and returns STATUS_OK. A step with a NaN or infinite loss or gradient norm
// is skipped (train_step_should_skip) and logged. Errors: STATUS_RUNTIME
// ([train] max_skipped_steps skipped steps in a row, found by every rank; a
// failed read or checkpoint write), STATUS_BAD_INPUT (a shard found bad while
// reading); as for trainer_open, the trainer is then left as it is.
enum status trainer_run(struct trainer *t, const volatile sig_atomic_t *stop,
                        struct trainer_outcome *out, struct trainer_error *err);

// Frees everything (collective: communicators are freed). NULL: no-op.
void trainer_close(struct trainer *t);

#endif

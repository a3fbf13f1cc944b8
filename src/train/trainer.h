// trainer.h: the state of `trident train` (src/train/train.c), shared with its
// checkpoint glue (src/train/train_ckpt.c). Private to those two files.
#ifndef TRIDENT_TRAINER_H
#define TRIDENT_TRAINER_H

#include <signal.h>
#include <stdio.h>

#include "config/config.h"
#include "data/dataset.h"
#include "grad_sync.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "parallel/pipeline.h"
#include "tokenizer/tokenizer.h"
#include "parallel/topology.h"
#include "train_step.h"
#include "base/watchdog.h"

// Exit code of a run stopped by SIGTERM or SIGUSR1 after saving a checkpoint
// of its last finished step: "requeue me" (docs/design.md §8).
enum { EXIT_PREEMPTED = 3 };

struct trainer {
    struct config cfg;
    struct topology topo;
    struct backend *be;
    struct dataset *ds;
    struct loader train_loader, val_loader;
    bool has_val;
    struct model *model;
    struct optimizer *opt;
    struct optimizer_config oc;
    struct grad_sync *sync;   // NULL under ZeRO-1
    struct parallel_groups groups;
    struct pipeline_exec pipe; // pp > 1 or virtual stages
    struct train_ctx ctx;
    bool whole_model;         // one stage, one chunk: evaluation and samples run
    bool reads_tokens, reads_targets; // first / last pipeline stage
    double *split_all;        // (world, 3) per-rank time split, gathered for the log
    int n_slots;              // activation slots: microbatches in flight on this stage
    struct tokenizer *tok;    // rank 0, for samples; NULL when missing
    int accum;                // microbatches per step on this rank
    int32_t *seqs;            // (B, T + 1) one microbatch from the loader
    int32_t *tokens, *targets; // (accum, B, T)
    double flops_per_token;   // 6 N + attention (docs/design.md §9)
    double peak_flops;        // all ranks together, FLOP/s
    size_t mem_bytes;         // arenas of this rank
    FILE *metrics;            // rank 0
    struct llama_config lc;
    int start_step;           // optimizer steps done before this run (resume)
    int last_saved;           // steps done at the last checkpoint written, -1: none
    float *host_params;       // (n_params,) host copy of the arena, for checkpoints
    float *host_m, *host_v;   // this rank's moment range, for checkpoints
    struct ckpt_piece *pieces;
    struct watchdog *watchdog; // NULL when [system] watchdog_s = 0
};

// Resumes from [checkpoint] resume (auto: dir/latest) when there is one:
// parameters, moments, optimizer step, loader state. Sets t->start_step.
// Bad checkpoints end the job with exit 2 on every rank.
void trainer_resume(struct trainer *t);
// Saves a checkpoint of `steps_done` optimizer steps (collective over the
// world). A failure ends the job with exit 1; the previous checkpoint stays.
void trainer_save(struct trainer *t, int steps_done);

// Ends the job: every rank found the same error (rank 0 reports it), or
// only this rank did (it reports).
_Noreturn void trainer_fail_all(const struct trainer *t, const struct error *err);
_Noreturn void trainer_fail_here(const struct error *err);

#endif

// trainer.h: the state of a trainer (train.h), shared by src/train/train.c
// (setup and the loop) and src/train/train_ckpt.c (its checkpoints). Private
// to src/train/.
#ifndef TRIDENT_TRAINER_H
#define TRIDENT_TRAINER_H

#include <stdio.h>

#include "base/watchdog.h"
#include "ckpt/checkpoint.h"
#include "config/config.h"
#include "data/dataset.h"
#include "fsdp.h"
#include "grad_sync.h"
#include "metrics_sink.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "parallel/pipeline.h"
#include "parallel/topology.h"
#include "tokenizer/tokenizer.h"
#include "train.h"
#include "train_state.h"
#include "train_step.h"

// The training data of this rank and the buffers a step reads.
struct trainer_data {
    struct dataset *ds;                       // sets[0]
    struct dataset *sets[LOADER_MAX_DATASETS]; // [data] path, or each of [data] paths
    double weights[LOADER_MAX_DATASETS];      // normalised blend weights (1 alone)
    int n_sets;
    FILE *sample_log;                         // TRIDENT_LOG_SAMPLES; NULL: none
    struct loader train_loader, val_loader;
    bool has_val;                      // the val split holds at least one global batch
    bool reads_tokens, reads_targets;  // first (every one under concat_reset) / last pipeline stage
    int accum;                         // microbatches per step on this rank
    int32_t *seqs;                     // (B, T + 1) one microbatch from the loader
    uint8_t *mask;                     // (B, T + 1) its /loss_mask (loss_on = response)
    int32_t *tokens, *targets;         // (accum, B, T)
    struct tokenizer *tok;             // for samples (TP group of DP rank 0); NULL: none
};

// This rank's model shard and its optimizer.
struct trainer_model {
    struct backend *be;
    struct llama_config lc;
    struct model *model;
    struct optimizer *opt;
    struct optimizer_config oc;
    bool whole_model;         // one stage, one chunk: evaluation and samples run
    int n_slots;              // activation slots: microbatches in flight on this stage
    size_t mem_bytes;         // arenas of this rank: params, grads, AdamW, activations
};

// The grid and what moves data between its ranks.
struct trainer_parallel {
    struct topology topo;
    struct parallel_groups groups;
    struct grad_sync *sync;    // NULL under ZeRO-1, 2, 3
    struct fsdp *fsdp;         // ZeRO-2/3; else NULL
    struct pipeline_exec pipe; // pp > 1 or virtual stages
    struct train_ctx ctx;      // what train_step_run gets: model, optimizer and the above
};

// Host copies for checkpoints (allocated on first save or resume).
struct trainer_ckpt {
    int start_step;           // optimizer steps done before this run (resume)
    char last[CKPT_PATH_MAX]; // the checkpoint last saved or resumed from; "" none
    float *host_params;       // (n_params,) host copy of the parameter arena (FP32: the
                              // master weights of a BF16/FP16 model on resume)
    float *host_master;       // (range,) this rank's FP32 master weights (BF16/FP16 save)
    float *host_m, *host_v;   // this rank's moment range
    struct ckpt_piece *pieces; // (3 n + L) for n parameter tensors and L local layers: what a save
                               // writes or a resume reads (L: the FP8 scaling state's)
    float *host_fp8;          // the FP8 scaling state of this rank's FP8 blocks (delayed scaling;
                              // model_fp8_state_get), allocated on first save
    struct ckpt_async *inflight; // [checkpoint] async: the save being written; NULL none
    double inflight_begun_s;     // time_now_s() when its writer started
    double inflight_stall_s;     // the seconds it held training so far (snapshot, collectives)
    double inflight_wait_s;      // of them, waiting for its background work
};

// The log line, metrics.jsonl and their denominators.
struct trainer_log {
    FILE *metrics;            // rank 0
    struct metrics_sink *sink; // rank 0: TensorBoard and Prometheus (metrics_sink.h); NULL none
    double flops_per_token;   // 6 N + attention (docs/design.md §9)
    double peak_flops;        // all ranks together, FLOP/s
    double *split_all;        // (world, SPLIT_N) per-rank time split, gathered for the log
    double open_s;            // time_now_s() when trainer_open began: [train] exit_duration_mins counts from it
    int *threads_all;         // (world, 2): each rank's OpenMP threads and enum
                              // threads_source (base/threads.h), gathered on rank 0
    double train_s, eval_s, sample_s, save_s; // this start's seconds in training steps (batch
                              // read, step, log line, stop agreement), evaluation, text
                              // samples and checkpoint saves: the done line's split (§9)
};

// struct trainer_progress (where the run stands beyond its step count): train_state.h.

// The first step of a start may go WATCHDOG_FIRST_STEP x [system] watchdog_s
// without progress: it also allocates workspaces and sets up communicators
// (NCCL's lazily), which can take long at scale; so may each start-up phase
// (device, data, model, parallel set-up). Reading weights (a checkpoint, an
// init_from folder) also gets 1 x watchdog_s per WATCHDOG_READ_BYTES_PER_S x
// watchdog_s bytes of its files (each rank checksums every rank file of a
// checkpoint), and kicks per tensor piece read (docs/design.md §8).
// Values per rank in the step record's time split (train.c log_step): compute_s,
// comm_s, pipeline_wait_s, dp_buckets_early, pp_idle_s.
enum { SPLIT_N = 5 };
enum { WATCHDOG_FIRST_STEP = 5 };
#define WATCHDOG_READ_BYTES_PER_S 50e6

struct trainer {
    struct config cfg;
    struct trainer_progress progress;
    struct trainer_data data;
    struct trainer_model m;
    struct trainer_parallel par;
    struct trainer_ckpt ckpt;
    struct trainer_log log;
    struct watchdog *watchdog; // NULL when [system] watchdog_s = 0
    struct loss_scaler scaler; // fp16 (par.ctx.scaler points here); else unused
    int fault_grad_inf_step;   // TRIDENT_FAULT=grad_inf:STEP[@RANK] on this rank; 0: none
};

// Resumes from [checkpoint] resume (auto: dir/latest) when there is one:
// parameters, moments, optimizer step, loader state, progress. Sets
// ckpt.start_step and ckpt.last.
// Errors: STATUS_BAD_INPUT for a checkpoint that does not fit this run.
enum status trainer_resume(struct trainer *t, struct trainer_error *err);
// Saves a checkpoint of `steps_done` steps with t->progress (collective over
// the world); sets ckpt.last. Errors: STATUS_RUNTIME on every rank (also for
// a parameter or moment that is NaN or infinite: never saved); the previous
// checkpoint stays `latest`.
// A save in flight ([checkpoint] async) commits first (trainer_save_complete).
enum status trainer_save(struct trainer *t, int steps_done, struct trainer_error *err);
// [checkpoint] async (docs/design.md §7 "Asynchronous saves"): waits for the
// save in flight to commit (trainer_save_complete), snapshots this rank's
// pieces into the host buffers (backend_to_host) and starts the background
// writer (checkpoint_save_begin; collective). Errors: STATUS_RUNTIME on
// every rank.
enum status trainer_save_async(struct trainer *t, int steps_done, struct trainer_error *err);
// This rank's background work (the writer, then rank 0's commit): 0
// running, 1 done (or none in flight), 2 failed. Not a collective: the loop
// all-reduces it with the stop flags.
int trainer_save_writer_state(const struct trainer *t);
bool trainer_save_in_flight(const struct trainer *t);
// One phase of the save in flight (checkpoint_save_advance; a collective
// every rank calls at the same step, when every rank's background work is
// done or one failed): the writes agreed and rank 0's commit started; then
// the commit agreed, ckpt.last set, the record logged. No-op without one.
// Errors: STATUS_RUNTIME on every rank naming the failing rank(s) and their
// reasons (the save dropped, the previous `latest` untouched).
enum status trainer_save_advance(struct trainer *t, struct trainer_error *err);
// The same until committed (waiting for the background work): before
// another save.
enum status trainer_save_complete(struct trainer *t, struct trainer_error *err);
// Joins the writer and drops the save in flight (error paths; no commit).
void trainer_save_abandon(struct trainer *t);

// One key whose value in this run's config differs from the checkpoint's.
struct resume_change {
    char key[32];            // "train.steps"
    char saved[40], now[40]; // the checkpoint's value, this run's
    const char *rule;        // what a resume does about it, for the message
    bool refused;            // the resume cannot continue with it
};
#define RESUME_MAX_CHANGES 10
// What trainer_resume_compare found: the changes and the verdict.
struct resume_check {
    int n;
    struct resume_change change[RESUME_MAX_CHANGES];
    bool schedule_changed; // steps, lr, min_lr, warmup_steps or lr_schedule differ
    bool schedule_unknown; // the checkpoint predates the stored schedule (not compared)
    bool refused;          // some change is refused
};

// The one place that compares a resumed run's config c with the values its
// checkpoint saved (docs/design.md §7, "What a resume may change"):
// - the LR schedule, [train] steps, lr, min_lr, warmup_steps, lr_schedule:
//   refused unless [train] override_schedule = true (then continued:
//   struct optimizer_config rebase_step); not compared for a checkpoint
//   without them (saved->opt.has_schedule false: schedule_unknown);
// - [train] global_batch_size: continues at the next unconsumed sample (the
//   loader state counts samples; a batch-index state of format 1 is not
//   compared: it is converted with this run's value);
// - [train] seq_len and seed: refused (the samples are cut by seq_len and
//   ordered by seed: "the next sample" of the new value is not the old one's).
// - [train] loss_on: refused, no override (the loss and validation curves of
//   one run would mix two measures, and the moments were accumulated for the
//   other loss); a new phase starts fresh with model.init_from. Not compared
//   for a checkpoint that predates it (saved->progress.loss_on -1).
// Pure: no I/O; every rank computes the same verdict from the same state.
void trainer_resume_compare(const struct trainer_saved *saved, const struct config *c,
                            struct resume_check *out);
// The message of a check: "PATH: this run's config differs from the
// checkpoint's: KEY SAVED -> NOW (RULE); ..." and, when refused, how to go
// on (train.override_schedule = true for the schedule, else restoring the
// values or a fresh run in a new [checkpoint] dir). buf: n bytes.
void trainer_resume_message(const struct resume_check *rc, const char *path, char *buf, size_t n);

// Marks err as found by this rank alone (struct trainer_error) and returns its status.
static inline enum status trainer_alone(struct trainer_error *err) {
    err->alone = true;
    return err->err.status;
}

#endif

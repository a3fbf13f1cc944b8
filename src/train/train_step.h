// train_step.h: one optimizer step over a global batch split in microbatches.
//
// The loss is the mean over all non-ignored target tokens of the whole global
// batch (Megatron-LM's and torch's `cross_entropy(reduction="mean")` over the
// concatenated batch): each microbatch's backward is scaled by 1 / (targets
// counted over every microbatch and, with data parallelism, every rank), so
// microbatches of different sizes weigh by their tokens, not equally.
#ifndef TRIDENT_TRAIN_STEP_H
#define TRIDENT_TRAIN_STEP_H

#include <stdbool.h>
#include <stdint.h>

#include "base/state_entry.h"
#include "fsdp.h"
#include "grad_sync.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "parallel/comm.h"
#include "parallel/pipeline.h"

struct train_step_result {
    double loss;      // mean loss over the global batch's non-ignored targets
    double grad_norm; // global L2 norm before clipping
    double clip_coef; // factor the gradients were scaled by (1: not clipped)
    double lr;        // learning rate of the step's place in the schedule (used unless skipped)
    long n_targets;   // non-ignored targets in the global batch
    bool skipped;     // train_step_should_skip: no update was applied
    double loss_scale; // the loss scale of this step's backward (1 without a scaler)
    bool overflow;    // skipped, and the dynamic loss scaler backed off for it (struct
                      // loss_scaler): an fp16 overflow, not counted toward max_skipped_steps
    int64_t fp8_saturated; // values this rank's FP8 casts saturated in the step
                           // (model_fp8_step_end); 0 without FP8
};

// The fp16 loss scale (Micikevicius et al. 2018, §3.2; Megatron-LM's
// DynamicGradScaler without hysteresis, i.e. PyTorch's GradScaler): the
// loss is multiplied by `scale` before the backward pass and the gradients
// divided by it before clipping and AdamW. A step whose gradients hold an
// inf or NaN is skipped (train_step_should_skip) and, when dynamic, the
// scale backs off (times backoff, not below min_scale); after
// growth_interval applied steps in a row it grows (times growth).
struct loss_scaler {
    double scale;           // current scale
    double min_scale, backoff, growth;
    int growth_interval;    // applied steps without an overflow before it grows
    int good_steps;         // applied steps since the last overflow or growth
    bool dynamic;           // false: a fixed scale (overflows skip, nothing changes)
};

// Updates s after a step with verdict `skipped` whose loss was finite or
// not. Returns true when the skip is an overflow the scale absorbed (it
// backed off): a dynamic scale above min_scale and a finite loss. An
// overflow at min_scale, a non-finite loss (the forward pass overflowed,
// which no scale fixes) or any skip under a fixed scale returns false: that
// skip counts toward [train] max_skipped_steps like a bf16/fp32 one.
bool loss_scaler_update(struct loss_scaler *s, bool skipped, bool loss_finite);

// The scaler's state as a checkpoint's /state holds it (its entries,
// base/state_entry.h; docs/formats.md): "loss_scale" (the scale; 0 for a run
// without a scaler, bf16 or fp32; 1 in files written before mixed precision)
// and "loss_scale_good_steps" (its growth counter).
struct loss_scaler_saved {
    double scale;
    int64_t good_steps;
};
// What a save holds of s (NULL: a run without a scaler).
void loss_scaler_saved_of(const struct loss_scaler *s, struct loss_scaler_saved *out);
// The entries over s, into out (room for cap); returns how many.
int loss_scaler_state_entries(struct loss_scaler_saved *s, struct state_entry *out, int cap);
// Judges what a load found: scale finite and >= 0, good_steps 0..INT_MAX.
// Errors: STATUS_BAD_INPUT naming the entry (the caller adds the file).
enum status loss_scaler_saved_check(const struct loss_scaler_saved *s, struct error *err);
// A resume: a dynamic scale (s not NULL) continues where it was; one saved
// without a scaler (0) leaves this run's initial scale.
void loss_scaler_saved_restore(struct loss_scaler *s, const struct loss_scaler_saved *saved);

// The verdict on a step: skip it (apply no update) when the loss or the
// global gradient norm is NaN or infinite. The fp16 loss scaler takes the
// same verdict for an overflow (an inf or NaN in any gradient makes the norm
// non-finite).
//
// Why every rank of every group agrees without a collective of its own: the
// loss each rank holds is the last stage's, summed over DP and sent over PP
// (train_step_run), and it is the same on every TP rank (the cross-entropy
// is composed from TP-reduced partials); the norm is summed over TP, PP and,
// under ZeRO-1, the DP shards (optimizer_prepare), and without ZeRO each DP
// rank holds the same DP-summed gradients (as its identical parameters
// already require). A NaN or an infinity in any addend of those sums makes
// every rank's result non-finite whatever the order of summation, and the
// sum of squares is in double, which fp32 gradients cannot overflow; so the
// verdict is the same everywhere.
bool train_step_should_skip(double loss, double grad_norm);

// [train] loss_on = response: targets (B, T) I32, the next-token targets of
// the loader's sequences whose /loss_mask is mask (B, T + 1) uint8, become
// IGNORE_INDEX where the target token's mask is 0 (mask[b][t + 1] for
// targets[b][t]). Such a target then has loss 0 and gradient 0 (the
// cross-entropy's ignore rows) and is left out of the count train_step_run
// sums over microbatches and DP ranks, so the step's loss is
//   sum of the masked-in token losses of the global batch / their number.
void train_mask_targets(int32_t *targets, const uint8_t *mask, int B, int T);

// What one rank trains with. NULL members are "none": groups NULL is a single
// rank; sync NULL no overlapped DP all-reduce (also under ZeRO-1, whose
// optimizer reduce-scatters); pipe NULL a model that is one whole stage;
// embed the tied-embedding group of the first and last stages (NULL, or of
// size 0 on a middle stage, when there is nothing to sum).
struct train_ctx {
    struct model *model;
    struct optimizer *opt;
    const struct optimizer_config *cfg;
    const struct parallel_groups *groups;
    struct grad_sync *sync;
    struct pipeline_exec *pipe;
    struct comm_group *embed;
    struct loss_scaler *scaler; // fp16: scale the loss, unscale the gradients; NULL: scale 1
    bool fault_grad_inf; // tests (TRIDENT_FAULT=grad_inf): this rank's gradients get an inf
                         // before this step's backward (so the DP reduction carries it)
    struct fsdp *fsdp;   // ZeRO-2/3 (fsdp.h); NULL: none
};

// Runs forward and backward on n_micro microbatches and one AdamW step, or
// none when train_step_should_skip says so (out->skipped). With FP8 linear
// layers (model_fp8_on) the step is bracketed by model_fp8_step_begin and
// model_fp8_step_end (after the verdict, before AdamW: delayed scaling's
// amax reduction and scale update, dropped for a skipped step). With a loss
// scaler, the backward runs on the loss times its scale, the norm and the
// clip coefficient are of the unscaled gradients, AdamW takes them divided
// by the scale, and the scaler is updated (loss_scaler_update).
// tokens, targets: (n_micro, B, T) I32 host arrays (targets IGNORE_INDEX = ignored)
// of this data-parallel rank; under pipeline parallelism only the first stage
// reads tokens and only the last targets (the others may pass NULL). The
// target count and the loss are summed over DP and, for the log, sent from
// the last pipeline stage to every stage. lr_step, the place in the LR
// schedule (steps applied before this one, from 0), selects the learning
// rate. When every target is ignored, the loss is 0, the gradients are 0 and
// the step still runs (weight decay only), so every rank takes the same
// number of steps. Errors: the pipeline schedule's (pipeline_run), on this
// rank alone; the step is then unfinished.
enum status train_step_run(struct train_ctx *ctx, int lr_step, const int32_t *tokens,
                           const int32_t *targets, int n_micro, int B, int T,
                           struct train_step_result *out, struct error *err);

// The loss sum and target count of n_micro microbatches without a step, over
// this rank's data-parallel group and, under pipeline parallelism, sent from
// the last stage to every stage (validation). With a pipeline the schedule
// runs its backwards too, with a zero loss scale: the gradients it adds are
// exactly zero, and the next step zeroes them anyway. Errors: as
// train_step_run.
enum status train_step_eval(struct train_ctx *ctx, const int32_t *tokens, const int32_t *targets,
                            int n_micro, int B, int T, double *loss_sum, int64_t *count,
                            struct error *err);

// Points a pipeline executor's callbacks at this module's (before
// pipeline_exec_init); train_step_run sets its ctx each step.
void train_step_bind_pipeline(struct pipeline_exec *x);

// The same for a model that is one whole stage: train_step_run with only
// these members set (unit tests and benchmarks; the trainer calls
// train_step_run). Without a pipeline a step cannot fail.
void train_step(struct model *m, struct optimizer *opt, const struct optimizer_config *cfg,
                const struct parallel_groups *groups, struct grad_sync *sync, int lr_step,
                const int32_t *tokens, const int32_t *targets, int n_micro, int B, int T,
                struct train_step_result *out);

#endif

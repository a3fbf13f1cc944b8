// train_step.h: one optimizer step over a global batch split in microbatches.
//
// The loss is the mean over all non-ignored targets of the whole global batch
// (Megatron-LM's and torch's `cross_entropy(reduction="mean")` over the
// concatenated batch): each microbatch's backward is scaled by 1 / (targets
// counted over every microbatch and, with data parallelism, every rank), so
// microbatches of different sizes weigh by their tokens, not equally.
#ifndef TRIDENT_TRAIN_STEP_H
#define TRIDENT_TRAIN_STEP_H

#include <stdint.h>

#include "comm.h"
#include "grad_sync.h"
#include "model.h"
#include "optimizer.h"

struct train_step_result {
    double loss;      // mean loss over the global batch's non-ignored targets
    double grad_norm; // global L2 norm before clipping
    double clip_coef; // factor the gradients were scaled by (1: not clipped)
    double lr;        // learning rate used
    long n_targets;   // non-ignored targets in the global batch
};

// Runs forward and backward on n_micro microbatches and one AdamW step.
// tokens, targets: (n_micro, B, T) I32 host arrays (targets -100 = ignored)
// of this data-parallel rank. groups: the parallel groups (NULL: one rank);
// the target count and the loss are summed over DP. sync: the overlapped DP
// gradient all-reduce (NULL: none; also NULL under ZeRO-1, whose optimizer
// reduce-scatters instead), armed for the last microbatch's backward.
// step counts from 0 and selects the learning rate. When every target is
// ignored, the loss is 0, the gradients are 0 and the step still runs
// (weight decay only), so every rank takes the same number of steps.
void train_step(struct model *m, struct optimizer *opt, const struct optimizer_config *cfg,
                const struct parallel_groups *groups, struct grad_sync *sync, int step, const int32_t *tokens, const int32_t *targets, int n_micro, int B,
                int T, struct train_step_result *out);

#endif

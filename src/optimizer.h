// optimizer.h: AdamW with decoupled weight decay, the learning-rate schedule,
// and clipping by the global gradient norm.
//
// Math: Loshchilov & Hutter 2019 (AdamW, alg. 2) as torch.optim.AdamW computes
// it; clipping as torch.nn.utils.clip_grad_norm_ (coefficient
// max_norm / (norm + 1e-6), capped at 1); schedule as llm.c / Megatron-LM:
// linear warmup then cosine, linear or constant decay to min_lr.
#ifndef TRIDENT_OPTIMIZER_H
#define TRIDENT_OPTIMIZER_H

#include "common.h"
#include "model.h"
#include "ops.h"

enum lr_schedule { LR_SCHEDULE_COSINE, LR_SCHEDULE_LINEAR, LR_SCHEDULE_CONSTANT };

struct optimizer_config {
    double lr;            // peak learning rate
    double min_lr;        // floor reached at the last step
    int warmup_steps;     // linear warmup length, steps
    int steps;            // total optimizer steps of the run
    enum lr_schedule schedule;
    double beta1, beta2, eps;
    double weight_decay;  // applied to matrices only (param_info.decay)
    double grad_clip;     // max global L2 norm; <= 0 disables clipping
};

// Learning rate of optimizer step `step` (counts from 0):
//   step < warmup:  lr * (step + 1) / warmup
//   else ratio = (step - warmup) / (steps - warmup), clamped to [0, 1];
//   cosine: min_lr + 0.5 (lr - min_lr)(1 + cos(pi ratio)); linear:
//   lr - (lr - min_lr) ratio; constant: lr.
double optimizer_lr(const struct optimizer_config *cfg, int step);

// Clip coefficient for a global gradient norm: min(1, clip / (norm + 1e-6)),
// 1 when clipping is disabled.
double optimizer_clip_coef(const struct optimizer_config *cfg, double grad_norm);

struct optimizer;

// Allocates fp32 (fp64 for an fp64 model) moments m and v for every element
// of the model's parameter arena (one arena). Errors: STATUS_RUNTIME when out
// of backend memory.
enum status optimizer_init(struct optimizer **out, struct backend *be, struct model *model,
                           const struct optimizer_config *cfg, struct error *err);
void optimizer_free(struct optimizer *opt);

// Bytes of optimizer state this rank holds (m, v, master weights).
size_t optimizer_state_bytes(const struct optimizer *opt);

// Sum of squares of this rank's gradients, counting each parameter once
// (accumulated in double).
double optimizer_grad_sum_squares(struct optimizer *opt);

// One AdamW step on every parameter with the current gradients times
// grad_scale (the clip coefficient) at learning rate lr. Advances the step
// counter used for bias correction.
void optimizer_step(struct optimizer *opt, double lr, double grad_scale);

// Optimizer steps taken so far.
int optimizer_steps_done(const struct optimizer *opt);

#endif

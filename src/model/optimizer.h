// optimizer.h: AdamW with decoupled weight decay, the learning-rate schedule,
// clipping by the global gradient norm, and ZeRO-1 sharding of its state.
//
// Math: Loshchilov & Hutter 2019 (AdamW, alg. 2) as torch.optim.AdamW computes
// it; clipping as torch.nn.utils.clip_grad_norm_ (coefficient
// max_norm / (norm + 1e-6), capped at 1); schedule as llm.c / Megatron-LM:
// linear warmup then cosine, linear or constant decay to min_lr.
// ZeRO-1: Rajbhandari et al. 2020, §5.1 (P_os): each data-parallel rank keeps
// the moments of 1/dp of the parameters; gradients are reduce-scattered, each
// rank updates its shard, and the updated parameters are all-gathered.
#ifndef TRIDENT_OPTIMIZER_H
#define TRIDENT_OPTIMIZER_H

#include "base/common.h"
#include "base/state_entry.h"
#include "kernels/ops.h"
#include "model.h"
#include "parallel/comm.h"

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
    // A schedule continued from a checkpoint of another schedule ([train]
    // override_schedule): from step rebase_step on (> 0; 0: none) it starts
    // at rebase_lr, the lr of step rebase_step - 1 under the checkpoint's
    // schedule (optimizer_lr).
    int rebase_step;
    double rebase_lr;
    enum dtype grad_dtype; // ZeRO-1's reduce-scatter of the FP32 gradients: DTYPE_FP32 (0,
                           // the default) or DTYPE_BF16 (rounded for the transfer, comm.h's
                           // BF16 sum, widened into the FP32 shard)
};

// struct parallel_groups, the groups the optimizer reduces over: model.h.

// Learning rate of optimizer step `step` (counts from 0):
//   step < warmup:  lr * (step + 1) / warmup
//   else ratio = (step - warmup) / (steps - warmup), clamped to [0, 1];
//   cosine: min_lr + 0.5 (lr - min_lr)(1 + cos(pi ratio)); linear:
//   lr - (lr - min_lr) ratio; constant: lr.
// Continued (rebase_step R > 0, step >= R; lr0 = rebase_lr, the lr step R - 1
// had), so that no step's lr jumps at the resume:
//   R < warmup, step < warmup: lr0 + (lr - lr0)(step - R + 1) / (warmup - R)
//     (the warmup goes on from lr0 and reaches lr at step warmup - 1), then
//     the decay above;
//   R >= warmup: ratio = (step - R + 1) / (steps - R), clamped to [0, 1]:
//     cosine: min_lr + 0.5 (lr0 - min_lr)(1 + cos(pi ratio)); linear:
//     lr0 - (lr0 - min_lr) ratio; constant: lr0. The decay restarts from lr0
//     and reaches min_lr exactly at the last step, steps - 1.
double optimizer_lr(const struct optimizer_config *cfg, int step);

// Clip coefficient for a global gradient norm: min(1, clip / (norm + 1e-6)),
// 1 when clipping is disabled.
double optimizer_clip_coef(const struct optimizer_config *cfg, double grad_norm);

struct optimizer;

// Allocates fp32 (fp64 for an fp64 model) moments m and v, and for a BF16 /
// FP16 model FP32 master weights initialised from its parameters: for the whole
// parameter arena, or with zero_stage 1 for this DP rank's 1/dp of it (the
// arena must then be padded to a multiple of dp: model_shard.arena_multiple;
// with expert parallelism, groups->ep of more than one rank and routed-expert
// tensors (param_info.expert), the arena's runs of dense tensors are each
// split over dp and its runs of expert tensors each over expert_dp, the
// ranks holding the same experts, the group's last rank taking a run's
// len % S last elements: one range per run, optimizer_ranges),
// or with zero_stage 2 or 3 for its 1/dp slice of every unit (each padded to
// a multiple of dp: model_shard.unit_multiple), with the gradient shard and
// under ZeRO-3 the parameter shard (whose master weights wait for
// optimizer_sync_master).
// groups NULL: a single rank. Errors: STATUS_RUNTIME when out of memory;
// STATUS_BAD_INPUT when the arena does not divide evenly for ZeRO-1.
enum status optimizer_init(struct optimizer **out, struct backend *be, struct model *model,
                           const struct optimizer_config *cfg, const struct parallel_groups *groups,
                           struct error *err);
void optimizer_free(struct optimizer *opt);

// Bytes of optimizer state this rank holds (m, v, the FP32 master weights
// of a BF16/FP16 model, under ZeRO-1 the reduce-scattered gradient shard it
// updates from (under ZeRO-2/3 fsdp_bytes counts it), and under ZeRO-1 with grad_dtype BF16 the BF16 buffers of
// the reduce-scatter: the whole arena's gradients and this rank's reduced
// shard).
size_t optimizer_state_bytes(const struct optimizer *opt);
// The same from sizes alone (trident plan): moments (and for a BF16/FP16
// model master weights) for the n elements of this rank's ranges, of an
// arena of n_params elements of a model of dtype (n: n_params without
// ZeRO; optimizer_zero1_numel under zero_stage 1 with dp > 1; n_params / dp
// under ZeRO-2/3, each unit padded to divide), plus under ZeRO-1 with dp > 1
// the gradient shard (the gradient arena's dtype) and, when grad_dtype is
// DTYPE_BF16, the BF16 reduce-scatter buffers (the n_params gradients and
// the n reduced). Exact: optimizer_state_bytes of that rank.
size_t optimizer_plan_bytes(size_t n_params, size_t n, enum dtype dtype, int dp, int zero_stage,
                            enum dtype grad_dtype);
// ZeRO-1's elements of one rank's ranges (optimizer_init; what its moments
// hold): the runs of an arena of numel elements holding the np tensors of p
// (arena order and offsets as model_params or model_shard_param_table give
// them; p may be NULL with np 0), the one run [0, numel) over dp ranks, or
// with ep > 1 and routed-expert tensors (param_info.expert) among p each run
// of dense tensors over dp and each run of expert tensors over the dp / ep
// ranks of expert_dp; in each the rank's len / S elements, the group's last
// rank (dp_rank = dp - 1, expert_dp_rank = dp / ep - 1) also the len % S
// after them. dp_rank: the rank in the gradient group (data x context);
// expert_dp_rank: in expert_dp. Needs ep to divide dp.
size_t optimizer_zero1_numel(const struct param_info *p, int np, size_t numel, int dp, int dp_rank,
                             int ep, int expert_dp_rank);

// Makes the gradients final and returns the global L2 norm over the whole
// model, each parameter counted once (param_info.norm_skip), accumulated in
// double and summed over TP and PP (and over DP shards under ZeRO-1/2/3;
// ZeRO-1 first reduce-scatters the gradients over DP here, with expert
// parallelism each run over its group (optimizer_init), the squares summed
// over dp = ep x expert_dp; ZeRO-2/3 find them reduce-scattered in the
// gradient shard; the routed experts' squares otherwise summed over ep).
// Without ZeRO the gradients must already be summed over DP (grad_sync).
double optimizer_prepare(struct optimizer *opt);

// One AdamW step on this rank's parameters (its shard under ZeRO-1, then the
// all-gather over DP, or with expert parallelism one per run over its group; ZeRO-2: its slice of each unit, then an all-gather per
// unit; ZeRO-3: its parameter shard, no gather) with the gradients times grad_scale (the clip
// coefficient) at learning rate lr. Advances the bias-correction step.
void optimizer_step(struct optimizer *opt, double lr, double grad_scale);

// Optimizer steps taken so far; and the element range [begin, end) of the
// parameter arena whose moments this rank holds (one range only: zero_stage
// 0, and 1 without expert parallelism).
int optimizer_steps_done(const struct optimizer *opt);
void optimizer_shard_range(const struct optimizer *opt, size_t *begin, size_t *end);
// The ranges of the arena this rank updates, any stage: range k is elements
// [begin[k], end[k]) of the arena, stored from element at[k] of the moments,
// the master weights, the gradient shard and the ZeRO-3 parameter shard
// (optimizer_numel elements in all). Zero 0/1: one range (ZeRO-1 with
// expert parallelism: one per run of dense or expert tensors, this rank's
// block of it, optimizer_init); ZeRO-2/3: shard
// rank d of S's slice [b + d len / S, b + (d + 1) len / S) of each unit [b,
// b + len) (model_units), in unit order. Returns the count.
int optimizer_ranges(const struct optimizer *opt, const size_t **begin, const size_t **end,
                     const size_t **at);
size_t optimizer_numel(const struct optimizer *opt);
// ZeRO-1/2/3: (optimizer_numel,) FP32 (FP64) gradients of this rank's ranges,
// which optimizer_prepare reduce-scatters into under ZeRO-1 and the trainer
// sums its per-unit reduce-scatters into under ZeRO-2/3 (zeroed at init;
// the trainer zeroes it each step). Empty at zero_stage 0.
struct tensor optimizer_grad_shard(struct optimizer *opt);
// ZeRO-3: (optimizer_numel,) this rank's parameters in the model dtype: the
// step writes them (rounded from the master weights of a BF16/FP16 model);
// the trainer gathers units from them. Empty otherwise.
struct tensor optimizer_param_shard(struct optimizer *opt);
// The master weights := this rank's parameters (widened): at init, and
// under ZeRO-3 once the trainer has filled optimizer_param_shard.
void optimizer_sync_master(struct optimizer *opt);

// The names of the optimizer's state tensors, one of each per parameter
// tensor, in the order optimizer_moments returns them: the prefixes of their
// checkpoint pieces ("<name>/<hf name>", docs/formats.md), AdamW's first and
// second moments "adam_m" and "adam_v" (the names on disk since format 1).
// The checkpoint layer takes them from here (checkpoint_check_tensors)
// instead of knowing the optimizer. Returns how many (2); *names points at them.
int optimizer_state_names(const char *const **names);

// The moments (end - begin,) of this rank's range, in backend memory, for
// checkpoints; and setting the step counter on resume.
void optimizer_moments(struct optimizer *opt, struct tensor *m, struct tensor *v);
void optimizer_set_steps_done(struct optimizer *opt, int steps);
// The optimizer's scalars as a checkpoint's /state holds them (its entries,
// base/state_entry.h; docs/formats.md "Checkpoints"): "opt_steps" (the
// bias-correction counter) and the LR schedule the run saved with,
// "train_steps", "lr", "min_lr", "warmup_steps", "lr_schedule" (enum
// lr_schedule), "lr_rebase_step", "lr_rebase_lr" (struct optimizer_config's
// steps, lr, min_lr, warmup_steps, schedule, rebase_step, rebase_lr), all or
// none: files written before the schedule was stored hold none
// (has_schedule false, the rest 0). The trainer compares the schedule with
// its config (trainer_resume_compare) and continues it (rebase).
struct optimizer_saved {
    int64_t opt_steps;
    bool has_schedule;
    int64_t steps, warmup_steps, schedule, rebase_step;
    double lr, min_lr, rebase_lr;
    bool found[7]; // of the schedule's entries, by a load
};
// What a save of opt, running schedule cfg, holds.
void optimizer_saved_of(const struct optimizer *opt, const struct optimizer_config *cfg, struct optimizer_saved *s);
// The entries over s, into out (room for cap); returns how many.
int optimizer_state_entries(struct optimizer_saved *s, struct state_entry *out, int cap);
// Judges what a load found (sets has_schedule): every counter in range
// (opt_steps 0..INT_MAX - 1, the schedule's step counts 0..INT_MAX,
// train_steps >= 1), lr, min_lr and rebase_lr finite, the schedule all or
// none. Not the schedule's meaning: trainer_resume_compare refuses an
// unknown lr_schedule. Errors: STATUS_BAD_INPUT naming the entry (the caller
// adds the file).
enum status optimizer_saved_check(struct optimizer_saved *s, struct error *err);
// The checkpoint's schedule over cfg's other fields (for the lr it reached).
struct optimizer_config optimizer_saved_schedule(const struct optimizer_saved *s, const struct optimizer_config *cfg);
// A resume: the step counter as saved.
void optimizer_saved_restore(struct optimizer *opt, const struct optimizer_saved *s);

// The FP32 master weights (end - begin,) of this rank's range for a BF16/FP16
// model (ZeRO-1 shards them with the moments: each DP rank updates its range
// of the master weights and writes them rounded into the model's parameter
// arena, which the all-gather then completes); an empty tensor (numel 0) for
// an FP32/FP64 model, whose parameters are their own master.
struct tensor optimizer_master(struct optimizer *opt);

#endif

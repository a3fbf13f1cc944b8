// train_step.c: accumulation over microbatches (or a pipeline schedule),
// clipping, the verdict on non-finite steps, AdamW (train_step.h).
#include "train_step.h"

#include <limits.h>
#include <math.h>

#include "base/nvtx.h"

static struct comm_group *real(struct comm_group *g) { return g && g->size > 1 ? g : NULL; }

// The DP or PP group over host memory (the step's scalars: target counts,
// loss sums), NULL for a group of one rank.
enum { DP_GROUP, PP_GROUP };
static struct comm_group *host_group(const struct train_ctx *c, int which) {
    const struct parallel_groups *g = c->groups;
    if (!g) return NULL;
    return real(which == DP_GROUP ? parallel_host_group(g->dp, g->host_dp)
                                  : parallel_host_group(g->pp, g->host_pp));
}

// The pipeline executor's view of one step.
struct pp_step {
    struct model *model;
    const int32_t *tokens, *targets; // (n_micro, B, T)
    size_t per_micro;                // B * T
    double scale;                    // d loss / d (sum of token losses)
    struct grad_sync *sync;          // armed for each chunk's last backward; NULL: none (eval)
    struct fsdp *fsdp;               // ZeRO-2/3: polled while the executor waits; NULL: none
};

static void pp_forward(void *ctx, int micro, int chunk, int slot, const void *in, void *out) {
    struct pp_step *p = ctx;
    const int32_t *tok = p->tokens ? p->tokens + micro * p->per_micro : NULL;
    const int32_t *tgt = p->targets ? p->targets + micro * p->per_micro : NULL;
    NVTX_PUSH("microbatch %d chunk %d forward", micro, chunk);
    // The loss sum stays on the device until the step reads it once
    // (model_loss_sum_take): no copy back and wait per microbatch.
    model_forward_chunk(p->model, chunk, slot, tok, in, tgt, out, NULL, NULL);
    NVTX_POP();
}

// The chunk's last backward (last) finalises its gradients: the DP buckets
// they complete start during it (grad_sync.h).
static void pp_backward(void *ctx, int micro, int chunk, int slot, int wslot, bool last,
                        const void *dout, void *din) {
    struct pp_step *p = ctx;
    NVTX_PUSH("microbatch %d chunk %d backward%s", micro, chunk, wslot >= 0 ? " (input)" : "");
    if (p->sync && last) grad_sync_arm(p->sync);
    if (wslot >= 0)
        model_backward_chunk_input(p->model, chunk, slot, wslot, p->scale, dout, din);
    else
        model_backward_chunk(p->model, chunk, slot, p->scale, dout, din);
    if (p->sync && last) grad_sync_pause(p->sync);
    NVTX_POP();
}

// W of a split schedule: the chunk's deferred weight gradients; its last
// one finalises them, so the DP buckets start during it.
static void pp_weight(void *ctx, int micro, int chunk, int wslot, bool last) {
    struct pp_step *p = ctx;
    NVTX_PUSH("microbatch %d chunk %d backward (weight)", micro, chunk);
    if (p->sync && last) grad_sync_arm(p->sync);
    model_backward_chunk_weight(p->model, chunk, wslot);
    if (p->sync && last) grad_sync_pause(p->sync);
    NVTX_POP();
}

// The executor waits for a message: the started DP buckets move meanwhile.
static void pp_progress(void *ctx) {
    struct pp_step *p = ctx;
    if (p->sync) grad_sync_poll(p->sync);
    if (p->fsdp) fsdp_poll(p->fsdp);
}

void train_step_bind_pipeline(struct pipeline_exec *x) {
    x->forward = pp_forward, x->backward = pp_backward, x->weight = pp_weight,
    x->progress = pp_progress;
}

// Non-ignored targets of n_micro microbatches: the last stage's count (it
// alone sees the targets), 0 elsewhere; under context parallelism those of
// this rank's tokens (model_count_targets), summed over the gradient group.
static int64_t count_targets(const struct model *m, const int32_t *targets, int n_micro) {
    return model_is_last_stage(m) ? model_count_targets(m, targets, n_micro) : 0;
}

// Forward (and, with backward, backward) passes of every microbatch: the
// pipeline schedule, or microbatches in turn, with the DP gradient sync
// (ps->sync) armed for the last backward of each chunk (pp_backward). Under a
// pipeline the backwards always run (with a zero loss scale they add exact
// zeros). Errors: the pipeline's.
static enum status run_microbatches(struct train_ctx *c, struct pp_step *ps, int n_micro,
                                    bool backward, struct error *err) {
    if (c->pipe) {
        c->pipe->ctx = ps;
        return pipeline_run(c->pipe, err);
    }
    for (int k = 0; k < n_micro; k++) {
        pp_forward(ps, k, 0, 0, NULL, NULL);
        if (backward) pp_backward(ps, k, 0, 0, -1, k == n_micro - 1, NULL, NULL);
    }
    return STATUS_OK;
}

bool train_step_should_skip(double loss, double grad_norm) {
    return !isfinite(loss) || !isfinite(grad_norm);
}

void train_mask_targets(int32_t *targets, const uint8_t *mask, int B, int T) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            if (!mask[(size_t)b * (T + 1) + t + 1]) targets[(size_t)b * T + t] = IGNORE_INDEX;
}

void loss_scaler_saved_of(const struct loss_scaler *s, struct loss_scaler_saved *out) {
    *out = (struct loss_scaler_saved){.scale = s ? s->scale : 0.0, .good_steps = s ? s->good_steps : 0};
}

int loss_scaler_state_entries(struct loss_scaler_saved *s, struct state_entry *out, int cap) {
    const struct state_entry mine[] = {
        {"loss_scale", STATE_F64, 1, &s->scale, .required = true},
        {"loss_scale_good_steps", STATE_I64, 1, &s->good_steps, .required = true},
    };
    return state_entries_put(out, cap, mine, sizeof mine / sizeof mine[0]);
}

enum status loss_scaler_saved_check(const struct loss_scaler_saved *s, struct error *err) {
    if (!isfinite(s->scale) || s->scale < 0)
        return error_set(err, STATUS_BAD_INPUT, "/state loss_scale %g: expected a finite value >= 0", s->scale);
    return state_entry_range("loss_scale_good_steps", s->good_steps, 0, INT_MAX, err);
}

void loss_scaler_saved_restore(struct loss_scaler *s, const struct loss_scaler_saved *saved) {
    if (s && s->dynamic && saved->scale > 0) s->scale = saved->scale, s->good_steps = (int)saved->good_steps;
}

bool loss_scaler_update(struct loss_scaler *s, bool skipped, bool loss_finite) {
    if (!s->dynamic) return false;
    if (skipped) {
        s->good_steps = 0;
        if (!loss_finite || s->scale <= s->min_scale) return false;
        s->scale = MAX(s->scale * s->backoff, s->min_scale);
        return true;
    }
    if (++s->good_steps >= s->growth_interval) s->scale *= s->growth, s->good_steps = 0;
    return false;
}

// TRIDENT_FAULT=grad_inf: an inf in the first gradient element of this rank
// before the backward passes accumulate (+=) into it, so it survives them
// and reaches every reduction (DP sync, ZeRO reduce-scatter, the norm's sums)
// as a real overflow would.
// (ZeRO-2/3 have no gradient arena: fsdp_fault_grad_inf.)
static void poison_grads(struct model *m) {
    float inf = INFINITY;
    struct tensor g = model_grad_arena(m);
    CHECK(g.dtype == DTYPE_FP32, "grad_inf fault on a %s gradient arena", dtype_name(g.dtype));
    backend_to_device(model_backend(m), g.data, &inf, sizeof inf);
}

enum status train_step_run(struct train_ctx *c, int lr_step, const int32_t *tokens,
                           const int32_t *targets, int n_micro, int B, int T,
                           struct train_step_result *out, struct error *err) {
    struct model *m = c->model;
    struct comm_group *dp = host_group(c, DP_GROUP), *pp = host_group(c, PP_GROUP);
    bool last = model_is_last_stage(m);
    size_t per_micro = (size_t)B * T;
    // The last stage's DP group sums the target count before any backward.
    int64_t count = count_targets(m, targets, n_micro);
    if (dp && last) comm_all_reduce(dp, &count, 1, DTYPE_I64, COMM_SUM);
    double S = c->scaler ? c->scaler->scale : 1.0;
    struct pp_step ps = {m, tokens, targets, per_micro, count > 0 ? S / (double)count : 0.0, c->sync,
                         c->fsdp};

    model_zero_grad(m);
    model_fp8_step_begin(m);
    if (c->fsdp) fsdp_step_begin(c->fsdp);
    if (c->fault_grad_inf) {
        if (c->fsdp) fsdp_fault_grad_inf(c->fsdp);
        else poison_grads(m);
    }
    enum status st = run_microbatches(c, &ps, n_micro, true, err);
    if (st) return st;
    if (c->sync) grad_sync_finish(c->sync);
    if (c->fsdp) fsdp_step_end(c->fsdp); // the TP sums ran per unit (fsdp.h)
    else model_finish_grads(m);
    // A tied embedding lives on the first and the last stage: sum the two
    // gradients so both copies take the same step.
    if (real(c->embed)) {
        const struct param_info *p = model_find_param(m, "model.embed_tokens.weight");
        struct tensor g = c->fsdp ? fsdp_embed_grad_shard(c->fsdp) // ZeRO-2/3: this rank's slice
                                  : tensor_slice(model_grad_arena(m), p->offset, p->numel);
        comm_all_reduce(c->embed, g.data, g.numel, g.dtype, COMM_SUM);
    }
    NVTX_PUSH("optimizer"); // the norm's sums, clipping, AdamW (ZeRO-1's collectives inside)
    double norm = optimizer_prepare(c->opt) / S; // of the unscaled gradients
    // The step's one read of its loss, after the norm's sums have waited for
    // the backward pass anyway.
    double loss_sum = model_loss_sum_take(m);
    if (dp && last) comm_all_reduce(dp, &loss_sum, 1, DTYPE_FP64, COMM_SUM);
    if (pp) { // every stage logs the last stage's numbers
        double v[2] = {last ? loss_sum : 0, last ? (double)count : 0};
        comm_all_reduce(pp, v, 2, DTYPE_FP64, COMM_SUM);
        loss_sum = v[0], count = (int64_t)v[1];
    }
    double coef = optimizer_clip_coef(c->cfg, norm);
    double lr = optimizer_lr(c->cfg, lr_step);
    double loss = count > 0 ? loss_sum / count : 0.0;
    // Every rank reaches the same verdict without a collective of its own:
    // see train_step_should_skip. A skipped step leaves the parameters, the
    // moments and AdamW's step counter as they were.
    bool skip = train_step_should_skip(loss, norm);
    // FP8 scales for the next step from this one's amaxes (unless skipped),
    // before AdamW changes the weights the amaxes are of.
    out->fp8_saturated = model_fp8_step_end(m, skip);
    if (!skip) optimizer_step(c->opt, lr, coef / S);
    NVTX_POP();
    out->loss = loss, out->skipped = skip, out->loss_scale = S;
    out->overflow = c->scaler && loss_scaler_update(c->scaler, skip, isfinite(loss));
    out->grad_norm = norm, out->clip_coef = coef, out->lr = lr, out->n_targets = count;
    return STATUS_OK;
}

enum status train_step_eval(struct train_ctx *c, const int32_t *tokens, const int32_t *targets,
                            int n_micro, int B, int T, double *loss_sum, int64_t *count,
                            struct error *err) {
    struct model *m = c->model;
    struct comm_group *dp = host_group(c, DP_GROUP), *pp = host_group(c, PP_GROUP);
    bool last = model_is_last_stage(m);
    size_t per_micro = (size_t)B * T;
    int64_t n = count_targets(m, targets, n_micro);
    struct pp_step ps = {m, tokens, targets, per_micro, 0.0, NULL, c->fsdp};
    enum status st = run_microbatches(c, &ps, n_micro, false, err);
    if (c->fsdp) fsdp_step_end(c->fsdp); // frees the units kept gathered (reshard_after_forward false)
    if (st) return st;
    double v[2] = {model_loss_sum_take(m), last ? (double)n : 0};
    if (dp && last) comm_all_reduce(dp, v, 2, DTYPE_FP64, COMM_SUM);
    if (pp) comm_all_reduce(pp, v, 2, DTYPE_FP64, COMM_SUM);
    *loss_sum = v[0], *count = (int64_t)v[1];
    return STATUS_OK;
}

void train_step(struct model *m, struct optimizer *opt, const struct optimizer_config *cfg,
                const struct parallel_groups *groups, struct grad_sync *sync, int lr_step,
                const int32_t *tokens, const int32_t *targets, int n_micro, int B, int T,
                struct train_step_result *out) {
    struct train_ctx c = {m, opt, cfg, groups, sync, NULL, NULL, NULL, false, NULL};
    struct error err;
    enum status st = train_step_run(&c, lr_step, tokens, targets, n_micro, B, T, out, &err);
    CHECK(st == STATUS_OK, "a step without a pipeline failed: %s", err.msg);
}

// train_step.c: accumulation over microbatches, clipping, AdamW (train_step.h).
#include "train_step.h"


void train_step(struct model *m, struct optimizer *opt, const struct optimizer_config *cfg,
                const struct parallel_groups *groups, struct grad_sync *sync, int step, const int32_t *tokens, const int32_t *targets, int n_micro, int B,
                int T, struct train_step_result *out) {
    struct comm_group *dp = groups && groups->dp && groups->dp->size > 1 ? groups->dp : NULL;
    size_t per_micro = (size_t)B * T;
    int64_t count = 0;
    for (size_t i = 0; i < per_micro * n_micro; i++) count += targets[i] != -100;
    if (dp) comm_all_reduce(dp, &count, 1, DTYPE_I64, COMM_SUM);
    double scale = count > 0 ? 1.0 / (double)count : 0.0;

    model_zero_grad(m);
    double loss_sum = 0;
    for (int k = 0; k < n_micro; k++) {
        double micro_sum;
        long micro_count;
        model_forward(m, tokens + k * per_micro, targets + k * per_micro, &micro_sum, &micro_count);
        if (sync && k == n_micro - 1) grad_sync_arm(sync);
        model_backward(m, scale);
        loss_sum += micro_sum;
    }
    if (sync) grad_sync_finish(sync);
    model_finish_grads(m);
    if (dp) comm_all_reduce(dp, &loss_sum, 1, DTYPE_FP64, COMM_SUM);
    double norm = optimizer_prepare(opt);
    double coef = optimizer_clip_coef(cfg, norm);
    double lr = optimizer_lr(cfg, step);
    optimizer_step(opt, lr, coef);
    out->loss = count > 0 ? loss_sum / count : 0.0;
    out->grad_norm = norm, out->clip_coef = coef, out->lr = lr, out->n_targets = count;
}

// optimizer.c: AdamW over the model's parameter arena (see optimizer.h).
#include "optimizer.h"

#include <math.h>

struct optimizer {
    struct optimizer_config cfg;
    struct backend *be;
    struct model *model;
    struct tensor m, v; // (n_params,) first and second moments
    int step;           // steps taken
};

double optimizer_lr(const struct optimizer_config *c, int step) {
    if (step < c->warmup_steps) return c->lr * (step + 1) / c->warmup_steps;
    if (c->schedule == LR_SCHEDULE_CONSTANT) return c->lr;
    double span = c->steps - c->warmup_steps;
    double ratio = span > 0 ? (step - c->warmup_steps) / span : 1.0;
    ratio = ratio < 0 ? 0 : ratio > 1 ? 1 : ratio;
    if (c->schedule == LR_SCHEDULE_LINEAR) return c->lr - (c->lr - c->min_lr) * ratio;
    return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(M_PI * ratio));
}

double optimizer_clip_coef(const struct optimizer_config *c, double grad_norm) {
    if (c->grad_clip <= 0) return 1.0;
    double coef = c->grad_clip / (grad_norm + 1e-6);
    return coef < 1.0 ? coef : 1.0;
}

enum status optimizer_init(struct optimizer **out, struct backend *be, struct model *model,
                           const struct optimizer_config *cfg, struct error *err) {
    struct tensor g = model_grad_arena(model);
    size_t bytes = g.numel * dtype_size(g.dtype);
    void *m = backend_alloc(be, bytes), *v = backend_alloc(be, bytes);
    if (!m || !v) {
        backend_dealloc(be, m), backend_dealloc(be, v);
        return error_set(err, STATUS_RUNTIME, "optimizer: out of %s memory for 2 x %zu bytes of moments",
                         be->ops->name, bytes);
    }
    struct optimizer *o = xcalloc(1, sizeof *o);
    o->cfg = *cfg, o->be = be, o->model = model;
    o->m = tensor_view(m, g.dtype, g.numel);
    o->v = tensor_view(v, g.dtype, g.numel);
    backend_memset0(be, o->m);
    backend_memset0(be, o->v);
    *out = o;
    return STATUS_OK;
}

void optimizer_free(struct optimizer *o) {
    if (!o) return;
    backend_dealloc(o->be, o->m.data);
    backend_dealloc(o->be, o->v.data);
    free(o);
}

size_t optimizer_state_bytes(const struct optimizer *o) {
    return 2 * o->m.numel * dtype_size(o->m.dtype);
}

int optimizer_steps_done(const struct optimizer *o) { return o->step; }

double optimizer_grad_sum_squares(struct optimizer *o) {
    int n;
    const struct param_info *p = model_params(o->model, &n);
    struct tensor g = model_grad_arena(o->model);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += backend_sum_squares(o->be, tensor_slice(g, p[i].offset, p[i].numel), p[i].numel);
    return sum;
}

void optimizer_step(struct optimizer *o, double lr, double grad_scale) {
    int n;
    const struct param_info *p = model_params(o->model, &n);
    struct tensor w = model_param_arena(o->model), g = model_grad_arena(o->model);
    struct tensor none = tensor_view(NULL, DTYPE_FP32, 0);
    o->step++;
    for (int i = 0; i < n; i++) {
        size_t off = p[i].offset, k = p[i].numel;
        backend_adamw(o->be, tensor_slice(w, off, k), none, tensor_slice(g, off, k),
                      tensor_slice(o->m, off, k), tensor_slice(o->v, off, k), k, lr,
                      o->cfg.beta1, o->cfg.beta2, o->cfg.eps,
                      p[i].decay ? o->cfg.weight_decay : 0.0, grad_scale, o->step);
    }
}

// optimizer.c: AdamW over the model's parameter arena, optionally ZeRO-1
// sharded over data-parallel ranks (see optimizer.h).
#include "optimizer.h"

#include <math.h>

struct optimizer {
    struct optimizer_config cfg;
    struct parallel_groups groups;
    struct backend *be;
    struct model *model;
    size_t begin, end;  // this rank's range of the parameter arena
    struct tensor m, v; // (end - begin,) first and second moments
    struct tensor gshard; // (end - begin,) reduce-scattered gradients (ZeRO-1)
    struct tensor master; // (end - begin,) FP32 master weights of a BF16/FP16 model; else empty
    struct tensor gsend16, grecv16; // ZeRO-1, grad_dtype BF16: (n_params,) the gradients
                                    // rounded for the reduce-scatter, (end - begin,) its result
    int step;           // steps taken
};

double optimizer_lr(const struct optimizer_config *c, int step) {
    int R = c->rebase_step;
    if (R > 0 && step >= R && R >= c->warmup_steps) {
        double lr0 = c->rebase_lr, span = c->steps - R;
        double ratio = span > 0 ? (step - R + 1) / span : 1.0;
        ratio = ratio < 0 ? 0 : ratio > 1 ? 1 : ratio;
        if (c->schedule == LR_SCHEDULE_CONSTANT) return lr0;
        if (c->schedule == LR_SCHEDULE_LINEAR) return lr0 - (lr0 - c->min_lr) * ratio;
        return c->min_lr + 0.5 * (lr0 - c->min_lr) * (1.0 + cos(M_PI * ratio));
    }
    if (R > 0 && step >= R && step < c->warmup_steps)
        return c->rebase_lr + (c->lr - c->rebase_lr) * (step - R + 1) / (c->warmup_steps - R);
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

static bool low_precision(enum dtype d) { return d == DTYPE_BF16 || d == DTYPE_FP16; }

static int group_size(struct comm_group *g) { return g ? g->size : 1; }
static bool zero1(const struct optimizer *o) { return o->groups.zero_stage == 1 && group_size(o->groups.dp) > 1; }

enum status optimizer_init(struct optimizer **out, struct backend *be, struct model *model,
                           const struct optimizer_config *cfg, const struct parallel_groups *groups,
                           struct error *err) {
    struct optimizer *o = xcalloc(1, sizeof *o);
    o->cfg = *cfg, o->be = be, o->model = model;
    if (groups) o->groups = *groups;
    struct tensor g = model_grad_arena(model);
    o->begin = 0, o->end = g.numel;
    if (zero1(o)) {
        int dp = o->groups.dp->size, d = o->groups.dp->rank;
        if (g.numel % dp) {
            free(o);
            return error_set(err, STATUS_BAD_INPUT, "optimizer: ZeRO-1 needs the parameter arena "
                             "(%zu elements) padded to a multiple of dp = %d", g.numel, dp);
        }
        size_t per = g.numel / dp;
        o->begin = per * d, o->end = per * (d + 1);
    }
    size_t n = o->end - o->begin, bytes = n * dtype_size(g.dtype);
    void *m = backend_alloc(be, bytes), *v = backend_alloc(be, bytes);
    void *gs = zero1(o) ? backend_alloc(be, bytes) : NULL;
    struct tensor w = model_param_arena(model);
    bool lowp = low_precision(w.dtype);
    void *mw = lowp ? backend_alloc(be, n * sizeof(float)) : NULL;
    bool g16 = zero1(o) && cfg->grad_dtype == DTYPE_BF16;
    void *s16 = g16 ? backend_alloc(be, g.numel * sizeof(uint16_t)) : NULL;
    void *r16 = g16 ? backend_alloc(be, n * sizeof(uint16_t)) : NULL;
    if (!m || !v || (zero1(o) && !gs) || (lowp && !mw) || (g16 && (!s16 || !r16))) {
        backend_dealloc(be, m), backend_dealloc(be, v), backend_dealloc(be, gs);
        backend_dealloc(be, mw), backend_dealloc(be, s16), backend_dealloc(be, r16);
        free(o);
        return error_set(err, STATUS_RUNTIME, "optimizer: out of %s memory for %d x %zu bytes of "
                         "moments%s", be->ops->name, lowp ? 3 : 2, bytes,
                         lowp ? " and master weights" : "");
    }
    o->m = tensor_view(m, g.dtype, n);
    o->v = tensor_view(v, g.dtype, n);
    o->gshard = tensor_view(gs, g.dtype, gs ? n : 0);
    o->master = tensor_view(mw, DTYPE_FP32, mw ? n : 0);
    o->gsend16 = tensor_view(s16, DTYPE_BF16, s16 ? g.numel : 0);
    o->grecv16 = tensor_view(r16, DTYPE_BF16, r16 ? n : 0);
    backend_memset0(be, o->m);
    backend_memset0(be, o->v);
    // The master weights start as the model's (BF16/FP16 widen exactly).
    if (lowp) backend_copy(be, o->master, tensor_slice(w, o->begin, n), n);
    *out = o;
    return STATUS_OK;
}

void optimizer_free(struct optimizer *o) {
    if (!o) return;
    backend_dealloc(o->be, o->m.data);
    backend_dealloc(o->be, o->v.data);
    backend_dealloc(o->be, o->gshard.data);
    backend_dealloc(o->be, o->master.data);
    backend_dealloc(o->be, o->gsend16.data);
    backend_dealloc(o->be, o->grecv16.data);
    free(o);
}

size_t optimizer_plan_bytes(size_t n_params, enum dtype dtype, int dp, int zero_stage,
                            enum dtype grad_dtype) {
    bool z1 = zero_stage == 1 && dp > 1;
    size_t n = z1 ? n_params / dp : n_params;
    size_t master = low_precision(dtype) ? n * sizeof(float) : 0;
    size_t bf16_rs = z1 && grad_dtype == DTYPE_BF16 ? (n_params + n) * sizeof(uint16_t) : 0;
    size_t es = dtype_size(dtype == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32); // moments, gradients
    return (2 + (z1 ? 1 : 0)) * n * es + master + bf16_rs;
}

size_t optimizer_state_bytes(const struct optimizer *o) {
    return 2 * o->m.numel * dtype_size(o->m.dtype) + o->master.numel * dtype_size(o->master.dtype) +
           o->gshard.numel * dtype_size(o->gshard.dtype) +
           (o->gsend16.numel + o->grecv16.numel) * sizeof(uint16_t);
}

struct tensor optimizer_master(struct optimizer *o) { return o->master; }

int optimizer_steps_done(const struct optimizer *o) { return o->step; }

void optimizer_shard_range(const struct optimizer *o, size_t *begin, size_t *end) {
    *begin = o->begin, *end = o->end;
}

void optimizer_moments(struct optimizer *o, struct tensor *m, struct tensor *v) {
    *m = o->m, *v = o->v;
}

void optimizer_set_steps_done(struct optimizer *o, int steps) { o->step = steps; }

// The part [lo, hi) of parameter p inside this rank's range; false if none.
static bool overlap(const struct optimizer *o, const struct param_info *p, size_t *lo, size_t *hi) {
    *lo = MAX(p->offset, o->begin);
    *hi = MIN(p->offset + p->numel, o->end);
    return *lo < *hi;
}

// The gradients of this rank's range: the shard buffer under ZeRO-1, else
// the model's arena.
static struct tensor grads_of_range(struct optimizer *o, size_t lo, size_t hi) {
    if (zero1(o)) return tensor_slice(o->gshard, lo - o->begin, hi - lo);
    return tensor_slice(model_grad_arena(o->model), lo, hi - lo);
}

// Before a DP collective on backend buffers: the host waits for the compute
// stream unless the group orders itself after it (NCCL).
static void sync_for_dp(struct optimizer *o) {
    if (!comm_stream_ordered(o->groups.dp)) backend_synchronize(o->be);
}

double optimizer_prepare(struct optimizer *o) {
    struct tensor g = model_grad_arena(o->model);
    if (zero1(o)) {
        sync_for_dp(o);
        if (o->gsend16.numel) { // grad_dtype BF16: round, reduce-scatter, widen (comm.h)
            backend_copy(o->be, o->gsend16, g, g.numel);
            sync_for_dp(o);
            comm_reduce_scatter(o->groups.dp, o->gsend16.data, o->grecv16.data, o->grecv16.numel,
                                DTYPE_BF16, COMM_SUM);
            backend_copy(o->be, o->gshard, o->grecv16, o->gshard.numel);
        } else {
            comm_reduce_scatter(o->groups.dp, g.data, o->gshard.data, o->gshard.numel, g.dtype,
                                COMM_SUM);
        }
    }
    // One backend_sum_squares (one device round trip under CUDA) per run of
    // adjacent counted parameters, not one per tensor: the arena is
    // contiguous, and only norm_skip tensors (TP replicas) break a run. A run
    // spans the alignment padding between its tensors (model_internal.h),
    // which no pass writes: zeros, as model_zero_grad left them.
    int n;
    const struct param_info *p = model_params(o->model, &n);
    double sum = 0;
    size_t run_lo = 0, run_hi = 0;
    for (int i = 0; i <= n; i++) {
        size_t lo = 0, hi = 0;
        bool counted = i < n && !p[i].norm_skip && overlap(o, &p[i], &lo, &hi);
        if (counted && lo >= run_hi && run_hi > run_lo) {
            run_hi = hi;
            continue;
        }
        if (run_hi > run_lo) sum += backend_sum_squares(o->be, grads_of_range(o, run_lo, run_hi),
                                                        run_hi - run_lo);
        run_lo = counted ? lo : 0, run_hi = counted ? hi : 0;
    }
    // The norm's pieces are host scalars: the host twins of the groups.
    struct comm_group *dp = parallel_host_group(o->groups.dp, o->groups.host_dp);
    struct comm_group *tp = parallel_host_group(o->groups.tp, o->groups.host_tp);
    struct comm_group *pp = parallel_host_group(o->groups.pp, o->groups.host_pp);
    if (zero1(o)) comm_all_reduce(dp, &sum, 1, DTYPE_FP64, COMM_SUM);
    if (group_size(tp) > 1) comm_all_reduce(tp, &sum, 1, DTYPE_FP64, COMM_SUM);
    if (group_size(pp) > 1) comm_all_reduce(pp, &sum, 1, DTYPE_FP64, COMM_SUM);
    return sqrt(sum);
}

void optimizer_step(struct optimizer *o, double lr, double grad_scale) {
    int n;
    const struct param_info *p = model_params(o->model, &n);
    struct tensor w = model_param_arena(o->model);
    struct tensor none = tensor_view(NULL, DTYPE_FP32, 0);
    o->step++;
    for (int i = 0; i < n; i++) {
        size_t lo, hi;
        if (!overlap(o, &p[i], &lo, &hi)) continue;
        size_t k = hi - lo, at = lo - o->begin;
        struct tensor master = o->master.numel ? tensor_slice(o->master, at, k) : none;
        backend_adamw(o->be, tensor_slice(w, lo, k), master, grads_of_range(o, lo, hi),
                      tensor_slice(o->m, at, k), tensor_slice(o->v, at, k), k, lr, o->cfg.beta1,
                      o->cfg.beta2, o->cfg.eps, p[i].decay ? o->cfg.weight_decay : 0.0,
                      grad_scale, o->step);
    }
    if (zero1(o)) { // every rank gets the updated shards of the others
        sync_for_dp(o);
        void *mine = tensor_slice(w, o->begin, o->end - o->begin).data;
        comm_all_gather(o->groups.dp, mine, w.data, o->end - o->begin, w.dtype);
    }
}

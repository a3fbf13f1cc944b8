// optimizer.c: AdamW over the model's parameter arena, optionally ZeRO-1
// sharded over data-parallel ranks (see optimizer.h).
#include "optimizer.h"

#include <limits.h>
#include <math.h>

struct optimizer {
    struct optimizer_config cfg;
    struct parallel_groups groups;
    struct backend *be;
    struct model *model;
    size_t begin, end;  // ZeRO-0/1: this rank's range of the parameter arena (ZeRO-1 with
                        // expert parallelism: its first range of several, the runs below)
    // The ranges of the arena this rank updates, concatenated in m, v, master,
    // gshard (and pshard): range k is [rb[k], re[k]) at element rat[k] of them.
    // ZeRO-0/1: one, [begin, end) at 0; ZeRO-2/3: this rank's 1/S slice of each unit.
    int n_ranges;
    size_t *rb, *re, *rat;
    size_t n;           // elements of the ranges together
    // ZeRO-1: run k of the arena, [run_b[k], run_e[k]), reduce-scattered and
    // gathered over run_g[k] in blocks of run_per[k] (range k is this rank's
    // block; the group's last rank also owns the run's last len % S elements).
    // One run [0, numel) over dp, or with expert parallelism the alternating
    // runs of dense tensors (over dp) and routed-expert tensors (over expert_dp).
    size_t *run_b, *run_e, *run_per;
    struct comm_group **run_g;
    struct tensor m, v; // (n,) first and second moments
    struct tensor gshard; // (n,) reduce-scattered gradients (ZeRO-1; ZeRO-2/3: summed into by
                          // the trainer's per-unit reduce-scatters)
    struct tensor pshard; // ZeRO-3: (n,) this rank's parameters, model dtype; else empty
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
static bool units_sharded(const struct optimizer *o) { return o->groups.zero_stage >= 2; }
// ZeRO-2/3's shard group: dp_shard (hybrid sharding), else the whole DP group.
static struct comm_group *shard_group(const struct optimizer *o) {
    return o->groups.dp_shard ? o->groups.dp_shard : o->groups.dp;
}
static struct comm_group *shard_host_group(const struct optimizer *o) {
    if (o->groups.dp_shard) return parallel_host_group(o->groups.dp_shard, o->groups.host_dp_shard);
    return parallel_host_group(o->groups.dp, o->groups.host_dp);
}
static bool zero3(const struct optimizer *o) { return o->groups.zero_stage == 3; }

// ZeRO-1 with expert parallelism splits the routed-expert tensors' state over
// expert_dp (the ranks holding the same experts), the rest over dp: the ep
// ranks of a dp group hold different experts, so sharding them over dp would
// give each expert's state to ranks that do not hold it.
static bool zero1_split(const struct optimizer *o) {
    if (group_size(o->groups.ep) <= 1) return false;
    int n;
    const struct param_info *p = model_params(o->model, &n);
    for (int i = 0; i < n; i++)
        if (p[i].expert) return true;
    return false;
}

// ZeRO-1's runs of an arena of numel elements holding the np tensors of p
// (arena order): run k is [b[k], e[k]), expert[k] whether it holds routed-
// expert tensors, for k below the count returned. A tensor's run reaches to
// the next tensor's offset (its alignment padding), the last to the arena's
// end (its padding: model_shard.arena_multiple), as grad_sync's buckets cut
// them; split false: the one run [0, numel). b, e, expert: room for np + 1.
static int zero1_runs(const struct param_info *p, int np, size_t numel, bool split, size_t *b,
                      size_t *e, bool *expert) {
    if (!split) {
        b[0] = 0, e[0] = numel, expert[0] = false;
        return 1;
    }
    int k = 0;
    for (int i = 0; i < np; i++) {
        size_t from = i ? p[i].offset : 0, to = i + 1 < np ? p[i + 1].offset : numel;
        if (k && expert[k - 1] == p[i].expert && e[k - 1] == from) e[k - 1] = to;
        else b[k] = from, e[k] = to, expert[k] = p[i].expert, k++;
    }
    return k;
}

// Rank d of S's block of a run of len elements: len / S of them, the last
// rank also the len % S after the others'.
static size_t run_block(size_t len, int S, int d) { return d == S - 1 ? len - len / S * (S - 1) : len / S; }

// ZeRO-1's runs (struct optimizer, zero1_runs) and this rank's range of each:
// over dp, or with the split the expert runs over expert_dp. Without the
// split the one run must divide by dp. Errors: STATUS_BAD_INPUT for an arena
// that does not divide.
static enum status zero1_runs_init(struct optimizer *o, struct error *err) {
    size_t numel = model_grad_arena(o->model).numel;
    int np;
    const struct param_info *p = model_params(o->model, &np);
    bool split = zero1_split(o);
    CHECK(!split || o->groups.expert_dp, "optimizer: routed-expert tensors but no expert_dp group");
    int cap = split ? np + 1 : 1;
    o->rb = xcalloc((size_t)cap, sizeof *o->rb), o->re = xcalloc((size_t)cap, sizeof *o->re);
    o->rat = xcalloc((size_t)cap, sizeof *o->rat);
    o->run_b = xcalloc((size_t)cap, sizeof *o->run_b), o->run_e = xcalloc((size_t)cap, sizeof *o->run_e);
    o->run_per = xcalloc((size_t)cap, sizeof *o->run_per);
    o->run_g = xcalloc((size_t)cap, sizeof *o->run_g);
    if (!split && numel % o->groups.dp->size)
        return error_set(err, STATUS_BAD_INPUT, "optimizer: ZeRO-1 needs the parameter arena "
                         "(%zu elements) padded to a multiple of dp = %d", numel, o->groups.dp->size);
    bool *expert = xcalloc((size_t)cap, sizeof *expert);
    int k = zero1_runs(p, np, numel, split, o->run_b, o->run_e, expert);
    for (int r = 0; r < k; r++) o->run_g[r] = expert[r] ? o->groups.expert_dp : o->groups.dp;
    free(expert);
    o->n_ranges = k, o->n = 0;
    for (int r = 0; r < k; r++) {
        int S = group_size(o->run_g[r]), d = S > 1 ? o->run_g[r]->rank : 0;
        size_t len = o->run_e[r] - o->run_b[r];
        o->run_per[r] = len / S;
        o->rb[r] = o->run_b[r] + o->run_per[r] * d;
        o->re[r] = o->rb[r] + run_block(len, S, d);
        o->rat[r] = o->n, o->n += o->re[r] - o->rb[r];
    }
    o->begin = o->rb[0], o->end = o->re[0];
    return STATUS_OK;
}

// The ranges of struct optimizer: one [begin, end), or (ZeRO-2/3) shard rank
// d's slice of every unit of the model, each unit padded to a multiple of S
// elements (model_shard.unit_multiple). Errors: STATUS_BAD_INPUT for a unit
// that does not divide.
static enum status ranges_init(struct optimizer *o, struct error *err) {
    if (zero1(o)) return zero1_runs_init(o, err);
    if (!units_sharded(o)) {
        o->n_ranges = 1;
        o->rb = xcalloc(1, sizeof *o->rb), o->re = xcalloc(1, sizeof *o->re);
        o->rat = xcalloc(1, sizeof *o->rat);
        o->rb[0] = o->begin, o->re[0] = o->end, o->n = o->end - o->begin;
        return STATUS_OK;
    }
    struct comm_group *sg = shard_group(o);
    int n, S = group_size(sg), d = sg ? sg->rank : 0;
    const struct model_unit *u = model_units(o->model, &n);
    o->n_ranges = n;
    o->rb = xcalloc((size_t)n, sizeof *o->rb), o->re = xcalloc((size_t)n, sizeof *o->re);
    o->rat = xcalloc((size_t)n, sizeof *o->rat);
    o->n = 0;
    for (int k = 0; k < n; k++) {
        size_t len = u[k].end - u[k].begin, per = len / S;
        if (len % S)
            return error_set(err, STATUS_BAD_INPUT, "optimizer: ZeRO-%d needs unit %d (%zu elements) "
                             "padded to a multiple of %d shard ranks", o->groups.zero_stage, k, len, S);
        o->rb[k] = u[k].begin + per * d, o->re[k] = o->rb[k] + per, o->rat[k] = o->n;
        o->n += per;
    }
    o->begin = 0, o->end = 0;
    return STATUS_OK;
}

static void ranges_free(struct optimizer *o) {
    free(o->rb), free(o->re), free(o->rat);
    free(o->run_b), free(o->run_e), free(o->run_per), free(o->run_g);
}

enum status optimizer_init(struct optimizer **out, struct backend *be, struct model *model,
                           const struct optimizer_config *cfg, const struct parallel_groups *groups,
                           struct error *err) {
    struct optimizer *o = xcalloc(1, sizeof *o);
    o->cfg = *cfg, o->be = be, o->model = model;
    if (groups) o->groups = *groups;
    struct tensor g = model_grad_arena(model);
    o->begin = 0, o->end = g.numel; // ZeRO-1: ranges_init's runs
    if (ranges_init(o, err)) {
        ranges_free(o), free(o);
        return err->status;
    }
    struct tensor w = model_param_arena(model);
    size_t n = o->n, bytes = n * dtype_size(g.dtype);
    void *m = backend_alloc(be, bytes), *v = backend_alloc(be, bytes);
    bool shard = zero1(o) || units_sharded(o);
    void *gs = shard ? backend_alloc(be, bytes) : NULL;
    void *ps = zero3(o) ? backend_alloc(be, n * dtype_size(w.dtype)) : NULL;
    bool lowp = low_precision(w.dtype);
    void *mw = lowp ? backend_alloc(be, n * sizeof(float)) : NULL;
    bool g16 = zero1(o) && cfg->grad_dtype == DTYPE_BF16;
    void *s16 = g16 ? backend_alloc(be, g.numel * sizeof(uint16_t)) : NULL;
    void *r16 = g16 ? backend_alloc(be, n * sizeof(uint16_t)) : NULL;
    if (!m || !v || (shard && !gs) || (zero3(o) && !ps) || (lowp && !mw) || (g16 && (!s16 || !r16))) {
        backend_dealloc(be, m), backend_dealloc(be, v), backend_dealloc(be, gs);
        backend_dealloc(be, mw), backend_dealloc(be, s16), backend_dealloc(be, r16);
        backend_dealloc(be, ps);
        ranges_free(o), free(o);
        return error_set(err, STATUS_RUNTIME, "optimizer: out of %s memory for %d x %zu bytes of "
                         "moments%s", be->ops->name, lowp ? 3 : 2, bytes,
                         lowp ? " and master weights" : "");
    }
    o->m = tensor_view(m, g.dtype, n);
    o->v = tensor_view(v, g.dtype, n);
    o->gshard = tensor_view(gs, g.dtype, gs ? n : 0);
    o->pshard = tensor_view(ps, w.dtype, ps ? n : 0);
    o->master = tensor_view(mw, DTYPE_FP32, mw ? n : 0);
    o->gsend16 = tensor_view(s16, DTYPE_BF16, s16 ? g.numel : 0);
    o->grecv16 = tensor_view(r16, DTYPE_BF16, r16 ? n : 0);
    backend_memset0(be, o->m);
    backend_memset0(be, o->v);
    if (gs) backend_memset0(be, o->gshard);
    if (ps) backend_memset0(be, o->pshard);
    // The master weights start as the model's (BF16/FP16 widen exactly);
    // under ZeRO-3 once the trainer has filled the parameter shard
    // (optimizer_sync_master).
    if (lowp && !zero3(o)) optimizer_sync_master(o);
    *out = o;
    return STATUS_OK;
}

void optimizer_sync_master(struct optimizer *o) {
    if (!o->master.numel) return;
    if (zero3(o)) {
        backend_copy(o->be, o->master, o->pshard, o->n);
        return;
    }
    struct tensor w = model_param_arena(o->model);
    for (int k = 0; k < o->n_ranges; k++)
        backend_copy(o->be, tensor_slice(o->master, o->rat[k], o->re[k] - o->rb[k]),
                     tensor_slice(w, o->rb[k], o->re[k] - o->rb[k]), o->re[k] - o->rb[k]);
}

void optimizer_free(struct optimizer *o) {
    if (!o) return;
    backend_dealloc(o->be, o->m.data);
    backend_dealloc(o->be, o->v.data);
    backend_dealloc(o->be, o->gshard.data);
    backend_dealloc(o->be, o->pshard.data);
    backend_dealloc(o->be, o->master.data);
    backend_dealloc(o->be, o->gsend16.data);
    backend_dealloc(o->be, o->grecv16.data);
    ranges_free(o);
    free(o);
}

size_t optimizer_zero1_numel(const struct param_info *p, int np, size_t numel, int dp, int dp_rank,
                             int ep, int expert_dp_rank) {
    bool split = false;
    for (int i = 0; ep > 1 && i < np; i++) split |= p[i].expert;
    int cap = split ? np + 1 : 1;
    size_t *b = xcalloc((size_t)cap, sizeof *b), *e = xcalloc((size_t)cap, sizeof *e), n = 0;
    bool *expert = xcalloc((size_t)cap, sizeof *expert);
    int k = zero1_runs(p, np, numel, split, b, e, expert);
    for (int r = 0; r < k; r++)
        n += expert[r] ? run_block(e[r] - b[r], dp / ep, expert_dp_rank) : run_block(e[r] - b[r], dp, dp_rank);
    free(b), free(e), free(expert);
    return n;
}

size_t optimizer_plan_bytes(size_t n_params, size_t n, enum dtype dtype, int dp, int zero_stage,
                            enum dtype grad_dtype) {
    bool z1 = zero_stage == 1 && dp > 1;
    size_t master = low_precision(dtype) ? n * sizeof(float) : 0;
    size_t bf16_rs = z1 && grad_dtype == DTYPE_BF16 ? (n_params + n) * sizeof(uint16_t) : 0;
    size_t es = dtype_size(dtype == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32); // moments, gradients
    return (2 + (z1 ? 1 : 0)) * n * es + master + bf16_rs;
}

size_t optimizer_state_bytes(const struct optimizer *o) {
    return 2 * o->m.numel * dtype_size(o->m.dtype) + o->master.numel * dtype_size(o->master.dtype) +
           (zero1(o) ? o->gshard.numel * dtype_size(o->gshard.dtype) : 0) + // ZeRO-2/3: in fsdp_bytes
           (o->gsend16.numel + o->grecv16.numel) * sizeof(uint16_t);
}

struct tensor optimizer_master(struct optimizer *o) { return o->master; }

int optimizer_steps_done(const struct optimizer *o) { return o->step; }

int optimizer_state_names(const char *const **names) {
    static const char *const adamw[] = {"adam_m", "adam_v"};
    *names = adamw;
    return 2;
}

void optimizer_shard_range(const struct optimizer *o, size_t *begin, size_t *end) {
    CHECK(o->n_ranges == 1, "optimizer_shard_range over %d ranges (ZeRO-%d%s): use optimizer_ranges",
          o->n_ranges, o->groups.zero_stage, o->groups.zero_stage == 1 ? " with ep" : "");
    *begin = o->begin, *end = o->end;
}

int optimizer_ranges(const struct optimizer *o, const size_t **begin, const size_t **end,
                     const size_t **at) {
    *begin = o->rb, *end = o->re, *at = o->rat;
    return o->n_ranges;
}

size_t optimizer_numel(const struct optimizer *o) { return o->n; }
struct tensor optimizer_grad_shard(struct optimizer *o) { return o->gshard; }
struct tensor optimizer_param_shard(struct optimizer *o) { return o->pshard; }

void optimizer_moments(struct optimizer *o, struct tensor *m, struct tensor *v) {
    *m = o->m, *v = o->v;
}

void optimizer_set_steps_done(struct optimizer *o, int steps) { o->step = steps; }

void optimizer_saved_of(const struct optimizer *opt, const struct optimizer_config *cfg, struct optimizer_saved *s) {
    *s = (struct optimizer_saved){
        .opt_steps = optimizer_steps_done(opt), .has_schedule = true, .steps = cfg->steps,
        .warmup_steps = cfg->warmup_steps, .schedule = cfg->schedule, .rebase_step = cfg->rebase_step,
        .lr = cfg->lr, .min_lr = cfg->min_lr, .rebase_lr = cfg->rebase_lr,
    };
}

int optimizer_state_entries(struct optimizer_saved *s, struct state_entry *out, int cap) {
    const struct state_entry mine[] = {
        {"opt_steps", STATE_I64, 1, &s->opt_steps, .required = true},
        {"train_steps", STATE_I64, 1, &s->steps, .found = &s->found[0]},
        {"lr", STATE_F64, 1, &s->lr, .found = &s->found[1]},
        {"min_lr", STATE_F64, 1, &s->min_lr, .found = &s->found[2]},
        {"warmup_steps", STATE_I64, 1, &s->warmup_steps, .found = &s->found[3]},
        {"lr_schedule", STATE_I64, 1, &s->schedule, .found = &s->found[4]},
        {"lr_rebase_step", STATE_I64, 1, &s->rebase_step, .found = &s->found[5]},
        {"lr_rebase_lr", STATE_F64, 1, &s->rebase_lr, .found = &s->found[6]},
    };
    return state_entries_put(out, cap, mine, sizeof mine / sizeof mine[0]);
}

enum status optimizer_saved_check(struct optimizer_saved *s, struct error *err) {
    static const char *const names[7] = {"train_steps", "lr", "min_lr", "warmup_steps", "lr_schedule",
                                         "lr_rebase_step", "lr_rebase_lr"};
    s->has_schedule = s->found[0];
    for (int i = 1; i < 7; i++)
        if (s->found[i] != s->has_schedule)
            return error_set(err, STATUS_BAD_INPUT, "/state has %s but %s %s: the LR schedule is stored whole or "
                             "not at all", s->found[i] ? names[i] : "train_steps",
                             s->found[i] ? "not" : "no", s->found[i] ? "train_steps" : names[i]);
    enum status st;
    if ((st = state_entry_range("opt_steps", s->opt_steps, 0, INT_MAX - 1, err)) || // an int, incremented once more
        (st = state_entry_range("train_steps", s->steps, s->has_schedule ? 1 : 0, INT_MAX, err)) ||
        (st = state_entry_range("warmup_steps", s->warmup_steps, 0, INT_MAX, err)) ||
        // lr_schedule's values are the schedule's (trainer_resume_compare checks them)
        (st = state_entry_range("lr_schedule", s->schedule, 0, INT_MAX, err)) ||
        (st = state_entry_range("lr_rebase_step", s->rebase_step, 0, INT_MAX, err)))
        return st;
    if (!isfinite(s->lr) || !isfinite(s->min_lr) || !isfinite(s->rebase_lr))
        return error_set(err, STATUS_BAD_INPUT, "/state lr %g, min_lr %g, lr_rebase_lr %g: expected finite values",
                         s->lr, s->min_lr, s->rebase_lr);
    return STATUS_OK;
}

struct optimizer_config optimizer_saved_schedule(const struct optimizer_saved *s, const struct optimizer_config *cfg) {
    struct optimizer_config c = *cfg;
    c.lr = s->lr, c.min_lr = s->min_lr, c.warmup_steps = (int)s->warmup_steps, c.steps = (int)s->steps;
    c.schedule = (enum lr_schedule)s->schedule, c.rebase_step = (int)s->rebase_step, c.rebase_lr = s->rebase_lr;
    return c;
}

void optimizer_saved_restore(struct optimizer *opt, const struct optimizer_saved *s) {
    optimizer_set_steps_done(opt, (int)s->opt_steps);
}

// The part [lo, hi) of parameter p inside this rank's range k; false if none.
static bool overlap(const struct optimizer *o, int k, const struct param_info *p, size_t *lo,
                    size_t *hi) {
    *lo = MAX(p->offset, o->rb[k]);
    *hi = MIN(p->offset + p->numel, o->re[k]);
    return *lo < *hi;
}

// The gradients of [lo, hi) inside range k: the shard buffer under ZeRO-1,
// 2 and 3, else the model's arena.
static struct tensor grads_of_range(struct optimizer *o, int k, size_t lo, size_t hi) {
    if (o->gshard.numel) return tensor_slice(o->gshard, lo - o->rb[k] + o->rat[k], hi - lo);
    return tensor_slice(model_grad_arena(o->model), lo, hi - lo);
}

// Before a DP collective on backend buffers: the host waits for the compute
// stream unless the group orders itself after it (NCCL).
static void sync_for_dp(struct optimizer *o) {
    comm_order_after_compute(o->groups.dp, o->be);
}

// The sum of squares of the gradients counted in the norm (not norm_skip)
// among the routed-expert tensors (experts) or the others. One
// backend_sum_squares (one device round trip under CUDA) per run of
// adjacent counted parameters, not one per tensor: the arena is contiguous,
// and only tensors not counted here (TP replicas, the other kind) break a
// run. A run spans the alignment padding between its tensors
// (model_internal.h), which no pass writes: zeros, as model_zero_grad left them.
static double sum_squares(struct optimizer *o, const struct param_info *p, int n, bool experts) {
    double sum = 0;
    for (int k = 0; k < o->n_ranges; k++) {
        size_t run_lo = 0, run_hi = 0;
        for (int i = 0; i <= n; i++) {
            size_t lo = 0, hi = 0;
            bool counted = i < n && !p[i].norm_skip && p[i].expert == experts &&
                           overlap(o, k, &p[i], &lo, &hi);
            if (counted && lo >= run_hi && run_hi > run_lo) {
                run_hi = hi;
                continue;
            }
            if (run_hi > run_lo)
                sum += backend_sum_squares(o->be, grads_of_range(o, k, run_lo, run_hi),
                                           run_hi - run_lo);
            run_lo = counted ? lo : 0, run_hi = counted ? hi : 0;
        }
    }
    return sum;
}

// Before ZeRO-1's collectives over the runs' groups (dp, expert_dp).
static void sync_for_runs(struct optimizer *o) {
    sync_for_dp(o);
    for (int r = 0; r < o->n_ranges; r++)
        if (o->run_g[r] != o->groups.dp) {
            comm_order_after_compute(o->run_g[r], o->be);
            break;
        }
}

// ZeRO-1: the gradients of each run reduce-scattered over its group into
// this rank's range of the shard: send (numel,) the arena's gradients (or
// their BF16 rounding), recv (n,) the shard (or its BF16 twin). The last
// len % S elements of a run are all-reduced in place and kept by the
// group's last rank, which owns them.
static void zero1_reduce_scatter(struct optimizer *o, struct tensor send, struct tensor recv) {
    size_t es = dtype_size(send.dtype);
    for (int r = 0; r < o->n_ranges; r++) {
        struct comm_group *g = o->run_g[r];
        int S = group_size(g);
        size_t b = o->run_b[r], per = o->run_per[r], rem = o->run_e[r] - b - per * S;
        char *from = (char *)send.data + b * es, *to = (char *)recv.data + o->rat[r] * es;
        if (S == 1) { // expert_dp of one rank (ep = dp): nothing to sum
            backend_copy(o->be, tensor_slice(recv, o->rat[r], per), tensor_slice(send, b, per), per);
            continue;
        }
        if (per) comm_reduce_scatter(g, from, to, per, send.dtype, COMM_SUM);
        if (rem) {
            comm_all_reduce(g, from + per * S * es, rem, send.dtype, COMM_SUM);
            if (g->rank == S - 1)
                backend_copy(o->be, tensor_slice(recv, o->rat[r] + per, rem),
                             tensor_slice(send, b + per * S, rem), rem);
        }
    }
}

double optimizer_prepare(struct optimizer *o) {
    struct tensor g = model_grad_arena(o->model);
    if (zero1(o)) {
        sync_for_runs(o);
        if (o->gsend16.numel) { // grad_dtype BF16: round, reduce-scatter, widen (comm.h)
            backend_copy(o->be, o->gsend16, g, g.numel);
            sync_for_runs(o);
            zero1_reduce_scatter(o, o->gsend16, o->grecv16);
            backend_copy(o->be, o->gshard, o->grecv16, o->gshard.numel);
        } else {
            zero1_reduce_scatter(o, g, o->gshard);
        }
    }
    int n;
    const struct param_info *p = model_params(o->model, &n);
    double sum = sum_squares(o, p, n, false), experts = sum_squares(o, p, n, true);
    // Expert parallelism: the ep ranks hold different experts (their squares
    // add up), the same dense tensors. Under ZeRO-1 the sum over dp below
    // adds them: dp is ep x expert_dp, each expert element in one rank's
    // range of its expert_dp group, each dense one in one dp rank's range.
    struct comm_group *ep = parallel_host_group(o->groups.ep, o->groups.host_ep);
    if (group_size(ep) > 1 && !zero1(o)) comm_all_reduce(ep, &experts, 1, DTYPE_FP64, COMM_SUM);
    sum += experts;
    // The norm's pieces are host scalars: the host twins of the groups.
    struct comm_group *dp = parallel_host_group(o->groups.dp, o->groups.host_dp);
    struct comm_group *tp = parallel_host_group(o->groups.tp, o->groups.host_tp);
    struct comm_group *pp = parallel_host_group(o->groups.pp, o->groups.host_pp);
    if (zero1(o)) comm_all_reduce(dp, &sum, 1, DTYPE_FP64, COMM_SUM);
    // ZeRO-2/3: over the shard group (replicas of a slice hold the same values)
    struct comm_group *sh = shard_host_group(o);
    if (units_sharded(o) && group_size(sh) > 1) comm_all_reduce(sh, &sum, 1, DTYPE_FP64, COMM_SUM);
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
    for (int r = 0; r < o->n_ranges; r++)
        for (int i = 0; i < n; i++) {
            size_t lo, hi;
            if (!overlap(o, r, &p[i], &lo, &hi)) continue;
            size_t k = hi - lo, at = lo - o->rb[r] + o->rat[r];
            struct tensor master = o->master.numel ? tensor_slice(o->master, at, k) : none;
            // ZeRO-3 updates its parameter shard; the others the arena.
            struct tensor wt = zero3(o) ? tensor_slice(o->pshard, at, k) : tensor_slice(w, lo, k);
            backend_adamw(o->be, wt, master, grads_of_range(o, r, lo, hi),
                          tensor_slice(o->m, at, k), tensor_slice(o->v, at, k), k, lr, o->cfg.beta1,
                          o->cfg.beta2, o->cfg.eps, p[i].decay ? o->cfg.weight_decay : 0.0,
                          grad_scale, o->step);
        }
    if (zero1(o)) { // every rank gets the updated shards of the others, run by run
        sync_for_runs(o);
        for (int r = 0; r < o->n_ranges; r++) {
            struct comm_group *g = o->run_g[r];
            int S = group_size(g);
            size_t b = o->run_b[r], per = o->run_per[r], rem = o->run_e[r] - b - per * S;
            if (S == 1) continue;
            if (per)
                comm_all_gather(g, tensor_slice(w, b + per * g->rank, per).data,
                                tensor_slice(w, b, per * S).data, per, w.dtype);
            if (rem) comm_broadcast(g, tensor_slice(w, b + per * S, rem).data, rem, w.dtype, S - 1);
        }
    }
    struct comm_group *sg = shard_group(o);
    if (units_sharded(o) && !zero3(o) && group_size(sg) > 1) { // ZeRO-2: unit by unit
        comm_order_after_compute(sg, o->be);
        int nu;
        const struct model_unit *u = model_units(o->model, &nu);
        for (int k = 0; k < nu; k++) {
            size_t per = o->re[k] - o->rb[k];
            comm_all_gather(sg, tensor_slice(w, o->rb[k], per).data,
                            tensor_slice(w, u[k].begin, per).data, per, w.dtype);
        }
    }
}

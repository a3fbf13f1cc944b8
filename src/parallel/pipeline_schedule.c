// pipeline_schedule.c: the pipeline schedules as tables (1F1B and interleaved
// 1F1B: Narayanan et al. 2021, §2.2.1 and §2.2.2, op order of Megatron-LM's
// schedules.py; ZB-H1 and ZB-V: Qi et al. 2024, arXiv 2401.10241, §3 and §6),
// the simulator that runs every stage's table with per-op costs, and the
// message streams and default rings the executor (pipeline.c) uses.
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "pipeline_internal.h"

const char *pipeline_schedule_name(enum pp_schedule kind) {
    static const char *const names[PP_SCHEDULE_COUNT] = {"1f1b", "interleaved", "zb-h1", "zbv"};
    return (unsigned)kind < PP_SCHEDULE_COUNT ? names[kind] : "?";
}

bool pipeline_schedule_splits(enum pp_schedule kind) {
    return kind == PP_SCHEDULE_ZB_H1 || kind == PP_SCHEDULE_ZBV;
}

static enum status check_args(enum pp_schedule kind, int p, int s, int m, int v,
                              struct error *err) {
    if ((unsigned)kind >= PP_SCHEDULE_COUNT)
        return error_set(err, STATUS_BAD_INPUT, "pipeline: schedule %d, expected 0..%d", kind,
                         PP_SCHEDULE_COUNT - 1);
    if (p < 1) return error_set(err, STATUS_BAD_INPUT, "pipeline: %d stages, expected >= 1", p);
    if (s < 0 || s >= p)
        return error_set(err, STATUS_BAD_INPUT, "pipeline: stage %d, expected 0..%d (p=%d)", s,
                         p - 1, p);
    if (v < 1)
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline: virtual_stages=%d model chunks per stage, expected >= 1", v);
    if (m < p)
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline: fewer microbatches than stages: m=%d microbatches for p=%d "
                         "stages (the pipeline never fills); raise global_batch_size or lower pp",
                         m, p);
    if (kind == PP_SCHEDULE_INTERLEAVED && v == 1)
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline: the interleaved schedule needs virtual_stages >= 2, got %d", v);
    if (kind == PP_SCHEDULE_ZB_H1 && v != 1)
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline: zb-h1 runs one model chunk per stage: virtual_stages=%d, "
                         "expected 1", v);
    if (kind == PP_SCHEDULE_ZBV && v != 2)
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline: zbv runs two model chunks per stage in a V: "
                         "virtual_stages=%d, expected 2", v);
    if (kind == PP_SCHEDULE_ZBV && p == 1)
        return error_set(err, STATUS_BAD_INPUT, "pipeline: zbv needs pp >= 2, got p=%d", p);
    if (kind == PP_SCHEDULE_ZBV) return STATUS_OK;
    if (v > 1 && p == 1)
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline: virtual_stages=%d needs pp >= 2 (interleaving over one stage "
                         "is the plain model); set virtual_stages=1", v);
    if (v > 1 && m % p != 0)
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline: the interleaved schedule (virtual_stages=%d) needs the "
                         "microbatch count to be a multiple of pp: m=%d, p=%d (as Megatron-LM)",
                         v, m, p);
    return STATUS_OK;
}

int pipeline_virtual_stage(enum pp_schedule kind, int p, int s, int chunk) {
    if (kind == PP_SCHEDULE_ZBV) return chunk == 0 ? s : 2 * p - 1 - s;
    return chunk * p + s;
}

int pipeline_op_count(enum pp_schedule kind, int p, int s, int m, int v) {
    if (check_args(kind, p, s, m, v, NULL) != STATUS_OK) return 0;
    return (pipeline_schedule_splits(kind) ? 3 : 2) * m * v;
}

// ---- 1F1B and interleaved 1F1B --------------------------------------------------

// Forwards before the first backward on stage s (the warmup). 1F1B: the
// backward of microbatch 0 reaches stage s after the forwards of p - s - 1
// more microbatches. Interleaved (Megatron's num_warmup_microbatches): the
// first backward on the last virtual stage needs p v - 1 forwards upstream;
// stage s runs 2 (p - s - 1) + (v - 1) p of them first.
static int warmup_count(int p, int s, int m, int v) {
    if (v == 1) return MIN(p - s - 1, m);
    return MIN(2 * (p - s - 1) + (v - 1) * p, m * v);
}

// The k-th forward (or backward) of a stage in Megatron's order
// (get_model_chunk_id, get_microbatch_id_in_model_chunk): microbatches go
// through the chunks in groups of p, forwards chunk 0 first, backwards the
// last chunk first. v == 1: micro = k, chunk = 0.
static struct pp_op op_of(enum pp_op_kind kind, int k, int p, int v) {
    int in_group = k % (p * v), chunk = in_group / p;
    struct pp_op op = {kind, (k / (p * v)) * p + k % p, chunk, -1, -1, false};
    if (kind == PP_BACKWARD) op.chunk = v - 1 - chunk;
    return op;
}

static int order_1f1b(int p, int s, int m, int v, struct pp_op *ops) {
    int total = m * v, w = warmup_count(p, s, m, v), n = 0, nf = 0, nb = 0;
    // Warmup forwards, then (forward, backward) pairs, then the cooldown.
    for (; nf < w; nf++) ops[n++] = op_of(PP_FORWARD, nf, p, v);
    while (nf < total) {
        ops[n++] = op_of(PP_FORWARD, nf++, p, v);
        ops[n++] = op_of(PP_BACKWARD, nb++, p, v);
    }
    while (nb < total) ops[n++] = op_of(PP_BACKWARD, nb++, p, v);
    return n;
}

// ---- ZB-H1 ------------------------------------------------------------------------
//
// Qi et al. 2024 §3 (ZB-H1), the op order of PaddlePaddle's ZBH1 pass
// (pipeline_zero_bubble.py) with the W's in microbatch order. Stage s runs:
//   warmup    F_0 .. F_{p-s-1}                 (1F1B's p - s - 1, and its first steady F)
//   s times   B_j, F                           (W deferred: the bubble 1F1B has here)
//   m - p     B_j, W, F                        (steady)
//   p - s     B_j, W                           (cooldown)
//   s times   W                                (the deferred ones)
// where each W is the oldest pending one, so every stage accumulates its
// weight gradients in microbatch order 0 .. m - 1, as 1F1B does (the
// trainer's runs are bit-identical across schedules), and the W of
// microbatch m - 1 is the last op. With unit costs F = B = W every stage
// idles p - 1 units before its first B (s at the start, p - s - 1 waiting for
// it) and never after: makespan 3 m + p - 1, bubble (p - 1) / (3 m + p - 1)
// for every m >= p (tests/unit/test_pipeline.c, p <= 8, m <= 3p + 4).
// Memory: at most p - s microbatches between F and B (1F1B's activations),
// and the s deferred W's keep their operands: p slots on every stage against
// 1F1B's p - s. A stage needs at least max(p - s, s + 1) for this makespan
// (stage s must end with s + 1 W's after its last B for stage 0 to finish in
// time).
static int order_zb_h1(int p, int s, int m, struct pp_op *ops) {
    int n = 0, nf = 0, nb = 0, nw = 0;
#define ZB_OP(k, mb) (ops[n++] = (struct pp_op){(k), (mb), 0, -1, -1, false})
    while (nf < p - s) ZB_OP(PP_FORWARD, nf++);
    for (int j = 0; j < s; j++) {
        ZB_OP(PP_BACKWARD_INPUT, nb++);
        ZB_OP(PP_FORWARD, nf++);
    }
    for (int j = 0; j < m - p; j++) {
        ZB_OP(PP_BACKWARD_INPUT, nb++);
        ZB_OP(PP_BACKWARD_WEIGHT, nw++);
        ZB_OP(PP_FORWARD, nf++);
    }
    for (int j = 0; j < p - s; j++) {
        ZB_OP(PP_BACKWARD_INPUT, nb++);
        ZB_OP(PP_BACKWARD_WEIGHT, nw++);
    }
    while (nw < m) ZB_OP(PP_BACKWARD_WEIGHT, nw++);
#undef ZB_OP
    CHECK(nf == m && nb == m, "zb-h1 stage %d: %d forwards, %d B of %d", s, nf, nb, m);
    return n;
}

// ---- ZB-V -------------------------------------------------------------------------
//
// Qi et al. 2024 §6 (ZB-V): two chunks per stage in a V, chunk 0 = virtual
// stage s, chunk 1 = virtual stage 2 p - 1 - s, so the forward goes down the
// stages on chunk 0 and back up on chunk 1, and stage 0 holds the first and
// the last virtual stage. The op order of each stage is that of PyTorch's
// ScheduleZBVZeroBubble (torch/distributed/pipelining/schedules.py), which
// builds it for max(m, 2 p - 1) microbatches and drops the ops of those
// beyond m; with F^c, B^c, W^c the ops of chunk c:
//   2 (p - s) - 1     F^0
//   s times           F^1, F^0
//   p - s times       F^1, B^1, W^1
//   steady            [F^0 while any is left], B^0, W^0, F^1, B^1, W^1
//                     (until every F^1 has run)
//   s times           B^0, B^1                         (cooldown, W's deferred)
//   p - s times       B^0, W^0
//   the rest          W^1 .. , then W^0 ..
// Each chunk's W's run in microbatch order (bit-identical accumulation), and
// chunk 1's last W comes before chunk 0's (the last-op rule of pp_op).
// With unit costs F = B = W = 1 per chunk op (a chunk op is half a stage's
// work) every stage idles p - 1 units once m >= 3 p / 2 (p - 1 waiting for
// the first forward on stage p - 1, the same at the end on stage 0):
// makespan 6 m + p - 1, bubble (p - 1) / (6 m + p - 1); p = 4, m = 8: 3 / 51
// = 0.0588 against ZB-H1's 3 / 27 = 0.111 and 1F1B's 3 / 11. Fewer
// microbatches (p <= m < 3 p / 2) run correctly with a larger bubble. Slots:
// at most 2 p chunk slots, 2 p on every stage once m >= 2 p - 1, i.e. the
// activations of p microbatches of a whole stage, ZB-H1's.
static int order_zbv(int p, int s, int m, struct pp_op *ops) {
    int total = MAX(m, 2 * p - 1), n = 0, f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};
    // Appends the next op of kind on chunk c (its counters number the
    // microbatches), unless that microbatch is beyond m.
#define ZBV_OP(k, c, cnt)                                                                 \
    do {                                                                                  \
        int mb_ = (cnt)[c]++;                                                             \
        if (mb_ < m) ops[n++] = (struct pp_op){(k), mb_, (c), -1, -1, false};             \
    } while (0)
    for (int j = 0; j < 2 * (p - s) - 1; j++) ZBV_OP(PP_FORWARD, 0, f);
    for (int j = 0; j < s; j++) {
        ZBV_OP(PP_FORWARD, 1, f);
        ZBV_OP(PP_FORWARD, 0, f);
    }
    for (int j = 0; j < p - s; j++) {
        ZBV_OP(PP_FORWARD, 1, f);
        ZBV_OP(PP_BACKWARD_INPUT, 1, b);
        ZBV_OP(PP_BACKWARD_WEIGHT, 1, w);
    }
    while (f[1] < f[0] || f[0] < total) {
        if (f[0] < total) ZBV_OP(PP_FORWARD, 0, f);
        ZBV_OP(PP_BACKWARD_INPUT, 0, b);
        ZBV_OP(PP_BACKWARD_WEIGHT, 0, w);
        ZBV_OP(PP_FORWARD, 1, f);
        ZBV_OP(PP_BACKWARD_INPUT, 1, b);
        ZBV_OP(PP_BACKWARD_WEIGHT, 1, w);
    }
    for (int j = 0; j < s; j++) {
        ZBV_OP(PP_BACKWARD_INPUT, 0, b);
        ZBV_OP(PP_BACKWARD_INPUT, 1, b);
    }
    for (int j = 0; j < p - s; j++) {
        ZBV_OP(PP_BACKWARD_INPUT, 0, b);
        ZBV_OP(PP_BACKWARD_WEIGHT, 0, w);
    }
    while (w[1] < b[1]) ZBV_OP(PP_BACKWARD_WEIGHT, 1, w);
    while (w[0] < b[0]) ZBV_OP(PP_BACKWARD_WEIGHT, 0, w);
#undef ZBV_OP
    CHECK(f[0] == total && f[1] == total && b[0] == total && b[1] == total,
          "zbv stage %d: F %d %d, B %d %d of %d", s, f[0], f[1], b[0], b[1], total);
    return n;
}

// ---- tables -----------------------------------------------------------------------

// The op after which (micro, chunk)'s activation slot is free: its backward,
// or in the split schedules its B (W reads only its stash, pp_op.wslot).
static bool frees_slot(enum pp_op_kind kind) {
    return kind == PP_BACKWARD || kind == PP_BACKWARD_INPUT;
}

// The op after which (micro, chunk)'s weight gradients are accumulated.
static bool ends_weights(enum pp_op_kind kind) {
    return kind == PP_BACKWARD || kind == PP_BACKWARD_WEIGHT;
}

// Fills ops with stage s's order (kind, micro, chunk; slot -1) and the last
// flags; returns the op count. Arguments checked.
static int build_order(enum pp_schedule kind, int p, int s, int m, int v, struct pp_op *ops) {
    int n = kind == PP_SCHEDULE_ZB_H1 ? order_zb_h1(p, s, m, ops)
          : kind == PP_SCHEDULE_ZBV   ? order_zbv(p, s, m, ops)
                                      : order_1f1b(p, s, m, v, ops);
    // last: the op that ends a chunk's weight gradients (its backward, or W)
    // for the last time in the table.
    bool *seen = xcalloc((size_t)v, sizeof(bool));
    for (int i = n - 1; i >= 0; i--) {
        ops[i].last = ends_weights(ops[i].kind) && !seen[ops[i].chunk];
        if (ends_weights(ops[i].kind)) seen[ops[i].chunk] = true;
        ops[i].slot = ops[i].wslot = -1;
    }
    free(seen);
    return n;
}

// The peak number of (micro, chunk) whose forward ran and whose slot is not free.
static int order_peak(const struct pp_op *ops, int n) {
    int live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        if (ops[i].kind == PP_FORWARD) {
            live++;
            peak = MAX(peak, live);
        }
        if (frees_slot(ops[i].kind)) live--;
    }
    return peak;
}

// The peak number of (micro, chunk) between an op of kind `from` and one of
// kind `to`.
static int order_peak_between(const struct pp_op *ops, int n, enum pp_op_kind from,
                              enum pp_op_kind to) {
    int live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        if (ops[i].kind == from) {
            live++;
            peak = MAX(peak, live);
        }
        if (ops[i].kind == to) live--;
    }
    return peak;
}

static int split_peak(enum pp_schedule kind, int p, int s, int m, int v, enum pp_op_kind from,
                      enum pp_op_kind to) {
    if (!pipeline_schedule_splits(kind) || check_args(kind, p, s, m, v, NULL) != STATUS_OK) return 0;
    struct pp_op *ops = xmalloc(sizeof(struct pp_op) * 3 * (size_t)m * v);
    int peak = order_peak_between(ops, build_order(kind, p, s, m, v, ops), from, to);
    free(ops);
    return peak;
}

int pipeline_max_w_pending(enum pp_schedule kind, int p, int s, int m, int v) {
    return split_peak(kind, p, s, m, v, PP_BACKWARD_INPUT, PP_BACKWARD_WEIGHT);
}

int pipeline_max_b_pending(enum pp_schedule kind, int p, int s, int m, int v) {
    return split_peak(kind, p, s, m, v, PP_FORWARD, PP_BACKWARD_INPUT);
}

int pipeline_max_in_flight(enum pp_schedule kind, int p, int s, int m, int v) {
    if (check_args(kind, p, s, m, v, NULL) != STATUS_OK) return 0;
    if (!pipeline_schedule_splits(kind)) {
        int w = warmup_count(p, s, m, v);
        return w < m * v ? w + 1 : m * v;
    }
    struct pp_op *ops = xmalloc(sizeof(struct pp_op) * 3 * (size_t)m * v);
    int peak = order_peak(ops, build_order(kind, p, s, m, v, ops));
    free(ops);
    return peak;
}

// Lowest free first: the index in owner[0 .. count) that holds want (-1:
// a free one), set to now. CHECKs that there is one.
static int take_index(int *owner, int count, int want, int now, int s, int i) {
    int k = 0;
    while (k < count && owner[k] != want) k++;
    CHECK(k < count, "stage %d op %d: no free index among %d", s, i, count);
    owner[k] = now;
    return k;
}

enum status pipeline_schedule(enum pp_schedule kind, int p, int s, int m, int v, struct pp_op *ops,
                              struct error *err) {
    enum status st = check_args(kind, p, s, m, v, err);
    if (st != STATUS_OK) return st;
    int n = build_order(kind, p, s, m, v, ops), want = pipeline_op_count(kind, p, s, m, v);
    CHECK(n == want, "%s schedule of %d ops, expected %d", pipeline_schedule_name(kind), n, want);
    // Slots (F to the backward, or to B) and W stashes (B to W): lowest free
    // first. owner[k] = micro * v + chunk, or -1.
    int slots = pipeline_max_in_flight(kind, p, s, m, v);
    int stashes = pipeline_max_w_pending(kind, p, s, m, v);
    int *owner = xmalloc(sizeof(int) * slots), *wowner = xmalloc(sizeof(int) * MAX(1, stashes));
    for (int i = 0; i < slots; i++) owner[i] = -1;
    for (int i = 0; i < stashes; i++) wowner[i] = -1;
    for (int i = 0; i < n; i++) {
        int id = ops[i].micro * v + ops[i].chunk;
        enum pp_op_kind k = ops[i].kind;
        if (k == PP_FORWARD) ops[i].slot = take_index(owner, slots, -1, id, s, i);
        else if (frees_slot(k)) ops[i].slot = take_index(owner, slots, id, -1, s, i);
        if (k == PP_BACKWARD_INPUT) ops[i].wslot = take_index(wowner, stashes, -1, id, s, i);
        if (k == PP_BACKWARD_WEIGHT) ops[i].wslot = take_index(wowner, stashes, id, -1, s, i);
    }
    free(owner);
    free(wowner);
    return STATUS_OK;
}

// ---- simulator -------------------------------------------------------------------
//
// One simulator serves pipeline_simulate, the timeline and the default rings:
// every stage's table run together, an op starting once its stage is free and
// its input exists. Inputs: F of virtual stage u needs F of u - 1; B (or the
// whole backward) needs its own F and the backward of u + 1; W needs its B.
// A message between two ranks adds costs->comm. Start times are the earliest
// the table allows, and they do not depend on the order in which stages are
// visited: an op's start is max(its stage's clock, its input's arrival), both
// final once known. A stage whose next op's input never comes is stuck: the
// tables deadlock (the executor would hang the same way).

// F 0, B or the whole backward 1, W 2: the index of an op's finish time.
static int op_class(enum pp_op_kind kind) {
    return kind == PP_FORWARD ? 0 : kind == PP_BACKWARD_WEIGHT ? 2 : 1;
}

static double op_cost(const struct pp_costs *c, enum pp_op_kind kind) {
    switch (kind) {
    case PP_FORWARD: return c->f;
    case PP_BACKWARD: return c->b + c->w;
    case PP_BACKWARD_INPUT: return c->b;
    case PP_BACKWARD_WEIGHT: return c->w;
    }
    return 0;
}

struct sim {
    enum pp_schedule kind;
    int p, m, v, V, n; // n: ops per stage
    struct pp_op *ops; // (p, n) every stage's table
    double *start;     // (p, n) each op's start
    double *fin;       // (3, V, m) finish of (class, virtual stage, micro); -1 not yet
};

static double *sim_fin(const struct sim *S, int cls, int u, int micro) {
    return &S->fin[((size_t)cls * S->V + u) * S->m + micro];
}

// Builds every stage's table; refused arguments give pipeline_schedule's error.
static enum status sim_init(struct sim *S, enum pp_schedule kind, int p, int m, int v,
                            struct error *err) {
    memset(S, 0, sizeof *S);
    int n = pipeline_op_count(kind, p, 0, m, v);
    if (n == 0) {
        struct pp_op none;
        enum status st = pipeline_schedule(kind, p, 0, m, v, &none, err);
        return st != STATUS_OK ? st : error_set(err, STATUS_BAD_INPUT, "pipeline: no ops");
    }
    *S = (struct sim){kind, p, m, v, p * v, n, NULL, NULL, NULL};
    S->ops = xmalloc(sizeof(struct pp_op) * (size_t)p * n);
    S->start = xmalloc(sizeof(double) * (size_t)p * n);
    S->fin = xmalloc(sizeof(double) * 3 * (size_t)S->V * m);
    for (int s = 0; s < p; s++) {
        enum status st = pipeline_schedule(kind, p, s, m, v, S->ops + (size_t)s * n, err);
        if (st != STATUS_OK) return st;
    }
    return STATUS_OK;
}

static void sim_free(struct sim *S) {
    free(S->ops), free(S->start), free(S->fin);
    memset(S, 0, sizeof *S);
}

// When op (on stage s) can start as far as its inputs go, or -1 while one is
// missing.
static double sim_ready(const struct sim *S, int s, const struct pp_op *op,
                        const struct pp_costs *c) {
    int u = pipeline_virtual_stage(S->kind, S->p, s, op->chunk), cls = op_class(op->kind);
    double ready = 0, d;
    if (cls == 2) return *sim_fin(S, 1, u, op->micro);
    if (cls == 1) {
        if ((ready = *sim_fin(S, 0, u, op->micro)) < 0) return -1;
        if (u == S->V - 1) return ready;
    } else if (u == 0)
        return 0;
    int from = cls == 0 ? u - 1 : u + 1;
    if ((d = *sim_fin(S, cls, from, op->micro)) < 0) return -1;
    d += pipeline_stage_of(S->kind, S->p, from) != s ? c->comm : 0;
    return MAX(ready, d);
}

// Runs the tables; false when a stage is stuck (the tables deadlock).
static bool sim_run(struct sim *S, const struct pp_costs *c) {
    int *idx = xcalloc((size_t)S->p, sizeof(int));
    double *clock = xcalloc((size_t)S->p, sizeof(double));
    for (size_t i = 0; i < 3 * (size_t)S->V * S->m; i++) S->fin[i] = -1;
    bool ok = true;
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < S->p; s++)
            while (idx[s] < S->n) {
                const struct pp_op *op = &S->ops[(size_t)s * S->n + idx[s]];
                double ready = sim_ready(S, s, op, c);
                if (ready < 0) break;
                int u = pipeline_virtual_stage(S->kind, S->p, s, op->chunk);
                S->start[(size_t)s * S->n + idx[s]] = clock[s] = MAX(clock[s], ready);
                clock[s] += op_cost(c, op->kind);
                *sim_fin(S, op_class(op->kind), u, op->micro) = clock[s];
                idx[s]++, progress = true;
            }
    }
    for (int s = 0; s < S->p; s++) ok = ok && idx[s] == S->n;
    free(idx);
    free(clock);
    return ok;
}

// ---- message streams -------------------------------------------------------------

int pipeline_stream_in(enum pp_schedule kind, int p, int s, int v, const struct pp_op *op) {
    int u = pipeline_virtual_stage(kind, p, s, op->chunk);
    bool vee = kind == PP_SCHEDULE_ZBV && op->chunk == 1;
    if (op->kind == PP_FORWARD) return u == 0 ? -1 : vee ? PP_STREAM_ACT_IN_V : PP_STREAM_ACT_IN;
    if (op->kind == PP_BACKWARD_WEIGHT || u == p * v - 1) return -1;
    return vee ? PP_STREAM_GRAD_IN_V : PP_STREAM_GRAD_IN;
}

int pipeline_stream_out(enum pp_schedule kind, int p, int s, int v, const struct pp_op *op) {
    int u = pipeline_virtual_stage(kind, p, s, op->chunk);
    bool vee = kind == PP_SCHEDULE_ZBV && op->chunk == 1;
    if (op->kind == PP_FORWARD)
        return u == p * v - 1 ? -1 : vee ? PP_STREAM_ACT_OUT_V : PP_STREAM_ACT_OUT;
    if (op->kind == PP_BACKWARD_WEIGHT || u == 0) return -1;
    return vee ? PP_STREAM_GRAD_OUT_V : PP_STREAM_GRAD_OUT;
}

bool pipeline_stream_is_in(int k) {
    return k == PP_STREAM_ACT_IN || k == PP_STREAM_GRAD_IN || k == PP_STREAM_ACT_IN_V ||
           k == PP_STREAM_GRAD_IN_V;
}

bool pipeline_stream_is_gradient(int k) {
    return k == PP_STREAM_GRAD_IN || k == PP_STREAM_GRAD_OUT || k == PP_STREAM_GRAD_IN_V ||
           k == PP_STREAM_GRAD_OUT_V;
}

int pipeline_stream_local_target(enum pp_schedule kind, int p, int s, int k) {
    if (kind != PP_SCHEDULE_ZBV || s != p - 1) return -1;
    if (k == PP_STREAM_ACT_OUT) return PP_STREAM_ACT_IN_V;
    if (k == PP_STREAM_GRAD_OUT_V) return PP_STREAM_GRAD_IN;
    return -1;
}

int pipeline_stream_peer(enum pp_schedule kind, int p, int s, int k) {
    int prev = (s + p - 1) % p, next = kind == PP_SCHEDULE_ZBV ? MIN(s + 1, p - 1) : (s + 1) % p;
    switch (k) {
    case PP_STREAM_ACT_IN: case PP_STREAM_GRAD_OUT: case PP_STREAM_ACT_OUT_V:
    case PP_STREAM_GRAD_IN_V: return prev;
    default: return next;
    }
}

int pipeline_consumer_chunk(enum pp_schedule kind, int p, int s, const struct pp_op *op) {
    int u = pipeline_virtual_stage(kind, p, s, op->chunk) + (op->kind == PP_FORWARD ? 1 : -1);
    return kind == PP_SCHEDULE_ZBV ? u >= p : u / p;
}

struct sim_event {
    double t;
    int delta;
};

static int event_cmp(const void *a, const void *b) {
    const struct sim_event *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->delta - y->delta; // a buffer freed at t is free for a message made at t
}

// The peak number of messages of stream k of stage s in flight in a
// simulated run: a message occupies a buffer on both ends from its
// producer's finish to its consumer's finish.
static int stream_peak(const struct sim *S, int s, int k) {
    struct sim_event *ev = xmalloc(sizeof *ev * 2 * (size_t)S->n);
    int ne = 0, peak = 0, live = 0;
    bool in = pipeline_stream_is_in(k);
    for (int i = 0; i < S->n; i++) {
        const struct pp_op *op = &S->ops[(size_t)s * S->n + i];
        int sk = in ? pipeline_stream_in(S->kind, S->p, s, S->v, op)
                    : pipeline_stream_out(S->kind, S->p, s, S->v, op);
        if (sk != k) continue;
        int u = pipeline_virtual_stage(S->kind, S->p, s, op->chunk), cls = op_class(op->kind);
        int other = (cls == 0) == in ? u - 1 : u + 1; // the producer (in) or consumer (out)
        double mine = *sim_fin(S, cls, u, op->micro), theirs = *sim_fin(S, cls, other, op->micro);
        ev[ne++] = (struct sim_event){in ? theirs : mine, +1};
        ev[ne++] = (struct sim_event){in ? mine : theirs, -1};
    }
    qsort(ev, (size_t)ne, sizeof *ev, event_cmp);
    for (int i = 0; i < ne; i++) {
        live += ev[i].delta;
        peak = MAX(peak, live);
    }
    free(ev);
    return peak;
}

// Default rings: each stream's peak of messages in flight (0 when it has
// none) over two timings (backward ops as long as a forward, and twice as
// long as for a transformer layer; B and W half the backward each), so that
// in those runs no op waits for a buffer, plus one spare for ops that run
// late. Any ring >= 1 is deadlock-free (pipeline.c); a smaller one only adds
// waits. A local output stream (pipeline_stream_local_target) gets 0: it
// writes into the ring of the stream it feeds.
void pipeline_ring_sizes(enum pp_schedule kind, int p, int s, int m, int v,
                         int rings[PP_STREAM_COUNT]) {
    struct sim S;
    CHECK(sim_init(&S, kind, p, m, v, NULL) == STATUS_OK,
          "schedule refused after its arguments were checked");
    for (int k = 0; k < PP_STREAM_COUNT; k++) rings[k] = 0;
    for (int tb = 1; tb <= 2; tb++) {
        struct pp_costs c = {1, 0.5 * tb, 0.5 * tb, 0};
        CHECK(sim_run(&S, &c), "pipeline: %s p=%d m=%d v=%d stuck in simulation",
              pipeline_schedule_name(kind), p, m, v);
        for (int k = 0; k < PP_STREAM_COUNT; k++)
            if (pipeline_stream_local_target(kind, p, s, k) < 0)
                rings[k] = MAX(rings[k], stream_peak(&S, s, k));
    }
    for (int k = 0; k < PP_STREAM_COUNT; k++) rings[k] += rings[k] > 0; // one spare
    sim_free(&S);
}

int pipeline_ring_size(enum pp_schedule kind, int p, int s, int m, int v,
                       enum pp_stream_kind stream) {
    int rings[PP_STREAM_COUNT];
    if (check_args(kind, p, s, m, v, NULL) != STATUS_OK || (unsigned)stream >= PP_STREAM_COUNT)
        return 0;
    pipeline_ring_sizes(kind, p, s, m, v, rings);
    return rings[stream];
}

size_t pipeline_buffer_bytes(enum pp_schedule kind, int p, int s, int m, int v, size_t count,
                             enum dtype dtype) {
    if (check_args(kind, p, s, m, v, NULL) != STATUS_OK) return 0;
    int rings[PP_STREAM_COUNT];
    pipeline_ring_sizes(kind, p, s, m, v, rings);
    size_t total = 0;
    for (int k = 0; k < PP_STREAM_COUNT; k++) total += (size_t)rings[k];
    return total * count * dtype_size(dtype);
}

// ---- the simulator's API ----------------------------------------------------------

static enum status check_costs(const struct pp_costs *c, struct error *err) {
    if (!c || !(c->f > 0) || !(c->b > 0) || !(c->w > 0) || !(c->comm >= 0) ||
        !isfinite(c->f + c->b + c->w + c->comm))
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline_simulate: costs f=%g b=%g w=%g comm=%g, expected f, b, w > 0 "
                         "and comm >= 0, finite", c ? c->f : 0, c ? c->b : 0, c ? c->w : 0,
                         c ? c->comm : 0);
    return STATUS_OK;
}

// Runs the simulation into S (sim_free it after a success) and fills out.
static enum status simulate(enum pp_schedule kind, int p, int m, int v,
                            const struct pp_costs *costs, struct sim *S, struct pp_sim *out,
                            struct error *err) {
    memset(S, 0, sizeof *S);
    enum status st = check_costs(costs, err);
    if (st != STATUS_OK) return st;
    if (p > PIPELINE_SIM_MAX_STAGES)
        return error_set(err, STATUS_BAD_INPUT, "pipeline_simulate: p=%d stages, at most %d", p,
                         PIPELINE_SIM_MAX_STAGES);
    if ((st = sim_init(S, kind, p, m, v, err)) != STATUS_OK) {
        sim_free(S);
        return st;
    }
    if (!sim_run(S, costs)) {
        sim_free(S);
        return error_set(err, STATUS_RUNTIME, "pipeline_simulate: %s p=%d m=%d v=%d deadlocks",
                         pipeline_schedule_name(kind), p, m, v);
    }
    memset(out, 0, sizeof *out);
    double idle = 0;
    for (int s = 0; s < p; s++)
        for (int i = 0; i < S->n; i++) {
            const struct pp_op *op = &S->ops[(size_t)s * S->n + i];
            double cost = op_cost(costs, op->kind);
            out->makespan = MAX(out->makespan, S->start[(size_t)s * S->n + i] + cost);
            out->busy[s] += cost;
        }
    for (int s = 0; s < p; s++) {
        out->idle[s] = out->makespan - out->busy[s];
        idle += out->idle[s];
        out->peak_in_flight[s] = pipeline_max_in_flight(kind, p, s, m, v);
    }
    out->bubble = idle / (p * out->makespan);
    return STATUS_OK;
}

enum status pipeline_simulate(enum pp_schedule kind, int p, int m, int v,
                              const struct pp_costs *costs, struct pp_sim *out, struct error *err) {
    struct sim S;
    enum status st = simulate(kind, p, m, v, costs, &S, out, err);
    sim_free(&S);
    return st;
}

enum status pipeline_print_timeline(FILE *f, enum pp_schedule kind, int p, int m, int v,
                                    const struct pp_costs *costs, double unit, struct error *err) {
    if (!(unit > 0) || !isfinite(unit))
        return error_set(err, STATUS_BAD_INPUT, "pipeline_print_timeline: unit %g, expected > 0",
                         unit);
    struct sim S;
    struct pp_sim sim;
    enum status st = simulate(kind, p, m, v, costs, &S, &sim, err);
    if (st != STATUS_OK) return st;
    int cells = (int)ceil(sim.makespan / unit - 1e-9);
    char *line = xmalloc((size_t)cells + 1);
    fprintf(f, "%s p=%d m=%d v=%d: costs F %g, B %g, W %g, comm %g; one character = %g\n",
            pipeline_schedule_name(kind), p, m, v, costs->f, costs->b, costs->w, costs->comm,
            unit);
    for (int s = 0; s < p; s++) {
        memset(line, '.', (size_t)cells);
        line[cells] = 0;
        for (int i = 0; i < S.n; i++) { // each cell shows the op running at its middle
            const struct pp_op *op = &S.ops[(size_t)s * S.n + i];
            double t0 = S.start[(size_t)s * S.n + i], t1 = t0 + op_cost(costs, op->kind);
            char ch = op->kind == PP_FORWARD ? 'F' : op->kind == PP_BACKWARD_WEIGHT ? 'W' : 'B';
            if (op->chunk % 2) ch = (char)(ch - 'A' + 'a');
            for (int c = MAX(0, (int)floor(t0 / unit)); c < cells && (c + 0.5) * unit < t1; c++)
                if ((c + 0.5) * unit >= t0) line[c] = ch;
        }
        fprintf(f, "stage %2d %s  idle %g\n", s, line, sim.idle[s]);
    }
    fprintf(f, "makespan %g, bubble %.4f\n", sim.makespan, sim.bubble);
    free(line);
    sim_free(&S);
    return STATUS_OK;
}

// test_pipeline.c: pipeline schedules (src/parallel/pipeline_schedule.c) against the
// properties of Narayanan et al. 2021 §2.2 and Qi et al. 2024 (ZB-H1 §3,
// ZB-V §6), the simulator, and the executor (src/parallel/pipeline.c) on
// threads.
//
// For every schedule, p in 1..8 (2..8 for zbv), m in p..3p+4, v in 1..3
// (where valid):
//  - each stage runs each (micro, chunk) forward once and backward once (split
//    schedules: B then W, once each), after the forward; slots are never
//    shared by two (micro, chunk) in flight (taken by F, freed by the
//    backward or B; -1 on a W), nor W stashes (wslot: taken by B, freed by
//    W; -1 on F and a whole backward); the split schedules run each chunk's
//    B's and W's in microbatch order (the weight gradients sum in 1F1B's
//    order);
//  - the peak in flight (slots) equals pipeline_max_in_flight and is <= p - s
//    for 1F1B, <= min(m v, 2 (p - s - 1) + (v - 1) p + 1) interleaved, p - s
//    for zb-h1 (exactly: 1F1B's) and 2 p (chunks) for zbv (exactly once m >=
//    2p - 1); the peak of stashes taken equals pipeline_max_w_pending (zb-h1
//    s + 1, zbv 2 s + 1);
//  - the last flag: on the op ending each chunk's weight gradients (the
//    backward, or W) for the last time, chunk v - 1's first and chunk 0's last;
//  - v == 1: warmup forwards, then F/B alternation, then cooldown (and a
//    literal sequence for p = 4, m = 8); zb-h1 p = 4 m = 8 written out too;
//  - all stages together, ops of unit time, start as soon as their input
//    exists: no stage waits forever (deadlock check), and the bubble is
//    (p-1)/(m+p-1) of the time for 1F1B, (p-1)/(vm+p-1) interleaved,
//    (p-1)/(3m+p-1) for zb-h1 (below 1F1B's for every p > 1),
//    (p-1)/(6m+p-1) for zbv once m >= 3p/2 (p = 4, m = 8: 3/51, below
//    zb-h1's 3/27); pipeline_simulate agrees with this simulator;
//  - the executor runs the toy model of pipeline_toy.h on p threads whose
//    messages complete only on a match (rendezvous, worse than MPI's eager
//    sends), with a ring of 1 buffer and with the default ring: exact
//    activations, gradients and weight gradients (the split runs equal the
//    fused 1F1B run's), no deadlock (detected when every live thread waits);
//    zb-h1 and zbv again with random delays before every send and receive
//    (delay_seed, 5 seeds); with ops that sleep, idle_s (the stages' waits)
//    is below 1F1B's under zb-h1.
// And refused inputs.
#include <pthread.h>
#include <string.h>

#include "parallel/pipeline.h"
#include "pipeline_toy.h"
#include "test.h"

enum { MAX_OPS = 2 * 28 * 3, MAX_M = 28, MAX_V = 3 };

static const enum pp_schedule kinds[] = {PP_SCHEDULE_1F1B, PP_SCHEDULE_ZB_H1, PP_SCHEDULE_ZBV};

// The (p, m, v) each schedule is checked on: v 1..3 for 1F1B (v > 1:
// interleaved, m % p == 0), v = 1 zb-h1, v = 2 zbv (p >= 2).
static bool layout_valid(enum pp_schedule kind, int p, int m, int v) {
    if (kind == PP_SCHEDULE_ZB_H1) return v == 1;
    if (kind == PP_SCHEDULE_ZBV) return v == 2 && p >= 2;
    return v == 1 || (p > 1 && m % p == 0);
}

static int in_flight_bound(enum pp_schedule kind, int p, int s, int m, int v) {
    if (kind == PP_SCHEDULE_ZB_H1) return p - s;
    if (kind == PP_SCHEDULE_ZBV) return 2 * p;
    return v == 1 ? p - s : MIN(m * v, 2 * (p - s - 1) + (v - 1) * p + 1);
}

// The op after which a chunk's weight gradients of the microbatch are summed.
static bool frees(enum pp_op_kind k) { return k == PP_BACKWARD || k == PP_BACKWARD_WEIGHT; }

static void check_stage(enum pp_schedule kind, int p, int s, int m, int v,
                        const struct pp_op *ops) {
    bool split = pipeline_schedule_splits(kind);
    int n = (split ? 3 : 2) * m * v, fwd_at[MAX_M * MAX_V], bwd_at[MAX_M * MAX_V];
    int w_at[MAX_M * MAX_V], slot_of[MAX_M * MAX_V], wslot_of[MAX_M * MAX_V], wowner[64];
    int max = pipeline_max_in_flight(kind, p, s, m, v), owner[64], live = 0, peak = 0, bad = 0;
    int wmax = pipeline_max_w_pending(kind, p, s, m, v);
    int next_b[MAX_V] = {0}, next_w[MAX_V] = {0}, order = 0;
    int b_live = 0, b_peak = 0, w_live = 0, w_peak = 0; // F to B, B to W
    EXPECT(pipeline_op_count(kind, p, s, m, v) == n, "%s p=%d s=%d m=%d: %d ops, expected %d",
           pipeline_schedule_name(kind), p, s, m, pipeline_op_count(kind, p, s, m, v), n);
    for (int i = 0; i < m * v; i++) fwd_at[i] = bwd_at[i] = w_at[i] = -1;
    for (int i = 0; i < 64; i++) owner[i] = wowner[i] = -1;
    for (int i = 0; i < n; i++) {
        const struct pp_op *op = &ops[i];
        bool kind_ok = op->kind == PP_FORWARD ||
                       (split ? op->kind == PP_BACKWARD_INPUT || op->kind == PP_BACKWARD_WEIGHT
                              : op->kind == PP_BACKWARD);
        bool is_w = op->kind == PP_BACKWARD_WEIGHT;
        bool has_w = op->kind == PP_BACKWARD_INPUT || is_w;
        bool slot_ok = is_w ? op->slot == -1 : op->slot >= 0 && op->slot < max;
        bool wslot_ok = has_w ? op->wslot >= 0 && op->wslot < wmax : op->wslot == -1;
        if (!kind_ok || op->micro < 0 || op->micro >= m || op->chunk < 0 || op->chunk >= v ||
            !slot_ok || !wslot_ok) {
            bad++;
            continue;
        }
        int id = op->micro * v + op->chunk;
        if (op->kind == PP_FORWARD) {
            bad += fwd_at[id] != -1 || owner[op->slot] != -1;
            fwd_at[id] = i, slot_of[id] = op->slot, owner[op->slot] = id;
            live++;
            peak = MAX(peak, live);
            b_live++;
            b_peak = MAX(b_peak, b_live);
        } else if (op->kind == PP_BACKWARD_WEIGHT) {
            bad += w_at[id] != -1 || bwd_at[id] == -1 || wslot_of[id] != op->wslot ||
                   wowner[op->wslot] != id;
            order += op->micro != next_w[op->chunk]++;
            w_at[id] = i, wowner[op->wslot] = -1;
            w_live--;
        } else {
            bad += bwd_at[id] != -1 || fwd_at[id] == -1 || slot_of[id] != op->slot ||
                   owner[op->slot] != id;
            if (split) order += op->micro != next_b[op->chunk]++;
            bwd_at[id] = i;
            b_live--;
            if (split) {
                bad += wowner[op->wslot] != -1;
                wowner[op->wslot] = id, wslot_of[id] = op->wslot;
                w_live++;
                w_peak = MAX(w_peak, w_live);
            }
            owner[op->slot] = -1, live--; // the slot is free after the backward, or B
        }
    }
    for (int i = 0; i < m * v; i++)
        bad += fwd_at[i] < 0 || bwd_at[i] < fwd_at[i] || (split && w_at[i] < bwd_at[i]);
    // last: one per chunk, on the op that ends the chunk's weight gradients
    // (backward or W) for the last time, the chunks' in the order v - 1, ..., 0 (grad_sync relies on it).
    int next_last = v - 1, wrong_last = 0;
    for (int i = 0; i < n; i++) {
        if (!ops[i].last) continue;
        wrong_last += !frees(ops[i].kind) || ops[i].chunk != next_last--;
        for (int j = i + 1; j < n; j++)
            wrong_last += frees(ops[j].kind) && ops[j].chunk == ops[i].chunk;
    }
    EXPECT(wrong_last == 0 && next_last == -1,
           "%s p=%d s=%d m=%d v=%d: ops flagged last: %d wrong, %d chunks without one",
           pipeline_schedule_name(kind), p, s, m, v, wrong_last, next_last + 1);
    EXPECT(bad == 0,
           "%s p=%d s=%d m=%d v=%d: %d ops missing, repeated, out of order or on a busy slot",
           pipeline_schedule_name(kind), p, s, m, v, bad);
    EXPECT(order == 0, "%s p=%d s=%d m=%d v=%d: %d B or W out of microbatch order",
           pipeline_schedule_name(kind), p, s, m, v, order);
    bool tight = kind == PP_SCHEDULE_ZB_H1 || (kind == PP_SCHEDULE_ZBV && m >= 2 * p - 1);
    EXPECT(peak == max && peak <= in_flight_bound(kind, p, s, m, v) &&
               (!tight || peak == in_flight_bound(kind, p, s, m, v)),
           "%s p=%d s=%d m=%d v=%d: peak in flight %d, max_in_flight %d, bound %d",
           pipeline_schedule_name(kind), p, s, m, v, peak, max, in_flight_bound(kind, p, s, m, v));
    // The split schedules' two pools: stashes B to W, activations F to B
    // (ZB-H1: s + 1 and 1F1B's p - s; ZB-V: 2 s + 1 and 2 p once m >= 2p - 1).
    int want_w = kind == PP_SCHEDULE_ZB_H1 ? s + 1 : 2 * s + 1;
    int want_b = kind == PP_SCHEDULE_ZB_H1 ? p - s : 2 * p;
    bool exact = kind == PP_SCHEDULE_ZB_H1 || (kind == PP_SCHEDULE_ZBV && m >= 2 * p - 1);
    EXPECT(!split || (wmax == w_peak && b_peak == peak &&
                      pipeline_max_b_pending(kind, p, s, m, v) == b_peak &&
                      (!exact || (w_peak == want_w && b_peak == want_b))),
           "%s p=%d s=%d m=%d: B to W peak %d (api %d, expected %d), F to B %d (api %d, "
           "expected %d)", pipeline_schedule_name(kind), p, s, m, w_peak,
           pipeline_max_w_pending(kind, p, s, m, v), want_w, b_peak,
           pipeline_max_b_pending(kind, p, s, m, v), want_b);
    EXPECT(split || (pipeline_max_w_pending(kind, p, s, m, v) == 0 &&
                     pipeline_max_b_pending(kind, p, s, m, v) == 0),
           "%s: pending counts of a fused schedule", pipeline_schedule_name(kind));
    if (kind == PP_SCHEDULE_1F1B && v == 1) { // §2.2.1: warmup, steady 1F1B, cooldown
        int w = MIN(p - s - 1, m), k = 0, wrong = 0;
        for (int i = 0; i < w; i++, k++) wrong += ops[k].kind != PP_FORWARD || ops[k].micro != i;
        for (int j = 0; j < m - w; j++, k += 2)
            wrong += ops[k].kind != PP_FORWARD || ops[k].micro != w + j ||
                     ops[k + 1].kind != PP_BACKWARD || ops[k + 1].micro != j;
        for (int j = m - w; j < m; j++, k++)
            wrong += ops[k].kind != PP_BACKWARD || ops[k].micro != j;
        EXPECT(wrong == 0, "p=%d s=%d m=%d: %d ops out of the 1F1B order", p, s, m, wrong);
    }
}

// The rank holding virtual stage u: u mod p, or the V (zbv: stages 0 .. p - 1
// down, then back up).
static int rank_of(enum pp_schedule kind, int p, int u) {
    return kind == PP_SCHEDULE_ZBV ? (u < p ? u : 2 * p - 1 - u) : u % p;
}

// All stages at once; an op takes one unit and starts when its stage is free
// and its input exists: the forward of virtual stage u - 1 (forward), its own
// forward and the backward (or B) of u + 1 (backward, B), its B (W). Returns
// the makespan, or -1 on a deadlock.
static int simulate(enum pp_schedule kind, int p, int m, int v, struct pp_op ops[][MAX_OPS]) {
    int V = p * v, n = (pipeline_schedule_splits(kind) ? 3 : 2) * m * v, idx[8] = {0};
    int clock[8] = {0}, makespan = 0;
    static int fin[3][24][MAX_M]; // [F, B or backward, W][virtual stage][micro]: finish, -1 not yet
    memset(fin, 0xff, sizeof fin);
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < p; s++) {
            if (idx[s] == n) continue;
            const struct pp_op *op = &ops[s][idx[s]];
            int u = pipeline_virtual_stage(kind, p, s, op->chunk), ready = 0;
            int c = op->kind == PP_FORWARD ? 0 : op->kind == PP_BACKWARD_WEIGHT ? 2 : 1;
            CHECK(rank_of(kind, p, u) == s, "virtual stage %d not on stage %d", u, s);
            if (c == 0 && u > 0) ready = fin[0][u - 1][op->micro];
            if (c == 1) {
                int own = fin[0][u][op->micro], down = u < V - 1 ? fin[1][u + 1][op->micro] : 0;
                ready = own < 0 || down < 0 ? -1 : MAX(own, down);
            }
            if (c == 2) ready = fin[1][u][op->micro];
            if (ready < 0) continue;
            clock[s] = MAX(clock[s], ready) + 1;
            fin[c][u][op->micro] = clock[s];
            makespan = MAX(makespan, clock[s]);
            idx[s]++, progress = true;
        }
    }
    for (int s = 0; s < p; s++)
        if (idx[s] != n) return -1;
    return makespan;
}

static void test_schedules(void) {
    static struct pp_op ops[8][MAX_OPS];
    struct error err;
    int configs = 0;
    printf("  schedule     p  m  v  bubble  1F1B (p-1)/(m+p-1)\n");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int p = 1; p <= 8; p++)
            for (int m = p; m <= 3 * p + 4; m++)
                for (int v = 1; v <= 3; v++) {
                    enum pp_schedule kind = kinds[k];
                    if (!layout_valid(kind, p, m, v)) continue;
                    for (int s = 0; s < p; s++) {
                        EXPECT(pipeline_schedule(kind, p, s, m, v, ops[s], &err) == STATUS_OK,
                               "%s p=%d s=%d m=%d v=%d refused: %s",
                               pipeline_schedule_name(kind), p, s, m, v, err.msg);
                        check_stage(kind, p, s, m, v, ops[s]);
                    }
                    configs++;
                    int T = simulate(kind, p, m, v, ops);
                    EXPECT(T > 0, "%s p=%d m=%d v=%d: deadlock in the unit-time simulation",
                           pipeline_schedule_name(kind), p, m, v);
                    if (T <= 0) continue;
                    int work = (pipeline_schedule_splits(kind) ? 3 : 2) * m * v;
                    double bubble = 1.0 - (double)work / T;
                    double f1 = (double)(p - 1) / (m + p - 1), want = bubble;
                    int want_T = T;
                    struct pp_costs unit = {1, 1, 1, 0}, half = {1, 0.5, 0.5, 0};
                    struct pp_sim sim;
                    if (kind == PP_SCHEDULE_1F1B) {
                        // A chunk op is 1/v of a stage's: the ideal makespan is
                        // 2 m v units of work plus a bubble of 2 (p - 1) units (§2.2.2).
                        want_T = 2 * (m * v + p - 1);
                        want = (double)(p - 1) / (v * m + p - 1);
                        // pipeline_simulate with a backward as long as a forward.
                        EXPECT(pipeline_simulate(kind, p, m, v, &half, &sim, &err) == STATUS_OK &&
                                   sim.makespan == T,
                               "p=%d m=%d v=%d: pipeline_simulate's makespan %g, this one's %d",
                               p, m, v, sim.makespan, T);
                    } else if (kind == PP_SCHEDULE_ZB_H1) {
                        want_T = 3 * m + p - 1; // every stage idles p - 1 units (§3)
                        want = (double)(p - 1) / (3 * m + p - 1);
                    } else if (2 * m >= 3 * p) {
                        want_T = 6 * m + p - 1;
                        want = (double)(p - 1) / (6 * m + p - 1);
                    }
                    if (kind != PP_SCHEDULE_1F1B)
                        EXPECT(pipeline_simulate(kind, p, m, v, &unit, &sim, &err) == STATUS_OK &&
                                   sim.makespan == T && fabs(sim.bubble - bubble) < 1e-12,
                               "%s p=%d m=%d: pipeline_simulate's makespan %g bubble %.6f, this "
                               "one's %d, %.6f", pipeline_schedule_name(kind), p, m, sim.makespan,
                               sim.bubble, T, bubble);
                    EXPECT(T == want_T, "%s p=%d m=%d v=%d: makespan %d, expected %d",
                           pipeline_schedule_name(kind), p, m, v, T, want_T);
                    EXPECT(fabs(bubble - want) < 1e-12 &&
                               (p == 1 || (kind == PP_SCHEDULE_1F1B && v == 1) || bubble < f1),
                           "%s p=%d m=%d v=%d: bubble %.4f, expected %.4f (1F1B %.4f)",
                           pipeline_schedule_name(kind), p, m, v, bubble, want, f1);
                    if (p >= 2 && (m == p || m == 2 * p) && (v == 1 || m % p == 0))
                        printf("  %-11s %2d %2d  %d  %.4f  %.4f\n", pipeline_schedule_name(kind), p,
                               m, v, bubble, f1);
                }
    printf("  %d (schedule, p, m, v) checked\n", configs);
}

// §2.2.1, Fig. 4 with p = 4, m = 8: written out by hand.
static void test_literal_1f1b(void) {
    const char *want[4] = {
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
    };
    for (int s = 0; s < 4; s++) {
        struct pp_op ops[16];
        char got[128] = "";
        EXPECT(pipeline_schedule(PP_SCHEDULE_1F1B, 4, s, 8, 1, ops, NULL) == STATUS_OK, "p=4 m=8 refused");
        for (int i = 0; i < 16; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%c%d", i ? " " : "",
                     ops[i].kind == PP_FORWARD ? 'F' : 'B', ops[i].micro);
        EXPECT(!strcmp(got, want[s]), "stage %d: %s, expected %s", s, got, want[s]);
    }
}

// ZB-H1, p = 4, m = 8, written out by hand from Qi et al. 2024 §3 (Fig. 3's
// ZB-H1 with the deferred W's in microbatch order): warmup forwards, s B/F
// pairs whose W waits, B/W/F triples, B/W cooldown, the s deferred W's.
static void test_literal_zb_h1(void) {
    const char *want[4] = {
        "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7",
        "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7",
        "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7",
        "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7",
    };
    for (int s = 0; s < 4; s++) {
        struct pp_op ops[24];
        char got[160] = "";
        EXPECT(pipeline_schedule(PP_SCHEDULE_ZB_H1, 4, s, 8, 1, ops, NULL) == STATUS_OK,
               "zb-h1 p=4 m=8 refused");
        for (int i = 0; i < 24; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%c%d", i ? " " : "",
                     "FBBW"[ops[i].kind], ops[i].micro);
        EXPECT(!strcmp(got, want[s]), "zb-h1 stage %d: %s, expected %s", s, got, want[s]);
        EXPECT(ops[23].last && pipeline_max_in_flight(PP_SCHEDULE_ZB_H1, 4, s, 8, 1) == 4 - s &&
                   pipeline_max_w_pending(PP_SCHEDULE_ZB_H1, 4, s, 8, 1) == s + 1,
               "zb-h1 stage %d: last op not flagged, or %d slots and %d W stashes, expected "
               "p - s = %d and s + 1", s, pipeline_max_in_flight(PP_SCHEDULE_ZB_H1, 4, s, 8, 1),
               pipeline_max_w_pending(PP_SCHEDULE_ZB_H1, 4, s, 8, 1), 4 - s);
    }
}

static void test_refused(void) {
    struct { enum pp_schedule kind; int p, s, m, v; const char *says; } cases[] = {
        {PP_SCHEDULE_1F1B, 0, 0, 4, 1, "0 stages"},
        {PP_SCHEDULE_1F1B, 4, 4, 8, 1, "stage 4, expected 0..3"},
        {PP_SCHEDULE_1F1B, 4, -1, 8, 1, "stage -1"},
        {PP_SCHEDULE_1F1B, 4, 0, 8, 0, "virtual_stages=0"},
        {PP_SCHEDULE_1F1B, 4, 0, 3, 1, "fewer microbatches than stages: m=3 microbatches for p=4"},
        {PP_SCHEDULE_1F1B, 4, 1, 6, 2, "multiple of pp: m=6, p=4"},
        {PP_SCHEDULE_1F1B, 1, 0, 4, 2, "virtual_stages=2 needs pp >= 2"},
        {PP_SCHEDULE_INTERLEAVED, 4, 0, 8, 1, "needs virtual_stages >= 2, got 1"},
        {PP_SCHEDULE_ZB_H1, 4, 0, 8, 2, "zb-h1 runs one model chunk per stage: virtual_stages=2"},
        {PP_SCHEDULE_ZB_H1, 4, 0, 3, 1, "m=3 microbatches for p=4"},
        {PP_SCHEDULE_ZBV, 4, 0, 8, 1, "two model chunks per stage in a V: virtual_stages=1"},
        {PP_SCHEDULE_ZBV, 4, 0, 8, 3, "virtual_stages=3, expected 2"},
        {PP_SCHEDULE_ZBV, 1, 0, 4, 2, "zbv needs pp >= 2, got p=1"},
        {PP_SCHEDULE_ZBV, 4, 0, 3, 2, "m=3 microbatches for p=4"},
        {PP_SCHEDULE_COUNT, 4, 0, 8, 1, "schedule 4"},
    };
    struct pp_op ops[64];
    struct pp_costs unit = {1, 1, 1, 0};
    struct pp_sim sim;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct error err = {0};
        enum status st = pipeline_schedule(cases[i].kind, cases[i].p, cases[i].s, cases[i].m,
                                           cases[i].v, ops, &err);
        EXPECT(st == STATUS_BAD_INPUT && strstr(err.msg, cases[i].says),
               "%s p=%d s=%d m=%d v=%d: status %d, message '%s', expected '%s'",
               pipeline_schedule_name(cases[i].kind), cases[i].p, cases[i].s, cases[i].m,
               cases[i].v, st, err.msg, cases[i].says);
        enum pp_schedule k = cases[i].kind;
        int p = cases[i].p, s = cases[i].s, m = cases[i].m, v = cases[i].v;
        EXPECT(pipeline_max_in_flight(k, p, s, m, v) == 0 && pipeline_op_count(k, p, s, m, v) == 0 &&
                   pipeline_ring_size(k, p, s, m, v, PP_STREAM_ACT_IN) == 0,
               "max_in_flight, op_count or ring of a refused schedule");
        if (cases[i].s == 0) {
            err.msg[0] = 0;
            EXPECT(pipeline_simulate(cases[i].kind, cases[i].p, cases[i].m, cases[i].v, &unit,
                                     &sim, &err) == STATUS_BAD_INPUT &&
                       strstr(err.msg, cases[i].says),
                   "simulate %s p=%d m=%d v=%d: '%s'", pipeline_schedule_name(cases[i].kind),
                   cases[i].p, cases[i].m, cases[i].v, err.msg);
        }
    }
    // A pp group of the wrong size.
    struct comm_group self;
    comm_self_init(&self);
    struct pipeline_exec x = {.p = 2, .s = 0, .m = 4, .v = 1, .group = &self, .count = 8,
                              .forward = toy_forward, .backward = toy_backward};
    struct error err = {0};
    EXPECT(pipeline_exec_init(&x, &err) == STATUS_BAD_INPUT && strstr(err.msg, "1 ranks") &&
               !x.state, "group of 1 for p=2: '%s'", err.msg);
    // A split schedule without the weight callback.
    x = (struct pipeline_exec){.kind = PP_SCHEDULE_ZB_H1, .p = 1, .s = 0, .m = 4, .v = 1,
                               .group = &self, .count = 8, .forward = toy_forward,
                               .backward = toy_backward};
    EXPECT(pipeline_exec_init(&x, &err) == STATUS_BAD_INPUT && strstr(err.msg, "zb-h1") &&
               strstr(err.msg, "pipeline_exec.weight) is NULL") && !x.state,
           "zb-h1 without weight: '%s'", err.msg);
}

// Default rings: one buffer at least exactly on the streams that carry
// messages (counted from the schedule), none on the others, never more than
// the stream's messages plus the spare; none on zbv's local outputs at stage
// p - 1 (they write into the receive ring of the chunk they feed); the
// buffer bytes are their sum.
static void test_rings(void) {
    static struct pp_op ops[MAX_OPS];
    printf("  default rings (act in, grad in, act out, grad out; zbv: then the _V four), "
           "stage 0 and p-1:\n");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int p = 1; p <= 8; p++)
            for (int m = p; m <= 3 * p + 4; m++)
                for (int v = 1; v <= 3; v++) {
                    enum pp_schedule kind = kinds[k];
                    if (!layout_valid(kind, p, m, v)) continue;
                    int n = pipeline_op_count(kind, p, 0, m, v), V = p * v;
                    for (int s = 0; s < p; s++) {
                        pipeline_schedule(kind, p, s, m, v, ops, NULL);
                        int msgs[PP_STREAM_COUNT] = {0}, ring[PP_STREAM_COUNT], sum = 0, bad = 0;
                        bool local[PP_STREAM_COUNT] = {false};
                        for (int i = 0; i < n; i++) {
                            if (ops[i].kind == PP_BACKWARD_WEIGHT) continue;
                            int u = pipeline_virtual_stage(kind, p, s, ops[i].chunk);
                            bool f = ops[i].kind == PP_FORWARD;
                            bool vee = kind == PP_SCHEDULE_ZBV && ops[i].chunk == 1;
                            int in = f ? (vee ? PP_STREAM_ACT_IN_V : PP_STREAM_ACT_IN)
                                       : (vee ? PP_STREAM_GRAD_IN_V : PP_STREAM_GRAD_IN);
                            int out = f ? (vee ? PP_STREAM_ACT_OUT_V : PP_STREAM_ACT_OUT)
                                        : (vee ? PP_STREAM_GRAD_OUT_V : PP_STREAM_GRAD_OUT);
                            int from = f ? u - 1 : u + 1, to = f ? u + 1 : u - 1;
                            if (from >= 0 && from < V) msgs[in]++;
                            if (to >= 0 && to < V) {
                                msgs[out]++;
                                local[out] = rank_of(kind, p, to) == s;
                            }
                        }
                        for (int q = 0; q < PP_STREAM_COUNT; q++) {
                            ring[q] = pipeline_ring_size(kind, p, s, m, v, (enum pp_stream_kind)q);
                            if (local[q]) bad += ring[q] != 0;
                            else bad += (ring[q] > 0) != (msgs[q] > 0) || ring[q] > msgs[q] + 1;
                            sum += ring[q];
                        }
                        EXPECT(bad == 0 && pipeline_buffer_bytes(kind, p, s, m, v, 10, DTYPE_BF16) ==
                                               (size_t)sum * 20,
                               "%s p=%d s=%d m=%d v=%d: rings %d %d %d %d %d %d %d %d for %d %d %d "
                               "%d %d %d %d %d messages", pipeline_schedule_name(kind), p, s, m, v,
                               ring[0], ring[1], ring[2], ring[3], ring[4], ring[5], ring[6],
                               ring[7], msgs[0], msgs[1], msgs[2], msgs[3], msgs[4], msgs[5],
                               msgs[6], msgs[7]);
                        if (p >= 4 && m == 2 * p && (s == 0 || s == p - 1)) {
                            printf("    %-11s p=%d m=%2d v=%d s=%d: %d %d %d %d",
                                   pipeline_schedule_name(kind), p, m, v, s, ring[0], ring[1],
                                   ring[2], ring[3]);
                            if (kind == PP_SCHEDULE_ZBV)
                                printf("  %d %d %d %d", ring[4], ring[5], ring[6], ring[7]);
                            printf("  max in flight %d\n",
                                   pipeline_max_in_flight(kind, p, s, m, v));
                        }
                    }
                }
}

// pipeline_simulate with unit costs F = B = W = 1 (a whole backward 2),
// comm 0: the closed forms of Narayanan et al. 2021 §2.2 for every (p, m, v),
// with a backward as long as a forward (1, 0.5, 0.5) too; p = 4, m = 8 to
// the digit; the timeline of 1F1B p = 4, m = 8 (Fig. 4) written out by hand;
// a message cost on p = 2, m = 2 worked out by hand; refused inputs.
static void test_simulator(void) {
    struct pp_sim sim;
    struct error err = {0};
    struct pp_costs unit = {1, 1, 1, 0}, even = {1, 0.5, 0.5, 0};
    EXPECT(pipeline_simulate(PP_SCHEDULE_1F1B, 4, 8, 1, &unit, &sim, &err) == STATUS_OK, "%s",
           err.msg);
    EXPECT(fabs(sim.bubble - 3.0 / 11.0) < 1e-12 && sim.makespan == 33,
           "1F1B p=4 m=8: bubble %.15f, makespan %g, expected 3/11 and 33", sim.bubble,
           sim.makespan);
    for (int s = 0; s < 4; s++)
        EXPECT(sim.idle[s] == 9 && sim.busy[s] == 24 && sim.peak_in_flight[s] == 4 - s,
               "1F1B p=4 m=8 stage %d: idle %g busy %g peak %d", s, sim.idle[s], sim.busy[s],
               sim.peak_in_flight[s]);
    EXPECT(pipeline_simulate(PP_SCHEDULE_INTERLEAVED, 4, 8, 2, &unit, &sim, &err) == STATUS_OK,
           "%s", err.msg);
    EXPECT(fabs(sim.bubble - 3.0 / 19.0) < 1e-12 && sim.makespan == 57,
           "interleaved p=4 m=8 v=2: bubble %.15f, makespan %g, expected 3/19 and 57", sim.bubble,
           sim.makespan);
    int wrong = 0, runs = 0;
    for (int p = 1; p <= 8; p++)
        for (int m = p; m <= 3 * p + 4; m++)
            for (int v = 1; v <= 3; v++) {
                if (v > 1 && (p == 1 || m % p)) continue;
                for (int c = 0; c < 2; c++, runs++) {
                    const struct pp_costs *costs = c ? &even : &unit;
                    double work = costs->f + costs->b + costs->w;
                    bool ok = pipeline_simulate(PP_SCHEDULE_1F1B, p, m, v, costs, &sim, &err) ==
                              STATUS_OK;
                    ok = ok && sim.makespan == work * (v * m + p - 1) &&
                         fabs(sim.bubble - (double)(p - 1) / (v * m + p - 1)) < 1e-12;
                    if (!ok && wrong++ < 5)
                        fprintf(stderr, "  p=%d m=%d v=%d costs %d: makespan %g, bubble %.6f\n", p,
                                m, v, c, sim.makespan, sim.bubble);
                }
            }
    EXPECT(wrong == 0, "%d of %d simulations off the closed form (p-1)/(vm+p-1)", wrong, runs);

    // p = 2, m = 2, messages of 0.25: stage 1 gets F0 at 1.25, F1 at 2.25;
    // B0 back on stage 0 at 4.5; B1 at 7.5 after stage 1's F1 (4.25 .. 5.25)
    // and B1 (.. 7.25): 9.5 = 3 (m + p - 1) + 2 (p - 1) comm.
    struct pp_costs slow = {1, 1, 1, 0.25};
    EXPECT(pipeline_simulate(PP_SCHEDULE_1F1B, 2, 2, 1, &slow, &sim, &err) == STATUS_OK &&
               sim.makespan == 9.5 && sim.idle[0] == 3.5 && sim.idle[1] == 3.5,
           "1F1B p=2 m=2 comm 0.25: makespan %g idle %g %g, expected 9.5, 3.5, 3.5", sim.makespan,
           sim.idle[0], sim.idle[1]);

    char text[4096] = "";
    FILE *f = fmemopen(text, sizeof text - 1, "w");
    EXPECT(pipeline_print_timeline(f, PP_SCHEDULE_1F1B, 4, 8, 1, &unit, 1, &err) == STATUS_OK,
           "%s", err.msg);
    fclose(f);
    const char *want = "stage  0 FFFF......BBFBBFBBFBBFBB.BB.BB.BB  idle 9\n"
                       "stage  1 .FFF....BBFBBFBBFBBFBBFBB.BB.BB..  idle 9\n"
                       "stage  2 ..FF..BBFBBFBBFBBFBBFBBFBB.BB....  idle 9\n"
                       "stage  3 ...FBBFBBFBBFBBFBBFBBFBBFBB......  idle 9\n"
                       "makespan 33, bubble 0.2727\n";
    EXPECT(strstr(text, want), "timeline of 1F1B p=4 m=8:\n%s\nexpected\n%s", text, want);

    // The zero-bubble schedules, unit costs per op (a zbv op is one chunk's,
    // half a stage's work: the fractions compare). ZB-H1: every stage idles
    // p - 1 = 3 units, 3 m + p - 1 = 27 in all (Qi et al. 2024 §3); ZB-V: 3
    // of 6 m + p - 1 = 51.
    struct pp_sim h1, zbv, f1;
    EXPECT(pipeline_simulate(PP_SCHEDULE_ZB_H1, 4, 8, 1, &unit, &h1, &err) == STATUS_OK &&
               pipeline_simulate(PP_SCHEDULE_ZBV, 4, 8, 2, &unit, &zbv, &err) == STATUS_OK &&
               pipeline_simulate(PP_SCHEDULE_1F1B, 4, 8, 1, &unit, &f1, &err) == STATUS_OK,
           "%s", err.msg);
    EXPECT(fabs(h1.bubble - 3.0 / 27.0) < 1e-12 && h1.makespan == 27,
           "zb-h1 p=4 m=8: bubble %.15f makespan %g, expected 3/27 and 27", h1.bubble, h1.makespan);
    EXPECT(fabs(zbv.bubble - 3.0 / 51.0) < 1e-12 && zbv.makespan == 51,
           "zbv p=4 m=8: bubble %.15f makespan %g, expected 3/51 and 51", zbv.bubble,
           zbv.makespan);
    EXPECT(zbv.bubble < h1.bubble && h1.bubble < f1.bubble,
           "p=4 m=8 bubbles: zbv %.4f, zb-h1 %.4f, 1f1b %.4f, expected decreasing", zbv.bubble,
           h1.bubble, f1.bubble);
    for (int s = 0; s < 4; s++)
        EXPECT(h1.idle[s] == 3 && zbv.idle[s] == 3 && h1.peak_in_flight[s] == 4 - s &&
                   zbv.peak_in_flight[s] == 8,
               "stage %d: zb-h1 idle %g peak %d, zbv idle %g peak %d, expected 3, %d, 3, 8", s,
               h1.idle[s], h1.peak_in_flight[s], zbv.idle[s], zbv.peak_in_flight[s], 4 - s);
    printf("  unit costs p=4 m=8: bubble 1f1b %.4f (3/11), zb-h1 %.4f (3/27), zbv %.4f (3/51)\n",
           f1.bubble, h1.bubble, zbv.bubble);
    // ZB-H1 is below 1F1B for every p > 1, m >= p, also with B longer than W.
    struct pp_costs layer = {1, 1.25, 0.75, 0};
    wrong = runs = 0;
    for (int p = 2; p <= 8; p++)
        for (int m = p; m <= 3 * p + 4; m++, runs++) {
            bool ok = !pipeline_simulate(PP_SCHEDULE_ZB_H1, p, m, 1, &layer, &h1, &err) &&
                      !pipeline_simulate(PP_SCHEDULE_1F1B, p, m, 1, &layer, &f1, &err) &&
                      h1.bubble < f1.bubble;
            wrong += !ok;
        }
    EXPECT(wrong == 0, "F 1, B 1.25, W 0.75: zb-h1's bubble not below 1F1B's in %d of %d", wrong,
           runs);

    const char *want_zb[2] = {
        "stage  0 FFFF...BWFBWFBWFBWFBWBWBWBW  idle 3\n"
        "stage  1 .FFF..BFBWFBWFBWFBWFBWBWBWW  idle 3\n"
        "stage  2 ..FF.BFBFBWFBWFBWFBWFBWBWWW  idle 3\n"
        "stage  3 ...FBFBFBFBWFBWFBWFBWFBWWWW  idle 3\n"
        "makespan 27, bubble 0.1111\n",
        "stage  0 FFFFFFFfbwfbwfbwfbwFBWfbwBWfbwBWfbwBWfbwBWBWBWBW...  idle 3\n"
        "stage  1 .FFFFFfFfbwfbwfbwFBWfbwFBWfbwBWfbwBWfbwBbBWBWBWwW..  idle 3\n"
        "stage  2 ..FFFfFfFfbwfbwFBWfbwFBWfbwFBWfbwBWfbwBbBbBWBWwwWW.  idle 3\n"
        "stage  3 ...FfFfFfFfbwFBWfbwFBWfbwFBWfbwFBWfbwBbBbBbBWwwwWWW  idle 3\n"
        "makespan 51, bubble 0.0588\n"};
    for (int z = 0; z < 2; z++) {
        memset(text, 0, sizeof text);
        f = fmemopen(text, sizeof text - 1, "w");
        EXPECT(pipeline_print_timeline(f, z ? PP_SCHEDULE_ZBV : PP_SCHEDULE_ZB_H1, 4, 8, z + 1,
                                       &unit, 1, &err) == STATUS_OK, "%s", err.msg);
        fclose(f);
        EXPECT(strstr(text, want_zb[z]), "timeline:\n%s\nexpected\n%s", text, want_zb[z]);
        if (z) printf("%s", text);
    }

    struct pp_costs bad = {1, -1, 1, 0};
    EXPECT(pipeline_simulate(PP_SCHEDULE_1F1B, 4, 8, 1, &bad, &sim, &err) == STATUS_BAD_INPUT &&
               strstr(err.msg, "b=-1"), "negative cost: '%s'", err.msg);
    EXPECT(pipeline_simulate(PP_SCHEDULE_1F1B, 4, 3, 1, &unit, &sim, &err) == STATUS_BAD_INPUT &&
               strstr(err.msg, "m=3 microbatches for p=4"), "m < p: '%s'", err.msg);
    EXPECT(pipeline_simulate(PP_SCHEDULE_1F1B, 65, 65, 1, &unit, &sim, &err) == STATUS_BAD_INPUT &&
               strstr(err.msg, "p=65"), "p=65: '%s'", err.msg);
}

// ---- a rendezvous network of threads --------------------------------------------

struct mock_rec { // one posted send or receive
    int owner, peer, tag, is_send;
    void *buf;
    size_t bytes;
    bool done;
};

struct mock_net {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int p;
    struct mock_rec *pending[8][256]; // unmatched posts per owner, in post order
    int n_pending[8];
    struct mock_rec *waiting[8];     // what each thread waits on, NULL when running
    bool alive[8], deadlock;
};

static struct mock_net *net_of(struct comm_group *g) { return g->impl; }

static void mock_post(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
                      int tag, int is_send, struct comm_request *req) {
    struct mock_net *net = net_of(g);
    struct mock_rec *r = xcalloc(1, sizeof *r);
    *r = (struct mock_rec){g->rank, peer, tag, is_send, buf, count * dtype_size(dtype), false};
    memcpy(req->storage, &r, sizeof r);
    pthread_mutex_lock(&net->mu);
    int n = net->n_pending[peer];
    for (int i = 0; i < n; i++) {
        struct mock_rec *o = net->pending[peer][i];
        if (o->peer != g->rank || o->tag != tag || o->is_send == is_send) continue;
        CHECK(o->bytes == r->bytes, "mock: %zu bytes sent, %zu expected", r->bytes, o->bytes);
        memcpy(is_send ? o->buf : buf, is_send ? buf : o->buf, r->bytes);
        o->done = r->done = true;
        memmove(&net->pending[peer][i], &net->pending[peer][i + 1], sizeof(r) * (n - i - 1));
        net->n_pending[peer]--;
        pthread_cond_broadcast(&net->cv);
        pthread_mutex_unlock(&net->mu);
        return;
    }
    CHECK(net->n_pending[g->rank] < 256, "mock: too many pending posts");
    net->pending[g->rank][net->n_pending[g->rank]++] = r;
    pthread_mutex_unlock(&net->mu);
}

static void mock_send_start(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                            int peer, int tag, struct comm_request *req) {
    mock_post(g, (void *)buf, count, dtype, peer, tag, 1, req);
}

static void mock_recv_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                            int peer, int tag, struct comm_request *req) {
    mock_post(g, buf, count, dtype, peer, tag, 0, req);
}

// Every live thread waits on a request that is not done: no one can post.
static bool mock_stuck(struct mock_net *net) {
    for (int r = 0; r < net->p; r++)
        if (net->alive[r] && (!net->waiting[r] || net->waiting[r]->done)) return false;
    return true;
}

static void mock_wait(struct comm_request *req) {
    struct mock_net *net = net_of(req->group);
    struct mock_rec *r;
    memcpy(&r, req->storage, sizeof r);
    pthread_mutex_lock(&net->mu);
    net->waiting[r->owner] = r;
    while (!r->done) {
        if (net->deadlock || mock_stuck(net)) {
            net->deadlock = true;
            net->alive[r->owner] = false;
            pthread_cond_broadcast(&net->cv);
            pthread_mutex_unlock(&net->mu);
            pthread_exit(NULL);
        }
        pthread_cond_wait(&net->cv, &net->mu);
    }
    net->waiting[r->owner] = NULL;
    pthread_mutex_unlock(&net->mu);
    free(r);
}

static bool mock_test(struct comm_request *req) {
    struct mock_net *net = net_of(req->group);
    struct mock_rec *r;
    memcpy(&r, req->storage, sizeof r);
    pthread_mutex_lock(&net->mu);
    bool done = r->done;
    pthread_mutex_unlock(&net->mu);
    if (done) free(r);
    return done;
}

static const struct comm_ops mock_ops = {
    .name = "mock", .send_start = mock_send_start, .recv_start = mock_recv_start,
    .wait = mock_wait, .test = mock_test,
};

struct mock_rank {
    struct mock_net *net;
    struct comm_group g;
    struct pipeline_exec x;
    struct toy toy;
    double idle_s; // x.idle_s after the run
    int done;
};

static void *mock_rank_main(void *arg) {
    struct mock_rank *r = arg;
    struct error err;
    CHECK(pipeline_exec_init(&r->x, &err) == STATUS_OK, "%s", err.msg);
    r->x.idle_s = 1e9; // pipeline_run starts it from 0
    CHECK(pipeline_run(&r->x, &err) == STATUS_OK, "%s", err.msg);
    r->idle_s = r->x.idle_s;
    pipeline_exec_free(&r->x);
    pthread_mutex_lock(&r->net->mu);
    r->done = 1;
    r->net->alive[r->g.rank] = false;
    pthread_cond_broadcast(&r->net->cv);
    pthread_mutex_unlock(&r->net->mu);
    return NULL;
}

enum { TOY_N = 8 };

// Runs the toy model of schedule kind over p threads with the given ring
// (0: default) and delay seed; grads (p v, 2, TOY_N), when given, receives
// each virtual stage's da and db. Returns 0, or the failed checks.
static int run_threads(enum pp_schedule kind, int p, int m, int v, int ring, uint64_t seed,
                       float *grads, double *idle_sum, double op_s) {
    struct mock_net net = {.p = p};
    pthread_mutex_init(&net.mu, NULL);
    pthread_cond_init(&net.cv, NULL);
    struct mock_rank ranks[8];
    pthread_t th[8];
    for (int s = 0; s < p; s++) {
        struct mock_rank *r = &ranks[s];
        r->net = &net, r->done = 0, net.alive[s] = true;
        r->g = (struct comm_group){.rank = s, .size = p, .ops = &mock_ops, .impl = &net};
        toy_init(&r->toy, kind, p, s, m, v, TOY_N, pipeline_max_in_flight(kind, p, s, m, v),
                 pipeline_max_w_pending(kind, p, s, m, v));
        r->x = (struct pipeline_exec){.kind = kind, .p = p, .s = s, .m = m, .v = v,
                                      .group = &r->g, .count = TOY_N, .dtype = DTYPE_FP32,
                                      .ctx = &r->toy, .forward = toy_forward,
                                      .backward = toy_backward, .weight = toy_weight,
                                      .ring = ring, .delay_seed = seed};
        r->toy.poll = m % 2 ? &r->x : NULL; // pipeline_poll inside the callbacks
        r->toy.op_s = op_s;
    }
    for (int s = 0; s < p; s++) pthread_create(&th[s], NULL, mock_rank_main, &ranks[s]);
    int bad = 0;
    for (int s = 0; s < p; s++) {
        pthread_join(th[s], NULL);
        int b = ranks[s].done ? toy_finish(&ranks[s].toy) : 0;
        if (b) fprintf(stderr, "  %s p=%d m=%d v=%d ring=%d seed=%llu stage %d: %d wrong, %s\n",
                       pipeline_schedule_name(kind), p, m, v, ring, (unsigned long long)seed, s, b,
                       ranks[s].toy.first);
        bad += b;
        if (ranks[s].done) {
            EXPECT(ranks[s].idle_s >= 0 && ranks[s].idle_s < 60,
                   "%s p=%d m=%d stage %d: idle_s %g after the run", pipeline_schedule_name(kind),
                   p, m, s, ranks[s].idle_s);
            if (idle_sum) *idle_sum += ranks[s].idle_s;
        }
        for (int c = 0; grads && ranks[s].done && c < v; c++) {
            int u = pipeline_virtual_stage(kind, p, s, c);
            memcpy(grads + (size_t)u * 2 * TOY_N, ranks[s].toy.da + (size_t)c * TOY_N,
                   sizeof(float) * TOY_N);
            memcpy(grads + ((size_t)u * 2 + 1) * TOY_N, ranks[s].toy.db + (size_t)c * TOY_N,
                   sizeof(float) * TOY_N);
        }
        toy_free(&ranks[s].toy);
    }
    EXPECT(!net.deadlock, "%s p=%d m=%d v=%d ring=%d seed=%llu: deadlock (every live thread waits)",
           pipeline_schedule_name(kind), p, m, v, ring, (unsigned long long)seed);
    pthread_cond_destroy(&net.cv);
    pthread_mutex_destroy(&net.mu);
    return bad + net.deadlock;
}

static void test_executor_threads(void) {
    int runs = 0, failed = 0, differ = 0, compared = 0;
    static float fused[3][24 * 2 * TOY_N], got[24 * 2 * TOY_N]; // by v: the 1F1B run's gradients
    for (int p = 1; p <= 8; p++)
        for (int m = p; m <= 3 * p + 4; m++)
            for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
                for (int v = 1; v <= 3; v++) {
                    enum pp_schedule kind = kinds[k];
                    if (!layout_valid(kind, p, m, v)) continue;
                    for (int ring = 0; ring <= 1; ring++, runs++) {
                        float *out = kind == PP_SCHEDULE_1F1B ? fused[v - 1] : got;
                        failed += run_threads(kind, p, m, v, ring, 0, out, NULL, 0) != 0;
                        // The split runs against the fused 1F1B run of the same
                        // virtual stages (interleaved v = 2 for zbv), bit for bit.
                        if (kind == PP_SCHEDULE_1F1B || (v == 2 && m % p)) continue;
                        compared++;
                        differ += memcmp(got, fused[v - 1], sizeof(float) * p * v * 2 * TOY_N) != 0;
                    }
                }
    EXPECT(failed == 0, "%d of %d threaded pipeline runs failed", failed, runs);
    EXPECT(differ == 0, "%d of %d split runs' weight gradients differ from the fused 1F1B run's",
           differ, compared);
    printf("  %d threaded executor runs (rendezvous messages, ring 1 and default), %d split runs "
           "equal to the fused run\n", runs, compared);

    // Random delays of 0 to 2 ms before every send and receive.
    int delayed = 0;
    double idle = 0;
    failed = 0;
    for (int z = 0; z < 2; z++)
        for (int layout = 0; layout < 2; layout++)
            for (uint64_t seed = 1; seed <= 5; seed++)
                for (int ring = 0; ring <= 1; ring++, delayed++) {
                    enum pp_schedule kind = z ? PP_SCHEDULE_ZBV : PP_SCHEDULE_ZB_H1;
                    int p = layout ? 4 : 3, m = layout ? 8 : 5;
                    failed += run_threads(kind, p, m, z + 1, ring, seed, NULL, &idle, 0) != 0;
                }
    EXPECT(failed == 0 && idle > 0,
           "%d of %d delayed runs failed; the stages waited %g s in all", failed, delayed, idle);
    printf("  %d threaded runs of zb-h1 and zbv with delay seeds 1..5: stages waited %.3f s\n",
           delayed, idle);

    // idle_s measures the bubble: ops that sleep 3 ms (F, B, W; a whole
    // backward 6 ms), p = 4, m = 8. Unit-time idle per stage: 1F1B 3 (p - 1)
    // units = 27 ms, ZB-H1 p - 1 = 9 ms (the simulator's). idle_s counts
    // the waits, not the time after a stage's last op (1F1B: 2 s units on
    // stage s, 36 ms in all; ZB-H1: none), so the sums over the 4 stages are
    // about 72 ms and 36 ms plus the threads' overheads: ZB-H1 must be below.
    double idle_1f1b = 0, idle_h1 = 0;
    failed = run_threads(PP_SCHEDULE_1F1B, 4, 8, 1, 0, 0, NULL, &idle_1f1b, 3e-3) != 0;
    failed += run_threads(PP_SCHEDULE_ZB_H1, 4, 8, 1, 0, 0, NULL, &idle_h1, 3e-3) != 0;
    EXPECT(failed == 0 && idle_h1 < idle_1f1b && idle_1f1b > 0.05,
           "ops of 3 ms, p=4 m=8: idle_s summed over stages 1f1b %.3f s, zb-h1 %.3f s, expected "
           "about 0.072 and 0.036", idle_1f1b, idle_h1);
    printf("  ops of 3 ms, p=4 m=8: idle_s summed over the stages: 1f1b %.3f s (0.072 in waits "
           "simulated), zb-h1 %.3f s (0.036)\n", idle_1f1b, idle_h1);
}

int main(void) {
    test_refused();
    test_literal_1f1b();
    test_literal_zb_h1();
    test_schedules();
    test_rings();
    test_simulator();
    test_executor_threads();
    return test_finish("test_pipeline");
}

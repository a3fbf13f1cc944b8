// test_pipeline.c: pipeline schedules (src/parallel/pipeline.c) against the properties
// of Narayanan et al. 2021 §2.2, and the executor on threads.
//
// For every p in 1..8, m in p..3p+4, v in 1..3 (where valid):
//  - each stage runs each (micro, chunk) forward once and backward once, the
//    backward after the forward; slots are never shared by two ops in flight;
//  - the peak in flight equals pipeline_max_in_flight and is <= p - s for
//    v == 1, <= min(m v, 2 (p - s - 1) + (v - 1) p + 1) for v > 1;
//  - v == 1: warmup forwards, then F/B alternation, then cooldown (and a
//    literal sequence for p = 4, m = 8);
//  - all stages together, ops of unit time, start as soon as their input
//    exists: no stage waits forever (deadlock check), and the bubble is
//    (p-1)/(m+p-1) of the time for v == 1 and (p-1)/(vm+p-1) for v > 1
//    (the makespan is exactly 2 (vm + p - 1) op times), below 1F1B's;
//  - the executor runs the toy model of pipeline_toy.h on p threads whose
//    messages complete only on a match (rendezvous, worse than MPI's eager
//    sends), with a ring of 1 buffer and with the default ring: exact
//    values, no deadlock (detected when every live thread waits).
// And refused inputs.
#include <pthread.h>
#include <string.h>

#include "parallel/pipeline.h"
#include "pipeline_toy.h"
#include "test.h"

enum { MAX_OPS = 2 * 28 * 3 };

static int in_flight_bound(int p, int s, int m, int v) {
    return v == 1 ? p - s : MIN(m * v, 2 * (p - s - 1) + (v - 1) * p + 1);
}

static void check_stage(int p, int s, int m, int v, const struct pp_op *ops) {
    int n = 2 * m * v, fwd_at[28 * 3], bwd_at[28 * 3], slot_of[28 * 3];
    int max = pipeline_max_in_flight(PP_SCHEDULE_1F1B, p, s, m, v), owner[64], live = 0, peak = 0, bad = 0;
    for (int i = 0; i < m * v; i++) fwd_at[i] = bwd_at[i] = -1;
    for (int i = 0; i < 64; i++) owner[i] = -1;
    for (int i = 0; i < n; i++) {
        const struct pp_op *op = &ops[i];
        if (op->micro < 0 || op->micro >= m || op->chunk < 0 || op->chunk >= v ||
            op->slot < 0 || op->slot >= max) {
            bad++;
            continue;
        }
        int id = op->micro * v + op->chunk;
        if (op->kind == PP_FORWARD) {
            bad += fwd_at[id] != -1 || owner[op->slot] != -1;
            fwd_at[id] = i, slot_of[id] = op->slot, owner[op->slot] = id;
            live++;
            peak = MAX(peak, live);
        } else {
            bad += bwd_at[id] != -1 || fwd_at[id] == -1 || slot_of[id] != op->slot;
            bwd_at[id] = i, owner[op->slot] = -1;
            live--;
        }
    }
    for (int i = 0; i < m * v; i++) bad += fwd_at[i] < 0 || bwd_at[i] < fwd_at[i];
    // last: one backward per chunk, after every other backward of the chunk,
    // the chunks' in the order v - 1, ..., 0 (grad_sync relies on it).
    int next_last = v - 1, wrong_last = 0;
    for (int i = 0; i < n; i++) {
        if (!ops[i].last) continue;
        wrong_last += ops[i].kind != PP_BACKWARD || ops[i].chunk != next_last--;
        for (int j = i + 1; j < n; j++)
            wrong_last += ops[j].kind == PP_BACKWARD && ops[j].chunk == ops[i].chunk;
    }
    EXPECT(wrong_last == 0 && next_last == -1,
           "p=%d s=%d m=%d v=%d: backwards flagged last: %d wrong, %d chunks without one", p, s,
           m, v, wrong_last, next_last + 1);
    EXPECT(bad == 0,
           "p=%d s=%d m=%d v=%d: %d ops missing, repeated, out of order or on a busy slot", p, s,
           m, v, bad);
    EXPECT(peak == max && peak <= in_flight_bound(p, s, m, v),
           "p=%d s=%d m=%d v=%d: peak in flight %d, max_in_flight %d, bound %d", p, s, m, v, peak,
           max, in_flight_bound(p, s, m, v));
    if (v == 1) { // §2.2.1: warmup, steady 1F1B, cooldown
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

// All stages at once; an op takes one unit and starts when its stage is free
// and its input exists: the forward of virtual stage u - 1 (forward) or the
// backward of u + 1 (backward). Returns the makespan, or -1 on a deadlock.
static int simulate(int p, int m, int v, struct pp_op ops[][MAX_OPS]) {
    int V = p * v, n = 2 * m * v, idx[8] = {0}, clock[8] = {0}, makespan = 0;
    static int fin[2][24][28]; // [kind][virtual stage][micro]: finish time, -1 not yet
    memset(fin, 0xff, sizeof fin);
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < p; s++) {
            if (idx[s] == n) continue;
            const struct pp_op *op = &ops[s][idx[s]];
            int u = pipeline_virtual_stage(PP_SCHEDULE_1F1B, p, s, op->chunk), ready = 0;
            if (op->kind == PP_FORWARD && u > 0) ready = fin[PP_FORWARD][u - 1][op->micro];
            if (op->kind == PP_BACKWARD && u < V - 1) ready = fin[PP_BACKWARD][u + 1][op->micro];
            if (ready < 0) continue;
            clock[s] = MAX(clock[s], ready) + 1;
            fin[op->kind][u][op->micro] = clock[s];
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
    printf("  p  m  v  bubble  1F1B (p-1)/(m+p-1)  ideal (p-1)/(vm+p-1)\n");
    for (int p = 1; p <= 8; p++)
        for (int m = p; m <= 3 * p + 4; m++)
            for (int v = 1; v <= 3; v++) {
                if (v > 1 && (p == 1 || m % p)) continue;
                for (int s = 0; s < p; s++) {
                    EXPECT(pipeline_schedule(PP_SCHEDULE_1F1B, p, s, m, v, ops[s], &err) == STATUS_OK,
                           "p=%d s=%d m=%d v=%d refused: %s", p, s, m, v, err.msg);
                    check_stage(p, s, m, v, ops[s]);
                }
                configs++;
                int T = simulate(p, m, v, ops);
                EXPECT(T > 0, "p=%d m=%d v=%d: deadlock in the unit-time simulation", p, m, v);
                if (T <= 0) continue;
                double bubble = 1.0 - 2.0 * m * v / T;
                double f1 = (double)(p - 1) / (m + p - 1);
                double ideal = (double)(p - 1) / (v * m + p - 1);
                // A chunk op is 1/v of a stage's: the ideal makespan is
                // 2 m v units of work plus a bubble of 2 (p - 1) units (§2.2.2).
                EXPECT(T == 2 * (m * v + p - 1),
                       "p=%d m=%d v=%d: makespan %d, expected 2(vm+p-1) = %d", p, m, v, T,
                       2 * (m * v + p - 1));
                EXPECT(fabs(bubble - ideal) < 1e-12 && (p == 1 || v == 1 || bubble < f1),
                       "p=%d m=%d v=%d: bubble %.4f, expected %.4f (1F1B %.4f)", p, m, v, bubble,
                       ideal, f1);
                if (p >= 2 && (m == p || m == 2 * p) && (v == 1 || m % p == 0))
                    printf("  %d %2d  %d  %.4f  %.4f              %.4f\n", p, m, v, bubble, f1,
                           ideal);
            }
    printf("  %d (p, m, v) schedules checked\n", configs);
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

static void test_refused(void) {
    struct { int p, s, m, v; const char *says; } cases[] = {
        {0, 0, 4, 1, "0 stages"},
        {4, 4, 8, 1, "stage 4, expected 0..3"},
        {4, -1, 8, 1, "stage -1"},
        {4, 0, 8, 0, "virtual_stages=0"},
        {4, 0, 3, 1, "fewer microbatches than stages: m=3 microbatches for p=4"},
        {4, 1, 6, 2, "multiple of pp: m=6, p=4"},
        {1, 0, 4, 2, "virtual_stages=2 needs pp >= 2"},
    };
    struct pp_op ops[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct error err = {0};
        enum status st =
            pipeline_schedule(PP_SCHEDULE_1F1B, cases[i].p, cases[i].s, cases[i].m, cases[i].v, ops, &err);
        EXPECT(st == STATUS_BAD_INPUT && strstr(err.msg, cases[i].says),
               "p=%d s=%d m=%d v=%d: status %d, message '%s', expected '%s'", cases[i].p,
               cases[i].s, cases[i].m, cases[i].v, st, err.msg, cases[i].says);
        EXPECT(pipeline_max_in_flight(PP_SCHEDULE_1F1B, cases[i].p, cases[i].s, cases[i].m, cases[i].v) == 0,
               "max_in_flight of a refused schedule");
    }
    // A pp group of the wrong size.
    struct comm_group self;
    comm_self_init(&self);
    struct pipeline_exec x = {.p = 2, .s = 0, .m = 4, .v = 1, .group = &self, .count = 8,
                              .forward = toy_forward, .backward = toy_backward};
    struct error err = {0};
    EXPECT(pipeline_exec_init(&x, &err) == STATUS_BAD_INPUT && strstr(err.msg, "1 ranks") &&
               !x.state, "group of 1 for p=2: '%s'", err.msg);
}

// Default rings: one buffer at least exactly on the streams that carry
// messages (counted from the schedule), none on the others, never more than
// the stream's messages plus the spare; the buffer bytes are their sum.
static void test_rings(void) {
    static struct pp_op ops[MAX_OPS];
    printf("  default rings (act in, grad in, act out, grad out), stage 0 and p-1:\n");
    for (int p = 1; p <= 8; p++)
        for (int m = p; m <= 3 * p + 4; m++)
            for (int v = 1; v <= 3; v++) {
                if (v > 1 && (p == 1 || m % p)) continue;
                for (int s = 0; s < p; s++) {
                    pipeline_schedule(PP_SCHEDULE_1F1B, p, s, m, v, ops, NULL);
                    int msgs[PP_STREAM_COUNT] = {0}, ring[PP_STREAM_COUNT], sum = 0, bad = 0;
                    for (int i = 0; i < 2 * m * v; i++) {
                        int u = pipeline_virtual_stage(PP_SCHEDULE_1F1B, p, s, ops[i].chunk), V = p * v;
                        bool f = ops[i].kind == PP_FORWARD;
                        msgs[f ? PP_STREAM_ACT_IN : PP_STREAM_GRAD_IN] += f ? u > 0 : u < V - 1;
                        msgs[f ? PP_STREAM_ACT_OUT : PP_STREAM_GRAD_OUT] += f ? u < V - 1 : u > 0;
                    }
                    for (int k = 0; k < PP_STREAM_COUNT; k++) {
                        ring[k] = pipeline_ring_size(PP_SCHEDULE_1F1B, p, s, m, v, (enum pp_stream_kind)k);
                        bad += (ring[k] > 0) != (msgs[k] > 0) || ring[k] > msgs[k] + 1;
                        sum += ring[k];
                    }
                    EXPECT(bad == 0 && pipeline_buffer_bytes(PP_SCHEDULE_1F1B, p, s, m, v, 10, DTYPE_BF16) ==
                                           (size_t)sum * 20,
                           "p=%d s=%d m=%d v=%d: rings %d %d %d %d for %d %d %d %d messages", p, s,
                           m, v, ring[0], ring[1], ring[2], ring[3], msgs[0], msgs[1], msgs[2],
                           msgs[3]);
                    if (p >= 4 && m == 2 * p && (s == 0 || s == p - 1))
                        printf("    p=%d m=%2d v=%d s=%d: %d %d %d %d  max in flight %d\n", p, m, v,
                               s, ring[0], ring[1], ring[2], ring[3],
                               pipeline_max_in_flight(PP_SCHEDULE_1F1B, p, s, m, v));
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
    int done;
};

static void *mock_rank_main(void *arg) {
    struct mock_rank *r = arg;
    struct error err;
    CHECK(pipeline_exec_init(&r->x, &err) == STATUS_OK, "%s", err.msg);
    CHECK(pipeline_run(&r->x, &err) == STATUS_OK, "%s", err.msg);
    pipeline_exec_free(&r->x);
    pthread_mutex_lock(&r->net->mu);
    r->done = 1;
    r->net->alive[r->g.rank] = false;
    pthread_cond_broadcast(&r->net->cv);
    pthread_mutex_unlock(&r->net->mu);
    return NULL;
}

// Runs the toy model over p threads; returns 0, or the failed checks.
static int run_threads(int p, int m, int v, int ring) {
    struct mock_net net = {.p = p};
    pthread_mutex_init(&net.mu, NULL);
    pthread_cond_init(&net.cv, NULL);
    struct mock_rank ranks[8];
    pthread_t th[8];
    enum { N = 8 };
    for (int s = 0; s < p; s++) {
        struct mock_rank *r = &ranks[s];
        r->net = &net, r->done = 0, net.alive[s] = true;
        r->g = (struct comm_group){.rank = s, .size = p, .ops = &mock_ops, .impl = &net};
        toy_init(&r->toy, p, s, m, v, N, pipeline_max_in_flight(PP_SCHEDULE_1F1B, p, s, m, v));
        r->x = (struct pipeline_exec){.kind = PP_SCHEDULE_1F1B, .p = p, .s = s, .m = m, .v = v,
                                      .group = &r->g, .count = N, .dtype = DTYPE_FP32,
                                      .ctx = &r->toy, .forward = toy_forward,
                                      .backward = toy_backward, .ring = ring};
        r->toy.poll = m % 2 ? &r->x : NULL; // pipeline_poll inside the callbacks
    }
    for (int s = 0; s < p; s++) pthread_create(&th[s], NULL, mock_rank_main, &ranks[s]);
    int bad = 0;
    for (int s = 0; s < p; s++) {
        pthread_join(th[s], NULL);
        int b = ranks[s].done ? toy_finish(&ranks[s].toy) : 0;
        if (b) fprintf(stderr, "  p=%d m=%d v=%d ring=%d stage %d: %d wrong, first: %s\n", p, m, v,
                       ring, s, b, ranks[s].toy.first);
        bad += b;
        toy_free(&ranks[s].toy);
    }
    EXPECT(!net.deadlock, "p=%d m=%d v=%d ring=%d: deadlock (every live thread waits)", p, m, v,
           ring);
    pthread_cond_destroy(&net.cv);
    pthread_mutex_destroy(&net.mu);
    return bad + net.deadlock;
}

static void test_executor_threads(void) {
    int runs = 0, failed = 0;
    for (int p = 1; p <= 8; p++)
        for (int m = p; m <= 3 * p + 4; m++)
            for (int v = 1; v <= 3; v++) {
                if (v > 1 && (p == 1 || m % p)) continue;
                for (int ring = 0; ring <= 1; ring++, runs++)
                    failed += run_threads(p, m, v, ring) != 0;
            }
    EXPECT(failed == 0, "%d of %d threaded pipeline runs failed", failed, runs);
    printf("  %d threaded executor runs (rendezvous messages, ring 1 and default)\n", runs);
}

int main(void) {
    test_refused();
    test_literal_1f1b();
    test_schedules();
    test_rings();
    test_simulator();
    test_executor_threads();
    return test_finish("test_pipeline");
}

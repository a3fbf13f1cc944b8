// pipeline_toy.h: a toy model for the pipeline executor tests
// (tests/unit/test_pipeline.c on threads, tests/mpi/test_pipeline_mpi.c on
// MPI ranks). Virtual stage u maps a vector of n floats elementwise by
//   forward   h_{u+1} = a_u h_u + b_u        backward   dh_u = a_u dh_{u+1}
// with h_0 = x(micro) and dh_V = g(micro) (V = p v), so every message has a
// closed form: h_u = the first u maps applied to x, dh_u = g * prod_{w>=u} a_w.
// a_u alternates 2 and 0.5 (sign flips on u % 3 == 1) and x, g, b are
// multiples of 1/16, so every value is exact in fp32 and compared with ==.
// Each callback also checks that its inputs are NULL exactly on the first /
// last virtual stage, that every (micro, chunk) runs forward once, then
// backward once, and that its activation slot still holds the input the
// forward saved (a slot shared by two ops in flight shows up here); a
// backward flagged last must be its chunk's last one, chunk v - 1 first and
// chunk 0 last, and every chunk gets exactly one.
// Weights: the gradients of a_u and b_u, per element i,
//   da_u[i] = sum_micro dh_{u+1}[i] h_u[i]      db_u[i] = sum_micro dh_{u+1}[i]
// accumulated in the order the ops run. Split schedules (two pools): B
// computes dh_u, copies h_u and dh_{u+1} into its W stash (wslot) and frees
// (poisons) the activation slot; W (toy_weight) accumulates from the stash
// alone, frees (poisons) it, and carries the last flag. The peaks of slots
// and stashes taken are recorded (toy.peak, toy.wpeak). toy_grad_expected
// gives the sums in microbatch order from the closed forms.
#ifndef TRIDENT_PIPELINE_TOY_H
#define TRIDENT_PIPELINE_TOY_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "parallel/pipeline.h"

struct toy {
    enum pp_schedule kind;
    int p, s, m, v, n, slots, wslots;
    float *saved;             // (slots, n) the input each in-flight forward saved
    int *owner;               // (slots,) micro * v + chunk, or -1 when free
    float *wsaved;            // (wslots, 2 n) split: the input and output gradient B
                              // stashed for W
    int *wowner;              // (wslots,) micro * v + chunk, or -1 when free
    int live, peak, wlive, wpeak; // slots (F to B) and stashes (B to W) taken: now, peak
    int *fwd, *bwd, *wgt;     // (m * v,) times each op ran (bwd: B or the whole backward)
    float *da, *db;           // (v, n) weight gradients of each chunk's a and b
    int next_last;            // the chunk whose last backward comes next (v - 1 down to 0)
    float *dx;                // (m, n) gradient of virtual stage 0's input
    float *y;                 // (m, n) output of the last virtual stage
    const struct pipeline_exec *poll; // when set, each callback calls pipeline_poll
    double op_s;              // seconds each F, B and W sleeps (a whole backward twice that)
    long progress_calls;      // toy_progress calls (the executor's waits)
    int bad;                  // failed checks
    char first[256];          // the first of them
};

static double toy_a(int u) { return (u % 2 == 0 ? 2.0 : 0.5) * (u % 3 == 1 ? -1.0 : 1.0); }
static double toy_b(int u) { return (double)(u % 5 - 2) + 0.0625 * (u % 4); }
static double toy_x(int micro, int i) { return (double)(micro % 7) - 3.0 + 0.125 * (i % 13); }
static double toy_g(int micro, int i) { return 1.0 + (micro % 5) - 0.0625 * (i % 9); }

// The input of virtual stage u (u == V: the model's output), by applying
// the maps one after the other: the reference, independent of the pipeline.
static double toy_h(int u, int micro, int i) {
    double h = toy_x(micro, i);
    for (int w = 0; w < u; w++) h = toy_a(w) * h + toy_b(w);
    return h;
}

// The gradient of the loss sum(g * h_V) with respect to h_u.
static double toy_dh(int u, int V, int micro, int i) {
    double d = toy_g(micro, i);
    for (int w = u; w < V; w++) d *= toy_a(w);
    return d;
}

#define TOY_EXPECT(t, cond, ...)                                               \
    do {                                                                       \
        if (!(cond)) {                                                         \
            if (!(t)->bad++) snprintf((t)->first, sizeof (t)->first, __VA_ARGS__); \
        }                                                                      \
    } while (0)

// The weight gradients of virtual stage u summed over the microbatches in
// order 0 .. m - 1 in fp32 from the closed forms: da (n,), db (n,).
static void toy_grad_expected(int u, int V, int m, int n, float *da, float *db) {
    for (int i = 0; i < n; i++) {
        da[i] = db[i] = 0;
        for (int micro = 0; micro < m; micro++) {
            float d = (float)toy_dh(u + 1, V, micro, i);
            da[i] += d * (float)toy_h(u, micro, i);
            db[i] += d;
        }
    }
}

// slots activation slots, wslots W stashes (split schedules; 0 otherwise).
static void toy_init(struct toy *t, enum pp_schedule kind, int p, int s, int m, int v, int n,
                     int slots, int wslots) {
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->p = p, t->s = s, t->m = m, t->v = v, t->n = n, t->slots = slots, t->wslots = wslots;
    t->next_last = v - 1;
    t->saved = xcalloc((size_t)slots * n, sizeof(float));
    t->owner = xmalloc(sizeof(int) * slots);
    for (int k = 0; k < slots; k++) t->owner[k] = -1;
    t->wsaved = xcalloc((size_t)MAX(1, wslots) * 2 * n, sizeof(float));
    t->wowner = xmalloc(sizeof(int) * MAX(1, wslots));
    for (int k = 0; k < wslots; k++) t->wowner[k] = -1;
    t->fwd = xcalloc((size_t)m * v, sizeof(int));
    t->bwd = xcalloc((size_t)m * v, sizeof(int));
    t->wgt = xcalloc((size_t)m * v, sizeof(int));
    t->da = xcalloc((size_t)v * n, sizeof(float));
    t->db = xcalloc((size_t)v * n, sizeof(float));
    t->dx = xcalloc((size_t)m * n, sizeof(float));
    t->y = xcalloc((size_t)m * n, sizeof(float));
}

static void toy_free(struct toy *t) {
    free(t->saved), free(t->owner), free(t->wsaved), free(t->wowner), free(t->fwd), free(t->bwd), free(t->wgt), free(t->da);
    free(t->db), free(t->dx), free(t->y);
}

static void toy_forward(void *ctx, int micro, int chunk, int slot, const void *in_, void *out_) {
    struct toy *t = ctx;
    const float *in = in_;
    float *out = out_;
    int u = pipeline_virtual_stage(t->kind, t->p, t->s, chunk), V = t->p * t->v;
    int id = micro * t->v + chunk;
    if (t->poll) pipeline_poll(t->poll);
    if (t->op_s) sleep_s(t->op_s);
    TOY_EXPECT(t, (in == NULL) == (u == 0), "F(%d,%d): in %s on virtual stage %d", micro, chunk,
               in ? "given" : "NULL", u);
    TOY_EXPECT(t, (out == NULL) == (u == V - 1), "F(%d,%d): out %s on virtual stage %d of %d",
               micro, chunk, out ? "given" : "NULL", u, V);
    TOY_EXPECT(t, t->fwd[id]++ == 0 && t->bwd[id] == 0, "F(%d,%d) ran twice or after B", micro,
               chunk);
    TOY_EXPECT(t, slot >= 0 && slot < t->slots && t->owner[slot] == -1,
               "F(%d,%d): slot %d of %d is taken by %d", micro, chunk, slot, t->slots,
               slot >= 0 && slot < t->slots ? t->owner[slot] : -2);
    if (slot < 0 || slot >= t->slots) return;
    t->owner[slot] = id;
    t->live++;
    t->peak = MAX(t->peak, t->live);
    float *save = t->saved + (size_t)slot * t->n, *y = out ? out : t->y + (size_t)micro * t->n;
    int wrong = 0;
    for (int i = 0; i < t->n; i++) {
        double h = toy_h(u, micro, i);
        if (in) wrong += in[i] != (float)h;
        save[i] = in ? in[i] : (float)h;
        y[i] = (float)(toy_a(u) * save[i] + toy_b(u));
    }
    TOY_EXPECT(t, wrong == 0, "F(%d,%d): %d input elements differ from the closed form", micro,
               chunk, wrong);
}

// The last flag of the op that frees (micro, chunk)'s slot: its chunk's last
// one, chunk v - 1 first.
static void toy_check_last(struct toy *t, int micro, int chunk, const int *done) {
    int left = 0;
    for (int k = 0; k < t->m; k++) left += done[k * t->v + chunk] != 1;
    TOY_EXPECT(t, left == 0 && chunk == t->next_last,
               "(%d,%d) flagged last with %d of the chunk's ops to come, chunk %d's last "
               "expected next", micro, chunk, left, t->next_last);
    t->next_last--;
}

// W, or the weight half of a whole backward: accumulates the gradients of
// a_u and b_u from the input h (n,) and dh (n,).
static void toy_accumulate(struct toy *t, int chunk, const float *h, const float *dh) {
    for (int i = 0; i < t->n; i++) {
        t->da[(size_t)chunk * t->n + i] += dh[i] * h[i];
        t->db[(size_t)chunk * t->n + i] += dh[i];
    }
}

// wslot -1: the whole backward; else B, which fills W stash wslot. Either
// frees the activation slot.
static void toy_backward(void *ctx, int micro, int chunk, int slot, int wslot, bool last,
                         const void *dout_, void *din_) {
    struct toy *t = ctx;
    const float *dout = dout_;
    float *din = din_;
    int u = pipeline_virtual_stage(t->kind, t->p, t->s, chunk), V = t->p * t->v;
    int id = micro * t->v + chunk;
    if (t->poll) pipeline_poll(t->poll);
    bool split = wslot >= 0;
    if (t->op_s) sleep_s(split ? t->op_s : 2 * t->op_s);
    TOY_EXPECT(t, split == pipeline_schedule_splits(t->kind), "B(%d,%d): wslot %d under %s",
               micro, chunk, wslot, pipeline_schedule_name(t->kind));
    TOY_EXPECT(t, !split || (wslot < t->wslots && t->wowner[wslot] == -1),
               "B(%d,%d): W stash %d of %d is taken by %d", micro, chunk, wslot, t->wslots,
               split && wslot < t->wslots ? t->wowner[wslot] : -2);
    if (split && wslot >= t->wslots) return;
    TOY_EXPECT(t, (dout == NULL) == (u == V - 1), "B(%d,%d): dout %s on virtual stage %d of %d",
               micro, chunk, dout ? "given" : "NULL", u, V);
    TOY_EXPECT(t, (din == NULL) == (u == 0), "B(%d,%d): din %s on virtual stage %d", micro, chunk,
               din ? "given" : "NULL", u);
    TOY_EXPECT(t, t->fwd[id] == 1 && t->bwd[id]++ == 0, "B(%d,%d) before F or twice", micro,
               chunk);
    TOY_EXPECT(t, slot >= 0 && slot < t->slots && t->owner[slot] == id,
               "B(%d,%d): slot %d not the one its forward filled", micro, chunk, slot);
    TOY_EXPECT(t, !(split && last), "B(%d,%d) of a split schedule flagged last", micro, chunk);
    if (last) toy_check_last(t, micro, chunk, t->bwd);
    if (slot < 0 || slot >= t->slots) return;
    float *save = t->saved + (size_t)slot * t->n, h[t->n], keep[t->n];
    float *dh = din ? din : t->dx + (size_t)micro * t->n;
    int wrong_saved = 0, wrong_dout = 0, wrong_y = 0;
    for (int i = 0; i < t->n; i++) {
        wrong_saved += save[i] != (float)toy_h(u, micro, i);
        double d = toy_g(micro, i);
        if (dout) wrong_dout += dout[i] != (float)toy_dh(u + 1, V, micro, i), d = dout[i];
        if (u == V - 1) wrong_y += t->y[(size_t)micro * t->n + i] != (float)toy_h(V, micro, i);
        dh[i] = (float)(toy_a(u) * d);
        keep[i] = (float)d; // dh_{u+1}, for the weight gradients
        h[i] = save[i];
        save[i] = NAN; // the slot is free: a later reader sees the poison
    }
    t->owner[slot] = -1, t->live--;
    TOY_EXPECT(t, wrong_saved + wrong_dout + wrong_y == 0,
               "B(%d,%d) on virtual stage %d: %d saved, %d dout, %d output elements wrong", micro,
               chunk, u, wrong_saved, wrong_dout, wrong_y);
    if (u == 0) {
        int wrong = 0;
        for (int i = 0; i < t->n; i++) wrong += dh[i] != (float)toy_dh(0, V, micro, i);
        TOY_EXPECT(t, wrong == 0, "B(%d,0): %d elements of dx differ from g * prod a", micro,
                   wrong);
    }
    if (!split) {
        toy_accumulate(t, chunk, h, keep);
        return;
    }
    float *stash = t->wsaved + (size_t)wslot * 2 * t->n;
    memcpy(stash, h, sizeof h);
    memcpy(stash + t->n, keep, sizeof keep);
    t->wowner[wslot] = id;
    t->wlive++;
    t->wpeak = MAX(t->wpeak, t->wlive);
}

// W (pipeline_exec.weight): after its B, from the W stash the B filled.
static void toy_weight(void *ctx, int micro, int chunk, int wslot, bool last) {
    struct toy *t = ctx;
    int u = pipeline_virtual_stage(t->kind, t->p, t->s, chunk), id = micro * t->v + chunk;
    if (t->poll) pipeline_poll(t->poll);
    if (t->op_s) sleep_s(t->op_s);
    TOY_EXPECT(t, pipeline_schedule_splits(t->kind), "W(%d,%d) under %s", micro, chunk,
               pipeline_schedule_name(t->kind));
    TOY_EXPECT(t, t->bwd[id] == 1 && t->wgt[id]++ == 0, "W(%d,%d) before B or twice", micro,
               chunk);
    TOY_EXPECT(t, wslot >= 0 && wslot < t->wslots && t->wowner[wslot] == id,
               "W(%d,%d): W stash %d not the one its B filled", micro, chunk, wslot);
    if (last) toy_check_last(t, micro, chunk, t->wgt);
    if (wslot < 0 || wslot >= t->wslots) return;
    float *stash = t->wsaved + (size_t)wslot * 2 * t->n;
    int wrong = 0;
    for (int i = 0; i < t->n; i++)
        wrong += stash[i] != (float)toy_h(u, micro, i) ||
                 stash[t->n + i] != (float)toy_dh(u + 1, t->p * t->v, micro, i);
    TOY_EXPECT(t, wrong == 0, "W(%d,%d): %d elements of the W stash changed since B", micro,
               chunk, wrong);
    toy_accumulate(t, chunk, stash, stash + t->n);
    for (int i = 0; i < 2 * t->n; i++) stash[i] = NAN; // free: a later reader sees the poison
    t->wowner[wslot] = -1, t->wlive--;
}

// The executor's progress callback (pipeline_exec.progress): counts its calls
// (inline: the threaded test does not use it, its deadlock check needs waits).
static inline void toy_progress(void *ctx) { ((struct toy *)ctx)->progress_calls++; }

// After a run: every op ran exactly once. Returns the failed checks.
static int toy_finish(struct toy *t) {
    for (int id = 0; id < t->m * t->v; id++)
        TOY_EXPECT(t, t->fwd[id] == 1 && t->bwd[id] == 1 &&
                          t->wgt[id] == pipeline_schedule_splits(t->kind),
                   "(micro %d, chunk %d) ran F %d, B %d, W %d times", id / t->v, id % t->v,
                   t->fwd[id], t->bwd[id], t->wgt[id]);
    float *da = xmalloc(sizeof(float) * 2 * t->n), *db = da + t->n;
    for (int c = 0; c < t->v; c++) {
        int u = pipeline_virtual_stage(t->kind, t->p, t->s, c), wrong = 0;
        toy_grad_expected(u, t->p * t->v, t->m, t->n, da, db);
        for (int i = 0; i < t->n; i++)
            wrong += t->da[(size_t)c * t->n + i] != da[i] || t->db[(size_t)c * t->n + i] != db[i];
        TOY_EXPECT(t, wrong == 0, "chunk %d (virtual stage %d): %d weight-gradient elements "
                   "differ from the sums in microbatch order", c, u, wrong);
    }
    free(da);
    TOY_EXPECT(t, t->next_last == -1, "%d chunks had no backward flagged last", t->next_last + 1);
    TOY_EXPECT(t, t->peak == t->slots && t->wpeak == t->wslots,
               "peaks of %d slots and %d W stashes taken, expected %d and %d", t->peak, t->wpeak,
               t->slots, t->wslots);
    return t->bad;
}

#endif

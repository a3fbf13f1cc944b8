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
#ifndef TRIDENT_PIPELINE_TOY_H
#define TRIDENT_PIPELINE_TOY_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "parallel/pipeline.h"

struct toy {
    int p, s, m, v, n, slots;
    float *saved;             // (slots, n) the input each in-flight forward saved
    int *owner;               // (slots,) micro * v + chunk, or -1 when free
    int *fwd, *bwd;           // (m * v,) times each op ran
    int next_last;            // the chunk whose last backward comes next (v - 1 down to 0)
    float *dx;                // (m, n) gradient of virtual stage 0's input
    float *y;                 // (m, n) output of the last virtual stage
    const struct pipeline_exec *poll; // when set, each callback calls pipeline_poll
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

static void toy_init(struct toy *t, int p, int s, int m, int v, int n, int slots) {
    memset(t, 0, sizeof *t);
    t->p = p, t->s = s, t->m = m, t->v = v, t->n = n, t->slots = slots;
    t->next_last = v - 1;
    t->saved = xcalloc((size_t)slots * n, sizeof(float));
    t->owner = xmalloc(sizeof(int) * slots);
    for (int k = 0; k < slots; k++) t->owner[k] = -1;
    t->fwd = xcalloc((size_t)m * v, sizeof(int));
    t->bwd = xcalloc((size_t)m * v, sizeof(int));
    t->dx = xcalloc((size_t)m * n, sizeof(float));
    t->y = xcalloc((size_t)m * n, sizeof(float));
}

static void toy_free(struct toy *t) {
    free(t->saved), free(t->owner), free(t->fwd), free(t->bwd), free(t->dx), free(t->y);
}

static void toy_forward(void *ctx, int micro, int chunk, int slot, const void *in_, void *out_) {
    struct toy *t = ctx;
    const float *in = in_;
    float *out = out_;
    int u = chunk * t->p + t->s, V = t->p * t->v, id = micro * t->v + chunk;
    if (t->poll) pipeline_poll(t->poll);
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

static void toy_backward(void *ctx, int micro, int chunk, int slot, bool last, bool split,
                         const void *dout_, void *din_) {
    struct toy *t = ctx;
    (void)split; // TODO(issue 30): the toy has no weights to defer
    const float *dout = dout_;
    float *din = din_;
    int u = chunk * t->p + t->s, V = t->p * t->v, id = micro * t->v + chunk;
    if (t->poll) pipeline_poll(t->poll);
    TOY_EXPECT(t, (dout == NULL) == (u == V - 1), "B(%d,%d): dout %s on virtual stage %d of %d",
               micro, chunk, dout ? "given" : "NULL", u, V);
    TOY_EXPECT(t, (din == NULL) == (u == 0), "B(%d,%d): din %s on virtual stage %d", micro, chunk,
               din ? "given" : "NULL", u);
    TOY_EXPECT(t, t->fwd[id] == 1 && t->bwd[id]++ == 0, "B(%d,%d) before F or twice", micro,
               chunk);
    TOY_EXPECT(t, slot >= 0 && slot < t->slots && t->owner[slot] == id,
               "B(%d,%d): slot %d not the one its forward filled", micro, chunk, slot);
    if (last) {
        int left = 0;
        for (int k = 0; k < t->m; k++) left += t->bwd[k * t->v + chunk] != 1;
        TOY_EXPECT(t, left == 0 && chunk == t->next_last,
                   "B(%d,%d) flagged last with %d backwards of the chunk to come, chunk %d's "
                   "last expected next", micro, chunk, left, t->next_last);
        t->next_last--;
    }
    if (slot < 0 || slot >= t->slots) return;
    t->owner[slot] = -1;
    float *save = t->saved + (size_t)slot * t->n;
    float *dh = din ? din : t->dx + (size_t)micro * t->n;
    int wrong_saved = 0, wrong_dout = 0, wrong_y = 0;
    for (int i = 0; i < t->n; i++) {
        wrong_saved += save[i] != (float)toy_h(u, micro, i);
        double d = toy_g(micro, i);
        if (dout) wrong_dout += dout[i] != (float)toy_dh(u + 1, V, micro, i), d = dout[i];
        if (u == V - 1) wrong_y += t->y[(size_t)micro * t->n + i] != (float)toy_h(V, micro, i);
        dh[i] = (float)(toy_a(u) * d);
        save[i] = NAN; // a later reader of this slot sees the poison
    }
    TOY_EXPECT(t, wrong_saved + wrong_dout + wrong_y == 0,
               "B(%d,%d) on virtual stage %d: %d saved, %d dout, %d output elements wrong", micro,
               chunk, u, wrong_saved, wrong_dout, wrong_y);
    if (u == 0) {
        int wrong = 0;
        for (int i = 0; i < t->n; i++) wrong += dh[i] != (float)toy_dh(0, V, micro, i);
        TOY_EXPECT(t, wrong == 0, "B(%d,0): %d elements of dx differ from g * prod a", micro,
                   wrong);
    }
}

// The executor's progress callback (pipeline_exec.progress): counts its calls
// (inline: the threaded test does not use it, its deadlock check needs waits).
static inline void toy_progress(void *ctx) { ((struct toy *)ctx)->progress_calls++; }

// After a run: every op ran exactly once. Returns the failed checks.
static int toy_finish(struct toy *t) {
    for (int id = 0; id < t->m * t->v; id++)
        TOY_EXPECT(t, t->fwd[id] == 1 && t->bwd[id] == 1,
                   "(micro %d, chunk %d) ran F %d, B %d times", id / t->v, id % t->v, t->fwd[id],
                   t->bwd[id]);
    TOY_EXPECT(t, t->next_last == -1, "%d chunks had no backward flagged last", t->next_last + 1);
    return t->bad;
}

#endif

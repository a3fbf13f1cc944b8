// pipeline.c: the 1F1B and interleaved 1F1B schedules (Narayanan et al. 2021,
// §2.2.1 and §2.2.2; op order of Megatron-LM's schedules.py) and the executor
// that runs a stage's schedule over the pp group with non-blocking messages.
#include "pipeline.h"

#include <stdbool.h>
#include <string.h>

// MPI guarantees tags up to 32767 (MPI_TAG_UB); tags wrap below that. Two
// messages share a tag only when m v > 16384, and then they are thousands of
// ops apart, never in flight together.
enum { PIPELINE_TAG_SPAN = 32768 };

const char *pipeline_schedule_name(enum pp_schedule kind) {
    static const char *const names[PP_SCHEDULE_COUNT] = {"1f1b", "interleaved", "zb-h1", "zbv"};
    return (unsigned)kind < PP_SCHEDULE_COUNT ? names[kind] : "?";
}

bool pipeline_schedule_splits(enum pp_schedule kind) {
    return kind == PP_SCHEDULE_ZB_H1 || kind == PP_SCHEDULE_ZBV;
}

static enum status check_args(int p, int s, int m, int v, struct error *err) {
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

// Forwards before the first backward on stage s (the warmup). 1F1B: the
// backward of microbatch 0 reaches stage s after the forwards of p - s - 1
// more microbatches. Interleaved (Megatron's num_warmup_microbatches): the
// first backward on the last virtual stage needs p v - 1 forwards upstream;
// stage s runs 2 (p - s - 1) + (v - 1) p of them first.
static int warmup_count(int p, int s, int m, int v) {
    if (v == 1) return MIN(p - s - 1, m);
    return MIN(2 * (p - s - 1) + (v - 1) * p, m * v);
}

int pipeline_max_in_flight(enum pp_schedule kind, int p, int s, int m, int v) {
    if (pipeline_schedule_splits(kind)) return 0; // TODO(issue 30)
    if (check_args(p, s, m, v, NULL) != STATUS_OK) return 0;
    int w = warmup_count(p, s, m, v);
    return w < m * v ? w + 1 : m * v;
}

int pipeline_virtual_stage(enum pp_schedule kind, int p, int s, int chunk) {
    if (kind == PP_SCHEDULE_ZBV) return chunk == 0 ? s : 2 * p - 1 - s;
    return chunk * p + s;
}

int pipeline_op_count(enum pp_schedule kind, int p, int s, int m, int v) {
    if (check_args(p, s, m, v, NULL) != STATUS_OK) return 0;
    return (pipeline_schedule_splits(kind) ? 3 : 2) * m * v;
}

// The k-th forward (or backward) of a stage in Megatron's order
// (get_model_chunk_id, get_microbatch_id_in_model_chunk): microbatches go
// through the chunks in groups of p, forwards chunk 0 first, backwards the
// last chunk first. v == 1: micro = k, chunk = 0.
static struct pp_op op_of(enum pp_op_kind kind, int k, int p, int v) {
    int in_group = k % (p * v), chunk = in_group / p;
    struct pp_op op = {kind, (k / (p * v)) * p + k % p, chunk, -1, false};
    if (kind == PP_BACKWARD) op.chunk = v - 1 - chunk;
    return op;
}

enum status pipeline_schedule(enum pp_schedule kind, int p, int s, int m, int v, struct pp_op *ops,
                              struct error *err) {
    if (pipeline_schedule_splits(kind))
        return error_set(err, STATUS_BAD_INPUT, "pipeline: %s not built yet", pipeline_schedule_name(kind));
    enum status st = check_args(p, s, m, v, err);
    if (st != STATUS_OK) return st;
    int total = m * v, w = warmup_count(p, s, m, v), n = 0, nf = 0, nb = 0;
    // Warmup forwards, then (forward, backward) pairs, then the cooldown.
    for (; nf < w; nf++) ops[n++] = op_of(PP_FORWARD, nf, p, v);
    while (nf < total) {
        ops[n++] = op_of(PP_FORWARD, nf++, p, v);
        ops[n++] = op_of(PP_BACKWARD, nb++, p, v);
    }
    while (nb < total) ops[n++] = op_of(PP_BACKWARD, nb++, p, v);
    CHECK(n == 2 * total, "schedule of %d ops, expected %d", n, 2 * total);
    // A chunk's backwards run its microbatches in increasing order (op_of),
    // so its last one is that of microbatch m - 1.
    for (int i = 0; i < n; i++) ops[i].last = ops[i].kind == PP_BACKWARD && ops[i].micro == m - 1;

    // Slots: lowest free first. owner[slot] = micro * v + chunk, or -1.
    int slots = pipeline_max_in_flight(kind, p, s, m, v), *owner = xmalloc(sizeof(int) * slots);
    for (int i = 0; i < slots; i++) owner[i] = -1;
    for (int i = 0; i < n; i++) {
        int id = ops[i].micro * v + ops[i].chunk, want = ops[i].kind == PP_FORWARD ? -1 : id;
        int slot = 0;
        while (slot < slots && owner[slot] != want) slot++;
        CHECK(slot < slots, "stage %d op %d: no slot among %d (p=%d m=%d v=%d)", s, i, slots, p,
              m, v);
        owner[slot] = ops[i].kind == PP_FORWARD ? id : -1;
        ops[i].slot = slot;
    }
    free(owner);
    return STATUS_OK;
}

// ---- executor -----------------------------------------------------------------
//
// Four message streams per stage: activations in (from the previous virtual
// stage) and out (to the next), gradients in (from the next) and out (to the
// previous). The messages of a stream are numbered in the order this stage's
// schedule consumes or produces them; message i uses ring buffer i % ring.
//
// Receives: the first ring receives of each stream are posted at the start;
// receive i + ring is posted as soon as the op consuming message i returns.
// Sends: started (isend) as soon as the op producing them returns; before an
// op writes ring buffer i % ring, it waits for send i - ring.
//
// Why this does not deadlock. A rank blocks only (a) on receive i, which
// completes once the peer has run the op producing message i, or (b) on its
// own send i - ring before reusing that buffer, which completes once the peer
// has posted receive i - ring, i.e. consumed message i - ring - ring' (ring'
// its own ring of the stream). (a) is the
// schedule's own data dependency, acyclic: the unit-time simulation in
// tests/unit/test_pipeline.c runs every stage to the end. (b) adds an edge
// from the peer's consumption of an earlier message to our production of a
// later one; in the 1F1B orders that consumption never waits on a later
// output of ours. Each rank's progress is monotone in the others' (requests
// only ever get posted), so whether a run ends does not depend on timing, and
// a larger ring only posts receives earlier. tests/unit/test_pipeline.c runs
// this executor on threads whose sends complete only on a matching receive
// (rendezvous, the worst case of MPI) with ring = 1 for every p <= 8,
// m <= 3p + 4, v <= 3, and detects a deadlock when every live thread waits.
//
// Progress: MPI moves a large message only inside MPI calls, and the
// executor makes them between ops; a model calls pipeline_poll between
// layers so that its transfers overlap its compute. While the executor
// waits for a message it calls x->progress between tests of that message,
// so that the caller's other requests (the data-parallel buckets that the
// chunks' last backwards start) progress too instead of waiting for the
// flush.

struct pp_stream {
    int peer;                 // group rank at the other end
    int n;                    // messages in one run
    int ring;                 // buffers; message i uses buffer i % ring
    int *tag;                 // (n,) receive streams: the tag of message i
    char *buf;                // (ring, bytes)
    struct comm_request *req; // (ring,)
    int done;                 // messages consumed (in) or produced (out) so far
};

struct pipeline_state {
    struct pp_op *ops; // (2 m v,)
    int n_ops;
    size_t bytes; // one message
    struct pp_stream streams[PP_STREAM_COUNT];
};

static bool first_virtual(const struct pipeline_exec *x, int chunk) {
    return x->s == 0 && chunk == 0;
}

static bool last_virtual(const struct pipeline_exec *x, int chunk) {
    return x->s == x->p - 1 && chunk == x->v - 1;
}

// A message is tagged by the op that consumes it: (micro, chunk) on the
// receiving stage and whether it is an activation (0) or a gradient (1).
static int message_tag(int micro, int chunk, int v, int gradient) {
    return (int)((((int64_t)micro * v + chunk) * 2 + gradient) % PIPELINE_TAG_SPAN);
}

// The stream an op reads from (in) or writes to (out), or -1 when it has none.
static int stream_in(const struct pipeline_exec *x, const struct pp_op *op) {
    if (op->kind == PP_FORWARD) return first_virtual(x, op->chunk) ? -1 : PP_STREAM_ACT_IN;
    return last_virtual(x, op->chunk) ? -1 : PP_STREAM_GRAD_IN;
}

static int stream_out(const struct pipeline_exec *x, const struct pp_op *op) {
    if (op->kind == PP_FORWARD) return last_virtual(x, op->chunk) ? -1 : PP_STREAM_ACT_OUT;
    return first_virtual(x, op->chunk) ? -1 : PP_STREAM_GRAD_OUT;
}

// Runs every stage's schedule with forward ops of tf and backward ops of tb
// time units, each op starting once its stage is free and its input exists,
// and fills fin[(kind * V + u) * m + micro] with the finish times.
static void simulate(int p, int m, int v, int tf, int tb, const struct pp_op *ops, int *fin) {
    int V = p * v, n = 2 * m * v, *idx = xcalloc((size_t)p, sizeof(int));
    int *clock = xcalloc((size_t)p, sizeof(int));
    for (int i = 0; i < 2 * V * m; i++) fin[i] = -1;
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < p; s++) {
            if (idx[s] == n) continue;
            const struct pp_op *op = &ops[(size_t)s * n + idx[s]];
            int u = pipeline_virtual_stage(PP_SCHEDULE_1F1B, p, s, op->chunk), ready = 0;
            if (op->kind == PP_FORWARD && u > 0) ready = fin[(0 * V + u - 1) * m + op->micro];
            if (op->kind == PP_BACKWARD && u < V - 1) ready = fin[(1 * V + u + 1) * m + op->micro];
            if (ready < 0) continue;
            clock[s] = MAX(clock[s], ready) + (op->kind == PP_FORWARD ? tf : tb);
            fin[(op->kind * V + u) * m + op->micro] = clock[s];
            idx[s]++, progress = true;
        }
    }
    for (int s = 0; s < p; s++) CHECK(idx[s] == n, "pipeline: stage %d stuck in simulation", s);
    free(idx);
    free(clock);
}

// The peak number of messages from stage a to its neighbour (activations to
// a + 1, or gradients to a - 1) that were produced and whose consuming op has
// not yet finished, in the simulated run: a message occupies a buffer on
// both ends over [producer's finish, consumer's finish).
static int stream_peak(int p, int m, int v, const int *fin, int a, int gradient) {
    int V = p * v, T = 0, peak = 0, live = 0;
    for (int i = 0; i < 2 * V * m; i++) T = MAX(T, fin[i]);
    int *diff = xcalloc((size_t)T + 2, sizeof(int));
    for (int c = 0; c < v; c++) {
        int u = c * p + a, to = gradient ? u - 1 : u + 1;
        if (to < 0 || to >= V) continue;
        for (int micro = 0; micro < m; micro++) {
            diff[fin[(gradient * V + u) * m + micro]]++;
            diff[fin[(gradient * V + to) * m + micro]]--;
        }
    }
    for (int t = 0; t <= T; t++) {
        live += diff[t];
        peak = MAX(peak, live);
    }
    free(diff);
    return peak;
}

// Default rings: each stream's peak of messages in flight (0 when it has
// none) over two timings (tb = tf, and tb = 2 tf as for a transformer
// layer), so that in those runs no op waits for a buffer, plus one spare for
// ops that run late. Any ring >= 1 is deadlock-free (see above); a smaller
// one only adds waits.
static void ring_sizes(enum pp_schedule kind, int p, int s, int m, int v, int rings[PP_STREAM_COUNT]) {
    int n = 2 * m * v, V = p * v;
    struct pp_op *ops = xmalloc(sizeof(struct pp_op) * (size_t)p * n);
    int *fin = xmalloc(sizeof(int) * 2 * (size_t)V * m);
    for (int a = 0; a < p; a++)
        CHECK(pipeline_schedule(kind, p, a, m, v, ops + (size_t)a * n, NULL) == STATUS_OK,
              "schedule refused after its arguments were checked");
    for (int k = 0; k < PP_STREAM_COUNT; k++) rings[k] = 0;
    for (int tb = 1; tb <= 2; tb++) {
        simulate(p, m, v, 1, tb, ops, fin);
        // (stage sending the stream, gradient?) for each stream of stage s
        int from[4][2] = {{(s + p - 1) % p, 0}, {(s + 1) % p, 1}, {s, 0}, {s, 1}};
        for (int k = 0; k < 4; k++)
            rings[k] = MAX(rings[k], stream_peak(p, m, v, fin, from[k][0], from[k][1]));
    }
    for (int k = 0; k < PP_STREAM_COUNT; k++) rings[k] += rings[k] > 0; // one spare
    free(ops);
    free(fin);
}

int pipeline_ring_size(enum pp_schedule kind, int p, int s, int m, int v,
                       enum pp_stream_kind stream) {
    int rings[PP_STREAM_COUNT];
    if (check_args(p, s, m, v, NULL) != STATUS_OK || (unsigned)stream >= PP_STREAM_COUNT) return 0;
    ring_sizes(kind, p, s, m, v, rings);
    return rings[stream];
}

size_t pipeline_buffer_bytes(enum pp_schedule kind, int p, int s, int m, int v, size_t count,
                             enum dtype dtype) {
    size_t total = 0;
    for (int k = 0; k < PP_STREAM_COUNT; k++)
        total += (size_t)pipeline_ring_size(kind, p, s, m, v, (enum pp_stream_kind)k);
    return total * count * dtype_size(dtype);
}

enum status pipeline_exec_init(struct pipeline_exec *x, struct error *err) {
    x->state = NULL;
    enum status st = check_args(x->p, x->s, x->m, x->v, err);
    if (st != STATUS_OK) return st;
    if (!x->group || x->group->size != x->p || x->group->rank != x->s)
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline: the pp group has %d ranks and this rank is %d, expected p=%d "
                         "ranks and stage s=%d", x->group ? x->group->size : 0,
                         x->group ? x->group->rank : -1, x->p, x->s);
    if (x->count == 0 || !x->forward || !x->backward || x->ring < 0)
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline: message of %zu elements, ring %d, callbacks %s: expected a "
                         "non-empty message, ring >= 0 and both callbacks", x->count, x->ring,
                         x->forward && x->backward ? "set" : "missing");
    if (x->kind != PP_SCHEDULE_1F1B && x->kind != PP_SCHEDULE_INTERLEAVED)
        return error_set(err, STATUS_BAD_INPUT, "pipeline: %s not built yet", pipeline_schedule_name(x->kind));
    struct pipeline_state *state = xcalloc(1, sizeof *state);
    state->n_ops = 2 * x->m * x->v;
    state->ops = xmalloc(sizeof(struct pp_op) * state->n_ops);
    CHECK(pipeline_schedule(x->kind, x->p, x->s, x->m, x->v, state->ops, err) == STATUS_OK,
          "schedule refused after its arguments were checked");
    int rings[PP_STREAM_COUNT]; // 0 for a stream without messages
    if (x->ring)
        for (int k = 0; k < PP_STREAM_COUNT; k++) rings[k] = x->ring;
    else
        ring_sizes(x->kind, x->p, x->s, x->m, x->v, rings);
    state->bytes = x->count * dtype_size(x->dtype);
    int prev = (x->s + x->p - 1) % x->p, next = (x->s + 1) % x->p;
    int peers[PP_STREAM_COUNT] = {prev, next, next, prev};
    for (int k = 0; k < PP_STREAM_COUNT; k++) {
        state->streams[k].peer = peers[k];
        state->streams[k].ring = MAX(1, rings[k]);
    }
    for (int i = 0; i < state->n_ops; i++) {
        int in = stream_in(x, &state->ops[i]), out = stream_out(x, &state->ops[i]);
        if (in >= 0) state->streams[in].n++;
        if (out >= 0) state->streams[out].n++;
    }
    for (int k = 0; k < PP_STREAM_COUNT; k++) {
        struct pp_stream *q = &state->streams[k];
        if (q->n == 0) continue;
        size_t bytes = (size_t)q->ring * state->bytes;
        q->buf = x->be ? backend_alloc(x->be, bytes) : xmalloc(bytes);
        CHECK(q->buf, "pipeline: no %s memory for %zu bytes of message buffers",
              x->be ? x->be->ops->name : "host", bytes);
        q->req = xcalloc((size_t)q->ring, sizeof *q->req);
        q->tag = xmalloc(sizeof(int) * q->n);
        q->n = 0;
    }
    // Receive tags in consumption order.
    for (int i = 0; i < state->n_ops; i++) {
        const struct pp_op *op = &state->ops[i];
        int in = stream_in(x, op);
        if (in >= 0) {
            struct pp_stream *q = &state->streams[in];
            q->tag[q->n++] = message_tag(op->micro, op->chunk, x->v, in == PP_STREAM_GRAD_IN);
        }
        int out = stream_out(x, op);
        if (out >= 0) state->streams[out].n++;
    }
    x->state = state;
    return STATUS_OK;
}

void pipeline_exec_free(struct pipeline_exec *x) {
    struct pipeline_state *st = x->state;
    if (!st) return;
    for (int k = 0; k < PP_STREAM_COUNT; k++) {
        if (x->be) backend_dealloc(x->be, st->streams[k].buf);
        else free(st->streams[k].buf);
        free(st->streams[k].req);
        free(st->streams[k].tag);
    }
    free(st->ops);
    free(st);
    x->state = NULL;
}

// Waits for req (a message of the pp group), calling x->progress meanwhile;
// the wait counts in the group's busy_s as comm_wait's does. A stream-ordered
// group (NCCL) is waited on at once: its transfers move without host calls,
// and comm_nccl enqueues its deferred sends only in a wait (comm_nccl.h), so
// two stages testing each other's messages would never see them arrive.
static void wait_message(const struct pipeline_exec *x, struct comm_request *req) {
    if (!x->progress || comm_stream_ordered(req->group)) {
        comm_wait(req);
        return;
    }
    if (comm_test(req)) return;
    double t0 = time_now_s();
    do x->progress(x->ctx);
    while (!comm_test(req));
    req->group->busy_s += time_now_s() - t0;
}

static void *ring_buf(const struct pipeline_state *st, const struct pp_stream *q, int i) {
    return q->buf + (size_t)(i % q->ring) * st->bytes;
}

static void post_recv(const struct pipeline_exec *x, struct pp_stream *q, int i) {
    const struct pipeline_state *st = x->state;
    comm_recv_start(x->group, ring_buf(st, q, i), x->count, x->dtype, q->peer, q->tag[i],
                    &q->req[i % q->ring]);
}

// The buffer the next message of receive stream k arrives in, once it has.
static const void *take_input(const struct pipeline_exec *x, int k) {
    if (k < 0) return NULL;
    struct pp_stream *q = &x->state->streams[k];
    CHECK(q->done < q->n, "stream %d: message %d of %d", k, q->done, q->n);
    wait_message(x, &q->req[q->done % q->ring]);
    return ring_buf(x->state, q, q->done);
}

// The input is consumed: its buffer takes the receive ring messages later.
static void release_input(const struct pipeline_exec *x, int k) {
    if (k < 0) return;
    struct pp_stream *q = &x->state->streams[k];
    int next = q->done + q->ring;
    if (next < q->n) post_recv(x, q, next);
    q->done++;
}

// The buffer the next message of send stream k is written to, free once the
// send that used it ring messages ago has completed.
static void *claim_output(const struct pipeline_exec *x, int k) {
    if (k < 0) return NULL;
    struct pp_stream *q = &x->state->streams[k];
    CHECK(q->done < q->n, "stream %d: message %d of %d", k, q->done, q->n);
    if (q->done >= q->ring) wait_message(x, &q->req[q->done % q->ring]);
    return ring_buf(x->state, q, q->done);
}

// The consumer of an op's output: (micro, chunk) on the next virtual stage
// (forward) or the previous one (backward); the ring wraps between stage
// p - 1 and stage 0, where the chunk changes.
static void send_output(const struct pipeline_exec *x, int k, const struct pp_op *op) {
    if (k < 0) return;
    struct pp_stream *q = &x->state->streams[k];
    int chunk = op->chunk, gradient = k == PP_STREAM_GRAD_OUT;
    if (!gradient && x->s == x->p - 1) chunk++;
    if (gradient && x->s == 0) chunk--;
    comm_send_start(x->group, ring_buf(x->state, q, q->done), x->count, x->dtype, q->peer,
                    message_tag(op->micro, chunk, x->v, gradient),
                    &q->req[q->done % q->ring]);
    q->done++;
}

void pipeline_poll(const struct pipeline_exec *x) {
    const struct pipeline_state *st = x->state;
    for (int k = 0; k < PP_STREAM_COUNT; k++)
        for (int i = 0; st->streams[k].req && i < st->streams[k].ring; i++) {
            struct comm_request *r = &st->streams[k].req[i];
            if (r->group && !r->done) comm_test(r);
        }
}

enum status pipeline_run(struct pipeline_exec *x, struct error *err) {
    struct pipeline_state *st = x->state;
    if (!st) return error_set(err, STATUS_RUNTIME, "pipeline_run before pipeline_exec_init");
    for (int k = 0; k < PP_STREAM_COUNT; k++) st->streams[k].done = 0;
    for (int k = PP_STREAM_ACT_IN; k <= PP_STREAM_GRAD_IN; k++)
        for (int i = 0; i < MIN(st->streams[k].ring, st->streams[k].n); i++)
            post_recv(x, &st->streams[k], i);
    for (int i = 0; i < st->n_ops; i++) {
        const struct pp_op *op = &st->ops[i];
        int in = stream_in(x, op), out = stream_out(x, op);
        const void *src = take_input(x, in);
        void *dst = claim_output(x, out);
        if (op->kind == PP_FORWARD)
            x->forward(x->ctx, op->micro, op->chunk, op->slot, src, dst);
        else
            x->backward(x->ctx, op->micro, op->chunk, op->slot, op->last, false, src, dst);
        send_output(x, out, op);
        release_input(x, in);
    }
    // Every receive was consumed; the last ring sends may still be in flight.
    for (int k = 0; k < PP_STREAM_COUNT; k++) {
        struct pp_stream *q = &st->streams[k];
        CHECK(q->done == q->n, "stream %d: %d of %d messages at the end", k, q->done, q->n);
        if (k == PP_STREAM_ACT_OUT || k == PP_STREAM_GRAD_OUT)
            for (int i = MAX(0, q->n - q->ring); i < q->n; i++)
                wait_message(x, &q->req[i % q->ring]);
    }
    return STATUS_OK;
}

enum status pipeline_simulate(enum pp_schedule kind, int p, int m, int v,
                              const struct pp_costs *costs, struct pp_sim *out, struct error *err) {
    (void)kind, (void)p, (void)m, (void)v, (void)costs, (void)out; // TODO(issue 30)
    return error_set(err, STATUS_BAD_INPUT, "pipeline_simulate: not built yet");
}

enum status pipeline_print_timeline(FILE *f, enum pp_schedule kind, int p, int m, int v,
                                    const struct pp_costs *costs, double unit, struct error *err) {
    (void)f, (void)unit;
    struct pp_sim sim;
    return pipeline_simulate(kind, p, m, v, costs, &sim, err);
}

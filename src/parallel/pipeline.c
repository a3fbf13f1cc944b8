// pipeline.c: the executor that runs a stage's schedule (pipeline_schedule.c)
// over the pp group with non-blocking messages.
#include "pipeline.h"

#include <stdbool.h>
#include <string.h>

#include "base/rng.h"
#include "pipeline_internal.h"

// MPI guarantees tags up to 32767 (MPI_TAG_UB); tags wrap below that. Two
// messages share a tag only when m v > 16384, and then they are thousands of
// ops apart, never in flight together.
enum { PIPELINE_TAG_SPAN = 32768 };

// ---- executor -----------------------------------------------------------------
//
// Message streams per stage (pp_stream_kind): activations in (from the
// previous virtual stage) and out (to the next), gradients in (from the next)
// and out (to the previous); ZB-V has a second set for chunk 1, whose virtual
// stages run the other way (2 p - 1 - s). The messages of a stream are
// numbered in the order this stage's schedule consumes or produces them;
// message i uses ring buffer i % ring.
//
// Receives: the first ring receives of each stream are posted at the start;
// receive i + ring is posted as soon as the op consuming message i returns.
// Sends: started (isend) as soon as the op producing them returns; before an
// op writes ring buffer i % ring, it waits for send i - ring. ZB-V's turn at
// stage p - 1 (chunk 0 feeding chunk 1, and the gradient back) goes through
// no message: the producer writes into the receive ring of the consumer on
// the same rank, sized to the table's own peak so that it never waits.
//
// Why this does not deadlock. A rank blocks only (a) on receive i, which
// completes once the peer has run the op producing message i, (b) on its own
// send i - ring before reusing that buffer, which completes once the peer
// has posted receive i - ring, i.e. consumed message i - ring - ring' (ring'
// its own ring of the stream), or (c) at the end on its last sends, which
// complete once the peer has posted their receives. B and W ops add nothing
// new: a B receives and sends exactly as a whole backward does, a W neither
// sends nor receives (it only delays its stage), and ZB-V's local turn at
// stage p - 1 never waits (its ring holds the table's peak of messages
// written and not yet read, and the producer runs before the consumer in
// the table). Three facts make the whole argument:
//  1. Determinacy. Each rank runs a fixed sequence of posts and waits, and a
//     wait's condition, once true, stays true (requests only ever get posted
//     and completed). So whether every rank reaches its end does not depend
//     on timing, message sizes, eager or rendezvous delivery, or the delays
//     of delay_seed (the executors form a monotone network of processes in
//     the sense of Kahn 1974: their furthest progress is unique).
//  2. Rings. With a larger ring each wait of (b) is on an earlier message,
//     and receives are posted earlier: every condition is implied by the
//     ring-1 one at the same point, so ring 1 ending implies every ring >= 1
//     ends.
//  3. Ring 1 ends. (a) alone is the tables' own data dependency, acyclic
//     when every stage's table runs to its end in the unit-time simulation
//     (tests/unit/test_pipeline.c, every schedule). With (b) and (c) it is
//     checked, not argued: tests/unit/test_pipeline.c runs this executor on
//     threads whose sends complete only on a matching receive (rendezvous,
//     the worst case of MPI) with ring = 1 and with the default rings, for
//     every schedule, p <= 8, m <= 3p + 4, v <= 3, and detects a deadlock
//     when every live thread waits; by 1. one run decides each case.
// tests/mpi/test_pipeline_mpi.c runs the same over MPI, with delays too.
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
    int local;                // out stream: the receive stream it writes into, or -1
    bool fed_locally;         // in stream written by this rank (ZB-V at stage p - 1)
    int made;                 // fed locally: messages written so far
};

struct pipeline_state {
    struct pp_op *ops; // (n_ops,)
    int n_ops;
    size_t bytes; // one message
    struct pp_stream streams[PP_STREAM_COUNT];
};

// A message is tagged by the op that consumes it: (micro, chunk) on the
// receiving stage and whether it is an activation (0) or a gradient (1).
static int message_tag(int micro, int chunk, int v, int gradient) {
    return (int)((((int64_t)micro * v + chunk) * 2 + gradient) % PIPELINE_TAG_SPAN);
}

static int stream_in(const struct pipeline_exec *x, const struct pp_op *op) {
    return pipeline_stream_in(x->kind, x->p, x->s, x->v, op);
}

static int stream_out(const struct pipeline_exec *x, const struct pp_op *op) {
    return pipeline_stream_out(x->kind, x->p, x->s, x->v, op);
}

enum status pipeline_exec_init(struct pipeline_exec *x, struct error *err) {
    x->state = NULL;
    x->idle_s = 0;
    int n_ops = pipeline_op_count(x->kind, x->p, x->s, x->m, x->v);
    if (n_ops == 0) {
        struct pp_op none;
        return pipeline_schedule(x->kind, x->p, x->s, x->m, x->v, &none, err);
    }
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
    if (pipeline_schedule_splits(x->kind) && !x->weight)
        return error_set(err, STATUS_BAD_INPUT,
                         "pipeline: schedule %s splits the backward into B and W, and the weight "
                         "callback (pipeline_exec.weight) is NULL",
                         pipeline_schedule_name(x->kind));
    struct pp_op *ops = xmalloc(sizeof(struct pp_op) * n_ops);
    enum status st = pipeline_schedule(x->kind, x->p, x->s, x->m, x->v, ops, err);
    if (st != STATUS_OK) {
        free(ops);
        return st;
    }
    struct pipeline_state *state = xcalloc(1, sizeof *state);
    state->n_ops = n_ops;
    state->ops = ops;
    int rings[PP_STREAM_COUNT]; // 0 for a stream without messages
    if (x->ring)
        for (int k = 0; k < PP_STREAM_COUNT; k++) rings[k] = x->ring;
    else
        pipeline_ring_sizes(x->kind, x->p, x->s, x->m, x->v, rings);
    state->bytes = x->count * dtype_size(x->dtype);
    for (int k = 0; k < PP_STREAM_COUNT; k++) {
        struct pp_stream *q = &state->streams[k];
        q->peer = pipeline_stream_peer(x->kind, x->p, x->s, k);
        q->ring = MAX(1, rings[k]);
        q->local = pipeline_stream_local_target(x->kind, x->p, x->s, k);
    }
    for (int k = 0; k < PP_STREAM_COUNT; k++) {
        int t = state->streams[k].local;
        if (t >= 0) state->streams[t].fed_locally = true;
    }
    // Messages per stream; a locally fed ring holds the table's peak of
    // messages written and not yet consumed, so its producer never waits.
    int pending[PP_STREAM_COUNT] = {0}, peak[PP_STREAM_COUNT] = {0};
    for (int i = 0; i < n_ops; i++) {
        int in = stream_in(x, &ops[i]), out = stream_out(x, &ops[i]);
        if (out >= 0) {
            state->streams[out].n++;
            int t = state->streams[out].local;
            if (t >= 0) {
                pending[t]++;
                peak[t] = MAX(peak[t], pending[t]);
            }
        }
        if (in >= 0) {
            state->streams[in].n++;
            pending[in] -= state->streams[in].fed_locally;
        }
    }
    for (int k = 0; k < PP_STREAM_COUNT; k++) {
        struct pp_stream *q = &state->streams[k];
        if (q->fed_locally) q->ring = MAX(q->ring, peak[k]);
        if (q->n == 0 || q->local >= 0) continue;
        size_t bytes = (size_t)q->ring * state->bytes;
        q->buf = x->be ? backend_alloc(x->be, bytes) : xmalloc(bytes);
        CHECK(q->buf, "pipeline: no %s memory for %zu bytes of message buffers",
              x->be ? x->be->ops->name : "host", bytes);
        q->req = xcalloc((size_t)q->ring, sizeof *q->req);
        q->tag = xmalloc(sizeof(int) * q->n);
    }
    for (int k = 0; k < PP_STREAM_COUNT; k++) state->streams[k].n = 0;
    // Receive tags in consumption order.
    for (int i = 0; i < n_ops; i++) {
        const struct pp_op *op = &ops[i];
        int in = stream_in(x, op);
        if (in >= 0) {
            struct pp_stream *q = &state->streams[in];
            q->tag[q->n++] =
                message_tag(op->micro, op->chunk, x->v, pipeline_stream_is_gradient(in));
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
// the wait counts in the group's busy_s as comm_wait's does, and in
// x->idle_s. A stream-ordered group (NCCL) is waited on at once: its
// transfers move without host calls, and comm_nccl enqueues its deferred
// sends only in a wait (comm_nccl.h), so two stages testing each other's
// messages would never see them arrive.
static void wait_message(struct pipeline_exec *x, struct comm_request *req) {
    double t0 = time_now_s();
    if (!x->progress || comm_stream_ordered(req->group)) {
        comm_wait(req);
    } else if (!comm_test(req)) {
        do x->progress(x->ctx);
        while (!comm_test(req));
        req->group->busy_s += time_now_s() - t0;
    }
    x->idle_s += time_now_s() - t0;
}

// The fault hook (delay_seed): a pseudo-random 0 to 2 ms before the
// executor starts message i of stream k, drawn from (seed, stage, stream, i)
// alone, so that a run's delays do not depend on timing.
static void fault_delay(const struct pipeline_exec *x, int k, int i) {
    if (!x->delay_seed) return;
    uint64_t h = rng_splitmix64(x->delay_seed);
    h = rng_splitmix64(h ^ (uint64_t)x->s);
    h = rng_splitmix64(h ^ (uint64_t)k);
    h = rng_splitmix64(h ^ (uint64_t)i);
    sleep_s((double)(h % 2001) * 1e-6);
}

static void *ring_buf(const struct pipeline_state *st, const struct pp_stream *q, int i) {
    return q->buf + (size_t)(i % q->ring) * st->bytes;
}

static void post_recv(const struct pipeline_exec *x, int k, int i) {
    struct pp_stream *q = &x->state->streams[k];
    fault_delay(x, k, i);
    comm_recv_start(x->group, ring_buf(x->state, q, i), x->count, x->dtype, q->peer, q->tag[i],
                    &q->req[i % q->ring]);
}

// The buffer the next message of receive stream k arrives in, once it has.
static const void *take_input(struct pipeline_exec *x, int k) {
    if (k < 0) return NULL;
    struct pp_stream *q = &x->state->streams[k];
    CHECK(q->done < q->n, "stream %d: message %d of %d", k, q->done, q->n);
    if (q->fed_locally)
        CHECK(q->done < q->made, "stream %d: message %d consumed before it was written", k,
              q->done);
    else
        wait_message(x, &q->req[q->done % q->ring]);
    return ring_buf(x->state, q, q->done);
}

// The input is consumed: its buffer takes the receive ring messages later.
static void release_input(const struct pipeline_exec *x, int k) {
    if (k < 0) return;
    struct pp_stream *q = &x->state->streams[k];
    int next = q->done + q->ring;
    if (!q->fed_locally && next < q->n) post_recv(x, k, next);
    q->done++;
}

// The buffer the next message of send stream k is written to, free once the
// send that used it ring messages ago has completed (or, written locally,
// once the message ring messages ago has been consumed: always, by the ring's
// size).
static void *claim_output(struct pipeline_exec *x, int k) {
    if (k < 0) return NULL;
    struct pp_stream *q = &x->state->streams[k];
    CHECK(q->done < q->n, "stream %d: message %d of %d", k, q->done, q->n);
    if (q->local >= 0) {
        struct pp_stream *t = &x->state->streams[q->local];
        CHECK(t->made - t->done < t->ring, "stream %d: local ring of %d full", q->local, t->ring);
        return ring_buf(x->state, t, t->made);
    }
    if (q->done >= q->ring) wait_message(x, &q->req[q->done % q->ring]);
    return ring_buf(x->state, q, q->done);
}

// Sends the output of op to its consumer: (micro, chunk) on the next virtual
// stage (forward) or the previous one (backward).
static void send_output(const struct pipeline_exec *x, int k, const struct pp_op *op) {
    if (k < 0) return;
    struct pp_stream *q = &x->state->streams[k];
    if (q->local >= 0) {
        x->state->streams[q->local].made++;
        q->done++;
        return;
    }
    int chunk = pipeline_consumer_chunk(x->kind, x->p, x->s, op);
    fault_delay(x, k, q->done);
    comm_send_start(x->group, ring_buf(x->state, q, q->done), x->count, x->dtype, q->peer,
                    message_tag(op->micro, chunk, x->v, pipeline_stream_is_gradient(k)),
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

// The test hook op_pad_s: sleeps seconds in 1 ms pieces, letting the
// pending messages progress between them as a model's pipeline_poll between
// layers does (MPI moves a large message only inside MPI calls).
static void pad_op(const struct pipeline_exec *x, double seconds) {
    double end = time_now_s() + seconds;
    for (double now = time_now_s(); now < end; now = time_now_s()) {
        sleep_s(MIN(1e-3, end - now));
        pipeline_poll(x);
    }
}

enum status pipeline_run(struct pipeline_exec *x, struct error *err) {
    struct pipeline_state *st = x->state;
    if (!st) return error_set(err, STATUS_RUNTIME, "pipeline_run before pipeline_exec_init");
    x->idle_s = 0;
    for (int k = 0; k < PP_STREAM_COUNT; k++) st->streams[k].done = st->streams[k].made = 0;
    for (int k = 0; k < PP_STREAM_COUNT; k++) {
        struct pp_stream *q = &st->streams[k];
        if (!pipeline_stream_is_in(k) || q->fed_locally) continue;
        for (int i = 0; i < MIN(q->ring, q->n); i++) post_recv(x, k, i);
    }
    for (int i = 0; i < st->n_ops; i++) {
        const struct pp_op *op = &st->ops[i];
        int in = stream_in(x, op), out = stream_out(x, op);
        const void *src = take_input(x, in);
        void *dst = claim_output(x, out);
        if (x->op_pad_s > 0) pad_op(x, x->op_pad_s * (op->kind == PP_BACKWARD ? 2 : 1));
        switch (op->kind) {
        case PP_FORWARD: x->forward(x->ctx, op->micro, op->chunk, op->slot, src, dst); break;
        case PP_BACKWARD:
            x->backward(x->ctx, op->micro, op->chunk, op->slot, -1, op->last, src, dst);
            break;
        case PP_BACKWARD_INPUT:
            x->backward(x->ctx, op->micro, op->chunk, op->slot, op->wslot, false, src, dst);
            break;
        case PP_BACKWARD_WEIGHT: x->weight(x->ctx, op->micro, op->chunk, op->wslot, op->last); break;
        }
        send_output(x, out, op);
        release_input(x, in);
    }
    // Every receive was consumed; the last ring sends may still be in flight.
    for (int k = 0; k < PP_STREAM_COUNT; k++) {
        struct pp_stream *q = &st->streams[k];
        CHECK(q->done == q->n, "stream %d: %d of %d messages at the end", k, q->done, q->n);
        if (!pipeline_stream_is_in(k) && q->local < 0)
            for (int i = MAX(0, q->n - q->ring); i < q->n; i++)
                wait_message(x, &q->req[i % q->ring]);
    }
    return STATUS_OK;
}

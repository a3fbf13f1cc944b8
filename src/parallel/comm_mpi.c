// comm_mpi.c: the comm_ops table on MPI communicators (host buffers).
#include "comm_mpi.h"

#include <limits.h>
#include <sched.h>
#include <string.h>

#include "base/mpi_util.h"
#include "kernels/cpu/half.h"

// One piece of a non-blocking all-reduce (at most chunk_bytes), in the
// group's queue from all_reduce_start until it completes.
struct nb_chunk {
    void *buf;
    int count;
    MPI_Datatype type;
    MPI_Op op;
    size_t bytes;
    uint64_t seq;     // issue order on the group, from 1
    bool started, done;
    MPI_Request r;
};

struct comm_mpi {
    MPI_Comm comm;
    MPI_Op bf16_sum; // bf16_sum_fn (MPI has no BF16 type); MPI_OP_NULL for a non-member
    size_t chunk_bytes;    // largest message of one MPI collective call (COMM_MPI_CHUNK_BYTES)
    size_t window_bytes;   // non-blocking all-reduce bytes in flight at most (COMM_MPI_WINDOW_BYTES)
    void *stage;           // (chunk_bytes,) reduce-scatter staging, allocated at first use
    struct nb_chunk *q;    // (cap,) ring of queued and in-flight chunks, oldest at head
    int head, n, cap;
    size_t inflight_bytes; // bytes of started, not yet completed chunks
    uint64_t issued;       // seq of the last chunk queued
};

// A request's storage: the MPI_Request of a point-to-point operation, or for
// a non-blocking all-reduce the seq of its last chunk (storage[1] says which).
enum { REQ_P2P = 0, REQ_QUEUED = 1 };

_Static_assert(sizeof(MPI_Request) <= sizeof(((struct comm_request *)0)->storage[0]),
               "MPI_Request does not fit in comm_request.storage[0]");

static MPI_Comm group_comm(const struct comm_group *g) {
    return ((const struct comm_mpi *)g->impl)->comm;
}

// BF16/FP16 move as 16-bit words; BF16 sums go through bf16_sum_fn.
static MPI_Datatype mpi_dtype(enum dtype dtype) {
    switch (dtype) {
    case DTYPE_FP32: return MPI_FLOAT;
    case DTYPE_FP64: return MPI_DOUBLE;
    case DTYPE_I32: return MPI_INT32_T;
    case DTYPE_I64: return MPI_INT64_T;
    case DTYPE_BF16:
    case DTYPE_FP16: return MPI_UINT16_T;
    case DTYPE_FP8_E4M3:
    case DTYPE_FP8_E5M2: return MPI_UINT8_T; // moved, never summed
    }
    CHECK(0, "no MPI datatype for dtype %d", (int)dtype);
}

// inout[i] = bf16(fp32(in[i]) + fp32(inout[i])): both operands widened
// exactly, summed in FP32 and rounded once (to nearest, ties to even). The
// exact sum of two BF16 values needs at most 8 + 1 + (exponent gap) bits, so
// the FP32 addition is exact unless the gap exceeds 15, where the smaller
// operand is far below the BF16 rounding unit anyway: the result is the
// correctly rounded sum. Commutative: MPI may combine in any order.
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = bf16_from_f32(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static MPI_Op mpi_op(const struct comm_group *g, enum comm_op op, enum dtype dtype) {
    if (dtype == DTYPE_BF16) return ((const struct comm_mpi *)g->impl)->bf16_sum; // sums only
    return op == COMM_MAX ? MPI_MAX : MPI_SUM;
}

static int mpi_count(size_t count) {
    CHECK(count <= INT_MAX, "%zu elements exceed MPI's int count; split the buffer", count);
    return (int)count;
}

static struct comm_mpi *impl_of(const struct comm_group *g) { return g->impl; }

// Elements of per_elem_bytes each per MPI call: chunk_bytes' worth, at least one.
static size_t chunk_elems(const struct comm_group *g, size_t per_elem_bytes) {
    size_t n = impl_of(g)->chunk_bytes / per_elem_bytes;
    return n ? n : 1;
}

// Waits for r, giving up the CPU between tests. MPI_Wait polls without
// pause, and on a host with fewer free cores than ranks (the CPU backend's
// tests and benches: --oversubscribe, other jobs) a rank spinning for its
// peer takes the core the peer needs to reach the collective: measured on
// tests/bench/zero_step.sh (2 ranks, 2 busy cores), ZeRO-3's 46 waits per
// step spent ~40% of a rank's cycles in MPI's progress loop and the step
// took 1-6x ZeRO-1's. sched_yield returns at once when nothing else is
// runnable, so an idle host keeps MPI_Wait's latency.
static void wait_yielding(MPI_Request *r) {
    for (;;) {
        int done = 0;
        CHECK_MPI(MPI_Test(r, &done, MPI_STATUS_IGNORE));
        if (done) return;
        sched_yield();
    }
}

// ---- non-blocking all-reduces: a queue of chunks, a bounded window in flight ----
//
// OpenMPI's non-blocking all-reduce (coll/libnbc) holds a temporary of its
// message's size until it completes, and a data-parallel backward starts
// every bucket before it waits for any: unbounded, the temporaries add up to
// the whole gradient arena (measured: 348 MiB per rank for the 124M config
// at dp 2). Here each all_reduce_start queues its buffer as chunks of at most
// chunk_bytes, and a chunk starts only while the started, unfinished ones
// hold at most window_bytes (one always may). The queue moves in
// test and wait (MPI progresses only inside MPI calls anyway). Chunks start
// in the order they were queued, on every rank the same, and before any
// other collective on the communicator (flush), so MPI's collective matching
// sees the order the caller issued.

static struct nb_chunk *q_at(struct comm_mpi *m, int i) { return &m->q[(m->head + i) % m->cap]; }

static void q_push(struct comm_mpi *m, struct nb_chunk c) {
    if (m->n == m->cap) { // grow (the first steps only: the queue's length repeats each step)
        int cap = m->cap ? 2 * m->cap : 64;
        struct nb_chunk *q = xmalloc((size_t)cap * sizeof *q);
        for (int i = 0; i < m->n; i++) q[i] = *q_at(m, i);
        free(m->q);
        m->q = q, m->head = 0, m->cap = cap;
    }
    *q_at(m, m->n++) = c;
}

static void chunk_start(struct comm_mpi *m, struct nb_chunk *c) {
    CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, c->buf, c->count, c->type, c->op, m->comm, &c->r));
    c->started = true;
    m->inflight_bytes += c->bytes;
}

static void chunk_done(struct comm_mpi *m, struct nb_chunk *c) {
    c->done = true;
    m->inflight_bytes -= c->bytes;
}

// Drops completed chunks from the head; starts queued ones in order while
// the window allows (all of them when flush).
static void q_pump(struct comm_mpi *m, bool flush) {
    while (m->n && q_at(m, 0)->done) m->head = (m->head + 1) % m->cap, m->n--;
    for (int i = 0; i < m->n; i++) {
        struct nb_chunk *c = q_at(m, i);
        if (c->started) continue;
        if (!flush && m->inflight_bytes && m->inflight_bytes + c->bytes > m->window_bytes) break;
        chunk_start(m, c);
    }
}

// Tests every started chunk once (progress for all), then pumps.
static void q_poll(struct comm_mpi *m) {
    for (int i = 0; i < m->n; i++) {
        struct nb_chunk *c = q_at(m, i);
        if (!c->started || c->done) continue;
        int done = 0;
        CHECK_MPI(MPI_Test(&c->r, &done, MPI_STATUS_IGNORE));
        if (done) chunk_done(m, c);
    }
    q_pump(m, false);
}

// The oldest chunk of seq <= last not yet complete; NULL when all are.
static struct nb_chunk *q_pending(struct comm_mpi *m, uint64_t last) {
    for (int i = 0; i < m->n && q_at(m, i)->seq <= last; i++)
        if (!q_at(m, i)->done) return q_at(m, i);
    return NULL;
}

// Before any other collective on the communicator: every queued chunk starts
// first, so that all ranks issue the same collectives in the same order.
static void q_flush(struct comm_mpi *m) {
    if (m->n) q_pump(m, true);
}

static void mpi_all_reduce(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                           enum comm_op op) {
    q_flush(impl_of(g));
    size_t es = dtype_size(dtype), per = chunk_elems(g, es);
    for (size_t at = 0; at < count; at += per)
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + at * es, mpi_count(MIN(per, count - at)),
                                mpi_dtype(dtype), mpi_op(g, op, dtype), group_comm(g)));
}

static void mpi_all_reduce_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                                 enum comm_op op, struct comm_request *req) {
    struct comm_mpi *m = impl_of(g);
    size_t es = dtype_size(dtype), per = chunk_elems(g, es);
    size_t at = 0;
    do { // a count of 0 is one empty chunk, as MPI would take it
        size_t k = MIN(per, count - at);
        q_push(m, (struct nb_chunk){.buf = (char *)buf + at * es, .count = mpi_count(k),
                                    .type = mpi_dtype(dtype), .op = mpi_op(g, op, dtype),
                                    .bytes = k * es, .seq = ++m->issued});
        at += k;
    } while (at < count);
    req->storage[0] = m->issued, req->storage[1] = REQ_QUEUED;
    q_pump(m, false);
}

static void mpi_wait(struct comm_request *req) {
    if (req->storage[1] == REQ_QUEUED) {
        struct comm_mpi *m = impl_of(req->group);
        struct nb_chunk *c;
        for (q_pump(m, false); (c = q_pending(m, req->storage[0])); q_pump(m, false)) {
            // c is the oldest unfinished chunk: every older one is done, so
            // nothing is in flight ahead of it and q_pump started it.
            CHECK(c->started, "comm_mpi: a queued all-reduce chunk never started");
            wait_yielding(&c->r);
            chunk_done(m, c);
        }
        return;
    }
    MPI_Request r;
    memcpy(&r, req->storage, sizeof r);
    wait_yielding(&r);
    memcpy(req->storage, &r, sizeof r);
}

static bool mpi_test(struct comm_request *req) {
    if (req->storage[1] == REQ_QUEUED) {
        struct comm_mpi *m = impl_of(req->group);
        q_poll(m);
        return !q_pending(m, req->storage[0]);
    }
    MPI_Request r;
    int done = 0;
    memcpy(&r, req->storage, sizeof r);
    CHECK_MPI(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    memcpy(req->storage, &r, sizeof r);
    return done;
}

// A whole reduce-scatter is size * count elements; MPI's (OpenMPI's tuned
// reduce-to-root then scatter) holds up to twice that on group rank 0. In
// calls of at most chunk_bytes: piece [at, at + k) of every rank's block is
// copied into the staging buffer as size consecutive blocks of k and
// reduce-scattered into recv + at. Each element is the same reduction over
// the same ranks; for size 2 the sum is exactly the unchunked one.
static void mpi_reduce_scatter(struct comm_group *g, const void *send, void *recv, size_t count,
                               enum dtype dtype, enum comm_op op) {
    struct comm_mpi *m = impl_of(g);
    q_flush(m);
    size_t es = dtype_size(dtype), W = (size_t)g->size;
    if (W * count * es <= m->chunk_bytes) {
        CHECK_MPI(MPI_Reduce_scatter_block(send, recv, mpi_count(count), mpi_dtype(dtype),
                                           mpi_op(g, op, dtype), group_comm(g)));
        return;
    }
    size_t per = chunk_elems(g, W * es);
    if (!m->stage) m->stage = xmalloc(MAX(m->chunk_bytes, W * es));
    for (size_t at = 0; at < count; at += per) {
        size_t k = MIN(per, count - at);
        for (size_t r = 0; r < W; r++)
            memcpy((char *)m->stage + r * k * es, (const char *)send + (r * count + at) * es, k * es);
        CHECK_MPI(MPI_Reduce_scatter_block(m->stage, (char *)recv + at * es, mpi_count(k),
                                           mpi_dtype(dtype), mpi_op(g, op, dtype), group_comm(g)));
    }
}

static void mpi_all_gather(struct comm_group *g, const void *send, void *recv, size_t count,
                           enum dtype dtype) {
    const char *own = (const char *)recv + (size_t)g->rank * count * dtype_size(dtype);
    mpi_count((size_t)g->size * count); // recv's total must fit an int too
    q_flush(impl_of(g));
    CHECK_MPI(MPI_Allgather(send == own ? MPI_IN_PLACE : send, mpi_count(count), mpi_dtype(dtype),
                            recv, mpi_count(count), mpi_dtype(dtype), group_comm(g)));
}

static void mpi_reduce_scatter_start(struct comm_group *g, const void *send, void *recv,
                                     size_t count, enum dtype dtype, enum comm_op op,
                                     struct comm_request *req) {
    q_flush(impl_of(g));
    MPI_Request r;
    CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, mpi_count(count), mpi_dtype(dtype),
                                        mpi_op(g, op, dtype), group_comm(g), &r));
    memcpy(req->storage, &r, sizeof r);
}

static void mpi_all_gather_start(struct comm_group *g, const void *send, void *recv, size_t count,
                                 enum dtype dtype, struct comm_request *req) {
    const char *own = (const char *)recv + (size_t)g->rank * count * dtype_size(dtype);
    mpi_count((size_t)g->size * count);
    q_flush(impl_of(g));
    MPI_Request r;
    CHECK_MPI(MPI_Iallgather(send == own ? MPI_IN_PLACE : send, mpi_count(count), mpi_dtype(dtype),
                             recv, mpi_count(count), mpi_dtype(dtype), group_comm(g), &r));
    memcpy(req->storage, &r, sizeof r);
}

static void mpi_broadcast(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                          int root) {
    q_flush(impl_of(g));
    CHECK_MPI(MPI_Bcast(buf, mpi_count(count), mpi_dtype(dtype), root, group_comm(g)));
}

static void mpi_send(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                     int peer, int tag) {
    CHECK_MPI(MPI_Send(buf, mpi_count(count), mpi_dtype(dtype), peer, tag, group_comm(g)));
}

static void mpi_recv(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
                     int tag) {
    CHECK_MPI(MPI_Recv(buf, mpi_count(count), mpi_dtype(dtype), peer, tag, group_comm(g),
                       MPI_STATUS_IGNORE));
}

static void mpi_send_start(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                           int peer, int tag, struct comm_request *req) {
    MPI_Request r;
    CHECK_MPI(MPI_Isend(buf, mpi_count(count), mpi_dtype(dtype), peer, tag, group_comm(g), &r));
    memcpy(req->storage, &r, sizeof r);
}

static void mpi_recv_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                           int peer, int tag, struct comm_request *req) {
    MPI_Request r;
    CHECK_MPI(MPI_Irecv(buf, mpi_count(count), mpi_dtype(dtype), peer, tag, group_comm(g), &r));
    memcpy(req->storage, &r, sizeof r);
}

static void mpi_barrier(struct comm_group *g) {
    q_flush(impl_of(g));
    CHECK_MPI(MPI_Barrier(group_comm(g)));
}

static void mpi_free(struct comm_group *g) {
    struct comm_mpi *impl = g->impl;
    if (!impl) return;
    if (mpi_is_running()) { // chunks nobody waited for (an error path) end before the communicator
        q_flush(impl);
        for (int i = 0; i < impl->n; i++)
            if (!q_at(impl, i)->done) CHECK_MPI(MPI_Wait(&q_at(impl, i)->r, MPI_STATUS_IGNORE));
    }
    free(impl->q), free(impl->stage);
    if (impl->bf16_sum != MPI_OP_NULL && mpi_is_running()) CHECK_MPI(MPI_Op_free(&impl->bf16_sum));
    if (impl->comm != MPI_COMM_NULL && mpi_is_running()) CHECK_MPI(MPI_Comm_free(&impl->comm));
    free(impl);
    g->impl = NULL;
}

// MPI_Alltoallv takes int counts and offsets: elements of dtype, each
// below 2^31 (mpi_count checks).
static void mpi_all_to_all_v(struct comm_group *g, const void *send, const size_t *send_counts,
                             const size_t *send_displs, void *recv, const size_t *recv_counts,
                             const size_t *recv_displs, enum dtype dtype) {
    int n = g->size, *v = xmalloc(4 * (size_t)n * sizeof *v);
    for (int r = 0; r < n; r++) {
        v[r] = mpi_count(send_counts[r]), v[n + r] = mpi_count(send_displs[r]);
        v[2 * n + r] = mpi_count(recv_counts[r]), v[3 * n + r] = mpi_count(recv_displs[r]);
    }
    q_flush(impl_of(g));
    CHECK_MPI(MPI_Alltoallv(send, v, v + n, mpi_dtype(dtype), recv, v + 2 * n, v + 3 * n,
                            mpi_dtype(dtype), group_comm(g)));
    free(v);
}

static const struct comm_ops comm_mpi_ops = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .all_reduce_start = mpi_all_reduce_start,
    .wait = mpi_wait,
    .test = mpi_test,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .reduce_scatter_start = mpi_reduce_scatter_start,
    .all_gather_start = mpi_all_gather_start,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .send_start = mpi_send_start,
    .recv_start = mpi_recv_start,
    .barrier = mpi_barrier,
    .all_to_all_v = mpi_all_to_all_v,
    .free = mpi_free,
};

void comm_mpi_init(struct comm_group *g, MPI_Comm comm) {
    memset(g, 0, sizeof *g);
    g->ops = &comm_mpi_ops;
    struct comm_mpi *impl = xcalloc(1, sizeof *impl);
    impl->comm = comm;
    impl->bf16_sum = MPI_OP_NULL;
    impl->chunk_bytes = COMM_MPI_CHUNK_BYTES, impl->window_bytes = COMM_MPI_WINDOW_BYTES;
    g->impl = impl;
    if (comm == MPI_COMM_NULL) return; // size 0: not a member
    CHECK_MPI(MPI_Op_create(bf16_sum_fn, 1, &impl->bf16_sum));
    CHECK_MPI(MPI_Comm_rank(comm, &g->rank));
    CHECK_MPI(MPI_Comm_size(comm, &g->size));
}

MPI_Comm comm_mpi_handle(const struct comm_group *g) {
    CHECK(g && g->ops == &comm_mpi_ops, "comm_mpi_handle: not an MPI group");
    return group_comm(g);
}

void comm_mpi_set_limits(struct comm_group *g, size_t chunk_bytes, size_t window_bytes) {
    CHECK(g && g->ops == &comm_mpi_ops && chunk_bytes > 0, "comm_mpi_set_limits: not an MPI group");
    struct comm_mpi *m = impl_of(g);
    q_pump(m, false); // drops the completed chunks
    CHECK(m->n == 0, "comm_mpi_set_limits: all-reduces in flight");
    free(m->stage);
    m->stage = NULL, m->chunk_bytes = chunk_bytes, m->window_bytes = window_bytes;
}

size_t comm_mpi_plan_bytes(int group_size, bool nonblocking_all_reduce, bool reduce_scatter,
                           size_t nonblocking_reduce_scatter_bytes) {
    if (group_size <= 1) return 0;
    return 2 * (size_t)COMM_MPI_CHUNK_BYTES + (nonblocking_all_reduce ? COMM_MPI_WINDOW_BYTES : 0) +
           (reduce_scatter ? COMM_MPI_CHUNK_BYTES : 0) + nonblocking_reduce_scatter_bytes;
}

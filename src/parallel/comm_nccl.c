// comm_nccl.c: the comm_ops table on NCCL communicators (device buffers of
// the CUDA backend); see comm_nccl.h for the stream ordering.
#include "comm_nccl.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <string.h>

#include "base/mpi_util.h"
#include "comm_mpi.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"

// The pool of completion events starts with this many and doubles when every
// one is in flight (a ~1B model at dp = 2 starts ~167 gradient buckets in one
// backward before waiting on any): no allocation once the first step has
// reached the high-water mark.
#define NCCL_EVENTS_INITIAL 64

// A send or receive started (send_start, recv_start) but not yet enqueued:
// see flush_p2p.
struct p2p_op {
    bool send;
    void *buf;
    size_t count;
    ncclDataType_t dtype;
    int peer;
    int event; // its completion event, also its request's index
};

struct comm_nccl {
    ncclComm_t comm;
    MPI_Comm mpi; // not owned: the MPI group's (barrier, id broadcast)
    int device;
    cudaStream_t compute, stream; // the backend's compute and communication streams
    cudaEvent_t ready;            // compute -> comm ordering before each operation
    // One completion event per operation in flight (a request holds its
    // index): (n_events,), the free ones' indices on a stack.
    cudaEvent_t *done;
    int *free_events, n_free, n_events;
    struct p2p_op *deferred; // (n_deferred,) started point-to-point operations not
    int n_deferred;          // yet enqueued, in start order; room for n_events
    struct p2p_op *now;      // (n_events + 1,) flush_p2p's batch
};

_Static_assert(sizeof(int) <= sizeof(((struct comm_request *)0)->storage),
               "event index does not fit in comm_request.storage");

static struct comm_nccl *impl_of(const struct comm_group *g) { return g->impl; }

static ncclDataType_t nccl_dtype(enum dtype dtype) {
    switch (dtype) {
    case DTYPE_FP32: return ncclFloat32;
    case DTYPE_FP64: return ncclFloat64;
    case DTYPE_I32: return ncclInt32;
    case DTYPE_I64: return ncclInt64;
    case DTYPE_BF16: return ncclBfloat16; // sums too (NCCL >= 2.10): grad_dtype = bf16
    case DTYPE_FP16: return ncclFloat16;
    }
    CHECK(0, "no NCCL datatype for dtype %d", (int)dtype);
}

static ncclRedOp_t nccl_op(enum comm_op op) { return op == COMM_MAX ? ncclMax : ncclSum; }

// The communication stream waits for everything enqueued on the compute stream.
static void begin(struct comm_nccl *c) {
    CHECK_CUDA(cudaSetDevice(c->device));
    CHECK_CUDA(cudaEventRecord(c->ready, c->compute));
    CHECK_CUDA(cudaStreamWaitEvent(c->stream, c->ready, 0));
}

// The compute stream waits for the operation just enqueued on the communication stream.
static void end(struct comm_nccl *c) {
    CHECK_CUDA(cudaEventRecord(c->ready, c->stream));
    CHECK_CUDA(cudaStreamWaitEvent(c->compute, c->ready, 0));
}

static void nccl_all_reduce(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                            enum comm_op op) {
    struct comm_nccl *c = impl_of(g);
    begin(c);
    CHECK_NCCL(ncclAllReduce(buf, buf, count, nccl_dtype(dtype), nccl_op(op), c->comm, c->stream));
    end(c);
}

static void *resized(void *p, size_t bytes) {
    void *q = realloc(p, bytes);
    CHECK(q, "comm_nccl: out of host memory (%zu bytes)", bytes);
    return q;
}

// Doubles the event pool (n_events = 0: makes the first NCCL_EVENTS_INITIAL),
// with room for as many deferred operations.
static void events_grow(struct comm_nccl *c) {
    int old = c->n_events, n = old ? 2 * old : NCCL_EVENTS_INITIAL;
    CHECK(n > old && n < (1 << 24), "comm_nccl: %d operations in flight on one group", old);
    c->done = resized(c->done, sizeof *c->done * (size_t)n);
    c->free_events = resized(c->free_events, sizeof *c->free_events * (size_t)n);
    c->deferred = resized(c->deferred, sizeof *c->deferred * (size_t)n);
    c->now = resized(c->now, sizeof *c->now * ((size_t)n + 1));
    for (int k = n - 1; k >= old; k--) {
        CHECK_CUDA(cudaEventCreateWithFlags(&c->done[k], cudaEventDisableTiming));
        c->free_events[c->n_free++] = k;
    }
    c->n_events = n;
}

// Takes a free completion event for a started operation (growing the pool
// when all are in flight) and stores its index in req.
static int event_take(struct comm_nccl *c, struct comm_request *req) {
    if (!c->n_free) events_grow(c);
    int k = c->free_events[--c->n_free];
    memcpy(req->storage, &k, sizeof k);
    return k;
}

// The operation of event k has completed (or is ordered before the compute
// stream's later work): its event is free again.
static void event_put(struct comm_nccl *c, int k) { c->free_events[c->n_free++] = k; }

static void nccl_all_reduce_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                                  enum comm_op op, struct comm_request *req) {
    struct comm_nccl *c = impl_of(g);
    int k = event_take(c, req);
    begin(c);
    CHECK_NCCL(ncclAllReduce(buf, buf, count, nccl_dtype(dtype), nccl_op(op), c->comm, c->stream));
    CHECK_CUDA(cudaEventRecord(c->done[k], c->stream));
}

// Point-to-point starts are deferred, not enqueued: NCCL has no tags and an
// enqueued receive holds the communication stream until its message comes,
// so the receives a pipeline posts ahead (pipeline.c) would block the sends
// behind them that their peers wait for. Waiting on a deferred request
// enqueues, in one ncclGroupStart/End (whose operations progress together),
// every deferred send and the waited-for operation, and leaves the other
// deferred receives for their own waits: each receive joins the stream when
// its data is needed, with the sends started before it (Megatron's
// send_forward_recv_backward pairs). The stream then depends on exactly what
// a host blocking in MPI_Wait would, so a schedule free of deadlock over MPI
// stays free of it. Receives from one peer are enqueued in wait order and
// NCCL matches them to that peer's sends in send order: the caller must
// consume each peer's messages in the order that peer sent them (one stream
// of messages per pair of ranks and direction; comm_nccl.h).
static void defer_p2p(struct comm_group *g, bool send, const void *buf, size_t count,
                      enum dtype dtype, int peer, struct comm_request *req) {
    struct comm_nccl *c = impl_of(g);
    int k = event_take(c, req); // deferred operations hold events: n_deferred < n_events
    c->deferred[c->n_deferred++] = (struct p2p_op){send, (void *)buf, count, nccl_dtype(dtype),
                                                   peer, k};
}

// Enqueues the deferred sends and the deferred operation of event k (see
// above), and extra (a blocking send or receive, event -1) when given, in
// one group; each deferred operation's completion event is recorded after it.
static void flush_p2p(struct comm_nccl *c, int k, const struct p2p_op *extra) {
    struct p2p_op *now = c->now;
    int n_now = 0, n_left = 0;
    for (int i = 0; i < c->n_deferred; i++) {
        struct p2p_op op = c->deferred[i];
        if (op.send || op.event == k) now[n_now++] = op;
        else c->deferred[n_left++] = op;
    }
    c->n_deferred = n_left;
    if (extra) now[n_now++] = *extra;
    if (!n_now) return;
    begin(c);
    CHECK_NCCL(ncclGroupStart());
    for (int i = 0; i < n_now; i++) {
        if (now[i].send)
            CHECK_NCCL(ncclSend(now[i].buf, now[i].count, now[i].dtype, now[i].peer, c->comm,
                                c->stream));
        else
            CHECK_NCCL(ncclRecv(now[i].buf, now[i].count, now[i].dtype, now[i].peer, c->comm,
                                c->stream));
    }
    CHECK_NCCL(ncclGroupEnd());
    for (int i = 0; i < n_now; i++)
        if (now[i].event >= 0) CHECK_CUDA(cudaEventRecord(c->done[now[i].event], c->stream));
}

static bool is_deferred(const struct comm_nccl *c, int k) {
    for (int i = 0; i < c->n_deferred; i++)
        if (c->deferred[i].event == k) return true;
    return false;
}

static void nccl_send_start(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                            int peer, int tag, struct comm_request *req) {
    defer_p2p(g, true, buf, count, dtype, peer, req);
}

static void nccl_recv_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                            int peer, int tag, struct comm_request *req) {
    defer_p2p(g, false, buf, count, dtype, peer, req);
}

static void nccl_wait(struct comm_request *req) {
    struct comm_nccl *c = impl_of(req->group);
    int k;
    memcpy(&k, req->storage, sizeof k);
    if (is_deferred(c, k)) flush_p2p(c, k, NULL);
    // Stream-ordered completion: kernels enqueued from now on see the result.
    CHECK_CUDA(cudaStreamWaitEvent(c->compute, c->done[k], 0));
    event_put(c, k);
}

// A deferred operation is not complete and test does not enqueue it (a
// receive enqueued early could block the sends behind it).
static bool nccl_test(struct comm_request *req) {
    struct comm_nccl *c = impl_of(req->group);
    int k;
    memcpy(&k, req->storage, sizeof k);
    if (is_deferred(c, k)) return false;
    cudaError_t e = cudaEventQuery(c->done[k]);
    if (e == cudaErrorNotReady) return false;
    CHECK_CUDA(e);
    event_put(c, k);
    return true;
}

static void nccl_reduce_scatter(struct comm_group *g, const void *send, void *recv, size_t count,
                                enum dtype dtype, enum comm_op op) {
    struct comm_nccl *c = impl_of(g);
    begin(c);
    CHECK_NCCL(ncclReduceScatter(send, recv, count, nccl_dtype(dtype), nccl_op(op), c->comm,
                                 c->stream));
    end(c);
}

// In place when send == recv + rank * count (NCCL detects it).
static void nccl_all_gather(struct comm_group *g, const void *send, void *recv, size_t count,
                            enum dtype dtype) {
    struct comm_nccl *c = impl_of(g);
    begin(c);
    CHECK_NCCL(ncclAllGather(send, recv, count, nccl_dtype(dtype), c->comm, c->stream));
    end(c);
}

static void nccl_broadcast(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                           int root) {
    struct comm_nccl *c = impl_of(g);
    begin(c);
    CHECK_NCCL(ncclBroadcast(buf, buf, count, nccl_dtype(dtype), root, c->comm, c->stream));
    end(c);
}

// A blocking send or receive is one NCCL group, with the deferred sends
// (started before it, so they go first, as MPI would have progressed them).
static void nccl_send(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                      int peer, int tag) {
    struct comm_nccl *c = impl_of(g);
    struct p2p_op op = {true, (void *)buf, count, nccl_dtype(dtype), peer, -1};
    flush_p2p(c, -1, &op);
    end(c);
}

static void nccl_recv(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
                      int tag) {
    struct comm_nccl *c = impl_of(g);
    struct p2p_op op = {false, buf, count, nccl_dtype(dtype), peer, -1};
    flush_p2p(c, -1, &op);
    end(c);
}

static void nccl_barrier(struct comm_group *g) {
    struct comm_nccl *c = impl_of(g);
    CHECK_CUDA(cudaStreamSynchronize(c->stream));
    CHECK_CUDA(cudaStreamSynchronize(c->compute));
    CHECK_MPI(MPI_Barrier(c->mpi));
}

static void nccl_free(struct comm_group *g) {
    struct comm_nccl *c = g->impl;
    if (!c) return;
    if (c->comm) {
        cudaStreamSynchronize(c->stream);
        ncclCommDestroy(c->comm);
        cudaEventDestroy(c->ready);
        for (int k = 0; k < c->n_events; k++) cudaEventDestroy(c->done[k]);
    }
    free(c->done), free(c->free_events), free(c->deferred), free(c->now);
    free(c);
    g->impl = NULL;
}

static const struct comm_ops comm_nccl_ops = {
    .name = "nccl",
    .all_reduce = nccl_all_reduce,
    .all_reduce_start = nccl_all_reduce_start,
    .wait = nccl_wait,
    .test = nccl_test,
    .send_start = nccl_send_start,
    .recv_start = nccl_recv_start,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .send = nccl_send,
    .recv = nccl_recv,
    .barrier = nccl_barrier,
    .free = nccl_free,
    .stream_ordered = true, // begin() and end(): events between the two streams
};

void comm_nccl_init(struct comm_group *g, const struct comm_group *mpi_group, struct backend *be) {
    memset(g, 0, sizeof *g);
    g->ops = &comm_nccl_ops;
    struct comm_nccl *c = xcalloc(1, sizeof *c);
    g->impl = c;
    if (mpi_group->size == 0) return; // not a member
    c->mpi = comm_mpi_handle(mpi_group);
    c->device = backend_cuda_device(be);
    c->compute = (cudaStream_t)backend_cuda_stream(be);
    c->stream = (cudaStream_t)backend_cuda_comm_stream(be);
    CHECK_CUDA(cudaSetDevice(c->device));
    CHECK_CUDA(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming));
    events_grow(c);
    ncclUniqueId id;
    if (mpi_group->rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    CHECK_MPI(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi));
    CHECK_NCCL(ncclCommInitRank(&c->comm, mpi_group->size, id, mpi_group->rank));
    g->rank = mpi_group->rank;
    g->size = mpi_group->size;
}

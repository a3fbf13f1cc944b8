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

// Events of pending all_reduce_start requests: a ring, so starting a request
// allocates nothing; more than this many requests in flight at once on one
// group is a bug (checked).
#define NCCL_EVENTS 64

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
    cudaEvent_t done[NCCL_EVENTS];
    bool busy[NCCL_EVENTS];
    int next;
    struct p2p_op deferred[NCCL_EVENTS]; // started point-to-point operations not yet
    int n_deferred;                       // enqueued, in start order
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

// Takes a free completion event for a started operation and stores its index
// in req.
static int event_take(struct comm_nccl *c, struct comm_request *req) {
    int k = c->next;
    CHECK(!c->busy[k], "comm_nccl: more than %d operations in flight on one group", NCCL_EVENTS);
    c->next = (k + 1) % NCCL_EVENTS;
    c->busy[k] = true;
    memcpy(req->storage, &k, sizeof k);
    return k;
}

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
    int k = event_take(c, req);
    CHECK(c->n_deferred < NCCL_EVENTS, "comm_nccl: more than %d deferred sends and receives",
          NCCL_EVENTS);
    c->deferred[c->n_deferred++] = (struct p2p_op){send, (void *)buf, count, nccl_dtype(dtype),
                                                   peer, k};
}

// Enqueues the deferred sends and the deferred operation of event k (see
// above), and extra (a blocking send or receive, event -1) when given, in
// one group; each deferred operation's completion event is recorded after it.
static void flush_p2p(struct comm_nccl *c, int k, const struct p2p_op *extra) {
    struct p2p_op now[NCCL_EVENTS + 1];
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
    c->busy[k] = false;
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
    c->busy[k] = false;
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
        for (int k = 0; k < NCCL_EVENTS; k++) cudaEventDestroy(c->done[k]);
    }
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
    for (int k = 0; k < NCCL_EVENTS; k++)
        CHECK_CUDA(cudaEventCreateWithFlags(&c->done[k], cudaEventDisableTiming));
    ncclUniqueId id;
    if (mpi_group->rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    CHECK_MPI(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi));
    CHECK_NCCL(ncclCommInitRank(&c->comm, mpi_group->size, id, mpi_group->rank));
    g->rank = mpi_group->rank;
    g->size = mpi_group->size;
}

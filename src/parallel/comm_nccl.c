// comm_nccl.c: the comm_ops table on NCCL communicators (device buffers of
// the CUDA backend); see comm_nccl.h for the stream ordering and the errors.
#include "comm_nccl.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/mpi_util.h"
#include "comm_mpi.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_check.h"

// The pool of events starts with this many operations' worth and doubles
// when every one is in flight (a ~1B model at dp = 2 starts ~167 gradient
// buckets in one backward before waiting on any): no allocation once the
// first step has reached the high-water mark.
#define NCCL_EVENTS_INITIAL 64

// A rank that finds its communicator failed waits this long before it exits
// (its exit makes mpirun end the others), so that its peers, which poll
// their own communicators (waits, the watchdog's tick of 0.2 s), print their
// side first: every rank's log names the failure.
#define NCCL_FAIL_GRACE_S 1.0

// A send or receive started (send_start, recv_start) but not yet enqueued:
// see flush_p2p.
struct p2p_op {
    bool send;
    void *buf;
    size_t count;
    ncclDataType_t dtype;
    int peer;
    int event; // its events' index (also its request's); -1: a blocking call's
};

struct comm_nccl {
    ncclComm_t comm;
    MPI_Comm mpi; // not owned: the MPI group's (barrier, id broadcast)
    int device;
    char name[16];       // the group's kind ("tp", "dp", ...) for messages
    char host[64];
    cudaStream_t compute; // the backend's compute stream
    cudaStream_t stream;  // this group's own communication stream
    cudaEvent_t ready;    // compute -> comm ordering before each operation
    // Per operation in flight (a request holds the index): done, recorded on
    // the communication stream after it; start, recorded on the compute
    // stream when a deferred send or receive is started (its buffer is
    // ready then). (n_events,) each; the free indices on a stack.
    cudaEvent_t *done, *start;
    int *free_events, n_free, n_events;
    struct p2p_op *deferred; // (n_deferred,) started point-to-point operations not
    int n_deferred;          // yet enqueued, in start order; room for n_events
    struct p2p_op *now;      // (n_events + 1,) flush_p2p's batch
    atomic_bool failed;      // an error was found (by this thread or the watchdog's)
};

_Static_assert(sizeof(int) <= sizeof(((struct comm_request *)0)->storage),
               "event index does not fit in comm_request.storage");

static struct comm_nccl *impl_of(const struct comm_group *g) { return g->impl; }

// ---- errors ---------------------------------------------------------------------------

// Writes the failure of c (NCCL result r, found in what) to msg: the group,
// this rank's place in it, NCCL's error string and its last error message.
static void describe_failure(const struct comm_nccl *c, const struct comm_group *g,
                             ncclResult_t r, const char *what, char *msg, size_t cap) {
    snprintf(msg, cap, "NCCL error on the %s group (NCCL rank %d of %d, device %d, host %s) in "
             "%s: %s (NCCL %d; %s); communicator aborted", c->name, g ? g->rank : -1,
             g ? g->size : -1, c->device, c->host, what, ncclGetErrorString(r), (int)r,
             ncclGetLastError(c->comm));
}

// Aborts c's communicator once, on whichever thread found the failure
// first; false on the other (the first one ends the process).
static bool abort_once(struct comm_nccl *c) {
    if (atomic_exchange(&c->failed, true)) return false;
    ncclCommAbort(c->comm); // unblocks NCCL's kernels and proxy threads; the process exits next
    return true;
}

// A failed NCCL call or an asynchronous error seen on the calling thread:
// aborts the communicator, lets the peers report theirs (NCCL_FAIL_GRACE_S),
// then ends the job with exit 1 naming the rank, the group and NCCL's error.
_Noreturn static void nccl_fail(struct comm_nccl *c, const struct comm_group *g, ncclResult_t r,
                                const char *what, const char *file, int line) {
    char msg[1024];
    describe_failure(c, g, r, what, msg, sizeof msg);
    if (!abort_once(c))
        for (;;) pause(); // the watchdog's thread reported it and is ending the process
    fatal_announce(msg); // the ranks outside this communicator name it too (base/heartbeat.h)
    sleep_s(NCCL_FAIL_GRACE_S);
    fatal_exit(STATUS_RUNTIME, file, line, "%s", msg);
}

#define NCCL_TRY(c, g, stmt)                                                   \
    do {                                                                       \
        ncclResult_t r_ = (stmt);                                              \
        if (r_ != ncclSuccess) nccl_fail((c), (g), r_, #stmt, __FILE__, __LINE__); \
    } while (0)

// NCCL's asynchronous error of c (a failed kernel, a dead peer, a network
// error), ncclSuccess when none; ncclInProgress (a non-blocking
// communicator's pending call) counts as none.
static ncclResult_t async_error(const struct comm_nccl *c) {
    ncclResult_t a = ncclSuccess;
    if (!c->comm || atomic_load(&c->failed)) return ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c->comm, &a);
    if (r != ncclSuccess) return r;
    return a == ncclInProgress ? ncclSuccess : a;
}

// Polls the asynchronous error from a wait on the calling thread.
static void poll_async(struct comm_nccl *c, const struct comm_group *g, const char *where) {
    ncclResult_t a = async_error(c);
    if (a != ncclSuccess) nccl_fail(c, g, a, where, __FILE__, __LINE__);
}

// Blocks the host until stream s has run everything enqueued so far,
// polling the communicator's asynchronous error meanwhile (a collective
// whose peer died never completes: cudaStreamSynchronize would not return).
static void host_wait(struct comm_nccl *c, const struct comm_group *g, cudaStream_t s,
                      const char *where) {
    for (double nap = 20e-6;; nap = nap < 1e-3 ? 2 * nap : nap) {
        cudaError_t e = cudaStreamQuery(s);
        if (e != cudaSuccess && e != cudaErrorNotReady) CHECK_CUDA(e);
        poll_async(c, g, where); // also once done: an operation that failed may have ended
        if (e == cudaSuccess) return;
        sleep_s(nap);
    }
}

// comm_ops.check: the watchdog's poll (another thread than the caller of
// the operations; ncclCommGetAsyncError and ncclCommAbort may be called so).
static int nccl_check(struct comm_group *g, char *msg, size_t cap) {
    struct comm_nccl *c = impl_of(g);
    ncclResult_t a = async_error(c);
    if (a == ncclSuccess) return 0;
    describe_failure(c, g, a, "the watchdog's poll of ncclCommGetAsyncError", msg, cap);
    if (!abort_once(c))
        for (;;) pause(); // the main thread reported it and is ending the process
    return 1; // the watchdog prints msg and lingers before its exit, as nccl_fail does

}

// ---- events ---------------------------------------------------------------------------

// Doubles the event pool (n_events = 0: makes the first NCCL_EVENTS_INITIAL),
// with room for as many deferred operations.
static void events_grow(struct comm_nccl *c) {
    int old = c->n_events, n = old ? 2 * old : NCCL_EVENTS_INITIAL;
    CHECK(n > old && n < (1 << 24), "comm_nccl: %d operations in flight on one group", old);
    c->done = xrealloc(c->done, sizeof *c->done * (size_t)n);
    c->start = xrealloc(c->start, sizeof *c->start * (size_t)n);
    c->free_events = xrealloc(c->free_events, sizeof *c->free_events * (size_t)n);
    c->deferred = xrealloc(c->deferred, sizeof *c->deferred * (size_t)n);
    c->now = xrealloc(c->now, sizeof *c->now * ((size_t)n + 1));
    for (int k = n - 1; k >= old; k--) {
        CHECK_CUDA(cudaEventCreateWithFlags(&c->done[k], cudaEventDisableTiming));
        CHECK_CUDA(cudaEventCreateWithFlags(&c->start[k], cudaEventDisableTiming));
        c->free_events[c->n_free++] = k;
    }
    c->n_events = n;
}

// Takes free events for a started operation (growing the pool when all are
// in flight) and stores their index in req.
static int event_take(struct comm_nccl *c, struct comm_request *req) {
    if (!c->n_free) events_grow(c);
    int k = c->free_events[--c->n_free];
    memcpy(req->storage, &k, sizeof k);
    return k;
}

// The operation of index k has completed, or the compute stream is ordered
// after it: its events are free again.
static void event_put(struct comm_nccl *c, int k) { c->free_events[c->n_free++] = k; }

// ---- ordering between the streams ------------------------------------------------------

static ncclDataType_t nccl_dtype(enum dtype dtype) {
    switch (dtype) {
    case DTYPE_FP32: return ncclFloat32;
    case DTYPE_FP64: return ncclFloat64;
    case DTYPE_I32: return ncclInt32;
    case DTYPE_I64: return ncclInt64;
    case DTYPE_BF16: return ncclBfloat16; // sums too (NCCL >= 2.10): grad_dtype = bf16
    case DTYPE_FP16: return ncclFloat16;
    case DTYPE_FP8_E4M3:
    case DTYPE_FP8_E5M2: return ncclUint8; // moved, never summed
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

// ---- collectives ----------------------------------------------------------------------

static void nccl_all_reduce(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                            enum comm_op op) {
    struct comm_nccl *c = impl_of(g);
    begin(c);
    NCCL_TRY(c, g, ncclAllReduce(buf, buf, count, nccl_dtype(dtype), nccl_op(op), c->comm, c->stream));
    end(c);
}

static void nccl_all_reduce_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                                  enum comm_op op, struct comm_request *req) {
    struct comm_nccl *c = impl_of(g);
    int k = event_take(c, req);
    begin(c);
    NCCL_TRY(c, g, ncclAllReduce(buf, buf, count, nccl_dtype(dtype), nccl_op(op), c->comm, c->stream));
    CHECK_CUDA(cudaEventRecord(c->done[k], c->stream));
}

static void nccl_reduce_scatter(struct comm_group *g, const void *send, void *recv, size_t count,
                                enum dtype dtype, enum comm_op op) {
    struct comm_nccl *c = impl_of(g);
    begin(c);
    NCCL_TRY(c, g, ncclReduceScatter(send, recv, count, nccl_dtype(dtype), nccl_op(op), c->comm,
                                     c->stream));
    end(c);
}

// In place when send == recv + rank * count (NCCL detects it).
static void nccl_all_gather(struct comm_group *g, const void *send, void *recv, size_t count,
                            enum dtype dtype) {
    struct comm_nccl *c = impl_of(g);
    begin(c);
    NCCL_TRY(c, g, ncclAllGather(send, recv, count, nccl_dtype(dtype), c->comm, c->stream));
    end(c);
}

// The started twins: like all_reduce_start, ordered after the compute
// stream's work so far (begin), completion recorded on the communication
// stream; the wait makes the compute stream wait for it.
static void nccl_reduce_scatter_start(struct comm_group *g, const void *send, void *recv,
                                      size_t count, enum dtype dtype, enum comm_op op,
                                      struct comm_request *req) {
    struct comm_nccl *c = impl_of(g);
    int k = event_take(c, req);
    begin(c);
    NCCL_TRY(c, g, ncclReduceScatter(send, recv, count, nccl_dtype(dtype), nccl_op(op), c->comm,
                                     c->stream));
    CHECK_CUDA(cudaEventRecord(c->done[k], c->stream));
}

static void nccl_all_gather_start(struct comm_group *g, const void *send, void *recv, size_t count,
                                  enum dtype dtype, struct comm_request *req) {
    struct comm_nccl *c = impl_of(g);
    int k = event_take(c, req);
    begin(c);
    NCCL_TRY(c, g, ncclAllGather(send, recv, count, nccl_dtype(dtype), c->comm, c->stream));
    CHECK_CUDA(cudaEventRecord(c->done[k], c->stream));
}

static void nccl_broadcast(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                           int root) {
    struct comm_nccl *c = impl_of(g);
    begin(c);
    NCCL_TRY(c, g, ncclBroadcast(buf, buf, count, nccl_dtype(dtype), root, c->comm, c->stream));
    end(c);
}

// ---- point to point -------------------------------------------------------------------

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
// Each start records an event on the compute stream (the send's buffer is
// produced, the receive's buffer is no longer read): the flushed group waits
// for those events, not for all the compute enqueued by the time of the wait.
static void defer_p2p(struct comm_group *g, bool send, const void *buf, size_t count,
                      enum dtype dtype, int peer, struct comm_request *req) {
    struct comm_nccl *c = impl_of(g);
    int k = event_take(c, req); // deferred operations hold events: n_deferred < n_events
    CHECK_CUDA(cudaSetDevice(c->device));
    CHECK_CUDA(cudaEventRecord(c->start[k], c->compute));
    c->deferred[c->n_deferred++] = (struct p2p_op){send, (void *)buf, count, nccl_dtype(dtype),
                                                   peer, k};
}

// Enqueues the deferred sends and the deferred operation of index k (see
// above), and extra (a blocking send or receive, event -1, ordered after all
// the compute enqueued so far) when given, in one group; each deferred
// operation's completion event is recorded after it.
static void flush_p2p(struct comm_group *g, int k, const struct p2p_op *extra) {
    struct comm_nccl *c = impl_of(g);
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
    CHECK_CUDA(cudaSetDevice(c->device));
    if (extra) begin(c);
    for (int i = 0; i < n_now; i++)
        if (now[i].event >= 0) CHECK_CUDA(cudaStreamWaitEvent(c->stream, c->start[now[i].event], 0));
    NCCL_TRY(c, g, ncclGroupStart());
    for (int i = 0; i < n_now; i++) {
        if (now[i].send)
            NCCL_TRY(c, g, ncclSend(now[i].buf, now[i].count, now[i].dtype, now[i].peer, c->comm,
                                    c->stream));
        else
            NCCL_TRY(c, g, ncclRecv(now[i].buf, now[i].count, now[i].dtype, now[i].peer, c->comm,
                                    c->stream));
    }
    NCCL_TRY(c, g, ncclGroupEnd());
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
    if (is_deferred(c, k)) flush_p2p(req->group, k, NULL);
    // Stream-ordered completion: kernels enqueued from now on see the result.
    CHECK_CUDA(cudaStreamWaitEvent(c->compute, c->done[k], 0));
    event_put(c, k);
    poll_async(c, req->group, "comm_wait");
}

// A deferred operation is not complete and test does not enqueue it (a
// receive enqueued early could block the sends behind it).
static bool nccl_test(struct comm_request *req) {
    struct comm_nccl *c = impl_of(req->group);
    int k;
    memcpy(&k, req->storage, sizeof k);
    if (is_deferred(c, k)) return false;
    cudaError_t e = cudaEventQuery(c->done[k]);
    if (e != cudaSuccess && e != cudaErrorNotReady) CHECK_CUDA(e);
    poll_async(c, req->group, "comm_test"); // a failed operation may have ended
    if (e == cudaErrorNotReady) return false;
    event_put(c, k);
    return true;
}

// A blocking send or receive is one NCCL group, with the deferred sends
// (started before it, so they go first, as MPI would have progressed them).
static void nccl_send(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                      int peer, int tag) {
    struct comm_nccl *c = impl_of(g);
    struct p2p_op op = {true, (void *)buf, count, nccl_dtype(dtype), peer, -1};
    flush_p2p(g, -1, &op);
    end(c);
}

static void nccl_recv(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
                      int tag) {
    struct comm_nccl *c = impl_of(g);
    struct p2p_op op = {false, buf, count, nccl_dtype(dtype), peer, -1};
    flush_p2p(g, -1, &op);
    end(c);
}

// ---- all-to-all ----------------------------------------------------------------------

// NCCL has no all-to-all-v: one group of a send and a receive per peer with
// a non-zero count, NCCL's own all-to-all pattern (NCCL user guide,
// "Point-to-point communication", all-to-all; PyTorch's ProcessGroupNCCL
// alltoall_base does the same), whose operations progress together, so no
// order of the peers deadlocks. A zero count is skipped on both sides
// (recv_counts[r] is rank r's send_counts[me]). The chunk to itself is a
// device copy on the communication stream ahead of the group (NCCL also
// takes a send to itself, but a copy needs no NCCL channel). Ordered as the
// blocking collectives are (begin, end): after the compute enqueued so far,
// before the compute enqueued after it; the host does not wait. Messages
// match a peer's in call order (no tags), so a deferred point-to-point
// operation of this group not yet enqueued would take the all-to-all's
// messages or give its own: a caller waits on its started sends and
// receives first (a bug otherwise: CHECK; comm_nccl.h).
static void nccl_all_to_all_v(struct comm_group *g, const void *send, const size_t *send_counts,
                              const size_t *send_displs, void *recv, const size_t *recv_counts,
                              const size_t *recv_displs, enum dtype dtype) {
    struct comm_nccl *c = impl_of(g);
    CHECK(c->n_deferred == 0,
          "comm_all_to_all_v on the %s group with %d started send/recv not yet waited on "
          "(NCCL matches a peer's messages in order, not by tag)", c->name, c->n_deferred);
    size_t es = dtype_size(dtype);
    ncclDataType_t t = nccl_dtype(dtype);
    int me = g->rank;
    begin(c);
    if (send_counts[me])
        CHECK_CUDA(cudaMemcpyAsync((char *)recv + recv_displs[me] * es,
                                   (const char *)send + send_displs[me] * es, send_counts[me] * es,
                                   cudaMemcpyDeviceToDevice, c->stream));
    NCCL_TRY(c, g, ncclGroupStart());
    for (int r = 0; r < g->size; r++) {
        if (r == me) continue;
        if (send_counts[r])
            NCCL_TRY(c, g, ncclSend((const char *)send + send_displs[r] * es, send_counts[r], t, r,
                                    c->comm, c->stream));
        if (recv_counts[r])
            NCCL_TRY(c, g, ncclRecv((char *)recv + recv_displs[r] * es, recv_counts[r], t, r,
                                    c->comm, c->stream));
    }
    NCCL_TRY(c, g, ncclGroupEnd());
    end(c);
}

static void nccl_barrier(struct comm_group *g) {
    struct comm_nccl *c = impl_of(g);
    host_wait(c, g, c->stream, "comm_barrier (the communication stream)");
    host_wait(c, g, c->compute, "comm_barrier (the compute stream)");
    CHECK_MPI(MPI_Barrier(c->mpi));
}

static void nccl_free(struct comm_group *g) {
    struct comm_nccl *c = g->impl;
    if (!c) return;
    if (c->comm) {
        host_wait(c, g, c->stream, "freeing the communicator");
        ncclCommDestroy(c->comm);
        cudaEventDestroy(c->ready);
        for (int k = 0; k < c->n_events; k++) cudaEventDestroy(c->done[k]), cudaEventDestroy(c->start[k]);
    }
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->done), free(c->start), free(c->free_events), free(c->deferred), free(c->now);
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
    .reduce_scatter_start = nccl_reduce_scatter_start,
    .all_gather_start = nccl_all_gather_start,
    .broadcast = nccl_broadcast,
    .send = nccl_send,
    .recv = nccl_recv,
    .barrier = nccl_barrier,
    .all_to_all_v = nccl_all_to_all_v,
    .free = nccl_free,
    .check = nccl_check,
    .stream_ordered = true, // begin() and end(): events between the two streams
};

void comm_nccl_init(struct comm_group *g, const struct comm_group *mpi_group, struct backend *be,
                    const char *name, bool high_priority) {
    memset(g, 0, sizeof *g);
    g->ops = &comm_nccl_ops;
    struct comm_nccl *c = xcalloc(1, sizeof *c);
    g->impl = c;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "?");
    if (gethostname(c->host, sizeof c->host - 1)) snprintf(c->host, sizeof c->host, "?");
    if (mpi_group->size == 0) return; // not a member
    c->mpi = comm_mpi_handle(mpi_group);
    c->device = backend_cuda_device(be);
    c->compute = (cudaStream_t)backend_cuda_stream(be);
    CHECK_CUDA(cudaSetDevice(c->device));
    // Priorities: lower numbers run first; greatest is the highest priority.
    int least = 0, greatest = 0;
    CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CHECK_CUDA(cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking,
                                            high_priority ? greatest : least));
    CHECK_CUDA(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming));
    events_grow(c);
    ncclUniqueId id;
    if (mpi_group->rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    CHECK_MPI(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi));
    CHECK_NCCL(ncclCommInitRank(&c->comm, mpi_group->size, id, mpi_group->rank));
    g->rank = mpi_group->rank;
    g->size = mpi_group->size;
}

// comm.h: collectives and point-to-point messages within one group of ranks,
// behind one table of operations (docs/design.md §3). Implementations:
// comm_mpi.c (an MPI communicator; host buffers on the CPU backend),
// comm_nccl.c (a NCCL communicator; device buffers, built with CUDA=1) and
// comm_self in comm.c (a group of one rank, no MPI: unit tests and
// single-rank runs).
//
// The core calls the comm_* wrappers below, never the table: they check the
// arguments (a violation is a bug in trident: exit 1 with file:line) and then
// dispatch. A failure inside the library (an MPI error) is fatal on the rank
// that sees it and aborts the job (src/base/mpi_util.h), so the operations return
// nothing.
//
// Counts are in elements of the given dtype, not bytes. Reductions (sum, max)
// take FP32, FP64, I32 or I64, and sums also BF16 (the data-parallel gradient
// reduction of [precision] grad_dtype = bf16): each combination of two
// operands widens them to FP32, adds and rounds the sum to BF16 once (to
// nearest, ties to even), so a sum over p ranks rounds p - 1 times per
// element, as NCCL's ncclBfloat16 sum does (MPI has no BF16 type: comm_mpi.c
// defines the operation). Data movement (all_gather, broadcast, send,
// recv, send_start, recv_start) takes any dtype. Every member of a group must
// call a collective with the same count, dtype, op and root, in the same order.
#ifndef TRIDENT_COMM_H
#define TRIDENT_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/common.h"
#include "kernels/ops.h"

enum comm_op { COMM_SUM, COMM_MAX };

struct comm_group;

// A pending non-blocking operation. Small and held by value (no malloc in the
// training loop): an implementation keeps its handle (MPI_Request, CUDA
// event) in storage. done is set once the operation has completed.
struct comm_request {
    struct comm_group *group;
    bool done;
    uint64_t storage[2];
};

// The table an implementation fills. Every entry is required.
struct comm_ops {
    const char *name; // "mpi", "self"
    // buf: (count,) replaced on every rank by the reduction over the group.
    void (*all_reduce)(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                       enum comm_op op);
    // Starts the same all-reduce and returns at once; buf must not be touched
    // until wait returns or test returns true. With MPI the transfer
    // progresses only inside MPI calls (OpenMPI has no progress thread by
    // default): a caller overlapping compute calls test now and then. MPI
    // queues it as chunks with a bounded number of bytes in flight, which
    // test and wait move on (comm_mpi.h): the same contract.
    void (*all_reduce_start)(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                             enum comm_op op, struct comm_request *req);
    // Completion of any started request (all_reduce_start, send_start,
    // recv_start): wait blocks until it is complete, test returns true once it is.
    void (*wait)(struct comm_request *req);
    bool (*test)(struct comm_request *req);
    // send: (size * count,) chunk r goes to group rank r; recv: (count,) the
    // reduction of this rank's chunk over the group. send and recv do not overlap.
    void (*reduce_scatter)(struct comm_group *g, const void *send, void *recv, size_t count,
                           enum dtype dtype, enum comm_op op);
    // send: (count,); recv: (size * count,) chunk r from group rank r. send may
    // be this rank's own chunk inside recv (in place: recv + rank * count).
    void (*all_gather)(struct comm_group *g, const void *send, void *recv, size_t count,
                       enum dtype dtype);
    // Non-blocking twins of reduce_scatter and all_gather (ZeRO-2/3's
    // per-unit gradient reduce-scatters and parameter gathers): return at
    // once; send must not be written and recv not read or written until the
    // request completes (comm_wait / comm_test). Same buffer rules as the
    // blocking ones (all_gather_start may be in place).
    void (*reduce_scatter_start)(struct comm_group *g, const void *send, void *recv, size_t count,
                                 enum dtype dtype, enum comm_op op, struct comm_request *req);
    void (*all_gather_start)(struct comm_group *g, const void *send, void *recv, size_t count,
                             enum dtype dtype, struct comm_request *req);
    // buf: (count,) root's values copied to every rank.
    void (*broadcast)(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int root);
    // Blocking point-to-point to / from group rank peer, matched by tag.
    void (*send)(struct comm_group *g, const void *buf, size_t count, enum dtype dtype, int peer,
                 int tag);
    void (*recv)(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
                 int tag);
    // Non-blocking point-to-point (pipeline activations): return at once; buf
    // must not be written (send) or read (recv) until the request completes.
    // A send may complete only once the peer has posted the matching receive
    // (large messages), so a caller must not wait on a send before every
    // receive its peer needs first is posted. Messages between two ranks with
    // the same tag arrive in the order they were sent.
    void (*send_start)(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                       int peer, int tag, struct comm_request *req);
    void (*recv_start)(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
                       int tag, struct comm_request *req);
    void (*barrier)(struct comm_group *g);
    // All-to-all with per-peer counts (MPI_Alltoallv; NCCL: grouped sends
    // and receives): send_counts[r] elements from send + send_displs[r] go
    // to group rank r, which receives them at recv + recv_displs[me]; this
    // rank receives recv_counts[r] elements from rank r at recv +
    // recv_displs[r]. Counts and offsets in elements, host arrays of size
    // entries; recv_counts[r] must equal rank r's send_counts[me] (the
    // caller exchanges the counts first: expert parallelism's row counts).
    // The chunk to itself is copied. send and recv do not overlap. Any dtype.
    void (*all_to_all_v)(struct comm_group *g, const void *send, const size_t *send_counts,
                         const size_t *send_displs, void *recv, const size_t *recv_counts,
                         const size_t *recv_displs, enum dtype dtype);
    // Releases impl (and the communicator it owns); the group struct stays.
    void (*free)(struct comm_group *g);
    // Optional, default none (never fails): polls for an asynchronous failure
    // of the group's communicator (NCCL: ncclCommGetAsyncError) from another
    // thread than the one calling the operations (the watchdog's). Returns 0
    // when none; else non-zero with msg (cap bytes, NUL included) naming the
    // group, this rank and the library's error, after aborting the
    // communicator (the caller ends the process).
    int (*check)(struct comm_group *g, char *msg, size_t cap);
    // Optional, default false. True when every operation on backend buffers
    // is ordered after the work already enqueued on the backend's compute
    // stream, and work enqueued later after it (comm_nccl.c: events), so a
    // caller need not backend_synchronize before a collective; false (MPI,
    // self): the caller synchronizes so that the buffers are final in memory.
    bool stream_ordered;
};

// A group of ranks: this rank's index in it and its size. size == 0 marks a
// group this rank is not in (e.g. the embedding group of a middle stage).
struct comm_group {
    int rank, size;
    const struct comm_ops *ops;
    void *impl;
    double busy_s; // seconds this rank spent in the group's blocking calls and waits
};

// Fills g with the group of this rank alone: all-reduce and broadcast leave
// the buffer as it is, reduce-scatter and all-gather copy send to recv, and
// send/recv (blocking or not) have no peer: a message to itself is an error.
// Needs no MPI and no free (comm_group_free is a no-op).
void comm_self_init(struct comm_group *g);

// Releases what the group holds and zeroes it. Safe on a zeroed group.
void comm_group_free(struct comm_group *g);

// Whether g's operations are ordered with the backend's compute stream
// (struct comm_ops.stream_ordered): then a caller skips the
// backend_synchronize before a collective on backend buffers. False for NULL.
bool comm_stream_ordered(const struct comm_group *g);

// Makes be's queued compute visible to g's next operation on backend
// buffers: backend_synchronize(be) unless g orders itself after the compute
// stream (comm_stream_ordered: NCCL's stream waits on an event instead).
// The one place the trainer's TP, DP, ZeRO, FSDP and ring collectives take
// that decision.
void comm_order_after_compute(const struct comm_group *g, struct backend *be);

// struct comm_ops.check of g: 0 for NULL, a group this rank is not in, or
// an implementation without the entry (MPI, self).
int comm_check(struct comm_group *g, char *msg, size_t cap);

// The checked wrappers; see struct comm_ops for each one's contract.
void comm_all_reduce(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                     enum comm_op op);
void comm_all_reduce_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype,
                           enum comm_op op, struct comm_request *req);
// Completion of any request; both are no-ops on a request already complete.
void comm_wait(struct comm_request *req);
bool comm_test(struct comm_request *req);
// The names from before point-to-point requests existed: comm_wait, comm_test.
void comm_all_reduce_wait(struct comm_request *req);
bool comm_all_reduce_test(struct comm_request *req);
void comm_reduce_scatter(struct comm_group *g, const void *send, void *recv, size_t count,
                         enum dtype dtype, enum comm_op op);
void comm_all_gather(struct comm_group *g, const void *send, void *recv, size_t count,
                     enum dtype dtype);
void comm_reduce_scatter_start(struct comm_group *g, const void *send, void *recv, size_t count,
                               enum dtype dtype, enum comm_op op, struct comm_request *req);
void comm_all_gather_start(struct comm_group *g, const void *send, void *recv, size_t count,
                           enum dtype dtype, struct comm_request *req);
void comm_broadcast(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int root);
void comm_send(struct comm_group *g, const void *buf, size_t count, enum dtype dtype, int peer,
               int tag);
void comm_recv(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
               int tag);
void comm_send_start(struct comm_group *g, const void *buf, size_t count, enum dtype dtype,
                     int peer, int tag, struct comm_request *req);
void comm_recv_start(struct comm_group *g, void *buf, size_t count, enum dtype dtype, int peer,
                     int tag, struct comm_request *req);
void comm_barrier(struct comm_group *g);
void comm_all_to_all_v(struct comm_group *g, const void *send, const size_t *send_counts,
                       const size_t *send_displs, void *recv, const size_t *recv_counts,
                       const size_t *recv_displs, enum dtype dtype);

// Agrees over g (host buffers: an MPI or self group) on whether any member
// failed, and tells every member why. Collective: each member passes its own
// status `mine` and, when it failed, err holding its reason. Returns
// STATUS_OK when none failed. Else returns on every member the worst status
// (the largest enum value) and sets err->msg to "WHAT failed on K of N ranks:
// rank R (host H): REASON; rank R2 (host H2): REASON2" (group ranks in order,
// each failing rank's own message, ranks with the same host and message
// sharing one entry, "ranks 0, 1 (host H): REASON"; as many as fit in err->msg: the caller's
// rank 0 prints it); a failing rank whose reason did not fit prints it itself
// to stderr ("trident: [rank R, host H] WHAT: REASON"), so that no rank's
// reason is lost. Cost: an all-gather of one int64 per rank; on failure one
// more of 1 KiB + the host name per rank.
enum status comm_agree(struct comm_group *g, enum status mine, const char *what,
                       struct error *err);

#endif

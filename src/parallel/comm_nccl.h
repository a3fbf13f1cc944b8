// comm_nccl.h: struct comm_group on NCCL (src/parallel/comm.h), built only with
// `make CUDA=1`. Buffers are device memory of the CUDA backend.
//
// Streams: each group has its own communication stream (so each kind of
// traffic: TP, DP, PP, the embedding group), the TP and PP ones at the
// device's highest priority (topology_init_device): a blocking TP collective
// or a pipeline message does not wait behind the data-parallel buckets
// started before it, nor a stage's last gradient send behind its own DP
// all-reduce. NCCL does not promise that kernels of different communicators
// run at the same time; trident stays deadlock-free without it because
// every rank issues the operations of all its groups in one program order
// (the same schedule on the ranks that share two groups), so no rank's
// device waits in one group for what another rank queued behind an
// operation of a second group. (test_comm_nccl --streams breaks that order
// on purpose to show the streams are independent; it runs on the
// emulation.)
//
// Ordering: an operation is enqueued on its group's communication stream
// after the work already enqueued on the backend's compute stream (an event),
// and the compute stream waits for it (another event), so kernels launched
// after a blocking call see its result without the host waiting.
// all_reduce_start leaves out the second wait until all_reduce_wait;
// all_reduce_test polls. barrier synchronizes both streams, then MPI_Barrier.
// send/recv (blocking): each is one NCCL group (ncclGroupStart/End), with
// the deferred sends below.
// send_start/recv_start (the pipeline's messages) are deferred: waiting on
// one enqueues every deferred send and the waited-for operation together in
// one ncclGroupStart/End; test never enqueues (comm_nccl.c says why: a
// receive enqueued ahead would hold the stream). A deferred operation is
// ordered after the compute enqueued before its start (an event recorded
// there: the send's producer), not after what was enqueued later, up to the
// wait that enqueues it. NCCL has no tags (tag is
// checked, then ignored): the messages from one peer must be consumed in the
// order that peer sent them, i.e. one stream of messages per pair of ranks
// and direction (the trainer keeps pp = 2 with virtual stages, where
// activations and gradients share a direction, on MPI).
// all_to_all_v (expert parallelism's token exchange): one NCCL group of a
// send and a receive per peer with a non-zero count, the chunk to itself a
// device copy on the communication stream; ordered and blocking as the
// other blocking collectives (the host does not wait). Since NCCL matches
// each peer's messages in order, a rank must not call it while it has
// started send/recv on the same group not yet waited on (CHECK: exit 1).
// Requests: one pair of events per operation in flight, from a pool that
// grows (doubling) when all are in use: any number may be in flight.
//
// Errors: a NCCL call that fails, or an asynchronous error of the
// communicator (ncclCommGetAsyncError: a failed kernel, a dead peer, a
// network error), polled in every wait and test and while the host blocks
// (barrier, free), aborts the communicator (ncclCommAbort) and ends the job
// with exit 1: "NCCL error on the dp group (NCCL rank 1 of 2, device 1, host
// H) in WHERE: NCCL's error string (NCCL N; ncclGetLastError)", printed
// after a grace of 1 s during which the peers report their side. While the
// host blocks elsewhere (backend_synchronize, a copy to the host), the
// watchdog polls through comm_check (topology_check_device_groups).
#ifndef TRIDENT_COMM_NCCL_H
#define TRIDENT_COMM_NCCL_H

#include <stdbool.h>

#include "comm.h"
#include "kernels/ops.h"

// Fills g with a NCCL communicator over the ranks of mpi_group (an MPI group
// from comm_mpi_init, which keeps ownership of its MPI_Comm and must outlive
// g): rank 0 of the group creates the unique id and broadcasts it over the
// group's MPI communicator. be: the CUDA backend of this rank (its device,
// chosen from the node-local rank, and its compute stream; be must outlive
// g). name: the group's kind for messages ("tp", "dp", "pp", "embed"; copied,
// up to 15 bytes). The group's communication stream is created here, at the
// device's highest priority when high_priority (TP and PP: on the critical
// path), else the lowest. A group this rank is not a member of
// (mpi_group->size == 0) gives a group of size 0.
// Errors: CUDA and NCCL failures end the job (CHECK_CUDA, CHECK_NCCL).
void comm_nccl_init(struct comm_group *g, const struct comm_group *mpi_group, struct backend *be,
                    const char *name, bool high_priority);

#endif

// comm_nccl.h: struct comm_group on NCCL (src/parallel/comm.h), built only with
// `make CUDA=1`. Buffers are device memory of the CUDA backend.
//
// Ordering: an operation is enqueued on the backend's communication stream
// after the work already enqueued on its compute stream (an event), and the
// compute stream waits for it (another event), so kernels launched after a
// blocking call see its result without the host waiting. all_reduce_start
// leaves out the second wait until all_reduce_wait; all_reduce_test polls.
// barrier synchronizes both streams, then MPI_Barrier.
// send/recv (blocking): each is one NCCL group (ncclGroupStart/End), with
// the deferred sends below.
// send_start/recv_start (the pipeline's messages) are deferred: waiting on
// one enqueues every deferred send and the waited-for operation together in
// one ncclGroupStart/End; test never enqueues (comm_nccl.c says why: a
// receive enqueued ahead would hold the stream). NCCL has no tags (tag is
// checked, then ignored): the messages from one peer must be consumed in the
// order that peer sent them, i.e. one stream of messages per pair of ranks
// and direction (the trainer keeps pp = 2 with virtual stages, where
// activations and gradients share a direction, on MPI).
#ifndef TRIDENT_COMM_NCCL_H
#define TRIDENT_COMM_NCCL_H

#include "comm.h"
#include "kernels/ops.h"

// Fills g with a NCCL communicator over the ranks of mpi_group (an MPI group
// from comm_mpi_init, which keeps ownership of its MPI_Comm and must outlive
// g): rank 0 of the group creates the unique id and broadcasts it over the
// group's MPI communicator. be: the CUDA backend of this rank (its device,
// chosen from the node-local rank, and its streams). A group this rank is not
// a member of (mpi_group->size == 0) gives a group of size 0.
void comm_nccl_init(struct comm_group *g, const struct comm_group *mpi_group, struct backend *be);

#endif

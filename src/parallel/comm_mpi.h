// comm_mpi.h: struct comm_group over an MPI communicator (src/parallel/comm.h).
// Buffers are host memory (the CPU backend).
#ifndef TRIDENT_COMM_MPI_H
#define TRIDENT_COMM_MPI_H

#include <mpi.h>

#include "comm.h"

// Fills g with the group of comm and takes ownership of it: comm_group_free
// frees comm. comm == MPI_COMM_NULL (this rank is not a member) gives a group
// of size 0 that every wrapper rejects.
void comm_mpi_init(struct comm_group *g, MPI_Comm comm);

// The communicator behind an MPI group (e.g. to broadcast a NCCL unique id).
MPI_Comm comm_mpi_handle(const struct comm_group *g);

// What MPI itself allocates is bounded (docs/design.md §5). OpenMPI's
// collectives keep temporaries of about their message's size while they run
// (measured, OpenMPI 4.1, shared memory: a blocking all-reduce half its
// buffer, a reduce-scatter up to twice its whole send buffer on group rank 0,
// a non-blocking all-reduce its buffer on the ranks that receive, until it
// completes), so a group sends
// - every blocking all-reduce and reduce-scatter in calls of at most
//   COMM_MPI_CHUNK_BYTES of message (a reduce-scatter's whole send buffer;
//   its pieces staged in one buffer of that size, allocated at first use);
// - every non-blocking all-reduce as a queue of chunks of that size, of which
//   at most COMM_MPI_WINDOW_BYTES are in flight (one chunk always may).
// All-gather and broadcast hold no temporary (measured) and go whole, and so
// do the non-blocking reduce-scatter and all-gather (ZeRO-2/3's units): an
// all-gather holds none, a reduce-scatter a temporary of its whole send
// buffer on group rank 0 until it completes, which the caller bounds by the
// reduce-scatters it keeps in flight (fsdp.c: two units) and the plan counts.
// A buffer of at most a chunk goes in one call, as before the bound; a larger
// one is reduced chunk by chunk, each element over the same ranks (bit-identical
// for a group of 2, whose sum has one order; for more ranks MPI picks its
// algorithm by message size, so the order of the sum may differ from one call's).
#define COMM_MPI_CHUNK_BYTES ((size_t)8 << 20)
#define COMM_MPI_WINDOW_BYTES ((size_t)16 << 20)

// Test hook: g's chunk and window (bytes; the defaults above), set while no
// non-blocking all-reduce is in flight. Errors: a fatal check otherwise.
void comm_mpi_set_limits(struct comm_group *g, size_t chunk_bytes, size_t window_bytes);

// The bytes MPI may hold at once on a rank whose largest group has
// group_size ranks: 0 for 1; else twice a chunk (a blocking reduction on one
// group), plus the window when the rank runs non-blocking all-reduces (the
// data-parallel gradient buckets), plus a chunk of reduce-scatter staging
// when it reduce-scatters (ZeRO, sequence parallelism), plus
// nonblocking_reduce_scatter_bytes: the send bytes of the non-blocking
// reduce-scatters it keeps in flight at most (group rank 0 holds that much;
// the others none). An upper bound for `trident plan`.
size_t comm_mpi_plan_bytes(int group_size, bool nonblocking_all_reduce, bool reduce_scatter,
                           size_t nonblocking_reduce_scatter_bytes);

#endif

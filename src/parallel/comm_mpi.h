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

#endif

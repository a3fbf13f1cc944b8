// nccl_fault.h (emulation only): the fault hook of the emulated NCCL, for
// tests of how trident meets a failed collective (src/parallel/comm_nccl.c:
// ncclCommGetAsyncError polled in waits and by the watchdog, ncclCommAbort,
// exit 1 on every rank naming the failed rank and NCCL's error).
//
// TRIDENT_FAULT=nccl:N[@RANK] (the syntax of src/ckpt/durable.h, which
// accepts and otherwise ignores this kind): on world rank RANK (every rank
// without @RANK), the Nth NCCL operation the process queues (1-based;
// collectives, sends and receives, counted when called, over all its
// communicators) fails on its stream without running (nccl_emu.cpp): its
// communicator's asynchronous error becomes ncclSystemError, with
// ncclGetLastError "TRIDENT_FAULT=nccl:N: ...". The other members of that
// communicator then see ncclRemoteError from ncclCommGetAsyncError, naming
// the failed member's rank, world rank and host, as NCCL's peers of a dead
// rank do. ncclCommAbort of a communicator that failed (here or at a peer)
// returns at once and leaves its MPI communicator alone (a worker may still
// be blocked in it; the process is about to exit).
//
// The members share a small board in POSIX shared memory (one segment per
// communicator, made at ncclCommInitRank only when TRIDENT_FAULT is an nccl
// fault: a broadcast and barriers over the new communicator; all ranks of
// the emulation run on one host), so the failure reaches the peers without
// MPI, from any thread (the watchdog's polls while the main thread blocks).
#ifndef TRIDENT_CUDA_EMU_NCCL_FAULT_H
#define TRIDENT_CUDA_EMU_NCCL_FAULT_H

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <stddef.h>

#include "nccl.h"

struct emu_nccl_fault;

// Counts an operation queued by this process; true for the one that must
// fail, with its description in msg ("TRIDENT_FAULT=nccl:N: ...").
bool emu_nccl_fault_take(char *msg, size_t cap);
// Collective over mpi (the new communicator's members, in NCCL rank order):
// the shared board of the communicator; NULL unless TRIDENT_FAULT is nccl:...
emu_nccl_fault *emu_nccl_fault_attach(MPI_Comm mpi, int rank, int nranks);
// This member's communicator failed (why: ncclGetLastError's text); its
// peers' emu_nccl_fault_remote report it. f may be NULL (no board).
void emu_nccl_fault_post(emu_nccl_fault *f, const char *why);
// ncclRemoteError with msg naming the first peer that failed or aborted,
// else ncclSuccess (also for f == NULL).
ncclResult_t emu_nccl_fault_remote(emu_nccl_fault *f, char *msg, size_t cap);
// Marks this member aborted; true when the communicator failed here or at
// a peer (then the caller leaves its MPI communicator alone).
bool emu_nccl_fault_abort(emu_nccl_fault *f);
// Unmaps the board (NULL: nothing).
void emu_nccl_fault_detach(emu_nccl_fault *f);

#endif

// nccl_fault.h (emulation only): the fault hook of the emulated NCCL, for
// tests of how trident meets a failed collective (src/parallel/comm_nccl.c:
// ncclCommGetAsyncError polled in waits and by the watchdog, ncclCommAbort,
// exit 1 on every rank naming the rank and NCCL's error).
//
// TRIDENT_FAULT=nccl:N[@RANK] (the syntax of src/ckpt/durable.h, which
// accepts and otherwise ignores this kind): on world rank RANK (every rank
// without @RANK), the Nth NCCL operation the process issues (1-based;
// collectives, sends and receives, counted when called, over all its
// communicators) fails as a broken transport does on a GPU: it never
// completes (the calling thread blocks for ever: the emulation's streams
// run on the caller), and its communicator's asynchronous error becomes
// ncclSystemError ("TRIDENT_FAULT=nccl:N: ..." from ncclGetLastError). The
// other members of that communicator then see ncclRemoteError from
// ncclCommGetAsyncError, naming the failed member's rank, world rank and
// host, as NCCL's peers of a dead rank do. ncclCommAbort of a faulted or
// aborted communicator returns at once and leaves its MPI communicator alone
// (a thread may still be blocked in it; the process is about to exit).
//
// The members share a small board in POSIX shared memory (one segment per
// communicator, made at ncclCommInitRank only when TRIDENT_FAULT is an nccl
// fault: a broadcast and a barrier over the new communicator; all ranks of
// the emulation run on one host), so the failure reaches the peers without
// MPI, from any thread (the watchdog's polls while the main thread is
// blocked in MPI).
#ifndef TRIDENT_CUDA_EMU_NCCL_FAULT_H
#define TRIDENT_CUDA_EMU_NCCL_FAULT_H

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <stddef.h>

#include "nccl.h"

struct emu_nccl_fault;

// True when TRIDENT_FAULT is nccl:N[@RANK] (read once).
bool emu_nccl_fault_enabled();
// Collective over mpi (the new communicator's members, in NCCL rank order):
// the shared board of the communicator. Returns NULL when not enabled.
emu_nccl_fault *emu_nccl_fault_attach(MPI_Comm mpi, int rank, int nranks);
// An NCCL operation is issued on a communicator with board f (may be NULL):
// counts it; the faulting one marks f failed and never returns.
void emu_nccl_fault_on_submit(emu_nccl_fault *f);
// The asynchronous error of f's communicator (ncclSuccess for NULL), its
// message in msg.
ncclResult_t emu_nccl_fault_async(emu_nccl_fault *f, char *msg, size_t cap);
// Marks this member aborted; true when the communicator failed (here or at
// a peer), so the caller must not touch its MPI communicator.
bool emu_nccl_fault_abort(emu_nccl_fault *f);
// Unmaps the board (NULL: nothing).
void emu_nccl_fault_detach(emu_nccl_fault *f);

#endif

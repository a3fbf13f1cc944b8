// mpi_util.h: MPI error checks and whole-job exits (docs/design.md §8: every rank
// exits non-zero within seconds, none is left hanging).
//
// Exit codes under OpenMPI 4.1 mpirun (verified by tests/e2e/comm_mpi.sh):
// after MPI_Abort(MPI_COMM_WORLD, code) on any rank, mpirun kills every rank
// and itself exits with that code, e.g. 2 for bad input; when several ranks
// abort, all with the same code, mpirun returns that code too. (mpirun also
// ends the job when a rank exits without MPI_Finalize; MPI_Abort is used
// because the standard guarantees it, under srun as well.)
#ifndef TRIDENT_MPI_UTIL_H
#define TRIDENT_MPI_UTIL_H

#include <mpi.h>

#include "common.h"

// Checks an MPI call; on failure prints the call, MPI's error string,
// file:line and the rank, and aborts the job with exit code 1. Needs
// mpi_util_init (MPI's default handler aborts before CHECK_MPI could speak).
#define CHECK_MPI(call)                                                        \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ != MPI_SUCCESS) mpi_fail(rc_, #call, __FILE__, __LINE__);      \
    } while (0)

_Noreturn void mpi_fail(int rc, const char *call, const char *file, int line);

// MPI_Init, except in the emulated CUDA build (-DTRIDENT_CUDA_EMU): there
// MPI_Init_thread with MPI_THREAD_MULTIPLE, since the emulated NCCL calls MPI
// from the streams' worker threads while the host thread calls it too
// (tests/cuda_emu/nccl.h). Returns STATUS_OK, or STATUS_RUNTIME with err
// naming the thread level MPI provides when it is below that (MPI is
// initialised either way; the caller ends the process).
enum status mpi_util_start(int *argc, char ***argv, struct error *err);

// After MPI_Init: makes MPI errors on world (and on communicators split from
// it later) return to CHECK_MPI, sets g_log_rank to the world rank, and
// installs mpi_abort_on_fatal with fatal_set_hook.
void mpi_util_init(MPI_Comm world);

// fatal_exit's hook: MPI_Abort(MPI_COMM_WORLD, code) when MPI is running, so a
// fatal error on one rank ends the whole job instead of leaving peers blocked
// in a collective. Returns (and exit() follows) when MPI is not running.
void mpi_abort_on_fatal(int code);

// Ends the whole job with code (2 for bad input). A rank that passes msg
// prints "trident: [rank R] msg" to stderr. Safe when only some ranks detect
// the error: MPI_Abort kills the others wherever they are blocked. When every
// rank detects it, pass msg on one rank only (rank 0) and NULL elsewhere: a
// rank without a message waits a second before aborting so that the reporting
// rank's message gets out first. Without MPI running it prints and exits.
_Noreturn void mpi_exit_all(int code, const char *msg);

// True between MPI_Init and MPI_Finalize.
int mpi_is_running(void);

#endif

// nccl.h (emulated): the NCCL API that trident calls, carried out over MPI on
// the emulated device memory (host memory, cuda_runtime_api.h), so that the
// real src/parallel/comm_nccl.c and the CUDA backend run multi-rank on CPUs
// (`make EMU=1`, docs/cuda.md). Plain C declarations; defined in nccl_emu.cpp.
// Enum values are NCCL 2.x's.
//
// Semantics kept from NCCL:
// - Reductions: ncclSum, ncclProd, ncclMax, ncclMin on int8/uint8, int32,
//   uint32, int64, uint64, float16, bfloat16, float32, float64. FP16 and BF16
//   are combined two operands at a time in FP32 and rounded once per combine
//   (to nearest, ties to even), as NCCL's kernels do; the other types use
//   MPI's built-in operations, so results equal an MPI_Allreduce of the same
//   data (what comm_mpi.c computes). ncclAvg is not emulated (ncclInvalidArgument).
// - In place: all-reduce and broadcast with sendbuff == recvbuff;
//   reduce-scatter with recvbuff == sendbuff + rank * recvcount; all-gather
//   with sendbuff == recvbuff + rank * sendcount.
// - Group calls: between ncclGroupStart and the outermost ncclGroupEnd,
//   operations are only recorded (buffers untouched); ncclGroupEnd issues
//   them together: every send and receive of the group is posted first
//   (non-blocking), then the collectives run in call order, then all
//   point-to-point transfers complete. Paired send/recv in one group thus
//   never deadlock, whatever their order. A send or receive outside a group
//   is a group of its own (as in NCCL).
// - Stream ordering: every operation (a group: all of its operations, as one
//   unit) is queued on its stream (runtime_emu.cpp) and carried out by that
//   stream's worker thread when the stream reaches it, after the host call
//   has returned (argument errors are returned by the call; a failure of
//   MPI on the worker becomes the communicators' ncclCommGetAsyncError and is
//   said on stderr). A collective or a receive blocks its stream's worker
//   until the peers' streams reach their side (MPI), as NCCL's kernels
//   block a GPU stream: a collective completes only when every member's
//   stream has reached it. A group on several streams runs on the first;
//   the others wait for it (events). Sends are buffered: when the stream
//   reaches a send its data is copied and the stream goes on (the copy is
//   freed once MPI has delivered it, ncclCommDestroy waits for the
//   communicator's; while sends are in flight a progress thread tests them
//   every millisecond, so that a sender whose threads all wait elsewhere
//   still completes a send above MPI's eager limit). MPI is called from worker threads and the host
//   thread: MPI_THREAD_MULTIPLE (src/base/mpi_util.h, mpi_util_start).
// - Fault injection: TRIDENT_FAULT=nccl:N[@RANK] (nccl_fault.h) makes the
//   Nth operation (1-based, call order) queued by world rank RANK (every
//   rank without @RANK) fail on its stream without running:
//   ncclCommGetAsyncError answers ncclSystemError (ncclGetLastError names
//   the setting), later operations on that communicator fail too
//   (ncclInvalidUsage), and the peers block in the collective as they would
//   for a dead rank, while their ncclCommGetAsyncError answers
//   ncclRemoteError naming the failed rank (as NCCL's peers of a dead rank
//   eventually do).
//
// Communicator creation (how ncclCommInitRank finds its peers): ncclGetUniqueId
// writes into the id the caller's rank in MPI_COMM_WORLD (the id's "root")
// and a per-process sequence number. ncclCommInitRank(comm, nranks, id, rank)
// then meets its peers by point-to-point messages on MPI_COMM_WORLD only,
// never by a collective over WORLD (trident creates communicators for
// sub-groups, each rank only those it is in, and not in one global order):
// every member but the root sends (rank, world rank) to the root with tag
// 2 * seq; the root collects nranks - 1 of them, and sends the table of world
// ranks back to each with tag 2 * seq + 1; then the members call
// MPI_Comm_create_group(MPI_COMM_WORLD, their group in NCCL rank order,
// tag = seq), which is collective over the members only. The sequence number
// is unique per root, so concurrent creations on different groups cannot take
// each other's messages. Requirements (all met by trident's comm_nccl.c, where
// the group's rank 0 creates the id and broadcasts it): MPI is initialised,
// the process that called ncclGetUniqueId is itself a member, trident sends
// nothing point-to-point on MPI_COMM_WORLD with these tags (it uses its own
// communicators), and, as with NCCL, every member calls ncclCommInitRank for
// the id (a missing member hangs the others).
#ifndef TRIDENT_CUDA_EMU_NCCL_H
#define TRIDENT_CUDA_EMU_NCCL_H

#include <stddef.h>

#include "cuda_runtime_api.h"

#ifdef __cplusplus
extern "C" {
#endif

// Tests tell the emulation from NCCL by this (e.g. exact sums against MPI's).
#define TRIDENT_NCCL_EMULATED 1
#define NCCL_MAJOR 2
#define NCCL_MINOR 19
#define NCCL_PATCH 0
#define NCCL_VERSION_CODE 21900
#define NCCL_UNIQUE_ID_BYTES 128

typedef struct emu_nccl_comm *ncclComm_t;
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0, ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2, ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6, ncclHalf = 6,
    ncclFloat32 = 7, ncclFloat = 7,
    ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10
} ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
const char *ncclGetErrorString(ncclResult_t result);
// The message of the last failure in this process (a sentence, never NULL).
const char *ncclGetLastError(ncclComm_t comm);

// id: the caller's world rank and a fresh sequence number (see above).
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
// Blocks until all nranks members have called it with the same id.
// ncclInvalidUsage when MPI is not initialised, ncclInvalidArgument for a bad
// rank or nranks or an id from no ncclGetUniqueId.
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
// Free the communicator (its MPI communicator, when MPI is still running).
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
// The device that was current (cudaSetDevice) when the communicator was made.
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
// The first failure of an operation queued on this communicator
// (ncclSystemError for the injected fault), else ncclRemoteError when a
// peer's communicator failed or aborted under TRIDENT_FAULT=nccl (nccl_fault.h;
// ncclGetLastError then names the peer's rank, world rank and host), else
// ncclSuccess.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error);

// count: elements of datatype in each of sendbuff and recvbuff.
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
// sendbuff: (nranks * recvcount,); recvbuff: (recvcount,) the reduction of chunk rank.
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
// sendbuff: (sendcount,); recvbuff: (nranks * sendcount,) chunk r from rank r.
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
// root's sendbuff to every rank's recvbuff (count elements).
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
// Reduction of every rank's sendbuff into root's recvbuff.
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
// Point-to-point with communicator rank peer; matched in call order per pair.
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif

// cuda_check.h: CHECK_CUDA / CHECK_CUBLAS / CHECK_NCCL for the CUDA backend
// and the NCCL comm table. A failed call is fatal (exit 1): the message names
// the statement, file:line, the rank (fatal_exit prints "[rank R]") and the
// library's error string. Include the library's header before this one.
#ifndef TRIDENT_CUDA_CHECK_H
#define TRIDENT_CUDA_CHECK_H

#include "base/common.h"

#define CHECK_CUDA(stmt)                                                       \
    do {                                                                       \
        cudaError_t e_ = (stmt);                                               \
        if (e_ != cudaSuccess)                                                 \
            fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s: CUDA error %s: %s", #stmt, \
                       cudaGetErrorName(e_), cudaGetErrorString(e_));         \
    } while (0)

#define CHECK_CUBLAS(stmt)                                                     \
    do {                                                                       \
        cublasStatus_t s_ = (stmt);                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                       \
            fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s: cuBLAS error %d: %s", #stmt, \
                       (int)s_, cublasGetStatusString(s_));                   \
    } while (0)

#define CHECK_NCCL(stmt)                                                       \
    do {                                                                       \
        ncclResult_t r_ = (stmt);                                              \
        if (r_ != ncclSuccess)                                                 \
            fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s: NCCL error %d: %s", #stmt, \
                       (int)r_, ncclGetErrorString(r_));                      \
    } while (0)

// Checks the last kernel launch (launch configuration errors; faults inside a
// kernel surface at the next synchronizing call).
#define CHECK_LAUNCH() CHECK_CUDA(cudaGetLastError())

#endif

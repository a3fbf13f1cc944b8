// cuda_runtime_api.h (emulated): the part of the CUDA runtime API that
// trident's host code calls, as plain C declarations, so that C files
// (src/parallel/comm_nccl.c, kernels/cuda/cuda_check.h users) compile against
// it with gcc in the emulated build (`make EMU=1`, docs/cuda.md). Defined in
// cuda_emu.cpp (extern "C"). The kernel side (dim3, threadIdx, launches,
// __half, __nv_bfloat16) is C++ and lives in cuda_emu.h.
//
// The emulated device: device memory is host memory (cudaMalloc fills fresh
// memory with 0xff bytes: NaN as FP32, BF16 and FP16, so a kernel that reads
// what nothing wrote shows it). Streams behave as a GPU's (runtime_emu.cpp):
// each stream is a queue run by a worker thread of its own after the host has
// moved on; kernel launches, cudaMemcpyAsync, cudaMemsetAsync, cublasLtMatmul
// and NCCL operations are queued on their stream; the legacy default stream
// (0) is ordered with the blocking streams (not with cudaStreamNonBlocking
// ones); events are pending until their stream reaches them, and
// cudaStreamWaitEvent orders one stream after another's record. cudaMemcpy
// into pageable host memory returns once the copy is done, from pageable
// memory once the source is staged; cudaMemcpy and cudaMemset on device
// memory are queued on the legacy stream (asynchronous, as CUDA documents).
// cudaFree and cudaFreeHost wait for the whole device first. Pinned memory
// (cudaMallocHost, cudaHostAlloc) is checked: a host access to a buffer that
// an asynchronous copy into it (or, for writes, from it) has pending and the
// host has not synchronised with aborts with a message (pinned_emu.cpp).
// TRIDENT_EMU_DELAY=<max_us>[:seed] makes each worker sleep a random
// 0..max_us microseconds before each operation. The number of devices is
// TRIDENT_EMU_DEVICES (default 8: one "node" with 8 GPUs, so that up to 8
// ranks each get their own device index); all of them share the host's
// memory and the streams of a process (cudaDeviceSynchronize waits for all).
#ifndef TRIDENT_CUDA_EMU_RUNTIME_API_H
#define TRIDENT_CUDA_EMU_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2 };
enum { cudaHostAllocDefault = 0 };
enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16, cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76
};
// The fields of the real struct that trident reads (the real one has many more).
struct cudaDeviceProp {
    char name[256];
    int major, minor;
};
typedef enum cudaMemcpyKind cudaMemcpyKind_t;
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

// Devices: TRIDENT_EMU_DEVICES of them (default 8), 4 "SMs" each, named
// "emulated GPU", of compute capability TRIDENT_EMU_CC (major.minor, default
// 9.0: an H100's; e.g. 8.0 to see what an A100 is refused).
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
// "0000:XX:00.0", XX the device's physical index in hex: the device-th entry
// of CUDA_VISIBLE_DEVICES when it lists numbers (as a per-task binding sets
// it), else device; so ranks that see different GPUs get different ids.
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

// Streams and events: queues run by worker threads (see above).
// Priorities: least 0, greatest -5 (an H100's range); a kernel of a
// higher-priority stream takes the one-kernel-at-a-time lock first.
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority);
cudaError_t cudaStreamGetPriority(cudaStream_t s, int *priority);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
// cudaErrorNotReady while work queued on s has not completed.
cudaError_t cudaStreamQuery(cudaStream_t s);
// Work queued on s after this call waits for e's most recent record (none: no wait).
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
// cudaErrorNotReady until the stream of its last record has reached it.
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
// Milliseconds between the times the streams' workers reached the two records
// (cudaErrorNotReady before both are complete).
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

// Memory: host memory, 256-byte aligned (pinned: page-aligned), fresh allocations filled with 0xff.
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFree(void *p);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemset(void *dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);

// ---- counters of the emulation (not CUDA API) ----------------------------------
// TRIDENT_EMU_STATS=1 prints the counters of the process on stderr at exit;
// any other value is a file that receives them as one JSON object at exit
// ("%p" in it becomes the process id): launches (kernel launches, cuBLASLt
// matmuls included), gemms, gemm_flops (2mnk each), traffic_bytes (the
// modelled DRAM traffic that launch sites declare with emu_traffic), copies
// and copy_bytes (cudaMemcpy*, cudaMemset*), collectives (NCCL operations),
// max_queued (the most operations one stream had queued and not completed:
// how far the host ran ahead), d2h_copies (device-to-host cudaMemcpy*),
// syncs (cudaStreamSynchronize, cudaDeviceSynchronize: host waits for all
// queued work; not event waits), mallocs and frees (cudaMalloc, cudaFree of
// device memory), pageable_h2d (host-to-device copies whose source is not
// from cudaMallocHost/cudaHostAlloc), lt_setups (cuBLASLt descriptors,
// layouts and preferences created and heuristic queries made) and
// lt_unaligned (cuBLASLt matmuls with an operand not 256-byte aligned).
// TRIDENT_EMU_COUNT_ONLY=1 counts everything and executes nothing: no kernel
// body, matmul, copy, memset or collective runs, and cudaMalloc hands out
// untouched zero pages (mmap), so a model larger than the host's memory can
// be stepped to count its launches and traffic (the numbers it trains on are
// meaningless). Both are read once, at the first call that needs them.
// Declares bytes of DRAM traffic (read + written, as the kernel's author
// models it) for the launch that follows; kernels/cuda wraps it as CUDA_TRAFFIC.
void emu_traffic(unsigned long long bytes);
// Counts one cuBLASLt matmul of m x n x k (cublaslt_emu.cpp).
void emu_count_gemm(unsigned long long m, unsigned long long n, unsigned long long k);
// Counts one cuBLASLt descriptor, layout or preference created, or one
// heuristic query (cublaslt_emu.cpp).
void emu_count_lt_setup(void);
// Counts one cuBLASLt matmul with an operand address not a multiple of 256
// bytes (lt_unaligned: the heuristic then may not pick its best kernels).
void emu_count_lt_unaligned(void);
// The counter of that name so far (launches, copies, d2h_copies, syncs,
// mallocs, frees, pageable_h2d, lt_setups, lt_unaligned, gemms), for checks that read it between
// two calls (tests/cuda_emu/check_host_work.cpp); aborts on another name.
unsigned long long emu_stat(const char *name);
// Counts one NCCL operation (nccl_emu.cpp).
void emu_count_collective(void);
// True under TRIDENT_EMU_COUNT_ONLY=1 (see above).
int emu_count_only(void);

// ---- test hooks of the emulation (not CUDA API) ----------------------------------
// Holds stream s at this point of its queue (what is queued after waits)
// until emu_gate_open(g): a test can then see what must not have run yet.
// The gate is freed once the stream has passed it; do not use g after
// emu_gate_open. tests/cuda_emu/check_streams.cpp shows the use.
struct emu_gate;
struct emu_gate *emu_gate_close(cudaStream_t s);
void emu_gate_open(struct emu_gate *g);
// Operations queued on s (0: the legacy stream) and not completed yet.
unsigned long long emu_stream_pending(cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

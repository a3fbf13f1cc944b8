// cuda_emu.h: just enough of the CUDA runtime, cuda_bf16.h, cuda_fp16.h and
// cuBLASLt to compile kernels/cuda/*.cu as host C++ and run every kernel on
// the CPU: the emulated build (`make EMU=1`, docs/cuda.md). The runtime's C
// API is cuda_runtime_api.h (C files include it too); this header adds the
// kernel side, which is C++.
//
// A launch is queued on its stream (runtime_emu.cpp: each stream is a queue
// run by a worker thread of its own, after the host has moved on, as on a
// GPU); the worker runs the grid's blocks one after another, one launch at a
// time in the process (__shared__ is `static`: one block at a time). The
// kernel's arguments are copied into the queued closure at the launch. The
// CUDA threads of a block
// are fibers: each has its own stack and runs until it reaches a barrier
// (__syncthreads, or a warp shuffle, which is a barrier of its warp), then
// the next one runs (cuda_emu.cpp switches stacks in user space, no OS
// thread per CUDA thread). Exact in semantics for kernels that (like trident's)
// keep whole warps together at shuffles; a thread that returns counts as
// arrived at every later barrier of its block (and warp), and a barrier that
// can never complete aborts with a message. Deterministic: the same launch
// interleaves the same way every time (atomicAdd sums in one order).
// cuBLASLt is computed on the host by the stream's worker (cublaslt_emu.cpp).
#ifndef TRIDENT_CUDA_EMU_H
#define TRIDENT_CUDA_EMU_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "cuda_runtime_api.h"

using std::max;
using std::min;
using std::isfinite;
using std::isinf;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 { unsigned x, y, z; };
// Set by the emulation before it runs (or resumes) a CUDA thread.
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

#define warpSize 32
void emu_syncthreads(void);
// The value v of lane src of the calling thread's warp (its own v when src is
// outside [0, 32)): a barrier of the warp before and after the exchange.
uint64_t emu_shfl(uint64_t v, int src);
int emu_lane(void);
// Runs body as every thread of every block of the grid (see the top), with
// shmem bytes of dynamic shared memory, on the calling thread (a stream's
// worker), under the lock that keeps launches one at a time.
void emu_run(dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body);
// Counts a launch (TRIDENT_EMU_STATS) and queues body on stream s (nullptr:
// the legacy default stream) to be run by emu_run on the stream's worker;
// aborts on a block of more than 1024 threads. Nothing is queued under
// TRIDENT_EMU_COUNT_ONLY=1.
void emu_enqueue_launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t s, std::function<void()> body);
// Queues fn on stream s (nullptr: the legacy default stream): the stream's
// worker runs it after everything queued before it on s (and, for the legacy
// stream and blocking streams, the implicit ordering between them), after the
// host has moved on (runtime_emu.cpp). Used by the copies, cuBLASLt and NCCL.
void emu_enqueue(cudaStream_t s, std::function<void()> fn);
// The launch's dynamic shared memory (16-byte aligned, 0xff-filled at each
// launch): the build rewrites `extern __shared__ T name[];` (which the
// preprocessor turned into `extern static T name[];`) to
// `T *name = (T *)emu_dynamic_shared();`.
void *emu_dynamic_shared(void);
void emu_syncwarp(void);
#define __syncwarp(...) emu_syncwarp()
#define __syncthreads() emu_syncthreads()
template <class T> static inline T emu_shfl_t(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = emu_shfl(u, src);
    memcpy(&v, &u, sizeof v);
    return v;
}
// Full warps only (width 32, every lane in the mask): anything else aborts.
void emu_shfl_check(unsigned mask, int width);
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int w = 32) {
    emu_shfl_check(mask, w);
    return emu_shfl_t(v, emu_lane() ^ m);
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int w = 32) {
    emu_shfl_check(mask, w);
    return emu_shfl_t(v, src & 31);
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int w = 32) {
    emu_shfl_check(mask, w);
    return emu_shfl_t(v, emu_lane() + (int)d);
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int w = 32) {
    emu_shfl_check(mask, w);
    return emu_shfl_t(v, emu_lane() - (int)d);
}
float atomicAdd(float *p, float v);
int atomicAdd(int *p, int v);
unsigned long long atomicAdd(unsigned long long *p, unsigned long long v);
// Blocks of a launch run one after another: their writes are ordered already.
static inline void __threadfence(void) {}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// kernel<<<grid, block, shmem, stream>>>(args) is rewritten to
// emu_launch(grid, block, shmem, stream, kernel, args) by the build (the
// Makefile's EMU=1 rule for kernels/cuda/%.cu). The arguments are captured by
// value into the queued closure, as a real launch copies them at the call.
template <class... P, class... A>
void emu_launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t s, void (*k)(P...), A... a) {
    emu_enqueue_launch(grid, block, shmem, s, [=]() { k(a...); });
}
// Launches written with fewer than four configuration arguments (the legacy stream).
template <class... P, class... A>
void emu_launch(dim3 grid, dim3 block, void (*k)(P...), A... a) {
    emu_enqueue_launch(grid, block, 0, nullptr, [=]() { k(a...); });
}
template <class... P, class... A>
void emu_launch(dim3 grid, dim3 block, size_t shmem, void (*k)(P...), A... a) {
    emu_enqueue_launch(grid, block, shmem, nullptr, [=]() { k(a...); });
}
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <class F> static inline cudaError_t cudaFuncSetAttribute(F, enum cudaFuncAttribute, int) {
    return cudaSuccess;
}

// Device intrinsics, as plain host functions (__expf and __logf: glibc has them).
#define __align__(n) alignas(n)
template <class T> static inline T __ldg(const T *p) { return *p; }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
int atomicMax(int *p, int v);
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// ---- cuda_bf16.h --------------------------------------------------------------
struct __nv_bfloat16 { uint16_t x; };
static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h.x = 0x7fc0;
    else h.x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    return h;
}

// ---- cuda_fp16.h ----------------------------------------------------------------
// IEEE binary16, converted as the hardware does (cvt.rn.f16.f32): round to
// nearest, ties to even, subnormals kept, overflow to inf, NaN to the
// canonical 0x7fff. Written independently of kernels/cpu/half.h (the CPU
// backend's conversion), so the emulated test compares two implementations.
struct __half { uint16_t x; };
static inline float __half2float(__half h) {
    int e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff;
    float f = e == 0 ? ldexpf((float)m, -24)             // zero, subnormal
              : e == 31 ? (m ? NAN : INFINITY)           // inf, NaN
              : ldexpf((float)(0x400 | m), e - 25);       // normal: 1.m * 2^(e-15)
    return h.x & 0x8000 ? -f : f;
}
static inline __half __float2half_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    __half h;
    if (a > 0x7f800000u) { h.x = 0x7fff; return h; }
    int e = (int)(a >> 23) - 127;         // unbiased exponent of a normal f
    if (e > 15) { h.x = sign | 0x7c00; return h; } // inf, or >= 2^16
    if (e < -25) { h.x = sign; return h; }         // < 2^-25 (FP32 subnormals too): 0
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;   // 24 bits with the implicit one
    // FP16 keeps 11 of them (normal), fewer below 2^-14 (subnormal, step 2^-24).
    int shift = e >= -14 ? 13 : 13 + (-14 - e);
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++; // a carry moves into the exponent
    // normal: q in [0x400, 0x800], biased exponent e + 15 over the implicit one
    h.x = sign | (uint16_t)(e >= -14 ? ((uint32_t)(e + 14) << 10) + q : q);
    return h;
}

// ---- cuda_runtime.h -------------------------------------------------------------
// The C API is cuda_runtime_api.h (shared with the C files of the emulated
// build); C++ adds the typed overloads, as the real cuda_runtime.h does.
template <class T> static inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
template <class T> static inline cudaError_t cudaMallocHost(T **p, size_t n) { return cudaMallocHost((void **)p, n); }

// ---- cublasLt.h ------------------------------------------------------------------
// Emulated in cublaslt_emu.cpp: the descriptors hold what was set, and
// cublasLtMatmul computes D = alpha op(A) op(B) + beta C column-major on the
// host (FP32, BF16, FP16 storage; FP32 accumulation in order k = 0, 1, ...).
// TRIDENT_EMU_CUBLASLT=0 makes the heuristic find no algorithm (callers then
// take their fallback kernels, as on a GPU where cuBLASLt declines a shape).
typedef int cublasStatus_t;
enum {
    CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
};
// FP8 (CUDA_R_8F_E4M3, CUDA_R_8F_E5M2: OCP E4M3 and E5M2) as cuBLASLt takes
// them on Ada and Hopper: A and B only, not both E5M2, the "TN" layout (A
// transposed, B not), m, n and k multiples of 16, C = D of BF16, FP16 or
// FP32; else the heuristic finds nothing and cublasLtMatmul returns
// CUBLAS_STATUS_NOT_SUPPORTED. The A and B scale pointers (device FP32, read
// when the stream reaches the matmul): D = alpha scale_a scale_b op(A) op(B)
// + beta C, computed as (alpha scale_a scale_b) times the FP32 sum of exact
// products. FAST_ACCUM is accepted (no effect: the sums are FP32 anyway).
typedef enum { CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2 } cudaDataType_t;
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F } cublasComputeType_t;
enum {
    CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
    CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, CUBLASLT_MATMUL_DESC_FAST_ACCUM, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES
};
typedef struct emu_lt *cublasLtHandle_t;
typedef struct emu_lt_layout *cublasLtMatrixLayout_t;
typedef struct emu_lt_desc *cublasLtMatmulDesc_t;
typedef struct emu_lt_pref *cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct { cublasLtMatmulAlgo_t algo; size_t workspaceSize; int state; } cublasLtMatmulHeuristicResult_t;
const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, int attr, const void *buf, size_t n);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, int attr, const void *buf,
                                                    size_t n);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t *results, int *found);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb,
                              const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *D,
                              cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream);

#endif

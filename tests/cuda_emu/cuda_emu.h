// cuda_emu.h: just enough of the CUDA runtime, cuda_bf16.h, cuda_fp16.h and
// cuBLASLt to compile kernels/cuda/*.cu as host C++ and run every kernel on
// the CPU (tests/e2e/cuda_emulated.sh). Each CUDA thread of a block is an OS
// thread; blocks run one after another; __syncthreads and warp shuffles are
// barriers. Slow (a barrier per shuffle), exact in semantics for kernels
// that (like trident's) keep whole warps together and never leave a block
// before a __syncthreads. cuBLASLt's heuristic answers "not supported", so matmul runs
// its fallback kernel. Streams are ignored: every launch completes before it
// returns. Not part of any build but that test.
#ifndef TRIDENT_CUDA_EMU_H
#define TRIDENT_CUDA_EMU_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>

using std::max;
using std::min;
using std::isfinite;

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
struct alignas(16) float4 { float x, y, z, w; }; // 128-bit loads and stores
extern thread_local uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

void emu_syncthreads(void);
float emu_shfl_xor(float v, int lane_mask);
void emu_run(dim3 grid, dim3 block, const std::function<void()> &body);
#define __syncthreads() emu_syncthreads()
float emu_shfl_idx(float v, int src);
static inline float __shfl_xor_sync(unsigned, float v, int m) { return emu_shfl_xor(v, m); }
static inline float __shfl_sync(unsigned, float v, int src) { return emu_shfl_idx(v, src); }
float atomicAdd(float *p, float v);
int atomicAdd(int *p, int v);
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// kernel<<<grid, block, shmem, stream>>>(args) is rewritten to
// emu_launch(grid, block, shmem, stream, kernel, args) by the test script.
typedef struct emu_stream *cudaStream_t;
// Dynamic shared memory: the launch's shmem bytes, one buffer shared by the
// block's threads (blocks run one after another), filled with 0xff bytes (NaN)
// at each launch. cuda_emulated.sh rewrites `extern __shared__ T name[];` to
// `T *name = (T *)emu_dynamic_shared();`.
inline unsigned char *emu_dynamic_shared_buf; // C++17 inline: one for the program
inline size_t emu_dynamic_shared_cap;
static inline void *emu_dynamic_shared(void) { return emu_dynamic_shared_buf; }
static inline void emu_dynamic_shared_set(size_t bytes) {
    if (bytes > emu_dynamic_shared_cap) {
        free(emu_dynamic_shared_buf);
        emu_dynamic_shared_buf = (unsigned char *)aligned_alloc(256, (bytes + 255) / 256 * 256);
        emu_dynamic_shared_cap = bytes;
    }
    if (bytes) memset(emu_dynamic_shared_buf, 0xff, bytes);
}
template <class... P, class... A>
void emu_launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t, void (*k)(P...), A... a) {
    emu_dynamic_shared_set(shmem);
    emu_run(grid, block, [&]() { k(a...); });
}
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <class F> static inline int cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return 0; }

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
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorNotReady = 600, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum { cudaStreamNonBlocking = 1 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount };
static inline const char *cudaGetErrorString(cudaError_t) { return "emulated CUDA error"; }
static inline const char *cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
static inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) { *v = 4; return cudaSuccess; }
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = (cudaStream_t)malloc(1);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
// Device memory is host memory; fresh allocations are filled with 0xff bytes
// (NaN as fp32, bf16 and fp16) so that a kernel reading unwritten memory shows.
static inline cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!*p) return cudaErrorMemoryAllocation;
    memset(*p, 0xff, n);
    return cudaSuccess;
}
template <class T> static inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
static inline cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
template <class T> static inline cudaError_t cudaMallocHost(T **p, size_t n) { return cudaMalloc((void **)p, n); }
static inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
    memmove(d, s, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t) {
    return cudaMemcpy(d, s, n, k);
}
static inline cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
static inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) { return cudaMemset(d, v, n); }

// ---- cublasLt.h ------------------------------------------------------------------
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_SUPPORTED = 15 };
typedef enum { CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F } cudaDataType_t;
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F } cublasComputeType_t;
enum {
    CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES
};
typedef void *cublasLtHandle_t, *cublasLtMatrixLayout_t, *cublasLtMatmulDesc_t, *cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct { cublasLtMatmulAlgo_t algo; size_t workspaceSize; int state; } cublasLtMatmulHeuristicResult_t;
static inline const char *cublasGetStatusString(cublasStatus_t) { return "emulated cuBLAS status"; }
static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = (void *)1; return 0; }
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return 0; }
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t, uint64_t, uint64_t, int64_t) {
    *l = (void *)1;
    return 0;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t) { return 0; }
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t, cudaDataType_t) {
    *d = (void *)1;
    return 0;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t) { return 0; }
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, int, const void *, size_t) { return 0; }
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) { *p = (void *)1; return 0; }
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t) { return 0; }
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, int, const void *, size_t) { return 0; }
static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
    cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
    cublasLtMatmulHeuristicResult_t *, int *found) {
    *found = 0;
    return CUBLAS_STATUS_NOT_SUPPORTED;
}
static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
    cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t, const void *, const void *,
    cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t,
    cudaStream_t) {
    return CUBLAS_STATUS_NOT_SUPPORTED; // never reached: the heuristic found nothing
}

#endif

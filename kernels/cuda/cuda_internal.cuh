// cuda_internal.cuh: internals of the CUDA backend (kernels/cuda/*.cu), not
// part of ops.h: the private state, typed device pointers and the kernels'
// entry points that cuda_backend.cu puts in the table.
//
// Storage dtypes: every float tensor argument may be FP32, BF16 or FP16 on
// its own (e.g. FP32 weight gradients of BF16/FP16 activations). Kernels are
// written once for all three: they take a `dptr` (pointer + dtype) and
// load/store through ld()/st(), converting to and from FP32 (16-bit stores
// round once, to nearest even); the dtype is uniform across a launch, so the
// branch costs a predicate, not divergence. Compute and accumulation are FP32
// (sums over whole tensors: FP64); statistics (rstd, lse, rowmax, partials)
// are FP32.
#ifndef TRIDENT_CUDA_INTERNAL_CUH
#define TRIDENT_CUDA_INTERNAL_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// common.h is C11: give C++ its spelling of _Noreturn.
#ifndef _Noreturn
#define _Noreturn __attribute__((noreturn))
#endif
extern "C" {
#include "base/common.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
}
#include "backend_cuda.h"
#include "cuda_check.h"

// CUDA_TRAFFIC(bytes): the modelled DRAM traffic (bytes read + written) of
// the launch that follows, written at each launch of a memory-bound kernel
// from its arguments' sizes (each tensor element read or written once, at
// its storage dtype's size; what stays in registers or shared memory is not
// traffic). The emulated build counts it (TRIDENT_EMU_STATS,
// tests/cuda_emu/cuda_runtime_api.h), so that a change to a kernel's memory
// traffic is measured on CPUs; on a GPU it compiles to nothing.
#ifdef TRIDENT_CUDA_EMU
#define CUDA_TRAFFIC(bytes) emu_traffic((unsigned long long)(bytes))
#else
#define CUDA_TRAFFIC(bytes) ((void)sizeof(bytes)) // names its operands, evaluates nothing
#endif
// Bytes of n elements of t's storage dtype (a CUDA_TRAFFIC term).
static inline size_t tbytes(struct tensor t, size_t n) { return n * dtype_size(t.dtype); }

// A cached cuBLASLt heuristic answer for one GEMM problem (cuda_matmul.cu):
// the query costs tens of microseconds and a training step repeats a handful
// of shapes. Searched linearly; once full, new shapes query every time.
#define CUDA_ALGO_CACHE 64
struct algo_entry {
    int M, N, K;
    bool ta, tb;
    enum dtype ab, c;
    uint32_t al_a, al_b, al_c; // pointer alignments the algorithm was chosen for
    int found;                 // 0: cuBLASLt has none, use the fallback kernel
    cublasLtMatmulAlgo_t algo;
};

// Private state of the CUDA backend (struct backend.impl).
struct cuda_backend {
    int device;
    cudaStream_t stream;      // compute: every op and memory copy
    cudaStream_t comm_stream; // communication (NCCL), see src/parallel/comm_nccl.c
    cublasLtHandle_t lt;
    void *workspace; // cuBLASLt workspace
    size_t workspace_bytes;
    // Scratch of reductions (rmsnorm dw partials, attention's D vector,
    // sum_squares partials): grown to the largest request and kept.
    void *scratch;
    size_t scratch_bytes;
    double *host_sum; // pinned: sum_squares' result
    int *bad;         // device counter of out-of-range targets (ce_loss), checked at synchronize
    int *done;        // zeroed block counter of one-launch reductions (cuda_norm.cu); NULL until used
    int sm_count;
    struct algo_entry algos[CUDA_ALGO_CACHE];
    int n_algos;
    enum backend_attention attention; // [system] attention (kernels/backend.h)
    struct cudnn_attention *cudnn;    // cuDNN handle and plans; NULL until first needed
};

static inline struct cuda_backend *cuda_state(struct backend *be) {
    return (struct cuda_backend *)be->impl;
}
static inline cudaStream_t cuda_stream(struct backend *be) { return cuda_state(be)->stream; }

// cuDNN's fused attention (cuda_attention_cudnn.cu): runs the op and returns
// true when be's attention mode, the dtype and cuDNN's support for the shape
// say so (exits 1 with the reason in mode cudnn when they cannot); false: the
// caller runs the native kernel. Arguments as the ops of the same names.
bool cuda_attention_cudnn_forward(struct backend *be, struct tensor out, struct tensor lse, struct tensor q,
                                  struct tensor k, struct tensor v, int B, int T, int H, int Hkv, int D);
bool cuda_attention_cudnn_backward(struct backend *be, struct tensor dq, struct tensor dk, struct tensor dv,
                                   struct tensor dout, struct tensor q, struct tensor k, struct tensor v,
                                   struct tensor out, struct tensor lse, int B, int T, int H, int Hkv, int D);
// Frees the cuDNN plans and handle (cuda_destroy).
void cuda_attention_cudnn_free(struct cuda_backend *c);

// Device scratch of at least bytes, valid until the next call (stream-ordered:
// a regrow synchronizes the stream before freeing the old buffer).
void *cuda_scratch(struct backend *be, size_t bytes);

// A float tensor's data and storage dtype; aborts unless FP32, BF16 or FP16.
struct dptr {
    void *p;
    enum dtype dt;
};
static inline struct dptr dptr_of(const char *op, const char *name, struct tensor t) {
    CHECK(t.dtype == DTYPE_FP32 || t.dtype == DTYPE_BF16 || t.dtype == DTYPE_FP16,
          "%s: tensor %s is %s; the cuda backend stores fp32, bf16 and fp16 only", op, name,
          dtype_name(t.dtype));
    struct dptr d = {t.data, t.dtype};
    return d;
}
// Whether a storage dtype is one of the 16-bit ones (BF16, FP16).
static inline bool dtype_is16(enum dtype d) { return d == DTYPE_BF16 || d == DTYPE_FP16; }
// Aborts unless t has dtype d (the checks ops.c leaves to backends).
#define CUDA_CHECK_SAME(op, name, t, d)                                        \
    CHECK((t).dtype == (d), "%s: tensor %s is %s, expected %s", op, name,      \
          dtype_name((t).dtype), dtype_name(d))

__device__ __forceinline__ float ld(struct dptr a, size_t i) {
    if (a.dt == DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)a.p)[i]);
    if (a.dt == DTYPE_FP16) return __half2float(((const __half *)a.p)[i]);
    return ((const float *)a.p)[i];
}
// Round to nearest even when storing BF16 or FP16 (FP16: subnormals kept,
// overflow to inf).
__device__ __forceinline__ void st(struct dptr a, size_t i, float v) {
    if (a.dt == DTYPE_BF16) ((__nv_bfloat16 *)a.p)[i] = __float2bfloat16_rn(v);
    else if (a.dt == DTYPE_FP16) ((__half *)a.p)[i] = __float2half_rn(v);
    else ((float *)a.p)[i] = v;
}

// Grid size for n independent elements at 256 threads per block.
static inline unsigned grid_for(size_t n, int threads) {
    size_t g = (n + threads - 1) / threads;
    return (unsigned)(g < 1 ? 1 : g > 65535u * 32 ? 65535u * 32 : g);
}

// Block-wide sum / max of v over blockDim.x (a multiple of 32, <= 1024)
// threads; every thread gets the result. shared: 32 floats.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float block_sum(float v, float *shared) {
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads(); // shared may hold a previous reduction's values
    if (lane == 0) shared[w] = v;
    __syncthreads();
    v = lane < nw ? shared[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *shared) {
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[w] = v;
    __syncthreads();
    v = lane < nw ? shared[lane] : -INFINITY;
    return warp_max(v);
}

// Entry points of the table, one per line of kernels/ops_list.h: cuda_matmul,
// cuda_rope, ... with the signatures of struct backend_ops; each
// kernels/cuda/cuda_*.cu defines those of its ops.
#define CUDA_OP_PROTOTYPE(name, ret, params) ret cuda_##name params;
BACKEND_OPS(CUDA_OP_PROTOTYPE)
#undef CUDA_OP_PROTOTYPE

#endif

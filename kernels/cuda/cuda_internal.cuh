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

// A cuBLASLt plan for one GEMM problem (cuda_matmul.cu): the matmul
// descriptor, the three layouts and the heuristic's algorithm, made on the
// problem's first call and kept for the backend's life (the query costs tens
// of microseconds, and a step repeats a few dozen problems). Key: shape,
// transposes, dtypes and each operand's alignment class (log2 of the largest
// power of two <= 256 dividing its address: what the heuristic was told).
// An open-addressing hash table of CUDA_GEMM_PLANS entries; once full, a new
// problem gets a plan made and destroyed around its call.
#define CUDA_GEMM_PLANS 512
struct gemm_key {
    int M, N, K;
    bool ta, tb;
    enum dtype ab, c;
    uint16_t al; // alignment classes of b, a, out: 4 bits each
};
struct gemm_plan {
    bool used;
    struct gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    int found; // 0: cuBLASLt has no algorithm, the fallback kernel runs
    cublasLtMatmulAlgo_t algo;
};

// to_device's pinned staging ring (cuda_backend.cu): 16 slots of 256 KiB
// (4 MiB pinned), so the host can run several microbatches' uploads (tokens,
// targets, document starts: 64 KiB each at 8 x 2048 tokens) ahead of the
// device before a slot must wait; larger copies pass through in slot-sized
// pieces.
#define CUDA_STAGE_SLOTS 16
#define CUDA_STAGE_BYTES ((size_t)256 << 10)

// Private state of the CUDA backend (struct backend.impl).
struct cuda_backend {
    int device;
    cudaStream_t stream;      // compute: every op and memory copy
    cublasLtHandle_t lt;
    void *workspace; // cuBLASLt workspace
    size_t workspace_bytes;
    // Scratch of reductions (rmsnorm dw partials, attention's D vector,
    // sum_squares partials): grown to the largest request and kept.
    void *scratch;
    size_t scratch_bytes;
    bool scratch_reserved, scratch_warned; // backend_reserve ran; a later growth was reported
    double *host_sum; // pinned: sum_squares' result
    char *stage;      // pinned: CUDA_STAGE_SLOTS x CUDA_STAGE_BYTES, to_device's staging ring
    cudaEvent_t stage_done[CUDA_STAGE_SLOTS]; // recorded after the copy that read each slot
    int stage_next;                           // the slot the next piece uses
    int *bad;         // device counter of out-of-range targets (ce_loss), checked at synchronize
    int *done;        // zeroed block counter of one-launch reductions (cuda_norm.cu), made at init
    int sm_count;
    struct gemm_plan *plans; // CUDA_GEMM_PLANS, allocated at init (cuda_matmul.cu)
    int n_plans;
    enum backend_attention attention; // [system] attention (kernels/backend.h)
    struct cudnn_attention *cudnn;    // cuDNN handle and plans; NULL until first needed
    struct fp8_plan *fp8_plans;       // matmul_fp8's cuBLASLt plans (cuda_fp8.cu); NULL until first needed
};

static inline struct cuda_backend *cuda_state(struct backend *be) {
    return (struct cuda_backend *)be->impl;
}
static inline cudaStream_t cuda_stream(struct backend *be) { return cuda_state(be)->stream; }

// cuDNN's fused attention (cuda_attention_cudnn.cu): runs the op and returns
// true when be's attention mode, the dtype and cuDNN's support for the shape
// say so (exits 1 with the reason in mode cudnn when they cannot); false: the
// caller runs the native kernel. Arguments as the ops of the same names;
// doc_mask: the call has a document mask (native: the graph has none). Either
// way the path is recorded for backend_attention_take_path and announced the
// first time the shape runs (backend_set_attention_log).
bool cuda_attention_cudnn_forward(struct backend *be, struct tensor out, struct tensor lse, struct tensor q,
                                  struct tensor k, struct tensor v, bool doc_mask, int B, int T, int H, int Hkv,
                                  int D);
bool cuda_attention_cudnn_backward(struct backend *be, struct tensor dq, struct tensor dk, struct tensor dv,
                                   struct tensor dout, struct tensor q, struct tensor k, struct tensor v,
                                   struct tensor out, struct tensor lse, bool doc_mask, int B, int T, int H,
                                   int Hkv, int D);
// cuDNN per chunk pair for one block of ring attention
// (cuda_attention_cudnn_block.cu): runs the op and returns true when the mode,
// the dtype, the positions (every (query run, key run) pair fully visible,
// causal on equal runs, or unreadable) and cuDNN's support say so; false: the
// caller runs the native kernels. Arguments as attention_block_forward /
// _backward (q_doc non-empty: native). On true, *native_scratch and *gate
// are what the caller passes cuda_attention_block_native_* next: the native
// kernels, queued behind the pair path and gated on its device check of the
// positions (they run only if the positions are not the remembered runs).
// The pair path calls nothing of cuda_attention_block.cu (no call cycle).
// Paths recorded and announced as above.
bool cuda_attention_cudnn_block_forward(struct backend *be, struct tensor out, struct tensor lse,
                                        struct tensor q, struct tensor k, struct tensor v, struct tensor q_pos,
                                        struct tensor q_doc, struct tensor k_pos, int B, int Tq, int Tk, int H,
                                        int Hkv, int D, bool accumulate, char **native_scratch,
                                        const int **gate);
bool cuda_attention_cudnn_block_backward(struct backend *be, struct tensor dq, struct tensor dk,
                                         struct tensor dv, struct tensor dout, struct tensor q, struct tensor k,
                                         struct tensor v, struct tensor out, struct tensor lse,
                                         struct tensor q_pos, struct tensor q_doc, struct tensor k_pos, int B,
                                         int Tq, int Tk, int H, int Hkv, int D, char **native_scratch,
                                         const int **gate);
// The native block kernels (cuda_attention_block.cu) with their scratch
// (cuda_scratch_attention_block bytes) given; gate: NULL, or a device int
// the kernels read first: they run only where it is nonzero (the cuDNN pair
// path enqueues them behind its check of the positions, as the fallback).
void cuda_attention_block_native_forward(struct backend *be, struct tensor out, struct tensor lse,
                                         struct tensor q, struct tensor k, struct tensor v, struct tensor q_pos,
                                         struct tensor q_doc, struct tensor k_pos, int B, int Tq, int Tk, int H,
                                         int Hkv, int D, bool accumulate, char *scratch, const int *gate);
void cuda_attention_block_native_backward(struct backend *be, struct tensor dq, struct tensor dk, struct tensor dv,
                                          struct tensor dout, struct tensor q, struct tensor k, struct tensor v,
                                          struct tensor out, struct tensor lse, struct tensor q_pos,
                                          struct tensor q_doc, struct tensor k_pos, int B, int Tq, int Tk, int H,
                                          int Hkv, int D, char *scratch, const int *gate);
// Scratch bytes cuDNN's attention needs at bounds (its forward's workspace,
// its backward's workspace and FP32 buffers), planning both now; 0 when the
// mode, the dtype or cuDNN's support for the shape sends it to the native
// kernels (a shape cuDNN refuses in mode cudnn is reported at its first call).
size_t cuda_attention_cudnn_scratch(struct backend *be, const struct backend_bounds *b);
// Destroys the cached cuBLASLt plans (cuda_destroy).
void cuda_matmul_plans_free(struct cuda_backend *c);
// Destroys matmul_fp8's cached cuBLASLt plans (cuda_destroy).
void cuda_matmul_fp8_plans_free(struct cuda_backend *c);
// Frees the cuDNN plans and handle (cuda_destroy).
void cuda_attention_cudnn_free(struct cuda_backend *c);

// Device scratch of at least bytes, valid until the next call (stream-ordered:
// a regrow synchronizes the stream before freeing the old buffer). Sized once
// by backend_reserve (cuda_reserve, from the bounds below); a request beyond
// the reservation still grows it but says so on stderr, once: a step then
// waits for the device and allocates.
void *cuda_scratch(struct backend *be, size_t bytes);
// Grows the scratch to at least bytes now and marks it reserved (a later
// growth is reported); cudaMalloc's status. For backend_reserve
// (cuda_backend.cu), which computes bytes from the bounds below.
cudaError_t cuda_scratch_reserve(struct backend *be, size_t bytes);

// What each user of cuda_scratch asks for, in bytes, as functions of its
// arguments (the reservation's bounds): rmsnorm_backward's dw partials
// (cuda_norm.cu: min(N, NORM_BW_BLOCKS) block sums of C floats in the
// one-launch backward, C <= NORM_BW_MAX_C; else min(N, DW_CHUNKS) row chunks
// of C floats), sum_squares'
// partials (cuda_elementwise.cu: SUMSQ_BLOCKS + 1 doubles), the native
// attention backward's D (B, H, T) floats (cuda_attention.cu), cuDNN's
// backward (cuda_attention_cudnn.cu: its plan's workspace, known only once
// planned, then Dsum (B, H, T) and the dq accumulator (B, H, T, D), FP32).
#define DW_CHUNKS 64
#define SUMSQ_BLOCKS 1024
// Blocks of the one-launch RMSNorm backward: each takes rows blockIdx.x,
// blockIdx.x + NORM_BW_BLOCKS, ... (fixed, so dw's sum order is too).
#define NORM_BW_BLOCKS 256
// Widest C of the one-launch backward: its dw sums (C floats of dynamic
// shared memory) and its static shared memory (144 bytes on sm_90, ptxas -v)
// stay within the 48 KiB a block gets without
// cudaFuncAttributeMaxDynamicSharedMemorySize: 1 KiB is left for the static
// part. Wider rows take the three kernels.
#define NORM_BW_MAX_C (47 * 1024 / 4)
static inline size_t cuda_scratch_rmsnorm_backward(int N, int C) {
    int rows = C <= NORM_BW_MAX_C ? NORM_BW_BLOCKS : DW_CHUNKS;
    return sizeof(float) * (size_t)(N < rows ? N : rows) * (size_t)C;
}
static inline size_t cuda_scratch_sum_squares(void) { return sizeof(double) * (SUMSQ_BLOCKS + 1); }
static inline size_t cuda_scratch_attention_backward(int B, int T, int H) {
    return sizeof(float) * (size_t)B * H * T;
}
// The native block attention (cuda_attention_block.cu): per-granule position
// ranges (16 rows: 4 ints a query granule, 2 a key granule), 256-aligned,
// then for the backward D (B, H, Tq) floats.
static inline size_t cuda_scratch_attention_block(int B, int Tq, int Tk, int H, bool backward) {
    size_t ranges = sizeof(int) * (size_t)B * (4 * (size_t)((Tq + 15) / 16) + 2 * (size_t)((Tk + 15) / 16));
    return (ranges + 255) / 256 * 256 + (backward ? sizeof(float) * (size_t)B * H * Tq : 0);
}
// matmul_fp8's K-major copies of its operands (cuda_fp8.cu): at most M K +
// K N bytes (fp8_gemm elements, struct backend_bounds), the first rounded up
// to 256 bytes.
static inline size_t cuda_scratch_matmul_fp8(size_t fp8_gemm) { return fp8_gemm ? fp8_gemm + 256 : 0; }
static inline size_t cuda_scratch_cudnn_backward(size_t workspace, int B, int T, int H, int D) {
    size_t dsum = sizeof(float) * (size_t)B * H * T;
    return (workspace + 255) / 256 * 256 + (dsum + 255) / 256 * 256 + dsum * D;
}

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

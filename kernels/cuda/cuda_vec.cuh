// cuda_vec.cuh: typed, 16-byte vectorised access for the memory-bound kernels
// of the CUDA backend (issue 24). A kernel is a template on its storage type
// T (float, __nv_bfloat16 or __half): the dtype is chosen once, on the host
// (CUDA_DISPATCH_T), so the inner loops carry no per-element dtype branch,
// and rows move as 16-byte vectors (4 FP32 or 8 BF16/FP16 values; int4
// loads/stores) when the row length is a multiple of VEC<T> and the
// pointers are 16-byte aligned (vec_ok), else element by element.
// Conversions as ld()/st() of cuda_internal.cuh: 16-bit values widen
// exactly; stores round once to nearest even.
#ifndef TRIDENT_CUDA_VEC_CUH
#define TRIDENT_CUDA_VEC_CUH

#include "cuda_internal.cuh"

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// Elements of T in 16 bytes.
template <typename T> struct vec_width { static constexpr int n = 16 / (int)sizeof(T); };
#define VEC(T) (vec_width<T>::n)

// out[0 .. VEC(T)) = the FP32 values of the 16 bytes at p (16-byte aligned).
// (The emulation, plain C++, copies bytes instead of type-punning.)
template <typename T> __device__ __forceinline__ void vload(float *out, const T *p) {
#ifdef TRIDENT_CUDA_EMU
    T e[VEC(T)];
    memcpy(e, p, 16);
#else
    int4 raw = *(const int4 *)p;
    const T *e = (const T *)&raw;
#endif
#pragma unroll
    for (int k = 0; k < VEC(T); k++) out[k] = to_f32(e[k]);
}
// The 16 bytes at p (16-byte aligned) = v[0 .. VEC(T)) rounded to T.
template <typename T> __device__ __forceinline__ void vstore(T *p, const float *v) {
#ifdef TRIDENT_CUDA_EMU
    T e[VEC(T)];
#pragma unroll
    for (int k = 0; k < VEC(T); k++) e[k] = from_f32<T>(v[k]);
    memcpy(p, e, 16);
#else
    int4 raw;
    T *e = (T *)&raw;
#pragma unroll
    for (int k = 0; k < VEC(T); k++) e[k] = from_f32<T>(v[k]);
    *(int4 *)p = raw;
#endif
}

// Whether rows of n elements of dtype dt at these pointers can move as
// 16-byte vectors: n a multiple of the vector width, every pointer 16-byte
// aligned (NULL pointers are ignored).
static inline bool vec_ok(enum dtype dt, size_t n, const void *a, const void *b = NULL,
                          const void *c = NULL, const void *d = NULL, const void *e = NULL) {
    size_t w = 16 / dtype_size(dt);
    const void *p[5] = {a, b, c, d, e};
    if (n % w) return false;
    for (int i = 0; i < 5; i++)
        if (p[i] && ((uintptr_t)p[i] & 15)) return false;
    return true;
}

// Runs the statement(s) after dt with T the storage type of dtype dt (FP32,
// BF16, FP16; else aborts naming op).
#define CUDA_DISPATCH_T(op, dt, ...)                                                            \
    do {                                                                                        \
        switch (dt) {                                                                           \
        case DTYPE_FP32: { typedef float T; __VA_ARGS__; } break;                               \
        case DTYPE_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break;                       \
        case DTYPE_FP16: { typedef __half T; __VA_ARGS__; } break;                              \
        default: CHECK(0, "%s: dtype %s; the cuda backend stores fp32, bf16 and fp16 only", op, \
                       dtype_name(dt));                                                         \
        }                                                                                       \
    } while (0)

#endif

// cuda_fp8.cu: FP8 ops of the CUDA backend (kernels/ops.h, "FP8"; docs/cuda.md
// "FP8"): the fused cast + amax + saturation count (one kernel a tensor), the
// amax alone (the same kernel without output), the scale update (one small
// kernel for all tensors), and the FP8 GEMM through cuBLASLt.
//
// Conversions are done by bits (fp8_encode), not by cuda_fp8.h's
// __nv_cvt_float_to_fp8: with __NV_SATFINITE it saturates +-inf to +-max,
// and the contract wants inf -> NaN (E4M3) / inf (E5M2) so that the step's
// non-finite check sees it; by bits also runs unchanged in the emulation.
//
// The GEMM (cuBLASLt's FP8 matmul, Ada and Hopper): operands CUDA_R_8F_E4M3
// or CUDA_R_8F_E5M2 (not both E5M2), CUBLAS_COMPUTE_32F, FP32 scale type,
// out (C and D) BF16 or FP32, the scale inverses as device pointers
// (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER / B_SCALE_POINTER: D = alpha scale_a
// scale_b op(A) op(B) + beta C), fast accumulation off
// (CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0: Hopper's FP8 tensor cores then
// promote partial sums to FP32 regularly; with it on they accumulate in
// reduced precision over all of K, which nobody has bounded for our K). FP8
// needs the "TN" layout: cuBLASLt's A transposed and B not, i.e. both
// operands K-major. Through the transpose trick of cuda_matmul.cu (row-major
// out^T = op(b)^T op(a)^T, cuBLASLt's A is trident's b) that is a (M, K)
// stored as is (trans_a = false) and b stored (N, K) (trans_b = true): the
// forward y = x W^T. Other layouts (the backward's dx = dy W, dW = dy^T x)
// get K-major copies made by a transpose kernel in the backend's scratch
// (sized by backend_reserve's fp8_gemm bound). cuBLASLt's FP8 kernels also
// want 16-byte aligned operands and dimensions that are multiples of 16;
// other shapes (and shapes cuBLASLt has no algorithm for) run a fallback
// kernel with the same math (slow), said once per shape on stderr.
#include "cuda_internal.cuh"
#include "cuda_vec.cuh"

#include <float.h>
#include <stdio.h>
#include <string.h>

// ---- conversions -------------------------------------------------------------------

// The FP8 bits of v (kernels/ops.h, fp8_cast): round to nearest even to E4M3
// (bias 7, 3 mantissa bits, max 448 = S.1111.110) or E5M2 (bias 15, 2 bits,
// max 57344 = S.11110.11); a finite value beyond max saturates to +-max; NaN
// -> S.1111.111 (E4M3) / S.11111.11 (E5M2) keeping the sign; +-inf -> NaN
// (E4M3) / +-inf (E5M2). Subnormals kept (E4M3 steps of 2^-9, E5M2 2^-16);
// FP32 subnormals round to +-0.
__device__ __forceinline__ unsigned fp8_encode(float v, bool e4m3) {
    unsigned u = (unsigned)__float_as_int(v);
    unsigned sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    const int M = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, emax = e4m3 ? 8 : 15;
    const unsigned maxbits = e4m3 ? 0x7eu : 0x7bu;
    if (a > 0x7f800000u) return sign | 0x7fu;                    // NaN
    if (a == 0x7f800000u) return sign | (e4m3 ? 0x7fu : 0x7cu); // inf
    int e = (int)(a >> 23) - 127;                                // v's unbiased exponent
    if (e > emax) return sign | maxbits;                         // >= 2^(emax + 1): saturate
    // Bits of the 24-bit significand dropped: 23 - M for a normal result,
    // more below the smallest normal 2^(1 - bias) (a subnormal result).
    int shift = e >= 1 - bias ? 23 - M : 23 - M + (1 - bias - e);
    if (shift > 24) return sign; // below half the smallest subnormal: +-0
    unsigned mant = (a & 0x7fffffu) | 0x800000u;
    unsigned q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++; // a carry moves into the exponent
    unsigned r = e >= 1 - bias ? ((unsigned)(e + bias - 1) << M) + q : q;
    return sign | (r > maxbits ? maxbits : r); // rounding up past max (E4M3: to 480) saturates too
}

// The exact FP32 value of FP8 bits b (E4M3 or E5M2).
__device__ __forceinline__ float fp8_decode(unsigned b, bool e4m3) {
    unsigned s = (b & 0x80u) << 24, mag = b & 0x7fu, bits;
    if (e4m3) {
        unsigned e = mag >> 3, m = mag & 7u;
        if (mag == 0x7fu) bits = 0x7fc00000u;
        else if (e == 0) return s ? -(float)m * 0x1p-9f : (float)m * 0x1p-9f; // subnormal, +-0
        else bits = ((e + 120u) << 23) | (m << 20);
    } else {
        unsigned e = mag >> 2, m = mag & 3u;
        if (e == 31) bits = m ? 0x7fc00000u : 0x7f800000u;
        else if (e == 0) return s ? -(float)m * 0x1p-16f : (float)m * 0x1p-16f;
        else bits = ((e + 112u) << 23) | (m << 21);
    }
    return __int_as_float((int)(s | bits));
}

// max for amaxes: NaN wins (an amax of a tensor holding NaN is NaN).
__device__ __forceinline__ float fp8_nanmax(float a, float b) { return a > b || a != a ? a : b; }

// ---- cast + amax + saturation count ------------------------------------------------

#define FP8_THREADS 256

// Block-wide NaN-propagating max and integer sum; every thread gets them.
// shared: 32 floats and 32 counters.
__device__ __forceinline__ void fp8_block_reduce(float *m, unsigned long long *cnt, float *sm,
                                                 unsigned long long *sc) {
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    float mv = *m;
    unsigned long long cv = *cnt;
    for (int o = 16; o > 0; o >>= 1) {
        mv = fp8_nanmax(mv, __shfl_xor_sync(0xffffffffu, mv, o));
        cv += __shfl_xor_sync(0xffffffffu, cv, o);
    }
    if (lane == 0) sm[w] = mv, sc[w] = cv;
    __syncthreads();
    mv = lane < nw ? sm[lane] : 0.0f;
    cv = lane < nw ? sc[lane] : 0ull;
    for (int o = 16; o > 0; o >>= 1) {
        mv = fp8_nanmax(mv, __shfl_xor_sync(0xffffffffu, mv, o));
        cv += __shfl_xor_sync(0xffffffffu, cv, o);
    }
    *m = mv, *cnt = cv;
}

// V bytes q[0 .. V) (packed little-endian in p) to out (V-byte aligned).
template <int V> __device__ __forceinline__ void fp8_store(uint8_t *out, unsigned long long p) {
#ifdef TRIDENT_CUDA_EMU
    memcpy(out, &p, V);
#else
    if (V == 8) *(unsigned long long *)out = p;
    else if (V == 4) *(unsigned *)out = (unsigned)p;
    else *out = (uint8_t)p;
#endif
}

// out (n,) = fp8(x * scale) when out != NULL; amax = max(amax, max |x|) when
// amax != NULL; *sat += #{finite x_i : |x_i * scale| > clip} when sat != NULL
// (clip: the magnitude above which saturation changes the rounded value,
// fp8_clip of kernels/ops.h's fp8_cast doc: 464 E4M3, just below 61440 E5M2).
// Grid-stride over groups of V elements (V = VEC(T) 16-byte vectors, or 1);
// one atomic per block for each of amax and sat. amax's atomicMax on the
// float's bits: for values >= +0 (|x|, and a NaN made the positive quiet
// NaN 0x7fc00000) integer order is float order, inf < NaN included.
template <typename T, int V>
__global__ void fp8_cast_kernel(uint8_t *out, float *amax, unsigned long long *sat, const T *x,
                                const float *scale, float clip, bool e4m3, size_t n) {
    __shared__ float sm[32];
    __shared__ unsigned long long sc[32];
    float s = scale ? *scale : 1.0f;
    float m = 0.0f;
    unsigned long long cnt = 0;
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < n / V; g += (size_t)gridDim.x * blockDim.x) {
        size_t i = g * V;
        float v[VEC(T)];
        if (V > 1) vload(v, x + i);
        else v[0] = to_f32(x[i]);
        unsigned long long packed = 0;
        for (int e = 0; e < V; e++) {
            m = fp8_nanmax(m, fabsf(v[e]));
            if (out) {
                float y = v[e] * s; // rounded once in FP32
                packed |= (unsigned long long)fp8_encode(y, e4m3) << (8 * e);
                cnt += isfinite(v[e]) && fabsf(y) > clip;
            }
        }
        if (out) fp8_store<V>(out + i, packed);
    }
    if (!amax && !sat) return; // uniform over the launch: no thread waits at a barrier
    fp8_block_reduce(&m, &cnt, sm, sc);
    if (threadIdx.x != 0) return;
    if (amax) atomicMax((int *)amax, m != m ? 0x7fc00000 : __float_as_int(m));
    if (sat && cnt) atomicAdd(sat, cnt);
}

// The launch of fp8_cast_kernel for x's storage type, 16-byte vectors when n
// and the pointers allow (out then V-byte aligned too).
static void fp8_cast_launch(struct backend *be, const char *op, uint8_t *out, float *amax,
                            unsigned long long *sat, struct tensor x, const float *scale, float clip,
                            bool e4m3, size_t n) {
    struct cuda_backend *c = cuda_state(be);
    dptr_of(op, "x", x);
    size_t w = 16 / dtype_size(x.dtype);
    bool vec = vec_ok(x.dtype, n, x.data) && (!out || (uintptr_t)out % w == 0);
    // A few blocks per SM: each thread strides over many elements, and each
    // block costs one atomic per reduced output.
    size_t groups = vec ? n / w : n;
    unsigned blocks = grid_for(groups, FP8_THREADS), cap = (unsigned)(4 * (c->sm_count > 0 ? c->sm_count : 1));
    if (blocks > cap) blocks = cap;
    CUDA_TRAFFIC(tbytes(x, n) + (out ? n : 0));
    CUDA_DISPATCH_T(op, x.dtype, {
        constexpr int W = VEC(T);
        if (vec)
            fp8_cast_kernel<T, W><<<blocks, FP8_THREADS, 0, c->stream>>>(out, amax, sat, (const T *)x.data,
                                                                        scale, clip, e4m3, n);
        else
            fp8_cast_kernel<T, 1><<<blocks, FP8_THREADS, 0, c->stream>>>(out, amax, sat, (const T *)x.data,
                                                                        scale, clip, e4m3, n);
    });
    CHECK_LAUNCH();
}

void cuda_fp8_amax(struct backend *be, struct tensor amax, struct tensor x, size_t n) {
    if (!n) return;
    fp8_cast_launch(be, "fp8_amax", NULL, (float *)amax.data, NULL, x, NULL, 0.0f, true, n);
}

void cuda_fp8_cast(struct backend *be, struct tensor out, struct tensor amax,
                   struct tensor saturated, struct tensor x, struct tensor scale, size_t n) {
    if (!n) return;
    fp8_cast_launch(be, "fp8_cast", (uint8_t *)out.data, amax.numel ? (float *)amax.data : NULL,
                    saturated.numel ? (unsigned long long *)saturated.data : NULL, x,
                    (const float *)scale.data,
                    out.dtype == DTYPE_FP8_E4M3 ? 464.0f : 0x1.dffffep+15f, // fp8_clips, kernels/cpu/fp8.h
                    out.dtype == DTYPE_FP8_E4M3, n);
}

// ---- scale update ----------------------------------------------------------------------

// One thread per tensor i (kernels/ops.h, fp8_update_scale): push amax[i]
// into history row i (newest first), a = amax[i] or the row's max (fmaxf: a
// NaN entry is passed over unless all are NaN, as TE's kernel), scale =
// (fp8_max / a) / 2^margin when a is finite and > 0 (FP32; FLT_MAX where
// that overflows, as TE's compute_scale_from_amax), scale_inv = 1 / scale,
// amax = 0.
__global__ void fp8_update_scale_kernel(float *scale, float *scale_inv, float *history, float *amax, int n,
                                        int len, float fp8_max, int margin, bool most_recent) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = amax[i];
    if (len > 0) {
        float *h = history + (size_t)i * len;
        for (int j = len - 1; j > 0; j--) h[j] = h[j - 1];
        h[0] = a;
        if (!most_recent)
            for (int j = 1; j < len; j++) a = fmaxf(a, h[j]);
    }
    float s = scale[i];
    if (isfinite(a) && a > 0.0f) {
        s = fp8_max / a / ldexpf(1.0f, margin);
        if (isinf(s)) s = FLT_MAX; // a tiny amax
    }
    scale[i] = s;
    scale_inv[i] = 1.0f / s;
    amax[i] = 0.0f;
}

void cuda_fp8_update_scale(struct backend *be, struct tensor scale, struct tensor scale_inv,
                           struct tensor history, struct tensor amax, int n, int len, float fp8_max,
                           int margin, bool most_recent) {
    if (n <= 0) return;
    CUDA_TRAFFIC(sizeof(float) * (size_t)n * (4 + 2 * (size_t)len));
    fp8_update_scale_kernel<<<(n + 127) / 128, 128, 0, cuda_stream(be)>>>(
        (float *)scale.data, (float *)scale_inv.data, len ? (float *)history.data : NULL, (float *)amax.data, n,
        len, fp8_max, margin, most_recent);
    CHECK_LAUNCH();
}

// ---- GEMM ---------------------------------------------------------------------------------

// dst (C, R) = src (R, C)^T, bytes, through 32 x 32 tiles in shared memory;
// blocks (32, 8), grid (ceil(C / 32), min(ceil(R / 32), 65535)), striding
// over row tiles (gridDim.y <= 65535).
__global__ void fp8_transpose_kernel(uint8_t *dst, const uint8_t *src, int R, int C) {
    __shared__ uint8_t tile[32][33];
    int c0 = blockIdx.x * 32;
    for (int r0 = blockIdx.y * 32; r0 < R; r0 += gridDim.y * 32) {
        for (int i = threadIdx.y; i < 32; i += 8) {
            int r = r0 + i, col = c0 + threadIdx.x;
            if (r < R && col < C) tile[i][threadIdx.x] = src[(size_t)r * C + col];
        }
        __syncthreads();
        for (int i = threadIdx.y; i < 32; i += 8) {
            int col = c0 + i, r = r0 + threadIdx.x;
            if (col < C && r < R) dst[(size_t)col * R + r] = tile[threadIdx.x][i];
        }
        __syncthreads();
    }
}

static void fp8_transpose(struct backend *be, uint8_t *dst, const void *src, int R, int C) {
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)MIN((R + 31) / 32, 65535));
    CUDA_TRAFFIC(2 * (size_t)R * C);
    fp8_transpose_kernel<<<grid, dim3(32, 8), 0, cuda_stream(be)>>>(dst, (const uint8_t *)src, R, C);
    CHECK_LAUNCH();
}

// out (M, N) = fmaf(beta, out, (sa sb) (op(a) op(b))), one thread per
// element, FP32 products (exact: FP8 values have at most 4 significant bits)
// and sums in k order: the fallback when cuBLASLt cannot run the shape. Grid
// as cuda_matmul.cu's gemm_naive_kernel (blocks stride over rows). beta == 0
// never reads out.
__global__ void fp8_gemm_naive_kernel(struct dptr out, const uint8_t *a, const uint8_t *b, bool a4, bool b4,
                                      const float *sa, const float *sb, int M, int N, int K, bool ta, bool tb,
                                      float beta) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= N) return;
    float s = *sa * *sb;
    for (int i = blockIdx.y; i < M; i += gridDim.y) {
        float acc = 0;
        for (int k = 0; k < K; k++)
            acc += fp8_decode(a[ta ? (size_t)k * M + i : (size_t)i * K + k], a4) *
                   fp8_decode(b[tb ? (size_t)j * K + k : (size_t)k * N + j], b4);
        size_t o = (size_t)i * N + j;
        float v = s * acc;
        st(out, o, beta == 0.0f ? v : fmaf(beta, ld(out, o), v));
    }
}

// A cuBLASLt FP8 plan (descriptor, layouts, algorithm) per problem: shape,
// dtypes of a, b and out, alignment classes (as cuda_matmul.cu's plans);
// made once, kept in c->fp8_plans (CUDA_FP8_PLANS, then made and destroyed
// around each call). found = 0: the fallback kernel runs (why: reason).
#define CUDA_FP8_PLANS 64
struct fp8_key {
    int M, N, K;
    enum dtype a, b, out;
    uint16_t al; // log2 alignment (<= 8) of the operands cuBLASLt reads: b side, a side, out
};
struct fp8_plan {
    bool used;
    struct fp8_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    int found;
    cublasLtMatmulAlgo_t algo;
    char reason[96];
};

static uint32_t fp8_align_class(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t k = 8;
    while (k > 0 && a % (1u << k)) k--;
    return k;
}

static cudaDataType_t fp8_cuda_type(enum dtype d) {
    switch (d) {
    case DTYPE_FP8_E4M3: return CUDA_R_8F_E4M3;
    case DTYPE_FP8_E5M2: return CUDA_R_8F_E5M2;
    case DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

static void fp8_plan_destroy(struct fp8_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

void cuda_matmul_fp8_plans_free(struct cuda_backend *c) {
    if (!c->fp8_plans) return;
    for (int i = 0; i < CUDA_FP8_PLANS; i++)
        if (c->fp8_plans[i].used) fp8_plan_destroy(&c->fp8_plans[i]);
    free(c->fp8_plans);
    c->fp8_plans = NULL;
}

// p's cuBLASLt objects for p->key, TN: cuBLASLt's A = b' (N, K) row-major =
// (K x N) column-major, ld K, transposed; its B = a' (M, K) row-major = (K x
// M) column-major, ld K; C = D = out^T (N x M), ld N. The scale pointers are
// set per call (they are the call's tensors); sa, sb: this call's, so the
// heuristic sees a scaled problem. Says on stderr why a problem falls back.
static void fp8_plan_make(struct cuda_backend *c, struct fp8_plan *p, const float *sa, const float *sb) {
    const struct fp8_key *k = &p->key;
    if (k->M % 16 || k->N % 16 || k->K % 16) {
        snprintf(p->reason, sizeof p->reason, "dimensions not multiples of 16");
    } else if ((k->al & 15) < 4 || (k->al >> 4 & 15) < 4 || (k->al >> 8 & 15) < 4) {
        snprintf(p->reason, sizeof p->reason, "an operand not 16-byte aligned");
    } else {
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->lb, fp8_cuda_type(k->b), k->K, k->N, k->K));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->la, fp8_cuda_type(k->a), k->K, k->M, k->K));
        CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p->lc, fp8_cuda_type(k->out), k->N, k->M, k->N));
        CHECK_CUBLAS(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
        int8_t fast = 0;
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb, sizeof sb));
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa));
        cublasLtMatmulPreference_t pref;
        CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = c->workspace_bytes;
        uint32_t al[3] = {1u << (k->al & 15), 1u << (k->al >> 4 & 15), 1u << (k->al >> 8 & 15)};
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                          sizeof ws));
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0],
                                                          sizeof al[0]));
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1],
                                                          sizeof al[1]));
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2],
                                                          sizeof al[2]));
        CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2],
                                                          sizeof al[2]));
        cublasLtMatmulHeuristicResult_t heur;
        memset(&heur, 0, sizeof heur);
        int found = 0;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->lb, p->la, p->lc, p->lc, pref, 1,
                                                           &heur, &found);
        if (st != CUBLAS_STATUS_NOT_SUPPORTED) CHECK_CUBLAS(st);
        cublasLtMatmulPreferenceDestroy(pref);
        p->found = st == CUBLAS_STATUS_SUCCESS && found > 0;
        p->algo = heur.algo;
        if (!p->found) snprintf(p->reason, sizeof p->reason, "cuBLASLt has no FP8 algorithm for it");
    }
    if (!p->found)
        fprintf(stderr, "cuda backend: matmul_fp8 M=%d N=%d K=%d %s x %s -> %s runs the fallback kernel (%s; "
                "slow)\n", k->M, k->N, k->K, dtype_name(k->a), dtype_name(k->b), dtype_name(k->out), p->reason);
}

static struct fp8_plan *fp8_plan_find(struct cuda_backend *c, const struct fp8_key *key, const float *sa,
                                      const float *sb) {
    if (!c->fp8_plans) c->fp8_plans = (struct fp8_plan *)xcalloc(CUDA_FP8_PLANS, sizeof *c->fp8_plans);
    for (int i = 0; i < CUDA_FP8_PLANS; i++) {
        struct fp8_plan *p = &c->fp8_plans[i];
        if (p->used && !memcmp(&p->key, key, sizeof *key)) return p;
        if (p->used) continue;
        p->used = true;
        p->key = *key;
        fp8_plan_make(c, p, sa, sb);
        return p;
    }
    return NULL;
}

void cuda_matmul_fp8(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                     struct tensor scale_inv_a, struct tensor scale_inv_b, int M, int N, int K,
                     bool trans_a, bool trans_b, float beta) {
    struct cuda_backend *c = cuda_state(be);
    struct dptr o = dptr_of("matmul_fp8", "out", out);
    const float *sa = (const float *)scale_inv_a.data, *sb = (const float *)scale_inv_b.data;
    if (M == 0 || N == 0) return;
    // The operands cuBLASLt would read: K-major copies where the layout is not.
    size_t bytes_a = trans_a ? ((size_t)M * K + 255) / 256 * 256 : 0, bytes_b = trans_b ? 0 : (size_t)K * N;
    struct fp8_key key;
    memset(&key, 0, sizeof key); // padding too: keys are compared with memcmp
    key.M = M, key.N = N, key.K = K, key.a = a.dtype, key.b = b.dtype, key.out = out.dtype;
    key.al = (uint16_t)((trans_b ? fp8_align_class(b.data) : 8) | (trans_a ? 8 : fp8_align_class(a.data)) << 4 |
                        fp8_align_class(out.data) << 8);
    struct fp8_plan spare, *p = K ? fp8_plan_find(c, &key, sa, sb) : NULL;
    if (K && !p) {
        memset(&spare, 0, sizeof spare);
        spare.key = key;
        fp8_plan_make(c, &spare, sa, sb);
        p = &spare;
    }
    if (p && p->found) {
        const void *pa = a.data, *pb = b.data;
        if (bytes_a || bytes_b) {
            uint8_t *scratch = (uint8_t *)cuda_scratch(be, bytes_a + bytes_b);
            if (trans_a) fp8_transpose(be, scratch, a.data, K, M), pa = scratch; // (K, M) -> (M, K)
            if (!trans_b) fp8_transpose(be, scratch + bytes_a, b.data, K, N), pb = scratch + bytes_a; // -> (N, K)
        }
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb, sizeof sb));
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa));
        float alpha = 1.0f;
        CHECK_CUBLAS(cublasLtMatmul(c->lt, p->desc, &alpha, pb, p->lb, pa, p->la, &beta, out.data, p->lc, out.data,
                                    p->lc, &p->algo, c->workspace, c->workspace_bytes, c->stream));
    } else {
        dim3 grid((unsigned)((N + 127) / 128), (unsigned)MIN(M, 65535));
        fp8_gemm_naive_kernel<<<grid, 128, 0, c->stream>>>(o, (const uint8_t *)a.data, (const uint8_t *)b.data,
                                                           a.dtype == DTYPE_FP8_E4M3, b.dtype == DTYPE_FP8_E4M3,
                                                           sa, sb, M, N, K, trans_a, trans_b, beta);
        CHECK_LAUNCH();
    }
    if (p == &spare) fp8_plan_destroy(&spare);
}

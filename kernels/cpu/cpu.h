// cpu.h: internals of the CPU backend (kernels/cpu/*.c), not part of ops.h.
//
// Each kernel body is written once in kernels/cpu/generic/*.h over a storage
// type `real` and a compute type `creal`, and instantiated by
// generic/instantiate.h (the scheme of PyTorch's old TH/generic): a .c file
// sets GENERIC_FILE and includes instantiate.h, which defines real, creal,
// LD/ST, FN() and the math macros for FP32, includes the body, then does the
// same for FP64, and, when the file defines GENERIC_LOWP, for BF16 and FP16
// (storage uint16_t, compute FP32, rounding in ST; half.h). The instantiated
// functions are static; the cpu_<op> dispatchers declared below pick one by
// dtype (CPU_DISPATCH) and are what the tables in cpu_table.c point to. The
// ops whose bodies call GEMM on their operands (matmul, attention) have FP32
// and FP64 bodies only: their BF16/FP16 paths convert to FP32 around them
// (cpu_matmul.c, with oneDNN's BF16 GEMM where the CPU has BF16 instructions;
// cpu_attention.c).
#ifndef TRIDENT_CPU_H
#define TRIDENT_CPU_H

#include <math.h>

#include "base/common.h"
#include "kernels/ops.h"

#include "half.h"

// The vector variants of exp in glibc's libmvec (within 4 ulp; math.h
// declares them only under -ffast-math): with these declarations the softmax
// and cross-entropy loops marked `omp simd` vectorize: at the benchmark
// shapes attention takes ~25% less time, the cross-entropy ~70% less.
#pragma omp declare simd notinbranch
float expf(float x);
#pragma omp declare simd notinbranch
double exp(double x);

// Private state of the CPU backend (struct backend.impl). Calls into one
// backend are not reentrant: the scratch is shared by consecutive ops.
struct cpu_backend {
    // Per-thread scratch of the attention kernels: grown by cpu_scratch() to
    // the largest request and kept, so that a training step allocates nothing
    // once it has run with its largest shapes.
    void *scratch;
    size_t scratch_bytes;
    // A second scratch, grown the same way (cpu_scratch_staging), for an op
    // that stages its operands and then calls another op that uses scratch:
    // matmul_fp8's BF16 images of its FP8 operands and FP32 product around
    // the backend's matmul (whose oneDNN scratchpad is scratch).
    void *staging;
    size_t staging_bytes;
    // BF16 matmuls through oneDNN's matmul primitive (cpu_matmul.c): set by
    // backend_cpu_init when the CPU has AVX512_BF16 (AMX CPUs have it too);
    // otherwise, or when cleared (tests of the fallback), BF16 operands are
    // converted to FP32 for sgemm.
    bool bf16_gemm;
    // oneDNN's engine, stream and the matmul primitives created so far, one
    // per shape (struct cpu_dnnl, cpu_matmul.c); NULL until the first BF16
    // matmul through oneDNN, which also sets dnnl_free, called by
    // cpu_destroy (a pointer, so that cpu_memory.c does not call into
    // cpu_matmul.c, which calls cpu_scratch: tests/e2e/layering.sh).
    struct cpu_dnnl *dnnl;
    void (*dnnl_free)(struct cpu_backend *cpu);
};

// Whether BF16 matmuls can go to oneDNN (cpu_matmul.c): the CPU has
// AVX512_BF16 and a probe product through oneDNN's BF16 GEMM is right.
bool cpu_bf16_gemm_available(void);

// out (M, N) = alpha * op(a) (M, K) @ op(b) (K, N) + beta * out through a
// oneDNN BF16 matmul primitive, row-major, a stored (K, M) when trans_a, b
// (N, K) when trans_b (as cblas_sgemm): BF16 products summed in FP32, out
// FP32, or BF16 rounded once (beta * out added in FP32 before the rounding).
// The primitive of each shape is created on first use and kept (cpu->dnnl);
// its scratchpad is the backend's scratch. M, N, K > 0. Returns false, having
// done nothing, when oneDNN has no primitive for the shape (the caller falls
// back); aborts if executing one fails. Defined once, by the OpenMP build.
bool cpu_dnnl_matmul_bf16(struct backend *be, void *out, enum dtype out_dtype, const uint16_t *a,
                          const uint16_t *b, int M, int N, int K, bool trans_a, bool trans_b,
                          float alpha, float beta);

// Returns backend scratch of at least bytes (64-byte aligned); reallocates only
// when bytes exceeds every earlier request. Call outside parallel regions.
void *cpu_scratch(struct backend *be, size_t bytes);
// The same for cpu_backend.staging: not overwritten by the ops that use
// cpu_scratch.
void *cpu_scratch_staging(struct backend *be, size_t bytes);

// Memory and lifetime entries of the table (cpu_memory.c), shared by both tables.
void cpu_destroy(struct backend *be);
void *cpu_alloc(struct backend *be, size_t bytes);
void cpu_free(struct backend *be, void *ptr);
void cpu_memcpy(struct backend *be, void *dst, const void *src, size_t bytes);
void cpu_memset0(struct backend *be, void *dst, size_t bytes);
void cpu_synchronize(struct backend *be);

// The tables (cpu_table.c): the OpenMP kernels, and the same kernels built
// serially (see "The serial build" below).
extern const struct backend_ops cpu_ops, cpu_serial_ops;

// Aborts with "<op>: dtype <d> not supported by cpu backend" unless d is a
// float storage dtype (FP32, FP64, BF16, FP16).
#define CPU_CHECK_DTYPE(op, d)                                                          \
    CHECK((d) == DTYPE_FP32 || (d) == DTYPE_FP64 || (d) == DTYPE_BF16 || (d) == DTYPE_FP16, \
          "%s: dtype %s not supported by cpu backend", op, dtype_name(d))

// Calls name_f32, name_f64, name_bf16 or name_fp16(args) by storage dtype d.
#define CPU_DISPATCH(op, d, name, ...)                                           \
    do {                                                                         \
        switch (d) {                                                             \
        case DTYPE_FP32: name##_f32(__VA_ARGS__); break;                         \
        case DTYPE_FP64: name##_f64(__VA_ARGS__); break;                         \
        case DTYPE_BF16: name##_bf16(__VA_ARGS__); break;                        \
        case DTYPE_FP16: name##_fp16(__VA_ARGS__); break;                        \
        default: CPU_CHECK_DTYPE(op, d);                                         \
        }                                                                        \
    } while (0)

// The dtype of statistics, RoPE tables and master weights for storage d
// (ops.h): FP64 for FP64, else FP32 (creal of the instantiation).
static inline enum dtype cpu_compute_dtype(enum dtype d) {
    return d == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32;
}

// Aborts unless the parameter gradient g (rmsnorm dw, embedding dwte) of
// activations of dtype d is FP32/FP64 as cpu_compute_dtype(d), or d itself.
#define CPU_CHECK_GRAD(op, name, g, d)                                           \
    CHECK((g).dtype == (d) || (g).dtype == cpu_compute_dtype(d),                 \
          "%s: tensor %s is %s, expected %s or %s", op, name, dtype_name((g).dtype), \
          dtype_name(d), dtype_name(cpu_compute_dtype(d)))

// dst (rows, cols) contiguous FP32 = src (BF16/FP16 dt) rows ld elements
// apart: the attention kernels' per-head staging (cpu_attention.c,
// cpu_attention_block.c).
static inline void cpu_rows_to_f32(float *dst, const uint16_t *src, enum dtype dt, int rows,
                                   int cols, int ld) {
    for (int r = 0; r < rows; r++) {
        const uint16_t *s = src + (size_t)r * ld;
        float *d = dst + (size_t)r * cols;
        if (dt == DTYPE_BF16)
            for (int c = 0; c < cols; c++) d[c] = bf16_to_f32(s[c]);
        else
            for (int c = 0; c < cols; c++) d[c] = fp16_to_f32(s[c]);
    }
}

// dst (BF16/FP16 dt) rows ld elements apart = round(src (rows, cols) FP32),
// or round(dst + src) when add (one rounding per call).
static inline void cpu_rows_from_f32(uint16_t *dst, const float *src, enum dtype dt, int rows,
                                     int cols, int ld, bool add) {
    for (int r = 0; r < rows; r++) {
        uint16_t *d = dst + (size_t)r * ld;
        const float *s = src + (size_t)r * cols;
        if (dt == DTYPE_BF16)
            for (int c = 0; c < cols; c++)
                d[c] = bf16_from_f32(add ? bf16_to_f32(d[c]) + s[c] : s[c]);
        else
            for (int c = 0; c < cols; c++)
                d[c] = fp16_from_f32(add ? fp16_to_f32(d[c]) + s[c] : s[c]);
    }
}

// dst[i] += v on the data of a gradient of dtype d: FP32/FP64 as `+=` in that
// type; BF16/FP16 add in FP32 and round once per call.
static inline void cpu_grad_add(void *dst, enum dtype d, size_t i, double v) {
    switch (d) {
    case DTYPE_FP64: ((double *)dst)[i] += v; break;
    case DTYPE_BF16: {
        uint16_t *p = dst;
        p[i] = bf16_from_f32(bf16_to_f32(p[i]) + (float)v);
        break;
    }
    case DTYPE_FP16: {
        uint16_t *p = dst;
        p[i] = fp16_from_f32(fp16_to_f32(p[i]) + (float)v);
        break;
    }
    default: ((float *)dst)[i] += (float)v; break;
    }
}

// Aborts unless tensor t has dtype d (the checks ops.c leaves to backends).
#define CPU_CHECK_SAME(op, name, t, d)                                         \
    CHECK((t).dtype == (d), "%s: tensor %s is %s, expected %s", op, name,      \
          dtype_name((t).dtype), dtype_name(d))

// Dispatchers, one per line of kernels/ops_list.h: cpu_matmul, cpu_rope, ...
// with the signatures of struct backend_ops; each kernels/cpu/cpu_*.c defines
// those of its ops.
//
// The serial build: the Makefile (CPU_SERIAL_*) compiles kernels/cpu/*.c a
// second time without OpenMP and with -DCPU_SERIAL, and the backend uses it
// with one thread (cpu_backend.c): libgomp allocates (memalign) a team for
// every parallel region of a single thread, and the training step must
// allocate nothing. There the source name cpu_<op> gets the link name
// cpu_serial_<op> (a GNU asm label), so both builds link into one program,
// and cpu_table.c defines cpu_serial_ops.
#ifdef CPU_SERIAL
#define CPU_OP_PROTOTYPE(name, ret, params) ret cpu_##name params __asm__("cpu_serial_" #name);
#else
#define CPU_OP_PROTOTYPE(name, ret, params) ret cpu_##name params;
#endif
BACKEND_OPS(CPU_OP_PROTOTYPE)
// The optional entry matmul_invariant (cpu_matmul_dot.c), named as the others.
CPU_OP_PROTOTYPE(matmul_invariant, void, (struct backend *be, struct tensor out, struct tensor a,
                 struct tensor b, int M, int N, int K, bool trans_a, bool trans_b, float alpha,
                 float beta))
#undef CPU_OP_PROTOTYPE

#endif

// cpu.h: internals of the CPU backend (kernels/cpu/*.c), not part of ops.h.
//
// Each kernel body is written once in kernels/cpu/generic/*.h over a type
// `real` and instantiated for float and double by generic/instantiate.h (the
// scheme of PyTorch's old TH/generic): a .c file sets GENERIC_FILE and
// includes instantiate.h, which defines real, accreal, FN() and the math
// macros for FP32, includes the body, then does the same for FP64. The
// instantiated functions are static; the cpu_<op> dispatchers declared below
// pick one by dtype and are what the tables in cpu_table.c point to.
#ifndef TRIDENT_CPU_H
#define TRIDENT_CPU_H

#include <math.h>

#include "base/common.h"
#include "kernels/ops.h"

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
};

// Returns backend scratch of at least bytes (64-byte aligned); reallocates only
// when bytes exceeds every earlier request. Call outside parallel regions.
void *cpu_scratch(struct backend *be, size_t bytes);

// Memory and lifetime entries of the table (cpu_backend.c), shared by both tables.
void cpu_destroy(struct backend *be);
void *cpu_alloc(struct backend *be, size_t bytes);
void cpu_free(struct backend *be, void *ptr);
void cpu_memcpy(struct backend *be, void *dst, const void *src, size_t bytes);
void cpu_memset0(struct backend *be, void *dst, size_t bytes);
void cpu_synchronize(struct backend *be);

// The tables (cpu_table.c): the OpenMP kernels, and the same kernels built
// serially (see "The serial build" below).
extern const struct backend_ops cpu_ops, cpu_serial_ops;

// Aborts with "<op>: dtype <d> not supported by cpu backend" unless d is FP32
// or FP64 (BF16/FP16 kernels are not written yet).
#define CPU_CHECK_DTYPE(op, d)                                                 \
    CHECK((d) == DTYPE_FP32 || (d) == DTYPE_FP64,                              \
          "%s: dtype %s not supported by cpu backend (fp32 and fp64 only)", op, \
          dtype_name(d))

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
#undef CPU_OP_PROTOTYPE

#endif

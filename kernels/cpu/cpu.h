// cpu.h: internals of the CPU backend (kernels/cpu/*.c), not part of ops.h.
//
// Each kernel body is written once in kernels/cpu/generic/<op>.h over a type
// `real` and instantiated for float and double by generic/instantiate.h (the
// scheme of PyTorch's old TH/generic): a .c file sets GENERIC_FILE and
// includes instantiate.h, which defines real, accreal, FN() and the math
// macros for FP32, includes the body, then does the same for FP64. The
// instantiated functions are static; the cpu_* dispatchers below pick one by
// dtype and are what the table in cpu_backend.c points to.
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

// The tables (cpu_table.c): OpenMP kernels, and the same kernels built serially.
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

// Dispatchers, one per table entry (same signatures as struct backend_ops).
void cpu_matmul(struct backend *be, struct tensor out, struct tensor a, struct tensor b, int M,
                int N, int K, bool trans_a, bool trans_b, float alpha, float beta);
void cpu_embedding_forward(struct backend *be, struct tensor out, struct tensor wte,
                           struct tensor tokens, int N, int C, int vocab_start, int Vl);
void cpu_embedding_backward(struct backend *be, struct tensor dwte, struct tensor dout,
                            struct tensor tokens, int N, int C, int vocab_start, int Vl);
void cpu_rmsnorm_forward(struct backend *be, struct tensor y, struct tensor rstd, struct tensor x,
                         struct tensor w, int N, int C, float eps);
void cpu_rmsnorm_backward(struct backend *be, struct tensor dx, struct tensor dw, struct tensor dy,
                          struct tensor x, struct tensor w, struct tensor rstd, int N, int C);
void cpu_rope(struct backend *be, struct tensor x, struct tensor cos, struct tensor sin, int B,
              int T, int Hx, int D, int pos_offset, bool inverse);
void cpu_attention_forward(struct backend *be, struct tensor out, struct tensor lse,
                           struct tensor q, struct tensor k, struct tensor v, int B, int T, int H,
                           int Hkv, int D);
void cpu_attention_backward(struct backend *be, struct tensor dq, struct tensor dk,
                            struct tensor dv, struct tensor dout, struct tensor q, struct tensor k,
                            struct tensor v, struct tensor out, struct tensor lse, int B, int T,
                            int H, int Hkv, int D);
void cpu_swiglu_forward(struct backend *be, struct tensor out, struct tensor gate, struct tensor up,
                        size_t n);
void cpu_swiglu_backward(struct backend *be, struct tensor dgate, struct tensor dup,
                         struct tensor dout, struct tensor gate, struct tensor up, size_t n);
void cpu_scale(struct backend *be, struct tensor x, float s, size_t n);
void cpu_axpy(struct backend *be, struct tensor y, float a, struct tensor x, size_t n);
void cpu_add(struct backend *be, struct tensor out, struct tensor a, struct tensor b, size_t n);
void cpu_copy(struct backend *be, struct tensor dst, struct tensor src, size_t n);
void cpu_ce_row_max(struct backend *be, struct tensor rowmax, struct tensor logits, int N, int Vl,
                    int Vvalid);
void cpu_ce_partials(struct backend *be, struct tensor partials, struct tensor logits,
                     struct tensor rowmax, struct tensor targets, int N, int Vl, int Vvalid,
                     int vocab_start);
void cpu_ce_loss(struct backend *be, struct tensor loss, struct tensor lse, struct tensor partials,
                 struct tensor rowmax, struct tensor targets, int N, int V, float smoothing,
                 int ignore_index);
void cpu_ce_backward(struct backend *be, struct tensor dlogits, struct tensor logits,
                     struct tensor lse, struct tensor targets, int N, int Vl, int Vvalid,
                     int vocab_start, int V, float smoothing, int ignore_index, double scale);
void cpu_adamw(struct backend *be, struct tensor param, struct tensor master, struct tensor grad,
               struct tensor m, struct tensor v, size_t n, double lr, double beta1, double beta2,
               double eps, double weight_decay, double grad_scale, int step);
double cpu_sum_squares(struct backend *be, struct tensor x, size_t n);

#endif

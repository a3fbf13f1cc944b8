// cpu_matmul.c: matmul of the CPU backend. FP32/FP64: OpenBLAS sgemm/dgemm,
// row-major, threaded by slabs of the output (generic/matmul.h). BF16/FP16
// operands: FP32 accumulation, out FP32 or rounded once to the operands'
// dtype:
//   - BF16 on a CPU with AVX512_BF16 (cpu_backend.bf16_gemm): a oneDNN
//     matmul primitive (brgemm, vdpbf16ps: BF16 products, FP32 sums),
//     threaded by oneDNN's own OpenMP loops, writing BF16 or FP32 out
//     directly. One primitive per shape, created on first use and kept, with
//     the backend's scratch as its scratchpad: a step after the first creates
//     nothing and maps no new pages (oneDNN still mallocs a few bytes of
//     argument bookkeeping per call, so a BF16 step is not allocation-free:
//     test_no_alloc checks that it makes no allocation of 4 KiB or more).
//     Should oneDNN have no primitive for a shape: dnnl_gemm_bf16bf16f32
//     into FP32 (which allocates its packing buffers on every call) and a
//     rounding pass;
//   - otherwise (FP16, BF16 elsewhere): the operands converted to FP32 in the
//     backend's scratch (exact) and the FP32 path above.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

#include "cpu.h"

// Below this many multiply-adds one thread does the whole product: forking
// costs more than it saves.
#define MATMUL_SERIAL_WORK (64.0 * 64 * 64)
// Slabs of out per thread are cut at multiples of this (GEMM kernels unroll
// by up to 16 rows or columns).
#define MATMUL_ALIGN 16

#define GENERIC_FILE "kernels/cpu/generic/matmul.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE

// C (M, N) = alpha * op(A) @ op(B) + beta * C, BF16 A and B, FP32 C,
// row-major, transa/transb 'N' or 'T' (as dnnl_sgemm). libdnnl exports it
// (DNNL_API, extern "C", src/cpu/gemm/gemm.cpp) but oneDNN 2.6's public
// headers do not declare it; oneDNN's own tests (tests/gtests/
// test_gemm_common.hpp) declare it as here (bfloat16_t is a uint16_t).
dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N,
                                    dnnl_dim_t K, float alpha, const uint16_t *A, dnnl_dim_t lda,
                                    const uint16_t *B, dnnl_dim_t ldb, float beta, float *C,
                                    dnnl_dim_t ldc);

#ifndef CPU_SERIAL // defined once, by the OpenMP build
bool cpu_bf16_gemm_available(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return false;
    // One tiny product proves the library takes the call: 1.5 * 2 = 3.
    uint16_t a = bf16_from_f32(1.5f), b = bf16_from_f32(2.0f);
    float c = 0;
    return dnnl_gemm_bf16bf16f32('N', 'N', 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1) == dnnl_success &&
           c == 3.0f;
}

// Matmul primitives kept per backend; past this many shapes the oldest is
// replaced (a training step has ~20: 3 per distinct linear layer shape).
#define DNNL_MAX_MATMULS 64

// One primitive and its memory objects (their data pointers set per call).
struct cpu_dnnl_matmul {
    int M, N, K;
    bool trans_a, trans_b;
    enum dtype out_dtype;
    float alpha, beta;
    dnnl_primitive_t prim; // NULL: oneDNN has none for this shape
    dnnl_memory_t a, b, c, scratchpad;
    size_t scratchpad_bytes;
};

struct cpu_dnnl {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    int n, next; // entries used; the one to replace when all are
    struct cpu_dnnl_matmul mm[DNNL_MAX_MATMULS];
};

#define CHECK_DNNL(call) \
    do { \
        dnnl_status_t st_ = (call); \
        CHECK(st_ == dnnl_success, "oneDNN: %s failed: status %d", #call, (int)st_); \
    } while (0)

static void dnnl_matmul_destroy(struct cpu_dnnl_matmul *e) {
    if (!e->prim) return;
    dnnl_primitive_destroy(e->prim);
    dnnl_memory_destroy(e->a), dnnl_memory_destroy(e->b), dnnl_memory_destroy(e->c);
    if (e->scratchpad) dnnl_memory_destroy(e->scratchpad);
    e->prim = NULL;
}

// cpu->dnnl_free: frees cpu->dnnl.
static void dnnl_free(struct cpu_backend *cpu) {
    struct cpu_dnnl *d = cpu->dnnl;
    if (!d) return;
    for (int i = 0; i < d->n; i++) dnnl_matmul_destroy(&d->mm[i]);
    dnnl_stream_destroy(d->stream);
    dnnl_engine_destroy(d->engine);
    free(d);
    cpu->dnnl = NULL;
}

// Row-major (rows, cols) of dtype dt stored transposed ((cols, rows)) or not.
static void dnnl_md_2d(dnnl_memory_desc_t *md, int rows, int cols, dnnl_data_type_t dt, bool trans) {
    dnnl_dims_t dims = {rows, cols}, strides = {trans ? 1 : cols, trans ? rows : 1};
    CHECK_DNNL(dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides));
}

// Fills e (its key already set) with a primitive, or leaves e->prim NULL when
// oneDNN has none.
static void dnnl_matmul_create(struct cpu_dnnl *d, struct cpu_dnnl_matmul *e) {
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_md_2d(&a_md, e->M, e->K, dnnl_bf16, e->trans_a);
    dnnl_md_2d(&b_md, e->K, e->N, dnnl_bf16, e->trans_b);
    dnnl_md_2d(&c_md, e->M, e->N, e->out_dtype == DTYPE_BF16 ? dnnl_bf16 : dnnl_f32, false);
    dnnl_matmul_desc_t desc;
    CHECK_DNNL(dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md));
    dnnl_primitive_attr_t attr;
    CHECK_DNNL(dnnl_primitive_attr_create(&attr));
    CHECK_DNNL(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (e->alpha != 1) CHECK_DNNL(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &e->alpha));
    dnnl_post_ops_t post = NULL;
    if (e->beta != 0) { // out = alpha * product + beta * out, summed in FP32
        CHECK_DNNL(dnnl_post_ops_create(&post));
        CHECK_DNNL(dnnl_post_ops_append_sum(post, e->beta));
        CHECK_DNNL(dnnl_primitive_attr_set_post_ops(attr, post));
    }
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, d->engine, NULL);
    if (post) dnnl_post_ops_destroy(post);
    dnnl_primitive_attr_destroy(attr);
    e->prim = NULL;
    if (st != dnnl_success) return;
    const dnnl_memory_desc_t *pad_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->scratchpad_bytes = pad_md ? dnnl_memory_desc_get_size(pad_md) : 0;
    st = dnnl_primitive_create(&e->prim, pd);
    if (st == dnnl_success) {
        CHECK_DNNL(dnnl_memory_create(&e->a, &a_md, d->engine, DNNL_MEMORY_NONE));
        CHECK_DNNL(dnnl_memory_create(&e->b, &b_md, d->engine, DNNL_MEMORY_NONE));
        CHECK_DNNL(dnnl_memory_create(&e->c, &c_md, d->engine, DNNL_MEMORY_NONE));
        e->scratchpad = NULL;
        if (e->scratchpad_bytes)
            CHECK_DNNL(dnnl_memory_create(&e->scratchpad, pad_md, d->engine, DNNL_MEMORY_NONE));
    } else
        e->prim = NULL;
    dnnl_primitive_desc_destroy(pd);
}

bool cpu_dnnl_matmul_bf16(struct backend *be, void *out, enum dtype out_dtype, const uint16_t *a,
                          const uint16_t *b, int M, int N, int K, bool trans_a, bool trans_b,
                          float alpha, float beta) {
    struct cpu_backend *cpu = be->impl;
    struct cpu_dnnl *d = cpu->dnnl;
    if (!d) {
        d = cpu->dnnl = xcalloc(1, sizeof *d);
        cpu->dnnl_free = dnnl_free;
        CHECK_DNNL(dnnl_engine_create(&d->engine, dnnl_cpu, 0));
        CHECK_DNNL(dnnl_stream_create(&d->stream, d->engine, dnnl_stream_default_flags));
    }
    struct cpu_dnnl_matmul *e = NULL;
    for (int i = 0; i < d->n && !e; i++) {
        struct cpu_dnnl_matmul *x = &d->mm[i];
        if (x->M == M && x->N == N && x->K == K && x->trans_a == trans_a && x->trans_b == trans_b &&
            x->out_dtype == out_dtype && x->alpha == alpha && x->beta == beta)
            e = x;
    }
    if (!e) {
        if (d->n < DNNL_MAX_MATMULS) e = &d->mm[d->n++];
        else e = &d->mm[d->next], d->next = (d->next + 1) % DNNL_MAX_MATMULS;
        dnnl_matmul_destroy(e);
        *e = (struct cpu_dnnl_matmul){.M = M, .N = N, .K = K, .trans_a = trans_a,
                                      .trans_b = trans_b, .out_dtype = out_dtype, .alpha = alpha,
                                      .beta = beta};
        dnnl_matmul_create(d, e);
    }
    if (!e->prim) return false;
    CHECK_DNNL(dnnl_memory_set_data_handle(e->a, (void *)a));
    CHECK_DNNL(dnnl_memory_set_data_handle(e->b, (void *)b));
    CHECK_DNNL(dnnl_memory_set_data_handle(e->c, out));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    int nargs = 3;
    if (e->scratchpad) {
        CHECK_DNNL(dnnl_memory_set_data_handle(e->scratchpad, cpu_scratch(be, e->scratchpad_bytes)));
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->scratchpad};
    }
    dnnl_status_t st = dnnl_primitive_execute(e->prim, d->stream, nargs, args);
    CHECK(st == dnnl_success, "matmul: oneDNN bf16 matmul %dx%dx%d failed: status %d", M, N, K, (int)st);
    return true;
}
#endif

// dst (n,) FP32 = src (n,) of BF16/FP16 dtype dt, or the reverse (rounded).
static void lowp_to_f32(float *dst, const uint16_t *src, enum dtype dt, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = dt == DTYPE_BF16 ? bf16_to_f32(src[i]) : fp16_to_f32(src[i]);
}
static void lowp_from_f32(uint16_t *dst, const float *src, enum dtype dt, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = dt == DTYPE_BF16 ? bf16_from_f32(src[i]) : fp16_from_f32(src[i]);
}

static size_t round_up16(size_t n) { return (n + 15) / 16 * 16; } // floats: 64-byte aligned

// BF16/FP16 a and b; out FP32 or of a's dtype: BF16 through a oneDNN matmul
// primitive when the backend may; else computed in FP32 (scratch, unless out
// is FP32) and rounded once.
static void matmul_lowp(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                        int M, int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    if (M == 0 || N == 0) return;
    enum dtype dt = a.dtype;
    bool onednn = dt == DTYPE_BF16 && K > 0 && ((struct cpu_backend *)be->impl)->bf16_gemm;
    if (onednn && cpu_dnnl_matmul_bf16(be, out.data, out.dtype, a.data, b.data, M, N, K, trans_a,
                                       trans_b, alpha, beta))
        return;
    bool out_f32 = out.dtype == DTYPE_FP32;
    size_t mn = (size_t)M * N, mk = (size_t)M * K, kn = (size_t)K * N;
    size_t c_elems = out_f32 ? 0 : round_up16(mn), ab_elems = onednn ? 0 : round_up16(mk) + kn;
    float *scratch = c_elems + ab_elems ? cpu_scratch(be, (c_elems + ab_elems) * sizeof(float)) : NULL;
    float *c = out_f32 ? out.data : scratch;
    if (!out_f32) {
        if (beta != 0) lowp_to_f32(c, out.data, dt, mn);
        else memset(c, 0, mn * sizeof(float));
    }
    if (onednn) {
        dnnl_status_t st = dnnl_gemm_bf16bf16f32(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K,
                                                 alpha, a.data, trans_a ? M : K, b.data,
                                                 trans_b ? K : N, beta, c, N);
        CHECK(st == dnnl_success, "matmul: dnnl_gemm_bf16bf16f32 %dx%dx%d failed: status %d", M, N,
              K, (int)st);
    } else {
        float *af = scratch + c_elems, *bf = af + round_up16(mk);
        lowp_to_f32(af, a.data, dt, mk);
        lowp_to_f32(bf, b.data, dt, kn);
        matmul_f32(c, af, bf, M, N, K, trans_a, trans_b, alpha, beta);
    }
    if (!out_f32) lowp_from_f32(out.data, c, dt, mn);
}

void cpu_matmul(struct backend *be, struct tensor out, struct tensor a, struct tensor b, int M,
                int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    CPU_CHECK_DTYPE("matmul", a.dtype);
    CPU_CHECK_SAME("matmul", "b", b, a.dtype);
    if (a.dtype == DTYPE_BF16 || a.dtype == DTYPE_FP16) {
        CHECK(out.dtype == a.dtype || out.dtype == DTYPE_FP32, "matmul: out is %s, expected %s or fp32",
              dtype_name(out.dtype), dtype_name(a.dtype));
        matmul_lowp(be, out, a, b, M, N, K, trans_a, trans_b, alpha, beta);
        return;
    }
    CPU_CHECK_SAME("matmul", "out", out, a.dtype);
    if (out.dtype == DTYPE_FP32)
        matmul_f32(out.data, a.data, b.data, M, N, K, trans_a, trans_b, alpha, beta);
    else
        matmul_f64(out.data, a.data, b.data, M, N, K, trans_a, trans_b, alpha, beta);
}

// cpu_backend.c: the CPU backend's table, memory and threads (DESIGN.md §3).
// Memory is host memory: alloc is aligned_alloc(64), copies are memcpy and
// synchronize has nothing to wait for. Threads: OpenMP loops over rows and
// OpenBLAS for GEMMs; the Debian openmp build of OpenBLAS runs single-threaded
// when called inside an OpenMP parallel region (num_cpu_avail() returns 1 when
// omp_in_parallel()), which the attention and matmul kernels rely on.
#include "cpu.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

static void cpu_destroy(struct backend *be) {
    struct cpu_backend *cpu = be->impl;
    free(cpu->scratch);
    free(cpu);
    free(be);
}

static void *cpu_alloc(struct backend *be, size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64; // aligned_alloc needs a multiple of the alignment
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void cpu_free(struct backend *be, void *ptr) { free(ptr); }

static void cpu_memcpy(struct backend *be, void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}

static void cpu_memset0(struct backend *be, void *dst, size_t bytes) { memset(dst, 0, bytes); }

static void cpu_synchronize(struct backend *be) {}

void *cpu_scratch(struct backend *be, size_t bytes) {
    struct cpu_backend *cpu = be->impl;
    if (bytes > cpu->scratch_bytes) {
        free(cpu->scratch);
        cpu->scratch = cpu_alloc(be, bytes);
        CHECK(cpu->scratch, "cpu backend: out of memory for %zu bytes of scratch", bytes);
        cpu->scratch_bytes = bytes;
    }
    return cpu->scratch;
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_memcpy,
    .to_host = cpu_memcpy,
    .memset0 = cpu_memset0,
    .synchronize = cpu_synchronize,
    .matmul = cpu_matmul,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope = cpu_rope,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .ce_row_max = cpu_ce_row_max,
    .ce_partials = cpu_ce_partials,
    .ce_loss = cpu_ce_loss,
    .ce_backward = cpu_ce_backward,
    .adamw = cpu_adamw,
    .sum_squares = cpu_sum_squares,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .add = cpu_add,
    .copy = cpu_copy,
};

struct backend *backend_cpu_init(int threads) {
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }
    struct backend *be = xcalloc(1, sizeof *be);
    be->ops = &cpu_ops;
    be->impl = xcalloc(1, sizeof(struct cpu_backend));
    be->threads = omp_get_max_threads();
    return be;
}

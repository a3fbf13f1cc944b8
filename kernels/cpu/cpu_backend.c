// cpu_backend.c: the CPU backend's memory, threads and init (docs/design.md §3).
// Memory is host memory: alloc is aligned_alloc(64), copies are memcpy and
// synchronize has nothing to wait for. Threads: OpenMP loops over rows and
// OpenBLAS for GEMMs; the Debian openmp build of OpenBLAS runs single-threaded
// when called inside an OpenMP parallel region (num_cpu_avail() returns 1 when
// omp_in_parallel()), which the attention and matmul kernels rely on.
// The op table is in cpu_table.c, built twice: with OpenMP (cpu_ops) and
// without (cpu_serial_ops, chosen for a single thread).
#include "cpu.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

void cpu_destroy(struct backend *be) {
    struct cpu_backend *cpu = be->impl;
    free(cpu->scratch);
    free(cpu);
    free(be);
}

void *cpu_alloc(struct backend *be, size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64; // aligned_alloc needs a multiple of the alignment
    return aligned_alloc(64, rounded ? rounded : 64);
}

void cpu_free(struct backend *be, void *ptr) { free(ptr); }

void cpu_memcpy(struct backend *be, void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}

void cpu_memset0(struct backend *be, void *dst, size_t bytes) { memset(dst, 0, bytes); }

void cpu_synchronize(struct backend *be) {}

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


struct backend *backend_cpu_init(int threads) {
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }
    struct backend *be = xcalloc(1, sizeof *be);
    // One thread: the serial build of the same kernels, since libgomp
    // allocates a team for every parallel region of a single thread and the
    // training step must not allocate (kernels/cpu/cpu.h).
    be->ops = omp_get_max_threads() == 1 ? &cpu_serial_ops : &cpu_ops;
    be->impl = xcalloc(1, sizeof(struct cpu_backend));
    be->threads = omp_get_max_threads();
    return be;
}

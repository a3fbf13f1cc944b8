// cpu_backend.c: the CPU backend's threads and init (docs/design.md §3); its
// memory entries are in cpu_memory.c. Threads: OpenMP loops over rows and
// OpenBLAS for GEMMs; the Debian openmp build of OpenBLAS runs single-threaded
// when called inside an OpenMP parallel region (num_cpu_avail() returns 1 when
// omp_in_parallel()), which the attention and matmul kernels rely on.
// The op table is in cpu_table.c, built twice: with OpenMP (cpu_ops) and
// without (cpu_serial_ops, chosen for a single thread).
#include "cpu.h"

#include <cblas.h>
#include <omp.h>

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
    struct cpu_backend *cpu = xcalloc(1, sizeof *cpu);
    cpu->bf16_gemm = cpu_bf16_gemm_available();
    be->impl = cpu;
    be->threads = omp_get_max_threads();
    return be;
}

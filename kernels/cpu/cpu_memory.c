// cpu_memory.c: the CPU backend's memory entries of its table and the
// kernels' scratch (cpu.h). Memory is host memory: alloc is aligned_alloc(64)
// (CPU_HUGE_ALLOC bytes or more: 2 MiB aligned, advised as huge pages),
// copies are memcpy and synchronize has nothing to wait for. Built once (not
// in the serial build): both tables point here.
#include "cpu.h"

#include <string.h>
#include <sys/mman.h>

void cpu_destroy(struct backend *be) {
    struct cpu_backend *cpu = be->impl;
    if (cpu->dnnl_free) cpu->dnnl_free(cpu);
    free(cpu->scratch);
    free(cpu->staging);
    free(cpu);
    free(be);
}

// An arena of at least this many bytes (parameters, gradients, moments,
// activations of a large model) is 2 MiB aligned and advised as transparent
// huge pages (madvise; a kernel set to "madvise" gives them only so): a
// generation step streams every weight once, and one core reads ~16 GB/s
// through 2 MiB pages against ~13 through 4 KiB ones (the TLB; measured with
// a 400 MB read loop; the 124M model's one-prompt step: 45 tokens/s against
// 35, docs/performance.md). At most 2 MiB of rounding per arena; the advice
// failing (no huge page support) changes nothing.
#define CPU_HUGE_ALLOC ((size_t)64 << 20)
#define CPU_HUGE_PAGE ((size_t)2 << 20)

void *cpu_alloc(struct backend *be, size_t bytes) {
    if (bytes >= CPU_HUGE_ALLOC) {
        size_t r = (bytes + CPU_HUGE_PAGE - 1) / CPU_HUGE_PAGE * CPU_HUGE_PAGE;
        void *p = aligned_alloc(CPU_HUGE_PAGE, r);
        if (p) (void)madvise(p, r, MADV_HUGEPAGE);
        return p;
    }
    size_t rounded = (bytes + 63) / 64 * 64; // aligned_alloc needs a multiple of the alignment
    return aligned_alloc(64, rounded ? rounded : 64);
}

void cpu_free(struct backend *be, void *ptr) { free(ptr); }

void cpu_memcpy(struct backend *be, void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}

void cpu_memset0(struct backend *be, void *dst, size_t bytes) { memset(dst, 0, bytes); }

void cpu_synchronize(struct backend *be) {}

// *buf of *have bytes grown to at least bytes (contents not kept).
static void *scratch_grow(struct backend *be, void **buf, size_t *have, size_t bytes) {
    if (bytes > *have) {
        free(*buf);
        *buf = cpu_alloc(be, bytes);
        CHECK(*buf, "cpu backend: out of memory for %zu bytes of scratch", bytes);
        *have = bytes;
    }
    return *buf;
}

void *cpu_scratch(struct backend *be, size_t bytes) {
    struct cpu_backend *cpu = be->impl;
    return scratch_grow(be, &cpu->scratch, &cpu->scratch_bytes, bytes);
}

void *cpu_scratch_staging(struct backend *be, size_t bytes) {
    struct cpu_backend *cpu = be->impl;
    return scratch_grow(be, &cpu->staging, &cpu->staging_bytes, bytes);
}

// cuda_memory.cu: the scratch buffer the kernels share (cuda_internal.cuh),
// apart from cuda_backend.cu so that the table calls the kernels and the
// kernels call this file, never back into the table's file.
#include "cuda_internal.cuh"

#include <stdio.h>

// Replaces the scratch by one of bytes: waits for the stream first (earlier
// kernels may still use the old buffer). Returns cudaMalloc's status.
static cudaError_t scratch_resize(struct cuda_backend *c, size_t bytes) {
    CHECK_CUDA(cudaStreamSynchronize(c->stream));
    CHECK_CUDA(cudaFree(c->scratch));
    c->scratch = NULL, c->scratch_bytes = 0;
    cudaError_t e = cudaMalloc(&c->scratch, bytes);
    if (e == cudaSuccess) c->scratch_bytes = bytes;
    return e;
}

void *cuda_scratch(struct backend *be, size_t bytes) {
    struct cuda_backend *c = cuda_state(be);
    if (bytes > c->scratch_bytes) {
        if (c->scratch_reserved && !c->scratch_warned) {
            c->scratch_warned = true;
            fprintf(stderr, "cuda backend: a kernel asked for %zu bytes of scratch, %zu reserved at init "
                    "(backend_reserve); growing it mid-step (a device wait and a cudaMalloc)\n",
                    bytes, c->scratch_bytes);
        }
        CHECK_CUDA(scratch_resize(c, bytes));
    }
    return c->scratch;
}

cudaError_t cuda_scratch_reserve(struct backend *be, size_t bytes) {
    struct cuda_backend *c = cuda_state(be);
    c->scratch_reserved = true;
    if (bytes <= c->scratch_bytes) return cudaSuccess;
    return scratch_resize(c, bytes);
}

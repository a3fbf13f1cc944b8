// cuda_memory.cu: the scratch buffer the kernels share (cuda_internal.cuh),
// apart from cuda_backend.cu so that the table calls the kernels and the
// kernels call this file, never back into the table's file.
#include "cuda_internal.cuh"

void *cuda_scratch(struct backend *be, size_t bytes) {
    struct cuda_backend *c = cuda_state(be);
    if (bytes > c->scratch_bytes) {
        CHECK_CUDA(cudaStreamSynchronize(c->stream)); // earlier kernels may still use it
        CHECK_CUDA(cudaFree(c->scratch));
        c->scratch = NULL;
        CHECK_CUDA(cudaMalloc(&c->scratch, bytes));
        c->scratch_bytes = bytes;
    }
    return c->scratch;
}

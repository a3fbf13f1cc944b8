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

enum status cuda_reserve(struct backend *be, const struct backend_bounds *b, struct error *err) {
    struct cuda_backend *c = cuda_state(be);
    size_t need = cuda_scratch_sum_squares();
    need = MAX(need, cuda_scratch_rmsnorm_backward(b->rows, b->cols));
    need = MAX(need, cuda_scratch_attention_backward(b->B, b->T, b->H));
    need = MAX(need, cuda_attention_cudnn_scratch(be, b));
    c->scratch_reserved = true;
    if (need <= c->scratch_bytes) return STATUS_OK;
    cudaError_t e = scratch_resize(c, need);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return error_set(err, STATUS_RUNTIME, "cuda backend: reserving %zu bytes of scratch on device %d: %s",
                         need, c->device, cudaGetErrorString(e));
    }
    return STATUS_OK;
}

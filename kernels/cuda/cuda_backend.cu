// cuda_backend.cu: the CUDA backend's table, memory, streams and init
// (docs/design.md §3); the kernels' scratch is in cuda_memory.cu, so kernels
// never call back into this file. Memory is device memory from cudaMalloc (256-byte aligned);
// copies are cudaMemcpyAsync on the compute stream, ordered with the kernels.
// to_device from pageable host memory (what trident passes) returns once CUDA
// has staged the source, so the buffer may be reused at once; from pinned
// memory the copy is truly asynchronous (reuse after backend_synchronize).
// to_host synchronizes: its caller reads the result right away.
#include "cuda_internal.cuh"

#include <string.h>

// cuBLASLt workspace: 32 MiB covers the split-K algorithms of large GEMMs
// (NVIDIA recommends >= 32 MiB on Hopper).
#define CUDA_WORKSPACE_BYTES ((size_t)32 << 20)

static void cuda_destroy(struct backend *be) {
    struct cuda_backend *c = cuda_state(be);
    if (c->stream) cudaStreamSynchronize(c->stream); // best effort: also runs on init failure
    cuda_attention_cudnn_free(c);
    cudaFree(c->workspace);
    cudaFree(c->scratch);
    cudaFree(c->bad);
    cudaFree(c->done);
    cudaFreeHost(c->host_sum);
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->comm_stream) cudaStreamDestroy(c->comm_stream);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
    free(be);
}

static void *cuda_alloc(struct backend *be, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 64) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky-free error so later calls do not see it
        return NULL;
    }
    return p;
}

static void cuda_free(struct backend *be, void *ptr) {
    // cudaFree synchronizes the device: no kernel still reads ptr.
    CHECK_CUDA(cudaFree(ptr));
}

static void cuda_to_device(struct backend *be, void *dst, const void *src, size_t bytes) {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream(be)));
}

static void cuda_to_host(struct backend *be, void *dst, const void *src, size_t bytes) {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream(be)));
    CHECK_CUDA(cudaStreamSynchronize(cuda_stream(be)));
}

static void cuda_memset0(struct backend *be, void *dst, size_t bytes) {
    CHECK_CUDA(cudaMemsetAsync(dst, 0, bytes, cuda_stream(be)));
}

// Waits for the compute stream, then reports targets ce_loss found out of
// range (counting them on the device avoids a synchronization per call).
static void cuda_synchronize(struct backend *be) {
    struct cuda_backend *c = cuda_state(be);
    CHECK_CUDA(cudaStreamSynchronize(c->stream));
    int bad = 0;
    CHECK_CUDA(cudaMemcpy(&bad, c->bad, sizeof bad, cudaMemcpyDeviceToHost));
    CHECK(bad == 0, "ce_loss: %d targets outside [0, V) and not ignore_index", bad);
}

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .memset0 = cuda_memset0,
    .synchronize = cuda_synchronize,
#define CUDA_TABLE_ENTRY(name, ret, params) .name = cuda_##name,
    BACKEND_OPS(CUDA_TABLE_ENTRY)
#undef CUDA_TABLE_ENTRY
};

extern "C" int backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

// Init errors go to err (the caller reports them once, on every rank).
#define INIT_TRY(stmt, what)                                                   \
    do {                                                                       \
        cudaError_t e_ = (stmt);                                               \
        if (e_ != cudaSuccess) {                                               \
            error_set(err, STATUS_RUNTIME, "cuda backend: %s on device %d: %s (%s)", what, device, \
                      cudaGetErrorString(e_), #stmt);                          \
            goto fail;                                                         \
        }                                                                      \
    } while (0)

extern "C" struct backend *backend_cuda_init(int device, struct error *err) {
    int count = backend_cuda_device_count();
    if (count == 0) {
        error_set(err, STATUS_RUNTIME, "cuda backend: no CUDA device visible (driver missing or "
                                       "CUDA_VISIBLE_DEVICES empty)");
        return NULL;
    }
    if (device < 0 || device >= count) {
        error_set(err, STATUS_RUNTIME, "cuda backend: device %d requested, %d visible", device, count);
        return NULL;
    }
    struct backend *be = (struct backend *)xcalloc(1, sizeof *be);
    struct cuda_backend *c = (struct cuda_backend *)xcalloc(1, sizeof *c);
    be->ops = &cuda_ops;
    be->impl = c;
    be->threads = 1;
    c->device = device;
    INIT_TRY(cudaSetDevice(device), "cudaSetDevice");
    INIT_TRY(cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device),
             "reading the SM count");
    INIT_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "creating a stream");
    INIT_TRY(cudaStreamCreateWithFlags(&c->comm_stream, cudaStreamNonBlocking), "creating a stream");
    INIT_TRY(cudaMalloc(&c->workspace, CUDA_WORKSPACE_BYTES), "allocating the cuBLASLt workspace");
    c->workspace_bytes = CUDA_WORKSPACE_BYTES;
    INIT_TRY(cudaMalloc(&c->bad, sizeof(int)), "allocating a counter");
    INIT_TRY(cudaMemset(c->bad, 0, sizeof(int)), "zeroing a counter");
    INIT_TRY(cudaMallocHost(&c->host_sum, sizeof(double)), "allocating pinned memory");
    {
        cublasStatus_t s = cublasLtCreate(&c->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            c->lt = NULL;
            error_set(err, STATUS_RUNTIME, "cuda backend: cublasLtCreate on device %d: %s", device,
                      cublasGetStatusString(s));
            goto fail;
        }
    }
    return be;
fail:
    cuda_destroy(be);
    return NULL;
}

extern "C" void *backend_cuda_stream(struct backend *be) {
    CHECK(be->ops == &cuda_ops, "backend_cuda_stream: backend %s is not cuda", be->ops->name);
    return (void *)cuda_state(be)->stream;
}

extern "C" void *backend_cuda_comm_stream(struct backend *be) {
    CHECK(be->ops == &cuda_ops, "backend_cuda_comm_stream: backend %s is not cuda", be->ops->name);
    return (void *)cuda_state(be)->comm_stream;
}

extern "C" int backend_cuda_device(struct backend *be) {
    CHECK(be->ops == &cuda_ops, "backend_cuda_device: backend %s is not cuda", be->ops->name);
    return cuda_state(be)->device;
}

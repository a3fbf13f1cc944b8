// cuda_backend.cu: the CUDA backend's table, memory, streams and init
// (docs/design.md §3); the kernels' scratch is in cuda_memory.cu, so kernels
// never call back into this file. Memory is device memory from cudaMalloc (256-byte aligned);
// copies are cudaMemcpyAsync on the compute stream, ordered with the kernels.
// to_device copies the caller's (pageable) host memory into a ring of pinned
// staging slots and copies from there asynchronously, so the caller may reuse
// its buffer at once and the host does not wait for the device; a slot is
// reused only after the copy that read it has completed (its event).
// to_host synchronizes: its caller reads the result right away.
#include "cuda_internal.cuh"

#include <string.h>

// cuBLASLt workspace: 32 MiB covers the split-K algorithms of large GEMMs
// (NVIDIA recommends >= 32 MiB on Hopper).
#define CUDA_WORKSPACE_BYTES ((size_t)32 << 20)

static void stage_free(struct cuda_backend *c) {
    for (int i = 0; i < CUDA_STAGE_SLOTS; i++)
        if (c->stage_done[i]) cudaEventDestroy(c->stage_done[i]);
    cudaFreeHost(c->stage);
}

// The pinned staging ring of to_device: CUDA_STAGE_SLOTS slots of
// CUDA_STAGE_BYTES and an event each (recorded after the copy that reads it).
static cudaError_t stage_init(struct cuda_backend *c) {
    cudaError_t e = cudaMallocHost((void **)&c->stage, (size_t)CUDA_STAGE_SLOTS * CUDA_STAGE_BYTES);
    for (int i = 0; i < CUDA_STAGE_SLOTS && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&c->stage_done[i], cudaEventDisableTiming);
    return e;
}

static void cuda_destroy(struct backend *be) {
    struct cuda_backend *c = cuda_state(be);
    if (c->stream) cudaStreamSynchronize(c->stream); // best effort: also runs on init failure
    cuda_attention_cudnn_free(c);
    cuda_matmul_plans_free(c);
    cuda_matmul_fp8_plans_free(c);
    stage_free(c);
    cudaFree(c->workspace);
    cudaFree(c->scratch);
    cudaFree(c->bad);
    cudaFree(c->done);
    cudaFreeHost(c->host_sum);
    if (c->lt) cublasLtDestroy(c->lt);
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

// Through the staging ring, a slot's worth at a time: wait until the copy
// that last read the slot is done (at once unless the host is a ring ahead
// of the device), fill it, copy from it, mark it.
static void cuda_to_device(struct backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda_backend *c = cuda_state(be);
    for (size_t off = 0; off < bytes; off += CUDA_STAGE_BYTES) {
        size_t n = MIN(bytes - off, CUDA_STAGE_BYTES);
        int s = c->stage_next;
        c->stage_next = (s + 1) % CUDA_STAGE_SLOTS;
        char *slot = c->stage + (size_t)s * CUDA_STAGE_BYTES;
        CHECK_CUDA(cudaEventSynchronize(c->stage_done[s]));
        memcpy(slot, (const char *)src + off, n);
        CHECK_CUDA(cudaMemcpyAsync((char *)dst + off, slot, n, cudaMemcpyHostToDevice, c->stream));
        CHECK_CUDA(cudaEventRecord(c->stage_done[s], c->stream));
    }
}

static void cuda_to_host(struct backend *be, void *dst, const void *src, size_t bytes) {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream(be)));
    CHECK_CUDA(cudaStreamSynchronize(cuda_stream(be)));
}

static void cuda_memset0(struct backend *be, void *dst, size_t bytes) {
    CHECK_CUDA(cudaMemsetAsync(dst, 0, bytes, cuda_stream(be)));
}

// backend_reserve: the scratch for the largest request of the kernels at
// bounds (cuda_internal.cuh), allocated now.
static enum status cuda_reserve(struct backend *be, const struct backend_bounds *b, struct error *err) {
    size_t need = cuda_scratch_sum_squares();
    need = MAX(need, cuda_scratch_rmsnorm_backward(b->rows, b->cols));
    need = MAX(need, cuda_scratch_attention_backward(b->B, b->T, b->H));
    need = MAX(need, cuda_scratch_attention_block(b->B, b->T, b->T, b->H, true));
    need = MAX(need, cuda_attention_cudnn_scratch(be, b));
    need = MAX(need, cuda_scratch_matmul_fp8(b->fp8_gemm));
    cudaError_t e = cuda_scratch_reserve(be, need);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return error_set(err, STATUS_RUNTIME, "cuda backend: reserving %zu bytes of scratch on device %d: %s",
                         need, cuda_state(be)->device, cudaGetErrorString(e));
    }
    return STATUS_OK;
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
    .host_memory = false, // device memory: a reader copies it out
    .reserve = cuda_reserve,
    // none: backend_matmul_invariant runs matmul (cuBLASLt picks its
    // algorithm per shape, so a generation step's rows agree within rounding)
    .matmul_invariant = nullptr,
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

extern "C" int backend_cuda_device_bus_id(int device, char *out, size_t cap) {
    out[0] = 0;
    if (cudaDeviceGetPCIBusId(out, (int)cap, device) != cudaSuccess) {
        cudaGetLastError();
        out[0] = 0;
        return -1;
    }
    return 0;
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
    c->plans = (struct gemm_plan *)xcalloc(CUDA_GEMM_PLANS, sizeof *c->plans);
    INIT_TRY(cudaSetDevice(device), "cudaSetDevice");
    INIT_TRY(cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device),
             "reading the SM count");
    INIT_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "creating a stream");
    INIT_TRY(cudaMalloc(&c->workspace, CUDA_WORKSPACE_BYTES), "allocating the cuBLASLt workspace");
    c->workspace_bytes = CUDA_WORKSPACE_BYTES;
    INIT_TRY(cudaMalloc(&c->bad, sizeof(int)), "allocating a counter");
    // On the compute stream: cudaMemset would queue it on the legacy stream,
    // which is not ordered with the non-blocking compute stream.
    INIT_TRY(cudaMemsetAsync(c->bad, 0, sizeof(int), c->stream), "zeroing a counter");
    INIT_TRY(cudaMalloc(&c->done, sizeof(int)), "allocating a counter");
    INIT_TRY(cudaMemsetAsync(c->done, 0, sizeof(int), c->stream), "zeroing a counter");
    INIT_TRY(cudaMallocHost(&c->host_sum, sizeof(double)), "allocating pinned memory");
    INIT_TRY(stage_init(c), "allocating the pinned staging ring");
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

extern "C" int backend_cuda_device(struct backend *be) {
    CHECK(be->ops == &cuda_ops, "backend_cuda_device: backend %s is not cuda", be->ops->name);
    return cuda_state(be)->device;
}

extern "C" enum status backend_cuda_check_fp8(struct backend *be, struct error *err) {
    CHECK(be->ops == &cuda_ops, "backend_cuda_check_fp8: backend %s is not cuda", be->ops->name);
    int device = cuda_state(be)->device, major = 0, minor = 0;
    struct cudaDeviceProp prop;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaError_t e = cudaGetLastError();
        return error_set(err, STATUS_RUNTIME, "device %d: reading its compute capability: %s", device,
                         cudaGetErrorString(e));
    }
    if (major * 10 + minor >= 89) return STATUS_OK;
    return error_set(err, STATUS_BAD_INPUT, "device %d (%s) has compute capability %d.%d; FP8 matmuls need 8.9 "
                     "or newer (Ada, Hopper)", device, prop.name, major, minor);
}

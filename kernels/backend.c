// backend.c: run-time backend selection (kernels/backend.h). The only file
// outside kernels/cuda that knows whether CUDA was built: the Makefile defines
// TRIDENT_CUDA for every object when CUDA=1 (and rebuilds them when CUDA=
// changes, see $(BUILD)/cuda.flag).
#include "backend.h"

#include <string.h>

#ifdef TRIDENT_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif

bool backend_has_cuda(void) {
#ifdef TRIDENT_CUDA
    return true;
#else
    return false;
#endif
}

int backend_device_count(void) {
#ifdef TRIDENT_CUDA
    return backend_cuda_device_count();
#else
    return 0;
#endif
}

int backend_device_bus_id(int device, char *out, size_t cap) {
#ifdef TRIDENT_CUDA
    return backend_cuda_device_bus_id(device, out, cap);
#else
    (void)device;
    if (cap) out[0] = 0;
    return -1;
#endif
}

struct backend *backend_init(enum backend_kind kind, int device, int threads, struct error *err) {
    switch (kind) {
    case BACKEND_CPU: return backend_cpu_init(threads);
    case BACKEND_CUDA:
#ifdef TRIDENT_CUDA
        return backend_cuda_init(device, err);
#else
        error_set(err, STATUS_BAD_INPUT, "this build has no CUDA backend; rebuild with make CUDA=1");
        return NULL;
#endif
    }
    error_set(err, STATUS_BAD_INPUT, "backend_init: unknown backend kind %d", (int)kind);
    return NULL;
}

enum status backend_check_fp8(struct backend *be, struct error *err) {
#ifdef TRIDENT_CUDA
    if (!strcmp(be->ops->name, "cuda")) return backend_cuda_check_fp8(be, err);
#endif
    (void)be, (void)err;
    return STATUS_OK;
}

enum status backend_set_attention(struct backend *be, enum backend_attention mode, struct error *err) {
#ifdef TRIDENT_CUDA
    if (!strcmp(be->ops->name, "cuda")) return backend_cuda_set_attention(be, mode, err);
#endif
    if (mode == BACKEND_ATTENTION_CUDNN)
        return error_set(err, STATUS_BAD_INPUT, "system.attention = cudnn needs system.device = cuda: the %s "
                         "backend has only the native attention", be->ops->name);
    return STATUS_OK;
}

enum status backend_attention_uses_cudnn(struct backend *be, enum dtype dtype, int B, int T, int H, int Hkv,
                                         int D, bool backward, bool *cudnn, struct error *err) {
    *cudnn = false;
#ifdef TRIDENT_CUDA
    if (!strcmp(be->ops->name, "cuda"))
        return backend_cuda_attention_uses_cudnn(be, dtype, B, T, H, Hkv, D, backward, cudnn, err);
#endif
    return STATUS_OK;
}

void backend_set_attention_log(struct backend *be, FILE *log) {
#ifdef TRIDENT_CUDA
    if (!strcmp(be->ops->name, "cuda")) backend_cuda_set_attention_log(be, log);
#endif
    (void)be, (void)log;
}

unsigned backend_attention_take_path(struct backend *be) {
#ifdef TRIDENT_CUDA
    if (!strcmp(be->ops->name, "cuda")) return backend_cuda_attention_take_path(be);
#endif
    return BACKEND_ATTENTION_PATH_CPU;
}

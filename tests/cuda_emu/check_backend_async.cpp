// check_backend_async.cpp: trident's CUDA backend (kernels/cuda) against
// streams that run behind the host (the emulation's runtime_emu.cpp), in the
// situations where real-GPU ordering differs from call order. Built by `make
// EMU=1` into $(BUILD)/tests/check_backend_async, run by
// tests/e2e/cuda_emulated.sh. Each case runs in a child process (the backend
// reports by exiting).
// - ce_loss's out-of-range count: backend_init zeroes the device counter; a
//   ce_loss right after it, on the compute stream (non-blocking), must still
//   be counted by backend_synchronize. The legacy stream is held by a gate
//   over backend_init: a counter zeroed by cudaMemset (the legacy stream,
//   not ordered with a non-blocking stream) is zeroed after the kernel has
//   counted, and the bad target goes unreported.
// Exit 1 on a failed check.
#include <cuda_runtime.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#ifndef _Noreturn
#define _Noreturn __attribute__((noreturn))
#endif
extern "C" {
#include "base/common.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
}
#include "kernels/cuda/backend_cuda.h"

#include "check.h"

// One row, V = 4 classes, target 7: out of range, counted by ce_loss.
static void ce_loss_after_init() {
    struct emu_gate *g = emu_gate_close(0); // the legacy stream waits until opened
    struct error err = {};
    struct backend *be = backend_init(BACKEND_CUDA, 0, 1, &err);
    if (!be) {
        fprintf(stderr, "backend_init: %s\n", err.msg);
        _exit(3);
    }
    float zeros[4] = {1, 0, 0, 0};
    int32_t target = 7;
    void *loss = backend_alloc(be, 4 * sizeof(float)), *lse = backend_alloc(be, 4 * sizeof(float));
    void *partials = backend_alloc(be, 4 * sizeof(float)), *rowmax = backend_alloc(be, 4 * sizeof(float));
    void *targets = backend_alloc(be, sizeof target);
    backend_to_device(be, partials, zeros, sizeof zeros);
    backend_to_device(be, rowmax, zeros, sizeof zeros);
    backend_to_device(be, targets, &target, sizeof target);
    backend_ce_loss(be, tensor_view(loss, DTYPE_FP32, 1), tensor_view(lse, DTYPE_FP32, 1),
                    tensor_view(partials, DTYPE_FP32, 3), tensor_view(rowmax, DTYPE_FP32, 1),
                    tensor_view(targets, DTYPE_I32, 1), 1, 4, 0.0f, -100);
    cudaStreamSynchronize((cudaStream_t)backend_cuda_stream(be)); // the kernel has counted
    emu_gate_open(g);
    backend_synchronize(be); // must report the target
    fprintf(stderr, "backend_synchronize reported nothing\n");
}

int main() {
    std::string err;
    int st = in_child(ce_loss_after_init, &err);
    EXPECT(!(WIFEXITED(st) && WEXITSTATUS(st) == 0) &&
               err.find("ce_loss: 1 targets outside [0, V)") != std::string::npos,
           "a ce_loss right after backend_init: the out-of-range target went unreported (status %d):\n%s", st,
           err.c_str());
    printf("check_backend_async: %s\n", failures ? "FAIL" : "ok");
    return failures != 0;
}

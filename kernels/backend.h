// backend.h: run-time choice of the compute backend, so that model and
// training code hold no #ifdef CUDA. A build without `make CUDA=1` has no
// CUDA backend and says so in err when asked for one.
#ifndef TRIDENT_BACKEND_H
#define TRIDENT_BACKEND_H

#include <stdbool.h>

#include "base/common.h"
#include "ops.h"

enum backend_kind { BACKEND_CPU, BACKEND_CUDA };

// Whether this build contains the CUDA backend (make CUDA=1).
bool backend_has_cuda(void);

// CUDA devices visible to this process; 0 in a CPU-only build or without a
// driver or device. Never fails.
int backend_device_count(void);
// The PCI bus id of CUDA device `device` of this process ("0000:01:00.0";
// two processes on one node with the same id use the same GPU) into out (cap
// >= 16 bytes). Returns 0, or -1 (out "") in a CPU-only build or when the
// runtime cannot say.
int backend_device_bus_id(int device, char *out, size_t cap);

// A backend of the given kind: BACKEND_CPU with `threads` OpenMP threads
// (<= 0: OpenMP's default; device ignored), or BACKEND_CUDA on CUDA device
// `device` (the node-local rank; threads ignored). Returns NULL and fills err
// on failure: STATUS_BAD_INPUT "this build has no CUDA backend; rebuild with
// make CUDA=1" in a CPU-only build, STATUS_RUNTIME when the device cannot be
// used.
struct backend *backend_init(enum backend_kind kind, int device, int threads, struct error *err);

// Whether be can run the FP8 ops (kernels/ops.h "FP8"; precision.fp8): the
// CPU backend always (it emulates FP8 exactly); the CUDA backend when its
// device has FP8 tensor cores, compute capability 8.9 or newer (Ada, Hopper
// and later: cuBLASLt's FP8 matmuls). Else STATUS_BAD_INPUT with err naming
// the device, e.g. "device 0 (NVIDIA A100-SXM4-80GB) has compute capability
// 8.0; FP8 matmuls need 8.9 or newer (Ada, Hopper)". The trainer calls it at
// start when precision.fp8 != none and prefixes the key.
enum status backend_check_fp8(struct backend *be, struct error *err);

// How a backend runs attention_forward/backward ([system] attention,
// docs/config.md). AUTO: cuDNN's fused attention where the build has cuDNN,
// the device takes it and cuDNN plans the shape (BF16/FP16 only), else the
// native kernels (one line on stderr per shape that falls back); CUDNN: cuDNN
// or an error; NATIVE: never cuDNN. FP32 always runs native. A new backend
// starts in AUTO.
enum backend_attention { BACKEND_ATTENTION_AUTO, BACKEND_ATTENTION_CUDNN, BACKEND_ATTENTION_NATIVE };

// Sets be's attention mode. CUDA backend, CUDNN: opens cuDNN now and returns
// STATUS_RUNTIME naming the key, the failing call and cuDNN's status when it
// cannot. CPU backend: AUTO and NATIVE are the native kernels; CUDNN is
// STATUS_BAD_INPUT (cuDNN is the CUDA backend's).
enum status backend_set_attention(struct backend *be, enum backend_attention mode, struct error *err);

// Whether attention of this shape (q (B, T, H, D), k and v (B, T, Hkv, D),
// storage dtype) runs on cuDNN in be's current mode, forward or backward:
// *cudnn = true when it does (building and caching the shape's cuDNN plan, as
// the op itself would on first use). Returns STATUS_RUNTIME in CUDNN mode
// when cuDNN cannot run the shape: err names system.attention, the shape and
// cuDNN's status (the op itself would exit 1 with that message). The CPU
// backend answers false.
enum status backend_attention_uses_cudnn(struct backend *be, enum dtype dtype, int B, int T, int H, int Hkv,
                                         int D, bool backward, bool *cudnn, struct error *err);

// Where be says which path each attention shape takes, the first time a call
// of that shape (B, T, H, Hkv, D, dtype, forward or backward) runs: one line
// "attention: forward B=8 T=2048 H=16 Hkv=16 D=128 bf16 -> cudnn" or
// "... -> native (REASON)". NULL: nowhere (the trainer's ranks other than 0).
// A new CUDA backend says it on stderr; the CPU backend has one path and
// says nothing.
void backend_set_attention_log(struct backend *be, FILE *log);

// The attention paths be's attention_forward/backward calls took since the
// previous call (or the backend's start), as bits, and starts counting anew:
// BACKEND_ATTENTION_PATH_CUDNN and/or _NATIVE on the CUDA backend (both:
// some calls each way; 0: no call), BACKEND_ATTENTION_PATH_CPU on the CPU
// backend (its own kernels, whatever was called). Never fails.
enum {
    BACKEND_ATTENTION_PATH_CUDNN = 1,
    BACKEND_ATTENTION_PATH_NATIVE = 2,
    BACKEND_ATTENTION_PATH_CPU = 4
};
unsigned backend_attention_take_path(struct backend *be);

#endif

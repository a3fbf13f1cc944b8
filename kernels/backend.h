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

// A backend of the given kind: BACKEND_CPU with `threads` OpenMP threads
// (<= 0: OpenMP's default; device ignored), or BACKEND_CUDA on CUDA device
// `device` (the node-local rank; threads ignored). Returns NULL and fills err
// on failure: STATUS_BAD_INPUT "this build has no CUDA backend; rebuild with
// make CUDA=1" in a CPU-only build, STATUS_RUNTIME when the device cannot be
// used.
struct backend *backend_init(enum backend_kind kind, int device, int threads, struct error *err);

#endif

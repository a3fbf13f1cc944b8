// nvtx.c: the NVTX ranges of src/base/nvtx.h over the CUDA toolkit's
// header-only nvtx3 (nvtxRangePushA / nvtxRangePop; NVTX loads a tool from
// NVTX_INJECTION64_PATH on the first call). Empty without TRIDENT_NVTX.
#include "nvtx.h"

#ifdef TRIDENT_NVTX
#include <stdarg.h>
#include <stdio.h>

#include <nvtx3/nvToolsExt.h>

void nvtx_range_push(const char *fmt, ...) {
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    nvtxRangePushA(name);
}

void nvtx_range_pop(void) { nvtxRangePop(); }
#else
typedef int nvtx_unused; // ISO C wants a declaration in every translation unit
#endif

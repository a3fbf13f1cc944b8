// cpu_attention_decode.c: attention against a key/value cache on the CPU
// backend (kernels/ops.h, backend_attention_decode); the body in
// generic/attention_decode.h, instantiated for FP32, FP64, BF16 and FP16
// (BF16/FP16 loaded to FP32 element by element: a decode step reads each
// cached row once, so no conversion pass).
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"

#define GENERIC_FILE "kernels/cpu/generic/attention_decode.h"
#define GENERIC_LOWP
#include "generic/instantiate.h"
#undef GENERIC_LOWP
#undef GENERIC_FILE

void cpu_attention_decode(struct backend *be, struct tensor out, struct tensor q, struct tensor k,
                          struct tensor v, struct tensor k_cache, struct tensor v_cache,
                          struct tensor pos, int B, int Tq, int Tmax, int H, int Hkv, int D) {
    size_t elem = dtype_size(cpu_compute_dtype(q.dtype));
    int nt = omp_get_max_threads(), rows = B * Tq;
    // head chunks per query row: enough units for the threads when the rows
    // are fewer (a one-token step of one sequence)
    int hc = rows >= nt ? 1 : MIN(H, (nt + rows - 1) / rows);
    void *scratch = cpu_scratch(be, (size_t)H * ((size_t)Tmax + D + 2) * elem * (size_t)nt);
    CPU_DISPATCH("attention_decode", q.dtype, attention_decode, out.data, q.data, k.data, v.data,
                 k_cache.data, v_cache.data, (const int32_t *)pos.data, B, Tq, Tmax, H, Hkv, D,
                 hc, scratch);
}

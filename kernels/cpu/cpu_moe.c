// cpu_moe.c: the mixture-of-experts ops of the CPU backend (kernels/ops.h,
// "mixture of experts"); bodies in generic/moe.h, instantiated for FP32,
// FP64, BF16 and FP16 (routing: FP32 and FP64, the statistics dtypes); the
// dispatch plan, which sees only indices, here.
#include <math.h>
#include <string.h>

#include "cpu.h"

#define GENERIC_FILE "kernels/cpu/generic/moe.h"
#define GENERIC_LOWP
#include "generic/instantiate.h"
#undef GENERIC_LOWP
#undef GENERIC_FILE

void cpu_moe_route(struct backend *be, struct tensor probs, struct tensor lse,
                   struct tensor topk_idx, struct tensor topk_w, struct tensor stats,
                   struct tensor logits, struct tensor sel_bias, int N, int E, int k, bool renorm) {
    if (logits.dtype == DTYPE_FP64)
        moe_route_f64(probs.data, lse.data, topk_idx.data, topk_w.data, stats.data, logits.data,
                      sel_bias.numel ? sel_bias.data : NULL, N, E, k, renorm);
    else
        moe_route_f32(probs.data, lse.data, topk_idx.data, topk_w.data, stats.data, logits.data,
                      sel_bias.numel ? sel_bias.data : NULL, N, E, k, renorm);
}

void cpu_moe_route_backward(struct backend *be, struct tensor dlogits, struct tensor dtopk_w,
                            struct tensor probs, struct tensor lse, struct tensor topk_idx,
                            struct tensor aux_w, int N, int E, int k, bool renorm, float z_scale) {
    const void *aux = aux_w.numel ? aux_w.data : NULL;
    if (probs.dtype == DTYPE_FP64)
        moe_route_backward_f64(dlogits.data, dtopk_w.data, probs.data, lse.data, topk_idx.data,
                               aux, N, E, k, renorm, z_scale);
    else
        moe_route_backward_f32(dlogits.data, dtopk_w.data, probs.data, lse.data, topk_idx.data,
                               aux, N, E, k, renorm, z_scale);
}

// A stable counting sort: one pass in assignment order gives each assignment
// its rank within its expert; ranks at or past the capacity are dropped.
void cpu_moe_dispatch(struct backend *be, struct tensor counts, struct tensor dest,
                      struct tensor src, struct tensor topk_idx, int N, int E, int k,
                      int capacity) {
    int32_t *cnt = counts.data, *d = dest.data, *s = src.data;
    const int32_t *idx = topk_idx.data;
    size_t n = (size_t)N * k;
    memset(cnt, 0, 2 * (size_t)E * sizeof *cnt);
    for (size_t a = 0; a < n; a++) d[a] = cnt[E + idx[a]]++; // rank within the expert
    int32_t offset[E + 1];
    offset[0] = 0;
    for (int e = 0; e < E; e++) {
        cnt[e] = capacity > 0 && cnt[E + e] > capacity ? capacity : cnt[E + e];
        offset[e + 1] = offset[e] + cnt[e];
    }
    for (size_t a = 0; a < n; a++) s[a] = -1;
    for (size_t a = 0; a < n; a++) {
        int e = idx[a];
        if (d[a] < cnt[e]) {
            d[a] += offset[e];
            s[d[a]] = (int32_t)a;
        } else {
            d[a] = -1;
        }
    }
}

void cpu_moe_permute(struct backend *be, struct tensor xp, struct tensor x, struct tensor src,
                     int M, int C, int k) {
    CPU_DISPATCH("moe_permute", x.dtype, moe_permute, xp.data, x.data, src.data, M, C, k);
}

void cpu_moe_permute_backward(struct backend *be, struct tensor dx, struct tensor dxp,
                              struct tensor dest, int N, int C, int k) {
    CPU_DISPATCH("moe_permute_backward", dx.dtype, moe_permute_backward, dx.data, dxp.data,
                 dest.data, N, C, k);
}

void cpu_moe_combine(struct backend *be, struct tensor y, struct tensor yp, struct tensor w,
                     struct tensor dest, int N, int C, int k, bool sigmoid, bool accumulate) {
    const char *op = "moe_combine";
    CPU_CHECK_SAME(op, "w", w, cpu_compute_dtype(y.dtype));
    const int32_t *d = dest.numel ? dest.data : NULL;
    CPU_DISPATCH(op, y.dtype, moe_combine, y.data, yp.data, w.data, d, N, C, k, sigmoid,
                 accumulate);
}

void cpu_moe_combine_backward(struct backend *be, struct tensor dyp, struct tensor dw,
                              struct tensor dy, struct tensor yp, struct tensor w,
                              struct tensor dest, int N, int C, int k, bool sigmoid) {
    const char *op = "moe_combine_backward";
    CPU_CHECK_SAME(op, "w", w, cpu_compute_dtype(dy.dtype));
    const int32_t *d = dest.numel ? dest.data : NULL;
    CPU_DISPATCH(op, dy.dtype, moe_combine_backward, dyp.data, dw.data, dy.data, yp.data, w.data,
                 d, N, C, k, sigmoid);
}

// cpu_cross_entropy.c: vocab-parallel cross-entropy of the CPU backend;
// bodies in generic/cross_entropy.h, instantiated for FP32, FP64, BF16 and
// FP16 logits (statistics FP32, FP64 for FP64 logits).
#include <math.h>
#include <string.h>

#include "cpu.h"

#define GENERIC_FILE "kernels/cpu/generic/cross_entropy.h"
#define GENERIC_LOWP
#include "generic/instantiate.h"
#undef GENERIC_LOWP
#undef GENERIC_FILE

void cpu_ce_row_max(struct backend *be, struct tensor rowmax, struct tensor logits, int N, int Vl,
                    int Vvalid) {
    CPU_DISPATCH("ce_row_max", logits.dtype, ce_row_max, rowmax.data, logits.data, N, Vl, Vvalid);
}

void cpu_ce_partials(struct backend *be, struct tensor partials, struct tensor logits,
                     struct tensor rowmax, struct tensor targets, int N, int Vl, int Vvalid,
                     int vocab_start) {
    CPU_CHECK_SAME("ce_partials", "rowmax", rowmax, cpu_compute_dtype(logits.dtype));
    CPU_DISPATCH("ce_partials", logits.dtype, ce_partials, partials.data, logits.data,
                 rowmax.data, targets.data, N, Vl, Vvalid, vocab_start);
}

// Statistics only: partials, rowmax, loss and lse are FP32 (FP64 for FP64 logits).
void cpu_ce_loss(struct backend *be, struct tensor loss, struct tensor lse, struct tensor partials,
                 struct tensor rowmax, struct tensor targets, int N, int V, float smoothing,
                 int ignore_index) {
    const char *op = "ce_loss";
    CHECK(partials.dtype == DTYPE_FP32 || partials.dtype == DTYPE_FP64,
          "%s: partials are %s, expected fp32 or fp64", op, dtype_name(partials.dtype));
    CPU_CHECK_SAME(op, "loss", loss, partials.dtype);
    CPU_CHECK_SAME(op, "lse", lse, partials.dtype);
    CPU_CHECK_SAME(op, "rowmax", rowmax, partials.dtype);
    int bad = partials.dtype == DTYPE_FP32
                  ? ce_loss_f32(loss.data, lse.data, partials.data, rowmax.data, targets.data, N, V,
                                smoothing, ignore_index)
                  : ce_loss_f64(loss.data, lse.data, partials.data, rowmax.data, targets.data, N, V,
                                smoothing, ignore_index);
    CHECK(bad == 0, "ce_loss: %d of %d targets outside [0, V=%d) and not ignore_index=%d", bad, N,
          V, ignore_index);
}

void cpu_ce_backward(struct backend *be, struct tensor dlogits, struct tensor logits,
                     struct tensor lse, struct tensor targets, int N, int Vl, int Vvalid,
                     int vocab_start, int V, float smoothing, int ignore_index, double scale) {
    CPU_CHECK_SAME("ce_backward", "lse", lse, cpu_compute_dtype(logits.dtype));
    CHECK(Vvalid >= 0 && Vvalid <= Vl, "ce_backward: Vvalid=%d outside [0, Vl=%d]", Vvalid, Vl);
    CPU_DISPATCH("ce_backward", logits.dtype, ce_backward, dlogits.data, logits.data, lse.data,
                 targets.data, N, Vl, Vvalid, vocab_start, V, smoothing, ignore_index, scale);
}

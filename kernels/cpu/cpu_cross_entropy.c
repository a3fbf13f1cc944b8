// cpu_cross_entropy.c: vocab-parallel cross-entropy of the CPU backend;
// bodies in generic/cross_entropy.h, instantiated for FP32 and FP64.
#include <math.h>
#include <string.h>

#include "cpu.h"

#define GENERIC_FILE "kernels/cpu/generic/cross_entropy.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE

void cpu_ce_row_max(struct backend *be, struct tensor rowmax, struct tensor logits, int N, int Vl,
                    int Vvalid) {
    CPU_CHECK_DTYPE("ce_row_max", logits.dtype);
    if (logits.dtype == DTYPE_FP32) ce_row_max_f32(rowmax.data, logits.data, N, Vl, Vvalid);
    else ce_row_max_f64(rowmax.data, logits.data, N, Vl, Vvalid);
}

void cpu_ce_partials(struct backend *be, struct tensor partials, struct tensor logits,
                     struct tensor rowmax, struct tensor targets, int N, int Vl, int Vvalid,
                     int vocab_start) {
    CPU_CHECK_DTYPE("ce_partials", logits.dtype);
    CPU_CHECK_SAME("ce_partials", "rowmax", rowmax, logits.dtype);
    if (logits.dtype == DTYPE_FP32)
        ce_partials_f32(partials.data, logits.data, rowmax.data, targets.data, N, Vl, Vvalid,
                        vocab_start);
    else
        ce_partials_f64(partials.data, logits.data, rowmax.data, targets.data, N, Vl, Vvalid,
                        vocab_start);
}

void cpu_ce_loss(struct backend *be, struct tensor loss, struct tensor lse, struct tensor partials,
                 struct tensor rowmax, struct tensor targets, int N, int V, float smoothing,
                 int ignore_index) {
    const char *op = "ce_loss";
    CPU_CHECK_DTYPE(op, partials.dtype);
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
    CPU_CHECK_DTYPE("ce_backward", logits.dtype);
    CPU_CHECK_SAME("ce_backward", "lse", lse, logits.dtype);
    CHECK(Vvalid >= 0 && Vvalid <= Vl, "ce_backward: Vvalid=%d outside [0, Vl=%d]", Vvalid, Vl);
    if (logits.dtype == DTYPE_FP32)
        ce_backward_f32(dlogits.data, logits.data, lse.data, targets.data, N, Vl, Vvalid,
                        vocab_start, V, smoothing, ignore_index, scale);
    else
        ce_backward_f64(dlogits.data, logits.data, lse.data, targets.data, N, Vl, Vvalid,
                        vocab_start, V, smoothing, ignore_index, scale);
}

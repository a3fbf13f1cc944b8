// metrics_sink.h: the step scalars of the log line, also written for
// dashboards (docs/design.md §9, "TensorBoard and Prometheus"): TensorBoard
// event files in the run folder ([log] tensorboard) and a Prometheus
// textfile-collector file ([log] prometheus_file). Rank 0 only; private to
// src/train/.
#ifndef TRIDENT_METRICS_SINK_H
#define TRIDENT_METRICS_SINK_H

#include <stdbool.h>
#include <stddef.h>

#include "base/common.h"

// One log line's numbers, as metrics.jsonl holds them (before its rounding).
struct metrics_step {
    int step;            // optimizer steps done, this one included (metrics.jsonl "step")
    double loss;         // mean training loss of the step; non-finite allowed
    double lr;           // learning rate the step used
    double grad_norm;    // global gradient norm before clipping; non-finite allowed
    double tokens_per_s; // tokens of the global batch over the step's seconds
    double mfu;          // model FLOPs utilisation, a ratio (0..1)
    double mem_bytes;    // rank 0's planned device memory, bytes
    double step_time_s;  // the step's wall seconds
    double data_wait_s;  // seconds rank 0 waited for the batch
    int skipped;         // 1: the step was skipped (no update)
    int skipped_steps;   // steps skipped in the whole run
    double loss_scale;   // fp16 loss scale the step used; NaN: no scaler
    double fp8_saturated; // values the step's FP8 casts saturated, all ranks; NaN: no FP8
    double moe_aux_loss;  // mixture of experts (metrics.jsonl's moe_aux_loss, moe_z_loss,
    double moe_z_loss;    // moe_dropped: unscaled losses, assignments dropped); NaN: a
    double moe_dropped;   // dense model
};

struct metrics_sink_args {
    const char *run_dir;         // where event files go
    bool tensorboard;            // [log] tensorboard
    const char *prometheus_file; // [log] prometheus_file; "" off
    int start_step;              // steps done before this start (a resume's checkpoint step)
};

struct metrics_sink;

// Opens the sinks the args ask for (*out NULL when none): a new event file
// in run_dir (tb_event.h), which on a resume (start_step > 0) begins with a
// SessionLog START at start_step + 1 so that TensorBoard drops what an
// earlier attempt logged past the checkpoint; and checks that the Prometheus
// file's folder exists.
// Errors: STATUS_RUNTIME naming the event file; STATUS_BAD_INPUT naming
// [log] prometheus_file when its folder is missing.
enum status metrics_sink_open(struct metrics_sink **out, const struct metrics_sink_args *a,
                              struct error *err);

// Writes a log line's scalars: an Event at m->step (tags in metrics_sink.c)
// and the Prometheus file replaced atomically (temp file, rename). A write
// that fails prints one warning to stderr and turns that sink off: a
// dashboard never stops training. NULL s: no-op.
void metrics_sink_step(struct metrics_sink *s, const struct metrics_step *m);

// Writes a validation loss at `step` steps done (TensorBoard "lm loss validation").
void metrics_sink_eval(struct metrics_sink *s, int step, double val_loss);

// Notes that a checkpoint was saved now (Prometheus trident_checkpoint_age_seconds).
void metrics_sink_saved(struct metrics_sink *s);

// Closes the event file and frees s; NULL is a no-op.
void metrics_sink_close(struct metrics_sink *s);

#endif

// metrics_sink.c: TensorBoard scalars and the Prometheus textfile of each log
// line (metrics_sink.h).
// TensorBoard tags are Megatron-LM's where it has one (megatron/training/
// training.py, training_log and evaluate_and_print_results: "lm loss",
// "learning-rate", "grad-norm", "loss-scale", "iteration-time" in seconds,
// "lm loss validation"); the rest are named here. Megatron's "throughput" is
// TFLOP/s per GPU, not tokens/s, so trident does not use that tag.
// Prometheus: the text exposition format (prometheus.io/docs/instrumenting/
// exposition_formats) as node_exporter's textfile collector reads it (*.prom
// files, replaced by rename so it never reads a partial one); names follow
// prometheus.io/docs/practices/naming (base units in the name, _total for
// counters, _ratio for 0..1).

#include "metrics_sink.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/common.h"
#include "tb_event.h"

struct metrics_sink {
    struct tb_writer tb;        // tb.f NULL: no TensorBoard
    char prom[4096];            // "": no Prometheus file
    char prom_tmp[4200];
    char label[1100];           // run_dir="..." with the format's escapes
    double saved_s;             // time_now_s() of the last save; < 0 none yet
};

// The folder part of path ("." when none).
static void folder_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, cap, ".");
    else if (slash == path) snprintf(dir, cap, "/");
    else snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

enum status metrics_sink_open(struct metrics_sink **out, const struct metrics_sink_args *a,
                              struct error *err) {
    *out = NULL;
    if (!a->tensorboard && !a->prometheus_file[0]) return STATUS_OK;
    struct metrics_sink *s = xcalloc(1, sizeof *s);
    s->saved_s = -1;
    if (a->prometheus_file[0]) {
        char dir[4096];
        struct stat st;
        folder_of(a->prometheus_file, dir, sizeof dir);
        if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
            free(s);
            return error_set(err, STATUS_BAD_INPUT, "[log] prometheus_file = %s: its folder %s "
                             "does not exist", a->prometheus_file, dir);
        }
        snprintf(s->prom, sizeof s->prom, "%s", a->prometheus_file);
        // A name the textfile collector skips (it reads *.prom only).
        snprintf(s->prom_tmp, sizeof s->prom_tmp, "%s.%ld.tmp", a->prometheus_file, (long)getpid());
        // Label value escapes: backslash, double quote, newline.
        size_t n = 0;
        n += (size_t)snprintf(s->label, sizeof s->label, "run_dir=\"");
        for (const char *p = a->run_dir; *p && n + 4 < sizeof s->label; p++) {
            if (*p == '\\' || *p == '"') s->label[n++] = '\\', s->label[n++] = *p;
            else if (*p == '\n') s->label[n++] = '\\', s->label[n++] = 'n';
            else s->label[n++] = *p;
        }
        snprintf(s->label + n, sizeof s->label - n, "\"");
    }
    if (a->tensorboard) {
        enum status st = tb_writer_open(&s->tb, a->run_dir, err);
        if (!st && a->start_step > 0) st = tb_writer_write(&s->tb, a->start_step + 1, NULL, 0, err);
        if (st) {
            tb_writer_close(&s->tb);
            free(s);
            return st;
        }
        printf("tensorboard: %s\n", s->tb.path);
    }
    *out = s;
    return STATUS_OK;
}

static void tb_write(struct metrics_sink *s, int step, const struct tb_scalar *v, int n) {
    struct error err;
    if (!s->tb.f || !tb_writer_write(&s->tb, step, v, n, &err)) return;
    fprintf(stderr, "warning: %s; no more TensorBoard events in this run\n", err.msg);
    tb_writer_close(&s->tb);
}

// One metric of the exposition format: HELP, TYPE and its one sample.
static void prom_metric(FILE *f, const char *label, const char *name, const char *type,
                        const char *help, double v) {
    char num[40];
    if (isnan(v)) snprintf(num, sizeof num, "NaN");
    else if (isinf(v)) snprintf(num, sizeof num, v > 0 ? "+Inf" : "-Inf");
    else snprintf(num, sizeof num, "%.17g", v);
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %s\n", name, help, name, type, name, label, num);
}

// The whole file written to prom_tmp, then renamed over prom: a reader sees
// the previous file or this one. No fsync: the file describes the present and
// is rewritten at the next log line; a crash losing it loses nothing.
static void prom_write(struct metrics_sink *s, const struct metrics_step *m) {
    if (!s->prom[0]) return;
    FILE *f = fopen(s->prom_tmp, "w");
    if (f) {
        const char *l = s->label;
        prom_metric(f, l, "trident_step", "gauge", "Optimizer steps done.", m->step);
        prom_metric(f, l, "trident_loss", "gauge", "Training loss of the last logged step.", m->loss);
        prom_metric(f, l, "trident_learning_rate", "gauge", "Learning rate of the last logged step.", m->lr);
        prom_metric(f, l, "trident_grad_norm", "gauge", "Gradient norm before clipping, last logged step.",
                    m->grad_norm);
        prom_metric(f, l, "trident_tokens_per_second", "gauge",
                    "Tokens of the global batch per second, last logged step.", m->tokens_per_s);
        prom_metric(f, l, "trident_mfu_ratio", "gauge", "Model FLOPs utilisation (0 to 1), last logged step.",
                    m->mfu);
        prom_metric(f, l, "trident_memory_bytes", "gauge", "Rank 0's planned device memory in bytes.",
                    m->mem_bytes);
        prom_metric(f, l, "trident_step_duration_seconds", "gauge", "Wall seconds of the last logged step.",
                    m->step_time_s);
        prom_metric(f, l, "trident_data_wait_seconds", "gauge",
                    "Seconds rank 0 waited for the last logged step's batch.", m->data_wait_s);
        prom_metric(f, l, "trident_skipped_steps_total", "counter",
                    "Steps skipped (non-finite loss or gradient norm, fp16 overflow) in the run.",
                    m->skipped_steps);
        if (isfinite(m->loss_scale))
            prom_metric(f, l, "trident_loss_scale", "gauge", "fp16 loss scale of the last logged step.",
                        m->loss_scale);
        if (!isnan(m->fp8_saturated))
            prom_metric(f, l, "trident_fp8_saturated", "gauge",
                        "Values the last logged step's FP8 casts saturated, over all ranks.", m->fp8_saturated);
        if (!isnan(m->moe_aux_loss)) { // metrics.jsonl's moe_aux_loss, moe_z_loss, moe_dropped
            prom_metric(f, l, "trident_moe_aux_loss", "gauge",
                        "Load-balancing loss of the last logged step (unscaled, summed over MoE blocks).",
                        m->moe_aux_loss);
            prom_metric(f, l, "trident_moe_z_loss", "gauge",
                        "Router z-loss of the last logged step (unscaled, summed over MoE blocks).",
                        m->moe_z_loss);
            prom_metric(f, l, "trident_moe_dropped_tokens", "gauge",
                        "Token-to-expert assignments the capacity dropped since the previous log line.",
                        m->moe_dropped);
        }
        if (s->saved_s >= 0)
            prom_metric(f, l, "trident_checkpoint_age_seconds", "gauge",
                        "Seconds since this process last saved a checkpoint.", time_now_s() - s->saved_s);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        prom_metric(f, l, "trident_last_log_timestamp_seconds", "gauge",
                    "Unix time of the last log line.", (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    }
    if (!f || ferror(f) | fclose(f) || rename(s->prom_tmp, s->prom)) {
        fprintf(stderr, "warning: [log] prometheus_file %s: cannot write: %s; not written again in "
                "this run\n", s->prom, strerror(errno));
        unlink(s->prom_tmp);
        s->prom[0] = '\0';
    }
}

void metrics_sink_step(struct metrics_sink *s, const struct metrics_step *m) {
    if (!s) return;
    struct tb_scalar v[15] = {
        {"lm loss", m->loss},
        {"learning-rate", m->lr},
        {"grad-norm", m->grad_norm},
        {"iteration-time", m->step_time_s},
        {"tokens-per-second", m->tokens_per_s},
        {"mfu", m->mfu},
        {"memory-bytes", m->mem_bytes},
        {"data-wait-ms", m->data_wait_s * 1e3},
        {"skipped", m->skipped},
        {"skipped-steps", m->skipped_steps},
    };
    int n = 10; // the optional ones when they exist
    if (!isnan(m->loss_scale)) v[n++] = (struct tb_scalar){"loss-scale", m->loss_scale};
    if (!isnan(m->fp8_saturated)) v[n++] = (struct tb_scalar){"fp8-saturated", m->fp8_saturated};
    if (!isnan(m->moe_aux_loss)) { // Megatron-Core's MoE tags: load_balancing_loss, z_loss
        v[n++] = (struct tb_scalar){"load_balancing_loss", m->moe_aux_loss};
        v[n++] = (struct tb_scalar){"z_loss", m->moe_z_loss};
        v[n++] = (struct tb_scalar){"moe-dropped-tokens", m->moe_dropped};
    }
    tb_write(s, m->step, v, n);
    prom_write(s, m);
}

void metrics_sink_eval(struct metrics_sink *s, int step, double val_loss) {
    if (!s) return;
    struct tb_scalar v = {"lm loss validation", val_loss};
    tb_write(s, step, &v, 1);
}

void metrics_sink_saved(struct metrics_sink *s) {
    if (s) s->saved_s = time_now_s();
}

void metrics_sink_close(struct metrics_sink *s) {
    if (!s) return;
    tb_writer_close(&s->tb);
    free(s);
}

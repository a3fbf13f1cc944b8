// cmd_plot.c: `trident plot RUN_DIR [--out PNG] [--data FILE]`: the curves of a run folder
// as one PNG with four panels, drawn by gnuplot (pngcairo terminal; Debian's
// gnuplot-nox, installed by `make deps`).
//
// Inputs (docs/design.md §9, "The run folder keeps its history"):
// RUN_DIR/metrics.jsonl (step records: "loss" (null when non-finite), "lr",
// "grad_norm", "tokens_per_s"; validation records: "val_loss"; closing
// records are skipped) and the resolved configs: the x axis of every panel is
// tokens, each step global_batch_size * seq_len of the config of the start
// that ran it (a start record {"event": "start", "step": S} begins a segment
// drawn with RUN_DIR/config-S.ini, its latest variant config-S-K.ini when
// there are several; RUN_DIR/config.ini, the latest start's, when there is
// no start record or no such file). A resume may change global_batch_size,
// so a requeue chain's tokens are the sum over its segments. The columns go
// to a data file (temporary, or --data FILE), a gnuplot script draws it into
// PNG.tmp, renamed to PNG when gnuplot succeeds.
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cli_flags.h"
#include "config/config.h"

extern char **environ;

#define PLOT_WIDTH 1200 // the PNG's size in pixels (docs/design.md §9)
#define PLOT_HEIGHT 900

// The curves read from metrics.jsonl: n_steps step records, n_val validation
// records, both in file order.
struct plot_data {
    double *step_tokens, *step, *loss, *lr, *grad_norm, *tokens_per_s; // (n_steps,)
    double *val_tokens, *val_step, *val_loss;                          // (n_val,)
    int n_steps, n_val, cap_steps, cap_val;
    int n_segments;        // start records seen
    double last_step_tokens; // tokens per step of the last segment (the title's)
};

static void plot_data_free(struct plot_data *d) {
    free(d->step_tokens), free(d->step), free(d->loss), free(d->lr), free(d->grad_norm);
    free(d->tokens_per_s), free(d->val_tokens), free(d->val_step), free(d->val_loss);
}

static void grow(double **a, int cap) {
    double *p = realloc(*a, sizeof(double) * (size_t)cap);
    CHECK(p, "out of host memory (%d values)", cap);
    *a = p;
}

// A field as a number; NaN when missing or null (gnuplot skips NaN).
static double json_num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

// Tokens per optimizer step (global_batch_size * seq_len) of the config at
// path. Errors: config_load's (STATUS_BAD_INPUT naming the file).
static enum status plot_config_tokens(const char *path, double *tokens, struct error *err) {
    struct config c;
    enum status st = config_load(path, 0, NULL, &c, err);
    if (!st) *tokens = (double)c.train.global_batch_size * c.train.seq_len;
    return st;
}

// Tokens per step of the start at step S: RUN_DIR/config-S.ini or its latest
// variant config-S-K.ini (src/train/run_folder.c names them), else fallback
// (config.ini's).
static enum status plot_start_tokens(const char *run_dir, long S, double fallback, double *tokens,
                                     struct error *err) {
    size_t n = strlen(run_dir) + 64;
    char *path = xmalloc(n), *found = xmalloc(n);
    snprintf(found, n, "%s/config-%ld.ini", run_dir, S);
    enum status st = STATUS_OK;
    if (access(found, F_OK)) {
        *tokens = fallback;
    } else {
        for (int k = 2;; k++) { // config-S-2.ini, -3, ...: later attempts at S
            snprintf(path, n, "%s/config-%ld-%d.ini", run_dir, S, k);
            if (access(path, F_OK)) break;
            snprintf(found, n, "%s", path);
        }
        st = plot_config_tokens(found, tokens, err);
    }
    free(path), free(found);
    return st;
}

// Reads the step and validation records of the metrics file at path: step s
// of the segment that began at step S0 with T0 tokens done, tps tokens per
// step, is at T0 + (s - S0) * tps tokens (plot_start_tokens; before any start
// record, S0 = T0 = 0 and tps = fallback). An unparsable line is an error
// (STATUS_BAD_INPUT naming path:line) except a torn last line, which a
// killed run leaves and the next start drops (skipped with a note on stderr).
// No step record: STATUS_BAD_INPUT naming the file.
static enum status plot_read_metrics(const char *run_dir, const char *path, double fallback,
                                     struct plot_data *d, struct error *err) {
    double S0 = 0, T0 = 0, tps = fallback;
    FILE *f = fopen(path, "r");
    if (!f) return error_set(err, STATUS_BAD_INPUT, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, bad_line = 0;
    enum status st = STATUS_OK;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (bad_line) { // an unparsable line followed by more lines: not a torn tail
            st = error_set(err, STATUS_BAD_INPUT, "%s:%d: not a JSON object", path, bad_line);
            break;
        }
        if (len <= 1 && (len == 0 || line[0] == '\n')) continue;
        json_t *o = json_loads(line, JSON_DECODE_ANY, NULL);
        if (!json_is_object(o)) {
            json_decref(o);
            bad_line = lineno;
            continue;
        }
        double step = json_num(o, "step");
        json_t *event = json_object_get(o, "event");
        if (json_is_string(event) && !strcmp(json_string_value(event), "start") && isfinite(step)) {
            T0 += (step - S0) * tps, S0 = step;
            d->n_segments++;
            st = plot_start_tokens(run_dir, (long)step, fallback, &tps, err);
            json_decref(o);
            if (st) break;
            continue;
        }
        if (json_object_get(o, "loss") && isfinite(step)) {
            if (d->n_steps == d->cap_steps) {
                d->cap_steps = d->cap_steps ? 2 * d->cap_steps : 256;
                grow(&d->step_tokens, d->cap_steps), grow(&d->step, d->cap_steps);
                grow(&d->loss, d->cap_steps);
                grow(&d->lr, d->cap_steps), grow(&d->grad_norm, d->cap_steps);
                grow(&d->tokens_per_s, d->cap_steps);
            }
            int i = d->n_steps++;
            d->step_tokens[i] = T0 + (step - S0) * tps, d->step[i] = step;
            d->loss[i] = json_num(o, "loss");
            d->lr[i] = json_num(o, "lr");
            d->grad_norm[i] = json_num(o, "grad_norm");
            d->tokens_per_s[i] = json_num(o, "tokens_per_s");
        } else if (json_object_get(o, "val_loss") && isfinite(step)) {
            if (d->n_val == d->cap_val) {
                d->cap_val = d->cap_val ? 2 * d->cap_val : 64;
                grow(&d->val_tokens, d->cap_val), grow(&d->val_step, d->cap_val);
                grow(&d->val_loss, d->cap_val);
            }
            d->val_step[d->n_val] = step;
            d->val_tokens[d->n_val] = T0 + (step - S0) * tps;
            d->val_loss[d->n_val++] = json_num(o, "val_loss");
        }
        json_decref(o);
    }
    d->last_step_tokens = tps;
    if (!st && ferror(f)) st = error_set(err, STATUS_RUNTIME, "%s: read error", path);
    free(line);
    fclose(f);
    if (st) return st;
    if (bad_line)
        fprintf(stderr, "trident plot: %s:%d: torn last line skipped (a run killed mid-write)\n", path,
                bad_line);
    if (!d->n_steps)
        return error_set(err, STATUS_BAD_INPUT, "%s: no step records (lines with \"loss\"): nothing to plot",
                         path);
    return STATUS_OK;
}

// Writes s as a gnuplot single-quoted string (a quote inside is doubled).
static void gp_quote(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

// The data file (also --data FILE): a comment line, then block 0 the step
// records (tokens step loss lr grad_norm tokens_per_s; NaN for null), block
// 1 (after two blank lines, gnuplot's `index 1`) the validation records
// (tokens step val_loss). %.17g keeps every digit, so two folders that
// differ in one value give two different pictures' inputs.
static enum status plot_write_data(const char *path, const struct plot_data *d, struct error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return error_set(err, STATUS_RUNTIME, "%s: %s", path, strerror(errno));
    fprintf(f, "# trident plot: tokens step loss lr grad_norm tokens_per_s; after two blank lines: "
               "tokens step val_loss\n");
    for (int i = 0; i < d->n_steps; i++)
        fprintf(f, "%.17g %.17g %.17g %.17g %.17g %.17g\n", d->step_tokens[i], d->step[i], d->loss[i],
                d->lr[i], d->grad_norm[i], d->tokens_per_s[i]);
    fprintf(f, "\n\n");
    for (int i = 0; i < d->n_val; i++)
        fprintf(f, "%.17g %.17g %.17g\n", d->val_tokens[i], d->val_step[i], d->val_loss[i]);
    if (fclose(f)) return error_set(err, STATUS_RUNTIME, "%s: write error: %s", path, strerror(errno));
    return STATUS_OK;
}

// The gnuplot script: a 2x2 multiplot of PLOT_WIDTH x PLOT_HEIGHT pixels,
// loss (and validation loss when there is any), lr, grad norm, tokens/s,
// each against tokens, written to out.
static enum status plot_write_script(const char *path, const char *data, const char *out,
                                     const char *title, bool has_val, struct error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return error_set(err, STATUS_RUNTIME, "%s: %s", path, strerror(errno));
    fprintf(f, "set terminal pngcairo size %d,%d noenhanced font ',10'\nset output ", PLOT_WIDTH,
            PLOT_HEIGHT);
    gp_quote(f, out);
    fprintf(f, "\ndata = ");
    gp_quote(f, data);
    fprintf(f, "\nset datafile missing 'NaN'\nset grid\nset key top right\n"
               "set xlabel 'tokens'\nset format x '%%.1s%%c'\n"
               "set multiplot layout 2,2 title ");
    gp_quote(f, title);
    fprintf(f, "\nset title 'loss'\n"
               "plot data index 0 using 1:3 with lines lw 1.5 title 'train loss'%s\n",
            has_val ? ", data index 1 using 1:3 with linespoints pt 7 ps 0.8 lw 1.5 title 'validation loss'" : "");
    fprintf(f, "set title 'learning rate'\nset format y '%%.1e'\n"
               "plot data index 0 using 1:4 with lines lw 1.5 notitle\n"
               "set title 'grad norm'\nset format y '%%g'\n"
               "plot data index 0 using 1:5 with lines lw 1.5 notitle\n"
               "set title 'tokens/s'\n"
               "plot data index 0 using 1:6 with lines lw 1.5 notitle\n"
               "unset multiplot\nset output\n");
    if (fclose(f)) return error_set(err, STATUS_RUNTIME, "%s: write error: %s", path, strerror(errno));
    return STATUS_OK;
}

// Runs `gnuplot SCRIPT` (PATH lookup). gnuplot missing: STATUS_BAD_INPUT
// saying `make deps`; gnuplot failing: STATUS_RUNTIME (its own message is on
// stderr above ours).
static enum status plot_run_gnuplot(const char *script, struct error *err) {
    char *args[] = {"gnuplot", (char *)script, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "gnuplot", NULL, NULL, args, environ);
    if (rc == ENOENT)
        return error_set(err, STATUS_BAD_INPUT, "gnuplot not found on PATH: run `make deps` "
                                                "(the Debian package gnuplot-nox)");
    if (rc) return error_set(err, STATUS_RUNTIME, "cannot start gnuplot: %s", strerror(rc));
    int ws;
    while (waitpid(pid, &ws, 0) < 0)
        if (errno != EINTR)
            return error_set(err, STATUS_RUNTIME, "waitpid(gnuplot): %s", strerror(errno));
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 127) // a shell wrapper that found no gnuplot
        return error_set(err, STATUS_BAD_INPUT, "gnuplot could not run: run `make deps` "
                                                "(the Debian package gnuplot-nox)");
    if (!WIFEXITED(ws) || WEXITSTATUS(ws))
        return error_set(err, STATUS_RUNTIME, "gnuplot failed (%s %d) on %s",
                         WIFEXITED(ws) ? "exit" : "signal", WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws),
                         script);
    return STATUS_OK;
}

// The folder's name in the title: run_dir's last component.
static void plot_title(char *title, size_t size, const char *run_dir, const struct plot_data *d) {
    size_t end = strlen(run_dir);
    while (end > 1 && run_dir[end - 1] == '/') end--;
    size_t b = end;
    while (b > 0 && run_dir[b - 1] != '/') b--;
    snprintf(title, size, "%.*s: to step %.0f, %.0f tokens per step%s", (int)MIN(end - b, 200),
             run_dir + b,
             d->step[d->n_steps - 1], d->last_step_tokens, d->n_segments > 1 ? " (last start)" : "");
}

// The whole command after argument parsing: run_dir's metrics.jsonl and
// configs to out (a PNG); the columns also to data_out when not NULL.
static enum status plot_run(const char *run_dir, const char *out, const char *data_out,
                            struct error *err) {
    struct stat sb;
    size_t n = strlen(run_dir) + 32;
    char *metrics = xmalloc(n), *cfg_path = xmalloc(n), *tmp_out = xmalloc(strlen(out) + 8);
    snprintf(metrics, n, "%s/metrics.jsonl", run_dir);
    snprintf(cfg_path, n, "%s/config.ini", run_dir);
    sprintf(tmp_out, "%s.tmp", out);
    struct plot_data d = {0};
    enum status st = STATUS_OK;
    char tmpdir[] = "/tmp/trident-plot-XXXXXX", data[64], script[64], title[512];
    bool have_tmp = false, wrote = false;
    double fallback;
    if (access(metrics, F_OK)) {
        st = error_set(err, STATUS_BAD_INPUT, "%s: no metrics file (%s)", metrics, strerror(errno));
        goto done;
    }
    if (access(cfg_path, F_OK)) { // the tokens of a step come from the resolved config
        st = error_set(err, STATUS_BAD_INPUT, "%s: no resolved config (%s): it gives the tokens of a step",
                       cfg_path, strerror(errno));
        goto done;
    }
    if ((st = plot_config_tokens(cfg_path, &fallback, err))) goto done;
    if ((st = plot_read_metrics(run_dir, metrics, fallback, &d, err))) goto done;
    if (!mkdtemp(tmpdir)) {
        st = error_set(err, STATUS_RUNTIME, "mkdtemp %s: %s", tmpdir, strerror(errno));
        goto done;
    }
    have_tmp = true;
    snprintf(data, sizeof data, "%s/curves.dat", tmpdir);
    snprintf(script, sizeof script, "%s/curves.gp", tmpdir);
    plot_title(title, sizeof title, run_dir, &d);
    if ((st = plot_write_data(data, &d, err))) goto done;
    if (data_out && (st = plot_write_data(data_out, &d, err))) goto done;
    if ((st = plot_write_script(script, data, tmp_out, title, d.n_val > 0, err))) goto done;
    wrote = true;
    if ((st = plot_run_gnuplot(script, err))) goto done;
    if (stat(tmp_out, &sb) || sb.st_size == 0) {
        st = error_set(err, STATUS_RUNTIME, "gnuplot wrote no image to %s", tmp_out);
        goto done;
    }
    if (rename(tmp_out, out))
        st = error_set(err, STATUS_RUNTIME, "rename %s to %s: %s", tmp_out, out, strerror(errno));
done:
    if (st && wrote) unlink(tmp_out);
    if (have_tmp) unlink(data), unlink(script), rmdir(tmpdir);
    free(tmp_out), free(metrics), free(cfg_path);
    plot_data_free(&d);
    return st;
}

// Whether file can be written: not a folder, its folder exists, and probe
// (file itself, or the temporary file written in its stead) opens for
// writing (a probe that did not exist is removed again). Else false with
// the reason in why.
static bool plot_writable(const char *file, const char *probe, char *why, size_t n) {
    struct stat sb;
    if (!stat(file, &sb) && S_ISDIR(sb.st_mode)) {
        snprintf(why, n, "is a folder; expected a file name");
        return false;
    }
    char *dir = xmalloc(strlen(file) + 2);
    strcpy(dir, file);
    char *slash = strrchr(dir, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == dir) slash[1] = '\0';
    else *slash = '\0';
    bool ok = !stat(dir, &sb) && S_ISDIR(sb.st_mode);
    if (!ok) snprintf(why, n, "the folder %s does not exist", dir);
    free(dir);
    if (!ok) return false;
    bool existed = access(probe, F_OK) == 0;
    int fd = open(probe, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd < 0) {
        snprintf(why, n, "cannot write %s: %s", probe, strerror(errno));
        return false;
    }
    close(fd);
    if (!existed) unlink(probe);
    return true;
}

struct plot_args {
    const char *run_dir, *out, *data;
};

#define P(field) offsetof(struct plot_args, field)
static const struct cli_flag plot_flags[] = {
    {"RUN_DIR", CLI_PATH, NULL, NULL, 0, 0, 0, NULL,
     "a run folder: its metrics.jsonl, and the global_batch_size x seq_len of each start's config-STEP.ini "
     "(else its config.ini) for the tokens axis", P(run_dir)},
    {"--out", CLI_PATH, "PNG", NULL, 0, 0, 0, NULL, "the PNG to write; default: RUN_DIR/curves.png", P(out)},
    {"--data", CLI_PATH, "FILE", NULL, 0, 0, 0, NULL, "also write the columns drawn to FILE", P(data)},
};
#undef P

const struct cli_command cli_plot = {
    .name = "plot",
    .synopsis = "RUN_DIR [--out PNG] [--data FILE]",
    .summary = "Draws RUN_DIR/metrics.jsonl as one PNG of 1200 x 900 pixels: loss and validation loss,\n"
               "learning rate, grad norm and tokens/s against tokens; needs gnuplot.",
    .flags = plot_flags,
    .n_flags = CLI_N(plot_flags),
};

int cmd_plot(int argc, char **argv) {
    if (cli_is_help(argc, argv)) {
        cli_print_help(&cli_plot, stdout);
        return STATUS_OK;
    }
    struct plot_args o = {0};
    struct error perr = {0};
    if (cli_parse(&cli_plot, argc, argv, &o, &perr) ||
        (o.out && !*o.out && error_set(&perr, STATUS_BAD_INPUT, "--out '': expected a file name")) ||
        (o.data && !*o.data && error_set(&perr, STATUS_BAD_INPUT, "--data '': expected a file name"))) {
        fprintf(stderr, "trident plot: %s\n(trident plot --help for usage)\n", perr.msg);
        return STATUS_BAD_INPUT;
    }
    const char *run_dir = o.run_dir, *out = o.out, *data_out = o.data;
    struct stat sb;
    bool missing = stat(run_dir, &sb) != 0;
    if (missing || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "trident plot: RUN_DIR %s: %s; expected a run folder (metrics.jsonl, "
                "config.ini)\n", run_dir, missing ? strerror(errno) : "not a folder");
        return STATUS_BAD_INPUT;
    }
    char *def = NULL;
    if (!out) {
        def = xmalloc(strlen(run_dir) + 16);
        sprintf(def, "%s/curves.png", run_dir);
        out = def;
    }
    // --out (gnuplot writes PNG.tmp next to it) and --data must be writable
    // before any work: gnuplot's own errors would name its temporary script.
    char *tmp_out = xmalloc(strlen(out) + 8);
    sprintf(tmp_out, "%s.tmp", out);
    const char *files[2] = {out, data_out}, *probes[2] = {tmp_out, data_out};
    const char *flags[2] = {o.out ? "--out" : "--out (default RUN_DIR/curves.png)", "--data"};
    enum status st = STATUS_OK;
    for (int k = 0; k < 2 && !st; k++) {
        char why[256];
        if (files[k] && !plot_writable(files[k], probes[k], why, sizeof why)) {
            fprintf(stderr, "trident plot: %s %s: %s\n", flags[k], files[k], why);
            st = STATUS_BAD_INPUT;
        }
    }
    free(tmp_out);
    if (!st) {
        struct error err = {0};
        st = plot_run(run_dir, out, data_out, &err);
        if (st) fprintf(stderr, "trident plot: %s\n", err.msg);
        else printf("%s\n", out);
    }
    free(def);
    return st;
}

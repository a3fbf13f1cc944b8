// run_folder.c: train.log, the configs of each start and metrics.jsonl kept
// across resumes (run_folder.h; docs/design.md §9).
#include "run_folder.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/tee.h"
#include "base/version.h"

// mkdir -p for the run directory. Errors: STATUS_BAD_INPUT naming the path.
static enum status make_run_dir(const char *path, struct error *err) {
    if (make_dirs(path) == 0) return STATUS_OK;
    int e = errno;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode))
        return error_set(err, STATUS_BAD_INPUT, "[log] run_dir = %s: exists and is not a folder",
                         path);
    return error_set(err, STATUS_BAD_INPUT, "[log] run_dir = %s: cannot create: %s", path,
                     strerror(e));
}

// ---- the folder lock -------------------------------------------------------

// The lock files this process holds (device and inode), kept open until exit.
static struct {
    dev_t dev;
    ino_t ino;
} held[4];
static int n_held;

enum status run_folder_lock(const char *dir, const char *key, struct error *err) {
    if (make_dirs(dir) != 0)
        return error_set(err, STATUS_BAD_INPUT, "%s = %s: cannot create: %s", key, dir, strerror(errno));
    char path[CONFIG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/.trident.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return error_set(err, STATUS_BAD_INPUT, "%s = %s: cannot open %s: %s", key, dir, path,
                         strerror(errno));
    struct stat st;
    if (fstat(fd, &st) == 0)
        for (int i = 0; i < n_held; i++)
            if (held[i].dev == st.st_dev && held[i].ino == st.st_ino) {
                close(fd);
                return STATUS_OK;
            }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e == EWOULDBLOCK) {
            char who[256] = "";
            ssize_t n = pread(fd, who, sizeof who - 1, 0);
            who[n > 0 ? n : 0] = '\0';
            who[strcspn(who, "\n")] = '\0';
            close(fd);
            return error_set(err, STATUS_BAD_INPUT,
                             "%s = %s is in use by another trident run (%s, lock %s): two runs in one "
                             "folder would overwrite each other's logs and checkpoints; wait for it to "
                             "end, or set another %s",
                             key, dir, who[0] ? who : "holder unknown", path, key);
        }
        close(fd);
        fprintf(stderr, "warning: %s = %s: no lock against a second run in it (flock: %s)\n", key, dir,
                strerror(e));
        return STATUS_OK;
    }
    char host[128] = "?", when[32] = "?", line[256];
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(line, sizeof line, "host %s, pid %d, since %s\n", host, (int)getpid(), when);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n)
        fprintf(stderr, "warning: %s: cannot write the lock holder: %s\n", path, strerror(errno));
    if (n_held < (int)(sizeof held / sizeof held[0]))
        held[n_held].dev = st.st_dev, held[n_held].ino = st.st_ino, n_held++;
    return STATUS_OK; // fd stays open: the lock lasts until the process ends
}

enum status run_folder_open_log(const char *run_dir, struct error *err) {
    if (make_run_dir(run_dir, err)) return err->status;
    if (run_folder_lock(run_dir, "[log] run_dir", err)) return err->status;
    char path[CONFIG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/train.log", run_dir);
    return tee_stdio_open(path, err);
}

// ---- metrics.jsonl -------------------------------------------------------------

// Whether a record of metrics.jsonl belongs to the history of a run resumed
// at step S: steps and evaluations up to S, the starts at steps up to S, the
// closing records of attempts that ended at steps up to S. A record of none
// of these kinds (written by another tool) is kept. A line that is not a JSON
// object (a torn write) is not. *start: the record is a start record.
static bool keep_record(const char *line, size_t n, int S, bool *start) {
    *start = false;
    json_t *r = json_loadb(line, n, 0, NULL);
    if (!json_is_object(r)) {
        json_decref(r);
        return false;
    }
    json_t *step = json_object_get(r, "step"), *done = json_object_get(r, "steps_done");
    bool keep = true;
    const char *event = json_string_value(json_object_get(r, "event"));
    *start = event && !strcmp(event, "start");
    if (json_is_true(json_object_get(r, "done")) && json_is_integer(done))
        keep = json_integer_value(done) <= S;
    else if (json_is_integer(step))
        keep = json_integer_value(step) <= S;
    json_decref(r);
    return keep;
}

// Writes n bytes of buf to path.tmp, fsyncs it and renames it over path, then
// fsyncs the folder: a crash leaves the old file or the new one, never a
// part. (Plain POSIX, not ckpt/durable.h, whose fault injection counts a
// checkpoint's storage calls.) Errors: STATUS_BAD_INPUT naming the file.
static enum status replace_file(const char *path, const char *buf, size_t n, struct error *err) {
    char tmp[CONFIG_PATH_MAX + 16], dir[CONFIG_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0;
    for (size_t done = 0; ok && done < n;) {
        ssize_t w = write(fd, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        ok = w > 0;
        if (ok) done += (size_t)w;
    }
    ok = ok && fsync(fd) == 0;
    if (fd >= 0 && close(fd)) ok = false;
    ok = ok && rename(tmp, path) == 0;
    if (!ok) {
        enum status st = error_set(err, STATUS_BAD_INPUT, "[log] metrics_file = %s: cannot rewrite "
                                   "(through %s): %s", path, tmp, strerror(errno));
        unlink(tmp);
        return st;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) fsync(dfd), close(dfd);
    return STATUS_OK;
}

// Rewrites path with the history of a run resumed at step S (keep_record),
// atomically (replace_file); *starts: the start records kept. A missing
// file is an empty one.
static enum status keep_history(const char *path, int S, int *starts, struct error *err) {
    *starts = 0;
    FILE *f = fopen(path, "r");
    if (!f && errno == ENOENT) return STATUS_OK;
    if (!f) return error_set(err, STATUS_BAD_INPUT, "[log] metrics_file = %s: cannot read: %s", path,
                             strerror(errno));
    char *text = NULL, *kept = NULL;
    size_t len = 0, cap = 0;
    FILE *in = open_memstream(&text, &len), *out = open_memstream(&kept, &cap);
    CHECK(in && out, "open_memstream failed");
    char buf[1 << 16];
    for (size_t k; (k = fread(buf, 1, sizeof buf, f)) > 0;) fwrite(buf, 1, k, in);
    bool bad = ferror(f);
    fclose(f), fclose(in);
    if (bad) {
        free(text), fclose(out), free(kept);
        return error_set(err, STATUS_BAD_INPUT, "[log] metrics_file = %s: cannot read", path);
    }
    int dropped = 0, kept_lines = 0;
    for (const char *p = text, *end = text + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) { // a last line without its newline: torn by a kill
            dropped++;
            break;
        }
        size_t n = (size_t)(nl - p);
        if (n == 0) {
            p = nl + 1;
            continue;
        }
        bool start;
        if (keep_record(p, n, S, &start)) {
            fwrite(p, 1, n + 1, out);
            kept_lines++;
            *starts += start;
        } else {
            dropped++;
        }
        p = nl + 1;
    }
    fclose(out);
    enum status st = replace_file(path, kept, cap, err);
    if (!st && dropped)
        printf("metrics: %s: %d records up to step %d kept, %d of an earlier attempt after step %d "
               "dropped (this attempt writes them again)\n", path, kept_lines, S, dropped, S);
    free(text), free(kept);
    return st;
}

// Moves a non-empty path aside to <stem>-<YYYYmmdd-HHMMSS>[-N]<ext> (the
// time of its last change), so that a new run in the same folder destroys
// no earlier metrics. Errors: STATUS_BAD_INPUT naming both paths.
static enum status move_aside(const char *path, struct error *err) {
    struct stat st;
    if (stat(path, &st) || st.st_size == 0) return STATUS_OK;
    char stem[CONFIG_PATH_MAX], stamp[32], aside[CONFIG_PATH_MAX + 64];
    snprintf(stem, sizeof stem, "%s", path);
    const char *ext = "";
    char *dot = strrchr(stem, '.'), *slash = strrchr(stem, '/');
    if (dot && (!slash || dot > slash + 1)) {
        ext = path + (dot - stem);
        *dot = '\0';
    }
    struct tm tm;
    time_t mt = st.st_mtime;
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime_r(&mt, &tm));
    snprintf(aside, sizeof aside, "%s-%s%s", stem, stamp, ext);
    for (int k = 2; access(aside, F_OK) == 0; k++)
        snprintf(aside, sizeof aside, "%s-%s-%d%s", stem, stamp, k, ext);
    if (rename(path, aside))
        return error_set(err, STATUS_BAD_INPUT, "[log] metrics_file = %s holds an earlier run's metrics "
                         "and cannot be moved to %s: %s", path, aside, strerror(errno));
    printf("metrics: %s held the metrics of an earlier run (this start resumes no checkpoint): "
           "moved to %s\n", path, aside);
    return STATUS_OK;
}

enum status run_folder_open_metrics(const char *path, struct run_start *s, FILE **out,
                                    struct error *err) {
    *out = NULL;
    int starts = 0;
    enum status st = s->resumed ? keep_history(path, s->step, &starts, err) : move_aside(path, err);
    if (st) return st;
    s->attempt = starts + 1;
    FILE *f = fopen(path, "a");
    if (!f)
        return error_set(err, STATUS_BAD_INPUT, "[log] metrics_file = %s: cannot write: %s", path,
                         strerror(errno));
    fprintf(f, "{\"event\": \"start\", \"step\": %d, \"attempt\": %d, \"time\": %lld, \"version\": \"%s\", "
            "\"git\": \"%s\", \"world_size\": %d, ", s->step, s->attempt, s->time, version_release(),
            version_git(), s->world_size);
    // The layout: every named size of the grid (tp, dp, dp_shard, dp_replicate, pp).
    const char *names[GROUP_COUNT];
    int sizes[GROUP_COUNT], n = topology_layout_sizes(&s->layout, false, names, sizes);
    for (int i = 0; i < n; i++) fprintf(f, "\"%s\": %d, ", names[i], sizes[i]);
    fprintf(f, "\"threads\": [");
    for (int i = 0; i < s->world_size; i++) fprintf(f, "%s%d", i ? ", " : "", s->threads[i]);
    fprintf(f, "], \"flops_per_token\": %.17g, \"peak_flops\": %.6g}\n", s->flops_per_token,
            s->peak_flops);
    fflush(f);
    *out = f;
    return STATUS_OK;
}

// ---- configs -------------------------------------------------------------------

enum status run_folder_write_configs(const struct config *c, const struct run_start *s,
                                     struct error *err) {
    char when[32], header[512], path[CONFIG_PATH_MAX + 48], grid[256];
    struct tm tm;
    time_t t = (time_t)s->time;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    snprintf(header, sizeof header,
             "%s\nstarted %s (attempt %d) at step %d, world size %d = %s\n"
             "the resolved config of that start; trident train reads it back as it is",
             version_string(), when, s->attempt, s->step, s->world_size,
             topology_layout_text(&s->layout, true, " ", " x ", grid, sizeof grid));
    snprintf(path, sizeof path, "%s/config.ini", c->log.run_dir);
    if (config_write(c, header, path, err)) return err->status;
    snprintf(path, sizeof path, "%s/config-%d.ini", c->log.run_dir, s->step);
    for (int k = 2; access(path, F_OK) == 0; k++)
        snprintf(path, sizeof path, "%s/config-%d-%d.ini", c->log.run_dir, s->step, k);
    if (config_write(c, header, path, err)) return err->status;
    printf("config: %s/config.ini and %s\n", c->log.run_dir, path);
    return STATUS_OK;
}

// checkpoint_branch.c: resuming from an earlier step into a checkpoint
// folder that holds later ones (a branch): found at start, and, when the
// run says so (checkpoint.branch = true), the later steps moved aside
// (docs/design.md §7, "Branches").
#include "checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "durable.h"

int64_t checkpoint_latest_step(const char *dir) {
    char path[CKPT_PATH_MAX], name[256] = "";
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    if (!fgets(name, sizeof name, f)) name[0] = 0;
    fclose(f);
    name[strcspn(name, "\r\n")] = 0;
    long long step;
    int used = 0;
    if (sscanf(name, "step-%lld%n", &step, &used) != 1 || name[used] || step < 0) return -1;
    return step;
}

enum status checkpoint_branch(const char *dir, int64_t step, char aside[CKPT_PATH_MAX],
                              struct error *err) {
    aside[0] = 0;
    snprintf(aside, CKPT_PATH_MAX, "%s/branched-after-step-%06lld-%lld", dir, (long long)step,
             (long long)time(NULL));
    DIR *d = opendir(dir);
    if (!d) return error_set(err, STATUS_RUNTIME, "%s: cannot list: %s", dir, strerror(errno));
    enum status st = durable_mkdir(aside, err);
    int64_t keep = -1; // the newest step <= step left in dir
    struct dirent *e;
    char from[CKPT_PATH_MAX], to[CKPT_PATH_MAX + 64];
    while (!st && (e = readdir(d))) {
        long long s;
        int used = 0;
        if (sscanf(e->d_name, "step-%lld%n", &s, &used) != 1 || e->d_name[used]) continue;
        if (s <= step) {
            if (s > keep) keep = s;
            continue;
        }
        snprintf(from, sizeof from, "%s/%s", dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", aside, e->d_name);
        st = durable_rename(from, to, err);
    }
    closedir(d);
    if (st) return st;
    // `latest` named a moved step: it goes with them; the newest step left,
    // if any, becomes latest (a crash before this run's first save resumes there).
    snprintf(from, sizeof from, "%s/latest", dir);
    snprintf(to, sizeof to, "%s/latest", aside);
    if ((st = durable_rename(from, to, err))) return st;
    if (keep >= 0) {
        char line[80], name[64], tmp[CKPT_PATH_MAX];
        ckpt_step_name(name, sizeof name, keep);
        int n = snprintf(line, sizeof line, "%s\n", name);
        snprintf(tmp, sizeof tmp, "%s/latest.tmp", dir);
        if ((st = durable_write_file(tmp, line, (size_t)n, err)) || (st = durable_rename(tmp, from, err)))
            return st;
    }
    return durable_fsync_dir(dir, err);
}

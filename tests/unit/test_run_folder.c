// test_run_folder.c: what each start of a run leaves in its run folder
// (src/train/run_folder.h, docs/design.md §9), against hand-written files:
//  - a resume at step 5 keeps exactly the records of the run's history up to
//    step 5 (steps, validations, starts and closing records <= 5, a record
//    of another tool), drops an earlier attempt's lines after 5 and a torn
//    last line, byte for byte, then appends a start record numbered after
//    the kept starts, with each rank's threads;
//  - a fresh start moves an existing file aside (twice: two files, contents
//    unchanged) and begins with attempt 1; an empty file is not moved;
//  - config.ini and config-5.ini, then config-5-2.ini on a second start at
//    step 5, each beginning with the version line and loading back equal;
//  - the tee copies stdout and stderr to its file, appends, and stops
//    copying when closed; run_folder_open_log makes the folder's parents and
//    refuses a run_dir that is a file.
#include <dirent.h>
#include <string.h>
#include <unistd.h>

#include "base/tee.h"
#include "base/version.h"
#include "config/config.h"
#include "test.h"
#include "train/run_folder.h"

static char dir[256];

// The whole file at path ("" when missing); the caller frees.
static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (f) {
        char buf[4096];
        for (size_t k; (k = fread(buf, 1, sizeof buf, f)) > 0;) fwrite(buf, 1, k, m);
        fclose(f);
    }
    fclose(m);
    return text;
}

static void spill(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    EXPECT(f != NULL, "cannot write %s", path);
    if (f) fputs(text, f), fclose(f);
}

// Names in dir starting with prefix, how many; the first in *first (freed by caller).
static int count_prefixed(const char *prefix, char **first) {
    DIR *d = opendir(dir);
    int n = 0;
    *first = NULL;
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, prefix, strlen(prefix))) {
            if (!*first) *first = strdup(e->d_name);
            n++;
        }
    if (d) closedir(d);
    return n;
}

static const char *history =
    "{\"event\": \"start\", \"step\": 0, \"attempt\": 1}\n"
    "{\"step\": 1, \"loss\": 1.0}\n"
    "{\"step\": 5, \"loss\": 5.0}\n"
    "{\"step\": 5, \"val_loss\": 2.5}\n"
    "{\"done\": true, \"ended\": \"exit_interval\", \"steps_done\": 5, \"steps\": 5}\n"
    "{\"event\": \"start\", \"step\": 5, \"attempt\": 2}\n";
static const char *after =          // an attempt past step 5, lost with its checkpoint
    "{\"step\": 6, \"loss\": 6.0}\n"
    "{\"step\": 6, \"val_loss\": 2.4}\n"
    "{\"done\": true, \"ended\": \"signal\", \"steps_done\": 7, \"steps\": 2}\n"
    "{\"event\": \"start\", \"step\": 7, \"attempt\": 3}\n"
    "{\"step\": 8, \"loss\": 8.0}\n";
static const char *other = "{\"note\": \"a line of another tool\"}\n";

static void test_resume(void) {
    char path[300], expect[2048];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    char text[2048];
    snprintf(text, sizeof text, "%s%s\n%s{\"step\": 9, \"lo", history, after, other); // a blank line, a torn one
    spill(path, text);
    int threads[2] = {3, 1};
    struct run_start s = {.step = 5, .resumed = true, .world_size = 2, .layout = topology_layout(1, 1, 2, 0, 1),
                          .threads = threads, .time = 1700000000, .flops_per_token = 24772608,
                          .peak_flops = 2e12};
    FILE *f = NULL;
    struct error err = {0};
    EXPECT(run_folder_open_metrics(path, &s, &f, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(s.attempt == 3, "attempt %d, expected 3 (two starts kept)", s.attempt);
    if (f) fprintf(f, "{\"step\": 6, \"loss\": 6.5}\n"), fclose(f);
    char start[512];
    snprintf(start, sizeof start, "{\"event\": \"start\", \"step\": 5, \"attempt\": 3, \"time\": 1700000000, "
             "\"version\": \"%s\", \"git\": \"%s\", \"world_size\": 2, \"tp\": 1, \"cp\": 1, \"dp\": 2, \"dp_shard\": 2, "
             "\"dp_replicate\": 1, \"ep\": 1, \"pp\": 1, "
             "\"threads\": [3, 1], \"flops_per_token\": 24772608, \"peak_flops\": 2e+12}\n",
             version_release(), version_git());
    snprintf(expect, sizeof expect, "%s%s%s{\"step\": 6, \"loss\": 6.5}\n", history, other, start);
    char *got = slurp(path);
    EXPECT(!strcmp(got, expect), "resumed file:\n%s\nexpected:\n%s", got, expect);
    free(got);
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    EXPECT(access(tmp, F_OK) != 0, "%s left behind", tmp);
    // A resume with no file starts one.
    unlink(path);
    EXPECT(run_folder_open_metrics(path, &s, &f, &err) == STATUS_OK && s.attempt == 1, "%s", err.msg);
    if (f) fclose(f);
    unlink(path);
}

static void test_fresh(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    int threads[1] = {2};
    struct run_start s = {.world_size = 1, .layout = topology_layout(1, 1, 1, 0, 1), .threads = threads, .time = 1};
    struct error err = {0};
    FILE *f = NULL;
    spill(path, ""); // empty: nothing to keep
    EXPECT(run_folder_open_metrics(path, &s, &f, &err) == STATUS_OK && s.attempt == 1, "%s", err.msg);
    if (f) fclose(f);
    char *name;
    EXPECT(count_prefixed("metrics-", &name) == 0, "an empty file was moved aside to %s", name);
    free(name);
    spill(path, history);
    EXPECT(run_folder_open_metrics(path, &s, &f, &err) == STATUS_OK && s.attempt == 1, "%s", err.msg);
    if (f) fclose(f);
    char *now = slurp(path);
    EXPECT(!strncmp(now, "{\"event\": \"start\", \"step\": 0, \"attempt\": 1, \"time\": 1,", 52) &&
           strchr(now, '\n') == now + strlen(now) - 1, "the fresh file: %s", now);
    EXPECT(count_prefixed("metrics-", &name) == 1, "one file moved aside");
    if (name) {
        char aside[600];
        snprintf(aside, sizeof aside, "%s/%s", dir, name);
        char *old = slurp(aside);
        EXPECT(!strcmp(old, history), "%s holds %s", name, old);
        EXPECT(strlen(name) == strlen("metrics-20260101-000000.jsonl") &&
               !strcmp(name + strlen(name) - 6, ".jsonl"), "aside name %s", name);
        free(old);
    }
    free(name);
    // Again within the same second: a second name, both kept.
    EXPECT(run_folder_open_metrics(path, &s, &f, &err) == STATUS_OK, "%s", err.msg);
    if (f) fclose(f);
    EXPECT(count_prefixed("metrics-", &name) == 2, "two files moved aside");
    free(name);
    free(now);
}

static void test_configs(void) {
    struct config c, back;
    struct error err = {0};
    config_defaults(&c);
    snprintf(c.log.run_dir, sizeof c.log.run_dir, "%s", dir);
    c.train.steps = 77;
    int threads[4] = {1, 1, 1, 1};
    struct run_start s = {.step = 5, .resumed = true, .world_size = 4, .layout = topology_layout(2, 1, 2, 0, 1),
                          .threads = threads, .time = 0, .attempt = 2};
    EXPECT(run_folder_write_configs(&c, &s, &err) == STATUS_OK, "%s", err.msg);
    s.attempt = 3;
    c.train.steps = 78;
    EXPECT(run_folder_write_configs(&c, &s, &err) == STATUS_OK, "%s", err.msg);
    const char *names[3] = {"config-5.ini", "config-5-2.ini", "config.ini"};
    const int steps[3] = {77, 78, 78};
    for (int i = 0; i < 3; i++) {
        char path[400], first[256];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(first, sizeof first, "# %s\n# started 1970-01-01T00:00:00Z (attempt %d) at step 5, "
                 "world size 4 = tp 2 x cp 1 x ep 1 x dp_shard 2 x dp_replicate 1 x pp 1\n", version_string(), i ? 3 : 2);
        char *text = slurp(path);
        EXPECT(!strncmp(text, first, strlen(first)), "%s begins:\n%.200s\nexpected\n%s", names[i], text, first);
        free(text);
        EXPECT(config_load(path, 0, NULL, &back, &err) == STATUS_OK && back.train.steps == steps[i],
               "%s loads back: %s", names[i], err.msg);
    }
    char path[400];
    snprintf(path, sizeof path, "%s/config-5-3.ini", dir);
    EXPECT(access(path, F_OK) != 0, "a third config at step 5");
}

static void test_tee(void) {
    char path[400], run[300];
    snprintf(path, sizeof path, "%s/tee.log", dir);
    struct error err = {0};
    EXPECT(tee_stdio_open(path, &err) == STATUS_OK, "%s", err.msg);
    printf("to stdout\n");
    fprintf(stderr, "to stderr\n");
    printf("partial line ");
    tee_stdio_close();
    printf("after close\n");
    EXPECT(tee_stdio_open(path, &err) == STATUS_OK, "%s", err.msg);
    printf("appended\n");
    tee_stdio_close();
    char *got = slurp(path);
    EXPECT(!strcmp(got, "to stdout\nto stderr\npartial line appended\n"), "tee.log: '%s'", got);
    free(got);
    snprintf(path, sizeof path, "%s/no/such/dir/tee.log", dir);
    EXPECT(tee_stdio_open(path, &err) == STATUS_RUNTIME && strstr(err.msg, path), "%s", err.msg);
    // run_folder_open_log: parents made, train.log appended; a file is refused.
    snprintf(run, sizeof run, "%s/a/b/run", dir);
    EXPECT(run_folder_open_log(run, &err) == STATUS_OK, "%s", err.msg);
    printf("in train.log\n");
    tee_stdio_close();
    snprintf(path, sizeof path, "%s/train.log", run);
    got = slurp(path);
    EXPECT(!strcmp(got, "in train.log\n"), "train.log: '%s'", got);
    free(got);
    snprintf(path, sizeof path, "%s/tee.log", dir);
    EXPECT(run_folder_open_log(path, &err) == STATUS_BAD_INPUT && strstr(err.msg, "not a folder"), "%s", err.msg);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/trident_test_run_folder_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    EXPECT(system(cmd) == 0, "mkdir %s", dir);
    test_resume();
    test_fresh();
    test_configs();
    test_tee();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0, "rm");
    return test_finish("test_run_folder");
}

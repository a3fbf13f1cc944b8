// common.c: error reporting and small helpers shared by every module.
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int g_log_rank = -1;
static void (*fatal_hook)(int code);

enum status error_set(struct error *err, enum status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

void fatal_set_hook(void (*hook)(int code)) { fatal_hook = hook; }

static void (*announcer)(const char *msg);
void fatal_set_announcer(void (*announce)(const char *msg)) { announcer = announce; }
void fatal_announce(const char *msg) {
    if (announcer) announcer(msg);
}

_Noreturn void fatal_exit(int code, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (g_log_rank >= 0) fprintf(stderr, "trident: [rank %d] %s:%d: ", g_log_rank, file, line);
    else fprintf(stderr, "trident: %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    if (fatal_hook) fatal_hook(code);
    exit(code);
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "out of host memory allocating %zu bytes", bytes);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "out of host memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "out of host memory reallocating %zu bytes", bytes);
    return q;
}

void sleep_s(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

uint64_t peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kib) == 1) break;
    if (f) fclose(f);
    struct rusage ru;
    if (!kib && getrusage(RUSAGE_SELF, &ru) == 0) kib = (unsigned long long)ru.ru_maxrss; // KiB on Linux
    return (uint64_t)kib * 1024;
}

double time_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int make_dirs(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return errno = ENAMETOOLONG, -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST) return -1;
    struct stat st;
    if (stat(buf, &st)) return -1;
    if (!S_ISDIR(st.st_mode)) return errno = ENOTDIR, -1;
    return 0;
}

int open_regular_file(const char *path, const char *what, bool *absent, uint64_t *size,
                      struct error *err) {
    if (absent) *absent = false;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 && errno == ENOENT && absent) return *absent = true, -1;
    if (fd < 0 || fstat(fd, &sb)) {
        error_set(err, STATUS_BAD_INPUT, "%s: cannot open%s%s: %s", path, what ? " " : "",
                  what ? what : "", strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        error_set(err, STATUS_BAD_INPUT, "%s: not a regular file", path);
        return -1;
    }
    if (size) *size = (uint64_t)sb.st_size;
    return fd;
}

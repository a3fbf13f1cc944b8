// tee.c: stdout and stderr copied to a log file (tee.h).
#define _GNU_SOURCE // fopencookie
#include "tee.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

// One tee: the log's descriptor and, per stream, the replaced FILE and the
// descriptor its text still goes to.
struct tee_stream {
    FILE *orig;  // stdout or stderr as they were
    FILE *file;  // the cookie stream now in their place
    int fd;      // 1 or 2
    bool gave_up; // a write to fd found no room after tee_stdio_best_effort:
                  // later writes wait no more (write_out)
};
static struct {
    int log_fd; // -1: closed
    struct tee_stream out, err;
} g_tee = {.log_fd = -1};

// Set by tee_stdio_best_effort (from a signal handler): the launcher may
// have stopped reading the original descriptors.
static volatile sig_atomic_t g_best_effort;
void tee_stdio_best_effort(void) { g_best_effort = 1; }

bool tee_stdout_given_up(void) { return g_tee.log_fd >= 0 && g_tee.out.gave_up; }

enum { TEE_POLL_MS = 200 }; // how often a wait for room rechecks g_best_effort

// Writes all n bytes of buf to fd, retrying short writes and EINTR.
// Returns false on another error.
static bool write_all(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        buf += w, n -= (size_t)w;
    }
    return true;
}

// Writes n bytes of buf to s's original descriptor (a terminal, a file,
// or the launcher's pipe) in pieces of at most PIPE_BUF bytes, each after
// poll() says there is room (then a pipe takes the piece without blocking),
// so that no write is stuck where a signal cannot end it. Once
// tee_stdio_best_effort was called, a descriptor without room for
// TEE_POLL_MS is given up (the rest of this and every later write goes to
// the log only): Open MPI's mpirun, signalled, stops reading its ranks'
// output before it forwards SIGTERM, and a rank blocked on a full pipe
// could neither finish its step nor save before mpirun's SIGKILL.
// Returns false on a write error other than EINTR.
static bool write_out(struct tee_stream *s, const char *buf, size_t n) {
    int fd = s->fd;
    while (n > 0) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int r = poll(&p, 1, s->gave_up ? 0 : TEE_POLL_MS);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) {
            if (!g_best_effort) continue;
            s->gave_up = true;
            return true;
        }
        size_t piece = n > PIPE_BUF ? PIPE_BUF : n;
        ssize_t w = write(fd, buf, piece);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        buf += w, n -= (size_t)w;
    }
    return true;
}

// The cookie's write: the original descriptor first (what the terminal or
// the launcher's output shows; see write_out), then the log. A failing log
// write (a full disk) does not fail the program's output.
static ssize_t tee_write(void *cookie, const char *buf, size_t n) {
    struct tee_stream *s = cookie;
    if (!write_out(s, buf, n)) return -1;
    if (g_tee.log_fd >= 0) write_all(g_tee.log_fd, buf, n);
    return (ssize_t)n;
}

static FILE *tee_stream_open(struct tee_stream *s, FILE *orig, int fd, int mode) {
    *s = (struct tee_stream){.orig = orig, .fd = fd};
    s->file = fopencookie(s, "w", (cookie_io_functions_t){.write = tee_write});
    if (s->file) setvbuf(s->file, NULL, mode, 0);
    return s->file;
}

enum status tee_stdio_open(const char *path, struct error *err) {
    tee_stdio_close();
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return error_set(err, STATUS_RUNTIME, "%s: cannot append: %s", path, strerror(errno));
    fflush(stdout), fflush(stderr);
    g_tee.log_fd = fd;
    FILE *out = tee_stream_open(&g_tee.out, stdout, STDOUT_FILENO, _IOLBF);
    FILE *er = tee_stream_open(&g_tee.err, stderr, STDERR_FILENO, _IONBF);
    if (!out || !er) {
        if (out) fclose(out);
        if (er) fclose(er);
        close(fd);
        g_tee.log_fd = -1;
        return error_set(err, STATUS_RUNTIME, "%s: cannot make the log's streams: %s", path, strerror(errno));
    }
    stdout = out, stderr = er;
    return STATUS_OK;
}

void tee_stdio_close(void) {
    if (g_tee.log_fd < 0) return;
    fflush(stdout), fflush(stderr);
    stdout = g_tee.out.orig, stderr = g_tee.err.orig;
    fclose(g_tee.out.file), fclose(g_tee.err.file);
    close(g_tee.log_fd);
    g_tee.log_fd = -1;
}

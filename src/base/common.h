// common.h: error codes, checks that carry file and line, small helpers.
// Exit codes follow docs/design.md §8: 0 ok, 1 runtime failure, 2 bad input.
#ifndef TRIDENT_COMMON_H
#define TRIDENT_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum status {
    STATUS_OK = 0,
    STATUS_RUNTIME = 1,   // a failure of the machine or a library
    STATUS_BAD_INPUT = 2, // config, command line, data or checkpoint is wrong
};

// Error message buffer passed down the call chain: a function that fails fills
// it and returns a non-zero status; the caller decides how to report it.
struct error {
    enum status status;
    char msg[1024];
};

// Fills err (when not NULL) with a formatted message and returns status.
enum status error_set(struct error *err, enum status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// The MPI rank used to prefix fatal messages; -1 before MPI is up.
extern int g_log_rank;

// Prints "trident: [rank R] file:line: message" to stderr and exits with code.
// The multi-rank layer replaces this with an MPI_Abort (see fatal_set_hook).
_Noreturn void fatal_exit(int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// A hook that runs before fatal_exit terminates (e.g. MPI_Abort). NULL: exit().
void fatal_set_hook(void (*hook)(int code));

// Tells the other ranks why this one is about to end the job, when only it
// can see the cause (an NCCL error on a communicator they are not in): calls
// the announcer set by fatal_set_announcer (the watchdog's heartbeat files,
// base/heartbeat.h), if any; else nothing. Call it before the grace period
// that lets the others print.
void fatal_announce(const char *msg);
void fatal_set_announcer(void (*announce)(const char *msg));

// Internal invariant: a failure is a bug in trident, exit 1 with file:line.
#define CHECK(cond, fmt, ...)                                                  \
    do {                                                                       \
        if (!(cond)) fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__,            \
                                "check failed: %s: " fmt, #cond, ##__VA_ARGS__); \
    } while (0)

// malloc/calloc/realloc that exit with a message naming the size on failure.
void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t bytes);

// Wall-clock seconds from a monotonic clock.
double time_now_s(void);

// Sleeps the calling thread for seconds (>= 0), resumed after signals.
void sleep_s(double seconds);

// The process's peak resident set so far, in bytes: VmHWM of /proc/self/status
// (Linux), else getrusage's ru_maxrss; 0 when neither is readable.
uint64_t peak_rss_bytes(void);

// mkdir -p: path and every missing parent (mode 0755); a folder that exists
// is fine. Returns 0, or -1 with errno set by the mkdir that failed (ENOTDIR
// when path exists and is not a folder; ENAMETOOLONG beyond 4095 bytes).
int make_dirs(const char *path);

// Opens path read-only for a reader that must never hang on it: O_NONBLOCK,
// so a FIFO or a device opens at once (the flag does not change a regular
// file's reads), then fstat refuses anything but a regular file. *size
// (when not NULL) gets the file's length in bytes. absent: when not NULL, a
// missing file (ENOENT) sets *absent and returns -1 with err untouched.
// Returns the descriptor (the caller closes it), or -1 with
// STATUS_BAD_INPUT naming path: "cannot open[ WHAT]: <errno text>" or
// "not a regular file" (what: NULL, or a noun such as "tokenizer file").
int open_regular_file(const char *path, const char *what, bool *absent, uint64_t *size,
                      struct error *err);

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

#endif

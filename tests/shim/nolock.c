// nolock.c: an LD_PRELOAD shim that makes every POSIX lock call fail with
// ENOLCK, as on an NFS mount without lockd, Lustre mounted -o noflock or an
// object-store (FUSE) mount: flock, lockf, and fcntl with F_SETLK, F_SETLKW,
// F_GETLK and the open-file-description variants. Every other fcntl passes
// through. Each refused call is counted; at exit the count is appended to the
// file named by NOLOCK_COUNT (when set), so a test can see the shim was live.
// Build: cc -shared -fPIC -o nolock.so nolock.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

static long refused;

static void report(void) {
    const char *path = getenv("NOLOCK_COUNT");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%ld\n", refused);
    fclose(f);
}

__attribute__((constructor)) static void nolock_init(void) { atexit(report); }

static int is_lock_cmd(int cmd) {
    return cmd == F_SETLK || cmd == F_SETLKW || cmd == F_GETLK || cmd == F_OFD_SETLK ||
           cmd == F_OFD_SETLKW || cmd == F_OFD_GETLK;
}

static int refuse(void) {
    __atomic_add_fetch(&refused, 1, __ATOMIC_RELAXED);
    errno = ENOLCK;
    return -1;
}

int flock(int fd, int op) {
    (void)fd;
    (void)op;
    return refuse();
}

int lockf(int fd, int cmd, off_t len) {
    (void)fd;
    (void)cmd;
    (void)len;
    return refuse();
}

static int pass(const char *name, int fd, int cmd, void *arg) {
    int (*real)(int, int, ...) = (int (*)(int, int, ...))dlsym(RTLD_NEXT, name);
    if (!real) real = (int (*)(int, int, ...))dlsym(RTLD_NEXT, "fcntl");
    return real(fd, cmd, arg);
}

int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (is_lock_cmd(cmd)) return refuse();
    return pass("fcntl", fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (is_lock_cmd(cmd)) return refuse();
    return pass("fcntl64", fd, cmd, arg);
}

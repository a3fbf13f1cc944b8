// durable.c: durable file operations with fault injection (see durable.h).
#include "durable.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum fault_kind { FAULT_NONE, FAULT_KILL, FAULT_KILL_NAMED, FAULT_HANG_NAMED, FAULT_STALL_NAMED, FAULT_SHORT_WRITE,
                  FAULT_FSYNC, FAULT_ENOSPC, FAULT_GRAD_INF, FAULT_NCCL,
                  FAULT_PP_DELAY, FAULT_PP_OP_MS };

// Process-wide, like the file descriptor table it guards: the fault setting
// and the call counters. Only tests set a fault.
static struct {
    int loaded;
    enum fault_kind kind;
    long n;          // fire at the nth matching call
    char name[64];   // FAULT_KILL_NAMED, FAULT_HANG_NAMED: the point
    int rank;        // -1: every rank
    long calls, writes, fsyncs, creates, named_hits;
} fault;

static enum status fault_parse(const char *spec, struct error *err) {
    memset(&fault, 0, sizeof fault);
    fault.loaded = 1;
    fault.rank = -1;
    if (!spec || !*spec) return STATUS_OK;
    char what[32], rest[96];
    const char *colon = strchr(spec, ':');
    if (!colon || colon - spec >= (long)sizeof what || strlen(colon + 1) >= sizeof rest)
        goto bad;
    memcpy(what, spec, colon - spec);
    what[colon - spec] = 0;
    strcpy(rest, colon + 1);
    char *at = strchr(rest, '@');
    if (at) {
        *at = 0;
        char *end;
        fault.rank = (int)strtol(at + 1, &end, 10);
        if (end == at + 1 || *end || fault.rank < 0) goto bad;
    }
    char *end;
    fault.n = strtol(rest, &end, 10);
    int numeric = end != rest && !*end;
    if ((!strcmp(what, "kill") || !strcmp(what, "hang") || !strcmp(what, "stall")) && !numeric) {
        fault.kind = !strcmp(what, "kill") ? FAULT_KILL_NAMED
                     : !strcmp(what, "hang") ? FAULT_HANG_NAMED : FAULT_STALL_NAMED;
        char *c = strchr(rest, ':');
        fault.n = 1;
        if (c) {
            *c = 0;
            fault.n = strtol(c + 1, &end, 10);
            if (end == c + 1 || *end) goto bad;
        }
        if (!*rest || strlen(rest) >= sizeof fault.name) goto bad;
        strcpy(fault.name, rest);
    } else if (!numeric) {
        goto bad;
    } else if (!strcmp(what, "kill")) fault.kind = FAULT_KILL;
    else if (!strcmp(what, "short_write")) fault.kind = FAULT_SHORT_WRITE;
    else if (!strcmp(what, "fsync")) fault.kind = FAULT_FSYNC;
    else if (!strcmp(what, "enospc")) fault.kind = FAULT_ENOSPC;
    else if (!strcmp(what, "grad_inf")) fault.kind = FAULT_GRAD_INF; // the trainer's: no storage call fails
    else if (!strcmp(what, "nccl")) fault.kind = FAULT_NCCL; // the emulated NCCL's (tests/cuda_emu/nccl_fault.h)
    else if (!strcmp(what, "pp_delay")) fault.kind = FAULT_PP_DELAY; // the pipeline executor's: delays only
    else if (!strcmp(what, "pp_op_ms")) fault.kind = FAULT_PP_OP_MS; // the pipeline executor's: op padding
    else goto bad;
    if (fault.n < 1) goto bad;
    return STATUS_OK;
bad:
    fault.kind = FAULT_NONE;
    return error_set(err, STATUS_BAD_INPUT,
                     "TRIDENT_FAULT='%s': expected kill:N, kill:NAME[:K], hang:NAME[:K], stall:NAME[:K], "
                     "short_write:N, fsync:N, enospc:N, grad_inf:N, nccl:N, pp_delay:SEED or pp_op_ms:N, optionally followed by @RANK",
                     spec);
}

enum status durable_fault_set(const char *spec, struct error *err) {
    return fault_parse(spec, err);
}

long durable_calls(void) { return fault.calls; }

// Reads TRIDENT_FAULT once. A bad setting is kept and returned by every
// later call (STATUS_BAD_INPUT naming the variable), so no durable write
// happens under a fault setting the test did not mean.
static enum status fault_load(struct error *err) {
    static struct error bad;
    if (!fault.loaded && fault_parse(getenv("TRIDENT_FAULT"), &bad)) fault.loaded = -1;
    if (fault.loaded < 0) {
        if (err) *err = bad;
        return bad.status;
    }
    return STATUS_OK;
}

// The setting's N when it is of kind (0 otherwise) and its @RANK: the
// trainer's faults, which no storage call acts on.
static enum status fault_value(enum fault_kind kind, long *n, int *rank, struct error *err) {
    enum status st = fault_load(err);
    *n = !st && fault.kind == kind ? fault.n : 0;
    *rank = fault.rank;
    return st;
}

enum status durable_fault_grad_inf(long *step, int *rank, struct error *err) {
    return fault_value(FAULT_GRAD_INF, step, rank, err);
}

enum status durable_fault_pp_delay(long *seed, int *rank, struct error *err) {
    return fault_value(FAULT_PP_DELAY, seed, rank, err);
}

enum status durable_fault_pp_op_ms(long *ms, int *rank, struct error *err) {
    return fault_value(FAULT_PP_OP_MS, ms, rank, err);
}

static int fault_here(void) { return fault.rank < 0 || fault.rank == g_log_rank; }

static void fault_kill(const char *what, const char *path) {
    fprintf(stderr, "trident: [rank %d] TRIDENT_FAULT: killed at storage call %ld (%s %s)\n",
            g_log_rank, fault.calls, what, path);
    fflush(stderr);
    raise(SIGKILL);
}

static enum fault_kind tick(const char *what, const char *path, int is_write, int is_fsync,
                            int is_create) {
    fault.calls++;
    if (is_write) fault.writes++;
    if (is_fsync) fault.fsyncs++;
    if (is_create) fault.creates++;
    if (fault.kind == FAULT_NONE || !fault_here()) return FAULT_NONE;
    switch (fault.kind) {
    case FAULT_KILL:
        if (fault.calls == fault.n) fault_kill(what, path);
        break;
    case FAULT_SHORT_WRITE:
        if (is_write && fault.writes == fault.n) return FAULT_SHORT_WRITE;
        break;
    case FAULT_FSYNC:
        if (is_fsync && fault.fsyncs == fault.n) return FAULT_FSYNC;
        break;
    case FAULT_ENOSPC:
        if ((is_write || is_create) && fault.writes + fault.creates == fault.n) return FAULT_ENOSPC;
        break;
    default:
        break;
    }
    return FAULT_NONE;
}

// Counts one call of class (write/fsync/create flags) and says in *kind which
// fault, if any, fires now. Errors: a bad TRIDENT_FAULT (fault_load).
static enum status fault_tick(const char *what, const char *path, int is_write, int is_fsync,
                              int is_create, enum fault_kind *kind, struct error *err) {
    *kind = FAULT_NONE;
    enum status st = fault_load(err);
    if (st) return st;
    *kind = tick(what, path, is_write, is_fsync, is_create);
    return STATUS_OK;
}

static enum status fail_errno(struct error *err, const char *what, const char *path, int e) {
    return error_set(err, STATUS_RUNTIME, "%s: %s failed: %s", path, what, strerror(e));
}

enum status durable_open_write(struct durable_file *f, const char *path, struct error *err) {
    f->fd = -1;
    snprintf(f->path, sizeof f->path, "%s", path);
    enum fault_kind k;
    enum status st = fault_tick("open", path, 0, 0, 1, &k, err);
    if (st) return st;
    if (k == FAULT_ENOSPC) return fail_errno(err, "open for writing", path, ENOSPC);
    f->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) return fail_errno(err, "open for writing", path, errno);
    return STATUS_OK;
}

enum status durable_write(struct durable_file *f, const void *buf, size_t n, struct error *err) {
    enum fault_kind k;
    enum status st = fault_tick("write", f->path, 1, 0, 0, &k, err);
    if (st) return st;
    if (k == FAULT_ENOSPC) return fail_errno(err, "write", f->path, ENOSPC);
    if (k == FAULT_SHORT_WRITE) {
        // What a full disk does mid-write: part of the bytes land, then an error.
        ssize_t w = write(f->fd, buf, n / 2);
        (void)w;
        return error_set(err, STATUS_RUNTIME, "%s: short write: %zu of %zu bytes written", f->path,
                         n / 2, n);
    }
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return fail_errno(err, "write", f->path, errno);
        if (w == 0) return fail_errno(err, "write", f->path, ENOSPC);
        p += w;
        n -= (size_t)w;
    }
    return STATUS_OK;
}

enum status durable_fsync(struct durable_file *f, struct error *err) {
    enum fault_kind k;
    enum status st = fault_tick("fsync", f->path, 0, 1, 0, &k, err);
    if (st) return st;
    if (k == FAULT_FSYNC) return fail_errno(err, "fsync", f->path, EIO);
    if (fsync(f->fd)) return fail_errno(err, "fsync", f->path, errno);
    return STATUS_OK;
}

enum status durable_close(struct durable_file *f, struct error *err) {
    if (f->fd < 0) return STATUS_OK;
    enum fault_kind k;
    enum status st = fault_tick("close", f->path, 0, 0, 0, &k, err);
    int rc = close(f->fd);
    f->fd = -1;
    if (rc) return fail_errno(err, "close", f->path, errno);
    return st;
}

// fsync of an existing file or directory opened with flags.
static enum status fsync_opened(const char *what, const char *path, int flags, struct error *err) {
    enum fault_kind k;
    enum status st = fault_tick(what, path, 0, 1, 0, &k, err);
    if (st) return st;
    if (k == FAULT_FSYNC) return fail_errno(err, what, path, EIO);
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0) return fail_errno(err, "open for fsync", path, errno);
    int rc = fsync(fd), e = errno;
    close(fd);
    if (rc) return fail_errno(err, what, path, e);
    return STATUS_OK;
}

enum status durable_fsync_path(const char *path, struct error *err) {
    return fsync_opened("fsync", path, O_RDONLY, err);
}

enum status durable_fsync_dir(const char *path, struct error *err) {
    return fsync_opened("fsync of directory", path, O_RDONLY | O_DIRECTORY, err);
}

enum status durable_write_file(const char *path, const void *buf, size_t n, struct error *err) {
    struct durable_file f;
    enum status st = durable_open_write(&f, path, err);
    if (st) return st;
    if (!(st = durable_write(&f, buf, n, err)) && !(st = durable_fsync(&f, err)))
        return durable_close(&f, err);
    close(f.fd); // already failing: keep the first error
    return st;
}

enum status durable_mkdir(const char *path, struct error *err) {
    enum fault_kind k;
    enum status st = fault_tick("mkdir", path, 0, 0, 1, &k, err);
    if (st) return st;
    if (k == FAULT_ENOSPC) return fail_errno(err, "mkdir", path, ENOSPC);
    // Parents first, as mkdir -p.
    char part[4096];
    snprintf(part, sizeof part, "%s", path);
    for (char *s = part + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(part, 0755) && errno != EEXIST) return fail_errno(err, "mkdir", part, errno);
        *s = '/';
    }
    if (mkdir(path, 0755) && errno != EEXIST) return fail_errno(err, "mkdir", path, errno);
    struct stat s;
    if (stat(path, &s) || !S_ISDIR(s.st_mode))
        return error_set(err, STATUS_BAD_INPUT, "%s: exists and is not a directory", path);
    return STATUS_OK;
}

enum status durable_rename(const char *from, const char *to, struct error *err) {
    enum fault_kind k;
    enum status st = fault_tick("rename", from, 0, 0, 0, &k, err);
    if (st) return st;
    if (rename(from, to))
        return error_set(err, STATUS_RUNTIME, "rename %s -> %s failed: %s", from, to,
                         strerror(errno));
    return STATUS_OK;
}

// top: the tree durable_remove_tree was given, which reaches the named
// point "remove_partial" once its first entry is gone (a kill there leaves
// a half-removed folder: tests/e2e/ckpt_crash.sh).
static enum status remove_rec(const char *path, bool top, struct error *err) {
    struct stat s;
    if (lstat(path, &s)) return errno == ENOENT ? STATUS_OK : fail_errno(err, "stat", path, errno);
    if (S_ISDIR(s.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return fail_errno(err, "opendir", path, errno);
        struct dirent *e;
        enum status st = STATUS_OK;
        char sub[4096];
        bool first = top;
        while (!st && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            st = remove_rec(sub, false, err);
            if (!st && first) st = durable_point("remove_partial", path, false, err), first = false;
        }
        closedir(d);
        if (st) return st;
        if (rmdir(path)) return fail_errno(err, "rmdir", path, errno);
    } else if (unlink(path)) {
        return fail_errno(err, "unlink", path, errno);
    }
    return STATUS_OK;
}

enum status durable_remove_tree(const char *path, struct error *err) {
    enum fault_kind k;
    enum status st = fault_tick("remove", path, 0, 0, 0, &k, err);
    return st ? st : remove_rec(path, true, err);
}

enum status durable_point(const char *name, const char *path, bool creates, struct error *err) {
    enum fault_kind k;
    enum status st = fault_tick(name, path, 0, 0, creates, &k, err);
    if (st) return st;
    if (fault.kind == FAULT_KILL_NAMED && fault_here() && !strcmp(fault.name, name) &&
        ++fault.named_hits == fault.n)
        fault_kill(name, path);
    if (fault.kind == FAULT_STALL_NAMED && fault_here() && !strcmp(fault.name, name) &&
        ++fault.named_hits == fault.n) {
        fprintf(stderr, "trident: [rank %d] TRIDENT_FAULT: stalling 3 s at %s (%s)\n", g_log_rank, name, path);
        fflush(stderr);
        sleep(3);
    }
    if (k == FAULT_ENOSPC) return fail_errno(err, name, path, ENOSPC);
    return STATUS_OK;
}

void durable_hang_point(const char *name, const char *path) {
    if (fault_load(NULL) || fault.kind != FAULT_HANG_NAMED || !fault_here() || strcmp(fault.name, name) ||
        ++fault.named_hits != fault.n)
        return;
    fprintf(stderr, "trident: [rank %d] TRIDENT_FAULT: hanging at %s (%s)\n", g_log_rank, name, path);
    fflush(stderr);
    for (;;) pause();
}

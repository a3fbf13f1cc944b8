// cache.c: the hot-tier shard cache and its stager thread (cache.h,
// docs/design.md §6).
#include "cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/checksum.h"

// Bytes per read and write while copying a shard from the cold tier.
#define CACHE_COPY_BYTES (1 << 20)

struct cache_shard {
    char file[256];     // name in both tiers
    char checksum[64];  // index.ini's
    uint64_t bytes;
    bool hot;           // published in the folder (by anyone; seen by this process)
    bool mine;          // published by this stager: counts against the budget
    bool failed;        // the stager gave up on it (the reader reports the cold error)
    int open;           // readers of this process holding it (cache_acquire)
    uint64_t last_use;  // cache clock at its last acquire or want
    uint64_t want_mark; // the cache_want call that listed it last
};

struct cache {
    char dir[4200];      // cache_dir/<index hash>
    char cold[4096];     // [data] path
    int n;
    struct cache_shard *shards; // (n,)
    int64_t budget, used; // bytes: cache_bytes, published by this stager and present
    int prefetch;
    bool stager;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, started;
    int *want;            // (n_want,) shards, order of first need
    int n_want, cap_want;
    uint64_t clock, wants;
    int64_t staged, evicted, failed;
};

void cache_sleep_ms(long ms) { sleep_s(ms / 1e3); }

static int fault_delay_ms, fault_eio_shard = -1;
static int fault_at_shard = -1, fault_at_first, fault_at_count; // cold_eio_at:K:N:M
static atomic_int fault_at_seen; // cold accesses of fault_at_shard so far

static void fault_load(void) {
    const char *spec = getenv("TRIDENT_DATA_FAULT");
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec ? spec : "");
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (sscanf(tok, "cold_delay_ms:%d", &fault_delay_ms) == 1 && fault_delay_ms >= 0) continue;
        if (sscanf(tok, "cold_eio_at:%d:%d:%d", &fault_at_shard, &fault_at_first, &fault_at_count) == 3 &&
            fault_at_shard >= 0 && fault_at_first >= 1 && fault_at_count >= 1)
            continue;
        if (sscanf(tok, "cold_eio:%d", &fault_eio_shard) == 1 && fault_eio_shard >= 0) continue;
        fprintf(stderr, "trident: TRIDENT_DATA_FAULT='%s': '%s' is not cold_delay_ms:N, cold_eio:K or "
                "cold_eio_at:K:N:M; ignored\n", spec, tok);
        fault_delay_ms = 0;
        fault_eio_shard = fault_at_shard = -1;
        break;
    }
}

int cache_cold_fault(int i) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fault_load);
    if (fault_delay_ms > 0) cache_sleep_ms(fault_delay_ms);
    if (i == fault_at_shard) {
        int n = atomic_fetch_add(&fault_at_seen, 1) + 1;
        if (n >= fault_at_first && n < fault_at_first + fault_at_count) return EIO;
    }
    return i == fault_eio_shard ? EIO : 0;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

// Removes .NAME.PID.tmp files whose process is gone (a stager that died
// mid-copy); a live process's (another job's) are left alone.
static void remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] != '.' || len < 5 || strcmp(e->d_name + len - 4, ".tmp")) continue;
        const char *dot = e->d_name + len - 5;
        while (dot > e->d_name && *dot != '.') dot--;
        long pid = strtol(dot + 1, NULL, 10);
        char path[4500];
        snprintf(path, sizeof path, "/proc/%ld", pid); // Linux: the process is alive
        if (pid > 0 && access(path, F_OK) == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

enum status cache_open(const char *cache_dir, const char *cold_dir, const struct index *ix, int64_t budget,
                       int prefetch, bool stager, struct cache **out, struct error *err) {
    *out = NULL;
    char ipath[4200], sum[64];
    snprintf(ipath, sizeof ipath, "%s/index.ini", cold_dir);
    enum status s = checksum_file(ipath, sum, err);
    if (s) return s;
    const char *hex = strchr(sum, ':') ? strchr(sum, ':') + 1 : sum;
    struct cache *c = xcalloc(1, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s/%s", cache_dir, hex);
    snprintf(c->cold, sizeof c->cold, "%s", cold_dir);
    if (make_dirs(c->dir) || access(c->dir, W_OK | X_OK)) {
        s = error_set(err, STATUS_BAD_INPUT, "[data] cache_dir = %s: cannot create or write %s: %s", cache_dir,
                      c->dir, strerror(errno));
        free(c);
        return s;
    }
    c->n = ix->n_shards;
    c->shards = xcalloc((size_t)c->n, sizeof *c->shards);
    for (int i = 0; i < c->n; i++) {
        snprintf(c->shards[i].file, sizeof c->shards[i].file, "%s", ix->shards[i].file);
        snprintf(c->shards[i].checksum, sizeof c->shards[i].checksum, "%s", ix->shards[i].checksum);
        c->shards[i].bytes = ix->shards[i].bytes;
    }
    c->budget = budget;
    c->prefetch = prefetch;
    c->stager = stager;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (stager) remove_stale_temps(c->dir);
    *out = c;
    return STATUS_OK;
}

// True when shard i's published file is in the folder with its size.
static bool present(const struct cache *c, int i) {
    char path[4500];
    snprintf(path, sizeof path, "%s/%s", c->dir, c->shards[i].file);
    struct stat st;
    return stat(path, &st) == 0 && (uint64_t)st.st_size == c->shards[i].bytes;
}

bool cache_published(const struct cache *c, int i) { return present(c, i); }

bool cache_acquire(struct cache *c, int i, char *path, size_t cap) {
    if (!present(c, i)) return false;
    snprintf(path, cap, "%s/%s", c->dir, c->shards[i].file);
    pthread_mutex_lock(&c->mu);
    c->shards[i].hot = true;
    c->shards[i].open++;
    c->shards[i].last_use = ++c->clock;
    pthread_mutex_unlock(&c->mu);
    return true;
}

void cache_release(struct cache *c, int i) {
    pthread_mutex_lock(&c->mu);
    if (c->shards[i].open > 0) c->shards[i].open--;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void cache_counts(const struct cache *c, int64_t *staged, int64_t *evicted, int64_t *failed) {
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    *staged = c->staged;
    *evicted = c->evicted;
    *failed = c->failed;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
}

// One try at copying shard i from the cold tier into a temporary file,
// verifying it and publishing it by rename. Returns 0 or an errno-like code
// (EIO for a checksum mismatch); the temporary file never outlives a failure.
static int copy_once(struct cache *c, int i, const struct cache_shard *sh) {
    char src[4500], tmp[4600], dst[4500];
    snprintf(src, sizeof src, "%s/%s", c->cold, sh->file);
    snprintf(tmp, sizeof tmp, "%s/.%s.%ld.tmp", c->dir, sh->file, (long)getpid());
    snprintf(dst, sizeof dst, "%s/%s", c->dir, sh->file);
    int rc = cache_cold_fault(i);
    if (rc) return rc;
    int in = open(src, O_RDONLY);
    if (in < 0) return errno;
    int outfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (outfd < 0) {
        rc = errno;
        close(in);
        return rc;
    }
    char *buf = xmalloc(CACHE_COPY_BYTES);
    uint64_t total = 0;
    for (;;) {
        ssize_t got = read(in, buf, CACHE_COPY_BYTES);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got < 0) rc = errno;
            break;
        }
        for (ssize_t off = 0; off < got && !rc;) {
            ssize_t put = write(outfd, buf + off, (size_t)(got - off));
            if (put < 0 && errno == EINTR) continue;
            if (put < 0) rc = errno;
            else off += put;
        }
        if (rc) break;
        total += (uint64_t)got;
    }
    free(buf);
    close(in);
    if (!rc && fsync(outfd)) rc = errno;
    if (close(outfd) && !rc) rc = errno;
    if (!rc && total != sh->bytes) rc = EIO;
    if (!rc) {
        char sum[64];
        struct error e = {0};
        if (checksum_file(tmp, sum, &e) || strcmp(sum, sh->checksum)) rc = EIO;
    }
    if (!rc && rename(tmp, dst)) rc = errno;
    if (rc) {
        unlink(tmp);
        return rc;
    }
    fsync_dir(c->dir);
    return 0;
}

// Unlinks the least recently used shard this stager published that is
// neither wanted nor open here. Called with mu held. False when none is.
static bool evict_one(struct cache *c) {
    int lru = -1;
    for (int i = 0; i < c->n; i++) {
        const struct cache_shard *sh = &c->shards[i];
        if (!sh->mine || sh->open > 0) continue;
        bool wanted = false;
        for (int k = 0; k < c->n_want && k < c->prefetch + 1 && !wanted; k++) wanted = c->want[k] == i;
        if (wanted) continue;
        if (lru < 0 || sh->last_use < c->shards[lru].last_use) lru = i;
    }
    if (lru < 0) return false;
    char path[4500];
    snprintf(path, sizeof path, "%s/%s", c->dir, c->shards[lru].file);
    unlink(path);
    c->shards[lru].hot = c->shards[lru].mine = false;
    c->used -= (int64_t)c->shards[lru].bytes;
    c->evicted++;
    return true;
}

// The first of the wanted window (prefetch + 1 distinct shards, the one
// needed now first) that is neither hot nor failed, or -1. With mu held.
static int next_to_stage(struct cache *c) {
    for (int k = 0; k < c->n_want && k < c->prefetch + 1; k++) {
        struct cache_shard *sh = &c->shards[c->want[k]];
        if (sh->failed || (int64_t)sh->bytes > c->budget) continue;
        if (!sh->hot && present(c, c->want[k])) sh->hot = true; // published by another job
        if (!sh->hot) return c->want[k];
    }
    return -1;
}

static void *stager_main(void *arg) {
    struct cache *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        int i = next_to_stage(c);
        if (i < 0) {
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        struct cache_shard *sh = &c->shards[i];
        while (c->used + (int64_t)sh->bytes > c->budget && evict_one(c)) {
        }
        if (c->used + (int64_t)sh->bytes > c->budget) { // all hot shards wanted or open: wait
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        struct cache_shard copy = *sh;
        pthread_mutex_unlock(&c->mu);
        int rc = 0;
        long backoff = CACHE_COLD_BACKOFF_MS;
        for (int try = 1; try <= CACHE_COLD_TRIES; try++) {
            if ((rc = copy_once(c, i, &copy)) == 0) break;
            fprintf(stderr, "trident: stager: shard %s from the cold tier (%s): %s (try %d of %d)\n", copy.file,
                    c->cold, strerror(rc), try, CACHE_COLD_TRIES);
            if (try < CACHE_COLD_TRIES) cache_sleep_ms(backoff);
            backoff *= 2;
        }
        pthread_mutex_lock(&c->mu);
        if (rc) {
            sh->failed = true;
            c->failed++;
        } else {
            sh->hot = sh->mine = true;
            sh->last_use = ++c->clock;
            c->used += (int64_t)sh->bytes;
            c->staged++;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void cache_want(struct cache *c, const int *shards, int n) {
    if (!c->stager) return;
    pthread_mutex_lock(&c->mu);
    if (c->cap_want < c->n) {
        c->cap_want = c->n;
        c->want = realloc(c->want, (size_t)c->cap_want * sizeof *c->want);
        CHECK(c->want, "out of memory");
    }
    // Distinct, order of first need.
    c->n_want = 0;
    c->wants++;
    for (int k = 0; k < n && c->n_want < c->cap_want; k++) {
        struct cache_shard *sh = &c->shards[shards[k]];
        if (sh->want_mark == c->wants) continue;
        sh->want_mark = c->wants;
        c->want[c->n_want++] = shards[k];
    }
    for (int k = c->n_want; k-- > 0;) c->shards[c->want[k]].last_use = ++c->clock; // sooner: more recent
    if (!c->started) {
        CHECK(pthread_create(&c->thread, NULL, stager_main, c) == 0, "cannot start the stager thread");
        c->started = true;
    }
    // Wake the stager only when the window holds work: a thread woken every
    // step costs the reader a preemption on a loaded node (~1 ms measured).
    bool work = false;
    for (int k = 0; k < c->n_want && k < c->prefetch + 1 && !work; k++) {
        const struct cache_shard *sh = &c->shards[c->want[k]];
        work = !sh->hot && !sh->failed && (int64_t)sh->bytes <= c->budget;
    }
    if (work) pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void cache_close(struct cache *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->started) pthread_join(c->thread, NULL);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->want);
    free(c->shards);
    free(c);
}

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
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/checksum.h"

// Bytes per read and write while copying a shard from the cold tier.
#define CACHE_COPY_BYTES (1 << 20)


struct cache_shard {
    char file[256];     // name in the cold tier
    char checksum[64];  // index.ini's
    uint64_t bytes;
    char id[CACHE_ID_BYTES];     // the source's identity as this process last saw it ("": not yet)
    char pub_id[CACHE_ID_BYTES]; // the identity this stager's own copy was published under (mine)
    bool hot;           // published under id (by anyone; seen by this process)
    bool mine;          // published by this stager (under pub_id): counts against the budget
    bool failed;        // the stager gave up on it (the reader reports the cold error)
    int open;           // readers of this process holding it (cache_acquire)
    uint64_t last_use;  // cache clock at its last acquire or want
    uint64_t want_mark; // the cache_want call that listed it last
};

struct cache {
    char dir[4200];      // cache_dir/<index hash>
    char cold[4096];     // [data] path
    char host[72];       // this node's name for temporary files (cache_node_name)
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

static int fault_delay_ms, fault_eio_shard = -1, fault_stall_ms;
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
        if (sscanf(tok, "stage_stall_ms:%d", &fault_stall_ms) == 1 && fault_stall_ms >= 0) continue;
        fprintf(stderr, "trident: TRIDENT_DATA_FAULT='%s': '%s' is not cold_delay_ms:N, cold_eio:K, "
                "cold_eio_at:K:N:M or stage_stall_ms:N; ignored\n", spec, tok);
        fault_delay_ms = fault_stall_ms = 0;
        fault_eio_shard = fault_at_shard = -1;
        break;
    }
}

static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

int cache_cold_fault(int i) {
    pthread_once(&fault_once, fault_load);
    if (fault_delay_ms > 0) cache_sleep_ms(fault_delay_ms);
    if (i == fault_at_shard) {
        int n = atomic_fetch_add(&fault_at_seen, 1) + 1;
        if (n >= fault_at_first && n < fault_at_first + fault_at_count) return EIO;
    }
    return i == fault_eio_shard ? EIO : 0;
}

// TRIDENT_DATA_FAULT's stage_stall_ms: ms a copy stalls halfway (tests).
static int stage_stall_ms(void) {
    pthread_once(&fault_once, fault_load);
    return fault_stall_ms;
}

void cache_node_name(char *out, size_t cap) {
    const char *test = getenv("TRIDENT_TEST_HOST");
    char host[256] = "";
    if (test && *test) snprintf(host, sizeof host, "%s", test);
    else if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "unknown-host");
    host[sizeof host - 1] = '\0';
    size_t k = 0;
    for (const char *p = host; *p && k + 1 < cap && k < 64; p++)
        out[k++] = (*p == '~' || *p == '/' || (unsigned char)*p < 0x21) ? '_' : *p;
    if (cap) out[k < cap ? k : cap - 1] = '\0';
}

static void id_of(const struct stat *st, char id[CACHE_ID_BYTES]) {
    int64_t v[5] = {(int64_t)st->st_size, (int64_t)st->st_mtim.tv_sec, (int64_t)st->st_mtim.tv_nsec,
                    (int64_t)st->st_ctim.tv_sec, (int64_t)st->st_ctim.tv_nsec};
    snprintf(id, CACHE_ID_BYTES, "%016llx", (unsigned long long)XXH3_64bits(v, sizeof v));
}

int cache_source_id(const char *path, char id[CACHE_ID_BYTES]) {
    struct stat st;
    if (stat(path, &st)) return errno;
    id_of(&st, id);
    return 0;
}

// The published name of a copy of file whose source had identity id:
// "shard-00003.h5" -> "shard-00003.<id>.h5" (a name without an extension
// gets ".<id>" appended), inside c->dir.
static void hot_path(const struct cache *c, const char *file, const char *id, char *out, size_t cap) {
    const char *ext = strrchr(file, '.');
    if (!ext || ext == file) ext = file + strlen(file);
    snprintf(out, cap, "%s/%.*s.%s%s", c->dir, (int)(ext - file), file, id, ext);
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

// A random 64-bit value for temporary file names (getrandom, else the clock
// mixed with a counter: unique names only need to differ, and O_EXCL backs
// them).
static uint64_t random_u64(void) {
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r) return r;
    static atomic_uint_fast64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t v[3] = {(uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30), (uint64_t)getpid(),
                     atomic_fetch_add(&counter, 1)};
    return XXH3_64bits(v, sizeof v);
}

// Removes the temporary files in dir that are provably abandoned: named
// .NAME~HOST~PID~RANDOM.tmp with HOST this node's name, PID not a live
// process here (no /proc/PID while /proc/self exists) and not touched for
// CACHE_TEMP_ABANDON_S. Another node's, a live process's, a recent one and
// any other name are left alone (cache.h).
static void remove_abandoned_temps(const char *dir, const char *host) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        size_t len = strlen(name);
        if (name[0] != '.' || len < 5 || strcmp(name + len - 4, ".tmp")) continue;
        const char *t3 = strrchr(name, '~'); // ~RANDOM.tmp
        if (!t3) continue;
        const char *t2 = t3 - 1;            // ~PID
        while (t2 > name && *t2 != '~') t2--;
        const char *t1 = t2 - 1;            // ~HOST
        while (t1 > name && *t1 != '~') t1--;
        if (t1 <= name || *t2 != '~' || *t1 != '~') continue;
        if ((size_t)(t2 - t1 - 1) != strlen(host) || strncmp(t1 + 1, host, (size_t)(t2 - t1 - 1))) continue;
        char *endp;
        long pid = strtol(t2 + 1, &endp, 10);
        if (endp != t3 || pid <= 0 || pid == (long)getpid()) continue;
        char path[4500];
        snprintf(path, sizeof path, "/proc/%ld", pid); // Linux: alive (or no /proc to tell: keep)
        if (access("/proc/self", F_OK) || access(path, F_OK) == 0 || errno != ENOENT) continue;
        snprintf(path, sizeof path, "%s/%s", dir, name);
        struct stat st;
        if (lstat(path, &st) || !S_ISREG(st.st_mode) || now - st.st_mtime < CACHE_TEMP_ABANDON_S) continue;
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
    cache_node_name(c->host, sizeof c->host);
    if (make_dirs(c->dir) || access(c->dir, W_OK | X_OK)) {
        s = error_set(err, STATUS_BAD_INPUT, "[data] cache_dir = %s: the hot tier: cannot create or write %s: %s",
                      cache_dir, c->dir, strerror(errno));
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
    if (stager) remove_abandoned_temps(c->dir, c->host);
    *out = c;
    return STATUS_OK;
}

// True when a copy of shard i published under identity id is in the folder
// with its size (one stat of the hot tier).
static bool published_as(const struct cache *c, int i, const char *id) {
    if (!id[0]) return false;
    char path[4500];
    hot_path(c, c->shards[i].file, id, path, sizeof path);
    struct stat st;
    return stat(path, &st) == 0 && (uint64_t)st.st_size == c->shards[i].bytes;
}

static void cold_path(const struct cache *c, int i, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", c->cold, c->shards[i].file);
}

bool cache_published(const struct cache *c, int i) {
    char id[CACHE_ID_BYTES];
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    memcpy(id, c->shards[i].id, sizeof id);
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
    return published_as(c, i, id);
}

// Records that shard i's source now has identity id (with mu held): a copy
// this stager published under another identity is stale and unlinked (a
// reader that has it open keeps reading it); the shard is no longer hot here
// until a copy under id is seen or staged.
static void note_source_id(struct cache *c, int i, const char *id) {
    struct cache_shard *sh = &c->shards[i];
    if (!strcmp(sh->id, id)) return;
    if (sh->mine && strcmp(sh->pub_id, id)) {
        char path[4500];
        hot_path(c, sh->file, sh->pub_id, path, sizeof path);
        unlink(path);
        sh->mine = false;
        c->used -= (int64_t)sh->bytes;
    }
    if (sh->id[0]) sh->hot = false;
    memcpy(sh->id, id, sizeof sh->id);
    pthread_cond_signal(&c->cv);
}

bool cache_acquire(struct cache *c, int i, char *path, size_t cap) {
    char src[4500], id[CACHE_ID_BYTES];
    cold_path(c, i, src, sizeof src);
    if (cache_source_id(src, id)) return false; // the reader's cold open reports it, naming the cold tier
    pthread_mutex_lock(&c->mu);
    note_source_id(c, i, id);
    pthread_mutex_unlock(&c->mu);
    if (!published_as(c, i, id)) return false;
    hot_path(c, c->shards[i].file, id, path, cap);
    pthread_mutex_lock(&c->mu);
    if (!strcmp(c->shards[i].id, id)) c->shards[i].hot = true;
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

// How a stage try ended.
enum stage_result {
    STAGE_OK,       // published (by this try, or found published under the source's identity)
    STAGE_RETRY,    // an I/O error of either tier, or the source changed during the copy: try again
    STAGE_MISMATCH, // the source's bytes do not match index.ini's checksum: not staged, not retried
};

// One try at staging shard i: the source's identity from its open file; if a
// copy under that identity is already published (another job, another
// node), done. Else a copy into this try's own temporary file
// (.NAME~HOST~PID~RANDOM.tmp, created with O_EXCL), hashed as it is read,
// fsynced, re-read and checked against index.ini's checksum, the source's
// identity checked unchanged, then renamed to its published name and the
// folder fsynced. The temporary file never outlives a failure. *id receives
// the identity published under; *copied whether this try wrote the copy.
// why (cap bytes) names the tier that failed and the errno's text.
static enum stage_result stage_once(struct cache *c, int i, const struct cache_shard *sh, char *id, bool *copied,
                                    char *why, size_t cap) {
    char src[4500], tmp[4700], dst[4500];
    *copied = false;
    cold_path(c, i, src, sizeof src);
    int rc = cache_cold_fault(i);
    if (rc) {
        snprintf(why, cap, "the cold tier: cannot read %s: %s", src, strerror(rc));
        return STAGE_RETRY;
    }
    int in = open(src, O_RDONLY);
    struct stat st0, st1, st2;
    if (in < 0 || fstat(in, &st0)) {
        snprintf(why, cap, "the cold tier: cannot open %s: %s", src, strerror(errno));
        if (in >= 0) close(in);
        return STAGE_RETRY;
    }
    id_of(&st0, id);
    if (published_as(c, i, id)) {
        close(in);
        return STAGE_OK;
    }
    hot_path(c, sh->file, id, dst, sizeof dst);
    const char *base = strrchr(dst, '/') + 1;
    snprintf(tmp, sizeof tmp, "%s/.%s~%s~%ld~%016llx.tmp", c->dir, base, c->host, (long)getpid(),
             (unsigned long long)random_u64());
    int outfd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (outfd < 0) {
        snprintf(why, cap, "the hot tier: cannot create %s: %s", tmp, strerror(errno));
        close(in);
        return STAGE_RETRY;
    }
    enum stage_result res = STAGE_OK;
    char *buf = xmalloc(CACHE_COPY_BYTES);
    XXH3_state_t *hs = XXH3_createState();
    CHECK(hs, "XXH3_createState failed");
    XXH3_64bits_reset(hs);
    uint64_t total = 0;
    int stall = stage_stall_ms();
    for (;;) {
        ssize_t got = read(in, buf, CACHE_COPY_BYTES);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            snprintf(why, cap, "the cold tier: reading %s: %s", src, strerror(errno));
            res = STAGE_RETRY;
        }
        if (got <= 0) break;
        XXH3_64bits_update(hs, buf, (size_t)got);
        for (ssize_t off = 0; off < got && res == STAGE_OK;) {
            ssize_t put = write(outfd, buf + off, (size_t)(got - off));
            if (put < 0 && errno == EINTR) continue;
            if (put < 0) {
                snprintf(why, cap, "the hot tier: writing %s: %s", tmp, strerror(errno));
                res = STAGE_RETRY;
            } else {
                off += put;
            }
        }
        if (res != STAGE_OK) break;
        total += (uint64_t)got;
        if (stall > 0 && total >= sh->bytes / 2) { // tests: a copy stalled halfway
            cache_sleep_ms(stall);
            stall = 0;
        }
    }
    char src_sum[64];
    snprintf(src_sum, sizeof src_sum, "xxh3-64:%016llx", (unsigned long long)XXH3_64bits_digest(hs));
    XXH3_freeState(hs);
    free(buf);
    if (res == STAGE_OK && fsync(outfd)) {
        snprintf(why, cap, "the hot tier: fsync of %s: %s", tmp, strerror(errno));
        res = STAGE_RETRY;
    }
    if (close(outfd) && res == STAGE_OK) {
        snprintf(why, cap, "the hot tier: closing %s: %s", tmp, strerror(errno));
        res = STAGE_RETRY;
    }
    // The bytes copied are the source's at identity id only if the open file
    // and the name still have it (an in-place write changes ctime; a rename
    // over the name, the file).
    if (res == STAGE_OK) {
        char id1[CACHE_ID_BYTES], id2[CACHE_ID_BYTES] = "";
        bool same = fstat(in, &st1) == 0 && stat(src, &st2) == 0 && st1.st_ino == st2.st_ino &&
                    st1.st_dev == st2.st_dev;
        if (same) {
            id_of(&st1, id1);
            id_of(&st2, id2);
            same = !strcmp(id, id1) && !strcmp(id, id2);
        }
        if (!same) {
            snprintf(why, cap, "the cold tier: %s changed while it was copied", src);
            res = STAGE_RETRY;
        }
    }
    close(in);
    if (res == STAGE_OK && (total != sh->bytes || strcmp(src_sum, sh->checksum))) {
        snprintf(why, cap, "the cold tier: %s (%" PRIu64 " bytes, %s) does not match index.ini (%" PRIu64
                 " bytes, %s): changed since the index was written; not staged", src, total, src_sum, sh->bytes,
                 sh->checksum);
        res = STAGE_MISMATCH;
    }
    if (res == STAGE_OK) {
        char sum[64];
        struct error e = {0};
        if (checksum_file(tmp, sum, &e)) {
            snprintf(why, cap, "the hot tier: re-reading %s: %s", tmp, e.msg);
            res = STAGE_RETRY;
        } else if (strcmp(sum, src_sum)) {
            snprintf(why, cap, "the hot tier: %s reads back as %s, %s was written", tmp, sum, src_sum);
            res = STAGE_RETRY;
        }
    }
    if (res == STAGE_OK && rename(tmp, dst)) {
        snprintf(why, cap, "the hot tier: cannot publish %s as %s: %s", tmp, dst, strerror(errno));
        res = STAGE_RETRY;
    }
    if (res != STAGE_OK) {
        unlink(tmp);
        return res;
    }
    fsync_dir(c->dir);
    *copied = true;
    return STAGE_OK;
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
    hot_path(c, c->shards[lru].file, c->shards[lru].pub_id, path, sizeof path);
    unlink(path);
    c->shards[lru].mine = false;
    if (!strcmp(c->shards[lru].id, c->shards[lru].pub_id)) c->shards[lru].hot = false;
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
        // Published already under the source's identity (another job, another
        // node)? One stat of each tier, without the lock.
        pthread_mutex_unlock(&c->mu);
        char src[4500], id[CACHE_ID_BYTES];
        cold_path(c, i, src, sizeof src);
        bool there = cache_source_id(src, id) == 0 && published_as(c, i, id);
        pthread_mutex_lock(&c->mu);
        if (there) {
            note_source_id(c, i, id);
            sh->hot = true;
            continue;
        }
        while (c->used + (int64_t)sh->bytes > c->budget && evict_one(c)) {
        }
        if (c->used + (int64_t)sh->bytes > c->budget) { // all hot shards wanted or open: wait
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        struct cache_shard copy = *sh;
        pthread_mutex_unlock(&c->mu);
        enum stage_result res = STAGE_RETRY;
        bool copied = false;
        long backoff = CACHE_COLD_BACKOFF_MS;
        for (int try = 1; try <= CACHE_COLD_TRIES; try++) {
            char why[9400];
            if ((res = stage_once(c, i, &copy, id, &copied, why, sizeof why)) == STAGE_OK) break;
            if (res == STAGE_MISMATCH) {
                fprintf(stderr, "trident: stager: shard %s: %s\n", copy.file, why);
                break;
            }
            fprintf(stderr, "trident: stager: shard %s: %s (try %d of %d)\n", copy.file, why, try,
                    CACHE_COLD_TRIES);
            if (try < CACHE_COLD_TRIES) cache_sleep_ms(backoff);
            backoff *= 2;
        }
        pthread_mutex_lock(&c->mu);
        if (res != STAGE_OK) {
            sh->failed = true;
            c->failed++;
            continue;
        }
        note_source_id(c, i, id);
        sh->hot = true;
        if (copied && !sh->mine) {
            sh->mine = true;
            memcpy(sh->pub_id, id, sizeof sh->pub_id);
            c->used += (int64_t)sh->bytes;
            c->staged++;
        }
        sh->last_use = ++c->clock;
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

// test_cache.c: the hot tier keyed by content, with temporary files of its
// own per node and process (src/data/cache.h, docs/design.md §6, issue 27).
//  1. Stale source: a dataset staged into the cache, then shard 1 rewritten
//     in place (same size, one byte changed, atime and mtime restored) and
//     shard 2 rewritten with its own bytes (same size and mtime): a reader
//     never gets shard 1 from the cache but a refusal naming shard-00001.h5
//     and index.ini (as without the cache); shard 2 is read from the cold
//     tier, then restaged under its new identity and read hot again; the
//     stager refuses to stage shard 1 (counted failed, not retried).
//  2. Two nodes, 20 rounds: two processes with other host names
//     (TRIDENT_TEST_HOST) and, where the kernel lets us, one pid (each in a
//     pid namespace of its own, pid 1, as containers on two nodes), fill one
//     empty cache folder at once, every copy stalled halfway
//     (TRIDENT_DATA_FAULT=stage_stall_ms): both see every shard published,
//     every published file equals its source, no temporary file is left and
//     neither wrote any error (none can blame a tier).
//  3. Cleanup of temporary files at a stager's start: only this node's, of a
//     dead pid, older than CACHE_TEMP_ABANDON_S, are removed; another node's,
//     a live pid's, a recent one and a name of another form stay.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/checksum.h"
#include "data/cache.h"
#include "data/dataset.h"
#include "test.h"

#define VOCAB 1000
#define SHARDS 4
#define SHARD_TOKENS 3000
#define NODE_SHARDS 6
#define NODE_SHARD_BYTES (96 * 1024)
#define ROUNDS 20

static char root[256];

static void sh(const char *fmt, const char *arg) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, fmt, arg);
    EXPECT(system(cmd) == 0, "%s", cmd);
}

// Waits until the stager has staged or failed want shards (10 s at most).
static void wait_stager(struct cache *c, int64_t want) {
    int64_t staged = 0, evicted, failed = 0;
    for (int k = 0; k < 5000 && staged + failed < want; k++) {
        cache_sleep_ms(2);
        cache_counts(c, &staged, &evicted, &failed);
    }
}

// Rewrites path in place (same inode, same size) with byte at flipped when
// flip, else with its own bytes, and puts its atime and mtime back.
static void rewrite_in_place(const char *path, bool flip) {
    struct stat st;
    EXPECT(stat(path, &st) == 0, "stat %s", path);
    char *buf = xmalloc((size_t)st.st_size);
    int fd = open(path, O_RDWR);
    EXPECT(fd >= 0 && pread(fd, buf, (size_t)st.st_size, 0) == st.st_size, "read %s", path);
    if (flip) buf[st.st_size / 2] ^= 0x5a;
    EXPECT(pwrite(fd, buf, (size_t)st.st_size, 0) == st.st_size && fsync(fd) == 0, "rewrite %s", path);
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    EXPECT(futimens(fd, times) == 0, "futimens %s", path);
    close(fd);
    free(buf);
    struct stat after;
    EXPECT(stat(path, &after) == 0 && after.st_size == st.st_size && after.st_mtim.tv_sec == st.st_mtim.tv_sec &&
               after.st_mtim.tv_nsec == st.st_mtim.tv_nsec && after.st_ino == st.st_ino,
           "%s: same size, mtime and inode after the rewrite", path);
}

static void test_stale_source(void) {
    char dir[512], cache_dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/data", root);
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", root);
    struct dataset_writer w;
    struct error err = {0};
    EXPECT(dataset_writer_init(&w, dir, VOCAB, 0, "test-tok-1", &err) == STATUS_OK, "%s", err.msg);
    int32_t *tok = xmalloc(SHARD_TOKENS * sizeof *tok);
    uint64_t offsets[2] = {0, SHARD_TOKENS};
    for (int s = 0; s < SHARDS; s++) {
        for (int k = 0; k < SHARD_TOKENS; k++) tok[k] = (int32_t)((k * 7 + s * 131) % VOCAB);
        EXPECT(dataset_writer_add(&w, SPLIT_TRAIN, tok, SHARD_TOKENS, offsets, 1, &err) == STATUS_OK, "%s", err.msg);
    }
    free(tok);
    EXPECT(dataset_writer_finish(&w, &err) == STATUS_OK, "%s", err.msg);
    int all[SHARDS];
    for (int s = 0; s < SHARDS; s++) all[s] = s;

    // Stage everything, read it hot.
    struct dataset *ds = NULL;
    struct shard *h5;
    EXPECT(dataset_open(dir, 16, VOCAB, "test-tok-1", &ds, &err) == STATUS_OK, "%s", err.msg);
    if (!ds) return;
    EXPECT(cache_open(cache_dir, dir, &ds->index, (int64_t)1 << 30, SHARDS, true, &ds->cache, &err) == STATUS_OK,
           "%s", err.msg);
    cache_want(ds->cache, all, SHARDS);
    wait_stager(ds->cache, SHARDS);
    for (int s = 0; s < SHARDS; s++) {
        EXPECT(dataset_shard_get(ds, s, &h5, &err) == STATUS_OK, "shard %d: %s", s, err.msg);
        EXPECT(ds->shards[s].hot, "shard %d read from the cold tier after staging", s);
    }
    dataset_close(ds);

    snprintf(path, sizeof path, "%s/shard-00001.h5", dir);
    rewrite_in_place(path, true);
    snprintf(path, sizeof path, "%s/shard-00002.h5", dir);
    rewrite_in_place(path, false);

    // A reader (not the stager): shard 1 refused by name, never served hot;
    // shard 2 from the cold tier; shard 0 still hot.
    ds = NULL;
    EXPECT(dataset_open(dir, 16, VOCAB, "test-tok-1", &ds, &err) == STATUS_OK, "%s", err.msg);
    if (!ds) return;
    EXPECT(cache_open(cache_dir, dir, &ds->index, (int64_t)1 << 30, SHARDS, false, &ds->cache, &err) == STATUS_OK,
           "%s", err.msg);
    EXPECT(dataset_shard_get(ds, 0, &h5, &err) == STATUS_OK && ds->shards[0].hot, "shard 0 not hot: %s", err.msg);
    enum status s1 = dataset_shard_get(ds, 1, &h5, &err);
    EXPECT(s1 == STATUS_BAD_INPUT, "shard 1, rewritten in place with its size and mtime, was served (status %d, "
           "hot %d) instead of refused", (int)s1, (int)ds->shards[1].hot);
    EXPECT(s1 != STATUS_OK || !ds->shards[1].hot, "shard 1 served stale from the hot tier");
    EXPECT(s1 == STATUS_OK || (strstr(err.msg, "shard-00001.h5") && strstr(err.msg, "index.ini")),
           "refusal names neither shard-00001.h5 nor index.ini: %s", err.msg);
    printf("rewritten shard 1: %s\n", err.msg);
    EXPECT(dataset_shard_get(ds, 2, &h5, &err) == STATUS_OK, "shard 2 (same bytes): %s", err.msg);
    EXPECT(!ds->shards[2].hot, "shard 2 read from a copy staged under its old identity");
    dataset_close(ds);

    // The stager restages shard 2 under the new identity and refuses shard 1.
    ds = NULL;
    EXPECT(dataset_open(dir, 16, VOCAB, "test-tok-1", &ds, &err) == STATUS_OK, "%s", err.msg);
    if (!ds) return;
    EXPECT(cache_open(cache_dir, dir, &ds->index, (int64_t)1 << 30, SHARDS, true, &ds->cache, &err) == STATUS_OK,
           "%s", err.msg);
    cache_want(ds->cache, all + 1, 2);
    wait_stager(ds->cache, 2);
    int64_t staged, evicted, failed;
    cache_counts(ds->cache, &staged, &evicted, &failed);
    EXPECT(staged == 1 && failed == 1, "restage of shards 1 and 2: %lld staged, %lld failed; expected 1 and 1",
           (long long)staged, (long long)failed);
    EXPECT(dataset_shard_get(ds, 2, &h5, &err) == STATUS_OK && ds->shards[2].hot, "shard 2 not hot after restaging: %s",
           err.msg);
    EXPECT(dataset_shard_get(ds, 1, &h5, &err) == STATUS_BAD_INPUT, "shard 1 served after the stager refused it");
    dataset_close(ds);
}

// ---- two nodes ------------------------------------------------------------

static struct index node_ix;
static char node_cold[512];

static void make_node_dataset(void) {
    snprintf(node_cold, sizeof node_cold, "%s/cold", root);
    EXPECT(mkdir(node_cold, 0755) == 0, "mkdir %s", node_cold);
    node_ix = (struct index){.format_version = SHARD_FORMAT_VERSION, .vocab_size = 50, .eot_id = 0};
    snprintf(node_ix.tokenizer, sizeof node_ix.tokenizer, "tok-abc");
    snprintf(node_ix.splits, sizeof node_ix.splits, "train");
    uint64_t x = 88172645463325252ull;
    char *buf = xmalloc(NODE_SHARD_BYTES), path[1024];
    struct error err = {0};
    for (int i = 0; i < NODE_SHARDS; i++) {
        for (int k = 0; k < NODE_SHARD_BYTES; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[k] = (char)x;
        }
        struct index_shard e = {.split = SPLIT_TRAIN, .tokens = 100, .documents = 1, .bytes = NODE_SHARD_BYTES};
        snprintf(e.file, sizeof e.file, "shard-%05d.h5", i);
        snprintf(path, sizeof path, "%s/%s", node_cold, e.file);
        FILE *f = fopen(path, "wb");
        EXPECT(f && fwrite(buf, 1, NODE_SHARD_BYTES, f) == NODE_SHARD_BYTES && fclose(f) == 0, "write %s", path);
        EXPECT(checksum_file(path, e.checksum, &err) == STATUS_OK, "%s", err.msg);
        index_add_shard(&node_ix, &e);
        node_ix.total_tokens += 100;
    }
    free(buf);
    node_ix.num_shards = node_ix.n_shards;
    snprintf(path, sizeof path, "%s/index.ini", node_cold);
    EXPECT(index_write(path, &node_ix, &err) == STATUS_OK, "%s", err.msg);
}

// One node's stager (in a forked process): stages every shard until each
// has a published copy, 20 s at most. Exit 0, or 1 when a shard failed or
// stayed unpublished.
static int node_main(const char *cache_dir, const char *log) {
    char pidfile[700];
    snprintf(pidfile, sizeof pidfile, "%s.pid", log);
    FILE *pf = fopen(pidfile, "w");
    if (pf) fprintf(pf, "%d\n", (int)getpid()), fclose(pf);
    struct cache *c = NULL;
    struct error err = {0};
    if (cache_open(cache_dir, node_cold, &node_ix, (int64_t)1 << 30, NODE_SHARDS, true, &c, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int all[NODE_SHARDS];
    for (int i = 0; i < NODE_SHARDS; i++) all[i] = i;
    cache_want(c, all, NODE_SHARDS);
    bool done = false;
    int64_t staged = 0, evicted, failed = 0;
    for (int k = 0; k < 10000 && !done && !failed; k++) {
        done = true;
        for (int i = 0; i < NODE_SHARDS && done; i++) {
            char path[8400];
            done = cache_acquire(c, i, path, sizeof path);
            if (done) cache_release(c, i);
        }
        if (!done) cache_sleep_ms(2);
        cache_counts(c, &staged, &evicted, &failed);
    }
    cache_close(c);
    return done && !failed ? 0 : 1;
}

// Forks a node: HOST as its name, its stderr to log; in a pid namespace of
// its own when the kernel allows (then the node's stager is pid 1). Returns
// the child's pid.
static pid_t start_node(const char *host, const char *cache_dir, const char *log) {
    pid_t p = fork();
    if (p) return p;
    setenv("TRIDENT_TEST_HOST", host, 1);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, 2) < 0) _exit(3);
    close(fd);
    if (unshare(CLONE_NEWPID) == 0) {
        pid_t q = fork();
        if (q == 0) _exit(node_main(cache_dir, log));
        int st = 0;
        if (q < 0 || waitpid(q, &st, 0) != q) _exit(4);
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 5);
    }
    _exit(node_main(cache_dir, log));
}

static long file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) ? -1 : (long)st.st_size;
}

static void test_two_nodes(void) {
    make_node_dataset();
    char cache_dir[512], log[2][600], path[1400], src[1400];
    int bad_rounds = 0, pid_ns = 0;
    for (int r = 0; r < ROUNDS; r++) {
        snprintf(cache_dir, sizeof cache_dir, "%s/cache-two-%02d", root, r);
        pid_t kids[2];
        for (int n = 0; n < 2; n++) {
            snprintf(log[n], sizeof log[n], "%s/node%d-%02d.log", root, n, r);
            kids[n] = start_node(n ? "node-b.cluster" : "node-a.cluster", cache_dir, log[n]);
        }
        bool ok = true;
        for (int n = 0; n < 2; n++) {
            int st = 0;
            EXPECT(waitpid(kids[n], &st, 0) == kids[n] && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                   "round %d: node %d exited with status %d", r, n, st);
            ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
            snprintf(path, sizeof path, "%s.pid", log[n]);
            FILE *pf = fopen(path, "r");
            int pid = 0;
            if (pf && fscanf(pf, "%d", &pid) == 1 && pid == 1) pid_ns++;
            if (pf) fclose(pf);
            long errs = file_bytes(log[n]);
            if (errs != 0) {
                FILE *f = fopen(log[n], "r");
                char line[1024] = "";
                if (f && !fgets(line, sizeof line, f)) line[0] = '\0';
                if (f) fclose(f);
                EXPECT(errs == 0, "round %d: node %d wrote errors: %s", r, n, line);
                ok = false;
            }
        }
        // The folder: one published copy per shard, equal to its source, and
        // nothing else (no temporary file).
        DIR *d = opendir(cache_dir);
        struct dirent *e;
        char sub[1000] = "";
        while (d && (e = readdir(d)))
            if (e->d_name[0] != '.') snprintf(sub, sizeof sub, "%s/%s", cache_dir, e->d_name);
        if (d) closedir(d);
        int published[NODE_SHARDS] = {0}, others = 0;
        d = opendir(sub);
        EXPECT(d != NULL, "round %d: no cache folder in %s", r, cache_dir);
        while (d && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            int i = -1;
            if (e->d_name[0] != '.' && sscanf(e->d_name, "shard-%05d.", &i) == 1 && i >= 0 && i < NODE_SHARDS) {
                published[i]++;
                snprintf(path, sizeof path, "%s/%s", sub, e->d_name);
                snprintf(src, sizeof src, "%s/shard-%05d.h5", node_cold, i);
                char a[64], b[64];
                struct error err = {0};
                bool same = checksum_file(path, a, &err) == STATUS_OK && checksum_file(src, b, &err) == STATUS_OK &&
                            !strcmp(a, b) && !strcmp(a, node_ix.shards[i].checksum) &&
                            file_bytes(path) == NODE_SHARD_BYTES;
                EXPECT(same, "round %d: published %s is not its source (incomplete or wrong)", r, e->d_name);
                ok = ok && same;
            } else {
                others++;
                EXPECT(false, "round %d: %s left in the cache folder", r, e->d_name);
                ok = false;
            }
        }
        if (d) closedir(d);
        for (int i = 0; i < NODE_SHARDS; i++) {
            EXPECT(published[i] == 1, "round %d: shard %d has %d published copies", r, i, published[i]);
            ok = ok && published[i] == 1;
        }
        (void)others;
        if (!ok) bad_rounds++;
        sh("rm -rf '%s'", cache_dir);
    }
    printf("two nodes, %d rounds (%d of %d node processes were pid 1 in a pid namespace of their own%s): "
           "%d rounds bad\n", ROUNDS, pid_ns, 2 * ROUNDS, pid_ns ? "" : "; no pid namespaces here, so the pids differ",
           bad_rounds);
}

// ---- cleanup of temporary files -------------------------------------------

static void plant(const char *dir, const char *name, bool old) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    EXPECT(f && fputs("half a copy", f) >= 0 && fclose(f) == 0, "plant %s", path);
    if (old) {
        struct timespec t[2] = {{time(NULL) - CACHE_TEMP_ABANDON_S - 60, 0}, {time(NULL) - CACHE_TEMP_ABANDON_S - 60, 0}};
        EXPECT(utimensat(AT_FDCWD, path, t, 0) == 0, "utimensat %s", path);
    }
}

static bool exists_in(const char *dir, const char *name) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void test_cleanup(void) {
    char cache_dir[512], sub[800], host[80], names[5][400];
    snprintf(cache_dir, sizeof cache_dir, "%s/cache-clean", root);
    struct cache *c = NULL;
    struct error err = {0};
    EXPECT(cache_open(cache_dir, node_cold, &node_ix, 1 << 20, 1, false, &c, &err) == STATUS_OK, "%s", err.msg);
    cache_close(c);
    char sum[64];
    snprintf(sub, sizeof sub, "%s/index.ini", node_cold);
    EXPECT(checksum_file(sub, sum, &err) == STATUS_OK, "%s", err.msg);
    snprintf(sub, sizeof sub, "%s/%s", cache_dir, strchr(sum, ':') + 1);
    unsetenv("TRIDENT_TEST_HOST");
    cache_node_name(host, sizeof host);
    const char *stem = ".shard-00000.0123456789abcdef.h5";
    snprintf(names[0], sizeof names[0], "%s~%s~999999999~00000000000000aa.tmp", stem, host);      // abandoned
    snprintf(names[1], sizeof names[1], "%s~other-node~999999999~00000000000000bb.tmp", stem);    // another node's
    snprintf(names[2], sizeof names[2], "%s~%s~%d~00000000000000cc.tmp", stem, host, (int)getppid()); // live pid
    snprintf(names[3], sizeof names[3], "%s~%s~999999998~00000000000000dd.tmp", stem, host);      // recent
    snprintf(names[4], sizeof names[4], ".shard-00000.h5.999999999.tmp");                         // other form
    for (int k = 0; k < 5; k++) plant(sub, names[k], k != 3);
    c = NULL;
    EXPECT(cache_open(cache_dir, node_cold, &node_ix, 1 << 20, 1, true, &c, &err) == STATUS_OK, "%s", err.msg);
    cache_close(c);
    EXPECT(!exists_in(sub, names[0]), "this node's abandoned temporary file %s was not removed", names[0]);
    for (int k = 1; k < 5; k++) EXPECT(exists_in(sub, names[k]), "%s was removed (not provably abandoned)", names[k]);
}

int main(void) {
    // Before anything reads it (once per process): every stager copy stalls.
    setenv("TRIDENT_DATA_FAULT", "stage_stall_ms:15", 1);
    unsetenv("TRIDENT_TEST_HOST");
    snprintf(root, sizeof root, "/tmp/trident_test_cache_%d", (int)getpid());
    sh("rm -rf '%s'", root);
    EXPECT(mkdir(root, 0755) == 0, "mkdir %s", root);
    test_stale_source();
    test_two_nodes();
    test_cleanup();
    index_free(&node_ix);
    if (!test_failures) sh("rm -rf '%s'", root);
    return test_finish("test_cache");
}

// dataset.c: open a dataset folder in O(shards) and validate each shard on
// its first read, before any of its tokens are served (docs/design.md §6, §8:
// bad data is refused before it is trained on).
#include "dataset.h"

#include "base/checksum.h"
#include "cache.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

// Tokens per read while scanning ids against the vocabulary.
#define DATASET_SCAN_TOKENS (1 << 20)

// The cheap check of dataset_open: shard i's file at path exists with the
// size index.ini records.
static enum status check_shard_file(struct dataset *ds, int i, const char *path, struct error *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: shard listed in %s/index.ini as [shard-%05d] is missing",
                         path, ds->dir, i);
    if ((uint64_t)st.st_size != ds->shards[i].entry.bytes)
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: file is %" PRIu64 " bytes, index.ini says %" PRIu64 " (truncated or replaced?)", path,
                         (uint64_t)st.st_size, ds->shards[i].entry.bytes);
    return STATUS_OK;
}

// Checks the open shard i (sh->h5, read from path) against its index entry
// and the dataset attributes: always the header; on its first read in this
// process (!sh->validated) also /doc_offsets, every token id and every
// /loss_mask entry (0 or 1) when the shard has one.
static enum status validate_shard(struct dataset *ds, int i, const char *path, struct error *err) {
    const struct index *ix = &ds->index;
    struct dataset_shard *sh = &ds->shards[i];
    const struct index_shard *e = &sh->entry;
    enum status s;
    const struct shard_meta *m = &sh->h5.meta;
    if (m->format_version != SHARD_FORMAT_VERSION)
        return error_set(err, STATUS_BAD_INPUT, "%s: format_version %" PRId64 ", this trident reads version %d", path,
                         m->format_version, SHARD_FORMAT_VERSION);
    if (sh->h5.elem_bytes == 2 && m->vocab_size > 65536)
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: /tokens is stored as uint16 but vocab_size is %" PRId64 " (> 65536 needs uint32)", path,
                         m->vocab_size);
    if (m->vocab_size != ix->vocab_size || m->eot_id != ix->eot_id || strcmp(m->tokenizer, ix->tokenizer))
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: attributes vocab_size=%" PRId64 " eot_id=%" PRId64 " tokenizer=%s disagree with index.ini "
                         "(vocab_size=%" PRId64 " eot_id=%" PRId64 " tokenizer=%s)",
                         path, m->vocab_size, m->eot_id, m->tokenizer, ix->vocab_size, ix->eot_id, ix->tokenizer);
    if (sh->h5.n_tokens != e->tokens || sh->h5.n_docs != e->documents)
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: holds %" PRIu64 " tokens in %" PRIu64 " documents, index.ini says %" PRIu64 " in %" PRIu64,
                         path, sh->h5.n_tokens, sh->h5.n_docs, e->tokens, e->documents);
    if (sh->h5.n_tokens == 0 || sh->h5.n_docs == 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: shard is empty (%" PRIu64 " tokens, %" PRIu64 " documents)", path,
                         sh->h5.n_tokens, sh->h5.n_docs);
    if (sh->validated) return STATUS_OK;
    // n_docs + 1 entries are stored in the file (shard_open checked the
    // bytes), so this cannot wrap; checked anyway, in 64 bits (issue 18: a
    // sparse 2^61-entry /doc_offsets wrapped it to 0).
    size_t offsets_bytes;
    if (__builtin_mul_overflow(sh->h5.n_docs + 1, sizeof(uint64_t), &offsets_bytes))
        return error_set(err, STATUS_BAD_INPUT, "%s: %" PRIu64 " documents: too many", path, sh->h5.n_docs);
    uint64_t *offsets = xmalloc(offsets_bytes);
    s = shard_read_doc_offsets(&sh->h5, offsets, err);
    for (uint64_t d = 0; !s && d <= sh->h5.n_docs; d++) {
        if ((d == 0 && offsets[0] != 0) || (d > 0 && offsets[d] < offsets[d - 1]) || offsets[d] > sh->h5.n_tokens)
            s = error_set(err, STATUS_BAD_INPUT,
                          "%s: /doc_offsets[%" PRIu64 "] = %" PRIu64 " breaks the rule 0 = first <= ... <= last = "
                          "%" PRIu64 " tokens",
                          path, d, offsets[d], sh->h5.n_tokens);
    }
    if (!s && offsets[sh->h5.n_docs] != sh->h5.n_tokens)
        s = error_set(err, STATUS_BAD_INPUT, "%s: /doc_offsets ends at %" PRIu64 ", expected the token count %" PRIu64,
                      path, offsets[sh->h5.n_docs], sh->h5.n_tokens);
    free(offsets);
    if (s) return s;
    uint64_t chunk = MIN((uint64_t)DATASET_SCAN_TOKENS, sh->h5.n_tokens);
    int32_t *ids = xmalloc(chunk * sizeof *ids);
    void *buf = xmalloc(chunk * 4);
    hsize_t dims[1] = {chunk};
    hid_t memspace = H5Screate_simple(1, dims, NULL);
    for (uint64_t at = 0; !s && at < sh->h5.n_tokens; at += chunk) {
        uint64_t n = MIN(chunk, sh->h5.n_tokens - at);
        if ((s = shard_read_tokens(&sh->h5, at, n, ids, buf, memspace, err))) break;
        for (uint64_t k = 0; k < n; k++)
            if (ids[k] < 0 || ids[k] >= ix->vocab_size) {
                s = error_set(err, STATUS_BAD_INPUT,
                              "%s: token id %" PRIu64 " at offset %" PRIu64 " of /tokens is >= vocab_size %" PRId64,
                              path, ids[k] < 0 ? (uint64_t)UINT32_MAX : (uint64_t)ids[k], at + k, ix->vocab_size);
                break;
            }
        if (s || sh->h5.loss_mask < 0) continue;
        uint8_t *mask = buf; // chunk * 4 bytes >= chunk
        if ((s = shard_read_mask(&sh->h5, at, n, mask, memspace, err))) break;
        for (uint64_t k = 0; k < n; k++)
            if (mask[k] > 1) {
                s = error_set(err, STATUS_BAD_INPUT, "%s: /loss_mask[%" PRIu64 "] = %d, expected 0 or 1", path, at + k,
                              mask[k]);
                break;
            }
    }
    H5Sclose(memspace);
    free(buf);
    free(ids);
    if (!s) sh->validated = true;
    return s;
}

// Checks the [dataset] section against the caller's expectations.
static enum status validate_index(struct dataset *ds, const char *ipath, int vocab_size_expected,
                                  const char *tokenizer_expected, struct error *err) {
    const struct index *ix = &ds->index;
    if (ix->format_version != SHARD_FORMAT_VERSION)
        return error_set(err, STATUS_BAD_INPUT, "%s: format_version %" PRId64 ", this trident reads version %d", ipath,
                         ix->format_version, SHARD_FORMAT_VERSION);
    if (vocab_size_expected > 0 && ix->vocab_size != vocab_size_expected)
        return error_set(err, STATUS_BAD_INPUT, "%s: vocab_size %" PRId64 " but the model expects %d", ipath,
                         ix->vocab_size, vocab_size_expected);
    if (tokenizer_expected && strcmp(ix->tokenizer, tokenizer_expected))
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: tokenizer '%s' but the run's tokenizer is '%s' (data made with another tokenizer)",
                         ipath, ix->tokenizer, tokenizer_expected);
    if (ix->vocab_size <= 0 || ix->eot_id < 0 || ix->eot_id >= ix->vocab_size)
        return error_set(err, STATUS_BAD_INPUT, "%s: vocab_size %" PRId64 " and eot_id %" PRId64 " are inconsistent",
                         ipath, ix->vocab_size, ix->eot_id);
    if (ix->n_shards == 0) return error_set(err, STATUS_BAD_INPUT, "%s: dataset lists no shards (empty dataset)", ipath);
    return STATUS_OK;
}

enum status dataset_open(const char *dir, int seq_len, int vocab_size_expected, const char *tokenizer_expected,
                         struct dataset **out, struct error *err) {
    *out = NULL;
    if (seq_len < 1) return error_set(err, STATUS_BAD_INPUT, "seq_len = %d, expected >= 1", seq_len);
    struct dataset *ds = xcalloc(1, sizeof *ds);
    snprintf(ds->dir, sizeof ds->dir, "%s", dir);
    ds->seq_len = seq_len;
    char ipath[4200];
    snprintf(ipath, sizeof ipath, "%s/index.ini", dir);
    enum status s = index_read(ipath, &ds->index, err);
    if (s) {
        free(ds);
        return s;
    }
    if ((s = validate_index(ds, ipath, vocab_size_expected, tokenizer_expected, err))) goto fail;
    ds->n_shards = ds->index.n_shards;
    ds->shards = xcalloc((size_t)ds->n_shards, sizeof *ds->shards);
    for (int i = 0; i < ds->n_shards; i++) {
        ds->shards[i].entry = ds->index.shards[i];
        shard_init(&ds->shards[i].h5);
    }
    uint64_t total = 0;
    for (int i = 0; i < ds->n_shards && !s; i++) {
        char path[8400];
        snprintf(path, sizeof path, "%s/%s", dir, ds->shards[i].entry.file);
        if ((s = check_shard_file(ds, i, path, err))) break;
        enum split sp = ds->shards[i].entry.split;
        ds->shards[i].start = ds->split_tokens[sp];
        ds->split_tokens[sp] += ds->shards[i].entry.tokens;
        total += ds->shards[i].entry.tokens;
    }
    if (s) goto fail;
    for (int sp = 0; sp < SPLIT_COUNT; sp++) ds->split_shards[sp] = xmalloc((size_t)ds->n_shards * sizeof(int) + 1);
    for (int i = 0; i < ds->n_shards; i++) {
        enum split sp = ds->shards[i].entry.split;
        ds->split_shards[sp][ds->split_n[sp]++] = i;
    }
    if (total != ds->index.total_tokens) {
        s = error_set(err, STATUS_BAD_INPUT, "%s: total_tokens = %" PRIu64 " but the shards hold %" PRIu64, ipath,
                      ds->index.total_tokens, total);
        goto fail;
    }
    // Training needs a sequence; a validation split too short for one is
    // served as none (dataset_val_unusable says why).
    uint64_t n = ds->split_tokens[SPLIT_TRAIN];
    if (n < (uint64_t)seq_len + 1) {
        s = error_set(err, STATUS_BAD_INPUT,
                      "%s: the %s split holds %" PRIu64 " tokens, fewer than seq_len + 1 = %d: no sequence fits "
                      "(prepare more text%s, or train with a shorter seq_len)", ipath, split_name(SPLIT_TRAIN), n,
                      seq_len + 1, ds->split_tokens[SPLIT_VAL] > 0 ? " or a smaller --val-fraction" : "");
        goto fail;
    }
    for (int sp = 0; sp < SPLIT_COUNT; sp++) {
        n = ds->split_tokens[sp];
        ds->split_sequences[sp] = n > 0 ? (n - 1) / (uint64_t)seq_len : 0;
    }
    *out = ds;
    return STATUS_OK;
fail:
    dataset_close(ds);
    return s;
}

bool dataset_val_unusable(const struct dataset *ds, char *why, size_t n) {
    uint64_t tokens = ds->split_tokens[SPLIT_VAL];
    if (tokens == 0 || ds->split_sequences[SPLIT_VAL] > 0) return false;
    snprintf(why, n, "the %s split of %s holds %" PRIu64 " tokens, fewer than seq_len + 1 = %d: no sequence fits "
             "(re-run trident prep with a larger --val-fraction, or --val-fraction 0 for no validation split)",
             split_name(SPLIT_VAL), ds->dir, tokens, ds->seq_len + 1);
    return true;
}

void dataset_close(struct dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_shards; i++) shard_close(&ds->shards[i].h5);
    if (ds->cache) cache_close(ds->cache);
    for (int sp = 0; sp < SPLIT_COUNT; sp++) free(ds->split_shards[sp]);
    free(ds->shards);
    index_free(&ds->index);
    free(ds);
}

// ---- lazy validation and the tiers ------------------------------------------

// Closes the open shard read least recently (the LRU) other than keep.
static void close_lru(struct dataset *ds, int keep) {
    int lru = -1;
    for (int i = 0; i < ds->n_shards; i++)
        if (i != keep && ds->shards[i].h5.file >= 0 && (lru < 0 || ds->shards[i].last_use < ds->shards[lru].last_use))
            lru = i;
    if (lru < 0) return;
    shard_close(&ds->shards[lru].h5);
    if (ds->cache && ds->shards[lru].hot) cache_release(ds->cache, lru);
    ds->n_open--;
}

// One try at opening shard i from path: size, the checksum (cold tier, first
// read only: the stager verified a hot copy before publishing it), the HDF5
// header and validate_shard. On a cold tier a failure that is not bad data
// (the file is complete and its checksum matched, or the read itself failed)
// is STATUS_RUNTIME so the caller retries it.
static enum status open_try(struct dataset *ds, int i, const char *path, bool hot, struct error *err) {
    struct dataset_shard *sh = &ds->shards[i];
    enum status s;
    if (!hot) {
        int fault = cache_cold_fault(i);
        if (fault)
            return error_set(err, STATUS_RUNTIME, "%s: cold-tier read failed: %s", path, strerror(fault));
    }
    if ((s = check_shard_file(ds, i, path, err))) return s;
    if (!hot && !sh->validated) {
        char sum[64];
        if ((s = checksum_file(path, sum, err))) return STATUS_RUNTIME;
        if (strcmp(sum, sh->entry.checksum))
            return error_set(err, STATUS_BAD_INPUT,
                             "%s: checksum %s does not match index.ini's %s (file corrupt or changed)", path, sum,
                             sh->entry.checksum);
    }
    if ((s = shard_open(path, &sh->h5, err))) return s;
    if ((s = validate_shard(ds, i, path, err))) shard_close(&sh->h5);
    return s;
}

// A cold-tier access of shard i, retried: attempt(ds, i, ctx, err) up to
// CACHE_COLD_TRIES times while it fails with STATUS_RUNTIME (an I/O error:
// EIO, a vanished mount), waiting CACHE_COLD_BACKOFF_MS and then twice as
// long before each next try, each retry said on stderr. Another failure (bad
// data) is returned at once; the last I/O error becomes STATUS_RUNTIME naming
// the shard and the tier.
typedef enum status (*cold_attempt_fn)(struct dataset *ds, int i, void *ctx, struct error *err);
static enum status cold_retry(struct dataset *ds, int i, cold_attempt_fn attempt, void *ctx, struct error *err) {
    long backoff = CACHE_COLD_BACKOFF_MS;
    for (int try = 1;; try++) {
        enum status s = attempt(ds, i, ctx, err);
        if (s != STATUS_RUNTIME) return s;
        if (try == CACHE_COLD_TRIES) break;
        fprintf(stderr, "trident: shard %s, cold tier (%s): %s (try %d of %d, again in %ld ms)\n",
                ds->shards[i].entry.file, ds->dir, err->msg, try, CACHE_COLD_TRIES, backoff);
        cache_sleep_ms(backoff);
        backoff *= 2;
    }
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return error_set(err, STATUS_RUNTIME, "shard %s: the cold tier (%s) failed %d reads, giving up: %s",
                     ds->shards[i].entry.file, ds->dir, CACHE_COLD_TRIES, msg);
}

// cold_retry's attempts: open shard i from the cold tier (ctx: its path), and
// read tokens or loss-mask entries from it (ctx: struct cold_read).
static enum status cold_open(struct dataset *ds, int i, void *path, struct error *err) {
    return open_try(ds, i, path, false, err);
}

struct cold_read {
    struct shard *h5;
    uint64_t at, n;
    int32_t *out;    // tokens, or NULL
    uint8_t *mask;   // or /loss_mask entries
    void *buf;
    hid_t memspace;
};

static enum status cold_read(struct dataset *ds, int i, void *ctx, struct error *err) {
    const struct cold_read *r = ctx;
    int fault = cache_cold_fault(i);
    if (fault) return error_set(err, STATUS_RUNTIME, "%s", strerror(fault));
    return r->mask ? shard_read_mask(r->h5, r->at, r->n, r->mask, r->memspace, err)
                   : shard_read_tokens(r->h5, r->at, r->n, r->out, r->buf, r->memspace, err);
}

enum status dataset_shard_get(struct dataset *ds, int i, struct shard **out, struct error *err) {
    struct dataset_shard *sh = &ds->shards[i];
    sh->last_use = ++ds->clock;
    *out = &sh->h5;
    if (sh->h5.file >= 0 && (sh->hot || !ds->cache || !cache_published(ds->cache, i))) return STATUS_OK;
    if (sh->h5.file >= 0) { // open on the cold tier and staged since: move to the hot copy
        shard_close(&sh->h5);
        ds->n_open--;
    }
    if (ds->n_open >= DATASET_OPEN_MAX) close_lru(ds, i);
    char path[8400];
    enum status s = STATUS_RUNTIME;
    if (ds->cache && cache_acquire(ds->cache, i, path, sizeof path)) {
        s = open_try(ds, i, path, true, err);
        if (s == STATUS_OK) {
            sh->hot = true;
            ds->n_open++;
            return STATUS_OK;
        }
        // A hot copy that was evicted between the look and the open, or that
        // fails to read: the cold tier has the shard, and its full check
        // (checksum included) says whether the data itself is bad.
        cache_release(ds->cache, i);
    }
    snprintf(path, sizeof path, "%s/%s", ds->dir, sh->entry.file);
    s = cold_retry(ds, i, cold_open, path, err);
    if (s) return s;
    sh->hot = false;
    ds->n_open++;
    return STATUS_OK;
}

enum status dataset_read(struct dataset *ds, int i, uint64_t at, uint64_t n, int32_t *out, void *buf,
                         hid_t memspace, struct error *err) {
    struct shard *h5;
    enum status s = dataset_shard_get(ds, i, &h5, err);
    if (s || ds->shards[i].hot) return s ? s : shard_read_tokens(h5, at, n, out, buf, memspace, err);
    struct cold_read r = {h5, at, n, out, NULL, buf, memspace};
    return cold_retry(ds, i, cold_read, &r, err);
}

enum status dataset_read_mask(struct dataset *ds, int i, uint64_t at, uint64_t n, uint8_t *out, hid_t memspace,
                              struct error *err) {
    struct shard *h5;
    enum status s = dataset_shard_get(ds, i, &h5, err);
    if (s || ds->shards[i].hot) return s ? s : shard_read_mask(h5, at, n, out, memspace, err);
    struct cold_read r = {h5, at, n, NULL, out, NULL, memspace}; // as tokens: retried on the cold tier
    return cold_retry(ds, i, cold_read, &r, err);
}

enum status dataset_validate_all(struct dataset *ds, struct error *err) {
    for (int i = 0; i < ds->n_shards; i++) {
        struct shard *h5;
        enum status s = dataset_shard_get(ds, i, &h5, err);
        if (s) return s;
    }
    return STATUS_OK;
}

// dataset.c: open a dataset folder and validate every shard before training
// (docs/design.md §6, §8: bad data is found before the first step).
#include "dataset.h"

#include "base/checksum.h"

#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

// Tokens per read while scanning ids against the vocabulary.
#define DATASET_SCAN_TOKENS (1 << 20)

// Checks one shard against its index entry and the dataset attributes; scans
// every token id. buf/ids/memspace: (DATASET_SCAN_TOKENS,) scratch.
static enum status validate_shard(struct dataset *ds, int i, const char *path, void *buf, int32_t *ids,
                                  hid_t memspace, struct error *err) {
    const struct index *ix = &ds->index;
    struct dataset_shard *sh = &ds->shards[i];
    const struct index_shard *e = &sh->entry;
    struct stat st;
    if (stat(path, &st) != 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: shard listed in %s/index.ini as [shard-%05d] is missing",
                         path, ds->dir, i);
    if ((uint64_t)st.st_size != e->bytes)
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: file is %" PRIu64 " bytes, index.ini says %" PRIu64 " (truncated or replaced?)", path,
                         (uint64_t)st.st_size, e->bytes);
    char sum[64];
    enum status s;
    if ((s = checksum_file(path, sum, err))) return s;
    if (strcmp(sum, e->checksum))
        return error_set(err, STATUS_BAD_INPUT, "%s: checksum %s does not match index.ini's %s (file corrupt or changed)",
                         path, sum, e->checksum);
    if ((s = shard_open(path, &sh->h5, err))) return s;
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
    uint64_t *offsets = xmalloc((sh->h5.n_docs + 1) * sizeof *offsets);
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
    for (uint64_t at = 0; at < sh->h5.n_tokens; at += DATASET_SCAN_TOKENS) {
        uint64_t n = MIN((uint64_t)DATASET_SCAN_TOKENS, sh->h5.n_tokens - at);
        if ((s = shard_read_tokens(&sh->h5, at, n, ids, buf, memspace, err))) return s;
        for (uint64_t k = 0; k < n; k++)
            if (ids[k] < 0 || ids[k] >= ix->vocab_size)
                return error_set(err, STATUS_BAD_INPUT,
                                 "%s: token id %" PRIu64 " at offset %" PRIu64 " of /tokens is >= vocab_size %" PRId64,
                                 path, ids[k] < 0 ? (uint64_t)UINT32_MAX : (uint64_t)ids[k], at + k, ix->vocab_size);
    }
    return STATUS_OK;
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
        ds->shards[i].h5.file = ds->shards[i].h5.tokens = ds->shards[i].h5.file_space = H5I_INVALID_HID;
    }
    void *buf = xmalloc((size_t)DATASET_SCAN_TOKENS * 4);
    int32_t *ids = xmalloc((size_t)DATASET_SCAN_TOKENS * sizeof *ids);
    hsize_t dims[1] = {DATASET_SCAN_TOKENS};
    hid_t memspace = H5Screate_simple(1, dims, NULL);
    uint64_t total = 0;
    for (int i = 0; i < ds->n_shards && !s; i++) {
        char path[8400];
        snprintf(path, sizeof path, "%s/%s", dir, ds->shards[i].entry.file);
        s = validate_shard(ds, i, path, buf, ids, memspace, err);
        if (s) break;
        enum split sp = ds->shards[i].entry.split;
        ds->shards[i].start = ds->split_tokens[sp];
        ds->split_tokens[sp] += ds->shards[i].h5.n_tokens;
        ds->split_shards[sp] = realloc(ds->split_shards[sp], (size_t)(ds->split_n[sp] + 1) * sizeof(int));
        CHECK(ds->split_shards[sp], "out of memory");
        ds->split_shards[sp][ds->split_n[sp]++] = i;
        total += ds->shards[i].h5.n_tokens;
    }
    H5Sclose(memspace);
    free(buf);
    free(ids);
    if (s) goto fail;
    if (total != ds->index.total_tokens) {
        s = error_set(err, STATUS_BAD_INPUT, "%s: total_tokens = %" PRIu64 " but the shards hold %" PRIu64, ipath,
                      ds->index.total_tokens, total);
        goto fail;
    }
    for (int sp = 0; sp < SPLIT_COUNT; sp++) {
        uint64_t n = ds->split_tokens[sp];
        if ((sp == SPLIT_TRAIN || n > 0) && n < (uint64_t)seq_len + 1) {
            s = error_set(err, STATUS_BAD_INPUT,
                          "%s: the %s split holds %" PRIu64 " tokens, fewer than seq_len + 1 = %d: no sequence fits",
                          ipath, split_name(sp), n, seq_len + 1);
            goto fail;
        }
        ds->split_sequences[sp] = n > 0 ? (n - 1) / (uint64_t)seq_len : 0;
    }
    *out = ds;
    return STATUS_OK;
fail:
    dataset_close(ds);
    return s;
}

void dataset_close(struct dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_shards; i++) shard_close(&ds->shards[i].h5);
    for (int sp = 0; sp < SPLIT_COUNT; sp++) free(ds->split_shards[sp]);
    free(ds->shards);
    index_free(&ds->index);
    free(ds);
}

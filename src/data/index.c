// index.c: read and write a dataset's index.ini (inih).
#include "index.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

const char *split_name(enum split split) { return split == SPLIT_VAL ? "val" : "train"; }

void index_add_shard(struct index *index, const struct index_shard *shard) {
    index->shards = realloc(index->shards, (size_t)(index->n_shards + 1) * sizeof *index->shards);
    CHECK(index->shards, "out of memory growing the shard list");
    index->shards[index->n_shards++] = *shard;
}

void index_free(struct index *index) {
    free(index->shards);
    index->shards = NULL;
    index->n_shards = 0;
}

enum status index_write(const char *path, const struct index *index, struct error *err) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return error_set(err, STATUS_RUNTIME, "%s: cannot write: %s", tmp, strerror(errno));
    fprintf(f, "; trident dataset index (docs/formats.md)\n[dataset]\n");
    fprintf(f, "format_version = %" PRId64 "\ntokenizer = %s\nvocab_size = %" PRId64 "\n",
            index->format_version, index->tokenizer, index->vocab_size);
    fprintf(f, "eot_id = %" PRId64 "\nnum_shards = %d\ntotal_tokens = %" PRIu64 "\nsplits = %s\n",
            index->eot_id, index->n_shards, index->total_tokens, index->splits);
    if (index->chat_template[0]) fprintf(f, "chat_template = %s\n", index->chat_template);
    for (int i = 0; i < index->n_shards; i++) {
        const struct index_shard *s = &index->shards[i];
        fprintf(f, "\n[shard-%05d]\nfile = %s\nsplit = %s\ntokens = %" PRIu64 "\n", i, s->file,
                split_name(s->split), s->tokens);
        fprintf(f, "documents = %" PRIu64 "\nbytes = %" PRIu64 "\nchecksum = %s\n", s->documents,
                s->bytes, s->checksum);
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0)
        return error_set(err, STATUS_RUNTIME, "%s: write failed: %s", path, strerror(errno));
    return STATUS_OK;
}

struct index_parse {
    struct index *index;
    const char *path;
    struct error *err;
    int failed;
    int *seen; // (capacity,) which shard-NNNNN sections appeared
    int seen_cap;
    int64_t max_id; // a section [shard-N] takes > 8 bytes: N < file size / 8
};

static int parse_u64(const char *value, uint64_t *out) {
    char *end;
    errno = 0;
    if (!*value || *value == '-') return 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

static int parse_i64(const char *value, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (!*value || errno || *end) return 0;
    *out = v;
    return 1;
}

#define PARSE_FAIL(...)                                                        \
    do {                                                                       \
        if (!p->failed) error_set(p->err, STATUS_BAD_INPUT, __VA_ARGS__);      \
        p->failed = 1;                                                         \
        return 0;                                                              \
    } while (0)

static int index_handler(void *user, const char *section, const char *key, const char *value) {
    struct index_parse *p = user;
    struct index *ix = p->index;
    if (!strcmp(section, "dataset")) {
        uint64_t u;
        if (!strcmp(key, "tokenizer")) snprintf(ix->tokenizer, sizeof ix->tokenizer, "%s", value);
        else if (!strcmp(key, "splits")) snprintf(ix->splits, sizeof ix->splits, "%s", value);
        else if (!strcmp(key, "chat_template")) snprintf(ix->chat_template, sizeof ix->chat_template, "%s", value);
        else if (!strcmp(key, "format_version") && parse_i64(value, &ix->format_version)) {}
        else if (!strcmp(key, "vocab_size") && parse_i64(value, &ix->vocab_size)) {}
        else if (!strcmp(key, "eot_id") && parse_i64(value, &ix->eot_id)) {}
        else if (!strcmp(key, "num_shards") && parse_i64(value, &ix->num_shards)) {}
        else if (!strcmp(key, "total_tokens") && parse_u64(value, &u)) ix->total_tokens = u;
        else if (!strcmp(key, "format_version") || !strcmp(key, "vocab_size") || !strcmp(key, "eot_id") ||
                 !strcmp(key, "num_shards") || !strcmp(key, "total_tokens"))
            PARSE_FAIL("%s: [dataset] %s = '%s' is not an integer", p->path, key, value);
        // Unknown keys are allowed: later format versions may add some.
        return 1;
    }
    int id;
    char tail;
    if (sscanf(section, "shard-%d%c", &id, &tail) != 1 || id < 0 || id > 10000000)
        PARSE_FAIL("%s: unknown section [%s] (expected [dataset] or [shard-NNNNN])", p->path, section);
    // The shard table is sized by the largest id: bounded by the file's size,
    // so that one line [shard-9999999] cannot allocate gigabytes (issue 18).
    if (id > p->max_id)
        PARSE_FAIL("%s: section [%s]: a file of this size holds fewer shards (ids must run 0, 1, ...)", p->path,
                   section);
    if (id >= p->seen_cap) {
        int cap = MAX(id + 1, 2 * p->seen_cap);
        p->seen = realloc(p->seen, (size_t)cap * sizeof *p->seen);
        CHECK(p->seen, "out of memory");
        memset(p->seen + p->seen_cap, 0, (size_t)(cap - p->seen_cap) * sizeof *p->seen);
        p->seen_cap = cap;
    }
    if (id >= ix->n_shards) {
        ix->shards = realloc(ix->shards, (size_t)(id + 1) * sizeof *ix->shards);
        CHECK(ix->shards, "out of memory");
        memset(ix->shards + ix->n_shards, 0, (size_t)(id + 1 - ix->n_shards) * sizeof *ix->shards);
        for (int i = ix->n_shards; i <= id; i++) ix->shards[i].split = (enum split) - 1;
        ix->n_shards = id + 1;
    }
    p->seen[id] = 1;
    struct index_shard *s = &ix->shards[id];
    if (!strcmp(key, "file")) {
        if (!*value || strchr(value, '/'))
            PARSE_FAIL("%s: [%s] file = '%s': expected a file name inside the dataset folder", p->path, section, value);
        snprintf(s->file, sizeof s->file, "%s", value);
    } else if (!strcmp(key, "split")) {
        if (!strcmp(value, "train")) s->split = SPLIT_TRAIN;
        else if (!strcmp(value, "val")) s->split = SPLIT_VAL;
        else PARSE_FAIL("%s: [%s] split = '%s', expected train or val", p->path, section, value);
    } else if (!strcmp(key, "tokens")) {
        if (!parse_u64(value, &s->tokens))
            PARSE_FAIL("%s: [%s] tokens = '%s' is not a count", p->path, section, value);
    } else if (!strcmp(key, "documents")) {
        if (!parse_u64(value, &s->documents))
            PARSE_FAIL("%s: [%s] documents = '%s' is not a count", p->path, section, value);
    } else if (!strcmp(key, "bytes")) {
        if (!parse_u64(value, &s->bytes))
            PARSE_FAIL("%s: [%s] bytes = '%s' is not a count", p->path, section, value);
    } else if (!strcmp(key, "checksum")) {
        snprintf(s->checksum, sizeof s->checksum, "%s", value);
    }
    return 1;
}

// qsort of pointers to shard entries by file name (index_read's duplicate check).
static int cmp_shard_file(const void *a, const void *b) {
    return strcmp((*(const struct index_shard *const *)a)->file, (*(const struct index_shard *const *)b)->file);
}

enum status index_read(const char *path, struct index *ix, struct error *err) {
    memset(ix, 0, sizeof *ix);
    ix->format_version = ix->vocab_size = ix->eot_id = ix->num_shards = -1;
    struct index_parse p = {.index = ix, .path = path, .err = err};
    FILE *f = fopen(path, "r");
    if (!f) return error_set(err, STATUS_BAD_INPUT, "%s: cannot open dataset index: %s", path, strerror(errno));
    struct stat fs;
    p.max_id = fstat(fileno(f), &fs) == 0 ? fs.st_size / 8 : 0;
    int line = ini_parse_file(f, index_handler, &p);
    fclose(f);
    enum status st = STATUS_OK;
    if (p.failed) st = STATUS_BAD_INPUT;
    else if (line != 0) st = error_set(err, STATUS_BAD_INPUT, "%s:%d: INI syntax error", path, line);
    else if (ix->format_version < 0 || ix->vocab_size < 0 || ix->eot_id < 0 || ix->num_shards < 0 || !ix->tokenizer[0])
        st = error_set(err, STATUS_BAD_INPUT,
                       "%s: [dataset] needs format_version, tokenizer, vocab_size, eot_id and num_shards", path);
    else if (ix->num_shards != ix->n_shards)
        st = error_set(err, STATUS_BAD_INPUT, "%s: [dataset] num_shards = %" PRId64 " but shard sections run to [shard-%05d]",
                       path, ix->num_shards, ix->n_shards - 1);
    for (int i = 0; !st && i < ix->n_shards; i++) {
        const struct index_shard *s = &ix->shards[i];
        if (i >= p.seen_cap || !p.seen[i])
            st = error_set(err, STATUS_BAD_INPUT, "%s: section [shard-%05d] is missing", path, i);
        else if (!s->file[0] || (int)s->split < 0 || !s->checksum[0])
            st = error_set(err, STATUS_BAD_INPUT, "%s: [shard-%05d] needs file, split, tokens, documents, bytes, checksum", path, i);
    }
    // One file listed twice would be read, and counted, twice (issue 18).
    if (!st && ix->n_shards > 1) {
        const struct index_shard **order = xmalloc((size_t)ix->n_shards * sizeof *order);
        for (int i = 0; i < ix->n_shards; i++) order[i] = &ix->shards[i];
        qsort(order, (size_t)ix->n_shards, sizeof *order, cmp_shard_file);
        for (int i = 1; !st && i < ix->n_shards; i++)
            if (!strcmp(order[i]->file, order[i - 1]->file)) {
                int a = (int)(order[i - 1] - ix->shards), b = (int)(order[i] - ix->shards);
                st = error_set(err, STATUS_BAD_INPUT, "%s: [shard-%05d] and [shard-%05d] both name file %s", path,
                               MIN(a, b), MAX(a, b), order[i]->file);
            }
        free(order);
    }
    free(p.seen);
    if (st) index_free(ix);
    return st;
}

// prep.c: `trident prep`: read documents, train or load a tokenizer, encode on
// all cores, write shards and index.ini (layout: docs/formats.md).
#include "prep.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset.h"
#include "tokenizer/tokenizer.h"

// Documents encoded per parallel block: enough work for every core, while
// the ids of one block stay small next to the corpus.
#define PREP_BLOCK_DOCS 2048

struct corpus_builder {
    struct corpus c;
    size_t len, cap, docs_cap;
};

static void corpus_add(struct corpus_builder *b, const char *text, size_t len) {
    if (len == 0) return;
    if (b->len + len > b->cap) {
        b->cap = MAX(2 * b->cap, b->len + len + (1 << 16));
        b->c.text = realloc(b->c.text, b->cap);
        CHECK(b->c.text, "out of memory reading the corpus (%zu bytes)", b->cap);
    }
    if (b->c.n_docs + 2 > b->docs_cap) {
        b->docs_cap = MAX(2 * b->docs_cap, 1024);
        b->c.offsets = realloc(b->c.offsets, b->docs_cap * sizeof *b->c.offsets);
        CHECK(b->c.offsets, "out of memory");
    }
    memcpy(b->c.text + b->len, text, len);
    b->c.offsets[b->c.n_docs] = b->len;
    b->len += len;
    b->c.offsets[++b->c.n_docs] = b->len;
}

static int line_is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

// Plain text: a document is a run of non-blank lines, kept with its inner
// newlines and without the final one.
static void split_text(struct corpus_builder *b, const char *s, size_t n) {
    size_t doc_start = 0, doc_end = 0;
    int in_doc = 0;
    for (size_t at = 0; at < n;) {
        const char *nl = memchr(s + at, '\n', n - at);
        size_t end = nl ? (size_t)(nl - s) : n;
        if (line_is_blank(s + at, end - at)) {
            if (in_doc) corpus_add(b, s + doc_start, doc_end - doc_start);
            in_doc = 0;
        } else {
            if (!in_doc) doc_start = at;
            in_doc = 1;
            doc_end = end > at && s[end - 1] == '\r' ? end - 1 : end;
        }
        at = end + 1;
    }
    if (in_doc) corpus_add(b, s + doc_start, doc_end - doc_start);
}

static enum status split_jsonl(struct corpus_builder *b, const char *path, const char *s, size_t n,
                               struct error *err) {
    size_t line = 0;
    for (size_t at = 0; at < n;) {
        const char *nl = memchr(s + at, '\n', n - at);
        size_t end = nl ? (size_t)(nl - s) : n;
        line++;
        if (!line_is_blank(s + at, end - at)) {
            json_error_t jerr;
            json_t *obj = json_loadb(s + at, end - at, 0, &jerr);
            if (!obj) return error_set(err, STATUS_BAD_INPUT, "%s:%zu: not JSON: %s", path, line, jerr.text);
            json_t *text = json_is_object(obj) ? json_object_get(obj, "text") : NULL;
            if (!json_is_string(text)) {
                json_decref(obj);
                return error_set(err, STATUS_BAD_INPUT, "%s:%zu: expected an object with a string field \"text\"",
                                 path, line);
            }
            corpus_add(b, json_string_value(text), json_string_length(text));
            json_decref(obj);
        }
        at = end + 1;
    }
    return STATUS_OK;
}

static enum status read_file(const char *path, char **out, size_t *len, struct error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return error_set(err, STATUS_BAD_INPUT, "%s: cannot open input: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0, got;
    char *buf = xmalloc(cap);
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            CHECK(buf, "out of memory reading %s", path);
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return error_set(err, STATUS_BAD_INPUT, "%s: read error", path);
    }
    *out = buf;
    *len = n;
    return STATUS_OK;
}

static enum status read_one(struct corpus_builder *b, const char *path, enum prep_format format, struct error *err) {
    char *s;
    size_t n;
    enum status st = read_file(path, &s, &n, err);
    if (st) return st;
    if (format == PREP_FORMAT_JSONL) st = split_jsonl(b, path, s, n, err);
    else split_text(b, s, n);
    free(s);
    return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

enum status corpus_read(const char *const *inputs, int n_inputs, enum prep_format format, struct corpus *out,
                        struct error *err) {
    struct corpus_builder b = {0};
    enum status st = STATUS_OK;
    for (int i = 0; i < n_inputs && !st; i++) {
        struct stat sb;
        if (stat(inputs[i], &sb) != 0) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: input not found: %s", inputs[i], strerror(errno));
        } else if (S_ISDIR(sb.st_mode)) {
            // A folder: its regular files (not hidden), in name order.
            DIR *d = opendir(inputs[i]);
            if (!d) {
                st = error_set(err, STATUS_BAD_INPUT, "%s: cannot list folder: %s", inputs[i], strerror(errno));
                break;
            }
            char **names = NULL;
            size_t n = 0;
            struct dirent *e;
            while ((e = readdir(d))) {
                if (e->d_name[0] == '.') continue;
                char *p = xmalloc(strlen(inputs[i]) + strlen(e->d_name) + 2);
                sprintf(p, "%s/%s", inputs[i], e->d_name);
                struct stat fs;
                if (stat(p, &fs) != 0 || !S_ISREG(fs.st_mode)) {
                    free(p);
                    continue;
                }
                names = realloc(names, (n + 1) * sizeof *names);
                CHECK(names, "out of memory");
                names[n++] = p;
            }
            closedir(d);
            qsort(names, n, sizeof *names, cmp_str);
            for (size_t k = 0; k < n; k++) {
                if (!st) st = read_one(&b, names[k], format, err);
                free(names[k]);
            }
            free(names);
        } else {
            st = read_one(&b, inputs[i], format, err);
        }
    }
    if (!st && b.c.n_docs == 0)
        st = error_set(err, STATUS_BAD_INPUT, "%s%s: no documents found in the input", inputs[0],
                       n_inputs > 1 ? " ..." : "");
    if (st) {
        corpus_free(&b.c);
        return st;
    }
    if (!b.c.offsets) b.c.offsets = xcalloc(1, sizeof *b.c.offsets);
    *out = b.c;
    return STATUS_OK;
}

void corpus_free(struct corpus *c) {
    free(c->text);
    free(c->offsets);
    memset(c, 0, sizeof *c);
}

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Marks round(f * n) documents as validation (at least 1 when f > 0 and
// n >= 2, at most n - 1): the first ones of a seeded Fisher-Yates shuffle.
static unsigned char *choose_val(size_t n, double f, uint64_t seed) {
    unsigned char *is_val = xcalloc(n, 1);
    size_t k = (size_t)(f * (double)n + 0.5);
    if (f > 0 && k == 0 && n >= 2) k = 1;
    if (k >= n) k = n - 1;
    size_t *perm = xmalloc(n * sizeof *perm);
    for (size_t i = 0; i < n; i++) perm[i] = i;
    uint64_t rng = seed;
    for (size_t i = 0; i < k; i++) {
        size_t j = i + (size_t)(splitmix64(&rng) % (uint64_t)(n - i));
        size_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        is_val[perm[i]] = 1;
    }
    free(perm);
    return is_val;
}

// Tokens of one split waiting to become a shard.
struct pending {
    int32_t *tokens;
    uint64_t n, cap;
    uint64_t *offsets; // (docs + 1,)
    uint64_t docs, docs_cap;
};

static void pending_add(struct pending *p, const int32_t *ids, size_t n, int32_t eot) {
    if (p->n + n + 1 > p->cap) {
        p->cap = MAX(2 * p->cap, p->n + n + 1 + (1 << 16));
        p->tokens = realloc(p->tokens, p->cap * sizeof *p->tokens);
        CHECK(p->tokens, "out of memory");
    }
    if (p->docs + 2 > p->docs_cap) {
        p->docs_cap = MAX(2 * p->docs_cap, 1024);
        p->offsets = realloc(p->offsets, p->docs_cap * sizeof *p->offsets);
        CHECK(p->offsets, "out of memory");
    }
    memcpy(p->tokens + p->n, ids, n * sizeof *ids);
    p->n += n;
    p->tokens[p->n++] = eot;
    p->offsets[0] = 0;
    p->offsets[++p->docs] = p->n;
}

static enum status pending_flush(struct pending *p, struct dataset_writer *w, enum split split,
                                 struct prep_stats *stats, struct error *err) {
    if (p->docs == 0) return STATUS_OK;
    enum status st = dataset_writer_add(w, split, p->tokens, p->n, p->offsets, p->docs, err);
    stats->shards++;
    p->n = p->docs = 0;
    return st;
}

static enum status copy_file(const char *from, const char *to, struct error *err) {
    char *s;
    size_t n;
    enum status st = read_file(from, &s, &n, err);
    if (st) return st;
    FILE *f = fopen(to, "wb");
    int ok = f && fwrite(s, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    free(s);
    if (!ok) return error_set(err, STATUS_RUNTIME, "%s: cannot write: %s", to, strerror(errno));
    return STATUS_OK;
}

// Loads or trains the tokenizer; DIR/tokenizer.json holds it afterwards.
static enum status prep_tokenizer(const struct prep_options *opt, const struct corpus *c, struct tokenizer **tok,
                                  struct error *err) {
    char out[4200];
    snprintf(out, sizeof out, "%s/tokenizer.json", opt->output);
    enum status st;
    if (opt->vocab_size > 0) {
        const char **docs = xmalloc(c->n_docs * sizeof *docs);
        size_t *lens = xmalloc(c->n_docs * sizeof *lens);
        for (size_t d = 0; d < c->n_docs; d++) {
            docs[d] = c->text + c->offsets[d];
            lens[d] = c->offsets[d + 1] - c->offsets[d];
        }
        if (!opt->quiet) fprintf(stderr, "prep: training a BPE tokenizer of %d ids on %zu documents\n",
                                 opt->vocab_size, c->n_docs);
        st = tokenizer_train(docs, lens, c->n_docs, opt->vocab_size, out, err);
        free(docs);
        free(lens);
        if (st) return st;
        return tokenizer_load(out, tok, err);
    }
    if ((st = tokenizer_load(opt->tokenizer_path, tok, err))) return st;
    return copy_file(opt->tokenizer_path, out, err);
}

static void progress(const struct prep_stats *s, double t0, int last) {
    double dt = MAX(time_now_s() - t0, 1e-9);
    uint64_t docs = s->documents[0] + s->documents[1], toks = s->tokens[0] + s->tokens[1];
    int tty = isatty(2);
    if (!tty && !last) return;
    fprintf(stderr, "%sprep: %llu documents, %llu tokens, %.0f documents/s, %.0f tokens/s%s", tty ? "\r" : "",
            (unsigned long long)docs, (unsigned long long)toks, (double)docs / dt, (double)toks / dt,
            last ? "\n" : "");
}

enum status prep_run(const struct prep_options *opt, struct prep_stats *stats, struct error *err) {
    memset(stats, 0, sizeof *stats);
    char ipath[4200];
    snprintf(ipath, sizeof ipath, "%s/index.ini", opt->output);
    if (access(ipath, F_OK) == 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: already holds a dataset; remove it or choose another --output",
                         ipath);
    // Nothing of the user's is overwritten: the folder is new or empty.
    DIR *existing = opendir(opt->output);
    if (existing) {
        struct dirent *e;
        const char *found = NULL;
        while (!found && (e = readdir(existing)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) found = e->d_name;
        enum status st = found ? error_set(err, STATUS_BAD_INPUT, "%s: --output folder is not empty "
                                           "(it holds %s); choose a new or empty folder",
                                           opt->output, found) : STATUS_OK;
        closedir(existing);
        if (st) return st;
    }
    bool created = mkdir(opt->output, 0777) == 0;
    if (!created && errno != EEXIST)
        return error_set(err, STATUS_BAD_INPUT, "%s: cannot create output folder: %s", opt->output, strerror(errno));
    struct corpus c;
    enum status st = corpus_read(opt->inputs, opt->n_inputs, opt->format, &c, err);
    if (st) {
        if (created) rmdir(opt->output); // leave no empty folder behind
        return st;
    }
    struct tokenizer *tok = NULL;
    unsigned char *is_val = NULL;
    int32_t **ids = NULL;
    size_t *n_ids = NULL;
    struct pending pend[2] = {{0}};
    struct dataset_writer w;
    if ((st = prep_tokenizer(opt, &c, &tok, err))) goto done;
    int eot = tokenizer_eot_id(tok), vocab = tokenizer_vocab_size(tok);
    if (eot < 0) {
        st = error_set(err, STATUS_BAD_INPUT, "%s: tokenizer has no end-of-text token (<|endoftext|>, </s>, ...)",
                       opt->tokenizer_path ? opt->tokenizer_path : "tokenizer.json");
        goto done;
    }
    if ((st = dataset_writer_init(&w, opt->output, vocab, eot, tokenizer_identity(tok), err))) goto done;
    is_val = choose_val(c.n_docs, opt->val_fraction, opt->seed);
    ids = xcalloc(PREP_BLOCK_DOCS, sizeof *ids);
    n_ids = xcalloc(PREP_BLOCK_DOCS, sizeof *n_ids);
    double t0 = time_now_s(), last = t0;
    for (size_t b0 = 0; b0 < c.n_docs && !st; b0 += PREP_BLOCK_DOCS) {
        long nb = (long)MIN((size_t)PREP_BLOCK_DOCS, c.n_docs - b0);
        int failed = 0;
        // Encode in parallel; append below in document order, so the output
        // does not depend on the thread count.
#pragma omp parallel for schedule(dynamic, 4) reduction(| : failed)
        for (long k = 0; k < nb; k++) {
            size_t d = b0 + (size_t)k;
            struct error e;
            failed |= tokenizer_encode(tok, c.text + c.offsets[d], c.offsets[d + 1] - c.offsets[d], &ids[k],
                                       &n_ids[k], &e) != STATUS_OK;
        }
        if (failed) {
            st = error_set(err, STATUS_RUNTIME, "tokenizer_encode failed in documents %zu..%zu", b0, b0 + nb - 1);
            break;
        }
        for (long k = 0; k < nb; k++) {
            enum split sp = is_val[b0 + k] ? SPLIT_VAL : SPLIT_TRAIN;
            for (size_t i = 0; i < n_ids[k]; i++)
                CHECK(ids[k][i] >= 0 && ids[k][i] < vocab, "tokenizer gave id %d outside [0, %d)", ids[k][i], vocab);
            pending_add(&pend[sp], ids[k], n_ids[k], eot);
            stats->documents[sp]++;
            stats->tokens[sp] += n_ids[k] + 1;
            free(ids[k]);
            ids[k] = NULL;
            if (!st && pend[sp].n >= opt->shard_tokens) st = pending_flush(&pend[sp], &w, sp, stats, err);
        }
        if (!opt->quiet && time_now_s() - last > 0.5) {
            progress(stats, t0, 0);
            last = time_now_s();
        }
    }
    for (int sp = 0; sp < 2 && !st; sp++) st = pending_flush(&pend[sp], &w, sp, stats, err);
    if (!st) st = dataset_writer_finish(&w, err);
    else index_free(&w.index);
    stats->encode_seconds = time_now_s() - t0;
    if (!opt->quiet) progress(stats, t0, 1);
done:
    for (int sp = 0; sp < 2; sp++) free(pend[sp].tokens), free(pend[sp].offsets);
    for (int k = 0; ids && k < PREP_BLOCK_DOCS; k++) free(ids[k]);
    free(ids);
    free(n_ids);
    free(is_val);
    if (tok) tokenizer_free(tok);
    corpus_free(&c);
    if (st && created) rmdir(opt->output); // only when nothing was written into it
    return st;
}

// prep.c: `trident prep`: train or load a tokenizer, then stream the documents
// (prep_read.c) a block at a time, encode each block on all cores, and write
// shards in input order and index.ini (layout: docs/formats.md).
#include "prep.h"
#include "chat.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset.h"
#include "tokenizer/tokenizer.h"

// Documents encoded per parallel block, and the most text one block holds:
// enough work for every core, while a block stays small next to a shard.
#define PREP_BLOCK_DOCS 4096
#define PREP_BLOCK_BYTES (4u << 20)

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

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The number of validation documents: round(f * n), at least 1 when f > 0
// and n >= 2, at most n - 1.
static uint64_t val_count(uint64_t n, double f) {
    uint64_t k = (uint64_t)(f * (double)n + 0.5);
    if (f > 0 && k == 0 && n >= 2) k = 1;
    if (n && k >= n) k = n - 1;
    return k;
}

// The validation documents: the first k of a seeded Fisher-Yates shuffle of
// [0, n) (the choice earlier trident versions made with an n-entry array, so
// the same corpus and seed give the same split), run sparsely: only the
// positions a swap touched are kept, in a hash map, so memory is O(k) (the
// validation documents), not O(n). val_next then walks the sorted choice in
// corpus order.
struct val_sampler {
    uint64_t *chosen;  // (k) document indices, ascending
    uint64_t k, at, seen;
};

static uint64_t *slot_find(uint64_t *keys, uint64_t mask, uint64_t key) {
    uint64_t h = (key * 0x9e3779b97f4a7c15ull) >> 20;
    for (;; h++) {
        uint64_t *s = &keys[2 * (h & mask)];
        if (s[0] == key || s[0] == UINT64_MAX) return s;
    }
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void val_sampler_init(struct val_sampler *v, uint64_t n, uint64_t k, uint64_t seed) {
    memset(v, 0, sizeof *v);
    v->k = k;
    v->chosen = xmalloc((k ? k : 1) * sizeof *v->chosen);
    uint64_t cap = 16;
    while (cap < 4 * k + 16) cap *= 2; // at most 2k keys: load <= 1/2
    uint64_t *map = xmalloc(2 * cap * sizeof *map); // (cap) pairs (position, value)
    memset(map, 0xff, 2 * cap * sizeof *map);
    uint64_t rng = seed;
    for (uint64_t i = 0; i < k; i++) {
        uint64_t j = i + splitmix64(&rng) % (n - i);
        const uint64_t *si = slot_find(map, cap - 1, i), *sj = slot_find(map, cap - 1, j);
        uint64_t pi = si[0] == UINT64_MAX ? i : si[1], pj = sj[0] == UINT64_MAX ? j : sj[1];
        uint64_t *s = slot_find(map, cap - 1, j); // perm[j] = perm[i], then perm[i] = perm[j]
        s[0] = j;
        s[1] = pi;
        s = slot_find(map, cap - 1, i);
        s[0] = i;
        s[1] = pj;
        v->chosen[i] = pj;
    }
    free(map);
    qsort(v->chosen, k, sizeof *v->chosen, cmp_u64);
}

// Whether the next document in corpus order is a validation document.
static int val_next(struct val_sampler *v) {
    int pick = v->at < v->k && v->chosen[v->at] == v->seen;
    v->at += (uint64_t)pick;
    v->seen++;
    return pick;
}

// Tokens of one split waiting to become a shard.
struct pending {
    int32_t *tokens;
    uint8_t *mask;     // (cap,) loss mask, chat only (else NULL)
    uint64_t n, cap;
    uint64_t *offsets; // (docs + 1,)
    uint64_t docs, docs_cap;
};

// Doubling, but capped near one shard (limit: shard_tokens plus slack for the
// document that crosses it), so a pending shard holds at most ~1.1 shards.
// mask (n,) or NULL (no loss mask); eot_mask: the end-of-text id's.
static void pending_add(struct pending *p, const int32_t *ids, const uint8_t *mask, uint8_t eot_mask, size_t n,
                        int32_t eot, uint64_t limit) {
    if (p->n + n + 1 > p->cap) {
        p->cap = MAX(MIN(2 * p->cap, limit + limit / 8), p->n + n + 1 + (1 << 16));
        p->tokens = realloc(p->tokens, p->cap * sizeof *p->tokens);
        CHECK(p->tokens, "out of memory");
        if (mask) {
            p->mask = realloc(p->mask, p->cap);
            CHECK(p->mask, "out of memory");
        }
    }
    if (mask) {
        memcpy(p->mask + p->n, mask, n);
        p->mask[p->n + n] = eot_mask;
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
    enum status st = dataset_writer_add_masked(w, split, p->tokens, p->mask, p->n, p->offsets, p->docs, err);
    stats->shards++;
    p->n = p->docs = 0;
    return st;
}

static enum status copy_file(const char *from, const char *to, struct error *err) {
    char *s = NULL;
    size_t n = 0;
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
static enum status prep_tokenizer(const struct prep_options *opt, struct tokenizer **tok, struct error *err) {
    char out[4200];
    snprintf(out, sizeof out, "%s/tokenizer.json", opt->output);
    enum status st;
    if (opt->vocab_size > 0) { // training needs the corpus in memory (tokenizer_train's interface)
        struct corpus cs;
        if ((st = corpus_read(opt, &cs, err))) return st;
        const struct corpus *c = &cs;
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
        corpus_free(&cs);
        if (st) return st;
        return tokenizer_load(out, tok, err);
    }
    if ((st = tokenizer_load(opt->tokenizer_path, tok, err))) return st;
    return copy_file(opt->tokenizer_path, out, err);
}

static void fmt_seconds(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e8) snprintf(buf, n, "?");
    else if (s < 120) snprintf(buf, n, "%.0f s", s);
    else if (s < 7200) snprintf(buf, n, "%.0f min", s / 60);
    else snprintf(buf, n, "%.1f h", s / 3600);
}

// One progress line: bytes read of the total, tokens/s and the ETA. On a
// terminal it is redrawn in place; otherwise a plain line each time.
static void progress(const struct prep_stats *s, uint64_t bytes_read, uint64_t total_bytes, double t0, int last) {
    double dt = MAX(time_now_s() - t0, 1e-9), mb = 1e6;
    uint64_t docs = s->documents[0] + s->documents[1], toks = s->tokens[0] + s->tokens[1];
    double rate = (double)bytes_read / dt, pct = total_bytes ? 100.0 * (double)bytes_read / (double)total_bytes : 100;
    char eta[32];
    fmt_seconds(eta, sizeof eta, rate > 0 ? (double)(total_bytes - MIN(bytes_read, total_bytes)) / rate : -1);
    int tty = isatty(2);
    fprintf(stderr, "%sprep: %.1f/%.1f MB read (%.0f%%), %llu documents, %llu tokens, %.2f MB/s, %.0f tokens/s, %s %s%s",
            tty ? "\r" : "", (double)bytes_read / mb, (double)total_bytes / mb, pct, (unsigned long long)docs,
            (unsigned long long)toks, rate / mb, (double)toks / dt, last ? "took" : "ETA",
            last ? (fmt_seconds(eta, sizeof eta, dt), eta) : eta, tty && !last ? "\033[K" : "\n");
}

// Pass 1: counts the documents (for the validation split) and checks every
// input is readable, well formed and text before anything is written; the
// file counts go to stats, and a note on stderr names the files detected as
// JSON Lines.
static enum status count_docs(const struct prep_options *opt, uint64_t *n, struct prep_stats *stats,
                              struct error *err) {
    struct doc_reader r;
    enum status st = doc_reader_open(&r, opt, err);
    *n = 0;
    int tty = isatty(2), shown = 0;
    double t0 = time_now_s(), last = t0;
    for (;;) {
        const char *s;
        size_t len;
        if (st || (st = doc_reader_next(&r, &s, &len, err)) || !s) break;
        if (((++*n) & 4095) == 0 && !opt->quiet && time_now_s() - last > (tty ? 0.5 : 10.0)) {
            fprintf(stderr, "%sprep: checking the input: %.1f/%.1f MB read, %llu documents%s", tty ? "\r" : "",
                    (double)r.bytes_read / 1e6, (double)r.total_bytes / 1e6, (unsigned long long)*n,
                    tty ? "\033[K" : "\n");
            last = time_now_s();
            shown = 1;
        }
    }
    if (shown && tty) fputc('\n', stderr);
    stats->files = r.n_paths;
    stats->jsonl_files = r.jsonl_files;
    stats->jsonl_detected = r.jsonl_detected;
    stats->left_out = r.left_out;
    stats->invalid_utf8_bytes = r.invalid_utf8_bytes;
    stats->duplicates = r.duplicates;
    stats->chat_no_assistant = r.chat_no_assistant;
    if (!st && r.duplicates)
        fprintf(stderr, "prep: note: input %s is the same file as %s and is read once (%d input path%s a file "
                "listed before)\n", r.dup_path, r.dup_of, r.duplicates, r.duplicates > 1 ? "s repeat" : " repeats");
    if (!st && r.jsonl_detected)
        fprintf(stderr, "prep: note: %d of %d input files read as JSON Lines (named *.jsonl or *.json, first "
                "character '{'; the text in field \"%s\"; first: %s); --format text reads every file as text\n",
                r.jsonl_detected, r.n_paths, r.text_key, r.paths[r.first_detected]);
    if (!st && opt->text_key && r.jsonl_files == 0)
        st = error_set(err, STATUS_BAD_INPUT, "--text-key needs JSON Lines input, and no input file is JSON Lines "
                       "(--text-key %s; a file is read as JSON Lines when named *.jsonl or *.json and starting "
                       "with '{', or with --format jsonl)", opt->text_key);
    if (!st && r.invalid_utf8_bytes)
        fprintf(stderr, "prep: note: %llu bytes of the input are invalid UTF-8, encoded as byte tokens\n",
                (unsigned long long)r.invalid_utf8_bytes);
    // Chat data trains on the assistant's turns only (the loss mask): with
    // none in any conversation every step would have no target.
    if (!st && r.chat_docs && r.chat_no_assistant == r.chat_docs)
        st = error_set(err, STATUS_BAD_INPUT, "%s%s: no conversation has an assistant turn (%llu read; the first "
                       "at %s:%llu), so no token would be trained on: --format chat expects {\"prompt\": ..., "
                       "\"response\": ...} records or \"messages\" with a {\"role\": \"assistant\", \"content\": "
                       "...} turn (--format jsonl trains on every token of a \"text\" field)",
                       r.n_paths ? r.paths[0] : opt->inputs[0], r.n_paths > 1 ? " ..." : "",
                       (unsigned long long)r.chat_docs, r.paths[r.first_no_assistant_file],
                       (unsigned long long)r.first_no_assistant_line);
    else if (!st && r.chat_no_assistant)
        fprintf(stderr, "prep: note: %llu of %llu conversations have no assistant turn (none of their tokens is "
                "trained on; the first at %s:%llu)\n", (unsigned long long)r.chat_no_assistant,
                (unsigned long long)r.chat_docs, r.paths[r.first_no_assistant_file],
                (unsigned long long)r.first_no_assistant_line);
    doc_reader_close(&r);
    if (!st && *n == 0)
        st = error_set(err, STATUS_BAD_INPUT, "%s%s: no documents found in the input", opt->inputs[0],
                       opt->n_inputs > 1 ? " ..." : "");
    return st;
}

// A chat document (segments split by PREP_CHAT_SEP, prep.h) encoded segment
// by segment: *ids (*n,) and *mask (*n,), 0 on the segments not trained on,
// 1 on the others; *eot_mask 1 when the document ends in a trained segment.
// Errors: the tokenizer's.
static enum status encode_chat(const struct tokenizer *tok, const char *s, size_t len, int allow_special,
                               int32_t **ids, uint8_t **mask, uint8_t *eot_mask, size_t *n) {
    size_t cap = 64, used = 0;
    int32_t *all = xmalloc(cap * sizeof *all);
    uint8_t *m = xmalloc(cap);
    uint8_t trained = 0;
    for (size_t at = 0;;) {
        const char *sep = memchr(s + at, PREP_CHAT_SEP, len - at);
        size_t end = sep ? (size_t)(sep - s) : len;
        int32_t *seg = NULL;
        size_t k = 0;
        struct error e;
        if (end > at && tokenizer_encode(tok, s + at, end - at, allow_special, &seg, &k, &e) != STATUS_OK) {
            free(all), free(m);
            return STATUS_RUNTIME;
        }
        if (used + k > cap) {
            cap = MAX(2 * cap, used + k);
            all = realloc(all, cap * sizeof *all), m = realloc(m, cap);
            CHECK(all && m, "out of memory");
        }
        memcpy(all + used, seg, k * sizeof *seg);
        memset(m + used, trained, k);
        used += k;
        free(seg);
        if (!sep) break;
        trained = !trained;
        at = end + 1;
    }
    *ids = all, *mask = m, *n = used, *eot_mask = trained;
    return STATUS_OK;
}

// A block of documents read from the stream, encoded in parallel.
struct block {
    char *text;
    size_t len, cap;
    size_t off[PREP_BLOCK_DOCS + 1];
    int n;
    int32_t *ids[PREP_BLOCK_DOCS];
    uint8_t *mask[PREP_BLOCK_DOCS]; // chat: (n_ids,) loss mask; else NULL
    uint8_t eot_mask[PREP_BLOCK_DOCS];
    size_t n_ids[PREP_BLOCK_DOCS];
    uint64_t bytes_read;   // the reader's input position after this block
};

// Fills b from the reader; b->n == 0 at the end of the inputs.
static enum status block_fill(struct block *b, struct doc_reader *r, struct error *err) {
    b->n = 0;
    b->len = 0;
    b->off[0] = 0;
    while (b->n < PREP_BLOCK_DOCS && b->len < PREP_BLOCK_BYTES) {
        const char *s;
        size_t n;
        enum status st = doc_reader_next(r, &s, &n, err);
        if (st) return st;
        if (!s) break;
        if (b->len + n > b->cap) {
            b->cap = MAX(2 * b->cap, b->len + n + (1 << 16));
            b->text = realloc(b->text, b->cap);
            CHECK(b->text, "out of memory holding a block of %zu bytes", b->cap);
        }
        memcpy(b->text + b->len, s, n);
        b->len += n;
        b->off[++b->n] = b->len;
    }
    b->bytes_read = r->bytes_read;
    return STATUS_OK;
}

// The bounded queue between the reader thread and the encoder: blocks
// filled - consumed are ready (slot i % PREP_QUEUE), at most PREP_QUEUE of
// them counting the one being encoded, so reading and parsing the input
// overlap encoding while memory stays at PREP_QUEUE blocks.
#define PREP_QUEUE 3
struct block_queue {
    pthread_mutex_t m;
    pthread_cond_t cv;
    struct block *slot[PREP_QUEUE];
    uint64_t filled, consumed;
    int done, stop;        // reader finished (end or error); encoder asks it to stop
    enum status st;        // the reader's status once done
    struct error err;
    struct doc_reader *r;
};

static void *queue_reader(void *arg) {
    struct block_queue *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->m);
        while (q->filled - q->consumed == PREP_QUEUE && !q->stop) pthread_cond_wait(&q->cv, &q->m);
        int stop = q->stop;
        struct block *b = q->slot[q->filled % PREP_QUEUE];
        pthread_mutex_unlock(&q->m);
        if (stop) break;
        struct error e = {0};
        enum status st = block_fill(b, q->r, &e);
        int end = st || b->n == 0;
        pthread_mutex_lock(&q->m);
        if (end) {
            q->st = st;
            q->err = e;
            q->done = 1;
        } else {
            q->filled++;
        }
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->m);
        if (end) break;
    }
    return NULL;
}

// The next block in input order, or NULL at the end of the input or on a
// reader error (q->st).
static struct block *queue_next(struct block_queue *q) {
    pthread_mutex_lock(&q->m);
    while (q->filled == q->consumed && !q->done) pthread_cond_wait(&q->cv, &q->m);
    struct block *b = q->filled > q->consumed ? q->slot[q->consumed % PREP_QUEUE] : NULL;
    pthread_mutex_unlock(&q->m);
    return b;
}

static void queue_release(struct block_queue *q, int stop) {
    pthread_mutex_lock(&q->m);
    if (stop) q->stop = 1;
    else q->consumed++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->m);
}

// Creates dir and its missing parent folders (mkdir -p); those it made are
// appended to *made (outermost first), for remove_output.
static enum status make_output_dirs(const char *dir, char ***made, int *n_made, struct error *err) {
    char *p = strdup(dir);
    CHECK(p, "out of memory");
    size_t n = strlen(p);
    enum status st = STATUS_OK;
    for (size_t i = 1; i <= n && !st; i++) {
        if (i < n && p[i] != '/') continue;
        if (p[i - 1] == '/') continue; // "a//b", or a trailing '/'
        char c = p[i];
        p[i] = 0;
        struct stat sb;
        if (mkdir(p, 0777) == 0) {
            *made = realloc(*made, (size_t)(*n_made + 1) * sizeof **made);
            CHECK(*made, "out of memory");
            (*made)[(*n_made)++] = strdup(p);
        } else if (errno != EEXIST) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: cannot create output folder %s: %s", dir, p, strerror(errno));
        } else if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            st = error_set(err, STATUS_BAD_INPUT, "%s: cannot create output folder: %s exists and is not a folder",
                           dir, p);
        }
        p[i] = c;
    }
    free(p);
    return st;
}

// After a failure: removes what prep wrote into the output folder (which was
// new or empty: prep_run checks) and the folders it made, so a refused or
// failed prep leaves nothing behind.
static void remove_output(const char *dir, char **made, int n_made) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            const char *f = e->d_name;
            if (strcmp(f, "tokenizer.json") && strcmp(f, "index.ini") && strcmp(f, "index.ini.tmp") &&
                fnmatch("shard-[0-9]*.h5", f, 0))
                continue;
            char path[4400];
            snprintf(path, sizeof path, "%s/%s", dir, f);
            unlink(path);
        }
        closedir(d);
    }
    for (int i = n_made - 1; i >= 0; i--) rmdir(made[i]);
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
    uint64_t n_docs;
    enum status st = count_docs(opt, &n_docs, stats, err);
    if (st) return st;
    char **made = NULL; // the folders made for the output, outermost first
    int n_made = 0;
    if ((st = make_output_dirs(opt->output, &made, &n_made, err))) {
        remove_output(opt->output, made, n_made);
        for (int i = 0; i < n_made; i++) free(made[i]);
        free(made);
        return st;
    }
    struct tokenizer *tok = NULL;
    struct pending pend[2] = {{0}};
    struct dataset_writer w;
    struct doc_reader r = {0};
    struct block_queue q = {.r = &r};
    struct val_sampler vs = {0};
    pthread_t reader;
    int writer_open = 0, reader_started = 0;
    if ((st = prep_tokenizer(opt, &tok, err))) goto done;
    if (opt->stop && *opt->stop) {
        st = error_set(err, STATUS_RUNTIME, "stopped by signal %d; what it wrote is removed", (int)*opt->stop);
        goto done;
    }
    int eot = tokenizer_eot_id(tok), vocab = tokenizer_vocab_size(tok);
    if (eot < 0) {
        st = error_set(err, STATUS_BAD_INPUT, "%s: tokenizer has no end-of-text token (<|endoftext|>, </s>, ...)",
                       opt->tokenizer_path ? opt->tokenizer_path : "tokenizer.json");
        goto done;
    }
    if (opt->format == PREP_FORMAT_CHAT && (st = chat_template_check(tok, opt->chat_template, err))) goto done;
    if ((st = dataset_writer_init(&w, opt->output, vocab, eot, tokenizer_identity(tok), err))) goto done;
    writer_open = 1;
    if (opt->format == PREP_FORMAT_CHAT)
        snprintf(w.index.chat_template, sizeof w.index.chat_template, "%s", chat_template_name(opt->chat_template));
    if ((st = doc_reader_open(&r, opt, err))) goto done;
    val_sampler_init(&vs, n_docs, val_count(n_docs, opt->val_fraction), opt->seed);
    for (int i = 0; i < PREP_QUEUE; i++) q.slot[i] = xcalloc(1, sizeof *q.slot[i]);
    pthread_mutex_init(&q.m, NULL);
    pthread_cond_init(&q.cv, NULL);
    CHECK(pthread_create(&reader, NULL, queue_reader, &q) == 0, "cannot start the prep reader thread");
    reader_started = 1;
    stats->threads = omp_get_max_threads();
    double t0 = time_now_s(), last = t0;
    uint64_t bytes_read = 0;
    int tty = isatty(2);
    for (;;) {
        if (opt->stop && *opt->stop) {
            st = error_set(err, STATUS_RUNTIME, "stopped by signal %d; what it wrote is removed", (int)*opt->stop);
            break;
        }
        struct block *b = queue_next(&q);
        if (!b) {
            if (q.st) st = error_set(err, q.st, "%s", q.err.msg);
            break;
        }
        int failed = 0;
        // Encode in parallel; append below in document order, so the output
        // does not depend on the thread count.
#pragma omp parallel for schedule(dynamic, 4) reduction(| : failed)
        for (int k = 0; k < b->n; k++) {
            if (opt->format == PREP_FORMAT_CHAT && opt->chat_template != CHAT_TEMPLATE_PLAIN) {
                struct error e;
                b->eot_mask[k] = 0; // the template's end token ends the turn; the document's is not trained on
                failed |= chat_encode(tok, b->text + b->off[k], b->off[k + 1] - b->off[k], opt->allow_special,
                                      &b->ids[k], &b->mask[k], &b->n_ids[k], &e) != STATUS_OK;
                continue;
            }
            if (opt->format == PREP_FORMAT_CHAT) {
                failed |= encode_chat(tok, b->text + b->off[k], b->off[k + 1] - b->off[k], opt->allow_special,
                                      &b->ids[k], &b->mask[k], &b->eot_mask[k], &b->n_ids[k]) != STATUS_OK;
                continue;
            }
            struct error e;
            failed |= tokenizer_encode(tok, b->text + b->off[k], b->off[k + 1] - b->off[k], opt->allow_special,
                                       &b->ids[k], &b->n_ids[k], &e) != STATUS_OK;
        }
        if (failed) {
            st = error_set(err, STATUS_RUNTIME, "tokenizer_encode failed in documents %llu..%llu",
                           (unsigned long long)vs.seen, (unsigned long long)vs.seen + (unsigned long long)b->n - 1);
            queue_release(&q, 1);
            break;
        }
        for (int k = 0; k < b->n; k++) {
            enum split sp = val_next(&vs) ? SPLIT_VAL : SPLIT_TRAIN;
            for (size_t i = 0; i < b->n_ids[k]; i++)
                CHECK(b->ids[k][i] >= 0 && b->ids[k][i] < vocab, "tokenizer gave id %d outside [0, %d)", b->ids[k][i],
                      vocab);
            pending_add(&pend[sp], b->ids[k], b->mask[k], b->eot_mask[k], b->n_ids[k], eot, opt->shard_tokens);
            free(b->mask[k]);
            b->mask[k] = NULL;
            stats->documents[sp]++;
            stats->tokens[sp] += b->n_ids[k] + 1;
            free(b->ids[k]);
            b->ids[k] = NULL;
            if (!st && pend[sp].n >= opt->shard_tokens) st = pending_flush(&pend[sp], &w, sp, stats, err);
        }
        stats->bytes += b->len;
        bytes_read = b->bytes_read;
        queue_release(&q, st != STATUS_OK);
        if (st) break;
        if (!opt->quiet && time_now_s() - last > (tty ? 0.5 : 10.0)) {
            progress(stats, bytes_read, r.total_bytes, t0, 0);
            last = time_now_s();
        }
    }
    for (int sp = 0; sp < 2 && !st; sp++) st = pending_flush(&pend[sp], &w, sp, stats, err);
    if (!st) {
        st = dataset_writer_finish(&w, err);
        writer_open = 0;
    }
    stats->encode_seconds = time_now_s() - t0;
    if (!opt->quiet && !st) progress(stats, bytes_read, r.total_bytes, t0, 1);
done:
    if (reader_started) {
        queue_release(&q, 1);
        pthread_join(reader, NULL);
        pthread_mutex_destroy(&q.m);
        pthread_cond_destroy(&q.cv);
    }
    for (int i = 0; i < PREP_QUEUE; i++) {
        if (!q.slot[i]) continue;
        for (int k = 0; k < PREP_BLOCK_DOCS; k++) free(q.slot[i]->ids[k]), free(q.slot[i]->mask[k]);
        free(q.slot[i]->text);
        free(q.slot[i]);
    }
    if (writer_open) index_free(&w.index);
    for (int sp = 0; sp < 2; sp++) free(pend[sp].tokens), free(pend[sp].mask), free(pend[sp].offsets);
    doc_reader_close(&r);
    free(vs.chosen);
    if (tok) tokenizer_free(tok);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) stats->peak_rss_bytes = (uint64_t)ru.ru_maxrss * 1024;
    if (st) remove_output(opt->output, made, n_made);
    for (int i = 0; i < n_made; i++) free(made[i]);
    free(made);
    return st;
}

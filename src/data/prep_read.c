// prep_read.c: the documents of `trident prep`'s inputs, read as a stream
// (one line at a time through stdio), so memory is bounded by the longest
// document, not by the corpus (docs/formats.md, "Raw text").
#include "prep.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void add_path(struct doc_reader *r, const char *p, uint64_t size) {
    r->paths = realloc(r->paths, (size_t)(r->n_paths + 1) * sizeof *r->paths);
    CHECK(r->paths, "out of memory");
    r->paths[r->n_paths] = strdup(p);
    CHECK(r->paths[r->n_paths], "out of memory");
    r->n_paths++;
    r->total_bytes += size;
}

enum status doc_reader_open(struct doc_reader *r, const char *const *inputs, int n_inputs, enum prep_format format,
                            const char *text_key, struct error *err) {
    memset(r, 0, sizeof *r);
    r->format = format;
    r->text_key = text_key ? text_key : "text";
    for (int i = 0; i < n_inputs; i++) {
        struct stat sb;
        if (stat(inputs[i], &sb) != 0) {
            doc_reader_close(r);
            return error_set(err, STATUS_BAD_INPUT, "%s: input not found: %s", inputs[i], strerror(errno));
        }
        if (!S_ISDIR(sb.st_mode)) {
            add_path(r, inputs[i], (uint64_t)sb.st_size);
            continue;
        }
        // A folder: its regular files (not hidden), in name order.
        DIR *d = opendir(inputs[i]);
        if (!d) {
            doc_reader_close(r);
            return error_set(err, STATUS_BAD_INPUT, "%s: cannot list folder: %s", inputs[i], strerror(errno));
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
            struct stat fs;
            add_path(r, names[k], stat(names[k], &fs) == 0 ? (uint64_t)fs.st_size : 0);
            free(names[k]);
        }
        free(names);
    }
    return STATUS_OK;
}

void doc_reader_close(struct doc_reader *r) {
    if (r->f) fclose(r->f);
    for (int i = 0; i < r->n_paths; i++) free(r->paths[i]);
    free(r->paths);
    free(r->line);
    free(r->doc);
    memset(r, 0, sizeof *r);
}

static int line_is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

static void doc_set(struct doc_reader *r, const char *s, size_t n, int append_line) {
    size_t need = r->doc_len + n + 2;
    if (need > r->doc_cap) {
        r->doc_cap = MAX(2 * r->doc_cap, need + 4096);
        r->doc = realloc(r->doc, r->doc_cap);
        CHECK(r->doc, "out of memory holding a document of %zu bytes", need);
    }
    if (append_line) r->doc[r->doc_len++] = '\n';
    memcpy(r->doc + r->doc_len, s, n);
    r->doc_len += n;
}

// One JSON Lines record: the string field text_key, NUL characters included
// (JSON_ALLOW_NUL, length-aware access).
static enum status jsonl_doc(struct doc_reader *r, const char *s, size_t n, struct error *err) {
    json_error_t jerr;
    json_t *obj = json_loadb(s, n, JSON_ALLOW_NUL, &jerr);
    const char *path = r->paths[r->file];
    if (!obj) return error_set(err, STATUS_BAD_INPUT, "%s:%llu: not JSON: %s", path, (unsigned long long)r->line_no,
                               jerr.text);
    json_t *text = json_is_object(obj) ? json_object_get(obj, r->text_key) : NULL;
    if (!json_is_string(text)) {
        json_decref(obj);
        return error_set(err, STATUS_BAD_INPUT, "%s:%llu: expected an object with a string field \"%s\"", path,
                         (unsigned long long)r->line_no, r->text_key);
    }
    r->doc_len = 0;
    doc_set(r, json_string_value(text), json_string_length(text), 0);
    json_decref(obj);
    return STATUS_OK;
}

enum status doc_reader_next(struct doc_reader *r, const char **text, size_t *len, struct error *err) {
    *text = NULL;
    *len = 0;
    int in_doc = 0;
    for (;;) {
        if (!r->f) {
            if (r->file + (r->started ? 1 : 0) >= r->n_paths) return STATUS_OK; // end of the corpus
            if (r->started) r->file++;
            r->started = 1;
            r->f = fopen(r->paths[r->file], "rb");
            if (!r->f) return error_set(err, STATUS_BAD_INPUT, "%s: cannot open input: %s", r->paths[r->file],
                                        strerror(errno));
            r->line_no = 0;
        }
        ssize_t got = getline(&r->line, &r->line_cap, r->f);
        if (got < 0) {
            int bad = ferror(r->f);
            fclose(r->f);
            r->f = NULL;
            if (bad) return error_set(err, STATUS_BAD_INPUT, "%s: read error", r->paths[r->file]);
            if (in_doc) break; // a text document ends with its file
            continue;
        }
        r->bytes_read += (uint64_t)got;
        r->line_no++;
        size_t n = (size_t)got;
        if (n && r->line[n - 1] == '\n') n--;
        if (r->format == PREP_FORMAT_JSONL) {
            if (line_is_blank(r->line, n)) continue;
            enum status st = jsonl_doc(r, r->line, n, err);
            if (st) return st;
            if (r->doc_len == 0) continue; // empty documents are skipped
            *text = r->doc;
            *len = r->doc_len;
            return STATUS_OK;
        }
        // Plain text: a document is a run of non-blank lines, kept with its
        // inner newlines and without the final one (nor its '\r').
        if (line_is_blank(r->line, n)) {
            if (in_doc) break;
            continue;
        }
        if (!in_doc) r->doc_len = 0;
        doc_set(r, r->line, n, in_doc);
        in_doc = 1;
    }
    if (r->doc_len && r->doc[r->doc_len - 1] == '\r') r->doc_len--;
    *text = r->doc;
    *len = r->doc_len;
    return STATUS_OK;
}

enum status corpus_read(const char *const *inputs, int n_inputs, enum prep_format format, const char *text_key,
                        struct corpus *out, struct error *err) {
    memset(out, 0, sizeof *out);
    struct doc_reader r;
    enum status st = doc_reader_open(&r, inputs, n_inputs, format, text_key, err);
    if (st) return st;
    size_t cap = 0, docs_cap = 0, used = 0;
    for (;;) {
        const char *s;
        size_t n;
        if ((st = doc_reader_next(&r, &s, &n, err)) || !s) break;
        if (used + n > cap) {
            cap = MAX(2 * cap, used + n + (1 << 16));
            out->text = realloc(out->text, cap);
            CHECK(out->text, "out of memory reading the corpus (%zu bytes)", cap);
        }
        if (out->n_docs + 2 > docs_cap) {
            docs_cap = MAX(2 * docs_cap, 1024);
            out->offsets = realloc(out->offsets, docs_cap * sizeof *out->offsets);
            CHECK(out->offsets, "out of memory");
        }
        memcpy(out->text + used, s, n);
        out->offsets[out->n_docs] = used;
        used += n;
        out->offsets[++out->n_docs] = used;
    }
    doc_reader_close(&r);
    if (!st && out->n_docs == 0)
        st = error_set(err, STATUS_BAD_INPUT, "%s%s: no documents found in the input", inputs[0],
                       n_inputs > 1 ? " ..." : "");
    if (st) {
        corpus_free(out);
        return st;
    }
    return STATUS_OK;
}

void corpus_free(struct corpus *c) {
    free(c->text);
    free(c->offsets);
    memset(c, 0, sizeof *c);
}

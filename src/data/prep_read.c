// prep_read.c: the documents of `trident prep`'s inputs, read as a stream
// (one line at a time through stdio), so memory is bounded by the longest
// document, not by the corpus (docs/formats.md, "Raw text").
#include "prep.h"
#include "chat.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// An input file's identity, for drop_duplicates: (dev, ino), and at, its
// place in the reading order.
struct file_id {
    uint64_t dev, ino, size;
    int at;
};

// Appends file p (sb: its stat) to the reading order and its identity to
// *ids (n_paths entries).
static void add_path(struct doc_reader *r, const char *p, const struct stat *sb, struct file_id **ids) {
    r->paths = realloc(r->paths, (size_t)(r->n_paths + 1) * sizeof *r->paths);
    *ids = realloc(*ids, (size_t)(r->n_paths + 1) * sizeof **ids);
    CHECK(r->paths && *ids, "out of memory");
    r->paths[r->n_paths] = strdup(p);
    CHECK(r->paths[r->n_paths], "out of memory");
    (*ids)[r->n_paths] = (struct file_id){(uint64_t)sb->st_dev, (uint64_t)sb->st_ino, (uint64_t)sb->st_size,
                                          r->n_paths};
    r->n_paths++;
    r->total_bytes += (uint64_t)sb->st_size;
}

static int cmp_file_id(const void *a, const void *b) {
    const struct file_id *x = a, *y = b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return (x->at > y->at) - (x->at < y->at);
}

// Keeps each file once, at its first place in the reading order: the same
// file named twice (--input A --input A, another spelling of its path, a hard
// link, a file also inside a folder given) would otherwise be read twice.
// Counts the dropped in r->duplicates and names the first of them. ids
// (n_paths) is sorted here.
static void drop_duplicates(struct doc_reader *r, struct file_id *ids) {
    if (r->n_paths < 2) return;
    qsort(ids, (size_t)r->n_paths, sizeof *ids, cmp_file_id);
    int *first = xmalloc((size_t)r->n_paths * sizeof *first); // the place its file is read at
    for (int k = 0; k < r->n_paths; k++) {
        int same = k > 0 && ids[k].dev == ids[k - 1].dev && ids[k].ino == ids[k - 1].ino;
        first[ids[k].at] = same ? first[ids[k - 1].at] : ids[k].at;
        if (same) r->total_bytes -= MIN(ids[k].size, r->total_bytes);
    }
    int kept = 0;
    for (int i = 0; i < r->n_paths; i++) {
        if (first[i] == i) {
            r->paths[kept++] = r->paths[i];
            continue;
        }
        if (r->duplicates++ == 0) {
            snprintf(r->dup_path, sizeof r->dup_path, "%s", r->paths[i]);
            snprintf(r->dup_of, sizeof r->dup_of, "%s", r->paths[first[i]]);
        }
        free(r->paths[i]);
    }
    r->n_paths = kept;
    free(first);
}

// A folder walk: the folders visited (device, inode), so a symlink loop or a
// second link to a folder is listed once, and the files found.
struct walk {
    const struct prep_options *opt;
    dev_t *dev;
    ino_t *ino;
    size_t n_seen;
    char **files;
    size_t n_files;
    int left_out;
};

static int walk_included(const struct prep_options *opt, const char *name) {
    if (opt->n_includes == 0) return 1;
    for (int i = 0; i < opt->n_includes; i++)
        if (fnmatch(opt->includes[i], name, 0) == 0) return 1;
    return 0;
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir);
    int slash = n > 0 && dir[n - 1] == '/';
    char *p = xmalloc(n + strlen(name) + 2);
    sprintf(p, "%s%s%s", dir, slash ? "" : "/", name);
    return p;
}

// Adds folder dir's files (sb: its stat) to w, then walks its sub-folders
// (after closing it, so open folders stay one).
static enum status walk_dir(struct walk *w, const char *dir, const struct stat *sb, struct error *err) {
    for (size_t i = 0; i < w->n_seen; i++)
        if (w->dev[i] == sb->st_dev && w->ino[i] == sb->st_ino) return STATUS_OK;
    w->dev = realloc(w->dev, (w->n_seen + 1) * sizeof *w->dev);
    w->ino = realloc(w->ino, (w->n_seen + 1) * sizeof *w->ino);
    CHECK(w->dev && w->ino, "out of memory");
    w->dev[w->n_seen] = sb->st_dev;
    w->ino[w->n_seen++] = sb->st_ino;
    DIR *d = opendir(dir);
    if (!d) return error_set(err, STATUS_BAD_INPUT, "%s: cannot list folder: %s", dir, strerror(errno));
    char **subs = NULL;
    size_t n_subs = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue; // hidden, and . and ..
        char *p = path_join(dir, e->d_name);
        struct stat fs;
        int found = stat(p, &fs) == 0, reg = found && S_ISREG(fs.st_mode);
        if (found && S_ISDIR(fs.st_mode) && w->opt->recursive) {
            subs = realloc(subs, (n_subs + 1) * sizeof *subs);
            CHECK(subs, "out of memory");
            subs[n_subs++] = p;
        } else if (reg && walk_included(w->opt, e->d_name)) {
            w->files = realloc(w->files, (w->n_files + 1) * sizeof *w->files);
            CHECK(w->files, "out of memory");
            w->files[w->n_files++] = p;
        } else { // a dangling link, a fifo, a device, or a file the globs leave out
            w->left_out += reg;
            free(p);
        }
    }
    closedir(d);
    enum status st = STATUS_OK;
    for (size_t i = 0; i < n_subs; i++) {
        struct stat fs;
        if (!st && stat(subs[i], &fs) == 0) st = walk_dir(w, subs[i], &fs, err);
        free(subs[i]);
    }
    free(subs);
    return st;
}

enum status doc_reader_open(struct doc_reader *r, const struct prep_options *opt, struct error *err) {
    memset(r, 0, sizeof *r);
    r->format = opt->format;
    r->doc_per_file = opt->doc_per_file;
    r->text_key = opt->text_key ? opt->text_key : "text";
    r->chat_template = opt->chat_template;
    r->first_detected = -1;
    struct file_id *ids = NULL; // (n_paths,)
    for (int i = 0; i < opt->n_inputs; i++) {
        const char *in = opt->inputs[i];
        struct stat sb;
        if (stat(in, &sb) != 0) {
            free(ids);
            doc_reader_close(r);
            return error_set(err, STATUS_BAD_INPUT, "%s: input not found: %s", in, strerror(errno));
        }
        if (!S_ISDIR(sb.st_mode)) {
            add_path(r, in, &sb, &ids);
            continue;
        }
        struct walk w = {.opt = opt};
        enum status st = walk_dir(&w, in, &sb, err);
        if (!st && w.n_files == 0) {
            char globs[512] = "";
            for (int k = 0; k < opt->n_includes; k++)
                snprintf(globs + strlen(globs), sizeof globs - strlen(globs), " --include '%s'", opt->includes[k]);
            st = error_set(err, STATUS_BAD_INPUT, "%s: folder holds no file to read (%d left out by%s; %s)", in,
                           w.left_out, opt->n_includes ? globs : " no --include",
                           opt->recursive ? "sub-folders searched, hidden ones skipped"
                                          : "--no-recursive: sub-folders not searched");
        }
        if (w.n_files) qsort(w.files, w.n_files, sizeof *w.files, cmp_str);
        for (size_t k = 0; k < w.n_files; k++) {
            struct stat fs;
            if (!st && stat(w.files[k], &fs) != 0) memset(&fs, 0, sizeof fs); // gone: its open will say so
            if (!st) add_path(r, w.files[k], &fs, &ids);
            free(w.files[k]);
        }
        r->left_out += w.left_out;
        free(w.files);
        free(w.dev);
        free(w.ino);
        if (st) {
            free(ids);
            doc_reader_close(r);
            return st;
        }
    }
    drop_duplicates(r, ids);
    free(ids);
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
    const char *why = r->format == PREP_FORMAT_AUTO ? " (read as JSON Lines, one object a line, for its name and "
                                                      "its first '{'; --format text reads it as text)" : "";
    if (!obj) return error_set(err, STATUS_BAD_INPUT, "%s:%llu: not JSON: %s%s", path, (unsigned long long)r->line_no,
                               jerr.text, why);
    json_t *text = json_is_object(obj) ? json_object_get(obj, r->text_key) : NULL;
    if (!json_is_string(text)) {
        json_decref(obj);
        return error_set(err, STATUS_BAD_INPUT, "%s:%llu: expected an object with a string field \"%s\"%s", path,
                         (unsigned long long)r->line_no, r->text_key, why);
    }
    r->doc_len = 0;
    doc_set(r, json_string_value(text), json_string_length(text), 0);
    json_decref(obj);
    return STATUS_OK;
}

// Appends content (n bytes) to the chat document; a PREP_CHAT_SEP in it is
// refused (it would move the loss mask's boundary).
static enum status chat_put(struct doc_reader *r, const char *s, size_t n, struct error *err) {
    if (memchr(s, PREP_CHAT_SEP, n))
        return error_set(err, STATUS_BAD_INPUT, "%s:%llu: the text holds the control character U+0001, which "
                         "--format chat reserves to mark where the loss mask changes", r->paths[r->file],
                         (unsigned long long)r->line_no);
    doc_set(r, s, n, 0);
    return STATUS_OK;
}

char *prep_chat_prompt(const char *prompt, size_t n, size_t *len) {
    static const char user[] = "User: ", assistant[] = "\nAssistant:";
    *len = sizeof user - 1 + n + sizeof assistant - 1;
    char *s = xmalloc(*len + 1);
    memcpy(s, user, sizeof user - 1);
    memcpy(s + sizeof user - 1, prompt, n);
    memcpy(s + sizeof user - 1 + n, assistant, sizeof assistant);
    return s;
}

// A string field of a chat record: NULL when not a string; a NUL character in
// it is refused as a NUL byte in a text file is (a role "user\u0000x" must
// not read as "user").
static enum status chat_string(struct doc_reader *r, json_t *v, const char *what, long i, const char *field,
                               const char **s, size_t *n, struct error *err) {
    *s = NULL, *n = 0;
    if (!json_is_string(v)) return STATUS_OK;
    *s = json_string_value(v), *n = json_string_length(v);
    if (!memchr(*s, '\0', *n)) return STATUS_OK;
    char name[96];
    if (i >= 0) snprintf(name, sizeof name, "%s[%ld].%s", what, i, field);
    else snprintf(name, sizeof name, "%s", what);
    return error_set(err, STATUS_BAD_INPUT, "%s:%llu: %s holds a NUL character (\\u0000): not text, refused as a "
                     "NUL byte in a text file is (--format chat)", r->paths[r->file], (unsigned long long)r->line_no,
                     name);
}

// One chat record rendered with the default template (prep.h): segments
// separated by PREP_CHAT_SEP, masked and trained on in turn, the first masked;
// with chat_template llama3 or chatml, chat.h's pieces.
static enum status chat_doc(struct doc_reader *r, const char *s, size_t n, struct error *err) {
    json_error_t jerr;
    json_t *obj = json_loadb(s, n, JSON_ALLOW_NUL, &jerr);
    const char *path = r->paths[r->file];
    unsigned long long line = (unsigned long long)r->line_no;
    if (!obj) return error_set(err, STATUS_BAD_INPUT, "%s:%llu: not JSON: %s (--format chat)", path, line, jerr.text);
    enum status st = STATUS_OK;
    r->doc_len = 0;
    json_t *prompt = json_object_get(obj, "prompt"), *response = json_object_get(obj, "response");
    json_t *msgs = json_object_get(obj, "messages");
    char sep = PREP_CHAT_SEP;
    struct chat_msg *m = NULL;
    size_t nm = 0;
    if (json_is_string(prompt) && json_is_string(response)) {
        m = xcalloc(2, sizeof *m);
        nm = 2;
        m[0].role = "user", m[0].role_len = 4, m[1].role = "assistant", m[1].role_len = 9;
        st = chat_string(r, prompt, "prompt", -1, NULL, &m[0].content, &m[0].content_len, err);
        if (!st) st = chat_string(r, response, "response", -1, NULL, &m[1].content, &m[1].content_len, err);
    } else if (json_is_array(msgs) && json_array_size(msgs) > 0) {
        nm = json_array_size(msgs);
        m = xcalloc(nm, sizeof *m);
        for (size_t i = 0; i < nm && !st; i++) {
            json_t *mi = json_array_get(msgs, i);
            st = chat_string(r, json_object_get(mi, "role"), "messages", (long)i, "role", &m[i].role, &m[i].role_len, err);
            if (!st) st = chat_string(r, json_object_get(mi, "content"), "messages", (long)i, "content",
                                      &m[i].content, &m[i].content_len, err);
            const char *rs = m[i].role;
            size_t rl = m[i].role_len;
            if (!st && (!rs || !m[i].content || !((rl == 6 && !memcmp(rs, "system", 6)) ||
                                                  (rl == 4 && !memcmp(rs, "user", 4)) ||
                                                  (rl == 9 && !memcmp(rs, "assistant", 9)))))
                st = error_set(err, STATUS_BAD_INPUT, "%s:%llu: messages[%zu] needs \"role\" (system, user or "
                               "assistant) and a string \"content\"", path, line, i);
        }
    } else {
        st = error_set(err, STATUS_BAD_INPUT, "%s:%llu: expected {\"prompt\": string, \"response\": string} or "
                       "{\"messages\": [{\"role\": ..., \"content\": ...}, ...]} (--format chat)", path, line);
    }
    int assistant = 0;
    for (size_t i = 0; i < nm && !st; i++) assistant |= m[i].role_len == 9 && !memcmp(m[i].role, "assistant", 9);
    if (!st) {
        r->chat_docs++;
        if (!assistant && r->chat_no_assistant++ == 0)
            r->first_no_assistant_file = r->file, r->first_no_assistant_line = r->line_no;
    }
    if (!st && r->chat_template != CHAT_TEMPLATE_PLAIN) {
        st = chat_render(r->chat_template, m, nm, 0, &r->doc, &r->doc_len, &r->doc_cap, err);
        if (st) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            st = error_set(err, STATUS_BAD_INPUT, "%s:%llu: %s", path, line, msg);
        }
    } else if (!st && json_is_string(prompt) && json_is_string(response)) {
        size_t k;
        char *head = prep_chat_prompt(m[0].content, m[0].content_len, &k);
        st = chat_put(r, head, k, err);
        free(head);
        if (!st) {
            doc_set(r, &sep, 1, 0);
            if (!(st = chat_put(r, " ", 1, err))) st = chat_put(r, m[1].content, m[1].content_len, err);
        }
    } else if (!st) {
        int trained = 0; // the current segment is trained on
        for (size_t i = 0; i < nm && !st; i++) {
            const char *head = m[i].role_len == 6 ? "System:" : m[i].role_len == 4 ? "User:" : "Assistant:";
            if (trained) doc_set(r, &sep, 1, 0), trained = 0;
            if (i > 0 && (st = chat_put(r, "\n", 1, err))) break;
            if ((st = chat_put(r, head, strlen(head), err))) break;
            if (head[0] == 'A') doc_set(r, &sep, 1, 0), trained = 1;
            if (!(st = chat_put(r, " ", 1, err))) st = chat_put(r, m[i].content, m[i].content_len, err);
        }
    }
    free(m);
    json_decref(obj);
    return st;
}

// What a file's first bytes say it is when it is not text (a compressed file
// or archive, UTF-16), or NULL.
static const char *binary_magic(const unsigned char *s, size_t n) {
    if (n >= 2 && s[0] == 0x1f && s[1] == 0x8b) return "gzip-compressed (magic 1f 8b): decompress it first (gunzip)";
    if (n >= 4 && !memcmp(s, "\x28\xb5\x2f\xfd", 4))
        return "zstd-compressed (magic 28 b5 2f fd): decompress it first (zstd -d)";
    if (n >= 6 && !memcmp(s, "\xfd" "7zXZ\0", 6)) return "xz-compressed (magic fd 37 7a 58 5a 00): decompress it "
                                                        "first (xz -d)";
    if (n >= 10 && !memcmp(s, "BZh", 3) && s[3] >= '1' && s[3] <= '9' && !memcmp(s + 4, "1AY&SY", 6))
        return "bzip2-compressed (magic BZh): decompress it first (bunzip2)";
    if (n >= 4 && !memcmp(s, "PK\x03\x04", 4)) return "a zip archive (magic 50 4b 03 04): extract it first (unzip)";
    if (n >= 2 && ((s[0] == 0xff && s[1] == 0xfe) || (s[0] == 0xfe && s[1] == 0xff)))
        return "UTF-16 text (byte-order mark): convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8)";
    return NULL;
}

// The length of the valid UTF-8 sequence at s (at most n bytes), or 0 when
// s[0] starts none (RFC 3629: no overlong forms, surrogates or code points
// above U+10FFFF).
static size_t utf8_valid_at(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t k = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (k == 0 || k > n) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (c == 0xe0 && s[1] < 0xa0) return 0; // overlong
    if (c == 0xed && s[1] > 0x9f) return 0; // surrogate
    if (c == 0xf0 && s[1] < 0x90) return 0; // overlong
    if (c == 0xf4 && s[1] > 0x8f) return 0; // above U+10FFFF
    return k;
}

// The refusal of a file (path) with a NUL byte at offset (1-based line).
static enum status nul_error(const char *path, uint64_t offset, uint64_t line, int in_folder, struct error *err) {
    return error_set(err, STATUS_BAD_INPUT, "%s: not text: a NUL byte at byte offset %llu (line %llu), binary "
                     "data (or UTF-16 text: convert it with iconv -t UTF-8)%s", path, (unsigned long long)offset,
                     (unsigned long long)line, in_folder ? "; leave such files out of a folder with --include GLOB"
                                                         : "");
}

// The refusal of a file (path) of n bytes, bad of them invalid UTF-8 (the
// first at offset, on line), when that is too many (prep.h); else STATUS_OK.
static enum status utf8_check(const char *path, uint64_t bad, uint64_t n, uint64_t offset, uint64_t line,
                              struct error *err) {
    if (bad > PREP_MAX_BAD_UTF8_BYTES && bad * 100 > n * PREP_MAX_BAD_UTF8_PERCENT)
        return error_set(err, STATUS_BAD_INPUT, "%s: not UTF-8 text: %llu of its %llu bytes are invalid UTF-8 "
                         "(the first at byte offset %llu, line %llu; at most %d%% are tolerated): binary data, or "
                         "text in another encoding (convert it, e.g. iconv -f LATIN1 -t UTF-8)", path,
                         (unsigned long long)bad, (unsigned long long)n, (unsigned long long)offset,
                         (unsigned long long)line, PREP_MAX_BAD_UTF8_PERCENT);
    return STATUS_OK;
}

// Invalid UTF-8 bytes in s (n bytes); the first's index in *first (n when none).
static uint64_t utf8_count_bad(const unsigned char *s, size_t n, size_t *first) {
    uint64_t bad = 0;
    *first = n;
    for (size_t i = 0; i < n;) {
        if (i + 8 <= n) { // 8 ASCII bytes at a time
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (!(v & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        size_t k = utf8_valid_at(s + i, n - i);
        if (k) {
            i += k;
            continue;
        }
        if (bad++ == 0) *first = i;
        i++;
    }
    return bad;
}

enum status prep_check_text(const char *name, const char *text, size_t n, struct error *err) {
    const unsigned char *s = (const unsigned char *)text;
    const char *magic = binary_magic(s, n);
    if (magic) return error_set(err, STATUS_BAD_INPUT, "%s: not text: %s", name, magic);
    size_t first;
    uint64_t bad = utf8_count_bad(s, n, &first);
    const char *nul = memchr(text, 0, n);
    size_t at = nul ? (size_t)(nul - text) : first;
    uint64_t line = 1;
    for (const char *p = text; (p = memchr(p, '\n', (size_t)(text + at - p))); p++) line++;
    if (nul) return nul_error(name, at, line, 0, err);
    return utf8_check(name, bad, n, first, line, err);
}

// Checks one raw line (n bytes, its newline included) of the current file is
// text: the first line for binary magic, every line for NUL bytes, and counts
// its invalid UTF-8 bytes (judged at the end of the file).
static enum status check_line(struct doc_reader *r, const char *line, size_t n, struct error *err) {
    const char *path = r->paths[r->file];
    const unsigned char *s = (const unsigned char *)line;
    const char *magic = r->line_no == 1 ? binary_magic(s, n) : NULL;
    if (magic) return error_set(err, STATUS_BAD_INPUT, "%s: not text: %s", path, magic);
    const char *nul = memchr(line, 0, n);
    if (nul) return nul_error(path, r->file_bytes + (uint64_t)(nul - line), r->line_no, 1, err);
    size_t first;
    uint64_t bad = utf8_count_bad(s, n, &first);
    if (bad && r->bad_utf8 == 0) {
        r->first_bad = r->file_bytes + first;
        r->first_bad_line = r->line_no;
    }
    r->bad_utf8 += bad;
    r->file_bytes += n;
    return STATUS_OK;
}

// The end of the current file: refuses it when too much of it is not UTF-8.
static enum status check_file_end(struct doc_reader *r, struct error *err) {
    enum status st = utf8_check(r->paths[r->file], r->bad_utf8, r->file_bytes, r->first_bad, r->first_bad_line, err);
    if (!st) r->invalid_utf8_bytes += r->bad_utf8;
    return st;
}

static int has_suffix_ci(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcasecmp(s + n - k, suffix) == 0;
}

// The current file's format at its first non-blank line (s, n bytes): JSON
// Lines for a *.jsonl or *.json file starting with '{'. Errors:
// STATUS_BAD_INPUT for such a file starting with '[' (a JSON array, which
// read as text would become documents of JSON syntax).
static enum status decide_format(struct doc_reader *r, const char *s, size_t n, struct error *err) {
    const char *path = r->paths[r->file];
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) i++;
    int named = has_suffix_ci(path, ".jsonl") || has_suffix_ci(path, ".json");
    if (named && i < n && s[i] == '[')
        return error_set(err, STATUS_BAD_INPUT, "%s: a JSON array, not JSON Lines (one object a line): convert it "
                         "(jq -c '.[]' %s > FILE.jsonl), or give --format text to read it as text", path, path);
    int jsonl = named && i < n && s[i] == '{';
    r->file_format = jsonl ? PREP_FORMAT_JSONL : PREP_FORMAT_TEXT;
    if (!jsonl) return STATUS_OK;
    r->jsonl_files++;
    if (r->jsonl_detected++ == 0) r->first_detected = r->file;
    return STATUS_OK;
}

enum status doc_reader_next(struct doc_reader *r, const char **text, size_t *len, struct error *err) {
    *text = NULL;
    *len = 0;
    int in_doc = 0;
    size_t doc_end = 0; // the document's end after its last non-blank line
    enum status st;
    for (;;) {
        if (!r->f) {
            if (r->file + (r->started ? 1 : 0) >= r->n_paths) return STATUS_OK; // end of the corpus
            if (r->started) r->file++;
            r->started = 1;
            r->f = fopen(r->paths[r->file], "rb");
            if (!r->f) return error_set(err, STATUS_BAD_INPUT, "%s: cannot open input: %s", r->paths[r->file],
                                        strerror(errno));
            r->line_no = r->file_bytes = r->bad_utf8 = 0;
            r->file_format = r->format == PREP_FORMAT_AUTO ? -1 : (int)r->format;
            if (r->format == PREP_FORMAT_JSONL || r->format == PREP_FORMAT_CHAT) r->jsonl_files++;
        }
        ssize_t got = getline(&r->line, &r->line_cap, r->f);
        if (got < 0) {
            int bad = ferror(r->f);
            fclose(r->f);
            r->f = NULL;
            if (bad) return error_set(err, STATUS_BAD_INPUT, "%s: read error", r->paths[r->file]);
            if ((st = check_file_end(r, err))) return st;
            if (in_doc) break; // a text document ends with its file
            continue;
        }
        r->bytes_read += (uint64_t)got;
        r->line_no++;
        if ((st = check_line(r, r->line, (size_t)got, err))) return st;
        const char *line = r->line;
        size_t n = (size_t)got;
        if (r->line_no == 1 && n >= 3 && !memcmp(line, PREP_UTF8_BOM, 3)) line += 3, n -= 3; // not text: skipped
        if (n && line[n - 1] == '\n') n--;
        int blank = line_is_blank(line, n);
        if (r->file_format < 0) {
            if (blank) continue;
            if ((st = decide_format(r, line, n, err))) return st;
        }
        if (r->file_format == PREP_FORMAT_JSONL || r->file_format == PREP_FORMAT_CHAT) {
            if (blank) continue;
            if ((st = r->file_format == PREP_FORMAT_CHAT ? chat_doc(r, line, n, err) : jsonl_doc(r, line, n, err)))
                return st;
            if (r->doc_len == 0) continue; // empty documents are skipped
            *text = r->doc;
            *len = r->doc_len;
            return STATUS_OK;
        }
        // Plain text: a document is a run of non-blank lines (with
        // doc_per_file: the file's lines from the first non-blank one to the
        // last), kept with its inner newlines and without the final one (nor
        // its '\r').
        if (blank && !in_doc) continue;
        if (blank && !r->doc_per_file) break;
        if (!in_doc) r->doc_len = 0;
        doc_set(r, line, n, in_doc);
        in_doc = 1;
        if (!blank) doc_end = r->doc_len;
    }
    r->doc_len = doc_end;
    if (r->doc_len && r->doc[r->doc_len - 1] == '\r') r->doc_len--;
    *text = r->doc;
    *len = r->doc_len;
    return STATUS_OK;
}

enum status corpus_read(const struct prep_options *opt, struct corpus *out, struct error *err) {
    memset(out, 0, sizeof *out);
    struct doc_reader r;
    enum status st = doc_reader_open(&r, opt, err);
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
        st = error_set(err, STATUS_BAD_INPUT, "%s%s: no documents found in the input", opt->inputs[0],
                       opt->n_inputs > 1 ? " ..." : "");
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

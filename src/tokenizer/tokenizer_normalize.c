// tokenizer_normalize.c: the tokenizer.json "normalizer" field applied as
// Hugging Face `tokenizers` (normalizers/*.rs) applies it, and the Unicode
// White_Space test that Rust's char::is_whitespace (HF's lstrip/rstrip/Strip)
// uses. Unicode normalization forms come from utf8proc (UAX #15), never from
// tables of our own.
//
// Implemented: NFC, NFD, NFKC, NFKD, Strip, Prepend, Replace with a String
// pattern, and Sequence of these. Every other type (Lowercase, BertNormalizer,
// StripAccents, Nmt, Precompiled, ByteLevel, Replace with a Regex) is refused at
// load naming the field and value, because Rust's full Unicode lowercase, the
// SentencePiece precompiled charsmap or Rust regex semantics are not
// reproduced here.
//
// HF normalizes only valid strings; trident's input may hold invalid UTF-8:
// each maximal valid run is normalized and invalid bytes are kept as they are.
#include <string.h>
#include <utf8proc.h>

#include "tokenizer_internal.h"

// Unicode White_Space (PropList.txt), the set of Rust's char::is_whitespace.
int unicode_is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

size_t utf8_space_at(const char *s, size_t n) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &cp);
    return k > 0 && unicode_is_space((uint32_t)cp) ? (size_t)k : 0;
}

size_t utf8_space_before(const char *s, size_t n) {
    for (size_t k = 1; k <= 4 && k <= n; k++) {
        uint8_t b = (uint8_t)s[n - k];
        if ((b & 0xc0) == 0x80) continue; // a continuation byte: look further back
        return utf8_space_at(s + n - k, k) == k ? k : 0;
    }
    return 0;
}

void sbuf_add(struct sbuf *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = MAX(2 * b->cap, b->n + n + 256);
        b->s = realloc(b->s, b->cap);
        CHECK(b->s, "out of memory growing a string to %zu bytes", b->cap);
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
}

enum status normalizer_load(struct normalizer *nz, const json_t *j, const char *path, const char *field,
                            struct error *err) {
    if (!j || json_is_null(j)) return STATUS_OK;
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return error_set(err, STATUS_BAD_INPUT, "%s: %s has no \"type\"", path, field);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(j, "normalizers");
        if (!json_is_array(list))
            return error_set(err, STATUS_BAD_INPUT, "%s: %s Sequence: \"normalizers\" is not an array", path, field);
        size_t i;
        json_t *sub;
        json_array_foreach(list, i, sub) {
            char f[256];
            snprintf(f, sizeof f, "%s.normalizers[%zu]", field, i);
            enum status st = normalizer_load(nz, sub, path, f, err);
            if (st) return st;
        }
        return STATUS_OK;
    }
    struct norm_step s = {0};
    if (!strcmp(type, "NFC")) s.kind = NORM_NFC;
    else if (!strcmp(type, "NFD")) s.kind = NORM_NFD;
    else if (!strcmp(type, "NFKC")) s.kind = NORM_NFKC;
    else if (!strcmp(type, "NFKD")) s.kind = NORM_NFKD;
    else if (!strcmp(type, "Strip")) {
        s.kind = NORM_STRIP;
        s.left = json_is_true(json_object_get(j, "strip_left"));
        s.right = json_is_true(json_object_get(j, "strip_right"));
    } else if (!strcmp(type, "Prepend")) {
        const json_t *p = json_object_get(j, "prepend");
        if (!json_is_string(p)) return error_set(err, STATUS_BAD_INPUT, "%s: %s Prepend: \"prepend\" is not a string",
                                                 path, field);
        s.kind = NORM_PREPEND;
        s.lb = json_string_length(p);
        s.b = xmalloc(s.lb + 1);
        memcpy(s.b, json_string_value(p), s.lb + 1);
    } else if (!strcmp(type, "Replace")) {
        const json_t *pat = json_object_get(j, "pattern"), *c = json_object_get(j, "content");
        const json_t *lit = json_object_get(pat, "String");
        if (!json_is_string(lit) || !json_string_length(lit) || !json_is_string(c))
            return error_set(err, STATUS_BAD_INPUT, "%s: %s Replace: pattern %s not supported (only {\"String\": "
                             "non-empty} with a string \"content\")", path, field,
                             json_object_get(pat, "Regex") ? "Regex" : "(malformed)");
        s.kind = NORM_REPLACE;
        s.la = json_string_length(lit);
        s.a = xmalloc(s.la + 1);
        memcpy(s.a, json_string_value(lit), s.la + 1);
        s.lb = json_string_length(c);
        s.b = xmalloc(s.lb + 1);
        memcpy(s.b, json_string_value(c), s.lb + 1);
    } else {
        return error_set(err, STATUS_BAD_INPUT, "%s: %s type '%s' not supported (trident implements NFC, NFD, NFKC, "
                         "NFKD, Strip, Prepend, Replace with a String pattern, and Sequence of them)", path, field, type);
    }
    nz->steps = realloc(nz->steps, (size_t)(nz->n + 1) * sizeof *nz->steps);
    CHECK(nz->steps, "out of memory");
    nz->steps[nz->n++] = s;
    size_t old = nz->desc ? strlen(nz->desc) : 0, add = strlen(type) + s.la + s.lb + 16;
    nz->desc = realloc(nz->desc, old + add);
    CHECK(nz->desc, "out of memory");
    snprintf(nz->desc + old, add, "%s%d%d%s\x1f%s\x1f", type, s.left, s.right, s.a ? s.a : "", s.b ? s.b : "");
    return STATUS_OK;
}

void normalizer_free(struct normalizer *nz) {
    for (int i = 0; i < nz->n; i++) free(nz->steps[i].a), free(nz->steps[i].b);
    free(nz->steps);
    free(nz->desc);
    memset(nz, 0, sizeof *nz);
}

// One Unicode normalization form over the valid UTF-8 runs of s.
static void apply_nf(struct sbuf *out, const char *s, size_t n, int opts) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        int ascii = 1;
        while (j < n) {
            if ((uint8_t)s[j] < 0x80) {
                j++;
                continue;
            }
            utf8proc_int32_t cp;
            utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + j, (utf8proc_ssize_t)(n - j), &cp);
            if (k < 0) break;
            ascii = 0;
            j += (size_t)k;
        }
        if (ascii) sbuf_add(out, s + i, j - i); // ASCII is invariant under every form
        else {
            utf8proc_uint8_t *r = NULL;
            utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(j - i), &r, opts);
            CHECK(m >= 0, "utf8proc_map failed on valid UTF-8: %s", utf8proc_errmsg(m));
            sbuf_add(out, r, (size_t)m);
            free(r);
        }
        if (j < n) sbuf_add(out, s + j, 1), j++; // an invalid byte stays as it is
        i = j;
    }
}

static void apply_step(const struct norm_step *st, struct sbuf *out, const char *s, size_t n) {
    static const int nf_opts[] = {
        [NORM_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
        [NORM_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        [NORM_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        [NORM_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    switch (st->kind) {
    case NORM_NFC: case NORM_NFD: case NORM_NFKC: case NORM_NFKD:
        apply_nf(out, s, n, nf_opts[st->kind]);
        return;
    case NORM_STRIP: { // HF Strip: char::is_whitespace at either end
        size_t a = 0, b = n, k;
        if (st->left)
            while (a < b && (k = utf8_space_at(s + a, b - a))) a += k;
        if (st->right)
            while (b > a && (k = utf8_space_before(s + a, b - a))) b -= k;
        sbuf_add(out, s + a, b - a);
        return;
    }
    case NORM_PREPEND: // HF Prepend: only a non-empty string
        if (n) sbuf_add(out, st->b, st->lb);
        sbuf_add(out, s, n);
        return;
    case NORM_REPLACE: // HF Replace with a String: every non-overlapping match, left to right
        for (size_t i = 0; i < n;) {
            if (i + st->la <= n && !memcmp(s + i, st->a, st->la)) {
                sbuf_add(out, st->b, st->lb);
                i += st->la;
            } else {
                sbuf_add(out, s + i, 1);
                i++;
            }
        }
        return;
    }
}

char *normalizer_apply(const struct normalizer *nz, const char *text, size_t len, size_t *out_len) {
    struct sbuf cur = {0};
    sbuf_add(&cur, text, len);
    for (int i = 0; i < nz->n; i++) {
        struct sbuf next = {0};
        sbuf_add(&next, "", 0);
        apply_step(&nz->steps[i], &next, cur.s, cur.n);
        free(cur.s);
        cur = next;
    }
    *out_len = cur.n;
    return cur.s;
}

// The copy of tokenizer_utf8_sanitize (controls: C0 controls but tab and
// newline replaced too) and of tokenizer_utf8_repair (kept).
static char *utf8_replace(const char *text, size_t n, size_t *out_len, bool controls) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    char *out = xmalloc(3 * n + 1); // each invalid byte grows to 3 at most
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i,
                                              (utf8proc_ssize_t)(n - i), &cp);
        bool control = controls && k == 1 && (cp < 0x20 || cp == 0x7F) && cp != '\t' && cp != '\n';
        if (k > 0 && cp >= 0 && !control) {
            memcpy(out + o, text + i, (size_t)k), o += (size_t)k, i += (size_t)k;
        } else {
            memcpy(out + o, fffd, 3), o += 3, i++;
        }
    }
    out[o] = '\0';
    if (out_len) *out_len = o;
    return out;
}

char *tokenizer_utf8_sanitize(const char *text, size_t n, size_t *out_len) {
    return utf8_replace(text, n, out_len, true);
}

char *tokenizer_utf8_repair(const char *text, size_t n, size_t *out_len) {
    return utf8_replace(text, n, out_len, false);
}

// tokenizer_common.c: the GPT-2 byte map, hash maps and PCRE2 pre-tokenizer
// shared by tokenizer.c and tokenizer_train.c (see tokenizer_internal.h).
#include <pthread.h>
#include <string.h>

#include "tokenizer_internal.h"

static struct byte_map g_byte_map; // immutable after byte_map_build
static pthread_once_t g_byte_map_once = PTHREAD_ONCE_INIT;

// Radford et al. 2019, encoder.py bytes_to_unicode.
static void byte_map_build(void) {
    struct byte_map *m = &g_byte_map;
    int n = 0, extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        m->cp[b] = printable ? (uint16_t)b : (uint16_t)(256 + extra++);
    }
    for (int i = 0; i < 512; i++) m->byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++) m->byte_of_cp[m->cp[b]] = (int16_t)b;
    for (int cp = 0; cp < 512; cp++) // ascending code point order = GPT-2 order
        if (m->byte_of_cp[cp] >= 0) {
            m->order[n] = (uint8_t)m->byte_of_cp[cp];
            m->rank[m->byte_of_cp[cp]] = (uint8_t)n;
            n++;
        }
    for (int b = 0; b < 256; b++) {
        unsigned cp = m->cp[b];
        if (cp < 0x80) {
            m->utf8[b][0] = (char)cp;
            m->utf8_len[b] = 1;
        } else {
            m->utf8[b][0] = (char)(0xC0 | (cp >> 6));
            m->utf8[b][1] = (char)(0x80 | (cp & 0x3F));
            m->utf8_len[b] = 2;
        }
    }
}

const struct byte_map *byte_map_get(void) {
    pthread_once(&g_byte_map_once, byte_map_build);
    return &g_byte_map;
}

size_t byte_map_encode(const uint8_t *raw, size_t len, char *out) {
    const struct byte_map *m = byte_map_get();
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        memcpy(out + k, m->utf8[raw[i]], m->utf8_len[raw[i]]);
        k += m->utf8_len[raw[i]];
    }
    out[k] = 0;
    return k;
}

int byte_map_decode(const char *s, size_t len, uint8_t *out, size_t *out_len) {
    const struct byte_map *m = byte_map_get();
    const uint8_t *u = (const uint8_t *)s;
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        unsigned cp;
        if (u[i] < 0x80) cp = u[i++];
        else if ((u[i] & 0xE0) == 0xC0 && i + 1 < len) {
            cp = (unsigned)(u[i] & 0x1F) << 6 | (u[i + 1] & 0x3F);
            i += 2;
        } else return 0; // code points >= U+0800 are never in the map
        if (cp >= 512 || m->byte_of_cp[cp] < 0) return 0;
        out[k++] = (uint8_t)m->byte_of_cp[cp];
    }
    *out_len = k;
    return 1;
}

// ---------------------------------------------------------------- hash maps

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p; // FNV-1a, then a finalizer so low bits mix well
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

void strmap_init(struct strmap *m, size_t cap_hint) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(cap_hint * 2);
    m->hash = xcalloc(m->cap, sizeof *m->hash);
    m->key_off = xmalloc(m->cap * sizeof *m->key_off);
    m->key_len = xmalloc(m->cap * sizeof *m->key_len);
    m->val = xmalloc(m->cap * sizeof *m->val);
}

void strmap_free(struct strmap *m) {
    free(m->hash);
    free(m->key_off);
    free(m->key_len);
    free(m->val);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static size_t strmap_find(const struct strmap *m, uint64_t h, const void *key, size_t len) {
    size_t mask = m->cap - 1, i = h & mask;
    while (m->hash[i]) {
        if (m->hash[i] == h && m->key_len[i] == len && !memcmp(m->arena + m->key_off[i], key, len)) return i;
        i = (i + 1) & mask;
    }
    return i;
}

int64_t *strmap_get(const struct strmap *m, const void *key, size_t len) {
    size_t i = strmap_find(m, hash_bytes(key, len), key, len);
    return m->hash[i] ? &m->val[i] : NULL;
}

static void strmap_grow(struct strmap *m) {
    struct strmap old = *m;
    m->cap *= 2;
    m->hash = xcalloc(m->cap, sizeof *m->hash);
    m->key_off = xmalloc(m->cap * sizeof *m->key_off);
    m->key_len = xmalloc(m->cap * sizeof *m->key_len);
    m->val = xmalloc(m->cap * sizeof *m->val);
    for (size_t j = 0; j < old.cap; j++) {
        if (!old.hash[j]) continue;
        size_t i = old.hash[j] & (m->cap - 1);
        while (m->hash[i]) i = (i + 1) & (m->cap - 1);
        m->hash[i] = old.hash[j];
        m->key_off[i] = old.key_off[j];
        m->key_len[i] = old.key_len[j];
        m->val[i] = old.val[j];
    }
    free(old.hash);
    free(old.key_off);
    free(old.key_len);
    free(old.val);
}

int64_t *strmap_put(struct strmap *m, const void *key, size_t len, int64_t val, int *inserted) {
    uint64_t h = hash_bytes(key, len);
    size_t i = strmap_find(m, h, key, len);
    if (inserted) *inserted = !m->hash[i];
    if (m->hash[i]) return &m->val[i];
    if (2 * (m->n + 1) > m->cap) {
        strmap_grow(m);
        i = strmap_find(m, h, key, len);
    }
    if (m->arena_len + len > m->arena_cap) {
        m->arena_cap = MAX(2 * m->arena_cap, m->arena_len + len + 4096);
        char *a = realloc(m->arena, m->arena_cap);
        CHECK(a, "out of memory growing a string map to %zu bytes", m->arena_cap);
        m->arena = a;
    }
    memcpy(m->arena + m->arena_len, key, len);
    m->hash[i] = h;
    m->key_off[i] = m->arena_len;
    m->key_len[i] = (uint32_t)len;
    m->val[i] = val;
    m->arena_len += len;
    m->n++;
    return &m->val[i];
}

void u64map_init(struct u64map *m, size_t cap_hint) {
    m->cap = pow2_at_least(cap_hint * 2);
    m->n = 0;
    m->key = xmalloc(m->cap * sizeof *m->key);
    memset(m->key, 0xFF, m->cap * sizeof *m->key);
    m->val = xmalloc(m->cap * sizeof *m->val);
}

void u64map_free(struct u64map *m) {
    free(m->key);
    free(m->val);
    memset(m, 0, sizeof *m);
}

static inline size_t u64_slot(const struct u64map *m, uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t mask = m->cap - 1, i = (h >> 20) & mask;
    while (m->key[i] != UINT64_MAX && m->key[i] != key) i = (i + 1) & mask;
    return i;
}

int64_t *u64map_get(const struct u64map *m, uint64_t key) {
    size_t i = u64_slot(m, key);
    return m->key[i] == key ? &m->val[i] : NULL;
}

int64_t *u64map_put(struct u64map *m, uint64_t key, int64_t val, int *inserted) {
    size_t i = u64_slot(m, key);
    if (inserted) *inserted = m->key[i] != key;
    if (m->key[i] == key) return &m->val[i];
    if (2 * (m->n + 1) > m->cap) {
        struct u64map old = *m;
        u64map_init(m, old.cap);
        for (size_t j = 0; j < old.cap; j++)
            if (old.key[j] != UINT64_MAX) {
                size_t k = u64_slot(m, old.key[j]);
                m->key[k] = old.key[j];
                m->val[k] = old.val[j];
                m->n++;
            }
        u64map_free(&old);
        i = u64_slot(m, key);
    }
    m->key[i] = key;
    m->val[i] = val;
    m->n++;
    return &m->val[i];
}

// ------------------------------------------------------------ pre-tokenizer

enum status pretok_add(struct pretok *p, const char *pattern, int literal, int prefix_space,
                       const char *what, struct error *err) {
    if (p->n == PRETOK_MAX_STAGES)
        return error_set(err, STATUS_BAD_INPUT, "%s: more than %d pre-tokenizer stages", what, PRETOK_MAX_STAGES);
    pcre2_code *re = NULL;
    if (pattern) {
        int code;
        PCRE2_SIZE off;
        uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
        re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &code, &off, NULL);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(code, msg, sizeof msg);
            return error_set(err, STATUS_BAD_INPUT, "%s: regex '%s' does not compile at offset %zu: %s",
                             what, pattern, (size_t)off, (char *)msg);
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); // falls back to the interpreter if JIT is absent
    }
    p->re[p->n] = re;
    p->prefix_space[p->n] = prefix_space;
    p->n++;
    return STATUS_OK;
}

void pretok_free(struct pretok *p) {
    for (int i = 0; i < p->n; i++) pcre2_code_free(p->re[i]);
    p->n = 0;
}

struct pretok_run_ctx {
    const struct pretok *p;
    pcre2_match_data *md[PRETOK_MAX_STAGES];
    pretok_fn fn;
    void *ctx;
    struct error *err;
};

static enum status pretok_stage(struct pretok_run_ctx *c, int s, const char *text, size_t len) {
    if (len == 0) return STATUS_OK; // HF drops empty pieces
    if (s == c->p->n) {
        c->fn(c->ctx, text, len);
        return STATUS_OK;
    }
    char *owned = NULL;
    if (c->p->prefix_space[s] && text[0] != ' ') {
        owned = xmalloc(len + 1);
        owned[0] = ' ';
        memcpy(owned + 1, text, len);
        text = owned;
        len++;
    }
    enum status st = STATUS_OK;
    pcre2_code *re = c->p->re[s];
    if (!re) {
        st = pretok_stage(c, s + 1, text, len);
        free(owned);
        return st;
    }
    size_t pos = 0, prev = 0; // prev: end of the last emitted piece
    while (pos <= len && st == STATUS_OK) {
        int rc = pcre2_match(re, (PCRE2_SPTR)text, len, pos, 0, c->md[s], NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            st = error_set(c->err, STATUS_RUNTIME, "pre-tokenizer regex failed at byte %zu: %s", pos, (char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md[s]);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { // empty match: step one byte (past a whole UTF-8 character)
            pos = ms + 1;
            while (pos < len && ((uint8_t)text[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > prev) st = pretok_stage(c, s + 1, text + prev, ms - prev);
        if (st == STATUS_OK) st = pretok_stage(c, s + 1, text + ms, me - ms);
        prev = pos = me;
    }
    if (st == STATUS_OK && prev < len) st = pretok_stage(c, s + 1, text + prev, len - prev);
    free(owned);
    return st;
}

enum status pretok_run(const struct pretok *p, const char *text, size_t len, pretok_fn fn,
                       void *ctx, struct error *err) {
    struct pretok_run_ctx c = {.p = p, .fn = fn, .ctx = ctx, .err = err};
    for (int s = 0; s < p->n; s++)
        if (p->re[s]) c.md[s] = pcre2_match_data_create_from_pattern(p->re[s], NULL);
    enum status st = pretok_stage(&c, 0, text, len);
    for (int s = 0; s < p->n; s++) pcre2_match_data_free(c.md[s]);
    return st;
}

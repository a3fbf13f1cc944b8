// chat.c: chat templates as data (chat.h).
#include "chat.h"

#include <stdlib.h>
#include <string.h>

static const char *const names[CHAT_TEMPLATE_COUNT] = {"plain", "llama3", "chatml"};

const char *chat_template_name(enum chat_template t) {
    return t >= 0 && t < CHAT_TEMPLATE_COUNT ? names[t] : "?";
}

int chat_template_parse(const char *s) {
    for (int t = 0; t < CHAT_TEMPLATE_COUNT; t++)
        if (!strcmp(s, names[t])) return t;
    return -1;
}

// Each renders what the C code below renders; the tokens (bos included) are
// written out so that the folder's bos_token does not change the text.
static const char jinja_plain[] =
    "{%- for message in messages %}"
    "{%- if not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- {'system': 'System:', 'user': 'User:', 'assistant': 'Assistant:'}[message['role']] + ' ' + "
    "message['content'] }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '\\nAssistant:' }}{%- endif %}";
static const char jinja_llama3[] =
    "{{- '<|begin_of_text|>' }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: 26 Jul 2024\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";
static const char jinja_chatml[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

const char *chat_template_jinja(enum chat_template t) {
    return t == CHAT_TEMPLATE_LLAMA3 ? jinja_llama3 : t == CHAT_TEMPLATE_CHATML ? jinja_chatml : jinja_plain;
}

const char *chat_template_end_token(enum chat_template t) {
    return t == CHAT_TEMPLATE_LLAMA3 ? "<|eot_id|>" : t == CHAT_TEMPLATE_CHATML ? "<|im_end|>" : NULL;
}

static const char *const llama3_specials[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                              "<|eot_id|>", NULL};
static const char *const chatml_specials[] = {"<|im_start|>", "<|im_end|>", NULL};

// The id of special token s, or -1 when it does not encode to one id.
static int32_t special_id(const struct tokenizer *tok, const char *s, size_t n) {
    int32_t *ids = NULL, id = -1;
    size_t k = 0;
    struct error e;
    if (tokenizer_encode(tok, s, n, 1, &ids, &k, &e) == STATUS_OK && k == 1) id = ids[0];
    free(ids);
    return id;
}

enum status chat_template_check(const struct tokenizer *tok, enum chat_template t, struct error *err) {
    const char *const *sp = t == CHAT_TEMPLATE_LLAMA3 ? llama3_specials : t == CHAT_TEMPLATE_CHATML ? chatml_specials
                                                                                                  : NULL;
    for (; sp && *sp; sp++)
        if (special_id(tok, *sp, strlen(*sp)) < 0)
            return error_set(err, STATUS_BAD_INPUT, "--chat-template %s writes the special token %s, which the "
                             "tokenizer (identity %s) does not have as one token: use the tokenizer.json of a "
                             "model of that family, or --chat-template plain", names[t], *sp,
                             tokenizer_identity(tok));
    return STATUS_OK;
}

// Python's str.isspace (Jinja's trim is str.strip()): White_Space plus the
// separators U+001C..U+001F, less U+180E.
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code point of the valid UTF-8 sequence at s (n bytes left) and its
// length in *k, or 0x110000 when none starts there (such bytes are never space).
static uint32_t utf8_at(const unsigned char *s, size_t n, size_t *k) {
    *k = 1;
    if (s[0] < 0x80) return s[0];
    size_t m = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    if (!m || m > n) return 0x110000;
    uint32_t c = s[0] & (0x7f >> m);
    for (size_t i = 1; i < m; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0x110000;
        c = c << 6 | (s[i] & 0x3f);
    }
    if ((m == 3 && (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))) || (m == 4 && (c < 0x10000 || c > 0x10ffff)))
        return 0x110000;
    *k = m;
    return c;
}

// Python's str.strip() of s (n bytes): *a and *b the kept range.
static void py_strip(const char *s, size_t n, size_t *a, size_t *b) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, k, last = 0;
    while (i < n && py_space(utf8_at(u + i, n - i, &k))) i += k;
    *a = i;
    for (size_t j = i; j < n; j += k) // the end of the last non-space character
        if (!py_space(utf8_at(u + j, n - j, &k))) last = j + k;
    *b = MAX(last, i);
}

struct out {
    char **buf;
    size_t *len, *cap;
};

static void put(struct out *o, int tag, const char *s, size_t n) {
    if (*o->len + n + 5 > *o->cap) {
        *o->cap = MAX(2 * *o->cap, *o->len + n + 5 + 256);
        char *b = realloc(*o->buf, *o->cap);
        CHECK(b, "out of memory rendering a conversation of %zu bytes", *o->len + n);
        *o->buf = b;
    }
    char *p = *o->buf + *o->len;
    p[0] = (char)tag;
    uint32_t m = (uint32_t)n;
    for (int i = 0; i < 4; i++) p[1 + i] = (char)(m >> (8 * i));
    memcpy(p + 5, s, n);
    *o->len += n + 5;
}
static void put_str(struct out *o, int tag, const char *s) { put(o, tag, s, strlen(s)); }

enum status chat_render(enum chat_template t, const struct chat_msg *m, size_t n, int add_generation_prompt,
                        char **buf, size_t *len, size_t *cap, struct error *err) {
    struct out o = {buf, len, cap};
    const int S = CHAT_PIECE_SPECIAL, T = CHAT_PIECE_TRAIN;
    for (size_t i = 0; i < n; i++) {
        const char *r = m[i].role;
        size_t rl = m[i].role_len;
        if (!((rl == 6 && !memcmp(r, "system", 6)) || (rl == 4 && !memcmp(r, "user", 4)) ||
              (rl == 9 && !memcmp(r, "assistant", 9))))
            return error_set(err, STATUS_BAD_INPUT, "messages[%zu]: role '%.*s': expected system, user or assistant",
                             i, (int)MIN(rl, 40), r);
    }
    size_t i = 0;
    if (t == CHAT_TEMPLATE_LLAMA3) {
        put_str(&o, S, "<|begin_of_text|>");
        put_str(&o, S, "<|start_header_id|>");
        put_str(&o, 0, "system");
        put_str(&o, S, "<|end_header_id|>");
        put_str(&o, 0, "\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
        if (n > 0 && m[0].role_len == 6 && !memcmp(m[0].role, "system", 6)) {
            size_t a, b;
            py_strip(m[0].content, m[0].content_len, &a, &b);
            put(&o, 0, m[0].content + a, b - a);
            i = 1;
        }
        put_str(&o, S, "<|eot_id|>");
    }
    for (; i < n; i++) {
        int tr = m[i].role_len == 9 ? T : 0; // assistant
        put_str(&o, S, t == CHAT_TEMPLATE_LLAMA3 ? "<|start_header_id|>" : "<|im_start|>");
        put(&o, 0, m[i].role, m[i].role_len);
        size_t a = 0, b = m[i].content_len;
        if (t == CHAT_TEMPLATE_LLAMA3) {
            put_str(&o, S, "<|end_header_id|>");
            put_str(&o, 0, "\n\n");
            py_strip(m[i].content, m[i].content_len, &a, &b);
        } else {
            put_str(&o, 0, "\n");
        }
        put(&o, tr, m[i].content + a, b - a);
        put_str(&o, S | tr, t == CHAT_TEMPLATE_LLAMA3 ? "<|eot_id|>" : "<|im_end|>");
        if (t == CHAT_TEMPLATE_CHATML) put_str(&o, 0, "\n");
    }
    if (add_generation_prompt) {
        if (t == CHAT_TEMPLATE_LLAMA3) {
            put_str(&o, S, "<|start_header_id|>");
            put_str(&o, 0, "assistant");
            put_str(&o, S, "<|end_header_id|>");
            put_str(&o, 0, "\n\n");
        } else {
            put_str(&o, S, "<|im_start|>");
            put_str(&o, 0, "assistant\n");
        }
    }
    return STATUS_OK;
}

struct piece {
    int tag;
    const char *s;
    size_t n;
};

static struct piece piece_at(const char *p, size_t left, size_t *used) {
    struct piece x = {0};
    if (left < 5) return *used = left, x;
    uint32_t m = 0;
    for (int i = 0; i < 4; i++) m |= (uint32_t)(uint8_t)p[1 + i] << (8 * i);
    x.tag = (uint8_t)p[0], x.s = p + 5, x.n = MIN((size_t)m, left - 5);
    *used = 5 + x.n;
    return x;
}

struct ids {
    int32_t *id;
    uint8_t *mask;
    size_t n, cap;
};

static void ids_add(struct ids *v, const int32_t *id, size_t k, uint8_t mask) {
    if (v->n + k > v->cap) {
        v->cap = MAX(2 * v->cap, v->n + k + 64);
        v->id = realloc(v->id, v->cap * sizeof *v->id), v->mask = realloc(v->mask, v->cap);
        CHECK(v->id && v->mask, "out of memory");
    }
    memcpy(v->id + v->n, id, k * sizeof *id);
    memset(v->mask + v->n, mask, k);
    v->n += k;
}

// Encodes the text pieces p[0, np) as one text; each token's mask is its
// piece's, a token straddling a change of mask taking the later piece's.
static enum status encode_run(const struct tokenizer *tok, const struct piece *p, int np, int allow_special,
                              struct ids *v, struct error *err) {
    size_t total = 0;
    for (int i = 0; i < np; i++) total += p[i].n;
    if (!total) return STATUS_OK;
    char *text = xmalloc(total + 1);
    size_t at = 0;
    for (int i = 0; i < np; i++) memcpy(text + at, p[i].s, p[i].n), at += p[i].n;
    int32_t *ids = NULL;
    size_t k = 0;
    enum status st = tokenizer_encode(tok, text, total, allow_special, &ids, &k, err);
    if (st) return free(text), st;
    uint8_t *mask = xmalloc(k ? k : 1);
    memset(mask, p[0].tag & CHAT_PIECE_TRAIN, k);
    at = p[0].n;
    for (int i = 1; i < np && !st; at += p[i].n, i++) {
        if ((p[i].tag & CHAT_PIECE_TRAIN) == (p[i - 1].tag & CHAT_PIECE_TRAIN)) continue;
        int32_t *pre = NULL;
        size_t kp = 0, b = 0;
        if (at > 0 && (st = tokenizer_encode(tok, text, at, allow_special, &pre, &kp, err))) break;
        while (b < kp && b < k && pre[b] == ids[b]) b++;
        memset(mask + b, p[i].tag & CHAT_PIECE_TRAIN, k - b);
        free(pre);
    }
    for (size_t j = 0; j < k && !st; j++) ids_add(v, ids + j, 1, mask[j]);
    free(ids), free(mask), free(text);
    return st;
}

enum status chat_encode(const struct tokenizer *tok, const char *pieces, size_t len, int allow_special,
                        int32_t **ids, uint8_t **mask, size_t *n, struct error *err) {
    struct ids v = {0};
    struct piece run[64];
    int nr = 0;
    enum status st = STATUS_OK;
    for (size_t at = 0, used; at < len && !st; at += used) {
        struct piece p = piece_at(pieces + at, len - at, &used);
        if (!(p.tag & CHAT_PIECE_SPECIAL)) {
            if (nr == (int)(sizeof run / sizeof run[0])) { // never: the templates put at most 3 between two tokens
                st = encode_run(tok, run, nr, allow_special, &v, err);
                nr = 0;
            }
            run[nr++] = p;
            continue;
        }
        st = encode_run(tok, run, nr, allow_special, &v, err);
        nr = 0;
        int32_t id = st ? -1 : special_id(tok, p.s, p.n);
        if (!st && id < 0)
            st = error_set(err, STATUS_BAD_INPUT, "the chat template's token %.*s is not one token of this tokenizer",
                           (int)MIN(p.n, 40), p.s);
        if (!st) ids_add(&v, &id, 1, p.tag & CHAT_PIECE_TRAIN);
    }
    if (!st) st = encode_run(tok, run, nr, allow_special, &v, err);
    if (st) {
        free(v.id), free(v.mask);
        return st;
    }
    if (!v.id) v.id = xmalloc(sizeof *v.id), v.mask = xmalloc(1);
    *ids = v.id, *mask = v.mask, *n = v.n;
    return STATUS_OK;
}

// tokenizer_internal.h: pieces shared by the tokenizer's loader/encoder
// (tokenizer.c) and its trainer (tokenizer_train.c): the GPT-2 byte map, two
// small open-addressing hash maps and the PCRE2 pre-tokenizer.
#ifndef TRIDENT_TOKENIZER_INTERNAL_H
#define TRIDENT_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>

#include "base/common.h"

// The GPT-2 split pattern (Radford et al. 2019; HF ByteLevel use_regex=true).
#define TOKENIZER_GPT2_PATTERN \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

// GPT-2 bytes_to_unicode: byte b is written as code point byte_map_cp[b]
// (printable Latin-1 bytes map to themselves, the other 68 to U+0100..U+0143).
// byte_map_order[i] is the byte of the i-th entry in GPT-2's order, which is
// also ascending code point order: GPT-2's vocab ids 0..255 and the order HF's
// BpeTrainer sorts its alphabet in.
struct byte_map {
    uint16_t cp[256];           // byte -> code point
    int16_t byte_of_cp[512];    // code point -> byte, -1 when none
    uint8_t order[256];         // GPT-2 order -> byte
    uint8_t rank[256];          // byte -> position in GPT-2 order
    char utf8[256][3];          // byte -> its code point in UTF-8
    uint8_t utf8_len[256];
};
const struct byte_map *byte_map_get(void);

// Writes the byte-mapped UTF-8 spelling of len raw bytes to out (room for
// 2*len+1), NUL-terminated; returns its length.
size_t byte_map_encode(const uint8_t *raw, size_t len, char *out);
// Inverts byte_map_encode on a token string. Returns 1 and writes the raw bytes
// (at most len) to out when every character is in the map, else 0 (HF's
// ByteLevel decoder then keeps the string's own UTF-8 bytes).
int byte_map_decode(const char *s, size_t len, uint8_t *out, size_t *out_len);

// Byte string -> int64 map. Keys are copied into an arena.
struct strmap {
    uint64_t *hash;   // (cap) 0 = empty slot
    size_t *key_off;  // (cap)
    uint32_t *key_len;// (cap)
    int64_t *val;     // (cap)
    size_t cap, n;
    char *arena;
    size_t arena_len, arena_cap;
};
void strmap_init(struct strmap *m, size_t cap_hint);
void strmap_free(struct strmap *m);
int64_t *strmap_get(const struct strmap *m, const void *key, size_t len);
// Returns the value slot for key, inserting it with val when absent.
int64_t *strmap_put(struct strmap *m, const void *key, size_t len, int64_t val, int *inserted);

// uint64 -> int64 map (token pairs packed as a << 32 | b).
struct u64map {
    uint64_t *key;    // (cap) UINT64_MAX = empty
    int64_t *val;     // (cap)
    size_t cap, n;
};
void u64map_init(struct u64map *m, size_t cap_hint);
void u64map_free(struct u64map *m);
int64_t *u64map_get(const struct u64map *m, uint64_t key);
int64_t *u64map_put(struct u64map *m, uint64_t key, int64_t val, int *inserted);

static inline uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

// A pre-tokenizer: stages applied in turn, each optionally prepending a space
// (ByteLevel add_prefix_space) and splitting with a regex, keeping matches and
// the text between them (HF Split behavior "Isolated").
#define PRETOK_MAX_STAGES 8
struct pretok {
    pcre2_code *re[PRETOK_MAX_STAGES];   // NULL: the stage does not split
    int prefix_space[PRETOK_MAX_STAGES];
    int n;
};
// Adds a stage; pattern NULL for none. literal: pattern is a plain string.
// Errors: STATUS_BAD_INPUT with the PCRE2 message, prefixed by what.
enum status pretok_add(struct pretok *p, const char *pattern, int literal, int prefix_space,
                       const char *what, struct error *err);
void pretok_free(struct pretok *p);
typedef void (*pretok_fn)(void *ctx, const char *piece, size_t len);
// Calls fn on every pre-token of text, in order. Invalid UTF-8 never matches
// (PCRE2_MATCH_INVALID_UTF), so invalid bytes land in the between-match pieces.
enum status pretok_run(const struct pretok *p, const char *text, size_t len, pretok_fn fn,
                       void *ctx, struct error *err);

// Growable int32 buffer.
struct ibuf {
    int32_t *v;
    size_t n, cap;
};
static inline void ibuf_push(struct ibuf *b, int32_t x) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        int32_t *v = realloc(b->v, b->cap * sizeof *v);
        CHECK(v, "out of memory growing an int buffer to %zu", b->cap);
        b->v = v;
    }
    b->v[b->n++] = x;
}

// Growable byte string, always NUL-terminated once anything was added.
struct sbuf {
    char *s;
    size_t n, cap;
};
void sbuf_add(struct sbuf *b, const void *p, size_t n);

// Unicode White_Space (Rust's char::is_whitespace, used by HF's lstrip/rstrip).
int unicode_is_space(uint32_t cp);
// Bytes of the whitespace character that starts s[0, n) / ends s[0, n), or 0
// when there is none (or the bytes are not valid UTF-8).
size_t utf8_space_at(const char *s, size_t n);
size_t utf8_space_before(const char *s, size_t n);

// The tokenizer.json "normalizer" (tokenizer_normalize.c): a list of steps.
enum norm_kind { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_STRIP, NORM_PREPEND, NORM_REPLACE };
struct norm_step {
    enum norm_kind kind;
    int left, right;   // Strip
    char *a, *b;       // Replace: pattern a -> content b; Prepend: b
    size_t la, lb;
};
struct normalizer {
    struct norm_step *steps; // (n) applied in order
    int n;
    char *desc;              // the steps as text, part of the identity; NULL when none
};
// Appends the steps of j (null: none) to nz. Errors: STATUS_BAD_INPUT naming
// path, field and the unsupported type or pattern.
enum status normalizer_load(struct normalizer *nz, const json_t *j, const char *path, const char *field,
                            struct error *err);
void normalizer_free(struct normalizer *nz);
// The normalized text, malloc'd and NUL-terminated; *out_len its length.
char *normalizer_apply(const struct normalizer *nz, const char *text, size_t len, size_t *out_len);

#endif

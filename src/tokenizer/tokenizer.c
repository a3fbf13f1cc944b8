// tokenizer.c: loads a Hugging Face byte-level BPE tokenizer.json and encodes
// and decodes with it, matching HF `tokenizers` id for id (see tokenizer.h).
//
// Tokens are held as raw bytes: the GPT-2 byte map (tokenizer_common.c) is
// undone at load time, so encoding works on the input bytes directly.
//
// Invalid UTF-8 (HF only ever sees valid strings): the regex runs with
// PCRE2_MATCH_INVALID_UTF, under which invalid bytes never match, so each
// maximal run of them between two matches becomes a pre-token of its own and
// goes through BPE like any other (all 256 bytes are tokens, so nothing is
// lost and decode(encode(x)) == x).
//
// Every field of tokenizer.json is applied as HF applies it or refused at load
// with a message naming the field and value:
//   normalizer      NFC/NFD/NFKC/NFKD (utf8proc), Strip, Prepend, Replace
//                   (String), Sequence: tokenizer_normalize.c; others refused
//   pre_tokenizer   ByteLevel, Split (behavior Isolated, invert false),
//                   Sequence; others refused
//   model           BPE (byte-level: no continuing_subword_prefix,
//                   end_of_word_suffix, dropout or byte_fallback), ignore_merges
//   added_tokens    lstrip/rstrip strip Unicode White_Space as HF does;
//                   normalized=true tokens match on the normalized text,
//                   normalized=false on the raw text first; special=true ones
//                   only when the caller allows special tokens (HF's
//                   encode_special_tokens=False), else they are plain text;
//                   single_word=true is refused
//   post_processor  ByteLevel, TemplateProcessing, RobertaProcessing,
//                   BertProcessing, Sequence: encode is HF's
//                   encode(add_special_tokens=False), on which none of them
//                   changes an id; others refused
//   decoder         ByteLevel; others refused
//   truncation, padding   must be null (they would change encode's output)
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer.h"
#include "tokenizer_internal.h"

struct added_token {
    int32_t id;
    char *content;
    size_t len;
    int lstrip, rstrip, special;
};

struct tokenizer {
    int vocab_size;              // max id + 1
    int eot_id;
    size_t *tok_off;             // (V) offset of each id's bytes in tok_bytes; SIZE_MAX: no token
    uint32_t *tok_len;           // (V)
    char *tok_bytes;             // decoded bytes of every token, back to back
    int32_t byte_id[256];        // raw byte -> token id
    struct strmap vocab;         // raw bytes -> id (model vocab only)
    struct u64map merges;        // pair_key(a, b) -> rank << 32 | new id
    int ignore_merges;
    struct added_token *added;   // (n_added)
    int n_added;
    int *added_by_byte[2][256];  // [normalized][first byte] -> -1-terminated indices, longest first
    struct normalizer norm;      // applied to text between normalized=false added tokens
    struct pretok pre;
    char *pre_desc;              // the stages as text, part of the identity
    char identity[33];
    // Word cache: pre-token bytes -> offset of [n, ids...] in cache_ids. Shared
    // by concurrent encoders under cache_lock (read-locked for lookups, which are most calls).
    pthread_rwlock_t cache_lock;
    struct strmap cache;
    struct ibuf cache_ids;
};

#define CACHE_MAX_WORDS (1u << 20)
#define CACHE_MAX_WORD_LEN 256

// ------------------------------------------------------------------ loading

static const char *json_type_name(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static int json_flag(const json_t *obj, const char *key, int dflt) {
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static enum status add_stage(struct tokenizer *t, const char *pattern, int literal, int prefix, const char *what,
                             struct error *err) {
    size_t old = t->pre_desc ? strlen(t->pre_desc) : 0, add = (pattern ? strlen(pattern) : 0) + 8;
    t->pre_desc = realloc(t->pre_desc, old + add);
    CHECK(t->pre_desc, "out of memory");
    snprintf(t->pre_desc + old, add, "%d%d%s\x1f", literal, prefix, pattern ? pattern : "");
    return pretok_add(&t->pre, pattern, literal, prefix, what, err);
}

// Adds the stages of one pre-tokenizer object (ByteLevel, Split or Sequence).
static enum status load_pretok(struct tokenizer *t, const json_t *pt, const char *path, int *saw_byte_level,
                               struct error *err) {
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (!type) return error_set(err, STATUS_BAD_INPUT, "%s: pre_tokenizer has no \"type\"", path);
    char what[1100];
    snprintf(what, sizeof what, "%s: pre_tokenizer %s", path, type);
    if (!strcmp(type, "ByteLevel")) {
        *saw_byte_level = 1;
        int prefix = json_flag(pt, "add_prefix_space", 1), use_regex = json_flag(pt, "use_regex", 1);
        if (!prefix && !use_regex) return STATUS_OK;
        return add_stage(t, use_regex ? TOKENIZER_GPT2_PATTERN : NULL, 0, prefix, what, err);
    }
    if (!strcmp(type, "Split")) {
        const json_t *pat = json_object_get(pt, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        const char *beh = json_string_value(json_object_get(pt, "behavior"));
        if (!re && !lit)
            return error_set(err, STATUS_BAD_INPUT, "%s: \"pattern\" must be {\"Regex\": ...} or {\"String\": ...}", what);
        if (!beh || strcmp(beh, "Isolated"))
            return error_set(err, STATUS_BAD_INPUT, "%s: behavior '%s' not supported (expected Isolated)", what,
                             beh ? beh : "(missing)");
        if (json_flag(pt, "invert", 0))
            return error_set(err, STATUS_BAD_INPUT, "%s: invert=true not supported", what);
        return add_stage(t, re ? re : lit, !re, 0, what, err);
    }
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(pt, "pretokenizers");
        if (!json_is_array(list)) return error_set(err, STATUS_BAD_INPUT, "%s: \"pretokenizers\" is not an array", what);
        size_t i;
        json_t *sub;
        json_array_foreach(list, i, sub) {
            enum status st = load_pretok(t, sub, path, saw_byte_level, err);
            if (st) return st;
        }
        return STATUS_OK;
    }
    return error_set(err, STATUS_BAD_INPUT, "%s: pre_tokenizer type '%s' not supported (expected ByteLevel, Split or Sequence)",
                     path, type);
}

static int32_t vocab_lookup(const struct tokenizer *t, const json_t *vocab_json, const char *s, size_t len) {
    json_t *v = json_object_getn(vocab_json, s, len);
    return json_is_integer(v) ? (int32_t)json_integer_value(v) : -1;
}

static enum status load_merges(struct tokenizer *t, const json_t *model, const json_t *vocab, const char *path,
                               struct error *err) {
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges))
        return error_set(err, STATUS_BAD_INPUT, "%s: model.merges is %s, expected an array", path,
                         merges ? json_type_name(merges) : "missing");
    u64map_init(&t->merges, json_array_size(merges));
    size_t rank;
    json_t *m;
    char *joined = NULL;
    size_t joined_cap = 0;
    enum status st = STATUS_OK;
    json_array_foreach(merges, rank, m) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) { // "a b": tokens never hold a real space (it is mapped to U+0120)
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = error_set(err, STATUS_BAD_INPUT, "%s: model.merges[%zu] = \"%s\", expected \"A B\"", path, rank, a);
                break;
            }
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            la = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            lb = json_string_length(json_array_get(m, 1));
        } else {
            st = error_set(err, STATUS_BAD_INPUT, "%s: model.merges[%zu] is %s, expected \"A B\" or [\"A\", \"B\"]",
                           path, rank, json_type_name(m));
            break;
        }
        if (la + lb + 1 > joined_cap) {
            joined_cap = 2 * (la + lb + 1);
            free(joined);
            joined = xmalloc(joined_cap);
        }
        memcpy(joined, a, la);
        memcpy(joined + la, b, lb);
        int32_t ia = vocab_lookup(t, vocab, a, la), ib = vocab_lookup(t, vocab, b, lb);
        int32_t inew = vocab_lookup(t, vocab, joined, la + lb);
        if (ia < 0 || ib < 0 || inew < 0) {
            joined[la + lb] = 0;
            st = error_set(err, STATUS_BAD_INPUT, "%s: model.merges[%zu]: token '%.*s' is not in model.vocab", path,
                           rank, ia < 0 ? (int)la : ib < 0 ? (int)lb : (int)(la + lb), ia < 0 ? a : ib < 0 ? b : joined);
            break;
        }
        int inserted;
        u64map_put(&t->merges, pair_key(ia, ib), (int64_t)rank << 32 | (uint32_t)inew, &inserted); // first rank wins
    }
    free(joined);
    return st;
}

static enum status load_added(struct tokenizer *t, const json_t *added, const char *path, struct error *err) {
    if (!added || json_is_null(added)) return STATUS_OK;
    if (!json_is_array(added))
        return error_set(err, STATUS_BAD_INPUT, "%s: added_tokens is %s, expected an array", path, json_type_name(added));
    t->added = xcalloc(json_array_size(added), sizeof *t->added);
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX ||
            !json_is_string(content) || !json_string_length(content))
            return error_set(err, STATUS_BAD_INPUT, "%s: added_tokens[%zu] needs an integer \"id\" in [0, %d] (found "
                             "%s %" PRId64 ") and a non-empty \"content\"", path, i, INT32_MAX,
                             id ? json_type_name(id) : "no id", json_is_integer(id) ? (int64_t)json_integer_value(id) : 0);
        if (json_flag(a, "single_word", 0))
            return error_set(err, STATUS_BAD_INPUT, "%s: added_tokens[%zu].single_word = true ('%s') not supported",
                             path, i, json_string_value(content));
        struct added_token *at = &t->added[t->n_added++];
        at->id = (int32_t)json_integer_value(id);
        at->len = json_string_length(content);
        at->content = xmalloc(at->len + 1);
        memcpy(at->content, json_string_value(content), at->len + 1);
        at->lstrip = json_flag(a, "lstrip", 0);
        at->rstrip = json_flag(a, "rstrip", 0);
        at->special = json_flag(a, "special", 0);
        // HF matches normalized=false tokens on the raw text first, then the
        // others; the default for special tokens is false, else true.
        int normalized = json_flag(a, "normalized", !at->special);
        int c0 = (uint8_t)at->content[0], n = 0;
        int *list = t->added_by_byte[normalized][c0];
        while (list && list[n] >= 0) n++;
        list = realloc(list, (size_t)(n + 2) * sizeof *list);
        CHECK(list, "out of memory");
        int k = n; // keep longest first: the match at a position is the longest
        while (k > 0 && t->added[list[k - 1]].len < at->len) {
            list[k] = list[k - 1];
            k--;
        }
        list[k] = t->n_added - 1;
        list[n + 1] = -1;
        t->added_by_byte[normalized][c0] = list;
    }
    return STATUS_OK;
}

// FNV-1a over the tables, two seeds -> 128 bits of hex.
static void compute_identity(struct tokenizer *t) {
    uint64_t h[2] = {1469598103934665603ull, 0x6a09e667f3bcc908ull};
    for (int s = 0; s < 2; s++) {
#define MIX(p, n) for (size_t q_ = 0; q_ < (n); q_++) h[s] = (h[s] ^ ((const uint8_t *)(p))[q_]) * 1099511628211ull
        for (int id = 0; id < t->vocab_size; id++) {
            if (t->tok_off[id] == SIZE_MAX) continue;
            MIX(&id, sizeof id);
            MIX(&t->tok_len[id], sizeof t->tok_len[id]);
            MIX(t->tok_bytes + t->tok_off[id], t->tok_len[id]);
        }
        // merges in rank order
        size_t n = t->merges.n;
        uint64_t *by_rank = xcalloc(n ? n : 1, sizeof *by_rank * 2);
        for (size_t i = 0; i < t->merges.cap; i++)
            if (t->merges.key[i] != UINT64_MAX) {
                size_t r = (size_t)(t->merges.val[i] >> 32);
                if (r < n) { by_rank[2 * r] = t->merges.key[i]; by_rank[2 * r + 1] = (uint32_t)t->merges.val[i]; }
            }
        MIX(by_rank, n * 2 * sizeof *by_rank);
        free(by_rank);
        for (int i = 0; i < t->n_added; i++) {
            MIX(&t->added[i].id, sizeof t->added[i].id);
            MIX(&t->added[i].special, sizeof t->added[i].special);
            MIX(t->added[i].content, t->added[i].len + 1);
        }
        MIX(&t->ignore_merges, sizeof t->ignore_merges);
        if (t->norm.desc) MIX(t->norm.desc, strlen(t->norm.desc)); // absent: identities of older files unchanged
        if (t->pre_desc) MIX(t->pre_desc, strlen(t->pre_desc));
#undef MIX
    }
    snprintf(t->identity, sizeof t->identity, "%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
}

static enum status load_tables(struct tokenizer *t, json_t *root, const char *path, struct error *err) {
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return error_set(err, STATUS_BAD_INPUT, "%s: \"model\" is %s, expected an object", path,
                         model ? json_type_name(model) : "missing");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE"))
        return error_set(err, STATUS_BAD_INPUT, "%s: model.type is '%s', expected 'BPE'", path, type);
    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: model.dropout = %g not supported (encoding would be random)", path,
                         json_number_value(dropout));
    if (json_flag(model, "byte_fallback", 0))
        return error_set(err, STATUS_BAD_INPUT, "%s: model.byte_fallback = true not supported (a byte-level BPE "
                         "needs no fallback)", path);
    const char *csp = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *ews = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((csp && *csp) || (ews && *ews))
        return error_set(err, STATUS_BAD_INPUT, "%s: model.continuing_subword_prefix/end_of_word_suffix not supported "
                         "by a byte-level BPE", path);
    t->ignore_merges = json_flag(model, "ignore_merges", 0);
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return error_set(err, STATUS_BAD_INPUT, "%s: model.vocab is %s, expected an object", path,
                         vocab ? json_type_name(vocab) : "missing");

    // ids: the larger of the vocab's and the added tokens' maxima
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
            return json_is_integer(v)
                       ? error_set(err, STATUS_BAD_INPUT, "%s: model.vocab['%s'] = %" PRId64 ", expected an id in [0, %d)",
                                   path, key, (int64_t)json_integer_value(v), INT32_MAX)
                       : error_set(err, STATUS_BAD_INPUT, "%s: model.vocab['%s'] is %s, expected an integer id", path,
                                   key, json_type_name(v));
        max_id = MAX(max_id, json_integer_value(v));
    }
    for (int i = 0; i < t->n_added; i++) max_id = MAX(max_id, t->added[i].id);
    // The id table is sized by the largest id: it must be below the number
    // of tokens the file lists, so that one id of 2^31 - 2 cannot allocate
    // 24 GiB (issue 18); ids run 0 .. V - 1 in every tokenizer trident reads.
    size_t n_listed = json_object_size(vocab) + (size_t)t->n_added;
    if (max_id >= 0 && (uint64_t)max_id >= n_listed)
        return error_set(err, STATUS_BAD_INPUT, "%s: id %" PRId64 " but the file lists %zu tokens (ids must run 0 .. "
                         "tokens - 1)", path, max_id, n_listed);
    t->vocab_size = (int)(max_id + 1);
    unsigned char *added_seen = xcalloc((size_t)t->vocab_size + 1, 1);
    t->tok_off = xmalloc((size_t)t->vocab_size * sizeof *t->tok_off);
    t->tok_len = xcalloc((size_t)t->vocab_size, sizeof *t->tok_len);
    for (int i = 0; i < t->vocab_size; i++) t->tok_off[i] = SIZE_MAX;
    size_t cap = 0, used = 0;
    strmap_init(&t->vocab, json_object_size(vocab));
    // every token's decoded bytes: vocab first, added tokens override (HF's
    // id_to_token looks at added tokens first)
    for (int pass = 0; pass < 2; pass++) {
        void *iter = pass == 0 ? json_object_iter((json_t *)vocab) : NULL;
        int ai = 0;
        while (pass == 0 ? iter != NULL : ai < t->n_added) {
            const char *s;
            size_t len;
            int32_t id;
            if (pass == 0) {
                s = json_object_iter_key(iter);
                len = json_object_iter_key_len(iter);
                id = (int32_t)json_integer_value(json_object_iter_value(iter));
                iter = json_object_iter_next((json_t *)vocab, iter);
            } else {
                s = t->added[ai].content;
                len = t->added[ai].len;
                id = t->added[ai].id;
                ai++;
            }
            if (used + len > cap) {
                cap = MAX(2 * cap, used + len + 65536);
                char *nb = realloc(t->tok_bytes, cap);
                CHECK(nb, "out of memory");
                t->tok_bytes = nb;
            }
            size_t n;
            if (!byte_map_decode(s, len, (uint8_t *)t->tok_bytes + used, &n)) { // HF ByteLevel decoder fallback
                memcpy(t->tok_bytes + used, s, len);
                n = len;
            }
            // One id, one token: a second vocab entry with this id (issue 18:
            // "a" and "b" both 65 encoded "ab" to 65 65 and decoded it to
            // "bb"), or an added token on a vocab id of other bytes (the
            // end-of-text id shared with a normal token).
            const char *clash = NULL;
            if (pass == 0 && t->tok_off[id] != SIZE_MAX) clash = "two model.vocab entries";
            else if (pass == 1 && added_seen[id]) clash = "two added_tokens";
            else if (pass == 1 && t->tok_off[id] != SIZE_MAX &&
                     (t->tok_len[id] != n || memcmp(t->tok_bytes + t->tok_off[id], t->tok_bytes + used, n)))
                clash = "an added token and a model.vocab entry of other text";
            if (clash) {
                free(added_seen);
                return error_set(err, STATUS_BAD_INPUT, "%s: id %d is given to %s ('%.*s' and another)", path, (int)id,
                                 clash, (int)MIN(len, 64), s);
            }
            if (pass == 1) added_seen[id] = 1;
            t->tok_off[id] = used;
            t->tok_len[id] = (uint32_t)n;
            if (pass == 0) strmap_put(&t->vocab, t->tok_bytes + used, n, id, NULL);
            used += n;
        }
    }
    free(added_seen);
    const struct byte_map *bm = byte_map_get();
    for (int b = 0; b < 256; b++) {
        int32_t id = vocab_lookup(t, vocab, bm->utf8[b], bm->utf8_len[b]);
        if (id < 0)
            return error_set(err, STATUS_BAD_INPUT, "%s: model.vocab lacks the byte token '%.*s' for byte 0x%02x: not a "
                             "byte-level BPE covering all 256 bytes", path, bm->utf8_len[b], bm->utf8[b], b);
        t->byte_id[b] = id;
    }
    enum status st = load_merges(t, model, vocab, path, err);
    if (st) return st;

    static const char *const eot_names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
    t->eot_id = -1;
    for (int k = 0; k < 3 && t->eot_id < 0; k++) {
        for (int i = 0; i < t->n_added; i++)
            if (!strcmp(t->added[i].content, eot_names[k])) t->eot_id = t->added[i].id;
        if (t->eot_id < 0) t->eot_id = vocab_lookup(t, vocab, eot_names[k], strlen(eot_names[k]));
    }
    return STATUS_OK;
}

// Post-processors that change no id under encode(add_special_tokens=False).
static enum status check_post_processor(const json_t *pp, const char *path, const char *field, struct error *err) {
    if (!pp || json_is_null(pp)) return STATUS_OK;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (type && !strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(pp, "processors");
        if (!json_is_array(list))
            return error_set(err, STATUS_BAD_INPUT, "%s: %s Sequence: \"processors\" is not an array", path, field);
        size_t i;
        json_t *sub;
        json_array_foreach(list, i, sub) {
            char f[256];
            snprintf(f, sizeof f, "%s.processors[%zu]", field, i);
            enum status st = check_post_processor(sub, path, f, err);
            if (st) return st;
        }
        return STATUS_OK;
    }
    static const char *const ok[] = {"ByteLevel", "TemplateProcessing", "RobertaProcessing", "BertProcessing"};
    for (int i = 0; type && i < 4; i++)
        if (!strcmp(type, ok[i])) return STATUS_OK;
    return error_set(err, STATUS_BAD_INPUT, "%s: %s type '%s' not supported (expected ByteLevel, TemplateProcessing, "
                     "RobertaProcessing, BertProcessing or Sequence)", path, field, type ? type : "(no type)");
}

static enum status load_json(struct tokenizer *t, json_t *root, const char *path, struct error *err) {
    if (!json_is_object(root)) return error_set(err, STATUS_BAD_INPUT, "%s: top level is not a JSON object", path);
    enum status st = load_added(t, json_object_get(root, "added_tokens"), path, err);
    if (st) return st;
    st = load_tables(t, root, path, err);
    if (st) return st;
    st = normalizer_load(&t->norm, json_object_get(root, "normalizer"), path, "normalizer", err);
    if (st) return st;
    static const char *const must_be_null[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(root, must_be_null[i]);
        if (v && !json_is_null(v))
            return error_set(err, STATUS_BAD_INPUT, "%s: %s is %s, not supported (expected null)", path,
                             must_be_null[i], json_type_name(v));
    }
    st = check_post_processor(json_object_get(root, "post_processor"), path, "post_processor", err);
    if (st) return st;
    const json_t *pt = json_object_get(root, "pre_tokenizer");
    int saw_byte_level = 0;
    if (!json_is_object(pt))
        return error_set(err, STATUS_BAD_INPUT, "%s: pre_tokenizer is %s, expected a ByteLevel pre-tokenizer", path,
                         pt ? json_type_name(pt) : "missing");
    st = load_pretok(t, pt, path, &saw_byte_level, err);
    if (st) return st;
    if (!saw_byte_level)
        return error_set(err, STATUS_BAD_INPUT, "%s: pre_tokenizer has no ByteLevel step: not a byte-level BPE", path);
    const json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec)) {
        const char *dt = json_string_value(json_object_get(dec, "type"));
        if (!dt || strcmp(dt, "ByteLevel"))
            return error_set(err, STATUS_BAD_INPUT, "%s: decoder type '%s' not supported (expected ByteLevel)", path,
                             dt ? dt : "(no type)");
    }
    compute_identity(t);
    return STATUS_OK;
}

enum status tokenizer_load(const char *path, struct tokenizer **out, struct error *err) {
    *out = NULL;
    // A FIFO or a device in a tokenizer.json's place (a Hugging Face
    // folder's, say) is refused, not waited on (base/common.h).
    int fd = open_regular_file(path, "tokenizer file", NULL, NULL, err);
    if (fd < 0) return err->status;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return error_set(err, STATUS_RUNTIME, "%s: cannot open tokenizer file: %m", path);
    }
    json_error_t jerr;
    json_t *root = json_loadf(f, JSON_ALLOW_NUL, &jerr);
    fclose(f);
    if (!root)
        return error_set(err, STATUS_BAD_INPUT, "%s:%d:%d: not valid JSON: %s", path, jerr.line, jerr.column, jerr.text);
    struct tokenizer *t = xcalloc(1, sizeof *t);
    enum status st = load_json(t, root, path, err);
    json_decref(root);
    if (st) {
        tokenizer_free(t);
        return st;
    }
    pthread_rwlock_init(&t->cache_lock, NULL);
    strmap_init(&t->cache, 1 << 14);
    *out = t;
    return STATUS_OK;
}

void tokenizer_free(struct tokenizer *t) {
    if (!t) return;
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_bytes);
    strmap_free(&t->vocab);
    u64map_free(&t->merges);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int n = 0; n < 2; n++)
        for (int b = 0; b < 256; b++) free(t->added_by_byte[n][b]);
    pretok_free(&t->pre);
    normalizer_free(&t->norm);
    free(t->pre_desc);
    if (t->cache.cap) {
        pthread_rwlock_destroy(&t->cache_lock);
        strmap_free(&t->cache);
    }
    free(t->cache_ids.v);
    free(t);
}

int tokenizer_vocab_size(const struct tokenizer *t) { return t->vocab_size; }
int tokenizer_eot_id(const struct tokenizer *t) { return t->eot_id; }
const char *tokenizer_identity(const struct tokenizer *t) { return t->identity; }

enum status tokenizer_folder_identity(const char *dir, char *out, size_t n, struct error *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    out[0] = '\0';
    if (access(path, F_OK)) return STATUS_OK;
    struct tokenizer *tok;
    if (tokenizer_load(path, &tok, err)) return err->status;
    snprintf(out, n, "%s", tok->identity);
    tokenizer_free(tok);
    return STATUS_OK;
}

// ----------------------------------------------------------------- encoding

struct merge_cand {
    int32_t rank, pos, new_id;
};
struct symbol {
    int32_t id, prev, next, len;
};

struct encode_ctx {
    const struct tokenizer *t;
    int allow_special;           // match special=true added tokens
    struct ibuf *out;
    struct symbol *sym;          // (cap) scratch for one word
    struct merge_cand *heap;     // (2 * cap)
    size_t cap;
};

// Min-heap on (rank, pos), as HF's BPE Word::merge_all pops its BinaryHeap.
static int cand_less(struct merge_cand a, struct merge_cand b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}
static void heap_push(struct merge_cand *h, size_t *n, struct merge_cand c) {
    size_t i = (*n)++;
    while (i > 0 && cand_less(c, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}
static struct merge_cand heap_pop(struct merge_cand *h, size_t *n) {
    struct merge_cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c])) c++;
        if (!cand_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

// BPE of one pre-token (raw bytes) into ids, HF's merge_all step for step.
static void bpe_word(struct encode_ctx *c, const uint8_t *w, size_t n, struct ibuf *out) {
    const struct tokenizer *t = c->t;
    if (t->ignore_merges) {
        int64_t *id = strmap_get(&t->vocab, w, n);
        if (id) {
            ibuf_push(out, (int32_t)*id);
            return;
        }
    }
    if (n > c->cap) {
        c->cap = MAX(n, 2 * c->cap);
        free(c->sym);
        free(c->heap);
        c->sym = xmalloc(c->cap * sizeof *c->sym);
        c->heap = xmalloc(2 * c->cap * sizeof *c->heap);
    }
    struct symbol *s = c->sym;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++)
        s[i] = (struct symbol){t->byte_id[w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
    for (size_t i = 0; i + 1 < n; i++) {
        int64_t *m = u64map_get(&t->merges, pair_key(s[i].id, s[i + 1].id));
        if (m) heap_push(c->heap, &nh, (struct merge_cand){(int32_t)(*m >> 32), (int32_t)i, (int32_t)*m});
    }
    while (nh) {
        struct merge_cand top = heap_pop(c->heap, &nh);
        struct symbol *a = &s[top.pos];
        if (a->len == 0 || a->next < 0) continue;
        struct symbol *b = &s[a->next];
        int64_t *m = u64map_get(&t->merges, pair_key(a->id, b->id));
        if (!m || (int32_t)*m != top.new_id) continue; // stale entry
        a->id = top.new_id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (a->next >= 0) s[a->next].prev = top.pos;
        if (a->prev >= 0) {
            m = u64map_get(&t->merges, pair_key(s[a->prev].id, a->id));
            if (m) heap_push(c->heap, &nh, (struct merge_cand){(int32_t)(*m >> 32), a->prev, (int32_t)*m});
        }
        if (a->next >= 0) {
            m = u64map_get(&t->merges, pair_key(a->id, s[a->next].id));
            if (m) heap_push(c->heap, &nh, (struct merge_cand){(int32_t)(*m >> 32), top.pos, (int32_t)*m});
        }
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) ibuf_push(out, s[i].id);
}

static void encode_piece(void *ctx, const char *piece, size_t len) {
    struct encode_ctx *c = ctx;
    struct tokenizer *t = (struct tokenizer *)c->t; // the cache is the one mutable part
    int cacheable = len <= CACHE_MAX_WORD_LEN;
    if (cacheable) {
        pthread_rwlock_rdlock(&t->cache_lock);
        int64_t *off = strmap_get(&t->cache, piece, len);
        if (off) {
            const int32_t *e = t->cache_ids.v + *off;
            for (int32_t i = 1; i <= e[0]; i++) ibuf_push(c->out, e[i]);
        }
        cacheable = t->cache.n < CACHE_MAX_WORDS; // full: no write lock for nothing
        pthread_rwlock_unlock(&t->cache_lock);
        if (off) return;
    }
    size_t start = c->out->n;
    bpe_word(c, (const uint8_t *)piece, len, c->out);
    if (cacheable) {
        pthread_rwlock_wrlock(&t->cache_lock);
        if (t->cache.n < CACHE_MAX_WORDS) {
            int inserted;
            int64_t *off = strmap_put(&t->cache, piece, len, (int64_t)t->cache_ids.n, &inserted);
            if (inserted) {
                *off = (int64_t)t->cache_ids.n;
                ibuf_push(&t->cache_ids, (int32_t)(c->out->n - start));
                for (size_t i = start; i < c->out->n; i++) ibuf_push(&t->cache_ids, c->out->v[i]);
            }
        }
        pthread_rwlock_unlock(&t->cache_lock);
    }
}

// Splits text on the added tokens of one class (cls 0: normalized=false ones,
// matched on the raw text; cls 1: the gaps are normalized, then normalized=true
// ones matched), leftmost-longest and non-overlapping as HF's Aho-Corasick
// find_iter; lstrip/rstrip take Unicode whitespace around a match, never
// across the previous match (HF AddedVocabulary::find_matches). Gaps go to
// the next class or to the pre-tokenizer.
static enum status encode_segment(struct encode_ctx *c, int cls, const char *text, size_t len, struct error *err) {
    const struct tokenizer *t = c->t;
    if (cls == 2) return pretok_run(&t->pre, text, len, encode_piece, c, err);
    char *normed = NULL;
    if (cls == 1 && t->norm.n) {
        if (len == 0) return STATUS_OK;
        normed = normalizer_apply(&t->norm, text, len, &len);
        text = normed;
    }
    enum status st = STATUS_OK;
    size_t prev = 0;
    for (size_t i = 0; i < len; i++) {
        const int *list = t->added_by_byte[cls][(uint8_t)text[i]];
        if (!list) continue;
        const struct added_token *hit = NULL;
        for (; *list >= 0; list++) {
            const struct added_token *a = &t->added[*list];
            if (a->len <= len - i && !memcmp(text + i, a->content, a->len)) {
                hit = a;
                break;
            }
        }
        if (!hit) continue;
        size_t s = i, e = i + hit->len, k;
        if (hit->special && !c->allow_special) { // HF encode_special_tokens: the match is skipped, not re-searched
            i = e - 1;
            continue;
        }
        if (hit->lstrip)
            while (s > prev && (k = utf8_space_before(text + prev, s - prev))) s -= k;
        if (hit->rstrip)
            while (e < len && (k = utf8_space_at(text + e, len - e))) e += k;
        if ((st = encode_segment(c, cls + 1, text + prev, s - prev, err))) goto out;
        ibuf_push(c->out, hit->id);
        prev = e;
        i = e - 1;
    }
    st = encode_segment(c, cls + 1, text + prev, len - prev, err);
out:
    free(normed);
    return st;
}

enum status tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int allow_special, int32_t **ids,
                             size_t *n_ids, struct error *err) {
    struct ibuf out = {0};
    struct encode_ctx c = {.t = t, .out = &out, .allow_special = allow_special};
    enum status st = encode_segment(&c, 0, text, len, err);
    free(c.sym);
    free(c.heap);
    if (st) {
        free(out.v);
        *ids = NULL;
        *n_ids = 0;
        return st;
    }
    *ids = out.v ? out.v : xmalloc(sizeof(int32_t));
    *n_ids = out.n;
    return STATUS_OK;
}

enum status tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n_ids, char **text, size_t *len,
                             struct error *err) {
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size || t->tok_off[ids[i]] == SIZE_MAX) {
            *text = NULL;
            *len = 0;
            return error_set(err, STATUS_BAD_INPUT, "token id %d at position %zu is not in the vocabulary [0, %d)",
                             ids[i], i, t->vocab_size);
        }
        total += t->tok_len[ids[i]];
    }
    char *s = xmalloc(total + 1);
    size_t k = 0;
    for (size_t i = 0; i < n_ids; i++) {
        memcpy(s + k, t->tok_bytes + t->tok_off[ids[i]], t->tok_len[ids[i]]);
        k += t->tok_len[ids[i]];
    }
    s[k] = 0;
    *text = s;
    *len = k;
    return STATUS_OK;
}

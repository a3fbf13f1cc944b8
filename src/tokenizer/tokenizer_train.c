// tokenizer_train.c: byte-level BPE training as HF tokenizers' BpeTrainer does
// it (bpe/trainer.rs) with a ByteLevel pre-tokenizer, and the tokenizer.json
// writer.
//
// Ids 0..255 are the bytes in GPT-2 byte-map order (= ascending code point of
// the mapped character, the order HF sorts its alphabet in). Each step merges
// the pair with the highest count summed over word occurrences; ties go to
// the smallest (left id, right id), which is HF's Merge ordering. A merge
// whose result string already exists reuses that id (HF does the same). So HF
// trained with BpeTrainer(vocab_size=V-1, special_tokens=[],
// initial_alphabet=ByteLevel.alphabet()) and then given "<|endoftext|>" as a
// special token has the same vocab and merges (tests/reference).
//
// Pair counts are kept incrementally: an index from each pair to the words
// that hold it (with stale entries, skipped cheaply) and a lazy max-heap.
#include <jansson.h>
#include <string.h>

#include "tokenizer.h"
#include "tokenizer_internal.h"

struct train_word {
    int32_t *sym; // (n) current token ids
    int32_t n;
    int64_t count;
};

struct pair_info {
    int64_t count;
    int32_t *words; // word indices that held the pair at some point (may be stale)
    int32_t n_words, cap_words;
    int32_t a, b;
    int32_t touched_step;
};

struct heap_entry {
    int64_t count;
    uint64_t key; // pair_key(a, b): numeric order is (a, b) order
};

struct trainer {
    struct train_word *words;
    int32_t n_words;
    struct pair_info *pairs;
    int32_t n_pairs, cap_pairs;
    struct u64map pair_index; // pair key -> index in pairs
    struct heap_entry *heap;
    size_t n_heap, cap_heap;
    int32_t *touched;         // pairs whose count rose this step
    int32_t n_touched, cap_touched;
};

static int entry_before(struct heap_entry x, struct heap_entry y) {
    return x.count != y.count ? x.count > y.count : x.key < y.key;
}

static void theap_push(struct trainer *tr, struct heap_entry e) {
    if (tr->n_heap == tr->cap_heap) {
        tr->cap_heap = tr->cap_heap ? 2 * tr->cap_heap : 1024;
        tr->heap = realloc(tr->heap, tr->cap_heap * sizeof *tr->heap);
        CHECK(tr->heap, "out of memory");
    }
    struct heap_entry *h = tr->heap;
    size_t i = tr->n_heap++;
    while (i > 0 && entry_before(e, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static struct heap_entry theap_pop(struct trainer *tr) {
    struct heap_entry *h = tr->heap, top = h[0], last = h[--tr->n_heap];
    size_t i = 0, n = tr->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && entry_before(h[c + 1], h[c])) c++;
        if (!entry_before(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static struct pair_info *pair_get(struct trainer *tr, int32_t a, int32_t b) {
    int inserted;
    int64_t *slot = u64map_put(&tr->pair_index, pair_key(a, b), tr->n_pairs, &inserted);
    if (inserted) {
        if (tr->n_pairs == tr->cap_pairs) {
            tr->cap_pairs = tr->cap_pairs ? 2 * tr->cap_pairs : 4096;
            tr->pairs = realloc(tr->pairs, (size_t)tr->cap_pairs * sizeof *tr->pairs);
            CHECK(tr->pairs, "out of memory");
        }
        tr->pairs[tr->n_pairs++] = (struct pair_info){.a = a, .b = b, .touched_step = -1};
    }
    return &tr->pairs[*slot];
}

// count += delta * word count; a rise records the word and marks the pair for
// a heap push at the end of the step.
static void pair_change(struct trainer *tr, int32_t a, int32_t b, int delta, int32_t iw, int32_t step) {
    struct pair_info *p = pair_get(tr, a, b);
    p->count += delta * tr->words[iw].count;
    if (delta <= 0) return;
    if (p->n_words == 0 || p->words[p->n_words - 1] != iw) {
        if (p->n_words == p->cap_words) {
            p->cap_words = p->cap_words ? 2 * p->cap_words : 4;
            p->words = realloc(p->words, (size_t)p->cap_words * sizeof *p->words);
            CHECK(p->words, "out of memory");
        }
        p->words[p->n_words++] = iw;
    }
    if (p->touched_step != step) {
        p->touched_step = step;
        if (tr->n_touched == tr->cap_touched) {
            tr->cap_touched = tr->cap_touched ? 2 * tr->cap_touched : 1024;
            tr->touched = realloc(tr->touched, (size_t)tr->cap_touched * sizeof *tr->touched);
            CHECK(tr->touched, "out of memory");
        }
        tr->touched[tr->n_touched++] = (int32_t)(p - tr->pairs);
    }
}

// Replaces every non-overlapping (a, b), left to right, by c in word iw and
// reports the pair changes exactly as HF's Word::merge does.
static void word_merge(struct trainer *tr, int32_t iw, int32_t a, int32_t b, int32_t c, int32_t step) {
    struct train_word *w = &tr->words[iw];
    int32_t *s = w->sym, out = 0, i = 0, n = w->n;
    while (i < n) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            if (out > 0) {
                pair_change(tr, s[out - 1], a, -1, iw, step);
                pair_change(tr, s[out - 1], c, +1, iw, step);
            }
            if (i + 2 < n) {
                pair_change(tr, b, s[i + 2], -1, iw, step);
                pair_change(tr, c, s[i + 2], +1, iw, step);
            }
            s[out++] = c;
            i += 2;
        } else {
            s[out++] = s[i++];
        }
    }
    w->n = out;
}

struct count_ctx {
    struct strmap *counts;
};

static void count_piece(void *ctx, const char *piece, size_t len) {
    struct count_ctx *c = ctx;
    (*strmap_put(c->counts, piece, len, 0, NULL))++;
}

// Token strings (raw bytes) by id: offsets into one buffer.
struct token_table {
    struct strmap index;   // bytes -> id
    size_t *off;           // (cap)
    uint32_t *len;         // (cap)
    char *bytes;
    size_t n, cap, used, bytes_cap;
};

static int32_t token_add(struct token_table *tt, const char *a, size_t la, const char *b, size_t lb) {
    char buf[4096];
    char *joined = la + lb <= sizeof buf ? buf : xmalloc(la + lb);
    memcpy(joined, a, la);
    memcpy(joined + la, b, lb);
    int inserted;
    int64_t *id = strmap_put(&tt->index, joined, la + lb, (int64_t)tt->n, &inserted);
    if (inserted) {
        if (tt->n == tt->cap) {
            tt->cap = tt->cap ? 2 * tt->cap : 1024;
            tt->off = realloc(tt->off, tt->cap * sizeof *tt->off);
            tt->len = realloc(tt->len, tt->cap * sizeof *tt->len);
            CHECK(tt->off && tt->len, "out of memory");
        }
        if (tt->used + la + lb > tt->bytes_cap) {
            tt->bytes_cap = MAX(2 * tt->bytes_cap, tt->used + la + lb + 65536);
            tt->bytes = realloc(tt->bytes, tt->bytes_cap);
            CHECK(tt->bytes, "out of memory");
        }
        memcpy(tt->bytes + tt->used, joined, la + lb);
        tt->off[tt->n] = tt->used;
        tt->len[tt->n] = (uint32_t)(la + lb);
        tt->used += la + lb;
        tt->n++;
    }
    if (joined != buf) free(joined);
    return (int32_t)*id;
}

static json_t *token_json(const struct token_table *tt, int32_t id) {
    char buf[8192];
    uint32_t n = tt->len[id];
    char *s = 2 * (size_t)n + 1 <= sizeof buf ? buf : xmalloc(2 * (size_t)n + 1);
    size_t k = byte_map_encode((const uint8_t *)tt->bytes + tt->off[id], n, s);
    json_t *j = json_stringn(s, k);
    if (s != buf) free(s);
    return j;
}

// HF tokenizers' tokenizer.json layout (version "1.0"), merges as pairs.
static enum status train_write(const struct token_table *tt, const int32_t *merges, size_t n_merges,
                               const char *out_path, struct error *err) {
    json_t *root = json_object(), *added = json_array(), *model = json_object();
    json_t *vocab = json_object(), *jm = json_array();
    int32_t eot = (int32_t)tt->n;
    // (json_pack returns NULL only out of memory: refused below, no file written)
    json_t *eot_json = json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", eot, "content",
                                 "<|endoftext|>", "single_word", 0, "lstrip", 0, "rstrip", 0,
                                 "normalized", 0, "special", 1);
    bool ok = !json_array_append_new(added, eot_json);
    json_t *byte_level = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                                   "trim_offsets", 1, "use_regex", 1);
    ok &= byte_level != NULL;
    for (size_t id = 0; id < tt->n; id++) {
        json_t *s = token_json(tt, (int32_t)id);
        json_object_setn_new(vocab, json_string_value(s), json_string_length(s), json_integer((json_int_t)id));
        json_decref(s);
    }
    for (size_t i = 0; i < n_merges; i++) {
        json_t *pair = json_array();
        json_array_append_new(pair, token_json(tt, merges[2 * i]));
        json_array_append_new(pair, token_json(tt, merges[2 * i + 1]));
        json_array_append_new(jm, pair);
    }
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token", json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_null());
    json_object_set_new(model, "end_of_word_suffix", json_null());
    json_object_set_new(model, "fuse_unk", json_false());
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "ignore_merges", json_false());
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", jm);
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "normalizer", json_null());
    json_object_set(root, "pre_tokenizer", byte_level);
    json_object_set(root, "post_processor", byte_level);
    json_object_set(root, "decoder", byte_level);
    json_decref(byte_level);
    json_object_set_new(root, "model", model);

    enum status st = STATUS_OK;
    FILE *f = ok ? fopen(out_path, "wb") : NULL;
    if (!ok) st = error_set(err, STATUS_RUNTIME, "%s: out of memory making its JSON", out_path);
    else if (!f)
        st = error_set(err, STATUS_RUNTIME, "%s: cannot create tokenizer file: %m", out_path);
    else {
        int bad = json_dumpf(root, f, JSON_INDENT(2) | JSON_ENSURE_ASCII) != 0;
        bad |= fputc('\n', f) == EOF;
        bad |= fclose(f) != 0;
        if (bad) st = error_set(err, STATUS_RUNTIME, "%s: write failed: %m", out_path);
    }
    json_decref(root);
    return st;
}

enum status tokenizer_train(const char *const *docs, const size_t *doc_lens, size_t n_docs, int vocab_size,
                            const char *out_path, struct error *err) {
    if (vocab_size < 257 || vocab_size > INT32_MAX / 2)
        return error_set(err, STATUS_BAD_INPUT, "vocab_size %d out of range: expected >= 257 (256 bytes + "
                         "<|endoftext|>)", vocab_size);
    // 1. count pre-token words with the GPT-2 pattern
    struct pretok pre = {0};
    enum status st = pretok_add(&pre, TOKENIZER_GPT2_PATTERN, 0, 0, "GPT-2 pattern", err);
    if (st) return st;
    struct strmap counts;
    strmap_init(&counts, 1 << 16);
    struct count_ctx cc = {&counts};
    for (size_t d = 0; d < n_docs && st == STATUS_OK; d++) st = pretok_run(&pre, docs[d], doc_lens[d], count_piece, &cc, err);
    pretok_free(&pre);
    if (st) {
        strmap_free(&counts);
        return st;
    }

    // 2. words as byte ids; ids 0..255 in GPT-2 order
    const struct byte_map *bm = byte_map_get();
    struct token_table tt = {0};
    strmap_init(&tt.index, (size_t)vocab_size);
    for (int i = 0; i < 256; i++) token_add(&tt, (const char *)&bm->order[i], 1, "", 0);
    struct trainer tr = {0};
    tr.n_words = (int32_t)counts.n;
    tr.words = xcalloc(counts.n ? counts.n : 1, sizeof *tr.words);
    u64map_init(&tr.pair_index, 1 << 16);
    int32_t iw = 0;
    for (size_t slot = 0; slot < counts.cap; slot++) {
        if (!counts.hash[slot]) continue;
        struct train_word *w = &tr.words[iw];
        const uint8_t *k = (const uint8_t *)counts.arena + counts.key_off[slot];
        w->n = (int32_t)counts.key_len[slot];
        w->count = counts.val[slot];
        w->sym = xmalloc((size_t)w->n * sizeof *w->sym);
        for (int32_t j = 0; j < w->n; j++) w->sym[j] = bm->rank[k[j]];
        for (int32_t j = 0; j + 1 < w->n; j++) pair_change(&tr, w->sym[j], w->sym[j + 1], +1, iw, 0);
        iw++;
    }
    strmap_free(&counts);
    for (int32_t i = 0; i < tr.n_pairs; i++)
        if (tr.pairs[i].count > 0) theap_push(&tr, (struct heap_entry){tr.pairs[i].count, pair_key(tr.pairs[i].a, tr.pairs[i].b)});

    // 3. merge until vocab_size - 1 tokens (the last id is <|endoftext|>)
    int32_t *merges = xmalloc(2 * (size_t)vocab_size * sizeof *merges);
    size_t n_merges = 0, cap_merges = (size_t)vocab_size;
    int32_t *seen = xmalloc((size_t)(tr.n_words ? tr.n_words : 1) * sizeof *seen);
    memset(seen, 0xFF, (size_t)(tr.n_words ? tr.n_words : 1) * sizeof *seen);
    for (int32_t step = 1; tt.n < (size_t)vocab_size - 1 && tr.n_heap; step++) {
        struct heap_entry top = theap_pop(&tr);
        int64_t *pi = u64map_get(&tr.pair_index, top.key);
        struct pair_info *p = &tr.pairs[*pi];
        if (top.count != p->count) { // stale: requeue at the current count (HF does the same)
            if (p->count > 0) theap_push(&tr, (struct heap_entry){p->count, top.key});
            continue;
        }
        if (p->count < 1) break;
        int32_t a = p->a, b = p->b;
        int32_t c = token_add(&tt, tt.bytes + tt.off[a], tt.len[a], tt.bytes + tt.off[b], tt.len[b]);
        if (n_merges == cap_merges) {
            cap_merges *= 2;
            merges = realloc(merges, 2 * cap_merges * sizeof *merges);
            CHECK(merges, "out of memory");
        }
        merges[2 * n_merges] = a;
        merges[2 * n_merges + 1] = b;
        n_merges++;
        // p's own word list is never appended to in this step (new pairs all
        // hold c), but pair_get may move tr.pairs: copy what is needed.
        int32_t *wl = p->words, nwl = p->n_words;
        int64_t ip = *pi;
        p->words = NULL;
        p->n_words = p->cap_words = 0;
        tr.n_touched = 0;
        for (int32_t k = 0; k < nwl; k++) {
            if (seen[wl[k]] == step) continue;
            seen[wl[k]] = step;
            word_merge(&tr, wl[k], a, b, c, step);
        }
        free(wl);
        tr.pairs[ip].count = 0; // every occurrence merged (overlaps like "aaa" were decremented)
        for (int32_t k = 0; k < tr.n_touched; k++) {
            struct pair_info *q = &tr.pairs[tr.touched[k]];
            if (q->count > 0) theap_push(&tr, (struct heap_entry){q->count, pair_key(q->a, q->b)});
        }
    }
    free(seen);
    for (int32_t i = 0; i < tr.n_words; i++) free(tr.words[i].sym);
    free(tr.words);
    for (int32_t i = 0; i < tr.n_pairs; i++) free(tr.pairs[i].words);
    free(tr.pairs);
    free(tr.heap);
    free(tr.touched);
    u64map_free(&tr.pair_index);

    if (tt.n < (size_t)vocab_size - 1)
        st = error_set(err, STATUS_BAD_INPUT, "training corpus too small for vocab_size %d: only %zu tokens reachable "
                       "(%zu merges)", vocab_size, tt.n + 1, n_merges);
    else st = train_write(&tt, merges, n_merges, out_path, err);
    free(merges);
    strmap_free(&tt.index);
    free(tt.off);
    free(tt.len);
    free(tt.bytes);
    return st;
}

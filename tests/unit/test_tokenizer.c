// test_tokenizer.c: the byte-level BPE against Hugging Face tokenizers.
// Fixtures come from tests/reference/tokenizer_reference.py (HF tokenizers
// 0.23): exact ids for a GPT-2-style and a LLaMA-3-style tokenizer, and an
// HF-trained tokenizer that trident's trainer must reproduce exactly.
#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "tokenizer/tokenizer.h"

#define FIX "tests/reference/fixtures/"

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s (run from the repository root)\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) exit(1);
    s[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return s;
}

static int32_t *read_ids(const char *path, size_t *n) {
    size_t len;
    char *s = read_file(path, &len);
    int32_t *ids = malloc((len / 2 + 1) * sizeof *ids);
    *n = 0;
    for (char *p = strtok(s, " \n"); p; p = strtok(NULL, " \n")) ids[(*n)++] = atoi(p);
    free(s);
    return ids;
}

static struct tokenizer *load_ok(const char *path) {
    struct tokenizer *tok;
    struct error err = {0};
    if (tokenizer_load(path, &tok, &err)) {
        fprintf(stderr, "FAIL loading %s: %s\n", path, err.msg);
        exit(1);
    }
    return tok;
}

// decode(encode(x)) == x
static int roundtrip(const struct tokenizer *tok, const char *x, size_t n) {
    int32_t *ids;
    size_t n_ids, len;
    char *back;
    struct error err = {0};
    if (tokenizer_encode(tok, x, n, 1, &ids, &n_ids, &err)) return 0;
    int ok = !tokenizer_decode(tok, ids, n_ids, &back, &len, &err) && len == n && !memcmp(back, x, n);
    free(ids);
    if (ok) free(back);
    return ok;
}

static void test_hf_ids_of(const char *json, const char *text_path, const char *ids_path, int vocab, int eot,
                           int check_roundtrip) {
    struct tokenizer *tok = load_ok(json);
    size_t len, n_ref, n_ids;
    char *text = read_file(text_path, &len);
    int32_t *ref = read_ids(ids_path, &n_ref), *ids;
    struct error err = {0};
    for (int pass = 0; pass < 2; pass++) { // the second pass runs from the word cache
        EXPECT(tokenizer_encode(tok, text, len, 1, &ids, &n_ids, &err) == STATUS_OK, "%s", err.msg);
        EXPECT(n_ids == n_ref, "%s: %zu ids, HF has %zu", json, n_ids, n_ref);
        size_t first = 0;
        while (first < MIN(n_ids, n_ref) && ids[first] == ref[first]) first++;
        EXPECT(first == n_ref && n_ids == n_ref, "%s pass %d: first difference with HF at id %zu", json, pass, first);
        free(ids);
    }
    EXPECT(tokenizer_vocab_size(tok) == vocab, "%s: vocab size %d, expected %d", json, tokenizer_vocab_size(tok), vocab);
    EXPECT(tokenizer_eot_id(tok) == eot, "%s: eot id %d, expected %d", json, tokenizer_eot_id(tok), eot);
    if (check_roundtrip) EXPECT(roundtrip(tok, text, len), "%s: decode(encode(test text)) != test text", json);
    EXPECT(tokenizer_encode(tok, "", 0, 1, &ids, &n_ids, &err) == STATUS_OK && n_ids == 0, "empty text gives %zu ids", n_ids);
    free(ids);
    free(text);
    free(ref);
    tokenizer_free(tok);
}

static void test_hf_ids(const char *json, const char *ids_path, int vocab, int eot, int check_roundtrip) {
    test_hf_ids_of(json, FIX "tokenizer_test_text.txt", ids_path, vocab, eot, check_roundtrip);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

// Random byte strings: raw bytes (mostly invalid UTF-8), valid multi-byte
// characters, truncated sequences, whitespace runs and the special token.
static void test_random_roundtrip(const char *json) {
    struct tokenizer *tok = load_ok(json);
    static const char *const parts[] = {"\xff", "\x80", "\xc0\xaf", "\xed\xa0\x80", "\xe6\x97", "\xf0\x9f\x98",
                                        "\xe6\x97\xa5", "\xf0\x9f\x98\x80", "\xe2\x80\x8d", "  ", "\t", "\n\n",
                                        "'s", "'LL", "123456", "abc", "<|endoftext|>", "<|end", "\0", "\xc3\xa9"};
    char buf[512];
    int bad = 0;
    for (int it = 0; it < 400; it++) {
        size_t n = 0, want = rng() % 200;
        while (n < want) {
            if (rng() % 3 == 0) buf[n++] = (char)(rng() & 0xFF);
            else {
                const char *p = parts[rng() % (sizeof parts / sizeof parts[0])];
                size_t pl = p[0] ? strlen(p) : 1;
                if (n + pl > sizeof buf) break;
                memcpy(buf + n, p, pl);
                n += pl;
            }
        }
        if (!roundtrip(tok, buf, n)) bad++;
    }
    EXPECT(bad == 0, "%s: %d of 400 random byte strings do not round-trip", json, bad);
    const char fixed[] = "a\x80" "b \xff\xfe  \xe6\x97 x\xed\xa0\x80y";
    EXPECT(roundtrip(tok, fixed, sizeof fixed - 1), "%s: invalid UTF-8 sample does not round-trip", json);
    // invalid bytes come out as their byte tokens, between the valid pieces
    int32_t *ids;
    size_t n_ids;
    struct error err = {0};
    EXPECT(tokenizer_encode(tok, "\xff", 1, 1, &ids, &n_ids, &err) == STATUS_OK && n_ids == 1, "\\xff: %zu ids", n_ids);
    free(ids);
    tokenizer_free(tok);
}

static void expect_load_error(const char *path, const char *content, const char *needle) {
    if (content) {
        FILE *f = fopen(path, "w");
        fputs(content, f);
        fclose(f);
    }
    struct tokenizer *tok = NULL;
    struct error err = {0};
    enum status st = tokenizer_load(path, &tok, &err);
    EXPECT(st == STATUS_BAD_INPUT && !tok, "%s: status %d, expected STATUS_BAD_INPUT", path, st);
    EXPECT(strstr(err.msg, path) != NULL, "error does not name the file: %s", err.msg);
    EXPECT(strstr(err.msg, needle) != NULL, "error lacks '%s': %s", needle, err.msg);
    if (content) unlink(path);
}

static void test_errors(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/trident_tok_%d.json", (int)getpid());
    expect_load_error("/nonexistent/tokenizer.json", NULL, "cannot open");
    expect_load_error(path, "{\"model\": {\"type\": \"BPE\", ", "not valid JSON");
    expect_load_error(path, "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model.type");
    expect_load_error(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                            "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", "byte token");
    expect_load_error(path, "[1, 2]", "not a JSON object");

    struct tokenizer *tok = load_ok(FIX "hf_bpe_tokenizer.json");
    int32_t bad_ids[] = {5, 1000};
    char *text;
    size_t len;
    struct error err = {0};
    EXPECT(tokenizer_decode(tok, bad_ids, 2, &text, &len, &err) == STATUS_BAD_INPUT && strstr(err.msg, "1000"),
           "decode of id 1000 (vocab 1000): %s", err.msg);
    int32_t neg = -1;
    EXPECT(tokenizer_decode(tok, &neg, 1, &text, &len, &err) == STATUS_BAD_INPUT, "decode of id -1 accepted");
    tokenizer_free(tok);
}

// Merges in the older "a b" string form load to the same tokenizer.
static void test_string_merges(void) {
    json_error_t jerr;
    json_t *root = json_load_file(FIX "hf_bpe_tokenizer.json", 0, &jerr);
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(m, 0)), json_string_value(json_array_get(m, 1)));
        json_array_set_new(merges, i, json_string(buf));
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/trident_tok_str_%d.json", (int)getpid());
    json_dump_file(root, path, 0);
    json_decref(root);
    struct tokenizer *a = load_ok(FIX "hf_bpe_tokenizer.json"), *b = load_ok(path);
    EXPECT(!strcmp(tokenizer_identity(a), tokenizer_identity(b)), "string-form merges: identity %s != %s",
           tokenizer_identity(b), tokenizer_identity(a));
    size_t len, na, nb;
    char *text = read_file(FIX "tokenizer_test_text.txt", &len);
    int32_t *ia, *ib;
    struct error err = {0};
    tokenizer_encode(a, text, len, 1, &ia, &na, &err);
    tokenizer_encode(b, text, len, 1, &ib, &nb, &err);
    EXPECT(na == nb && !memcmp(ia, ib, na * sizeof *ia), "string-form merges encode differently");
    free(ia);
    free(ib);
    free(text);
    tokenizer_free(a);
    tokenizer_free(b);
    unlink(path);
}

// A copy of a fixture with a field replaced, written to path and loaded.
static struct tokenizer *load_with(const char *fixture, const char *key, json_t *value, const char *path) {
    json_error_t jerr;
    json_t *root = json_load_file(fixture, 0, &jerr);
    json_object_set_new(root, key, value);
    json_dump_file(root, path, 0);
    json_decref(root);
    struct tokenizer *t = load_ok(path);
    unlink(path);
    return t;
}

static int same_ids(const struct tokenizer *a, const char *x, size_t nx, int special_a, const struct tokenizer *b,
                    const char *y, size_t ny, int special_b) {
    int32_t *ia, *ib;
    size_t na, nb;
    struct error err = {0};
    tokenizer_encode(a, x, nx, special_a, &ia, &na, &err);
    tokenizer_encode(b, y, ny, special_b, &ib, &nb, &err);
    int same = na == nb && !memcmp(ia, ib, na * sizeof *ia);
    free(ia);
    free(ib);
    return same;
}

// NFKC through utf8proc keeps invalid bytes as they are and normalizes the
// valid runs around them; special-token text is plain text unless allowed.
static void test_normalizer_and_special(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/trident_tok_norm_%d.json", (int)getpid());
    struct tokenizer *plain = load_ok(FIX "hf_bpe_tokenizer.json");
    struct tokenizer *nfkc = load_with(FIX "hf_bpe_tokenizer.json", "normalizer", json_pack("{s:s}", "type", "NFKC"),
                                       path);
    // U+FB01 (fi ligature) -> "fi"; U+212B (angstrom) -> U+00C5; \xff is not UTF-8
    const char in[] = "\xef\xac\x81ne \xff caf\xe2\x84\xab \xc3", want[] = "fine \xff caf\xc3\x85 \xc3";
    EXPECT(same_ids(nfkc, in, sizeof in - 1, 1, plain, want, sizeof want - 1, 1),
           "NFKC over text with invalid bytes differs from its hand-normalized form");
    EXPECT(!same_ids(plain, in, sizeof in - 1, 1, plain, want, sizeof want - 1, 1), "the check cannot fail");
    const char eot_text[] = "a<|endoftext|>b";
    int32_t *ids;
    size_t n, n_eot = 0;
    struct error err = {0};
    tokenizer_encode(plain, eot_text, sizeof eot_text - 1, 0, &ids, &n, &err);
    for (size_t i = 0; i < n; i++) n_eot += ids[i] == tokenizer_eot_id(plain);
    char *back;
    size_t len;
    tokenizer_decode(plain, ids, n, &back, &len, &err);
    EXPECT(n_eot == 0 && n > 3 && len == sizeof eot_text - 1 && !memcmp(back, eot_text, len),
           "special-token text not allowed: %zu ids, %zu end-of-text ids", n, n_eot);
    free(back);
    free(ids);
    tokenizer_encode(plain, eot_text, sizeof eot_text - 1, 1, &ids, &n, &err);
    EXPECT(n == 3 && ids[1] == tokenizer_eot_id(plain), "special-token text allowed: %zu ids", n);
    free(ids);
    EXPECT(strcmp(tokenizer_identity(plain), tokenizer_identity(nfkc)), "a normalizer does not change the identity");
    tokenizer_free(plain);
    tokenizer_free(nfkc);
}

// Corpus documents: runs of two or more newlines separate them (as the
// reference script and `trident tokenize --train` split).
static size_t split_docs(char *text, size_t len, const char **docs, size_t *lens) {
    size_t n = 0, s = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && !(text[i] == '\n' && i + 1 < len && text[i + 1] == '\n')) continue;
        if (i > s) {
            docs[n] = text + s;
            lens[n++] = i - s;
        }
        while (i < len && text[i] == '\n') i++;
        s = i;
    }
    return n;
}

static void test_train(void) {
    size_t len;
    char *corpus = read_file(FIX "tokenizer_corpus.txt", &len);
    const char *docs[512];
    size_t lens[512];
    size_t n_docs = split_docs(corpus, len, docs, lens);
    char p1[64], p2[64];
    snprintf(p1, sizeof p1, "/tmp/trident_tok_tr1_%d.json", (int)getpid());
    snprintf(p2, sizeof p2, "/tmp/trident_tok_tr2_%d.json", (int)getpid());
    struct error err = {0};
    EXPECT(tokenizer_train(docs, lens, n_docs, 1000, p1, &err) == STATUS_OK, "train: %s", err.msg);
    struct tokenizer *ours = load_ok(p1), *hf = load_ok(FIX "hf_bpe_tokenizer.json");
    EXPECT(tokenizer_vocab_size(ours) == 1000, "trained vocab size %d", tokenizer_vocab_size(ours));
    EXPECT(tokenizer_eot_id(ours) == 999, "trained eot id %d", tokenizer_eot_id(ours));
    // same vocab, merges and added tokens as HF's BpeTrainer on the same corpus
    EXPECT(!strcmp(tokenizer_identity(ours), tokenizer_identity(hf)), "trained identity %s != HF-trained %s",
           tokenizer_identity(ours), tokenizer_identity(hf));
    EXPECT(roundtrip(ours, corpus, len), "trained tokenizer does not round-trip its corpus");
    tokenizer_free(ours);
    tokenizer_free(hf);

    // deterministic: a second run writes the same bytes
    EXPECT(tokenizer_train(docs, lens, n_docs, 1000, p2, &err) == STATUS_OK, "train: %s", err.msg);
    size_t l1, l2;
    char *f1 = read_file(p1, &l1), *f2 = read_file(p2, &l2);
    EXPECT(l1 == l2 && !memcmp(f1, f2, l1), "two trainings wrote different files");
    free(f1);
    free(f2);

    EXPECT(tokenizer_train(docs, lens, n_docs, 300, p2, &err) == STATUS_OK, "train 300: %s", err.msg);
    struct tokenizer *small = load_ok(p2);
    EXPECT(tokenizer_vocab_size(small) == 300 && tokenizer_eot_id(small) == 299, "vocab 300: size %d eot %d",
           tokenizer_vocab_size(small), tokenizer_eot_id(small));
    tokenizer_free(small);

    EXPECT(tokenizer_train(docs, lens, n_docs, 256, p2, &err) == STATUS_BAD_INPUT, "vocab 256 accepted");
    const char *tiny = "ab ab";
    size_t tiny_len = 5;
    EXPECT(tokenizer_train(&tiny, &tiny_len, 1, 300, p2, &err) == STATUS_BAD_INPUT && strstr(err.msg, "too small"),
           "tiny corpus: %s", err.msg);
    EXPECT(tokenizer_train(docs, lens, n_docs, 300, "/nonexistent/dir/tok.json", &err) == STATUS_RUNTIME &&
           strstr(err.msg, "/nonexistent/dir/tok.json"), "unwritable output: %s", err.msg);
    unlink(p1);
    unlink(p2);
    free(corpus);
}

// tokenizer_utf8_sanitize against hand-written expectations (Unicode §3.9
// Table 3-7 validity; one U+FFFD per invalid byte or control byte), and on
// a byte-level tokenizer's decode of half a two-byte character.
static void test_utf8_sanitize(void) {
#define R "\xEF\xBF\xBD"
    static const struct { const char *in; size_t n; const char *want; } cases[] = {
        {"plain ascii\tand\n", 16, "plain ascii\tand\n"},
        {"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 14, "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"},
        {"a\xC3", 2, "a" R},                 // truncated 2-byte sequence
        {"\x80x", 2, R "x"},                 // stray continuation byte
        {"\xC0\xAF", 2, R R},                // overlong '/'
        {"\xED\xA0\x80", 3, R R R},          // surrogate U+D800
        {"\xF4\x90\x80\x80", 4, R R R R},    // > U+10FFFF
        {"\xFF", 1, R},
        {"a\0b\x1b[31m\r", 9, "a" R "b" R "[31m" R}, // NUL, ESC, CR
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n;
        char *out = tokenizer_utf8_sanitize(cases[i].in, cases[i].n, &n);
        EXPECT(n == strlen(cases[i].want) && !memcmp(out, cases[i].want, n) && out[n] == '\0',
               "case %zu: got '%s' (%zu bytes), want '%s'", i, out, n, cases[i].want);
        free(out);
    }
    // GPT-2's byte-level BPE: "\xC3\xA9" encodes; its first id alone (or,
    // merged, the bytes' ids cut) decodes to invalid UTF-8, printed as U+FFFD.
    struct tokenizer *tok = load_ok(FIX "hf_bpe_tokenizer.json");
    int32_t *ids;
    size_t n_ids, len;
    char *text;
    struct error err;
    EXPECT(!tokenizer_encode(tok, "\xC3\xA9", 2, 0, &ids, &n_ids, &err), "encode: %s", err.msg);
    if (n_ids == 2) {
        EXPECT(!tokenizer_decode(tok, ids, 1, &text, &len, &err), "decode: %s", err.msg);
        char *out = tokenizer_utf8_sanitize(text, len, &len);
        EXPECT(len == 3 && !memcmp(out, R, 3), "half of \\xC3\\xA9 decoded as '%s'", out);
        free(out), free(text);
    }
    free(ids);
    tokenizer_free(tok);
#undef R
}

int main(void) {
    test_utf8_sanitize();
    test_hf_ids(FIX "hf_bpe_tokenizer.json", FIX "hf_bpe_ids.txt", 1000, 999, 1);
    test_hf_ids(FIX "hf_bpe_prefix_tokenizer.json", FIX "hf_bpe_prefix_ids.txt", 1000, 999, 0);
    test_hf_ids(FIX "hf_llama3_tokenizer.json", FIX "hf_llama3_ids.txt", 1100, 1, 1);
    // Llama 3.x and Qwen2/2.5/3 structured files (tests/reference/chat_reference.py) on a
    // varied Unicode text; Qwen's NFC normalizer makes decode(encode(x)) != x there
    test_hf_ids_of(FIX "chat_llama3_tokenizer.json", FIX "chat_unicode_text.txt", FIX "chat_llama3_unicode_ids.txt",
                   1506, 1501, 1);
    test_hf_ids_of(FIX "chat_qwen2_tokenizer.json", FIX "chat_unicode_text.txt", FIX "chat_qwen2_unicode_ids.txt",
                   1505, 1500, 0);
    test_random_roundtrip(FIX "hf_bpe_tokenizer.json");
    test_random_roundtrip(FIX "hf_llama3_tokenizer.json");
    test_errors();
    test_string_merges();
    test_normalizer_and_special();
    test_train();
    struct tokenizer *a = load_ok(FIX "hf_bpe_tokenizer.json"), *b = load_ok(FIX "hf_bpe_tokenizer.json"),
                     *c = load_ok(FIX "hf_llama3_tokenizer.json");
    EXPECT(!strcmp(tokenizer_identity(a), tokenizer_identity(b)), "identity differs across loads");
    EXPECT(strcmp(tokenizer_identity(a), tokenizer_identity(c)), "two tokenizers share identity %s", tokenizer_identity(a));
    EXPECT(strlen(tokenizer_identity(a)) == 32, "identity '%s' is not 32 hex digits", tokenizer_identity(a));
    tokenizer_free(a);
    tokenizer_free(b);
    tokenizer_free(c);
    return test_finish("test_tokenizer");
}

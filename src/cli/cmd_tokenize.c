// cmd_tokenize.c: `trident tokenize`: text <-> token ids on stdin/stdout, and
// BPE training for tests and small corpora.
//
//   trident tokenize --tokenizer FILE [--allow-special-tokens]
//                                                stdin text -> ids on one line
//   trident tokenize --tokenizer FILE --decode   stdin ids (whitespace-separated) -> bytes
//   trident tokenize --train --vocab-size N --output FILE
//       trains on stdin, one document per block of lines separated by blank lines
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "cli.h"
#include "cli_flags.h"
#include "data/prep.h"
#include "tokenizer/tokenizer.h"

struct tokenize_args {
    const char *tokenizer, *output;
    int vocab_size;
    bool decode, train, allow_special;
};

#define T(field) offsetof(struct tokenize_args, field)
static const struct cli_flag tokenize_flags[] = {
    {"--tokenizer", CLI_PATH, "FILE", NULL, 0, 0, 0, NULL,
     "encode: stdin text -> token ids, space-separated on one line, with this tokenizer.json", T(tokenizer)},
    {"--decode", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "with --tokenizer: stdin whitespace-separated ids -> the bytes they spell", T(decode)},
    {"--allow-special-tokens", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "encode: special-token text (<|endoftext|>) in stdin becomes its id; by default it is encoded as "
     "ordinary text", T(allow_special)},
    {"--train", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "train a byte-level BPE on stdin (documents separated by blank lines; UTF-8 text, checked as "
     "`trident prep` checks an input file); needs --vocab-size and --output, takes no --tokenizer or "
     "--decode", T(train)},
    {"--vocab-size", CLI_INT, "N", NULL, 257, 1 << 30, 0, NULL, "--train: ids of the trained tokenizer",
     T(vocab_size)},
    {"--output", CLI_PATH, "FILE", NULL, 0, 0, 0, NULL, "--train: the tokenizer.json to write", T(output)},
};
#undef T

const struct cli_command cli_tokenize = {
    .name = "tokenize",
    .synopsis = "--tokenizer FILE [--decode | --allow-special-tokens] | --train --vocab-size N --output FILE",
    .summary = "Text <-> token ids on stdin and stdout, and BPE training for tests and small corpora.",
    .flags = tokenize_flags,
    .n_flags = CLI_N(tokenize_flags),
};

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            CHECK(buf, "out of memory reading stdin (%zu bytes)", cap);
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    buf[n] = 0;
    *len = n;
    return ferror(f) ? (free(buf), NULL) : buf;
}

static int do_train(char *text, size_t len, int vocab_size, const char *out) {
    // documents: maximal runs of text between two or more consecutive '\n'
    size_t n_docs = 0, cap = 1024;
    const char **docs = xmalloc(cap * sizeof *docs);
    size_t *lens = xmalloc(cap * sizeof *lens);
    size_t s = 0;
    for (size_t i = 0; i <= len; i++) {
        int sep = i == len || (text[i] == '\n' && i + 1 < len && text[i + 1] == '\n');
        if (!sep) continue;
        if (i > s) {
            if (n_docs == cap) {
                cap *= 2;
                docs = realloc(docs, cap * sizeof *docs);
                lens = realloc(lens, cap * sizeof *lens);
                CHECK(docs && lens, "out of memory");
            }
            docs[n_docs] = text + s;
            lens[n_docs++] = i - s;
        }
        while (i < len && text[i] == '\n') i++; // the whole run of newlines
        s = i;
    }
    struct error err = {0};
    double t0 = time_now_s();
    enum status st = tokenizer_train(docs, lens, n_docs, vocab_size, out, &err);
    free(docs);
    free(lens);
    if (st) {
        fprintf(stderr, "trident tokenize: %s\n", err.msg);
        return st;
    }
    fprintf(stderr, "trident tokenize: trained vocab %d on %zu documents (%zu bytes) in %.2f s -> %s\n", vocab_size,
            n_docs, len, time_now_s() - t0, out);
    return STATUS_OK;
}

static int do_decode(const struct tokenizer *tok, char *text) {
    size_t n = 0, cap = 1024;
    int32_t *ids = xmalloc(cap * sizeof *ids);
    for (char *p = strtok(text, " \t\r\n\v\f"); p; p = strtok(NULL, " \t\r\n\v\f")) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (*end || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "trident tokenize --decode: stdin token %zu is '%s', expected a token id >= 0\n", n + 1, p);
            free(ids);
            return STATUS_BAD_INPUT;
        }
        if (n == cap) {
            cap *= 2;
            ids = realloc(ids, cap * sizeof *ids);
            CHECK(ids, "out of memory");
        }
        ids[n++] = (int32_t)v;
    }
    char *out;
    size_t len;
    struct error err = {0};
    enum status st = tokenizer_decode(tok, ids, n, &out, &len, &err);
    free(ids);
    if (st) {
        fprintf(stderr, "trident tokenize --decode: %s\n", err.msg);
        return st;
    }
    int bad = fwrite(out, 1, len, stdout) != len;
    free(out);
    return bad ? STATUS_RUNTIME : STATUS_OK;
}

static int do_encode(const struct tokenizer *tok, const char *text, size_t len, int allow_special) {
    int32_t *ids;
    size_t n;
    struct error err = {0};
    enum status st = tokenizer_encode(tok, text, len, allow_special, &ids, &n, &err);
    if (st) {
        fprintf(stderr, "trident tokenize: %s\n", err.msg);
        return st;
    }
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
    return STATUS_OK;
}

int cmd_tokenize(int argc, char **argv) {
    if (cli_is_help(argc, argv)) {
        cli_print_help(&cli_tokenize, stdout);
        return STATUS_OK;
    }
    struct tokenize_args o = {0};
    struct error perr = {0};
    if (cli_parse(&cli_tokenize, argc, argv, &o, &perr)) {
        fprintf(stderr, "trident tokenize: %s\n(trident tokenize --help for usage)\n", perr.msg);
        return perr.status;
    }
    const char *tok_path = o.tokenizer, *out = o.output;
    int decode = o.decode, train = o.train, allow_special = o.allow_special;
    if (train) {
        int v = o.vocab_size;
        if (!v || !out || tok_path || decode) {
            fprintf(stderr, "trident tokenize: --train needs --vocab-size N and --output FILE (and no --tokenizer/--decode)\n");
            return STATUS_BAD_INPUT;
        }
        size_t len;
        char *text = read_all(stdin, &len);
        if (!text) {
            fprintf(stderr, "trident tokenize: reading stdin failed\n");
            return STATUS_RUNTIME;
        }
        // The checks prep makes of an input file; a UTF-8 byte-order mark
        // at the start is skipped as prep skips one.
        struct error terr = {0};
        size_t bom = len >= 3 && !memcmp(text, PREP_UTF8_BOM, 3) ? 3 : 0, k = bom;
        while (k < len && (text[k] == ' ' || text[k] == '\t' || text[k] == '\r' || text[k] == '\n')) k++;
        if (prep_check_text("stdin", text, len, &terr) ||
            (k == len && error_set(&terr, STATUS_BAD_INPUT, "stdin: no input text (%zu bytes%s): --train reads "
                                   "the training corpus from stdin, documents separated by blank lines", len,
                                   len ? ", all blank" : ""))) {
            fprintf(stderr, "trident tokenize: %s\n", terr.msg);
            free(text);
            return terr.status;
        }
        int rc = do_train(text + bom, len - bom, v, out);
        free(text);
        return rc;
    }
    if (!tok_path || out || o.vocab_size) {
        fprintf(stderr, "trident tokenize: need --tokenizer FILE (--output/--vocab-size only with --train)\n"
                "(trident tokenize --help for usage)\n");
        return STATUS_BAD_INPUT;
    }
    struct tokenizer *tok;
    struct error err = {0};
    if (tokenizer_load(tok_path, &tok, &err)) {
        fprintf(stderr, "trident tokenize: %s\n", err.msg);
        return err.status;
    }
    size_t len;
    char *text = read_all(stdin, &len);
    int rc = STATUS_RUNTIME;
    if (!text) fprintf(stderr, "trident tokenize: reading stdin failed\n");
    else rc = decode ? do_decode(tok, text) : do_encode(tok, text, len, allow_special);
    free(text);
    tokenizer_free(tok);
    return rc;
}

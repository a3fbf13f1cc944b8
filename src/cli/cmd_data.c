// cmd_data.c: `trident data-check DIR --seq-len N [--vocab-size V]
// [--tokenizer FILE | --tokenizer-id ID]`: a debugging subcommand that opens a dataset as training does and validates every shard at once (what
// training does on each shard's first read) and prints a summary.
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "cli.h"
#include "data/dataset.h"
#include "tokenizer/tokenizer.h"

static int data_bad(const char *msg, const char *arg) {
    fprintf(stderr, "trident data-check: %s%s\nusage: trident data-check DIR --seq-len N [--vocab-size V] "
                    "[--tokenizer FILE | --tokenizer-id ID]\n", msg, arg);
    return STATUS_BAD_INPUT;
}

static int parse_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < 1 || v > (1l << 30)) return 0;
    *out = (int)v;
    return 1;
}

int cmd_data_check(int argc, char **argv) {
    const char *dir = NULL, *tok_path = NULL, *tok_id = NULL;
    int seq_len = 0, vocab = 0;
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: trident data-check DIR --seq-len N [--vocab-size V] [--tokenizer FILE | "
               "--tokenizer-id ID]\n  opens a dataset folder as training does and validates every "
               "shard now (training checks each on its first read); prints a summary\n");
        return STATUS_OK;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strncmp(a, "--", 2)) {
            if (dir) return data_bad("more than one DIR: ", a);
            dir = a;
            continue;
        }
        if (!v) return data_bad("option needs a value: ", a);
        i++;
        if (!strcmp(a, "--seq-len")) {
            if (!parse_int(v, &seq_len)) return data_bad("--seq-len expects a positive integer, got ", v);
        } else if (!strcmp(a, "--vocab-size")) {
            if (!parse_int(v, &vocab)) return data_bad("--vocab-size expects a positive integer, got ", v);
        } else if (!strcmp(a, "--tokenizer")) tok_path = v;
        else if (!strcmp(a, "--tokenizer-id")) tok_id = v;
        else return data_bad("unknown option ", a);
    }
    if (!dir || !seq_len) return data_bad("DIR and --seq-len are required", "");
    struct error err = {0};
    struct tokenizer *tok = NULL;
    if (tok_path) {
        if (tokenizer_load(tok_path, &tok, &err)) {
            fprintf(stderr, "trident data-check: %s\n", err.msg);
            return err.status;
        }
        tok_id = tokenizer_identity(tok);
    }
    struct dataset *ds = NULL;
    enum status st = dataset_open(dir, seq_len, vocab, tok_id, &ds, &err);
    if (tok) tokenizer_free(tok);
    // dataset_open checks shard by shard lazily; data-check reads them all now.
    if (!st && (st = dataset_validate_all(ds, &err))) {
        dataset_close(ds);
        ds = NULL;
    }
    if (st) {
        fprintf(stderr, "trident data-check: %s\n", err.msg);
        return st;
    }
    const struct index *ix = &ds->index;
    printf("dataset %s: format_version %" PRId64 ", tokenizer %s, vocab_size %" PRId64 ", eot_id %" PRId64 "\n", dir,
           ix->format_version, ix->tokenizer, ix->vocab_size, ix->eot_id);
    printf("shards: %d (train %d, val %d), %" PRIu64 " tokens\n", ds->n_shards, ds->split_n[SPLIT_TRAIN],
           ds->split_n[SPLIT_VAL], ix->total_tokens);
    for (int sp = 0; sp < SPLIT_COUNT; sp++) {
        uint64_t docs = 0;
        for (int k = 0; k < ds->split_n[sp]; k++) docs += ds->shards[ds->split_shards[sp][k]].h5.n_docs;
        printf("%s: %" PRIu64 " tokens, %" PRIu64 " documents, %" PRIu64 " sequences of seq_len %d\n",
               split_name(sp), ds->split_tokens[sp], docs, ds->split_sequences[sp], seq_len);
    }
    printf("ok\n");
    dataset_close(ds);
    return STATUS_OK;
}

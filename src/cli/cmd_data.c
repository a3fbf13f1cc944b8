// cmd_data.c: `trident data-check DIR --seq-len N [--vocab-size V]
// [--tokenizer FILE | --tokenizer-id ID]`: a debugging subcommand that opens a dataset as training does and validates every shard at once (what
// training does on each shard's first read) and prints a summary.
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "data/dataset.h"
#include "tokenizer/tokenizer.h"

struct data_check_args {
    const char *dir, *tokenizer, *tokenizer_id;
    int seq_len, vocab_size;
};

#define D(field) offsetof(struct data_check_args, field)
static const struct cli_flag data_check_flags[] = {
    {"DIR", CLI_PATH, NULL, NULL, 0, 0, 0, NULL, "a dataset folder (index.ini and shards)", D(dir)},
    {"--seq-len", CLI_INT, "N", NULL, 1, 1 << 30, 0, NULL,
     "the training sequence length the shards are cut into; required", D(seq_len)},
    {"--vocab-size", CLI_INT, "V", NULL, 1, 1 << 30, 0, NULL,
     "the model's vocab_size the dataset's must equal; default: not checked", D(vocab_size)},
    {"--tokenizer", CLI_PATH, "FILE", NULL, 0, 0, 0, NULL,
     "a tokenizer.json whose identity index.ini must record", D(tokenizer)},
    {"--tokenizer-id", CLI_STRING, "ID", NULL, 0, 0, 0, NULL,
     "or the tokenizer identity itself (as `trident ckpt info` prints it)", D(tokenizer_id)},
};
#undef D

const struct cli_command cli_data_check = {
    .name = "data-check",
    .synopsis = "DIR --seq-len N [--vocab-size V] [--tokenizer FILE | --tokenizer-id ID]",
    .summary = "Opens a dataset folder as training does and validates every shard now (training checks each\n"
               "on its first read); prints a summary. For debugging.",
    .flags = data_check_flags,
    .n_flags = CLI_N(data_check_flags),
};

int cmd_data_check(int argc, char **argv) {
    if (cli_is_help(argc, argv)) {
        cli_print_help(&cli_data_check, stdout);
        return STATUS_OK;
    }
    struct data_check_args o = {0};
    struct error perr = {0};
    if (cli_parse(&cli_data_check, argc, argv, &o, &perr) ||
        (!o.seq_len && error_set(&perr, STATUS_BAD_INPUT, "DIR and --seq-len are required"))) {
        fprintf(stderr, "trident data-check: %s\n(trident data-check --help for usage)\n", perr.msg);
        return STATUS_BAD_INPUT;
    }
    const char *dir = o.dir, *tok_path = o.tokenizer, *tok_id = o.tokenizer_id;
    int seq_len = o.seq_len, vocab = o.vocab_size;
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

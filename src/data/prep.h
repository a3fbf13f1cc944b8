// prep.h: raw text to a tokenized dataset folder (`trident prep`, docs/design.md §6).
//
// Documents: plain text (blocks separated by blank lines) or JSON Lines (the
// "text" field of each object). Each document is encoded and followed by the
// end-of-text id; documents go whole to the train or validation split (a
// seeded choice of round(val_fraction * documents) of them); each split is
// cut into shards of about shard_tokens tokens at document boundaries.
#ifndef TRIDENT_PREP_H
#define TRIDENT_PREP_H

#include <stddef.h>
#include <stdint.h>

#include "base/common.h"

enum prep_format { PREP_FORMAT_TEXT, PREP_FORMAT_JSONL };

struct prep_options {
    const char *const *inputs; // (n_inputs,) files or folders (their files, sorted)
    int n_inputs;
    const char *output;         // dataset folder; must not hold an index.ini
    const char *tokenizer_path; // a tokenizer.json to use, or NULL to train one
    int vocab_size;             // > 0: train a tokenizer of this size
    enum prep_format format;
    double val_fraction;        // in [0, 1)
    uint64_t shard_tokens;      // target tokens per shard
    uint64_t seed;
    int quiet;                  // no progress line
};

struct prep_stats {
    uint64_t documents[2]; // per split (SPLIT_TRAIN, SPLIT_VAL)
    uint64_t tokens[2];
    int shards;
    double encode_seconds; // encoding and writing, without tokenizer training
};

// Documents read from the inputs: doc d is text[offsets[d], offsets[d+1]).
struct corpus {
    char *text;
    size_t *offsets; // (n_docs + 1,)
    size_t n_docs;
};

// Reads every input. Empty documents are skipped. Errors: STATUS_BAD_INPUT
// naming the file (and line for JSON Lines) when unreadable or malformed.
enum status corpus_read(const char *const *inputs, int n_inputs, enum prep_format format,
                        struct corpus *out, struct error *err);
void corpus_free(struct corpus *c);

enum status prep_run(const struct prep_options *opt, struct prep_stats *stats, struct error *err);

#endif

// prep.h: raw text to a tokenized dataset folder (`trident prep`, docs/design.md §6).
//
// Documents: plain text (blocks separated by blank lines) or JSON Lines (a
// string field, "text" by default, of each object). Each document is encoded
// and followed by the end-of-text id; documents go whole to the train or
// validation split (a seeded choice of round(val_fraction * documents) of
// them); each split is cut into shards of about shard_tokens tokens at
// document boundaries.
//
// Streaming: the inputs are read one document at a time (prep_read.c), encoded
// a block at a time on all cores and written in input order, so memory is
// bounded by a block and the two pending shards, not by the corpus; the
// output does not depend on the thread count. Training a tokenizer
// (vocab_size > 0) is the exception: it holds the corpus in memory.
#ifndef TRIDENT_PREP_H
#define TRIDENT_PREP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/common.h"

enum prep_format { PREP_FORMAT_TEXT, PREP_FORMAT_JSONL };

struct prep_options {
    const char *const *inputs; // (n_inputs,) files or folders (their files, sorted)
    int n_inputs;
    const char *output;         // dataset folder; must not hold an index.ini
    const char *tokenizer_path; // a tokenizer.json to use, or NULL to train one
    int vocab_size;             // > 0: train a tokenizer of this size
    enum prep_format format;
    const char *text_key;       // JSON Lines: the field holding the text; NULL: "text"
    int allow_special;          // special-token text in documents becomes its id (else plain text)
    double val_fraction;        // in [0, 1)
    uint64_t shard_tokens;      // target tokens per shard
    uint64_t seed;
    int quiet;                  // no progress line
};

struct prep_stats {
    uint64_t documents[2]; // per split (SPLIT_TRAIN, SPLIT_VAL)
    uint64_t tokens[2];
    uint64_t bytes;        // document bytes encoded
    int shards;
    double encode_seconds; // reading, encoding and writing, without tokenizer training
    int threads;           // encoder threads
    uint64_t peak_rss_bytes; // the process's peak resident set (getrusage), after the run
};

// Documents read from the inputs: doc d is text[offsets[d], offsets[d+1]).
struct corpus {
    char *text;
    size_t *offsets; // (n_docs + 1,)
    size_t n_docs;
};

// Reads every input into memory (tokenizer training). Empty documents are
// skipped. Errors: STATUS_BAD_INPUT naming the file (and line for JSON Lines)
// when unreadable or malformed, or when there is no document.
enum status corpus_read(const char *const *inputs, int n_inputs, enum prep_format format, const char *text_key,
                        struct corpus *out, struct error *err);
void corpus_free(struct corpus *c);

// The inputs as a stream of documents (prep_read.c).
struct doc_reader {
    char **paths;          // (n_paths) input files in reading order
    int n_paths, file, started;
    FILE *f;
    enum prep_format format;
    const char *text_key;
    uint64_t total_bytes;  // sum of the input files' sizes
    uint64_t bytes_read;
    uint64_t line_no;      // in the current file, 1-based
    char *line;            // getline buffer
    size_t line_cap;
    char *doc;             // the current document
    size_t doc_len, doc_cap;
};
// Lists the inputs (folders: their regular non-hidden files in name order).
// Errors: STATUS_BAD_INPUT naming a missing input or unlistable folder.
enum status doc_reader_open(struct doc_reader *r, const char *const *inputs, int n_inputs, enum prep_format format,
                            const char *text_key, struct error *err);
// The next non-empty document: *text (*len bytes, may hold NUL bytes) stays
// valid until the next call; *text is NULL at the end of the inputs.
// Errors: STATUS_BAD_INPUT naming file and line (unreadable file, bad JSON, no
// string field text_key).
enum status doc_reader_next(struct doc_reader *r, const char **text, size_t *len, struct error *err);
void doc_reader_close(struct doc_reader *r);

enum status prep_run(const struct prep_options *opt, struct prep_stats *stats, struct error *err);

#endif

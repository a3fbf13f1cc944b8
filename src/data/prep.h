// prep.h: raw text to a tokenized dataset folder (`trident prep`, docs/design.md §6).
//
// Documents: plain text (blocks separated by blank lines, or each file one
// document) or JSON Lines (a string field, "text" by default, of each object),
// chosen per file (PREP_FORMAT_AUTO). Inputs are checked to be text: binary
// data (NUL bytes, compressed-file magic) and files mostly of invalid UTF-8 are
// refused before anything is written. Each document is encoded
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
#include <signal.h>
#include <stdio.h>

#include "base/common.h"

// AUTO (the default): JSON Lines for a file named *.jsonl or *.json whose
// first non-blank byte is '{' (such a file starting with '[' is refused),
// plain text otherwise.
// CHAT: JSON Lines of {"prompt": P, "response": R} or {"messages": [{"role":
// "system"|"user"|"assistant", "content": C}, ...]}, rendered with trident's
// default template (docs/formats.md, "Chat"): "User: P\nAssistant: R", turns
// joined by "\n", heads "System:", "User:", "Assistant:" each followed by a
// space and the content. The shards get /loss_mask: 1 on the tokens of an
// assistant's " content" (its leading space included) and on the end-of-text
// id after a final assistant turn, 0 elsewhere. With chat_template llama3 or
// chatml (chat.h) the conversation ({"prompt", "response"} as a user and an
// assistant message) is rendered as that template does, the loss mask on the
// assistant contents and their end tokens, and the end-of-text id after the
// document is not trained on. Every string of a record (role, content,
// prompt, response) holding a NUL character is refused, as a text file with a
// NUL byte is. The tokenizer's own Jinja template (tokenizer_config.json) is
// not read: trident has no Jinja interpreter; the templates are data (chat.c).
enum prep_format { PREP_FORMAT_TEXT, PREP_FORMAT_JSONL, PREP_FORMAT_AUTO, PREP_FORMAT_CHAT };

// The default template's text of a {"prompt": P} record up to the response:
// "User: P\nAssistant:" (n bytes of P), the segment --format chat does not
// train on; a model fine-tuned on such data continues it with " R" and
// end-of-text (`trident generate --chat` encodes it as prep does). Returns a
// malloc'd NUL-terminated string of *len bytes.
char *prep_chat_prompt(const char *prompt, size_t n, size_t *len);

// Chat documents as doc_reader_next gives them: segments separated by this
// byte, not trained on and trained on in turn, the first not trained on.
#define PREP_CHAT_SEP '\x01'

struct prep_options {
    const char *const *inputs; // (n_inputs,) files or folders (their files, sorted)
    int n_inputs;
    int recursive;              // folders: their sub-folders' files too (hidden ones never)
    const char *const *includes; // (n_includes,) fnmatch globs on the file name of a folder's files;
    int n_includes;              //   0: every regular, non-hidden file (a file named as an input is always read)
    int doc_per_file;           // plain text: each file is one document (blank lines kept inside)
    const char *output;         // dataset folder; must not hold an index.ini
    const char *tokenizer_path; // a tokenizer.json to use, or NULL to train one
    int vocab_size;             // > 0: train a tokenizer of this size
    enum prep_format format;
    const char *text_key;       // JSON Lines: the field holding the text; NULL: "text"
    int chat_template;          // PREP_FORMAT_CHAT: enum chat_template (chat.h), 0 = plain
    int allow_special;          // special-token text in documents becomes its id (else plain text)
    double val_fraction;        // in [0, 1)
    uint64_t shard_tokens;      // target tokens per shard
    uint64_t seed;
    int quiet;                  // no progress line
    // Set (non-zero: the signal) by the caller's signal handler: prep stops
    // at its next block of documents (after the tokenizer, if it trains one),
    // removes what it wrote and returns STATUS_RUNTIME; NULL: never.
    const volatile sig_atomic_t *stop;
};

struct prep_stats {
    uint64_t documents[2]; // per split (SPLIT_TRAIN, SPLIT_VAL)
    uint64_t tokens[2];
    uint64_t bytes;        // document bytes encoded
    int shards;
    int files;             // input files read
    int jsonl_files;       // of them read as JSON Lines (--format jsonl or detected)
    int jsonl_detected;    // of them detected as JSON Lines (PREP_FORMAT_AUTO)
    int left_out;          // folder files not matching any include glob
    int duplicates;        // input paths naming a file listed before (read once)
    uint64_t chat_no_assistant; // --format chat: conversations without an assistant turn (nothing trained on)
    uint64_t invalid_utf8_bytes; // bytes in invalid UTF-8 sequences, tolerated (see doc_reader_next)
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

// Reads every input of opt into memory (tokenizer training), as
// doc_reader_next does. Empty documents are skipped. Errors: STATUS_BAD_INPUT
// naming the file (and line) when unreadable, malformed or not text, or when
// there is no document.
enum status corpus_read(const struct prep_options *opt, struct corpus *out, struct error *err);
void corpus_free(struct corpus *c);

// The inputs as a stream of documents (prep_read.c).
// The invalid UTF-8 a text file may hold (a stray Latin-1 byte in a mostly
// UTF-8 crawl) before it is refused as not UTF-8: both bounds are exceeded.
#define PREP_MAX_BAD_UTF8_PERCENT 1
#define PREP_MAX_BAD_UTF8_BYTES 16
// A UTF-8 byte-order mark: skipped at the start of a file (as the config
// reader skips one), ordinary text elsewhere.
#define PREP_UTF8_BOM "\xef\xbb\xbf"

// Checks that text (n bytes, the whole input called name) is text as
// doc_reader_next requires of a file (no binary magic at its start, no NUL
// byte, not too much invalid UTF-8), with its messages. Errors:
// STATUS_BAD_INPUT naming name and what was seen.
enum status prep_check_text(const char *name, const char *text, size_t n, struct error *err);

struct doc_reader {
    char **paths;          // (n_paths) input files in reading order
    int n_paths, file, started;
    FILE *f;
    enum prep_format format;      // as asked
    int chat_template;            // enum chat_template (chat.h)
    int file_format;              // the current file's: PREP_FORMAT_TEXT or _JSONL, -1 until its first non-blank line
    int doc_per_file;
    const char *text_key;
    int left_out;                 // folder files not matching an include glob
    int duplicates;               // paths naming a file listed before (read once)
    char dup_path[1024], dup_of[1024]; // the first such path, and the earlier path of its file
    uint64_t chat_docs, chat_no_assistant; // chat: conversations read; of them without an assistant turn
    int first_no_assistant_file;  // the first of those: its file (index in paths) and line
    uint64_t first_no_assistant_line;
    int jsonl_files, jsonl_detected, first_detected; // files read as JSON Lines; detected; the first (-1: none)
    uint64_t file_bytes;          // of the current file, read so far
    uint64_t bad_utf8, first_bad, first_bad_line; // the current file's invalid UTF-8 bytes; the first's offset, line
    uint64_t invalid_utf8_bytes;  // tolerated, in the files finished so far
    uint64_t total_bytes;  // sum of the input files' sizes
    uint64_t bytes_read;
    uint64_t line_no;      // in the current file, 1-based
    char *line;            // getline buffer
    size_t line_cap;
    char *doc;             // the current document
    size_t doc_len, doc_cap;
};
// Lists opt's inputs: a file as given; a folder's regular files whose names
// match an include glob (all when none), hidden files and folders (".name")
// skipped, sub-folders too when opt->recursive, each folder visited once (a
// symlink loop or a second link to a folder is skipped), sorted by path (byte
// order, strcmp), so the reading order does not depend on the file system.
// Each file is read once, at its first place: a later path of the same file
// (device and inode: the same input twice, another spelling, a hard link, a
// file also inside a folder given) is dropped and counted in duplicates.
// Errors: STATUS_BAD_INPUT naming a missing input, an unlistable folder or a
// folder with no file to read.
enum status doc_reader_open(struct doc_reader *r, const struct prep_options *opt, struct error *err);
// The next non-empty document: *text (*len bytes; NUL bytes only from a JSON
// "\u0000") stays valid until the next call; *text is NULL at the end of the
// inputs. Plain text: a run of non-blank lines, or with doc_per_file the file
// from its first to its last non-blank line; the last line break is dropped.
// A UTF-8 byte-order mark at the start of a file is skipped (format
// detection sees past it). Chat records are counted in chat_docs, those
// without an assistant turn in chat_no_assistant.
// Errors: STATUS_BAD_INPUT naming file and line (unreadable file, bad JSON, no
// string field text_key, a *.json file holding a JSON array) or naming the
// file and what was seen when it is not text: a NUL byte, gzip/zstd/xz/bzip2/
// zip magic or a UTF-16 byte-order mark at its start, or more than
// PREP_MAX_BAD_UTF8_PERCENT % (and more than PREP_MAX_BAD_UTF8_BYTES) of its
// bytes in invalid UTF-8 sequences (fewer are kept: the tokenizer encodes them
// as byte tokens, losslessly); stray ones are counted in invalid_utf8_bytes.
enum status doc_reader_next(struct doc_reader *r, const char **text, size_t *len, struct error *err);
void doc_reader_close(struct doc_reader *r);

// Writes the dataset folder opt->output (created with its missing parents;
// refused when it holds anything) from opt->inputs: pass 1 reads and checks
// every input (doc_reader_next's errors) before anything is written, pass 2
// encodes and writes the shards, index.ini and tokenizer.json. On any error
// what it wrote and the folders it made are removed. stats: counts per split,
// files, timing. Errors: STATUS_BAD_INPUT (inputs, output folder, tokenizer),
// STATUS_RUNTIME (writing).
enum status prep_run(const struct prep_options *opt, struct prep_stats *stats, struct error *err);

#endif

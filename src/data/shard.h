// shard.h: one HDF5 token shard, `shard-00000.h5` (docs/design.md §6, docs/formats.md).
//
// Layout: /tokens (n_tokens,) uint16 when vocab_size <= 65536 else uint32,
// chunked; /doc_offsets (n_docs + 1,) uint64, doc d is tokens
// [doc_offsets[d], doc_offsets[d+1]); optional /loss_mask (n_tokens,) uint8,
// 1 where predicting that token is trained on (SFT: response tokens), 0 where
// not (prompt and chat-template tokens), a shard without it is all ones; file attributes vocab_size, eot_id,
// tokenizer (identity string), format_version. Readers take the dtype of
// /tokens from the file, never from the vocabulary size.
#ifndef TRIDENT_SHARD_H
#define TRIDENT_SHARD_H

#include <hdf5.h>
#include <stdint.h>

#include "base/common.h"

#define SHARD_FORMAT_VERSION 1
#define SHARD_TOKENIZER_MAX 128

struct shard_meta {
    int64_t vocab_size;
    int64_t eot_id;
    int64_t format_version;
    char tokenizer[SHARD_TOKENIZER_MAX];
};

// An open shard. Handles stay open until shard_close.
struct shard {
    char path[4096];
    hid_t file, tokens, file_space;
    hid_t loss_mask;    // /loss_mask, or H5I_INVALID_HID when the shard has none (all ones)
    int elem_bytes;     // 2 (uint16) or 4 (uint32), as stored in the file
    uint64_t n_tokens;  // length of /tokens
    uint64_t n_docs;    // length of /doc_offsets minus one
    struct shard_meta meta;
};

// Writes path (overwriting): tokens (n_tokens,) with ids in [0, vocab_size),
// doc_offsets (n_docs + 1,). Storage dtype follows meta->vocab_size.
// Errors: STATUS_RUNTIME naming path on HDF5 failure.
enum status shard_write(const char *path, const int32_t *tokens, uint64_t n_tokens,
                        const uint64_t *doc_offsets, uint64_t n_docs,
                        const struct shard_meta *meta, struct error *err);

// Writes a shard with /tokens of exactly elem_bytes (2 or 4) regardless of
// vocab_size: for tests of the reader's dtype check.
enum status shard_write_typed(const char *path, int elem_bytes, const int32_t *tokens,
                              uint64_t n_tokens, const uint64_t *doc_offsets,
                              uint64_t n_docs, const struct shard_meta *meta,
                              struct error *err);

// shard_write_typed with an optional loss_mask (n_tokens,) of 0/1 written as
// /loss_mask (NULL: none); elem_bytes 0 follows meta->vocab_size.
// Errors: STATUS_RUNTIME naming path on HDF5 failure.
enum status shard_write_masked(const char *path, int elem_bytes, const int32_t *tokens,
                               const uint8_t *loss_mask, uint64_t n_tokens, const uint64_t *doc_offsets,
                               uint64_t n_docs, const struct shard_meta *meta, struct error *err);

// Opens path read-only and reads its shape, dtype and attributes (no token
// data). Errors: STATUS_BAD_INPUT naming path for a file that is missing, not
// HDF5 (truncated, corrupt), or lacks a dataset or attribute of the layout,
// or whose /loss_mask is not uint8 of /tokens' length.
enum status shard_open(const char *path, struct shard *s, struct error *err);
// A closed shard: every handle H5I_INVALID_HID (a zeroed struct is not one:
// 0 is not an HDF5 id, and shard_close would pass it to HDF5, which prints
// an error stack). shard_close leaves s so too.
void shard_init(struct shard *s);
void shard_close(struct shard *s);

// Reads /tokens[start, start + count) into out (count,) as int32 through one
// hyperslab selection. buf (count * elem_bytes bytes) receives the stored
// integers; memspace is a 1-D dataspace of at least count elements (its
// selection is changed). No allocation by trident. Errors: STATUS_RUNTIME.
enum status shard_read_tokens(struct shard *s, uint64_t start, uint64_t count, int32_t *out,
                              void *buf, hid_t memspace, struct error *err);

// Reads /loss_mask[start, start + count) into out (count,) uint8; all ones
// when the shard has no /loss_mask. memspace as for shard_read_tokens.
// Errors: STATUS_RUNTIME.
enum status shard_read_mask(struct shard *s, uint64_t start, uint64_t count, uint8_t *out, hid_t memspace,
                            struct error *err);

// Reads /doc_offsets (n_docs + 1,) into out. Errors: STATUS_BAD_INPUT.
enum status shard_read_doc_offsets(struct shard *s, uint64_t *out, struct error *err);

#endif

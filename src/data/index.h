// index.h: a dataset folder's `index.ini` (docs/design.md §6, docs/formats.md) and
// the xxHash checksum of shard files it records.
//
//   [dataset]  format_version tokenizer vocab_size eot_id num_shards
//              total_tokens splits [chat_template]
//   [shard-00000]  file split tokens documents bytes checksum     (one per shard)
#ifndef TRIDENT_INDEX_H
#define TRIDENT_INDEX_H

#include <stdint.h>

#include "base/common.h"
#include "shard.h"

enum split { SPLIT_TRAIN = 0, SPLIT_VAL = 1, SPLIT_COUNT = 2 };

// "train", "val".
const char *split_name(enum split split);

struct index_shard {
    char file[256];      // file name inside the dataset folder
    enum split split;
    uint64_t tokens;
    uint64_t documents;
    uint64_t bytes;      // file size
    char checksum[64];   // "xxh3-64:<16 hex digits>"
};

struct index {
    int64_t format_version;
    char tokenizer[SHARD_TOKENIZER_MAX];
    int64_t vocab_size;
    int64_t eot_id;
    int64_t num_shards;      // as the [dataset] section states it
    uint64_t total_tokens;
    char splits[64];         // e.g. "train val"
    char chat_template[16];  // prep --format chat's template (chat.h), "" when not chat
    int n_shards;            // shard sections found, in shard order
    struct index_shard *shards; // (n_shards,)
};

// Writes path via path.tmp and a rename. Errors: STATUS_RUNTIME naming path.
enum status index_write(const char *path, const struct index *index, struct error *err);

// Parses path. Shard sections must be named shard-NNNNN with NNNNN = 0..n-1.
// Errors: STATUS_BAD_INPUT naming path and the section/key/value.
enum status index_read(const char *path, struct index *index, struct error *err);
void index_free(struct index *index);

// Appends a shard entry (grows index->shards).
void index_add_shard(struct index *index, const struct index_shard *shard);

#endif

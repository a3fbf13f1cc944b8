// dataset.h: a tokenized dataset folder (index.ini + HDF5 shards, docs/design.md §6)
// and the resumable data-parallel loader that serves training sequences.
//
// Sequences: each split's shards, in index order, form one token stream of
// N tokens. Sequence i is tokens [i*T, i*T + T + 1) (T = seq_len): inputs are
// the first T, targets the last T. They do not overlap except for the one
// shifted target token; count = (N - 1) / T. A sequence may span two shards.
//
// Order: epoch e visits the sequences in a seeded pseudo-random permutation
// (a Feistel bijection keyed by (seed, e), no table in memory). A global batch
// is the next G positions of the permutation (G = global_batch_size); DP rank
// r takes positions [r*G/dp, (r+1)*G/dp) of it, in microbatches of
// micro_batch_size. The tail of an epoch shorter than G is dropped on every
// rank alike; then epoch e + 1 starts. Several datasets are blended by weight
// (loader_init_blend).
#ifndef TRIDENT_DATASET_H
#define TRIDENT_DATASET_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/common.h"
#include "base/state_entry.h"
#include "index.h"
#include "shard.h"

struct cache;

struct dataset_shard {
    struct index_shard entry; // as index.ini lists it
    struct shard h5;          // open while h5.file >= 0 (at most DATASET_OPEN_MAX at once)
    uint64_t start;           // offset of its first token in its split's stream
    bool validated;           // checksum, header, /doc_offsets and every id checked once
    bool hot;                 // h5 is open on the hot-tier copy (else on path)
    uint64_t last_use;        // dataset clock at its last read, for closing the LRU
};

// Shards open at once per process; the least recently read is closed first.
#define DATASET_OPEN_MAX 64

struct dataset {
    char dir[4096];
    struct index index;
    int seq_len;
    int n_shards;
    struct dataset_shard *shards;         // (n_shards,) index order
    uint64_t split_tokens[SPLIT_COUNT];    // N per split
    uint64_t split_sequences[SPLIT_COUNT]; // (N - 1) / seq_len, 0 when N == 0
    int *split_shards[SPLIT_COUNT];        // (split_n[s],) shard ids, in order
    int split_n[SPLIT_COUNT];
    int n_open;                            // shards with h5 open
    uint64_t clock;                        // reads served, the LRU clock
    struct cache *cache;                   // hot tier (cache.h); NULL: read path only
};

// Opens dir/index.ini and checks what costs O(shards), not O(tokens), before
// training: the index (format version, vocab_size_expected when > 0,
// tokenizer_expected when not NULL, total_tokens against the shards' sum),
// every listed shard file is present with the size index.ini records, the
// training split holds at least seq_len + 1 tokens (a validation split of
// fewer holds no sequence: dataset_val_unusable). No shard is opened and no token is
// read here: the per-shard checks (checksum, format version, /tokens dtype
// against the vocabulary, attributes against the index, /doc_offsets start at
// 0, increase and end at the token count, every token id < vocab_size) run in
// dataset_shard_get on the shard's first read, before any of its tokens
// reach the caller (docs/design.md §6). Errors: STATUS_BAD_INPUT naming the
// file, the value found and expected.
enum status dataset_open(const char *dir, int seq_len, int vocab_size_expected,
                         const char *tokenizer_expected, struct dataset **out, struct error *err);
void dataset_close(struct dataset *ds);

// Whether ds's validation split holds tokens but no sequence of seq_len (1
// to seq_len tokens): then why (n bytes) says so, naming the split, its
// tokens, seq_len + 1 and the fix, for the caller's note.
bool dataset_val_unusable(const struct dataset *ds, char *why, size_t n);

// Shard i, open and validated: from the hot tier when ds->cache holds a
// published copy, else from dir (the cold tier). The first read of a shard
// in this process validates it completely (dataset_open's list); a cold-tier
// read that fails with an I/O error is retried with backoff
// (CACHE_COLD_TRIES, cache.h) before it is reported. Closes the least recently read
// shard past DATASET_OPEN_MAX. Errors: STATUS_BAD_INPUT for bad data naming
// the shard file and offset; STATUS_RUNTIME for a read that kept failing,
// naming the shard and the tier.
enum status dataset_shard_get(struct dataset *ds, int i, struct shard **out, struct error *err);

// Reads tokens [at, at + n) of shard i into out (n,) through dataset_shard_get
// (buf: n * 4 bytes scratch, memspace: 1-D dataspace of >= n elements).
// Errors: as dataset_shard_get, and STATUS_RUNTIME on a failed read.
enum status dataset_read(struct dataset *ds, int i, uint64_t at, uint64_t n, int32_t *out, void *buf,
                         hid_t memspace, struct error *err);
// Reads /loss_mask[at, at + n) of shard i into out (n,) uint8 (all ones for
// a shard without one) through dataset_shard_get; on the cold tier retried
// as token reads are (cold_retry). Errors: as dataset_read.
enum status dataset_read_mask(struct dataset *ds, int i, uint64_t at, uint64_t n, uint8_t *out, hid_t memspace,
                              struct error *err);

// Validates every shard now (what dataset_open did in full before lazy
// validation): `trident data-check` and tests. Errors: as dataset_shard_get.
enum status dataset_validate_all(struct dataset *ds, struct error *err);

// Most datasets one loader blends ([data] paths).
#define LOADER_MAX_DATASETS 32

// Loader position, saved into checkpoints (its saved form: struct
// loader_saved, below), counted in samples (sequences), not
// batches, so that a run may resume with another global_batch_size (it
// continues at the next unconsumed sample) and, at a step boundary (micro ==
// 0), on another dp or micro_batch_size.
//  - One dataset: epoch and sample = the position in that epoch's permutation
//    of the first sample of the next global batch.
//  - Blend (n_datasets > 1): epoch = 0 and sample = mixture samples consumed
//    (whole run); counts[d] = dataset d's samples consumed, so its next
//    sample is position counts[d] % n_d of its epoch counts[d] / n_d.
// global_batch_size is the saving run's (for the resume message);
// seq_len, n_datasets, sequences and weights describe the data the state
// belongs to: loader_state_load refuses another seed, seq_len or dataset
// list. format 1: a checkpoint written before samples (sample holds the batch
// index; seq_len and n_datasets 0: unknown); 2: this layout.
struct loader_state {
    uint64_t format;
    uint64_t seed;
    uint64_t epoch;
    uint64_t sample;
    uint64_t micro; // microbatches of the current global batch served here
    uint64_t seq_len;
    uint64_t n_datasets;
    uint64_t global_batch_size; // of the run that saved it (0: unknown, format 1)
    uint64_t counts[LOADER_MAX_DATASETS];    // blend: samples consumed per dataset
    uint64_t sequences[LOADER_MAX_DATASETS]; // each dataset's split sequence count
    double weights[LOADER_MAX_DATASETS];     // normalised blend weights (1 alone)
};

// One dataset of a loader with its permutation parameters.
struct loader_source {
    struct dataset *ds;
    double weight;          // normalised; sums to 1 over the sources
    uint64_t n;             // sequences of the split
    uint64_t seed;          // its permutation seed: the run's for source 0
    int feistel_half_bits;
};

struct loader {
    struct dataset *ds; // sources[0].ds
    struct loader_source sources[LOADER_MAX_DATASETS];
    int n_sources;
    enum split split;
    int dp_rank, dp_size, micro_batch_size, global_batch_size;
    int accum;                  // microbatches per global batch on this rank
    uint64_t batches_per_epoch; // one dataset: floor(sequences / global_batch_size)
    struct loader_state state;
    uint64_t counts[LOADER_MAX_DATASETS]; // blend scratch for the walk of a batch
    void *buf;                  // (T + 1,) stored integers, reused per read
    hid_t memspace;             // (T + 1,) HDF5 memory dataspace, reused
    FILE *log;                  // not NULL: one line per served sample (loader_set_log)
};

// Microbatches per optimizer step on one DP rank (gradient accumulation
// steps, Megatron's num_microbatches): global_batch_size / (micro_batch_size
// * dp_size), the one place this rule is computed (docs/design.md §4).
// Returns 0 when a size is < 1 or micro_batch_size * dp_size does not divide
// global_batch_size; the caller names its keys in the message.
int loader_microbatches(int global_batch_size, int micro_batch_size, int dp_size);

// Prepares a loader of split for DP rank dp_rank of dp_size. global_batch_size
// must be divisible by micro_batch_size * dp_size and at most the split's
// sequence count. Errors: STATUS_BAD_INPUT naming the setting and values.
enum status loader_init(struct loader *ld, struct dataset *ds, enum split split, int dp_rank,
                        int dp_size, int micro_batch_size, int global_batch_size, uint64_t seed,
                        struct error *err);

// loader_init over n datasets (1 <= n <= LOADER_MAX_DATASETS, all of the same
// seq_len) blended by weights (n,) (> 0; normalised here). n == 1 is
// loader_init. A blend (Megatron-LM's BlendableDataset index,
// build_blending_indices): mixture sample i comes from the dataset d whose
// realised count lags its share most, argmax_d (w_d * max(i, 1) - c_d(i)),
// ties to the lowest d, c_d(i) the samples taken from d before i; dataset d
// serves its own samples in the seeded permutation order of its epochs (seed
// mixed with d), epoch after epoch with no tail dropped, so each of its
// sequences is served once per epoch of it. Global batch b is mixture samples
// [b*G, (b+1)*G), split over DP ranks as for one dataset. Errors:
// STATUS_BAD_INPUT (a weight <= 0, a dataset with no sequence in split,
// fewer sequences in all than global_batch_size, the batch rules above).
enum status loader_init_blend(struct loader *ld, struct dataset **ds, const double *weights, int n,
                              enum split split, int dp_rank, int dp_size, int micro_batch_size,
                              int global_batch_size, uint64_t seed, struct error *err);
void loader_free(struct loader *ld);

// Every sample loader_next serves appends one line "epoch position dataset
// sequence" to f (not closed by the loader; NULL: none): (epoch, position) is
// its place in the loader's order (one dataset: the permutation position;
// blend: epoch 0 and the mixture index), sequence the index into the split of
// dataset number `dataset`. For tests (TRIDENT_LOG_SAMPLES, docs/design.md §6).
void loader_set_log(struct loader *ld, FILE *f);

// Serves this rank's next microbatch: tokens (micro_batch_size, seq_len + 1).
// No allocation. Errors: STATUS_RUNTIME on a read failure.
enum status loader_next(struct loader *ld, int32_t *tokens, struct error *err);
// loader_next that also fills mask (micro_batch_size, seq_len + 1) uint8 with
// the tokens' /loss_mask (1 for shards without one); mask NULL: loader_next.
enum status loader_next_masked(struct loader *ld, int32_t *tokens, uint8_t *mask, struct error *err);

// The index (into the split's sequences) of the sequence that position pos of
// epoch's permutation names (of source 0): exposed for tests and tools.
uint64_t loader_sequence_at(const struct loader *ld, uint64_t epoch, uint64_t pos);

// Blend: the dataset of mixture sample pos, given counts (n,) of the samples
// taken from each before it (Megatron's rule, above); the caller increments
// counts[result].
int loader_blend_choose(const double *weights, int n, uint64_t pos, const uint64_t *counts);

// Back to the start (validation passes start over each time).
void loader_reset(struct loader *ld);

void loader_state_save(const struct loader *ld, struct loader_state *state);
// Continues at state: the next sample is the first one state has not
// consumed, whatever this loader's global_batch_size, dp and
// micro_batch_size (a state saved mid-step, micro > 0, needs the same
// ones). One dataset: when fewer than global_batch_size samples are left in
// the epoch, its tail is dropped as at any epoch end. A format 1 state
// (batch index) is converted with this loader's global_batch_size.
// Errors: STATUS_BAD_INPUT when the state's seed, seq_len, dataset count,
// weights or a dataset's sequence count differ from this loader's (the
// message gives the old and new value), or it is out of range.
enum status loader_state_load(struct loader *ld, const struct loader_state *state, struct error *err);

// The loader's state as a checkpoint's /state holds it (its owner's entries,
// base/state_entry.h; docs/formats.md "Checkpoints"): "loader_samples"
// (uint64 (LOADER_SAVED_WORDS,): format, seed, epoch, sample, micro, seq_len,
// n_datasets, global_batch_size, counts (LOADER_MAX_DATASETS,), sequences
// (LOADER_MAX_DATASETS,)) and "loader_weights" (double
// (LOADER_MAX_DATASETS,)); read from files written before the state counted
// samples (format 1), "loader" (uint64 (4,): seed, epoch, batch index, micro).
#define LOADER_SAVED_WORDS (8 + 2 * LOADER_MAX_DATASETS)
struct loader_saved {
    uint64_t samples[LOADER_SAVED_WORDS];
    double weights[LOADER_MAX_DATASETS];
    uint64_t batch[4];
    bool has_samples, has_weights, has_batch; // what a load found
};
// The entries over s, into out (room for cap); returns how many.
int loader_state_entries(struct loader_saved *s, struct state_entry *out, int cap);
// state in its saved form (a save).
void loader_saved_pack(const struct loader_state *state, struct loader_saved *s);
// What a load found, as a state for loader_state_load. Errors:
// STATUS_BAD_INPUT (the caller adds the file) when it holds neither form, or
// loader_samples without loader_weights, or a format above 2 or more than
// LOADER_MAX_DATASETS datasets.
enum status loader_saved_unpack(const struct loader_saved *s, struct loader_state *state, struct error *err);

// The datasets of a blend, `[data] paths` (blend.c).
#define BLEND_PATH_MAX 512
struct blend_spec {
    int n;
    char paths[LOADER_MAX_DATASETS][BLEND_PATH_MAX];
    double weights[LOADER_MAX_DATASETS]; // normalised: sum 1
};

// Parses "path:weight, path:weight, ..." (whitespace around entries ignored;
// the weight follows the last ':' of an entry; one entry may omit it) into
// out, weights normalised. Errors: STATUS_BAD_INPUT naming key and text: an
// empty entry or path, a weight that is not a finite number > 0, a missing
// weight in a list of several, a path listed twice, more than
// LOADER_MAX_DATASETS entries or a path of BLEND_PATH_MAX bytes or more.
enum status blend_parse(const char *key, const char *text, struct blend_spec *out, struct error *err);

// Writes a dataset folder shard by shard: prep and tests use it.
struct dataset_writer {
    char dir[4096];
    struct shard_meta meta;
    struct index index;
    int force_elem_bytes; // 0: by vocab size; 2 or 4: that width (tests only)
};

// Creates dir when missing. Errors: STATUS_BAD_INPUT when dir already holds
// an index.ini (nothing is overwritten); STATUS_RUNTIME on I/O errors.
enum status dataset_writer_init(struct dataset_writer *w, const char *dir, int64_t vocab_size,
                                int64_t eot_id, const char *tokenizer, struct error *err);
// Writes shard-NNNNN.h5 with tokens (n_tokens,) and doc_offsets (n_docs + 1,)
// and records its size and checksum for the index.
enum status dataset_writer_add(struct dataset_writer *w, enum split split, const int32_t *tokens,
                               uint64_t n_tokens, const uint64_t *doc_offsets, uint64_t n_docs,
                               struct error *err);
// Writes index.ini (last, so a folder with an index is complete) and frees w.
// dataset_writer_add with loss_mask (n_tokens,) 0/1 stored as /loss_mask
// (NULL: none).
enum status dataset_writer_add_masked(struct dataset_writer *w, enum split split, const int32_t *tokens,
                                      const uint8_t *loss_mask, uint64_t n_tokens, const uint64_t *doc_offsets,
                                      uint64_t n_docs, struct error *err);
enum status dataset_writer_finish(struct dataset_writer *w, struct error *err);

#endif

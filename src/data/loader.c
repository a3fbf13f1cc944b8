// loader.c: the resumable data-parallel loader over a dataset split (the
// order and batching rules are in dataset.h).
#include "dataset.h"

#include "cache.h"

#include <inttypes.h>
#include <string.h>

// SplitMix64 finalizer (Steele, Lea & Flood 2014): a bijective 64-bit mixer.
static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void feistel_keys(uint64_t seed, uint64_t epoch, uint64_t keys[4]) {
    uint64_t x = mix64(seed) ^ mix64(epoch * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull);
    for (int r = 0; r < 4; r++) keys[r] = x = mix64(x + (uint64_t)r);
}

// A 4-round balanced Feistel network on 2*half bits is a bijection of
// [0, 2^(2*half)); cycle-walking (re-applying it until the value lands below
// n) restricts it to a bijection of [0, n) (Black & Rogaway 2002). Since
// 2^(2*half) < 4n, fewer than 4 steps are expected.
static uint64_t feistel_permute(const uint64_t keys[4], int half, uint64_t n, uint64_t x) {
    const uint64_t mask = (1ull << half) - 1;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (int k = 0; k < 4; k++) {
            uint64_t t = l ^ (mix64(r ^ keys[k]) & mask);
            l = r;
            r = t;
        }
        x = (l << half) | r;
    } while (x >= n);
    return x;
}

uint64_t loader_sequence_at(const struct loader *ld, uint64_t epoch, uint64_t pos) {
    uint64_t n = ld->ds->split_sequences[ld->split];
    CHECK(pos < n, "permutation position %" PRIu64 " of %" PRIu64, pos, n);
    if (epoch == ld->state.epoch) return feistel_permute(ld->feistel_keys, ld->feistel_half_bits, n, pos);
    uint64_t keys[4];
    feistel_keys(ld->state.seed, epoch, keys);
    return feistel_permute(keys, ld->feistel_half_bits, n, pos);
}

int loader_microbatches(int global_batch_size, int micro_batch_size, int dp_size) {
    if (global_batch_size < 1 || micro_batch_size < 1 || dp_size < 1) return 0;
    long long per_step = (long long)micro_batch_size * dp_size;
    return global_batch_size % per_step ? 0 : (int)(global_batch_size / per_step);
}

enum status loader_init(struct loader *ld, struct dataset *ds, enum split split, int dp_rank, int dp_size,
                        int micro_batch_size, int global_batch_size, uint64_t seed, struct error *err) {
    memset(ld, 0, sizeof *ld);
    ld->memspace = H5I_INVALID_HID;
    if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size)
        return error_set(err, STATUS_BAD_INPUT, "loader: dp rank %d of dp size %d is out of range", dp_rank, dp_size);
    int accum = loader_microbatches(global_batch_size, micro_batch_size, dp_size);
    if (accum == 0)
        return error_set(err, STATUS_BAD_INPUT,
                         "[train] global_batch_size = %d must be a positive multiple of micro_batch_size * dp = %d * %d",
                         global_batch_size, micro_batch_size, dp_size);
    uint64_t n = ds->split_sequences[split];
    if (n < (uint64_t)global_batch_size)
        return error_set(err, STATUS_BAD_INPUT,
                         "%s/index.ini: the %s split has %" PRIu64 " sequences of seq_len %d, fewer than "
                         "global_batch_size = %d",
                         ds->dir, split_name(split), n, ds->seq_len, global_batch_size);
    ld->ds = ds;
    ld->split = split;
    ld->dp_rank = dp_rank;
    ld->dp_size = dp_size;
    ld->micro_batch_size = micro_batch_size;
    ld->global_batch_size = global_batch_size;
    ld->accum = accum;
    ld->batches_per_epoch = n / (uint64_t)global_batch_size;
    int bits = 0;
    while (bits < 64 && (1ull << bits) < n) bits++;
    ld->feistel_half_bits = MAX(1, (bits + 1) / 2);
    ld->buf = xmalloc(((size_t)ds->seq_len + 1) * 4);
    hsize_t dims[1] = {(hsize_t)ds->seq_len + 1};
    ld->memspace = H5Screate_simple(1, dims, NULL);
    ld->state.seed = seed;
    loader_reset(ld);
    return STATUS_OK;
}

void loader_free(struct loader *ld) {
    free(ld->buf);
    ld->buf = NULL;
    if (ld->memspace >= 0) H5Sclose(ld->memspace);
    ld->memspace = H5I_INVALID_HID;
}

void loader_reset(struct loader *ld) {
    ld->state.epoch = ld->state.batch = ld->state.micro = 0;
    feistel_keys(ld->state.seed, 0, ld->feistel_keys);
}

void loader_state_save(const struct loader *ld, struct loader_state *state) { *state = ld->state; }

enum status loader_state_load(struct loader *ld, const struct loader_state *state, struct error *err) {
    if (state->batch >= ld->batches_per_epoch || state->micro >= (uint64_t)ld->accum)
        return error_set(err, STATUS_BAD_INPUT,
                         "loader state (epoch %" PRIu64 ", batch %" PRIu64 ", micro %" PRIu64 ") is out of range: "
                         "%" PRIu64 " batches per epoch, %d microbatches per batch",
                         state->epoch, state->batch, state->micro, ld->batches_per_epoch, ld->accum);
    ld->state = *state;
    feistel_keys(ld->state.seed, ld->state.epoch, ld->feistel_keys);
    return STATUS_OK;
}

// Reads sequence seq of the split: tokens [seq*T, seq*T + T + 1) into out
// (T + 1,), from one shard or across the boundary of two.
static enum status read_sequence(struct loader *ld, uint64_t seq, int32_t *out, struct error *err) {
    struct dataset *ds = ld->ds;
    const int *ids = ds->split_shards[ld->split];
    uint64_t start = seq * (uint64_t)ds->seq_len, left = (uint64_t)ds->seq_len + 1;
    // Last shard of the split whose start <= start.
    int lo = 0, hi = ds->split_n[ld->split] - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ds->shards[ids[mid]].start <= start) lo = mid;
        else hi = mid - 1;
    }
    while (left > 0) {
        CHECK(lo < ds->split_n[ld->split], "sequence %" PRIu64 " runs past the %s split", seq, split_name(ld->split));
        struct dataset_shard *sh = &ds->shards[ids[lo]];
        uint64_t at = start - sh->start, n = MIN(left, sh->entry.tokens - at);
        enum status s = dataset_read(ds, ids[lo], at, n, out, ld->buf, ld->memspace, err);
        if (s) return s;
        out += n;
        start += n;
        left -= n;
        lo++;
    }
    return STATUS_OK;
}

// Global batches whose shards the hot tier's stager is told about ahead.
#define LOADER_ANNOUNCE_BATCHES 8

// The shard holding token start of the split's stream.
static int shard_at(const struct loader *ld, uint64_t start) {
    const struct dataset *ds = ld->ds;
    const int *ids = ds->split_shards[ld->split];
    int lo = 0, hi = ds->split_n[ld->split] - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ds->shards[ids[mid]].start <= start) lo = mid;
        else hi = mid - 1;
    }
    return ids[lo];
}

// Tells the hot tier (cache_want) which shards the next
// LOADER_ANNOUNCE_BATCHES global batches read, every DP rank's part, in
// order of first need: the node's stager copies them ahead (cache.h).
static void announce_shards(struct loader *ld) {
    const uint64_t G = (uint64_t)ld->global_batch_size, T = (uint64_t)ld->ds->seq_len;
    uint64_t epoch = ld->state.epoch, batch = ld->state.batch;
    size_t n = 0, cap = 2 * G * LOADER_ANNOUNCE_BATCHES;
    int *shards = xmalloc(cap * sizeof *shards);
    for (int b = 0; b < LOADER_ANNOUNCE_BATCHES; b++) {
        for (uint64_t p = 0; p < G; p++) {
            uint64_t seq = loader_sequence_at(ld, epoch, batch * G + p);
            shards[n++] = shard_at(ld, seq * T);
            int last = shard_at(ld, seq * T + T);
            if (last != shards[n - 1]) shards[n++] = last;
        }
        if (++batch == ld->batches_per_epoch) {
            batch = 0;
            epoch++;
        }
    }
    cache_want(ld->ds->cache, shards, (int)n);
    free(shards);
}

enum status loader_next(struct loader *ld, int32_t *tokens, struct error *err) {
    const uint64_t G = (uint64_t)ld->global_batch_size, per_rank = G / (uint64_t)ld->dp_size;
    const uint64_t base = ld->state.batch * G + (uint64_t)ld->dp_rank * per_rank +
                          ld->state.micro * (uint64_t)ld->micro_batch_size;
    const size_t row = (size_t)ld->ds->seq_len + 1;
    if (ld->ds->cache && ld->state.micro == 0) announce_shards(ld);
    for (int j = 0; j < ld->micro_batch_size; j++) {
        uint64_t seq = loader_sequence_at(ld, ld->state.epoch, base + (uint64_t)j);
        enum status s = read_sequence(ld, seq, tokens + (size_t)j * row, err);
        if (s) return s;
    }
    if (++ld->state.micro == (uint64_t)ld->accum) {
        ld->state.micro = 0;
        if (++ld->state.batch == ld->batches_per_epoch) {
            ld->state.batch = 0;
            ld->state.epoch++;
            feistel_keys(ld->state.seed, ld->state.epoch, ld->feistel_keys);
        }
    }
    return STATUS_OK;
}

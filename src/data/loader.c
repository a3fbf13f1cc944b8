// loader.c: the resumable data-parallel loader over a dataset split (the
// order and batching rules are in dataset.h).
#include "dataset.h"

#include "cache.h"

#include <inttypes.h>
#include <math.h>
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

// The permutation seed of source d: the run's seed for source 0 (so one
// dataset keeps the order it had before blending existed), mixed with d else.
static uint64_t source_seed(uint64_t seed, int d) {
    return d == 0 ? seed : mix64(seed ^ mix64(0x5851f42d4c957f2dull * (uint64_t)d));
}

// Sequence at position pos of epoch's permutation of source src.
static uint64_t source_sequence_at(const struct loader_source *src, uint64_t epoch, uint64_t pos) {
    CHECK(pos < src->n, "permutation position %" PRIu64 " of %" PRIu64, pos, src->n);
    uint64_t keys[4];
    feistel_keys(src->seed, epoch, keys);
    return feistel_permute(keys, src->feistel_half_bits, src->n, pos);
}

uint64_t loader_sequence_at(const struct loader *ld, uint64_t epoch, uint64_t pos) {
    return source_sequence_at(&ld->sources[0], epoch, pos);
}

int loader_blend_choose(const double *weights, int n, uint64_t pos, const uint64_t *counts) {
    double at = pos > 1 ? (double)pos : 1.0, best = weights[0] * at - (double)counts[0];
    int d = 0;
    for (int k = 1; k < n; k++) {
        double e = weights[k] * at - (double)counts[k];
        if (e > best) best = e, d = k;
    }
    return d;
}

int loader_microbatches(int global_batch_size, int micro_batch_size, int dp_size) {
    if (global_batch_size < 1 || micro_batch_size < 1 || dp_size < 1) return 0;
    long long per_step = (long long)micro_batch_size * dp_size;
    return global_batch_size % per_step ? 0 : (int)(global_batch_size / per_step);
}

enum status loader_init(struct loader *ld, struct dataset *ds, enum split split, int dp_rank, int dp_size,
                        int micro_batch_size, int global_batch_size, uint64_t seed, struct error *err) {
    double one = 1.0;
    return loader_init_blend(ld, &ds, &one, 1, split, dp_rank, dp_size, micro_batch_size, global_batch_size,
                             seed, err);
}

enum status loader_init_blend(struct loader *ld, struct dataset **ds, const double *weights, int n_ds,
                              enum split split, int dp_rank, int dp_size, int micro_batch_size,
                              int global_batch_size, uint64_t seed, struct error *err) {
    memset(ld, 0, sizeof *ld);
    ld->memspace = H5I_INVALID_HID;
    if (n_ds < 1 || n_ds > LOADER_MAX_DATASETS)
        return error_set(err, STATUS_BAD_INPUT, "loader: %d datasets, expected 1 to %d", n_ds, LOADER_MAX_DATASETS);
    if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size)
        return error_set(err, STATUS_BAD_INPUT, "loader: dp rank %d of dp size %d is out of range", dp_rank, dp_size);
    int accum = loader_microbatches(global_batch_size, micro_batch_size, dp_size);
    if (accum == 0)
        return error_set(err, STATUS_BAD_INPUT,
                         "[train] global_batch_size = %d must be a positive multiple of micro_batch_size * dp = %d * %d",
                         global_batch_size, micro_batch_size, dp_size);
    double wsum = 0;
    uint64_t total = 0;
    for (int d = 0; d < n_ds; d++) {
        if (!(weights[d] > 0) || !isfinite(weights[d]))
            return error_set(err, STATUS_BAD_INPUT, "%s: blend weight %g, expected > 0", ds[d]->dir, weights[d]);
        if (ds[d]->seq_len != ds[0]->seq_len)
            return error_set(err, STATUS_BAD_INPUT, "%s: opened with seq_len %d, %s with %d", ds[d]->dir,
                             ds[d]->seq_len, ds[0]->dir, ds[0]->seq_len);
        if (n_ds > 1 && ds[d]->split_sequences[split] == 0)
            return error_set(err, STATUS_BAD_INPUT, "%s/index.ini: the %s split has no sequence of seq_len %d "
                             "to blend", ds[d]->dir, split_name(split), ds[d]->seq_len);
        wsum += weights[d];
        total += ds[d]->split_sequences[split];
    }
    if (total < (uint64_t)global_batch_size)
        return error_set(err, STATUS_BAD_INPUT,
                         "%s/index.ini%s: the %s split has %" PRIu64 " sequences of seq_len %d, fewer than "
                         "global_batch_size = %d",
                         ds[0]->dir, n_ds > 1 ? " and the blended datasets" : "", split_name(split), total,
                         ds[0]->seq_len, global_batch_size);
    ld->ds = ds[0];
    ld->n_sources = n_ds;
    for (int d = 0; d < n_ds; d++) {
        struct loader_source *src = &ld->sources[d];
        src->ds = ds[d];
        src->weight = weights[d] / wsum;
        src->n = ds[d]->split_sequences[split];
        src->seed = source_seed(seed, d);
        int bits = 0;
        while (bits < 64 && (1ull << bits) < src->n) bits++;
        src->feistel_half_bits = MAX(1, (bits + 1) / 2);
    }
    ld->split = split;
    ld->dp_rank = dp_rank;
    ld->dp_size = dp_size;
    ld->micro_batch_size = micro_batch_size;
    ld->global_batch_size = global_batch_size;
    ld->accum = accum;
    ld->batches_per_epoch = ld->sources[0].n / (uint64_t)global_batch_size;
    ld->buf = xmalloc(((size_t)ds[0]->seq_len + 1) * 4);
    hsize_t dims[1] = {(hsize_t)ds[0]->seq_len + 1};
    ld->memspace = H5Screate_simple(1, dims, NULL);
    ld->state.format = 2;
    ld->state.seed = seed;
    ld->state.seq_len = (uint64_t)ds[0]->seq_len;
    ld->state.n_datasets = (uint64_t)n_ds;
    ld->state.global_batch_size = (uint64_t)global_batch_size;
    for (int d = 0; d < n_ds; d++) {
        ld->state.sequences[d] = ld->sources[d].n;
        ld->state.weights[d] = ld->sources[d].weight;
    }
    loader_reset(ld);
    return STATUS_OK;
}

void loader_free(struct loader *ld) {
    free(ld->buf);
    ld->buf = NULL;
    if (ld->memspace >= 0) H5Sclose(ld->memspace);
    ld->memspace = H5I_INVALID_HID;
}

void loader_set_log(struct loader *ld, FILE *f) { ld->log = f; }

void loader_reset(struct loader *ld) {
    ld->state.epoch = ld->state.sample = ld->state.micro = 0;
    memset(ld->state.counts, 0, sizeof ld->state.counts);
}

void loader_state_save(const struct loader *ld, struct loader_state *state) { *state = ld->state; }

// One dataset: the next global batch must fit in the epoch, else its tail
// is dropped and the next epoch starts.
static void fit_epoch(struct loader *ld) {
    if (ld->n_sources == 1 && ld->state.sample + (uint64_t)ld->global_batch_size > ld->sources[0].n) {
        ld->state.sample = 0;
        ld->state.epoch++;
    }
}

enum status loader_state_load(struct loader *ld, const struct loader_state *state, struct error *err) {
    const struct loader_state *now = &ld->state;
    const char *what = "resume: the checkpoint's data order does not continue with this run's";
    if (state->seed != now->seed)
        return error_set(err, STATUS_BAD_INPUT, "%s: [train] seed changed from %" PRIu64 " to %" PRIu64
                         " (the sample order depends on it)", what, state->seed, now->seed);
    if (state->format >= 2) {
        if (state->seq_len != now->seq_len)
            return error_set(err, STATUS_BAD_INPUT, "%s: [train] seq_len changed from %" PRIu64 " to %" PRIu64
                             " (the sequences are cut by it)", what, state->seq_len, now->seq_len);
        if (state->n_datasets != now->n_datasets)
            return error_set(err, STATUS_BAD_INPUT, "%s: the number of datasets ([data] path / paths) changed "
                             "from %" PRIu64 " to %" PRIu64, what, state->n_datasets, now->n_datasets);
        for (int d = 0; d < ld->n_sources; d++) {
            if (state->sequences[d] != now->sequences[d])
                return error_set(err, STATUS_BAD_INPUT, "%s: dataset %d (%s) held %" PRIu64 " %s sequences, "
                                 "now %" PRIu64 " (another dataset or changed data)", what, d,
                                 ld->sources[d].ds->dir, state->sequences[d], split_name(ld->split),
                                 now->sequences[d]);
            if (fabs(state->weights[d] - now->weights[d]) > 1e-12)
                return error_set(err, STATUS_BAD_INPUT, "%s: the weight of dataset %d (%s) changed from %.9g "
                                 "to %.9g ([data] paths)", what, d, ld->sources[d].ds->dir,
                                 state->weights[d], now->weights[d]);
        }
    } else if (ld->n_sources > 1) {
        return error_set(err, STATUS_BAD_INPUT, "%s: the checkpoint predates blending (one dataset), this "
                         "run blends %d ([data] paths)", what, ld->n_sources);
    }
    struct loader_state st = *state;
    if (st.format < 2) { // batch index of the same global_batch_size
        st.sample = state->sample * (uint64_t)ld->global_batch_size;
        st.format = 2;
        st.seq_len = now->seq_len;
        st.n_datasets = now->n_datasets;
        memcpy(st.sequences, now->sequences, sizeof st.sequences);
        memcpy(st.weights, now->weights, sizeof st.weights);
        memset(st.counts, 0, sizeof st.counts);
    }
    bool one = ld->n_sources == 1;
    if ((one && st.sample >= ld->sources[0].n) || (!one && st.epoch != 0) || st.micro >= (uint64_t)ld->accum)
        return error_set(err, STATUS_BAD_INPUT,
                         "loader state (epoch %" PRIu64 ", sample %" PRIu64 ", micro %" PRIu64 ") is out of range: "
                         "%" PRIu64 " sequences per epoch, %d microbatches per batch",
                         state->epoch, state->sample, state->micro, ld->sources[0].n, ld->accum);
    if (!one) {
        uint64_t sum = 0;
        for (int d = 0; d < ld->n_sources; d++) sum += st.counts[d];
        if (sum != st.sample)
            return error_set(err, STATUS_BAD_INPUT, "loader state: blend counts sum to %" PRIu64 ", not the "
                             "%" PRIu64 " samples consumed", sum, st.sample);
    }
    ld->state = st;
    ld->state.global_batch_size = (uint64_t)ld->global_batch_size;
    if (st.micro == 0) fit_epoch(ld);
    return STATUS_OK;
}

int loader_state_entries(struct loader_saved *s, struct state_entry *out, int cap) {
    const struct state_entry mine[] = {
        {"loader_samples", STATE_U64, LOADER_SAVED_WORDS, s->samples, .found = &s->has_samples},
        {"loader_weights", STATE_F64, LOADER_MAX_DATASETS, s->weights, .found = &s->has_weights},
        {"loader", STATE_U64, 4, s->batch, .read_only = true, .found = &s->has_batch}, // format 1
    };
    return state_entries_put(out, cap, mine, sizeof mine / sizeof mine[0]);
}

void loader_saved_pack(const struct loader_state *st, struct loader_saved *s) {
    uint64_t head[8] = {st->format, st->seed,    st->epoch,      st->sample,
                        st->micro,  st->seq_len, st->n_datasets, st->global_batch_size};
    memset(s, 0, sizeof *s);
    memcpy(s->samples, head, sizeof head);
    memcpy(s->samples + 8, st->counts, sizeof st->counts);
    memcpy(s->samples + 8 + LOADER_MAX_DATASETS, st->sequences, sizeof st->sequences);
    memcpy(s->weights, st->weights, sizeof s->weights);
}

enum status loader_saved_unpack(const struct loader_saved *s, struct loader_state *st, struct error *err) {
    if (!s->has_samples) { // format 1: (seed, epoch, batch, micro)
        if (!s->has_batch) return error_set(err, STATUS_BAD_INPUT, "/state has no loader_samples (nor an older loader)");
        *st = (struct loader_state){.format = 1, .seed = s->batch[0], .epoch = s->batch[1], .sample = s->batch[2],
                                    .micro = s->batch[3]};
        return STATUS_OK;
    }
    if (!s->has_weights) return error_set(err, STATUS_BAD_INPUT, "/state has loader_samples but no loader_weights");
    const uint64_t *w = s->samples;
    *st = (struct loader_state){.format = w[0], .seed = w[1], .epoch = w[2], .sample = w[3], .micro = w[4],
                                .seq_len = w[5], .n_datasets = w[6], .global_batch_size = w[7]};
    memcpy(st->counts, w + 8, sizeof st->counts);
    memcpy(st->sequences, w + 8 + LOADER_MAX_DATASETS, sizeof st->sequences);
    memcpy(st->weights, s->weights, sizeof st->weights);
    if (st->format > 2 || st->n_datasets > LOADER_MAX_DATASETS)
        return error_set(err, STATUS_BAD_INPUT, "/state loader_samples has format %" PRIu64 " with %" PRIu64
                         " datasets; this trident reads formats up to 2 with at most %d", st->format,
                         st->n_datasets, LOADER_MAX_DATASETS);
    return STATUS_OK;
}

// Reads sequence seq of the split of ds: tokens [seq*T, seq*T + T + 1) into
// out (T + 1,), from one shard or across the boundary of two.
static enum status read_sequence(struct loader *ld, struct dataset *ds, uint64_t seq, int32_t *out,
                                 uint8_t *mask, struct error *err) {
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
        if (!s && mask) s = dataset_read_mask(ds, ids[lo], at, n, mask, ld->memspace, err);
        if (s) return s;
        if (mask) mask += n;
        out += n;
        start += n;
        left -= n;
        lo++;
    }
    return STATUS_OK;
}

// Global batches whose shards the hot tier's stager is told about ahead.
#define LOADER_ANNOUNCE_BATCHES 8

// The shard of ds holding token start of the split's stream.
static int shard_at(const struct loader *ld, const struct dataset *ds, uint64_t start) {
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
// order of first need: the node's stager copies them ahead (cache.h). The
// walk repeats loader_next's order from the state at a batch boundary: one
// dataset's permutation with its epoch tails dropped (fit_epoch), or the
// blend's mixture from its counts; each blended dataset with a cache is told
// its own shards.
static void announce_shards(struct loader *ld) {
    bool cached = false;
    for (int d = 0; d < ld->n_sources; d++) cached |= ld->sources[d].ds->cache != NULL;
    if (!cached) return;
    const uint64_t G = (uint64_t)ld->global_batch_size, span = G * LOADER_ANNOUNCE_BATCHES;
    struct loader_state st = ld->state;
    int *src_of = xmalloc(2 * span * sizeof *src_of), *shard = xmalloc(2 * span * sizeof *shard);
    size_t n = 0;
    for (uint64_t k = 0; k < span; k++) {
        int d = 0;
        uint64_t seq;
        if (ld->n_sources == 1) {
            if (k % G == 0 && st.sample + G > ld->sources[0].n) st.sample = 0, st.epoch++;
            seq = loader_sequence_at(ld, st.epoch, st.sample++);
        } else {
            d = loader_blend_choose(st.weights, ld->n_sources, st.sample++, st.counts);
            const struct loader_source *src = &ld->sources[d];
            uint64_t c = st.counts[d]++;
            seq = source_sequence_at(src, c / src->n, c % src->n);
        }
        const struct dataset *ds = ld->sources[d].ds;
        if (!ds->cache) continue;
        uint64_t T = (uint64_t)ds->seq_len;
        int first = shard_at(ld, ds, seq * T), last = shard_at(ld, ds, seq * T + T);
        src_of[n] = d, shard[n++] = first;
        if (last != first) src_of[n] = d, shard[n++] = last;
    }
    int *list = xmalloc((n ? n : 1) * sizeof *list);
    for (int d = 0; d < ld->n_sources; d++) {
        if (!ld->sources[d].ds->cache) continue;
        int m = 0;
        for (size_t i = 0; i < n; i++)
            if (src_of[i] == d) list[m++] = shard[i];
        cache_want(ld->sources[d].ds->cache, list, m);
    }
    free(list);
    free(src_of);
    free(shard);
}

// Reads (and logs) sample pos of the loader's order: sequence seq of source d.
static enum status serve(struct loader *ld, uint64_t epoch, uint64_t pos, int d, uint64_t seq, int32_t *out,
                         uint8_t *mask, struct error *err) {
    if (ld->log) fprintf(ld->log, "%" PRIu64 " %" PRIu64 " %d %" PRIu64 "\n", epoch, pos, d, seq);
    return read_sequence(ld, ld->sources[d].ds, seq, out, mask, err);
}

enum status loader_next(struct loader *ld, int32_t *tokens, struct error *err) {
    return loader_next_masked(ld, tokens, NULL, err);
}

enum status loader_next_masked(struct loader *ld, int32_t *tokens, uint8_t *mask, struct error *err) {
    const uint64_t G = (uint64_t)ld->global_batch_size, per_rank = G / (uint64_t)ld->dp_size;
    const uint64_t offset = (uint64_t)ld->dp_rank * per_rank + ld->state.micro * (uint64_t)ld->micro_batch_size;
    const uint64_t B = (uint64_t)ld->micro_batch_size;
    const size_t row = (size_t)ld->ds->seq_len + 1;
    if (ld->state.micro == 0) announce_shards(ld);
    struct loader_state *st = &ld->state;
    if (ld->n_sources == 1) {
        for (uint64_t j = 0; j < B; j++) {
            uint64_t pos = st->sample + offset + j;
            enum status s = serve(ld, st->epoch, pos, 0, loader_sequence_at(ld, st->epoch, pos),
                                  tokens + j * row, mask ? mask + j * row : NULL, err);
            if (s) return s;
        }
    } else {
        // Walk the batch's mixture from the step's counts to this microbatch.
        memcpy(ld->counts, st->counts, sizeof ld->counts);
        for (uint64_t k = 0; k < offset + B; k++) {
            uint64_t pos = st->sample + k;
            int d = loader_blend_choose(st->weights, ld->n_sources, pos, ld->counts);
            uint64_t c = ld->counts[d]++;
            if (k < offset) continue;
            const struct loader_source *src = &ld->sources[d];
            enum status s = serve(ld, 0, pos, d, source_sequence_at(src, c / src->n, c % src->n),
                                  tokens + (k - offset) * row, mask ? mask + (k - offset) * row : NULL, err);
            if (s) return s;
        }
    }
    if (++st->micro == (uint64_t)ld->accum) {
        st->micro = 0;
        if (ld->n_sources > 1)
            for (uint64_t k = 0; k < G; k++)
                st->counts[loader_blend_choose(st->weights, ld->n_sources, st->sample + k, st->counts)]++;
        st->sample += G;
        fit_epoch(ld);
    }
    return STATUS_OK;
}

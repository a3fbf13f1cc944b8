// test_dataset.c: shards written from known token arrays (uint16 and uint32),
// then the loader's contract: coverage per epoch across DP ranks, equal batch
// counts, dropped tail, determinism, new permutation per epoch, bit-exact
// resume, and served tokens equal to slices of the source array.
#include <string.h>
#include <unistd.h>

#include "data/dataset.h"
#include "test.h"

// Source stream: a scramble of positions, so that a token value names its
// position (pos_of) and a served row tells which sequence it is.
struct source {
    int32_t *tokens;  // (n,)
    int64_t *pos_of;  // (vocab,) position of each value, -1 when unused
    uint64_t n;
    int64_t vocab;
};

static struct source source_make(uint64_t n, int64_t vocab, int64_t base) {
    struct source s = {xmalloc(n * sizeof(int32_t)), xmalloc((size_t)vocab * sizeof(int64_t)), n, vocab};
    for (int64_t v = 0; v < vocab; v++) s.pos_of[v] = -1;
    for (uint64_t i = 0; i < n; i++) {
        s.tokens[i] = (int32_t)(base + (int64_t)((i * 7919u) % n)); // 7919 prime, coprime to n
        s.pos_of[s.tokens[i]] = (int64_t)i;
    }
    return s;
}

// Writes dir with the source cut into train shards of the given sizes (and
// documents of 5 tokens, the last one shorter), plus one val shard.
static void write_dataset(const char *dir, const struct source *src, const uint64_t *sizes, int n_sizes,
                          const int32_t *val, uint64_t n_val) {
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0, "rm");
    struct dataset_writer w;
    struct error err = {0};
    EXPECT(dataset_writer_init(&w, dir, src->vocab, 0, "test-tok-1", &err) == STATUS_OK, "%s", err.msg);
    uint64_t at = 0;
    uint64_t offsets[4096];
    for (int k = 0; k < n_sizes; k++) {
        uint64_t n = sizes[k], d = 0;
        for (uint64_t o = 0; o < n; o += 5) offsets[d++] = o;
        offsets[d] = n;
        EXPECT(dataset_writer_add(&w, SPLIT_TRAIN, src->tokens + at, n, offsets, d, &err) == STATUS_OK, "%s", err.msg);
        at += n;
    }
    EXPECT(at == src->n, "shard sizes cover the source");
    if (n_val) {
        uint64_t vo[2] = {0, n_val};
        EXPECT(dataset_writer_add(&w, SPLIT_VAL, val, n_val, vo, 1, &err) == STATUS_OK, "%s", err.msg);
    }
    EXPECT(dataset_writer_finish(&w, &err) == STATUS_OK, "%s", err.msg);
}

// Which sequence a served row (T + 1,) is; -1 when it is not a slice of the
// source at a multiple of T (content check).
static int64_t row_sequence(const struct source *src, const int32_t *row, int T) {
    int64_t p = row[0] >= 0 && row[0] < src->vocab ? src->pos_of[row[0]] : -1;
    if (p < 0 || p % T || (uint64_t)p + (uint64_t)T >= src->n) return -1;
    for (int k = 0; k <= T; k++)
        if (row[k] != src->tokens[p + k]) return -1;
    return p / T;
}

// One epoch over dp ranks: every sequence served at most once, batches*G in
// all (the tail dropped), each rank the same microbatch count; the union of the
// ranks' rows of each global batch equals the dp=1 loader's batch.
static void check_epochs(struct dataset *ds, const struct source *src, int dp, int micro, int G) {
    const int T = ds->seq_len;
    struct error err = {0};
    struct loader ld[8], ref;
    for (int r = 0; r < dp; r++)
        EXPECT(loader_init(&ld[r], ds, SPLIT_TRAIN, r, dp, micro, G, 1234, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(loader_init(&ref, ds, SPLIT_TRAIN, 0, 1, G, G, 1234, &err) == STATUS_OK, "%s", err.msg);
    uint64_t n_seq = ds->split_sequences[SPLIT_TRAIN], batches = n_seq / (uint64_t)G;
    EXPECT(ld[0].batches_per_epoch == batches, "dp %d: %llu batches per epoch, expected %llu", dp,
           (unsigned long long)ld[0].batches_per_epoch, (unsigned long long)batches);
    int32_t *row = xmalloc((size_t)micro * (T + 1) * sizeof *row), *grow = xmalloc((size_t)G * (T + 1) * sizeof *grow);
    int *served = xcalloc(n_seq, sizeof *served);
    int64_t *first_order = xmalloc(n_seq * sizeof *first_order);
    uint64_t n_first = 0;
    for (int epoch = 0; epoch < 2; epoch++) {
        memset(served, 0, n_seq * sizeof *served);
        uint64_t count = 0, same_order = 0, n_order = 0;
        for (uint64_t b = 0; b < batches; b++) {
            int in_ref[4096] = {0};
            EXPECT(loader_next(&ref, grow, &err) == STATUS_OK, "%s", err.msg);
            for (int j = 0; j < G; j++) {
                int64_t s = row_sequence(src, grow + (size_t)j * (T + 1), T);
                if (s >= 0) in_ref[s] = 1;
            }
            for (int r = 0; r < dp; r++)
                for (int a = 0; a < ld[r].accum; a++) {
                    EXPECT(ld[r].state.epoch == (uint64_t)epoch, "rank %d still in epoch %d", r, epoch);
                    EXPECT(loader_next(&ld[r], row, &err) == STATUS_OK, "%s", err.msg);
                    for (int j = 0; j < micro; j++) {
                        int64_t s = row_sequence(src, row + (size_t)j * (T + 1), T);
                        EXPECT(s >= 0, "dp %d rank %d: row is not a source slice at a sequence start", dp, r);
                        if (s < 0) continue;
                        EXPECT(in_ref[s], "dp %d: sequence %lld not in the dp=1 global batch %llu", dp, (long long)s,
                               (unsigned long long)b);
                        served[s]++;
                        count++;
                        if (epoch == 0) first_order[n_first++] = s;
                        else {
                            same_order += first_order[n_order] == s;
                            n_order++;
                        }
                    }
                }
        }
        int dup = 0;
        for (uint64_t s = 0; s < n_seq; s++) dup += served[s] > 1;
        EXPECT(dup == 0, "dp %d epoch %d: %d sequences served twice", dp, epoch, dup);
        EXPECT(count == batches * (uint64_t)G, "dp %d epoch %d: %llu served, expected %llu (tail of %llu dropped)", dp,
               epoch, (unsigned long long)count, (unsigned long long)(batches * G),
               (unsigned long long)(n_seq - batches * G));
        for (int r = 0; r < dp; r++)
            EXPECT(ld[r].state.epoch == (uint64_t)epoch + 1 && ld[r].state.sample == 0 && ld[r].state.micro == 0,
                   "dp %d rank %d: not at the start of epoch %d after %llu batches", dp, r, epoch + 1,
                   (unsigned long long)batches);
        if (epoch == 1)
            EXPECT(same_order < n_order / 2, "dp %d: epoch 1 repeats epoch 0's order (%llu of %llu same)", dp,
                   (unsigned long long)same_order, (unsigned long long)n_order);
    }
    for (int r = 0; r < dp; r++) loader_free(&ld[r]);
    loader_free(&ref);
    free(row), free(grow), free(served), free(first_order);
}

// Runs steps microbatches, writing them to out (steps, micro, T + 1).
static void run_steps(struct loader *ld, int steps, int32_t *out) {
    struct error err = {0};
    size_t per = (size_t)ld->micro_batch_size * (ld->ds->seq_len + 1);
    for (int i = 0; i < steps; i++) EXPECT(loader_next(ld, out + i * per, &err) == STATUS_OK, "%s", err.msg);
}

// Resume: save after `at` microbatches, reload into a fresh loader, and the
// continuation equals the uninterrupted run.
static void check_resume(struct dataset *ds, int dp, int rank, int micro, int G, int at, int total,
                         uint64_t expect_epoch) {
    struct error err = {0};
    struct loader a, b, c;
    size_t per = (size_t)micro * (ds->seq_len + 1);
    int32_t *ref = xmalloc(total * per * sizeof *ref), *got = xmalloc(total * per * sizeof *got);
    EXPECT(loader_init(&a, ds, SPLIT_TRAIN, rank, dp, micro, G, 99, &err) == STATUS_OK, "%s", err.msg);
    run_steps(&a, total, ref);
    EXPECT(loader_init(&b, ds, SPLIT_TRAIN, rank, dp, micro, G, 99, &err) == STATUS_OK, "%s", err.msg);
    run_steps(&b, at, got);
    struct loader_state st;
    loader_state_save(&b, &st);
    EXPECT(st.epoch == expect_epoch, "saved at microbatch %d in epoch %llu, expected %llu", at,
           (unsigned long long)st.epoch, (unsigned long long)expect_epoch);
    // A fresh loader with another seed refuses the state, naming both seeds.
    EXPECT(loader_init(&c, ds, SPLIT_TRAIN, rank, dp, micro, G, 5, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(loader_state_load(&c, &st, &err) == STATUS_BAD_INPUT && strstr(err.msg, "seed changed from 99 to 5"),
           "another seed: %s", err.msg);
    loader_free(&c);
    EXPECT(loader_init(&c, ds, SPLIT_TRAIN, rank, dp, micro, G, 99, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(loader_state_load(&c, &st, &err) == STATUS_OK, "%s", err.msg);
    run_steps(&c, total - at, got + at * per);
    EXPECT(memcmp(ref, got, total * per * sizeof *ref) == 0, "resume at %d (dp %d micro %d G %d) diverges", at, dp,
           micro, G);
    struct loader_state bad = st;
    bad.sample = c.sources[0].n;
    EXPECT(loader_state_load(&c, &bad, &err) == STATUS_BAD_INPUT, "out-of-range state accepted");
    loader_free(&a), loader_free(&b), loader_free(&c);
    free(ref), free(got);
}

int main(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/trident_test_dataset_%d", (int)getpid());
    struct error err = {0};
    const int T = 4;

    // uint16: 203 tokens = 50 sequences of T=4; shards of 37, 61, 105 tokens
    // so that sequences cross shard boundaries.
    struct source s16 = source_make(203, 1000, 0);
    int32_t val[21];
    for (int i = 0; i < 21; i++) val[i] = 900 + i;
    uint64_t sizes16[] = {37, 61, 105};
    write_dataset(dir, &s16, sizes16, 3, val, 21);
    struct dataset *ds = NULL;
    EXPECT(dataset_open(dir, T, 1000, "test-tok-1", &ds, &err) == STATUS_OK, "%s", err.msg);
    if (!ds) return test_finish("test_dataset");
    struct shard *h5;
    EXPECT(dataset_shard_get(ds, 0, &h5, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(ds->shards[0].h5.elem_bytes == 2, "vocab 1000 stored as uint16, got %d bytes", ds->shards[0].h5.elem_bytes);
    EXPECT(ds->split_tokens[SPLIT_TRAIN] == 203 && ds->split_sequences[SPLIT_TRAIN] == 50, "train: %llu tokens",
           (unsigned long long)ds->split_tokens[SPLIT_TRAIN]);
    EXPECT(ds->split_tokens[SPLIT_VAL] == 21 && ds->split_sequences[SPLIT_VAL] == 5, "val: %llu tokens",
           (unsigned long long)ds->split_tokens[SPLIT_VAL]);

    // Coverage across DP ranks; 48 of 50 with G=4 and G=8 (tail 2), 48 with
    // G=6, and all 50 exactly once with G=10.
    check_epochs(ds, &s16, 1, 2, 4);
    check_epochs(ds, &s16, 2, 1, 4);
    check_epochs(ds, &s16, 3, 2, 6);
    check_epochs(ds, &s16, 4, 1, 8);
    check_epochs(ds, &s16, 2, 5, 10);

    // Same seed same batches, another seed other batches.
    struct loader a, b;
    int32_t ra[10 * 3 * 5], rb[10 * 3 * 5];
    EXPECT(loader_init(&a, ds, SPLIT_TRAIN, 0, 1, 3, 6, 7, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(loader_init(&b, ds, SPLIT_TRAIN, 0, 1, 3, 6, 7, &err) == STATUS_OK, "%s", err.msg);
    run_steps(&a, 10, ra);
    run_steps(&b, 10, rb);
    EXPECT(memcmp(ra, rb, sizeof ra) == 0, "same seed, different batches");
    loader_free(&b);
    EXPECT(loader_init(&b, ds, SPLIT_TRAIN, 0, 1, 3, 6, 8, &err) == STATUS_OK, "%s", err.msg);
    run_steps(&b, 10, rb);
    EXPECT(memcmp(ra, rb, sizeof ra) != 0, "seeds 7 and 8 give the same batches");
    // loader_reset starts over.
    loader_reset(&a);
    run_steps(&a, 10, rb);
    EXPECT(memcmp(ra, rb, sizeof ra) == 0, "loader_reset does not replay the first batches");
    loader_free(&a), loader_free(&b);

    // Validation split: 5 sequences, the whole split in one batch.
    EXPECT(loader_init(&a, ds, SPLIT_VAL, 0, 1, 5, 5, 1, &err) == STATUS_OK, "%s", err.msg);
    int32_t vrow[5 * 5];
    run_steps(&a, 1, vrow);
    int seen_val[5] = {0};
    for (int j = 0; j < 5; j++) {
        int p = vrow[j * 5] - 900;
        EXPECT(p >= 0 && p % T == 0 && p / T < 5, "val row %d starts with %d", j, vrow[j * 5]);
        if (p >= 0 && p % T == 0 && p / T < 5) seen_val[p / T]++;
        for (int k = 0; k <= T; k++) EXPECT(vrow[j * 5 + k] == vrow[j * 5] + k, "val row %d not contiguous", j);
    }
    for (int j = 0; j < 5; j++) EXPECT(seen_val[j] == 1, "val sequence %d served %d times", j, seen_val[j]);
    loader_free(&a);
    EXPECT(loader_init(&a, ds, SPLIT_VAL, 0, 1, 3, 6, 1, &err) == STATUS_BAD_INPUT, "G=6 > 5 val sequences accepted");
    EXPECT(loader_init(&a, ds, SPLIT_TRAIN, 0, 2, 2, 6, 1, &err) == STATUS_BAD_INPUT, "G=6 with micro 2 * dp 2 accepted");
    dataset_close(ds);

    // Resume: 10 sequences (41 tokens, T=4), batch 2: saved at step 7 (epoch
    // 1, 0-based: the second epoch), and mid-global-batch with micro 1.
    struct source s10 = source_make(41, 100, 0);
    uint64_t sizes10[] = {17, 24};
    write_dataset(dir, &s10, sizes10, 2, NULL, 0);
    EXPECT(dataset_open(dir, T, 0, NULL, &ds, &err) == STATUS_OK, "%s", err.msg);
    if (ds) {
        EXPECT(ds->split_sequences[SPLIT_TRAIN] == 10, "10 sequences, got %llu",
               (unsigned long long)ds->split_sequences[SPLIT_TRAIN]);
        check_resume(ds, 1, 0, 2, 2, 7, 15, 1);  // 5 batches per epoch: step 7 is in epoch 1
        check_resume(ds, 1, 0, 2, 2, 3, 15, 0);  // mid-epoch 0
        check_resume(ds, 1, 0, 1, 2, 7, 30, 0);  // micro 1: between the two halves of a batch
        check_resume(ds, 2, 1, 1, 2, 6, 15, 1);  // dp 2, rank 1
        // A state saved at a step boundary by dp=1 resumes on dp=2: the two
        // ranks' next microbatches are the halves of dp=1's next batch.
        struct loader one, r0, r1;
        int32_t skip[7 * 2 * 5], ref[3 * 2 * 5], h0[3 * 5], h1[3 * 5];
        struct loader_state st;
        EXPECT(loader_init(&one, ds, SPLIT_TRAIN, 0, 1, 2, 2, 42, &err) == STATUS_OK, "%s", err.msg);
        run_steps(&one, 7, skip);
        loader_state_save(&one, &st);
        run_steps(&one, 3, ref);
        EXPECT(loader_init(&r0, ds, SPLIT_TRAIN, 0, 2, 1, 2, 42, &err) == STATUS_OK, "%s", err.msg);
        EXPECT(loader_init(&r1, ds, SPLIT_TRAIN, 1, 2, 1, 2, 42, &err) == STATUS_OK, "%s", err.msg);
        EXPECT(loader_state_load(&r0, &st, &err) == STATUS_OK && loader_state_load(&r1, &st, &err) == STATUS_OK,
               "%s", err.msg);
        run_steps(&r0, 3, h0);
        run_steps(&r1, 3, h1);
        for (int k = 0; k < 3; k++)
            EXPECT(!memcmp(ref + k * 10, h0 + k * 5, 5 * sizeof(int32_t)) &&
                       !memcmp(ref + k * 10 + 5, h1 + k * 5, 5 * sizeof(int32_t)),
                   "dp=1 -> dp=2 resume: step %d differs", k);
        loader_free(&one), loader_free(&r0), loader_free(&r1);
        dataset_close(ds);
    }

    // uint32: vocab 70000 > 65536, ids above 65535, sequences over 4 shards.
    struct source s32 = source_make(97, 70000, 65000);
    uint64_t sizes32[] = {10, 30, 7, 50};
    write_dataset(dir, &s32, sizes32, 4, NULL, 0);
    EXPECT(dataset_open(dir, 6, 70000, "test-tok-1", &ds, &err) == STATUS_OK, "%s", err.msg);
    if (ds) {
        EXPECT(dataset_shard_get(ds, 0, &h5, &err) == STATUS_OK, "%s", err.msg);
        EXPECT(ds->shards[0].h5.elem_bytes == 4, "vocab 70000 stored as uint32, got %d bytes",
               ds->shards[0].h5.elem_bytes);
        EXPECT(loader_init(&a, ds, SPLIT_TRAIN, 0, 1, 2, 16, 3, &err) == STATUS_OK, "%s", err.msg);
        int32_t rows[2 * 7];
        int ok = 0;
        for (int i = 0; i < 8; i++) {
            run_steps(&a, 1, rows);
            for (int j = 0; j < 2; j++) ok += row_sequence(&s32, rows + j * 7, 6) >= 0;
        }
        EXPECT(ok == 16, "uint32: %d of 16 rows are source slices", ok);
        loader_free(&a);
        dataset_close(ds);
    }
    struct source *srcs[] = {&s16, &s10, &s32};
    for (int i = 0; i < 3; i++) free(srcs[i]->tokens), free(srcs[i]->pos_of);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0, "cleanup");
    return test_finish("test_dataset");
}

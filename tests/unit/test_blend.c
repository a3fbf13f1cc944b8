// test_blend.c: the loader state in samples and dataset blending (issue 13).
//  - A global batch size change on resume continues at the next unconsumed
//    sample: 2 steps of G = 4, then G = 8 serves permutation positions 8-15,
//    the positions an uninterrupted G = 4 run serves in its steps 3 and 4.
//  - A changed seed, seq_len, weight or dataset count is refused naming the
//    old and new value; a format 1 state (batch index) is converted.
//  - Two datasets at 0.7 / 0.3: over 1,000 mixture samples dataset 0's share is
//    0.7 +- 0.02 (Megatron's rule realises it within 1/1000), each dataset
//    serves every sequence once per epoch of it (checked against the source
//    arrays the datasets were written from), the mixture (dataset, sequence)
//    per position is the same for dp = 1, 2 and 4, and a resume (same or
//    another global batch size and dp) is bit-exact against the straight run.
//  - blend_parse: normalised weights; each malformed list refused naming the key.
#include <string.h>
#include <unistd.h>

#include "data/dataset.h"
#include "test.h"

#define T 4

// Dataset k's tokens are base_k + position (distinct ranges), so a served row
// names its dataset and sequence.
static void write_dataset(const char *dir, int64_t base, uint64_t n) {
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0, "rm");
    int32_t *tok = xmalloc(n * sizeof *tok);
    for (uint64_t i = 0; i < n; i++) tok[i] = (int32_t)(base + (int64_t)i);
    uint64_t offsets[2] = {0, n};
    struct dataset_writer w;
    struct error err = {0};
    EXPECT(dataset_writer_init(&w, dir, 4000, 0, "test-tok-1", &err) == STATUS_OK, "%s", err.msg);
    uint64_t half = n / 2, o2[2] = {0, n - half};
    offsets[1] = half;
    EXPECT(dataset_writer_add(&w, SPLIT_TRAIN, tok, half, offsets, 1, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(dataset_writer_add(&w, SPLIT_TRAIN, tok + half, n - half, o2, 1, &err) == STATUS_OK, "%s", err.msg);
    EXPECT(dataset_writer_finish(&w, &err) == STATUS_OK, "%s", err.msg);
    free(tok);
}

// (dataset, sequence) of a served row; dataset -1 when the row is no slice.
struct sample {
    int d;
    int64_t seq;
};

static struct sample row_sample(const int32_t *row) {
    struct sample s = {row[0] >= 2000 ? 1 : 0, 0};
    int64_t p = row[0] - (s.d ? 2000 : 0);
    s.seq = p / T;
    if (p % T) s.d = -1;
    for (int k = 1; k <= T; k++)
        if (row[k] != row[0] + k) s.d = -1;
    return s;
}

// Runs `steps` global batches over dp loaders ld (micro B each) and writes the
// sample of each mixture position [first, first + steps*G) into out.
static void run_global(struct loader *ld, int dp, int steps, struct sample *out) {
    struct error err = {0};
    int G = ld[0].global_batch_size, B = ld[0].micro_batch_size, accum = ld[0].accum;
    int32_t *rows = xmalloc((size_t)B * (T + 1) * sizeof *rows);
    for (int s = 0; s < steps; s++)
        for (int r = 0; r < dp; r++)
            for (int k = 0; k < accum; k++) {
                EXPECT(loader_next(&ld[r], rows, &err) == STATUS_OK, "%s", err.msg);
                for (int j = 0; j < B; j++)
                    out[(size_t)s * G + (size_t)r * (G / dp) + (size_t)k * B + j] = row_sample(rows + j * (T + 1));
            }
    free(rows);
}

static void init_all(struct loader *ld, int dp, struct dataset **ds, const double *w, int n, int B, int G,
                     uint64_t seed) {
    struct error err = {0};
    for (int r = 0; r < dp; r++)
        EXPECT(loader_init_blend(&ld[r], ds, w, n, SPLIT_TRAIN, r, dp, B, G, seed, &err) == STATUS_OK, "%s",
               err.msg);
}

static void free_all(struct loader *ld, int dp) {
    for (int r = 0; r < dp; r++) loader_free(&ld[r]);
}

static bool same(const struct sample *a, const struct sample *b, size_t n, size_t *at) {
    for (size_t i = 0; i < n; i++)
        if (a[i].d != b[i].d || a[i].seq != b[i].seq) return *at = i, false;
    return true;
}

// The global batch change of issue 13 on one dataset of 40 sequences.
static void check_batch_change(struct dataset *ds) {
    struct error err = {0};
    struct loader ref, a, b;
    struct sample want[16], got[16];
    double one = 1;
    init_all(&ref, 1, &ds, &one, 1, 2, 4, 7);
    run_global(&ref, 1, 4, want); // positions 0-15 at G = 4
    init_all(&a, 1, &ds, &one, 1, 2, 4, 7);
    run_global(&a, 1, 2, got);
    struct loader_state st;
    loader_state_save(&a, &st);
    EXPECT(st.sample == 8 && st.epoch == 0, "after 2 steps of G = 4: sample %llu", (unsigned long long)st.sample);
    init_all(&b, 1, &ds, &one, 1, 4, 8, 7); // G = 8
    EXPECT(loader_state_load(&b, &st, &err) == STATUS_OK, "%s", err.msg);
    run_global(&b, 1, 1, got + 8);
    size_t at = 0;
    EXPECT(same(want, got, 16, &at), "G 4 -> 8: position %zu serves sequence %lld, the straight run %lld", at,
           (long long)got[at].seq, (long long)want[at].seq);
    for (int i = 0; i < 16; i++)
        EXPECT(got[i].seq == (int64_t)loader_sequence_at(&ref, 0, (uint64_t)i), "position %d is not permutation "
               "position %d", i, i);
    int seen[40] = {0};
    for (int i = 0; i < 16; i++) seen[got[i].seq]++;
    for (int i = 0; i < 40; i++) EXPECT(seen[i] <= 1, "sequence %d served %d times", i, seen[i]);
    // Format 1 (batch index 2 of G = 4): converted to sample 8.
    struct loader_state old = {.format = 1, .seed = 7, .epoch = 0, .sample = 2};
    loader_free(&b);
    init_all(&b, 1, &ds, &one, 1, 2, 4, 7);
    EXPECT(loader_state_load(&b, &old, &err) == STATUS_OK && b.state.sample == 8, "format 1: %s", err.msg);
    run_global(&b, 1, 2, got + 8);
    EXPECT(same(want, got, 16, &at), "format 1 state: position %zu differs", at);
    // Refusals name what changed.
    struct loader_state bad = st;
    bad.seq_len = 8;
    EXPECT(loader_state_load(&b, &bad, &err) == STATUS_BAD_INPUT && strstr(err.msg, "seq_len changed from 8 to 4"),
           "seq_len: %s", err.msg);
    bad = st, bad.seed = 8;
    EXPECT(loader_state_load(&b, &bad, &err) == STATUS_BAD_INPUT && strstr(err.msg, "seed changed from 8 to 7"),
           "seed: %s", err.msg);
    bad = st, bad.n_datasets = 2;
    EXPECT(loader_state_load(&b, &bad, &err) == STATUS_BAD_INPUT && strstr(err.msg, "from 2 to 1"),
           "datasets: %s", err.msg);
    // Near the end of the epoch a larger batch drops the tail: 36 + 8 > 40.
    bad = st, bad.sample = 36;
    loader_free(&b);
    init_all(&b, 1, &ds, &one, 1, 4, 8, 7);
    EXPECT(loader_state_load(&b, &bad, &err) == STATUS_OK && b.state.epoch == 1 && b.state.sample == 0,
           "tail: epoch %llu sample %llu", (unsigned long long)b.state.epoch, (unsigned long long)b.state.sample);
    loader_free(&ref), loader_free(&a), loader_free(&b);
}

static void check_blend(struct dataset **ds) {
    struct error err = {0};
    const double w[2] = {7, 3}; // normalised by the loader
    const int G = 8, steps = 125, N = G * steps;
    struct sample *mix[3];
    const int dps[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        struct loader ld[4];
        init_all(ld, dps[i], ds, w, 2, 2, G, 11);
        mix[i] = xmalloc((size_t)N * sizeof *mix[i]);
        run_global(ld, dps[i], steps, mix[i]);
        free_all(ld, dps[i]);
    }
    size_t at = 0;
    EXPECT(same(mix[0], mix[1], N, &at), "dp 2 mixture differs from dp 1 at position %zu", at);
    EXPECT(same(mix[0], mix[2], N, &at), "dp 4 mixture differs from dp 1 at position %zu", at);
    // Proportions, validity, exact-once per epoch of each dataset.
    int count[2] = {0, 0}, bad = 0;
    uint64_t n[2] = {ds[0]->split_sequences[SPLIT_TRAIN], ds[1]->split_sequences[SPLIT_TRAIN]};
    int *seen[2] = {xcalloc(n[0], sizeof(int)), xcalloc(n[1], sizeof(int))};
    int dup = 0, worst_lag = 0;
    for (int i = 0; i < N; i++) {
        struct sample s = mix[0][i];
        if (s.d < 0 || s.seq < 0 || (uint64_t)s.seq >= n[s.d]) {
            bad++;
            continue;
        }
        int c = count[s.d]++;
        int epoch = c / (int)n[s.d];
        if (seen[s.d][s.seq] != epoch) dup++; // served twice in an epoch (or skipped one)
        seen[s.d][s.seq] = epoch + 1;
        int lag = abs((int)lround(0.7 * (i + 1)) - count[0]);
        if (lag > worst_lag) worst_lag = lag;
    }
    double share = (double)count[0] / N;
    printf("blend 0.7/0.3 over %d samples: dataset 0 share %.4f, worst running lag %d samples\n", N, share,
           worst_lag);
    EXPECT(bad == 0, "%d rows are not slices of either dataset", bad);
    EXPECT(fabs(share - 0.7) <= 0.02, "dataset 0 share %.4f, expected 0.7 +- 0.02", share);
    EXPECT(dup == 0, "%d samples repeat or skip within an epoch of their dataset", dup);
    EXPECT(count[0] > (int)n[0] && count[1] > (int)n[1], "both datasets wrap an epoch (%d, %d)", count[0], count[1]);
    // Resume at step 37 (mid-epoch of both) on dp 1 -> dp 2 with G 8 -> 16:
    // positions 296.. continue as the straight run's.
    struct loader a, b[2];
    init_all(&a, 1, ds, w, 2, 2, G, 11);
    struct sample *got = xmalloc((size_t)N * sizeof *got);
    run_global(&a, 1, 37, got);
    struct loader_state st;
    loader_state_save(&a, &st);
    init_all(b, 2, ds, w, 2, 4, 16, 11);
    EXPECT(loader_state_load(&b[0], &st, &err) == STATUS_OK && loader_state_load(&b[1], &st, &err) == STATUS_OK,
           "%s", err.msg);
    run_global(b, 2, 40, got + 37 * G);
    EXPECT(same(mix[0], got, 37 * G + 40 * 16, &at), "blend resume (dp 1 G 8 -> dp 2 G 16) differs at %zu", at);
    free_all(b, 2);
    // Another weight or another dataset's size is refused.
    double w2[2] = {6, 4};
    init_all(b, 1, ds, w2, 2, 2, G, 11);
    EXPECT(loader_state_load(&b[0], &st, &err) == STATUS_BAD_INPUT && strstr(err.msg, "weight of dataset 0") &&
               strstr(err.msg, "from 0.7 to 0.6"), "weights: %s", err.msg);
    loader_free(&b[0]);
    struct dataset *swapped[2] = {ds[1], ds[0]};
    init_all(b, 1, swapped, w, 2, 2, G, 11);
    EXPECT(loader_state_load(&b[0], &st, &err) == STATUS_BAD_INPUT && strstr(err.msg, "sequences"),
           "another dataset: %s", err.msg);
    loader_free(&b[0]);
    double w1 = 1;
    init_all(b, 1, ds, &w1, 1, 2, G, 11);
    EXPECT(loader_state_load(&b[0], &st, &err) == STATUS_BAD_INPUT && strstr(err.msg, "from 2 to 1"),
           "one dataset instead of two: %s", err.msg);
    loader_free(&b[0]);
    loader_free(&a);
    for (int i = 0; i < 3; i++) free(mix[i]);
    free(got), free(seen[0]), free(seen[1]);
}

static void check_parse(void) {
    struct blend_spec *b = xmalloc(sizeof *b);
    struct error err = {0};
    EXPECT(blend_parse("[data] paths", " a/x:0.7 ,  b:0.3", b, &err) == STATUS_OK && b->n == 2 &&
               !strcmp(b->paths[0], "a/x") && !strcmp(b->paths[1], "b") && fabs(b->weights[0] - 0.7) < 1e-15,
           "parse: %s", err.msg);
    EXPECT(blend_parse("[data] paths", "a:2, b:6", b, &err) == STATUS_OK && b->weights[0] == 0.25 &&
               b->weights[1] == 0.75, "normalised: %g %g", b->weights[0], b->weights[1]);
    EXPECT(blend_parse("[data] paths", "only", b, &err) == STATUS_OK && b->n == 1 && b->weights[0] == 1,
           "one path without weight: %s", err.msg);
    const char *bad[] = {"a:0.7, b", "a:0, b:1", "a:-1, b:2", "a:x, b:1", "a:0.5,, b:0.5", "a:0.5, a:0.5",
                         ":0.5, b:0.5", "a:inf, b:1", "a:nan, b:1", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.msg[0] = '\0';
        EXPECT(blend_parse("[data] paths", bad[i], b, &err) == STATUS_BAD_INPUT && strstr(err.msg, "[data] paths = "),
               "'%s' accepted or unnamed: %s", bad[i], err.msg);
    }
    free(b);
}

int main(void) {
    char dir[2][256];
    struct dataset *ds[2] = {NULL, NULL};
    struct error err = {0};
    check_parse();
    // 401 tokens (100 sequences) and 201 tokens (50 sequences): both wrap
    // several epochs within 1,000 mixture samples.
    const uint64_t tokens[2] = {401, 201};
    for (int k = 0; k < 2; k++) {
        snprintf(dir[k], sizeof dir[k], "/tmp/trident_test_blend_%d_%d", (int)getpid(), k);
        write_dataset(dir[k], k ? 2000 : 0, tokens[k]);
        EXPECT(dataset_open(dir[k], T, 4000, "test-tok-1", &ds[k], &err) == STATUS_OK, "%s", err.msg);
    }
    if (ds[0] && ds[1]) {
        struct dataset *small = NULL;
        char sdir[300];
        snprintf(sdir, sizeof sdir, "%s_small", dir[0]);
        write_dataset(sdir, 0, 161); // 40 sequences
        EXPECT(dataset_open(sdir, T, 4000, NULL, &small, &err) == STATUS_OK, "%s", err.msg);
        if (small) check_batch_change(small);
        dataset_close(small);
        check_blend(ds);
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", sdir);
        EXPECT(system(cmd) == 0, "cleanup");
    }
    for (int k = 0; k < 2; k++) {
        dataset_close(ds[k]);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir[k]);
        EXPECT(system(cmd) == 0, "cleanup");
    }
    return test_finish("test_blend");
}

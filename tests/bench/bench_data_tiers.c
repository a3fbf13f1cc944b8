// bench_data_tiers.c: the data path at cluster scale (docs/design.md §6).
// Prints dataset_open's time for 10,000 real tiny shards (index.ini + a stat
// per shard) and loader throughput from a cold tier throttled by fault
// injection (TRIDENT_DATA_FAULT=cold_delay_ms:2: every cold access sleeps
// 2 ms, about a parallel file system's latency) against the hot tier after
// the stager has copied every shard. No timing assertions.
// Usage: build/bench/bench_data_tiers
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/cache.h"
#include "data/dataset.h"

// A dataset of n shards of tokens each (ids i % 4096), one document per shard.
static int write_dataset(const char *dir, int n, uint64_t tokens, struct error *err) {
    struct dataset_writer w;
    if (dataset_writer_init(&w, dir, 4096, 0, "bench-tok", err)) return 1;
    int32_t *ids = xmalloc(tokens * sizeof *ids);
    for (uint64_t i = 0; i < tokens; i++) ids[i] = (int32_t)((i * 2654435761u) % 4096);
    uint64_t offsets[2] = {0, tokens};
    for (int s = 0; s < n; s++)
        if (dataset_writer_add(&w, SPLIT_TRAIN, ids, tokens, offsets, 1, err)) return 1;
    free(ids);
    return dataset_writer_finish(&w, err) != STATUS_OK;
}

// Tokens/s of micro-batches of (micro, T + 1) read from ds in the loader's
// random order.
static double loader_rate(struct dataset *ds, int T, int micro, int steps, struct error *err) {
    struct loader ld;
    if (loader_init(&ld, ds, SPLIT_TRAIN, 0, 1, micro, micro, 1, err)) return -1;
    int32_t *batch = xmalloc((size_t)micro * (T + 1) * sizeof *batch);
    double t0 = time_now_s();
    for (int i = 0; i < steps; i++)
        if (loader_next(&ld, batch, err)) return -1;
    double dt = time_now_s() - t0;
    free(batch);
    loader_free(&ld);
    return (double)steps * micro * T / dt;
}

int main(void) {
    char dir[256], cache_dir[300], cmd[600];
    snprintf(dir, sizeof dir, "/tmp/trident_bench_tiers_%d", (int)getpid());
    struct error err = {0};
    struct dataset *ds;
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd)) return 1;

    // 1. dataset_open of 10,000 tiny shards.
    char many[300];
    snprintf(many, sizeof many, "%s/many", dir);
    double t0 = time_now_s();
    if (write_dataset(many, 10000, 64, &err)) goto fail;
    double t_write = time_now_s() - t0;
    t0 = time_now_s();
    if (dataset_open(many, 16, 4096, NULL, &ds, &err)) goto fail;
    double t_open = time_now_s() - t0;
    printf("dataset_open of 10000 shards of 64 tokens: %.3f s (%.1f us per shard; writing them took %.1f s)\n",
           t_open, 1e6 * t_open / 10000, t_write);
    dataset_close(ds);

    // 2. loader throughput, cold (throttled) and hot. The fault setting is
    // read at the first cold access, which comes after this.
    setenv("TRIDENT_DATA_FAULT", "cold_delay_ms:2", 1);
    char big[300];
    snprintf(big, sizeof big, "%s/big", dir);
    const int n = 32, T = 256, micro = 8, steps = 200;
    if (write_dataset(big, n, 1 << 16, &err)) goto fail;
    if (dataset_open(big, T, 4096, NULL, &ds, &err)) goto fail;
    double cold = loader_rate(ds, T, micro, steps, &err);
    if (cold < 0) goto fail;
    dataset_close(ds);
    printf("loader, cold tier with 2 ms per access (T %d, micro %d, %d shards of 64 Ki tokens): %.0f tokens/s\n",
           T, micro, n, cold);
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", dir);
    if (dataset_open(big, T, 4096, NULL, &ds, &err) ||
        cache_open(cache_dir, big, &ds->index, (int64_t)1 << 30, n, true, &ds->cache, &err))
        goto fail;
    int all[32];
    for (int i = 0; i < n; i++) all[i] = i;
    t0 = time_now_s();
    cache_want(ds->cache, all, n);
    int64_t staged = 0, evicted, failed = 0;
    while (staged + failed < n) {
        cache_sleep_ms(5);
        cache_counts(ds->cache, &staged, &evicted, &failed);
    }
    double t_stage = time_now_s() - t0;
    double hot = loader_rate(ds, T, micro, steps * 10, &err);
    if (hot < 0) goto fail;
    printf("stager: %lld shards (%.1f MiB) staged in %.2f s; loader from the hot tier: %.0f tokens/s (%.0fx cold)\n",
           (long long)staged, n * 131072.0 / 1048576, t_stage, hot, hot / cold);
    dataset_close(ds);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
fail:
    printf("bench_data_tiers: %s\n", err.msg);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) return 1;
    return 1;
}

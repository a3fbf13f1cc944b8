// bench_data.c: prints prep throughput on the KJV corpus (documents/s,
// tokens/s; tokenizer training timed apart), dataset_open's validation rate,
// and loader throughput in tokens/s. No timing assertions.
// Usage: build/bench/bench_data [CORPUS]   (default data/kjv.txt, made by
// data/make_kjv.sh when missing)
#include <omp.h>
#include <string.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/prep.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "train/train_step.h"

int main(int argc, char **argv) {
    const char *corpus = argc > 1 ? argv[1] : "data/kjv.txt";
    if (access(corpus, R_OK) != 0 && argc == 1 && system("data/make_kjv.sh >/dev/null") != 0) {
        printf("bench_data: %s missing and data/make_kjv.sh failed\n", corpus);
        return 1;
    }
    char dir[256], cmd[300];
    snprintf(dir, sizeof dir, "/tmp/trident_bench_data_%d", (int)getpid());
    struct error err = {0};
    const char *inputs[] = {corpus};
    struct prep_options opt = {.inputs = inputs, .n_inputs = 1, .output = dir, .vocab_size = 4096,
                               .format = PREP_FORMAT_TEXT, .val_fraction = 0.01, .shard_tokens = 1 << 20,
                               .seed = 1, .quiet = 1};
    struct prep_stats st;
    double t0 = time_now_s();
    if (prep_run(&opt, &st, &err)) {
        printf("bench_data: prep failed: %s\n", err.msg);
        return 1;
    }
    double total = time_now_s() - t0;
    uint64_t docs = st.documents[0] + st.documents[1], toks = st.tokens[0] + st.tokens[1];
    printf("prep %s, vocab 4096, %d threads: %llu documents, %llu tokens, %d shards\n", corpus,
           omp_get_max_threads(), (unsigned long long)docs, (unsigned long long)toks, st.shards);
    printf("  tokenizer training %.2f s; encode+write %.2f s: %.0f documents/s, %.0f tokens/s\n",
           total - st.encode_seconds, st.encode_seconds, docs / st.encode_seconds, toks / st.encode_seconds);

    const int T = 256, micro = 8, G = 64;
    struct dataset *ds;
    t0 = time_now_s();
    if (dataset_open(dir, T, 4096, NULL, &ds, &err)) {
        printf("bench_data: dataset_open failed: %s\n", err.msg);
        return 1;
    }
    double t_open = time_now_s() - t0;
    if (dataset_validate_all(ds, &err)) {
        printf("bench_data: %s\n", err.msg);
        return 1;
    }
    t_open = time_now_s() - t0;
    printf("dataset_open + validating every shard (checksums + every token id): %.3f s, %.0f tokens/s\n", t_open,
           toks / t_open);
    struct loader ld;
    if (loader_init(&ld, ds, SPLIT_TRAIN, 0, 1, micro, G, 1, &err)) {
        printf("bench_data: loader_init failed: %s\n", err.msg);
        return 1;
    }
    int32_t *batch = xmalloc((size_t)micro * (T + 1) * sizeof *batch);
    int steps = 2000;
    long long check = 0;
    t0 = time_now_s();
    for (int i = 0; i < steps; i++) {
        if (loader_next(&ld, batch, &err)) {
            printf("bench_data: loader_next failed: %s\n", err.msg);
            return 1;
        }
        check += batch[i % (micro * (T + 1))];
    }
    double t_load = time_now_s() - t0;
    printf("loader (T %d, micro %d, G %d, random order): %d microbatches in %.3f s: %.0f tokens/s, "
           "%.1f us per sequence (checksum %lld)\n",
           T, micro, G, steps, t_load, (double)steps * micro * T / t_load, 1e6 * t_load / (steps * micro), check);
    double loader_tps = (double)steps * micro * T / t_load;

    // What the default model (configs/tiny.ini shapes) consumes per second
    // while training on one rank, against what the loader serves.
    struct llama_config tiny = {.vocab_size = 4096, .d_model = 256, .n_layers = 4, .n_heads = 8,
                                .n_kv_heads = 4, .ffn_dim = 704, .max_seq_len = 256,
                                .rope_theta = 10000.0, .norm_eps = 1e-5, .tie_embeddings = true,
                                .init_std = 0.02f};
    int tB = 8, tT = 128;
    struct backend *be = backend_cpu_init(0);
    struct model_shard shard = model_shard_full(&tiny);
    struct model *m;
    struct optimizer *optim;
    struct optimizer_config oc = {.lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 1, .steps = 10,
                                  .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                                  .grad_clip = 1.0};
    if (model_init(&m, be, &tiny, &shard, DTYPE_FP32, tB, tT, 1, &err) ||
        optimizer_init(&optim, be, m, &oc, NULL, &err)) {
        printf("bench_data: model: %s\n", err.msg);
        return 1;
    }
    int32_t *tok = xmalloc(sizeof *tok * tB * tT), *tgt = xmalloc(sizeof *tgt * tB * tT);
    for (int i = 0; i < tB * tT; i++) tok[i] = batch[i % (micro * (T + 1))] % 4096, tgt[i] = (i * 7) % 4096;
    struct train_step_result r;
    train_step(m, optim, &oc, NULL, NULL, 0, tok, tgt, 1, tB, tT, &r);
    t0 = time_now_s();
    for (int s = 1; s <= 3; s++) train_step(m, optim, &oc, NULL, NULL, s, tok, tgt, 1, tB, tT, &r);
    double train_tps = 3.0 * tB * tT / (time_now_s() - t0);
    printf("tiny model training consumes %.0f tokens/s; the loader serves %.0fx that\n", train_tps,
           loader_tps / train_tps);
    free(tok), free(tgt);
    optimizer_free(optim);
    model_free(m);
    backend_free(be);
    free(batch);
    loader_free(&ld);
    dataset_close(ds);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}

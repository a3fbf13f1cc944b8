// bench_generate.c: `trident generate`'s two methods on the 124M config
// (configs/gpt2-small.ini's model: d_model 768, 12 layers, 12 heads, ffn
// 2048, vocabulary 4096; random weights, FP32, the CPU backend): new tokens
// per second with the key/value cache (sample_generate, what generate runs:
// a prefill of the prompt, then one position per token) against the window
// recomputed for every token (sample_continue, generate --no-kv-cache: the
// method before the cache), for 256 new tokens after a 1-token prompt,
// greedy. The full-window method's cost per token is one forward of the
// whole window (prompt + 256 = 257 positions) whatever the position, so it is
// timed over BENCH_FULL_TOKENS tokens (default 4) and its rate applies to all
// 256. Then the cache with 4 prompts decoded together (generate's batch of
// prompts: one step reads the weights once for all rows), its tokens/s
// summed over the rows, against the same full-window rate (that method
// recomputes a window per prompt and token, whatever the batch). Issue 28's
// goal: the cache at least 20x faster. Prints; asserts nothing.
//
// What bounds the one-prompt ratio: a one-token step reads every weight once
// (FP32: 365 MB) and is memory bound (~17 GB/s for one core here through 2
// MiB pages: ~21 ms a token), while the full window's 257 positions run
// sgemm near the core's FLOP rate (~0.35 s a token): about 16x on one core
// of this machine (docs/performance.md), whatever the code around them; rows
// decoded together share the weights' reading.
//
// Usage: bench_generate [threads] (default 1: a one-token step is a few
// hundred small ops, and on a machine other jobs load, each OpenMP region of
// two threads can wait a scheduler slice for its second thread: measured
// 1.5 tokens/s with 2 threads against 22 with 1; 0: every CPU of the process)
#include <stdlib.h>
#include <time.h>

#include "base/threads.h"
#include "config/config.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "model/sample.h"
#include "test.h"
#include "train/plan.h"

enum { NEW_MAX = 256 };

// CPU seconds the process has used (all threads): on a machine other jobs
// load, the ratio of CPU times is steadier than that of wall times.
static double cpu_time_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int NEW = NEW_MAX; // BENCH_NEW_TOKENS overrides (quick runs)

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (!threads) threads = threads_affinity_cpus() > 0 ? threads_affinity_cpus() : threads_node_cpus();
    const char *ini = "configs/gpt2-small.ini";
    struct config *c = malloc(sizeof *c);
    struct error err = {0};
    CHECK(!config_load(ini, 0, NULL, c, &err), "%s", err.msg);
    struct llama_config lc = plan_llama(c);
    free(c);
    struct model_shard shard = model_shard_full(&lc);
    struct backend *be = backend_cpu_init(threads);
    int32_t prompt = 0, out[NEW_MAX], n_out = 0;
    if (getenv("BENCH_NEW_TOKENS")) NEW = MAX(1, MIN(NEW_MAX, atoi(getenv("BENCH_NEW_TOKENS"))));
    const int32_t *prompts[1] = {&prompt};
    int n_prompt = 1, full_tokens = getenv("BENCH_FULL_TOKENS") ? atoi(getenv("BENCH_FULL_TOKENS")) : 4;
    bool ended = false;

    struct model *m;
    CHECK(!model_init(&m, be, &lc, &shard, DTYPE_FP32, 1, 128, 1, &err), "%s", err.msg);
    CHECK(!model_kv_cache_init(m, 1, 1 + NEW, &err), "%s", err.msg);
    struct sample_request rq = {.rows = 1, .prompts = prompts, .n_prompt = &n_prompt, .n_new = NEW,
                                .params = {0, 0, 1, 0}};
    struct sample_result res = {.out = out, .n_out = &n_out, .ended = &ended};
    if (getenv("BENCH_PROFILE")) backend_profile_enable(be, true);
    double t0 = time_now_s(), c0 = cpu_time_s();
    CHECK(!sample_generate(m, &rq, &res, &err), "%s", err.msg);
    double cached_s = time_now_s() - t0, cached_cpu = cpu_time_s() - c0;
    if (getenv("BENCH_PROFILE")) backend_profile_print(be, stdout), backend_profile_enable(be, false);
    model_free(m);
    double cached = res.new_tokens / cached_s;

    // 4 prompts of one id each (0 .. 3), decoded as one batch
    enum { ROWS = 4 };
    int32_t bprompt[ROWS] = {0, 1, 2, 3}, bout[ROWS][NEW_MAX], bn_out[ROWS];
    const int32_t *bprompts[ROWS] = {&bprompt[0], &bprompt[1], &bprompt[2], &bprompt[3]};
    int bn_prompt[ROWS] = {1, 1, 1, 1};
    bool bended[ROWS];
    CHECK(!model_init(&m, be, &lc, &shard, DTYPE_FP32, ROWS, 32, 1, &err), "%s", err.msg);
    CHECK(!model_kv_cache_init(m, ROWS, 1 + NEW, &err), "%s", err.msg);
    struct sample_request brq = {.rows = ROWS, .prompts = bprompts, .n_prompt = bn_prompt,
                                 .n_new = NEW, .params = {0, 0, 1, 0}};
    struct sample_result bres = {.out = (int32_t *)bout, .n_out = bn_out, .ended = bended};
    t0 = time_now_s(), c0 = cpu_time_s();
    CHECK(!sample_generate(m, &brq, &bres, &err), "%s", err.msg);
    double batch_s = time_now_s() - t0, batch_cpu = cpu_time_s() - c0;
    model_free(m);
    double batch = bres.new_tokens / batch_s;

    CHECK(!model_init(&m, be, &lc, &shard, DTYPE_FP32, 1, 1 + NEW, 1, &err), "%s", err.msg);
    t0 = time_now_s(), c0 = cpu_time_s();
    int n = sample_continue(m, &prompt, 1, full_tokens, (struct sample_params){.top_p = 1}, -1, out,
                            &ended, NULL);
    double full_s = time_now_s() - t0, full_cpu = cpu_time_s() - c0;
    model_free(m);
    double full = n / full_s;
    printf("trident generate, 124M config (%s: %.1fM parameters), fp32, CPU, %d threads, %d new "
           "tokens after a 1-token prompt:\n", ini, (double)lc.n_layers * (4.0 * lc.d_model * lc.d_model
           + 3.0 * lc.d_model * lc.ffn_dim) / 1e6 + 2.0 * lc.vocab_size * lc.d_model / 1e6, threads, NEW);
    printf("  key/value cache:   %8.1f tokens/s (%ld tokens in %.2f s, %.2f CPU s; prefill %.3f s, "
           "decoding %.1f tokens/s)\n", cached, res.new_tokens, cached_s, cached_cpu, res.prefill_s,
           res.decode_s > 0 ? res.new_tokens / res.decode_s : 0.0);
    printf("  key/value cache, %d prompts at once: %8.1f tokens/s (%ld tokens in %.2f s, %.2f CPU s)\n",
           ROWS, batch, bres.new_tokens, batch_s, batch_cpu);
    printf("  full window:       %8.2f tokens/s (window %d, timed over %d tokens: %.2f s, %.2f CPU s)\n",
           full, 1 + NEW, n, full_s, full_cpu);
    printf("  speedup, 1 prompt: %.1fx wall, %.1fx CPU time per token (goal >= 20x)\n", cached / full,
           (full_cpu / n) / (cached_cpu / res.new_tokens));
    printf("  speedup, %d prompts at once: %.1fx wall, %.1fx CPU time per token (goal >= 20x)\n", ROWS,
           batch / full, (full_cpu / n) / (batch_cpu / bres.new_tokens));
    backend_free(be);
    return 0;
}

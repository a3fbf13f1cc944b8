// bench_model.c: training-step throughput of a 124M-class model on the CPU.
// Prints ms per step, tokens/s, achieved GFLOP/s, MFU against the sgemm rate
// measured at start on the same machine in the same run and peak memory of
// the arenas; then the same step with [model] recompute = selective and
// full: ms per step and activation bytes against none; then the same step
// with [precision] dtype = bf16 (FP32 master weights in the optimizer, as the
// trainer sets it up) against fp32, steps alternating: per pair ms and CPU ms
// of each, the bf16/fp32 speedup (median of the pairs and best-of, wall and
// CPU time), the arenas' bytes of each, the CPU's bf16 instructions (issue
// 11's goal: bf16 at least 1.8x fp32 on a CPU with avx512_bf16) and a per-op
// time breakdown of one step of each dtype.
//
// FLOPs per token: model_flops_per_token, the trainer's (docs/design.md §9):
// 6 * N for the matmul parameters (every block matrix and the LM head; the
// embedding lookup does no matmul) plus attention 12 * L * C * T, halved for
// the causal mask.
//
// Usage: bench_model [steps] [threads]; env BENCH_SMALL=1 runs a tiny config,
// BENCH_DTYPE_ONLY=1 only the fp32 / bf16 comparison.
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "kernels/cpu/cpu.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "test.h"
#include "train/train_step.h"

// GFLOP/s of a square-ish fp32 GEMM of the model's typical shape.
static double measure_sgemm_gflops(int M, int N, int K) {
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N),
          *c = malloc(sizeof(float) * M * N);
    for (long i = 0; i < (long)M * K; i++) a[i] = (float)((i * 7) % 13) * 0.01f;
    for (long i = 0; i < (long)K * N; i++) b[i] = (float)((i * 5) % 11) * 0.01f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = time_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a, K, b, K, 0, c, N);
        double dt = time_now_s() - t0;
        best = MAX(best, 2.0 * M * N * K / dt / 1e9);
    }
    free(a), free(b), free(c);
    return best;
}

// CPU seconds the process has used (all threads).
static double cpu_time_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Median of x (n,), sorted in place.
static double median(double *x, int n) {
    for (int i = 1; i < n; i++) // insertion sort
        for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
            double t = x[j]; x[j] = x[j - 1]; x[j - 1] = t;
        }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// Seconds per step of `steps` train_step calls after one warm-up step.
static double time_steps(struct model *m, struct optimizer *opt, const struct optimizer_config *oc,
                         const int32_t *tokens, const int32_t *targets, int B, int T, int steps,
                         struct train_step_result *r) {
    train_step(m, opt, oc, NULL, NULL, 0, tokens, targets, 1, B, T, r); // warm-up
    double t0 = time_now_s();
    for (int s = 1; s <= steps; s++) train_step(m, opt, oc, NULL, NULL, s, tokens, targets, 1, B, T, r);
    return (time_now_s() - t0) / steps;
}

// Bytes of the four arenas (parameters, gradients, optimizer state with any
// FP32 master weights, activations): the peak a step holds.
static size_t arena_bytes(struct model *m, struct optimizer *opt) {
    const struct model_memory *mem = model_memory(m);
    return mem->param_bytes + mem->grad_bytes + optimizer_state_bytes(opt) + mem->activation_bytes;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 3;
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    bool small = getenv("BENCH_SMALL") != NULL, dtype_only = getenv("BENCH_DTYPE_ONLY") != NULL;
    struct llama_config cfg = {
        .vocab_size = 32000, .d_model = 768, .n_layers = 12, .n_heads = 12, .n_kv_heads = 12,
        .ffn_dim = 2048, .max_seq_len = 256, .rope_theta = 10000.0, .norm_eps = 1e-5f,
        .tie_embeddings = false, .init_std = 0.02f,
    };
    int B = 4, T = 256;
    if (small) cfg.vocab_size = 512, cfg.d_model = 128, cfg.n_layers = 2, cfg.n_heads = 4,
               cfg.n_kv_heads = 4, cfg.ffn_dim = 352, T = 64;
    struct backend *be = backend_cpu_init(threads);
    double peak = measure_sgemm_gflops(B * T, 4 * cfg.d_model, cfg.d_model);
    printf("sgemm (%d x %d x %d): %.1f GFLOP/s  (the MFU denominator)\n", B * T, 4 * cfg.d_model,
           cfg.d_model, peak);

    struct model_shard shard = model_shard_full(&cfg);
    struct model *m;
    struct optimizer *opt;
    struct error err;
    CHECK(!model_init(&m, be, &cfg, &shard, DTYPE_FP32, B, T, 1, &err), "%s", err.msg);
    struct optimizer_config oc = {.lr = 6e-4, .min_lr = 6e-5, .warmup_steps = 1, .steps = steps + 1,
                                  .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                  .weight_decay = 0.1f, .grad_clip = 1.0f};
    CHECK(!optimizer_init(&opt, be, m, &oc, NULL, &err), "%s", err.msg);

    int n;
    const struct param_info *p = model_params(m, &n);
    double all_params = 0;
    for (int i = 0; i < n; i++) all_params += p[i].numel;
    double flops_per_token = model_flops_per_token(&cfg, T); // the trainer's definition
    const struct model_memory *mem = model_memory(m);
    printf("model: %.1fM parameters, V=%d C=%d L=%d H=%d F=%d, B=%d T=%d\n", all_params / 1e6,
           cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.ffn_dim, B, T);
    printf("memory: params %.1f MiB, grads %.1f MiB, optimizer %.1f MiB, activations %.1f MiB, "
           "total %.1f MiB\n", mem->param_bytes / 1048576.0, mem->grad_bytes / 1048576.0,
           optimizer_state_bytes(opt) / 1048576.0, mem->activation_bytes / 1048576.0,
           (mem->param_bytes + mem->grad_bytes + optimizer_state_bytes(opt) + mem->activation_bytes) / 1048576.0);

    int32_t *tokens = malloc(sizeof(int32_t) * B * T), *targets = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 7919) % cfg.vocab_size, targets[i] = (i * 104729) % cfg.vocab_size;
    struct train_step_result r;
    if (dtype_only) { // BENCH_DTYPE_ONLY=1: the fp32 / bf16 comparison alone
        optimizer_free(opt);
        model_free(m);
        goto dtype;
    }
    double dt = time_steps(m, opt, &oc, tokens, targets, B, T, steps, &r);
    // The machine is shared: measure the GEMM rate again after the steps and
    // keep the higher of the two, so that a disturbed first measurement
    // cannot inflate MFU.
    double peak_after = measure_sgemm_gflops(B * T, 4 * cfg.d_model, cfg.d_model);
    if (peak_after > peak) {
        printf("sgemm measured again after the steps: %.1f GFLOP/s (used)\n", peak_after);
        peak = peak_after;
    }
    double tps = B * T / dt, gflops = flops_per_token * B * T / dt / 1e9;
    printf("step: %.1f ms, %.0f tokens/s, %.1f GFLOP/s achieved, MFU %.1f%% of measured sgemm "
           "(loss %.3f)\n", dt * 1e3, tps, gflops, 100.0 * gflops / peak, r.loss);

    size_t none_act = mem->activation_bytes;
    optimizer_free(opt);
    model_free(m);

    // The same steps with recomputation (a fresh model and optimizer each,
    // one warm-up step; the none step above is the reference).
    const char *names[] = {"none", "selective", "full"};
    printf("recompute: none %.1f ms/step, activations %.1f MiB\n", dt * 1e3, none_act / 1048576.0);
    for (enum recompute rc = RECOMPUTE_SELECTIVE; rc <= RECOMPUTE_FULL; rc++) {
        shard.recompute = rc;
        CHECK(!model_init(&m, be, &cfg, &shard, DTYPE_FP32, B, T, 1, &err), "%s", err.msg);
        CHECK(!optimizer_init(&opt, be, m, &oc, NULL, &err), "%s", err.msg);
        double rdt = time_steps(m, opt, &oc, tokens, targets, B, T, steps, &r);
        size_t act = model_memory(m)->activation_bytes;
        printf("recompute: %s %.1f ms/step (%.2fx none's time), activations %.1f MiB (%.1f%% of "
               "none's)\n", names[rc], rdt * 1e3, rdt / dt, act / 1048576.0, 100.0 * act / none_act);
        optimizer_free(opt);
        model_free(m);
    }

dtype:;
    // The same step in bf16 (recompute none) against fp32, each model on its
    // own backend (so each has its own per-op profile): after one warm-up
    // step of each, fp32 and bf16 steps alternate, so that a change in the
    // shared machine's load hits both alike; the ratio is reported as the
    // median of the per-pair ratios and as best fp32 over best bf16, of wall
    // time and of the process's CPU time. On a loaded machine the CPU-time
    // ratio is the steadier one, with OMP_WAIT_POLICY=passive (otherwise
    // OpenMP's spinning threads count too); the goal is the wall-time one on
    // a quiet machine.
    shard.recompute = RECOMPUTE_NONE;
    struct backend *bes[2] = {be, backend_cpu_init(threads)};
    enum dtype dts[2] = {DTYPE_FP32, DTYPE_BF16};
    struct model *ms[2];
    struct optimizer *opts[2];
    double losses[2], best[2] = {1e30, 1e30}, best_cpu[2] = {1e30, 1e30};
    double *ratios = malloc(sizeof(double) * steps), *cpu_ratios = malloc(sizeof(double) * steps);
    for (int d = 0; d < 2; d++) {
        CHECK(!model_init(&ms[d], bes[d], &cfg, &shard, dts[d], B, T, 1, &err), "%s", err.msg);
        CHECK(!optimizer_init(&opts[d], bes[d], ms[d], &oc, NULL, &err), "%s", err.msg);
        train_step(ms[d], opts[d], &oc, NULL, NULL, 0, tokens, targets, 1, B, T, &r); // warm-up
    }
    for (int s = 1; s <= steps; s++) {
        double wall[2], cpu[2];
        for (int d = 0; d < 2; d++) {
            double t0 = time_now_s(), c0 = cpu_time_s();
            train_step(ms[d], opts[d], &oc, NULL, NULL, s, tokens, targets, 1, B, T, &r);
            wall[d] = time_now_s() - t0, cpu[d] = cpu_time_s() - c0;
            best[d] = MIN(best[d], wall[d]), best_cpu[d] = MIN(best_cpu[d], cpu[d]);
            losses[d] = r.loss;
        }
        ratios[s - 1] = wall[0] / wall[1], cpu_ratios[s - 1] = cpu[0] / cpu[1];
        printf("dtype: pair %d: fp32 %.1f ms (cpu %.1f ms), bf16 %.1f ms (cpu %.1f ms), ratio "
               "%.2fx (cpu %.2fx)\n", s, wall[0] * 1e3, cpu[0] * 1e3, wall[1] * 1e3, cpu[1] * 1e3,
               ratios[s - 1], cpu_ratios[s - 1]);
    }
    double med = median(ratios, steps), cpu_med = median(cpu_ratios, steps);
    size_t bytes[2] = {arena_bytes(ms[0], opts[0]), arena_bytes(ms[1], opts[1])};
    char flags[64];
    bench_cpu_bf16_flags(flags, sizeof flags);
    printf("dtype: cpu bf16 flags: %s; bf16 GEMMs via %s\n", flags,
           ((struct cpu_backend *)be->impl)->bf16_gemm ? "oneDNN" : "FP32 fallback");
    printf("dtype: fp32 best %.1f ms/step %.0f tokens/s arenas %.1f MiB (loss %.3f) | bf16 best "
           "%.1f ms/step %.0f tokens/s arenas %.1f MiB (loss %.3f) | bf16/fp32 speedup median "
           "%.2fx of %d pairs, best-of %.2fx, memory %.1f%%\n",
           best[0] * 1e3, B * T / best[0], bytes[0] / 1048576.0, losses[0], best[1] * 1e3,
           B * T / best[1], bytes[1] / 1048576.0, losses[1], med, steps, best[0] / best[1],
           100.0 * bytes[1] / bytes[0]);
    printf("dtype: cpu time per step: fp32 best %.1f ms, bf16 best %.1f ms | bf16/fp32 cpu-time "
           "speedup median %.2fx, best-of %.2fx\n", best_cpu[0] * 1e3, best_cpu[1] * 1e3, cpu_med,
           best_cpu[0] / best_cpu[1]);
    for (int d = 0; d < 2; d++) {
        backend_profile_enable(bes[d], true);
        int s = steps + 1 > oc.steps - 1 ? oc.steps - 1 : steps + 1;
        train_step(ms[d], opts[d], &oc, NULL, NULL, s, tokens, targets, 1, B, T, &r);
        backend_profile_enable(bes[d], false);
        printf("dtype: per-op time of one %s step:\n", dtype_name(dts[d]));
        backend_profile_print(bes[d], stdout);
        optimizer_free(opts[d]);
        model_free(ms[d]);
    }
    free(ratios), free(cpu_ratios);
    backend_free(bes[1]);
    free(tokens), free(targets);
    backend_free(be);
    return 0;
}

// train.c: `trident train CONFIG.ini [section.key=value ...]`, the main job.
// Config, grid, data, model and optimizer are set up and checked before the
// first step (docs/design.md §8); then the loop of microbatches, data-parallel
// gradient all-reduce, clipping, schedule and AdamW, with validation, samples,
// a log line per step and metrics.jsonl (docs/design.md §9).
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "kernels/backend.h"
#include "ckpt/checkpoint.h"
#include "cli/cli.h"
#include "config/config.h"
#include "data/dataset.h"
#include "grad_sync.h"
#include "model/model.h"
#include "base/mpi_util.h"
#include "model/optimizer.h"
#include "parallel/pipeline.h"
#include "plan.h"
#include "model/sample.h"
#include "tokenizer/tokenizer.h"
#include "parallel/topology.h"
#include "train_step.h"
#include "trainer.h"


static bool is_root(const struct trainer *t) { return t->topo.world_rank == 0; }

// Ends the job with a bad-input error every rank found the same way: rank 0
// speaks, every rank exits 2 (mpi_util.h).
_Noreturn void trainer_fail_all(const struct trainer *t, const struct error *err) {
    mpi_exit_all(err->status ? (int)err->status : 1, t->topo.world_rank == 0 ? err->msg : NULL);
}

// Ends the job for an error only this rank found.
_Noreturn void trainer_fail_here(const struct error *err) {
    mpi_exit_all(err->status ? (int)err->status : 1, err->msg);
}


static struct optimizer_config optimizer_from(const struct config *c) {
    return (struct optimizer_config){
        .lr = c->train.lr, .min_lr = c->train.min_lr, .warmup_steps = c->train.warmup_steps,
        .steps = c->train.steps, .schedule = (enum lr_schedule)c->train.lr_schedule,
        .beta1 = c->train.beta1, .beta2 = c->train.beta2, .eps = c->train.adam_eps,
        .weight_decay = c->train.weight_decay, .grad_clip = c->train.grad_clip,
    };
}

// Features this build does not have yet are refused before any work.
static enum status check_supported(const struct config *c, int world_size, struct error *err) {
    if (c->model.recompute != RECOMPUTE_NONE)
        return error_set(err, STATUS_BAD_INPUT, "%s: [model] recompute = %s is not in this build "
                         "yet (expected none)", c->file,
                         c->model.recompute == RECOMPUTE_FULL ? "full" : "selective");
    if (c->data.cache_dir[0])
        return error_set(err, STATUS_BAD_INPUT, "%s: [data] cache_dir = %s: the hot-tier shard "
                         "cache is not in this build yet (expected it unset: shards are read "
                         "from [data] path)", c->file, c->data.cache_dir);
    if (c->system.device == DEVICE_CUDA && world_size > 1)
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: [system] device = cuda with %d ranks: this build trains on one GPU "
                         "(tp = pp = dp = 1); the NCCL groups for multi-GPU device buffers are not "
                         "wired into the trainer yet", c->file, world_size);
    if (c->precision.dtype != DTYPE_FP32)
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: [precision] dtype = %s is not in this build yet (expected fp32)",
                         c->file, dtype_name(c->precision.dtype));
    return STATUS_OK;
}

// mkdir -p for the run directory. Errors: STATUS_BAD_INPUT naming the path.
static enum status make_dirs(const char *path, struct error *err) {
    char buf[CONFIG_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) && errno != EEXIST) break;
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST)
        return error_set(err, STATUS_BAD_INPUT, "[log] run_dir = %s: cannot create: %s", path,
                         strerror(errno));
    struct stat st;
    if (stat(buf, &st) || !S_ISDIR(st.st_mode))
        return error_set(err, STATUS_BAD_INPUT, "[log] run_dir = %s: exists and is not a folder",
                         path);
    return STATUS_OK;
}

// The matmul rate of this rank's backend (fp32, the model's GEMM path),
// measured while every rank measures (so that ranks sharing cores or a GPU
// share them here too); summed over the world: the MFU denominator, unless
// [system] peak_tflops gives it.
static double measure_peak_flops(struct trainer *t) {
    if (t->cfg.system.peak_tflops > 0) return t->cfg.system.peak_tflops * 1e12;
    int M = 1024, N = 1024, K = 1024;
    size_t bytes = (size_t)M * K * sizeof(float);
    struct tensor a = tensor_view(backend_alloc(t->be, bytes), DTYPE_FP32, (size_t)M * K);
    struct tensor b = tensor_view(backend_alloc(t->be, bytes), DTYPE_FP32, (size_t)K * N);
    struct tensor c = tensor_view(backend_alloc(t->be, bytes), DTYPE_FP32, (size_t)M * N);
    CHECK(a.data && b.data && c.data, "no memory for the matmul probe");
    backend_memset0(t->be, a), backend_memset0(t->be, b);
    backend_matmul(t->be, c, a, b, M, N, K, false, true, 1.0f, 0.0f); // warm-up
    backend_synchronize(t->be);
    comm_barrier(&t->topo.world);
    double best = 0, start = time_now_s();
    for (int rep = 0; rep < 50 && (rep < 4 || time_now_s() - start < 0.5); rep++) {
        double t0 = time_now_s();
        backend_matmul(t->be, c, a, b, M, N, K, false, true, 1.0f, 0.0f);
        backend_synchronize(t->be);
        best = MAX(best, 2.0 * M * N * K / (time_now_s() - t0)); // best of 0.5 s: least disturbed
    }
    backend_dealloc(t->be, a.data), backend_dealloc(t->be, b.data), backend_dealloc(t->be, c.data);
    comm_all_reduce(&t->topo.world, &best, 1, DTYPE_FP64, COMM_SUM);
    return best;
}

static void setup(struct trainer *t, int argc, char **argv) {
    struct error err = {0};
    int world_rank, world_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    t->topo.world_rank = world_rank;
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        if (world_rank == 0)
            printf("usage: trident train CONFIG.ini [section.key=value ...]\n"
                   "  under mpirun -np N or srun, N = tp * pp * dp; every key of docs/config.md\n"
                   "  can be overridden as section.key=value\n");
        MPI_Finalize();
        exit(0);
    }
    if (argc < 2 || argv[1][0] == '-') {
        error_set(&err, STATUS_BAD_INPUT,
                  "usage: trident train CONFIG.ini [section.key=value ...]%s%s",
                  argc >= 2 ? "; unknown option " : "", argc >= 2 ? argv[1] : "");
        trainer_fail_all(t, &err);
    }
    struct config *c = &t->cfg;
    if (config_load(argv[1], argc - 2, argv + 2, c, &err) ||
        config_validate(c, world_size, backend_has_cuda(), &err) || check_supported(c, world_size, &err))
        trainer_fail_all(t, &err);
    if (topology_init(MPI_COMM_WORLD, c->parallel.tp, c->parallel.pp, c->parallel.dp, &t->topo, &err))
        trainer_fail_all(t, &err);

    // The tokenizer: [data] tokenizer when given (its identity must be the
    // dataset's: checked by dataset_open), else the dataset's own copy.
    char tok_path[CONFIG_PATH_MAX + 32];
    if (c->data.tokenizer[0]) snprintf(tok_path, sizeof tok_path, "%s", c->data.tokenizer);
    else snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", c->data.path);
    const char *tok_expected = NULL;
    if (c->data.tokenizer[0] || access(tok_path, R_OK) == 0) {
        if (tokenizer_load(tok_path, &t->tok, &err)) {
            err.status = STATUS_BAD_INPUT;
            trainer_fail_all(t, &err);
        }
        tok_expected = tokenizer_identity(t->tok);
    }
    if (dataset_open(c->data.path, c->train.seq_len, c->model.vocab_size, tok_expected, &t->ds, &err))
        trainer_fail_all(t, &err);
    int dp = c->parallel.dp, d = t->topo.coord.d, B = c->train.micro_batch_size;
    if (loader_init(&t->train_loader, t->ds, SPLIT_TRAIN, d, dp, B, c->train.global_batch_size,
                    (uint64_t)c->train.seed, &err))
        trainer_fail_all(t, &err);
    t->has_val = t->ds->split_sequences[SPLIT_VAL] >= (uint64_t)c->train.global_batch_size;
    if (t->has_val && loader_init(&t->val_loader, t->ds, SPLIT_VAL, d, dp, B,
                                  c->train.global_batch_size, (uint64_t)c->train.seed, &err))
        trainer_fail_all(t, &err);

    t->be = backend_init(c->system.device == DEVICE_CUDA ? BACKEND_CUDA : BACKEND_CPU,
                         t->topo.local_rank, c->system.threads, &err);
    if (!t->be) trainer_fail_here(&err);
    struct llama_config lc = plan_llama(c);
    t->lc = lc;
    int pp = c->parallel.pp, v = MAX(1, c->parallel.virtual_stages), s = t->topo.coord.p;
    t->accum = plan_microbatches(c);
    struct model_shard shard;
    if (plan_shard(c, t->topo.coord, &shard, &err)) trainer_fail_all(t, &err);
    t->whole_model = pp == 1 && v == 1;
    t->reads_tokens = s == 0, t->reads_targets = s == pp - 1;
    t->n_slots = MAX(1, shard.n_slots);
    if (model_init(&t->model, t->be, &lc, &shard, c->precision.dtype, B, c->train.seq_len,
                   (uint64_t)c->train.seed, &err))
        trainer_fail_all(t, &err);
    model_set_tp_group(t->model, &t->topo.tp_group);
    t->groups = (struct parallel_groups){&t->topo.tp_group, &t->topo.pp_group, &t->topo.dp_group,
                                         c->parallel.zero_stage};
    t->oc = optimizer_from(c);
    if (optimizer_init(&t->opt, t->be, t->model, &t->oc, &t->groups, &err)) trainer_fail_here(&err);
    if (c->parallel.zero_stage == 0)
        t->sync = grad_sync_init(t->model, &t->topo.dp_group, (size_t)c->parallel.bucket_mb << 20);
    if (!t->whole_model) {
        t->pipe = (struct pipeline_exec){.p = pp, .s = s, .m = t->accum, .v = v,
                                         .group = &t->topo.pp_group,
                                         .count = model_stage_message_numel(t->model),
                                         .dtype = c->precision.dtype};
        train_step_bind_pipeline(&t->pipe);
        if (pipeline_exec_init(&t->pipe, &err)) trainer_fail_all(t, &err);
    }
    t->ctx = (struct train_ctx){t->model, t->opt, &t->oc, &t->groups, t->sync,
                                t->whole_model ? NULL : &t->pipe,
                                lc.tie_embeddings && pp > 1 ? &t->topo.embed_group : NULL};

    int T = c->train.seq_len;
    t->seqs = xmalloc(sizeof(int32_t) * B * (T + 1));
    t->tokens = xmalloc(sizeof(int32_t) * t->accum * B * T);
    t->split_all = xcalloc(3 * (size_t)world_size, sizeof *t->split_all);
    t->targets = xmalloc(sizeof(int32_t) * t->accum * B * T);

    int n;
    const struct param_info *p = model_params(t->model, &n);
    double matmul_params = 0;
    for (int i = 0; i < n; i++)
        if (p[i].cols > 1 && strcmp(p[i].name, "model.embed_tokens.weight")) matmul_params += p[i].numel;
    if (lc.tie_embeddings) matmul_params += (double)lc.vocab_size * lc.d_model;
    t->flops_per_token = 6.0 * matmul_params + 6.0 * lc.n_layers * lc.d_model * T;
    const struct model_memory *mem = model_memory(t->model);
    t->mem_bytes = mem->param_bytes + mem->grad_bytes + mem->activation_bytes +
                   optimizer_state_bytes(t->opt);
    trainer_resume(t);
    t->peak_flops = measure_peak_flops(t);
    t->watchdog = watchdog_start(c->system.watchdog_s, t->topo.world_rank);

    // Samples come from the TP group of DP rank 0, of a whole-model stage.
    if (!(t->topo.coord.d == 0 && c->train.sample_every > 0 && t->whole_model)) {
        tokenizer_free(t->tok);
        t->tok = NULL;
    }
    if (is_root(t) && c->train.sample_every > 0 && !t->tok)
        printf("note: no text samples: %s\n", !t->whole_model ? "not under pipeline parallelism yet"
               : "no tokenizer (set [data] tokenizer or put tokenizer.json in [data] path)");
    if (is_root(t) && c->train.eval_every > 0 && !t->has_val)
        printf("note: no validation: the dataset's val split has %llu sequences, fewer than one "
               "global batch of %d\n", (unsigned long long)t->ds->split_sequences[SPLIT_VAL],
               c->train.global_batch_size);
    if (is_root(t)) {
        if (make_dirs(c->log.run_dir, &err)) trainer_fail_here(&err);
        char path[CONFIG_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/config.ini", c->log.run_dir);
        if (config_write(c, path, &err)) trainer_fail_here(&err);
        const char *mf = c->log.metrics_file;
        if (!mf[0]) snprintf(path, sizeof path, "%s/metrics.jsonl", c->log.run_dir), mf = path;
        t->metrics = fopen(mf, "w");
        if (!t->metrics) {
            error_set(&err, STATUS_BAD_INPUT, "[log] metrics_file = %s: cannot write: %s", mf,
                      strerror(errno));
            trainer_fail_here(&err);
        }
        printf("trident train: %s, world %d = tp %d x pp %d x dp %d, device %s\n", c->file,
               world_size, c->parallel.tp, c->parallel.pp, c->parallel.dp,
               c->system.device == DEVICE_CPU ? "cpu" : "cuda");
        printf("---- resolved config (also in %s/config.ini) ----\n", c->log.run_dir);
        config_print(c, stdout);
        printf("----\n");
        printf("model: %.2fM parameters on this rank; memory per rank: params %.1f MiB, grads "
               "%.1f MiB, optimizer %.1f MiB (%zu bytes%s), activations %.1f MiB (%zu bytes: "
               "%d slots of %zu bytes + scratch)\n",
               mem->n_params / 1e6, mem->param_bytes / 1048576.0, mem->grad_bytes / 1048576.0,
               optimizer_state_bytes(t->opt) / 1048576.0, optimizer_state_bytes(t->opt),
               c->parallel.zero_stage == 1 ? ", ZeRO-1 shard" : "", mem->activation_bytes / 1048576.0,
               mem->activation_bytes, t->n_slots, mem->slot_bytes);
        printf("data: %s: %llu train sequences, %llu validation sequences of %d tokens; "
               "%d microbatches of %d per rank per step; peak %.1f GFLOP/s (%s)\n",
               c->data.path, (unsigned long long)t->ds->split_sequences[SPLIT_TRAIN],
               (unsigned long long)t->ds->split_sequences[SPLIT_VAL], T, t->accum, B,
               t->peak_flops / 1e9, c->system.peak_tflops > 0 ? "config" : "measured fp32 matmul");
        fflush(stdout);
    }
}

// Splits loader sequences (B, T + 1) into inputs (B, T) and next-token targets.
static void next_microbatch(struct trainer *t, struct loader *ld, int32_t *tokens, int32_t *targets) {
    struct error err;
    if (loader_next(ld, t->seqs, &err)) trainer_fail_here(&err);
    int B = t->cfg.train.micro_batch_size, T = t->cfg.train.seq_len;
    for (int b = 0; b < B; b++) {
        memcpy(tokens + b * T, t->seqs + b * (T + 1), sizeof(int32_t) * T);
        memcpy(targets + b * T, t->seqs + b * (T + 1) + 1, sizeof(int32_t) * T);
    }
}

// Mean loss over eval_steps validation global batches, summed over DP.
static double evaluate(struct trainer *t) {
    int BT = t->cfg.train.micro_batch_size * t->cfg.train.seq_len;
    double sum = 0;
    int64_t count = 0;
    loader_reset(&t->val_loader);
    for (int s = 0; s < t->cfg.train.eval_steps; s++) {
        if (t->reads_tokens || t->reads_targets)
            for (int k = 0; k < t->accum; k++)
                next_microbatch(t, &t->val_loader, t->tokens + k * BT, t->targets + k * BT);
        double ls;
        int64_t n;
        train_step_eval(&t->ctx, t->reads_tokens ? t->tokens : NULL,
                        t->reads_targets ? t->targets : NULL, t->accum,
                        t->cfg.train.micro_batch_size, t->cfg.train.seq_len, &ls, &n);
        sum += ls, count += n;
        watchdog_kick(t->watchdog);
    }
    return count ? sum / count : 0.0;
}

static void format_eta(double s, char *buf, size_t n) {
    long x = (long)(s + 0.5);
    if (x >= 3600) snprintf(buf, n, "%ldh%02ldm", x / 3600, x / 60 % 60);
    else if (x >= 60) snprintf(buf, n, "%ldm%02lds", x / 60, x % 60);
    else snprintf(buf, n, "%lds", x);
}

// Seconds this rank has spent blocked in tensor/data-parallel (and tied
// embedding) collectives, and in pipeline messages.
static void comm_busy(struct trainer *t, double *collective, double *pipeline) {
    *collective = t->topo.tp_group.busy_s + t->topo.dp_group.busy_s + t->topo.embed_group.busy_s;
    *pipeline = t->topo.pp_group.busy_s;
}

// split: this rank's (compute, communication, pipeline wait) seconds of the
// step. Gathered from every rank (a collective: every rank calls log_step at
// the same steps); rank 0 prints its own and the largest pipeline wait, and
// writes every rank's to metrics.jsonl.
static void log_step(struct trainer *t, int step, const struct train_step_result *r, double dt,
                     double elapsed, const double split[3]) {
    int W = t->topo.world_size;
    double *all = t->split_all;
    comm_all_gather(&t->topo.world, split, all, 3, DTYPE_FP64);
    if (!is_root(t)) return;
    double worst_wait = 0;
    for (int i = 0; i < W; i++) worst_wait = MAX(worst_wait, all[3 * i + 2]);
    const struct config *c = &t->cfg;
    double tokens = (double)c->train.global_batch_size * c->train.seq_len;
    double tps = tokens / dt, mfu = t->flops_per_token * tps / t->peak_flops;
    double eta = elapsed / (step + 1 - t->start_step) * (c->train.steps - step - 1);
    char eta_s[32];
    format_eta(eta, eta_s, sizeof eta_s);
    // The printed line and the JSON line use the same formats, so they agree.
    // loss and grad norm carry 6 decimals so that runs can be compared to 1e-5.
    printf("step %5d/%d | loss %.6f | lr %.3e | grad norm %.6f | %.0f tok/s | MFU %.2f%% | "
           "mem %.1f MiB | %.1f ms/step | ETA %s | rank 0: compute %.1f ms, comm %.1f ms, "
           "pipeline wait %.1f ms (max over ranks %.1f ms)\n", step + 1, c->train.steps, r->loss,
           r->lr, r->grad_norm, tps, 100 * mfu, t->mem_bytes / 1048576.0, dt * 1e3, eta_s,
           split[0] * 1e3, split[1] * 1e3, split[2] * 1e3, worst_wait * 1e3);
    fprintf(t->metrics, "{\"step\": %d, \"loss\": %.6f, \"lr\": %.3e, \"grad_norm\": %.6f, "
            "\"tokens_per_s\": %.0f, \"mfu\": %.4f, \"mem_bytes\": %zu, \"step_time_s\": %.4f, "
            "\"eta_s\": %.0f", step + 1, r->loss, r->lr, r->grad_norm, tps, mfu, t->mem_bytes,
            dt, eta);
    const char *keys[3] = {"compute_s", "comm_s", "pipeline_wait_s"};
    for (int k = 0; k < 3; k++) {
        fprintf(t->metrics, ", \"%s\": [", keys[k]);
        for (int i = 0; i < W; i++) fprintf(t->metrics, "%s%.4f", i ? ", " : "", all[3 * i + k]);
        fprintf(t->metrics, "]");
    }
    fprintf(t->metrics, "}\n");
    fflush(stdout), fflush(t->metrics);
}

// Set by SIGTERM / SIGUSR1 (what Slurm's --signal sends before the time
// limit): finish the step, save, exit EXIT_PREEMPTED. A signal handler can only
// reach a global.
static volatile sig_atomic_t preempt_signal;
static void on_preempt(int sig) { preempt_signal = sig; }

// Returns 0, or EXIT_PREEMPTED when a signal stopped the run after a save.
static int run(struct trainer *t) {
    const struct config *c = &t->cfg;
    int B = c->train.micro_batch_size, T = c->train.seq_len;
    double start = time_now_s(), best_val = INFINITY, tokens_seen = 0;
    bool saves = c->checkpoint.dir[0] != '\0';
    if (t->start_step >= c->train.steps && is_root(t))
        printf("nothing to do: the checkpoint is at step %d and [train] steps = %d\n",
               t->start_step, c->train.steps);
    for (int step = t->start_step; step < c->train.steps; step++) {
        double t0 = time_now_s(), coll0, pipe0, coll1, pipe1;
        comm_busy(t, &coll0, &pipe0);
        // Inputs are read on the first stage, labels on the last.
        if (t->reads_tokens || t->reads_targets)
            for (int k = 0; k < t->accum; k++)
                next_microbatch(t, &t->train_loader, t->tokens + k * B * T, t->targets + k * B * T);
        struct train_step_result r;
        watchdog_kick(t->watchdog);
        train_step_run(&t->ctx, step, t->reads_tokens ? t->tokens : NULL,
                       t->reads_targets ? t->targets : NULL, t->accum, B, T, &r);
        if (!isfinite(r.loss)) {
            struct error err;
            error_set(&err, STATUS_RUNTIME, "step %d: loss is %g; stopping", step + 1, r.loss);
            trainer_fail_here(&err);
        }
        double dt = time_now_s() - t0;
        watchdog_kick(t->watchdog);
        comm_busy(t, &coll1, &pipe1);
        double split[3] = {dt - (coll1 - coll0) - (pipe1 - pipe0), coll1 - coll0, pipe1 - pipe0};
        tokens_seen += (double)c->train.global_batch_size * T;
        bool last = step == c->train.steps - 1;
        if (last || (step + 1) % c->log.every == 0 || step == t->start_step)
            log_step(t, step, &r, dt, time_now_s() - start, split);
        // Any rank's signal stops every rank after this step, with a save.
        int stop = preempt_signal;
        comm_all_reduce(&t->topo.world, &stop, 1, DTYPE_I32, COMM_MAX);
        bool planned_exit = c->train.exit_interval > 0 && (step + 1) % c->train.exit_interval == 0;
        if (saves && (last || stop || planned_exit ||
                      (c->checkpoint.every > 0 && (step + 1) % c->checkpoint.every == 0)))
            trainer_save(t, step + 1);
        if (planned_exit && !last && !stop) {
            if (is_root(t)) printf("exit_interval %d: stopping after step %d\n", c->train.exit_interval, step + 1);
            return 0;
        }
        if (stop) {
            if (is_root(t)) {
                printf("stopped by signal %d after step %d%s; exit %d (requeue)\n", stop, step + 1,
                       saves ? ", checkpoint saved" : " (no [checkpoint] dir: nothing saved)",
                       EXIT_PREEMPTED);
                fflush(stdout);
            }
            return EXIT_PREEMPTED;
        }
        if (t->has_val && c->train.eval_every > 0 && ((step + 1) % c->train.eval_every == 0 || last)) {
            double val = evaluate(t);
            best_val = MIN(best_val, val);
            if (is_root(t)) {
                printf("step %5d/%d | validation loss %.4f\n", step + 1, c->train.steps, val);
                fprintf(t->metrics, "{\"step\": %d, \"val_loss\": %.4f}\n", step + 1, val);
                fflush(stdout), fflush(t->metrics);
            }
        }
        // The TP group of data-parallel rank 0 samples together; world rank 0 prints.
        if (t->topo.coord.d == 0 && t->tok && c->train.sample_every > 0 &&
            ((step + 1) % c->train.sample_every == 0 || last)) {
            FILE *out = is_root(t) ? stdout : NULL;
            if (out) printf("step %5d/%d | sample: ", step + 1, c->train.steps);
            sample_print(t->model, t->tok, c->train.sample_tokens, c->train.sample_temperature,
                         c->train.sample_top_k, (uint64_t)c->train.seed + step, out);
            if (out) printf("\n"), fflush(stdout);
        }
    }
    double total = time_now_s() - start;
    if (is_root(t)) {
        printf("done: %d steps, %.0f tokens seen, %.1f s, mean %.0f tokens/s", c->train.steps - t->start_step,
               tokens_seen, total, tokens_seen / total);
        if (isfinite(best_val)) printf(", best validation loss %.4f", best_val);
        printf("\nactivation slots on rank 0: %d used of %d (%d microbatches per step)\n",
               model_slots_used(t->model), t->n_slots, t->accum);
    }
    return 0;
}

static void teardown(struct trainer *t) {
    watchdog_stop(t->watchdog);
    if (t->metrics) fclose(t->metrics);
    tokenizer_free(t->tok);
    if (t->sync) grad_sync_free(t->sync);
    pipeline_exec_free(&t->pipe);
    optimizer_free(t->opt);
    model_free(t->model);
    if (t->has_val) loader_free(&t->val_loader);
    loader_free(&t->train_loader);
    dataset_close(t->ds);
    backend_free(t->be);
    topology_free(&t->topo);
    free(t->seqs), free(t->tokens), free(t->targets), free(t->split_all);
    free(t->host_params), free(t->host_m), free(t->host_v), free(t->pieces);
}

int cmd_train(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    mpi_util_init(MPI_COMM_WORLD);
    struct sigaction sa = {0};
    sa.sa_handler = on_preempt;
    sa.sa_flags = SA_RESTART; // reads and MPI calls the signal interrupts carry on
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    struct trainer t = {0};
    setup(&t, argc, argv);
    int rc = run(&t);
    teardown(&t);
    MPI_Finalize();
    return rc;
}

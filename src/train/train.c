// train.c: the trainer (train.h): setup in named steps (grid, train.log, device,
// data, model, parallel, resume, run folder, banner), then the loop of steps with
// validation, samples, checkpoints, a log line per step and metrics.jsonl
// (docs/design.md §9). Checkpoints are in train_ckpt.c.
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <mpi.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "base/tee.h"
#include "base/version.h"
#include "base/threads.h"
#include "ckpt/durable.h"
#include "data/cache.h"
#include "kernels/backend.h"
#include "model/sample.h"
#include "plan.h"
#include "metrics_sink.h"
#include "run_folder.h"
#include "step_plan.h"
#include "trainer.h"

static bool is_root(const struct trainer *t) { return t->par.topo.world_rank == 0; }

static struct optimizer_config optimizer_from(const struct config *c) {
    return (struct optimizer_config){
        .lr = c->train.lr, .min_lr = c->train.min_lr, .warmup_steps = c->train.warmup_steps,
        .steps = c->train.steps, .schedule = (enum lr_schedule)c->train.lr_schedule,
        .beta1 = c->train.beta1, .beta2 = c->train.beta2, .eps = c->train.adam_eps,
        .weight_decay = c->train.weight_decay, .grad_clip = c->train.grad_clip,
        .grad_dtype = c->precision.grad_dtype,
    };
}

// Features this build does not have yet are refused before any work.
static enum status check_supported(const struct config *c, struct error *err) {
    (void)c;
    (void)err;
    return STATUS_OK;
}

// The matmul rate of this rank's backend in the model's compute dtype
// ([precision] dtype: the model's GEMM path, so that a bf16 run's MFU is
// against the bf16 rate, not fp32's), measured while every rank measures (so
// that ranks sharing cores or a GPU share them here too); summed over the
// world: the job's peak, the MFU denominator. [system] peak_tflops > 0 is
// the rate of one device: the job's peak is then it x world size (every
// rank drives one device). FLOP/s.
static double measure_peak_flops(struct trainer *t) {
    if (t->cfg.system.peak_tflops > 0)
        return t->cfg.system.peak_tflops * 1e12 * t->par.topo.world_size;
    int M = 1024, N = 1024, K = 1024;
    enum dtype dt = t->cfg.precision.dtype;
    size_t bytes = (size_t)M * K * dtype_size(dt);
    struct tensor a = tensor_view(backend_alloc(t->m.be, bytes), dt, (size_t)M * K);
    struct tensor b = tensor_view(backend_alloc(t->m.be, bytes), dt, (size_t)K * N);
    struct tensor c = tensor_view(backend_alloc(t->m.be, bytes), dt, (size_t)M * N);
    CHECK(a.data && b.data && c.data, "no memory for the matmul probe");
    backend_memset0(t->m.be, a), backend_memset0(t->m.be, b);
    backend_matmul(t->m.be, c, a, b, M, N, K, false, true, 1.0f, 0.0f); // warm-up
    backend_synchronize(t->m.be);
    comm_barrier(&t->par.topo.world);
    double best = 0, start = time_now_s();
    for (int rep = 0; rep < 50 && (rep < 4 || time_now_s() - start < 0.5); rep++) {
        double t0 = time_now_s();
        backend_matmul(t->m.be, c, a, b, M, N, K, false, true, 1.0f, 0.0f);
        backend_synchronize(t->m.be);
        best = MAX(best, 2.0 * M * N * K / (time_now_s() - t0)); // best of 0.5 s: least disturbed
    }
    backend_dealloc(t->m.be, a.data), backend_dealloc(t->m.be, b.data), backend_dealloc(t->m.be, c.data);
    comm_all_reduce(&t->par.topo.world, &best, 1, DTYPE_FP64, COMM_SUM);
    return best;
}

// ---- setup -------------------------------------------------------------------
// Errors every rank finds the same way (the config, the data, the layout) are
// returned as they are; errors of this rank alone are marked (trainer_alone).

// The grid of the [parallel] layout (MPI groups; no CUDA call yet).
static enum status setup_grid(struct trainer *t, struct trainer_error *err) {
    struct grid_layout grid = config_grid(&t->cfg);
    if (topology_init(MPI_COMM_WORLD, &grid, &t->par.topo, &err->err))
        return err->err.status;
    return STATUS_OK;
}

// One rank's CUDA device, gathered for check_device_sharing: 96 bytes (24
// int32 for comm_all_gather).
struct device_slot {
    char host[64];
    char bus[24];   // PCI bus id, or "device N" when the runtime cannot say
    int32_t count;  // devices this rank sees
    int32_t rank;   // world rank
};

static int device_slot_cmp(const void *a, const void *b) {
    const struct device_slot *x = a, *y = b;
    int c = strcmp(x->host, y->host);
    if (!c) c = strcmp(x->bus, y->bus);
    return c ? c : x->rank - y->rank;
}

// Ranks that would share a GPU: every rank's host and device's PCI bus id
// (what NCCL tells GPUs apart by), gathered over the world, so each rank
// reaches the same verdict: one GPU used by two or more ranks is refused
// (STATUS_BAD_INPUT, every rank; rank 0 prints the first such GPU: its host,
// ranks, that host's ranks and GPUs, the key) unless [system] share_devices
// = true (then rank 0 notes it). Per-rank CUDA_VISIBLE_DEVICES (srun
// --gpus-per-task) gives each rank a different GPU as its device 0: no
// sharing. Collective over the world.
static enum status check_device_sharing(struct trainer *t, int device, int n, struct trainer_error *err) {
    struct topology *topo = &t->par.topo;
    int W = topo->world_size;
    struct device_slot mine = {.count = n, .rank = topo->world_rank};
    _Static_assert(sizeof mine == 96, "device_slot is gathered as 24 int32");
    if (gethostname(mine.host, sizeof mine.host - 1)) snprintf(mine.host, sizeof mine.host, "?");
    if (backend_device_bus_id(device, mine.bus, sizeof mine.bus))
        snprintf(mine.bus, sizeof mine.bus, "device %d", device);
    struct device_slot *all = xcalloc((size_t)W, sizeof *all);
    comm_all_gather(&topo->world, &mine, all, sizeof mine / 4, DTYPE_I32);
    qsort(all, (size_t)W, sizeof *all, device_slot_cmp);
    int first = -1; // the first slot of the first GPU with two ranks
    for (int i = 1; i < W && first < 0; i++)
        if (!strcmp(all[i].host, all[i - 1].host) && !strcmp(all[i].bus, all[i - 1].bus)) first = i - 1;
    enum status st = STATUS_OK;
    if (first >= 0) {
        const struct device_slot *g = &all[first];
        int on_gpu = 0, on_host = 0, gpus = 0;
        char ranks[160] = "";
        for (int i = 0; i < W; i++) {
            if (strcmp(all[i].host, g->host)) continue;
            on_host++;
            gpus += i == 0 || strcmp(all[i].host, all[i - 1].host) || strcmp(all[i].bus, all[i - 1].bus);
            if (strcmp(all[i].bus, g->bus)) continue;
            size_t len = strlen(ranks);
            if (on_gpu++ < 8) snprintf(ranks + len, sizeof ranks - len, "%s%d", on_gpu > 1 ? ", " : "", all[i].rank);
            else if (on_gpu == 9) snprintf(ranks + len, sizeof ranks - len, ", ...");
        }
        if (!t->cfg.system.share_devices) {
            error_set(&err->err, STATUS_BAD_INPUT, "[system] device = cuda: %d ranks on host %s would share "
                      "one CUDA device (PCI %s: ranks %s); the host runs %d ranks on %d device%s (rank %d "
                      "sees %d): launch at most one rank per device, or set [system] share_devices = true "
                      "(system.share_devices=true) to share them round-robin", on_gpu, g->host, g->bus, ranks,
                      on_host, gpus, gpus > 1 ? "s" : "", g->rank, g->count);
            st = STATUS_BAD_INPUT; // every rank, the same verdict: rank 0 prints it
        } else if (is_root(t)) {
            fprintf(stderr, "trident: note: ranks share CUDA devices round-robin ([system] share_devices = "
                    "true): e.g. host %s runs %d ranks on %d device%s (ranks %s on PCI %s); NCCL refuses two "
                    "ranks of one group on one GPU unless it is 2.30 or later with "
                    "NCCL_MULTI_RANK_GPU_ENABLE=1\n", g->host, on_host, gpus, gpus > 1 ? "s" : "", ranks, g->bus);
        }
    }
    free(all);
    return st;
}

// The backend, on the CUDA device of this rank's node-local rank (modulo the
// devices it sees: topology_device_of) before any other CUDA or NCCL call;
// then, under CUDA, the NCCL groups over device buffers (topology_init_device,
// collective over the world; a backend that failed on one rank aborts the job
// there, so none waits forever). The groups the optimizer and the step use:
// device groups for gradients and parameters, the MPI groups for host scalars.
static enum status setup_device(struct trainer *t, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    struct trainer_parallel *par = &t->par;
    struct topology *topo = &par->topo;
    bool cuda = c->system.device == DEVICE_CUDA;
    int device = 0;
    enum status st;
    if (cuda) {
        int n = backend_device_count();
        if (n < 1) {
            error_set(&err->err, STATUS_RUNTIME, "[system] device = cuda: rank %d (node-local "
                      "rank %d) sees no CUDA device (driver missing or CUDA_VISIBLE_DEVICES "
                      "empty)", topo->world_rank, topo->local_rank);
            return trainer_alone(err);
        }
        device = topology_device_of(topo, n);
        if ((st = check_device_sharing(t, device, n, err))) return st;
    }
    // OpenMP threads: [system] threads, else this rank's CPU affinity, else
    // SLURM_CPUS_PER_TASK, else the node's cores / its ranks (base/threads.h);
    // every rank's count and source gathered for rank 0's banner.
    struct threads_choice th = threads_choose(threads_affinity_cpus(), threads_node_cpus(), topo->local_size,
                                              getenv("SLURM_CPUS_PER_TASK"), c->system.threads);
    int mine[2] = {th.threads, (int)th.source};
    t->log.threads_all = xcalloc(2 * (size_t)topo->world_size, sizeof *t->log.threads_all);
    comm_all_gather(&topo->world, mine, t->log.threads_all, 2, DTYPE_I32);
    t->m.be = backend_init(cuda ? BACKEND_CUDA : BACKEND_CPU, device, th.threads, &err->err);
    static const enum backend_attention attention[] = {[ATTENTION_AUTO] = BACKEND_ATTENTION_AUTO,
        [ATTENTION_CUDNN] = BACKEND_ATTENTION_CUDNN, [ATTENTION_NATIVE] = BACKEND_ATTENTION_NATIVE};
    if (!t->m.be || backend_set_attention(t->m.be, attention[c->system.attention], &err->err))
        return trainer_alone(err);
    // FP8 GEMMs need a device with FP8 tensor cores (compute capability 8.9+):
    // refused at start, naming the device, not at the first step.
    if (c->precision.fp8 != FP8_NONE && backend_check_fp8(t->m.be, &err->err)) {
        char why[sizeof err->err.msg];
        snprintf(why, sizeof why, "%s", err->err.msg);
        error_set(&err->err, err->err.status, "[precision] fp8 = %s: %s",
                  c->precision.fp8 == FP8_HYBRID ? "hybrid" : "e4m3", why);
        return trainer_alone(err);
    }
    // Which attention path each shape takes: said once, by rank 0 (docs/cuda.md).
    backend_set_attention_log(t->m.be, topo->world_rank == 0 ? stdout : NULL);
    if (cuda && topo->world_size > 1 && topology_init_device(topo, t->m.be, &err->err))
        return err->err.status;
#define DEVICE(kind) topology_device_group(topo, kind)
#define HOST(kind) topology_group(topo, kind)
    par->groups = (struct parallel_groups){
        // The gradient groups are data x context (axes_list.h): DP_CP, DP_SHARD_CP.
        .tp = DEVICE(GROUP_TP), .pp = DEVICE(GROUP_PP), .dp = DEVICE(GROUP_DP_CP),
        .zero_stage = c->parallel.zero_stage,
        .host_tp = HOST(GROUP_TP), .host_pp = HOST(GROUP_PP), .host_dp = HOST(GROUP_DP_CP),
        .dp_shard = DEVICE(GROUP_DP_SHARD_CP), .dp_replicate = DEVICE(GROUP_DP_REPLICATE),
        .host_dp_shard = HOST(GROUP_DP_SHARD_CP), .host_dp_replicate = HOST(GROUP_DP_REPLICATE),
        .cp = DEVICE(GROUP_CP), .host_cp = HOST(GROUP_CP),
        .ep = DEVICE(GROUP_EP), .host_ep = HOST(GROUP_EP),
        .expert_dp = DEVICE(GROUP_EXPERT_DP), .host_expert_dp = HOST(GROUP_EXPERT_DP)};
#undef DEVICE
#undef HOST
    return STATUS_OK;
}

// The tokenizer, the dataset, this rank's loaders and the token buffers.
static enum status setup_data(struct trainer *t, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    struct trainer_data *d = &t->data;
    // The datasets: [data] paths (a blend), else [data] path.
    struct blend_spec *bs = xmalloc(sizeof *bs);
    if (c->data.paths[0]) {
        if (blend_parse("[data] paths", c->data.paths, bs, &err->err)) {
            free(bs);
            return err->err.status;
        }
    } else {
        *bs = (struct blend_spec){.n = 1, .weights = {1.0}};
        snprintf(bs->paths[0], sizeof bs->paths[0], "%s", c->data.path);
    }
    // The tokenizer: [data] tokenizer when given (its identity must be the
    // (first) dataset's: checked by dataset_open), else that dataset's copy.
    char tok_path[CONFIG_PATH_MAX + 32];
    if (c->data.tokenizer[0]) snprintf(tok_path, sizeof tok_path, "%s", c->data.tokenizer);
    else snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", bs->paths[0]);
    const char *tok_expected = NULL;
    if (c->data.tokenizer[0] || access(tok_path, R_OK) == 0) {
        if (tokenizer_load(tok_path, &d->tok, &err->err)) {
            free(bs);
            return err->err.status = STATUS_BAD_INPUT;
        }
        tok_expected = tokenizer_identity(d->tok);
    }
    // The first dataset is checked against the model and the tokenizer, the
    // others against the first (a message naming both folders).
    enum status st = STATUS_OK;
    for (int k = 0; k < bs->n && !st; k++) {
        st = dataset_open(bs->paths[k], c->train.seq_len, k ? 0 : c->model.vocab_size, k ? NULL : tok_expected,
                          &d->sets[k], &err->err);
        if (st && !k && strstr(err->err.msg, "but the run's tokenizer is")) { // say where the run's comes from
            size_t n = strlen(err->err.msg);
            snprintf(err->err.msg + n, sizeof err->err.msg - n, "; the run's tokenizer is %s (%s): set [data] "
                     "tokenizer to the file the data was prepared with, or prepare the data with this one",
                     tok_path, c->data.tokenizer[0] ? "[data] tokenizer" : "the dataset's own copy");
        }
        if (st) break;
        d->weights[k] = bs->weights[k];
        d->n_sets = k + 1;
        // The hot tier: node-local rank 0 stages for the node (data/cache.h);
        // each dataset of a blend has its own folder and budget there.
        if (c->data.cache_dir[0] &&
            (st = cache_open(c->data.cache_dir, bs->paths[k], &d->sets[k]->index, c->data.cache_bytes,
                             c->data.prefetch_shards, t->par.topo.local_rank == 0, &d->sets[k]->cache,
                             &err->err)))
            break;
        const struct index *a = &d->sets[0]->index, *b = &d->sets[k]->index;
        if (a->vocab_size != b->vocab_size || a->eot_id != b->eot_id || strcmp(a->tokenizer, b->tokenizer))
            st = error_set(&err->err, STATUS_BAD_INPUT, "[data] paths: %s/index.ini has tokenizer '%s' (vocab_size "
                           "%lld, eot_id %lld) but %s/index.ini has '%s' (vocab_size %lld, eot_id %lld): blended "
                           "datasets must be made with one tokenizer", bs->paths[k], b->tokenizer,
                           (long long)b->vocab_size, (long long)b->eot_id, bs->paths[0], a->tokenizer,
                           (long long)a->vocab_size, (long long)a->eot_id);
    }
    free(bs);
    d->ds = d->sets[0];
    if (st) return st;
    int dp = c->parallel.dp, rank_d = topology_rank_in(&t->par.topo, GROUP_DP), B = c->train.micro_batch_size;
    int G = c->train.global_batch_size;
    if (loader_init_blend(&d->train_loader, d->sets, d->weights, d->n_sets, SPLIT_TRAIN, rank_d, dp, B, G,
                          (uint64_t)c->train.seed, &err->err))
        return err->err.status;
    uint64_t val_total = 0;
    d->has_val = true;
    for (int k = 0; k < d->n_sets; k++) {
        val_total += d->sets[k]->split_sequences[SPLIT_VAL];
        if (d->sets[k]->split_sequences[SPLIT_VAL] == 0) d->has_val = false;
    }
    d->has_val = d->has_val && val_total >= (uint64_t)G;
    if (d->has_val && loader_init_blend(&d->val_loader, d->sets, d->weights, d->n_sets, SPLIT_VAL, rank_d, dp,
                                        B, G, (uint64_t)c->train.seed, &err->err))
        return err->err.status;
    // TRIDENT_LOG_SAMPLES=FILE: the train loader of each DP rank appends the
    // samples it serves to FILE (loader_set_log), from the rank of tensor,
    // context and pipeline coordinate 0 only, so each sample is logged once.
    const char *log_samples = getenv("TRIDENT_LOG_SAMPLES");
    if (log_samples && log_samples[0] && topology_rank_in(&t->par.topo, GROUP_TP) == 0 &&
        topology_rank_in(&t->par.topo, GROUP_CP) == 0 && topology_rank_in(&t->par.topo, GROUP_PP) == 0) {
        d->sample_log = fopen(log_samples, "a");
        if (!d->sample_log) {
            error_set(&err->err, STATUS_BAD_INPUT, "TRIDENT_LOG_SAMPLES = %s: cannot append: %s", log_samples,
                      strerror(errno));
            return trainer_alone(err);
        }
        setvbuf(d->sample_log, NULL, _IOLBF, 0);
        loader_set_log(&d->train_loader, d->sample_log);
    }
    // Inputs are read on the first pipeline stage, labels on the last (stage
    // 0 too under ZB-V). With
    // packing = concat_reset every stage reads the inputs too and derives the
    // document starts itself (model_set_doc_eot): a few hundred bytes of
    // hyperslab reads per microbatch instead of a (B, T) message beside each
    // activation message of the pipeline.
    int s = topology_rank_in(&t->par.topo, GROUP_PP), T = c->train.seq_len;
    d->reads_tokens = s == 0 || c->data.packing == PACKING_CONCAT_RESET;
    d->reads_targets = s == pipeline_last_stage(c->parallel.pp_schedule, c->parallel.pp);
    d->accum = plan_microbatches(c);
    d->seqs = xmalloc(sizeof(int32_t) * B * (T + 1));
    d->mask = xmalloc((size_t)B * (T + 1));
    d->tokens = xmalloc(sizeof(int32_t) * d->accum * B * T);
    d->targets = xmalloc(sizeof(int32_t) * d->accum * B * T);
    return STATUS_OK;
}

// The backend, this rank's model shard and its optimizer; the FLOPs per token
// and the bytes the log reports.
static enum status setup_model(struct trainer *t, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    struct trainer_model *m = &t->m;
    struct topology *topo = &t->par.topo;
    m->lc = plan_llama(c);
    struct model_shard shard;
    if (plan_shard(c, topo->coord, &shard, &err->err)) return err->err.status;
    m->whole_model = c->parallel.pp == 1 && MAX(1, c->parallel.virtual_stages) == 1;
    m->n_slots = MAX(1, shard.n_slots);
    int T = c->train.seq_len;
    if (model_init(&m->model, m->be, &m->lc, &shard, c->precision.dtype, c->train.micro_batch_size,
                   T, (uint64_t)c->train.seed, &err->err)) // out of memory: this rank's stage alone
        return err->err.status == STATUS_RUNTIME ? trainer_alone(err) : err->err.status;
    model_set_groups(m->model, &t->par.groups);
    struct model_fp8_config fc = plan_fp8_config(c);
    if (model_fp8_init(m->model, &fc, &err->err)) // out of memory: this rank alone
        return err->err.status == STATUS_RUNTIME ? trainer_alone(err) : err->err.status;
    if (c->data.packing == PACKING_CONCAT_RESET) // index.ini's eot_id >= 0; ids are I32
        model_set_doc_eot(m->model, (int32_t)MIN(t->data.ds->index.eot_id, (int64_t)INT32_MAX));
    m->oc = optimizer_from(c);
    if (optimizer_init(&m->opt, m->be, m->model, &m->oc, &t->par.groups, &err->err))
        return trainer_alone(err);
    if (c->parallel.zero_stage >= 2) { // ZeRO-2/3 over the DP group (fsdp.h)
        // TRIDENT_ZERO_PREFETCH=0 / TRIDENT_ZERO_OVERLAP=0 (tests): no gather
        // ahead, each reduce-scatter waited for at once.
        const char *pf = getenv("TRIDENT_ZERO_PREFETCH"), *ov = getenv("TRIDENT_ZERO_OVERLAP");
        struct fsdp_config fc = {c->parallel.zero_stage, c->parallel.reshard_after_forward,
                                 !(pf && !strcmp(pf, "0")), !(ov && !strcmp(ov, "0")),
                                 c->precision.grad_dtype, c->model.tie_embeddings};
        // Hybrid sharding (parallel.dp_shard < dp): shard within dp_shard, all-reduce across replicas.
        if (fsdp_init(&t->par.fsdp, m->model, m->opt, topology_device_group(topo, GROUP_DP_SHARD_CP),
                      topology_device_group(topo, GROUP_DP_REPLICATE), &fc,
                      (uint64_t)c->train.seed, &err->err))
            return trainer_alone(err);
    }

    t->log.flops_per_token = model_flops_per_token(&m->lc, T); // the whole model's
    const struct model_memory *mem = model_memory(m->model);
    struct model_fp8_memory f8;
    if (model_fp8_plan_bytes(&m->lc, &shard, &fc, c->train.micro_batch_size, T, &f8, &err->err))
        return err->err.status;
    m->mem_bytes = mem->param_bytes + mem->grad_bytes + mem->activation_bytes +
                   optimizer_state_bytes(m->opt) + f8.weights + f8.scratch + f8.state;
    if (t->par.fsdp) {
        size_t zp, zg;
        fsdp_bytes(t->par.fsdp, &zp, &zg);
        m->mem_bytes += zp + zg;
    }
    return STATUS_OK;
}

// The data-parallel gradient sync (not under ZeRO-1, whose optimizer
// reduce-scatters), the pipeline executor, and the step context over them.
static enum status setup_parallel(struct trainer *t, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    struct trainer_parallel *par = &t->par;
    struct trainer_model *m = &t->m;
    int pp = c->parallel.pp;
    if (c->parallel.zero_stage == 0) {
        par->sync = grad_sync_init_ep(m->model, topology_device_group(&par->topo, GROUP_DP_CP),
                                      topology_device_group(&par->topo, GROUP_EXPERT_DP),
                                      (size_t)c->parallel.bucket_mb << 20, c->precision.grad_dtype);
        m->mem_bytes += grad_sync_bytes(par->sync); // the BF16 buckets of grad_dtype = bf16
    }
    if (!m->whole_model) {
        int v = MAX(1, c->parallel.virtual_stages);
        // Under NCCL the messages are device buffers on the NCCL PP group,
        // except for pp = 2 with virtual stages: there both streams of
        // messages between the two ranks (activations wrapping to stage 0,
        // gradients) share one direction, and NCCL, without tags, would match
        // them in send order (comm_nccl.h); the MPI group (host buffers, the
        // model copying) keeps them apart by tag.
        // ZB-V sends activations and gradients both ways and to itself
        // (stage p - 1's turn): the MPI group, by tag, as for pp = 2 above.
        enum pp_schedule kind = c->parallel.pp_schedule;
        bool device = par->topo.has_device_groups && !(pp == 2 && v > 1) && kind != PP_SCHEDULE_ZBV;
        par->pipe = (struct pipeline_exec){.kind = kind, .p = pp, .s = topology_rank_in(&par->topo, GROUP_PP), .m = t->data.accum,
                                           .v = v,
                                           .group = device ? topology_device_group(&par->topo, GROUP_PP)
                                                           : topology_group(&par->topo, GROUP_PP),
                                           .count = model_stage_message_numel(m->model),
                                           .dtype = c->precision.dtype,
                                           .be = device ? m->be : NULL};
        model_set_stage_messages_on_device(m->model, device);
        train_step_bind_pipeline(&par->pipe);
        if (pipeline_exec_init(&par->pipe, &err->err)) return err->err.status;
    }
    par->ctx = (struct train_ctx){m->model, m->opt, &m->oc, &par->groups, par->sync,
                                  m->whole_model ? NULL : &par->pipe,
                                  // ZB-V: the embedding and the head on stage 0, their
                                  // gradients summed there (model_finish_grads)
                                  m->lc.tie_embeddings && pp > 1 && c->parallel.pp_schedule != PP_SCHEDULE_ZBV
                                      ? topology_device_group(&par->topo, GROUP_EMBED) : NULL,
                                  NULL, false, par->fsdp};
    // fp16 scales the loss (docs/design.md §5); bf16 has fp32's exponent range
    // and needs no scale.
    const struct precision_config *pc = &c->precision;
    if (pc->dtype == DTYPE_FP16) {
        bool dynamic = pc->loss_scale_mode == LOSS_SCALE_DYNAMIC;
        t->scaler = (struct loss_scaler){
            .scale = dynamic ? pc->loss_scale_initial : pc->loss_scale,
            .min_scale = pc->loss_scale_min, .backoff = pc->loss_scale_backoff,
            .growth = pc->loss_scale_growth, .growth_interval = pc->loss_scale_growth_interval,
            .dynamic = dynamic};
        par->ctx.scaler = &t->scaler;
    }
    return STATUS_OK;
}

// TRIDENT_FAULT=grad_inf:STEP[@RANK] (tests only; parsed with the storage
// faults, src/ckpt/durable.h): an inf in the gradients of world rank RANK
// (every rank without @RANK) at step STEP (1-based, as logged).
// TRIDENT_FAULT=pp_delay:SEED[@RANK]: random delays in every pipeline send and
// receive of those ranks (pipeline_exec.delay_seed); pp_op_ms:N[@RANK]: N ms
// of sleep before each pipeline op (pipeline_exec.op_pad_s).
// Errors: STATUS_BAD_INPUT for a malformed TRIDENT_FAULT.
static enum status setup_faults(struct trainer *t, struct error *err) {
    long step;
    int rank;
    enum status st = durable_fault_grad_inf(&step, &rank, err);
    if (!st && (rank < 0 || rank == t->par.topo.world_rank)) t->fault_grad_inf_step = (int)step;
    long seed;
    if (!st) st = durable_fault_pp_delay(&seed, &rank, err);
    if (!st && (rank < 0 || rank == t->par.topo.world_rank)) t->par.pipe.delay_seed = (uint64_t)seed;
    long ms;
    if (!st) st = durable_fault_pp_op_ms(&ms, &rank, err);
    if (!st && (rank < 0 || rank == t->par.topo.world_rank)) t->par.pipe.op_pad_s = ms * 1e-3;
    return st;
}

// Samples come from every TP group and pipeline stage (world rank 0 prints;
// each sample runs on the model's key/value cache, sample.h, whose one row of
// seq_len positions is allocated here and counted in the run's memory, as
// `trident plan` counts it; under context parallelism each rank decodes the
// whole sequence alone, model.h). Rank 0 says when samples or validation
// were asked for and will not run.
static void setup_samples(struct trainer *t) {
    const struct config *c = &t->cfg;
    struct trainer_data *d = &t->data;
    char why[sizeof ((struct error *)0)->msg + 64] = "";
    if (!(c->train.sample_every > 0)) {
        tokenizer_free(d->tok);
        d->tok = NULL;
    }
    if (d->tok) {
        struct error err = {0};
        size_t bytes = 0;
        struct model_shard shard;
        // every rank tries; a rank out of memory for it turns samples off everywhere
        enum status st = plan_shard(c, t->par.topo.coord, &shard, &err);
        if (!st) st = model_kv_cache_bytes(&t->m.lc, &shard, c->precision.dtype, c->train.micro_batch_size,
                                           c->train.seq_len, 1, c->train.seq_len, &bytes, &err);
        if (!st) st = model_kv_cache_init(t->m.model, 1, c->train.seq_len, &err);
        if (t->par.topo.world_size > 1)
            st = comm_agree(&t->par.topo.world, st, "the samples' key/value cache",
                            &err);
        if (st) {
            snprintf(why, sizeof why, "the key/value cache: %s", err.msg);
            tokenizer_free(d->tok);
            d->tok = NULL;
        } else {
            t->m.mem_bytes += bytes;
        }
    }
    if (is_root(t) && c->train.sample_every > 0 && !d->tok)
        printf("note: no text samples: %s\n", why[0] ? why
               : "no tokenizer (set [data] tokenizer or put tokenizer.json in [data] path)");
    char short_val[sizeof d->ds->dir + 256] = "";
    for (int k = 0; k < d->n_sets && !short_val[0]; k++)
        dataset_val_unusable(d->sets[k], short_val, sizeof short_val);
    if (is_root(t) && c->train.eval_every > 0 && !d->has_val && short_val[0])
        printf("note: no validation: %s\n", short_val);
    else if (is_root(t) && c->train.eval_every > 0 && !d->has_val)
        printf("note: no validation: the dataset's val split has %llu sequences, fewer than one "
               "global batch of %d\n", (unsigned long long)d->ds->split_sequences[SPLIT_VAL],
               c->train.global_batch_size);
}

// Rank 0: loss_on = response on a dataset whose first shard has no
// /loss_mask trains on every token (a missing mask counts as all ones,
// docs/formats.md): say so, since a mistyped [data] path looks like that.
static void note_loss_mask(struct trainer *t) {
    const struct config *c = &t->cfg;
    if (!is_root(t) || c->train.loss_on != LOSS_ON_RESPONSE) return;
    for (int k = 0; k < t->data.n_sets; k++) {
        // The header alone (shard_open reads no token data); the loader
        // validates the shard in full when it first reads it.
        const struct dataset *ds = t->data.sets[k];
        char path[sizeof ds->dir + sizeof ds->shards[0].entry.file + 2];
        snprintf(path, sizeof path, "%s/%s", ds->dir, ds->shards[0].entry.file);
        struct shard sh;
        struct error e = {0};
        if (shard_open(path, &sh, &e)) continue;
        bool masked = sh.loss_mask >= 0;
        shard_close(&sh);
        if (!masked)
            printf("note: [train] loss_on = response, but %s has no /loss_mask (its first shard, %s): its "
                   "every token counts as a response token, as with loss_on = all (trident prep --format "
                   "chat writes the mask)\n", ds->dir, path);
    }
}

// Rank 0: the run folder and, from here on, its train.log (a copy of
// everything rank 0 prints: run_folder.h), which starts with the version;
// the run folder and the checkpoint folder locked against a second run.
static enum status setup_train_log(struct trainer *t, struct trainer_error *err) {
    if (!is_root(t)) return STATUS_OK;
    if (run_folder_open_log(t->cfg.log.run_dir, &err->err)) return trainer_alone(err);
    if (t->cfg.checkpoint.dir[0] && run_folder_lock(t->cfg.checkpoint.dir, "[checkpoint] dir", &err->err))
        return trainer_alone(err);
    printf("%s\n", version_string());
    fflush(stdout);
    return STATUS_OK;
}

// The buffer the log line gathers every rank's step split into; each rank's
// compute threads (a collective); on rank 0 this start's record and the
// run's history in the metrics file, config.ini and config-<step>.ini (errors
// of rank 0 alone; run_folder.h).
static enum status setup_log(struct trainer *t, long long started, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    int W = t->par.topo.world_size;
    t->log.split_all = xcalloc(SPLIT_N * (size_t)W, sizeof *t->log.split_all);
    int32_t threads = t->m.be->threads, *all = xcalloc((size_t)W, sizeof *all);
    comm_all_gather(&t->par.topo.world, &threads, all, 1, DTYPE_I32);
    if (!is_root(t)) {
        free(all);
        return STATUS_OK;
    }
    struct run_start s = {.step = t->ckpt.start_step, .resumed = t->ckpt.last[0] != '\0',
                          .world_size = W, .layout = t->par.topo.layout, .threads = all, .time = started,
                          .flops_per_token = t->log.flops_per_token, .peak_flops = t->log.peak_flops};
    char path[CONFIG_PATH_MAX + 32];
    const char *mf = c->log.metrics_file;
    if (!mf[0]) snprintf(path, sizeof path, "%s/metrics.jsonl", c->log.run_dir), mf = path;
    enum status st = run_folder_open_metrics(mf, &s, &t->log.metrics, &err->err);
    if (!st) printf("start: attempt %d at step %d; metrics appended to %s\n", s.attempt, s.step, mf);
    if (!st) st = run_folder_write_configs(c, &s, &err->err);
    struct metrics_sink_args sa = {.run_dir = c->log.run_dir, .tensorboard = c->log.tensorboard,
                                   .prometheus_file = c->log.prometheus_file, .start_step = s.step};
    if (!st) st = metrics_sink_open(&t->log.sink, &sa, &err->err);
    free(all);
    if (st) return trainer_alone(err);
    return STATUS_OK;
}

// Sequences of split over the run's datasets.
static uint64_t total_sequences(const struct trainer *t, enum split split) {
    uint64_t n = 0;
    for (int k = 0; k < t->data.n_sets; k++) n += t->data.sets[k]->split_sequences[split];
    return n;
}

// Rank 0's startup lines: the layout, the resolved config, memory and data.
static void print_banner(const struct trainer *t) {
    const struct config *c = &t->cfg;
    const struct model_memory *mem = model_memory(t->m.model);
    size_t opt_bytes = optimizer_state_bytes(t->m.opt);
    // dp from the default (0) was inferred from the world (config_resolve_dp).
    bool inferred = c->origin[config_key_index("parallel", "dp")] == 0;
    char grid[256];
    printf("trident train: %s, %s%s, device %s\n", c->file,
           topology_layout_line(&t->par.topo.layout, grid, sizeof grid),
           inferred ? " (dp inferred: world / (tp * cp * pp))" : "", c->system.device == DEVICE_CPU ? "cpu" : "cuda");
    // One count and source when every rank has the same, else rank by rank.
    const int *th = t->log.threads_all, n = t->par.topo.world_size;
    bool same = true;
    for (int r = 1; r < n; r++) same = same && th[2 * r] == th[0] && th[2 * r + 1] == th[1];
    printf("threads per rank:");
    for (int r = 0; r < (same ? 1 : n); r++)
        printf("%s %d (%s)", r ? "," : "", th[2 * r], threads_source_name((enum threads_source)th[2 * r + 1]));
    printf("\n");
    // Where and when this run saves, said at start (docs/design.md §7).
    char where[64];
    if (!c->checkpoint.dir[0])
        printf("checkpoints: none ([checkpoint] dir = none): a stop exits 3 with nothing saved\n");
    else
        printf("checkpoints: %s%s, %s\n", c->checkpoint.dir,
               c->origin[config_key_index("checkpoint", "dir")] ? "" : " ([checkpoint] dir unset: the run "
               "folder's; dir = none saves nothing)", c->checkpoint.every > 0 ? (snprintf(where, sizeof where,
               "every %d steps, at the end and on a stop", c->checkpoint.every), where)
               : "at the end and on a stop (checkpoint.every = 0: no periodic saves)");
    // Under Slurm a preemption signal (--signal, scancel, the time limit) can
    // come; without a checkpoint folder exit 3 saves nothing.
    const char *job = getenv("SLURM_JOB_ID");
    if (job && job[0] && !c->checkpoint.dir[0])
        fprintf(stderr, "trident: warning: running under Slurm (job %s) with [checkpoint] dir = none: a "
                "preemption signal (SIGUSR1 or SIGTERM: the time limit's --signal, scancel) stops every rank "
                "with exit 3 and nothing saved, and a requeued job starts again from step 0; set "
                "checkpoint.dir=FOLDER or leave it unset (the run folder's)\n", job);
    // Keys the config sets but nothing reads (fp8 = none): a warning, not an error.
    char unread[2048];
    if (config_unread_keys(c, unread, sizeof unread)) fprintf(stderr, "trident: warning: %s\n", unread);
    if (t->par.topo.has_device_groups)
        printf("communication: NCCL for device buffers (tensor, context, data, expert, embedding "
               "groups; pipeline messages %s), MPI for host scalars\n",
               t->par.pipe.be ? "over NCCL" : t->m.whole_model ? "none" : "over MPI");
    printf("---- resolved config (also in %s/config.ini) ----\n", c->log.run_dir);
    config_print(c, stdout);
    printf("----\n");
    printf("model: %.2fM parameters on this rank; memory per rank: params %.1f MiB, grads "
           "%.1f MiB, optimizer %.1f MiB (%zu bytes%s), activations %.1f MiB (%zu bytes: "
           "%d slots of %zu bytes + scratch)\n",
           mem->n_params / 1e6, mem->param_bytes / 1048576.0,
           (mem->grad_bytes + (t->par.sync ? grad_sync_bytes(t->par.sync) : 0)) / 1048576.0,
           opt_bytes / 1048576.0, opt_bytes, c->parallel.zero_stage == 1 ? ", ZeRO-1 shard" : "",
           mem->activation_bytes / 1048576.0, mem->activation_bytes, t->m.n_slots, mem->slot_bytes);
    printf("data: %s: %llu train sequences, %llu validation sequences of %d tokens; "
           "%d microbatches of %d per rank per step; peak %.1f GFLOP/s (%s%s)\n",
           c->data.paths[0] ? c->data.paths : c->data.path,
           (unsigned long long)total_sequences(t, SPLIT_TRAIN),
           (unsigned long long)total_sequences(t, SPLIT_VAL), c->train.seq_len, t->data.accum,
           c->train.micro_batch_size, t->log.peak_flops / 1e9,
           c->system.peak_tflops > 0 ? "config" : dtype_name(c->precision.dtype),
           c->system.peak_tflops > 0 ? "" : " matmul, measured");
    fflush(stdout);
}

// Heartbeat files in <run_dir>/heartbeat (base/heartbeat.h), so that a
// watchdog that fires waiting on peers names the stopped ones. Started after
// setup_device's collectives: every rank then knows that rank 0 holds the run
// folder's lock (a second run into it was refused before writing there). A
// folder that cannot be written (not shared with this host) costs only the
// naming: a note, and the watchdog goes on.
static void start_heartbeat(struct trainer *t) {
    char dir[CONFIG_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/heartbeat", t->cfg.log.run_dir);
    struct error e = {0};
    if (watchdog_heartbeat(t->watchdog, dir, t->par.topo.world_size, &e))
        fprintf(stderr, "trident: [rank %d] note: %s: a watchdog cannot name this rank if it stops\n",
                t->par.topo.world_rank, e.msg);
}

enum status trainer_open(struct trainer **out, const struct config *cfg,
                         struct trainer_error *err) {
    *out = NULL;
    err->alone = false;
    struct trainer *t = xcalloc(1, sizeof *t);
    t->cfg = *cfg;
    long long started = (long long)time(NULL);
    t->log.open_s = time_now_s();
    enum status st;
    if ((st = check_supported(&t->cfg, &err->err)) || (st = setup_grid(t, err))) return st;
    // The watchdog from here on, once the rank is known: each start-up phase
    // is named, those that wait on peers say so, the long ones (device and
    // communicators, data, allocation, reading weights) get allowances.
    struct watchdog *w = t->watchdog = watchdog_start(t->cfg.system.watchdog_s, t->par.topo.world_rank);
    watchdog_phase(w, "start-up: opening the run folder and train.log", 1, 0);
    if (!(st = setup_train_log(t, err))) {
        watchdog_phase(w, "start-up: setting up the device and communicators (collectives)",
                       WATCHDOG_FIRST_STEP, 1);
        st = setup_device(t, err);
    }
    if (!st) start_heartbeat(t);
    // NCCL's asynchronous errors (a failed collective, a dead peer) end the
    // run within a tick even while the main thread blocks on the device.
    if (!st && watchdog_add_check(w, topology_check_device_groups, &t->par.topo))
        CHECK(0, "watchdog: no room for the NCCL error check");
    if (!st) {
        watchdog_phase(w, "start-up: opening the dataset", WATCHDOG_FIRST_STEP, 0);
        st = setup_data(t, err);
    }
    if (!st) {
        watchdog_phase(w, "start-up: building the model and optimizer", WATCHDOG_FIRST_STEP, 0);
        st = setup_model(t, err);
    }
    if (!st) {
        watchdog_phase(w, "start-up: setting up the gradient sync and pipeline", WATCHDOG_FIRST_STEP, 1);
        st = setup_parallel(t, err);
    }
    if (!st) st = setup_faults(t, &err->err);
    if (!st) {
        // trainer_resume names its own phases (reading init_from weights,
        // loading a checkpoint) when it reads any.
        watchdog_phase(w, "start-up: finding the checkpoint to resume from", 1, 0);
        st = trainer_resume(t, err);
    }
    if (!st) {
        watchdog_phase(w, "start-up: measuring peak FLOP/s (a barrier and an all-reduce)", WATCHDOG_FIRST_STEP, 1);
        t->log.peak_flops = measure_peak_flops(t);
        setup_samples(t);
        note_loss_mask(t);
        watchdog_phase(w, "start-up: writing the run folder (an all-gather, then rank 0 writes)", 1, 1);
        st = setup_log(t, started, err);
    }
    if (st) { // the caller ends the job (mpi_exit_all): no phase of this start is left to watch
        watchdog_stop(w);
        t->watchdog = NULL;
        return st;
    }
    if (is_root(t)) print_banner(t);
    *out = t;
    return STATUS_OK;
}

// ---- the loop ----------------------------------------------------------------

// Splits loader sequences (B, T + 1) into inputs (B, T) and next-token
// targets. Errors: this rank's read failure (alone).
static enum status next_microbatch(struct trainer *t, struct loader *ld, int32_t *tokens,
                                   int32_t *targets, struct trainer_error *err) {
    int32_t *seqs = t->data.seqs;
    uint8_t *mask = t->cfg.train.loss_on == LOSS_ON_RESPONSE ? t->data.mask : NULL;
    if (loader_next_masked(ld, seqs, mask, &err->err)) return trainer_alone(err);
    int B = t->cfg.train.micro_batch_size, T = t->cfg.train.seq_len;
    for (int b = 0; b < B; b++) {
        memcpy(tokens + b * T, seqs + b * (T + 1), sizeof(int32_t) * T);
        memcpy(targets + b * T, seqs + b * (T + 1) + 1, sizeof(int32_t) * T);
    }
    if (mask) train_mask_targets(targets, mask, B, T); // loss_on = response
    return STATUS_OK;
}

// Reads this step's accum microbatches from ld on the stages that read data.
static enum status next_batch(struct trainer *t, struct loader *ld, struct trainer_error *err) {
    struct trainer_data *d = &t->data;
    if (!d->reads_tokens && !d->reads_targets) return STATUS_OK;
    int BT = t->cfg.train.micro_batch_size * t->cfg.train.seq_len;
    for (int k = 0; k < d->accum; k++) {
        enum status st = next_microbatch(t, ld, d->tokens + k * BT, d->targets + k * BT, err);
        if (st) return st;
    }
    return STATUS_OK;
}

// The stop flag as every rank of the world sees it: the largest (a signal
// number; 0 none). Collective over the world: every rank polls at the same
// point of an evaluation or a sample, so that all stop at the same batch or
// token (docs/design.md §8).
struct stop_poll {
    struct trainer *t;
    const volatile sig_atomic_t *flag;
    int signal; // the agreed flag once a poll found one; 0 until then
};

static bool poll_stop(void *ctx) {
    struct stop_poll *p = ctx;
    int flag = *p->flag;
    comm_all_reduce(&p->t->par.topo.world, &flag, 1, DTYPE_I32, COMM_MAX);
    if (flag) p->signal = flag;
    return flag != 0;
}

// poll_stop after a sleep of ms milliseconds (the sample test hook below).
struct slow_poll {
    struct stop_poll *poll;
    int ms;
};

static bool poll_stop_slow(void *ctx) {
    struct slow_poll *sp = ctx;
    sleep_s(sp->ms / 1000.0);
    return poll_stop(sp->poll);
}

// *loss: the mean loss over eval_steps validation global batches, summed over
// DP. Before each batch the stop flag is polled (poll_stop): a stop ends the
// evaluation there, within one batch, with poll->signal set and *loss unset.
static enum status evaluate(struct trainer *t, double *loss, struct stop_poll *poll,
                            struct trainer_error *err) {
    struct trainer_data *d = &t->data;
    double sum = 0;
    int64_t count = 0;
    loader_reset(&d->val_loader);
    for (int s = 0; s < t->cfg.train.eval_steps; s++) {
        if (poll_stop(poll)) return STATUS_OK;
        enum status st = next_batch(t, &d->val_loader, err);
        if (st) return st;
        double ls;
        int64_t n;
        if (train_step_eval(&t->par.ctx, d->reads_tokens ? d->tokens : NULL,
                            d->reads_targets ? d->targets : NULL, d->accum,
                            t->cfg.train.micro_batch_size, t->cfg.train.seq_len, &ls, &n, &err->err))
            return trainer_alone(err);
        sum += ls, count += n;
        watchdog_kick(t->watchdog);
    }
    *loss = count ? sum / count : 0.0;
    return STATUS_OK;
}

static void format_eta(double s, char *buf, size_t n) {
    long x = (long)(s + 0.5);
    if (x >= 3600) snprintf(buf, n, "%ldh%02ldm", x / 3600, x / 60 % 60);
    else if (x >= 60) snprintf(buf, n, "%ldm%02lds", x / 60, x % 60);
    else snprintf(buf, n, "%lds", x);
}

// Seconds this rank has spent blocked in tensor/data-parallel (and tied
// embedding) collectives, and in pipeline messages.
// Under CUDA the device groups' (NCCL) time counts too: the host blocks in
// them only where a caller waits (comm_nccl.h).
static void comm_busy(struct trainer *t, double *collective, double *pipeline) {
    struct topology *topo = &t->par.topo;
    *collective = *pipeline = 0;
    for (int k = 0; k < GROUP_COUNT; k++) {
        double busy = topo->host[k].busy_s + (topo->has_device_groups ? topo->device[k].busy_s : 0);
        *(k == GROUP_PP ? pipeline : collective) += busy;
    }
}

// split: this rank's (compute, communication, pipeline wait) seconds of the
// step, the DP gradient buckets it started before the flush
// (grad_sync_started_early: the overlap with the backward), and the seconds
// its pipeline stage sat idle inside the schedule (pipeline_exec.idle_s:
// waiting for its input messages and send buffers; 0 without a pipeline). Gathered from
// every rank (a collective: every rank calls log_step at the same steps);
// rank 0 prints its own and the largest pipeline wait, and writes every
// rank's to metrics.jsonl (the buckets only when there is a DP gradient sync).
// The step record's mixture-of-experts fields from moe (model_moe_stats_take,
// summed over ranks): moe_aux_loss and moe_z_loss, the means over the
// microbatches since the previous record of transformers' load-balancing
// loss and of the z-losses summed over MoE blocks (unscaled by their
// coefficients; `loss` stays the LM loss); moe_dropped, the assignments the
// capacity dropped; and per MoE block (moe_layers: their layer indices) the
// tokens routed to its experts, min, max and coefficient of variation
// (population std / mean) over the experts.
static void log_moe(struct trainer *t, const double *moe) {
    const int *layers;
    int L = model_moe_layers(t->m.model, &layers), E = t->cfg.model.moe_experts;
    double micro = moe[0] > 0 ? moe[0] : 1;
    fprintf(t->log.metrics, ", \"moe_aux_loss\": %.6f, \"moe_z_loss\": %.6f, \"moe_dropped\": %.0f",
            moe[1] / micro, moe[2] / micro, moe[3]);
    const char *names[4] = {"moe_layers", "moe_load_min", "moe_load_max", "moe_load_cv"};
    for (int k = 0; k < 4; k++) {
        fprintf(t->log.metrics, ", \"%s\": [", names[k]);
        for (int j = 0; j < L; j++) {
            const double *n = moe + 4 + (size_t)j * E;
            double lo = n[0], hi = n[0], sum = 0, sq = 0;
            for (int e = 0; e < E; e++) lo = MIN(lo, n[e]), hi = MAX(hi, n[e]), sum += n[e];
            double mean = sum / E;
            for (int e = 0; e < E; e++) sq += (n[e] - mean) * (n[e] - mean);
            double cv = mean > 0 ? sqrt(sq / E) / mean : 0;
            if (k == 0) fprintf(t->log.metrics, "%s%d", j ? ", " : "", layers[j]);
            else fprintf(t->log.metrics, k == 3 ? "%s%.4f" : "%s%.0f", j ? ", " : "", k == 1 ? lo : k == 2 ? hi : cv);
        }
        fprintf(t->log.metrics, "]");
    }
}

static void log_step(struct trainer *t, int step, const struct train_step_result *r, double dt,
                     double data_wait, double elapsed, const double split[SPLIT_N]) {
    int W = t->par.topo.world_size;
    double *all = t->log.split_all;
    comm_all_gather(&t->par.topo.world, split, all, SPLIT_N, DTYPE_FP64);
    // The attention paths of every rank's calls since the previous record
    // (evaluations included): cudnn, native, mixed (both), none, cpu.
    unsigned mine = backend_attention_take_path(t->m.be);
    int32_t path[3] = {!!(mine & BACKEND_ATTENTION_PATH_CUDNN), !!(mine & BACKEND_ATTENTION_PATH_NATIVE),
                       !!(mine & BACKEND_ATTENTION_PATH_CPU)};
    comm_all_reduce(&t->par.topo.world, path, 3, DTYPE_I32, COMM_MAX);
    // The values the step's FP8 casts saturated, over every rank (each
    // distinct tensor counted once: model_fp8_step_end).
    bool fp8 = model_fp8_on(t->m.model);
    int64_t saturated = r->fp8_saturated;
    if (fp8) comm_all_reduce(&t->par.topo.world, &saturated, 1, DTYPE_I64, COMM_SUM);
    // Mixture of experts: what every rank's backward passes routed since the
    // previous record (model_moe_stats_take), summed over the ranks: each
    // rank counts its own MoE blocks' rows (pp), TP rank 0 alone (tp), and
    // the last stage the load-balancing loss and the microbatches, so the
    // sum is one rank's over the data-parallel ranks' microbatches.
    size_t n_moe = model_moe_stats_numel(t->m.model);
    double *moe = n_moe ? xcalloc(n_moe, sizeof *moe) : NULL;
    if (n_moe) {
        model_moe_stats_take(t->m.model, moe);
        comm_all_reduce(&t->par.topo.world, moe, n_moe, DTYPE_FP64, COMM_SUM);
    }
    if (!is_root(t)) {
        free(moe);
        return;
    }
    const char *attention = path[2] ? "cpu" : path[0] && path[1] ? "mixed" : path[0] ? "cudnn" : path[1] ? "native"
                                                                                                     : "none";
    double worst_wait = 0;
    for (int i = 0; i < W; i++) worst_wait = MAX(worst_wait, all[SPLIT_N * i + 2]);
    const struct config *c = &t->cfg;
    double tokens = (double)c->train.global_batch_size * c->train.seq_len;
    double tps = tokens / dt, mfu = t->log.flops_per_token * tps / t->log.peak_flops;
    double eta = elapsed / (step + 1 - t->ckpt.start_step) * (c->train.steps - step - 1);
    char eta_s[32];
    format_eta(eta, eta_s, sizeof eta_s);
    // The printed line and the JSON line use the same formats, so they agree.
    // loss and grad norm carry 6 decimals so that runs can be compared to 1e-5.
    const struct trainer_progress *pg = &t->progress;
    char skipped[200] = "";
    if (r->overflow)
        snprintf(skipped, sizeof skipped, " | skipped: fp16 overflow (inf/NaN in gradients), no "
                 "update, loss scale %g -> %g (%d in all)", r->loss_scale, t->scaler.scale,
                 pg->skipped_steps);
    else if (r->skipped)
        snprintf(skipped, sizeof skipped, " | skipped: non-finite %s, no update (%d in a row, "
                 "%d in all)", isfinite(r->loss) ? "grad norm" : "loss", pg->consecutive_skips,
                 pg->skipped_steps);
    else if (r->n_targets == 0)
        snprintf(skipped, sizeof skipped, " | no target in the loss (loss_on = response and no response "
                 "token in the global batch): zero gradient, weight decay only");
    char scale[80] = "";
    if (t->par.ctx.scaler) snprintf(scale, sizeof scale, " | loss scale %g", r->loss_scale);
    else if (fp8) snprintf(scale, sizeof scale, " | fp8 saturated %lld", (long long)saturated);
    printf("step %5d/%d | loss %.6f | lr %.3e | grad norm %.6f%s%s | %.0f tok/s | MFU %.2f%% | "
           "mem %.1f MiB | %.1f ms/step | ETA %s | rank 0: data wait %.1f ms, compute %.1f ms, comm %.1f ms, "
           "pipeline wait %.1f ms (max over ranks %.1f ms)\n", step + 1, c->train.steps, r->loss,
           r->lr, r->grad_norm, scale, skipped, tps, 100 * mfu, t->m.mem_bytes / 1048576.0, dt * 1e3,
           eta_s, data_wait * 1e3, split[0] * 1e3, split[1] * 1e3, split[2] * 1e3, worst_wait * 1e3);
    // JSON has no NaN or infinity: a non-finite loss or norm is null.
    char loss[32] = "null", norm[32] = "null";
    if (isfinite(r->loss)) snprintf(loss, sizeof loss, "%.6f", r->loss);
    if (isfinite(r->grad_norm)) snprintf(norm, sizeof norm, "%.6f", r->grad_norm);
    fprintf(t->log.metrics, "{\"step\": %d, \"loss\": %s, \"loss_tokens\": %ld, \"lr\": %.3e, \"grad_norm\": %s, "
            "\"skipped\": %d, \"skipped_steps\": %d, \"tokens_per_s\": %.0f, \"mfu\": %.4f, "
            "\"mem_bytes\": %zu, \"step_time_s\": %.4f, \"eta_s\": %.0f, \"data_wait_ms\": %.3f", step + 1,
            loss, r->n_targets, r->lr, norm, r->skipped ? 1 : 0, pg->skipped_steps, tps, mfu, t->m.mem_bytes, dt,
            eta, data_wait * 1e3);
    // The fp16 loss scale this step's backward used (a number or a power of 2: %.17g is exact).
    if (t->par.ctx.scaler) fprintf(t->log.metrics, ", \"loss_scale\": %.17g", r->loss_scale);
    if (fp8) fprintf(t->log.metrics, ", \"fp8_saturated\": %lld", (long long)saturated);
    double moe_tb[3] = {NAN, NAN, NAN}; // aux, z, dropped for TensorBoard and Prometheus
    if (n_moe) {
        log_moe(t, moe);
        double micro = moe[0] > 0 ? moe[0] : 1;
        moe_tb[0] = moe[1] / micro, moe_tb[1] = moe[2] / micro, moe_tb[2] = moe[3];
    }
    free(moe);
    fprintf(t->log.metrics, ", \"attention\": \"%s\"", attention);
    const char *keys[SPLIT_N] = {"compute_s", "comm_s", "pipeline_wait_s", "dp_buckets_early", "pp_idle_s"};
    for (int k = 0; k < SPLIT_N; k++) {
        if ((k == 3 && !t->par.sync) || (k == 4 && t->m.whole_model)) continue;
        fprintf(t->log.metrics, ", \"%s\": [", keys[k]);
        for (int i = 0; i < W; i++)
            fprintf(t->log.metrics, k == 3 ? "%s%.0f" : "%s%.4f", i ? ", " : "", all[SPLIT_N * i + k]);
        fprintf(t->log.metrics, "]");
    }
    if (t->par.fsdp) { // ZeRO-2/3, rank 0's step (fsdp.h): prefetch and overlap
        struct fsdp_stats z;
        fsdp_stats(t->par.fsdp, &z);
        fprintf(t->log.metrics, ", \"zero_gathers\": %d, \"zero_prefetched\": %d, \"zero_rs\": %d, "
                "\"zero_rs_early\": %d, \"zero_live_max\": %d", z.gathers, z.prefetched, z.rs, z.rs_early,
                z.live_max);
    }
    fprintf(t->log.metrics, "}\n");
    fflush(stdout), fflush(t->log.metrics);
    metrics_sink_step(t->log.sink, &(struct metrics_step){
        .step = step + 1, .loss = r->loss, .lr = r->lr, .grad_norm = r->grad_norm,
        .tokens_per_s = tps, .mfu = mfu, .mem_bytes = (double)t->m.mem_bytes, .step_time_s = dt,
        .data_wait_s = data_wait, .skipped = r->skipped ? 1 : 0, .skipped_steps = pg->skipped_steps,
        .loss_scale = t->par.ctx.scaler ? r->loss_scale : NAN, .fp8_saturated = fp8 ? (double)saturated : NAN,
        .moe_aux_loss = moe_tb[0], .moe_z_loss = moe_tb[1], .moe_dropped = moe_tb[2]});
}

// The closing record of metrics.jsonl (rank 0), the summary tools read: how
// the run ended ("completed", "signal", "exit_interval", "exit_duration"), optimizer steps done
// (resumed ones included) and run here, tokens, wall seconds and their split
// (training steps, evaluation, samples, saves: t->log), the mean training
// tokens/s (tokens / the training steps' seconds), the signal and
// whether a checkpoint of steps_done was saved, activation slots and their
// high-water mark, steps skipped (non-finite), the best validation loss when
// there was one, and every rank's peak resident set in bytes (VmHWM, by world
// rank: what `trident plan` bounds, docs/design.md §5).
static void log_closing(struct trainer *t, const struct trainer_outcome *out, const char *ended,
                        double tokens, double seconds, double best_val) {
    // Every rank's peak resident set so far (VmHWM), gathered: every rank
    // closes at the same point, so this collective matches.
    int W = t->par.topo.world_size;
    int64_t mine = (int64_t)peak_rss_bytes(), *rss = xcalloc((size_t)W, sizeof *rss);
    comm_all_gather(&t->par.topo.world, &mine, rss, 1, DTYPE_I64);
    if (!is_root(t) || !t->log.metrics) {
        free(rss);
        return;
    }
    fprintf(t->log.metrics,
            "{\"done\": true, \"ended\": \"%s\", \"steps_done\": %d, \"steps\": %d, "
            "\"tokens\": %.0f, \"seconds\": %.3f, \"train_seconds\": %.4f, \"eval_seconds\": %.4f, "
            "\"sample_seconds\": %.4f, \"save_seconds\": %.4f, \"tokens_per_s\": %.0f, \"signal\": %d, "
            "\"saved\": %s, \"activation_slots\": %d, \"activation_slots_used\": %d, \"microbatches\": %d, "
            "\"skipped_steps\": %d",
            ended, out->steps_done, out->steps_done - t->ckpt.start_step, tokens, seconds, t->log.train_s,
            t->log.eval_s, t->log.sample_s, t->log.save_s, t->log.train_s > 0 ? tokens / t->log.train_s : 0,
            out->signal, out->saved ? "true" : "false", t->m.n_slots, model_slots_used(t->m.model),
            t->data.accum, t->progress.skipped_steps);
    if (isfinite(best_val)) fprintf(t->log.metrics, ", \"best_val_loss\": %.4f", best_val);
    if (out->signal && out->stopped_in) fprintf(t->log.metrics, ", \"stopped_in\": \"%s\"", out->stopped_in);
    fprintf(t->log.metrics, ", \"peak_rss_bytes\": [");
    for (int i = 0; i < W; i++) fprintf(t->log.metrics, "%s%lld", i ? ", " : "", (long long)rss[i]);
    fprintf(t->log.metrics, "]}\n");
    fflush(t->log.metrics);
    free(rss);
}

// Counts a step: applied (the LR schedule moves on) or skipped.
// An fp16 overflow that the loss scale absorbed (r->overflow) is not one
// of the skips in a row that max_skipped_steps limits: it is how the scale
// finds its level (Megatron-LM: only an overflow at the minimum scale is an
// error).
static void count_step(struct trainer_progress *p, const struct train_step_result *r) {
    if (r->skipped) {
        p->skipped_steps++;
        if (!r->overflow) p->consecutive_skips++;
    } else {
        p->lr_step++, p->consecutive_skips = 0;
    }
}

// The error that ends a run after [train] max_skipped_steps skipped steps in
// a row (every rank returns it), naming the last checkpoint. step counts from 0.
static enum status too_many_skips(struct trainer *t, int step, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    int n = t->progress.consecutive_skips;
    char last[sizeof t->ckpt.last + 64];
    if (t->ckpt.last[0]) snprintf(last, sizeof last, "the last good checkpoint is %s", t->ckpt.last);
    else snprintf(last, sizeof last, "no checkpoint was %s", c->checkpoint.dir[0] ? "saved yet"
                  : "saved ([checkpoint] dir is unset)");
    return error_set(&err->err, STATUS_RUNTIME, "step %d: %d steps in a row (%d-%d) had a NaN or "
                     "infinite loss or gradient norm and were skipped ([train] max_skipped_steps "
                     "= %d); stopping; %s. A lower [train] lr, a longer warmup or [train] "
                     "grad_clip may help", step + 1, n, step + 2 - n, step + 1,
                     c->train.max_skipped_steps, last);
}

// Rank 0: the validation loss after `step` steps on stdout (with note), in
// metrics.jsonl ({"step", "val_loss"}; JSON has no NaN or infinity: a
// non-finite loss is null, as a step record's loss is) and the dashboards.
static void log_validation(struct trainer *t, int step, double val, const char *note) {
    if (!is_root(t)) return;
    char v[32] = "null";
    if (isfinite(val)) snprintf(v, sizeof v, "%.4f", val);
    printf("step %5d/%d | validation loss %.4f%s\n", step, t->cfg.train.steps, val, note);
    fprintf(t->log.metrics, "{\"step\": %d, \"val_loss\": %s}\n", step, v);
    metrics_sink_eval(t->log.sink, step, val);
    fflush(stdout), fflush(t->log.metrics);
}

// A checkpoint of steps_done steps: in the background when may_async and
// [checkpoint] async (trainer_save_async), else at once (trainer_save, after
// the save in flight commits). Both time themselves for the done line.
static enum status save_step(struct trainer *t, int steps_done, bool may_async, struct trainer_error *err) {
    enum status st = may_async && t->cfg.checkpoint.async ? trainer_save_async(t, steps_done, err)
                                                          : trainer_save(t, steps_done, err);
    if (st) return st;
    metrics_sink_saved(t->log.sink);
    return STATUS_OK;
}

// The text sample after `step` steps, polling the stop flag before every
// token (poll->signal set when one stopped it). Every TP group samples (the
// same tokens: the replicas are equal), so that no rank waits for DP rank
// 0's sample in the next collective and each rank's watchdog sees progress
// (a kick per token); world rank 0 prints.
static void sample_step(struct trainer *t, int step, struct stop_poll *poll) {
    const struct config *c = &t->cfg;
    FILE *f = is_root(t) ? stdout : NULL;
    char phase[128];
    snprintf(phase, sizeof phase, "sampling %d tokens after step %d", c->train.sample_tokens, step);
    watchdog_phase(t->watchdog, phase, 1, t->par.topo.world_size > 1); // the stop poll is collective
    char *text = NULL;
    size_t len = 0;
    FILE *mem = f ? open_memstream(&text, &len) : NULL;
    CHECK(!f || mem, "open_memstream failed");
    double s0 = time_now_s();
    struct sample_stop stop = {poll_stop, poll};
    // Test hook: TRIDENT_TEST_SAMPLE_TOKEN_MS sleeps that long before each
    // token's stop poll (train_watchdog.sh and train_stop_phases.sh need
    // samples that last seconds; with the key/value cache a small model's
    // tokens take microseconds and an end-of-text ends a sample early).
    struct slow_poll slow = {poll, 0};
    const char *slow_ms = getenv("TRIDENT_TEST_SAMPLE_TOKEN_MS");
    if (slow_ms && atoi(slow_ms) > 0) slow.ms = atoi(slow_ms), stop = (struct sample_stop){poll_stop_slow, &slow};
    int n = sample_print(t->m.model, t->data.tok, c->train.sample_tokens, c->train.sample_temperature,
                         c->train.sample_top_k, c->train.sample_top_p, (uint64_t)c->train.seed + step - 1, mem,
                         t->watchdog, &stop);
    double secs = time_now_s() - s0;
    t->log.sample_s += secs;
    if (f) {
        fclose(mem);
        printf("step %5d/%d | sample (%d tokens, %.1f s%s): %s\n", step, c->train.steps, n,
               secs, poll->signal ? ", stopped by a signal" : "", text);
        fflush(stdout);
        if (t->log.metrics) { // {"event": "sample", "step", "tokens", "seconds", "text"}
            json_t *r = json_pack("{s:s, s:i, s:i, s:f, s:s}", "event", "sample", "step", step,
                                  "tokens", n, "seconds", secs, "text", text ? text : "");
            char *line = r ? json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
            if (line) fprintf(t->log.metrics, "%s\n", line), fflush(t->log.metrics);
            free(line);
            json_decref(r);
        }
        free(text);
    }
}

// The loop's rules (step_plan.h) from the config and what the run has.
static struct plan_config plan_config_of(const struct trainer *t) {
    const struct config *c = &t->cfg;
    return (struct plan_config){
        .steps = c->train.steps, .log_every = c->log.every, .eval_every = c->train.eval_every,
        .sample_every = c->train.sample_every, .checkpoint_every = c->checkpoint.every,
        .exit_interval = c->train.exit_interval, .max_skipped_steps = c->train.max_skipped_steps,
        .saves = c->checkpoint.dir[0] != '\0', .has_val = t->data.has_val, .has_sampler = t->data.tok != NULL};
}

enum status trainer_run(struct trainer *t, const volatile sig_atomic_t *stop_flag,
                        struct trainer_outcome *out, struct trainer_error *err) {
    const struct config *c = &t->cfg;
    struct trainer_data *d = &t->data;
    int B = c->train.micro_batch_size, T = c->train.seq_len, start_step = t->ckpt.start_step;
    double start = time_now_s(), best_val = INFINITY, tokens_seen = 0;
    const struct plan_config pc = plan_config_of(t);
    struct stop_poll poll = {.t = t, .flag = stop_flag};
    err->alone = false;
    *out = (struct trainer_outcome){.steps_done = start_step};
    if (start_step >= c->train.steps && is_root(t))
        printf("nothing to train: the checkpoint is at step %d, train.steps = %d\n", start_step,
               c->train.steps);
    // A fresh run from other weights (model.init_from) measures them first:
    // the baseline a fine-tuning's validation loss falls from, logged as step 0.
    if (start_step == 0 && c->model.init_from[0] && d->has_val && c->train.eval_every > 0 &&
        c->train.steps > 0) {
        double val = 0;
        watchdog_phase(t->watchdog, "evaluation of the init_from weights", WATCHDOG_FIRST_STEP, 1);
        double e0 = time_now_s();
        enum status st = evaluate(t, &val, &poll, err);
        if (st) return st;
        t->log.eval_s += time_now_s() - e0;
        if (poll.signal) { // no step done: nothing to save
            out->signal = poll.signal, out->stopped_in = "start";
            log_closing(t, out, "signal", tokens_seen, time_now_s() - start, best_val);
            return STATUS_OK;
        }
        log_validation(t, 0, val, " (the init_from weights, before training)");
    }
    for (int step = start_step; step < c->train.steps; step++) {
        double t0 = time_now_s(), coll0, pipe0, coll1, pipe1;
        comm_busy(t, &coll0, &pipe0);
        char phase[128];
        snprintf(phase, sizeof phase, "step %d: reading its batch", step + 1);
        watchdog_phase(t->watchdog, phase, 1, 0);
        enum status st = next_batch(t, &d->train_loader, err);
        if (st) return st;
        double data_wait = time_now_s() - t0;
        struct train_step_result r;
        // The first step of a start also allocates workspaces and sets up
        // communicators lazily (NCCL): it may take WATCHDOG_FIRST_STEP x watchdog_s.
        snprintf(phase, sizeof phase, "step %d: forward, backward, gradient sync, optimizer%s", step + 1,
                 step == start_step ? " (the first of this start)" : "");
        watchdog_phase(t->watchdog, phase, step == start_step ? WATCHDOG_FIRST_STEP : 1, 1);
        t->par.ctx.fault_grad_inf = step + 1 == t->fault_grad_inf_step;
        if (train_step_run(&t->par.ctx, t->progress.lr_step, d->reads_tokens ? d->tokens : NULL,
                           d->reads_targets ? d->targets : NULL, d->accum, B, T, &r, &err->err))
            return trainer_alone(err);
        count_step(&t->progress, &r);
        double dt = time_now_s() - t0;
        snprintf(phase, sizeof phase, "step %d: logging and agreeing on stops (collectives)", step + 1);
        watchdog_phase(t->watchdog, phase, 1, 1);
        comm_busy(t, &coll1, &pipe1);
        double split[SPLIT_N] = {dt - (coll1 - coll0) - (pipe1 - pipe0), coll1 - coll0, pipe1 - pipe0,
                                 t->par.sync ? grad_sync_started_early(t->par.sync) : 0,
                                 t->m.whole_model ? 0 : t->par.pipe.idle_s};
        tokens_seen += (double)c->train.global_batch_size * T;
        // Any rank's signal stops every rank after this step, with a save;
        // so does the wall-clock budget as any rank judges it: the time
        // since trainer_open plus this run's mean step time would pass it.
        double now = time_now_s(), budget_s = c->train.exit_duration_mins * 60.0;
        double mean_step = (now - start) / (step + 1 - start_step);
        // With a save in flight ([checkpoint] async) the same all-reduce says
        // whether any rank's writer is still writing, or failed.
        int writer = trainer_save_writer_state(t);
        int flags[4] = {*stop_flag, budget_s > 0 && now - t->log.open_s + mean_step > budget_s,
                        writer == 0, writer == 2};
        comm_all_reduce(&t->par.topo.world, flags, 4, DTYPE_I32, COMM_MAX);
        // Every rank's background work done (or one failed: reported now,
        // within a step, on every rank): the next phase (the writes agreed
        // and rank 0's commit started; then the commit agreed), at this step
        // on every rank.
        if (trainer_save_in_flight(t) && (!flags[2] || flags[3]) && (st = trainer_save_advance(t, err)))
            return st;
        // What to do after this step: the plan (step_plan.h), performed in its order.
        struct plan_state ps = {.step = step, .start_step = start_step, .skipped = r.skipped,
                                .consecutive_skips = t->progress.consecutive_skips, .signal = flags[0],
                                .over_budget = flags[1] != 0};
        struct step_plan plan = step_plan(&pc, &ps);
        if (plan.log) log_step(t, step, &r, dt, data_wait, time_now_s() - start, split);
        // Every rank has the same verdict (train_step_should_skip), so every
        // rank stops here together.
        if (plan.stop == PLAN_TOO_MANY_SKIPS) return too_many_skips(t, step, err);
        t->log.train_s += time_now_s() - t0;
        // A stop's or the end's save is synchronous (after the save in flight
        // commits): the process exits next. A periodic one (the plan goes on)
        // may go to the background ([checkpoint] async).
        if (plan.save && (st = save_step(t, step + 1, plan.stop == PLAN_CONTINUE, err))) return st;
        *out = (struct trainer_outcome){.steps_done = step + 1, .saved = pc.saves};
        switch (plan.stop) {
        case PLAN_EXIT_INTERVAL:
            if (is_root(t)) printf("exit_interval %d: stopping after step %d\n", c->train.exit_interval, step + 1);
            log_closing(t, out, plan.ended, tokens_seen, time_now_s() - start, best_val);
            return STATUS_OK;
        case PLAN_EXIT_DURATION:
            out->out_of_time = true;
            if (is_root(t))
                printf("exit_duration_mins %g: stopping after step %d: %.1f s since start, the next "
                       "step (%.1f ms each so far) would end past the budget of %.0f s\n",
                       c->train.exit_duration_mins, step + 1, now - t->log.open_s, mean_step * 1e3, budget_s);
            log_closing(t, out, plan.ended, tokens_seen, time_now_s() - start, best_val);
            return STATUS_OK;
        case PLAN_SIGNAL:
            out->signal = flags[0], out->stopped_in = "step";
            log_closing(t, out, plan.ended, tokens_seen, time_now_s() - start, best_val);
            return STATUS_OK;
        default:
            break;
        }
        if (plan.evaluate) {
            double val = 0;
            snprintf(phase, sizeof phase, "evaluation after step %d", step + 1);
            watchdog_phase(t->watchdog, phase, 1, 1);
            double e0 = time_now_s();
            if ((st = evaluate(t, &val, &poll, err))) return st;
            t->log.eval_s += time_now_s() - e0;
            if (!poll.signal) {
                if (isfinite(val)) best_val = MIN(best_val, val);
                log_validation(t, step + 1, val, "");
            }
        }
        const char *where = "evaluation";
        if (plan.sample && !poll.signal) where = "sample", sample_step(t, step + 1, &poll);
        if (poll.signal) {
            // A stop during the evaluation or the sample: a checkpoint of
            // this step (unless the plan saved it already), exit 3.
            ps.signal = poll.signal, ps.interrupted = true, ps.saved = plan.save;
            struct step_plan stop = step_plan(&pc, &ps);
            if (is_root(t))
                printf("signal %d during the %s after step %d: stopping%s\n", poll.signal, where, step + 1,
                       stop.save ? ", saving this step" : "");
            // This step's own save, or the commit of the one in flight (a
            // periodic background save of this step or an earlier one).
            st = stop.save ? save_step(t, step + 1, false, err) : trainer_save_complete(t, err);
            if (st) return st;
            out->signal = poll.signal, out->stopped_in = where;
            log_closing(t, out, stop.ended, tokens_seen, time_now_s() - start, best_val);
            return STATUS_OK;
        }
    }
    double total = time_now_s() - start;
    if (is_root(t)) {
        // Throughput over the training steps alone: evaluation and samples
        // (no KV cache) would otherwise dilute it, and differ between runs.
        const struct trainer_log *lg = &t->log;
        printf("done: %d steps, %.0f tokens, %.1f s wall (train %.1f s, eval %.1f s, samples %.1f s, "
               "saves %.1f s), mean %.0f tokens/s training", out->steps_done - start_step,
               tokens_seen, total, lg->train_s, lg->eval_s, lg->sample_s, lg->save_s,
               lg->train_s > 0 ? tokens_seen / lg->train_s : 0);
        if (isfinite(best_val)) printf(", best validation loss %.4f", best_val);
        if (t->progress.skipped_steps)
            printf(", %d steps skipped (non-finite loss or grad norm)", t->progress.skipped_steps);
        printf("\nactivation slots on rank 0: %d used of %d (%d microbatches per step)\n",
               model_slots_used(t->m.model), t->m.n_slots, d->accum);
        if (d->ds->cache) {
            int64_t staged, evicted, failed;
            cache_counts(d->ds->cache, &staged, &evicted, &failed);
            printf("hot tier (rank 0's stager): %lld shards staged, %lld evicted, %lld failed\n",
                   (long long)staged, (long long)evicted, (long long)failed);
        }
    }
    log_closing(t, out, "completed", tokens_seen, total, best_val);
    return STATUS_OK;
}

void trainer_close(struct trainer *t) {
    if (!t) return;
    trainer_save_abandon(t); // a save in flight on an error path: its writer joined, no commit
    watchdog_stop(t->watchdog);
    if (t->log.metrics) fclose(t->log.metrics);
    metrics_sink_close(t->log.sink);
    tokenizer_free(t->data.tok);
    grad_sync_free(t->par.sync);
    fsdp_free(t->par.fsdp);
    pipeline_exec_free(&t->par.pipe);
    optimizer_free(t->m.opt);
    model_free(t->m.model);
    if (t->data.has_val) loader_free(&t->data.val_loader);
    loader_free(&t->data.train_loader);
    for (int k = 0; k < t->data.n_sets; k++) dataset_close(t->data.sets[k]);
    if (t->data.sample_log) fclose(t->data.sample_log);
    topology_free(&t->par.topo); // NCCL communicators before the streams they use
    backend_free(t->m.be);
    free(t->data.seqs), free(t->data.mask), free(t->data.tokens), free(t->data.targets), free(t->log.split_all);
    free(t->log.threads_all);
    free(t->ckpt.host_params), free(t->ckpt.host_master), free(t->ckpt.host_m), free(t->ckpt.host_v), free(t->ckpt.pieces);
    free(t->ckpt.host_fp8);
    free(t);
    tee_stdio_close(); // rank 0's train.log (setup_train_log)
}

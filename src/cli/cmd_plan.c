// cmd_plan.c: `trident plan CONFIG.ini [section.key=value ...]`: the bytes
// each rank of a layout allocates, from src/train/plan.h, without running it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "cli_flags.h"
#include "model/optimizer.h"
#include "parallel/comm_mpi.h"
#include "train/grad_sync.h"
#include "train/plan.h"
#include "train/plan_search.h"

static double mib(size_t b) { return b / 1048576.0; }

// The host memory a rank of the row holds in training (docs/design.md §5):
// on the CPU backend its arenas plus MPI's temporaries (and the save's
// buffers, none there); under CUDA the save's host buffers and MPI's.
static size_t resident(const struct config *c, const struct plan_rank_bytes *b,
                       const struct plan_host_bytes *h) {
    return (c->system.device == DEVICE_CPU ? plan_rank_total(b) : 0) + h->mpi + h->ckpt_save;
}

// --json: the grouped plan as one object (schema in docs/planning.md).
static void print_json(const struct config *c, const struct plan_group *rows,
                       const struct plan_host_bytes *host, int n_rows, size_t peak,
                       size_t peak_resident, double total, const char *recompute, json_t *schedule) {
    json_t *o = json_object(), *groups = json_array();
    json_object_set_new(o, "schema", json_string("trident.plan.v1"));
    json_object_set_new(o, "config", json_string(c->file));
    // The layout: every named size of the grid (tp, cp, dp, dp_shard, dp_replicate, pp).
    struct grid_layout grid = config_grid(c);
    const char *names[GROUP_COUNT];
    int sizes[GROUP_COUNT], n_sizes = topology_layout_sizes(&grid, false, names, sizes);
    for (int i = 0; i < n_sizes; i++) json_object_set_new(o, names[i], json_integer(sizes[i]));
    json_object_set_new(o, "virtual_stages", json_integer(MAX(1, c->parallel.virtual_stages)));
    json_object_set_new(o, "pp_schedule", json_string(pipeline_schedule_name(c->parallel.pp_schedule)));
    json_object_set_new(o, "zero_stage", json_integer(c->parallel.zero_stage));
    json_object_set_new(o, "ranks", json_integer(topology_world_size(&grid)));
    json_object_set_new(o, "microbatches", json_integer(plan_microbatches(c)));
    json_object_set_new(o, "micro_batch_size", json_integer(c->train.micro_batch_size));
    json_object_set_new(o, "seq_len", json_integer(c->train.seq_len));
    json_object_set_new(o, "dtype", json_string(dtype_name(c->precision.dtype)));
    json_object_set_new(o, "recompute", json_string(recompute));
    json_object_set_new(o, "peak_bytes", json_integer((json_int_t)peak));
    json_object_set_new(o, "total_bytes", json_real(total));
    json_object_set_new(o, "peak_resident_bytes", json_integer((json_int_t)peak_resident));
    for (int i = 0; i < n_rows; i++) {
        const struct plan_rank_bytes *b = &rows[i].bytes;
        json_t *g = json_object();
        json_object_set_new(g, "stage_begin", json_integer(rows[i].stage_begin));
        json_object_set_new(g, "stage_end", json_integer(rows[i].stage_end));
        json_object_set_new(g, "role", json_string(rows[i].role));
        json_object_set_new(g, "ranks", json_integer(rows[i].n_ranks));
        json_object_set_new(g, "params_bytes", json_integer((json_int_t)b->params));
        json_object_set_new(g, "grads_bytes", json_integer((json_int_t)b->grads));
        json_object_set_new(g, "optimizer_bytes", json_integer((json_int_t)b->optimizer));
        json_object_set_new(g, "activation_bytes", json_integer((json_int_t)b->activations));
        json_object_set_new(g, "total_bytes", json_integer((json_int_t)plan_rank_total(b)));
        json_object_set_new(g, "slots", json_integer(b->n_slots));
        if (b->n_wstash) {
            json_object_set_new(g, "w_stashes", json_integer(b->n_wstash));
            json_object_set_new(g, "w_stash_bytes", json_integer((json_int_t)b->w_stash_bytes));
        }
        if (plan_cp(c) > 1) json_object_set_new(g, "cp_ring_bytes", json_integer((json_int_t)b->cp_bytes));
        if (b->kv_cache_bytes)
            json_object_set_new(g, "kv_cache_bytes", json_integer((json_int_t)b->kv_cache_bytes));
        if (c->model.moe_experts) { // mixture of experts: the rank's experts and their buffers
            json_object_set_new(g, "moe_blocks", json_integer(b->moe_blocks));
            json_object_set_new(g, "experts_local", json_integer(b->experts_local));
            json_object_set_new(g, "expert_params", json_integer((json_int_t)b->expert_params));
            json_object_set_new(g, "moe_activation_bytes", json_integer((json_int_t)b->moe_bytes));
        }
        if (c->precision.fp8 != FP8_NONE) { // plan_fp8_bytes's parts
            json_object_set_new(g, "fp8_weight_bytes", json_integer((json_int_t)b->fp8_weights));
            json_object_set_new(g, "fp8_saved_bytes", json_integer((json_int_t)b->fp8_saved));
            json_object_set_new(g, "fp8_work_bytes", json_integer((json_int_t)b->fp8_work));
        }
        if (b->zero_stage >= 2) { // ZeRO-2/3's parts (plan.h)
            json_object_set_new(g, "shard_ranks", json_integer(b->shard_ranks));
            json_object_set_new(g, "unit_elems", json_integer((json_int_t)b->unit_elems));
            json_object_set_new(g, "params_shard_bytes", json_integer((json_int_t)b->params_shard));
            json_object_set_new(g, "params_gathered_bytes", json_integer((json_int_t)b->params_gathered));
            json_object_set_new(g, "gathered_units", json_integer(b->n_gathered));
            json_object_set_new(g, "grads_shard_bytes", json_integer((json_int_t)b->grads_shard));
            json_object_set_new(g, "grads_unit_bytes", json_integer((json_int_t)b->grads_units));
            json_object_set_new(g, "grads_recv_bytes", json_integer((json_int_t)b->grads_recv));
            json_object_set_new(g, "grads_transfer_bytes", json_integer((json_int_t)b->grads_transfer));
        }
        json_object_set_new(g, "mpi_bytes", json_integer((json_int_t)host[i].mpi));
        json_object_set_new(g, "resident_bytes", json_integer((json_int_t)resident(c, b, &host[i])));
        json_object_set_new(g, "checkpoint_load_host_bytes", json_integer((json_int_t)host[i].ckpt_load));
        json_object_set_new(g, "checkpoint_save_host_bytes", json_integer((json_int_t)host[i].ckpt_save));
        json_array_append_new(groups, g);
    }
    json_object_set_new(o, "groups", groups);
    if (schedule) json_object_set(o, "schedule", schedule);
    json_dumpf(o, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    fputc('\n', stdout);
    json_decref(o);
}

// ZeRO-2/3: what each pool holds (plan.h's terms), one named line a pool.
static void print_zero_lines(const struct config *c, const struct plan_rank_bytes *b) {
    int z = b->zero_stage, S = b->shard_ranks;
    size_t P = dtype_size(c->precision.dtype), U = b->unit_elems;
    size_t G = dtype_size(c->precision.dtype == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32);
    const char *dt = dtype_name(c->precision.dtype);
    if (z == 3 && b->n_gathered)
        printf("       parameters (ZeRO-3 shard 1/%d): %.1f MiB; gathered units (%d x %.1f MiB, prefetch 1%s): "
               "%.1f MiB\n", S, mib(b->params_shard), b->n_gathered, mib(U * P),
               b->n_gathered > 2 ? ", + 1 beside the tied head" : "", mib(b->params_gathered));
    else if (z == 3)
        printf("       parameters (ZeRO-3 shard 1/%d): %.1f MiB; gathered units (the whole stage, "
               "reshard_after_forward = false): %.1f MiB\n", S, mib(b->params_shard), mib(b->params_gathered));
    else
        printf("       parameters (ZeRO-2: full %s copy): %.1f MiB\n", dt, mib(b->params));
    printf("       gradients (ZeRO-%d shard 1/%d, %s): %.1f MiB; unit gradient buffers (2 x %.1f MiB%s): %.1f MiB; "
           "their reduce-scatter results: %.1f MiB", z, S, c->precision.dtype == DTYPE_FP64 ? "fp64" : "fp32",
           mib(b->grads_shard), mib(U * G), b->grads_units > 2 * U * G ? " + the tied embedding's" : "",
           mib(b->grads_units), mib(b->grads_recv));
    if (b->grads_transfer) printf("; bf16 transfer copies of both: %.1f MiB", mib(b->grads_transfer));
    printf("\n       optimizer (shard 1/%d): AdamW m, v %.1f MiB", S, mib(b->opt_moments));
    if (b->opt_master) printf("; fp32 master weights %.1f MiB", mib(b->opt_master));
    printf("\n");
}

// Mixture of experts ([model] moe_experts > 0): the model's parameters, its
// routed experts' share, and the matmul parameters a token meets (the router,
// k routed experts, the shared expert: what model_flops_per_token, MFU's
// numerator, counts: 6 x those + the attention scores).
static void print_moe_params(const struct config *c) {
    if (!c->model.moe_experts) return;
    struct llama_config lc = plan_llama(c);
    struct param_info *tab = NULL;
    int n = 0;
    struct error err = {0};
    if (model_param_table(&lc, &tab, &n, &err)) return;
    double total = 0, experts = 0;
    for (int i = 0; i < n; i++) {
        total += (double)tab[i].numel;
        if (tab[i].expert) experts += (double)tab[i].numel;
    }
    free(tab);
    int T = c->train.seq_len;
    double HD = (double)lc.n_heads * llama_head_dim(&lc);
    double active = (model_flops_per_token(&lc, T) - 6.0 * lc.n_layers * HD * T) / 6;
    double u = total >= 1e9 ? 1e9 : 1e6; // billions, or millions for a small model
    const char *us = u == 1e9 ? "B" : "M";
    printf("moe: %d experts top-%d a block: %.2f%s parameters, %.2f%s of them routed experts; %.2f%s matmul "
           "parameters active a token (the FLOPs and MFU count these: 6 x active + attention)\n",
           lc.moe_experts, lc.moe_top_k, total / u, us, experts / u, us, active / u, us);
}

static const char *recompute_name(enum recompute r) {
    return r == RECOMPUTE_FULL ? "full" : r == RECOMPUTE_SELECTIVE ? "selective" : "none";
}

static json_t *layout_json(const struct plan_layout *l, bool fp8) {
    json_t *o = json_object();
    json_object_set_new(o, "tp", json_integer(l->tp));
    json_object_set_new(o, "cp", json_integer(MAX(1, l->cp)));
    json_object_set_new(o, "pp", json_integer(l->pp));
    json_object_set_new(o, "virtual_stages", json_integer(l->v));
    json_object_set_new(o, "pp_schedule", json_string(pipeline_schedule_name(l->schedule)));
    json_object_set_new(o, "dp", json_integer(l->dp));
    json_object_set_new(o, "ep", json_integer(MAX(1, l->ep)));
    json_object_set_new(o, "micro_batch_size", json_integer(l->mb));
    json_object_set_new(o, "recompute", json_string(recompute_name(l->recompute)));
    json_object_set_new(o, "zero_stage", json_integer(l->zero));
    json_object_set_new(o, "dp_shard", json_integer(l->zero >= 2 ? l->dp_shard : 0));
    json_object_set_new(o, "reshard_after_forward", json_boolean(l->zero == 3 && !l->keep_gathered));
    json_object_set_new(o, "peak_bytes", json_integer((json_int_t)l->peak_bytes));
    json_object_set_new(o, "step_s", json_real(l->step_s));
    json_object_set_new(o, "compute_s", json_real(l->compute_s));
    json_object_set_new(o, "recompute_s", json_real(l->recompute_s));
    json_object_set_new(o, "bubble_s", json_real(l->bubble_s));
    json_object_set_new(o, "bubble", json_real(l->bubble));
    json_object_set_new(o, "tp_comm_s", json_real(l->tp_comm_s));
    json_object_set_new(o, "cp_comm_s", json_real(l->cp_comm_s));
    json_object_set_new(o, "ep_comm_s", json_real(l->ep_comm_s));
    json_object_set_new(o, "pp_comm_s", json_real(l->pp_comm_s));
    json_object_set_new(o, "dp_exposed_s", json_real(l->dp_exposed_s));
    json_object_set_new(o, "tokens_per_s", json_real(l->tokens_per_s));
    json_object_set_new(o, "tflops_per_gpu", json_real(l->tflops_per_gpu));
    json_object_set_new(o, "mfu", json_real(l->mfu));
    json_object_set_new(o, "hw_tflops_per_gpu", json_real(l->hw_tflops_per_gpu));
    json_object_set_new(o, "tokens_per_s_per_gpu", json_real(l->tokens_per_s_per_gpu));
    json_object_set_new(o, "mfu_full", json_real(l->mfu_full));
    json_object_set_new(o, "global_batch_size", json_integer(l->global_batch));
    json_t *op = json_object(); // seconds of one op of the pipeline (plan_layout.op)
    json_object_set_new(op, "f", json_real(l->op.f));
    json_object_set_new(op, "b", json_real(l->op.b));
    json_object_set_new(op, "w", json_real(l->op.w));
    json_object_set_new(op, "comm", json_real(l->op.comm));
    json_object_set_new(o, "op_seconds", op);
    if (fp8) { // the same layout in bf16 (step 0: it does not fit)
        json_object_set_new(o, "bf16_step_s", json_real(l->bf16_step_s));
        json_object_set_new(o, "bf16_peak_bytes", json_integer((json_int_t)l->bf16_peak_bytes));
    }
    return o;
}

static void print_layout(const char *tag, const struct plan_layout *l, bool fp8) {
    char shard[16] = "-"; // ZeRO-2/3: the shard group's ranks; "g" after it: kept gathered
    if (l->zero >= 2) snprintf(shard, sizeof shard, "%d%s", l->dp_shard, l->keep_gathered ? "g" : "");
    printf("%-5s %3d %3d %3d %2d %-11s %5d %3d %3d %-9s %4d %5s %7.1f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f "
           "%8.3f %8.3f %7.1f %5.1f%% %7.1f %6.1f%% %9.0f",
           tag, l->tp, MAX(1, l->cp), l->pp, l->v, l->pp > 1 ? pipeline_schedule_name(l->schedule) : "-", l->dp,
           MAX(1, l->ep), l->mb, recompute_name(l->recompute), l->zero, shard,
           l->peak_bytes / 1073741824.0, l->step_s, l->compute_s, l->recompute_s, l->bubble_s,
           l->tp_comm_s, l->cp_comm_s, l->ep_comm_s, l->pp_comm_s, l->dp_exposed_s, l->tflops_per_gpu,
           100 * l->mfu, l->hw_tflops_per_gpu, 100 * l->mfu_full, l->tokens_per_s_per_gpu);
    if (fp8 && l->bf16_step_s > 0) printf(" %8.2fx", l->bf16_step_s / l->step_s);
    else if (fp8) printf(" %9s", "no fit");
    printf("\n");
}

// The layouts whose batch was moved to the nearest that divides, one line each.
static void print_batch_notes(const struct config *c, const char *tag, const struct plan_layout *l) {
    int B = c->train.global_batch_size;
    if (l->global_batch == B || !l->global_batch) return;
    printf("%s: global_batch_size %d does not divide by micro_batch_size %d x dp %d: planned with %d, the nearest "
           "(%d microbatches a replica; train.global_batch_size=%d runs it)\n", tag, B, l->mb, l->dp,
           l->global_batch, l->global_batch / (l->mb * l->dp), l->global_batch);
}

// The config's own layout as plan_predict takes it (dp, global_batch: the caller's).
static struct plan_layout config_layout(const struct config *c) {
    struct plan_layout l = {.tp = c->parallel.tp, .cp = plan_cp(c), .pp = c->parallel.pp,
                            .ep = MAX(1, c->parallel.ep),
                            .v = MAX(1, c->parallel.virtual_stages), .mb = c->train.micro_batch_size,
                            .zero = c->parallel.zero_stage, .recompute = c->model.recompute,
                            .schedule = c->parallel.pp_schedule};
    struct plan_sharding zs = plan_sharding_of(c);
    l.keep_gathered = !zs.reshard_after_forward, l.dp_shard = c->parallel.dp_shard; // 0: dp
    return l;
}

// --show-schedule: the config's pipeline schedule (c->parallel.dp resolved)
// as the simulator lays it out (pipeline_simulate, pipeline_print_timeline),
// its ops costing what the planner's time model charges them on cl's GPU
// (plan_layout.op: F, B, W of one microbatch through one chunk of the
// slowest stage, comm one message between stages), or 1 each with free
// messages (unit). *text: the lines to print (malloc'd); *obj: the same as
// JSON (costs, makespan and idle in seconds, or in op units). Errors:
// STATUS_BAD_INPUT with plan_predict's reason or the schedule's refusal.
static enum status schedule_show(const struct config *c, const struct plan_cluster *cl0, bool unit, char **text,
                                 json_t **obj, struct error *err) {
    struct plan_layout l = config_layout(c);
    l.dp = MAX(1, c->parallel.dp);
    int p = l.pp, v = l.v, m = plan_microbatches(c);
    enum pp_schedule kind = c->parallel.pp_schedule;
    struct pp_costs costs = {1, 1, 1, 0};
    if (!unit) {
        // The op costs do not depend on memory: a GPU without a memory limit.
        struct plan_cluster cl = *cl0;
        struct grid_layout grid = config_grid(c);
        cl.gpus = topology_world_size(&grid), cl.reserve_bytes = 0, cl.gpu.mem_bytes = SIZE_MAX / 2;
        char why[400];
        if (!plan_predict(c, &cl, &l, why, sizeof why))
            return error_set(err, STATUS_BAD_INPUT, "--show-schedule: %s", why);
        costs = l.op;
    }
    struct pp_sim sim;
    enum status st = pipeline_simulate(kind, p, m, v, &costs, &sim, err);
    if (st) return st;
    // One character: a unit, or (model costs) a share of the makespan, at
    // most 160 characters a line and at least 2 for the shortest op.
    double w = 1, shortest = MIN(costs.f, MIN(costs.b, costs.w));
    if (!unit) w = MAX(shortest > 0 ? shortest / 2 : 0, sim.makespan / 160);
    size_t len = 0;
    FILE *f = open_memstream(text, &len);
    CHECK(f, "open_memstream");
    if (unit)
        fprintf(f, "schedule: %s, unit costs (F = B = W = 1, a whole backward B + W = 2, messages free)\n",
                pipeline_schedule_name(kind));
    else
        fprintf(f, "schedule: %s, costs in seconds on %s (the planner's time model, docs/planning.md §3): F %.4g ms "
                "the forward of one microbatch through one chunk, B %.4g ms its input gradient (and the recomputed forward under recompute), "
                "W %.4g ms its weight gradients, a message between stages %.4g ms\n", pipeline_schedule_name(kind),
                cl0->gpu.name, costs.f * 1e3, costs.b * 1e3, costs.w * 1e3, costs.comm * 1e3);
    st = pipeline_print_timeline(f, kind, p, m, v, &costs, w, err);
    fclose(f);
    if (st) {
        free(*text), *text = NULL;
        return st;
    }
    json_t *o = json_object(), *idle = json_array();
    json_object_set_new(o, "pp_schedule", json_string(pipeline_schedule_name(kind)));
    json_object_set_new(o, "pp", json_integer(p));
    json_object_set_new(o, "virtual_stages", json_integer(v));
    json_object_set_new(o, "microbatches", json_integer(m));
    json_object_set_new(o, "costs", json_string(unit ? "unit" : "model"));
    json_object_set_new(o, "time_unit", json_string(unit ? "op" : "s"));
    json_object_set_new(o, "f", json_real(costs.f));
    json_object_set_new(o, "b", json_real(costs.b));
    json_object_set_new(o, "w", json_real(costs.w));
    json_object_set_new(o, "comm", json_real(costs.comm));
    json_object_set_new(o, "makespan", json_real(sim.makespan));
    for (int s = 0; s < p; s++) json_array_append_new(idle, json_real(sim.idle[s]));
    json_object_set_new(o, "idle", idle);
    json_object_set_new(o, "bubble", json_real(sim.bubble));
    json_object_set_new(o, "timeline", json_string(*text));
    *obj = o;
    return STATUS_OK;
}

// --gpus N: the layout search (plan_search.h) and the config's own layout.
static int plan_search_main(const struct config *c, const struct plan_cluster *cl, int n_top, bool json,
                            bool show, bool unit) {
    struct plan_layout *top = xcalloc((size_t)MAX(1, n_top), sizeof *top);
    struct plan_reject rej[64];
    int n_fit = 0, n_tried = 0, n_rej = 0;
    struct error err = {0};
    // --top 0: the config's own layout alone, no search
    if (n_top > 0 && plan_search(c, cl, top, n_top, &n_fit, &n_tried, rej, 64, &n_rej, &err)) {
        fprintf(stderr, "trident plan: %s\n", err.msg);
        free(top);
        return err.status;
    }
    // The config's own layout, when it is one for this cluster.
    struct plan_layout own = config_layout(c);
    bool fp8 = c->precision.fp8 != FP8_NONE;
    char own_why[400] = "";
    bool own_fits = false;
    struct grid_layout one = topology_layout(own.tp, own.pp, 1, 0, own.cp); // one data rank's GPUs
    int model_ranks = topology_world_size(&one);
    if (cl->gpus % model_ranks) {
        snprintf(own_why, sizeof own_why, "tp %d x cp %d x pp %d does not divide %d GPUs", own.tp, own.cp, own.pp,
                 cl->gpus);
    } else {
        own.dp = cl->gpus / model_ranks;
        // a batch that does not divide: the nearest that does (said below the table)
        own.global_batch = plan_nearest_batch(c->train.global_batch_size, own.mb, own.dp);
        if (!plan_batch_close(c->train.global_batch_size, own.global_batch))
            snprintf(own_why, sizeof own_why, "micro_batch_size %d x dp %d does not divide global_batch_size %d "
                     "(the nearest multiple, %d, is more than 10%% away)", own.mb, own.dp,
                     c->train.global_batch_size, own.global_batch);
        else
            own_fits = plan_predict(c, cl, &own, own_why, sizeof own_why);
    }
    int own_rank = 0; // 1-based place among the fitting layouts; 0: not among the top
    for (int i = 0; own_fits && i < MIN(n_top, n_fit); i++)
        if (top[i].step_s / top[i].global_batch >= own.step_s / own.global_batch - 1e-15) { own_rank = i + 1; break; }
    size_t usable = cl->gpu.mem_bytes - cl->reserve_bytes;
    // --show-schedule: the config's layout on this cluster (its dp, its batch)
    char *sched_text = NULL;
    json_t *sched = NULL;
    if (show) {
        struct config cs = *c;
        cs.parallel.dp = own.dp, cs.train.global_batch_size = own.global_batch;
        if (!own.dp) error_set(&err, STATUS_BAD_INPUT, "--show-schedule: %s", own_why);
        if (!own.dp || schedule_show(&cs, cl, unit, &sched_text, &sched, &err)) {
            fprintf(stderr, "trident plan: %s\n", err.msg);
            free(top);
            return err.status;
        }
    }
    if (json) {
        json_t *o = json_object(), *a = json_array(), *r = json_array();
        json_object_set_new(o, "schema", json_string("trident.plan_search.v1"));
        json_object_set_new(o, "config", json_string(c->file));
        json_object_set_new(o, "gpus", json_integer(cl->gpus));
        json_object_set_new(o, "gpus_per_node", json_integer(cl->gpus_per_node));
        json_object_set_new(o, "gpu", json_string(cl->gpu.name));
        json_object_set_new(o, "mem_bytes", json_integer((json_int_t)cl->gpu.mem_bytes));
        json_object_set_new(o, "reserve_bytes", json_integer((json_int_t)cl->reserve_bytes));
        json_object_set_new(o, "efficiency", json_real(cl->efficiency));
        json_object_set_new(o, "tried", json_integer(n_tried));
        json_object_set_new(o, "fit", json_integer(n_fit));
        for (int i = 0; i < MIN(n_top, n_fit); i++) json_array_append_new(a, layout_json(&top[i], fp8));
        json_object_set_new(o, "layouts", a);
        for (int i = 0; i < n_rej; i++) {
            json_t *x = json_object();
            json_object_set_new(x, "tp", json_integer(rej[i].tp));
            json_object_set_new(x, "cp", json_integer(MAX(1, rej[i].cp)));
            json_object_set_new(x, "pp", json_integer(rej[i].pp));
            json_object_set_new(x, "why", json_string(rej[i].why));
            json_array_append_new(r, x);
        }
        json_object_set_new(o, "rejected", r);
        json_t *co = own_fits ? layout_json(&own, fp8) : json_object();
        json_object_set_new(co, "fits", json_boolean(own_fits));
        if (!own_fits) json_object_set_new(co, "why", json_string(own_why));
        else json_object_set_new(co, "rank", json_integer(own_rank));
        json_object_set_new(o, "config_layout", co);
        if (sched) json_object_set_new(o, "schedule", sched);
        json_dumpf(o, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(o);
        free(top), free(sched_text);
        return STATUS_OK;
    }
    char model[96];
    if (cl->efficiency > 0) snprintf(model, sizeof model, "every FLOP at efficiency %.2f", cl->efficiency);
    else snprintf(model, sizeof model, "kernel model");
    char fp8s[64] = "";
    if (cl->gpu.fp8_flops > 0) snprintf(fp8s, sizeof fp8s, ", %.0f FP8", cl->gpu.fp8_flops / 1e12);
    printf("search: %s on %d x %s (%d a node; %.1f GiB each, %.1f GiB usable after a %.1f GiB reserve; "
           "%.0f TFLOP/s bf16%s peak, %s; NVLink %.0f GB/s, network %.0f GB/s a GPU), "
           "%d x %d tokens a step%s: %d layouts tried, %d fit\n",
           c->file, cl->gpus, cl->gpu.name, cl->gpus_per_node, cl->gpu.mem_bytes / 1073741824.0,
           usable / 1073741824.0, cl->reserve_bytes / 1073741824.0, cl->gpu.peak_flops / 1e12, fp8s,
           model, cl->gpu.nvlink_bw / 1e9, cl->gpu.ib_bw / 1e9, c->train.global_batch_size,
           c->train.seq_len, fp8 ? (c->precision.fp8 == FP8_HYBRID ? ", fp8 hybrid" : ", fp8 e4m3") : "",
           n_tried, n_fit);
    print_moe_params(c);
    printf("%-5s %3s %3s %3s %2s %-11s %5s %3s %3s %-9s %4s %5s %7s %8s %8s %8s %8s %8s %8s %8s %8s %8s %7s %6s "
           "%7s %7s %9s%s\n",
           "rank", "tp", "cp", "pp", "v", "schedule", "dp", "ep", "mb", "recompute", "zero", "shard", "GiB", "step s",
           "compute", "recomp", "bubble", "tp comm", "cp comm", "ep a2a", "pp comm", "dp exp", "TFLOP/s", "MFU",
           "hw TF/s", "MFU 12", "tok/s/GPU", fp8 ? "  vs bf16" : "");
    for (int i = 0; i < MIN(n_top, n_fit); i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "%d", i + 1);
        print_layout(tag, &top[i], fp8);
    }
    for (int i = 0; i < MIN(n_top, n_fit); i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "rank %d", i + 1);
        print_batch_notes(c, tag, &top[i]);
    }
    if (own_fits) {
        print_layout("config", &own, fp8);
        print_batch_notes(c, "config", &own);
        if (fp8 && own.bf16_step_s > 0)
            printf("fp8 %s against bf16, the config's layout: step %.3f s against %.3f s (%.2fx, %+.0f%% tokens/s), "
                   "peak %.1f GiB against %.1f GiB (%+.1f GiB: the FP8 weight copies, scratch and scaling state)\n",
                   c->precision.fp8 == FP8_HYBRID ? "hybrid" : "e4m3", own.step_s, own.bf16_step_s,
                   own.bf16_step_s / own.step_s, 100 * (own.bf16_step_s / own.step_s - 1),
                   own.peak_bytes / 1073741824.0, own.bf16_peak_bytes / 1073741824.0,
                   ((double)own.peak_bytes - (double)own.bf16_peak_bytes) / 1073741824.0);
        if (own_rank) printf("config's layout fits: rank %d of %d\n", own_rank, n_fit);
        else if (!n_top) printf("config's layout fits (--top 0: not searched, not ranked)\n");
        else printf("config's layout fits: slower than the top %d (%.1f%% slower than the best)\n", n_top,
                    100 * (own.step_s / own.global_batch / (top[0].step_s / top[0].global_batch) - 1));
    } else {
        char cps[32] = ""; // cp and ep only where the layout has them: the line reads as before without
        if (own.cp > 1) snprintf(cps, sizeof cps, "cp %d, ", own.cp);
        if (own.ep > 1) snprintf(cps + strlen(cps), sizeof cps - strlen(cps), "ep %d, ", own.ep);
        char sch[32] = ""; // the schedule where it is not the default
        if (own.schedule != PP_SCHEDULE_1F1B) snprintf(sch, sizeof sch, ", %s", pipeline_schedule_name(own.schedule));
        printf("config's layout (tp %d, %spp %d, v %d%s, mb %d, recompute %s, zero %d) does not fit: %s\n",
               own.tp, cps, own.pp, own.v, sch, own.mb, recompute_name(own.recompute), own.zero, own_why);
    }
    if (n_rej) printf("rejected families:\n");
    for (int i = 0; i < n_rej; i++) {
        if (rej[i].cp > 1) printf("  tp %d x cp %d x pp %d: %s\n", rej[i].tp, rej[i].cp, rej[i].pp, rej[i].why);
        else printf("  tp %d x pp %d: %s\n", rej[i].tp, rej[i].pp, rej[i].why);
    }
    if (sched_text) fputs(sched_text, stdout);
    json_decref(sched);
    free(top), free(sched_text);
    return STATUS_OK;
}

struct plan_args {
    const char *config;
    struct cli_list overrides;
    int world, gpus, gpus_per_node, top;
    const char *gpu, *gpu_mem;
    double efficiency;
    int64_t reserve;
    bool json, show_schedule, unit_costs;
    const char *schedule;
};

#define P(field) offsetof(struct plan_args, field)
static const struct cli_flag plan_flags[] = {
    {"CONFIG.ini", CLI_PATH, NULL, NULL, 0, 0, 0, NULL, "the run's config file", P(config)},
    {"section.key=value", CLI_LIST, NULL, NULL, 0, 0, CLI_OPTIONAL, NULL,
     "overrides of config keys, as `trident train` takes them (docs/config.md)", P(overrides)},
    {"--set", CLI_LIST, "KEY=VALUE", NULL, 0, 0, 0, NULL,
     "an override of a config key, the same as section.key=value (--set precision.fp8=hybrid)", P(overrides)},
    {"--world-size", CLI_INT, "N", NULL, 1, 1 << 24, 0, NULL,
     "the ranks the run will have (parallel.dp = 0 infers dp = N / (tp * cp * pp)); without it, dp = 0 "
     "means 1", P(world)},
    {"--json", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL, "the same as one JSON object", P(json)},
    {"--gpus", CLI_INT, "N", NULL, 1, 1 << 24, 0, NULL,
     "search the layouts of N GPUs (tp within a node and <= n_kv_heads, cp for sequences of 16K tokens or "
     "more, pp, virtual stages, micro-batch, recompute, ZeRO stage 0-3, and ep for a mixture-of-experts model) "
     "that fit the memory less --reserve, "
     "ranked by predicted step time (docs/planning.md; shard: the ranks a ZeRO-2/3 shard spans, g: kept "
     "gathered), saying why each rejected (tp, pp) family failed and where the config's own layout stands",
     P(gpus)},
    {"--gpus-per-node", CLI_INT, "N", "8", 1, 1 << 24, 0, NULL, "GPUs a node (with --gpus)", P(gpus_per_node)},
    {"--gpu", CLI_STRING, "SPEC", "H100-SXM", 0, 0, 0, NULL,
     "the GPU (with --gpus or --show-schedule): A100-40G, A100-80G, H100-SXM, H100-PCIe, H800, H200, B200, or "
     "tflops=989,fp8=1979,hbm=3.35T,nvlink=450G,ib=50G,mem=80G, optionally after a preset (H200,ib=25G)", P(gpu)},
    {"--gpu-mem", CLI_STRING, "SIZE", NULL, 0, 0, 0, NULL,
     "the GPU's memory, as --gpu's mem= (80G); default: --gpu's", P(gpu_mem)},
    {"--efficiency", CLI_FLOAT, "F", NULL, 0, 1, CLI_MIN_EXCLUSIVE, NULL,
     "every FLOP at this fraction of peak (with --gpus or --show-schedule; the model before issue 30); default: the kernel "
     "model, each GEMM at its shape's rate, attention at a fused kernel's, the memory-bound kernels at HBM "
     "speed (docs/planning.md §3)", P(efficiency)},
    {"--reserve", CLI_SIZE, "GIB", "4G", 0, INFINITY, CLI_SIZE_GIB, NULL,
     "memory kept free on each GPU (CUDA context, NCCL buffers, fragmentation; with --gpus)", P(reserve)},
    {"--top", CLI_INT, "N", "5", 0, 1 << 24, 0, NULL,
     "layouts printed (with --gpus); 0: no search, the config's own layout alone", P(top)},
    {"--schedule", CLI_STRING, "NAME", NULL, 0, 0, 0, NULL,
     "the pipeline schedule, overriding [parallel] pp_schedule with the config key's checks: 1f1b, "
     "interleaved, zb-h1, zbv (src/parallel/pipeline.h; docs/planning.md §3)", P(schedule)},
    {"--show-schedule", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "print the config's pipeline schedule as the simulator lays it out: each stage's timeline (F forward, "
     "B input-gradient backward or whole backward, W weight-gradient backward, . idle), the ops' costs in the "
     "planner's time model on --gpu (ms of one microbatch through one chunk), each stage's idle time and the "
     "bubble fraction; with --json a \"schedule\" object; with --gpus the config's layout on that cluster",
     P(show_schedule)},
    {"--unit-costs", CLI_SWITCH, NULL, NULL, 0, 0, 0, NULL,
     "with --show-schedule (implied): F = B = W = 1 and free messages, the schedule's shape alone",
     P(unit_costs)},
};
#undef P

const struct cli_command cli_plan = {
    .name = "plan",
    .synopsis = "CONFIG.ini [--world-size N | --gpus N [search options]] [--json] [section.key=value ...]",
    .summary = "Prints the bytes each rank of the config's layout allocates (parameters, gradients, AdamW state,\n"
               "activations), without running it, one row per run of stages whose ranks are alike, with the\n"
               "ranks it covers; with --gpus, searches the layouts of that many GPUs instead.",
    .flags = plan_flags,
    .n_flags = CLI_N(plan_flags),
};

int cmd_plan(int argc, char **argv) {
    if (cli_is_help(argc, argv)) {
        cli_print_help(&cli_plan, stdout);
        return STATUS_OK;
    }
    struct config c;
    struct error err = {0};
    struct plan_args o = {0};
    int tp, pp;
    if (cli_parse(&cli_plan, argc, argv, &o, &err)) {
        fprintf(stderr, "trident plan: %s\n(trident plan --help for usage)\n", err.msg);
        cli_free(&cli_plan, &o);
        return err.status;
    }
    int world = o.world, n_top = o.top, n_over = o.overrides.n;
    bool json = o.json, unit = o.unit_costs, show = o.show_schedule || o.unit_costs;
    char **over = xmalloc(sizeof(char *) * (size_t)(n_over + 1));
    for (int i = 0; i < n_over; i++) over[i] = (char *)o.overrides.values[i];
    // --schedule NAME: the override parallel.pp_schedule=NAME after the others
    // (config_load and config_validate check it as the config key)
    char sched_over[64];
    if (o.schedule) {
        int k = 0;
        char names[80] = "";
        for (int i = 0; i < PP_SCHEDULE_COUNT; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     pipeline_schedule_name((enum pp_schedule)i));
        while (k < PP_SCHEDULE_COUNT && strcmp(o.schedule, pipeline_schedule_name((enum pp_schedule)k))) k++;
        if (k == PP_SCHEDULE_COUNT) {
            fprintf(stderr, "trident plan: --schedule '%s': expected one of: %s\n", o.schedule, names);
            cli_free(&cli_plan, &o);
            free(over);
            return STATUS_BAD_INPUT;
        }
        snprintf(sched_over, sizeof sched_over, "parallel.pp_schedule=%s", o.schedule);
        over[n_over++] = sched_over;
    }
    struct plan_cluster cl = {.gpus = o.gpus, .gpus_per_node = o.gpus_per_node, .reserve_bytes = (size_t)o.reserve,
                              .efficiency = o.efficiency, .alpha_nvlink = 5e-6, .alpha_ib = 10e-6};
    const char *gpu_spec = o.gpu, *mem_spec = o.gpu_mem, *config_path = o.config;
    cli_free(&cli_plan, &o);
    if (cl.gpus || show) {
        enum status st = plan_gpu_parse(gpu_spec, &cl.gpu, &err);
        if (!st && mem_spec) {
            char spec[80];
            snprintf(spec, sizeof spec, "mem=%s", mem_spec);
            struct plan_gpu g; // --gpu-mem overrides the memory alone
            st = plan_gpu_parse(spec, &g, &err);
            cl.gpu.mem_bytes = g.mem_bytes;
        }
        if (st || cl.reserve_bytes >= cl.gpu.mem_bytes) {
            fprintf(stderr, "trident plan: %s\n", st ? err.msg : "--reserve leaves no memory");
            free(over);
            return STATUS_BAD_INPUT;
        }
    }
    if (cl.gpus) {
        if (config_load(config_path, n_over, over, &c, &err)) {
            fprintf(stderr, "trident plan: %s\n", err.msg);
            free(over);
            return err.status;
        }
        free(over);
        // What the trainer refuses whatever the layout (config_validate on
        // one rank: e.g. precision.fp8 without precision.dtype = bf16) is
        // refused here, not once per family.
        struct config one = c;
        one.parallel.tp = one.parallel.pp = one.parallel.cp = one.parallel.dp = one.parallel.ep = 1;
        one.parallel.virtual_stages = 1, one.parallel.zero_stage = 0, one.parallel.dp_shard = 0;
        one.parallel.sequence_parallel = false, one.train.micro_batch_size = 1;
        one.parallel.pp_schedule = PP_SCHEDULE_1F1B; // the schedules need pp > 1: each layout is checked
        if (config_validate(&one, 1, true, &err)) {
            fprintf(stderr, "trident plan: %s\n", err.msg);
            return err.status;
        }
        if (c.precision.fp8 != FP8_NONE && !(cl.gpu.fp8_flops > 0)) {
            fprintf(stderr, "trident plan: precision.fp8 = %s needs FP8 tensor cores: --gpu %s has none (a custom "
                    "GPU gives their peak with fp8=TFLOPS)\n", c.precision.fp8 == FP8_HYBRID ? "hybrid" : "e4m3",
                    cl.gpu.name);
            return STATUS_BAD_INPUT;
        }
        return plan_search_main(&c, &cl, n_top, json, show, unit);
    }
    enum status st = config_load(config_path, n_over, over, &c, &err);
    free(over);
    // Without --world-size the layout checks itself: dp = 0 resolves to 1.
    if (!st && !world) st = config_resolve_dp(&c, 0, &err);
    if (st || config_validate(&c, world, true, &err)) { // world 0: the config's own layout
        fprintf(stderr, "trident plan: %s\n", err.msg);
        return err.status;
    }
    tp = c.parallel.tp, pp = c.parallel.pp;
    static const char *recompute_names[] = {"none", "selective", "full"};
    struct plan_group *rows = xcalloc((size_t)tp * pp, sizeof *rows);
    int n_rows;
    size_t peak;
    double total;
    if (plan_groups(&c, rows, &n_rows, &peak, &total, &err)) {
        fprintf(stderr, "trident plan: %s\n", err.msg);
        free(rows);
        return err.status;
    }
    struct plan_host_bytes *host = xcalloc((size_t)n_rows, sizeof *host);
    size_t peak_resident = 0;
    for (int i = 0; i < n_rows; i++) {
        struct grid_coord at = {{0}};
        at.at[AXIS_PP] = rows[i].stage_begin;
        if (plan_host(&c, at, &host[i], &err)) {
            fprintf(stderr, "trident plan: %s\n", err.msg);
            free(rows), free(host);
            return err.status;
        }
        peak_resident = MAX(peak_resident, resident(&c, &rows[i].bytes, &host[i]));
    }
    char *sched_text = NULL; // --show-schedule
    json_t *sched = NULL;
    if (show && schedule_show(&c, &cl, unit, &sched_text, &sched, &err)) {
        fprintf(stderr, "trident plan: %s\n", err.msg);
        free(rows), free(host);
        return err.status;
    }
    if (json) {
        print_json(&c, rows, host, n_rows, peak, peak_resident, total,
                   recompute_names[c.model.recompute], sched);
        json_decref(sched);
        free(rows), free(host), free(sched_text);
        return STATUS_OK;
    }
    struct grid_layout grid = config_grid(&c);
    char layout[256];
    struct plan_sharding zs = plan_sharding_of(&c);
    char zero[96] = "";
    if (zs.zero_stage >= 2)
        snprintf(zero, sizeof zero, " (shards over %d ranks%s)", zs.shard_ranks,
                 zs.zero_stage == 2 ? "" : zs.reshard_after_forward ? ", reshard_after_forward" : ", kept gathered");
    char cps[96] = ""; // context parallelism: what one rank of the cp group holds of them
    if (plan_cp(&c) > 1)
        snprintf(cps, sizeof cps, " (each of its %d cp ranks %d x %d of them)", plan_cp(&c),
                 c.train.micro_batch_size, c.train.seq_len / plan_cp(&c));
    char sch[48] = ""; // the pipeline's schedule
    if (pp > 1) snprintf(sch, sizeof sch, ", pp_schedule %s", pipeline_schedule_name(c.parallel.pp_schedule));
    printf("plan: %s, %s = %d ranks%s, zero_stage %d%s, %d microbatches of %d x %d "
           "tokens per %srank per step%s, %s, recompute %s\n", c.file,
           topology_layout_text(&grid, true, " ", " x ", layout, sizeof layout), topology_world_size(&grid), sch,
           c.parallel.zero_stage, zero, plan_microbatches(&c), c.train.micro_batch_size,
           c.train.seq_len, plan_cp(&c) > 1 ? "data " : "", cps, dtype_name(c.precision.dtype),
           recompute_names[c.model.recompute]);
    print_moe_params(&c);
    printf("%-7s %-7s %6s %12s %12s %12s %14s %12s %6s\n", "stages", "role", "ranks", "params MiB",
           "grads MiB", "AdamW MiB", "activ. MiB", "total MiB", "slots");
    for (int i = 0; i < n_rows; i++) {
        const struct plan_group *g = &rows[i];
        const struct plan_rank_bytes *b = &g->bytes;
        char stages[24];
        if (g->stage_begin == g->stage_end) snprintf(stages, sizeof stages, "%d", g->stage_begin);
        else snprintf(stages, sizeof stages, "%d-%d", g->stage_begin, g->stage_end);
        printf("%-7s %-7s %6d %12.1f %12.1f %12.1f %14.1f %12.1f %6d\n", stages, g->role, g->n_ranks,
               mib(b->params), mib(b->grads), mib(b->optimizer), mib(b->activations),
               mib(plan_rank_total(b)), b->n_slots);
        printf("       bytes: params %zu, grads %zu, optimizer %zu, activations %zu\n", b->params,
               b->grads, b->optimizer, b->activations);
        printf("       activations: %d slots of %zu bytes, ", b->n_slots, b->slot_bytes);
        if (b->n_wstash)
            printf("%d W stashes of %zu bytes, ", b->n_wstash, b->w_stash_bytes / b->n_wstash);
        printf("recompute buffer %zu, scratch %zu", b->recompute_bytes,
               b->activations - b->recompute_bytes - (size_t)b->n_slots * b->slot_bytes -
                   b->w_stash_bytes - b->fp8_saved - b->fp8_work);
        if (b->cp_bytes) printf(" (of it the cp ring's travelling buffers and positions %zu)", b->cp_bytes);
        if (b->kv_cache_bytes) printf(" (of it the samples' key/value cache %zu)", b->kv_cache_bytes);
        printf("\n");
        if (b->zero_stage >= 2) print_zero_lines(&c, b);
        if (c.model.moe_experts)
            printf("       moe: %d MoE blocks holding %d of %d experts each (ep %d): expert weights %zu (%.1f MiB, in "
                   "params; their gradients and AdamW state likewise), routing and expert activations %zu (%.1f MiB, "
                   "in activations)\n", b->moe_blocks, b->experts_local, c.model.moe_experts, MAX(1, c.parallel.ep),
                   b->expert_params * dtype_size(c.precision.dtype),
                   mib(b->expert_params * dtype_size(c.precision.dtype)), b->moe_bytes, mib(b->moe_bytes));
        if (c.precision.fp8 != FP8_NONE)
            printf("       fp8 (docs/planning.md §7): block-linear weight copies %zu (%.1f MiB, in params), scratch and "
                   "scaling state %zu (%.1f MiB, in activations)\n", b->fp8_weights, mib(b->fp8_weights), b->fp8_work,
                   mib(b->fp8_work));
        if (c.system.device == DEVICE_CPU && host[i].ckpt_save)
            printf("       host: MPI %zu, checkpoint buffers %zu (%.1f MiB: checkpoint.async's "
                   "snapshot; the first save allocates them, they stay), resident %zu (%.1f MiB: "
                   "the arenas, MPI's and the snapshot's)\n", host[i].mpi, host[i].ckpt_save,
                   mib(host[i].ckpt_save), resident(&c, b, &host[i]), mib(resident(&c, b, &host[i])));
        else if (c.system.device == DEVICE_CPU)
            printf("       host: MPI %zu, resident %zu (%.1f MiB: the arenas and MPI's); a resume "
                   "or init_from reads into %zu more, freed after loading\n", host[i].mpi,
                   resident(&c, b, &host[i]), mib(resident(&c, b, &host[i])), host[i].ckpt_load);
        else
            printf("       host: checkpoint buffers %zu (%.1f MiB; the first save or load "
                   "allocates them, they stay), MPI %zu\n", host[i].ckpt_save,
                   mib(host[i].ckpt_save), host[i].mpi);
    }
    printf("peak rank: %.1f MiB (%.2f GiB); all %d ranks: %.1f MiB (each data-parallel replica "
           "holds its stage's row)\n", mib(peak), peak / 1073741824.0, topology_world_size(&grid),
           total / 1048576.0);
    if (c.system.device == DEVICE_CPU)
        printf("MPI (system.device = cpu): up to %.1f MiB per rank beyond the arenas: reductions in "
               "MPI calls of %zu MiB, holding up to twice that%s%s%s; peak resident rank %.1f MiB "
               "(%.2f GiB), plus the program's own ~50 MiB (docs/design.md §5)\n",
               mib(host[0].mpi), COMM_MPI_CHUNK_BYTES >> 20,
               c.parallel.zero_stage == 0 && plan_grad_ranks(&c) > 1 ? ", gradient all-reduces in flight" : "",
               (c.parallel.zero_stage >= 1 && plan_grad_ranks(&c) > 1) || (c.parallel.sequence_parallel && tp > 1)
                   ? ", reduce-scatter staging" : "",
               c.parallel.zero_stage >= 2 && plan_grad_ranks(&c) > 1 ? ", two units' gradient reduce-scatters "
                                                                       "in flight" : "",
               mib(peak_resident), peak_resident / 1073741824.0);
    if (sched_text) fputs(sched_text, stdout);
    json_decref(sched);
    free(rows), free(host), free(sched_text);
    return STATUS_OK;
}

// plan.c: shards and memory per rank from the config (plan.h); `trident plan`
// (src/cli/cmd_plan.c) prints them for a layout that is not running.
#include "plan.h"

#include <string.h>

#include "data/dataset.h"
#include "model/optimizer.h"
#include "train/fsdp.h"
#include "train/grad_sync.h"
#include "parallel/comm_mpi.h"
#include "parallel/pipeline.h"

struct llama_config plan_llama(const struct config *c) {
    return (struct llama_config){
        .vocab_size = c->model.vocab_size, .d_model = c->model.d_model,
        .n_layers = c->model.n_layers, .n_heads = c->model.n_heads,
        .n_kv_heads = c->model.n_kv_heads, .ffn_dim = c->model.ffn_dim,
        .max_seq_len = c->model.max_seq_len, .rope_theta = c->model.rope_theta,
        .rope_scaling = {.type = c->model.rope_scaling, .factor = c->model.rope_scaling_factor,
                         .low_freq_factor = c->model.rope_low_freq_factor,
                         .high_freq_factor = c->model.rope_high_freq_factor,
                         .original_max_pos = c->model.rope_original_max_pos},
        .head_dim = c->model.head_dim, .qkv_bias = c->model.qkv_bias, .qk_norm = c->model.qk_norm,
        .norm_eps = (float)c->model.norm_eps, .tie_embeddings = c->model.tie_embeddings,
        .init_std = (float)c->model.init_std, .label_smoothing = (float)c->train.label_smoothing,
        .moe_experts = c->model.moe_experts, .moe_top_k = c->model.moe_top_k,
        .moe_ffn_dim = c->model.moe_ffn_dim, .moe_shared_experts = c->model.moe_shared_experts,
        .moe_shared_ffn_dim = c->model.moe_shared_ffn_dim,
        .moe_shared_gate = c->model.moe_shared_gate, .moe_norm_topk = c->model.moe_norm_topk,
        .moe_capacity_factor = c->model.moe_capacity_factor,
        .moe_aux_loss_coeff = c->model.moe_aux_loss_coeff,
        .moe_z_loss_coeff = c->model.moe_z_loss_coeff,
        .moe_first_dense_layers = c->model.moe_first_dense_layers,
    };
}

int plan_cp(const struct config *c) { return MAX(1, c->parallel.cp); }

int plan_grad_ranks(const struct config *c) {
    struct grid_layout g = topology_layout(1, 1, MAX(1, c->parallel.dp), 0, plan_cp(c));
    return topology_group_size(&g, GROUP_DP_CP);
}

struct plan_sharding plan_sharding_of(const struct config *c) {
    int dp = MAX(1, c->parallel.dp);
    int S = plan_cp(c) * (c->parallel.zero_stage >= 2 && c->parallel.dp_shard ? c->parallel.dp_shard : dp);
    return (struct plan_sharding){.zero_stage = c->parallel.zero_stage, .shard_ranks = S,
                                  .reshard_after_forward = c->parallel.reshard_after_forward, .prefetch = 1};
}

// What ZeRO asks of the shard's arenas: ZeRO-1 pads the arena to a multiple
// of 64 G (G = dp cp, the gradient group); ZeRO-2/3 pad every unit so that
// each of the S shard ranks owns a slice of whole 128-element (256-byte
// BF16) blocks (src/train/fsdp.h), keep no gradient arena, and at 3 no
// parameter arena.
static void shard_zero(struct model_shard *s, const struct config *c, const struct plan_sharding *z) {
    s->arena_multiple = z->zero_stage == 1 ? 64 * plan_grad_ranks(c) : 0;
    s->unit_multiple = z->zero_stage >= 2 ? 128 * z->shard_ranks : 0;
    s->no_grad_arena = z->zero_stage >= 2;
    s->no_param_arena = z->zero_stage == 3;
}

int plan_microbatches(const struct config *c) {
    return loader_microbatches(c->train.global_batch_size, c->train.micro_batch_size, c->parallel.dp);
}

enum status plan_shard(const struct config *c, struct grid_coord coord, struct model_shard *out,
                       struct error *err) {
    struct llama_config lc = plan_llama(c);
    int pp = c->parallel.pp, v = MAX(1, c->parallel.virtual_stages), s = coord.at[AXIS_PP];
    int m = plan_microbatches(c);
    enum pp_schedule kind = c->parallel.pp_schedule;
    struct model_shard shard = model_shard_pipeline(&lc, kind, pp, s, v);
    shard.tp_rank = coord.at[AXIS_TP], shard.tp_size = c->parallel.tp;
    shard.cp_rank = coord.at[AXIS_CP], shard.cp_size = MAX(1, c->parallel.cp);
    // Expert parallelism: this rank's E / ep routed experts of every MoE block (param_info.expert)
    shard.ep_rank = coord.at[AXIS_EP], shard.ep_size = MAX(1, c->parallel.ep);
    struct plan_sharding z = plan_sharding_of(c);
    shard_zero(&shard, c, &z);
    shard.sequence_parallel = c->parallel.sequence_parallel;
    shard.recompute = c->model.recompute;
    if (pp > 1 || v > 1) {
        shard.n_slots = pipeline_max_in_flight(kind, pp, s, m, v);
        shard.n_wstash = pipeline_max_w_pending(kind, pp, s, m, v); // 0 without the split
        if (shard.n_slots < 1) { // refused: the schedule says why
            struct error why = {0};
            struct pp_op *probe = xcalloc(3 * (size_t)m * v, sizeof *probe);
            pipeline_schedule(kind, pp, s, m, v, probe, &why);
            free(probe);
            return error_set(err, STATUS_BAD_INPUT,
                             "%s: [parallel] pp = %d, virtual_stages = %d, pp_schedule = %s with %d "
                             "microbatches per step (global_batch_size / (micro_batch_size * dp)): %s",
                             c->file, pp, v, pipeline_schedule_name(kind), m, why.msg);
        }
    }
    *out = shard;
    return STATUS_OK;
}

struct model_fp8_config plan_fp8_config(const struct config *c) {
    const struct precision_config *pc = &c->precision;
    struct model_fp8_config f = {
        .on = pc->fp8 != FP8_NONE, .grad = pc->fp8 == FP8_HYBRID ? DTYPE_FP8_E5M2 : DTYPE_FP8_E4M3,
        .delayed = pc->fp8_scaling == FP8_SCALING_DELAYED, .history_len = pc->fp8_amax_history_len,
        .most_recent = pc->fp8_amax_compute == FP8_AMAX_MOST_RECENT, .margin = pc->fp8_margin};
    config_fp8_skip(c, &f.skip_first, &f.skip_last);
    return f;
}

enum status plan_fp8_bytes(const struct config *c, const struct model_shard *sh, struct plan_fp8 *out,
                           struct error *err) {
    *out = (struct plan_fp8){0};
    if (c->precision.fp8 == FP8_NONE) return STATUS_OK;
    struct llama_config lc = plan_llama(c);
    struct model_fp8_config fc = plan_fp8_config(c);
    struct model_fp8_memory mem;
    enum status st = model_fp8_plan_bytes(&lc, sh, &fc, c->train.micro_batch_size, c->train.seq_len, &mem, err);
    if (st) return st;
    *out = (struct plan_fp8){.weights = mem.weights, .saved = 0, .work = mem.scratch + mem.state};
    return STATUS_OK;
}

size_t plan_rank_total(const struct plan_rank_bytes *b) {
    return b->params + b->grads + b->optimizer + b->activations;
}

enum status plan_rank(const struct config *c, struct grid_coord coord, struct plan_rank_bytes *out,
                      struct error *err) {
    struct plan_sharding zs = plan_sharding_of(c), *z = &zs;
    struct llama_config lc = plan_llama(c);
    struct model_shard shard;
    struct model_memory mem;
    enum status st = plan_shard(c, coord, &shard, err);
    if (st) return st;
    st = model_plan(&lc, &shard, c->precision.dtype, c->train.micro_batch_size, c->train.seq_len, &mem,
                    err);
    if (st) return st;
    int grad_ranks = plan_grad_ranks(c); // the gradient group: data x context
    *out = (struct plan_rank_bytes){
        .params = mem.param_bytes,
        // grad_dtype = bf16 without ZeRO-1: the BF16 copy the buckets all-reduce
        .grads = mem.grad_bytes + grad_sync_plan_bytes(mem.n_params, grad_ranks, z->zero_stage,
                                                       c->precision.grad_dtype),
        .activations = mem.activation_bytes,
        .slot_bytes = mem.slot_bytes,
        .recompute_bytes = mem.recompute_bytes,
        .cp_bytes = mem.cp_bytes,
        .n_slots = MAX(1, shard.n_slots),
        .w_stash_bytes = mem.w_stash_bytes,
        .n_wstash = mem.w_stash_bytes ? MAX(1, shard.n_wstash) : 0,
        .n_params = mem.n_params,
        // under ep the expert buffers hold the rows the rank may receive (moe_rows_recv_max)
        .moe_bytes = mem.moe_bytes,
    };
    // Mixture of experts: the routed experts this rank holds (E / ep of every MoE block
    // among its layers: model_memory.n_expert_params)
    if (lc.moe_experts) {
        int n_moe = 0;
        for (int k = 0; k < shard.n_chunks; k++)
            for (int l = shard.layer_begin[k]; l < shard.layer_end[k]; l++) n_moe += llama_layer_moe(&lc, l);
        out->moe_blocks = n_moe, out->experts_local = lc.moe_experts / MAX(1, shard.ep_size);
        out->expert_params = mem.n_expert_params;
    }
    // ZeRO-1: this rank's ranges of the arena's runs (optimizer_zero1_numel),
    // under ep the experts' runs over expert_dp; their table only then.
    size_t n_state = mem.n_params;
    if (z->zero_stage == 1 && grad_ranks > 1) {
        struct param_info *p = NULL;
        int np = 0, ep = MAX(1, c->parallel.ep);
        struct grid_layout g = config_grid(c);
        if (ep > 1 && mem.n_expert_params && (st = model_shard_param_table(&lc, &shard, &p, &np, err)))
            return st;
        int d = topology_group_rank(&g, GROUP_DP_CP, coord);
        int de = topology_group_rank(&g, GROUP_EXPERT_DP, coord);
        n_state = optimizer_zero1_numel(p, np, mem.n_params, grad_ranks, d, ep, de);
        free(p);
    }
    out->optimizer = optimizer_plan_bytes(mem.n_params, n_state, c->precision.dtype, grad_ranks, z->zero_stage,
                                          c->precision.grad_dtype);
    // FP8 (precision.fp8 != none): the copies plan_fp8_bytes counts
    struct plan_fp8 f8;
    if ((st = plan_fp8_bytes(c, &shard, &f8, err))) return st;
    out->fp8_weights = f8.weights, out->fp8_saved = f8.saved, out->fp8_work = f8.work;
    out->params += f8.weights, out->activations += f8.saved + f8.work;
    // The training log's samples (train.sample_every > 0; not under context
    // parallelism) run on a key/value cache of one row of seq_len positions,
    // allocated at start (train.c, setup_samples).
    if (c->train.sample_every > 0 && c->parallel.cp <= 1) {
        st = model_kv_cache_bytes(&lc, &shard, c->precision.dtype, c->train.micro_batch_size,
                                  c->train.seq_len, 1, c->train.seq_len, &out->kv_cache_bytes, err);
        if (st) return st;
        out->activations += out->kv_cache_bytes;
    }
    if (z->zero_stage < 2) return STATUS_OK;
    // ZeRO-2/3: fsdp.h's buffers (fsdp_plan_bytes: what fsdp_bytes reports of
    // a run), named by part for `trident plan`. n and U include the padding.
    int S = z->shard_ranks;
    size_t n = mem.n_params, nS = n / S, U = mem.max_unit_numel, tied = mem.tied_embed_numel;
    size_t P = dtype_size(c->precision.dtype);
    size_t G = dtype_size(c->precision.dtype == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32);
    size_t zp, zg;
    fsdp_plan_bytes(z->zero_stage, z->reshard_after_forward, c->precision.dtype, c->precision.grad_dtype, &mem,
                    S, &zp, &zg);
    out->zero_stage = z->zero_stage, out->shard_ranks = S, out->unit_elems = U;
    // two unit gradient buffers (and a tied embedding's own), their reduce-scatter results
    out->grads_shard = nS * G, out->grads_units = (2 * U + tied) * G, out->grads_recv = (2 * (U / S) + tied / S) * G;
    out->grads_transfer = zg - out->grads_shard - out->grads_units - out->grads_recv; // their bf16 twins
    out->grads += zg;
    out->optimizer = optimizer_plan_bytes(n, nS, c->precision.dtype, S, z->zero_stage, c->precision.grad_dtype);
    out->opt_master = c->precision.dtype == DTYPE_BF16 || c->precision.dtype == DTYPE_FP16 ? nS * sizeof(float) : 0;
    out->opt_moments = out->optimizer - out->opt_master;
    if (z->zero_stage == 3) {
        out->params_shard = nS * P;
        out->params_gathered = zp - out->params_shard;
        // the unit computing and the one gathered ahead (prefetch 1), + 1 beside a tied head
        out->n_gathered = z->reshard_after_forward ? (int)(out->params_gathered / (U * P)) : 0;
    }
    out->params += zp;
    return STATUS_OK;
}

enum status plan_host(const struct config *c, struct grid_coord coord, struct plan_host_bytes *out,
                      struct error *err) {
    struct plan_rank_bytes b;
    enum status st = plan_rank(c, coord, &b, err);
    if (st) return st;
    struct llama_config lc = plan_llama(c);
    struct model_shard shard;
    struct model_memory mem;
    if ((st = plan_shard(c, coord, &shard, err)) ||
        (st = model_plan(&lc, &shard, c->precision.dtype, c->train.micro_batch_size, c->train.seq_len,
                         &mem, err)))
        return st;
    int tp = c->parallel.tp, pp = c->parallel.pp, dp = plan_grad_ranks(c), z = c->parallel.zero_stage;
    // MPI: the largest group a reduction runs on (the gradient group is data
    // x context, dp here; the embedding group of a
    // tied model's pipeline ends has 2 ranks); gradient buckets all-reduce
    // non-blocking without ZeRO; ZeRO and sequence parallelism reduce-scatter;
    // ZeRO-2/3 keep two units' reduce-scatters in flight (fsdp.c), their
    // gradients in grad_dtype.
    int largest = MAX(MAX(tp, dp), pp > 1 ? 2 : 1);
    bool cpu = c->system.device == DEVICE_CPU;
    // ZeRO-2/3's shard group (cp x dp_shard, else cp x dp). Its two units'
    // reduce-scatters in flight hold their send size on group rank 0 at 2
    // ranks, up to twice that on some ranks beyond (OpenMPI 4.1 on the 22M
    // model of tests/e2e/plan_rss.sh at ZeRO-3: rank 0 +80 MiB over two
    // units' 54 MiB at 4 ranks, ranks 0 and 4 +86 MiB at 8, the others
    // less): counted as 2 units at S = 2 and 4 units above, an upper bound.
    int S = plan_sharding_of(c).shard_ranks;
    size_t unit_rs = z >= 2 && S > 1 ? (S > 2 ? 4 : 2) * mem.max_unit_numel *
                                            (c->precision.grad_dtype == DTYPE_BF16 ? 2 : sizeof(float))
                                      : 0;
    out->mpi = cpu ? comm_mpi_plan_bytes(largest, z == 0 && dp > 1,
                                         (z >= 1 && dp > 1) || (c->parallel.sequence_parallel && tp > 1),
                                         unit_rs)
                   : 0;
    // train_ckpt.c host_buffers: the FP32 parameter arena (not under
    // ZeRO-3), moments (and master values of a 16-bit model or under
    // ZeRO-2/3) over this rank's optimizer ranges (about n / dp elements
    // under ZeRO).
    size_t n = b.n_params, range = z == 1 && dp > 1 ? n / dp : z >= 2 ? n / S : n;
    bool lowp = c->precision.dtype == DTYPE_BF16 || c->precision.dtype == DTYPE_FP16;
    out->ckpt_load = ((z == 3 ? 0 : n) + (2 + (lowp || z >= 2 ? 1 : 0)) * range) * sizeof(float);
    // The CPU backend's synchronous saves read the arenas; its asynchronous
    // ones snapshot into the same host buffers (train_ckpt.c snapshot_to_host).
    out->ckpt_save = cpu && !c->checkpoint.async ? 0 : out->ckpt_load;
    return STATUS_OK;
}

static bool rank_bytes_equal(const struct plan_rank_bytes *a, const struct plan_rank_bytes *b) {
    return a->params == b->params && a->grads == b->grads && a->optimizer == b->optimizer &&
           a->activations == b->activations && a->slot_bytes == b->slot_bytes &&
           a->recompute_bytes == b->recompute_bytes && a->n_slots == b->n_slots &&
           a->w_stash_bytes == b->w_stash_bytes && a->n_wstash == b->n_wstash &&
           a->unit_elems == b->unit_elems && a->params_gathered == b->params_gathered;
}

enum status plan_groups(const struct config *c, struct plan_group *out, int *n_out, size_t *peak,
                        double *sum, struct error *err) {
    int tp = c->parallel.tp, pp = c->parallel.pp, dp = plan_grad_ranks(c), n = 0; // dp: data x context ranks
    *peak = 0, *sum = 0;
    for (int p = 0; p < pp; p++) {
        int last = pipeline_last_stage(c->parallel.pp_schedule, pp);
        const char *role = pp == 1 ? "only" : p == 0 && last == 0 ? "ends" // ZB-V: both ends
                         : p == 0 ? "first" : p == last ? "last" : "middle";
        for (int t = 0; t < tp; t++) {
            struct plan_rank_bytes b;
            struct grid_coord at = {{0}}; // data and context rank 0 (ZeRO-1 under ep: see plan.h)
            at.at[AXIS_TP] = t, at.at[AXIS_PP] = p;
            enum status st = plan_rank(c, at, &b, err);
            if (st) return st;
            size_t tot = plan_rank_total(&b);
            *peak = MAX(*peak, tot), *sum += (double)tot * dp;
            struct plan_group *g = n ? &out[n - 1] : NULL;
            if (g && !strcmp(g->role, role) && rank_bytes_equal(&g->bytes, &b) &&
                (g->stage_end == p || (g->stage_end == p - 1 && t == 0))) {
                g->stage_end = p;
                g->n_ranks += dp;
                continue;
            }
            out[n++] = (struct plan_group){p, p, role, dp, b};
        }
    }
    *n_out = n;
    return STATUS_OK;
}

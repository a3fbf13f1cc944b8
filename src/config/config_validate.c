// config_validate.c: rules across keys (docs/design.md §2, §4), checked once the
// number of ranks is known. Each message names the keys involved, their values
// and where each was set (file:line, command line argument, or default).
#include <float.h>
#include <math.h>
#include <string.h>

#include "config.h"

#include "data/dataset.h"

// "parallel.tp = 2 (configs/tiny.ini:21)"
struct key_text {
    char s[CONFIG_PATH_MAX + 96];
};

static struct key_text key_text(const struct config *cfg, const char *section, const char *key) {
    struct key_text t;
    int i = config_key_index(section, key);
    CHECK(i >= 0, "no key %s.%s", section, key);
    char value[CONFIG_PATH_MAX + 16], origin[CONFIG_PATH_MAX + 32];
    snprintf(t.s, sizeof t.s, "%s.%s = %s (%s)", section, key, config_format_value(cfg, i, value, sizeof value),
             config_origin(cfg, i, origin, sizeof origin));
    return t;
}

#define KT(sec, key) key_text(cfg, sec, key).s

// The nearest global batch sizes around g that are multiples of per_step
// (lo may be 0: none below), and the world sizes nearest to world (tp * pp
// multiples, `model` = tp * pp) whose dp divides g / micro: into buf.
static void batch_hint(long long g, int micro, int dp, int model, char *buf, size_t n) {
    long long per = (long long)micro * dp, lo = g / per * per, hi = lo + per;
    size_t k = 0;
    if (lo > 0) k += (size_t)snprintf(buf, n, "global_batch_size = %lld or %lld", lo, hi);
    else k += (size_t)snprintf(buf, n, "global_batch_size = %lld", hi);
    long long seqs = g % micro ? 0 : g / micro; // microbatches per step over all DP ranks
    int below = 0, above = 0;
    for (int d = dp - 1; d >= 1 && seqs && !below; d--)
        if (seqs % d == 0) below = d;
    for (long long d = dp + 1; d <= seqs && !above; d++)
        if (seqs % d == 0) above = (int)d;
    if (k >= n) return;
    if (below && above)
        snprintf(buf + k, n - k, "; or %d or %d ranks (dp = %d or %d)", below * model, above * model,
                 below, above);
    else if (below || above)
        snprintf(buf + k, n - k, "; or %d ranks (dp = %d)", (below + above) * model, below + above);
}

void config_fp8_skip(const struct config *cfg, int *first, int *last) {
    const struct precision_config *pc = &cfg->precision;
    *first = *last = 0;
    if (pc->fp8 == FP8_NONE) return;
    switch (pc->fp8_skip_layers) {
    case FP8_SKIP_NONE: break;
    case FP8_SKIP_FIRST: *first = 1; break;
    case FP8_SKIP_LAST: *last = 1; break;
    case FP8_SKIP_FIRST_LAST: *first = *last = 1; break;
    case FP8_SKIP_COUNT: *first = *last = (int)pc->fp8_skip_count; break;
    }
}

// [model] moe_* (src/model/moe.h): the layer's own shape rules, and what the
// MoE decoder does not compose with yet. Under tp the experts are not split
// (every TP rank runs the whole MoE layer: model_pass.c) and under pp the
// stage messages carry the routing for the load-balancing loss; recompute
// = selective | full re-runs what it does for dense blocks (full: the MoE
// layer too, model_pass.c moe_recompute); ZeRO-1 composes with ep (the
// experts' optimizer state over expert_dp, optimizer.h); ZeRO-2/3 at ep 1
// (the experts are a block unit's tensors like any other, sharded over the
// shard group); under cp each rank routes its own rows of every sequence,
// the load-balancing statistics summed over the cp ranks (model_pass.c).
// The split-backward schedules, ZeRO-2/3 under ep and FP8 come later:
// refused by name here.
static enum status check_moe(const struct config *cfg, const char *file, struct error *err) {
    const struct model_config *m = &cfg->model;
    const struct parallel_config *p = &cfg->parallel;
    const enum status bad = STATUS_BAD_INPUT;
    if (m->moe_experts == 0) {
        if (p->ep > 1)
            return error_set(err, bad, "%s: %s splits experts, but the model is dense: %s", file,
                             KT("parallel", "ep"), KT("model", "moe_experts"));
        return STATUS_OK;
    }
    if (p->ep > 1 && m->moe_experts % p->ep)
        return error_set(err, bad, "%s: ep must divide moe_experts (each ep rank holds "
                         "moe_experts / ep experts): %s; %s", file, KT("parallel", "ep"),
                         KT("model", "moe_experts"));
    // ZeRO-1 shards the experts' optimizer state over expert_dp (optimizer.h);
    // ZeRO-2/3's per-unit reduce-scatters and gathers run over one shard group
    // (fsdp.h), which cannot hold the dense and the expert tensors of a block
    if (p->ep > 1 && p->zero_stage >= 2)
        return error_set(err, bad, "%s: %s with %s: ZeRO-2/3 shard each block's tensors over one "
                         "group, but under ep the expert tensors' replicas are the expert_dp ranks, "
                         "not the data ranks; use zero_stage = 0 or 1", file, KT("parallel", "ep"),
                         KT("parallel", "zero_stage"));
    const char *later = "the mixture-of-experts decoder runs under dp, ep, tp (with or without "
                        "sequence parallelism), cp, pp (1f1b, interleaved or not), ZeRO-1 (ZeRO-2/3 "
                        "at ep 1) and any recompute for now; this comes later";
    if (m->moe_top_k > m->moe_experts)
        return error_set(err, bad, "%s: moe_top_k must be at most moe_experts: %s; %s", file,
                         KT("model", "moe_top_k"), KT("model", "moe_experts"));
    if (m->moe_first_dense_layers >= m->n_layers)
        return error_set(err, bad, "%s: moe_first_dense_layers must leave at least one MoE block "
                         "(< n_layers; else set moe_experts = 0): %s; %s", file,
                         KT("model", "moe_first_dense_layers"), KT("model", "n_layers"));
    if (m->moe_shared_experts == 0 && m->moe_shared_ffn_dim)
        return error_set(err, bad, "%s: moe_shared_ffn_dim is set without a shared expert: %s; %s",
                         file, KT("model", "moe_shared_ffn_dim"), KT("model", "moe_shared_experts"));
    // the interleaved schedule is 1f1b's table at virtual_stages > 1 (pipeline.h), which runs
    if (pipeline_schedule_splits(p->pp_schedule))
        return error_set(err, bad, "%s: %s with %s (the split B/W backward is not built for the "
                         "MoE layer): %s", file, KT("model", "moe_experts"),
                         KT("parallel", "pp_schedule"), later);
    if (cfg->precision.fp8 != FP8_NONE)
        return error_set(err, bad, "%s: %s with %s (the expert GEMMs have no FP8 path): %s", file,
                         KT("model", "moe_experts"), KT("precision", "fp8"), later);
    return STATUS_OK;
}

int config_unread_keys(const struct config *cfg, char *buf, size_t n) {
    // The keys only the FP8 linear layers read (docs/design.md §5 "FP8").
    static const char *const fp8_keys[] = {"fp8_scaling", "fp8_amax_history_len", "fp8_amax_compute",
                                           "fp8_margin", "fp8_skip_layers"};
    buf[0] = '\0';
    if (cfg->precision.fp8 != FP8_NONE) return 0;
    // Against the default, as check_rope_scaling: a run folder's config.ini
    // writes every key, and its defaults must load without a warning.
    struct config def;
    config_defaults(&def);
    int count = 0;
    size_t len = 0;
    for (size_t k = 0; k < sizeof fp8_keys / sizeof fp8_keys[0] && len < n; k++) {
        int i = config_key_index("precision", fp8_keys[k]);
        CHECK(i >= 0, "no key precision.%s", fp8_keys[k]);
        char a[CONFIG_PATH_MAX + 16], b[CONFIG_PATH_MAX + 16];
        if (!strcmp(config_format_value(cfg, i, a, sizeof a), config_format_value(&def, i, b, sizeof b)))
            continue;
        len += (size_t)snprintf(buf + len, n - len, "%s%s", count ? ", " : "", KT("precision", fp8_keys[k]));
        count++;
    }
    if (count && len < n)
        snprintf(buf + len, n - len, ": %s no effect with %s; only FP8 linear layers read %s "
                 "(precision.fp8 = hybrid or e4m3)", count > 1 ? "have" : "has", KT("precision", "fp8"),
                 count > 1 ? "them" : "it");
    return count;
}

// [precision] fp8 (docs/design.md §5 "FP8"): on top of bf16 only (the FP8
// GEMMs read BF16 activations and write BF16 outputs, and the scales assume
// fp32's exponent range: no fp16 loss scale under them), a whole count of
// blocks to keep in bf16, and at least one block left in FP8.
static enum status check_fp8(const struct config *cfg, const char *file, struct error *err) {
    const struct precision_config *pc = &cfg->precision;
    const enum status bad = STATUS_BAD_INPUT;
    if (pc->fp8 == FP8_NONE) return STATUS_OK;
    if (pc->dtype != DTYPE_BF16)
        return error_set(err, bad, "%s: %s needs precision.dtype = bf16 (FP8 linear layers read and write bf16 "
                         "activations; fp32 and fp16 models have no FP8 path): %s", file, KT("precision", "fp8"),
                         KT("precision", "dtype"));
    if (pc->fp8_skip_layers == FP8_SKIP_COUNT && pc->fp8_skip_count != floor(pc->fp8_skip_count))
        return error_set(err, bad, "%s: %s: a count of blocks must be a whole number (or none, first, last, "
                         "first,last)", file, KT("precision", "fp8_skip_layers"));
    int first, last;
    config_fp8_skip(cfg, &first, &last);
    if ((long long)first + last >= cfg->model.n_layers)
        return error_set(err, bad, "%s: %s keeps the first %d and the last %d blocks in bf16: with %s no block "
                         "is left in FP8 (set precision.fp8 = none instead, or skip fewer blocks); %s", file,
                         KT("precision", "fp8_skip_layers"), first, last, KT("model", "n_layers"),
                         KT("precision", "fp8"));
    return STATUS_OK;
}

enum status config_resolve_dp(struct config *cfg, int world_size, struct error *err) {
    struct parallel_config *p = &cfg->parallel;
    const struct train_config *t = &cfg->train;
    const char *file = cfg->file[0] ? cfg->file : "config";
    if (p->dp != 0) return STATUS_OK;
    if (world_size <= 0) {
        p->dp = 1;
        return STATUS_OK;
    }
    // ranks of one data rank: tp * cp * pp (the layout at dp = 1)
    struct grid_layout one = topology_layout(p->tp, p->pp, 1, 0, p->cp);
    int model = topology_world_size(&one);
    if (world_size % model) {
        int lo = world_size / model * model, hi = lo + model;
        char hint[32];
        snprintf(hint, sizeof hint, " or %d", hi);
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: parallel.dp = 0 infers dp = ranks / (tp * cp * pp), but N = %d ranks is "
                         "not a multiple of tp * cp * pp = %d (%s; %s; %s): run on %d%s ranks, or set "
                         "tp, cp and pp so that tp * cp * pp divides %d", file, world_size, model,
                         KT("parallel", "tp"), KT("parallel", "cp"), KT("parallel", "pp"), lo ? lo : hi,
                         lo ? hint : "", world_size);
    }
    int dp = world_size / model;
    if (loader_microbatches(t->global_batch_size, t->micro_batch_size, dp) == 0) {
        char hint[256];
        batch_hint(t->global_batch_size, t->micro_batch_size, dp, model, hint, sizeof hint);
        return error_set(err, STATUS_BAD_INPUT,
                         "%s: parallel.dp = 0 infers dp = %d ranks / (tp %d * cp %d * pp %d) = %d, but "
                         "global_batch_size must be a multiple of micro_batch_size * dp = %lld: %s; %s. "
                         "Nearest that work: %s", file, world_size, p->tp, p->cp, p->pp, dp,
                         (long long)t->micro_batch_size * dp, KT("train", "global_batch_size"),
                         KT("train", "micro_batch_size"), hint);
    }
    p->dp = dp;
    return STATUS_OK;
}

// Finite values that break fp32 arithmetic by what they do, refused before
// any work instead of found as a NaN at step 1 (docs/config.md "Values that
// overflow fp32"). The bounds are per-key limits of this class only (the
// keys' plain ranges are in config_keys.c). The checks:
// - keys the model and the optimizer hold in fp32 (init_std, norm_eps, lr,
//   min_lr, weight_decay, adam_eps, grad_clip, label_smoothing, the loss
//   scale keys) must be <= FLT_MAX, and the ones that must be positive (a
//   divisor's epsilon, lr, init_std) >= FLT_MIN: below it they flush to a
//   subnormal or to 0 (adam_eps 0: 0/0 where v = 0; norm_eps 0: 1/sqrt(0));
// - the weights' scale w = max(init_std, lr) (AdamW moves each weight by about
//   lr a step: Kingma & Ba 2015 §2.1) must leave the first layer's attention
//   scores finite: q.k ~ w^2 x d_model x head size (a normalised row of norm
//   sqrt(C) times a matrix of std w, twice, summed over D), with 10^6 of
//   headroom for the tails of the init and growth over the layers: w^2 C D <=
//   FLT_MAX x 1e-6;
// - rope_theta > 1: RoPE's frequencies theta^(-2i/D) (Su et al. 2021, §3.2.2)
//   must decrease; below 1 they grow and the angles overflow.
// [model] rope_scaling and its parameters (Hugging Face's rope_scaling,
// transformers' modeling_rope_utils.py): llama3 needs rope_high_freq_factor >
// rope_low_freq_factor (the smooth band between the two wavelengths divides
// by their difference); a parameter key set to another value than its
// default for a scaling that does not read it is refused (it would change
// nothing; the default itself is let through, so a run folder's config.ini,
// which writes every key, loads again).
static enum status check_rope_scaling(const struct config *cfg, const char *file, struct error *err) {
    const struct model_config *m = &cfg->model;
    static const struct { const char *key; unsigned used_by; } params[] = {
        {"rope_scaling_factor", 1u << ROPE_SCALING_LINEAR | 1u << ROPE_SCALING_LLAMA3},
        {"rope_low_freq_factor", 1u << ROPE_SCALING_LLAMA3},
        {"rope_high_freq_factor", 1u << ROPE_SCALING_LLAMA3},
        {"rope_original_max_pos", 1u << ROPE_SCALING_LLAMA3},
    };
    const double values[] = {m->rope_scaling_factor, m->rope_low_freq_factor, m->rope_high_freq_factor,
                             m->rope_original_max_pos};
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        if (params[i].used_by & 1u << m->rope_scaling) continue;
        if (values[i] != strtod(config_keys[config_key_index("model", params[i].key)].def, NULL))
            return error_set(err, STATUS_BAD_INPUT, "%s: %s is not read by %s (set rope_scaling to one "
                             "that uses it, or leave it out)", file, KT("model", params[i].key),
                             KT("model", "rope_scaling"));
    }
    if (m->rope_scaling == ROPE_SCALING_LLAMA3 && m->rope_high_freq_factor <= m->rope_low_freq_factor)
        return error_set(err, STATUS_BAD_INPUT, "%s: rope_scaling = llama3 needs rope_high_freq_factor > "
                         "rope_low_freq_factor (Hugging Face's _compute_llama3_parameters divides by their "
                         "difference): %s; %s", file, KT("model", "rope_high_freq_factor"),
                         KT("model", "rope_low_freq_factor"));
    return STATUS_OK;
}

static enum status check_fp32(const struct config *cfg, const char *file, struct error *err) {
    static const struct { const char *section, *key; bool positive; } fp32_keys[] = {
        {"model", "init_std", true},     {"model", "norm_eps", true},
        {"train", "lr", true},           {"train", "min_lr", false},
        {"train", "weight_decay", false}, {"train", "adam_eps", true},
        {"train", "grad_clip", false},   {"train", "label_smoothing", false},
        {"precision", "loss_scale_initial", false}, {"precision", "loss_scale_min", false},
    };
    const double values[] = {cfg->model.init_std, cfg->model.norm_eps, cfg->train.lr, cfg->train.min_lr,
                             cfg->train.weight_decay, cfg->train.adam_eps, cfg->train.grad_clip,
                             cfg->train.label_smoothing, cfg->precision.loss_scale_initial,
                             cfg->precision.loss_scale_min};
    const enum status bad = STATUS_BAD_INPUT;
    for (size_t i = 0; i < sizeof fp32_keys / sizeof fp32_keys[0]; i++) {
        double v = fabs(values[i]);
        if (v > FLT_MAX)
            return error_set(err, bad, "%s: %s overflows fp32 (it is held as a float): the limit is %g "
                             "(FLT_MAX)", file, KT(fp32_keys[i].section, fp32_keys[i].key), (double)FLT_MAX);
        if (fp32_keys[i].positive && v < FLT_MIN)
            return error_set(err, bad, "%s: %s underflows fp32 (to a subnormal or 0: a division by it "
                             "or by a zero weight gives inf or NaN): the limit is >= %g (FLT_MIN)", file,
                             KT(fp32_keys[i].section, fp32_keys[i].key), (double)FLT_MIN);
    }
    const struct model_config *m = &cfg->model;
    double C = m->d_model, D = config_head_dim(m), limit = FLT_MAX * 1e-6;
    double w = fmax(m->init_std, cfg->train.lr), max_w = sqrt(limit / (C * D));
    if (w * w * C * D > limit) {
        bool std = m->init_std >= cfg->train.lr;
        return error_set(err, bad, "%s: %s makes the first layer's attention scores overflow fp32: "
                         "%s^2 x d_model x head size = %.3g must be <= %.3g (FLT_MAX x 1e-6), i.e. %s <= "
                         "%.3g at d_model = %d, head size %d", file,
                         std ? KT("model", "init_std") : KT("train", "lr"), std ? "init_std" : "lr",
                         w * w * C * D, limit, std ? "init_std" : "lr", max_w, m->d_model, (int)D);
    }
    if (m->rope_theta <= 1)
        return error_set(err, bad, "%s: %s: the limit is > 1 (RoPE's frequencies theta^(-2i/D) must "
                         "decrease; below 1 they grow and the angles overflow)", file, KT("model", "rope_theta"));
    return STATUS_OK;
}

enum status config_validate(struct config *cfg, int world_size, bool has_cuda, struct error *err) {
    enum status rs = config_resolve_dp(cfg, world_size, err);
    if (rs) return rs;
    const struct model_config *m = &cfg->model;
    const struct train_config *t = &cfg->train;
    const struct parallel_config *p = &cfg->parallel;
    const char *file = cfg->file[0] ? cfg->file : "config";
    const enum status bad = STATUS_BAD_INPUT;

    if (cfg->data.paths[0]) {
        char origin[CONFIG_PATH_MAX + 32];
        if (strcmp(config_origin(cfg, config_key_index("data", "path"), origin, sizeof origin), "default"))
            return error_set(err, bad, "%s: set one of [data] path and paths, not both (%s; %s)", file,
                             KT("data", "path"), KT("data", "paths"));
        struct blend_spec *b = xmalloc(sizeof *b);
        char key[CONFIG_PATH_MAX + 64];
        snprintf(key, sizeof key, "%s: [data] paths", file);
        enum status s = blend_parse(key, cfg->data.paths, b, err);
        free(b);
        if (s) return s;
    }

    if (p->dp_shard && p->dp % p->dp_shard)
        return error_set(err, bad, "%s: dp_shard must divide dp (dp_replicate = dp / dp_shard "
                         "replicas of each shard group): %s; %s", file, KT("parallel", "dp_shard"),
                         KT("parallel", "dp"));
    if (p->ep > 1 && (p->dp_shard ? p->dp_shard : p->dp) % p->ep && p->dp)
        return error_set(err, bad, "%s: ep must divide the data-parallel ranks (dp, or dp_shard "
                         "when set: the expert-parallel ranks are consecutive data ranks inside "
                         "a shard group): %s; %s; %s", file, KT("parallel", "ep"),
                         KT("parallel", "dp"), KT("parallel", "dp_shard"));
    struct grid_layout grid = config_grid(cfg);
    if (world_size > 0 && topology_world_size(&grid) != world_size) {
        // Every size of the layout and every [parallel] key among them.
        char sizes[256], keys[1024] = "";
        const char *names[GROUP_COUNT];
        int values[GROUP_COUNT], n = topology_layout_sizes(&grid, false, names, values);
        for (int i = 0, len = 0; i < n; i++)
            if (config_key_index("parallel", names[i]) >= 0 && len < (int)sizeof keys)
                len += snprintf(keys + len, sizeof keys - (size_t)len, "%s%s", len ? "; " : "",
                                KT("parallel", names[i]));
        return error_set(err, bad,
                         "%s: the layout's sizes must multiply to the number of ranks: %s give %d, "
                         "but the world size is N = %d ranks (%s)", file,
                         topology_layout_text(&grid, true, " = ", " x ", sizes, sizeof sizes),
                         topology_world_size(&grid), world_size, keys);
    }
    enum status fs = check_fp32(cfg, file, err);
    if (fs) return fs;
    const struct precision_config *pc = &cfg->precision;
    if (pc->loss_scale_min > pc->loss_scale_initial)
        return error_set(err, bad, "%s: the fp16 loss scale starts below its floor: %s; %s", file,
                         KT("precision", "loss_scale_initial"), KT("precision", "loss_scale_min"));
    enum status f8 = check_fp8(cfg, file, err);
    if (f8) return f8;
    enum status moe = check_moe(cfg, file, err);
    if (moe) return moe;
    if (m->n_heads % m->n_kv_heads)
        return error_set(err, bad, "%s: n_heads must be a multiple of n_kv_heads (grouped-query attention): %s; %s",
                         file, KT("model", "n_heads"), KT("model", "n_kv_heads"));
    if (!m->head_dim && m->d_model % m->n_heads)
        return error_set(err, bad, "%s: d_model must be a multiple of n_heads (or set head_dim): %s; %s; %s",
                         file, KT("model", "d_model"), KT("model", "n_heads"), KT("model", "head_dim"));
    if (!m->head_dim && (m->d_model / m->n_heads) % 2)
        return error_set(err, bad, "%s: head size d_model / n_heads = %d must be even for RoPE: %s; %s", file,
                         m->d_model / m->n_heads, KT("model", "d_model"), KT("model", "n_heads"));
    if (m->head_dim % 2)
        return error_set(err, bad, "%s: head size must be even for RoPE: %s", file, KT("model", "head_dim"));
    enum status rope = check_rope_scaling(cfg, file, err);
    if (rope) return rope;
    if (m->n_heads % p->tp)
        return error_set(err, bad, "%s: n_heads must be a multiple of tp (heads are split over the TP group): %s; %s",
                         file, KT("model", "n_heads"), KT("parallel", "tp"));
    if (m->n_kv_heads % p->tp && p->tp % m->n_kv_heads)
        return error_set(err, bad,
                         "%s: n_kv_heads must be a multiple of tp, or tp a multiple of n_kv_heads (then KV heads "
                         "are replicated): %s; %s",
                         file, KT("model", "n_kv_heads"), KT("parallel", "tp"));
    if (m->ffn_dim % p->tp)
        return error_set(err, bad, "%s: ffn_dim must be a multiple of tp (gate/up are column-parallel): %s; %s", file,
                         KT("model", "ffn_dim"), KT("parallel", "tp"));
    long long chunks = (long long)p->pp * p->virtual_stages;
    if (m->n_layers < chunks)
        return error_set(err, bad,
                         "%s: n_layers must be at least pp * virtual_stages = %lld (one layer per model chunk): "
                         "%s; %s; %s",
                         file, chunks, KT("model", "n_layers"), KT("parallel", "pp"),
                         KT("parallel", "virtual_stages"));
    // Pipeline schedules (src/parallel/pipeline.h): the chunk counts each needs.
    if (p->pp_schedule != PP_SCHEDULE_1F1B && p->pp < 2)
        return error_set(err, bad, "%s: parallel.pp_schedule = %s needs pp >= 2 (a schedule of pipeline "
                         "stages): %s; %s", file, pipeline_schedule_name(p->pp_schedule),
                         KT("parallel", "pp_schedule"), KT("parallel", "pp"));
    if ((p->pp_schedule == PP_SCHEDULE_INTERLEAVED && p->virtual_stages < 2) ||
        (p->pp_schedule == PP_SCHEDULE_ZB_H1 && p->virtual_stages != 1) ||
        (p->pp_schedule == PP_SCHEDULE_ZBV && p->virtual_stages != 2))
        return error_set(err, bad, "%s: parallel.pp_schedule = %s needs virtual_stages %s: %s; %s", file,
                         pipeline_schedule_name(p->pp_schedule),
                         p->pp_schedule == PP_SCHEDULE_INTERLEAVED ? ">= 2"
                         : p->pp_schedule == PP_SCHEDULE_ZB_H1   ? "= 1 (one chunk per stage)"
                                                                 : "= 2 (the V's two chunks per stage)",
                         KT("parallel", "pp_schedule"), KT("parallel", "virtual_stages"));
    if (pipeline_schedule_splits(p->pp_schedule) && cfg->precision.fp8 != FP8_NONE)
        return error_set(err, bad, "%s: parallel.pp_schedule = %s splits the backward into input and weight "
                         "gradients, which the FP8 GEMMs do not yet: %s; %s", file,
                         pipeline_schedule_name(p->pp_schedule), KT("parallel", "pp_schedule"),
                         KT("precision", "fp8"));
    if (p->pp_schedule == PP_SCHEDULE_ZBV && p->zero_stage >= 2 && m->tie_embeddings)
        return error_set(err, bad, "%s: parallel.pp_schedule = zbv puts the embedding and the head on stage 0, "
                         "where ZeRO-2/3 do not yet sum a tied embedding's two gradients (use "
                         "tie_embeddings = false, zero_stage 0 or 1, or another schedule): %s; %s; %s", file,
                         KT("parallel", "pp_schedule"), KT("parallel", "zero_stage"), KT("model", "tie_embeddings"));
    long long per_step = (long long)t->micro_batch_size * p->dp;
    if (loader_microbatches(t->global_batch_size, t->micro_batch_size, p->dp) == 0) {
        char hint[256];
        struct grid_layout one = topology_layout(p->tp, p->pp, 1, 0, p->cp);
        batch_hint(t->global_batch_size, t->micro_batch_size, p->dp, topology_world_size(&one), hint,
                   sizeof hint);
        return error_set(err, bad,
                         "%s: global_batch_size must be a multiple of micro_batch_size * dp = %lld (gradient "
                         "accumulation = global / (micro * dp)): %s; %s; %s. Nearest that work: %s",
                         file, per_step, KT("train", "global_batch_size"), KT("train", "micro_batch_size"),
                         KT("parallel", "dp"), hint);
    }
    // ZeRO-2/3 (src/train/fsdp.h): what they cannot do yet.
    if (p->zero_stage >= 2 && m->tie_embeddings && p->pp == 1 && p->virtual_stages > 1)
        return error_set(err, bad, "%s: parallel.zero_stage = %d with model.tie_embeddings = true needs "
                         "parallel.virtual_stages = 1 when pp = 1 (the head's chunk and the embedding's chunk "
                         "on one rank, not implemented): %s; %s; %s", file, p->zero_stage,
                         KT("parallel", "zero_stage"), KT("model", "tie_embeddings"), KT("parallel", "virtual_stages"));
    if (t->seq_len > m->max_seq_len)
        return error_set(err, bad, "%s: seq_len must be <= max_seq_len: %s; %s", file, KT("train", "seq_len"),
                         KT("model", "max_seq_len"));
    // Context parallelism (docs/design.md §4, "Context parallelism"): 2 cp
    // chunks of equal length per sequence.
    if (p->cp > 1 && t->seq_len % (2 * p->cp))
        return error_set(err, bad, "%s: seq_len must be a multiple of 2 * cp = %d (each sequence is cut into "
                         "2 cp equal chunks, rank r holding chunks r and 2 cp - 1 - r): %s; %s", file,
                         2 * p->cp, KT("train", "seq_len"), KT("parallel", "cp"));
    if (p->sequence_parallel && t->seq_len / p->cp % p->tp)
        return error_set(err, bad, "%s: with sequence_parallel, seq_len / cp (a rank's tokens of a sequence) "
                         "must be a multiple of tp: %s; %s; %s", file, KT("train", "seq_len"),
                         KT("parallel", "tp"), KT("parallel", "cp"));
    if (t->min_lr > t->lr)
        return error_set(err, bad, "%s: min_lr must be <= lr: %s; %s", file, KT("train", "min_lr"), KT("train", "lr"));
    if (t->warmup_steps > t->steps)
        return error_set(err, bad, "%s: warmup_steps must be <= steps: %s; %s", file, KT("train", "warmup_steps"),
                         KT("train", "steps"));
    if (t->sample_top_k > m->vocab_size)
        return error_set(err, bad, "%s: sample_top_k must be <= vocab_size: %s; %s", file,
                         KT("train", "sample_top_k"), KT("model", "vocab_size"));
    if (cfg->system.device == DEVICE_CUDA && !has_cuda)
        return error_set(err, bad, "%s: %s: this build has no CUDA backend; rebuild with `make CUDA=1` or set "
                         "system.device = cpu", file, KT("system", "device"));
    if (cfg->system.attention == ATTENTION_CUDNN && cfg->system.device != DEVICE_CUDA)
        return error_set(err, bad, "%s: %s needs system.device = cuda (cuDNN is the CUDA backend's); %s", file,
                         KT("system", "attention"), KT("system", "device"));
    if (cfg->system.attention == ATTENTION_CUDNN && cfg->precision.dtype == DTYPE_FP32)
        return error_set(err, bad, "%s: %s runs bf16 and fp16 only (cuDNN's fused attention); fp32 always "
                         "uses the native kernels: set attention = auto or native, or a 16-bit dtype; %s", file,
                         KT("system", "attention"), KT("precision", "dtype"));
    // cuDNN's attention is not given document masks: concat_reset runs the
    // native kernels (docs/design.md §3), so requiring cuDNN cannot hold.
    if (cfg->system.attention == ATTENTION_CUDNN && cfg->data.packing == PACKING_CONCAT_RESET)
        return error_set(err, bad, "%s: %s with %s: cuDNN's attention is not given document masks (the "
                         "native kernels run them): set attention = auto or native, or packing = concat",
                         file, KT("system", "attention"), KT("data", "packing"));
    // The CUDA attention kernels (native and cuDNN) take head sizes up to 256.
    if (cfg->system.device == DEVICE_CUDA && config_head_dim(m) > CONFIG_CUDA_MAX_HEAD_DIM)
        return error_set(err, bad, "%s: head size %d: system.device = cuda takes at most "
                         "%d (the CUDA attention kernels); %s; %s; %s", file, config_head_dim(m),
                         CONFIG_CUDA_MAX_HEAD_DIM, KT("model", "head_dim"), KT("model", "d_model"),
                         KT("model", "n_heads"));
    // A run never throws its work away: [checkpoint] dir unset (its
    // default) saves into the run folder; `none` saves nothing
    // (docs/design.md §7).
    char *ck = cfg->checkpoint.dir;
    char origin[CONFIG_PATH_MAX + 32];
    if (!strcmp(ck, "none")) {
        ck[0] = '\0';
    } else if (!ck[0] && !strcmp(config_origin(cfg, config_key_index("checkpoint", "dir"), origin,
                                               sizeof origin), "default")) {
        if (strlen(cfg->log.run_dir) + sizeof "/checkpoints" > sizeof cfg->checkpoint.dir)
            return error_set(err, bad, "%s: %s: too long for its checkpoint folder %s/checkpoints "
                             "(set [checkpoint] dir)", file, KT("log", "run_dir"), cfg->log.run_dir);
        snprintf(ck, sizeof cfg->checkpoint.dir, "%.*s/checkpoints",
                 (int)(sizeof cfg->checkpoint.dir - sizeof "/checkpoints"), cfg->log.run_dir);
    }
    return STATUS_OK;
}

// plan_search.c: layout search and step-time prediction (plan_search.h); the
// model and its sources are in docs/planning.md.
#include "plan_search.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/moe.h"

// Datasheet numbers (docs/planning.md §3 cites them): dense bf16 and FP8
// tensor-core peaks, HBM bandwidth, NVLink per GPU one direction (half the
// quoted bidirectional figure; PCIe Gen5 x16 for H100-PCIe), one NIC per GPU
// (HDR 200 Gb/s on DGX A100, NDR 400 Gb/s on DGX H100/H200/B200), memory,
// multiprocessors; then the kernel efficiencies of the time model (gemm,
// gemm fp8, attention forward, attention backward, HBM), from the published
// measurements docs/planning.md §3 names.
#define AMPERE 0.66, 0.0, 0.70, 0.55, 0.80
#define HOPPER 0.62, 0.62, 0.65, 0.50, 0.80
static const struct plan_gpu presets[] = {
    {"A100-40G", 312e12, 0, 1.555e12, 300e9, 25e9, (size_t)40 << 30, 108, AMPERE},
    {"A100-80G", 312e12, 0, 2.039e12, 300e9, 25e9, (size_t)80 << 30, 108, AMPERE},
    {"H100-SXM", 989e12, 1979e12, 3.35e12, 450e9, 50e9, (size_t)80 << 30, 132, HOPPER},
    {"H100-PCIe", 756e12, 1513e12, 2.0e12, 64e9, 50e9, (size_t)80 << 30, 114, HOPPER},
    {"H800", 989e12, 1979e12, 3.35e12, 200e9, 50e9, (size_t)80 << 30, 132, HOPPER},
    {"H200", 989e12, 1979e12, 4.8e12, 450e9, 50e9, (size_t)141 << 30, 132, HOPPER},
    {"B200", 2250e12, 4500e12, 8.0e12, 900e9, 50e9, (size_t)180 << 30, 148, HOPPER},
};
#define N_PRESETS (int)(sizeof presets / sizeof presets[0])
#define PRESET_DEFAULT 2 // H100-SXM

// "3.35T", "450G", "450" (in unit), "80G" -> bytes or bytes/s.
static bool parse_amount(const char *s, double unit, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0)) return false;
    double mult = unit;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'T': mult = 1e12; break;
        case 'G': mult = 1e9; break;
        case 'M': mult = 1e6; break;
        default: return false;
        }
        if (end[1] && strcmp(end + 1, "B") && strcmp(end + 1, "B/s")) return false;
    }
    *out = v * mult;
    return true;
}

enum status plan_gpu_parse(const char *spec, struct plan_gpu *gpu, struct error *err) {
    *gpu = presets[PRESET_DEFAULT];
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            char name[64]; // "A100-80GB" = "A100-80G"
            snprintf(name, sizeof name, "%s", tok);
            int i = 0;
            size_t len = strlen(name);
            if (len > 2 && !strcasecmp(name + len - 2, "GB")) name[len - 1] = '\0';
            while (i < N_PRESETS && strcasecmp(presets[i].name, name)) i++;
            if (i == N_PRESETS)
                return error_set(err, STATUS_BAD_INPUT,
                                 "--gpu: unknown preset '%s' (A100-40G, A100-80G, H100-SXM, H100-PCIe, H800, "
                                 "H200, B200, or tflops=..,fp8=..,hbm=..,nvlink=..,ib=..,mem=..)", tok);
            *gpu = presets[i];
            continue;
        }
        *eq = '\0';
        const char *k = tok, *v = eq + 1;
        double x;
        bool ok;
        if (!strcmp(k, "tflops")) ok = parse_amount(v, 1e12, &x) && (gpu->peak_flops = x, true);
        else if (!strcmp(k, "fp8")) ok = parse_amount(v, 1e12, &x) && (gpu->fp8_flops = x, true);
        else if (!strcmp(k, "hbm")) ok = parse_amount(v, 1e12, &x) && (gpu->hbm_bw = x, true);
        else if (!strcmp(k, "nvlink")) ok = parse_amount(v, 1e9, &x) && (gpu->nvlink_bw = x, true);
        else if (!strcmp(k, "ib")) ok = parse_amount(v, 1e9, &x) && (gpu->ib_bw = x, true);
        else if (!strcmp(k, "mem")) ok = parse_amount(v, 1e9, &x) && (gpu->mem_bytes = (size_t)(x / 1e9 * 1073741824.0), true);
        else
            return error_set(err, STATUS_BAD_INPUT, "--gpu: unknown key '%s' (tflops, fp8, hbm, nvlink, ib, mem)",
                             k);
        if (!ok) return error_set(err, STATUS_BAD_INPUT, "--gpu: %s=%s is not a positive amount", k, v);
        snprintf(gpu->name, sizeof gpu->name, "custom");
    }
    return STATUS_OK;
}

// Ring all-reduce of bytes over n ranks at bus bandwidth bw (NCCL's
// busbw = algbw * 2 (n-1) / n) plus 2 (n-1) latency steps.
static double t_all_reduce(double bytes, int n, double bw, double alpha) {
    if (n <= 1) return 0;
    return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * alpha;
}

// Reduce-scatter or all-gather: half an all-reduce.
static double t_half(double bytes, int n, double bw, double alpha) {
    return t_all_reduce(bytes, n, bw, alpha) / 2;
}

void plan_cp_ring_exposed(int cp, double t_block_fwd, double t_kv, double *fwd_s, double *bwd_s) {
    *fwd_s = *bwd_s = 0;
    if (cp <= 1) return;
    *fwd_s = (cp - 1) * MAX(0, t_kv - t_block_fwd);
    *bwd_s = (cp - 1) * MAX(0, t_kv - 2 * t_block_fwd) + cp * t_kv;
}

int plan_nearest_batch(int B, int mb, int dp) {
    long per = (long)mb * dp, m = (B + per / 2) / per; // round half up
    return (int)(MAX(1, m) * per);
}

bool plan_batch_close(int B, int Bm) { return 10L * labs((long)Bm - B) <= B; }

double plan_gemm_s(const struct plan_gpu *g, double M, double N, double K, bool fp8) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    double tiles = ceil(M / PLAN_TILE_M) * ceil(N / PLAN_TILE_N);
    double waves = ceil(tiles / g->n_sm), wave_eff = tiles / (waves * g->n_sm);
    double peak = fp8 ? g->fp8_flops * g->gemm_eff_fp8 : g->peak_flops * g->gemm_eff;
    double t_compute = 2 * M * N * K / (peak * wave_eff);
    double t_memory = ((M * K + K * N) * (fp8 ? 1 : 2) + M * N * 2) / (g->hbm_bw * g->hbm_eff);
    return MAX(t_compute, t_memory);
}

double plan_attention_s(const struct plan_gpu *g, double flops_fwd, double block_len, double *bwd_s) {
    double shape = block_len / (block_len + PLAN_ATTN_HALF_LEN);
    *bwd_s = 2.5 * flops_fwd / (g->peak_flops * g->attn_bwd_eff * shape);
    return flops_fwd / (g->peak_flops * g->attn_fwd_eff * shape);
}

// One microbatch through one layer (and the head) on one rank, seconds
// (docs/planning.md §3, "Kernel model").
struct layer_times {
    double fwd, bwd;        // the whole layer: GEMMs, attention, memory-bound kernels, FP8 casts
    double bwd_w;           // of bwd: the weight-gradient GEMMs (a split schedule's W; the rest is B)
    double attn_fwd;        // of fwd: the attention kernel
    double selective;       // what selective recompute reruns: norms, q and k GEMMs, RoPE, attention, SwiGLU (dense)
    double head;            // the head's GEMMs and loss, forward and backward (last stage)
    double head_fwd, head_w; // of head: its forward GEMM and half the loss's traffic; its weight gradient
    double block_attn_fwd;  // one context-parallel block's attention forward (T / cp x T / cp)
    double weight_casts;    // casting this rank's block-linear weights to FP8, once a step
};

// Mixture of experts (docs/planning.md §3 and §8, issue 31): the shape
// of one MoE block's work on a rank routing Nm token rows (its N = mb T /
// cp: under tp every TP rank runs the whole layer on all N rows, the experts
// unsplit and the work replicated, as src/model runs it; Megatron-Core
// instead routes each rank's N / tp sequence-parallel rows) at layout l: rows = the (token,
// expert) assignments it keeps, moe_rows_max (N k dropless, min(N k, E
// capacity) with a capacity factor); a uniform router spreads them evenly,
// so each of its E / ep experts computes ep rows / E received rows and the
// rank rows in all; sent = the rows that leave the rank in one all-to-all,
// rows (ep - 1) / ep.
struct moe_shape {
    double Nm, rows, per_expert, sent;
    int local; // E / ep
};

static struct moe_shape moe_shape_of(const struct config *c, const struct llama_config *lc,
                                     const struct plan_layout *l) {
    struct moe_shape m = {0};
    if (!lc->moe_experts) return m;
    int cp = MAX(1, l->cp), ep = MAX(1, l->ep);
    int Nm = l->mb * (c->train.seq_len / cp);
    struct moe_config mc;
    model_moe_config(lc, &mc);
    m.Nm = Nm, m.rows = moe_rows_max(&mc, Nm), m.local = lc->moe_experts / ep;
    m.per_expert = m.rows * ep / lc->moe_experts;
    m.sent = m.rows * (ep - 1) / ep;
    return m;
}

// moe: the times of a MoE block (its MLP replaced by the router, the rank's
// E / ep experts over their received rows (moe_shape_of), the shared expert
// over the Nm rows; permute and combine through HBM), in bf16 (the expert
// GEMMs have no FP8 path).
static struct layer_times kernel_times(const struct config *c0, const struct llama_config *lc,
                                       const struct plan_gpu *g, const struct plan_layout *l, int n_layers_rank,
                                       bool moe) {
    struct config cm;
    const struct config *c = c0;
    if (moe) cm = *c0, cm.precision.fp8 = FP8_NONE, c = &cm;
    struct layer_times t = {0};
    int tp = l->tp, cp = l->cp;
    double C = lc->d_model, D = llama_head_dim(lc), Hl = lc->n_heads / tp, Hkvl = MAX(1, lc->n_kv_heads / tp);
    double HD = Hl * D, KD = Hkvl * D, F = (double)lc->ffn_dim / tp, V = ceil((double)lc->vocab_size / tp);
    double Tl = (double)c->train.seq_len / cp, T = c->train.seq_len, N = l->mb * Tl;
    bool sp = tp > 1 && c->train.seq_len / cp % tp == 0;
    double Ns = sp ? N / tp : N, dt = dtype_size(c->precision.dtype);
    bool fp8 = c->precision.fp8 != FP8_NONE;
    double hbm = g->hbm_bw * g->hbm_eff;
    // The block's GEMMs (out = in (N, K) x W (K, Nout)): QKV, o, gate, up, down.
    double gemm[5][2] = {{C, HD + 2 * KD}, {HD, C}, {C, F}, {C, F}, {F, C}};
    double g_fwd = 0, g_bwd = 0, g_w = 0;
    for (int i = 0; i < (moe ? 2 : 5); i++) { // a MoE block: attention's two here, its MLP below
        double K = gemm[i][0], Nout = gemm[i][1];
        g_fwd += plan_gemm_s(g, N, Nout, K, fp8);
        g_bwd += plan_gemm_s(g, N, K, Nout, fp8); // dgrad (B)
        g_w += plan_gemm_s(g, K, Nout, N, fp8);   // wgrad (W)
    }
    // The MoE block's MLP: router (Nm, E) = x Wr^T; each local expert's gate,
    // up (r, Fe) and down (r, C) over its r received rows; the shared expert
    // (Nm rows, width Fs). Elementwise: SwiGLU over the kept rows' Fe (and
    // Nm rows' Fs), and the permute and combine (rows of C gathered and
    // scattered: read + write twice each way).
    double moe_ew = 0, moe_ew_b = 0, moe_act = 0; // elements through HBM; SwiGLU's rows x width
    if (moe) {
        struct moe_shape ms = moe_shape_of(c, lc, l);
        double E = lc->moe_experts, Fe = llama_moe_ffn(lc), Fs = llama_moe_shared_ffn(lc), r = ms.per_expert;
        double eg[4][4] = {{ms.Nm, C, E, 1}, {r, C, Fe, 2 * ms.local}, {r, Fe, C, ms.local}, // N, K, Nout, count
                           {ms.Nm, C, Fs, Fs > 0 ? 2 : 0}};
        double sh_down[4] = {ms.Nm, Fs, C, Fs > 0 ? 1 : 0};
        for (int i = 0; i < 5; i++) {
            const double *e = i < 4 ? eg[i] : sh_down;
            if (!e[3]) continue;
            g_fwd += e[3] * plan_gemm_s(g, e[0], e[2], e[1], false);
            g_bwd += e[3] * plan_gemm_s(g, e[0], e[1], e[2], false);
            g_w += e[3] * plan_gemm_s(g, e[1], e[2], e[0], false);
        }
        moe_act = ms.rows * Fe + ms.Nm * Fs;
        moe_ew = 4 * ms.rows * C, moe_ew_b = moe_ew;
    }
    g_bwd += g_w;
    // Attention: QK^T and AV of the rank's N queries against T keys, the causal half.
    double attn_flops = 2.0 * l->mb * Tl * T * HD, attn_bwd;
    t.attn_fwd = plan_attention_s(g, attn_flops, Tl, &attn_bwd);
    double blk_bwd;
    t.block_attn_fwd = plan_attention_s(g, 2.0 * l->mb * Tl * Tl * HD, Tl, &blk_bwd);
    // Memory-bound kernels, elements through HBM: norms and residual adds on
    // Ns rows of C, RoPE on q and k, SwiGLU on N rows of F.
    double act_fwd = moe ? 3 * moe_act : 3 * N * F, act_bwd = moe ? 5 * moe_act : 5 * N * F; // SwiGLU
    double ew_fwd = dt * (10 * C * Ns + N * 2 * (HD + KD) + act_fwd + moe_ew) / hbm;
    double ew_bwd = dt * (10 * C * Ns + N * 2 * (HD + KD) + act_bwd + moe_ew_b) / hbm;
    // FP8 casts as src/model runs them (model_fp8.c), bytes an element: a
    // cast reads 2 and writes 1, current scaling reads 2 more for the amax
    // first (per = 5; delayed: the fused cast + amax, 3). Forward: the GEMM
    // inputs x (ln1, att, ln2, act). Backward: the output gradients dy, the
    // inputs again for the weight gradient (same scale: 3), and the K-major
    // copies cuBLASLt's TN-only FP8 GEMMs need (read 1, write 1): x and dy
    // for the weight gradient, the weights for the input gradient. The
    // weights are cast once a step.
    double cast_fwd = 0, cast_bwd = 0, per = c->precision.fp8_scaling == FP8_SCALING_DELAYED ? 3 : 5;
    if (fp8) {
        double x_in = N * (2 * C + HD + F), dy = N * ((HD + 2 * KD) + 2 * C + 2 * F);
        double lin = C * (HD + 2 * KD) + HD * C + 3 * C * F;
        cast_fwd = per * x_in / hbm;
        cast_bwd = (per * dy + 3 * x_in + 2 * (x_in + dy) + 2 * lin) / hbm;
        t.weight_casts = n_layers_rank * lin * per / hbm;
    }
    t.fwd = g_fwd + t.attn_fwd + ew_fwd + cast_fwd;
    t.bwd = g_bwd + attn_bwd + ew_bwd + cast_bwd;
    t.bwd_w = g_w; // the FP8 casts stay in B (a split schedule refuses FP8: config_validate)
    // selective: a MoE block keeps its layer's activations (its experts' SwiGLU not rerun)
    t.selective = plan_gemm_s(g, N, HD + KD, C, fp8) + t.attn_fwd +
                  dt * (4 * C * Ns + N * 2 * (HD + KD) + (moe ? 0 : act_fwd)) / hbm +
                  (fp8 ? per * N * (C + F) / hbm : 0);
    t.head_fwd = plan_gemm_s(g, N, V, C, false) + dt * 2 * N * V / hbm;
    t.head_w = plan_gemm_s(g, C, V, N, false);
    t.head = t.head_fwd + plan_gemm_s(g, N, C, V, false) + t.head_w + dt * 2 * N * V / hbm;
    return t;
}

// The last pipeline simulated and its terms: plan_search's variants of one
// layout that differ in their ZeRO stage alone have the same ops.
struct sim_memo {
    bool valid;
    enum pp_schedule kind;
    int p, m, v;
    struct pp_costs op;
    double bubble_s, comm_s, bubble;
};

// The pipeline terms of kind on p stages, m microbatches, v chunks a stage,
// ops costing op (seconds): the schedule simulated with comm 0 gives the
// bubble (*bubble_s = makespan - the busiest stage's op time; *bubble its
// fraction, pp_sim.bubble), and again with op->comm the point-to-point time
// that stays exposed (*comm_s = the makespan it adds). False with why set
// when the simulator refuses.
static bool pipeline_terms(enum pp_schedule kind, int p, int m, int v, const struct pp_costs *op,
                           struct sim_memo *memo, double *bubble_s, double *comm_s, double *bubble, char *why,
                           size_t why_len) {
    if (memo && memo->valid && memo->kind == kind && memo->p == p && memo->m == m && memo->v == v &&
        !memcmp(&memo->op, op, sizeof *op)) {
        *bubble_s = memo->bubble_s, *comm_s = memo->comm_s, *bubble = memo->bubble;
        return true;
    }
    if (p > PIPELINE_SIM_MAX_STAGES) {
        snprintf(why, why_len, "pp %d: the schedule simulator takes at most %d stages", p, PIPELINE_SIM_MAX_STAGES);
        return false;
    }
    struct pp_sim s0, s1;
    struct pp_costs c0 = *op;
    c0.comm = 0;
    struct error err = {0};
    if (pipeline_simulate(kind, p, m, v, &c0, &s0, &err) ||
        (op->comm > 0 && pipeline_simulate(kind, p, m, v, op, &s1, &err))) {
        snprintf(why, why_len, "%.150s", err.msg);
        return false;
    }
    double busy = 0;
    for (int i = 0; i < p; i++) busy = MAX(busy, s0.busy[i]);
    *bubble_s = s0.makespan - busy, *bubble = s0.bubble;
    *comm_s = op->comm > 0 ? s1.makespan - s0.makespan : 0;
    if (memo)
        *memo = (struct sim_memo){.valid = true, .kind = kind, .p = p, .m = m, .v = v, .op = *op,
                                  .bubble_s = *bubble_s, .comm_s = *comm_s, .bubble = *bubble};
    return true;
}

static bool predict(const struct config *c0, const struct plan_cluster *cl, struct plan_layout *l, char *why,
                    size_t why_len, struct sim_memo *memo) {
    struct config c = *c0;
    if (l->cp < 1) l->cp = 1;
    c.parallel.tp = l->tp, c.parallel.pp = l->pp, c.parallel.dp = l->dp;
    c.parallel.cp = l->cp;
    if (l->ep < 1) l->ep = 1;
    c.parallel.ep = l->ep;
    if (l->zero >= 2 && l->dp_shard <= 0) l->dp_shard = l->dp; // 0: the whole of dp
    // ZeRO-2/3's shard group (hybrid sharding below dp) and reshard policy
    c.parallel.dp_shard = l->zero >= 2 && l->dp_shard < l->dp ? l->dp_shard : 0;
    c.parallel.reshard_after_forward = !l->keep_gathered;
    c.parallel.virtual_stages = l->v, c.parallel.zero_stage = l->zero;
    c.parallel.sequence_parallel = l->tp > 1 && c.train.seq_len / l->cp % l->tp == 0;
    c.train.micro_batch_size = l->mb;
    if (l->global_batch > 0) c.train.global_batch_size = l->global_batch; // the nearest that divides
    c.model.recompute = l->recompute;
    c.parallel.pp_schedule = l->schedule;
    struct error err = {0};
    // What the trainer refuses (config_validate: a combination it cannot run)
    // the search does not offer.
    if (config_validate(&c, cl->gpus, true, &err)) { // tp pp dp = the cluster's GPUs
        l->peak_bytes = 0;
        snprintf(why, why_len, "%.150s", err.msg);
        return false;
    }
    size_t peak = 0, n_params = 0, unit = 0, n_expert = 0;
    int S = plan_sharding_of(&c).shard_ranks;
    // Tensor-parallel ranks of a stage hold the same bytes (tp <= n_kv_heads): rank 0 of each stage.
    for (int p = 0; p < l->pp; p++) {
        struct plan_rank_bytes b;
        struct grid_coord at = {{0}};
        at.at[AXIS_PP] = p;
        if (plan_rank(&c, at, &b, &err)) {
            snprintf(why, why_len, "%.150s", err.msg);
            return false;
        }
        if (plan_rank_total(&b) > peak) peak = plan_rank_total(&b);
        n_params = MAX(n_params, b.n_params);
        n_expert = MAX(n_expert, b.expert_params);
        unit = MAX(unit, b.unit_elems);
    }
    l->peak_bytes = peak;
    size_t usable = cl->gpu.mem_bytes > cl->reserve_bytes ? cl->gpu.mem_bytes - cl->reserve_bytes : 0;
    if (peak > usable) {
        snprintf(why, why_len, "needs %.1f GiB, %.1f GiB over the %.1f GiB usable", peak / 1073741824.0,
                 (peak - usable) / 1073741824.0, usable / 1073741824.0);
        return false;
    }
    struct llama_config lc = plan_llama(&c);
    struct grid_layout grid = config_grid(&c);
    int N = topology_world_size(&grid), T = c.train.seq_len, L = lc.n_layers;
    int m = c.train.global_batch_size / (l->mb * l->dp), cp = l->cp, G = l->dp * cp; // G: the gradient group
    l->global_batch = c.train.global_batch_size;
    double tokens = (double)c.train.global_batch_size * T;
    // Model FLOPs per GPU per step. Under context parallelism each rank holds
    // T / cp tokens of every sequence in the load-balanced order (chunks r and
    // 2 cp - 1 - r), so its share of the causal attention is 1 / cp as well:
    // dividing by N (tp cp dp pp) is exact for every term.
    double flops = model_flops_per_token(&lc, T) * tokens / N;
    double HD = (double)lc.n_heads * llama_head_dim(&lc); // the attention's width (d_model unless head_dim)
    double attn_fwd = 2.0 * L * HD * (double)T * tokens / N; // QK^T and AV, forward
    double rate = cl->gpu.peak_flops * cl->efficiency;
    bool fp8 = c.precision.fp8 != FP8_NONE;
    // The slowest stage sets the pace: ceil(L / (p v)) layers a chunk.
    int chunk_max = (L + l->pp * l->v - 1) / (l->pp * l->v);
    int n_moe_blocks = 0; // [model] moe_experts: the MoE blocks of the model
    for (int i = 0; i < L; i++) n_moe_blocks += llama_layer_moe(&lc, i);
    double imbalance = (double)chunk_max * l->pp * l->v / L;
    double recompute_flops, t_block; // hardware FLOPs recompute adds a GPU; one cp block's attention forward
    double KD = (double)lc.n_kv_heads * llama_head_dim(&lc), Cm = lc.d_model;
    if (cl->efficiency > 0) {
        // Every FLOP at one efficiency of the peak (the FP8 peak for the
        // block linears' 6 x params a token under precision.fp8).
        int skip_first = 0, skip_last = 0; // precision.fp8_skip_layers: those blocks in bf16
        config_fp8_skip(&c, &skip_first, &skip_last);
        double n8 = MAX(0, L - skip_first - skip_last);
        double lin = n8 * (Cm * (HD + 2 * KD) + HD * Cm + 3.0 * Cm * lc.ffn_dim) * 6 * tokens / N;
        double f8 = fp8 ? lin : 0;
        l->compute_s = ((flops - f8) / rate + (fp8 ? f8 / (cl->gpu.fp8_flops * cl->efficiency) : 0)) * imbalance;
        double fwd = flops / 3;
        recompute_flops = l->recompute == RECOMPUTE_FULL ? fwd : l->recompute == RECOMPUTE_SELECTIVE ? attn_fwd : 0;
        l->recompute_s = recompute_flops * imbalance / rate;
        t_block = 2.0 * l->mb * ((double)T / cp) * ((double)T / cp) * HD / l->tp / rate;
        // The ops: the forward a third of the FLOPs, W the weight gradients'
        // 2 x matmul params a token (the block linears' at the FP8 peak under
        // precision.fp8), B the rest with the recompute.
        // (2 x the matmul parameters a token meets: a MoE block's active ones, model_flops_per_token)
        double w_flops = (model_flops_per_token(&lc, T) - 6.0 * L * HD * T) / 3 * tokens / N;
        double w_s = ((w_flops - f8 / 3) / rate + (fp8 ? f8 / 3 / (cl->gpu.fp8_flops * cl->efficiency) : 0)) *
                     imbalance;
        double ops = (double)m * l->v;
        l->op = (struct pp_costs){.f = l->compute_s / 3 / ops, .w = w_s / ops,
                                  .b = (l->compute_s * 2 / 3 - w_s + l->recompute_s) / ops};
    } else {
        // The kernel model (docs/planning.md §3): each GEMM at its shape's
        // rate, attention at the fused kernel's, the memory-bound kernels at
        // HBM speed; per microbatch and layer on one rank, m microbatches of
        // L / pp layers (the slowest stage: x imbalance) and the head's share.
        struct layer_times k = kernel_times(&c, &lc, &cl->gpu, l, chunk_max * l->v, false), kb = k, km = k;
        // precision.fp8_skip_layers: those blocks run in bf16 (their share of the weight casts too)
        int skip_first = 0, skip_last = 0;
        config_fp8_skip(&c, &skip_first, &skip_last);
        double n8 = fp8 ? MAX(0, L - skip_first - skip_last) : L; // the FP8 blocks (all of them in bf16)
        if (fp8 && n8 < L) {
            struct config b = c;
            b.precision.fp8 = FP8_NONE;
            kb = kernel_times(&b, &lc, &cl->gpu, l, chunk_max * l->v, false);
            k.weight_casts *= n8 / L;
        }
        // Mixture of experts: n_moe MoE blocks at km (bf16), the FP8 ones among the nd dense
        double n_moe = n_moe_blocks, nd = L - n_moe, n8d = MIN(n8, nd);
        if (n_moe > 0) km = kernel_times(&c, &lc, &cl->gpu, l, chunk_max * l->v, true);
#define BLOCKS(f) (n8d * k.f + (nd - n8d) * kb.f + n_moe * km.f)
        double per_mb = (BLOCKS(fwd) + BLOCKS(bwd) + k.head) / l->pp;
        l->compute_s = (m * per_mb + k.weight_casts) * imbalance;
        double rec = l->recompute == RECOMPUTE_FULL ? BLOCKS(fwd) / l->pp
                     : l->recompute == RECOMPUTE_SELECTIVE ? BLOCKS(selective) / l->pp
                                                           : 0;
        l->recompute_s = m * rec * imbalance;
        // The ops (one microbatch through one chunk): F the forward, W the
        // weight-gradient GEMMs, B the rest of the backward and the recompute.
        double f_mb = (BLOCKS(fwd) + k.head_fwd) / l->pp;
        double w_mb = (BLOCKS(bwd_w) + k.head_w) / l->pp;
#undef BLOCKS
        l->op = (struct pp_costs){.f = f_mb * imbalance / l->v, .w = w_mb * imbalance / l->v,
                                  .b = (per_mb - f_mb - w_mb + rec) * imbalance / l->v};
        double qk = 2.0 * (HD + KD) * Cm * tokens / N * L; // selective: the q and k GEMMs again
        recompute_flops = l->recompute == RECOMPUTE_FULL ? flops / 3
                          : l->recompute == RECOMPUTE_SELECTIVE ? attn_fwd + qk : 0;
        t_block = k.block_attn_fwd;
    }
    // TP: per layer and microbatch 2 all-reduce volumes forward, 2 backward
    // (with sequence parallelism an all-gather + reduce-scatter pair each),
    // 2 more when full recompute reruns the forward. Activations (mb, T / cp, C):
    // a rank's own tokens.
    double act = (double)l->mb * (T / cp) * lc.d_model * dtype_size(c.precision.dtype);
    double bw_tp = l->tp <= cl->gpus_per_node ? cl->gpu.nvlink_bw : cl->gpu.ib_bw;
    double a_tp = l->tp <= cl->gpus_per_node ? cl->alpha_nvlink : cl->alpha_ib;
    int n_ar = 4 + (l->recompute == RECOMPUTE_FULL ? 2 : 0);
    l->tp_comm_s = n_ar * (double)chunk_max * l->v * m * t_all_reduce(act, l->tp, bw_tp, a_tp);
    // CP: the ring of key/value blocks (plan_cp_ring_exposed) in every layer
    // of every microbatch, forward twice under full recompute. The cp group
    // is every tp-th rank of tp cp consecutive ones (rank order tp, cp, dp,
    // pp): on NVLink while tp cp fits a node, else the ring's slowest hop is
    // the network. A block: mb x T / cp tokens of this rank's Hkv / tp
    // key/value heads, K and V; its attention forward 2 mb (T / cp)^2 H D / tp
    // FLOPs (H D = C unless head_dim is set; the causal half of 4 (T/cp)^2 H D:
    // the load-balanced chunks make every block half-masked, the diagonal one
    // too).
    l->cp_comm_s = 0;
    if (cp > 1) {
        bool cp_ib = (long)l->tp * cp > cl->gpus_per_node;
        double bw_cp = cp_ib ? cl->gpu.ib_bw : cl->gpu.nvlink_bw, a_cp = cp_ib ? cl->alpha_ib : cl->alpha_nvlink;
        double Tl = (double)T / cp, D = llama_head_dim(&lc);
        double kv_heads = MAX(1, lc.n_kv_heads / l->tp);
        double kv_bytes = 2.0 * l->mb * Tl * kv_heads * D * dtype_size(c.precision.dtype);
        double fwd_x, bwd_x;
        plan_cp_ring_exposed(cp, t_block, a_cp + kv_bytes / bw_cp, &fwd_x, &bwd_x);
        int n_fwd = l->recompute == RECOMPUTE_FULL ? 2 : 1;
        l->cp_comm_s = (double)chunk_max * l->v * m * (n_fwd * fwd_x + bwd_x);
    }
    // EP (docs/planning.md §3, "EP comm"; §8): in every MoE block of
    // every microbatch, the dispatch and the combine all-to-all forward,
    // their gradients' two backward (two more under full recompute), not
    // overlapped (Megatron-Core's alltoall dispatcher without its batch-level
    // overlap). Each moves the rows a rank keeps (moe_shape_of) that belong
    // to another rank of its ep group: (ep - 1) / ep of them under a uniform
    // router, rows x C in the model dtype, sent and received at once at the
    // link's per-GPU bandwidth, ep - 1 latency steps (one message a peer). The
    // ep group is ep consecutive data ranks (rank order tp, cp, ep, ...): on
    // NVLink while tp cp ep fits a node, else across the network.
    l->ep_comm_s = 0;
    if (l->ep > 1 && n_moe_blocks > 0) {
        struct moe_shape ms = moe_shape_of(&c, &lc, l);
        // rank 0's ep group: its last member's rank, from the grid's rank order
        int members[LLAMA_MAX_PARALLEL];
        int n_ep = topology_group_members(&grid, GROUP_EP, topology_coord_of(&grid, 0), members);
        bool ep_ib = members[n_ep - 1] >= cl->gpus_per_node;
        double bw_ep = ep_ib ? cl->gpu.ib_bw : cl->gpu.nvlink_bw, a_ep = ep_ib ? cl->alpha_ib : cl->alpha_nvlink;
        double t_a2a = ms.sent * lc.d_model * dtype_size(c.precision.dtype) / bw_ep + (l->ep - 1) * a_ep;
        int n_a2a = 4 + (l->recompute == RECOMPUTE_FULL ? 2 : 0);
        // the slowest stage's MoE blocks: its chunk_max v blocks, the model's MoE share of them
        double moe_blocks = (double)chunk_max * l->v * n_moe_blocks / L;
        l->ep_comm_s = n_a2a * moe_blocks * m * t_a2a;
    }
    // PP (docs/planning.md §3, "Pipeline schedules"): the schedule simulated
    // with the ops' costs, once without messages (the bubble) and once with
    // each message between stages taking alpha + its bytes (a microbatch's
    // activations or their gradient, scattered over tp) / bandwidth.
    bool pp_ib = (long)l->tp * G >= cl->gpus_per_node;
    double bw_pp = pp_ib ? cl->gpu.ib_bw : cl->gpu.nvlink_bw, a_pp = pp_ib ? cl->alpha_ib : cl->alpha_nvlink;
    l->bubble_s = l->pp_comm_s = l->bubble = 0;
    l->op.comm = l->pp > 1 ? a_pp + act / l->tp / bw_pp : 0;
    if (l->pp > 1 && !pipeline_terms(l->schedule, l->pp, m, l->v, &l->op, memo, &l->bubble_s, &l->pp_comm_s,
                                     &l->bubble, why, why_len)) {
        l->peak_bytes = 0; // refused, not out of memory
        return false;
    }
    // DP: the gradient all-reduce (ZeRO-1: reduce-scatter of the gradients,
    // all-gather of the bf16 weights after the step) of the largest shard,
    // over the G = dp cp ranks of the gradient group (parameters are
    // replicated over cp).
    bool dp_ib = (long)l->tp * G > cl->gpus_per_node;
    double bw_dp = dp_ib ? cl->gpu.ib_bw : cl->gpu.nvlink_bw, a_dp = dp_ib ? cl->alpha_ib : cl->alpha_nvlink;
    double gbytes = (double)n_params * dtype_size(c.precision.grad_dtype);
    double pbytes = (double)n_params * dtype_size(c.precision.dtype);
    // The buckets reduce during the last microbatch's backward (2/3 of its
    // compute; window); under a split schedule during its W ops alone
    // (last_window: B leaves the weight gradients pending and the step's
    // last ops are Ws). Between two microbatches' reductions (ZeRO-2/3) a
    // split schedule runs as much compute as 1F1B: window.
    double window = (2.0 / 3.0) * (l->compute_s + l->recompute_s) / m;
    double last_window = pipeline_schedule_splits(l->schedule) ? l->v * l->op.w : window;
    if (l->zero <= 1) {
        // Under ep the routed experts' share (n_expert of n_params) reduces
        // over the G / ep ranks that hold the same experts (expert_dp).
        double xf = l->ep > 1 ? (double)n_expert / (double)n_params : 0;
        int Gx = MAX(1, G / l->ep);
        double reduce = l->zero ? t_half(gbytes * (1 - xf), G, bw_dp, a_dp)
                                : t_all_reduce(gbytes * (1 - xf), G, bw_dp, a_dp);
        double gather = l->zero ? t_half(pbytes * (1 - xf), G, bw_dp, a_dp) : 0;
        if (xf > 0) {
            reduce += l->zero ? t_half(gbytes * xf, Gx, bw_dp, a_dp) : t_all_reduce(gbytes * xf, Gx, bw_dp, a_dp);
            gather += l->zero ? t_half(pbytes * xf, Gx, bw_dp, a_dp) : 0;
        }
        l->dp_exposed_s = (reduce > last_window ? reduce - last_window : 0) + gather;
    } else {
        // ZeRO-2/3 (docs/planning.md §3): per-unit collectives within the
        // shard group of S ranks (cp x dp_shard; the network once tp S spans
        // more than a node), the shards' all-reduce across the G / S replicas
        // once a step (the network once tp G does).
        bool s_ib = (long)l->tp * S > cl->gpus_per_node;
        double bw_s = s_ib ? cl->gpu.ib_bw : cl->gpu.nvlink_bw, a_s = s_ib ? cl->alpha_ib : cl->alpha_nvlink;
        int units = chunk_max * l->v + 2; // the stage's blocks, the embedding and the head at most
        // k per-unit collectives of bytes in all: one collective's bandwidth term, k latency terms
        double lat = (double)(units - 1) * (S - 1);
        double rs = t_half(gbytes, S, bw_s, a_s) + lat * a_s;
        double ag = t_half(pbytes, S, bw_s, a_s) + lat * a_s;
        double ar = t_all_reduce(gbytes / S, G / S, bw_dp, a_dp);
        double fwd_window = (1.0 / 3.0) * l->compute_s / m;
        double ag_unit = t_half((double)unit * dtype_size(c.precision.dtype), S, bw_s, a_s);
        double per_mb_fwd = 0, bwd_comm = rs;
        if (l->zero == 3) {
            // The first unit's gather waits; the rest overlap the forward (prefetch 1).
            per_mb_fwd = ag_unit + MAX(0, ag - ag_unit - fwd_window);
            if (!l->keep_gathered) bwd_comm += ag; // gathered again for the backward
        }
        l->dp_exposed_s = m * per_mb_fwd + (m - 1) * MAX(0, bwd_comm - window) +
                          MAX(0, bwd_comm + ar - last_window) + (l->zero == 2 ? ag : 0);
    }
    l->step_s = l->compute_s + l->recompute_s + l->bubble_s + l->tp_comm_s + l->cp_comm_s + l->ep_comm_s +
                l->pp_comm_s + l->dp_exposed_s;
    l->tflops_per_gpu = flops / l->step_s / 1e12;
    l->hw_tflops_per_gpu = (flops + recompute_flops) / l->step_s / 1e12;
    l->mfu = flops / l->step_s / cl->gpu.peak_flops;
    l->mfu_full = (flops + attn_fwd * 3) / l->step_s / cl->gpu.peak_flops; // + the masked half: 12 L C T
    l->tokens_per_s = tokens / l->step_s;
    l->tokens_per_s_per_gpu = l->tokens_per_s / N;
    l->bf16_step_s = 0, l->bf16_peak_bytes = 0;
    if (fp8) { // the same layout without FP8, for the ratio
        struct config b = *c0;
        b.precision.fp8 = FP8_NONE;
        struct plan_layout lb = *l;
        char w[160];
        if (plan_predict(&b, cl, &lb, w, sizeof w)) l->bf16_step_s = lb.step_s;
        l->bf16_peak_bytes = lb.peak_bytes;
    }
    return true;
}

bool plan_predict(const struct config *c, const struct plan_cluster *cl, struct plan_layout *l, char *why,
                  size_t why_len) {
    return predict(c, cl, l, why, why_len, NULL);
}

// Fastest first (seconds a sequence: a batch moved to the nearest that
// divides is not a faster step); of equal times, the one that needs less memory.
static int cmp_layout(const void *a, const void *b) {
    const struct plan_layout *p = a, *q = b;
    double tp = p->step_s / p->global_batch, tq = q->step_s / q->global_batch;
    if (tp != tq) return tp < tq ? -1 : 1;
    return (p->peak_bytes > q->peak_bytes) - (p->peak_bytes < q->peak_bytes);
}

enum status plan_search(const struct config *c, const struct plan_cluster *cl,
                        struct plan_layout *top, int n_top, int *n_fit, int *n_tried,
                        struct plan_reject *rej, int max_rej, int *n_rej, struct error *err) {
    const struct model_config *mc = &c->model;
    int N = cl->gpus, B = c->train.global_batch_size, cap = 4096, n = 0;
    if (N < 1 || cl->gpus_per_node < 1 || !(cl->efficiency >= 0 && cl->efficiency <= 1))
        return error_set(err, STATUS_BAD_INPUT,
                         "plan search: %d GPUs, %d a node, efficiency %g: expected >= 1, >= 1, [0, 1]", N,
                         cl->gpus_per_node, cl->efficiency);
    struct plan_layout *fit = xcalloc((size_t)cap, sizeof *fit);
    struct sim_memo memo = {0};
    *n_fit = 0, *n_tried = 0, *n_rej = 0;
    int T = c->train.seq_len;
    for (int tp = 1; tp <= N && tp <= 64; tp++) {
        if (N % tp) continue;
        // Powers of two always (their rejections explain the families a
        // reader expects); any other divisor of n_heads that fits a node and
        // divides what tensor parallelism splits (n_kv_heads or a multiple of
        // it, ffn_dim) as well.
        bool pow2 = (tp & (tp - 1)) == 0;
        if (!pow2 && (tp > cl->gpus_per_node || tp > mc->n_kv_heads || mc->n_heads % tp || mc->ffn_dim % tp ||
                      mc->n_kv_heads % tp))
            continue;
        // Context parallelism for long sequences: cp a power of two with T %
        // (2 cp) == 0 (the load-balanced split's 2 cp chunks), from
        // PLAN_CP_MIN_SEQ tokens on.
        for (int cp = 1; cp == 1 || (T >= PLAN_CP_MIN_SEQ && cp <= 64 && T % (2 * cp) == 0 && (N / tp) % cp == 0);
             cp *= 2)
        for (int pp = 1; pp <= N / tp / cp; pp++) {
            if ((N / tp / cp) % pp) continue;
            char why[200] = "";
            double best_over = INFINITY;
            bool any = false;
            int dp = N / tp / cp / pp, G = dp * cp; // G: the gradient (and ZeRO) group
            if (tp > cl->gpus_per_node)
                snprintf(why, sizeof why, "tp %d crosses a node of %d GPUs", tp, cl->gpus_per_node);
            else if (tp > mc->n_kv_heads)
                snprintf(why, sizeof why, "tp %d > n_kv_heads %d", tp, mc->n_kv_heads);
            else if (mc->n_heads % tp || mc->ffn_dim % tp)
                snprintf(why, sizeof why, "tp %d does not divide n_heads %d or ffn_dim %d", tp, mc->n_heads, mc->ffn_dim);
            else if (pp > mc->n_layers)
                snprintf(why, sizeof why, "pp %d > n_layers %d", pp, mc->n_layers);
            else if (pp > PIPELINE_SIM_MAX_STAGES) // its bubble comes from the simulator
                snprintf(why, sizeof why, "pp %d: the schedule simulator takes at most %d stages", pp,
                         PIPELINE_SIM_MAX_STAGES);
            else if (!plan_batch_close(B, plan_nearest_batch(B, 1, dp)))
                snprintf(why, sizeof why, "dp %d does not divide global_batch_size %d (the nearest multiple, %d, is "
                         "more than 10%% away)", dp, B, plan_nearest_batch(B, 1, dp));
            else if (plan_nearest_batch(B, 1, dp) / dp < pp)
                snprintf(why, sizeof why, "%d microbatches a replica at most (global_batch_size %d / dp %d) < pp %d: "
                         "the pipeline never fills", plan_nearest_batch(B, 1, dp) / dp, B, dp, pp);
            if (why[0]) {
                // Only the families a reader would consider: skip pp beyond layers quietly.
                if (*n_rej < max_rej && pp <= mc->n_layers && (pp == 1 || tp <= cl->gpus_per_node))
                    rej[(*n_rej)++] = (struct plan_reject){.tp = tp, .cp = cp, .pp = pp}, snprintf(rej[*n_rej - 1].why, sizeof rej->why, "%s", why);
                continue;
            }
            char oom[400] = "";
            // Virtual stages: every divisor of the layers a stage holds
            // (ceil(L / pp)) up to the model's MODEL_MAX_CHUNKS chunks a rank.
            int per_stage = (mc->n_layers + pp - 1) / pp;
            for (int v = 1; v <= MIN(per_stage, MODEL_MAX_CHUNKS); v++) {
                if (per_stage % v) continue;
                if (v > 1 && pp == 1) break;
                if (pp * v > mc->n_layers) break;
                for (int mb = 1; mb <= 16; mb *= 2) {
                    // A batch that does not divide: the nearest multiple of mb dp (said with the layout).
                    int Bm = plan_nearest_batch(B, mb, dp);
                    if (!plan_batch_close(B, Bm)) continue;
                    int m = Bm / (mb * dp);
                    if (m < pp || (v > 1 && m % pp)) continue;
                    // The schedules of this v (docs/planning.md §2): 1F1B (v 1) or the
                    // interleaved 1F1B (v > 1), and from pp 2 their zero-bubble
                    // counterparts, ZB-H1 (v 1) and ZB-V (v 2).
                    enum pp_schedule kinds[2] = {v > 1 ? PP_SCHEDULE_INTERLEAVED : PP_SCHEDULE_1F1B};
                    int n_kinds = 1;
                    if (pp > 1 && v == 1) kinds[n_kinds++] = PP_SCHEDULE_ZB_H1;
                    if (pp > 1 && v == 2) kinds[n_kinds++] = PP_SCHEDULE_ZBV;
                    for (int ki = 0; ki < n_kinds; ki++)
                    for (int r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++)
                        for (int z = 0; z <= (G > 1 ? 3 : 0); z++)
                        for (int S = z >= 2 ? 1 : dp; S <= dp; S++)
                        for (int keep = 0; keep <= (z == 3); keep++)
                        for (int ep = 1; ep <= (mc->moe_experts ? MIN(dp, mc->moe_experts) : 1); ep++) {
                            // ZeRO-2/3's shard group: cp x a divisor of dp (hybrid
                            // below dp), more than one rank
                            if (dp % S || (z >= 2 && S * cp == 1)) continue;
                            // Expert parallelism (MoE configs): ep divides the experts and
                            // the data ranks it spans (the shard group's under ZeRO-2/3)
                            if (mc->moe_experts % ep || (z >= 2 ? S : dp) % ep) continue;
                            struct plan_layout l = {.tp = tp, .cp = cp, .pp = pp, .v = v, .dp = dp, .ep = ep,
                                                  .mb = mb, .zero = z,
                                                  .dp_shard = z >= 2 ? S : 0, .keep_gathered = keep,
                                                  .recompute = (enum recompute)r, .global_batch = Bm,
                                                  .schedule = kinds[ki]};
                            char w[160];
                            ++*n_tried;
                            if (!predict(c, cl, &l, w, sizeof w, &memo)) {
                                double over = (double)l.peak_bytes;
                                if (l.peak_bytes && over < best_over) {
                                    best_over = over;
                                    char eps[16] = ""; // MoE configs: the layout's ep
                                    if (mc->moe_experts) snprintf(eps, sizeof eps, ", ep %d", ep);
                                    snprintf(oom, sizeof oom, "out of memory at best (%s, v %d, mb %d, recompute %s, zero "
                                             "%d%s): %s", pipeline_schedule_name(kinds[ki]), v, mb,
                                             r == 0 ? "none" : r == 1 ? "selective" : "full", z, eps, w);
                                } else if (!l.peak_bytes && !oom[0]) snprintf(oom, sizeof oom, "%s", w);
                                continue;
                            }
                            any = true;
                            if (n == cap) {
                                struct plan_layout *more = xcalloc((size_t)cap * 2, sizeof *fit);
                                memcpy(more, fit, sizeof *fit * (size_t)cap);
                                free(fit), fit = more, cap *= 2;
                            }
                            fit[n++] = l;
                        }
                }
            }
            if (!any && *n_rej < max_rej) {
                rej[*n_rej] = (struct plan_reject){.tp = tp, .cp = cp, .pp = pp};
                snprintf(rej[*n_rej].why, sizeof rej->why, "%s", oom[0] ? oom : "no micro-batch size divides the batch");
                ++*n_rej;
            }
        }
    }
    qsort(fit, (size_t)n, sizeof *fit, cmp_layout);
    for (int i = 0; i < n && i < n_top; i++) top[i] = fit[i];
    *n_fit = n;
    free(fit);
    return STATUS_OK;
}

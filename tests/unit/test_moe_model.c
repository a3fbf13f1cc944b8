// test_moe_model.c: the mixture-of-experts decoder (issue 31; model.c,
// model_pass.c with src/model/moe.h), against expectations independent of it:
// - one expert, top-1, no shared expert, no auxiliary losses is the dense
//   model: a MoE model holding the dense model's MLP weights as its expert
//   gives its logits, loss and every gradient (FP64, <= 1e-12 relative), and
//   the router's gradient is 0 (its weight is p = 1 whatever it is);
// - finite differences in FP64 of the training objective, LM loss +
//   (N / targets) (moe_aux_loss_coeff * transformers' load-balancing loss +
//   moe_z_loss_coeff * the blocks' z-losses) (read back through
//   model_moe_stats_take; two targets ignored), against
//   the analytic gradient of every parameter tensor, in a model with a dense
//   block then two MoE blocks (8 experts, top-2, a gated shared expert);
// - the FLOPs per token count the active parameters (closed form);
// - model_memory.moe_bytes = the slots' moe_activation_bytes per MoE block
//   plus one moe_scratch_bytes under recompute none and selective, one
//   moe_activation_bytes (the recompute buffer's) plus the scratch under
//   full, and model_plan gives model_init's sizes;
// - model_memory.n_expert_params = 3 x (E / ep) Fe C per MoE block, each
//   tensor padded to 128 elements (closed form; Fe C E / ep = 224 pads to
//   256), what model_init's table spaces them by and what
//   model_shard_param_table gives; optimizer_zero1_numel's blocks over the
//   data ranks of dp 6, ep 2 cover the dense elements once and the experts'
//   once per ep rank, rank 0's each run's len / S (rank 5 the rests);
// - with a CUDA backend (or the emulated build), its MoE decoder against the
//   CPU's: logits, gradients (1e-4), the same routing.
#include <math.h>
#include <string.h>

#include "base/rng.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/optimizer.h"
#include "test.h"

static uint64_t rng_state = 4242;
static uint32_t rand_u32(void) { return (uint32_t)((rng_state = rng_splitmix64(rng_state)) >> 32); }

static struct llama_config base_config(void) {
    return (struct llama_config){
        .vocab_size = 64, .d_model = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
        .ffn_dim = 48, .max_seq_len = 64, .rope_theta = 10000.0, .norm_eps = 1e-5f,
        .tie_embeddings = false, .init_std = 0.05f, .moe_top_k = 2, .moe_norm_topk = true,
    };
}

static struct model *new_model(struct backend *be, const struct llama_config *cfg, enum dtype dt,
                               int B, int T, uint64_t seed) {
    struct model_shard shard = model_shard_full(cfg);
    struct model *m;
    struct error err;
    CHECK(!model_init(&m, be, cfg, &shard, dt, B, T, seed, &err), "%s", err.msg);
    return m;
}

// Copies parameter `from` of a into parameter `to` of b (same shape).
static void copy_param(struct model *a, const char *from, struct model *b, const char *to) {
    const struct param_info *pa = model_find_param(a, from), *pb = model_find_param(b, to);
    CHECK(pa && pb && pa->numel == pb->numel, "%s -> %s", from, to);
    double *d = malloc(pa->numel * sizeof *d);
    float *f = malloc(pa->numel * sizeof *f);
    model_get_param(a, pa, d);
    for (size_t i = 0; i < pa->numel; i++) f[i] = (float)d[i];
    model_set_param(b, pb, f);
    free(d), free(f);
}

static double rel_diff(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void test_one_expert_is_dense(struct backend *be) {
    struct llama_config dc = base_config(), mc = dc;
    mc.moe_experts = 1, mc.moe_top_k = 1, mc.moe_ffn_dim = dc.ffn_dim;
    int B = 2, T = 16, N = B * T;
    struct model *d = new_model(be, &dc, DTYPE_FP64, B, T, 5), *m = new_model(be, &mc, DTYPE_FP64, B, T, 5);
    char a[96], b[96];
    for (int l = 0; l < dc.n_layers; l++) {
        const char *map[3][2] = {{"gate_proj", "gate_proj"}, {"up_proj", "up_proj"}, {"down_proj", "down_proj"}};
        for (int k = 0; k < 3; k++) {
            snprintf(a, sizeof a, "model.layers.%d.mlp.%s.weight", l, map[k][0]);
            snprintf(b, sizeof b, "model.layers.%d.mlp.experts.%s.weight", l, map[k][1]);
            copy_param(d, a, m, b);
        }
    }
    int32_t tok[32], tgt[32];
    for (int i = 0; i < N; i++) tok[i] = rand_u32() % 64, tgt[i] = rand_u32() % 64;
    double ld, lm;
    long cd, cm;
    model_zero_grad(d), model_zero_grad(m);
    model_forward(d, tok, tgt, &ld, &cd);
    model_forward(m, tok, tgt, &lm, &cm);
    size_t nl = (size_t)N * dc.vocab_size;
    double *x = malloc(nl * sizeof *x), *y = malloc(nl * sizeof *y);
    model_get_logits(d, x), model_get_logits(m, y);
    double r = rel_diff(y, x, nl);
    EXPECT(r <= 1e-12, "one expert: logits differ from the dense model's by %.3e relative", r);
    EXPECT(fabs(lm - ld) <= 1e-12 * fabs(ld), "one expert: loss %.17g, dense %.17g", lm, ld);
    free(x), free(y);
    model_backward(d, 1.0 / cd), model_backward(m, 1.0 / cm);
    int n;
    const struct param_info *p = model_params(m, &n);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double *g = malloc(p[i].numel * sizeof *g), *h = malloc(p[i].numel * sizeof *h);
        model_get_grad(m, &p[i], g);
        if (strstr(p[i].name, "mlp.gate.weight")) {
            double s = 0;
            for (size_t k = 0; k < p[i].numel; k++) s += fabs(g[k]);
            EXPECT(s <= 1e-14, "one expert: %s gradient |.|_1 = %.3e, expected 0", p[i].name, s);
        } else {
            snprintf(a, sizeof a, "%s", p[i].name);
            char *e = strstr(a, "mlp.experts.");
            if (e) memmove(e + 4, e + 12, strlen(e + 12) + 1); // mlp.experts.X -> mlp.X
            const struct param_info *q = model_find_param(d, a);
            CHECK(q, "dense model has no %s", a);
            model_get_grad(d, q, h);
            double rr = rel_diff(g, h, p[i].numel);
            worst = fmax(worst, rr);
            EXPECT(rr <= 1e-12, "one expert: %s gradient differs from the dense %s by %.3e relative",
                   p[i].name, a, rr);
        }
        free(g), free(h);
    }
    printf("one expert = dense: logits %.2e, worst gradient %.2e relative\n", r, worst);
    model_free(d), model_free(m);
}

// The objective the backward differentiates: LM loss (mean over the count
// targets) + the MoE terms, weighted N / count (the microbatch's N tokens in
// the loss: model_pass.c, moe_losses).
static double objective(struct model *m, const struct llama_config *c, const int32_t *tok,
                        const int32_t *tgt) {
    double sum, moe[4 + 8 * 8];
    long count;
    model_forward(m, tok, tgt, &sum, &count);
    model_backward(m, 1.0 / count);
    CHECK(model_moe_stats_numel(m) <= sizeof moe / sizeof *moe, "stats");
    model_moe_stats_take(m, moe);
    int B, T, V;
    model_microbatch_shape(m, &B, &T, &V);
    return sum / count + (double)B * T / count *
                             (c->moe_aux_loss_coeff * moe[1] + c->moe_z_loss_coeff * moe[2]);
}

static void test_finite_differences(struct backend *be) {
    struct llama_config c = base_config();
    c.n_layers = 3, c.moe_first_dense_layers = 1, c.moe_experts = 8, c.moe_top_k = 2;
    c.moe_ffn_dim = 24, c.moe_shared_experts = 1, c.moe_shared_ffn_dim = 40;
    c.moe_shared_gate = true, c.moe_norm_topk = false;
    c.moe_aux_loss_coeff = 0.3, c.moe_z_loss_coeff = 0.05;
    int B = 2, T = 8, N = B * T;
    struct model *m = new_model(be, &c, DTYPE_FP64, B, T, 9);
    int32_t tok[16], tgt[16];
    for (int i = 0; i < N; i++) tok[i] = rand_u32() % 64, tgt[i] = rand_u32() % 64;
    tgt[3] = tgt[11] = IGNORE_INDEX; // loss scale 1 / 14: the MoE terms weigh 16 / 14
    model_zero_grad(m);
    double J0 = objective(m, &c, tok, tgt);
    int n;
    const struct param_info *p = model_params(m, &n);
    struct tensor w = model_param_arena(m);
    // every gradient now: each objective() below runs a backward that adds to them
    double **grads = malloc((size_t)n * sizeof *grads);
    for (int i = 0; i < n; i++) {
        grads[i] = malloc(p[i].numel * sizeof **grads);
        model_get_grad(m, &p[i], grads[i]);
    }
    double worst = 0;
    int checked = 0;
    for (int i = 0; i < n; i++) {
        const double *g = grads[i];
        double num = 0, den = 0;
        for (int s = 0; s < 6; s++) {
            size_t k = rand_u32() % p[i].numel;
            double *x = (double *)w.data + p[i].offset + k, x0 = *x, h = 1e-6;
            *x = x0 + h;
            double jp = objective(m, &c, tok, tgt);
            *x = x0 - h;
            double jm = objective(m, &c, tok, tgt);
            *x = x0;
            double fd = (jp - jm) / (2 * h);
            num += (fd - g[k]) * (fd - g[k]), den += fd * fd;
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        worst = fmax(worst, rel);
        checked++;
        EXPECT(rel <= 1e-5 || sqrt(num / 6) <= 1e-9,
               "MoE model %s: finite-difference relative error %.3e (|fd| %.3e)", p[i].name, rel,
               sqrt(den / 6));
    }
    for (int i = 0; i < n; i++) free(grads[i]);
    free(grads);
    printf("MoE model finite differences (%d tensors, objective %.6f): worst relative error %.2e\n",
           checked, J0, worst);
    model_free(m);
}

static void test_flops_and_bytes(struct backend *be) {
    struct llama_config c = base_config();
    c.n_layers = 3, c.moe_first_dense_layers = 1, c.moe_experts = 8, c.moe_top_k = 2;
    c.moe_ffn_dim = 24, c.moe_shared_experts = 1, c.moe_shared_ffn_dim = 40, c.moe_shared_gate = true;
    double C = 32, HD = 32, KV = 16, V = 64, T = 16;
    double attn = 2 * HD * C + 2 * KV * C;
    double dense = 3 * C * 48, moe = 8 * C + 3 * C * (2 * 24 + 40) + C;
    double want = 6 * (3 * attn + dense + 2 * moe + V * C) + 6 * 3 * HD * T;
    double got = model_flops_per_token(&c, (int)T);
    EXPECT(fabs(got - want) <= 1e-12 * want, "MoE flops per token %.17g, expected %.17g", got, want);
    int B = 2, Tm = 8;
    for (enum recompute r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++) {
        struct model_shard sh = model_shard_full(&c);
        sh.n_slots = 3, sh.recompute = r;
        struct model_memory plan;
        struct error err;
        CHECK(!model_plan(&c, &sh, DTYPE_BF16, B, Tm, &plan, &err), "%s", err.msg);
        struct model *m;
        CHECK(!model_init(&m, be, &c, &sh, DTYPE_BF16, B, Tm, 1, &err), "%s", err.msg);
        const struct model_memory *mem = model_memory(m);
        EXPECT(plan.activation_bytes == mem->activation_bytes && plan.moe_bytes == mem->moe_bytes &&
               plan.param_bytes == mem->param_bytes,
               "model_plan %zu / %zu activation / MoE bytes, model_init %zu / %zu",
               plan.activation_bytes, plan.moe_bytes, mem->activation_bytes, mem->moe_bytes);
        struct moe_config mc;
        model_moe_config(&c, &mc);
#define UP(x) (((x) + 255) / 256 * 256)
        int kept = r == RECOMPUTE_FULL ? 1 : 3 * 2; // full: the recompute buffer's one
        size_t want_moe = kept * UP(moe_activation_bytes(&mc, B * Tm, DTYPE_BF16)) +
                          UP(moe_scratch_bytes(&mc, B * Tm, DTYPE_BF16));
#undef UP
        EXPECT(mem->moe_bytes == want_moe, "recompute %d: moe_bytes %zu, expected %zu (%d MoE "
               "layers' activations + scratch)", (int)r, mem->moe_bytes, want_moe, kept);
        model_free(m);
    }
}

// model_memory.n_expert_params and ZeRO-1's blocks of the runs (header).
static void test_expert_elements(struct backend *be) {
    struct llama_config c = base_config();
    c.n_layers = 3, c.moe_first_dense_layers = 1, c.moe_experts = 8, c.moe_top_k = 2;
    c.moe_ffn_dim = 7, c.moe_shared_experts = 1, c.moe_shared_ffn_dim = 40;
    for (int ep = 1; ep <= 8; ep *= 2) {
        if (ep == 4) continue;
        struct model_shard sh = model_shard_full(&c);
        sh.ep_size = ep, sh.ep_rank = ep - 1;
        struct model_memory plan;
        struct error err;
        CHECK(!model_plan(&c, &sh, DTYPE_FP32, 2, 8, &plan, &err), "%s", err.msg);
        size_t per = (size_t)(8 / ep) * 7 * 32, want = 2 * 3 * ((per + 127) / 128 * 128);
        EXPECT(plan.n_expert_params == want, "ep %d: n_expert_params %zu, expected %zu (2 blocks x 3 "
               "x %zu padded to 128)", ep, plan.n_expert_params, want, per);
        struct model *m;
        CHECK(!model_init(&m, be, &c, &sh, DTYPE_FP32, 2, 8, 1, &err), "%s", err.msg);
        int n, nt;
        const struct param_info *p = model_params(m, &n);
        struct param_info *t;
        CHECK(!model_shard_param_table(&c, &sh, &t, &nt, &err), "%s", err.msg);
        size_t spaced = 0;
        for (int i = 0; i + 1 < n; i++) spaced += p[i].expert ? p[i + 1].offset - p[i].offset : 0;
        bool same = nt == n;
        for (int i = 0; same && i < n; i++) same = !strcmp(t[i].name, p[i].name) && t[i].offset == p[i].offset;
        EXPECT(spaced == want && model_memory(m)->n_expert_params == want && same,
               "ep %d: model_init's experts span %zu elements, its n_expert_params %zu, expected %zu; "
               "model_shard_param_table %s model_params", ep, spaced, model_memory(m)->n_expert_params,
               want, same ? "==" : "!=");
        if (ep != 2) {
            free(t), model_free(m);
            continue;
        }
        // ZeRO-1 at dp 6, ep 2 (data rank d: ep rank d % 2, expert_dp rank d / 2)
        size_t numel = plan.n_params, sum = 0, rank0 = 0;
        for (int d = 0; d < 6; d++) sum += optimizer_zero1_numel(p, n, numel, 6, d, 2, d / 2);
        for (int i = 0, j; i < n; i = j) { // rank 0: each run's len / S
            for (j = i + 1; j < n && p[j].expert == p[i].expert; j++) {}
            rank0 += ((j < n ? p[j].offset : numel) - (i ? p[i].offset : 0)) / (p[i].expert ? 3 : 6);
        }
        size_t got0 = optimizer_zero1_numel(p, n, numel, 6, 0, 2, 0);
        EXPECT(sum == numel + want && got0 == rank0 && got0 < (numel - want) / 6 + want / 3,
               "dp 6, ep 2: the blocks sum to %zu, expected %zu (dense + 2 x experts); rank 0 holds "
               "%zu, expected %zu (and fewer than the totals' quotients %zu)", sum, numel + want, got0,
               rank0, (numel - want) / 6 + want / 3);
        free(t), model_free(m);
    }
}

// The CUDA backend's MoE decoder against the CPU's (when one is there, or
// the emulated build): an FP32 forward and backward of the finite-difference
// test's model (dense block, two MoE blocks with a gated shared expert, aux
// and z losses) on the same batch gives the CPU's logits and every gradient
// within 1e-4 relative, and the same routing (the MoE statistics).
static void test_cuda_vs_cpu(struct backend *cpu, struct backend *gpu) {
    struct llama_config c = base_config();
    c.n_layers = 3, c.moe_first_dense_layers = 1, c.moe_experts = 8, c.moe_top_k = 2;
    c.moe_ffn_dim = 24, c.moe_shared_experts = 1, c.moe_shared_ffn_dim = 40;
    c.moe_shared_gate = true, c.moe_aux_loss_coeff = 0.3, c.moe_z_loss_coeff = 0.05;
    int B = 2, T = 16, N = B * T;
    struct model *a = new_model(cpu, &c, DTYPE_FP32, B, T, 3), *g = new_model(gpu, &c, DTYPE_FP32, B, T, 3);
    int32_t tok[32], tgt[32];
    for (int i = 0; i < N; i++) tok[i] = rand_u32() % 64, tgt[i] = rand_u32() % 64;
    double la, lg;
    long ca, cg;
    model_zero_grad(a), model_zero_grad(g);
    model_forward(a, tok, tgt, &la, &ca), model_forward(g, tok, tgt, &lg, &cg);
    size_t nl = (size_t)N * c.vocab_size;
    double *x = malloc(nl * sizeof *x), *y = malloc(nl * sizeof *y);
    model_get_logits(a, x), model_get_logits(g, y);
    double r = rel_diff(y, x, nl), worst = 0;
    EXPECT(r <= 1e-4, "cuda vs cpu: logits differ by %.3e relative", r);
    free(x), free(y);
    model_backward(a, 1.0 / ca), model_backward(g, 1.0 / cg);
    double sa[4 + 2 * 8], sg[4 + 2 * 8];
    model_moe_stats_take(a, sa), model_moe_stats_take(g, sg);
    for (int k = 3; k < 4 + 2 * 8; k++)
        EXPECT(sa[k] == sg[k], "cuda vs cpu: MoE statistic %d (routing) %g, cpu %g", k, sg[k], sa[k]);
    EXPECT(fabs(sa[1] - sg[1]) <= 1e-5 * sa[1] && fabs(sa[2] - sg[2]) <= 1e-5 * sa[2],
           "cuda vs cpu: aux %.9g / %.9g, z %.9g / %.9g", sg[1], sa[1], sg[2], sa[2]);
    int n;
    const struct param_info *p = model_params(a, &n);
    for (int i = 0; i < n; i++) {
        double *u = malloc(p[i].numel * sizeof *u), *v = malloc(p[i].numel * sizeof *v);
        model_get_grad(a, &p[i], u), model_get_grad(g, &p[i], v);
        double rr = rel_diff(v, u, p[i].numel);
        worst = fmax(worst, rr);
        EXPECT(rr <= 1e-4, "cuda vs cpu: %s gradient differs by %.3e relative", p[i].name, rr);
        free(u), free(v);
    }
    printf("MoE model cuda vs cpu: logits %.2e, worst gradient %.2e relative\n", r, worst);
    model_free(a), model_free(g);
}

int main(void) {
    struct backend *be = backend_cpu_init(2);
    test_one_expert_is_dense(be);
    test_finite_differences(be);
    test_flops_and_bytes(be);
    test_expert_elements(be);
    if (backend_has_cuda() && backend_device_count() > 0) {
        struct error err = {0};
        struct backend *gpu = backend_init(BACKEND_CUDA, 0, 0, &err);
        EXPECT(gpu != NULL, "cuda backend: %s", err.msg);
        if (gpu) test_cuda_vs_cpu(be, gpu), backend_free(gpu);
    } else {
        printf("MoE model cuda vs cpu: skipped (no CUDA backend in this build)\n");
    }
    backend_free(be);
    return test_finish("test_moe_model");
}

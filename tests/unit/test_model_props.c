// test_model_props.c: properties of the model that need no external reference.
// - causality: changing token k leaves logits at positions < k bit-identical;
// - the initial loss on uniformly random tokens is ln(V) +- 0.05;
// - gradient accumulation: microbatches with 11 and 101 non-ignored targets
//   give the loss and gradients (<= 1e-6 relative) of one microbatch holding
//   both; a microbatch whose labels are all ignored contributes loss 0 and
//   gradient 0, never NaN;
// - finite differences of the whole model's loss in fp64 against its
//   analytic gradient, for elements of every parameter tensor;
// - the initialisation: output projections scaled by 1/sqrt(2L), norm gains 1.
#include <math.h>
#include <string.h>

#include "base/rng.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "test.h"
#include "train/train_step.h"

static struct llama_config small_config(int V) {
    return (struct llama_config){
        .vocab_size = V, .d_model = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
        .ffn_dim = 160, .max_seq_len = 128, .rope_theta = 10000.0, .norm_eps = 1e-5f,
        .tie_embeddings = false, .init_std = 0.02f, .label_smoothing = 0.0f,
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

static uint64_t rng_state = 42;
static uint32_t rand_u32(void) { return (uint32_t)((rng_state = rng_splitmix64(rng_state)) >> 32); }

static void test_causality(struct backend *be) {
    struct llama_config cfg = small_config(128);
    int B = 2, T = 32;
    struct model *m = new_model(be, &cfg, DTYPE_FP32, B, T, 7);
    int32_t tokens[64], targets[64];
    for (int i = 0; i < B * T; i++) tokens[i] = rand_u32() % 128, targets[i] = rand_u32() % 128;
    size_t n = (size_t)B * T * cfg.vocab_size;
    double *base = malloc(n * sizeof *base), *changed = malloc(n * sizeof *changed);
    double loss;
    long count;
    model_forward(m, tokens, targets, &loss, &count);
    model_get_logits(m, base);
    int ks[] = {1, 5, 17, 31};
    for (int i = 0; i < 4; i++) {
        int k = ks[i];
        int32_t t2[64];
        memcpy(t2, tokens, sizeof t2);
        for (int b = 0; b < B; b++) t2[b * T + k] = (tokens[b * T + k] + 1 + rand_u32() % 100) % 128;
        model_forward(m, t2, targets, &loss, &count);
        model_get_logits(m, changed);
        size_t row = (size_t)cfg.vocab_size;
        for (int b = 0; b < B; b++) {
            size_t before = (size_t)k * row, at = (size_t)(b * T) * row;
            EXPECT(!memcmp(base + at, changed + at, before * sizeof(double)),
                   "row %d: logits before position %d changed when token %d changed", b, k, k);
            double diff = 0;
            for (size_t j = before; j < before + row; j++)
                diff += fabs(base[at + j] - changed[at + j]);
            EXPECT(diff > 0, "row %d: logits at position %d did not change with its token", b, k);
        }
    }
    free(base), free(changed);
    model_free(m);
}

static void test_initial_loss(struct backend *be) {
    int V = 512, B = 4, T = 64;
    struct llama_config cfg = small_config(V);
    struct model *m = new_model(be, &cfg, DTYPE_FP32, B, T, 11);
    int32_t tokens[256], targets[256];
    for (int i = 0; i < B * T; i++) tokens[i] = rand_u32() % V, targets[i] = rand_u32() % V;
    double sum;
    long count;
    model_forward(m, tokens, targets, &sum, &count);
    double loss = sum / count;
    EXPECT(fabs(loss - log(V)) <= 0.05, "initial loss %.4f vs ln(V) = %.4f", loss, log(V));
    model_free(m);
}

// Two microbatches of 1 sequence (11 and 101 non-ignored targets) against one
// microbatch of both, in fp64 (so 1e-6 is a test of the weighting, not of
// rounding) and fp32.
static void test_accumulation(struct backend *be, enum dtype dt) {
    struct llama_config cfg = small_config(128);
    int T = 128;
    int32_t tokens[256], targets[256];
    for (int i = 0; i < 2 * T; i++) tokens[i] = rand_u32() % 128, targets[i] = IGNORE_INDEX;
    for (int i = 0; i < 11; i++) targets[3 + 7 * i] = rand_u32() % 128;
    for (int i = 0; i < 101; i++) targets[T + 20 + i] = rand_u32() % 128;
    struct optimizer_config oc = {.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 0, .steps = 10,
                                  .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                  .weight_decay = 0.1f, .grad_clip = 0.0f};
    struct model *one = new_model(be, &cfg, dt, 2, T, 3), *two = new_model(be, &cfg, dt, 1, T, 3);
    struct optimizer *o1, *o2;
    struct error err;
    CHECK(!optimizer_init(&o1, be, one, &oc, NULL, &err) && !optimizer_init(&o2, be, two, &oc, NULL, &err), "");
    struct train_step_result r1, r2;
    train_step(one, o1, &oc, NULL, NULL, 0, tokens, targets, 1, 2, T, &r1);
    train_step(two, o2, &oc, NULL, NULL, 0, tokens, targets, 2, 1, T, &r2);
    EXPECT(r1.n_targets == 112 && r2.n_targets == 112, "targets %ld %ld", r1.n_targets, r2.n_targets);
    EXPECT_REL(1, &r2.loss, &r1.loss, 1e-6, "accumulated loss");
    EXPECT_REL(1, &r2.grad_norm, &r1.grad_norm, 1e-6, "accumulated grad norm");
    int n;
    const struct param_info *p = model_params(one, &n);
    for (int i = 0; i < n; i++) {
        double *g1 = malloc(p[i].numel * sizeof *g1), *g2 = malloc(p[i].numel * sizeof *g2);
        model_get_grad(one, &p[i], g1);
        model_get_grad(two, &p[i], g2);
        char what[128];
        snprintf(what, sizeof what, "%s accumulated grad %s", dtype_name(dt), p[i].name);
        EXPECT_REL(p[i].numel, g2, g1, 1e-6, what);
        free(g1), free(g2);
    }
    // Every label ignored: loss 0, gradient 0, finite weights after the step.
    for (int i = 0; i < 2 * T; i++) targets[i] = IGNORE_INDEX;
    train_step(two, o2, &oc, NULL, NULL, 1, tokens, targets, 2, 1, T, &r2);
    EXPECT(r2.loss == 0.0 && r2.n_targets == 0, "all-ignored loss %g targets %ld", r2.loss, r2.n_targets);
    EXPECT(r2.grad_norm == 0.0, "all-ignored grad norm %g", r2.grad_norm);
    double sq = 0;
    for (int i = 0; i < n; i++) {
        double *w = malloc(p[i].numel * sizeof *w);
        model_get_param(two, &model_params(two, &n)[i], w);
        for (size_t k = 0; k < p[i].numel; k++) sq += w[k] * w[k];
        free(w);
    }
    EXPECT(isfinite(sq), "weights not finite after an all-ignored step");
    // One all-ignored microbatch beside a normal one adds nothing.
    for (int i = 0; i < 101; i++) targets[T + 20 + i] = rand_u32() % 128;
    struct model *a = new_model(be, &cfg, dt, 1, T, 5), *b = new_model(be, &cfg, dt, 1, T, 5);
    double sa, sb;
    long ca, cb;
    model_zero_grad(a), model_zero_grad(b);
    model_forward(a, tokens, targets, &sa, &ca); // all ignored
    EXPECT(sa == 0.0 && ca == 0, "ignored microbatch loss %g count %ld", sa, ca);
    model_backward(a, 1.0 / 101);
    model_forward(a, tokens + T, targets + T, &sa, &ca);
    model_backward(a, 1.0 / 101);
    model_forward(b, tokens + T, targets + T, &sb, &cb);
    model_backward(b, 1.0 / 101);
    struct tensor ga = model_grad_arena(a), gb = model_grad_arena(b);
    size_t bytes = ga.numel * dtype_size(ga.dtype);
    EXPECT(!memcmp(ga.data, gb.data, bytes), "an all-ignored microbatch changed the gradients");
    optimizer_free(o1), optimizer_free(o2);
    model_free(one), model_free(two), model_free(a), model_free(b);
}

// Central differences of the mean loss in fp64 for a few elements of every
// parameter tensor (a smaller model so that each loss costs little).
// Variants 2 and 3 are issue 28's model options: 2 with qk_norm, qkv_bias,
// head_dim 12 (H D = 48 != C = 32) and llama3 RoPE scaling (original_max_pos
// 4: every band of frequencies at T = 8), the biases and q/k norm gains set
// away from their init (zeros, ones); 3 with qkv_bias alone and sizes that
// make [bq; bk; bv] consecutive (the fused QKV path with its bias GEMM);
// for both, the attention's tensors (whose gradients pass through the
// options: the projections, biases and norm gains) are checked.
static void test_model_finite_differences(struct backend *be) {
    struct llama_config cfg = small_config(64);
    cfg.d_model = 32, cfg.ffn_dim = 48, cfg.label_smoothing = 0.1f;
    int B = 2, T = 8;
    for (int tied = 0; tied <= 3; tied++) {
        cfg.tie_embeddings = tied == 1;
        if (tied == 2) {
            cfg.qk_norm = cfg.qkv_bias = true, cfg.head_dim = 12;
            cfg.rope_scaling = (struct rope_scaling){ROPE_SCALING_LLAMA3, 4.0, 1.0, 4.0, 4};
        } else if (tied == 3) {
            cfg.qk_norm = false, cfg.qkv_bias = true, cfg.head_dim = 32, cfg.n_kv_heads = 4;
            cfg.rope_scaling = (struct rope_scaling){ROPE_SCALING_LINEAR, 2.0, 0, 0, 0};
        }
        struct model *m = new_model(be, &cfg, DTYPE_FP64, B, T, 21);
        int np;
        const struct param_info *pp = model_params(m, &np);
        for (int i = 0; i < np; i++) // biases and q/k norm gains away from zeros and ones
            if (strstr(pp[i].name, "_proj.bias") || strstr(pp[i].name, "_norm.weight")) {
                double *x = (double *)model_param_arena(m).data + pp[i].offset;
                for (size_t k = 0; k < pp[i].numel; k++)
                    x[k] += 0.3 * ((double)(rand_u32() % 1000) / 1000 - 0.5);
            }
        int32_t tokens[16], targets[16];
        for (int i = 0; i < B * T; i++) tokens[i] = rand_u32() % 64, targets[i] = rand_u32() % 64;
        targets[3] = IGNORE_INDEX;
        double sum;
        long count;
        model_zero_grad(m);
        model_forward(m, tokens, targets, &sum, &count);
        model_backward(m, 1.0 / count);
        int n;
        const struct param_info *p = model_params(m, &n);
        struct tensor w = model_param_arena(m);
        double worst = 0;
        int checked = 0;
        for (int i = 0; i < n; i++) {
            // the options' variants: the attention's tensors (the rest is variants 0 and 1's)
            if (tied >= 2 && !strstr(p[i].name, "self_attn.")) continue;
            checked++;
            double *g = malloc(p[i].numel * sizeof *g);
            model_get_grad(m, &p[i], g);
            double num = 0, den = 0;
            for (int s = 0; s < 6; s++) {
                size_t k = rand_u32() % p[i].numel;
                double *x = (double *)w.data + p[i].offset + k, x0 = *x, h = 1e-5, lp, lm;
                *x = x0 + h;
                model_forward(m, tokens, targets, &lp, &count);
                *x = x0 - h;
                model_forward(m, tokens, targets, &lm, &count);
                *x = x0;
                double fd = (lp - lm) / (2 * h * count);
                num += (fd - g[k]) * (fd - g[k]), den += fd * fd;
            }
            double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            worst = fmax(worst, rel);
            // a gradient near 0 (k_proj.bias: softmax ignores what is the same for every
            // key, and only RoPE makes the bias differ) leaves the differences' rounding,
            // ~1e-11 absolute
            EXPECT(rel <= 1e-5 || sqrt(num / 6) <= 1e-10,
                   "variant %d %s: finite-difference relative error %.3e (|fd| %.3e)", tied,
                   p[i].name, rel, sqrt(den / 6));
            free(g);
        }
        printf("model finite differences (variant %d, %d tensors): worst relative error %.2e\n",
               tied, checked, worst);
        model_free(m);
    }
}

static void test_init(struct backend *be) {
    struct llama_config cfg = small_config(128);
    cfg.n_layers = 8;
    cfg.d_model = 128;
    struct model *m = new_model(be, &cfg, DTYPE_FP32, 1, 8, 99);
    int n;
    const struct param_info *p = model_params(m, &n);
    for (int i = 0; i < n; i++) {
        double *w = malloc(p[i].numel * sizeof *w);
        model_get_param(m, &p[i], w);
        double s = 0, s2 = 0;
        for (size_t k = 0; k < p[i].numel; k++) s += w[k], s2 += w[k] * w[k];
        double mean = s / p[i].numel, std = sqrt(s2 / p[i].numel - mean * mean);
        bool out_proj = strstr(p[i].name, "o_proj") || strstr(p[i].name, "down_proj");
        double want = p[i].cols == 1 ? 0.0 : out_proj ? 0.02 / sqrt(2.0 * cfg.n_layers) : 0.02;
        if (p[i].cols == 1) EXPECT(mean == 1.0 && std == 0.0, "%s: norm gain not ones", p[i].name);
        else EXPECT(fabs(std - want) < 0.08 * want && fabs(mean) < 0.1 * want,
                    "%s: std %.5f (want %.5f), mean %.5f", p[i].name, std, want, mean);
        free(w);
    }
    // Same seed, same weights; another seed, other weights.
    struct model *same = new_model(be, &cfg, DTYPE_FP32, 1, 8, 99);
    struct model *other = new_model(be, &cfg, DTYPE_FP32, 1, 8, 100);
    struct tensor a = model_param_arena(m), b = model_param_arena(same), c = model_param_arena(other);
    EXPECT(!memcmp(a.data, b.data, a.numel * 4), "same seed gave different weights");
    EXPECT(memcmp(a.data, c.data, a.numel * 4), "another seed gave the same weights");
    model_free(m), model_free(same), model_free(other);
}

// issue 28's options in the table and the FLOPs: head_dim 24 with H = 4, C =
// 64 (H D = 96): q (96, 64), k, v (48, 64), o (64, 96), biases (96,), (48,),
// q/k norm gains (24,); biases start at zero; the FLOPs count H D, not C.
static void test_options_table(void) {
    struct llama_config cfg = small_config(128);
    cfg.head_dim = 24, cfg.qkv_bias = cfg.qk_norm = true;
    struct param_info *p;
    int n;
    struct error err;
    CHECK(!model_param_table(&cfg, &p, &n, &err), "%s", err.msg);
    const struct { const char *name; int rows, cols; } want[] = {
        {"model.layers.1.self_attn.q_proj.weight", 96, 64}, {"model.layers.1.self_attn.k_proj.weight", 48, 64},
        {"model.layers.1.self_attn.o_proj.weight", 64, 96}, {"model.layers.1.self_attn.q_proj.bias", 96, 1},
        {"model.layers.1.self_attn.v_proj.bias", 48, 1},   {"model.layers.1.self_attn.k_norm.weight", 24, 1},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const struct param_info *q = NULL;
        for (int i = 0; i < n; i++)
            if (!strcmp(p[i].name, want[k].name)) q = &p[i];
        EXPECT(q && q->grows == want[k].rows && q->gcols == want[k].cols, "%s: %s (%d, %d)", want[k].name,
               q ? "shape" : "missing", q ? q->grows : 0, q ? q->gcols : 0);
        if (q && strstr(q->name, "bias")) EXPECT(q->init_zero && !q->decay, "%s: zeros, no decay", q->name);
        if (q && strstr(q->name, "_norm")) EXPECT(q->tp_sum_grad && q->tp_replicated, "%s: TP-summed", q->name);
    }
    EXPECT(n == 3 + 2 * (9 + 5), "%d tensors, expected 31", n);
    double C = 64, HD = 96, KD = 48, F = 160, L = 2, V = 128, T = 32;
    double want_flops = 6 * (L * (2 * HD * C + 2 * KD * C + 3 * C * F) + V * C) + 6 * L * HD * T;
    EXPECT(fabs(model_flops_per_token(&cfg, 32) - want_flops) <= 1e-9 * want_flops,
           "flops per token %.6g, expected %.6g", model_flops_per_token(&cfg, 32), want_flops);
    free(p);
}

int main(void) {
    struct backend *be = backend_cpu_init(2);
    test_options_table();
    test_causality(be);
    test_initial_loss(be);
    test_accumulation(be, DTYPE_FP64);
    test_accumulation(be, DTYPE_FP32);
    test_model_finite_differences(be);
    test_init(be);
    backend_free(be);
    return test_finish("test_model_props");
}

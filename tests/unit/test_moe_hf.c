// test_moe_hf.c: trident's mixture-of-experts decoder against transformers
// 4.46.3's MixtralForCausalLM and Qwen2MoeForCausalLM (issue 31), from the
// fixture tests/reference/fixtures/moe_model.h5 (made by
// tests/reference/moe_model_reference.py: tiny random models, 8 experts,
// top-2, Qwen2-MoE with a gated shared expert, q/k/v biases and
// norm_topk_prob false). The weights go in by name (the fixture holds them in
// trident's stacked layout, Mixtral's names mapped to Qwen2-MoE's); in FP32:
//  - the logits at all 64 positions equal transformers' within 1e-5 relative;
//  - every layer routes every token to transformers' top-2 experts, in order;
//  - the load-balancing loss of the step (model_moe_stats_take) equals
//    transformers' aux_loss (both layers' router logits, no mask) within 1e-5.
// (tests/e2e/hf_moe.sh checks models of both classes through the Hugging Face
// folders trident reads and writes: init_from, import, ckpt logits, export.)
#include <math.h>
#include <string.h>

#include "h5fixture.h"
#include "model/model.h"
#include "test.h"

#define FIXTURE "tests/reference/fixtures/moe_model.h5"

static void check_group(struct backend *be, hid_t f, const char *g) {
    char path[160];
#define ATTR(k) h5fixture_attr_f64(f, g, k)
    struct llama_config c = {
        .vocab_size = (int)ATTR("vocab_size"), .d_model = (int)ATTR("d_model"),
        .n_layers = (int)ATTR("n_layers"), .n_heads = (int)ATTR("n_heads"),
        .n_kv_heads = (int)ATTR("n_kv_heads"), .ffn_dim = (int)ATTR("ffn_dim"),
        .max_seq_len = (int)ATTR("max_seq_len"), .rope_theta = ATTR("rope_theta"),
        .norm_eps = (float)ATTR("norm_eps"), .tie_embeddings = false, .init_std = 0.02f,
        .qkv_bias = ATTR("qkv_bias") != 0, .moe_experts = (int)ATTR("moe_experts"),
        .moe_top_k = (int)ATTR("moe_top_k"), .moe_ffn_dim = (int)ATTR("moe_ffn_dim"),
        .moe_shared_experts = ATTR("moe_shared_ffn_dim") > 0,
        .moe_shared_ffn_dim = (int)ATTR("moe_shared_ffn_dim"), .moe_shared_gate = true,
        .moe_norm_topk = ATTR("moe_norm_topk") != 0, .moe_aux_loss_coeff = 0.01,
    };
    double want_aux = ATTR("aux_loss");
#undef ATTR
    struct h5fixture_shape sh;
    snprintf(path, sizeof path, "%s/tokens", g);
    int32_t *tok = h5fixture_read_i32(f, path, &sh);
    int T = (int)sh.dims[0];
    struct model_shard shard = model_shard_full(&c);
    struct model *m;
    struct error err;
    CHECK(!model_init(&m, be, &c, &shard, DTYPE_FP32, 1, T, 1, &err), "%s: %s", g, err.msg);
    int n;
    const struct param_info *p = model_params(m, &n);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/param/%s", g, p[i].name);
        float *w = h5fixture_read_f32(f, path, &sh);
        EXPECT((size_t)sh.dims[0] * (sh.ndims > 1 ? sh.dims[1] : 1) == p[i].numel,
               "%s: %s has %zu elements in the fixture", g, p[i].name, p[i].numel);
        model_set_param(m, &p[i], w);
        free(w);
    }
    int32_t *tgt = malloc((size_t)T * sizeof *tgt);
    for (int t = 0; t < T; t++) tgt[t] = tok[(t + 1) % T];
    double loss;
    long count;
    model_zero_grad(m);
    model_forward(m, tok, tgt, &loss, &count);
    size_t nl = (size_t)T * c.vocab_size;
    double *got = malloc(nl * sizeof *got), num = 0, den = 0;
    model_get_logits(m, got);
    snprintf(path, sizeof path, "%s/logits", g);
    float *want = h5fixture_read_f32(f, path, &sh);
    for (size_t i = 0; i < nl; i++) num += (got[i] - want[i]) * (got[i] - want[i]), den += (double)want[i] * want[i];
    double rel = sqrt(num / den);
    EXPECT(rel <= 1e-5, "%s: logits differ from transformers' by %.3e relative", g, rel);
    int k = c.moe_top_k, same = 0;
    int32_t *idx = malloc((size_t)T * k * sizeof *idx);
    for (int l = 0; l < c.n_layers; l++) {
        model_moe_topk(m, 0, l, idx);
        snprintf(path, sizeof path, "%s/topk_idx/%d", g, l);
        int32_t *ref = h5fixture_read_i32(f, path, &sh);
        for (int i = 0; i < T * k; i++) same += idx[i] == ref[i];
        EXPECT(!memcmp(idx, ref, (size_t)T * k * sizeof *idx), "%s: layer %d routes differently from "
               "transformers (%d of %d choices the same so far)", g, l, same, (l + 1) * T * k);
        free(ref);
    }
    model_backward(m, 1.0 / count);
    double st[4 + 64 * 8];
    CHECK(model_moe_stats_numel(m) <= sizeof st / sizeof *st, "stats");
    model_moe_stats_take(m, st);
    EXPECT(fabs(st[1] - want_aux) <= 1e-5 * want_aux, "%s: aux loss %.9f, transformers' %.9f", g,
           st[1], want_aux);
    printf("%s: logits %.2e relative, %d of %d router choices equal, aux loss %.7f (transformers %.7f)\n",
           g, rel, same, c.n_layers * T * k, st[1], want_aux);
    free(idx), free(want), free(got), free(tgt), free(tok);
    model_free(m);
}

int main(void) {
    hid_t f = h5fixture_open(FIXTURE);
    struct backend *be = backend_cpu_init(2);
    check_group(be, f, "mixtral");
    check_group(be, f, "qwen2moe");
    backend_free(be);
    h5fixture_close(f);
    return test_finish("test_moe_hf");
}

// test_docmask_model.c: [data] packing = concat_reset at the model level
// (model_set_doc_eot). One microbatch of two rows: row 0 packs document A
// (37 tokens of ids [64, 128), the last one the end-of-text id 0) before
// document B (59 tokens of ids [1, 64)); row 1 holds B alone at its start,
// then filler. With document masking
// - B's logits in row 0 equal row 1's (1e-6 relative in FP32, 1e-12 in FP64):
//   a packed document computes as if alone (block-diagonal attention, RoPE
//   positions from its start; B spans the CPU kernel's 64-row blocks);
// - the gradient of B's loss (row 0's B targets only) with respect to the
//   embedding rows of A's ids, end-of-text included, is exactly 0;
// - recompute = selective and full give the gradients of none, bit for bit.
// With packing = concat (no doc_eot) B's logits differ from row 1's and A's
// embedding rows get a gradient: the test can fail.
#include <math.h>
#include <string.h>

#include "base/rng.h"
#include "model/model.h"
#include "test.h"

enum { V = 128, B = 2, T = 96, LA = 37, LB = T - LA, EOT = 0 };

static struct llama_config small_config(void) {
    return (struct llama_config){
        .vocab_size = V, .d_model = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
        .ffn_dim = 160, .max_seq_len = 128, .rope_theta = 10000.0, .norm_eps = 1e-5f,
        .tie_embeddings = false, .init_std = 0.02f, .label_smoothing = 0.0f,
    };
}

static uint64_t rng_state = 2026;
static uint32_t rand_u32(void) { return (uint32_t)((rng_state = rng_splitmix64(rng_state)) >> 32); }

static int32_t tokens[B * T], targets[B * T];

// Row 0: A then B; row 1: B then filler. Targets: row 0's B positions only
// (the next token within B; B's last position has none in the row).
static void make_batch(void) {
    int32_t doc_b[LB];
    for (int t = 0; t < LB; t++) doc_b[t] = 1 + rand_u32() % 63;
    for (int t = 0; t < LA; t++) tokens[t] = 64 + rand_u32() % 64;
    tokens[LA - 1] = EOT;
    memcpy(tokens + LA, doc_b, sizeof doc_b);
    memcpy(tokens + T, doc_b, sizeof doc_b);
    for (int t = LB; t < T; t++) tokens[T + t] = 1 + rand_u32() % 127;
    for (int i = 0; i < B * T; i++) targets[i] = IGNORE_INDEX;
    for (int t = LA; t < T - 1; t++) targets[t] = tokens[t + 1];
}

static struct model *new_model(enum dtype dt, enum recompute rc, bool docs) {
    struct llama_config cfg = small_config();
    struct model_shard shard = model_shard_full(&cfg);
    shard.recompute = rc;
    struct model *m;
    struct error err;
    CHECK(!model_init(&m, backend_cpu_init(1), &cfg, &shard, dt, B, T, 99, &err), "%s", err.msg);
    if (docs) model_set_doc_eot(m, EOT);
    return m;
}

static void free_model(struct model *m) {
    struct backend *be = model_backend(m);
    model_free(m);
    backend_free(be);
}

// Relative error of row 0's B logits against row 1's.
static double packed_vs_alone(struct model *m) {
    double loss, *logits = malloc((size_t)B * T * V * sizeof *logits);
    long n;
    model_forward(m, tokens, targets, &loss, &n);
    model_get_logits(m, logits);
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)LB * V; i++) {
        double a = logits[(size_t)LA * V + i], b = logits[(size_t)T * V + i];
        num += (a - b) * (a - b), den += b * b;
    }
    free(logits);
    return sqrt(num / den);
}

// The gradient arena after one forward and backward of the batch (host
// doubles, *n elements), and the largest |gradient| of A's embedding rows.
static double *grads(struct model *m, size_t *n, double *a_rows) {
    double loss;
    long count;
    model_zero_grad(m);
    model_forward(m, tokens, targets, &loss, &count);
    model_backward(m, 1.0 / (double)count);
    const struct param_info *p = model_find_param(m, "model.embed_tokens.weight");
    double *wte = malloc((size_t)V * 64 * sizeof *wte);
    model_get_grad(m, p, wte);
    *a_rows = 0;
    for (int v = 0; v < V; v++)
        if (v == EOT || v >= 64)
            for (int c = 0; c < 64; c++) *a_rows = fmax(*a_rows, fabs(wte[v * 64 + c]));
    free(wte);
    struct tensor g = model_grad_arena(m);
    double *all = malloc(g.numel * sizeof *all);
    model_to_host_f64(m, g, all);
    *n = g.numel;
    return all;
}

static void test_invariance(enum dtype dt, double tol) {
    const char *name = dtype_name(dt);
    struct model *m = new_model(dt, RECOMPUTE_NONE, true);
    double e = packed_vs_alone(m), e_reset = e;
    EXPECT(e <= tol, "%s concat_reset: B's logits packed after A vs alone: relative error %.3e > %.1e",
           name, e, tol);
    size_t n;
    double a_rows, *g0 = grads(m, &n, &a_rows);
    EXPECT(a_rows == 0, "%s concat_reset: B's loss has gradient %.3e on A's embedding rows", name,
           a_rows);
    free_model(m);
    enum recompute rcs[] = {RECOMPUTE_SELECTIVE, RECOMPUTE_FULL};
    for (int i = 0; i < 2; i++) {
        m = new_model(dt, rcs[i], true);
        size_t n2;
        double dummy, *g = grads(m, &n2, &dummy);
        EXPECT(n2 == n && !memcmp(g, g0, n * sizeof *g),
               "%s concat_reset: recompute %d gradients differ from recompute none", name, rcs[i]);
        free(g);
        free_model(m);
    }
    free(g0);

    m = new_model(dt, RECOMPUTE_NONE, false); // packing = concat: the documents mix
    e = packed_vs_alone(m);
    EXPECT(e > 1e-3, "%s concat: B's logits packed after A equal alone (%.3e): not attending across",
           name, e);
    double *g = grads(m, &n, &a_rows);
    EXPECT(a_rows > 0, "%s concat: no gradient on A's embedding rows", name);
    free(g);
    free_model(m);
    printf("%s: B packed after A vs alone: relative error %.2e with concat_reset, %.2e with concat\n",
           name, e_reset, e);
}

int main(void) {
    make_batch();
    test_invariance(DTYPE_FP32, 1e-6);
    test_invariance(DTYPE_FP64, 1e-12);
    return test_finish("test_docmask_model");
}

// test_split_backward.c: the backward split of the zero-bubble schedules
// (model.h: model_backward_chunk_input / _weight; Qi et al. 2024 §2) against
// the fused backward (model_backward_chunk) of a second model from the same
// seed, bit for bit (memcmp):
// - a whole-model shard, three microbatches forward into three slots, then
//   B0 B1 W0 B2 W1 W2 into two W stashes (0 1 0), each slot overwritten by
//   another microbatch's forward right after its B (the W must read only
//   its stash; the reference: the three fused backwards in order):
//   the gradient arena, in fp32 and bf16, recompute none, selective and
//   full, for the plain model, issue 28's options (head_dim 24, qkv_bias,
//   qk_norm: q, k, v not joined) and an odd-sized model (d_model 40, ffn 100:
//   neither q/k/v nor gate/up consecutive without padding, biases), each
//   with and without packed-document masks (model_set_doc_eot);
// - two chunks on one rank (six slots, four W stashes; chunk 1's B before
//   chunk 0's, W's interleaved), untied and tied (the tied head's share goes apart:
//   model_finish_grads adds it; reference: the same split shard's fused
//   pass);
// - ZB-V (pipeline stage 0 holding virtual stages 0 and 3, stage 1 holding
//   1 and 2, messages passed by hand, B/W split) against 1F1B at p = 2 (two
//   stages, the tied embedding's two copies summed as the trainer's
//   all-reduce does): the loss of every microbatch and the gradient of every
//   parameter of the model, by name, tied and untied, fp32 and bf16 (the
//   last microbatch's loss through stage 0's device accumulator,
//   model_loss_sum_take);
// - without a gradient arena (ZeRO-2/3's binding, a unit hook in the manner
//   of fsdp.c: a zeroed buffer per unit event, poisoned after B, summed per
//   microbatch): the split's per-unit sums equal the fused pass's;
// - model_plan's activation and gradient bytes equal what model_init
//   allocates with split_backward, the split adds exactly w_stash_bytes,
//   which is n_wstash stashes of the closed form of model.h (recompute none;
//   the same in every recompute mode: the stash holds every W operand).
#include <math.h>
#include <string.h>

#include "model/model.h"
#include "test.h"

static const char *mode_name[] = {"none", "selective", "full"};

enum variant { PLAIN, OPTIONS, ODD, N_VARIANTS };
static const char *variant_name[] = {"plain", "options", "odd sizes"};

static struct llama_config config_of(enum variant v, bool tied, int layers) {
    struct llama_config c = {
        .vocab_size = 200, .d_model = 64, .n_layers = layers, .n_heads = 4, .n_kv_heads = 2,
        .ffn_dim = 160, .max_seq_len = 64, .rope_theta = 10000.0, .norm_eps = 1e-5f,
        .tie_embeddings = tied, .init_std = 0.05f, .label_smoothing = 0.1f,
    };
    if (v == OPTIONS) c.head_dim = 24, c.qkv_bias = c.qk_norm = true;
    if (v == ODD) c.d_model = 40, c.ffn_dim = 100, c.qkv_bias = true;
    return c;
}

enum { B_ = 2, T_ = 16, MICRO = 3, EOT = 5 };

// Microbatch mb's tokens (with end-of-text ids: documents under doc masks)
// and targets (one ignored).
static void tokens_for(int mb, int n, int V, int32_t *tokens, int32_t *targets) {
    for (int i = 0; i < n; i++) {
        tokens[i] = (i * 37 + mb * 101 + 3) % V;
        if ((i + mb) % 7 == 3) tokens[i] = EOT;
        targets[i] = (i * 53 + mb * 7 + 11) % V;
    }
    targets[mb + 2] = IGNORE_INDEX;
}

static char *arena_bytes(struct model *m, size_t *bytes) {
    struct tensor g = model_grad_arena(m);
    *bytes = g.numel * dtype_size(g.dtype);
    char *out = malloc(*bytes);
    backend_to_host(model_backend(m), out, g.data, *bytes);
    return out;
}

static void expect_bytes(const char *a, const char *b, size_t n, const char *what) {
    size_t i = 0;
    while (i < n && a[i] == b[i]) i++;
    EXPECT(i == n, "%s: gradients differ from the fused pass (first differing byte %zu of %zu)",
           what, i, n);
}

// ---- a whole-model shard -------------------------------------------------------------

// After the B of the microbatch in `slot`: another microbatch's forward into
// the slot (B frees it; its W must read only the W stash).
static void clobber_slot(struct model *m, const struct llama_config *cfg, int slot) {
    int n = B_ * T_;
    int32_t tokens[n], targets[n];
    double loss;
    long count;
    tokens_for(slot + 7, n, cfg->vocab_size, tokens, targets);
    model_forward_chunk(m, 0, slot, tokens, NULL, targets, NULL, &loss, &count);
}

// Three microbatches forward into slots 0..2, then split (B0 B1 W0 B2 W1 W2,
// W stashes 0 1 0, each slot clobbered after its B) or fused backwards in
// order; returns the gradient arena's bytes.
static char *run_whole(struct backend *be, const struct llama_config *cfg, enum dtype dt,
                       enum recompute r, bool docs, bool split, size_t *bytes, double loss[MICRO]) {
    struct model_shard shard = model_shard_full(cfg);
    shard.recompute = r, shard.n_slots = MICRO, shard.split_backward = split;
    shard.n_wstash = 2;
    struct model *m;
    struct error err;
    CHECK(!model_init(&m, be, cfg, &shard, dt, B_, T_, 9, &err), "%s", err.msg);
    if (docs) model_set_doc_eot(m, EOT);
    int n = B_ * T_;
    int32_t tokens[MICRO][n], targets[MICRO][n];
    model_zero_grad(m);
    for (int k = 0; k < MICRO; k++) {
        long count;
        tokens_for(k, n, cfg->vocab_size, tokens[k], targets[k]);
        model_forward_chunk(m, 0, k, tokens[k], NULL, targets[k], NULL, &loss[k], &count);
    }
    double s = 1.0 / (MICRO * n);
    if (split) {
        model_backward_chunk_input(m, 0, 0, 0, s, NULL, NULL);
        clobber_slot(m, cfg, 0);
        model_backward_chunk_input(m, 0, 1, 1, s, NULL, NULL);
        clobber_slot(m, cfg, 1);
        model_backward_chunk_weight(m, 0, 0);
        model_backward_chunk_input(m, 0, 2, 0, s, NULL, NULL);
        clobber_slot(m, cfg, 2);
        model_backward_chunk_weight(m, 0, 1);
        model_backward_chunk_weight(m, 0, 0);
    } else {
        for (int k = 0; k < MICRO; k++) model_backward_chunk(m, 0, k, s, NULL, NULL);
    }
    model_finish_grads(m);
    char *g = arena_bytes(m, bytes);
    model_free(m);
    return g;
}

static void test_whole(struct backend *be) {
    enum dtype dts[] = {DTYPE_FP32, DTYPE_BF16};
    for (int d = 0; d < 2; d++)
        for (enum variant v = 0; v < N_VARIANTS; v++)
            for (enum recompute r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++)
                for (int docs = 0; docs < 2; docs++) {
                    struct llama_config cfg = config_of(v, false, 3);
                    size_t nr, ns;
                    double lr[MICRO], ls[MICRO];
                    char *ref = run_whole(be, &cfg, dts[d], r, docs, false, &nr, lr);
                    char *got = run_whole(be, &cfg, dts[d], r, docs, true, &ns, ls);
                    char what[128];
                    snprintf(what, sizeof what, "whole model, %s, %s, recompute %s%s",
                             dtype_name(dts[d]), variant_name[v], mode_name[r],
                             docs ? ", doc masks" : "");
                    EXPECT(nr == ns, "%s: arenas of %zu and %zu bytes", what, nr, ns);
                    EXPECT(!memcmp(lr, ls, sizeof lr) && lr[0] > 0, "%s: losses differ", what);
                    if (nr == ns) expect_bytes(got, ref, nr, what);
                    free(ref), free(got);
                }
}

// ---- two chunks on one rank ------------------------------------------------------------

// Chunk 0 of microbatch k in slot 2k, chunk 1 in 2k + 1; backwards chunk 1
// then chunk 0 per microbatch, fused or with the W's one microbatch behind
// (chunk c of microbatch k in W stash 2 (k % 2) + c).
static char *run_chunks(struct backend *be, const struct llama_config *cfg, enum dtype dt,
                        enum recompute r, bool split_shard, bool split, size_t *bytes) {
    struct model_shard shard = model_shard_pipeline(cfg, PP_SCHEDULE_1F1B, 1, 0, 2);
    shard.recompute = r, shard.n_slots = 2 * MICRO, shard.split_backward = split_shard;
    shard.n_wstash = 4;
    struct model *m;
    struct error err;
    CHECK(!model_init(&m, be, cfg, &shard, dt, B_, T_, 9, &err), "%s", err.msg);
    int n = B_ * T_;
    size_t msg = model_stage_message_numel(m) * dtype_size(dt);
    char *act = malloc(MICRO * msg), *grad = malloc(msg), *back = malloc(msg);
    int32_t tokens[MICRO][n], targets[MICRO][n];
    model_zero_grad(m);
    for (int k = 0; k < MICRO; k++) {
        double loss;
        long count;
        tokens_for(k, n, cfg->vocab_size, tokens[k], targets[k]);
        model_forward_chunk(m, 0, 2 * k, tokens[k], NULL, NULL, act + k * msg, &loss, &count);
        model_forward_chunk(m, 1, 2 * k + 1, NULL, act + k * msg, targets[k], NULL, &loss, &count);
    }
    double s = 1.0 / (MICRO * n);
    for (int k = 0; k < MICRO; k++) {
        if (!split) {
            model_backward_chunk(m, 1, 2 * k + 1, s, NULL, grad);
            memcpy(back, grad, msg);
            model_backward_chunk(m, 0, 2 * k, s, back, NULL);
            continue;
        }
        int w = 2 * (k % 2), prev = 2 * ((k + 1) % 2); // this microbatch's, the one before's
        model_backward_chunk_input(m, 1, 2 * k + 1, w + 1, s, NULL, grad);
        if (k > 0) model_backward_chunk_weight(m, 1, prev + 1);
        memcpy(back, grad, msg);
        model_backward_chunk_input(m, 0, 2 * k, w, s, back, NULL);
        if (k > 0) model_backward_chunk_weight(m, 0, prev);
    }
    if (split) {
        int last = 2 * ((MICRO - 1) % 2);
        model_backward_chunk_weight(m, 1, last + 1);
        model_backward_chunk_weight(m, 0, last);
    }
    model_finish_grads(m);
    char *g = arena_bytes(m, bytes);
    free(act), free(grad), free(back);
    model_free(m);
    return g;
}

static void test_chunks(struct backend *be) {
    enum dtype dts[] = {DTYPE_FP32, DTYPE_BF16};
    for (int d = 0; d < 2; d++)
        for (int tied = 0; tied < 2; tied++)
            for (enum recompute r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++) {
                struct llama_config cfg = config_of(tied ? PLAIN : OPTIONS, tied, 4);
                size_t nr, ns;
                // tied: the reference is the split shard's fused pass (its head's
                // share of the embedding's gradient apart, as the split's)
                char *ref = run_chunks(be, &cfg, dts[d], r, tied, false, &nr);
                char *got = run_chunks(be, &cfg, dts[d], r, true, true, &ns);
                char what[128];
                snprintf(what, sizeof what, "2 chunks, %s, %s, recompute %s", dtype_name(dts[d]),
                         tied ? "tied" : "untied, options", mode_name[r]);
                EXPECT(nr == ns, "%s: arenas of %zu and %zu bytes", what, nr, ns);
                if (nr == ns) expect_bytes(got, ref, nr, what);
                free(ref), free(got);
            }
}

// ---- ZB-V against 1F1B at p = 2 ------------------------------------------------------------

struct stage_run {
    struct model *m[2];
    double loss[MICRO];
};

static struct model *stage_model(struct backend *be, const struct llama_config *cfg,
                                 enum pp_schedule kind, int s, int v, enum dtype dt,
                                 enum recompute r) {
    struct model_shard shard = model_shard_pipeline(cfg, kind, 2, s, v);
    shard.recompute = r, shard.n_slots = v * MICRO;
    if (shard.split_backward) shard.n_wstash = 4; // two chunks, two microbatches pending
    struct model *m;
    struct error err;
    CHECK(!model_init(&m, be, cfg, &shard, dt, B_, T_, 9, &err), "%s", err.msg);
    model_zero_grad(m);
    return m;
}

// 1F1B at p = 2: stage 0 [0, L/2) and the embedding, stage 1 the rest and the
// head; every microbatch forward then backward, fused.
static void run_1f1b(struct backend *be, const struct llama_config *cfg, enum dtype dt,
                     enum recompute r, struct stage_run *out) {
    for (int s = 0; s < 2; s++) out->m[s] = stage_model(be, cfg, PP_SCHEDULE_1F1B, s, 1, dt, r);
    int n = B_ * T_;
    size_t msg = model_stage_message_numel(out->m[0]) * dtype_size(dt);
    char *a = malloc(msg), *g = malloc(msg);
    double s = 1.0 / (MICRO * n);
    for (int k = 0; k < MICRO; k++) {
        int32_t tokens[n], targets[n];
        long count;
        double unused;
        tokens_for(k, n, cfg->vocab_size, tokens, targets);
        model_forward_chunk(out->m[0], 0, k, tokens, NULL, NULL, a, &unused, &count);
        model_forward_chunk(out->m[1], 0, k, tokens, a, targets, NULL, &out->loss[k], &count);
        model_backward_chunk(out->m[1], 0, k, s, NULL, g);
        model_backward_chunk(out->m[0], 0, k, s, g, NULL);
    }
    for (int i = 0; i < 2; i++) model_finish_grads(out->m[i]);
    free(a), free(g);
}

// ZB-V at p = 2: stage 0 chunks (virtual stages) 0 and 3, stage 1 chunks 1
// and 2; forward 0 -> 1 -> 2 -> 3 (the loss on stage 0), B back down, and
// each microbatch's W's after the next microbatch's B's (the last at the end);
// chunk c of microbatch k in W stash 2 (k % 2) + c.
static void run_zbv(struct backend *be, const struct llama_config *cfg, enum dtype dt,
                    enum recompute r, struct stage_run *out) {
    for (int s = 0; s < 2; s++) out->m[s] = stage_model(be, cfg, PP_SCHEDULE_ZBV, s, 2, dt, r);
    struct model *z0 = out->m[0], *z1 = out->m[1];
    EXPECT(model_is_first_stage(z0) && model_is_last_stage(z0) && !model_is_first_stage(z1) &&
               !model_is_last_stage(z1),
           "ZB-V at p = 2: stage 0 holds the first and the last virtual stage, stage 1 neither");
    int n = B_ * T_;
    size_t msg = model_stage_message_numel(z0) * dtype_size(dt);
    char *a = malloc(msg), *b = malloc(msg), *g = malloc(msg), *h = malloc(msg);
    double s = 1.0 / (MICRO * n);
    for (int k = 0; k <= MICRO; k++) {
        if (k < MICRO) {
            int32_t tokens[n], targets[n];
            long count;
            double unused;
            tokens_for(k, n, cfg->vocab_size, tokens, targets);
            model_forward_chunk(z0, 0, 2 * k, tokens, NULL, NULL, a, &unused, &count);
            model_forward_chunk(z1, 0, 2 * k, tokens, a, NULL, b, &unused, &count);
            model_forward_chunk(z1, 1, 2 * k + 1, tokens, b, NULL, a, &unused, &count);
            // the last microbatch's loss through the device accumulator (the trainer's way)
            bool acc = k == MICRO - 1;
            model_forward_chunk(z0, 1, 2 * k + 1, tokens, a, targets, NULL, acc ? NULL : &out->loss[k],
                                acc ? NULL : &count);
            if (acc) out->loss[k] = model_loss_sum_take(z0);
            EXPECT(model_loss_sum_take(z1) == 0, "ZB-V stage 1 has no loss");
            int w = 2 * (k % 2);
            model_backward_chunk_input(z0, 1, 2 * k + 1, w + 1, s, NULL, g);
            model_backward_chunk_input(z1, 1, 2 * k + 1, w + 1, s, g, h);
            model_backward_chunk_input(z1, 0, 2 * k, w, s, h, g);
            model_backward_chunk_input(z0, 0, 2 * k, w, s, g, NULL);
        }
        if (k == 0) continue;
        int j = 2 * ((k - 1) % 2); // the W's of the microbatch before
        model_backward_chunk_weight(z0, 1, j + 1);
        model_backward_chunk_weight(z1, 1, j + 1);
        model_backward_chunk_weight(z1, 0, j);
        model_backward_chunk_weight(z0, 0, j);
    }
    for (int i = 0; i < 2; i++) model_finish_grads(out->m[i]);
    free(a), free(b), free(g), free(h);
}

// The gradient of parameter `name` of a two-stage run as the trainer leaves
// it: a tied embedding held by both stages summed in fp32 (the embedding
// group's all-reduce); NULL when no stage holds it.
static double *grad_of(struct stage_run *r, const char *name, size_t *numel) {
    double *sum = NULL;
    for (int s = 0; s < 2; s++) {
        const struct param_info *p = model_find_param(r->m[s], name);
        if (!p) continue;
        double *g = malloc(p->numel * sizeof *g);
        model_get_grad(r->m[s], p, g);
        if (!sum) {
            sum = g, *numel = p->numel;
            continue;
        }
        for (size_t i = 0; i < p->numel; i++) sum[i] = (float)sum[i] + (float)g[i];
        free(g);
    }
    return sum;
}

static void test_zbv(struct backend *be) {
    enum dtype dts[] = {DTYPE_FP32, DTYPE_BF16};
    for (int d = 0; d < 2; d++)
        for (int tied = 0; tied < 2; tied++)
            for (enum recompute r = RECOMPUTE_NONE; r <= RECOMPUTE_SELECTIVE; r++) {
                struct llama_config cfg = config_of(tied ? PLAIN : OPTIONS, tied, 4);
                struct stage_run ref = {0}, zbv = {0};
                run_1f1b(be, &cfg, dts[d], r, &ref);
                run_zbv(be, &cfg, dts[d], r, &zbv);
                char what[128];
                snprintf(what, sizeof what, "ZB-V vs 1F1B at p = 2, %s, %s, recompute %s",
                         dtype_name(dts[d]), tied ? "tied" : "untied, options", mode_name[r]);
                // the last microbatch's through the device sum: the same within rounding
                EXPECT(fabs(zbv.loss[MICRO - 1] - ref.loss[MICRO - 1]) <= 1e-12 * ref.loss[MICRO - 1],
                       "%s: accumulated loss %.17g, 1F1B %.17g", what, zbv.loss[MICRO - 1],
                       ref.loss[MICRO - 1]);
                zbv.loss[MICRO - 1] = ref.loss[MICRO - 1];
                EXPECT(!memcmp(ref.loss, zbv.loss, sizeof ref.loss) && ref.loss[0] > 0,
                       "%s: losses %.17g %.17g %.17g, 1F1B %.17g %.17g %.17g", what, zbv.loss[0],
                       zbv.loss[1], zbv.loss[2], ref.loss[0], ref.loss[1], ref.loss[2]);
                struct param_info *table;
                int np;
                struct error err;
                CHECK(!model_param_table(&cfg, &table, &np, &err), "%s", err.msg);
                int bad = 0;
                for (int i = 0; i < np; i++) {
                    size_t n1 = 0, n2 = 0;
                    double *g1 = grad_of(&ref, table[i].name, &n1);
                    double *g2 = grad_of(&zbv, table[i].name, &n2);
                    bool same = g1 && g2 && n1 == n2 && !memcmp(g1, g2, n1 * sizeof *g1);
                    if (!same && bad++ < 3)
                        fprintf(stderr, "  %s: %s differs (held: %d, %d)\n", what, table[i].name,
                                g1 != NULL, g2 != NULL);
                    free(g1), free(g2);
                }
                EXPECT(bad == 0, "%s: %d of %d parameters' gradients differ", what, bad, np);
                free(table);
                for (int s = 0; s < 2; s++) model_free(ref.m[s]), model_free(zbv.m[s]);
            }
}

// ---- without a gradient arena (ZeRO-2/3's binding) ----------------------------------------

// A unit hook in the manner of fsdp.c: a zeroed scratch buffer bound as the
// unit's gradients at BACKWARD and WEIGHT, added into the unit's sum at
// BACKWARD_DONE and WEIGHT_DONE (one microbatch at a time, as fsdp's
// reduce-scatters), filled with NaN at INPUT_DONE (B's buffer must not be
// what the W reads).
struct unit_sums {
    struct model *m;
    struct backend *be;
    struct tensor scratch;  // (max unit) fp32
    struct tensor *sum;     // (n_units) fp32
    const struct model_unit *units;
};

static void on_unit(void *ctx, int u, enum model_unit_event ev) {
    struct unit_sums *h = ctx;
    size_t n = h->units[u].end - h->units[u].begin;
    struct tensor g = tensor_slice(h->scratch, 0, n);
    switch (ev) {
    case MODEL_UNIT_BACKWARD:
    case MODEL_UNIT_WEIGHT:
        backend_memset0(h->be, g);
        model_unit_bind(h->m, u, NULL, g.data);
        break;
    case MODEL_UNIT_BACKWARD_DONE:
    case MODEL_UNIT_WEIGHT_DONE:
        backend_add(h->be, h->sum[u], h->sum[u], g, n);
        break;
    case MODEL_UNIT_INPUT_DONE: {
        float *nan = malloc(n * sizeof *nan);
        for (size_t i = 0; i < n; i++) nan[i] = NAN;
        backend_to_device(h->be, g.data, nan, n * sizeof *nan);
        free(nan);
        break;
    }
    default: break;
    }
}

static char *run_unbound(struct backend *be, const struct llama_config *cfg, enum dtype dt,
                         enum recompute r, bool split, size_t *bytes) {
    struct model_shard shard = model_shard_full(cfg);
    shard.recompute = r, shard.n_slots = MICRO, shard.split_backward = split;
    shard.no_grad_arena = true, shard.n_wstash = 2;
    struct model *m;
    struct error err;
    CHECK(!model_init(&m, be, cfg, &shard, dt, B_, T_, 9, &err), "%s", err.msg);
    struct unit_sums h = {.m = m, .be = be};
    int nu;
    h.units = model_units(m, &nu);
    size_t total = 0, big = model_memory(m)->max_unit_numel;
    for (int u = 0; u < nu; u++) total += h.units[u].end - h.units[u].begin;
    struct tensor all = tensor_view(backend_alloc(be, (total + big) * 4), DTYPE_FP32, total + big);
    backend_memset0(be, all);
    h.scratch = tensor_slice(all, total, big);
    h.sum = calloc(nu, sizeof *h.sum);
    for (int u = 0, at = 0; u < nu; at += h.units[u].end - h.units[u].begin, u++)
        h.sum[u] = tensor_slice(all, at, h.units[u].end - h.units[u].begin);
    model_set_unit_hook(m, on_unit, &h);
    int n = B_ * T_;
    int32_t tokens[MICRO][n], targets[MICRO][n];
    for (int k = 0; k < MICRO; k++) {
        double loss;
        long count;
        tokens_for(k, n, cfg->vocab_size, tokens[k], targets[k]);
        model_forward_chunk(m, 0, k, tokens[k], NULL, targets[k], NULL, &loss, &count);
    }
    double s = 1.0 / (MICRO * n);
    if (split) { // W stashes 0 1 0
        model_backward_chunk_input(m, 0, 0, 0, s, NULL, NULL);
        model_backward_chunk_input(m, 0, 1, 1, s, NULL, NULL);
        model_backward_chunk_weight(m, 0, 0);
        model_backward_chunk_input(m, 0, 2, 0, s, NULL, NULL);
        model_backward_chunk_weight(m, 0, 1);
        model_backward_chunk_weight(m, 0, 0);
    } else {
        for (int k = 0; k < MICRO; k++) model_backward_chunk(m, 0, k, s, NULL, NULL);
    }
    *bytes = total * 4;
    char *out = malloc(*bytes);
    backend_to_host(be, out, all.data, *bytes);
    model_set_unit_hook(m, NULL, NULL);
    model_free(m);
    backend_dealloc(be, all.data);
    free(h.sum);
    return out;
}

static void test_unbound(struct backend *be) {
    enum dtype dts[] = {DTYPE_FP32, DTYPE_BF16};
    for (int d = 0; d < 2; d++)
        for (enum variant v = 0; v < N_VARIANTS; v++)
            for (enum recompute r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r += 2) {
                struct llama_config cfg = config_of(v, false, 3);
                size_t nr, ns;
                char *ref = run_unbound(be, &cfg, dts[d], r, false, &nr);
                char *got = run_unbound(be, &cfg, dts[d], r, true, &ns);
                char what[128];
                snprintf(what, sizeof what, "no gradient arena (unit buffers), %s, %s, recompute %s",
                         dtype_name(dts[d]), variant_name[v], mode_name[r]);
                bool finite = true;
                for (size_t i = 0; i < nr / 4; i++) finite &= isfinite(((float *)ref)[i]);
                EXPECT(finite, "%s: the fused reference has non-finite sums", what);
                if (nr == ns) expect_bytes(got, ref, nr, what);
                free(ref), free(got);
            }
}

// ---- the plan ------------------------------------------------------------------------------

static void test_plan(struct backend *be) {
    struct error err;
    for (enum recompute r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++)
        for (int tied = 0; tied < 2; tied++)
            for (int arena = 0; arena < 2; arena++) {
                struct llama_config cfg = config_of(OPTIONS, tied, 4);
                // ZB-V stage 0 (embedding and head: a tied head's buffer) and a whole model
                struct model_shard shards[2] = {model_shard_pipeline(&cfg, PP_SCHEDULE_ZBV, 2, 0, 2),
                                                model_shard_full(&cfg)};
                shards[1].split_backward = true;
                for (int k = 0; k < 2; k++) {
                    struct model_shard sh = shards[k];
                    sh.recompute = r, sh.n_slots = 5, sh.n_wstash = 3, sh.no_grad_arena = !arena;
                    struct model_memory plan, plain;
                    CHECK(!model_plan(&cfg, &sh, DTYPE_BF16, B_, T_, &plan, &err), "%s", err.msg);
                    struct model *m;
                    CHECK(!model_init(&m, be, &cfg, &sh, DTYPE_BF16, B_, T_, 9, &err), "%s", err.msg);
                    const struct model_memory *got = model_memory(m);
                    EXPECT(plan.activation_bytes == got->activation_bytes &&
                               plan.grad_bytes == got->grad_bytes &&
                               plan.w_stash_bytes == got->w_stash_bytes && plan.w_stash_bytes > 0,
                           "%s, recompute %s, tied %d, arena %d: planned activations %zu, grads %zu, "
                           "stash %zu; allocated %zu, %zu, %zu", k ? "whole" : "ZB-V stage 0",
                           mode_name[r], tied, arena, plan.activation_bytes, plan.grad_bytes,
                           plan.w_stash_bytes, got->activation_bytes, got->grad_bytes,
                           got->w_stash_bytes);
                    sh.split_backward = false;
                    CHECK(!model_plan(&cfg, &sh, DTYPE_BF16, B_, T_, &plain, &err), "%s", err.msg);
                    EXPECT(plan.activation_bytes - plain.activation_bytes == plan.w_stash_bytes,
                           "the split adds %zu activation bytes, w_stash_bytes says %zu",
                           plan.activation_bytes - plain.activation_bytes, plan.w_stash_bytes);
                    size_t head = (size_t)cfg.vocab_size * cfg.d_model * 4;
                    size_t want_g = !arena ? 0 : tied ? (plain.grad_bytes + 255) / 256 * 256 + head
                                                                : plain.grad_bytes;
                    EXPECT(plan.grad_bytes == want_g, "grad bytes %zu, expected %zu", plan.grad_bytes,
                           want_g);
                    model_free(m);
                }
            }
    // model.h's closed form, fp32, every piece a multiple of 256 bytes, per
    // stash: per layer the output gradients 2 N C + 2 N Fl + N H D + 2 N Hkv
    // D and the inputs N Fl + 2 N C + N H D floats, the head N V + N C; two
    // stashes (not the five slots), in every recompute mode.
    struct llama_config cfg = config_of(PLAIN, false, 3);
    size_t N = B_ * T_, C = cfg.d_model, F = cfg.ffn_dim, HD = C, KD = C / 2, V = cfg.vocab_size;
    size_t block = 2 * N * C + 2 * N * F + N * HD + 2 * N * KD + N * F + 2 * N * C + N * HD;
    size_t want = 2 * (3 * block + N * V + N * C) * 4;
    for (enum recompute r = RECOMPUTE_NONE; r <= RECOMPUTE_FULL; r++) {
        struct model_shard sh = model_shard_full(&cfg);
        sh.split_backward = true, sh.n_slots = 5, sh.n_wstash = 2, sh.recompute = r;
        struct model_memory mem;
        CHECK(!model_plan(&cfg, &sh, DTYPE_FP32, B_, T_, &mem, &err), "%s", err.msg);
        EXPECT(mem.w_stash_bytes == want, "recompute %s: w_stash_bytes %zu, expected %zu",
               mode_name[r], mem.w_stash_bytes, want);
    }
}

int main(void) {
    struct backend *be = backend_cpu_init(2);
    test_whole(be);
    test_chunks(be);
    test_zbv(be);
    test_unbound(be);
    test_plan(be);
    backend_free(be);
    return test_finish("test_split_backward");
}

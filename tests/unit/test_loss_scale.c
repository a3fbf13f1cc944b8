// test_loss_scale.c: the fp16 loss scaler (struct loss_scaler, train_step.h)
// and the master weights of a 16-bit model (optimizer.h).
// - loss_scaler_update: backoff on an overflow with a finite loss (absorbed,
//   not below min_scale), growth after growth_interval applied steps in a
//   row (an overflow resets the count), an overflow at min_scale, a
//   non-finite loss or a fixed scale is not absorbed (it counts toward
//   max_skipped_steps).
// - Scaling is exactly undone: a bf16 model (fp32's exponent range, so
//   nothing under- or overflows) trained 3 steps with a fixed scale of 2^10
//   has bit-identical master weights, moments and parameters to one trained
//   with no scaler: the scale is a power of two, so every product and sum of
//   the backward pass, the norm and the clip coefficient are scaled exactly.
// - The master weights start as the bf16 parameters (widened exactly), and
//   after a step the parameters are the master weights rounded to bf16.
#include <string.h>

#include "kernels/backend.h"
#include "model/optimizer.h"
#include "test.h"
#include "train/train_step.h"

static void test_update(void) {
    struct loss_scaler s = {.scale = 8, .min_scale = 2, .backoff = 0.5, .growth = 2,
                            .growth_interval = 3, .dynamic = true};
    EXPECT(loss_scaler_update(&s, true, true) && s.scale == 4, "overflow backs off: %g", s.scale);
    EXPECT(!loss_scaler_update(&s, false, true) && s.good_steps == 1, "good step counted");
    EXPECT(loss_scaler_update(&s, true, true) && s.scale == 2 && s.good_steps == 0,
           "second backoff, counter reset: %g %d", s.scale, s.good_steps);
    EXPECT(!loss_scaler_update(&s, true, true) && s.scale == 2, "at min_scale: not absorbed");
    for (int i = 0; i < 3; i++) loss_scaler_update(&s, false, true);
    EXPECT(s.scale == 4 && s.good_steps == 0, "growth after 3 good steps: %g %d", s.scale, s.good_steps);
    EXPECT(!loss_scaler_update(&s, true, false) && s.scale == 4, "a non-finite loss is not an overflow");
    struct loss_scaler f = {.scale = 1024, .min_scale = 1, .backoff = 0.5, .growth = 2,
                            .growth_interval = 1, .dynamic = false};
    EXPECT(!loss_scaler_update(&f, true, true) && !loss_scaler_update(&f, false, true) &&
           f.scale == 1024, "a fixed scale never changes");
    struct loss_scaler m = {.scale = 3, .min_scale = 2, .backoff = 0.5, .growth = 2,
                            .growth_interval = 9, .dynamic = true};
    EXPECT(loss_scaler_update(&m, true, true) && m.scale == 2, "backoff stops at min_scale: %g", m.scale);
}

struct state {
    char *master, *m, *v, *params;
    size_t master_bytes, mom_bytes, param_bytes;
};

static char *copy_out(struct backend *be, struct tensor t, size_t *bytes) {
    *bytes = t.numel * dtype_size(t.dtype);
    char *h = malloc(*bytes ? *bytes : 1);
    if (*bytes) backend_to_host(be, h, t.data, *bytes);
    return h;
}

// 3 steps of a bf16 model with the given fixed scale (0: no scaler).
static struct state train3(struct backend *be, double scale) {
    struct llama_config cfg = {
        .vocab_size = 96, .d_model = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
        .ffn_dim = 64, .max_seq_len = 16, .rope_theta = 10000.0, .norm_eps = 1e-5f,
        .tie_embeddings = true, .init_std = 0.05f};
    struct model_shard shard = model_shard_full(&cfg);
    struct model *m;
    struct optimizer *opt;
    struct error err;
    int B = 2, T = 16, n = B * T;
    CHECK(!model_init(&m, be, &cfg, &shard, DTYPE_BF16, B, T, 5, &err), "%s", err.msg);
    struct optimizer_config oc = {.lr = 1e-2, .min_lr = 1e-3, .warmup_steps = 1, .steps = 3,
                                  .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                  .weight_decay = 0.1, .grad_clip = 0.5};
    CHECK(!optimizer_init(&opt, be, m, &oc, NULL, &err), "%s", err.msg);
    struct tensor w = model_param_arena(m), mw = optimizer_master(opt);
    EXPECT(mw.numel == w.numel && mw.dtype == DTYPE_FP32, "master weights for the whole arena");
    size_t b1, b2;
    char *pw = copy_out(be, w, &b1);
    float *pm = (float *)copy_out(be, mw, &b2);
    bool same = true; // the master starts as the bf16 values widened
    for (size_t i = 0; i < w.numel; i++) {
        uint32_t u;
        memcpy(&u, &pm[i], 4);
        same &= ((uint16_t *)pw)[i] == (uint16_t)(u >> 16) && (u & 0xffff) == 0;
    }
    EXPECT(same, "master weights start as the bf16 parameters");
    free(pw), free(pm);
    struct loss_scaler s = {.scale = scale, .min_scale = 1, .backoff = 0.5, .growth = 2,
                            .growth_interval = 1000, .dynamic = false};
    struct train_ctx c = {m, opt, &oc, NULL, NULL, NULL, NULL, scale > 0 ? &s : NULL, false, NULL};
    int32_t tokens[2 * n], targets[2 * n];
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < 2 * n; i++)
            tokens[i] = (i * 31 + step * 7 + 1) % 96, targets[i] = (i * 17 + step * 5 + 3) % 96;
        struct train_step_result r;
        CHECK(!train_step_run(&c, step, tokens, targets, 2, B, T, &r, &err), "%s", err.msg);
        EXPECT(!r.skipped && r.loss_scale == (scale > 0 ? scale : 1), "step %d: skipped %d, scale %g",
               step, r.skipped, r.loss_scale);
    }
    struct state st;
    struct tensor mm, vv;
    optimizer_moments(opt, &mm, &vv);
    st.master = copy_out(be, mw, &st.master_bytes);
    st.m = copy_out(be, mm, &st.mom_bytes);
    st.v = copy_out(be, vv, &st.mom_bytes);
    st.params = copy_out(be, w, &st.param_bytes);
    // the parameters are the master weights rounded to bf16
    struct tensor rounded = tensor_view(backend_alloc(be, st.param_bytes), DTYPE_BF16, w.numel);
    backend_copy(be, rounded, mw, w.numel);
    size_t rb;
    char *r = copy_out(be, rounded, &rb);
    EXPECT(rb == st.param_bytes && !memcmp(r, st.params, rb), "parameters = bf16(master)");
    free(r), backend_dealloc(be, rounded.data);
    optimizer_free(opt);
    model_free(m);
    return st;
}

static void test_scale_undone(struct backend *be) {
    struct state a = train3(be, 0), b = train3(be, 1024);
    EXPECT(!memcmp(a.master, b.master, a.master_bytes), "master weights with scale 2^10 differ");
    EXPECT(!memcmp(a.m, b.m, a.mom_bytes) && !memcmp(a.v, b.v, a.mom_bytes), "moments differ");
    EXPECT(!memcmp(a.params, b.params, a.param_bytes), "parameters differ");
    free(a.master), free(a.m), free(a.v), free(a.params);
    free(b.master), free(b.m), free(b.v), free(b.params);
}

int main(void) {
    struct backend *be = backend_cpu_init(2);
    test_update();
    test_scale_undone(be);
    backend_free(be);
    return test_finish("test_loss_scale");
}

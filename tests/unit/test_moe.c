// test_moe.c: the mixture-of-experts layer (src/model/moe.h) against
// transformers 4.46.3's MixtralSparseMoeBlock and Qwen2MoeSparseMoeBlock
// (tests/reference/fixtures/moe.h5, from tests/reference/moe_reference.py):
//   - FP32 on the CPU backend: output <= 1e-5 relative, the same top-k
//     experts per token, aux and z losses <= 1e-6 relative, every gradient
//     (x and each weight; the loss sum(out dy) + aux_coeff aux + z_coeff z)
//     <= 1e-5 relative, and the gradients of the aux and z losses alone;
//   - BF16 (the same BF16-exact weights and x) against the FP32 reference:
//     output and every gradient <= 1e-2 relative (BF16 rounds each stored
//     activation, u = 2^-8 ~ 3.9e-3; measured on the CPU backend 3.9e-3 to
//     4.9e-3, TEST_VERBOSE=1 prints them), aux and z losses <= 1e-4 (the
//     router's logits are FP32 GEMM outputs of the BF16 operands); the
//     choices are printed, not required equal (none differ here: the
//     fixture's smallest top-2 probability gap is 1.3e-4); FP16 likewise
//     at 2e-3 (u = 2^-11; measured 4.8e-4 to 6.1e-4);
//   - capacity factor 1.0 with routing forced by expert_bias (every token to
//     expert 0 at k 1; to experts 0 and 1 at k 2): capacity = ceil(N k / E),
//     dropped = sum_e max(0, routed_e - capacity) = k (N - capacity) there,
//     the kept tokens the first `capacity` in token order, the dropped rows of
//     the output exactly 0 and the kept ones the expert's output (a host
//     FP64 evaluation); capacity with the natural routing against the same
//     host evaluation; dropless drops none;
//   - FP64 finite differences of the whole layer (dropless, and capacity 1.0
//     where tokens are dropped) for a sample of parameters and inputs;
//   - the memory functions: the documented closed form, and a forward plus
//     backward that writes nothing past moe_activation_bytes / _scratch_bytes
//     (guard bytes checked).
// In a build with the CUDA backend and a device (the emulated build:
// tests/e2e/cuda_emulated.sh), the FP32 fixture checks run on the CUDA
// backend too, and its output and gradients agree with the CPU's <= 1e-5.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "h5fixture.h"
#include "kernels/backend.h"
#include "kernels/cpu/half.h"
#include "kernels/ops.h"
#include "model/moe.h"
#include "test.h"

static const char *FIXTURE = "tests/reference/fixtures/moe.h5";

enum { W_ROUTER, W_GATE, W_UP, W_DOWN, W_SH_GATE, W_SH_UP, W_SH_DOWN, W_SH_ROUTER, W_COUNT };
static const char *W_NAMES[W_COUNT] = {"router",  "gate",  "up",      "down",
                                       "sh_gate", "sh_up", "sh_down", "sh_router"};

// One fixture group on the host (FP32 values).
struct ref {
    const char *group;
    struct moe_config c;
    int N;
    float *x, *dy, *out, *topk_w, *w[W_COUNT], *g[W_COUNT], *gx;
    float *gaux_x, *gaux_router, *gz_x, *gz_router;
    int32_t *topk_idx;
    size_t wn[W_COUNT]; // elements of each weight (0: absent)
    double aux_loss, z_loss;
};

static float *read_group(hid_t f, const char *group, const char *name, size_t want) {
    char path[256];
    snprintf(path, sizeof path, "/%s/%s", group, name);
    struct h5fixture_shape sh;
    float *p = h5fixture_read_f32(f, path, &sh);
    if (sh.numel != want)
        h5fixture_fail(f, "%s has %zu elements, expected %zu", path, sh.numel, want);
    return p;
}

static struct ref ref_load(hid_t f, const char *group) {
    struct ref r = {.group = group};
    char obj[64];
    snprintf(obj, sizeof obj, "/%s", group);
    r.N = (int)h5fixture_attr_long(f, obj, "N");
    r.c.C = (int)h5fixture_attr_long(f, obj, "C");
    r.c.E = (int)h5fixture_attr_long(f, obj, "E");
    r.c.k = (int)h5fixture_attr_long(f, obj, "k");
    r.c.F = (int)h5fixture_attr_long(f, obj, "F");
    r.c.shared_F = (int)h5fixture_attr_long(f, obj, "shared_F");
    r.c.shared_gate = r.c.shared_F > 0; // Qwen2-MoE's shared expert is gated
    r.c.norm_topk = h5fixture_attr_long(f, obj, "norm_topk") != 0;
    r.c.aux_coeff = h5fixture_attr_f64(f, obj, "aux_coeff");
    r.c.z_coeff = h5fixture_attr_f64(f, obj, "z_coeff");
    r.aux_loss = h5fixture_attr_f64(f, obj, "aux_loss");
    r.z_loss = h5fixture_attr_f64(f, obj, "z_loss");
    int N = r.N, C = r.c.C, E = r.c.E, k = r.c.k, F = r.c.F, Fs = r.c.shared_F;
    size_t wn[W_COUNT] = {(size_t)E * C,  (size_t)E * F * C, (size_t)E * F * C, (size_t)E * C * F,
                          (size_t)Fs * C, (size_t)Fs * C,    (size_t)C * Fs,    Fs ? (size_t)C : 0};
    memcpy(r.wn, wn, sizeof wn);
    r.x = read_group(f, group, "x", (size_t)N * C);
    r.dy = read_group(f, group, "dy", (size_t)N * C);
    r.out = read_group(f, group, "out", (size_t)N * C);
    r.topk_w = read_group(f, group, "topk_w", (size_t)N * k);
    r.gx = read_group(f, group, "grad/x", (size_t)N * C);
    r.gaux_x = read_group(f, group, "grad_aux/x", (size_t)N * C);
    r.gaux_router = read_group(f, group, "grad_aux/router", (size_t)E * C);
    r.gz_x = read_group(f, group, "grad_z/x", (size_t)N * C);
    r.gz_router = read_group(f, group, "grad_z/router", (size_t)E * C);
    char path[256];
    snprintf(path, sizeof path, "/%s/topk_idx", group);
    struct h5fixture_shape sh;
    r.topk_idx = h5fixture_read_i32(f, path, &sh);
    if (sh.numel != (size_t)N * k) h5fixture_fail(f, "%s: %zu elements", path, sh.numel);
    for (int i = 0; i < W_COUNT; i++) {
        if (!r.wn[i]) continue;
        r.w[i] = read_group(f, group, W_NAMES[i], r.wn[i]);
        char g[64];
        snprintf(g, sizeof g, "grad/%s", W_NAMES[i]);
        r.g[i] = read_group(f, group, g, r.wn[i]);
    }
    struct error err = {0};
    EXPECT(moe_config_check(&r.c, &err) == STATUS_OK, "%s: %s", group, err.msg);
    return r;
}

static void ref_free(struct ref *r) {
    float *p[] = {r->x,  r->dy,      r->out,         r->topk_w, r->gx,
                  r->gaux_x, r->gaux_router, r->gz_x, r->gz_router};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    for (int i = 0; i < W_COUNT; i++) free(r->w[i]), free(r->g[i]);
    free(r->topk_idx);
}

// ---- host <-> backend in any dtype --------------------------------------------------

static void put(struct backend *be, struct tensor t, const float *h, size_t n) {
    void *tmp = xmalloc(n * dtype_size(t.dtype) + 1);
    for (size_t i = 0; i < n; i++) {
        switch (t.dtype) {
        case DTYPE_BF16: ((uint16_t *)tmp)[i] = bf16_from_f32(h[i]); break;
        case DTYPE_FP16: ((uint16_t *)tmp)[i] = fp16_from_f32(h[i]); break;
        case DTYPE_FP64: ((double *)tmp)[i] = h[i]; break;
        default: ((float *)tmp)[i] = h[i]; break;
        }
    }
    backend_to_device(be, t.data, tmp, n * dtype_size(t.dtype));
    backend_synchronize(be);
    free(tmp);
}

static double *get(struct backend *be, struct tensor t, size_t n) {
    void *tmp = xmalloc(n * dtype_size(t.dtype) + 1);
    backend_to_host(be, tmp, t.data, n * dtype_size(t.dtype));
    backend_synchronize(be);
    double *h = xmalloc(n * sizeof *h + 1);
    for (size_t i = 0; i < n; i++) {
        switch (t.dtype) {
        case DTYPE_BF16: h[i] = bf16_to_f32(((uint16_t *)tmp)[i]); break;
        case DTYPE_FP16: h[i] = fp16_to_f32(((uint16_t *)tmp)[i]); break;
        case DTYPE_FP64: h[i] = ((double *)tmp)[i]; break;
        case DTYPE_I32: h[i] = ((int32_t *)tmp)[i]; break;
        default: h[i] = ((float *)tmp)[i]; break;
        }
    }
    free(tmp);
    return h;
}

static struct tensor alloc_t(struct backend *be, enum dtype dt, size_t n) {
    struct tensor t = tensor_view(backend_alloc(be, n * dtype_size(dt) + 64), dt, n);
    EXPECT(t.data != NULL, "allocation of %zu elements", n);
    return t;
}

// ---- one layer on a backend -------------------------------------------------------

enum { GUARD = 4096 };

struct run {
    struct backend *be;
    struct moe_config c;
    int N;
    enum dtype dt, gdt;
    struct moe_weights w, dw;
    struct tensor x, y, dx, dy;
    char *acts, *scratch;
    size_t acts_bytes, scratch_bytes;
    struct moe_stats st;
};

static struct tensor *wfield(struct moe_weights *w, int i) {
    struct tensor *f[W_COUNT] = {&w->router,  &w->gate,  &w->up,      &w->down,
                                 &w->sh_gate, &w->sh_up, &w->sh_down, &w->sh_router};
    return f[i];
}

static const unsigned char POISON = 0xA5;

// Allocates the layer's buffers on be (acts and scratch of exactly the
// documented bytes, then GUARD poisoned bytes) and uploads r's weights and x.
static struct run run_init(struct backend *be, const struct ref *r, const struct moe_config *c,
                           enum dtype dt) {
    struct run u = {.be = be, .c = *c, .N = r->N, .dt = dt};
    u.gdt = dt == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32;
    size_t NC = (size_t)r->N * c->C;
    for (int i = 0; i < W_COUNT; i++) {
        if (!r->wn[i]) continue;
        *wfield(&u.w, i) = alloc_t(be, dt, r->wn[i]);
        *wfield(&u.dw, i) = alloc_t(be, u.gdt, r->wn[i]);
        put(be, *wfield(&u.w, i), r->w[i], r->wn[i]);
    }
    u.x = alloc_t(be, dt, NC);
    u.y = alloc_t(be, dt, NC);
    u.dx = alloc_t(be, dt, NC);
    u.dy = alloc_t(be, dt, NC);
    put(be, u.x, r->x, NC);
    put(be, u.dy, r->dy, NC);
    u.acts_bytes = moe_activation_bytes(c, r->N, dt);
    u.scratch_bytes = moe_scratch_bytes(c, r->N, dt);
    u.acts = backend_alloc(be, u.acts_bytes + GUARD);
    u.scratch = backend_alloc(be, u.scratch_bytes + GUARD);
    unsigned char guard[GUARD];
    memset(guard, POISON, GUARD);
    backend_to_device(be, u.acts + u.acts_bytes, guard, GUARD);
    backend_to_device(be, u.scratch + u.scratch_bytes, guard, GUARD);
    return u;
}

static void run_free(struct run *u) {
    for (int i = 0; i < W_COUNT; i++) {
        backend_dealloc(u->be, wfield(&u->w, i)->data);
        backend_dealloc(u->be, wfield(&u->dw, i)->data);
    }
    backend_dealloc(u->be, u->x.data);
    backend_dealloc(u->be, u->y.data);
    backend_dealloc(u->be, u->dx.data);
    backend_dealloc(u->be, u->dy.data);
    backend_dealloc(u->be, u->acts);
    backend_dealloc(u->be, u->scratch);
    backend_dealloc(u->be, u->w.expert_bias.data);
}

static void run_guards(struct run *u, const char *what) {
    unsigned char g[GUARD];
    for (int s = 0; s < 2; s++) {
        backend_to_host(u->be, g, (s ? u->scratch + u->scratch_bytes : u->acts + u->acts_bytes),
                        GUARD);
        backend_synchronize(u->be);
        size_t bad = 0;
        for (size_t i = 0; i < GUARD; i++) bad += g[i] != POISON;
        EXPECT(bad == 0, "%s: %zu bytes written past moe_%s_bytes", what, bad,
               s ? "scratch" : "activation");
    }
}

static void run_forward(struct run *u) {
    moe_forward(u->be, &u->c, u->y, u->x, &u->w, u->N, u->acts, u->scratch, &u->st);
}

// Zeroes dx and the gradients, then the backward with dy (zeroed when !with_dy).
static void run_backward(struct run *u, bool with_dy) {
    backend_memset0(u->be, u->dx);
    for (int i = 0; i < W_COUNT; i++) backend_memset0(u->be, *wfield(&u->dw, i));
    if (!with_dy) backend_memset0(u->be, u->dy);
    moe_backward(u->be, &u->c, u->dx, &u->dw, u->dy, u->x, &u->w, u->N, u->acts, u->scratch,
                 &u->st);
}

static double rel_err(const double *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void expect_rel(const char *what, const char *group, struct backend *be, struct tensor t,
                       const float *ref, size_t n, double tol) {
    double *h = get(be, t, n);
    double e = rel_err(h, ref, n);
    EXPECT(e <= tol, "%s %s (%s): relative error %.3e > %.1e", group, what, be->ops->name, e, tol);
    if (getenv("TEST_VERBOSE"))
        printf("  %-9s %-5s %-4s %-14s rel err %.3e\n", group, be->ops->name, dtype_name(t.dtype),
               what, e);
    free(h);
}

// ---- the fixture checks --------------------------------------------------------------

// The forward, the losses, the choices, the gradients (with the losses'
// terms), then each loss's gradient alone. dt FP32 (tolerances 1e-5), BF16
// (output and gradients 1e-2) or FP16 (2e-3: u = 2^-11); choices printed
// for the 16-bit dtypes.
static void test_fixture(struct backend *be, const struct ref *r, enum dtype dt) {
    bool lowp = dt != DTYPE_FP32;
    double tol16 = dt == DTYPE_FP16 ? 2e-3 : 1e-2;
    double tol_out = lowp ? tol16 : 1e-5, tol_grad = lowp ? tol16 : 1e-5,
           tol_loss = lowp ? 1e-4 : 1e-6;
    int N = r->N, C = r->c.C, E = r->c.E, k = r->c.k;
    size_t NC = (size_t)N * C;
    struct run u = run_init(be, r, &r->c, dt);
    run_forward(&u);
    expect_rel("out", r->group, be, u.y, r->out, NC, tol_out);
    // choices: the same experts in the same order (FP32)
    struct moe_routing rt = moe_routing_view(&r->c, N, dt, u.acts);
    double *idx = get(be, rt.topk_idx, (size_t)N * k), *tw = get(be, rt.topk_w, (size_t)N * k);
    int differ = 0;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) differ += idx[t * k + j] != r->topk_idx[t * k + j];
    if (!lowp) {
        EXPECT(differ == 0, "%s (%s): %d of %d choices differ from transformers'", r->group,
               be->ops->name, differ, N * k);
        EXPECT(rel_err(tw, r->topk_w, (size_t)N * k) <= 1e-6, "%s: topk weights rel err %.3e",
               r->group, rel_err(tw, r->topk_w, (size_t)N * k));
    } else if (getenv("TEST_VERBOSE")) {
        printf("  %-9s %-5s %s choices differing from fp32 transformers: %d of %d\n", r->group,
               be->ops->name, dtype_name(dt), differ, N * k);
    }
    free(idx);
    free(tw);
    double ea = fabs(u.st.aux_loss - r->aux_loss) / r->aux_loss,
           ez = fabs(u.st.z_loss - r->z_loss) / r->z_loss;
    EXPECT(ea <= tol_loss, "%s (%s %s): aux loss %.9f, transformers %.9f", r->group, be->ops->name,
           dtype_name(dt), u.st.aux_loss, r->aux_loss);
    EXPECT(ez <= tol_loss, "%s (%s %s): z loss %.9f, reference %.9f", r->group, be->ops->name,
           dtype_name(dt), u.st.z_loss, r->z_loss);
    if (getenv("TEST_VERBOSE"))
        printf("  %-9s %-5s %-4s aux rel err %.3e, z rel err %.3e\n", r->group, be->ops->name,
               dtype_name(dt), ea, ez);
    // the model-level form over layers: one layer is the layer's own; two
    // equal layers keep f and P (the same loss) and halve each gradient
    struct moe_stats one = u.st, two[2] = {u.st, u.st};
    struct moe_stats *p1[1] = {&one}, *p2[2] = {&two[0], &two[1]};
    double l1 = moe_aux_loss_layers(p1, 1, r->c.aux_coeff),
           l2 = moe_aux_loss_layers(p2, 2, r->c.aux_coeff);
    bool grads_ok = true;
    for (int e = 0; e < E; e++)
        grads_ok &=
            fabs(one.aux_grad[e] - u.st.aux_grad[e]) <= 1e-15 * fabs(u.st.aux_grad[e]) &&
            fabs(2 * two[1].aux_grad[e] - u.st.aux_grad[e]) <= 1e-15 * fabs(u.st.aux_grad[e]);
    EXPECT(fabs(l1 - u.st.aux_loss) <= 1e-15 * u.st.aux_loss &&
               fabs(l2 - u.st.aux_loss) <= 1e-15 * u.st.aux_loss && grads_ok,
           "%s: moe_aux_loss_layers %.17g (L 1), %.17g (L 2), the layer's %.17g; gradients %s",
           r->group, l1, l2, u.st.aux_loss, grads_ok ? "ok" : "differ");
    EXPECT(u.st.dropped == 0 && u.st.M == N * k && u.st.capacity == 0,
           "%s dropless: dropped %lld, M %d of %d", r->group, (long long)u.st.dropped, u.st.M,
           N * k);

    run_backward(&u, true);
    expect_rel("grad x", r->group, be, u.dx, r->gx, NC, tol_grad);
    for (int i = 0; i < W_COUNT; i++) {
        if (!r->wn[i]) continue;
        char what[64];
        snprintf(what, sizeof what, "grad %s", W_NAMES[i]);
        expect_rel(what, r->group, be, *wfield(&u.dw, i), r->g[i], r->wn[i], tol_grad);
    }
    run_guards(&u, r->group);

    if (!lowp) { // each auxiliary loss alone (coefficient 1, dy = 0)
        for (int z = 0; z < 2; z++) {
            u.c.aux_coeff = !z, u.c.z_coeff = z;
            run_forward(&u);
            run_backward(&u, false);
            expect_rel(z ? "grad_z x" : "grad_aux x", r->group, be, u.dx, z ? r->gz_x : r->gaux_x,
                       NC, 1e-5);
            expect_rel(z ? "grad_z router" : "grad_aux router", r->group, be, u.dw.router,
                       z ? r->gz_router : r->gaux_router, (size_t)E * C, 1e-5);
            double *gd = get(be, u.dw.down, r->wn[W_DOWN]);
            double s = 0;
            for (size_t i = 0; i < r->wn[W_DOWN]; i++) s += fabs(gd[i]);
            EXPECT(s == 0, "%s: with dy = 0 the experts' gradients are 0, |grad down| = %g",
                   r->group, s);
            free(gd);
        }
    }
    run_free(&u);
}

// ---- a host FP64 evaluation of the layer for given choices ----------------------------

static double silu(double g) { return g / (1 + exp(-g)); }

// y (N, C) of the layer with k choices idx (N, k), weights wts (N, k) and
// dest (N k,) (-1: dropped), on r's FP32 weights in FP64; no shared expert.
static void host_layer(const struct ref *r, int k, const double *idx, const double *wts,
                       const double *dest, double *y) {
    int N = r->N, C = r->c.C, F = r->c.F;
    double *h = xmalloc(sizeof(double) * F);
    for (int t = 0; t < N; t++) {
        for (int c = 0; c < C; c++) y[t * C + c] = 0;
        for (int j = 0; j < k; j++) {
            if (dest[t * k + j] < 0) continue;
            int e = (int)idx[t * k + j];
            const float *G = r->w[W_GATE] + (size_t)e * F * C, *U = r->w[W_UP] + (size_t)e * F * C;
            const float *D = r->w[W_DOWN] + (size_t)e * C * F;
            for (int f = 0; f < F; f++) {
                double g = 0, u = 0;
                for (int c = 0; c < C; c++)
                    g += (double)G[f * C + c] * r->x[t * C + c],
                        u += (double)U[f * C + c] * r->x[t * C + c];
                h[f] = silu(g) * u;
            }
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int f = 0; f < F; f++) s += (double)D[c * F + f] * h[f];
                y[t * C + c] += wts[t * k + j] * s;
            }
        }
    }
    free(h);
}

// Capacity factor 1.0. forced > 0: expert_bias sends every token to experts
// 0 .. forced - 1 (k = forced); else the natural routing of r at its k.
static void test_capacity(struct backend *be, const struct ref *r, int forced) {
    struct moe_config c = r->c;
    c.capacity_factor = 1.0;
    c.shared_F = 0, c.shared_gate = false; // the routed experts only (host_layer)
    if (forced) c.k = forced;
    int N = r->N, C = c.C, E = c.E, k = c.k;
    struct run u = run_init(be, r, &c, DTYPE_FP32);
    if (forced) {
        float bias[MOE_MAX_EXPERTS] = {0};
        for (int e = 0; e < forced; e++)
            bias[e] = 10.0f * (forced - e); // above any probability, in order
        u.w.expert_bias = alloc_t(be, DTYPE_FP32, E);
        put(be, u.w.expert_bias, bias, E);
    }
    run_forward(&u);
    int cap = (int)ceil(1.0 * N * k / E);
    EXPECT(u.st.capacity == cap && moe_capacity(&c, N) == cap,
           "capacity %d, expected ceil(N k / E) = %d", u.st.capacity, cap);
    struct moe_routing rt = moe_routing_view(&c, N, DTYPE_FP32, u.acts);
    double *idx = get(be, rt.topk_idx, (size_t)N * k), *wts = get(be, rt.topk_w, (size_t)N * k);
    double *dest = get(be, rt.dest, (size_t)N * k);
    // the formula from the choices alone: routed per expert, capped
    int routed[MOE_MAX_EXPERTS] = {0}, rank[MOE_MAX_EXPERTS] = {0};
    for (int a = 0; a < N * k; a++) routed[(int)idx[a]]++;
    long want = 0;
    for (int e = 0; e < E; e++) want += routed[e] > cap ? routed[e] - cap : 0;
    if (forced) {
        EXPECT(want == (long)k * (N - cap),
               "forced to %d experts: formula %ld, expected k (N - capacity) = %ld", forced, want,
               (long)k * (N - cap));
        for (int t = 0; t < N; t++)
            for (int j = 0; j < k; j++)
                EXPECT(idx[t * k + j] == j, "forced routing: token %d slot %d chose %g", t, j,
                       idx[t * k + j]);
    }
    EXPECT(u.st.dropped == want,
           "k=%d forced=%d: dropped %lld, formula sum_e max(0, routed_e - %d) = %ld", k, forced,
           (long long)u.st.dropped, cap, want);
    // kept: an expert's first `cap` assignments in token order
    bool order_ok = true;
    for (int a = 0; a < N * k; a++) {
        int e = (int)idx[a];
        order_ok &= (rank[e]++ < cap) == (dest[a] >= 0);
    }
    EXPECT(order_ok,
           "k=%d forced=%d: kept assignments are not each expert's first %d in token order", k,
           forced, cap);
    double *y = get(be, u.y, (size_t)N * C), *want_y = xmalloc(sizeof(double) * N * C);
    host_layer(r, k, idx, wts, dest, want_y);
    double num = 0, den = 0, dropped_rows = 0;
    for (int t = 0; t < N; t++) {
        bool all_dropped = true;
        for (int j = 0; j < k; j++) all_dropped &= dest[t * k + j] < 0;
        for (int c2 = 0; c2 < C; c2++) {
            double d = y[t * C + c2] - want_y[t * C + c2];
            num += d * d, den += want_y[t * C + c2] * want_y[t * C + c2];
            if (all_dropped) dropped_rows += fabs(y[t * C + c2]);
        }
    }
    EXPECT(sqrt(num / den) <= 1e-5,
           "k=%d forced=%d: output against the host evaluation: rel err %.3e", k, forced,
           sqrt(num / den));
    EXPECT(dropped_rows == 0,
           "k=%d forced=%d: tokens with every slot dropped must give 0, |y| = %g", k, forced,
           dropped_rows);
    if (forced) {
        int all = 0;
        for (int t = cap; t < N; t++) all += dest[t * k] < 0 && (k < 2 || dest[t * k + 1] < 0);
        EXPECT(all == N - cap, "forced: %d tokens past the capacity dropped, expected %d", all,
               N - cap);
    }
    if (getenv("TEST_VERBOSE"))
        printf(
            "  capacity k=%d forced=%d: capacity %d dropped %lld (formula %ld), out rel err %.3e\n",
            k, forced, cap, (long long)u.st.dropped, want, sqrt(num / den));
    free(idx), free(wts), free(dest), free(y), free(want_y);
    run_guards(&u, "capacity");
    run_free(&u);
}

// ---- FP64 finite differences ---------------------------------------------------------

// loss = sum(y dy) + aux_coeff aux + z_coeff z, on the host from the forward.
static double fd_loss(struct run *u) {
    run_forward(u);
    size_t n = (size_t)u->N * u->c.C;
    double *y = get(u->be, u->y, n), *dy = get(u->be, u->dy, n), s = 0;
    for (size_t i = 0; i < n; i++) s += y[i] * dy[i];
    free(y), free(dy);
    return s + u->c.aux_coeff * u->st.aux_loss + u->c.z_coeff * u->st.z_loss;
}

// Element i of tensor t (FP64) += h.
static void nudge(struct backend *be, struct tensor t, size_t i, double h) {
    double v;
    backend_to_host(be, &v, (double *)t.data + i, sizeof v);
    v += h;
    backend_to_device(be, (double *)t.data + i, &v, sizeof v);
    backend_synchronize(be);
}

// Central differences (h 1e-5) of 40 sampled elements of x and of every
// weight against the backward, FP64, relative to the largest gradient of the
// tensor: <= 1e-6. The routing does not change under the steps (checked:
// the same choices and counts).
static void test_fd(struct backend *be, const struct ref *r, double cf) {
    struct moe_config c = r->c;
    c.capacity_factor = cf;
    c.aux_coeff = 0.5, c.z_coeff = 0.05; // large enough to matter against sum(y dy)
    struct run u = run_init(be, r, &c, DTYPE_FP64);
    run_forward(&u);
    struct moe_stats st0 = u.st;
    run_backward(&u, true);
    uint64_t rng = 12345;
    double worst = 0;
    for (int i = -1; i < W_COUNT; i++) {
        struct tensor t = i < 0 ? u.x : *wfield(&u.w, i), g = i < 0 ? u.dx : *wfield(&u.dw, i);
        if (!t.numel) continue;
        double *ga = get(be, g, t.numel), gmax = 0;
        for (size_t j = 0; j < t.numel; j++) gmax = fmax(gmax, fabs(ga[j]));
        for (int s = 0; s < 40; s++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t j = (size_t)(rng >> 33) % t.numel;
            double h = 1e-5;
            nudge(be, t, j, h);
            double lp = fd_loss(&u);
            bool same = !memcmp(u.st.kept, st0.kept, sizeof st0.kept) &&
                        !memcmp(u.st.routed, st0.routed, sizeof st0.routed);
            nudge(be, t, j, -2 * h);
            double lm = fd_loss(&u);
            same &= !memcmp(u.st.kept, st0.kept, sizeof st0.kept);
            nudge(be, t, j, h);
            if (!same) continue; // a step that flips a choice: not differentiable there
            double e = fabs((lp - lm) / (2 * h) - ga[j]) / (gmax > 0 ? gmax : 1);
            worst = fmax(worst, e);
            EXPECT(e <= 1e-6, "%s cf=%g: d/d %s[%zu]: finite difference %.10g, backward %.10g",
                   r->group, cf, i < 0 ? "x" : W_NAMES[i], j, (lp - lm) / (2 * h), ga[j]);
        }
        free(ga);
    }
    if (getenv("TEST_VERBOSE"))
        printf("  %-9s fp64 finite differences cf=%g (dropped %lld): worst %.3e\n", r->group, cf,
               (long long)st0.dropped, worst);
    if (cf > 0)
        EXPECT(st0.dropped > 0, "%s cf=%g: the case must drop tokens to test them", r->group, cf);
    run_free(&u);
}

// ---- memory --------------------------------------------------------------------------

static size_t al(size_t bytes) { return (bytes + 255) / 256 * 256; }

// moe.h's list of buffers, written out for one configuration.
static void test_memory(const struct ref *r) {
    struct moe_config c = r->c;
    for (int cfi = 0; cfi < 2; cfi++) {
        c.capacity_factor = cfi ? 1.25 : 0;
        for (int d = 0; d < 2; d++) {
            enum dtype dt = d ? DTYPE_BF16 : DTYPE_FP32;
            size_t s = dtype_size(dt), N = r->N, C = c.C, E = c.E, k = c.k, F = c.F,
                   Fs = c.shared_F;
            size_t cap = cfi ? (size_t)ceil(1.25 * N * k / E) : 0;
            size_t M = cfi && E * cap < N * k ? E * cap : N * k;
            size_t acts = al(N * E * 4) + al(N * 4) + 4 * al(N * k * 4) + al((E + 1) * 8) +
                          al(2 * E * 4) + 2 * al(M * C * s) + 3 * al(M * F * s);
            if (Fs) acts += (c.shared_gate ? al(N * 4) : 0) + 3 * al(N * Fs * s) + al(N * C * s);
            size_t scr = 2 * al(M * C * s) + 3 * al(M * F * s) + al(N * k * 4) + al(N * E * 4) +
                         (s != 4 ? al(N * E * s) : 0) + al(E * 4);
            if (Fs)
                scr += al(N * C * s) + 3 * al(N * Fs * s) +
                       (c.shared_gate ? al(N * 4) + (s != 4 ? al(N * s) : 0) : 0);
            EXPECT(moe_rows_max(&c, (int)N) == (int)M, "%s cf=%g: rows max %d, expected %zu",
                   r->group, c.capacity_factor, moe_rows_max(&c, (int)N), M);
            EXPECT(moe_activation_bytes(&c, (int)N, dt) == acts,
                   "%s cf=%g %s: activation bytes %zu, expected %zu", r->group, c.capacity_factor,
                   dtype_name(dt), moe_activation_bytes(&c, (int)N, dt), acts);
            EXPECT(moe_scratch_bytes(&c, (int)N, dt) == scr,
                   "%s cf=%g %s: scratch bytes %zu, expected %zu", r->group, c.capacity_factor,
                   dtype_name(dt), moe_scratch_bytes(&c, (int)N, dt), scr);
        }
    }
    struct error err = {0};
    struct moe_config bad = r->c;
    bad.k = bad.E + 1;
    EXPECT(moe_config_check(&bad, &err) == STATUS_BAD_INPUT && strstr(err.msg, "top_k k=9"),
           "k > E must be refused naming k: '%s'", err.msg);
    bad = r->c, bad.capacity_factor = -1;
    EXPECT(moe_config_check(&bad, &err) == STATUS_BAD_INPUT &&
               strstr(err.msg, "capacity_factor=-1"),
           "a negative capacity factor must be refused: '%s'", err.msg);
}

// ---- the CUDA backend against the CPU --------------------------------------------------

static void test_cuda_vs_cpu(struct backend *cpu, struct backend *gpu, const struct ref *r) {
    struct run a = run_init(cpu, r, &r->c, DTYPE_FP32), b = run_init(gpu, r, &r->c, DTYPE_FP32);
    run_forward(&a), run_forward(&b);
    run_backward(&a, true), run_backward(&b, true);
    size_t NC = (size_t)r->N * r->c.C;
    struct {
        struct tensor ta, tb;
        size_t n;
        const char *what;
    } outs[W_COUNT + 2] = {{a.y, b.y, NC, "out"}, {a.dx, b.dx, NC, "grad x"}};
    int n = 2;
    for (int i = 0; i < W_COUNT; i++)
        if (r->wn[i])
            outs[n++] =
                (typeof(outs[0])){*wfield(&a.dw, i), *wfield(&b.dw, i), r->wn[i], W_NAMES[i]};
    for (int i = 0; i < n; i++) {
        double *ha = get(cpu, outs[i].ta, outs[i].n);
        float *fa = xmalloc(sizeof(float) * outs[i].n);
        for (size_t j = 0; j < outs[i].n; j++) fa[j] = (float)ha[j];
        expect_rel(outs[i].what, "cuda-cpu", gpu, outs[i].tb, fa, outs[i].n, 1e-5);
        free(ha), free(fa);
    }
    EXPECT(fabs(a.st.aux_loss - b.st.aux_loss) <= 1e-6 * a.st.aux_loss &&
               fabs(a.st.z_loss - b.st.z_loss) <= 1e-6 * a.st.z_loss,
           "%s: aux %.9f / %.9f, z %.9f / %.9f (cpu / cuda)", r->group, a.st.aux_loss,
           b.st.aux_loss, a.st.z_loss, b.st.z_loss);
    run_free(&a), run_free(&b);
}

int main(void) {
    hid_t f = h5fixture_open(FIXTURE);
    struct ref refs[2] = {ref_load(f, "mixtral"), ref_load(f, "qwen2moe")};
    h5fixture_close(f);
    struct error err = {0};
    struct backend *cpu = backend_init(BACKEND_CPU, 0, 0, &err);
    EXPECT(cpu != NULL, "cpu backend: %s", err.msg);
    for (int i = 0; i < 2; i++) {
        test_memory(&refs[i]);
        test_fixture(cpu, &refs[i], DTYPE_FP32);
        test_fixture(cpu, &refs[i], DTYPE_BF16);
        test_fixture(cpu, &refs[i], DTYPE_FP16);
    }
    test_capacity(cpu, &refs[0], 1);
    test_capacity(cpu, &refs[0], 2);
    test_capacity(cpu, &refs[0], 0);
    test_capacity(cpu, &refs[1], 0);
    // the finite differences run ~1500 tiny forwards: on one thread (the
    // serial kernels), where OpenMP's fork and join would dominate
    struct backend *cpu1 = backend_init(BACKEND_CPU, 0, 1, &err);
    test_fd(cpu1, &refs[0], 0);
    test_fd(cpu1, &refs[1], 0);
    test_fd(cpu1, &refs[1], 1.0);
    backend_free(cpu1);
    if (backend_has_cuda() && backend_device_count() > 0) {
        struct backend *gpu = backend_init(BACKEND_CUDA, 0, 0, &err);
        EXPECT(gpu != NULL, "cuda backend: %s", err.msg);
        if (gpu) {
            for (int i = 0; i < 2; i++) {
                test_fixture(gpu, &refs[i], DTYPE_FP32);
                test_fixture(gpu, &refs[i], DTYPE_BF16);
                test_fixture(gpu, &refs[i], DTYPE_FP16);
                test_cuda_vs_cpu(cpu, gpu, &refs[i]);
            }
            test_capacity(gpu, &refs[0], 1);
            test_capacity(gpu, &refs[0], 2);
            test_capacity(gpu, &refs[1], 0);
            backend_free(gpu);
        }
    } else {
        printf("  no CUDA backend or device: the CPU backend only\n");
    }
    backend_free(cpu);
    ref_free(&refs[0]), ref_free(&refs[1]);
    return test_finish("test_moe");
}

// test_ops_reference.c: every CPU op against PyTorch autograd in float64
// (tests/reference/fixtures/ops.h5, from tests/reference/ops_reference.py),
// and the document-masked attention and per-token RoPE of packing =
// concat_reset (tests/reference/fixtures/docmask.h5, from
// tests/reference/docmask_reference.py; FP32 <= 1e-6, FP64 <= 1e-12).
//
// Each op runs through the checked wrappers of kernels/ops.h in FP32 (relative
// error <= 1e-5) and FP64 (<= 1e-10). Outputs an op overwrites ("=") are
// poisoned with NaN first, so an element it fails to write fails the check;
// outputs it accumulates into ("+=") start from a known nonzero pattern, and
// the check is on (result - pattern), so an op that overwrites fails too.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "h5fixture.h"
#include "kernels/ops.h"
#include "test.h"

// Relative to the repository root (tests/run.sh runs there); OPS_FIXTURE
// overrides it (used to check that a perturbed fixture fails the test).
static const char *FIXTURE = "tests/reference/fixtures/ops.h5";
static const char *DOCMASK_FIXTURE = "tests/reference/fixtures/docmask.h5"; // DOCMASK_FIXTURE

// One precision's run: the backend, the fixture, the storage dtype, its
// statistics dtype (ops.h: FP32 stats for FP32, FP64 for FP64) and tolerance.
struct run {
    struct backend *be;
    hid_t f;
    enum dtype dt, st;
    double tol;
};

// ---- device buffers from and to host doubles ---------------------------------

static struct tensor dev_alloc(struct run *r, enum dtype dt, size_t n) {
    void *p = backend_alloc(r->be, n * dtype_size(dt) + 1);
    EXPECT(p != NULL, "backend_alloc of %zu elements", n);
    if (!p) exit(1);
    return tensor_view(p, dt, n);
}

// A device tensor of dtype dt holding host[0..n) (FP32, FP64 or I32).
static struct tensor dev_from(struct run *r, enum dtype dt, const double *host, size_t n) {
    struct tensor t = dev_alloc(r, dt, n);
    void *h = malloc(n * dtype_size(dt) + 1);
    for (size_t i = 0; i < n; i++) {
        if (dt == DTYPE_FP32) ((float *)h)[i] = (float)host[i];
        else if (dt == DTYPE_FP64) ((double *)h)[i] = host[i];
        else ((int32_t *)h)[i] = (int32_t)host[i];
    }
    backend_to_device(r->be, t.data, h, n * dtype_size(dt));
    free(h);
    return t;
}

static struct tensor dev_fill(struct run *r, enum dtype dt, size_t n, double value) {
    double *h = calloc(n + 1, sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = value;
    struct tensor t = dev_from(r, dt, h, n);
    free(h);
    return t;
}

// Reads fixture dataset name and puts it on the device as dtype dt.
static struct tensor dev_read(struct run *r, enum dtype dt, const char *name, size_t *n) {
    struct h5fixture_shape sh;
    double *h = h5fixture_read_f64(r->f, name, &sh);
    struct tensor t = dev_from(r, dt, h, sh.numel);
    free(h);
    if (n) *n = sh.numel;
    return t;
}

// A malloc'd host copy of t as doubles.
static double *host_of(struct run *r, struct tensor t) {
    void *h = malloc(t.numel * dtype_size(t.dtype) + 1);
    backend_to_host(r->be, h, t.data, t.numel * dtype_size(t.dtype));
    double *d = malloc(t.numel * sizeof *d + 1);
    for (size_t i = 0; i < t.numel; i++)
        d[i] = t.dtype == DTYPE_FP32 ? ((float *)h)[i] : ((double *)h)[i];
    free(h);
    return d;
}

static void dev_free(struct run *r, struct tensor t) { backend_dealloc(r->be, t.data); }

// RoPE's cos and sin tables (Tmax, D/2) of theta in the run's statistics
// dtype (rope_table_fill, or its FP64 twin), on the device.
static void rope_tables(struct run *r, int Tmax, int D, double theta, struct tensor *cos,
                        struct tensor *sin) {
    size_t nt = (size_t)Tmax * (D / 2);
    *cos = dev_alloc(r, r->st, nt), *sin = dev_alloc(r, r->st, nt);
    void *hc = malloc(nt * dtype_size(r->st)), *hs = malloc(nt * dtype_size(r->st));
    if (r->st == DTYPE_FP32) rope_table_fill(hc, hs, Tmax, D, theta);
    else rope_table_fill_f64(hc, hs, Tmax, D, theta);
    backend_to_device(r->be, cos->data, hc, nt * dtype_size(r->st));
    backend_to_device(r->be, sin->data, hs, nt * dtype_size(r->st));
    free(hc), free(hs);
}

// Expects t - base (base 0 for "=" outputs) to match fixture dataset ref.
static void check_offset(struct run *r, const char *what, struct tensor t, double base,
                         const char *ref) {
    struct h5fixture_shape sh;
    double *want = h5fixture_read_f64(r->f, ref, &sh);
    char label[160];
    snprintf(label, sizeof label, "%s %s", dtype_name(r->dt), what);
    EXPECT(sh.numel == t.numel, "%s: %zu elements, fixture %s has %zu", label, t.numel, ref,
           sh.numel);
    if (sh.numel == t.numel) {
        double *got = host_of(r, t);
        for (size_t i = 0; i < t.numel; i++) got[i] -= base;
        EXPECT_REL(t.numel, got, want, r->tol, label);
        free(got);
    }
    free(want);
}

static void check(struct run *r, const char *what, struct tensor t, const char *ref) {
    check_offset(r, what, t, 0.0, ref);
}

// ---- ops ---------------------------------------------------------------------

static void test_rmsnorm(struct run *r) {
    struct h5fixture_shape sh;
    free(h5fixture_read_f64(r->f, "/rmsnorm/x", &sh));
    int N = (int)sh.dims[0], C = (int)sh.dims[1];
    float eps = (float)h5fixture_attr_f64(r->f, "/rmsnorm", "eps");
    struct tensor x = dev_read(r, r->dt, "/rmsnorm/x", NULL);
    struct tensor w = dev_read(r, r->dt, "/rmsnorm/w", NULL);
    struct tensor dy = dev_read(r, r->dt, "/rmsnorm/dy", NULL);
    struct tensor y = dev_fill(r, r->dt, (size_t)N * C, NAN);
    struct tensor rstd = dev_fill(r, r->st, N, NAN);
    backend_rmsnorm_forward(r->be, y, rstd, x, w, N, C, eps);
    check(r, "rmsnorm y", y, "/rmsnorm/y");
    check(r, "rmsnorm rstd", rstd, "/rmsnorm/rstd");
    struct tensor dx = dev_fill(r, r->dt, (size_t)N * C, 0.5);
    struct tensor dw = dev_fill(r, r->dt, C, -0.25);
    backend_rmsnorm_backward(r->be, dx, dw, dy, x, w, rstd, N, C);
    check_offset(r, "rmsnorm dx (+=)", dx, 0.5, "/rmsnorm/dx");
    check_offset(r, "rmsnorm dw (+=)", dw, -0.25, "/rmsnorm/dw");
    struct tensor all[] = {x, w, dy, y, rstd, dx, dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dev_free(r, all[i]);
}

static void test_rope(struct run *r) {
    struct h5fixture_shape sh;
    free(h5fixture_read_f64(r->f, "/rope/x", &sh));
    int B = (int)sh.dims[0], T = (int)sh.dims[1], Hx = (int)sh.dims[2], D = (int)sh.dims[3];
    double theta = h5fixture_attr_f64(r->f, "/rope", "theta");
    EXPECT(h5fixture_attr_long(r->f, "/rope", "D") == D, "rope: attribute D != x's last dim");
    const int Tmax = 4096;
    struct tensor cos, sin;
    rope_tables(r, Tmax, D, theta, &cos, &sin);
    const int offsets[] = {0, 4088};
    for (int o = 0; o < 2; o++) {
        char ref[64], what[64];
        // In place: x is both input and output, so poisoning does not apply.
        struct tensor x = dev_read(r, r->dt, "/rope/x", NULL);
        backend_rope_forward(r->be, x, cos, sin, B, T, Hx, D, offsets[o]);
        snprintf(ref, sizeof ref, "/rope/out_p%d", offsets[o]);
        snprintf(what, sizeof what, "rope forward at %d", offsets[o]);
        check(r, what, x, ref);
        struct tensor d = dev_read(r, r->dt, "/rope/dy", NULL);
        backend_rope_backward(r->be, d, cos, sin, B, T, Hx, D, offsets[o]);
        snprintf(ref, sizeof ref, "/rope/dx_p%d", offsets[o]);
        snprintf(what, sizeof what, "rope backward at %d", offsets[o]);
        check(r, what, d, ref);
        dev_free(r, x);
        dev_free(r, d);
    }
    dev_free(r, cos);
    dev_free(r, sin);
}

static void test_attention(struct run *r) {
    struct h5fixture_shape sq, sk;
    free(h5fixture_read_f64(r->f, "/attention/q", &sq));
    free(h5fixture_read_f64(r->f, "/attention/k", &sk));
    int B = (int)sq.dims[0], T = (int)sq.dims[1], H = (int)sq.dims[2], D = (int)sq.dims[3];
    int Hkv = (int)sk.dims[2];
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D;
    struct tensor q = dev_read(r, r->dt, "/attention/q", NULL);
    struct tensor k = dev_read(r, r->dt, "/attention/k", NULL);
    struct tensor v = dev_read(r, r->dt, "/attention/v", NULL);
    struct tensor dout = dev_read(r, r->dt, "/attention/dout", NULL);
    struct tensor out = dev_fill(r, r->dt, nq, NAN);
    struct tensor lse = dev_fill(r, r->st, (size_t)B * H * T, NAN);
    backend_attention_forward(r->be, out, lse, q, k, v, B, T, H, Hkv, D);
    check(r, "attention out", out, "/attention/out");
    check(r, "attention lse", lse, "/attention/lse");
    struct tensor dq = dev_fill(r, r->dt, nq, NAN);
    struct tensor dk = dev_fill(r, r->dt, nk, NAN);
    struct tensor dv = dev_fill(r, r->dt, nk, NAN);
    // The backward pass gets this run's own out and lse, as the model does.
    backend_attention_backward(r->be, dq, dk, dv, dout, q, k, v, out, lse, B, T, H, Hkv, D);
    check(r, "attention dq", dq, "/attention/dq");
    check(r, "attention dk", dk, "/attention/dk");
    check(r, "attention dv", dv, "/attention/dv");
    struct tensor all[] = {q, k, v, dout, out, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dev_free(r, all[i]);
}

// Packed documents: doc_start_fill against the fixture's document starts
// (exact), then RoPE at positions t - doc_start and block-diagonal causal
// attention, forward and backward, against PyTorch in float64. The rows hold
// a one-token document, a row without end-of-text and a 70-token document
// that spans two of the CPU kernel's 64-row blocks.
static void test_docmask(struct run *r) {
    const char *g = "/docmask";
    struct h5fixture_shape sq, sk, st;
    free(h5fixture_read_f64(r->f, "/docmask/q", &sq));
    free(h5fixture_read_f64(r->f, "/docmask/k", &sk));
    int B = (int)sq.dims[0], T = (int)sq.dims[1], H = (int)sq.dims[2], D = (int)sq.dims[3];
    int Hkv = (int)sk.dims[2];
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D, bt = (size_t)B * T;
    int32_t *tokens = h5fixture_read_i32(r->f, "/docmask/tokens", &st);
    int32_t *want = h5fixture_read_i32(r->f, "/docmask/doc_start", NULL);
    int32_t *got = malloc(bt * sizeof *got);
    doc_start_fill(got, tokens, B, T, (int32_t)h5fixture_attr_long(r->f, g, "eot"));
    size_t bad = 0;
    for (size_t i = 0; i < bt; i++) bad += got[i] != want[i];
    EXPECT(bad == 0, "doc_start_fill: %zu of %zu document starts differ from the fixture's", bad, bt);
    free(tokens), free(want), free(got);
    struct tensor ds = dev_read(r, DTYPE_I32, "/docmask/doc_start", NULL);

    // RoPE at per-token positions (in place: no poisoning)
    double theta = h5fixture_attr_f64(r->f, g, "theta");
    struct tensor cos, sin;
    rope_tables(r, T, D, theta, &cos, &sin);
    struct tensor x = dev_read(r, r->dt, "/docmask/rope_x", NULL);
    backend_rope_forward_docs(r->be, x, cos, sin, ds, B, T, H, D, 0);
    check(r, "docmask rope forward", x, "/docmask/rope_out");
    struct tensor dy = dev_read(r, r->dt, "/docmask/rope_dy", NULL);
    backend_rope_backward_docs(r->be, dy, cos, sin, ds, B, T, H, D, 0);
    check(r, "docmask rope backward", dy, "/docmask/rope_dx");

    struct tensor q = dev_read(r, r->dt, "/docmask/q", NULL);
    struct tensor k = dev_read(r, r->dt, "/docmask/k", NULL);
    struct tensor v = dev_read(r, r->dt, "/docmask/v", NULL);
    struct tensor dout = dev_read(r, r->dt, "/docmask/dout", NULL);
    struct tensor out = dev_fill(r, r->dt, nq, NAN);
    struct tensor lse = dev_fill(r, r->st, (size_t)B * H * T, NAN);
    backend_attention_forward_docs(r->be, out, lse, q, k, v, ds, B, T, H, Hkv, D);
    check(r, "docmask attention out", out, "/docmask/out");
    check(r, "docmask attention lse", lse, "/docmask/lse");
    struct tensor dq = dev_fill(r, r->dt, nq, NAN);
    struct tensor dk = dev_fill(r, r->dt, nk, NAN);
    struct tensor dv = dev_fill(r, r->dt, nk, NAN);
    backend_attention_backward_docs(r->be, dq, dk, dv, dout, q, k, v, out, lse, ds, B, T, H, Hkv, D);
    check(r, "docmask attention dq", dq, "/docmask/dq");
    check(r, "docmask attention dk", dk, "/docmask/dk");
    check(r, "docmask attention dv", dv, "/docmask/dv");
    struct tensor all[] = {ds, cos, sin, x, dy, q, k, v, dout, out, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dev_free(r, all[i]);
}

static void test_swiglu(struct run *r) {
    size_t n;
    struct tensor gate = dev_read(r, r->dt, "/swiglu/gate", &n);
    struct tensor up = dev_read(r, r->dt, "/swiglu/up", NULL);
    struct tensor dout = dev_read(r, r->dt, "/swiglu/dout", NULL);
    struct tensor out = dev_fill(r, r->dt, n, NAN);
    struct tensor dgate = dev_fill(r, r->dt, n, NAN), dup = dev_fill(r, r->dt, n, NAN);
    backend_swiglu_forward(r->be, out, gate, up, n);
    check(r, "swiglu out", out, "/swiglu/out");
    backend_swiglu_backward(r->be, dgate, dup, dout, gate, up, n);
    check(r, "swiglu dgate", dgate, "/swiglu/dgate");
    check(r, "swiglu dup", dup, "/swiglu/dup");
    struct tensor all[] = {gate, up, dout, out, dgate, dup};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dev_free(r, all[i]);
}

// Cross-entropy on one shard holding all V columns, for smoothing s (suffix
// "" is s = attr smoothing, "_s0" is s = 0).
static void ce_one_shard(struct run *r, const char *suffix, float s) {
    struct h5fixture_shape sh;
    double *hl = h5fixture_read_f64(r->f, "/ce/logits", &sh);
    int N = (int)sh.dims[0], V = (int)sh.dims[1];
    double *ht = h5fixture_read_f64(r->f, "/ce/targets", NULL);
    int ignore = (int)h5fixture_attr_long(r->f, "/ce", "ignore_index");
    int count = 0;
    for (int i = 0; i < N; i++) count += (int)ht[i] != ignore;
    struct tensor logits = dev_from(r, r->dt, hl, (size_t)N * V);
    struct tensor targets = dev_from(r, DTYPE_I32, ht, N);
    struct tensor rowmax = dev_fill(r, r->st, N, NAN);
    struct tensor partials = dev_fill(r, r->st, (size_t)N * 3, NAN);
    struct tensor loss = dev_fill(r, r->st, N, NAN), lse = dev_fill(r, r->st, N, NAN);
    struct tensor dlogits = dev_fill(r, r->dt, (size_t)N * V, NAN);
    backend_ce_row_max(r->be, rowmax, logits, N, V, V);
    backend_ce_partials(r->be, partials, logits, rowmax, targets, N, V, V, 0);
    backend_ce_loss(r->be, loss, lse, partials, rowmax, targets, N, V, s, ignore);
    char ref[64], what[64];
    snprintf(ref, sizeof ref, "/ce/loss_rows%s", suffix);
    snprintf(what, sizeof what, "ce row losses s=%g", s);
    check(r, what, loss, ref);
    double *rows = host_of(r, loss), mean = 0;
    for (int i = 0; i < N; i++) mean += rows[i];
    mean /= count;
    snprintf(ref, sizeof ref, "/ce/loss%s", suffix);
    double *want = h5fixture_read_f64(r->f, ref, NULL);
    snprintf(what, sizeof what, "%s ce mean loss s=%g", dtype_name(r->dt), s);
    EXPECT_REL(1, &mean, want, r->tol, what);
    backend_ce_backward(r->be, dlogits, logits, lse, targets, N, V, V, 0, V, s, ignore,
                        1.0f / count);
    snprintf(ref, sizeof ref, "/ce/dlogits%s", suffix);
    snprintf(what, sizeof what, "ce dlogits s=%g", s);
    check(r, what, dlogits, ref);
    free(rows);
    free(want);
    free(hl);
    free(ht);
    struct tensor all[] = {logits, targets, rowmax, partials, loss, lse, dlogits};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dev_free(r, all[i]);
}

// The same loss split over two vocab-parallel shards of Vl = ceil(V/2)
// columns, the last one padded; the host plays the TP all-reduces (MAX of
// rowmax, SUM of partials). Padding columns hold a large logit that would
// change the result if a kernel read them.
static void ce_two_shards(struct run *r, float s) {
    struct h5fixture_shape sh;
    double *hl = h5fixture_read_f64(r->f, "/ce/logits", &sh);
    int N = (int)sh.dims[0], V = (int)sh.dims[1], Vl = (V + 1) / 2;
    double *ht = h5fixture_read_f64(r->f, "/ce/targets", NULL);
    int ignore = (int)h5fixture_attr_long(r->f, "/ce", "ignore_index");
    int count = 0;
    for (int i = 0; i < N; i++) count += (int)ht[i] != ignore;
    struct tensor targets = dev_from(r, DTYPE_I32, ht, N);
    struct tensor logits[2], rowmax[2], partials[2], loss[2], lse[2];
    double *shard = malloc((size_t)N * Vl * sizeof *shard);
    double gmax[N], gpart[3 * N];
    for (int i = 0; i < N; i++) gmax[i] = -INFINITY;
    memset(gpart, 0, sizeof gpart);
    for (int p = 0; p < 2; p++) {
        int start = p * Vl, valid = p == 0 ? Vl : V - Vl;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < Vl; j++)
                shard[(size_t)i * Vl + j] = j < valid ? hl[(size_t)i * V + start + j] : 50.0;
        logits[p] = dev_from(r, r->dt, shard, (size_t)N * Vl);
        rowmax[p] = dev_fill(r, r->st, N, NAN);
        backend_ce_row_max(r->be, rowmax[p], logits[p], N, Vl, valid);
        double *m = host_of(r, rowmax[p]);
        for (int i = 0; i < N; i++) gmax[i] = fmax(gmax[i], m[i]);
        free(m);
    }
    for (int p = 0; p < 2; p++) {
        int valid = p == 0 ? Vl : V - Vl;
        struct tensor gm = dev_from(r, r->st, gmax, N);
        partials[p] = dev_fill(r, r->st, (size_t)N * 3, NAN);
        backend_ce_partials(r->be, partials[p], logits[p], gm, targets, N, Vl, valid, p * Vl);
        double *h = host_of(r, partials[p]);
        for (int i = 0; i < 3 * N; i++) gpart[i] += h[i];
        free(h);
        dev_free(r, gm);
    }
    double *want_d = h5fixture_read_f64(r->f, "/ce/dlogits", NULL);
    double *got_d = malloc((size_t)N * V * sizeof *got_d);
    for (int p = 0; p < 2; p++) {
        int valid = p == 0 ? Vl : V - Vl;
        struct tensor gm = dev_from(r, r->st, gmax, N);
        struct tensor gp = dev_from(r, r->st, gpart, (size_t)3 * N);
        loss[p] = dev_fill(r, r->st, N, NAN);
        lse[p] = dev_fill(r, r->st, N, NAN);
        backend_ce_loss(r->be, loss[p], lse[p], gp, gm, targets, N, V, s, ignore);
        char what[64];
        snprintf(what, sizeof what, "ce 2 shards: row losses on shard %d", p);
        check(r, what, loss[p], "/ce/loss_rows");
        struct tensor d = dev_fill(r, r->dt, (size_t)N * Vl, NAN);
        backend_ce_backward(r->be, d, logits[p], lse[p], targets, N, Vl, valid, p * Vl, V, s,
                            ignore, 1.0f / count);
        double *h = host_of(r, d);
        double pad = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < Vl; j++) {
                if (j < valid) got_d[(size_t)i * V + p * Vl + j] = h[(size_t)i * Vl + j];
                else pad = fmax(pad, fabs(h[(size_t)i * Vl + j]));
            }
        EXPECT(pad == 0, "%s ce 2 shards: padding gradient %g on shard %d, expected 0",
               dtype_name(r->dt), pad, p);
        free(h);
        struct tensor all[] = {gm, gp, d, logits[p], rowmax[p], partials[p], loss[p], lse[p]};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) dev_free(r, all[i]);
    }
    char what[64];
    snprintf(what, sizeof what, "%s ce 2 shards: dlogits", dtype_name(r->dt));
    EXPECT_REL((size_t)N * V, got_d, want_d, r->tol, what);
    dev_free(r, targets);
    free(shard);
    free(hl);
    free(ht);
    free(want_d);
    free(got_d);
}

static void test_cross_entropy(struct run *r) {
    float s = (float)h5fixture_attr_f64(r->f, "/ce", "smoothing");
    ce_one_shard(r, "", s);
    ce_one_shard(r, "_s0", 0.0f);
    ce_two_shards(r, s);
}

static void test_embedding(struct run *r) {
    struct h5fixture_shape sw, sd;
    double *hw = h5fixture_read_f64(r->f, "/embedding/wte", &sw);
    double *ht = h5fixture_read_f64(r->f, "/embedding/tokens", NULL);
    free(h5fixture_read_f64(r->f, "/embedding/dout", &sd));
    int V = (int)sw.dims[0], C = (int)sw.dims[1], N = (int)sd.dims[0];
    struct tensor tokens = dev_from(r, DTYPE_I32, ht, N);
    struct tensor wte = dev_from(r, r->dt, hw, (size_t)V * C);
    struct tensor dout = dev_read(r, r->dt, "/embedding/dout", NULL);
    struct tensor out = dev_fill(r, r->dt, (size_t)N * C, NAN);
    struct tensor dwte = dev_fill(r, r->dt, (size_t)V * C, 0.125);
    backend_embedding_forward(r->be, out, wte, tokens, N, C, 0, V);
    check(r, "embedding out", out, "/embedding/out");
    backend_embedding_backward(r->be, dwte, dout, tokens, N, C, 0, V);
    check_offset(r, "embedding dwte (+=)", dwte, 0.125, "/embedding/dwte");

    // A vocab-parallel shard owning rows [lo, V): other tokens read zeros and
    // scatter nothing.
    int lo = V / 2, Vl = V - lo;
    double *want_o = h5fixture_read_f64(r->f, "/embedding/out", NULL);
    double *want_w = h5fixture_read_f64(r->f, "/embedding/dwte", NULL);
    for (int i = 0; i < N; i++)
        if ((int)ht[i] < lo) memset(want_o + (size_t)i * C, 0, C * sizeof *want_o);
    struct tensor swte = dev_from(r, r->dt, hw + (size_t)lo * C, (size_t)Vl * C);
    struct tensor sout = dev_fill(r, r->dt, (size_t)N * C, NAN);
    struct tensor sdw = dev_fill(r, r->dt, (size_t)Vl * C, 0.0);
    backend_embedding_forward(r->be, sout, swte, tokens, N, C, lo, Vl);
    backend_embedding_backward(r->be, sdw, dout, tokens, N, C, lo, Vl);
    double *go = host_of(r, sout), *gw = host_of(r, sdw);
    char what[64];
    snprintf(what, sizeof what, "%s embedding shard out", dtype_name(r->dt));
    EXPECT_REL((size_t)N * C, go, want_o, r->tol, what);
    snprintf(what, sizeof what, "%s embedding shard dwte", dtype_name(r->dt));
    EXPECT_REL((size_t)Vl * C, gw, want_w + (size_t)lo * C, r->tol, what);
    free(go);
    free(gw);
    free(want_o);
    free(want_w);
    free(hw);
    free(ht);
    struct tensor all[] = {tokens, wte, dout, out, dwte, swte, sout, sdw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dev_free(r, all[i]);
}

static void test_adamw(struct run *r, bool with_master) {
    float lr = (float)h5fixture_attr_f64(r->f, "/adamw", "lr");
    float b1 = (float)h5fixture_attr_f64(r->f, "/adamw", "beta1");
    float b2 = (float)h5fixture_attr_f64(r->f, "/adamw", "beta2");
    float eps = (float)h5fixture_attr_f64(r->f, "/adamw", "eps");
    float wd = (float)h5fixture_attr_f64(r->f, "/adamw", "weight_decay");
    size_t n;
    struct tensor master = {0};
    struct tensor param = dev_read(r, r->dt, "/adamw/p0", &n);
    if (with_master) { // master holds the weights; param only receives them
        master = param;
        param = dev_fill(r, r->dt, n, NAN);
    }
    struct tensor m = dev_fill(r, r->dt, n, 0.0), v = dev_fill(r, r->dt, n, 0.0);
    const char *what = with_master ? "adamw (master) param" : "adamw param";
    for (int step = 1; step <= 2; step++) {
        char gname[32], ref[32], label[64];
        snprintf(gname, sizeof gname, "/adamw/g%d", step);
        snprintf(ref, sizeof ref, "/adamw/p%d", step);
        struct tensor g = dev_read(r, r->dt, gname, NULL);
        backend_adamw(r->be, param, master, g, m, v, n, lr, b1, b2, eps, wd, 1.0f, step);
        snprintf(label, sizeof label, "%s after step %d", what, step);
        check(r, label, param, ref);
        if (with_master) {
            snprintf(label, sizeof label, "adamw master after step %d", step);
            check(r, label, master, ref);
        }
        dev_free(r, g);
    }
    check(r, "adamw m after step 2", m, "/adamw/m2");
    check(r, "adamw v after step 2", v, "/adamw/v2");
    dev_free(r, param);
    dev_free(r, m);
    dev_free(r, v);
    if (with_master) dev_free(r, master);
}

int main(void) {
    struct backend *be = backend_cpu_init(1);
    hid_t f = h5fixture_open(getenv("OPS_FIXTURE") ? getenv("OPS_FIXTURE") : FIXTURE);
    struct run runs[] = {
        {be, f, DTYPE_FP32, DTYPE_FP32, 1e-5},
        {be, f, DTYPE_FP64, DTYPE_FP64, 1e-10},
    };
    for (int i = 0; i < 2; i++) {
        struct run *r = &runs[i];
        test_rmsnorm(r);
        test_rope(r);
        test_attention(r);
        test_swiglu(r);
        test_cross_entropy(r);
        test_embedding(r);
        test_adamw(r, false);
        if (r->dt == DTYPE_FP32) test_adamw(r, true);
    }
    h5fixture_close(f);
    hid_t fd = h5fixture_open(getenv("DOCMASK_FIXTURE") ? getenv("DOCMASK_FIXTURE") : DOCMASK_FIXTURE);
    struct run docs[] = {
        {be, fd, DTYPE_FP32, DTYPE_FP32, 1e-6},
        {be, fd, DTYPE_FP64, DTYPE_FP64, 1e-12},
    };
    for (int i = 0; i < 2; i++) test_docmask(&docs[i]);
    h5fixture_close(fd);
    backend_free(be);
    return test_finish("test_ops_reference");
}

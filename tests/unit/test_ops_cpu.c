// test_ops_cpu.c: the CPU backend's FP32 kernels against its FP64 kernels on
// the same (float-representable) inputs, and both against independent
// references: naive loops in double (matmul, attention, rope at large
// positions, sum of squares), literal torch.optim.AdamW values, and the
// contract's edge cases (accumulating ops, ignored rows, empty vocab shards).
// Output buffers are NaN-poisoned before each call so an unwritten element
// fails. Also: no heap allocation in a second pass over every op, OpenBLAS is
// the OpenMP build (single-threaded inside parallel regions), and unsupported
// dtypes abort with a message.
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "kernels/ops.h"
#include "test.h"

#define TOL 1e-5

// ---- heap-allocation counter: interposes the allocator of the process -------
#if !defined(__SANITIZE_ADDRESS__)
#define COUNT_HEAP 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);
static int heap_counting;
static long heap_calls, heap_frees;
#define HEAP_COUNT() (heap_counting ? __atomic_add_fetch(&heap_calls, 1, __ATOMIC_RELAXED) : 0)
void *malloc(size_t n) { HEAP_COUNT(); return __libc_malloc(n); }
void *calloc(size_t c, size_t n) { HEAP_COUNT(); return __libc_calloc(c, n); }
void *realloc(void *p, size_t n) { HEAP_COUNT(); return __libc_realloc(p, n); }
void *memalign(size_t a, size_t n) { HEAP_COUNT(); return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { HEAP_COUNT(); return __libc_memalign(a, n); }
void free(void *p) {
    if (heap_counting && p) __atomic_add_fetch(&heap_frees, 1, __ATOMIC_RELAXED);
    __libc_free(p);
}
int posix_memalign(void **p, size_t a, size_t n) {
    HEAP_COUNT();
    *p = __libc_memalign(a, n);
    return *p ? 0 : ENOMEM;
}
#endif

static struct backend *be;
static uint64_t rng = 0x243f6a8885a308d3ull;

static double rnd(void) { // uniform in [-1, 1)
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2 - 1;
}

// One tensor held twice, in FP32 and FP64 backend memory.
struct buf { float *f; double *d; size_t n; };

static struct buf buf_alloc(size_t n) {
    struct buf b = {backend_alloc(be, n * 4 + 4), backend_alloc(be, n * 8 + 8), n};
    return b;
}
// Random values of magnitude scale, rounded to float so both copies are equal.
static struct buf buf_rand(size_t n, double scale) {
    struct buf b = buf_alloc(n);
    for (size_t i = 0; i < n; i++) b.d[i] = b.f[i] = (float)(scale * rnd());
    return b;
}
static void buf_poison(struct buf b) {
    for (size_t i = 0; i < b.n; i++) b.f[i] = NAN, b.d[i] = NAN;
}
static struct buf buf_nan(size_t n) {
    struct buf b = buf_alloc(n);
    buf_poison(b);
    return b;
}
static void buf_set(struct buf b, const struct buf src) {
    memcpy(b.f, src.f, b.n * 4);
    memcpy(b.d, src.d, b.n * 8);
}
static void buf_free(struct buf b) { backend_dealloc(be, b.f), backend_dealloc(be, b.d); }
static struct tensor tf(struct buf b) { return tensor_view(b.f, DTYPE_FP32, b.n); }
static struct tensor td(struct buf b) { return tensor_view(b.d, DTYPE_FP64, b.n); }
static struct tensor ti(int32_t *p, size_t n) { return tensor_view(p, DTYPE_I32, n); }

static size_t count_nan_f(const float *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += isnan(p[i]);
    return k;
}
static size_t count_nan_d(const double *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += isnan(p[i]);
    return k;
}

// FP32 result within tol of the FP64 result, and every element written.
static void expect_close(struct buf b, double tol, const char *what) {
    size_t nf = count_nan_f(b.f, b.n), nd = count_nan_d(b.d, b.n);
    EXPECT(nf == 0 && nd == 0, "%s: %zu (fp32) and %zu (fp64) of %zu elements NaN / unwritten",
           what, nf, nd, b.n);
    EXPECT_REL(b.n, b.f, b.d, tol, what);
}

// ---- matmul: fp32 vs fp64 vs a naive loop, accumulate --------------------------

// Sizes cover the single-call path and the per-thread slabs over M and over N.
static void test_matmul(bool ta, bool tb, int M, int N, int K) {
    struct buf a = buf_rand((size_t)M * K, 1), b = buf_rand((size_t)K * N, 1);
    struct buf out0 = buf_rand((size_t)M * N, 1), out = buf_nan((size_t)M * N);
    char what[96];
    for (int acc = 0; acc < 2; acc++) {
        float beta = acc ? 1 : 0;
        if (acc) buf_set(out, out0);
        else buf_poison(out);
        backend_matmul(be, tf(out), tf(a), tf(b), M, N, K, ta, tb, 0.5f, beta);
        backend_matmul(be, td(out), td(a), td(b), M, N, K, ta, tb, 0.5f, beta);
        snprintf(what, sizeof what, "matmul %dx%dx%d ta=%d tb=%d beta=%g fp32 vs fp64", M, N, K, ta,
                 tb, beta);
        expect_close(out, TOL, what);
        double *ref = malloc(sizeof(double) * M * N);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int k = 0; k < K; k++)
                    s += a.d[ta ? (size_t)k * M + i : (size_t)i * K + k] *
                         b.d[tb ? (size_t)j * K + k : (size_t)k * N + j];
                ref[(size_t)i * N + j] = 0.5 * s + beta * out0.d[(size_t)i * N + j];
            }
        snprintf(what, sizeof what, "matmul %dx%dx%d ta=%d tb=%d beta=%g vs naive", M, N, K, ta,
                 tb, beta);
        EXPECT_REL((size_t)M * N, out.d, ref, 1e-13, what);
        free(ref);
    }
    buf_free(a), buf_free(b), buf_free(out0), buf_free(out);
}

// ---- embedding, rmsnorm, rope, swiglu ----------------------------------------------

static void test_embedding(void) {
    int N = 9, C = 70, Vl = 6, vs = 12; // C > one 64-column block
    int32_t tok[] = {12, 17, 3, 14, 18, 14, 12, 12, 30};
    struct buf wte = buf_rand((size_t)Vl * C, 1), out = buf_nan((size_t)N * C);
    backend_embedding_forward(be, tf(out), tf(wte), ti(tok, N), N, C, vs, Vl);
    backend_embedding_forward(be, td(out), td(wte), ti(tok, N), N, C, vs, Vl);
    expect_close(out, 0, "embedding_forward fp32 vs fp64");
    int zero_rows_ok = 1;
    for (int j = 0; j < C; j++) zero_rows_ok &= out.f[2 * C + j] == 0 && out.f[4 * C + j] == 0 &&
                                              out.f[8 * C + j] == 0 && out.f[C + j] == wte.f[5 * C + j];
    EXPECT(zero_rows_ok, "embedding rows of other shards must be 0, row 1 must be wte[5]");
    // dwte += : starts from random values, must end at start + scatter (13 times 12..)
    struct buf dwte = buf_rand((size_t)Vl * C, 1), dwte0 = buf_alloc((size_t)Vl * C);
    buf_set(dwte0, dwte);
    struct buf dout = buf_rand((size_t)N * C, 1);
    backend_embedding_backward(be, tf(dwte), tf(dout), ti(tok, N), N, C, vs, Vl);
    backend_embedding_backward(be, td(dwte), td(dout), ti(tok, N), N, C, vs, Vl);
    expect_close(dwte, TOL, "embedding_backward fp32 vs fp64");
    double err = 0;
    for (int j = 0; j < C; j++) { // token 12 at rows 0, 6, 7; token 13 nowhere
        err = fmax(err, fabs(dwte.d[j] - (dwte0.d[j] + dout.d[j] + dout.d[6 * C + j] + dout.d[7 * C + j])));
        err = fmax(err, fabs(dwte.d[C + j] - dwte0.d[C + j]));
    }
    EXPECT(err < 1e-14, "embedding_backward accumulates: max error %g", err);
    buf_free(wte), buf_free(out), buf_free(dwte), buf_free(dwte0), buf_free(dout);
}

static void test_rmsnorm(void) {
    int N = 17, C = 100;
    struct buf x = buf_rand((size_t)N * C, 2), w = buf_rand(C, 1), y = buf_nan((size_t)N * C);
    struct buf rstd = buf_nan(N);
    backend_rmsnorm_forward(be, tf(y), tf(rstd), tf(x), tf(w), N, C, 1e-5f);
    backend_rmsnorm_forward(be, td(y), td(rstd), td(x), td(w), N, C, 1e-5f);
    expect_close(y, TOL, "rmsnorm_forward y fp32 vs fp64");
    expect_close(rstd, TOL, "rmsnorm_forward rstd fp32 vs fp64");
    double ms = 0; // row 3 directly
    for (int j = 0; j < C; j++) ms += x.d[3 * C + j] * x.d[3 * C + j];
    double r3 = 1 / sqrt(ms / C + (double)1e-5f);
    EXPECT(fabs(rstd.d[3] - r3) < 1e-14 * r3, "rstd[3] %.17g, direct %.17g", rstd.d[3], r3);
    // dx +=, dw += : from zero and from a start value, the difference is the start
    struct buf dy = buf_rand((size_t)N * C, 1), dx = buf_alloc((size_t)N * C), dw = buf_alloc(C);
    struct buf dx0 = buf_rand((size_t)N * C, 1), dw0 = buf_rand(C, 1);
    struct buf dxz = buf_alloc((size_t)N * C), dwz = buf_alloc(C);
    memset(dxz.d, 0, N * C * 8), memset(dwz.d, 0, C * 8);
    memset(dxz.f, 0, N * C * 4), memset(dwz.f, 0, C * 4);
    buf_set(dx, dx0), buf_set(dw, dw0);
    backend_rmsnorm_backward(be, tf(dx), tf(dw), tf(dy), tf(x), tf(w), tf(rstd), N, C);
    backend_rmsnorm_backward(be, td(dx), td(dw), td(dy), td(x), td(w), td(rstd), N, C);
    backend_rmsnorm_backward(be, tf(dxz), tf(dwz), tf(dy), tf(x), tf(w), tf(rstd), N, C);
    backend_rmsnorm_backward(be, td(dxz), td(dwz), td(dy), td(x), td(w), td(rstd), N, C);
    expect_close(dxz, TOL, "rmsnorm_backward dx fp32 vs fp64");
    expect_close(dwz, TOL, "rmsnorm_backward dw fp32 vs fp64");
    for (size_t i = 0; i < dx.n; i++) dx.d[i] -= dx0.d[i];
    for (size_t i = 0; i < dw.n; i++) dw.d[i] -= dw0.d[i];
    EXPECT_REL(dx.n, dx.d, dxz.d, 1e-13, "rmsnorm_backward dx accumulates");
    EXPECT_REL(dw.n, dw.d, dwz.d, 1e-13, "rmsnorm_backward dw accumulates");
    struct buf all[] = {x, w, y, rstd, dy, dx, dw, dx0, dw0, dxz, dwz};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
}

// RoPE at positions 4000..4095 in FP32 (tables from rope_table_fill) against
// a rotation computed directly in double; inverse(forward(x)) == x.
static void test_rope(void) {
    int B = 2, T = 96, Hx = 3, D = 64, Tmax = 4096, pos = 4000;
    size_t n = (size_t)B * T * Hx * D, nt = (size_t)Tmax * D / 2;
    struct buf x = buf_rand(n, 1), x0 = buf_alloc(n), cs = buf_alloc(nt), sn = buf_alloc(nt);
    buf_set(x0, x);
    rope_table_fill(cs.f, sn.f, Tmax, D, 500000.0);
    rope_table_fill_f64(cs.d, sn.d, Tmax, D, 500000.0);
    backend_rope_forward(be, tf(x), tf(cs), tf(sn), B, T, Hx, D, pos);
    backend_rope_forward(be, td(x), td(cs), td(sn), B, T, Hx, D, pos);
    expect_close(x, TOL, "rope_forward at 4000..4095 fp32 vs fp64");
    double *ref = malloc(n * sizeof(double));
    for (int bt = 0; bt < B * T; bt++)
        for (int h = 0; h < Hx; h++)
            for (int i = 0; i < D / 2; i++) {
                size_t o = ((size_t)bt * Hx + h) * D;
                double ang = (pos + bt % T) * pow(500000.0, -2.0 * i / D);
                double a = x0.d[o + i], b = x0.d[o + i + D / 2];
                ref[o + i] = a * cos(ang) - b * sin(ang);
                ref[o + i + D / 2] = b * cos(ang) + a * sin(ang);
            }
    EXPECT_REL(n, x.f, ref, TOL, "rope_forward fp32 at 4000..4095 vs direct double");
    EXPECT_REL(n, x.d, ref, 1e-13, "rope_forward fp64 at 4000..4095 vs direct double");
    backend_rope_backward(be, tf(x), tf(cs), tf(sn), B, T, Hx, D, pos);
    EXPECT_REL(n, x.f, x0.f, 1e-6, "rope_backward undoes rope_forward (fp32)");
    free(ref);
    buf_free(x), buf_free(x0), buf_free(cs), buf_free(sn);
}

// rope_inv_freq against transformers' own ROPE_INIT_FUNCTIONS (default,
// linear, llama3: tests/reference/rope_scaling_reference.py wrote the
// fixture, float32 values) within 2e-6 relative, every band of llama3's
// (kept, divided by factor, smoothed) present; and rope_table_fill_scaled's
// tables hold cos, sin of p * rope_inv_freq (fp32 and fp64).
static void test_rope_scaling_reference(void) {
    const char *path = "tests/reference/fixtures/rope_scaling_inv_freq.txt";
    FILE *f = fopen(path, "r");
    EXPECT(f, "%s: cannot open (run from the repository root)", path);
    if (!f) return;
    char kind[16];
    int D, orig, i, lines = 0, bands[3] = {0};
    double theta, factor, lo, hi, want;
    while (fscanf(f, "%15s %d %lf %lf %lf %lf %d %d %lf", kind, &D, &theta, &factor, &lo, &hi,
                  &orig, &i, &want) == 9) {
        struct rope_scaling sc = {!strcmp(kind, "linear")   ? ROPE_SCALING_LINEAR
                                  : !strcmp(kind, "llama3") ? ROPE_SCALING_LLAMA3
                                                            : ROPE_SCALING_NONE,
                                  factor, lo, hi, orig};
        double got = rope_inv_freq(i, D, theta, &sc), plain = rope_inv_freq(i, D, theta, NULL);
        EXPECT(fabs(got - want) <= 2e-6 * want, "%s D=%d factor %g orig %d: inv_freq[%d] = %.9e, "
               "transformers %.9e", kind, D, factor, orig, i, got, want);
        if (sc.type == ROPE_SCALING_LLAMA3)
            bands[fabs(got - plain) <= 1e-12 * plain ? 0 : fabs(got - plain / factor) <= 1e-12 * plain ? 1 : 2]++;
        lines++;
    }
    fclose(f);
    EXPECT(lines == 210, "%s: %d frequencies read, expected 210", path, lines);
    EXPECT(bands[0] && bands[1] && bands[2], "llama3 bands kept %d, divided %d, smoothed %d",
           bands[0], bands[1], bands[2]);
    struct rope_scaling sc = {ROPE_SCALING_LLAMA3, 4.0, 1.0, 4.0, 16};
    int Tmax = 40, Dt = 24;
    size_t nt = (size_t)Tmax * Dt / 2;
    struct buf cs = buf_alloc(nt), sn = buf_alloc(nt);
    rope_table_fill_scaled(cs.f, sn.f, Tmax, Dt, 10000.0, &sc);
    rope_table_fill_scaled_f64(cs.d, sn.d, Tmax, Dt, 10000.0, &sc);
    double worst = 0, worst32 = 0;
    for (int p = 0; p < Tmax; p++)
        for (int k = 0; k < Dt / 2; k++) {
            double a = p * rope_inv_freq(k, Dt, 10000.0, &sc);
            size_t o = (size_t)p * Dt / 2 + k;
            worst = fmax(worst, fmax(fabs(cs.d[o] - cos(a)), fabs(sn.d[o] - sin(a))));
            worst32 = fmax(worst32, fmax(fabs(cs.f[o] - cos(a)), fabs(sn.f[o] - sin(a))));
        }
    EXPECT(worst <= 1e-14 && worst32 <= 6e-8, "rope_table_fill_scaled: worst |table - "
           "cos/sin(p inv_freq)| %.3e (fp64), %.3e (fp32)", worst, worst32);
    buf_free(cs), buf_free(sn);
}

// rope_qkv: the split equals copying the parts and rope_forward_docs (bit
// for bit, FP32 and FP64, with a document start); the join is its adjoint:
// <split(x), y> = <x, join(y)> in FP64 (a linear map's exact gradient check).
static void test_rope_qkv(void) {
    int B = 2, T = 7, H = 4, Hkv = 2, D = 12, W = (H + 2 * Hkv) * D;
    size_t N = (size_t)B * T, nq = N * H * D, nk = N * Hkv * D, nt = (size_t)T * D / 2;
    struct buf qkv = buf_rand(N * W, 1), cs = buf_alloc(nt), sn = buf_alloc(nt);
    struct buf q = buf_nan(nq), k = buf_nan(nk), v = buf_nan(nk);
    struct buf rq = buf_alloc(nq), rk = buf_alloc(nk);
    rope_table_fill(cs.f, sn.f, T, D, 10000.0);
    rope_table_fill_f64(cs.d, sn.d, T, D, 10000.0);
    int32_t ds[2 * 7] = {0, 0, 0, 3, 3, 3, 3, 0, 1, 1, 1, 1, 5, 5};
    struct tensor docs = ti(ds, N);
    backend_rope_qkv_split(be, tf(q), tf(k), tf(v), tf(qkv), tf(cs), tf(sn), docs, B, T, H, Hkv, D);
    backend_rope_qkv_split(be, td(q), td(k), td(v), td(qkv), td(cs), td(sn), docs, B, T, H, Hkv, D);
    for (size_t r = 0; r < N; r++) {
        memcpy(rq.f + r * H * D, qkv.f + r * W, (size_t)H * D * 4);
        memcpy(rq.d + r * H * D, qkv.d + r * W, (size_t)H * D * 8);
        memcpy(rk.f + r * Hkv * D, qkv.f + r * W + H * D, (size_t)Hkv * D * 4);
        memcpy(rk.d + r * Hkv * D, qkv.d + r * W + H * D, (size_t)Hkv * D * 8);
        for (int j = 0; j < Hkv * D; j++) // v: the last Hkv heads of the row
            EXPECT(v.f[r * Hkv * D + j] == qkv.f[r * W + (H + Hkv) * D + j] &&
                   v.d[r * Hkv * D + j] == qkv.d[r * W + (H + Hkv) * D + j],
                   "rope_qkv_split: v row %zu element %d", r, j);
    }
    backend_rope_forward_docs(be, tf(rq), tf(cs), tf(sn), docs, B, T, H, D, 0);
    backend_rope_forward_docs(be, td(rq), td(cs), td(sn), docs, B, T, H, D, 0);
    backend_rope_forward_docs(be, tf(rk), tf(cs), tf(sn), docs, B, T, Hkv, D, 0);
    backend_rope_forward_docs(be, td(rk), td(cs), td(sn), docs, B, T, Hkv, D, 0);
    EXPECT_REL(nq, q.f, rq.f, 0, "rope_qkv_split q (fp32) = rope_forward_docs of the part");
    EXPECT_REL(nq, q.d, rq.d, 0, "rope_qkv_split q (fp64) = rope_forward_docs of the part");
    EXPECT_REL(nk, k.f, rk.f, 0, "rope_qkv_split k (fp32) = rope_forward_docs of the part");
    EXPECT_REL(nk, k.d, rk.d, 0, "rope_qkv_split k (fp64) = rope_forward_docs of the part");
    struct buf dq = buf_rand(nq, 1), dk = buf_rand(nk, 1), dv = buf_rand(nk, 1);
    struct buf dqkv = buf_nan(N * W);
    backend_rope_qkv_join(be, td(dqkv), td(dq), td(dk), td(dv), td(cs), td(sn), docs, B, T, H, Hkv, D);
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < nq; i++) lhs += q.d[i] * dq.d[i];
    for (size_t i = 0; i < nk; i++) lhs += k.d[i] * dk.d[i] + v.d[i] * dv.d[i];
    for (size_t i = 0; i < N * W; i++) rhs += qkv.d[i] * dqkv.d[i];
    EXPECT(fabs(lhs - rhs) <= 1e-12 * fabs(lhs), "rope_qkv_join is not split's adjoint: %.17g vs %.17g",
           lhs, rhs);
    struct buf all[] = {qkv, cs, sn, q, k, v, rq, rk, dq, dk, dv, dqkv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
}

static void test_swiglu(void) {
    size_t n = 1000;
    struct buf g = buf_rand(n, 8), u = buf_rand(n, 1), o = buf_nan(n), dout = buf_rand(n, 1);
    struct buf dg = buf_nan(n), du = buf_nan(n);
    backend_swiglu_forward(be, tf(o), tf(g), tf(u), n);
    backend_swiglu_forward(be, td(o), td(g), td(u), n);
    expect_close(o, TOL, "swiglu_forward fp32 vs fp64");
    double ref = g.d[7] / (1 + exp(-g.d[7])) * u.d[7];
    EXPECT(fabs(o.d[7] - ref) <= 1e-15 * fabs(ref), "swiglu out[7] %g, direct %g", o.d[7], ref);
    backend_swiglu_backward(be, tf(dg), tf(du), tf(dout), tf(g), tf(u), n);
    backend_swiglu_backward(be, td(dg), td(du), td(dout), td(g), td(u), n);
    expect_close(dg, TOL, "swiglu_backward dgate fp32 vs fp64");
    expect_close(du, TOL, "swiglu_backward dup fp32 vs fp64");
    buf_free(g), buf_free(u), buf_free(o), buf_free(dout), buf_free(dg), buf_free(du);
}

// ---- attention: naive double loop, fp32 vs fp64 ------------------------------------

struct att { int B, T, H, Hkv, D; struct buf q, k, v, out, lse, dout, dq, dk, dv; };

static struct att att_make(int B, int T, int H, int Hkv, int D) {
    struct att a = {.B = B, .T = T, .H = H, .Hkv = Hkv, .D = D};
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D;
    a.q = buf_rand(nq, 1.5), a.k = buf_rand(nk, 1.5), a.v = buf_rand(nk, 1);
    a.out = buf_nan(nq), a.lse = buf_nan((size_t)B * H * T), a.dout = buf_rand(nq, 1);
    a.dq = buf_nan(nq), a.dk = buf_nan(nk), a.dv = buf_nan(nk);
    return a;
}
static void att_free(struct att *a) {
    struct buf all[] = {a->q, a->k, a->v, a->out, a->lse, a->dout, a->dq, a->dk, a->dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
}
static void att_run(struct att *a, bool fp64) {
    struct tensor (*t)(struct buf) = fp64 ? td : tf;
    backend_attention_forward(be, t(a->out), t(a->lse), t(a->q), t(a->k), t(a->v), a->B, a->T, a->H,
                              a->Hkv, a->D);
    backend_attention_backward(be, t(a->dq), t(a->dk), t(a->dv), t(a->dout), t(a->q), t(a->k),
                               t(a->v), t(a->out), t(a->lse), a->B, a->T, a->H, a->Hkv, a->D);
}

static void test_attention(void) {
    // T = 130: two full 64-row blocks and a partial one; 2 query heads per kv head
    struct att a = att_make(2, 130, 4, 2, 16);
    att_run(&a, false);
    att_run(&a, true);
    expect_close(a.out, TOL, "attention_forward out fp32 vs fp64");
    expect_close(a.lse, TOL, "attention_forward lse fp32 vs fp64");
    expect_close(a.dq, TOL, "attention_backward dq fp32 vs fp64");
    expect_close(a.dk, TOL, "attention_backward dk fp32 vs fp64");
    expect_close(a.dv, TOL, "attention_backward dv fp32 vs fp64");
    // naive: for each (b, h, i): scores over j <= i, softmax, weighted sum of v
    int B = a.B, T = a.T, H = a.H, Hkv = a.Hkv, D = a.D;
    size_t nq = a.q.n;
    double *out = malloc(nq * sizeof(double)), *lse = malloc((size_t)B * H * T * sizeof(double));
    double *s = malloc(T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const double *qi = a.q.d + (((size_t)b * T + i) * H + h) * D;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const double *kj = a.k.d + (((size_t)b * T + j) * Hkv + h / (H / Hkv)) * D;
                    s[j] = 0;
                    for (int d = 0; d < D; d++) s[j] += qi[d] * kj[d];
                    s[j] /= sqrt(D);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
                lse[((size_t)b * H + h) * T + i] = mx + log(sum);
                double *oi = out + (((size_t)b * T + i) * H + h) * D;
                for (int d = 0; d < D; d++) oi[d] = 0;
                for (int j = 0; j <= i; j++) {
                    const double *vj = a.v.d + (((size_t)b * T + j) * Hkv + h / (H / Hkv)) * D;
                    for (int d = 0; d < D; d++) oi[d] += exp(s[j] - mx) / sum * vj[d];
                }
            }
    EXPECT_REL(nq, a.out.d, out, 1e-12, "attention_forward fp64 vs naive loop");
    EXPECT_REL((size_t)B * H * T, a.lse.d, lse, 1e-12, "attention lse fp64 vs naive loop");
    EXPECT_REL(nq, a.out.f, out, TOL, "attention_forward fp32 vs naive loop");
    free(out), free(lse), free(s);
    att_free(&a);
}

// ---- cross-entropy -------------------------------------------------------------------

static const int IGN = -100;

static void test_cross_entropy(void) {
    int N = 8, V = 1000, Vl = 1024; // one shard, 24 padding columns
    float sm = 0.1f;
    int32_t tg[] = {5, IGN, 999, 0, 512, IGN, 77, 998};
    struct buf z = buf_rand((size_t)N * Vl, 6);
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vl; j++) z.f[i * Vl + j] = z.d[i * Vl + j] = NAN; // never read
    struct buf rm = buf_nan(N), part = buf_nan(3 * (size_t)N), loss = buf_nan(N), lse = buf_nan(N);
    struct buf dz = buf_nan((size_t)N * Vl);
    for (int p = 0; p < 2; p++) {
        struct tensor (*t)(struct buf) = p ? td : tf;
        backend_ce_row_max(be, t(rm), t(z), N, Vl, V);
        backend_ce_partials(be, t(part), t(z), t(rm), ti(tg, N), N, Vl, V, 0);
        backend_ce_loss(be, t(loss), t(lse), t(part), t(rm), ti(tg, N), N, V, sm, IGN);
        backend_ce_backward(be, t(dz), t(z), t(lse), ti(tg, N), N, Vl, V, 0, V, sm, IGN, 1.0f / 6);
    }
    expect_close(rm, 0, "ce_row_max fp32 vs fp64");
    expect_close(part, TOL, "ce_partials fp32 vs fp64");
    expect_close(loss, TOL, "ce_loss loss fp32 vs fp64");
    expect_close(lse, TOL, "ce_loss lse fp32 vs fp64");
    expect_close(dz, TOL, "ce_backward fp32 vs fp64");
    // torch's definition: loss = -sum_j q_j log p_j, q = (1 - s) onehot(y) + s / V
    double maxerr = 0;
    for (int i = 0; i < N; i++) {
        if (tg[i] == IGN) {
            int zero = loss.f[i] == 0 && loss.d[i] == 0;
            for (int j = 0; j < Vl; j++) zero &= dz.f[i * Vl + j] == 0 && dz.d[i * Vl + j] == 0;
            EXPECT(zero, "ignored row %d: loss and dlogits must be exactly 0", i);
            continue;
        }
        const double *zi = z.d + (size_t)i * Vl;
        double mx = -INFINITY, se = 0, l = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, zi[j]);
        for (int j = 0; j < V; j++) se += exp(zi[j] - mx);
        for (int j = 0; j < V; j++)
            l -= ((j == tg[i]) * (1 - (double)sm) + (double)sm / V) * (zi[j] - mx - log(se));
        maxerr = fmax(maxerr, fabs(loss.d[i] - l) / l);
        for (int j = V; j < Vl; j++)
            EXPECT(dz.f[i * Vl + j] == 0, "padding column %d of row %d: %g", j, i, dz.f[i * Vl + j]);
    }
    EXPECT(maxerr < 1e-12, "ce loss vs -sum q log p: max relative error %g", maxerr);

    // every row ignored: all zeros, nothing NaN
    int32_t all_ign[8];
    for (int i = 0; i < N; i++) all_ign[i] = IGN;
    buf_poison(loss), buf_poison(lse), buf_poison(dz);
    backend_ce_loss(be, tf(loss), tf(lse), tf(part), tf(rm), ti(all_ign, N), N, V, sm, IGN);
    backend_ce_backward(be, tf(dz), tf(z), tf(lse), ti(all_ign, N), N, Vl, V, 0, V, sm, IGN, 0.f);
    int ok = count_nan_f(lse.f, N) == 0;
    for (int i = 0; i < N; i++) ok &= loss.f[i] == 0;
    for (size_t i = 0; i < dz.n; i++) ok &= dz.f[i] == 0;
    EXPECT(ok, "all rows ignored: loss and dlogits exactly 0, lse not NaN");
    buf_free(z), buf_free(rm), buf_free(part), buf_free(loss), buf_free(lse), buf_free(dz);

    // shards [0, 5), [5, 10) and an empty one (Vvalid = 0 at vocab_start 10) vs one shard
    enum { n = 3, v = 10, vl = 5 };
    int32_t t3[n] = {9, 2, IGN};
    double full[n * v], sh[3][n * vl], rmax[n], r[n], pt[3 * n] = {0}, p[3 * n], l1[n], l3[n], ls[n];
    for (int i = 0; i < n * v; i++) full[i] = 4 * rnd();
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < vl; j++) sh[s][i * vl + j] = s < 2 ? full[i * v + s * vl + j] : NAN;
    struct tensor tr = tensor_view(r, DTYPE_FP64, n), tp = tensor_view(p, DTYPE_FP64, 3 * n);
    for (int i = 0; i < n; i++) rmax[i] = -INFINITY;
    for (int s = 0; s < 3; s++) {
        backend_ce_row_max(be, tr, tensor_view(sh[s], DTYPE_FP64, n * vl), n, vl, s < 2 ? vl : 0);
        for (int i = 0; i < n; i++) rmax[i] = fmax(rmax[i], r[i]);
        if (s == 2) EXPECT(r[0] == -INFINITY, "row max of an empty shard: %g", r[0]);
    }
    struct tensor trm = tensor_view(rmax, DTYPE_FP64, n);
    for (int s = 0; s < 3; s++) {
        backend_ce_partials(be, tp, tensor_view(sh[s], DTYPE_FP64, n * vl), trm, ti(t3, n), n, vl,
                            s < 2 ? vl : 0, s * vl);
        for (int i = 0; i < 3 * n; i++) pt[i] += p[i];
        if (s == 2) EXPECT(p[0] == 0 && p[1] == 0 && p[2] == 0, "partials of an empty shard");
    }
    backend_ce_loss(be, tensor_view(l3, DTYPE_FP64, n), tensor_view(ls, DTYPE_FP64, n),
                    tensor_view(pt, DTYPE_FP64, 3 * n), trm, ti(t3, n), n, v, sm, IGN);
    double dze[n * vl];
    backend_ce_backward(be, tensor_view(dze, DTYPE_FP64, n * vl), tensor_view(sh[2], DTYPE_FP64, n * vl),
                        tensor_view(ls, DTYPE_FP64, n), ti(t3, n), n, vl, 0, 2 * vl, v, sm, IGN, 1);
    ok = 1;
    for (int i = 0; i < n * vl; i++) ok &= dze[i] == 0;
    EXPECT(ok, "ce_backward on an empty shard writes 0");
    backend_ce_row_max(be, tr, tensor_view(full, DTYPE_FP64, n * v), n, v, v);
    backend_ce_partials(be, tp, tensor_view(full, DTYPE_FP64, n * v), tr, ti(t3, n), n, v, v, 0);
    backend_ce_loss(be, tensor_view(l1, DTYPE_FP64, n), tensor_view(ls, DTYPE_FP64, n), tp, tr,
                    ti(t3, n), n, v, sm, IGN);
    EXPECT_REL(n, l3, l1, 1e-14, "ce loss of 2 shards + an empty one vs one shard");
    EXPECT(l3[2] == 0 && !isnan(ls[2]), "ignored row: loss %g lse %g", l3[2], ls[2]);
}

// ---- AdamW against torch -------------------------------------------------------------

// Expected values from torch 2.15 (float32), tests/unit/test_ops_cpu.c's snippet:
//   p = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0, 0.0, 3.0e-3]))
//   opt = torch.optim.AdamW([p], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
//   for g in ([0.1, -0.2, 0.3, 0.0, 1e-4], [-0.05, 0.4, 0.3, 2.0, -1e-4]):
//       p.grad = torch.tensor(g); opt.step(); print(p)
//   print(opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])
// The gradients passed here are twice torch's, with grad_scale = 0.5.
static const double ADAM_P1[5] = {0.489500016, -0.989000022, 1.98800004, 0, -0.00700199977};
static const double ADAM_P2[5] = {0.486326814, -0.9916448, 1.97601211, -0.00734960008,
                                  -0.00646873517};
static const double ADAM_M2[5] = {0.00400000019, 0.0220000017, 0.0570000038, 0.200000003,
                                  -9.9999977e-07};
static const double ADAM_V2[5] = {0.000600000028, 0.00990000088, 0.00877500046, 0.200000003,
                                  9.7499997e-10};

static void test_adamw(void) {
    const double p0[5] = {0.5, -1.0, 2.0, 0.0, 3.0e-3};
    const double g[2][5] = {{0.2, -0.4, 0.6, 0.0, 2e-4}, {-0.1, 0.8, 0.6, 4.0, -2e-4}};
    for (int mode = 0; mode < 3; mode++) { // fp32, fp64, fp32 master with fp32 param copy
        enum dtype dt = mode == 1 ? DTYPE_FP64 : DTYPE_FP32;
        size_t es = dtype_size(dt);
        void *w = backend_alloc(be, 5 * es), *gr = backend_alloc(be, 5 * es);
        void *m = backend_alloc(be, 5 * es), *v = backend_alloc(be, 5 * es);
        float *master = mode == 2 ? backend_alloc(be, 5 * 4) : NULL;
        double got[4][5];
        struct tensor tw = tensor_view(w, dt, 5), tg = tensor_view(gr, dt, 5);
        struct tensor tm = tensor_view(m, dt, 5), tv = tensor_view(v, dt, 5);
        struct tensor tmaster = tensor_view(master, DTYPE_FP32, master ? 5 : 0);
        double p64[5], z[5] = {0};
        memcpy(p64, p0, sizeof p64);
        struct tensor src = tensor_view(p64, DTYPE_FP64, 5), zero = tensor_view(z, DTYPE_FP64, 5);
        backend_copy(be, master ? tmaster : tw, src, 5);
        backend_copy(be, tm, zero, 5), backend_copy(be, tv, zero, 5);
        if (master) for (int i = 0; i < 5; i++) ((float *)w)[i] = NAN; // param is written, not read
        for (int s = 0; s < 2; s++) {
            double gs[5];
            memcpy(gs, g[s], sizeof gs);
            backend_copy(be, tg, tensor_view(gs, DTYPE_FP64, 5), 5);
            backend_adamw(be, tw, tmaster, tg, tm, tv, 5, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, s + 1);
            backend_copy(be, tensor_view(got[s], DTYPE_FP64, 5), tw, 5);
        }
        backend_copy(be, tensor_view(got[2], DTYPE_FP64, 5), tm, 5);
        backend_copy(be, tensor_view(got[3], DTYPE_FP64, 5), tv, 5);
        const char *name[] = {"adamw fp32", "adamw fp64", "adamw fp32 master"};
        char what[64];
        // torch's float32 numbers: relative 1e-6 (fp64 differs from them by float rounding)
        snprintf(what, sizeof what, "%s: param after step 1", name[mode]);
        EXPECT_REL(5, got[0], ADAM_P1, 1e-6, what);
        snprintf(what, sizeof what, "%s: param after step 2", name[mode]);
        EXPECT_REL(5, got[1], ADAM_P2, 1e-6, what);
        snprintf(what, sizeof what, "%s: m after step 2", name[mode]);
        EXPECT_REL(5, got[2], ADAM_M2, 1e-6, what);
        snprintf(what, sizeof what, "%s: v after step 2", name[mode]);
        EXPECT_REL(5, got[3], ADAM_V2, 1e-6, what);
        for (int i = 0; i < 5; i++)
            EXPECT(fabs(got[1][i] - ADAM_P2[i]) <= 1e-6 * fabs(ADAM_P2[i]) + 1e-9,
                   "%s: param[%d] %.9g, torch %.9g", name[mode], i, got[1][i], ADAM_P2[i]);
        if (master)
            EXPECT(memcmp(master, w, 5 * 4) == 0, "adamw: param must equal the fp32 master");
        backend_dealloc(be, w), backend_dealloc(be, gr), backend_dealloc(be, m);
        backend_dealloc(be, v), backend_dealloc(be, master);
    }
}

// ---- elementwise and reductions ----------------------------------------------------------

static void test_elementwise(void) {
    size_t n = 10007;
    struct buf x = buf_rand(n, 3), y = buf_rand(n, 1), o = buf_nan(n);
    backend_add(be, tf(o), tf(x), tf(y), n);
    backend_add(be, td(o), td(x), td(y), n);
    expect_close(o, TOL, "add fp32 vs fp64");
    backend_add(be, td(y), td(y), td(x), n); // out aliases a
    EXPECT_REL(n, y.d, o.d, 0, "add with out aliasing a");
    // sum_squares accumulates in double: on float inputs it is exact up to double rounding
    double ref = 0;
    for (size_t i = 0; i < n; i++) ref += x.d[i] * x.d[i];
    double s32 = backend_sum_squares(be, tf(x), n), s64 = backend_sum_squares(be, td(x), n);
    EXPECT(fabs(s32 - ref) <= 1e-13 * ref, "sum_squares fp32 %.17g, double loop %.17g", s32, ref);
    EXPECT(fabs(s64 - ref) <= 1e-13 * ref, "sum_squares fp64 %.17g, double loop %.17g", s64, ref);
    // sum_into: acc += sum x in double, in index order (fp32 and fp64 x)
    double lin = 0, acc = 0.25;
    for (size_t i = 0; i < n; i++) lin += x.d[i];
    backend_sum_into(be, tensor_view(&acc, DTYPE_FP64, 1), td(x), n);
    EXPECT(acc == 0.25 + lin, "sum_into fp64 %.17g, double loop %.17g", acc, 0.25 + lin);
    backend_sum_into(be, tensor_view(&acc, DTYPE_FP64, 1), tf(x), n);
    EXPECT(fabs(acc - (0.25 + 2 * lin)) <= 1e-6 * (0.25 + 2 * fabs(lin)), "sum_into fp32 %.17g, double loop %.17g",
           acc, 0.25 + 2 * lin);
    float big[3] = {1e30f, 1e30f, 3};
    double sb = backend_sum_squares(be, tensor_view(big, DTYPE_FP32, 3), 3);
    EXPECT(fabs(sb - 2e60) <= 1e-6 * 2e60, "sum_squares of fp32 1e30 overflows no float: %g", sb);
    // copy: fp64 -> fp32 rounds, fp32 -> fp64 is exact, same dtype is a copy
    struct buf c = buf_nan(n);
    for (size_t i = 0; i < n; i++) o.d[i] = rnd() / 3;
    backend_copy(be, tf(c), td(o), n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= c.f[i] == (float)o.d[i];
    EXPECT(ok, "copy fp64 -> fp32 rounds to nearest");
    backend_copy(be, td(c), tf(c), n);
    for (size_t i = 0; i < n; i++) ok &= c.d[i] == (double)c.f[i];
    EXPECT(ok, "copy fp32 -> fp64 exact");
    buf_poison(y);
    backend_copy(be, td(y), td(c), n);
    EXPECT(memcmp(y.d, c.d, n * 8) == 0, "copy fp64 -> fp64");
    buf_free(x), buf_free(y), buf_free(o), buf_free(c);
}

// ---- no heap allocation after a first pass; unsupported dtypes; BLAS build ------------

#ifdef COUNT_HEAP
// Runs every op once in FP32 and FP64 on buffers allocated beforehand.
static void run_every_op(struct att *a, struct buf *b) {
    // b: [0] x (64*96) [1] w (96) [2] y [3] rstd (64) [4] dx [5] dw [6] cos [7] sin
    //    [8] logits (64*96) [9] rm [10] part (3*64) [11] loss [12] lse [13] m [14] v [15] wt (96*96)
    int N = 64, C = 96, D = 16;
    int32_t tok[64];
    for (int i = 0; i < N; i++) tok[i] = i % 9 == 0 ? IGN : i;
    for (int p = 0; p < 2; p++) {
        struct tensor (*t)(struct buf) = p ? td : tf;
        backend_matmul(be, t(b[2]), t(b[0]), t(b[15]), N, C, C, false, true, 1, 0);
        backend_embedding_forward(be, t(b[2]), t(b[0]), ti(tok, N), N, C, 0, N);
        backend_embedding_backward(be, t(b[4]), t(b[2]), ti(tok, N), N, C, 0, N);
        backend_rmsnorm_forward(be, t(b[2]), t(b[3]), t(b[0]), t(b[1]), N, C, 1e-5f);
        backend_rmsnorm_backward(be, t(b[4]), t(b[5]), t(b[2]), t(b[0]), t(b[1]), t(b[3]), N, C);
        backend_rope_forward(be, t(a->q), t(b[6]), t(b[7]), a->B, a->T, a->H, D, 0);
        backend_rope_backward(be, t(a->q), t(b[6]), t(b[7]), a->B, a->T, a->H, D, 0);
        att_run(a, p);
        backend_swiglu_forward(be, t(b[2]), t(b[0]), t(b[4]), (size_t)N * C);
        backend_swiglu_backward(be, t(b[2]), t(b[4]), t(b[0]), t(b[0]), t(b[4]), (size_t)N * C);
        backend_ce_row_max(be, t(b[9]), t(b[8]), N, C, C - 5);
        backend_ce_partials(be, t(b[10]), t(b[8]), t(b[9]), ti(tok, N), N, C, C - 5, 0);
        backend_ce_loss(be, t(b[11]), t(b[12]), t(b[10]), t(b[9]), ti(tok, N), N, C - 5, 0.1f, IGN);
        backend_ce_backward(be, t(b[2]), t(b[8]), t(b[12]), ti(tok, N), N, C, C - 5, 0, C - 5,
                            0.1f, IGN, 1.0f / N);
        backend_adamw(be, t(b[15]), tensor_view(NULL, DTYPE_FP32, 0), t(b[15]), t(b[13]), t(b[14]),
                      (size_t)C * C, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1);
        backend_sum_squares(be, t(b[0]), (size_t)N * C);
        backend_add(be, t(b[4]), t(b[4]), t(b[0]), (size_t)N * C);
        backend_copy(be, tf(b[2]), td(b[2]), (size_t)N * C);
    }
}

static void test_no_heap_after_first_pass(void) {
    size_t sizes[16] = {64 * 96, 96, 64 * 96, 64, 64 * 96, 96, 1024 * 8, 1024 * 8,
                        64 * 96, 64, 3 * 64, 64, 64, 96 * 96, 96 * 96, 96 * 96};
    struct buf b[16];
    for (int i = 0; i < 16; i++) b[i] = buf_rand(sizes[i], 0.5);
    rope_table_fill(b[6].f, b[7].f, 1024, 16, 10000.0);
    rope_table_fill_f64(b[6].d, b[7].d, 1024, 16, 10000.0);
    for (size_t i = 0; i < b[14].n; i++) b[14].f[i] = b[14].d[i] = fabs(b[14].d[i]); // v >= 0
    struct att a = att_make(2, 200, 4, 2, 16);
    run_every_op(&a, b); // the first pass may grow scratch and start threads
    heap_calls = heap_frees = 0;
    heap_counting = 1;
    run_every_op(&a, b);
    heap_counting = 0;
    if (omp_get_max_threads() > 1)
        EXPECT(heap_calls == 0, "second pass over every op made %ld heap allocations", heap_calls);
    else // libgomp allocates and frees the team of a one-thread region each time
        EXPECT(heap_calls == heap_frees, "second pass over every op (1 thread) made %ld heap "
               "allocations and %ld frees", heap_calls, heap_frees);
    // OpenBLAS's threaded GEMM mallocs a job table per call: a GEMM that
    // allocates nothing inside a parallel region therefore ran single-threaded,
    // as the attention kernels need. The control outside the region shows the
    // counter sees OpenBLAS's threaded path at all.
    int n = 256;
    float *A = calloc((size_t)n * n, 4), *Bm = calloc((size_t)n * n, 4), *Cm = calloc((size_t)n * n, 4);
    if (omp_get_max_threads() > 1) {
        heap_calls = 0, heap_counting = 1;
#pragma omp parallel
#pragma omp single
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, A, n, Bm, n, 0, Cm, n);
        heap_counting = 0;
        EXPECT(heap_calls == 0, "sgemm inside an OpenMP region made %ld heap allocations",
               heap_calls);
        heap_calls = 0, heap_counting = 1;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, A, n, Bm, n, 0, Cm, n);
        heap_counting = 0;
        EXPECT(heap_calls > 0, "control: threaded OpenBLAS sgemm made no heap allocation; the "
                               "check above proves nothing");
    }
    free(A), free(Bm), free(Cm);
    att_free(&a);
    for (int i = 0; i < 16; i++) buf_free(b[i]);
}
#else
static void test_no_heap_after_first_pass(void) {} // AddressSanitizer owns malloc
#endif

// An I32 tensor reaches a float kernel: the child exits 1 with a message
// naming it (BF16 and FP16 are supported: tests/unit/test_ops_lowp.c).
static void test_unsupported_dtype(void) {
    int fd[2];
    EXPECT(pipe(fd) == 0, "pipe");
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        int32_t h[4] = {0};
        struct tensor t = tensor_view(h, DTYPE_I32, 4);
        backend_swiglu_forward(be, t, t, t, 4);
        _exit(0);
    }
    close(fd[1]);
    char msg[1024] = {0};
    size_t got = 0;
    ssize_t r;
    while (got < sizeof msg - 1 && (r = read(fd[0], msg + got, sizeof msg - 1 - got)) > 0) got += r;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 1, "i32 swiglu: status %d", status);
    EXPECT(strstr(msg, "swiglu_forward: dtype i32 not supported by cpu backend"),
           "i32 swiglu message: %s", msg);
}

int main(void) {
    be = backend_cpu_init(0);
    // 2 = OpenBLAS built for OpenMP: inside the attention kernels' parallel
    // regions it runs single-threaded instead of oversubscribing the cores.
    EXPECT(openblas_get_parallel() == 2, "OpenBLAS threading model %d, expected 2 (OpenMP)",
           openblas_get_parallel());
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_matmul(ta, tb, 33, 20, 17);
            test_matmul(ta, tb, 150, 70, 40);
            test_matmul(ta, tb, 40, 150, 70);
        }
    test_embedding();
    test_rmsnorm();
    test_rope();
    test_rope_scaling_reference();
    test_rope_qkv();
    test_swiglu();
    test_attention();
    test_cross_entropy();
    test_adamw();
    test_elementwise();
    test_no_heap_after_first_pass();
    test_unsupported_dtype();
    backend_free(be);
    return test_finish("test_ops_cpu");
}

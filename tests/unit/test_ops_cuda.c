// test_ops_cuda.c: every op of the CUDA backend against the CPU backend (the
// reference, itself checked against FP64 and naive loops in test_ops_cpu.c),
// for FP32 storage (relative error <= 1e-5), BF16 storage (<= 1e-2 on BF16
// outputs) and FP16 storage (<= 1e-3 on FP16 outputs); FP32 statistics and
// FP32 outputs of 16-bit inputs <= 1e-5. The CPU side holds FP32 copies, so
// a 16-bit output differs from it by (about) the device's one rounding of
// each element: at most u = 2^-8 ~ 3.9e-3 (BF16) or 2^-11 ~ 4.9e-4 (FP16)
// relative; the bounds are 2.6 u and 2 u (measured, emulated: BF16 <= 2.5e-3,
// FP16 <= 2.6e-4). Inputs are fresh random values rounded to the storage
// dtype, so both backends see the same numbers; the CPU computes in FP32 from
// them. Device outputs are NaN-poisoned before each call (an unwritten
// element fails), "+=" outputs start from random values. Copies between
// FP32, BF16 and FP16 are checked bit for bit against host round-to-nearest-
// even (kernels/cpu/half.h for FP16), on random values and on the edges
// (ties, subnormals, overflow, inf, NaN, -0), and sum_squares against a host
// FP64 sum.
//
// Attention runs on the native kernels unless TEST_OPS_ATTENTION says
// otherwise: =cudnn (tests/gpu/run.sh) runs only the attention tests, BF16 and
// FP16, through cuDNN's fused attention (demanded: a fallback fails), each
// against the CPU backend and against the native kernel on the same inputs,
// at cuDNN's tolerances (its P and dS are rounded to the I/O dtype before the
// second GEMMs: BF16 3e-2, FP16 5e-3; lse 1e-4), and ring-attention blocks
// without documents (attention_block_forward / _backward, one cuDNN call per
// chunk pair; the path must be cuDNN) against the CPU. test_attention_choice checks
// the selection (system.attention): native never, fp32 never, auto exactly
// when cudnn mode succeeds, cudnn otherwise an error naming the key, the
// shape and cuDNN's status, the CPU backend refusing cudnn; with
// TEST_OPS_CUDNN_ABSENT=1 (the emulation, whose cuDNN has no engines) auto
// must fall back and a BF16 attention in auto mode must still match the CPU,
// as must BF16 ring-attention blocks (their positions read back, cuDNN
// declining the chunk pairs; the log names why). The block ops run against
// the CPU's at cp 2 and 4 (test_attention_block).
//
// FP8 (test_fp8, after the dtype runs; TEST_OPS_FP8_ONLY=1 runs only it):
// fp8_cast, fp8_amax and fp8_update_scale bit for bit against the CPU
// backend, matmul_fp8 within FP32 summation order, backend_check_fp8
// (TRIDENT_EMU_CC=8.0: the emulated device is refused, naming it); skipped
// with a line on a device below compute capability 8.9.
//
// The mixture-of-experts ops (test_moe_ops, in each dtype run): routing and
// its backward (FP32) within 1e-5 and the same choices, the dispatch plan
// (counts, dest, src) equal, permute / combine and their backward within the
// dtype's tolerance (combine_backward's FP32 weight gradient of 16-bit rows:
// 1e-4); tests/unit/test_moe.c runs the whole layer on both backends.
//
// Built always: in a build without the CUDA backend it checks that the
// run-time selection refuses device = cuda with the documented message, then
// skips (exit 77); with the backend but no device it skips too.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/common.h"
#include "kernels/backend.h"
#include "kernels/cpu/half.h"
#ifdef TRIDENT_CUDA
#include "kernels/cuda/backend_cuda.h" // backend_cuda_attention_check_graph
#endif
#ifdef TRIDENT_CUDA_EMU
#include <cuda_runtime_api.h> // emu_stat: which path matmul_fp8 took
#endif
#include "kernels/ops.h"
#include "test.h"

static struct backend *cpu, *gpu;
enum { MOE_TEST_MAX_E = 8 }; // test_moe_ops's experts
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double rnd(void) { // uniform in [-1, 1)
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2 - 1;
}

// ---- BF16 and FP16 on the host: round to nearest even, as __float2bfloat16_rn
// and __float2half_rn (FP16: kernels/cpu/half.h) --------------------------------

static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; // NaN
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float round_to(enum dtype dt, float f) {
    return dt == DTYPE_BF16 ? bf2f(f2bf(f)) : dt == DTYPE_FP16 ? fp16_to_f32(fp16_from_f32(f)) : f;
}

// ---- a tensor on both backends -------------------------------------------------

// h: the host values (what both see); c: CPU FP32 copy; g: GPU copy of dtype dt.
struct pair {
    float *h;
    struct tensor c, g;
    size_t n;
    enum dtype dt;
};

static void upload(struct tensor g, const float *h, size_t n) {
    void *tmp = xmalloc(n * dtype_size(g.dtype) + 1);
    if (g.dtype == DTYPE_BF16)
        for (size_t i = 0; i < n; i++) ((uint16_t *)tmp)[i] = f2bf(h[i]);
    else if (g.dtype == DTYPE_FP16)
        for (size_t i = 0; i < n; i++) ((uint16_t *)tmp)[i] = fp16_from_f32(h[i]);
    else memcpy(tmp, h, n * 4);
    backend_to_device(gpu, g.data, tmp, n * dtype_size(g.dtype));
    backend_synchronize(gpu);
    free(tmp);
}

static void download(float *h, struct tensor g, size_t n) {
    void *tmp = xmalloc(n * dtype_size(g.dtype) + 1);
    backend_to_host(gpu, tmp, g.data, n * dtype_size(g.dtype));
    backend_synchronize(gpu);
    if (g.dtype == DTYPE_BF16)
        for (size_t i = 0; i < n; i++) h[i] = bf2f(((uint16_t *)tmp)[i]);
    else if (g.dtype == DTYPE_FP16)
        for (size_t i = 0; i < n; i++) h[i] = fp16_to_f32(((uint16_t *)tmp)[i]);
    else memcpy(h, tmp, n * 4);
    free(tmp);
}

static struct pair pair_alloc(size_t n, enum dtype dt) {
    struct pair p = {xmalloc(n * 4 + 4), {0}, {0}, n, dt};
    p.c = tensor_view(backend_alloc(cpu, n * 4 + 4), DTYPE_FP32, n);
    p.g = tensor_view(backend_alloc(gpu, n * dtype_size(dt) + 4), dt, n);
    EXPECT(p.c.data && p.g.data, "allocation of %zu elements", n);
    return p;
}
// Both copies := h.
static void pair_sync(struct pair p) {
    memcpy(p.c.data, p.h, p.n * 4);
    upload(p.g, p.h, p.n);
}
static struct pair pair_rand(size_t n, double scale, enum dtype dt) {
    struct pair p = pair_alloc(n, dt);
    for (size_t i = 0; i < n; i++) p.h[i] = round_to(dt, (float)(scale * rnd()));
    pair_sync(p);
    return p;
}
static struct pair pair_nan(size_t n, enum dtype dt) {
    struct pair p = pair_alloc(n, dt);
    for (size_t i = 0; i < n; i++) p.h[i] = NAN;
    pair_sync(p);
    return p;
}
static void pair_free(struct pair p) {
    free(p.h);
    backend_dealloc(cpu, p.c.data);
    backend_dealloc(gpu, p.g.data);
}

// Device integers (tokens, targets), the same on both sides.
struct ipair { struct tensor c, g; };
static struct ipair ipair_make(const int32_t *v, size_t n) {
    struct ipair p;
    p.c = tensor_view(backend_alloc(cpu, n * 4 + 4), DTYPE_I32, n);
    p.g = tensor_view(backend_alloc(gpu, n * 4 + 4), DTYPE_I32, n);
    memcpy(p.c.data, v, n * 4);
    backend_to_device(gpu, p.g.data, v, n * 4);
    backend_synchronize(gpu);
    return p;
}
static void ipair_free(struct ipair p) {
    backend_dealloc(cpu, p.c.data);
    backend_dealloc(gpu, p.g.data);
}

static double tol_of(enum dtype dt) {
    return dt == DTYPE_BF16 ? 1e-2 : dt == DTYPE_FP16 ? 1e-3 : 1e-5;
}

// The GPU's attention mode in test_attention (TEST_OPS_ATTENTION).
static enum backend_attention attn_mode = BACKEND_ATTENTION_NATIVE;
static double tol_attn(enum dtype dt) {
    if (attn_mode == BACKEND_ATTENTION_NATIVE) return tol_of(dt);
    return dt == DTYPE_BF16 ? 3e-2 : dt == DTYPE_FP16 ? 5e-3 : 1e-4;
}

// GPU result of p against the CPU result, within the tolerance of p's dtype;
// every element written (a NaN fails).
static void expect_match_tol(struct pair p, double tol, const char *what) {
    float *got = xmalloc(p.n * 4 + 4);
    download(got, p.g, p.n);
    size_t nan = 0;
    for (size_t i = 0; i < p.n; i++) nan += isnan(got[i]);
    char msg[160];
    snprintf(msg, sizeof msg, "%s (%s)", what, dtype_name(p.dt));
    EXPECT(nan == 0, "%s: %zu of %zu elements NaN / unwritten", msg, nan, p.n);
    const float *ref = p.c.data;
    EXPECT_REL(p.n, got, ref, tol, msg);
    free(got);
}
static void expect_match(struct pair p, const char *what) { expect_match_tol(p, tol_of(p.dt), what); }

// The GPU copies of a and b (two device results of the same op) agree.
static void expect_same_gpu(struct pair a, struct pair b, double tol, const char *what) {
    float *ga = xmalloc(a.n * 4 + 4), *gb = xmalloc(b.n * 4 + 4);
    download(ga, a.g, a.n), download(gb, b.g, b.n);
    EXPECT_REL(a.n, ga, gb, tol, what);
    free(ga), free(gb);
}

// ---- tests, each for storage dtype dt ----------------------------------------------

static void test_matmul(enum dtype dt, enum dtype out_dt, bool ta, bool tb, int M, int N, int K) {
    struct pair a = pair_rand((size_t)M * K, 1, dt), b = pair_rand((size_t)K * N, 1, dt);
    char what[128];
    for (int acc = 0; acc < 2; acc++) {
        struct pair out = acc ? pair_rand((size_t)M * N, 1, out_dt) : pair_nan((size_t)M * N, out_dt);
        float beta = acc ? 0.75f : 0;
        backend_matmul(cpu, out.c, a.c, b.c, M, N, K, ta, tb, 0.5f, beta);
        backend_matmul(gpu, out.g, a.g, b.g, M, N, K, ta, tb, 0.5f, beta);
        snprintf(what, sizeof what, "matmul %dx%dx%d ta=%d tb=%d beta=%g %s->%s", M, N, K, ta, tb,
                 beta, dtype_name(dt), dtype_name(out_dt));
        expect_match(out, what);
        pair_free(out);
    }
    pair_free(a), pair_free(b);
}

static void test_embedding(enum dtype dt) {
    int N = 9, C = 300, Vl = 6, vs = 12; // tokens outside [12, 18) belong to other shards
    int32_t tok[] = {12, 17, 3, 14, 18, 14, 12, 12, 30};
    struct ipair t = ipair_make(tok, N);
    struct pair wte = pair_rand((size_t)Vl * C, 1, dt), out = pair_nan((size_t)N * C, dt);
    backend_embedding_forward(cpu, out.c, wte.c, t.c, N, C, vs, Vl);
    backend_embedding_forward(gpu, out.g, wte.g, t.g, N, C, vs, Vl);
    expect_match(out, "embedding_forward");
    // dwte += in FP32 (atomic kernel) and in the storage dtype (column kernel for 16 bits)
    for (int k = 0; k < 2; k++) {
        enum dtype gdt = k ? dt : DTYPE_FP32;
        struct pair dwte = pair_rand((size_t)Vl * C, 1, gdt), dout = pair_rand((size_t)N * C, 1, dt);
        backend_embedding_backward(cpu, dwte.c, dout.c, t.c, N, C, vs, Vl);
        backend_embedding_backward(gpu, dwte.g, dout.g, t.g, N, C, vs, Vl);
        expect_match(dwte, "embedding_backward dwte");
        pair_free(dwte), pair_free(dout);
    }
    pair_free(wte), pair_free(out), ipair_free(t);
}

// N = 37: a row a block of the one-launch backward; N = 700 > its 256
// blocks, with C = 48 (16-byte vectors) and C = 300 (not a multiple of 8).
static void test_rmsnorm_shape(enum dtype dt, int N, int C) {
    struct pair x = pair_rand((size_t)N * C, 2, dt), w = pair_rand(C, 1, dt);
    struct pair y = pair_nan((size_t)N * C, dt), rstd = pair_nan(N, DTYPE_FP32);
    backend_rmsnorm_forward(cpu, y.c, rstd.c, x.c, w.c, N, C, 1e-5f);
    backend_rmsnorm_forward(gpu, y.g, rstd.g, x.g, w.g, N, C, 1e-5f);
    expect_match(y, "rmsnorm_forward y");
    expect_match(rstd, "rmsnorm_forward rstd");
    // backward from the CPU's rstd on both sides; dx += in dt, dw += in FP32
    struct pair dy = pair_rand((size_t)N * C, 1, dt), dx = pair_rand((size_t)N * C, 1, dt);
    struct pair dw = pair_rand(C, 1, DTYPE_FP32);
    memcpy(rstd.h, rstd.c.data, N * 4);
    pair_sync(rstd);
    backend_rmsnorm_backward(cpu, dx.c, dw.c, dy.c, x.c, w.c, rstd.c, N, C);
    backend_rmsnorm_backward(gpu, dx.g, dw.g, dy.g, x.g, w.g, rstd.g, N, C);
    expect_match(dx, "rmsnorm_backward dx");
    expect_match(dw, "rmsnorm_backward dw");
    pair_free(x), pair_free(w), pair_free(y), pair_free(rstd), pair_free(dy), pair_free(dx),
        pair_free(dw);
}

// add_rmsnorm_forward against the CPU's add then rmsnorm_forward; alias:
// xout is a's buffer (the model's x[i+1] = xmid + ... writes a fresh one,
// but aliasing is allowed).
static void test_add_rmsnorm_shape(enum dtype dt, int N, int C, bool alias) {
    size_t nc = (size_t)N * C;
    struct pair a = pair_rand(nc, 2, dt), b = pair_rand(nc, 2, dt), w = pair_rand(C, 1, dt);
    struct pair xo = pair_nan(nc, dt), y = pair_nan(nc, dt), rstd = pair_nan(N, DTYPE_FP32);
    struct pair out = alias ? a : xo;
    backend_add_rmsnorm_forward(cpu, out.c, y.c, rstd.c, a.c, b.c, w.c, N, C, 1e-5f);
    backend_add_rmsnorm_forward(gpu, out.g, y.g, rstd.g, a.g, b.g, w.g, N, C, 1e-5f);
    char what[96];
    snprintf(what, sizeof what, "add_rmsnorm_forward N=%d C=%d%s", N, C, alias ? " in place" : "");
    expect_match(out, what);
    expect_match(y, what);
    expect_match_tol(rstd, dt == DTYPE_FP32 ? 1e-5 : tol_of(dt), what);
    pair_free(a), pair_free(b), pair_free(w), pair_free(xo), pair_free(y), pair_free(rstd);
}

static void test_rmsnorm(enum dtype dt) {
    // the fused forward: scalar rows, 16-byte rows, rows wider than the
    // scalar path's 1024 (the add-then-norm fallback), in place
    test_add_rmsnorm_shape(dt, 37, 300, false);
    test_add_rmsnorm_shape(dt, 700, 48, false);
    test_add_rmsnorm_shape(dt, 5, 2048, false);
    test_add_rmsnorm_shape(dt, 3, 1500, false);
    test_add_rmsnorm_shape(dt, 9, 64, true);
    test_rmsnorm_shape(dt, 37, 300);
    test_rmsnorm_shape(dt, 700, 48);
    test_rmsnorm_shape(dt, 700, 300);
    // qk_norm's per-head rows (N H, D) of a small head size: scalar (12) and
    // 16-byte (16) rows
    test_rmsnorm_shape(dt, 148, 12);
    test_rmsnorm_shape(dt, 300, 16);
}

static void test_rope(enum dtype dt) {
    int B = 2, T = 9, Hx = 3, D = 16, pos = 5, Tmax = pos + T, half = D / 2;
    struct pair cs = pair_alloc((size_t)Tmax * half, DTYPE_FP32), sn = pair_alloc((size_t)Tmax * half, DTYPE_FP32);
    rope_table_fill(cs.h, sn.h, Tmax, D, 10000.0);
    pair_sync(cs), pair_sync(sn);
    for (int inverse = 0; inverse < 2; inverse++) {
        struct pair x = pair_rand((size_t)B * T * Hx * D, 1, dt);
        if (inverse) {
            backend_rope_backward(cpu, x.c, cs.c, sn.c, B, T, Hx, D, pos);
            backend_rope_backward(gpu, x.g, cs.g, sn.g, B, T, Hx, D, pos);
        } else {
            backend_rope_forward(cpu, x.c, cs.c, sn.c, B, T, Hx, D, pos);
            backend_rope_forward(gpu, x.g, cs.g, sn.g, B, T, Hx, D, pos);
        }
        expect_match(x, inverse ? "rope_backward" : "rope_forward");
        pair_free(x);
    }
    pair_free(cs), pair_free(sn);
}

// rope_qkv split and join against the CPU, with and without document
// starts; D = 16 moves 16-byte vectors (BF16/FP16: 8 of the 8 pairs of a
// head, FP32 4), D = 12 single elements for 16-bit dtypes.
static void test_rope_qkv_shape(enum dtype dt, int B, int T, int H, int Hkv, int D) {
    int W = (H + 2 * Hkv) * D;
    size_t N = (size_t)B * T, nq = N * H * D, nk = N * Hkv * D, nt = (size_t)T * D / 2;
    struct pair cs = pair_alloc(nt, DTYPE_FP32), sn = pair_alloc(nt, DTYPE_FP32);
    rope_table_fill(cs.h, sn.h, T, D, 10000.0);
    pair_sync(cs), pair_sync(sn);
    int32_t *ds = xmalloc(N * sizeof *ds);
    for (size_t i = 0; i < N; i++) ds[i] = (int)(i % T) < T / 3 ? 0 : T / 3;
    struct ipair dsp = ipair_make(ds, N);
    for (int docs = 0; docs < 2; docs++) {
        struct tensor dc = docs ? dsp.c : tensor_view(NULL, DTYPE_I32, 0);
        struct tensor dg = docs ? dsp.g : tensor_view(NULL, DTYPE_I32, 0);
        char what[96];
        snprintf(what, sizeof what, "rope_qkv_split H=%d Hkv=%d D=%d%s", H, Hkv, D, docs ? " docs" : "");
        struct pair qkv = pair_rand(N * W, 1, dt);
        struct pair q = pair_nan(nq, dt), k = pair_nan(nk, dt), v = pair_nan(nk, dt);
        backend_rope_qkv_split(cpu, q.c, k.c, v.c, qkv.c, cs.c, sn.c, dc, B, T, H, Hkv, D);
        backend_rope_qkv_split(gpu, q.g, k.g, v.g, qkv.g, cs.g, sn.g, dg, B, T, H, Hkv, D);
        expect_match(q, what), expect_match(k, what), expect_match(v, what);
        snprintf(what, sizeof what, "rope_qkv_join H=%d Hkv=%d D=%d%s", H, Hkv, D, docs ? " docs" : "");
        struct pair dqkv = pair_nan(N * W, dt);
        backend_rope_qkv_join(cpu, dqkv.c, q.c, k.c, v.c, cs.c, sn.c, dc, B, T, H, Hkv, D);
        backend_rope_qkv_join(gpu, dqkv.g, q.g, k.g, v.g, cs.g, sn.g, dg, B, T, H, Hkv, D);
        expect_match(dqkv, what);
        pair_free(qkv), pair_free(q), pair_free(k), pair_free(v), pair_free(dqkv);
    }
    free(ds), ipair_free(dsp), pair_free(cs), pair_free(sn);
}

static void test_rope_qkv(enum dtype dt) {
    test_rope_qkv_shape(dt, 2, 9, 4, 2, 16);
    test_rope_qkv_shape(dt, 1, 7, 3, 1, 12);
}

// n = 1000: 16-byte vectors; n = 1003: element by element.
static void test_swiglu_n(enum dtype dt, size_t n) {
    struct pair g = pair_rand(n, 4, dt), u = pair_rand(n, 2, dt), out = pair_nan(n, dt);
    backend_swiglu_forward(cpu, out.c, g.c, u.c, n);
    backend_swiglu_forward(gpu, out.g, g.g, u.g, n);
    expect_match(out, "swiglu_forward");
    struct pair d = pair_rand(n, 1, dt), dg = pair_nan(n, dt), du = pair_nan(n, dt);
    backend_swiglu_backward(cpu, dg.c, du.c, d.c, g.c, u.c, n);
    backend_swiglu_backward(gpu, dg.g, du.g, d.g, g.g, u.g, n);
    expect_match(dg, "swiglu_backward dgate");
    expect_match(du, "swiglu_backward dup");
    pair_free(g), pair_free(u), pair_free(out), pair_free(d), pair_free(dg), pair_free(du);
}

static void test_swiglu(enum dtype dt) {
    test_swiglu_n(dt, 1000);
    test_swiglu_n(dt, 1003);
}

// Head sizes cover each tile bucket of the CUDA kernels (32, 64, 128, 256)
// full (64, 128, 256) and with zero padding (24, 80); H = Hkv and GQA; T below
// one tile, many tiles and a partial last tile. q is uniform in [-qs, qs):
// qs = 12 gives scores of a few units (peaked rows, a running max that moves
// between key tiles). TEST_VERBOSE prints the time.
static void test_attention_qs(enum dtype dt, double qs, int B, int T, int H, int Hkv, int D) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (attn_mode == BACKEND_ATTENTION_CUDNN && dt != DTYPE_FP32) { // report a shape cuDNN refuses, go on
        struct error e = {0};
        bool f = false, b = false;
        EXPECT(!backend_set_attention(gpu, attn_mode, &e), "backend_set_attention(cudnn): %s", e.msg);
        if (!e.status) backend_attention_uses_cudnn(gpu, dt, B, T, H, Hkv, D, false, &f, &e);
        if (!e.status) backend_attention_uses_cudnn(gpu, dt, B, T, H, Hkv, D, true, &b, &e);
        EXPECT(f && b && !e.status, "cuDNN attention: %s", e.msg);
        if (!f || !b) return;
    }
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * H * T;
    struct pair q = pair_rand(nq, qs, dt), k = pair_rand(nk, 1, dt), v = pair_rand(nk, 1, dt);
    struct pair out = pair_nan(nq, dt), lse = pair_nan(nl, DTYPE_FP32);
    char what[128];
    snprintf(what, sizeof what, "attention B=%d T=%d H=%d Hkv=%d D=%d q*%g", B, T, H, Hkv, D, qs);
    backend_attention_forward(cpu, out.c, lse.c, q.c, k.c, v.c, B, T, H, Hkv, D);
    struct error err = {0};
    EXPECT(!backend_set_attention(gpu, attn_mode, &err), "%s: backend_set_attention: %s", what, err.msg);
    backend_attention_forward(gpu, out.g, lse.g, q.g, k.g, v.g, B, T, H, Hkv, D);
    char w2[160];
    snprintf(w2, sizeof w2, "%s forward out", what), expect_match_tol(out, tol_attn(dt), w2);
    snprintf(w2, sizeof w2, "%s forward lse", what), expect_match_tol(lse, tol_attn(DTYPE_FP32), w2);
    bool cmp_native = attn_mode == BACKEND_ATTENTION_CUDNN && dt != DTYPE_FP32;
    if (cmp_native) { // cuDNN against the native kernel, same inputs
        struct pair out2 = pair_nan(nq, dt), lse2 = pair_nan(nl, DTYPE_FP32);
        backend_set_attention(gpu, BACKEND_ATTENTION_NATIVE, &err);
        backend_attention_forward(gpu, out2.g, lse2.g, q.g, k.g, v.g, B, T, H, Hkv, D);
        backend_set_attention(gpu, attn_mode, &err);
        snprintf(w2, sizeof w2, "%s forward out, cudnn vs native (%s)", what, dtype_name(dt));
        expect_same_gpu(out, out2, tol_attn(dt), w2);
        snprintf(w2, sizeof w2, "%s forward lse, cudnn vs native (%s)", what, dtype_name(dt));
        expect_same_gpu(lse, lse2, tol_attn(DTYPE_FP32), w2);
        pair_free(out2), pair_free(lse2);
    }
    // backward from the CPU's out and lse (rounded to dt) on both sides
    for (size_t i = 0; i < nq; i++) out.h[i] = round_to(dt, ((float *)out.c.data)[i]);
    memcpy(lse.h, lse.c.data, nl * 4);
    pair_sync(out), pair_sync(lse);
    struct pair dout = pair_rand(nq, 1, dt), dq = pair_nan(nq, dt);
    struct pair dk = pair_nan(nk, dt), dv = pair_nan(nk, dt);
    backend_attention_backward(cpu, dq.c, dk.c, dv.c, dout.c, q.c, k.c, v.c, out.c, lse.c, B, T, H, Hkv, D);
    backend_attention_backward(gpu, dq.g, dk.g, dv.g, dout.g, q.g, k.g, v.g, out.g, lse.g, B, T, H, Hkv, D);
    snprintf(w2, sizeof w2, "%s backward dq", what), expect_match_tol(dq, tol_attn(dt), w2);
    snprintf(w2, sizeof w2, "%s backward dk", what), expect_match_tol(dk, tol_attn(dt), w2);
    snprintf(w2, sizeof w2, "%s backward dv", what), expect_match_tol(dv, tol_attn(dt), w2);
    if (cmp_native) {
        struct pair d2[3] = {pair_nan(nq, dt), pair_nan(nk, dt), pair_nan(nk, dt)}, d1[3] = {dq, dk, dv};
        backend_set_attention(gpu, BACKEND_ATTENTION_NATIVE, &err);
        backend_attention_backward(gpu, d2[0].g, d2[1].g, d2[2].g, dout.g, q.g, k.g, v.g, out.g, lse.g, B, T, H,
                                   Hkv, D);
        backend_set_attention(gpu, attn_mode, &err);
        for (int i = 0; i < 3; i++) {
            snprintf(w2, sizeof w2, "%s backward d%c, cudnn vs native (%s)", what, "qkv"[i], dtype_name(dt));
            expect_same_gpu(d1[i], d2[i], tol_attn(dt), w2);
            pair_free(d2[i]);
        }
    }
    pair_free(q), pair_free(k), pair_free(v), pair_free(out), pair_free(lse), pair_free(dout),
        pair_free(dq), pair_free(dk), pair_free(dv);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (getenv("TEST_VERBOSE"))
        printf("  %s (%s): %.2f s\n", what, dtype_name(dt),
               (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
}
static void test_attention(enum dtype dt, int B, int T, int H, int Hkv, int D) {
    test_attention_qs(dt, 1, B, T, H, Hkv, D);
}

// Packed documents ([data] packing = concat_reset): doc_start (B, T) from
// tokens by doc_start_fill, the same I32 array on both backends. Row 0: an
// end-of-text at t = 0 and 1 (one-token documents), then every ~12 tokens at
// random; row 1: none (plain causal through the document path); row 2: one
// at T - 41 (a long document across many key tiles, then one of 40 tokens).
// RoPE at positions t - doc_start, attention forward and backward (the
// backward from the CPU's out and lse), CUDA against the CPU backend. Under
// attention = cudnn these shapes run the native kernels (the cuDNN path
// declines document masks).
static void test_docs(enum dtype dt, int B, int T, int H, int Hkv, int D) {
    size_t bt = (size_t)B * T, nq = bt * H * D, nk = bt * Hkv * D, nl = (size_t)B * H * T;
    int32_t *tok = xmalloc(bt * sizeof *tok), *ds = xmalloc(bt * sizeof *ds);
    for (size_t i = 0; i < bt; i++) tok[i] = 1;
    for (int t = 0; t < T; t++) tok[t] = t < 2 || fabs(rnd()) < 1.0 / 12 ? 0 : 1;
    if (B > 2) tok[2 * T + T - 41] = 0;
    doc_start_fill(ds, tok, B, T, 0);
    struct tensor dc = tensor_view(backend_alloc(cpu, bt * 4), DTYPE_I32, bt);
    struct tensor dg = tensor_view(backend_alloc(gpu, bt * 4), DTYPE_I32, bt);
    backend_to_device(cpu, dc.data, ds, bt * 4);
    backend_to_device(gpu, dg.data, ds, bt * 4);
    char what[128], w2[160];
    snprintf(what, sizeof what, "documents B=%d T=%d H=%d Hkv=%d D=%d", B, T, H, Hkv, D);

    int half = D / 2;
    struct pair cs = pair_alloc((size_t)T * half, DTYPE_FP32), sn = pair_alloc((size_t)T * half, DTYPE_FP32);
    rope_table_fill(cs.h, sn.h, T, D, 10000.0);
    pair_sync(cs), pair_sync(sn);
    for (int inverse = 0; inverse < 2; inverse++) {
        struct pair x = pair_rand(nq, 1, dt);
        if (inverse) {
            backend_rope_backward_docs(cpu, x.c, cs.c, sn.c, dc, B, T, H, D, 0);
            backend_rope_backward_docs(gpu, x.g, cs.g, sn.g, dg, B, T, H, D, 0);
        } else {
            backend_rope_forward_docs(cpu, x.c, cs.c, sn.c, dc, B, T, H, D, 0);
            backend_rope_forward_docs(gpu, x.g, cs.g, sn.g, dg, B, T, H, D, 0);
        }
        snprintf(w2, sizeof w2, "%s rope_%s", what, inverse ? "backward" : "forward");
        expect_match(x, w2);
        pair_free(x);
    }
    pair_free(cs), pair_free(sn);

    struct pair q = pair_rand(nq, 1, dt), k = pair_rand(nk, 1, dt), v = pair_rand(nk, 1, dt);
    struct pair out = pair_nan(nq, dt), lse = pair_nan(nl, DTYPE_FP32);
    struct error err = {0};
    EXPECT(!backend_set_attention(gpu, attn_mode, &err), "%s: backend_set_attention: %s", what, err.msg);
    backend_attention_forward_docs(cpu, out.c, lse.c, q.c, k.c, v.c, dc, B, T, H, Hkv, D);
    backend_attention_forward_docs(gpu, out.g, lse.g, q.g, k.g, v.g, dg, B, T, H, Hkv, D);
    snprintf(w2, sizeof w2, "%s forward out", what), expect_match_tol(out, tol_attn(dt), w2);
    snprintf(w2, sizeof w2, "%s forward lse", what), expect_match_tol(lse, tol_attn(DTYPE_FP32), w2);
    for (size_t i = 0; i < nq; i++) out.h[i] = round_to(dt, ((float *)out.c.data)[i]);
    memcpy(lse.h, lse.c.data, nl * 4);
    pair_sync(out), pair_sync(lse);
    struct pair dout = pair_rand(nq, 1, dt), dq = pair_nan(nq, dt);
    struct pair dk = pair_nan(nk, dt), dv = pair_nan(nk, dt);
    backend_attention_backward_docs(cpu, dq.c, dk.c, dv.c, dout.c, q.c, k.c, v.c, out.c, lse.c, dc, B, T, H,
                                    Hkv, D);
    backend_attention_backward_docs(gpu, dq.g, dk.g, dv.g, dout.g, q.g, k.g, v.g, out.g, lse.g, dg, B, T, H,
                                    Hkv, D);
    snprintf(w2, sizeof w2, "%s backward dq", what), expect_match_tol(dq, tol_attn(dt), w2);
    snprintf(w2, sizeof w2, "%s backward dk", what), expect_match_tol(dk, tol_attn(dt), w2);
    snprintf(w2, sizeof w2, "%s backward dv", what), expect_match_tol(dv, tol_attn(dt), w2);
    pair_free(q), pair_free(k), pair_free(v), pair_free(out), pair_free(lse), pair_free(dout),
        pair_free(dq), pair_free(dk), pair_free(dv);
    backend_dealloc(cpu, dc.data), backend_dealloc(gpu, dg.data);
    free(tok), free(ds);
}

// lse of the GPU against the CPU where rows may be -inf (no readable key):
// the -inf rows must agree exactly, the finite ones within tol.
static void expect_lse_match(struct pair p, double tol, const char *what) {
    float *got = xmalloc(p.n * 4 + 4), *ref = xmalloc(p.n * 4 + 4);
    download(got, p.g, p.n);
    memcpy(ref, p.c.data, p.n * 4);
    size_t bad = 0, inf = 0;
    for (size_t i = 0; i < p.n; i++) {
        bool gi = isinf(got[i]) && got[i] < 0, ri = isinf(ref[i]) && ref[i] < 0;
        bad += gi != ri || isnan(got[i]);
        inf += ri;
        if (gi && ri) got[i] = ref[i] = 0;
    }
    EXPECT(bad == 0, "%s: %zu of %zu lse elements differ in -inf / NaN (%zu -inf in the reference)", what, bad,
           p.n, inf);
    EXPECT_REL(p.n, got, ref, tol, what);
    free(got), free(ref);
}

// Rank r's global positions under context parallelism cp (docs/design.md §2):
// a sequence of T tokens in 2 cp chunks of C = T / (2 cp), rank r holding
// chunks r and 2 cp - 1 - r (the first `chunks` of them: 1 or 2), every row
// of the batch alike; pos (B, chunks C).
static void cp_positions(int32_t *pos, int B, int T, int cp, int r, int chunks) {
    int C = T / (2 * cp), n = chunks * C;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < n; i++) pos[(size_t)b * n + i] = (i < C ? r : 2 * cp - 1 - r) * C + i % C;
}

// One block of ring attention (attention_block_forward / _backward): rank rq's
// queries (Tq = T / cp) against rank rk's keys and values (kchunks = 2: Tk =
// T / cp; 1: its first chunk only, Tq != Tk), CUDA against the CPU backend.
// docs: q_doc from packed documents of the global sequence (a boundary every
// ~9 tokens at random, crossing chunk boundaries); accumulate: out and lse
// start from random values (every 5th row lse -inf, out 0), merged into. The
// backward from the CPU forward's out and lse (rounded to dt) into random dq,
// dk, dv. Rows with no readable key (lse -inf) are part of most cases.
// nan_unread (rk < rq, chunks of 32 rows or more): on the device, the key
// chunk no query can read (rank rk's second, after both of rank rq's) holds
// NaN keys and values (the CPU keeps the finite ones): its tiles must be
// skipped, not computed and masked (0 x NaN).
static void test_attention_block(enum dtype dt, int B, int T, int cp, int rq, int rk, int kchunks, bool docs,
                                 bool accumulate, int H, int Hkv, int D, bool nan_unread) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int Tq = T / cp, Tk = kchunks * T / (2 * cp);
    size_t nq = (size_t)B * Tq * H * D, nk = (size_t)B * Tk * Hkv * D, nl = (size_t)B * H * Tq;
    int32_t *qp = xmalloc((size_t)B * Tq * 4), *kp = xmalloc((size_t)B * Tk * 4), *qd = xmalloc((size_t)B * Tq * 4);
    cp_positions(qp, B, T, cp, rq, 2);
    cp_positions(kp, B, T, cp, rk, kchunks);
    if (docs) {
        int32_t *tok = xmalloc((size_t)B * T * 4), *ds = xmalloc((size_t)B * T * 4);
        for (int i = 0; i < B * T; i++) tok[i] = fabs(rnd()) < 1.0 / 9 ? 0 : 1;
        doc_start_fill(ds, tok, B, T, 0);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tq; i++) qd[(size_t)b * Tq + i] = ds[(size_t)b * T + qp[(size_t)b * Tq + i]];
        free(tok), free(ds);
    }
    struct ipair qpos = ipair_make(qp, (size_t)B * Tq), kpos = ipair_make(kp, (size_t)B * Tk);
    struct ipair qdoc = ipair_make(qd, (size_t)B * Tq);
    struct tensor qdc = docs ? qdoc.c : tensor_view(NULL, DTYPE_I32, 0);
    struct tensor qdg = docs ? qdoc.g : tensor_view(NULL, DTYPE_I32, 0);
    char what[160], w2[200];
    snprintf(what, sizeof what, "attention_block B=%d T=%d cp=%d ranks %d<-%d Tq=%d Tk=%d H=%d Hkv=%d D=%d%s%s%s",
             B, T, cp, rq, rk, Tq, Tk, H, Hkv, D, docs ? " docs" : "", accumulate ? " accumulate" : "",
             nan_unread ? " nan-unread" : "");

    struct pair q = pair_rand(nq, 1, dt), k = pair_rand(nk, 1, dt), v = pair_rand(nk, 1, dt);
    struct pair out = pair_nan(nq, dt), lse = pair_nan(nl, DTYPE_FP32);
    if (nan_unread) {
        size_t row = (size_t)Hkv * D, C = (size_t)Tk / 2;
        EXPECT(rk < rq && kchunks == 2, "%s: nan_unread needs rk < rq and two key chunks", what);
        for (int b = 0; b < B; b++)
            for (size_t e = 0; e < C * row; e++) k.h[(b * (size_t)Tk + C) * row + e] = v.h[(b * (size_t)Tk + C) * row + e] = NAN;
        upload(k.g, k.h, nk), upload(v.g, v.h, nk); // the CPU keeps the finite values: its result is the reference
    }
    if (accumulate) {
        for (size_t i = 0; i < nl; i++) lse.h[i] = i % 5 == 0 ? -INFINITY : (float)(1 + 2 * rnd());
        for (size_t i = 0; i < nq; i++) { // (b, t, h, d): row (b, h, t) of lse
            size_t d = i % D, h = i / D % H, t = i / D / H % Tq, b = i / D / H / Tq;
            (void)d;
            out.h[i] = isinf(lse.h[(b * H + h) * Tq + t]) ? 0.0f : round_to(dt, (float)rnd());
        }
        pair_sync(out), pair_sync(lse);
    }
    // attention = cudnn (tests/gpu/run.sh): blocks without documents must run on cuDNN
    bool want_cudnn = attn_mode == BACKEND_ATTENTION_CUDNN && !docs && dt != DTYPE_FP32;
    backend_attention_take_path(gpu);
    backend_attention_block_forward(cpu, out.c, lse.c, q.c, k.c, v.c, qpos.c, qdc, kpos.c, B, Tq, Tk, H, Hkv, D,
                                    accumulate);
    backend_attention_block_forward(gpu, out.g, lse.g, q.g, k.g, v.g, qpos.g, qdg, kpos.g, B, Tq, Tk, H, Hkv, D,
                                    accumulate);
    if (want_cudnn)
        EXPECT(backend_attention_take_path(gpu) == BACKEND_ATTENTION_PATH_CUDNN, "%s forward: not on cuDNN", what);
    snprintf(w2, sizeof w2, "%s forward out", what), expect_match_tol(out, tol_attn(dt), w2);
    snprintf(w2, sizeof w2, "%s forward lse", what), expect_lse_match(lse, tol_attn(DTYPE_FP32), w2);

    for (size_t i = 0; i < nq; i++) out.h[i] = round_to(dt, ((float *)out.c.data)[i]);
    memcpy(lse.h, lse.c.data, nl * 4);
    pair_sync(out), pair_sync(lse);
    struct pair dout = pair_rand(nq, 1, dt), dq = pair_rand(nq, 1, dt);
    struct pair dk = pair_rand(nk, 1, dt), dv = pair_rand(nk, 1, dt);
    backend_attention_block_backward(cpu, dq.c, dk.c, dv.c, dout.c, q.c, k.c, v.c, out.c, lse.c, qpos.c, qdc, kpos.c,
                                     B, Tq, Tk, H, Hkv, D);
    backend_attention_block_backward(gpu, dq.g, dk.g, dv.g, dout.g, q.g, k.g, v.g, out.g, lse.g, qpos.g, qdg, kpos.g,
                                     B, Tq, Tk, H, Hkv, D);
    if (want_cudnn)
        EXPECT(backend_attention_take_path(gpu) == BACKEND_ATTENTION_PATH_CUDNN, "%s backward: not on cuDNN", what);
    snprintf(w2, sizeof w2, "%s backward dq", what), expect_match_tol(dq, tol_attn(dt), w2);
    snprintf(w2, sizeof w2, "%s backward dk", what), expect_match_tol(dk, tol_attn(dt), w2);
    snprintf(w2, sizeof w2, "%s backward dv", what), expect_match_tol(dv, tol_attn(dt), w2);
    pair_free(q), pair_free(k), pair_free(v), pair_free(out), pair_free(lse), pair_free(dout), pair_free(dq),
        pair_free(dk), pair_free(dv);
    ipair_free(qpos), ipair_free(kpos), ipair_free(qdoc);
    free(qp), free(kp), free(qd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (getenv("TEST_VERBOSE"))
        printf("  %s (%s): %.2f s\n", what, dtype_name(dt),
               (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
}

// One vocab shard [vs, vs + Vl) of V classes with Vvalid real columns; targets
// inside and outside the shard, and every 7th row ignored.
// Attention against a key/value cache (generation): the caches hold random
// rows (stale entries past each row's position included, which must not be
// read), rows at different positions, a step of Tq new tokens each; out and
// both caches (the appended rows) against the CPU.
static void test_attention_decode(enum dtype dt, int B, int Tq, int Tmax, int H, int Hkv, int D,
                                  const int32_t *pos) {
    size_t nq = (size_t)B * Tq * H * D, nk = (size_t)B * Tq * Hkv * D, nc = (size_t)B * Tmax * Hkv * D;
    struct pair q = pair_rand(nq, 3, dt), k = pair_rand(nk, 1, dt), v = pair_rand(nk, 1, dt);
    struct pair kc = pair_rand(nc, 1, dt), vc = pair_rand(nc, 1, dt), out = pair_nan(nq, dt);
    struct ipair ps = ipair_make(pos, (size_t)B);
    backend_attention_decode(cpu, out.c, q.c, k.c, v.c, kc.c, vc.c, ps.c, B, Tq, Tmax, H, Hkv, D);
    backend_attention_decode(gpu, out.g, q.g, k.g, v.g, kc.g, vc.g, ps.g, B, Tq, Tmax, H, Hkv, D);
    char what[96];
    snprintf(what, sizeof what, "attention_decode B=%d Tq=%d Tmax=%d H=%d Hkv=%d D=%d", B, Tq, Tmax, H, Hkv, D);
    expect_match(out, what);
    expect_match(kc, "attention_decode k_cache");
    expect_match(vc, "attention_decode v_cache");
    pair_free(q), pair_free(k), pair_free(v), pair_free(kc), pair_free(vc), pair_free(out);
    ipair_free(ps);
}

static void test_cross_entropy(enum dtype dt, int N, int Vl, int Vvalid, int vs, int V) {
    int ign = -100;
    float s = 0.1f;
    int32_t *tg = xmalloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++)
        tg[i] = i % 7 == 3 ? ign : i % 2 ? vs + (i * 37) % Vvalid : (i * 7919) % V;
    struct ipair t = ipair_make(tg, N);
    struct pair z = pair_rand((size_t)N * Vl, 4, dt), mx = pair_nan(N, DTYPE_FP32);
    backend_ce_row_max(cpu, mx.c, z.c, N, Vl, Vvalid);
    backend_ce_row_max(gpu, mx.g, z.g, N, Vl, Vvalid);
    expect_match(mx, "ce_row_max");
    struct pair part = pair_nan((size_t)N * 3, DTYPE_FP32);
    memcpy(mx.h, mx.c.data, N * 4), pair_sync(mx);
    backend_ce_partials(cpu, part.c, z.c, mx.c, t.c, N, Vl, Vvalid, vs);
    backend_ce_partials(gpu, part.g, z.g, mx.g, t.g, N, Vl, Vvalid, vs);
    expect_match(part, "ce_partials");
    // loss from partials as if reduced over 5 shards: positive sums, any z
    struct pair rp = pair_alloc((size_t)N * 3, DTYPE_FP32), loss = pair_nan(N, DTYPE_FP32);
    struct pair lse = pair_nan(N, DTYPE_FP32);
    for (int i = 0; i < N; i++) {
        rp.h[3 * i] = (float)(1 + 5 * fabs(rnd()));
        rp.h[3 * i + 1] = (float)(3 * rnd());
        rp.h[3 * i + 2] = (float)(40 * rnd());
    }
    pair_sync(rp);
    backend_ce_loss(cpu, loss.c, lse.c, rp.c, mx.c, t.c, N, V, s, ign);
    backend_ce_loss(gpu, loss.g, lse.g, rp.g, mx.g, t.g, N, V, s, ign);
    expect_match(loss, "ce_loss loss");
    expect_match(lse, "ce_loss lse");
    // backward with the true lse of this shard's row (as if it were the only one)
    for (int i = 0; i < N; i++) {
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < Vvalid; j++) m = fmax(m, z.h[(size_t)i * Vl + j]);
        for (int j = 0; j < Vvalid; j++) sum += exp(z.h[(size_t)i * Vl + j] - m);
        lse.h[i] = (float)(m + log(sum));
    }
    pair_sync(lse);
    struct pair dz = pair_nan((size_t)N * Vl, dt);
    backend_ce_backward(cpu, dz.c, z.c, lse.c, t.c, N, Vl, Vvalid, vs, V, s, ign, 1.0 / N);
    backend_ce_backward(gpu, dz.g, z.g, lse.g, t.g, N, Vl, Vvalid, vs, V, s, ign, 1.0 / N);
    expect_match(dz, "ce_backward");
    // in place (dlogits = logits, as the model's recompute modes run it): the same bits
    struct pair zd = pair_alloc((size_t)N * Vl, dt);
    memcpy(zd.h, z.h, (size_t)N * Vl * 4), pair_sync(zd);
    backend_ce_backward(cpu, zd.c, zd.c, lse.c, t.c, N, Vl, Vvalid, vs, V, s, ign, 1.0 / N);
    backend_ce_backward(gpu, zd.g, zd.g, lse.g, t.g, N, Vl, Vvalid, vs, V, s, ign, 1.0 / N);
    EXPECT(!memcmp(zd.c.data, dz.c.data, (size_t)N * Vl * 4), "ce_backward (%s): CPU in place "
           "differs from out of place", dtype_name(dt));
    expect_same_gpu(zd, dz, 0, "ce_backward in place against out of place");
    pair_free(z), pair_free(mx), pair_free(part), pair_free(rp), pair_free(loss), pair_free(lse),
        pair_free(dz), pair_free(zd), ipair_free(t);
    free(tg);
}

// AdamW: param of dtype dt with FP32 master, and (FP32 only) param without master.
static void test_adamw(enum dtype dt) {
    size_t n = 777;
    for (int with_master = dt != DTYPE_FP32; with_master < 2; with_master++) {
        struct pair p = pair_rand(n, 1, dt), g = pair_rand(n, 1, DTYPE_FP32);
        struct pair m = pair_rand(n, 0.1, DTYPE_FP32), v = pair_rand(n, 0.1, DTYPE_FP32);
        for (size_t i = 0; i < n; i++) v.h[i] = fabsf(v.h[i]);
        pair_sync(v);
        struct pair master = pair_alloc(n, DTYPE_FP32);
        memcpy(master.h, p.h, n * 4), pair_sync(master); // the master holds the param's values
        struct tensor mc = with_master ? master.c : tensor_view(NULL, DTYPE_FP32, 0);
        struct tensor mg = with_master ? master.g : tensor_view(NULL, DTYPE_FP32, 0);
        for (int step = 1; step <= 3; step++) { // the same grad each step: m, v, bias corrections move
            backend_adamw(cpu, p.c, mc, g.c, m.c, v.c, n, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5, step);
            backend_adamw(gpu, p.g, mg, g.g, m.g, v.g, n, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5, step);
        }
        const char *what = with_master ? "adamw with master" : "adamw";
        char w2[96];
        snprintf(w2, sizeof w2, "%s param", what), expect_match(p, w2);
        snprintf(w2, sizeof w2, "%s m", what), expect_match(m, w2);
        snprintf(w2, sizeof w2, "%s v", what), expect_match(v, w2);
        if (with_master) expect_match(master, "adamw master");
        pair_free(p), pair_free(g), pair_free(m), pair_free(v), pair_free(master);
    }
}

// FP32 -> dt (BF16 or FP16) on values where rounding is easy to get wrong:
// bit for bit against the host (NaN: any NaN).
static void test_copy_edges(enum dtype dt) {
    const float v[] = {0.0f, -0.0f, 1.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f,
                       1.0f + 3 * 0x1p-8f, -(1.0f + 0x1.8p-8f), 65504.0f, 65519.99f, 65520.0f,
                       -1e5f, 0x1p-14f, 0x1.ff8p-15f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 3 * 0x1p-25f,
                       0x1p-26f, -1e-8f, 1e-45f, 0x1p-126f, 3.4e38f, -3.4e38f, INFINITY,
                       -INFINITY, NAN};
    size_t n = sizeof v / sizeof v[0];
    struct pair src = pair_alloc(n, DTYPE_FP32), dst = pair_nan(n, dt);
    memcpy(src.h, v, sizeof v);
    pair_sync(src);
    backend_copy(gpu, dst.g, src.g, n);
    float *got = xmalloc(n * 4);
    download(got, dst.g, n);
    for (size_t i = 0; i < n; i++) {
        float want = round_to(dt, v[i]);
        bool same = isnan(want) ? isnan(got[i]) : !memcmp(&got[i], &want, 4);
        EXPECT(same, "copy fp32 -> %s of %a: %a, host %a", dtype_name(dt), (double)v[i],
               (double)got[i], (double)want);
    }
    free(got);
    pair_free(src), pair_free(dst);
}

static void test_elementwise(enum dtype dt, size_t n) {
    struct pair x = pair_rand(n, 3, dt), y = pair_rand(n, 1, dt), o = pair_nan(n, dt);
    double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (double)x.h[i] * x.h[i];
    double got = backend_sum_squares(gpu, x.g, n);
    EXPECT(fabs(got - ref) <= 1e-12 * ref, "sum_squares (%s): %.17g, host fp64 %.17g",
           dtype_name(dt), got, ref);
    // sum_into: acc += sum x, twice, from a non-zero start, against a host FP64 sum
    double acc = 1.5, host_sum = 0;
    for (size_t i = 0; i < n; i++) host_sum += x.h[i];
    struct tensor acc_g = tensor_view(backend_alloc(gpu, sizeof acc), DTYPE_FP64, 1);
    backend_to_device(gpu, acc_g.data, &acc, sizeof acc);
    backend_sum_into(gpu, acc_g, x.g, n);
    backend_sum_into(gpu, acc_g, x.g, n);
    backend_to_host(gpu, &acc, acc_g.data, sizeof acc);
    EXPECT(fabs(acc - (1.5 + 2 * host_sum)) <= 1e-12 * (1.5 + 2 * fabs(host_sum)) + 1e-12,
           "sum_into (%s): %.17g, host fp64 %.17g", dtype_name(dt), acc, 1.5 + 2 * host_sum);
    backend_dealloc(gpu, acc_g.data);
    backend_add(cpu, o.c, x.c, y.c, n), backend_add(gpu, o.g, x.g, y.g, n);
    expect_match(o, "add");
    backend_add(cpu, x.c, x.c, y.c, n), backend_add(gpu, x.g, x.g, y.g, n);
    expect_match(x, "add in place");
    // copy to each other storage dtype and back: against host rounding
    enum dtype dts[] = {DTYPE_FP32, DTYPE_BF16, DTYPE_FP16};
    for (int d = 0; d < 3; d++) {
        enum dtype other = dts[d];
        if (other == dt) continue;
        char what[96];
        struct pair src = pair_rand(n, 5, DTYPE_FP32), conv = pair_nan(n, other), same = pair_nan(n, dt);
        backend_copy(gpu, conv.g, src.g, n);
        for (size_t i = 0; i < n; i++) ((float *)conv.c.data)[i] = round_to(other, src.h[i]);
        snprintf(what, sizeof what, "copy fp32 -> %s", dtype_name(other));
        expect_match(conv, what);
        float *h = xmalloc(n * 4);
        download(h, conv.g, n);
        for (size_t i = 0; i < n; i++) ((float *)same.c.data)[i] = round_to(dt, h[i]);
        backend_copy(gpu, same.g, conv.g, n);
        snprintf(what, sizeof what, "copy %s -> storage dtype", dtype_name(other));
        expect_match(same, what);
        size_t exact = 0;
        float *h2 = xmalloc(n * 4);
        download(h2, same.g, n);
        for (size_t i = 0; i < n; i++) exact += h2[i] == ((float *)same.c.data)[i];
        EXPECT(exact == n, "copy %s -> %s: %zu of %zu elements equal host round-to-nearest-even",
               dtype_name(other), dtype_name(dt), exact, n);
        free(h), free(h2);
        pair_free(src), pair_free(conv), pair_free(same);
    }
    if (dt != DTYPE_FP32) test_copy_edges(dt);
    pair_free(x), pair_free(y), pair_free(o);
}

// The cuDNN per-chunk-pair path's reading of positions (emulation, with
// TRIDENT_EMU_SDPA=1 in cudnn mode): a block forward with positions qp (B,
// Tq) and kp (B, Tk) written by fill(b, i, is_key), against the CPU; the
// path announced for the shape must contain want ("-> cudnn" when the
// positions are pairs of whole runs, else "-> native (" and the reason).
static void test_block_layout(int B, int Tq, int Tk, int (*fill)(int b, int i, bool key), const char *want) {
    const int H = 2, Hkv = 1, D = 24;
    enum dtype dt = DTYPE_BF16;
    int32_t *qp = xmalloc((size_t)B * Tq * 4), *kp = xmalloc((size_t)B * Tk * 4);
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < Tq; i++) qp[(size_t)b * Tq + i] = fill(b, i, false);
        for (int i = 0; i < Tk; i++) kp[(size_t)b * Tk + i] = fill(b, i, true);
    }
    struct ipair qpos = ipair_make(qp, (size_t)B * Tq), kpos = ipair_make(kp, (size_t)B * Tk);
    struct tensor none = tensor_view(NULL, DTYPE_I32, 0);
    size_t nq = (size_t)B * Tq * H * D, nk = (size_t)B * Tk * Hkv * D;
    struct pair q = pair_rand(nq, 1, dt), k = pair_rand(nk, 1, dt), v = pair_rand(nk, 1, dt);
    struct pair out = pair_nan(nq, dt), lse = pair_nan((size_t)B * H * Tq, DTYPE_FP32);
    FILE *log = tmpfile();
    EXPECT(log != NULL, "tmpfile");
    backend_set_attention_log(gpu, log);
    backend_attention_block_forward(cpu, out.c, lse.c, q.c, k.c, v.c, qpos.c, none, kpos.c, B, Tq, Tk, H, Hkv, D,
                                    false);
    backend_attention_block_forward(gpu, out.g, lse.g, q.g, k.g, v.g, qpos.g, none, kpos.g, B, Tq, Tk, H, Hkv, D,
                                    false);
    char what[128], text[1024] = "";
    snprintf(what, sizeof what, "block layout B=%d Tq=%d Tk=%d (%s)", B, Tq, Tk, want);
    char w2[192];
    snprintf(w2, sizeof w2, "%s out", what), expect_match_tol(out, tol_attn(dt), w2);
    snprintf(w2, sizeof w2, "%s lse", what), expect_lse_match(lse, tol_attn(DTYPE_FP32), w2);
    rewind(log);
    text[fread(text, 1, sizeof text - 1, log)] = 0;
    fclose(log);
    backend_set_attention_log(gpu, stderr);
    EXPECT(strstr(text, want) != NULL, "%s: the path announced: '%s'", what, text);
    pair_free(q), pair_free(k), pair_free(v), pair_free(out), pair_free(lse);
    ipair_free(qpos), ipair_free(kpos);
    free(qp), free(kp);
}
// The pair path remembers a layout by its position tensors and checks it on
// the device at each call (emulation, TRIDENT_EMU_SDPA=1, cudnn mode): keys
// at positions i (one run before the queries at 64 + i: a full pair), then
// the same k_pos tensor rewritten in place, to 48 + i (a run reaching into
// the queries') and to 100 + i (after every query): the remembered layout no
// longer holds, the native kernels run behind the check, forward (accumulate
// into the first call's result) and backward match the CPU.
static void test_block_layout_rewritten(void) {
    const int B = 1, Tq = 32, Tk = 32, H = 2, Hkv = 1, D = 24;
    enum dtype dt = DTYPE_BF16;
    int32_t qp[32], kp[32];
    for (int i = 0; i < 32; i++) qp[i] = 64 + i, kp[i] = i;
    struct ipair qpos = ipair_make(qp, Tq), kpos = ipair_make(kp, Tk);
    struct tensor none = tensor_view(NULL, DTYPE_I32, 0);
    size_t nq = (size_t)B * Tq * H * D, nk = (size_t)B * Tk * Hkv * D, nl = (size_t)B * H * Tq;
    struct pair q = pair_rand(nq, 1, dt), k = pair_rand(nk, 1, dt), v = pair_rand(nk, 1, dt);
    struct pair out = pair_nan(nq, dt), lse = pair_nan(nl, DTYPE_FP32);
    char what[96];
    for (int round = 0; round < 3; round++) {
        if (round) {
            for (int i = 0; i < 32; i++) kp[i] = (round == 1 ? 48 : 100) + i;
            memcpy(kpos.c.data, kp, sizeof kp);
            backend_to_device(gpu, kpos.g.data, kp, sizeof kp);
        }
        snprintf(what, sizeof what, "block, k_pos rewritten in place (keys from %d)", kp[0]);
        backend_attention_block_forward(cpu, out.c, lse.c, q.c, k.c, v.c, qpos.c, none, kpos.c, B, Tq, Tk, H, Hkv, D,
                                        round > 0);
        backend_attention_block_forward(gpu, out.g, lse.g, q.g, k.g, v.g, qpos.g, none, kpos.g, B, Tq, Tk, H, Hkv, D,
                                        round > 0);
        char w2[160];
        snprintf(w2, sizeof w2, "%s forward out", what), expect_match_tol(out, tol_attn(dt), w2);
        snprintf(w2, sizeof w2, "%s forward lse", what), expect_lse_match(lse, tol_attn(DTYPE_FP32), w2);
        // the next round merges into the CPU's result on both sides
        for (size_t i = 0; i < nq; i++) out.h[i] = round_to(dt, ((float *)out.c.data)[i]);
        memcpy(lse.h, lse.c.data, nl * 4);
        pair_sync(out), pair_sync(lse);
        struct pair dout = pair_rand(nq, 1, dt), dq = pair_rand(nq, 1, dt);
        struct pair dk = pair_rand(nk, 1, dt), dv = pair_rand(nk, 1, dt);
        backend_attention_block_backward(cpu, dq.c, dk.c, dv.c, dout.c, q.c, k.c, v.c, out.c, lse.c, qpos.c, none,
                                         kpos.c, B, Tq, Tk, H, Hkv, D);
        backend_attention_block_backward(gpu, dq.g, dk.g, dv.g, dout.g, q.g, k.g, v.g, out.g, lse.g, qpos.g, none,
                                         kpos.g, B, Tq, Tk, H, Hkv, D);
        snprintf(w2, sizeof w2, "%s backward dq", what), expect_match_tol(dq, tol_attn(dt), w2);
        snprintf(w2, sizeof w2, "%s backward dk", what), expect_match_tol(dk, tol_attn(dt), w2);
        snprintf(w2, sizeof w2, "%s backward dv", what), expect_match_tol(dv, tol_attn(dt), w2);
        pair_free(dout), pair_free(dq), pair_free(dk), pair_free(dv);
    }
    pair_free(q), pair_free(k), pair_free(v), pair_free(out), pair_free(lse);
    ipair_free(qpos), ipair_free(kpos);
}

// Positions for test_block_layout: queries at 64 + i (one run), keys at
// (a) 16 + i: a key run reaching into the query run; (b) i: one run wholly
// before (a full pair, Tk != Tq); (c) batch rows unlike; (d) every other
// position (Tk runs of one).
static int lay_partial(int b, int i, bool key) { return key ? 16 + i : 64 + i; }
static int lay_before(int b, int i, bool key) { return key ? i : 64 + i; }
static int lay_batch(int b, int i, bool key) { return key ? (b ? i : i + 64) : 64 + i; }
static int lay_sparse(int b, int i, bool key) { return key ? 2 * i : 64 + i; }

// system.attention's selection (kernels/backend.h): see the file comment.
static void test_attention_choice(void) {
    struct error err = {0};
    bool on = true, absent = getenv("TEST_OPS_CUDNN_ABSENT") != NULL;
    const int B = 2, T = 37, H = 4, Hkv = 2, D = 24;
    EXPECT(!backend_set_attention(gpu, BACKEND_ATTENTION_NATIVE, &err), "set native: %s", err.msg);
    EXPECT(!backend_attention_uses_cudnn(gpu, DTYPE_BF16, B, T, H, Hkv, D, false, &on, &err) && !on,
           "attention = native: cudnn %d (%s)", on, err.msg);
    EXPECT(!backend_set_attention(gpu, BACKEND_ATTENTION_AUTO, &err), "set auto: %s", err.msg);
    EXPECT(!backend_attention_uses_cudnn(gpu, DTYPE_FP32, B, T, H, Hkv, D, false, &on, &err) && !on,
           "attention = auto, fp32: cudnn %d (%s)", on, err.msg);
    bool auto_fwd = true, auto_bwd = true;
    EXPECT(!backend_attention_uses_cudnn(gpu, DTYPE_BF16, B, T, H, Hkv, D, false, &auto_fwd, &err),
           "attention = auto never fails: %s", err.msg);
    EXPECT(!backend_attention_uses_cudnn(gpu, DTYPE_BF16, B, T, H, Hkv, D, true, &auto_bwd, &err),
           "attention = auto never fails: %s", err.msg);
    if (absent) EXPECT(!auto_fwd && !auto_bwd, "attention = auto with a cuDNN without engines: cudnn %d %d",
                       auto_fwd, auto_bwd);
    if (absent) { // the op itself, auto mode, falls back and still matches the CPU
        enum backend_attention keep = attn_mode;
        attn_mode = BACKEND_ATTENTION_AUTO;
        test_attention(DTYPE_BF16, B, T, H, Hkv, D);
        attn_mode = keep;
        // ring-attention blocks through the per-chunk-pair path with the
        // emulation's naive SDPA in place of cuDNN (TRIDENT_EMU_SDPA=1, in
        // cudnn mode: the path must be cuDNN's): the positions' runs, the
        // views, the merges and the adds against the CPU
        setenv("TRIDENT_EMU_SDPA", "1", 1);
        EXPECT(!backend_set_attention(gpu, BACKEND_ATTENTION_CUDNN, &err), "set cudnn: %s", err.msg);
        attn_mode = BACKEND_ATTENTION_CUDNN;
        test_attention_block(DTYPE_BF16, 2, 64, 2, 0, 0, 2, false, false, 4, 2, 24, false);
        test_attention_block(DTYPE_FP16, 1, 128, 4, 2, 1, 2, false, true, 4, 1, 40, false);
        test_attention_block(DTYPE_BF16, 1, 128, 4, 1, 2, 2, false, true, 2, 2, 24, false);
        test_attention_block(DTYPE_FP16, 2, 64, 2, 1, 0, 1, false, false, 4, 2, 24, false);
        test_block_layout(1, 32, 64, lay_partial, "Tk=64 H=2 Hkv=1 D=24 bf16 -> native (key run [16, 79] overlaps "
                                                  "query run [64, 95] partially)");
        test_block_layout(1, 32, 40, lay_before, "Tk=40 H=2 Hkv=1 D=24 bf16 -> cudnn");
        test_block_layout(2, 32, 36, lay_batch, "-> native (positions differ across the batch)");
        test_block_layout(1, 32, 20, lay_sparse, "-> native (positions are not 4 runs or fewer a side)");
        test_block_layout_rewritten();
        unsetenv("TRIDENT_EMU_SDPA");
        attn_mode = keep;
        // ring-attention blocks in auto mode: the positions are read back and
        // split into chunk pairs, cuDNN cannot plan them, the native kernels
        // run and match the CPU; a document mask goes native at once
        FILE *log = tmpfile();
        EXPECT(log != NULL, "tmpfile");
        backend_set_attention_log(gpu, log);
        EXPECT(!backend_set_attention(gpu, BACKEND_ATTENTION_AUTO, &err), "set auto: %s", err.msg);
        test_attention_block(DTYPE_BF16, 2, 64, 2, 1, 0, 2, false, true, 4, 2, 32, false);
        test_attention_block(DTYPE_BF16, 1, 64, 2, 0, 0, 2, true, false, 2, 2, 32, false);
        char text[4096] = "";
        rewind(log);
        text[fread(text, 1, sizeof text - 1, log)] = 0;
        fclose(log);
        backend_set_attention_log(gpu, stderr);
        EXPECT(strstr(text, "attention: block forward B=2 Tq=32 Tk=32 H=4 Hkv=2 D=32 bf16 -> native (cuDNN") &&
                   strstr(text, "cannot run it") &&
                   strstr(text, "attention: block backward B=2 Tq=32 Tk=32 H=4 Hkv=2 D=32 bf16 -> native (cuDNN") &&
                   strstr(text, "attention: block forward B=1 Tq=32 Tk=32 H=2 Hkv=2 D=32 bf16 -> native (document "
                                "mask"),
               "the block paths in auto mode: '%s'", text);
    }
    enum status st = backend_set_attention(gpu, BACKEND_ATTENTION_CUDNN, &err);
    if (st) { // cuDNN cannot even open: auto must have fallen back
        EXPECT(!auto_fwd && strstr(err.msg, "system.attention = cudnn"), "set cudnn: '%s'", err.msg);
    } else {
        EXPECT(!backend_attention_uses_cudnn(gpu, DTYPE_FP32, B, T, H, Hkv, D, false, &on, &err) && !on,
               "attention = cudnn, fp32 runs native: cudnn %d (%s)", on, err.msg);
        for (int bwd = 0; bwd < 2; bwd++) {
            err = (struct error){0};
            st = backend_attention_uses_cudnn(gpu, DTYPE_BF16, B, T, H, Hkv, D, bwd, &on, &err);
            bool auto_on = bwd ? auto_bwd : auto_fwd;
            EXPECT(auto_on ? st == STATUS_OK && on : st == STATUS_RUNTIME && !on,
                   "attention = cudnn (%s) must succeed exactly when auto picks cuDNN (%d): status %d, '%s'",
                   bwd ? "backward" : "forward", auto_on, st, err.msg);
            if (st)
                EXPECT(strstr(err.msg, "system.attention = cudnn") && strstr(err.msg, "B=2 T=37 H=4 Hkv=2 D=24 bf16") &&
                           strstr(err.msg, "CUDNN_STATUS_"),
                       "the error names the key, the shape and cuDNN's status: '%s'", err.msg);
        }
    }
    err = (struct error){0};
    EXPECT(backend_set_attention(cpu, BACKEND_ATTENTION_CUDNN, &err) == STATUS_BAD_INPUT &&
               strstr(err.msg, "system.attention = cudnn"),
           "cpu backend, attention = cudnn: '%s'", err.msg);
    EXPECT(!backend_set_attention(gpu, BACKEND_ATTENTION_NATIVE, &err), "set native: %s", err.msg);
}

// to_device through the backend's pinned staging ring (16 slots of 256 KiB):
// 40 uploads from one host buffer rewritten between them (a slot reused
// before its copy ran would carry a later value), and one upload of 5 MiB
// (pieces through every slot, more than once), read back exactly.
static void test_uploads(void) {
    enum { N_UP = 40, UP = 1000 };
    int32_t host[UP], back[UP];
    void *dev[N_UP];
    for (int u = 0; u < N_UP; u++) {
        dev[u] = backend_alloc(gpu, sizeof host);
        for (int i = 0; i < UP; i++) host[i] = u * UP + i;
        backend_to_device(gpu, dev[u], host, sizeof host);
    }
    int bad = 0;
    for (int u = 0; u < N_UP; u++) {
        backend_to_host(gpu, back, dev[u], sizeof back);
        for (int i = 0; i < UP; i++) bad += back[i] != u * UP + i;
        backend_dealloc(gpu, dev[u]);
    }
    EXPECT(bad == 0, "%d of %d elements uploaded from a rewritten host buffer differ", bad, N_UP * UP);
    size_t n = (5u << 20) / sizeof(int32_t);
    int32_t *big = xmalloc(n * sizeof *big), *big_back = xmalloc(n * sizeof *big);
    for (size_t i = 0; i < n; i++) big[i] = (int32_t)(i * 2654435761u);
    void *d = backend_alloc(gpu, n * sizeof *big);
    backend_to_device(gpu, d, big, n * sizeof *big);
    memset(big, 0, n * sizeof *big); // the caller may reuse its buffer at once
    backend_to_host(gpu, big_back, d, n * sizeof *big);
    size_t bad_big = 0;
    for (size_t i = 0; i < n; i++) bad_big += big_back[i] != (int32_t)(i * 2654435761u);
    EXPECT(bad_big == 0, "a 5 MiB upload through the staging ring: %zu elements differ", bad_big);
    backend_dealloc(gpu, d);
    free(big), free(big_back);
}

// ---- mixture of experts (kernels/ops.h "mixture of experts") -------------------------

// A device int tensor of n elements on both backends, NaN-free: -7 poisoned.
static struct ipair ipair_poison(size_t n) {
    int32_t *v = xmalloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) v[i] = -7;
    struct ipair p = ipair_make(v, n);
    free(v);
    return p;
}

// The GPU's integers equal the CPU's.
static void expect_same_ints(struct ipair p, size_t n, const char *what) {
    int32_t *g = xmalloc(n * 4 + 4);
    backend_to_host(gpu, g, p.g.data, n * 4);
    backend_synchronize(gpu);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += g[i] != ((int32_t *)p.c.data)[i];
    EXPECT(bad == 0, "%s: %zu of %zu integers differ", what, bad, n);
    free(g);
}

// Routing (with and without a selection bias, renormalised or not), its
// statistics and backward, in FP32 (the routing dtype); the dispatch plan
// (dropless and with a capacity) bit for bit; permute, combine (routing
// weights and the sigmoid gate, = and +=) and their backward in dt. N odd, C
// not a multiple of the vector widths.
static void test_moe_ops(enum dtype dt) {
    const int N = 37, E = 8, k = 2, C = 24;
    size_t nk = (size_t)N * k;
    char what[128];
    struct pair logits = pair_rand((size_t)N * E, 3, DTYPE_FP32), bias = pair_rand(E, 0.2, DTYPE_FP32);
    struct tensor none = tensor_view(NULL, DTYPE_FP32, 0);
    for (int v = 0; v < 2; v++) { // v 0: Mixtral (renorm, no bias); 1: Qwen2-MoE style, biased choice
        bool renorm = v == 0;
        struct pair probs = pair_nan((size_t)N * E, DTYPE_FP32), lse = pair_nan(N, DTYPE_FP32);
        struct pair tw = pair_nan(nk, DTYPE_FP32);
        struct ipair idx = ipair_poison(nk);
        struct tensor st_c = tensor_view(backend_alloc(cpu, 8 * (E + 1)), DTYPE_FP64, E + 1);
        struct tensor st_g = tensor_view(backend_alloc(gpu, 8 * (E + 1)), DTYPE_FP64, E + 1);
        backend_moe_route(cpu, probs.c, lse.c, idx.c, tw.c, st_c, logits.c, v ? bias.c : none, N, E, k, renorm);
        backend_moe_route(gpu, probs.g, lse.g, idx.g, tw.g, st_g, logits.g, v ? bias.g : none, N, E, k, renorm);
        snprintf(what, sizeof what, "moe_route renorm=%d bias=%d", renorm, v);
        expect_match(probs, what), expect_match(lse, what), expect_match(tw, what);
        expect_same_ints(idx, nk, what);
        double sg[MOE_TEST_MAX_E + 1];
        backend_to_host(gpu, sg, st_g.data, 8 * (E + 1));
        backend_synchronize(gpu);
        EXPECT_REL(E + 1, sg, (double *)st_c.data, 1e-6, "moe_route stats");

        // backward: the weights' gradient, an aux term, a z term
        struct pair dtw = pair_rand(nk, 1, DTYPE_FP32), aux = pair_rand(E, 0.1, DTYPE_FP32);
        struct pair dl = pair_nan((size_t)N * E, DTYPE_FP32);
        backend_moe_route_backward(cpu, dl.c, dtw.c, probs.c, lse.c, idx.c, aux.c, N, E, k, renorm, 0.05f);
        backend_moe_route_backward(gpu, dl.g, dtw.g, probs.g, lse.g, idx.g, aux.g, N, E, k, renorm, 0.05f);
        snprintf(what, sizeof what, "moe_route_backward renorm=%d", renorm);
        expect_match(dl, what);

        // dispatch on the CPU's choices (both sides hold them: idx.c, idx.g)
        for (int capacity = 0; capacity <= 7; capacity += 7) {
            struct ipair counts = ipair_poison(2 * E), dest = ipair_poison(nk), src = ipair_poison(nk);
            backend_moe_dispatch(cpu, counts.c, dest.c, src.c, idx.c, N, E, k, capacity);
            backend_moe_dispatch(gpu, counts.g, dest.g, src.g, idx.g, N, E, k, capacity);
            snprintf(what, sizeof what, "moe_dispatch capacity=%d bias=%d", capacity, v);
            expect_same_ints(counts, 2 * E, what), expect_same_ints(dest, nk, what);
            expect_same_ints(src, nk, what);
            int M = 0;
            for (int e = 0; e < E; e++) M += ((int32_t *)counts.c.data)[e];
            EXPECT(capacity == 0 ? M == (int)nk : M < (int)nk, "%s: M=%d of %zu", what, M, nk);

            struct pair x = pair_rand((size_t)N * C, 1, dt), xp = pair_nan((size_t)M * C, dt);
            backend_moe_permute(cpu, xp.c, x.c, src.c, M, C, k);
            backend_moe_permute(gpu, xp.g, x.g, src.g, M, C, k);
            snprintf(what, sizeof what, "moe_permute capacity=%d", capacity);
            expect_match(xp, what);
            struct pair dx = pair_rand((size_t)N * C, 1, dt), dxp = pair_rand((size_t)M * C, 1, dt);
            backend_moe_permute_backward(cpu, dx.c, dxp.c, dest.c, N, C, k);
            backend_moe_permute_backward(gpu, dx.g, dxp.g, dest.g, N, C, k);
            snprintf(what, sizeof what, "moe_permute_backward capacity=%d", capacity);
            expect_match(dx, what);
            for (int acc = 0; acc < 2; acc++) {
                struct pair y = acc ? pair_rand((size_t)N * C, 1, dt) : pair_nan((size_t)N * C, dt);
                backend_moe_combine(cpu, y.c, xp.c, tw.c, dest.c, N, C, k, false, acc);
                backend_moe_combine(gpu, y.g, xp.g, tw.g, dest.g, N, C, k, false, acc);
                snprintf(what, sizeof what, "moe_combine capacity=%d accumulate=%d", capacity, acc);
                expect_match(y, what);
                pair_free(y);
            }
            struct pair dyp = pair_nan((size_t)M * C, dt), dw = pair_nan(nk, DTYPE_FP32);
            struct pair dy = pair_rand((size_t)N * C, 1, dt);
            backend_moe_combine_backward(cpu, dyp.c, dw.c, dy.c, xp.c, tw.c, dest.c, N, C, k, false);
            backend_moe_combine_backward(gpu, dyp.g, dw.g, dy.g, xp.g, tw.g, dest.g, N, C, k, false);
            snprintf(what, sizeof what, "moe_combine_backward capacity=%d", capacity);
            expect_match(dyp, what);
            expect_match_tol(dw, dt == DTYPE_FP32 ? 1e-5 : 1e-4, what); // FP32 sums of dt values
            pair_free(x), pair_free(xp), pair_free(dx), pair_free(dxp), pair_free(dyp), pair_free(dw);
            pair_free(dy);
            ipair_free(counts), ipair_free(dest), ipair_free(src);
        }
        pair_free(probs), pair_free(lse), pair_free(tw), pair_free(dtw), pair_free(aux), pair_free(dl);
        ipair_free(idx);
        backend_dealloc(cpu, st_c.data), backend_dealloc(gpu, st_g.data);
    }
    // the shared expert's sigmoid gate: k = 1, no dest (row t of yp), +=
    struct tensor no_dest = tensor_view(NULL, DTYPE_I32, 0);
    struct pair s = pair_rand(N, 2, DTYPE_FP32), yp = pair_rand((size_t)N * C, 1, dt);
    struct pair y = pair_rand((size_t)N * C, 1, dt), dy = pair_rand((size_t)N * C, 1, dt);
    struct pair dyp = pair_nan((size_t)N * C, dt), ds = pair_nan(N, DTYPE_FP32);
    backend_moe_combine(cpu, y.c, yp.c, s.c, no_dest, N, C, 1, true, true);
    backend_moe_combine(gpu, y.g, yp.g, s.g, no_dest, N, C, 1, true, true);
    expect_match(y, "moe_combine sigmoid gate");
    backend_moe_combine_backward(cpu, dyp.c, ds.c, dy.c, yp.c, s.c, no_dest, N, C, 1, true);
    backend_moe_combine_backward(gpu, dyp.g, ds.g, dy.g, yp.g, s.g, no_dest, N, C, 1, true);
    expect_match(dyp, "moe_combine_backward sigmoid gate");
    expect_match_tol(ds, dt == DTYPE_FP32 ? 1e-5 : 1e-4, "moe_combine_backward sigmoid gate ds");
    pair_free(s), pair_free(yp), pair_free(y), pair_free(dy), pair_free(dyp), pair_free(ds);
    pair_free(logits), pair_free(bias);
}

// small: the shapes the CPU emulation of the kernels can afford
// (tests/e2e/cuda_emulated.sh sets TEST_OPS_SMALL=1): one launch there is an
// OS thread per CUDA thread and a barrier per warp shuffle.
static void run_all(enum dtype dt, bool small) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_matmul(dt, dt, ta, tb, 33, 20, 17);
            test_matmul(dt, DTYPE_FP32, ta, tb, 9, 40, 13);
            if (small) continue;
            test_matmul(dt, dt, ta, tb, 150, 70, 40);
            test_matmul(dt, DTYPE_FP32, ta, tb, 40, 150, 70);
        }
    test_matmul(dt, dt, false, false, 5, 7, 0); // K = 0: out = beta * out
    // one row or one column of out (generation's one-token steps; the CPU's
    // GEMV path), every transpose
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_matmul(dt, dt, ta, tb, 1, 70, 40);
            test_matmul(dt, dt, ta, tb, 70, 1, 40);
        }
    // qkv_bias (model_pass.c): y (R, n) += ones (R, 1) @ b (1, n), a GEMM of
    // depth 1, and db (n,) += dy^T (n, R) @ ones (R, 1) into FP32 gradients
    test_matmul(dt, dt, false, false, 33, 20, 1);
    test_matmul(dt, dt == DTYPE_FP32 ? dt : DTYPE_FP32, true, false, 20, 1, 33);
    // more rows than a grid's y (and z) may have (65535): the fallback GEMM
    // kernel (TRIDENT_EMU_CUBLASLT=0) must not put one row per block there
    // (the emulation enforces CUDA's grid limits); its indexing is dtype-blind
    if (dt == DTYPE_FP32) test_matmul(dt, DTYPE_FP32, false, true, 65600, 3, 2);
    test_embedding(dt);
    test_rmsnorm(dt);
    test_rope_qkv(dt);
    test_rope(dt);
    test_swiglu(dt);
    // generation's attention against a cache: one token a row at different
    // positions (GQA, D a multiple of 32 and not), a step of several tokens
    const int32_t pos2[2] = {0, 29}, pos3[3] = {5, 0, 17};
    test_attention_decode(dt, 2, 1, 40, 4, 2, 64, pos2);
    test_attention_decode(dt, 3, 4, 24, 6, 3, 24, pos3);
    test_attention_decode(dt, 1, 1, 300, 2, 1, 256, (const int32_t[]){299});
    // tiled kernels: query blocks of 64 (32 at D = 256), key tiles of 32;
    // T = 257 and 1024 cross many tiles, T = 257 ends in a one-row tile
    test_attention(dt, 2, 37, 4, 2, 24);
    test_attention(dt, 1, 19, 2, 2, 80);
    test_attention(dt, 1, 33, 2, 1, 256);
    test_attention(dt, 1, 257, 4, 2, 64);
    test_attention(dt, 1, 257, 2, 1, 128);
    test_attention_qs(dt, 12, 1, 257, 2, 1, 64);
    test_attention(dt, 1, 1024, 2, 1, 64);
    test_attention(dt, 1, 1024, 2, 1, 128);
    if (!small) {
        test_attention(dt, 1, 70, 4, 4, 64);
        test_attention(dt, 2, 19, 6, 2, 80);
        test_attention(dt, 1, 257, 8, 2, 128);
        test_attention(dt, 2, 100, 4, 1, 256);
    }
    // packed documents: key tiles of earlier documents skipped, rows whose
    // first tiles hold no key of theirs, D buckets 32 and 128
    test_docs(dt, 3, 100, 4, 2, 24);
    test_docs(dt, 3, 150, 2, 1, 128);
    test_docs(dt, 2, 600, 4, 2, 64);
    // one block of ring attention: cp 2 and 4, the rank's own block (causal
    // chunks) and others' (whole chunks read or skipped), a key set of one
    // chunk (Tq != Tk), documents across chunks, GQA, D buckets 32 to 256
    test_attention_block(dt, 2, 64, 2, 0, 0, 2, false, false, 4, 2, 24, false);
    test_attention_block(dt, 2, 64, 2, 1, 0, 2, true, true, 4, 2, 24, false);
    test_attention_block(dt, 1, 256, 4, 1, 2, 2, false, true, 2, 1, 64, false);
    test_attention_block(dt, 1, 256, 4, 2, 1, 2, false, true, 4, 2, 128, true);
    test_attention_block(dt, 1, 256, 4, 2, 2, 2, true, false, 2, 2, 64, false);
    test_attention_block(dt, 2, 64, 2, 0, 1, 1, false, false, 4, 1, 40, false);
    test_attention_block(dt, 1, 64, 2, 1, 0, 1, true, true, 2, 2, 24, false);
    test_attention_block(dt, 1, 32, 2, 1, 1, 2, false, true, 2, 1, 256, false);
    test_cross_entropy(dt, 13, 70, 61, 100, 300);
    if (!small) test_cross_entropy(dt, 40, 5000, 4999, 5000, 10000);
    test_adamw(dt);
    test_elementwise(dt, small ? 3001 : 100003); // more than one block, not a multiple of 256
    test_elementwise(dt, 4096);                  // 16-byte vectors
    test_moe_ops(dt);
}

// ---- FP8 (kernels/ops.h "FP8") ------------------------------------------------------
// The CUDA backend's FP8 ops against the CPU backend's: fp8_cast's bytes,
// amax and saturation count, fp8_amax and fp8_update_scale bit for bit (a NaN
// equals any NaN), matmul_fp8 within FP32 summation order (FP32 out 1e-5,
// BF16 out tol_of). Inputs: every BF16 and FP16 bit pattern (NaN, inf,
// subnormals included), FP32 values over 50 binades with exact E4M3/E5M2
// ties, zeros, infinities, NaN, FP32 subnormals; scales 1, small, large and
// one that overflows FP32 (x * scale = inf for a finite x); the 16-byte
// vector path and the scalar one (odd n, x one element off). matmul_fp8: the
// four transposes (three need K-major copies: the transpose kernel), E4M3 x
// E4M3, E4M3 x E5M2, E5M2 x E4M3, BF16 and FP32 out, beta 0 and not; shapes
// multiples of 16 (cuBLASLt's FP8 path: the emulated cuBLASLt counts a GEMM
// unless TRIDENT_EMU_CUBLASLT=0) and not (the fallback kernel).

static uint32_t rnd_u32(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}

// n elements of dtype dt of raw bits h (NULL: 0xa5 bytes, a poison) on both backends.
struct rpair {
    struct tensor c, g;
};
static struct rpair rpair_make(const void *h, enum dtype dt, size_t n) {
    size_t bytes = n * dtype_size(dt);
    struct rpair p = {tensor_view(backend_alloc(cpu, bytes + 64), dt, n),
                      tensor_view(backend_alloc(gpu, bytes + 64), dt, n)};
    void *tmp = xmalloc(bytes + 1);
    if (h) memcpy(tmp, h, bytes);
    else memset(tmp, 0xa5, bytes);
    memcpy(p.c.data, tmp, bytes);
    backend_to_device(gpu, p.g.data, tmp, bytes);
    backend_synchronize(gpu);
    free(tmp);
    return p;
}
static void rpair_free(struct rpair p) {
    backend_dealloc(cpu, p.c.data);
    backend_dealloc(gpu, p.g.data);
}
// The GPU's bytes equal the CPU's; FP32 tensors: a NaN equals any NaN.
static void expect_same_bits(struct rpair p, const char *what) {
    size_t es = dtype_size(p.c.dtype), bytes = p.c.numel * es, bad = 0, first = 0;
    unsigned char *got = xmalloc(bytes + 1);
    backend_to_host(gpu, got, p.g.data, bytes);
    backend_synchronize(gpu);
    const unsigned char *want = p.c.data;
    for (size_t i = 0; i < p.c.numel; i++) {
        bool same = !memcmp(got + i * es, want + i * es, es);
        if (!same && p.c.dtype == DTYPE_FP32) {
            float a, b;
            memcpy(&a, got + i * es, 4), memcpy(&b, want + i * es, 4);
            same = isnan(a) && isnan(b);
        }
        if (!same && !bad++) first = i;
    }
    if (bad && es == 1)
        EXPECT(!bad, "%s: %zu of %zu bytes differ, first [%zu] gpu 0x%02x cpu 0x%02x", what, bad, p.c.numel, first,
               got[first], want[first]);
    else if (bad && es == 4) {
        float a, b;
        memcpy(&a, got + first * 4, 4), memcpy(&b, want + first * 4, 4);
        EXPECT(!bad, "%s: %zu of %zu differ, first [%zu] gpu %a cpu %a", what, bad, p.c.numel, first, (double)a,
               (double)b);
    } else EXPECT(!bad, "%s: %zu of %zu elements differ, first [%zu]", what, bad, p.c.numel, first);
    free(got);
}

// x (n,) of dtype dt: every bit pattern (BF16, FP16: n = 65536) or FP32
// samples (random binades 2^-30 .. 2^20, a quarter exact ties of E4M3 or
// E5M2, and the special values).
static void *fp8_inputs(enum dtype dt, size_t n, bool finite) {
    void *h = xmalloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) {
        if (dt != DTYPE_FP32) { // 16-bit: every pattern (finite: random finite ones)
            uint16_t v = (uint16_t)i;
            if (finite) {
                float f = (float)(rnd() * ldexp(1, (int)(rnd_u32() % 16) - 8));
                v = dt == DTYPE_BF16 ? f2bf(f) : fp16_from_f32(f);
            }
            ((uint16_t *)h)[i] = v;
            continue;
        }
        uint32_t r = rnd_u32(), sign = r & 0x80000000u, e = 127 - 30 + (rnd_u32() % 51), m = rnd_u32() & 0x7fffffu;
        if (r % 4 == 1) m = (m & 0x700000u) | 0x080000u; // an E4M3 tie at scale 1
        if (r % 4 == 2) m = (m & 0x600000u) | 0x100000u; // an E5M2 tie
        uint32_t u = sign | e << 23 | m;
        static const uint32_t special[] = {0, 0x80000000u, 0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u,
                                           0x00000123u, 0x43e00000u /* 448 */, 0x43e80000u /* 464 */,
                                           0x47600000u /* 57344 */, 0x47700000u /* 61440 */, 0x3b000000u,
                                           0x3a800000u /* 2^-10 */, 0x37800000u /* 2^-16 */};
        if (!finite && i < sizeof special / sizeof special[0]) u = special[i];
        if (finite && ((u >> 23) & 0xff) == 0xff) u = 0;
        memcpy((char *)h + i * 4, &u, 4);
    }
    return h;
}

static void test_fp8_cast_case(enum dtype dt, size_t n, bool finite, bool offset) {
    static const float scales[] = {1.0f, 0.0123f, 300.0f, 1e30f};
    void *h = fp8_inputs(dt, n, finite);
    struct rpair x = rpair_make(h, dt, n);
    struct tensor xc = x.c, xg = x.g;
    size_t m = n;
    if (offset) { // the scalar path: x not 16-byte aligned, odd count
        m = n - 2;
        xc = tensor_slice(x.c, 1, m), xg = tensor_slice(x.g, 1, m);
    }
    char what[160];
    for (int f = 0; f < 2; f++) {
        enum dtype fd = f ? DTYPE_FP8_E5M2 : DTYPE_FP8_E4M3;
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
            float a0 = 0.5f;
            int64_t s0 = 7;
            struct rpair out = rpair_make(NULL, fd, m), amax = rpair_make(&a0, DTYPE_FP32, 1);
            struct rpair sat = rpair_make(&s0, DTYPE_I64, 1), sc = rpair_make(&scales[si], DTYPE_FP32, 1);
            bool opt = si != 1; // one scale without the optional outputs
            struct tensor none = tensor_view(NULL, DTYPE_FP32, 0), nonei = tensor_view(NULL, DTYPE_I64, 0);
            backend_fp8_cast(cpu, out.c, opt ? amax.c : none, opt ? sat.c : nonei, xc, sc.c, m);
            backend_fp8_cast(gpu, out.g, opt ? amax.g : none, opt ? sat.g : nonei, xg, sc.g, m);
            snprintf(what, sizeof what, "fp8_cast %s -> %s n=%zu%s%s scale %g", dtype_name(dt), dtype_name(fd), m,
                     finite ? " finite" : "", offset ? " offset" : "", (double)scales[si]);
            expect_same_bits(out, what);
            char w2[200];
            snprintf(w2, sizeof w2, "%s: amax", what), expect_same_bits(amax, w2);
            snprintf(w2, sizeof w2, "%s: saturated", what), expect_same_bits(sat, w2);
            if (getenv("TEST_VERBOSE"))
                printf("  %s: amax %g saturated %lld\n", what, (double)*(float *)amax.c.data,
                       (long long)*(int64_t *)sat.c.data);
            rpair_free(out), rpair_free(amax), rpair_free(sat), rpair_free(sc);
        }
    }
    float a0 = 0.25f;
    struct rpair amax = rpair_make(&a0, DTYPE_FP32, 1);
    backend_fp8_amax(cpu, amax.c, xc, m);
    backend_fp8_amax(gpu, amax.g, xg, m);
    snprintf(what, sizeof what, "fp8_amax %s n=%zu%s%s", dtype_name(dt), m, finite ? " finite" : "",
             offset ? " offset" : "");
    expect_same_bits(amax, what);
    rpair_free(amax), rpair_free(x);
    free(h);
}

static void test_fp8_cast(void) {
    for (int d = 0; d < 3; d++) {
        enum dtype dt = d == 0 ? DTYPE_FP32 : d == 1 ? DTYPE_BF16 : DTYPE_FP16;
        test_fp8_cast_case(dt, 65536, false, false);
        test_fp8_cast_case(dt, 65536, false, true);
        test_fp8_cast_case(dt, 4096, true, false);
        test_fp8_cast_case(dt, 1003, true, true);
    }
}

// Two steps of the scale update for 6 tensors: amax 0 (scale kept), NaN,
// inf, a tiny one (FLT_MAX scale), normal ones; histories holding a NaN.
static void test_fp8_update_scale(void) {
    enum { n = 6 };
    const float amax0[n] = {0.0f, NAN, INFINITY, 1e-40f, 3.5f, 1234.5f};
    const float amax1[n] = {2.0f, 0.0f, 7.0f, 0.125f, NAN, 0.001f};
    for (int len = 0; len <= 5; len += 5)
        for (int mr = 0; mr < 2; mr++)
            for (int margin = 0; margin <= 2; margin += 2) {
                float scale[n], hist[n * 5];
                for (int i = 0; i < n; i++) scale[i] = (float)(1 + i);
                for (int i = 0; i < n * 5; i++) hist[i] = i % 7 == 3 ? NAN : (float)fabs(rnd()) * 100;
                struct rpair sc = rpair_make(scale, DTYPE_FP32, n), si = rpair_make(NULL, DTYPE_FP32, n);
                struct rpair h = rpair_make(hist, DTYPE_FP32, (size_t)n * len);
                for (int step = 0; step < 2; step++) {
                    struct rpair am = rpair_make(step ? amax1 : amax0, DTYPE_FP32, n);
                    backend_fp8_update_scale(cpu, sc.c, si.c, h.c, am.c, n, len, 448.0f, margin, mr);
                    backend_fp8_update_scale(gpu, sc.g, si.g, h.g, am.g, n, len, 448.0f, margin, mr);
                    char what[128];
                    snprintf(what, sizeof what, "fp8_update_scale len=%d most_recent=%d margin=%d step %d", len, mr,
                             margin, step);
                    char w2[160];
                    snprintf(w2, sizeof w2, "%s scale", what), expect_same_bits(sc, w2);
                    snprintf(w2, sizeof w2, "%s scale_inv", what), expect_same_bits(si, w2);
                    snprintf(w2, sizeof w2, "%s amax", what), expect_same_bits(am, w2);
                    if (len) snprintf(w2, sizeof w2, "%s history", what), expect_same_bits(h, w2);
                    rpair_free(am);
                }
                rpair_free(sc), rpair_free(si), rpair_free(h);
            }
}

// Random finite FP8 codes of dtype fd (n,), magnitudes up to 2^4 (E5M2: a
// few beyond E4M3's range), a tenth zeros.
static uint8_t *fp8_codes(enum dtype fd, size_t n) {
    uint8_t *c = xmalloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        uint32_t r = rnd_u32();
        uint8_t b = (uint8_t)(r & 0xff);
        if (fd == DTYPE_FP8_E4M3 && (b & 0x7f) > 0x5f) b &= 0xbf;     // |x| < 2^5 (no NaN)
        if (fd == DTYPE_FP8_E5M2 && (b & 0x7f) > 0x4f) b &= 0xbf;     // |x| < 2^5 (no inf, NaN)
        c[i] = (r >> 8) % 10 ? b : 0;
    }
    return c;
}

// off: a starts that many bytes into its buffer (1: not 16-byte aligned, so
// cuBLASLt's FP8 path is refused and the fallback runs).
static void test_fp8_matmul_off(enum dtype da, enum dtype db, enum dtype od, bool ta, bool tb, int M, int N, int K,
                                float beta, int off) {
    uint8_t *ha = fp8_codes(da, (size_t)M * K + off), *hb = fp8_codes(db, (size_t)K * N);
    struct rpair a0 = rpair_make(ha, da, (size_t)M * K + off), b = rpair_make(hb, db, (size_t)K * N);
    struct rpair a = {tensor_slice(a0.c, off, (size_t)M * K), tensor_slice(a0.g, off, (size_t)M * K)};
    const float sa_v = 0.0625f * 1.1f, sb_v = 3.0f;
    struct rpair sa = rpair_make(&sa_v, DTYPE_FP32, 1), sb = rpair_make(&sb_v, DTYPE_FP32, 1);
    struct pair out = beta != 0 ? pair_rand((size_t)M * N, 1, od) : pair_nan((size_t)M * N, od);
#ifdef TRIDENT_CUDA_EMU
    unsigned long long g0 = emu_stat("gemms");
#endif
    backend_matmul_fp8(cpu, out.c, a.c, b.c, sa.c, sb.c, M, N, K, ta, tb, beta);
    backend_matmul_fp8(gpu, out.g, a.g, b.g, sa.g, sb.g, M, N, K, ta, tb, beta);
    char what[160];
    snprintf(what, sizeof what, "matmul_fp8 %dx%dx%d ta=%d tb=%d %s x %s -> %s beta=%g%s", M, N, K, ta, tb,
             dtype_name(da), dtype_name(db), dtype_name(od), (double)beta, off ? " a misaligned" : "");
    // The CPU side's out.c is FP32 (its sum not rounded to BF16): a BF16 out
    // differs by the device's one rounding (tol_of). FP32 out: the emulated
    // cuBLASLt sums exactly in FP32 (1e-5: summation order); a GPU's FP8
    // tensor cores accumulate with fewer bits between promotions to FP32
    // (DeepSeek-V3 report, sec. 3.3.2: ~14 bits on H800), hence 2e-4 there.
#ifdef TRIDENT_CUDA_EMU
    expect_match(out, what);
#else
    expect_match_tol(out, od == DTYPE_FP32 ? 2e-4 : tol_of(od), what);
#endif
#ifdef TRIDENT_CUDA_EMU
    backend_synchronize(gpu);
    bool lt = !getenv("TRIDENT_EMU_CUBLASLT") || strcmp(getenv("TRIDENT_EMU_CUBLASLT"), "0");
    bool want = lt && M % 16 == 0 && N % 16 == 0 && K % 16 == 0 && off % 16 == 0;
    EXPECT((emu_stat("gemms") - g0 == 1) == want, "%s: %llu cuBLASLt GEMMs, expected %d", what,
           emu_stat("gemms") - g0, want);
#endif
    rpair_free(a0), rpair_free(b), rpair_free(sa), rpair_free(sb), pair_free(out);
    free(ha), free(hb);
}
static void test_fp8_matmul_case(enum dtype da, enum dtype db, enum dtype od, bool ta, bool tb, int M, int N, int K,
                                 float beta) {
    test_fp8_matmul_off(da, db, od, ta, tb, M, N, K, beta, 0);
}

static void test_fp8_matmul(void) {
    static const enum dtype ab[3][2] = {{DTYPE_FP8_E4M3, DTYPE_FP8_E4M3},
                                        {DTYPE_FP8_E4M3, DTYPE_FP8_E5M2},
                                        {DTYPE_FP8_E5M2, DTYPE_FP8_E4M3}};
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        test_fp8_matmul_case(DTYPE_FP8_E4M3, DTYPE_FP8_E4M3, DTYPE_BF16, ta, tb, 32, 48, 64, 0);
        test_fp8_matmul_case(DTYPE_FP8_E4M3, DTYPE_FP8_E5M2, DTYPE_FP32, ta, tb, 48, 16, 96, 1);
        test_fp8_matmul_case(DTYPE_FP8_E5M2, DTYPE_FP8_E4M3, DTYPE_BF16, ta, tb, 33, 20, 17, 0.5f);
    }
    for (int i = 0; i < 3; i++) {
        test_fp8_matmul_case(ab[i][0], ab[i][1], DTYPE_BF16, false, true, 64, 32, 160, 0.5f);
        test_fp8_matmul_case(ab[i][0], ab[i][1], DTYPE_FP32, true, false, 16, 80, 48, 0);
    }
    test_fp8_matmul_case(DTYPE_FP8_E4M3, DTYPE_FP8_E4M3, DTYPE_FP32, false, true, 5, 7, 0, 0.75f); // K = 0
    test_fp8_matmul_off(DTYPE_FP8_E4M3, DTYPE_FP8_E4M3, DTYPE_BF16, false, true, 32, 48, 64, 0, 1);
}

// backend_check_fp8: the emulated device's compute capability is
// TRIDENT_EMU_CC (default 9.0); below 8.9 it must be refused, naming the
// device; the CPU backend always passes.
static void test_fp8_check(void) {
    struct error err = {0};
    EXPECT(backend_check_fp8(cpu, &err) == STATUS_OK, "backend_check_fp8(cpu): %s", err.msg);
    const char *cc = getenv("TRIDENT_EMU_CC");
    int major = 9, minor = 0;
    if (cc) sscanf(cc, "%d.%d", &major, &minor);
    bool old = major * 10 + minor < 89;
    enum status st = backend_check_fp8(gpu, &err);
    if (old)
        EXPECT(st == STATUS_BAD_INPUT && strstr(err.msg, "device 0 (") && strstr(err.msg, "8.9 or newer"),
               "an old device (TRIDENT_EMU_CC=%s) must be refused naming it: status %d '%s'", cc, st, err.msg);
    else if (cc)
        EXPECT(st == STATUS_OK, "backend_check_fp8(cuda): status %d '%s'", st, err.msg);
    if (getenv("TEST_VERBOSE")) printf("  backend_check_fp8(cuda): %d %s\n", st, err.msg);
}

static void test_fp8(void) {
    test_fp8_check();
    test_fp8_cast();
    test_fp8_update_scale();
    test_fp8_matmul();
}

// cuDNN's attention graphs, built and finalised without a device against the
// cuDNN the build links (its own validation of every tensor and op): BF16 and
// FP16, forward and backward, H = Hkv and GQA; a head count that does not
// divide (H=4, Hkv=3) must be refused, naming the first matmul; and the graphs
// of ring-attention chunk pairs (strided views, causal or full, Tq != Tk).
// Skipped with the emulated cuDNN (TEST_OPS_CUDNN_ABSENT), which validates
// nothing.
static void test_cudnn_graphs(void) {
#ifdef TRIDENT_CUDA
    if (getenv("TEST_OPS_CUDNN_ABSENT")) return;
    static const int shapes[][5] = {{2, 37, 4, 2, 24}, {1, 257, 8, 8, 128}, {2, 1024, 16, 4, 64}, {1, 64, 2, 1, 256}};
    struct error err = {0};
    for (int i = 0; i < 2; i++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int bwd = 0; bwd < 2; bwd++) {
                const int *x = shapes[s];
                err = (struct error){0};
                EXPECT(!backend_cuda_attention_check_graph(i ? DTYPE_FP16 : DTYPE_BF16, x[0], x[1], x[2], x[3], x[4],
                                                           bwd, &err), "%s", err.msg);
            }
    // chunk pairs of ring-attention blocks: views of C rows of tensors of 2C
    // (or 3C) rows, causal (the same chunk) or full, Tq != Tk too
    static const int pairs[][9] = {{2, 32, 32, 64, 64, 4, 2, 24, 1}, {1, 512, 512, 1024, 1024, 8, 2, 128, 0},
                                   {1, 256, 512, 512, 768, 4, 4, 64, 0}, {2, 128, 128, 256, 256, 16, 4, 64, 1}};
    for (int i = 0; i < 2; i++)
        for (size_t s = 0; s < sizeof pairs / sizeof pairs[0]; s++)
            for (int bwd = 0; bwd < 2; bwd++) {
                const int *x = pairs[s];
                err = (struct error){0};
                EXPECT(!backend_cuda_attention_check_block_graph(i ? DTYPE_FP16 : DTYPE_BF16, x[0], x[1], x[2], x[3],
                                                                 x[4], x[5], x[6], x[7], x[8], bwd, &err),
                       "%s", err.msg);
            }
    err = (struct error){0};
    EXPECT(backend_cuda_attention_check_block_graph(DTYPE_BF16, 1, 16, 16, 32, 32, 4, 3, 64, false, false, &err) ==
                   STATUS_RUNTIME && strstr(err.msg, "Tq=16 Tk=16 of 32, 32 rows full"),
           "a chunk pair with H=4 Hkv=3 must be refused, naming the pair: '%s'", err.msg);
    err = (struct error){0};
    EXPECT(backend_cuda_attention_check_graph(DTYPE_BF16, 1, 16, 4, 3, 64, false, &err) == STATUS_RUNTIME &&
               strstr(err.msg, "bmm1"),
           "H=4 Hkv=3 must be refused at the first matmul: '%s'", err.msg);
#endif
}

int main(void) {
    struct error err = {0};
    if (!backend_has_cuda()) {
        struct backend *none = backend_init(BACKEND_CUDA, 0, 1, &err);
        EXPECT(!none && err.status == STATUS_BAD_INPUT &&
                   strstr(err.msg, "this build has no CUDA backend; rebuild with make CUDA=1"),
               "backend_init(cuda) in a CPU-only build: status %d, '%s'", err.status, err.msg);
        if (test_failures) return test_finish("test_ops_cuda");
        TEST_SKIP("no CUDA device (this build has no CUDA backend; make CUDA=1)");
    }
    test_cudnn_graphs(); // needs no device
    if (backend_device_count() == 0) {
        if (test_failures) return test_finish("test_ops_cuda");
        TEST_SKIP("no CUDA device");
    }
    gpu = backend_init(BACKEND_CUDA, 0, 0, &err);
    EXPECT(gpu != NULL, "backend_init(cuda, 0): %s", err.msg);
    if (!gpu) return test_finish("test_ops_cuda");
    cpu = backend_init(BACKEND_CPU, 0, 0, &err);
    EXPECT(!strcmp(gpu->ops->name, "cuda") && !strcmp(cpu->ops->name, "cpu"), "backend names %s, %s",
           gpu->ops->name, cpu->ops->name);
    bool small = getenv("TEST_OPS_SMALL") != NULL;
    const char *am = getenv("TEST_OPS_ATTENTION");
    test_attention_choice();
    if (am && !strcmp(am, "cudnn")) { // tests/gpu/run.sh: cuDNN attention only
        attn_mode = BACKEND_ATTENTION_CUDNN;
        for (int i = 0; i < 2; i++) {
            enum dtype dt = i ? DTYPE_FP16 : DTYPE_BF16;
            test_attention(dt, 2, 37, 4, 2, 24);
            test_attention(dt, 1, 70, 4, 4, 64);
            test_attention(dt, 2, 19, 6, 2, 80);
            test_attention(dt, 1, 257, 8, 2, 128);
            test_attention(dt, 2, 1024, 8, 8, 64);
            // ring-attention blocks per chunk pair: the rank's own block
            // (causal pairs and a full one), another rank's (full pairs or
            // skipped), one key chunk (Tq != Tk), GQA, accumulate
            test_attention_block(dt, 2, 1024, 2, 0, 0, 2, false, false, 8, 2, 64, false);
            test_attention_block(dt, 1, 2048, 4, 2, 1, 2, false, true, 8, 8, 128, false);
            test_attention_block(dt, 1, 2048, 4, 1, 3, 2, false, true, 4, 1, 128, false);
            test_attention_block(dt, 2, 1024, 2, 1, 0, 1, false, true, 8, 2, 64, false);
        }
        backend_free(gpu);
        backend_free(cpu);
        return test_finish("test_ops_cuda");
    }
    bool fp8_only = getenv("TEST_OPS_FP8_ONLY") != NULL;
    if (!fp8_only) {
        test_uploads();
        run_all(DTYPE_FP32, small);
        run_all(DTYPE_BF16, small);
        run_all(DTYPE_FP16, small);
    }
    // FP8 (ops.h "FP8") last, so that a cuBLASLt FP8 failure on a GPU (fatal)
    // cannot hide the other ops' results; needs compute capability 8.9 or
    // newer for the GEMMs (the emulation is unless TRIDENT_EMU_CC says not).
    struct error ferr = {0};
    if (!backend_check_fp8(gpu, &ferr)) test_fp8();
    else test_fp8_check(), printf("  FP8 ops not tested: %s\n", ferr.msg);
    backend_free(gpu);
    backend_free(cpu);
    return test_finish("test_ops_cuda");
}

// test_ops_lowp.c: every op of the CPU backend with BF16 and FP16 storage
// against the same op in FP64 (itself checked against naive loops in
// test_ops_cpu.c) on the same inputs: random values rounded to the 16-bit
// dtype, so both runs see identical numbers.
//
// Tolerances (relative error ||got - ref|| / ||ref||, see test.h):
//   - outputs stored in BF16 / FP16: u = 2^-8 (3.9e-3) / 2^-11 (4.9e-4), the
//     unit roundoff of 8 / 11 significant bits: one rounding of a value
//     computed in FP32 is within u of it element by element. And at least
//     98% of their elements must equal the FP64 result rounded to nearest
//     even (the rest: FP32 compute error next to a halfway point), so
//     truncation, double rounding or skipped rounding fails;
//   - FP32 outputs of 16-bit inputs (statistics rstd, lse, row max,
//     partials; FP32 matmul out; dw, dwte; master weights, moments): 1e-5;
//   - a BF16/FP16 dwte rounds once per row added: 2u.
// A kernel that accumulated in BF16/FP16 (a GEMM over K = 300, a row sum over
// C = 300, dk/dv over heads and blocks) is off by many u and fails.
// Outputs are NaN-poisoned before each call (an unwritten element fails);
// "+=" outputs start from random values. Also: the conversions of half.h on
// every 16-bit pattern and at the rounding boundaries, copy between every
// pair of float dtypes bit-exact, BF16 matmul through oneDNN and through the
// FP32 fallback, and the BF16 GEMM speed is not checked here (bench_ops).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"
#include "test.h"

#define TOL_F32 1e-5
#define ROUNDED_FRACTION 0.98

static struct backend *be;
static uint64_t rng = 0x6a09e667f3bcc909ull;

static double rnd(void) { // uniform in [-1, 1)
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2 - 1;
}

static double unit_roundoff(enum dtype dt) { return dt == DTYPE_BF16 ? 0x1p-8 : 0x1p-11; }

// v rounded to dt (through FP32 for the 16-bit dtypes).
static double round_to(enum dtype dt, double v) {
    switch (dt) {
    case DTYPE_BF16: return bf16_to_f32(bf16_from_f32((float)v));
    case DTYPE_FP16: return fp16_to_f32(fp16_from_f32((float)v));
    case DTYPE_FP32: return (float)v;
    default: return v;
    }
}

static double get(struct tensor t, size_t i) {
    switch (t.dtype) {
    case DTYPE_BF16: return bf16_to_f32(((uint16_t *)t.data)[i]);
    case DTYPE_FP16: return fp16_to_f32(((uint16_t *)t.data)[i]);
    case DTYPE_FP32: return ((float *)t.data)[i];
    default: return ((double *)t.data)[i];
    }
}

static void set(struct tensor t, size_t i, double v) {
    switch (t.dtype) {
    case DTYPE_BF16: ((uint16_t *)t.data)[i] = bf16_from_f32((float)v); break;
    case DTYPE_FP16: ((uint16_t *)t.data)[i] = fp16_from_f32((float)v); break;
    case DTYPE_FP32: ((float *)t.data)[i] = (float)v; break;
    default: ((double *)t.data)[i] = v; break;
    }
}

// A tensor under test (lo: dtype dt) and its FP64 twin (hi) with equal values.
struct pair {
    struct tensor lo, hi;
};

static struct tensor alloc_t(enum dtype dt, size_t n) {
    struct tensor t = tensor_view(backend_alloc(be, n * dtype_size(dt) + 8), dt, n);
    EXPECT(t.data != NULL, "allocation of %zu elements", n);
    return t;
}

static struct pair pair_new(enum dtype dt, size_t n) {
    struct pair p = {alloc_t(dt, n), alloc_t(DTYPE_FP64, n)};
    return p;
}

// Random values in [-scale, scale), representable in dt.
static struct pair pair_rand(enum dtype dt, size_t n, double scale) {
    struct pair p = pair_new(dt, n);
    for (size_t i = 0; i < n; i++) {
        double v = round_to(dt, scale * rnd());
        set(p.lo, i, v), set(p.hi, i, v);
    }
    return p;
}

static struct pair pair_nan(enum dtype dt, size_t n) {
    struct pair p = pair_new(dt, n);
    for (size_t i = 0; i < n; i++) set(p.lo, i, NAN), set(p.hi, i, NAN);
    return p;
}

static void pair_free(struct pair p) {
    backend_dealloc(be, p.lo.data);
    backend_dealloc(be, p.hi.data);
}

// p.lo against p.hi: no NaN, relative error <= tol; for 16-bit p.lo also the
// fraction of elements equal to p.hi rounded to nearest even.
static void expect_close(struct pair p, double tol, const char *what, enum dtype dt) {
    size_t n = p.lo.numel, nan = 0, exact = 0;
    double *got = xmalloc(n * sizeof(double) + 8), *ref = xmalloc(n * sizeof(double) + 8);
    for (size_t i = 0; i < n; i++) {
        got[i] = get(p.lo, i), ref[i] = get(p.hi, i);
        nan += isnan(got[i]) || isnan(ref[i]);
        exact += got[i] == round_to(p.lo.dtype, ref[i]);
    }
    char msg[200];
    snprintf(msg, sizeof msg, "%s [%s run, %s out]", what, dtype_name(dt), dtype_name(p.lo.dtype));
    EXPECT(nan == 0, "%s: %zu of %zu elements NaN / unwritten", msg, nan, n);
    if (nan == 0) EXPECT_REL(n, got, ref, tol, msg);
    if (p.lo.dtype == DTYPE_BF16 || p.lo.dtype == DTYPE_FP16) {
        double frac = n ? (double)exact / n : 1;
        EXPECT(frac >= ROUNDED_FRACTION, "%s: %.4f of elements are the FP64 result rounded to nearest even, expected >= %.2f",
               msg, frac, ROUNDED_FRACTION);
    }
    free(got), free(ref);
}

// ---- conversions ------------------------------------------------------------------

// The 16-bit value of bits h as double (sign, exponent, mantissa by hand).
static double decode(enum dtype dt, uint16_t h) {
    int mbits = dt == DTYPE_BF16 ? 7 : 10, ebits = dt == DTYPE_BF16 ? 8 : 5;
    int bias = (1 << (ebits - 1)) - 1, e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1);
    double s = h & 0x8000 ? -1 : 1;
    if (e == (1 << ebits) - 1) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexp(m, 1 - bias - mbits);
    return s * ldexp(m + (1 << mbits), e - bias - mbits);
}

static uint16_t encode(enum dtype dt, float f) {
    return dt == DTYPE_BF16 ? bf16_from_f32(f) : fp16_from_f32(f);
}
static float widen(enum dtype dt, uint16_t h) {
    return dt == DTYPE_BF16 ? bf16_to_f32(h) : fp16_to_f32(h);
}

// f rounds to h: no representable value is nearer, a tie goes to the even
// mantissa, beyond the largest finite value's halfway point to inf.
static bool rounds_correctly(enum dtype dt, float f, uint16_t h) {
    double x = f, got = decode(dt, h);
    if (isnan(x)) return isnan(got);
    uint16_t maxfin = dt == DTYPE_BF16 ? 0x7f7f : 0x7bff;
    double top = decode(dt, maxfin), ulp_top = top - decode(dt, maxfin - 1);
    if (fabs(x) >= top + ulp_top / 2) return got == copysign(INFINITY, x);
    if (isinf(got) || signbit(got) != signbit(x)) return x == 0 && got == 0;
    double err = fabs(got - x);
    uint16_t mag = h & 0x7fff;
    for (int d = -1; d <= 1; d += 2) { // the neighbours of h on the same side of zero
        int nb = (int)mag + d;
        if (nb < 0 || nb > maxfin) continue;
        double other = decode(dt, (uint16_t)((h & 0x8000) | nb)), oerr = fabs(other - x);
        if (oerr < err) return false;
        if (oerr == err && (h & 1)) return false; // tie: even wins
    }
    return true;
}

static void test_conversions(enum dtype dt) {
    // every 16-bit pattern widens exactly and narrows back to itself (NaN: stays NaN)
    size_t bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double want = decode(dt, (uint16_t)h);
        float f = widen(dt, (uint16_t)h);
        if (isnan(want)) bad += !isnan(f) || !isnan(widen(dt, encode(dt, f)));
        else bad += (double)f != want || encode(dt, f) != h;
    }
    EXPECT(bad == 0, "%s: %zu of 65536 bit patterns do not round-trip", dtype_name(dt), bad);
    // random floats over the whole range, and the halfway points between neighbours
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)(rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17);
        float f;
        memcpy(&f, &u, 4);
        if (dt == DTYPE_FP16) f = ldexpf(1 + (float)rnd(), (int)(40 * rnd())) * (rnd() < 0 ? -1 : 1);
        bad += !rounds_correctly(dt, f, encode(dt, f));
    }
    for (uint32_t h = 0; h < 0x7c00 || (dt == DTYPE_BF16 && h < 0x7f80); h++) {
        float mid = (float)((decode(dt, (uint16_t)h) + decode(dt, (uint16_t)(h + 1))) / 2);
        bad += !rounds_correctly(dt, mid, encode(dt, mid));
        bad += !rounds_correctly(dt, -mid, encode(dt, -mid));
    }
    EXPECT(bad == 0, "%s: %zu floats not rounded to nearest even", dtype_name(dt), bad);
    EXPECT(encode(dt, 1 + 0x1p-9f) == encode(dt, 1.0f) || dt == DTYPE_FP16, "bf16: 1 + 2^-9 rounds to 1");
    if (dt == DTYPE_FP16) {
        EXPECT(fp16_from_f32(65519.99f) == 0x7bff && fp16_from_f32(65520.0f) == 0x7c00,
               "fp16 overflow boundary: %04x %04x", fp16_from_f32(65519.99f), fp16_from_f32(65520.0f));
        EXPECT(fp16_from_f32(0x1p-25f) == 0 && fp16_from_f32(0x1.8p-25f) == 1 &&
                   fp16_from_f32(0x1.8p-24f) == 2,
               "fp16 subnormal ties: %04x %04x %04x", fp16_from_f32(0x1p-25f),
               fp16_from_f32(0x1.8p-25f), fp16_from_f32(0x1.8p-24f));
    }
}

// copy between every pair of float dtypes: bit-exact against the host helpers.
static void test_copy(void) {
    enum dtype all[] = {DTYPE_FP32, DTYPE_FP64, DTYPE_BF16, DTYPE_FP16};
    size_t n = 3001;
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 4; d++) {
            struct tensor src = alloc_t(all[s], n), dst = alloc_t(all[d], n);
            for (size_t i = 0; i < n; i++) set(src, i, round_to(all[s], 300 * rnd() * rnd()));
            for (size_t i = 0; i < n; i++) set(dst, i, NAN);
            backend_copy(be, dst, src, n);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                double want = all[d] == DTYPE_FP64 ? get(src, i) : round_to(all[d], get(src, i));
                bad += get(dst, i) != want;
            }
            EXPECT(bad == 0, "copy %s -> %s: %zu of %zu elements not the rounded value",
                   dtype_name(all[s]), dtype_name(all[d]), bad, n);
            backend_dealloc(be, src.data), backend_dealloc(be, dst.data);
        }
}

// ---- ops ----------------------------------------------------------------------------

static bool use_invariant; // test_matmul runs backend_matmul_invariant on the dtype under test

static void test_matmul(enum dtype dt, enum dtype out_dt, bool ta, bool tb, int M, int N, int K,
                        const char *path) {
    struct pair a = pair_rand(dt, (size_t)M * K, 1), b = pair_rand(dt, (size_t)K * N, 1);
    double tol = out_dt == DTYPE_FP32 ? TOL_F32 : unit_roundoff(dt);
    for (int acc = 0; acc < 2; acc++) {
        struct pair out = acc ? pair_rand(out_dt, (size_t)M * N, 4) : pair_nan(out_dt, (size_t)M * N);
        float beta = acc ? 0.75f : 0;
        if (use_invariant)
            backend_matmul_invariant(be, out.lo, a.lo, b.lo, M, N, K, ta, tb, 0.5f, beta);
        else
            backend_matmul(be, out.lo, a.lo, b.lo, M, N, K, ta, tb, 0.5f, beta);
        backend_matmul(be, out.hi, a.hi, b.hi, M, N, K, ta, tb, 0.5f, beta);
        char what[128];
        snprintf(what, sizeof what, "matmul %s %dx%dx%d ta=%d tb=%d beta=%g", path, M, N, K, ta,
                 tb, beta);
        expect_close(out, tol, what, dt);
        pair_free(out);
    }
    pair_free(a), pair_free(b);
}

// backend_matmul_invariant's batch invariance: the rows of op(a) @ op(b)
// computed by calls of every M from 1 to 9 at every offset have the bits of
// the same rows of one call over all Mt rows (the layouts of generation's
// GEMMs: x @ W^T; W @ x^T, its columns; act^T^T @ W^T, a stored
// transposed), and a 4-bit tail of K (K = 300 = 9 x 32 + 12). Fails with
// backend_matmul on the oneDNN path (whose kernel depends on M).
static void test_matmul_invariance(enum dtype dt, enum dtype out_dt) {
    enum { Mt = 37, N = 45, K = 300 };
    struct pair x = pair_rand(dt, (size_t)Mt * K, 1), w = pair_rand(dt, (size_t)N * K, 1);
    struct tensor xt = alloc_t(dt, (size_t)K * Mt), full = alloc_t(out_dt, (size_t)Mt * N);
    struct tensor part = alloc_t(out_dt, (size_t)Mt * N), sub = alloc_t(dt, (size_t)K * 9);
    size_t es = dtype_size(dt), os = dtype_size(out_dt);
    for (int i = 0; i < Mt; i++) // xt (K, Mt) = x^T
        for (int k = 0; k < K; k++) set(xt, (size_t)k * Mt + i, get(x.lo, (size_t)i * K + k));
    for (int layout = 0; layout < 3; layout++) {
        // 0: out (M, N) = x (M, K) @ W^T; 1: out^T (N, M) = W @ x^T, compared by
        // columns; 2: x stored transposed (K, M)
        if (layout == 1)
            backend_matmul_invariant(be, full, w.lo, x.lo, N, Mt, K, false, true, 1, 0);
        else
            backend_matmul_invariant(be, full, layout ? xt : x.lo, w.lo, Mt, N, K, layout == 2, true, 1, 0);
        size_t bad = 0;
        for (int M = 1; M <= 9; M++)
            for (int i0 = 0; i0 + M <= Mt; i0 += 4) {
                if (layout == 0)
                    backend_matmul_invariant(be, part, tensor_slice(x.lo, (size_t)i0 * K, (size_t)M * K),
                                             w.lo, M, N, K, false, true, 1, 0);
                else if (layout == 1)
                    backend_matmul_invariant(be, part, w.lo, tensor_slice(x.lo, (size_t)i0 * K, (size_t)M * K),
                                             N, M, K, false, true, 1, 0);
                else { // sub (K, M) = columns i0 .. i0 + M of xt
                    for (int k = 0; k < K; k++)
                        memcpy((char *)sub.data + (size_t)k * M * es, (char *)xt.data + ((size_t)k * Mt + i0) * es, M * es);
                    backend_matmul_invariant(be, part, sub, w.lo, M, N, K, true, true, 1, 0);
                }
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        size_t g = layout == 1 ? (size_t)j * M + i : (size_t)i * N + j;
                        size_t f = layout == 1 ? (size_t)j * Mt + i0 + i : (size_t)(i0 + i) * N + j;
                        bad += memcmp((char *)part.data + g * os, (char *)full.data + f * os, os) != 0;
                    }
            }
        EXPECT(bad == 0, "matmul_invariant %s (out %s) layout %d: %zu elements differ from the "
               "%d-row call's", dtype_name(dt), dtype_name(out_dt), layout, bad, Mt);
    }
    pair_free(x), pair_free(w);
    backend_dealloc(be, xt.data), backend_dealloc(be, full.data);
    backend_dealloc(be, part.data), backend_dealloc(be, sub.data);
}

static void test_embedding(enum dtype dt) {
    int N = 9, C = 300, Vl = 6, vs = 12; // tokens outside [12, 18) belong to other shards
    int32_t tok[] = {12, 17, 3, 14, 18, 14, 12, 12, 30};
    struct tensor t = alloc_t(DTYPE_I32, N);
    memcpy(t.data, tok, sizeof tok);
    struct pair wte = pair_rand(dt, (size_t)Vl * C, 1), out = pair_nan(dt, (size_t)N * C);
    backend_embedding_forward(be, out.lo, wte.lo, t, N, C, vs, Vl);
    backend_embedding_forward(be, out.hi, wte.hi, t, N, C, vs, Vl);
    expect_close(out, unit_roundoff(dt), "embedding_forward", dt);
    for (int k = 0; k < 2; k++) { // dwte FP32, then of dt (rounded per row added)
        enum dtype gdt = k ? dt : DTYPE_FP32;
        struct pair dwte = pair_rand(gdt, (size_t)Vl * C, 1), dout = pair_rand(dt, (size_t)N * C, 1);
        backend_embedding_backward(be, dwte.lo, dout.lo, t, N, C, vs, Vl);
        backend_embedding_backward(be, dwte.hi, dout.hi, t, N, C, vs, Vl);
        double tol = k ? 2 * unit_roundoff(dt) : TOL_F32;
        // a repeated token rounds a 16-bit dwte more than once: only the norm is checked
        if (!k) expect_close(dwte, tol, "embedding_backward dwte", dt);
        else {
            double *got = xmalloc(dwte.lo.numel * 8), *ref = xmalloc(dwte.lo.numel * 8);
            for (size_t i = 0; i < dwte.lo.numel; i++) got[i] = get(dwte.lo, i), ref[i] = get(dwte.hi, i);
            char msg[96];
            snprintf(msg, sizeof msg, "embedding_backward dwte [%s]", dtype_name(dt));
            EXPECT_REL(dwte.lo.numel, got, ref, tol, msg);
            free(got), free(ref);
        }
        pair_free(dwte), pair_free(dout);
    }
    pair_free(wte), pair_free(out);
    backend_dealloc(be, t.data);
}

static void test_rmsnorm(enum dtype dt) {
    int N = 37, C = 300;
    struct pair x = pair_rand(dt, (size_t)N * C, 2), w = pair_rand(dt, C, 1);
    struct pair y = pair_nan(dt, (size_t)N * C);
    struct tensor rstd = alloc_t(DTYPE_FP32, N), rstd64 = alloc_t(DTYPE_FP64, N);
    for (int i = 0; i < N; i++) set(rstd, i, NAN);
    backend_rmsnorm_forward(be, y.lo, rstd, x.lo, w.lo, N, C, 1e-5f);
    backend_rmsnorm_forward(be, y.hi, rstd64, x.hi, w.hi, N, C, 1e-5f);
    expect_close(y, unit_roundoff(dt), "rmsnorm_forward y", dt);
    expect_close((struct pair){rstd, rstd64}, TOL_F32, "rmsnorm_forward rstd", dt);
    // backward from the same (FP32-rounded) rstd; dx += in dt, dw += in FP32 and in dt
    for (int i = 0; i < N; i++) set(rstd64, i, get(rstd, i));
    for (int k = 0; k < 2; k++) {
        enum dtype gdt = k ? dt : DTYPE_FP32;
        struct pair dy = pair_rand(dt, (size_t)N * C, 1), dx = pair_rand(dt, (size_t)N * C, 1);
        struct pair dw = pair_rand(gdt, C, 1);
        backend_rmsnorm_backward(be, dx.lo, dw.lo, dy.lo, x.lo, w.lo, rstd, N, C);
        backend_rmsnorm_backward(be, dx.hi, dw.hi, dy.hi, x.hi, w.hi, rstd64, N, C);
        expect_close(dx, unit_roundoff(dt), "rmsnorm_backward dx", dt);
        expect_close(dw, k ? unit_roundoff(dt) : TOL_F32, "rmsnorm_backward dw", dt);
        pair_free(dy), pair_free(dx), pair_free(dw);
    }
    pair_free(x), pair_free(w), pair_free(y);
    backend_dealloc(be, rstd.data), backend_dealloc(be, rstd64.data);
}

static void test_rope(enum dtype dt) {
    int B = 2, T = 9, Hx = 3, D = 16, pos = 5, Tmax = pos + T, half = D / 2;
    struct tensor cs = alloc_t(DTYPE_FP32, (size_t)Tmax * half), sn = alloc_t(DTYPE_FP32, (size_t)Tmax * half);
    struct tensor cs64 = alloc_t(DTYPE_FP64, (size_t)Tmax * half), sn64 = alloc_t(DTYPE_FP64, (size_t)Tmax * half);
    rope_table_fill(cs.data, sn.data, Tmax, D, 10000.0);
    for (size_t i = 0; i < (size_t)Tmax * half; i++) set(cs64, i, get(cs, i)), set(sn64, i, get(sn, i));
    for (int inverse = 0; inverse < 2; inverse++) {
        struct pair x = pair_rand(dt, (size_t)B * T * Hx * D, 1);
        if (inverse) {
            backend_rope_backward(be, x.lo, cs, sn, B, T, Hx, D, pos);
            backend_rope_backward(be, x.hi, cs64, sn64, B, T, Hx, D, pos);
        } else {
            backend_rope_forward(be, x.lo, cs, sn, B, T, Hx, D, pos);
            backend_rope_forward(be, x.hi, cs64, sn64, B, T, Hx, D, pos);
        }
        expect_close(x, unit_roundoff(dt), inverse ? "rope_backward" : "rope_forward", dt);
        pair_free(x);
    }
    backend_dealloc(be, cs.data), backend_dealloc(be, sn.data);
    backend_dealloc(be, cs64.data), backend_dealloc(be, sn64.data);
}

static void test_swiglu(enum dtype dt) {
    size_t n = 1000;
    struct pair g = pair_rand(dt, n, 4), u = pair_rand(dt, n, 2), out = pair_nan(dt, n);
    backend_swiglu_forward(be, out.lo, g.lo, u.lo, n);
    backend_swiglu_forward(be, out.hi, g.hi, u.hi, n);
    expect_close(out, unit_roundoff(dt), "swiglu_forward", dt);
    struct pair d = pair_rand(dt, n, 1), dg = pair_nan(dt, n), du = pair_nan(dt, n);
    backend_swiglu_backward(be, dg.lo, du.lo, d.lo, g.lo, u.lo, n);
    backend_swiglu_backward(be, dg.hi, du.hi, d.hi, g.hi, u.hi, n);
    expect_close(dg, unit_roundoff(dt), "swiglu_backward dgate", dt);
    expect_close(du, unit_roundoff(dt), "swiglu_backward dup", dt);
    pair_free(g), pair_free(u), pair_free(out), pair_free(d), pair_free(dg), pair_free(du);
}

// T > 64 spans several score blocks; GQA sums dk, dv over query heads.
static void test_attention(enum dtype dt, int B, int T, int H, int Hkv, int D) {
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * H * T;
    struct pair q = pair_rand(dt, nq, 1), k = pair_rand(dt, nk, 1), v = pair_rand(dt, nk, 1);
    struct pair out = pair_nan(dt, nq);
    struct tensor lse = alloc_t(DTYPE_FP32, nl), lse64 = alloc_t(DTYPE_FP64, nl);
    for (size_t i = 0; i < nl; i++) set(lse, i, NAN);
    char what[128];
    snprintf(what, sizeof what, "attention B=%d T=%d H=%d Hkv=%d D=%d", B, T, H, Hkv, D);
    backend_attention_forward(be, out.lo, lse, q.lo, k.lo, v.lo, B, T, H, Hkv, D);
    backend_attention_forward(be, out.hi, lse64, q.hi, k.hi, v.hi, B, T, H, Hkv, D);
    char w2[160];
    snprintf(w2, sizeof w2, "%s forward out", what), expect_close(out, unit_roundoff(dt), w2, dt);
    snprintf(w2, sizeof w2, "%s forward lse", what);
    expect_close((struct pair){lse, lse64}, TOL_F32, w2, dt);
    // backward from the 16-bit out and the FP32 lse on both sides
    for (size_t i = 0; i < nq; i++) set(out.hi, i, get(out.lo, i));
    for (size_t i = 0; i < nl; i++) set(lse64, i, get(lse, i));
    struct pair dout = pair_rand(dt, nq, 1), dq = pair_nan(dt, nq);
    struct pair dk = pair_nan(dt, nk), dv = pair_nan(dt, nk);
    backend_attention_backward(be, dq.lo, dk.lo, dv.lo, dout.lo, q.lo, k.lo, v.lo, out.lo, lse, B,
                               T, H, Hkv, D);
    backend_attention_backward(be, dq.hi, dk.hi, dv.hi, dout.hi, q.hi, k.hi, v.hi, out.hi, lse64,
                               B, T, H, Hkv, D);
    snprintf(w2, sizeof w2, "%s backward dq", what), expect_close(dq, unit_roundoff(dt), w2, dt);
    snprintf(w2, sizeof w2, "%s backward dk", what), expect_close(dk, unit_roundoff(dt), w2, dt);
    snprintf(w2, sizeof w2, "%s backward dv", what), expect_close(dv, unit_roundoff(dt), w2, dt);
    pair_free(q), pair_free(k), pair_free(v), pair_free(out), pair_free(dout), pair_free(dq),
        pair_free(dk), pair_free(dv);
    backend_dealloc(be, lse.data), backend_dealloc(be, lse64.data);
}

// One vocab shard [vs, vs + Vl) of V classes with Vvalid real columns; targets
// inside and outside the shard, and every 7th row ignored.
static void test_cross_entropy(enum dtype dt, int N, int Vl, int Vvalid, int vs, int V) {
    int ign = -100;
    float s = 0.1f;
    struct tensor t = alloc_t(DTYPE_I32, N);
    for (int i = 0; i < N; i++)
        ((int32_t *)t.data)[i] = i % 7 == 3 ? ign : i % 2 ? vs + (i * 37) % Vvalid : (i * 7919) % V;
    struct pair z = pair_rand(dt, (size_t)N * Vl, 4), mx = pair_nan(DTYPE_FP32, N);
    backend_ce_row_max(be, mx.lo, z.lo, N, Vl, Vvalid);
    backend_ce_row_max(be, mx.hi, z.hi, N, Vl, Vvalid);
    expect_close(mx, TOL_F32, "ce_row_max", dt);
    struct pair part = pair_nan(DTYPE_FP32, (size_t)N * 3);
    backend_ce_partials(be, part.lo, z.lo, mx.lo, t, N, Vl, Vvalid, vs);
    backend_ce_partials(be, part.hi, z.hi, mx.hi, t, N, Vl, Vvalid, vs);
    expect_close(part, TOL_F32, "ce_partials", dt);
    struct pair loss = pair_nan(DTYPE_FP32, N), lse = pair_nan(DTYPE_FP32, N);
    backend_ce_loss(be, loss.lo, lse.lo, part.lo, mx.lo, t, N, V, s, ign);
    backend_ce_loss(be, loss.hi, lse.hi, part.hi, mx.hi, t, N, V, s, ign);
    expect_close(loss, TOL_F32, "ce_loss loss", dt);
    expect_close(lse, TOL_F32, "ce_loss lse", dt);
    for (int i = 0; i < N; i++) set(lse.hi, i, get(lse.lo, i)); // the same FP32 lse
    struct pair dz = pair_nan(dt, (size_t)N * Vl);
    backend_ce_backward(be, dz.lo, z.lo, lse.lo, t, N, Vl, Vvalid, vs, V, s, ign, 1.0 / N);
    backend_ce_backward(be, dz.hi, z.hi, lse.hi, t, N, Vl, Vvalid, vs, V, s, ign, 1.0 / N);
    expect_close(dz, unit_roundoff(dt), "ce_backward", dt);
    // in place (dlogits = logits, as the model's recompute modes run it): the same bits
    struct pair zd = pair_new(dt, (size_t)N * Vl);
    memcpy(zd.lo.data, z.lo.data, (size_t)N * Vl * dtype_size(dt));
    memcpy(zd.hi.data, z.hi.data, (size_t)N * Vl * sizeof(double));
    backend_ce_backward(be, zd.lo, zd.lo, lse.lo, t, N, Vl, Vvalid, vs, V, s, ign, 1.0 / N);
    backend_ce_backward(be, zd.hi, zd.hi, lse.hi, t, N, Vl, Vvalid, vs, V, s, ign, 1.0 / N);
    EXPECT(!memcmp(zd.lo.data, dz.lo.data, (size_t)N * Vl * dtype_size(dt)) &&
               !memcmp(zd.hi.data, dz.hi.data, (size_t)N * Vl * sizeof(double)),
           "ce_backward [%s] in place differs from out of place", dtype_name(dt));
    pair_free(z), pair_free(mx), pair_free(part), pair_free(loss), pair_free(lse), pair_free(dz),
        pair_free(zd);
    backend_dealloc(be, t.data);
}

// AdamW on FP32 master weights of a 16-bit param against FP64 AdamW on the
// same values: master, m, v FP32; param the master rounded.
static void test_adamw(enum dtype dt) {
    size_t n = 777;
    struct pair p = pair_rand(dt, n, 1), g = pair_rand(DTYPE_FP32, n, 1);
    struct pair m = pair_rand(DTYPE_FP32, n, 0.1), v = pair_rand(DTYPE_FP32, n, 0.1);
    struct pair master = pair_new(DTYPE_FP32, n);
    for (size_t i = 0; i < n; i++) {
        set(v.lo, i, fabs(get(v.lo, i))), set(v.hi, i, fabs(get(v.hi, i)));
        set(master.lo, i, get(p.lo, i)), set(master.hi, i, get(p.lo, i));
    }
    struct tensor none = tensor_view(NULL, DTYPE_FP32, 0), none64 = tensor_view(NULL, DTYPE_FP64, 0);
    for (int step = 1; step <= 3; step++) {
        backend_adamw(be, p.lo, master.lo, g.lo, m.lo, v.lo, n, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5, step);
        backend_adamw(be, master.hi, none64, g.hi, m.hi, v.hi, n, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0.5, step);
    }
    (void)none;
    expect_close(master, TOL_F32, "adamw master", dt);
    expect_close(m, TOL_F32, "adamw m", dt);
    expect_close(v, TOL_F32, "adamw v", dt);
    // the param is the FP32 master rounded once
    for (size_t i = 0; i < n; i++) set(p.hi, i, get(master.lo, i));
    expect_close(p, unit_roundoff(dt), "adamw param", dt);
    pair_free(p), pair_free(g), pair_free(m), pair_free(v), pair_free(master);
}

static void test_elementwise(enum dtype dt, size_t n) {
    struct pair x = pair_rand(dt, n, 3), y = pair_rand(dt, n, 1), o = pair_nan(dt, n);
    double ref = 0;
    for (size_t i = 0; i < n; i++) ref += get(x.hi, i) * get(x.hi, i);
    double got = backend_sum_squares(be, x.lo, n);
    EXPECT(fabs(got - ref) <= 1e-12 * ref, "sum_squares (%s): %.17g, host fp64 %.17g",
           dtype_name(dt), got, ref);
    backend_add(be, o.lo, x.lo, y.lo, n), backend_add(be, o.hi, x.hi, y.hi, n);
    expect_close(o, unit_roundoff(dt), "add", dt);
    backend_add(be, x.lo, x.lo, y.lo, n), backend_add(be, x.hi, x.hi, y.hi, n);
    expect_close(x, unit_roundoff(dt), "add in place", dt);
    pair_free(x), pair_free(y), pair_free(o);
}

static void run_all(enum dtype dt) {
    struct cpu_backend *cpu = be->impl;
    bool onednn = cpu->bf16_gemm;
    for (int path = 0; path < 2; path++) {
        // path 0: as the backend chose (oneDNN for BF16 where it can); 1: the FP32 fallback
        if (path == 1 && !(dt == DTYPE_BF16 && onednn)) break;
        cpu->bf16_gemm = path == 0 && onednn;
        const char *name = dt == DTYPE_BF16 && cpu->bf16_gemm ? "onednn" : "fp32-fallback";
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                test_matmul(dt, dt, ta, tb, 33, 20, 17, name);
                test_matmul(dt, DTYPE_FP32, ta, tb, 40, 150, 70, name);
                test_matmul(dt, dt, ta, tb, 64, 48, 300, name); // K = 300: FP32 sums needed
            }
        test_matmul(dt, dt, false, false, 5, 7, 0, name); // K = 0: out = beta * out
    }
    cpu->bf16_gemm = onednn;
    // the batch-invariant product (generation's): the same checks, and its invariance
    use_invariant = true;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_matmul(dt, dt, ta, tb, 33, 20, 17, "invariant");
            test_matmul(dt, DTYPE_FP32, ta, tb, 40, 150, 70, "invariant");
            test_matmul(dt, dt, ta, tb, 64, 48, 300, "invariant");
        }
    test_matmul(dt, dt, false, false, 5, 7, 0, "invariant");
    use_invariant = false;
    test_matmul_invariance(dt, dt);
    test_matmul_invariance(dt, DTYPE_FP32);
    test_embedding(dt);
    test_rmsnorm(dt);
    test_rope(dt);
    test_swiglu(dt);
    test_attention(dt, 2, 37, 4, 2, 24);
    test_attention(dt, 1, 150, 4, 2, 32); // 3 score blocks, 2 query heads per kv head
    test_cross_entropy(dt, 13, 70, 61, 100, 300);
    test_cross_entropy(dt, 20, 3000, 2999, 3000, 6000);
    test_adamw(dt);
    test_elementwise(dt, 10007);
}

int main(void) {
    be = backend_cpu_init(0);
    printf("bf16 matmul: %s\n", ((struct cpu_backend *)be->impl)->bf16_gemm
                                    ? "oneDNN matmul primitives (CPU has AVX512_BF16)"
                                    : "FP32 fallback (no AVX512_BF16 or no oneDNN)");
    test_conversions(DTYPE_BF16);
    test_conversions(DTYPE_FP16);
    test_copy();
    run_all(DTYPE_BF16);
    run_all(DTYPE_FP16);
    backend_free(be);
    // the serial kernels (one thread) on the same checks
    be = backend_cpu_init(1);
    run_all(DTYPE_BF16);
    run_all(DTYPE_FP16);
    for (int d = 0; d < 2; d++) { // and the invariant product's FP32 and FP64 bodies
        enum dtype dt = d ? DTYPE_FP64 : DTYPE_FP32;
        test_matmul_invariance(dt, dt);
        use_invariant = true;
        test_matmul(dt, dt, true, false, 64, 48, 300, "invariant");
        test_matmul(dt, dt, false, true, 33, 20, 17, "invariant");
        use_invariant = false;
    }
    backend_free(be);
    return test_finish("test_ops_lowp");
}

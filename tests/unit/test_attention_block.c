// test_attention_block.c: the block ops of context-parallel ring attention
// (backend_attention_block_forward / _backward, kernels/ops.h) on the CPU
// backend against the whole-sequence attention op of the same backend.
//   - The ring schedule of ring_schedule.h (load-balanced chunks, cp = 2 and
//     4, every rank's q against every rank's k/v in ring order, forward with
//     accumulate, backward accumulating dq and the travelling dk, dv),
//     reassembled, equals backend_attention_forward_docs / _backward_docs of
//     the whole sequence: FP64 <= 1e-12, FP32 <= 1e-6 relative; BF16 / FP16
//     against the FP64 op on the same rounded inputs within a few units of
//     roundoff; plain causal and with documents crossing chunk boundaries;
//     GQA (H 4, Hkv 2); T 256, and T 200 (FP64, FP32: chunks of 50 and 25
//     tokens, no multiple of the 64-row tiles).
//   - A block with no readable key (keys all after the queries, or all
//     before the queries' documents) is skipped: with NaN keys and values it
//     leaves out, lse (accumulate) and dq, dk, dv bit for bit as they were;
//     without accumulate it writes out 0, lse -inf.
//   - Key tiles that no query of a query tile can read are skipped, not
//     computed and masked: NaN in such keys does not reach the outputs.
//   - accumulate merges: two half-blocks merged, in either order, equal the
//     one block.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/ops.h"
#include "ring_schedule.h"
#include "test.h"

static struct backend *be;
static uint64_t rng = 0x3c6ef372fe94f82bull;

static double rnd(void) { // uniform in [-1, 1)
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2 - 1;
}

static double round_to(enum dtype dt, double v) {
    switch (dt) {
    case DTYPE_BF16: return bf16_to_f32(bf16_from_f32((float)v));
    case DTYPE_FP16: return fp16_to_f32(fp16_from_f32((float)v));
    case DTYPE_FP32: return (float)v;
    default: return v;
    }
}

static double *rand_host(enum dtype dt, size_t n, double scale) {
    double *x = xmalloc(n * sizeof *x + 8);
    for (size_t i = 0; i < n; i++) x[i] = round_to(dt, scale * rnd());
    return x;
}

// Document starts (B, T): row b's documents begin at the listed positions
// (chosen to cross the chunk boundaries of cp = 2 and 4 at T = 256 and 200;
// those past T do not start).
static double *doc_starts(int B, int T) {
    static const int starts[2][6] = {{0, 37, 100, 101, 180, 250}, {0, 64, 65, 150, 200, 255}};
    double *ds = xmalloc((size_t)B * T * sizeof *ds);
    for (int b = 0; b < B; b++) {
        int cur = 0;
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < 6; i++)
                if (starts[b % 2][i] == t) cur = t;
            ds[(size_t)b * T + t] = cur;
        }
    }
    return ds;
}

// The ring at cp ranks in dtype dt against the whole-sequence op: in dt for
// FP32 / FP64 (tol), in FP64 on dt-rounded inputs for BF16 / FP16.
static void check_ring(enum dtype dt, int T, int cp, bool docs, double tol_out, double tol_grad) {
    int B = 2, H = 4, Hkv = 2, D = 16;
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * H * T;
    double *q = rand_host(dt, nq, 1.5), *k = rand_host(dt, nk, 1.5), *v = rand_host(dt, nk, 1);
    double *dout = rand_host(dt, nq, 1), *ds = docs ? doc_starts(B, T) : NULL;
    struct ring_io io = {B, T, H, Hkv, D, q, k, v, dout, ds,
                         xmalloc(nq * 8), xmalloc(nl * 8), xmalloc(nq * 8), xmalloc(nk * 8),
                         xmalloc(nk * 8)};
    ring_attention_run(be, dt, cp, &io);

    enum dtype rt = dt == DTYPE_FP32 ? DTYPE_FP32 : DTYPE_FP64; // the reference's dtype
    enum dtype st = rt == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32;
    struct tensor tq = ring_upload(be, rt, q, nq), tk = ring_upload(be, rt, k, nk);
    struct tensor tv = ring_upload(be, rt, v, nk), tdo = ring_upload(be, rt, dout, nq);
    struct tensor to = ring_upload(be, rt, io.out, nq), tl = ring_upload(be, st, io.lse, nl);
    struct tensor tdq = ring_upload(be, rt, io.out, nq), tdk = ring_upload(be, rt, io.dk, nk);
    struct tensor tdv = ring_upload(be, rt, io.dk, nk);
    struct tensor tds = ds ? ring_upload(be, DTYPE_I32, ds, (size_t)B * T) : tensor_view(NULL, DTYPE_I32, 0);
    backend_attention_forward_docs(be, to, tl, tq, tk, tv, tds, B, T, H, Hkv, D);
    backend_attention_backward_docs(be, tdq, tdk, tdv, tdo, tq, tk, tv, to, tl, tds, B, T, H, Hkv,
                                    D);
    double *ro = xmalloc(nq * 8), *rl = xmalloc(nl * 8), *rdq = xmalloc(nq * 8);
    double *rdk = xmalloc(nk * 8), *rdv = xmalloc(nk * 8);
    ring_download(be, ro, to), ring_download(be, rl, tl), ring_download(be, rdq, tdq);
    ring_download(be, rdk, tdk), ring_download(be, rdv, tdv);
    char what[120];
#define CMP(n, got, ref, tol, name)                                                        \
    snprintf(what, sizeof what, "%s T %d cp %d %s: %s", dtype_name(dt), T, cp,             \
             docs ? "docs" : "causal", name);                                               \
    EXPECT_REL(n, got, ref, tol, what)
    CMP(nq, io.out, ro, tol_out, "out");
    CMP(nl, io.lse, rl, dt == DTYPE_FP64 ? tol_out : 1e-6, "lse");
    CMP(nq, io.dq, rdq, tol_grad, "dq");
    CMP(nk, io.dk, rdk, tol_grad, "dk");
    CMP(nk, io.dv, rdv, tol_grad, "dv");
#undef CMP
    struct tensor all[] = {tq, tk, tv, tdo, to, tl, tdq, tdk, tdv, tds};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) backend_dealloc(be, all[i].data);
    free(q), free(k), free(v), free(dout), free(ds);
    free(io.out), free(io.lse), free(io.dq), free(io.dk), free(io.dv);
    free(ro), free(rl), free(rdq), free(rdk), free(rdv);
}

static bool same_bits(struct tensor a, const void *host) {
    return memcmp(a.data, host, a.numel * dtype_size(a.dtype)) == 0;
}

// positions (B, n) I32 = first + t, or the listed runs.
static struct tensor positions(int B, int n, int first) {
    double *p = xmalloc((size_t)B * n * sizeof *p);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++) p[(size_t)b * n + t] = first + t;
    struct tensor t = ring_upload(be, DTYPE_I32, p, (size_t)B * n);
    free(p);
    return t;
}

// A block with no readable key is skipped: NaN k, v leave every output's bits
// as they were (accumulate) or write out 0, lse -inf (no accumulate).
static void check_masked_block(enum dtype dt, bool docs) {
    int B = 2, Tq = 64, Tk = 64, H = 4, Hkv = 2, D = 16;
    enum dtype st = dt == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32;
    size_t nq = (size_t)B * Tq * H * D, nk = (size_t)B * Tk * Hkv * D, nl = (size_t)B * H * Tq;
    double *hq = rand_host(dt, nq, 1), *nan = xmalloc(nk * sizeof *nan);
    for (size_t i = 0; i < nk; i++) nan[i] = NAN;
    // docs: queries at [128, 192) in a document from 100, keys at [0, 64);
    // causal: queries at [0, 64), keys at [64, 128).
    struct tensor qpos = positions(B, Tq, docs ? 128 : 0), kpos = positions(B, Tk, docs ? 0 : 64);
    struct tensor qdoc = docs ? positions(B, Tq, 0) : tensor_view(NULL, DTYPE_I32, 0);
    if (docs)
        for (size_t i = 0; i < (size_t)B * Tq; i++) ((int32_t *)qdoc.data)[i] = 100;
    struct tensor q = ring_upload(be, dt, hq, nq), k = ring_upload(be, dt, nan, nk);
    struct tensor v = ring_upload(be, dt, nan, nk), out = ring_upload(be, dt, hq, nq);
    struct tensor dout = ring_upload(be, dt, hq, nq), dq = ring_upload(be, dt, hq, nq);
    struct tensor dk = ring_upload(be, dt, hq, nk), dv = ring_upload(be, dt, hq, nk);
    struct tensor lse = ring_upload(be, st, hq, nl);
    size_t bq = nq * dtype_size(dt), bk = nk * dtype_size(dt), bl = nl * dtype_size(st);
    void *o0 = xmalloc(bq), *l0 = xmalloc(bl), *dq0 = xmalloc(bq), *dk0 = xmalloc(bk), *dv0 = xmalloc(bk);
    memcpy(o0, out.data, bq), memcpy(l0, lse.data, bl), memcpy(dq0, dq.data, bq);
    memcpy(dk0, dk.data, bk), memcpy(dv0, dv.data, bk);
    const char *m = docs ? "keys before the documents" : "keys after the queries";
    backend_attention_block_forward(be, out, lse, q, k, v, qpos, qdoc, kpos, B, Tq, Tk, H, Hkv, D,
                                    true);
    EXPECT(same_bits(out, o0) && same_bits(lse, l0), "%s %s: accumulate changed out / lse",
           dtype_name(dt), m);
    backend_attention_block_backward(be, dq, dk, dv, dout, q, k, v, out, lse, qpos, qdoc, kpos, B,
                                     Tq, Tk, H, Hkv, D);
    EXPECT(same_bits(dq, dq0) && same_bits(dk, dk0) && same_bits(dv, dv0),
           "%s %s: backward changed dq / dk / dv", dtype_name(dt), m);
    backend_attention_block_forward(be, out, lse, q, k, v, qpos, qdoc, kpos, B, Tq, Tk, H, Hkv, D,
                                    false);
    double *ho = xmalloc(nq * 8), *hl = xmalloc(nl * 8);
    ring_download(be, ho, out), ring_download(be, hl, lse);
    size_t bad = 0;
    for (size_t i = 0; i < nq; i++) bad += ho[i] != 0 || signbit(ho[i]);
    for (size_t i = 0; i < nl; i++) bad += hl[i] != -INFINITY;
    EXPECT(bad == 0, "%s %s: %zu elements of out / lse not 0 / -inf without accumulate",
           dtype_name(dt), m, bad);
    struct tensor all[] = {qpos, kpos, qdoc, q, k, v, out, dout, dq, dk, dv, lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) backend_dealloc(be, all[i].data);
    free(hq), free(nan), free(o0), free(l0), free(dq0), free(dk0), free(dv0), free(ho), free(hl);
}

// Key tiles unreadable by a whole query tile are skipped: queries at [0, c)
// against keys [0, c) and [3c, 4c) (rank 0's two chunks at cp 2, T 4c), the
// second run NaN; outputs equal the block of the first run alone. Likewise
// with documents: queries at [2c, 3c) of a document from 2c, keys [0, c) NaN
// and [2c, 3c). c = 64: a run is a tile; c = 32: both runs fit in one
// 64-key tile, which must end at the jump in positions.
static void check_tile_skip(enum dtype dt, bool docs, int c) {
    int B = 1, Tq = c, Tk = 2 * c, H = 2, Hkv = 1, D = 16;
    enum dtype st = dt == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32;
    size_t nq = (size_t)B * Tq * H * D, nk = (size_t)B * Tk * Hkv * D, nl = (size_t)B * H * Tq;
    double *hq = rand_host(dt, nq, 1), *hk = rand_host(dt, nk, 1), *hv = rand_host(dt, nk, 1);
    double *hkn = xmalloc(nk * 8), *hvn = xmalloc(nk * 8), *hkp = xmalloc(Tk * 8);
    double *hqp = xmalloc(Tq * 8), *hqd = xmalloc(Tq * 8);
    int live = docs ? c : 0; // the first key row of the readable run
    for (int t = 0; t < Tk; t++) hkp[t] = docs ? (t < c ? t : c + t) : (t < c ? t : 2 * c + t);
    for (int t = 0; t < Tq; t++) hqp[t] = docs ? 2 * c + t : t, hqd[t] = docs ? 2 * c : 0;
    for (size_t i = 0; i < nk; i++) {
        bool dead = (int)(i / ((size_t)Hkv * D)) < live || (int)(i / ((size_t)Hkv * D)) >= live + c;
        hkn[i] = dead ? NAN : hk[i], hvn[i] = dead ? NAN : hv[i];
    }
    struct tensor q = ring_upload(be, dt, hq, nq), k = ring_upload(be, dt, hkn, nk);
    struct tensor v = ring_upload(be, dt, hvn, nk), kpos = ring_upload(be, DTYPE_I32, hkp, Tk);
    struct tensor qpos = ring_upload(be, DTYPE_I32, hqp, Tq);
    struct tensor qdoc = docs ? ring_upload(be, DTYPE_I32, hqd, Tq) : tensor_view(NULL, DTYPE_I32, 0);
    // the readable run alone
    size_t off = (size_t)live * Hkv * D, nk1 = nk / 2;
    struct tensor k1 = ring_upload(be, dt, hk + off, nk1), v1 = ring_upload(be, dt, hv + off, nk1);
    struct tensor kpos1 = ring_upload(be, DTYPE_I32, hkp + live, c);
    struct tensor out = ring_upload(be, dt, hq, nq), lse = ring_upload(be, st, hq, nl);
    struct tensor out1 = ring_upload(be, dt, hq, nq), lse1 = ring_upload(be, st, hq, nl);
    struct tensor dq = ring_upload(be, dt, hq, nq), dq1 = ring_upload(be, dt, hq, nq);
    struct tensor dk = ring_upload(be, dt, hk, nk), dv = ring_upload(be, dt, hv, nk);
    struct tensor dk1 = ring_upload(be, dt, hk + off, nk1), dv1 = ring_upload(be, dt, hv + off, nk1);
    backend_attention_block_forward(be, out, lse, q, k, v, qpos, qdoc, kpos, B, Tq, Tk, H, Hkv, D,
                                    false);
    backend_attention_block_forward(be, out1, lse1, q, k1, v1, qpos, qdoc, kpos1, B, Tq, c, H, Hkv,
                                    D, false);
    backend_attention_block_backward(be, dq, dk, dv, q, q, k, v, out, lse, qpos, qdoc, kpos, B, Tq,
                                     Tk, H, Hkv, D);
    backend_attention_block_backward(be, dq1, dk1, dv1, q, q, k1, v1, out1, lse1, qpos, qdoc, kpos1,
                                     B, Tq, c, H, Hkv, D);
    double *a = xmalloc(nk * 8), *b = xmalloc(nk * 8);
    const char *m = docs ? "docs" : "causal";
#define SAME(t, t1, n, what)                                                                   \
    do {                                                                                       \
        ring_download(be, a, t1);                                                              \
        double *full_ = xmalloc((t).numel * 8);                                                \
        ring_download(be, full_, t);                                                           \
        memcpy(b, full_ + (n == nk1 ? off : 0), (size_t)(n) * 8);                              \
        size_t nan_ = 0;                                                                       \
        for (size_t i_ = 0; i_ < (t).numel; i_++) nan_ += isnan(full_[i_]);                    \
        EXPECT(nan_ == 0, "%s %s tile skip, runs of %d: %zu NaN in %s", dtype_name(dt), m, c, nan_, what);   \
        EXPECT_REL(n, b, a, 1e-6, what);                                                       \
        free(full_);                                                                           \
    } while (0)
    SAME(out, out1, nq, "out");
    SAME(lse, lse1, nl, "lse");
    SAME(dq, dq1, nq, "dq");
    SAME(dk, dk1, nk1, "dk");
    SAME(dv, dv1, nk1, "dv");
#undef SAME
    struct tensor all[] = {q, k, v, kpos, qpos, qdoc, k1, v1, kpos1, out, lse, out1, lse1,
                           dq, dq1, dk, dv, dk1, dv1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) backend_dealloc(be, all[i].data);
    free(hq), free(hk), free(hv), free(hkn), free(hvn), free(hkp), free(hqp), free(hqd), free(a), free(b);
}

// accumulate merges: one block of keys [0, 128) equals the blocks [0, 64)
// and [64, 128) merged, in either order (queries at [32, 160) of a
// document from 20 when docs: rows whose keys all lie in one half have the
// other half empty).
static void check_merge(enum dtype dt, bool docs, double tol) {
    int B = 1, Tq = 128, Tk = 128, H = 4, Hkv = 2, D = 16, half = Tk / 2;
    enum dtype st = dt == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32;
    size_t nq = (size_t)B * Tq * H * D, nk = (size_t)B * Tk * Hkv * D, nl = (size_t)B * H * Tq;
    double *hq = rand_host(dt, nq, 1.5), *hk = rand_host(dt, nk, 1.5), *hv = rand_host(dt, nk, 1);
    struct tensor q = ring_upload(be, dt, hq, nq), k = ring_upload(be, dt, hk, nk);
    struct tensor v = ring_upload(be, dt, hv, nk), kpos = positions(B, Tk, 0);
    struct tensor qpos = positions(B, Tq, 32);
    struct tensor qdoc = docs ? positions(B, Tq, 0) : tensor_view(NULL, DTYPE_I32, 0);
    if (docs)
        for (int t = 0; t < Tq; t++) ((int32_t *)qdoc.data)[t] = 20;
    double *ref = xmalloc(nq * 8), *refl = xmalloc(nl * 8), *got = xmalloc(nq * 8), *gotl = xmalloc(nl * 8);
    struct tensor out = ring_upload(be, dt, hq, nq), lse = ring_upload(be, st, hq, nl);
    backend_attention_block_forward(be, out, lse, q, k, v, qpos, qdoc, kpos, B, Tq, Tk, H, Hkv, D,
                                    false);
    ring_download(be, ref, out), ring_download(be, refl, lse);
    size_t hk_elems = (size_t)half * Hkv * D;
    for (int order = 0; order < 2; order++) {
        for (int i = 0; i < 2; i++) {
            int part = order ? 1 - i : i; // which half of the keys
            struct tensor kp = tensor_slice(k, part * hk_elems, hk_elems);
            struct tensor vp = tensor_slice(v, part * hk_elems, hk_elems);
            struct tensor pp = tensor_slice(kpos, (size_t)part * half, half);
            backend_attention_block_forward(be, out, lse, q, kp, vp, qpos, qdoc, pp, B, Tq, half, H,
                                            Hkv, D, i > 0);
        }
        ring_download(be, got, out), ring_download(be, gotl, lse);
        char what[120];
        snprintf(what, sizeof what, "%s %s merge of two halves, %s half first: out", dtype_name(dt),
                 docs ? "docs" : "causal", order ? "upper" : "lower");
        EXPECT_REL(nq, got, ref, tol, what);
        snprintf(what + strlen(what) - 3, 4, "lse");
        EXPECT_REL(nl, gotl, refl, tol, what);
    }
    struct tensor all[] = {q, k, v, kpos, qpos, qdoc, out, lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) backend_dealloc(be, all[i].data);
    free(hq), free(hk), free(hv), free(ref), free(refl), free(got), free(gotl);
}

int main(void) {
    be = backend_cpu_init(0);
    static const enum dtype dts[] = {DTYPE_FP64, DTYPE_FP32, DTYPE_BF16, DTYPE_FP16};
    for (int docs = 0; docs <= 1; docs++)
        for (int cp = 2; cp <= 4; cp += 2) {
            check_ring(DTYPE_FP64, 256, cp, docs, 1e-12, 1e-12);
            check_ring(DTYPE_FP32, 256, cp, docs, 1e-6, 1e-6);
            check_ring(DTYPE_BF16, 256, cp, docs, 4 * 0x1p-8, 8 * 0x1p-8);
            check_ring(DTYPE_FP16, 256, cp, docs, 4 * 0x1p-11, 8 * 0x1p-11);
            // chunks of 50 and 25 tokens: tiles of no multiple of 64
            check_ring(DTYPE_FP64, 200, cp, docs, 1e-12, 1e-12);
            check_ring(DTYPE_FP32, 200, cp, docs, 1e-6, 1e-6);
        }
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++)
        for (int docs = 0; docs <= 1; docs++) {
            check_masked_block(dts[i], docs);
            check_tile_skip(dts[i], docs, 64);
            check_tile_skip(dts[i], docs, 32); // both runs in one 64-key tile: split at the jump
        }
    for (int docs = 0; docs <= 1; docs++) {
        check_merge(DTYPE_FP64, docs, 1e-13);
        check_merge(DTYPE_FP32, docs, 1e-6);
        check_merge(DTYPE_BF16, docs, 2 * 0x1p-8);
    }
    backend_free(be);
    return test_finish("test_attention_block");
}

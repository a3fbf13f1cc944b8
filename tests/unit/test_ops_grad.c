// test_ops_grad.c: finite-difference checks of every backward pass of the CPU
// backend in FP64. For an op with output out, the scalar L = sum(w * out) with
// fixed random weights w has dL/dout = w; the analytic gradient the backward
// op computes from w is compared with central differences of L,
// (L(x + eps) - L(x - eps)) / (2 eps), over every input element:
// ||fd - analytic|| / ||fd|| <= 1e-4. The ring-attention blocks
// (attention_block_forward with accumulate, then attention_block_backward of
// each block) are checked the same way on a two-block ring.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/ops.h"
#include "test.h"

#define EPS 1e-6
#define TOL 1e-4

static struct backend *be;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

// Uniform in [-1, 1) (xorshift64*).
static double rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2 - 1;
}

static double *vec(size_t n) { // random, freed at exit
    double *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = rnd();
    return p;
}
static double *zeros(size_t n) { return calloc(n, sizeof(double)); }
static struct tensor t64(double *p, size_t n) { return tensor_view(p, DTYPE_FP64, n); }
static struct tensor ti32(int32_t *p, size_t n) { return tensor_view(p, DTYPE_I32, n); }

static double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// fd (n,) = central differences of loss(ctx) with respect to x (n,).
static void fd_grad(double (*loss)(void *), void *ctx, double *x, size_t n, double *fd) {
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + EPS;
        double lp = loss(ctx);
        x[i] = x0 - EPS;
        double lm = loss(ctx);
        x[i] = x0;
        fd[i] = (lp - lm) / (2 * EPS);
    }
}

static void check_grad(double (*loss)(void *), void *ctx, double *x, size_t n,
                       const double *analytic, const char *what) {
    double *fd = zeros(n);
    fd_grad(loss, ctx, x, n, fd);
    EXPECT_REL(n, analytic, fd, TOL, what);
    free(fd);
}

// ---- matmul ------------------------------------------------------------------

struct mm { double *out, *out0, *a, *b, *w; int M, N, K; bool ta, tb; double alpha, beta; };

static double mm_loss(void *p) {
    struct mm *c = p;
    memcpy(c->out, c->out0, sizeof(double) * c->M * c->N);
    backend_matmul(be, t64(c->out, c->M * c->N), t64(c->a, c->M * c->K), t64(c->b, c->K * c->N),
                   c->M, c->N, c->K, c->ta, c->tb, c->alpha, c->beta);
    return dot(c->w, c->out, (size_t)c->M * c->N);
}

// With G = dL/dout (M, N): d op(a) = alpha G op(b)^T, d op(b) = alpha op(a)^T G,
// written as matmuls of the stored a (M, K | K, M) and b (K, N | N, K).
static void test_matmul(bool ta, bool tb, double beta) {
    struct mm c = {.M = 3, .N = 4, .K = 5, .ta = ta, .tb = tb, .alpha = 0.75, .beta = beta};
    int M = c.M, N = c.N, K = c.K;
    c.a = vec(M * K), c.b = vec(K * N), c.w = vec(M * N), c.out0 = vec(M * N), c.out = zeros(M * N);
    double *da = zeros(M * K), *db = zeros(K * N);
    struct tensor G = t64(c.w, M * N), A = t64(c.a, M * K), Bt = t64(c.b, K * N);
    if (!ta) backend_matmul(be, t64(da, M * K), G, Bt, M, K, N, false, !tb, c.alpha, 0);
    else backend_matmul(be, t64(da, M * K), Bt, G, K, M, N, tb, true, c.alpha, 0);
    if (!tb) backend_matmul(be, t64(db, K * N), A, G, K, N, M, !ta, false, c.alpha, 0);
    else backend_matmul(be, t64(db, K * N), G, A, N, K, M, true, ta, c.alpha, 0);
    char what[80];
    snprintf(what, sizeof what, "matmul ta=%d tb=%d beta=%g: da", ta, tb, beta);
    check_grad(mm_loss, &c, c.a, M * K, da, what);
    snprintf(what, sizeof what, "matmul ta=%d tb=%d beta=%g: db", ta, tb, beta);
    check_grad(mm_loss, &c, c.b, K * N, db, what);
    // dL/dout0 = beta * w: the accumulate path really adds the old out
    double *dout0 = zeros(M * N);
    for (int i = 0; i < M * N; i++) dout0[i] = beta * c.w[i];
    if (beta != 0) {
        snprintf(what, sizeof what, "matmul ta=%d tb=%d beta=%g: dout0", ta, tb, beta);
        check_grad(mm_loss, &c, c.out0, M * N, dout0, what);
    }
    free(c.a), free(c.b), free(c.w), free(c.out0), free(c.out), free(da), free(db), free(dout0);
}

// ---- embedding -----------------------------------------------------------------

struct emb { double *out, *wte, *w; int32_t *tokens; int N, C, vocab_start, Vl; };

static double emb_loss(void *p) {
    struct emb *c = p;
    backend_embedding_forward(be, t64(c->out, c->N * c->C), t64(c->wte, c->Vl * c->C),
                              ti32(c->tokens, c->N), c->N, c->C, c->vocab_start, c->Vl);
    return dot(c->w, c->out, (size_t)c->N * c->C);
}

static void test_embedding(void) {
    // shard [4, 9) of the vocabulary; tokens 0, 2, 9 belong to other shards; 6 and 4 repeat
    int32_t tokens[] = {4, 8, 2, 6, 9, 6, 4, 0};
    struct emb c = {.N = 8, .C = 3, .vocab_start = 4, .Vl = 5, .tokens = tokens};
    c.wte = vec(c.Vl * c.C), c.w = vec(c.N * c.C), c.out = zeros(c.N * c.C);
    double *dwte = zeros(c.Vl * c.C);
    backend_embedding_backward(be, t64(dwte, c.Vl * c.C), t64(c.w, c.N * c.C), ti32(tokens, c.N),
                               c.N, c.C, c.vocab_start, c.Vl);
    check_grad(emb_loss, &c, c.wte, c.Vl * c.C, dwte, "embedding shard [4,9): dwte");
    free(c.wte), free(c.w), free(c.out), free(dwte);
}

// ---- rmsnorm ---------------------------------------------------------------------

struct rms { double *y, *rstd, *x, *g, *w; int N, C; };

static double rms_loss(void *p) {
    struct rms *c = p;
    backend_rmsnorm_forward(be, t64(c->y, c->N * c->C), t64(c->rstd, c->N), t64(c->x, c->N * c->C),
                            t64(c->g, c->C), c->N, c->C, 1e-5f);
    return dot(c->w, c->y, (size_t)c->N * c->C);
}

static void test_rmsnorm(void) {
    struct rms c = {.N = 3, .C = 7};
    int N = c.N, C = c.C;
    c.x = vec(N * C), c.g = vec(C), c.w = vec(N * C), c.y = zeros(N * C), c.rstd = zeros(N);
    double *dx = zeros(N * C), *dg = zeros(C);
    rms_loss(&c);
    backend_rmsnorm_backward(be, t64(dx, N * C), t64(dg, C), t64(c.w, N * C), t64(c.x, N * C),
                             t64(c.g, C), t64(c.rstd, N), N, C);
    check_grad(rms_loss, &c, c.x, N * C, dx, "rmsnorm: dx");
    check_grad(rms_loss, &c, c.g, C, dg, "rmsnorm: dw");
    free(c.x), free(c.g), free(c.w), free(c.y), free(c.rstd), free(dx), free(dg);
}

// ---- rope and attention ------------------------------------------------------------

enum { TMAX = 4096 };
static double *rope_cos, *rope_sin;

struct rope { double *x, *xr, *w; int B, T, Hx, D, pos; };

static double rope_loss(void *p) {
    struct rope *c = p;
    size_t n = (size_t)c->B * c->T * c->Hx * c->D;
    memcpy(c->xr, c->x, n * sizeof(double));
    backend_rope_forward(be, t64(c->xr, n), t64(rope_cos, TMAX * c->D / 2),
                         t64(rope_sin, TMAX * c->D / 2), c->B, c->T, c->Hx, c->D, c->pos);
    return dot(c->w, c->xr, n);
}

static void test_rope(void) {
    struct rope c = {.B = 2, .T = 3, .Hx = 2, .D = 8, .pos = 4092}; // positions 4092..4094
    size_t n = (size_t)c.B * c.T * c.Hx * c.D;
    c.x = vec(n), c.xr = zeros(n), c.w = vec(n);
    double *dx = zeros(n);
    memcpy(dx, c.w, n * sizeof(double));
    backend_rope_backward(be, t64(dx, n), t64(rope_cos, TMAX * c.D / 2),
                          t64(rope_sin, TMAX * c.D / 2), c.B, c.T, c.Hx, c.D, c.pos);
    check_grad(rope_loss, &c, c.x, n, dx, "rope at positions 4092..4094: dx");
    free(c.x), free(c.xr), free(c.w), free(dx);
}

// out = attention(rope(q), rope(k), v) at positions pos.., L = sum(w * out)
struct att { double *q, *k, *v, *qr, *kr, *out, *lse, *w; int B, T, H, Hkv, D, pos; };

static void att_forward(struct att *c) {
    size_t nq = (size_t)c->B * c->T * c->H * c->D, nk = (size_t)c->B * c->T * c->Hkv * c->D;
    struct tensor cs = t64(rope_cos, TMAX * c->D / 2), sn = t64(rope_sin, TMAX * c->D / 2);
    memcpy(c->qr, c->q, nq * sizeof(double));
    memcpy(c->kr, c->k, nk * sizeof(double));
    backend_rope_forward(be, t64(c->qr, nq), cs, sn, c->B, c->T, c->H, c->D, c->pos);
    backend_rope_forward(be, t64(c->kr, nk), cs, sn, c->B, c->T, c->Hkv, c->D, c->pos);
    backend_attention_forward(be, t64(c->out, nq), t64(c->lse, (size_t)c->B * c->H * c->T),
                              t64(c->qr, nq), t64(c->kr, nk), t64(c->v, nk), c->B, c->T, c->H,
                              c->Hkv, c->D);
}

static double att_loss(void *p) {
    struct att *c = p;
    att_forward(c);
    return dot(c->w, c->out, (size_t)c->B * c->T * c->H * c->D);
}

static void test_attention(int B, int T, int H, int Hkv, int D, int pos) {
    struct att c = {.B = B, .T = T, .H = H, .Hkv = Hkv, .D = D, .pos = pos};
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D;
    c.q = vec(nq), c.k = vec(nk), c.v = vec(nk), c.w = vec(nq);
    for (size_t i = 0; i < nq; i++) c.q[i] *= 2; // sharper softmax than uniform
    c.qr = zeros(nq), c.kr = zeros(nk), c.out = zeros(nq), c.lse = zeros((size_t)B * H * T);
    double *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk);
    att_forward(&c);
    backend_attention_backward(be, t64(dq, nq), t64(dk, nk), t64(dv, nk), t64(c.w, nq),
                               t64(c.qr, nq), t64(c.kr, nk), t64(c.v, nk), t64(c.out, nq),
                               t64(c.lse, (size_t)B * H * T), B, T, H, Hkv, D);
    struct tensor cs = t64(rope_cos, TMAX * D / 2), sn = t64(rope_sin, TMAX * D / 2);
    backend_rope_backward(be, t64(dq, nq), cs, sn, B, T, H, D, pos);
    backend_rope_backward(be, t64(dk, nk), cs, sn, B, T, Hkv, D, pos);
    char what[96];
    snprintf(what, sizeof what, "attention B=%d T=%d H=%d Hkv=%d D=%d pos=%d: dq", B, T, H, Hkv, D, pos);
    check_grad(att_loss, &c, c.q, nq, dq, what);
    what[strlen(what) - 1] = 'k';
    check_grad(att_loss, &c, c.k, nk, dk, what);
    what[strlen(what) - 1] = 'v';
    check_grad(att_loss, &c, c.v, nk, dv, what);
    free(c.q), free(c.k), free(c.v), free(c.w), free(c.qr), free(c.kr), free(c.out), free(c.lse);
    free(dq), free(dk), free(dv);
}

// ---- one block of ring attention ---------------------------------------------------
// The query rank of a cp = 2 ring at T = 96 (chunks of 24: rank 0 holds
// positions [0, 24) and [72, 96)) against its own k/v block, then rank 1's
// ([24, 72)): out, lse = block 1, merged with block 2 (accumulate);
// L = sum(w * out). The block backward of each (given the merged out, lse)
// summed must be dL/dq, and each block's dk, dv must be dL/dk, dL/dv of its
// keys. Rows [0, 24) read nothing in block 2 (its keys are later): the merge
// leaves them and their gradient takes nothing from it. docs: documents start
// at 0, 30, 70 and 80 (crossing both chunk boundaries).

enum { BLK_T = 96, BLK_TL = 48, BLK_H = 4, BLK_HKV = 2, BLK_D = 4 };

struct blk { double *q, *k[2], *v[2], *out, *lse, *w; int32_t qpos[BLK_TL], kpos[2][BLK_TL], qdoc[BLK_TL]; bool docs; };

static void blk_forward(struct blk *c) {
    size_t nq = (size_t)BLK_TL * BLK_H * BLK_D, nk = (size_t)BLK_TL * BLK_HKV * BLK_D;
    struct tensor qdoc = c->docs ? ti32(c->qdoc, BLK_TL) : ti32(NULL, 0);
    for (int s = 0; s < 2; s++)
        backend_attention_block_forward(be, t64(c->out, nq), t64(c->lse, (size_t)BLK_H * BLK_TL),
                                        t64(c->q, nq), t64(c->k[s], nk), t64(c->v[s], nk),
                                        ti32(c->qpos, BLK_TL), qdoc, ti32(c->kpos[s], BLK_TL), 1,
                                        BLK_TL, BLK_TL, BLK_H, BLK_HKV, BLK_D, s > 0);
}

static double blk_loss(void *p) {
    struct blk *c = p;
    blk_forward(c);
    return dot(c->w, c->out, (size_t)BLK_TL * BLK_H * BLK_D);
}

static void test_attention_block(bool docs) {
    struct blk c = {.docs = docs};
    size_t nq = (size_t)BLK_TL * BLK_H * BLK_D, nk = (size_t)BLK_TL * BLK_HKV * BLK_D;
    static const int starts[] = {0, 30, 70, 80};
    for (int t = 0; t < BLK_TL; t++) {
        int c0 = BLK_T / 4; // chunk size
        c.qpos[t] = c.kpos[0][t] = t < c0 ? t : 3 * c0 + t - c0;
        c.kpos[1][t] = c0 + t;
        c.qdoc[t] = 0;
        for (int i = 0; i < 4; i++)
            if (starts[i] <= c.qpos[t]) c.qdoc[t] = starts[i];
    }
    c.q = vec(nq), c.w = vec(nq), c.out = zeros(nq), c.lse = zeros((size_t)BLK_H * BLK_TL);
    for (size_t i = 0; i < nq; i++) c.q[i] *= 2; // sharper softmax than uniform
    double *dq = zeros(nq), *dk[2], *dv[2];
    for (int s = 0; s < 2; s++) c.k[s] = vec(nk), c.v[s] = vec(nk), dk[s] = zeros(nk), dv[s] = zeros(nk);
    blk_forward(&c);
    struct tensor qdoc = docs ? ti32(c.qdoc, BLK_TL) : ti32(NULL, 0);
    for (int s = 0; s < 2; s++)
        backend_attention_block_backward(be, t64(dq, nq), t64(dk[s], nk), t64(dv[s], nk),
                                         t64(c.w, nq), t64(c.q, nq), t64(c.k[s], nk),
                                         t64(c.v[s], nk), t64(c.out, nq),
                                         t64(c.lse, (size_t)BLK_H * BLK_TL), ti32(c.qpos, BLK_TL),
                                         qdoc, ti32(c.kpos[s], BLK_TL), 1, BLK_TL, BLK_TL, BLK_H,
                                         BLK_HKV, BLK_D);
    char what[96];
    const char *m = docs ? "documents" : "causal";
    snprintf(what, sizeof what, "attention_block %s: dq", m);
    check_grad(blk_loss, &c, c.q, nq, dq, what);
    for (int s = 0; s < 2; s++) {
        snprintf(what, sizeof what, "attention_block %s: dk of block %d", m, s);
        check_grad(blk_loss, &c, c.k[s], nk, dk[s], what);
        snprintf(what, sizeof what, "attention_block %s: dv of block %d", m, s);
        check_grad(blk_loss, &c, c.v[s], nk, dv[s], what);
    }
    for (int s = 0; s < 2; s++) free(c.k[s]), free(c.v[s]), free(dk[s]), free(dv[s]);
    free(c.q), free(c.w), free(c.out), free(c.lse), free(dq);
}

// ---- swiglu ---------------------------------------------------------------------------

struct sw { double *out, *gate, *up, *w; size_t n; };

static double sw_loss(void *p) {
    struct sw *c = p;
    backend_swiglu_forward(be, t64(c->out, c->n), t64(c->gate, c->n), t64(c->up, c->n), c->n);
    return dot(c->w, c->out, c->n);
}

static void test_swiglu(void) {
    struct sw c = {.n = 37};
    c.gate = vec(c.n), c.up = vec(c.n), c.w = vec(c.n), c.out = zeros(c.n);
    for (size_t i = 0; i < c.n; i++) c.gate[i] *= 6; // both tails of silu
    double *dg = zeros(c.n), *du = zeros(c.n);
    backend_swiglu_backward(be, t64(dg, c.n), t64(du, c.n), t64(c.w, c.n), t64(c.gate, c.n),
                            t64(c.up, c.n), c.n);
    check_grad(sw_loss, &c, c.gate, c.n, dg, "swiglu: dgate");
    check_grad(sw_loss, &c, c.up, c.n, du, "swiglu: dup");
    free(c.gate), free(c.up), free(c.w), free(c.out), free(dg), free(du);
}

// ---- cross-entropy ------------------------------------------------------------------

// A vocabulary of V real classes cut into shards of Vl columns; shard s holds
// global columns [s * Vl, s * Vl + Vvalid_s), the rest of its Vl is padding
// (NaN here: the kernels must never read it). The MAX and SUM all-reduces of
// tensor parallelism are done by hand between the pieces.
enum { CE_N = 6, CE_MAXSH = 2 };
static const int CE_IGNORE = -100;
static const float CE_SMOOTH = 0.1f;
static const double CE_SCALE = 0.25; // 1 / (non-ignored rows)

struct ce { double *logits[CE_MAXSH]; int32_t *targets; int nsh, Vl, V; double loss[CE_N], lse[CE_N]; };

static int ce_valid(const struct ce *c, int s) { return MIN(c->Vl, c->V - s * c->Vl); }

static double ce_loss_fn(void *p) {
    struct ce *c = p;
    double rm[CE_N], rms[CE_N], part[3 * CE_N] = {0}, ps[3 * CE_N];
    for (int i = 0; i < CE_N; i++) rm[i] = -INFINITY;
    for (int s = 0; s < c->nsh; s++) {
        backend_ce_row_max(be, t64(rms, CE_N), t64(c->logits[s], CE_N * c->Vl), CE_N, c->Vl,
                           ce_valid(c, s));
        for (int i = 0; i < CE_N; i++) rm[i] = fmax(rm[i], rms[i]);
    }
    for (int s = 0; s < c->nsh; s++) {
        backend_ce_partials(be, t64(ps, 3 * CE_N), t64(c->logits[s], CE_N * c->Vl), t64(rm, CE_N),
                            ti32(c->targets, CE_N), CE_N, c->Vl, ce_valid(c, s), s * c->Vl);
        for (int i = 0; i < 3 * CE_N; i++) part[i] += ps[i];
    }
    backend_ce_loss(be, t64(c->loss, CE_N), t64(c->lse, CE_N), t64(part, 3 * CE_N), t64(rm, CE_N),
                    ti32(c->targets, CE_N), CE_N, c->V, CE_SMOOTH, CE_IGNORE);
    double L = 0;
    for (int i = 0; i < CE_N; i++) L += CE_SCALE * c->loss[i];
    return L;
}

// Gradient of L with respect to the real logits of every shard; returns L.
static double test_ce(int nsh, int V, int32_t *targets, double **full_logits) {
    struct ce c = {.nsh = nsh, .V = V, .Vl = (V + nsh - 1) / nsh, .targets = targets};
    int Vl = c.Vl;
    for (int s = 0; s < nsh; s++) {
        c.logits[s] = malloc(sizeof(double) * CE_N * Vl);
        for (int i = 0; i < CE_N; i++)
            for (int j = 0; j < Vl; j++)
                c.logits[s][i * Vl + j] = j < ce_valid(&c, s) ? 3 * full_logits[i][s * Vl + j] : NAN;
    }
    double L = ce_loss_fn(&c);
    char what[128];
    for (int s = 0; s < nsh; s++) {
        int Vv = ce_valid(&c, s);
        ce_loss_fn(&c); // lse of the unperturbed logits
        double *dz = malloc(sizeof(double) * CE_N * Vl);
        backend_ce_backward(be, t64(dz, CE_N * Vl), t64(c.logits[s], CE_N * Vl), t64(c.lse, CE_N),
                            ti32(targets, CE_N), CE_N, Vl, Vv, s * Vl, V, CE_SMOOTH, CE_IGNORE,
                            CE_SCALE);
        // finite differences over the real columns; padding columns must get exactly 0
        double *an = zeros(CE_N * Vv), *fd = zeros(CE_N * Vv);
        int pad_ok = 1;
        for (int i = 0; i < CE_N; i++) {
            for (int j = 0; j < Vv; j++) {
                double *z = &c.logits[s][i * Vl + j], z0 = *z;
                *z = z0 + EPS;
                double lp = ce_loss_fn(&c);
                *z = z0 - EPS;
                double lm = ce_loss_fn(&c);
                *z = z0;
                fd[i * Vv + j] = (lp - lm) / (2 * EPS);
                an[i * Vv + j] = dz[i * Vl + j];
            }
            for (int j = Vv; j < Vl; j++) pad_ok &= dz[i * Vl + j] == 0;
        }
        snprintf(what, sizeof what, "cross-entropy %d shard(s), V=%d, shard %d (vocab_start %d): dlogits",
                 nsh, V, s, s * Vl);
        EXPECT_REL((size_t)CE_N * Vv, an, fd, TOL, what);
        EXPECT(pad_ok, "%s: padding columns not 0", what);
        free(dz), free(an), free(fd);
    }
    for (int s = 0; s < nsh; s++) free(c.logits[s]);
    for (int i = 0; i < CE_N; i++)
        if (targets[i] == CE_IGNORE) EXPECT(c.loss[i] == 0, "ignored row %d has loss %g", i, c.loss[i]);
    return L;
}

static void test_cross_entropy(void) {
    enum { V = 11 };
    double rows[CE_N][V], *full[CE_N];
    for (int i = 0; i < CE_N; i++) {
        for (int j = 0; j < V; j++) rows[i][j] = rnd();
        full[i] = rows[i];
    }
    // targets on both halves (shard 1 owns 6..10), two ignored rows
    int32_t targets[CE_N] = {3, 7, -100, 10, 0, -100};
    double L1 = test_ce(1, V, targets, full);
    double L2 = test_ce(2, V, targets, full); // Vl = 6: shard 1 has 5 real columns + 1 padding
    EXPECT(fabs(L1 - L2) <= 1e-12 * fabs(L1), "two shards give loss %.17g, one shard %.17g", L2, L1);
    EXPECT(isfinite(L1) && L1 > 0, "loss %g", L1);
}

int main(void) {
    // One thread: thousands of tiny calls, where OpenMP's fork/join on a loaded
    // machine costs more than the math; test_ops_cpu covers the threaded paths.
    be = backend_cpu_init(1);
    rope_cos = malloc(sizeof(double) * TMAX * 32);
    rope_sin = malloc(sizeof(double) * TMAX * 32);
    // D = 8 tables (the attention below uses D = 8 too); TMAX * 4 entries each
    rope_table_fill_f64(rope_cos, rope_sin, TMAX, 8, 10000.0);

    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_matmul(ta, tb, 0);
            test_matmul(ta, tb, 1);
        }
    test_embedding();
    test_rmsnorm();
    test_rope();
    test_attention(2, 5, 4, 2, 8, 4091); // GQA, 2 query heads per kv head, positions 4091..4095
    test_attention(2, 5, 4, 1, 8, 4091); // multi-query
    test_attention(1, 70, 2, 1, 8, 0);   // T > the kernel's 64-row block
    test_attention_block(false);
    test_attention_block(true);
    test_swiglu();
    test_cross_entropy();

    free(rope_cos), free(rope_sin);
    backend_free(be);
    return test_finish("test_ops_grad");
}

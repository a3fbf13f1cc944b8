// ops.c: the checked wrappers of kernels/ops.h. Each checks element counts and
// dtypes, optionally times the call (profile), then calls the backend's table.
#include "ops.h"

#include <stdlib.h>
#include <string.h>

#include "base/common.h"

size_t dtype_size(enum dtype dtype) {
    switch (dtype) {
    case DTYPE_FP32: return 4;
    case DTYPE_BF16: return 2;
    case DTYPE_FP16: return 2;
    case DTYPE_FP64: return 8;
    case DTYPE_I32: return 4;
    case DTYPE_I64: return 8;
    case DTYPE_FP8_E4M3: return 1;
    case DTYPE_FP8_E5M2: return 1;
    }
    return 0;
}

const char *dtype_name(enum dtype dtype) {
    switch (dtype) {
    case DTYPE_FP32: return "fp32";
    case DTYPE_BF16: return "bf16";
    case DTYPE_FP16: return "fp16";
    case DTYPE_FP64: return "fp64";
    case DTYPE_I32: return "i32";
    case DTYPE_I64: return "i64";
    case DTYPE_FP8_E4M3: return "fp8_e4m3";
    case DTYPE_FP8_E5M2: return "fp8_e5m2";
    }
    return "?";
}

struct tensor tensor_slice(struct tensor t, size_t offset, size_t numel) {
    CHECK(offset + numel <= t.numel, "slice [%zu, %zu) of a tensor of %zu elements", offset,
          offset + numel, t.numel);
    return tensor_view((char *)t.data + offset * dtype_size(t.dtype), t.dtype, numel);
}

// ---- profile ----------------------------------------------------------------

enum { PROFILE_MAX_OPS = 48 };
struct backend_profile {
    bool on;
    int n;
    const char *name[PROFILE_MAX_OPS];
    long calls[PROFILE_MAX_OPS];
    double seconds[PROFILE_MAX_OPS];
};

void backend_profile_enable(struct backend *be, bool on) {
    if (!be->profile) be->profile = xcalloc(1, sizeof *be->profile);
    be->profile->on = on;
}

static int profile_slot(struct backend_profile *p, const char *op) {
    for (int i = 0; i < p->n; i++)
        if (p->name[i] == op || !strcmp(p->name[i], op)) return i;
    CHECK(p->n < PROFILE_MAX_OPS, "too many ops to profile");
    p->name[p->n] = op;
    return p->n++;
}

void backend_profile_print(struct backend *be, FILE *f) {
    struct backend_profile *p = be->profile;
    if (!p || !p->n) return;
    int order[PROFILE_MAX_OPS];
    double total = 0;
    for (int i = 0; i < p->n; i++) order[i] = i, total += p->seconds[i];
    for (int i = 1; i < p->n; i++) // insertion sort, slowest first
        for (int j = i; j > 0 && p->seconds[order[j]] > p->seconds[order[j - 1]]; j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    fprintf(f, "  %-22s %8s %10s %7s\n", "op", "calls", "seconds", "share");
    for (int i = 0; i < p->n; i++) {
        int k = order[i];
        fprintf(f, "  %-22s %8ld %10.4f %6.1f%%\n", p->name[k], p->calls[k], p->seconds[k],
                total > 0 ? 100.0 * p->seconds[k] / total : 0.0);
    }
}

// Times the statement when profiling is on; op is a string literal.
#define PROFILED(be, op, stmt)                                                 \
    do {                                                                       \
        struct backend_profile *p_ = (be)->profile;                            \
        if (p_ && p_->on) {                                                    \
            double t0_ = time_now_s();                                         \
            stmt;                                                              \
            (be)->ops->synchronize(be);                                        \
            int k_ = profile_slot(p_, op);                                     \
            p_->calls[k_]++;                                                   \
            p_->seconds[k_] += time_now_s() - t0_;                             \
        } else {                                                               \
            stmt;                                                              \
        }                                                                      \
    } while (0)

// ---- checks -------------------------------------------------------------------

static void need(const char *op, const char *arg, struct tensor t, size_t numel) {
    if (t.numel < numel || (numel > 0 && !t.data))
        fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__,
                   "%s: tensor %s holds %zu elements%s, needs %zu", op, arg, t.numel,
                   t.data ? "" : " (no data)", numel);
}

static void same_dtype(const char *op, const char *arg, struct tensor t, enum dtype dtype) {
    if (t.dtype != dtype)
        fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s: tensor %s is %s, expected %s", op,
                   arg, dtype_name(t.dtype), dtype_name(dtype));
}

static bool is_fp8(enum dtype d) { return d == DTYPE_FP8_E4M3 || d == DTYPE_FP8_E5M2; }

// A float dtype the ops compute in (FP8 is only fp8_cast's and matmul_fp8's storage).
static bool is_float(enum dtype d) { return d != DTYPE_I32 && d != DTYPE_I64 && !is_fp8(d); }

// The dtype of saved statistics (rstd, lse, row max) for activations of dtype d.
static enum dtype stat_dtype(enum dtype d) { return d == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32; }

// A parameter gradient (rmsnorm dw, embedding dwte) of activations of dtype d:
// d itself or stat_dtype(d) (FP32 accumulation of BF16/FP16 activations).
static void grad_dtype(const char *op, const char *arg, struct tensor g, enum dtype d) {
    if (g.dtype != d && g.dtype != stat_dtype(d))
        fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s: tensor %s is %s, expected %s or %s", op,
                   arg, dtype_name(g.dtype), dtype_name(d), dtype_name(stat_dtype(d)));
}

static void need_float(const char *op, const char *arg, struct tensor t) {
    if (!is_float(t.dtype))
        fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s: tensor %s is %s, expected a float dtype",
                   op, arg, dtype_name(t.dtype));
}

// ---- memory -------------------------------------------------------------------

void backend_free(struct backend *be) {
    if (!be) return;
    free(be->profile);
    be->profile = NULL;
    be->ops->destroy(be);
}

void *backend_alloc(struct backend *be, size_t bytes) { return be->ops->alloc(be, bytes); }
void backend_dealloc(struct backend *be, void *ptr) { if (ptr) be->ops->free(be, ptr); }
void backend_to_device(struct backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) be->ops->to_device(be, dst, src, bytes);
}
void backend_to_host(struct backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) be->ops->to_host(be, dst, src, bytes);
}
void backend_memset0(struct backend *be, struct tensor t) {
    if (t.numel) be->ops->memset0(be, t.data, t.numel * dtype_size(t.dtype));
}
void backend_synchronize(struct backend *be) { be->ops->synchronize(be); }
bool backend_host_memory(const struct backend *be) { return be->ops->host_memory; }
enum status backend_reserve(struct backend *be, const struct backend_bounds *bounds, struct error *err) {
    return be->ops->reserve ? be->ops->reserve(be, bounds, err) : STATUS_OK;
}

// ---- ops ----------------------------------------------------------------------

void backend_matmul(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                    int M, int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    CHECK(M >= 0 && N >= 0 && K >= 0, "matmul: M=%d N=%d K=%d", M, N, K);
    need("matmul", "out", out, (size_t)M * N);
    need("matmul", "a", a, (size_t)M * K);
    need("matmul", "b", b, (size_t)K * N);
    need_float("matmul", "out", out);
    same_dtype("matmul", "b", b, a.dtype);
    // out has a's dtype, or FP32 for 16-bit a and b (FP32 weight gradients of
    // BF16 activations, accumulated with beta = 1).
    if (!(out.dtype == DTYPE_FP32 && (a.dtype == DTYPE_BF16 || a.dtype == DTYPE_FP16)))
        same_dtype("matmul", "a", a, out.dtype);
    PROFILED(be, "matmul", be->ops->matmul(be, out, a, b, M, N, K, trans_a, trans_b, alpha, beta));
}

void backend_matmul_invariant(struct backend *be, struct tensor out, struct tensor a,
                              struct tensor b, int M, int N, int K, bool trans_a, bool trans_b,
                              float alpha, float beta) {
    if (!be->ops->matmul_invariant) {
        backend_matmul(be, out, a, b, M, N, K, trans_a, trans_b, alpha, beta);
        return;
    }
    CHECK(M >= 0 && N >= 0 && K >= 0, "matmul_invariant: M=%d N=%d K=%d", M, N, K);
    need("matmul_invariant", "out", out, (size_t)M * N);
    need("matmul_invariant", "a", a, (size_t)M * K);
    need("matmul_invariant", "b", b, (size_t)K * N);
    need_float("matmul_invariant", "out", out);
    same_dtype("matmul_invariant", "b", b, a.dtype);
    if (!(out.dtype == DTYPE_FP32 && (a.dtype == DTYPE_BF16 || a.dtype == DTYPE_FP16)))
        same_dtype("matmul_invariant", "a", a, out.dtype);
    PROFILED(be, "matmul_invariant",
             be->ops->matmul_invariant(be, out, a, b, M, N, K, trans_a, trans_b, alpha, beta));
}

void backend_embedding_forward(struct backend *be, struct tensor out, struct tensor wte,
                               struct tensor tokens, int N, int C, int vocab_start, int Vl) {
    need("embedding_forward", "out", out, (size_t)N * C);
    need("embedding_forward", "wte", wte, (size_t)Vl * C);
    need("embedding_forward", "tokens", tokens, N);
    same_dtype("embedding_forward", "tokens", tokens, DTYPE_I32);
    same_dtype("embedding_forward", "wte", wte, out.dtype);
    PROFILED(be, "embedding_forward",
             be->ops->embedding_forward(be, out, wte, tokens, N, C, vocab_start, Vl));
}

void backend_embedding_backward(struct backend *be, struct tensor dwte, struct tensor dout,
                                struct tensor tokens, int N, int C, int vocab_start, int Vl) {
    need("embedding_backward", "dwte", dwte, (size_t)Vl * C);
    need("embedding_backward", "dout", dout, (size_t)N * C);
    need("embedding_backward", "tokens", tokens, N);
    same_dtype("embedding_backward", "tokens", tokens, DTYPE_I32);
    grad_dtype("embedding_backward", "dwte", dwte, dout.dtype);
    PROFILED(be, "embedding_backward",
             be->ops->embedding_backward(be, dwte, dout, tokens, N, C, vocab_start, Vl));
}

void backend_rmsnorm_forward(struct backend *be, struct tensor y, struct tensor rstd,
                             struct tensor x, struct tensor w, int N, int C, float eps) {
    need("rmsnorm_forward", "y", y, (size_t)N * C);
    need("rmsnorm_forward", "rstd", rstd, N);
    need("rmsnorm_forward", "x", x, (size_t)N * C);
    need("rmsnorm_forward", "w", w, C);
    same_dtype("rmsnorm_forward", "x", x, y.dtype);
    same_dtype("rmsnorm_forward", "rstd", rstd, stat_dtype(x.dtype));
    PROFILED(be, "rmsnorm_forward", be->ops->rmsnorm_forward(be, y, rstd, x, w, N, C, eps));
}

void backend_add_rmsnorm_forward(struct backend *be, struct tensor xout, struct tensor y,
                                 struct tensor rstd, struct tensor a, struct tensor b,
                                 struct tensor w, int N, int C, float eps) {
    const char *op = "add_rmsnorm_forward";
    size_t nc = (size_t)N * C;
    need(op, "xout", xout, nc);
    need(op, "y", y, nc);
    need(op, "rstd", rstd, N);
    need(op, "a", a, nc);
    need(op, "b", b, nc);
    need(op, "w", w, C);
    same_dtype(op, "a", a, xout.dtype);
    same_dtype(op, "b", b, xout.dtype);
    same_dtype(op, "y", y, xout.dtype);
    same_dtype(op, "w", w, xout.dtype);
    same_dtype(op, "rstd", rstd, stat_dtype(xout.dtype));
    PROFILED(be, op, be->ops->add_rmsnorm_forward(be, xout, y, rstd, a, b, w, N, C, eps));
}

void backend_rmsnorm_backward(struct backend *be, struct tensor dx, struct tensor dw,
                              struct tensor dy, struct tensor x, struct tensor w,
                              struct tensor rstd, int N, int C) {
    need("rmsnorm_backward", "dx", dx, (size_t)N * C);
    need("rmsnorm_backward", "dw", dw, C);
    need("rmsnorm_backward", "dy", dy, (size_t)N * C);
    need("rmsnorm_backward", "x", x, (size_t)N * C);
    need("rmsnorm_backward", "w", w, C);
    need("rmsnorm_backward", "rstd", rstd, N);
    same_dtype("rmsnorm_backward", "rstd", rstd, stat_dtype(x.dtype));
    same_dtype("rmsnorm_backward", "dx", dx, x.dtype);
    same_dtype("rmsnorm_backward", "dy", dy, x.dtype);
    grad_dtype("rmsnorm_backward", "dw", dw, x.dtype);
    PROFILED(be, "rmsnorm_backward", be->ops->rmsnorm_backward(be, dx, dw, dy, x, w, rstd, N, C));
}

// The plain causal mask and positions: no doc_start.
static const struct tensor no_docs = {NULL, DTYPE_I32, 0};

// doc_start (B, T) I32, or empty (numel 0: plain causal). Its values (0 <=
// doc_start[b, t] <= t, non-decreasing along t, as doc_start_fill makes
// them) are not checked: they live in backend memory.
static void doc_checks(const char *op, struct tensor doc_start, int B, int T) {
    if (doc_start.numel == 0) return;
    need(op, "doc_start", doc_start, (size_t)B * T);
    same_dtype(op, "doc_start", doc_start, DTYPE_I32);
}

static void rope_checks(const char *op, struct tensor x, struct tensor cos, struct tensor sin,
                        struct tensor doc_start, int B, int T, int Hx, int D, int pos_offset) {
    CHECK(D % 2 == 0, "%s: head size D=%d must be even", op, D);
    need(op, "x", x, (size_t)B * T * Hx * D);
    need(op, "cos", cos, (size_t)(pos_offset + T) * (D / 2));
    need(op, "sin", sin, (size_t)(pos_offset + T) * (D / 2));
    same_dtype(op, "cos", cos, stat_dtype(x.dtype));
    same_dtype(op, "sin", sin, stat_dtype(x.dtype));
    doc_checks(op, doc_start, B, T);
}

void backend_rope_forward(struct backend *be, struct tensor x, struct tensor cos,
                          struct tensor sin, int B, int T, int Hx, int D, int pos_offset) {
    backend_rope_forward_docs(be, x, cos, sin, no_docs, B, T, Hx, D, pos_offset);
}

void backend_rope_backward(struct backend *be, struct tensor dx, struct tensor cos,
                           struct tensor sin, int B, int T, int Hx, int D, int pos_offset) {
    backend_rope_backward_docs(be, dx, cos, sin, no_docs, B, T, Hx, D, pos_offset);
}

void backend_rope_forward_docs(struct backend *be, struct tensor x, struct tensor cos,
                               struct tensor sin, struct tensor doc_start, int B, int T, int Hx,
                               int D, int pos_offset) {
    rope_checks("rope_forward", x, cos, sin, doc_start, B, T, Hx, D, pos_offset);
    PROFILED(be, "rope_forward",
             be->ops->rope(be, x, cos, sin, doc_start, B, T, Hx, D, pos_offset, false));
}

void backend_rope_backward_docs(struct backend *be, struct tensor dx, struct tensor cos,
                                struct tensor sin, struct tensor doc_start, int B, int T, int Hx,
                                int D, int pos_offset) {
    rope_checks("rope_backward", dx, cos, sin, doc_start, B, T, Hx, D, pos_offset);
    PROFILED(be, "rope_backward",
             be->ops->rope(be, dx, cos, sin, doc_start, B, T, Hx, D, pos_offset, true));
}

static void rope_qkv_checks(const char *op, struct tensor qkv, struct tensor q, struct tensor k,
                            struct tensor v, struct tensor cos, struct tensor sin,
                            struct tensor doc_start, int B, int T, int H, int Hkv, int D) {
    size_t N = (size_t)B * T;
    CHECK(D % 2 == 0, "%s: head size D=%d must be even", op, D);
    need(op, "qkv", qkv, N * (H + 2 * Hkv) * D);
    need(op, "q", q, N * H * D);
    need(op, "k", k, N * Hkv * D);
    need(op, "v", v, N * Hkv * D);
    same_dtype(op, "q", q, qkv.dtype);
    same_dtype(op, "k", k, qkv.dtype);
    same_dtype(op, "v", v, qkv.dtype);
    need(op, "cos", cos, (size_t)T * (D / 2));
    need(op, "sin", sin, (size_t)T * (D / 2));
    same_dtype(op, "cos", cos, stat_dtype(qkv.dtype));
    same_dtype(op, "sin", sin, stat_dtype(qkv.dtype));
    doc_checks(op, doc_start, B, T);
}

void backend_rope_qkv_split(struct backend *be, struct tensor q, struct tensor k, struct tensor v,
                            struct tensor qkv, struct tensor cos, struct tensor sin,
                            struct tensor doc_start, int B, int T, int H, int Hkv, int D) {
    rope_qkv_checks("rope_qkv_split", qkv, q, k, v, cos, sin, doc_start, B, T, H, Hkv, D);
    PROFILED(be, "rope_qkv_split",
             be->ops->rope_qkv(be, qkv, q, k, v, cos, sin, doc_start, B, T, H, Hkv, D, false));
}

void backend_rope_qkv_join(struct backend *be, struct tensor dqkv, struct tensor dq,
                           struct tensor dk, struct tensor dv, struct tensor cos,
                           struct tensor sin, struct tensor doc_start, int B, int T, int H,
                           int Hkv, int D) {
    rope_qkv_checks("rope_qkv_join", dqkv, dq, dk, dv, cos, sin, doc_start, B, T, H, Hkv, D);
    PROFILED(be, "rope_qkv_join",
             be->ops->rope_qkv(be, dqkv, dq, dk, dv, cos, sin, doc_start, B, T, H, Hkv, D, true));
}

static void attention_checks(const char *op, struct tensor out, struct tensor lse,
                             struct tensor q, struct tensor k, struct tensor v, int B, int T,
                             int H, int Hkv, int D) {
    CHECK(Hkv > 0 && H % Hkv == 0, "%s: H=%d not a multiple of Hkv=%d", op, H, Hkv);
    need(op, "out", out, (size_t)B * T * H * D);
    need(op, "lse", lse, (size_t)B * H * T);
    need(op, "q", q, (size_t)B * T * H * D);
    need(op, "k", k, (size_t)B * T * Hkv * D);
    need(op, "v", v, (size_t)B * T * Hkv * D);
    same_dtype(op, "q", q, out.dtype);
    same_dtype(op, "k", k, out.dtype);
    same_dtype(op, "v", v, out.dtype);
    same_dtype(op, "lse", lse, stat_dtype(out.dtype));
}

void backend_attention_forward(struct backend *be, struct tensor out, struct tensor lse,
                               struct tensor q, struct tensor k, struct tensor v,
                               int B, int T, int H, int Hkv, int D) {
    backend_attention_forward_docs(be, out, lse, q, k, v, no_docs, B, T, H, Hkv, D);
}

void backend_attention_backward(struct backend *be, struct tensor dq, struct tensor dk,
                                struct tensor dv, struct tensor dout, struct tensor q,
                                struct tensor k, struct tensor v, struct tensor out,
                                struct tensor lse, int B, int T, int H, int Hkv, int D) {
    backend_attention_backward_docs(be, dq, dk, dv, dout, q, k, v, out, lse, no_docs, B, T, H,
                                    Hkv, D);
}

void backend_attention_forward_docs(struct backend *be, struct tensor out, struct tensor lse,
                                    struct tensor q, struct tensor k, struct tensor v,
                                    struct tensor doc_start, int B, int T, int H, int Hkv, int D) {
    attention_checks("attention_forward", out, lse, q, k, v, B, T, H, Hkv, D);
    doc_checks("attention_forward", doc_start, B, T);
    PROFILED(be, "attention_forward",
             be->ops->attention_forward(be, out, lse, q, k, v, doc_start, B, T, H, Hkv, D));
}

void backend_attention_backward_docs(struct backend *be, struct tensor dq, struct tensor dk,
                                     struct tensor dv, struct tensor dout, struct tensor q,
                                     struct tensor k, struct tensor v, struct tensor out,
                                     struct tensor lse, struct tensor doc_start, int B, int T,
                                     int H, int Hkv, int D) {
    attention_checks("attention_backward", out, lse, q, k, v, B, T, H, Hkv, D);
    doc_checks("attention_backward", doc_start, B, T);
    need("attention_backward", "dq", dq, (size_t)B * T * H * D);
    need("attention_backward", "dk", dk, (size_t)B * T * Hkv * D);
    need("attention_backward", "dv", dv, (size_t)B * T * Hkv * D);
    need("attention_backward", "dout", dout, (size_t)B * T * H * D);
    PROFILED(be, "attention_backward",
             be->ops->attention_backward(be, dq, dk, dv, dout, q, k, v, out, lse, doc_start, B, T,
                                         H, Hkv, D));
}

// The shapes and dtypes of one ring-attention block (kernels/ops.h).
static void attention_block_checks(const char *op, struct tensor out, struct tensor lse,
                                   struct tensor q, struct tensor k, struct tensor v,
                                   struct tensor q_pos, struct tensor q_doc, struct tensor k_pos,
                                   int B, int Tq, int Tk, int H, int Hkv, int D) {
    CHECK(B >= 0 && Tq >= 0 && Tk >= 0 && D > 0, "%s: B=%d Tq=%d Tk=%d D=%d", op, B, Tq, Tk, D);
    CHECK(Hkv > 0 && H % Hkv == 0, "%s: H=%d not a multiple of Hkv=%d", op, H, Hkv);
    need(op, "out", out, (size_t)B * Tq * H * D);
    need(op, "lse", lse, (size_t)B * H * Tq);
    need(op, "q", q, (size_t)B * Tq * H * D);
    need(op, "k", k, (size_t)B * Tk * Hkv * D);
    need(op, "v", v, (size_t)B * Tk * Hkv * D);
    need_float(op, "q", q);
    same_dtype(op, "out", out, q.dtype);
    same_dtype(op, "k", k, q.dtype);
    same_dtype(op, "v", v, q.dtype);
    same_dtype(op, "lse", lse, stat_dtype(q.dtype));
    need(op, "q_pos", q_pos, (size_t)B * Tq);
    need(op, "k_pos", k_pos, (size_t)B * Tk);
    same_dtype(op, "q_pos", q_pos, DTYPE_I32);
    same_dtype(op, "k_pos", k_pos, DTYPE_I32);
    doc_checks(op, q_doc, B, Tq);
}

void backend_attention_block_forward(struct backend *be, struct tensor out, struct tensor lse,
                                     struct tensor q, struct tensor k, struct tensor v,
                                     struct tensor q_pos, struct tensor q_doc,
                                     struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv,
                                     int D, bool accumulate) {
    const char *op = "attention_block_forward";
    attention_block_checks(op, out, lse, q, k, v, q_pos, q_doc, k_pos, B, Tq, Tk, H, Hkv, D);
    PROFILED(be, op,
             be->ops->attention_block_forward(be, out, lse, q, k, v, q_pos, q_doc, k_pos, B, Tq,
                                              Tk, H, Hkv, D, accumulate));
}

void backend_attention_block_backward(struct backend *be, struct tensor dq, struct tensor dk,
                                      struct tensor dv, struct tensor dout, struct tensor q,
                                      struct tensor k, struct tensor v, struct tensor out,
                                      struct tensor lse, struct tensor q_pos, struct tensor q_doc,
                                      struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv,
                                      int D) {
    const char *op = "attention_block_backward";
    attention_block_checks(op, out, lse, q, k, v, q_pos, q_doc, k_pos, B, Tq, Tk, H, Hkv, D);
    need(op, "dq", dq, (size_t)B * Tq * H * D);
    need(op, "dk", dk, (size_t)B * Tk * Hkv * D);
    need(op, "dv", dv, (size_t)B * Tk * Hkv * D);
    need(op, "dout", dout, (size_t)B * Tq * H * D);
    same_dtype(op, "dq", dq, q.dtype);
    same_dtype(op, "dk", dk, q.dtype);
    same_dtype(op, "dv", dv, q.dtype);
    same_dtype(op, "dout", dout, q.dtype);
    PROFILED(be, op,
             be->ops->attention_block_backward(be, dq, dk, dv, dout, q, k, v, out, lse, q_pos,
                                               q_doc, k_pos, B, Tq, Tk, H, Hkv, D));
}

void backend_attention_decode(struct backend *be, struct tensor out, struct tensor q,
                              struct tensor k, struct tensor v, struct tensor k_cache,
                              struct tensor v_cache, struct tensor pos, int B, int Tq, int Tmax,
                              int H, int Hkv, int D) {
    const char *op = "attention_decode";
    CHECK(B > 0 && Tq > 0 && Tq <= Tmax && D > 0, "%s: B=%d Tq=%d Tmax=%d D=%d", op, B, Tq, Tmax, D);
    CHECK(Hkv > 0 && H % Hkv == 0, "%s: H=%d not a multiple of Hkv=%d", op, H, Hkv);
    need(op, "out", out, (size_t)B * Tq * H * D);
    need(op, "q", q, (size_t)B * Tq * H * D);
    need(op, "k", k, (size_t)B * Tq * Hkv * D);
    need(op, "v", v, (size_t)B * Tq * Hkv * D);
    need(op, "k_cache", k_cache, (size_t)B * Tmax * Hkv * D);
    need(op, "v_cache", v_cache, (size_t)B * Tmax * Hkv * D);
    need_float(op, "q", q);
    same_dtype(op, "out", out, q.dtype);
    same_dtype(op, "k", k, q.dtype);
    same_dtype(op, "v", v, q.dtype);
    same_dtype(op, "k_cache", k_cache, q.dtype);
    same_dtype(op, "v_cache", v_cache, q.dtype);
    need(op, "pos", pos, (size_t)B);
    same_dtype(op, "pos", pos, DTYPE_I32);
    PROFILED(be, op,
             be->ops->attention_decode(be, out, q, k, v, k_cache, v_cache, pos, B, Tq, Tmax, H,
                                       Hkv, D));
}

void backend_swiglu_forward(struct backend *be, struct tensor out, struct tensor gate,
                            struct tensor up, size_t n) {
    need("swiglu_forward", "out", out, n);
    need("swiglu_forward", "gate", gate, n);
    need("swiglu_forward", "up", up, n);
    same_dtype("swiglu_forward", "gate", gate, out.dtype);
    same_dtype("swiglu_forward", "up", up, out.dtype);
    PROFILED(be, "swiglu_forward", be->ops->swiglu_forward(be, out, gate, up, n));
}

void backend_swiglu_backward(struct backend *be, struct tensor dgate, struct tensor dup,
                             struct tensor dout, struct tensor gate, struct tensor up, size_t n) {
    need("swiglu_backward", "dgate", dgate, n);
    need("swiglu_backward", "dup", dup, n);
    need("swiglu_backward", "dout", dout, n);
    need("swiglu_backward", "gate", gate, n);
    need("swiglu_backward", "up", up, n);
    PROFILED(be, "swiglu_backward", be->ops->swiglu_backward(be, dgate, dup, dout, gate, up, n));
}

void backend_ce_row_max(struct backend *be, struct tensor rowmax, struct tensor logits,
                        int N, int Vl, int Vvalid) {
    CHECK(Vvalid >= 0 && Vvalid <= Vl, "ce_row_max: Vvalid=%d outside [0, Vl=%d]", Vvalid, Vl);
    need("ce_row_max", "rowmax", rowmax, N);
    need("ce_row_max", "logits", logits, (size_t)N * Vl);
    same_dtype("ce_row_max", "rowmax", rowmax, stat_dtype(logits.dtype));
    PROFILED(be, "ce_row_max", be->ops->ce_row_max(be, rowmax, logits, N, Vl, Vvalid));
}

void backend_ce_partials(struct backend *be, struct tensor partials, struct tensor logits,
                         struct tensor rowmax, struct tensor targets, int N, int Vl,
                         int Vvalid, int vocab_start) {
    CHECK(Vvalid >= 0 && Vvalid <= Vl, "ce_partials: Vvalid=%d outside [0, Vl=%d]", Vvalid, Vl);
    need("ce_partials", "partials", partials, (size_t)N * 3);
    need("ce_partials", "logits", logits, (size_t)N * Vl);
    need("ce_partials", "rowmax", rowmax, N);
    need("ce_partials", "targets", targets, N);
    same_dtype("ce_partials", "targets", targets, DTYPE_I32);
    same_dtype("ce_partials", "partials", partials, stat_dtype(logits.dtype));
    PROFILED(be, "ce_partials",
             be->ops->ce_partials(be, partials, logits, rowmax, targets, N, Vl, Vvalid, vocab_start));
}

void backend_ce_loss(struct backend *be, struct tensor loss, struct tensor lse,
                     struct tensor partials, struct tensor rowmax, struct tensor targets,
                     int N, int V, float smoothing, int ignore_index) {
    need("ce_loss", "loss", loss, N);
    need("ce_loss", "lse", lse, N);
    need("ce_loss", "partials", partials, (size_t)N * 3);
    need("ce_loss", "rowmax", rowmax, N);
    need("ce_loss", "targets", targets, N);
    same_dtype("ce_loss", "targets", targets, DTYPE_I32);
    PROFILED(be, "ce_loss",
             be->ops->ce_loss(be, loss, lse, partials, rowmax, targets, N, V, smoothing, ignore_index));
}

void backend_ce_backward(struct backend *be, struct tensor dlogits, struct tensor logits,
                         struct tensor lse, struct tensor targets, int N, int Vl, int Vvalid,
                         int vocab_start, int V, float smoothing, int ignore_index, double scale) {
    need("ce_backward", "dlogits", dlogits, (size_t)N * Vl);
    need("ce_backward", "logits", logits, (size_t)N * Vl);
    need("ce_backward", "lse", lse, N);
    need("ce_backward", "targets", targets, N);
    same_dtype("ce_backward", "targets", targets, DTYPE_I32);
    same_dtype("ce_backward", "dlogits", dlogits, logits.dtype);
    PROFILED(be, "ce_backward",
             be->ops->ce_backward(be, dlogits, logits, lse, targets, N, Vl, Vvalid, vocab_start, V,
                                  smoothing, ignore_index, scale));
}

void backend_adamw(struct backend *be, struct tensor param, struct tensor master,
                   struct tensor grad, struct tensor m, struct tensor v, size_t n, double lr,
                   double beta1, double beta2, double eps, double weight_decay, double grad_scale,
                   int step) {
    CHECK(step >= 1, "adamw: step %d, counts from 1", step);
    need("adamw", "param", param, n);
    need("adamw", "grad", grad, n);
    need("adamw", "m", m, n);
    need("adamw", "v", v, n);
    if (master.data) need("adamw", "master", master, n);
    PROFILED(be, "adamw", be->ops->adamw(be, param, master, grad, m, v, n, lr, beta1, beta2, eps,
                                         weight_decay, grad_scale, step));
}

double backend_sum_squares(struct backend *be, struct tensor x, size_t n) {
    need("sum_squares", "x", x, n);
    double r = 0;
    PROFILED(be, "sum_squares", r = be->ops->sum_squares(be, x, n));
    return r;
}

void backend_sum_into(struct backend *be, struct tensor acc, struct tensor x, size_t n) {
    need("sum_into", "acc", acc, 1);
    need("sum_into", "x", x, n);
    same_dtype("sum_into", "acc", acc, DTYPE_FP64);
    PROFILED(be, "sum_into", be->ops->sum_into(be, acc, x, n));
}

void backend_add(struct backend *be, struct tensor out, struct tensor a, struct tensor b, size_t n) {
    need("add", "out", out, n);
    need("add", "a", a, n);
    need("add", "b", b, n);
    same_dtype("add", "a", a, out.dtype);
    same_dtype("add", "b", b, out.dtype);
    PROFILED(be, "add", be->ops->add(be, out, a, b, n));
}

void backend_copy(struct backend *be, struct tensor dst, struct tensor src, size_t n) {
    need("copy", "dst", dst, n);
    need("copy", "src", src, n);
    PROFILED(be, "copy", be->ops->copy(be, dst, src, n));
}

// ---- FP8 ----------------------------------------------------------------------

float fp8_max_finite(enum dtype fp8) {
    CHECK(is_fp8(fp8), "fp8_max_finite: %s is not an FP8 dtype", dtype_name(fp8));
    return fp8 == DTYPE_FP8_E4M3 ? 448.0f : 57344.0f;
}

static void need_fp8_input(const char *op, struct tensor x) {
    if (x.dtype != DTYPE_FP32 && x.dtype != DTYPE_BF16 && x.dtype != DTYPE_FP16)
        fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s: tensor x is %s, expected fp32, bf16 or fp16",
                   op, dtype_name(x.dtype));
}

void backend_fp8_amax(struct backend *be, struct tensor amax, struct tensor x, size_t n) {
    need("fp8_amax", "amax", amax, 1);
    same_dtype("fp8_amax", "amax", amax, DTYPE_FP32);
    need("fp8_amax", "x", x, n);
    need_fp8_input("fp8_amax", x);
    PROFILED(be, "fp8_amax", be->ops->fp8_amax(be, amax, x, n));
}

void backend_fp8_cast(struct backend *be, struct tensor out, struct tensor amax,
                      struct tensor saturated, struct tensor x, struct tensor scale, size_t n) {
    need("fp8_cast", "out", out, n);
    CHECK(is_fp8(out.dtype), "fp8_cast: tensor out is %s, expected fp8_e4m3 or fp8_e5m2",
          dtype_name(out.dtype));
    need("fp8_cast", "x", x, n);
    need_fp8_input("fp8_cast", x);
    need("fp8_cast", "scale", scale, 1);
    same_dtype("fp8_cast", "scale", scale, DTYPE_FP32);
    if (amax.numel) same_dtype("fp8_cast", "amax", amax, DTYPE_FP32);
    if (saturated.numel) same_dtype("fp8_cast", "saturated", saturated, DTYPE_I64);
    PROFILED(be, "fp8_cast", be->ops->fp8_cast(be, out, amax, saturated, x, scale, n));
}

void backend_fp8_update_scale(struct backend *be, struct tensor scale, struct tensor scale_inv,
                              struct tensor history, struct tensor amax, int n, int len,
                              float fp8_max, int margin, bool most_recent) {
    CHECK(n >= 0 && len >= 0 && fp8_max > 0, "fp8_update_scale: n=%d len=%d fp8_max=%g", n, len,
          (double)fp8_max);
    need("fp8_update_scale", "scale", scale, (size_t)n);
    need("fp8_update_scale", "scale_inv", scale_inv, (size_t)n);
    need("fp8_update_scale", "amax", amax, (size_t)n);
    need("fp8_update_scale", "history", history, (size_t)n * len);
    same_dtype("fp8_update_scale", "scale", scale, DTYPE_FP32);
    same_dtype("fp8_update_scale", "scale_inv", scale_inv, DTYPE_FP32);
    same_dtype("fp8_update_scale", "amax", amax, DTYPE_FP32);
    if (len) same_dtype("fp8_update_scale", "history", history, DTYPE_FP32);
    PROFILED(be, "fp8_update_scale",
             be->ops->fp8_update_scale(be, scale, scale_inv, history, amax, n, len, fp8_max, margin,
                                       most_recent));
}

void backend_matmul_fp8(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                        struct tensor scale_inv_a, struct tensor scale_inv_b, int M, int N, int K,
                        bool trans_a, bool trans_b, float beta) {
    CHECK(M >= 0 && N >= 0 && K >= 0, "matmul_fp8: M=%d N=%d K=%d", M, N, K);
    need("matmul_fp8", "out", out, (size_t)M * N);
    need("matmul_fp8", "a", a, (size_t)M * K);
    need("matmul_fp8", "b", b, (size_t)K * N);
    CHECK(is_fp8(a.dtype) && is_fp8(b.dtype) &&
              !(a.dtype == DTYPE_FP8_E5M2 && b.dtype == DTYPE_FP8_E5M2),
          "matmul_fp8: a is %s and b is %s, expected FP8 operands, not both fp8_e5m2",
          dtype_name(a.dtype), dtype_name(b.dtype));
    CHECK(out.dtype == DTYPE_BF16 || out.dtype == DTYPE_FP32, "matmul_fp8: out is %s, expected bf16 or fp32",
          dtype_name(out.dtype));
    need("matmul_fp8", "scale_inv_a", scale_inv_a, 1);
    need("matmul_fp8", "scale_inv_b", scale_inv_b, 1);
    same_dtype("matmul_fp8", "scale_inv_a", scale_inv_a, DTYPE_FP32);
    same_dtype("matmul_fp8", "scale_inv_b", scale_inv_b, DTYPE_FP32);
    PROFILED(be, "matmul_fp8",
             be->ops->matmul_fp8(be, out, a, b, scale_inv_a, scale_inv_b, M, N, K, trans_a, trans_b,
                                 beta));
}

// ---- mixture of experts -------------------------------------------------------

// The route ops' float tensors: the statistics dtype of some storage dtype.
static void need_stat(const char *op, const char *arg, struct tensor t) {
    if (t.dtype != DTYPE_FP32 && t.dtype != DTYPE_FP64)
        fatal_exit(STATUS_RUNTIME, __FILE__, __LINE__, "%s: tensor %s is %s, expected fp32 or fp64",
                   op, arg, dtype_name(t.dtype));
}

void backend_moe_route(struct backend *be, struct tensor probs, struct tensor lse,
                       struct tensor topk_idx, struct tensor topk_w, struct tensor stats,
                       struct tensor logits, struct tensor sel_bias, int N, int E, int k,
                       bool renorm) {
    const char *op = "moe_route";
    CHECK(N >= 0 && E > 0 && k >= 1 && k <= E, "%s: N=%d E=%d k=%d", op, N, E, k);
    need(op, "logits", logits, (size_t)N * E);
    need(op, "probs", probs, (size_t)N * E);
    need(op, "lse", lse, N);
    need(op, "topk_idx", topk_idx, (size_t)N * k);
    need(op, "topk_w", topk_w, (size_t)N * k);
    need(op, "stats", stats, (size_t)E + 1);
    need_stat(op, "logits", logits);
    same_dtype(op, "probs", probs, logits.dtype);
    same_dtype(op, "lse", lse, logits.dtype);
    same_dtype(op, "topk_w", topk_w, logits.dtype);
    same_dtype(op, "topk_idx", topk_idx, DTYPE_I32);
    same_dtype(op, "stats", stats, DTYPE_FP64);
    if (sel_bias.numel) {
        need(op, "sel_bias", sel_bias, E);
        same_dtype(op, "sel_bias", sel_bias, logits.dtype);
    }
    PROFILED(be, op,
             be->ops->moe_route(be, probs, lse, topk_idx, topk_w, stats, logits, sel_bias, N, E, k,
                                renorm));
}

void backend_moe_route_backward(struct backend *be, struct tensor dlogits, struct tensor dtopk_w,
                                struct tensor probs, struct tensor lse, struct tensor topk_idx,
                                struct tensor aux_w, int N, int E, int k, bool renorm,
                                float z_scale) {
    const char *op = "moe_route_backward";
    CHECK(N >= 0 && E > 0 && k >= 1 && k <= E, "%s: N=%d E=%d k=%d", op, N, E, k);
    need(op, "dlogits", dlogits, (size_t)N * E);
    need(op, "dtopk_w", dtopk_w, (size_t)N * k);
    need(op, "probs", probs, (size_t)N * E);
    need(op, "lse", lse, N);
    need(op, "topk_idx", topk_idx, (size_t)N * k);
    need_stat(op, "probs", probs);
    same_dtype(op, "dlogits", dlogits, probs.dtype);
    same_dtype(op, "dtopk_w", dtopk_w, probs.dtype);
    same_dtype(op, "lse", lse, probs.dtype);
    same_dtype(op, "topk_idx", topk_idx, DTYPE_I32);
    if (aux_w.numel) {
        need(op, "aux_w", aux_w, E);
        same_dtype(op, "aux_w", aux_w, probs.dtype);
    }
    PROFILED(be, op,
             be->ops->moe_route_backward(be, dlogits, dtopk_w, probs, lse, topk_idx, aux_w, N, E,
                                         k, renorm, z_scale));
}

void backend_moe_dispatch(struct backend *be, struct tensor counts, struct tensor dest,
                          struct tensor src, struct tensor topk_idx, int N, int E, int k,
                          int capacity) {
    const char *op = "moe_dispatch";
    CHECK(N >= 0 && E > 0 && k >= 1 && k <= E, "%s: N=%d E=%d k=%d", op, N, E, k);
    need(op, "counts", counts, 2 * (size_t)E);
    need(op, "dest", dest, (size_t)N * k);
    need(op, "src", src, (size_t)N * k);
    need(op, "topk_idx", topk_idx, (size_t)N * k);
    same_dtype(op, "counts", counts, DTYPE_I32);
    same_dtype(op, "dest", dest, DTYPE_I32);
    same_dtype(op, "src", src, DTYPE_I32);
    same_dtype(op, "topk_idx", topk_idx, DTYPE_I32);
    PROFILED(be, op, be->ops->moe_dispatch(be, counts, dest, src, topk_idx, N, E, k, capacity));
}

void backend_moe_permute(struct backend *be, struct tensor xp, struct tensor x, struct tensor src,
                         int M, int C, int k) {
    const char *op = "moe_permute";
    CHECK(M >= 0 && C > 0 && k >= 1, "%s: M=%d C=%d k=%d", op, M, C, k);
    need(op, "xp", xp, (size_t)M * C);
    need(op, "src", src, M);
    need_float(op, "x", x);
    same_dtype(op, "xp", xp, x.dtype);
    same_dtype(op, "src", src, DTYPE_I32);
    PROFILED(be, op, be->ops->moe_permute(be, xp, x, src, M, C, k));
}

void backend_moe_permute_backward(struct backend *be, struct tensor dx, struct tensor dxp,
                                  struct tensor dest, int N, int C, int k) {
    const char *op = "moe_permute_backward";
    CHECK(N >= 0 && C > 0 && k >= 1, "%s: N=%d C=%d k=%d", op, N, C, k);
    need(op, "dx", dx, (size_t)N * C);
    need(op, "dest", dest, (size_t)N * k);
    need_float(op, "dx", dx);
    same_dtype(op, "dxp", dxp, dx.dtype);
    same_dtype(op, "dest", dest, DTYPE_I32);
    PROFILED(be, op, be->ops->moe_permute_backward(be, dx, dxp, dest, N, C, k));
}

// The combine's shapes: dest (N k,) I32 or empty, when empty yp has N k rows.
static void combine_checks(const char *op, struct tensor y, struct tensor yp, struct tensor w,
                           struct tensor dest, int N, int C, int k) {
    CHECK(N >= 0 && C > 0 && k >= 1, "%s: N=%d C=%d k=%d", op, N, C, k);
    need(op, "y", y, (size_t)N * C);
    need(op, "w", w, (size_t)N * k);
    need_float(op, "y", y);
    need_stat(op, "w", w);
    same_dtype(op, "yp", yp, y.dtype);
    if (dest.numel) {
        need(op, "dest", dest, (size_t)N * k);
        same_dtype(op, "dest", dest, DTYPE_I32);
    } else {
        need(op, "yp", yp, (size_t)N * k * C);
    }
}

void backend_moe_combine(struct backend *be, struct tensor y, struct tensor yp, struct tensor w,
                         struct tensor dest, int N, int C, int k, bool sigmoid, bool accumulate) {
    const char *op = "moe_combine";
    combine_checks(op, y, yp, w, dest, N, C, k);
    PROFILED(be, op, be->ops->moe_combine(be, y, yp, w, dest, N, C, k, sigmoid, accumulate));
}

void backend_moe_combine_backward(struct backend *be, struct tensor dyp, struct tensor dw,
                                  struct tensor dy, struct tensor yp, struct tensor w,
                                  struct tensor dest, int N, int C, int k, bool sigmoid) {
    const char *op = "moe_combine_backward";
    combine_checks(op, dy, yp, w, dest, N, C, k);
    need(op, "dw", dw, (size_t)N * k);
    same_dtype(op, "dyp", dyp, dy.dtype);
    same_dtype(op, "dw", dw, w.dtype);
    if (!dest.numel) need(op, "dyp", dyp, (size_t)N * k * C);
    PROFILED(be, op, be->ops->moe_combine_backward(be, dyp, dw, dy, yp, w, dest, N, C, k, sigmoid));
}

// ring_schedule.h: context-parallel ring attention run in one process with
// the block ops of kernels/ops.h (backend_attention_block_forward /
// _backward), for the op-level tests (test_attention_block.c,
// test_ring_reference.c). Issue 26's sequence split: T is cut into 2 cp
// chunks of T / (2 cp) tokens and rank r holds chunks r and 2 cp - 1 - r
// (load-balanced causal, as Megatron-Core's context parallelism), so its
// positions are two increasing runs.
//
// The schedule is the ring's, in the order the ring applies it:
//   forward:  for s = 0 .. cp-1, for every rank r: block (r's q, the k/v of
//             rank (r - s) mod cp), accumulate = (s > 0);
//   backward: for s = 0 .. cp-1, for every rank r: dq_r += and the
//             travelling dk, dv of rank (r - s) mod cp += that block.
// So each rank's out/lse merge and each dk/dv sum happens in ring order.
#ifndef TRIDENT_RING_SCHEDULE_H
#define TRIDENT_RING_SCHEDULE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/cpu/half.h"
#include "kernels/ops.h"

// Global token index (position in the row) of rank r's local token t.
static inline int ring_token(int T, int cp, int r, int t) {
    int c = T / (2 * cp), half = t / c;
    return (half ? 2 * cp - 1 - r : r) * c + t % c;
}

// A host array of doubles as a new backend tensor of dtype dt (rounded to
// nearest even for narrower dtypes; I32 truncates).
static inline struct tensor ring_upload(struct backend *be, enum dtype dt, const double *x,
                                        size_t n) {
    struct tensor t = tensor_view(backend_alloc(be, n * dtype_size(dt) + 64), dt, n);
    CHECK(t.data != NULL, "allocation of %zu elements", n);
    void *h = xmalloc(n * dtype_size(dt) + 64);
    for (size_t i = 0; i < n; i++) switch (dt) {
        case DTYPE_FP64: ((double *)h)[i] = x[i]; break;
        case DTYPE_FP32: ((float *)h)[i] = (float)x[i]; break;
        case DTYPE_BF16: ((uint16_t *)h)[i] = bf16_from_f32((float)x[i]); break;
        case DTYPE_FP16: ((uint16_t *)h)[i] = fp16_from_f32((float)x[i]); break;
        default: ((int32_t *)h)[i] = (int32_t)x[i]; break;
        }
    backend_to_device(be, t.data, h, n * dtype_size(dt));
    free(h);
    return t;
}

// t's elements as doubles into x (n = t.numel).
static inline void ring_download(struct backend *be, double *x, struct tensor t) {
    size_t n = t.numel;
    void *h = xmalloc(n * dtype_size(t.dtype) + 64);
    backend_to_host(be, h, t.data, n * dtype_size(t.dtype));
    for (size_t i = 0; i < n; i++) switch (t.dtype) {
        case DTYPE_FP64: x[i] = ((double *)h)[i]; break;
        case DTYPE_FP32: x[i] = ((float *)h)[i]; break;
        case DTYPE_BF16: x[i] = bf16_to_f32(((uint16_t *)h)[i]); break;
        case DTYPE_FP16: x[i] = fp16_to_f32(((uint16_t *)h)[i]); break;
        default: x[i] = ((int32_t *)h)[i]; break;
        }
    free(h);
}

// One sequence batch in the global layout, host doubles: inputs q (B, T, H,
// D), k, v (B, T, Hkv, D), dout (B, T, H, D), doc_start (B, T) (the global
// position of each token's document start; NULL: plain causal); outputs out,
// dq (B, T, H, D), lse (B, H, T), dk, dv (B, T, Hkv, D).
struct ring_io {
    int B, T, H, Hkv, D;
    const double *q, *k, *v, *dout, *doc_start;
    double *out, *lse, *dq, *dk, *dv;
};

// Rows [b][t] of x (B, T, W) for rank r's local tokens: (B, T / cp, W).
static inline double *ring_gather(const double *x, int B, int T, int W, int cp, int r) {
    int Tl = T / cp;
    double *y = xmalloc((size_t)B * Tl * W * sizeof *y + 8);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++)
            memcpy(y + ((size_t)b * Tl + t) * W, x + ((size_t)b * T + ring_token(T, cp, r, t)) * W,
                   (size_t)W * sizeof *y);
    return y;
}

// The inverse: rank r's (B, T / cp, W) rows back into x (B, T, W).
static inline void ring_scatter(double *x, const double *y, int B, int T, int W, int cp, int r) {
    int Tl = T / cp;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++)
            memcpy(x + ((size_t)b * T + ring_token(T, cp, r, t)) * W, y + ((size_t)b * Tl + t) * W,
                   (size_t)W * sizeof *y);
}

// Runs the ring schedule above over cp ranks with storage dtype dt (lse: FP64
// for FP64, else FP32) and writes io's outputs. T % (2 cp) == 0.
static inline void ring_attention_run(struct backend *be, enum dtype dt, int cp,
                                      struct ring_io *io) {
    int B = io->B, T = io->T, H = io->H, Hkv = io->Hkv, D = io->D, Tl = T / cp;
    enum dtype st = dt == DTYPE_FP64 ? DTYPE_FP64 : DTYPE_FP32;
    CHECK(T % (2 * cp) == 0, "T=%d not divisible by 2 cp = %d", T, 2 * cp);
    struct rank {
        struct tensor q, k, v, dout, out, lse, pos, doc, dq, dk, dv;
    } *rk = xcalloc((size_t)cp, sizeof *rk);
    double *pos = xmalloc((size_t)B * T * sizeof *pos);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) pos[(size_t)b * T + t] = t;
    size_t nq = (size_t)B * Tl * H * D, nk = (size_t)B * Tl * Hkv * D;
    double *zq = xcalloc(nq + 1, sizeof *zq), *zk = xcalloc(nk + 1, sizeof *zk);
    for (int r = 0; r < cp; r++) {
        double *x;
#define RING_UP(field, src, W, dtype)                                          \
    x = ring_gather(src, B, T, W, cp, r), rk[r].field = ring_upload(be, dtype, x, (size_t)B * Tl * (W)), free(x)
        RING_UP(q, io->q, H * D, dt);
        RING_UP(k, io->k, Hkv * D, dt);
        RING_UP(v, io->v, Hkv * D, dt);
        RING_UP(dout, io->dout, H * D, dt);
        RING_UP(pos, pos, 1, DTYPE_I32);
        if (io->doc_start) RING_UP(doc, io->doc_start, 1, DTYPE_I32);
        else rk[r].doc = tensor_view(NULL, DTYPE_I32, 0);
#undef RING_UP
        rk[r].out = ring_upload(be, dt, zq, nq);
        rk[r].lse = ring_upload(be, st, zq, (size_t)B * H * Tl);
        rk[r].dq = ring_upload(be, dt, zq, nq);
        rk[r].dk = ring_upload(be, dt, zk, nk);
        rk[r].dv = ring_upload(be, dt, zk, nk);
    }
    for (int s = 0; s < cp; s++)
        for (int r = 0; r < cp; r++) {
            struct rank *a = &rk[r], *kv = &rk[((r - s) % cp + cp) % cp];
            backend_attention_block_forward(be, a->out, a->lse, a->q, kv->k, kv->v, a->pos, a->doc,
                                            kv->pos, B, Tl, Tl, H, Hkv, D, s > 0);
        }
    for (int s = 0; s < cp; s++)
        for (int r = 0; r < cp; r++) {
            struct rank *a = &rk[r], *kv = &rk[((r - s) % cp + cp) % cp];
            backend_attention_block_backward(be, a->dq, kv->dk, kv->dv, a->dout, a->q, kv->k, kv->v,
                                             a->out, a->lse, a->pos, a->doc, kv->pos, B, Tl, Tl, H,
                                             Hkv, D);
        }
    backend_synchronize(be);
    double *yq = xmalloc(nq * sizeof *yq + 8), *yk = xmalloc(nk * sizeof *yk + 8);
    double *yl = xmalloc((size_t)B * H * Tl * sizeof *yl + 8);
    for (int r = 0; r < cp; r++) {
        ring_download(be, yq, rk[r].out), ring_scatter(io->out, yq, B, T, H * D, cp, r);
        ring_download(be, yq, rk[r].dq), ring_scatter(io->dq, yq, B, T, H * D, cp, r);
        ring_download(be, yk, rk[r].dk), ring_scatter(io->dk, yk, B, T, Hkv * D, cp, r);
        ring_download(be, yk, rk[r].dv), ring_scatter(io->dv, yk, B, T, Hkv * D, cp, r);
        ring_download(be, yl, rk[r].lse); // (B, H, Tl): scatter each (b, h) row
        ring_scatter(io->lse, yl, B * H, T, 1, cp, r);
        struct tensor all[] = {rk[r].q,   rk[r].k,  rk[r].v,  rk[r].dout, rk[r].out, rk[r].lse,
                               rk[r].pos, rk[r].doc, rk[r].dq, rk[r].dk,  rk[r].dv};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) backend_dealloc(be, all[i].data);
    }
    free(yq), free(yk), free(yl), free(zq), free(zk), free(pos), free(rk);
}

#endif

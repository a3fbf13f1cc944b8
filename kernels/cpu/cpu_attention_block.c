// cpu_attention_block.c: one block of context-parallel ring attention on the
// CPU backend (kernels/ops.h, backend_attention_block_forward / _backward);
// bodies in generic/attention_block.h, instantiated for FP32 and FP64.
// BF16/FP16 storage, as cpu_attention.c: each head's q, k, v (and out, dout)
// are converted to FP32 per thread, the FP32 per-head bodies run on them and
// each output is rounded once per call: out after the merge, dq after adding
// this block's FP32 contribution to the stored dq, dk and dv after summing
// over all query heads of their kv head.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"

// The most query rows per score block and keys per candidate tile
// (generic/attention_block.h; tiles also end where positions stop running):
// a key tile whose positions no query of a query tile can read is skipped
// whole; 64 as ATTN_BLOCK of cpu_attention.c.
#define BLOCK_BQ 64
#define BLOCK_BK 64

// The end of the tile of rows starting at row i0 of pos (n,): at most max
// rows, and it ends where the positions stop running consecutively (so that
// under context parallelism a tile never holds both of a rank's chunks,
// whatever the chunk size, and its [min, max] bounds it tightly).
static int block_tile_end(const int32_t *pos, int i0, int n, int max) {
    int end = MIN(n, i0 + max), i = i0 + 1;
    while (i < end && pos[i] == pos[i - 1] + 1) i++;
    return i;
}

// The most runs of candidate key tiles: tiles may be single keys (positions
// that never run), and runs are separated by at least one tile.
static int block_max_runs(int Tk) { return Tk / 2 + 1; }

// Per-thread scratch elements (reals of 4 or 8 bytes): the score and dP
// blocks (BLOCK_BQ, Tk), the forward's merge rows (BLOCK_BQ, D) and the runs
// (2 ints each, one real apiece); for BF16/FP16 (lowp) also the FP32 copies
// of a head: q, out, dout, dq (Tq, D) and k, v, dk, dv (Tk, D).
static size_t block_scratch_elems(int Tq, int Tk, int D, bool lowp) {
    size_t e = (size_t)BLOCK_BQ * (2 * (size_t)Tk + D) + 2 * (size_t)block_max_runs(Tk);
    if (lowp) e += 4 * (size_t)Tq * D + 4 * (size_t)Tk * D;
    return e;
}

// The runs' place in a thread's scratch S (after the blocks).
#define block_runs_of(S, Tk, D) ((int *)((S) + (size_t)BLOCK_BQ * (2 * (size_t)(Tk) + (D))))

// The candidate key tiles for a query tile reading positions [lo, hi]: key
// tile [j, block_tile_end(kpos, j, Tk, BLOCK_BK)) is one when its positions
// [min, max] meet [lo, hi]. Writes the runs of consecutive candidates as
// runs[2 r] = first key, runs[2 r + 1] = end key, and returns their count
// (at most block_max_runs(Tk)).
static int block_runs(const int32_t *kpos, int Tk, int lo, int hi, int *runs) {
    int n = 0;
    bool open = false;
    for (int j = 0, j1; j < Tk; j = j1) {
        j1 = block_tile_end(kpos, j, Tk, BLOCK_BK);
        int mn = kpos[j], mx = kpos[j];
        for (int t = j + 1; t < j1; t++) mn = MIN(mn, kpos[t]), mx = MAX(mx, kpos[t]);
        bool cand = mn <= hi && mx >= lo;
        if (cand && !open) runs[2 * n] = j, open = true;
        if (cand) runs[2 * n + 1] = j1;
        if (!cand && open) n++, open = false;
    }
    return n + open;
}

// The positions [*lo, *hi] that queries [i0, i1) read: min qdoc (0 without
// documents, qdoc NULL), max qpos.
static void block_query_span(const int32_t *qpos, const int32_t *qdoc, int i0, int i1, int *lo,
                             int *hi) {
    int l = qdoc ? qdoc[i0] : 0, h = qpos[i0];
    for (int i = i0 + 1; i < i1; i++) {
        if (qdoc) l = MIN(l, qdoc[i]);
        h = MAX(h, qpos[i]);
    }
    *lo = l, *hi = h;
}

#define GENERIC_FILE "kernels/cpu/generic/attention_block.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE

static void *block_scratch(struct backend *be, int Tq, int Tk, int D, enum dtype dt) {
    bool lowp = dt == DTYPE_BF16 || dt == DTYPE_FP16;
    size_t elem = dtype_size(cpu_compute_dtype(dt));
    return cpu_scratch(be, block_scratch_elems(Tq, Tk, D, lowp) * elem * (size_t)omp_get_max_threads());
}

// BF16/FP16 forward: per (b, h) q, k, v (and out when accumulating) to FP32,
// the FP32 head body, out rounded; lse (FP32) in place.
static void block_forward_lowp(struct backend *be, enum dtype dt, uint16_t *out, float *lse,
                               const uint16_t *q, const uint16_t *k, const uint16_t *v,
                               const int32_t *q_pos, const int32_t *q_doc, const int32_t *k_pos,
                               int B, int Tq, int Tk, int H, int Hkv, int D, bool accumulate) {
    int G = H / Hkv, ldq = H * D, ldk = Hkv * D;
    size_t per = block_scratch_elems(Tq, Tk, D, true), base = block_scratch_elems(Tq, Tk, D, false);
    float *scratch = block_scratch(be, Tq, Tk, D, dt);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, hk = h / G;
        float *S = scratch + (size_t)omp_get_thread_num() * per;
        float *qf = S + base, *of = qf + (size_t)Tq * D, *kf = of + (size_t)Tq * D;
        float *vf = kf + (size_t)Tk * D;
        size_t qoff = (size_t)b * Tq * ldq + (size_t)h * D, koff = (size_t)b * Tk * ldk + (size_t)hk * D;
        cpu_rows_to_f32(qf, q + qoff, dt, Tq, D, ldq);
        cpu_rows_to_f32(kf, k + koff, dt, Tk, D, ldk);
        cpu_rows_to_f32(vf, v + koff, dt, Tk, D, ldk);
        if (accumulate) cpu_rows_to_f32(of, out + qoff, dt, Tq, D, ldq);
        attention_block_head_forward_f32(of, lse + ((size_t)b * H + h) * Tq, qf, D, kf, vf, D,
                                         q_pos + (size_t)b * Tq,
                                         q_doc ? q_doc + (size_t)b * Tq : NULL,
                                         k_pos + (size_t)b * Tk, Tq, Tk, D, accumulate, S);
        cpu_rows_from_f32(out + qoff, of, dt, Tq, D, ldq, false);
    }
}

// BF16/FP16 backward: per (b, kv head) k, v to FP32 and FP32 dk, dv
// accumulators from 0; per query head of the group q, out, dout to FP32, an
// FP32 dq from 0, the FP32 head body, dq added to the stored dq and rounded;
// then dk, dv likewise.
static void block_backward_lowp(struct backend *be, enum dtype dt, uint16_t *dq, uint16_t *dk,
                                uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                                const uint16_t *k, const uint16_t *v, const uint16_t *out,
                                const float *lse, const int32_t *q_pos, const int32_t *q_doc,
                                const int32_t *k_pos, int B, int Tq, int Tk, int H, int Hkv,
                                int D) {
    int G = H / Hkv, ldq = H * D, ldk = Hkv * D;
    size_t per = block_scratch_elems(Tq, Tk, D, true), base = block_scratch_elems(Tq, Tk, D, false);
    size_t qh = (size_t)Tq * D, kh = (size_t)Tk * D;
    float *scratch = block_scratch(be, Tq, Tk, D, dt);
#pragma omp parallel for schedule(static)
    for (int bk = 0; bk < B * Hkv; bk++) {
        int b = bk / Hkv, hk = bk % Hkv;
        float *P = scratch + (size_t)omp_get_thread_num() * per;
        float *qf = P + base, *of = qf + qh, *dof = of + qh, *dqf = dof + qh;
        float *kf = dqf + qh, *vf = kf + kh, *dkf = vf + kh, *dvf = dkf + kh;
        size_t koff = (size_t)b * Tk * ldk + (size_t)hk * D;
        cpu_rows_to_f32(kf, k + koff, dt, Tk, D, ldk);
        cpu_rows_to_f32(vf, v + koff, dt, Tk, D, ldk);
        memset(dkf, 0, kh * sizeof(float));
        memset(dvf, 0, kh * sizeof(float));
        for (int h = hk * G; h < (hk + 1) * G; h++) {
            size_t off = (size_t)b * Tq * ldq + (size_t)h * D;
            cpu_rows_to_f32(qf, q + off, dt, Tq, D, ldq);
            cpu_rows_to_f32(of, out + off, dt, Tq, D, ldq);
            cpu_rows_to_f32(dof, dout + off, dt, Tq, D, ldq);
            memset(dqf, 0, qh * sizeof(float));
            attention_block_head_backward_f32(dqf, qf, of, dof, D, dkf, dvf, kf, vf, D,
                                              lse + ((size_t)b * H + h) * Tq,
                                              q_pos + (size_t)b * Tq,
                                              q_doc ? q_doc + (size_t)b * Tq : NULL,
                                              k_pos + (size_t)b * Tk, Tq, Tk, D, P);
            cpu_rows_from_f32(dq + off, dqf, dt, Tq, D, ldq, true);
        }
        cpu_rows_from_f32(dk + koff, dkf, dt, Tk, D, ldk, true);
        cpu_rows_from_f32(dv + koff, dvf, dt, Tk, D, ldk, true);
    }
}

void cpu_attention_block_forward(struct backend *be, struct tensor out, struct tensor lse,
                                 struct tensor q, struct tensor k, struct tensor v,
                                 struct tensor q_pos, struct tensor q_doc, struct tensor k_pos,
                                 int B, int Tq, int Tk, int H, int Hkv, int D, bool accumulate) {
    const char *op = "attention_block_forward";
    CPU_CHECK_DTYPE(op, out.dtype);
    const int32_t *qd = q_doc.numel ? (const int32_t *)q_doc.data : NULL;
    if (out.dtype == DTYPE_BF16 || out.dtype == DTYPE_FP16) {
        block_forward_lowp(be, out.dtype, out.data, lse.data, q.data, k.data, v.data, q_pos.data,
                           qd, k_pos.data, B, Tq, Tk, H, Hkv, D, accumulate);
        return;
    }
    void *scratch = block_scratch(be, Tq, Tk, D, out.dtype);
    if (out.dtype == DTYPE_FP32)
        attention_block_forward_f32(out.data, lse.data, q.data, k.data, v.data, q_pos.data, qd,
                                    k_pos.data, B, Tq, Tk, H, Hkv, D, accumulate, scratch);
    else
        attention_block_forward_f64(out.data, lse.data, q.data, k.data, v.data, q_pos.data, qd,
                                    k_pos.data, B, Tq, Tk, H, Hkv, D, accumulate, scratch);
}

void cpu_attention_block_backward(struct backend *be, struct tensor dq, struct tensor dk,
                                  struct tensor dv, struct tensor dout, struct tensor q,
                                  struct tensor k, struct tensor v, struct tensor out,
                                  struct tensor lse, struct tensor q_pos, struct tensor q_doc,
                                  struct tensor k_pos, int B, int Tq, int Tk, int H, int Hkv,
                                  int D) {
    const char *op = "attention_block_backward";
    CPU_CHECK_DTYPE(op, out.dtype);
    const int32_t *qd = q_doc.numel ? (const int32_t *)q_doc.data : NULL;
    if (out.dtype == DTYPE_BF16 || out.dtype == DTYPE_FP16) {
        block_backward_lowp(be, out.dtype, dq.data, dk.data, dv.data, dout.data, q.data, k.data,
                            v.data, out.data, lse.data, q_pos.data, qd, k_pos.data, B, Tq, Tk, H,
                            Hkv, D);
        return;
    }
    void *scratch = block_scratch(be, Tq, Tk, D, out.dtype);
    if (out.dtype == DTYPE_FP32)
        attention_block_backward_f32(dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data,
                                     out.data, lse.data, q_pos.data, qd, k_pos.data, B, Tq, Tk, H,
                                     Hkv, D, scratch);
    else
        attention_block_backward_f64(dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data,
                                     out.data, lse.data, q_pos.data, qd, k_pos.data, B, Tq, Tk, H,
                                     Hkv, D, scratch);
}

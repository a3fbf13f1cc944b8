// cpu_attention.c: causal (optionally document-masked) GQA attention of the
// CPU backend; bodies in generic/attention.h, instantiated for FP32 and FP64.
// BF16/FP16 storage:
// each head's q, k, v (and out, dout) are converted to FP32 per thread, the
// FP32 per-head bodies run on them, and results are rounded once (dk, dv
// after summing over all query heads of their kv head, in FP32).
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"

// Query rows per score block: block [i0, i0 + ATTN_BLOCK) reads keys [0, i1).
// 64 keeps a block's GEMMs large enough for BLAS while skipping ~3/8 of the
// T x T work at T = 256 (the causal upper triangle).
#define ATTN_BLOCK 64

#define GENERIC_FILE "kernels/cpu/generic/attention.h"
#include "generic/instantiate.h"
#undef GENERIC_FILE

// Per-thread scratch of per_thread bytes for every OpenMP thread.
static void *attention_scratch(struct backend *be, size_t per_thread) {
    return cpu_scratch(be, per_thread * (size_t)omp_get_max_threads());
}

static size_t block_elems(int T) { return (size_t)2 * ATTN_BLOCK * (T > 0 ? T : 1); }

// BF16/FP16 forward: per (b, h) q, k, v heads to FP32 (T, D), the FP32 head
// body, out rounded; lse (FP32) written directly.
static void attention_forward_lowp(struct backend *be, enum dtype dt, uint16_t *out, float *lse,
                                   const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                   const int32_t *doc_start, int B, int T, int H, int Hkv, int D) {
    int G = H / Hkv, ldq = H * D, ldk = Hkv * D;
    size_t head = (size_t)T * D, per = block_elems(T) + 4 * head;
    float *scratch = attention_scratch(be, per * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H, hk = h / G;
        float *S = scratch + (size_t)omp_get_thread_num() * per;
        float *qf = S + block_elems(T), *kf = qf + head, *vf = kf + head, *of = vf + head;
        size_t qoff = (size_t)b * T * ldq + (size_t)h * D, koff = (size_t)b * T * ldk + (size_t)hk * D;
        cpu_rows_to_f32(qf, q + qoff, dt, T, D, ldq);
        cpu_rows_to_f32(kf, k + koff, dt, T, D, ldk);
        cpu_rows_to_f32(vf, v + koff, dt, T, D, ldk);
        attention_head_forward_f32(of, lse + ((size_t)b * H + h) * T, qf, D, kf, vf, D,
                                   doc_start ? doc_start + (size_t)b * T : NULL, T, D, S);
        cpu_rows_from_f32(out + qoff, of, dt, T, D, ldq, false);
    }
}

// BF16/FP16 backward: per (b, kv head) k, v to FP32 and FP32 dk, dv
// accumulators; per query head of the group q, out, dout to FP32, the FP32
// head body, dq rounded; then dk, dv rounded.
static void attention_backward_lowp(struct backend *be, enum dtype dt, uint16_t *dq, uint16_t *dk,
                                    uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                                    const uint16_t *k, const uint16_t *v, const uint16_t *out,
                                    const float *lse, const int32_t *doc_start, int B, int T,
                                    int H, int Hkv, int D) {
    int G = H / Hkv, ldq = H * D, ldk = Hkv * D;
    size_t head = (size_t)T * D, per = block_elems(T) + 8 * head;
    float *scratch = attention_scratch(be, per * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int bk = 0; bk < B * Hkv; bk++) {
        int b = bk / Hkv, hk = bk % Hkv;
        float *P = scratch + (size_t)omp_get_thread_num() * per;
        float *kf = P + block_elems(T), *vf = kf + head, *dkf = vf + head, *dvf = dkf + head;
        float *qf = dvf + head, *of = qf + head, *dof = of + head, *dqf = dof + head;
        size_t koff = (size_t)b * T * ldk + (size_t)hk * D;
        cpu_rows_to_f32(kf, k + koff, dt, T, D, ldk);
        cpu_rows_to_f32(vf, v + koff, dt, T, D, ldk);
        memset(dkf, 0, head * sizeof(float));
        memset(dvf, 0, head * sizeof(float));
        for (int h = hk * G; h < (hk + 1) * G; h++) {
            size_t off = (size_t)b * T * ldq + (size_t)h * D;
            cpu_rows_to_f32(qf, q + off, dt, T, D, ldq);
            cpu_rows_to_f32(of, out + off, dt, T, D, ldq);
            cpu_rows_to_f32(dof, dout + off, dt, T, D, ldq);
            attention_head_backward_f32(dqf, qf, of, dof, D, dkf, dvf, kf, vf, D,
                                        lse + ((size_t)b * H + h) * T,
                                        doc_start ? doc_start + (size_t)b * T : NULL, T, D, P);
            cpu_rows_from_f32(dq + off, dqf, dt, T, D, ldq, false);
        }
        cpu_rows_from_f32(dk + koff, dkf, dt, T, D, ldk, false);
        cpu_rows_from_f32(dv + koff, dvf, dt, T, D, ldk, false);
    }
}

void cpu_attention_forward(struct backend *be, struct tensor out, struct tensor lse,
                           struct tensor q, struct tensor k, struct tensor v,
                           struct tensor doc_start, int B, int T, int H, int Hkv, int D) {
    CPU_CHECK_DTYPE("attention_forward", out.dtype);
    const int32_t *ds = doc_start.numel ? (const int32_t *)doc_start.data : NULL;
    CHECK(D > 0, "attention_forward: head size D=%d", D);
    if (out.dtype == DTYPE_BF16 || out.dtype == DTYPE_FP16) {
        attention_forward_lowp(be, out.dtype, out.data, lse.data, q.data, k.data, v.data, ds, B, T,
                               H, Hkv, D);
        return;
    }
    void *scratch = attention_scratch(be, block_elems(T) * dtype_size(out.dtype));
    if (out.dtype == DTYPE_FP32)
        attention_forward_f32(out.data, lse.data, q.data, k.data, v.data, ds, B, T, H, Hkv, D,
                              scratch);
    else
        attention_forward_f64(out.data, lse.data, q.data, k.data, v.data, ds, B, T, H, Hkv, D,
                              scratch);
}

void cpu_attention_backward(struct backend *be, struct tensor dq, struct tensor dk,
                            struct tensor dv, struct tensor dout, struct tensor q, struct tensor k,
                            struct tensor v, struct tensor out, struct tensor lse,
                            struct tensor doc_start, int B, int T, int H, int Hkv, int D) {
    const char *op = "attention_backward";
    const int32_t *ds = doc_start.numel ? (const int32_t *)doc_start.data : NULL;
    CPU_CHECK_DTYPE(op, out.dtype);
    CHECK(D > 0, "attention_backward: head size D=%d", D);
    CPU_CHECK_SAME(op, "dq", dq, out.dtype);
    CPU_CHECK_SAME(op, "dk", dk, out.dtype);
    CPU_CHECK_SAME(op, "dv", dv, out.dtype);
    CPU_CHECK_SAME(op, "dout", dout, out.dtype);
    if (out.dtype == DTYPE_BF16 || out.dtype == DTYPE_FP16) {
        attention_backward_lowp(be, out.dtype, dq.data, dk.data, dv.data, dout.data, q.data,
                                k.data, v.data, out.data, lse.data, ds, B, T, H, Hkv, D);
        return;
    }
    void *scratch = attention_scratch(be, block_elems(T) * dtype_size(out.dtype));
    if (out.dtype == DTYPE_FP32)
        attention_backward_f32(dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data,
                               out.data, lse.data, ds, B, T, H, Hkv, D, scratch);
    else
        attention_backward_f64(dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data,
                               out.data, lse.data, ds, B, T, H, Hkv, D, scratch);
}

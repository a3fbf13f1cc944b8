// cuda_attention_decode.cu: attention against a key/value cache on the CUDA
// backend (attention_decode; contract in kernels/ops.h): generation's step,
// a few new queries per row against every cached key before them. Math as
// kernels/cpu/generic/attention_decode.h, FP32 on CUDA cores for FP32, BF16
// and FP16 storage.
//
// Two launches on the compute stream: the append (k, v rows copied into the
// caches at pos[b] + t, one thread an element), then the attention with one
// block of DEC_WARPS warps per (b, t, h) query row, split-K within the block
// in the manner of flash-decoding (Dao et al. 2023, "Flash-Decoding for
// long-context inference"): warp w takes keys w, w + DEC_WARPS, ...; a key's
// score is a warp reduction over the head (lane l holds elements l + 32 r,
// r < ceil(D / 32), D <= 256), and each warp keeps its own running max m,
// sum l and output accumulator (online softmax, Milakov and Gimelshein 2018);
// the warps' partials are merged through shared memory at the end: out =
// sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M), M = max_w m_w. A query row
// always reads at least key 0 (its own position), so no row is empty.
#include "cuda_internal.cuh"

#define DEC_WARPS 4
#define DEC_MAX_R 8 // head elements per lane: D <= 32 * DEC_MAX_R = 256

// k_cache, v_cache (B, Tmax, W) rows pos[b] + t = k, v (B, Tq, W) rows (b, t).
__global__ void decode_append_kernel(struct dptr kc, struct dptr vc, struct dptr k, struct dptr v,
                                     const int32_t *pos, int B, int Tq, int Tmax, int W) {
    size_t n = (size_t)B * Tq * W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / W, e = i % W;
        int b = (int)(row / Tq), t = (int)(row % Tq);
        size_t dst = ((size_t)b * Tmax + pos[b] + t) * W + e;
        st(kc, dst, ld(k, i));
        st(vc, dst, ld(v, i));
    }
}

// Grid (B Tq H), DEC_WARPS * 32 threads: out row (b, t, h).
__global__ void decode_attention_kernel(struct dptr out, struct dptr q, struct dptr kc,
                                        struct dptr vc, const int32_t *pos, int Tq, int Tmax,
                                        int H, int Hkv, int D) {
    __shared__ float sm[DEC_WARPS], sl[DEC_WARPS], sacc[DEC_WARPS][32 * DEC_MAX_R];
    int row = blockIdx.x, h = row % H, t = row / H % Tq, b = row / (H * Tq);
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, G = H / Hkv, R = (D + 31) / 32;
    int p = pos[b] + t;
    size_t ldk = (size_t)Hkv * D;
    size_t kbase = (size_t)b * Tmax * ldk + (size_t)(h / G) * D;
    float scale = rsqrtf((float)D), qr[DEC_MAX_R], acc[DEC_MAX_R];
    for (int r = 0; r < DEC_MAX_R; r++) {
        int e = lane + 32 * r;
        qr[r] = r < R && e < D ? ld(q, (size_t)row * D + e) * scale : 0.0f;
        acc[r] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = w; j <= p; j += DEC_WARPS) {
        size_t kj = kbase + (size_t)j * ldk;
        float d = 0.0f;
        for (int r = 0; r < R; r++) {
            int e = lane + 32 * r;
            if (e < D) d += qr[r] * ld(kc, kj + e);
        }
        d = warp_sum(d);
        float mn = fmaxf(m, d), corr = expf(m - mn), pj = expf(d - mn);
        l = l * corr + pj;
        for (int r = 0; r < R; r++) {
            int e = lane + 32 * r;
            acc[r] = acc[r] * corr + (e < D ? pj * ld(vc, kj + e) : 0.0f);
        }
        m = mn;
    }
    if (lane == 0) sm[w] = m, sl[w] = l;
    for (int r = 0; r < R; r++) sacc[w][lane + 32 * r] = acc[r];
    __syncthreads();
    if (w != 0) return;
    float M = -INFINITY, L = 0.0f;
    for (int x = 0; x < DEC_WARPS; x++) M = fmaxf(M, sm[x]);
    for (int x = 0; x < DEC_WARPS; x++) L += sm[x] == -INFINITY ? 0.0f : sl[x] * expf(sm[x] - M);
    for (int r = 0; r < R; r++) {
        int e = lane + 32 * r;
        if (e >= D) continue;
        float o = 0.0f;
        for (int x = 0; x < DEC_WARPS; x++)
            if (sm[x] != -INFINITY) o += sacc[x][e] * expf(sm[x] - M);
        st(out, (size_t)row * D + e, o / L);
    }
}

void cuda_attention_decode(struct backend *be, struct tensor out, struct tensor q, struct tensor k,
                           struct tensor v, struct tensor k_cache, struct tensor v_cache,
                           struct tensor pos, int B, int Tq, int Tmax, int H, int Hkv, int D) {
    const char *op = "attention_decode";
    CHECK(D <= 32 * DEC_MAX_R, "%s: head size D=%d; the cuda backend supports D <= %d", op, D,
          32 * DEC_MAX_R);
    struct dptr po = dptr_of(op, "out", out), pq = dptr_of(op, "q", q), pk = dptr_of(op, "k", k);
    struct dptr pv = dptr_of(op, "v", v), kc = dptr_of(op, "k_cache", k_cache);
    struct dptr vc = dptr_of(op, "v_cache", v_cache);
    size_t n = (size_t)B * Tq * Hkv * D;
    CUDA_TRAFFIC(4 * tbytes(k, n));
    decode_append_kernel<<<grid_for(n, 256), 256, 0, cuda_stream(be)>>>(
        kc, vc, pk, pv, (const int32_t *)pos.data, B, Tq, Tmax, Hkv * D);
    CHECK_LAUNCH();
    decode_attention_kernel<<<B * Tq * H, DEC_WARPS * 32, 0, cuda_stream(be)>>>(
        po, pq, kc, vc, (const int32_t *)pos.data, Tq, Tmax, H, Hkv, D);
    CHECK_LAUNCH();
}

// cuda_norm.cu: RMSNorm, RoPE and the vocab-parallel embedding of the CUDA
// backend. Math and shapes as in kernels/ops.h (and kernels/cpu/generic/norm.h,
// the reference these are tested against).
#include "cuda_internal.cuh"
#include "cuda_vec.cuh"

// Threads per block of the row kernels (one block per row).
#define ROW_THREADS 256
// Row chunks of the dw reduction: partial sums (chunks, C) then a fixed-order
// sum over chunks, so dw does not depend on scheduling (no atomics).

// Widest C of add_rmsnorm_forward_kernel: the row stays in registers
// (ADD_NORM_MAX_V 16-byte vectors a thread; 8192 BF16 or 4096 FP32 values).
#define ADD_NORM_MAX_V 4

// ADD: xout (N, C) = a + b rounded to T, then y = w * (xout * rstd), rstd =
// 1 / sqrt(mean(xout^2) + eps) from the rounded values; !ADD: the same of
// x = a (b, xout unused), the plain forward, so that a recomputed norm has
// the bits of the fused one (same sum order). One block per row; a thread
// keeps its up to ADD_NORM_MAX_V vectors (or scalars) of the row in
// registers between the two passes, so a and b are read once and xout
// written once (xout may alias a or b: each element is read before written).
// vec is a template parameter, so that the vectors stay in registers.
template <typename T, bool ADD, bool vec>
__global__ void add_rmsnorm_forward_kernel(T *xout, T *y, float *rstd, const T *a, const T *b,
                                           const T *w, int C, float eps) {
    __shared__ float red[32];
    const int V = vec ? VEC(T) : 1;
    const int step = blockDim.x * V;
    size_t o = (size_t)blockIdx.x * C;
    float keep[ADD_NORM_MAX_V][VEC(T)];
    float ss = 0;
#pragma unroll
    for (int u = 0; u < ADD_NORM_MAX_V; u++) {
        int j = threadIdx.x * V + u * step;
        if (j >= C) break;
        float p[VEC(T)], q[VEC(T)];
        if (vec) vload(p, a + o + j);
        else p[0] = to_f32(a[o + j]);
        if (ADD) {
            if (vec) vload(q, b + o + j);
            else q[0] = to_f32(b[o + j]);
        }
        for (int e = 0; e < V; e++) {
            keep[u][e] = ADD ? to_f32(from_f32<T>(p[e] + q[e])) : p[e]; // the value stored
            ss += keep[u][e] * keep[u][e];
        }
        if (ADD) {
            if (vec) vstore(xout + o + j, keep[u]);
            else xout[o + j] = from_f32<T>(keep[u][0]);
        }
    }
    ss = block_sum(ss, red);
    float r = rsqrtf(ss / C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
#pragma unroll
    for (int u = 0; u < ADD_NORM_MAX_V; u++) {
        int j = threadIdx.x * V + u * step;
        if (j >= C) break;
        float g[VEC(T)], out[VEC(T)];
        if (vec) vload(g, w + j);
        else g[0] = to_f32(w[j]);
        for (int e = 0; e < V; e++) out[e] = g[e] * (keep[u][e] * r);
        if (vec) vstore(y + o + j, out);
        else y[o + j] = from_f32<T>(out[0]);
    }
}

// Whether rows of C elements take add_rmsnorm_forward_kernel (C <=
// ROW_THREADS * ADD_NORM_MAX_V * the vector width, or 1 without vectors).
static bool norm_fits(int C, bool vec, enum dtype dt) {
    size_t per_thread = (size_t)ADD_NORM_MAX_V * (vec ? 16 / dtype_size(dt) : 1);
    return (size_t)C <= per_thread * ROW_THREADS;
}

// y (N, C) = w * (x * rstd), rstd (N,) = 1 / sqrt(mean(x^2) + eps). One block per row.
__global__ void rmsnorm_forward_kernel(struct dptr y, float *rstd, struct dptr x, struct dptr w,
                                       int C, float eps) {
    __shared__ float shared[32];
    size_t row = (size_t)blockIdx.x * C;
    float ss = 0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        float v = ld(x, row + j);
        ss += v * v;
    }
    ss = block_sum(ss, shared);
    float r = rsqrtf(ss / C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int j = threadIdx.x; j < C; j += blockDim.x) st(y, row + j, ld(w, j) * (ld(x, row + j) * r));
}

void cuda_rmsnorm_forward(struct backend *be, struct tensor y, struct tensor rstd, struct tensor x,
                          struct tensor w, int N, int C, float eps) {
    const char *op = "rmsnorm_forward";
    struct dptr dy = dptr_of(op, "y", y), dx = dptr_of(op, "x", x), dw = dptr_of(op, "w", w);
    CUDA_CHECK_SAME(op, "rstd", rstd, DTYPE_FP32);
    if (N == 0) return;
    CUDA_TRAFFIC((size_t)N * C * (dtype_size(x.dtype) + dtype_size(y.dtype)) + tbytes(w, C) +
                 sizeof(float) * N);
    bool vec = vec_ok(x.dtype, C, x.data, y.data, w.data);
    if (dw.dt == dx.dt && norm_fits(C, vec, x.dtype)) {
        CUDA_DISPATCH_T(op, x.dtype, {
            if (vec)
                add_rmsnorm_forward_kernel<T, false, true><<<N, ROW_THREADS, 0, cuda_stream(be)>>>(
                    (T *)NULL, (T *)y.data, (float *)rstd.data, (const T *)x.data, (const T *)NULL,
                    (const T *)w.data, C, eps);
            else
                add_rmsnorm_forward_kernel<T, false, false><<<N, ROW_THREADS, 0, cuda_stream(be)>>>(
                    (T *)NULL, (T *)y.data, (float *)rstd.data, (const T *)x.data, (const T *)NULL,
                    (const T *)w.data, C, eps);
        });
        CHECK_LAUNCH();
        return;
    }
    rmsnorm_forward_kernel<<<N, ROW_THREADS, 0, cuda_stream(be)>>>(dy, (float *)rstd.data, dx, dw,
                                                                    C, eps);
    CHECK_LAUNCH();
}

// xout (n,) = a + b, element by element (the fallback's add; out may alias).
template <typename T>
__global__ void residual_add_kernel(T *xout, const T *a, const T *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        xout[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

// One launch when a row fits the registers (norm_fits), else add then
// rmsnorm_forward.
void cuda_add_rmsnorm_forward(struct backend *be, struct tensor xout, struct tensor y,
                              struct tensor rstd, struct tensor a, struct tensor b, struct tensor w,
                              int N, int C, float eps) {
    const char *op = "add_rmsnorm_forward";
    dptr_of(op, "xout", xout);
    CUDA_CHECK_SAME(op, "rstd", rstd, DTYPE_FP32);
    CUDA_CHECK_SAME(op, "w", w, xout.dtype);
    if (N == 0) return;
    // vec as rmsnorm_forward would choose for x = xout (a recomputed norm
    // must sum in the same order); a or b misaligned: add, then that norm.
    bool vec = vec_ok(xout.dtype, C, xout.data, y.data, w.data);
    if (!norm_fits(C, vec, xout.dtype) || vec != vec_ok(xout.dtype, C, a.data, b.data)) {
        size_t n = (size_t)N * C;
        CUDA_TRAFFIC(3 * tbytes(xout, n));
        CUDA_DISPATCH_T(op, xout.dtype,
                        residual_add_kernel<T><<<grid_for(n, 256), 256, 0, cuda_stream(be)>>>(
                            (T *)xout.data, (const T *)a.data, (const T *)b.data, n));
        CHECK_LAUNCH();
        cuda_rmsnorm_forward(be, y, rstd, xout, w, N, C, eps);
        return;
    }
    CUDA_TRAFFIC((size_t)N * C * 4 * dtype_size(xout.dtype) + tbytes(w, C) + // a, b, xout, y
                 sizeof(float) * N);
    CUDA_DISPATCH_T(op, xout.dtype, {
        if (vec)
            add_rmsnorm_forward_kernel<T, true, true><<<N, ROW_THREADS, 0, cuda_stream(be)>>>(
                (T *)xout.data, (T *)y.data, (float *)rstd.data, (const T *)a.data, (const T *)b.data,
                (const T *)w.data, C, eps);
        else
            add_rmsnorm_forward_kernel<T, true, false><<<N, ROW_THREADS, 0, cuda_stream(be)>>>(
                (T *)xout.data, (T *)y.data, (float *)rstd.data, (const T *)a.data, (const T *)b.data,
                (const T *)w.data, C, eps);
    });
    CHECK_LAUNCH();
}

// dx (N, C) += w * dy * r - x * (r^3 / C) * sum_k(dy_k w_k x_k). One block per row.
__global__ void rmsnorm_backward_dx_kernel(struct dptr dx, struct dptr dy, struct dptr x,
                                           struct dptr w, const float *rstd, int C) {
    __shared__ float shared[32];
    size_t row = (size_t)blockIdx.x * C;
    float r = rstd[blockIdx.x], dot = 0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) dot += ld(dy, row + j) * ld(w, j) * ld(x, row + j);
    dot = block_sum(dot, shared);
    float k = dot * r * r * r / C;
    for (int j = threadIdx.x; j < C; j += blockDim.x)
        st(dx, row + j, ld(dx, row + j) + ld(w, j) * ld(dy, row + j) * r - ld(x, row + j) * k);
}

// partial (DW_CHUNKS, C): chunk blockIdx.y sums dy * x * r over its rows.
// Block (32, 8): 32 columns, 8 row lanes reduced through shared memory.
__global__ void rmsnorm_backward_dw_partial(float *partial, struct dptr dy, struct dptr x,
                                            const float *rstd, int N, int C) {
    __shared__ float acc[8][33];
    int j = blockIdx.x * 32 + threadIdx.x;
    int rows_per = (N + gridDim.y - 1) / gridDim.y;
    int r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
    float s = 0;
    if (j < C)
        for (int i = r0 + threadIdx.y; i < r1; i += blockDim.y)
            s += ld(dy, (size_t)i * C + j) * ld(x, (size_t)i * C + j) * rstd[i];
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < C) {
        float t = 0;
        for (int k = 0; k < 8; k++) t += acc[k][threadIdx.x];
        partial[(size_t)blockIdx.y * C + j] = t;
    }
}

// dw (C,) += sum over chunks of partial (chunks, C), in chunk order.
__global__ void rmsnorm_backward_dw_sum(struct dptr dw, const float *partial, int chunks, int C) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= C) return;
    float s = 0;
    for (int k = 0; k < chunks; k++) s += partial[(size_t)k * C + j];
    st(dw, j, ld(dw, j) + s);
}

// NORM_BW_BLOCKS and NORM_BW_MAX_C: cuda_internal.cuh (the scratch bound).

// The backward in one launch (issue 24): per row, dx (N, C) += w * dy * r -
// x * (r^3 / C) * sum_k(dy_k w_k x_k) (as rmsnorm_backward_dx_kernel), while
// the block adds dy * x * r into its dw sums (C floats of shared memory, each
// column owned by one thread); each block then writes its sums to partial
// (gridDim.x, C), and the last block to finish (a counter in *done, reset
// after) adds them in block order into dw (deterministic, no float atomics).
// dx, dy, x, w: storage T; rows of 16-byte vectors when vec.
// vec is a template parameter, so that the vectors stay in registers.
template <typename T, bool vec>
__global__ void rmsnorm_backward_fused(T *dx, const T *dy, const T *x, const T *w,
                                       const float *rstd, float *partial, int *done,
                                       struct dptr dw, int N, int C) {
    extern __shared__ float acc[]; // (C,) this block's dw sums
    __shared__ float red[32];
    __shared__ bool last;
    const int V = vec ? VEC(T) : 1; // elements a thread moves at once
    const int step = blockDim.x * V;
    for (int j = threadIdx.x * V; j < C; j += step)
        for (int e = 0; e < V; e++) acc[j + e] = 0;
    for (int row = blockIdx.x; row < N; row += gridDim.x) {
        size_t o = (size_t)row * C;
        float r = rstd[row], dot = 0;
        for (int j = threadIdx.x * V; j < C; j += step) {
            float a[VEC(T)], b[VEC(T)], c[VEC(T)];
            if (vec) vload(a, dy + o + j), vload(b, x + o + j), vload(c, w + j);
            else a[0] = to_f32(dy[o + j]), b[0] = to_f32(x[o + j]), c[0] = to_f32(w[j]);
            for (int e = 0; e < V; e++) dot += a[e] * c[e] * b[e];
        }
        dot = block_sum(dot, red);
        float k = dot * r * r * r / C;
        for (int j = threadIdx.x * V; j < C; j += step) {
            float a[VEC(T)], b[VEC(T)], c[VEC(T)], d[VEC(T)];
            if (vec) vload(a, dy + o + j), vload(b, x + o + j), vload(c, w + j), vload(d, dx + o + j);
            else a[0] = to_f32(dy[o + j]), b[0] = to_f32(x[o + j]), c[0] = to_f32(w[j]),
                 d[0] = to_f32(dx[o + j]);
            for (int e = 0; e < V; e++) {
                d[e] = d[e] + c[e] * a[e] * r - b[e] * k;
                acc[j + e] += a[e] * b[e] * r;
            }
            if (vec) vstore(dx + o + j, d);
            else dx[o + j] = from_f32<T>(d[0]);
        }
    }
    for (int j = threadIdx.x * V; j < C; j += step)
        for (int e = 0; e < V; e++) partial[(size_t)blockIdx.x * C + j + e] = acc[j + e];
    __threadfence(); // this block's partials are visible before it counts itself done
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        float s = 0;
        for (unsigned b = 0; b < gridDim.x; b++) s += partial[(size_t)b * C + j];
        st(dw, j, ld(dw, j) + s);
    }
    if (threadIdx.x == 0) *done = 0; // ready for the next launch
}

// dx += and dw += (ops.h): one launch for C <= NORM_BW_MAX_C (above), else
// the dx kernel and the two-kernel dw reduction.
void cuda_rmsnorm_backward(struct backend *be, struct tensor dx, struct tensor dw,
                           struct tensor dy, struct tensor x, struct tensor w, struct tensor rstd,
                           int N, int C) {
    const char *op = "rmsnorm_backward";
    struct dptr pdx = dptr_of(op, "dx", dx), pdw = dptr_of(op, "dw", dw);
    struct dptr pdy = dptr_of(op, "dy", dy), px = dptr_of(op, "x", x), pw = dptr_of(op, "w", w);
    CUDA_CHECK_SAME(op, "rstd", rstd, DTYPE_FP32);
    if (N == 0 || C == 0) return;
    cudaStream_t s = cuda_stream(be);
    const float *r = (const float *)rstd.data;
    if (C <= NORM_BW_MAX_C) {
        struct cuda_backend *cb = cuda_state(be);
        int nb = N < NORM_BW_BLOCKS ? N : NORM_BW_BLOCKS;
        float *partial = (float *)cuda_scratch(be, cuda_scratch_rmsnorm_backward(N, C));
        bool vec = vec_ok(dx.dtype, C, dx.data, dy.data, x.data, w.data);
        // dx read and written, dy, x and w read; the partial sums written
        // and read once.
        CUDA_TRAFFIC((size_t)N * C * 4 * dtype_size(dx.dtype) + tbytes(w, C) +
                     sizeof(float) * (N + 2 * (size_t)nb * C) + 2 * tbytes(dw, C));
        CUDA_DISPATCH_T(op, dx.dtype, {
            if (vec)
                rmsnorm_backward_fused<T, true><<<nb, ROW_THREADS, sizeof(float) * C, s>>>(
                    (T *)dx.data, (const T *)dy.data, (const T *)x.data, (const T *)w.data, r, partial,
                    cb->done, pdw, N, C);
            else
                rmsnorm_backward_fused<T, false><<<nb, ROW_THREADS, sizeof(float) * C, s>>>(
                    (T *)dx.data, (const T *)dy.data, (const T *)x.data, (const T *)w.data, r, partial,
                    cb->done, pdw, N, C);
        });
        CHECK_LAUNCH();
        return;
    }
    CUDA_TRAFFIC((size_t)N * C * 4 * dtype_size(dx.dtype) + tbytes(w, C) + sizeof(float) * N);
    rmsnorm_backward_dx_kernel<<<N, ROW_THREADS, 0, s>>>(pdx, pdy, px, pw, r, C);
    CHECK_LAUNCH();
    int chunks = N < DW_CHUNKS ? N : DW_CHUNKS;
    float *partial = (float *)cuda_scratch(be, cuda_scratch_rmsnorm_backward(N, C));
    dim3 grid((C + 31) / 32, chunks), block(32, 8);
    CUDA_TRAFFIC((size_t)N * C * 2 * dtype_size(dx.dtype) + sizeof(float) * (N + (size_t)chunks * C));
    rmsnorm_backward_dw_partial<<<grid, block, 0, s>>>(partial, pdy, px, r, N, C);
    CHECK_LAUNCH();
    CUDA_TRAFFIC(sizeof(float) * (size_t)chunks * C + 2 * tbytes(dw, C));
    rmsnorm_backward_dw_sum<<<(C + 255) / 256, 256, 0, s>>>(pdw, partial, chunks, C);
    CHECK_LAUNCH();
}

// In place on x (B*T, Hx, D): one thread per (row bt, head, i < D/2);
// position pos_offset + t - doc_start[bt] (doc_start NULL: 0).
__global__ void rope_kernel(struct dptr x, const float *cos, const float *sin,
                            const int32_t *doc_start, int T, int Hx, int D, int pos_offset,
                            float sign, size_t total) {
    int half = D / 2;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % half);
        size_t bth = e / half; // (bt, h)
        size_t bt = bth / Hx;
        int p = pos_offset + (int)(bt % T) - (doc_start ? doc_start[bt] : 0);
        size_t i1 = bth * D + i, i2 = i1 + half;
        float c = cos[(size_t)p * half + i], sn = sign * sin[(size_t)p * half + i];
        float a = ld(x, i1), b = ld(x, i2);
        st(x, i1, a * c - b * sn);
        st(x, i2, b * c + a * sn);
    }
}

void cuda_rope(struct backend *be, struct tensor x, struct tensor cos, struct tensor sin,
               struct tensor doc_start, int B, int T, int Hx, int D, int pos_offset, bool inverse) {
    const char *op = inverse ? "rope_backward" : "rope_forward";
    struct dptr px = dptr_of(op, "x", x);
    CUDA_CHECK_SAME(op, "cos", cos, DTYPE_FP32);
    CUDA_CHECK_SAME(op, "sin", sin, DTYPE_FP32);
    size_t total = (size_t)B * T * Hx * (D / 2);
    if (total == 0) return;
    // x read and written; a (T, D/2) table each of cos and sin; doc_start.
    CUDA_TRAFFIC(2 * tbytes(x, 2 * total) + 2 * sizeof(float) * (size_t)T * (D / 2) +
                 (doc_start.numel ? sizeof(int32_t) * (size_t)B * T : 0));
    rope_kernel<<<grid_for(total, 256), 256, 0, cuda_stream(be)>>>(
        px, (const float *)cos.data, (const float *)sin.data,
        doc_start.numel ? (const int32_t *)doc_start.data : NULL, T, Hx, D, pos_offset,
        inverse ? -1.0f : 1.0f, total);
    CHECK_LAUNCH();
}

// ---- q, k, v from one GEMM (issue 24) -----------------------------------------

// inverse = false (split): q (N, H, D) = rope(qkv[:, :H D]), k (N, Hkv, D) =
// rope(qkv[:, H D : (H + Hkv) D]), v (N, Hkv, D) = qkv[:, (H + Hkv) D :];
// inverse = true (join, its backward): the packed rows from q, k (rotated
// back) and v. Rows of qkv: W = (H + 2 Hkv) D elements. One thread per
// group of V (1 or VEC(T)) rotation pairs (bt, head, i .. i + V < D/2),
// then per group of V elements of v; positions t - doc_start[bt].
// V is a template parameter, so that the vectors stay in registers.
template <typename T, int V>
__global__ void rope_qkv_kernel(T *qkv, T *q, T *k, T *v, const float *cos, const float *sin,
                                const int32_t *doc_start, int T_, int H, int Hkv, int D,
                                bool inverse, size_t n_rot, size_t n_v) {
    int half = D / 2, hg = half / V, vg = Hkv * D / V, Hr = H + Hkv;
    size_t W = (size_t)(H + 2 * Hkv) * D;
    float sign = inverse ? -1.0f : 1.0f;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n_rot + n_v;
         e += (size_t)gridDim.x * blockDim.x) {
        if (e < n_rot) {
            int i = (int)(e % hg) * V;
            size_t bth = e / hg, bt = bth / Hr;
            int h = (int)(bth % Hr);
            int p = (int)(bt % T_) - (doc_start ? doc_start[bt] : 0);
            T *P = qkv + bt * W + (size_t)h * D;
            T *S = h < H ? q + (bt * H + h) * D : k + (bt * Hkv + (h - H)) * D;
            const T *src = inverse ? S : P;
            T *dst = inverse ? P : S;
            float a[VEC(T)], b[VEC(T)], x1[VEC(T)], x2[VEC(T)];
            if (V > 1) vload(a, src + i), vload(b, src + i + half);
            else a[0] = to_f32(src[i]), b[0] = to_f32(src[i + half]);
            for (int u = 0; u < V; u++) {
                float c = cos[(size_t)p * half + i + u], s = sign * sin[(size_t)p * half + i + u];
                x1[u] = a[u] * c - b[u] * s;
                x2[u] = b[u] * c + a[u] * s;
            }
            if (V > 1) vstore(dst + i, x1), vstore(dst + i + half, x2);
            else dst[i] = from_f32<T>(x1[0]), dst[i + half] = from_f32<T>(x2[0]);
        } else {
            size_t f = e - n_rot, bt = f / vg;
            int j = (int)(f % vg) * V;
            T *P = qkv + bt * W + (size_t)Hr * D + j, *S = v + bt * Hkv * D + j;
            const T *src = inverse ? S : P;
            T *dst = inverse ? P : S;
            for (int u = 0; u < V; u++) dst[u] = src[u];
        }
    }
}

void cuda_rope_qkv(struct backend *be, struct tensor qkv, struct tensor q, struct tensor k,
                   struct tensor v, struct tensor cos, struct tensor sin, struct tensor doc_start,
                   int B, int Tn, int H, int Hkv, int D, bool inverse) {
    const char *op = inverse ? "rope_qkv_join" : "rope_qkv_split";
    dptr_of(op, "qkv", qkv);
    CUDA_CHECK_SAME(op, "q", q, qkv.dtype);
    CUDA_CHECK_SAME(op, "k", k, qkv.dtype);
    CUDA_CHECK_SAME(op, "v", v, qkv.dtype);
    CUDA_CHECK_SAME(op, "cos", cos, DTYPE_FP32);
    CUDA_CHECK_SAME(op, "sin", sin, DTYPE_FP32);
    size_t N = (size_t)B * Tn;
    if (N == 0) return;
    int half = D / 2, w = 16 / (int)dtype_size(qkv.dtype);
    bool vec = half % w == 0 && (Hkv * D) % w == 0 &&
               vec_ok(qkv.dtype, 0, qkv.data, q.data, k.data, v.data);
    int V = vec ? w : 1;
    size_t n_rot = N * (H + Hkv) * (half / V), n_v = N * Hkv * D / V;
    // q, k, v and the packed rows each read or written once; cos and sin (T, D/2).
    CUDA_TRAFFIC(2 * tbytes(qkv, N * (H + 2 * Hkv) * D) + 2 * sizeof(float) * (size_t)Tn * half +
                 (doc_start.numel ? sizeof(int32_t) * N : 0));
    const int32_t *ds = doc_start.numel ? (const int32_t *)doc_start.data : NULL;
    CUDA_DISPATCH_T(op, qkv.dtype, {
        constexpr int W = VEC(T);
        if (V > 1)
            rope_qkv_kernel<T, W><<<grid_for(n_rot + n_v, 256), 256, 0, cuda_stream(be)>>>(
                (T *)qkv.data, (T *)q.data, (T *)k.data, (T *)v.data, (const float *)cos.data,
                (const float *)sin.data, ds, Tn, H, Hkv, D, inverse, n_rot, n_v);
        else
            rope_qkv_kernel<T, 1><<<grid_for(n_rot + n_v, 256), 256, 0, cuda_stream(be)>>>(
                (T *)qkv.data, (T *)q.data, (T *)k.data, (T *)v.data, (const float *)cos.data,
                (const float *)sin.data, ds, Tn, H, Hkv, D, inverse, n_rot, n_v);
    });
    CHECK_LAUNCH();
}

// out (N, C) = wte row tokens[i] - vocab_start, or zeros for another shard's token.
__global__ void embedding_forward_kernel(struct dptr out, struct dptr wte, const int32_t *tokens,
                                         int C, int vocab_start, int Vl) {
    int row = tokens[blockIdx.x] - vocab_start;
    bool own = row >= 0 && row < Vl;
    size_t o = (size_t)blockIdx.x * C;
    for (int j = threadIdx.x; j < C; j += blockDim.x)
        st(out, o + j, own ? ld(wte, (size_t)row * C + j) : 0.0f);
}

void cuda_embedding_forward(struct backend *be, struct tensor out, struct tensor wte,
                            struct tensor tokens, int N, int C, int vocab_start, int Vl) {
    const char *op = "embedding_forward";
    struct dptr po = dptr_of(op, "out", out), pw = dptr_of(op, "wte", wte);
    if (N == 0) return;
    CUDA_TRAFFIC(tbytes(out, (size_t)N * C) + tbytes(wte, (size_t)N * C) + sizeof(int32_t) * N);
    embedding_forward_kernel<<<N, ROW_THREADS, 0, cuda_stream(be)>>>(
        po, pw, (const int32_t *)tokens.data, C, vocab_start, Vl);
    CHECK_LAUNCH();
}

// FP32 dwte (Vl, C) += dout rows at owned tokens: one block per token row,
// atomicAdd per element (a repeated token adds from several blocks; the sum
// order, hence the last bits, can vary between runs).
__global__ void embedding_backward_atomic(float *dwte, struct dptr dout, const int32_t *tokens,
                                          int C, int vocab_start, int Vl) {
    int row = tokens[blockIdx.x] - vocab_start;
    if (row < 0 || row >= Vl) return;
    size_t o = (size_t)blockIdx.x * C;
    for (int j = threadIdx.x; j < C; j += blockDim.x)
        atomicAdd(dwte + (size_t)row * C + j, ld(dout, o + j));
}

// BF16/FP16 dwte: no atomics on 16-bit storage; one thread per column walks
// all N tokens in order, rounding after each row added as ops.h says
// (deterministic, slow: 16-bit embedding gradients are not expected; FP32
// gradients take the kernel above).
__global__ void embedding_backward_columns(struct dptr dwte, struct dptr dout,
                                           const int32_t *tokens, int N, int C, int vocab_start,
                                           int Vl) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= C) return;
    for (int i = 0; i < N; i++) {
        int row = tokens[i] - vocab_start;
        if (row < 0 || row >= Vl) continue;
        size_t d = (size_t)row * C + j;
        st(dwte, d, ld(dwte, d) + ld(dout, (size_t)i * C + j));
    }
}

void cuda_embedding_backward(struct backend *be, struct tensor dwte, struct tensor dout,
                             struct tensor tokens, int N, int C, int vocab_start, int Vl) {
    const char *op = "embedding_backward";
    struct dptr pw = dptr_of(op, "dwte", dwte), pd = dptr_of(op, "dout", dout);
    if (N == 0 || C == 0) return;
    const int32_t *tok = (const int32_t *)tokens.data;
    // dout read; a dwte row read and written per token.
    CUDA_TRAFFIC(tbytes(dout, (size_t)N * C) + 2 * tbytes(dwte, (size_t)N * C) + sizeof(int32_t) * N);
    if (pw.dt == DTYPE_FP32)
        embedding_backward_atomic<<<N, ROW_THREADS, 0, cuda_stream(be)>>>(
            (float *)dwte.data, pd, tok, C, vocab_start, Vl);
    else
        embedding_backward_columns<<<(C + 127) / 128, 128, 0, cuda_stream(be)>>>(
            pw, pd, tok, N, C, vocab_start, Vl);
    CHECK_LAUNCH();
}

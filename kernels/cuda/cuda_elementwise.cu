// cuda_elementwise.cu: SwiGLU, add, copy (converting between FP32, BF16
// and FP16), AdamW and the sum of squares of the CUDA backend. Each element
// is independent; kernels are grid-stride loops. Math as in kernels/ops.h and
// kernels/cpu/generic/{elementwise,optim}.h.
#include "cuda_internal.cuh"
#include "cuda_vec.cuh"

#define EW_THREADS 256
// Blocks of the sum-of-squares partials: fixed, so the FP64 sum has one order.

#define GRID_STRIDE(i, n)                                                      \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);    \
         i += (size_t)gridDim.x * blockDim.x)

// Elementwise kernels on storage type T (cuda_vec.cuh): thread i handles
// elements [V i, V i + V) of a grid-stride loop over n / V groups (V =
// VEC(T) when vec, i.e. n a multiple of it and 16-byte aligned pointers,
// else 1). V is a template parameter of each kernel, so that the per-thread
// arrays of VEC(T) floats stay in registers (a run-time V put them in local
// memory: ptxas -v showed 96-224-byte stack frames).
#define EW_LOOP(g, n, V)                                                       \
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < (n) / (V); \
         g += (size_t)gridDim.x * blockDim.x)
#define EW_LOAD(dst, p, i, V)                                                  \
    do {                                                                       \
        if ((V) > 1) vload(dst, (p) + (i));                                    \
        else (dst)[0] = to_f32((p)[i]);                                        \
    } while (0)
#define EW_STORE(p, i, src, V)                                                 \
    do {                                                                       \
        if ((V) > 1) vstore((p) + (i), src);                                   \
        else (p)[i] = from_f32<T>((src)[0]);                                   \
    } while (0)

// out = silu(gate) * up
template <typename T, int V>
__global__ void swiglu_forward_kernel(T *out, const T *gate, const T *up, size_t n) {
    EW_LOOP(gi, n, V) {
        size_t i = gi * V;
        float g[VEC(T)], u[VEC(T)], o[VEC(T)];
        EW_LOAD(g, gate, i, V);
        EW_LOAD(u, up, i, V);
        for (int e = 0; e < V; e++) o[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
        EW_STORE(out, i, o, V);
    }
}

// dgate = dout * up * sig (1 + g (1 - sig)), dup = dout * g * sig
template <typename T, int V>
__global__ void swiglu_backward_kernel(T *dgate, T *dup, const T *dout, const T *gate,
                                       const T *up, size_t n) {
    EW_LOOP(gi, n, V) {
        size_t i = gi * V;
        float g[VEC(T)], u[VEC(T)], d[VEC(T)], a[VEC(T)], b[VEC(T)];
        EW_LOAD(g, gate, i, V);
        EW_LOAD(u, up, i, V);
        EW_LOAD(d, dout, i, V);
        for (int e = 0; e < V; e++) {
            float sig = 1.0f / (1.0f + expf(-g[e]));
            a[e] = d[e] * u[e] * sig * (1.0f + g[e] * (1.0f - sig));
            b[e] = d[e] * g[e] * sig;
        }
        EW_STORE(dgate, i, a, V);
        EW_STORE(dup, i, b, V);
    }
}

// out may alias a or b: each element is read before it is written.
template <typename T, int V>
__global__ void add_kernel(T *out, const T *a, const T *b, size_t n) {
    EW_LOOP(gi, n, V) {
        size_t i = gi * V;
        float x[VEC(T)], y[VEC(T)];
        EW_LOAD(x, a, i, V);
        EW_LOAD(y, b, i, V);
        for (int e = 0; e < V; e++) x[e] += y[e];
        EW_STORE(out, i, x, V);
    }
}

__global__ void convert_kernel(struct dptr dst, struct dptr src, size_t n) {
    GRID_STRIDE(i, n) st(dst, i, ld(src, i));
}

// The vector width of n elements of dtype dt at these pointers: VEC or 1.
static int ew_width(enum dtype dt, size_t n, const void *a, const void *b, const void *c,
                    const void *d = NULL, const void *e = NULL) {
    return vec_ok(dt, n, a, b, c, d, e) ? (int)(16 / dtype_size(dt)) : 1;
}

#define LAUNCH(be, n) <<<grid_for(n, EW_THREADS), EW_THREADS, 0, cuda_stream(be)>>>

void cuda_swiglu_forward(struct backend *be, struct tensor out, struct tensor gate,
                         struct tensor up, size_t n) {
    const char *op = "swiglu_forward";
    dptr_of(op, "out", out);
    CUDA_CHECK_SAME(op, "gate", gate, out.dtype);
    CUDA_CHECK_SAME(op, "up", up, out.dtype);
    if (!n) return;
    CUDA_TRAFFIC(tbytes(out, n) + tbytes(gate, n) + tbytes(up, n));
    int V = ew_width(out.dtype, n, out.data, gate.data, up.data);
    CUDA_DISPATCH_T(op, out.dtype, {
        constexpr int W = VEC(T);
        if (V > 1)
            swiglu_forward_kernel<T, W> LAUNCH(be, n / W)((T *)out.data, (const T *)gate.data, (const T *)up.data, n);
        else
            swiglu_forward_kernel<T, 1> LAUNCH(be, n)((T *)out.data, (const T *)gate.data, (const T *)up.data, n);
    });
    CHECK_LAUNCH();
}

void cuda_swiglu_backward(struct backend *be, struct tensor dgate, struct tensor dup,
                          struct tensor dout, struct tensor gate, struct tensor up, size_t n) {
    const char *op = "swiglu_backward";
    dptr_of(op, "gate", gate);
    CUDA_CHECK_SAME(op, "dgate", dgate, gate.dtype);
    CUDA_CHECK_SAME(op, "dup", dup, gate.dtype);
    CUDA_CHECK_SAME(op, "dout", dout, gate.dtype);
    CUDA_CHECK_SAME(op, "up", up, gate.dtype);
    if (!n) return;
    CUDA_TRAFFIC(tbytes(dgate, n) + tbytes(dup, n) + tbytes(dout, n) + tbytes(gate, n) + tbytes(up, n));
    int V = ew_width(gate.dtype, n, dgate.data, dup.data, dout.data, gate.data, up.data);
    CUDA_DISPATCH_T(op, gate.dtype, {
        constexpr int W = VEC(T);
        if (V > 1)
            swiglu_backward_kernel<T, W> LAUNCH(be, n / W)((T *)dgate.data, (T *)dup.data, (const T *)dout.data,
                                                           (const T *)gate.data, (const T *)up.data, n);
        else
            swiglu_backward_kernel<T, 1> LAUNCH(be, n)((T *)dgate.data, (T *)dup.data, (const T *)dout.data,
                                                       (const T *)gate.data, (const T *)up.data, n);
    });
    CHECK_LAUNCH();
}

void cuda_add(struct backend *be, struct tensor out, struct tensor a, struct tensor b, size_t n) {
    dptr_of("add", "out", out);
    CUDA_CHECK_SAME("add", "a", a, out.dtype);
    CUDA_CHECK_SAME("add", "b", b, out.dtype);
    if (!n) return;
    CUDA_TRAFFIC(tbytes(out, n) + tbytes(a, n) + tbytes(b, n));
    int V = ew_width(out.dtype, n, out.data, a.data, b.data);
    CUDA_DISPATCH_T("add", out.dtype, {
        constexpr int W = VEC(T);
        if (V > 1) add_kernel<T, W> LAUNCH(be, n / W)((T *)out.data, (const T *)a.data, (const T *)b.data, n);
        else add_kernel<T, 1> LAUNCH(be, n)((T *)out.data, (const T *)a.data, (const T *)b.data, n);
    });
    CHECK_LAUNCH();
}

// dst (n,) = src: a device copy for equal dtypes (any dtype), else any pair of
// FP32, BF16, FP16 through FP32 (exact), rounded once to nearest even when
// narrowing.
void cuda_copy(struct backend *be, struct tensor dst, struct tensor src, size_t n) {
    if (!n) return;
    if (dst.dtype == src.dtype) {
        CHECK_CUDA(cudaMemcpyAsync(dst.data, src.data, n * dtype_size(dst.dtype),
                                   cudaMemcpyDeviceToDevice, cuda_stream(be)));
        return;
    }
    struct dptr pd = dptr_of("copy", "dst", dst), ps = dptr_of("copy", "src", src);
    CUDA_TRAFFIC(tbytes(dst, n) + tbytes(src, n));
    convert_kernel LAUNCH(be, n)(pd, ps, n);
    CHECK_LAUNCH();
}

// One AdamW step (ops.h) on w (FP32 master, or param itself); param (FP32,
// BF16 or FP16: storage type P, no per-element dtype branch) receives the
// rounded w when w is the master. Scalars as computed by the CPU backend.
template <typename P>
__global__ void adamw_kernel(float *w, P *param, const float *grad, float *m, float *v, size_t n,
                             float decay, float step_size, float bc2_sqrt, float b1, float b2,
                             float gs, float eps, bool has_master) {
    GRID_STRIDE(i, n) {
        float g = grad[i] * gs;
        float wi = (has_master ? w[i] : to_f32(param[i])) * decay;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        wi -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        m[i] = mi;
        v[i] = vi;
        if (has_master) w[i] = wi;
        param[i] = from_f32<P>(wi);
    }
}

void cuda_adamw(struct backend *be, struct tensor param, struct tensor master, struct tensor grad,
                struct tensor m, struct tensor v, size_t n, double lr, double beta1, double beta2,
                double eps, double weight_decay, double grad_scale, int step) {
    const char *op = "adamw";
    struct dptr pp = dptr_of(op, "param", param);
    bool has_master = master.data != NULL;
    if (has_master) CUDA_CHECK_SAME(op, "master", master, DTYPE_FP32);
    else CHECK(!dtype_is16(pp.dt), "adamw: %s param needs fp32 master weights", dtype_name(pp.dt));
    CUDA_CHECK_SAME(op, "grad", grad, DTYPE_FP32);
    CUDA_CHECK_SAME(op, "m", m, DTYPE_FP32);
    CUDA_CHECK_SAME(op, "v", v, DTYPE_FP32);
    if (!n) return;
    float decay = (float)(1 - lr * weight_decay);
    float step_size = (float)(lr / (1 - pow(beta1, step)));
    float bc2_sqrt = (float)sqrt(1 - pow(beta2, step));
    // grad read; m, v read and written; param written (and read without a
    // master); the master read and written.
    CUDA_TRAFFIC(n * (4 + 8 + 8) + tbytes(param, n) * (has_master ? 1 : 2) + (has_master ? n * 8 : 0));
    CUDA_DISPATCH_T(op, pp.dt,
                    adamw_kernel<T> LAUNCH(be, n)((float *)master.data, (T *)param.data,
                                                  (const float *)grad.data, (float *)m.data,
                                                  (float *)v.data, n, decay, step_size, bc2_sqrt,
                                                  (float)beta1, (float)beta2, (float)grad_scale,
                                                  (float)eps, has_master));
    CHECK_LAUNCH();
}

// partial[block] = sum of x_i^2 over the block's grid-stride elements, in FP64.
__global__ void sum_squares_partial(double *partial, struct dptr x, size_t n) {
    __shared__ double shared[EW_THREADS];
    double s = 0;
    GRID_STRIDE(i, n) {
        double xi = ld(x, i);
        s += xi * xi;
    }
    shared[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) shared[threadIdx.x] += shared[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

// out = sum of partial (nb,), one block, fixed order.
__global__ void sum_squares_final(double *out, const double *partial, int nb) {
    __shared__ double shared[EW_THREADS];
    double s = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += partial[i];
    shared[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) shared[threadIdx.x] += shared[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = shared[0];
}

// sum_i x_i^2 in FP64; synchronizes the compute stream.
double cuda_sum_squares(struct backend *be, struct tensor x, size_t n) {
    struct dptr px = dptr_of("sum_squares", "x", x);
    if (!n) return 0;
    struct cuda_backend *c = cuda_state(be);
    double *partial = (double *)cuda_scratch(be, cuda_scratch_sum_squares());
    CUDA_TRAFFIC(tbytes(x, n) + sizeof(double) * SUMSQ_BLOCKS);
    sum_squares_partial<<<SUMSQ_BLOCKS, EW_THREADS, 0, c->stream>>>(partial, px, n);
    CHECK_LAUNCH();
    CUDA_TRAFFIC(sizeof(double) * (SUMSQ_BLOCKS + 1));
    sum_squares_final<<<1, EW_THREADS, 0, c->stream>>>(partial + SUMSQ_BLOCKS, partial, SUMSQ_BLOCKS);
    CHECK_LAUNCH();
    CHECK_CUDA(cudaMemcpyAsync(c->host_sum, partial + SUMSQ_BLOCKS, sizeof(double),
                               cudaMemcpyDeviceToHost, c->stream));
    CHECK_CUDA(cudaStreamSynchronize(c->stream));
    return *c->host_sum;
}

// cpu_matmul_dot.c: the CPU backend's batch-invariant matmul
// (backend_matmul_invariant, kernels/ops.h): every element of out is one dot
// product of a row of op(a) and a column of op(b), summed in an order that
// depends on K alone, so a row of out has the same bits whatever M and N are
// and whichever other rows share the call. Generation uses it (src/model,
// model_decode_chunk): a one-token step then computes each row exactly as the
// full window's step does, where oneDNN's BF16 GEMM (cpu_matmul.c) chooses
// its kernel and blocking by shape and sums a step's few rows in another
// order than the window's.
//
// The dot product: 16 FP32 (FP64: 8) partial sums, lane l taking the
// elements k = l, l + 16, ... in increasing k (one vector FMA per chunk of
// 16; BF16 with AVX512_BF16: one vdpbf16ps per chunk of 32, each lane
// summing an even-odd pair per step), the last chunk zero-padded, then the
// lanes added by one fixed tree (_mm512_reduce_add_ps, or its C twin). Then
// out = alpha * dot, + beta * out (one FMA) when beta != 0, rounded once to
// out's dtype. The build picks one kernel (AVX-512 with or without
// AVX512_BF16, or portable C; their bits differ, each is invariant). Tiles
// of up to 4 x 4 elements (1 x 8 for a one-row call) share their operand
// loads (their rows of op(a) and columns of op(b) per chunk); a tile's shape
// changes which elements share a loop, never an element's sums. Threads
// split the tiles; each element is computed by one thread.
//
// Operand layout: op(a)'s rows and op(b)'s columns must be contiguous in K:
// a stored (M, K) and b stored (N, K) (trans_b) are read in place (a linear
// layer's x @ W^T, and W @ x^T); a stored (K, M) (trans_a) or b stored (K,
// N) are first transposed into the backend's scratch (exact copies).
// Speed: one step's few rows stream the weights once (memory bound, like
// GEMV); a long window (prefill) runs at a fraction of oneDNN's AMX GEMM.
#include <math.h>
#include <omp.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "cpu.h"

// Tiles: up to TILE rows x TILE columns; a call of one row takes TILE1
// columns at a time (more weight rows streamed at once).
enum { TILE = 4, TILE1 = 8 };

// Below this many multiply-adds one thread does the whole product.
#define DOT_SERIAL_WORK (64.0 * 64 * 64)

// The operands of one call, op(a) rows and op(b) columns contiguous in K.
struct dot_args {
    const void *a, *b; // (M, K), (N, K) of dtype dt
    void *out;         // (M, N) of out_dt
    enum dtype dt, out_dt;
    int M, N, K;
    float alpha, beta;
};

static inline void store_out(const struct dot_args *g, size_t idx, double dot) {
    switch (g->out_dt) {
    case DTYPE_FP64: {
        double *o = (double *)g->out + idx, r = (double)g->alpha * dot;
        *o = g->beta != 0 ? fma((double)g->beta, *o, r) : r;
        break;
    }
    case DTYPE_FP32: {
        float *o = (float *)g->out + idx, r = g->alpha * (float)dot;
        *o = g->beta != 0 ? fmaf(g->beta, *o, r) : r;
        break;
    }
    case DTYPE_BF16: {
        uint16_t *o = (uint16_t *)g->out + idx;
        float r = g->alpha * (float)dot;
        *o = bf16_from_f32(g->beta != 0 ? fmaf(g->beta, bf16_to_f32(*o), r) : r);
        break;
    }
    default: { // FP16
        uint16_t *o = (uint16_t *)g->out + idx;
        float r = g->alpha * (float)dot;
        *o = fp16_from_f32(g->beta != 0 ? fmaf(g->beta, fp16_to_f32(*o), r) : r);
        break;
    }
    }
}

// ---- the portable dot products (C; the vector units where the compiler finds them) ----

// 16 FP32 lanes added as _mm512_reduce_add_ps does: halves, then quarters, ...
static inline float lanes16_sum(const float *l) {
    float h8[8], h4[4];
    for (int i = 0; i < 8; i++) h8[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++) h4[i] = h8[i] + h8[i + 4];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

static inline double lanes8_sum(const double *l) {
    double h4[4];
    for (int i = 0; i < 4; i++) h4[i] = l[i] + l[i + 4];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

static inline float ld16(const uint16_t *p, enum dtype dt, size_t i) {
    return dt == DTYPE_BF16 ? bf16_to_f32(p[i]) : fp16_to_f32(p[i]);
}

// res (mr, nr) = the dots of rows a + r * K and columns b + c * K.
static void tile_c(const struct dot_args *g, int i0, int j0, int mr, int nr, double *res) {
    int K = g->K;
    if (g->dt == DTYPE_FP64) {
        const double *a = (const double *)g->a + (size_t)i0 * K, *b = (const double *)g->b + (size_t)j0 * K;
        for (int r = 0; r < mr; r++)
            for (int c = 0; c < nr; c++) {
                double l[8] = {0};
                for (int k0 = 0; k0 < K; k0 += 8)
                    for (int e = 0; e < 8 && k0 + e < K; e++)
                        l[e] = fma(a[(size_t)r * K + k0 + e], b[(size_t)c * K + k0 + e], l[e]);
                res[r * TILE1 + c] = lanes8_sum(l);
            }
        return;
    }
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) {
            float l[16] = {0};
            size_t ar = (size_t)(i0 + r) * K, bc = (size_t)(j0 + c) * K;
            for (int k0 = 0; k0 < K; k0 += 16)
                for (int e = 0; e < 16 && k0 + e < K; e++) {
                    float x, y;
                    if (g->dt == DTYPE_FP32)
                        x = ((const float *)g->a)[ar + k0 + e], y = ((const float *)g->b)[bc + k0 + e];
                    else
                        x = ld16(g->a, g->dt, ar + k0 + e), y = ld16(g->b, g->dt, bc + k0 + e);
                    l[e] = fmaf(x, y, l[e]);
                }
            res[r * TILE1 + c] = lanes16_sum(l);
        }
}

// ---- AVX-512 ----------------------------------------------------------------------

#ifdef __AVX512F__
#define ALWAYS_INLINE static inline __attribute__((always_inline))
// Prefetch: each chunk of a tile reads one line (64 bytes) of each of its
// rows and prefetches as many consecutive lines of the memory after the
// tile's rows (the next tile's rows, when they follow), so a tile's reads
// bring in the next one's, one tile ahead.

// Loads 16 elements of FP32 (or BF16/FP16 widened) at p, the lanes at or past
// n zero.
ALWAYS_INLINE __m512 load16(const void *p, enum dtype dt, int n) {
    __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    if (dt == DTYPE_FP32) return _mm512_maskz_loadu_ps(m, p);
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (dt == DTYPE_FP16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The tiles below keep their accumulators in registers: every loop over
// the tile's rows r and columns c is fully unrolled (MR, NR constants).
#define UNROLL _Pragma("GCC unroll 8")

// One chunk of k .. k + 16 (its elements at or past k + n zero) into the
// tile's accumulators acc[r][c] (a macro: an array passed to a function stays
// in memory).
#define FMA_CHUNK(n)                                                                    \
    do {                                                                                \
        __m512 bv[TILE1];                                                               \
        UNROLL for (int c = 0; c < NR; c++) {                                           \
            _mm_prefetch(b + ((size_t)NR * K + (size_t)k * NR + c * 16) * es, _MM_HINT_T0);   \
            bv[c] = load16(b + ((size_t)c * K + k) * es, dt, n);                        \
        }                                                                               \
        UNROLL for (int r = 0; r < MR; r++) {                                           \
            _mm_prefetch(a + ((size_t)MR * K + (size_t)k * MR + r * 16) * es, _MM_HINT_T0);   \
            __m512 av = load16(a + ((size_t)r * K + k) * es, dt, n);                    \
            UNROLL for (int c = 0; c < NR; c++) acc[r][c] = _mm512_fmadd_ps(av, bv[c], acc[r][c]); \
        }                                                                               \
    } while (0)

// The FMA tile: FP32 lanes over chunks of 16 (FP32, FP16, and BF16 without
// AVX512_BF16). MR, NR, dt constants after inlining.
ALWAYS_INLINE void tile_fma(const struct dot_args *g, int i0, int j0, int MR, int NR, double *res,
                            enum dtype dt) {
    int K = g->K, k = 0;
    size_t es = dtype_size(dt);
    const char *a = (const char *)g->a + (size_t)i0 * K * es, *b = (const char *)g->b + (size_t)j0 * K * es;
    __m512 acc[TILE][TILE1];
    UNROLL for (int r = 0; r < MR; r++)
        UNROLL for (int c = 0; c < NR; c++) acc[r][c] = _mm512_setzero_ps();
    for (; k + 16 <= K; k += 16) FMA_CHUNK(16);
    if (k < K) FMA_CHUNK(K - k);
    UNROLL for (int r = 0; r < MR; r++)
        UNROLL for (int c = 0; c < NR; c++) res[r * TILE1 + c] = _mm512_reduce_add_ps(acc[r][c]);
}
ALWAYS_INLINE void tile_fma_f32(const struct dot_args *g, int i0, int j0, int MR, int NR, double *res) {
    tile_fma(g, i0, j0, MR, NR, res, DTYPE_FP32);
}
ALWAYS_INLINE void tile_fma_f16(const struct dot_args *g, int i0, int j0, int MR, int NR, double *res) {
    tile_fma(g, i0, j0, MR, NR, res, DTYPE_FP16);
}
ALWAYS_INLINE void tile_fma_bf16(const struct dot_args *g, int i0, int j0, int MR, int NR, double *res) {
    tile_fma(g, i0, j0, MR, NR, res, DTYPE_BF16);
}

#ifdef __AVX512BF16__
// Loads 32 BF16 at p, those at or past n zero.
ALWAYS_INLINE __m512bh load32bh(const uint16_t *p, int n) {
    __mmask32 m = n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1);
    return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
}

#define DPBF16_CHUNK(n)                                                                 \
    do {                                                                                \
        __m512bh bv[TILE1];                                                             \
        UNROLL for (int c = 0; c < NR; c++) {                                           \
            _mm_prefetch((const char *)(b + (size_t)NR * K + (size_t)k * NR + c * 32), _MM_HINT_T0); \
            bv[c] = load32bh(b + (size_t)c * K + k, n);                                 \
        }                                                                               \
        UNROLL for (int r = 0; r < MR; r++) {                                           \
            _mm_prefetch((const char *)(a + (size_t)MR * K + (size_t)k * MR + r * 32), _MM_HINT_T0); \
            __m512bh av = load32bh(a + (size_t)r * K + k, n);                           \
            UNROLL for (int c = 0; c < NR; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], av, bv[c]); \
        }                                                                               \
    } while (0)

// The BF16 tile: vdpbf16ps over chunks of 32.
ALWAYS_INLINE void tile_dpbf16(const struct dot_args *g, int i0, int j0, int MR, int NR, double *res) {
    int K = g->K, k = 0;
    const uint16_t *a = (const uint16_t *)g->a + (size_t)i0 * K, *b = (const uint16_t *)g->b + (size_t)j0 * K;
    __m512 acc[TILE][TILE1];
    UNROLL for (int r = 0; r < MR; r++)
        UNROLL for (int c = 0; c < NR; c++) acc[r][c] = _mm512_setzero_ps();
    for (; k + 32 <= K; k += 32) DPBF16_CHUNK(32);
    if (k < K) DPBF16_CHUNK(K - k);
    UNROLL for (int r = 0; r < MR; r++)
        UNROLL for (int c = 0; c < NR; c++) res[r * TILE1 + c] = _mm512_reduce_add_ps(acc[r][c]);
}
#define TILE_BF16 tile_dpbf16
#else
#define TILE_BF16 tile_fma_bf16
#endif

// One instance per tile shape (MR, NR constant: the accumulators stay in registers).
#define TILE_CASES(F, g, i0, j0, mr, nr, res)                                  \
    switch ((mr) * 8 + (nr)) {                                                  \
    case 8 + 1: F(g, i0, j0, 1, 1, res); break;                                 \
    case 8 + 2: F(g, i0, j0, 1, 2, res); break;                                 \
    case 8 + 3: F(g, i0, j0, 1, 3, res); break;                                 \
    case 8 + 4: F(g, i0, j0, 1, 4, res); break;                                 \
    case 16 + 1: F(g, i0, j0, 2, 1, res); break;                                \
    case 16 + 2: F(g, i0, j0, 2, 2, res); break;                                \
    case 16 + 3: F(g, i0, j0, 2, 3, res); break;                                \
    case 16 + 4: F(g, i0, j0, 2, 4, res); break;                                \
    case 24 + 1: F(g, i0, j0, 3, 1, res); break;                                \
    case 24 + 2: F(g, i0, j0, 3, 2, res); break;                                \
    case 24 + 3: F(g, i0, j0, 3, 3, res); break;                                \
    case 24 + 4: F(g, i0, j0, 3, 4, res); break;                                \
    case 32 + 1: F(g, i0, j0, 4, 1, res); break;                                \
    case 32 + 2: F(g, i0, j0, 4, 2, res); break;                                \
    case 32 + 3: F(g, i0, j0, 4, 3, res); break;                                \
    case 32 + 4: F(g, i0, j0, 4, 4, res); break;                                \
    case 8 + 5: F(g, i0, j0, 1, 5, res); break;                                 \
    case 8 + 6: F(g, i0, j0, 1, 6, res); break;                                 \
    case 8 + 7: F(g, i0, j0, 1, 7, res); break;                                 \
    default: F(g, i0, j0, 1, 8, res); break;                                    \
    }

static void tile_avx512(const struct dot_args *g, int i0, int j0, int mr, int nr, double *res) {
    if (g->dt == DTYPE_BF16) {
        TILE_CASES(TILE_BF16, g, i0, j0, mr, nr, res);
    } else if (g->dt == DTYPE_FP64) {
        tile_c(g, i0, j0, mr, nr, res);
    } else if (g->dt == DTYPE_FP32) {
        TILE_CASES(tile_fma_f32, g, i0, j0, mr, nr, res);
    } else {
        TILE_CASES(tile_fma_f16, g, i0, j0, mr, nr, res);
    }
}
#define TILE_FN tile_avx512
#else
#define TILE_FN tile_c
#endif

// Tiles [t0, t1) of the (ceil(M / TILE) x ceil(N / tile_cols)) grid, the
// tiles of the larger operand outer (consecutive tiles share its rows: the
// smaller operand is read again from cache, the larger one once).
static int tile_cols(int M) { return M == 1 ? TILE1 : TILE; }

static void run_tiles(const struct dot_args *g, long t0, long t1) {
    int tn = tile_cols(g->M), mt = (g->M + TILE - 1) / TILE, nt = (g->N + tn - 1) / tn;
    bool rows_inner = g->M <= g->N; // the smaller operand's tiles inner (it stays in cache)
    double res[TILE * TILE1];
    for (long t = t0; t < t1; t++) {
        int i0 = (int)(rows_inner ? t % mt : t / nt) * TILE, j0 = (int)(rows_inner ? t / mt : t % nt) * tn;
        int mr = MIN(TILE, g->M - i0), nr = MIN(tn, g->N - j0);
        TILE_FN(g, i0, j0, mr, nr, res);
        for (int r = 0; r < mr; r++)
            for (int c = 0; c < nr; c++)
                store_out(g, (size_t)(i0 + r) * g->N + j0 + c, res[r * TILE1 + c]);
    }
}

// dst (cols, rows) = src (rows, cols)^T, elements of es (2, 4 or 8) bytes.
#define TRANSPOSE_AS(type)                                                                  \
    for (int r = 0; r < rows; r++)                                                          \
        for (int c = 0; c < cols; c++)                                                      \
            ((type *)dst)[(size_t)c * rows + r] = ((const type *)src)[(size_t)r * cols + c]
static void transpose(void *dst, const void *src, int rows, int cols, size_t es) {
    if (es == 2) TRANSPOSE_AS(uint16_t);
    else if (es == 4) TRANSPOSE_AS(uint32_t);
    else TRANSPOSE_AS(uint64_t);
}

void cpu_matmul_invariant(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                          int M, int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    CPU_CHECK_DTYPE("matmul_invariant", a.dtype);
    CPU_CHECK_SAME("matmul_invariant", "b", b, a.dtype);
    bool lowp = a.dtype == DTYPE_BF16 || a.dtype == DTYPE_FP16;
    CHECK(out.dtype == a.dtype || (lowp && out.dtype == DTYPE_FP32),
          "matmul_invariant: out is %s, a is %s", dtype_name(out.dtype), dtype_name(a.dtype));
    if (M == 0 || N == 0) return;
    size_t es = dtype_size(a.dtype);
    size_t na = trans_a ? (size_t)M * K * es : 0, nb = trans_b ? 0 : (size_t)K * N * es;
    char *scratch = na + nb ? cpu_scratch(be, (na + 63) / 64 * 64 + nb) : NULL;
    struct dot_args g = {a.data, b.data, out.data, a.dtype, out.dtype, M, N, K, alpha, beta};
    if (trans_a) transpose(scratch, a.data, K, M, es), g.a = scratch;
    if (!trans_b) transpose(scratch + (na + 63) / 64 * 64, b.data, K, N, es), g.b = scratch + (na + 63) / 64 * 64;
    long tiles = (long)((M + TILE - 1) / TILE) * ((N + tile_cols(M) - 1) / tile_cols(M));
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt == 1 || (double)M * N * K < DOT_SERIAL_WORK || tiles < 2) {
        run_tiles(&g, 0, tiles);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), used = omp_get_num_threads();
        long chunk = (tiles + used - 1) / used;
        run_tiles(&g, MIN(tiles, t * chunk), MIN(tiles, (t + 1) * chunk));
    }
}

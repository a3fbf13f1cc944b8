// cpu_fp8.c: FP8 ops of the CPU backend (kernels/ops.h, "FP8"), the
// reference the CUDA backend is checked against. Conversions: fp8.h (OCP
// E4M3/E5M2, round to nearest even, saturating). matmul_fp8 computes on the
// FP8 values' exact BF16 images through the backend's BF16 matmul (oneDNN where
// the CPU has BF16 instructions: BF16 products exact in FP32, FP32 sums).
#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "fp8.h"

// The loops below take |x| as FP32 bits: as unsigned integers they order
// like the magnitudes, and every NaN is above inf (0x7F800000), so one
// integer max is the amax and its NaN check, and it vectorizes.
#define INF_BITS 0x7f800000u

// max(amax, the magnitude of FP32 bits mbits), NaN if either is NaN.
static float amax_merge(float amax, uint32_t mbits) {
    if (isnan(amax) || mbits > INF_BITS) return NAN;
    float m = fp8_float_of(mbits);
    return amax > m ? amax : m;
}

// x[i] of x (FP32, BF16 or FP16) as FP32; LOADS(X) expands X once per dtype.
#define LOAD_FP32(i) (((const float *)x)[i])
#define LOAD_BF16(i) bf16_to_f32(((const uint16_t *)x)[i])
#define LOAD_FP16(i) fp16_to_f32(((const uint16_t *)x)[i])
#define LOADS(X)                                                                                   \
    switch (dt) {                                                                                  \
    case DTYPE_BF16: X(LOAD_BF16); break;                                                          \
    case DTYPE_FP16: X(LOAD_FP16); break;                                                          \
    default: X(LOAD_FP32); break;                                                                  \
    }

// The largest |x[i]| of x (n,) of dtype dt, as FP32 bits.
static uint32_t abs_max_bits(const void *x, enum dtype dt, size_t n) {
    uint32_t mb = 0;
#define ABS_MAX_LOOP(LOAD)                                                                         \
    _Pragma("omp parallel for schedule(static) reduction(max : mb)")                               \
    for (size_t i = 0; i < n; i++) {                                                               \
        uint32_t a = fp8_bits_of(LOAD(i)) & 0x7fffffffu;                                           \
        mb = a > mb ? a : mb;                                                                      \
    }
    LOADS(ABS_MAX_LOOP)
#undef ABS_MAX_LOOP
    return mb;
}

void cpu_fp8_amax(struct backend *be, struct tensor amax, struct tensor x, size_t n) {
    float *a = amax.data;
    a[0] = amax_merge(a[0], abs_max_bits(x.data, x.dtype, n));
}

// out[i] = fp8(x[i] * s) of format e4m3 (else E5M2) for x (n,) of dtype dt;
// returns how many finite x[i] were clipped (fp8_clips), and the largest |x[i]|
// as FP32 bits in *mbits. One loop per dtype and format, each vectorized.
static int64_t cast(uint8_t *out, uint32_t *mbits, bool e4m3, const void *x, enum dtype dt,
                    float s, size_t n) {
    int64_t sat = 0;
    uint32_t mb = 0;
#define CAST_LOOP(LOAD, CONV)                                                                      \
    _Pragma("omp parallel for schedule(static) reduction(+ : sat) reduction(max : mb)")            \
    for (size_t i = 0; i < n; i++) {                                                               \
        float v = LOAD(i), y = v * s;                                                              \
        uint32_t a = fp8_bits_of(v) & 0x7fffffffu;                                                 \
        out[i] = CONV(y);                                                                          \
        sat += (a < INF_BITS) & fp8_clips(fabsf(y), e4m3);                                         \
        mb = a > mb ? a : mb;                                                                      \
    }
#define CAST_E4M3(LOAD) CAST_LOOP(LOAD, fp8_e4m3_from_f32)
#define CAST_E5M2(LOAD) CAST_LOOP(LOAD, fp8_e5m2_from_f32)
    if (e4m3) {
        LOADS(CAST_E4M3)
    } else {
        LOADS(CAST_E5M2)
    }
#undef CAST_E4M3
#undef CAST_E5M2
#undef CAST_LOOP
    *mbits = mb;
    return sat;
}

void cpu_fp8_cast(struct backend *be, struct tensor out, struct tensor amax,
                  struct tensor saturated, struct tensor x, struct tensor scale, size_t n) {
    float s = ((const float *)scale.data)[0];
    uint32_t mbits;
    int64_t sat = cast(out.data, &mbits, out.dtype == DTYPE_FP8_E4M3, x.data, x.dtype, s, n);
    if (amax.numel) ((float *)amax.data)[0] = amax_merge(((float *)amax.data)[0], mbits);
    if (saturated.numel) ((int64_t *)saturated.data)[0] += sat;
}

void cpu_fp8_update_scale(struct backend *be, struct tensor scale, struct tensor scale_inv,
                          struct tensor history, struct tensor amax, int n, int len, float fp8_max,
                          int margin, bool most_recent) {
    float *sc = scale.data, *si = scale_inv.data, *h = history.data, *am = amax.data;
    float pow2 = ldexpf(1.0f, margin);
    for (int i = 0; i < n; i++) {
        float a = am[i];
        if (len > 0) {
            float *row = h + (size_t)i * len;
            memmove(row + 1, row, (size_t)(len - 1) * sizeof *row);
            row[0] = a;
            if (!most_recent)
                for (int j = 1; j < len; j++) a = fmaxf(a, row[j]); // a NaN entry is passed over
        }
        if (isfinite(a) && a > 0) {
            float s = (fp8_max / a) / pow2;
            sc[i] = isinf(s) ? FLT_MAX : s; // a tiny amax: the largest FP32 scale
        }
        si[i] = 1.0f / sc[i];
        am[i] = 0;
    }
}

// tab[b] = the BF16 image of FP8 code b of dtype dt (exact: 4 or 3
// significant bits, exponents within BF16's normal range).
static void bf16_table(uint16_t tab[256], enum dtype dt) {
    for (int b = 0; b < 256; b++) {
        float f = dt == DTYPE_FP8_E4M3 ? fp8_e4m3_to_f32((uint8_t)b) : fp8_e5m2_to_f32((uint8_t)b);
        tab[b] = (uint16_t)(fp8_bits_of(f) >> 16);
    }
}

static void to_bf16(uint16_t *dst, const uint8_t *src, enum dtype dt, size_t n) {
    uint16_t tab[256];
    bf16_table(tab, dt);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = tab[src[i]];
}

static size_t round_up64(size_t bytes) { return (bytes + 63) / 64 * 64; }

void cpu_matmul_fp8(struct backend *be, struct tensor out, struct tensor a, struct tensor b,
                    struct tensor scale_inv_a, struct tensor scale_inv_b, int M, int N, int K,
                    bool trans_a, bool trans_b, float beta) {
    if (M == 0 || N == 0) return;
    size_t mn = (size_t)M * N, mk = (size_t)M * K, kn = (size_t)K * N;
    float s = ((const float *)scale_inv_a.data)[0] * ((const float *)scale_inv_b.data)[0];
    // FP32 out without beta: the product goes to out and is scaled in place.
    bool direct = out.dtype == DTYPE_FP32 && beta == 0;
    size_t c_bytes = direct ? 0 : round_up64(mn * sizeof(float));
    size_t a_bytes = round_up64(mk * sizeof(uint16_t)), b_bytes = round_up64(kn * sizeof(uint16_t));
    char *stage = cpu_scratch_staging(be, c_bytes + a_bytes + b_bytes);
    float *c = direct ? out.data : (float *)stage;
    uint16_t *ab = (uint16_t *)(stage + c_bytes), *bb = (uint16_t *)(stage + c_bytes + a_bytes);
    to_bf16(ab, a.data, a.dtype, mk);
    to_bf16(bb, b.data, b.dtype, kn);
    // The table's matmul (this build's, OpenMP or serial; not the wrapper, which
    // would profile it as a matmul of its own).
    be->ops->matmul(be, tensor_view(c, DTYPE_FP32, mn), tensor_view(ab, DTYPE_BF16, mk),
                    tensor_view(bb, DTYPE_BF16, kn), M, N, K, trans_a, trans_b, 1.0f, 0.0f);
    // out = round(fmaf(beta, out, s * sum)); out is not read when beta is 0.
    if (out.dtype == DTYPE_FP32) {
        float *o = out.data;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < mn; i++) o[i] = beta != 0 ? fmaf(beta, o[i], s * c[i]) : s * c[i];
    } else {
        uint16_t *o = out.data;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < mn; i++)
            o[i] = bf16_from_f32(beta != 0 ? fmaf(beta, bf16_to_f32(o[i]), s * c[i]) : s * c[i]);
    }
}

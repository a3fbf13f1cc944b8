// test_fp8.c: the FP8 conversions (kernels/cpu/fp8.h) and the CPU backend's
// FP8 ops (kernels/ops.h "FP8": fp8_amax, fp8_cast, fp8_update_scale,
// matmul_fp8), on the OpenMP and the serial (one thread) kernels.
//
//   - conversions: hand-checked values (max, saturation, ties, subnormals,
//     NaN and inf of each sign), every FP8 byte widened and narrowed back;
//     and bit for bit against torch's float8_e4m3fn / float8_e5m2 (the
//     fixture of tests/reference/fp8_reference.py: all 65,536 BF16 patterns,
//     10^6 sampled FP32 values, every byte widened): test_fixture below;
//   - fp8_cast against the scalar conversion of x * scale for FP32, BF16 and
//     FP16 x, its fused amax and saturated count; fp8_amax with NaN and inf;
//   - fp8_update_scale: history shift, max vs most_recent, margin, amax 0,
//     inf, NaN keeping the scale, a tiny amax giving FLT_MAX, amax reset;
//   - matmul_fp8 in every layout (forward x @ w^T, dx = dy @ w, dw += dy^T @
//     x with FP32 out and beta 1, and the rest), E4M3 x E4M3, E5M2 x E4M3 and
//     E4M3 x E5M2, BF16 and FP32 out, against an FP64 sum of the same FP8
//     values, element by element within the FP32 accumulation bound (at
//     `matmul_bound`), BF16 outputs 98% equal to the FP64 result rounded;
//     NaN and inf operands reaching their rows; through oneDNN's BF16 GEMM
//     and through the FP32 fallback of CPUs without BF16 instructions.
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/fp8.h"
#include "kernels/ops.h"

// Whether fp8_cast counts ay = |x * scale| as clipped by saturation, written
// out independently of fp8_clips: rounding to nearest even on the format's
// grid continued past max (one more step of ulp(max): 32 for E4M3, 8192 for
// E5M2) gives more than max. max's last mantissa bit is even in E4M3
// (1.110b x 2^8), so the midpoint stays at max; odd in E5M2 (1.11b x 2^15),
// so the midpoint goes up.
static bool clipped(float ay, enum dtype fmt) {
    double max = fp8_max_finite(fmt), mid = max + (fmt == DTYPE_FP8_E4M3 ? 32 : 8192) / 2.0;
    return ay > mid || (ay == mid && fmt == DTYPE_FP8_E5M2);
}
#include "test.h"

static uint64_t rng = 0x3c6ef372fe94f82bull;

static double rnd(void) { // uniform in [-1, 1)
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2 - 1;
}

static uint32_t bits(float f) { return fp8_bits_of(f); }
static float from_bits(uint32_t u) { return fp8_float_of(u); }

static uint8_t to_fp8(enum dtype dt, float f) {
    return dt == DTYPE_FP8_E4M3 ? fp8_e4m3_from_f32(f) : fp8_e5m2_from_f32(f);
}
static float from_fp8(enum dtype dt, uint8_t b) {
    return dt == DTYPE_FP8_E4M3 ? fp8_e4m3_to_f32(b) : fp8_e5m2_to_f32(b);
}

// ---- conversions ---------------------------------------------------------------

static void test_known_values(void) {
    struct {
        float x;
        uint8_t e4m3, e5m2;
    } cases[] = {
        {0.0f, 0x00, 0x00}, {-0.0f, 0x80, 0x80}, {1.0f, 0x38, 0x3c}, {-2.0f, 0xc0, 0xc0},
        {448.0f, 0x7e, 0x5f}, {-448.0f, 0xfe, 0xdf},
        {449.0f, 0x7e, 0x5f}, {464.0f, 0x7e, 0x5f}, {1e30f, 0x7e, 0x7b}, // saturate
        {57344.0f, 0x7e, 0x7b}, {61440.0f, 0x7e, 0x7b}, {65536.0f, 0x7e, 0x7b},
        {-3e38f, 0xfe, 0xfb},
        {416.0f, 0x7d, 0x5e}, {432.0f, 0x7e, 0x5f}, // ties 416 (E5M2), 432 (E4M3)
        {1.0625f, 0x38, 0x3c}, {1.1875f, 0x3a, 0x3d}, // E4M3 ties to even (ulp 1/8 at 1)
        {1.125f, 0x39, 0x3c},                         // E5M2: tie between 1 and 1.25 -> 1
        {1.375f, 0x3b, 0x3e},                         // E5M2 tie 1.25 (odd) / 1.5 -> 1.5
        {0x1p-9f, 0x01, 0x18}, {0x1p-10f, 0x00, 0x14}, {0x1.000002p-10f, 0x01, 0x14},
        {0x3p-10f, 0x02, 0x1a}, {0x1p-6f, 0x08, 0x24}, {0x1.cp-7f, 0x07, 0x23}, // 7/8 * 2^-6
        {0x1p-16f, 0x00, 0x01}, {0x1p-17f, 0x00, 0x00}, {0x1.000002p-17f, 0x00, 0x01},
        {0x1p-14f, 0x00, 0x04}, {1e-45f, 0x00, 0x00}, {-1e-45f, 0x80, 0x80},
        {INFINITY, 0x7f, 0x7c}, {-INFINITY, 0xff, 0xfc},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t e4 = fp8_e4m3_from_f32(cases[i].x), e5 = fp8_e5m2_from_f32(cases[i].x);
        EXPECT(e4 == cases[i].e4m3, "e4m3(%a) = 0x%02x, expected 0x%02x", (double)cases[i].x, e4,
               cases[i].e4m3);
        EXPECT(e5 == cases[i].e5m2, "e5m2(%a) = 0x%02x, expected 0x%02x", (double)cases[i].x, e5,
               cases[i].e5m2);
    }
    // NaN keeps its sign, loses its payload.
    uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u};
    for (int i = 0; i < 4; i++) {
        uint8_t sign = (nans[i] >> 24) & 0x80;
        EXPECT(fp8_e4m3_from_f32(from_bits(nans[i])) == (sign | 0x7f), "e4m3(NaN %08x)", nans[i]);
        EXPECT(fp8_e5m2_from_f32(from_bits(nans[i])) == (sign | 0x7f), "e5m2(NaN %08x)", nans[i]);
    }
    EXPECT(fp8_e4m3_to_f32(0x7e) == 448.0f && fp8_e5m2_to_f32(0x7b) == 57344.0f, "max");
    EXPECT(bits(fp8_e4m3_to_f32(0xff)) == 0xfff00000u, "e4m3 0xff widens to %08x",
           bits(fp8_e4m3_to_f32(0xff)));
    EXPECT(bits(fp8_e5m2_to_f32(0x7d)) == 0x7fe00000u, "e5m2 0x7d widens to %08x",
           bits(fp8_e5m2_to_f32(0x7d)));
    EXPECT(fp8_e5m2_to_f32(0xfc) == -INFINITY, "e5m2 0xfc is -inf");
    EXPECT(fp8_e4m3_to_f32(0x01) == 0x1p-9f && fp8_e5m2_to_f32(0x01) == 0x1p-16f, "subnormals");
}

// Every byte widens and narrows back to itself (NaNs to sign | 0x7F), and the
// finite values increase with the code.
static void test_roundtrip(enum dtype dt) {
    float prev = -INFINITY;
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        float f = from_fp8(dt, (uint8_t)b);
        uint8_t back = to_fp8(dt, f);
        uint8_t expect = isnan(f) ? (uint8_t)((b & 0x80) | 0x7f) : (uint8_t)b;
        if (back != expect && bad++ < 5)
            printf("%s 0x%02x -> %a -> 0x%02x\n", dtype_name(dt), b, (double)f, back);
        if (b < 0x80 && !isnan(f)) {
            if (!(f > prev) && b > 0 && bad++ < 5) printf("%s 0x%02x not increasing\n", dtype_name(dt), b);
            prev = f;
        }
    }
    EXPECT(bad == 0, "%s: %d bytes do not round-trip", dtype_name(dt), bad);
}

// ---- the reference fixture (tests/reference/fp8_reference.py) ------------------

static struct backend *be;
static struct tensor alloc_t(enum dtype dt, size_t n);

#define FIXTURE_BIN "tests/reference/fixtures/fp8_bf16.bin"
#define FIXTURE_TXT "tests/reference/fixtures/fp8_reference.txt"

// The script's sample generator (its docstring): splitmix64, one draw per sample.
static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The FP32 bits of the midpoint between positive FP8 code c and c + 1.
static uint32_t midpoint_bits(uint32_t c, int mbits, int bias) {
    uint32_t e = c >> mbits, m = c & ((1u << mbits) - 1), sig = e == 0 ? m : (1u << mbits) + m;
    return bits(ldexpf(2.0f * sig + 1, (int)(e > 1 ? e : 1) - bias - mbits - 1));
}

static uint32_t sample_bits(uint64_t *state) {
    static const float anchors[] = {448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65536.0f,
                                    0x1p-6f, 0x1p-9f, 0x1p-10f, 0x1p-14f, 0x1p-16f, 0x1p-17f,
                                    1.0f, 240.0f};
    uint64_t r = splitmix64(state);
    uint32_t kind = r & 15, sign = (uint32_t)(r >> 63) << 31;
    if (kind < 4) return (uint32_t)(r >> 32);
    if (kind < 8) return sign | (uint32_t)(127 - 26 + (r >> 4) % 46) << 23 | ((r >> 10) & 0x7fffff);
    if (kind < 12) {
        bool e4 = kind < 10;
        uint32_t c = (uint32_t)((r >> 4) % (e4 ? 0x7e : 0x7b));
        return sign | (midpoint_bits(c, e4 ? 3 : 2, e4 ? 7 : 15) + (uint32_t)((r >> 12) % 5) - 2);
    }
    if (kind == 12)
        return sign | (bits(anchors[(r >> 4) % (sizeof anchors / sizeof anchors[0])]) +
                       (uint32_t)((r >> 12) % 17) - 8);
    if (kind == 13) {
        uint32_t mant = ((r >> 40) & 3) == 0 ? 0 : (r >> 8) & 0x7fffff;
        return sign | ((r >> 4) & 1 ? 255u : 0u) << 23 | mant;
    }
    return sign | (uint32_t)(127 - 26 + (r >> 4) % 46) << 23 | (uint32_t)((r >> 10) & 15) << 19 |
           (uint32_t)((r >> 14) & 1);
}

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

// All 65,536 BF16 patterns narrowed, against the fixture's bytes.
static void check_bf16_patterns(void) {
    FILE *f = fopen(FIXTURE_BIN, "rb");
    EXPECT(f, "cannot open %s (run from the repository root)", FIXTURE_BIN);
    if (!f) return;
    static uint8_t want[2][65536];
    size_t got = fread(want, 1, sizeof want, f);
    fclose(f);
    EXPECT(got == sizeof want, "%s: %zu bytes, expected %zu", FIXTURE_BIN, got, sizeof want);
    for (int fmt = 0; fmt < 2; fmt++) {
        int bad = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            float x = bf16_to_f32((uint16_t)h);
            uint8_t b = fmt ? fp8_e5m2_from_f32(x) : fp8_e4m3_from_f32(x);
            if (b != want[fmt][h] && bad++ < 5)
                printf("bf16 %04x (%a) -> %s 0x%02x, reference 0x%02x\n", h, (double)x,
                       fmt ? "e5m2" : "e4m3", b, want[fmt][h]);
        }
        EXPECT(bad == 0, "%s: %d of 65536 bf16 patterns differ from the reference",
               fmt ? "e5m2" : "e4m3", bad);
    }
}

// The same through the fp8_cast op (its vectorized loops), BF16 x, scale 1,
// and the ops' saturated count against the reference bytes.
static void check_bf16_patterns_op(void) {
    FILE *f = fopen(FIXTURE_BIN, "rb");
    if (!f) return; // reported by check_bf16_patterns
    static uint8_t want[2][65536];
    size_t got = fread(want, 1, sizeof want, f);
    fclose(f);
    if (got != sizeof want) return;
    struct tensor x = alloc_t(DTYPE_BF16, 65536), one = alloc_t(DTYPE_FP32, 1),
                  sat = alloc_t(DTYPE_I64, 1), out = alloc_t(DTYPE_FP8_E4M3, 65536);
    for (uint32_t h = 0; h < 65536; h++) ((uint16_t *)x.data)[h] = (uint16_t)h;
    ((float *)one.data)[0] = 1;
    for (int fmt = 0; fmt < 2; fmt++) {
        out.dtype = fmt ? DTYPE_FP8_E5M2 : DTYPE_FP8_E4M3;
        ((int64_t *)sat.data)[0] = 0;
        backend_fp8_cast(be, out, tensor_view(NULL, DTYPE_FP32, 0), sat, x, one, 65536);
        int bad = 0;
        int64_t n_sat = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            bad += ((uint8_t *)out.data)[h] != want[fmt][h];
            float v = fabsf(bf16_to_f32((uint16_t)h));
            n_sat += clipped(v, out.dtype) && v < INFINITY;
        }
        EXPECT(bad == 0, "fp8_cast of every bf16 pattern to %s: %d differ from the reference",
               dtype_name(out.dtype), bad);
        EXPECT(((int64_t *)sat.data)[0] == n_sat, "fp8_cast saturated %" PRId64 ", expected %" PRId64,
               ((int64_t *)sat.data)[0], n_sat);
    }
    backend_dealloc(be, x.data), backend_dealloc(be, one.data), backend_dealloc(be, sat.data);
    backend_dealloc(be, out.data);
}

// The fixture's widening tables, sample hashes and every 1000th sample.
static void check_samples(void) {
    FILE *f = fopen(FIXTURE_TXT, "r");
    EXPECT(f, "cannot open %s (run from the repository root)", FIXTURE_TXT);
    if (!f) return;
    long n = 0, block = 0, every = 0;
    unsigned long long seed = 0;
    char line[256];
    while (fgets(line, sizeof line, f) && line[0] == '#') {}
    bool header = sscanf(line, "samples %ld block %ld every %ld seed %llx", &n, &block, &every,
                         &seed) == 4 && n > 0 && block > 0 && n % block == 0 && every > 0;
    EXPECT(header, "%s: bad header %s", FIXTURE_TXT, line);
    if (!header) {
        fclose(f);
        return;
    }
    uint8_t *out[2] = {malloc((size_t)n), malloc((size_t)n)};
    uint32_t *in = malloc((size_t)n * sizeof *in);
    uint64_t state = seed;
    for (long i = 0; i < n; i++) {
        in[i] = sample_bits(&state);
        out[0][i] = fp8_e4m3_from_f32(from_bits(in[i]));
        out[1][i] = fp8_e5m2_from_f32(from_bits(in[i]));
    }
    int widen_bad = 0, widen_rows = 0, hash_bad = 0, hashes = 0, sample_bad = 0, samples = 0;
    while (fgets(line, sizeof line, f)) {
        char fmt[8];
        unsigned row, w[8];
        long at;
        unsigned long long h;
        unsigned x, e4, e5;
        if (sscanf(line, "widen_%4s %x %x %x %x %x %x %x %x %x", fmt, &row, &w[0], &w[1], &w[2],
                   &w[3], &w[4], &w[5], &w[6], &w[7]) == 10) {
            bool e4m3 = strcmp(fmt, "e4m3") == 0;
            widen_rows++;
            for (unsigned k = 0; k < 8; k++) {
                uint8_t b = (uint8_t)(row + k);
                uint32_t got = bits(e4m3 ? fp8_e4m3_to_f32(b) : fp8_e5m2_to_f32(b));
                if (got != w[k] && widen_bad++ < 5)
                    printf("widen %s 0x%02x: %08x, reference %08x\n", fmt, b, got, w[k]);
            }
        } else if (sscanf(line, "hash_%4s %ld %llx", fmt, &at, &h) == 3) {
            int k = strcmp(fmt, "e4m3") == 0 ? 0 : 1;
            hashes++;
            EXPECT(at >= 0 && at + block <= n, "hash at %ld", at);
            if (at < 0 || at + block > n) continue;
            uint64_t got = fnv1a64(out[k] + at, (size_t)block);
            if (got != h && hash_bad++ < 5)
                printf("%s samples %ld..%ld: hash %016llx, reference %016llx (see the samples "
                       "listed below)\n", fmt, at, at + block - 1, (unsigned long long)got, h);
        } else if (sscanf(line, "sample %ld %x %x %x", &at, &x, &e4, &e5) == 4) {
            samples++;
            EXPECT(at >= 0 && at < n && in[at] == x, "sample %ld: generated %08x, reference %08x",
                   at, at >= 0 && at < n ? in[at] : 0, x);
            if (at < 0 || at >= n) continue;
            if ((out[0][at] != e4 || out[1][at] != e5) && sample_bad++ < 10)
                printf("sample %ld %08x (%a): e4m3 0x%02x e5m2 0x%02x, reference 0x%02x 0x%02x\n",
                       at, x, (double)from_bits(x), out[0][at], out[1][at], e4, e5);
        }
    }
    fclose(f);
    EXPECT(widen_rows == 64 && widen_bad == 0, "widening: %d rows, %d bytes differ", widen_rows,
           widen_bad);
    EXPECT(hashes == 2 * n / block && hash_bad == 0, "samples: %d of %d block hashes differ",
           hash_bad, hashes);
    EXPECT(samples == n / every && sample_bad == 0, "samples: %d of %d listed samples differ",
           sample_bad, samples);
    printf("fixture: 65536 bf16 patterns, %ld samples (%d hashes), 512 widenings compared\n", n,
           hashes);
    free(out[0]), free(out[1]), free(in);
}

// ---- ops ---------------------------------------------------------------------------

static struct tensor alloc_t(enum dtype dt, size_t n) {
    return tensor_view(backend_alloc(be, n * dtype_size(dt) + 8), dt, n);
}

static void set_x(struct tensor t, size_t i, float v) {
    switch (t.dtype) {
    case DTYPE_BF16: ((uint16_t *)t.data)[i] = bf16_from_f32(v); break;
    case DTYPE_FP16: ((uint16_t *)t.data)[i] = fp16_from_f32(v); break;
    default: ((float *)t.data)[i] = v; break;
    }
}
static float get_x(struct tensor t, size_t i) {
    switch (t.dtype) {
    case DTYPE_BF16: return bf16_to_f32(((uint16_t *)t.data)[i]);
    case DTYPE_FP16: return fp16_to_f32(((uint16_t *)t.data)[i]);
    default: return ((float *)t.data)[i];
    }
}

// fp8_cast of n values of dtype xt (a few inf/NaN when special) by scale s.
static void check_cast(enum dtype xt, enum dtype ft, float s, bool special) {
    size_t n = 5000;
    struct tensor x = alloc_t(xt, n), out = alloc_t(ft, n), sc = alloc_t(DTYPE_FP32, 1),
                  amax = alloc_t(DTYPE_FP32, 1), sat = alloc_t(DTYPE_I64, 1);
    float fmax = fp8_max_finite(ft);
    for (size_t i = 0; i < n; i++) {
        double r = rnd();
        // magnitudes from 2^-30 to 2^20 times max / s: subnormals, saturation
        set_x(x, i, (float)((r < 0 ? -1 : 1) * fmax / s * pow(2, -30 + 50 * fabs(rnd()))));
    }
    if (special) {
        set_x(x, 7, INFINITY), set_x(x, 100, -INFINITY), set_x(x, 2000, NAN);
        set_x(x, 2001, -NAN);
    }
    ((float *)sc.data)[0] = s;
    ((float *)amax.data)[0] = 0.5f;
    ((int64_t *)sat.data)[0] = 3;
    memset(out.data, 0x55, n);
    backend_fp8_cast(be, out, amax, sat, x, sc, n);
    int64_t n_sat = 3;
    float m = 0.5f;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float v = get_x(x, i), y = v * s;
        uint8_t want = to_fp8(ft, y), got = ((uint8_t *)out.data)[i];
        if (got != want && bad++ < 5)
            printf("cast %s->%s: x %a * %a: 0x%02x, expected 0x%02x\n", dtype_name(xt),
                   dtype_name(ft), (double)v, (double)s, got, want);
        n_sat += isfinite(v) && clipped(fabsf(y), ft);
        m = fmaxf(m, fabsf(v));
    }
    EXPECT(bad == 0, "fp8_cast %s -> %s scale %g: %d wrong", dtype_name(xt), dtype_name(ft),
           (double)s, bad);
    int64_t got_sat = ((int64_t *)sat.data)[0];
    EXPECT(got_sat == n_sat, "fp8_cast saturated %" PRId64 ", expected %" PRId64, got_sat, n_sat);
    EXPECT(n_sat > 3 + 10 || xt == DTYPE_FP16, "too few saturated values to test: %" PRId64, n_sat);
    float got_amax = ((float *)amax.data)[0];
    if (special)
        EXPECT(isnan(got_amax), "fp8_cast amax with NaN in x: %g", (double)got_amax);
    else
        EXPECT(got_amax == m, "fp8_cast amax %a, expected %a", (double)got_amax, (double)m);
    // without the optional outputs: the same bytes
    uint8_t *first = malloc(n);
    memcpy(first, out.data, n);
    memset(out.data, 0x55, n);
    backend_fp8_cast(be, out, tensor_view(NULL, DTYPE_FP32, 0), tensor_view(NULL, DTYPE_I64, 0), x,
                     sc, n);
    EXPECT(memcmp(first, out.data, n) == 0, "fp8_cast without amax and saturated differs");
    free(first);
    backend_dealloc(be, x.data), backend_dealloc(be, out.data), backend_dealloc(be, sc.data);
    backend_dealloc(be, amax.data), backend_dealloc(be, sat.data);
}

static void test_cast(void) {
    enum dtype xts[] = {DTYPE_FP32, DTYPE_BF16, DTYPE_FP16};
    for (int i = 0; i < 3; i++)
        for (int f = 0; f < 2; f++) {
            enum dtype ft = f ? DTYPE_FP8_E5M2 : DTYPE_FP8_E4M3;
            check_cast(xts[i], ft, 1.0f, false);
            check_cast(xts[i], ft, 37.25f, true);
            check_cast(xts[i], ft, 0.0123f, i == 0);
        }
}

static void test_amax(void) {
    size_t n = 1000;
    struct tensor x = alloc_t(DTYPE_BF16, n), amax = alloc_t(DTYPE_FP32, 1);
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        set_x(x, i, (float)rnd() * 3);
        m = fmaxf(m, fabsf(get_x(x, i)));
    }
    float *a = amax.data;
    a[0] = 0;
    backend_fp8_amax(be, amax, x, n);
    EXPECT(a[0] == m, "fp8_amax %a, expected %a", (double)a[0], (double)m);
    a[0] = 100;
    backend_fp8_amax(be, amax, x, n);
    EXPECT(a[0] == 100, "fp8_amax keeps a larger amax: %g", (double)a[0]);
    set_x(x, 500, -INFINITY);
    a[0] = 0;
    backend_fp8_amax(be, amax, x, n);
    EXPECT(isinf(a[0]) && a[0] > 0, "fp8_amax with -inf in x: %g", (double)a[0]);
    set_x(x, 501, NAN);
    backend_fp8_amax(be, amax, x, n);
    EXPECT(isnan(a[0]), "fp8_amax with NaN in x: %g", (double)a[0]);
    backend_fp8_amax(be, amax, x, 0);
    EXPECT(isnan(a[0]), "fp8_amax of nothing keeps a NaN amax: %g", (double)a[0]);
    backend_dealloc(be, x.data), backend_dealloc(be, amax.data);
}

// One fp8_update_scale of n = 2 tensors; history (2, len).
struct scale_state {
    float scale[2], scale_inv[2], amax[2], history[2 * 4];
};

static void update(struct scale_state *st, int len, float fp8_max, int margin, bool most_recent) {
    struct tensor sc = alloc_t(DTYPE_FP32, 2), si = alloc_t(DTYPE_FP32, 2),
                  am = alloc_t(DTYPE_FP32, 2), h = alloc_t(DTYPE_FP32, (size_t)2 * len);
    memcpy(sc.data, st->scale, sizeof st->scale), memcpy(am.data, st->amax, sizeof st->amax);
    memcpy(h.data, st->history, (size_t)2 * len * sizeof(float));
    memset(si.data, 0x7f, 2 * sizeof(float));
    backend_fp8_update_scale(be, sc, si, len ? h : tensor_view(NULL, DTYPE_FP32, 0), am, 2, len,
                             fp8_max, margin, most_recent);
    memcpy(st->scale, sc.data, sizeof st->scale), memcpy(st->amax, am.data, sizeof st->amax);
    memcpy(st->scale_inv, si.data, sizeof st->scale_inv);
    memcpy(st->history, h.data, (size_t)2 * len * sizeof(float));
    backend_dealloc(be, sc.data), backend_dealloc(be, si.data), backend_dealloc(be, am.data);
    backend_dealloc(be, h.data);
}

static void test_update_scale(void) {
    // current scaling (len 0): scale = fp8_max / amax, amax reset
    struct scale_state st = {.scale = {1, 1}, .amax = {3.5f, 0.001f}};
    update(&st, 0, 448, 0, false);
    EXPECT(st.scale[0] == 448.0f / 3.5f && st.scale[1] == 448.0f / 0.001f, "current: scales %g %g",
           (double)st.scale[0], (double)st.scale[1]);
    EXPECT(st.scale_inv[0] == 1 / st.scale[0] && st.scale_inv[1] == 1 / st.scale[1], "scale_inv");
    EXPECT(st.amax[0] == 0 && st.amax[1] == 0, "amax reset to 0");
    // margin: (fp8_max / a) / 2^margin in that order
    st = (struct scale_state){.scale = {1, 1}, .amax = {3.0f, 7.0f}};
    update(&st, 0, 57344, 2, false);
    EXPECT(st.scale[0] == (57344.0f / 3.0f) / 4.0f && st.scale[1] == (57344.0f / 7.0f) / 4.0f,
           "margin 2: %a", (double)st.scale[0]);
    update(&st, 0, 57344, -1, true); // amax now 0: kept whatever the margin
    EXPECT(st.scale[0] == (57344.0f / 3.0f) / 4.0f, "amax 0 keeps the scale");
    // amax 0, inf, NaN keep the scale; a tiny amax gives FLT_MAX
    float keep[] = {0.0f, INFINITY, NAN, -1.0f};
    for (int i = 0; i < 4; i++) {
        st = (struct scale_state){.scale = {5, 6}, .amax = {keep[i], 0x1p-140f}};
        update(&st, 0, 448, 0, false);
        EXPECT(st.scale[0] == 5 && st.scale_inv[0] == 0.2f, "amax %g keeps the scale: %g",
               (double)keep[i], (double)st.scale[0]);
        EXPECT(st.scale[1] == FLT_MAX && st.scale_inv[1] == 1 / FLT_MAX, "tiny amax: scale %g",
               (double)st.scale[1]);
        EXPECT(st.amax[0] == 0, "amax reset after %g", (double)keep[i]);
    }
    // delayed scaling: history (2, 3) newest first, max over it or most recent
    for (int mr = 0; mr < 2; mr++) {
        st = (struct scale_state){.scale = {1, 1}};
        float seq0[] = {1, 4, 2, 0.5f, 0.25f, NAN}, seq1[] = {8, 1, 1, 1, 2, 2};
        float want_a0_max[] = {1, 4, 4, 4, 2, 0.5f}, want_a1_max[] = {8, 8, 8, 1, 2, 2};
        float prev0 = 1;
        for (int step = 0; step < 6; step++) {
            st.amax[0] = seq0[step], st.amax[1] = seq1[step];
            float old[6];
            memcpy(old, st.history, sizeof old);
            update(&st, 3, 448, 0, mr);
            EXPECT(st.history[0] == seq0[step] || (isnan(seq0[step]) && isnan(st.history[0])),
                   "history[0][0] is the new amax");
            EXPECT(st.history[1] == old[0] && st.history[2] == old[1], "row 0 shifted");
            EXPECT(st.history[3] == seq1[step] && st.history[4] == old[3] && st.history[5] == old[4],
                   "row 1 shifted");
            float a0 = mr ? seq0[step] : want_a0_max[step], a1 = mr ? seq1[step] : want_a1_max[step];
            float want0 = isnan(a0) ? prev0 : 448 / a0;
            EXPECT(st.scale[0] == want0 && st.scale[1] == 448 / a1,
                   "%s step %d: scales %g %g, expected %g %g", mr ? "most_recent" : "max", step,
                   (double)st.scale[0], (double)st.scale[1], (double)want0, (double)(448 / a1));
            EXPECT(st.amax[0] == 0 && st.amax[1] == 0, "amax reset");
            prev0 = st.scale[0];
        }
    }
}

// ---- matmul_fp8 ---------------------------------------------------------------------

// FP32 unit roundoff, and the out dtype's.
#define U32 0x1p-24
static double unit_roundoff(enum dtype out) { return out == DTYPE_BF16 ? 0x1p-8 : U32; }

// The bound on |got - ref| for one element, ref = s * sum_k a_k b_k + beta *
// o in FP64 on the same FP8 values: FP32 sums in any order are within
// (K - 1) u sum_k |a_k b_k| (Higham, Accuracy and Stability of Numerical
// Algorithms, 2nd ed., eq. 3.5; products of BF16 images are exact in FP32),
// s * sum and the FMA with beta * o add a rounding each (2 u of their
// magnitudes), then the rounding to out's dtype (u_out |ref|). Taken as
// (K + 2) u s sum|a b| + 2 u |beta o| + u_out |ref| (+ the smallest BF16
// normal, for outputs near zero).
static double matmul_bound(int K, double s, double sum_abs, double beta_o, double ref, enum dtype od) {
    return (K + 2) * U32 * s * sum_abs + 2 * U32 * fabs(beta_o) + unit_roundoff(od) * fabs(ref) +
           0x1p-126;
}

// One matmul_fp8 (M, N, K) of FP8 operands of dtypes at, bt quantised from
// random values with scales, out of dtype od, against FP64.
static void check_matmul(enum dtype at, enum dtype bt, enum dtype od, int M, int N, int K,
                         bool ta, bool tb, float beta, const char *what) {
    size_t mk = (size_t)M * K, kn = (size_t)K * N, mn = (size_t)M * N;
    struct tensor a = alloc_t(at, mk), b = alloc_t(bt, kn), out = alloc_t(od, mn),
                  sa = alloc_t(DTYPE_FP32, 1), sb = alloc_t(DTYPE_FP32, 1);
    // the operands as a cast would give them: scales about max / amax
    float scale_a = fp8_max_finite(at) / 2.7f, scale_b = fp8_max_finite(bt) / 0.05f;
    for (size_t i = 0; i < mk; i++) ((uint8_t *)a.data)[i] = to_fp8(at, (float)(rnd() * 2.7) * scale_a);
    for (size_t i = 0; i < kn; i++) ((uint8_t *)b.data)[i] = to_fp8(bt, (float)(rnd() * 0.05) * scale_b);
    ((float *)sa.data)[0] = 1 / scale_a, ((float *)sb.data)[0] = 1 / scale_b;
    double *o0 = malloc(mn * sizeof *o0);
    for (size_t i = 0; i < mn; i++) {
        if (beta != 0) {
            float v = (float)rnd();
            if (od == DTYPE_BF16) ((uint16_t *)out.data)[i] = bf16_from_f32(v);
            else ((float *)out.data)[i] = v;
        } else if (od == DTYPE_BF16) ((uint16_t *)out.data)[i] = 0x7fc0; // NaN: must not be read
        else ((float *)out.data)[i] = NAN;
        o0[i] = beta != 0 ? get_x(out, i) : 0;
    }
    backend_matmul_fp8(be, out, a, b, sa, sb, M, N, K, ta, tb, beta);
    double s = (double)((float *)sa.data)[0] * ((float *)sb.data)[0];
    s = (float)s; // the FP32 product of the scale inverses, as the op forms it
    int bad = 0;
    size_t rounded = 0; // BF16 out equal to the FP64 result rounded to nearest even
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double sum = 0, sum_abs = 0;
            for (int k = 0; k < K; k++) {
                double x = from_fp8(at, ((uint8_t *)a.data)[ta ? (size_t)k * M + i : (size_t)i * K + k]);
                double y = from_fp8(bt, ((uint8_t *)b.data)[tb ? (size_t)j * K + k : (size_t)k * N + j]);
                sum += x * y, sum_abs += fabs(x * y);
            }
            size_t ij = (size_t)i * N + j;
            double ref = s * sum + beta * o0[ij], got = get_x(out, ij);
            double bound = matmul_bound(K, s, sum_abs, beta * o0[ij], ref, od);
            double err = fabs(got - ref);
            if (!(err <= bound) && bad++ < 5)
                printf("%s (%d, %d): %.9g, expected %.9g (bound %.3g)\n", what, i, j, got, ref, bound);
            if (err / bound > worst) worst = err / bound;
            rounded += od == DTYPE_BF16 && got == bf16_to_f32(bf16_from_f32((float)ref));
        }
    EXPECT(bad == 0, "%s: %d of %zu elements beyond the FP32 accumulation bound", what, bad, mn);
    // all but a few (FP32 sums next to a BF16 halfway point): a truncating
    // or twice-rounding epilogue fails
    EXPECT(od != DTYPE_BF16 || rounded >= 0.98 * mn, "%s: only %zu of %zu BF16 outputs rounded to "
           "nearest", what, rounded, mn);
    if (getenv("TEST_VERBOSE")) printf("  %-50s worst error / bound %.3f\n", what, worst);
    free(o0);
    backend_dealloc(be, a.data), backend_dealloc(be, b.data), backend_dealloc(be, out.data);
    backend_dealloc(be, sa.data), backend_dealloc(be, sb.data);
}

static void test_matmul(void) {
    struct {
        enum dtype a, b;
    } fmts[] = {{DTYPE_FP8_E4M3, DTYPE_FP8_E4M3}, {DTYPE_FP8_E5M2, DTYPE_FP8_E4M3},
                {DTYPE_FP8_E4M3, DTYPE_FP8_E5M2}};
    for (int f = 0; f < 3; f++) {
        char what[128];
        const char *fa = dtype_name(fmts[f].a), *fb = dtype_name(fmts[f].b);
        // a linear layer y = x @ w^T, x (M=B*T, K=in), w (N=out, K): forward,
        // dx = dy @ w (dy (M, N=out), w (N=out, in)), dw += dy^T @ x
        int rows = 67, in = 96, outf = 40;
        snprintf(what, sizeof what, "forward x @ w^T, %s x %s, bf16 out", fa, fb);
        check_matmul(fmts[f].a, fmts[f].b, DTYPE_BF16, rows, outf, in, false, true, 0, what);
        snprintf(what, sizeof what, "dx = dy @ w, %s x %s, bf16 out", fa, fb);
        check_matmul(fmts[f].a, fmts[f].b, DTYPE_BF16, rows, in, outf, false, false, 0, what);
        snprintf(what, sizeof what, "dw += dy^T @ x, %s x %s, fp32 out", fa, fb);
        check_matmul(fmts[f].a, fmts[f].b, DTYPE_FP32, outf, in, rows, true, false, 1, what);
        for (int l = 0; l < 4; l++)
            for (int o = 0; o < 2; o++)
                for (int bt = 0; bt < 2; bt++) {
                    snprintf(what, sizeof what, "%s x %s trans %d%d %s out beta %d", fa, fb, l >> 1,
                             l & 1, o ? "fp32" : "bf16", bt);
                    check_matmul(fmts[f].a, fmts[f].b, o ? DTYPE_FP32 : DTYPE_BF16, 19, 23, 300,
                                 l >> 1, l & 1, bt ? 1.0f : 0.0f, what);
                }
    }
    // larger: oneDNN's blocked kernels and several threads
    check_matmul(DTYPE_FP8_E4M3, DTYPE_FP8_E4M3, DTYPE_BF16, 256, 192, 512, false, true, 0,
                 "256x192x512 forward");
    check_matmul(DTYPE_FP8_E5M2, DTYPE_FP8_E4M3, DTYPE_FP32, 192, 128, 256, true, false, 1,
                 "192x128x256 dw");
    check_matmul(DTYPE_FP8_E4M3, DTYPE_FP8_E4M3, DTYPE_FP32, 5, 7, 0, false, false, 0, "K = 0");
}

// A NaN (E4M3 0x7F) or inf (E5M2 0x7C) operand reaches the output's row.
static void test_matmul_nonfinite(void) {
    int M = 4, N = 3, K = 8;
    struct tensor a = alloc_t(DTYPE_FP8_E5M2, (size_t)M * K), b = alloc_t(DTYPE_FP8_E4M3, (size_t)K * N),
                  out = alloc_t(DTYPE_BF16, (size_t)M * N), one = alloc_t(DTYPE_FP32, 1);
    ((float *)one.data)[0] = 1;
    memset(a.data, 0x3c, (size_t)M * K); // 1.0
    memset(b.data, 0x38, (size_t)K * N); // 1.0
    ((uint8_t *)a.data)[1 * K + 3] = 0x7c;  // +inf in row 1
    ((uint8_t *)a.data)[2 * K + 5] = 0xff;  // NaN in row 2
    backend_matmul_fp8(be, out, a, b, one, one, M, N, K, false, false, 0);
    for (int j = 0; j < N; j++) {
        float r0 = get_x(out, (size_t)j), r1 = get_x(out, (size_t)N + j), r2 = get_x(out, 2 * (size_t)N + j);
        EXPECT(r0 == 8 && isinf(r1) && r1 > 0 && isnan(r2), "non-finite rows: %g %g %g", (double)r0,
               (double)r1, (double)r2);
    }
    backend_dealloc(be, a.data), backend_dealloc(be, b.data), backend_dealloc(be, out.data);
    backend_dealloc(be, one.data);
}

static void run_ops(void) {
    check_bf16_patterns_op();
    test_cast();
    test_amax();
    test_update_scale();
    test_matmul();
    test_matmul_nonfinite();
}

int main(void) {
    test_known_values();
    test_roundtrip(DTYPE_FP8_E4M3);
    test_roundtrip(DTYPE_FP8_E5M2);
    check_bf16_patterns();
    check_samples();
    be = backend_cpu_init(0);
    printf("matmul_fp8 through %s\n", ((struct cpu_backend *)be->impl)->bf16_gemm
                                         ? "oneDNN's BF16 matmul (CPU has AVX512_BF16)"
                                         : "the FP32 fallback of BF16 matmul");
    run_ops();
    // BF16 matmul's FP32 fallback (no AVX512_BF16): it converts the BF16
    // images again in the backend's scratch, which must not hold them
    ((struct cpu_backend *)be->impl)->bf16_gemm = false;
    test_matmul();
    test_matmul_nonfinite();
    backend_free(be);
    be = backend_cpu_init(1); // the serial kernels
    run_ops();
    backend_free(be);
    return test_finish("test_fp8");
}

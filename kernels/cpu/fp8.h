// fp8.h: FP32 <-> FP8 storage (OCP E4M3 and E5M2), bit-exact and portable
// (integer arithmetic on the FP32 bits: no FP environment, no intrinsics),
// for the CPU backend's FP8 ops (cpu_fp8.c), the tests, and whoever mirrors
// them (define FP8_FN before including to qualify the functions, e.g. as
// __host__ __device__ inline; default static inline).
//
// Formats: OCP "8-bit Floating Point Specification (OFP8)" rev 1.0 (2023).
//   E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448 (S.1111.110),
//         no infinities, NaN is S.1111.111 only; subnormals m * 2^-9.
//   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; max 57344
//         (S.11110.11), infinities S.11111.00, NaNs S.11111.{01,10,11};
//         subnormals m * 2^-16.
// Narrowing (the "saturating" conversion of the spec, as cuda_fp8.h's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) for finite x):
//   - finite x: rounded to nearest, ties to even, at the format's precision
//     (subnormals included; magnitudes below half the smallest subnormal
//     become a zero of x's sign); a finite |x| > max becomes +-max;
//   - NaN: sign | 0x7F (both formats; the payload is not kept);
//   - +-inf: sign | 0x7F, NaN, in E4M3 (it has no infinities: an overflow
//     the step's non-finite check must see), sign | 0x7C, inf, in E5M2.
// Widening is exact; a NaN keeps its sign and its mantissa bits at the top
// of FP32's mantissa, quiet bit set (IEEE widening as x86 does it):
//   E4M3 S.1111.111 -> sign | 0x7FF00000; E5M2 S.11111.mm -> sign | 0x7FC00000 | mm << 21.
// The reference: tests/reference/fp8_reference.py (torch float8_e4m3fn /
// float8_e5m2 on clamped finite values; non-finite values by the rules
// above) and its fixture, compared bit for bit by tests/unit/test_fp8.c.
#ifndef TRIDENT_CPU_FP8_H
#define TRIDENT_CPU_FP8_H

#include <stdint.h>
#include <string.h>

#ifndef FP8_FN
#define FP8_FN static inline
#endif

FP8_FN uint32_t fp8_bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

FP8_FN float fp8_float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// The FP8 code of |x| (abs: FP32 bits without the sign, finite, at most the
// format's max) rounded to nearest even, for a format of mbits mantissa bits
// and exponent bias `bias`: exact integer rounding of the 24-bit significand.
// Branch-free (selects, not returns), so that the loops calling it vectorize.
FP8_FN uint32_t fp8_round_abs(uint32_t abs, int mbits, int bias) {
    int ex = (int)(abs >> 23) - 127, emin = 1 - bias; // unbiased exponent; the smallest normal's
    uint32_t sig = (abs & 0x7fffffu) | 0x800000u;     // value sig * 2^(ex - 23)
    // bits dropped: 23 - mbits, more below emin (subnormal results); from 25
    // on, the value is below half the smallest subnormal and rounds to 0 (so
    // does an FP32 subnormal, ex = -127, whose sig has a wrong implicit one
    // but stays below 2^24, the halfway point at shift 25).
    int shift = 23 - mbits + (ex < emin ? emin - ex : 0);
    shift = shift < 25 ? shift : 25;
    uint32_t q = sig >> shift, rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
    q += (rem > half) | ((rem == half) & q); // ties to even
    // Normal: q in [2^mbits, 2^(mbits+1)], the exponent field ex + bias minus
    // the implicit one q carries (q = 2^(mbits+1) carries into the exponent);
    // subnormal: q is the code (q = 2^mbits is the smallest normal's code).
    return ((uint32_t)(ex >= emin ? ex + bias - 1 : 0) << mbits) + q;
}

// FP32 -> E4M3 (saturating; NaN and +-inf -> sign | 0x7F).
FP8_FN uint8_t fp8_e4m3_from_f32(float f) {
    uint32_t u = fp8_bits_of(f), sign = (u >> 24) & 0x80, abs = u & 0x7fffffffu;
    uint32_t sat = abs < 0x43e00000u ? abs : 0x43e00000u; // beyond 448: 448
    uint32_t code = abs >= 0x7f800000u ? 0x7f : fp8_round_abs(sat, 3, 7); // NaN, inf: NaN
    return (uint8_t)(sign | code);
}

// FP32 -> E5M2 (saturating; NaN -> sign | 0x7F, +-inf -> sign | 0x7C).
FP8_FN uint8_t fp8_e5m2_from_f32(float f) {
    uint32_t u = fp8_bits_of(f), sign = (u >> 24) & 0x80, abs = u & 0x7fffffffu;
    uint32_t sat = abs < 0x47600000u ? abs : 0x47600000u; // beyond 57344: 57344
    uint32_t code = abs > 0x7f800000u ? 0x7f : abs == 0x7f800000u ? 0x7c : fp8_round_abs(sat, 2, 15);
    return (uint8_t)(sign | code);
}

// FP8 code b of a format (mbits mantissa bits, bias; all-ones exponent
// field: NaN/inf, as both formats' widening reads it) -> FP32, exact.
FP8_FN float fp8_widen(uint8_t b, int mbits, int bias) {
    int ebits = 7 - mbits;
    uint32_t sign = (uint32_t)(b & 0x80) << 24, e = (b & 0x7f) >> mbits, m = b & ((1u << mbits) - 1);
    if (e == (1u << ebits) - 1 && (mbits == 2 || m == (1u << mbits) - 1))
        return fp8_float_of(sign | 0x7f800000u | (m ? 0x400000u | m << (23 - mbits) : 0));
    if (e == 0) { // zero or subnormal: m * 2^(1 - bias - mbits), exact in FP32
        float v = (float)m * fp8_float_of((uint32_t)(127 + 1 - bias - mbits) << 23);
        return sign ? -v : v;
    }
    return fp8_float_of(sign | (e + 127 - (uint32_t)bias) << 23 | m << (23 - mbits));
}

// Whether saturation clips a magnitude ay = |x * scale| (>= 0, finite or
// inf): whether rounding to nearest even, as if the format went on past its
// max, would give more than max. E4M3: above 464, the midpoint of 448 and
// 480, whose tie goes to the even 448; E5M2: 61440 and above, the midpoint
// of 57344 and 65536, whose tie goes to the even 65536. FP8_CLIP_E5M2 is the
// FP32 just below 61440, so both read "ay > clip" (the CUDA kernel's form).
#define FP8_CLIP_E4M3 464.0f
#define FP8_CLIP_E5M2 0x1.dffffep+15f
FP8_FN int fp8_clips(float ay, int e4m3) { return ay > (e4m3 ? FP8_CLIP_E4M3 : FP8_CLIP_E5M2); }

// E4M3 -> FP32 (exact; 0x7F/0xFF -> NaN of that sign).
FP8_FN float fp8_e4m3_to_f32(uint8_t b) { return fp8_widen(b, 3, 7); }
// E5M2 -> FP32 (exact; +-inf; NaNs keep sign and mantissa).
FP8_FN float fp8_e5m2_to_f32(uint8_t b) { return fp8_widen(b, 2, 15); }

#endif

// half.h: BF16 and FP16 storage <-> FP32, bit-exact and portable (no
// _Float16, no intrinsics), for the CPU backend's 16-bit kernels and the
// tests that build their inputs. Narrowing rounds to nearest, ties to even
// (as __float2bfloat16_rn / __float2half_rn and torch's .to(bfloat16 / half));
// NaN stays NaN (quiet), overflow becomes inf; FP16 keeps its subnormals.
// BF16: 1 sign, 8 exponent, 7 stored mantissa bits (8 with the implicit one);
// FP16: 1 sign, 5 exponent, 10 stored mantissa bits (11), max 65504.
#ifndef TRIDENT_CPU_HALF_H
#define TRIDENT_CPU_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t half_bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float half_float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float bf16_to_f32(uint16_t h) { return half_float_of((uint32_t)h << 16); }

// Branch-free (masks, not a return or a select), so that loops storing BF16
// vectorize, also those that call a vector math function (GCC's
// if-conversion gives up on a loop with a call in it).
static inline uint16_t bf16_from_f32(float f) {
    uint32_t u = half_bits_of(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;         // ties to even
    uint32_t nan = (u >> 16) | 0x40;                                  // quiet NaN
    uint32_t is_nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u); // all ones if NaN
    return (uint16_t)((nan & is_nan) | (rounded & ~is_nan));
}

static inline float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) { // zero or subnormal: m * 2^-24, exact in FP32
        float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    if (e == 0x1f) return half_float_of(sign | 0x7f800000u | (m << 13)); // inf, NaN
    return half_float_of(sign | ((e + 112) << 23) | (m << 13));         // rebias 15 -> 127
}

static inline uint16_t fp16_from_f32(float f) {
    uint32_t u = half_bits_of(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff); // quiet NaN
    if (a >= 0x477ff000u) return sign | 0x7c00; // >= 65520 (halfway past 65504): inf
    if (a < 0x38800000u) {
        // below 2^-14, FP16's subnormal range: adding 0.5 (whose FP32 ulp is
        // 2^-24, FP16's subnormal step) rounds to nearest even in FP32; the
        // mantissa bits are then the FP16 bits (0x400 = the smallest normal).
        float s = half_float_of(a) + 0.5f;
        return sign | (uint16_t)(half_bits_of(s) - 0x3f000000u);
    }
    a += 0xfffu + ((a >> 13) & 1); // ties to even on the 13 dropped bits
    return sign | (uint16_t)((a - 0x38000000u) >> 13); // rebias 127 -> 15
}

#endif

// rng.c: counter-based normal numbers (see rng.h).
#include "rng.h"

#include <math.h>

uint64_t rng_splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// FNV-1a of a string, to separate the streams of different tensors.
static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

// A uniform double in (0, 1) from 53 random bits.
static double unit_open(uint64_t bits) { return ((double)(bits >> 11) + 0.5) * 0x1.0p-53; }

void rng_fill_normal(float *out, size_t n, uint64_t seed, const char *name, float std) {
    if (std == 0.0f) {
        for (size_t i = 0; i < n; i++) out[i] = 1.0f;
        return;
    }
    uint64_t key = rng_splitmix64(seed ^ hash_name(name));
    for (size_t i = 0; i < n; i++) {
        uint64_t r1 = rng_splitmix64(key + 2 * i), r2 = rng_splitmix64(key + 2 * i + 1);
        double u1 = unit_open(r1), u2 = unit_open(r2);
        out[i] = (float)(std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
}

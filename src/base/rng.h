// rng.h: seeded, layout-independent random numbers (weight initialisation, sampling).
#ifndef TRIDENT_RNG_H
#define TRIDENT_RNG_H

#include <stddef.h>
#include <stdint.h>

// Fills out (n,) with normal(0, std) values where element i depends only on
// (seed, name, i): counter-based (splitmix64 of a hash of the three, then the
// Box-Muller transform), so every tensor-parallel or pipeline layout, which
// slices the same global tensor differently, initialises the same model.
// std == 0 fills ones (RMSNorm gains). Source of the scheme: counter-based
// RNGs (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3").
void rng_fill_normal(float *out, size_t n, uint64_t seed, const char *name, float std);

// splitmix64 (Steele et al. 2014): a 64-bit mix used as a stateless hash/RNG.
uint64_t rng_splitmix64(uint64_t x);

#endif

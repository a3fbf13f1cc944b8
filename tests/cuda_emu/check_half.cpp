// check_half.cpp: the emulation's __float2half_rn / __half2float (cuda_emu.h)
// against the CPU backend's conversions (kernels/cpu/half.h) on every FP32
// and every FP16 bit pattern: the same bits, except that a NaN need only stay
// a NaN (the emulation returns the canonical 0x7fff, as CUDA does). Run by
// tests/e2e/cuda_emulated.sh before the kernels' test; exit 1 on a mismatch.
#include "cuda_emu.h"

#include <cstdio>

extern "C" {
#include "kernels/cpu/half.h"
}

int main() {
    unsigned long bad = 0;
    for (uint64_t i = 0; i <= 0xffffffffull; i++) {
        uint32_t u = (uint32_t)i;
        float f;
        memcpy(&f, &u, 4);
        uint16_t emu = __float2half_rn(f).x, ref = fp16_from_f32(f);
        bool ok = std::isnan(f) ? (emu & 0x7c00) == 0x7c00 && (emu & 0x3ff) : emu == ref;
        if (!ok && bad++ < 10) printf("float %08x: emulation %04x, half.h %04x\n", u, emu, ref);
    }
    for (uint32_t h = 0; h < 0x10000; h++) {
        __half x;
        x.x = (uint16_t)h;
        float emu = __half2float(x), ref = fp16_to_f32((uint16_t)h);
        bool ok = std::isnan(ref) ? std::isnan(emu) : !memcmp(&emu, &ref, 4);
        if (!ok && bad++ < 20) printf("half %04x: emulation %a, half.h %a\n", h, emu, ref);
    }
    printf("check_half: %lu mismatches over 2^32 floats and 2^16 halves\n", bad);
    return bad != 0;
}

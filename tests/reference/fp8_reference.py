#!/usr/bin/env python3
"""fp8_reference.py: the FP8 conversions' reference (issue 29, acceptance 1).

Writes, with torch's float8_e4m3fn / float8_e5m2 (run with .venv-hf/bin/python):
  tests/reference/fixtures/fp8_bf16.bin   every BF16 bit pattern 0..65535 (as
      the FP32 value it is, scale 1) narrowed: 65,536 E4M3 bytes, then 65,536
      E5M2 bytes;
  tests/reference/fixtures/fp8_reference.txt   the widening of every FP8 byte
      (FP32 bits), and for SAMPLES FP32 values drawn by the generator below:
      FNV-1a 64 hashes of the E4M3 and of the E5M2 bytes per block of BLOCK
      samples, and every 1000th sample (index, FP32 bits, E4M3, E5M2) for
      locating a mismatch.
tests/unit/test_fp8.c regenerates the samples with the same generator and
compares kernels/cpu/fp8.h bit for bit. Rerunning this script rewrites both
files byte-identically.

The rules compared (OCP 8-bit floating point spec rev 1.0, saturating, round
to nearest even; kernels/ops.h fp8_cast):
  - finite x: clamped to [-max, max] (448 E4M3, 57344 E5M2), then torch's
    .to(float8_*) rounds to nearest even. The clamp is the saturation: torch
    2.15 itself saturates finite E4M3 values but not E5M2 ones (61440 and
    above become inf), so the clamp makes the reference independent of that;
  - NaN: sign | 0x7F in both formats (torch's own result, asserted below);
  - +-inf: E5M2 sign | 0x7C (torch's own, asserted); E4M3 sign | 0x7F, NaN:
    trident's contract, so that an overflow stays visible to the step's
    non-finite check, where torch 2.15 gives +-448 (and CUDA's
    __NV_SATFINITE too) — the only place the reference is not torch's output;
  - widening: torch's .to(float32) of every byte, NaN bits included (E4M3
    0x7F -> 0x7FF00000, E5M2 NaNs quieted: 0x7D -> 0x7FE00000).
Torch's conversion of a NaN FP32 *to BF16* loses the NaN's sign (0xFFFF for
both signs on this CPU), so the BF16 inputs are made from bit patterns, never
through torch's FP32 -> BF16.

The sample generator (reproduced in test_fp8.c): splitmix64 (Steele, Lea,
Flood 2014; the generator of Java's SplittableRandom) from state SEED; each
sample takes one 64-bit draw r and is, by kind = r & 15:
  0-3   r >> 32 as FP32 bits (any value: extreme exponents, FP32 subnormals,
        inf, NaN payloads);
  4-7   sign r >> 63, exponent -26 + (r >> 4) % 46 (below E4M3/E5M2's
        subnormals to past E5M2's max), mantissa (r >> 10) & 0x7FFFFF;
  8-9   a tie of E4M3: code c = (r >> 4) % 0x7E, the midpoint between c and
        c + 1, moved by d = (r >> 12) % 5 - 2 FP32 ulps (bits + d), sign r >> 63;
  10-11 the same for E5M2, c = (r >> 4) % 0x7B;
  12    an anchor of ANCHORS[(r >> 4) % len] moved by (r >> 12) % 17 - 8 FP32
        ulps, sign r >> 63 (the max, the overflow points, the subnormal and
        normal boundaries);
  13    exponent field 0 or 255 ((r >> 4) & 1), mantissa (r >> 8) & 0x7FFFFF,
        zeroed when (r >> 40) & 3 == 0, sign r >> 63 (zeros, FP32 subnormals,
        inf, NaNs);
  14-15 sign r >> 63, exponent -26 + (r >> 4) % 46, mantissa
        ((r >> 10) & 15) << 19 | ((r >> 14) & 1) (few significant bits: exact
        FP8 values, ties and values one FP32 ulp off them).
The midpoint of code c (positive, mbits mantissa bits, bias b), E = c >> mbits,
m = c & (2^mbits - 1): sig = m if E == 0 else 2^mbits + m, midpoint =
(2 sig + 1) * 2^(max(E, 1) - b - mbits - 1), exact in FP32.
FNV-1a 64: h = 0xCBF29CE484222325; for each byte: h ^= byte, h *= 0x100000001B3
(mod 2^64).
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, 'fixtures')
SAMPLES = 1_000_000
BLOCK = 10_000
EVERY = 1000
SEED = 0x2900F8
MASK = (1 << 64) - 1
E4M3 = dict(name='e4m3', dtype=torch.float8_e4m3fn, max=448.0, inf=0x7F, mbits=3, bias=7)
E5M2 = dict(name='e5m2', dtype=torch.float8_e5m2, max=57344.0, inf=0x7C, mbits=2, bias=15)
ANCHORS = [448.0, 464.0, 480.0, 57344.0, 61440.0, 65536.0, 2.0**-6, 2.0**-9, 2.0**-10,
           2.0**-14, 2.0**-16, 2.0**-17, 1.0, 240.0]


def f32_bits(v):
    return int(np.array([v], dtype=np.float32).view(np.uint32)[0])


def midpoint_bits(c, mbits, bias):
    e, m = c >> mbits, c & ((1 << mbits) - 1)
    sig = m if e == 0 else (1 << mbits) + m
    return f32_bits(np.ldexp(2.0 * sig + 1, max(e, 1) - bias - mbits - 1))


def samples():
    """SAMPLES FP32 bit patterns (np.uint32) from the generator of the docstring."""
    anchors = [f32_bits(a) for a in ANCHORS]
    out = np.empty(SAMPLES, dtype=np.uint32)
    state = SEED
    for i in range(SAMPLES):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        r = z ^ (z >> 31)
        kind, sign = r & 15, (r >> 63) << 31
        if kind < 4:
            u = r >> 32
        elif kind < 8:
            u = sign | (127 - 26 + (r >> 4) % 46) << 23 | ((r >> 10) & 0x7FFFFF)
        elif kind < 12:
            fmt = E4M3 if kind < 10 else E5M2
            c = (r >> 4) % (0x7E if kind < 10 else 0x7B)
            u = sign | (midpoint_bits(c, fmt['mbits'], fmt['bias']) + (r >> 12) % 5 - 2)
        elif kind == 12:
            u = sign | (anchors[(r >> 4) % len(anchors)] + (r >> 12) % 17 - 8)
        elif kind == 13:
            mant = 0 if (r >> 40) & 3 == 0 else (r >> 8) & 0x7FFFFF
            u = sign | (255 if (r >> 4) & 1 else 0) << 23 | mant
        else:
            u = sign | (127 - 26 + (r >> 4) % 46) << 23 | ((r >> 10) & 15) << 19 | ((r >> 14) & 1)
        out[i] = u
    return out


def narrow(bits, fmt):
    """FP32 bit patterns (np.uint32) -> FP8 bytes (np.uint8) by the rules above."""
    x = torch.from_numpy(bits.view(np.int32).copy()).view(torch.float32)
    sign = torch.from_numpy(((bits >> 31) << 7).astype(np.uint8))
    finite, nan, inf = torch.isfinite(x), torch.isnan(x), torch.isinf(x)
    clamped = torch.where(finite, x.clamp(-fmt['max'], fmt['max']), torch.zeros_like(x))
    out = clamped.to(fmt['dtype']).view(torch.uint8).clone()
    torch_own = x.to(fmt['dtype']).view(torch.uint8)
    # torch's own NaN (and E5M2 inf) results are the rule: checked, not assumed
    assert torch.equal(torch_own[nan], (sign | 0x7F)[nan]), fmt['name'] + ': torch NaN'
    if fmt['inf'] == 0x7C:
        assert torch.equal(torch_own[inf], (sign | 0x7C)[inf]), 'e5m2: torch inf'
    out[nan] = (sign | 0x7F)[nan]
    out[inf] = (sign | fmt['inf'])[inf]
    return out.numpy()


def widen(fmt):
    """Every FP8 byte -> FP32 bits (np.uint32) by torch."""
    codes = torch.arange(256, dtype=torch.uint8).view(fmt['dtype'])
    return codes.to(torch.float32).view(torch.int32).numpy().view(np.uint32)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def main():
    torch.set_num_threads(1)
    bf16 = (np.arange(65536, dtype=np.uint32) << 16).astype(np.uint32)
    with open(os.path.join(FIXTURES, 'fp8_bf16.bin'), 'wb') as f:
        for fmt in (E4M3, E5M2):
            f.write(narrow(bf16, fmt).tobytes())
    s = samples()
    out = {fmt['name']: narrow(s, fmt) for fmt in (E4M3, E5M2)}
    lines = ['# fp8_reference.txt: written by tests/reference/fp8_reference.py (torch %s);'
             % torch.__version__.split('+')[0],
             '# read by tests/unit/test_fp8.c. Rules and generator: the script\'s docstring.',
             'samples %d block %d every %d seed 0x%X' % (SAMPLES, BLOCK, EVERY, SEED)]
    for fmt in (E4M3, E5M2):
        w = widen(fmt)
        for row in range(0, 256, 8):
            lines.append('widen_%s %02x %s' % (fmt['name'], row, ' '.join('%08x' % v for v in w[row:row + 8])))
    for fmt in (E4M3, E5M2):
        o = out[fmt['name']]
        for blk in range(0, SAMPLES, BLOCK):
            lines.append('hash_%s %d %016x' % (fmt['name'], blk, fnv1a64(o[blk:blk + BLOCK].tobytes())))
    for i in range(0, SAMPLES, EVERY):
        lines.append('sample %d %08x %02x %02x' % (i, s[i], out['e4m3'][i], out['e5m2'][i]))
    with open(os.path.join(FIXTURES, 'fp8_reference.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    for fmt, top in ((E4M3, 0x7E), (E5M2, 0x7B)):
        o = out[fmt['name']] & 0x7F
        print('%s: %d samples saturated to max, %d NaN, %d zero, %d ties drawn' % (
            fmt['name'], np.sum(o == top), np.sum(o == 0x7F), np.sum(o == 0), SAMPLES // 8),
            file=sys.stderr)

if __name__ == '__main__':
    main()

// generic/elementwise.h: SwiGLU and add bodies, instantiated by
// cpu_elementwise.c for FP32, FP64, BF16 and FP16 (see cpu.h). Each element
// is independent: loaded to creal, computed there, stored once.

// out (n,) = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
// Math: Shazeer 2020 eq. 6; HF LlamaMLP act_fn(gate_proj(x)) * up_proj(x).
static void FN(swiglu_forward)(real *out, const real *gate, const real *up, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        creal g = LD(gate[i]);
        out[i] = ST(g / (1 + EXP(-g)) * LD(up[i]));
    }
}

// dgate (n,) = dout * up * silu'(gate), dup (n,) = dout * silu(gate), with
// silu'(g) = sig(g) (1 + g (1 - sig(g))), sig(g) = 1 / (1 + exp(-g)).
static void FN(swiglu_backward)(real *dgate, real *dup, const real *dout, const real *gate,
                                const real *up, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        creal g = LD(gate[i]), sig = 1 / (1 + EXP(-g)), d = LD(dout[i]);
        dgate[i] = ST(d * LD(up[i]) * sig * (1 + g * (1 - sig)));
        dup[i] = ST(d * g * sig);
    }
}

// out (n,) = a + b; out may alias a or b (each element is read before written).
static void FN(add)(real *out, const real *a, const real *b, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = ST(LD(a[i]) + LD(b[i]));
}

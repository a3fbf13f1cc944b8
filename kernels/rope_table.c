// rope_table.c: the host helpers rope_inv_freq, rope_table_fill{,_scaled}{,_f64}
// and doc_start_fill of kernels/ops.h.
#include <math.h>

#include "ops.h"

double rope_inv_freq(int i, int D, double theta, const struct rope_scaling *sc) {
    double inv_freq = pow(theta, -2.0 * i / D);
    if (!sc || sc->type == ROPE_SCALING_NONE) return inv_freq;
    if (sc->type == ROPE_SCALING_LINEAR) return inv_freq / sc->factor;
    // ROPE_SCALING_LLAMA3: transformers' _compute_llama3_parameters
    double old_ctx = sc->original_max_pos;
    double low_wavelen = old_ctx / sc->low_freq_factor, high_wavelen = old_ctx / sc->high_freq_factor;
    double wavelen = 2 * M_PI / inv_freq;
    if (wavelen < high_wavelen) return inv_freq;
    if (wavelen > low_wavelen) return inv_freq / sc->factor;
    double smooth = (old_ctx / wavelen - sc->low_freq_factor) /
                    (sc->high_freq_factor - sc->low_freq_factor);
    return (1 - smooth) * inv_freq / sc->factor + smooth * inv_freq;
}

// cos, sin (Tmax, D/2) of angle p * inv_freq, angle and cos/sin in double
// (HF's inv_freq = 1 / theta^(arange(0, D, 2) / D), without its fp32 rounding,
// which at p ~ 4096 would shift angles by ~1e-4 rad).
void rope_table_fill_scaled_f64(double *cos_out, double *sin_out, int Tmax, int D, double theta,
                                const struct rope_scaling *sc) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        double inv_freq = rope_inv_freq(i, D, theta, sc);
        for (int p = 0; p < Tmax; p++) {
            double angle = p * inv_freq;
            cos_out[(size_t)p * half + i] = cos(angle);
            sin_out[(size_t)p * half + i] = sin(angle);
        }
    }
}

void rope_table_fill_scaled(float *cos_out, float *sin_out, int Tmax, int D, double theta,
                            const struct rope_scaling *sc) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        double inv_freq = rope_inv_freq(i, D, theta, sc);
        for (int p = 0; p < Tmax; p++) {
            double angle = p * inv_freq;
            cos_out[(size_t)p * half + i] = (float)cos(angle);
            sin_out[(size_t)p * half + i] = (float)sin(angle);
        }
    }
}

void rope_table_fill_f64(double *cos_out, double *sin_out, int Tmax, int D, double theta) {
    rope_table_fill_scaled_f64(cos_out, sin_out, Tmax, D, theta, NULL);
}

void rope_table_fill(float *cos_out, float *sin_out, int Tmax, int D, double theta) {
    rope_table_fill_scaled(cos_out, sin_out, Tmax, D, theta, NULL);
}

void doc_start_fill(int32_t *doc_start, const int32_t *tokens, int B, int T, int32_t eot) {
    for (int b = 0; b < B; b++) {
        const int32_t *tok = tokens + (size_t)b * T;
        int32_t *ds = doc_start + (size_t)b * T, start = 0;
        for (int t = 0; t < T; t++) {
            if (t > 0 && tok[t - 1] == eot) start = t;
            ds[t] = start;
        }
    }
}

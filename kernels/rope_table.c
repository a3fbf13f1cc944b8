// rope_table.c: the host helpers rope_table_fill{,_f64} and doc_start_fill of
// kernels/ops.h.
#include <math.h>

#include "ops.h"

// cos, sin (Tmax, D/2) of angle p * theta^(-2i/D), angle and cos/sin in double
// (HF's inv_freq = 1 / theta^(arange(0, D, 2) / D), without its fp32 rounding,
// which at p ~ 4096 would shift angles by ~1e-4 rad).
void rope_table_fill_f64(double *cos_out, double *sin_out, int Tmax, int D, double theta) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        double inv_freq = pow(theta, -2.0 * i / D);
        for (int p = 0; p < Tmax; p++) {
            double angle = p * inv_freq;
            cos_out[(size_t)p * half + i] = cos(angle);
            sin_out[(size_t)p * half + i] = sin(angle);
        }
    }
}

void rope_table_fill(float *cos_out, float *sin_out, int Tmax, int D, double theta) {
    int half = D / 2;
    for (int i = 0; i < half; i++) {
        double inv_freq = pow(theta, -2.0 * i / D);
        for (int p = 0; p < Tmax; p++) {
            double angle = p * inv_freq;
            cos_out[(size_t)p * half + i] = (float)cos(angle);
            sin_out[(size_t)p * half + i] = (float)sin(angle);
        }
    }
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

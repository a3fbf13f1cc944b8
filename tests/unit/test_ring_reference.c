// test_ring_reference.c: context-parallel ring attention through the block
// ops (backend_attention_block_forward / _backward, kernels/ops.h) against
// float64 PyTorch full causal attention (tests/reference/fixtures/ring.h5,
// from tests/reference/ring_reference.py): issue 26, acceptance 2.
//
// For each fixture size (T 1024: B 1, H 4, Hkv 2, D 2; T 64: B 1, H 4, Hkv
// 2, D 8), plain causal (an empty q_doc) and with documents crossing the
// chunk boundaries, and cp = 2 and 4: T is split into 2 cp load-balanced
// chunks (rank r holds chunks r and 2 cp - 1 - r), the ring schedule of
// ring_schedule.h runs in one process (each rank's q against each rank's k/v
// in ring order, forward with accumulate, then backward blocks accumulating
// dq and the travelling dk, dv), and the reassembled out, lse, dq, dk, dv
// must match the reference: relative error ||got - ref|| / ||ref|| <= 1e-12
// for FP64 storage, 1e-5 for FP32, and for BF16 4 u (out) / 8 u (dq, dk, dv)
// with u = 2^-8 (its inputs are BF16 values in the fixture, so only the
// outputs' roundings count: out is rounded at each of the cp merges and
// each gradient at each of its cp additions), lse (FP32) 1e-5.
// In a build with the CUDA backend and a device (make CUDA=1, or the
// emulated build, make EMU=1) the ring runs on it too, FP32 and BF16 (the
// CUDA backend has no FP64 storage), at the same tolerances.
// RING_FIXTURE overrides the fixture's path (to check that a perturbed
// fixture fails).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "h5fixture.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "ring_schedule.h"
#include "test.h"

static void check_case(struct backend *be, hid_t f, const char *cs, bool docs, enum dtype dt, int cp) {
    char name[128];
    int B = (int)h5fixture_attr_f64(f, cs, "B"), T = (int)h5fixture_attr_f64(f, cs, "T");
    int H = (int)h5fixture_attr_f64(f, cs, "H"), Hkv = (int)h5fixture_attr_f64(f, cs, "Hkv");
    int D = (int)h5fixture_attr_f64(f, cs, "D");
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * H * T;
    struct h5fixture_shape sh;
    double *in[5];
    static const char *inputs[] = {"q", "k", "v", "dout", "doc_start"};
    size_t sizes[] = {nq, nk, nk, nq, (size_t)B * T};
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "%s/%s", cs, inputs[i]);
        in[i] = h5fixture_read_f64(f, name, &sh);
        if (sh.numel != sizes[i]) h5fixture_fail(f, "%s holds %zu elements, expected %zu", name, sh.numel, sizes[i]);
    }
    struct ring_io io = {B, T, H, Hkv, D, in[0], in[1], in[2], in[3], docs ? in[4] : NULL,
                         xmalloc(nq * 8), xmalloc(nl * 8), xmalloc(nq * 8), xmalloc(nk * 8),
                         xmalloc(nk * 8)};
    // poison: an element the ring does not write back fails
    for (size_t i = 0; i < nq; i++) io.out[i] = io.dq[i] = NAN;
    for (size_t i = 0; i < nk; i++) io.dk[i] = io.dv[i] = NAN;
    for (size_t i = 0; i < nl; i++) io.lse[i] = NAN;
    ring_attention_run(be, dt, cp, &io);

    double u = 0x1p-8, tol_out = 1e-12, tol_grad = 1e-12, tol_lse = 1e-12;
    if (dt == DTYPE_FP32) tol_out = tol_grad = tol_lse = 1e-5;
    if (dt == DTYPE_BF16) tol_out = 4 * u, tol_grad = 8 * u, tol_lse = 1e-5;
    static const char *outputs[] = {"out", "lse", "dq", "dk", "dv"};
    double *got[] = {io.out, io.lse, io.dq, io.dk, io.dv};
    size_t n[] = {nq, nl, nq, nk, nk};
    double tol[] = {tol_out, tol_lse, tol_grad, tol_grad, tol_grad};
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "%s/%s/%s", cs, docs ? "docs" : "causal", outputs[i]);
        double *ref = h5fixture_read_f64(f, name, &sh);
        if (sh.numel != n[i]) h5fixture_fail(f, "%s holds %zu elements, expected %zu", name, sh.numel, n[i]);
        size_t nan = 0;
        for (size_t j = 0; j < n[i]; j++) nan += isnan(got[i][j]);
        char what[160];
        snprintf(what, sizeof what, "%s %s cp %d: %s", be->ops->name, dtype_name(dt), cp, name);
        EXPECT(nan == 0, "%s: %zu of %zu elements NaN / not written", what, nan, n[i]);
        if (nan == 0) EXPECT_REL(n[i], got[i], ref, tol[i], what);
        free(ref);
    }
    for (int i = 0; i < 5; i++) free(in[i]);
    free(io.out), free(io.lse), free(io.dq), free(io.dk), free(io.dv);
}

int main(void) {
    const char *path = getenv("RING_FIXTURE") ? getenv("RING_FIXTURE")
                                               : "tests/reference/fixtures/ring.h5";
    hid_t f = h5fixture_open(path);
    struct error err = {0};
    struct backend *bes[2] = {backend_init(BACKEND_CPU, 0, 0, &err), NULL};
    if (backend_has_cuda() && backend_device_count() > 0) {
        bes[1] = backend_init(BACKEND_CUDA, 0, 0, &err);
        EXPECT(bes[1] != NULL, "backend_init(cuda, 0): %s", err.msg);
    }
    static const char *cases[] = {"T1024", "T64"};
    static const enum dtype dts[] = {DTYPE_FP64, DTYPE_FP32, DTYPE_BF16};
    for (int b = 0; b < 2 && bes[b]; b++)
        for (int c = 0; c < 2; c++)
            for (int docs = 0; docs <= 1; docs++)
                for (int d = b; d < 3; d++) // the CUDA backend: no FP64
                    for (int cp = 2; cp <= 4; cp += 2)
                        check_case(bes[b], f, cases[c], docs, dts[d], cp);
    for (int b = 0; b < 2; b++) backend_free(bes[b]);
    h5fixture_close(f);
    return test_finish("test_ring_reference");
}

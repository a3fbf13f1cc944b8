// check_host_work.cpp: the host's work per training step on the CUDA backend
// (issue 24, "host work per step"), counted by the emulation's counters
// (emu_stat, tests/cuda_emu/cuda_runtime_api.h) around train_step calls of a
// small model on one emulated device, against the CPU backend's losses:
//  1. the loss is summed on the device and read once a step: the
//     device-to-host copies and the host waits (syncs) of a step with 4
//     microbatches equal those of a step with 1 (before: one copy and one
//     stream synchronisation of the losses per microbatch);
//  2. batches are staged in pinned memory: no host-to-device copy from
//     pageable memory during a step (before: tokens and targets, per
//     microbatch);
//  3. cuBLASLt descriptors, layouts, preferences and heuristic answers are
//     made once per GEMM problem: none after the first step (before: four
//     objects per GEMM);
//     and every operand of every cuBLASLt matmul is 256-byte aligned
//     (before: parameters at 64 bytes in fp32, 32 in bf16, activations at 64);
//  4. scratch is sized at model_init: no cudaMalloc or cudaFree during any
//     step, the first included (before: grown at first use);
// in fp32, with every step's loss and gradient norm within 1e-5 of the CPU
// backend's, in bf16 and in bf16 with FP8 linear layers (hybrid, delayed
// scaling: the FP8 GEMMs' plans and their transposed operands' scratch
// made before or in the first step; counters only). Exit 1 on a failed
// check. Run by tests/e2e/cuda_host_work.sh.
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <cstring>

#ifndef _Noreturn
#define _Noreturn __attribute__((noreturn))
#endif
extern "C" {
#include "base/common.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "train/train_step.h"
#include <cuda_runtime_api.h>
}

#include "check.h"

// N = B T = 128 rows: more than the RMSNorm backward's DW_CHUNKS (64), so a
// scratch bound computed for the three-kernel path alone is seen to be short.
enum { B = 2, T = 64, MAX_MICRO = 4, V = 256 };

struct run {
    struct backend *be;
    struct model *m;
    struct optimizer *opt;
};

static struct llama_config config(void) {
    struct llama_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = V, c.d_model = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2;
    c.ffn_dim = 160, c.max_seq_len = 64, c.rope_theta = 10000.0, c.norm_eps = 1e-5f;
    c.tie_embeddings = true, c.init_std = 0.02f, c.label_smoothing = 0.1f;
    return c;
}

static struct optimizer_config opt_config(void) {
    struct optimizer_config o;
    memset(&o, 0, sizeof o);
    o.lr = 1e-3, o.min_lr = 1e-4, o.warmup_steps = 1, o.steps = 8;
    o.beta1 = 0.9f, o.beta2 = 0.95f, o.eps = 1e-8f, o.weight_decay = 0.1f, o.grad_clip = 1.0f;
    return o;
}

static struct run open_run(enum backend_kind kind, enum dtype dtype, bool fp8) {
    struct run r;
    struct error err;
    memset(&err, 0, sizeof err);
    r.be = backend_init(kind, 0, 1, &err);
    CHECK(r.be, "backend_init: %s", err.msg);
    struct llama_config cfg = config();
    struct model_shard shard = model_shard_full(&cfg);
    CHECK(!model_init(&r.m, r.be, &cfg, &shard, dtype, B, T, 1, &err), "model_init: %s", err.msg);
    if (fp8) {
        struct model_fp8_config fc;
        memset(&fc, 0, sizeof fc);
        fc.on = true, fc.grad = DTYPE_FP8_E5M2, fc.delayed = true, fc.history_len = 16;
        CHECK(!model_fp8_init(r.m, &fc, &err), "model_fp8_init: %s", err.msg);
    }
    struct optimizer_config oc = opt_config();
    CHECK(!optimizer_init(&r.opt, r.be, r.m, &oc, NULL, &err), "optimizer_init: %s", err.msg);
    return r;
}

static void close_run(struct run *r) {
    optimizer_free(r->opt);
    model_free(r->m);
    backend_free(r->be);
}

static const char *const names[] = {"d2h_copies", "syncs",  "pageable_h2d", "lt_setups",
                                    "mallocs",    "frees",  "lt_unaligned"};
enum { D2H, SYNCS, PAGEABLE, LT, MALLOCS, FREES, UNALIGNED, N_COUNTERS };
struct counts {
    unsigned long long v[N_COUNTERS];
};
static struct counts snapshot(void) {
    struct counts c;
    for (int i = 0; i < N_COUNTERS; i++) c.v[i] = emu_stat(names[i]);
    return c;
}
static struct counts minus(struct counts a, struct counts b) {
    for (int i = 0; i < N_COUNTERS; i++) a.v[i] -= b.v[i];
    return a;
}
static void print(const char *what, struct counts c) {
    printf("%-26s", what);
    for (int i = 0; i < N_COUNTERS; i++) printf(" %s %llu", names[i], c.v[i]);
    printf("\n");
}

// Steps of 4, 1, 4, 1, 4 microbatches on the CUDA backend (against the CPU
// backend's losses when compare): the checks of the header.
static void check(enum dtype dtype, bool compare, bool fp8) {
    int32_t tokens[MAX_MICRO * B * T], targets[MAX_MICRO * B * T];
    for (int i = 0; i < MAX_MICRO * B * T; i++) tokens[i] = (i * 37) % V, targets[i] = (i * 11) % V;
    targets[5] = IGNORE_INDEX;
    struct optimizer_config oc = opt_config();
    static const int n_micro[] = {4, 1, 4, 1, 4};
    enum { STEPS = sizeof n_micro / sizeof n_micro[0] };
    struct train_step_result ref[STEPS], got[STEPS];
    const char *dt = fp8 ? "bf16 + fp8" : dtype_name(dtype);
    printf("== %s\n", dt);

    if (compare) {
        struct run cpu = open_run(BACKEND_CPU, dtype, fp8);
        for (int s = 0; s < STEPS; s++)
            train_step(cpu.m, cpu.opt, &oc, NULL, NULL, s, tokens, targets, n_micro[s], B, T, &ref[s]);
        close_run(&cpu);
    }

    struct run gpu = open_run(BACKEND_CUDA, dtype, fp8);
    struct counts start = snapshot(), per_step[STEPS];
    for (int s = 0; s < STEPS; s++) {
        struct counts before = snapshot();
        train_step(gpu.m, gpu.opt, &oc, NULL, NULL, s, tokens, targets, n_micro[s], B, T, &got[s]);
        per_step[s] = minus(snapshot(), before);
        char what[64];
        snprintf(what, sizeof what, "step %d (%d microbatches):", s, n_micro[s]);
        print(what, per_step[s]);
    }
    struct counts all = minus(snapshot(), start);
    close_run(&gpu);

    for (int s = 0; s < STEPS && compare; s++) {
        double dl = fabs(got[s].loss - ref[s].loss) / fabs(ref[s].loss);
        double dn = fabs(got[s].grad_norm - ref[s].grad_norm) / fabs(ref[s].grad_norm);
        printf("step %d: loss %.7f (cpu %.7f), grad norm %.7f (cpu %.7f)\n", s, got[s].loss, ref[s].loss,
               got[s].grad_norm, ref[s].grad_norm);
        EXPECT(dl <= 1e-5 && dn <= 1e-5, "%s step %d: loss %.9g vs cpu %.9g, grad norm %.9g vs cpu %.9g", dt, s,
               got[s].loss, ref[s].loss, got[s].grad_norm, ref[s].grad_norm);
        EXPECT(got[s].n_targets == ref[s].n_targets, "%s step %d: %lld targets, cpu %lld", dt, s,
               (long long)got[s].n_targets, (long long)ref[s].n_targets);
    }
    for (int s = 0; s < STEPS; s++)
        EXPECT(got[s].loss > 0 && got[s].loss < 10, "%s step %d: loss %g", dt, s, got[s].loss);
    // 1. steps of one microbatch and of four: as many copies back and waits
    for (int k : {D2H, SYNCS})
        EXPECT(per_step[2].v[k] == per_step[1].v[k] && per_step[4].v[k] == per_step[3].v[k],
               "%s: %s per step grows with the microbatches: %llu with 1, %llu with 4", dt, names[k],
               per_step[1].v[k], per_step[2].v[k]);
    // 2. no pageable host-to-device copy in any step
    EXPECT(all.v[PAGEABLE] == 0, "%s: %llu host-to-device copies from pageable memory in %d steps", dt,
           all.v[PAGEABLE], (int)STEPS);
    // 3. cuBLASLt set up during the first step only, on 256-byte aligned operands
    for (int s = 1; s < STEPS; s++)
        EXPECT(per_step[s].v[LT] == 0, "%s: step %d made %llu cuBLASLt descriptors/layouts/preferences/queries",
               dt, s, per_step[s].v[LT]);
    EXPECT(all.v[UNALIGNED] == 0, "%s: %llu cuBLASLt matmuls with an operand not 256-byte aligned", dt,
           all.v[UNALIGNED]);
    // 4. no device allocation in any step
    EXPECT(all.v[MALLOCS] == 0 && all.v[FREES] == 0, "%s: %llu cudaMalloc and %llu cudaFree calls in %d steps",
           dt, all.v[MALLOCS], all.v[FREES], (int)STEPS);
}

int main() {
    check(DTYPE_FP32, true, false);
    check(DTYPE_BF16, false, false);
    check(DTYPE_BF16, false, true);
    printf("check_host_work: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}

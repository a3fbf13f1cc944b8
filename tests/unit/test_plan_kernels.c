// test_plan_kernels.c: the planner's kernel model (src/train/plan_search.h,
// docs/planning.md §3): a GEMM's time depends on its shape and dtype, not on
// one efficiency. Each check is a number written out from the formula:
//  - a GEMM whose 128 x 256 tiles fill whole waves of the GPU's SMs runs at
//    the preset's large-GEMM efficiency of the dtype's peak;
//  - one tile more than a wave takes a second wave (wave quantization);
//  - FP8 operands halve a compute-bound GEMM on H100 (twice the peak, the same
//    fraction of it); A100's preset has no FP8 peak;
//  - a GEMM with a short K is bound by HBM, not by the tensor cores;
//  - the attention kernel at a block of PLAN_ATTN_HALF_LEN tokens runs at
//    half its long-sequence rate, its backward 2.5 forwards at its own rate;
//  - the presets parse (A100-40G, H100-PCIe, H800, B200) with their peaks.
#include "test.h"
#include "train/plan_search.h"

static struct plan_gpu gpu(const char *spec) {
    struct plan_gpu g;
    struct error err = {0};
    EXPECT(plan_gpu_parse(spec, &g, &err) == STATUS_OK, "%s: %s", spec, err.msg);
    return g;
}

int main(void) {
    struct plan_gpu h = gpu("H100-SXM"), a = gpu("A100-80G");
    EXPECT(h.n_sm == 132 && a.n_sm == 108, "SMs %d %d", h.n_sm, a.n_sm);
    // 132 x 2 tiles = 2 full waves: M = 128 x 132, N = 512, K = 8192
    double M = 128.0 * 132, N = 512, K = 8192;
    double t = plan_gemm_s(&h, M, N, K, false), want = 2 * M * N * K / (989e12 * h.gemm_eff);
    EXPECT(fabs(t / want - 1) < 1e-12, "full waves: %g s, want %g", t, want);
    // one row of tiles more: 3 waves for 266 tiles' work
    double t1 = plan_gemm_s(&h, M + 128, N, K, false);
    double want1 = 2 * (M + 128) * N * K / (989e12 * h.gemm_eff * (266.0 / (3 * 132)));
    EXPECT(fabs(t1 / want1 - 1) < 1e-12, "a third wave: %g s, want %g", t1, want1);
    EXPECT(t1 > 1.4 * t, "one tile more costs a wave: %g against %g", t1, t);
    // FP8 on H100: the FP8 peak (1979, twice bf16's 989) at the same fraction when compute-bound
    double t8 = plan_gemm_s(&h, M, N, K, true);
    EXPECT(fabs(t8 / (2 * M * N * K / (1979e12 * h.gemm_eff_fp8)) - 1) < 1e-12 && t8 < 0.51 * t, "fp8 %g, bf16 %g",
           t8, t);
    EXPECT(h.fp8_flops == 1979e12 && a.fp8_flops == 0, "fp8 peaks %g %g", h.fp8_flops, a.fp8_flops);
    // K = 16: memory-bound, (M K + K N) 2 + 2 M N bytes at 3.35 TB/s x hbm_eff
    double Mm = 8192, Nm = 8192, Km = 16;
    double tm = plan_gemm_s(&h, Mm, Nm, Km, false);
    double wantm = ((Mm * Km + Km * Nm) * 2 + 2 * Mm * Nm) / (3.35e12 * h.hbm_eff);
    EXPECT(fabs(tm / wantm - 1) < 1e-12, "short K: %g s, want %g (HBM)", tm, wantm);
    // so its FLOP rate is a few percent of the peak, where the full waves ran at gemm_eff
    EXPECT(2 * Mm * Nm * Km / tm < 0.1 * 989e12, "short K at %g TFLOP/s", 2 * Mm * Nm * Km / tm / 1e12);
    // attention: half rate at the half length; backward 2.5 x the FLOPs at attn_bwd_eff
    double bwd, fwd = plan_attention_s(&h, 1e12, PLAN_ATTN_HALF_LEN, &bwd);
    EXPECT(fabs(fwd / (1e12 / (989e12 * h.attn_fwd_eff * 0.5)) - 1) < 1e-12, "attention fwd %g", fwd);
    EXPECT(fabs(bwd / (2.5e12 / (989e12 * h.attn_bwd_eff * 0.5)) - 1) < 1e-12, "attention bwd %g", bwd);
    // presets
    struct plan_gpu a40 = gpu("A100-40G"), pc = gpu("H100-PCIe"), h8 = gpu("H800"), b2 = gpu("B200");
    EXPECT(a40.mem_bytes == (size_t)40 << 30 && a40.peak_flops == 312e12, "A100-40G");
    EXPECT(pc.peak_flops == 756e12 && pc.fp8_flops == 1513e12 && pc.n_sm == 114, "H100-PCIe");
    EXPECT(h8.nvlink_bw == 200e9 && h8.peak_flops == 989e12, "H800");
    EXPECT(b2.peak_flops == 2250e12 && b2.fp8_flops == 4500e12 && b2.mem_bytes == (size_t)180 << 30, "B200");
    struct plan_gpu cu = gpu("H200,fp8=1500");
    EXPECT(cu.fp8_flops == 1500e12 && cu.hbm_bw == 4.8e12, "custom fp8 over H200");
    return test_finish("test_plan_kernels");
}

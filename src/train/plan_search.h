// plan_search.h: which layout of a config fits N GPUs and which is fastest
// (docs/planning.md): enumerates (tp, cp, pp, virtual stages, dp, micro-batch,
// recompute, ZeRO stage 0-3 and its shard group, and for a mixture-of-experts
// model the expert-parallel size ep), takes each one's peak bytes from plan.h (what a run
// allocates) and predicts its step time with an analytic model (compute
// from a kernel model: each GEMM at its shape's and dtype's rate, FP8 under
// precision.fp8, attention at a fused kernel's rate, memory-bound kernels at
// HBM speed; the pipeline's bubble and exposed point-to-point time from the
// schedule's simulator (pipeline_simulate: 1F1B, interleaved, ZB-H1, ZB-V,
// with the backward split into B and W), recompute,
// tensor-parallel collectives on NVLink, pipeline and data-parallel traffic
// on the inter-node network, alpha-beta; ZeRO-2/3's per-unit all-gathers and
// reduce-scatters against the compute they overlap; context parallelism's
// ring of key/value blocks against the attention blocks it overlaps; expert
// parallelism's all-to-alls, not overlapped, docs/planning.md §8).
#ifndef TRIDENT_PLAN_SEARCH_H
#define TRIDENT_PLAN_SEARCH_H

#include "parallel/pipeline.h"
#include "train/plan.h"

// One GPU (docs/planning.md §3, "GPU presets"): dense bf16 and FP8
// tensor-core peaks (FLOP/s; fp8_flops 0: no FP8 tensor cores), HBM
// bandwidth (bytes/s), per-GPU NVLink and inter-node bandwidths (bytes/s one
// direction, taken as the achievable NCCL bus bandwidth), memory (bytes), and
// what the time model needs of its kernels: n_sm streaming multiprocessors
// (a GEMM's output tiles run in waves of n_sm), gemm_eff and gemm_eff_fp8 the
// fractions of the bf16 / FP8 peak a large GEMM reaches, attn_fwd_eff and
// attn_bwd_eff those of the bf16 peak a fused attention kernel reaches on
// long sequences (causal FLOPs), hbm_eff the fraction of hbm_bw that
// memory-bound kernels (norms, RoPE, SwiGLU, FP8 casts) reach.
struct plan_gpu {
    char name[32];
    double peak_flops, fp8_flops, hbm_bw, nvlink_bw, ib_bw;
    size_t mem_bytes;
    int n_sm;
    double gemm_eff, gemm_eff_fp8, attn_fwd_eff, attn_bwd_eff, hbm_eff;
};

// The cluster and the model's knobs.
struct plan_cluster {
    int gpus, gpus_per_node;
    struct plan_gpu gpu;
    size_t reserve_bytes;     // kept free per GPU: CUDA context, NCCL buffers, fragmentation
    double efficiency;        // 0: the kernel model (plan_kernel_times); in (0, 1]: every FLOP at
                              // this fraction of peak (the model before issue 30)
    double alpha_nvlink, alpha_ib; // seconds per collective step (latency term)
};

// The kernel model's constants (docs/planning.md §3): a GEMM's output is
// computed in tiles of PLAN_TILE_M x PLAN_TILE_N (CUTLASS/cuBLAS's usual
// 128 x 256 for bf16 and FP8 on Hopper), n_sm tiles a wave; a fused
// attention kernel on blocks of Tb queries runs at Tb / (Tb +
// PLAN_ATTN_HALF_LEN) of its long-sequence rate (a fit to FlashAttention-2's
// published rates against sequence length).
#define PLAN_TILE_M 128
#define PLAN_TILE_N 256
#define PLAN_ATTN_HALF_LEN 384

// The global batch (sequences) a layout with micro-batch mb and dp data
// ranks runs when B does not divide by mb dp: the nearest multiple of mb
// dp, at least one microbatch a replica (docs/planning.md §2); B when it
// divides.
int plan_nearest_batch(int B, int mb, int dp);
// Whether the search may plan batch Bm for the config's B: within 10% of it
// (a batch is a training choice; the planner moves it only that far).
bool plan_batch_close(int B, int Bm);

// Seconds of one GEMM out (M, N) = a (M, K) b (K, N) on g, FP8 operands
// (fp8) or bf16: the larger of its compute time, 2 M N K FLOPs at the
// dtype's peak x its large-GEMM efficiency x the wave efficiency (tiles /
// (waves x n_sm), tiles = ceil(M / 128) ceil(N / 256)), and its memory time
// (operands and the bf16 output once through HBM at hbm_bw x hbm_eff).
// Roofline: Williams et al. 2009; wave quantization: NVIDIA's "Matrix
// Multiplication Background User's Guide".
double plan_gemm_s(const struct plan_gpu *g, double M, double N, double K, bool fp8);
// Seconds of a fused causal attention forward of flops_fwd FLOPs (QK^T and
// AV, the causal half) on query blocks of block_len tokens, at the bf16 peak
// x attn_fwd_eff x block_len / (block_len + PLAN_ATTN_HALF_LEN); *bwd_s its
// backward, 2.5 x the forward's FLOPs (FlashAttention's count: the scores are
// recomputed) at attn_bwd_eff.
double plan_attention_s(const struct plan_gpu *g, double flops_fwd, double block_len, double *bwd_s);

// Fills gpu from a preset name ("A100-40G", "A100-80G" (or "A100-80GB"),
// "H100-SXM", "H100-PCIe", "H800", "H200", "B200") or a comma list of
// name=value (tflops=, fp8= in TFLOP/s or with a T suffix, hbm= in TB/s or
// with a T/G suffix, nvlink=, ib= in GB/s or with a G suffix, mem= with a G
// suffix) applied on top of H100-SXM or on top of a preset named first
// ("H200,ib=25G").
// Errors: STATUS_BAD_INPUT naming the unknown preset or key.
enum status plan_gpu_parse(const char *spec, struct plan_gpu *gpu, struct error *err);


// The search tries context parallelism (cp > 1) for sequences of at least
// this many tokens (docs/planning.md §2): below it the ring's traffic and
// its smaller blocks buy memory the layouts without it rarely need.
#define PLAN_CP_MIN_SEQ 16384

// One layout and its prediction (seconds per optimizer step; throughput in
// model FLOPs, without recompute, per GPU).
struct plan_layout {
    int tp, cp, pp, v, dp, mb, zero; // cp: context-parallel ranks (0 is read as 1)
    int ep;                     // expert-parallel ranks (parallel.ep; 0 is read as 1): divides dp
                                // (dp_shard under ZeRO-2/3) and moe_experts
    enum pp_schedule schedule;  // [parallel] pp_schedule (1F1B, the zero value, is also the
                                // interleaved table when v > 1); the search sets INTERLEAVED for v > 1
    int dp_shard;               // ZeRO-2/3: ranks a shard spans (divides dp; dp: no replication); 0 = dp
    bool keep_gathered;         // ZeRO-3: reshard_after_forward = false
    enum recompute recompute;
    size_t peak_bytes;
    double step_s, compute_s, recompute_s, bubble_s, tp_comm_s, cp_comm_s, pp_comm_s, dp_exposed_s;
    double ep_comm_s;           // the MoE blocks' all-to-alls (0 at ep 1 or dense), in step_s
    // The pipeline as plan_pipeline simulates it (pp > 1; zeros at pp 1): the
    // seconds of one op on the slowest stage (op.f: the forward of one
    // microbatch through one chunk; op.b: its B, the input-gradient GEMMs,
    // attention backward, memory-bound kernels and recompute; op.w: its W, the
    // weight-gradient GEMMs; a whole backward is b + w; op.comm: one
    // point-to-point message), and bubble, the step's bubble fraction
    // (pp_sim.bubble with comm 0: bubble_s over the pipeline's makespan).
    struct pp_costs op;
    double bubble;
    double tflops_per_gpu, mfu, tokens_per_s;
    double hw_tflops_per_gpu; // with recompute's FLOPs (what Megatron-LM reports)
    double tokens_per_s_per_gpu;
    double mfu_full;          // MFU with the papers' FLOPs: attention counted whole, 12 L C T a
                              // token (mfu: trident's, its causal half, model_flops_per_token)
    int global_batch;         // sequences a step: the config's, or the nearest multiple of mb dp
                              // when it does not divide (docs/planning.md §2)
    // precision.fp8 != none: the same layout in bf16 (its step and peak), for the ratio
    double bf16_step_s;
    size_t bf16_peak_bytes;
};

// Why a family (tp, cp, pp) has no layout that fits: the structural rule it
// breaks, or the smallest out-of-memory excess of its variants.
struct plan_reject {
    int tp, cp, pp;
    char why[400];
};

// The results: up to n_top layouts that fit, fastest first (*n_fit: how
// many fit in all, *n_tried: how many were evaluated); up to max_rej
// rejected families. c: the config (model, batch, precision; its [parallel]
// is replaced). Errors: STATUS_BAD_INPUT when the cluster has no GPUs or
// the efficiency is outside (0, 1]. Layouts that do not fit are not errors:
// they are in rej.
enum status plan_search(const struct config *c, const struct plan_cluster *cl,
                        struct plan_layout *top, int n_top, int *n_fit, int *n_tried,
                        struct plan_reject *rej, int max_rej, int *n_rej, struct error *err);

// Context parallelism's ring (docs/planning.md §3) as src/model/
// ring_attention.c runs it, per microbatch and layer on one rank: cp blocks
// of attention each way. Inputs: cp ranks, the seconds of one block's
// forward attention compute (t_block_fwd; its backward is taken as twice
// that) and of one key/value block's transfer to the next rank (t_kv:
// latency + bytes / bandwidth; a dK/dV block is the same size). Forward:
// cp - 1 K/V transfers, each started before a block's compute and hidden
// behind it (exposed: what exceeds it); backward: the K/V blocks travel
// again the same way behind each block's backward, and after each of the cp
// blocks its dK/dV moves on to the next rank, started after that block's
// backward and waited for at once (the cp-th hop brings each rank's own
// home): cp dK/dV transfers, none hidden. *fwd_s, *bwd_s: the exposed
// seconds (0 when cp <= 1).
void plan_cp_ring_exposed(int cp, double t_block_fwd, double t_kv, double *fwd_s, double *bwd_s);

// Predicts one layout (its fields tp, cp, pp, v, dp, ep (0: 1), mb, zero, dp_shard,
// keep_gathered, recompute, schedule set; global_batch: the batch it runs, 0 = the
// config's): fills peak_bytes, the times (seconds a step: the kernel model,
// or every FLOP at cl->efficiency of the peak when that is > 0), the
// throughputs and, under precision.fp8, the same layout's bf16 step and
// peak. Returns false with why set when it does not fit or the schedule
// refuses it (config_validate's message: e.g. zb-h1 with v != 1, or a
// split schedule under precision.fp8), or pp exceeds the simulator's
// PIPELINE_SIM_MAX_STAGES.
// The pipeline terms (docs/planning.md §3, "Pipeline schedules"): the ops'
// costs l->op go to pipeline_simulate twice, with comm 0 (bubble_s =
// makespan - the stage's busy time, i.e. the idle of a stage, all stages
// being equally loaded) and with comm the message time (pp_comm_s = the
// makespan it adds: the point-to-point time the schedule does not hide).
bool plan_predict(const struct config *c, const struct plan_cluster *cl, struct plan_layout *l,
                  char *why, size_t why_len);

#endif

// plan.h: what each rank of a run holds, from the config alone (docs/design.md §5):
// the model shard of every grid position and the bytes of every pool. The
// trainer builds its shards with plan_shard, so `trident plan` prints exactly
// what a run of that config allocates.
#ifndef TRIDENT_PLAN_H
#define TRIDENT_PLAN_H

#include "config/config.h"
#include "model/model.h"
#include "parallel/topology.h"

// The [model] section as the model takes it.
struct llama_config plan_llama(const struct config *c);

// The context-parallel size of the config (parallel.cp, at least 1) and its
// gradient group, data x context: G = dp cp ranks (parameters are replicated
// over cp; gradients are reduced and ZeRO shards over G, docs/design.md §2).
int plan_cp(const struct config *c);
int plan_grad_ranks(const struct config *c);

// Microbatches per optimizer step on one data-parallel rank
// (loader_microbatches of the config's batch terms; 0 when they do not divide).
int plan_microbatches(const struct config *c);

// The model shard of grid position coord: its pipeline chunks, tensor-parallel
// slice, activation slots (1F1B keeps at most p - s microbatches in flight),
// sequence parallelism, what the slots keep ([model] recompute) and ZeRO-1
// arena padding. Errors: STATUS_BAD_INPUT when
// the pipeline schedule refuses the layout (the message says why).
enum status plan_shard(const struct config *c, struct grid_coord coord, struct model_shard *out,
                       struct error *err);

// How a layout shards its data-parallel state (ZeRO, Rajbhandari et al.
// 2020, §5; FSDP, Zhao et al. 2023, §3): zero_stage 0..3; S = shard_ranks,
// the ranks a shard is split over (cp x dp; cp x parallel.dp_shard under
// hybrid sharding); at stage 3 whether a unit's gathered parameters are freed after
// its forward (reshard_after_forward) and how many units are all-gathered
// ahead of the one computing (prefetch, FSDP's depth 1).
struct plan_sharding {
    int zero_stage, shard_ranks; // 0..3; 1..dp
    bool reshard_after_forward;
    int prefetch; // >= 0 units
};

// The config's sharding: its zero_stage, S = cp x parallel.dp_shard at
// stages 2 and 3 (0: dp; ZeRO-1 shards over cp x dp),
// parallel.reshard_after_forward and prefetch 1 (fsdp.h's depth).
// c->parallel.dp resolved.
struct plan_sharding plan_sharding_of(const struct config *c);

// The bytes one rank of the config's layout allocates (what its metrics.jsonl
// mem_bytes reports): the shard's parameters, gradients (plus the BF16 copy
// the buckets all-reduce when grad_dtype = bf16 without ZeRO-1), optimizer
// state (FP32 master weights and AdamW moments, ZeRO-1 sharded over dp) and
// activations (n_slots slots of slot_bytes, the recompute buffer, scratch).
// ZeRO-2 and 3 (docs/planning.md §1; src/train/fsdp.h's buffers, from
// fsdp_plan_bytes; n = n_params, S = shard_ranks, U = unit_elems, the
// largest unit, every unit padded to a multiple of 128 S elements; P = model
// dtype bytes, G = gradient bytes, 4 or 8 for fp64): grads = n/S G (the
// FP32 shard) + 2 U G (two unit gradient buffers: one written by the
// backward, one being reduce-scattered; a tied embedding has its own) + 2
// U/S G (their reduce-scatter results) + their BF16 twins under grad_dtype
// bf16; optimizer = AdamW m, v (and the FP32 master of a bf16/fp16 model)
// over n/S; params = n P at stage 2, n/S P + (prefetch + 1) U P at stage 3
// with reshard_after_forward (one more beside a tied head; else n/S P + n
// P: every unit stays gathered until the backward ends).
struct plan_rank_bytes {
    size_t params, grads, optimizer, activations; // bytes
    size_t slot_bytes, recompute_bytes;           // bytes, inside activations
    size_t w_stash_bytes;                         // bytes, inside activations: the zero-bubble
                                                  // schedules' n_wstash W stashes, all of them
                                                  // (model_memory.w_stash_bytes; 0 otherwise)
    int n_wstash;                                 // W stashes (pipeline_max_w_pending)
    size_t cp_bytes;                              // bytes, inside activations: the cp ring's
                                                  // travelling buffers and positions (0 at cp 1)
    size_t kv_cache_bytes;                        // bytes, inside activations: the samples'
                                                  // key/value cache (0 without samples)
    int n_slots;                                  // >= 1
    size_t n_params;                              // elements of the shard
    // zero_stage >= 2 only (0 otherwise):
    int zero_stage, shard_ranks;                  // as plan_sharding
    size_t unit_elems;                            // U, elements (this rank's TP slice)
    size_t params_shard, params_gathered;         // bytes, inside params (stage 3)
    int n_gathered;                               // units held gathered (stage 3): prefetch + 1,
                                                  // 0 when the whole stage stays gathered
    size_t grads_shard, grads_units, grads_recv, grads_transfer; // bytes, inside grads
    size_t opt_moments, opt_master;               // bytes, inside optimizer
    // precision.fp8 != none only (0 otherwise; plan_fp8_bytes):
    size_t fp8_weights;                           // bytes, inside params
    size_t fp8_saved, fp8_work;                   // bytes, inside activations: the slots' FP8
                                                  // GEMM inputs; recompute buffer + scratch +
                                                  // scaling state
    // Mixture of experts ([model] moe_experts > 0 only; 0 otherwise):
    int moe_blocks;                               // MoE blocks among the rank's layers
    int experts_local;                            // routed experts it holds of each: E / ep
    size_t expert_params;                         // elements, inside n_params: those experts'
                                                  // gate, up, down (3 F C each, each padded
                                                  // to 128: model_memory.n_expert_params)
    size_t moe_bytes;                             // bytes, inside activations: the MoE blocks'
                                                  // routing and expert buffers in every slot
                                                  // and their scratch (model_memory.moe_bytes;
                                                  // under ep sized for the rows a rank may
                                                  // receive, moe_rows_recv_max)
};

// The model's FP8 settings (model.h struct model_fp8_config) from
// [precision] fp8, fp8_scaling, fp8_amax_history_len, fp8_amax_compute,
// fp8_margin and fp8_skip_layers: what the trainer gives model_fp8_init.
struct model_fp8_config plan_fp8_config(const struct config *c);

// What FP8 training (precision.fp8 = hybrid or e4m3, docs/planning.md §7,
// docs/design.md §5 "FP8 linear layers") adds to one rank of the config's
// layout, in bytes: the model's own allocation (model_fp8_plan_bytes, plan
// == run). weights: the FP8 copies of the rank's FP8 blocks' q, k, v, o,
// gate, up, down weights (1 byte an element, cast once a step and kept
// through its microbatches; every local FP8 block's, under ZeRO-3 too);
// saved: FP8 copies of GEMM inputs kept per activation slot: none (the
// model casts x again for the weight gradient); work: two FP8 scratch
// buffers (the largest block GEMM input and output gradient of N =
// micro_batch_size x seq_len / cp rows) and the scaling state (12 tensors a
// FP8 block: scale, scale inverse, amax in FP32, plus fp8_amax_history_len
// under delayed scaling; an I64 saturation count), each rounded up to 256
// bytes. Blocks kept in bf16 (fp8_skip_layers) hold none.
struct plan_fp8 {
    size_t weights, saved, work;
};
// Zeroes *out when c->precision.fp8 is none. Errors: as plan_shard.
enum status plan_fp8_bytes(const struct config *c, const struct model_shard *shard, struct plan_fp8 *out,
                           struct error *err);

// Sum of a rank's four pools, in bytes.
size_t plan_rank_total(const struct plan_rank_bytes *b);

// The bytes of grid position coord (its tensor rank and pipeline stage; every
// data rank holds the same, but for ZeRO-1 under ep, whose optimizer bytes
// are coord's: its ranks in dp and expert_dp, optimizer_zero1_numel, the
// groups' last rank holding the runs' rests) of the config's layout
// (c->parallel.dp resolved) under plan_sharding_of(c). Errors:
// STATUS_BAD_INPUT as plan_shard, and model_plan's.
enum status plan_rank(const struct config *c, struct grid_coord coord, struct plan_rank_bytes *out,
                      struct error *err);

// Host memory one rank holds beyond its arenas (docs/design.md §5), bytes.
struct plan_host_bytes {
    // MPI's collective temporaries at most (comm_mpi_plan_bytes): with
    // system.device = cpu the data-parallel, tensor-parallel and embedding
    // reductions run on MPI; under CUDA on NCCL (device memory, not
    // counted), so 0.
    size_t mpi;
    // The host buffers a resume or init_from reads into (the whole FP32
    // parameter arena, this rank's FP32 moments and master weights); freed
    // after loading on the CPU backend, kept for the saves under CUDA.
    size_t ckpt_load;
    // The host buffers a save copies into: the same under CUDA, and on the
    // CPU backend with [checkpoint] async (the snapshot the background
    // writer reads); else 0 on the CPU backend, whose saves read the arenas.
    size_t ckpt_save;
};

// The host bytes of grid position coord (t, 0, p). Errors: as plan_rank.
enum status plan_host(const struct config *c, struct grid_coord coord, struct plan_host_bytes *out,
                      struct error *err);

// One row of the grouped plan: consecutive pipeline stages [stage_begin,
// stage_end] whose every tensor-parallel rank allocates the same bytes; role
// says what the stages hold beyond their layers ("first": the embedding,
// "last": final norm and head, "only": both, "middle": neither); n_ranks =
// stages x tp x dp ranks it covers.
struct plan_group {
    int stage_begin, stage_end;
    const char *role;
    int n_ranks;
    struct plan_rank_bytes bytes; // of each of those ranks
};

// Groups the ranks of the config's layout (c->parallel.dp resolved) into at
// most pp * tp rows (out has room for pp * tp); every context and data rank
// of a row's (stage, tensor rank) holds the same bytes (n_ranks counts them),
// data rank 0's (ZeRO-1 under ep: the last data rank holds up to S - 1 more
// optimizer elements a run, plan_rank).
// *n_out: rows written; *peak: the largest rank's total bytes; *sum: all
// ranks' bytes together. Errors: as plan_rank.
enum status plan_groups(const struct config *c, struct plan_group *out, int *n_out, size_t *peak,
                        double *sum, struct error *err);

#endif

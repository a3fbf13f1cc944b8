// fsdp.h: ZeRO-2 and ZeRO-3 (fully sharded data parallelism) over the
// model's units (model.h: the embedding, each block, the head), driven by the
// model's unit hook (docs/design.md §5 "ZeRO stages").
//
// Sources: Rajbhandari et al. 2020, §5 (ZeRO: P_os+g, P_os+g+p); Zhao et al.
// 2023 (PyTorch FSDP: units wrapped as flat parameters, prefetching, the
// reshard-after-forward policy, FSDP2's mixed precision: gathers in the
// compute dtype, reduce-scatters in the reduce dtype, FP32 master shards).
//
// Every rank of the shard group (the DP group, S ranks) owns shard rank d's
// 1/S slice of every unit (each unit padded to a multiple of S x ALIGN_ELEMS
// elements: model_shard.unit_multiple); the optimizer (optimizer_ranges)
// keeps the moments, master weights, gradient shard and (ZeRO-3) parameter
// shard of those slices.
//
// Gradients (stages 2 and 3): there is no gradient arena. Before a unit's
// backward its gradient views are pointed at one of two unit gradient
// buffers (double-buffered, zeroed first); after it the model's TP sums of
// that unit run (model_finish_unit_grads), and the buffer is reduce-scattered
// over the shard group, non-blocking, so it overlaps the next unit's
// backward; once complete, the result is added into the optimizer's FP32
// gradient shard. This for every microbatch (as DeepSpeed and FSDP do), so
// with several microbatches per step the sums are in another order than
// ZeRO-1's (one reduce-scatter of the accumulated gradients): equal within
// rounding, bit for bit with one microbatch. grad_dtype = bf16 rounds the
// buffer for the transfer (comm.h's BF16 sum) and widens the result.
//
// The split backward of the zero-bubble schedules (model.h,
// model_backward_chunk_input / _weight): a unit's B gets a zeroed buffer as
// above and the model stashes what B wrote there (the vectors' gradients)
// at its end (MODEL_UNIT_INPUT_DONE), which frees the buffer; its W gets
// another zeroed buffer (MODEL_UNIT_WEIGHT), into which the model puts them
// back after the weight GEMMs, and the reduce-scatter starts at
// MODEL_UNIT_WEIGHT_DONE: per microbatch, the fused pass's buffer, bit for
// bit. The W's of a unit run in microbatch order and the results are added
// into the shard in the order their buffers were bound (fsdp_step_end
// completes the older first), so a step equals 1F1B's at the same stage.
// Stage 3's B gathers the unit's parameters (released at INPUT_DONE under
// reshard_after_forward); its W reads none. The embedding's pass runs whole
// in B (BACKWARD ... BACKWARD_DONE). A tied embedding's buffer is bound at
// the head's W and reduce-scattered after it, as after the fused pass; with
// the embedding's pass on the same rank (ZB-V's stage 0) it is not built
// (config_validate refuses zbv + tie_embeddings at zero_stage >= 2).
//
// Parameters (stage 3): no parameter arena; the optimizer's parameter shard
// holds this rank's slices in the model dtype. Before a unit's forward its
// slices are all-gathered (model dtype: the compute dtype) into a gather
// buffer and the unit's views pointed there; the next unit of the same
// model chunk (forward order; the previous one in the backward) is gathered
// ahead (prefetch depth 1), so its transfer overlaps this unit's compute.
// reshard_after_forward = true frees a unit's buffer after its forward and
// gathers it again before its backward: 2 gather buffers of the largest
// unit. false keeps every unit gathered from its first use to the end of the
// step (fsdp_step_end): a buffer per unit of the stage. A recomputed forward
// (recompute = selective | full) runs inside the unit's backward and uses
// the unit gathered for it. After the optimizer step the parameter shard is
// current (no gather of the whole model). Stage 2 keeps the parameter arena
// whole; its optimizer all-gathers each unit after the step.
#ifndef TRIDENT_FSDP_H
#define TRIDENT_FSDP_H

#include "model/model.h"
#include "model/optimizer.h"
#include "parallel/comm.h"

struct fsdp_config {
    int stage;                  // 2 or 3
    bool reshard_after_forward; // stage 3 (see above)
    bool prefetch;              // stage 3: gather the next unit ahead (tests turn it off)
    bool overlap;               // reduce-scatters overlap the next unit's backward; false:
                                // each is waited for at once (tests)
    enum dtype grad_dtype;      // DTYPE_FP32 or DTYPE_BF16: the reduce-scatters' dtype
    bool tied;                  // model.tie_embeddings: the head reads the embedding unit
};

// What the last step (since fsdp_step_begin) did, for its metrics record.
struct fsdp_stats {
    int gathers;     // all-gathers of units (stage 3)
    int prefetched;  // of them, issued ahead of the unit's own forward / backward
    int rs;          // reduce-scatters of unit gradients
    int rs_early;    // of them, left in flight while the backward went on (overlapped)
    int live_max;    // most units gathered (or being gathered) at once (stage 3)
};

struct fsdp;

// Sets up stage cfg->stage over model m (built with unit_multiple a multiple
// of S = shard->size, no_grad_arena, and for stage 3 no_param_arena) and its
// optimizer opt (zero_stage = cfg->stage over the same group) and installs
// the unit hook. replicate (NULL or one rank: none): hybrid sharding
// (HSDP), the groups of ranks that hold the same slices; each reduce-
// scattered slice is then all-reduced over it (in grad_dtype) before it is
// added into the gradient shard. Stage 3: initialises the weights unit by unit into a gather
// buffer and keeps this rank's slices (model_init_unit_weights with seed),
// then the optimizer's master weights: no full copy of the model exists.
// Errors: STATUS_RUNTIME when out of backend memory.
enum status fsdp_init(struct fsdp **out, struct model *m, struct optimizer *opt,
                      struct comm_group *shard, struct comm_group *replicate,
                      const struct fsdp_config *cfg, uint64_t seed, struct error *err);
void fsdp_free(struct fsdp *f);

// Before a step's first microbatch: zeroes the gradient shard, resets the stats.
void fsdp_step_begin(struct fsdp *f);
// Tests (TRIDENT_FAULT=grad_inf): this step's first gradient buffer bound
// for a backward (grads_bind) gets an inf in its element 0 before the
// backward adds into it, so the inf is reduce-scattered and, under HSDP,
// all-reduced over the replicas as a real overflow in this rank's backward
// is: every rank's norm sees it. (An inf written into this rank's gradient
// shard would reach only its own replica's norm.) Call after fsdp_step_begin.
void fsdp_fault_grad_inf(struct fsdp *f);
// After the step's last backward (and after an evaluation's forwards): waits
// for every reduce-scatter and adds its result, frees every gathered unit.
void fsdp_step_end(struct fsdp *f);
// comm_test on the started requests (MPI progresses them only inside calls).
void fsdp_poll(struct fsdp *f);
void fsdp_stats(const struct fsdp *f, struct fsdp_stats *out);
// This rank's slice of the embedding unit's gradients in the optimizer's
// gradient shard (empty without an embedding unit): under pipeline
// parallelism with a tied embedding the trainer sums it over the embedding
// group (first and last stage; the same slice on both: the unit sits at
// offset 0 of either arena), as it sums the whole gradient at ZeRO 0/1.
struct tensor fsdp_embed_grad_shard(struct fsdp *f);

// Bytes this rank's ZeRO-2/3 buffers hold beyond the model's arenas and the
// optimizer's moments and master weights: params (stage 3: the parameter
// shard and the gather buffers) and grads (the gradient shard, the two unit
// gradient buffers and their reduce-scatter results, and under grad_dtype
// bf16 their BF16 twins).
void fsdp_bytes(const struct fsdp *f, size_t *params, size_t *grads);
// The same from sizes alone (trident plan): mem from model_plan of the
// rank's shard (n_params arena elements, every unit padded; its largest
// unit; a tied embedding unit's size), dtype the model's, S shard ranks.
void fsdp_plan_bytes(int stage, bool reshard_after_forward, enum dtype dtype,
                     enum dtype grad_dtype, const struct model_memory *mem, int S, size_t *params,
                     size_t *grads);

#endif

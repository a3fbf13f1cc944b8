// grad_sync.h: data-parallel gradient averaging with bucketed, non-blocking
// all-reduces that overlap the backward pass (PyTorch DDP's gradient buckets,
// Li et al. 2020, §3.2.3; Megatron-LM's overlap_grad_reduce).
//
// The gradient arena is cut into buckets of about bucket_bytes from its end
// (the backward pass completes parameters from the last to the first). While
// armed, the model's gradient-ready hook starts each bucket's all-reduce (SUM)
// as soon as every element of the bucket is final; grad_sync_finish starts
// what is left and waits for all. Every rank starts the buckets in the same
// order, as MPI requires of collectives. Gradients are summed, not averaged:
// the loss scale already divides by the global target count.
//
// Without a pipeline the last microbatch's backward is armed. Under pipeline
// parallelism (pipeline.h) each model chunk's last backward is armed
// (pp_op.last) and the backwards between them paused: the chunks finish from
// the last to the first, the order of the arena, so the hook's "[ready_from,
// n) is final" holds across chunks. So the last stage, whose backwards end
// first, starts its buckets while the stages before it are still in their
// backwards, and the executor polls them (grad_sync_poll) while it waits for
// pipeline messages. A bucket that holds the last stage's copy of a tied
// embedding (offset 0, never reported final there) waits for
// grad_sync_finish. Start times change, the buckets and their sums do not:
// the results are those of reducing every bucket after the flush, bit for
// bit.
//
// ZB-V's stage 0 with a tied embedding keeps the head's share of the
// embedding's gradient apart (model_tied_head_grad); grad_sync_finish sums
// it over dp after the buckets (in grad_dtype, through the BF16 copy then
// free), so model_finish_grads adds sum(E) + sum(H) as 1F1B's stages do.
//
// [precision] grad_dtype = bf16 halves the bytes on the wire: each bucket's
// FP32 gradients are rounded into a BF16 copy of the arena, all-reduced with
// comm.h's BF16 sum (each pair of operands added in FP32 and rounded once)
// and, once every bucket is done, widened back into the FP32 arena. Buckets
// are still cut at bucket_bytes of FP32 gradients.
#ifndef TRIDENT_GRAD_SYNC_H
#define TRIDENT_GRAD_SYNC_H

#include <stddef.h>

#include "model/model.h"
#include "parallel/comm.h"

struct grad_sync;

// Plans the buckets over m's gradient arena for group dp (size 1: every call
// is a no-op). bucket_bytes >= 1; grad_dtype DTYPE_FP32 or DTYPE_BF16 (then,
// with dp > 1, a BF16 copy of the arena on m's backend: grad_sync_bytes).
// Allocates once; out of memory is fatal.
struct grad_sync *grad_sync_init(struct model *m, struct comm_group *dp, size_t bucket_bytes,
                                 enum dtype grad_dtype);
// The same under expert parallelism: buckets never mix routed-expert tensors
// (param_info.expert) with the others; an expert bucket is summed over
// expert_dp (the ranks of dp holding the same experts; size 1 when ep = dp:
// nothing to sum) instead of dp. expert_dp may be NULL when m has no
// expert tensors.
struct grad_sync *grad_sync_init_ep(struct model *m, struct comm_group *dp,
                                    struct comm_group *expert_dp, size_t bucket_bytes,
                                    enum dtype grad_dtype);
void grad_sync_free(struct grad_sync *s);

// Arms the hook for the next backward: its gradient-ready reports are final
// (the last microbatch's model_backward, or a chunk's last backward under a
// pipeline). A second call before grad_sync_finish goes on with the same
// step's buckets (the next chunk).
void grad_sync_arm(struct grad_sync *s);
// The backwards that follow, until the next grad_sync_arm, are not final (a
// lower chunk's earlier microbatches): the hook only polls the started
// buckets.
void grad_sync_pause(struct grad_sync *s);
// comm_test on every started bucket not yet complete (MPI moves them only
// inside MPI calls): the pipeline executor calls it while it waits.
void grad_sync_poll(struct grad_sync *s);
// Starts the buckets not started yet (all of them when grad_sync_arm was not
// called in this step), waits for every bucket and disarms.
void grad_sync_finish(struct grad_sync *s);
// Number of buckets, and how many had been started before grad_sync_finish
// in the last armed step (tests and the step record's dp_buckets_early:
// proves the overlap; 0 when that step was not armed).
int grad_sync_buckets(const struct grad_sync *s);
// Bytes of the BF16 copy of the gradient arena (0 under grad_dtype fp32 or
// dp 1); and the same from sizes alone (trident plan), for n_params arena
// elements (none under ZeRO-1: its optimizer reduce-scatters instead).
size_t grad_sync_bytes(const struct grad_sync *s);
size_t grad_sync_plan_bytes(size_t n_params, int dp, int zero_stage, enum dtype grad_dtype);
int grad_sync_started_early(const struct grad_sync *s);

#endif

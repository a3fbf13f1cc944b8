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
void grad_sync_free(struct grad_sync *s);

// Arms the hook for the next model_backward (the last microbatch's).
void grad_sync_arm(struct grad_sync *s);
// Starts the buckets not started yet (all of them when grad_sync_arm was not
// called for this backward), waits for every bucket and disarms.
void grad_sync_finish(struct grad_sync *s);
// Number of buckets, and how many had been started before grad_sync_finish
// in the last armed backward (tests: proves the overlap).
int grad_sync_buckets(const struct grad_sync *s);
// Bytes of the BF16 copy of the gradient arena (0 under grad_dtype fp32 or
// dp 1); and the same from sizes alone (trident plan), for n_params arena
// elements (none under ZeRO-1: its optimizer reduce-scatters instead).
size_t grad_sync_bytes(const struct grad_sync *s);
size_t grad_sync_plan_bytes(size_t n_params, int dp, int zero_stage, enum dtype grad_dtype);
int grad_sync_started_early(const struct grad_sync *s);

#endif

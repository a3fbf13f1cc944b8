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
#ifndef TRIDENT_GRAD_SYNC_H
#define TRIDENT_GRAD_SYNC_H

#include <stddef.h>

#include "model/model.h"
#include "parallel/comm.h"

struct grad_sync;

// Plans the buckets over m's gradient arena for group dp (size 1: every call
// is a no-op). bucket_bytes >= 1. Allocates once; never fails.
struct grad_sync *grad_sync_init(struct model *m, struct comm_group *dp, size_t bucket_bytes);
void grad_sync_free(struct grad_sync *s);

// Arms the hook for the next model_backward (the last microbatch's).
void grad_sync_arm(struct grad_sync *s);
// Starts the buckets not started yet (all of them when grad_sync_arm was not
// called for this backward), waits for every bucket and disarms.
void grad_sync_finish(struct grad_sync *s);
// Number of buckets, and how many had been started before grad_sync_finish
// in the last armed backward (tests: proves the overlap).
int grad_sync_buckets(const struct grad_sync *s);
int grad_sync_started_early(const struct grad_sync *s);

#endif

// pipeline_internal.h: what the executor (pipeline.c) shares with the schedules
// and the simulator (pipeline_schedule.c): which message stream each op reads
// and writes, and the default rings. Not part of the API.
#ifndef TRIDENT_PIPELINE_INTERNAL_H
#define TRIDENT_PIPELINE_INTERNAL_H

#include "pipeline.h"

// The stream an op of stage s reads its input from, or -1: the forward of
// virtual stage 0, the backward (or B) of the last one, and every W have none.
int pipeline_stream_in(enum pp_schedule kind, int p, int s, int v, const struct pp_op *op);
// The stream an op of stage s writes its output to, or -1 (the forward of the
// last virtual stage, the backward or B of virtual stage 0, every W).
int pipeline_stream_out(enum pp_schedule kind, int p, int s, int v, const struct pp_op *op);
// Whether stream k is one this stage receives on (ACT_IN, GRAD_IN and the _V ones).
bool pipeline_stream_is_in(int k);
bool pipeline_stream_is_gradient(int k);
// ZB-V's turn at stage p - 1: chunk 0's activations go to chunk 1 and chunk
// 1's gradients to chunk 0 on the same rank. For such an output stream
// (ACT_OUT and GRAD_OUT_V of stage p - 1 under ZBV) the receive stream it
// feeds (ACT_IN_V, GRAD_IN): the producer writes into that ring and nothing
// goes through the pp group. -1 for every other stream.
int pipeline_stream_local_target(enum pp_schedule kind, int p, int s, int k);
// The group rank at the other end of stream k of stage s.
int pipeline_stream_peer(enum pp_schedule kind, int p, int s, int k);
// The (micro, chunk) that consumes the output of op (stage s) on the next
// virtual stage (forward) or the previous one (backward): its chunk there.
int pipeline_consumer_chunk(enum pp_schedule kind, int p, int s, const struct pp_op *op);
// Default rings of stage s's streams (pipeline_ring_size); arguments checked.
void pipeline_ring_sizes(enum pp_schedule kind, int p, int s, int m, int v,
                         int rings[PP_STREAM_COUNT]);

#endif

// pipeline.h: pipeline-parallel schedules and the executor that runs one
// stage's schedule against model callbacks, independent of the model.
//
// Source: Narayanan et al., "Efficient Large-Scale Language Model Training on
// GPU Clusters Using Megatron-LM", SC 2021, §2.2:
//   §2.2.1 the 1F1B schedule of PipeDream-Flush (v == 1): stage s runs
//          min(p - s - 1, m) warmup forwards, then alternates one forward and
//          one backward, then the remaining backwards (cooldown). Bubble
//          fraction (p - 1) / m of the ideal time, i.e. (p - 1) / (m + p - 1)
//          of the total; at most p - s microbatches in flight on stage s.
//   §2.2.2 the interleaved 1F1B schedule (v > 1): each stage holds v model
//          chunks; chunk c of stage s is virtual stage c * p + s of p * v, so
//          activations go round the ring of stages v times. The bubble
//          shrinks by v: (p - 1) / (v * m) of the ideal time. The op order is
//          Megatron-LM's forward_backward_pipelining_with_interleaving
//          (megatron/core/pipeline_parallel/schedules.py): microbatches go
//          through the chunks in groups of p, warmup of
//          2 (p - s - 1) + (v - 1) p forwards, and m % p == 0 is required.
//          One difference: Megatron runs every forward first on every stage
//          when m == p; here the warmup formula holds for m == p too, which
//          keeps fewer activations in flight on stages s > 0 and still
//          reaches the ideal makespan 2 (v m + p - 1) op times (unit-time
//          simulation in tests/unit/test_pipeline.c).
//
// Terms: p stages (the pp group's size), s this stage (its rank), m
// microbatches per optimizer step (gradient accumulation), v model chunks per
// stage ([parallel] virtual_stages). An op is the forward or the backward of
// one (microbatch, chunk); a stage runs 2 m v ops.
#ifndef TRIDENT_PIPELINE_H
#define TRIDENT_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/common.h"
#include "comm.h"
#include "kernels/ops.h"

enum pp_op_kind { PP_FORWARD, PP_BACKWARD };

// One op of a stage's schedule. slot in [0, pipeline_max_in_flight): the
// activation storage the forward of (micro, chunk) fills and its backward
// reads; it is free again after that backward (lowest free slot first).
// last: a backward that is its chunk's last in the schedule (micro m - 1).
// In both orders the chunks' last backwards come chunk v - 1 first and chunk
// 0 last, i.e. from the end of the stage's layers to their start, the order
// in which a gradient arena laid out in forward order becomes final.
struct pp_op {
    enum pp_op_kind kind;
    int micro; // [0, m)
    int chunk; // [0, v): virtual stage chunk * p + s
    int slot;
    bool last;
};

// Fills ops (2 m v entries) with the schedule of stage s. Refused with
// STATUS_BAD_INPUT and a message naming the value: p < 1, s outside [0, p),
// v < 1, m < p (fewer microbatches than stages: the pipeline never fills),
// v > 1 with m % p != 0 (Megatron's requirement for the interleaved order),
// v > 1 with p == 1 (interleaving needs a second stage).
enum status pipeline_schedule(int p, int s, int m, int v, struct pp_op *ops, struct error *err);

// The peak number of ops of stage s whose forward has run and backward has
// not: the activation slots the model allocates (each holds one chunk's
// activations of one microbatch). v == 1: p - s. v > 1:
// min(m v, 2 (p - s - 1) + (v - 1) p + 1), the warmup forwards plus the one
// forward of the steady state before its first backward. 0 when
// pipeline_schedule would refuse the arguments.
int pipeline_max_in_flight(int p, int s, int m, int v);

// The virtual stage (0 .. p v - 1) of chunk on stage s: chunk * p + s.
// Virtual stage u holds layers [u L / (p v), (u + 1) L / (p v)).
int pipeline_virtual_stage(int p, int s, int chunk);

// Forward of (micro, chunk) into activation slot. in: (count,) the previous
// virtual stage's output, NULL on virtual stage 0 (the model reads the
// batch); out: (count,) this chunk's output, NULL on the last virtual stage
// (the model computes the loss). in is valid only during the call: a model
// that needs it in the backward copies it into the slot.
typedef void (*pipeline_forward_fn)(void *ctx, int micro, int chunk, int slot, const void *in,
                                    void *out);
// Backward of (micro, chunk) from activation slot. dout: (count,) the
// gradient of this chunk's output, NULL on the last virtual stage (the loss
// is the start); din: (count,) the gradient of its input, to fill, NULL on
// virtual stage 0. The slot is free again when this returns. last: this is
// the chunk's last backward of the run (pp_op.last), so the chunk's
// parameter gradients are final as each of its layers is done, and every
// chunk above it is already final: data parallelism starts their reduction
// here, while the stages before go on with their backwards.
typedef void (*pipeline_backward_fn)(void *ctx, int micro, int chunk, int slot, bool last,
                                     const void *dout, void *din);
// Optional: called over and over while the executor waits for a message,
// so that the caller's own non-blocking operations progress (MPI moves data
// only inside MPI calls, comm.h): e.g. comm_test on the data-parallel
// gradient buckets that the last backwards started.
typedef void (*pipeline_progress_fn)(void *ctx);

// The four message streams of a stage: activations from the previous virtual
// stage and to the next, gradients from the next and to the previous.
enum pp_stream_kind {
    PP_STREAM_ACT_IN,
    PP_STREAM_GRAD_IN,
    PP_STREAM_ACT_OUT,
    PP_STREAM_GRAD_OUT,
    PP_STREAM_COUNT,
};

// Message buffers of one stream of stage s (a ring; message i uses buffer
// i % ring): the peak number of its messages in flight, from production to
// the end of the consuming op, when all stages run their schedules with
// backward ops as long as forward ones and twice as long (so in such runs no
// op waits for a buffer), plus one spare. 0 for a stream without messages or
// refused arguments. Any ring >= 1 is free of deadlock; a smaller one adds
// waits.
int pipeline_ring_size(int p, int s, int m, int v, enum pp_stream_kind stream);

// Bytes of message buffers pipeline_exec_init allocates with the default
// ring, for messages of count elements of dtype. Not yet part of the memory
// plan (model_plan counts the arenas only).
size_t pipeline_buffer_bytes(int p, int s, int m, int v, size_t count, enum dtype dtype);

struct pipeline_state; // message buffers and requests, owned (pipeline.c)

// What the caller sets before pipeline_exec_init; state is filled there.
struct pipeline_exec {
    int p, s, m, v;
    struct comm_group *group; // the pp group: size p, this rank s
    size_t count;             // elements in one activation message, e.g. B * T * C
    enum dtype dtype;         // of the messages
    void *ctx;                // passed to the callbacks
    pipeline_forward_fn forward;
    pipeline_backward_fn backward;
    pipeline_progress_fn progress; // NULL: the executor blocks in comm_wait
    int ring; // buffers per stream; 0: pipeline_ring_size's (1 gives the fewest)
    struct pipeline_state *state;
    struct backend *be; // the message buffers are this backend's memory (device
                        // buffers for a NCCL group); NULL: host memory
};

// Checks x (STATUS_BAD_INPUT for a refused schedule or a group that is not
// p ranks with this rank s) and allocates, once, the message buffers of the
// four streams (pipeline_buffer_bytes of them with the default ring).
enum status pipeline_exec_init(struct pipeline_exec *x, struct error *err);

// Runs stage s's schedule once (one optimizer step's forwards and backwards):
// every rank of the pp group calls it with the same p, m, v. Activations go
// to the next stage and gradients to the previous one with non-blocking
// sends; receives are posted ahead into the rings and a send is waited on
// only before its buffer is reused, an order free of deadlock (the argument
// in pipeline.c; checked on threads with rendezvous messages for every
// p <= 8, m <= 3p + 4, v <= 3). While it waits for a message it calls
// x->progress, when set, between comm_test's of that message (the wait
// still counts in the pp group's busy_s). No allocation.
enum status pipeline_run(const struct pipeline_exec *x, struct error *err);

// Lets pending messages progress (MPI moves data only inside MPI calls): a
// callback that computes for long calls it now and then, e.g. between layers.
void pipeline_poll(const struct pipeline_exec *x);

// Releases what pipeline_exec_init allocated. Safe twice.
void pipeline_exec_free(struct pipeline_exec *x);

#endif

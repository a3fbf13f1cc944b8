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
// one (microbatch, chunk); a stage runs 2 m v ops (3 m v under the split
// schedules, whose backward is two ops, B and W).
//
// The tables, the simulator and the streams: src/parallel/pipeline_schedule.c;
// the executor: src/parallel/pipeline.c.
#ifndef TRIDENT_PIPELINE_H
#define TRIDENT_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/common.h"
#include "comm.h"
#include "kernels/ops.h"

// The schedule a pp group runs ([parallel] pp_schedule).
//  PP_SCHEDULE_1F1B: v == 1 the 1F1B of §2.2.1, v > 1 the interleaved 1F1B of
//    §2.2.2 (PP_SCHEDULE_INTERLEAVED is the same table; it requires v > 1).
//  PP_SCHEDULE_ZB_H1: Qi et al. 2024 (arXiv 2401.10241) §3, ZB-H1: v == 1; each
//    backward split into B (input gradient, sent upstream at once) and W
//    (weight gradients, deferred to fill the bubble); the activation memory
//    of 1F1B (at most p - s microbatches whose F ran and B did not, on
//    stage s); bubble (p - 1)(F + B - W) against 1F1B's (p - 1)(F + B + W):
//    with F = B = W = 1, (p - 1) / (3 m + p - 1) of the step for every
//    m >= p (1F1B: (p - 1) / (m + p - 1)). Op order: PaddlePaddle's ZBH1
//    pass with the W's in microbatch order. Activation slots (F to B): p - s,
//    1F1B's; W stashes (B to W): s + 1 (stage s defers s W's).
//  PP_SCHEDULE_ZBV: Qi et al. 2024 §6 (ZB-V; torchtitan's ZBVZeroBubble):
//    v == 2 in a V: chunk 0 of stage s is virtual stage s, chunk 1 is virtual
//    stage 2 p - 1 - s, so stage 0 holds the first and the last virtual
//    stage and stage p - 1's chunk 0 feeds its own chunk 1; B and W split.
//    Op order: PyTorch's ScheduleZBVZeroBubble. Any m >= p (p >= 2); with
//    F = B = W = 1 per chunk op every stage idles p - 1 units once
//    m >= 3 p / 2: bubble (p - 1) / (6 m + p - 1), p = 4, m = 8: 3/51 =
//    0.059 against ZB-H1's 3/27 = 0.111 (fewer microbatches: a larger
//    one). Activation slots: at most 2 p chunk slots (p microbatches of a
//    whole stage's activations), 2 p once m >= 2 p - 1; W stashes 2 s + 1.
// Every split schedule runs each chunk's B's and W's in microbatch order,
// so the weight gradients accumulate in 1F1B's order (bit-identical sums).
enum pp_schedule {
    PP_SCHEDULE_1F1B,
    PP_SCHEDULE_INTERLEAVED,
    PP_SCHEDULE_ZB_H1,
    PP_SCHEDULE_ZBV,
    PP_SCHEDULE_COUNT,
};

// The config spelling: "1f1b", "interleaved", "zb-h1", "zbv".
const char *pipeline_schedule_name(enum pp_schedule kind);
// Whether the schedule splits the backward into B and W ops.
bool pipeline_schedule_splits(enum pp_schedule kind);

// PP_BACKWARD: the whole backward of (micro, chunk) (1F1B, interleaved).
// PP_BACKWARD_INPUT (B): its input gradient only: reads the output gradient,
// writes and sends the input gradient; the weight-gradient GEMMs' operands
// are kept for PP_BACKWARD_WEIGHT (W), which accumulates the weight
// gradients and frees the stash (B freed the activation slot). The split
// schedules use B and W, never PP_BACKWARD.
enum pp_op_kind { PP_FORWARD, PP_BACKWARD, PP_BACKWARD_INPUT, PP_BACKWARD_WEIGHT };

// One op of a stage's schedule. slot in [0, pipeline_max_in_flight): the
// activation storage the forward of (micro, chunk) fills and its backward
// (split schedules: its B) frees (lowest free slot first); -1 on a W.
// wslot in [0, pipeline_max_w_pending), split schedules' B and W only (-1
// otherwise): the W stash B fills with what W reads (the weight-gradient
// GEMMs' operands) and W frees (lowest free first). Activations and stashes
// are two pools so that ZB-H1 keeps 1F1B's p - s activation slots.
// last: the op that makes its chunk's weight gradients final: the backward
// (split schedules: the W) of the chunk's last microbatch in the schedule
// (microbatch m - 1 in every schedule here).
// In every schedule the chunks' last ones come chunk v - 1 first and chunk
// 0 last, i.e. from the end of the stage's layers to their start, the order
// in which a gradient arena laid out in forward order becomes final.
// (ZB-V: chunk 1 holds the later layers on every stage, so the same holds.)
struct pp_op {
    enum pp_op_kind kind;
    int micro; // [0, m)
    int chunk; // [0, v): virtual stage pipeline_virtual_stage(kind, p, s, chunk)
    int slot;
    int wslot;
    bool last;
};

// Ops of stage s in one step: 2 m v (PP_SCHEDULE_1F1B, INTERLEAVED) or 3 m v
// (the split schedules); 0 when pipeline_schedule would refuse.
int pipeline_op_count(enum pp_schedule kind, int p, int s, int m, int v);

// Fills ops (pipeline_op_count entries) with the schedule of stage s,
// deterministic and the same table on every rank that asks for stage s.
// Refused with STATUS_BAD_INPUT and a message naming the value: p < 1, s
// outside [0, p), v < 1, m < p (fewer microbatches than stages: the pipeline
// never fills), v > 1 with m % p != 0 (Megatron's requirement for the
// interleaved order; not ZBV), v > 1 with p == 1 (interleaving needs a
// second stage), INTERLEAVED with v == 1, ZB_H1 with v != 1, ZBV with v != 2
// or p == 1, an unknown kind.
enum status pipeline_schedule(enum pp_schedule kind, int p, int s, int m, int v, struct pp_op *ops,
                              struct error *err);

// The peak number of (micro, chunk) of stage s whose forward has run and
// whose slot is not yet free (backward, or B, not yet run): the activation
// slots the model allocates (each holds one chunk's activations of one
// microbatch). 1F1B (v == 1): p - s. Interleaved: min(m v, 2 (p - s - 1) +
// (v - 1) p + 1). ZB-H1: p - s, 1F1B's. ZB-V: 2 p once m >= 2 p - 1 (the
// tables' peaks, tests/unit/test_pipeline.c; = pipeline_max_b_pending for
// the split schedules, which also need pipeline_max_w_pending W stashes).
// 0 when pipeline_schedule would refuse.
int pipeline_max_in_flight(enum pp_schedule kind, int p, int s, int m, int v);

// Split schedules: the peak number of (micro, chunk) of stage s whose B has
// run and whose W has not (the W stashes alive at once), and of those whose
// F has run and whose B has not (the activations a B still reads). ZB-H1:
// s + 1 and p - s (1F1B's activations), for every m >= p; ZB-V: 2 s + 1
// and 2 p chunks once m >= 2 p - 1. A model that keeps W's operands apart
// from the activations needs pipeline_max_w_pending stashes beside
// pipeline_max_b_pending activation slots, not pipeline_max_in_flight slots
// of both (ZB-H1 stage 0: p + 1 instead of 2 p). 0 for the other schedules
// and for refused arguments. (Tables' peaks, tests/unit/test_pipeline.c.)
int pipeline_max_w_pending(enum pp_schedule kind, int p, int s, int m, int v);
int pipeline_max_b_pending(enum pp_schedule kind, int p, int s, int m, int v);

// The virtual stage (0 .. p v - 1) of chunk on stage s: chunk * p + s, or
// under ZBV s (chunk 0) and 2 p - 1 - s (chunk 1).
// Virtual stage u holds layers [u L / (p v), (u + 1) L / (p v)).
int pipeline_virtual_stage(enum pp_schedule kind, int p, int s, int chunk);

// The stage holding virtual stage u (0 .. p v - 1): u % p, or under ZB-V u
// (u < p) and 2 p - 1 - u (u >= p).
static inline int pipeline_stage_of(enum pp_schedule kind, int p, int u) {
    if (kind == PP_SCHEDULE_ZBV) return u < p ? u : 2 * p - 1 - u;
    return u % p;
}

// The stage holding the last virtual stage (the head and the loss): p - 1,
// or 0 under ZB-V.
static inline int pipeline_last_stage(enum pp_schedule kind, int p) {
    return kind == PP_SCHEDULE_ZBV ? 0 : p - 1;
}

// Forward of (micro, chunk) into activation slot. in: (count,) the previous
// virtual stage's output, NULL on virtual stage 0 (the model reads the
// batch); out: (count,) this chunk's output, NULL on the last virtual stage
// (the model computes the loss). in is valid only during the call: a model
// that needs it in the backward copies it into the slot.
typedef void (*pipeline_forward_fn)(void *ctx, int micro, int chunk, int slot, const void *in,
                                    void *out);
// Backward of (micro, chunk) from activation slot: PP_BACKWARD (wslot -1),
// or its B half (PP_BACKWARD_INPUT, wslot >= 0). dout: (count,) the
// gradient of this chunk's output, NULL on the last virtual stage (the loss
// is the start); din: (count,) the gradient of its input, to fill, NULL on
// virtual stage 0. The slot is free again when this returns. wslot -1: the
// whole backward. wslot >= 0: the input gradient only; what the weight
// gradients need goes into W stash wslot, taken until the W op
// (pipeline_weight_fn) of the same (micro, chunk, wslot).
// last: this op makes the chunk's weight gradients final (pp_op.last; never
// for a B), so every chunk above it is already final: data parallelism
// starts their reduction here, while the stages before go on with theirs.
typedef void (*pipeline_backward_fn)(void *ctx, int micro, int chunk, int slot, int wslot,
                                     bool last, const void *dout, void *din);
// W (PP_BACKWARD_WEIGHT) of (micro, chunk): the weight gradients its B left
// in W stash wslot, accumulated; the stash is free when this returns. last
// as above. No messages.
typedef void (*pipeline_weight_fn)(void *ctx, int micro, int chunk, int wslot, bool last);
// Optional: called over and over while the executor waits for a message,
// so that the caller's own non-blocking operations progress (MPI moves data
// only inside MPI calls, comm.h): e.g. comm_test on the data-parallel
// gradient buckets that the last backwards started.
typedef void (*pipeline_progress_fn)(void *ctx);

// The message streams of a stage, by what they carry and which way they go:
// activations in and out, gradients in and out, each from or to the
// previous virtual stage's rank, the next one's, or (ZB-V's turn at stage
// p - 1) this rank itself. The 1F1B schedules and ZB-H1 use the first four.
// ZB-V's turn goes through no message: on stage p - 1 chunk 0's forward
// (ACT_OUT) writes straight into ACT_IN_V's ring and chunk 1's B
// (GRAD_OUT_V) into GRAD_IN's.
enum pp_stream_kind {
    PP_STREAM_ACT_IN,       // activations from the rank of virtual stage u - 1
    PP_STREAM_GRAD_IN,      // gradients from the rank of u + 1
    PP_STREAM_ACT_OUT,      // activations to the rank of u + 1
    PP_STREAM_GRAD_OUT,     // gradients to the rank of u - 1
    PP_STREAM_ACT_IN_V,     // ZB-V chunk 1: activations from stage s + 1 (or self at p - 1)
    PP_STREAM_GRAD_IN_V,    // ZB-V chunk 1: gradients from stage s - 1 (none at s = 0)
    PP_STREAM_ACT_OUT_V,    // ZB-V chunk 1: activations to stage s - 1 (none at s = 0)
    PP_STREAM_GRAD_OUT_V,   // ZB-V chunk 1: gradients to stage s + 1 (or self at p - 1)
    PP_STREAM_COUNT,
};

// Message buffers of one stream of stage s (a ring; message i uses buffer
// i % ring): the peak number of its messages in flight, from production to
// the end of the consuming op, when all stages run their schedules with
// backward ops as long as forward ones and twice as long (so in such runs no
// op waits for a buffer), plus one spare. 0 for a stream without messages or
// refused arguments, and for ZB-V's two local outputs on stage p - 1 (the
// ring they feed holds their messages). The split schedules are simulated
// with B = W = half the backward. Any ring >= 1 is free of deadlock; a
// smaller one adds waits.
int pipeline_ring_size(enum pp_schedule kind, int p, int s, int m, int v,
                       enum pp_stream_kind stream);

// Bytes of message buffers pipeline_exec_init allocates with the default
// ring, for messages of count elements of dtype. Not yet part of the memory
// plan (model_plan counts the arenas only).
size_t pipeline_buffer_bytes(enum pp_schedule kind, int p, int s, int m, int v, size_t count,
                             enum dtype dtype);

// ---- simulator ------------------------------------------------------------------
//
// Every stage's table run together (pipeline_schedule for s = 0 .. p - 1),
// each op starting once its stage is free and its input has arrived (the
// producing op finished, plus comm for a message between two ranks), so the
// timeline is exactly the order the trainer executes, with costs instead of
// kernels.

// Cost of one op in any unit (seconds, or 1 for unit time). backward: the
// whole PP_BACKWARD; b: B (PP_BACKWARD_INPUT), w: W (PP_BACKWARD_WEIGHT);
// comm: the time a message takes between two ranks (0 on the same rank).
struct pp_costs {
    double f, b, w, comm;
};

enum { PIPELINE_SIM_MAX_STAGES = 64 };

struct pp_sim {
    double makespan;                      // first op's start to the last op's end
    double busy[PIPELINE_SIM_MAX_STAGES]; // per stage: sum of its ops' costs
    double idle[PIPELINE_SIM_MAX_STAGES]; // per stage: makespan - busy
    double bubble;                        // sum(idle) / (p makespan): the step's bubble fraction
    int peak_in_flight[PIPELINE_SIM_MAX_STAGES]; // per stage: pipeline_max_in_flight
};

// Simulates schedule kind on p stages (p <= PIPELINE_SIM_MAX_STAGES) with m
// microbatches and v chunks per stage. Unit costs F = B = W = 1 (PP_BACKWARD
// = B + W = 2), comm 0, give 1F1B's (p - 1) / (m + p - 1), interleaved's
// (p - 1) / (v m + p - 1), ZB-H1's (p - 1) / (3 m + p - 1) and ZB-V's
// (p - 1) / (6 m + p - 1) (m >= 3 p / 2). The costs are per op: a chunk's
// op under v > 1 is the cost of that chunk. Errors: pipeline_schedule's
// (STATUS_BAD_INPUT), costs not f, b, w > 0 and comm >= 0 (STATUS_BAD_INPUT),
// p > PIPELINE_SIM_MAX_STAGES; STATUS_RUNTIME if the tables deadlock (never
// for the schedules here).
enum status pipeline_simulate(enum pp_schedule kind, int p, int m, int v,
                              const struct pp_costs *costs, struct pp_sim *out, struct error *err);

// Writes the simulated timeline to f: one line per stage, one character per
// time unit of width `unit` (F forward, B input backward or whole backward,
// W weight backward, '.' idle; lowercase for odd chunks, i.e. chunk 1 of
// ZB-V's 2), each line ending in the stage's idle time, then the makespan
// and the bubble fraction. Errors: pipeline_simulate's, unit <= 0.
enum status pipeline_print_timeline(FILE *f, enum pp_schedule kind, int p, int m, int v,
                                    const struct pp_costs *costs, double unit, struct error *err);

struct pipeline_state; // message buffers and requests, owned (pipeline.c)

// What the caller sets before pipeline_exec_init; state is filled there.
struct pipeline_exec {
    enum pp_schedule kind;
    int p, s, m, v;
    struct comm_group *group; // the pp group: size p, this rank s
    size_t count;             // elements in one activation message, e.g. B * T * C
    enum dtype dtype;         // of the messages
    void *ctx;                // passed to the callbacks
    pipeline_forward_fn forward;
    pipeline_backward_fn backward;
    pipeline_weight_fn weight;     // required by the split schedules
    pipeline_progress_fn progress; // NULL: the executor blocks in comm_wait
    int ring; // buffers per stream; 0: pipeline_ring_size's (1 gives the fewest)
    uint64_t delay_seed; // tests (TRIDENT_FAULT=pp_delay:SEED): nonzero sleeps a random
                         // 0 to 2 ms, drawn from (seed, stage, stream, message index)
                         // by splitmix64, before every send and receive this
                         // executor starts
    double op_pad_s;     // tests (TRIDENT_FAULT=pp_op_ms:N): each F, B and W op first
                         // sleeps this long (a whole backward twice): stages of equal
                         // cost that leave the CPU free, so that idle_s shows the
                         // schedule's bubble on an oversubscribed machine
    double idle_s;       // out, set by pipeline_run: seconds this stage waited on its
                         // messages in the run (receives and the sends whose buffer it
                         // needed again, the end's included): the stage's measured bubble
    struct pipeline_state *state;
    struct backend *be; // the message buffers are this backend's memory (device
                        // buffers for a NCCL group); NULL: host memory
};

// Checks x (STATUS_BAD_INPUT for a refused schedule, a group that is not
// p ranks with this rank s, a missing callback: weight is required by the
// split schedules) and allocates, once, the message buffers of the streams
// (pipeline_buffer_bytes of them with the default ring; with x->ring set,
// ZB-V's local ring on stage p - 1 still holds its table's peak).
enum status pipeline_exec_init(struct pipeline_exec *x, struct error *err);

// Runs stage s's schedule once (one optimizer step's forwards and backwards):
// every rank of the pp group calls it with the same kind, p, m, v. Activations go
// to the next stage and gradients to the previous one with non-blocking
// sends; receives are posted ahead into the rings and a send is waited on
// only before its buffer is reused, an order free of deadlock (the argument
// in pipeline.c; checked on threads with rendezvous messages for every
// schedule, p <= 8, m <= 3p + 4, v <= 3). Ops: PP_FORWARD -> x->forward,
// PP_BACKWARD -> x->backward(split = false), B -> x->backward(split = true,
// last = false; its input gradient sent as PP_BACKWARD's), W -> x->weight
// (no messages). While it waits for a message it calls x->progress, when
// set, between comm_test's of that message (the wait still counts in the pp
// group's busy_s); x->idle_s gets the run's waiting seconds. No allocation.
enum status pipeline_run(struct pipeline_exec *x, struct error *err);

// Lets pending messages progress (MPI moves data only inside MPI calls): a
// callback that computes for long calls it now and then, e.g. between layers.
void pipeline_poll(const struct pipeline_exec *x);

// Releases what pipeline_exec_init allocated. Safe twice.
void pipeline_exec_free(struct pipeline_exec *x);

#endif

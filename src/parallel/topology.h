// topology.h: the 3-D grid of tensor-, data- and pipeline-parallel ranks
// (docs/design.md §2) and the communication groups of this rank.
//
// Rank order is Megatron's: rank = t + tp * (d + dp * p). TP varies fastest,
// so a TP group is tp consecutive ranks (one node's fast domain); PP stages
// vary slowest.
#ifndef TRIDENT_TOPOLOGY_H
#define TRIDENT_TOPOLOGY_H

#include <mpi.h>
#include <stdio.h>

#include "base/common.h"
#include "comm.h"
#include "kernels/ops.h"

// A rank's place in the grid: t in [0, tp), d in [0, dp), p in [0, pp).
struct grid_coord {
    int t, d, p;
};

// The kinds of group each rank belongs to.
enum group_kind {
    GROUP_TP,    // same (d, p), t = 0..tp-1
    GROUP_DP,    // same (t, p), d = 0..dp-1
    GROUP_PP,    // same (t, d), p = 0..pp-1
    GROUP_EMBED, // same (t, d), p in {0, pp-1}: tied embedding and LM head;
                 // the rank alone when pp == 1; middle stages are not members
    GROUP_COUNT,
};

struct topology {
    int world_rank, world_size;
    int tp, pp, dp;
    struct grid_coord coord;
    int local_rank, local_size; // on this node (MPI_COMM_TYPE_SHARED)
    struct comm_group tp_group, dp_group, pp_group;
    struct comm_group embed_group; // size 0 on middle pipeline stages
    struct comm_group world;       // a duplicate of the world passed to init
    // The groups over device buffers (gradients, activations, parameters),
    // one per kind, indexed by enum group_kind: NCCL communicators over the
    // members of the MPI group of the same kind once topology_init_device
    // ran (system.device = cuda), comm_self for a group of one rank, size 0
    // where this rank is no member. Before that (the CPU backend, whose
    // buffers are host memory) topology_device_group returns the MPI groups.
    struct comm_group device[GROUP_COUNT];
    bool has_device_groups;
};

// Pure layout functions: no MPI needed.
int topology_rank_of(int tp, int pp, int dp, struct grid_coord coord);
struct grid_coord topology_coord_of(int tp, int pp, int dp, int rank);
// "tp", "dp", "pp", "embed".
const char *topology_group_name(enum group_kind kind);
// Fills members (room for max(tp, pp, dp) ranks) with the world ranks of the
// group of kind that contains coord, in group-rank order, and returns their
// count; 0 when coord is not in such a group (middle stage, GROUP_EMBED).
int topology_group_members(enum group_kind kind, int tp, int pp, int dp, struct grid_coord coord,
                           int *members);
// Prints which world ranks form each TP, DP, PP and embedding group, one
// line per group (tests and debugging; the trainer's banner prints the grid).
void topology_describe(FILE *f, int tp, int pp, int dp);

// Collective over world: checks tp * pp * dp == world size (else
// STATUS_BAD_INPUT naming the three sizes and N) and builds every group of
// this rank. Every rank makes the same MPI calls in the same order.
enum status topology_init(MPI_Comm world, int tp, int pp, int dp, struct topology *out,
                          struct error *err);
// A 1 x 1 x 1 topology of comm_self groups, without MPI (tests, one rank).
void topology_init_self(struct topology *out);
// Collective over world when built by topology_init.
void topology_free(struct topology *topo);

// The group of kind in topo: MPI over host buffers (scalars, the log,
// checkpoints, pipeline messages, which the model stages through host memory).
struct comm_group *topology_group(struct topology *topo, enum group_kind kind);

// Collective over the world of topology_init: the device-buffer groups of
// this rank over the CUDA backend be, whose device was chosen from the
// node-local rank (topology_device_of) before any other CUDA call. Every
// rank walks the kinds in enum order (TP, DP, PP, EMBED), each NCCL group
// with its own communication stream, TP and PP at the highest priority
// (comm_nccl.h); for each group of
// two or more ranks, its group rank 0 makes the ncclUniqueId, the group's MPI
// communicator broadcasts it and its members call ncclCommInitRank together.
// A group of one rank becomes comm_self (no NCCL communicator) and a rank
// outside a group (a middle stage's EMBED) skips it: no collective another
// rank waits on. Groups of one kind are disjoint and every rank takes the
// kinds in the same order, so no rank waits on one that waits on it.
// Errors: STATUS_BAD_INPUT in a build without CUDA (make CUDA=1). NCCL and
// CUDA failures abort the job (CHECK_NCCL, CHECK_CUDA).
enum status topology_init_device(struct topology *topo, struct backend *be, struct error *err);

// A watchdog check (src/base/watchdog.h's watchdog_add_check; topo: a struct
// topology *): polls the asynchronous error of every device group of this
// rank (comm_check: NCCL's ncclCommGetAsyncError) from the watchdog's
// thread, so a failed collective is reported while the main thread blocks
// where comm_nccl cannot poll (a device synchronize). Returns 0 when none
// failed (or before topology_init_device); else 1 with msg naming the group,
// this rank, its host and NCCL's error, the communicator aborted.
int topology_check_device_groups(void *topo, char *msg, size_t cap);

// The group of kind over device buffers: topo->device[kind] after
// topology_init_device, else the MPI group topology_group returns (host
// buffers are the device's on the CPU backend).
struct comm_group *topology_device_group(struct topology *topo, enum group_kind kind);

// The CUDA device of a rank: its node-local rank (topology.local_rank, from
// MPI_Comm_split_type SHARED) modulo the devices it sees, so the ranks of a
// node spread over its GPUs (and share them round-robin when there are more
// ranks than GPUs). device_count: what cudaGetDeviceCount reports (>= 1).
int topology_device_of(const struct topology *topo, int device_count);

#endif

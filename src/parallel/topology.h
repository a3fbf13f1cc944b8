// topology.h: the grid of parallel ranks, a list of named axes
// (parallel/axes_list.h: tp, cp, ep, dp_shard, dp_replicate, pp), the groups they
// form and the communication groups of this rank (docs/design.md §2).
//
// Rank order is Megatron's, the axes' order in axes_list.h, first fastest:
// rank = t + tp * (c + cp * (s + dp_shard * (r + dp_replicate * p))), i.e.
// with the data coordinate d = s + dp_shard * r, rank = t + tp * (c + cp * (d
// + dp * p)), the same numbering for every dp_shard. TP varies fastest, so a TP group is tp
// consecutive ranks (one node's fast domain); PP stages vary slowest. Every
// formula of this kind lives here, derived from the lists: no other file
// spells the axes' products or rank maths (tests/layering/check_grid.py).
#ifndef TRIDENT_TOPOLOGY_H
#define TRIDENT_TOPOLOGY_H

#include <mpi.h>
#include <stdio.h>

#include "axes_list.h"
#include "base/common.h"
#include "comm.h"
#include "kernels/ops.h"

enum grid_axis {
#define GRID_AXIS_ENUM(ID, name, key, doc) AXIS_##ID,
    GRID_AXES(GRID_AXIS_ENUM)
#undef GRID_AXIS_ENUM
    AXIS_COUNT,
};

// The kinds of group each rank belongs to (axes_list.h's GRID_GROUPS).
enum group_kind {
#define GRID_GROUP_ENUM(ID, name, axes, ends, size, critical, carries) GROUP_##ID,
    GRID_GROUPS(GRID_GROUP_ENUM)
#undef GRID_GROUP_ENUM
    GROUP_COUNT,
};

// The size of each axis, >= 1 (topology_layout makes one from the keys).
struct grid_layout {
    int size[AXIS_COUNT];
};

// A rank's place in the grid: at[a] in [0, size[a]) for each axis a. The
// rank within a group of several axes (the data rank d within GROUP_DP):
// topology_group_rank.
struct grid_coord {
    int at[AXIS_COUNT];
};

// ---- the lists --------------------------------------------------------------
const char *topology_axis_name(enum grid_axis a); // "tp", "dp_shard", ...
const char *topology_axis_key(enum grid_axis a);  // its [parallel] key; "" derived
// "tp", "cp", "dp", "dp_cp", "dp_shard", "dp_shard_cp", "dp_replicate", "pp", "embed".
const char *topology_group_name(enum group_kind kind);
unsigned topology_group_axes(enum group_kind kind); // bit (1 << a) per axis a
// Whether kind is a named size of the layout, which the records print (the
// list's `size` column: tp, cp, dp, dp_shard, dp_replicate, pp); false for
// the gradient groups over data x context and for GROUP_EMBED.
bool topology_group_is_size(enum group_kind kind);
// true for a group of only the ends of its axis (GROUP_EMBED): some ranks
// belong to no group of that kind.
bool topology_group_is_ends(enum group_kind kind);

// ---- pure layout functions: no MPI needed -----------------------------------
// The layout of the [parallel] keys: tp, pp, dp, dp_shard (0: dp, one
// shard group of every data rank) and cp; dp_replicate = dp / dp_shard.
// Sizes must be >= 1 and dp_shard divide dp (config_validate refuses others;
// a CHECK here).
struct grid_layout topology_layout(int tp, int pp, int dp, int dp_shard, int cp);
// The same with ep expert-parallel ranks (parallel.ep, >= 1, dividing
// dp_shard, i.e. dp when dp_shard is 0): the axes ep = ep and dp_shard =
// dp_shard / ep; every group's size and members at ep = 1 are
// topology_layout's (the data rank d = e + ep * s' + dp_shard * r).
struct grid_layout topology_layout_ep(int tp, int pp, int dp, int dp_shard, int cp, int ep);
// The product of the sizes of kind's axes (GROUP_EMBED: min(pp, 2)), and
// the world: the product of every axis' size.
int topology_group_size(const struct grid_layout *g, enum group_kind kind);
int topology_world_size(const struct grid_layout *g);
// The layout's named sizes in list order into names/sizes (room for
// GROUP_COUNT; returns how many): axes_only: each axis (their product is the
// world: tp, cp, dp_shard, dp_replicate, pp), else each group that is a size
// (tp, cp, dp, dp_shard, dp_replicate, pp). What the records print.
int topology_layout_sizes(const struct grid_layout *g, bool axes_only, const char **names,
                          int *sizes);
// The same as text: "<name><assign><size>" joined by sep, e.g. (true, "=",
// " * ") "tp=2 * dp_shard=2 * dp_replicate=1 * pp=2". Returns buf.
char *topology_layout_text(const struct grid_layout *g, bool axes_only, const char *assign,
                           const char *sep, char *buf, size_t cap);
// The layout as people read it, one phrase wherever a layout is shown (the
// trainer's start line, its resume line, `trident ckpt info`, the checkpoint
// layer's layout errors): "world 4 = tp 1 x cp 1 x ep 2 x dp_shard 2 x
// dp_replicate 1 x pp 1", the world and every axis' size in rank order (the
// dp_shard axis is the [parallel] dp_shard / ep). Returns buf (cut at cap).
char *topology_layout_line(const struct grid_layout *g, char *buf, size_t cap);

int topology_rank_of(const struct grid_layout *g, struct grid_coord coord);
struct grid_coord topology_coord_of(const struct grid_layout *g, int rank);
// coord's rank within its group of kind (its axes' coordinates in rank
// order, first fastest; GROUP_EMBED: 0 first stage, 1 last), -1 when coord
// is in no such group (a middle stage's GROUP_EMBED).
int topology_group_rank(const struct grid_layout *g, enum group_kind kind, struct grid_coord coord);
// Which group of its kind coord is in, 0 .. world / group size - 1 (the
// other axes' coordinates in rank order); -1 as topology_group_rank.
int topology_group_index(const struct grid_layout *g, enum group_kind kind,
                         struct grid_coord coord);
// Fills members (room for topology_group_size ranks) with the world ranks of
// the group of kind that contains coord, in group-rank order, and returns
// their count; 0 when coord is not in such a group (middle stage, GROUP_EMBED).
int topology_group_members(const struct grid_layout *g, enum group_kind kind,
                           struct grid_coord coord, int *members);
// Prints which world ranks form each group of each kind, one line per kind
// (tests and debugging; the trainer's banner prints the grid).
void topology_describe(FILE *f, const struct grid_layout *g);

struct topology {
    int world_rank, world_size;
    struct grid_layout layout;
    struct grid_coord coord;
    int local_rank, local_size; // on this node (MPI_COMM_TYPE_SHARED)
    // The MPI groups of this rank, one per kind, indexed by enum group_kind
    // (topology_group); size 0 where this rank is no member (a middle
    // stage's GROUP_EMBED).
    struct comm_group host[GROUP_COUNT];
    struct comm_group world; // a duplicate of the world passed to init
    // The groups over device buffers (gradients, activations, parameters),
    // one per kind, indexed by enum group_kind: NCCL communicators over the
    // members of the MPI group of the same kind once topology_init_device
    // ran (system.device = cuda), comm_self for a group of one rank, size 0
    // where this rank is no member. Before that (the CPU backend, whose
    // buffers are host memory) topology_device_group returns the MPI groups.
    struct comm_group device[GROUP_COUNT];
    bool has_device_groups;
};

// Collective over world: checks that the layout's world size is the
// world's (else STATUS_BAD_INPUT naming every axis' size and N) and builds
// every group of this rank, one MPI_Comm_split per kind in list order.
// Every rank makes the same MPI calls in the same order.
enum status topology_init(MPI_Comm world, const struct grid_layout *layout, struct topology *out,
                          struct error *err);
// A topology of one rank (every size 1) of comm_self groups, without MPI
// (tests, one rank).
void topology_init_self(struct topology *out);
// Collective over world when built by topology_init.
void topology_free(struct topology *topo);

// This rank's rank within its group of kind: topology_group_rank of its
// coordinates (the data rank d for GROUP_DP, the stage for GROUP_PP), -1
// where it is in none (a middle stage's GROUP_EMBED).
int topology_rank_in(const struct topology *topo, enum group_kind kind);

// The group of kind in topo: MPI over host buffers (scalars, the log,
// checkpoints, pipeline messages, which the model stages through host memory).
struct comm_group *topology_group(struct topology *topo, enum group_kind kind);

// Collective over the world of topology_init: the device-buffer groups of
// this rank over the CUDA backend be, whose device was chosen from the
// node-local rank (topology_device_of) before any other CUDA call. Every
// rank walks the kinds in list order (axes_list.h), each NCCL group with its
// own communication stream, the `critical` kinds (TP, PP) at the highest
// priority (comm_nccl.h); for each group of
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

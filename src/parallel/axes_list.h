// axes_list.h: the axes of the grid and the groups they form, one row each:
// the one place a parallel dimension is written (docs/design.md §2, "Adding
// an axis"). From these lists come
//   - enum grid_axis (AXIS_<ID>) and enum group_kind (GROUP_<ID>), and so
//     struct grid_layout's sizes and struct grid_coord's coordinates
//     (parallel/topology.h), indexed by axis;
//   - the rank <-> coordinate maths (mixed radix over the axes in the order
//     listed, fastest first), each group's members, rank and MPI/NCCL twins
//     (topology.c), built for every group kind in the order listed;
//   - the layout as the records print it: the world's product in the banner
//     and errors, the checkpoint manifest's layout lines, metrics.jsonl's
//     start record, `trident plan`'s layout (topology_layout_sizes);
//   - tests/unit/test_topology.c's enumeration of every layout up to 64 ranks.
#ifndef TRIDENT_AXES_LIST_H
#define TRIDENT_AXES_LIST_H

// X(ID, name, key, doc), in rank order: the first varies fastest (Megatron's
// order: tensor, then context, then data, then pipeline; the shard part of
// data faster than the replicate part, so a shard group is consecutive data
// ranks, one node's when dp_shard ranks fit in it).
//   name: as printed and written (manifest, JSON);
//   key:  the [parallel] key that sets the axis' size, "" when derived from
//         other keys (topology_layout says how from the keys).
// ep is the part of data parallelism that the MoE layers split their experts
// over (Megatron-Core's expert-model-parallel ranks, inside the data ranks):
// the fastest part of data, so an ep group is ep consecutive data ranks; the
// data ranks are ep x dp_shard' x dp_replicate, where dp_shard' (the axis
// row below) is the [parallel] dp_shard / ep.
#define GRID_AXES(X)                                                                            \
    X(TP, "tp", "tp", "tensor parallel: a layer's heads and FFN columns split over tp ranks")     \
    X(CP, "cp", "cp",                                                                             \
      "context parallel: every sequence's tokens split over cp ranks (2 cp load-balanced causal " \
      "chunks, rank r holding chunks r and 2 cp - 1 - r), ring attention over them")               \
    X(EP, "ep", "ep",                                                                             \
      "expert parallel: the MoE layers' experts split over ep data ranks, tokens sent to their "  \
      "experts' ranks and back with all-to-all (dense layers replicated as over any data axis)")  \
    X(DP_SHARD, "dp_shard", "dp_shard",                                                           \
      "data parallel, the sharded part beside ep: optimizer state (ZeRO) split over dp_shard "    \
      "ranks (parallel.dp_shard, 0 = dp; this axis is dp_shard / ep of them)")                    \
    X(DP_REPLICATE, "dp_replicate", "",                                                           \
      "data parallel, the replicated part: dp / dp_shard copies of each shard (derived)")         \
    X(PP, "pp", "pp", "pipeline parallel: consecutive layers on pp stages")

// X(ID, name, axes, ends, size, critical, carries): a group of ranks that
// differ only in the listed axes (a bit mask of GRID_AXIS_BIT), in group-rank
// order = rank order over those axes.
//   ends:     1: only the first and last coordinate of its one axis are
//             members (the tied embedding's first and last stage), the
//             middle ones belong to no such group;
//   size:     1: a named size of the layout (the product of its axes' sizes),
//             which the records print (manifest, metrics.jsonl's start record,
//             config.ini, `trident plan`): tp, cp, dp, dp_shard, dp_replicate,
//             pp. 0 for the groups that only communicate (the gradient groups
//             over data x context, whose size is dp x cp) and for `ends` ones;
//   critical: its NCCL stream gets the highest priority (on the step's
//             critical path);
//   carries:  what the trainer reduces or sends over it.
// Under context parallelism the gradient group is data x context (Megatron's
// data-parallel-with-context-parallel group): parameters are replicated over
// cp, every cp rank's gradient is a partial sum over its tokens. DP keeps
// meaning the data ranks (the loader's rank, the records' dp); DP_CP and
// DP_SHARD_CP are the gradient groups; at cp = 1 each has the members of its
// twin without cp. (DP and DP_SHARD carry no collective of the trainer; they
// exist for the ranks and sizes they name, and get communicators as every
// kind does.)
#define GRID_AXIS_BIT(ID) (1u << AXIS_##ID)
#define GRID_GROUPS(X)                                                                          \
    X(TP, "tp", GRID_AXIS_BIT(TP), 0, 1, 1,                                                       \
      "activations: Megatron's f/g all-reduces, sequence parallel's all-gather and "              \
      "reduce-scatter; the sample's logits; the grad norm's and loss's sums over a split head")   \
    X(CP, "cp", GRID_AXIS_BIT(CP), 0, 1, 1,                                                       \
      "the ring of context parallelism: each attention's key/value blocks (forward, recomputation " \
      "and backward) and their gradients (backward)")                                             \
    X(DP, "dp", GRID_AXIS_BIT(EP) | GRID_AXIS_BIT(DP_SHARD) | GRID_AXIS_BIT(DP_REPLICATE), 0, 1, 0,                   \
      "the data ranks: the loader's data rank (every cp rank of a data rank reads the same "      \
      "sequences); the records' data-parallel size")                                              \
    X(DP_CP, "dp_cp",                                                                            \
      GRID_AXIS_BIT(CP) | GRID_AXIS_BIT(EP) | GRID_AXIS_BIT(DP_SHARD) | GRID_AXIS_BIT(DP_REPLICATE), \
      0, 0, 0,                                                                                    \
      "the gradient group (data x context): bucket all-reduces (zero 0), ZeRO-1's reduce-scatter " \
      "and all-gather; loss sums and target counts; the grad norm's sum under ZeRO-1"            \
      )                                                               \
    X(DP_SHARD, "dp_shard", GRID_AXIS_BIT(EP) | GRID_AXIS_BIT(DP_SHARD), 0, 1, 0,                                     \
      "the data ranks of one shard group (the records' dp_shard)")                                \
    X(DP_SHARD_CP, "dp_shard_cp", GRID_AXIS_BIT(CP) | GRID_AXIS_BIT(EP) | GRID_AXIS_BIT(DP_SHARD), 0, 0, 0,           \
      "ZeRO-2/3's shard group (shard x context; data x context without hybrid sharding): "      \
      "the units' reduce-scatters and all-gathers, the grad norm's sum")                                                                 \
    X(DP_REPLICATE, "dp_replicate", GRID_AXIS_BIT(DP_REPLICATE), 0, 1, 0,                         \
      "the replicas of one shard under hybrid sharding: the shards' all-reduce across them")      \
    X(EP, "ep", GRID_AXIS_BIT(EP), 0, 1, 1,                                                       \
      "the MoE layers' token all-to-alls (dispatch and combine, forward and backward) and their " \
      "row counts; the expert gradients' share of the grad norm")                                 \
    X(EXPERT_DP, "expert_dp", GRID_AXIS_BIT(CP) | GRID_AXIS_BIT(DP_SHARD) | GRID_AXIS_BIT(DP_REPLICATE), \
      0, 0, 0,                                                                                    \
      "the expert gradient group (data x context without ep: the ranks holding the same "        \
      "experts): the expert tensors' bucket all-reduces")                                         \
    X(PP, "pp", GRID_AXIS_BIT(PP), 0, 1, 1,                                                       \
      "stage messages (activations forward, their gradients backward); loss and norm sums")      \
    X(EMBED, "embed", GRID_AXIS_BIT(PP), 1, 0, 0,                                                 \
      "the tied embedding's gradient sum between the first and the last stage")

#endif

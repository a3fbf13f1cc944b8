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
// order: tensor, then data, then pipeline; the shard part of data faster than
// the replicate part, so a shard group is consecutive data ranks, one node's
// when dp_shard ranks fit in it).
//   name: as printed and written (manifest, JSON);
//   key:  the [parallel] key that sets the axis' size, "" when derived from
//         other keys (topology_layout says how from the keys).
// Room for more, not built: cp (context parallel, Megatron puts it between
// tp and the data axes) and ep (expert parallel, a split of the data axes
// for the experts' layers) would be rows here.
#define GRID_AXES(X)                                                                            \
    X(TP, "tp", "tp", "tensor parallel: a layer's heads and FFN columns split over tp ranks")     \
    X(DP_SHARD, "dp_shard", "dp_shard",                                                           \
      "data parallel, the sharded part: optimizer state (ZeRO) split over dp_shard ranks "        \
      "(parallel.dp_shard, 0 = dp)")                                                             \
    X(DP_REPLICATE, "dp_replicate", "",                                                           \
      "data parallel, the replicated part: dp / dp_shard copies of each shard (derived)")         \
    X(PP, "pp", "pp", "pipeline parallel: consecutive layers on pp stages")

// X(ID, name, axes, ends, critical, carries): a group of ranks that differ
// only in the listed axes (a bit mask of GRID_AXIS_BIT), in group-rank order
// = rank order over those axes.
//   ends:     1: only the first and last coordinate of its one axis are
//             members (the tied embedding's first and last stage), the
//             middle ones belong to no such group;
//   critical: its NCCL stream gets the highest priority (on the step's
//             critical path);
//   carries:  what the trainer reduces or sends over it.
// Every group but an `ends` one is a named size of the layout (its size is
// the product of its axes' sizes): the records print tp, dp, dp_shard,
// dp_replicate and pp.
#define GRID_AXIS_BIT(ID) (1u << AXIS_##ID)
#define GRID_GROUPS(X)                                                                          \
    X(TP, "tp", GRID_AXIS_BIT(TP), 0, 1,                                                          \
      "activations: Megatron's f/g all-reduces, sequence parallel's all-gather and "              \
      "reduce-scatter; the sample's logits; the grad norm's and loss's sums over a split head")   \
    X(DP, "dp", GRID_AXIS_BIT(DP_SHARD) | GRID_AXIS_BIT(DP_REPLICATE), 0, 0,                      \
      "the gradient group: bucket all-reduces (zero 0), ZeRO-1's reduce-scatter and "             \
      "all-gather; loss and target counts")                                                       \
    X(DP_SHARD, "dp_shard", GRID_AXIS_BIT(DP_SHARD), 0, 0,                                        \
      "the optimizer-shard group of hybrid sharding: reduce-scatter and all-gather within it")    \
    X(DP_REPLICATE, "dp_replicate", GRID_AXIS_BIT(DP_REPLICATE), 0, 0,                            \
      "the replicas of one shard under hybrid sharding: the shards' all-reduce across them")      \
    X(PP, "pp", GRID_AXIS_BIT(PP), 0, 1,                                                          \
      "stage messages (activations forward, their gradients backward); loss and norm sums")      \
    X(EMBED, "embed", GRID_AXIS_BIT(PP), 1, 0,                                                    \
      "the tied embedding's gradient sum between the first and the last stage")

#endif

// plan.h: what each rank of a run holds, from the config alone (docs/design.md §5):
// the model shard of every grid position and the bytes of every pool. The
// trainer builds its shards with plan_shard, so `trident plan` prints exactly
// what a run of that config allocates.
#ifndef TRIDENT_PLAN_H
#define TRIDENT_PLAN_H

#include "config/config.h"
#include "model/model.h"
#include "parallel/topology.h"

// The [model] section as the model takes it.
struct llama_config plan_llama(const struct config *c);

// Microbatches per optimizer step on one data-parallel rank
// (loader_microbatches of the config's batch terms; 0 when they do not divide).
int plan_microbatches(const struct config *c);

// The model shard of grid position coord: its pipeline chunks, tensor-parallel
// slice, activation slots (1F1B keeps at most p - s microbatches in flight),
// sequence parallelism, what the slots keep ([model] recompute) and ZeRO-1
// arena padding. Errors: STATUS_BAD_INPUT when
// the pipeline schedule refuses the layout (the message says why).
enum status plan_shard(const struct config *c, struct grid_coord coord, struct model_shard *out,
                       struct error *err);

#endif

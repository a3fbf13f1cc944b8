// hf_internal.h: what hf.c and hf_config.c share beyond hf.h.
#ifndef TRIDENT_HF_INTERNAL_H
#define TRIDENT_HF_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/common.h"
#include "hf.h"

// Most safetensors files a folder is written in or read from.
enum { HF_MAX_SHARDS = 64 };

// The folder's tensors that make trident's tensor `name` (a row of the
// parameter table of lc): lc->moe_experts of them for the stacked routed
// experts (model.layers.L.mlp.experts.{gate,up,down}_proj.weight: expert e's
// matrix is rows [e grows / E, (e + 1) grows / E) of trident's), else 1.
int hf_moe_parts(const struct llama_config *lc, const char *name);
// The folder's name of part e (of parts = hf_moe_parts) of trident's tensor
// `name` in family f, into out (cap bytes): Qwen2-MoE's stacked
// mlp.experts.X.weight is mlp.experts.e.X.weight; Mixtral's
// (MixtralSparseMoeBlock, transformers 4.46.3) mlp.gate.weight is
// block_sparse_moe.gate.weight and the experts block_sparse_moe.experts.e.w1
// (gate_proj), w3 (up_proj), w2 (down_proj). Every other name is the same in
// every family.
void hf_moe_part_name(enum hf_family f, const char *name, int parts, int e, char *out,
                      size_t cap);

// An id list as JSON: null (none), one integer (n 1), or a list.
json_t *hf_ids_json(const int *ids, int n);
// Copies the file from to the new file to. Errors: STATUS_BAD_INPUT (from
// cannot be opened), STATUS_RUNTIME (a write), naming the path.
enum status hf_copy_file(const char *from, const char *to, struct error *err);

// Loads path as a JSON object (duplicate keys refused), reading only a
// regular file of at most max_bytes: opened with O_NONBLOCK and checked with
// fstat, so a FIFO or a device is refused, never waited on. absent: when not
// NULL, a missing file sets *absent and returns STATUS_OK with *out NULL.
// Errors: STATUS_BAD_INPUT naming path (cannot open, not a regular file, too
// large, not a JSON object with the parser's message and line).
enum status hf_load_json(const char *path, size_t max_bytes, json_t **out, bool *absent,
                         struct error *err);

#endif

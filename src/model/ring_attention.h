// ring_attention.h: context parallelism inside the model (docs/design.md §4,
// "Context parallelism"): the load-balanced causal split of each sequence
// over the cp ranks, the tokens' global positions and document starts, and
// ring attention over the CP group (Liu et al. 2023, "Ring Attention with
// Blockwise Transformers"; the load-balanced chunk order of Megatron-LM's
// context parallelism and Llama 3, §3.3.2). Private to src/model/.
//
// Split: a sequence of Tg tokens is cut into 2 cp chunks of c = Tg / (2 cp);
// cp rank r keeps chunks r and 2 cp - 1 - r, in that order, as its local
// sequence of T = Tg / cp tokens: local index t < c is global position r c +
// t, t >= c is (2 cp - 1 - r) c + t - c. Every rank then holds the same
// causal attention work (a first chunk's queries read few keys, its
// mirror's many).
#ifndef TRIDENT_RING_ATTENTION_H
#define TRIDENT_RING_ATTENTION_H

#include "model_internal.h"

// The global position of local token t (0 <= t < Tg / cp) of cp rank `me`.
int cp_global_pos(int Tg, int cp, int me, int t);

// local (B, Tg / cp) = the chunks of cp rank m->cp_rank of whole (B, Tg)
// (tokens, targets: any per-token I32 array). Host memory.
void cp_split_rows(const struct model *m, int32_t *local, const int32_t *whole);

// Non-ignored targets of this rank's tokens in n_micro microbatches of
// whole sequences targets (n_micro, B, Tg).
int64_t cp_count_targets(const struct model *m, const int32_t *targets, int n_micro);

// Fills m->cp_pos (cp, N) I32, the global positions of every cp rank's
// tokens (row b of rank j's block: cp_global_pos(Tg, cp, j, t)), from the
// host (model_init, once).
void cp_upload_positions(struct model *m);

// The per-microbatch positions of slot S, from the host: S->rope_pos (N,)
// I32, RoPE's doc_start argument t - (p - d) for local token t at global
// position p in a document starting at global position d (0 without
// packed documents), so that the rope ops rotate it by p - d; and, with
// packed documents (m->doc_eot >= 0), S->doc_start (N,) = d, the attention
// blocks' q_doc. d comes from doc_start_fill over the WHOLE sequence
// (tokens (B, Tg)), so a document crossing a chunk boundary keeps its start.
void cp_slot_positions(struct model *m, struct slot *S, const int32_t *tokens);

// Ring attention forward of block_acts a (q (B, T, Hl, D), k, v (B, T,
// Hkvl, D) after RoPE) into a->att (B, T, Hl, D) and a->lse (B, Hl, T):
// cp steps; step s merges (online softmax, backend_attention_block_forward
// with accumulate = s > 0) the key/value block of cp rank (r - s) mod cp,
// which arrives from rank r - 1 while step s - 1 computes (double buffer:
// the transfer of the next block is started before the current block's
// compute, on the CP group's communication stream under NCCL, ordered by
// events). Collective over the CP group; the same on every call with the
// same inputs (recompute = full repeats it bit for bit).
void ring_attention_forward(struct model *m, struct slot *S, struct block_acts *a);

// Its backward from datt (B, T, Hl, D): m->dq = the local queries' gradient;
// m->dk, m->dv = this rank's keys' and values' gradients, summed over every
// rank's queries: each block travels the ring again with a dk / dv buffer
// (model dtype) that every rank adds its contribution to
// (backend_attention_block_backward) and that is back at the block's owner
// after the cp-th hop. Collective over the CP group.
void ring_attention_backward(struct model *m, struct slot *S, struct block_acts *a,
                             struct tensor datt);

#endif
